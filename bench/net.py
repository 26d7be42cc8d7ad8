#!/usr/bin/env python3
"""Network benchmark (issues #3, #12): echo servers on asyncio, uvloop and
tideloop against a C epoll echo server, driven by a C closed-loop load
generator; plain TCP and TLS 1.3.

    python -m bench.net                                   # full matrix, ~25 min
    python -m bench.net --quick                           # CI smoke, ~3 min
    python -m bench.net --tls                             # the TLS rows only, ~9 min
    python -m bench.net --loops asyncio,uvloop --only protocol,streams
    python -m bench.net --markdown --json net-results.json

Matrix: kind (protocol, buffered, streams, sockets) x message size (1 KiB,
10 KiB, 100 KiB) x connections (10, 100); TLS: kind (tls-protocol,
tls-streams) x (1 KiB, 16 KiB, 100 KiB) x (10, 100), and tls-handshake (a
fresh connection per request: connect, full TLS 1.3 handshake, one 64 B echo,
close; 10 at a time).  For each cell, repetition r runs the loops in an order
rotated by r; the C server takes part in the rotation of the first kind's cell
for each (size, conns), and that figure is the floor for every kind's row:
bench/echo_server.c for the plain kinds, bench/tls_echo_server.c (OpenSSL)
for the TLS kinds, once for the echo cells and once for the handshake cell.
One run = start the server (a fresh process), wait for its "READY", run
bench/bin/loadgen or bench/bin/tls_loadgen (warm-up, then D seconds measured),
stop the server.  The server's CPU time (utime+stime from /proc/<pid>/stat, all
threads) is read when loadgen prints "START" (end of warm-up) and when it
prints its result (before the connections close); CPU us per request is
that difference over the requests loadgen completed in the window.  Each
figure is the median of the R repetitions.

Targets (CPU per request, tideloop / other):
    protocol              <= 1.10 x the C server and <= 0.90 x uvloop
    sockets               <= 0.50 x uvloop
    streams 1 KiB         <= 1.50 x the C server and <= 0.60 x uvloop
    streams               <= 0.85 x uvloop
    buffered              informational
    tls-protocol 1 KiB    <= 0.50 x asyncio and <= 1.30 x the C TLS server
    tls-protocol 100 KiB  <= 0.80 x asyncio
    tls-streams 1 KiB     <= 0.70 x asyncio
    tls-handshake         handshakes/s >= 1.20 x asyncio's (a rate target)
    other TLS cells       informational

Nothing is pinned: the server and the load generator share the machine's
CPUs (2 on the reference VM), which is why CPU time per request, not
requests per second, is the figure the targets use.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from bench import plot, procs
from tideloop._bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
SERVERS_PY = ["-m", "bench.echo_servers"]   # run from the checkout's root (cwd=ROOT)
CERTS_DIR = os.path.join(ROOT, "tests", "certs")
CA_PEM = os.path.join(CERTS_DIR, "ca.pem")
CERTS = {"ecdsa": os.path.join(CERTS_DIR, "server-ecdsa.pem"),
         "rsa": os.path.join(CERTS_DIR, "server-rsa.pem")}

PLAIN_KINDS = ("protocol", "buffered", "streams", "sockets")
HANDSHAKE = "tls-handshake"
TLS_KINDS = ("tls-protocol", "tls-streams", HANDSHAKE)
KINDS = PLAIN_KINDS + TLS_KINDS
FLOOR = "c"                                  # the C epoll echo server's column name
# A kind's family: which load generator and C floor it has; the floor is
# measured once per family and (size, conns).
PLAIN, TLS = "plain", "tls"
C_PROGRAMS = {PLAIN: ("loadgen", "echo_server"), TLS: ("tls_loadgen", "tls_echo_server"),
              HANDSHAKE: ("tls_loadgen", "tls_echo_server")}
SIZES = {PLAIN: (1024, 10240, 102400), TLS: (1024, 16384, 102400)}
CONNS = (10, 100)
HANDSHAKE_SIZE = 64                          # the one echo of a handshake-row connection
HANDSHAKE_CONNS = (10,)                      # connections being made at a time
QUICK_CELLS = {PLAIN: ((1024, 10), (102400, 100)),   # (size, conns) pairs with --quick
               TLS: ((1024, 10),)}

# kind -> {size (None: every size) -> {reference: limit}}: tideloop's CPU per
# request / the reference's <= limit; for RATE_KINDS tideloop's requests/s /
# the reference's >= limit.  A cell without targets is informational.
# PEER is the best (lowest CPU per request) of the loops measured other than
# asyncio and tideloop: uvloop and the peer loops (harness.PEER_LOOPS).
PEER = "peer"
TARGETS = {
    "protocol": {1024: {FLOOR: 1.03, "uvloop": 0.90, PEER: 0.95},
                 None: {FLOOR: 1.10, "uvloop": 0.90, PEER: 1.00}},
    "sockets": {1024: {"uvloop": 0.50, PEER: 0.95}, None: {"uvloop": 0.50, PEER: 1.00}},
    # asyncio streams (their C data path): 1 KiB as the C floor allows it
    "streams": {1024: {FLOOR: 1.50, "uvloop": 0.60, PEER: 0.95},
                None: {"uvloop": 0.85, PEER: 1.00}},
    "buffered": {},
    "tls-protocol": {1024: {"asyncio": 0.50, FLOOR: 1.30, PEER: 0.95},
                     102400: {"asyncio": 0.80, PEER: 1.00}, None: {PEER: 1.00}},
    "tls-streams": {1024: {"asyncio": 0.70}},
    HANDSHAKE: {None: {"asyncio": 1.20}},
}
RATE_KINDS = {HANDSHAKE}
REF_LABEL = {"asyncio": "aio", "uvloop": "uv", FLOOR: "C", PEER: "best peer"}


def family(kind):
    return PLAIN if kind in PLAIN_KINDS else HANDSHAKE if kind == HANDSHAKE else TLS


def targets_for(kind, size):
    by_size = TARGETS.get(kind, {})
    return dict(by_size.get(size, by_size.get(None, {})))


def kind_cells(kind, quick, sizes, conns):
    """The (size, conns) cells of a kind: the handshake row's size is fixed."""
    fam = family(kind)
    if fam == HANDSHAKE:
        return [(HANDSHAKE_SIZE, c) for c in (conns or HANDSHAKE_CONNS)]
    if quick and not sizes and not conns:
        return list(QUICK_CELLS[fam])
    return [(s, c) for s in (sizes or SIZES[fam]) for c in (conns or CONNS)]


# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------

def floor_server(kind):
    """The C floor's identity for a kind: (FLOOR, "plain" or "tls")."""
    return (FLOOR, PLAIN if family(kind) == PLAIN else TLS)


def server_command(server, cfg, paths, endpoint):
    """``server``: (loop, kind) or floor_server(kind)."""
    if server[0] == FLOOR:
        if server[1] == PLAIN:
            cmd = [paths["echo_server"], "0"]
        else:
            cmd = [paths["tls_echo_server"], "0", "--cert", CERTS[cfg.cert]]
        if endpoint:
            cmd += ["--unix", endpoint]
        return cmd
    loop, kind = server
    if kind == HANDSHAKE:
        kind = "tls-protocol"                # handshakes are measured on the Protocol server
    cmd = [cfg.python, *SERVERS_PY, "--loop", loop, "--kind", kind, "--port", "0"]
    if family(kind) != PLAIN:
        cmd += ["--cert", CERTS[cfg.cert]]
    if endpoint:
        cmd += ["--unix", endpoint]
    return cmd


def run_once(server, kind, size, conns, cfg, paths, workdir):
    """Start the server, load it, stop it.  Returns a sample dict or raises RunError."""
    endpoint = os.path.join(workdir, "echo.sock") if cfg.unix else None
    fam = family(kind)

    def loadgen(where):
        target = ["127.0.0.1", "0", "--unix", endpoint] if cfg.unix else ["127.0.0.1", where]
        cmd = [paths["loadgen" if fam == PLAIN else "tls_loadgen"], *target,
               "--conns", str(conns), "--size", str(size),
               "--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}", "--hold"]
        if fam != PLAIN:
            cmd += ["--ca", CA_PEM]
        if fam == HANDSHAKE:
            cmd.append("--handshake")
        return cmd

    try:
        result, start, end = procs.run_under_load(
            server_command(server, cfg, paths, endpoint), loadgen,
            env=cfg.env, cwd=ROOT, errlog=os.path.join(workdir, "server.err"),
            prog="echo_servers", generator="loadgen" if fam == PLAIN else "tls_loadgen",
            seconds=cfg.warmup + cfg.duration)
    finally:
        if endpoint:
            try:
                os.unlink(endpoint)
            except OSError:
                pass
    if result["errors"] or result["warmup_errors"]:
        raise harness.RunError(f"{result['errors'] + result['warmup_errors']} echo errors "
                               f"(mismatched bytes or dropped connections; "
                               f"{result['conns_alive']}/{result['conns']} connections left)")
    if not result["requests"]:
        raise harness.RunError("no request completed")
    cpu = end.cpu - start.cpu
    sample = {"rps": result["rps"], "cpu_us_per_req": cpu / result["requests"] * 1e6,
              **procs.server_figures(result, start, end)}
    if "tls" in result:
        sample["tls"] = result["tls"]
    if start.sched is not None and end.sched is not None:
        sample["server_sched_cpu_s"] = round(end.sched - start.sched, 6)
        sample["sched_us_per_req"] = (end.sched - start.sched) / result["requests"] * 1e6
    return sample


# --------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------

def floor_kinds(kinds):
    """The kind of each family whose cells the C floor joins: the first one."""
    first = {}
    for kind in kinds:
        first.setdefault(family(kind), kind)
    return set(first.values())


def run_matrix(cfg, paths, log):
    """Returns (rows, floor) where floor maps (family, size, conns) to the C
    server's result dict and rows is one dict per (kind, size, conns)."""
    startup_errors = {}        # (loop, kind) or floor_server(kind) -> reason: skip further runs
    floor = {}
    rows = []
    with_floor_kinds = floor_kinds(cfg.kinds) if cfg.floor else set()
    workdir = tempfile.mkdtemp(prefix="tideloop-net-")
    try:
        for kind in cfg.kinds:
            fam = family(kind)
            for size, conns in cfg.cells[kind]:
                servers = {loop: (loop, kind) for loop in cfg.loops}
                with_floor = kind in with_floor_kinds
                if with_floor:
                    servers[FLOOR] = floor_server(kind)
                log(f"  {kind:<13} {harness.fmt_size(size):>7} x{conns:<4}")

                def measure(name):
                    if cfg.quiet_wait:
                        procs.wait_quiet(cfg.quiet_wait)
                    try:
                        return run_once(servers[name], kind, size, conns, cfg, paths, workdir)
                    except harness.RunError as exc:
                        if exc.startup:
                            startup_errors[servers[name]] = str(exc)
                        raise

                samples, errors = harness.interleave(
                    servers, cfg.repeat, measure, log=log,
                    errors={name: startup_errors[key] for name, key in servers.items()
                            if key in startup_errors})
                row = _summarise(kind, size, conns, samples, errors)
                if with_floor:
                    floor[(fam, size, conns)] = {
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
        f = floor.get((family(row["kind"]), row["size"], row["conns"]))
        if f is not None:
            row["rps"][FLOOR] = f["rps"]
            row["cpu_us_per_req"][FLOOR] = f["cpu_us_per_req"]
            if f["error"]:
                row["errors"][FLOOR] = f["error"]
        _verdict(row)
    return rows, floor


def _summarise(kind, size, conns, samples, errors):
    return {
        "kind": kind, "size": size, "conns": conns,
        "rps": harness.medians(samples, errors, "rps"),
        "cpu_us_per_req": harness.medians(samples, errors, "cpu_us_per_req"),
        "samples": {n: s for n, s in samples.items() if s},
        "errors": dict(errors),
    }


def page_faulting(rows, threshold=1.0):
    """{server: "kind size: N, ..."} for the servers whose median minor page
    faults per request exceed ``threshold`` in a row: their CPU per request
    is then mostly the kernel mapping memory, not the loop's own work."""
    out = {}
    for r in rows:
        for name, xs in r["samples"].items():
            faults = [x["minflt_per_req"] for x in xs if x.get("minflt_per_req") is not None]
            if faults and statistics.median(faults) > threshold:
                label = "C" if name == FLOOR else name
                cell = f"{r['kind']} {harness.fmt_size(r['size'])}: {statistics.median(faults):.1f}"
                out[label] = f"{out[label]}, {cell}" if label in out else cell
    return out


def _ratio(row, a, b):
    return harness.ratio(row["cpu_us_per_req"].get(a), row["cpu_us_per_req"].get(b))


def best_peer(row, metric):
    """The loop other than asyncio and tideloop (and the C floor) with the
    best ``metric`` in the row (lowest CPU, highest rate), or None."""
    figures = {n: x for n, x in row[metric].items()
               if n not in ("asyncio", "tideloop", FLOOR) and x is not None}
    if not figures:
        return None
    pick = max if metric == "rps" else min
    return pick(figures, key=figures.get)


def _verdict(row):
    row["tl_vs_asyncio"] = _ratio(row, "tideloop", "asyncio")
    row["tl_vs_uvloop"] = _ratio(row, "tideloop", "uvloop")
    row["tl_vs_c"] = _ratio(row, "tideloop", FLOOR)
    targets = targets_for(row["kind"], row["size"])
    rate = row["kind"] in RATE_KINDS
    metric = "rps" if rate else "cpu_us_per_req"
    row["best_peer"] = best_peer(row, metric)
    row["tl_vs_best_peer"] = (None if row["best_peer"] is None else
                              _ratio(row, "tideloop", row["best_peer"]))
    if row["best_peer"] is None:
        targets.pop(PEER, None)          # nothing but asyncio measured beside tideloop
    row["targets"] = targets
    row["target_metric"] = metric
    # the ratios the targets are checked on: tideloop / reference, of that metric
    row["checked"] = {ref: harness.ratio(row[metric].get("tideloop"),
                                         row[metric].get(row["best_peer"] if ref == PEER
                                                         else ref))
                      for ref in targets}
    if "tideloop" in row["errors"]:
        row["verdict"] = "ERROR"
        return
    if not targets:
        row["verdict"] = "info"
        return
    checks = []
    for ref, limit in targets.items():
        r = row["checked"][ref]
        checks.append(None if r is None else (r >= limit if rate else r <= limit))
    if False in checks:
        row["verdict"] = "FAIL"          # whatever else is missing
    elif None in checks:
        row["verdict"] = None            # a figure is missing: see harness.result_cell
    else:
        row["verdict"] = "PASS"


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def _fmt_rps(x):
    if x is None:
        return "-"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _fmt_us(x):
    if x is None:
        return "-"
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _fmt_target(row):
    """CPU targets as "<=0.90x uv"; a rate target with the ratio it was
    checked on (no column shows it): "rps >=1.20x aio (1.31x)"."""
    if not row["targets"]:
        return "-"
    parts = []
    for ref, limit in row["targets"].items():
        if row["target_metric"] == "rps":
            parts.append(f"rps >={limit:.2f}x {REF_LABEL[ref]} "
                         f"({harness.fmt_ratio(row['checked'].get(ref))})")
        else:
            parts.append(f"<={limit:.2f}x {REF_LABEL[ref]}")
    return ", ".join(parts)


def _fmt_best_peer(row):
    """tideloop / the best peer, with the peer's name: "0.93x blazio"."""
    if row.get("best_peer") is None:
        return "-"
    return f"{harness.fmt_ratio(row['tl_vs_best_peer'])} {row['best_peer']}"


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
              + ["tl/aio", "tl/uv", "tl/C", "tl/best peer", "target (CPU/req)", "result"])
    body = []
    for r in rows:
        cells = [r["kind"], harness.fmt_size(r["size"]), str(r["conns"])]
        for c in cols:
            cells.append("ERROR" if c in r["errors"] else _fmt_rps(r["rps"].get(c)))
        for c in cols:
            cells.append("ERROR" if c in r["errors"] else _fmt_us(r["cpu_us_per_req"].get(c)))
        cells += [harness.fmt_ratio(r["tl_vs_asyncio"]), harness.fmt_ratio(r["tl_vs_uvloop"]),
                  harness.fmt_ratio(r["tl_vs_c"]), _fmt_best_peer(r), _fmt_target(r),
                  harness.result_cell(r["verdict"], r["tl_vs_asyncio"], loops)]
        body.append(cells)
    return header, body


def format_text(rows, loops, floor):
    header, body = _table(rows, loops, floor)
    return harness.text_table(header, body, left={0, len(header) - 3, len(header) - 2})


def format_markdown(rows, loops, floor):
    header, body = _table(rows, loops, floor)
    return harness.markdown_table(header, body, left={0, len(header) - 3, len(header) - 2,
                                                           len(header) - 1})


def reproduce_command(args, cfg):
    parts = harness.command_prefix(["-m", "bench.net"], cfg.loops,
                                   args.quick, cfg.repeat)
    parts += ["--duration", f"{cfg.duration:g}", "--warmup", f"{cfg.warmup:g}"]
    if args.only:
        parts += ["--only", ",".join(cfg.kinds)]
    elif args.tls:
        parts.append("--tls")
    if cfg.cert != "ecdsa" and any(family(k) != PLAIN for k in cfg.kinds):
        parts += ["--cert", cfg.cert]
    if args.sizes:
        parts += ["--sizes", args.sizes]
    if args.conns:
        parts += ["--conns", args.conns]
    if cfg.unix:
        parts.append("--unix")
    return " ".join(parts + procs.command_flags(cfg))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.net",
        description="Echo-server benchmark for issues #3 and #12: Protocol, "
                    "BufferedProtocol, streams and sock_* servers, and Protocol and "
                    "streams servers over TLS 1.3 (and TLS handshakes per second), on "
                    "asyncio, uvloop and tideloop, with a C epoll echo server (plain "
                    "or OpenSSL) as the floor, loaded by a C closed-loop load "
                    "generator; reports requests/s and the server's CPU time per "
                    "request (median of interleaved runs) and PASS/FAIL against the "
                    "issues' targets.")
    harness.add_loops_option(p)
    p.add_argument("--only", default=None, metavar="LIST",
                   help="comma-separated kinds, from: " + ",".join(KINDS) + " (default: all)")
    p.add_argument("--tls", action="store_true",
                   help="the TLS kinds (" + ",".join(TLS_KINDS) + "), besides --only's if given")
    p.add_argument("--sizes", default=None, metavar="LIST",
                   help="message sizes in bytes (default: 1024,10240,102400; TLS kinds "
                        "1024,16384,102400; tls-handshake: always 64)")
    p.add_argument("--conns", default=None, metavar="LIST",
                   help="connection counts (default: 10,100; tls-handshake: 10 "
                        "connections being made at a time)")
    p.add_argument("--cert", choices=sorted(CERTS), default="ecdsa",
                   help="the TLS servers' certificate: tests/certs/server-ecdsa.pem "
                        "(ECDSA P-256) or server-rsa.pem (RSA-2048) (default: %(default)s)")
    procs.add_run_options(
        p, "cell",
        duration_help="measured seconds per run (default: 3, or 1 with --quick)",
        warmup_help="unmeasured load before each run's window (default: 0.5, "
                    "or 0.25 with --quick)",
        quick_help="CI smoke: 1 s runs and only the (1 KiB, 10 conns) and "
                   "(100 KiB, 100 conns) cells, the TLS kinds' (1 KiB, 10 conns) cell "
                   "and the handshake cell, unless --sizes/--conns are given",
        quiet_wait_help="(other processes below 15 %% of a CPU); for shared machines ")
    p.add_argument("--unix", action="store_true",
                   help="run everything over a Unix socket instead of TCP loopback")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="do not measure the C epoll echo server")
    harness.add_output_options(p)
    plot.add_plot_option(p)
    p.add_argument("--rebuild", action="store_true",
                   help="recompile the C programs even when up to date")
    harness.add_verdict_options(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.time()

    log = harness.Progress()
    say = harness.say
    cfg = procs.driver_config(args, KINDS, "kind", durations=(1.0, 3.0),
                              warmups=(0.25, 0.5), src=SRC)
    if cfg is None:
        return 2
    bad_plot = plot.check_plot_option(args.plot)
    if bad_plot is not None:
        return bad_plot
    cfg.kinds = cfg.only
    if args.tls:
        cfg.kinds = [k for k in KINDS if k in TLS_KINDS or (args.only and k in cfg.only)]
    sizes = harness.int_list(args.sizes, "sizes", "net.py") if args.sizes else None
    conns = harness.int_list(args.conns, "conns", "net.py") if args.conns else None
    cfg.cells = {kind: kind_cells(kind, args.quick, sizes, conns) for kind in cfg.kinds}
    cfg.unix = args.unix
    cfg.cert = args.cert

    families = {family(k) for k in cfg.kinds}
    programs = sorted({name for fam in families for name in C_PROGRAMS[fam]
                       if cfg.floor or "loadgen" in name})
    paths = procs.build_c(HERE, programs, "net.py", force=args.rebuild, log=log)
    versions = procs.loop_versions(cfg.python, cfg.env, ROOT, cfg.loops)
    cfg.loops, skipped = procs.measurable_loops(cfg.loops, versions)
    core = procs.CoreWatch(versions, cfg.loops)
    cpus = harness.usable_cpus()
    with_floor_kinds = floor_kinds(cfg.kinds) if cfg.floor else set()
    n_runs = sum(len(cfg.cells[k]) * (len(cfg.loops) + (k in with_floor_kinds))
                 for k in cfg.kinds) * cfg.repeat
    say(f"tideloop network benchmark: CPython {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, {cpus} CPU(s) shared by server and "
        f"loadgen (nothing pinned); {'Unix socket' if cfg.unix else 'TCP loopback'}; "
        f"median of {cfg.repeat} interleaved runs of {cfg.duration:g} s "
        f"(+{cfg.warmup:g} s warm-up); {n_runs} runs, "
        f"~{n_runs * (cfg.duration + cfg.warmup + 0.5) / 60:.1f} min\n")
    if not procs.log_loop_versions(say, cfg.loops, versions, "servers'", skipped):
        return 2
    tls_info = None
    if families - {PLAIN}:
        tls_info = {"cert": os.path.relpath(CERTS[cfg.cert], ROOT),
                    "python_ssl": procs.python_openssl(cfg.python, cfg.env, ROOT)}
        if cfg.floor:
            tls_info["c_server_openssl"] = procs.program_output(
                [paths["tls_echo_server"], "--version"])
        say(f"  {'TLS':<9} TLS 1.3, {tls_info['cert']}; servers' ssl module: "
            f"{tls_info['python_ssl']}"
            + (f"; C server: {tls_info['c_server_openssl']}" if cfg.floor else "") + "\n")
    if cfg.floor and PLAIN in families:
        say(f"  {'C':<9} {os.path.relpath(paths['echo_server'], ROOT)} (epoll, level-triggered)\n")
    if cfg.floor and families - {PLAIN}:
        say(f"  {'C (TLS)':<9} {os.path.relpath(paths['tls_echo_server'], ROOT)} "
            f"(epoll, level-triggered, OpenSSL)\n")
    harness.say_verdict_legend(cfg.loops, "tideloop's CPU per request (or rate)")

    rows, floor = run_matrix(cfg, paths, log)
    elapsed = time.time() - started
    core.finish()
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
            key = (name, r["kind"], err) if name != FLOOR else (name, family(r["kind"]), err)
            if key in reported:
                continue
            reported.add(key)
            where = (("C TLS server" if family(r["kind"]) != PLAIN else "C server")
                     if name == FLOOR else f"{name} {r['kind']}")
            print(f"error: {where} ({harness.fmt_size(r['size'])} x{r['conns']}): {err}")
    if args.verbose:
        for r in rows:
            for name, xs in r["samples"].items():
                print(f"samples {r['kind']:<13} {harness.fmt_size(r['size']):>7} x{r['conns']:<4} "
                      f"{name:<9} rps " + " ".join(_fmt_rps(x["rps"]) for x in xs)
                      + "  us/req " + " ".join(_fmt_us(x["cpu_us_per_req"]) for x in xs)
                      + "  server CPU " + " ".join(f"{x['server_cpu_util']:.0%}"
                                                   for x in xs if x.get("server_cpu_util") is not None)
                      + "  other " + " ".join(f"{x.get('other_cpu', 0):.0%}" for x in xs)
                      + "  faults/req " + " ".join(f"{x['minflt_per_req']:.1f}" for x in xs
                                                   if x.get("minflt_per_req") is not None))
    floor_in = sorted(with_floor_kinds, key=KINDS.index)
    print(f"rps = requests/s seen by loadgen; us/req = server CPU (utime+stime of the "
          f"server process, /proc/<pid>/stat) per request; median of {cfg.repeat} "
          f"interleaved runs; C = bench/echo_server.c (TLS rows: bench/tls_echo_server.c), "
          f"measured in the {', '.join(floor_in) or '-'} cells; tl/aio, tl/uv and tl/C "
          f"are ratios of us/req.")
    print(f"server and loadgen share {cpus} CPU(s), nothing pinned; "
          f"{'Unix socket' if cfg.unix else 'TCP loopback'}, one request outstanding "
          f"per connection, echoed bytes verified.")
    if tls_info:
        print(f"TLS rows: TLS 1.3 (bench/tls_loadgen.c verifies {os.path.relpath(CA_PEM, ROOT)}, "
              f"SNI localhost), server certificate {tls_info['cert']}; {HANDSHAKE}: a fresh "
              f"connection per request (connect, full handshake, one {HANDSHAKE_SIZE} B echo, "
              f"close_notify both ways), so rps = handshakes/s and us/req = server CPU per "
              f"connection, on the tls-protocol servers; its target is on rps.")
    faulting = page_faulting(rows)
    if faulting:
        print("page faults per request (median; memory mapped and unmapped per request, "
              "e.g. glibc trimming the heap top and growing it back): "
              + "; ".join(f"{name} {cells}" for name, cells in faulting.items()))
    loop_samples = [x for r in rows for xs in r["samples"].values() for x in xs]
    floor_samples = [x for f in floor.values() for x in f["samples"]]
    for line in (procs.load_line(loop_samples + floor_samples, "the measured windows",
                                 steal_samples=loop_samples),
                 core.warning()):
        if line:
            print(line)
    harness.print_reproduce(command, elapsed)

    doc = harness.json_head("tideloop-netbench/2", command, started, elapsed)
    doc.update({
        "repeat": cfg.repeat, "duration_s": cfg.duration, "warmup_s": cfg.warmup,
        "quick": args.quick, "transport": "unix" if cfg.unix else "tcp",
        "quiet_wait_s": cfg.quiet_wait,
        # kind -> {size in bytes, or "all" -> {reference: limit}}; "metric" says
        # which figure's ratio tideloop/reference is checked (<= for CPU, >= for rps)
        "targets": {k: {"metric": "rps" if k in RATE_KINDS else "cpu_us_per_req",
                        "limits": {("all" if size is None else str(size)):
                                   {("c_server" if r == FLOOR else r): v
                                    for r, v in t.items()}
                                   for size, t in by_size.items()}}
                    for k, by_size in TARGETS.items()},
        "tls": tls_info,
        "environment": procs.environment(cpus, ROOT, versions, core),
        "floor": [{"family": f, "size": s, "conns": c, **v}
                  for (f, s, c), v in floor.items()],
        # server -> its cells with more than one page fault per request
        "page_faulting": faulting,
        "results": rows,
    })
    if args.json:
        harness.write_json(args.json, doc)
    if args.plot and plot.draw_run(doc, args.plot):
        return 1

    return harness.missed(rows) if args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
