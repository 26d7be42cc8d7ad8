"""`python -m tideloop bench`: a saved table says what it measured, and the
rows come out as the benchmarks finish.

The environment header (interpreter, machine, loops and their versions, the
method, what PASS / FAIL / target mean) goes to stdout with the table, the
footer says how to read the figures (lower is better), and each row is
printed and flushed as soon as its benchmark is done.  The progress goes to
stderr, and not at all when stderr is stdout's file (2>&1 into a log): no
progress line among the rows.  Without uvloop the result column compares
tideloop with asyncio rather than saying n/a.
"""
import json
import platform
import re
import subprocess
import sys

import pytest

from loop_helpers import child_env

TIMEOUT = 120
# Tiny sizes, one repetition, no warm-up: a few tenths of a second per run.
QUICK = ["--quick", "--repeat", "1", "--scale", "0.05", "--no-warmup"]
TABLE_HEADER = "benchmark (ns/op, median)"
LABELS = {"call_soon": "call_soon + run noop", "future": "future via call_soon, awaited",
          "queue": "Queue(1) producer/consumer"}


def _bench(*args, merge=False):
    env = child_env()
    # Block-buffered stdout, as when the output goes to a file or a pipe: the
    # rows must be flushed by the benchmark itself.
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run(
        [sys.executable, "-m", "tideloop", "bench", *QUICK, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, timeout=TIMEOUT, env=env)


def _tideloop_version():
    # From a child with the same environment as the benchmark's: the tests may
    # run against an in-place build that this process does not import.
    return subprocess.run(
        [sys.executable, "-c", "import tideloop; print(tideloop.__version__)"],
        env=child_env(), capture_output=True, text=True, check=True,
        timeout=TIMEOUT).stdout.strip()


def test_environment_header_and_footer_go_to_stdout():
    out = _bench("--loops", "asyncio,uvloop,tideloop", "--only", "call_soon,future")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith(TABLE_HEADER))
    header, after = "\n".join(lines[:table]), "\n".join(lines[table:])

    # What was measured, where: above the table, on stdout.
    assert f"CPython {platform.python_version()}" in header
    assert sys.executable in header
    assert platform.machine() in header and "CPU" in header
    assert "asyncio.SelectorEventLoop" in header
    assert f"tideloop {_tideloop_version()}" in header
    assert re.search(r"^(loops:|skipped:)?\s*uvloop\b", header, re.M)   # measured or skipped
    assert "median of 1 run" in header
    # ... and none of it only on stderr (which carries the progress).
    for text in ("CPython", "asyncio.SelectorEventLoop", f"tideloop {_tideloop_version()}"):
        assert text not in out.stderr

    # The table, then how to read it.
    assert LABELS["call_soon"] in after and LABELS["future"] in after
    assert "lower is better" in after
    assert "ns/op" in after.split("lower is better")[0].splitlines()[-1]
    assert "reproduce:" in after

    # Rows are aligned with the header although they are printed one by one.
    rule = lines[table + 1]
    assert set(rule) <= {"-", " "}
    rows = [line for line in lines if line.startswith(tuple(LABELS.values()))]
    assert len(rows) == 2
    assert all(len(row) == len(rule) for row in rows), "\n".join([rule] + rows)


def _progress_lines(text):      # "  future       n=1000    ." as a benchmark starts
    return [line for line in text.splitlines() if re.match(r"\s+\w+\s+n=\d+", line)]


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_merged_output_has_no_progress_among_the_rows(fmt):
    """2>&1 into a pipe or a log: the table's rows follow each other, in the
    order of the benchmarks."""
    extra = ["--markdown"] if fmt == "markdown" else []
    out = _bench("--loops", "asyncio", "--only", "call_soon,future,queue", *extra,
                 merge=True)
    assert out.returncode == 0, out.stdout
    assert _progress_lines(out.stdout) == [], out.stdout
    lines = out.stdout.splitlines()

    def row(name):
        label = LABELS[name]
        return next(i for i, line in enumerate(lines)
                    if line.startswith(label) or line.startswith(f"| {label}"))

    first = row("call_soon")
    assert [row("call_soon"), row("future"), row("queue")] == [first, first + 1, first + 2]


def test_progress_goes_to_a_separate_stderr_only():
    out = _bench("--loops", "asyncio", "--only", "call_soon,future")
    assert out.returncode == 0, out.stderr
    assert _progress_lines(out.stdout) == [], out.stdout
    assert len(_progress_lines(out.stderr)) == 2, out.stderr


def test_header_says_what_pass_fail_and_target_mean():
    out = _bench("--loops", "asyncio,tideloop", "--only", "call_soon")
    assert out.returncode == 0, out.stderr
    header = out.stdout.split(TABLE_HEADER)[0]
    legend = next(line for line in header.splitlines() if line.startswith("result:"))
    assert "PASS" in legend and "FAIL" in legend and "target" in legend
    assert "uvloop" in legend


def test_without_uvloop_the_result_is_against_asyncio():
    """uvloop hidden from the run (as when it is not installed): the rows
    compare tideloop with asyncio instead of n/a, and the header says so."""
    env = child_env()
    env.pop("PYTHONUNBUFFERED", None)
    code = ("import sys; sys.modules['uvloop'] = None; "
            "from tideloop.__main__ import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run(
        [sys.executable, "-c", code, "bench", *QUICK, "--loops", "asyncio,uvloop,tideloop",
         "--only", "call_soon,future"],
        capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=TIMEOUT, env=env)
    assert out.returncode == 0, out.stderr
    assert "n/a" not in out.stdout, out.stdout
    rows = [line for line in out.stdout.splitlines()
            if line.startswith((LABELS["call_soon"], LABELS["future"]))]
    assert len(rows) == 2
    assert all(re.search(r"\d+\.\dx (faster|slower)$", row) for row in rows), rows
    assert "uvloop not measured" in out.stdout.split(TABLE_HEADER)[0]


def test_json_markdown_and_cpu_clock_still_work(tmp_path):
    path = tmp_path / "bench.json"
    out = _bench("--loops", "asyncio,tideloop", "--only", "call_soon", "--markdown",
                 "--clock", "cpu", "--json", str(path), "-v")
    assert out.returncode == 0, out.stderr
    assert "| benchmark (CPU ns/op, median) | asyncio | tideloop |" in out.stdout
    assert f"| {LABELS['call_soon']} (500) |" in out.stdout
    assert "CPU ns/op" in out.stdout and "lower is better" in out.stdout
    assert "samples call_soon" in out.stdout
    assert out.stdout.rstrip().endswith(f"wrote {path}")
    doc = json.loads(path.read_text())
    assert doc["format"] == "tideloop-microbench/1"
    assert [r["name"] for r in doc["results"]] == ["call_soon"]
    assert set(doc["results"][0]["ns_per_op"]) == {"asyncio", "tideloop"}
    assert doc["clock"] == "cpu"
    assert doc["environment"]["loops"]["tideloop"].startswith("tideloop ")
