"""tideloop.diagnostics.OpenTelemetryMetrics: loops' health as OpenTelemetry
observable instruments, stalls and slow callbacks as spans.

Only ``opentelemetry-api`` is used (``pip install tideloop[otel]``); the
application brings the SDK and its exporters.  Imported by
tideloop.diagnostics; it reads the shared diagnostics state
(``_diag_state``) and imports no module that imports it (the
``opentelemetry`` imports happen in the constructor)."""
from __future__ import annotations

import itertools
import threading
import time
import traceback
import weakref

from . import _diag_state as _diag

# counter -> (unit, description)
_COUNTERS = {
    "iterations": ("{iteration}", "loop iterations"),
    "polls": ("{poll}", "calls to the poller"),
    "callbacks": ("{callback}", "callbacks run"),
    "io_events": ("{event}", "I/O events dispatched"),
    "timers_fired": ("{timer}", "timers that fired"),
    "slow_callbacks": ("{callback}", "callbacks over the slow-callback threshold"),
}
_GAUGES = {
    "ready": ("{callback}", "callbacks queued"),
    "timers": ("{timer}", "timers scheduled"),
    "fds": ("{fd}", "file descriptors watched"),
}
# histogram -> (unit of its count, what one entry is)
_HISTOGRAMS = {
    "iteration": ("{iteration}", "one loop iteration, without the poller's sleep"),
    "poll": ("{poll}", "one blocking poll"),
    "scheduling_lag": ("{batch}", "how long a batch's oldest callback waited to run"),
    "timer_lateness": ("{timer}", "a timer's delay from its deadline to being queued"),
    "callback": ("{callback}", "one callback (only while callback timing is on)"),
}
_QUANTILES = (("p50", "median"), ("p90", "90th percentile"), ("p99", "99th percentile"))

_ids = weakref.WeakKeyDictionary()      # loop -> "loop-N" (loops=None)
_next_id = itertools.count(1)
_ids_lock = threading.Lock()


def _auto_label(loop):
    with _ids_lock:
        label = _ids.get(loop)
        if label is None:
            label = _ids[loop] = "loop-%d" % next(_next_id)
        return label


class OpenTelemetryMetrics:
    """Loops' health for OpenTelemetry (``pip install tideloop[otel]``:
    ``opentelemetry-api`` only; bring your own SDK and exporter)::

        otel = tideloop.diagnostics.OpenTelemetryMetrics({"main": loop})
        ...
        otel.close()

    ``loops``: {label: loop} (the ``loop`` attribute of every measurement
    and span), or None for every open tideloop loop at each collection
    (:func:`loops`), labelled ``loop-1``, ``loop-2``, ... in the order this
    process first saw them.  ``meter_provider``/``tracer_provider``: the
    global ones when None.  Create one per meter provider.

    Metrics (observable instruments of the meter ``tideloop``): one
    snapshot per loop per collection, shared by all the instruments, so
    the values of one export agree with each other.

    - ObservableCounter: ``tideloop.loop.<counter>`` for ``iterations``,
      ``polls``, ``callbacks``, ``io_events``, ``timers_fired``,
      ``slow_callbacks``; ``tideloop.loop.stalls`` (stalls reported);
      ``tideloop.loop.time`` (s) with attribute ``state`` = ``polling``
      (blocked in the poller) or ``running`` (the rest of each iteration).
    - ObservableUpDownCounter (OpenTelemetry's instrument for a count of
      queued things, which sums across loops): ``tideloop.loop.ready``,
      ``tideloop.loop.timers``, ``tideloop.loop.fds``.
    - The five histograms (``iteration``, ``poll``, ``scheduling_lag``,
      ``timer_lateness``, ``callback``): OpenTelemetry has no observable
      histogram, and the loop keeps bucket counts, not values, so no
      histogram is made up from them.  Instead, ObservableCounters
      ``tideloop.loop.<histogram>.count`` and ``.sum`` (s), exact and
      cumulative (a rate of one over the other is the mean), and
      ObservableGauges ``tideloop.loop.<histogram>.p50``, ``.p90`` and
      ``.p99`` (s): the percentiles of the entries recorded since the
      previous collection (by any reader of the provider: with one
      periodic reader, over its export interval), as :func:`summary`
      computes them (the upper bound of the bucket, capped by the maximum
      since the loop's last reset).  A window with no entries has no
      value; after :func:`reset` the window starts at the reset.

    Spans (tracer ``tideloop``): every stall (:func:`watch_stalls`) and
    slow callback (:func:`report_slow_callbacks`) of these loops becomes a
    root span, ``tideloop.stall`` or ``tideloop.slow_callback``, ending
    when the callback returned and starting ``duration`` before (for a
    stall, the watchdog's estimate: within an eighth of the threshold), with
    status ERROR, so that a trace view shows when and for how long the loop
    was blocked.  Attributes: ``loop``, ``tideloop.callback``,
    ``tideloop.duration`` (s); for a stall, the line it was blocked on
    (``tideloop.blocked_at``: "file:line in function: source", and
    ``code.function.name``, ``code.file.path``, ``code.line.number``),
    the whole stack (``code.stacktrace``), and an event
    ``tideloop.stack_captured`` at the watchdog's capture; for a Task's
    step, ``tideloop.task``, ``tideloop.coroutine``,
    ``tideloop.step.started``/``.ended`` and ``tideloop.await_chain``.

    :meth:`close` stops both: no more spans, and the instruments observe
    nothing (the API cannot unregister them)."""

    def __init__(self, loops=None, *, meter_provider=None, tracer_provider=None):
        from opentelemetry import context, metrics, trace
        from opentelemetry.trace import Status, StatusCode

        from ._version import __version__

        if loops is None:
            self._loops = None
        else:
            self._loops = dict(loops)
            for loop in self._loops.values():
                _diag.check_loop(loop)
            self._labels = {loop: label for label, loop in self._loops.items()}
        if meter_provider is None:
            meter_provider = metrics.get_meter_provider()
        if tracer_provider is None:
            tracer_provider = trace.get_tracer_provider()
        self._Observation = metrics.Observation
        self._Status, self._StatusCode, self._Context = Status, StatusCode, context.Context
        self._tracer = tracer_provider.get_tracer("tideloop", __version__)
        meter = meter_provider.get_meter("tideloop", __version__)

        self._lock = threading.Lock()
        self._closed = False
        self._snaps = None              # this round: [(label, snapshot, stalls, window)]
        self._served = set()            # instruments that read this round
        self._prev = weakref.WeakKeyDictionary()    # loop -> the previous round's snapshot

        def observe(name, values):
            # values(snapshot, stalls, window) -> [(value, extra attributes)]
            def callback(options):
                return [self._Observation(v, dict(attrs, loop=label))
                        for label, d, stalls, window in self._round(name)
                        for v, attrs in values(d, stalls, window)]
            return [callback]

        def counter(key):
            return lambda d, stalls, window: [(d[key], {})]

        for key, (unit, text) in _COUNTERS.items():
            meter.create_observable_counter("tideloop.loop." + key, observe(key, counter(key)),
                                            unit=unit, description=text)
        meter.create_observable_counter(
            "tideloop.loop.stalls", observe("stalls", lambda d, stalls, window: [(stalls, {})]),
            unit="{stall}", description="stalls reported by the watchdog")
        meter.create_observable_counter(
            "tideloop.loop.time",
            observe("time", lambda d, stalls, window: [(d["time_polling"], {"state": "polling"}),
                                                       (d["time_running"], {"state": "running"})]),
            unit="s", description="time in loop iterations: blocked in the poller (polling) "
                                  "or not (running)")
        for key, (unit, text) in _GAUGES.items():
            meter.create_observable_up_down_counter("tideloop.loop." + key,
                                                    observe(key, counter(key)),
                                                    unit=unit, description=text)
        for name, (unit, text) in _HISTOGRAMS.items():
            base = "tideloop.loop." + name
            meter.create_observable_counter(
                base + ".count",
                observe(base + ".count", lambda d, stalls, window, name=name:
                        [(sum(d["histograms"][name]["counts"]), {})]),
                unit=unit, description="entries in the %s histogram: %s" % (name, text))
            meter.create_observable_counter(
                base + ".sum",
                observe(base + ".sum", lambda d, stalls, window, name=name:
                        [(d["histograms"][name]["sum"], {})]),
                unit="s", description="total of the %s histogram: %s" % (name, text))
            for q, qtext in _QUANTILES:
                def quantile(d, stalls, window, name=name, q=q):
                    s = window[name]
                    return [(s[q], {})] if s["count"] else []
                meter.create_observable_gauge(
                    "%s.%s" % (base, q), observe("%s.%s" % (base, q), quantile), unit="s",
                    description="%s of the %s histogram (%s) since the previous collection"
                                % (qtext, name, text))

        _diag.subscribe(self._on_report)

    # -- metrics ------------------------------------------------------------

    def _round(self, instrument):
        """This collection's snapshots: a new round when this instrument has
        already read the current one (or there is none)."""
        with self._lock:
            if self._closed:
                return []
            if self._snaps is None or instrument in self._served:
                self._take()
            self._served.add(instrument)
            return self._snaps

    def _take(self):
        if self._loops is None:
            pairs = [(_auto_label(loop), loop) for loop in _diag.loops()]
        else:
            pairs = list(self._loops.items())
        snaps = []
        for label, loop in pairs:
            d = loop._diagnostics()
            prev = self._prev.get(loop)
            try:
                window = _diag.diff(prev, d) if prev is not None else d
            except ValueError:          # reset since: the window starts there
                window = d
            self._prev[loop] = d
            snaps.append((label, d, _diag.stall_totals.get(loop, 0),
                          {name: _diag.summary(window["histograms"][name])
                           for name in _HISTOGRAMS}))
        self._snaps, self._served = snaps, set()

    # -- spans --------------------------------------------------------------

    def _label(self, loop):
        if self._loops is None:
            return _auto_label(loop)
        return self._labels.get(loop)

    def _on_report(self, kind, loop, report):
        """A diagnostics subscriber (the loop's thread, right after the
        callback returned)."""
        if self._closed or kind not in ("stall", "slow_callback"):
            return
        label = self._label(loop)
        if label is None:
            return
        end = time.time_ns()
        duration = report["duration"]
        start = end - int(duration * 1e9)
        attrs = {"loop": label, "tideloop.callback": report["callback"],
                 "tideloop.duration": duration}
        event = None
        if kind == "stall":
            what = "event loop blocked for %.3f s in %s" % (duration, report["callback"])
            if report.get("task") is not None:      # one span for the stall and slow step
                what = "event loop blocked for %.3f s in task %r (%s)" % (
                    duration, report["task"], report["coroutine"])
                attrs.update({"tideloop.task": report["task"],
                              "tideloop.coroutine": report["coroutine"]})
            stack = report.get("stack")
            if stack:
                filename, lineno, function, line = report.get("blocked_at") or stack[-1]
                attrs.update({
                    "tideloop.blocked_at": "%s:%d in %s: %s" % (filename, lineno, function,
                                                                 line or ""),
                    "code.function.name": function, "code.file.path": filename,
                    "code.line.number": lineno,
                    "code.stacktrace": "".join(traceback.format_list(stack))})
            delay = report.get("capture_delay")
            if delay is not None:
                event = ("tideloop.stack_captured", {"tideloop.capture_delay": delay},
                         start + int(delay * 1e9))
        else:
            what = "slow callback: %.3f s in %s" % (duration, report["callback"])
            if "task" in report:
                what = "slow callback: %.3f s in a step of task %r (%s)" % (
                    duration, report["task"], report["coroutine"])
                attrs.update({
                    "tideloop.task": report["task"],
                    "tideloop.coroutine": report["coroutine"],
                    "tideloop.step.started": _diag.where(report["started"]),
                    "tideloop.step.ended": _diag.where(report["ended"]),
                    "tideloop.await_chain": " -> ".join(
                        c if isinstance(c, str) else _diag.where(c)
                        for c in report["await_chain"])})
        span = self._tracer.start_span("tideloop." + kind, context=self._Context(),
                                       start_time=start, attributes=attrs)
        span.set_status(self._Status(self._StatusCode.ERROR, what))
        if event is not None:
            span.add_event(event[0], event[1], timestamp=event[2])
        span.end(end_time=end)

    def close(self):
        """No more spans; the instruments observe nothing from now on."""
        _diag.unsubscribe(self._on_report)
        with self._lock:
            self._closed = True
            self._snaps = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
