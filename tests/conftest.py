"""Shared fixtures: every behavioural test runs on stock asyncio AND on tideloop.

The ``loop_name`` fixture is parametrised over ``["asyncio", "tideloop"]``; the
asyncio param is the spec (the stock selector loop), the tideloop param must
agree with it.  ``import tideloop`` is a plain import inside the fixture, so a
missing or broken build makes every tideloop-param test fail, never skip.
"""
import asyncio
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

try:
    import faulthandler
except ImportError:     # an isolated subinterpreter: faulthandler is per process
    faulthandler = None

from loop_helpers import (
    CHILD_PREAMBLE, IN_MAIN_INTERPRETER, SLOW, child_env, sigint_default_kwargs,
)

LOOP_NAMES = ["asyncio", "tideloop"]
SRC_DIR = Path(__file__).resolve().parents[1] / "src"

# A hung loop must not hang the suite: SIGALRM raises in the main thread
# (a loop that checks signals while polling surfaces it as an exception);
# faulthandler is the last resort and kills the process with tracebacks.
TEST_TIMEOUT = 30 * SLOW
HARD_TIMEOUT = 90 * SLOW


class WatchdogTimeout(BaseException):
    """Raised by the per-test SIGALRM watchdog."""


@pytest.fixture(autouse=True)
def _watchdog(request):
    # signal.signal() works in the main thread of the main interpreter only
    # (ValueError elsewhere).  In a subinterpreter (tests/interpreters/) the
    # runner's per-test timeout is the watchdog.  @pytest.mark.watchdog(s):
    # a longer limit, for a test that runs several child processes in turn.
    marker = request.node.get_closest_marker("watchdog")
    limit = marker.args[0] * SLOW if marker else TEST_TIMEOUT

    def on_alarm(signum, frame):
        raise WatchdogTimeout(f"test exceeded {limit} s")
    in_main = IN_MAIN_INTERPRETER and threading.current_thread() is threading.main_thread()
    if in_main:
        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
    if faulthandler is not None:
        faulthandler.dump_traceback_later(max(HARD_TIMEOUT, 3 * limit), exit=True)
    try:
        yield
    finally:
        if faulthandler is not None:
            faulthandler.cancel_dump_traceback_later()
        if in_main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


# Child interpreters must exit cleanly too: a crash at exit (a use-after-free
# in module teardown under PYTHONMALLOC=debug, an abort from a fatal error)
# fails the test that started the child, even when the test itself only
# looked at the child's output.  Children that a test kills on purpose die
# of SIGKILL/SIGTERM/SIGINT, which are not crash signals.
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL,
                  signal.SIGFPE}
_children = []
_popen_init = subprocess.Popen.__init__


def _tracking_init(self, args, *a, **kw):
    _popen_init(self, args, *a, **kw)
    argv0 = args[0] if isinstance(args, (list, tuple)) and args else args
    if isinstance(argv0, (str, os.PathLike)) and os.fspath(argv0) == sys.executable:
        _children.append(self)


subprocess.Popen.__init__ = _tracking_init


def _crashed(rc):
    return rc is not None and (-rc in _CRASH_SIGNALS or rc - 128 in _CRASH_SIGNALS)


@pytest.fixture(autouse=True)
def _child_interpreters_exit_cleanly():
    del _children[:]
    yield
    finished = [p for p in _children if p.poll() is not None]
    del _children[:]
    crashed = [(p.args, p.returncode) for p in finished if _crashed(p.returncode)]
    assert not crashed, f"child interpreter(s) crashed: {crashed}"


def pytest_addoption(parser):
    parser.addoption(
        "--loops", default=",".join(LOOP_NAMES), metavar="NAMES",
        help="run the loop-parametrised tests on these loops only (comma-separated, "
             "default: %(default)s); tests without the parameter always run.  "
             "CI's sanitizer run, which is there for tideloop's C code: "
             "--loops tideloop")


# Tests of the repository's own tooling (the docs and their tables, the
# benchmark harness's output, the CI scripts' parsers): marked `checkout`.
# Nothing in them depends on the interpreter's version, so the README's test
# command runs them and the version matrix and the sanitizer run, which are
# there for tideloop's code on each interpreter, leave them out
# (-m "not checkout").
CHECKOUT_TESTS = {
    "test_bench_apps.py", "test_bench_cli.py", "test_bench_interpreters.py",
    "test_bench_output.py", "test_bench_threads.py", "test_conformance_cleanup.py",
    "test_docs.py", "test_docs_tables.py", "test_instructions.py", "test_layering.py",
    "test_matrix_record.py", "test_plot.py", "test_suites_runner.py",
    "test_test_command.py", "test_tsan_verdict.py", "test_unbuilt_checkout.py",
}


def pytest_collection_modifyitems(config, items):
    _skip_main_interpreter_only(items)
    for item in items:
        path = item.path
        if path.parent.name == "tooling" and path.name in CHECKOUT_TESTS:
            item.add_marker(pytest.mark.checkout)
    loops = {x.strip() for x in config.getoption("loops").split(",") if x.strip()}
    unknown = loops - set(LOOP_NAMES)
    if unknown or not loops:
        raise pytest.UsageError(f"--loops: expected some of {LOOP_NAMES}, got {sorted(unknown)}")
    if loops == set(LOOP_NAMES):
        return
    keep, drop = [], []
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        # (one test in fuzz/ names its loop parameter "name")
        side = next((v for k, v in params.items()
                     if k in ("loop_name", "name") and v in LOOP_NAMES), None)
        (drop if side is not None and side not in loops else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _skip_main_interpreter_only(items):
    """In a subinterpreter, skip the tests marked ``main_interpreter(reason)``:
    they need what only the main interpreter has (signal handlers, fork,
    faulthandler, preexec_fn), on either loop.  In the main interpreter the
    mark changes nothing."""
    if IN_MAIN_INTERPRETER:
        return
    for item in items:
        mark = item.get_closest_marker("main_interpreter")
        if mark is not None:
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: main_interpreter(reason) needs a reason")
            item.add_marker(pytest.mark.skip(reason=f"main interpreter only: {reason}"))


def pytest_collection_finish(session):
    """Freeze what exists once the tests are collected (pytest, hypothesis, the
    test modules: it all lives to the end of the session) out of the
    collector's reach.  The ``loop`` fixture calls gc.collect() after every
    test, and each call walked all of it: half the suite's time on 3.11, more
    under ASan and valgrind.  Objects the tests make are collected as before."""
    gc.collect()
    gc.freeze()


@pytest.fixture(params=LOOP_NAMES, ids=LOOP_NAMES)
def loop_name(request):
    return request.param


def make_loop_factory(loop_name):
    """Zero-arg factory for a fresh, untracked loop of the given kind."""
    if loop_name == "asyncio":
        # The stock selector loop, whatever the current policy says.
        return asyncio.SelectorEventLoop
    import tideloop  # plain import: a missing build must FAIL, not skip

    return tideloop.new_event_loop


@pytest.fixture
def raw_loop_factory(loop_name):
    """Factory whose loops are NOT tracked (for tests about unclosed loops)."""
    return make_loop_factory(loop_name)


@pytest.fixture
def new_loop(raw_loop_factory):
    """Zero-arg factory; loops it makes are closed at teardown if still open."""
    created = []

    def factory():
        lp = raw_loop_factory()
        created.append(lp)
        return lp

    yield factory
    for lp in created:
        try:
            if not lp.is_running() and not lp.is_closed():
                lp.close()
        except Exception:
            pass
    created.clear()
    asyncio.set_event_loop(None)


@pytest.fixture
def loop(new_loop):
    """A fresh loop with debug OFF (whatever -X dev / PYTHONASYNCIODEBUG say);
    debug tests turn it on explicitly.  Closed at teardown."""
    lp = new_loop()
    lp.set_debug(False)
    yield lp
    if not lp.is_running():
        lp.close()
    asyncio.set_event_loop(None)
    gc.collect()


@pytest.fixture
def run(loop):
    """run(coro_or_future) -> loop.run_until_complete(...) on the test's loop."""

    def _run(aw):
        return loop.run_until_complete(aw)

    return _run




@pytest.fixture
def run_script(loop_name):
    """Run a snippet in a fresh interpreter; ``new_loop()`` and ``LOOP_NAME``
    are predefined for the current param.  Returns CompletedProcess.
    The child starts with SIGINT's default disposition (so KeyboardInterrupt
    as usual), even when this run ignores SIGINT."""

    def _run(code, *, timeout=30, env=None, pyflags=()):
        src = CHILD_PREAMBLE + textwrap.dedent(code)
        return subprocess.run(
            [sys.executable, *pyflags, "-c", src, loop_name],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(env),
            **sigint_default_kwargs(),
        )

    return _run
