"""loop.sock_* methods: sock_recv, sock_recv_into, sock_recvfrom,
sock_recvfrom_into, sock_sendto, sock_sendall, sock_connect, sock_accept.

Each tries the syscall first (no loop iteration when it can complete at
once), waits otherwise, and leaves no reader/writer behind when cancelled."""
import asyncio
import errno
import hashlib
import os
import socket
import threading

import pytest

from net_helpers import (
    Recorder, arun, close_server, dead_port, fd_leak_check, open_fds,
    rst_close, start_server, wait,
)

dead_port = dead_port  # fixture re-export


@pytest.fixture
def tcp_pair():
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    c = socket.create_connection(lsock.getsockname())
    s, _ = lsock.accept()
    lsock.close()
    c.setblocking(False)
    s.setblocking(False)
    yield c, s
    c.close()
    s.close()


@pytest.fixture
def unix_pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


@pytest.fixture(params=["tcp", "unix"])
def pair(request, tcp_pair, unix_pair):
    return tcp_pair if request.param == "tcp" else unix_pair


@pytest.fixture
def udp_pair():
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)
    yield s
    s.close()


def test_recv_sendall_roundtrip(loop, pair):
    a, b = pair

    async def main():
        assert await loop.sock_sendall(a, b"hello") is None
        assert await loop.sock_recv(b, 100) == b"hello"
        await loop.sock_sendall(b, bytearray(b"by"))
        await loop.sock_sendall(b, memoryview(b"xtex")[1:3])
        await wait_data(b"byte", lambda: loop.sock_recv(a, 100))
        a.shutdown(socket.SHUT_WR)
        assert await loop.sock_recv(b, 100) == b""  # EOF

    async def wait_data(expect, recv):
        got = b""
        while len(got) < len(expect):
            got += await recv()
        assert got == expect

    arun(loop, main())


def test_recv_waits_for_data(loop, pair):
    a, b = pair

    async def main():
        task = loop.create_task(loop.sock_recv(b, 100))
        await asyncio.sleep(0.05)
        assert not task.done()
        a.send(b"later")
        assert await wait(task) == b"later"
        assert loop.remove_reader(b.fileno()) is False  # cleaned up after success

    arun(loop, main())


def test_recv_into(loop, pair):
    a, b = pair

    async def main():
        buf = bytearray(10)
        a.send(b"abcdef")
        n = await loop.sock_recv_into(b, buf)
        assert n == 6 and buf[:6] == b"abcdef"
        # waits, and fills a memoryview slice
        task = loop.create_task(loop.sock_recv_into(b, memoryview(buf)[6:]))
        await asyncio.sleep(0.02)
        assert not task.done()
        a.send(b"WXYZ-more")
        assert await wait(task) == 4
        assert buf == b"abcdefWXYZ"
        assert await loop.sock_recv(b, 100) == b"-more"

    arun(loop, main())


def test_recv_reset(loop, tcp_pair):
    c, s = tcp_pair

    async def main():
        task = loop.create_task(loop.sock_recv(c, 100))
        await asyncio.sleep(0.02)
        rst_close(s)
        with pytest.raises(ConnectionResetError):
            await wait(task)

    arun(loop, main())


def test_sendall_large_with_slow_reader(loop, tcp_pair):
    c, s = tcp_pair
    data = os.urandom(1 << 20) * 24  # 24 MiB: many partial sends
    result = {}

    def reader():
        s.setblocking(True)
        h = hashlib.sha256()
        n = 0
        while n < len(data):
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
        result["n"], result["h"] = n, h.hexdigest()

    async def main():
        t = threading.Thread(target=reader)
        t.start()
        assert await loop.sock_sendall(c, data) is None
        await loop.run_in_executor(None, t.join, 5)
        assert result["n"] == len(data)
        assert result["h"] == hashlib.sha256(data).hexdigest()
        assert loop.remove_writer(c.fileno()) is False

    arun(loop, main())


def test_sendall_to_reset_peer(loop, tcp_pair):
    c, s = tcp_pair

    async def main():
        rst_close(s)
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectionResetError):
            await loop.sock_sendall(c, b"x" * (4 << 20))
        assert loop.remove_writer(c.fileno()) is False

    arun(loop, main())


def test_sendall_error_while_waiting(loop, tcp_pair):
    c, s = tcp_pair

    async def main():
        task = loop.create_task(loop.sock_sendall(c, b"x" * (32 << 20)))
        await asyncio.sleep(0.05)
        assert not task.done()  # the peer does not read
        rst_close(s)
        with pytest.raises(ConnectionError):
            await wait(task)
        assert loop.remove_writer(c.fileno()) is False

    arun(loop, main())


def test_connect_and_accept(loop, listener):
    async def main():
        c = socket.socket()
        c.setblocking(False)
        try:
            acc = loop.create_task(loop.sock_accept(listener))
            await asyncio.sleep(0.02)
            assert not acc.done()  # waits for a client
            assert await loop.sock_connect(c, listener.getsockname()) is None
            conn, addr = await wait(acc)
            try:
                assert type(conn) is socket.socket
                assert (conn.family, conn.type, conn.proto) == (
                    listener.family, listener.type, listener.proto)
                assert conn.get_inheritable() is False  # accept4(SOCK_CLOEXEC)
                assert addr == c.getsockname()
                assert conn.getpeername() == c.getsockname()
                assert conn.gettimeout() == 0  # non-blocking
                await loop.sock_sendall(c, b"over tcp")
                assert await loop.sock_recv(conn, 100) == b"over tcp"
            finally:
                conn.close()
            assert loop.remove_reader(listener.fileno()) is False
        finally:
            c.close()

    arun(loop, main())


def test_connect_resolves_hostname(loop, listener):
    async def main():
        with socket.socket() as c:
            c.setblocking(False)
            await loop.sock_connect(c, ("localhost", listener.getsockname()[1]))
            assert c.getpeername() == listener.getsockname()

    arun(loop, main())


def test_connect_unix(loop, tmp_path):
    path = str(tmp_path / "c.sock")

    async def main():
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        srv.setblocking(False)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            await loop.sock_connect(c, path)
            conn, addr = await loop.sock_accept(srv)
            assert addr == ""
            conn.close()
        finally:
            c.close()
            srv.close()

    arun(loop, main())


def test_connect_refused(loop, dead_port):
    async def main():
        with socket.socket() as c:
            c.setblocking(False)
            with pytest.raises(ConnectionRefusedError) as ei:
                await loop.sock_connect(c, ("127.0.0.1", dead_port))
            assert str(ei.value) == (
                f"[Errno {errno.ECONNREFUSED}] Connect call failed ('127.0.0.1', {dead_port})")
            assert loop.remove_writer(c.fileno()) is False

    arun(loop, main())


def test_udp_sendto_recvfrom(loop, udp_pair):
    a, b = udp_pair

    async def main():
        assert await loop.sock_sendto(a, b"dgram-1", b.getsockname()) == 7
        data, addr = await loop.sock_recvfrom(b, 100)
        assert data == b"dgram-1" and addr == a.getsockname()
        # waits for a datagram
        task = loop.create_task(loop.sock_recvfrom(b, 100))
        await asyncio.sleep(0.02)
        assert not task.done()
        await loop.sock_sendto(a, b"dgram-2", b.getsockname())
        assert await wait(task) == (b"dgram-2", a.getsockname())
        # recvfrom_into, with and without nbytes
        buf = bytearray(16)
        await loop.sock_sendto(a, memoryview(b"0123456789"), b.getsockname())
        n, addr = await loop.sock_recvfrom_into(b, buf)
        assert (n, addr, bytes(buf[:n])) == (10, a.getsockname(), b"0123456789")
        await loop.sock_sendto(a, b"abcdefghij", b.getsockname())
        n, addr = await loop.sock_recvfrom_into(b, buf, 3)
        assert (n, bytes(buf[:3])) == (3, b"abc")  # the rest of the datagram is dropped
        task = loop.create_task(loop.sock_recvfrom_into(b, buf))
        await asyncio.sleep(0.02)
        assert not task.done()
        await loop.sock_sendto(a, b"zz", b.getsockname())
        assert await wait(task) == (2, a.getsockname())
        # truncating recvfrom
        await loop.sock_sendto(a, b"long datagram", b.getsockname())
        assert await loop.sock_recvfrom(b, 4) == (b"long", a.getsockname())

    arun(loop, main())


def test_syscall_first_no_loop_iteration(loop, tcp_pair, udp_pair, listener, tmp_path):
    """When the operation can complete immediately, the coroutine returns
    without letting the loop run anything else first."""
    c, s = tcp_pair
    ua, ub = udp_pair
    path = str(tmp_path / "first.sock")
    usrv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    usrv.bind(path)
    usrv.listen(4)
    uc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uc.setblocking(False)
    pending = socket.create_connection(listener.getsockname())

    async def check(name, coro_factory):
        ran = []
        loop.call_soon(ran.append, 1)
        result = await coro_factory()
        assert ran == [], f"{name} yielded to the loop before completing"
        await asyncio.sleep(0)
        assert ran == [1]
        return result

    async def main():
        s.send(b"ready1ready2")
        assert await check("sock_recv", lambda: loop.sock_recv(c, 6)) == b"ready1"
        buf = bytearray(6)
        assert await check("sock_recv_into", lambda: loop.sock_recv_into(c, buf)) == 6
        assert await check("sock_sendall", lambda: loop.sock_sendall(c, b"small")) is None
        ua.sendto(b"d1", ub.getsockname())
        ua.sendto(b"d2", ub.getsockname())
        await asyncio.sleep(0.01)
        assert (await check("sock_recvfrom", lambda: loop.sock_recvfrom(ub, 10)))[0] == b"d1"
        assert (await check("sock_recvfrom_into",
                            lambda: loop.sock_recvfrom_into(ub, bytearray(10))))[0] == 2
        assert await check("sock_sendto",
                           lambda: loop.sock_sendto(ua, b"d3", ub.getsockname())) == 2
        await asyncio.sleep(0.01)
        conn, _ = await check("sock_accept", lambda: loop.sock_accept(listener))
        conn.close()
        assert await check("sock_connect", lambda: loop.sock_connect(uc, path)) is None

    try:
        arun(loop, main())
    finally:
        pending.close()
        uc.close()
        usrv.close()


# ---------------------------------------------------------------- cancellation


def _pending_connect_target():
    """A listener whose accept queue is full: new connects stay pending."""
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
    return lsock, fillers


@pytest.mark.parametrize("op", ["sock_recv", "sock_recv_into", "sock_recvfrom",
                                "sock_recvfrom_into", "sock_accept", "sock_sendall",
                                "sock_connect"])
def test_cancel_leaves_no_reader_or_writer(loop, op, tcp_pair, udp_pair, listener):
    c, s = tcp_pair
    ua, ub = udp_pair
    extra = []

    async def main():
        if op == "sock_recv":
            sock, coro, side = c, loop.sock_recv(c, 10), "reader"
        elif op == "sock_recv_into":
            sock, coro, side = c, loop.sock_recv_into(c, bytearray(10)), "reader"
        elif op == "sock_recvfrom":
            sock, coro, side = ub, loop.sock_recvfrom(ub, 10), "reader"
        elif op == "sock_recvfrom_into":
            sock, coro, side = ub, loop.sock_recvfrom_into(ub, bytearray(10)), "reader"
        elif op == "sock_accept":
            sock, coro, side = listener, loop.sock_accept(listener), "reader"
        elif op == "sock_sendall":
            sock, coro, side = c, loop.sock_sendall(c, b"x" * (64 << 20)), "writer"
        else:
            lsock, fillers = _pending_connect_target()
            extra.extend([lsock, *fillers])
            sock = socket.socket()
            sock.setblocking(False)
            extra.append(sock)
            coro, side = loop.sock_connect(sock, lsock.getsockname()), "writer"
        task = loop.create_task(coro)
        await asyncio.sleep(0.05)
        assert not task.done(), f"{op} completed; the test needs it pending"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        fd = sock.fileno()
        if side == "reader":
            assert loop.remove_reader(fd) is False
        else:
            assert loop.remove_writer(fd) is False
        # the socket is still usable with the loop afterwards
        if op in ("sock_recv", "sock_recv_into"):
            s.send(b"after")
            assert await wait(loop.sock_recv(c, 10)) == b"after"
        elif op in ("sock_recvfrom", "sock_recvfrom_into"):
            ua.sendto(b"after", ub.getsockname())
            assert (await wait(loop.sock_recvfrom(ub, 10)))[0] == b"after"
        elif op == "sock_accept":
            cl = socket.create_connection(listener.getsockname())
            conn, _ = await wait(loop.sock_accept(listener))
            conn.close()
            cl.close()

    try:
        arun(loop, main())
    finally:
        for x in extra:
            x.close()


# ---------------------------------------------------------------- errors


def test_debug_mode_requires_non_blocking(loop, listener, udp_pair):
    loop.set_debug(True)
    blocking = socket.socket()
    ublocking = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ublocking.bind(("127.0.0.1", 0))

    async def main():
        cases = {
            "sock_recv": lambda: loop.sock_recv(blocking, 1),
            "sock_recv_into": lambda: loop.sock_recv_into(blocking, bytearray(1)),
            "sock_recvfrom": lambda: loop.sock_recvfrom(ublocking, 1),
            "sock_recvfrom_into": lambda: loop.sock_recvfrom_into(ublocking, bytearray(1)),
            "sock_sendto": lambda: loop.sock_sendto(ublocking, b"x", ("127.0.0.1", 9)),
            "sock_sendall": lambda: loop.sock_sendall(blocking, b"x"),
            "sock_connect": lambda: loop.sock_connect(blocking, listener.getsockname()),
            "sock_accept": lambda: loop.sock_accept(blocking),
        }
        for name, make in cases.items():
            with pytest.raises(ValueError, match=r"^the socket must be non-blocking$"):
                await make()

    try:
        arun(loop, main())
    finally:
        blocking.close()
        ublocking.close()
        loop.set_debug(False)


def test_keyword_arguments(loop, pair, listener):
    """The parameter names of asyncio's signatures work as keywords."""
    a, b = pair

    async def main():
        assert await loop.sock_sendall(sock=a, data=b"kw") is None
        assert await loop.sock_recv(sock=b, n=1) == b"k"
        buf = bytearray(4)
        assert await loop.sock_recv_into(sock=b, buf=buf) == 1
        c = socket.create_connection(listener.getsockname())
        try:
            conn, _ = await loop.sock_accept(sock=listener)
            conn.close()
        finally:
            c.close()

    arun(loop, main())


def test_bad_buffers(loop, pair):
    a, b = pair

    async def main():
        a.send(b"data")
        with pytest.raises(TypeError):
            await loop.sock_recv_into(b, b"read-only")
        with pytest.raises(TypeError):
            await loop.sock_sendall(a, "text")
        assert await loop.sock_sendall(a, b"") is None
        assert await loop.sock_recv(b, 100) == b"data"  # nothing was consumed

    arun(loop, main())


def test_fd_used_by_transport(loop):
    async def main():
        srv, addr = await start_server(loop, "tcp", lambda: Recorder(loop))
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *addr)
        fd = tr.get_extra_info("socket").fileno()
        alias = socket.socket(fileno=fd)  # same fd, not owned
        try:
            with pytest.raises(RuntimeError, match="is used by transport"):
                await loop.sock_recv(alias, 10)
            with pytest.raises(RuntimeError, match="is used by transport"):
                await loop.sock_recv_into(alias, bytearray(10))
        finally:
            alias.detach()
        assert not tr.is_closing()
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_no_fd_leak(loop, tcp_pair, listener, dead_port):
    c, s = tcp_pair

    async def main():
        before = open_fds()
        for _ in range(5):
            s.send(b"x")
            await loop.sock_recv(c, 10)
            cl = socket.socket()
            cl.setblocking(False)
            await loop.sock_connect(cl, listener.getsockname())
            conn, _ = await loop.sock_accept(listener)
            conn.close()
            cl.close()
            bad = socket.socket()
            bad.setblocking(False)
            with pytest.raises(ConnectionRefusedError):
                await loop.sock_connect(bad, ("127.0.0.1", dead_port))
            bad.close()
        fd_leak_check(before)

    arun(loop, main())


def test_cancelled_recv_does_not_unregister_its_successor(loop):
    """A sock_recv cancelled while a new sock_recv on the same socket is
    already waiting must not remove the new one's reader (asyncio checks its
    own handle; CPython's test_sock_client_racing)."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)

    async def main():
        first = asyncio.ensure_future(loop.sock_recv(a, 100))
        await asyncio.sleep(0)          # `first` now waits on the fd
        first.cancel()                  # handled next iteration...

        async def feed():
            await asyncio.sleep(0.05)
            b.send(b"payload")

        asyncio.ensure_future(feed())
        async with asyncio.timeout(5):
            # ...after this one registered its own reader for the same fd
            return await loop.sock_recv(a, 100)

    try:
        assert loop.run_until_complete(main()) == b"payload"
    finally:
        a.close()
        b.close()


def test_ssl_socket_refused(loop):
    """sock_* refuse an ssl.SSLSocket with asyncio's TypeError."""
    import ssl

    ctx = ssl.create_default_context()
    raw = socket.socket()
    sslsock = ctx.wrap_socket(raw, do_handshake_on_connect=False,
                              server_hostname="localhost")
    sslsock.setblocking(False)
    try:
        for call in (lambda: loop.sock_recv(sslsock, 10),
                     lambda: loop.sock_sendall(sslsock, b"x"),
                     lambda: loop.sock_recv_into(sslsock, bytearray(4))):
            with pytest.raises(TypeError, match="Socket cannot be of type SSLSocket"):
                loop.run_until_complete(call())
    finally:
        sslsock.close()


def test_results_come_in_stopiterations_of_their_own(loop, unix_pair):
    # sock_recv ready at once ends its first send() with StopIteration(data),
    # args (data,), nothing left from the one before; sock_sendall with
    # StopIteration() (value None).
    a, b = unix_pair

    def finish(coro):
        try:
            coro.send(None)
        except StopIteration as exc:
            return exc
        raise AssertionError("the call did not end")

    async def main():
        kept = None
        for data in (b"one", b"two", b"three"):
            b.send(data)
            exc = finish(loop.sock_recv(a, 100))
            assert (exc.value, exc.args) == (data, (data,))
            assert exc.__traceback__.tb_next is None
            assert exc.__context__ is None and vars(exc) == {}
            exc.add_note("note")
            exc.__context__ = ValueError("context")
            if kept is None:
                kept = exc
            del exc
        assert (kept.value, kept.args) == (b"one", (b"one",))
        exc = finish(loop.sock_sendall(a, b"x"))
        assert exc.value is None and exc.args == ()
        assert b.recv(10) == b"x"

    arun(loop, main())
