"""call_later / call_at / TimerHandle: ordering, cancellation, memory."""
import asyncio
import gc
import math
import random
import sys
import time

import pytest

from loop_helpers import hypothesis_api, stop_after

# (stand-ins in an isolated subinterpreter, where hypothesis does not load)
HealthCheck, given, settings, st = hypothesis_api()


def noop():
    pass


def test_call_later_fires_after_delay(loop):
    fired = []
    t0 = loop.time()
    h = loop.call_later(0.05, lambda: fired.append(loop.time()))
    t1 = loop.time()
    assert t0 + 0.05 <= h.when() <= t1 + 0.05
    stop_after(loop, 0.1)
    loop.run_forever()
    assert len(fired) == 1
    # never early (allow a microsecond of float/ns conversion slack)
    assert fired[0] >= h.when() - 1e-6
    assert fired[0] - t0 < 5


def test_call_at_when_is_exact(loop):
    when = loop.time() + 0.0123456789
    h = loop.call_at(when, noop)
    assert h.when() == when
    h.cancel()
    assert h.when() == when


def test_call_at_keeps_the_when_object_it_was_given(loop):
    # asyncio's TimerHandle stores call_at()'s argument as is: aiohttp's
    # ceil_timeout() passes an int and its tests check that it stays one.
    from fractions import Fraction
    deadline = math.ceil(loop.time()) + 60
    h_int = loop.call_at(deadline, noop)
    h_frac = loop.call_at(Fraction(deadline * 2, 2), noop)
    h_later = loop.call_later(60, noop)
    assert type(h_int.when()) is int and h_int.when() == deadline
    assert type(h_int._when) is int
    assert type(h_frac.when()) is Fraction
    assert type(h_later.when()) is float
    assert f"when={deadline} " in repr(h_int) and f"when={deadline} " in repr(h_frac)
    assert hash(h_int) == hash(float(deadline)) and h_int == h_frac
    for h in (h_int, h_frac, h_later):
        h.cancel()
    assert type(h_int.when()) is int


def test_time_patched_on_the_instance_moves_the_timers(loop):
    # The stock loop reads self.time() in call_later() and in every
    # iteration; tests (aiohttp's keep-alive ones) patch it on the instance.
    from unittest import mock
    fired = []

    async def main():
        now = loop.time()
        with mock.patch.object(loop, "time") as clock:
            clock.return_value = now
            loop.call_later(100, fired.append, "later")
            loop.call_at(now + 50, fired.append, "at")
            await asyncio.sleep(0)
            assert fired == []
            clock.return_value = now + 100
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert fired == ["at", "later"]
        assert "time" not in vars(loop)          # the real clock again
        assert abs(loop.time() - time.monotonic()) < 1

    loop.run_until_complete(main())


def test_time_patched_to_raise_fails_the_iteration(loop):
    from unittest import mock
    loop.call_later(10, noop)
    loop.call_soon(loop.stop)
    with mock.patch.object(loop, "time", side_effect=ZeroDivisionError):
        with pytest.raises(ZeroDivisionError):
            loop.run_forever()
    assert not loop.is_running()


def test_call_later_accepts_int_delay(loop):
    fired = []
    loop.call_later(0, fired.append, "int")
    stop_after(loop, 0.01)
    loop.run_forever()
    assert fired == ["int"]


def test_timers_fire_in_deadline_order(loop):
    out = []
    delays = [0.03, 0.01, 0.02, 0.005, 0.025, 0.0]
    for d in delays:
        loop.call_later(d, out.append, d)
    stop_after(loop, 0.1)
    loop.run_forever()
    assert out == sorted(delays)


def test_two_tied_timers_in_scheduling_order(loop):
    out = []
    when = loop.time() + 0.01
    loop.call_at(when, out.append, "first")
    loop.call_at(when, out.append, "second")
    loop.call_at(when + 0.01, loop.stop)
    loop.run_forever()
    assert out == ["first", "second"]


def test_many_tied_timers(loop_name, loop):
    out = []
    when = loop.time() + 0.01
    for i in range(20):
        loop.call_at(when, out.append, i)
    loop.call_at(when + 0.01, loop.stop)
    loop.run_forever()
    if loop_name == "asyncio":
        # heapq is not stable: stock asyncio runs ties in arbitrary order
        assert sorted(out) == list(range(20))
    else:
        # tideloop's heap breaks ties by scheduling sequence
        assert out == list(range(20))


def test_expired_timer_runs_after_already_ready_callbacks(loop):
    out = []
    loop.call_later(0, out.append, "timer")
    loop.call_soon(out.append, "soon")
    loop.call_soon(loop.stop)
    loop.run_forever()
    # _run_once: the ready queue runs after expired timers are appended to it
    assert out == ["soon", "timer"]


def test_timer_scheduled_by_callback_not_run_in_same_snapshot(loop):
    out = []

    def cb():
        out.append("cb")
        loop.call_later(-1, out.append, "timer")
        loop.stop()

    loop.call_soon(cb)
    loop.call_soon(out.append, "next")
    loop.run_forever()
    assert out == ["cb", "next"]
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == ["cb", "next", "timer"]


def test_cancel_timer(loop):
    out = []
    h = loop.call_later(0.01, out.append, "cancelled")
    h2 = loop.call_later(0.01, out.append, "kept")
    assert not h.cancelled()
    h.cancel()
    assert h.cancelled()
    stop_after(loop, 0.05)
    loop.run_forever()
    assert out == ["kept"]
    assert not h2.cancelled()
    h2.cancel()  # after it ran: harmless
    assert h2.cancelled()


def test_cancel_timer_from_earlier_callback_in_same_iteration(loop):
    out = []
    when = loop.time() + 0.01
    handles = []

    def first():
        out.append("first")
        handles[0].cancel()

    loop.call_at(when, first)
    handles.append(loop.call_at(when + 1e-6, out.append, "victim"))
    loop.call_at(when + 0.03, loop.stop)
    loop.run_forever()
    assert out == ["first"]


def test_cancel_only_timer_lets_loop_sleep_on_next_deadline(loop):
    """Cancelling the earliest timer must not make the loop wait for it."""
    out = []
    early = loop.call_later(0.01, out.append, "early")
    loop.call_later(0.05, out.append, "late")
    early.cancel()
    t0 = time.monotonic()
    loop.call_later(0.06, loop.stop)
    loop.run_forever()
    assert out == ["late"]
    assert time.monotonic() - t0 < 5


def test_timer_handle_comparison_and_hash(loop):
    t = loop.time()
    a = loop.call_at(t + 10, noop)
    b = loop.call_at(t + 20, noop)
    c = loop.call_at(t + 10, noop)
    assert a < b and b > a
    assert a <= b and b >= a
    assert a <= c and a >= c
    assert not (a < c)
    assert a == c  # same when, callback, args, cancelled state
    assert hash(a) == hash(c)
    assert a != b
    assert sorted([b, a]) == [a, b]
    assert {a, b, c} == {a, b}
    with pytest.raises(TypeError):
        a < 1  # noqa: B015
    h = loop.call_soon(noop)
    with pytest.raises(TypeError):
        a < h  # noqa: B015
    # plain Handles are hashable by identity
    assert len({h, loop.call_soon(noop)}) == 2
    for x in (a, b, c):
        x.cancel()
    assert a == c  # both cancelled, same when


def test_timer_handle_cancelled_compares_unequal_to_live(loop):
    t = loop.time()
    a = loop.call_at(t + 10, noop)
    c = loop.call_at(t + 10, noop)
    a.cancel()
    assert a != c
    c.cancel()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delays_ms=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=30))
def test_timer_order_property(loop_name, new_loop, delays_ms):
    lp = new_loop()
    try:
        out = []
        base = lp.time() + 0.001
        for i, d in enumerate(delays_ms):
            lp.call_at(base + d / 1000, out.append, (d, i))
        lp.call_at(base + 0.01, lp.stop)
        lp.run_forever()
        assert len(out) == len(delays_ms)
        assert [d for d, _ in out] == sorted(delays_ms)
        if loop_name == "tideloop":
            assert out == sorted(out)  # ties in scheduling order
    finally:
        lp.close()


def test_many_timers_random_order(loop):
    rnd = random.Random(1234)
    out = []
    handles = []
    for _ in range(5000):
        handles.append(loop.call_later(rnd.random() * 0.03, lambda: None))
    for h in handles:
        loop.call_at(h.when(), out.append, h.when())
    # cancel half of the first batch
    for h in handles[::2]:
        h.cancel()
    stop_after(loop, 0.1)
    loop.run_forever()
    assert len(out) == 5000
    assert out == sorted(out)


def test_idle_loop_sleeps_instead_of_spinning(loop):
    c0 = time.process_time()
    w0 = time.monotonic()
    loop.run_until_complete(asyncio.sleep(0.3))
    wall = time.monotonic() - w0
    cpu = time.process_time() - c0
    assert wall >= 0.29
    assert cpu < 0.15, f"loop burned {cpu:.3f}s CPU during a 0.3s sleep"


def test_sleep_sub_millisecond(loop):
    async def main():
        t0 = loop.time()
        for _ in range(20):
            await asyncio.sleep(0.0002)
        return loop.time() - t0

    elapsed = loop.run_until_complete(main())
    assert 20 * 0.0002 - 1e-4 <= elapsed < 2


def _blocks_after_gc():
    gc.collect()
    gc.collect()
    return sys.getallocatedblocks()


def test_cancelled_timeouts_do_not_accumulate(loop):
    """asyncio.timeout() churn: each enter schedules a timer, each exit
    cancels it.  Cancelled timers must leave the heap (stock asyncio purges
    when more than half are cancelled)."""

    async def churn(n):
        for _ in range(n // 1000):
            for _ in range(1000):
                async with asyncio.timeout(10):
                    pass
            await asyncio.sleep(0)

    loop.run_until_complete(churn(10_000))  # warm up freelists, caches
    before = _blocks_after_gc()
    loop.run_until_complete(churn(100_000))
    after = _blocks_after_gc()
    # 100k leaked handles would be >= 100k blocks
    assert after - before < 20_000, (before, after)


def test_mass_cancel_call_later_frees_memory(loop):
    async def burst():
        hs = [loop.call_later(1000, noop) for _ in range(100_000)]
        for h in hs:
            h.cancel()
        del hs
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    loop.run_until_complete(burst())
    before = _blocks_after_gc()
    loop.run_until_complete(burst())
    after = _blocks_after_gc()
    assert after - before < 20_000, (before, after)
    # the loop does not wait for the (cancelled) 1000 s timers
    t0 = time.monotonic()
    loop.run_until_complete(asyncio.sleep(0.01))
    assert time.monotonic() - t0 < 5


def test_timer_handle_equality_with_other_types(loop):
    th = loop.call_later(10, noop)
    assert (th == 1) is False
    assert (th != "x") is True
    assert th == th
    th.cancel()
