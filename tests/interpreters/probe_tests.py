"""Made-up tests for tests/tooling/test_interpreters_runner.py: what
run_suite.py must tell apart.  Not part of the suite (pytest collects
test_*.py only); the runner is given this file by name.

TIDELOOP_SI_PROBE (comma-separated) turns the faults on: "regress" (fails on
tideloop only), "both" (fails on both params with one cause), "crash" (the
tideloop param's process dies of SIGSEGV), "hang" (the tideloop param
sleeps for ever).
"""
import asyncio
import os
import signal
import time

import pytest

PROBE = set(os.environ.get("TIDELOOP_SI_PROBE", "").split(","))


def test_passes(run):
    assert run(asyncio.sleep(0, "ok")) == "ok"


def test_regresses(loop_name):
    assert not ("regress" in PROBE and loop_name == "tideloop")


def test_fails_on_both(loop_name):
    if "both" in PROBE:
        raise ValueError("the same cause on both params")


@pytest.mark.main_interpreter("made up for the runner's test")
def test_main_interpreter_only(loop_name):
    pass


def test_crashes(loop_name):
    if "crash" in PROBE and loop_name == "tideloop":
        os.kill(os.getpid(), signal.SIGSEGV)


def test_hangs(loop_name):
    if "hang" in PROBE and loop_name == "tideloop":
        time.sleep(3600)


def test_runs_after_the_crash_and_the_hang(run):
    assert run(asyncio.sleep(0, 1)) == 1
