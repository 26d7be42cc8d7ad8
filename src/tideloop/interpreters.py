"""One event loop per isolated interpreter, in one process: N interpreters,
each with its own GIL, serving one port.

    # app.py
    import asyncio, tideloop.interpreters

    async def handle(reader, writer):
        while line := await reader.readline():
            writer.write(line)
        writer.close()

    async def main(port):                   # runs once in each interpreter
        sock = tideloop.interpreters.reuse_port_socket("0.0.0.0", port)
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            await asyncio.Event().wait()    # until run() cancels it

    if __name__ == "__main__":
        tideloop.interpreters.run(main, 8000)   # N = the CPUs this process may use

``run(main, *args)`` creates N isolated interpreters (PEP 684: a GIL each, so
their Python code runs in parallel on a GIL build; CPython 3.13+), and in each
a thread that imports ``main`` there and runs ``main(*args, **kwargs)`` on a
new tideloop loop, while the calling thread waits.  Objects do not cross
interpreters, data does: ``main`` (and ``loop_factory``) travel as their
module and qualified name and are imported again in each interpreter (a
function of the main script: the script is run there under another
``__name__``, as multiprocessing's spawn does), the arguments are pickled once
and unpickled in each interpreter, and what each ``main()`` returns comes back
pickled.  Every module the program imports must load in an isolated
interpreter (the documentation lists common ones).

Stopping is ``tideloop.threads``': SIGINT or SIGTERM (they reach the main
interpreter only) cancels every interpreter's main task -- the request
crosses through a pipe that each loop reads -- and ``run()`` returns when all
have finished; a second signal, or ``shutdown_timeout``, stops the loops
themselves.  An exception out of one interpreter's ``main()`` stops the others
and comes out of ``run()``: the same exception when it can be pickled, with
the traceback text of the interpreter it came from as its ``__cause__``, else
:class:`InterpreterError` with that text; several make an ``ExceptionGroup``.
"""

import os
import pickle
import sys
import threading

from . import _compat
from .threads import _cpu_count, _supervise, _wake_pipe, reuse_port_socket

__all__ = ("run", "reuse_port_socket", "index", "InterpreterError", "available")

_WHAT = "interpreters"


class InterpreterError(RuntimeError):
    """An interpreter's main() failed with an exception that could not be
    brought to the main interpreter, or the interpreter could not run it;
    the message has its traceback text."""


class _RemoteTraceback(Exception):
    """The traceback text of an exception raised in another interpreter
    (the ``__cause__`` of the exception that run() raises)."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return self.text


# CPython 3.12 has isolated interpreters, but asyncio is not safe in them: on
# 3.12.1, importing ssl (which asyncio imports) in one corrupts the heap and
# the process aborts at exit ("free(): invalid pointer"), with the stock loop
# as with tideloop; a thread that ran one hangs when it is destroyed.
_PY312_DEFECT = (
    "tideloop.interpreters needs CPython 3.13 or later: on 3.12, asyncio "
    "(through its ssl module) is not safe in isolated interpreters -- the "
    "process aborts at exit with a corrupted heap, on asyncio's own loop as on "
    "tideloop's; use tideloop.threads or worker processes (tideloop.workers)")


def index():
    """Which of run()'s interpreters this is (0 to N-1; a number for logs,
    or for a part of the work), or None outside them."""
    from . import _interp_child
    return _interp_child.INDEX


def available():
    """Whether run() can run here: CPython 3.13+ (3.12 has isolated
    interpreters, but asyncio is not safe in them)."""
    return _compat.SUBINTERPRETERS is not None and _compat.PY >= (3, 13)


def _reference(obj, what):
    """A "module:qualname" name of obj that another interpreter can import
    (a string is taken as one)."""
    if isinstance(obj, str):
        module, sep, qualname = obj.partition(":")
        if not (module and sep and qualname):
            raise ValueError(f"{what} must be 'module:name', not {obj!r}")
        return obj
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not callable(obj) or not module or not qualname or "<" in qualname:
        raise TypeError(f"{what} must be a module-level function (or 'module:name'), "
                        f"not {obj!r}: each interpreter imports it again")
    return f"{module}:{qualname}"


def _main_path():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if path else None


class _Interpreter:
    """One isolated interpreter, the thread that runs the program in it,
    its control pipe and its outcome file."""

    def __init__(self, index, api, script_args, wake, workdir):
        self.index = index
        self.name = f"interpreter-{index}"
        self.api = api
        self.wake = wake
        self.lock = threading.Lock()
        self.done = self.abandoned = False
        self.result = self.error = None
        self.outcome_path = os.path.join(workdir, f"{index}.outcome")
        # The read end is the loop's (a reader in that interpreter); the
        # write end ours.  Non-blocking: a request never blocks run().
        self.control_r, self.control_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.script = _SCRIPT.format(index=index, control=self.control_r,
                                     outcome=self.outcome_path, **script_args)
        self.interp = api.create()
        self.thread = threading.Thread(target=self._body, name=f"tideloop-{self.name}",
                                       daemon=_compat.DAEMON_THREADS)

    def start(self):
        self.thread.start()

    def join(self):
        self.thread.join()

    def _body(self):
        try:
            failure = self.api.run(self.interp, self.script)
            self.error = self._outcome(failure)
        except BaseException as exc:    # noqa: BLE001 - reported by run()
            self.error = exc
        finally:
            with self.lock:
                self.done = True
                if not self.abandoned:
                    os.write(self.wake, b"\0")

    def _outcome(self, failure):
        """The error to raise for this interpreter, or None (result set)."""
        if failure is not None:         # the script itself failed to run
            return InterpreterError(f"{self.name} could not run main():\n{failure}")
        try:
            with open(self.outcome_path, "rb") as f:
                kind, value = pickle.loads(f.read())
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            return InterpreterError(f"{self.name} left no outcome: {exc}")
        if kind == "ok":
            try:
                self.result = pickle.loads(value)
            except Exception as exc:    # noqa: BLE001
                return InterpreterError(f"{self.name}'s result cannot be unpickled "
                                        f"here: {exc!r}")
            return None
        type_name, message, text, pickled = value
        exc = None
        if pickled is not None:
            try:
                exc = pickle.loads(pickled)
            except Exception:           # noqa: BLE001 - the text still says it
                exc = None
        if not isinstance(exc, BaseException):
            exc = InterpreterError(f"{self.name}: {type_name}: {message}\n\n{text}")
        exc.__cause__ = _RemoteTraceback(f"\n(in {self.name})\n{text}")
        return exc

    def _send(self, what):
        try:
            os.write(self.control_w, what)
        except OSError:             # full or gone: the interpreter is ending
            pass

    def request_stop(self):
        self._send(b"c")

    def force(self):
        self._send(b"s")

    def close(self):
        """After the thread ended: the interpreter and the pipe go."""
        try:
            self.api.destroy(self.interp)
        finally:
            os.close(self.control_r)
            os.close(self.control_w)


# What each interpreter runs: literals only (repr of str, int, bytes, list).
_SCRIPT = """\
import sys
sys.path[:] = {path!r}
from tideloop import _interp_child
_interp_child.serve({index!r}, {control!r}, {outcome!r}, {main!r}, {loop!r},
                    {payload!r}, {path!r}, {argv!r}, {main_path!r})
"""


def run(main, *args, interpreters=None, loop_factory="tideloop:new_event_loop",
        shutdown_timeout=30.0, **kwargs):
    """Run ``main(*args, **kwargs)`` in ``interpreters`` new isolated
    interpreters, each in a thread of its own on a new event loop.

    main: an async function defined at module level (or "module:name"),
    imported again in each interpreter.  args and kwargs: pickled once,
    unpickled in each.  interpreters: how many (default: the CPUs this
    process may use).  loop_factory: "module:name" of the loop factory
    each interpreter calls ("asyncio:new_event_loop" runs the same program
    on asyncio's loop).  The calling thread waits; in the main thread of
    the main interpreter run() handles SIGINT and SIGTERM until it returns.

    Returns the list of what each main() returned, in interpreter order
    (None where main() ended by the stop).  Raises what a main() raised (an
    ExceptionGroup if several did), InterpreterError when it cannot be
    brought here, TimeoutError when interpreters were still running after
    their loops were stopped by force.  NotImplementedError before Python
    3.13 (3.11's interpreters share one GIL; on 3.12 asyncio is not safe in
    isolated ones)."""
    api = _compat.SUBINTERPRETERS
    if api is None:
        raise NotImplementedError(
            "tideloop.interpreters needs isolated interpreters with a GIL each "
            f"(PEP 684, CPython 3.12+); this is Python {sys.version.split()[0]}: "
            "use tideloop.threads or worker processes (tideloop.workers)")
    if _compat.PY < (3, 13):
        raise NotImplementedError(_PY312_DEFECT)
    main_ref = _reference(main, "main")
    loop_ref = _reference(loop_factory, "loop_factory")
    if interpreters is None:
        interpreters = _cpu_count()
    if isinstance(interpreters, bool) or not isinstance(interpreters, int) or interpreters < 1:
        raise ValueError(f"interpreters must be a positive int, not {interpreters!r}")
    if shutdown_timeout is not None and shutdown_timeout < 0:
        raise ValueError("shutdown_timeout must be >= 0 or None")
    payload = pickle.dumps((args, kwargs))
    script_args = dict(main=main_ref, loop=loop_ref, payload=payload,
                       path=list(sys.path), argv=list(sys.argv), main_path=_main_path())
    wake_r, wake_w = _wake_pipe()
    workers = []
    import tempfile     # here: interpreters that import this module for
    # reuse_port_socket() need not load it (shutil, bz2, lzma: memory each)
    with tempfile.TemporaryDirectory(prefix="tideloop-interpreters-") as workdir:
        try:
            for i in range(interpreters):
                workers.append(_Interpreter(i, api, script_args, wake_w, workdir))
        except BaseException:
            for w in workers:
                w.close()
            os.close(wake_r)
            os.close(wake_w)
            raise
        try:
            return _supervise(workers, wake_r, wake_w, shutdown_timeout, _WHAT)
        finally:
            for w in workers:
                # An interpreter still running (TimeoutError) cannot be
                # destroyed: it is left to the end of the process.
                if w.done:
                    w.close()
