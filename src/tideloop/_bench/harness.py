"""What every benchmark shares: loops by name, interleaved runs, medians and
ratios, text and Markdown tables, command-line pieces, the environment.

Used by ``python -m tideloop bench`` (micro.py) and by the checkout's
benchmarks (``python -m bench.net``, ``bench.io``, ... with bench/procs.py)
and their workers (bench.echo_servers, bench.io_worker).  Standard library
only.
"""

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback

ALL_LOOPS = ("asyncio", "uvloop", "tideloop")
# The other asyncio loops on PyPI, measured beside these when named in --loops
# ("peers" names them all, "all" adds them to ALL_LOOPS): each is
# ``<module>.new_event_loop``; "aiofastnet+uvloop" is uvloop's loop with
# aiofastnet's transports patched on (aiofastnet.loop_factory).  Any other
# importable module with a new_event_loop (or "module:callable") works too.
# The bench-peers extra installs those with wheels for the interpreter.
PEER_LOOPS = ("zuvloop", "blazio", "rsloop", "rloop", "zloop", "aiofastnet+uvloop")
PEERS_EXTRA = "pip install 'tideloop[bench-peers]'"
# Patchers: "<patcher>+<loop>" is loop <loop> made by the patcher's factory.
PATCHERS = {"aiofastnet": lambda base: __import__("aiofastnet").loop_factory(base)}

# The checkout this file is in, if it is one (src/tideloop/_bench/harness.py).
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))


# --------------------------------------------------------------------------
# Loops
# --------------------------------------------------------------------------

def loop_factory(name):
    """The new-loop callable of loop ``name``; raises if it cannot be imported."""
    if name == "asyncio":
        return asyncio.SelectorEventLoop
    if name == "uvloop":
        import uvloop
        return uvloop.new_event_loop
    if name == "tideloop":
        import tideloop
        return getattr(tideloop, "new_event_loop", None) or tideloop.Loop
    patcher, plus, base = name.partition("+")
    if plus:
        if patcher not in PATCHERS:
            raise ValueError(f"unknown loop {name!r}: {patcher!r} is not a known patcher "
                             f"(choose from {', '.join(PATCHERS)})")
        return PATCHERS[patcher](loop_factory(base))
    module, _, attr = name.partition(":")
    if not module.replace("_", "a").replace(".", "a").isalnum():
        raise ValueError(f"unknown loop {name!r} (choose from {', '.join(ALL_LOOPS)}, "
                         f"a peer ({', '.join(PEER_LOOPS)}) or an importable module)")
    import importlib
    return getattr(importlib.import_module(module), attr or "new_event_loop")


def expand_loops(text):
    """The loop names of a --loops value: "peers" stands for PEER_LOOPS and
    "all" for ALL_LOOPS and PEER_LOOPS."""
    out = []
    for x in (x.strip() for x in text.split(",")):
        out += (list(PEER_LOOPS) if x == "peers" else
                list(ALL_LOOPS + PEER_LOOPS) if x == "all" else [x] if x else [])
    return list(dict.fromkeys(out))


def distribution_version(module):
    """The installed version of the distribution that provides ``module``."""
    from importlib import metadata
    try:
        return metadata.version(module)
    except Exception:
        mod = sys.modules.get(module)
        return str(getattr(mod, "__version__", "?"))


class LoopSpec:
    __slots__ = ("name", "factory", "info", "error", "exc")

    def __init__(self, name, factory=None, info="", error=None, exc=None):
        self.name = name
        self.factory = factory
        self.info = info            # what the name resolved to, with its version
        self.error = error          # why it cannot be measured, or None
        self.exc = exc


def exc_reason(exc):
    return f"{type(exc).__name__}: {exc}"


def load_loop(name):
    """A LoopSpec for ``name``: its factory and version, or why it is missing."""
    try:
        factory = loop_factory(name)
    except Exception as exc:    # ImportError and anything a broken install raises
        why = "not available" if name == "uvloop" else "not importable"
        return LoopSpec(name, error=f"{name} {why} ({exc_reason(exc)})", exc=exc)
    if name not in ALL_LOOPS:
        parts = name.split("+")
        info = " on ".join(f"{p.partition(':')[0]} {distribution_version(p.partition(':')[0])}"
                           for p in parts)
        return LoopSpec(name, factory, info)
    if name == "asyncio":
        return LoopSpec(name, factory,
                        f"asyncio.SelectorEventLoop (CPython {platform.python_version()})")
    if name == "uvloop":
        uvloop = sys.modules["uvloop"]
        return LoopSpec(name, factory, f"uvloop {getattr(uvloop, '__version__', '?')}")
    tideloop = sys.modules["tideloop"]
    version = getattr(tideloop, "__version__", None)
    if version is None:
        try:
            from tideloop._version import __version__ as version
        except Exception:
            version = "?"
    where = ""
    core = sys.modules.get("tideloop._core")
    if core is not None and getattr(core, "__file__", None):
        where = f" ({core.__file__})"
    return LoopSpec(name, factory, f"tideloop {version}{where}")


def loop_versions(names=ALL_LOOPS):
    """{loop: what it resolves to here} and "tideloop_core": the built core's
    path (procs.loop_versions runs this in the workers' environment)."""
    out = {}
    for name in names:
        spec = load_loop(name)
        out[name] = spec.info if spec.error is None else f"not importable: {spec.exc!r}"
    core = sys.modules.get("tideloop._core")
    if "tideloop" in sys.modules and getattr(core, "__file__", None):
        out["tideloop_core"] = core.__file__
    return out


def run_on_loop(name, main, *args):
    """``main(*args)`` run to completion on a fresh loop ``name``
    (asyncio.Runner(loop_factory=...))."""
    factory = loop_factory(name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main(*args))


def worker_main(prog, body):
    """Run ``body()`` in a worker process: any failure prints the traceback,
    then "<prog>: ERROR: <reason>" on stderr (the driver shows the reason)
    and exits with status 1; Ctrl-C exits with 130."""
    try:
        body()
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        traceback.print_exc()
        reason = exc_reason(exc).strip().rstrip(":")
        print(f"{prog}: ERROR: {reason}", file=sys.stderr, flush=True)
        sys.exit(1)


# --------------------------------------------------------------------------
# Interleaved runs, medians, ratios
# --------------------------------------------------------------------------

class RunError(Exception):
    """One measurement failed; ``startup`` tells a loop or server that could
    not start at all (not worth trying again for the same row)."""

    def __init__(self, reason, startup=False):
        super().__init__(reason)
        self.startup = startup


def interleave(names, repeat, measure, errors=None, log=None):
    """``measure(name)`` ``repeat`` times for each name; repetition r runs the
    names in an order rotated by r, so that drift of the machine is spread
    over all of them.  A name whose measurement raises RunError (or that
    ``errors`` names from the start) is not measured again.  Returns
    (samples {name: [results]}, errors {name: reason}); ``log(".")`` after
    each repetition."""
    names = list(names)
    samples = {name: [] for name in names}
    errors = dict(errors or {})
    for rep in range(repeat):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            if name in errors:
                continue
            try:
                samples[name].append(measure(name))
            except RunError as exc:
                errors[name] = str(exc)
        if log:
            log(".")
    return samples, errors


def median(xs):
    return statistics.median(xs) if xs else None


def medians(samples, errors, key):
    """{name: median of sample[key]} over the names with samples and no error."""
    return {name: median([x[key] for x in xs]) for name, xs in samples.items()
            if xs and name not in errors}


def ratio(x, y):
    return x / y if x and y else None


def fmt_ratio(x):
    return "-" if x is None else f"{x:.2f}x"


def fmt_size(n):
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


# --------------------------------------------------------------------------
# Tables: cells are strings; the columns in ``left`` are left-aligned
# --------------------------------------------------------------------------

def column_widths(rows):
    return [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]


def text_line(cells, widths, left=(0,)):
    return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths))).rstrip()


def text_rule(widths):
    return "  ".join("-" * w for w in widths)


def text_table(header, body, left=(0,)):
    widths = column_widths([header] + body)
    out = [text_line(header, widths, left), text_rule(widths)]
    out += [text_line(row, widths, left) for row in body]
    return "\n".join(out)


def markdown_line(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_rule(ncols, left=(0,)):
    return "|" + "|".join(":---" if i in left else "---:" for i in range(ncols)) + "|"


def markdown_table(header, body, left=(0,)):
    out = [markdown_line(header), markdown_rule(len(header), left)]
    out += [markdown_line(row) for row in body]
    return "\n".join(out)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def usage_error(message):
    """Say what is wrong with the command line; returns exit status 2."""
    print(message, file=sys.stderr)
    return 2


def pick(text, choices, what, given_order=False):
    """The names in comma-separated ``text`` (in the order of ``choices``, or
    as given without repeats), or None after saying which are unknown."""
    choices = list(choices)
    wanted = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in wanted if x not in choices]
    if bad or not wanted:
        usage_error(f"unknown {what}(s) {', '.join(bad)}; choose from {', '.join(choices)}")
        return None
    if given_order:
        return list(dict.fromkeys(wanted))
    return [x for x in choices if x in wanted]


def int_list(text, what, prog):
    """Positive integers from comma-separated ``text`` (option --``what``)."""
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{prog}: --{what} takes comma-separated integers")
    if not xs or min(xs) <= 0:
        raise SystemExit(f"{prog}: --{what} takes positive integers")
    return xs


def add_loops_option(parser, help="comma-separated loops, from: %(default)s (default: all)"):
    parser.add_argument("--loops", default=",".join(ALL_LOOPS), metavar="LIST", help=help)


def add_output_options(parser, json_help="also write every sample and the environment "
                                         "as JSON to PATH",
                       markdown_help="print the table as Markdown"):
    parser.add_argument("--json", default=None, metavar="PATH", help=json_help)
    parser.add_argument("--markdown", action="store_true", help=markdown_help)


def add_verdict_options(parser):
    parser.add_argument("--fail-on-miss", action="store_true",
                        help="exit with status 1 if tideloop misses a target or errors")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also print every sample")


def worker_parser(doc, loops, kinds, port_help):
    """A worker's command line: --loop, --kind, --port, --host."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--loop", required=True,
                   help="a loop's name: " + ", ".join(loops) + ", a peer loop ("
                   + ", ".join(PEER_LOOPS) + ") or any module with new_event_loop")
    p.add_argument("--kind", choices=kinds, required=True)
    p.add_argument("--port", type=int, default=0, help=port_help)
    p.add_argument("--host", default="127.0.0.1")
    return p


def missed(rows):
    """Exit status for --fail-on-miss: 1 if a row is FAIL or ERROR."""
    return 1 if any(r["verdict"] in ("FAIL", "ERROR") for r in rows) else 0


def python_cmd():
    exe = sys.executable or "python3"
    for short in ("python3", "python"):
        found = shutil.which(short)
        if found and os.path.realpath(found) == os.path.realpath(exe):
            return short
    return shlex.quote(exe)


def command_prefix(invocation, loops, quick, repeat):
    """The start of the command that reproduces a table: PYTHONPATH, the
    interpreter, ``invocation`` (script or -m ...), --loops, --quick, --repeat."""
    parts = []
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath:
        parts.append(f"PYTHONPATH={shlex.quote(pythonpath)}")
    parts.append(python_cmd())
    parts += [shlex.quote(p) for p in invocation]
    parts += ["--loops", ",".join(loops)]
    if quick:
        parts.append("--quick")
    parts += ["--repeat", str(repeat)]
    return parts


def script_invocation(path):
    """A script's path as the reproduce line shows it (relative to the cwd)."""
    return [os.path.relpath(os.path.abspath(path))]


# --------------------------------------------------------------------------
# Environment, results
# --------------------------------------------------------------------------

def git_revision(root=CHECKOUT):
    """``git describe`` of this project's checkout ``root``; None elsewhere
    (an installed copy that happens to sit inside some other git work tree)."""
    if not os.path.isfile(os.path.join(root, "pyproject.toml")):
        return None
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=5)
    except Exception:
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def log_stderr(msg):
    """Notes and warnings: stderr, flushed (the table goes to stdout)."""
    sys.stderr.write(msg)
    sys.stderr.flush()


def say(text):
    """Text of the report (its header): stdout, flushed, so that it comes
    before any progress written to stderr after it.  Same calling convention
    as log_stderr and Progress: the caller ends lines with "\n"."""
    sys.stdout.write(text)
    sys.stdout.flush()


def say_verdict_legend(loops, subject):
    for line in verdict_legend(loops, subject):
        say(line + "\n")


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _same_file(a, b):
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class Progress:
    """A run's progress, called with pieces of text as log(text) is ("  call_soon
    n=500", "." per run, "\n" when a step is done), kept out of the results:

    * stderr a terminal: one line, wiped when its step is done, so that the
      rows printed meanwhile stand alone;
    * stderr a file of its own (2>progress.log): a line per step;
    * stderr the same file as stdout (2>&1 into a log or a pipe): nothing,
      the rows printed as they finish are the progress."""

    def __init__(self, stream=None, results=None):
        self.stream = stream or sys.stderr
        results = results or sys.stdout
        self.transient = _isatty(self.stream)
        self.silent = not self.transient and _same_file(self.stream, results)

    def __call__(self, msg):
        if self.silent:
            return
        if self.transient:
            msg = msg.replace("\n", "\r\x1b[K")
        self.stream.write(msg)
        self.stream.flush()


# --------------------------------------------------------------------------
# Verdicts: the result column
# --------------------------------------------------------------------------

BENCH_EXTRA = "pip install 'tideloop[bench]'"


def verdict_legend(loops, subject="tideloop's figure"):
    """The header's lines saying what the result column means, for a run of
    ``loops`` (the loops measured)."""
    lines = [f"result:   PASS / FAIL = {subject} met / missed this project's own target "
             "for the row (the target column: a ratio to uvloop, unless it names "
             "another reference); info = no target; ERROR = tideloop failed"]
    if "uvloop" not in loops:
        lines.append(f"          uvloop not measured ({BENCH_EXTRA} installs it): where a "
                     "target needs it, the result column shows tideloop against asyncio "
                     "instead (\"2.0x faster\": asyncio's cost / tideloop's)")
    return lines


def versus_asyncio(ratio):
    """tideloop's cost / asyncio's as the result column shows it without
    uvloop: "2.0x faster", "1.3x slower", "n/a" without a ratio."""
    if not ratio:
        return "n/a"
    return f"{1 / ratio:.1f}x faster" if ratio <= 1 else f"{ratio:.1f}x slower"


def result_cell(verdict, ratio_vs_asyncio, loops):
    """A row's result column: its verdict; without one because uvloop was not
    measured, tideloop against asyncio; else "n/a" (a figure is missing)."""
    if verdict:
        return verdict
    if "uvloop" not in loops:
        return versus_asyncio(ratio_vs_asyncio)
    return "n/a"


def print_reproduce(command, elapsed):
    """The last lines under a table: the command that reproduces it, the time taken."""
    print(f"reproduce: {command}")
    print(f"({elapsed:.1f} s)")


def json_head(fmt, command, started, elapsed):
    """The first keys of every benchmark's JSON document."""
    return {
        "format": fmt,
        "command": command,
        "argv": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "elapsed_s": round(elapsed, 3),
    }


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print(f"wrote {path}")

