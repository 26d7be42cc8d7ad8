"""create_unix_server / create_unix_connection: paths, abstract names,
stale socket cleanup, sock=, errors."""
import asyncio
import errno
import os
import pathlib
import socket
import sys

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, fd_leak_check, open_fds,
    raw_client, wait, wait_until,
)


async def echo_via_loop(loop, path, msg=b"unix-ping"):
    tr, pr = await loop.create_unix_connection(lambda: Recorder(loop), path)
    tr.write(msg)
    await pr.wait_bytes(len(msg))
    tr.close()
    await wait(pr.lost)
    return bytes(pr.data)


# 3.13+: a Unix server removes its socket file when it closes (cleanup_socket).
UNIX_SERVER_CLEANUP = sys.version_info >= (3, 13)


def test_path_server_and_connection(loop, tmp_path):
    path = str(tmp_path / "srv.sock")

    async def main():
        accepted = []
        srv = await loop.create_unix_server(lambda: Recorder(loop, on_made=accepted.append), path)
        assert srv.is_serving()
        assert os.path.exists(path)
        (s,) = srv.sockets
        assert s.family == socket.AF_UNIX and s.getsockname() == path
        tr, pr = await loop.create_unix_connection(lambda: Recorder(loop), path)
        assert pr.events == ["made"]
        await wait_until(lambda: accepted)
        sp = accepted[0]
        assert tr.get_extra_info("peername") == path
        assert tr.get_extra_info("sockname") == ""
        assert sp.transport.get_extra_info("sockname") == path
        assert sp.transport.get_extra_info("peername") == ""
        assert tr.can_write_eof() and sp.transport.can_write_eof()
        tr.write(b"hello")
        tr.write_eof()
        await wait(sp.lost)
        assert sp.events == ["made", "data", "eof", "lost"]
        assert bytes(sp.data) == b"hello"
        await wait(pr.lost)
        assert pr.events == ["made", "eof", "lost"]
        await close_server(srv)
        # 3.11-3.12 leave the socket file behind after close(); 3.13+ remove
        # it (create_unix_server(cleanup_socket=True), the default)
        assert os.path.exists(path) != UNIX_SERVER_CLEANUP

    arun(loop, main())


def test_pathlike_path(loop, tmp_path):
    path = tmp_path / "p.sock"

    async def main():
        srv = await loop.create_unix_server(EchoProtocol, path)
        assert srv.sockets[0].getsockname() == str(path)
        assert await echo_via_loop(loop, path) == b"unix-ping"
        await close_server(srv)

    arun(loop, main())


def test_abstract_name(loop):
    name = "\0tideloop-abstract-%d-%d" % (os.getpid(), id(loop))

    async def main():
        srv = await loop.create_unix_server(EchoProtocol, name)
        sockname = srv.sockets[0].getsockname()
        assert sockname in (name, name.encode())
        assert await echo_via_loop(loop, name) == b"unix-ping"
        tr, pr = await loop.create_unix_connection(lambda: Recorder(loop), name)
        assert tr.get_extra_info("peername") == tr.get_extra_info("socket").getpeername()
        tr.close()
        await wait(pr.lost)
        await close_server(srv)
        # the name is released with the socket
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(name)

    arun(loop, main())


def test_stale_socket_file_is_replaced(loop, tmp_path):
    path = str(tmp_path / "stale.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # leaves the file, nobody listening
    assert os.path.exists(path)

    async def main():
        srv = await loop.create_unix_server(EchoProtocol, path)
        assert await echo_via_loop(loop, path) == b"unix-ping"
        await close_server(srv)

    arun(loop, main())


def test_live_socket_file_is_replaced_too(loop, tmp_path):
    """asyncio removes any socket file at the path (it does not probe it):
    a second server takes over the path."""
    path = str(tmp_path / "live.sock")

    async def main():
        first, second = [], []
        a = await loop.create_unix_server(lambda: Recorder(loop, on_made=first.append), path)
        b = await loop.create_unix_server(lambda: Recorder(loop, on_made=second.append), path)
        c = raw_client("unix", path)
        await wait_until(lambda: second)
        assert first == []
        c.close()
        await wait(second[0].lost)
        await close_server(a)
        await close_server(b)

    arun(loop, main())


def test_regular_file_at_path(loop, tmp_path):
    path = str(tmp_path / "not-a-socket")
    pathlib.Path(path).write_text("keep me")

    async def main():
        before = open_fds()
        with pytest.raises(OSError) as ei:
            await loop.create_unix_server(EchoProtocol, path)
        assert ei.value.errno == errno.EADDRINUSE
        assert str(ei.value) == f"[Errno {errno.EADDRINUSE}] Address {path!r} is already in use"
        assert pathlib.Path(path).read_text() == "keep me"
        fd_leak_check(before)

    arun(loop, main())


def test_existing_sock(loop, tmp_path):
    path = str(tmp_path / "own.sock")

    async def main():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        srv = await loop.create_unix_server(EchoProtocol, sock=sock)
        assert srv.sockets[0].fileno() == sock.fileno()
        assert sock.getblocking() is False
        assert await echo_via_loop(loop, path) == b"unix-ping"
        # create_unix_connection with sock=
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(path)
        tr, pr = await loop.create_unix_connection(lambda: Recorder(loop), sock=c)
        assert c.getblocking() is False
        assert tr.get_extra_info("socket").fileno() == c.fileno()
        tr.write(b"via-sock")
        await pr.wait_bytes(8)
        assert bytes(pr.data) == b"via-sock"
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_argument_errors(loop, tmp_path):
    async def main():
        with socket.socket(socket.AF_UNIX) as s:
            with pytest.raises(ValueError, match=r"^path and sock can not be specified at the same time$"):
                await loop.create_unix_server(EchoProtocol, str(tmp_path / "x"), sock=s)
            with pytest.raises(ValueError, match=r"^path and sock can not be specified at the same time$"):
                await loop.create_unix_connection(EchoProtocol, str(tmp_path / "x"), sock=s)
        with pytest.raises(ValueError, match=r"^path was not specified, and no sock specified$"):
            await loop.create_unix_server(EchoProtocol)
        with pytest.raises(ValueError, match=r"^no path and sock were specified$"):
            await loop.create_unix_connection(EchoProtocol)
        for fam, typ in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_DGRAM)):
            with socket.socket(fam, typ) as bad:
                with pytest.raises(ValueError, match=r"^A UNIX Domain Stream Socket was expected, got "):
                    await loop.create_unix_server(EchoProtocol, sock=bad)
                with pytest.raises(ValueError, match=r"^A UNIX Domain Stream Socket was expected, got "):
                    await loop.create_unix_connection(EchoProtocol, sock=bad)
        with pytest.raises(TypeError, match=r"^ssl argument must be an SSLContext or None$"):
            await loop.create_unix_server(EchoProtocol, str(tmp_path / "y"), ssl=True)
        with pytest.raises(ValueError, match=r"^server_hostname is only meaningful with ssl$"):
            await loop.create_unix_connection(EchoProtocol, str(tmp_path / "y"),
                                              server_hostname="h")

    arun(loop, main())


def test_connect_errors(loop, tmp_path):
    async def main():
        before = open_fds()
        missing = str(tmp_path / "missing.sock")
        with pytest.raises(FileNotFoundError):
            await loop.create_unix_connection(EchoProtocol, missing)
        dead = str(tmp_path / "dead.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(dead)  # bound, never listening
        try:
            with pytest.raises(ConnectionRefusedError):
                await loop.create_unix_connection(EchoProtocol, dead)
        finally:
            s.close()
        fd_leak_check(before)

    arun(loop, main())


def test_start_serving_false(loop, tmp_path):
    path = str(tmp_path / "later.sock")

    async def main():
        made = []
        srv = await loop.create_unix_server(lambda: Recorder(loop, on_made=made.append),
                                            path, start_serving=False)
        assert not srv.is_serving()
        with pytest.raises(ConnectionRefusedError):
            raw_client("unix", path)
        await srv.start_serving()
        assert srv.is_serving()
        c = raw_client("unix", path)
        await wait_until(lambda: made)
        c.close()
        await wait(made[0].lost)
        await close_server(srv)

    arun(loop, main())


def test_server_close_and_many_clients(loop, tmp_path):
    path = str(tmp_path / "many.sock")

    async def main():
        srv = await loop.create_unix_server(EchoProtocol, path)
        got = await asyncio.gather(*(echo_via_loop(loop, path, b"m%03d" % i) for i in range(50)))
        assert got == [b"m%03d" % i for i in range(50)]
        srv.close()
        assert srv.sockets == ()
        # the path is gone on 3.13+ (cleanup_socket), refuses before
        with pytest.raises(FileNotFoundError if UNIX_SERVER_CLEANUP
                           else ConnectionRefusedError):
            raw_client("unix", path)
        await srv.wait_closed()

    arun(loop, main())
