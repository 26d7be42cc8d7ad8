#!/usr/bin/env python3
"""Where the instructions of an app-benchmark row go (bench/apps.py), per
loop, under callgrind: the loop's own code against the interpreter, the
framework's compiled code and libc.

    python -m bench.apps_callgrind --results results/apps.json   # the rows that missed
    python -m bench.apps_callgrind --only uvicorn-text,redis --loops uvloop,tideloop
    python -m bench.apps_callgrind --results results/apps.json --markdown --json results/apps-callgrind.json

For each row and loop, bench/apps_worker.py runs under
``valgrind --tool=callgrind --instr-atstart=no``; instrumentation is switched
on (``callgrind_control -i on``) at the start of the measured part and the
profile dumped (``callgrind_control -d``) at its end, so start-up, imports
and warm-up are not in it:

* HTTP rows: the server, bench/apps.py's priming requests (apps.prime: one
  at a time), a 2 s wrk warm-up, then --seconds of
  ``wrk -t1 -c50``; ops = the requests wrk completed in that window.  The
  gunicorn rows are profiled as the single-process server of the same
  framework and endpoint (uvicorn-text, aiohttp-text): callgrind follows one
  process, and a gunicorn worker runs the same server code;
* client rows: the worker's --window marks (a --scale of the counts, one
  COPY/fetch round).

The dump's self cost (Ir, instructions executed) is summed per ELF object
from the callgrind file itself (ob= / fn= records; the data callgrind_annotate
reads, without its per-line display) and each object put in one category:

  loop         tideloop/_core*.so, or uvloop's extension (libuv is linked into it)
  interpreter  the python binary, libpython, the stdlib's extension modules
               (lib-dynload: _asyncio's Task/Future, _socket, select, _json, ...):
               this is also where all Python code runs -- asyncio's, the
               framework's and tideloop's own Python layer alike
  framework    compiled extensions in site-packages other than the loop's
               (httptools, aiohttp's parser, multidict, yarl, asyncpg's protocol,
               websockets' speedups, ...)
  libc         libc, libm, ld.so and other system libraries
  other        anything else (valgrind's preload)

and the kernel, which callgrind does not see, is given from the timing run
when --results has it: the system-time share of the row's CPU per op.

Per row the verdict says, in instructions per op, how much more (or less)
tideloop executes than uvloop and which category holds most of that
difference -- "loop" (tideloop's C core against uvloop+libuv) or the rest
(interpreter / framework / libc: code both loops run, moved by how the loop
calls it).  It also lists the functions whose self cost per op differs most.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from bench import apps, procs
from tideloop._bench import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CATEGORIES = ("loop", "interpreter", "framework", "libc", "other")
# gunicorn rows are profiled as the single-process server of the same app
PROFILED_AS = {"gunicorn-uvicorn": "uvicorn-text", "gunicorn-aiohttp": "aiohttp-text"}
START_TIMEOUT = 240.0
WARMUP_S = 2
FORMAT = "tideloop-appcallgrind/1"


# --------------------------------------------------------------------------
# The callgrind file
# --------------------------------------------------------------------------

_NAMED = re.compile(r"\((\d+)\)(?: (.*))?$")


def _name(table, value):
    """callgrind's name compression: "(id) name" defines, "(id)" refers."""
    m = _NAMED.match(value)
    if not m:
        return value
    if m.group(2) is not None:
        table[m.group(1)] = m.group(2)
        return m.group(2)
    return table.get(m.group(1), f"({m.group(1)})")


def read_callgrind(path):
    """Self cost of the first event (Ir) per object and per (object, function)
    from a callgrind output file: ({obj: Ir}, {(obj, fn): Ir}, total)."""
    objs, fns = {}, {}
    by_obj, by_fn = {}, {}
    ob = fn = "???"
    npos = 1
    after_calls = False
    total = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if after_calls:              # a call's inclusive cost, not self cost
                    after_calls = False
                    continue
                parts = line.split()
                if len(parts) > npos:
                    ir = int(parts[npos])
                    by_obj[ob] = by_obj.get(ob, 0) + ir
                    key = (ob, fn)
                    by_fn[key] = by_fn.get(key, 0) + ir
                continue
            key, _, value = line.partition("=")
            if key == "ob":
                ob = _name(objs, value)
            elif key == "fn":
                fn = _name(fns, value)
            elif key in ("cob",):
                _name(objs, value)
            elif key == "cfn":
                _name(fns, value)
            elif key == "calls":
                after_calls = True
            elif line.startswith("positions:"):
                npos = len(line.split(":", 1)[1].split())
            elif line.startswith(("totals:", "summary:")):
                total = int(line.split(":", 1)[1].split()[0])
    return by_obj, by_fn, total


def classify(obj, prefixes=None):
    """The category of an ELF object path (CATEGORIES)."""
    prefixes = prefixes or _python_prefixes()
    low = obj.lower()
    base = os.path.basename(low)
    if ("tideloop/_core" in low or "/uvloop/" in low or base.startswith("libuv")):
        return "loop"
    if "site-packages/" in low or "dist-packages/" in low:
        return "framework"
    if (base.startswith(("python3", "libpython3")) or "/lib-dynload/" in low
            or any(low.startswith(p) for p in prefixes)):
        return "interpreter"
    if base.startswith(("libc.so", "libc-", "libm.so", "ld-linux", "libpthread", "libdl",
                        "librt", "libz", "libssl", "libcrypto", "libffi", "libgcc",
                        "libstdc++", "libexpat", "libbz2", "liblzma", "libuuid")) \
            or low.startswith(("/lib/", "/usr/lib/", "/lib64/")):
        return "libc"
    return "other"


def _python_prefixes():
    paths = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"],
             os.path.realpath(sys.executable)}
    return tuple(os.path.realpath(p).lower() for p in paths if p)


def breakdown(by_obj, by_fn, ops):
    """Instructions per op: total, per category, per object and the largest
    functions (self cost)."""
    cats = dict.fromkeys(CATEGORIES, 0)
    objects = {}
    for obj, ir in by_obj.items():
        cats[classify(obj)] += ir
        objects[obj] = ir / ops
    total = sum(by_obj.values())
    return {
        "ops": ops,
        "ir_total": total,
        "ir_per_op": total / ops,
        "categories": {k: v / ops for k, v in cats.items()},
        "objects": dict(sorted(objects.items(), key=lambda kv: -kv[1])[:15]),
        "functions": {f"{fn} [{os.path.basename(obj)}]": ir / ops for (obj, fn), ir in
                      sorted(by_fn.items(), key=lambda kv: -kv[1])[:40]},
    }


def compare(tl, uv):
    """The verdict of one row: tideloop's instructions per op against
    uvloop's, by category; which category holds most of the difference."""
    diff = {k: tl["categories"][k] - uv["categories"][k] for k in CATEGORIES}
    gap = tl["ir_per_op"] - uv["ir_per_op"]
    worst = max(diff, key=lambda k: diff[k]) if gap > 0 else min(diff, key=lambda k: diff[k])
    share = diff[worst] / gap if gap else 0.0
    tl_loop_share = tl["categories"]["loop"] / tl["ir_per_op"]
    uv_loop_share = uv["categories"]["loop"] / uv["ir_per_op"]
    head = (f"tideloop {tl['ir_per_op']:,.0f} vs uvloop {uv['ir_per_op']:,.0f} instr/op "
            f"({gap:+,.0f}, {gap / uv['ir_per_op']:+.1%}): "
            + ", ".join(f"{k} {diff[k]:+,.0f}" for k in CATEGORIES) + "; ")
    if gap > 0:
        where = "in the loop" if worst == "loop" else f"outside the loop, in {worst}"
        text = head + f"most of the extra instructions are {where} ({share:.0%} of the net difference)"
    else:
        text = head + ("tideloop executes fewer user-space instructions, "
                       + ("most of the saving in its loop" if worst == "loop"
                          else f"most of the saving in {worst}")
                       + ": a CPU/op miss is not in them (kernel time, cache misses or noise)")
    # the best tideloop could do on instructions by making its loop free
    bound = (tl["ir_per_op"] - tl["categories"]["loop"]) / uv["ir_per_op"]
    text += (f"; the loop is {tl_loop_share:.1%} of tideloop's instructions and "
             f"{uv_loop_share:.1%} of uvloop's: with a loop costing nothing tideloop would "
             f"still execute {bound:.2f}x uvloop's instructions")
    fn_diff = {}
    for name in set(tl["functions"]) | set(uv["functions"]):
        fn_diff[name] = tl["functions"].get(name, 0.0) - uv["functions"].get(name, 0.0)
    top = dict(sorted(fn_diff.items(), key=lambda kv: -abs(kv[1]))[:10])
    return {"gap_ir_per_op": gap, "gap_share": gap / uv["ir_per_op"],
            "free_loop_bound": bound, "loop_share": {"tideloop": tl_loop_share,
                                                     "uvloop": uv_loop_share},
            "by_category": diff, "largest": worst, "largest_share": share,
            "in_loop": worst == "loop", "verdict": text, "functions_diff": top}


# --------------------------------------------------------------------------
# Runs under callgrind
# --------------------------------------------------------------------------

def callgrind_control(*args):
    proc = subprocess.run(["callgrind_control", *args], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0 or "OK" not in proc.stdout:
        raise RuntimeError(f"callgrind_control {' '.join(args)} failed: "
                           f"{(proc.stdout + proc.stderr).strip()[-300:]}")


def valgrind_prefix(outdir):
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={outdir}/callgrind.out.%p"]


def dump_path(outdir, pid):
    path = os.path.join(outdir, f"callgrind.out.{pid}.1")
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no callgrind dump {path}")
        time.sleep(0.2)
    time.sleep(0.5)          # written by the time callgrind_control says OK; be sure
    return path


def profile_server(cfg, loop, row, outdir, script, seconds):
    errlog = os.path.join(outdir, f"{row.name}-{loop}.err")
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(valgrind_prefix(outdir) + apps.worker_command(cfg, loop, row),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                env=cfg.env, cwd=ROOT)
    try:
        line = procs.read_line(proc, time.monotonic() + START_TIMEOUT)
        if line is None or not line.startswith("READY "):
            raise RuntimeError(f"no READY under valgrind: {apps._tail(errlog, 2)}")
        port = int(line.split()[1])
        url = f"http://127.0.0.1:{port}{row.path}"
        apps.prime(port, row.path, apps.PRIME_PER_PROCESS)
        apps.run_wrk(cfg, url, WARMUP_S, script)
        callgrind_control("-i", "on", str(proc.pid))
        result = apps.run_wrk(cfg, url, seconds, script)
        callgrind_control("-d", str(proc.pid))
        apps._check_wrk(result, "profiled run")
        return dump_path(outdir, proc.pid), result["requests"]
    finally:
        procs.stop(proc)


def profile_client(cfg, loop, row, outdir, services):
    errlog = os.path.join(outdir, f"{row.name}-{loop}.err")
    cmd = valgrind_prefix(outdir) + apps.worker_command(
        cfg, loop, row, cfg.counts[row.name], services, window=True)
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                env=cfg.env, cwd=ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT + 600
        result = None
        while True:
            line = procs.read_line(proc, deadline)
            if line is None:
                raise RuntimeError(f"client ended without a result: {apps._tail(errlog, 2)}")
            if line == "WINDOW":
                callgrind_control("-i", "on", str(proc.pid))
            elif line == "END":
                callgrind_control("-d", str(proc.pid))
            elif line.startswith("{"):
                result = json.loads(line)
                break
            else:
                continue
            proc.stdin.write(b"\n")
            proc.stdin.flush()
        proc.wait(120)
        return dump_path(outdir, proc.pid), result["ops"]
    finally:
        procs.stop(proc)


def kernel_shares(results_doc, name):
    """{loop: system share of CPU} of a row from an apps.py --json document."""
    if not results_doc:
        return {}
    for r in results_doc.get("results", []):
        if r["kind"] != name:
            continue
        out = {}
        for loop, xs in r["samples"].items():
            u = sum(x.get("server_utime_s", x.get("utime_s", 0)) for x in xs)
            s = sum(x.get("server_stime_s", x.get("stime_s", 0)) for x in xs)
            if u + s > 0:
                out[loop] = s / (u + s)
        return out
    return {}


def missed_rows(results_doc):
    return [r["kind"] for r in results_doc.get("results", [])
            if r.get("tl_vs_uvloop") is not None
            and r["tl_vs_uvloop"] > apps.TARGETS["uvloop"]]


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def table(rows):
    header = (["row", "profiled as", "loop", "ops", "instr/op"]
              + [f"{c} /op" for c in CATEGORIES] + ["loop share", "kernel share (timing)"])
    body = []
    for r in rows:
        for loop, b in r["loops"].items():
            cats = b["categories"]
            ks = r["kernel_share"].get(loop)
            body.append([r["row"], r["profiled_as"], loop, f"{b['ops']:,}",
                         f"{b['ir_per_op']:,.0f}"]
                        + [f"{cats[c]:,.0f}" for c in CATEGORIES]
                        + [f"{cats['loop'] / b['ir_per_op']:.1%}",
                           "-" if ks is None else f"{ks:.0%}"])
    return header, body


def report(rows, markdown):
    """The table, one verdict line per row, how to read them."""
    header, body = table(rows)
    print()
    print(harness.markdown_table(header, body, left={0, 1, 2}) if markdown
          else harness.text_table(header, body, left={0, 1, 2}))
    print()
    for r in rows:
        if "comparison" in r:
            print(f"- {r['row']}: {r['comparison']['verdict']}")
    print()
    print("instr/op = instructions executed (callgrind Ir, self cost summed per ELF object) "
          "per op in the measured window; loop share = the loop category's part of them; "
          "kernel share = system time / CPU time of the row in the timing run (--results), "
          "which callgrind does not count.")


def rerender(path, markdown):
    """--report: the verdicts again from a saved --json document (with this
    version's comparison), without running anything."""
    with open(path) as f:
        doc = json.load(f)
    rows = doc["rows"]
    for r in rows:
        if "tideloop" in r["loops"] and "uvloop" in r["loops"]:
            r["comparison"] = compare(r["loops"]["tideloop"], r["loops"]["uvloop"])
    report(rows, markdown)
    print(f"from {path}: {doc['command']}")
    return 0


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.apps_callgrind",
        description="Callgrind breakdown of app-benchmark rows (bench/apps.py): "
                    "instructions per op in the loop, the interpreter, the framework's "
                    "extensions and libc, for uvloop and tideloop, with a parsed verdict.")
    p.add_argument("--results", default=None, metavar="JSON",
                   help="an apps.py --json document: profile the rows where tideloop's "
                        "CPU/op > 0.90x uvloop's (unless --only), and take the kernel share "
                        "from its samples")
    p.add_argument("--only", default=None, metavar="ROWS",
                   help="rows to profile, from: " + ",".join(apps.ROW_NAMES))
    p.add_argument("--loops", default="uvloop,tideloop", metavar="LIST",
                   help="loops to profile (default: %(default)s)")
    p.add_argument("--seconds", type=int, default=5,
                   help="HTTP rows: seconds of wrk load profiled (default: %(default)s)")
    p.add_argument("--scale", type=float, default=0.2,
                   help="client rows: the operation counts of bench/apps.py times X "
                        "(default: %(default)s), one COPY/fetch round")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep the callgrind files in DIR")
    p.add_argument("--report", default=None, metavar="JSON",
                   help="print the table and verdicts of a saved --json document and exit")
    harness.add_output_options(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.time()
    log = harness.log_stderr
    if args.report:
        return rerender(args.report, args.markdown)
    for tool in ("valgrind", "callgrind_control"):
        if not shutil.which(tool):
            return harness.usage_error(f"apps_callgrind: {tool} is not installed "
                                       f"(bash tools/ensure_debian_package.sh valgrind)")
    results_doc = None
    if args.results:
        with open(args.results) as f:
            results_doc = json.load(f)
    if args.only:
        names = harness.pick(args.only, apps.ROW_NAMES, "row")
        if names is None:
            return 2
    elif results_doc is not None:
        names = missed_rows(results_doc)
        if not names:
            print("no row missed the target: nothing to profile")
            return 0
    else:
        return harness.usage_error("apps_callgrind: give --results or --only")
    loops = harness.pick(args.loops, harness.ALL_LOOPS, "loop", given_order=True)
    if loops is None:
        return 2
    profiled = {n: PROFILED_AS.get(n, n) for n in names}
    cfg = apps.make_config(apps.build_parser().parse_args(
        ["--only", ",".join(sorted(set(profiled.values()))), "--scale", f"{args.scale:g}",
         "--repeat", "1"]))
    cfg.rounds = 1
    outdir = args.keep or tempfile.mkdtemp(prefix="tideloop-apps-cg-")
    os.makedirs(outdir, exist_ok=True)
    script = os.path.join(outdir, "done.lua")
    with open(script, "w") as f:
        f.write(apps.WRK_LUA)
    rows_by_name = {r.name: r for r in cfg.rows}
    measured = {}                     # profiled row name -> {loop: breakdown}
    out_rows = []
    try:
        with apps.Services(cfg.rows, outdir, log) as services:
            for name in names:
                target = profiled[name]
                row = rows_by_name[target]
                if target not in measured:
                    measured[target] = {}
                    for loop in loops:
                        log(f"  {target:<17} {loop:<9} under callgrind ...")
                        t0 = time.monotonic()
                        if row.how == "client":
                            path, ops = profile_client(cfg, loop, row, outdir, services)
                        else:
                            path, ops = profile_server(cfg, loop, row, outdir, script,
                                                       args.seconds)
                        by_obj, by_fn, total = read_callgrind(path)
                        if total is not None and total != sum(by_obj.values()):
                            raise RuntimeError(f"{path}: self costs sum to "
                                               f"{sum(by_obj.values())}, totals: says {total}")
                        measured[target][loop] = breakdown(by_obj, by_fn, ops)
                        log(f" {ops:,} ops, {measured[target][loop]['ir_per_op']:,.0f} "
                            f"instr/op ({time.monotonic() - t0:.0f} s)\n")
                res = {"row": name, "profiled_as": target, "loops": measured[target],
                       "kernel_share": kernel_shares(results_doc, name)}
                if "tideloop" in res["loops"] and "uvloop" in res["loops"]:
                    res["comparison"] = compare(res["loops"]["tideloop"], res["loops"]["uvloop"])
                out_rows.append(res)
    finally:
        if not args.keep:
            shutil.rmtree(outdir, ignore_errors=True)

    report(out_rows, args.markdown)
    command = " ".join(["python3"] + ["-m", "bench.apps_callgrind"] + sys.argv[1:])
    harness.print_reproduce(command, time.time() - started)
    if args.json:
        doc = harness.json_head(FORMAT, command, started, time.time() - started)
        doc.update({"seconds": args.seconds, "scale": args.scale, "loops": loops,
                    "results_from": args.results, "rows": out_rows})
        harness.write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
