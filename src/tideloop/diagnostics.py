"""Loop health: what a tideloop loop has done and where its time went, and
stalls caught while they happen.

Every loop keeps, in C and always (a few clock reads per loop iteration):

- counters: ``iterations``, ``polls``, ``callbacks``, ``io_events``,
  ``timers_fired``, ``slow_callbacks`` (debug mode's reports);
- time: ``time_polling`` (blocked in the poller) and ``time_running`` (the
  rest of each iteration), in seconds;
- gauges: ``ready`` (callbacks queued), ``timers``, ``fds`` (watched);
- histograms (fixed memory, log buckets: see :data:`HISTOGRAM_BOUNDS`):
  ``iteration`` (one iteration without the poller's sleep), ``poll`` (one
  blocking poll), ``scheduling_lag`` (per batch of callbacks: how long its
  oldest callback waited between being queued and the batch starting),
  ``timer_lateness`` (a timer, from its deadline to its callback being
  queued) and ``callback`` (one callback; recorded only while
  :func:`set_callback_timing` is on, as it costs a clock read per callback).

:func:`snapshot` returns all of it as plain data (dicts, lists, numbers),
from any thread; :func:`diff` subtracts two snapshots; :func:`summary`
gives a histogram's count, mean and percentiles; :func:`reset` starts
over.  Reads never tear a value: the loop's thread writes each word with a
relaxed atomic store, readers load it the same way.

``TIDELOOP_DIAGNOSTICS`` turns the optional parts on for every new loop,
with no change to the program: comma-separated ``timing``,
``slow=SECONDS`` (:func:`report_slow_callbacks`), ``stalls=SECONDS``
(:func:`watch_stalls`), ``serve`` (:func:`serve`).

The live view: :func:`serve` lets ``python -m tideloop top PID`` show the
process's loops (``tideloop._diag_live`` has the server and the client).

Stalls: :func:`watch_stalls` starts a watchdog thread (in C) for a loop.
When the loop has been inside one callback for longer than the threshold,
it captures the loop thread's Python stack at that moment -- the line that
blocks: a ``time.sleep``, a CPU-bound loop, a blocking socket call -- and
when the callback returns the stall is reported once: logged on
:data:`logger` and kept in :func:`stalls` (the last 32).  A loop that is not
watched pays nothing for this.

Slow callbacks: :func:`report_slow_callbacks` times every callback (debug
mode not needed) and reports each one that took longer than the
threshold -- when it was a Task's step, with the Task, its coroutine, its
await chain and the lines the step started and ended at
(:func:`slow_callbacks`, and :data:`logger`).
"""
from __future__ import annotations

import asyncio
import atexit
import collections
import faulthandler
import linecache
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
import weakref
from asyncio import base_events as _base_events

from . import _core

__all__ = ["HISTOGRAM_BOUNDS", "snapshot", "reset", "diff", "summary",
           "set_callback_timing", "watch_stalls", "stop_watching_stalls", "stalls",
           "report_slow_callbacks", "slow_callbacks", "logger", "PrometheusCollector",
           "loops", "subscribe", "unsubscribe", "track_tasks", "task_stats", "top_tasks",
           "task_leaks", "report_task_leaks", "serve", "stop_serving"]

#: Where stall reports are logged (WARNING, with ``extra={"tideloop_stall":
#: report}``).
logger = logging.getLogger("tideloop.diagnostics")

#: The lower bound of each histogram bucket, in seconds: [0, 1.024 us), then
#: two buckets per power of two of nanoseconds, the last one open-ended.
HISTOGRAM_BOUNDS = _core.HISTOGRAM_BOUNDS

_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep

_COUNTERS = ("iterations", "polls", "callbacks", "io_events", "timers_fired",
             "slow_callbacks", "time_polling", "time_running")


def _loop(loop):
    if loop is None:
        loop = asyncio.get_running_loop()
    if not isinstance(loop, _core.Loop):
        raise TypeError("tideloop.diagnostics needs a tideloop loop, not %s"
                        % type(loop).__name__)
    return loop


def loops():
    """Every tideloop loop of the process that is not closed."""
    from . import _live_loops
    return [lp for lp in _live_loops() if not lp.is_closed()]


def serve(path=None):
    """Serve the live view (``python -m tideloop top PID``) from a daemon
    thread, once per process: a Unix socket, mode 0600, ``<pid>.sock`` in
    ``$XDG_RUNTIME_DIR/tideloop`` or else ``/tmp/tideloop-<uid>`` (mode 0700,
    refused if another user owns it or others may enter it), removed at
    exit.  Returns its path (the running server's, when it runs)."""
    from . import _diag_live
    return _diag_live.serve(path)


def stop_serving():
    """Stop serving the live view and remove the socket."""
    from . import _diag_live
    _diag_live.stop_serving()


# -- reports to subscribers ---------------------------------------------------

_subscribers = []


def subscribe(callback):
    """Call ``callback(kind, loop, report)`` for every report: ``kind`` is
    ``"stall"``, ``"slow_callback"`` or ``"task_leak"``, ``report`` the dict
    that :func:`stalls`, :func:`slow_callbacks` or :func:`task_leaks` would
    return.  It runs on the loop's thread, right after the report is made
    (before rate-limited logging); an exception in it is logged, not raised."""
    if callback not in _subscribers:
        _subscribers.append(callback)


def unsubscribe(callback):
    """Stop calling ``callback`` (no error when it was not subscribed)."""
    try:
        _subscribers.remove(callback)
    except ValueError:
        pass


def _publish(kind, loop, report):
    for callback in list(_subscribers):
        try:
            callback(kind, loop, report)
        except Exception:       # noqa: BLE001 - a subscriber must not break the loop
            logger.exception("tideloop.diagnostics subscriber %r failed", callback)


def snapshot(loop=None):
    """The loop's health now, as plain data (the running loop's if None)."""
    return _loop(loop)._diagnostics()


def reset(loop=None):
    """Counters and histograms back to zero; ``since`` becomes now."""
    _loop(loop)._reset_diagnostics()


def set_callback_timing(on=True, loop=None):
    """Time every callback into the ``callback`` histogram (a clock read
    per callback); returns the previous setting."""
    return _loop(loop)._set_callback_timing(bool(on))


def diff(before, after):
    """What happened between two snapshots of one loop: counters, times and
    histogram counts and sums subtracted; gauges, ``max`` values (since the
    last reset) and settings as in ``after``.  A reset in between is an
    error (the counts would go negative)."""
    if after["since"] != before["since"]:
        raise ValueError("the loop's diagnostics were reset between the snapshots")
    out = dict(after)
    for k in _COUNTERS:
        out[k] = after[k] - before[k]
    out["histograms"] = {
        name: {"counts": [a - b for a, b in zip(h["counts"], before["histograms"][name]["counts"])],
               "sum": h["sum"] - before["histograms"][name]["sum"],
               "max": h["max"]}
        for name, h in after["histograms"].items()}
    return out


def _bucket_upper(i, hist):
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
                out[name] = _bucket_upper(i, hist)
                break
    return out


# -- stalls ------------------------------------------------------------------

STALLS_KEPT = 32
LOG_BURST = 10          # stall log records per loop and minute, at most

_recent = weakref.WeakKeyDictionary()      # loop -> deque of reports
_log_times = weakref.WeakKeyDictionary()   # loop -> deque of log times
_watched = weakref.WeakSet()


def watch_stalls(threshold=0.1, loop=None):
    """Report callbacks that keep the loop busy for longer than
    ``threshold`` seconds, with the stack they were blocked in (None:
    stop).  Returns the previous threshold (None if not watched).

    For C code that holds the GIL through the stall, a real-time signal
    (see :func:`_dump_signal`) is registered with :mod:`faulthandler` the
    first time."""
    loop = _loop(loop)
    prev = loop._set_stall_threshold(threshold, _dump_signal() if threshold is not None else 0)
    if threshold is None:
        _watched.discard(loop)
    else:
        _watched.add(loop)
    return prev


def stop_watching_stalls(loop=None):
    """Stop the stall watchdog of the loop; returns its threshold."""
    return watch_stalls(None, loop)


def stalls(loop=None):
    """The loop's last stalls, oldest first: dicts with ``duration`` (s,
    from when the watchdog first saw the loop stuck to the callback's
    return: at least the threshold minus a quarter of it), ``started``
    (loop.time() of that), ``callback`` (what ran), ``stack`` (the loop
    thread's frames when caught, outermost first: (filename, line number,
    function, source line) tuples; None if it could not be taken),
    ``captured_by`` (``"gil"``: taken with the GIL, which the loop thread
    gave up; ``"signal"``: C code held the GIL, so faulthandler wrote the
    stack from inside the stalled thread on the watchdog's signal) and
    ``capture_delay`` (s from ``started`` to the capture)."""
    return list(_recent.get(_loop(loop), ()))


_dump = None            # (signal number, file) once registered with faulthandler
_dump_lock = threading.Lock()
_DUMP_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def _dump_signal():
    """The signal that makes faulthandler write the loop thread's stack
    from inside that thread, without the GIL (the watchdog sends it when
    the GIL does not come within 20 ms: C code holds it).  A real-time
    signal nobody handles (from SIGRTMAX - 2 down), registered once;
    0 when none is free."""
    global _dump
    with _dump_lock:
        if _dump is None:
            _dump = (0, None)
            for signum in range(signal.SIGRTMAX - 2, signal.SIGRTMIN + 2, -1):
                if signal.getsignal(signum) != signal.SIG_DFL:
                    continue
                f = tempfile.TemporaryFile(prefix="tideloop-stall-")
                faulthandler.register(signum, file=f, all_threads=False, chain=False)
                _dump = (signum, f)
                break
        return _dump[0]


def _read_dump():
    """The stack that faulthandler wrote on the signal (outermost first, as
    _capture's), or None; the file is emptied."""
    f = _dump[1] if _dump else None
    if f is None:
        return None
    with _dump_lock:
        f.seek(0)
        text = f.read().decode("utf-8", "replace")
        f.seek(0)
        f.truncate()
    block = text.rsplit("Stack (most recent call first):", 1)
    if len(block) < 2:
        return None
    frames = []
    for line in block[1].splitlines():
        m = _DUMP_FRAME.match(line)
        if m:
            filename, lineno, name = m.group(1), int(m.group(2)), m.group(3)
            frames.append((filename, lineno, name, linecache.getline(filename, lineno).strip()))
    return frames[::-1] or None


def _capture(thread_id):
    """The watchdog's capture (with the GIL, the loop thread stuck)."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return None
    return [(f.filename, f.lineno, f.name, f.line) for f in traceback.extract_stack(frame)]


def _describe(what, io_name):
    if io_name is not None:
        return "%s.%s()" % (type(what).__name__, io_name)
    try:
        return _base_events._format_handle(what)
    except Exception:       # noqa: BLE001 - a description must not fail
        return repr(what)


def _report(loop, what, io_name, duration, started, delay, stack, signalled=0):
    """A stall is over (called by the loop thread after the callback).
    signalled: the GIL did not come, faulthandler's dump holds the stack."""
    captured_by = "gil"
    if signalled:
        stack, captured_by = _read_dump(), "signal"
    elif stack is None:
        captured_by = None
    report = {"duration": duration, "started": started, "callback": _describe(what, io_name),
              "stack": stack, "capture_delay": delay if stack is not None else None,
              "captured_by": captured_by if stack is not None else None}
    _stall_totals[loop] = _stall_totals.get(loop, 0) + 1
    _recent.setdefault(loop, collections.deque(maxlen=STALLS_KEPT)).append(report)
    _publish("stall", loop, report)
    if _rate_limited(_log_times, loop):
        return
    if stack:
        logger.warning("Event loop blocked for %.3f s in %s; stack when caught "
                       "(%.3f s in%s):\n%s", duration, report["callback"], delay,
                       ", by signal: C code held the GIL" if signalled else "",
                       "".join(traceback.format_list(stack)).rstrip(),
                       extra={"tideloop_stall": report})
    else:
        logger.warning("Event loop blocked for %.3f s in %s (its stack could not be taken)",
                       duration, report["callback"], extra={"tideloop_stall": report})


# -- export -----------------------------------------------------------------

_stall_totals = weakref.WeakKeyDictionary()     # loop -> stalls reported


class PrometheusCollector:
    """A ``prometheus_client`` collector of loops' health (``pip install
    tideloop[prometheus]``)::

        from prometheus_client import REGISTRY
        REGISTRY.register(tideloop.diagnostics.PrometheusCollector({"main": loop}))

    ``loops``: {label: loop} (the ``loop`` label of every sample).  Each
    scrape takes one snapshot per loop, from the scraping thread.
    Counters: ``tideloop_loop_<counter>_total`` and
    ``tideloop_loop_seconds_{polling,running}_total``; gauges:
    ``tideloop_loop_{ready,timers,fds}``; histograms (seconds, the loop's
    own buckets as ``le`` bounds): ``tideloop_loop_<histogram>_seconds``;
    ``tideloop_loop_stalls_total`` counts the stalls reported."""

    def __init__(self, loops):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)
        self._families = (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily)
        self._loops = dict(loops)
        for loop in self._loops.values():
            _loop(loop)

    def collect(self):
        counter, gauge, histogram = self._families
        snaps = [(label, loop, loop._diagnostics()) for label, loop in self._loops.items()]
        doc = {"iterations": "loop iterations", "polls": "calls to the poller",
               "callbacks": "callbacks run", "io_events": "I/O events dispatched",
               "timers_fired": "timers that fired",
               "slow_callbacks": "callbacks over the slow-callback threshold"}
        for key, text in doc.items():
            m = counter("tideloop_loop_" + key, text, labels=["loop"])
            for label, _, d in snaps:
                m.add_metric([label], d[key])
            yield m
        for key, text in (("polling", "seconds blocked in the poller"),
                          ("running", "seconds running (the rest of each iteration)")):
            m = counter("tideloop_loop_seconds_" + key, text, labels=["loop"])
            for label, _, d in snaps:
                m.add_metric([label], d["time_" + key])
            yield m
        m = counter("tideloop_loop_stalls", "stalls reported by the watchdog", labels=["loop"])
        for label, loop, _ in snaps:
            m.add_metric([label], _stall_totals.get(loop, 0))
        yield m
        for key, text in (("ready", "callbacks queued"), ("timers", "timers scheduled"),
                          ("fds", "file descriptors watched")):
            m = gauge("tideloop_loop_" + key, text, labels=["loop"])
            for label, _, d in snaps:
                m.add_metric([label], d[key])
            yield m
        for name in ("iteration", "poll", "scheduling_lag", "timer_lateness", "callback"):
            m = histogram("tideloop_loop_%s_seconds" % name, "the loop's %s histogram"
                          % name.replace("_", " "), labels=["loop"])
            for label, _, d in snaps:
                h = d["histograms"][name]
                buckets, seen = [], 0
                for i, c in enumerate(h["counts"][:-1]):
                    seen += c
                    buckets.append((repr(HISTOGRAM_BOUNDS[i + 1]), seen))
                buckets.append(("+Inf", seen + h["counts"][-1]))
                m.add_metric([label], buckets, h["sum"])
            yield m


# OpenTelemetry (tideloop[otel]): its own module; opentelemetry is imported
# only when one is made.
from ._diag_otel import OpenTelemetryMetrics  # noqa: E402
__all__.append("OpenTelemetryMetrics")


# -- slow callbacks ---------------------------------------------------------

_recent_slow = weakref.WeakKeyDictionary()      # loop -> deque of reports
_slow_log_times = weakref.WeakKeyDictionary()


def report_slow_callbacks(threshold=0.1, loop=None):
    """Report every callback that takes at least ``threshold`` seconds
    (None: stop).  Turns callback timing on while set.  Returns the
    previous threshold (None if off)."""
    return _loop(loop)._set_slow_callback_threshold(threshold)


def slow_callbacks(loop=None):
    """The loop's last slow callbacks, oldest first: dicts with
    ``duration``, ``callback`` and, for a Task's step, ``task`` (its name),
    ``coroutine`` (qualified name), ``started`` and ``ended`` (where it was
    suspended before and after the step: the innermost coroutine outside
    asyncio's own modules, as (qualified name, filename, line); None when
    it had not started or is done) and ``await_chain`` (the coroutines it is suspended in,
    outermost first, as such tuples, then what the innermost one awaits)."""
    return list(_recent_slow.get(_loop(loop), ()))


def _await_chain(task):
    """Outermost first: (qualname, filename, line) per coroutine frame,
    then the awaited object's repr as a last item when it is no coroutine."""
    graph = getattr(asyncio, "capture_call_graph", None)
    if graph is not None:               # 3.14
        g = graph(task)
        if g is None:
            return []
        return [(e.frame.f_code.co_qualname, e.frame.f_code.co_filename, e.frame.f_lineno)
                for e in reversed(g.call_stack)]
    chain, obj = [], task.get_coro()
    while obj is not None:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            if not hasattr(obj, "cr_frame") and not hasattr(obj, "gi_frame"):
                chain.append("<%s>" % type(obj).__name__)      # a Future, say
            break
        chain.append((frame.f_code.co_qualname, frame.f_code.co_filename, frame.f_lineno))
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    return chain


def _slow(loop, what, io_name, duration, task, started):
    """A callback took at least the threshold (called by the loop thread)."""
    report = {"duration": duration, "callback": _describe(what, io_name)}
    if task is not None:
        coro = task.get_coro()
        chain = _await_chain(task) if not task.done() else []
        frames = [c for c in chain if not isinstance(c, str)]
        frames = [c for c in frames if not c[1].startswith(_ASYNCIO_DIR)] or frames
        report.update(task=task.get_name(),
                      coroutine=getattr(coro, "__qualname__", repr(coro)),
                      started=started, ended=frames[-1] if frames else None,
                      await_chain=chain)
    _recent_slow.setdefault(loop, collections.deque(maxlen=STALLS_KEPT)).append(report)
    _publish("slow_callback", loop, report)
    if _rate_limited(_slow_log_times, loop):
        return
    if task is not None:
        chain = " -> ".join(c if isinstance(c, str) else _where(c)
                            for c in report["await_chain"]) or "(done)"
        logger.warning("Slow callback: %.3f s in a step of task %r (%s) from %s to %s; "
                       "await chain: %s", duration, report["task"], report["coroutine"],
                       _where(report["started"]), _where(report["ended"]), chain,
                       extra={"tideloop_slow_callback": report})
    else:
        logger.warning("Slow callback: %.3f s in %s", duration, report["callback"],
                       extra={"tideloop_slow_callback": report})


# -- tasks ------------------------------------------------------------------

def track_tasks(on=True, origins=False, loop=None):
    """Account each Task of the loop: CPU time (the sum of its steps'
    durations; an eager task's first step, run inside ``create_task``,
    counts as its own and not its creator's), steps, age, time since its
    last step, and whether it finished with nobody waiting for it or
    holding it (see :func:`task_leaks`).  Turns
    callback timing on while set.  ``origins``: also record where each task
    was created (the innermost frame outside asyncio that called
    ``create_task``; a frame walk per task).  Off forgets what was
    tracked.  Returns the previous setting.

    Tasks created before tracking began are seen from their next step on
    (their age counts from then)."""
    return _loop(loop)._set_task_tracking(bool(on), bool(origins))


def _state(task):
    if not task.done():
        return "pending"
    return "cancelled" if task.cancelled() else "done"


def _origin(task, origin):
    if origin is not None:
        return tuple(origin)
    tb = getattr(task, "_source_traceback", None)    # asyncio's debug mode
    for frame in reversed(tb or ()):
        if not frame.filename.startswith(_ASYNCIO_DIR):
            return (frame.filename, frame.lineno)
    return None


def _coro_name(task):
    coro = task.get_coro()
    return getattr(coro, "__qualname__", None) or type(coro).__name__


def _stats(loop):
    stats = loop._task_stats()
    if stats is None:
        raise RuntimeError("task tracking is off for this loop: "
                           "tideloop.diagnostics.track_tasks() turns it on")
    return stats


def task_stats(loop=None):
    """Every tracked Task that is still alive, as dicts: ``task`` (its
    name), ``id`` (``id()`` of the Task), ``coroutine`` (qualified name),
    ``state`` (pending, done, cancelled), ``cpu`` (s), ``steps``, ``age``
    (s since created), ``idle`` (s since its last step ended), ``origin``
    ((filename, line) where created, or None).  Call it on the loop's
    thread (another thread: ``loop.call_soon_threadsafe``)."""
    loop = _loop(loop)
    live, _, _ = _stats(loop)
    now = loop.time()
    return [{"task": task.get_name(), "id": id(task), "coroutine": _coro_name(task),
             "state": _state(task), "cpu": cpu, "steps": steps, "age": now - created,
             "idle": now - last, "origin": _origin(task, origin)}
            for task, cpu, steps, created, last, _, _, _, origin in live]


def top_tasks(n=10, loop=None):
    """The n tracked Tasks with the most CPU time, most first (see
    :func:`task_stats`)."""
    return sorted(task_stats(loop), key=lambda t: t["cpu"], reverse=True)[:n]


def task_leaks(pending_for=60.0, loop=None):
    """Tasks that look leaked, grouped by coroutine and origin:
    ``pending`` -- tasks of the loop still pending after ``pending_for``
    seconds; ``unwaited`` -- tasks that finished while nobody waited for
    them (no done callback: not awaited, gathered, in a TaskGroup or
    waited on) and nobody held them (so that nobody could await them
    later): fire-and-forget tasks whose result or exception was lost,
    counted whether collected since or not.  Coroutines of asyncio's own
    modules are left out (asyncio starts some such tasks by design).  Each group: ``coroutine``, ``origin``,
    ``count``, ``tasks`` (names of up to 5 live ones) and, for pending
    ones, ``oldest`` (s).  ``untracked``: tasks not tracked (over 65,536
    alive at once)."""
    loop = _loop(loop)
    live, gone, untracked = _stats(loop)
    now = loop.time()
    pending, unwaited = {}, {}
    for task, _, _, created, _, finished, unwaited_flag, qualname, origin in live:
        if unwaited_flag:
            key = (qualname or _coro_name(task), _origin(task, origin))
            g = unwaited.setdefault(key, {"count": 0, "tasks": []})
            g["count"] += 1
            if len(g["tasks"]) < 5:
                g["tasks"].append(task.get_name())
        elif not finished and not task.done() and now - created >= pending_for:
            key = (_coro_name(task), _origin(task, origin))
            g = pending.setdefault(key, {"count": 0, "tasks": [], "oldest": 0.0})
            g["count"] += 1
            g["oldest"] = max(g["oldest"], now - created)
            if len(g["tasks"]) < 5:
                g["tasks"].append(task.get_name())
    for (qualname, origin), count in gone.items():
        key = (qualname, tuple(origin) if origin else None)
        unwaited.setdefault(key, {"count": 0, "tasks": []})["count"] += count

    def groups(table):
        out = [dict(coroutine=q, origin=o, **g) for (q, o), g in table.items()]
        return sorted(out, key=lambda g: g["count"], reverse=True)
    return {"pending": groups(pending), "unwaited": groups(unwaited), "untracked": untracked}


_leak_log_times = weakref.WeakKeyDictionary()


def report_task_leaks(pending_for=60.0, loop=None):
    """:func:`task_leaks`, each group logged on :data:`logger` (WARNING,
    ``extra={"tideloop_task_leak": group}``, rate-limited) and handed to
    subscribers (kind ``"task_leak"``, the group with a ``kind`` key:
    pending or unwaited).  Returns the report."""
    loop = _loop(loop)
    report = task_leaks(pending_for, loop)
    for kind in ("pending", "unwaited"):
        for group in report[kind]:
            group = dict(group, kind=kind)
            _publish("task_leak", loop, group)
            if _rate_limited(_leak_log_times, loop):
                continue
            where = "%s:%d" % group["origin"] if group["origin"] else "unknown origin"
            if kind == "pending":
                logger.warning("%d task(s) of %s (created at %s) pending for up to %.1f s: %s",
                               group["count"], group["coroutine"], where, group["oldest"],
                               ", ".join(group["tasks"]), extra={"tideloop_task_leak": group})
            else:
                logger.warning("%d task(s) of %s (created at %s) finished with nobody "
                               "waiting for them%s", group["count"], group["coroutine"], where,
                               (": " + ", ".join(group["tasks"])) if group["tasks"] else "",
                               extra={"tideloop_task_leak": group})
    return report


def _where(w):
    return "%s (%s:%d)" % w if w else "-"


def _rate_limited(table, loop):
    """True when the loop logged LOG_BURST records in the last minute."""
    times = table.setdefault(loop, collections.deque(maxlen=LOG_BURST))
    now = time.monotonic()
    if len(times) == LOG_BURST and now - times[0] < 60:
        return True
    times.append(now)
    return False


def _from_environment(loop, spec):
    """TIDELOOP_DIAGNOSTICS for each new loop: comma-separated ``timing``,
    ``slow=SECONDS``, ``stalls=SECONDS``, ``tasks`` (``tasks=origins``),
    ``serve``."""
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, value = item.partition("=")
        if name == "timing" and not value:
            set_callback_timing(True, loop)
        elif name == "tasks" and value in ("", "origins"):
            track_tasks(True, origins=value == "origins", loop=loop)
        elif name == "slow" and value:
            report_slow_callbacks(float(value), loop)
        elif name == "stalls" and value:
            watch_stalls(float(value), loop)
        elif name == "serve" and not value:
            try:
                serve()
            except OSError as exc:      # the program runs on without the view
                logger.warning("TIDELOOP_DIAGNOSTICS=serve: cannot serve the live view: %s",
                               exc)
        else:
            raise ValueError("TIDELOOP_DIAGNOSTICS: unknown item %r (timing, slow=SECONDS, "
                             "stalls=SECONDS, tasks, tasks=origins, serve)" % item)


@atexit.register
def _stop_all():
    # No watchdog thread may outlive the interpreter's finalization.
    for loop in list(_watched):
        try:
            loop._set_stall_threshold(None)
        except Exception:   # noqa: BLE001 - exiting anyway
            pass


_core._diag_setup(_capture, _report, _slow, _ASYNCIO_DIR,
                  tuple({asyncio.Task, getattr(asyncio.tasks, "_PyTask", asyncio.Task)}))
