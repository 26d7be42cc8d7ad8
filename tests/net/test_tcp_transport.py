"""Stream transports (TCP and Unix): the Transport API and the order of
protocol callbacks, on asyncio and tideloop alike.

Every test runs over TCP (127.0.0.1) and over a Unix socket in tmp_path.
"""
import array
import asyncio
import inspect
import logging
import socket
import sys

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, collapse, connected_pair,
    fd_leak_check, open_fds, raw_client, start_server, wait, wait_until,
)


# 3.12+: the stock socket transport has a writelines() of its own.
WRITELINES_VIEWS = "writelines" in vars(asyncio.selector_events._SelectorSocketTransport)


# Early 3.12/3.13 releases: the stock writelines() does not check for a lost
# connection before it writes.
STOCK_WRITELINES_AFTER_LOSS_BUG = WRITELINES_VIEWS and "_conn_lost" not in \
    inspect.getsource(asyncio.selector_events._SelectorSocketTransport.writelines)


def stock_write_type_error(bad):
    """The message of the stock transport's write(bad) on this interpreter
    (its type check comes before any use of the transport)."""
    with pytest.raises(TypeError) as ei:
        asyncio.selector_events._SelectorSocketTransport.write(None, bad)
    return str(ei.value)


@pytest.fixture
def stock_keeps_views_xfail(request, loop_name):
    """3.12+'s stock transport queues the caller's buffer itself (a view, no
    copy): mutating it later changes what is sent.  tideloop copies."""
    if loop_name == "asyncio" and sys.version_info >= (3, 12):
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=(
            "stock asyncio 3.12+ keeps a view of a mutable buffer passed to "
            "write()/writelines() (tideloop copies it)")))


@pytest.fixture
def stock_stuck_after_failed_writelines_xfail(request, loop_name):
    """3.15's stock writelines() queues the items before a bad one, then
    raises: they stay queued with no writer armed, and every later write
    waits behind them for ever.  tideloop queues nothing of a writelines()
    that fails."""
    if loop_name == "asyncio" and sys.version_info >= (3, 15):
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=(
            "stock asyncio 3.15 keeps the items before a failing one queued "
            "without arming the writer: later writes never go out")))


@pytest.fixture(params=["tcp", "unix"])
def kind(request):
    return request.param


def pair(loop, kind, tmp_path, client=None, server=None, **kw):
    client = client or (lambda: Recorder(loop))
    server = server or (lambda: Recorder(loop))
    return connected_pair(loop, kind, client, server, tmp_path, **kw)


async def finish(srv, *transports):
    for tr in transports:
        tr.close()
    await asyncio.sleep(0)
    await close_server(srv)
    # let connection_lost callbacks run
    for _ in range(3):
        await asyncio.sleep(0)


# ---------------------------------------------------------------- ordering


def test_connection_made_before_create_connection_returns(loop, kind, tmp_path):
    async def main():
        srv, addr = await start_server(loop, kind, lambda: Recorder(loop), tmp_path)
        if kind == "tcp":
            tr, pr = await loop.create_connection(lambda: Recorder(loop), *addr)
        else:
            tr, pr = await loop.create_unix_connection(lambda: Recorder(loop), addr)
        # asyncio: connection_made runs before the waiter is woken
        assert pr.events == ["made"]
        assert pr.transport is tr
        assert tr.get_protocol() is pr
        assert isinstance(tr, asyncio.Transport)
        assert not tr.is_closing()
        assert tr.is_reading()
        await finish(srv, tr)

    arun(loop, main())


def test_callback_order_client_closes(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        ctr.write(b"hello")
        await spr.wait_bytes(5)
        spr.transport.write(b"world")
        await cpr.wait_bytes(5)
        ctr.close()
        assert ctr.is_closing()
        assert cpr.events == ["made", "data"]  # connection_lost is deferred
        await wait(cpr.lost)
        await wait(spr.lost)
        assert cpr.events == ["made", "data", "lost"]
        assert cpr.exc is None
        # the server saw EOF; eof_received returned False -> transport closed
        assert collapse(spr.events) == ["made", "data", "eof", "lost"]
        assert spr.exc is None
        assert bytes(spr.data) == b"hello" and bytes(cpr.data) == b"world"
        assert cpr.data_types == {bytes} and spr.data_types == {bytes}
        assert spr.transport.is_closing()
        await close_server(srv)

    arun(loop, main())


def test_peer_close_gives_eof_then_lost(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        spr.transport.write(b"bye")
        spr.transport.close()
        await wait(cpr.lost)
        assert cpr.events == ["made", "data", "eof", "lost"]
        assert cpr.exc is None and bytes(cpr.data) == b"bye"
        await wait(spr.lost)
        assert spr.events == ["made", "lost"]
        await close_server(srv)

    arun(loop, main())


def test_half_close_eof_received_keep_open(loop, kind, tmp_path):
    """write_eof() on one side; the peer's eof_received returns True and it
    keeps writing; only then it closes."""

    def on_eof(p):
        p.transport.write(b"reply-after-eof:" + bytes(p.data))

    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, keep_open=True, on_eof=on_eof))
        assert ctr.can_write_eof() is True
        assert spr.transport.can_write_eof() is True
        ctr.write(b"abc")
        ctr.write_eof()
        ctr.write_eof()  # idempotent
        await wait(spr.eof)
        assert not spr.transport.is_closing()  # kept open
        await cpr.wait_bytes(len(b"reply-after-eof:abc"))
        assert bytes(cpr.data) == b"reply-after-eof:abc"
        assert "lost" not in spr.events
        spr.transport.close()
        await wait(cpr.lost)
        await wait(spr.lost)
        assert collapse(spr.events) == ["made", "data", "eof", "lost"]
        assert cpr.events == ["made", "data", "eof", "lost"]
        await close_server(srv)

    arun(loop, main())


def test_write_after_write_eof_raises(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        ctr.write_eof()
        with pytest.raises(RuntimeError, match=r"^Cannot call write\(\) after write_eof\(\)$"):
            ctr.write(b"x")
        await finish(srv, ctr)

    arun(loop, main())


# ---------------------------------------------------------------- write()


def test_write_accepts_bytes_like_and_writelines(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        ctr.write(b"a")
        ctr.write(bytearray(b"bc"))
        ctr.write(memoryview(b"xdefx")[1:4])
        ctr.write(b"")
        ctr.writelines([b"g", bytearray(b"h"), memoryview(b"i")])
        ctr.writelines(x for x in (b"j", b"kl"))
        ctr.writelines([])
        await spr.wait_bytes(12)
        await asyncio.sleep(0.02)
        assert bytes(spr.data) == b"abcdefghijkl"
        assert ctr.get_write_buffer_size() == 0
        await finish(srv, ctr)

    arun(loop, main())


@pytest.mark.parametrize("bad, name", [("text", "str"), (42, "int"), (None, "NoneType"),
                                        ([b"x"], "list"),
                                        # supports the buffer protocol, but asyncio
                                        # only takes bytes, bytearray, memoryview
                                        (array.array("B", b"xy"), "array")])
def test_write_non_bytes_type_error(loop, kind, tmp_path, bad, name):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        with pytest.raises(TypeError) as ei:
            ctr.write(bad)
        assert str(ei.value) == stock_write_type_error(bad)
        assert str(ei.value).endswith(f", not {name!r}")
        with pytest.raises(TypeError):
            ctr.writelines(["text"])
        # the transport is unharmed
        assert not ctr.is_closing()
        ctr.write(b"ok")
        await spr.wait_bytes(2)
        assert bytes(spr.data) == b"ok"
        await finish(srv, ctr)

    arun(loop, main())


@pytest.mark.usefixtures("stock_stuck_after_failed_writelines_xfail")
def test_writelines_type_error_message(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        with pytest.raises(TypeError) as ei:
            ctr.writelines([b"ok", "text"])
        # 3.11 joins the items (WriteTransport.writelines); 3.12+ makes a
        # memoryview of each (the socket transport's own writelines).
        assert str(ei.value) == (
            "memoryview: a bytes-like object is required, not 'str'" if WRITELINES_VIEWS
            else "sequence item 1: expected a bytes-like object, str found")
        ctr.write(b"!")
        await spr.wait_bytes(1)
        assert bytes(spr.data) == b"!"  # nothing of the failed writelines went out
        await finish(srv, ctr)

    arun(loop, main())


def test_writelines_after_the_peer_closed_is_one_send(loop, tmp_path):
    # The stock writelines() sends its items at once (3.11 joins them, 3.12+
    # one sendmsg()).  After the peer closed a TCP connection, that one send
    # still succeeds -- the peer answers it with a reset -- where a send per
    # item would fail on the second with BrokenPipeError and lose the
    # connection on the spot.
    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, "tcp", tmp_path, client=lambda: Recorder(loop, keep_open=True))
        spr.transport.close()
        await wait(cpr.eof)
        ctr.writelines([b"a", b"b", b"c"])
        assert not ctr.is_closing()
        assert cpr.exc == "never called"
        await finish(srv, ctr)

    arun(loop, main())


@pytest.mark.skipif(sys.version_info < (3, 15), reason="3.15+: _buffer_size")
def test_buffer_size_attribute_is_the_write_buffer_size(loop, kind, tmp_path):
    """3.15's socket transport keeps the queued byte count in _buffer_size."""
    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        assert ctr._buffer_size == 0
        ctr.write(b"x" * (4 << 20))
        assert ctr._buffer_size == ctr.get_write_buffer_size() > 0
        spr.transport.resume_reading()
        await spr.wait_bytes(4 << 20)
        await wait_until(lambda: ctr.get_write_buffer_size() == 0)
        assert ctr._buffer_size == 0
        await finish(srv, ctr)

    arun(loop, main())


@pytest.mark.usefixtures("stock_keeps_views_xfail")
def test_writelines_copies_mutable_buffers(loop, kind, tmp_path):
    size = 8 << 20

    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        a = bytearray(b"A" * size)
        b = bytearray(b"B" * 1000)
        ctr.writelines([a, memoryview(b)])
        assert ctr.get_write_buffer_size() > 0
        a[:] = b"a" * size
        b[:] = b"b" * 1000
        spr.transport.resume_reading()
        await spr.wait_bytes(size + 1000)
        assert bytes(spr.data) == b"A" * size + b"B" * 1000
        await finish(srv, ctr)

    arun(loop, main())


def test_writelines_after_close_counts_once(request, loop_name, loop, kind, tmp_path, caplog):
    """asyncio 3.11's writelines() is write(b''.join(items)): after close it
    counts as ONE lost write, however many items it has (b"" items: none).
    3.12+'s own writelines() counts one per call with a true argument."""
    if loop_name == "asyncio" and STOCK_WRITELINES_AFTER_LOSS_BUG:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=(
            "stock asyncio bug (3.12.1, 3.13.0): writelines() on a closed "
            "transport calls its _write_ready, which connection_lost set to None")))

    def warnings_count():
        return sum(1 for r in caplog.records
                   if r.getMessage() == "socket.send() raised exception.")

    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        ctr.close()
        for _ in range(3):
            ctr.writelines([b"x"] * 10)
        assert warnings_count() == 0  # 3 writes so far, not 30
        ctr.writelines([b"", b""])  # 3.11: joins to b"", not counted; 3.12+: counted
        ctr.writelines([])           # never counted
        ctr.write(b"4")
        if WRITELINES_VIEWS:
            assert warnings_count() == 1        # the 5th lost write warns
            ctr.writelines([b"5", b"5"])
            assert warnings_count() == 2
        else:
            assert warnings_count() == 0
            ctr.writelines([b"5", b"5"])
            assert warnings_count() == 1
        await wait(cpr.lost)
        await close_server(srv)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        arun(loop, main())


@pytest.mark.usefixtures("stock_keeps_views_xfail")
def test_write_copies_mutable_buffers(loop, kind, tmp_path):
    """Data that cannot be sent at once is copied: mutating the caller's
    bytearray after write() must not change what the peer receives."""
    size = 8 << 20

    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        buf = bytearray(b"A" * size)
        ctr.write(buf)
        assert ctr.get_write_buffer_size() > 0  # the peer is not reading
        buf[:] = b"B" * size
        mv_src = bytearray(b"C" * 1000)
        ctr.write(memoryview(mv_src))
        mv_src[:] = b"D" * 1000
        spr.transport.resume_reading()
        await spr.wait_bytes(size + 1000)
        assert bytes(spr.data) == b"A" * size + b"C" * 1000
        await finish(srv, ctr)

    arun(loop, main())


def test_write_after_close_is_silent_then_logs(loop, kind, tmp_path, caplog):
    """asyncio counts writes after close: from the 5th one on it logs
    'socket.send() raised exception.' (a WARNING on the 'asyncio' logger)."""

    def warnings_count():
        return sum(1 for r in caplog.records
                   if r.name == "asyncio" and r.levelno == logging.WARNING
                   and r.getMessage() == "socket.send() raised exception.")

    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        ctr.close()
        ctr.write(b"")  # empty writes are not counted
        for _ in range(4):
            ctr.write(b"x")
        assert warnings_count() == 0
        ctr.write(b"x")
        assert warnings_count() == 1
        ctr.write(b"x")
        assert warnings_count() == 2
        await wait(cpr.lost)
        ctr.write(b"y")  # after connection_lost too: no exception
        assert warnings_count() == 3
        assert cpr.events == ["made", "lost"]
        await wait(spr.lost)
        assert bytes(spr.data) == b""  # nothing written after close() went out
        await close_server(srv)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        arun(loop, main())


# ---------------------------------------------------------------- close/abort


def test_close_abort_idempotent_lost_once(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        ctr.close()
        ctr.close()
        ctr.abort()
        assert ctr.is_closing()
        assert not ctr.is_reading()
        await wait(cpr.lost)
        for _ in range(5):
            await asyncio.sleep(0)
        ctr.close()
        ctr.abort()
        for _ in range(3):
            await asyncio.sleep(0)
        assert cpr.events == ["made", "lost"]
        assert cpr.exc is None
        # the peer: abort twice, close after abort
        spr.transport.abort()
        spr.transport.abort()
        spr.transport.close()
        await wait(spr.lost)
        for _ in range(3):
            await asyncio.sleep(0)
        assert spr.events.count("lost") == 1
        assert spr.exc is None
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("how", ["close", "abort"])
def test_connection_lost_is_scheduled_like_call_soon(loop, kind, tmp_path, how):
    """close()/abort() with an empty buffer schedule connection_lost with
    call_soon: it runs after callbacks already queued, before later ones."""
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        order = []
        cpr.on_lost = lambda p, exc: order.append("lost")
        loop.call_soon(order.append, "before")
        getattr(ctr, how)()
        loop.call_soon(order.append, "after")
        assert order == []
        await asyncio.sleep(0)
        assert order == ["before", "lost", "after"]
        await close_server(srv)

    arun(loop, main())


def test_close_flushes_write_buffer_before_lost(loop, kind, tmp_path):
    size = 8 << 20

    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        ctr.write(b"z" * size)
        assert ctr.get_write_buffer_size() > 0
        ctr.close()
        assert ctr.is_closing()
        await asyncio.sleep(0.1)
        assert "lost" not in cpr.events  # still flushing: the peer is not reading
        spr.transport.resume_reading()
        await wait(cpr.lost)
        assert cpr.exc is None
        # the write buffer went over the high-water mark and drained
        assert cpr.events == ["made", "pause", "resume", "lost"]
        await wait(spr.lost)
        assert len(spr.data) == size and bytes(spr.data) == b"z" * size
        assert collapse(spr.events) == ["made", "data", "eof", "lost"]
        await close_server(srv)

    arun(loop, main())


def test_abort_discards_write_buffer(loop, kind, tmp_path):
    size = 8 << 20

    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        ctr.write(b"z" * size)
        assert ctr.get_write_buffer_size() > 0
        ctr.abort()
        assert ctr.is_closing()
        assert ctr.get_write_buffer_size() == 0
        await wait(cpr.lost)
        assert cpr.exc is None
        # abort drops the buffer without resume_writing()
        assert cpr.events == ["made", "pause", "lost"]
        spr.transport.resume_reading()
        await wait(spr.lost)
        assert len(spr.data) < size
        await close_server(srv)

    arun(loop, main())


def test_write_eof_flushes_buffer_first(loop, kind, tmp_path):
    size = 4 << 20

    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, keep_open=True,
                                    on_made=lambda p: p.transport.pause_reading(),
                                    on_eof=lambda p: p.transport.write(b"ack")))
        ctr.write(b"q" * size)
        assert ctr.get_write_buffer_size() > 0
        ctr.write_eof()
        assert not ctr.is_closing()
        spr.transport.resume_reading()
        await wait(spr.eof)
        assert bytes(spr.data) == b"q" * size
        await cpr.wait_bytes(3)
        assert bytes(cpr.data) == b"ack"  # half-closed: we can still read
        await finish(srv, ctr, spr.transport)

    arun(loop, main())


# ---------------------------------------------------------------- closing from callbacks


def test_close_from_connection_made(loop, kind, tmp_path):
    def on_made(p):
        p.transport.write(b"bye")
        p.transport.close()

    async def main():
        srv, addr = await start_server(loop, kind, lambda: Recorder(loop), tmp_path)
        # client side closes inside its own connection_made
        if kind == "tcp":
            tr, pr = await loop.create_connection(lambda: Recorder(loop, on_made=on_made), *addr)
        else:
            tr, pr = await loop.create_unix_connection(
                lambda: Recorder(loop, on_made=on_made), addr)
        assert tr.is_closing()
        await wait(pr.lost)
        assert pr.events == ["made", "lost"]
        assert pr.exc is None
        await close_server(srv)

    arun(loop, main())


def test_server_closes_in_connection_made_peer_gets_data_then_eof(loop, kind, tmp_path):
    def on_made(p):
        p.transport.write(b"bye")
        p.transport.close()

    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path, server=lambda: Recorder(loop, on_made=on_made))
        await wait(cpr.lost)
        assert cpr.events == ["made", "data", "eof", "lost"]
        assert bytes(cpr.data) == b"bye"
        await wait(spr.lost)
        assert spr.events == ["made", "lost"]
        await close_server(srv)

    arun(loop, main())


def test_close_from_data_received(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_data=lambda p, d: p.transport.close()))
        ctr.write(b"a")
        await wait(spr.lost)
        ctr.write(b"b")  # arrives after close: must never be delivered
        await wait(cpr.lost)
        await asyncio.sleep(0.02)
        assert spr.events == ["made", "data", "lost"]
        assert bytes(spr.data) == b"a"
        assert spr.exc is None
        # Over a Unix socket on 3.12+, both loops report the client's loss
        # without an EOF first (its write of b"b" fails on the closed peer).
        expected = (["made", "lost"] if kind == "unix" and sys.version_info >= (3, 12)
                    else ["made", "eof", "lost"])
        assert cpr.events == expected
        await close_server(srv)

    arun(loop, main())


def test_abort_from_data_received(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_data=lambda p, d: p.transport.abort()))
        ctr.write(b"a")
        await wait(spr.lost)
        await asyncio.sleep(0.02)
        assert spr.events == ["made", "data", "lost"]
        assert spr.exc is None
        await wait(cpr.lost)
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_close_from_eof_received(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, keep_open=True,
                                    on_eof=lambda p: p.transport.close()))
        ctr.write(b"a")
        ctr.write_eof()
        await wait(spr.lost)
        for _ in range(3):
            await asyncio.sleep(0)
        assert collapse(spr.events) == ["made", "data", "eof", "lost"]
        assert spr.events.count("lost") == 1
        assert spr.exc is None
        await wait(cpr.lost)
        assert cpr.events == ["made", "eof", "lost"]
        await close_server(srv)

    arun(loop, main())


# ---------------------------------------------------------------- protocol errors


def _record_handler(loop):
    calls = []
    loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
    return calls


def test_data_received_exception(loop, kind, tmp_path):
    boom = ZeroDivisionError("boom")

    def on_data(p, d):
        raise boom

    async def main():
        calls = _record_handler(loop)
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path, server=lambda: Recorder(loop, on_data=on_data))
        ctr.write(b"x")
        await wait(spr.lost)
        assert spr.events == ["made", "data", "lost"]
        assert spr.exc is boom
        assert len(calls) == 1
        ctx = calls[0]
        assert ctx["message"] == "Fatal error: protocol.data_received() call failed."
        assert ctx["exception"] is boom
        assert ctx["transport"] is spr.transport
        assert ctx["protocol"] is spr
        await wait(cpr.lost)
        await close_server(srv)

    arun(loop, main())


def test_eof_received_exception(loop, kind, tmp_path):
    boom = ValueError("eof boom")

    def on_eof(p):
        raise boom

    async def main():
        calls = _record_handler(loop)
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path, server=lambda: Recorder(loop, on_eof=on_eof))
        ctr.write_eof()
        await wait(spr.lost)
        assert spr.events == ["made", "eof", "lost"]
        assert spr.exc is boom
        assert [c["message"] for c in calls] == [
            "Fatal error: protocol.eof_received() call failed."]
        assert calls[0]["exception"] is boom
        ctr.close()
        await close_server(srv)

    arun(loop, main())


def test_connection_lost_exception_goes_to_handler(loop, kind, tmp_path):
    """An exception from connection_lost (run as a loop callback) reaches the
    exception handler; the loop keeps running."""
    boom = KeyError("lost boom")

    def on_lost(p, exc):
        raise boom

    async def main():
        calls = _record_handler(loop)
        srv, addr = await start_server(loop, kind, lambda: Recorder(loop), tmp_path)
        if kind == "tcp":
            tr, pr = await loop.create_connection(
                lambda: Recorder(loop, on_lost=on_lost), *addr)
        else:
            tr, pr = await loop.create_unix_connection(
                lambda: Recorder(loop, on_lost=on_lost), addr)
        tr.close()
        await wait_until(lambda: calls)
        assert pr.events == ["made", "lost"]
        assert calls[0]["exception"] is boom
        assert calls[0]["message"].startswith("Exception in callback")
        await close_server(srv)

    arun(loop, main())


def test_connection_made_exception_goes_to_handler(loop, kind, tmp_path):
    """connection_made runs as a plain loop callback: its exception is
    reported, create_connection still returns, the transport keeps working."""
    boom = ValueError("made boom")

    def on_made(p):
        raise boom

    async def main():
        calls = _record_handler(loop)
        srv, addr = await start_server(loop, kind, EchoProtocol, tmp_path)
        if kind == "tcp":
            tr, pr = await loop.create_connection(lambda: Recorder(loop, on_made=on_made), *addr)
        else:
            tr, pr = await loop.create_unix_connection(
                lambda: Recorder(loop, on_made=on_made), addr)
        assert pr.events == ["made"]
        assert len(calls) == 1 and calls[0]["exception"] is boom
        assert calls[0]["message"].startswith("Exception in callback")
        assert not tr.is_closing()
        tr.write(b"still works")
        await pr.wait_bytes(11)
        assert bytes(pr.data) == b"still works"
        tr.close()
        await wait(pr.lost)
        assert pr.exc is None
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("where, exc_type", [("data", SystemExit), ("eof", KeyboardInterrupt),
                                             ("lost", SystemExit)])
def test_base_exceptions_propagate_out_of_the_loop(loop, kind, tmp_path, where, exc_type):
    """SystemExit / KeyboardInterrupt from a protocol callback are not
    swallowed by the transport: they stop run_until_complete."""
    box = {}

    def on_data(p, d):
        if where == "data":
            raise exc_type("from data_received")

    def on_eof(p):
        if where == "eof":
            raise exc_type("from eof_received")

    def on_lost(p, exc):
        if where == "lost":
            raise exc_type("from connection_lost")

    async def setup():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_data=on_data, on_eof=on_eof, on_lost=on_lost))
        box.update(srv=srv, ctr=ctr, cpr=cpr, spr=spr)

    arun(loop, setup())
    ctr, spr = box["ctr"], box["spr"]
    calls = _record_handler(loop)

    async def trigger():
        ctr.write(b"x")
        ctr.write_eof()
        await asyncio.sleep(1)

    with pytest.raises(exc_type, match="from "):
        loop.run_until_complete(trigger())
    assert calls == []
    # clean up: the loop is still usable
    ctr.close()
    spr.transport.close()

    async def cleanup():
        await asyncio.sleep(0.05)
        await close_server(box["srv"])

    loop.run_until_complete(cleanup())
    assert spr.events.count("lost") == 1


# ---------------------------------------------------------------- extra info


def test_get_extra_info(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        for tr in (ctr, spr.transport):
            sock = tr.get_extra_info("socket")
            assert sock is not None
            assert isinstance(sock.fileno(), int) and sock.fileno() >= 0
            assert sock.family == (socket.AF_INET if kind == "tcp" else socket.AF_UNIX)
            assert sock.type == socket.SOCK_STREAM
            assert tr.get_extra_info("sockname") == sock.getsockname()
            assert tr.get_extra_info("peername") == sock.getpeername()
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
            assert sock.get_inheritable() is False  # no fd leaks into children
            assert sock.gettimeout() == 0
            assert tr.get_extra_info("no-such-key") is None
            assert tr.get_extra_info("no-such-key", 42) == 42
            assert tr.get_extra_info("peercert") is None
            assert tr.get_extra_info("sslcontext") is None
        c_sock = ctr.get_extra_info("socket")
        s_sock = spr.transport.get_extra_info("socket")
        assert c_sock.fileno() != s_sock.fileno()
        assert ctr.get_extra_info("sockname") == spr.transport.get_extra_info("peername")
        assert ctr.get_extra_info("peername") == spr.transport.get_extra_info("sockname")
        if kind == "tcp":
            assert ctr.get_extra_info("peername") == srv.sockets[0].getsockname()
            assert ctr.get_extra_info("sockname")[0] == "127.0.0.1"
        else:
            assert ctr.get_extra_info("peername") == str(tmp_path / "s.sock")
            assert ctr.get_extra_info("sockname") == ""
        # the fd is the transport's: add_reader on it is refused
        with pytest.raises(RuntimeError, match="is used by transport"):
            loop.add_reader(c_sock.fileno(), lambda: None)
        with pytest.raises(RuntimeError, match="is used by transport"):
            loop.add_writer(c_sock.fileno(), lambda: None)
        with pytest.raises(RuntimeError, match="is used by transport"):
            loop.remove_reader(c_sock.fileno())
        await finish(srv, ctr)

    arun(loop, main())


def test_tcp_nodelay_is_set(loop):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, "tcp", None)
        for tr in (ctr, spr.transport):
            sock = tr.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        await finish(srv, ctr)

    arun(loop, main())


# ---------------------------------------------------------------- reading flow


def test_pause_resume_reading_idempotent(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        assert ctr.is_reading() is True
        ctr.pause_reading()
        ctr.pause_reading()
        assert ctr.is_reading() is False
        spr.transport.write(b"while-paused")
        await asyncio.sleep(0.1)
        assert cpr.events == ["made"]
        ctr.resume_reading()
        ctr.resume_reading()
        assert ctr.is_reading() is True
        await cpr.wait_bytes(12)
        assert bytes(cpr.data) == b"while-paused"
        ctr.close()
        assert ctr.is_reading() is False
        ctr.pause_reading()
        ctr.resume_reading()  # no effect once closing
        assert ctr.is_reading() is False
        await wait(cpr.lost)
        assert cpr.events == ["made", "data", "lost"]
        await close_server(srv)

    arun(loop, main())


def test_pause_reading_from_connection_made(loop, kind, tmp_path):
    async def main():
        srv, addr = await start_server(
            loop, kind, lambda: EchoProtocol(), tmp_path)

        def on_made(p):
            p.transport.pause_reading()
            assert not p.transport.is_reading()

        if kind == "tcp":
            tr, pr = await loop.create_connection(
                lambda: Recorder(loop, on_made=on_made), *addr)
        else:
            tr, pr = await loop.create_unix_connection(
                lambda: Recorder(loop, on_made=on_made), addr)
        assert not tr.is_reading()
        tr.write(b"echo me")
        await asyncio.sleep(0.1)
        assert pr.events == ["made"]  # echoed data waits in the kernel
        tr.resume_reading()
        await pr.wait_bytes(7)
        assert bytes(pr.data) == b"echo me"
        await finish(srv, tr)

    arun(loop, main())


def test_server_side_pause_reading_in_connection_made(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path,
            server=lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        ctr.write(b"123")
        ctr.write_eof()
        await asyncio.sleep(0.1)
        assert spr.events == ["made"]
        spr.transport.resume_reading()
        await wait(spr.lost)
        assert collapse(spr.events) == ["made", "data", "eof", "lost"]
        assert bytes(spr.data) == b"123"
        await finish(srv, ctr)

    arun(loop, main())


# ---------------------------------------------------------------- buffer limits


def test_write_buffer_limits(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        assert ctr.get_write_buffer_limits() == (16384, 65536)
        assert ctr.get_write_buffer_size() == 0
        ctr.set_write_buffer_limits(high=100)
        assert ctr.get_write_buffer_limits() == (25, 100)
        ctr.set_write_buffer_limits(low=10)
        assert ctr.get_write_buffer_limits() == (10, 40)
        ctr.set_write_buffer_limits(high=7, low=7)
        assert ctr.get_write_buffer_limits() == (7, 7)
        ctr.set_write_buffer_limits(0, 0)
        assert ctr.get_write_buffer_limits() == (0, 0)
        ctr.set_write_buffer_limits()
        assert ctr.get_write_buffer_limits() == (16384, 65536)
        with pytest.raises(ValueError, match=r"^high \(10\) must be >= low \(20\) must be >= 0$"):
            ctr.set_write_buffer_limits(high=10, low=20)
        with pytest.raises(ValueError, match=r"^high \(-4\) must be >= low \(-1\) must be >= 0$"):
            ctr.set_write_buffer_limits(high=-4)
        assert ctr.get_write_buffer_limits() == (16384, 65536)  # unchanged
        assert cpr.events == ["made"]  # nothing buffered -> no pause
        await finish(srv, ctr)

    arun(loop, main())


def test_write_buffer_limits_accept_floats(loop, kind, tmp_path):
    """asyncio does plain arithmetic on the limits: floats are kept as is."""
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        ctr.set_write_buffer_limits(high=100.0)
        assert ctr.get_write_buffer_limits() == (25.0, 100.0)
        ctr.write(b"x" * 10)
        await spr.wait_bytes(10)
        assert cpr.events == ["made"]
        await finish(srv, ctr)

    arun(loop, main())


# ---------------------------------------------------------------- set_protocol


def test_set_protocol_switches_mid_stream(loop, kind, tmp_path):
    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        spr.transport.write(b"one")
        await cpr.wait_bytes(3)
        second = Recorder(loop)
        ctr.set_protocol(second)
        assert ctr.get_protocol() is second
        spr.transport.write(b"two")
        await second.wait_bytes(3)
        spr.transport.close()
        await wait(second.lost)
        assert cpr.events == ["made", "data"]
        assert bytes(cpr.data) == b"one"
        # set_protocol does not call connection_made on the new protocol
        assert second.events == ["data", "eof", "lost"]
        assert bytes(second.data) == b"two"
        await close_server(srv)

    arun(loop, main())


def test_protocol_methods_looked_up_at_call_time(loop, kind, tmp_path):
    """asyncio calls self._protocol.data_received(...) by attribute each
    time: a protocol may swap its handlers by assigning instance attributes
    (a common state-machine idiom), even from connection_made."""
    got = []

    class Switching(asyncio.Protocol):
        def connection_made(self, tr):
            self.transport = tr
            self.data_received = self.header  # before any data arrives

        def header(self, data):
            got.append(("header", data))
            self.data_received = self.body

        def body(self, data):
            got.append(("body", data))

        def data_received(self, data):  # never used
            got.append(("class", data))

    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path, server=Switching)
        ctr.write(b"H")
        await wait_until(lambda: len(got) == 1)
        ctr.write(b"B1")
        await wait_until(lambda: len(got) == 2)
        ctr.write(b"B2")
        await wait_until(lambda: len(got) == 3)
        assert got == [("header", b"H"), ("body", b"B1"), ("body", b"B2")]
        await finish(srv, ctr, spr.transport)

    arun(loop, main())


def test_set_protocol_to_buffered_mid_stream(loop, kind, tmp_path):
    class Buf(asyncio.BufferedProtocol):
        def __init__(self):
            self.events = []
            self.buf = bytearray(4)
            self.data = bytearray()
            self.lost = loop.create_future()

        def get_buffer(self, sizehint):
            self.events.append("get_buffer")
            return self.buf

        def buffer_updated(self, n):
            self.events.append("updated")
            self.data += self.buf[:n]

        def eof_received(self):
            self.events.append("eof")

        def connection_lost(self, exc):
            self.events.append("lost")
            self.lost.set_result(exc)

    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path)
        spr.transport.write(b"one")
        await cpr.wait_bytes(3)
        b = Buf()
        ctr.set_protocol(b)
        spr.transport.write(b"0123456789")
        spr.transport.close()
        assert await wait(b.lost) is None
        assert bytes(b.data) == b"0123456789"
        assert b.events[-2:] == ["eof", "lost"]
        assert b.events.count("updated") >= 3  # 4-byte buffer
        assert bytes(cpr.data) == b"one"
        await close_server(srv)

    arun(loop, main())


# ---------------------------------------------------------------- fds


def test_no_fd_leak_full_cycle(loop, kind, tmp_path):
    async def cycle():
        srv, ctr, cpr, spr = await pair(
            loop, kind, tmp_path, server=lambda: EchoProtocol())
        for i in range(5):
            ctr.write(b"ping%d" % i)
        await cpr.wait_bytes(25)
        ctr.close()
        await wait(cpr.lost)
        await close_server(srv)
        for _ in range(5):
            await asyncio.sleep(0)

    arun(loop, cycle())  # warm up lazily created fds (executor, self-pipe...)
    before = open_fds()
    for _ in range(3):
        arun(loop, cycle())
    fd_leak_check(before)


def test_write_non_contiguous_buffer(loop):
    """A strided memoryview: asyncio's first send() raises BufferError, a
    fatal write error (handler, connection_lost(BufferError)); write() itself
    does not raise."""
    a, b = socket.socketpair()
    calls = []
    loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))

    async def main():
        lost = loop.create_future()

        class P(asyncio.Protocol):
            def connection_lost(self, exc):
                lost.set_result(exc)

        tr, _ = await loop.create_connection(P, sock=a)
        tr.write(memoryview(b"abcdef")[::2])
        exc = await asyncio.wait_for(lost, 5)
        assert isinstance(exc, BufferError), repr(exc)
        assert [c["message"] for c in calls] == [
            "Fatal write error on socket transport"]

    try:
        loop.run_until_complete(main())
    finally:
        b.close()


# ------------------------------------------- readers queued, then taken away
# tideloop queues a transport's C reader where asyncio queues its reader
# Handle; these check that it is skipped or kept exactly when asyncio skips
# or keeps the Handle.


class Paired(asyncio.Protocol):
    """Records its data_received in `log`; `on_data` runs after each."""

    def __init__(self, name, log, on_data=None):
        self.name, self.log, self.on_data = name, log, on_data

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.log.append(self.name)
        if self.on_data is not None:
            self.on_data(self)


async def two_readable_transports(loop, log, on_data):
    """Two accepted-socket transports whose peers have both written, so that
    one poll reports both.  Returns the protocols and the sockets."""
    a1, a2 = socket.socketpair()
    b1, b2 = socket.socketpair()
    pa = Paired("a", log, on_data)
    pb = Paired("b", log, on_data)
    pa.other, pb.other = pb, pa
    await loop.connect_accepted_socket(lambda: pa, a1)
    await loop.connect_accepted_socket(lambda: pb, b1)
    await asyncio.sleep(0)
    await asyncio.sleep(0)      # both readers armed
    a2.send(b"x")
    b2.send(b"y")
    return pa, pb, [a1, a2, b1, b2]


async def close_all(transports, socks):
    for tr in transports:
        tr.close()
    await asyncio.sleep(0)
    for s in socks:
        s.close()


def test_reader_paused_after_its_event_was_queued_is_skipped(loop):
    """The first data_received pauses the other transport, whose event was
    reported by the same poll: its data is not delivered (asyncio: its
    reader Handle was cancelled)."""
    async def main():
        log = []
        pa, pb, socks = await two_readable_transports(
            loop, log, lambda p: p.other.transport.pause_reading())
        await asyncio.sleep(0.05)
        assert len(log) == 1
        await close_all([pa.transport, pb.transport], socks)

    arun(loop, main())


def test_reader_rearmed_after_its_event_was_queued_runs_an_iteration_later(loop):
    """pause_reading() + resume_reading() on the other transport, whose
    event is already queued: asyncio cancels the queued Handle and arms a
    new one, so the data comes after what the first callback scheduled with
    call_soon (the next poll reports the fd again)."""
    async def main():
        log = []

        def on_data(p):
            if len(log) == 1:
                p.other.transport.pause_reading()
                p.other.transport.resume_reading()
                loop.call_soon(log.append, "soon")

        pa, pb, socks = await two_readable_transports(loop, log, on_data)
        await asyncio.sleep(0.05)
        assert log[1:] == ["soon", "b" if log[0] == "a" else "a"]
        await close_all([pa.transport, pb.transport], socks)

    arun(loop, main())


def test_selector_key_of_a_transport_shows_its_reader(loop):
    """loop._selector.get_key(fd) of a reading transport: a reader Handle
    whose callback is the transport's _read_ready, no writer; none while
    paused."""
    async def main():
        a1, a2 = socket.socketpair()
        tr, _ = await loop.connect_accepted_socket(asyncio.Protocol, a1)
        await asyncio.sleep(0)
        reader, writer = loop._selector.get_key(a1.fileno()).data
        assert reader._callback == tr._read_ready
        assert writer is None
        tr.pause_reading()
        with pytest.raises(KeyError):
            loop._selector.get_key(a1.fileno())
        await close_all([tr], [a2])

    arun(loop, main())


def test_reader_armed_again_takes_the_new_context(loop):
    """resume_reading() inside connection_made arms the reader in
    connection_made's context; the transport's own start of reading, which
    runs next, arms it again in its context, and that is the one
    data_received sees (asyncio's add_reader replaces the Handle).  3.15+:
    the reader always runs in the connection's context, which
    connection_made set the variable in."""
    import contextvars
    var = contextvars.ContextVar("var", default="unset")

    class P(asyncio.Protocol):
        seen = None

        def connection_made(self, transport):
            var.set("connection_made")
            transport.pause_reading()
            transport.resume_reading()
            self.transport = transport

        def data_received(self, data):
            self.seen = var.get()

    async def main():
        a1, a2 = socket.socketpair()
        p = P()
        await loop.connect_accepted_socket(lambda: p, a1)
        a2.send(b"x")
        await wait_until(lambda: p.seen is not None)
        assert p.seen == ("connection_made" if sys.version_info >= (3, 15)
                          else "unset")
        await close_all([p.transport], [a2])

    arun(loop, main())


# ---------------------------------------------------------------- reads


READ_SIZES = [1000, 1000, 900, 1000, 600, 4000, 3500, 3900, 700, 12000, 11000, 9000, 1000]
# Repeated, exactly a quarter larger than the one before (the room a loop
# may give a read it keeps), larger still, smaller, then large ones.
LET_GO_SIZES = [1000, 1000, 1250, 1250, 1300, 1000, 800, 5000, 600, 600, 16000, 20000,
                1000, 1000]


def test_reads_let_go_of_arrive_whole_whatever_their_sizes(loop, kind, tmp_path):
    """A protocol that keeps nothing gets every byte once and in order, each
    read a bytes object of its own length and hash, as the sizes repeat,
    grow and shrink."""
    seen = []

    class LetGo(asyncio.Protocol):
        def connection_made(self, tr):
            self.transport = tr

        def data_received(self, data):
            seen.append((type(data), bytes(bytearray(data)), len(data),
                         hash(data) == hash(bytes(bytearray(data)))))
            self.transport.write(len(data).to_bytes(4, "big"))

    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path, server=LetGo)
        sent = b""
        for n, size in enumerate(LET_GO_SIZES):
            chunk = bytes((n + i) % 256 for i in range(size))
            sent += chunk
            ctr.write(chunk)
            await wait_until(lambda: sum(c[2] for c in seen) == len(sent))
        assert b"".join(c for _, c, _, _ in seen) == sent
        assert all(t is bytes and len(c) == n and same for t, c, n, same in seen)
        await finish(srv, ctr, spr.transport)

    arun(loop, main())


def test_each_read_is_a_bytes_object_of_its_own(loop, kind, tmp_path):
    """Reads a protocol keeps stay as they arrived whatever comes after them,
    and every read is a fresh bytes object to the protocol: its hash is its
    own, whether the protocol kept the previous ones or let them go."""
    keep, seen = [], []

    class Keeper(asyncio.Protocol):
        def connection_made(self, tr):
            self.transport = tr

        def data_received(self, data):
            i = len(seen)
            copy = bytes(bytearray(data))
            seen.append((type(data), copy, hash(data) == hash(copy)))
            if i % 3 == 0:
                keep.append((data, copy))
            self.transport.write(len(data).to_bytes(4, "big"))

    async def main():
        srv, ctr, cpr, spr = await pair(loop, kind, tmp_path, server=Keeper)
        sent = b""
        for n, size in enumerate(READ_SIZES):
            chunk = bytes([n + 1]) * size
            sent += chunk
            ctr.write(chunk)
            await wait_until(lambda: sum(len(c) for _, c, _ in seen) == len(sent))
        assert b"".join(c for _, c, _ in seen) == sent
        assert all(t is bytes for t, _, _ in seen)
        assert all(same_hash for _, _, same_hash in seen)
        assert keep and all(data == copy for data, copy in keep)
        await finish(srv, ctr, spr.transport)

    arun(loop, main())
