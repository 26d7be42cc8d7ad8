"""tools/instructions.py, CI's instruction-count guard: the verdict fails on
growth beyond the tolerance and on a workload missing from the baseline,
passes within it, and names a gain; every workload runs (outside callgrind,
small n) and checks its echo.  The measurement under callgrind is CI's
"instruction counts" stage."""
import json
import os
import platform
import subprocess
import sys

import pytest

from loop_helpers import child_env
from tools import instructions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tools", "instructions.py")
WORKLOADS = list(instructions.WORKLOADS)


def verdict(tmp_path, base, now):
    (tmp_path / "base.json").write_text(json.dumps(
        {"python": platform.python_version(), "figures": base}))
    (tmp_path / "now.json").write_text(json.dumps({"figures": now}))
    return subprocess.run([sys.executable, SCRIPT, "--baseline", str(tmp_path / "base.json"),
                           "--figures", str(tmp_path / "now.json")],
                          capture_output=True, text=True, timeout=20)


def test_growth_above_the_tolerance_fails(tmp_path):
    p = verdict(tmp_path, {"call-soon": 1000, "timers": 2000}, {"call-soon": 1031, "timers": 2000})
    assert p.returncode == 1
    assert "FAIL" in p.stdout and "call-soon: 1.031x its baseline" in p.stdout, p.stdout


def test_within_the_tolerance_passes_and_a_gain_is_named(tmp_path):
    p = verdict(tmp_path, {"call-soon": 1000, "timers": 2000}, {"call-soon": 1030, "timers": 1500})
    assert p.returncode == 0, p.stdout
    assert "PASS" in p.stdout and "timers 0.750x" in p.stdout, p.stdout


def test_a_workload_missing_from_the_baseline_fails(tmp_path):
    p = verdict(tmp_path, {"call-soon": 1000}, {"call-soon": 1000, "timers": 5})
    assert p.returncode == 1 and "timers: not in the baseline" in p.stdout, p.stdout


def test_the_committed_baseline_names_every_workload():
    with open(os.path.join(REPO, "results", "instructions.json")) as f:
        doc = json.load(f)
    assert sorted(doc["figures"]) == sorted(WORKLOADS)
    assert all(isinstance(v, int) and v > 0 for v in doc["figures"].values())


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_runs_and_checks_its_echo(name):
    p = subprocess.run([sys.executable, SCRIPT, "--child", name, "--n", "200"],
                       env=child_env(), capture_output=True, text=True, timeout=25)
    assert p.returncode == 0, p.stderr
