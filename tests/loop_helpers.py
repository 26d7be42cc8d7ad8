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
SLOW = 2 if sysconfig.get_config_var("Py_GIL_DISABLED") else 1


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
