"""tideloop: a drop-in asyncio event loop for CPython, written in C, for Linux.

    import tideloop
    tideloop.run(main())                                   # like asyncio.run
    asyncio.Runner(loop_factory=tideloop.new_event_loop)   # 3.11
    tideloop.install()                                     # policy for asyncio.run (3.11-3.15)

The per-event work (ready queue, timers, poller, handles, readers/writers,
signal dispatch, call_soon_threadsafe wakeups, tasks and futures creation)
lives in the C extension ``tideloop._core``.  This module is the thin public
layer: the names users import.  The Loop class is made in ``_loop`` from the
modules named for its groups of methods (``_network``, ``_subprocesses``,
``_children``, ``_signals``, ``_executors``); none of them imports this one.
"""

from . import _build_check  # noqa: F401  (first: an unbuilt checkout says so)

import asyncio
import os
import sys

from . import _compat
from . import _core
from . import _tls  # sets up the TLS engine and its routes at import
from . import _streams  # sets up asyncio streams' C data path at import
from ._version import __version__
from ._loop import Loop, new_event_loop

__all__ = ("Loop", "new_event_loop", "run", "EventLoopPolicy", "install",
           "Handle", "TimerHandle", "__version__")

Handle = _core.Handle
TimerHandle = _core.TimerHandle

os.register_at_fork(after_in_child=_core._after_fork_child)


_NO_POLICIES = (
    "{what} needs asyncio's event loop policies, which Python {version} "
    "does not have; choose the loop where the program runs instead: "
    "tideloop.run(main()), asyncio.run(main(), loop_factory=tideloop.new_event_loop) "
    "or asyncio.Runner(loop_factory=tideloop.new_event_loop) "
    "('python -m tideloop run app.py' runs a whole program on tideloop)")


def _no_policies(what):
    return RuntimeError(_NO_POLICIES.format(what=what, version=sys.version.split()[0]))


_POLICY_DOC = """An asyncio policy whose new_event_loop() returns tideloop loops.

    The policy API is deprecated from Python 3.14: prefer
    ``asyncio.run(main(), loop_factory=tideloop.new_event_loop)`` or
    ``tideloop.run(main())``.  Where asyncio has no policies any more
    (CPython 3.16) the name stays, so that code naming it still imports,
    but making one raises RuntimeError saying what to use instead."""

if _compat.DefaultPolicyBase is not None:
    class EventLoopPolicy(_compat.DefaultPolicyBase):
        __doc__ = _POLICY_DOC
        _loop_factory = Loop

        def __repr__(self):
            return f"<{self.__class__.__name__}>"
else:
    class EventLoopPolicy:
        __doc__ = _POLICY_DOC

        def __new__(cls, *args, **kwargs):
            raise _no_policies("tideloop.EventLoopPolicy")


def install():
    """Make tideloop the loop that asyncio.new_event_loop()/asyncio.run() use,
    by setting tideloop's policy (tideloop.EventLoopPolicy).

    Where asyncio has no policies (CPython 3.16), nothing can make
    asyncio.run() choose tideloop short of replacing asyncio's own functions,
    which the library does not do to a process: install() raises RuntimeError
    and changes nothing.  Use ``tideloop.run(main())`` or
    ``asyncio.run(main(), loop_factory=tideloop.new_event_loop)`` there, or
    ``python -m tideloop run app.py`` for a whole program."""
    if not _compat.POLICY_API:
        raise _no_policies("tideloop.install()")
    _compat.set_event_loop_policy(EventLoopPolicy())


def run(main, *, debug=None):
    """Run a coroutine on a new tideloop loop: the contract of asyncio.run()."""
    if asyncio.events._get_running_loop() is not None:
        raise RuntimeError(
            "asyncio.run() cannot be called from a running event loop")
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)
