"""Stress scenarios at their quick size, on stock asyncio and tideloop.

Each test runs one scenario of stress/run.py in a child process (the runner
itself starts the scenario's own children: clients, a signal flooder) and
checks the figures it reports.  The watchdog only covers this process, so the
child gets its own timeout below it.  With TIDELOOP_SANITIZE_RUN=1 (set by
tools/sanitize.sh, where everything is 5-10x slower) the sizes are scaled
down 10x.

test_scenario_detects_a_broken_loop runs each scenario on a stock loop with a
planted bug (--sabotage) and checks the scenario reports it: none of these
tests can pass on a loop that drops a callback, corrupts a byte, leaks an fd,
never pauses a writer, loses signals or swallows an EMFILE report.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loop_helpers import SLOW, child_env

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "stress" / "run.py"
# The runner's own sizes and scenario list (the checkout's root and stress/
# are on sys.path through pytest's pythonpath, pyproject.toml: stress/run.py
# imports its scenarios as top-level modules).
from stress import run as stress_run
from scenarios.g_close_with_live_fds import expected_warnings

SANITIZE = os.environ.get("TIDELOOP_SANITIZE_RUN") == "1"
SCALE = 0.1 if SANITIZE else 1.0
CHILD_TIMEOUT = 27 * SLOW  # below the 30 s watchdog (conftest: times SLOW too)
SZ = stress_run.sizes("quick", SCALE)


@pytest.fixture(autouse=True)
def _tideloop_only_under_sanitizers(request):
    # The sanitizer run is there for tideloop's C code: the stock loop's side
    # and the sabotage checks run in the normal suite (under ASan the stock
    # loop's own timing races, e.g. its EMFILE retry after a server closed,
    # would only add noise).
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if SANITIZE and params.get("loop_name", "asyncio") != "tideloop":
        pytest.skip("sanitizer run: tideloop's side only")


def run_stress(tmp_path, loop_name, scenario, *extra, scale=SCALE):
    out = tmp_path / "stress.json"
    p = subprocess.run(
        [sys.executable, str(RUNNER), "--quick", "--loop", loop_name,
         "--only", scenario, "--scale", str(scale), "--json", str(out), *extra],
        capture_output=True, text=True, timeout=CHILD_TIMEOUT, env=child_env(),
        cwd=ROOT)
    assert out.exists(), f"no result (exit {p.returncode}):\n{p.stdout}\n{p.stderr}"
    (res,) = json.loads(out.read_text())["results"]
    return p, res


def check_clean(p, res):
    assert not res["skipped"], res["skipped"]
    assert res["errors"] == [], "\n".join(res["errors"]) + "\n" + res.get("stderr_tail", "")
    assert p.returncode == 0, p.stderr


def test_10k_concurrent_connections(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "a")
    check_clean(p, res)
    n = SZ["a_conns"]
    assert res["conns"] == n and res["details"]["server_peak"] == n
    assert res["requests"] == n * SZ["a_rounds"]
    assert res["bytes_sent"] == res["bytes_verified"] > n
    assert res["details"]["clients_saw_eof"] == n


def test_clients_reset_mid_write(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "b")
    check_clean(p, res)
    assert res["faults"] == SZ["b_clients"]
    assert res["conns"] == SZ["b_clients"] + 3
    assert res["bytes_sent"] == res["bytes_verified"] == 3 * (SZ["b_payload"] + SZ["b_send"])
    # stock asyncio calls the exception handler for none of the resets
    assert res["handler_calls"] == []


def test_peer_that_never_reads(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "c")
    check_clean(p, res)
    d = res["details"]
    assert d["pauses_idle"] >= SZ["c_conns"]
    assert d["max_write_buffer"] <= d["high_water"] + (64 << 10)
    assert res["bytes_sent"] == res["bytes_verified"] == (SZ["c_conns"] + 1) * SZ["c_total"]


def test_emfile_on_accept(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "d")
    check_clean(p, res)
    m = SZ["d_limit"] + SZ["d_extra"]
    held = res["details"]["accepted_at_limit"]
    assert 0 < held < m and res["faults"] == m - held
    assert res["conns"] == m
    assert res["requests"] == held * SZ["d_rounds"] + m
    assert res["bytes_sent"] == res["bytes_verified"] > 0
    assert res["handler_calls"] and all(
        c.startswith("socket.accept() out of system resource: OSError(24,")
        for c in res["handler_calls"]), res["handler_calls"]


def test_call_soon_threadsafe_storm(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "e")
    check_clean(p, res)
    assert res["requests"] == 2 * 8 * SZ["e_k"] + SZ["e_trials"]
    assert res["details"]["wakeup_ms_max"] < 500


def test_signal_flood_during_io(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "f")
    check_clean(p, res)
    d = res["details"]
    assert 0 < d["handled"] <= d["signals_sent"]
    assert d["handled_during_io"] > 0
    assert res["bytes_sent"] == res["bytes_verified"] >= SZ["f_bytes"]


def test_close_loop_with_live_transports(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "g")
    check_clean(p, res)
    d = res["details"]
    assert d["fds_open_with_loop_alive"] == 0
    warned = {k: v for k, v in d["resource_warnings"].items()
              if k != "unclosed connected socket"}
    assert warned == expected_warnings(SZ["g_conns"])


def test_tls_clients_reset(tmp_path, loop_name):
    p, res = run_stress(tmp_path, loop_name, "h")
    check_clean(p, res)
    routes = res["details"]["routes"]
    n = SZ["h_clients"]
    assert res["faults"] == n * len(routes)
    assert res["conns"] == (n + 3) * len(routes)
    assert res["bytes_sent"] == res["bytes_verified"] > 0
    # stock asyncio calls the exception handler for none of the failures
    assert res["handler_calls"] == []
    for route in routes:
        d = res["details"][route]
        assert d["modes"] == {m: n // 4 for m in ("mid-hello", "after-hello", "mid-write",
                                                   "mid-read")}
        assert d["protocols"] == n + 3 and d["made"] == d["lost"]
        # every client that reset before its handshake ended made no connection
        assert d["handshakes_failed"] >= n // 2
        assert d["healthy_ok"] == 3


@pytest.mark.parametrize("scenario", list(stress_run.SCENARIOS))
def test_scenario_detects_a_broken_loop(tmp_path, scenario):
    """The stock loop with a planted bug must make the scenario fail."""
    p, res = run_stress(tmp_path, "asyncio", scenario, "--sabotage", scale=0.2 * SCALE)
    if res.get("skipped"):
        pytest.skip(res["skipped"])
    assert res["errors"], f"sabotaged scenario {scenario} found nothing: {res}"
    assert p.returncode == 1
