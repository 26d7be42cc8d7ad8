"""Pipe transports: loop.connect_read_pipe / loop.connect_write_pipe over
os.pipe(), FIFOs, socketpair ends, character devices and ptys; what they
reject; callbacks and their order; flow control; closing and aborting; the
read end going away.

Every test runs on the stock selector loop (the spec) and on tideloop.  The
other end of each pipe is a plain fd, driven from the test (or a thread)."""
import asyncio
import gc
import hashlib
import logging
import os
import socket
import struct
import sys
import threading
import warnings

import pytest

from loop_helpers import IN_MAIN_INTERPRETER, SLOW
from net_helpers import (
    Recorder, arun, collapse, fd_leak_check, open_fds, wait, wait_until,
)


def handler_calls(loop):
    calls = []
    loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
    return calls



@pytest.fixture
def fds_checked():
    """Assert at the end of the test that no fd it opened is still open."""
    before = open_fds()
    yield
    fd_leak_check(before)


class FileNo:
    """The least a pipe object must be: something with fileno()."""

    def __init__(self, fd):
        self.fd = fd

    def fileno(self):
        return self.fd

    def close(self):
        pass


def read_all(fd):
    """Blocking: read ``fd`` to EOF."""
    out = bytearray()
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return bytes(out)
        out += chunk


def blocking_writer(fd, data, chunk=1 << 16, close=True):
    """Thread: write ``data`` to ``fd`` (blocking), then close it."""
    def run():
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view[:chunk])
                view = view[n:]
        finally:
            if close:
                os.close(fd)

    # (an isolated subinterpreter refuses daemon threads)
    t = threading.Thread(target=run, daemon=IN_MAIN_INTERPRETER)
    t.start()
    return t


# ================================================================ read pipes


def test_read_pipe_os_pipe(loop, fds_checked):
    r, w = os.pipe()
    robj = open(r, "rb", buffering=0)

    async def main():
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), robj)
        assert p.events == ["made"] and p.transport is tr
        assert tr.get_extra_info("pipe") is robj
        assert tr.get_extra_info("nope", 7) == 7
        assert tr.get_protocol() is p
        assert tr.is_reading() and not tr.is_closing()
        assert not os.get_blocking(r)
        os.write(w, b"hello ")
        await p.wait_bytes(6)
        os.write(w, b"world")
        await p.wait_bytes(11)
        assert bytes(p.data) == b"hello world" and p.data_types == {bytes}
        os.close(w)
        assert await wait(p.lost) is None
        assert collapse(p.events) == ["made", "data", "eof", "lost"]
        assert tr.is_closing() and not tr.is_reading()
        assert robj.closed  # the transport closed the pipe
        tr.close()          # no effect now
        await asyncio.sleep(0)
        assert p.events.count("lost") == 1

    arun(loop, main())


def test_read_pipe_eof_callbacks_are_separate(loop, fds_checked):
    """eof_received and connection_lost both run on EOF, whatever
    eof_received returns, each as its own callback."""
    r, w = os.pipe()
    seen = []

    async def main():
        tr, p = await loop.connect_read_pipe(
            lambda: Recorder(loop, keep_open=True,
                             on_eof=lambda pr: loop.call_soon(seen.append, "between")),
            open(r, "rb", buffering=0))
        os.close(w)
        await wait(p.lost)
        assert p.events == ["made", "eof", "lost"]

    arun(loop, main())
    assert seen == ["between"]


def test_read_pipe_large_stream_checksum(loop, fds_checked):
    """64 MiB through a pipe: every byte, in order."""
    size = 64 << 20
    payload = os.urandom(1 << 20) * 64
    expected = hashlib.sha256(payload).hexdigest()
    r, w = os.pipe()
    state = {"h": hashlib.sha256(), "n": 0, "chunks": 0}

    class Sink(asyncio.Protocol):
        def __init__(self):
            self.lost = loop.create_future()
            self.events = []

        def connection_made(self, tr):
            self.events.append("made")

        def data_received(self, data):
            state["h"].update(data)
            state["n"] += len(data)
            state["chunks"] += 1
            if self.events[-1] != "data":
                self.events.append("data")

        def eof_received(self):
            self.events.append("eof")

        def connection_lost(self, exc):
            self.events.append("lost")
            self.lost.set_result(exc)

    async def main():
        tr, p = await loop.connect_read_pipe(Sink, open(r, "rb", buffering=0))
        t = blocking_writer(w, payload, chunk=1 << 20)
        assert await wait(p.lost, 25 * SLOW) is None
        t.join(5)
        assert p.events == ["made", "data", "eof", "lost"]

    arun(loop, main(), timeout=28 * SLOW)
    assert state["n"] == size
    assert state["h"].hexdigest() == expected


def test_read_pipes_interleaved_chunks_kept(loop, fds_checked):
    """Two read pipes on one loop, fed at once; the protocols keep every
    chunk object they are given: none changes afterwards."""
    size = 8 << 20
    payloads = [bytes([i]) * 1000 + os.urandom(size - 1000) for i in range(2)]

    class Keep(asyncio.Protocol):
        def __init__(self):
            self.chunks = []
            self.lost = loop.create_future()

        def data_received(self, data):
            self.chunks.append(data)

        def connection_lost(self, exc):
            self.lost.set_result(exc)

    async def main():
        protos, threads = [], []
        for payload in payloads:
            r, w = os.pipe()
            tr, p = await loop.connect_read_pipe(Keep, open(r, "rb", buffering=0))
            protos.append(p)
            threads.append(blocking_writer(w, payload, chunk=100_003))
        for p in protos:
            assert await wait(p.lost, 20 * SLOW) is None
        for t in threads:
            t.join(5)
        for p, payload in zip(protos, payloads):
            assert all(type(c) is bytes for c in p.chunks)
            assert b"".join(p.chunks) == payload

    arun(loop, main(), timeout=25 * SLOW)


def test_read_pipe_fifo(loop, tmp_path, fds_checked):
    path = str(tmp_path / "fifo")
    os.mkfifo(path)
    rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(path, os.O_WRONLY)

    async def main():
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), open(rfd, "rb", buffering=0))
        os.write(wfd, b"through a fifo")
        await p.wait_bytes(14)
        os.close(wfd)
        assert await wait(p.lost) is None
        assert collapse(p.events) == ["made", "data", "eof", "lost"]
        assert bytes(p.data) == b"through a fifo"

    arun(loop, main())


def test_read_pipe_socket(loop, fds_checked):
    a, b = socket.socketpair()

    async def main():
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), a)
        assert tr.get_extra_info("pipe") is a
        b.sendall(b"sock-data")
        await p.wait_bytes(9)
        b.shutdown(socket.SHUT_WR)
        assert await wait(p.lost) is None
        assert collapse(p.events) == ["made", "data", "eof", "lost"]
        assert a.fileno() == -1
        b.close()

    arun(loop, main())


def _rst(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as lsn:
        c = socket.create_connection(lsn.getsockname())
        s, _ = lsn.accept()
    return c, s


def test_read_pipe_socket_reset(loop, fds_checked):
    """A read error other than EIO (here ECONNRESET on a TCP socket used as a
    read pipe) IS reported to the exception handler, then connection_lost."""
    c, s = _tcp_pair()

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), c)
        _rst(s)
        exc = await wait(p.lost)
        assert isinstance(exc, ConnectionResetError), repr(exc)
        assert [x["message"] for x in calls] == ["Fatal read error on pipe transport"]
        assert calls[0]["exception"] is exc
        assert calls[0]["transport"] is tr and calls[0]["protocol"] is p
        assert p.events == ["made", "lost"]

    arun(loop, main())


def test_write_pipe_socket_reset_with_buffer(loop, fds_checked):
    c, s = _tcp_pair()

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), c)
        tr.write(b"x" * (8 << 20))
        assert tr.get_write_buffer_size() > 0
        _rst(s)
        exc = await wait(p.lost)
        assert isinstance(exc, BrokenPipeError), repr(exc)
        assert calls == []
        assert p.events == ["made", "pause", "lost"]

    arun(loop, main())


def test_read_pipe_pty(loop, fds_checked):
    """Like test_events.test_read_pty_output: a pty master is a character
    device; the slave closing makes read() fail with EIO, which ends the
    transport with that error but is not reported to the handler."""
    master, slave = os.openpty()

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), open(master, "rb", buffering=0))
        os.write(slave, b"1")
        await p.wait_bytes(1)
        assert bytes(p.data) == b"1"
        os.write(slave, b"2345")
        await p.wait_bytes(5)
        assert bytes(p.data) == b"12345"
        os.close(slave)
        exc = await wait(p.lost)
        assert isinstance(exc, OSError) and exc.errno == 5, repr(exc)  # EIO
        assert collapse(p.events) == ["made", "data", "lost"]
        assert calls == []
        assert tr.get_extra_info("pipe") is not None

    arun(loop, main())


def test_read_pipe_pause_resume(loop, fds_checked):
    r, w = os.pipe()

    async def main():
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), open(r, "rb", buffering=0))
        tr.pause_reading()
        assert not tr.is_reading()
        tr.pause_reading()
        os.write(w, b"queued")
        await asyncio.sleep(0.05)
        assert p.events == ["made"]
        tr.resume_reading()
        assert tr.is_reading()
        tr.resume_reading()
        await p.wait_bytes(6)
        # pausing from data_received
        p.on_data = lambda pr, d: pr.transport.pause_reading()
        os.write(w, b"more")
        await p.wait_bytes(10)
        n = p.chunks
        os.write(w, b"held")
        os.close(w)   # EOF waits behind the pause too
        await asyncio.sleep(0.05)
        assert p.chunks == n and "eof" not in p.events
        p.on_data = None
        tr.resume_reading()
        assert await wait(p.lost) is None
        assert bytes(p.data) == b"queuedmoreheld"
        assert collapse(p.events) == ["made", "data", "eof", "lost"]

    arun(loop, main())


def test_read_pipe_close(loop, fds_checked):
    r, w = os.pipe()
    robj = open(r, "rb", buffering=0)

    async def main():
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), robj)
        os.write(w, b"unread")
        tr.close()
        assert tr.is_closing() and not tr.is_reading()
        assert p.events == ["made"]
        assert await wait(p.lost) is None
        assert p.events == ["made", "lost"]  # no data, no eof after close()
        assert robj.closed
        with pytest.raises(BrokenPipeError):
            os.write(w, b"x")
        tr.close()
        tr.pause_reading()
        tr.resume_reading()
        assert not tr.is_reading()
        os.close(w)

    arun(loop, main())


def test_read_pipe_close_while_paused(loop, fds_checked):
    r, w = os.pipe()

    async def main():
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), open(r, "rb", buffering=0))
        tr.pause_reading()
        tr.close()
        assert await wait(p.lost) is None
        assert p.events == ["made", "lost"]
        os.close(w)

    arun(loop, main())


def test_read_pipe_exception_in_data_received(loop, fds_checked):
    r, w = os.pipe()
    boom = KeyError("boom")

    def on_data(p, data):
        if data.startswith(b"bad"):
            raise boom

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_read_pipe(
            lambda: Recorder(loop, on_data=on_data), open(r, "rb", buffering=0))
        os.write(w, b"bad")
        await wait_until(lambda: calls)
        assert calls[0]["exception"] is boom
        assert not tr.is_closing()
        os.write(w, b"good")
        await p.wait_bytes(7)
        os.close(w)
        assert await wait(p.lost) is None
        assert len(calls) == 1

    arun(loop, main())


def test_read_pipe_set_protocol(loop, fds_checked):
    r, w = os.pipe()

    async def main():
        tr, p = await loop.connect_read_pipe(lambda: Recorder(loop), open(r, "rb", buffering=0))
        p2 = Recorder(loop)
        tr.set_protocol(p2)
        assert tr.get_protocol() is p2
        os.write(w, b"to-p2")
        os.close(w)
        assert await wait(p2.lost) is None
        assert collapse(p2.events) == ["data", "eof", "lost"]
        assert bytes(p2.data) == b"to-p2" and p.events == ["made"]

    arun(loop, main())


# ================================================================ rejected


@pytest.mark.parametrize("which", ["read", "write"])
def test_regular_file_rejected(loop, tmp_path, which, fds_checked):
    path = tmp_path / "regular"
    path.write_bytes(b"data")
    f = open(path, "rb" if which == "read" else "r+b", buffering=0)
    made = []

    async def main():
        connect = loop.connect_read_pipe if which == "read" else loop.connect_write_pipe
        with pytest.raises(ValueError):
            await connect(lambda: made.append(Recorder(loop)) or made[-1], f)
        await asyncio.sleep(0.01)

    try:
        arun(loop, main())
        assert not f.closed and os.get_blocking(f.fileno())  # left as it was
        assert all(p.events == [] for p in made)
    finally:
        f.close()
    gc.collect()


@pytest.mark.parametrize("which", ["read", "write"])
def test_directory_rejected(loop, tmp_path, which, fds_checked):
    fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        connect = loop.connect_read_pipe if which == "read" else loop.connect_write_pipe
        with pytest.raises(ValueError):
            arun(loop, connect(lambda: Recorder(loop), FileNo(fd)))
    finally:
        os.close(fd)
    gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("which", ["read", "write"])
def test_plain_int_fd_is_not_a_pipe_object(loop, which, fds_checked):
    """The stock loop needs a file-like object (it calls pipe.fileno())."""
    r, w = os.pipe()
    fd, other = (r, w) if which == "read" else (w, r)
    try:
        connect = loop.connect_read_pipe if which == "read" else loop.connect_write_pipe
        with pytest.raises(AttributeError):
            arun(loop, connect(lambda: Recorder(loop), fd))
    finally:
        os.close(other)
        try:
            os.close(fd)
        except OSError:
            pass
        gc.collect()


# ================================================================ write pipes


def test_write_pipe_basic(loop, fds_checked):
    r, w = os.pipe()
    wobj = open(w, "wb", buffering=0)

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), wobj)
        assert p.events == ["made"] and tr.get_extra_info("pipe") is wobj
        assert not os.get_blocking(w)
        assert tr.can_write_eof() and not tr.is_closing()
        assert tr.get_write_buffer_size() == 0
        assert tr.get_write_buffer_limits() == (16 * 1024, 64 * 1024)
        tr.write(b"one,")
        tr.write(bytearray(b"two,"))
        tr.write(memoryview(b"xthree,x")[1:-1])
        tr.write(b"")
        tr.writelines([b"four,", bytearray(b"five,"), memoryview(b"six")])
        assert tr.get_write_buffer_size() == 0  # all went straight out
        tr.close()
        assert tr.is_closing()
        assert await wait(p.lost) is None
        assert wobj.closed
        assert p.events == ["made", "lost"]

    arun(loop, main())
    assert read_all(r) == b"one,two,three,four,five,six"
    os.close(r)


def test_write_pipe_write_eof(loop, fds_checked):
    r, w = os.pipe()

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.write(b"before eof")
        tr.write_eof()
        assert tr.is_closing()
        tr.write_eof()
        tr.close()
        assert await wait(p.lost) is None
        assert p.events == ["made", "lost"]

    arun(loop, main())
    assert read_all(r) == b"before eof"
    os.close(r)


def test_write_pipe_non_bytes(loop, fds_checked):
    if sys.flags.optimize:
        pytest.skip("the stock check is an assert")
    r, w = os.pipe()

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        for bad in ("text", 1, None, [b"x"]):
            with pytest.raises(AssertionError):
                tr.write(bad)
        with pytest.raises((AssertionError, TypeError)):
            tr.writelines(["text"])
        assert not tr.is_closing()
        tr.write(b"ok")
        tr.close()
        await wait(p.lost)

    arun(loop, main())
    assert read_all(r) == b"ok"
    os.close(r)


def test_write_non_contiguous_buffer(loop, fds_checked):
    """A non-contiguous memoryview: the stock loop's os.write() raises
    BufferError inside write(), which is a fatal write error (handler called,
    connection_lost(BufferError)); write() itself does not raise."""
    r, w = os.pipe()

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        try:
            tr.write(memoryview(b"abcdef")[::2])
            exc = await wait(p.lost, 1.0)
            assert isinstance(exc, BufferError), repr(exc)
            assert [c["message"] for c in calls] == ["Fatal write error on pipe transport"]
            assert calls[0]["exception"] is exc
        finally:
            if not p.lost.done():
                tr.abort()
            await asyncio.sleep(0.01)

    try:
        arun(loop, main())
    finally:
        os.close(r)


def test_buffered_memoryview_of_bytearray_is_copied(loop, fds_checked):
    r, w = os.pipe()

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.write(b"x" * (1 << 17))
        assert tr.get_write_buffer_size() > 0
        ba = bytearray(b"original")
        tr.write(memoryview(ba))
        ba[:] = b"mutated!"
        ba2 = bytearray(b"+second")
        tr.write(ba2)
        ba2.extend(b" and more")
        tr.close()
        reader = loop.run_in_executor(None, read_all, r)
        data = await wait(reader)
        await wait(p.lost)
        assert data == b"x" * (1 << 17) + b"original+second"

    arun(loop, main())
    os.close(r)


def test_write_pipe_flow_control(loop, fds_checked):
    """The reader does not read: the pipe fills, writes are buffered,
    pause_writing() at the high-water mark; the reader drains it:
    resume_writing() and every byte arrives in order."""
    r, w = os.pipe()
    chunk = bytes(range(256)) * 256   # 64 KiB
    n_chunks = 64

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.set_write_buffer_limits(high=256 * 1024, low=32 * 1024)
        assert tr.get_write_buffer_limits() == (32 * 1024, 256 * 1024)
        for i in range(n_chunks):
            tr.write(chunk)
        # the pipe holds 64 KiB; the rest is buffered
        assert tr.get_write_buffer_size() > 256 * 1024
        assert tr.get_write_buffer_size() <= n_chunks * len(chunk)
        assert p.events == ["made", "pause"]
        await asyncio.sleep(0.05)
        assert p.events == ["made", "pause"]
        # mutating a buffered bytearray does not change what is sent
        ba = bytearray(b"[tail]")
        tr.write(ba)
        ba[:] = b"XXXXXX"
        reader = loop.run_in_executor(None, read_all, r)
        await wait(p.resumed)
        assert p.events == ["made", "pause", "resume"]
        await wait_until(lambda: tr.get_write_buffer_size() == 0)
        tr.close()
        assert await wait(p.lost) is None
        data = await wait(reader)
        assert data == chunk * n_chunks + b"[tail]"
        assert p.events == ["made", "pause", "resume", "lost"]

    arun(loop, main())
    os.close(r)


def test_write_pipe_close_flushes_buffer(loop, fds_checked):
    r, w = os.pipe()
    payload = os.urandom(1 << 20)

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.write(payload)
        assert tr.get_write_buffer_size() > 0
        tr.close()
        assert tr.is_closing()
        tr.write(b"dropped after close")
        await asyncio.sleep(0.05)
        assert "lost" not in p.events  # waits for the buffer
        reader = loop.run_in_executor(None, read_all, r)
        assert await wait(p.lost) is None
        assert await wait(reader) == payload
        assert collapse(p.events) in (["made", "pause", "lost"],
                                      ["made", "pause", "resume", "lost"])

    arun(loop, main())
    os.close(r)


def test_write_pipe_abort_drops_buffer(loop, fds_checked):
    r, w = os.pipe()
    payload = os.urandom(1 << 20)

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.write(payload)
        assert tr.get_write_buffer_size() > 0
        tr.abort()
        assert tr.is_closing()
        assert await wait(p.lost) is None
        assert tr.get_write_buffer_size() == 0
        assert p.events == ["made", "pause", "lost"]

    arun(loop, main())
    got = read_all(r)
    assert 0 < len(got) < len(payload) and payload.startswith(got)
    os.close(r)


def test_write_pipe_reader_closed_idle(loop, fds_checked):
    """The read end closes while nothing is buffered: connection_lost(None)."""
    r, w = os.pipe()

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.write(b"read-before-close")
        assert os.read(r, 100) == b"read-before-close"
        os.close(r)
        assert await wait(p.lost) is None
        assert tr.is_closing()
        assert p.events == ["made", "lost"] and calls == []

    arun(loop, main())


def test_write_pipe_reader_closed_with_buffer(loop, fds_checked):
    """The read end closes while data is buffered: connection_lost gets a
    BrokenPipeError; the handler is not called (an OSError)."""
    r, w = os.pipe()

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.write(b"x" * (1 << 20))
        assert tr.get_write_buffer_size() > 0
        await asyncio.sleep(0.01)
        os.close(r)
        exc = await wait(p.lost)
        assert isinstance(exc, BrokenPipeError), repr(exc)
        assert p.events == ["made", "pause", "lost"]
        assert calls == []

    arun(loop, main())


def test_write_into_closed_pipe_then_more_writes(loop, caplog, fds_checked):
    """write() right after the read end closed (before the loop noticed):
    EPIPE is fatal (connection_lost(BrokenPipeError), not reported to the
    handler); later writes are counted and, from the 5th on, logged."""
    r, w = os.pipe()

    async def main():
        calls = handler_calls(loop)
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        os.close(r)
        tr.write(b"doomed")
        assert tr.is_closing()
        exc = await wait(p.lost)
        assert isinstance(exc, BrokenPipeError), repr(exc)
        assert calls == []
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for i in range(7):
                tr.write(b"more")
                n = sum(r.getMessage() == "pipe closed by peer or os.write(pipe, data) "
                        "raised exception." for r in caplog.records)
                assert n == max(0, i - 3), (i, n)
        assert p.events == ["made", "lost"]

    arun(loop, main())


def test_writes_after_close_counted(loop, caplog, fds_checked):
    r, w = os.pipe()

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        tr.close()
        await wait(p.lost)
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for i in range(8):
                tr.write(b"late")
                n = sum(r.getMessage() == "pipe closed by peer or os.write(pipe, data) "
                        "raised exception." for r in caplog.records)
                assert n == max(0, i - 4), (i, n)

    arun(loop, main())
    assert read_all(r) == b""
    os.close(r)


def test_write_pipe_fifo(loop, tmp_path, fds_checked):
    path = str(tmp_path / "fifo")
    os.mkfifo(path)
    rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(path, os.O_WRONLY)

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(wfd, "wb", buffering=0))
        tr.write(b"into the fifo")
        await asyncio.sleep(0.01)
        assert os.read(rfd, 100) == b"into the fifo"
        os.close(rfd)   # the reader goes away: noticed (FIFOs are watched)
        assert await wait(p.lost) is None
        assert p.events == ["made", "lost"]

    arun(loop, main())


def test_write_pipe_socket(loop, fds_checked):
    a, b = socket.socketpair()

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), a)
        assert tr.get_extra_info("pipe") is a
        tr.write(b"over a socket")
        await asyncio.sleep(0.01)
        assert b.recv(100) == b"over a socket"
        b.close()
        assert await wait(p.lost) is None
        assert p.events == ["made", "lost"]
        assert a.fileno() == -1

    arun(loop, main())


def test_write_pipe_dev_null(loop, fds_checked):
    """A character device: accepted; writes go straight through."""
    f = open(os.devnull, "wb", buffering=0)

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), f)
        for _ in range(100):
            tr.write(b"z" * 65536)
        assert tr.get_write_buffer_size() == 0
        assert p.events == ["made"]
        tr.close()
        assert await wait(p.lost) is None
        assert f.closed

    arun(loop, main())


def test_write_pipe_pty(loop, fds_checked):
    master, slave = os.openpty()
    import tty
    tty.setraw(slave)

    async def main():
        tr, p = await loop.connect_write_pipe(lambda: Recorder(loop), open(slave, "wb", buffering=0))
        tr.write(b"to the master")
        got = b""
        while len(got) < 13:
            got += await loop.run_in_executor(None, os.read, master, 100)
        assert got == b"to the master"
        tr.close()
        assert await wait(p.lost) is None

    arun(loop, main())
    os.close(master)


def test_read_and_write_pipes_together(loop, fds_checked):
    """A write pipe feeding a read pipe on the same loop, 8 MiB, flow
    controlled on the write side."""
    r, w = os.pipe()
    payload = os.urandom(8 << 20)

    async def main():
        rtr, rp = await loop.connect_read_pipe(lambda: Recorder(loop), open(r, "rb", buffering=0))
        wtr, wp = await loop.connect_write_pipe(lambda: Recorder(loop), open(w, "wb", buffering=0))
        view = memoryview(payload)
        for i in range(0, len(payload), 1 << 16):
            wtr.write(view[i:i + (1 << 16)])
            if wtr.get_write_buffer_size() > 1 << 20:
                await wait_until(lambda: wtr.get_write_buffer_size() < 1 << 18, interval=0.001)
        wtr.close()
        assert await wait(wp.lost) is None
        assert await wait(rp.lost) is None
        assert bytes(rp.data) == payload
        assert collapse(rp.events) == ["made", "data", "eof", "lost"]

    arun(loop, main(), timeout=25 * SLOW)


# ================================================================ lifecycle


def test_pipes_unclosed_when_loop_closes(new_loop):
    loop = new_loop()
    before = open_fds()
    r, w = os.pipe()
    r2, w2 = os.pipe()
    events = []

    async def main():
        rtr, rp = await loop.connect_read_pipe(lambda: Recorder(loop), open(r, "rb", buffering=0))
        wtr, wp = await loop.connect_write_pipe(lambda: Recorder(loop), open(w2, "wb", buffering=0))
        events.extend([rp.events, wp.events])
        return rtr, wtr

    rtr, wtr = loop.run_until_complete(main())
    loop.close()
    os.write(w, b"late")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del rtr, wtr
        for _ in range(3):
            gc.collect()
    msgs = [str(x.message) for x in caught if issubclass(x.category, ResourceWarning)]
    assert sum("unclosed transport" in m for m in msgs) == 2, msgs
    assert events == [["made"], ["made"]]
    os.close(w)
    os.close(r2)
    fd_leak_check(before, collect=True)


def test_connect_cancelled_closes_transport(loop, fds_checked):
    """Cancelling connect_read_pipe() while it waits for connection_made:
    the pipe is closed for us."""
    r, w = os.pipe()
    robj = open(r, "rb", buffering=0)

    async def main():
        made = []
        task = loop.create_task(loop.connect_read_pipe(
            lambda: made.append(Recorder(loop)) or made[-1], robj))
        for _ in range(20):
            await asyncio.sleep(0)
            if made:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert made
        assert await wait(made[0].lost) is None
        assert robj.closed

    arun(loop, main())
    os.close(w)
