"""Signals during sock_* calls on a blocking socket (a common mistake: the
socket was never made non-blocking).  The stock loop's sock_* methods try
the socket's own method first, which waits in the kernel: the socket module
runs Python's signal handlers on EINTR and goes on waiting unless one
raised.  So a SIGALRM handler runs (its exception comes out of the await),
the first Ctrl-C under asyncio.Runner cancels the main task (which cannot
act while the call waits) and the second raises KeyboardInterrupt.  tideloop
must do the same: its C sock_* retry EINTR only after the handlers ran."""
import platform
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from loop_helpers import CHILD_PREAMBLE, SLOW, child_env, sigint_default_kwargs

OPS = ("sock_recv", "sock_recv_into", "sock_sendall", "sock_accept")

pytestmark = pytest.mark.main_interpreter("signal handlers: the main interpreter's main thread")


class Alarm(Exception):
    pass


def blocking_op(loop, op):
    """(awaitable that blocks, what unblocks it, sockets to close)."""
    if op == "sock_accept":
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        extra = []

        def unblock():
            extra.append(socket.create_connection(lsock.getsockname()))
        return loop.sock_accept(lsock), unblock, [lsock] + [extra]
    a, b = socket.socketpair()          # blocking, as a user's may be
    if op == "sock_recv":
        return loop.sock_recv(a, 10), lambda: b.send(b"data"), [a, b]
    if op == "sock_recv_into":
        return loop.sock_recv_into(a, bytearray(10)), lambda: b.send(b"data"), [a, b]
    b.setblocking(False)
    payload = b"x" * (2 << 20)          # more than the socket buffers hold

    def drain():
        try:
            while b.recv(1 << 20):
                pass
        except BlockingIOError:
            pass
    return loop.sock_sendall(a, payload), drain, [a, b]


def close_all(socks):
    for s in socks:
        for x in (s if isinstance(s, list) else [s]):
            x.close()


@pytest.fixture
def alarm_handler():
    """Install handler(sig, frame) for SIGALRM with a repeating timer; put
    the test watchdog's timer back afterwards."""
    saved = signal.getitimer(signal.ITIMER_REAL)
    old = signal.getsignal(signal.SIGALRM)

    def install(handler, interval=0.05):
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, interval, interval)
    yield install
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
    if saved[0] > 0:
        signal.setitimer(signal.ITIMER_REAL, saved[0])


@pytest.mark.parametrize("op", OPS)
def test_a_signal_handler_that_raises_ends_the_wait(loop, alarm_handler, op):
    aw, _, socks = blocking_op(loop, op)
    calls = []

    def handler(sig, frame):
        calls.append(sig)
        if len(calls) == 3:
            raise Alarm()
    alarm_handler(handler)
    try:
        with pytest.raises(Alarm):
            loop.run_until_complete(aw)
    finally:
        close_all(socks)
    assert calls == [signal.SIGALRM] * 3


@pytest.mark.parametrize("op", OPS)
def test_a_signal_handler_runs_and_the_wait_goes_on(loop, alarm_handler, op):
    aw, unblock, socks = blocking_op(loop, op)
    calls = []

    def handler(sig, frame):
        calls.append(sig)
        # From the second on, the operation can go on (sendall: a little
        # more of its payload each time the peer reads).
        if len(calls) == 2 or (len(calls) > 2 and op == "sock_sendall"):
            unblock()
    alarm_handler(handler)
    try:
        result = loop.run_until_complete(aw)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        close_all(socks)
    assert len(calls) >= 2
    if op == "sock_recv":
        assert result == b"data"
    elif op == "sock_recv_into":
        assert result == 4
    elif op == "sock_sendall":
        assert result is None
    else:
        conn, addr = result
        conn.close()
        assert addr[0] == "127.0.0.1"


CTRL_C_CHILD = """
import os, socket, asyncio
OP = sys.argv[2]

async def main():
    loop = asyncio.get_running_loop()
    if OP == "sock_accept":
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        aw = loop.sock_accept(lsock)
    else:
        a, b = socket.socketpair()
        aw = {"sock_recv": lambda: loop.sock_recv(a, 10),
              "sock_recv_into": lambda: loop.sock_recv_into(a, bytearray(10)),
              "sock_sendall": lambda: loop.sock_sendall(a, b"x" * (8 << 20))}[OP]()
    print("waiting", flush=True)
    try:
        await aw
    except BaseException as exc:
        print("main:", type(exc).__name__, flush=True)
        raise
    print("main: returned", flush=True)

try:
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(main())
except BaseException as exc:
    print("run:", type(exc).__name__, flush=True)
"""


# x86_64's recvfrom, sendto, accept4 (recv, send and accept in glibc)
SOCKET_CALLS = {"45", "44", "288"} if platform.machine() == "x86_64" else None


def wait_in_socket_call(pid):
    """Until the child waits in the kernel in a socket call: a signal that
    came before it would meet Python code, not the blocked call."""
    deadline = time.monotonic() + 20 * SLOW
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/syscall") as f:
                nr = f.read().split()[0]
        except (OSError, IndexError):
            nr = None
        if SOCKET_CALLS is None:
            time.sleep(0.5)
            return
        if nr in SOCKET_CALLS:
            return
        time.sleep(0.01)
    raise AssertionError(f"the child never waited in a socket call (last: {nr})")


def ctrl_c(loop_name, op):
    """Ctrl-C twice at a child blocked in op: what it said after each."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_PREAMBLE + textwrap.dedent(CTRL_C_CHILD), loop_name, op],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        **sigint_default_kwargs())
    try:
        assert proc.stdout.readline() == "waiting\n"
        wait_in_socket_call(proc.pid)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5 * SLOW)
        after_first = proc.poll()       # None: still waiting, as on the stock loop
        if after_first is None:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30 * SLOW)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return after_first, out.splitlines(), proc.returncode, err


@pytest.mark.parametrize("op", ["sock_recv", "sock_recv_into", "sock_accept"])
def test_ctrl_c_twice_at_a_blocked_sock_call(loop_name, op):
    after_first, lines, rc, err = ctrl_c(loop_name, op)
    # The first Ctrl-C cancels the main task, which waits in the call on.
    assert after_first is None, (lines, err)
    # The second: KeyboardInterrupt out of the await and out of run().
    assert lines == ["main: KeyboardInterrupt", "run: KeyboardInterrupt"], err
    assert rc == 0, err


def test_ctrl_c_at_a_blocked_sock_sendall(loop_name):
    """The signal cuts the blocking send() short (some bytes went): the rest
    waits in the loop, where the first Ctrl-C's cancellation ends it."""
    after_first, lines, rc, err = ctrl_c(loop_name, "sock_sendall")
    assert lines == ["main: CancelledError", "run: KeyboardInterrupt"], err
