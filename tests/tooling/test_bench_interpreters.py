"""bench/interpreters.py (isolated interpreters against threads and
processes): its pure parts on any Python -- the app's request handling, the
memory and CPU ratios and their verdicts from a made-up run, the report's
tables, the reproduce line -- and a tiny real run end to end: on CPython 3.13+
tideloop in interpreters and in processes, before it threads and processes
(the interpreter ways are skipped there, and say why).  The figures of the
real run are not checked (a shared machine), only that every cell ran,
measured something and was reported.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loop_helpers import child_env

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 28                      # below the suite's 30 s watchdog
HAS_INTERPRETERS = sys.version_info >= (3, 13)
TINY = ["--quick", "--repeat", "1", "--inproc-repeat", "1", "--duration", "0.3",
        "--warmup", "0.1", "--trips", "2000", "--warmup-trips", "200",
        "--conns-per-loop", "10"]


@pytest.fixture(scope="module")
def bench():
    from bench import interpreters
    return interpreters


@pytest.fixture(scope="module")
def worker():
    from bench import interpreters_worker
    return interpreters_worker


def _run(*args):
    return subprocess.run([sys.executable, "-m", "bench.interpreters", *args], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=TIMEOUT)


# -- the app -----------------------------------------------------------------

def test_the_app_handles_whole_requests_and_echoes_them(worker):
    class Transport:
        def __init__(self):
            self.out = []

        def write(self, data):
            self.out.append(bytes(data))

    counter = [0]
    p = worker.AppProtocol(8, 4, counter)
    t = Transport()
    p.connection_made(t)
    assert counter == [1]
    p.data_received(b"abc")                 # a part of a request: nothing yet
    assert t.out == []
    p.data_received(b"defgh12")             # its end and a part of the next one
    assert t.out == [b"abcdefgh"]
    p.data_received(b"345678ABCDEFGH")      # the next one's end and a whole one more
    assert t.out == [b"abcdefgh", b"12345678ABCDEFGH"]
    assert p.buffer == b""
    record = json.loads(worker.handle_request(bytes(range(256)) * 4, 128))
    assert record["size"] == 1024 and record["first"] == 0 and record["last"] == 255
    assert record["field0"] == "0001020304050607" and record["field1"] == "08090A0B0C0D0E0F"


def test_memory_of_this_process(bench):
    import os
    m = bench.memory(os.getpid())
    assert m["rss_kib"] > 1000
    if os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        assert 0 < m["uss_kib"] <= m["pss_kib"] <= m["rss_kib"]


# -- the figures from a made-up run ---------------------------------------------

def _mem(rss, pss, uss, per=None):
    per = per or [(rss, pss, uss)]
    return {"rss_kib": rss, "pss_kib": pss, "uss_kib": uss,
            "rss_per_process_kib": [p[0] for p in per],
            "pss_per_process_kib": [p[1] for p in per],
            "uss_per_process_kib": [p[2] for p in per]}


def _row(kind, n, cpu, wall=None, other=None, memory=None, errors=None):
    row = {"kind": kind, "label": f"N={n}", "loops_n": n,
           "rps": {v: 1000.0 for v in cpu}, "cpu_us_per_req": cpu,
           "other_cpu": other or {v: 0.05 for v in cpu}, "errors": errors or {},
           "samples": {v: [{"cpu_us_per_req": x, "other_cpu": 0.05,
                            "loop_conns": [5] * n, "wall_s": 1.0}] for v, x in cpu.items()}}
    if kind == "inproc":
        row["wall_s"] = wall
    else:
        row["memory"] = memory or {}
    return row


def fake_run(busy=0.05):
    echo = [
        _row("echo", 1, {"tl-interp": 20.0, "tl-threads": 19.0, "tl-procs": 18.0,
                         "aio-interp": 40.0},
             memory={"tl-interp": _mem(43000, 35000, 28000),
                     "tl-threads": _mem(31000, 23000, 16000),
                     "tl-procs": _mem(30000, 23000, 16000),
                     "aio-interp": _mem(43000, 35000, 28000)}),
        _row("echo", 2, {"tl-interp": 21.0, "tl-threads": 30.0, "tl-procs": 18.5,
                         "aio-interp": 42.0},
             memory={"tl-interp": _mem(51000, 43000, 36000),
                     "tl-threads": _mem(31000, 23000, 16000),
                     "tl-procs": _mem(60000, 40000, 31000,
                                      [(30000, 20000, 16000), (30000, 20000, 15000)]),
                     "aio-interp": _mem(56000, 48000, 41000)}),
    ]
    inproc = [
        _row("inproc", 1, {"tl-interp": 17.0, "tl-threads": 17.0, "tl-procs": 16.5,
                           "aio-interp": 21.0},
             wall={"tl-interp": 1.0, "tl-threads": 1.0, "tl-procs": 1.0, "aio-interp": 1.3}),
        _row("inproc", 2, {"tl-interp": 17.5, "tl-threads": 20.0, "tl-procs": 16.6,
                           "aio-interp": 21.5},
             wall={"tl-interp": 0.52, "tl-threads": 1.2, "tl-procs": 0.51, "aio-interp": 0.7},
             other={"tl-interp": busy, "tl-threads": 0.0, "tl-procs": 0.0,
                    "aio-interp": 0.0}),
    ]
    return echo, inproc


def test_memory_per_extra_interpreter_against_per_extra_process(bench):
    echo, _ = fake_run()
    mem = bench.memory_summary(echo)
    assert mem["extra_kib"]["tl-interp"]["rss_kib"] == 8000
    assert mem["extra_kib"]["tl-threads"]["rss_kib"] == 0
    proc = mem["extra_kib"]["tl-procs"]       # the second process's own
    assert (proc["rss_kib"], proc["pss_kib"], proc["uss_kib"]) == (30000, 20000, 15000)
    assert mem["ratio"]["tl-interp"] == pytest.approx(8000 / 20000)
    assert mem["ratio_uss"]["tl-interp"] == pytest.approx(8000 / 15000)
    assert mem["ratio"]["aio-interp"] == pytest.approx(13000 / 20000)
    assert mem["verdict"] == "PASS" and mem["target"] == bench.TARGET_MEMORY


def test_targets_and_verdicts(bench):
    echo, inproc = fake_run()
    mem = bench.memory_summary(echo)
    by = {t["name"]: t for t in bench.verdicts(echo, inproc, mem, cpus=2)}
    assert by["memory"]["verdict"] == "PASS"
    cpu = by["inproc_cpu_scaling"]
    assert cpu["ratio"]["tl-interp"] == pytest.approx(17.5 / 17.0)
    assert cpu["verdict"] == "PASS"
    wall = by["inproc_wall_split"]
    assert wall["ratio"]["tl-interp"] == pytest.approx(0.52)
    assert wall["ratio"]["tl-threads"] == pytest.approx(1.2)
    assert wall["verdict"] == "PASS"
    sub = by["sub_vs_main"]
    assert sub["ratio"] == {"tl-interp": pytest.approx(17.0 / 16.5)}
    assert sub["verdict"] == "PASS"
    assert by["echo_cpu_n2_vs_n1"]["verdict"] == "info"
    assert by["echo_sub_vs_main"]["ratio"]["tl-interp"] == pytest.approx(20.0 / 18.0)
    # the wall-time split says nothing when the other CPU was not free
    by = {t["name"]: t for t in bench.verdicts(echo, fake_run(busy=0.8)[1], mem, cpus=2)}
    assert by["inproc_wall_split"]["verdict"].startswith("n/a (machine busy")
    by = {t["name"]: t for t in bench.verdicts(echo, inproc, mem, cpus=1)}
    assert by["inproc_wall_split"]["verdict"] == "n/a (fewer than 2 CPUs)"
    # misses
    inproc[1]["cpu_us_per_req"]["tl-interp"] = 19.0
    inproc[1]["wall_s"]["tl-interp"] = 0.9
    by = {t["name"]: t for t in bench.verdicts(echo, inproc, mem, cpus=2)}
    assert by["inproc_cpu_scaling"]["verdict"] == "FAIL"
    assert by["inproc_wall_split"]["verdict"] == "FAIL"
    # a failed tl-interp run is an ERROR, not a verdict
    inproc[1]["errors"] = {"tl-interp": "crashed"}
    del inproc[1]["cpu_us_per_req"]["tl-interp"]
    by = {t["name"]: t for t in bench.verdicts(echo, inproc, mem, cpus=2)}
    assert by["inproc_cpu_scaling"]["verdict"] == "ERROR"
    # without isolated interpreters every judged target is n/a
    by = {t["name"]: t for t in bench.verdicts(echo, inproc, mem, cpus=2,
                                                skipped={"tl-interp": "3.11"})}
    assert by["memory"]["verdict"].startswith("n/a")
    assert by["inproc_cpu_scaling"]["verdict"].startswith("n/a")


def test_report_tables(bench):
    echo, inproc = fake_run()
    mem = bench.memory_summary(echo)
    doc = {"variants": list(bench.VARIANTS), "size": 1024, "conns_per_loop": 50,
           "trips": 60000, "results": echo + inproc, "memory": mem,
           "targets": bench.verdicts(echo, inproc, mem, cpus=2)}
    text = bench.format_report(doc, markdown=False)
    for title in ("echo: the app over TCP", "memory (MiB)", "inproc: each loop's own client",
                  "ratios and targets"):
        assert title in text
    assert "tl-procs (2nd process)" in text
    assert "<= 0.60x" in text and "PASS" in text
    assert "-0.0" not in text                      # an extra thread's nothing is 0.0
    md = bench.format_report(doc, markdown=True)
    assert "| figure |" in md and "|:---|" in md


def test_reproduce_command_names_every_setting(bench):
    args = bench.build_parser().parse_args(["--quick", "--quiet-wait", "3"])
    cfg = bench.config(args)
    cmd = bench.reproduce_command(args, cfg)
    assert "-m bench.interpreters" in cmd and "--quick" in cmd and "--quiet-wait 3" in cmd
    assert "--trips 12000" in cmd and "--variants" not in cmd
    args = bench.build_parser().parse_args(["--variants", "tl-procs,tl-threads"])
    cfg = bench.config(args)
    assert cfg.variants == ["tl-procs", "tl-threads"]
    assert "--variants tl-procs,tl-threads" in bench.reproduce_command(args, cfg)


def test_usage_errors_before_measuring():
    p = _run("--variants", "nope")
    assert p.returncode == 2 and "unknown variant" in p.stderr
    p = _run("--only", "nope")
    assert p.returncode == 2 and "unknown part" in p.stderr
    p = _run("--trips", "1001", "--n", "2")
    assert p.returncode == 2 and "split evenly" in p.stderr
    assert "reproduce:" not in p.stdout


@pytest.mark.skipif(HAS_INTERPRETERS, reason="CPython 3.13+ has isolated interpreters")
def test_without_isolated_interpreters_their_ways_are_skipped(bench):
    assert set(bench.interpreters_skipped(list(bench.VARIANTS))) == {"tl-interp",
                                                                      "aio-interp"}
    p = _run("--variants", "tl-interp,aio-interp")
    assert p.returncode == 2 and "no way left to measure" in p.stderr
    assert "needs CPython 3.13+" in p.stderr


def test_plot_draws_the_ways_as_series(bench, tmp_path):
    pytest.importorskip("matplotlib")
    from bench import plot
    echo, inproc = fake_run()
    doc = {"format": "tideloop-interpbench/1", "figure": "cpu_us_per_req",
           "series": list(bench.SERIES), "results": echo + inproc, "repeat": 3,
           "environment": {"python": "3.14.0", "cpus": 2}}
    chart = plot.draw(doc, tmp_path / "interpreters.svg")
    assert chart.reference == "aio-interp"
    assert chart.series == ["tl-interp", "tl-threads", "tl-procs"]
    assert [label for label, _ in chart.rows] == ["echo N=1", "echo N=2",
                                                  "inproc N=1", "inproc N=2"]
    assert chart.rows[0][1]["tl-interp"] == pytest.approx(40.0 / 20.0)
    assert "bar-tl-procs-3" in (tmp_path / "interpreters.svg").read_text()


# -- a tiny real run -------------------------------------------------------------

def test_tiny_run_measures_every_cell(tmp_path):
    out = tmp_path / "interpreters.json"
    variants = "tl-interp,tl-procs" if HAS_INTERPRETERS else "tl-threads,tl-procs"
    p = _run(*TINY, "--variants", variants, "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "error:" not in p.stdout, p.stdout
    for title in ("echo: the app over TCP", "memory (MiB)", "inproc: each loop's own client",
                  "ratios and targets", "stages: setup", "reproduce:"):
        assert title in p.stdout, p.stdout

    doc = json.loads(out.read_text())
    assert doc["format"] == "tideloop-interpbench/1" and doc["figure"] == "cpu_us_per_req"
    assert doc["command"].startswith(("PYTHONPATH", sys.executable.split("/")[-1], "python",
                                      sys.executable))
    env = doc["environment"]
    assert env["python"] == sys.version.split()[0] and env["cpus"] >= 1
    assert "git" in env and env["background_load"]["runs"] == 8
    assert set(doc["stages_s"]) == {"setup", "echo", "inproc", "total"}
    measured = variants.split(",")
    assert doc["variants"] == measured
    assert doc["skipped"] == {}
    echo = [r for r in doc["results"] if r["kind"] == "echo"]
    inproc = [r for r in doc["results"] if r["kind"] == "inproc"]
    assert [r["loops_n"] for r in echo] == [1, 2] == [r["loops_n"] for r in inproc]
    for r in echo:
        assert r["errors"] == {}
        for v in measured:
            assert r["rps"][v] > 0 and r["cpu_us_per_req"][v] > 0
            (sample,) = r["samples"][v]
            # every connection accepted by one of the loops, which all stopped cleanly
            assert len(sample["loop_conns"]) == r["loops_n"]
            assert sum(sample["loop_conns"]) == 10 * r["loops_n"]
            assert r["memory"][v]["rss_kib"] > 0
    for r in inproc:
        assert r["errors"] == {}
        for v in measured:
            (sample,) = r["samples"][v]
            assert len(sample["loops"]) == r["loops_n"]
            assert sample["round_trips"] == 2000
            assert all(x["round_trips"] == 2000 // r["loops_n"] and x["cpu_s"] > 0
                       for x in sample["loops"])
            assert r["wall_s"][v] > 0
    mem = doc["memory"]
    assert mem["extra_kib"]["tl-procs"]["pss_kib"] > 0
    names = {t["name"]: t for t in doc["targets"]}
    assert {"memory", "inproc_cpu_scaling", "inproc_wall_split", "sub_vs_main"} <= set(names)
    for t in names.values():
        assert t["verdict"] is None or t["verdict"].startswith(
            ("PASS", "FAIL", "n/a", "info")), t
