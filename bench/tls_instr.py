#!/usr/bin/env python3
"""TLS echo per request without wall-clock noise: user-space
instructions under callgrind and syscalls under strace, for the tls-protocol
echo server on asyncio, uvloop and tideloop, and the C TLS floor.

    python -m bench.tls_instr                          # all four servers, ~3 min
    python -m bench.tls_instr --loops tideloop --no-floor --requests 1000
    python -m bench.tls_instr --json tls-instr.json    # every run, for a script

For each server, the cell of bench/net.py's tls-protocol 1 KiB x 10
connections: bench/bin/tls_loadgen --requests R sends exactly R requests
(10 connections, one outstanding each, echoes verified) to a server started
for the purpose, which is stopped (SIGTERM) while the connections are still
open.  Each server runs twice, for R = N and R = 3N requests, and every figure
is the slope between the two runs, (X(3N) - X(N)) / 2N: what one more request
costs, without the interpreter's start-up, imports, the 10 handshakes and the
exit, which both runs share.

  callgrind   valgrind --tool=callgrind on the real interpreter binary
              (os.path.realpath(sys.executable): a pyenv shim or a venv link
              would be measured otherwise), PYTHONHASHSEED=0; the figure is
              Ir, user-space instructions executed, split by object file
              (the interpreter, libcrypto, libssl, the _ssl module, the loop's
              own extension, libc, the rest).
  strace      strace -c -f on the same command: system calls per request, by
              name.

The exit status is 0 only when every run succeeded (server ready, exactly R
requests without an echo error, a profile or summary read): a script can take
the verdict from it.  Under valgrind the server runs ~50x slower than the load
generator, so it finds several connections ready at every epoll wake-up; the
syscall figures under strace are likewise those of a server that is the
bottleneck (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from bench import procs
from tideloop._bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
SERVERS_PY = ["-m", "bench.echo_servers"]   # run from the checkout's root (cwd=ROOT)
CA_PEM = os.path.join(ROOT, "tests", "certs", "ca.pem")
CERTS = {"ecdsa": os.path.join(ROOT, "tests", "certs", "server-ecdsa.pem"),
         "rsa": os.path.join(ROOT, "tests", "certs", "server-rsa.pem")}
FLOOR = "c"
KIND = "tls-protocol"
READY_TIMEOUT = 300.0          # an interpreter importing ssl and a loop under valgrind
RUN_TIMEOUT = 900.0            # the load generator's time limit per run

# Object files, grouped: the first pattern that matches a path names its group.
GROUPS = (
    ("libcrypto", re.compile(r"/libcrypto\.so")),
    ("libssl", re.compile(r"/libssl\.so")),
    ("_ssl", re.compile(r"/_ssl\.cpython")),
    ("loop", re.compile(r"/uvloop/[^/]*\.so|/tideloop/_core[^/]*\.so|/tls_echo_server$")),
    ("_asyncio", re.compile(r"/_asyncio\.cpython")),
    ("python", re.compile(r"/libpython[^/]*\.so|/python3[.0-9]*t?$")),
    ("libc", re.compile(r"/(libc|libm|ld-linux[^/]*)[.-][^/]*$")),
)
GROUP_NAMES = tuple(g for g, _ in GROUPS) + ("other",)
GROUP_HELP = {
    "python": "the interpreter (libpython / the python binary)",
    "libcrypto": "OpenSSL's libcrypto (AES-GCM, the record layer's crypto, allocations)",
    "libssl": "OpenSSL's libssl (records, state machine)",
    "_ssl": "CPython's _ssl module (SSLObject.read/write, MemoryBIO)",
    "loop": "the loop's own extension (uvloop with libuv, tideloop's _core; the C floor's own code)",
    "_asyncio": "CPython's _asyncio module (Future, Task)",
    "libc": "libc, libm, the dynamic linker",
    "other": "everything else (other extension modules, valgrind's preload)",
}


def group_of(path):
    for name, pattern in GROUPS:
        if pattern.search(path):
            return name
    return "other"


# --------------------------------------------------------------------------
# Reading callgrind and strace output
# --------------------------------------------------------------------------

def parse_callgrind(path):
    """(total Ir, {object file: exclusive Ir}) from a callgrind profile written
    with --compress-strings=no --compress-pos=no.  A cost line after "calls="
    is the call's inclusive cost and belongs to the callee: not counted."""
    total = None
    by_object = {}
    ob = "???"
    skip_next = False
    with open(path, errors="replace") as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) > 1:
                    by_object[ob] = by_object.get(ob, 0) + int(parts[1])
                continue
            skip_next = False
            if line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("calls="):
                skip_next = True
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split(":", 1)[1].split()[0])
    if total is None:
        raise harness.RunError(f"no totals in {path}")
    return total, by_object


def parse_strace_summary(path):
    """{syscall: calls} from strace -c output."""
    counts = {}
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 5 or parts[-1] == "total":
                continue
            try:
                float(parts[0])
                calls = int(parts[3])
            except ValueError:
                continue
            counts[parts[-1]] = calls
    if not counts:
        raise harness.RunError(f"no syscall summary in {path}")
    return counts


# --------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------

def server_argv(server, cfg, paths):
    if server == FLOOR:
        return [paths["tls_echo_server"], "0", "--cert", CERTS[cfg.cert]]
    return [cfg.python, *SERVERS_PY, "--loop", server, "--kind", KIND, "--port", "0",
            "--cert", CERTS[cfg.cert]]


def tracee_pid(tracer_pid):
    """The process strace started (its child), or None."""
    try:
        for tid in os.listdir(f"/proc/{tracer_pid}/task"):
            with open(f"/proc/{tracer_pid}/task/{tid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
    except OSError:
        pass
    return None


def run_one(tool, server, requests, cfg, paths, workdir):
    """Run ``server`` under ``tool`` ("callgrind" or "strace") for exactly
    ``requests`` requests.  Returns a dict; raises harness.RunError."""
    tag = f"{tool}-{server}-{requests}"
    out = os.path.join(workdir, tag + ".out")
    errlog = os.path.join(workdir, tag + ".err")
    if tool == "callgrind":
        prefix = [cfg.valgrind, "--tool=callgrind", f"--callgrind-out-file={out}",
                  "--compress-strings=no", "--compress-pos=no"]
    else:
        prefix = [cfg.strace, "-f", "-c", "-o", out, "--"]
    env = dict(cfg.env, PYTHONHASHSEED="0")
    started = time.monotonic()
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(prefix + server_argv(server, cfg, paths),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, env=env, cwd=ROOT)
    gen = None
    try:
        line = procs.read_line(proc, time.monotonic() + READY_TIMEOUT)
        if line is None or not line.startswith("READY"):
            procs.stop(proc)
            raise harness.RunError("server not ready: " + procs.stderr_reason(
                errlog, "echo_servers", f"status {proc.returncode}"))
        port = line.split()[1]
        gen = subprocess.Popen(
            [paths["tls_loadgen"], "127.0.0.1", port, "--conns", str(cfg.conns),
             "--size", str(cfg.size), "--ca", CA_PEM, "--requests", str(requests),
             "--duration", f"{RUN_TIMEOUT:g}", "--hold"]
            + (["--handshake"] if cfg.handshake else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        result = None
        deadline = time.monotonic() + RUN_TIMEOUT + 30
        while True:
            line = procs.read_line(gen, deadline)
            if line is None:
                break
            if line.startswith("{"):
                result = json.loads(line)
                break
        # Stop the server while the connections are still open: their closing
        # is not measured.  strace's tracee gets the signal itself, so that
        # strace sees it exit and writes its summary.
        victim = tracee_pid(proc.pid) if tool == "strace" else proc.pid
        if victim:
            try:
                os.kill(victim, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise harness.RunError(f"{tool} did not exit after SIGTERM")
        gen_err = procs.finish_generator(gen)
        if result is None:
            raise harness.RunError("tls_loadgen failed: " + (gen_err.splitlines()[-1] if gen_err
                                                             else f"status {gen.returncode}"))
        if result["errors"] or result["requests"] != requests:
            raise harness.RunError(f"tls_loadgen: {result['requests']} of {requests} requests, "
                                   f"{result['errors']} echo errors")
        sample = {"requests": requests, "seconds": round(time.monotonic() - started, 2),
                  "tls": result.get("tls")}
        if tool == "callgrind":
            sample["ir"], objects = parse_callgrind(out)
            sample["objects"] = objects
        else:
            sample["syscalls"] = parse_strace_summary(out)
        return sample
    finally:
        if gen is not None and gen.poll() is None:
            gen.kill()
            gen.wait()
        if proc.poll() is None:
            procs.stop(proc)


# --------------------------------------------------------------------------
# Slopes
# --------------------------------------------------------------------------

def slope(a, b, da, db):
    return (db - da) / (b["requests"] - a["requests"])


def callgrind_figures(runs):
    a, b = runs
    groups_a, groups_b = {}, {}
    for objects, groups in ((a["objects"], groups_a), (b["objects"], groups_b)):
        for path, ir in objects.items():
            g = group_of(path)
            groups[g] = groups.get(g, 0) + ir
    return {
        "ir_per_request": slope(a, b, a["ir"], b["ir"]),
        "groups": {g: slope(a, b, groups_a.get(g, 0), groups_b.get(g, 0)) for g in GROUP_NAMES},
        # the object files themselves, for a closer look
        "objects": {p: slope(a, b, a["objects"].get(p, 0), b["objects"].get(p, 0))
                    for p in sorted(set(a["objects"]) | set(b["objects"]))},
    }


def strace_figures(runs):
    a, b = runs
    names = sorted(set(a["syscalls"]) | set(b["syscalls"]))
    per = {n: slope(a, b, a["syscalls"].get(n, 0), b["syscalls"].get(n, 0)) for n in names}
    per = {n: v for n, v in per.items() if abs(v) >= 0.0005}
    return {"syscalls_per_request": sum(per.values()),
            "by_name": dict(sorted(per.items(), key=lambda kv: -kv[1]))}


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def fmt_int(x):
    return "-" if x is None else f"{x:,.0f}"


def fmt_calls(x):
    return "-" if x is None else f"{x:.2f}"


def report(results, servers, tools):
    """The tables, as lines."""
    lines = []
    ir = {s: results[s].get("callgrind") for s in servers}
    if "callgrind" in tools:
        header = ["server", "Ir/request", "tl/x"] + list(GROUP_NAMES)
        body = []
        tl = (ir.get("tideloop") or {}).get("ir_per_request")
        for s in servers:
            f = ir[s]
            if not f:
                body.append([s, "ERROR"] + ["-"] * (len(header) - 2))
                continue
            body.append([s, fmt_int(f["ir_per_request"]),
                         harness.fmt_ratio(harness.ratio(tl, f["ir_per_request"]))
                         if s != "tideloop" else "-"]
                        + [fmt_int(f["groups"][g]) for g in GROUP_NAMES])
        lines.append("User-space instructions per request (callgrind, slope between "
                     "the two runs), by object file:")
        lines.append(harness.text_table(header, body))
        lines.append("")
    if "strace" in tools:
        per = {s: (results[s].get("strace") or {}) for s in servers}
        names = []
        for s in servers:
            for n, v in (per[s].get("by_name") or {}).items():
                if v >= 0.01 and n not in names:
                    names.append(n)
        header = ["syscall"] + list(servers)
        body = [[n] + [fmt_calls((per[s].get("by_name") or {}).get(n, 0.0))
                       if per[s] else "ERROR" for s in servers] for n in names]
        body.append(["total"] + [fmt_calls(per[s].get("syscalls_per_request"))
                                 if per[s] else "ERROR" for s in servers])
        lines.append("System calls per request (strace -c -f, slope between the two runs):")
        lines.append(harness.text_table(header, body))
        lines.append("")
    return lines


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.tls_instr",
        description="User-space instructions (callgrind) and system calls (strace) per "
                    "request of the TLS Protocol echo server on asyncio, uvloop and "
                    "tideloop and of the C TLS floor: the slope between a run of N and "
                    "one of 3N requests.  Exit status 0 only when every run succeeded.")
    harness.add_loops_option(p)
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="do not measure the C TLS echo server (bench/tls_echo_server.c)")
    p.add_argument("--requests", "-n", type=int, default=2000, metavar="N",
                   help="the short run's requests; the long run makes 3N (default: %(default)s)")
    p.add_argument("--conns", type=int, default=10, metavar="C",
                   help="connections (default: %(default)s)")
    p.add_argument("--size", type=int, default=1024, metavar="BYTES",
                   help="message size (default: %(default)s)")
    p.add_argument("--handshake", action="store_true",
                   help="a fresh connection per request (connect, full TLS handshake, "
                        "one echo, close): the figures are per handshake")
    p.add_argument("--cert", choices=sorted(CERTS), default="ecdsa",
                   help="the servers' certificate (default: %(default)s)")
    p.add_argument("--no-callgrind", dest="callgrind", action="store_false",
                   help="skip the callgrind runs")
    p.add_argument("--no-strace", dest="strace", action="store_false",
                   help="skip the strace runs")
    p.add_argument("--rebuild", action="store_true",
                   help="recompile the C programs even when up to date")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write every run and the figures as JSON to PATH")
    p.add_argument("--keep", action="store_true",
                   help="keep the callgrind profiles and strace summaries (their "
                        "directory is printed)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.time()
    log = harness.log_stderr
    loops = harness.pick(args.loops, harness.ALL_LOOPS, "loop", given_order=True)
    if loops is None:
        return 2
    if args.requests < 1 or args.conns < 1 or args.size < 1:
        return harness.usage_error("--requests, --conns and --size must be positive")
    tools = [t for t in ("callgrind", "strace") if getattr(args, t)]
    if not tools:
        return harness.usage_error("nothing to do: both --no-callgrind and --no-strace")

    cfg = procs.Config()
    cfg.python = os.path.realpath(sys.executable)
    cfg.env = procs.worker_env(SRC)
    cfg.cert, cfg.conns, cfg.size = args.cert, args.conns, args.size
    cfg.handshake = args.handshake
    cfg.valgrind = shutil.which("valgrind")
    cfg.strace = shutil.which("strace")
    missing = [t for t, exe in (("callgrind", cfg.valgrind), ("strace", cfg.strace))
               if t in tools and not exe]
    if missing:
        print(f"tls_instr: {' and '.join('valgrind' if t == 'callgrind' else t for t in missing)} "
              f"not installed (or skip with --no-{missing[0]})", file=sys.stderr)
        return 1

    names = ["tls_loadgen"] + (["tls_echo_server"] if args.floor else [])
    paths = procs.build_c(HERE, names, "tls_instr.py", force=args.rebuild, log=log)
    versions = procs.loop_versions(cfg.python, cfg.env, ROOT)
    versions.pop("tideloop_core", None)
    servers = list(loops) + ([FLOOR] if args.floor else [])
    counts = (args.requests, 3 * args.requests)
    log(f"tideloop TLS instructions: CPython {platform.python_version()} "
        f"({cfg.python}), {KIND} echo, {harness.fmt_size(args.size)} x {args.conns} "
        f"connections{' (a fresh connection and handshake per request)' if args.handshake else ''}, "
        f"{counts[0]} and {counts[1]} requests per server under "
        f"{' and '.join(tools)}; PYTHONHASHSEED=0\n")
    if not procs.log_loop_versions(log, loops, versions, "servers'"):
        return 1

    workdir = tempfile.mkdtemp(prefix="tideloop-tls-instr-")
    results = {s: {} for s in servers}
    runs = {s: {} for s in servers}
    failures = []
    try:
        for tool in tools:
            for s in servers:
                log(f"  {tool:<9} {s:<9}")
                samples = []
                for n in counts:
                    try:
                        samples.append(run_one(tool, s, n, cfg, paths, workdir))
                        log(f" {n}:{samples[-1]['seconds']:.0f}s")
                    except harness.RunError as exc:
                        failures.append(f"{tool} {s} ({n} requests): {exc}")
                        log(f" {n}:ERROR")
                        break
                runs[s][tool] = samples
                if len(samples) == 2:
                    fig = (callgrind_figures if tool == "callgrind" else strace_figures)(samples)
                    results[s][tool] = fig
                    log("  -> " + (f"{fig['ir_per_request']:,.0f} Ir/req" if tool == "callgrind"
                                   else f"{fig['syscalls_per_request']:.2f} syscalls/req"))
                log("\n")
    finally:
        if args.keep:
            print(f"profiles kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.time() - started

    print()
    for line in report(results, servers, tools):
        print(line)
    if "callgrind" in tools:
        print("tl/x = tideloop's Ir/request / that server's; groups: "
              + "; ".join(f"{g} = {GROUP_HELP[g]}" for g in GROUP_NAMES) + ".")
    for f in failures:
        print(f"error: {f}")
    tls = next((x.get("tls") for s in servers for t in runs[s].values() for x in t
                if x.get("tls")), None)
    if tls:
        print(f"TLS: {tls.get('version')} {tls.get('cipher')} {tls.get('group')}; "
              f"certificate {os.path.relpath(CERTS[args.cert], ROOT)}")
    command = " ".join(harness.command_prefix(["-m", "bench.tls_instr"], loops,
                                              False, 1)[:-2]
                       + ["--requests", str(args.requests)]
                       + (["--no-floor"] if not args.floor else [])
                       + (["--handshake"] if args.handshake else [])
                       + (["--conns", str(args.conns)] if args.conns != 10 else [])
                       + (["--size", str(args.size)] if args.size != 1024 else [])
                       + ([] if args.callgrind else ["--no-callgrind"])
                       + ([] if args.strace else ["--no-strace"]))
    print(f"verdict: {'OK' if not failures else 'FAILED'} "
          f"({sum(len(v) for r in runs.values() for v in r.values())} runs ok, "
          f"{len(failures)} failed)")
    harness.print_reproduce(command, elapsed)

    if args.json:
        doc = harness.json_head("tideloop-tls-instr/1", command, started, elapsed)
        doc.update({
            "kind": KIND, "size": args.size, "conns": args.conns,
            "requests": list(counts), "cert": os.path.relpath(CERTS[args.cert], ROOT),
            "python": cfg.python, "pythonhashseed": 0, "tools": tools,
            "loops": versions, "git": harness.git_revision(ROOT),
            "groups": GROUP_HELP,
            "results": results,
            "runs": {s: {t: [{k: v for k, v in x.items() if k != "objects"} for x in xs]
                         for t, xs in r.items()} for s, r in runs.items()},
            "failures": failures,
            "ok": not failures,
        })
        harness.write_json(args.json, doc)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
