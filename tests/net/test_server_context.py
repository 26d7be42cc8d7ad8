"""The context a server's connections run in, per interpreter version.

A variable is set to "at-create" before the server is made and to
"at-start" before it starts serving (``start_serving=False``, then
``start_serving()``); the client connects from yet another value.  What the
server side sees:

- 3.11-3.14: an accepted connection starts from a copy of the context in
  which serving started (the accept reader's Handle took it): "at-start".
  Each callback runs in its own copy, so what connection_made sets is not
  seen by data_received -- except behind TLS, where asyncio's SSLProtocol
  calls the app's callbacks from the socket reader's, which share one
  context.
- 3.15+: a Server copies the context it was created in, and each accepted
  connection runs in a copy of that: "at-create", in the protocol factory,
  every protocol callback, the streams handler task and the TLS handshake;
  what connection_made sets, the later callbacks see.

Plain TCP, TLS (every route of tideloop's C TLS transport) and a streams
server with its handler task; each on stock asyncio and on tideloop."""
import asyncio
import contextvars
import sys

import pytest

from net_helpers import arun, close_server, wait, wait_until
from tls_helpers import TLS_ROUTES, client_context, server_context

var = contextvars.ContextVar("server_ctx_var", default="unset")
SERVER_CONTEXT = sys.version_info >= (3, 15)


class Seen(asyncio.Protocol):
    """Records the variable in each server-side callback; connection_made
    sets it, so the later ones show whether they share its context."""

    def __init__(self, seen):
        self.seen = seen
        seen.append(("factory", var.get()))

    def connection_made(self, transport):
        self.transport = transport
        self.seen.append(("made", var.get()))
        var.set("set-in-made")

    def data_received(self, data):
        self.seen.append(("data", var.get()))
        self.transport.write(data)

    def eof_received(self):
        self.seen.append(("eof", var.get()))

    def connection_lost(self, exc):
        self.seen.append(("lost", var.get()))


async def serve_one(loop, seen, ssl=None):
    var.set("at-create")
    srv = await loop.create_server(lambda: Seen(seen), "127.0.0.1", 0, ssl=ssl,
                                   start_serving=False)
    var.set("at-start")
    await srv.start_serving()
    var.set("client")
    kw = {"ssl": client_context(), "server_hostname": "localhost"} if ssl else {}
    r, w = await wait(asyncio.open_connection(*srv.sockets[0].getsockname(), **kw))
    w.write(b"ping")
    assert await wait(r.readexactly(4)) == b"ping"
    w.close()
    await wait_until(lambda: any(name == "lost" for name, _ in seen))
    await close_server(srv)
    assert var.get() == "client"    # nothing leaked into the caller


def expected(tls):
    if SERVER_CONTEXT:
        return [("factory", "at-create"), ("made", "at-create"),
                ("data", "set-in-made"), ("eof", "set-in-made"),
                ("lost", "set-in-made")]
    if tls:
        # SSLProtocol calls the app's callbacks from the reader's own (the
        # peer's close_notify ends the connection there too).
        return [("factory", "at-start"), ("made", "at-start"),
                ("data", "set-in-made"), ("eof", "set-in-made"),
                ("lost", "set-in-made")]
    return [("factory", "at-start"), ("made", "at-start"), ("data", "at-start"),
            ("eof", "at-start"), ("lost", "at-start")]


def test_tcp_server_callbacks(loop):
    seen = []
    arun(loop, serve_one(loop, seen))
    assert seen == expected(tls=False)


@pytest.fixture(params=[None, *TLS_ROUTES], ids=["default", *TLS_ROUTES])
def route(request, loop_name):
    """tideloop's TLS route (asyncio: the default run only)."""
    if request.param is None:
        yield None
        return
    if loop_name != "tideloop":
        pytest.skip("TLS routes are tideloop's")
    from tideloop import _core
    if request.param not in _core.tls_routes:
        pytest.skip(f"TLS route {request.param!r} not available here")
    previous = _core.set_tls_route(request.param)
    try:
        yield request.param
    finally:
        _core.set_tls_route(previous)


def test_tls_server_callbacks(loop, route):
    seen = []
    arun(loop, serve_one(loop, seen, ssl=server_context()))
    assert seen == expected(tls=True)


def test_streams_handler_task(loop):
    seen = []

    async def handler(reader, writer):
        seen.append(("handler", var.get()))
        var.set("set-in-handler")
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()
        seen.append(("handler-end", var.get()))

    async def main():
        var.set("at-create")
        srv = await asyncio.start_server(handler, "127.0.0.1", 0, start_serving=False)
        var.set("at-start")
        await srv.start_serving()
        var.set("client")
        r, w = await wait(asyncio.open_connection(*srv.sockets[0].getsockname()))
        w.write(b"ping")
        assert await wait(r.readexactly(4)) == b"ping"
        await wait_until(lambda: len(seen) == 2)
        w.close()
        await close_server(srv)
        assert var.get() == "client"

    arun(loop, main())
    assert seen == [("handler", "at-create" if SERVER_CONTEXT else "at-start"),
                    ("handler-end", "set-in-handler")]


def test_client_connection_callbacks(loop):
    """create_connection: 3.15+ runs every callback of the connection in one
    copy of the caller's context; before, each in a copy of its own."""
    seen = []

    class Client(asyncio.Protocol):
        def connection_made(self, transport):
            seen.append(("made", var.get()))
            var.set("set-in-made")

        def data_received(self, data):
            seen.append(("data", var.get()))

        def connection_lost(self, exc):
            seen.append(("lost", var.get()))

    async def main():
        srv = await loop.create_server(lambda: Seen([]), "127.0.0.1", 0)
        var.set("at-connect")
        tr, _ = await wait(loop.create_connection(Client, *srv.sockets[0].getsockname()))
        var.set("caller")
        tr.write(b"x")
        await wait_until(lambda: len(seen) == 2)
        tr.close()
        await wait_until(lambda: len(seen) == 3)
        await close_server(srv)

    arun(loop, main())
    if SERVER_CONTEXT:
        assert seen == [("made", "at-connect"), ("data", "set-in-made"),
                        ("lost", "set-in-made")]
    else:
        assert seen == [("made", "at-connect"), ("data", "at-connect"),
                        ("lost", "caller")]


@pytest.mark.skipif(not SERVER_CONTEXT, reason="3.15+: _add_reader(context=)")
def test_internal_add_reader_runs_in_the_given_context(loop):
    """3.15's transports arm their readers with _add_reader(..., context=):
    the callback runs in that very Context (not a copy), every time."""
    import socket

    var.set("in-ctx")
    ctx = contextvars.copy_context()
    seen = []

    def on_readable(sock):
        sock.recv(16)
        seen.append(var.get())
        var.set("set-in-reader")

    async def main():
        a, b = socket.socketpair()
        a.setblocking(False)
        try:
            loop._add_reader(a.fileno(), on_readable, a, context=ctx)
            for _ in range(2):
                b.send(b"x")
                n = len(seen)
                await wait_until(lambda: len(seen) > n)
            loop._remove_reader(a.fileno())
        finally:
            a.close()
            b.close()

    var.set("outside")
    arun(loop, main())
    assert seen == ["in-ctx", "set-in-reader"]
    assert ctx[var] == "set-in-reader"
