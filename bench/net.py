#!/usr/bin/env python3
"""Network benchmark (issue #3): echo servers on asyncio, uvloop and tideloop
against a C epoll echo server, driven by a C closed-loop load generator.

    python bench/net.py                                   # full matrix, ~14 min
    python bench/net.py --quick                           # CI smoke, ~2 min
    python bench/net.py --loops asyncio,uvloop --only protocol,streams
    python bench/net.py --markdown --json net-results.json

Matrix: kind (protocol, buffered, streams, sockets) x message size (1 KiB,
10 KiB, 100 KiB) x connections (10, 100).  For each cell, repetition r runs
the loops in an order rotated by r; the C server takes part in the rotation of
the first kind's cell for each (size, conns), and that figure is the floor for
every kind's row.  One run = start the server (a fresh process), wait for its
"READY", run bench/bin/loadgen (warm-up, then D seconds measured), stop the
server.  The server's CPU time (utime+stime from /proc/<pid>/stat, all
threads) is read when loadgen prints "START" (end of warm-up) and when it
prints its result (before the connections close); CPU us per request is
that difference over the requests loadgen completed in the window.  Each
figure is the median of the R repetitions.

Targets (CPU per request, tideloop / other):
    protocol  <= 1.10 x the C server and <= 0.90 x uvloop
    sockets   <= 0.50 x uvloop
    streams   <= 0.85 x uvloop
    buffered  informational

Nothing is pinned: the server and the load generator share the machine's
CPUs (2 on the reference VM), which is why CPU time per request, not
requests per second, is the figure the targets use.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sysconfig
import platform
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
BIN = os.path.join(HERE, "bin")
SERVERS_PY = os.path.join(HERE, "echo_servers.py")
C_PROGRAMS = ("loadgen", "echo_server")

ALL_LOOPS = ("asyncio", "uvloop", "tideloop")
KINDS = ("protocol", "buffered", "streams", "sockets")
FLOOR = "c"                                  # the C epoll echo server's column name
SIZES = (1024, 10240, 102400)
CONNS = (10, 100)
QUICK_CELLS = ((1024, 10), (102400, 100))    # (size, conns) pairs with --quick

# kind -> {reference: max ratio of tideloop's CPU/request to the reference's}
TARGETS = {
    "protocol": {FLOOR: 1.10, "uvloop": 0.90},
    "sockets": {"uvloop": 0.50},
    "streams": {"uvloop": 0.85},
    "buffered": {},
}

READY_TIMEOUT = 15.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------
# Building the C programs
# --------------------------------------------------------------------------

def build_c(force=False, log=None):
    """Compile loadgen and echo_server into bench/bin/ when missing or older
    than their source.  Returns {name: path}."""
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
            raise SystemExit("net.py: no C compiler (gcc/cc, or $CC) to build " + src)
        cmd = [cc, "-O2", "-Wall", "-o", exe, src]
        if log:
            log(f"build: {' '.join(shlex.quote(c) for c in cmd)}\n")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"net.py: compiling {src} failed")
    return paths


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------

def server_env():
    """The Python servers import tideloop from an explicit PYTHONPATH or an
    installed package first, else from this checkout's src/ (as micro.py)."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Only an in-place build: without one, src/tideloop (whose _core is a
    # directory of C sources) would shadow the installed package.
    if os.path.exists(os.path.join(SRC, "tideloop", "_core" + sysconfig.get_config_var("EXT_SUFFIX"))) and SRC not in parts:
        parts.append(SRC)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.pop("PYTHONASYNCIODEBUG", None)
    env.pop("PYTHONDEVMODE", None)
    return env


def proc_cpu(pid):
    """(utime+stime in seconds from /proc/<pid>/stat,
        sum of per-thread run time in seconds from schedstat or None)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])          # utime, stime (fields 14, 15)
    sched = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                sched += int(f.read().split()[0])
        sched_s = sched / 1e9
    except (OSError, ValueError, IndexError):
        sched_s = None
    return ticks / CLK_TCK, sched_s


def machine_cpu():
    """(busy, steal) seconds of the whole machine from /proc/stat: busy is
    user+nice+system+irq+softirq over all CPUs, steal the hypervisor's."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    fields += [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def wait_quiet(max_wait, threshold=0.15, probe=0.5):
    """Wait up to max_wait seconds until the machine is idle (less than
    ``threshold`` of a CPU busy over a ``probe``-second sample).  Returns the
    seconds waited."""
    t_start = time.monotonic()
    while True:
        b0, _ = machine_cpu()
        time.sleep(probe)
        b1, _ = machine_cpu()
        waited = time.monotonic() - t_start
        if (b1 - b0) / probe < threshold or waited >= max_wait:
            return waited


class RunError(Exception):
    """One run failed; ``startup`` tells a server that never became ready."""

    def __init__(self, reason, startup=False):
        super().__init__(reason)
        self.startup = startup


def _stderr_reason(path, fallback):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return fallback
    for ln in reversed(lines):
        if ln.startswith("echo_servers: ERROR:"):
            return ln[len("echo_servers: ERROR:"):].strip()
    return lines[-1][:300] if lines else fallback


def _read_line(proc, deadline):
    """One line from proc.stdout before the deadline, or None (EOF/timeout)."""
    buf = b""
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            return None
        ch = os.read(fd, 1)          # byte by byte: these are a few short lines
        if not ch:
            return buf.decode(errors="replace") if buf else None
        if ch == b"\n":
            return buf.decode(errors="replace")
        buf += ch


def _stop(proc):
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


def server_command(server, python, paths, endpoint):
    if server == FLOOR:
        cmd = [paths["echo_server"], "0"]
        if endpoint:
            cmd += ["--unix", endpoint]
        return cmd
    loop, kind = server
    cmd = [python, SERVERS_PY, "--loop", loop, "--kind", kind, "--port", "0"]
    if endpoint:
        cmd += ["--unix", endpoint]
    return cmd


def run_once(server, size, conns, cfg, paths, workdir):
    """Start the server, load it, stop it.  Returns a sample dict or raises RunError."""
    endpoint = os.path.join(workdir, "echo.sock") if cfg.unix else None
    errlog = os.path.join(workdir, "server.err")
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(server_command(server, cfg.python, paths, endpoint),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, env=cfg.env, cwd=ROOT)
    lg = None
    try:
        line = _read_line(proc, time.monotonic() + READY_TIMEOUT)
        if line is None or not line.startswith("READY"):
            _stop(proc)
            why = "no READY within %gs" % READY_TIMEOUT if proc.returncode is None \
                else f"exit status {proc.returncode} before READY"
            raise RunError(_stderr_reason(errlog, why), startup=True)
        where = line.split()[1] if len(line.split()) > 1 else None
        if cfg.unix:
            target = ["127.0.0.1", "0", "--unix", endpoint]
        else:
            target = ["127.0.0.1", where]
        cmd = [paths["loadgen"], *target, "--conns", str(conns), "--size", str(size),
               "--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}", "--hold"]
        lg = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
        deadline = time.monotonic() + cfg.warmup + cfg.duration + 30
        cpu0 = sched0 = t0 = None
        result = None
        while True:
            line = _read_line(lg, deadline)
            if line is None:
                break
            if line == "START":
                cpu0, sched0 = proc_cpu(proc.pid)
                busy0, steal0 = machine_cpu()
                t0 = time.monotonic()
            elif line.startswith("{"):
                cpu1, sched1 = proc_cpu(proc.pid)
                busy1, steal1 = machine_cpu()
                t1 = time.monotonic()
                result = json.loads(line)
                break
        alive = proc.poll() is None
        lg.stdin.close()                 # loadgen closes its connections and exits
        try:
            lg.wait(10)
        except subprocess.TimeoutExpired:
            lg.kill()
            lg.wait()
        lg_err = lg.stderr.read().decode(errors="replace").strip()
        if result is None or cpu0 is None:
            if not alive:
                raise RunError("server exited during the run: "
                               + _stderr_reason(errlog, f"status {proc.returncode}"))
            raise RunError("loadgen failed: " + (lg_err.splitlines()[-1] if lg_err
                                                  else f"status {lg.returncode}"))
        if not alive:
            raise RunError("server exited during the run: "
                           + _stderr_reason(errlog, f"status {proc.returncode}"))
        if result["errors"] or result["warmup_errors"]:
            raise RunError(f"{result['errors'] + result['warmup_errors']} echo errors "
                           f"(mismatched bytes or dropped connections; "
                           f"{result['conns_alive']}/{result['conns']} connections left)")
        if not result["requests"]:
            raise RunError("no request completed")
        cpu = cpu1 - cpu0
        sample = {
            "rps": result["rps"],
            "cpu_us_per_req": cpu / result["requests"] * 1e6,
            "requests": result["requests"],
            "seconds": result["seconds"],
            "server_cpu_s": round(cpu, 4),
            "server_cpu_util": round(cpu / (t1 - t0), 3) if t1 > t0 else None,
            "latency_us": result["latency_us"],
            "client_cpu_s": result["client_cpu_s"],
        }
        if t1 > t0:
            # CPU the rest of the machine used during the window, in CPUs
            # (1.0 = one CPU busy all the time): what disturbed this sample.
            other = (busy1 - busy0) - cpu - result["client_cpu_s"]
            sample["other_cpu"] = round(max(0.0, other) / (t1 - t0), 3)
            sample["steal_cpu"] = round((steal1 - steal0) / (t1 - t0), 3)
        if sched0 is not None and sched1 is not None:
            sample["server_sched_cpu_s"] = round(sched1 - sched0, 6)
            sample["sched_us_per_req"] = (sched1 - sched0) / result["requests"] * 1e6
        return sample
    finally:
        if lg is not None and lg.poll() is None:
            lg.kill()
            lg.wait()
        _stop(proc)
        if endpoint:
            try:
                os.unlink(endpoint)
            except OSError:
                pass


# --------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------

def _median(xs):
    return statistics.median(xs) if xs else None


def run_matrix(cfg, paths, log):
    """Returns (rows, floor) where floor maps (size, conns) to the C server's
    result dict and rows is one dict per (kind, size, conns)."""
    startup_errors = {}        # (loop, kind) or FLOOR -> reason: skip further runs
    floor = {}
    rows = []
    workdir = tempfile.mkdtemp(prefix="tideloop-net-")
    try:
        for ki, kind in enumerate(cfg.kinds):
            for size, conns in cfg.cells:
                participants = [(loop, kind) for loop in cfg.loops]
                with_floor = ki == 0 and cfg.floor
                if with_floor:
                    participants.append(FLOOR)
                names = [p if p == FLOOR else p[0] for p in participants]
                samples = {n: [] for n in names}
                errors = {}
                log(f"  {kind:<9} {_fmt_size(size):>7} x{conns:<4}")
                for rep in range(cfg.repeat):
                    k = rep % len(participants)
                    for p, name in list(zip(participants, names))[k:] + \
                            list(zip(participants, names))[:k]:
                        key = FLOOR if p == FLOOR else p
                        if key in startup_errors:
                            errors[name] = startup_errors[key]
                            continue
                        if name in errors:
                            continue
                        if cfg.quiet_wait:
                            wait_quiet(cfg.quiet_wait)
                        try:
                            samples[name].append(run_once(p, size, conns, cfg, paths, workdir))
                        except RunError as exc:
                            errors[name] = str(exc)
                            if exc.startup:
                                startup_errors[key] = str(exc)
                    log(".")
                row = _summarise(kind, size, conns, names, samples, errors)
                if with_floor:
                    floor[(size, conns)] = {
                        "rps": row["rps"].pop(FLOOR, None),
                        "cpu_us_per_req": row["cpu_us_per_req"].pop(FLOOR, None),
                        "samples": row["samples"].pop(FLOOR, []),
                        "error": row["errors"].pop(FLOOR, None),
                    }
                log(" " + _progress(row, cfg.loops) + "\n")
                rows.append(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for row in rows:
        f = floor.get((row["size"], row["conns"]))
        if f is not None:
            row["rps"][FLOOR] = f["rps"]
            row["cpu_us_per_req"][FLOOR] = f["cpu_us_per_req"]
            if f["error"]:
                row["errors"][FLOOR] = f["error"]
        _verdict(row)
    return rows, floor


def _summarise(kind, size, conns, names, samples, errors):
    ok = {n: s for n, s in samples.items() if s and n not in errors}
    return {
        "kind": kind, "size": size, "conns": conns,
        "rps": {n: _median([x["rps"] for x in s]) for n, s in ok.items()},
        "cpu_us_per_req": {n: _median([x["cpu_us_per_req"] for x in s])
                           for n, s in ok.items()},
        "samples": {n: s for n, s in samples.items() if s},
        "errors": dict(errors),
    }


def _ratio(row, a, b):
    x, y = row["cpu_us_per_req"].get(a), row["cpu_us_per_req"].get(b)
    return x / y if x and y else None


def _verdict(row):
    row["tl_vs_uvloop"] = _ratio(row, "tideloop", "uvloop")
    row["tl_vs_c"] = _ratio(row, "tideloop", FLOOR)
    targets = TARGETS[row["kind"]]
    row["targets"] = dict(targets)
    if "tideloop" in row["errors"]:
        row["verdict"] = "ERROR"
        return
    if not targets:
        row["verdict"] = "info"
        return
    checks = []
    for ref, limit in targets.items():
        r = row["tl_vs_c"] if ref == FLOOR else row["tl_vs_uvloop"]
        checks.append(None if r is None else r <= limit)
    if None in checks:
        row["verdict"] = None            # n/a: a figure is missing
    else:
        row["verdict"] = "PASS" if all(checks) else "FAIL"


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def _fmt_size(n):
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def _fmt_rps(x):
    if x is None:
        return "-"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _fmt_us(x):
    if x is None:
        return "-"
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _fmt_ratio(x):
    return "-" if x is None else f"{x:.2f}x"


def _fmt_target(targets):
    if not targets:
        return "-"
    parts = []
    for ref, limit in targets.items():
        parts.append(f"<={limit:.2f}x {'C' if ref == FLOOR else 'uv'}")
    return ", ".join(parts)


def _progress(row, loops):
    bits = []
    for n in list(loops) + [FLOOR]:
        if n in row["errors"]:
            bits.append(f"{n}=ERROR")
        elif row["cpu_us_per_req"].get(n) is not None:
            bits.append(f"{n}={_fmt_us(row['cpu_us_per_req'][n])}us")
    return " ".join(bits)


def _columns(loops, floor):
    cols = list(loops) + ([FLOOR] if floor else [])
    return cols


def _table(rows, loops, floor):
    cols = _columns(loops, floor)
    label = {FLOOR: "C"}
    header = (["kind", "size", "conns"]
              + [f"{label.get(c, c)} rps" for c in cols]
              + [f"{label.get(c, c)} us/req" for c in cols]
              + ["tl/uv", "tl/C", "target (CPU/req)", "result"])
    body = []
    for r in rows:
        cells = [r["kind"], _fmt_size(r["size"]), str(r["conns"])]
        for c in cols:
            cells.append("ERROR" if c in r["errors"] else _fmt_rps(r["rps"].get(c)))
        for c in cols:
            cells.append("ERROR" if c in r["errors"] else _fmt_us(r["cpu_us_per_req"].get(c)))
        cells += [_fmt_ratio(r["tl_vs_uvloop"]), _fmt_ratio(r["tl_vs_c"]),
                  _fmt_target(r["targets"]), r["verdict"] or "n/a"]
        body.append(cells)
    return header, body


def format_text(rows, loops, floor):
    header, body = _table(rows, loops, floor)
    widths = [max(len(str(row[i])) for row in [header] + body) for i in range(len(header))]
    out = []
    left = {0, len(header) - 2}
    for j, row in enumerate([header] + body):
        out.append("  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_markdown(rows, loops, floor):
    header, body = _table(rows, loops, floor)
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join([":---", "---:", "---:"] + ["---:"] * (len(header) - 5)
                          + [":---", ":---"]) + "|"]
    for row in body:
        out.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(out)


def _python_cmd():
    exe = sys.executable or "python3"
    for short in ("python3", "python"):
        found = shutil.which(short)
        if found and os.path.realpath(found) == os.path.realpath(exe):
            return short
    return shlex.quote(exe)


def reproduce_command(args, cfg):
    parts = []
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        parts.append(f"PYTHONPATH={shlex.quote(pythonpath)}")
    parts += [_python_cmd(), shlex.quote(os.path.relpath(os.path.abspath(__file__)))]
    parts += ["--loops", ",".join(cfg.loops)]
    if args.quick:
        parts.append("--quick")
    parts += ["--repeat", str(cfg.repeat), "--duration", f"{cfg.duration:g}",
              "--warmup", f"{cfg.warmup:g}"]
    if args.only:
        parts += ["--only", ",".join(cfg.kinds)]
    if args.sizes:
        parts += ["--sizes", args.sizes]
    if args.conns:
        parts += ["--conns", args.conns]
    if cfg.unix:
        parts.append("--unix")
    if cfg.quiet_wait:
        parts += ["--quiet-wait", f"{cfg.quiet_wait:g}"]
    if not cfg.floor:
        parts.append("--no-floor")
    return " ".join(parts)


def _git_revision():
    try:
        out = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=5)
    except Exception:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def loop_versions(cfg):
    """What each loop name resolves to in the servers' environment."""
    code = (
        "import json, platform, sys\n"
        "out = {'asyncio': 'asyncio.SelectorEventLoop (CPython %s)' % platform.python_version()}\n"
        "try:\n"
        "    import uvloop; out['uvloop'] = 'uvloop %s' % uvloop.__version__\n"
        "except Exception as e: out['uvloop'] = 'not importable: %r' % e\n"
        "try:\n"
        "    import tideloop, tideloop._core as c\n"
        "    out['tideloop'] = 'tideloop %s (%s)' % (getattr(tideloop, '__version__', '?'), c.__file__)\n"
        "    out['tideloop_core'] = c.__file__\n"
        "except Exception as e: out['tideloop'] = 'not importable: %r' % e\n"
        "print(json.dumps(out))\n")
    try:
        proc = subprocess.run([cfg.python, "-c", code], capture_output=True, text=True,
                              env=cfg.env, cwd=ROOT, timeout=60)
        return json.loads(proc.stdout)
    except Exception as exc:
        return {"error": repr(exc)}


def file_digest(path):
    """sha256 (first 12 hex digits) and mtime of a file, or None."""
    if not path:
        return None
    try:
        import hashlib
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        return {"path": path, "sha256": digest,
                "mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(path)))}
    except OSError:
        return None


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def _int_list(text, what):
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"net.py: --{what} takes comma-separated integers")
    if not xs or min(xs) <= 0:
        raise SystemExit(f"net.py: --{what} takes positive integers")
    return xs


def build_parser():
    p = argparse.ArgumentParser(
        prog="bench/net.py",
        description="Echo-server benchmark for issue #3: Protocol, BufferedProtocol, "
                    "streams and sock_* servers on asyncio, uvloop and tideloop, and a "
                    "C epoll echo server as the floor, loaded by a C closed-loop load "
                    "generator; reports requests/s and the server's CPU time per "
                    "request (median of interleaved runs) and PASS/FAIL against the "
                    "issue's targets.")
    p.add_argument("--loops", default=",".join(ALL_LOOPS), metavar="LIST",
                   help="comma-separated loops, from: %(default)s (default: all)")
    p.add_argument("--only", default=None, metavar="LIST",
                   help="comma-separated kinds, from: " + ",".join(KINDS) + " (default: all)")
    p.add_argument("--sizes", default=None, metavar="LIST",
                   help="message sizes in bytes (default: 1024,10240,102400)")
    p.add_argument("--conns", default=None, metavar="LIST",
                   help="connection counts (default: 10,100)")
    p.add_argument("--repeat", "-r", type=int, default=3, metavar="N",
                   help="interleaved runs per cell and loop; the figure is the median "
                        "(default: %(default)s)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="measured seconds per run (default: 3, or 1 with --quick)")
    p.add_argument("--warmup", type=float, default=None, metavar="S",
                   help="unmeasured load before each run's window (default: 0.5, "
                        "or 0.25 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: 1 s runs and only the (1 KiB, 10 conns) and "
                        "(100 KiB, 100 conns) cells, unless --sizes/--conns are given")
    p.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                   help="before each run, wait up to S seconds for the machine to be "
                        "idle (other processes below 15 %% of a CPU); for shared "
                        "machines (default: 0, do not wait)")
    p.add_argument("--unix", action="store_true",
                   help="run everything over a Unix socket instead of TCP loopback")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="do not measure the C epoll echo server")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write every sample and the environment as JSON to PATH")
    p.add_argument("--markdown", action="store_true",
                   help="print the table as Markdown")
    p.add_argument("--rebuild", action="store_true",
                   help="recompile the C programs even when up to date")
    p.add_argument("--fail-on-miss", action="store_true",
                   help="exit with status 1 if tideloop misses a target or errors")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also print every sample")
    return p


class Config:
    pass


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
    cfg.kinds = list(KINDS)
    if args.only:
        chosen = [x.strip() for x in args.only.split(",") if x.strip()]
        bad = [x for x in chosen if x not in KINDS]
        if bad or not chosen:
            print(f"unknown kind(s) {', '.join(bad)}; choose from {', '.join(KINDS)}",
                  file=sys.stderr)
            return 2
        cfg.kinds = [k for k in KINDS if k in chosen]
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    cfg.repeat = args.repeat
    cfg.duration = args.duration if args.duration is not None else (1.0 if args.quick else 3.0)
    cfg.warmup = args.warmup if args.warmup is not None else (0.25 if args.quick else 0.5)
    if cfg.duration <= 0 or cfg.warmup < 0:
        print("--duration must be positive and --warmup not negative", file=sys.stderr)
        return 2
    sizes = _int_list(args.sizes, "sizes") if args.sizes else None
    conns = _int_list(args.conns, "conns") if args.conns else None
    if args.quick and not sizes and not conns:
        cfg.cells = list(QUICK_CELLS)
    else:
        cfg.cells = [(s, c) for s in (sizes or SIZES) for c in (conns or CONNS)]
    cfg.unix = args.unix
    cfg.quiet_wait = max(0.0, args.quiet_wait)
    cfg.floor = args.floor
    cfg.python = sys.executable or "python3"
    cfg.env = server_env()

    paths = build_c(force=args.rebuild, log=log)
    versions = loop_versions(cfg)
    core = versions.pop("tideloop_core", None) if "tideloop" in cfg.loops else None
    core_before = file_digest(core)
    cpus = _cpus()
    n_runs = len(cfg.kinds) * len(cfg.cells) * len(cfg.loops) * cfg.repeat \
        + (len(cfg.cells) * cfg.repeat if cfg.floor else 0)
    log(f"tideloop network benchmark: CPython {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, {cpus} CPU(s) shared by server and "
        f"loadgen (nothing pinned); {'Unix socket' if cfg.unix else 'TCP loopback'}; "
        f"median of {cfg.repeat} interleaved runs of {cfg.duration:g} s "
        f"(+{cfg.warmup:g} s warm-up); {n_runs} runs, "
        f"~{n_runs * (cfg.duration + cfg.warmup + 0.5) / 60:.1f} min\n")
    for name in cfg.loops:
        log(f"  {name:<9} {versions.get(name, '?')}\n")
    if "tideloop" in cfg.loops and not str(versions.get("tideloop", "")).startswith("tideloop "):
        log("tideloop is not importable in the servers' environment\n")
        return 2
    if cfg.floor:
        log(f"  {'C':<9} {os.path.relpath(paths['echo_server'], ROOT)} (epoll, level-triggered)\n")

    rows, floor = run_matrix(cfg, paths, log)
    elapsed = time.time() - started
    core_after = file_digest(core)
    core_changed = core_before != core_after
    command = reproduce_command(args, cfg)

    print()
    if args.markdown:
        print(format_markdown(rows, cfg.loops, cfg.floor))
    else:
        print(format_text(rows, cfg.loops, cfg.floor))
    print()
    reported = set()
    for r in rows:
        for name, err in r["errors"].items():
            key = (name, r["kind"], err) if name != FLOOR else (name, err)
            if key in reported:
                continue
            reported.add(key)
            where = "C server" if name == FLOOR else f"{name} {r['kind']}"
            print(f"error: {where} ({_fmt_size(r['size'])} x{r['conns']}): {err}")
    if args.verbose:
        for r in rows:
            for name, xs in r["samples"].items():
                print(f"samples {r['kind']:<9} {_fmt_size(r['size']):>7} x{r['conns']:<4} "
                      f"{name:<9} rps " + " ".join(_fmt_rps(x["rps"]) for x in xs)
                      + "  us/req " + " ".join(_fmt_us(x["cpu_us_per_req"]) for x in xs)
                      + "  server CPU " + " ".join(f"{x['server_cpu_util']:.0%}"
                                                   for x in xs if x.get("server_cpu_util") is not None)
                      + "  other " + " ".join(f"{x.get('other_cpu', 0):.0%}" for x in xs))
    print(f"rps = requests/s seen by loadgen; us/req = server CPU (utime+stime of the "
          f"server process, /proc/<pid>/stat) per request; median of {cfg.repeat} "
          f"interleaved runs; C = bench/echo_server.c, measured in the "
          f"{cfg.kinds[0]} cells; tl/uv and tl/C are ratios of us/req.")
    print(f"server and loadgen share {cpus} CPU(s), nothing pinned; "
          f"{'Unix socket' if cfg.unix else 'TCP loopback'}, one request outstanding "
          f"per connection, echoed bytes verified.")
    others = sorted(x.get("other_cpu", 0.0) for r in rows for xs in r["samples"].values()
                    for x in xs)
    others += sorted(x.get("other_cpu", 0.0) for f in floor.values() for x in f["samples"])
    others.sort()
    steals = sorted(x.get("steal_cpu", 0.0) for r in rows for xs in r["samples"].values()
                    for x in xs)
    if others:
        busy_runs = sum(1 for x in others if x > 0.10)
        print(f"other load during the measured windows: median {statistics.median(others):.0%} "
              f"of a CPU, max {others[-1]:.0%}; {busy_runs} of {len(others)} runs above 10 %"
              + (f"; hypervisor steal median {statistics.median(steals):.0%}" if steals else "")
              + (" -- figures are disturbed, rerun on a quiet machine" if busy_runs > len(others) // 5 else ""))
    if core_changed:
        print(f"warning: tideloop's core changed during the run "
              f"({core_before and core_before['sha256']} -> {core_after and core_after['sha256']}): "
              f"runs may mix two builds")
    print(f"reproduce: {command}")
    print(f"({elapsed:.1f} s)")

    if args.json:
        doc = {
            "format": "tideloop-netbench/1",
            "command": command,
            "argv": sys.argv,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "elapsed_s": round(elapsed, 3),
            "repeat": cfg.repeat, "duration_s": cfg.duration, "warmup_s": cfg.warmup,
            "quick": args.quick, "transport": "unix" if cfg.unix else "tcp",
            "quiet_wait_s": cfg.quiet_wait,
            "targets": {k: {("c_server" if r == FLOOR else r): v for r, v in t.items()}
                        for k, t in TARGETS.items()},
            "environment": {
                "python": sys.version.split()[0],
                "platform": platform.platform(),
                "cpus": cpus,
                "pinned": False,
                "git": _git_revision(),
                "loops": versions,
                "tideloop_core": {"before": core_before, "after": core_after,
                                  "changed_during_run": core_changed},
                "clk_tck": CLK_TCK,
            },
            "floor": [{"size": s, "conns": c, **v} for (s, c), v in floor.items()],
            "results": rows,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")

    if args.fail_on_miss and any(r["verdict"] in ("FAIL", "ERROR") for r in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
