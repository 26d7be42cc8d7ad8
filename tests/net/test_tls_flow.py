"""Flow control over TLS (issue 12): the write buffer limits and their
defaults, pause_writing()/resume_writing() when the peer stops reading,
get_write_buffer_size(), pause_reading()/resume_reading()/is_reading() (with
data and with the peer's close arriving while paused), streams' drain(), a
peer that never reads, then resets."""
import asyncio
import socket
import threading

import pytest

from net_helpers import Recorder, arun, close_server, rst_close, wait, wait_until
from tls_helpers import SyncTLSPeer, client_context, handler_calls, server_context

pytestmark = pytest.mark.usefixtures("tls_route")

CHUNK = 64 << 10


async def tls_pair(loop, server_factory=None, client_factory=None, sctx=None):
    accepted = []

    def sfactory():
        p = (server_factory or (lambda: Recorder(loop)))()
        accepted.append(p)
        return p

    srv = await loop.create_server(sfactory, "127.0.0.1", 0, ssl=sctx or server_context())
    ctr, cpr = await wait(loop.create_connection(
        client_factory or (lambda: Recorder(loop)), *srv.sockets[0].getsockname(),
        ssl=client_context(), server_hostname="localhost"))
    await wait_until(lambda: accepted and accepted[0].transport)
    return srv, ctr, cpr, accepted[0]


def test_write_buffer_limits(loop):
    async def main():
        srv, ctr, cpr, spr = await tls_pair(loop)
        # asyncio's TLS defaults: 512 KiB high, a quarter of it low
        assert ctr.get_write_buffer_limits() == (128 << 10, 512 << 10)
        ctr.set_write_buffer_limits(high=1000)
        assert ctr.get_write_buffer_limits() == (250, 1000)
        ctr.set_write_buffer_limits(low=100)
        assert ctr.get_write_buffer_limits() == (100, 400)
        ctr.set_write_buffer_limits(high=300, low=20)
        assert ctr.get_write_buffer_limits() == (20, 300)
        with pytest.raises(ValueError, match=r"^high \(1\) must be >= low \(2\) must be >= 0$"):
            ctr.set_write_buffer_limits(high=1, low=2)
        with pytest.raises(ValueError, match=r"^high \(-1\) must be >= low \(-1\) must be >= 0$"):
            ctr.set_write_buffer_limits(high=-1, low=-1)
        assert ctr.get_write_buffer_limits() == (20, 300)
        ctr.set_write_buffer_limits()
        assert ctr.get_write_buffer_limits() == (128 << 10, 512 << 10)
        assert ctr.get_write_buffer_size() == 0
        assert cpr.events == ["made"]  # no pause from changing limits on an idle transport
        ctr.close()
        await wait(cpr.lost)
        await close_server(srv)

    arun(loop, main())


def test_pause_and_resume_writing(loop):
    """The server stops reading: the client's writes pile up until
    pause_writing(); once the server reads again, resume_writing() comes
    with the buffer at or below the low-water mark, and every byte arrives."""
    async def main():
        calls = handler_calls(loop)
        srv, ctr, cpr, spr = await tls_pair(
            loop, lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        ctr.set_write_buffer_limits(high=4 * CHUNK, low=CHUNK)
        sent = 0
        while "pause" not in cpr.events and sent < (256 << 20):
            ctr.write(b"w" * CHUNK)
            sent += CHUNK
            await asyncio.sleep(0)
        assert cpr.events == ["made", "pause"]
        assert ctr.get_write_buffer_size() >= 4 * CHUNK
        assert not spr.transport.is_reading()
        spr.transport.resume_reading()
        await wait(cpr.resumed)
        assert cpr.events == ["made", "pause", "resume"]
        assert ctr.get_write_buffer_size() <= CHUNK
        await spr.wait_bytes(sent)
        assert len(spr.data) == sent
        await wait_until(lambda: ctr.get_write_buffer_size() == 0)
        ctr.close()
        await wait(cpr.lost)
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_streams_drain_waits_for_reader(loop):
    """StreamWriter.drain() over TLS blocks while the peer does not read."""
    go = asyncio.Event()
    got = []

    async def handler(reader, writer):
        await go.wait()
        n = 0
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            n += len(chunk)
        got.append(n)
        writer.close()

    async def main():
        srv = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context(),
                                         limit=1 << 16)
        reader, writer = await asyncio.open_connection(
            *srv.sockets[0].getsockname(), ssl=client_context(), server_hostname="localhost")
        total = 0
        drained = True
        while drained and total < (256 << 20):
            writer.write(b"d" * (1 << 20))
            total += 1 << 20
            drain = loop.create_task(writer.drain())
            await asyncio.sleep(0.02)
            drained = drain.done()
        assert not drained  # blocked: nobody reads
        go.set()
        await wait(drain)
        writer.close()
        await wait(writer.wait_closed())
        await wait_until(lambda: got)
        assert got == [total]
        srv.close()
        await wait(srv.wait_closed())

    arun(loop, main())


def test_pause_and_resume_reading(loop):
    async def main():
        srv, ctr, cpr, spr = await tls_pair(loop)
        assert ctr.is_reading()
        ctr.pause_reading()
        assert not ctr.is_reading()
        ctr.pause_reading()  # again: no error
        spr.transport.write(b"while paused")
        await asyncio.sleep(0.1)
        assert cpr.events == ["made"] and cpr.data == b""
        ctr.resume_reading()
        assert ctr.is_reading()
        assert await cpr.wait_bytes(12) == b"while paused"
        ctr.resume_reading()  # again: no error
        spr.transport.write(b"!")
        assert await cpr.wait_bytes(13) == b"while paused!"
        ctr.close()
        await wait(cpr.lost)
        await close_server(srv)

    arun(loop, main())


def test_close_arrives_while_reading_paused(loop):
    """Data and the peer's close_notify arrive while reading is paused:
    nothing is delivered until resume_reading(), then the data, eof_received()
    and connection_lost(None), in that order."""
    async def main():
        srv, ctr, cpr, spr = await tls_pair(loop)
        ctr.pause_reading()
        spr.transport.write(b"last")
        spr.transport.close()
        await asyncio.sleep(0.1)
        assert cpr.events == ["made"]
        ctr.resume_reading()
        assert await wait(cpr.lost) is None
        assert cpr.events == ["made", "data", "eof", "lost"]
        assert cpr.data == b"last"
        assert await wait(spr.lost) is None
        await close_server(srv)

    arun(loop, main())


def test_pause_reading_large_inflow(loop):
    """The peer keeps sending 8 MiB while the client's reading is paused:
    nothing is delivered while paused, then all of it in order."""
    size = 8 << 20
    data = bytes(range(256)) * (size // 256)

    async def main():
        srv, ctr, cpr, spr = await tls_pair(loop)
        ctr.pause_reading()
        spr.transport.write(data)
        await asyncio.sleep(0.2)
        assert cpr.data == b""
        ctr.resume_reading()
        assert await cpr.wait_bytes(size) == data
        ctr.close()
        await wait(cpr.lost)
        await close_server(srv)

    arun(loop, main())


def test_peer_never_reads_then_resets(loop):
    """A peer that completes the handshake and never reads: the server's
    writes pause at the high-water mark; when the peer resets,
    connection_lost() gets ConnectionResetError and the buffer is dropped.
    No exception-handler call."""
    release = threading.Event()

    async def main():
        calls = handler_calls(loop)
        accepted = []

        class Writer(asyncio.Protocol):
            def __init__(self):
                self.events, self.paused = [], False
                self.lost = loop.create_future()

            def connection_made(self, tr):
                self.tr = tr
                accepted.append(self)
                tr.set_write_buffer_limits(high=4 * CHUNK)
                self.fill()

            def fill(self):
                n = 0
                while not self.paused and n < 4096:
                    self.tr.write(b"z" * CHUNK)
                    n += 1

            def pause_writing(self):
                self.paused = True
                self.events.append("pause")

            def resume_writing(self):
                self.events.append("resume")

            def connection_lost(self, exc):
                self.events.append("lost")
                self.lost.set_result(exc)

        srv = await loop.create_server(Writer, "127.0.0.1", 0, ssl=server_context())
        addr = srv.sockets[0].getsockname()

        def peer():
            sock = socket.create_connection(addr, timeout=5)
            p = SyncTLSPeer(sock, client_context())
            p.handshake()
            release.wait(5)
            rst_close(sock)

        th = loop.run_in_executor(None, peer)
        await wait_until(lambda: accepted and accepted[0].paused)
        w = accepted[0]
        size = w.tr.get_write_buffer_size()
        assert 4 * CHUNK <= size <= 4 * CHUNK + 2 * CHUNK
        await asyncio.sleep(0.1)
        assert w.events == ["pause"]
        release.set()
        exc = await wait(w.lost)
        await wait(th)
        assert isinstance(exc, ConnectionResetError)
        assert w.events == ["pause", "lost"]
        assert w.tr.get_write_buffer_size() == 0
        assert calls == []
        await close_server(srv)

    try:
        arun(loop, main())
    finally:
        release.set()
