"""asyncio streams' C data path: every behaviour a program can see is the
stock loop's.

Each test runs on stock asyncio, on tideloop with the C path of asyncio
streams (``tideloop-c``) and on tideloop with it off (``tideloop-python``),
through the ``streams_path`` fixture.  The objects are asyncio's own;
reads, errors, cancellation, flow control, drain and closing agree.  On
tideloop-c the tests also check that the C path really ran (the core's
counts, the methods in the instances' __dict__), and that subclasses,
replaced methods and custom protocols did not get it.
"""
import asyncio
import contextlib
import gc
import socket
import sys
import sysconfig
import warnings
import weakref

import pytest

from net_helpers import arun, wait, wait_until

pytestmark = pytest.mark.usefixtures("streams_path")

LIMIT = 64


def core_stats():
    from tideloop import _core
    return _core.streams_stats()


def is_c(obj, name):
    """Is obj.name tideloop's C method (in the instance's __dict__)?"""
    return type(vars(obj).get(name)).__name__ == "StreamMethod"


async def stream_pair(limit=LIMIT):
    """A StreamReader/StreamWriter pair over one end of a socket pair
    (open_connection(sock=)), and the other end as a plain blocking socket."""
    a, b = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=a, limit=limit)
    b.settimeout(5)
    return reader, writer, b


async def settle(reader, total):
    """Wait until the reader's buffer holds total bytes, then let woken
    tasks run."""
    await wait_until(lambda: len(reader._buffer) >= total)
    for _ in range(5):
        await asyncio.sleep(0)


async def closing(writer, peer):
    writer.close()
    peer.close()
    with contextlib.suppress(ConnectionError):
        await wait(writer.wait_closed())


def test_objects_stay_asyncio_s(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        assert type(reader) is asyncio.StreamReader and isinstance(reader, asyncio.StreamReader)
        assert type(writer) is asyncio.StreamWriter
        assert isinstance(reader._buffer, bytearray) and reader._limit == LIMIT
        assert reader._eof is False and reader._exception is None and reader._paused is False
        assert reader._transport is writer.transport and reader._waiter is None
        if streams_path == "c":
            for name in ("read", "readline", "readexactly", "readuntil"):
                assert is_c(reader, name), name
                assert getattr(reader, name).__func__ is getattr(asyncio.StreamReader, name)
                assert getattr(reader, name).__self__ is reader
            # drain()'s wait is the protocol's: found through the transport,
            # whoever made the writer, which keeps asyncio's own methods
            helper = writer._protocol._drain_helper
            assert is_c(writer._protocol, "_drain_helper")
            assert helper.__func__ is asyncio.StreamReaderProtocol._drain_helper
            assert helper.__self__ is writer._protocol
        else:
            assert "read" not in vars(reader) and "_drain_helper" not in vars(writer._protocol)
        assert not set(vars(writer)) & {"write", "writelines", "drain"}
        task = asyncio.ensure_future(reader.read(10))
        await wait_until(lambda: reader._waiter is not None)
        assert isinstance(reader._waiter, asyncio.Future) and not reader._waiter.done()
        assert "waiter=" in repr(reader)
        peer.sendall(b"abc")
        assert await wait(task) == b"abc"
        assert reader._waiter is None and len(reader._buffer) == 0
        peer.sendall(b"xyz")
        await settle(reader, 3)
        assert bytes(reader._buffer) == b"xyz" and "3 bytes" in repr(reader)
        await closing(writer, peer)

    arun(loop, main())


def test_read_semantics(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"0123456789")
        await settle(reader, 10)
        assert await reader.read(0) == b""
        assert await reader.read(4) == b"0123"
        assert await reader.read(100) == b"456789"
        peer.sendall(b"tail")
        peer.shutdown(socket.SHUT_WR)
        assert await wait(reader.read()) == b"tail"        # read(-1): up to EOF
        assert reader.at_eof()
        assert await reader.read(5) == b"" and await reader.read() == b""
        await closing(writer, peer)

    arun(loop, main())


def test_readexactly_semantics(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        assert await reader.readexactly(0) == b""
        with pytest.raises(ValueError, match="readexactly size can not be less than zero"):
            await reader.readexactly(-1)
        task = asyncio.ensure_future(reader.readexactly(6))
        peer.sendall(b"abc")
        await settle(reader, 3)
        assert not task.done() and bytes(reader._buffer) == b"abc"
        peer.sendall(b"defgh")
        assert await wait(task) == b"abcdef"
        assert bytes(reader._buffer) == b"gh"
        peer.shutdown(socket.SHUT_WR)
        with pytest.raises(asyncio.IncompleteReadError) as info:
            await wait(reader.readexactly(5))
        assert info.value.partial == b"gh" and info.value.expected == 5
        assert len(reader._buffer) == 0 and reader.at_eof()
        await closing(writer, peer)

    arun(loop, main())


def test_readuntil_semantics(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair(limit=8)
        with pytest.raises(ValueError, match="Separator should be at least one-byte string"):
            await reader.readuntil(b"")
        peer.sendall(b"ab||cd|")
        await settle(reader, 7)
        assert await reader.readuntil(b"||") == b"ab||"
        task = asyncio.ensure_future(reader.readuntil(b"||"))
        await asyncio.sleep(0)
        peer.sendall(b"|ef")
        assert await wait(task) == b"cd||"
        # not found within the limit: consumed says how far it looked; the
        # data stays
        peer.sendall(b"0123456789")
        await settle(reader, 12)
        with pytest.raises(asyncio.LimitOverrunError) as info:
            await reader.readuntil(b"!")
        assert info.value.consumed == 12 and bytes(reader._buffer) == b"ef0123456789"
        assert "Separator is not found" in str(info.value)
        # found, but further than the limit
        peer.sendall(b"!")
        await settle(reader, 13)
        with pytest.raises(asyncio.LimitOverrunError) as info:
            await reader.readuntil(b"!")
        assert info.value.consumed == 12 and "longer than limit" in str(info.value)
        del reader._buffer[:]
        peer.sendall(b"x|y")
        peer.shutdown(socket.SHUT_WR)
        await wait_until(lambda: reader._eof)
        assert await reader.readuntil(b"|") == b"x|"
        with pytest.raises(asyncio.IncompleteReadError) as info:
            await reader.readuntil(b"|")
        assert info.value.partial == b"y" and info.value.expected is None
        await closing(writer, peer)

    arun(loop, main())


@pytest.mark.skipif(sys.version_info < (3, 13), reason="readuntil() takes a tuple from 3.13")
def test_readuntil_tuple_of_separators(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"a\r\nb\n")
        await settle(reader, 5)
        assert await reader.readuntil((b"\n", b"\r\n")) == b"a\r\n"
        assert await reader.readuntil((b"\r\n", b"\n")) == b"b\n"
        await closing(writer, peer)

    arun(loop, main())


def test_readline_semantics(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair(limit=8)
        peer.sendall(b"one\ntw")
        await settle(reader, 6)
        assert await reader.readline() == b"one\n"
        task = asyncio.ensure_future(reader.readline())
        await asyncio.sleep(0)
        peer.sendall(b"o\n")
        assert await wait(task) == b"two\n"
        # a line past the limit with its newline: the line goes, ValueError
        peer.sendall(b"0123456789\nnext\n")
        await settle(reader, 16)
        with pytest.raises(ValueError) as info:
            await reader.readline()
        assert "longer than limit" in str(info.value)
        assert isinstance(info.value.__context__, asyncio.LimitOverrunError)
        assert bytes(reader._buffer) == b"next\n"
        assert await reader.readline() == b"next\n"
        # past the limit with no newline: the buffer is cleared
        peer.sendall(b"0123456789ab")
        await settle(reader, 12)
        with pytest.raises(ValueError, match="chunk exceed the limit"):
            await reader.readline()
        assert bytes(reader._buffer) == b""
        # at EOF: the partial line, then b""
        peer.sendall(b"end")
        peer.shutdown(socket.SHUT_WR)
        assert await wait(reader.readline()) == b"end"
        assert await reader.readline() == b""
        await closing(writer, peer)

    arun(loop, main())


def test_async_iteration_reads_lines(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"a\nb\nc")
        peer.shutdown(socket.SHUT_WR)
        assert [line async for line in reader] == [b"a\n", b"b\n", b"c"]
        await closing(writer, peer)

    arun(loop, main())


def test_cancelled_read_leaves_the_data(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        for make in (lambda: reader.read(5), lambda: reader.readexactly(5),
                     lambda: reader.readuntil(b"!"), lambda: reader.readline()):
            task = asyncio.ensure_future(make())
            await wait_until(lambda: reader._waiter is not None)
            waiter = reader._waiter
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert waiter.cancelled() and reader._waiter is None
        # a read after the cancelled ones gets what arrives
        peer.sendall(b"hello!")
        assert await wait(reader.readuntil(b"!")) == b"hello!"
        # wait_for() cancels a read that takes too long, leaving no waiter
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.readexactly(3), 0.01)
        assert reader._waiter is None
        await closing(writer, peer)

    arun(loop, main())


def test_a_task_waiting_in_a_read_has_a_call_graph(loop, streams_path):
    # asyncio.capture_call_graph() (3.14+) walks the task's cr_await chain and
    # reads cr_frame on each link: a C read is a link without a frame.
    async def main():
        reader, writer, peer = await stream_pair()
        for make in (lambda: reader.read(5), lambda: reader.readexactly(5),
                     lambda: reader.readuntil(b"!"), lambda: reader.readline()):
            async def waits_in_a_read():
                return await make()
            task = asyncio.ensure_future(waits_in_a_read())
            await wait_until(lambda: reader._waiter is not None)
            graph = asyncio.capture_call_graph(task)
            assert graph.future is task
            assert "waits_in_a_read" in asyncio.format_call_graph(task)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await closing(writer, peer)

    if not hasattr(asyncio, "capture_call_graph"):
        pytest.skip("asyncio.capture_call_graph is 3.14's")
    arun(loop, main())


def test_readexactly_cancelled_midway_keeps_partial_data(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        task = asyncio.ensure_future(reader.readexactly(10))
        peer.sendall(b"12345")
        await settle(reader, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert bytes(reader._buffer) == b"12345"
        peer.sendall(b"67890")
        assert await wait(reader.readexactly(10)) == b"1234567890"
        await closing(writer, peer)

    arun(loop, main())


def test_two_readers_at_once(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        first = asyncio.ensure_future(reader.read(10))
        await wait_until(lambda: reader._waiter is not None)
        for call, name in ((reader.read(1), "read"), (reader.readexactly(2), "readexactly"),
                           (reader.readline(), "readuntil"), (reader.readuntil(b"x"), "readuntil")):
            with pytest.raises(RuntimeError, match=rf"^{name}\(\) called while another "
                                                    "coroutine is already waiting"):
                await call
        assert not first.done()
        peer.sendall(b"ok")
        assert await wait(first) == b"ok"
        await closing(writer, peer)

    arun(loop, main())


def test_exception_set_on_the_reader(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        task = asyncio.ensure_future(reader.readline())
        await wait_until(lambda: reader._waiter is not None)
        boom = ValueError("boom")
        reader.set_exception(boom)
        with pytest.raises(ValueError) as info:
            await wait(task)
        assert info.value is boom
        # later calls raise it at once; drain() too
        for make in (lambda: reader.read(1), lambda: reader.readexactly(1),
                     lambda: reader.readuntil(b"\n"), writer.drain):
            with pytest.raises(ValueError, match="boom"):
                await make()
        await closing(writer, peer)

    arun(loop, main())


def test_connection_reset_reaches_the_reader_and_drain(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        task = asyncio.ensure_future(reader.read(10))
        await wait_until(lambda: reader._waiter is not None)
        writer.transport.abort()
        assert await wait(task) == b""              # connection_lost(None): EOF
        assert reader.at_eof()
        with pytest.raises(ConnectionResetError, match="Connection lost"):
            await writer.drain()
        await wait(writer.wait_closed())
        peer.close()

    arun(loop, main())


def test_flow_control_pauses_and_resumes_reading(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair(limit=16)
        tr = writer.transport
        peer.sendall(b"x" * 40)                     # > 2 * limit
        await wait_until(lambda: reader._paused)
        assert not tr.is_reading() and len(reader._buffer) == 40
        assert await reader.readexactly(10) == b"x" * 10      # 30 left: still paused
        assert reader._paused and not tr.is_reading()
        assert await reader.read(14) == b"x" * 14             # 16 left: resumes
        assert not reader._paused and tr.is_reading()
        peer.sendall(b"y" * 40)                     # 56 buffered: paused again
        await wait_until(lambda: reader._paused)
        assert await reader.readexactly(56) == b"x" * 16 + b"y" * 40
        assert not reader._paused and tr.is_reading()
        await closing(writer, peer)

    arun(loop, main())


def test_waiting_while_paused_resumes(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair(limit=4)
        peer.sendall(b"a" * 12)
        await wait_until(lambda: reader._paused)
        task = asyncio.ensure_future(reader.readexactly(20))
        await wait_until(lambda: not reader._paused)    # _wait_for_data resumed it
        assert writer.transport.is_reading()
        peer.sendall(b"b" * 8)
        assert await wait(task) == b"a" * 12 + b"b" * 8
        await closing(writer, peer)

    arun(loop, main())


def test_drain_waits_while_the_peer_does_not_read(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        writer.transport.set_write_buffer_limits(high=1024)
        chunk = b"z" * 65536
        drained = 0
        while writer.transport.get_write_buffer_size() <= 1024:
            writer.write(chunk)
            drained += len(chunk)
        task = asyncio.ensure_future(writer.drain())
        await asyncio.sleep(0.05)
        assert not task.done()
        got = 0
        peer.setblocking(False)
        while not task.done():
            try:
                got += len(peer.recv(1 << 20))
            except BlockingIOError:
                await asyncio.sleep(0.001)
        assert await task is None
        peer.setblocking(True)
        await closing(writer, peer)

    arun(loop, main())


async def paused_writer(writer):
    """Fill the transport's buffer past a small high-water mark: the
    protocol is paused and drain() waits until the peer reads."""
    writer.transport.set_write_buffer_limits(high=1024)
    while writer.transport.get_write_buffer_size() <= 1024:
        writer.write(b"z" * 65536)


async def read_until_done(peer, tasks):
    peer.setblocking(False)
    while not all(t.done() for t in tasks):
        try:
            peer.recv(1 << 20)
        except BlockingIOError:
            await asyncio.sleep(0.001)
    peer.setblocking(True)


def test_several_drains_wait_together_and_again(loop, streams_path):
    """Drains waiting at once all finish when the peer reads, and waiting
    works again on the next pause (an idle protocol's empty waiter queue is
    a placeholder on the C path: a real one is made when a drain waits)."""
    async def main():
        reader, writer, peer = await stream_pair()
        protocol = writer._protocol
        assert len(protocol._drain_waiters) == 0 and list(protocol._drain_waiters) == []
        if streams_path == "tideloop-c":
            assert protocol._drain_waiters == ()        # no 760-byte deque while idle
        for _ in range(2):
            await paused_writer(writer)
            tasks = [asyncio.ensure_future(writer.drain()) for _ in range(3)]
            await asyncio.sleep(0.05)
            assert not any(t.done() for t in tasks)
            assert len(protocol._drain_waiters) == 3
            await read_until_done(peer, tasks)
            assert [await t for t in tasks] == [None] * 3
            assert len(protocol._drain_waiters) == 0
        await closing(writer, peer)

    arun(loop, main())


def test_drains_waiting_when_the_connection_is_lost_all_end(loop, streams_path):
    """abort(): connection_lost(None) ends every waiting drain (with None,
    as asyncio's FlowControlMixin does); a drain after that raises."""
    async def main():
        reader, writer, peer = await stream_pair()
        await paused_writer(writer)
        tasks = [asyncio.ensure_future(writer.drain()) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in tasks)
        writer.transport.abort()
        assert [await wait(t) for t in tasks] == [None, None]
        with pytest.raises(ConnectionResetError, match="Connection lost"):
            await writer.drain()
        peer.close()

    arun(loop, main())


def test_write_and_writelines_go_to_the_current_transport(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        assert writer.write(b"ab") is None
        assert writer.writelines([b"c", bytearray(b"d"), memoryview(b"e")]) is None
        await writer.drain()
        assert peer.recv(10) == b"abcde"
        with pytest.raises(TypeError):
            writer.write("text")
        writer.write_eof()
        with pytest.raises(RuntimeError, match="Cannot call write"):
            writer.write(b"x")
        await closing(writer, peer)

    arun(loop, main())


def test_wait_closed_and_closing(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        assert not writer.is_closing()
        writer.close()
        assert writer.is_closing()
        await wait(writer.wait_closed())
        assert peer.recv(10) == b""
        peer.close()

    arun(loop, main())


def test_server_side_streams(loop, streams_path, tmp_path):
    seen = {}

    async def handler(reader, writer):
        seen["types"] = (type(reader), type(writer))
        if streams_path == "c":
            seen["c"] = is_c(reader, "readline") and is_c(writer._protocol, "_drain_helper")
        async for line in reader:
            writer.write(line.upper())
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main():
        for kind in ("tcp", "unix"):
            if kind == "tcp":
                srv = await asyncio.start_server(handler, "127.0.0.1", 0)
                r, w = await asyncio.open_connection(*srv.sockets[0].getsockname())
            else:
                path = str(tmp_path / "s.sock")
                srv = await asyncio.start_unix_server(handler, path)
                r, w = await asyncio.open_unix_connection(path)
            w.write(b"abc\n")
            assert await wait(r.readline()) == b"ABC\n"
            w.write_eof()
            assert await wait(r.read()) == b""
            w.close()
            await wait(w.wait_closed())
            srv.close()
            await srv.wait_closed()
            assert seen["types"] == (asyncio.StreamReader, asyncio.StreamWriter)
            if streams_path == "c":
                assert seen["c"]

    arun(loop, main())


def test_reverse_echo_server(loop, streams_path):
    async def handler(reader, writer):
        while line := await reader.readline():
            writer.write(line.rstrip(b"\n")[::-1] + b"\n")
            await writer.drain()
        writer.close()

    async def main():
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        r, w = await asyncio.open_connection(*srv.sockets[0].getsockname())
        got = []
        for word in (b"abc", b"hello", b"x" * 1000):
            w.write(word + b"\n")
            await w.drain()
            got.append(await wait(r.readline()))
        assert got == [b"cba\n", b"olleh\n", b"x" * 1000 + b"\n"]
        w.close()
        await wait(w.wait_closed())
        srv.close()
        await srv.wait_closed()

    arun(loop, main())


def test_the_c_path_runs(loop, streams_path):
    """On tideloop-c the core counts what it did; off, nothing."""
    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"hi\n")
        assert await reader.readline() == b"hi\n"
        writer.write(b"ok")
        await writer.drain()
        peer.sendall(b"x")
        assert await reader.read(-1 + 2) == b"x"
        await closing(writer, peer)

    if streams_path is None:
        arun(loop, main())
        return
    before = core_stats()
    arun(loop, main())
    after = core_stats()
    delta = {k: after[k] - before[k] for k in after}
    if streams_path == "c":
        assert delta["connections"] == 1 and delta["drain_helpers"] == 1
        assert delta["calls_in_c"] >= 3 and delta["calls_to_asyncio"] == 0
    else:
        assert all(v == 0 for v in delta.values()), delta


def test_calls_out_of_the_ordinary_run_asyncio_s_code(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"abc")
        peer.shutdown(socket.SHUT_WR)
        await wait_until(lambda: reader._eof)
        # keyword arguments, read(-1), wrong types: asyncio's own functions
        assert await reader.read(n=1) == b"a"
        with pytest.raises(TypeError):
            reader.read(1, 2)
        with pytest.raises(TypeError):
            await reader.readexactly("2")
        assert await reader.read(-1) == b"bc"
        await closing(writer, peer)

    if streams_path != "c":
        arun(loop, main())
        return
    before = core_stats()["calls_to_asyncio"]
    arun(loop, main())
    assert core_stats()["calls_to_asyncio"] - before >= 2


def test_subclasses_and_custom_protocols_keep_their_methods(loop, streams_path):
    calls = []

    class MyReader(asyncio.StreamReader):
        async def read(self, n=-1):
            calls.append("MyReader.read")
            return await super().read(n)

    class MyProtocol(asyncio.StreamReaderProtocol):
        def data_received(self, data):
            calls.append("MyProtocol.data_received")
            super().data_received(data)

    async def main():
        lp = asyncio.get_running_loop()
        for reader_cls, proto_cls in ((MyReader, asyncio.StreamReaderProtocol),
                                      (asyncio.StreamReader, MyProtocol)):
            a, b = socket.socketpair()
            reader = reader_cls(limit=LIMIT, loop=lp)
            tr, proto = await lp.create_connection(lambda: proto_cls(reader, loop=lp), sock=a)
            assert "read" not in vars(reader)
            b.sendall(b"data")
            assert await wait(reader.read(10)) == b"data"
            tr.close()
            b.close()
        assert calls == ["MyReader.read", "MyProtocol.data_received"]

    arun(loop, main())


def test_methods_replaced_on_the_class_are_used(loop, streams_path, monkeypatch):
    original = asyncio.StreamReader.readline

    async def readline(self):
        return b"patched:" + await original(self)

    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"one\ntwo\n")
        assert await wait(reader.readline()) == b"one\n"
        monkeypatch.setattr(asyncio.StreamReader, "readline", readline)
        # a connection made now keeps asyncio's replaced method
        reader2, writer2, peer2 = await stream_pair()
        assert "readline" not in vars(reader2)
        peer2.sendall(b"x\n")
        assert await wait(reader2.readline()) == b"patched:x\n"
        await closing(writer2, peer2)
        await closing(writer, peer)

    arun(loop, main())


def test_a_replaced_feed_data_is_called(loop, streams_path, monkeypatch):
    fed = []
    original = asyncio.StreamReader.feed_data

    def feed_data(self, data):
        fed.append(bytes(data))
        original(self, data)

    async def main():
        reader, writer, peer = await stream_pair()
        monkeypatch.setattr(asyncio.StreamReader, "feed_data", feed_data)
        peer.sendall(b"abc")
        assert await wait(reader.read(10)) == b"abc"
        assert fed == [b"abc"]
        await closing(writer, peer)

    arun(loop, main())


def test_awaitables_act_as_coroutines(loop, streams_path):
    import inspect

    async def main():
        reader, writer, peer = await stream_pair()
        for fn in (reader.read, reader.readline, reader.readexactly, reader.readuntil,
                   writer._protocol._drain_helper):
            assert inspect.iscoroutinefunction(fn) == (sys.version_info >= (3, 12)
                                                       or streams_path != "c"), fn
            if sys.version_info < (3, 14):        # deprecated from 3.14
                assert asyncio.iscoroutinefunction(fn), fn
        assert inspect.iscoroutinefunction(writer.drain)      # asyncio's own
        for fn in (writer.write, writer.writelines):
            assert not inspect.iscoroutinefunction(fn)
        coro = reader.readline()
        assert asyncio.iscoroutine(coro)
        task = asyncio.create_task(coro)
        peer.sendall(b"line\n")
        assert await wait(task) == b"line\n"
        # gather and wait_for take them too
        peer.sendall(b"ab")
        assert await wait(asyncio.gather(reader.readexactly(1), asyncio.sleep(0))) == [b"a", None]
        assert await asyncio.wait_for(reader.read(5), 1) == b"b"
        # closed before it ran: nothing happens, no warning
        c = reader.read(1)
        c.close()
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            await c
        await closing(writer, peer)

    arun(loop, main())


def test_non_none_first_send_leaves_the_read_unstarted(loop, streams_path):
    # A coroutine refuses a first send() of anything but None and stays
    # unstarted: send(None) then runs it as usual (found by the fuzzer).
    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"line\nrest")
        await settle(reader, 9)
        for coro, want in ((reader.readline(), b"line\n"), (reader.read(2), b"re"),
                           (reader.readexactly(1), b"s"), (reader.readuntil(b"t"), b"t")):
            with pytest.raises(TypeError, match="can't send non-None value"):
                coro.send(1)
            with pytest.raises(StopIteration) as stop:
                coro.send(None)
            assert stop.value.value == want
        assert bytes(reader._buffer) == b""
        await closing(writer, peer)

    arun(loop, main())


def test_stop_iteration_thrown_before_start_as_coroutines_do(loop, streams_path):
    # A StopIteration thrown into an unstarted coroutine: RuntimeError from
    # it on 3.11 (PEP 479), the StopIteration itself from 3.12.
    async def main():
        reader, writer, peer = await stream_pair()
        for coro in (reader.read(1), reader.readline(), reader.readexactly(1),
                     reader.readuntil(b"-")):
            stop = StopIteration("value")
            if sys.version_info < (3, 12):
                with pytest.raises(RuntimeError, match="coroutine raised StopIteration") as err:
                    coro.throw(stop)
                assert err.value.__cause__ is stop and err.value.__context__ is stop
            else:
                with pytest.raises(StopIteration) as err:
                    coro.throw(stop)
                assert err.value is stop
            with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
                coro.send(None)
        await closing(writer, peer)

    arun(loop, main())


def test_each_result_comes_in_a_stopiteration_of_its_own(loop, streams_path):
    # A read that ends when first sent to raises StopIteration(data) with
    # args (data,) and nothing else on it, as a coroutine does: also after
    # the previous one was given notes, a context, a cause and attributes,
    # and when the previous one is still kept.  (3.12+ with a GIL, C path:
    # the one exception is raised again while nothing else holds it.)
    reused = (streams_path == "c" and sys.version_info >= (3, 12)
              and not sysconfig.get_config_var("Py_GIL_DISABLED"))

    def finish(coro):
        try:
            coro.send(None)
        except StopIteration as exc:
            return exc
        raise AssertionError("the read did not end")

    def is_fresh(exc, data):
        tb = exc.__traceback__
        assert tb is not None and tb.tb_next is None      # finish() only
        assert tb.tb_frame.f_code is finish.__code__
        assert (exc.value, exc.args) == (data, (data,))
        assert exc.__context__ is None and exc.__cause__ is None
        assert not exc.__suppress_context__ and vars(exc) == {}
        assert not hasattr(exc, "__notes__")

    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"one\ntwo\nthree\nfour\n")
        await settle(reader, 19)
        first = finish(reader.readline())
        is_fresh(first, b"one\n")
        first.add_note("a note")
        first.mark = 1
        first.__context__ = ValueError("context")
        first.__cause__ = KeyError("cause")
        first_id = id(first)
        del first
        second = finish(reader.readline())
        is_fresh(second, b"two\n")
        if reused:
            assert id(second) == first_id
        kept = second
        third = finish(reader.readline())
        assert third is not kept
        is_fresh(third, b"three\n")
        assert (kept.value, kept.args) == (b"two\n", (b"two\n",))
        del third
        is_fresh(finish(reader.readline()), b"four\n")
        # drain() ends with None: StopIteration() from send(), and from
        # next() when the iterator simply ends
        with pytest.raises(StopIteration) as err:
            writer._protocol._drain_helper().send(None)
        assert err.value.value is None
        with pytest.raises(StopIteration) as err:
            next(writer._protocol._drain_helper().__await__())
        assert err.value.value is None
        await closing(writer, peer)

    arun(loop, main())


def test_never_awaited_read_warns(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reader.readline()
            gc.collect()
        assert any(issubclass(w.category, RuntimeWarning) and
                   "coroutine 'StreamReader.readline' was never awaited" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]
        await closing(writer, peer)

    arun(loop, main())


async def big_messages(loop, conns, seed):
    """conns stream pairs (asyncio's default limit), each sent messages of
    100-300 KiB by a task while it reads them back with read(65536),
    readexactly() and readuntil(); every byte is checked."""
    import random
    rng = random.Random(seed)
    pairs = [await stream_pair(limit=2 ** 16) for _ in range(conns)]
    for _, _, peer in pairs:
        peer.setblocking(False)

    async def one(reader, peer, rounds):
        for r in range(rounds):
            data = rng.randbytes(rng.randrange(100 * 1024, 300 * 1024)) + b"\n"
            sending = asyncio.ensure_future(loop.sock_sendall(peer, data))
            got = bytearray()
            while len(got) < len(data):
                how = (r + len(got)) % 3
                if how == 0:
                    got += await reader.read(65536)
                elif how == 1:
                    got += await reader.readexactly(min(40000, len(data) - len(got)))
                else:
                    got += await reader.readuntil(b"\n") if len(data) - len(got) < 65536 \
                        else await reader.read(30000)
            await sending
            assert bytes(got) == data, r

    await wait(asyncio.gather(*(one(reader, peer, 6) for reader, _, peer in pairs)), 60)
    return pairs


def test_large_messages_on_many_connections_arrive_whole(loop, streams_path):
    async def main():
        for reader, writer, peer in await big_messages(loop, 4, 1):
            peer.setblocking(True)
            await closing(writer, peer)

    arun(loop, main())


@pytest.mark.skipif(sys.version_info >= (3, 15) or sysconfig.get_config_var("Py_GIL_DISABLED"),
                    reason="the storage pool is 3.11-3.14's with a GIL (3.15: take_bytes)")
def test_large_buffer_storage_is_lent_then_given_back(loop, streams_path):
    # Emptied large buffers lend their storage to the next that grows, and
    # a second without anything to do gives it back.
    if streams_path != "c":
        pytest.skip("the C path's")

    async def main():
        pairs = await big_messages(loop, 2, 2)
        assert core_stats()["storage_pooled"] > 0
        await asyncio.sleep(1.2)
        assert core_stats()["storage_pooled"] == 0
        for reader, writer, peer in pairs:
            peer.setblocking(True)
            await closing(writer, peer)

    arun(loop, main())


def test_dropped_streams_are_freed_without_the_cycle_collector(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        peer.sendall(b"x")
        assert await wait(reader.read(1)) == b"x"
        refs = weakref.ref(reader), weakref.ref(writer)
        writer.close()
        await wait(writer.wait_closed())
        peer.close()
        del reader, writer
        gc.disable()
        try:
            for _ in range(5):
                await asyncio.sleep(0)
            assert refs[0]() is None and refs[1]() is None
        finally:
            gc.enable()

    arun(loop, main())


def test_unclosed_writer_warns_when_dropped(loop, streams_path):
    async def main():
        reader, writer, peer = await stream_pair()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del writer
            gc.collect()
        assert any(issubclass(w.category, ResourceWarning) and "unclosed" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]
        peer.close()
        await asyncio.sleep(0)

    arun(loop, main())


def test_tls_streams_and_start_tls(loop, streams_path):
    from tls_helpers import client_context, server_context

    async def handler(reader, writer):
        line = await reader.readline()              # plain text first
        writer.write(line.upper())
        await writer.drain()
        await writer.start_tls(server_context())    # then the same stream over TLS
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()

    async def main():
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        r, w = await asyncio.open_connection(*addr)
        w.write(b"plain\n")
        assert await wait(r.readline()) == b"PLAIN\n"
        await wait(w.start_tls(client_context(), server_hostname="localhost"))
        assert w.get_extra_info("sslcontext") is not None
        for word in (b"one", b"two" * 1000):
            w.write(word + b"\n")
            await w.drain()
            assert await wait(r.readline()) == word.upper() + b"\n"
        w.close()
        await wait(w.wait_closed())
        # and a connection over TLS from the start
        tls_srv = await asyncio.start_server(handler_tls, "127.0.0.1", 0, ssl=server_context())
        r, w = await asyncio.open_connection(*tls_srv.sockets[0].getsockname(),
                                             ssl=client_context(), server_hostname="localhost")
        w.write(b"abc\n")
        assert await wait(r.readexactly(4)) == b"ABC\n"
        w.write(b"x" * 5000 + b"\n")
        assert await wait(r.readuntil(b"\n")) == b"X" * 5000 + b"\n"
        if streams_path == "c":
            assert is_c(r, "readuntil")
        w.close()
        await wait(w.wait_closed())
        for s in (srv, tls_srv):
            s.close()
            await s.wait_closed()

    async def handler_tls(reader, writer):
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()

    arun(loop, main())
