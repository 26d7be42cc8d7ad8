#!/usr/bin/env python3
"""Fill the generated regions of the documentation from the result files.

The documentation is README.md, bench/README.md and every page of the
MkDocs site (docs/*.md).

    python tools/docs_tables.py            # rewrite every generated region
    python tools/docs_tables.py --check    # exit 1 if one is out of date

A region is the text between a line ``<!-- generated: NAME ... -->`` and the
next ``<!-- end generated -->``; NAME selects the generator below, which
reads a file under results/.  Figures in the docs come from those files and
nowhere else.
"""
import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# tools/matrix.py holds the table's one definition (tools/interpreter_imports.py
# what its verdicts mean): beside this file when run
# as a script, tools.matrix when imported as a module.
if __package__:
    from . import interpreter_imports, matrix
else:
    import interpreter_imports  # noqa: E402
    import matrix  # noqa: E402

FIXED_DOCS = ["README.md", "bench/README.md"]


def docs_files(repo=REPO):
    """README.md, bench/README.md and every page of the documentation site."""
    pages = sorted(os.path.relpath(p, repo)
                   for p in glob.glob(os.path.join(repo, "docs", "**", "*.md"), recursive=True))
    return [rel for rel in FIXED_DOCS if os.path.exists(os.path.join(repo, rel))] + pages
REGION = re.compile(r"(<!-- generated: (\w+)[^\n]*-->\n)(.*?)(<!-- end generated -->)", re.S)


def _load(name):
    with open(os.path.join(REPO, "results", name)) as f:
        return json.load(f)


def matrix_table():
    return matrix.markdown_report(_load("matrix.json"))


SPREAD_VARIANTS = {   # bench/worker_spread.py's variant: (its name in the docs, its socket(s))
    "uvicorn-worker": ("`uvicorn_worker.UvicornWorker` (uvloop; the baseline)",
                       "the arbiter's, shared"),
    "uvicorn-worker+reuse-port": ("`uvicorn_worker.UvicornWorker`, `--reuse-port`",
                                  "one bound in each worker"),
    "asyncio-uvicorn-shared": ("`uvicorn_worker.UvicornWorker` on asyncio's loop",
                               "the arbiter's, shared"),
    "tideloop-uvicorn-shared": ("tideloop's `UvicornWorker` before", "the arbiter's, shared"),
    "tideloop.workers.UvicornWorker": ("`tideloop.workers.UvicornWorker`",
                                       "one per worker slot, kept by the arbiter"),
    "tideloop-aiohttp-shared": ("tideloop's `AiohttpWorker` before", "the arbiter's, shared"),
    "tideloop.workers.AiohttpWorker": ("`tideloop.workers.AiohttpWorker`",
                                       "one per worker slot, kept by the arbiter"),
    "stray-arbiter-socket": ("the trap (bench only)",
                             "one per worker, and the arbiter's left listening"),
}


def worker_spread_table():
    """bench/worker_spread.py's results: a row per worker class."""
    doc = _load("worker-spread.json")
    by = {(s["variant"], s["mode"]): s for s in doc["summary"]}

    def ratio(x):
        return "inf" if x is None else f"{x:.2f}"

    def spread(variant, mode):
        s = by.get((variant, mode))
        if s is None:
            return "-"
        return f"{ratio(s['max_min_median'])} ({', '.join(ratio(x) for x in s['max_min'])})"

    def restarts(variant, mode):
        s = by.get((variant, mode))
        if s is None:
            return "-"
        return f"{s['errors_total']:,}, {s['p99_ms_median']:.0f} ms"

    variants = []
    for s in doc["summary"]:
        if s["variant"] not in variants:
            variants.append(s["variant"])
    rounds = doc["rounds"]
    lines = [
        "| worker class, 2 workers | listening socket | keep-alive: max/min requests per worker, "
        f"median ({rounds} rounds) | busiest worker's share | `Connection: close`: max/min | "
        f"`--max-requests 400`: wrk errors ({rounds} runs), p99 latency | a HUP every second: "
        "wrk errors, p99 latency |",
        "|:---|:---|---:|---:|---:|---:|---:|"]
    for v in variants:
        name, sockets = SPREAD_VARIANTS.get(v, (v, ""))
        share = by.get((v, "keepalive"), {}).get("top_share_median")
        lines.append(f"| {name} | {sockets} | {spread(v, 'keepalive')} | "
                     f"{'-' if share is None else format(share, '.0%')} | "
                     f"{spread(v, 'close')} | {restarts(v, 'maxreq')} | {restarts(v, 'hup')} |")
    lines.append("")
    versions = doc["versions"]
    lines.append(f"gunicorn {doc['gunicorn']}, uvicorn {versions.get('uvicorn')}, uvicorn-worker "
                 f"{versions.get('uvicorn_worker')} (its \"auto\": uvloop {versions.get('uvloop')}, "
                 f"httptools {versions.get('httptools')}), aiohttp {versions.get('aiohttp')}; "
                 f"Python {doc['python']}, Linux {doc['kernel']}, {doc['cpus']} CPUs shared with "
                 f"wrk; {doc['seconds']:g} s per run, the variants interleaved: "
                 f"`{command({'command': doc['reproduce']})}` (`results/worker-spread.json`).")
    return "\n".join(lines) + "\n"


THREADS_FILES = ("threads-3.11.json", "threads-3.13t.json")
THREADS_LOOPS = ("asyncio", "uvloop", "tideloop")


def threads_table():
    """bench/threads.py's results: CPU per request, N loops in N threads."""
    def us(row, base, loop):
        x = row["cpu_us_per_req"].get(loop) if row else None
        if x is None:
            return "error" if row and loop in row["errors"] else "-"
        b = base["cpu_us_per_req"].get(loop) if base is not row else None
        return f"{x:.1f}" + (f" ({x / b:.2f}x)" if b else "")

    lines = ["| interpreter, GIL | loops | echo, µs/request: asyncio | uvloop | tideloop "
             "| in-process, µs/round trip: asyncio | uvloop | tideloop |",
             "|:---|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for name in THREADS_FILES:
        doc = _load(name)
        build = name[len("threads-"):-len(".json")]
        echo, inproc = doc["results"], doc.get("inproc") or []
        for mode in dict.fromkeys(r["gil_mode"] for r in echo):
            label = build + ("" if mode == "default" else f", `PYTHON_GIL={int(mode == 'on')}`")
            e = {r["loops_n"]: r for r in echo if r["gil_mode"] == mode}
            i = {r["loops_n"]: r for r in inproc if r["gil_mode"] == mode}
            for n in sorted(e):
                cells = [us(e.get(n), e.get(1), loop) for loop in THREADS_LOOPS]
                cells += [us(i.get(n), i.get(1), loop) for loop in THREADS_LOOPS]
                lines.append(f"| {label} | {n} | " + " | ".join(cells) + " |")
        verdicts = []
        for key, what in (("scaling", "echo 2 loops / 1"), ("inproc_scaling", "in-process 2 / 1")):
            for v in doc.get(key) or []:
                if v.get("target"):
                    verdicts.append(f"{what}, GIL {v['gil_mode']}: "
                                    f"{v['ratio']['tideloop']:.2f}x, {v['verdict']}")
        for key, what in (("gil_ratio", "echo"), ("inproc_gil_ratio", "in-process")):
            g = doc.get(key)
            if g:
                verdicts.append(f"{what} GIL off / on, 1 loop: {g['ratio']['tideloop']:.2f}x, "
                                f"{g['verdict']}")
        for m in doc.get("mixed") or []:
            ratios = ", ".join(f"{loop} {m['ratio_idle'][loop]:.2f}x"
                               for loop in THREADS_LOOPS if m["ratio_idle"].get(loop))
            verdicts.append(f"two to_thread jobs / one, GIL {m['gil_mode']}: {ratios} "
                            f"({m['verdict']})")
        notes.append(f"{build} (tideloop against the targets): " + "; ".join(verdicts)
                     + f". `{command(doc)}` (`results/{name}`).")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


# --- extension modules in isolated interpreters -------------------------------

IMPORTS_GROUPS = (   # a package's group (imports_group()): the words before its table
    ("refuse", "**Refuse to load** in an isolated interpreter (the package, or a module that "
               "it needs):"),
    ("partial", "**Import, but without their C extension**, which refuses: the package falls "
                "back to pure Python (\"falls back\": the check below says so):"),
    ("ok", "**Import** in an isolated interpreter:"),
    ("absent", "**Not there** on the interpreters probed:"),
)
REFUSAL = re.compile(r"module (\S+) does not support loading in subinterpreters")
WHEN = {"close": "when the interpreter is closed", "exit": "at the process's exit"}


def _shorten(text, n=72):
    text = text.strip()
    return text if len(text) <= n else text[:n - 1].rstrip() + "…"


def imports_cell(rec, packages):
    """One module on one interpreter, as a cell: ok, refuses, crash, ..."""
    ii = interpreter_imports
    v = ii.verdict(rec, packages)
    iso, main = rec["isolated"], rec["main"]
    after = iso.get("after", {})
    if v == "not installable":
        return "not installable"
    if v == "absent":
        return ("not in this build" if rec["package"] == ii.STDLIB else
                "not in the installed package" if rec.get("version") else "not installed")
    if v == "fails":
        return f"fails in the main interpreter too (`{main.get('type')}`)"
    if iso.get("result") == "crash":
        return f"crashes the process ({iso['signal']})"
    if iso.get("result") == "timeout":
        return "hangs"
    if iso.get("result") == "ok":
        text = "ok, falls back" if ii.fell_back(rec) else "ok"
    else:
        why = iso.get("reason") or iso.get("message") or ""
        m = REFUSAL.fullmatch(why)
        if m:
            text = "refuses" + ("" if m.group(1) == rec["module"] else f" (`{m.group(1)}`)")
        else:
            text = f"`{iso.get('type')}`: {_shorten(why)}"
    if "signal" in after:
        text += f", then {after['signal']} {WHEN.get(after.get('when'), '')}".rstrip()
    elif "timeout" in after:
        text += ", then hangs"
    elif "error" in after:
        text += f", then {_shorten(after['error'], 40)}"
    return text.replace("|", "\\|")


def imports_group(rows):
    """A package's group from its rows' verdicts on one interpreter:
    rows = [(record, packages), ...].  A package whose extension refuses goes
    with those that refuse unless it was seen to fall back to pure Python."""
    ii = interpreter_imports
    verdicts = [(rec, ii.verdict(rec, pk)) for rec, pk in rows]
    fails = [rec for rec, v in verdicts if v in ("refuses", "crash")]
    fell_back = any(ii.fell_back(rec) for rec, v in verdicts)
    if any(not rec.get("ext") for rec in fails) or (fails and not fell_back):
        return "refuse"
    if fell_back:
        return "partial"
    if any(v == "ok" for rec, v in verdicts):
        return "ok"
    return "absent"


def interpreter_imports_table():
    """tools/interpreter_imports.py: which modules import in an isolated
    subinterpreter, a table per group, a column per interpreter.  A package's
    group is its outcome on the newest interpreter that has all its modules
    (the columns show where the others differ)."""
    ii = interpreter_imports
    doc = _load("interpreter-imports.json")
    interps = doc["interpreters"]
    versions = list(interps)
    order, by = [], {}          # module -> {version: record}
    for v in versions:
        for rec in interps[v]["modules"]:
            if rec["module"] not in by:
                order.append(rec["module"])
            by.setdefault(rec["module"], {})[v] = rec
    packages = []               # (package key, [modules]) in the probes' order
    for mod in order:
        first = next(iter(by[mod].values()))
        key = mod if first["package"] == ii.STDLIB else ii.PART_OF.get(first["package"],
                                                                        first["package"])
        if not packages or packages[-1][0] != key:
            packages.append((key, []))
        packages[-1][1].append(mod)

    def rows_on(mods, v):
        return [(by[m][v], interps[v].get("packages")) for m in mods if v in by[m]]

    def label(mod, with_package):
        recs = by[mod]
        pkg = next(iter(recs.values()))["package"]
        if not with_package:
            return f"`{mod}`"
        if pkg == ii.STDLIB:
            return f"`{mod}` (stdlib)"
        seen = {}
        for v, r in recs.items():
            if r.get("version"):
                seen.setdefault(r["version"], []).append(v)
        if len(seen) > 1:
            vs = "; ".join(f"{ver} on {', '.join(on)}" for ver, on in seen.items())
        else:
            vs = next(iter(seen), "")
        return f"`{mod}` ({pkg}{' ' + vs if vs else ''})"

    header = ["module (package)"] + [f"isolated interpreter, {interps[v]['version'].split()[0]}"
                                     for v in versions]
    groups = {name: [] for name, _ in IMPORTS_GROUPS}
    checks = {}                 # module -> (check, value here, in the main interpreter)
    for key, mods in packages:
        complete = [v for v in versions if all(
            ii.verdict(r, pk) not in ("absent", "not installable") for r, pk in rows_on(mods, v))]
        group = groups[imports_group(rows_on(mods, (complete or versions)[-1]))]
        for i, mod in enumerate(mods):
            pkg = next(iter(by[mod].values()))["package"]
            prev = i and next(iter(by[mods[i - 1]].values()))["package"]
            group.append([label(mod, pkg != prev)] + [
                imports_cell(by[mod][v], interps[v].get("packages")) if v in by[mod] else "-"
                for v in versions])
            for v in versions:
                if v in by[mod] and ii.fell_back(by[mod][v]):
                    checks[mod] = ii.fell_back(by[mod][v])
    parts = []
    for name, words in IMPORTS_GROUPS:
        if groups[name]:
            parts.append(words + "\n\n" + table(header, groups[name], left=len(header)))
    notes = ["A package's table is what it does on the newest interpreter that has all its "
             "modules; the columns show where the others differ. \"refuses\": `import` raises "
             "`ImportError: module M does not support loading in subinterpreters` (M named "
             "when it is not the row's module): M is an extension module with single-phase "
             "initialization, or one that does not declare "
             "`Py_MOD_PER_INTERPRETER_GIL_SUPPORTED`. Every row imports in the main "
             "interpreter unless its cell says otherwise."]
    if checks:
        notes.append("\"falls back\": after the import, " + "; ".join(
            f"`{c}` is `{here}` (in the main interpreter `{there}`)"
            for c, here, there in checks.values()) + ".")
    failed = [f"{v}: {pkg} ({p.get('error', '?')})" for v in versions
              for pkg, p in (interps[v].get("packages") or {}).items()
              if p.get("status") == "not installable"]
    if failed:
        notes.append("Not installable: " + "; ".join(_shorten(f, 120) for f in failed) + ".")
    built = sorted({f"{name} on {v}" for v in versions
                    for p in (interps[v].get("packages") or {}).values()
                    for name in p.get("built_from_source", [])})
    ran = ", ".join(f"{r['version'].split()[0]} ({r['date']}, `{r['api']}`)"
                    for r in interps.values())
    notes.append(f"Python {ran}; pip's newest releases, wheels preferred"
                 + (f" (built from source: {', '.join(built)})" if built else "")
                 + f"; `{command(doc)}` (`results/interpreter-imports.json`).")
    return "\n\n".join(parts + notes) + "\n"


# --- isolated interpreters benchmark ------------------------------------------

INTERP_FILES = ("interpreters-3.14.json", "interpreters-3.15.json")
INTERP_WAYS = {   # bench/interpreters.py's ways, as the docs name them
    "tl-interp": "tideloop, isolated interpreters",
    "tl-threads": "tideloop, threads (one GIL)",
    "tl-procs": "tideloop, worker processes",
    "aio-interp": "asyncio's loop, isolated interpreters",
}


def interpreters_table():
    """bench/interpreters.py's results: a row per interpreter and way; the
    targets and their verdicts under it, per interpreter."""
    def by_n(doc, kind):
        return {r["loops_n"]: r for r in doc["results"] if r["kind"] == kind}

    def us(rows, way):
        one, two = rows.get(1), rows.get(2)
        cells = []
        for r in (one, two):
            x = r["cpu_us_per_req"].get(way) if r else None
            if x is None:
                cells.append("error" if r and way in r["errors"] else "-")
                continue
            b = one["cpu_us_per_req"].get(way) if r is two and one else None
            cells.append(f"{x:.1f}" + (f" ({x / b:.2f}x)" if b else ""))
        return cells

    def mib(kib):
        return "-" if kib is None else f"{kib / 1024:.1f}"

    lines = ["| Python | way | echo, req/s: N=1 | N=2 | echo, µs/request: N=1 | N=2 "
             "| in-process, µs/round trip: N=1 | N=2 | fixed work, wall time N=2 / N=1 "
             "| memory, MiB: N=1 | one more |",
             "|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for name in INTERP_FILES:
        doc = _load(name)
        py = doc["environment"]["python"]
        echo, inproc = by_n(doc, "echo"), by_n(doc, "inproc")
        mem = doc.get("memory") or {}
        for way in doc["variants"]:
            rps = [rate(echo[n]["rps"].get(way)) if n in echo else "-" for n in (1, 2)]
            wall = [inproc[n]["wall_s"].get(way) if n in inproc else None for n in (1, 2)]
            extra = (mem.get("extra_kib") or {}).get(way) or {}
            one_more = extra.get("pss_kib" if way == "tl-procs" else "rss_kib")
            lines.append(f"| {py} | {INTERP_WAYS.get(way, way)} | " + " | ".join(
                rps + us(echo, way) + us(inproc, way)
                + [ratio(wall[1] / wall[0]) if all(wall) else "-",
                   mib(((mem.get("n1") or {}).get(way) or {}).get("rss_kib")),
                   mib(one_more) + (" (PSS)" if way == "tl-procs" and one_more else "")])
                + " |")
        verdicts = []
        for t in doc["targets"]:
            if t["target"] is None or "tl-interp" not in t["ratio"]:
                continue
            what = t["what"].replace("in-process: ", "in-process ")
            verdicts.append(f"{what}: {t['ratio']['tl-interp']:.2f}x "
                            f"(<={t['target']:.2f}x, {t['verdict']})")
        if mem.get("extra_kib", {}).get("tl-interp") and mem["extra_kib"].get("tl-procs"):
            e, pr = mem["extra_kib"]["tl-interp"], mem["extra_kib"]["tl-procs"]
            verdicts.append(f"an extra interpreter {mib(e['rss_kib'])} MiB RSS, an extra "
                            f"process {mib(pr['pss_kib'])} MiB PSS ({mib(pr['rss_kib'])} RSS, "
                            f"{mib(pr['uss_kib'])} USS)")
        load = doc["environment"].get("background_load") or {}
        notes.append(f"{py}, tideloop in interpreters against the targets: "
                     + "; ".join(verdicts)
                     + (f". The rest of the machine kept a median {load['median_cpu']:.0%} "
                        f"of a CPU busy during the runs" if load else "")
                     + f". `{command(doc)}` (`results/{name}`).")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


# --- shared formatting -------------------------------------------------------

LOOPS = ("asyncio", "uvloop", "tideloop")
SHORT = {"asyncio": "aio", "uvloop": "uv", "tideloop": "tl", "c": "C", "blocking": "blk",
         "peer": "best peer"}


def sig(x):
    """A figure to about three significant digits, thousands separated."""
    if x is None:
        return "-"
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def rate(x):
    """A rate: 950, 31.0k, 2.35M."""
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}" if x >= 10 else f"{x:.2f}"


def ratio(x):
    return "-" if x is None else f"{x:.2f}x"


def table(header, rows, left=1):
    """A markdown table; the first `left` columns are left-aligned."""
    rule = ["|:---"] * left + ["|---:"] * (len(header) - left)
    return "\n".join(["| " + " | ".join(header) + " |", "".join(rule) + "|"]
                     + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def command(doc):
    """The command that made a result file, as the docs spell the benchmarks."""
    cmd = re.sub(r"^(PYTHONPATH=src )?\S*python3?(\.\d+)? ", "python ", doc["command"])
    return re.sub(r"python bench/(\w+)\.py", r"python -m bench.\1", cmd)


def environment(doc, *extra):
    env = doc.get("environment", {})
    loops = env.get("loops", {})
    parts = [f"Python {env.get('python', '?')}", f"{env.get('cpus', '?')} CPUs"]
    if "uvloop" in loops:
        parts.append(loops["uvloop"])
    return ", ".join(parts + list(extra))


def footer(doc, name, *extra):
    return (f"\n\n{environment(doc, *extra)}; `{command(doc)}` (`results/{name}`).")


def targets(t):
    if not t:
        return "-"
    return ", ".join(f"<={v:.2f}x {SHORT.get(k, 'C' if k == 'c_server' else k)}"
                     for k, v in t.items())


def loops_of(doc, key=None):
    """The loops a benchmark's results have figures for, in the usual order."""
    present = set()
    for r in doc["results"]:
        present.update(r[key] if key else r.get("cpu_us_per_req") or r.get("cpu_per_unit") or {})
    return [loop for loop in LOOPS if loop in present]


# --- the benchmarks ----------------------------------------------------------

def micro_table():
    """python -m tideloop bench: ns per operation, median of the runs."""
    doc = _load("micro.json")
    loops = loops_of(doc, "ns_per_op")
    header = (["benchmark (ns/op, median)"] + loops
              + ["tl/aio", "tl/uv", "target (tl/uv)", "result"])
    rows = []
    for r in doc["results"]:
        ns = r["ns_per_op"]
        t = r.get("target_vs_uvloop")
        rows.append([r["label"]] + [sig(ns.get(lp)) if lp not in r.get("errors", {}) else "ERROR"
                                    for lp in loops]
                    + [ratio(r.get("ratio_vs_asyncio")), ratio(r.get("ratio_vs_uvloop")),
                       "-" if t is None else f"<={t:.2f}x", r.get("verdict", "-")])
    return table(header, rows) + footer(doc, "micro.json", f"median of {doc['repeat']}")


def _net(name):
    doc = _load(name)
    loops = loops_of(doc) + ["c"]
    header = (["kind", "size", "conns"] + [f"{SHORT[lp]} rps" for lp in loops]
              + [f"{SHORT[lp]} µs/req" for lp in loops]
              + ["tl/aio", "tl/uv", "tl/C", "target (CPU/req)", "result"])
    rows = []
    for r in doc["results"]:
        size = r["size"]
        size = f"{size // 1024} KiB" if size >= 1024 else f"{size} B"
        rows.append([r["kind"], size, r["conns"]]
                    + [rate(r["rps"].get(lp)) for lp in loops]
                    + [sig(r["cpu_us_per_req"].get(lp)) for lp in loops]
                    + [ratio(r.get("tl_vs_asyncio")), ratio(r.get("tl_vs_uvloop")),
                       ratio(r.get("tl_vs_c")), targets(r.get("targets")),
                       r.get("verdict", "-")])
    return table(header, rows, left=1) + footer(
        doc, name, f"median of {doc['repeat']} interleaved {doc['duration_s']:g} s runs")




def io_table():
    """python -m bench.io: the loop process's CPU per unit (blk: no loop at all)."""
    doc = _load("io.json")
    loops = loops_of(doc)
    cols = loops + ["blocking"]
    header = (["workload", "size"] + [f"{SHORT[lp]} rate" for lp in loops]
              + [f"{SHORT[lp]} CPU" for lp in cols] + ["CPU per", "tl/uv", "tl/aio", "result"])
    names = {"udp": "UDP echo", "spawn": "spawn + wait `/bin/true`",
             "spawn_pipe": "spawn + communicate `echo`", "pipe_read": "read from a pipe",
             "pipe_write": "write into a pipe"}
    rows = []
    for r in doc["results"]:
        unit = r["unit"]
        rows.append([names.get(r["workload"], r["workload"]), r["label"]]
                    + [rate(r["rate"].get(lp)) + f" {unit}/s" for lp in loops]
                    + [sig(r["cpu_per_unit"].get(lp)) for lp in cols]
                    + [r["cpu_unit"], ratio(r.get("tl_vs_uvloop")), ratio(r.get("tl_vs_asyncio")),
                       r.get("verdict", "-")])
    t = doc["targets"]
    return table(header, rows, left=2) + footer(
        doc, "io.json", f"median of {doc['repeat']} interleaved runs",
        f"targets <={t['uvloop']}x uvloop and <={t['asyncio']}x asyncio")


def apps_table():
    """python -m bench.apps: each framework's process CPU per operation."""
    doc = _load("apps.json")
    loops = loops_of(doc)
    header = (["row", "what", "op"] + [f"{SHORT[lp]} ops/s" for lp in loops]
              + [f"{SHORT[lp]} µs/op" for lp in loops]
              + ["tl/aio", "tl/uv", "target (CPU/op)", "result"])
    rows = [[r["kind"], r["label"], r["op"]] + [rate(r["rps"].get(lp)) for lp in loops]
            + [sig(r["cpu_us_per_req"].get(lp)) for lp in loops]
            + [ratio(r.get("tl_vs_asyncio")), ratio(r.get("tl_vs_uvloop")),
               targets(r.get("targets")), r.get("verdict", "-")]
            for r in doc["results"]]
    fw = doc["environment"].get("frameworks", {})
    versions = ", ".join(f"{k} {v}" for k, v in fw.items() if v)
    return table(header, rows, left=3) + footer(doc, "apps.json", f"median of {doc['repeat']}",
                                                versions)


def apps_callgrind_table():
    """bench.apps_callgrind: user-space instructions per operation, by ELF object kind."""
    doc = _load("apps-callgrind.json")
    cats = ("loop", "interpreter", "framework", "libc", "other")
    header = (["row", "profiled as", "loop", "ops", "instr/op"] + [f"{c} /op" for c in cats]
              + ["loop share", "kernel share (timing)"])
    rows = []
    for r in doc["rows"]:
        for lp, x in r["loops"].items():
            share = x["categories"]["loop"] / x["ir_per_op"] if x["ir_per_op"] else 0
            ks = (r.get("kernel_share") or {}).get(lp)
            rows.append([r["row"], r["profiled_as"], lp, f"{x['ops']:,}", sig(x["ir_per_op"])]
                        + [sig(x["categories"].get(c)) for c in cats]
                        + [f"{share:.1%}", "-" if ks is None else f"{ks:.0%}"])
    verdicts = "\n".join(f"- {r['comparison']['verdict']}" for r in doc["rows"]
                         if r.get("comparison"))
    return (table(header, rows, left=3) + "\n\n" + verdicts
            + f"\n\n`{command(doc)}` (`results/apps-callgrind.json`).")


TLS_SERVERS = {"asyncio": "asyncio", "uvloop": "uvloop", "tideloop": "tideloop",
               "c": "C OpenSSL server (floor)"}
TLS_GROUPS = ("libcrypto", "libssl", "_ssl", "loop", "python", "libc")


def tls_instr_table():
    """bench.tls_instr: callgrind (and strace) per request, per server and interpreter."""
    lines = []
    for name in ("tls-instr.json", "tls-instr-3.14.json", "tls-instr-handshake.json"):
        doc = _load(name)
        what = ("a full TLS 1.3 handshake and one echo per connection" if "handshake" in name
                else f"TLS echo of {doc['size']} B over {doc['conns']} connections")
        res = doc["results"]
        tl = res.get("tideloop", {}).get("callgrind", {}).get("ir_per_request")
        rows = []
        for srv, label in TLS_SERVERS.items():
            cg = (res.get(srv) or {}).get("callgrind")
            if not cg:
                continue
            ir = cg["ir_per_request"]
            st = (res[srv].get("strace") or {}).get("syscalls_per_request")
            rows.append([label, sig(ir), "-" if srv == "tideloop" or not tl else ratio(tl / ir)]
                        + [sig(cg["groups"].get(g)) for g in TLS_GROUPS]
                        + ["-" if st is None else f"{st:.2f}"])
        header = (["server", "instructions / request", "tideloop / it"] + list(TLS_GROUPS)
                  + ["syscalls / request"])
        py = doc["loops"]["asyncio"].split("(CPython ")[-1].rstrip(")")
        lines.append(f"**{what}**, CPython {py}:\n\n" + table(header, rows)
                     + f"\n\n`{command(doc)}` (`results/{name}`).")
    return "\n\n".join(lines)


def diag_overhead_table():
    """bench.diag_overhead: what each diagnostics feature costs, in instructions."""
    doc = _load("diag-overhead.json")
    labels = {"base": "before the diagnostics",
              "always-on": "always on (counters, histograms): everything optional off",
              "timing": "+ callback timing", "tasks": "+ per-task accounting",
              "all": "all on: timing, slow-callback reports, stall watchdog, tasks"}
    res = doc["results"]
    base = res["base"]
    rows = []
    for key, label in labels.items():
        r = res.get(key)
        if r is None:
            continue
        rel = [("-" if key == "base" else f"{(r[k] / base[k] - 1) * 100:+.1f} %")
               for k in ("call_soon", "echo")]
        rows.append([label, sig(r["call_soon"]), rel[0], sig(r["echo"]), rel[1]])
    header = ["what is on", "call_soon + run (instructions)", "vs before",
              "Protocol echo (instructions / request)", "vs before"]
    thread = " (every process starts one idle thread first)" if doc.get("idle_thread") else ""
    return (table(header, rows) + f"\n\nPython {doc['python'].split()[0]}{thread}; "
            f"`python -m bench.diag_overhead --base {doc['base']}` (`results/diag-overhead.json`).")


def _suites(name):
    doc = _load(name)

    def ppp(side):
        return f"{side['passed']:,}/{side['failed']:,}/{side['skipped']:,}"

    rows = []
    for suite, s in doc["suites"].items():
        flaky = ", ".join(f"`{t.rsplit('::', 1)[-1]}`" for t in s.get("flaky", [])) or "-"
        regr = len(s["regressions"]["listed"]) + len(s["regressions"]["unlisted"])
        rows.append([f"{suite} {s['version']}", ppp(s["stock"]), ppp(s["tideloop"]), regr,
                     flaky, f"{s['seconds']:.0f}"])
    header = ["suite", "stock passed/failed/skipped", "tideloop passed/failed/skipped",
              "regressions", "flaky on tideloop (passed when run again)", "s"]
    verdict = "PASS" if doc["ok"] else "FAIL"
    return (table(header, rows) + f"\n\nPython {doc['python']}, {doc['mode']} mode: {verdict}, "
            f"{doc['seconds']:.0f} s in all (`results/{name}`).")




def instructions_table():
    """tools/instructions.py: the committed baseline and its history: the
    instructions, then the allocator calls, per operation."""
    base = _load("instructions.json")
    hist = _load("instructions-history.json")
    names = list(base["figures"])
    for c in hist["commits"]:
        names += [n for n in c["figures"] if n not in names]
    header = ["tree"] + [f"`{n}`" for n in names]
    trees = ([("baseline (`results/instructions.json`)", base)]
             + [(f"`{c['commit'][:7]}`", c) for c in hist["commits"]])

    def rows(key):
        return [[label] + [sig(doc.get(key, {}).get(n)) for n in names]
                for label, doc in trees]
    return (table(header, rows("figures"))
            + f"\n\n{base['unit']}, Python {base['python']}. Calls into glibc's allocator per"
            " operation:\n\n" + table(header, rows("allocator_calls")))


# --- the peer loops, the scale rows, the instruction counts per version --------

PEER_ORDER = ("asyncio", "uvloop", "tideloop", "zuvloop", "blazio", "rsloop", "rloop",
              "zloop", "aiofastnet+uvloop")
PEER_VERSIONS = ("3.11", "3.14", "3.15")


def _peer_loops(doc, metric):
    """The loops a result file has a figure or an error for, peers' order."""
    present = set()
    for r in doc["results"]:
        present.update(r.get(metric) or {})
        present.update(r.get("errors") or {})
        present.update((r.get("figures") or {}).get(metric, {}))
    present.discard("c")
    loops = [lp for lp in PEER_ORDER if lp in present]
    return loops + sorted(present - set(loops))


def _first_line(err):
    return err.strip().splitlines()[0] if err and err.strip() else "failed"


def _error_notes(errors):
    """(loop, where, error) -> ({(loop, first line): n}, footnotes): each
    loop's error once, numbered."""
    marks, notes = {}, []
    for loop, where, err in errors:
        key = (loop, _first_line(err))
        if key not in marks:
            marks[key] = len(marks) + 1
            notes.append(f"({marks[key]}) {loop}, {where}: `{_shorten(key[1], 110)}`")
    return marks, notes


def _per_version(prefix):
    """(version, file name, document) of each results/<prefix>-<version>.json
    that exists, in PEER_VERSIONS' order."""
    for ver in PEER_VERSIONS:
        name = f"{prefix}-{ver}.json"
        if os.path.exists(os.path.join(REPO, "results", name)):
            yield ver, name, _load(name)


def _loop_cell(x, loop):
    return f"**{sig(x)}**" if loop == "tideloop" and x is not None else sig(x)


def net_peers_table():
    """python -m bench.net --loops all on each version: server CPU per request."""
    out = []
    for ver, name, doc in _per_version("net-peers"):
        loops = _peer_loops(doc, "cpu_us_per_req")
        marks, notes = _error_notes(
            (lp, f"{r['kind']} {r['size'] // 1024} KiB", e)
            for r in doc["results"] for lp, e in r.get("errors", {}).items() if lp != "c")
        header = (["kind", "size"] + loops
                  + ["C floor", "tl / best peer", "tl / C", "target", "result"])
        rows = []
        for r in doc["results"]:
            cells = [r["kind"], f"{r['size'] // 1024} KiB"]
            for lp in loops:
                err = r.get("errors", {}).get(lp)
                cells.append(f"error ({marks[(lp, _first_line(err))]})" if err is not None
                             else _loop_cell(r["cpu_us_per_req"].get(lp), lp))
            best = r.get("best_peer")
            cells += [sig(r["cpu_us_per_req"].get("c")),
                      "-" if best is None else f"{ratio(r.get('tl_vs_best_peer'))} {best}",
                      ratio(r.get("tl_vs_c")), targets(r.get("targets")),
                      r.get("verdict") or "-"]
            rows.append(cells)
        versions = doc.get("environment", {}).get("loops", {})
        text = (f"**CPython {ver}**: server CPU µs per request, median of {doc['repeat']} "
                f"interleaved {doc['duration_s']:g} s runs, 10 connections.\n\n"
                + table(header, rows, left=2))
        if notes:
            text += "\n\n" + "; ".join(notes)
        faulting = doc.get("page_faulting")
        if faulting:
            text += ("\n\nServers that mapped memory per request (median minor page faults "
                     "per request; their CPU per request is mostly the kernel's): "
                     + "; ".join(f"{lp} ({cells})" for lp, cells in faulting.items()) + ".")
        text += ("\n\n" + ", ".join(v for k, v in versions.items()
                                    if k in loops and k != "asyncio" and isinstance(v, str))
                 + f"; `{command(doc)}` (`results/{name}`).")
        out.append(text)
    return "\n\n".join(out) + "\n"


SCALE_MEMORY = (("protocol", "rss_per_conn", "an idle Protocol connection"),
                ("streams", "rss_per_conn", "an idle streams connection"),
                ("tls-protocol", "rss_per_conn", "an idle TLS (Protocol) connection"),
                ("timers", "rss_per_timer", "a pending call_later() timer"),
                ("tasks", "rss_per_task", "a task asleep in asyncio.sleep()"))
SCALE_COSTS = (("timers", "ns_per_call_later", "call_later()"),
               ("timers", "ns_per_cancel", "cancel() of a pending timer"),
               ("timers", "ns_per_fired", "a due timer popped and run"),
               ("tasks", "ns_per_task", "a task created and run to its sleep"),
               ("tasks", "ns_per_task_cancel", "a sleeping task cancelled"))


def scale_table():
    """python -m bench.scale --loops all on each version: memory and costs."""
    out = []
    for ver, name, doc in _per_version("scale"):
        loops = [lp for lp in PEER_ORDER
                 if any(lp in f for r in doc["results"] for f in r["figures"].values())
                 or any(lp in r["errors"] for r in doc["results"])]
        by = {(r["what"], r["n"]): r for r in doc["results"]}
        marks, notes = _error_notes((lp, r["what"], e) for r in doc["results"]
                                    for lp, e in r["errors"].items())
        biggest = max(doc["sizes"])

        def cell(r, metric, lp):
            if r is None:
                return "-"
            if lp in r["errors"]:
                return f"error ({marks[(lp, _first_line(r['errors'][lp]))]})"
            return _loop_cell(r["figures"].get(metric, {}).get(lp), lp)

        def uv_ratio(r, metric):
            fig = (r or {}).get("figures", {}).get(metric, {})
            t, u = fig.get("tideloop"), fig.get("uvloop")
            return ratio(t / u) if t and u else "-"

        mem_rows = []
        for what, metric, label in SCALE_MEMORY:
            n = doc["conns"] if metric == "rss_per_conn" else biggest
            r = by.get((what, n))
            target = (r or {}).get("target", {}).get("uvloop")
            mem_rows.append([f"{label}, N = {n:,}"] + [cell(r, metric, lp) for lp in loops]
                            + [uv_ratio(r, metric),
                               "-" if target is None else f"<={target:.2f}x uv",
                               (r or {}).get("verdict") or "-"])
        cost_rows = []
        for what, metric, label in SCALE_COSTS:
            for n in doc["sizes"]:
                r = by.get((what, n))
                cost_rows.append([f"{label}, N = {n:,}"] + [cell(r, metric, lp) for lp in loops]
                                 + [uv_ratio(r, metric)])
        text = (f"**CPython {ver}**: bytes of RSS per object (each idle connection after "
                f"one echo):\n\n"
                + table(["what"] + loops + ["tl/uv", "target", "result"], mem_rows)
                + f"\n\nns per operation with N of them at once (median of {doc['repeat']} "
                  "fresh processes):\n\n"
                + table(["operation"] + loops + ["tl/uv"], cost_rows))
        if notes:
            text += "\n\n" + "; ".join(notes)
        text += f"\n\n`{command(doc)}` (`results/{name}`)."
        out.append(text)
    return "\n\n".join(out) + "\n"


def instructions_versions_table():
    """tools/instructions.py on each version: tideloop's baseline against
    uvloop's figures measured the same way (--loop uvloop)."""
    rows = []
    for ver in PEER_VERSIONS:
        base = _load("instructions.json" if ver == "3.11" else f"instructions-{ver}.json")
        uv_name = f"instructions-uvloop-{ver}.json"
        uv = (_load(uv_name) if os.path.exists(os.path.join(REPO, "results", uv_name))
              else {"figures": {}})
        for n, t in base["figures"].items():
            u = uv["figures"].get(n)
            rows.append([f"`{n}`", ver, sig(t), sig(u), ratio(t / u) if t and u else "-"])
    rows.sort(key=lambda r: r[0])
    return (table(["workload", "CPython", "tideloop", "uvloop", "tl/uv"], rows, left=2)
            + "\n\nUser-space instructions per operation, glibc's allocator left out. "
              "tideloop's figures are the guarded baselines (`results/instructions.json`, "
              "`results/instructions-3.14.json`, `results/instructions-3.15.json`); uvloop's "
              "come from `python tools/instructions.py --loop uvloop --shifts 2 --json ...` "
              "(`results/instructions-uvloop-*.json`).\n")

def peers_summary_table():
    """README: tideloop against the best other loop, per version and kind,
    at 1 KiB (net-peers-*.json), and the idle-connection memory
    (scale-*.json)."""
    header = ["CPython", "kind (1 KiB echo)", "tideloop µs/req", "best other loop",
              "tideloop / best"]
    rows = []
    for ver, name, doc in _per_version("net-peers"):
        for r in doc["results"]:
            if r["size"] != 1024 or r.get("best_peer") is None:
                continue
            best = r["best_peer"]
            rows.append([ver, r["kind"], sig(r["cpu_us_per_req"].get("tideloop")),
                         f"{best} {sig(r['cpu_us_per_req'].get(best))}",
                         ratio(r.get("tl_vs_best_peer"))])
    mem, conns = [], set()
    for ver, name, doc in _per_version("scale"):
        conns.add(doc["conns"])
        for r in doc["results"]:
            fig = r["figures"].get("rss_per_conn")
            if not fig or "tideloop" not in fig:
                continue
            others = {k: v for k, v in fig.items() if k not in ("tideloop", "asyncio") and v}
            best = min(others, key=others.get) if others else None
            if best:
                mem.append(f"{r['what']} {sig(fig['tideloop'])} B ({best}: {sig(fig[best])}) "
                           f"on {ver}")
    text = table(header, rows, left=2)
    if mem:
        text += (f"\n\nMemory per idle connection (server RSS, "
                 f"{', '.join(f'{n:,}' for n in sorted(conns))} connections), tideloop "
                 "against the lightest other loop: " + "; ".join(mem) + ".")
    return text + ("\n\nServer CPU per request, median of interleaved runs, from "
                   "`results/net-peers-*.json` and `results/scale-*.json` "
                   "([Benchmarks](docs/benchmarks.md#against-every-asyncio-loop)).\n")

# --- the targets: what PASS/FAIL checks (bench/README.md) ---------------------

REF = {"c": "the C server", "c_server": "the C server"}
THREADS_TARGETS = {   # threads.json's target: (what is compared, the rows it applies to)
    "scaling_2_vs_1": ("CPU per request or round trip, 2 loops over 1 loop",
                       "`echo`, `inproc`, GIL off"),
    "gil_off_vs_on": ("CPU per request or round trip, 1 loop, GIL off over GIL on",
                      "`--gil both`"),
    "mixed_two_jobs_vs_one": ("wall time of two `to_thread` jobs over one, loop idle",
                              "`mixed`, GIL off"),
}


INTERP_TARGETS = {   # interpreters-*.json's target_limits: (what is compared, the rows)
    "memory_interp_vs_process": ("memory of one more interpreter (RSS) over one more "
                                 "worker process (PSS)", "`tl-interp`, echo"),
    "inproc_cpu_2_vs_1": ("CPU per round trip, 2 interpreters over 1", "`tl-interp`, inproc"),
    "inproc_wall_split_2_vs_1": ("wall time of a fixed total of round trips, split over 2 "
                                 "interpreters over done by 1", "`tl-interp`, inproc"),
    "inproc_sub_vs_main": ("CPU per round trip, 1 subinterpreter over the main interpreter",
                           "`tl-interp`, inproc"),
}


def _limits(limits, sign="<="):
    return ", ".join(f"{sign}{v:.2f}x {REF.get(k, k)}" for k, v in limits.items())


def _grouped(pairs):
    """(row, limit text) pairs -> [rows sharing a limit, limit], first-seen order."""
    groups = {}
    for row, text in pairs:
        groups.setdefault(text, []).append(row)
    if len(groups) == 1:
        return [("every row", text) for text in groups]
    return [(", ".join(rows), text) for text, rows in groups.items()]


def targets_table():
    """Each benchmark's targets, as its last result file records them."""
    rows = []
    micro = _load("micro.json")
    for names, text in _grouped((f"`{r['name']}`", "-" if r.get("target_vs_uvloop") is None
                                 else f"<={r['target_vs_uvloop']:.2f}x uvloop")
                                for r in micro["results"]):
        rows.append(["`python -m tideloop bench`", names, "ns per operation", text])
    pairs = []
    for kind, t in _load("net.json")["targets"].items():
        sign, what = (">=", "handshakes/s") if t["metric"] == "rps" else ("<=", "CPU per request")
        by_size = t["limits"]
        if not by_size:
            pairs.append((f"`{kind}`", (what, "-")))
        for size, lim in by_size.items():
            at = "" if size == "all" else f" ({int(size) // 1024} KiB)"
            pairs.append((f"`{kind}`{at}", (what, _limits(lim, sign))))
    for names, (what, text) in _grouped(pairs):
        rows.append(["`bench.net`", names, what, text])
    io = _load("io.json")
    rows.append(["`bench.io`", "every row", "CPU per unit", _limits(io["targets"])])
    for names, text in _grouped((f"`{k}`", _limits(t["limits"].get("all", {})))
                                for k, t in _load("apps.json")["targets"].items()):
        rows.append(["`bench.apps`", names, "CPU per operation", text])
    for key, limit in _load(THREADS_FILES[0])["targets"].items():
        what, where = THREADS_TARGETS.get(key, (key, "-"))
        rows.append(["`bench.threads`", where, what, f"<={limit:.2f}x"])
    for key, limit in _load(INTERP_FILES[0])["target_limits"].items():
        what, where = INTERP_TARGETS.get(key, (key, "-"))
        rows.append(["`bench.interpreters`", where, what, f"<={limit:.2f}x"])
    return table(["benchmark", "rows", "tideloop's figure", "target"], rows, left=4)


def core_map():
    """The C core's map, src/tideloop/_core/README.md, without its title."""
    with open(os.path.join(REPO, "src", "tideloop", "_core", "README.md")) as f:
        text = f.read()
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    # a sentence naming a maintainer-only checker is left out of the user docs
    body = re.sub(r"\s*`farm-studio[^.]*\.", "", body)
    return re.sub(r"^#", "##", body.strip("\n"), flags=re.M)


def internals_table():
    """tideloop/_internals.py's REGISTRY, read without importing the package
    (its Internal(...) entries are literals)."""
    import ast
    path = os.path.join(REPO, "src", "tideloop", "_internals.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    entries = next(node.value.elts for node in tree.body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "REGISTRY" for t in node.targets))
    rows = []
    for call in entries:
        name, kind, what, why, versions, proof, fallback = (ast.literal_eval(a)
                                                             for a in call.args[:7])
        rows.append([f"`{name}`", kind, what, why, versions, proof, fallback])
    return table(["name", "chosen", "what (private to CPython)", "what for", "versions",
                  "proven by", "fallback"], rows, left=7) + "\n"


def portable_cost_table():
    """What TIDELOOP_PORTABLE costs: tools/instructions.py's figures with it
    (results/instructions-portable.json) against the baseline's."""
    fast, portable = _load("instructions.json"), _load("instructions-portable.json")
    rows = []
    for name, n in fast["figures"].items():
        p = portable["figures"].get(name)
        rows.append([name, f"{n:,}", f"{p:,}" if p else "-",
                     ratio(p / n) if p else "-"])
    return (table(["workload (instructions per operation)", "fast paths", "portable",
                   "portable / fast"], rows)
            + f"\n\nPython {fast['python']}; callgrind, user-space instructions per operation "
              "(`env TIDELOOP_PORTABLE=1 python tools/instructions.py --json "
              "results/instructions-portable.json`; the fast paths: `results/instructions.json`).\n")


GENERATORS = {
    "matrix": matrix_table, "worker_spread": worker_spread_table, "threads": threads_table,
    "interpreters": interpreters_table,
    "micro": micro_table, "io": io_table, "apps": apps_table,
    "net": lambda: _net("net.json"),                                # python -m bench.net
    "net_tls": lambda: _net("net-tls.json"),                        # python -m bench.net --tls
    "apps_callgrind": apps_callgrind_table, "tls_instr": tls_instr_table,
    "diag_overhead": diag_overhead_table, "instructions": instructions_table,
    "suites": lambda: _suites("ecosystem-suites.json"),             # the quick selection (CI)
    "suites_full": lambda: _suites("ecosystem-suites-full.json"),   # --full
    "core_map": core_map, "targets": targets_table,
    "interpreter_imports": interpreter_imports_table,   # tools/interpreter_imports.py
    "internals": internals_table,                       # src/tideloop/_internals.py
    "portable_cost": portable_cost_table,               # TIDELOOP_PORTABLE's price
    "net_peers": net_peers_table,                       # bench.net --loops all, per version
    "scale": scale_table,                               # bench.scale --loops all, per version
    "instructions_versions": instructions_versions_table,
    "peers_summary": peers_summary_table,               # the README's summary of the two
}


def render(text):
    def fill(m):
        name = m.group(2)
        if name not in GENERATORS:
            raise SystemExit(f"docs_tables: no generator named {name!r}")
        return m.group(1) + GENERATORS[name]().rstrip("\n") + "\n" + m.group(4)
    return REGION.sub(fill, text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if out of date")
    args = ap.parse_args(argv)
    stale = []
    for rel in docs_files():
        path = os.path.join(REPO, rel)
        with open(path) as f:
            text = f.read()
        new = render(text)
        if new != text:
            stale.append(rel)
            if not args.check:
                with open(path, "w") as f:
                    f.write(new)
    if args.check and stale:
        print("docs_tables: out of date: " + ", ".join(stale) +
              " (run python tools/docs_tables.py)", file=sys.stderr)
        return 1
    print("docs_tables: " + ("up to date" if not stale else "rewrote " + ", ".join(stale)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
