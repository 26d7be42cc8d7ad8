"""The part of ``tideloop.interpreters.run()`` that runs inside each isolated
interpreter: its main coroutine on a loop of its own, stopped through a
control pipe, and the outcome written to a file for the main interpreter.

Objects never cross interpreters; what crosses is data: the main function and
the loop factory as "module:qualname" names, the arguments as pickled bytes,
file descriptors (process-wide) as ints, and the outcome as pickled bytes in
a file.
"""

import asyncio
import importlib
import os
import pickle
import runpy
import sys
import traceback

INDEX = None        # tideloop.interpreters.index(): set by serve()

# Bytes of the control pipe (main interpreter -> this one).
STOP = b"c"         # cancel the main task (a graceful stop)
FORCE = b"s"        # stop the loop (its runner cancels what is left)


def resolve(ref, main_path=None):
    """The object a "module:qualname" reference names.  "__main__" is the
    main interpreter's script, run here under another name (as
    multiprocessing's spawn does): its ``if __name__ == "__main__"`` block
    does not run again."""
    module_name, _, qualname = ref.partition(":")
    if module_name == "__main__":
        if main_path is None:
            raise ImportError(f"{ref!r}: the main interpreter's __main__ has no file "
                              "to run here; define the function in a module")
        namespace = runpy.run_path(main_path, run_name="__tideloop_main__")
        obj = namespace[qualname.split(".")[0]]
        rest = qualname.split(".")[1:]
    else:
        obj = importlib.import_module(module_name)
        rest = qualname.split(".")
    for part in rest:
        obj = getattr(obj, part)
    return obj


class _Control:
    """What the main interpreter asked for, read from the control pipe by
    the loop (a reader on the pipe's fd: works on any asyncio loop)."""

    def __init__(self, fd):
        self.fd = fd
        self.stop_requested = self.forced = False
        self.loop = self.task = None

    def attach(self, loop, task):
        self.loop, self.task = loop, task
        loop.add_reader(self.fd, self._readable)

    def detach(self):
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
        self.loop = self.task = None

    def _readable(self):
        try:
            data = os.read(self.fd, 64)
        except BlockingIOError:
            return
        if not data:                    # the main interpreter went away
            data = STOP
            self.loop.remove_reader(self.fd)
        if FORCE in data:
            self.stop_requested = self.forced = True
            self.loop.stop()
        elif STOP in data and not self.stop_requested:
            self.stop_requested = True
            self.task.cancel()


async def _main_task(control, main, args, kwargs):
    control.attach(asyncio.get_running_loop(), asyncio.current_task())
    try:
        return await main(*args, **kwargs)
    finally:
        control.detach()


def _run(control, main, args, kwargs, loop_factory):
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_main_task(control, main, args, kwargs))
    except asyncio.CancelledError:
        if control.stop_requested:
            return None
        raise
    except RuntimeError:
        # loop.stop() by force makes runner.run() raise "Event loop stopped
        # before Future completed.": the forced stop, not the main's error.
        if control.forced:
            return None
        raise


def _failure(exc):
    """(type name, str, traceback text, the exception pickled or None)."""
    text = "".join(traceback.format_exception(exc))
    try:
        pickled = pickle.dumps(exc)
        pickle.loads(pickled)           # some exceptions pickle but do not load
    except Exception:                   # noqa: BLE001 - the text says it all
        pickled = None
    return (type(exc).__qualname__, str(exc), text, pickled)


def serve(index, control_fd, outcome_path, main_ref, loop_ref, payload, path,
          argv, main_path):
    """Run main(*args, **kwargs) on a loop of loop_ref's and write the
    outcome to outcome_path: ("ok", pickled result) or ("error", failure)."""
    global INDEX
    INDEX = index
    sys.path[:] = path
    sys.argv[:] = argv
    try:
        try:
            main = resolve(main_ref, main_path)
            loop_factory = resolve(loop_ref)
            args, kwargs = pickle.loads(payload)
            result = _run(_Control(control_fd), main, args, kwargs, loop_factory)
            try:
                outcome = ("ok", pickle.dumps(result))
            except Exception as exc:    # noqa: BLE001
                raise TypeError(f"interpreter {index}'s main returned an object "
                                f"that cannot be pickled: {exc}") from exc
        except BaseException as exc:    # noqa: BLE001 - reported to the main interpreter
            outcome = ("error", _failure(exc))
        data = pickle.dumps(outcome)
    except BaseException as exc:        # noqa: BLE001 - pickling the outcome failed
        data = pickle.dumps(("error", ("RuntimeError", str(exc), repr(exc), None)))
    with open(outcome_path, "wb") as f:
        f.write(data)
