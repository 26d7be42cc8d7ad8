"""asyncio streams end to end on both loops: start_server / open_connection,
start_unix_server / open_unix_connection, readline, readexactly, readuntil,
drain, wait_closed; stream flow control in both directions; errors."""
import asyncio
import hashlib
import os

import pytest

from net_helpers import arun, dead_port, wait, wait_until

dead_port = dead_port  # fixture re-export


@pytest.fixture(params=["tcp", "unix"])
def kind(request):
    return request.param


async def serve(kind, handler, tmp_path, **kw):
    if kind == "tcp":
        srv = await asyncio.start_server(handler, "127.0.0.1", 0, **kw)
        return srv, srv.sockets[0].getsockname()
    path = str(tmp_path / "streams.sock")
    srv = await asyncio.start_unix_server(handler, path, **kw)
    return srv, path


async def open_conn(kind, addr, **kw):
    if kind == "tcp":
        return await asyncio.open_connection(*addr, **kw)
    return await asyncio.open_unix_connection(addr, **kw)


def test_line_protocol_end_to_end(loop, kind, tmp_path):
    log = []

    async def handler(reader, writer):
        log.append(("peer", writer.get_extra_info("peername")))
        while True:
            line = await reader.readline()
            if not line:
                break
            writer.write(line.upper())
            await writer.drain()
        assert reader.at_eof()
        writer.write(b"BYE\r\n")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        log.append("server done")

    async def main():
        srv, addr = await serve(kind, handler, tmp_path)
        reader, writer = await open_conn(kind, addr)
        assert writer.get_extra_info("peername") == addr
        writer.write(b"hello\n")
        await writer.drain()
        assert await reader.readline() == b"HELLO\n"
        writer.writelines([b"ab", b"cd\n", b"xyz\n"])
        await writer.drain()
        assert await reader.readexactly(5) == b"ABCD\n"
        assert await reader.readuntil(b"Z\n") == b"XYZ\n"
        assert writer.can_write_eof()
        writer.write_eof()
        assert await reader.readuntil(b"\r\n") == b"BYE\r\n"
        assert await reader.read() == b""
        assert reader.at_eof()
        writer.close()
        assert writer.is_closing()
        await wait(writer.wait_closed())
        await wait_until(lambda: "server done" in log)
        srv.close()
        await srv.wait_closed()

    arun(loop, main())


def test_incomplete_read_and_limits(loop, kind, tmp_path):
    async def handler(reader, writer):
        writer.write(b"12345")
        writer.write_eof()
        await reader.read()
        writer.close()

    async def main():
        srv, addr = await serve(kind, handler, tmp_path)
        reader, writer = await open_conn(kind, addr)
        with pytest.raises(asyncio.IncompleteReadError) as ei:
            await reader.readexactly(10)
        assert ei.value.partial == b"12345" and ei.value.expected == 10
        writer.close()
        await writer.wait_closed()
        srv.close()
        await srv.wait_closed()

    arun(loop, main())


def test_drain_waits_for_slow_reader(loop, kind, tmp_path):
    go = asyncio.Event()
    received = []

    async def handler(reader, writer):
        await go.wait()
        n = 0
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            n += len(chunk)
        received.append(n)
        writer.close()

    async def main():
        srv, addr = await serve(kind, handler, tmp_path)
        reader, writer = await open_conn(kind, addr)
        total = 16 << 20
        writer.write(b"d" * total)
        drain = loop.create_task(writer.drain())
        await asyncio.sleep(0.1)
        assert not drain.done()  # paused: the peer is not reading
        assert writer.transport.get_write_buffer_size() > 0
        go.set()
        await wait(drain)
        writer.write_eof()
        await wait_until(lambda: received)
        assert received == [total]
        writer.close()
        await writer.wait_closed()
        srv.close()
        await srv.wait_closed()

    arun(loop, main())


def test_reader_limit_pauses_transport(loop, kind, tmp_path):
    states = []
    proceed = asyncio.Event()

    async def handler(reader, writer):
        await proceed.wait()
        states.append(writer.transport.is_reading())
        data = await reader.read(-1)
        states.append(len(data))
        writer.close()

    async def main():
        srv, addr = await serve(kind, handler, tmp_path, limit=4096)
        reader, writer = await open_conn(kind, addr)
        writer.write(b"L" * (1 << 20))
        await asyncio.sleep(0.1)
        proceed.set()
        await wait(writer.drain())
        writer.write_eof()
        await wait_until(lambda: len(states) == 2)
        # the StreamReader paused the transport over 2*limit buffered bytes
        assert states == [False, 1 << 20]
        writer.close()
        await writer.wait_closed()
        srv.close()
        await srv.wait_closed()

    arun(loop, main())


def test_large_transfer_through_streams(loop, kind, tmp_path):
    total = 64 << 20
    block = os.urandom(1 << 20)
    expect = hashlib.sha256(block * (total // len(block))).hexdigest()

    async def handler(reader, writer):
        while True:
            chunk = await reader.read(1 << 18)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
        writer.write_eof()
        writer.close()

    async def main():
        srv, addr = await serve(kind, handler, tmp_path)
        reader, writer = await open_conn(kind, addr)

        async def send():
            for _ in range(total // len(block)):
                writer.write(block)
                await writer.drain()
            writer.write_eof()

        async def recv():
            h = hashlib.sha256()
            n = 0
            while True:
                chunk = await reader.read(1 << 18)
                if not chunk:
                    break
                h.update(chunk)
                n += len(chunk)
            return n, h.hexdigest()

        _, (n, digest) = await asyncio.gather(send(), recv())
        assert n == total and digest == expect
        writer.close()
        await writer.wait_closed()
        srv.close()
        await srv.wait_closed()

    arun(loop, main(), timeout=20)


def test_reset_surfaces_in_reader(loop):
    import socket, struct

    async def handler(reader, writer):
        await reader.readexactly(1)
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # closes with linger 0: RST

    async def main():
        srv, addr = await serve("tcp", handler, None)
        reader, writer = await open_conn("tcp", addr)
        writer.write(b"x")
        with pytest.raises(ConnectionResetError):
            await wait(reader.read())
        assert writer.is_closing()
        writer.close()
        with pytest.raises(ConnectionResetError):
            await wait(writer.wait_closed())
        srv.close()
        await srv.wait_closed()

    arun(loop, main())


def test_open_connection_refused(loop, dead_port):
    async def main():
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", dead_port)

    arun(loop, main())


def test_open_unix_connection_missing(loop, tmp_path):
    async def main():
        with pytest.raises(FileNotFoundError):
            await asyncio.open_unix_connection(str(tmp_path / "nope.sock"))

    arun(loop, main())


def test_server_serve_forever_and_async_with(loop, kind, tmp_path):
    async def handler(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    async def main():
        srv, addr = await serve(kind, handler, tmp_path, start_serving=False)
        async with srv:
            task = loop.create_task(srv.serve_forever())
            await asyncio.sleep(0)
            assert srv.is_serving()
            reader, writer = await open_conn(kind, addr)
            writer.write(b"line\n")
            assert await reader.readline() == b"line\n"
            assert await reader.read() == b""
            writer.close()
            await writer.wait_closed()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert not srv.is_serving()

    arun(loop, main())
