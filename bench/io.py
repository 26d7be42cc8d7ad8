#!/usr/bin/env python3
"""I/O benchmark: UDP echo, subprocesses and pipes on asyncio,
uvloop and tideloop, measured side by side in one run.

    python -m bench.io                                   # everything, ~5 min
    python -m bench.io --quick                           # CI smoke, < 1 min
    python -m bench.io --only udp --sizes 64 --inflight 1,16 --repeat 5
    python -m bench.io --markdown --json io-results.json

Rows:
  udp         a DatagramProtocol echo server (bench/io_worker.py --kind udp)
              driven by bench/bin/udpgen (C) with N datagrams in flight,
              sizes 64 B and 1 KiB x 1, 16, 64 in flight; D seconds measured.
              Figures: datagrams echoed per second, and the server's CPU
              (utime+stime from /proc/<pid>/stat) per datagram echoed.
  spawn       1,000 x create_subprocess_exec("/bin/true") + wait(), 50 at a
              time; spawn_pipe: /bin/echo with stdout=PIPE + communicate().
              Figures: processes per second (wall) and the loop process's own
              CPU (RUSAGE_SELF, all its threads) per process; the children's
              CPU is in the JSON, not in the figure.
  pipe_read   1 GiB from `dd if=/dev/zero bs=1M` through a pipe into
              connect_read_pipe + a Protocol counting bytes.
  pipe_write  1 GiB in 64 KiB writes through connect_write_pipe (pausing at
              pause_writing) into `cat > /dev/null`.
              Figures: GiB/s (wall) and the loop process's CPU per GiB.  The
              floor column ("blk") is the same transfer with blocking
              os.readv/os.write and no loop: the kernel's copy.

Every run is a fresh process.  For each row, repetition r runs the loops in an
order rotated by r; each figure is the median of the R repetitions.

Targets, on CPU per unit: tideloop <= 0.8 x uvloop (where uvloop
has a figure) and <= 0.5 x asyncio.  Wall-clock ratios are shown beside them
(for information).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

from bench import plot, procs
from tideloop._bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
WORKER_PY = ["-m", "bench.io_worker"]   # run from the checkout's root (cwd=ROOT)
C_PROGRAMS = ("udpgen",)

FLOOR = "blocking"                    # the no-loop floor of the pipe rows
WORKLOADS = ("udp", "spawn", "spawn_pipe", "pipe_read", "pipe_write")
UDP_SIZES = (64, 1024)
UDP_INFLIGHT = (1, 16, 64)
QUICK_UDP_CELLS = ((64, 1), (1024, 64))
SPAWN_COUNT, QUICK_SPAWN_COUNT = 1000, 200
SPAWN_CONCURRENCY = 50
PIPE_BYTES, QUICK_PIPE_BYTES = 1 << 30, 256 << 20
PIPE_CHUNK = 65536
GIB = 1 << 30

TARGETS = {"uvloop": 0.8, "asyncio": 0.5}     # max tideloop / other, CPU per unit

RUN_TIMEOUT = 600.0


# --------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------

class Row:
    """One line of the table: a workload with its parameters."""

    def __init__(self, workload, **params):
        self.workload = workload
        self.params = params

    @property
    def unit(self):
        return {"udp": "dgram", "pipe_read": "GiB", "pipe_write": "GiB"}.get(
            self.workload, "proc")

    @property
    def has_floor(self):
        return self.workload.startswith("pipe_")

    def label(self):
        p = self.params
        if self.workload == "udp":
            return f"{harness.fmt_size(p['size'])} x{p['inflight']}"
        if self.workload.startswith("spawn"):
            return f"{p['count']} /{p['concurrency']}"
        return f"{_fmt_bytes(p['bytes'])}"


def _fmt_bytes(n):
    if n % GIB == 0:
        return f"{n // GIB} GiB"
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} B"


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------

def _stderr_reason(path, fallback):
    return procs.stderr_reason(path, "io_worker", fallback)


def worker_command(cfg, loop, row):
    cmd = [cfg.python, *WORKER_PY, "--loop", loop, "--kind", row.workload]
    p = row.params
    if row.workload == "udp":
        cmd += ["--port", "0"]
    elif row.workload.startswith("spawn"):
        cmd += ["--count", str(p["count"]), "--concurrency", str(p["concurrency"])]
    else:
        cmd += ["--bytes", str(p["bytes"]), "--chunk", str(PIPE_CHUNK)]
    return cmd


def run_udp(loop, row, cfg, paths, workdir):
    """Start the echo server, load it with udpgen, stop it (as net.py's run_once)."""
    def udpgen(port):
        return [paths["udpgen"], "127.0.0.1", port,
                "--inflight", str(row.params["inflight"]), "--size", str(row.params["size"]),
                "--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}", "--hold"]

    result, start, end = procs.run_under_load(
        worker_command(cfg, loop, row), udpgen, env=cfg.env, cwd=ROOT,
        errlog=os.path.join(workdir, "worker.err"), prog="io_worker", generator="udpgen",
        seconds=cfg.warmup + cfg.duration)
    if result["errors"] or result["warmup_errors"]:
        raise harness.RunError(f"{result['errors'] + result['warmup_errors']} bad echoes "
                               f"(wrong size, header or bytes)")
    if not result["requests"]:
        raise harness.RunError("no datagram came back")
    sample = {
        "rate": result["rps"],
        "cpu_per_unit": (end.cpu - start.cpu) / result["requests"] * 1e6,   # us per datagram
        "wall_per_unit": result["seconds"] / result["requests"] * 1e6,
        **procs.server_figures(result, start, end),
        "lost": result["lost"], "late": result["late"],
        "send_errors": result["send_errors"],
        "server_utime_s": round(end.user - start.user, 4),
        "server_stime_s": round(end.system - start.system, 4),
    }
    if start.sched is not None and end.sched is not None:
        sample["sched_us_per_unit"] = (end.sched - start.sched) / result["requests"] * 1e6
    return sample


def run_oneshot(loop, row, cfg, workdir):
    """Run a spawn/pipe worker to completion; it measures itself."""
    r, start, end, children = procs.run_to_result(
        worker_command(cfg, loop, row), env=cfg.env, cwd=ROOT,
        errlog=os.path.join(workdir, "worker.err"), prog="io_worker", timeout=RUN_TIMEOUT,
        startup_failed=_import_failed)
    per = GIB if row.unit == "GiB" else 1
    units = r["units"] / per
    sample = {
        "rate": units / r["wall_s"],
        # us per process; ms per GiB
        "cpu_per_unit": r["cpu_s"] / units * (1e3 if per == GIB else 1e6),
        "wall_per_unit": r["wall_s"] / units * (1e3 if per == GIB else 1e6),
        "units": r["units"], "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
        "utime_s": r["utime_s"], "stime_s": r["stime_s"],
        "children_cpu_s": r["children_cpu_s"],
    }
    # Everything else the machine did while the worker ran (its start-up and
    # warm-up included).
    sample.update(procs.other_load(start, end, children))
    return sample


def _import_failed(errlog):
    reason = _stderr_reason(errlog, "")
    return reason.startswith(("ModuleNotFoundError", "ImportError", "NotImplementedError"))


def run_once(loop, row, cfg, paths, workdir):
    if row.workload == "udp":
        return run_udp(loop, row, cfg, paths, workdir)
    return run_oneshot(loop, row, cfg, workdir)


# --------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------

def run_matrix(rows, cfg, paths, log):
    startup_errors = {}                      # (loop, workload) -> reason
    results = []
    workdir = tempfile.mkdtemp(prefix="tideloop-io-")
    try:
        for row in rows:
            names = list(cfg.loops) + ([FLOOR] if cfg.floor and row.has_floor else [])
            log(f"  {row.workload:<10} {row.label():>12}")

            def measure(name):
                if cfg.quiet_wait:
                    procs.wait_quiet(cfg.quiet_wait)
                try:
                    return run_once(name, row, cfg, paths, workdir)
                except harness.RunError as exc:
                    if exc.startup:
                        startup_errors[(name, row.workload)] = str(exc)
                    raise

            samples, errors = harness.interleave(
                names, cfg.repeat, measure, log=log,
                errors={name: startup_errors[(name, row.workload)] for name in names
                        if (name, row.workload) in startup_errors})
            res = _summarise(row, samples, errors)
            log(" " + _progress(res, names) + "\n")
            results.append(res)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def _summarise(row, samples, errors):
    ok = {n: s for n, s in samples.items() if s and n not in errors}
    res = {
        "workload": row.workload, "params": dict(row.params), "label": row.label(),
        "unit": row.unit,
        "cpu_unit": "ms/GiB" if row.unit == "GiB" else f"us/{row.unit}",
        "rate": harness.medians(samples, errors, "rate"),
        "cpu_per_unit": harness.medians(samples, errors, "cpu_per_unit"),
        "wall_per_unit": harness.medians(samples, errors, "wall_per_unit"),
        "samples": {n: s for n, s in samples.items() if s},
        "errors": dict(errors),
    }
    if row.workload == "udp":
        res["lost"] = {n: sum(x["lost"] for x in s) for n, s in ok.items()}
    _verdict(res)
    return res


def _ratio(res, key, a, b):
    return harness.ratio(res[key].get(a), res[key].get(b))


def _verdict(res):
    res["tl_vs_uvloop"] = _ratio(res, "cpu_per_unit", "tideloop", "uvloop")
    res["tl_vs_asyncio"] = _ratio(res, "cpu_per_unit", "tideloop", "asyncio")
    res["wall_tl_vs_uvloop"] = _ratio(res, "wall_per_unit", "tideloop", "uvloop")
    res["wall_tl_vs_asyncio"] = _ratio(res, "wall_per_unit", "tideloop", "asyncio")
    res["targets"] = dict(TARGETS)
    if "tideloop" in res["errors"]:
        res["verdict"] = "ERROR"
        return
    if res["cpu_per_unit"].get("tideloop") is None:
        res["verdict"] = None
        return
    checks = []
    for ref, limit in TARGETS.items():
        r = res["tl_vs_" + ref]
        if r is None:
            if ref == "uvloop" and "uvloop" in res["errors"]:
                continue                     # "where uvloop supports it"
            checks.append(None)
        else:
            checks.append(r <= limit)
    if False in checks:
        res["verdict"] = "FAIL"              # whatever else is missing
    elif None in checks or not checks:
        res["verdict"] = None                # a figure is missing: see harness.result_cell
    else:
        res["verdict"] = "PASS"


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def _fmt_rate(x, unit):
    if x is None:
        return "-"
    if unit == "GiB":
        return f"{x:.2f} GiB/s"
    if x >= 1000:
        return f"{x / 1000:.1f}k/s"
    return f"{x:.0f}/s"


def _fmt_cost(x):
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 10 else (f"{x:.1f}" if x < 100 else f"{x:,.0f}")


def _user_share(sample):
    """The share of the loop process's CPU spent in user space, as text."""
    u = sample.get("server_utime_s", sample.get("utime_s"))
    k = sample.get("server_stime_s", sample.get("stime_s"))
    return f"{u / (u + k):.0%}" if u is not None and k is not None and u + k > 0 else "-"


def _progress(res, names):
    bits = []
    for n in names:
        if n in res["errors"]:
            bits.append(f"{n}=ERROR")
        elif res["cpu_per_unit"].get(n) is not None:
            bits.append(f"{n}={_fmt_cost(res['cpu_per_unit'][n])}")
    return " ".join(bits) + f" {res['cpu_unit']}"


LABEL = {"asyncio": "aio", "uvloop": "uv", "tideloop": "tl", FLOOR: "blk"}


def _table(results, loops, floor):
    cols = list(loops)
    fcols = cols + ([FLOOR] if floor and any(r["workload"].startswith("pipe_")
                                             for r in results) else [])
    header = (["workload", "params"]
              + [f"{LABEL[c]} rate" for c in cols]
              + [f"{LABEL[c]} CPU" for c in fcols]
              + ["CPU per", "tl/uv", "tl/aio", "wall tl/uv", "wall tl/aio",
                 "target (CPU)", "result"])
    body = []
    for r in results:
        cells = [r["workload"], r["label"]]
        for c in cols:
            cells.append("ERROR" if c in r["errors"] else _fmt_rate(r["rate"].get(c), r["unit"]))
        for c in fcols:
            cells.append("ERROR" if c in r["errors"] else _fmt_cost(r["cpu_per_unit"].get(c)))
        cells += [r["cpu_unit"], harness.fmt_ratio(r["tl_vs_uvloop"]), harness.fmt_ratio(r["tl_vs_asyncio"]),
                  harness.fmt_ratio(r["wall_tl_vs_uvloop"]), harness.fmt_ratio(r["wall_tl_vs_asyncio"]),
                  "<=0.80x uv, <=0.50x aio",
                  harness.result_cell(r["verdict"], r["tl_vs_asyncio"], loops)]
        body.append(cells)
    return header, body


def format_text(results, loops, floor):
    header, body = _table(results, loops, floor)
    return harness.text_table(header, body, left=_left(header))


def format_markdown(results, loops, floor):
    header, body = _table(results, loops, floor)
    return harness.markdown_table(header, body, left=_left(header))


def _left(header):
    """The left-aligned columns: workload, CPU per, target."""
    return {0, len(header) - 2, len(header) - 7}


def reproduce_command(args, cfg):
    parts = harness.command_prefix(["-m", "bench.io"], cfg.loops,
                                   args.quick, cfg.repeat)
    if args.only:
        parts += ["--only", ",".join(cfg.workloads)]
    if "udp" in cfg.workloads:
        parts += ["--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}"]
        if args.sizes:
            parts += ["--sizes", args.sizes]
        if args.inflight:
            parts += ["--inflight", args.inflight]
    if args.count is not None:
        parts += ["--count", str(args.count)]
    if args.concurrency is not None:
        parts += ["--concurrency", str(args.concurrency)]
    if args.bytes is not None:
        parts += ["--bytes", str(args.bytes)]
    return " ".join(parts + procs.command_flags(cfg))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.io",
        description="I/O benchmark : a UDP echo server (DatagramProtocol) "
                    "loaded by a C generator, spawning and awaiting short subprocesses, "
                    "and 1 GiB through a pipe each way, on asyncio, uvloop and tideloop; "
                    "reports rates and the loop process's CPU time per unit (median of "
                    "interleaved runs) and PASS/FAIL against the issue's targets.")
    harness.add_loops_option(p)
    p.add_argument("--only", default=None, metavar="LIST",
                   help="comma-separated workloads, from: " + ",".join(WORKLOADS)
                        + " (default: all)")
    p.add_argument("--sizes", default=None, metavar="LIST",
                   help="udp: datagram sizes in bytes, 16..65507 (default: 64,1024)")
    p.add_argument("--inflight", default=None, metavar="LIST",
                   help="udp: datagrams in flight (default: 1,16,64)")
    p.add_argument("--count", type=int, default=None, metavar="N",
                   help=f"spawn*: processes per run (default: {SPAWN_COUNT}, "
                        f"or {QUICK_SPAWN_COUNT} with --quick)")
    p.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help=f"spawn*: processes at a time (default: {SPAWN_CONCURRENCY})")
    p.add_argument("--bytes", type=int, default=None, metavar="N",
                   help="pipe_*: bytes per run, a multiple of 1 MiB (default: 1 GiB, "
                        "or 256 MiB with --quick)")
    procs.add_run_options(
        p, "row",
        duration_help="udp: measured seconds per run (default: 3, or 0.5 with --quick)",
        warmup_help="udp: unmeasured load before each run's window (default: 0.5, "
                    "or 0.2 with --quick)",
        quick_help="CI smoke (< 1 min): 0.5 s UDP windows on the (64 B, 1) and "
                   "(1 KiB, 64) cells, 200 processes, 256 MiB through the pipes",
        quiet_wait_help="")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="do not measure the blocking no-loop floor of the pipe rows")
    harness.add_output_options(p)
    plot.add_plot_option(p)
    p.add_argument("--rebuild", action="store_true",
                   help="recompile bench/udpgen.c even when up to date")
    harness.add_verdict_options(p)
    return p


def make_rows(args, cfg):
    rows = []
    for w in cfg.workloads:
        if w == "udp":
            sizes = harness.int_list(args.sizes, "sizes", "io.py") if args.sizes else None
            infl = harness.int_list(args.inflight, "inflight", "io.py") if args.inflight else None
            if sizes and (min(sizes) < 16 or max(sizes) > 65507):
                raise SystemExit("io.py: --sizes must be between 16 and 65507")
            if args.quick and not sizes and not infl:
                cells = list(QUICK_UDP_CELLS)
            else:
                cells = [(s, n) for s in (sizes or UDP_SIZES) for n in (infl or UDP_INFLIGHT)]
            rows += [Row("udp", size=s, inflight=n) for s, n in cells]
        elif w.startswith("spawn"):
            count = args.count or (QUICK_SPAWN_COUNT if args.quick else SPAWN_COUNT)
            rows.append(Row(w, count=count,
                            concurrency=args.concurrency or SPAWN_CONCURRENCY))
        else:
            nbytes = args.bytes or (QUICK_PIPE_BYTES if args.quick else PIPE_BYTES)
            if nbytes % (1 << 20):
                raise SystemExit("io.py: --bytes must be a multiple of 1 MiB")
            rows.append(Row(w, bytes=nbytes))
    return rows


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.time()

    log = harness.Progress()
    say = harness.say
    cfg = procs.driver_config(args, WORKLOADS, "workload", durations=(0.5, 3.0),
                              warmups=(0.2, 0.5), src=SRC)
    if cfg is None:
        return 2
    bad_plot = plot.check_plot_option(args.plot)
    if bad_plot is not None:
        return bad_plot
    cfg.workloads = cfg.only
    for name in ("count", "concurrency", "bytes"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            return harness.usage_error(f"--{name} must be positive")
    rows = make_rows(args, cfg)

    paths = (procs.build_c(HERE, C_PROGRAMS, "io.py", force=args.rebuild, log=log)
             if "udp" in cfg.workloads else {})
    versions = procs.loop_versions(cfg.python, cfg.env, ROOT)
    cfg.loops, skipped = procs.measurable_loops(cfg.loops, versions)
    core = procs.CoreWatch(versions, cfg.loops)
    cpus = harness.usable_cpus()
    n_runs = sum(cfg.repeat * (len(cfg.loops) + (1 if cfg.floor and r.has_floor else 0))
                 for r in rows)
    say(f"tideloop I/O benchmark: CPython {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, {cpus} CPU(s), nothing pinned; "
        f"median of {cfg.repeat} interleaved runs; {n_runs} runs\n")
    if not procs.log_loop_versions(say, cfg.loops, versions, "workers'", skipped):
        return 2
    harness.say_verdict_legend(cfg.loops, "tideloop's CPU per unit")

    results = run_matrix(rows, cfg, paths, log)
    elapsed = time.time() - started
    core.finish()
    command = reproduce_command(args, cfg)

    print()
    if args.markdown:
        print(format_markdown(results, cfg.loops, cfg.floor))
    else:
        print(format_text(results, cfg.loops, cfg.floor))
    print()
    reported = set()
    for r in results:
        for name, err in r["errors"].items():
            if (name, r["workload"], err) in reported:
                continue
            reported.add((name, r["workload"], err))
            print(f"error: {name} {r['workload']} ({r['label']}): {err}")
    lossy = [(r["label"], n, lost) for r in results for n, lost in r.get("lost", {}).items()
             if lost]
    if lossy:
        print("udp datagrams lost (resent after 100 ms, summed over the runs): "
              + ", ".join(f"{n} {label}: {lost}" for label, n, lost in lossy))
    if args.verbose:
        for r in results:
            for name, xs in r["samples"].items():
                print(f"samples {r['workload']:<10} {r['label']:>12} {name:<9} rate "
                      + " ".join(_fmt_rate(x["rate"], r["unit"]) for x in xs)
                      + f"  CPU {r['cpu_unit']} " + " ".join(_fmt_cost(x["cpu_per_unit"]) for x in xs)
                      + "  user " + " ".join(_user_share(x) for x in xs)
                      + "  other " + " ".join(f"{x.get('other_cpu', 0):.0%}" for x in xs))
    print(f"rate = wall-clock units/s (udp: datagrams echoed per second seen by udpgen); "
          f"CPU = CPU time of the loop's process per unit, median of {cfg.repeat} "
          f"interleaved runs: udp from /proc/<pid>/stat of the server (udpgen excluded), "
          f"spawn*/pipe_* from getrusage(RUSAGE_SELF) in the loop process, children "
          f"excluded; blk = blocking os.readv/os.write, no loop (pipe floor).")
    print("tl/uv, tl/aio = tideloop's CPU per unit over uvloop's / asyncio's "
          "(the target); wall ratios are of wall time per unit, for information.")
    samples = [x for r in results for xs in r["samples"].values() for x in xs]
    for line in (procs.load_line(samples, "the runs"), core.warning()):
        if line:
            print(line)
    harness.print_reproduce(command, elapsed)

    doc = harness.json_head("tideloop-iobench/1", command, started, elapsed)
    doc.update({
        "repeat": cfg.repeat, "quick": args.quick,
        "udp_duration_s": cfg.duration, "udp_warmup_s": cfg.warmup,
        "quiet_wait_s": cfg.quiet_wait,
        "targets": dict(TARGETS),
        "environment": procs.environment(cpus, ROOT, versions, core),
        "results": results,
    })
    if args.json:
        harness.write_json(args.json, doc)
    if args.plot and plot.draw_run(doc, args.plot):
        return 1

    return harness.missed(results) if args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
