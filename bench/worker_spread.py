"""How evenly gunicorn's workers share the requests: 2 workers, wrk, per-worker counts.

    python -m bench.worker_spread                       # every variant, 3 interleaved rounds
    python -m bench.worker_spread --quick               # 1 round of 2 s: a smoke run
    python -m bench.worker_spread --json results/worker-spread.json

Each variant is gunicorn with 2 workers of one worker class, serving
bench/worker_spread_app.py (its answer is the worker's pid; each worker
counts its requests and writes the count at exit), loaded by wrk on one
thread.  Modes:

  keepalive   wrk -c256 keep-alive connections (--connections), each request
              waiting 50 ms in its handler (I/O-bound, the CPUs not saturated):
              each connection stays with the worker that accepted it, so the
              spread of the connections over the workers decides the requests' one
  close       wrk -c16 with "Connection: close": a new connection per
              request, so each request is a new accept
  maxreq      "close" load with --max-requests 400: workers restart all the
              time; counts wrk's errors (refused or reset connections, time-outs)
  hup         "close" load with a SIGHUP (graceful reload) to the master
              every second; counts wrk's errors

The spread is max/min requests per worker (1.0 = even).  Variants: the
baseline, uvicorn-worker's own UvicornWorker (uvloop and httptools where
installed: "auto"), on the socket the workers share, and with gunicorn's
--reuse-port (gunicorn 24+: a socket bound in each worker), and on asyncio's
own loop (shared socket); tideloop's worker
classes before (the shared socket: the classes as they were, in
worker_spread_app.py) and after (tideloop.workers: a socket per worker
slot, kept by the arbiter); and the trap (a socket per worker while the
arbiter's own stays listening in the SO_REUSEPORT group).
"""
import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENSURE_DEBIAN = os.path.join(ROOT, "tools", "ensure_debian_package.sh")
FORMAT = "tideloop-worker-spread/1"

ASGI, AIOHTTP = "bench.worker_spread_app:app", "bench.worker_spread_app:make_app"
VARIANTS = {
    # name: (worker class, app, extra gunicorn arguments, side)
    "uvicorn-worker": ("uvicorn_worker.UvicornWorker", ASGI, [], "baseline"),
    "uvicorn-worker+reuse-port": ("uvicorn_worker.UvicornWorker", ASGI, ["--reuse-port"],
                                    "baseline"),
    "asyncio-uvicorn-shared": ("bench.worker_spread_app.AsyncioUvicornWorker", ASGI, [], "baseline"),
    "tideloop-uvicorn-shared": ("bench.worker_spread_app.SharedUvicornWorker", ASGI, [], "before"),
    "tideloop.workers.UvicornWorker": ("tideloop.workers.UvicornWorker", ASGI, [], "after"),
    "tideloop-aiohttp-shared": ("bench.worker_spread_app.SharedAiohttpWorker", AIOHTTP, [], "before"),
    "tideloop.workers.AiohttpWorker": ("tideloop.workers.AiohttpWorker", AIOHTTP, [], "after"),
    "stray-arbiter-socket": ("bench.worker_spread_app.StrayArbiterSocketWorker", ASGI, [], "trap"),
}
RESTART_VARIANTS = ("uvicorn-worker", "uvicorn-worker+reuse-port", "asyncio-uvicorn-shared",
                    "tideloop-uvicorn-shared", "tideloop.workers.UvicornWorker",
                    "tideloop-aiohttp-shared", "tideloop.workers.AiohttpWorker")
MODES = ("keepalive", "close", "maxreq", "hup")
WORKERS = 2
IO_WAIT = 0.05          # keepalive mode: each request waits 50 ms in its handler
START_TIMEOUT = 30

WRK_LUA = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p99": %d, "max": %d}}\n',
    summary.requests, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return sorted(int(p) for p in f.read().split())
    except OSError:
        return []


def listen_queues(port):
    """The accept-queue length (ss's Recv-Q) of each listening socket on port."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                         text=True).stdout
    return [int(line.split()[1]) for line in out.splitlines() if line.strip()]


def spread(counts):
    """max/min of the per-worker counts (None when a worker served nothing)."""
    values = list(counts.values())
    if len(values) < 2 or min(values) == 0:
        return None
    return max(values) / min(values)


def run_one(python, variant, mode, seconds, workdir, lua, keepalive_conns):
    worker, app, extra, _ = VARIANTS[variant]
    port = free_port()
    counts_dir = tempfile.mkdtemp(dir=workdir)
    args = [python, "-m", "gunicorn", "-c", "python:bench.worker_spread_app", app, "-k", worker,
            "-w", str(WORKERS), "-b", f"127.0.0.1:{port}", "--graceful-timeout", "5",
            "--log-level", "warning", *extra]
    from gunicorn.config import KNOWN_SETTINGS
    if any(s.name == "control_socket_disable" for s in KNOWN_SETTINGS):
        args.append("--no-control-socket")
    if mode == "maxreq":
        args += ["--max-requests", "400", "--max-requests-jitter", "50"]
    env = dict(os.environ, SPREAD_DIR=counts_dir,
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "src"),
                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    log_path = os.path.join(counts_dir, "gunicorn.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not (len(children(proc.pid)) == WORKERS and ready(port)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{variant}: gunicorn did not start:\n"
                                   + open(log_path, errors="replace").read()[-2000:])
            time.sleep(0.1)
        time.sleep(0.3)     # both workers up (the second may still be importing)
        start_workers = children(proc.pid)
        conns = keepalive_conns if mode == "keepalive" else 16
        cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--timeout", "3s", "-s", lua]
        if mode != "keepalive":
            cmd += ["-H", "Connection: close"]
        cmd.append(f"http://127.0.0.1:{port}/" + (f"?sleep={IO_WAIT}" if mode == "keepalive" else ""))
        wrk = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reloads = 0
        if mode == "hup":
            end = time.monotonic() + seconds - 0.5
            while time.monotonic() < end:
                time.sleep(1.0)
                proc.send_signal(signal.SIGHUP)
                reloads += 1
        out, err = wrk.communicate(timeout=seconds + 30)
        line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
        if wrk.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed ({wrk.returncode}): {err or out}")
        result = json.loads(line[len("WRKJSON "):])
        # Connections still waiting to be accepted once the load has stopped:
        # only a socket nobody accepts on keeps any.
        queues = listen_queues(port) if shutil.which("ss") else None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    counts, peers = {}, {}
    for name in os.listdir(counts_dir):
        if name.isdigit():
            with open(os.path.join(counts_dir, name)) as f:
                fields = f.read().split() or ["0", "0"]
            counts[int(name)], peers[int(name)] = int(fields[0]), int(fields[1])
    errors = result["errors"]
    row = {
        "variant": variant, "mode": mode, "worker_class": worker, "gunicorn_args": extra,
        "wrk_requests": result["requests"],
        "seconds": result["duration_us"] / 1e6,
        "rps": result["requests"] / (result["duration_us"] / 1e6),
        "wrk_errors": errors, "errors_total": sum(errors.values()),
        "latency_us": result["latency_us"],
        "workers_seen": len(counts),
        "per_worker": {str(pid): counts.get(pid, 0) for pid in start_workers}
        if mode in ("keepalive", "close") else {str(p): c for p, c in sorted(counts.items())},
        "served": sum(counts.values()),
        "reloads": reloads,
        "listen_queues": queues,
        "master_exit": proc.returncode,
    }
    if mode in ("keepalive", "close"):
        row["max_min"] = spread({pid: counts.get(pid, 0) for pid in start_workers})
        if mode == "keepalive":     # (with a connection per request, client ports repeat)
            row["connections_per_worker"] = {str(pid): peers.get(pid, 0) for pid in start_workers}
        top = max(row["per_worker"].values()) if row["per_worker"] else 0
        row["top_share"] = top / row["served"] if row["served"] else None
    shutil.rmtree(counts_dir, ignore_errors=True)
    return row


def summarise(rows):
    out = []
    seen = []
    for r in rows:
        key = (r["variant"], r["mode"])
        if key not in seen:
            seen.append(key)
    for variant, mode in seen:
        rs = [r for r in rows if r["variant"] == variant and r["mode"] == mode]
        s = {"variant": variant, "mode": mode, "side": VARIANTS[variant][3], "rounds": len(rs),
             "rps_median": statistics.median(r["rps"] for r in rs),
             "errors_total": sum(r["errors_total"] for r in rs),
             "p99_ms_median": statistics.median(r["latency_us"]["p99"] for r in rs) / 1000,
             "max_ms": max(r["latency_us"]["max"] for r in rs) / 1000}
        if mode in ("keepalive", "close"):
            ratios = [r["max_min"] for r in rs]
            finite = [x for x in ratios if x is not None]
            s["max_min"] = ratios
            s["max_min_median"] = (statistics.median(finite) if len(finite) == len(ratios)
                                   else None)
            s["top_share_median"] = statistics.median(r["top_share"] or 0 for r in rs)
        else:
            s["workers_seen"] = [r["workers_seen"] for r in rs]
            s["reloads"] = [r["reloads"] for r in rs]
        out.append(s)
    return out


def fmt(x, spec=".2f"):
    return "inf" if x is None else format(x, spec)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--seconds", type=float, default=4.0, help="wrk's duration per run")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated (default: all): " + ", ".join(VARIANTS))
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: "
                    + ", ".join(MODES))
    ap.add_argument("--connections", type=int, default=256,
                    help="wrk's keep-alive connections in the keepalive mode (default 256)")
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}")
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    if shutil.which("wrk") is None:
        subprocess.run(["bash", ENSURE_DEBIAN, "wrk"], check=True)

    import gunicorn
    plan = [(v, m) for m in modes for v in variants
            if m in ("keepalive", "close") or v in RESTART_VARIANTS]
    rows = []
    with tempfile.TemporaryDirectory(prefix="worker-spread-") as workdir:
        lua = os.path.join(workdir, "done.lua")
        with open(lua, "w") as f:
            f.write(WRK_LUA)
        for rnd in range(args.rounds):
            for variant, mode in plan:
                row = run_one(sys.executable, variant, mode, args.seconds, workdir, lua,
                              args.connections)
                row["round"] = rnd
                rows.append(row)
                per = ", ".join(f"{c}" for c in row["per_worker"].values())
                if "connections_per_worker" in row:
                    per += " on " + "/".join(str(c) for c in
                                             row["connections_per_worker"].values()) + " conns"
                errs = ", ".join(f"{k} {v}" for k, v in row["wrk_errors"].items() if v)
                extra = (f"max/min {fmt(row['max_min'])}" if "max_min" in row
                         else f"{row['workers_seen']} workers")
                print(f"round {rnd + 1} {mode:<9} {variant:<33} {row['rps']:8.0f} req/s  "
                      f"per worker [{per}]  {extra}  wrk errors {row['errors_total']}"
                      f"{' (' + errs + ')' if errs else ''}  accept queues {row['listen_queues']}",
                      flush=True)
    summary = summarise(rows)
    print()
    print(f"| variant | mode | max/min per worker (median of {args.rounds}) | top worker's share "
          f"| req/s | wrk errors | p99 / max latency ms |")
    print("|:---|:---|---:|---:|---:|---:|---:|")
    for s in summary:
        if "max_min" in s:
            print(f"| {s['variant']} | {s['mode']} | {fmt(s['max_min_median'])} "
                  f"({', '.join(fmt(x) for x in s['max_min'])}) | "
                  f"{s['top_share_median']:.0%} | {s['rps_median']:.0f} | {s['errors_total']} "
                  f"| {s['p99_ms_median']:.0f} / {s['max_ms']:.0f} |")
        else:
            print(f"| {s['variant']} | {s['mode']} | - | - | {s['rps_median']:.0f} "
                  f"| {s['errors_total']} | {s['p99_ms_median']:.0f} / {s['max_ms']:.0f} |")
    reproduce = ("python -m bench.worker_spread" + (" --quick" if args.quick else
                 f" --rounds {args.rounds} --seconds {args.seconds:g}")
                 + (f" --connections {args.connections}" if args.connections != 256 else "")
                 + (f" --variants '{args.variants}'" if args.variants != ",".join(VARIANTS)
                    else "")
                 + (f" --modes {args.modes}" if args.modes != ",".join(MODES) else ""))
    print(f"\nreproduce: {reproduce}")
    if args.json:
        versions = {}
        for name in ("gunicorn", "uvicorn", "uvicorn_worker", "aiohttp", "uvloop", "httptools"):
            try:
                from importlib.metadata import version
                versions[name] = version(name.replace("_", "-"))
            except Exception:
                versions[name] = None
        wrk_version = subprocess.run(["sh", "-c", "wrk --version 2>&1 | head -1"],
                                     capture_output=True, text=True).stdout.strip()
        doc = {"format": FORMAT, "reproduce": reproduce, "python": platform.python_version(),
               "kernel": platform.release(), "cpus": os.cpu_count(), "gunicorn": gunicorn.__version__,
               "versions": versions, "wrk": wrk_version, "workers": WORKERS, "keepalive_connections": args.connections,
               "seconds": args.seconds, "rounds": args.rounds, "summary": summary, "runs": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
