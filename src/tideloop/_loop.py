"""The tideloop Loop class: the C core's loop, with asyncio's once-per-run
orchestration placed on it from the modules named for each group.

Once-per-call orchestration that asyncio implements only in terms of the
loop's API (getaddrinfo, sock_connect, _make_socket_transport,
_start_serving, ...) is the running interpreter's own code, placed on the
tideloop class: messages, log text and edge cases are the stock loop's of
that version, while everything per event or per byte runs in C.
(_compat.borrow records each and stands in for any a version lacks.)

The groups: _network (resolution, connections, servers, sockets, TLS,
datagrams), _subprocesses (pipes, subprocesses), _children (watching the
subprocesses' exits), _signals, _executors (executors, async generators).
Users name the class ``tideloop.Loop``; this module is where the package and
its other modules (workers, threads) take it from.
"""

import asyncio
import collections.abc
import os
import selectors
import warnings
import weakref
from asyncio.log import logger as _logger

from . import _compat
from . import _core
from ._diag_state import register_loop
from ._children import ChildWatching
from ._executors import Executors
from ._network import Network
from ._signals import Signals
from ._subprocesses import Subprocesses

_borrow = _compat.borrow


class _SelectorView(collections.abc.Mapping):
    """A read-only view of the loop's fd table shaped like the selector of
    asyncio's selector loop (``loop._selector``: ``get_key``, ``get_map``),
    for code that inspects which fds have a reader or writer."""

    def __init__(self, loop):
        self._loop = loop

    def get_key(self, fileobj):
        info = self._loop._fd_handles(fileobj)
        if info is None:
            raise KeyError(f"{fileobj!r} is not registered")
        fd, reader, writer = info
        events = ((selectors.EVENT_READ if reader is not None else 0) |
                  (selectors.EVENT_WRITE if writer is not None else 0))
        return selectors.SelectorKey(fileobj, fd, events, (reader, writer))

    def get_map(self):
        return self

    def __getitem__(self, fd):
        return self.get_key(fd)

    def __iter__(self):
        return iter(self._loop._watched_fds())

    def __len__(self):
        return len(self._loop._watched_fds())


_STATS_COUNTERS = ("iterations", "polls", "callbacks", "io_events", "timers_fired",
                   "slow_callbacks")


class Loop(_core.Loop, asyncio.AbstractEventLoop):
    """The tideloop event loop: asyncio's behaviour, in C."""

    __module__ = "tideloop"     # where users find it

    _exception_handler = None
    _coroutine_origin_tracking_enabled = False
    _coroutine_origin_tracking_saved_depth = None
    _diag_on_close = None   # tideloop.diagnostics' report at close (leaks)

    def __init__(self):
        register_loop(self)     # listed by tideloop.diagnostics.loops()
        self._asyncgens = weakref.WeakSet()
        self._set_debug_flag(_compat.is_debug_mode())
        self._init_children()
        self._init_network()
        if os.environ.get("TIDELOOP_DIAGNOSTICS"):
            from . import diagnostics
            try:
                diagnostics._from_environment(self, os.environ["TIDELOOP_DIAGNOSTICS"])
            except BaseException:
                self.close()
                raise

    def __repr__(self):
        return (f"<{self.__class__.__name__} running={self.is_running()} "
                f"closed={self.is_closed()} debug={self.get_debug()}>")

    def __del__(self, _warn=warnings.warn):
        if not self.is_closed():
            _warn(f"unclosed event loop {self!r}", ResourceWarning, source=self)
            if not self.is_running():
                self.close()

    # -- lifecycle --------------------------------------------------------

    @property
    def _selector(self):
        return None if self.is_closed() else _SelectorView(self)

    _check_running = _borrow("_check_running")

    # (run_forever, in C, puts a bound call_soon in the instance's __dict__
    # while the loop runs: loop.c bind_call_soon.)
    run_until_complete = _borrow("run_until_complete")

    _set_coroutine_origin_tracking = _borrow("_set_coroutine_origin_tracking")

    def set_debug(self, enabled):
        self._set_debug_flag(enabled)
        if self.is_running():
            self.call_soon_threadsafe(self._set_coroutine_origin_tracking,
                                      enabled)

    def close(self):
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self.is_closed():
            return
        if self.get_debug():
            _logger.debug("Close %r", self)
        if self._diag_on_close is not None:
            self._diag_on_close(self)
        # Signal handlers go first: the interpreter must stop writing signal
        # numbers into our pipe before the pipe is closed.
        self._remove_signal_handlers()
        self._release_children()
        self._close_listeners()
        super().close()
        self._signal_pipe_close()
        self._drop_default_executor()

    # -- errors ------------------------------------------------------------

    get_exception_handler = _borrow("get_exception_handler")
    set_exception_handler = _borrow("set_exception_handler")
    default_exception_handler = _borrow("default_exception_handler")
    call_exception_handler = _borrow("call_exception_handler")

    # -- diagnostics -------------------------------------------------------

    def diagnostics(self):
        """The loop's health as plain data (safe from any thread): counters
        of what it has done, where its time went, the current ready, timer
        and fd counts, and histograms of iteration time, poll time,
        scheduling lag, timer lateness and (while callback timing is on)
        callback time.  See :mod:`tideloop.diagnostics`."""
        return self._diagnostics()

    def stats(self):
        """Counters of what the loop has done: iterations, callbacks run,
        I/O events, timers fired, slow callbacks, seconds spent polling, and
        the current ready/timer/fd counts (a subset of :meth:`diagnostics`)."""
        d = self._diagnostics()
        s = {k: d[k] for k in _STATS_COUNTERS}
        s["poll_time"] = d["time_polling"]
        for k in ("ready", "timers", "fds", "backend"):
            s[k] = d[k]
        return s


# The groups' methods are bound on the class itself rather than inherited
# from the groups as bases: the class's lookups stay those of a two-base
# class (a lookup that misses the type cache walks every class of the MRO:
# with the five groups as bases, echo-sockets cost 4.5 % more instructions
# on 3.12).
for _group in (Network, Subprocesses, ChildWatching, Signals, Executors):
    for _name, _value in vars(_group).items():
        if not (_name.startswith("__") and _name.endswith("__")):
            assert _name not in vars(Loop), _name
            setattr(Loop, _name, _value)
del _group, _name, _value


def new_event_loop():
    """Return a new tideloop event loop."""
    return Loop()
