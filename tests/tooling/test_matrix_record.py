"""tools/matrix.py --record-leg: CI's 3.11 stage becomes a row of the version
table from its pytest log and conformance report, and only a clean run
counts as passed."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def record(tmp_path, summary, conformance=None):
    log = tmp_path / "pytest.log"
    log.write_text("....\n" + summary + "\n")
    cmd = [sys.executable, os.path.join(REPO, "tools", "matrix.py"), "--record-leg", "3.11",
           "--pytest-log", str(log), "--json", str(tmp_path / "out.json")]
    if conformance is not None:
        (tmp_path / "conf.json").write_text(json.dumps(conformance))
        cmd += ["--conformance-json", str(tmp_path / "conf.json")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, json.loads((tmp_path / "out.json").read_text())[0]


def tools_matrix():
    """tools/matrix.py, imported."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    try:
        import matrix
    finally:
        sys.path.pop(0)
    return matrix


def conformance(regressions):
    counts = {"passed": 10, "failed": 0}
    return {"modules": {"test_events": {"stock": {"counts": counts},
                                        "tideloop": {"counts": counts},
                                        "regressions": regressions}}}


def test_a_clean_run_is_a_passing_row(tmp_path):
    rc, rec = record(tmp_path, "2276 passed, 61 skipped, 4 xfailed in 584.61s (0:09:44)",
                     conformance([]))
    assert rc == 0 and rec["ok"]
    assert rec["pytest"] == {"passed": 2276, "skipped": 61, "xfailed": 4}
    assert rec["conformance"]["totals"]["tideloop"]["passed"] == 10
    assert rec["python"] == sys.version.split()[0] + ("t" if not getattr(
        sys, "_is_gil_enabled", lambda: True)() else "")


def test_a_failed_test_or_a_regression_fails_the_row(tmp_path):
    rc, rec = record(tmp_path, "1 failed, 2276 passed in 584.61s (0:09:44)")
    assert rc == 1 and not rec["ok"]
    rc, rec = record(tmp_path, "2276 passed in 584.61s (0:09:44)", conformance(["test_x"]))
    assert rc == 1 and not rec["ok"]


def test_the_isolated_interpreter_column(tmp_path):
    # run_suite.py's report and the subinterpreter conformance's, summarised
    # into the version table's column; "-" on a leg that ran neither.
    matrix = tools_matrix()
    report = tmp_path / "si.json"
    report.write_text(json.dumps({
        "counts": {"asyncio": {"passed": 692}, "tideloop": {"passed": 849}},
        "regressions": [{"test": "t"}], "unpaired_failures": [], "incidents": [],
        "files": ["a.py", "b.py"]}))
    si = matrix.summarize_subinterpreter_suite(str(report))
    assert si == {"asyncio_passed": 692, "tideloop_passed": 849, "regressions": 1,
                  "incidents": 0, "files": 2}
    assert matrix.summarize_subinterpreter_suite(str(tmp_path / "missing.json")) is None
    row = {"leg": "3.14", "python": "3.14.10", "ok": True, "steps": {}, "recorded": True,
           "subinterpreter_suite": si,
           "subinterpreter_conformance": matrix.summarize_conformance(conformance([]))}
    table = matrix.markdown_report([row, dict(row, subinterpreter_suite=None,
                                              subinterpreter_conformance=None)])
    lines = table.splitlines()
    assert "in an isolated interpreter" in lines[0]
    assert "| suite 692/849, 1 regr.; conformance 10/10, 0 regr. |" in lines[2]
    assert lines[3].count("| - |") >= 1


def test_the_portable_mode_column_and_its_verdict(tmp_path):
    # tests/portable.py's --json: its verdict joins the row's; the column
    # says what ran, "-" where the leg did not run it
    matrix = tools_matrix()
    log = tmp_path / "pytest.log"
    log.write_text("....\n2276 passed in 584.61s (0:09:44)\n")
    for ok in (True, False):
        (tmp_path / "p.json").write_text(json.dumps({"scope": "registry", "ok": ok}))
        rec = matrix.recorded_leg("3.11", str(log), None, 1.0, str(tmp_path / "p.json"))
        assert rec["ok"] is ok
    rec = matrix.recorded_leg("3.11", str(log), None, 1.0, str(tmp_path / "missing.json"))
    assert not rec["ok"] and rec["portable"] is None
    row = {"leg": "3.15", "python": "3.15.2", "ok": True, "steps": {}, "recorded": True,
           "portable": {"scope": "all", "ok": True}}
    lines = matrix.markdown_report([row, dict(row, portable=None)]).splitlines()
    assert "| portable mode |" in lines[0]
    assert "| ok (whole suite and conformance) |" in lines[2]
    assert "| - | ok |" in lines[3]
