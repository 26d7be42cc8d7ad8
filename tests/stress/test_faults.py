"""stress/faults.py: the fault runs' harness works and its verdict can fail.
CI runs the bounded mode itself (.ci/run); here a few seconds of each."""
import os
import subprocess
import sys

import pytest

from loop_helpers import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAULTS = os.path.join(ROOT, "stress", "faults.py")

sys.path.insert(0, os.path.join(ROOT, "stress"))
import faults  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, FAULTS, "--seconds", "3", *args],
                          capture_output=True, text=True, env=child_env(), timeout=300,
                          cwd=ROOT)


@pytest.mark.skipif(sys.platform != "linux", reason="an LD_PRELOAD interposer")
def test_a_short_run_passes_on_tideloop():
    p = run("--sets", "safe")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "faults: PASS (2 runs" in p.stdout
    assert "tideloop, safe faults: PASS" in p.stdout
    # the stock loop ran the same faults as the reference; it may lose a
    # wake-up (its self-pipe write swallows the injected EINTR/EAGAIN), and
    # a subprocess wait then hangs: reported, not counted
    assert "asyncio, safe faults: " in p.stdout
    # the report names injected faults
    assert "  send        EINTR" in p.stdout or "  recv        EINTR" in p.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="an LD_PRELOAD interposer")
def test_corruption_fails_the_run():
    p = run("--sets", "safe", "--loops", "tideloop", "--sabotage")
    assert p.returncode == 1, p.stdout[-3000:]
    assert "FAIL: corrupt transfers" in p.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="an LD_PRELOAD interposer")
def test_the_stock_loop_is_the_reference_not_the_verdict():
    # its failures are shown, the exit status is tideloop's
    p = run("--sets", "safe", "--loops", "asyncio", "--sabotage")
    assert p.returncode == 0, p.stdout[-3000:]
    assert "FAIL: corrupt transfers" in p.stdout
    assert "the stock loop (the reference, not counted) failed" in p.stdout


def a_run(**kw):
    run = dict(loop="tideloop", set="safe", seconds=1, returncode=0, hung=False,
               result=dict(ok={"tcp": 3}, failed={}, corrupt={}, hung={}, bytes=10,
                           failures={}),
               faults={"send": {"seen": 9, "EINTR": 2}}, stderr="")
    if kw.pop("child_hung", False):
        run["hung"] = True
    for key, value in kw.items():
        if key in run["result"]:
            run["result"][key] = value
        else:
            run[key] = value
    return run


@pytest.mark.parametrize("change, reason", [
    ({}, None),
    ({"child_hung": True}, "the child hung"),
    ({"hung": {"tcp": 1}}, "operations hung"),
    ({"returncode": -11}, "the child exited with -11"),
    ({"result": None}, "no result"),
    ({"corrupt": {"tcp": 1}, "failures": {"tcp": {"echoed bytes differ": 1}}},
     "corrupt transfers"),
    ({"failed": {"tcp": 1}, "failures": {"tcp": {"ConnectionResetError": 1}}},
     "operations failed under safe faults"),
    ({"faults": {"send": {"seen": 9}}}, "no fault was injected"),
    ({"set": "failing", "failed": {"tcp": 1}, "failures": {"tcp": {"KeyError": 1}}},
     "unexpected failures"),
])
def test_verdict(change, reason):
    why = faults.verdict(a_run(**change))
    if reason is None:
        assert why == []
    else:
        assert any(reason in w for w in why), why


def test_failures_are_allowed_under_the_failing_set():
    run = a_run(set="failing", failed={"tcp": 2},
                failures={"tcp": {"ConnectionResetError": 1, "TimeoutError": 1}})
    assert faults.verdict(run) == []


def test_error_comparison_names_what_only_tideloop_raised():
    runs = [a_run(loop="asyncio", set="failing", failures={
                "tcp": {"ConnectionResetError": 2}, "udp": {"OSError": 1}}),
            a_run(loop="tideloop", set="failing", failures={
                "tcp": {"ConnectionResetError": 1, "BrokenPipeError": 1},
                "pipe": {"BrokenPipeError": 1}}),
            a_run(loop="tideloop", set="safe", failures={"tcp": {"KeyError": 1}})]
    rows, differ = faults.error_comparison(runs)
    assert dict(rows)["tcp"] == {"asyncio": {"ConnectionResetError": 2},
                                 "tideloop": {"ConnectionResetError": 1, "BrokenPipeError": 1}}
    # pipe: the stock loop never failed it, so nothing to compare with
    assert differ == [("tcp", "BrokenPipeError")]
