"""What python -m bench.net and python -m bench.io print, at a tiny size:
the header (stdout) says what PASS / FAIL / target mean; no progress line in
the output when stderr goes where stdout goes (2>&1 into a log); with uvloop
not importable in the workers' environment, it is skipped up front and the
result column compares tideloop with asyncio instead of n/a.

The figures are not checked (a shared machine), only what is printed.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loop_helpers import child_env

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 28                      # below the suite's 30 s watchdog
TINY = {
    "net": ["--only", "protocol", "--sizes", "1024", "--conns", "1", "--duration", "0.2",
            "--warmup", "0.05", "--no-floor"],
    "io": ["--only", "spawn", "--count", "10", "--concurrency", "5"],
}
# A progress line: "  protocol  1 KiB x1   . asyncio=46.8us ..." / "  spawn  10 /5 ."
PROGRESS = re.compile(r"^\s+(protocol|spawn)\s+\S+.*\.")


@pytest.fixture
def no_uvloop(tmp_path):
    """An environment whose interpreters (the drivers' workers included)
    cannot import uvloop, installed or not."""
    blocker = tmp_path / "hide" / "uvloop"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("uvloop hidden by the test")\n')
    env = child_env()
    env["PYTHONPATH"] = f"{blocker.parent}:{env['PYTHONPATH']}"
    return env


@pytest.mark.parametrize("bench", ["net", "io"])
def test_output_without_uvloop(bench, no_uvloop):
    p = subprocess.run(
        [sys.executable, "-m", f"bench.{bench}", "--repeat", "1", *TINY[bench]],
        cwd=ROOT, env=no_uvloop, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stdout[-3000:]
    head, table = p.stdout.split("\n\n", 1)

    # The header: the loops, uvloop skipped with the extra that installs it,
    # and what the result column means.
    assert re.search(r"uvloop\s+skipped: .*tideloop\[bench\]", head), head
    legend = head[head.index("result:"):]
    assert "PASS" in legend and "FAIL" in legend and "target" in legend
    assert "uvloop not measured" in legend

    # No progress line anywhere (stderr is stdout's pipe).
    assert not [line for line in p.stdout.splitlines() if PROGRESS.match(line)], p.stdout

    # The row compares with asyncio where a target needs uvloop (net's
    # protocol row without the C floor: its targets are uvloop's and C's);
    # a missed target on asyncio is a FAIL all the same (io's <=0.50x aio).
    rows = [line for line in table.splitlines() if line.startswith(("protocol", "spawn"))]
    assert len(rows) == 1, table
    result = r"\d+\.\dx (faster|slower)" + ("" if bench == "net" else "|FAIL")
    assert re.search(f"({result})$", rows[0]), rows[0]
    assert re.search(r"\b0\.\d\dx|\b\d+\.\d\dx", rows[0])      # tl/aio, a ratio
    assert "n/a" not in p.stdout
    assert "--loops asyncio,tideloop" in p.stdout          # reproduce: what was measured


def test_page_faulting_servers_are_named():
    """A server whose median sample maps memory per request is named with
    its cells; one fault in one sample of three is not."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench import net
    finally:
        sys.path.remove(str(ROOT))

    def samples(*faults):
        return [{"minflt_per_req": f} for f in faults]

    rows = [{"kind": "protocol", "size": 1024, "samples": {
                "asyncio": samples(6.1, 5.9, 6.0), "tideloop": samples(0.0, 3.0, 0.0),
                net.FLOOR: samples(0.0, 0.0, 0.0)}},
            {"kind": "streams", "size": 102400, "samples": {
                "asyncio": samples(2.0, 2.5, 1.5), "uvloop": samples(0.1, None, 0.2),
                net.FLOOR: samples(4.0, 4.0, 4.0)}}]
    assert net.page_faulting(rows) == {"asyncio": "protocol 1 KiB: 6.0, streams 100 KiB: 2.0",
                                       "C": "streams 100 KiB: 4.0"}
