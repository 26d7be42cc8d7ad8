"""tools/interpreter_imports.py without a venv or the network: a child's
outcome (exit status, the JSON its interpreter wrote, its output) becomes the
result the file records, and the file is merged and written atomically."""
import json
import os
import signal
import sys

import pytest

from tools import interpreter_imports as ii

REFUSAL = "module uvloop.loop does not support loading in subinterpreters"


def written(result):
    return json.dumps(result)


def test_an_import_that_works():
    assert ii.classify(0, written({"result": "ok"}), '{"closing": "ok"}\n', "") == {
        "result": "ok"}


def test_an_import_error_is_its_type_and_first_line():
    res = ii.classify(0, written({"result": "error", "type": "ImportError",
                                  "detail": REFUSAL + "\nmore", "causes": []}),
                      '{"closing": "ok"}\n', "")
    assert res["result"] == "error" and res["type"] == "ImportError"
    assert res["message"] == REFUSAL and "reason" not in res


def test_a_refusal_wrapped_in_advice_is_found_in_the_message_or_its_causes():
    numpy = ("\n\nIMPORTANT: PLEASE READ THIS FOR ADVICE ON HOW TO SOLVE THIS ISSUE!\n\n"
             "Importing the numpy C-extensions failed.\n\nOriginal error was: module "
             "numpy._core._multiarray_umath does not support loading in subinterpreters\n")
    res = ii.classify(0, written({"result": "error", "type": "ImportError", "detail": numpy,
                                  "causes": []}), "", "")
    assert res["message"].startswith("IMPORTANT")
    assert res["reason"] == ("module numpy._core._multiarray_umath does not support loading "
                             "in subinterpreters")
    res = ii.classify(0, written({"result": "error", "type": "ImportError",
                                  "detail": "the C extension failed",
                                  "causes": ["ImportError: " + REFUSAL]}), "", "")
    assert res["reason"] == REFUSAL


def test_a_process_killed_before_the_import_finished_is_a_crash():
    res = ii.classify(-signal.SIGSEGV, None, "", "Fatal Python error: Segmentation fault\n")
    assert res == {"result": "crash", "signal": "SIGSEGV", "when": "import",
                   "stderr": ["Fatal Python error: Segmentation fault"]}


def test_a_crash_after_the_import_is_kept_with_the_import_result():
    res = ii.classify(-signal.SIGABRT, written({"result": "ok"}), '{"stage": "closing"}\n',
                      "free(): invalid pointer\n")
    assert res == {"result": "ok", "after": {"signal": "SIGABRT", "when": "close",
                                             "stderr": ["free(): invalid pointer"]}}
    res = ii.classify(-signal.SIGSEGV, written({"result": "ok"}),
                      '{"stage": "closing"}\n{"closing": "ok"}\n', "")
    assert res["after"]["when"] == "exit"
    rec = {"module": "m", "package": "p", "main": {"result": "ok"}, "isolated": res}
    assert ii.verdict(rec) == "crash"


def test_a_failed_close_and_a_hang():
    res = ii.classify(0, written({"result": "ok"}),
                      '{"closing": "close: InterpreterError: has threads"}\n', "")
    assert res == {"result": "ok", "after": {"error": "close: InterpreterError: has threads"}}
    assert ii.classify(None, None, "", "", timed_out=True, timeout=5) == {
        "result": "timeout", "seconds": 5}


def test_a_child_that_wrote_nothing_and_exited_is_a_failed_probe():
    res = ii.classify(1, None, "", "SystemExit: no isolated subinterpreters\n")
    assert res["result"] == "probe failed"
    assert res["message"] == "SystemExit: no isolated subinterpreters"


def record(main, iso, package="uvloop", check=None, ext=False):
    rec = {"module": "uvloop", "package": package, "main": main, "isolated": iso}
    if check:
        rec["check"] = check
    if ext:
        rec["ext"] = True
    return rec


def test_verdicts():
    ok, refused = {"result": "ok"}, {"result": "error", "type": "ImportError",
                                     "message": REFUSAL}
    missing = {"result": "error", "type": "ModuleNotFoundError", "message": "No module named"}
    assert ii.verdict(record(ok, ok)) == "ok"
    assert ii.verdict(record(ok, refused)) == "refuses"
    assert ii.verdict(record(missing, missing)) == "absent"
    assert ii.verdict(record(missing, missing), {"uvloop": {"status": "not installable"}}) \
        == "not installable"
    # pydantic-core comes with pydantic: its install status is pydantic's
    assert ii.verdict(record(missing, missing, package="pydantic-core"),
                      {"pydantic": {"status": "not installable"}}) == "not installable"
    assert ii.verdict(record(refused, refused)) == "fails"


def test_a_fallback_is_a_check_that_differs():
    main = {"result": "ok", "check": "'binary'"}
    rec = record(main, {"result": "ok", "check": "'python'"}, check="psycopg.pq.__impl__")
    assert ii.fell_back(rec) == ("psycopg.pq.__impl__", "'python'", "'binary'")
    assert ii.fell_back(record(main, dict(main), check="psycopg.pq.__impl__")) is None


def test_pip_error_line_and_built():
    out = ("Collecting grpcio\n  Building wheel for grpcio (pyproject.toml): finished\n"
           "  error: subprocess-exited-with-error\n  note: This error originates from a "
           "subprocess\nERROR: Failed to build 'grpcio' when building wheel\n\n")
    assert ii.pip_error_line(out) == "ERROR: Failed to build 'grpcio' when building wheel"
    assert ii.pip_error_line("just this\n") == "just this"
    assert ii.pip_built("Successfully built zstandard brotli\nSuccessfully installed x\n") == [
        "brotli", "zstandard"]


def test_the_file_is_merged_by_version_and_written_atomically(tmp_path):
    path = tmp_path / "results" / "interpreter-imports.json"
    doc = ii.merge({}, "3.15", {"version": "3.15.2"}, "python tools/interpreter_imports.py")
    ii.write_json(str(path), doc)
    doc = ii.merge(ii.read_json(str(path)), "3.14", {"version": "3.14.10"}, "cmd")
    doc = ii.merge(doc, "3.9", {"version": "3.9.1"}, "cmd")
    ii.write_json(str(path), doc)
    back = json.loads(path.read_text())
    assert list(back["interpreters"]) == ["3.9", "3.14", "3.15"]     # by version, not text
    assert back["interpreters"]["3.15"] == {"version": "3.15.2"}     # kept
    assert back["command"] == "cmd"
    assert os.listdir(path.parent) == ["interpreter-imports.json"]   # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert ii.read_json(str(tmp_path / "none.json")) == {}


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    ii.write_json(str(path), {"a": 1})
    with pytest.raises(TypeError):
        ii.write_json(str(path), {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_the_summary_names_what_refuses():
    rec = record({"result": "ok"}, {"result": "error", "type": "ImportError",
                                    "message": REFUSAL})
    lines = ii.summary({"modules": [rec, record({"result": "ok"}, {"result": "ok"})],
                        "packages": {}})
    assert lines[0] == "1 ok, 1 refuses"
    assert "uvloop" in lines[1] and REFUSAL in lines[1]


# --- the child itself, on this interpreter (no venv) --------------------------

def test_the_child_in_the_main_interpreter():
    env = dict(os.environ)
    assert ii.probe(sys.executable, ii._p("json", ii.STDLIB), "main", env, 60) == {
        "result": "ok"}
    res = ii.probe(sys.executable, ii._p("no_such_module_xyz", ii.STDLIB), "main", env, 60)
    assert res["result"] == "error" and res["type"] == "ModuleNotFoundError"
    res = ii.probe(sys.executable, ii._p("json", ii.STDLIB, check="json.dumps.__module__"),
                   "main", env, 60)
    assert res == {"result": "ok", "check": "'json'"}


@pytest.mark.skipif(sys.version_info < (3, 12), reason="no isolated subinterpreters")
def test_the_child_in_an_isolated_interpreter():
    env = dict(os.environ)
    assert ii.probe(sys.executable, ii._p("_json", ii.STDLIB), "isolated", env, 60) == {
        "result": "ok"}
    # faulthandler refuses isolated interpreters on 3.12 to 3.15
    res = ii.probe(sys.executable, ii._p("faulthandler", ii.STDLIB), "isolated", env, 60)
    assert res["result"] == "ok" or "subinterpreters" in res["message"], res


def test_before_312_the_child_says_it_cannot(tmp_path):
    if sys.version_info >= (3, 12):
        pytest.skip("this interpreter has isolated subinterpreters")
    res = ii.probe(sys.executable, ii._p("json", ii.STDLIB), "isolated", dict(os.environ), 60)
    assert res["result"] == "probe failed" and "3.12" in res["message"]
