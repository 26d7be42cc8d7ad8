"""bench/threads.py (the free-threading issue's numbers) end to end, at a
tiny size: N = 1 and 2 loops in threads serving echo under bench/bin/loadgen,
the same loops each echoing to itself (inproc), and the mixed load (a loop
serving echo beside two to_thread CPU jobs), on
stock asyncio and tideloop.  The figures are not checked (a shared machine),
only that every part ran, measured something and reported it.
"""
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from loop_helpers import child_env

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 28                      # below the suite's 30 s watchdog
TINY = ["--quick", "--repeat", "1", "--loops", "asyncio,tideloop", "--duration", "0.3",
        "--warmup", "0.1", "--job-seconds", "0.1"]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "bench.threads", *args], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=TIMEOUT)


def test_quick_run_measures_every_part(tmp_path):
    out = tmp_path / "threads.json"
    p = _run(*TINY, "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "error:" not in p.stdout, p.stdout
    for title in ("echo: 1 KiB messages", "N loops / 1 loop", "mixed: one loop serving echo",
                  "inproc: each loop echoing 1 KiB to itself", "CPU per round trip"):
        assert title in p.stdout, p.stdout
    assert "reproduce:" in p.stdout

    doc = json.loads(out.read_text())
    assert doc["format"] == "tideloop-threadbench/1" and doc["figure"] == "cpu_us_per_req"
    assert doc["free_threaded"] == bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    rows = doc["results"]
    assert [r["loops_n"] for r in rows] == [1, 2]
    for r in rows:
        assert r["errors"] == {}
        assert r["conns"] == doc["conns_per_loop"] * r["loops_n"]
        for loop in ("asyncio", "tideloop"):
            assert r["rps"][loop] > 0 and r["cpu_us_per_req"][loop] > 0
            assert r["gil"][loop] in (0, 1)
            (sample,) = r["samples"][loop]
            # every connection accepted by one of the loops
            assert len(sample["loop_conns"]) == r["loops_n"]
            assert sum(sample["loop_conns"]) == r["conns"]
    (scaling,) = doc["scaling"]
    assert scaling["loops_n"] == 2 and set(scaling["ratio"]) == {"asyncio", "tideloop"}
    assert scaling["verdict"] in ("PASS", "FAIL", "n/a (GIL build)")
    assert doc["gil_ratio"] is None and doc["inproc_gil_ratio"] is None   # --gil both only
    rows = doc["inproc"]
    assert [r["loops_n"] for r in rows] == [1, 2]
    for r in rows:
        assert r["errors"] == {}
        for loop in ("asyncio", "tideloop"):
            (sample,) = r["samples"][loop]
            # one figure per thread, each thread round-tripped
            assert len(sample["threads"]) == r["loops_n"]
            assert all(t["round_trips"] > 0 and t["cpu_s"] > 0 for t in sample["threads"])
            assert r["cpu_us_per_req"][loop] == pytest.approx(
                sample["cpu_s"] / sample["round_trips"] * 1e6)
    (scaling,) = doc["inproc_scaling"]
    assert scaling["verdict"] in ("PASS", "FAIL", "n/a (GIL build)")
    (mixed,) = doc["mixed"]
    assert mixed["errors"] == {}
    for loop in ("asyncio", "tideloop"):
        assert mixed["t1_s"][loop] > 0 and mixed["ratio_idle"][loop] > 0
        assert mixed["echo_rps_alone"][loop] > 0
        assert mixed["echo_rps_with_jobs"][loop] >= 0
        assert mixed["other_cpu"][loop] >= 0


def test_gil_modes_need_a_free_threaded_build():
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("a free-threaded build takes --gil")
    p = _run("--gil", "both")
    assert p.returncode == 2 and "not a free-threaded build" in p.stderr
    assert "reproduce:" not in p.stdout


def test_usage_errors_before_measuring():
    p = _run("--only", "nope")
    assert p.returncode == 2 and "unknown part" in p.stderr
    p = _run("--n", "0")
    assert p.returncode != 0 and "--n takes positive integers" in p.stderr
    assert "reproduce:" not in p.stdout
