"""The tests that need SIGINT delivered pass when the run ignores SIGINT.

A run started with SIGINT ignored (any background job of a non-interactive
shell, many CI runners) hands the ignored disposition to every child through
exec; the tests that Ctrl-C a child give it back the default
(loop_helpers.sigint_default).  This runs those tests, on both loops, in a
child pytest that starts with SIGINT ignored.  (CI runs the whole 3.11
suite that way too: .ci/run.)
"""
import json
import signal
import subprocess
import sys
from pathlib import Path

from loop_helpers import SLOW, child_env

REPO = Path(__file__).resolve().parents[2]
SUBSET = [
    "tests/loop/test_signals.py::test_sigint_interrupts_run_until_complete",
    "tests/loop/test_signals.py::test_sigint_in_callback_propagates_from_run_forever",
    "tests/loop/test_signals.py::test_runner_sigint_cancels_main_task",
    "tests/pipes/test_subprocess.py::test_transport_kill_terminate_send_signal",
]


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_sigint_tests_pass_with_sigint_ignored():
    probe = subprocess.run([sys.executable, "-c",
                            "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"],
                           capture_output=True, text=True, timeout=20,
                           preexec_fn=_ignore_sigint)
    assert probe.stdout.strip() == "True", probe        # the set-up holds
    out = subprocess.run([sys.executable, "-m", "pytest", *SUBSET, "-q",
                          "-p", "no:cacheprovider"],
                         capture_output=True, text=True, timeout=25 * SLOW, cwd=REPO,
                         env=child_env(), stdin=subprocess.DEVNULL,
                         preexec_fn=_ignore_sigint)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert summary.startswith(f"{2 * len(SUBSET)} passed"), out.stdout[-3000:]


def test_conformance_runner_children_get_sigint(tmp_path):
    """CPython's test_runners interrupts itself (_thread.interrupt_main(),
    which does nothing for an ignored SIGINT): with the runner's children
    ignoring SIGINT, three of its tests spun until the per-test watchdog."""
    report = tmp_path / "report.json"
    env = child_env({"TMPDIR": str(tmp_path)})
    out = subprocess.run([sys.executable, str(REPO / "tests" / "conformance" / "run.py"),
                          "--loop", "both", "--modules", "test_runners",
                          "--test-timeout", "2", "--json", str(report)],
                         capture_output=True, text=True, timeout=25 * SLOW, cwd=REPO, env=env,
                         stdin=subprocess.DEVNULL, preexec_fn=_ignore_sigint)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(report.read_text())
    for side in ("stock", "tideloop"):
        info = doc["modules"]["test_runners"][side]
        assert info["crashes"] == [], (side, info["crashes"])
        counts = info["counts"]
        assert counts["passed"] >= 20 and counts["failed"] == counts["errors"] == 0, (side, counts)
