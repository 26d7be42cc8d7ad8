"""The state that tideloop's diagnostics modules share, and the helpers
they all use.

The diagnostics layer is acyclic: this module imports no other module of
the layer; ``_diag_tasks`` imports this one; ``diagnostics`` (the public
API), ``_diag_live`` (the live view) and ``_diag_otel`` (OpenTelemetry)
import these two and never each other's importers.  The package's ``Loop``
registers each new loop here (:func:`register_loop`).
"""
from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import os
import sys
import threading
import time
import weakref

from . import _core

#: Where reports are logged (WARNING).
logger = logging.getLogger("tideloop.diagnostics")

#: The lower bound of each histogram bucket, in seconds: [0, 1.024 us), then
#: two buckets per power of two of nanoseconds, the last one open-ended.
HISTOGRAM_BOUNDS = _core.HISTOGRAM_BOUNDS

ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

# sys._current_frames() reads this interpreter's threads from 3.14; before,
# in a subinterpreter it walks every interpreter's (frames of objects owned
# by other interpreters: a probe crashed 3.12 and 3.13), so there only the
# loop's own thread state is read (loop._thread_frame(), GIL builds).
CURRENT_FRAMES_SAFE = bool(_core.main_interpreter) or sys.version_info >= (3, 14)
# Whether a stall's stack can be taken at all: on a free-threaded build
# another thread's frame may be read only with the world stopped, which only
# sys._current_frames() does from outside CPython; where that is not safe
# either (a subinterpreter of 3.13t) stall reports carry no stack, only
# where the step ended.
STALL_STACKS = CURRENT_FRAMES_SAFE or not _core.free_threaded


def thread_frame(loop, thread_id=None):
    """The frame the loop's thread is in now (or thread_id's), or None."""
    frame = loop._thread_frame()
    if frame is None and CURRENT_FRAMES_SAFE:
        frame = sys._current_frames().get(thread_id or loop._thread_id or -1)
    return frame


STALLS_KEPT = 32        # stalls and slow callbacks kept per loop
LOG_BURST = 10          # log records per loop, kind and minute, at most

COUNTERS = ("iterations", "polls", "callbacks", "io_events", "timers_fired",
            "slow_callbacks", "time_polling", "time_running")

# -- every loop of the process -------------------------------------------------

# id -> weak reference keyed by that id.  Loops are made and freed in any
# thread (a WeakSet changes size under an iteration in another thread); the
# lock is reentrant because a loop freed while it is held runs its weak
# reference's callback there.  Forgetting a loop does not iterate the table:
# a collection inside that callback may free other loops and run theirs.
_LOOPS = {}
_LOOPS_LOCK = threading.RLock()


def _forget_loop(ref, _loops=_LOOPS, _lock=_LOOPS_LOCK):
    with _lock:
        if _loops.get(ref.key) is ref:
            del _loops[ref.key]


def register_loop(loop):
    """A new loop (tideloop.Loop.__init__): listed by :func:`loops`."""
    with _LOOPS_LOCK:
        _LOOPS[id(loop)] = weakref.KeyedRef(loop, _forget_loop, id(loop))


def live_loops():
    """Every tideloop loop alive, closed or not."""
    with _LOOPS_LOCK:
        refs = list(_LOOPS.values())
    return [lp for lp in (r() for r in refs) if lp is not None]


def loops():
    """Every tideloop loop of the process that is not closed."""
    return [lp for lp in live_loops() if not lp.is_closed()]


def check_loop(loop):
    """The loop given, or the running one; TypeError for another loop."""
    if loop is None:
        loop = asyncio.get_running_loop()
    if not isinstance(loop, _core.Loop):
        raise TypeError("tideloop.diagnostics needs a tideloop loop, not %s"
                        % type(loop).__name__)
    return loop


# -- what the reports left ---------------------------------------------------

recent_stalls = weakref.WeakKeyDictionary()     # loop -> deque of stall reports
recent_slow = weakref.WeakKeyDictionary()       # loop -> deque of slow-callback reports
stall_totals = weakref.WeakKeyDictionary()      # loop -> stalls reported
watched = weakref.WeakSet()                     # loops with a stall watchdog


def keep(table, loop, report):
    table.setdefault(loop, collections.deque(maxlen=STALLS_KEPT)).append(report)


def stalls(loop=None):
    """The loop's last stalls, oldest first: dicts with ``duration`` (s,
    from when the watchdog first saw the loop stuck to the callback's
    return: at least the threshold minus a quarter of it), ``started``
    (loop.time() of that), ``callback`` (what ran), ``stack`` (the loop
    thread's frames when caught, outermost first, without the frames of
    ``python -m tideloop run`` and runpy: (filename, line number, function,
    source line) tuples; None if it could not be taken), ``blocked_at``
    (the frame the time went in: the innermost outside asyncio and
    tideloop), ``captured_by`` (``"gil"``: taken with the GIL, which the
    loop thread gave up; ``"signal"``: C code held the GIL, so faulthandler
    wrote the stack from inside the stalled thread on the watchdog's
    signal) and ``capture_delay`` (s from ``started`` to the capture).
    When the callback was a Task's step (slow callbacks reported or not):
    ``task``, ``coroutine``, ``origin`` and ``ended`` as in
    :func:`slow_callbacks` (``ended`` says where the time went when the
    stack could not be taken)."""
    return list(recent_stalls.get(check_loop(loop), ()))


def slow_callbacks(loop=None):
    """The loop's last slow callbacks, oldest first: dicts with
    ``duration``, ``callback``, ``stall`` (True when the stall watchdog
    caught it too: :func:`stalls` has its stack) and, for a Task's step,
    ``task`` (its name), ``coroutine`` (qualified name), ``origin``
    ((filename, line) where the task was created, when task tracking with
    origins or asyncio's debug mode noted it), ``state`` (the task's after
    the step), ``started`` and ``ended`` (where the step started and ended:
    the innermost coroutine outside asyncio's own modules, as (qualified
    name, filename, line); once the task is done, ``ended`` is the line its
    coroutine returned from) and ``await_chain`` (the coroutines it is
    suspended in, outermost first, as such tuples, then what the innermost
    one awaits)."""
    return list(recent_slow.get(check_loop(loop), ()))


# -- reports to subscribers ---------------------------------------------------

subscribers = []


def subscribe(callback):
    """Call ``callback(kind, loop, report)`` for every report: ``kind`` is
    ``"stall"``, ``"slow_callback"`` or ``"task_leak"``, ``report`` the dict
    that :func:`stalls`, :func:`slow_callbacks` or :func:`task_leaks` would
    return.  It runs on the loop's thread, right after the report is made
    (before rate-limited logging); an exception in it is logged, not raised."""
    if callback not in subscribers:
        subscribers.append(callback)


def unsubscribe(callback):
    """Stop calling ``callback`` (no error when it was not subscribed)."""
    try:
        subscribers.remove(callback)
    except ValueError:
        pass


def publish(kind, loop, report):
    for callback in list(subscribers):
        try:
            callback(kind, loop, report)
        except Exception:       # noqa: BLE001 - a subscriber must not break the loop
            logger.exception("tideloop.diagnostics subscriber %r failed", callback)


# -- logging, rate-limited ---------------------------------------------------------

_limits = []


class RateLimit:
    """At most LOG_BURST records per loop in any minute; the ones held back
    are counted, the next record that is logged says how many, and so
    does a last record at exit for those never told of."""

    clock = staticmethod(time.monotonic)

    def __init__(self, kind):
        self.kind = kind
        self.untold = 0                                 # held back, not yet told of
        self._times = weakref.WeakKeyDictionary()       # loop -> deque of log times
        self._held = weakref.WeakKeyDictionary()        # loop -> records held back
        _limits.append(self)

    def admit(self, loop):
        """None: hold this record back.  Else the suffix for its message:
        "" or " (N similar reports suppressed)"."""
        times = self._times.setdefault(loop, collections.deque(maxlen=LOG_BURST))
        now = self.clock()
        if len(times) == LOG_BURST and now - times[0] < 60:
            self._held[loop] = self._held.get(loop, 0) + 1
            self.untold += 1
            return None
        times.append(now)
        held = self._held.pop(loop, 0)
        if not held:
            return ""
        self.untold -= held
        return " (%d similar report%s suppressed)" % (held, "" if held == 1 else "s")



@atexit.register
def _tell_the_untold():
    for limit in _limits:
        if limit.untold > 0:
            logger.warning("%d more %s report%s held back by the log's rate limit (%d a "
                           "minute per loop) and not logged", limit.untold, limit.kind,
                           "" if limit.untold == 1 else "s", LOG_BURST)
            limit.untold = 0


# -- helpers ------------------------------------------------------------------------

def where(w):
    """'function (file:line)' of a (qualname, filename, line), '-' for None."""
    return "%s (%s:%d)" % tuple(w[:3]) if w else "-"


def _runner_files():
    """co_filename of the frames that start the program and are no part of
    it: ``python -m tideloop run``'s module, runpy and the import system."""
    files = {"<frozen runpy>", "<frozen importlib._bootstrap>",
             "<frozen importlib._bootstrap_external>", "<frozen zipimport>",
             PACKAGE_DIR + "__main__.py"}
    runpy = sys.modules.get("runpy")
    if getattr(runpy, "__file__", None):
        files.add(runpy.__file__)
    main = sys.modules.get("tideloop.__main__")
    if getattr(main, "__file__", None):
        files.add(main.__file__)
    return files


def without_runner(stack):
    """A stack (outermost first, frames with the filename first) without its
    leading runner frames, as tracebacks leave them out; a stack of nothing
    else stays as it is."""
    if not stack:
        return stack
    files = _runner_files()
    for i, frame in enumerate(stack):
        if frame[0] not in files:
            return stack[i:]
    return stack


def blocking_frame(stack):
    """The frame the time went in: the innermost outside asyncio and
    tideloop (the program's), else the innermost; None for no stack."""
    if not stack:
        return None
    for f in reversed(stack):
        if not f[0].startswith((ASYNCIO_DIR, PACKAGE_DIR)):
            return f
    return stack[-1]


def bucket_upper(i, hist):
    if i + 1 < len(HISTOGRAM_BOUNDS):
        return min(HISTOGRAM_BOUNDS[i + 1], hist["max"]) if hist["max"] else HISTOGRAM_BOUNDS[i + 1]
    return hist["max"]


def summary(hist):
    """{"count", "mean", "p50", "p90", "p99", "max"} of one histogram (a
    snapshot's or a diff's), in seconds.  A percentile is the upper bound
    of the bucket it falls in (capped by ``max``): within a third of the
    true value."""
    counts = hist["counts"]
    n = sum(counts)
    out = {"count": n, "mean": hist["sum"] / n if n else 0.0, "max": hist["max"]}
    for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
        if n == 0:
            out[name] = 0.0
            continue
        rank, seen = q * n, 0
        for i, c in enumerate(counts):
            seen += c
            if c and seen >= rank:
                out[name] = bucket_upper(i, hist)
                break
    return out


def diff(before, after):
    """What happened between two snapshots of one loop: counters, times and
    histogram counts and sums subtracted; gauges, ``max`` values (since the
    last reset) and settings as in ``after``.  A reset in between is an
    error (the counts would go negative)."""
    if after["since"] != before["since"]:
        raise ValueError("the loop's diagnostics were reset between the snapshots")
    out = dict(after)
    for k in COUNTERS:
        out[k] = after[k] - before[k]
    out["histograms"] = {
        name: {"counts": [a - b for a, b in zip(h["counts"], before["histograms"][name]["counts"])],
               "sum": h["sum"] - before["histograms"][name]["sum"],
               "max": h["max"]}
        for name, h in after["histograms"].items()}
    return out
