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


def verdict(tmp_path, base, now, base_calls=None, now_calls=None):
    (tmp_path / "base.json").write_text(json.dumps(
        {"python": platform.python_version(), "figures": base,
         **({"allocator_calls": base_calls} if base_calls else {})}))
    (tmp_path / "now.json").write_text(json.dumps(
        {"figures": now, **({"allocator_calls": now_calls} if now_calls else {})}))
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


def test_one_more_allocation_per_operation_fails(tmp_path):
    p = verdict(tmp_path, {"echo-protocol": 6500}, {"echo-protocol": 6500},
                {"echo-protocol": 4.0}, {"echo-protocol": 5.0})
    assert p.returncode == 1, p.stdout
    assert "echo-protocol: 5 allocator calls, the baseline 4" in p.stdout, p.stdout
    p = verdict(tmp_path, {"echo-protocol": 6500}, {"echo-protocol": 6500},
                {"echo-protocol": 4.0}, {"echo-protocol": 4.04})
    assert p.returncode == 0, p.stdout


# A callgrind dump part in the shape --dump-before writes: compressed names,
# relative positions, a call's inclusive cost on the line after calls=.
DUMP_PART = """\
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 1360

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) ???
fn=(1) PyBytes_FromStringAndSize
0 100
cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6
cfi=(2) ???
cfn=(2) malloc
calls=2 0
0 500
+3 20

ob=(2)
fl=(2)
fn=(2)
0 40
cfn=(3) _int_malloc
calls=2 0
0 460

fn=(3)
* 400
cfn=(4) unlink_chunk.constprop.0
calls=1 0
0 60

fn=(4)
0 60

ob=(3) /tmp/tlinstr-x/src/tideloop/_core.cpython-311-x86_64-linux-gnu.so
fl=(3) ???
fn=(5) run_once
0 700
cob=(2)
cfn=(6) free
calls=3 0
0 40

ob=(2)
fn=(6)
0 40
"""


def test_a_dump_part_is_read_as_the_costs_outside_the_allocator(tmp_path):
    part = tmp_path / "cg.out.2"
    part.write_text(DUMP_PART)
    # outside: 100 + 20 + 700; the allocator: malloc 40, _int_malloc 400,
    # unlink_chunk 60, free 40; calls from outside it: 2 malloc, 3 free.
    assert instructions.dump_costs(str(part)) == (820, 5, 1360)
    part.write_text(DUMP_PART.replace("summary: 1360", "summary: 1361"))
    with pytest.raises(RuntimeError, match="do not add up"):
        instructions.dump_costs(str(part))


def test_the_committed_baseline_names_every_workload():
    with open(os.path.join(REPO, "results", "instructions.json")) as f:
        doc = json.load(f)
    assert sorted(doc["figures"]) == sorted(WORKLOADS)
    assert all(isinstance(v, int) and v > 0 for v in doc["figures"].values())
    assert sorted(doc["allocator_calls"]) == sorted(WORKLOADS)


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_runs_and_checks_its_echo(name):
    p = subprocess.run([sys.executable, SCRIPT, "--child", name, "--n", "200"],
                       env=child_env(), capture_output=True, text=True, timeout=25)
    assert p.returncode == 0, p.stderr
