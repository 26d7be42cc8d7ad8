#!/usr/bin/env python3
"""Isolated interpreters (PEP 684, a GIL each): one app served by tideloop in
N isolated interpreters of one process, against tideloop in N threads of one
interpreter, tideloop in N worker processes and asyncio's own loop in N
isolated interpreters; CPU per request, memory, and the in-process parallel
speed-up.  CPython 3.13+ (the interpreter running this).

    python -m bench.interpreters                       # N = 1, 2; ~4 min on 2 CPUs
    python -m bench.interpreters --quick               # smoke, < 1 min
    python -m bench.interpreters --quiet-wait 5 --json results/interpreters-3.14.json

The ways (columns; the app is bench/interpreters_worker.py's: per request of
--size bytes, about 10-15 us of Python -- a header parsed into a dict, a
checksum loop, the dict as JSON -- then the request echoed back):

    tl-interp    tideloop.interpreters.run(main, interpreters=N): N isolated
                 interpreters in one process, a thread and a tideloop loop each
    tl-threads   tideloop.threads.run(main, threads=N): N threads of the main
                 interpreter (one GIL), a tideloop loop each
    tl-procs     N worker processes, one tideloop loop each on the main thread
                 of the main interpreter
    aio-interp   tideloop.interpreters.run(main, interpreters=N,
                 loop_factory="asyncio:new_event_loop"): asyncio's own loop

echo    Each loop serves the app on its own SO_REUSEPORT socket of one port
        (tideloop.interpreters.reuse_port_socket); bench/bin/loadgen (C, one
        process, closed loop, every echoed byte checked) keeps --conns-per-loop
        x N connections busy: warm-up, then D seconds measured.  Figures:
        requests/s (loadgen's) and the server's CPU per request: utime+stime
        of the whole server process (every interpreter and thread), or of the
        N processes summed, from /proc/<pid>/stat at the start and end of the
        window.  Stopped with SIGTERM, which must stop every loop cleanly (the
        servers print the connections each loop accepted, in the JSON).
memory  Read from the echo runs at the end of the measured window (the
        connections still open): the server's RSS with N = 1 and N = 2, the
        difference being what one more interpreter (or thread) costs; for
        processes, the second process's PSS (its private pages plus its share
        of the pages it shares with the other processes -- the interpreter's
        text above all), with its RSS and USS (private pages only) beside.
        Target: an extra interpreter's RSS <= 0.50 x an extra process's PSS.
inproc  Each loop runs a client and the app's server over a Unix socket pair
        of its own (1 request in flight, no load generator, nothing shared);
        after a warm-up every loop waits at a barrier, then the loops run a
        FIXED total of --trips round trips split evenly between them.
        Figures: CPU per round trip (each loop's own time.thread_time()), and
        the wall time of the fixed total from the release to the last loop's
        end.  A run during which the rest of the machine kept more than 30 %
        of a CPU busy is made again (--retries times at most; the discarded
        runs stay in the JSON).  Targets (tl-interp): CPU per round trip with
        2 interpreters <= 1.05 x with 1 (no contention between them); the fixed
        total's wall time split over 2 interpreters <= 0.60 x done by 1 (they
        run in parallel: 0.50 is perfect), n/a when the rest of the machine
        kept more than 30 % of a CPU busy during the N = 2 runs (median) or
        there are fewer than 2 CPUs; and 1 subinterpreter's CPU per round
        trip <= 1.05 x the main interpreter's (tl-interp N=1 / tl-procs N=1).

Every (way, N) cell is a fresh server process (or N); the cells run in an
order rotated by the repetition (all ways and both N in one rotation, so that
a ratio between N = 2 and N = 1 compares runs made side by side), and each
figure is the median of the repetitions.  Nothing is pinned: on a 2-CPU
machine two loops and the load generator compete for the CPUs, so CPU per
request, not requests/s, is the figure; wall-clock figures of in-process
ping-pong move with the machine's other load (recorded per run: other_cpu,
the machine's busy CPU less the measured processes' own), which is why only
the fixed-work split is judged on wall time, with --quiet-wait and a verdict
of n/a when the machine was busy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench import plot, procs
from bench.threads import _fmt_rps, _fmt_us     # the same table cells
from tideloop._bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
WORKER_PY = ["-m", "bench.interpreters_worker"]   # run from the checkout's root (cwd=ROOT)

PARTS = ("echo", "inproc")
NS = (1, 2)
SIZE = 1024
WORK = 128
CONNS_PER_LOOP = 50

# name: (--way of the worker, --loop, what it is)
VARIANTS = {
    "tl-interp": ("interpreters", "tideloop", "tideloop, N isolated interpreters"),
    "tl-threads": ("threads", "tideloop", "tideloop, N threads (one GIL)"),
    "tl-procs": ("processes", "tideloop", "tideloop, N processes"),
    "aio-interp": ("interpreters", "asyncio", "asyncio's loop, N isolated interpreters"),
}
# The plot's reference (drawn as 1) and the order of its bars.
SERIES = ("aio-interp", "tl-interp", "tl-threads", "tl-procs")

TARGET_MEMORY = 0.50          # extra interpreter's RSS / extra process's PSS
TARGET_CPU_SCALING = 1.05     # inproc CPU per round trip, 2 interpreters / 1
TARGET_WALL_SPLIT = 0.60      # inproc fixed total's wall time, 2 interpreters / 1
TARGET_SUB_VS_MAIN = 1.05     # inproc CPU per round trip, 1 subinterpreter / main
BUSY_CPU = 0.3                # other load (CPUs) above which 2 CPUs are not free
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
RUN_TIMEOUT = 180.0


# --------------------------------------------------------------------------
# Processes: CPU, memory, the port
# --------------------------------------------------------------------------

class Snapshot:
    """The CPU of some processes (utime+stime from /proc/<pid>/stat, every
    thread) and of the machine at one instant."""

    def __init__(self, pids):
        self.cpu = 0.0
        for pid in pids:
            user, system, _, _ = procs.proc_times(pid)
            self.cpu += user + system
        self.busy, self.steal = procs.machine_cpu()
        self.t = time.monotonic()


def memory(pid):
    """{"rss_kib", "pss_kib", "uss_kib"} of a process: VmRSS, and Pss and
    Private_Clean + Private_Dirty from /proc/<pid>/smaps_rollup."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    fields[parts[0][:-1]] = int(parts[1])
    except OSError:
        pass
    out["pss_kib"] = fields.get("Pss")
    if "Private_Clean" in fields:
        out["uss_kib"] = fields["Private_Clean"] + fields.get("Private_Dirty", 0)
    else:
        out["uss_kib"] = None
    return out


def hold_port():
    """A socket in the SO_REUSEPORT group of a free port of 127.0.0.1, bound
    but not listening (the kernel sends it no connection): it keeps the port
    until every server listens."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    return s


def _import_failed(errlog):
    reason = procs.stderr_reason(errlog, "interpreters_worker", "")
    return "ModuleNotFoundError" in reason or "ImportError" in reason


def stop_servers(servers, deadline):
    """SIGTERM each server; (the connections each loop accepted, the seconds
    the stop took); RunError when one did not stop cleanly."""
    t0 = time.monotonic()
    for proc, _ in servers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    conns = []
    for proc, errlog in servers:
        line = None
        while True:
            line = procs.read_line(proc, deadline)
            if line is None or line.startswith("DONE"):
                break
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise harness.RunError(f"a server did not exit within {STOP_TIMEOUT:g} s of "
                                   f"SIGTERM (killed)")
        if line is None or proc.returncode != 0:
            raise harness.RunError("a server did not stop cleanly on SIGTERM: " +
                                   procs.stderr_reason(errlog, "interpreters_worker",
                                                       f"exit status {proc.returncode}"))
        conns += [int(x) for x in line.split("=", 1)[1].split(",") if x]
    return conns, time.monotonic() - t0


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------

def run_echo(variant, n, cfg, paths, workdir):
    """One run of the app's server(s) under loadgen; a sample dict or
    harness.RunError."""
    way, loop, _ = VARIANTS[variant]
    holder = hold_port()
    port = holder.getsockname()[1]
    base = [cfg.python, *WORKER_PY, "serve", "--loop", loop, "--port", str(port),
            "--size", str(cfg.size), "--work", str(cfg.work)]
    if way == "processes":
        cmds = [base + ["--way", "main", "--n", "1"] for _ in range(n)]
    else:
        cmds = [base + ["--way", way, "--n", str(n)]]
    servers, gen = [], None
    try:
        for i, cmd in enumerate(cmds):
            errlog = os.path.join(workdir, f"server-{i}.err")
            with open(errlog, "wb") as err:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=err, env=cfg.env, cwd=ROOT)
            servers.append((proc, errlog))
        deadline = time.monotonic() + READY_TIMEOUT
        for proc, errlog in servers:
            line = procs.read_line(proc, deadline)
            if line is None or not line.startswith("READY"):
                why = (f"no READY within {READY_TIMEOUT:g}s" if proc.poll() is None
                       else f"exit status {proc.returncode} before READY")
                raise harness.RunError(procs.stderr_reason(errlog, "interpreters_worker", why),
                                       startup=proc.poll() is not None
                                       and _import_failed(errlog))
        holder.close()
        pids = [p.pid for p, _ in servers]
        mem_ready = [memory(pid) for pid in pids]
        gen = subprocess.Popen(
            [paths["loadgen"], "127.0.0.1", str(port), "--conns", str(cfg.conns_per_loop * n),
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
                start = Snapshot(pids)
            elif line.startswith("{"):
                end = Snapshot(pids)
                result = json.loads(line)
                break
        alive = all(p.poll() is None for p, _ in servers)
        mem_loaded = [memory(pid) for pid in pids] if alive else None
        gen_err = procs.finish_generator(gen)
        if not alive:
            bad = next((p, e) for p, e in servers if p.poll() is not None)
            raise harness.RunError(f"a server exited during the run (status "
                                   f"{bad[0].returncode}): " + procs.stderr_reason(
                                       bad[1], "interpreters_worker", "no message"))
        if result is None or start is None:
            raise harness.RunError("loadgen failed: " + (gen_err.splitlines()[-1] if gen_err
                                                         else f"status {gen.returncode}"))
        conns, stop_s = stop_servers(servers, time.monotonic() + STOP_TIMEOUT)
    finally:
        holder.close()
        if gen is not None and gen.poll() is None:
            gen.kill()
            gen.wait()
        for proc, _ in servers:
            procs.stop(proc)
    if result["errors"] or result["warmup_errors"]:
        raise harness.RunError(f"{result['errors'] + result['warmup_errors']} echo errors "
                               f"({result['conns_alive']}/{result['conns']} connections left)")
    if not result["requests"]:
        raise harness.RunError("no request completed")
    cpu = end.cpu - start.cpu
    seconds = end.t - start.t
    sample = {
        "rps": result["rps"], "cpu_us_per_req": cpu / result["requests"] * 1e6,
        "requests": result["requests"], "seconds": result["seconds"],
        "server_cpu_s": round(cpu, 4),
        "server_cpu_util": round(cpu / seconds, 3) if seconds > 0 else None,
        "latency_us": result["latency_us"], "client_cpu_s": result["client_cpu_s"],
        "loop_conns": conns, "stop_s": round(stop_s, 3),
        "memory": {"ready": mem_ready, "loaded": mem_loaded},
    }
    sample.update(procs.other_load(start, end, cpu + result["client_cpu_s"]))
    return sample


def run_inproc(variant, n, cfg, workdir):
    way, loop, _ = VARIANTS[variant]
    errlog = os.path.join(workdir, "inproc.err")
    cmd = [cfg.python, *WORKER_PY, "inproc", "--way", way, "--loop", loop, "--n", str(n),
           "--trips", str(cfg.trips), "--warmup-trips", str(cfg.warmup_trips),
           "--size", str(cfg.size), "--work", str(cfg.work)]
    result, _, _, _ = procs.run_to_result(
        cmd, env=cfg.env, cwd=ROOT, errlog=errlog, prog="interpreters_worker",
        timeout=RUN_TIMEOUT, startup_failed=_import_failed)
    cpu = result.get("process_cpu_s")
    result["sys_share"] = round(result["process_sys_s"] / cpu, 3) if cpu else None
    return result


# --------------------------------------------------------------------------
# The rows
# --------------------------------------------------------------------------

def cell(variant, n):
    return f"{variant}/{n}"


def measure_cells(kind, cfg, log, fn, repeat):
    """Every (variant, N) cell ``repeat`` times, in one rotation: the rows
    of part ``kind``, one per N."""
    names = [cell(v, n) for n in cfg.ns for v in cfg.variants]

    def measure(name):
        variant, n = name.rsplit("/", 1)
        discarded = []
        while True:
            waited = procs.wait_quiet(cfg.quiet_wait) if cfg.quiet_wait else 0.0
            try:
                sample = fn(variant, int(n))
            except harness.RunError as exc:
                if exc.startup:
                    cfg.startup_errors[variant] = str(exc)
                raise
            sample["quiet_waited_s"] = round(waited, 2)
            # inproc: a run the rest of the machine disturbed is made again
            if (kind != "inproc" or sample.get("other_cpu", 0.0) <= BUSY_CPU
                    or len(discarded) >= cfg.retries):
                break
            discarded.append(sample)
            log("r")
        sample["discarded"] = discarded
        return sample

    log(f"  {kind:<8} {len(names)} cells x {repeat} ")
    errors = {cell(v, n): cfg.startup_errors[v] for v in cfg.variants for n in cfg.ns
              if v in cfg.startup_errors}
    samples, errors = harness.interleave(names, repeat, measure, log=log, errors=errors)
    rows = []
    for n in cfg.ns:
        by = {v: samples.get(cell(v, n), []) for v in cfg.variants}
        errs = {v: errors[cell(v, n)] for v in cfg.variants if cell(v, n) in errors}
        row = {"kind": kind, "label": f"N={n}", "loops_n": n,
               "rps": harness.medians(by, errs, "rps"),
               "cpu_us_per_req": harness.medians(by, errs, "cpu_us_per_req"),
               "other_cpu": harness.medians(by, errs, "other_cpu"),
               "samples": {v: xs for v, xs in by.items() if xs},
               "errors": errs}
        if kind == "inproc":
            for key in ("wall_s", "sys_share", "faults_per_req"):
                row[key] = harness.medians(by, errs, key)
        else:
            row["memory"] = {v: memory_medians(xs) for v, xs in by.items()
                             if xs and v not in errs}
        rows.append(row)
    log(" " + " ".join(f"{v}/{r['loops_n']}=" + ("ERROR" if v in r["errors"] else
                                                  _fmt_us(r["cpu_us_per_req"].get(v)))
                       for r in rows for v in cfg.variants) + "\n")
    return rows


def memory_medians(samples):
    """Medians over an echo cell's samples, at the end of the window: the
    server's memory summed over its processes, and each process's."""
    out = {}
    loaded = [s["memory"]["loaded"] for s in samples if s["memory"]["loaded"]]
    if not loaded:
        return out
    for key in ("rss_kib", "pss_kib", "uss_kib"):
        vals = [sum(p[key] for p in ps) for ps in loaded if all(p[key] is not None for p in ps)]
        out[key] = harness.median(vals)
        per = [harness.median([ps[i][key] for ps in loaded if ps[i][key] is not None])
               for i in range(len(loaded[0]))]
        out[key.replace("_kib", "_per_process_kib")] = per
    return out


def _get(rows, n):
    return next((r for r in rows if r["loops_n"] == n), None)


def memory_summary(echo):
    """What one more loop costs: the server's RSS (and PSS, USS) with N = 2
    less N = 1 for the one-process ways; the second process's PSS (and RSS,
    USS) for processes; the ratio and the verdict."""
    one, two = _get(echo, 1), _get(echo, 2)
    if not one or not two:
        return None
    extra = {}
    for v in VARIANTS:
        m1, m2 = one["memory"].get(v), two["memory"].get(v)
        if not m1 or not m2:
            continue
        if VARIANTS[v][0] == "processes":
            extra[v] = {key: (m2.get(key.replace("_kib", "_per_process_kib")) or [None, None])[1]
                        for key in ("rss_kib", "pss_kib", "uss_kib")}
            extra[v]["pss_total_delta_kib"] = _diff(m2.get("pss_kib"), m1.get("pss_kib"))
        else:
            extra[v] = {key: _diff(m2.get(key), m1.get(key))
                        for key in ("rss_kib", "pss_kib", "uss_kib")}
    proc = extra.get("tl-procs", {})
    ratio = {v: harness.ratio(extra[v]["rss_kib"], proc.get("pss_kib"))
             for v in extra if v != "tl-procs"}
    ratio_uss = {v: harness.ratio(extra[v]["uss_kib"], proc.get("uss_kib"))
                 for v in extra if v != "tl-procs"}
    tl = ratio.get("tl-interp")
    if "tl-interp" in one["errors"] or "tl-interp" in two["errors"] \
            or "tl-procs" in one["errors"] or "tl-procs" in two["errors"]:
        verdict = "ERROR"
    elif tl is None:
        verdict = None
    else:
        verdict = "PASS" if tl <= TARGET_MEMORY else "FAIL"
    return {"when": "end of the echo window, connections open",
            "interpreter_figure": "RSS of the server, N=2 less N=1",
            "process_figure": "PSS of the second process (N=2)",
            "n1": {v: one["memory"].get(v) for v in VARIANTS if one["memory"].get(v)},
            "n2": {v: two["memory"].get(v) for v in VARIANTS if two["memory"].get(v)},
            "extra_kib": extra, "ratio": ratio, "ratio_uss": ratio_uss,
            "target": TARGET_MEMORY, "verdict": verdict}


def _diff(a, b):
    return None if a is None or b is None else a - b


def _ratios(rows, key, n_num, n_den):
    a, b = _get(rows, n_num), _get(rows, n_den)
    if not a or not b:
        return {}
    return {v: harness.ratio(a[key].get(v), b[key].get(v)) for v in VARIANTS
            if a[key].get(v) and b[key].get(v)}


def _errored(rows, variant):
    return any(variant in r["errors"] for r in rows)


def verdicts(echo, inproc, memory_doc, cpus, skipped=None):
    """The targets: [{name, what, ratio {variant: x}, target, verdict}];
    with tl-interp ``skipped`` (no isolated interpreters), every judged
    verdict is "n/a"."""
    out = []
    if memory_doc:
        out.append({"name": "memory", "what": "memory per extra interpreter (RSS) / per "
                    "extra process (PSS)", "ratio": memory_doc["ratio"],
                    "target": TARGET_MEMORY, "verdict": memory_doc["verdict"]})

    def judged(ratio, limit, extra_na=None):
        tl = ratio.get("tl-interp")
        if _errored(inproc, "tl-interp"):
            return "ERROR"
        if tl is None:
            return None
        if extra_na:
            return extra_na
        return "PASS" if tl <= limit else "FAIL"

    if _get(inproc, 1) and _get(inproc, 2):
        r = _ratios(inproc, "cpu_us_per_req", 2, 1)
        out.append({"name": "inproc_cpu_scaling",
                    "what": "in-process: CPU per round trip, N=2 / N=1",
                    "ratio": r, "target": TARGET_CPU_SCALING,
                    "verdict": judged(r, TARGET_CPU_SCALING)})
        r = _ratios(inproc, "wall_s", 2, 1)
        busy = _get(inproc, 2)["other_cpu"].get("tl-interp")
        na = ("n/a (fewer than 2 CPUs)" if cpus < 2 else
              f"n/a (machine busy: {busy:.0%} of a CPU)"
              if busy is not None and busy > BUSY_CPU else None)
        out.append({"name": "inproc_wall_split",
                    "what": "in-process: wall time of a fixed total, split over N=2 / "
                            "done by N=1", "ratio": r, "target": TARGET_WALL_SPLIT,
                    "other_cpu_n2": busy, "verdict": judged(r, TARGET_WALL_SPLIT, na)})
    one = _get(inproc, 1)
    if one:
        main = one["cpu_us_per_req"].get("tl-procs")
        r = {v: harness.ratio(one["cpu_us_per_req"].get(v), main)
             for v in ("tl-interp",) if one["cpu_us_per_req"].get(v) and main}
        out.append({"name": "sub_vs_main",
                    "what": "in-process: CPU per round trip, 1 subinterpreter / the main "
                            "interpreter (tl-procs N=1)",
                    "ratio": r, "target": TARGET_SUB_VS_MAIN,
                    "verdict": "ERROR" if _errored([one], "tl-procs") else
                    judged(r, TARGET_SUB_VS_MAIN)})
    if skipped and "tl-interp" in skipped:
        for t in out:
            t["verdict"] = "n/a (no isolated interpreters)"
    for rows, kind in ((echo, "echo"), (inproc, "inproc")):
        if _get(rows, 1) and _get(rows, 2):
            out.append({"name": f"{kind}_cpu_n2_vs_n1", "what": f"{kind}: CPU per request, "
                        "N=2 / N=1", "ratio": _ratios(rows, "cpu_us_per_req", 2, 1),
                        "target": None, "verdict": "info"})
    one = _get(echo, 1)
    if one and one["cpu_us_per_req"].get("tl-procs"):
        main = one["cpu_us_per_req"]["tl-procs"]
        out.append({"name": "echo_sub_vs_main",
                    "what": "echo: CPU per request, 1 subinterpreter / the main interpreter",
                    "ratio": {v: harness.ratio(one["cpu_us_per_req"].get(v), main)
                              for v in ("tl-interp",) if one["cpu_us_per_req"].get(v)},
                    "target": None, "verdict": "info"})
    return out


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def _fmt_mib(kib):
    return "-" if kib is None else f"{round(kib / 1024, 1) + 0.0:.1f}"   # no "-0.0"


def _fmt_ratio(x):
    """A ratio; a figure of nothing (an extra thread's memory) as 0.00x."""
    return harness.fmt_ratio(None if x is None else max(0.0, x))


def _fmt_load(x):
    return "-" if x is None else f"{x:.0%}"


def tables(doc):
    """[(title, header, body)] of the report."""
    out = []
    variants = doc["variants"]
    echo = [r for r in doc["results"] if r["kind"] == "echo"]
    inproc = [r for r in doc["results"] if r["kind"] == "inproc"]
    if echo:
        header = ["way", "N", "req/s", "us/req", "N/1", "RSS MiB", "conns per loop",
                  "other load"]
        body = []
        for v in variants:
            for r in echo:
                base = _get(echo, 1)
                if v in r["errors"]:
                    body.append([v, str(r["loops_n"]), "ERROR"] + [""] * 5)
                    continue
                xs = r["samples"].get(v) or []
                conns = "/".join(str(c) for c in xs[len(xs) // 2]["loop_conns"]) if xs else "-"
                us = r["cpu_us_per_req"].get(v)
                body.append([v, str(r["loops_n"]), _fmt_rps(r["rps"].get(v)), _fmt_us(us),
                             harness.fmt_ratio(harness.ratio(
                                 us, base["cpu_us_per_req"].get(v))) if base else "-",
                             _fmt_mib(r["memory"].get(v, {}).get("rss_kib")), conns,
                             _fmt_load(r["other_cpu"].get(v))])
        out.append((f"echo: the app over TCP, {harness.fmt_size(doc['size'])} requests, "
                    f"{doc['conns_per_loop']} connections per loop, bench/bin/loadgen; "
                    f"server CPU per request", header, body))
    mem = doc.get("memory")
    if mem:
        header = ["way", "RSS N=1", "RSS N=2", "extra RSS", "extra PSS", "extra USS",
                  "/ process (PSS)", "/ process (USS)"]
        body = []
        for v in variants:
            e = mem["extra_kib"].get(v)
            if e is None:
                continue
            n1 = mem["n1"].get(v, {}).get("rss_kib")
            n2 = mem["n2"].get(v, {}).get("rss_kib")
            proc = v == "tl-procs"
            body.append([v + (" (2nd process)" if proc else ""), _fmt_mib(n1), _fmt_mib(n2),
                         _fmt_mib(e.get("rss_kib")), _fmt_mib(e.get("pss_kib")),
                         _fmt_mib(e.get("uss_kib")),
                         "-" if proc else _fmt_ratio(mem["ratio"].get(v)),
                         "-" if proc else _fmt_ratio(mem["ratio_uss"].get(v))])
        out.append(("memory (MiB), end of the echo window: what one more interpreter, "
                    "thread or process costs", header, body))
    if inproc:
        header = ["way", "N", "rt/s", "us/rt", "N/1", "wall s", "wall N/1", "sys", "faults/rt",
                  "other load"]
        body = []
        for v in variants:
            for r in inproc:
                base = _get(inproc, 1)
                if v in r["errors"]:
                    body.append([v, str(r["loops_n"]), "ERROR"] + [""] * 7)
                    continue
                us, wall = r["cpu_us_per_req"].get(v), r["wall_s"].get(v)
                faults = (r.get("faults_per_req") or {}).get(v)
                body.append([v, str(r["loops_n"]), _fmt_rps(r["rps"].get(v)), _fmt_us(us),
                             harness.fmt_ratio(harness.ratio(
                                 us, base["cpu_us_per_req"].get(v))) if base else "-",
                             "-" if wall is None else f"{wall:.3f}",
                             harness.fmt_ratio(harness.ratio(
                                 wall, base["wall_s"].get(v))) if base else "-",
                             _fmt_load((r.get("sys_share") or {}).get(v)),
                             "-" if faults is None else f"{faults:.2f}",
                             _fmt_load(r["other_cpu"].get(v))])
        out.append((f"inproc: each loop's own client and server over a socket pair, "
                    f"{harness.fmt_size(doc['size'])} round trips, {doc['trips']:,} in all "
                    f"split over the N loops; CPU per round trip (thread_time)",
                    header, body))
    if doc["targets"]:
        header = ["figure"] + list(variants) + ["target (tl-interp)", "result"]
        body = [[t["what"]] + [_fmt_ratio(t["ratio"].get(v)) for v in variants]
                + [f"<= {t['target']:.2f}x" if t["target"] else "-", t["verdict"] or "n/a"]
                for t in doc["targets"]]
        out.append(("ratios and targets", header, body))
    return out


def format_report(doc, markdown):
    parts = []
    for title, header, body in tables(doc):
        if markdown:
            parts.append(f"**{title}**\n\n" + harness.markdown_table(header, body))
        else:
            parts.append(title + "\n" + harness.text_table(header, body))
    return "\n\n".join(parts)


def reproduce_command(args, cfg):
    parts = []
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        parts.append(f"PYTHONPATH={pythonpath}")
    parts += [harness.python_cmd(), "-m", "bench.interpreters"]
    if cfg.requested != list(VARIANTS):
        parts += ["--variants", ",".join(cfg.requested)]
    if args.quick:
        parts.append("--quick")
    parts += ["--repeat", str(cfg.repeat), "--inproc-repeat", str(cfg.inproc_repeat),
              "--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}",
              "--trips", str(cfg.trips), "--n", ",".join(map(str, cfg.ns)),
              "--only", ",".join(cfg.parts)]
    if cfg.size != SIZE:
        parts += ["--size", str(cfg.size)]
    if cfg.work != WORK:
        parts += ["--work", str(cfg.work)]
    if cfg.conns_per_loop != CONNS_PER_LOOP:
        parts += ["--conns-per-loop", str(cfg.conns_per_loop)]
    if cfg.retries != (0 if args.quick else 2):
        parts += ["--retries", str(cfg.retries)]
    if cfg.quiet_wait:
        parts += ["--quiet-wait", f"{cfg.quiet_wait:g}"]
    return " ".join(parts)


def background(samples):
    """The machine's other load over the measured windows: CPUs busy outside
    the measured processes (1.0 = one whole CPU)."""
    others = sorted(x.get("other_cpu", 0.0) for x in samples)
    if not others:
        return None
    return {"median_cpu": round(statistics.median(others), 3), "max_cpu": others[-1],
            "runs": len(others), "runs_above_10pct": sum(1 for x in others if x > 0.10),
            "runs_above_30pct": sum(1 for x in others if x > BUSY_CPU),
            "runs_discarded": sum(len(x.get("discarded") or ()) for x in samples),
            "steal_median_cpu": round(statistics.median(
                x.get("steal_cpu", 0.0) for x in samples), 3)}


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.interpreters",
        description="Isolated interpreters: an app (a little Python per request) served "
                    "by tideloop in N interpreters, in N threads and in N processes, and "
                    "by asyncio's loop in N interpreters; server CPU per request under a "
                    "C load generator, memory per extra interpreter against per extra "
                    "process, and in-process CPU per round trip and the wall time of a "
                    "fixed total of work split over N interpreters. CPython 3.13+.")
    p.add_argument("--variants", default=",".join(VARIANTS), metavar="LIST",
                   help="ways to run the loops, from: %(default)s (default: all)")
    p.add_argument("--only", default=",".join(PARTS), metavar="LIST",
                   help="parts, from: %(default)s (default: all; memory comes with echo)")
    p.add_argument("--n", default=",".join(map(str, NS)), metavar="LIST",
                   help="loop counts (default: %(default)s; the targets compare 2 with 1)")
    p.add_argument("--repeat", "-r", type=int, default=None, metavar="R",
                   help="echo: interleaved runs per cell, the figure is the median "
                        "(default: 3, 1 with --quick)")
    p.add_argument("--inproc-repeat", type=int, default=None, metavar="R",
                   help="inproc: interleaved runs per cell (default: 5, 3 with --quick)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="echo: measured seconds per run (default: 2, 0.5 with --quick)")
    p.add_argument("--warmup", type=float, default=None, metavar="S",
                   help="echo: loadgen's unmeasured warm-up (default: 0.5, 0.25 with --quick)")
    p.add_argument("--trips", type=int, default=None,
                   help="inproc: round trips in all per run, split over the N loops "
                        "(default: 60000, 12000 with --quick)")
    p.add_argument("--warmup-trips", type=int, default=None,
                   help="inproc: unmeasured round trips of each loop first "
                        "(default: 3000, 1000 with --quick)")
    p.add_argument("--retries", type=int, default=None, metavar="K",
                   help="inproc: make a run again, up to K times, when the rest of the "
                        f"machine kept more than {BUSY_CPU * 100:.0f} %% of a CPU busy during it "
                        "(the discarded runs are in the JSON; default: 2, 0 with --quick)")
    p.add_argument("--size", type=int, default=SIZE, help="request size (default: %(default)s)")
    p.add_argument("--work", type=int, default=WORK,
                   help="bytes of each request the app's checksum loop reads: the Python "
                        "work per request (default: %(default)s, about 10-15 us in all)")
    p.add_argument("--conns-per-loop", type=int, default=CONNS_PER_LOOP,
                   help="echo: connections per loop (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="smoke (under a minute): one echo run per cell of 0.5 s, 3 short "
                        "in-process runs")
    p.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                   help="before each run, wait up to S seconds for the machine to be idle "
                        "(other processes below 15 %% of a CPU); for shared machines "
                        "(default: 0, do not wait)")
    harness.add_output_options(p)
    plot.add_plot_option(p)
    p.add_argument("--rebuild", action="store_true",
                   help="recompile bench/loadgen.c even when up to date")
    p.add_argument("--fail-on-miss", action="store_true",
                   help="exit with status 1 if a target is missed (FAIL) as well as on ERROR")
    p.add_argument("--verbose", "-v", action="store_true", help="also print every sample")
    return p


def interpreters_skipped(variants):
    """{variant: why} for the ways that need isolated interpreters where
    this interpreter has none fit for asyncio (before CPython 3.13)."""
    import tideloop.interpreters
    if tideloop.interpreters.available():
        return {}
    why = (f"n/a: needs CPython 3.13+ (isolated interpreters with a GIL each that "
           f"asyncio runs in); this is {platform.python_version()}")
    return {v: why for v in variants if VARIANTS[v][0] == "interpreters"}


def config(args):
    """The checked settings, or None after a usage error."""
    cfg = procs.Config()
    cfg.variants = harness.pick(args.variants, VARIANTS, "variant", given_order=True)
    cfg.parts = harness.pick(args.only, PARTS, "part")
    if cfg.variants is None or cfg.parts is None:
        return None
    cfg.requested = list(cfg.variants)
    cfg.ns = harness.int_list(args.n, "n", "interpreters.py")
    q = args.quick
    cfg.repeat = args.repeat if args.repeat is not None else (1 if q else 3)
    cfg.inproc_repeat = (args.inproc_repeat if args.inproc_repeat is not None
                         else (3 if q else 5))
    cfg.duration = args.duration if args.duration is not None else (0.5 if q else 2.0)
    cfg.warmup = args.warmup if args.warmup is not None else (0.25 if q else 0.5)
    cfg.trips = args.trips if args.trips is not None else (12000 if q else 60000)
    cfg.warmup_trips = (args.warmup_trips if args.warmup_trips is not None
                        else (1000 if q else 3000))
    cfg.retries = max(0, args.retries if args.retries is not None else (0 if q else 2))
    cfg.size, cfg.work, cfg.conns_per_loop = args.size, args.work, args.conns_per_loop
    if min(cfg.repeat, cfg.inproc_repeat, cfg.trips, cfg.size, cfg.conns_per_loop) < 1 \
            or cfg.duration <= 0 or cfg.warmup < 0 or cfg.work < 0 or cfg.warmup_trips < 1:
        harness.usage_error("--repeat, --inproc-repeat, --trips, --warmup-trips, --size, "
                            "--conns-per-loop and --duration must be positive, --warmup "
                            "and --work not negative")
        return None
    bad = [n for n in cfg.ns if cfg.trips % n]
    if bad:
        harness.usage_error(f"--trips {cfg.trips} must split evenly over N = "
                            f"{','.join(map(str, bad))}")
        return None
    cfg.quiet_wait = max(0.0, args.quiet_wait)
    cfg.python = sys.executable or "python3"
    cfg.env = procs.worker_env(SRC)
    cfg.startup_errors = {}
    return cfg


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.time()
    log = harness.log_stderr
    cfg = config(args)
    if cfg is None:
        return 2
    bad_plot = plot.check_plot_option(args.plot)
    if bad_plot is not None:
        return bad_plot
    stages = {}
    t = time.monotonic()

    def stage(name):
        nonlocal t
        now = time.monotonic()
        stages[name] = round(now - t, 1)
        t = now
        log(f"  stage {name}: {stages[name]:.1f} s\n")

    skipped = interpreters_skipped(cfg.variants)
    cfg.variants = [v for v in cfg.variants if v not in skipped]
    if not cfg.variants:
        return harness.usage_error("no way left to measure: " + "; ".join(
            f"{v}: {why}" for v, why in skipped.items()))
    paths = (procs.build_c(HERE, ["loadgen"], "interpreters.py", force=args.rebuild, log=log)
             if "echo" in cfg.parts else {})
    versions = procs.loop_versions(cfg.python, cfg.env, ROOT)
    versions.pop("uvloop", None)
    core = procs.CoreWatch(versions, ["tideloop"])
    cpus = harness.usable_cpus()
    load_start = loadavg()
    stage("setup")
    log(f"tideloop isolated-interpreters benchmark: CPython {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, {cpus} CPU(s) shared by servers and "
        f"loadgen (nothing pinned); N = {','.join(map(str, cfg.ns))}; ways: "
        f"{', '.join(cfg.variants)}; echo: median of {cfg.repeat} interleaved runs of "
        f"{cfg.duration:g} s (+{cfg.warmup:g} s warm-up); inproc: median of "
        f"{cfg.inproc_repeat} runs of {cfg.trips:,} round trips; load average "
        f"{load_start}\n")
    if not procs.log_loop_versions(log, ["asyncio", "tideloop"], versions, "servers'"):
        return 2
    for v, why in skipped.items():
        log(f"  {v:<10} not measured: {why}\n")

    workdir = tempfile.mkdtemp(prefix="tideloop-interpbench-")
    try:
        echo = inproc = []
        if "echo" in cfg.parts:
            echo = measure_cells("echo", cfg, log,
                                 lambda v, n: run_echo(v, n, cfg, paths, workdir), cfg.repeat)
            stage("echo")
        if "inproc" in cfg.parts:
            inproc = measure_cells("inproc", cfg, log,
                                   lambda v, n: run_inproc(v, n, cfg, workdir),
                                   cfg.inproc_repeat)
            stage("inproc")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.time() - started
    stages["total"] = round(elapsed, 1)
    core.finish()
    command = reproduce_command(args, cfg)
    mem = memory_summary(echo) if echo else None
    samples = [x for r in echo + inproc for xs in r["samples"].values() for x in xs]

    doc = harness.json_head("tideloop-interpbench/1", command, started, elapsed)
    env = procs.environment(cpus, ROOT, versions, core)
    env.update({"python_build": sys.version, "executable": cfg.python,
                "loadavg_start": load_start, "loadavg_end": loadavg(),
                "background_load": background(samples)})
    doc.update({
        "figure": "cpu_us_per_req",
        "series": [v for v in SERIES if v in cfg.variants],
        "variants": cfg.variants,
        "variant_names": {v: VARIANTS[v][2] for v in cfg.variants},
        "repeat": cfg.repeat, "inproc_repeat": cfg.inproc_repeat,
        "duration_s": cfg.duration, "warmup_s": cfg.warmup, "trips": cfg.trips,
        "warmup_trips": cfg.warmup_trips, "quick": args.quick, "quiet_wait_s": cfg.quiet_wait,
        "retries": cfg.retries, "busy_cpu": BUSY_CPU,
        "ns": cfg.ns, "size": cfg.size, "work": cfg.work, "conns_per_loop": cfg.conns_per_loop,
        "environment": env,
        "stages_s": stages,
        "results": echo + inproc,
        "memory": mem,
        "skipped": skipped,
        "targets": verdicts(echo, inproc, mem, cpus, skipped),
        "target_limits": {"memory_interp_vs_process": TARGET_MEMORY,
                          "inproc_cpu_2_vs_1": TARGET_CPU_SCALING,
                          "inproc_wall_split_2_vs_1": TARGET_WALL_SPLIT,
                          "inproc_sub_vs_main": TARGET_SUB_VS_MAIN},
    })

    print()
    print(format_report(doc, args.markdown))
    print()
    reported = set()
    for r in echo + inproc:
        for name, err in r["errors"].items():
            if (name, err) not in reported:
                reported.add((name, err))
                print(f"error: {name} ({r['kind']} {r['label']}): {err}")
    if args.verbose:
        for r in echo + inproc:
            for name, xs in r["samples"].items():
                print(f"samples {r['kind']:<6} {r['label']:<4} {name:<10} us/req "
                      + " ".join(_fmt_us(x["cpu_us_per_req"]) for x in xs)
                      + (("  wall " + " ".join(f"{x['wall_s']:.3f}" for x in xs))
                         if r["kind"] == "inproc" else "")
                      + "  other load " + " ".join(_fmt_load(x.get("other_cpu")) for x in xs))
    print("ways: " + "; ".join(f"{v} = {VARIANTS[v][2]}" for v in cfg.variants) + ".")
    for v, why in skipped.items():
        print(f"{v} not measured: {why}")
    if echo:
        print("req/s = loadgen's; us/req = server CPU (utime+stime of the server process, "
              "every interpreter and thread, or of the N processes summed; /proc/<pid>/stat) "
              "per request; N/1 = the figure over the same way's N=1; RSS = the server's "
              "(summed over processes) at the end of the window.")
    if mem:
        print("memory: extra = N=2 less N=1 of the server process; for tl-procs the second "
              "process's own RSS, PSS (proportional share of shared pages) and USS (private "
              "pages); '/ process' = the way's extra RSS over the extra process's PSS (the "
              "target's figure), extra USS over its USS.")
    if inproc:
        print("inproc: us/rt = the loops' own CPU (time.thread_time()) per round trip; wall "
              "= a fixed total of round trips, from the release of the barrier to the last "
              "loop's end (N=2: half each; 0.50x is perfectly parallel); sys = the kernel's "
              "share of the process's CPU, faults/rt = its minor page faults per round trip "
              "(a read buffer that the allocator maps and unmaps every time shows there).")
    print(f"other load = CPUs the rest of the machine kept busy during the run "
          f"({cpus} CPU(s), nothing pinned); stages: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()) + ".")
    for line in (procs.load_line(samples, "the measured windows") if samples else None,
                 core.warning()):
        if line:
            print(line)
    harness.print_reproduce(command, elapsed)
    if args.json:
        harness.write_json(args.json, doc)
    status = 0
    if args.plot and plot.draw_run(doc, args.plot):
        status = 1
    judged = [t for t in doc["targets"] if t["verdict"] not in ("info",)]
    if any(t["verdict"] == "ERROR" for t in judged) or (
            args.fail_on_miss and any(t["verdict"] == "FAIL" for t in judged)):
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
