"""tideloop.threads.run() and reuse_port_socket(), on tideloop and on asyncio's loop.

run() takes the loop factory, so each test runs the same program with
``loop_factory=tideloop.new_event_loop`` and with asyncio's
``SelectorEventLoop`` (the conftest's raw_loop_factory) and expects the same
outcome.  The signal tests run in a child interpreter (run() handles SIGINT
and SIGTERM in the main thread: a stray one must not reach pytest).
"""
import asyncio
import errno
import logging
import os
import socket
import threading
import time

import pytest

import tideloop.threads


def loop_class(loop_name):
    if loop_name == "asyncio":
        return asyncio.SelectorEventLoop
    import tideloop
    return tideloop.Loop


# -- results, threads, loops ---------------------------------------------------

def test_each_thread_runs_main_on_a_loop_of_its_own(raw_loop_factory, loop_name):
    loops = []

    async def main(a, b):
        loop = asyncio.get_running_loop()
        loops.append(loop)
        await asyncio.sleep(0.01)
        return a + b, threading.current_thread().name, threading.get_ident()

    results = tideloop.threads.run(main, 1, 2, threads=3, loop_factory=raw_loop_factory)
    assert [r[:2] for r in results] == [(3, "tideloop-0"), (3, "tideloop-1"), (3, "tideloop-2")]
    assert threading.get_ident() not in {r[2] for r in results}
    assert len({id(lp) for lp in loops}) == 3
    assert all(isinstance(lp, loop_class(loop_name)) for lp in loops)
    assert all(lp.is_closed() for lp in loops)
    # the threads are gone once run() returns
    assert not [t for t in threading.enumerate() if t.name.startswith("tideloop-")]


def test_default_is_tideloop_one_thread_per_cpu():
    import tideloop

    async def main():
        return type(asyncio.get_running_loop())

    count = os.process_cpu_count() if hasattr(os, "process_cpu_count") else \
        len(os.sched_getaffinity(0))
    assert tideloop.threads.run(main) == [tideloop.Loop] * count


def test_bad_arguments():
    async def main():
        pass

    coro = main()
    with pytest.raises(TypeError, match="not a coroutine"):
        tideloop.threads.run(coro)
    coro.close()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            tideloop.threads.run(main, threads=bad)
    with pytest.raises(ValueError):
        tideloop.threads.run(main, threads=1, shutdown_timeout=-1)
    with pytest.raises(TypeError):
        tideloop.threads.run(42)


def test_run_from_a_thread_that_is_not_main(raw_loop_factory):
    """No signal handling there (signals reach the main thread only), the
    rest the same."""
    out = []

    async def main():
        return threading.current_thread().name

    t = threading.Thread(target=lambda: out.append(
        tideloop.threads.run(main, threads=2, loop_factory=raw_loop_factory)))
    t.start()
    t.join(20)
    assert out == [["tideloop-0", "tideloop-1"]]


# -- errors ---------------------------------------------------------------------------

def test_an_error_stops_the_others_and_is_raised(raw_loop_factory):
    stopped = []

    async def main():
        if threading.current_thread().name == "tideloop-1":
            await asyncio.sleep(0.05)
            raise ValueError("one thread failed")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.append(threading.current_thread().name)
            raise

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="one thread failed"):
        tideloop.threads.run(main, threads=3, loop_factory=raw_loop_factory)
    assert time.monotonic() - t0 < 10
    assert sorted(stopped) == ["tideloop-0", "tideloop-2"]


def test_an_error_before_the_others_have_started(raw_loop_factory):
    """A thread that fails at once: the others, started or not, stop."""
    async def main():
        if threading.current_thread().name == "tideloop-0":
            raise KeyError("at once")
        await asyncio.sleep(60)

    t0 = time.monotonic()
    with pytest.raises(KeyError):
        tideloop.threads.run(main, threads=8, loop_factory=raw_loop_factory)
    assert time.monotonic() - t0 < 10


def test_errors_in_several_threads_make_a_group(raw_loop_factory):
    barrier = threading.Barrier(3)

    async def main():
        barrier.wait(10)    # blocks the loop: no cancellation gets in before the raise
        raise OSError(threading.current_thread().name)

    with pytest.raises(ExceptionGroup) as info:
        tideloop.threads.run(main, threads=3, loop_factory=raw_loop_factory)
    assert sorted(str(e) for e in info.value.exceptions) == \
        ["tideloop-0", "tideloop-1", "tideloop-2"]
    assert all(type(e) is OSError for e in info.value.exceptions)


def test_a_base_exception_makes_a_base_group(raw_loop_factory):
    barrier = threading.Barrier(2)

    async def main():
        barrier.wait(10)
        if threading.current_thread().name == "tideloop-0":
            raise SystemExit(3)
        raise ValueError("and this")

    with pytest.raises(BaseExceptionGroup) as info:
        tideloop.threads.run(main, threads=2, loop_factory=raw_loop_factory)
    assert not isinstance(info.value, ExceptionGroup)
    assert sorted(type(e).__name__ for e in info.value.exceptions) == ["SystemExit", "ValueError"]


def test_a_lone_system_exit_is_raised_as_it_is(raw_loop_factory):
    """uvicorn's Server.serve() calls sys.exit(3) when its startup fails,
    from a task that is not the main one."""
    async def main():
        async def fail():
            raise SystemExit(3)
        await asyncio.ensure_future(fail())

    with pytest.raises(SystemExit) as info:
        tideloop.threads.run(main, threads=1, loop_factory=raw_loop_factory)
    assert info.value.code == 3


def test_a_thread_that_ends_normally_leaves_the_others_running(raw_loop_factory):
    async def main():
        if threading.current_thread().name == "tideloop-0":
            return "early"
        await asyncio.sleep(0.2)
        return "late"

    assert tideloop.threads.run(main, threads=2, loop_factory=raw_loop_factory) == \
        ["early", "late"]


def test_main_cancelled_by_itself_is_an_error(raw_loop_factory):
    async def main():
        asyncio.current_task().cancel()
        await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        tideloop.threads.run(main, threads=1, loop_factory=raw_loop_factory)


def test_a_thread_stuck_in_blocking_code_is_left_behind(raw_loop_factory, caplog):
    """After an error, a thread whose loop cannot be stopped (its main
    blocks) is reported by a TimeoutError once shutdown_timeout and the
    forced stop's grace are over; the error comes with it."""
    release, blocking = threading.Event(), threading.Event()

    async def main():
        if threading.current_thread().name == "tideloop-0":
            blocking.wait(10)
            raise ValueError("failed")
        blocking.set()
        release.wait(20)            # blocks its loop: neither cancel nor stop gets in

    t0 = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, "tideloop.threads"):
            with pytest.raises(TimeoutError, match=r"1 of 2 loop threads \(tideloop-1\)") as info:
                tideloop.threads.run(main, threads=2, loop_factory=raw_loop_factory,
                                     shutdown_timeout=0.3)
        assert isinstance(info.value.__cause__, ValueError)
        assert 2.0 < time.monotonic() - t0 < 10
        assert "by force" in caplog.text
    finally:
        release.set()


def test_shutdown_timeout_stops_the_loops(raw_loop_factory, caplog):
    """A main that ignores the first cancellation: shutdown_timeout after
    the error, its loop is stopped (the runner cancels it again)."""
    got = []

    async def main():
        if threading.current_thread().name == "tideloop-0":
            await asyncio.sleep(0.05)
            raise ValueError("failed")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            got.append("first cancel ignored")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            got.append("cancelled again")
            raise

    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, "tideloop.threads"):
        with pytest.raises(ValueError, match="failed"):
            tideloop.threads.run(main, threads=2, loop_factory=raw_loop_factory,
                                 shutdown_timeout=0.5)
    assert 0.5 <= time.monotonic() - t0 < 5
    assert got == ["first cancel ignored", "cancelled again"]
    assert "still running 0.5 s after the stop was asked" in caplog.text


# -- signals (in a child interpreter) ----------------------------------------------

SIGNAL_PROGRAM = """
import asyncio, os, signal, sys, threading, time
import tideloop.threads
SIG = getattr(signal, sys.argv[2])
STUBBORN = sys.argv[3] == "stubborn"
factory = new_loop
waiting = threading.Semaphore(0)
lock = threading.Lock()

async def main():
    try:
        waiting.release()       # no await before the sleep: the cancellation finds it there
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        with lock:
            sys.stdout.write(f"{threading.current_thread().name} cancelled "
                             f"{type(asyncio.get_running_loop()).__name__}\\n")
            sys.stdout.flush()
        if not STUBBORN:
            raise
    await asyncio.sleep(60)

def signals():
    for _ in range(2):
        waiting.acquire(timeout=10)
    os.kill(os.getpid(), SIG)
    if STUBBORN:
        time.sleep(0.3)
        os.kill(os.getpid(), SIG)

before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
threading.Thread(target=signals, daemon=True).start()
t0 = time.monotonic()
try:
    print("returned", tideloop.threads.run(main, threads=2, loop_factory=factory), flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
print("handlers restored:", before == {s: signal.getsignal(s) for s in before}, flush=True)
print("seconds", round(time.monotonic() - t0, 1))
"""


def run_signal_program(run_script, signame, how):
    """SIGNAL_PROGRAM with argv[2:] = signame, how (run_script gives argv[1],
    the loop's name, and new_loop() for it)."""
    return run_script(f"import sys; sys.argv[2:] = {[signame, how]!r}\n" + SIGNAL_PROGRAM,
                      timeout=60)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_cancels_every_main_task(run_script, loop_name, signame):
    r = run_signal_program(run_script, signame, "graceful")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    cls = "Loop" if loop_name == "tideloop" else "_UnixSelectorEventLoop"
    assert sorted(line for line in out if "cancelled" in line) == \
        [f"tideloop-0 cancelled {cls}", f"tideloop-1 cancelled {cls}"]
    assert "returned [None, None]" in out
    assert "handlers restored: True" in out
    assert r.stderr == ""


def test_a_second_sigint_forces_the_stop(run_script, loop_name):
    r = run_signal_program(run_script, "SIGINT", "stubborn")
    out = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr
    assert "KeyboardInterrupt" in out, r.stdout + r.stderr
    assert "handlers restored: True" in out
    assert "by force: a second signal (SIGINT)" in r.stderr


def test_a_second_sigterm_ends_the_process(run_script, loop_name):
    r = run_signal_program(run_script, "SIGTERM", "stubborn")
    assert r.returncode == -15, (r.returncode, r.stdout, r.stderr)
    assert "returned" not in r.stdout
    assert "by force: a second signal (SIGTERM)" in r.stderr


# -- serving one port from several threads -------------------------------------------

def test_threads_serve_one_port(raw_loop_factory):
    """Each thread serves the port with a socket of its own; the kernel
    spreads 60 connections over the three (each gets some)."""
    port = _free_port()
    up = threading.Barrier(4)
    done = threading.Event()

    async def main():
        async def handle(reader, writer):
            await reader.readexactly(1)
            writer.write(threading.current_thread().name.encode())
            await writer.drain()
            writer.close()

        sock = tideloop.threads.reuse_port_socket("127.0.0.1", port)
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, up.wait, 10)
            await loop.run_in_executor(None, done.wait, 20)
        return "served"

    seen = []

    def client():
        up.wait(10)
        try:
            for _ in range(60):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                    c.sendall(b"x")
                    seen.append(c.recv(100).decode())
        finally:
            done.set()

    t = threading.Thread(target=client)
    t.start()
    assert tideloop.threads.run(main, threads=3, loop_factory=raw_loop_factory) == ["served"] * 3
    t.join(10)
    assert len(seen) == 60
    assert sorted(set(seen)) == ["tideloop-0", "tideloop-1", "tideloop-2"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reuse_port_socket():
    port = _free_port()
    a = tideloop.threads.reuse_port_socket("127.0.0.1", port)
    b = tideloop.threads.reuse_port_socket("127.0.0.1", str(port))
    try:
        for s in (a, b):
            assert s.getsockname() == ("127.0.0.1", port)
            assert s.type == socket.SOCK_STREAM and s.family == socket.AF_INET
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
            assert s.getblocking() is False
            # bound, not listening: the server it is given listens
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0
        # a socket without SO_REUSEPORT cannot join them
        with socket.socket() as plain:
            with pytest.raises(OSError) as info:
                plain.bind(("127.0.0.1", port))
            assert info.value.errno == errno.EADDRINUSE
    finally:
        a.close()
        b.close()


def test_reuse_port_socket_refuses_port_0():
    for port in (0, "0", None):
        with pytest.raises(ValueError, match="port 0"):
            tideloop.threads.reuse_port_socket("127.0.0.1", port)


def test_reuse_port_socket_ipv6():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    port = _free_port()
    try:
        s = tideloop.threads.reuse_port_socket("::1", port)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback: {exc}")
    with s:
        assert s.family == socket.AF_INET6
        assert s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        assert s.getsockname()[1] == port
