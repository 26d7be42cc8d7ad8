"""tideloop.diagnostics' task accounting (issue 13, part 4): per-task CPU
time, steps, age, top_tasks and the leak report.

A tideloop-only API (the stock loop keeps none of this), so these tests run
on tideloop alone.  Each detector is checked against a planted fault: a
task spinning 50 ms per step must come first in top_tasks, a task created
and never awaited must be in the leak report, awaited ones must not."""
import asyncio
import gc
import sys
import threading
import time

import pytest

from tideloop import diagnostics

from .test_stats import tl  # noqa: F401 - the tideloop-only fixture


def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def spinner(steps=3, seconds=0.05):
    for _ in range(steps):
        busy(seconds)
        await asyncio.sleep(0)


async def light(steps=10):
    for _ in range(steps):
        await asyncio.sleep(0)


async def short():
    await asyncio.sleep(0)
    return 1


async def timed():
    await asyncio.sleep(0.001)      # its last step is a wakeup by a future
    return 1


def by_name(stats):
    return {t["task"]: t for t in stats}


def test_a_spinning_task_comes_first(tl):
    assert diagnostics.track_tasks(loop=tl) is False

    async def main():
        await asyncio.gather(asyncio.create_task(spinner(), name="spinner"),
                             asyncio.create_task(light(), name="light"))
        return diagnostics.top_tasks(3)

    top = tl.run_until_complete(main())
    assert top[0]["task"] == "spinner" and top[0]["coroutine"] == "spinner"
    assert 0.15 <= top[0]["cpu"] < 0.5
    assert top[0]["steps"] == 4 and top[0]["state"] == "done"
    stats = by_name(top)
    assert stats["light"]["steps"] == 11 and stats["light"]["cpu"] < 0.05
    # main() gathered them: the spinner's time is not main's
    [main_stats] = [t for t in top if t["coroutine"].endswith(".main")]
    assert main_stats["cpu"] < 0.05    # not the spinner's 0.15 s
    assert top[0]["age"] >= top[0]["cpu"] and 0 <= top[0]["idle"] <= top[0]["age"]
    assert tl.diagnostics()["callback_timing"] is True
    assert diagnostics.track_tasks(False, loop=tl) is True
    assert tl.diagnostics()["callback_timing"] is False
    with pytest.raises(RuntimeError, match="track_tasks"):
        diagnostics.top_tasks(loop=tl)


def test_a_task_nobody_awaits_is_a_leak(tl):
    diagnostics.track_tasks(origins=True, loop=tl)
    line = sys._getframe().f_lineno + 4

    async def main():
        kept = [asyncio.create_task(short(), name="awaited")]
        asyncio.create_task(short(), name="forgotten")      # the planted faults
        asyncio.create_task(timed(), name="forgotten too")
        asyncio.create_task(asyncio.sleep(0), name="asyncio's own")  # not reported
        waited = asyncio.create_task(short(), name="waited-on")
        await asyncio.wait([waited])
        async with asyncio.TaskGroup() as group:
            group.create_task(short(), name="grouped")
        awaiting = asyncio.create_task(short(), name="awaiting")
        await awaiting
        failing = asyncio.create_task(asyncio.sleep(0), name="failing-later")
        await asyncio.sleep(0.01)
        await kept[0]       # awaited after it finished: held until then
        await failing

    if sys.version_info < (3, 11):      # pragma: no cover - TaskGroup
        pytest.skip("TaskGroup")
    tl.run_until_complete(main())
    report = diagnostics.task_leaks(60, loop=tl)
    assert report["pending"] == []
    expected = [("short", 1, (__file__, line)), ("timed", 1, (__file__, line + 1))]
    groups = sorted((g["coroutine"], g["count"], g["origin"]) for g in report["unwaited"])
    assert groups == expected, report
    # still counted once the tasks are collected
    gc.collect()
    report = diagnostics.task_leaks(60, loop=tl)
    assert sorted((g["coroutine"], g["count"], g["origin"]) for g in report["unwaited"]) == expected


def test_a_task_pending_too_long(tl, caplog):
    diagnostics.track_tasks(loop=tl)
    got = []

    def listener(kind, loop, report):
        got.append((kind, report))
    diagnostics.subscribe(listener)

    async def main():
        stuck = asyncio.create_task(asyncio.Event().wait(), name="stuck")
        await asyncio.sleep(0.05)
        with caplog.at_level("WARNING", logger="tideloop.diagnostics"):
            report = diagnostics.report_task_leaks(0.03)
        young = diagnostics.task_leaks(10)
        stuck.cancel()
        return report, young

    try:
        report, young = tl.run_until_complete(main())
    finally:
        diagnostics.unsubscribe(listener)
    [group] = [g for g in report["pending"] if g["tasks"] == ["stuck"]]
    assert group["coroutine"] == "Event.wait" and 0.05 <= group["oldest"] < 1
    assert all(g["tasks"] != ["stuck"] for g in young["pending"])
    records = [r for r in caplog.records if getattr(r, "tideloop_task_leak", None)]
    assert any("stuck" in r.getMessage() and "pending for" in r.getMessage() for r in records)
    assert ("task_leak", dict(group, kind="pending")) in got


@pytest.mark.skipif(not hasattr(asyncio, "eager_task_factory"), reason="3.12+: eager tasks")
def test_an_eager_task_first_step_is_its_own(tl):
    diagnostics.track_tasks(loop=tl)

    async def eager_spinner():
        busy(0.06)                  # runs inside create_task
        await asyncio.sleep(0)
        busy(0.03)
        return 1

    async def main():
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
        child = asyncio.create_task(eager_spinner(), name="eager")
        instant = asyncio.create_task(short(), name="instant")
        await child
        await instant
        return diagnostics.task_stats()

    stats = by_name(tl.run_until_complete(main()))
    assert 0.09 <= stats["eager"]["cpu"] < 0.5 and stats["eager"]["steps"] == 2
    [main_stats] = [t for t in stats.values() if t["coroutine"].endswith(".main")]
    assert main_stats["cpu"] < 0.05    # not the eager step's 0.06 s
    assert diagnostics.task_leaks(60, loop=tl)["unwaited"] == []


def test_python_tasks_are_tracked_too(tl):
    py_task = getattr(asyncio.tasks, "_PyTask", None)
    if py_task is None or py_task is asyncio.Task:     # pragma: no cover
        pytest.skip("no separate Python Task")
    diagnostics.track_tasks(loop=tl)
    tl.set_task_factory(lambda loop, coro, **kw: py_task(coro, loop=loop, **kw))

    async def main():
        await asyncio.create_task(spinner(2, 0.03), name="py")
        return diagnostics.top_tasks(1)

    [top] = tl.run_until_complete(main())
    assert top["task"] == "py" and top["steps"] == 3 and top["cpu"] >= 0.06


def test_stats_are_read_on_the_loop_thread(tl):
    diagnostics.track_tasks(loop=tl)
    errors = []

    def reader():
        try:
            tl._task_stats()
        except RuntimeError as exc:
            errors.append(str(exc))

    async def main():
        t = threading.Thread(target=reader)
        t.start()
        while t.is_alive():
            await asyncio.sleep(0.001)

    tl.run_until_complete(main())
    assert errors and "loop's own thread" in errors[0]
    assert isinstance(tl._task_stats(), tuple)      # not running: any thread


def test_cancelled_callbacks_under_tracking(tl):
    # A cancelled Handle's callback is gone (None) when its turn comes.
    diagnostics.track_tasks(loop=tl)
    ran = []
    tl.call_soon(ran.append, 1).cancel()
    tl.call_soon(ran.append, 2)

    async def main():
        task = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        task.cancel()                   # its wakeup is cancelled, a step is queued
        with pytest.raises(asyncio.CancelledError):
            await task

    tl.run_until_complete(main())
    assert ran == [2]


def test_many_short_tasks_keep_the_table_small(tl):
    diagnostics.track_tasks(loop=tl)

    async def main():
        for _ in range(20):
            await asyncio.gather(*(short() for _ in range(500)))
        return diagnostics.task_stats()

    stats = tl.run_until_complete(main())
    gc.collect()
    live, gone, untracked = tl._task_stats()
    assert untracked == 0 and gone == {}
    assert len(live) <= 1 + 500     # main, and at most the last batch alive
    assert len(stats) <= 1 + 500 * 2


def test_the_environment_variable_turns_tracking_on(monkeypatch):
    import tideloop
    monkeypatch.setenv("TIDELOOP_DIAGNOSTICS", "tasks=origins")
    loop = tideloop.new_event_loop()
    try:
        assert loop._task_stats() == ([], {}, 0)
        assert diagnostics.track_tasks(loop=loop) is True
    finally:
        loop.close()
    monkeypatch.setenv("TIDELOOP_DIAGNOSTICS", "tasks=everything")
    loop = tideloop.new_event_loop()        # warned of, left out: the program runs on
    try:
        assert loop._task_stats() is None
    finally:
        loop.close()


def test_the_asking_task_and_awaited_tasks_are_not_pending_leaks(tl):
    # A server's shape: a main task (run_forever: no done callback) that
    # asks for the report, a worker that a boss task awaits, and a lone
    # task nothing awaits.  Only the tasks nothing waits for are
    # long-pending; the asking task and the awaited worker are not.
    diagnostics.track_tasks(loop=tl)
    out = []

    async def forever():
        await asyncio.sleep(3600)

    async def boss(worker):
        await worker

    async def main():
        worker = asyncio.create_task(forever(), name="worker")
        bosses = [asyncio.create_task(boss(worker), name="boss")]
        lone = asyncio.create_task(forever(), name="lone")
        await asyncio.sleep(0.1)
        out.append(diagnostics.task_leaks(pending_for=0.05))
        for t in (worker, lone, *bosses):
            t.cancel()
        await asyncio.gather(worker, lone, *bosses, return_exceptions=True)
        tl.stop()

    task = tl.create_task(main(), name="main")
    tl.run_forever()
    assert task.done()
    [report] = out
    assert sorted(n for g in report["pending"] for n in g["tasks"]) == ["boss", "lone"]
    assert report["unwaited"] == []


def test_a_task_that_asyncio_made_in_a_callback_has_no_made_up_origin(tl):
    # A stream server's connection handler is created by asyncio inside a
    # loop callback: the frames past the loop's run (this test's) are not
    # its creator, so its origin is unknown rather than a wrong line.
    diagnostics.track_tasks(origins=True, loop=tl)
    seen = []

    async def handle(reader, writer):
        seen.append(asyncio.current_task())
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
        await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        mine = asyncio.create_task(asyncio.sleep(0))      # made here: this line
        await mine
        return {t["id"]: t["origin"] for t in diagnostics.task_stats()}, mine

    origins, mine = tl.run_until_complete(main())
    assert origins[id(seen[0])] is None
    assert origins[id(mine)] == (__file__, sys._getframe().f_lineno - 6)


def test_an_error_in_the_accounting_is_reported_not_swallowed(tl):
    # The accounting asks a finished fire-and-forget task for its coroutine
    # (its name goes in the leak report).  An error there must not stop the
    # loop, nor vanish: sys.unraisablehook gets it, with the task.
    class Failing(asyncio.Task):
        def get_coro(self):
            raise MemoryError("planted in get_coro")

    diagnostics.track_tasks(loop=tl)
    tl.set_task_factory(lambda loop, coro, **kw: Failing(coro, loop=loop, **kw))
    seen = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = seen.append

    async def main():
        asyncio.get_running_loop().create_task(short())    # nobody awaits it
        for _ in range(3):
            await asyncio.sleep(0)
        return "went on"

    try:
        assert tl.run_until_complete(main()) == "went on"
    finally:
        sys.unraisablehook = old_hook
    planted = [u for u in seen if isinstance(u.exc_value, MemoryError)]
    assert planted, seen
    assert isinstance(planted[0].object, Failing)
