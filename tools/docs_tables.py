#!/usr/bin/env python3
"""Fill the generated regions of the documentation from the result files.

    python tools/docs_tables.py            # rewrite every generated region
    python tools/docs_tables.py --check    # exit 1 if one is out of date

A region is the text between a line ``<!-- generated: NAME ... -->`` and the
next ``<!-- end generated -->``; NAME selects the generator below, which
reads a file under results/.  Figures in the docs come from those files and
nowhere else.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

import matrix  # noqa: E402  (tools/matrix.py, beside this script: the table's one definition)

DOCS = ["README.md", "bench/README.md"]
REGION = re.compile(r"(<!-- generated: (\w+)[^\n]*-->\n)(.*?)(<!-- end generated -->)", re.S)


def _load(name):
    with open(os.path.join(REPO, "results", name)) as f:
        return json.load(f)


def matrix_table():
    return matrix.markdown_report(_load("matrix.json"))


SPREAD_VARIANTS = {   # bench/worker_spread.py's variant: (the README's name, its socket(s))
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
                 f"`{doc['reproduce']}` (`results/worker-spread.json`).")
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
                     + f". `{doc['command'].split(' ', 1)[1]}` (`results/{name}`).")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


GENERATORS = {"matrix": matrix_table, "worker_spread": worker_spread_table,
              "threads": threads_table}


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
    for rel in DOCS:
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
