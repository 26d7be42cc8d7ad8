"""The pytest plugin (tideloop.pytest_plugin): a user's project run by pytest
in a child process, with pytest-asyncio and anyio installed.

The project (written into tmp_path, no conftest) has ``@pytest.mark.asyncio``
tests with an async pytest-asyncio fixture and ``@pytest.mark.anyio`` tests
with an async anyio fixture; each one records the class of the running loop
in a file and asserts it against the class the parent expects (``EXPECT``).
The plugin is not passed with ``-p``: the child finds it the way an
installation does, through a ``pytest11`` entry point, made here from the one
pyproject.toml declares (a dist-info directory on the child's PYTHONPATH).
"""
import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from loop_helpers import SLOW, child_env

pytest.importorskip("pytest_asyncio", minversion="1.4")
anyio = pytest.importorskip("anyio")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60 * SLOW     # a child pytest run (11-15 s seen at load average 5)


def _name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


STOCK = _name(asyncio.SelectorEventLoop)
TIDELOOP = "tideloop.Loop"


def _anyio_backends():
    try:
        return list(anyio.get_available_backends())
    except AttributeError:          # anyio < 4.12 parametrizes over all of them
        from anyio._core._eventloop import get_all_backends
        return list(get_all_backends())


RECORD_PY = """\
import asyncio, json, os

def record(test, backend="asyncio"):
    if backend == "asyncio":
        cls = type(asyncio.get_running_loop())
        loop = f"{cls.__module__}.{cls.__qualname__}"
    else:
        loop = backend
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps({"test": test, "backend": backend, "loop": loop}) + "\\n")
    return loop
"""

TEST_ASYNCIO = """\
import os
import pytest
import pytest_asyncio
from _record import record

@pytest_asyncio.fixture
async def fixture_loop():
    return record("asyncio-fixture")

@pytest.mark.asyncio
async def test_function_scope(fixture_loop):
    loop = record("asyncio-test")
    assert loop == fixture_loop == os.environ["EXPECT"]

@pytest.mark.asyncio(loop_scope="module")
async def test_module_scope():
    assert record("asyncio-module-scope") == os.environ["EXPECT"]

def test_sync():
    pass
"""

TEST_ANYIO = """\
import os
import pytest
from _record import record

pytestmark = pytest.mark.anyio

async def test_backend(anyio_backend_name):
    loop = record("anyio-test", anyio_backend_name)
    if anyio_backend_name == "asyncio":
        assert loop == os.environ["EXPECT"]

@pytest.fixture
async def fixture_loop(anyio_backend_name):
    return record("anyio-fixture", anyio_backend_name)

async def test_fixture(anyio_backend_name, fixture_loop):
    assert record("anyio-fixture-test", anyio_backend_name) == fixture_loop
"""
# An async anyio fixture on trio fails with a trio older than anyio wants
# (anyio 4.16: trio >= 0.32; its runner calls trio.lowlevel.in_trio_task),
# and a trio may be installed without anyio's extra: on trio only
# test_backend runs, which shows that the trio param stays.
DESELECT = ["--deselect", "test_anyio_tests.py::test_fixture[trio]"]

# The project's own anyio_backend (a module fixture, a parametrization) wins
# over the plugin's, as over anyio's default: the stock loop unless it says
# otherwise.
TEST_ANYIO_OWN = """\
import pytest
import tideloop
from _record import record

@pytest.fixture
def anyio_backend():
    return "asyncio"

@pytest.mark.anyio
async def test_own_fixture():
    record("anyio-own-fixture")

@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [
    ("asyncio", {"loop_factory": tideloop.new_event_loop})])
async def test_own_param():
    record("anyio-own-param")
"""

INI = """\
[pytest]
asyncio_default_fixture_loop_scope = function
"""


def _entry_points(tmp_path):
    """A dist-info whose pytest11 entry points are pyproject.toml's."""
    site = tmp_path / "site"
    if site.exists():
        return site
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"]["pytest11"]
    info = site / "tideloop-0+plugintest.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tideloop\nVersion: 0+plugintest\n")
    (info / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return site


def _project(tmp_path, ini_extra="", files=None):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pytest.ini").write_text(INI + ini_extra)
    (proj / "_record.py").write_text(RECORD_PY)
    for name, text in (files or {"test_asyncio_tests.py": TEST_ASYNCIO,
                                 "test_anyio_tests.py": TEST_ANYIO}).items():
        (proj / name).write_text(text)
    return proj


def _pytest(tmp_path, proj, *args, expect=TIDELOOP):
    record = tmp_path / f"record-{len(list(tmp_path.glob('record-*')))}.jsonl"
    env = child_env({"RECORD": str(record), "EXPECT": expect})
    env["PYTHONPATH"] = os.pathsep.join([str(_entry_points(tmp_path)),
                                         env["PYTHONPATH"]])
    for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *DESELECT, *args],
        cwd=proj, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    out = proc.stdout + proc.stderr
    records = ([json.loads(line) for line in record.read_text().splitlines()]
               if record.exists() else [])
    return proc.returncode, out, records


def _counts(out):
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|skipped)", out)}


def _header(out):
    return [line for line in out.splitlines() if line.startswith("tideloop:")]


def _loops(records, backend="asyncio"):
    return {r["test"]: r["loop"] for r in records if r["backend"] == backend}


def _check_run(rc, out, records, expect):
    backends = _anyio_backends()
    assert rc == 0, out
    # 2 asyncio tests + 1 sync test, test_backend per available backend,
    # test_fixture on asyncio
    assert _counts(out) == {"passed": 4 + len(backends)}, out
    assert _loops(records) == {
        "asyncio-fixture": expect, "asyncio-test": expect,
        "asyncio-module-scope": expect, "anyio-test": expect,
        "anyio-fixture": expect, "anyio-fixture-test": expect}, records
    assert sorted({r["backend"] for r in records}) == sorted(backends)


def test_default_is_the_stock_loop(tmp_path):
    proj = _project(tmp_path)
    rc, out, records = _pytest(tmp_path, proj, expect=STOCK)
    _check_run(rc, out, records, STOCK)
    assert _header(out) == ["tideloop: loop=asyncio (the stock loop; default)"], out


def test_loop_option(tmp_path):
    proj = _project(tmp_path)
    rc, out, records = _pytest(tmp_path, proj, "--loop=tideloop")
    _check_run(rc, out, records, TIDELOOP)
    header = _header(out)
    assert len(header) == 1 and header[0].startswith(
        "tideloop: loop=tideloop (command line) under pytest-asyncio "), out
    assert "anyio" in header[0]


@pytest.mark.watchdog(200)     # three pytest runs, each up to TIMEOUT
def test_same_test_ids(tmp_path):
    # One loop factory: pytest-asyncio hides its param; the anyio_backend
    # params keep anyio's ids.
    proj = _project(tmp_path)
    ids = [[line for line in _pytest(tmp_path, proj, "--co", "-q", *a)[1].splitlines()
            if "::" in line]
           for a in ((), ("--loop=tideloop",), ("--tideloop-loop", "tideloop"))]
    assert ids[0] == ids[1] == ids[2], ids
    assert any(i.endswith("test_backend[asyncio]") for i in ids[0]), ids[0]


@pytest.mark.watchdog(130)     # two pytest runs, each up to TIMEOUT
def test_ini_option(tmp_path):
    proj = _project(tmp_path, ini_extra="tideloop_loop = tideloop\n")
    rc, out, records = _pytest(tmp_path, proj)
    _check_run(rc, out, records, TIDELOOP)
    assert _header(out)[0].startswith(
        "tideloop: loop=tideloop (ini option tideloop_loop) under "), out
    # The command line wins over the ini file.
    rc, out, records = _pytest(tmp_path, proj, "--loop=asyncio", expect=STOCK)
    _check_run(rc, out, records, STOCK)
    assert _header(out) == ["tideloop: loop=asyncio (the stock loop; command line)"]


def test_uvloop(tmp_path):
    uvloop = pytest.importorskip("uvloop")
    proj = _project(tmp_path)
    rc, out, records = _pytest(tmp_path, proj, "--loop=uvloop",
                               expect=_name(uvloop.Loop))
    _check_run(rc, out, records, _name(uvloop.Loop))


def test_project_anyio_backend_takes_precedence(tmp_path):
    proj = _project(tmp_path, files={"test_own.py": TEST_ANYIO_OWN})
    rc, out, records = _pytest(tmp_path, proj, "--loop=tideloop")
    assert rc == 0 and _counts(out) == {"passed": 2}, out
    assert _loops(records) == {"anyio-own-fixture": STOCK,
                               "anyio-own-param": TIDELOOP}, records


def test_project_loop_factories_hook_takes_precedence(tmp_path):
    conftest = """\
import asyncio

def pytest_asyncio_loop_factories(config, item):
    return {"selector": asyncio.SelectorEventLoop}
"""
    proj = _project(tmp_path, files={"conftest.py": conftest,
                                     "test_asyncio_tests.py": TEST_ASYNCIO})
    rc, out, records = _pytest(tmp_path, proj, "--loop=tideloop", expect=STOCK)
    assert rc == 0 and _counts(out) == {"passed": 3}, out
    assert set(_loops(records).values()) == {STOCK}, records


def test_project_with_a_loop_option_of_its_own(tmp_path):
    conftest = """\
def pytest_addoption(parser):
    parser.addoption("--loop", default="theirs")

def pytest_report_header(config):
    return "project: --loop=" + config.getoption("loop")
"""
    files = {"conftest.py": conftest, "test_asyncio_tests.py": TEST_ASYNCIO}
    proj = _project(tmp_path, files=files)
    rc, out, records = _pytest(tmp_path, proj, "--loop=xyz", expect=STOCK)
    assert rc == 0 and _counts(out) == {"passed": 3}, out
    assert "project: --loop=xyz" in out
    assert set(_loops(records).values()) == {STOCK}, records
    rc, out, records = _pytest(tmp_path, proj, "--loop=xyz", "--tideloop-loop=tideloop")
    assert rc == 0 and _counts(out) == {"passed": 3}, out
    assert set(_loops(records).values()) == {TIDELOOP}, records
    assert "use --tideloop-loop" in _header(out)[0], out


def test_bad_values_are_usage_errors(tmp_path):
    proj = _project(tmp_path, ini_extra="tideloop_loop = tideloops\n")
    rc, out, records = _pytest(tmp_path, proj)
    assert rc == 4 and "tideloop_loop = 'tideloops'" in out, out
    rc, out, records = _pytest(tmp_path, proj, "--loop=trio")
    assert rc == 4 and "invalid choice: 'trio'" in out, out
    assert records == []
