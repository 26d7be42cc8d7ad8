"""tests/run.py, the README's test command: both steps run whatever the first
one's verdict, each verdict is printed, and the exit status says whether all
passed."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def run_py(monkeypatch):
    spec = importlib.util.spec_from_file_location("tests_run", os.path.join(ROOT, "tests", "run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("verdicts, status", [((False, True), 1), ((True, False), 1),
                                               ((True, True), 0), ((False, False), 1)])
def test_every_step_runs_and_says_its_verdict(run_py, monkeypatch, capsys, verdicts, status):
    ran = []

    def step(name, cmd, log=None):
        ran.append(cmd)
        return verdicts[len(ran) - 1], 1.0
    monkeypatch.setattr(run_py, "step", step)
    assert run_py.main(["--jobs", "2", "--conformance-json", "c.json"]) == status
    suite, conformance = ran
    assert suite[1:] == ["-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-n", "2"]
    assert conformance[1:3] == ["tests/conformance/run.py", "--loop"]
    assert conformance[-4:] == ["--jobs", "2", "--json", "c.json"]
    out = capsys.readouterr().out
    for name, passed in zip(("behavioural suite", "conformance (test_asyncio)"), verdicts):
        assert f"{name:28s} {'PASS' if passed else 'FAIL'}" in out
    assert out.rstrip().endswith("tests: " + ("PASS" if status == 0 else "FAIL"))


def test_a_step_writes_its_log(run_py, tmp_path, capsys):
    log = tmp_path / "out.log"
    passed, _ = run_py.step("echo", ["sh", "-c", "echo hello; exit 3"], str(log))
    assert not passed and log.read_text() == "hello\n"
    assert "hello" in capsys.readouterr().out
