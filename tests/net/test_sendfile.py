"""loop.sock_sendfile and loop.sendfile(transport, ...): zero-copy path on
regular files, fallback for file-likes, offsets/counts, file position,
ordering with the transport's write buffer."""
import asyncio
import hashlib
import io
import os
import socket
import threading

import pytest

from net_helpers import (
    Recorder, arun, close_server, connected_pair, wait, wait_until,
)

SIZE = 3 * 1024 * 1024 + 123


@pytest.fixture(scope="module")
def payload():
    return os.urandom(SIZE)


@pytest.fixture
def datafile(tmp_path, payload):
    p = tmp_path / "data.bin"
    p.write_bytes(payload)
    with open(p, "rb") as f:
        yield f


@pytest.fixture
def tcp_pair():
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    c = socket.create_connection(lsock.getsockname())
    s, _ = lsock.accept()
    lsock.close()
    c.setblocking(False)
    yield c, s
    c.close()
    s.close()


def reader_thread(sock, n):
    """Read n bytes (or to EOF) in a thread; returns (thread, result dict)."""
    res = {}

    def run():
        sock.settimeout(5)
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
        res["data"] = bytes(buf)

    t = threading.Thread(target=run)
    t.start()
    return t, res


# ---------------------------------------------------------------- sock_sendfile


def test_sock_sendfile_whole_file(loop, tcp_pair, datafile, payload):
    c, s = tcp_pair

    async def main():
        t, res = reader_thread(s, SIZE)
        sent = await loop.sock_sendfile(c, datafile)
        await loop.run_in_executor(None, t.join, 5)
        assert sent == SIZE
        assert res["data"] == payload
        assert datafile.tell() == SIZE
        assert loop.remove_writer(c.fileno()) is False

    arun(loop, main())


def test_sock_sendfile_offset_count(loop, tcp_pair, datafile, payload):
    c, s = tcp_pair

    async def main():
        t, res = reader_thread(s, 1000)
        sent = await loop.sock_sendfile(c, datafile, 5000, 1000)
        await loop.run_in_executor(None, t.join, 5)
        assert sent == 1000
        assert res["data"] == payload[5000:6000]
        assert datafile.tell() == 6000
        # offset only: to the end
        t, res = reader_thread(s, SIZE - 100)
        sent = await loop.sock_sendfile(c, datafile, 100)
        await loop.run_in_executor(None, t.join, 5)
        assert sent == SIZE - 100 and res["data"] == payload[100:]
        assert datafile.tell() == SIZE
        # past the end: nothing to send
        assert await loop.sock_sendfile(c, datafile, SIZE + 10) == 0

    arun(loop, main())


def test_sock_sendfile_empty_file(loop, tcp_pair, tmp_path):
    c, s = tcp_pair
    p = tmp_path / "empty"
    p.write_bytes(b"")

    async def main():
        with open(p, "rb") as f:
            assert await loop.sock_sendfile(c, f) == 0

    arun(loop, main())


def test_sock_sendfile_fallback_for_file_like(loop, tcp_pair, payload):
    c, s = tcp_pair

    async def main():
        bio = io.BytesIO(payload[:200_000])
        with pytest.raises(asyncio.SendfileNotAvailableError, match="not a regular file"):
            await loop.sock_sendfile(c, bio, fallback=False)
        assert bio.tell() == 0
        t, res = reader_thread(s, 150_000)
        sent = await loop.sock_sendfile(c, bio, 50_000)
        await loop.run_in_executor(None, t.join, 5)
        assert sent == 150_000
        assert res["data"] == payload[50_000:200_000]
        assert bio.tell() == 200_000

    arun(loop, main())


def test_sock_sendfile_argument_errors(loop, tcp_pair, datafile, tmp_path):
    c, s = tcp_pair
    (tmp_path / "t.txt").write_text("text")

    async def main():
        with open(tmp_path / "t.txt", "r") as tf:
            with pytest.raises(ValueError, match=r"^file should be opened in binary mode$"):
                await loop.sock_sendfile(c, tf)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.setblocking(False)
            with pytest.raises(ValueError, match=r"^only SOCK_STREAM type sockets are supported$"):
                await loop.sock_sendfile(u, datafile)
        with pytest.raises(ValueError, match=r"^count must be a positive integer \(got 0\)$"):
            await loop.sock_sendfile(c, datafile, 0, 0)
        with pytest.raises(TypeError, match=r"^count must be a positive integer \(got '1'\)$"):
            await loop.sock_sendfile(c, datafile, 0, "1")
        with pytest.raises(ValueError, match=r"^offset must be a non-negative integer \(got -1\)$"):
            await loop.sock_sendfile(c, datafile, -1)
        with pytest.raises(TypeError, match=r"^offset must be a non-negative integer \(got 1.5\)$"):
            await loop.sock_sendfile(c, datafile, 1.5)

    arun(loop, main())


def test_sock_sendfile_cancel(loop, tcp_pair, tmp_path):
    c, s = tcp_pair
    p = tmp_path / "big"
    p.write_bytes(b"\0" * (64 << 20))

    async def main():
        with open(p, "rb") as f:
            task = loop.create_task(loop.sock_sendfile(c, f))
            await asyncio.sleep(0.05)
            assert not task.done()  # the peer does not read
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert loop.remove_writer(c.fileno()) is False

    arun(loop, main())


# ---------------------------------------------------------------- loop.sendfile


@pytest.fixture(params=["tcp", "unix"])
def kind(request):
    return request.param


def paused_server(loop):
    return lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading())


def test_sendfile_between_writes(loop, kind, tmp_path, datafile, payload):
    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Recorder(loop), lambda: Recorder(loop), tmp_path)
        ctr.write(b"HEADER")
        sent = await loop.sendfile(ctr, datafile)
        ctr.write(b"TRAILER")
        assert sent == SIZE
        assert datafile.tell() == SIZE
        await spr.wait_bytes(SIZE + 13)
        assert bytes(spr.data) == b"HEADER" + payload + b"TRAILER"
        assert ctr.is_reading()
        # reading still works after sendfile
        spr.transport.write(b"back")
        await cpr.wait_bytes(4)
        assert bytes(cpr.data) == b"back"
        ctr.close()
        await wait(cpr.lost)
        await close_server(srv)

    arun(loop, main())


def test_sendfile_drains_write_buffer_first(loop, kind, tmp_path, datafile, payload):
    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Recorder(loop), paused_server(loop), tmp_path)
        head = os.urandom(6 << 20)
        ctr.write(head)
        assert ctr.get_write_buffer_size() > 0
        task = loop.create_task(loop.sendfile(ctr, datafile, 10, 100_000))
        await asyncio.sleep(0.05)
        assert not task.done()
        # a write while sendfile is in progress is refused
        with pytest.raises(RuntimeError, match=r"^unable to write; sendfile is in progress$"):
            ctr.write(b"nope")
        spr.transport.resume_reading()
        assert await wait(task) == 100_000
        assert datafile.tell() == 100_010
        ctr.write(b"END")
        await spr.wait_bytes(len(head) + 100_003)
        assert bytes(spr.data) == head + payload[10:100_010] + b"END"
        ctr.close()
        await wait(cpr.lost)
        await close_server(srv)

    arun(loop, main())


def test_sendfile_fallback_for_file_like(loop, kind, tmp_path, payload):
    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Recorder(loop), lambda: Recorder(loop), tmp_path)
        bio = io.BytesIO(payload)
        with pytest.raises(asyncio.SendfileNotAvailableError):
            await loop.sendfile(ctr, bio, fallback=False)
        sent = await loop.sendfile(ctr, bio, 1000, 500_000)
        assert sent == 500_000
        assert bio.tell() == 501_000
        await spr.wait_bytes(500_000)
        assert bytes(spr.data) == payload[1000:501_000]
        # the original protocol is back in place afterwards
        assert ctr.get_protocol() is cpr
        spr.transport.write(b"back")
        await cpr.wait_bytes(4)
        ctr.close()
        await wait(cpr.lost)
        assert cpr.events[0] == "made" and cpr.events[-1] == "lost"
        await close_server(srv)

    arun(loop, main())


def test_sendfile_on_closing_transport(loop, kind, tmp_path, datafile):
    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, kind, lambda: Recorder(loop), lambda: Recorder(loop), tmp_path)
        ctr.close()
        with pytest.raises(RuntimeError, match=r"^Transport is closing$"):
            await loop.sendfile(ctr, datafile)
        await wait(cpr.lost)
        await close_server(srv)

    arun(loop, main())


def test_sendfile_large_checksum(loop, tmp_path):
    size = 64 << 20
    p = tmp_path / "large.bin"
    block = os.urandom(1 << 20)
    with open(p, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
    expect = hashlib.sha256(block * (size // len(block))).hexdigest()

    class Hash(Recorder):
        def __init__(self):
            super().__init__(loop)
            self.h = hashlib.sha256()
            self.n = 0

        def data_received(self, data):
            self.h.update(data)
            self.n += len(data)

    async def main():
        srv, ctr, cpr, spr = await connected_pair(
            loop, "tcp", lambda: Recorder(loop), Hash, tmp_path)
        with open(p, "rb") as f:
            assert await loop.sendfile(ctr, f) == size
        ctr.write_eof()
        await wait(spr.eof, 10)
        assert spr.n == size and spr.h.hexdigest() == expect
        ctr.close()
        await close_server(srv)

    arun(loop, main(), timeout=20)
