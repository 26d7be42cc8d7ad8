"""The threading contract: a loop belongs to the thread running it; other
threads may call call_soon_threadsafe(), cancel the handles it returns (and,
as on the stock loop, any handle), stop() the loop, schedule with
call_soon()/call_later() on a running loop, read is_running()/is_closed(),
and race close() with call_soon_threadsafe().  On every build, on both
loops; on a free-threaded build with the GIL off these run truly in
parallel (tideloop's core declares that it needs no GIL)."""
import asyncio
import sys
import threading
import time

import pytest

FREE_THREADED = not getattr(sys, "_is_gil_enabled", lambda: True)()


def run_in_thread(loop, main):
    """Run main() on loop in a thread of its own; returns (thread, result box)."""
    box = {}
    started = threading.Event()

    def target():
        asyncio.set_event_loop(loop)
        started.set()
        try:
            box["result"] = loop.run_until_complete(main())
        except BaseException as exc:   # noqa: BLE001 - reported by the test
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    started.wait()
    return t, box


def wait_running(loop, timeout=5):
    deadline = time.monotonic() + timeout
    while not loop.is_running():
        assert time.monotonic() < deadline, "the loop never started"
        time.sleep(0.001)


def test_timer_cancelled_from_another_thread_never_runs(loop):
    ran = []
    done = threading.Event()

    async def main():
        h = loop.call_later(0.2, ran.append, "late")
        box["handle"] = h
        await asyncio.get_running_loop().run_in_executor(None, done.wait, 5)
        await asyncio.sleep(0.3)     # past the cancelled timer's deadline
        return h.cancelled()

    box = {}
    t, res = run_in_thread(loop, main)
    wait_running(loop)
    while "handle" not in box:
        time.sleep(0.001)
    box["handle"].cancel()           # from this thread, while the loop runs
    assert box["handle"].cancelled()
    done.set()
    t.join(10)
    assert res == {"result": True} and ran == []


def test_threadsafe_handle_cancelled_from_another_thread(loop):
    """Many call_soon_threadsafe() handles, half cancelled by the thread that
    made them while the loop runs the others: each runs at most once, and a
    handle whose cancel() returned before the loop reached it never runs."""
    ran = set()
    finished = threading.Event()
    cancelled_first = set()
    n = 2000

    async def main():
        await asyncio.get_running_loop().run_in_executor(None, finished.wait, 10)
        await asyncio.sleep(0.05)
        return len(ran)

    t, res = run_in_thread(loop, main)
    wait_running(loop)
    for i in range(n):
        h = loop.call_soon_threadsafe(ran.add, i)
        if i % 2:
            h.cancel()
            if i not in ran:
                cancelled_first.add(i)
    finished.set()
    t.join(10)
    assert "error" not in res
    assert not (ran & cancelled_first)
    assert set(range(0, n, 2)) <= ran


def test_call_soon_and_call_later_from_another_thread_run(loop):
    """Not thread-safe by asyncio's documentation, yet programs do it: on a
    running loop they must not corrupt it, and the callbacks run (a
    call_soon_threadsafe() afterwards wakes the loop in any case)."""
    ran = []
    got = threading.Event()

    async def main():
        await asyncio.get_running_loop().run_in_executor(None, got.wait, 10)
        return sorted(ran)

    t, res = run_in_thread(loop, main)
    wait_running(loop)
    for i in range(200):
        loop.call_soon(ran.append, ("soon", i))
        loop.call_later(0.01, ran.append, ("later", i))
    loop.call_soon_threadsafe(lambda: None)
    deadline = time.monotonic() + 10
    while len(ran) < 400 and time.monotonic() < deadline:
        loop.call_soon_threadsafe(lambda: None)
        time.sleep(0.01)
    got.set()
    loop.call_soon_threadsafe(lambda: None)
    t.join(10)
    assert res["result"] == sorted([("soon", i) for i in range(200)] +
                                   [("later", i) for i in range(200)])


def test_close_races_call_soon_threadsafe(new_loop):
    """close() in one thread while others keep calling call_soon_threadsafe():
    each call either schedules or raises RuntimeError('Event loop is
    closed'); nothing crashes, nothing is written to a closed fd."""
    for _ in range(10):
        lp = new_loop()
        errors, stop = [], threading.Event()

        def hammer():
            for _ in range(20_000):
                if stop.is_set():
                    return
                try:
                    lp.call_soon_threadsafe(lambda: None)
                except RuntimeError as exc:
                    errors.append(str(exc))
                    return

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        lp.run_until_complete(asyncio.sleep(0.005))
        lp.close()
        time.sleep(0.005)
        stop.set()
        for t in threads:
            t.join(10)
        assert set(errors) <= {"Event loop is closed"}
        with pytest.raises(RuntimeError, match="Event loop is closed"):
            lp.call_soon_threadsafe(lambda: None)


def test_stop_and_state_from_another_thread(loop):
    async def main():
        await asyncio.sleep(30)

    task = loop.create_task(main())
    t = threading.Thread(target=loop.run_forever)
    t.start()
    wait_running(loop)
    assert loop.is_running() and not loop.is_closed()
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)
    assert not t.is_alive() and not loop.is_running()
    task.cancel()
    loop.run_until_complete(asyncio.gather(task, return_exceptions=True))


def test_loops_in_threads_each_on_its_own(raw_loop_factory):
    """Eight loops in eight threads at once, each running its own tasks and
    timers, with threadsafe calls from every other thread: none lost."""
    n = 8
    loops = [raw_loop_factory() for _ in range(n)]
    counts = [0] * n
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def bump(i):
        with lock:
            counts[i] += 1

    async def main(i):
        barrier.wait()
        for k in range(200):
            await asyncio.sleep(0)
            for j in range(n):
                if j != i:
                    loops[j].call_soon_threadsafe(bump, j)
            if k % 50 == 0:
                await asyncio.sleep(0.001)
        await asyncio.sleep(0.2)

    results = {}

    def run(i):
        try:
            loops[i].run_until_complete(main(i))
            results[i] = "ok"
        except BaseException as exc:   # noqa: BLE001
            results[i] = repr(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for lp in loops:
        lp.run_until_complete(asyncio.sleep(0))   # the last threadsafe calls
        lp.close()
    assert results == {i: "ok" for i in range(n)}
    assert counts == [200 * (n - 1)] * n


# What CPython 3.14's test_asyncio.test_free_threading checks of a loop
# (3.13's test suite has no such module), on the default Task and Future.

def test_tasks_of_ten_loops_at_once(raw_loop_factory):
    errors = []

    async def main():
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        async def coro():
            await future

        async with asyncio.TaskGroup() as tg:
            tasks = {tg.create_task(coro()) for _ in range(100)}
            all_tasks = asyncio.all_tasks(loop)
            assert all_tasks == tasks | {asyncio.current_task()}
            assert all(t.get_loop() is loop and not t.done() for t in tasks)
            future.set_result(None)

    def runner():
        try:
            with asyncio.Runner(loop_factory=raw_loop_factory) as r:
                r.run(main())
        except BaseException as exc:   # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=runner) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_task_of_another_thread_finalized_here(raw_loop_factory):
    import gc
    import weakref
    box = {}

    async def func():
        box["task"] = asyncio.current_task()

    def runner():
        with asyncio.Runner(loop_factory=raw_loop_factory) as r:
            r.run(func())

    t = threading.Thread(target=runner)
    t.start()
    t.join(30)
    wr = weakref.ref(box.pop("task"))
    gc.collect()
    assert wr() is None


@pytest.mark.parametrize("fails", [False, True], ids=["result", "exception"])
def test_run_coroutine_threadsafe_from_ten_threads(raw_loop_factory, fails):
    class Boom(Exception):
        pass

    async def coro():
        await asyncio.sleep(0.01)
        if fails:
            raise Boom("test")
        return 42

    def in_thread(loop):
        return asyncio.run_coroutine_threadsafe(coro(), loop).result(timeout=30)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [asyncio.to_thread(in_thread, loop) for _ in range(10)]
        return await asyncio.gather(*jobs, return_exceptions=True)

    with asyncio.Runner(loop_factory=raw_loop_factory) as r:
        results = r.run(main())
    if fails:
        assert [(type(x).__name__, str(x)) for x in results] == [("Boom", "test")] * 10
    else:
        assert results == [42] * 10
