"""Fork: a child using the parent's loop must not disturb the parent's poller."""
import asyncio
import os
import socket
import time

import pytest

pytestmark = pytest.mark.main_interpreter(
    "os.fork(): an isolated subinterpreter refuses it (RuntimeError: fork not supported "
    "for isolated subinterpreters)")

CHILD_OK, CHILD_REFUSED, CHILD_OTHER_ERROR, CHILD_CRASH = 0, 2, 3, 4


def _wait_child(pid, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("forked child hung")


def _fork(child_fn):
    pid = os.fork()
    if pid == 0:  # child
        code = CHILD_CRASH
        try:
            child_fn()
            code = CHILD_OK
        except RuntimeError:
            code = CHILD_REFUSED
        except BaseException:
            code = CHILD_OTHER_ERROR
        finally:
            os._exit(code)
    return pid


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _assert_parent_loop_works(loop, a, b, got):
    # the reader registered before fork still fires
    b.send(b"after-fork")
    guard = loop.call_later(5, loop.stop)
    loop.run_forever()
    guard.cancel()
    assert got == [b"after-fork"]
    # timers, call_soon, threadsafe wakeup, tasks
    out = []
    loop.call_later(0.01, out.append, "timer")
    loop.call_soon(out.append, "soon")
    loop.call_later(0.03, loop.stop)
    loop.run_forever()
    assert out == ["soon", "timer"]
    assert loop.run_until_complete(asyncio.sleep(0.01, result="task")) == "task"
    import threading

    fut = loop.create_future()
    t = threading.Timer(0.02, loop.call_soon_threadsafe, (fut.set_result, "ts"))
    t.start()
    assert loop.run_until_complete(asyncio.wait_for(fut, 10)) == "ts"
    t.join()


def _install_reader(loop, a, got):
    def on_read():
        got.append(a.recv(100))
        loop.stop()

    loop.add_reader(a.fileno(), on_read)


def test_parent_loop_works_after_child_runs_it(loop_name, loop, pair):
    a, b = pair
    got = []
    _install_reader(loop, a, got)
    loop.run_until_complete(asyncio.sleep(0))

    if loop_name == "asyncio":
        # stock asyncio shares its epoll with the child: only benign use
        def child():
            loop.run_until_complete(asyncio.sleep(0))
    else:
        # tideloop must either refuse or give the child its own poller:
        # whatever the child registers or removes must not reach the parent
        def child():
            c1, c2 = socket.socketpair()
            loop.remove_reader(a.fileno())
            loop.add_reader(c1.fileno(), lambda: None)
            loop.call_soon_threadsafe(lambda: None)
            c2.send(b"x")
            loop.run_until_complete(asyncio.sleep(0.01))
            loop.remove_reader(c1.fileno())
            loop.close()

    pid = _fork(child)
    code = _wait_child(pid)
    assert code in (CHILD_OK, CHILD_REFUSED), f"child exit code {code}"
    _assert_parent_loop_works(loop, a, b, got)


def test_child_can_create_its_own_loop(loop_name, new_loop, pair):
    loop = new_loop()
    a, b = pair
    got = []
    _install_reader(loop, a, got)
    loop.run_until_complete(asyncio.sleep(0))

    def child():
        lp = new_loop()
        try:
            assert lp.run_until_complete(asyncio.sleep(0.01, result=5)) == 5
        finally:
            lp.close()

    pid = _fork(child)
    assert _wait_child(pid) == CHILD_OK
    _assert_parent_loop_works(loop, a, b, got)


def test_child_closing_parent_loop_does_not_affect_parent(loop_name, loop, pair):
    a, b = pair
    got = []
    _install_reader(loop, a, got)
    loop.run_until_complete(asyncio.sleep(0))

    def child():
        if loop_name == "asyncio":
            # stock asyncio's close() in a child removes the self-pipe from
            # the epoll set it shares with the parent (breaking the parent's
            # call_soon_threadsafe); only check the parent here
            pass
        else:
            loop.remove_reader(a.fileno())
            loop.close()

    pid = _fork(child)
    assert _wait_child(pid) in (CHILD_OK, CHILD_REFUSED)
    _assert_parent_loop_works(loop, a, b, got)
