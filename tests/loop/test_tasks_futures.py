"""Futures, tasks, task factories and the asyncio high-level API on the loop."""
import asyncio
import contextvars
import inspect

import pytest

var = contextvars.ContextVar("var", default="default")


# 3.14's create_task(coro, **kwargs) hands name= to the task factory; before
# (3.13's create_task(coro, *, name=None, context=None, **kwargs) too), the
# name is set on the task the factory returns.
CREATE_TASK_PASSES_KWARGS = "name" not in inspect.signature(
    asyncio.BaseEventLoop.create_task).parameters


def test_create_future(loop):
    fut = loop.create_future()
    assert isinstance(fut, asyncio.Future)
    assert fut.get_loop() is loop
    assert not fut.done()
    loop.call_soon(fut.set_result, 1)
    assert loop.run_until_complete(fut) == 1


def test_future_done_callbacks_run_via_loop(loop):
    fut = loop.create_future()
    out = []
    fut.add_done_callback(lambda f: out.append(("cb", f.result())))
    fut.set_result(5)
    assert out == []  # scheduled with call_soon, not called inline
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == [("cb", 5)]


def test_create_task_name_and_result(loop):
    async def coro():
        await asyncio.sleep(0)
        return asyncio.current_task().get_name()

    task = loop.create_task(coro(), name="my-task")
    assert isinstance(task, asyncio.Task)
    assert task.get_name() == "my-task"
    assert task.get_loop() is loop
    assert loop.run_until_complete(task) == "my-task"


def test_create_task_context(loop):
    ctx = contextvars.copy_context()
    ctx.run(var.set, "task-ctx")

    async def coro():
        await asyncio.sleep(0)
        v = var.get()
        var.set("changed")
        return v

    task = loop.create_task(coro(), context=ctx)
    assert loop.run_until_complete(task) == "task-ctx"
    assert ctx[var] == "changed"
    assert var.get() == "default"


def test_task_factory(loop):
    calls = []

    def factory(lp, coro, **kwargs):
        calls.append((lp, kwargs))
        return asyncio.Task(coro, loop=lp, **kwargs)

    assert loop.get_task_factory() is None
    loop.set_task_factory(factory)
    assert loop.get_task_factory() is factory

    async def coro():
        return 7

    task = loop.create_task(coro(), name="factory-made")
    assert task.get_name() == "factory-made"
    assert loop.run_until_complete(task) == 7
    ctx = contextvars.copy_context()
    assert loop.run_until_complete(loop.create_task(coro(), context=ctx)) == 7
    named = {"name": "factory-made"} if CREATE_TASK_PASSES_KWARGS else {}
    assert calls == [(loop, named), (loop, {"context": ctx})]
    # coroutines passed to run_until_complete go through the factory too
    assert loop.run_until_complete(coro()) == 7
    assert len(calls) == 3
    loop.set_task_factory(None)
    assert loop.get_task_factory() is None


def test_task_factory_type_error(loop):
    with pytest.raises(TypeError, match="^task factory must be a callable or None$"):
        loop.set_task_factory(1)
    assert loop.get_task_factory() is None


def test_all_tasks_and_current_task(loop):
    async def child():
        await asyncio.sleep(0.01)

    async def main():
        me = asyncio.current_task()
        t = asyncio.create_task(child())
        tasks = asyncio.all_tasks()
        assert me in tasks and t in tasks
        assert asyncio.current_task(loop) is me
        await t
        return me

    me = loop.run_until_complete(main())
    assert me.done()
    assert asyncio.all_tasks(loop) == set()
    assert asyncio.current_task(loop) is None


def test_task_cancel(loop):
    async def sleeper():
        await asyncio.sleep(10)

    async def main():
        t = asyncio.create_task(sleeper())
        await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        return t.cancelled()

    assert loop.run_until_complete(main()) is True


def test_taskgroup(loop):
    async def work(i):
        await asyncio.sleep(0.001 * i)
        return i

    async def main():
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(work(i)) for i in range(5)]
        return [t.result() for t in tasks]

    assert loop.run_until_complete(main()) == [0, 1, 2, 3, 4]


def test_taskgroup_error_cancels_siblings(loop):
    cancelled = []

    async def bad():
        await asyncio.sleep(0.01)
        raise ValueError("bad")

    async def sleeper():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        async with asyncio.TaskGroup() as tg:
            tg.create_task(bad())
            tg.create_task(sleeper())

    with pytest.raises(ExceptionGroup) as ei:
        loop.run_until_complete(main())
    assert [type(e) for e in ei.value.exceptions] == [ValueError]
    assert cancelled == [True]


def test_timeout(loop):
    async def main():
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await asyncio.sleep(10)
        return loop.time() - t0

    elapsed = loop.run_until_complete(main())
    assert 0.04 <= elapsed < 5


def test_timeout_at_and_reschedule(loop):
    async def main():
        async with asyncio.timeout(None) as cm:
            assert cm.when() is None
            cm.reschedule(loop.time() + 10)
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout_at(loop.time() + 0.02):
                await asyncio.sleep(10)
        return "ok"

    assert loop.run_until_complete(main()) == "ok"


def test_wait_for(loop):
    async def slow():
        await asyncio.sleep(10)

    async def fast():
        await asyncio.sleep(0.001)
        return "fast"

    async def main():
        assert await asyncio.wait_for(fast(), 5) == "fast"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(slow(), 0.02)
        return "ok"

    assert loop.run_until_complete(main()) == "ok"


def test_gather(loop):
    async def work(i):
        await asyncio.sleep(0)
        if i == 3:
            raise KeyError(i)
        return i

    async def main():
        res = await asyncio.gather(*(work(i) for i in range(5)), return_exceptions=True)
        ok = await asyncio.gather(work(0), work(1))
        return res, ok

    res, ok = loop.run_until_complete(main())
    assert res[:3] == [0, 1, 2] and res[4] == 4
    assert isinstance(res[3], KeyError)
    assert ok == [0, 1]


def test_shield(loop):
    async def inner():
        await asyncio.sleep(0.02)
        return "inner-done"

    async def main():
        t = asyncio.ensure_future(inner())
        outer = asyncio.shield(t)
        await asyncio.sleep(0)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        return await t

    assert loop.run_until_complete(main()) == "inner-done"


def test_wait_first_completed(loop):
    async def main():
        a = asyncio.create_task(asyncio.sleep(0.01, result="a"))
        b = asyncio.create_task(asyncio.sleep(5, result="b"))
        done, pending = await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {a} and pending == {b}
        b.cancel()
        return a.result()

    assert loop.run_until_complete(main()) == "a"


def test_as_completed_order(loop):
    async def main():
        coros = [asyncio.sleep(d, result=d) for d in (0.03, 0.01, 0.02)]
        return [await f for f in asyncio.as_completed(coros)]

    assert loop.run_until_complete(main()) == [0.01, 0.02, 0.03]


def test_queue(loop):
    async def main():
        q = asyncio.Queue(maxsize=2)
        got = []

        async def producer():
            for i in range(10):
                await q.put(i)
            await q.put(None)

        async def consumer():
            while (item := await q.get()) is not None:
                got.append(item)
                q.task_done()
            q.task_done()

        await asyncio.gather(producer(), consumer())
        await q.join()
        return got

    assert loop.run_until_complete(main()) == list(range(10))


def test_lock_event_semaphore_condition(loop):
    async def main():
        lock = asyncio.Lock()
        order = []

        async def locked(i):
            async with lock:
                order.append(("in", i))
                await asyncio.sleep(0.001)
                order.append(("out", i))

        await asyncio.gather(*(locked(i) for i in range(3)))
        assert order == [("in", 0), ("out", 0), ("in", 1), ("out", 1), ("in", 2), ("out", 2)]

        ev = asyncio.Event()
        loop.call_later(0.01, ev.set)
        await asyncio.wait_for(ev.wait(), 5)
        assert ev.is_set()

        sem = asyncio.Semaphore(2)
        active = [0, 0]

        async def limited():
            async with sem:
                active[0] += 1
                active[1] = max(active[1], active[0])
                await asyncio.sleep(0.001)
                active[0] -= 1

        await asyncio.gather(*(limited() for _ in range(6)))
        assert active[1] == 2

        cond = asyncio.Condition()
        state = []

        async def waiter():
            async with cond:
                await cond.wait_for(lambda: state)
                return state[0]

        async def notifier():
            await asyncio.sleep(0.005)
            async with cond:
                state.append("ready")
                cond.notify_all()

        res = await asyncio.gather(waiter(), waiter(), notifier())
        assert res[:2] == ["ready", "ready"]

        barrier = asyncio.Barrier(3)
        idx = await asyncio.gather(*(barrier.wait() for _ in range(3)))
        assert sorted(idx) == [0, 1, 2]
        return "ok"

    assert loop.run_until_complete(main()) == "ok"


def test_ensure_future_on_loop(loop):
    async def coro():
        return 1

    t = asyncio.ensure_future(coro(), loop=loop)
    assert t.get_loop() is loop
    assert loop.run_until_complete(t) == 1


def test_future_from_other_loop_refused(loop, new_loop):
    other = new_loop()
    fut = other.create_future()
    with pytest.raises(ValueError, match="different loop"):
        loop.run_until_complete(fut)


def test_task_exception_never_retrieved_reported(loop):
    import gc

    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

    async def boom():
        raise RuntimeError("lost")

    t = loop.create_task(boom())
    loop.run_until_complete(asyncio.sleep(0.01))
    assert t.done()
    del t
    gc.collect()
    msgs = [c["message"] for c in contexts]
    assert msgs == ["Task exception was never retrieved"]
    assert isinstance(contexts[0]["exception"], RuntimeError)


def test_sleep_zero_yields(loop):
    out = []

    async def a():
        for i in range(3):
            out.append(("a", i))
            await asyncio.sleep(0)

    async def b():
        for i in range(3):
            out.append(("b", i))
            await asyncio.sleep(0)

    async def main():
        await asyncio.gather(a(), b())

    loop.run_until_complete(main())
    assert out == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
