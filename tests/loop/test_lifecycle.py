"""run_forever / run_until_complete / stop / close / is_running / time."""
import asyncio
import time

import pytest

from loop_helpers import norm, stop_after


def test_run_until_complete_returns_coroutine_result(loop):
    async def main():
        await asyncio.sleep(0)
        return 42

    assert loop.run_until_complete(main()) == 42


def test_run_until_complete_accepts_future(loop):
    fut = loop.create_future()
    loop.call_soon(fut.set_result, "done")
    assert loop.run_until_complete(fut) == "done"


def test_run_until_complete_propagates_exception(loop):
    async def main():
        await asyncio.sleep(0)
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError, match="boom"):
        loop.run_until_complete(main())
    # the loop is reusable afterwards
    assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7


def test_loop_reusable_many_times(loop):
    for i in range(20):
        assert loop.run_until_complete(asyncio.sleep(0, result=i)) == i
    assert not loop.is_running()
    assert not loop.is_closed()


def test_run_forever_stop_from_callback(loop):
    calls = []
    loop.call_soon(calls.append, 1)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert calls == [1]
    assert not loop.is_running()
    # run again
    loop.call_soon(calls.append, 2)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert calls == [1, 2]


def test_stop_before_run_forever_runs_one_iteration(loop):
    calls = []
    loop.call_soon(calls.append, "a")
    loop.stop()
    loop.run_forever()
    assert calls == ["a"]
    # the stop request was consumed: a second run_forever needs a new stop
    loop.call_soon(calls.append, "b")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert calls == ["a", "b"]


def test_stop_from_timer(loop):
    t0 = time.monotonic()
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    elapsed = time.monotonic() - t0
    assert 0.04 <= elapsed < 5


def test_is_running(loop):
    seen = []

    async def main():
        seen.append(loop.is_running())
        loop.call_soon(lambda: seen.append(loop.is_running()))
        await asyncio.sleep(0)

    assert loop.is_running() is False
    loop.run_until_complete(main())
    assert seen == [True, True]
    assert loop.is_running() is False


def test_is_closed_and_close_idempotent(new_loop):
    lp = new_loop()
    assert lp.is_closed() is False
    lp.close()
    assert lp.is_closed() is True
    lp.close()  # second close is a no-op
    assert lp.is_closed() is True


def test_get_running_loop_inside(loop):
    async def main():
        assert asyncio.get_running_loop() is loop
        assert asyncio.get_event_loop() is loop
        assert asyncio._get_running_loop() is loop
        return True

    seen = []
    loop.call_soon(lambda: seen.append(asyncio.get_running_loop()))
    assert loop.run_until_complete(main()) is True
    assert seen == [loop]
    assert asyncio._get_running_loop() is None
    with pytest.raises(RuntimeError, match="no running event loop"):
        asyncio.get_running_loop()


def test_nested_run_refused(loop):
    errors = []

    async def main():
        inner = loop.create_future()
        with pytest.raises(RuntimeError) as ei:
            loop.run_until_complete(inner)
        errors.append(str(ei.value))
        with pytest.raises(RuntimeError) as ei:
            loop.run_forever()
        errors.append(str(ei.value))
        # the outer run is unaffected
        await asyncio.sleep(0)
        return "ok"

    assert loop.run_until_complete(main()) == "ok"
    assert errors == ["This event loop is already running"] * 2


def test_run_while_other_loop_running_refused(loop, new_loop):
    other = new_loop()
    errors = []

    async def main():
        fut = other.create_future()
        with pytest.raises(RuntimeError) as ei:
            other.run_until_complete(fut)
        errors.append(str(ei.value))
        with pytest.raises(RuntimeError) as ei:
            other.run_forever()
        errors.append(str(ei.value))
        return "ok"

    assert loop.run_until_complete(main()) == "ok"
    assert errors == ["Cannot run the event loop while another loop is running"] * 2
    # other loop still usable afterwards
    assert other.run_until_complete(asyncio.sleep(0, result=3)) == 3
    assert other.is_running() is False


def test_run_until_complete_on_closed_loop(new_loop):
    lp = new_loop()
    fut = lp.create_future()
    lp.close()
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        lp.run_until_complete(fut)
    coro = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        lp.run_until_complete(coro)
    coro.close()
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        lp.run_forever()


def test_close_running_loop_refused(loop):
    async def main():
        with pytest.raises(RuntimeError, match="^Cannot close a running event loop$"):
            loop.close()
        return loop.is_closed()

    assert loop.run_until_complete(main()) is False
    assert loop.is_closed() is False


def test_stopped_before_future_completed(loop):
    fut = loop.create_future()
    loop.call_soon(loop.stop)
    with pytest.raises(RuntimeError, match=r"^Event loop stopped before Future completed\.$"):
        loop.run_until_complete(fut)
    assert not fut.done()
    # the done-callback of the aborted run was removed: completing the future
    # later and running again works normally
    loop.call_soon(fut.set_result, 5)
    assert loop.run_until_complete(fut) == 5


def test_time_is_monotonic_clock(loop):
    for _ in range(200):
        t0 = time.monotonic()
        lt = loop.time()
        t1 = time.monotonic()
        assert t0 <= lt <= t1


def test_time_not_rounded_to_milliseconds(loop):
    samples = []
    for _ in range(100):
        samples.append(loop.time())
        time.sleep(0.0001)
    # at least one sample must have sub-millisecond digits
    off_grid = [t for t in samples if abs(t * 1000 - round(t * 1000)) > 1e-6]
    assert off_grid, samples[:5]
    assert samples == sorted(samples)


def test_time_advances_while_running(loop):
    seen = []

    async def main():
        seen.append(loop.time())
        await asyncio.sleep(0.02)
        seen.append(loop.time())

    loop.run_until_complete(main())
    assert seen[1] - seen[0] >= 0.019


def test_debug_flag(new_loop):
    loop = new_loop()
    assert loop.get_debug() is asyncio.coroutines._is_debug_mode()
    loop.set_debug(False)
    assert loop.get_debug() is False
    loop.set_debug(True)
    assert loop.get_debug() is True
    loop.set_debug(False)
    assert loop.get_debug() is False


def test_loop_repr(loop):
    r = repr(loop)
    assert r.startswith("<") and r.endswith(">")
    assert f"running=False closed=False debug={loop.get_debug()}" in r
    seen = []
    loop.call_soon(lambda: seen.append(repr(loop)))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert "running=True closed=False" in seen[0]
    loop.close()
    assert "running=False closed=True" in repr(loop)


def test_runner_with_loop_factory(new_loop):
    async def main():
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        lp = runner.get_loop()
        assert runner.run(main()) is lp
        assert runner.run(asyncio.sleep(0, result="x")) == "x"
    assert lp.is_closed()


def test_stop_is_idempotent_and_safe_when_not_running(loop):
    loop.stop()
    loop.stop()
    calls = []
    loop.call_soon(calls.append, 1)
    loop.run_forever()  # runs one iteration because of the pending stop
    assert calls == [1]


def test_run_forever_safety_net_helper(loop):
    # run_forever without anything scheduled but a timer: exits via the timer
    h = stop_after(loop, 0.01)
    loop.run_forever()
    assert not h.cancelled()


def test_run_until_complete_done_future_runs_pending_callbacks(loop):
    out = []
    fut = loop.create_future()
    fut.set_result("already")
    loop.call_soon(out.append, "pending")
    assert loop.run_until_complete(fut) == "already"
    assert out == ["pending"]


def test_run_until_complete_cancelled_task(loop):
    async def main():
        await asyncio.sleep(10)

    task = loop.create_task(main())
    loop.call_soon(task.cancel)
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(task)
    assert task.cancelled()


def test_closed_loop_is_freed_without_a_collection(raw_loop_factory):
    # A closed loop holds no reference cycle: it goes as soon as its last
    # user lets go (anyio's suite checks this after asyncio.run() with a
    # worker thread that keeps the loop until it exits).
    import gc
    import weakref

    async def main():
        asyncio.get_running_loop().call_soon(lambda: None)
        await asyncio.sleep(0)
        return weakref.ref(asyncio.get_running_loop())

    gc.collect()
    gc.disable()
    try:
        with asyncio.Runner(loop_factory=raw_loop_factory) as runner:
            ref = runner.run(main())
        assert ref() is None
    finally:
        gc.enable()


def test_closed_loop_is_freed_without_a_collection_after_run_forever(raw_loop_factory):
    # The same for a loop run by run_forever() alone (a server's way): its
    # Tasks' steps and wakeups leave no cycle through the loop behind.
    import gc
    import weakref

    async def work():
        await asyncio.sleep(0)

    gc.collect()
    gc.disable()
    try:
        lp = raw_loop_factory()
        task = lp.create_task(work())
        task.add_done_callback(lambda _: lp.stop())
        lp.run_forever()
        assert task.done()
        ref = weakref.ref(lp)
        lp.close()
        del lp, task
        assert ref() is None
    finally:
        gc.enable()


def test_call_soon_of_an_instance_is_kept_while_running(raw_loop_factory):
    # An application's own call_soon on the instance is what the loop's
    # Tasks use, while the loop runs and after.
    lp = raw_loop_factory()
    calls = []
    real = lp.call_soon

    def call_soon(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    lp.call_soon = call_soon
    try:
        async def main():
            await asyncio.sleep(0)

        lp.run_until_complete(main())
        assert calls, "the instance's call_soon was not used"
        assert lp.call_soon is call_soon
    finally:
        lp.close()


def test_dropped_unclosed_loop_is_freed_without_a_collection(raw_loop_factory, loop_name):
    # A loop dropped without close() is freed as soon as its last user lets
    # go (its __del__ warns and closes it), not at the next collection: a
    # library that forgets close() must not pile up loops, their fds and
    # their threads' references until the collector runs.
    if loop_name == "asyncio":
        pytest.skip("the stock selector loop keeps its self-pipe reader, a "
                    "bound method of itself: a cycle the collector frees")
    import gc
    import warnings
    import weakref

    async def main():
        await asyncio.create_task(asyncio.sleep(0))   # a Task's wakeups
        await asyncio.sleep(0)

    gc.collect()
    gc.disable()
    try:
        lp = raw_loop_factory()
        lp.run_until_complete(main())
        ref = weakref.ref(lp)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del lp
        unclosed = [str(w.message) for w in caught
                    if issubclass(w.category, ResourceWarning)]
        assert len(unclosed) == 1 and unclosed[0].startswith(
            "unclosed event loop <Loop running=False closed=False"), unclosed
        del caught      # the warning's source is the loop
        assert ref() is None
    finally:
        gc.enable()
