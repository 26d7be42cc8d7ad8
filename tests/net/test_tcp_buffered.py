"""BufferedProtocol over stream transports: get_buffer / buffer_updated."""
import asyncio
import hashlib
import os

import pytest

from net_helpers import (
    Recorder, arun, close_server, connect, start_server, wait, wait_until,
)


@pytest.fixture(params=["tcp", "unix"])
def kind(request):
    return request.param


class Buf(asyncio.BufferedProtocol):
    def __init__(self, loop, size=7, keep_open=False, on_made=None,
                 get_buffer_result=None, raise_in=None):
        self.loop = loop
        self.events = []
        self.size = size
        self.buf = bytearray(size)
        self.data = bytearray()
        self.sizehints = set()
        self.last_len = None
        self.keep_open = keep_open
        self.on_made = on_made
        self.get_buffer_result = get_buffer_result
        self.raise_in = raise_in
        self.transport = None
        self.exc = "never called"
        self.lost = loop.create_future()
        self.eof = loop.create_future()

    def connection_made(self, tr):
        self.events.append("made")
        self.transport = tr
        if self.on_made:
            self.on_made(self)

    def get_buffer(self, sizehint):
        self.events.append("get_buffer")
        self.sizehints.add(type(sizehint))
        if self.raise_in == "get_buffer":
            raise self.raise_in_exc
        if self.get_buffer_result is not None:
            return self.get_buffer_result
        self.last_len = len(self.buf)
        return self.buf

    def buffer_updated(self, nbytes):
        self.events.append("updated")
        assert 0 < nbytes <= self.last_len
        self.data += self.buf[:nbytes]
        if self.raise_in == "buffer_updated":
            raise self.raise_in_exc

    def eof_received(self):
        self.events.append("eof")
        self.eof.set_result(None)
        return self.keep_open

    def connection_lost(self, exc):
        self.events.append("lost")
        self.exc = exc
        self.lost.set_result(exc)


def sender(payload):
    """A client protocol that sends payload then write_eof."""
    def on_made(p):
        p.transport.write(payload)
        p.transport.write_eof()
    return on_made


def test_small_buffer_many_calls(loop, kind, tmp_path):
    payload = os.urandom(100_000)

    async def main():
        protos = []

        def factory():
            p = Buf(loop, size=7)
            protos.append(p)
            return p

        srv, addr = await start_server(loop, kind, factory, tmp_path)
        ctr, cpr = await connect(loop, kind,
                                 lambda: Recorder(loop, keep_open=True, on_made=sender(payload)),
                                 addr)
        await wait_until(lambda: protos)
        p = protos[0]
        await wait(p.lost)
        assert bytes(p.data) == payload
        assert p.sizehints == {int}
        # every buffer_updated follows its own get_buffer
        body = p.events[1:-2]
        assert p.events[0] == "made" and p.events[-2:] == ["eof", "lost"]
        assert body[0::2] == ["get_buffer"] * (len(body) // 2 + len(body) % 2)
        assert all(e == "updated" for e in body[1::2])
        assert p.events.count("updated") >= len(payload) // 7
        assert p.exc is None
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_buffered_large_transfer_checksum(loop, kind, tmp_path):
    total = 16 << 20
    block = os.urandom(1 << 20)

    async def main():
        protos = []

        class Hashing(Buf):
            def __init__(self):
                super().__init__(loop, size=65536)
                self.h = hashlib.sha256()
                self.n = 0
                self.mv = memoryview(self.buf)

            def buffer_updated(self, nbytes):
                self.h.update(self.mv[:nbytes])
                self.n += nbytes

        def factory():
            p = Hashing()
            protos.append(p)
            return p

        srv, addr = await start_server(loop, kind, factory, tmp_path)

        def on_made(p):
            for _ in range(total // len(block)):
                p.transport.write(block)
            p.transport.write_eof()

        ctr, cpr = await connect(loop, kind,
                                 lambda: Recorder(loop, keep_open=True, on_made=on_made), addr)
        await wait_until(lambda: protos)
        await wait(protos[0].lost, 10)
        expect = hashlib.sha256(block * (total // len(block))).hexdigest()
        assert protos[0].n == total
        assert protos[0].h.hexdigest() == expect
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_buffer_memoryview_slice(loop, kind, tmp_path):
    """get_buffer may return a writable memoryview into a larger buffer."""
    async def main():
        backing = bytearray(b"." * 20)
        protos = []

        class Slice(Buf):
            def get_buffer(self, sizehint):
                self.events.append("get_buffer")
                self.last_len = 5
                return memoryview(backing)[10:15]

            def buffer_updated(self, nbytes):
                self.events.append("updated")
                self.data += backing[10:10 + nbytes]

        def factory():
            p = Slice(loop)
            protos.append(p)
            return p

        srv, addr = await start_server(loop, kind, factory, tmp_path)
        ctr, cpr = await connect(loop, kind,
                                 lambda: Recorder(loop, keep_open=True, on_made=sender(b"abcdefghij")),
                                 addr)
        await wait_until(lambda: protos)
        await wait(protos[0].lost)
        assert bytes(protos[0].data) == b"abcdefghij"
        assert backing[:10] == b"." * 10 and backing[15:] == b"." * 5
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_buffered_eof_keep_open_and_reply(loop, kind, tmp_path):
    async def main():
        protos = []

        def factory():
            p = Buf(loop, size=1024, keep_open=True)
            protos.append(p)
            return p

        srv, addr = await start_server(loop, kind, factory, tmp_path)
        ctr, cpr = await connect(loop, kind,
                                 lambda: Recorder(loop, keep_open=True, on_made=sender(b"hi")),
                                 addr)
        await wait_until(lambda: protos)
        p = protos[0]
        await wait(p.eof)
        assert not p.transport.is_closing()
        p.transport.write(b"reply")
        p.transport.close()
        await wait(cpr.eof)
        assert bytes(cpr.data) == b"reply"
        assert cpr.events == ["made", "data", "eof"]
        await wait(p.lost)
        assert p.events == ["made", "get_buffer", "updated", "get_buffer", "eof", "lost"]
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_buffered_pause_reading_in_connection_made(loop, kind, tmp_path):
    async def main():
        protos = []

        def factory():
            p = Buf(loop, size=1024, on_made=lambda p: p.transport.pause_reading())
            protos.append(p)
            return p

        srv, addr = await start_server(loop, kind, factory, tmp_path)
        ctr, cpr = await connect(loop, kind,
                                 lambda: Recorder(loop, keep_open=True, on_made=sender(b"xyz")),
                                 addr)
        await wait_until(lambda: protos)
        await asyncio.sleep(0.1)
        p = protos[0]
        assert p.events == ["made"]
        p.transport.resume_reading()
        await wait(p.lost)
        assert bytes(p.data) == b"xyz"
        ctr.close()
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("case", ["empty", "raises", "updated_raises", "readonly"])
def test_buffered_protocol_errors(loop, kind, tmp_path, case):
    boom = ZeroDivisionError("boom")

    async def main():
        calls = []
        loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
        protos = []

        def factory():
            if case == "empty":
                p = Buf(loop, get_buffer_result=bytearray())
            elif case == "readonly":
                p = Buf(loop, get_buffer_result=b"read-only bytes")
            elif case == "raises":
                p = Buf(loop, raise_in="get_buffer")
            else:
                p = Buf(loop, raise_in="buffer_updated")
            p.raise_in_exc = boom
            protos.append(p)
            return p

        srv, addr = await start_server(loop, kind, factory, tmp_path)
        ctr, cpr = await connect(loop, kind,
                                 lambda: Recorder(loop, keep_open=True, on_made=sender(b"data")),
                                 addr)
        await wait_until(lambda: protos)
        p = protos[0]
        exc = await wait(p.lost)
        assert len(calls) == 1
        ctx = calls[0]
        assert ctx["transport"] is p.transport and ctx["protocol"] is p
        assert ctx["exception"] is exc
        if case == "empty":
            assert ctx["message"] == "Fatal error: protocol.get_buffer() call failed."
            assert type(exc) is RuntimeError
            assert str(exc) == "get_buffer() returned an empty buffer"
            assert p.events == ["made", "get_buffer", "lost"]
        elif case == "raises":
            assert ctx["message"] == "Fatal error: protocol.get_buffer() call failed."
            assert exc is boom
            assert p.events == ["made", "get_buffer", "lost"]
        elif case == "readonly":
            assert ctx["message"] == "Fatal read error on socket transport"
            assert isinstance(exc, TypeError)
            assert p.events == ["made", "get_buffer", "lost"]
        else:
            assert ctx["message"] == "Fatal error: protocol.buffer_updated() call failed."
            assert exc is boom
            assert p.events == ["made", "get_buffer", "updated", "lost"]
        # the client sees the server go away (FIN, or RST when data was unread)
        await wait_until(lambda: "eof" in cpr.events or "lost" in cpr.events)
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_buffered_methods_looked_up_at_call_time(loop, kind, tmp_path):
    """Like data_received, get_buffer/buffer_updated are looked up on the
    protocol at each call: instance attributes assigned later are used."""
    async def main():
        protos = []

        class Switching(Buf):
            def connection_made(self, tr):
                super().connection_made(tr)
                self.big = bytearray(64)
                self.get_buffer = self.get_big
                self.buffer_updated = self.big_updated

            def get_big(self, sizehint):
                self.events.append("get_big")
                return self.big

            def big_updated(self, nbytes):
                self.events.append("big_updated")
                self.data += self.big[:nbytes]

        def factory():
            p = Switching(loop)
            protos.append(p)
            return p

        srv, addr = await start_server(loop, kind, factory, tmp_path)
        ctr, cpr = await connect(loop, kind,
                                 lambda: Recorder(loop, keep_open=True, on_made=sender(b"0123456789")),
                                 addr)
        await wait_until(lambda: protos)
        p = protos[0]
        await wait(p.lost)
        assert bytes(p.data) == b"0123456789"
        assert "get_buffer" not in p.events and "updated" not in p.events
        assert p.events[:3] == ["made", "get_big", "big_updated"]
        ctr.close()
        await close_server(srv)

    arun(loop, main())
