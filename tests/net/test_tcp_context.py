"""Which contextvars.Context protocol callbacks run in (asyncio's rules):

- server-side callbacks see the context current when create_server ran,
  client-side ones the context current when create_connection ran;
- 3.11-3.14: connection_made and the read callbacks run in different
  copies; data_received / eof_received of one connection share one context
  (what one call sets, the next one sees), separate from other
  connections'; connection_lost runs in the context of whoever called
  close();
- 3.15+: every callback of a connection runs in one context of its own (a
  copy of the server's context per accepted connection, of the caller's
  for create_connection): what connection_made sets, data_received sees,
  and connection_lost runs there too, whoever called close()."""
import asyncio
import contextvars
import sys

import pytest

from net_helpers import arun, close_server, wait, wait_until

var = contextvars.ContextVar("tcp_ctx_var", default="unset")
PER_CONNECTION = sys.version_info >= (3, 15)


@pytest.fixture(params=["tcp", "unix"])
def kind(request):
    return request.param


class P(asyncio.Protocol):
    def __init__(self, name, seen, echo=False):
        self.name, self.seen, self.echo = name, seen, echo
        self.n = 0

    def connection_made(self, tr):
        self.tr = tr
        self.seen.append((self.name, "made", var.get()))
        var.set(self.name + "-made")

    def data_received(self, data):
        self.n += 1
        self.seen.append((self.name, "data%d" % self.n, var.get()))
        var.set("%s-data%d" % (self.name, self.n))
        if self.echo:
            self.tr.write(data)

    def eof_received(self):
        self.seen.append((self.name, "eof", var.get()))

    def connection_lost(self, exc):
        self.seen.append((self.name, "lost", var.get()))


def test_protocol_callback_contexts(loop, kind, tmp_path):
    seen = []

    async def main():
        var.set("at-create-server")
        if kind == "tcp":
            srv = await loop.create_server(lambda: P("s", seen, echo=True), "127.0.0.1", 0)
            addr = srv.sockets[0].getsockname()
        else:
            addr = str(tmp_path / "ctx.sock")
            srv = await loop.create_unix_server(lambda: P("s", seen, echo=True), addr)
        var.set("at-create-connection")
        if kind == "tcp":
            tr, pr = await loop.create_connection(lambda: P("c", seen), *addr)
        else:
            tr, pr = await loop.create_unix_connection(lambda: P("c", seen), addr)
        var.set("in-main")
        await wait_until(lambda: ("s", "made", "at-create-server") in seen)
        tr.write(b"a")
        await wait_until(lambda: pr.n == 1)
        tr.write(b"b")
        await wait_until(lambda: pr.n == 2)
        tr.close()
        await wait_until(lambda: sum(1 for x in seen if x[1] == "lost") == 2)
        await close_server(srv)
        assert var.get() == "in-main"  # nothing leaked into the task

    arun(loop, main())
    if PER_CONNECTION:
        expected = [
            ("s", "made", "at-create-server"),
            ("c", "made", "at-create-connection"),
            ("s", "data1", "s-made"),
            ("c", "data1", "c-made"),
            ("s", "data2", "s-data1"),
            ("c", "data2", "c-data1"),
            ("c", "lost", "c-data2"),    # in the connection's own context
            ("s", "eof", "s-data2"),
            ("s", "lost", "s-data2"),
        ]
    else:
        expected = [
            ("s", "made", "at-create-server"),
            ("c", "made", "at-create-connection"),
            ("s", "data1", "at-create-server"),
            ("c", "data1", "at-create-connection"),
            ("s", "data2", "s-data1"),
            ("c", "data2", "c-data1"),
            ("c", "lost", "in-main"),    # close() called from main
            ("s", "eof", "s-data2"),
            ("s", "lost", "s-data2"),    # closed from eof handling in the reader
        ]
    assert sorted(seen) == sorted(expected)


def test_connections_do_not_share_read_context(loop):
    seen = []

    async def main():
        var.set("base")
        srv = await loop.create_server(lambda: P("s", seen), "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        conns = []
        for i in range(2):
            conns.append(await loop.create_connection(asyncio.Protocol, *addr))
        await wait_until(lambda: sum(1 for x in seen if x[1] == "made") == 2)
        conns[0][0].write(b"1")
        await wait_until(lambda: sum(1 for x in seen if x[1] == "data1") == 1)
        conns[1][0].write(b"2")
        await wait_until(lambda: sum(1 for x in seen if x[1] == "data1") == 2)
        for tr, _ in conns:
            tr.close()
        await wait_until(lambda: sum(1 for x in seen if x[1] == "lost") == 2)
        await close_server(srv)

    arun(loop, main())
    data = [x for x in seen if x[1] == "data1"]
    # the second connection does not see what the first one's data_received
    # set (3.15+: each sees what its own connection_made set)
    before = "s-made" if PER_CONNECTION else "base"
    assert data == [("s", "data1", before), ("s", "data1", before)]
