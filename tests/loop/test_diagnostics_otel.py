"""tideloop.diagnostics.OpenTelemetryMetrics (issue 13, part 5): loops'
health as OpenTelemetry observable instruments, stalls and slow callbacks
as spans.

A tideloop-only API.  Read back through opentelemetry-sdk's own in-memory
metric reader and span exporter, on providers passed explicitly (the global
ones are left alone): every value is compared with the loop's snapshot after
known work, every span with a planted fault."""
import os
import socket
import subprocess
import sys
import time

import pytest

from loop_helpers import IN_MAIN_INTERPRETER

if not IN_MAIN_INTERPRETER:
    try:
        import ctypes  # noqa: F401 - opentelemetry-sdk imports it
    except ImportError as exc:  # 3.12: _ctypes does not load in an isolated subinterpreter
        pytest.skip(f"main interpreter only: opentelemetry-sdk imports ctypes ({exc})",
                    allow_module_level=True)
pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter)
from opentelemetry.trace import StatusCode  # noqa: E402

import tideloop  # noqa: E402
from tideloop import diagnostics  # noqa: E402

from .test_diagnostics import (  # noqa: E402 - planted faults, the stack marker
    blocker, needs_stall_stack, slow_inner, slow_outer)
from .test_stats import spin, tl  # noqa: F401,E402 - the tideloop-only fixture and helper

FAULTS = blocker.__code__.co_filename       # where the planted faults' lines are

HISTOGRAMS = ("iteration", "poll", "scheduling_lag", "timer_lateness", "callback")


class Otel:
    """An OpenTelemetryMetrics on its own SDK providers, read back."""

    def __init__(self, loops):
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.metrics = diagnostics.OpenTelemetryMetrics(
            loops, meter_provider=self.meter_provider, tracer_provider=self.tracer_provider)

    def collect(self):
        """{(instrument, frozenset(attributes)): value} of one collection,
        and {instrument: the SDK's metric} for the types and units."""
        values, kinds = {}, {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                assert sm.scope.name == "tideloop"
                for m in sm.metrics:
                    kinds[m.name] = m
                    for p in m.data.data_points:
                        values[(m.name, frozenset(p.attributes.items()))] = p.value
        return values, kinds

    def spans(self, name=None):
        return [s for s in self.exporter.get_finished_spans() if name in (None, s.name)]

    def close(self):
        self.metrics.close()
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()


@pytest.fixture
def otel(tl):
    o = Otel({"main": tl})
    yield o
    o.close()
    diagnostics.stop_watching_stalls(tl)


def value(values, name, loop="main", **attrs):
    return values[(name, frozenset(dict(attrs, loop=loop).items()))]


def test_counters_and_gauges_are_the_loops_own(tl, otel):
    for _ in range(5):
        tl.call_soon(int)
    tl.call_at(tl.time() - 0.01, int)           # a timer that fires late
    spin(tl, 2)
    for delay in (100, 200, 300):
        tl.call_later(delay, int)               # three timers pending
    a, b = socket.socketpair()
    tl.add_reader(a, int)
    try:
        values, kinds = otel.collect()
        d = tl.diagnostics()
    finally:
        tl.remove_reader(a)
        a.close()
        b.close()
    assert value(values, "tideloop.loop.iterations") == d["iterations"] == 2
    assert value(values, "tideloop.loop.callbacks") == d["callbacks"] == 8   # 5 + timer + 2 stops
    assert value(values, "tideloop.loop.timers_fired") == d["timers_fired"] == 1
    for key in ("polls", "io_events", "slow_callbacks"):
        assert value(values, "tideloop.loop." + key) == d[key], key
    assert value(values, "tideloop.loop.stalls") == 0
    assert value(values, "tideloop.loop.time", state="running") == d["time_running"] > 0
    assert value(values, "tideloop.loop.time", state="polling") == d["time_polling"]
    assert value(values, "tideloop.loop.timers") == d["timers"] == 3
    assert value(values, "tideloop.loop.fds") == d["fds"] == 1
    assert value(values, "tideloop.loop.ready") == d["ready"] == 0
    for name in HISTOGRAMS:
        h = d["histograms"][name]
        assert value(values, "tideloop.loop.%s.count" % name) == sum(h["counts"]), name
        assert value(values, "tideloop.loop.%s.sum" % name) == h["sum"], name
    assert value(values, "tideloop.loop.iteration.count") == 2
    # the instrument kinds and units the docstring promises
    cb, ready, p99 = (kinds[n] for n in ("tideloop.loop.callbacks", "tideloop.loop.ready",
                                          "tideloop.loop.iteration.p99"))
    assert type(cb.data).__name__ == "Sum" and cb.data.is_monotonic and cb.unit == "{callback}"
    assert type(ready.data).__name__ == "Sum" and not ready.data.is_monotonic
    assert type(p99.data).__name__ == "Gauge" and p99.unit == "s"
    assert kinds["tideloop.loop.time"].unit == "s"


def test_every_collection_reads_anew_and_agrees_with_itself(tl, otel):
    spin(tl, 3)
    first, _ = otel.collect()
    spin(tl, 4)
    second, _ = otel.collect()
    assert value(first, "tideloop.loop.iterations") == 3
    assert value(second, "tideloop.loop.iterations") == 7
    for values in (first, second):      # one snapshot per collection
        assert (value(values, "tideloop.loop.iteration.count")
                == value(values, "tideloop.loop.iterations"))
        assert (value(values, "tideloop.loop.iteration.sum")
                == value(values, "tideloop.loop.time", state="running"))


def test_percentiles_cover_the_time_since_the_previous_collection(tl, otel):
    tl.call_soon(time.sleep, 0.1)
    spin(tl)                                    # one 0.1 s iteration
    values, _ = otel.collect()
    assert value(values, "tideloop.loop.iteration.p50") >= 0.1
    assert value(values, "tideloop.loop.iteration.p99") >= 0.1
    spin(tl, 5)                                 # five short ones
    values, _ = otel.collect()
    assert value(values, "tideloop.loop.iteration.p99") < 0.05     # the slow one is gone
    assert value(values, "tideloop.loop.iteration.sum") >= 0.1     # the sum is cumulative
    assert value(values, "tideloop.loop.iteration.count") == 6
    values, _ = otel.collect()                  # nothing ran since: no percentile
    assert ("tideloop.loop.iteration.p99", frozenset({("loop", "main")})) not in values
    assert value(values, "tideloop.loop.iteration.count") == 6
    tl.call_soon(time.sleep, 0.1)
    spin(tl)
    diagnostics.reset(tl)                       # the window starts at the reset
    spin(tl)
    values, _ = otel.collect()
    assert value(values, "tideloop.loop.iteration.count") == 1
    assert value(values, "tideloop.loop.iteration.p99") < 0.05


BLOCKING_LINE = blocker.__code__.co_firstlineno + 1        # time.sleep(0.2)


@needs_stall_stack
def test_a_stall_is_a_span_on_the_line_that_blocked(tl, otel):
    diagnostics.watch_stalls(0.05, tl)
    tl.call_soon(blocker)
    t0 = time.time_ns()
    spin(tl)
    t1 = time.time_ns()
    [report] = diagnostics.stalls(tl)
    [span] = otel.spans()
    assert span.name == "tideloop.stall" and span.parent is None
    took = (span.end_time - span.start_time) / 1e9
    assert took == pytest.approx(report["duration"], abs=1e-6)
    assert 0.15 <= took < 1.0
    # the watchdog dates a stall's start to within half its period (an
    # eighth of the threshold): the middle of the check interval it began in
    assert t0 - 0.05 / 8 * 1e9 <= span.start_time < span.end_time <= t1
    a = span.attributes
    assert a["loop"] == "main" and "blocker()" in a["tideloop.callback"]
    assert a["tideloop.duration"] == report["duration"]
    assert (a["code.file.path"], a["code.line.number"], a["code.function.name"]) == (
        FAULTS, BLOCKING_LINE, "blocker")
    assert a["tideloop.blocked_at"] == "%s:%d in blocker: time.sleep(0.2)" % (
        FAULTS, BLOCKING_LINE)
    assert a["code.stacktrace"].rstrip().endswith("time.sleep(0.2)")
    assert span.status.status_code is StatusCode.ERROR
    assert "blocked for" in span.status.description
    [event] = span.events
    assert event.name == "tideloop.stack_captured"
    assert event.timestamp == span.start_time + int(report["capture_delay"] * 1e9)
    assert span.start_time < event.timestamp < span.end_time
    values, _ = otel.collect()
    assert value(values, "tideloop.loop.stalls") == 1


def test_a_slow_task_step_is_a_span_naming_the_task(tl, otel):
    diagnostics.report_slow_callbacks(0.03, tl)
    first = slow_inner.__code__.co_firstlineno

    async def main():
        await tl.create_task(slow_outer(), name="worker")

    tl.run_until_complete(main())
    [report] = diagnostics.slow_callbacks(tl)
    [span] = otel.spans()
    assert span.name == "tideloop.slow_callback"
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(report["duration"], abs=1e-6)
    a = span.attributes
    assert a["loop"] == "main" and a["tideloop.task"] == "worker"
    assert a["tideloop.coroutine"] == "slow_outer"
    assert a["tideloop.step.started"] == "slow_inner (%s:%d)" % (FAULTS, first + 1)
    assert a["tideloop.step.ended"] == "slow_inner (%s:%d)" % (FAULTS, first + 3)
    assert a["tideloop.await_chain"].startswith("slow_outer (%s:%d) -> slow_inner (%s:%d)" % (
        FAULTS, slow_outer.__code__.co_firstlineno + 1, FAULTS, first + 3))
    assert span.status.status_code is StatusCode.ERROR and "'worker'" in span.status.description
    values, _ = otel.collect()
    assert value(values, "tideloop.loop.slow_callbacks") == 1


def test_only_the_given_loops_make_spans(tl, otel):
    other = tideloop.new_event_loop()
    try:
        diagnostics.watch_stalls(0.05, other)
        other.call_soon(time.sleep, 0.1)
        spin(other)
        assert len(diagnostics.stalls(other)) == 1
    finally:
        other.close()
    assert otel.spans() == []
    values, _ = otel.collect()
    assert {labels for _, labels in values} <= {frozenset({("loop", "main")}),
                                                frozenset({("loop", "main"), ("state", "polling")}),
                                                frozenset({("loop", "main"), ("state", "running")})}


def test_after_close_no_spans_and_no_measurements(tl, otel):
    diagnostics.watch_stalls(0.05, tl)
    diagnostics.report_slow_callbacks(0.03, tl)
    otel.metrics.close()
    tl.call_soon(time.sleep, 0.1)
    spin(tl)
    assert len(diagnostics.stalls(tl)) == len(diagnostics.slow_callbacks(tl)) == 1
    assert otel.spans() == []
    values, _ = otel.collect()
    assert values == {}


def test_all_loops_when_none_are_given():
    a, b = tideloop.new_event_loop(), tideloop.new_event_loop()
    o = Otel(None)
    try:
        spin(a, 2)
        spin(b, 5)
        values, _ = o.collect()
        iterations = {dict(labels)["loop"]: v for (name, labels), v in values.items()
                      if name == "tideloop.loop.iterations"}
        labels = [lb for lb, v in iterations.items() if v in (2, 5)]
        assert sorted(iterations[lb] for lb in labels) == [2, 5]
        label_b = next(lb for lb in labels if iterations[lb] == 5)
        assert label_b.startswith("loop-")
        diagnostics.watch_stalls(0.05, b)
        b.call_soon(time.sleep, 0.1)
        spin(b)
        [span] = o.spans()
        assert span.attributes["loop"] == label_b       # the same label as the metrics'
        b.close()
        values, _ = o.collect()
        assert ("tideloop.loop.iterations", frozenset({("loop", label_b)})) not in values
        assert value(values, "tideloop.loop.iterations",
                     loop=next(lb for lb in labels if lb != label_b)) == 2
    finally:
        o.close()
        a.close()
        b.close()


def test_only_the_api_is_imported():
    """tideloop[otel] needs opentelemetry-api alone: nothing of the SDK is
    imported, and importing tideloop.diagnostics imports no opentelemetry."""
    code = """if 1:
        import sys
        import tideloop
        from tideloop import diagnostics
        assert not [m for m in sys.modules if m.startswith("opentelemetry")]
        loop = tideloop.new_event_loop()
        m = diagnostics.OpenTelemetryMetrics({"main": loop})     # the global no-op providers
        m.close()
        loop.close()
        assert "opentelemetry.metrics" in sys.modules
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")))
    """
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tideloop.__file__)))
    env.pop("TIDELOOP_DIAGNOSTICS", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
