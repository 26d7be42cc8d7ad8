#!/usr/bin/env python3
"""What tideloop's diagnostics cost: user-space instructions of
the same workloads on a build without them (--base, a git revision) and on
this checkout, with callback timing off and on.

    python -m bench.diag_overhead --base REV [--json PATH]

Workloads (each under callgrind, the slope between two run lengths, so the
interpreter's start-up does not count):

* call_soon -- ``call_soon + run noop`` of ``python -m tideloop bench``:
  call_soon(noop) in batches of 1,000 per loop iteration, all run;
  instructions per call_soon + run.
* echo      -- ``bench/echo_servers.py --kind protocol`` (Protocol echo)
  served to ``bench/bin/loadgen`` (1 KiB on one connection: one request
  per loop iteration, so that the count per request does not move with
  how many requests an iteration happens to batch -- and the loop's own
  per-iteration work is not shared out), for two durations; instructions
  per request (server process only).

Variants: ``base`` (REV's source, built here in a temporary worktree),
``always-on`` (this checkout: counters and histograms that every loop
keeps), ``timing`` (TIDELOOP_DIAGNOSTICS=timing: every callback timed),
``tasks`` (timing and per-task accounting), ``all`` (parts 1-4 of issue
13: TIDELOOP_DIAGNOSTICS=timing,slow=0.1,stalls=0.1,tasks -- callback
timing, slow-callback reports, the stall watchdog, per-task accounting).

Every process, of every variant, starts one idle thread first.  A second
thread switches glibc to its multi-threaded paths for good (each
cancellable system call -- recv, send, epoll_wait -- then brackets itself
with asynccancel calls, about 140 instructions per echo request here); the
stall watchdog is a thread, so without this the "all" row would carry that
switch.  A real service has crossed it already: run_in_executor, getaddrinfo
and most libraries start threads.  ``--no-idle-thread`` measures without.

Exit status 0 only when every run succeeded.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from bench import procs
from bench.tls_instr import parse_callgrind

IDLE_THREAD = """
import threading
threading.Thread(target=threading.Event().wait, daemon=True, name="idle").start()
"""
MICRO = """
import asyncio, sys, tideloop
from tideloop._bench.micro import bench_call_soon
loop = tideloop.new_event_loop()
loop.run_until_complete(bench_call_soon(loop, int(sys.argv[1])))
loop.close()
"""
MICRO_N = (20000, 60000)
ECHO_MAIN = """
import runpy
runpy.run_module("bench.echo_servers", run_name="__main__", alter_sys=True)
"""
PRELUDE = [IDLE_THREAD]     # emptied by --no-idle-thread
ECHO_SECONDS = (3, 9)


def callgrind(argv, env, workdir, tag):
    out = os.path.join(workdir, tag + ".cg")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           "--compress-strings=no", "--compress-pos=no"] + argv
    return cmd, out


def run_micro(python, src, extra_env, workdir, tag):
    irs = []
    for n in MICRO_N:
        env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0", **extra_env)
        cmd, out = callgrind([python, "-c", "".join(PRELUDE) + MICRO, str(n)], env, workdir,
                             f"{tag}-{n}")
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=900)
        irs.append(parse_callgrind(out)[0])
    return (irs[1] - irs[0]) / (MICRO_N[1] - MICRO_N[0])


def run_echo(python, src, extra_env, workdir, tag):
    points = []
    for seconds in ECHO_SECONDS:
        env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0", **extra_env)
        cmd, out = callgrind([python, "-c", "".join(PRELUDE) + ECHO_MAIN,
                              "--loop",
                              "tideloop", "--kind", "protocol", "--port", "0"],
                             env, workdir, f"{tag}-{seconds}")
        server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, cwd=ROOT,
                                  stderr=subprocess.DEVNULL, text=True)
        try:
            line = server.stdout.readline()
            m = re.match(r"READY (\d+)", line)
            if not m:
                raise RuntimeError(f"echo server not ready: {line!r}")
            gen = subprocess.run(
                [os.path.join(HERE, "bin", "loadgen"), "127.0.0.1", m.group(1),
                 "--conns", "1", "--size", "1024", "--duration", str(seconds)],
                capture_output=True, text=True, timeout=seconds + 120, check=True)
            result = json.loads(gen.stdout.strip().splitlines()[-1])
            if result["errors"]:
                raise RuntimeError(f"loadgen: {result['errors']} errors")
        finally:
            server.terminate()
            server.wait(120)
        points.append((result["requests"], parse_callgrind(out)[0]))
    (r0, i0), (r1, i1) = points
    return (i1 - i0) / (r1 - r0)


def build(python, checkout):
    subprocess.run([python, "setup.py", "-q", "build_ext", "--inplace"], cwd=checkout,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the git revision without the diagnostics")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures here")
    p.add_argument("--no-idle-thread", action="store_true",
                   help="do not start an idle thread in each process first")
    args = p.parse_args(argv)
    if args.no_idle_thread:
        PRELUDE.clear()
    t_start = time.monotonic()
    procs.build_c(HERE, ["loadgen"], "diag_overhead")
    workdir = tempfile.mkdtemp(prefix="diag-overhead-")
    base_tree = os.path.join(workdir, "base")
    ok = True
    results = {}
    try:
        subprocess.run(["git", "worktree", "add", "--detach", base_tree, args.base],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        build(sys.executable, base_tree)
        build(sys.executable, ROOT)
        variants = [("base", os.path.join(base_tree, "src"), {}),
                    ("always-on", os.path.join(ROOT, "src"), {}),
                    ("timing", os.path.join(ROOT, "src"), {"TIDELOOP_DIAGNOSTICS": "timing"}),
                    ("tasks", os.path.join(ROOT, "src"), {"TIDELOOP_DIAGNOSTICS": "tasks"}),
                    ("all", os.path.join(ROOT, "src"),
                     {"TIDELOOP_DIAGNOSTICS": "timing,slow=0.1,stalls=0.1,tasks"})]
        for name, src, env in variants:
            row = {}
            for work, fn in (("call_soon", run_micro), ("echo", run_echo)):
                try:
                    row[work] = fn(sys.executable, src, env, workdir, f"{name}-{work}")
                except Exception as exc:       # noqa: BLE001 - reported, verdict FAILED
                    print(f"error: {name} {work}: {exc}", file=sys.stderr)
                    row[work] = None
                    ok = False
                print(f"  {name:10} {work:10} {row[work] and round(row[work]):>10} Ir/op",
                      flush=True)
            results[name] = row
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", base_tree], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nInstructions per operation (callgrind slope), CPython {sys.version.split()[0]},"
          f" base {args.base}:")
    print(f"{'variant':10} {'call_soon+run':>14} {'vs base':>8} {'echo request':>13} {'vs base':>8}")
    base = results.get("base", {})
    for name, row in results.items():
        cells = []
        for work in ("call_soon", "echo"):
            v, b = row.get(work), base.get(work)
            cells.append(f"{v:14,.0f}" if v else f"{'ERROR':>14}")
            cells.append(f"{(v / b - 1) * 100:+7.1f}%" if v and b else f"{'-':>8}")
        print(f"{name:10} {cells[0]} {cells[1]} {cells[2][1:]} {cells[3]}")
    verdict = "OK" if ok else "FAILED"
    print(f"verdict: {verdict}")
    print(f"reproduce: python -m bench.diag_overhead --base {args.base}"
          + (" --no-idle-thread" if not PRELUDE else ""))
    print(f"({time.monotonic() - t_start:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version, "base": args.base, "results": results,
                       "idle_thread": bool(PRELUDE), "verdict": verdict}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
