"""call_soon_threadsafe, cross-thread wakeups, run_coroutine_threadsafe."""
import asyncio
import threading
import time

import pytest


def test_threadsafe_wakes_loop_sleeping_on_long_timer(loop):
    woke = []

    def from_thread():
        time.sleep(0.1)
        loop.call_soon_threadsafe(lambda: (woke.append(time.monotonic()), loop.stop()))

    long_timer = loop.call_later(20, loop.stop)
    t = threading.Thread(target=from_thread)
    t0 = time.monotonic()
    t.start()
    loop.run_forever()
    t.join()
    elapsed = time.monotonic() - t0
    assert len(woke) == 1
    assert elapsed < 5, f"cross-thread wakeup took {elapsed:.2f}s"
    assert not long_timer.cancelled()
    long_timer.cancel()


def test_threadsafe_wakes_loop_with_no_timers(loop):
    """Nothing scheduled at all: the loop blocks indefinitely in the poller."""
    fut = loop.create_future()

    def from_thread():
        time.sleep(0.05)
        loop.call_soon_threadsafe(fut.set_result, "woken")

    t = threading.Thread(target=from_thread)
    t.start()
    t0 = time.monotonic()
    assert loop.run_until_complete(fut) == "woken"
    t.join()
    assert time.monotonic() - t0 < 5


def test_threadsafe_many_threads(loop):
    n_threads, per_thread = 8, 250
    total = n_threads * per_thread
    received = []
    done = loop.create_future()

    def cb(tid, i):
        received.append((tid, i))
        if len(received) == total and not done.done():
            done.set_result(None)

    barrier = threading.Barrier(n_threads)

    def worker(tid):
        barrier.wait()
        for i in range(per_thread):
            loop.call_soon_threadsafe(cb, tid, i)
            if i % 50 == 0:
                time.sleep(0.001)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    loop.run_until_complete(asyncio.wait_for(done, 20))
    for t in threads:
        t.join()
    assert len(received) == total
    # per-thread FIFO order is preserved
    for tid in range(n_threads):
        assert [i for (k, i) in received if k == tid] == list(range(per_thread))


def test_threadsafe_before_loop_runs(loop):
    out = []
    t = threading.Thread(target=lambda: loop.call_soon_threadsafe(out.append, "x"))
    t.start()
    t.join()
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == ["x"]


def test_threadsafe_returns_cancellable_handle(loop):
    out = []
    h = loop.call_soon_threadsafe(out.append, "cancelled")
    h.cancel()
    assert h.cancelled()
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == []


def test_threadsafe_repeated_wakeups_while_sleeping(loop):
    """Several separate wakeups, each while the loop is asleep."""
    hits = []
    done = loop.create_future()

    def worker():
        for i in range(5):
            time.sleep(0.02)
            loop.call_soon_threadsafe(hits.append, i)
        loop.call_soon_threadsafe(done.set_result, None)

    loop.call_later(20, lambda: None)
    t = threading.Thread(target=worker)
    t0 = time.monotonic()
    t.start()
    loop.run_until_complete(done)
    t.join()
    assert hits == [0, 1, 2, 3, 4]
    assert time.monotonic() - t0 < 5


def test_run_coroutine_threadsafe(loop):
    results = []

    async def work(x):
        await asyncio.sleep(0.01)
        return x * 2

    def worker():
        fut = asyncio.run_coroutine_threadsafe(work(21), loop)
        results.append(fut.result(timeout=10))
        loop.call_soon_threadsafe(loop.stop)

    t = threading.Thread(target=worker)
    t.start()
    loop.call_later(20, loop.stop)
    loop.run_forever()
    t.join()
    assert results == [42]


def test_wrap_future_from_thread(loop):
    import concurrent.futures

    cf = concurrent.futures.Future()

    def worker():
        time.sleep(0.05)
        cf.set_result("cf-done")

    t = threading.Thread(target=worker)
    t.start()
    assert loop.run_until_complete(asyncio.wrap_future(cf, loop=loop)) == "cf-done"
    t.join()


def test_threadsafe_on_closed_loop(new_loop):
    lp = new_loop()
    lp.close()
    errors = []

    def worker():
        try:
            lp.call_soon_threadsafe(lambda: None)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors == ["Event loop is closed"]


def test_stop_from_other_thread_via_threadsafe(loop):
    def worker():
        time.sleep(0.05)
        loop.call_soon_threadsafe(loop.stop)

    t = threading.Thread(target=worker)
    t0 = time.monotonic()   # before the worker starts its sleep (a loaded machine)
    t.start()
    loop.run_forever()
    t.join()
    assert 0.04 <= time.monotonic() - t0 < 5
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def test_loop_runs_in_non_main_thread(new_loop):
    results = []

    def thread_main():
        lp = new_loop()
        try:
            async def main():
                await asyncio.sleep(0.01)
                return (asyncio.get_running_loop() is lp, threading.current_thread().name)

            results.append(lp.run_until_complete(main()))
        finally:
            lp.close()

    t = threading.Thread(target=thread_main, name="loop-thread")
    t.start()
    t.join(20)
    assert results == [(True, "loop-thread")]


def test_several_loops_in_parallel_threads(new_loop):
    n = 4
    results = [None] * n
    loops = [new_loop() for _ in range(n)]

    def thread_main(i):
        lp = loops[i]

        async def main():
            total = 0
            for k in range(50):
                await asyncio.sleep(0.0005)
                total += k
            return total

        results[i] = lp.run_until_complete(main())

    threads = [threading.Thread(target=thread_main, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == [sum(range(50))] * n
    for lp in loops:
        lp.close()


def test_main_thread_drives_loop_in_other_thread(new_loop):
    lp = new_loop()
    ready = threading.Event()

    def thread_main():
        lp.call_soon(ready.set)
        lp.run_forever()

    t = threading.Thread(target=thread_main)
    t.start()
    assert ready.wait(10)
    assert lp.is_running()

    async def work():
        await asyncio.sleep(0.01)
        return threading.current_thread() is t

    fut = asyncio.run_coroutine_threadsafe(work(), lp)
    assert fut.result(10) is True
    lp.call_soon_threadsafe(lp.stop)
    t.join(10)
    assert not t.is_alive()
    assert not lp.is_running()
    lp.close()
