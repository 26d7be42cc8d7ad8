"""Faults on stream transports: peer resets (RST) while reading and while
writing, writes into a reset connection, closing the loop with live
transports.  The peer is a plain blocking socket driven from a thread, so the
fault does not depend on the loop under test."""
import asyncio
import gc
import logging
import socket
import warnings

import pytest

from net_helpers import (
    Recorder, arun, close_server, fd_leak_check, open_fds, rst_close,
    start_server, wait, wait_until,
)


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s
    s.close()


async def connect_raw_peer(loop, listener, factory):
    accept = loop.run_in_executor(None, listener.accept)
    tr, pr = await loop.create_connection(factory, *listener.getsockname())
    peer, _ = await wait(accept)
    peer.settimeout(5)
    return tr, pr, peer


def _handler(loop):
    calls = []
    loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
    return calls


def test_peer_reset_mid_read(loop, listener):
    async def main():
        calls = _handler(loop)
        tr, pr, peer = await connect_raw_peer(loop, listener, lambda: Recorder(loop))
        peer.sendall(b"r" * 65536)
        await pr.wait_bytes(65536)
        rst_close(peer)
        exc = await wait(pr.lost)
        assert isinstance(exc, ConnectionResetError), repr(exc)
        assert pr.events == ["made", "data", "lost"]
        assert tr.is_closing()
        assert calls == []  # OSErrors are not reported to the handler
        # writes after the reset are silently dropped
        tr.write(b"after")
        tr.close()

    arun(loop, main())


def test_reset_logged_at_debug_level_in_debug_mode(loop, listener, caplog):
    """In debug mode asyncio logs OSErrors of the transport at DEBUG level
    ('<transport>: Fatal read error on socket transport', with exc_info);
    the exception handler is still not called."""
    loop.set_debug(True)

    async def main():
        calls = _handler(loop)
        tr, pr, peer = await connect_raw_peer(loop, listener, lambda: Recorder(loop))
        rst_close(peer)
        exc = await wait(pr.lost)
        assert isinstance(exc, ConnectionResetError)
        assert calls == []

    try:
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            arun(loop, main())
    finally:
        loop.set_debug(False)
    recs = [r for r in caplog.records
            if r.getMessage().endswith(": Fatal read error on socket transport")]
    assert len(recs) == 1, [r.getMessage() for r in caplog.records]
    assert recs[0].levelno == logging.DEBUG
    assert recs[0].exc_info and isinstance(recs[0].exc_info[1], ConnectionResetError)


def test_peer_reset_mid_write(loop, listener):
    """Reading paused, a large write pending, the peer resets: the write path
    reports the reset; the buffer is dropped; connection_lost gets it."""
    async def main():
        calls = _handler(loop)
        tr, pr, peer = await connect_raw_peer(
            loop, listener, lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        tr.write(b"w" * (16 << 20))
        assert tr.get_write_buffer_size() > 0
        assert pr.events == ["made", "pause"]
        await asyncio.sleep(0.05)
        rst_close(peer)
        exc = await wait(pr.lost)
        assert isinstance(exc, ConnectionResetError), repr(exc)
        assert pr.events == ["made", "pause", "lost"]
        assert tr.get_write_buffer_size() == 0
        assert calls == []
        tr.write(b"x")  # no exception
        tr.close()

    arun(loop, main())


def test_write_into_reset_connection(loop, listener):
    """The direct-send path of write() hits the reset: connection_lost with
    the error, on a later loop iteration; write() itself does not raise."""
    async def main():
        calls = _handler(loop)
        tr, pr, peer = await connect_raw_peer(
            loop, listener, lambda: Recorder(loop, on_made=lambda p: p.transport.pause_reading()))
        rst_close(peer)
        await asyncio.sleep(0.05)
        tr.write(b"doomed")
        assert pr.events == ["made"]  # deferred
        exc = await wait(pr.lost)
        assert isinstance(exc, ConnectionResetError), repr(exc)
        assert pr.events == ["made", "lost"]
        assert tr.is_closing()
        assert calls == []
        tr.close()

    arun(loop, main())


def test_peer_closes_while_we_write(loop, listener):
    """The peer closes normally (FIN) while data is still arriving at it:
    it has unread data, so the kernel sends RST; we end up with exactly one
    connection_lost carrying a ConnectionError."""
    async def main():
        tr, pr, peer = await connect_raw_peer(loop, listener, lambda: Recorder(loop))
        tr.write(b"w" * (8 << 20))
        await asyncio.sleep(0.02)
        peer.close()
        exc = await wait(pr.lost)
        assert isinstance(exc, ConnectionError), repr(exc)
        assert pr.events.count("lost") == 1 and pr.events[-1] == "lost"
        tr.close()

    arun(loop, main())


def test_close_loop_with_live_transports(new_loop, tmp_path):
    """Closing a loop with open transports and a server works; no protocol
    callback runs afterwards; the transports' finalizers warn
    'unclosed transport' and release the fds."""
    loop = new_loop()
    before = open_fds()
    state = {}

    async def main():
        srv, addr = await start_server(loop, "tcp", lambda: Recorder(loop))
        tr, pr = await loop.create_connection(lambda: Recorder(loop), *addr)
        userv, uaddr = await start_server(loop, "unix", lambda: Recorder(loop), tmp_path)
        utr, upr = await loop.create_unix_connection(lambda: Recorder(loop), uaddr)
        tr.write(b"pending")
        await asyncio.sleep(0.05)
        # keep only the event lists: the protocols reference the transports
        state.update(events=[pr.events, upr.events])
        srv.close()
        userv.close()
        return tr, utr

    tr, utr = loop.run_until_complete(main())
    loop.close()
    assert loop.is_closed()
    events = state["events"]
    assert events == [["made"], ["made"]]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        del tr, utr, state
        for _ in range(3):
            gc.collect()
    msgs = [str(x.message) for x in w if issubclass(x.category, ResourceWarning)]
    assert sum("unclosed transport" in m for m in msgs) >= 2, msgs
    assert events == [["made"], ["made"]]  # no late callbacks
    fd_leak_check(before, collect=True)


def test_connection_lost_exactly_once_under_faults(loop, listener):
    """abort() racing with a reset: still one connection_lost."""
    async def main():
        tr, pr, peer = await connect_raw_peer(loop, listener, lambda: Recorder(loop))
        rst_close(peer)
        await asyncio.sleep(0.05)
        tr.abort()
        tr.close()
        await wait(pr.lost)
        for _ in range(5):
            await asyncio.sleep(0)
        assert pr.events.count("lost") == 1

    arun(loop, main())
