#!/usr/bin/env python3
"""Stress suite: loopback-only scenarios run on asyncio, uvloop and
tideloop, each scenario in a fresh child process per loop (fd limits, crashes
and leaks stay isolated).

    python stress/run.py                      # --long: bigger sizes, several minutes
    python stress/run.py --quick --loop all   # CI size, < ~90 s for all loops
    python stress/run.py --quick --loop tideloop --only a,e --json out.json
    python stress/run.py --quick --scale 0.1  # everything 10x smaller (ASan runs)

Scenarios:
  a  10,000 concurrent connections (server here, clients in a helper process),
     all held open at once, each echoing seeded random messages, every byte checked
  b  clients that reset (SO_LINGER 0) mid-write / mid-read; the server survives,
     makes no exception-handler call (asyncio makes none), serves a healthy
     client afterwards and leaks no fd
  c  peers that never read: a protocol honouring pause_writing keeps
     get_write_buffer_size() and RSS bounded by the high-water mark; then the
     peers drain and every byte is checked
  d  EMFILE on accept: the server reports it through the exception handler,
     keeps serving the accepted connections and accepts again once fds are free
  e  call_soon_threadsafe storm from 8 threads (loop idle and loop busy), plus
     single-wakeup ping-pongs: every callback runs once, in per-thread order,
     and the loop notices the last one promptly
  f  SIGUSR1 flood from another process while streaming over TCP and a
     socketpair: every byte checked, handler ran (0 < n <= sent), no EINTR leak
  g  a loop closed with live transports, a server and pending timers: no crash,
     no late callback, every fd closed after gc, the ResourceWarnings asyncio gives
  h  TLS clients that reset (SO_LINGER 0) mid-handshake, mid-write and mid-read
     (200 quick, 2,000 long): the TLS server survives, makes no exception-handler
     call, loses every connection it made exactly once, serves healthy TLS
     clients afterwards, leaks no fd, RSS flat after a warm-up slice; on
     tideloop once per TLS route
  i  a loop in each of 8 threads (16 long) for 4 s (60 s long): TCP (own
     port and a shared SO_REUSEPORT one) and Unix echo between the loops,
     every byte checked; call_soon_threadsafe storms between them (each
     callback once, in per-sender order); timers (none early, none lost);
     subprocesses from every loop (exit codes, a cat echo); SIGUSR1 to the
     process, handled on the main thread's loop; loops created and closed
     in a churn thread; RSS flat after a warm-up, no fd left open
  j  loops in isolated interpreters (3.13+): 4 server interpreters (8 long)
     serving TCP and Unix echo while churn threads create interpreters that
     talk to all of them (every byte checked), make and close loops there,
     and are destroyed, for 4 s (60 s long); the main interpreter's loop
     talks to them too; RSS and fds flat after a warm-up of interpreters

Files: this driver (the command line, the child entry points, the table);
scenarios/<letter>_<name>.py, one module per scenario; scenarios/common.py,
what they share (sizes, the Result a child reports, helpers);
scenarios/sabotage.py, the --sabotage bugs.

Each child prints one "RESULT <json>" line; "errors" must be empty.  The exit
status is non-zero if any scenario reports an error.

--sabotage (asyncio only, used by tests/stress/test_stress.py) patches the stock loop
with a scenario-specific bug (a corrupted byte, a dropped callback, a leaked
fd, ...) so the tests can prove each scenario detects a broken loop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from scenarios.common import Result, child_env, make_loop, sizes
from scenarios.sabotage import apply_sabotage
from scenarios.a_concurrent_echo import scenario_a, helper_a_clients
from scenarios.b_reset_mid_write import scenario_b
from scenarios.c_peer_never_reads import scenario_c
from scenarios.d_emfile_on_accept import scenario_d, helper_d_clients
from scenarios.e_threadsafe_storm import scenario_e
from scenarios.f_signal_flood import scenario_f, helper_f_flooder
from scenarios.g_close_with_live_fds import scenario_g
from scenarios.h_tls_resets import scenario_h
from scenarios.i_loops_in_threads import scenario_i
from scenarios.j_interpreters import scenario_j

ALL_LOOPS = ("asyncio", "uvloop", "tideloop")
SCENARIOS = "abcdefghij"
TITLES = {
    "a": "10k concurrent echo",
    "b": "reset mid-write",
    "c": "peer never reads",
    "d": "EMFILE on accept",
    "e": "threadsafe storm",
    "f": "signal flood + I/O",
    "g": "close with live fds",
    "h": "TLS resets",
    "i": "loops in 8+ threads",
    "j": "loops in interpreters",
}

# Child timeouts (s): the parent kills a child that overruns and counts it
# as an error.
TIMEOUT = {"quick": 75, "long": 1200}

# The scenario functions by letter (g and j run their own loops: see run_child).
SCENARIO_FUNCS = {"a": scenario_a, "b": scenario_b, "c": scenario_c, "d": scenario_d,
                  "e": scenario_e, "f": scenario_f, "g": scenario_g, "h": scenario_h,
                  "i": scenario_i}


# ---------------------------------------------------------------------------
# child entry points

def run_child(scenario, loop_name, mode, scale, sabotage):
    res = Result(scenario, loop_name)
    sz = sizes(mode, scale)
    res["details"]["mode"] = mode
    res["details"]["scale"] = scale
    try:
        if scenario == "g":
            if sabotage:
                apply_sabotage("g", None)
            scenario_g(loop_name, res, sz, sabotage)
        elif scenario == "j":
            scenario_j(loop_name, res, sz, sabotage)
        else:
            loop = make_loop(loop_name)
            if sabotage:
                apply_sabotage(scenario, loop)
            fn = SCENARIO_FUNCS[scenario]
            kw = {"sabotage": sabotage} if scenario == "e" else {}
            try:
                loop.run_until_complete(fn(loop, res, sz, loop_name, **kw))
            finally:
                loop.run_until_complete(loop.shutdown_default_executor())
                loop.close()
    except Exception as e:
        import traceback
        traceback.print_exc()
        res.err(f"scenario raised {e!r}")
    print("RESULT " + json.dumps(res.finish()), flush=True)


def run_helper(name, loop_name, args):
    if name == "a_clients":
        loop = make_loop(loop_name)
        loop.run_until_complete(helper_a_clients(loop, args))
        loop.close()
    elif name == "d_clients":
        helper_d_clients(args)
    elif name == "f_flooder":
        helper_f_flooder(args)


# ---------------------------------------------------------------------------
# parent: run every (scenario, loop) in a child, print the table

def loop_available(name):
    env = child_env()
    mod = {"asyncio": "asyncio", "uvloop": "uvloop", "tideloop": "tideloop"}[name]
    r = subprocess.run([sys.executable, "-c", f"import {mod}"], env=env,
                       capture_output=True)
    return r.returncode == 0


def run_one(scenario, loop_name, mode, scale, sabotage=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", scenario,
           "--loop", loop_name, "--mode", mode, "--scale", str(scale)]
    if sabotage:
        cmd.append("--sabotage")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(),
                           timeout=TIMEOUT[mode] / min(1.0, max(scale, 0.5)))
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = "timeout"
    res = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    if res is None:
        res = Result(scenario, loop_name).d
        res["wall"] = round(time.monotonic() - t0, 3)
        res["rss_kb"] = res["child_rss_kb"] = 0
        res["errors"].append(f"child exit {rc} without a result: {err[-2000:]}")
    elif rc != 0:
        res["errors"].append(f"child exit status {rc}: {err[-2000:]}")
    res["stderr_tail"] = err[-2000:]
    return res


def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def print_table(results, file=sys.stdout):
    hdr = ("scen", "loop", "conns", "requests", "sent", "verified", "faults",
           "errors", "wall s", "RSS MiB")
    rows = []
    for r in results:
        if r.get("skipped"):
            rows.append((r["scenario"], r["loop"], "skipped: " + r["skipped"]))
            continue
        rows.append((r["scenario"] + " " + TITLES[r["scenario"]], r["loop"],
                     str(r["conns"]), str(r["requests"]), fmt_bytes(r["bytes_sent"]),
                     fmt_bytes(r["bytes_verified"]), str(r["faults"]),
                     str(len(r["errors"])), f"{r['wall']:.2f}",
                     f"{r['rss_kb'] / 1024:.0f}"))
    widths = [max([len(h)] + [len(row[i]) for row in rows if len(row) == len(hdr)])
              for i, h in enumerate(hdr)]
    line = "  ".join(h.ljust(w) for h, w in zip(hdr, widths))
    print(line, file=file)
    print("-" * len(line), file=file)
    for row in rows:
        if len(row) != len(hdr):
            print("  ".join((row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2])),
                  file=file)
        else:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)), file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_const", dest="mode", const="quick")
    g.add_argument("--long", action="store_const", dest="mode", const="long")
    ap.add_argument("--loop", default="all",
                    help="asyncio, uvloop, tideloop, all, or a comma list")
    ap.add_argument("--only", default=SCENARIOS,
                    help="scenarios to run, e.g. 'a,e' or 'ae' (default all)")
    ap.add_argument("--scale", type=float, default=None,
                    help="multiply connection/callback/byte counts (default 1, "
                         "0.1 when TIDELOOP_SANITIZE_RUN=1)")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--sabotage", action="store_true",
                    help="asyncio only: plant a bug the scenario must detect")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    ap.add_argument("--mode", dest="child_mode", default=None, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    scale = a.scale
    if scale is None:
        scale = 0.1 if os.environ.get("TIDELOOP_SANITIZE_RUN") == "1" else 1.0

    if a.helper:
        return run_helper(a.helper, a.loop, a.rest)
    if a.child:
        return run_child(a.child, a.loop, a.child_mode, scale, a.sabotage)

    mode = a.mode or "long"
    loops = ALL_LOOPS if a.loop == "all" else tuple(a.loop.split(","))
    scens = [s for s in a.only.replace(",", "") if s in SCENARIOS]
    if a.sabotage and loops != ("asyncio",):
        ap.error("--sabotage needs --loop asyncio")
    available = {name: loop_available(name) for name in loops}
    results = []
    t0 = time.monotonic()
    for s in scens:
        for name in loops:
            if not available[name]:
                r = Result(s, name).d
                r.update(skipped=f"{name} not importable", wall=0, rss_kb=0)
            else:
                r = run_one(s, name, mode, scale, a.sabotage)
            results.append(r)
            status = ("skip" if r.get("skipped") else
                      "ok" if not r["errors"] else f"{len(r['errors'])} ERRORS")
            print(f"[{time.monotonic() - t0:6.1f}s] {s} {TITLES[s]:<20} {name:<9} "
                  f"{status} ({r['wall']:.1f}s)", file=sys.stderr, flush=True)
            for e in r["errors"][:10]:
                print(f"    {e}", file=sys.stderr)
            for e in r.get("notes", []):
                print(f"    note: {e}", file=sys.stderr)
    print(f"\nstress --{mode} scale={scale}  total {time.monotonic() - t0:.1f}s")
    print_table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(mode=mode, scale=scale, results=results), f, indent=1)
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
