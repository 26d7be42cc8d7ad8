"""Measuring loops in child processes (bench.net, bench.io): the C load
generators built on first use, the workers' environment and loop versions, a
server run under a C load generator, CPU time from /proc, the machine's other
load, and the lines that report it.  Linux only; standard library only.
"""

import json
import os
import platform
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import time

from tideloop._bench import harness

CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT = 15.0


# --------------------------------------------------------------------------
# The C programs, the workers' environment
# --------------------------------------------------------------------------

# Link flags of the C programs that need a library (the TLS ones: OpenSSL).
C_LIBS = {"tls_loadgen": ["-lssl", "-lcrypto"], "tls_echo_server": ["-lssl", "-lcrypto"]}
# Included by every program: a change rebuilds them all.
C_COMMON = "loadgen_common.h"
C_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]


def build_c(src_dir, names, prog, force=False, log=None):
    """Compile ``src_dir``/NAME.c into ``src_dir``/bin/NAME when missing or
    older than its source or C_COMMON (or ``force``), with C_FLAGS, linked
    with C_LIBS[NAME].  Returns {name: path}."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    bin_dir = os.path.join(src_dir, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    paths = {}
    for name in names:
        src = os.path.join(src_dir, name + ".c")
        exe = os.path.join(bin_dir, name)
        paths[name] = exe
        sources = [src] + [p for p in [os.path.join(src_dir, C_COMMON)] if os.path.exists(p)]
        if (not force and os.path.exists(exe)
                and os.path.getmtime(exe) >= max(map(os.path.getmtime, sources))):
            continue
        if not cc:
            raise SystemExit(f"{prog}: no C compiler (gcc/cc, or $CC) to build " + src)
        cmd = [cc, *C_FLAGS, "-o", exe, src] + C_LIBS.get(name, [])
        if log:
            log(f"build: {' '.join(shlex.quote(c) for c in cmd)}\n")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            hint = (" (OpenSSL's headers are missing: bash tools/ensure_libssl.sh installs them)"
                    if "openssl/" in proc.stderr else "")
            raise SystemExit(f"{prog}: compiling {src} failed{hint}")
    return paths


def worker_env(src):
    """The workers import tideloop from an explicit PYTHONPATH or an installed
    package first, else from the checkout's ``src`` (in-place build)."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Only an in-place build: without one, src/tideloop (whose _core is a
    # directory of C sources) would shadow the installed package.
    core = os.path.join(src, "tideloop", "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
    if os.path.exists(core) and src not in parts:
        parts.append(src)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.pop("PYTHONASYNCIODEBUG", None)
    env.pop("PYTHONDEVMODE", None)
    return env


_VERSIONS_CODE = """\
import json, sys
from tideloop._bench import harness
print(json.dumps(harness.loop_versions(sys.argv[1:] or harness.ALL_LOOPS)))
"""


def loop_versions(python, env, cwd, loops=()):
    """What each loop name (``loops``, or harness.ALL_LOOPS) resolves to in
    the workers' environment (harness.loop_versions run there), or
    {"error": ...}."""
    try:
        proc = subprocess.run([python, "-c", _VERSIONS_CODE, *loops],
                              capture_output=True, text=True, env=env, cwd=cwd, timeout=60)
        return json.loads(proc.stdout)
    except Exception as exc:
        return {"error": repr(exc)}


def python_openssl(python, env, cwd):
    """The OpenSSL the workers' ssl module is built with (ssl.OPENSSL_VERSION)."""
    return program_output([python, "-c", "import ssl; print(ssl.OPENSSL_VERSION)"],
                          env=env, cwd=cwd)


def program_output(cmd, env=None, cwd=None):
    """The first line a short command prints, or "? (<why>)"."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=30)
        line = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
        return line if proc.returncode == 0 and line else f"? (status {proc.returncode})"
    except Exception as exc:
        return f"? ({harness.exc_reason(exc)})"


def measurable_loops(loops, versions):
    """(the loops to measure, {loop: why not} for the others): ``loops`` less
    the reference loops (asyncio, uvloop) that do not import in the workers'
    environment (``versions``, loop_versions'), whose every run would fail.
    tideloop stays: log_loop_versions stops the run without it."""
    keep, skipped = [], {}
    for name in loops:
        version = str(versions.get(name) or "")
        if name != "tideloop" and version.startswith("not importable"):
            skipped[name] = version
        else:
            keep.append(name)
    return keep, skipped


def log_loop_versions(log, loops, versions, whose, skipped=None):
    """One line per loop (and per loop ``skipped``, measurable_loops'); False
    (and a line saying so) if tideloop is to be measured but does not import
    in ``whose`` environment, or no loop is left."""
    for name in loops:
        log(f"  {name:<9} {versions.get(name, '?')}\n")
    for name, why in (skipped or {}).items():
        extra = harness.BENCH_EXTRA if name in harness.ALL_LOOPS else harness.PEERS_EXTRA
        log(f"  {name:<9} skipped: {why} ({extra})\n")
    if not loops:
        log("no loop to measure\n")
        return False
    if "tideloop" in loops and not str(versions.get("tideloop", "")).startswith("tideloop "):
        log(f"tideloop is not importable in the {whose} environment\n")
        return False
    return True


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


class CoreWatch:
    """Notices a rebuild of tideloop's core (in place) during a run."""

    def __init__(self, versions, loops):
        self.path = versions.pop("tideloop_core", None) if "tideloop" in loops else None
        self.before = file_digest(self.path)
        self.after = None

    def finish(self):
        self.after = file_digest(self.path)

    @property
    def changed(self):
        return self.before != self.after

    def warning(self):
        """The line to print under the table, or None."""
        if not self.changed:
            return None
        return (f"warning: tideloop's core changed during the run "
                f"({self.before and self.before['sha256']} -> "
                f"{self.after and self.after['sha256']}): runs may mix two builds")


def environment(cpus, root, versions, core):
    """The "environment" of a driver's JSON."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": cpus,
        "pinned": False,
        "git": harness.git_revision(root),
        "loops": versions,
        "tideloop_core": {"before": core.before, "after": core.after,
                          "changed_during_run": core.changed},
        "clk_tck": CLK_TCK,
    }


def add_run_options(p, unit, duration_help, warmup_help, quick_help, quiet_wait_help):
    """--repeat, --duration, --warmup, --quick, --quiet-wait: what
    driver_config reads (with --loops, --only and --no-floor)."""
    p.add_argument("--repeat", "-r", type=int, default=3, metavar="N",
                   help=f"interleaved runs per {unit} and loop; the figure is the median "
                        "(default: %(default)s)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help=duration_help)
    p.add_argument("--warmup", type=float, default=None, metavar="S", help=warmup_help)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                   help="before each run, wait up to S seconds for the machine to be "
                        f"idle {quiet_wait_help}(default: 0, do not wait)")


class Config:
    pass


def command_flags(cfg):
    """The end of a driver's reproduce line: --quiet-wait, --no-floor."""
    parts = []
    if cfg.quiet_wait:
        parts += ["--quiet-wait", f"{cfg.quiet_wait:g}"]
    if not cfg.floor:
        parts.append("--no-floor")
    return parts


def driver_config(args, choices, what, durations, warmups, src):
    """The settings bench/net.py and bench/io.py share, checked: loops, the
    --only names (``what``: "kind", "workload") as ``cfg.only``, repeat,
    duration and warm-up (defaults: (with --quick, without)), quiet-wait,
    floor, the workers' interpreter and environment.  None after a usage
    error (said on stderr)."""
    cfg = Config()
    cfg.loops = harness.expand_loops(args.loops)
    if not cfg.loops:
        harness.usage_error("--loops names no loop")
        return None
    cfg.only = list(choices)
    if args.only:
        cfg.only = harness.pick(args.only, choices, what)
        if cfg.only is None:
            return None
    if args.repeat < 1:
        harness.usage_error("--repeat must be at least 1")
        return None
    cfg.repeat = args.repeat
    cfg.duration = args.duration if args.duration is not None else durations[not args.quick]
    cfg.warmup = args.warmup if args.warmup is not None else warmups[not args.quick]
    if cfg.duration <= 0 or cfg.warmup < 0:
        harness.usage_error("--duration must be positive and --warmup not negative")
        return None
    cfg.quiet_wait = max(0.0, args.quiet_wait)
    cfg.floor = args.floor
    cfg.python = sys.executable or "python3"
    cfg.env = worker_env(src)
    return cfg


# --------------------------------------------------------------------------
# CPU time, the machine's load
# --------------------------------------------------------------------------

def proc_times(pid):
    """(utime, stime) in seconds from /proc/<pid>/stat (all threads, 10 ms
    ticks), the sum of the threads' run time from schedstat (ns resolution)
    in seconds or None, and the process's minor page faults."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])     # fields 14, 15
    minflt = int(fields[7])                              # field 10
    sched = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                sched += int(f.read().split()[0])
        sched_s = sched / 1e9
    except (OSError, ValueError, IndexError):
        sched_s = None
    return utime / CLK_TCK, stime / CLK_TCK, sched_s, minflt


def machine_cpu():
    """(busy, steal) seconds of the whole machine from /proc/stat: busy is
    user+nice+system+irq+softirq over all CPUs, steal the hypervisor's."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    fields += [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


class Snapshot:
    """The machine's CPU counters (and a process's, given its pid) at one instant."""

    def __init__(self, pid=None):
        if pid is not None:
            self.user, self.system, self.sched, self.minflt = proc_times(pid)
            self.cpu = self.user + self.system
        self.busy, self.steal = machine_cpu()
        self.t = time.monotonic()


def other_load(start, end, accounted):
    """{"other_cpu", "steal_cpu"}: the CPU the rest of the machine used between
    two snapshots (busy time minus ``accounted`` seconds), and the
    hypervisor's steal, in CPUs (1.0 = one CPU all the time): what disturbed
    a sample."""
    seconds = end.t - start.t
    if seconds <= 0:
        return {}
    other = (end.busy - start.busy) - accounted
    return {"other_cpu": round(max(0.0, other) / seconds, 3),
            "steal_cpu": round((end.steal - start.steal) / seconds, 3)}


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


def load_line(samples, during, steal_samples=None):
    """The line under a table saying how much other load the runs saw, or None."""
    others = sorted(x.get("other_cpu", 0.0) for x in samples)
    if not others:
        return None
    steals = [x.get("steal_cpu", 0.0) for x in steal_samples or ()]
    busy = sum(1 for x in others if x > 0.10)
    return (f"other load during {during}: median {statistics.median(others):.0%} "
            f"of a CPU, max {others[-1]:.0%}; {busy} of {len(others)} runs above 10 %"
            + (f"; hypervisor steal median {statistics.median(steals):.0%}" if steals else "")
            + (" -- figures are disturbed, rerun on a quiet machine"
               if busy > len(others) // 5 else ""))


# --------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------

def finish_generator(gen):
    """Ends a C load generator (closing its stdin makes it close its sockets
    and exit; killed after 10 s) and returns its stderr."""
    gen.stdin.close()
    try:
        gen.wait(10)
    except subprocess.TimeoutExpired:
        gen.kill()
        gen.wait()
    return gen.stderr.read().decode(errors="replace").strip()


def stderr_reason(path, prog, fallback):
    """Why a worker failed: its "<prog>: ERROR: ..." line (harness.worker_main),
    else the last line of its stderr, else ``fallback``."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return fallback
    marker = f"{prog}: ERROR:"
    for ln in reversed(lines):
        if ln.startswith(marker):
            return ln[len(marker):].strip()
    return lines[-1][:300] if lines else fallback


def read_line(proc, deadline):
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


def stop(proc):
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


def run_under_load(server_cmd, generator_cmd, *, env, cwd, errlog, prog, generator,
                   seconds):
    """One run of a server under a C load generator (loadgen, udpgen).

    Starts ``server_cmd`` (a fresh process) and waits for its "READY <where>";
    runs ``generator_cmd(where)``, which prints "START" when its warm-up ends
    and then one JSON line, and keeps its connections (--hold) until its stdin
    closes; snapshots the server's and the machine's CPU at both lines; then
    stops both.  Returns (result, start, end); raises harness.RunError
    (``startup`` for a server that never became ready)."""
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(server_cmd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, env=env, cwd=cwd)
    gen = None
    try:
        line = read_line(proc, time.monotonic() + READY_TIMEOUT)
        if line is None or not line.startswith("READY"):
            stop(proc)
            why = "no READY within %gs" % READY_TIMEOUT if proc.returncode is None \
                else f"exit status {proc.returncode} before READY"
            raise harness.RunError(stderr_reason(errlog, prog, why), startup=True)
        where = line.split()[1] if len(line.split()) > 1 else None
        gen = subprocess.Popen(generator_cmd(where), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + seconds + 30
        start = end = result = None
        while True:
            line = read_line(gen, deadline)
            if line is None:
                break
            if line == "START":
                start = Snapshot(proc.pid)
            elif line.startswith("{"):
                end = Snapshot(proc.pid)
                result = json.loads(line)
                break
        alive = proc.poll() is None
        gen_err = finish_generator(gen)
        if not alive:
            raise harness.RunError("server exited during the run: "
                                   + stderr_reason(errlog, prog, f"status {proc.returncode}"))
        if result is None or start is None:
            raise harness.RunError(f"{generator} failed: "
                                   + (gen_err.splitlines()[-1] if gen_err
                                      else f"status {gen.returncode}"))
        return result, start, end
    finally:
        if gen is not None and gen.poll() is None:
            gen.kill()
            gen.wait()
        stop(proc)


def children_cpu():
    """utime+stime of this process's waited-for children, in seconds."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_to_result(cmd, *, env, cwd, errlog, prog, timeout, startup_failed):
    """Run a worker that measures itself to completion: its last stdout line
    that is a JSON object is the result.  Returns (result, start, end,
    children): Snapshots of the machine around the run and the CPU seconds
    of the children waited for meanwhile (the worker's and its own).  Raises
    harness.RunError: no result within ``timeout`` seconds, a non-zero status
    or no result (``startup`` when ``startup_failed(errlog)``: the worker's
    "<prog>: ERROR:" says it could not start at all)."""
    children0 = children_cpu()
    start = Snapshot()
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, env=env, cwd=cwd)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise harness.RunError(f"no result within {timeout:g} s")
    end = Snapshot()
    children = children_cpu() - children0
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise harness.RunError(stderr_reason(errlog, prog, f"exit status {proc.returncode}"),
                               startup=proc.returncode == 1 and startup_failed(errlog))
    return json.loads(lines[-1]), start, end, children


def server_figures(result, start, end):
    """What every server-under-load sample records: the generator's counts,
    the server's CPU in the window, the machine's other load."""
    cpu = end.cpu - start.cpu
    seconds = end.t - start.t
    sample = {
        "requests": result["requests"],
        "seconds": result["seconds"],
        "server_cpu_s": round(cpu, 4),
        "server_cpu_util": round(cpu / seconds, 3) if seconds > 0 else None,
        "latency_us": result["latency_us"],
        "client_cpu_s": result["client_cpu_s"],
        # A server that maps and unmaps memory per request (a large read
        # buffer made and freed each time, or glibc trimming the heap top
        # and growing it back) shows here: its CPU per request is that.
        "minflt_per_req": (round((end.minflt - start.minflt) / result["requests"], 3)
                           if result["requests"] else None),
    }
    sample.update(other_load(start, end, cpu + result["client_cpu_s"]))
    return sample
