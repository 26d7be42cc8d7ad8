"""Setting TLS up (issue 12): start_tls() on an existing plain connection
(client and server side, Protocol and streams), start_tls() on a transport
that is closing or closed, ssl_handshake_timeout (a peer that never answers,
on both sides), ssl_shutdown_timeout (a peer that never answers close_notify),
and the argument checks with the stock loop's messages."""
import asyncio
import gc
import inspect
import socket
import ssl
import threading
import time
import warnings

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, fd_leak_check, open_fds, wait, wait_until,
)
from tls_helpers import SyncTLSPeer, client_context, handler_calls, server_context

pytestmark = pytest.mark.usefixtures("tls_route")


@pytest.fixture
def listener():
    """A plain listening socket nobody serves (the kernel completes the TCP
    handshake, nobody answers)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s
    s.close()


# ----------------------------------------------------------------- start_tls

class StartTLSServer(asyncio.Protocol):
    """Plain text until the line STARTTLS, answered OK; then TLS via
    loop.start_tls(server_side=True); echoes the TLS data upper-cased.

    TLS data can reach data_received() before start_tls() returns (the
    client's first record may come with its last handshake message), so what
    arrives before the new transport is known is echoed once it is."""

    def __init__(self, loop, ctx, log):
        self.loop, self.ctx, self.log = loop, ctx, log
        self.state = "plain"
        self.tls = None
        self.early = []

    def connection_made(self, tr):
        self.plain = tr
        self.log.append("made")

    def data_received(self, data):
        if self.state == "plain":
            assert data == b"STARTTLS\n", data
            self.state = "tls"
            self.plain.write(b"OK\n")
            self.loop.create_task(self.upgrade())
            return
        self.log.append(data)
        if self.tls is None:
            self.early.append(data)
        else:
            self.tls.write(data.upper())

    async def upgrade(self):
        tls = await self.loop.start_tls(self.plain, self, self.ctx, server_side=True)
        self.log.insert(1, ("upgraded", tls.get_extra_info("ssl_object").server_side))
        self.tls = tls
        for data in self.early:
            tls.write(data.upper())

    def eof_received(self):
        self.log.append("eof")

    def connection_lost(self, exc):
        self.log.append(("lost", exc))


def test_start_tls_both_sides(loop):
    async def main():
        calls = handler_calls(loop)
        log = []
        srv = await loop.create_server(lambda: StartTLSServer(loop, server_context(), log),
                                       "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *addr)
        tr.write(b"STARTTLS\n")
        assert await pr.wait_bytes(3) == b"OK\n"
        assert tr.get_extra_info("ssl_object") is None
        ctx = client_context()
        tls = await loop.start_tls(tr, pr, ctx, server_hostname="localhost")
        assert tls is not tr and tls.get_protocol() is pr
        assert tr.get_protocol() is not pr  # the TLS layer reads the socket now
        assert isinstance(tls.get_extra_info("ssl_object"), ssl.SSLObject)
        assert tls.get_extra_info("sslcontext") is ctx
        assert tls.get_extra_info("peername") == addr
        assert tls.get_extra_info("peercert")["subject"] == ((("commonName", "localhost"),),)
        tls.write(b"secret")
        assert await pr.wait_bytes(9) == b"OK\nSECRET"
        assert log == ["made", ("upgraded", True), b"secret"]
        tls.close()
        assert await wait(pr.lost) is None
        # connection_made ran once (for the plain connection), the rest once
        assert pr.events == ["made", "data", "data", "eof", "lost"]
        await wait_until(lambda: len(log) == 5)
        assert log[3:] == ["eof", ("lost", None)]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_start_tls_streams(loop):
    """StreamWriter.start_tls() on both ends of a streams connection."""
    server_log = []

    async def handler(reader, writer):
        assert await reader.readline() == b"STARTTLS\n"
        writer.write(b"OK\n")
        await writer.drain()
        await writer.start_tls(server_context())
        server_log.append(writer.get_extra_info("ssl_object").version())
        line = await reader.readline()
        writer.write(line[::-1])
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main():
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*srv.sockets[0].getsockname())
        writer.write(b"STARTTLS\n")
        assert await wait(reader.readline()) == b"OK\n"
        await writer.start_tls(client_context(), server_hostname="localhost")
        assert writer.get_extra_info("ssl_object").version() == "TLSv1.3"
        writer.write(b"abc\n")
        assert await wait(reader.read()) == b"\ncba"
        assert server_log == ["TLSv1.3"]
        writer.close()
        await wait(writer.wait_closed())
        srv.close()
        await wait(srv.wait_closed())

    arun(loop, main())


def test_start_tls_on_closing_transport(loop):
    """start_tls() on a transport whose close() already ran but whose
    connection_lost() is still pending: the TLS layer takes the pending
    connection_lost(None), no handshake happens and start_tls() returns None
    (the stock loop's behaviour; no exception)."""
    async def main():
        calls = handler_calls(loop)
        srv = await loop.create_server(lambda: Recorder(loop), "127.0.0.1", 0)
        tr, pr = await loop.create_connection(lambda: Recorder(loop),
                                              *srv.sockets[0].getsockname())
        tr.close()
        # awaited directly: start_tls() must run before the loop's next step
        result = await loop.start_tls(tr, pr, client_context(), server_hostname="localhost")
        assert result is None
        await wait(pr.lost)
        assert pr.events == ["made", "lost"] and pr.exc is None
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_start_tls_on_closed_transport(loop):
    """start_tls() on a transport whose connection_lost() already ran: the
    stock loop's start_tls() never completes (nothing will call the TLS
    layer back; its handshake timeout finds no transport to abort), so the
    caller's own timeout ends it."""
    async def main():
        calls = handler_calls(loop)
        srv = await loop.create_server(lambda: Recorder(loop), "127.0.0.1", 0)
        tr, pr = await loop.create_connection(lambda: Recorder(loop),
                                              *srv.sockets[0].getsockname())
        tr.close()
        await wait(pr.lost)
        t0 = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(loop.start_tls(tr, pr, client_context(),
                                                  server_hostname="localhost",
                                                  ssl_handshake_timeout=0.1), 0.4)
        assert loop.time() - t0 >= 0.35
        assert pr.events == ["made", "lost"]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_start_tls_bad_arguments(loop):
    async def main():
        srv = await loop.create_server(lambda: EchoProtocol(), "127.0.0.1", 0)
        tr, pr = await loop.create_connection(lambda: Recorder(loop),
                                              *srv.sockets[0].getsockname())
        with pytest.raises(TypeError, match=r"^sslcontext is expected to be an instance of "
                                            r"ssl\.SSLContext, got None$"):
            await loop.start_tls(tr, pr, None)
        with pytest.raises(TypeError, match=r"^sslcontext is expected to be an instance of "
                                            r"ssl\.SSLContext, got True$"):
            await loop.start_tls(tr, pr, True)
        with pytest.raises(ValueError, match=r"^ssl_handshake_timeout should be a positive "
                                             r"number, got -1$"):
            await loop.start_tls(tr, pr, client_context(), server_hostname="localhost",
                                 ssl_handshake_timeout=-1)
        with pytest.raises(ValueError, match=r"^ssl_shutdown_timeout should be a positive "
                                             r"number, got 0$"):
            await loop.start_tls(tr, pr, client_context(), server_hostname="localhost",
                                 ssl_shutdown_timeout=0)
        # nothing changed: the plain connection still works
        assert tr.get_protocol() is pr and tr.is_reading()
        tr.write(b"plain")
        assert await pr.wait_bytes(5) == b"plain"
        # a datagram transport cannot be upgraded
        dtr, dpr = await loop.create_datagram_endpoint(asyncio.DatagramProtocol,
                                                       local_addr=("127.0.0.1", 0))
        with pytest.raises(TypeError, match=r"^transport .* is not supported by start_tls\(\)$"):
            await loop.start_tls(dtr, dpr, client_context())
        dtr.close()
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_start_tls_handshake_timeout(loop, listener):
    async def main():
        calls = handler_calls(loop)
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *listener.getsockname())
        t0 = time.monotonic()
        with pytest.raises(ConnectionAbortedError) as ei:
            await loop.start_tls(tr, pr, client_context(), server_hostname="localhost",
                                 ssl_handshake_timeout=0.2)
        assert 0.15 < time.monotonic() - t0 < 2
        assert str(ei.value) == ("SSL handshake is taking longer than 0.2 seconds: "
                                 "aborting the connection")
        assert tr.is_closing()
        await asyncio.sleep(0.05)
        # the protocol was handed to the TLS layer: the plain connection's
        # end is not reported to it
        assert pr.events == ["made"]
        assert calls == []

    arun(loop, main())


# ----------------------------------------------------------------- timeouts

def test_handshake_timeout_client(loop, listener):
    """The server never answers the ClientHello: create_connection() fails
    with asyncio's ConnectionAbortedError after ssl_handshake_timeout."""
    before = open_fds()

    async def main():
        calls = handler_calls(loop)
        t0 = time.monotonic()
        with pytest.raises(ConnectionAbortedError) as ei:
            await wait(loop.create_connection(
                lambda: Recorder(loop), *listener.getsockname(), ssl=client_context(),
                server_hostname="localhost", ssl_handshake_timeout=0.25))
        assert 0.2 < time.monotonic() - t0 < 2
        assert str(ei.value) == ("SSL handshake is taking longer than 0.25 seconds: "
                                 "aborting the connection")
        assert type(ei.value) is ConnectionAbortedError
        assert calls == []

    arun(loop, main())
    # the server side saw the ClientHello, then the end of the connection
    peer, _ = listener.accept()
    peer.settimeout(5)
    head = peer.recv(5)
    assert head[:1] == b"\x16"  # a handshake record
    rest = bytearray()
    while True:
        chunk = peer.recv(1 << 16)
        if not chunk:
            break
        rest += chunk
    assert len(rest) == int.from_bytes(head[3:5], "big")
    peer.close()
    fd_leak_check(before)


@pytest.mark.parametrize("sends", [b"", b"\x16\x03\x01"], ids=["silent", "partial-record"])
def test_handshake_timeout_server(loop, sends):
    """A client that connects and never completes a ClientHello: the server
    drops it after ssl_handshake_timeout; the protocol was made but never
    connected; no exception-handler call; the server keeps serving."""
    async def main():
        calls = handler_calls(loop)
        made = []
        srv = await loop.create_server(lambda: Recorder(loop, on_made=made.append),
                                       "127.0.0.1", 0, ssl=server_context(),
                                       ssl_handshake_timeout=0.2)
        addr = srv.sockets[0].getsockname()

        def silent_client():
            with socket.create_connection(addr, timeout=5) as s:
                s.sendall(sends)
                t0 = time.monotonic()
                data = s.recv(100)
                return data, time.monotonic() - t0

        data, waited = await wait(loop.run_in_executor(None, silent_client))
        assert data == b""
        assert 0.15 < waited < 2
        tr, pr = await wait(loop.create_connection(lambda: Recorder(loop), *addr,
                                                   ssl=client_context(),
                                                   server_hostname="localhost"))
        await wait_until(lambda: made)
        assert len(made) == 1  # only the real client
        tr.close()
        await wait(pr.lost)
        assert calls == []
        await close_server(srv)

    arun(loop, main())


class SilentTLSPeer:
    """A TLS peer in a thread: completes the handshake (server or client
    side), then neither reads nor writes until released."""

    def __init__(self, sock, ctx, server_side):
        self.peer = SyncTLSPeer(sock, ctx, server_side=server_side)
        self.release = threading.Event()

    def run(self):
        try:
            self.peer.handshake()
            self.release.wait(10)
        finally:
            self.peer.sock.close()


def test_shutdown_timeout_client(loop, listener):
    """close() sends close_notify; the peer never answers: after
    ssl_shutdown_timeout the connection is dropped and connection_lost()
    gets asyncio's TimeoutError('SSL shutdown timed out')."""
    async def handshake_and_close():
        accept = loop.run_in_executor(None, listener.accept)
        conn = loop.create_task(loop.create_connection(
            lambda: Recorder(loop), *listener.getsockname(), ssl=client_context(),
            server_hostname="localhost", ssl_shutdown_timeout=0.2))
        sock, _ = await wait(accept)  # a blocking socket: the peer is a thread
        peer = SilentTLSPeer(sock, server_context(), server_side=True)
        th = loop.run_in_executor(None, peer.run)
        try:
            calls = handler_calls(loop)
            tr, pr = await wait(conn)
            t0 = time.monotonic()
            tr.close()
            exc = await wait(pr.lost)
            assert 0.15 < time.monotonic() - t0 < 2
            assert isinstance(exc, asyncio.TimeoutError) and str(exc) == "SSL shutdown timed out"
            assert pr.events == ["made", "lost"]
            assert calls == []
        finally:
            peer.release.set()
            await wait(th)

    arun(loop, handshake_and_close())


def test_shutdown_timeout_server(loop):
    async def main():
        calls = handler_calls(loop)
        accepted = []

        def factory():
            p = Recorder(loop)
            accepted.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=server_context(),
                                       ssl_shutdown_timeout=0.2)
        sock = await loop.run_in_executor(
            None, socket.create_connection, srv.sockets[0].getsockname())
        peer = SilentTLSPeer(sock, client_context(), server_side=False)
        th = loop.run_in_executor(None, peer.run)
        try:
            await wait_until(lambda: accepted and accepted[0].transport)
            t0 = time.monotonic()
            accepted[0].transport.close()
            exc = await wait(accepted[0].lost)
            assert 0.15 < time.monotonic() - t0 < 2
            assert isinstance(exc, asyncio.TimeoutError) and str(exc) == "SSL shutdown timed out"
            assert calls == []
        finally:
            peer.release.set()
            await wait(th)
        await close_server(srv)

    arun(loop, main())


# ---------------------------------------------------------- argument checks

# Whether the stock create_connection() closes the socket when the TLS layer
# cannot be made (gh-153133, 3.14): before, the socket is left to the garbage
# collector (a ResourceWarning).  tideloop follows the stock loop it runs on.
STOCK_CLOSES_SOCKET = "sock.close()" in inspect.getsource(
    asyncio.base_events.BaseEventLoop._create_connection_transport)


def test_create_connection_tls_arguments(loop, listener):
    async def main():
        addr = listener.getsockname()
        conn = loop.create_connection
        for kw, exc, msg in [
            (dict(server_hostname="localhost"), ValueError,
             "server_hostname is only meaningful with ssl"),
            (dict(ssl_handshake_timeout=1), ValueError,
             "ssl_handshake_timeout is only meaningful with ssl"),
            (dict(ssl_shutdown_timeout=1), ValueError,
             "ssl_shutdown_timeout is only meaningful with ssl"),
            (dict(ssl=None, ssl_handshake_timeout=1), ValueError,
             "ssl_handshake_timeout is only meaningful with ssl"),
            # checked once connected, by the TLS layer
            (dict(ssl=client_context(), ssl_handshake_timeout=0), ValueError,
             "ssl_handshake_timeout should be a positive number, got 0"),
            (dict(ssl=client_context(), ssl_handshake_timeout=-1), ValueError,
             "ssl_handshake_timeout should be a positive number, got -1"),
            (dict(ssl=client_context(), ssl_shutdown_timeout=-1.5), ValueError,
             "ssl_shutdown_timeout should be a positive number, got -1.5"),
            (dict(ssl=server_context()), ssl.SSLError,
             "Cannot create a client socket with a PROTOCOL_TLS_SERVER context (_ssl.c:"),
        ]:
            with pytest.raises(exc) as ei:
                await wait(conn(lambda: Recorder(loop), *addr, **kw))
            text = str(ei.value)
            assert text == msg or (msg.endswith(":") and text.startswith(msg)), kw
            del ei
        with socket.socket() as s:
            with pytest.raises(ValueError) as ei:
                await conn(lambda: Recorder(loop), sock=s, ssl=client_context())
            assert str(ei.value) == "You must set server_hostname when using ssl without a host"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        arun(loop, main())
        gc.collect()


def test_tls_layer_error_and_the_socket(loop, listener):
    """The connection is made, then the TLS layer refuses its arguments: the
    stock loop closes the socket itself from 3.14 on (gh-153133); earlier
    versions drop it unclosed, and its finalizer warns when the traceback
    that holds it goes."""
    before = open_fds()

    async def main():
        with pytest.raises(ValueError):
            await conn_with_bad_timeout()

    async def conn_with_bad_timeout():
        await loop.create_connection(lambda: Recorder(loop), *listener.getsockname(),
                                     ssl=client_context(), server_hostname="localhost",
                                     ssl_handshake_timeout=-1)

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        arun(loop, main())
        gc.collect()
    warned = [str(x.message) for x in w if issubclass(x.category, ResourceWarning)]
    if STOCK_CLOSES_SOCKET:
        assert warned == []
    else:
        assert len(warned) == 1 and warned[0].startswith("unclosed <socket.socket"), warned
    fd_leak_check(before)


def _ssl_object_needs_server_hostname():
    """Whether ssl refuses an SSLObject without server_hostname when the
    context checks hostnames (3.14 does; earlier versions check nothing)."""
    try:
        client_context().wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO())
    except ValueError:
        return True
    return False


def test_empty_server_hostname(loop):
    """server_hostname='' asks for no hostname check and sends no SNI.  With
    a context that checks hostnames, the ssl module of 3.14 refuses that
    (ValueError once connected); earlier versions connect, checking only the
    certificate chain."""
    seen = []
    refused = _ssl_object_needs_server_hostname()

    async def main():
        sctx = server_context()
        sctx.sni_callback = lambda obj, name, ctx: seen.append(name)
        srv = await loop.create_server(lambda: EchoProtocol(), "127.0.0.1", 0, ssl=sctx)
        addr = srv.sockets[0].getsockname()
        if refused:
            with pytest.raises(ValueError) as ei:
                await wait(loop.create_connection(lambda: Recorder(loop), *addr,
                                                  ssl=client_context(), server_hostname=""))
            assert str(ei.value) == "check_hostname requires server_hostname"
            await asyncio.sleep(0.1)  # the server's side of it ends
            assert seen == []
        else:
            tr, pr = await wait(loop.create_connection(
                lambda: Recorder(loop), *addr, ssl=client_context(), server_hostname=""))
            assert tr.get_extra_info("ssl_object").server_hostname is None
            assert seen == [None]
            tr.close()
            await wait(pr.lost)
        # without hostname checks, '' is accepted on every version
        ctx = client_context()
        ctx.check_hostname = False
        tr, pr = await wait(loop.create_connection(lambda: Recorder(loop), *addr, ssl=ctx,
                                                   server_hostname=""))
        assert tr.get_extra_info("ssl_object").server_hostname is None
        assert seen[-1] is None
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # 3.11-3.13 (gh-153133)
        arun(loop, main())


def test_server_tls_arguments(loop):
    async def main():
        for kw, exc, msg in [
            (dict(ssl=True), TypeError, "ssl argument must be an SSLContext or None"),
            (dict(ssl_handshake_timeout=1), ValueError,
             "ssl_handshake_timeout is only meaningful with ssl"),
            (dict(ssl_shutdown_timeout=1), ValueError,
             "ssl_shutdown_timeout is only meaningful with ssl"),
        ]:
            with pytest.raises(exc) as ei:
                await loop.create_server(EchoProtocol, "127.0.0.1", 0, **kw)
            assert str(ei.value) == msg, kw
        with pytest.raises(ValueError) as ei:
            await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0,
                                       ssl_handshake_timeout=1)
        assert str(ei.value) == "ssl_handshake_timeout is only meaningful with ssl"
        with pytest.raises(ValueError) as ei:
            await asyncio.open_connection("127.0.0.1", 1, server_hostname="localhost")
        assert str(ei.value) == "server_hostname is only meaningful with ssl"

    arun(loop, main())


def test_connect_accepted_socket_tls(loop):
    """connect_accepted_socket(ssl=...) makes the accepted side a TLS server."""
    async def main():
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        lsock.setblocking(False)
        try:
            connect = loop.create_task(loop.create_connection(
                lambda: Recorder(loop), *lsock.getsockname(), ssl=client_context(),
                server_hostname="localhost"))
            conn, _ = await wait(loop.sock_accept(lsock))
            str_, spr = await wait(loop.connect_accepted_socket(
                lambda: Recorder(loop, on_data=lambda p, d: p.transport.write(d)),
                conn, ssl=server_context()))
            tr, pr = await wait(connect)
            assert str_.get_extra_info("ssl_object").server_side is True
            tr.write(b"accepted")
            assert await pr.wait_bytes(8) == b"accepted"
            tr.close()
            assert await wait(pr.lost) is None
            assert await wait(spr.lost) is None
        finally:
            lsock.close()

    arun(loop, main())
