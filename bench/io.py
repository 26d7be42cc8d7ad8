#!/usr/bin/env python3
"""I/O benchmark (issue #5): UDP echo, subprocesses and pipes on asyncio,
uvloop and tideloop, measured side by side in one run.

    python bench/io.py                                   # everything, ~5 min
    python bench/io.py --quick                           # CI smoke, < 1 min
    python bench/io.py --only udp --sizes 64 --inflight 1,16 --repeat 5
    python bench/io.py --markdown --json io-results.json

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

Targets (issue #5), on CPU per unit: tideloop <= 0.8 x uvloop (where uvloop
has a figure) and <= 0.5 x asyncio.  Wall-clock ratios are shown beside them
(for information).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.join(HERE, "bin")
WORKER_PY = os.path.join(HERE, "io_worker.py")
C_PROGRAMS = ("udpgen",)

sys.path.insert(0, HERE)
import net as _net  # noqa: E402  (helpers shared with the network benchmark)

ALL_LOOPS = ("asyncio", "uvloop", "tideloop")
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

READY_TIMEOUT = 15.0
RUN_TIMEOUT = 600.0


# --------------------------------------------------------------------------
# Building the C load generator
# --------------------------------------------------------------------------

def build_c(force=False, log=None):
    """Compile udpgen into bench/bin/ when missing or older than its source
    (as net.py does for loadgen).  Returns {name: path}."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    os.makedirs(BIN, exist_ok=True)
    paths = {}
    for name in C_PROGRAMS:
        src = os.path.join(HERE, name + ".c")
        exe = os.path.join(BIN, name)
        paths[name] = exe
        if (not force and os.path.exists(exe)
                and os.path.getmtime(exe) >= os.path.getmtime(src)):
            continue
        if not cc:
            raise SystemExit("io.py: no C compiler (gcc/cc, or $CC) to build " + src)
        cmd = [cc, "-O2", "-Wall", "-o", exe, src]
        if log:
            log(f"build: {' '.join(shlex.quote(c) for c in cmd)}\n")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"io.py: compiling {src} failed")
    return paths


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
            return f"{_fmt_size(p['size'])} x{p['inflight']}"
        if self.workload.startswith("spawn"):
            return f"{p['count']} /{p['concurrency']}"
        return f"{_fmt_bytes(p['bytes'])}"


def _fmt_size(n):
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _fmt_bytes(n):
    if n % GIB == 0:
        return f"{n // GIB} GiB"
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} B"


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------

_median = _net._median
_fmt_ratio = _net._fmt_ratio
Config = _net.Config


class RunError(_net.RunError):
    pass


def _stderr_reason(path, fallback):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return fallback
    for ln in reversed(lines):
        if ln.startswith("io_worker: ERROR:"):
            return ln[len("io_worker: ERROR:"):].strip()
    return lines[-1][:300] if lines else fallback


def worker_command(cfg, loop, row):
    cmd = [cfg.python, WORKER_PY, "--loop", loop, "--kind", row.workload]
    p = row.params
    if row.workload == "udp":
        cmd += ["--port", "0"]
    elif row.workload.startswith("spawn"):
        cmd += ["--count", str(p["count"]), "--concurrency", str(p["concurrency"])]
    else:
        cmd += ["--bytes", str(p["bytes"]), "--chunk", str(PIPE_CHUNK)]
    return cmd


def _children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_user_sys(pid):
    """(utime, stime) in seconds from /proc/<pid>/stat (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) / _net.CLK_TCK, int(fields[12]) / _net.CLK_TCK


def run_udp(loop, row, cfg, paths, workdir):
    """Start the echo server, load it with udpgen, stop it (as net.py's run_once)."""
    errlog = os.path.join(workdir, "worker.err")
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(worker_command(cfg, loop, row), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, env=cfg.env, cwd=ROOT)
    gen = None
    try:
        line = _net._read_line(proc, time.monotonic() + READY_TIMEOUT)
        if line is None or not line.startswith("READY"):
            _net._stop(proc)
            why = "no READY within %gs" % READY_TIMEOUT if proc.returncode is None \
                else f"exit status {proc.returncode} before READY"
            raise RunError(_stderr_reason(errlog, why), startup=True)
        port = line.split()[1]
        cmd = [paths["udpgen"], "127.0.0.1", port,
               "--inflight", str(row.params["inflight"]), "--size", str(row.params["size"]),
               "--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}", "--hold"]
        gen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        deadline = time.monotonic() + cfg.warmup + cfg.duration + 30
        cpu0 = result = None
        while True:
            line = _net._read_line(gen, deadline)
            if line is None:
                break
            if line == "START":
                cpu0, sched0 = _net.proc_cpu(proc.pid)
                us0 = proc_user_sys(proc.pid)
                busy0, steal0 = _net.machine_cpu()
                t0 = time.monotonic()
            elif line.startswith("{"):
                cpu1, sched1 = _net.proc_cpu(proc.pid)
                us1 = proc_user_sys(proc.pid)
                busy1, steal1 = _net.machine_cpu()
                t1 = time.monotonic()
                result = json.loads(line)
                break
        alive = proc.poll() is None
        gen.stdin.close()
        try:
            gen.wait(10)
        except subprocess.TimeoutExpired:
            gen.kill()
            gen.wait()
        gen_err = gen.stderr.read().decode(errors="replace").strip()
        if not alive:
            raise RunError("server exited during the run: "
                           + _stderr_reason(errlog, f"status {proc.returncode}"))
        if result is None or cpu0 is None:
            raise RunError("udpgen failed: " + (gen_err.splitlines()[-1] if gen_err
                                                 else f"status {gen.returncode}"))
        if result["errors"] or result["warmup_errors"]:
            raise RunError(f"{result['errors'] + result['warmup_errors']} bad echoes "
                           f"(wrong size, header or bytes)")
        if not result["requests"]:
            raise RunError("no datagram came back")
        cpu = cpu1 - cpu0
        sample = {
            "rate": result["rps"],
            "cpu_per_unit": cpu / result["requests"] * 1e6,        # us per datagram
            "wall_per_unit": result["seconds"] / result["requests"] * 1e6,
            "requests": result["requests"],
            "seconds": result["seconds"],
            "lost": result["lost"], "late": result["late"],
            "send_errors": result["send_errors"],
            "server_cpu_s": round(cpu, 4),
            "server_utime_s": round(us1[0] - us0[0], 4),
            "server_stime_s": round(us1[1] - us0[1], 4),
            "server_cpu_util": round(cpu / (t1 - t0), 3) if t1 > t0 else None,
            "latency_us": result["latency_us"],
            "client_cpu_s": result["client_cpu_s"],
        }
        if t1 > t0:
            other = (busy1 - busy0) - cpu - result["client_cpu_s"]
            sample["other_cpu"] = round(max(0.0, other) / (t1 - t0), 3)
            sample["steal_cpu"] = round((steal1 - steal0) / (t1 - t0), 3)
        if sched0 is not None and sched1 is not None:
            sample["sched_us_per_unit"] = (sched1 - sched0) / result["requests"] * 1e6
        return sample
    finally:
        if gen is not None and gen.poll() is None:
            gen.kill()
            gen.wait()
        _net._stop(proc)


def run_oneshot(loop, row, cfg, workdir):
    """Run a spawn/pipe worker to completion; it measures itself."""
    errlog = os.path.join(workdir, "worker.err")
    children0 = _children_cpu()
    busy0, steal0 = _net.machine_cpu()
    t0 = time.monotonic()
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(worker_command(cfg, loop, row), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, env=cfg.env, cwd=ROOT)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RunError(f"no result within {RUN_TIMEOUT:g} s")
    t1 = time.monotonic()
    busy1, steal1 = _net.machine_cpu()
    children = _children_cpu() - children0
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RunError(_stderr_reason(errlog, f"exit status {proc.returncode}"),
                       startup=proc.returncode == 1 and _import_failed(errlog))
    r = json.loads(lines[-1])
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
    if t1 > t0:
        # Everything else the machine did while the worker ran (its start-up
        # and warm-up included), in CPUs.
        sample["other_cpu"] = round(max(0.0, (busy1 - busy0) - children) / (t1 - t0), 3)
        sample["steal_cpu"] = round((steal1 - steal0) / (t1 - t0), 3)
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
            samples = {n: [] for n in names}
            errors = {}
            log(f"  {row.workload:<10} {row.label():>12}")
            for rep in range(cfg.repeat):
                k = rep % len(names)
                for name in names[k:] + names[:k]:
                    key = (name, row.workload)
                    if key in startup_errors:
                        errors[name] = startup_errors[key]
                        continue
                    if name in errors:
                        continue
                    if cfg.quiet_wait:
                        _net.wait_quiet(cfg.quiet_wait)
                    try:
                        samples[name].append(run_once(name, row, cfg, paths, workdir))
                    except RunError as exc:
                        errors[name] = str(exc)
                        if exc.startup:
                            startup_errors[key] = str(exc)
                log(".")
            res = _summarise(row, names, samples, errors)
            log(" " + _progress(res, names) + "\n")
            results.append(res)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def _summarise(row, names, samples, errors):
    ok = {n: s for n, s in samples.items() if s and n not in errors}
    res = {
        "workload": row.workload, "params": dict(row.params), "label": row.label(),
        "unit": row.unit,
        "cpu_unit": "ms/GiB" if row.unit == "GiB" else f"us/{row.unit}",
        "rate": {n: _median([x["rate"] for x in s]) for n, s in ok.items()},
        "cpu_per_unit": {n: _median([x["cpu_per_unit"] for x in s]) for n, s in ok.items()},
        "wall_per_unit": {n: _median([x["wall_per_unit"] for x in s]) for n, s in ok.items()},
        "samples": {n: s for n, s in samples.items() if s},
        "errors": dict(errors),
    }
    if row.workload == "udp":
        res["lost"] = {n: sum(x["lost"] for x in s) for n, s in ok.items()}
    _verdict(res)
    return res


def _ratio(res, key, a, b):
    x, y = res[key].get(a), res[key].get(b)
    return x / y if x and y else None


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
    if None in checks or not checks:
        res["verdict"] = None                # n/a: a figure is missing
    else:
        res["verdict"] = "PASS" if all(checks) else "FAIL"


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


def _fmt_ratio(x):
    return "-" if x is None else f"{x:.2f}x"


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
        cells += [r["cpu_unit"], _fmt_ratio(r["tl_vs_uvloop"]), _fmt_ratio(r["tl_vs_asyncio"]),
                  _fmt_ratio(r["wall_tl_vs_uvloop"]), _fmt_ratio(r["wall_tl_vs_asyncio"]),
                  "<=0.80x uv, <=0.50x aio", r["verdict"] or "n/a"]
        body.append(cells)
    return header, body


def format_text(results, loops, floor):
    header, body = _table(results, loops, floor)
    widths = [max(len(str(row[i])) for row in [header] + body) for i in range(len(header))]
    left = {0, len(header) - 2, len(header) - 7}
    out = []
    for j, row in enumerate([header] + body):
        out.append("  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_markdown(results, loops, floor):
    header, body = _table(results, loops, floor)
    align = [":---" if i in (0, len(header) - 2, len(header) - 7) else "---:"
             for i in range(len(header))]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in body:
        out.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(out)


def reproduce_command(args, cfg):
    parts = []
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        parts.append(f"PYTHONPATH={shlex.quote(pythonpath)}")
    parts += [_net._python_cmd(), shlex.quote(os.path.relpath(os.path.abspath(__file__)))]
    parts += ["--loops", ",".join(cfg.loops)]
    if args.quick:
        parts.append("--quick")
    parts += ["--repeat", str(cfg.repeat)]
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
    if cfg.quiet_wait:
        parts += ["--quiet-wait", f"{cfg.quiet_wait:g}"]
    if not cfg.floor:
        parts.append("--no-floor")
    return " ".join(parts)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def _int_list(text, what):
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"io.py: --{what} takes comma-separated integers")
    if not xs or min(xs) <= 0:
        raise SystemExit(f"io.py: --{what} takes positive integers")
    return xs


def build_parser():
    p = argparse.ArgumentParser(
        prog="bench/io.py",
        description="I/O benchmark for issue #5: a UDP echo server (DatagramProtocol) "
                    "loaded by a C generator, spawning and awaiting short subprocesses, "
                    "and 1 GiB through a pipe each way, on asyncio, uvloop and tideloop; "
                    "reports rates and the loop process's CPU time per unit (median of "
                    "interleaved runs) and PASS/FAIL against the issue's targets.")
    p.add_argument("--loops", default=",".join(ALL_LOOPS), metavar="LIST",
                   help="comma-separated loops, from: %(default)s (default: all)")
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
    p.add_argument("--repeat", "-r", type=int, default=3, metavar="N",
                   help="interleaved runs per row and loop; the figure is the median "
                        "(default: %(default)s)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="udp: measured seconds per run (default: 3, or 0.5 with --quick)")
    p.add_argument("--warmup", type=float, default=None, metavar="S",
                   help="udp: unmeasured load before each run's window (default: 0.5, "
                        "or 0.2 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke (< 1 min): 0.5 s UDP windows on the (64 B, 1) and "
                        "(1 KiB, 64) cells, 200 processes, 256 MiB through the pipes")
    p.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                   help="before each run, wait up to S seconds for the machine to be "
                        "idle (default: 0, do not wait)")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="do not measure the blocking no-loop floor of the pipe rows")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write every sample and the environment as JSON to PATH")
    p.add_argument("--markdown", action="store_true",
                   help="print the table as Markdown")
    p.add_argument("--rebuild", action="store_true",
                   help="recompile bench/udpgen.c even when up to date")
    p.add_argument("--fail-on-miss", action="store_true",
                   help="exit with status 1 if tideloop misses a target or errors")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also print every sample")
    return p


class Config:
    pass


def make_rows(args, cfg):
    rows = []
    for w in cfg.workloads:
        if w == "udp":
            sizes = _int_list(args.sizes, "sizes") if args.sizes else None
            infl = _int_list(args.inflight, "inflight") if args.inflight else None
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

    def log(msg):
        sys.stderr.write(msg)
        sys.stderr.flush()

    cfg = Config()
    cfg.loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    bad = [x for x in cfg.loops if x not in ALL_LOOPS]
    if bad or not cfg.loops:
        print(f"unknown loop(s) {', '.join(bad)}; choose from {', '.join(ALL_LOOPS)}",
              file=sys.stderr)
        return 2
    cfg.loops = list(dict.fromkeys(cfg.loops))
    cfg.workloads = list(WORKLOADS)
    if args.only:
        chosen = [x.strip() for x in args.only.split(",") if x.strip()]
        bad = [x for x in chosen if x not in WORKLOADS]
        if bad or not chosen:
            print(f"unknown workload(s) {', '.join(bad)}; choose from {', '.join(WORKLOADS)}",
                  file=sys.stderr)
            return 2
        cfg.workloads = [w for w in WORKLOADS if w in chosen]
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    for name in ("count", "concurrency", "bytes"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            print(f"--{name} must be positive", file=sys.stderr)
            return 2
    cfg.repeat = args.repeat
    cfg.duration = args.duration if args.duration is not None else (0.5 if args.quick else 3.0)
    cfg.warmup = args.warmup if args.warmup is not None else (0.2 if args.quick else 0.5)
    if cfg.duration <= 0 or cfg.warmup < 0:
        print("--duration must be positive and --warmup not negative", file=sys.stderr)
        return 2
    cfg.quiet_wait = max(0.0, args.quiet_wait)
    cfg.floor = args.floor
    cfg.python = sys.executable or "python3"
    cfg.env = _net.server_env()
    rows = make_rows(args, cfg)

    paths = build_c(force=args.rebuild, log=log) if "udp" in cfg.workloads else {}
    versions = _net.loop_versions(cfg)
    core = versions.pop("tideloop_core", None) if "tideloop" in cfg.loops else None
    core_before = _net.file_digest(core)
    cpus = _net._cpus()
    n_runs = sum(cfg.repeat * (len(cfg.loops) + (1 if cfg.floor and r.has_floor else 0))
                 for r in rows)
    log(f"tideloop I/O benchmark: CPython {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, {cpus} CPU(s), nothing pinned; "
        f"median of {cfg.repeat} interleaved runs; {n_runs} runs\n")
    for name in cfg.loops:
        log(f"  {name:<9} {versions.get(name, '?')}\n")
    if "tideloop" in cfg.loops and not str(versions.get("tideloop", "")).startswith("tideloop "):
        log("tideloop is not importable in the workers' environment\n")
        return 2

    results = run_matrix(rows, cfg, paths, log)
    elapsed = time.time() - started
    core_after = _net.file_digest(core)
    core_changed = core_before != core_after
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
    others = sorted(x.get("other_cpu", 0.0) for r in results
                    for xs in r["samples"].values() for x in xs)
    if others:
        busy = sum(1 for x in others if x > 0.10)
        print(f"other load during the runs: median {statistics.median(others):.0%} of a CPU, "
              f"max {others[-1]:.0%}; {busy} of {len(others)} runs above 10 %"
              + (" -- figures are disturbed, rerun on a quiet machine"
                 if busy > len(others) // 5 else ""))
    if core_changed:
        print(f"warning: tideloop's core changed during the run "
              f"({core_before and core_before['sha256']} -> "
              f"{core_after and core_after['sha256']}): runs may mix two builds")
    print(f"reproduce: {command}")
    print(f"({elapsed:.1f} s)")

    if args.json:
        doc = {
            "format": "tideloop-iobench/1",
            "command": command,
            "argv": sys.argv,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "elapsed_s": round(elapsed, 3),
            "repeat": cfg.repeat, "quick": args.quick,
            "udp_duration_s": cfg.duration, "udp_warmup_s": cfg.warmup,
            "quiet_wait_s": cfg.quiet_wait,
            "targets": dict(TARGETS),
            "environment": {
                "python": sys.version.split()[0],
                "platform": platform.platform(),
                "cpus": cpus,
                "pinned": False,
                "git": _net._git_revision(),
                "loops": versions,
                "tideloop_core": {"before": core_before, "after": core_after,
                                  "changed_during_run": core_changed},
                "clk_tck": _net.CLK_TCK,
            },
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")

    if args.fail_on_miss and any(r["verdict"] in ("FAIL", "ERROR") for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
