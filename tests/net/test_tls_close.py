"""Closing TLS connections (issue 12): clean close from either side
(close_notify both ways, eof_received() then connection_lost(None) on both
sides), close() with data still buffered (flushed first), abort(), a peer that
ends the connection without close_notify (FIN) or with a reset, the warning
for eof_received() returning true, writes after close."""
import asyncio
import logging
import socket
import ssl

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, collapse, fd_leak_check, open_fds,
    rst_close, wait, wait_until,
)
from tls_helpers import SyncTLSPeer, client_context, handler_calls, server_context

pytestmark = pytest.mark.usefixtures("tls_route")


async def tls_pair(loop, server_factory=None, client_factory=None, sctx=None, **ckw):
    """A TLS server (127.0.0.1) and one client; returns (srv, ctr, cpr, spr)
    once the server protocol's connection_made() ran."""
    accepted = []

    def sfactory():
        p = (server_factory or (lambda: Recorder(loop)))()
        accepted.append(p)
        return p

    srv = await loop.create_server(sfactory, "127.0.0.1", 0, ssl=sctx or server_context())
    ctr, cpr = await wait(loop.create_connection(
        client_factory or (lambda: Recorder(loop)), *srv.sockets[0].getsockname(),
        ssl=client_context(), server_hostname="localhost", **ckw))
    await wait_until(lambda: accepted and accepted[0].transport)
    return srv, ctr, cpr, accepted[0]


def test_clean_close_by_client(loop):
    before = open_fds()

    async def main():
        calls = handler_calls(loop)
        srv, ctr, cpr, spr = await tls_pair(loop)
        ctr.close()
        assert ctr.is_closing()
        ctr.close()  # again: nothing more happens
        assert await wait(cpr.lost) is None
        assert await wait(spr.lost) is None
        assert cpr.events == ["made", "eof", "lost"]
        assert spr.events == ["made", "eof", "lost"]
        assert spr.transport.is_closing()
        for _ in range(3):
            await asyncio.sleep(0)
        assert cpr.events.count("lost") == 1 and spr.events.count("lost") == 1
        assert calls == []
        await close_server(srv)

    arun(loop, main())
    fd_leak_check(before)


def test_clean_close_by_server(loop):
    async def main():
        calls = handler_calls(loop)

        def on_made(p):
            p.transport.write(b"bye")
            p.transport.close()

        srv, ctr, cpr, spr = await tls_pair(loop, lambda: Recorder(loop, on_made=on_made))
        assert await wait(cpr.lost) is None
        assert cpr.data == b"bye"
        assert cpr.events == ["made", "data", "eof", "lost"]
        assert await wait(spr.lost) is None
        assert spr.events == ["made", "eof", "lost"]
        assert ctr.is_closing()
        assert calls == []
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("side", ["client", "server"])
def test_close_flushes_buffered_data(loop, side):
    """close() right after a large write: every byte arrives before the
    close_notify."""
    size = 4 << 20
    data = bytes(range(256)) * (size // 256)

    async def main():
        calls = handler_calls(loop)
        srv, ctr, cpr, spr = await tls_pair(loop)
        writer, reader = (ctr, spr) if side == "client" else (spr.transport, cpr)
        writer.write(data)
        writer.close()
        assert await wait(reader.lost) is None
        assert len(reader.data) == size and reader.data == data
        assert collapse(reader.events) == ["made", "data", "eof", "lost"]
        await wait(cpr.lost)
        await wait(spr.lost)
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_abort(loop):
    """abort(): connection_lost(None) without close_notify; the server sees
    the connection end as a peer that closed (eof_received, then
    connection_lost(None))."""
    async def main():
        calls = handler_calls(loop)
        srv, ctr, cpr, spr = await tls_pair(loop)
        ctr.write(b"x" * 100)
        await wait_until(lambda: len(spr.data) == 100)
        ctr.abort()
        assert ctr.is_closing()
        assert await wait(cpr.lost) is None
        assert cpr.events == ["made", "lost"]
        assert await wait(spr.lost) is None
        assert spr.events == ["made", "data", "eof", "lost"]
        assert calls == []
        ctr.abort()  # again: nothing
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_abort_drops_buffered_data(loop):
    size = 16 << 20

    async def main():
        calls = handler_calls(loop)
        srv, ctr, cpr, spr = await tls_pair(loop)
        ctr.write(b"d" * size)
        ctr.abort()
        assert await wait(cpr.lost) is None
        await wait(spr.lost)
        assert len(spr.data) < size
        assert spr.events[-1] == "lost" and spr.events.count("lost") == 1
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def quiet_server_context():
    """A server context that sends no TLS 1.3 session tickets: a peer that
    never reads then has nothing unread when it closes (unread data would
    make its close a reset)."""
    ctx = server_context()
    ctx.num_tickets = 0
    return ctx


class PeerThread:
    """A SyncTLSPeer (client side) connected to ``addr``, run in a thread by
    ``script(peer)``; its socket is closed by the script or at the end."""

    def __init__(self, loop, addr, script):
        self.loop, self.addr, self.script = loop, addr, script

    def _run(self):
        sock = socket.create_connection(self.addr, timeout=5)
        peer = SyncTLSPeer(sock, client_context())
        try:
            peer.handshake()
            return self.script(peer)
        finally:
            if sock.fileno() != -1:
                sock.close()

    def start(self):
        return self.loop.run_in_executor(None, self._run)


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_peer_ends_without_close_notify(loop, how):
    """The peer sends data, then closes its socket with no close_notify.
    A FIN looks like a clean close to asyncio's TLS layer (eof_received(),
    connection_lost(None)); a reset gives connection_lost(ConnectionResetError).
    No exception-handler call either way."""
    async def main():
        calls = handler_calls(loop)
        accepted = []

        def factory():
            p = Recorder(loop)
            accepted.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=quiet_server_context())

        def script(peer):
            peer.send(b"last words")
            if how == "rst":
                rst_close(peer.sock)
            else:
                peer.sock.close()

        await wait(PeerThread(loop, srv.sockets[0].getsockname(), script).start())
        await wait_until(lambda: accepted)
        exc = await wait(accepted[0].lost)
        p = accepted[0]
        if how == "fin":
            assert exc is None
            assert p.events == ["made", "data", "eof", "lost"]
            assert p.data == b"last words"
        else:
            assert isinstance(exc, ConnectionResetError)
            assert p.events[0] == "made" and p.events[-1] == "lost" and "eof" not in p.events
        assert calls == []
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_server_ends_without_close_notify(loop, how):
    """The same seen from a client: the server peer closes its socket without
    close_notify after sending data."""
    async def main():
        calls = handler_calls(loop)
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)

        def serve():
            sock, _ = lsock.accept()
            peer = SyncTLSPeer(sock, server_context(), server_side=True)
            peer.handshake()
            peer.send(b"hello")
            assert peer.recv_exactly(2) == b"ok"
            if how == "rst":
                rst_close(sock)
            else:
                sock.close()

        th = loop.run_in_executor(None, serve)
        try:
            ctr, cpr = await wait(loop.create_connection(
                lambda: Recorder(loop, on_data=lambda p, d: p.transport.write(b"ok")),
                *lsock.getsockname(), ssl=client_context(), server_hostname="localhost"))
            exc = await wait(cpr.lost)
            await wait(th)
        finally:
            lsock.close()
        if how == "fin":
            assert exc is None
            assert cpr.events == ["made", "data", "eof", "lost"]
        else:
            assert isinstance(exc, ConnectionResetError)
            assert cpr.events == ["made", "data", "lost"]
        assert cpr.data == b"hello"
        assert calls == []

    arun(loop, main())


def test_peer_close_notify_then_fin(loop):
    """A peer that sends close_notify and closes its socket without waiting
    for ours: still a clean close here."""
    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv = await loop.create_server(lambda: accepted.append(Recorder(loop)) or accepted[-1],
                                       "127.0.0.1", 0, ssl=quiet_server_context())

        def script(peer):
            peer.send(b"data")
            with pytest.raises(ssl.SSLWantReadError):
                peer.obj.unwrap()  # our close_notify out, theirs not waited for
            peer._flush()
            peer.sock.close()

        await wait(PeerThread(loop, srv.sockets[0].getsockname(), script).start())
        await wait_until(lambda: accepted)
        assert await wait(accepted[0].lost) is None
        assert accepted[0].events == ["made", "data", "eof", "lost"]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_eof_received_returning_true(loop, caplog):
    """Keeping the connection half-open is not possible over TLS: asyncio
    logs a warning and closes anyway."""
    async def main():
        srv, ctr, cpr, spr = await tls_pair(loop, lambda: Recorder(loop, keep_open=True))
        ctr.close()
        assert await wait(spr.lost) is None
        assert spr.events == ["made", "eof", "lost"]
        await wait(cpr.lost)
        await close_server(srv)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        arun(loop, main())
    msgs = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert msgs == ["returning true from eof_received() has no effect when using ssl"]


def test_writes_after_close(loop, caplog):
    """Writes after close() or connection_lost() are dropped without an
    exception; asyncio counts them (write(b"") is not counted, writelines()
    of anything is) and from the 5th one on each logs 'SSL connection is
    closed' (a WARNING on the 'asyncio' logger)."""
    def warned():
        return sum(r.getMessage() == "SSL connection is closed" and r.levelno == logging.WARNING
                   for r in caplog.records)

    async def main():
        srv, ctr, cpr, spr = await tls_pair(loop)
        ctr.close()
        ctr.write(b"")
        ctr.writelines([])       # 1
        ctr.write(b"a")          # 2
        ctr.writelines([b"b", b"c"])  # 3
        ctr.write(b"d")          # 4
        assert warned() == 0
        ctr.write(b"e")          # 5
        assert warned() == 0
        ctr.write(b"f")          # 6: the count was 5
        assert warned() == 1
        await wait(cpr.lost)
        ctr.write(b"g")          # connection_lost() counted one more
        assert warned() == 2
        await wait(spr.lost)
        assert spr.data == b""
        await close_server(srv)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        arun(loop, main())


def test_close_from_connection_made(loop):
    """A client that closes from connection_made(): clean close both ways."""
    async def main():
        srv, ctr, cpr, spr = await tls_pair(
            loop, client_factory=lambda: Recorder(loop, on_made=lambda p: p.transport.close()))
        assert await wait(cpr.lost) is None
        assert await wait(spr.lost) is None
        assert cpr.events == ["made", "eof", "lost"]
        assert spr.events == ["made", "eof", "lost"]
        await close_server(srv)

    arun(loop, main())


def test_server_close_keeps_tls_connections(loop):
    """Server.close() stops accepting; live TLS connections go on."""
    async def main():
        srv, ctr, cpr, spr = await tls_pair(
            loop, lambda: Recorder(loop, on_data=lambda p, d: p.transport.write(d)))
        srv.close()
        ctr.write(b"after server close")
        assert await cpr.wait_bytes(18) == b"after server close"
        ctr.close()
        assert await wait(spr.lost) is None
        await wait(srv.wait_closed())

    arun(loop, main())


@pytest.mark.skipif(not hasattr(asyncio.Server, "close_clients"),
                    reason="Server.close_clients()/abort_clients() are 3.13+")
@pytest.mark.parametrize("how", ["close_clients", "abort_clients"])
def test_server_close_clients(loop, how):
    """3.13+: Server.close_clients()/abort_clients() end the server's TLS
    connections (the socket transports under them: no close_notify); the
    server's protocol gets connection_lost(None), the client sees the
    connection end without close_notify (eof_received(), then
    connection_lost(None)); wait_closed() returns."""
    async def main():
        calls = handler_calls(loop)
        srv, ctr, cpr, spr = await tls_pair(loop)
        srv.close()
        getattr(srv, how)()
        assert await wait(spr.lost) is None
        assert spr.events == ["made", "lost"]
        assert await wait(cpr.lost) is None
        assert cpr.events == ["made", "eof", "lost"]
        await wait(srv.wait_closed())
        assert calls == []

    arun(loop, main())
