"""loop.create_connection (host/port, sock=, local_addr, family/proto/flags,
happy eyeballs, interleave, errors) and loop.connect_accepted_socket.

Some tests replace ``loop.getaddrinfo`` on the instance with a fake: asyncio's
create_connection resolves names through ``self.getaddrinfo`` (the documented
resolution hook; CPython's own tests mock it the same way), which lets the
address list, and so the order of the connection attempts, be chosen."""
import asyncio
import errno
import re
import socket
import time

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, dead_port, fd_leak_check,
    ipv6_available, needs_ipv6, open_fds, start_server, wait, wait_until, bind_error_message,
)

dead_port = dead_port  # fixture re-export


@pytest.fixture
def echo_server(loop):
    srv, addr = arun(loop, start_server(loop, "tcp", EchoProtocol))
    yield addr
    arun(loop, close_server(srv))


def fake_getaddrinfo(loop, infos, calls=None):
    async def getaddrinfo(host, port, *, family=0, type=0, proto=0, flags=0):
        if calls is not None:
            calls.append((host, port, family, type, proto, flags))
        await asyncio.sleep(0)
        return list(infos)
    loop.getaddrinfo = getaddrinfo


def v4(port):
    return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))


def v6(port):
    return (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", port, 0, 0))


async def echo_once(tr, pr, msg=b"ping"):
    tr.write(msg)
    await pr.wait_bytes(len(msg))
    assert bytes(pr.data) == msg


def test_numeric_host(loop, echo_server):
    async def main():
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *echo_server)
        assert pr.events == ["made"]
        assert tr.get_extra_info("peername") == echo_server
        assert tr.get_extra_info("sockname")[0] == "127.0.0.1"
        sock = tr.get_extra_info("socket")
        assert sock.family == socket.AF_INET
        assert sock.gettimeout() == 0  # non-blocking
        await echo_once(tr, pr)
        tr.close()
        await wait(pr.lost)
        assert collapse_ok(pr.events)

    arun(loop, main())


def collapse_ok(events):
    return events[0] == "made" and events[-1] == "lost" and events.count("lost") == 1


def test_hostname_resolved(loop, echo_server):
    async def main():
        tr, pr = await loop.create_connection(lambda: Recorder(loop), "localhost",
                                              echo_server[1])
        assert tr.get_extra_info("peername")[1] == echo_server[1]
        await echo_once(tr, pr)
        tr.close()
        await wait(pr.lost)

    arun(loop, main())


def test_port_as_string(loop, echo_server):
    async def main():
        tr, pr = await loop.create_connection(lambda: Recorder(loop), "127.0.0.1",
                                              str(echo_server[1]))
        assert tr.get_extra_info("peername") == echo_server
        tr.close()
        await wait(pr.lost)

    arun(loop, main())


@needs_ipv6
def test_ipv6_loopback(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "::1", 0)
        port = srv.sockets[0].getsockname()[1]
        tr, pr = await loop.create_connection(lambda: Recorder(loop), "::1", port)
        assert tr.get_extra_info("socket").family == socket.AF_INET6
        assert tr.get_extra_info("peername")[:2] == ("::1", port)
        sock = tr.get_extra_info("socket")
        assert tr.get_extra_info("peername") == sock.getpeername()  # 4-tuples
        assert tr.get_extra_info("sockname") == sock.getsockname()
        assert tr.get_extra_info("socket").getsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        await echo_once(tr, pr)
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_existing_sock(loop, echo_server):
    async def main():
        sock = socket.create_connection(echo_server, timeout=5)
        fd = sock.fileno()
        tr, pr = await loop.create_connection(lambda: Recorder(loop), sock=sock)
        assert tr.get_extra_info("socket").fileno() == fd
        assert sock.getblocking() is False  # asyncio makes it non-blocking
        assert tr.get_extra_info("peername") == echo_server
        await echo_once(tr, pr)
        tr.close()
        await wait(pr.lost)
        assert sock.fileno() == -1  # the transport closed it

    arun(loop, main())


def test_existing_unix_sock_via_create_connection(loop, tmp_path):
    async def main():
        srv = await loop.create_unix_server(EchoProtocol, str(tmp_path / "e.sock"))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(tmp_path / "e.sock"))
        tr, pr = await loop.create_connection(lambda: Recorder(loop), sock=sock)
        await echo_once(tr, pr)
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_argument_errors(loop, echo_server):
    async def main():
        with socket.socket() as s:
            with pytest.raises(ValueError, match=r"^host/port and sock can not be specified at the same time$"):
                await loop.create_connection(Recorder, *echo_server, sock=s)
        with pytest.raises(ValueError, match=r"^host and port was not specified and no sock specified$"):
            await loop.create_connection(Recorder)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            with pytest.raises(ValueError, match=r"^A Stream Socket was expected, got "):
                await loop.create_connection(Recorder, sock=u)
        with pytest.raises(ValueError, match=r"^server_hostname is only meaningful with ssl$"):
            await loop.create_connection(Recorder, *echo_server, server_hostname="x")
        with pytest.raises(ValueError, match=r"^ssl_handshake_timeout is only meaningful with ssl$"):
            await loop.create_connection(Recorder, *echo_server, ssl_handshake_timeout=1)
        with pytest.raises(ValueError, match=r"^ssl_shutdown_timeout is only meaningful with ssl$"):
            await loop.create_connection(Recorder, *echo_server, ssl_shutdown_timeout=1)

    arun(loop, main())


def test_local_addr(loop, echo_server):
    async def main():
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *echo_server,
                                              local_addr=("127.0.0.1", 0))
        assert tr.get_extra_info("sockname")[0] == "127.0.0.1"
        assert tr.get_extra_info("sockname")[1] != 0
        tr.close()
        await wait(pr.lost)
        # a specific local port
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *echo_server,
                                              local_addr=("127.0.0.1", port))
        assert tr.get_extra_info("sockname") == ("127.0.0.1", port)
        await echo_once(tr, pr)
        tr.close()
        await wait(pr.lost)

    arun(loop, main())


def test_local_addr_in_use(loop, echo_server):
    async def main():
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        before = open_fds()
        try:
            with pytest.raises(OSError) as ei:
                await loop.create_connection(Recorder, *echo_server,
                                             local_addr=("127.0.0.1", port))
            assert ei.value.errno == errno.EADDRINUSE
            assert str(ei.value) == bind_error_message(errno.EADDRINUSE,
                                                       ("127.0.0.1", port))
            fd_leak_check(before)
        finally:
            busy.close()

    arun(loop, main())


def test_family_proto_flags(loop, echo_server):
    async def main():
        tr, pr = await loop.create_connection(
            lambda: Recorder(loop), *echo_server, family=socket.AF_INET,
            proto=socket.IPPROTO_TCP)
        assert tr.get_extra_info("socket").family == socket.AF_INET
        tr.close()
        await wait(pr.lost)
        # an IPv4 literal cannot be resolved as AF_INET6
        with pytest.raises(socket.gaierror):
            await loop.create_connection(Recorder, *echo_server, family=socket.AF_INET6)
        # flags reach getaddrinfo: a name with AI_NUMERICHOST fails to resolve
        with pytest.raises(socket.gaierror):
            await loop.create_connection(Recorder, "localhost", echo_server[1],
                                         flags=socket.AI_NUMERICHOST)

    arun(loop, main())


def test_connection_refused(loop, dead_port):
    async def main():
        before = open_fds()
        with pytest.raises(ConnectionRefusedError) as ei:
            await loop.create_connection(Recorder, "127.0.0.1", dead_port)
        assert ei.value.errno == errno.ECONNREFUSED
        assert str(ei.value) == (
            f"[Errno {errno.ECONNREFUSED}] Connect call failed ('127.0.0.1', {dead_port})")
        fd_leak_check(before)

    arun(loop, main())


def test_unresolvable_host(loop):
    async def main():
        arun_start = time.monotonic()
        with pytest.raises(socket.gaierror):
            await loop.create_connection(Recorder, "nonexistent.invalid", 80)
        assert time.monotonic() - arun_start < 5

    arun(loop, main())


def test_getaddrinfo_empty_list(loop):
    async def main():
        fake_getaddrinfo(loop, [])
        with pytest.raises(OSError, match=r"^getaddrinfo\(\) returned empty list$"):
            await loop.create_connection(Recorder, "fake.test", 80)

    arun(loop, main())


@pytest.mark.parametrize("delay", [None, 0.05])
def test_tries_addresses_in_turn(loop, echo_server, dead_port, delay):
    async def main():
        calls = []
        fake_getaddrinfo(loop, [v4(dead_port), v4(echo_server[1])], calls)
        t0 = time.monotonic()
        tr, pr = await loop.create_connection(lambda: Recorder(loop), "fake.test", 1234,
                                              happy_eyeballs_delay=delay)
        assert time.monotonic() - t0 < 2
        assert tr.get_extra_info("peername") == echo_server
        assert calls == [("fake.test", 1234, 0, socket.SOCK_STREAM, 0, 0)]
        await echo_once(tr, pr)
        tr.close()
        await wait(pr.lost)

    arun(loop, main())


def test_same_error_everywhere_raises_it_once(loop, dead_port):
    async def main():
        fake_getaddrinfo(loop, [v4(dead_port), v4(dead_port)])
        with pytest.raises(ConnectionRefusedError):
            await loop.create_connection(Recorder, "fake.test", 80)

    arun(loop, main())


def _attempt_order(exc):
    msg = str(exc)
    assert msg.startswith("Multiple exceptions: "), msg
    return [int(p) for p in re.findall(r"Connect call failed \('[^']+', (\d+)", msg)]


def _dead_ports(family, n):
    socks = []
    for _ in range(n):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.bind(("127.0.0.1" if family == socket.AF_INET else "::1", 0))
        socks.append(s)
    return socks


@needs_ipv6
@pytest.mark.parametrize("delay, interleave, order", [
    (None, None, "abcd"),     # no happy eyeballs: addresses in getaddrinfo order
    (None, 1, "acbd"),        # interleave by family
    (0.01, None, "acbd"),     # happy eyeballs defaults to interleave=1
    (0.01, 2, "abcd"),        # 2 of the first family first, then alternate
])
def test_interleave_attempt_order(loop, delay, interleave, order):
    async def main():
        s6 = _dead_ports(socket.AF_INET6, 2)
        s4 = _dead_ports(socket.AF_INET, 2)
        ports = {"a": s6[0].getsockname()[1], "b": s6[1].getsockname()[1],
                 "c": s4[0].getsockname()[1], "d": s4[1].getsockname()[1]}
        try:
            fake_getaddrinfo(loop, [v6(ports["a"]), v6(ports["b"]),
                                    v4(ports["c"]), v4(ports["d"])])
            with pytest.raises(OSError) as ei:
                await loop.create_connection(Recorder, "fake.test", 80,
                                             happy_eyeballs_delay=delay,
                                             interleave=interleave)
            assert _attempt_order(ei.value) == [ports[k] for k in order]
        finally:
            for s in s6 + s4:
                s.close()

    arun(loop, main())


def test_cancel_during_resolution_leaks_nothing(loop, echo_server):
    async def main():
        started = loop.create_future()

        async def slow_getaddrinfo(*args, **kw):
            started.set_result(None)
            await asyncio.sleep(30)

        before = open_fds()
        loop.getaddrinfo = slow_getaddrinfo
        task = loop.create_task(loop.create_connection(Recorder, "fake.test", 80))
        await wait(started)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        fd_leak_check(before)

    arun(loop, main())


def test_cancel_during_connect_leaks_nothing(loop):
    """Cancelled while the TCP handshake is pending (the listener's accept
    queue is full): the half-made socket is closed, no writer is left."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    fillers = []
    for _ in range(3):
        f = socket.socket()
        f.setblocking(False)
        try:
            f.connect(lsock.getsockname())
        except BlockingIOError:
            pass
        fillers.append(f)

    async def main():
        before = open_fds()
        task = loop.create_task(loop.create_connection(Recorder, *lsock.getsockname()))
        await asyncio.sleep(0.1)
        assert not task.done(), "connect completed; the test needs it pending"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        fd_leak_check(before)

    try:
        arun(loop, main())
    finally:
        for f in fillers:
            f.close()
        lsock.close()


# ---------------------------------------------------------------- accepted sockets


def test_connect_accepted_socket(loop):
    async def main():
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        client = socket.create_connection(lsock.getsockname(), timeout=5)
        conn, addr = lsock.accept()
        lsock.close()
        fd = conn.fileno()
        tr, pr = await loop.connect_accepted_socket(lambda: Recorder(loop), conn)
        assert pr.events == ["made"]
        assert tr.get_extra_info("socket").fileno() == fd
        assert tr.get_extra_info("peername") == client.getsockname()
        assert tr.get_extra_info("sockname") == client.getpeername()
        assert conn.getblocking() is False
        # (no TCP_NODELAY check: asyncio 3.11 only sets it when sock.proto is
        # IPPROTO_TCP, and a plain socket.socket() has proto 0)
        client.sendall(b"from-client")
        await pr.wait_bytes(11)
        tr.write(b"from-server")
        got = await loop.run_in_executor(None, client.recv, 100)
        assert got == b"from-server"
        client.close()
        await wait(pr.lost)
        assert pr.events == ["made", "data", "eof", "lost"]
        assert bytes(pr.data) == b"from-client"

    arun(loop, main())


def test_connect_accepted_socket_socketpair(loop):
    async def main():
        a, b = socket.socketpair()
        tr, pr = await loop.connect_accepted_socket(lambda: Recorder(loop), a)
        b.sendall(b"xy")
        b.shutdown(socket.SHUT_WR)
        await wait(pr.lost)
        assert pr.events == ["made", "data", "eof", "lost"]
        assert bytes(pr.data) == b"xy"
        assert await loop.run_in_executor(None, b.recv, 10) == b""
        b.close()

    arun(loop, main())


def test_connect_accepted_socket_errors(loop):
    async def main():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            with pytest.raises(ValueError, match=r"^A Stream Socket was expected, got "):
                await loop.connect_accepted_socket(Recorder, u)
        a, b = socket.socketpair()
        try:
            with pytest.raises(ValueError, match=r"^ssl_handshake_timeout is only meaningful with ssl$"):
                await loop.connect_accepted_socket(Recorder, a, ssl_handshake_timeout=1)
        finally:
            a.close()
            b.close()

    arun(loop, main())
