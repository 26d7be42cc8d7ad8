"""Python-level call counts per request of bench/apps_app.py's aiohttp server,
one loop against another (the lead-finder for the "interpreter
instructions per request" gap).

    PYTHONPATH=src python3 -m bench.apps_calls                 # uvloop vs tideloop
    PYTHONPATH=src python3 -m bench.apps_calls --conns 50 --path /json

For each loop a fresh server process runs the app under aiohttp.web.run_app
(as bench/apps_worker.py does); a raw-socket client in this process sends
--warmup keep-alive requests, then --requests more with ``sys.setprofile``
counting every Python function call ("call") and every C function called
from Python ("c_call") in the server, then prints the functions whose calls
per request differ between the loops, biggest difference first.  The
profiling is switched on and off by two extra routes (/_calls/on, /_calls/off)
whose own calls are subtracted out by the warm-up/measure symmetry: both
loops count the same two toggles.

With --callgrind the server runs under ``valgrind --tool=callgrind
--instr-atstart=no`` instead (no profile function), instrumentation on for
the --requests only, and the instructions per request are printed per
category (bench/apps_callgrind.py's) and for the functions whose self cost
per request differs most: a fixed request count, unlike apps_callgrind.py's
fixed seconds of wrk, so both loops execute the same work.
"""

import argparse
import collections
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- server (a child process) ---------------------------------------------------

def serve(loop_name, out):
    import asyncio
    from aiohttp import web
    from bench import apps_app
    from tideloop._bench import harness

    counts = collections.Counter()

    def prof(frame, event, arg):
        if event == "call":
            code = frame.f_code
            counts[(code.co_filename, code.co_firstlineno, code.co_qualname)] += 1
        elif event == "c_call":
            self = getattr(arg, "__self__", None)
            owner = (type(self).__qualname__ if self is not None
                     and not isinstance(self, type(sys)) else
                     getattr(arg, "__module__", None) or "?")
            counts[("<C>", 0, f"{owner}.{arg.__name__}")] += 1

    async def on(request):
        counts.clear()
        sys.setprofile(prof)
        return web.Response(text="on")

    async def off(request):
        sys.setprofile(None)
        with open(out, "w") as f:
            json.dump([[list(k), v] for k, v in counts.items()], f)
        return web.Response(text="off")

    app = apps_app.aiohttp_app()
    app.router.add_get("/_calls/on", on)
    app.router.add_get("/_calls/off", off)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    loop = harness.loop_factory(loop_name)()
    asyncio.set_event_loop(loop)
    web.run_app(app, sock=sock, loop=loop, access_log=None, shutdown_timeout=1.0,
                print=lambda *_: print(f"READY {port}", flush=True))


# -- client ------------------------------------------------------------------------

def request(path):
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").encode()


def read_response(sock, buf):
    """One HTTP/1.1 response with Content-Length off sock; returns the rest."""
    while True:
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buf[:head_end].lower()
            i = head.find(b"content-length:")
            length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) >= 0 else None])
            total = head_end + 4 + length
            if len(buf) >= total:
                return buf[total:]
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed")
        buf += chunk


def drive(conns, bufs, path, n):
    """n requests spread over the connections, one in flight on each."""
    req = request(path)
    done = 0
    while done < n:
        batch = conns[:min(len(conns), n - done)]
        for c in batch:
            c.sendall(req)
        for i, c in enumerate(batch):
            bufs[i] = read_response(c, bufs[i])
        done += len(batch)


def one(sock, path):
    sock.sendall(request(path))
    read_response(sock, b"")


def measure(loop_name, args):
    """{(file, line, name): calls} of the server over args.requests; with
    args.callgrind, apps_callgrind.py's breakdown of them instead."""
    out = f"/tmp/apps_calls.{os.getpid()}.{loop_name}.json"
    cmd = [sys.executable, "-m", "bench.apps_calls", "--serve", loop_name, out]
    if args.callgrind:
        import tempfile
        from bench import apps_callgrind as cg
        outdir = args.keep or tempfile.mkdtemp(prefix="apps_calls.")
        cmd = cg.valgrind_prefix(outdir) + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            stderr=subprocess.DEVNULL if args.callgrind else None)
    try:
        line = proc.stdout.readline()
        port = int(line.split()[1])
        ctl = socket.create_connection(("127.0.0.1", port))
        if args.prime:
            import apps
            apps.prime(port, args.path, apps.PRIME_PER_PROCESS)
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(args.conns)]
        for c in conns:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bufs = [b""] * len(conns)
        drive(conns, bufs, args.path, args.warmup)
        if args.callgrind:
            cg.callgrind_control("-i", "on", str(proc.pid))
            drive(conns, bufs, args.path, args.requests)
            cg.callgrind_control("-d", str(proc.pid))
            by_obj, by_fn, _ = cg.read_callgrind(cg.dump_path(outdir, proc.pid))
            return by_obj, by_fn
        one(ctl, "/_calls/on")
        drive(conns, bufs, args.path, args.requests)
        one(ctl, "/_calls/off")
        with open(out) as f:
            data = json.load(f)
        os.unlink(out)
        for c in conns + [ctl]:
            c.close()
    finally:
        proc.terminate()
        proc.wait()
        if args.callgrind and not args.keep:
            shutil.rmtree(outdir, ignore_errors=True)
    return {tuple(k): v for k, v in data}


def merged(by_fn):
    """Self cost per (object, function), the recursion levels callgrind
    names apart ("f'2") summed into their function."""
    out = collections.Counter()
    for (obj, fn), ir in by_fn.items():
        out[(obj, re.sub(r"'\d+$", "", fn))] += ir
    return out


def callgrind_report(a, b, ra, rb, args):
    import apps_callgrind as cg
    n = args.requests
    print(f"{args.path} x{n} under callgrind, {args.conns} connection(s), "
          f"after {args.warmup} warm-up requests: instructions per request")
    cats = {}
    for name, (by_obj, _) in ((a, ra), (b, rb)):
        c = dict.fromkeys(cg.CATEGORIES, 0)
        for obj, ir in by_obj.items():
            c[cg.classify(obj)] += ir
        cats[name] = c
    print(f"  {'':12} {a:>10} {b:>10} {b + '-' + a:>10}")
    for k in ("total",) + cg.CATEGORIES:
        va = sum(cats[a].values()) if k == "total" else cats[a][k]
        vb = sum(cats[b].values()) if k == "total" else cats[b][k]
        print(f"  {k:12} {va / n:10,.0f} {vb / n:10,.0f} {(vb - va) / n:+10,.0f}")
    fa, fb = merged(ra[1]), merged(rb[1])
    keys = set(fa) | set(fb)
    diff = sorted(keys, key=lambda k: -abs(fb.get(k, 0) - fa.get(k, 0)))
    print(f"\n  self cost per request, largest differences")
    for k in diff[:args.top]:
        va, vb = fa.get(k, 0) / n, fb.get(k, 0) / n
        print(f"  {va:10,.0f} {vb:10,.0f} {vb - va:+10,.0f}  {k[1]} "
              f"[{os.path.basename(k[0])}]")


def short(key):
    filename, line, name = key
    if filename == "<C>":
        return f"[C] {name}"
    for marker in ("site-packages/", "lib/python3", "src/"):
        i = filename.rfind(marker)
        if i >= 0:
            filename = filename[i + len(marker):]
            break
    return f"{name} ({filename}:{line})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loops", default="uvloop,tideloop",
                    help="two loops to compare (default: uvloop,tideloop)")
    ap.add_argument("--path", default="/text")
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--callgrind", action="store_true",
                    help="instructions per request under callgrind instead of call counts")
    ap.add_argument("--prime", action="store_true",
                    help="bench/apps.py's priming requests (apps.prime) before the warm-up")
    ap.add_argument("--keep", metavar="DIR",
                    help="--callgrind: keep the callgrind files in DIR")
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    a, b = args.loops.split(",")
    ca, cb = measure(a, args), measure(b, args)
    if args.callgrind:
        callgrind_report(a, b, ca, cb, args)
        return
    n = args.requests
    print(f"{args.path} x{n}, {args.conns} connection(s), after {args.warmup} warm-up requests")
    for name, c in ((a, ca), (b, cb)):
        py = sum(v for k, v in c.items() if k[0] != "<C>")
        cc = sum(v for k, v in c.items() if k[0] == "<C>")
        print(f"  {name:9}: {py / n:7.2f} Python calls/req, {cc / n:7.2f} C calls/req")
    keys = set(ca) | set(cb)
    diff = sorted(keys, key=lambda k: -abs(cb.get(k, 0) - ca.get(k, 0)))
    print(f"\n{'calls/req':>9} {a:>9} {b:>9}  {b}-{a}  function")
    for k in diff[:args.top]:
        va, vb = ca.get(k, 0) / n, cb.get(k, 0) / n
        if abs(vb - va) < 0.005:
            break
        print(f"{'':9} {va:9.3f} {vb:9.3f} {vb - va:+8.3f}  {short(k)}")


if __name__ == "__main__":
    main()
