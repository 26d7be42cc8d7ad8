"""tideloop.diagnostics / loop.diagnostics(): the loop's health (issue 13).

A tideloop-only API (the stock loop keeps none of this), so these tests run
on tideloop alone.  Each figure is checked against a fault planted for it:
a blocking poll of known length, a timer queued late, a callback that
blocks while another waits behind it, a callback of known duration; each
histogram's one entry must sit in the bucket that holds its exact value."""
import asyncio
import re
import sys
import threading
import time

import pytest

import tideloop
from tideloop import _core
from tideloop import diagnostics
from tideloop import _diag_state

from .test_stats import spin, tl  # noqa: F401 - the tideloop-only fixture and helper

# A subinterpreter of a free-threaded 3.13 gives stall reports no stack
# (_diag_state.STALL_STACKS): the tests that read one skip there.
needs_stall_stack = pytest.mark.skipif(
    not _diag_state.STALL_STACKS,
    reason="no stall stacks in a subinterpreter of a free-threaded 3.13")

HISTOGRAMS = ("iteration", "poll", "scheduling_lag", "timer_lateness", "callback")
COUNTERS = ("iterations", "polls", "callbacks", "io_events", "timers_fired",
            "slow_callbacks")


def only_bucket(hist):
    """The index of the one non-empty bucket (asserting there is one)."""
    nonzero = [i for i, c in enumerate(hist["counts"]) if c]
    assert len(nonzero) == 1 and hist["counts"][nonzero[0]] == 1, hist
    return nonzero[0]


def holds(i, value):
    """Bucket i's range holds value (the bounds are its lower edges)."""
    bounds = diagnostics.HISTOGRAM_BOUNDS
    return bounds[i] <= value and (i + 1 == len(bounds) or value < bounds[i + 1])


def test_a_new_loop_has_done_nothing(tl):
    d = tl.diagnostics()
    assert d == diagnostics.snapshot(tl) | {"since": d["since"]}
    for k in COUNTERS:
        assert d[k] == 0 and type(d[k]) is int, k
    assert d["time_polling"] == d["time_running"] == 0.0
    assert (d["ready"], d["timers"], d["fds"]) == (0, 0, 0)
    assert d["callback_timing"] is False
    assert set(d["histograms"]) == set(HISTOGRAMS)
    for h in d["histograms"].values():
        assert h == {"counts": [0] * 64, "sum": 0.0, "max": 0.0}
    assert d["since"] <= tl.time()


def test_bounds_are_log_buckets():
    b = diagnostics.HISTOGRAM_BOUNDS
    assert len(b) == 64 and b[0] == 0.0 and b[1] == 1024e-9
    assert all(x < y for x, y in zip(b, b[1:]))
    # two buckets per power of two: every second bound doubles
    assert all(abs(b[i + 2] / b[i] - 2) < 1e-12 for i in range(1, 62))


def test_every_iteration_is_counted_and_timed(tl):
    spin(tl, 7)
    d = tl.diagnostics()
    assert d["iterations"] == 7
    assert sum(d["histograms"]["iteration"]["counts"]) == 7
    assert d["time_running"] == pytest.approx(d["histograms"]["iteration"]["sum"])
    assert d["callbacks"] == 7          # the loop.stop calls


def test_a_blocking_poll(tl):
    # The timer is set from inside the loop, so the poll waits all 50 ms: set
    # before run_forever(), its start-up (6 ms in a loaded CI run) came off
    # the wait.
    tl.call_soon(tl.call_later, 0.05, tl.stop)
    t0 = time.monotonic()
    tl.run_forever()
    d = tl.diagnostics()
    poll = d["histograms"]["poll"]
    i = only_bucket(poll)
    assert holds(i, poll["max"]) and poll["sum"] == poll["max"]
    assert 0.045 <= poll["max"] <= time.monotonic() - t0
    assert d["time_polling"] == poll["sum"]


def test_timer_lateness(tl):
    """A timer whose deadline passed 0.2 s before the loop got to it."""
    tl.call_at(tl.time() - 0.2, int)
    spin(tl)
    late = tl.diagnostics()["histograms"]["timer_lateness"]
    i = only_bucket(late)
    assert holds(i, late["max"]) and 0.2 <= late["max"] < 0.3
    assert tl.diagnostics()["timers_fired"] == 1


def test_scheduling_lag(tl):
    """A callback queued behind one that blocks for 50 ms waits that long."""
    def blocker():
        tl.call_soon(tl.stop)       # queued now, runs in the next batch
        time.sleep(0.05)

    tl.call_soon(blocker)
    tideloop.diagnostics.reset(tl)
    tl.run_forever()
    lag = tl.diagnostics()["histograms"]["scheduling_lag"]
    assert sum(lag["counts"]) == 2
    assert 0.05 <= lag["max"] < 0.2
    slow = max(i for i, c in enumerate(lag["counts"]) if c)
    assert holds(slow, lag["max"])


def test_callback_timing(tl):
    tl.call_soon(time.sleep, 0.02)
    spin(tl)
    assert tl.diagnostics()["histograms"]["callback"]["counts"] == [0] * 64  # off
    assert diagnostics.set_callback_timing(True, tl) is False
    diagnostics.reset(tl)
    tl.call_soon(time.sleep, 0.02)
    h = tl.call_soon(int)
    h.cancel()                      # a cancelled one is not a callback run
    spin(tl)
    d = tl.diagnostics()
    cb = d["histograms"]["callback"]
    assert d["callback_timing"] is True
    assert sum(cb["counts"]) == d["callbacks"] == 2     # the sleep, loop.stop
    assert 0.02 <= cb["max"] < 0.1
    assert holds(max(i for i, c in enumerate(cb["counts"]) if c), cb["max"])
    assert diagnostics.set_callback_timing(False, tl) is True


def test_callback_timing_after_calibration(tl):
    """Callbacks are timed with the CPU's tick counter once its rate was
    measured against the clock (50 ms after timing was turned on): a 20 ms
    callback still lands in the bucket of its length."""
    diagnostics.set_callback_timing(True, tl)
    tl.call_later(0.06, tl.stop)
    tl.run_forever()                        # 60 ms: the rate is measured
    spin(tl)
    diagnostics.reset(tl)
    tl.call_soon(time.sleep, 0.02)
    t0 = time.monotonic()
    spin(tl)
    took = time.monotonic() - t0
    cb = tl.diagnostics()["histograms"]["callback"]
    assert sum(cb["counts"]) == 2
    assert 0.02 <= cb["max"] <= took * 1.05
    assert holds(max(i for i, c in enumerate(cb["counts"]) if c), cb["max"])


def test_reset(tl):
    spin(tl, 3)
    since = tl.diagnostics()["since"]
    diagnostics.report_slow_callbacks(0.03, tl)
    diagnostics.reset(tl)
    d = tl.diagnostics()
    assert d["iterations"] == 0 and d["since"] > since
    assert all(h["counts"] == [0] * 64 for h in d["histograms"].values())
    # the settings stay: the slow-callback threshold still reports
    assert d["callback_timing"] is True
    tl.call_soon(time.sleep, 0.05)
    spin(tl)
    assert len(diagnostics.slow_callbacks(tl)) == 1


def test_diff(tl):
    spin(tl, 2)
    before = diagnostics.snapshot(tl)
    tl.call_at(tl.time() - 0.01, int)
    spin(tl, 3)
    after = diagnostics.snapshot(tl)
    d = diagnostics.diff(before, after)
    assert d["iterations"] == 3 and d["timers_fired"] == 1
    assert sum(d["histograms"]["iteration"]["counts"]) == 3
    assert sum(d["histograms"]["timer_lateness"]["counts"]) == 1
    assert d["time_running"] == pytest.approx(after["time_running"] - before["time_running"])
    diagnostics.reset(tl)
    with pytest.raises(ValueError, match="reset"):
        diagnostics.diff(after, diagnostics.snapshot(tl))


def test_summary():
    b = diagnostics.HISTOGRAM_BOUNDS
    counts = [0] * 64
    counts[5], counts[20] = 98, 2          # 98 small values, 2 large ones
    hist = {"counts": counts, "sum": 1.0, "max": b[20] * 1.1}
    s = diagnostics.summary(hist)
    assert s["count"] == 100 and s["mean"] == 0.01
    assert s["p50"] == s["p90"] == b[6]    # the upper edge of bucket 5
    assert s["p99"] == b[20] * 1.1         # bucket 20's edge, capped by max
    assert diagnostics.summary({"counts": [0] * 64, "sum": 0.0, "max": 0.0})["p99"] == 0.0


def test_snapshot_needs_a_tideloop_loop():
    loop = asyncio.SelectorEventLoop()
    try:
        with pytest.raises(TypeError, match="tideloop"):
            diagnostics.snapshot(loop)
    finally:
        loop.close()
    with pytest.raises(RuntimeError):       # no running loop
        diagnostics.snapshot()


def test_snapshot_of_the_running_loop(tl):
    async def main():
        return diagnostics.snapshot()["iterations"]

    assert tl.run_until_complete(main()) >= 1


def test_reads_from_another_thread(tl):
    """A scrape thread reads while the loop runs flat out: every snapshot is
    whole (its histograms' counts never go down, nor its counters)."""
    diagnostics.set_callback_timing(True, tl)
    done = threading.Event()
    seen, errors = [], []

    def scrape():
        try:
            while not done.is_set():
                d = diagnostics.snapshot(tl)
                seen.append((d["callbacks"], sum(d["histograms"]["callback"]["counts"]),
                             sum(d["histograms"]["iteration"]["counts"])))
        except BaseException as e:       # noqa: BLE001 - reported below
            errors.append(e)

    async def busy():
        for _ in range(20000):
            await asyncio.sleep(0)

    th = threading.Thread(target=scrape)
    th.start()
    try:
        tl.run_until_complete(busy())
    finally:
        done.set()
        th.join()
    assert not errors
    assert len(seen) > 10
    for a, b in zip(seen, seen[1:]):
        assert all(y >= x for x, y in zip(a, b)), (a, b)


# -- stalls (the watchdog) ---------------------------------------------------

def threads():
    """The process's stall watchdog threads (C threads, named by tideloop)."""
    import glob
    names = []
    for comm in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(comm) as f:
                names.append(f.read().strip())
        except OSError:         # a thread that just ended
            pass
    return names.count("tideloop-watch")


def blocker():
    time.sleep(0.2)


def long_blocker():
    # The stack is taken while the stall goes on: the watchdog thread needs
    # the CPU and the GIL before it ends, which a loaded machine (CI's, with
    # memcheck beside the suite) delayed past 0.2 s.
    time.sleep(1.0)


@needs_stall_stack
def test_a_blocking_callback_is_caught_with_its_line(tl, caplog):
    before = threads()
    assert diagnostics.watch_stalls(0.05, tl) is None
    assert threads() == before + 1
    tl.call_soon(long_blocker)
    with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
        spin(tl)
    [report] = diagnostics.stalls(tl)
    assert 0.95 <= report["duration"] < 5.0
    assert "long_blocker()" in report["callback"]
    filename, lineno, func, line = report["stack"][-1]
    assert (func, line) == ("long_blocker", "time.sleep(1.0)")
    assert filename == __file__
    assert 0 <= report["capture_delay"] < report["duration"]
    [record] = [r for r in caplog.records if r.name == "tideloop.diagnostics"]
    assert record.tideloop_stall is report
    assert "Event loop blocked for" in record.getMessage()
    assert "time.sleep(1.0)" in record.getMessage()
    assert diagnostics.stop_watching_stalls(tl) == pytest.approx(0.05)
    assert threads() == before


async def spinner(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@needs_stall_stack
def test_a_cpu_bound_task_step_is_caught(tl):
    diagnostics.watch_stalls(0.05, tl)

    async def main():
        await asyncio.sleep(0)
        # long past the threshold: on a loaded machine the watchdog thread
        # may wait a while for a CPU before it sees the stall and captures
        await spinner(0.6)

    tl.run_until_complete(main())
    # The spinning step's report; a loaded machine that stops the process
    # for 50 ms elsewhere (start-up, another step) may add one of its own.
    reports = [r for r in diagnostics.stalls(tl)
               if r["stack"] and r["stack"][-1][2] == "spinner"]
    assert len(reports) == 1, diagnostics.stalls(tl)
    [report] = reports
    assert report["callback"].startswith("<Task ") and "main()" in report["callback"]
    assert report["stack"][-2][2] == "main"         # spinner on its while or pass line
    assert 0.5 <= report["duration"] < 5.0


def sum_size(seconds):
    """How long a range sum() takes for `seconds` (C code: no GIL release,
    no eval-breaker check inside)."""
    n, best = 2 * 10 ** 6, float("inf")
    for _ in range(3):          # the fastest of three: a busy machine slows some
        t = time.perf_counter()
        sum(range(n))
        best = min(best, time.perf_counter() - t)
    return int(n * seconds / max(best, 1e-6))


def gil_holder(n):
    sum(range(n))               # C code holds the GIL for the whole stall
    after_the_c_call = [n]      # a capture after the stall would be here or later
    return after_the_c_call


@pytest.mark.main_interpreter(
    "a stack taken while C code holds the GIL needs faulthandler's signal, which a "
    "subinterpreter has not (there the capture waits for the GIL)")
def test_c_code_holding_the_gil_is_caught_on_its_line(tl, caplog):
    diagnostics.watch_stalls(0.05, tl)
    n = sum_size(0.6)     # at least 0.15 s even if measured on a busy machine
    tl.call_soon(gil_holder, n)
    tl.call_soon(sum, range(n))         # a C callback: no Python frame of its own
    with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
        spin(tl)
    first, second = diagnostics.stalls(tl)
    line = gil_holder.__code__.co_firstlineno + 1
    assert first["stack"][-1][:3] == (__file__, line, "gil_holder")
    assert first["stack"][-1][3].startswith("sum(range(n))")
    assert first["duration"] >= 0.15
    # taken during the stall, not when the GIL came back
    assert first["capture_delay"] < first["duration"] - 0.05
    if sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True:
        assert first["captured_by"] == second["captured_by"] == "signal"
        assert "by signal: C code held the GIL" in caplog.records[0].getMessage()
    # the C callback's stall is reported too, with the frames under it
    assert "sum(" in second["callback"] and second["duration"] >= 0.15
    assert second["stack"][-1][2] == "spin"
    assert second["capture_delay"] < second["duration"] - 0.05


@pytest.mark.main_interpreter("faulthandler: it does not load in a subinterpreter")
def test_no_signal_once_faulthandler_lets_go_of_it(tl):
    # The default action of the real-time signal would end the process.
    import faulthandler
    diagnostics.watch_stalls(0.05, tl)
    signum = diagnostics._dump_signal()
    assert signum and faulthandler.unregister(signum)
    try:
        tl.call_soon(gil_holder, sum_size(0.2))
        spin(tl)
        [report] = diagnostics.stalls(tl)
        assert report["captured_by"] != "signal"
    finally:
        faulthandler.register(signum, file=diagnostics._dump[1], all_threads=False,
                              chain=False)


def test_no_stall_while_idle_or_busy_with_short_callbacks(tl):
    # 0.2 s: far above one short step even in a sanitizer build on a loaded
    # machine (a step preempted for 50 ms was once a real stall there).
    diagnostics.watch_stalls(0.2, tl)

    async def main():
        await asyncio.sleep(0.5)            # asleep in the poller
        end = time.monotonic() + 0.5
        while time.monotonic() < end:       # short steps, > 0.2 s in all
            await asyncio.sleep(0)

    tl.run_until_complete(main())
    assert diagnostics.stalls(tl) == []


@needs_stall_stack
def test_one_report_per_stall(tl):
    diagnostics.watch_stalls(0.02, tl)
    tl.call_soon(time.sleep, 0.3)
    tl.call_soon(time.sleep, 0.1)
    spin(tl)
    reports = diagnostics.stalls(tl)
    assert [r["stack"][-1][2] for r in reports] == ["spin", "spin"]
    assert reports[0]["duration"] > 0.25 and 0.05 < reports[1]["duration"] < 0.25


@needs_stall_stack
def test_a_transport_reader_that_blocks(tl):
    diagnostics.watch_stalls(0.05, tl)

    accepted = []

    class Slow(asyncio.Protocol):
        def connection_made(self, transport):
            accepted.append(transport)

        def data_received(self, data):
            time.sleep(0.15)

    async def main():
        srv = await tl.create_server(Slow, "127.0.0.1", 0)
        r, w = await asyncio.open_connection(*srv.sockets[0].getsockname())
        w.write(b"x")
        await asyncio.sleep(0.3)
        w.close()
        accepted[0].close()
        srv.close()
        await srv.wait_closed()
        await asyncio.sleep(0)

    tl.run_until_complete(main())
    [report] = diagnostics.stalls(tl)
    assert report["callback"].endswith("._read_ready()")
    assert report["stack"][-1][2:] == ("data_received", "time.sleep(0.15)")


def test_closing_the_loop_stops_the_watchdog():
    before = threads()
    loop = tideloop.new_event_loop()
    diagnostics.watch_stalls(0.05, loop)
    assert threads() == before + 1
    loop.close()
    assert threads() == before
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        diagnostics.watch_stalls(0.05, loop)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), 1e9])
def test_bad_thresholds(tl, bad):
    with pytest.raises(ValueError, match="stall threshold"):
        diagnostics.watch_stalls(bad, tl)
    with pytest.raises(TypeError):
        diagnostics.watch_stalls("0.1", tl)


# -- slow callbacks, attributed ----------------------------------------------

async def slow_inner():
    await asyncio.sleep(0.01)       # line +1: where the slow step starts
    time.sleep(0.06)
    await asyncio.sleep(0.01)       # line +3: where it ends


async def slow_outer():
    await slow_inner()


def test_a_slow_task_step_names_the_task_and_its_await_chain(tl, caplog):
    assert diagnostics.report_slow_callbacks(0.03, tl) is None
    first = slow_inner.__code__.co_firstlineno

    async def main():
        await tl.create_task(slow_outer(), name="worker")

    with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
        tl.run_until_complete(main())
    [report] = diagnostics.slow_callbacks(tl)
    assert 0.06 <= report["duration"] < 0.5
    assert report["task"] == "worker" and report["coroutine"] == "slow_outer"
    assert report["started"] == ("slow_inner", __file__, first + 1)
    assert report["ended"] == ("slow_inner", __file__, first + 3)
    chain = report["await_chain"]
    assert chain[:2] == [("slow_outer", __file__, slow_outer.__code__.co_firstlineno + 1),
                         ("slow_inner", __file__, first + 3)]
    assert chain[2][0] == "sleep"           # asyncio.sleep, then what it awaits
    assert tl.diagnostics()["slow_callbacks"] == 1
    assert tl.diagnostics()["callback_timing"] is True
    [record] = [r for r in caplog.records if r.name == "tideloop.diagnostics"]
    assert record.tideloop_slow_callback is report
    msg = record.getMessage()
    assert "task 'worker'" in msg and "slow_inner" in msg
    assert diagnostics.report_slow_callbacks(None, tl) == pytest.approx(0.03)
    assert tl.diagnostics()["callback_timing"] is False


def test_a_slow_plain_callback(tl):
    diagnostics.report_slow_callbacks(0.03, tl)
    tl.call_soon(blocker)           # 0.2 s
    tl.call_soon(time.sleep, 0.001)     # under the threshold
    spin(tl)
    [report] = diagnostics.slow_callbacks(tl)
    assert set(report) == {"duration", "callback"}
    assert "blocker()" in report["callback"] and 0.2 <= report["duration"] < 1.0


def test_subscribers_get_every_report(tl):
    got = []

    def broken(kind, loop, report):
        raise RuntimeError("a subscriber's own bug")

    def listener(kind, loop, report):
        got.append((kind, loop, report))

    diagnostics.subscribe(broken)
    diagnostics.subscribe(listener)
    diagnostics.subscribe(listener)         # once only
    try:
        diagnostics.report_slow_callbacks(0.03, tl)
        diagnostics.watch_stalls(0.12, tl)
        tl.call_soon(blocker)               # 0.2 s: a stall, and a slow callback
        tl.call_soon(time.sleep, 0.05)      # a slow callback only
        spin(tl)
    finally:
        diagnostics.unsubscribe(broken)
        diagnostics.unsubscribe(listener)
        diagnostics.unsubscribe(listener)   # not subscribed: no error
        diagnostics.stop_watching_stalls(tl)
    # One incident, one report: the stall's (the slow callback is kept).
    assert sorted(k for k, _, _ in got) == ["slow_callback", "stall"]
    assert all(loop is tl for _, loop, _ in got)
    slow = diagnostics.slow_callbacks(tl)
    assert [s.get("stall", False) for s in slow] == [True, False]
    assert {k: r for k, _, r in got} == {"slow_callback": slow[1],
                                         "stall": diagnostics.stalls(tl)[0]}


def test_loops_lists_the_open_tideloop_loops(tl):
    other = tideloop.new_event_loop()
    assert tl in diagnostics.loops() and other in diagnostics.loops()
    other.close()
    assert tl in diagnostics.loops() and other not in diagnostics.loops()
    stock = asyncio.new_event_loop()
    assert stock not in diagnostics.loops()
    stock.close()


def test_loops_freed_by_a_collection_while_one_is_forgotten_are_forgotten():
    """A loop freed by its last reference runs its weak reference's callback;
    an allocation there may run a collection that frees other loops (kept
    alive by cycles), whose callbacks then run inside it.  Each is forgotten
    and none reports an error (it did: "dictionary changed size during
    iteration", through sys.unraisablehook, on 3.11, where an allocation
    collects at once; 3.12+ collect at the next bytecode).  The collection
    is placed at each of the next 200 allocations in turn."""
    import gc
    errors = []
    hook, sys.unraisablehook = sys.unraisablehook, errors.append
    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    try:
        made = set()
        for later in range(1, 200):
            for _ in range(3):
                cyclic = tideloop.new_event_loop()
                cyclic.close()
                cyclic.cycle = cyclic       # freed by a collection only
                made.add(id(cyclic))
            del cyclic
            last = tideloop.new_event_loop()
            last.close()
            made.add(id(last))
            gc.set_threshold(gc.get_count()[0] + later)
            gc.enable()
            del last                        # its callback allocates
            gc.disable()
            gc.set_threshold(*threshold)
            gc.collect()
        assert [f"{type(e.exc_value).__name__}: {e.exc_value}" for e in errors] == []
        assert not made & set(tideloop._diag_state._LOOPS), "freed loops still listed"
    finally:
        sys.unraisablehook = hook
        gc.set_threshold(*threshold)
        gc.enable()


def test_slow_callback_threshold_errors(tl):
    with pytest.raises(ValueError, match="slow-callback threshold"):
        diagnostics.report_slow_callbacks(0, tl)
    with pytest.raises(TypeError):
        diagnostics.report_slow_callbacks("1", tl)


def test_the_environment_variable_turns_them_on(monkeypatch):
    monkeypatch.setenv("TIDELOOP_DIAGNOSTICS", "timing, slow=0.03,stalls=0.05")
    before = threads()
    loop = tideloop.new_event_loop()
    try:
        assert loop.diagnostics()["callback_timing"] is True
        assert threads() == before + 1
        assert loop._set_slow_callback_threshold(None) == pytest.approx(0.03)
    finally:
        loop.close()
    assert threads() == before


def test_a_bad_environment_setting_is_warned_of_once(monkeypatch, caplog):
    # A typo must not stop the service: each bad item is logged once, naming
    # the variable and the accepted forms, and the good ones apply.
    monkeypatch.setenv("TIDELOOP_DIAGNOSTICS", "slow, stall=0.05,stalls=abc, timing,slow=-1")
    with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
        for _ in range(3):
            loop = tideloop.new_event_loop()
            try:
                assert loop.diagnostics()["callback_timing"] is True
                assert loop._set_stall_threshold(None) is None
                assert loop._set_slow_callback_threshold(None) is None
            finally:
                loop.close()
    texts = sorted(r.getMessage() for r in caplog.records)
    assert len(texts) == 4, texts
    assert all(t.startswith("TIDELOOP_DIAGNOSTICS: ignoring ") and "stalls=SECONDS" in t
               for t in texts)
    by_item = {t.split("'")[1]: t for t in texts}
    assert set(by_item) == {"slow", "stall=0.05", "stalls=abc", "slow=-1"}
    assert "did you mean 'stalls'" in by_item["stall=0.05"]
    assert "not a number: 'abc'" in by_item["stalls=abc"]
    assert "slow takes a value" in by_item["slow"]
    assert "above 0" in by_item["slow=-1"]


def test_the_readme_walkthrough_finds_its_planted_fault():
    """examples/slow_service.py (README's "Diagnosing a slow service"): its
    own verdict checks that the stall's stack ends on the hidden blocking
    call and that the slow steps are the handler's."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    example = os.path.join(root, "examples", "slow_service.py")
    if not os.path.exists(example):
        pytest.skip("examples/ is not beside this copy of the tests")
    # the tideloop this test runs on (a checkout's src or an installed one)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tideloop.__file__)))
    env.pop("TIDELOOP_DIAGNOSTICS", None)
    proc = subprocess.run([sys.executable, example], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: OK" in proc.stdout
    assert "Event loop blocked for" in proc.stdout and "time.sleep(0.12)" in proc.stdout


def test_prometheus_collector(tl):
    """A scrape through prometheus_client's own registry and text format,
    parsed back with its parser: every value is the snapshot's."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    diagnostics.watch_stalls(0.03, tl)
    tl.call_at(tl.time() - 0.01, int)
    tl.call_soon(time.sleep, 0.1)
    spin(tl, 3)
    registry = prometheus_client.CollectorRegistry()
    registry.register(diagnostics.PrometheusCollector({"main": tl}))
    text = prometheus_client.generate_latest(registry).decode()
    d = tl.diagnostics()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(name, **labels):
        return samples[(name, tuple(sorted(dict(labels, loop="main").items())))]

    assert value("tideloop_loop_iterations_total") == d["iterations"] == 3
    assert value("tideloop_loop_timers_fired_total") == 1
    assert value("tideloop_loop_stalls_total") == len(diagnostics.stalls(tl)) == 1
    assert value("tideloop_loop_seconds_running_total") == pytest.approx(d["time_running"])
    assert value("tideloop_loop_ready") == 0 and value("tideloop_loop_fds") == 0
    it = d["histograms"]["iteration"]
    assert value("tideloop_loop_iteration_seconds_count") == sum(it["counts"]) == 3
    assert value("tideloop_loop_iteration_seconds_sum") == pytest.approx(it["sum"])
    # the bucket holding the 0.1 s iteration, and every one above, count it
    bounds = diagnostics.HISTOGRAM_BOUNDS
    le = next(b for b in bounds if b > it["max"])
    assert value("tideloop_loop_iteration_seconds_bucket", le=repr(le)) == 3
    below = bounds[bounds.index(le) - 1]
    assert value("tideloop_loop_iteration_seconds_bucket", le=repr(below)) == 2
    assert value("tideloop_loop_iteration_seconds_bucket", le="+Inf") == 3


def test_a_slow_report_is_not_charged_to_the_next_callback(tl):
    """The time a report takes (its subscribers', the stall's capture) is
    no part of the callback after it: a fast callback that follows a slow
    one whose report is slow is not reported (a false alarm before)."""
    got = []

    def slow_subscriber(kind, loop, report):
        got.append((kind, report["callback"]))
        time.sleep(0.12)

    def fast():
        pass

    diagnostics.subscribe(slow_subscriber)
    try:
        diagnostics.report_slow_callbacks(0.05, tl)
        tl.call_soon(time.sleep, 0.08)
        tl.call_soon(fast)
        spin(tl)
    finally:
        diagnostics.unsubscribe(slow_subscriber)
    assert [k for k, _ in got] == ["slow_callback"]
    assert "sleep" in got[0][1]


def test_the_log_says_how_many_reports_it_held_back(tl, caplog, monkeypatch):
    # At most 10 records per loop and minute; the first one logged after
    # the minute says how many were held back, instead of hiding them.
    now = [1000.0]
    monkeypatch.setattr(diagnostics._slow_log, "clock", lambda: now[0])
    diagnostics.report_slow_callbacks(0.005, tl)
    with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
        for _ in range(13):
            tl.call_soon(time.sleep, 0.01)
        spin(tl)
        assert len(caplog.records) == 10
        assert "suppressed" not in caplog.text
        now[0] += 61
        tl.call_soon(time.sleep, 0.01)
        spin(tl)
    assert len(diagnostics.slow_callbacks(tl)) == 14        # all kept
    assert len(caplog.records) == 11
    assert caplog.records[-1].getMessage().endswith(" (3 similar reports suppressed)")


def test_a_stall_without_its_stack_says_where_the_step_ended(tl, caplog):
    async def stuck():
        await asyncio.sleep(0)
        time.sleep(0.2)
        await asyncio.sleep(10)
    line = stuck.__code__.co_firstlineno + 3
    task_types = tuple({asyncio.Task, getattr(asyncio.tasks, "_PyTask", asyncio.Task)})
    # A capture that fails (as one may: a thread gone, no frames).
    _core._diag_setup(lambda tid, loop: None, diagnostics._report, diagnostics._slow,
                      diagnostics._ASYNCIO_DIR, task_types)
    try:
        diagnostics.watch_stalls(0.05, tl)
        with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
            task = tl.create_task(stuck(), name="stuck")
            spin(tl, 3)
    finally:
        diagnostics.stop_watching_stalls(tl)
        _core._diag_setup(diagnostics._capture, diagnostics._report, diagnostics._slow,
                          diagnostics._ASYNCIO_DIR, task_types)
        task.cancel()
        spin(tl, 2)
    [report] = diagnostics.stalls(tl)
    assert report["stack"] is None and report["task"] == "stuck"
    qualname = stuck.__qualname__
    assert report["ended"] == (qualname, __file__, line)
    [record] = caplog.records
    assert record.getMessage().endswith(
        "in task 'stuck' (%s); its stack could not be taken; the step ended at %s "
        "(%s:%d)" % (qualname, qualname, __file__, line))


@needs_stall_stack
def test_a_stall_record_after_held_back_ones_says_so_in_its_first_line(tl, caplog,
                                                                       monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(diagnostics._stall_log, "clock", lambda: now[0])
    diagnostics.watch_stalls(0.03, tl)
    try:
        with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
            for _ in range(11):
                tl.call_soon(time.sleep, 0.08)
            spin(tl)
            now[0] += 61
            tl.call_soon(time.sleep, 0.08)
            spin(tl)
    finally:
        diagnostics.stop_watching_stalls(tl)
    assert len(diagnostics.stalls(tl)) == 12
    assert len(caplog.records) == 11
    head = caplog.records[-1].getMessage().split("\n")[0]
    # The count comes right before the stack's header, however the stack was
    # captured (a slow machine may need the signal: "(0.049 s in, by signal: ...)").
    assert re.search(r" \(1 similar report suppressed\); stack when caught "
                     r"\([0-9.]+ s in(, by signal: [^)]*)?\):$", head), head
