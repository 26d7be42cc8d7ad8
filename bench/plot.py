"""Pictures of benchmark results: grouped horizontal bars, one group per
row of a results document, one bar per loop, each loop's speed relative to
asyncio (asyncio = 1.0, drawn as a line; higher is better).

    python -m bench.plot RESULTS.json OUT.svg [--title TEXT]

redraws a saved document (what a benchmark's ``--json PATH`` wrote); the
benchmarks' ``--plot PATH`` draws the run just measured.  matplotlib is an
optional extra (``pip install 'tideloop[plot]'``), imported only when a
picture is drawn; without it, MatplotlibMissing says which extra to install.

The document, as harness.json_head and the drivers write it; the keys read:

    format        "tideloop-<name>/<version>": microbench (python -m tideloop
                  bench), netbench (bench/net.py), iobench (bench/io.py),
                  threadbench (bench/threads.py), interpbench
                  (bench/interpreters.py); the
                  <name> picks the title and the figure plotted.  Any other
                  <name> is read by the same rules if its rows have the shape
                  below (a new driver needs no change here).
    figure        (optional) the per-loop key of the rows to plot; without it,
                  the first of FIGURE_KEYS that every row has.
    series        (optional) the names of the bars, the reference first, when
                  they are not the loops (bench/interpreters.py: ways of
                  running a loop, "aio-interp", "tl-interp", ...); the rows'
                  figures are then {name: number or null}.
    started, environment.python, environment.cpus, repeat, quick
                  (optional) the subtitle: when, where and how it was measured.
    results       a list of rows, each a dict with
        <figure>  {loop: number or null}: "asyncio", "uvloop", "tideloop" (other
                  keys, such as the C floor "c" or "blocking", are not drawn);
                  a cost (time or CPU per unit, lower is better) unless the key
                  is one of RATE_KEYS (a rate, higher is better)
        label     the row's name (micro); or kind / workload, then label or
                  size (bytes) and conns: "protocol 1 KiB x10", "udp 64 B x16"

A loop's bar is asyncio's cost / the loop's cost (for a rate: the loop's rate /
asyncio's), so every picture reads the same way.  Where asyncio was not
measured, the first loop measured is the reference instead (the axis says so).
A row without a figure for a loop (an error) has no bar for it but "n/a".

The SVG output is deterministic (fixed hash salt, no date, text as text), so
an image regenerated from the same document is byte-identical and a new run
diffs as the figures that changed.

Standard library only at import time (matplotlib when drawing).
"""

import argparse
import dataclasses
import json
import os
import sys

from tideloop._bench import harness

EXTRA_HINT = "pip install 'tideloop[plot]'"

# Per-loop figures a row may carry, in the order a document without a
# "figure" key is searched: the drivers' cost figures first (micro, net, io).
FIGURE_KEYS = ("ns_per_op", "cpu_us_per_req", "cpu_per_unit", "wall_per_unit",
               "rps", "rate")
RATE_KEYS = {"rps", "rate"}

# Figures read by name: what the axis calls them.
FIGURE_NAMES = {
    "ns_per_op": "time per operation",
    "wall_ns_per_op": "wall time per operation",
    "cpu_ns_per_op": "CPU time per operation",
    "cpu_us_per_req": "server CPU per request",
    "cpu_per_unit": "CPU per unit",
    "wall_per_unit": "wall time per unit",
    "rps": "requests per second",
    "rate": "units per second",
}

# The known formats: title and figure.
KNOWN = {
    "microbench": ("Loop micro-benchmarks (python -m tideloop bench)", "ns_per_op"),
    "netbench": ("Echo servers (bench/net.py)", "cpu_us_per_req"),
    "iobench": ("UDP, subprocesses, pipes (bench/io.py)", "cpu_per_unit"),
    # its rows keep net.py's key, but count requests, queries, commands, messages
    "appbench": ("Real apps (bench/apps.py)", "cpu_us_per_req"),
    "threadbench": ("Loops in threads (bench/threads.py)", "cpu_us_per_req"),
    "interpbench": ("Isolated interpreters (bench/interpreters.py)", "cpu_us_per_req"),
}

COLOURS = {"asyncio": "#9e9e9e", "uvloop": "#e08a2c", "tideloop": "#1f6fb4"}
# The bars of a document's own series (its "series" key), in order: the
# reference's colour first.
SERIES_COLOURS = ("#9e9e9e", "#1f6fb4", "#e08a2c", "#4a9a4a", "#8e5bb5", "#c44e52")


class PlotError(Exception):
    """The document cannot be drawn: not a results document, or an unknown shape."""


class MatplotlibMissing(ImportError):
    def __init__(self, exc=None):
        why = f" ({harness.exc_reason(exc)})" if exc is not None else ""
        super().__init__(f"drawing plots needs matplotlib, which is not installed{why}; "
                         f"install the extra: {EXTRA_HINT}")


def require_matplotlib():
    """Import matplotlib or raise MatplotlibMissing: the benchmarks call it
    before measuring, so that --plot fails at once, not after the run."""
    try:
        import matplotlib
        import matplotlib.figure  # noqa: F401 - the part draw() uses
    except ImportError as exc:
        raise MatplotlibMissing(exc) from exc
    return matplotlib


# --------------------------------------------------------------------------
# Reading a document
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Chart:
    """What a document's picture shows: ``rows`` is [(label, {loop: value})],
    value = speed relative to ``reference`` (None where the row has no figure)."""
    title: str
    subtitle: str
    axis_label: str
    reference: str
    series: list
    rows: list


def format_name(doc):
    """The <name> of "tideloop-<name>/<version>", or PlotError."""
    if not isinstance(doc, dict):
        raise PlotError(f"not a results document: a JSON {type(doc).__name__}, "
                        f"not an object")
    fmt = doc.get("format")
    if not isinstance(fmt, str) or not fmt.startswith("tideloop-") or "/" not in fmt:
        raise PlotError(f"not a tideloop results document: format {fmt!r} "
                        f"(expected 'tideloop-<name>/<version>', as written by a "
                        f"benchmark's --json; known: "
                        f"{', '.join('tideloop-' + k for k in KNOWN)})")
    return fmt[len("tideloop-"):].split("/", 1)[0]


def row_label(row):
    if "kind" in row or "workload" in row:
        head = str(row.get("kind") or row.get("workload"))
        if row.get("label"):
            return f"{head} {row['label']}"
        parts = [head]
        if isinstance(row.get("size"), int):
            parts.append(harness.fmt_size(row["size"]))
        if row.get("conns") is not None:
            parts.append(f"x{row['conns']}")
        return " ".join(parts)
    if row.get("label"):
        return str(row["label"])
    raise PlotError(f"a row has no name: none of label, kind, workload (keys: "
                    f"{', '.join(sorted(row)) or 'none'})")


def _figure_key(doc, name, rows):
    key = doc.get("figure") or (KNOWN[name][1] if name in KNOWN else None)
    if key is None:
        key = next((k for k in FIGURE_KEYS
                    if all(isinstance(r.get(k), dict) for r in rows)), None)
    if key is None or not all(isinstance(r.get(key), dict) for r in rows):
        wanted = repr(key) if key else f"one of {', '.join(FIGURE_KEYS)}"
        raise PlotError(f"format {doc['format']!r}: not every row has the per-loop "
                        f"figure {wanted} ({{loop: value}}); a top-level 'figure' key "
                        f"may name the rows' figure")
    return key


def _figure_name(doc, key):
    if key == "cpu_us_per_req" and format_name(doc) == "appbench":
        return "CPU per operation"
    if key == "ns_per_op" and doc.get("clock") == "cpu":
        return FIGURE_NAMES["cpu_ns_per_op"]
    if key == "ns_per_op" and doc.get("clock") == "wall":
        return FIGURE_NAMES["wall_ns_per_op"]
    return FIGURE_NAMES.get(key, key)


def _subtitle(doc):
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    bits = []
    if env.get("python"):
        bits.append(f"CPython {env['python']}")
    if env.get("cpus"):
        bits.append(f"{env['cpus']} CPUs")
    if doc.get("repeat") == 1:
        bits.append("one run")
    elif doc.get("repeat"):
        bits.append(f"median of {doc['repeat']} interleaved runs")
    if doc.get("quick"):
        bits.append("--quick")
    if isinstance(doc.get("started"), str):
        bits.append(doc["started"][:10])
    return ", ".join(bits)


def _positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def read_chart(doc, title=None):
    """The Chart of a results document, or PlotError saying what is wrong."""
    name = format_name(doc)
    rows = doc.get("results")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise PlotError(f"format {doc['format']!r}: 'results' must be a non-empty list "
                        f"of rows (objects)")
    key = _figure_key(doc, name, rows)
    names = _series_names(doc)
    measured = [loop for loop in names
                if any(_positive(r[key].get(loop)) for r in rows)]
    if len(measured) < 2:
        raise PlotError(f"format {doc['format']!r}: figure {key!r} has fewer than two "
                        f"loops of {', '.join(names)} to compare "
                        f"({', '.join(measured) or 'none'})")
    reference, series = measured[0], measured[1:]
    rate = key in RATE_KEYS
    chart_rows = []
    for r in rows:
        base = r[key].get(reference)
        speeds = {}
        for loop in series:
            x = r[key].get(loop)
            ok = _positive(x) and _positive(base)
            speeds[loop] = None if not ok else (x / base if rate else base / x)
        chart_rows.append((row_label(r), speeds))
    figure = _figure_name(doc, key)
    how = f"{reference}'s {figure} / the loop's" if not rate else \
        f"the loop's {figure} / {reference}'s"
    axis = (f"speed relative to {reference} ({how}); "
            f"{reference} = 1, higher is better")
    default_title = KNOWN[name][0] if name in KNOWN else f"tideloop {name}"
    return Chart(title or default_title, _subtitle(doc), axis, reference, series,
                 chart_rows)


def _series_names(doc):
    """The bars' names: the document's "series", else the loops."""
    series = doc.get("series")
    if series is None:
        return list(harness.ALL_LOOPS)
    if not isinstance(series, list) or not all(isinstance(x, str) for x in series):
        raise PlotError(f"format {doc['format']!r}: 'series' must be a list of names")
    return series


def colour(name, doc=None):
    """A bar's colour: the loop's, else its place in the document's series."""
    if name in COLOURS:
        return COLOURS[name]
    series = (doc or {}).get("series") or []
    if name in series:
        return SERIES_COLOURS[series.index(name) % len(SERIES_COLOURS)]
    return None


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise PlotError(f"{path}: not JSON ({exc})") from None


# --------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------

# The SVG's ids come from this salt instead of a random one, and no date is
# written: the same document always gives the same bytes.
SVG_RC = {"svg.hashsalt": "tideloop-plot", "svg.fonttype": "none"}
BAR_SLOT = 0.36        # a bar's share of its row (1.0 on the y axis): two bars and a gap


def draw(doc, path, title=None):
    """Draw ``doc`` (a results document) to ``path`` (.svg, or any format
    matplotlib writes: .png, .pdf); returns the Chart drawn.  Each bar's SVG
    element has the id "bar-<loop>-<row index>"."""
    chart = read_chart(doc, title)
    matplotlib = require_matplotlib()
    # A Figure without pyplot: no global backend state, nothing shown; savefig
    # picks the writer from the file name (SVG, or Agg for raster formats).
    from matplotlib.figure import Figure

    n = len(chart.rows)
    slot = BAR_SLOT if len(chart.series) <= 2 else 0.8 / len(chart.series)
    with matplotlib.rc_context(SVG_RC):
        fig = Figure(figsize=(8.0, 1.2 + n * (0.12 + 0.6 * slot * len(chart.series))))
        ax = fig.add_subplot()
        top = 0.0
        labelled = set()              # one legend entry per loop
        for s, loop in enumerate(chart.series):
            offset = (s - (len(chart.series) - 1) / 2) * slot
            for i, (_, speeds) in enumerate(chart.rows):
                y = i + offset
                x = speeds[loop]
                if x is None:
                    ax.text(0.02, y, "n/a", va="center", fontsize=7, color="#555555",
                            transform=ax.get_yaxis_transform())
                    continue
                (bar,) = ax.barh(y, x, height=slot * 0.92, color=colour(loop, doc),
                                 label=None if loop in labelled else loop)
                labelled.add(loop)
                bar.set_gid(f"bar-{loop}-{i}")
                ax.text(x, y, f" {x:.2f}x", va="center", fontsize=7)
                top = max(top, x)
        ax.axvline(1.0, color=colour(chart.reference, doc) or "#000000", linewidth=1.2,
                   linestyle="--", label=f"{chart.reference} = 1")
        ax.set_yticks(range(n), [label for label, _ in chart.rows], fontsize=8)
        ax.set_ylim(n - 0.5, -0.5)          # the document's first row on top
        ax.set_xlim(0, max(top, 1.0) * 1.15)
        ax.set_xlabel(chart.axis_label, fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        # Above the bars, one line each: title, subtitle, legend (nothing is
        # drawn over a bar, and long lines cannot collide).
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(chart.series) + 1,
                  fontsize=8, frameon=False, borderaxespad=0.1, handlelength=1.5)
        if chart.subtitle:
            ax.annotate(chart.subtitle, (0, 1), xytext=(0, 19), xycoords="axes fraction",
                        textcoords="offset points", fontsize=8, color="#444444",
                        va="bottom")
        ax.set_title(chart.title, fontsize=10, loc="left", pad=33 if chart.subtitle else 21)
        fig.savefig(path, bbox_inches="tight", metadata={"Date": None}
                    if str(path).endswith(".svg") else None)
    return chart


def draw_run(doc, path, title=None):
    """Draw ``doc`` and say where (``--plot PATH`` of a benchmark, the
    command line here).  Returns 0, or 1 after saying why it could not be
    drawn (a benchmark's table and JSON are already out then)."""
    try:
        draw(doc, path, title)
    except (PlotError, MatplotlibMissing, OSError) as exc:
        print(f"plot: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


def check_plot_option(path):
    """Before a benchmark runs with ``--plot PATH``: a usage error (status 2)
    if it could not draw afterwards, else None."""
    if path is None:
        return None
    try:
        require_matplotlib()
    except MatplotlibMissing as exc:
        return harness.usage_error(f"--plot: {exc}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return harness.usage_error(f"--plot: no such directory: {folder}")
    return None


def add_plot_option(parser):
    parser.add_argument(
        "--plot", default=None, metavar="PATH",
        help="also draw the results as bars of each loop's speed relative to asyncio "
             f"to PATH (.svg, .png; needs matplotlib: {EXTRA_HINT})")


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m bench.plot",
        description="Draw a saved benchmark results document (a benchmark's --json "
                    "output) as grouped bars: each loop's speed relative to asyncio, "
                    f"one group per row. Needs matplotlib ({EXTRA_HINT}).")
    p.add_argument("results", metavar="RESULTS.json")
    p.add_argument("out", metavar="OUT.svg", help="the picture to write (.svg, .png, .pdf)")
    p.add_argument("--title", default=None, help="the title (default: the benchmark's name)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        doc = load(args.results)
    except (PlotError, OSError) as exc:
        print(f"plot: error: {exc}", file=sys.stderr)
        return 1
    return draw_run(doc, args.out, args.title)


if __name__ == "__main__":
    sys.exit(main())
