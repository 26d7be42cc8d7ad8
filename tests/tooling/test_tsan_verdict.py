"""tools/tsan_verdict.py: ThreadSanitizer reports with a frame of tideloop's C
code fail tools/tsan.sh; CPython's own reports are listed, and suppressed
ones counted, without failing it; a suppression never hides one of ours."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORE = "_core.cpython-313t-x86_64-linux-gnu.so"
SRC = "/tmp/tmp.Xy12/src/tideloop/_core"

OURS = f"""\
==================
WARNING: ThreadSanitizer: data race (pid=4242)
  Write of size 8 at 0x7b4400001230 by thread T3:
    #0 ready_push {SRC}/loop.c:210:17 ({CORE}+0x1a2b3)
    #1 loop_call_soon_threadsafe {SRC}/loop.c:612 ({CORE}+0x1b000)
    #2 cfunction_vectorcall_FASTCALL_KEYWORDS Objects/methodobject.c:441 (python3.13t+0x1e2f3c)
    #3 _PyEval_EvalFrameDefault Python/generated_cases.c.h:813 (python3.13t+0x2a1b2c)

  Previous read of size 8 at 0x7b4400001230 by main thread:
    #0 ready_pop {SRC}/loop.c:240 ({CORE}+0x1a400)
    #1 run_once {SRC}/loop.c:380 ({CORE}+0x1a900)

  Location is heap block of size 64 at 0x7b4400001200 allocated by main thread:
    #0 malloc ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:647 (libtsan.so.2+0x3ea3c)
    #1 loop_new {SRC}/loop.c:90 ({CORE}+0x19000)

  Thread T3 (tid=4250, running) created by main thread at:
    #0 pthread_create ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1001 (libtsan.so.2+0x5e686)
    #1 do_start_joinable_thread Python/thread_pthread.h:290 (python3.13t+0x3c1d2e)

SUMMARY: ThreadSanitizer: data race {SRC}/loop.c:210:17 in ready_push
==================
"""

# The same race seen again (another pair of stacks below our frames): one
# distinct report, counted twice.
OURS_AGAIN = OURS.replace("run_once", "run_forever").replace("pid=4242", "pid=4243")

CPYTHON = """\
==================
WARNING: ThreadSanitizer: data race (pid=4242)
  Read of size 4 at 0x7b0c00002000 by thread T1:
    #0 _PyType_LookupRef Objects/typeobject.c:5400 (python3.13t+0x20a000)
    #1 _PyObject_GetMethod Objects/object.c:1600 (python3.13t+0x1f0000)
    #2 _PyEval_EvalFrameDefault Python/generated_cases.c.h:3000 (python3.13t+0x2a3000)

  Previous write of size 4 at 0x7b0c00002000 by main thread:
    #0 type_modified_unlocked Objects/typeobject.c:1000 (python3.13t+0x209000)
    #1 _PyEval_EvalFrameDefault Python/generated_cases.c.h:900 (python3.13t+0x2a1000)

SUMMARY: ThreadSanitizer: data race Objects/typeobject.c:5400 in _PyType_LookupRef
==================
"""

# CPython's race, in Python code that our loop was running: our frames are
# only beneath the Python evaluation frame.  Matches the suppression.
SUPPRESSED = f"""\
==================
WARNING: ThreadSanitizer: data race (pid=4242)
  Write of size 8 at 0x7b0c00003000 by main thread:
    #0 assign_version_tag Objects/typeobject.c:900 (python3.13t+0x208000)
    #1 _PyEval_EvalFrameDefault Python/generated_cases.c.h:813 (python3.13t+0x2a1b2c)
    #2 handle_run {SRC}/handle.c:300 ({CORE}+0x12000)
    #3 run_once {SRC}/loop.c:380 ({CORE}+0x1a900)

  Previous read of size 8 at 0x7b0c00003000 by thread T2:
    #0 _PyType_Lookup Objects/typeobject.c:5300 (python3.13t+0x20a100)

SUMMARY: ThreadSanitizer: data race Objects/typeobject.c:900 in assign_version_tag
==================
"""

SUPPRESSIONS = """\
# CPython: type version tags are assigned without a lock (a known report)
race_top:assign_version_tag
"""


def verdict(tmp_path, *logs, suppressions=SUPPRESSIONS, rc=0):
    paths = []
    for i, text in enumerate(logs):
        p = tmp_path / f"tsan.{1000 + i}"
        p.write_text(text)
        paths.append(str(p))
    supp = tmp_path / "supp.txt"
    supp.write_text(suppressions)
    out = tmp_path / "verdict.json"
    p = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "tsan_verdict.py"), *paths,
         "--suppressions", str(supp), "--pytest-rc", str(rc), "--json", str(out)],
        capture_output=True, text=True)
    assert p.stderr == ""
    return p.returncode, p.stdout, json.loads(out.read_text())


def test_ours_fails_cpython_and_suppressed_do_not(tmp_path):
    rc, out, v = verdict(tmp_path, OURS + CPYTHON + SUPPRESSED, OURS_AGAIN)
    assert rc == 1 and not v["ok"]
    assert (v["reports"], v["tideloop"], v["cpython"], v["beneath"]) == (4, 2, 1, 0)
    assert v["suppressed"] == {"race_top:assign_version_tag": 1}
    (d,) = v["tideloop_distinct"]
    assert d["count"] == 2 and d["kind"] == "data race"
    assert d["frames"] == ["ready_pop _core/loop.c", "ready_push _core/loop.c"]
    assert d["lines"] == ["ready_pop _core/loop.c:240", "ready_push _core/loop.c:210"]
    assert "by thread T3" in d["first"]
    assert "tideloop report 1/1: data race at ready_pop _core/loop.c / ready_push" in out
    assert "CPython-only" in out and out.rstrip().endswith("tsan: FAIL")


def test_cpython_only_and_suppressed_pass(tmp_path):
    rc, out, v = verdict(tmp_path, CPYTHON + SUPPRESSED)
    assert rc == 0 and v["ok"], out
    assert (v["reports"], v["tideloop"], v["cpython"]) == (2, 0, 1)
    assert v["others"][0]["frames"] == ["_PyType_LookupRef typeobject.c",
                                        "type_modified_unlocked typeobject.c"]
    assert out.rstrip().endswith("tsan: PASS")


def test_beneath_python_code_is_listed_not_failed(tmp_path):
    rc, out, v = verdict(tmp_path, SUPPRESSED, suppressions="")
    assert rc == 0 and v["beneath"] == 1 and v["tideloop"] == 0


def test_a_suppression_never_hides_ours(tmp_path):
    rc, out, v = verdict(tmp_path, OURS, suppressions="# too broad\nrace:_PyEval_EvalFrameDefault\n")
    assert rc == 1 and v["tideloop"] == 1 and v["suppressed"] == {}
    assert "suppression 'race:_PyEval_EvalFrameDefault' also matches 1 tideloop report(s)" in out


def test_pytest_failure_and_crash_fail(tmp_path):
    rc, _, v = verdict(tmp_path, CPYTHON, rc=1)
    assert rc == 1 and v["pytest_rc"] == 1
    crash = f"""\
ThreadSanitizer:DEADLYSIGNAL
==4242==ERROR: ThreadSanitizer: SEGV on unknown address 0x000000000010 (pc 0x7f00 bp 0x1 sp 0x2 T4242)
==4242==The signal is caused by a READ memory access.
    #0 ready_pop {SRC}/loop.c:240 ({CORE}+0x1a400)
    #1 run_once {SRC}/loop.c:380 ({CORE}+0x1a900)

ThreadSanitizer can not provide additional info.
SUMMARY: ThreadSanitizer: SEGV {SRC}/loop.c:240 in ready_pop
==4242==ABORTING
"""
    rc, out, v = verdict(tmp_path, crash)
    assert rc == 1 and v["crashes"] == 1 and v["tideloop"] == 1
    assert "CRASH (tideloop): SEGV on unknown address" in out


def test_inlined_cpython_header_frames_count_as_ours(tmp_path):
    # Py_DECREF compiled into our module: the report is ours, known by the
    # first frame in our sources below it.
    text = OURS.replace(f"    #0 ready_push {SRC}/loop.c:210:17 ({CORE}+0x1a2b3)\n",
                        f"    #0 Py_DECREF /py/include/python3.13t/object.h:913 ({CORE}+0x1a2b0)\n"
                        f"    #1 ready_push {SRC}/loop.c:210:17 ({CORE}+0x1a2b3)\n")
    rc, _, v = verdict(tmp_path, text)
    assert rc == 1 and v["tideloop_distinct"][0]["frames"][1] == "ready_push _core/loop.c"


def test_a_crash_cut_short_fails(tmp_path):
    text = ("==7==ERROR: ThreadSanitizer: SEGV on unknown address 0x10 (pc 0x1 bp 0x2 sp 0x3 T7)\n"
            "==7==The signal is caused by a READ memory access.\n")
    rc, out, v = verdict(tmp_path, text, "....F.Fatal Python error: Segmentation fault\n")
    assert rc == 1 and v["crashes"] == 1
    assert "CRASH (unknown)" in out and "Fatal Python error: Segmentation fault" in out


def test_no_reports_pass_and_bad_suppression_line_is_an_error(tmp_path):
    rc, out, v = verdict(tmp_path, "ThreadSanitizer: nothing to say\n")
    assert rc == 0 and v["reports"] == 0
    p = subprocess.run([sys.executable, os.path.join(REPO, "tools", "tsan_verdict.py"),
                        "--suppressions", os.devnull], capture_output=True, text=True)
    assert p.returncode == 0
    bad = tmp_path / "bad.txt"
    bad.write_text("assign_version_tag\n")
    p = subprocess.run([sys.executable, os.path.join(REPO, "tools", "tsan_verdict.py"),
                        "--suppressions", str(bad)], capture_output=True, text=True)
    assert p.returncode != 0 and "not a suppression" in p.stderr


def test_the_projects_suppressions_parse(tmp_path):
    rc, _, v = verdict(tmp_path, CPYTHON,
                       suppressions=open(os.path.join(REPO, "tools", "tsan-suppressions.txt")).read())
    assert rc == 0


def test_errno_spoiled_by_cpythons_handler_is_not_ours(tmp_path):
    # The stack below the handler is only what the signal interrupted.
    text = f"""\
==================
WARNING: ThreadSanitizer: signal handler spoils errno (pid=9)
    #0 faulthandler_user Modules/faulthandler.c:824 (python3.13t+0x4e0000)
    #1 schedule_at {SRC}/loop.c:740 ({CORE}+0x1c000)

SUMMARY: ThreadSanitizer: signal handler spoils errno Modules/faulthandler.c:824 in faulthandler_user
==================
"""
    rc, _, v = verdict(tmp_path, text, suppressions="")
    assert rc == 0 and v["tideloop"] == 0 and v["beneath"] == 1


def test_a_signal_handler_above_our_code_is_not_ours(tmp_path):
    # faulthandler's dump, run by TSan on a signal that interrupted the loop
    text = f"""\
==================
WARNING: ThreadSanitizer: data race (pid=9)
  Read of size 8 at 0x55 by main thread:
    #0 PyInterpreterState_ThreadHead Python/pystate.c:2518 (python3.13t+0x1)
    #1 faulthandler_fatal_error Modules/faulthandler.c:338 (python3.13t+0x2)
    #2 __tsan::CallUserSignalHandler(a, b) tsan_interceptors_posix.cpp:2005 (libtsan.so.2+0x3)
    #3 sighandler tsan_interceptors_posix.cpp:2085 (libtsan.so.2+0x4)
    #4 run_once {SRC}/loop.c:639 ({CORE}+0x5)

  Previous write of size 8 at 0x55 by thread T8:
    #0 tstate_delete_common Python/pystate.c:1795 (python3.13t+0x6)

SUMMARY: ThreadSanitizer: data race Python/pystate.c:2518 in PyInterpreterState_ThreadHead
==================
"""
    rc, _, v = verdict(tmp_path, text, suppressions="")
    assert rc == 0 and v["tideloop"] == 0 and v["beneath"] == 1
