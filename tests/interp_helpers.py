"""Running test code inside an isolated subinterpreter (import as
interp_helpers): a fresh child process creates one interpreter with its own
GIL and runs the snippet there, so a crash is contained and reported by the
child's exit status (tests/conftest.py fails a test whose child crashed).

``new_loop()``, ``LOOP_NAME`` and ``CA``/``SERVER_CERT`` (the test
certificates) are predefined in the snippet; it reports by printing.  Stock
asyncio is the spec: each test runs the same snippet for both loops.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loop_helpers import SLOW, _tideloop_root, child_env

TESTS = Path(__file__).resolve().parent
PY = sys.version_info[:2]


def _has_subinterpreters():
    try:
        import _interpreters  # noqa: F401  (3.13+)
    except ImportError:
        return False
    return True


# 3.12 has isolated interpreters, but on 3.12.1 importing asyncio (its ssl
# module) in one corrupts the heap and the process aborts at exit, on the
# stock loop as on tideloop: nothing to compare there.
needs_subinterpreters = pytest.mark.skipif(
    not _has_subinterpreters(),
    reason="isolated subinterpreters where asyncio runs: CPython 3.13+ "
           "(3.12's abort at exit once asyncio is imported in one)")

# The child: one isolated interpreter, the snippet run in it, its failure
# printed as the interpreter's traceback (exit status 3).
_CHILD = """\
import sys
code = sys.argv[1]
try:
    from concurrent import interpreters as ci
except ImportError:
    import _interpreters
    interp = _interpreters.create("isolated")
    info = _interpreters.exec(interp, code)
    failure = None if info is None else info.errdisplay
    _interpreters.destroy(interp)
else:
    interp = ci.create()
    try:
        interp.exec(code)
        failure = None
    except ci.ExecutionFailed as exc:
        failure = exc.excinfo.errdisplay
    interp.close()
if failure:
    print("FAILED IN SUBINTERPRETER:", failure, file=sys.stderr)
    sys.exit(3)
"""

_PREAMBLE = """\
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import asyncio
LOOP_NAME = {loop_name!r}
CA = {ca!r}
SERVER_CERT = {cert!r}
def new_loop():
    if LOOP_NAME == "asyncio":
        return asyncio.SelectorEventLoop()
    import tideloop
    return tideloop.new_event_loop()
def run(coro):
    loop = new_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
"""


def run_in_subinterpreter(code, loop_name, *, timeout=60, env=None):
    """Run code in an isolated subinterpreter of a new process; returns the
    CompletedProcess (stdout: what the snippet printed)."""
    src = _PREAMBLE.format(root=str(_tideloop_root()), tests=str(TESTS), loop_name=loop_name,
                           ca=str(TESTS / "certs" / "ca.pem"),
                           cert=str(TESTS / "certs" / "server-ecdsa.pem"))
    src += textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", _CHILD, src], capture_output=True,
                          text=True, timeout=timeout * SLOW, env=child_env(env))


def check(proc):
    """The snippet's output lines, once the child has exited cleanly."""
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    return proc.stdout.splitlines()
