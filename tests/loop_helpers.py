"""Small helpers shared by the behavioural tests (import as loop_helpers)."""
import os
import re
import signal
import sysconfig
from pathlib import Path

SRC_DIR = Path(__file__).resolve().parents[1] / "src"

# What a time limit is multiplied by on a free-threaded build: its
# interpreter specialises no bytecode and starts slower, about twice the
# time of a GIL build for a test child (seen on the 3.13t leg under load).
# TIDELOOP_TEST_SLOW: a larger factor for a run under valgrind, whose
# process runs tens of times slower (tools/memcheck.sh sets it).
SLOW = max(2 if sysconfig.get_config_var("Py_GIL_DISABLED") else 1,
           int(os.environ.get("TIDELOOP_TEST_SLOW", "1")))


def stop_after(loop, seconds):
    """Safety net for run_forever tests: stop the loop after `seconds`."""
    return loop.call_later(seconds, loop.stop)


def norm(text):
    """Replace object addresses so reprs of two loops can be compared."""
    return re.sub(r"0?x[0-9a-fA-F]{4,}", "0xADDR", text)


def _tideloop_root():
    """Where the tideloop under test comes from: the in-place build in src/
    when there is one, else wherever the parent imports it (site-packages)."""
    import sysconfig

    # Only a build for this very interpreter counts: src/ may hold builds
    # for other versions, and without ours src/tideloop would shadow the
    # installed package with a _core that cannot load.
    if (SRC_DIR / "tideloop" / ("_core" + sysconfig.get_config_var("EXT_SUFFIX"))).exists():
        return SRC_DIR
    import importlib.util

    spec = importlib.util.find_spec("tideloop")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parents[1]
    return SRC_DIR


def sigint_default():
    """``preexec_fn`` for a child that must get SIGINT (a test's Ctrl-C,
    ``send_signal(SIGINT)``): SIGINT's default disposition in the child.

    A run with SIGINT ignored (any background job of a non-interactive shell,
    many CI runners) hands that on to every child, through exec: the child
    would ignore the signal its test sends, and a Python child would not even
    install its KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _in_main_interpreter():
    """Whether this code runs in the main interpreter (False in a
    subinterpreter).  Stock-side code must not ask tideloop
    (``tideloop._core.main_interpreter``), so this asks CPython: 3.13+'s
    ``_interpreters``, 3.12's ``_xxsubinterpreters`` (3.11 has it too)."""
    try:
        import _interpreters as interpreters
    except ImportError:
        try:
            import _xxsubinterpreters as interpreters
        except ImportError:     # a build without it: no subinterpreters either
            return True
    return interpreters.get_current() == interpreters.get_main()


IN_MAIN_INTERPRETER = _in_main_interpreter()


def _sigint_ignored_by_process():
    """Whether SIGINT's disposition in this process is "ignore" (read from
    /proc/self/status, which signal.getsignal() in a subinterpreter cannot
    tell)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def sigint_default_kwargs():
    """The subprocess keyword arguments that give a child SIGINT's default
    disposition: ``preexec_fn=sigint_default`` in the main interpreter.

    A subinterpreter refuses ``preexec_fn`` ("preexec_fn not supported within
    subinterpreters") and ``signal.signal``; there none is needed as long as
    this process handles SIGINT (Python's own handler, installed by the main
    interpreter at start-up), since exec gives a handled signal its default
    disposition.  Only a process that ignores SIGINT (started by a background
    job of a non-interactive shell) has no way to give its children the
    default from a subinterpreter: the test is skipped there
    (tests/interpreters/run_suite.py starts its children with the default)."""
    if IN_MAIN_INTERPRETER:
        return {"preexec_fn": sigint_default}
    if _sigint_ignored_by_process():
        import pytest

        pytest.skip("this process ignores SIGINT and a subinterpreter can give a child "
                    "neither preexec_fn nor signal.signal to restore the default")
    return {}


# The reason a test that imports hypothesis cannot run in an isolated
# subinterpreter (hypothesis's own native module does not declare that it can).
HYPOTHESIS_REASON = ("hypothesis: its native module hypothesis._native does not load "
                     "in an isolated subinterpreter")


def hypothesis_api():
    """``(HealthCheck, given, settings, st)``: hypothesis's own.

    In an isolated subinterpreter, where ``import hypothesis`` fails
    (HYPOTHESIS_REASON), stand-ins instead: the module's other tests still
    run, and each ``@given`` test is collected with the ``main_interpreter``
    mark (skipped there, with that reason).  In the main interpreter a
    missing hypothesis still fails the import."""
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
        return HealthCheck, given, settings, st
    except ImportError:
        if IN_MAIN_INTERPRETER:
            raise
    import functools
    import inspect

    import pytest

    class Anything:
        """st.lists(...).map(tuple), HealthCheck.too_slow, ...: any attribute,
        call or operator yields a stand-in again."""
        def __getattr__(self, name):
            return self

        def __call__(self, *args, **kwargs):
            return self

        def __or__(self, other):
            return self

    def given(*args, **kwargs):
        def decorate(fn):
            sig = inspect.signature(fn)
            keep = [p for name, p in sig.parameters.items() if name not in kwargs]

            @functools.wraps(fn)
            def skipped(*a, **kw):
                pytest.skip(HYPOTHESIS_REASON)
            skipped.__signature__ = sig.replace(parameters=keep)  # no fixture per strategy
            return pytest.mark.main_interpreter(HYPOTHESIS_REASON)(skipped)
        return decorate

    def settings(*args, **kwargs):
        return lambda fn: fn

    return Anything(), given, settings, Anything()


# The start of a child script (run_script, tests that talk to their child):
# new_loop() makes a loop of the kind named by the script's first argument.
CHILD_PREAMBLE = """\
import asyncio, sys
LOOP_NAME = sys.argv[1]
def new_loop():
    if LOOP_NAME == "asyncio":
        return asyncio.SelectorEventLoop()
    import tideloop
    return tideloop.new_event_loop()
"""


def child_env(extra=None):
    env = dict(os.environ)
    parts = [str(_tideloop_root())]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.pop("PYTHONASYNCIODEBUG", None)
    env.pop("PYTHONDEVMODE", None)
    if extra:
        env.update(extra)
    return env


def _args_in_repr():
    """Whether handle reprs and callback error messages show the call's
    arguments outside debug mode: up to 3.13.x; later 3.13 releases and 3.14
    show them only in debug mode (format_helpers._format_args_and_kwargs
    takes debug=)."""
    import asyncio.format_helpers as fh
    import inspect
    return "debug" not in inspect.signature(fh._format_args_and_kwargs).parameters


ARGS_IN_REPR = _args_in_repr()


def shown_args(text):
    """The argument list ``text`` (e.g. "(1, 'a')") as a repr made outside
    debug mode shows it on this interpreter."""
    return text if ARGS_IN_REPR else "()"
