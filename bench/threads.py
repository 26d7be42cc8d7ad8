#!/usr/bin/env python3
"""Loops in threads (the free-threading issue): N event loops in N threads of
one server process serving TCP echo, and one loop serving echo while
asyncio.to_thread CPU jobs run; asyncio, uvloop and tideloop.

    python -m bench.threads                        # N = 1, 2; ~4 min
    python -m bench.threads --quick                # smoke, ~1 min
    python -m bench.threads --n 1,2,4,8            # a bigger machine
    python -m bench.threads --gil both             # free-threaded builds: GIL on and off
    python -m bench.threads --json threads.json --plot threads.svg

echo   The server (bench/threads_worker.py echo) runs N loops, one per
       thread, each an asyncio.Protocol echo server on its own listening
       socket, all bound with SO_REUSEPORT to one port (the kernel spreads the
       connections); the main thread runs no loop.  bench/bin/loadgen (C, one
       process, closed loop, every echoed byte checked) keeps --conns-per-loop
       x N connections busy with --size byte messages: warm-up, then D seconds
       measured.  Figures: requests/s (loadgen's) and the server process's CPU
       time (utime+stime of all its threads, /proc/<pid>/stat, read when loadgen
       starts and ends its window) per request; how many connections each loop
       got from the kernel is in the JSON (loop_conns).  Connections per loop stay the same for
       every N, so that a loop's batching does not change with N.
inproc The same N loops in N threads (bench/threads_worker.py inproc), each
       echoing 1 KiB to itself over a Unix socket pair with one request in
       flight (a client and a server Protocol on the same loop), with no load
       generator and nothing shared between the threads: CPU time per round
       trip (each thread's own time.thread_time()).  On N free cores this only
       grows with N where the threads contend -- in the loop, the allocator,
       the interpreter -- which is what the scaling target asks about; the
       echo part on a machine of N cores also has the load generator
       competing for them (less batching per read, more wake-ups).
mixed  One loop (bench/threads_worker.py mixed, in the main thread) serving
       echo (--mixed-conns connections) while two pure-Python CPU jobs run in
       asyncio.to_thread.  A job is calibrated to take about --job-seconds
       alone; figures: two jobs at once with the loop idle (t2 idle / t1 --
       the target's figure: two free cores) and under the echo load (t2 load /
       t1), the echo rate alone and while the two jobs run.

For each row the loops run in an order rotated by the repetition (fresh
server process per run); each figure is the median of the R repetitions.

--gil (free-threaded builds): "default" leaves PYTHON_GIL as it is (the
three loops keep the GIL off on import), "on"
and "off" set PYTHON_GIL=1 or 0 for the servers, "both" measures each.  The
GIL state every server reported (sys._is_gil_enabled() after making its
loops) is in the table.

Targets (benchmarks, not timed tests):
    echo, inproc   tideloop's CPU per request with 2 loops <= 1.05 x its 1-loop
           figure (no contention in the core), on free-threaded builds (with
           a GIL the loops contend for it: n/a)
    gil    tideloop's 1-loop CPU per request with the GIL off <= 1.10 x the
           same interpreter with the GIL on (--gil both)
    mixed  two to_thread jobs beside a tideloop loop take <= 1.20 x the wall
           time of one (t2 idle / t1) where the build is free-threaded (on a
           build with a GIL they serialise: n/a) and the rest of the machine
           left the cores free (other load above 30 % of a CPU: n/a)

Nothing is pinned: the servers, loadgen and the jobs share the machine's CPUs
(2 on the reference VM, where N = 2 loops and the load generator compete for
them: CPU per request, not requests/s, is the figure the target uses).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time

from bench import plot, procs
from tideloop._bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
WORKER_PY = ["-m", "bench.threads_worker"]   # run from the checkout's root (cwd=ROOT)

PARTS = ("echo", "inproc", "mixed")
NS = (1, 2)
SIZE = 1024
CONNS_PER_LOOP = 50
MIXED_CONNS = 10
GIL_MODES = ("default", "on", "off", "both")
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

TARGET_SCALING = 1.05          # tideloop cpu/req, 2 loops / 1 loop
TARGET_GIL = 1.10              # tideloop cpu/req, 1 loop, GIL off / GIL on
TARGET_MIXED = 1.20            # tideloop two jobs / one job, loop idle
RUN_TIMEOUT = 120.0
BUSY_CPU = 0.3                 # mixed: other load (CPUs) above which 2 cores are not free
ABBREV = {"asyncio": "aio", "uvloop": "uv", "tideloop": "tl"}


def gil_env(env, mode):
    env = dict(env)
    if mode == "on":
        env["PYTHON_GIL"] = "1"
    elif mode == "off":
        env["PYTHON_GIL"] = "0"
    return env


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------

def loop_conns(proc, deadline):
    """The connections each loop accepted: SIGUSR1 makes the server print
    "STATS conns=<a,b,...>"."""
    try:
        proc.send_signal(signal.SIGUSR1)
    except ProcessLookupError:
        return None
    line = procs.read_line(proc, deadline)
    if not line or not line.startswith("STATS conns="):
        return None
    return [int(x) for x in line.split("=", 1)[1].split(",") if x]


def parse_ready(line):
    """"READY <port> gil=<0|1> tids=<a,b>" -> (port, gil, [tids])."""
    parts = line.split()
    fields = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
    tids = [int(t) for t in fields.get("tids", "").split(",") if t]
    return parts[1], int(fields.get("gil", 1)), tids


def run_echo(loop, n, gil_mode, cfg, paths, workdir):
    """One server process with ``n`` loops under loadgen; a sample dict or
    harness.RunError."""
    errlog = os.path.join(workdir, "server.err")
    cmd = [cfg.python, *WORKER_PY, "echo", "--loop", loop, "--loops-n", str(n)]
    conns = cfg.conns_per_loop * n
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, env=gil_env(cfg.env, gil_mode), cwd=ROOT)
    gen = None
    try:
        line = procs.read_line(proc, time.monotonic() + procs.READY_TIMEOUT)
        if line is None or not line.startswith("READY"):
            procs.stop(proc)
            why = (f"no READY within {procs.READY_TIMEOUT:g}s" if proc.returncode is None
                   else f"exit status {proc.returncode} before READY")
            raise harness.RunError(procs.stderr_reason(errlog, "threads_worker", why),
                                   startup=True)
        port, gil, _tids = parse_ready(line)
        gen = subprocess.Popen(
            [paths["loadgen"], "127.0.0.1", port, "--conns", str(conns),
             "--size", str(cfg.size), "--duration", f"{cfg.duration:g}",
             "--warmup", f"{cfg.warmup:g}", "--hold"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + cfg.warmup + cfg.duration + 30
        start = end = result = None
        while True:
            line = procs.read_line(gen, deadline)
            if line is None:
                break
            if line == "START":
                start = procs.Snapshot(proc.pid)
            elif line.startswith("{"):
                end = procs.Snapshot(proc.pid)
                result = json.loads(line)
                break
        alive = proc.poll() is None
        spread = loop_conns(proc, time.monotonic() + 5) if alive and result else None
        gen_err = procs.finish_generator(gen)
        if not alive:
            raise harness.RunError(f"server exited during the run (status "
                                   f"{proc.returncode}): " + procs.stderr_reason(
                                       errlog, "threads_worker", "no message"))
        if result is None or start is None:
            raise harness.RunError("loadgen failed: " + (gen_err.splitlines()[-1] if gen_err
                                                         else f"status {gen.returncode}"))
    finally:
        if gen is not None and gen.poll() is None:
            gen.kill()
            gen.wait()
        procs.stop(proc)
    if result["errors"] or result["warmup_errors"]:
        raise harness.RunError(f"{result['errors'] + result['warmup_errors']} echo errors "
                               f"({result['conns_alive']}/{result['conns']} connections left)")
    if not result["requests"]:
        raise harness.RunError("no request completed")
    cpu = end.cpu - start.cpu
    return {"rps": result["rps"], "cpu_us_per_req": cpu / result["requests"] * 1e6,
            "gil": gil, "conns": conns, "loop_conns": spread,
            **procs.server_figures(result, start, end)}


def run_inproc(loop, n, gil_mode, cfg, workdir):
    errlog = os.path.join(workdir, "inproc.err")
    cmd = [cfg.python, *WORKER_PY, "inproc", "--loop", loop, "--loops-n", str(n),
           "--size", str(cfg.size), "--warmup", f"{cfg.warmup:g}",
           "--window", f"{cfg.duration:g}"]
    result, _, _, _ = procs.run_to_result(
        cmd, env=gil_env(cfg.env, gil_mode), cwd=ROOT, errlog=errlog, prog="threads_worker",
        timeout=RUN_TIMEOUT, startup_failed=_import_failed)
    return result


def run_mixed(loop, gil_mode, cfg, paths, workdir):
    errlog = os.path.join(workdir, "mixed.err")
    cmd = [cfg.python, *WORKER_PY, "mixed", "--loop", loop, "--loadgen", paths["loadgen"],
           "--conns", str(cfg.mixed_conns), "--size", str(cfg.size),
           "--warmup", f"{cfg.warmup:g}", "--window", f"{cfg.duration:g}",
           "--job-seconds", f"{cfg.job_seconds:g}"]
    result, _, _, _ = procs.run_to_result(
        cmd, env=gil_env(cfg.env, gil_mode), cwd=ROOT, errlog=errlog, prog="threads_worker",
        timeout=RUN_TIMEOUT, startup_failed=_import_failed)
    return result


def _import_failed(errlog):
    reason = procs.stderr_reason(errlog, "threads_worker", "")
    return "ModuleNotFoundError" in reason or "ImportError" in reason


# --------------------------------------------------------------------------
# The rows
# --------------------------------------------------------------------------

def measure_rows(names, cfg, log, label, fn):
    """Interleaved runs of ``fn(loop)`` for each loop (``names``), a loop that
    could not start at all stays out of the later rows."""
    def measure(name):
        if cfg.quiet_wait:
            procs.wait_quiet(cfg.quiet_wait)
        try:
            return fn(name)
        except harness.RunError as exc:
            if exc.startup:
                cfg.startup_errors[name] = str(exc)
            raise

    log(f"  {label:<26}")
    samples, errors = harness.interleave(
        names, cfg.repeat, measure, log=log,
        errors={n: cfg.startup_errors[n] for n in names if n in cfg.startup_errors})
    return samples, errors


def echo_rows(cfg, paths, workdir, log, kind="echo"):
    """The echo part's rows (``kind`` "echo") or the inproc part's."""
    rows = []
    for mode in cfg.gil_modes:
        for n in cfg.ns:
            label = f"{n} loop{'s' if n > 1 else ''}" + (
                f", GIL {mode}" if mode != "default" else "")
            if kind == "echo":
                def run(loop):
                    return run_echo(loop, n, mode, cfg, paths, workdir)
            else:
                def run(loop):
                    return run_inproc(loop, n, mode, cfg, workdir)
            samples, errors = measure_rows(cfg.loops, cfg, log, f"{kind} {label}", run)
            row = {
                "kind": kind, "label": label, "loops_n": n, "gil_mode": mode,
                "size": cfg.size, "conns": cfg.conns_per_loop * n if kind == "echo" else n,
                "rps": harness.medians(samples, errors, "rps"),
                "cpu_us_per_req": harness.medians(samples, errors, "cpu_us_per_req"),
                "gil": {name: xs[0]["gil"] for name, xs in samples.items() if xs},
                "samples": {name: xs for name, xs in samples.items() if xs},
                "errors": dict(errors),
            }
            log(" " + " ".join(
                f"{name}=ERROR" if name in errors else
                f"{name}={_fmt_us(row['cpu_us_per_req'].get(name))}us"
                for name in cfg.loops) + "\n")
            rows.append(row)
    return rows


def mixed_rows(cfg, paths, workdir, log):
    rows = []
    keys = ("t1_s", "t2_idle_s", "t2_load_s", "ratio_idle", "ratio_load",
            "echo_rps_alone", "echo_rps_with_jobs", "other_cpu")
    for mode in cfg.gil_modes:
        label = "mixed" + (f", GIL {mode}" if mode != "default" else "")
        samples, errors = measure_rows(cfg.loops, cfg, log, label,
                                       lambda loop: run_mixed(loop, mode, cfg, paths, workdir))
        row = {"gil_mode": mode, "conns": cfg.mixed_conns, "size": cfg.size,
               "job_seconds": cfg.job_seconds,
               "gil": {name: xs[0]["gil"] for name, xs in samples.items() if xs},
               "samples": {name: xs for name, xs in samples.items() if xs},
               "errors": dict(errors)}
        for k in keys:
            row[k] = harness.medians(samples, errors, k)
        ratio = row["ratio_idle"].get("tideloop")
        if "tideloop" in errors:
            row["verdict"] = "ERROR"
        elif ratio is None:
            row["verdict"] = None
        elif not FREE_THREADED:
            row["verdict"] = "n/a (GIL build)"
        elif mode == "on":          # the jobs take turns holding the GIL
            row["verdict"] = "n/a (GIL on)"
        elif row["other_cpu"].get("tideloop", 0.0) > BUSY_CPU:
            row["verdict"] = "n/a (machine busy)"
        else:
            row["verdict"] = "PASS" if ratio <= TARGET_MIXED else "FAIL"
        log(" " + " ".join(
            f"{name}=ERROR" if name in errors else
            f"{name}={harness.fmt_ratio(row['ratio_idle'].get(name))}"
            for name in cfg.loops) + "\n")
        rows.append(row)
    return rows


def scaling(rows, loops):
    """{gil mode: {n: {loop: cpu(n)/cpu(1)}, verdict}} for every n > 1."""
    out = []
    for mode in dict.fromkeys(r["gil_mode"] for r in rows):
        by_n = {r["loops_n"]: r for r in rows if r["gil_mode"] == mode}
        if 1 not in by_n:
            continue
        base = by_n[1]
        for n, r in sorted(by_n.items()):
            if n == 1:
                continue
            ratios = {loop: harness.ratio(r["cpu_us_per_req"].get(loop),
                                          base["cpu_us_per_req"].get(loop)) for loop in loops}
            entry = {"gil_mode": mode, "loops_n": n, "ratio": ratios,
                     "target": TARGET_SCALING if n == 2 else None}
            tl = ratios.get("tideloop")
            if "tideloop" in r["errors"] or "tideloop" in base["errors"]:
                entry["verdict"] = "ERROR"
            elif n != 2:
                entry["verdict"] = "info"
            elif tl is None:
                entry["verdict"] = None
            elif not FREE_THREADED:
                entry["verdict"] = "n/a (GIL build)"
            elif mode == "on":      # the loops take turns holding the GIL
                entry["verdict"] = "n/a (GIL on)"
            else:
                entry["verdict"] = "PASS" if tl <= TARGET_SCALING else "FAIL"
            out.append(entry)
    return out


def gil_ratio(rows, loops):
    """1 loop, GIL off / GIL on, where both were measured."""
    one = {r["gil_mode"]: r for r in rows if r["loops_n"] == 1}
    if "on" not in one or "off" not in one:
        return None
    on, off = one["on"], one["off"]
    ratios = {loop: harness.ratio(off["cpu_us_per_req"].get(loop),
                                  on["cpu_us_per_req"].get(loop)) for loop in loops}
    tl = ratios.get("tideloop")
    if "tideloop" in on["errors"] or "tideloop" in off["errors"]:
        verdict = "ERROR"
    elif tl is None:
        verdict = None
    else:
        verdict = "PASS" if tl <= TARGET_GIL else "FAIL"
    return {"ratio": ratios, "target": TARGET_GIL, "verdict": verdict,
            "gil_on": on["gil"], "gil_off": off["gil"]}


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def _fmt_rps(x):
    if x is None:
        return "-"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _fmt_us(x):
    return "-" if x is None else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _fmt_load(x):
    return "-" if x is None else f"{x:.0%}"


def _fmt_s(x):
    return "-" if x is None else f"{x:.2f}"


def _gil_state(gil, loops):
    return " ".join(f"{ABBREV[n]}:{'on' if gil[n] else 'off'}" for n in loops if n in gil) or "-"


def _cell(row, name, key, fmt):
    return "ERROR" if name in row["errors"] else fmt(row[key].get(name))


def tables(doc, loops):
    """[(title, header, body)] of the report."""
    out = []
    echo = doc["results"]
    if echo:
        header = (["loops", "GIL"] + [f"{n} rps" for n in loops]
                  + [f"{n} us/req" for n in loops] + ["tl/aio", "GIL state"])
        body = []
        for r in echo:
            body.append([str(r["loops_n"]), r["gil_mode"]]
                        + [_cell(r, n, "rps", _fmt_rps) for n in loops]
                        + [_cell(r, n, "cpu_us_per_req", _fmt_us) for n in loops]
                        + [harness.fmt_ratio(harness.ratio(r["cpu_us_per_req"].get("tideloop"),
                                                           r["cpu_us_per_req"].get("asyncio"))),
                           _gil_state(r["gil"], loops)])
        out.append((f"echo: {harness.fmt_size(doc['size'])} messages, "
                    f"{doc['conns_per_loop']} connections per loop", header, body))
    if doc["scaling"]:
        header = ["loops", "GIL"] + list(loops) + ["target (tideloop)", "result"]
        body = [[str(s["loops_n"]), s["gil_mode"]]
                + [harness.fmt_ratio(s["ratio"].get(n)) for n in loops]
                + [f"<= {s['target']:.2f}x" if s["target"] else "-", s["verdict"] or "n/a"]
                for s in doc["scaling"]]
        out.append(("server CPU per request, N loops / 1 loop", header, body))
    inproc = doc.get("inproc") or []
    if inproc:
        header = (["loops", "GIL"] + [f"{n} rt/s" for n in loops]
                  + [f"{n} us/rt" for n in loops] + ["tl/aio", "GIL state"])
        body = [[str(r["loops_n"]), r["gil_mode"]]
                + [_cell(r, n, "rps", _fmt_rps) for n in loops]
                + [_cell(r, n, "cpu_us_per_req", _fmt_us) for n in loops]
                + [harness.fmt_ratio(harness.ratio(r["cpu_us_per_req"].get("tideloop"),
                                                   r["cpu_us_per_req"].get("asyncio"))),
                   _gil_state(r["gil"], loops)] for r in inproc]
        out.append((f"inproc: each loop echoing {harness.fmt_size(doc['size'])} to itself "
                    f"(socket pair, 1 in flight), no load generator", header, body))
    if doc.get("inproc_scaling"):
        header = ["loops", "GIL"] + list(loops) + ["target (tideloop)", "result"]
        body = [[str(s["loops_n"]), s["gil_mode"]]
                + [harness.fmt_ratio(s["ratio"].get(n)) for n in loops]
                + [f"<= {s['target']:.2f}x" if s["target"] else "-", s["verdict"] or "n/a"]
                for s in doc["inproc_scaling"]]
        out.append(("inproc: CPU per round trip, N loops / 1 loop", header, body))
    ratios = [(part, doc.get(key)) for part, key in (("echo", "gil_ratio"),
                                                      ("inproc", "inproc_gil_ratio"))]
    if any(g for _, g in ratios):
        header = ["part"] + list(loops) + ["target (tideloop)", "result"]
        body = [[part] + [harness.fmt_ratio(g["ratio"].get(n)) for n in loops]
                + [f"<= {g['target']:.2f}x", g["verdict"] or "n/a"] for part, g in ratios if g]
        out.append(("1 loop, CPU per request, GIL off / GIL on", header, body))
    if doc["mixed"]:
        header = ["GIL", "loop", "GIL state", "1 job s", "2 jobs idle /1", "2 jobs load /1",
                  "echo rps", "echo rps in jobs", "other load", "result"]
        body = []
        for r in doc["mixed"]:
            for n in loops:
                if n in r["errors"]:
                    body.append([r["gil_mode"], n, "-", "ERROR", "", "", "", "", "",
                                 r["verdict"] if n == "tideloop" else ""])
                    continue
                gil = r["gil"].get(n)
                body.append([r["gil_mode"], n, "-" if gil is None else "on" if gil else "off",
                             _fmt_s(r["t1_s"].get(n)),
                             harness.fmt_ratio(r["ratio_idle"].get(n)),
                             harness.fmt_ratio(r["ratio_load"].get(n)),
                             _fmt_rps(r["echo_rps_alone"].get(n)),
                             _fmt_rps(r["echo_rps_with_jobs"].get(n)),
                             _fmt_load(r["other_cpu"].get(n)),
                             (r["verdict"] or "n/a") if n == "tideloop" else ""])
        out.append((f"mixed: one loop serving echo ({doc['mixed_conns']} connections) + "
                    f"2 asyncio.to_thread CPU jobs of ~{doc['job_seconds']:g} s "
                    f"(target: tideloop 2 jobs idle <= {TARGET_MIXED:.2f}x one)",
                    header, body))
    return out


def format_report(doc, loops, markdown):
    parts = []
    for title, header, body in tables(doc, loops):
        if markdown:
            parts.append(f"**{title}**\n\n" + harness.markdown_table(header, body, left={1}))
        else:
            parts.append(title + "\n" + harness.text_table(header, body, left={1}))
    return "\n\n".join(parts)


def reproduce_command(args, cfg):
    parts = harness.command_prefix(["-m", "bench.threads"], cfg.loops,
                                   args.quick, cfg.repeat)
    parts += ["--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}",
              "--n", ",".join(map(str, cfg.ns)), "--only", ",".join(cfg.parts)]
    if args.gil != "default":
        parts += ["--gil", args.gil]
    if cfg.size != SIZE:
        parts += ["--size", str(cfg.size)]
    if cfg.conns_per_loop != CONNS_PER_LOOP:
        parts += ["--conns-per-loop", str(cfg.conns_per_loop)]
    if "mixed" in cfg.parts:
        parts += ["--job-seconds", f"{cfg.job_seconds:g}"]
    return " ".join(parts + procs.command_flags(cfg))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.threads",
        description="Loops in threads: N event loops in N threads of one process "
                    "serving TCP echo (SO_REUSEPORT, a C load generator in another "
                    "process), and one loop serving echo beside asyncio.to_thread CPU "
                    "jobs; asyncio, uvloop and tideloop, GIL on or off on free-threaded "
                    "builds; requests/s, server CPU per request, the jobs' wall time.")
    harness.add_loops_option(p)
    p.add_argument("--only", default=",".join(PARTS), metavar="LIST",
                   help="parts, from: %(default)s (default: all)")
    p.add_argument("--n", default=",".join(map(str, NS)), metavar="LIST",
                   help="loop counts of the echo part (default: %(default)s)")
    p.add_argument("--gil", choices=GIL_MODES, default="default",
                   help="free-threaded builds: PYTHON_GIL of the servers: default (as "
                        "set), on, off, both (default: %(default)s)")
    p.add_argument("--size", type=int, default=SIZE, help="message size (default: %(default)s)")
    p.add_argument("--conns-per-loop", type=int, default=CONNS_PER_LOOP,
                   help="echo: connections per loop (default: %(default)s)")
    p.add_argument("--mixed-conns", type=int, default=MIXED_CONNS,
                   help="mixed: echo connections (default: %(default)s)")
    p.add_argument("--job-seconds", type=float, default=None,
                   help="mixed: one CPU job's wall time alone (default: 1, 0.3 with --quick)")
    procs.add_run_options(
        p, "row",
        duration_help="measured seconds per run; mixed: the echo-alone window "
                      "(default: 3, or 1 with --quick)",
        warmup_help="loadgen's unmeasured warm-up (default: 0.5, or 0.25 with --quick)",
        quick_help="smoke: 1 s runs, 0.3 s jobs",
        quiet_wait_help="(other processes below 15 %% of a CPU); for shared machines ")
    harness.add_output_options(p)
    plot.add_plot_option(p)
    p.add_argument("--rebuild", action="store_true",
                   help="recompile bench/loadgen.c even when up to date")
    p.add_argument("--verbose", "-v", action="store_true", help="also print every sample")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.time()
    log = harness.log_stderr
    args.floor = True              # no C floor here; procs' flags then add no --no-floor
    only = args.only
    args.only = None
    cfg = procs.driver_config(args, PARTS, "part", durations=(1.0, 3.0),
                              warmups=(0.25, 0.5), src=SRC)
    if cfg is None:
        return 2
    cfg.parts = harness.pick(only, PARTS, "part")
    if cfg.parts is None:
        return 2
    bad_plot = plot.check_plot_option(args.plot)
    if bad_plot is not None:
        return bad_plot
    if args.plot and "echo" not in cfg.parts:
        return harness.usage_error("--plot draws the echo part: add it to --only")
    cfg.ns = harness.int_list(args.n, "n", "threads.py")
    if args.gil != "default" and not FREE_THREADED:
        return harness.usage_error(f"--gil {args.gil}: this interpreter has a GIL "
                                   f"(not a free-threaded build)")
    cfg.gil_modes = ["on", "off"] if args.gil == "both" else [args.gil]
    cfg.size = args.size
    cfg.conns_per_loop = args.conns_per_loop
    cfg.mixed_conns = args.mixed_conns
    cfg.job_seconds = args.job_seconds if args.job_seconds is not None else (
        0.3 if args.quick else 1.0)
    if min(cfg.size, cfg.conns_per_loop, cfg.mixed_conns) <= 0 or cfg.job_seconds <= 0:
        return harness.usage_error("--size, --conns-per-loop, --mixed-conns and "
                                   "--job-seconds must be positive")
    cfg.startup_errors = {}

    paths = procs.build_c(HERE, ["loadgen"], "threads.py", force=args.rebuild, log=log)
    versions = procs.loop_versions(cfg.python, cfg.env, ROOT)
    core = procs.CoreWatch(versions, cfg.loops)
    cpus = harness.usable_cpus()
    build = "free-threaded" if FREE_THREADED else "with a GIL"
    log(f"tideloop loops-in-threads benchmark: CPython {platform.python_version()} "
        f"({build}), {platform.system()} {platform.machine()}, {cpus} CPU(s) shared by "
        f"servers, loadgen and jobs (nothing pinned); N = {','.join(map(str, cfg.ns))}; "
        f"GIL: {args.gil}; median of {cfg.repeat} interleaved runs of {cfg.duration:g} s "
        f"(+{cfg.warmup:g} s warm-up)\n")
    if not procs.log_loop_versions(log, cfg.loops, versions, "servers'"):
        return 2
    for name in cfg.loops:
        if str(versions.get(name, "")).startswith("not importable"):
            cfg.startup_errors[name] = versions[name]

    workdir = tempfile.mkdtemp(prefix="tideloop-threads-")
    try:
        echo = echo_rows(cfg, paths, workdir, log) if "echo" in cfg.parts else []
        inproc = (echo_rows(cfg, paths, workdir, log, kind="inproc")
                  if "inproc" in cfg.parts else [])
        mixed = mixed_rows(cfg, paths, workdir, log) if "mixed" in cfg.parts else []
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.time() - started
    core.finish()
    command = reproduce_command(args, cfg)

    doc = harness.json_head("tideloop-threadbench/1", command, started, elapsed)
    doc.update({
        "figure": "cpu_us_per_req",
        "repeat": cfg.repeat, "duration_s": cfg.duration, "warmup_s": cfg.warmup,
        "quick": args.quick, "quiet_wait_s": cfg.quiet_wait,
        "free_threaded": FREE_THREADED, "gil_option": args.gil,
        "ns": cfg.ns, "size": cfg.size, "conns_per_loop": cfg.conns_per_loop,
        "mixed_conns": cfg.mixed_conns, "job_seconds": cfg.job_seconds,
        "targets": {"scaling_2_vs_1": TARGET_SCALING, "gil_off_vs_on": TARGET_GIL,
                    "mixed_two_jobs_vs_one": TARGET_MIXED},
        "environment": procs.environment(cpus, ROOT, versions, core),
        "results": echo,
        "scaling": scaling(echo, cfg.loops),
        "gil_ratio": gil_ratio(echo, cfg.loops),
        "inproc": inproc,
        "inproc_scaling": scaling(inproc, cfg.loops),
        "inproc_gil_ratio": gil_ratio(inproc, cfg.loops),
        "mixed": mixed,
    })

    print()
    print(format_report(doc, cfg.loops, args.markdown))
    print()
    reported = set()
    for r in echo + inproc + mixed:
        for name, err in r["errors"].items():
            if (name, err) not in reported:
                reported.add((name, err))
                where = (f"{r['kind']} {r['label']}" if "label" in r
                         else f"mixed, GIL {r['gil_mode']}")
                print(f"error: {name} ({where}): {err}")
    if args.verbose:
        for r in echo:
            for name, xs in r["samples"].items():
                print(f"samples echo {r['label']:<16} {name:<9} rps "
                      + " ".join(_fmt_rps(x["rps"]) for x in xs) + "  us/req "
                      + " ".join(_fmt_us(x["cpu_us_per_req"]) for x in xs)
                      + "  connections per loop " + " ".join(
                          "/".join(map(str, x["loop_conns"] or ["?"])) for x in xs))
        for r in mixed:
            for name, xs in r["samples"].items():
                print(f"samples mixed GIL {r['gil_mode']:<8} {name:<9} "
                      + " ".join(f"t1={x['t1_s']:.2f} idle={x['ratio_idle']:.2f}x "
                                 f"load={x['ratio_load']:.2f}x" for x in xs))
    if echo:
        print(f"rps = requests/s seen by loadgen; us/req = server CPU (utime+stime of the "
              f"server process, /proc/<pid>/stat) per request; N loops in N threads, each "
              f"its own SO_REUSEPORT socket on one port; one loadgen process; median of "
              f"{cfg.repeat} interleaved runs; tl/aio is the ratio of us/req.")
    if mixed:
        print("mixed: t1 = one job alone, loop idle; '2 jobs idle /1' = two at once, loop "
              "idle; '2 jobs load /1' = two at once while the loop serves echo; echo rps = "
              "alone (loadgen's) and while the two jobs run (the loop's byte count); other "
              "load = CPUs the rest of the machine used while t1 and '2 jobs idle' ran "
              "(100 % = one CPU not free for the jobs: the idle ratio then says nothing "
              "about parallelism).")
    print(f"servers, loadgen and jobs share {cpus} CPU(s), nothing pinned; TCP loopback.")
    samples = [x for r in echo + inproc + mixed for xs in r["samples"].values() for x in xs]
    echo_samples = [x for r in echo for xs in r["samples"].values() for x in xs]
    for line in (procs.load_line(samples, "the measured windows",
                                 steal_samples=echo_samples) if samples else None,
                 core.warning()):
        if line:
            print(line)
    harness.print_reproduce(command, elapsed)
    if args.json:
        harness.write_json(args.json, doc)
    if args.plot and plot.draw_run(doc, args.plot):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
