#!/usr/bin/env python3
"""Real-app benchmark: web servers, database and cache
clients and websockets on asyncio, uvloop and tideloop, with the services
they talk to started by this script.

    python -m bench.apps                                  # every row, 3 repeats: ~8 min
    python -m bench.apps --quick --repeat 1               # CI smoke, ~1 min
    python -m bench.apps --only uvicorn-text,redis --repeat 5
    python -m bench.apps --markdown --json results/apps.json

Rows (bench/apps_worker.py is the Python side, bench/apps_app.py the apps):

  aiohttp-text, aiohttp-json    aiohttp.web.run_app on the loop, GET /text
                                ("Hello, World!") or /json ({"message": ...})
  uvicorn-text, uvicorn-json    the same endpoints in Starlette under uvicorn
                                (loop= the loop's name, http="auto": httptools)
  gunicorn-uvicorn              gunicorn -w 2 with uvicorn workers (GET /text):
                                apps_app.AsyncioUvicornWorker, uvicorn_worker.
                                UvicornWorker (uvloop), tideloop.workers.UvicornWorker
  gunicorn-aiohttp              gunicorn -w 2 with aiohttp workers (GET /text):
                                aiohttp.GunicornWebWorker, GunicornUVLoopWebWorker,
                                tideloop.workers.AiohttpWorker
      -- loaded by `wrk -t1 -c50` (50 keep-alive connections) for --duration
         seconds after a --warmup run; one op = one request; CPU = the server's
         process (gunicorn: its 2 workers, summed) from /proc/<pid>/stat
  asyncpg-query                 pool of 10, 50 tasks, 5,000 `SELECT $1::int`
  asyncpg-copy, asyncpg-fetch   copy_records_to_table / fetch of 100,000 rows,
                                5 times; one op = one row
  redis, redis-pipeline         redis.asyncio SET/GET, 50 tasks each awaiting
                                its commands / pipelines of 100, 10 at a time
  websockets                    websockets echo server and 10 client
                                connections in one process, 10,000 messages
      -- one op = one query / row / command / message; CPU = the client
         process's (RUSAGE_SELF) during the measured operations, after a
         warm-up of a tenth of them; PostgreSQL's and redis-server's own CPU
         is not counted

Every run is a fresh process.  For each row, repetition r runs the loops in an
order rotated by r; each figure is the median of the R repetitions.  Target:
tideloop's CPU per op <= 0.90 x uvloop's on every row.

Services: wrk, redis-server and PostgreSQL come from Debian
(tools/ensure_debian_package.sh installs what is missing); PostgreSQL runs as
a throw-away cluster (tools/pgcluster.py), redis-server on a free port with
--save '' --appendonly no; both are stopped at the end.  A row whose service
or Python package is missing is skipped, saying why; a run that fails is an
ERROR and makes the exit status 1 (a slow figure does not, unless
--fail-on-miss).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench import plot, procs
from tideloop._bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
TOOLS = os.path.join(ROOT, "tools")
WORKER_PY = ["-m", "bench.apps_worker"]   # run from the checkout's root (cwd=ROOT)
ENSURE_DEBIAN = os.path.join(TOOLS, "ensure_debian_package.sh")

FORMAT = "tideloop-appbench/1"
TARGETS = {"uvloop": 0.90}                  # tideloop CPU per op / uvloop's <= 0.90
HTTP_CONNS = 50
GUNICORN_WORKERS = 2
PRIME_PER_PROCESS = 4      # prime(): gunicorn's kernel picks the worker of a connection
POOL_SIZE = 10
RUN_TIMEOUT = 300.0
START_TIMEOUT = 30.0

TEXT_BODY = len("Hello, World!")
JSON_BODY = len('{"message":"Hello, World!"}')


class Row:
    """One line of the table.  ``how``: "server" (a worker process loaded by
    wrk), "gunicorn" (gunicorn's master and 2 workers loaded by wrk) or
    "client" (a worker process that measures itself)."""

    def __init__(self, name, how, op, needs, services=(), size=None, conns=None,
                 path="/text", count=None, quick_count=None, **params):
        self.name, self.how, self.op = name, how, op
        self.needs = needs              # Python modules the worker imports
        self.services = services        # "wrk", "redis", "postgresql"
        self.size, self.conns, self.path = size, conns, path
        self.count, self.quick_count = count, quick_count
        self.params = params

    def label(self, count=None, rounds=None):
        if self.how in ("server", "gunicorn"):
            workers = f", {GUNICORN_WORKERS} workers" if self.how == "gunicorn" else ""
            return f"GET {self.path} x{self.conns}{workers}"
        p = self.params
        if self.name == "asyncpg-query":
            return f"{count:,} queries, pool {POOL_SIZE}, {self.conns} tasks"
        if self.name.startswith("asyncpg-"):
            what = "COPY" if self.name.endswith("copy") else "fetch"
            return f"{what} {count:,} rows x{rounds or p['rounds']}"
        if self.name == "redis":
            return f"{count:,} SET/GET, {self.conns} tasks"
        if self.name == "redis-pipeline":
            return f"{count:,} cmds, pipelines of {p['batch']}, {self.conns} at a time"
        return f"{count:,} msgs, {self.conns} conns"


_HTTP = ("wrk",)
ROWS = [
    Row("aiohttp-text", "server", "req", ("aiohttp",), _HTTP, TEXT_BODY, HTTP_CONNS,
        server="aiohttp"),
    Row("aiohttp-json", "server", "req", ("aiohttp",), _HTTP, JSON_BODY, HTTP_CONNS,
        path="/json", server="aiohttp"),
    Row("uvicorn-text", "server", "req", ("uvicorn", "starlette"), _HTTP, TEXT_BODY,
        HTTP_CONNS, server="uvicorn"),
    Row("uvicorn-json", "server", "req", ("uvicorn", "starlette"), _HTTP, JSON_BODY,
        HTTP_CONNS, path="/json", server="uvicorn"),
    Row("gunicorn-uvicorn", "gunicorn", "req",
        ("gunicorn", "uvicorn_worker", "uvicorn", "starlette"), _HTTP, TEXT_BODY, HTTP_CONNS,
        app="bench.apps_app:asgi_app",
        workers={"asyncio": "bench.apps_app.AsyncioUvicornWorker",
                 "uvloop": "uvicorn_worker.UvicornWorker",
                 "tideloop": "tideloop.workers.UvicornWorker"}),
    Row("gunicorn-aiohttp", "gunicorn", "req", ("gunicorn", "aiohttp"), _HTTP, TEXT_BODY,
        HTTP_CONNS, app="bench.apps_app:make_aiohttp_app",
        workers={"asyncio": "aiohttp.GunicornWebWorker",
                 "uvloop": "aiohttp.GunicornUVLoopWebWorker",
                 "tideloop": "tideloop.workers.AiohttpWorker"}),
    Row("asyncpg-query", "client", "query", ("asyncpg",), ("postgresql",), conns=50,
        count=5000, quick_count=1000),
    Row("asyncpg-copy", "client", "row", ("asyncpg",), ("postgresql",), conns=POOL_SIZE,
        count=100000, quick_count=20000, rounds=5),
    Row("asyncpg-fetch", "client", "row", ("asyncpg",), ("postgresql",), conns=POOL_SIZE,
        count=100000, quick_count=20000, rounds=5),
    Row("redis", "client", "cmd", ("redis",), ("redis",), conns=50, count=20000,
        quick_count=4000),
    Row("redis-pipeline", "client", "cmd", ("redis",), ("redis",), conns=10, count=100000,
        quick_count=20000, batch=100),
    Row("websockets", "client", "msg", ("websockets",), conns=10, count=10000,
        quick_count=2000),
]
ROW_NAMES = tuple(r.name for r in ROWS)
QUICK_ROUNDS = 1

# What the workers import, whose versions the JSON keeps.
FRAMEWORKS = ("aiohttp", "uvicorn", "starlette", "httptools", "gunicorn", "uvicorn_worker",
              "asyncpg", "redis", "hiredis", "websockets")
DEBIAN = {"wrk": ("wrk", "wrk"), "redis": ("redis-server", "redis-server"),
          "postgresql": ("postgresql", None)}     # service -> (package, binary)


# --------------------------------------------------------------------------
# Pure helpers (tests/tooling/test_bench_apps.py)
# --------------------------------------------------------------------------

WRK_MARK = "WRKJSON "
# wrk's done() hook: one line with the summary as JSON (wrk's own report above
# it stays for a reader and for parse_wrk's fallback).
WRK_LUA = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p99": %d, "max": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(text):
    """wrk's output -> {"requests", "seconds", "rps", "errors": {...},
    "latency_us": {...} (only from the done() hook)}.  The done() hook's
    WRKJSON line is used when present; otherwise wrk's own report ("N requests
    in 5.00s", "Socket errors: connect a, read b, write c, timeout d",
    "Non-2xx or 3xx responses: n").  Raises ValueError when neither is there."""
    for line in text.splitlines():
        if line.startswith(WRK_MARK):
            d = json.loads(line[len(WRK_MARK):])
            seconds = d["duration_us"] / 1e6
            return {"requests": d["requests"], "seconds": seconds,
                    "rps": d["requests"] / seconds if seconds > 0 else 0.0,
                    "errors": d["errors"], "latency_us": d["latency_us"],
                    "bytes": d["bytes"]}
    m = re.search(r"^\s*(\d+) requests in ([\d.]+\w+),", text, re.M)
    if not m:
        raise ValueError("no 'N requests in T' line in wrk's output"
                         + (f": {text.strip().splitlines()[-1]}" if text.strip() else ""))
    requests, seconds = int(m.group(1)), _seconds(m.group(2))
    errors = {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        for key, value in zip(("connect", "read", "write", "timeout"), m.groups()):
            errors[key] = int(value)
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        errors["status"] = int(m.group(1))
    return {"requests": requests, "seconds": seconds,
            "rps": requests / seconds if seconds > 0 else 0.0,
            "errors": errors, "latency_us": None, "bytes": None}


def summarise(name, label, op, size, conns, samples, errors, skipped=None):
    """One result row, in bench/net.py's layout: kind, size, conns, rps and
    cpu_us_per_req per loop (here: ops/s and CPU us per op), samples, errors,
    the ratios, targets, checked and verdict; plus label, op and skipped."""
    row = {
        "kind": name, "label": label, "op": op, "size": size, "conns": conns,
        "rps": harness.medians(samples, errors, "rps"),
        "cpu_us_per_req": harness.medians(samples, errors, "cpu_us_per_req"),
        "samples": {n: s for n, s in samples.items() if s},
        "errors": dict(errors),
        "skipped": skipped,
    }
    verdict(row)
    return row


def verdict(row):
    cpu = row["cpu_us_per_req"]
    row["tl_vs_asyncio"] = harness.ratio(cpu.get("tideloop"), cpu.get("asyncio"))
    row["tl_vs_uvloop"] = harness.ratio(cpu.get("tideloop"), cpu.get("uvloop"))
    row["tl_vs_c"] = None
    row["targets"] = dict(TARGETS)
    row["target_metric"] = "cpu_us_per_req"
    row["checked"] = {ref: harness.ratio(cpu.get("tideloop"), cpu.get(ref)) for ref in TARGETS}
    if row.get("skipped"):
        row["verdict"] = "SKIP"
    elif row["errors"]:
        row["verdict"] = "ERROR"
    elif None in row["checked"].values():
        row["verdict"] = None
    else:
        row["verdict"] = ("PASS" if all(row["checked"][r] <= lim for r, lim in TARGETS.items())
                          else "FAIL")


def exit_status(rows, fail_on_miss=False):
    """1 if a run failed (ERROR), or with ``fail_on_miss`` a target was
    missed; skipped rows (a service or package not there) do not count."""
    bad = {"ERROR"} | ({"FAIL"} if fail_on_miss else set())
    return 1 if any(r["verdict"] in bad for r in rows) else 0


# --------------------------------------------------------------------------
# Services
# --------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on port {port} "
                                   f"within {timeout:g} s")
            time.sleep(0.05)


def _has_postgresql():
    import glob
    return bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def _service_present(service):
    if service == "postgresql":
        return _has_postgresql()
    return shutil.which(DEBIAN[service][1]) is not None


def ensure_services(services, log):
    """Install the Debian packages of ``services`` that are missing (one call
    of tools/ensure_debian_package.sh).  Returns {service: why it is missing}
    for those still missing."""
    missing = [s for s in services if not _service_present(s)]
    if not missing:
        return {}
    pkgs = [DEBIAN[s][0] for s in missing]
    log(f"installing {' '.join(pkgs)} (tools/ensure_debian_package.sh)\n")
    try:
        proc = subprocess.run(["bash", ENSURE_DEBIAN, *pkgs], capture_output=True, text=True,
                              timeout=900)
        why = (proc.stderr.strip().splitlines() or [f"status {proc.returncode}"])[-1]
    except Exception as exc:
        why = harness.exc_reason(exc)
    return {s: f"{DEBIAN[s][0]} is not installed and installing it failed ({why})"
            for s in missing if not _service_present(s)}


class Redis:
    def __init__(self, workdir):
        self.port = free_port()
        self.log = os.path.join(workdir, "redis.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--daemonize", "no",
                 "--dir", workdir, "--protected-mode", "no"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port, self.proc, 15, "redis-server")
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}: {_tail(self.log)}") from None

    def stop(self):
        procs.stop(self.proc)


def _tail(path, n=1):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
        return " / ".join(lines[-n:]) or "(no output)"
    except OSError:
        return "(no log)"


def start_postgresql():
    from tools.pgcluster import PgCluster
    return PgCluster().start()


class Services:
    """The services the selected rows need, started once for the whole run."""

    def __init__(self, rows, workdir, log):
        self.rows, self.workdir, self.log = rows, workdir, log
        self.missing = {}          # service -> reason
        self.redis = self.pg = None

    def __enter__(self):
        wanted = sorted({s for r in self.rows for s in r.services})
        self.missing = ensure_services(wanted, self.log)
        if "redis" in wanted and "redis" not in self.missing:
            try:
                self.redis = Redis(self.workdir)
                self.log(f"  redis-server on port {self.redis.port}\n")
            except Exception as exc:
                self.missing["redis"] = f"redis-server did not start ({harness.exc_reason(exc)})"
        if "postgresql" in wanted and "postgresql" not in self.missing:
            try:
                self.pg = start_postgresql()
                self.log(f"  PostgreSQL ({self.pg.bindir}) on port {self.pg.port}\n")
            except Exception as exc:
                self.missing["postgresql"] = (f"PostgreSQL did not start "
                                              f"({harness.exc_reason(exc).splitlines()[0]})")
        return self

    def __exit__(self, *exc):
        if self.redis is not None:
            self.redis.stop()
        if self.pg is not None:
            self.pg.stop()

    def versions(self):
        out = {}
        if "wrk" in {s for r in self.rows for s in r.services} and shutil.which("wrk"):
            out["wrk"] = procs.program_output(["sh", "-c", "wrk --version 2>&1 | head -1"])
        if self.redis is not None:
            out["redis"] = procs.program_output(["redis-server", "--version"])
        if self.pg is not None:
            out["postgresql"] = procs.program_output(
                [os.path.join(self.pg.bindir, "postgres"), "--version"])
        return out


_FRAMEWORKS_CODE = """\
import importlib, importlib.metadata as md, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        out[name] = None
        continue
    try:
        out[name] = md.version(name.replace("_", "-"))
    except Exception:
        out[name] = "?"
print(json.dumps(out))
"""


def framework_versions(cfg):
    """{module: version, or None when it does not import} in the workers'
    environment."""
    try:
        proc = subprocess.run([cfg.python, "-c", _FRAMEWORKS_CODE, *FRAMEWORKS],
                              capture_output=True, text=True, env=cfg.env, cwd=ROOT, timeout=120)
        return json.loads(proc.stdout)
    except Exception as exc:
        return {"error": harness.exc_reason(exc)}


def skip_reason(row, services, frameworks):
    for s in row.services:
        if s in services.missing:
            return services.missing[s]
    absent = [m for m in row.needs if not frameworks.get(m)]
    if absent:
        return (f"Python package(s) {', '.join(absent)} not importable "
                f"(pip install '.[bench-apps]')")
    return None


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------

def run_wrk(cfg, url, seconds, script):
    """wrk -t1 -cN -dS with the done() hook; its parsed result and CPU."""
    cmd = ["wrk", "-t1", f"-c{HTTP_CONNS}", f"-d{seconds:g}s", "--timeout", "10s",
           "-s", script, url]
    c0 = procs.children_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    wrk_cpu = procs.children_cpu() - c0
    if proc.returncode != 0:
        raise harness.RunError(f"wrk failed (status {proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    try:
        result = parse_wrk(proc.stdout)
    except ValueError as exc:
        raise harness.RunError(str(exc))
    result["wrk_cpu_s"] = wrk_cpu
    return result


def _check_wrk(result, what):
    bad = {k: v for k, v in result["errors"].items() if v}
    if bad:
        raise harness.RunError(f"wrk counted errors in the {what}: "
                               + ", ".join(f"{k} {v}" for k, v in bad.items()))
    if not result["requests"]:
        raise harness.RunError(f"no request completed in the {what}")


def cpu_of(pids):
    """Summed (utime, stime, sched) of ``pids`` from /proc."""
    u = s = sched = 0.0
    for pid in pids:
        pu, ps, psched, _ = procs.proc_times(pid)
        u, s = u + pu, s + ps
        sched = None if sched is None or psched is None else sched + psched
    return u, s, sched


class Probe:
    """CPU of some processes and of the machine at one instant."""

    def __init__(self, pids):
        self.user, self.system, self.sched = cpu_of(pids)
        self.cpu = self.user + self.system
        self.busy, self.steal = procs.machine_cpu()
        self.t = time.monotonic()


def prime(port, path, count=1):
    """``count`` requests for ``path``, one at a time, each on its own keep-alive
    connection (the request wrk sends), before any load.

    A server's first request then runs to its end on its own, on every loop.
    Otherwise how many requests a loop starts before the first one finishes
    lasts for the whole process on CPython 3.11: the attribute names a class's
    instances share (its cached keys) stop growing once ~30 instances exist,
    so an attribute first set after that -- aiohttp's StreamWriter sets
    ``buffer_size`` and ``output_size`` only when it writes -- makes every
    later instance build its own __dict__ (about +4k interpreter instructions
    per aiohttp request, bench/apps_calls.py --callgrind).  Under wrk's 50
    connections at once, tideloop (which, as asyncio, accepts the pending
    connections and reads their requests in one pass) made 11-50 writers
    before the first response, uvloop 4-10."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(request)
            buf = b""
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    m = re.search(rb"(?im)^content-length:\s*(\d+)", buf[:end])
                    if m is None or len(buf) >= end + 4 + int(m.group(1)):
                        break
                chunk = sock.recv(65536)
                if not chunk:
                    raise harness.RunError(f"the server closed the priming request for {path}")
                buf += chunk


def measure_http(cfg, row, pids, port, script, check_pids=None):
    """Priming requests (prime()), a warm-up wrk run, then the measured one
    between two probes of ``pids``' CPU.  Returns the sample."""
    url = f"http://127.0.0.1:{port}{row.path}"
    prime(port, row.path, PRIME_PER_PROCESS * len(pids))
    _check_wrk(run_wrk(cfg, url, cfg.warmup, script), "warm-up")
    start = Probe(pids)
    result = run_wrk(cfg, url, cfg.duration, script)
    end = Probe(pids)
    if check_pids is not None:
        check_pids()
    _check_wrk(result, "measured run")
    cpu = end.cpu - start.cpu
    n = result["requests"]
    sample = {
        "rps": result["rps"], "cpu_us_per_req": cpu / n * 1e6,
        "requests": n, "seconds": result["seconds"],
        "server_cpu_s": round(cpu, 4),
        "server_utime_s": round(end.user - start.user, 4),
        "server_stime_s": round(end.system - start.system, 4),
        "server_cpu_util": round(cpu / (end.t - start.t), 3),
        "latency_us": result["latency_us"],
        "client_cpu_s": round(result["wrk_cpu_s"], 4),
        "processes": len(pids),
    }
    if start.sched is not None and end.sched is not None:
        sample["sched_us_per_req"] = (end.sched - start.sched) / n * 1e6
    sample.update(procs.other_load(start, end, cpu + result["wrk_cpu_s"]))
    return sample


def worker_command(cfg, loop, row, count=None, services=None, window=False):
    cmd = [cfg.python, *WORKER_PY, "--loop", loop]
    if row.how == "server":
        return cmd + ["--kind", row.params["server"], "--port", "0"]
    cmd += ["--kind", row.name, "--count", str(count), "--concurrency", str(row.conns)]
    if "rounds" in row.params:
        cmd += ["--rounds", str(cfg.rounds)]
    if "batch" in row.params:
        cmd += ["--batch", str(row.params["batch"])]
    if row.name.startswith("asyncpg"):
        cmd += ["--dsn", services.pg.dsn]
    if row.name.startswith("redis"):
        cmd += ["--port", str(services.redis.port)]
    if window:
        cmd.append("--window")
    return cmd


def _reason(errlog, fallback):
    return procs.stderr_reason(errlog, "apps_worker", fallback)


def _startup_failed(errlog):
    return _reason(errlog, "").startswith(("ModuleNotFoundError", "ImportError"))


def run_server(cfg, loop, row, workdir, script):
    errlog = os.path.join(workdir, "server.err")
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(worker_command(cfg, loop, row), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, env=cfg.env, cwd=ROOT)
    try:
        line = procs.read_line(proc, time.monotonic() + START_TIMEOUT)
        if line is None or not line.startswith("READY "):
            procs.stop(proc)
            raise harness.RunError(_reason(errlog, f"no READY within {START_TIMEOUT:g} s"
                                           if proc.returncode is None
                                           else f"exit status {proc.returncode}"),
                                   startup=_startup_failed(errlog))
        port = int(line.split()[1])

        def alive():
            if proc.poll() is not None:
                raise harness.RunError("server exited during the run: "
                                       + _reason(errlog, f"status {proc.returncode}"))

        sample = measure_http(cfg, row, [proc.pid], port, script, check_pids=alive)
        alive()
        return sample
    finally:
        procs.stop(proc)


def gunicorn_workers(master):
    """The pids of the master's children."""
    try:
        with open(f"/proc/{master}/task/{master}/children") as f:
            return sorted(int(p) for p in f.read().split())
    except OSError:
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        stat = f.read()
                    if int(stat[stat.rindex(")") + 2:].split()[1]) == master:
                        out.append(int(d))
                except (OSError, ValueError):
                    pass
        return sorted(out)


def gunicorn_command(cfg, loop, row, port):
    return [cfg.python, "-m", "gunicorn", "-w", str(GUNICORN_WORKERS),
            "-k", row.params["workers"][loop], "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "2", "--log-level", "warning", row.params["app"]]


def run_gunicorn(cfg, loop, row, workdir, script):
    errlog = os.path.join(workdir, "gunicorn.err")
    port = free_port()
    env = dict(cfg.env)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(gunicorn_command(cfg, loop, row, port), stdin=subprocess.DEVNULL,
                                stdout=err, stderr=err, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        workers = []
        while True:
            if proc.poll() is not None:
                raise harness.RunError(f"gunicorn exited with status {proc.returncode}: "
                                       + _tail(errlog, 2), startup=True)
            workers = gunicorn_workers(proc.pid)
            if len(workers) == GUNICORN_WORKERS and _http_ok(port, row.path):
                break
            if time.monotonic() > deadline:
                raise harness.RunError(f"gunicorn did not answer within {START_TIMEOUT:g} s "
                                       f"({len(workers)} workers): " + _tail(errlog, 2),
                                       startup=True)
            time.sleep(0.1)

        def same_workers():
            now = gunicorn_workers(proc.pid)
            if now != workers:
                raise harness.RunError(f"gunicorn's workers changed during the run "
                                       f"({workers} -> {now}): " + _tail(errlog, 2))

        sample = measure_http(cfg, row, workers, port, script, check_pids=same_workers)
        sample["master_pid"], sample["worker_pids"] = proc.pid, workers
        return sample
    finally:
        procs.stop(proc)


def _http_ok(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def run_client(cfg, loop, row, workdir, services):
    r, start, end, children = procs.run_to_result(
        worker_command(cfg, loop, row, cfg.counts[row.name], services), env=cfg.env,
        cwd=ROOT, errlog=os.path.join(workdir, "client.err"), prog="apps_worker",
        timeout=RUN_TIMEOUT, startup_failed=_startup_failed)
    sample = {"rps": r["ops"] / r["wall_s"], "cpu_us_per_req": r["cpu_s"] / r["ops"] * 1e6,
              "requests": r["ops"], "seconds": r["wall_s"], "cpu_s": r["cpu_s"],
              "utime_s": r["utime_s"], "stime_s": r["stime_s"]}
    # the rest of the machine while the client ran (start-up included; the
    # services' work for it too)
    sample.update(procs.other_load(start, end, children))
    return sample


def run_once(cfg, loop, row, workdir, services, script):
    if row.how == "server":
        return run_server(cfg, loop, row, workdir, script)
    if row.how == "gunicorn":
        return run_gunicorn(cfg, loop, row, workdir, script)
    return run_client(cfg, loop, row, workdir, services)


def run_rows(cfg, rows, services, frameworks, workdir, log):
    script = os.path.join(workdir, "done.lua")
    with open(script, "w") as f:
        f.write(WRK_LUA)
    startup_errors = {}
    results = []
    for row in rows:
        count = cfg.counts.get(row.name)
        label = row.label(count, cfg.rounds)
        log(f"  {row.name:<17} {label:<40}")
        skipped = skip_reason(row, services, frameworks)
        if skipped:
            log(f" skipped: {skipped}\n")
            results.append(summarise(row.name, label, row.op, row.size, row.conns, {}, {},
                                     skipped=skipped))
            continue

        def measure(name):
            if cfg.quiet_wait:
                procs.wait_quiet(cfg.quiet_wait)
            try:
                return run_once(cfg, name, row, workdir, services, script)
            except harness.RunError as exc:
                if exc.startup:
                    startup_errors[(name, row.how, row.needs)] = str(exc)
                raise

        samples, errors = harness.interleave(
            cfg.loops, cfg.repeat, measure, log=log,
            errors={n: startup_errors[(n, row.how, row.needs)] for n in cfg.loops
                    if (n, row.how, row.needs) in startup_errors})
        res = summarise(row.name, label, row.op, row.size, row.conns, samples, errors)
        log(" " + " ".join(f"{n}=ERROR" if n in res["errors"] else
                           f"{n}={_fmt_us(res['cpu_us_per_req'].get(n))}"
                           for n in cfg.loops) + f" us/{row.op}\n")
        results.append(res)
    return results


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

LABEL = {"asyncio": "aio", "uvloop": "uv", "tideloop": "tl"}


def _fmt_rate(x):
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _fmt_us(x):
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 \
        else f"{x:,.0f}"


def _target_text():
    return ", ".join(f"<={v:.2f}x {LABEL[k]}" for k, v in TARGETS.items())


def table(rows, loops):
    header = (["row", "what", "op"] + [f"{LABEL[c]} ops/s" for c in loops]
              + [f"{LABEL[c]} us/op" for c in loops]
              + ["tl/aio", "tl/uv", "target (CPU/op)", "result"])
    body = []
    for r in rows:
        cells = [r["kind"], r["label"], r["op"]]
        for metric, fmt in (("rps", _fmt_rate), ("cpu_us_per_req", _fmt_us)):
            for c in loops:
                cells.append("skip" if r["skipped"] else "ERROR" if c in r["errors"]
                             else fmt(r[metric].get(c)))
        cells += [harness.fmt_ratio(r["tl_vs_asyncio"]), harness.fmt_ratio(r["tl_vs_uvloop"]),
                  _target_text(), harness.result_cell(r["verdict"], r["tl_vs_asyncio"], loops)]
        body.append(cells)
    return header, body


def format_text(rows, loops):
    header, body = table(rows, loops)
    return harness.text_table(header, body, left={0, 1, 2, len(header) - 2})


def format_markdown(rows, loops):
    header, body = table(rows, loops)
    return harness.markdown_table(header, body, left={0, 1, 2, len(header) - 2,
                                                      len(header) - 1})


def reproduce_command(args, cfg):
    parts = harness.command_prefix(["-m", "bench.apps"], cfg.loops,
                                   args.quick, cfg.repeat)
    if any(r.how != "client" for r in cfg.rows):
        parts += ["--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}"]
    if args.only:
        parts += ["--only", ",".join(r.name for r in cfg.rows)]
    if args.scale != 1.0:
        parts += ["--scale", f"{args.scale:g}"]
    if cfg.quiet_wait:
        parts += ["--quiet-wait", f"{cfg.quiet_wait:g}"]
    return " ".join(parts)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.apps",
        description="Real-app benchmark: aiohttp and uvicorn+Starlette "
                    "servers (alone and as gunicorn's 2 workers) under wrk, asyncpg "
                    "and redis-py clients against PostgreSQL and redis-server started "
                    "here, websockets echo; on asyncio, uvloop and tideloop, interleaved; "
                    "reports ops/s and the Python process's CPU per op (median of the "
                    "repeats) and PASS/FAIL against tideloop <= 0.90x uvloop's CPU/op.")
    harness.add_loops_option(p)
    p.add_argument("--only", default=None, metavar="ROWS",
                   help="comma-separated rows, from: " + ",".join(ROW_NAMES)
                        + " (default: all)")
    p.add_argument("--repeat", "-r", type=int, default=3, metavar="N",
                   help="interleaved runs per row and loop; the figure is the median "
                        "(default: %(default)s)")
    p.add_argument("--duration", type=int, default=None, metavar="S",
                   help="HTTP rows: whole seconds of wrk load measured (default: 4, or 1 "
                        "with --quick)")
    p.add_argument("--warmup", type=int, default=None, metavar="S",
                   help="HTTP rows: whole seconds of wrk load before the measured run "
                        "(default: 1)")
    p.add_argument("--scale", type=float, default=1.0, metavar="X",
                   help="client rows: multiply the operation counts by X (default: 1)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: 1 s measured HTTP runs, a fifth of the client operations, "
                        "one COPY/fetch round")
    p.add_argument("--quiet-wait", type=float, default=0.0, metavar="S",
                   help="before each run, wait up to S seconds for the machine to be idle "
                        "(default: 0, do not wait)")
    harness.add_output_options(p)
    plot.add_plot_option(p)
    harness.add_verdict_options(p)
    return p


def make_config(args):
    cfg = procs.Config()
    cfg.loops = harness.pick(args.loops, harness.ALL_LOOPS, "loop", given_order=True)
    if cfg.loops is None:
        return None
    names = list(ROW_NAMES)
    if args.only:
        names = harness.pick(args.only, ROW_NAMES, "row")
        if names is None:
            return None
    cfg.rows = [r for r in ROWS if r.name in names]
    if args.repeat < 1:
        harness.usage_error("--repeat must be at least 1")
        return None
    cfg.repeat = args.repeat
    # wrk takes whole seconds
    cfg.duration = args.duration if args.duration is not None else (1 if args.quick else 4)
    cfg.warmup = args.warmup if args.warmup is not None else 1
    if cfg.duration <= 0 or cfg.warmup <= 0 or args.scale <= 0:
        harness.usage_error("--duration, --warmup and --scale must be positive")
        return None
    cfg.rounds = QUICK_ROUNDS if args.quick else None
    cfg.counts = {}
    for r in cfg.rows:
        if r.how == "client":
            base = r.quick_count if args.quick else r.count
            cfg.counts[r.name] = max(r.conns, int(base * args.scale))
    for r in cfg.rows:
        if "rounds" in r.params and cfg.rounds is None:
            cfg.rounds = r.params["rounds"]
    cfg.quiet_wait = max(0.0, args.quiet_wait)
    cfg.python = sys.executable or "python3"
    cfg.env = procs.worker_env(SRC)
    cfg.floor = False
    return cfg


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.time()
    log = harness.Progress()
    say = harness.say
    cfg = make_config(args)
    if cfg is None:
        return 2
    bad_plot = plot.check_plot_option(args.plot)
    if bad_plot is not None:
        return bad_plot

    versions = procs.loop_versions(cfg.python, cfg.env, ROOT)
    cfg.loops, skipped = procs.measurable_loops(cfg.loops, versions)
    core = procs.CoreWatch(versions, cfg.loops)
    cpus = harness.usable_cpus()
    frameworks = framework_versions(cfg)
    n_runs = len(cfg.rows) * len(cfg.loops) * cfg.repeat
    say(f"tideloop app benchmark: CPython {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, {cpus} CPU(s) shared by the Python "
        f"process and its load/services (nothing pinned); median of {cfg.repeat} "
        f"interleaved runs; {n_runs} runs\n")
    if not procs.log_loop_versions(say, cfg.loops, versions, "workers'", skipped):
        return 2
    say("  " + ", ".join(f"{k} {v}" for k, v in frameworks.items() if v) + "\n")
    harness.say_verdict_legend(cfg.loops, "tideloop's CPU per op")
    say("          SKIP = the row cannot run here (the reason is under the table)\n")

    workdir = tempfile.mkdtemp(prefix="tideloop-apps-")
    try:
        with Services(cfg.rows, workdir, harness.log_stderr) as services:
            service_versions = services.versions()
            results = run_rows(cfg, cfg.rows, services, frameworks, workdir, log)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.time() - started
    core.finish()
    command = reproduce_command(args, cfg)

    print()
    print(format_markdown(results, cfg.loops) if args.markdown
          else format_text(results, cfg.loops))
    print()
    for r in results:
        if r["skipped"]:
            print(f"skipped: {r['kind']}: {r['skipped']}")
        for name, err in r["errors"].items():
            print(f"error: {name} {r['kind']}: {err}")
    if args.verbose:
        for r in results:
            for name, xs in r["samples"].items():
                print(f"samples {r['kind']:<17} {name:<9} ops/s "
                      + " ".join(_fmt_rate(x["rps"]) for x in xs)
                      + "  us/op " + " ".join(_fmt_us(x["cpu_us_per_req"]) for x in xs)
                      + "  other " + " ".join(f"{x.get('other_cpu', 0):.0%}" for x in xs))
    print(f"ops/s = operations per wall-clock second; us/op = CPU time (user+system) of "
          f"the Python process per op, median of {cfg.repeat} interleaved runs: HTTP rows "
          f"the server's from /proc/<pid>/stat during the measured wrk run (gunicorn: its "
          f"{GUNICORN_WORKERS} workers summed; wrk excluded), the other rows the client's "
          f"own (getrusage) over the measured operations (PostgreSQL, redis-server "
          f"excluded; websockets: server and clients, one process).")
    print(f"tl/aio, tl/uv = tideloop's us/op over asyncio's / uvloop's; the target is "
          f"{_target_text()} on every row. wrk -t1 -c{HTTP_CONNS} (keep-alive), "
          f"{cfg.duration:g} s measured after {cfg.warmup:g} s; {cpus} CPUs shared, "
          f"nothing pinned.")
    samples = [x for r in results for xs in r["samples"].values() for x in xs]
    for line in (procs.load_line(samples, "the runs"), core.warning()):
        if line:
            print(line)
    harness.print_reproduce(command, elapsed)

    doc = harness.json_head(FORMAT, command, started, elapsed)
    doc.update({
        "repeat": cfg.repeat, "duration_s": cfg.duration, "warmup_s": cfg.warmup,
        "quick": args.quick, "transport": "tcp", "quiet_wait_s": cfg.quiet_wait,
        "targets": {r.name: {"metric": "cpu_us_per_req",
                             "limits": {"all": dict(TARGETS)}} for r in cfg.rows},
        "tls": None,
        "environment": {**procs.environment(cpus, ROOT, versions, core),
                        "frameworks": frameworks, "services": service_versions},
        "floor": [],
        "counts": cfg.counts, "rounds": cfg.rounds, "http_conns": HTTP_CONNS,
        "gunicorn_workers": GUNICORN_WORKERS,
        "results": results,
    })
    if args.json:
        harness.write_json(args.json, doc)
    status = exit_status(results, args.fail_on_miss)
    if args.plot:
        title = "Real apps (python -m bench.apps): the Python process's CPU per operation"
        if plot.draw_run(doc, args.plot, title=title) != 0:
            status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
