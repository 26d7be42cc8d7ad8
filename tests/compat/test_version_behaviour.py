"""Behaviour that changed between CPython releases, on the stock loop and on
tideloop, each expectation taken from what this interpreter's asyncio does:

- 3.14: call_soon_threadsafe() returns a _ThreadSafeHandle whose cancel()
  from another thread waits for the running callback;
- the classes create_task()/create_future() instantiate are read at call time
  (asyncio.tasks.Task, asyncio.futures.Future), as the stock loop reads them;
- later 3.13 releases and 3.14 run a custom exception handler in the context
  of the handle whose callback failed (gh-96704): it sees what the callback
  set;
- a child's exit is reaped and published in one step, so that send_signal()
  never signals a PID already reaped (gh-127049; tideloop on every version,
  the stock loop where it has the fix);
- 3.12+ (pidfd watching): the pidfd is closed even if waitpid() fails oddly.
"""
import asyncio
import contextvars
import inspect
import os
import signal
import sys
import threading
import time
from unittest import mock

import pytest

from net_helpers import arun, open_fds

SH = "/bin/sh"
HAS_THREADSAFE_HANDLE = hasattr(asyncio.events, "_ThreadSafeHandle")
# call_exception_handler runs a custom handler in thing.get_context().
HANDLER_IN_CALLBACK_CONTEXT = "get_context()" in inspect.getsource(
    asyncio.BaseEventLoop.call_exception_handler)
# The stock loop reaps and publishes in one step (3.14's watchers).
STOCK_REAPS_ATOMICALLY = hasattr(getattr(asyncio.unix_events, "_ThreadedChildWatcher", None),
                                 "_reap_and_notify")


@pytest.mark.skipif(not HAS_THREADSAFE_HANDLE,
                    reason="call_soon_threadsafe returns a _ThreadSafeHandle from 3.14")
def test_threadsafe_handle_cancel_waits_for_running_callback(loop):
    started, finished = threading.Event(), threading.Event()
    seen = {}

    def callback(arg):
        started.set()
        seen["arg"] = arg
        time.sleep(0.3)
        finished.set()

    def other_thread():
        handle = loop.call_soon_threadsafe(callback, "hello")
        seen["type"] = isinstance(handle, asyncio.events._ThreadSafeHandle)
        started.wait(5)
        handle.cancel()                 # blocks until callback returned
        seen["finished_at_cancel"] = finished.is_set()
        loop.call_soon_threadsafe(loop.stop)

    t = threading.Thread(target=other_thread)
    t.start()
    loop.run_forever()
    t.join(5)
    assert seen == {"type": True, "arg": "hello", "finished_at_cancel": True}


@pytest.mark.skipif(not HAS_THREADSAFE_HANDLE,
                    reason="call_soon_threadsafe returns a _ThreadSafeHandle from 3.14")
def test_threadsafe_handle_cancelled_before_it_runs(loop):
    ran = []
    h = loop.call_soon_threadsafe(ran.append, 1)
    h.cancel()
    assert h.cancelled()
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ran == []


def test_task_and_future_classes_read_at_call_time(loop, monkeypatch):
    class MyFuture(asyncio.futures._PyFuture):
        pass

    class MyTask(asyncio.tasks._PyTask):
        pass

    monkeypatch.setattr(asyncio.futures, "Future", MyFuture)
    monkeypatch.setattr(asyncio.tasks, "Task", MyTask)

    async def main():
        return 5

    fut = loop.create_future()
    task = loop.create_task(main())
    assert type(fut) is MyFuture and type(task) is MyTask
    assert loop.run_until_complete(task) == 5
    fut.cancel()


def test_exception_handler_context(loop):
    var = contextvars.ContextVar("var", default="outside")
    seen = []

    def handler(lp, context):
        seen.append(var.get())
        lp.stop()

    def callback():
        var.set("set by the callback")
        1 / 0

    loop.set_exception_handler(handler)
    loop.call_soon(callback)
    loop.run_forever()
    expected = "set by the callback" if HANDLER_IN_CALLBACK_CONTEXT else "outside"
    assert seen == [expected]


def test_send_signal_never_targets_reaped_pid(request, loop_name, loop):
    if loop_name == "asyncio" and not STOCK_REAPS_ATOMICALLY:
        request.node.add_marker(pytest.mark.xfail(strict=False, reason=(
            "stock asyncio before 3.14's fix (gh-127049): the child is reaped "
            "an iteration before its exit is published")))
    reaped, stale = set(), []
    orig_waitpid, orig_kill = os.waitpid, os.kill

    def waitpid(pid, options):
        res = orig_waitpid(pid, options)
        if res[0] != 0:
            reaped.add(res[0])
        return res

    def kill(pid, sig):
        if pid in reaped:
            stale.append(pid)
            return
        orig_kill(pid, sig)

    async def main():
        with mock.patch("os.waitpid", waitpid), mock.patch("os.kill", kill):
            proc = await asyncio.create_subprocess_exec(SH, "-c", "exec sleep 30")
            proc.kill()
            deadline = loop.time() + 10
            while proc.returncode is None:
                assert loop.time() < deadline, "exit not published"
                proc.kill()
                await asyncio.sleep(0)
            assert await proc.wait() == -signal.SIGKILL

    arun(loop, main())
    assert stale == []


def _stock_pidfd_watcher_closes_on_error():
    watcher = (getattr(asyncio.unix_events, "_PidfdChildWatcher", None)
               or getattr(asyncio.unix_events, "PidfdChildWatcher", None))
    return watcher is not None and "finally:" in inspect.getsource(watcher._do_wait)


@pytest.mark.skipif(sys.version_info < (3, 12),
                    reason="3.11's stock loop waits for children in threads")
def test_pidfd_closed_when_waitpid_raises(request, loop_name, loop):
    if loop_name == "asyncio" and not _stock_pidfd_watcher_closes_on_error():
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=(
            "stock asyncio before the fix: the pidfd watcher leaks the pidfd when "
            "waitpid() raises something other than ChildProcessError")))
    loop.set_exception_handler(lambda lp, ctx: None)

    async def main():
        before = len(open_fds())
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; sys.stdin.read()",
            stdin=asyncio.subprocess.PIPE)
        with mock.patch.object(os, "waitpid", side_effect=OSError("unexpected")) as m:
            proc.stdin.close()
            while not m.called:
                await asyncio.sleep(0)
        os.waitpid(proc.pid, 0)
        proc._transport._process_exited(0)
        await proc.wait()
        return before, len(open_fds())

    before, after = arun(loop, main())
    assert after == before
