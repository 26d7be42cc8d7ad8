"""The conformance runner's --subinterpreter mode (tests/conformance/run.py).

Each child process runs its module in an isolated subinterpreter (3.12+) it
makes: the report must say so, per side, and the per-test watchdog, which
stays in the main interpreter, must still turn a hanging test into a "hang".
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loop_helpers import child_env

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12),
                                reason="isolated subinterpreters: 3.12+")

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "conformance" / "run.py"
TIMEOUT = 60
MODULE = "test_context"         # one test, one loop on a loop side: about a second

HELPER = textwrap.dedent("""\
    import asyncio, time

    class HangingLoop(asyncio.SelectorEventLoop):
        made = 0

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            type(self).made += 1
            if type(self).made > 4:     # past the runner's patch check: in a test
                time.sleep(120)
""")


def _run(tmp_path, *args, env=None):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, str(RUNNER), "--modules", MODULE,
                          "--subinterpreter", "--json", str(report), *args],
                         env=env or child_env({"TMPDIR": str(tmpdir)}),
                         capture_output=True, text=True, timeout=TIMEOUT,
                         stdin=subprocess.DEVNULL, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    return out, json.loads(report.read_text())


def test_both_sides_run_in_a_subinterpreter(tmp_path):
    out, doc = _run(tmp_path, "--loop", "both", "--strict", "--jobs", "2")
    assert doc["subinterpreter"] is True
    assert "ran in isolated subinterpreters: 2 of 2 (module, loop) pairs" in out.stdout
    mod = doc["modules"][MODULE]
    assert mod["tideloop"]["loop_type"] == "tideloop.Loop"
    for side in ("stock", "tideloop"):
        sd = mod[side]
        assert sd["interpreter"].startswith("subinterpreter "), sd
        assert sd["subinterpreter"]["destroyed"], sd
        if sys.version_info >= (3, 13):     # 3.12 cannot tell the config
            assert sd["subinterpreter"]["config"]["gil"] == "own", sd
            assert not sd["subinterpreter"]["config"]["allow_daemon_threads"], sd
        assert sd["counts"]["passed"] >= 1 and sd["counts"]["crashed"] == 0, sd
        assert isinstance(sd["adaptations"], list), sd
    assert mod["regressions"] == [] and mod["nyi"] == []


def test_watchdog_reaches_into_the_subinterpreter(tmp_path):
    """faulthandler does not load in the subinterpreter: the main
    interpreter's watchdog, armed through a pipe, ends the hanging test."""
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "hanging_loop.py").write_text(HELPER)
    env = child_env({"TMPDIR": str(tmp_path / "tmp")})
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{helpers}"
    _, doc = _run(tmp_path, "--loop", "tideloop", "--test-timeout", "2",
                  "--loop-factory", "hanging_loop:HangingLoop", env=env)
    side = doc["modules"][MODULE]["tideloop"]
    assert [c["how"] for c in side["crashes"]] == ["hang (> 2 s, watchdog)"], side
    assert side["restarts"] == 1 and side["error"] is None, side
    assert side["subinterpreter"]["destroyed"], side     # the resumed child's
