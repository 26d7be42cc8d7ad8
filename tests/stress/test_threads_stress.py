"""Stress scenario i (the free-threading issue) at its quick size, on stock
asyncio and tideloop: a loop in each of 8 threads for 4 s with TCP and Unix
echo between them, call_soon_threadsafe storms, timers, subprocesses,
SIGUSR1 to the process and loops churned in another thread (see
stress/scenarios/i_loops_in_threads.py).

The run happens in a child of stress/run.py, as for the other scenarios
(tests/stress/test_stress.py, whose helpers these tests use; its
test_scenario_detects_a_broken_loop covers "i" too).  On a free-threaded
build the child inherits PYTHON_GIL: CI's 3.13t leg runs with the GIL on.
"""
import pytest

from .test_stress import SANITIZE, SZ, run_stress, check_clean


@pytest.fixture(autouse=True)
def _tideloop_only_under_sanitizers(request):
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if SANITIZE and params.get("loop_name", "asyncio") != "tideloop":
        pytest.skip("sanitizer run: tideloop's side only")


def test_loops_in_threads(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "i")
    check_clean(p, res)
    d = res["details"]
    assert d["threads"] == SZ["i_threads"] >= 8
    # every storm callback ran once, in per-sender order
    assert d["storm_run"] == d["storm_sent"] > 0
    assert d["storm_order_errors"] == 0
    # every echoed byte checked; every connection made was accepted
    assert res["bytes_sent"] == res["bytes_verified"] > 0
    assert d["server_conns"] + d["unix_server_conns"] == d["conns"] + d["churn_echoes"]
    assert d["unix_server_conns"] > 0
    # timers: none lost, none early, no cancelled one ran
    assert d["timers_fired"] == d["timers_scheduled"] - d["timers_cancelled"] > 0
    assert d["timers_early"] == 0
    assert d["subprocesses"] >= d["threads"]
    assert 0 < d["signals_handled"] <= d["signals_sent"]
    assert d["churn_loops"] > 0 and d["churn_roundtrips"] > 0
    if d["free_threaded"]:     # RSS grows there with cross-thread frees (the scenario)
        assert d["blocks_growth"] <= d["blocks_limit"]
    elif not SANITIZE:         # ASan's quarantine keeps freed memory resident
        assert d["rss_growth_mib"] <= d["rss_limit_mib"]
    assert d["fds_leaked"] == 0
    assert d["handler_calls"] == 0 and res["handler_calls"] == []


def test_loops_in_threads_detects_a_lost_callback(tmp_path):
    """The stock loop dropping one storm callback (stress --sabotage) fails
    the scenario, and the report names the callback that went missing."""
    p, res = run_stress(tmp_path, "asyncio", "i", "--sabotage", scale=0.2)
    assert p.returncode == 1
    errors = "\n".join(res["errors"])
    assert "(lost, repeated or out of order)" in errors, errors
    assert "storm callbacks ran" in errors, errors
