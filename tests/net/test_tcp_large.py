"""Volume: 64 MiB checksummed through a Protocol echo (with flow control on
both sides), and 1,000 concurrent connections to one server."""
import asyncio
import hashlib
import os
import time

import pytest

from net_helpers import (
    Recorder, arun, close_server, fd_leak_check, open_fds, raise_nofile,
    start_server, wait,
)

TOTAL = 64 << 20


class FlowEcho(asyncio.Protocol):
    """Echo server that respects back-pressure: when its own write buffer is
    over the high-water mark it stops reading."""

    def __init__(self, stats):
        self.stats = stats

    def connection_made(self, tr):
        self.tr = tr

    def data_received(self, data):
        self.tr.write(data)

    def eof_received(self):
        self.tr.close()  # flushes the echo, then FIN

    def pause_writing(self):
        self.stats["pauses"] += 1
        self.stats["max_buffer"] = max(self.stats["max_buffer"],
                                       self.tr.get_write_buffer_size())
        self.tr.pause_reading()

    def resume_writing(self):
        self.tr.resume_reading()

    def connection_lost(self, exc):
        self.stats["lost"].set_result(exc)


class Client(asyncio.Protocol):
    def __init__(self, loop, block, nblocks):
        self.block, self.left = block, nblocks
        self.h = hashlib.sha256()
        self.n = 0
        self.can_write = True
        self.done = loop.create_future()
        self.events = []

    def connection_made(self, tr):
        self.tr = tr
        self.events.append("made")
        self.pump()

    def pump(self):
        while self.can_write and self.left:
            self.tr.write(self.block)
            self.left -= 1
        if not self.left and not self.tr.is_closing():
            if "eof-sent" not in self.events:
                self.events.append("eof-sent")
                self.tr.write_eof()

    def pause_writing(self):
        self.can_write = False

    def resume_writing(self):
        self.can_write = True
        asyncio.get_running_loop().call_soon(self.pump)

    def data_received(self, data):
        self.h.update(data)
        self.n += len(data)

    def eof_received(self):
        self.events.append("eof")

    def connection_lost(self, exc):
        self.events.append("lost")
        self.done.set_result(exc)


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_64mib_protocol_echo_checksum(loop, kind, tmp_path):
    block = os.urandom(1 << 20)
    nblocks = TOTAL // len(block)
    expect = hashlib.sha256(block * nblocks).hexdigest()

    async def main():
        stats = {"pauses": 0, "max_buffer": 0, "lost": loop.create_future()}
        srv, addr = await start_server(loop, kind, lambda: FlowEcho(stats), tmp_path)
        t0 = time.monotonic()
        if kind == "tcp":
            tr, pr = await loop.create_connection(lambda: Client(loop, block, nblocks), *addr)
        else:
            tr, pr = await loop.create_unix_connection(lambda: Client(loop, block, nblocks), addr)
        exc = await wait(pr.done, 15)
        elapsed = time.monotonic() - t0
        assert exc is None
        assert pr.n == TOTAL
        assert pr.h.hexdigest() == expect
        assert pr.events == ["made", "eof-sent", "eof", "lost"]
        assert await wait(stats["lost"]) is None
        # the echo side never buffered much more than one read (256 KiB max
        # read in asyncio) over its high-water mark
        assert stats["max_buffer"] <= 65536 + (1 << 20)
        assert elapsed < 15
        await close_server(srv)

    arun(loop, main(), timeout=30)


def test_1000_concurrent_connections(loop):
    n = 1000
    raise_nofile(2 * n + 200)

    class Echo(asyncio.Protocol):
        def connection_made(self, tr):
            self.tr = tr

        def data_received(self, data):
            self.tr.write(data)

    async def main():
        before = open_fds()
        made = []

        def factory():
            p = Echo()
            made.append(p)
            return p

        srv = await loop.create_server(factory, "127.0.0.1", 0, backlog=n)
        addr = srv.sockets[0].getsockname()
        conns = await asyncio.gather(*(
            loop.create_connection(lambda: Recorder(loop), *addr) for _ in range(n)))
        # all open at the same time
        assert len(conns) == n
        for i, (tr, pr) in enumerate(conns):
            tr.write(b"msg-%04d;" % i)
        await asyncio.gather(*(pr.wait_bytes(9) for _, pr in conns))
        assert [bytes(pr.data) for _, pr in conns] == [b"msg-%04d;" % i for i in range(n)]
        assert len(made) == n
        for tr, _ in conns:
            tr.close()
        await asyncio.gather(*(wait(pr.lost) for _, pr in conns))
        assert all(pr.events == ["made", "data", "lost"] for _, pr in conns)
        await close_server(srv)
        for _ in range(5):
            await asyncio.sleep(0)
        del conns, made
        fd_leak_check(before)

    t0 = time.monotonic()
    arun(loop, main(), timeout=30)
    assert time.monotonic() - t0 < 15
