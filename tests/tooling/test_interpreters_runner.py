"""tests/interpreters/run_suite.py: the suite inside an isolated subinterpreter.

One small real file goes through the runner on this interpreter (a few
seconds), and the made-up tests of tests/interpreters/probe_tests.py with
their faults turned on: a regression, a failure on both params, a
main-interpreter-only skip, a crash (SIGSEGV) and a hang, each of which the
JSON report must name, the chunk going on after the crash and the hang.
The known-failures file's parser and its effect are checked on made-up
input.  Subinterpreters are 3.12+'s: on 3.11 the runner tests skip.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loop_helpers import SLOW, child_env
from tests.interpreters import run_suite

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "interpreters" / "run_suite.py"
PROBE = "tests/interpreters/probe_tests.py"

needs_subinterpreters = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="isolated subinterpreters (own GIL) are 3.12+")


def run(tmp_path, *args, env=None, timeout=120):
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(RUNNER), *args, "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=child_env(env),
                       timeout=timeout * SLOW, stdin=subprocess.DEVNULL)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads(out.read_text())


@needs_subinterpreters
def test_a_real_file_passes_on_both_params_in_a_subinterpreter(tmp_path):
    r, rep = run(tmp_path, "tests/loop/test_executor.py")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert rep["exit_status"] == 0
    assert rep["interpreter"]["main_interpreter"] == ["False"]     # what the tests saw
    assert rep["interpreter"]["isolated_config"]["gil"] == "own"
    assert rep["files"] == ["tests/loop/test_executor.py"]
    counts = rep["counts"]
    assert counts["asyncio"]["passed"] == counts["tideloop"]["passed"] > 10, counts
    assert rep["regressions"] == rep["unpaired_failures"] == rep["incidents"] == []
    assert rep["failing_on_both"] == {} and rep["collect_errors"] == []
    some = next(iter(rep["tests"].values()))
    assert set(some["params"]) == {"asyncio", "tideloop"}
    stages = rep["timing"]["stages"]
    assert stages["children: tests"] > 0 and rep["timing"]["wall"] > 0
    assert "regressions (asyncio param passes, a tideloop param does not): 0" in r.stdout


@needs_subinterpreters
def test_faults_are_told_apart_and_the_chunk_goes_on(tmp_path):
    r, rep = run(tmp_path, PROBE, "--test-timeout", "6",
                 env={"TIDELOOP_SI_PROBE": "regress,both,crash,hang"})
    assert r.returncode == 1, r.stdout[-4000:]
    probe = PROBE + "::"
    regressions = {x["test"]: x["params"] for x in rep["regressions"]}
    assert regressions == {
        probe + "test_regresses": {"asyncio": "passed", "tideloop": "failed"},
        probe + "test_crashes": {"asyncio": "passed", "tideloop": "crash"},
        probe + "test_hangs": {"asyncio": "passed", "tideloop": "hang"},
    }
    assert rep["failing_on_both"] == {
        "ValueError: the same cause on both params": [probe + "test_fails_on_both"]}
    assert rep["main_interpreter_only"] == {"made up for the runner's test": 2}
    crash, hang = rep["incidents"]
    assert (crash["kind"], crash["signal"], crash["test"]) == (
        "crash", "SIGSEGV", probe + "test_crashes[tideloop]")
    assert (hang["kind"], hang["test"]) == ("hang", probe + "test_hangs[tideloop]")
    # the tests after each of them ran, in a new child each time
    after = rep["tests"][probe + "test_runs_after_the_crash_and_the_hang"]["params"]
    assert {v: x["outcome"] for v, x in after.items()} == {"asyncio": "passed",
                                                           "tideloop": "passed"}
    assert rep["timing"]["chunks"][0]["attempts"] == 3
    assert "crash (killed by SIGSEGV) during a test: " + probe + "test_crashes[tideloop]" in r.stdout


@needs_subinterpreters
def test_known_failures_do_not_fail_the_run_but_stale_entries_do(tmp_path):
    known = tmp_path / "known.txt"
    known.write_text(f"{PROBE}::test_regresses  # made up\n")
    r, rep = run(tmp_path, PROBE, "--known", str(known), env={"TIDELOOP_SI_PROBE": "regress"})
    assert r.returncode == 0, r.stdout[-4000:]
    assert rep["regressions"] == [] and rep["stale_known"] == []
    assert [(k["test"], k["reason"]) for k in rep["known"]] == [
        (PROBE + "::test_regresses", "made up")]
    r, rep = run(tmp_path, PROBE, "--known", str(known))        # no fault: the entry is stale
    assert r.returncode == 1 and rep["stale_known"] == [PROBE + "::test_regresses"]
    known.write_text(f"{PROBE}::test_regresses  # made up\nother.py::test_x  # not run here\n")
    r, rep = run(tmp_path, PROBE, "--known", str(known), env={"TIDELOOP_SI_PROBE": "regress"})
    assert r.returncode == 0 and rep["stale_known"] == [], r.stdout[-3000:]


def test_known_patterns_keep_brackets_literal():
    assert run_suite._matches("a.py::t[False]", "a.py::t[*]")
    assert run_suite._matches("a.py::t[False]", "a.py::t[False]")
    assert not run_suite._matches("a.py::tF", "a.py::t[False]")
    assert not run_suite._matches("a.py::t[False]x", "a.py::t[*]")


def test_parse_known():
    assert run_suite.parse_known("# comment\n\n  a.py::t[x]  # why\nb.py::*  # all\n") == {
        "a.py::t[x]": "why", "b.py::*": "all"}
    for bad in ("a.py::t", "a.py::t  #  ", "a.py::t extra  # why", "a::t # x\na::t # y"):
        with pytest.raises(ValueError):
            run_suite.parse_known(bad)


def test_the_checked_in_known_failures_parse():
    run_suite.parse_known((ROOT / "tests" / "interpreters" / "known_failures.txt").read_text())


def test_without_subinterpreters_the_runner_says_so(tmp_path):
    if sys.version_info >= (3, 12):
        pytest.skip("this interpreter has subinterpreters")
    r = subprocess.run([sys.executable, str(RUNNER), "tests/loop/test_executor.py"],
                       capture_output=True, text=True, cwd=ROOT, env=child_env(), timeout=60)
    assert r.returncode == 2 and "has no isolated subinterpreters" in r.stderr
