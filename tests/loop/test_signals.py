"""add_signal_handler / remove_signal_handler, wakeup fd, Ctrl-C."""
import os
import signal
import socket
import threading
import time

import pytest

from loop_helpers import IN_MAIN_INTERPRETER, stop_after

# A test that installs a handler (or needs one of its own: Ctrl-C): signal
# handlers and the wakeup fd are the main thread's of the main interpreter
# only.  The argument checks run everywhere: both loops make them before
# they try the wakeup fd.
main_interpreter = pytest.mark.main_interpreter(
    "signal handlers and the wakeup fd work in the main thread of the main interpreter "
    "only (add_signal_handler raises RuntimeError elsewhere, on both loops)")


@pytest.fixture(autouse=True)
def _signal_state():
    """Each test starts and ends with default SIGUSR1/2 and no wakeup fd."""
    if not IN_MAIN_INTERPRETER:     # (neither can be set there)
        yield
        return
    assert signal.set_wakeup_fd(-1) == -1, "a wakeup fd leaked from a previous test"
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)}
    yield
    for s, h in before.items():
        signal.signal(s, h)
    signal.set_wakeup_fd(-1)


@main_interpreter
def test_signal_handler_runs_with_args(loop):
    got = []

    def handler(*args):
        got.append(args)
        loop.stop()

    loop.add_signal_handler(signal.SIGUSR1, handler, "a", 2)
    loop.call_soon(os.kill, os.getpid(), signal.SIGUSR1)
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [("a", 2)]


@main_interpreter
def test_signal_wakes_sleeping_loop(loop):
    got = []
    loop.add_signal_handler(signal.SIGUSR1, lambda: (got.append(time.monotonic()), loop.stop()))
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
    t0 = time.monotonic()
    timer.start()
    try:
        stop_after(loop, 20)
        loop.run_forever()
    finally:
        timer.cancel()
        timer.join()
    assert len(got) == 1
    assert got[0] - t0 < 5


@main_interpreter
def test_signal_handler_runs_in_loop_context_not_signal_context(loop):
    """The callback runs as a loop callback: get_running_loop() works."""
    seen = []
    import asyncio

    def handler():
        seen.append(asyncio.get_running_loop())
        loop.stop()

    loop.add_signal_handler(signal.SIGUSR2, handler)
    loop.call_soon(os.kill, os.getpid(), signal.SIGUSR2)
    stop_after(loop, 5)
    loop.run_forever()
    assert seen == [loop]


@main_interpreter
def test_multiple_signals(loop):
    got = []

    def handler(name):
        got.append(name)
        if len(got) == 2:
            loop.stop()

    loop.add_signal_handler(signal.SIGUSR1, handler, "usr1")
    loop.add_signal_handler(signal.SIGUSR2, handler, "usr2")
    loop.call_soon(os.kill, os.getpid(), signal.SIGUSR1)
    loop.call_later(0.02, os.kill, os.getpid(), signal.SIGUSR2)
    stop_after(loop, 5)
    loop.run_forever()
    assert got == ["usr1", "usr2"]


@main_interpreter
def test_replace_signal_handler(loop):
    got = []
    loop.add_signal_handler(signal.SIGUSR1, got.append, "old")
    loop.add_signal_handler(signal.SIGUSR1, lambda: (got.append("new"), loop.stop()))
    loop.call_soon(os.kill, os.getpid(), signal.SIGUSR1)
    stop_after(loop, 5)
    loop.run_forever()
    assert got == ["new"]


@main_interpreter
def test_remove_signal_handler(loop):
    loop.add_signal_handler(signal.SIGUSR1, lambda: None)
    assert signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN)
    assert loop.remove_signal_handler(signal.SIGUSR1) is True
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    assert loop.remove_signal_handler(signal.SIGUSR1) is False
    assert loop.remove_signal_handler(signal.SIGUSR2) is False


@main_interpreter
def test_remove_sigint_restores_default_int_handler(loop):
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    assert loop.remove_signal_handler(signal.SIGINT) is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@main_interpreter
def test_removed_handler_not_called(loop):
    got = []
    loop.add_signal_handler(signal.SIGUSR1, got.append, "x")
    loop.add_signal_handler(signal.SIGUSR2, lambda: loop.stop())
    loop.remove_signal_handler(signal.SIGUSR1)
    # SIGUSR1 now has the default action (terminate): ignore it instead
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    loop.call_soon(os.kill, os.getpid(), signal.SIGUSR1)
    loop.call_later(0.02, os.kill, os.getpid(), signal.SIGUSR2)
    stop_after(loop, 5)
    loop.run_forever()
    assert got == []


async def _coro_handler():
    pass


def test_coroutine_callback_refused(loop):
    with pytest.raises(TypeError, match=r"^coroutines cannot be used with add_signal_handler\(\)$"):
        loop.add_signal_handler(signal.SIGUSR1, _coro_handler)
    coro = _coro_handler()
    try:
        with pytest.raises(TypeError, match=r"^coroutines cannot be used with add_signal_handler\(\)$"):
            loop.add_signal_handler(signal.SIGUSR1, coro)
    finally:
        coro.close()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


@main_interpreter
def test_uncatchable_signal(loop):
    with pytest.raises(RuntimeError, match="^sig 9 cannot be caught$"):
        loop.add_signal_handler(signal.SIGKILL, lambda: None)
    with pytest.raises(RuntimeError, match="^sig 19 cannot be caught$"):
        loop.add_signal_handler(signal.SIGSTOP, lambda: None)
    # the failed registration left no wakeup fd behind
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.parametrize("sig", [0, 1000, -1])
def test_invalid_signal_number(loop, sig):
    with pytest.raises(ValueError, match=f"^invalid signal number {sig}$"):
        loop.add_signal_handler(sig, lambda: None)
    with pytest.raises(ValueError, match=f"^invalid signal number {sig}$"):
        loop.remove_signal_handler(sig)


@pytest.mark.parametrize("sig", ["x", 1.0, None])
def test_non_int_signal(loop, sig):
    with pytest.raises(TypeError) as ei:
        loop.add_signal_handler(sig, lambda: None)
    assert str(ei.value) == f"sig must be an int, not {sig!r}"
    with pytest.raises(TypeError):
        loop.remove_signal_handler(sig)


def test_add_signal_handler_from_non_main_thread(loop):
    errors = []

    def worker():
        try:
            loop.add_signal_handler(signal.SIGUSR1, lambda: None)
        except RuntimeError as e:
            errors.append(e)
        except BaseException as e:  # pragma: no cover - wrong type is a failure
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert len(errors) == 1
    assert type(errors[0]) is RuntimeError
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_add_signal_handler_on_closed_loop(new_loop):
    lp = new_loop()
    lp.close()
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        lp.add_signal_handler(signal.SIGUSR1, lambda: None)


@main_interpreter
def test_close_restores_signal_state(new_loop):
    lp = new_loop()
    lp.add_signal_handler(signal.SIGUSR1, lambda: None)
    lp.add_signal_handler(signal.SIGINT, lambda: None)
    assert signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, signal.SIG_IGN)
    lp.close()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.set_wakeup_fd(-1) == -1


@main_interpreter
def test_remove_last_handler_clears_wakeup_fd(loop):
    loop.add_signal_handler(signal.SIGUSR1, lambda: None)
    loop.add_signal_handler(signal.SIGUSR2, lambda: None)
    loop.remove_signal_handler(signal.SIGUSR1)
    # still one handler: the wakeup fd is still installed
    fd = signal.set_wakeup_fd(-1)
    assert fd != -1
    signal.set_wakeup_fd(fd)
    loop.remove_signal_handler(signal.SIGUSR2)
    assert signal.set_wakeup_fd(-1) == -1


@main_interpreter
def test_close_with_previous_wakeup_fd(loop_name, new_loop):
    """A wakeup fd installed before the loop: the loop resets it to -1 when
    its last handler goes (it does not put back a number it does not own)."""
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        signal.set_wakeup_fd(a.fileno())
        lp = new_loop()
        lp.add_signal_handler(signal.SIGUSR1, lambda: None)
        lp.close()
        assert signal.set_wakeup_fd(-1) == -1
    finally:
        signal.set_wakeup_fd(-1)
        a.close()
        b.close()


def _stray_bytes(sock):
    try:
        return sock.recv(100)
    except BlockingIOError:
        return b""


@main_interpreter
@pytest.mark.parametrize("how", ["close", "remove_signal_handler"])
def test_two_loops_leave_no_wakeup_fd_behind(loop_name, new_loop, how):
    """Two loops with handlers, ended in the order they were made, sockets
    opened in between (they take the first loop's closed fd numbers): a
    signal afterwards writes nothing into them, and no wakeup fd is left."""
    first, second = new_loop(), new_loop()
    first.add_signal_handler(signal.SIGUSR2, lambda: None)
    second.add_signal_handler(signal.SIGUSR2, lambda: None)
    if how == "close":
        first.close()
    else:
        first.remove_signal_handler(signal.SIGUSR2)
    # sockets that take the numbers the first loop's fds had
    socks = [s for _ in range(4) for s in socket.socketpair()]
    for sock in socks:
        sock.setblocking(False)
    try:
        if how == "close":
            second.close()
        else:
            second.remove_signal_handler(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, lambda *args: None)
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        assert signal.set_wakeup_fd(-1) == -1
        assert [_stray_bytes(sock) for sock in socks] == [b""] * len(socks)
    finally:
        for sock in socks:
            sock.close()
        first.close()
        second.close()


@main_interpreter
def test_a_collected_loop_leaves_no_wakeup_fd_behind(loop_name, new_loop):
    """A loop with a handler collected unclosed: it warns, closes, and the
    wakeup fd goes with it."""
    import gc
    import warnings
    factory = type(new_loop())      # the kind, without keeping a loop
    lp = factory()
    lp.add_signal_handler(signal.SIGUSR2, lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lp
        gc.collect()
    assert any("unclosed event loop" in str(w.message) for w in caught), caught
    assert signal.set_wakeup_fd(-1) == -1


# --- Ctrl-C -----------------------------------------------------------------
# Run in a fresh interpreter: a KeyboardInterrupt that escaped the loop at the
# wrong moment would otherwise abort the whole pytest session.


def test_sigint_interrupts_run_until_complete(run_script):
    proc = run_script(
        """
        import os, signal, threading, time
        loop = new_loop()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            loop.run_until_complete(asyncio.sleep(10))
        except KeyboardInterrupt:
            print("KI", round(time.monotonic() - t0, 1) < 5)
        else:
            print("no KI")
        print("running", loop.is_running())
        print("reusable", loop.run_until_complete(asyncio.sleep(0, result=1)))
        loop.close()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["KI True", "running False", "reusable 1"]


def test_sigint_in_callback_propagates_from_run_forever(run_script):
    proc = run_script(
        """
        import os, signal, time
        loop = new_loop()
        after = []
        loop.call_soon(os.kill, os.getpid(), signal.SIGINT)
        loop.call_soon(after.append, 1)
        loop.call_later(10, loop.stop)
        t0 = time.monotonic()
        try:
            loop.run_forever()
        except KeyboardInterrupt:
            print("KI", time.monotonic() - t0 < 5)
        print("running", loop.is_running())
        loop.close()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["KI True", "running False"]


def test_runner_sigint_cancels_main_task(run_script):
    proc = run_script(
        """
        import os, signal, threading, time
        async def main():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                print("main cancelled")
                raise
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            with asyncio.Runner(loop_factory=new_loop) as runner:
                runner.run(main())
        except KeyboardInterrupt:
            print("KI", time.monotonic() - t0 < 5)
        print("sigint restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["main cancelled", "KI True", "sigint restored True"]


def test_sigint_handler_via_add_signal_handler(run_script):
    proc = run_script(
        """
        import os, signal, threading
        loop = new_loop()
        got = []
        loop.add_signal_handler(signal.SIGINT, lambda: (got.append("int"), loop.stop()))
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        loop.call_later(10, loop.stop)
        loop.run_forever()
        print(got)
        loop.close()
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["['int']", "True"]


@main_interpreter
def test_signal_while_not_running_is_delivered_on_next_run(loop):
    got = []
    loop.add_signal_handler(signal.SIGUSR1, got.append, "late")
    os.kill(os.getpid(), signal.SIGUSR1)  # loop not running
    assert got == []
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    assert got == ["late"]


@main_interpreter
def test_signal_handler_exception_goes_to_handler(loop):
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

    def bad():
        raise ValueError("in signal handler")

    loop.add_signal_handler(signal.SIGUSR1, bad)
    loop.call_soon(os.kill, os.getpid(), signal.SIGUSR1)
    loop.call_later(0.05, loop.stop)
    loop.run_forever()
    assert len(contexts) == 1
    assert contexts[0]["message"].startswith("Exception in callback ")
    assert isinstance(contexts[0]["exception"], ValueError)


@main_interpreter
def test_signal_handler_with_loop_in_debug(loop):
    loop.set_debug(True)
    got = []
    loop.add_signal_handler(signal.SIGUSR1, lambda: (got.append(1), loop.stop()))
    loop.call_soon(os.kill, os.getpid(), signal.SIGUSR1)
    stop_after(loop, 5)
    loop.run_forever()
    assert got == [1]
