"""The C data path of asyncio streams: what the core relies on, proven once.

tideloop's core (``_core/streams.c``) feeds asyncio's ``StreamReader`` and
runs its awaited reads, and the protocol's ``_drain_helper()`` that
``StreamWriter.drain()`` awaits, in C -- for the exact classes of this
interpreter's ``asyncio.streams``,
with their methods as asyncio defines them.  This module hands the core
those classes and functions, taken from ``asyncio.streams`` itself (a
function that is not asyncio's own, e.g. patched before tideloop was
imported, turns the path off), and asyncio's function for each method the
core replaces: the core runs it whenever a call is out of the ordinary.

``TIDELOOP_STREAMS=0`` (or ``off``) in the environment turns the path off
for the process (so does ``TIDELOOP_PORTABLE=1``: the path reads asyncio's
private attributes); ``tideloop._core.set_streams_fast_path(False)`` for
new connections from then on.
"""

import asyncio.coroutines
import asyncio.exceptions
import asyncio.streams as _streams
import inspect
import os

from . import _core

# The methods whose behaviour the core reproduces or relies on, per class.
# If any of them is replaced on the class (or a base), the core notices
# (the class's version tag changes) and leaves that class's objects to
# asyncio's own code.
_READER = ("read", "readline", "readexactly", "readuntil", "feed_data",
           "_wakeup_waiter", "_wait_for_data", "_maybe_resume_transport",
           "exception", "__init__")
_PROTOCOL = ("data_received", "_stream_reader", "_drain_helper", "connection_lost",
             "pause_writing", "resume_writing")
# The core's method kinds, in its order (streams.c K_*).
_KINDS = ((_streams.StreamReader, "read"), (_streams.StreamReader, "readline"),
          (_streams.StreamReader, "readexactly"), (_streams.StreamReader, "readuntil"),
          (_streams.StreamReaderProtocol, "_drain_helper"))


def _own(cls, name):
    """asyncio's function for cls.name (looked up through the MRO, as the
    core's check does), or None when it is not asyncio.streams' own."""
    fn = getattr(cls, name, None)
    code = getattr(getattr(fn, "fget", fn), "__code__", None)
    if code is None or os.path.normcase(code.co_filename) != os.path.normcase(_streams.__file__):
        return None
    return fn


def _check(cls, names):
    pairs = tuple((name, _own(cls, name)) for name in names)
    return pairs if all(fn is not None for _, fn in pairs) else None


def _setup():
    checks = [_check(cls, names) for cls, names in (
        (_streams.StreamReader, _READER), (_streams.StreamReaderProtocol, _PROTOCOL))]
    originals = tuple(_own(cls, name) for cls, name in _KINDS)
    usable = all(c is not None for c in checks) and all(f is not None for f in originals)
    on = (usable and not _core.portable and
          os.environ.get("TIDELOOP_STREAMS", "1").lower() not in ("0", "off", "no"))
    if not usable:       # the core still needs arguments of the right types
        checks = [()] * 2
        originals = (None,) * len(_KINDS)
    _core._streams_setup(on, _streams.StreamReader, _streams.StreamReaderProtocol,
                         *checks, originals,
                         asyncio.exceptions.IncompleteReadError,
                         asyncio.exceptions.LimitOverrunError,
                         # what inspect.iscoroutinefunction() (3.12+) and
                         # asyncio.iscoroutinefunction() (to 3.13) look for;
                         # inspect's marker was _is_coroutine_marker in the
                         # first 3.12 releases
                         (getattr(inspect, "_is_coroutine_mark",
                                  getattr(inspect, "_is_coroutine_marker", None)),
                          getattr(asyncio.coroutines, "_is_coroutine", None)))
    return on


ENABLED = _setup()
