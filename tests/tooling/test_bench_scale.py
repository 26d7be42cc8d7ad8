"""python -m bench.scale: the figures come out per loop, a loop that cannot
run says why, and the memory target is judged against uvloop."""
import json
import os
import subprocess
import sys

from loop_helpers import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, *args):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "--quick", *args,
                           "--json", str(out)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text())


def test_timers_and_tasks_have_every_figure(tmp_path):
    stdout, doc = _run(tmp_path, "--only", "timers,tasks", "--sizes", "200",
                       "--loops", "asyncio,tideloop")
    rows = {r["what"]: r for r in doc["results"]}
    assert set(rows) == {"timers", "tasks"}
    for what, figures in (("timers", ("ns_per_call_later", "ns_per_cancel", "ns_per_fired",
                                      "rss_per_timer")),
                          ("tasks", ("ns_per_task", "ns_per_task_cancel", "rss_per_task"))):
        for name in figures:
            got = rows[what]["figures"][name]
            assert set(got) == {"asyncio", "tideloop"}, (what, name, got)
            if name.startswith("ns_"):
                assert all(v > 0 for v in got.values()), (what, name, got)
    assert "a task created and run to its sleep" in stdout


def test_idle_connections_and_a_missing_loop(tmp_path):
    stdout, doc = _run(tmp_path, "--only", "protocol", "--conns", "50",
                       "--loops", "asyncio,tideloop,no_such_loop_module_xyz")
    (row,) = doc["results"]
    assert set(row["figures"]["rss_per_conn"]) == {"asyncio", "tideloop"}
    assert row["figures"]["us_per_conn"]["tideloop"] > 0
    assert "no_such_loop_module_xyz" in stdout and "skipped" in stdout
    # no uvloop measured: the memory target has no reference
    assert row["verdict"] is None


def test_a_server_too_slow_to_accept_fails_its_row():
    """open_idle gives up once its budget is spent, saying how far it got."""
    import sys as _sys
    _sys.path.insert(0, ROOT)
    try:
        from bench import scale
        from tideloop._bench import harness
    finally:
        _sys.path.remove(ROOT)
    import pytest
    keep = []
    with pytest.raises(harness.RunError, match=r"more than 0 s to accept 5 connections \(0 made\)"):
        scale.open_idle(1, 5, False, keep, budget_s=0)
    assert keep == []
