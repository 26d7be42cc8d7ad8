"""loop.stats(): tideloop's counters of what the loop has done.

A tideloop-only API (the stock loop has no counterpart), so these tests run
on tideloop alone: each key is checked to move exactly when the loop does the
thing it counts."""
import asyncio
import socket
import time

import pytest

import tideloop

KEYS = {
    "iterations": int, "polls": int, "callbacks": int, "io_events": int,
    "timers_fired": int, "slow_callbacks": int, "poll_time": float,
    "ready": int, "timers": int, "fds": int, "backend": str,
}


@pytest.fixture
def tl():
    loop = tideloop.new_event_loop()
    loop.set_debug(False)
    yield loop
    loop.close()


def spin(loop, n=1):
    """Run exactly n iterations."""
    for _ in range(n):
        loop.call_soon(loop.stop)
        loop.run_forever()


def test_keys_and_types(tl):
    s = tl.stats()
    assert set(s) == set(KEYS)
    for k, t in KEYS.items():
        assert type(s[k]) is t, k
    assert s["backend"] == tideloop._core.poller_backend
    # a new loop has done nothing
    assert {k: s[k] for k in KEYS if k not in ("backend",)} == {
        "iterations": 0, "polls": 0, "callbacks": 0, "io_events": 0,
        "timers_fired": 0, "slow_callbacks": 0, "poll_time": 0.0,
        "ready": 0, "timers": 0, "fds": 0}


def test_stats_is_a_snapshot(tl):
    s = tl.stats()
    spin(tl)
    assert s["iterations"] == 0
    assert tl.stats() is not s


def test_callbacks_and_ready(tl):
    for _ in range(5):
        tl.call_soon(int)
    h = tl.call_soon(int)
    h.cancel()
    assert tl.stats()["ready"] == 6          # queued, cancelled one included
    before = tl.stats()
    spin(tl)
    after = tl.stats()
    assert after["iterations"] - before["iterations"] == 1
    # 5 live callbacks + loop.stop; the cancelled handle is not run
    assert after["callbacks"] - before["callbacks"] == 6
    assert after["ready"] == 0


def test_iterations_count_run_once(tl):
    before = tl.stats()["iterations"]
    spin(tl, 7)
    assert tl.stats()["iterations"] - before == 7


def test_timers_fired_and_pending(tl):
    hs = [tl.call_later(0, int) for _ in range(3)]
    far = tl.call_later(3600, int)
    assert tl.stats()["timers"] == 4
    hs[0].cancel()                    # cancel removes from the heap at once
    assert tl.stats()["timers"] == 3
    spin(tl)
    s = tl.stats()
    assert s["timers_fired"] == 2
    assert s["timers"] == 1
    far.cancel()
    assert tl.stats()["timers"] == 0


def test_polls_and_poll_time(tl):
    # With no fd watched and callbacks ready, the zero-timeout poll is skipped.
    spin(tl, 3)
    assert tl.stats()["polls"] == 0
    # Sleeping in the poll is counted, and its time accumulates.
    tl.run_until_complete(asyncio.sleep(0.05))
    s = tl.stats()
    assert s["polls"] >= 1
    assert 0.04 <= s["poll_time"] < 1.0


def test_fds_and_io_events(tl):
    a, b = socket.socketpair()
    try:
        got = []
        tl.add_reader(a.fileno(), lambda: got.append(a.recv(100)))
        assert tl.stats()["fds"] == 1
        tl.add_writer(b.fileno(), int)
        assert tl.stats()["fds"] == 2
        tl.remove_writer(b.fileno())
        assert tl.stats()["fds"] == 1
        before = tl.stats()["io_events"]
        b.send(b"x")
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            spin(tl)
        assert got == [b"x"]
        assert tl.stats()["io_events"] - before == 1
        tl.remove_reader(a.fileno())
        assert tl.stats()["fds"] == 0
    finally:
        a.close()
        b.close()


def test_internal_fds_not_counted(tl):
    # The wakeup eventfd (and the signal pipe) are the loop's own.
    tl.call_soon_threadsafe(int)
    spin(tl)
    assert tl.stats()["fds"] == 0


def test_slow_callbacks_counted_in_debug_mode(tl, caplog):
    tl.set_debug(True)
    tl.slow_callback_duration = 0.01
    tl.call_soon(time.sleep, 0.03)
    tl.call_soon(int)
    spin(tl)
    assert tl.stats()["slow_callbacks"] == 1
    assert any("took" in r.getMessage() for r in caplog.records)


def test_stats_on_closed_loop():
    loop = tideloop.new_event_loop()
    spin(loop, 2)
    loop.close()
    assert loop.stats()["iterations"] == 2
