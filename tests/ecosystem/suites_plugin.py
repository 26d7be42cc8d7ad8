"""pytest plugin loaded with ``-p suites_plugin`` into a framework's own test
suite by tests/ecosystem/suites.py: it makes the suite's event loop tideloop
when TIDELOOP_SUITES_LOOP=tideloop, and changes nothing else.

What it does on the tideloop side:

* configure time: ``tideloop.install()`` (tideloop's policy, set without
  3.14+'s deprecation warning, which some suites make an error), so every ``asyncio.new_event_loop()`` / ``asyncio.run()`` / ``asyncio.Runner()``
  of the suite, its fixtures and the library under test makes a tideloop loop
  (asyncpg's test base ``asyncpg._testbase.TestCase`` and aiohttp's
  ``test_utils.loop_context`` build their loops that way);
* the suites' loop fixtures, rewritten where they carry a factory of their own:
  anyio's ``anyio_backend`` (anyio's and uvicorn's conftest) gets
  ``loop_factory=tideloop.new_event_loop`` for the asyncio backend, aiohttp's
  pytest plugin ``loop_factory`` (``--aiohttp-loop=pyloop``, i.e.
  ``asyncio.new_event_loop``) becomes ``tideloop.new_event_loop``.  The
  fixtures stay the suites' own: only the value they hand to the tests changes;
* helpers of the suite's test package that name the stock loop class as the
  default loop (uvicorn's ``tests/utils.get_asyncio_default_loop_per_os``)
  answer tideloop's Loop, the default loop under tideloop's policy.

On both sides it counts the loops made (tideloop's and the stock
``asyncio.BaseEventLoop`` ones) and writes them as JSON to
TIDELOOP_SUITES_STATS at the end: the runner checks that the tideloop side
really ran on tideloop and the stock side never did.
"""
import asyncio
import json
import os

import pytest

MODE = os.environ.get("TIDELOOP_SUITES_LOOP", "stock")
if MODE not in ("stock", "tideloop"):
    raise ValueError(f"TIDELOOP_SUITES_LOOP must be stock or tideloop, not {MODE!r}")

_counts = {"tideloop": 0, "stock": 0}


def _count_instances(cls, key):
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        _counts[key] += 1
        original(self, *args, **kwargs)

    cls.__init__ = __init__


def _tideloop_factory():
    import tideloop
    return tideloop.new_event_loop()


def _anyio_backend(value):
    # "asyncio" or ("asyncio", {options}); trio and other backends unchanged.
    if value == "asyncio":
        return ("asyncio", {"loop_factory": _tideloop_factory})
    if (isinstance(value, tuple) and len(value) == 2 and value[0] == "asyncio"
            and isinstance(value[1], dict) and "loop_factory" not in value[1]):
        return ("asyncio", {**value[1], "loop_factory": _tideloop_factory})
    return value


def _aiohttp_loop_factory(value):
    return _tideloop_factory if value is asyncio.new_event_loop else value


# fixture name -> function from the suite's value to the tideloop one
REWRITES = {"anyio_backend": _anyio_backend, "loop_factory": _aiohttp_loop_factory}


def pytest_configure(config):
    _count_instances(asyncio.BaseEventLoop, "stock")
    if MODE == "tideloop":
        import tideloop     # an import error here fails the whole run, never skips
        _count_instances(tideloop.Loop, "tideloop")
        tideloop.install()


# Helpers of a suite's own test package that name the stock loop class as
# "the default loop" (uvicorn's tests/utils.py): on the tideloop side the
# default loop is tideloop's, so they answer that.  Patched where the test
# modules imported them, after collection; the tests themselves unchanged.
DEFAULT_LOOP_HELPERS = ("get_asyncio_default_loop_per_os",)


def pytest_collection_finish(session):
    if MODE != "tideloop":
        return
    import sys
    import tideloop
    for module in list(sys.modules.values()):
        for name in DEFAULT_LOOP_HELPERS:
            helper = getattr(module, name, None)
            if callable(helper) and getattr(helper, "__module__", "").startswith("tests"):
                setattr(module, name, lambda: tideloop.Loop)


def pytest_report_header(config):
    if MODE == "tideloop":
        import tideloop
        return f"tideloop suites plugin: loop=tideloop {tideloop.__version__}"
    return "tideloop suites plugin: loop=stock asyncio"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    outcome = yield
    rewrite = REWRITES.get(fixturedef.argname) if MODE == "tideloop" else None
    if rewrite is None or outcome.excinfo is not None:
        return
    value = outcome.get_result()
    new = rewrite(value)
    if new is not value:
        # pytest hands later requests the cached value: replace both
        cached = fixturedef.cached_result
        if cached is not None:
            fixturedef.cached_result = (new, *cached[1:])
        outcome.force_result(new)


def pytest_unconfigure(config):
    path = os.environ.get("TIDELOOP_SUITES_STATS")
    if path and not hasattr(config, "workerinput"):
        with open(path, "w") as f:
            json.dump({"mode": MODE, "loops": _counts}, f)
