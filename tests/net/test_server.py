"""loop.create_server and the Server object: hosts, port 0, sock=, backlog,
reuse_address / reuse_port, start_serving, close / wait_closed,
serve_forever, async with; the accept path (batches, EMFILE)."""
import asyncio
import inspect
import errno
import json
import shutil
import socket
import subprocess

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, fd_leak_check, needs_ipv6,
    open_fds, raw_client, wait, wait_until, bind_error_message,
)


async def echo_check(loop, addr, msg=b"ping"):
    def go():
        with raw_client("tcp", addr) as c:
            c.sendall(msg)
            got = b""
            while len(got) < len(msg):
                chunk = c.recv(100)
                if not chunk:
                    break
                got += chunk
            return got
    assert await loop.run_in_executor(None, go) == msg


def refused(addr):
    try:
        socket.create_connection(addr, timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_port_zero_and_server_api(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
        assert isinstance(srv, asyncio.AbstractServer)
        assert srv.get_loop() is loop
        assert srv.is_serving() is True
        socks = srv.sockets
        assert isinstance(socks, tuple) and len(socks) == 1
        s = socks[0]
        host, port = s.getsockname()
        assert host == "127.0.0.1" and port != 0
        assert s.family == socket.AF_INET and s.type == socket.SOCK_STREAM
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0  # posix default
        assert s.gettimeout() == 0
        await echo_check(loop, (host, port))
        await close_server(srv)

    arun(loop, main())


@needs_ipv6
def test_several_hosts(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, ["127.0.0.1", "::1"], 0)
        socks = srv.sockets
        assert sorted(s.family for s in socks) == [socket.AF_INET, socket.AF_INET6]
        for s in socks:
            if s.family == socket.AF_INET6:
                assert s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
            await echo_check(loop, s.getsockname()[:2])
        await close_server(srv)

    arun(loop, main())


@needs_ipv6
def test_several_hosts_same_port(loop):
    async def main():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        srv = await loop.create_server(EchoProtocol, ["127.0.0.1", "::1"], port)
        assert sorted(s.getsockname()[1] for s in srv.sockets) == [port, port]
        await echo_check(loop, ("127.0.0.1", port))
        await echo_check(loop, ("::1", port))
        await close_server(srv)

    arun(loop, main())


def test_duplicate_hosts_bound_once(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, ["127.0.0.1", "127.0.0.1"], 0)
        assert len(srv.sockets) == 1
        await close_server(srv)

    arun(loop, main())


def test_hostname(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "localhost", 0)
        assert len(srv.sockets) >= 1
        for s in srv.sockets:
            assert s.getsockname()[0] in ("127.0.0.1", "::1")
            await echo_check(loop, s.getsockname()[:2])
        await close_server(srv)

    arun(loop, main())


def test_existing_sock(loop):
    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        fd = sock.fileno()
        srv = await loop.create_server(EchoProtocol, sock=sock)
        assert [s.fileno() for s in srv.sockets] == [fd]
        assert sock.getblocking() is False
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        await echo_check(loop, sock.getsockname())
        await close_server(srv)
        assert sock.fileno() == -1  # the server closed it

    arun(loop, main())


def test_argument_errors(loop):
    async def main():
        with socket.socket() as s:
            with pytest.raises(ValueError, match=r"^host/port and sock can not be specified at the same time$"):
                await loop.create_server(EchoProtocol, "127.0.0.1", 0, sock=s)
        with pytest.raises(ValueError, match=r"^Neither host/port nor sock were specified$"):
            await loop.create_server(EchoProtocol)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            with pytest.raises(ValueError, match=r"^A Stream Socket was expected, got "):
                await loop.create_server(EchoProtocol, sock=u)
        with pytest.raises(TypeError, match=r"^ssl argument must be an SSLContext or None$"):
            await loop.create_server(EchoProtocol, "127.0.0.1", 0, ssl=True)
        with pytest.raises(ValueError, match=r"^ssl_handshake_timeout is only meaningful with ssl$"):
            await loop.create_server(EchoProtocol, "127.0.0.1", 0, ssl_handshake_timeout=1)
        with pytest.raises(ValueError, match=r"^ssl_shutdown_timeout is only meaningful with ssl$"):
            await loop.create_server(EchoProtocol, "127.0.0.1", 0, ssl_shutdown_timeout=1)

    arun(loop, main())


def test_address_in_use(loop):
    async def main():
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        before = open_fds()
        try:
            with pytest.raises(OSError) as ei:
                await loop.create_server(EchoProtocol, "127.0.0.1", port, reuse_address=False)
            assert ei.value.errno == errno.EADDRINUSE
            assert str(ei.value) == bind_error_message(errno.EADDRINUSE,
                                                       ("127.0.0.1", port))
            fd_leak_check(before)
        finally:
            busy.close()

    arun(loop, main())


def _ss_backlog(port):
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                         text=True, timeout=5).stdout
    line = out.strip().splitlines()[0].split()
    return int(line[2])  # Send-Q of a listening socket is its backlog


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss(8)")
@pytest.mark.parametrize("backlog", [None, 7])
def test_backlog(loop, backlog):
    async def main():
        kw = {} if backlog is None else {"backlog": backlog}
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0, **kw)
        port = srv.sockets[0].getsockname()[1]
        assert _ss_backlog(port) == (100 if backlog is None else backlog)
        await close_server(srv)

    arun(loop, main())


def test_reuse_address_and_port(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0, reuse_address=False)
        assert srv.sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 0
        await close_server(srv)
        a = await loop.create_server(EchoProtocol, "127.0.0.1", 0, reuse_port=True)
        s = a.sockets[0]
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        port = s.getsockname()[1]
        b = await loop.create_server(EchoProtocol, "127.0.0.1", port, reuse_port=True)
        assert b.sockets[0].getsockname() == ("127.0.0.1", port)
        with pytest.raises(OSError) as ei:
            await loop.create_server(EchoProtocol, "127.0.0.1", port)
        assert ei.value.errno == errno.EADDRINUSE
        await echo_check(loop, ("127.0.0.1", port))
        await close_server(a)
        await echo_check(loop, ("127.0.0.1", port))  # b still serves
        await close_server(b)

    arun(loop, main())


def test_start_serving_false(loop):
    async def main():
        made = []
        srv = await loop.create_server(lambda: Recorder(loop, on_made=made.append),
                                       "127.0.0.1", 0, start_serving=False)
        addr = srv.sockets[0].getsockname()
        assert srv.is_serving() is False
        # asyncio listens only once serving starts: connecting is refused
        assert refused(addr)
        assert made == []
        await srv.start_serving()
        assert srv.is_serving() is True
        await srv.start_serving()  # idempotent
        c = raw_client("tcp", addr)
        await wait_until(lambda: made)
        assert len(made) == 1
        c.close()
        await wait(made[0].lost)
        await close_server(srv)

    arun(loop, main())


def test_close_keeps_existing_connections(loop):
    async def main():
        protos = []
        srv = await loop.create_server(lambda: EchoProtocol(protos), "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *addr)
        await wait_until(lambda: protos)
        srv.close()
        assert srv.is_serving() is False
        assert srv.sockets == ()
        srv.close()  # idempotent
        await asyncio.sleep(0)
        assert refused(addr)
        # the accepted connection still works (3.11: close() leaves clients alone)
        tr.write(b"still here")
        await pr.wait_bytes(10)
        assert bytes(pr.data) == b"still here"
        tr.close()
        await wait(pr.lost)
        await srv.wait_closed()

    arun(loop, main())


def test_wait_closed_waits_for_connections(loop):
    async def main():
        protos = []
        srv = await loop.create_server(lambda: EchoProtocol(protos), "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *addr)
        await wait_until(lambda: protos)
        waiter = loop.create_task(srv.wait_closed())
        await asyncio.sleep(0.05)
        assert not waiter.done()
        srv.close()
        await asyncio.sleep(0.05)
        assert not waiter.done()  # one connection is still active
        protos[0].transport.close()
        await wait(waiter)
        await wait(pr.lost)
        tr.close()
        # 3.11: once closed, wait_closed() returns at once
        await wait(srv.wait_closed(), 1)

    arun(loop, main())


def test_wait_closed_without_connections(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
        waiter = loop.create_task(srv.wait_closed())
        await asyncio.sleep(0.02)
        assert not waiter.done()
        srv.close()
        await wait(waiter, 1)

    arun(loop, main())


def test_async_with(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        async with srv as s:
            assert s is srv
            await echo_check(loop, addr)
        assert not srv.is_serving()
        assert srv.sockets == ()
        assert refused(addr)

    arun(loop, main())


def test_serve_forever(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0, start_serving=False)
        addr = srv.sockets[0].getsockname()
        task = loop.create_task(srv.serve_forever())
        await asyncio.sleep(0.01)
        assert srv.is_serving()
        await echo_check(loop, addr)
        with pytest.raises(RuntimeError, match=r"is already being awaited on serve_forever\(\)"):
            await srv.serve_forever()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait(task)
        assert not srv.is_serving()
        assert srv.sockets == ()
        with pytest.raises(RuntimeError, match=r"^server .* is closed$"):
            await srv.serve_forever()

    arun(loop, main())


def test_serve_forever_stopped_by_close(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
        task = loop.create_task(srv.serve_forever())
        await asyncio.sleep(0.01)
        srv.close()
        with pytest.raises(asyncio.CancelledError):
            await wait(task)
        assert task.cancelled()

    arun(loop, main())


def test_many_clients_concurrently(loop):
    async def main():
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()

        async def one(i):
            tr, pr = await loop.create_connection(lambda: Recorder(loop), *addr)
            msg = b"client-%03d" % i
            tr.write(msg)
            await pr.wait_bytes(len(msg))
            tr.close()
            await wait(pr.lost)
            return bytes(pr.data)

        got = await asyncio.gather(*(one(i) for i in range(100)))
        assert got == [b"client-%03d" % i for i in range(100)]
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("debug", [False, True])
def test_protocol_factory_error_keeps_serving(loop, debug):
    """A protocol factory that raises loses that one connection; the server
    keeps accepting.  asyncio reports it to the exception handler only in
    debug mode."""
    loop.set_debug(debug)

    async def main():
        calls = []
        loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
        n = [0]
        boom = ZeroDivisionError("factory")

        def factory():
            n[0] += 1
            if n[0] == 1:
                raise boom
            return EchoProtocol()

        srv = await loop.create_server(factory, "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        first = raw_client("tcp", addr)
        await wait_until(lambda: n[0] == 1)
        await asyncio.sleep(0.05)
        await echo_check(loop, addr)
        assert n[0] == 2
        if debug:
            assert [c["message"] for c in calls] == [
                "Error on transport creation for incoming connection"]
            assert calls[0]["exception"] is boom
        else:
            assert calls == []
        first.close()
        await close_server(srv)

    try:
        arun(loop, main())
    finally:
        loop.set_debug(False)


def test_accepts_pending_connections_in_batches(loop):
    """Connections queued in the kernel while the loop was busy are all taken
    within a few loop iterations, not one per iteration."""
    async def main():
        made = []
        srv = await loop.create_server(lambda: Recorder(loop, on_made=made.append),
                                       "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        clients = [raw_client("tcp", addr) for _ in range(30)]  # loop not running
        for _ in range(8):
            await asyncio.sleep(0)
        assert len(made) == 30
        for c in clients:
            c.close()
        await wait_until(lambda: all("lost" in p.events for p in made))
        await close_server(srv)

    arun(loop, main())


EMFILE_SCRIPT = r"""
import json, os, resource, socket, threading, time

loop = new_loop()
handler_calls = []
made = []

def handler(lp, ctx):
    exc = ctx.get("exception")
    handler_calls.append({"message": ctx.get("message"),
                          "errno": getattr(exc, "errno", None),
                          "has_socket": ctx.get("socket") is not None,
                          "t": time.monotonic()})

loop.set_exception_handler(handler)

class Echo(asyncio.Protocol):
    def connection_made(self, tr):
        self.tr = tr
        made.append(self)
    def data_received(self, data):
        self.tr.write(data)

def roundtrip(c, msg):
    c.sendall(msg)
    return c.recv(100)

async def main():
    out = {}
    srv = await loop.create_server(Echo, "127.0.0.1", 0)
    addr = srv.sockets[0].getsockname()
    first = [socket.create_connection(addr, timeout=5) for _ in range(2)]
    while len(made) < 2:
        await asyncio.sleep(0.005)
    await loop.run_in_executor(None, time.sleep, 0)   # start the worker thread now
    # five more clients are queued in the kernel; then no fd is left for accept()
    more = [socket.create_connection(addr, timeout=5) for _ in range(5)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = max(int(x) for x in os.listdir("/proc/self/fd"))
    fillers = []
    while True:
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd > top:
            os.close(fd)
            break
        fillers.append(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (fd, hard))
    cpu0 = time.process_time()
    t0 = time.monotonic()
    await asyncio.sleep(0.4)
    out["cpu_paused"] = time.process_time() - cpu0
    out["made_paused"] = len(made)
    out["calls_paused"] = len(handler_calls)
    ts = [c["t"] for c in handler_calls]
    out["paused_spread"] = (max(ts) - min(ts)) if ts else None
    # existing connections are still served
    out["echo"] = (await loop.run_in_executor(None, roundtrip, first[0], b"alive")).decode()
    # resources come back: the queued clients are accepted after the pause
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for fd in fillers:
        os.close(fd)
    deadline = time.monotonic() + 4
    while len(made) < 7 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    out["made_final"] = len(made)
    out["recovered_after"] = time.monotonic() - t0
    out["echo_new"] = (await loop.run_in_executor(None, roundtrip, more[-1], b"new")).decode()
    out["calls"] = [{k: v for k, v in c.items() if k != "t"} for c in handler_calls]
    for c in first + more:
        c.close()
    for p in made:
        p.tr.close()
    srv.close()
    await srv.wait_closed()
    return out

print(json.dumps(loop.run_until_complete(main())))
loop.close()
"""


def test_emfile_pauses_accepting_and_keeps_serving(run_script):
    res = run_script(EMFILE_SCRIPT, timeout=20)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["made_paused"] == 2
    # reported, then accepting pauses: asyncio reports once per remaining
    # iteration of its accept batch (up to backlog=100 times, 3.14: 101) in
    # one burst, then waits ACCEPT_RETRY_DELAY (1 s); no reports, no CPU
    # while paused
    batch = 101 if "range(backlog + 1)" in inspect.getsource(
        asyncio.selector_events.BaseSelectorEventLoop._accept_connection) else 100
    assert 1 <= out["calls_paused"] <= batch, out
    assert out["paused_spread"] < 0.1, out
    assert out["cpu_paused"] < 0.2, out
    assert out["echo"] == "alive"
    assert out["made_final"] == 7
    assert out["echo_new"] == "new"
    assert out["recovered_after"] < 3
    assert out["calls"] and all(
        c == {"message": "socket.accept() out of system resource",
              "errno": errno.EMFILE, "has_socket": True} for c in out["calls"]), out
