"""The conformance runner (tests/conformance/run.py) leaves nothing behind.

Each run gets TMPDIR pointed at a fresh empty directory, which must be empty
again afterwards: the runner's work directory (child logs) and whatever the
children and CPython's tests create in TMPDIR or their working directory go,
whether the run passes, fails, has a child crash, hits an error in the runner
or is interrupted (SIGINT / SIGTERM). --workdir and --keep keep the logs.

The misbehaving children use a loop class from a helper module given with
--loop-factory: it behaves after the runner's patch check (4 loops), then
crashes or hangs in the first loop a test makes, after leaving files around.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loop_helpers import child_env, sigint_default

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "conformance" / "run.py"
TIMEOUT = 25
MODULE = "test_context"         # one test, one loop on a loop side: about a second

HELPER = textwrap.dedent("""\
    import asyncio, os, signal, tempfile, time

    class _Misbehaving(asyncio.SelectorEventLoop):
        made = 0

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            cls = type(self)
            cls.made += 1
            if cls.made > 4:            # past the runner's patch check: in a test
                # What a dying test leaves: temporary files and directories,
                # and a file in the working directory (like os_helper.TESTFN).
                tempfile.mkstemp(prefix="leftover-")
                tempfile.mkdtemp(prefix="leftover-")
                open("@leftover_in_cwd", "w").close()
                self.misbehave()

    class CrashingLoop(_Misbehaving):
        def misbehave(self):
            os.kill(os.getpid(), signal.SIGKILL)

    class HangingLoop(_Misbehaving):
        def misbehave(self):
            marker = f"{os.environ['CONFORMANCE_MARKER']}.{os.getpid()}"
            with open(marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(marker + ".tmp", marker)
            time.sleep(120)
""")


@pytest.fixture
def sandbox(tmp_path):
    """(env, tmpdir, tmp_path): the runner's environment with TMPDIR an empty
    directory of its own and the helper loops importable."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "misbehaving_loops.py").write_text(HELPER)
    env = child_env({"TMPDIR": str(tmpdir)})
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(helpers)])
    return env, tmpdir, tmp_path


def _leftovers(tmpdir):
    return sorted(str(p.relative_to(tmpdir)) for p in tmpdir.rglob("*"))


def _runner(env, *args, timeout=TIMEOUT):
    return subprocess.run([sys.executable, str(RUNNER), "--modules", MODULE, *args],
                          env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=REPO)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_passing_run_leaves_nothing(sandbox, jobs):
    env, tmpdir, tmp_path = sandbox
    report = tmp_path / "report.json"
    out = _runner(env, "--loop", "both", "--strict", "--json", str(report), "--jobs", jobs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _leftovers(tmpdir) == []
    assert "child logs removed" in out.stdout
    doc = json.loads(report.read_text())
    for side in ("stock", "tideloop"):
        counts = doc["modules"][MODULE][side]["counts"]
        assert counts["passed"] >= 1 and counts["crashed"] == 0, doc
    assert not doc["logs_kept"]


def test_bogus_module_leaves_nothing(sandbox):
    env, tmpdir, _ = sandbox
    out = subprocess.run([sys.executable, str(RUNNER), "--modules", "test_no_such_module",
                          "--loop", "both", "--strict"], env=env, capture_output=True,
                         text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd=REPO)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "child failed before running tests" in out.stdout
    assert _leftovers(tmpdir) == []


def test_crashing_child_leaves_nothing(sandbox):
    env, tmpdir, tmp_path = sandbox
    report = tmp_path / "report.json"
    out = _runner(env, "--loop", "tideloop", "--json", str(report),
                  "--loop-factory", "misbehaving_loops:CrashingLoop")
    assert out.returncode == 0, out.stdout + out.stderr
    side = json.loads(report.read_text())["modules"][MODULE]["tideloop"]
    assert side["crashes"] and side["crashes"][0]["how"] == "signal SIGKILL", side
    assert _leftovers(tmpdir) == []
    # The children's working directory is not the repository either.
    assert not (REPO / "@leftover_in_cwd").exists()


def test_error_in_runner_leaves_nothing(sandbox):
    env, tmpdir, tmp_path = sandbox
    out = _runner(env, "--loop", "stock",
                  "--json", str(tmp_path / "no_such_dir" / "report.json"))
    assert out.returncode == 1
    assert "FileNotFoundError" in out.stderr
    assert _leftovers(tmpdir) == []


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_leaves_nothing(sandbox, signum, jobs):
    """With --jobs 2, two children hang at once (two modules); both go."""
    env, tmpdir, tmp_path = sandbox
    markers = tmp_path / "markers"
    markers.mkdir()
    env["CONFORMANCE_MARKER"] = str(markers / "hanging-child")
    modules = MODULE if jobs == "1" else f"{MODULE},test_futures2"
    proc = subprocess.Popen([sys.executable, str(RUNNER), "--modules", modules,
                             "--loop", "tideloop", "--jobs", jobs,
                             "--loop-factory", "misbehaving_loops:HangingLoop"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, cwd=REPO,
                            preexec_fn=sigint_default)     # Ctrl-C reaches it
    try:
        deadline = time.monotonic() + TIMEOUT - 5
        while len(list(markers.glob("hanging-child.*[0-9]"))) < int(jobs):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the hanging child(ren) did not start"
            time.sleep(0.02)
        children = [int(p.read_text()) for p in markers.glob("hanging-child.*[0-9]")]
        assert _leftovers(tmpdir) != []         # the run's files are there now
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if signum == signal.SIGINT:
        assert (proc.returncode, stderr.strip().splitlines()[-1]) == (
            130, "conformance: interrupted"), stderr
    else:
        assert proc.returncode == 128 + signal.SIGTERM, stderr
    for child in children:
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)                   # the child was stopped, not orphaned
    assert _leftovers(tmpdir) == []


def test_workdir_keeps_logs_only(sandbox):
    env, tmpdir, tmp_path = sandbox
    workdir = tmp_path / "logs"
    out = _runner(env, "--loop", "both", "--workdir", str(workdir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"child logs in {workdir}" in out.stdout
    assert sorted(p.name for p in workdir.iterdir()) == sorted(
        f"{MODULE}.{side}.{ext}" for side in ("stock", "tideloop") for ext in ("jsonl", "log"))
    assert _leftovers(tmpdir) == []


def test_keep_keeps_everything(sandbox):
    env, tmpdir, _ = sandbox
    out = _runner(env, "--loop", "stock", "--keep")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kept: child logs in" in out.stderr
    kept = _leftovers(tmpdir)
    assert any(p.endswith(f"{MODULE}.stock.log") for p in kept), kept
