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
(:func:`watch_stalls`), ``tasks`` or ``tasks=origins`` (:func:`track_tasks`),
``leaks`` or ``leaks=SECONDS`` (task tracking with origins, and
:func:`report_task_leaks` when the loop closes or the process exits, with
``pending_for`` SECONDS, 60 by default), ``serve`` (:func:`serve`).  A bad
item is logged once, naming the variable and the accepted forms, and left
out: the program runs on.

Each record logged is rate-limited (10 per loop, kind and minute); the
first one logged after some were held back says how many ("N similar
reports suppressed"), and a last record at exit counts those never told of.

The live view: :func:`serve` lets ``python -m tideloop top PID`` show the
process's loops (``tideloop._diag_live`` has the server and the client).

Stalls: :func:`watch_stalls` starts a watchdog thread (in C) for a loop.
When the loop has been inside one callback for longer than the threshold,
it captures the loop thread's Python stack at that moment -- the line that
blocks: a ``time.sleep``, a CPU-bound loop, a blocking socket call -- and
when the callback returns the stall is reported once: logged on
:data:`logger` and kept in :func:`stalls` (the last 32), naming the blocking
file:line and function and, for a Task's step, the task and where it was
created (when task tracking with origins knows it).  Stacks leave out the
frames of ``python -m tideloop run`` and runpy, as tracebacks do.  A loop
that is not watched pays nothing for this.

Slow callbacks: :func:`report_slow_callbacks` times every callback (debug
mode not needed) and reports each one that took longer than the
threshold -- when it was a Task's step, with the Task, its coroutine, its
await chain and the lines the step started and ended at (or, once the
task is done, the line it returned from) (:func:`slow_callbacks`, and
:data:`logger`).  One incident gives one report: a callback that the
stall watchdog caught too is logged as the stall, with the task's details.

Task leaks: :func:`task_leaks` (with :func:`track_tasks`) tells the
fire-and-forget tasks that finished with nobody awaiting them from the
long-pending ones nothing waits for; the asking task and the tasks a live
task awaits (a server's main task, its gathered workers) are neither.
"""
from __future__ import annotations

import asyncio
import atexit
import difflib
import linecache
import re
import signal
import sys
import tempfile
import threading
import traceback
from asyncio import base_events as _base_events

from . import _core
from . import _diag_state as _st

try:
    import faulthandler
except ImportError:
    # An isolated subinterpreter (3.12+): faulthandler keeps per-process
    # state and does not load there.  Stalls are captured with the GIL only.
    faulthandler = None
from . import _diag_tasks
from ._diag_state import (HISTOGRAM_BOUNDS, STALLS_KEPT, diff, logger, loops, slow_callbacks,
                          stalls, subscribe, summary, unsubscribe)
from ._diag_tasks import (report_task_leaks, task_leaks, task_stats, top_tasks,
                          track_tasks)
from ._diag_otel import OpenTelemetryMetrics

__all__ = ["HISTOGRAM_BOUNDS", "snapshot", "reset", "diff", "summary",
           "set_callback_timing", "watch_stalls", "stop_watching_stalls", "stalls",
           "report_slow_callbacks", "slow_callbacks", "logger", "PrometheusCollector",
           "loops", "subscribe", "unsubscribe", "track_tasks", "task_stats", "top_tasks",
           "task_leaks", "report_task_leaks", "serve", "stop_serving",
           "OpenTelemetryMetrics"]

_ASYNCIO_DIR = _st.ASYNCIO_DIR
_loop = _st.check_loop


def serve(path=None):
    """Serve the live view (``python -m tideloop top PID``) from a daemon
    thread, once per interpreter: a Unix socket, mode 0600, ``<pid>.sock``
    (``<pid>.<id>.sock`` in a subinterpreter; top shows them all) in
    ``$XDG_RUNTIME_DIR/tideloop`` or else ``/tmp/tideloop-<uid>`` (mode 0700,
    refused if another user owns it or others may enter it), removed at
    exit.  Returns its path (the running server's, when it runs)."""
    from . import _diag_live
    return _diag_live.serve(path)


def stop_serving():
    """Stop serving the live view and remove the socket."""
    from . import _diag_live
    _diag_live.stop_serving()


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


# -- stalls ------------------------------------------------------------------

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
        _st.watched.discard(loop)
    else:
        _st.watched.add(loop)
    return prev


def stop_watching_stalls(loop=None):
    """Stop the stall watchdog of the loop; returns its threshold."""
    return watch_stalls(None, loop)


_dump = None            # (signal number, file) once registered with faulthandler
_dump_lock = threading.Lock()
_DUMP_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def _dump_signal():
    """The signal that makes faulthandler write the loop thread's stack
    from inside that thread, without the GIL (the watchdog sends it when
    the GIL does not come within 20 ms: C code holds it).  A real-time
    signal nobody handles (from SIGRTMAX - 2 down), registered once;
    0 when none is free, and in a subinterpreter: signal dispositions are
    the process's, and faulthandler does not load there."""
    global _dump
    with _dump_lock:
        if _dump is None:
            _dump = (0, None)
            if faulthandler is None or not _core.main_interpreter:
                return 0
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
    return _st.without_runner(frames[::-1]) or None


def _capture(thread_id, frame=None):
    """The watchdog's capture (with the GIL, the loop thread stuck): the
    loop thread's frame when the core could read it, else that thread's in
    sys._current_frames() (free-threaded builds: it stops the world)."""
    if frame is None and _st.CURRENT_FRAMES_SAFE:
        frame = sys._current_frames().get(thread_id)
    if frame is None:
        return None
    return _st.without_runner([(f.filename, f.lineno, f.name, f.line)
                               for f in traceback.extract_stack(frame)])


def _describe(what, io_name):
    if io_name is not None:
        return "%s.%s()" % (type(what).__name__, io_name)
    try:
        return _base_events._format_handle(what)
    except Exception:       # noqa: BLE001 - a description must not fail
        return repr(what)


def _task_of_step(what):
    """The Task whose step (or wakeup) the Handle runs, or None."""
    task = getattr(getattr(what, "_callback", None), "__self__", None)
    return task if isinstance(task, asyncio.Future) and hasattr(task, "get_coro") else None


def _task_text(report):
    """"task 'Task-9' (fetch_price, created at buggy.py:30)" of a report
    with task details."""
    origin = report.get("origin")
    return "task %r (%s%s)" % (report["task"], report["coroutine"],
                               ", created at %s:%d" % origin if origin else "")


_stall_log = _st.RateLimit("stall")
_slow_log = _st.RateLimit("slow-callback")


def _report(loop, what, io_name, duration, started, delay, stack, signalled=0, slow=None):
    """A stall is over (called by the loop thread after the callback).
    signalled: the GIL did not come, faulthandler's dump holds the stack.
    slow: (duration, task, where) when the callback was slow as well: then
    this one report says all (the slow callback is kept, not logged)."""
    captured_by = "gil"
    if signalled:
        stack, captured_by = _read_dump(), "signal"
    elif stack is None:
        captured_by = None
    report = {"duration": duration, "started": started, "callback": _describe(what, io_name),
              "stack": stack, "capture_delay": delay if stack is not None else None,
              "captured_by": captured_by if stack is not None else None,
              "blocked_at": _st.blocking_frame(stack)}
    task = slow[1] if slow is not None else _task_of_step(what)
    if slow is not None or task is not None:
        step = _slow_report(loop, what, io_name, slow[0] if slow else duration, task,
                            slow[2] if slow else None, stall=True)
        if slow is not None:
            _st.keep(_st.recent_slow, loop, step)
        for k in ("task", "coroutine", "origin", "ended"):
            if k in step:
                report[k] = step[k]
    _st.stall_totals[loop] = _st.stall_totals.get(loop, 0) + 1
    _st.keep(_st.recent_stalls, loop, report)
    _st.publish("stall", loop, report)
    suffix = _stall_log.admit(loop)
    if suffix is None:
        return
    what = _task_text(report) if report.get("task") else report["callback"]
    if stack:
        f = report["blocked_at"]
        logger.warning("Event loop blocked for %.3f s in %s at %s:%d in %s%s%s; stack when "
                       "caught (%.3f s in%s):\n%s", duration, what, f[0], f[1], f[2],
                       (": " + f[3]) if f[3] else "", suffix, delay,
                       ", by signal: C code held the GIL" if signalled else "",
                       "".join(traceback.format_list(stack)).rstrip(),
                       extra={"tideloop_stall": report})
    else:
        logger.warning("Event loop blocked for %.3f s in %s; its stack could not be "
                       "taken%s%s", duration, what,
                       "; the step ended at %s" % _st.where(report["ended"])
                       if report.get("ended") else "", suffix,
                       extra={"tideloop_stall": report})


# -- export -----------------------------------------------------------------

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
            m.add_metric([label], _st.stall_totals.get(loop, 0))
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


# -- slow callbacks ---------------------------------------------------------

def report_slow_callbacks(threshold=0.1, loop=None):
    """Report every callback that takes at least ``threshold`` seconds
    (None: stop).  Turns callback timing on while set.  Returns the
    previous threshold (None if off).  A callback that the stall watchdog
    caught as well is reported once, as a stall (with the task's details);
    it is still kept in :func:`slow_callbacks`."""
    return _loop(loop)._set_slow_callback_threshold(threshold)


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


def _task_origin(loop, task):
    """(filename, line) where the task was created, if task tracking with
    origins (or asyncio's debug mode) noted it."""
    try:
        stats = loop._task_stats()
    except RuntimeError:
        stats = None
    for row in (stats[0] if stats else ()):
        if row[0] is task:
            return _diag_tasks._origin(task, row[8])
    return _diag_tasks._origin(task, None)


def _slow_report(loop, what, io_name, duration, task, started, stall=False):
    """The report of a slow callback: for a Task's step, the task, where it
    was created, and where the step started and ended -- or, once the
    task is done, the line its coroutine returned from."""
    report = {"duration": duration, "callback": _describe(what, io_name)}
    if stall:
        report["stall"] = True
    if task is None:
        return report
    coro = task.get_coro()
    outer = started[3] if started is not None and len(started) > 3 else None
    started = tuple(started[:3]) if started is not None else None
    if task.done():
        chain = []
        ended = ((outer.f_code.co_qualname, outer.f_code.co_filename, outer.f_lineno)
                 if outer is not None else started)
    else:
        chain = _await_chain(task)
        frames = [c for c in chain if not isinstance(c, str)]
        frames = [c for c in frames if not c[1].startswith((_ASYNCIO_DIR, _st.PACKAGE_DIR))
                  ] or frames
        ended = frames[-1] if frames else started
    report.update(task=task.get_name(), coroutine=getattr(coro, "__qualname__", repr(coro)),
                  origin=_task_origin(loop, task), started=started, ended=ended,
                  await_chain=chain, state=_diag_tasks._state(task))
    return report


def _slow(loop, what, io_name, duration, task, started):
    """A callback took at least the threshold (called by the loop thread)."""
    report = _slow_report(loop, what, io_name, duration, task, started)
    _st.keep(_st.recent_slow, loop, report)
    _st.publish("slow_callback", loop, report)
    suffix = _slow_log.admit(loop)
    if suffix is None:
        return
    if task is None:
        logger.warning("Slow callback: %.3f s in %s%s", duration, report["callback"], suffix,
                       extra={"tideloop_slow_callback": report})
        return
    if report["state"] == "pending":
        chain = " -> ".join(c if isinstance(c, str) else _st.where(c)
                            for c in report["await_chain"])
        end = "ended at %s, awaiting: %s" % (_st.where(report["ended"]), chain)
    else:
        end = "ended with the task %s, at %s" % (report["state"], _st.where(report["ended"]))
    logger.warning("Slow callback: %.3f s in a step of %s that started at %s and %s%s",
                   duration, _task_text(report), _st.where(report["started"]), end, suffix,
                   extra={"tideloop_slow_callback": report})


# -- the environment ----------------------------------------------------------

_FORMS = ("timing, slow=SECONDS, stalls=SECONDS, tasks, tasks=origins, leaks, "
          "leaks=SECONDS, serve")
_NAMES = ("timing", "slow", "stalls", "tasks", "leaks", "serve")
_warned = set()


def _bad_setting(item, why):
    """Warn once per item and process; the program runs on without it."""
    if item in _warned:
        return
    _warned.add(item)
    logger.warning("TIDELOOP_DIAGNOSTICS: ignoring %r: %s (accepted, comma-separated: %s)",
                   item, why, _FORMS)


def _seconds(value):
    seconds = float(value)
    if not 0 < seconds <= 86400:
        raise ValueError("not a number of seconds above 0 and at most a day")
    return seconds


def _apply(loop, name, value):
    if name == "timing" and not value:
        set_callback_timing(True, loop)
    elif name == "tasks" and value in ("", "origins"):
        track_tasks(True, origins=value == "origins", loop=loop)
    elif name == "slow" and value:
        report_slow_callbacks(_seconds(value), loop)
    elif name == "stalls" and value:
        watch_stalls(_seconds(value), loop)
    elif name == "leaks":
        _diag_tasks.report_leaks_at_close(loop, _seconds(value) if value else 60.0)
    elif name == "serve" and not value:
        try:
            serve()
        except OSError as exc:      # the program runs on without the view
            logger.warning("TIDELOOP_DIAGNOSTICS=serve: cannot serve the live view: %s", exc)
    elif name in _NAMES:
        raise ValueError("%s takes %s" % (name, "no value" if value else "a value"))
    else:
        close = difflib.get_close_matches(name, _NAMES, 1)
        raise ValueError("unknown setting%s" % (" (did you mean %r?)" % close[0] if close else ""))


def _from_environment(loop, spec):
    """TIDELOOP_DIAGNOSTICS for each new loop (see the module's doc); a bad
    item is warned of once and left out."""
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, value = item.partition("=")
        try:
            _apply(loop, name.strip(), value.strip())
        except ValueError as exc:
            _bad_setting(item, str(exc).replace("could not convert string to float",
                                                "not a number"))


@atexit.register
def _stop_all():
    # No watchdog thread may outlive the interpreter's finalization.
    for loop in list(_st.watched):
        try:
            loop._set_stall_threshold(None)
        except Exception:   # noqa: BLE001 - exiting anyway
            pass


_core._diag_setup(_capture, _report, _slow, _ASYNCIO_DIR,
                  tuple({asyncio.Task, getattr(asyncio.tasks, "_PyTask", asyncio.Task)}))
