"""tests/ecosystem/suites.py: the comparison of the frameworks' suites.

The real runs (sdists from PyPI, a venv per suite, PostgreSQL) are CI's
"frameworks' own test suites" stage (.ci/run); here the runner's pieces get
made-up input: junit XML written in place, known-failure lists, outcome
maps, and one small made-up "suite" run end to end through the runner's own
pytest runs with the plugin (a few seconds), whose tests pass or fail
depending on the loop they get.
"""
import sys
import textwrap
from pathlib import Path

import pytest

from loop_helpers import _tideloop_root
from tests.ecosystem import suites

ROOT = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="8">
 <testcase classname="tests.test_a" name="test_plain" file="tests/test_a.py" line="1" time="0.1"/>
 <testcase classname="tests.test_a.TestOuter.TestInner" name="test_nested[asyncio-x]" file="tests/test_a.py" time="0.1"/>
 <testcase classname="tests.test_a" name="test_fails" file="tests/test_a.py" time="0.1"><failure message="boom">trace</failure></testcase>
 <testcase classname="tests.sub.test_b.TestB" name="test_error" file="tests/sub/test_b.py" time="0.1"><error message="setup">trace</error></testcase>
 <testcase classname="tests.sub.test_b.TestB" name="test_skip" file="tests/sub/test_b.py" time="0"><skipped type="pytest.skip" message="no"/></testcase>
 <testcase classname="tests.sub.test_b.TestB" name="test_xfail" file="tests/sub/test_b.py" time="0"><skipped type="pytest.xfail" message="x"/></testcase>
 <testcase classname="tests.test_a" name="test_teardown" file="tests/test_a.py" time="0.1"/>
 <testcase classname="tests.test_a" name="test_teardown" file="tests/test_a.py" time="0.1"><error message="teardown">trace</error></testcase>
</testsuite></testsuites>
"""


def test_parse_junit(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    assert suites.parse_junit(path) == {
        "tests/test_a.py::test_plain": "passed",
        "tests/test_a.py::TestOuter::TestInner::test_nested[asyncio-x]": "passed",
        "tests/test_a.py::test_fails": "failed",
        "tests/sub/test_b.py::TestB::test_error": "failed",
        "tests/sub/test_b.py::TestB::test_skip": "skipped",
        "tests/sub/test_b.py::TestB::test_xfail": "skipped",
        "tests/test_a.py::test_teardown": "failed",      # the worst of its two reports
    }


def test_parse_known():
    known = suites.parse_known(textwrap.dedent("""\
        # comment

        anyio tests/test_a.py::test_x[asyncio]  # remove_reader(sock) after close
          uvicorn tests/test_b.py::TestB::test_y # default loop class
        """))
    assert known == {("anyio", "tests/test_a.py::test_x[asyncio]"): "remove_reader(sock) after close",
                     ("uvicorn", "tests/test_b.py::TestB::test_y"): "default loop class"}


@pytest.mark.parametrize("line", [
    "anyio tests/test_a.py::test_x",               # no reason
    "anyio tests/test_a.py::test_x  #   ",          # empty reason
    "tests/test_a.py::test_x  # no suite",
    "anyio tests/test_a.py::test_x extra  # reason",
])
def test_parse_known_rejects(line):
    with pytest.raises(ValueError):
        suites.parse_known(line)


def test_parse_known_rejects_duplicates():
    with pytest.raises(ValueError, match="twice"):
        suites.parse_known("anyio t::x  # a\nanyio t::x  # b\n")


STOCK = {"same": "passed", "regressed": "passed", "listed": "passed", "both_fail": "failed",
         "skipped_on_tideloop": "passed", "missing_on_tideloop": "passed",
         "fixed": "passed", "only_tideloop_passes": "failed", "skipped_both": "skipped"}
TIDE = {"same": "passed", "regressed": "failed", "listed": "failed", "both_fail": "failed",
        "skipped_on_tideloop": "skipped", "fixed": "passed",
        "only_tideloop_passes": "passed", "skipped_both": "skipped"}


def test_compare_without_rerun():
    v = suites.compare(STOCK, TIDE, known={"listed", "fixed", "both_fail"})
    assert v["candidates"] == ["listed", "missing_on_tideloop", "regressed", "skipped_on_tideloop"]
    assert v["listed"] == ["listed"]
    assert v["unlisted"] == ["missing_on_tideloop", "regressed", "skipped_on_tideloop"]
    assert v["flaky"] == v["inconclusive"] == []
    assert v["known_passing"] == ["fixed"]


def test_compare_with_rerun():
    rerun_stock = {"regressed": "passed", "listed": "passed", "skipped_on_tideloop": "failed",
                   "missing_on_tideloop": "passed"}
    rerun_tide = {"regressed": "failed", "listed": "passed", "skipped_on_tideloop": "failed",
                  "missing_on_tideloop": "failed"}
    v = suites.compare(STOCK, TIDE, known={"listed"}, rerun=(rerun_stock, rerun_tide))
    assert v["unlisted"] == ["missing_on_tideloop", "regressed"]
    assert v["listed"] == []
    assert v["flaky"] == ["listed"]                    # passed on tideloop when run again
    assert v["inconclusive"] == ["skipped_on_tideloop"]  # failed on stock when run again
    assert v["known_passing"] == ["listed"]


def test_compare_no_regressions():
    v = suites.compare({"a": "passed", "b": "failed"}, {"a": "passed", "b": "failed"})
    assert v["candidates"] == v["listed"] == v["unlisted"] == []


# A made-up suite, run the way the runner runs the real ones (both loops,
# the plugin, junit XML, the rerun).  Its conftest has the two fixture shapes
# the plugin rewrites: anyio's anyio_backend and aiohttp's loop_factory
# (parametrized directly, as aiohttp's pytest plugin does).
FAKE_CONFTEST = '''
import asyncio
import pytest

@pytest.fixture
def anyio_backend():
    return "asyncio"

@pytest.fixture(params=[pytest.param(("asyncio", {"debug": True}), id="asyncio")])
def anyio_backend_param(request):
    return request.param

def pytest_generate_tests(metafunc):
    if "loop_factory" in metafunc.fixturenames:
        metafunc.parametrize("loop_factory", [asyncio.new_event_loop], ids=["pyloop"])
'''

FAKE_TESTS = '''
import asyncio
import os
from pathlib import Path

TIDELOOP = os.environ["TIDELOOP_SUITES_LOOP"] == "tideloop"

def module_of(factory):
    loop = factory()
    try:
        return type(loop).__module__.split(".")[0]
    finally:
        loop.close()

def test_same():
    assert asyncio.run(asyncio.sleep(0, 5)) == 5

def test_loop_kind():
    assert module_of(asyncio.new_event_loop) == ("tideloop" if TIDELOOP else "asyncio")

def test_regressed():
    assert module_of(asyncio.new_event_loop) == "asyncio"

def test_anyio_backend(anyio_backend):
    if TIDELOOP:
        assert module_of(anyio_backend[1]["loop_factory"]) == "tideloop"
    else:
        assert anyio_backend == "asyncio"

def test_loop_factory(loop_factory):
    assert module_of(loop_factory) == ("tideloop" if TIDELOOP else "asyncio")

def test_flaky():
    # fails the first time it runs on tideloop, passes after
    marker = Path(os.environ["SUITES_TEST_MARKER"])
    if TIDELOOP and not marker.exists():
        marker.touch()
        assert False, "first run on tideloop"

def test_both_fail():
    assert False
'''


@pytest.fixture
def fake_suite(tmp_path, monkeypatch):
    root = tmp_path / "fake-1.0"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "conftest.py").write_text(FAKE_CONFTEST)
    (root / "tests" / "test_fake.py").write_text(FAKE_TESTS)
    monkeypatch.setattr(suites, "unpacked_sdist", lambda suite: root)
    monkeypatch.setattr(suites, "venv_for", lambda suite: Path(sys.executable))
    monkeypatch.setattr(suites, "TIDELOOP_SRC", _tideloop_root())
    monkeypatch.setenv("SUITES_TEST_MARKER", str(tmp_path / "flaky-marker"))
    suite = suites.Suite("fake", "1.0", [], quick=["tests"], timeout=None, wall=60,
                         addopts="-p no:cacheprovider",
                         env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    logs = tmp_path / "logs"
    logs.mkdir()
    return suite, logs


def test_run_suite_end_to_end(fake_suite):
    suite, logs = fake_suite
    known = suites.parse_known("fake tests/test_fake.py::test_both_fail  # fails on both loops\n"
                               "fake tests/test_fake.py::test_same  # listed, passes\n"
                               "other tests/test_fake.py::test_regressed  # another suite's\n")
    e = suites.run_suite(suite, False, known, logs)
    assert e["problems"] == []
    # test_flaky failed on tideloop only the first time; test_regressed both times
    assert e["stock"]["passed"] == 6 and e["stock"]["failed"] == 1
    assert e["tideloop"]["passed"] == 4 and e["tideloop"]["failed"] == 3
    assert e["rerun"] == 2
    assert e["regressions"] == {"listed": [], "unlisted": ["tests/test_fake.py::test_regressed"]}
    assert e["flaky"] == ["tests/test_fake.py::test_flaky"]
    assert e["known_now_passing"] == ["tests/test_fake.py::test_same"]
    assert e["tideloop"]["loops_made"]["tideloop"] >= 4
    assert e["stock"]["loops_made"]["tideloop"] == 0
    assert e["ok"] is False
    # listed, the same regression passes the verdict
    main, rerun = ([suites.parse_junit(logs / f"fake-{tag}-{loop}.xml") for loop in suites.LOOPS]
                   for tag in ("main", "rerun"))
    v = suites.compare(*main, known={"tests/test_fake.py::test_regressed"}, rerun=rerun)
    assert v["listed"] == ["tests/test_fake.py::test_regressed"] and v["unlisted"] == []

