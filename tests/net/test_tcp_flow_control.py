"""Write flow control of stream transports: pause_writing / resume_writing at
the watermarks, a peer that never reads, exceptions from the callbacks."""
import asyncio

import pytest

from net_helpers import (
    Recorder, arun, close_server, connected_pair, wait, wait_until,
)


@pytest.fixture(params=["tcp", "unix"])
def kind(request):
    return request.param


def paused_server(loop):
    """Server-side Recorder that never reads until resume_reading()."""
    return lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading())


def fill_kernel(tr, chunk=b"k" * 65536):
    """Write until the transport has to buffer (the kernel buffers are full).
    The caller has set a high watermark large enough not to pause."""
    total = 0
    while tr.get_write_buffer_size() == 0:
        tr.write(chunk)
        total += len(chunk)
        assert total < (256 << 20), "kernel never pushed back"
    return total


class Producer(Recorder):
    """Writes `chunk`s while not paused, up to `limit` bytes, then closes."""

    def __init__(self, loop, limit, chunk=65536):
        super().__init__(loop)
        self.limit = limit
        self.chunk = b"p" * chunk
        self.sent = 0
        self.writing = False
        self.size_at_pause = []
        self.size_at_resume = []
        self.max_buffer = 0

    def produce(self):
        self.writing = True
        while self.writing and self.sent < self.limit:
            n = min(len(self.chunk), self.limit - self.sent)
            self.transport.write(self.chunk[:n])
            self.sent += n
            self.max_buffer = max(self.max_buffer, self.transport.get_write_buffer_size())
        if self.sent >= self.limit and not self.transport.is_closing():
            self.transport.close()

    def pause_writing(self):
        super().pause_writing()
        self.size_at_pause.append(self.transport.get_write_buffer_size())
        self.writing = False

    def resume_writing(self):
        super().resume_writing()
        self.size_at_resume.append(self.transport.get_write_buffer_size())
        self.transport.get_protocol()  # still usable inside the callback
        asyncio.get_running_loop().call_soon(self.produce)


def test_peer_never_reads_memory_stays_bounded(loop, kind, tmp_path):
    limit = 48 << 20
    chunk = 65536

    async def main():
        srv, ctr, prod, spr = await connected_pair(
            loop, kind, lambda: Producer(loop, limit, chunk), paused_server(loop),
            tmp_path)
        low, high = ctr.get_write_buffer_limits()
        assert (low, high) == (16384, 65536)
        prod.produce()
        # the peer never reads: the protocol must be paused, not flooded
        assert prod.events == ["made", "pause"]
        assert prod.sent < limit
        size = ctr.get_write_buffer_size()
        assert high < size <= high + chunk
        assert prod.size_at_pause == [size]
        await asyncio.sleep(0.3)
        # nothing moved while the peer is not reading: still bounded, no resume
        assert prod.events == ["made", "pause"]
        assert high < ctr.get_write_buffer_size() <= high + chunk
        sent_while_paused = prod.sent
        # the peer starts reading: resume_writing, then the rest flows
        spr.transport.resume_reading()
        await wait(spr.lost)
        assert len(spr.data) == limit
        assert prod.sent == limit and sent_while_paused < limit
        assert prod.events[:3] == ["made", "pause", "resume"]
        assert prod.events[-1] == "lost"
        n_pause, n_resume = prod.events.count("pause"), prod.events.count("resume")
        assert n_resume in (n_pause, n_pause - 1)
        # alternation: never two pauses (or resumes) in a row
        pr = [e for e in prod.events if e in ("pause", "resume")]
        assert all(a != b for a, b in zip(pr, pr[1:]))
        assert all(s > high for s in prod.size_at_pause)
        assert all(s <= low for s in prod.size_at_resume)
        assert prod.max_buffer <= high + chunk
        await close_server(srv)

    arun(loop, main())


def test_pause_writing_exactly_above_high_water(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Recorder(loop), paused_server(loop), tmp_path)
        ctr.set_write_buffer_limits(high=1 << 30)
        fill_kernel(ctr)
        s0 = ctr.get_write_buffer_size()
        assert s0 > 0
        ctr.set_write_buffer_limits(high=s0 + 100, low=0)
        assert cpr.events == ["made"]
        ctr.write(b"x" * 100)
        assert ctr.get_write_buffer_size() == s0 + 100  # queued behind: exact count
        assert cpr.events == ["made"]  # size == high: not above it
        ctr.write(b"y")
        assert cpr.events == ["made", "pause"]  # synchronous, inside write()
        ctr.write(b"z" * 1000)
        assert cpr.events == ["made", "pause"]  # once
        assert ctr.get_write_buffer_size() == s0 + 1101
        spr.transport.resume_reading()
        await wait(cpr.resumed)
        # low=0: resume only once everything was handed to the kernel
        assert ctr.get_write_buffer_size() == 0
        assert cpr.events == ["made", "pause", "resume"]
        ctr.close()
        await wait(spr.lost)
        await close_server(srv)

    arun(loop, main())


def test_set_write_buffer_limits_pauses_immediately(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Recorder(loop), paused_server(loop), tmp_path)
        ctr.set_write_buffer_limits(high=1 << 30)
        fill_kernel(ctr)
        assert cpr.events == ["made"]
        ctr.set_write_buffer_limits(high=0)
        assert ctr.get_write_buffer_limits() == (0, 0)
        assert cpr.events == ["made", "pause"]
        ctr.set_write_buffer_limits(high=0)
        assert cpr.events == ["made", "pause"]
        spr.transport.resume_reading()
        await wait(cpr.resumed)
        assert ctr.get_write_buffer_size() == 0
        assert cpr.events == ["made", "pause", "resume"]
        # raising the limits never calls resume_writing by itself
        ctr.set_write_buffer_limits(high=1 << 20)
        assert cpr.events == ["made", "pause", "resume"]
        ctr.close()
        await wait(spr.lost)
        await close_server(srv)

    arun(loop, main())


def test_pause_resume_cycles(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Recorder(loop), paused_server(loop), tmp_path)
        ctr.set_write_buffer_limits(high=1 << 30)
        fill_kernel(ctr)
        ctr.set_write_buffer_limits(high=1000, low=0)
        assert cpr.events == ["made", "pause"]
        spr.transport.resume_reading()
        await wait(cpr.resumed)
        spr.transport.pause_reading()
        await asyncio.sleep(0.05)
        # second round: fill the kernel again, then go over the mark
        ctr.set_write_buffer_limits(high=1 << 30)
        fill_kernel(ctr)
        ctr.set_write_buffer_limits(high=1000, low=0)
        ctr.write(b"w" * 2000)
        assert cpr.events == ["made", "pause", "resume", "pause"]
        spr.transport.resume_reading()
        await wait_until(lambda: cpr.events.count("resume") == 2)
        assert cpr.events == ["made", "pause", "resume", "pause", "resume"]
        ctr.close()
        await wait(spr.lost)
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("which", ["pause_writing", "resume_writing"])
def test_flow_control_callback_exception(loop, kind, tmp_path, which):
    boom = RuntimeError(which + " boom")

    class Bad(Recorder):
        def pause_writing(self):
            super().pause_writing()
            if which == "pause_writing":
                raise boom

        def resume_writing(self):
            super().resume_writing()
            if which == "resume_writing":
                raise boom

    async def main():
        calls = []
        loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Bad(loop), paused_server(loop), tmp_path)
        ctr.set_write_buffer_limits(high=1 << 30)
        fill_kernel(ctr)
        ctr.set_write_buffer_limits(high=0)
        assert cpr.events == ["made", "pause"]
        spr.transport.resume_reading()
        await wait(cpr.resumed)
        assert len(calls) == 1
        ctx = calls[0]
        assert ctx["message"] == f"protocol.{which}() failed"
        assert ctx["exception"] is boom
        assert ctx["transport"] is ctr
        assert ctx["protocol"] is cpr
        # the transport is unharmed
        assert not ctr.is_closing()
        ctr.write(b"after")
        ctr.close()
        await wait(spr.lost)
        assert bytes(spr.data).endswith(b"after")
        assert "lost" in cpr.events and cpr.exc is None
        await close_server(srv)

    arun(loop, main())
