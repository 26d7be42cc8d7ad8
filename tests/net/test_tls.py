"""TLS end to end (issue 12): echo over create_server/create_connection with
Protocol and BufferedProtocol and over streams, at 1 B, 16 KiB and 1 MiB; many
writes and writelines; no half-close; get_extra_info(); SNI seen by a server
sni_callback (and a certificate chosen by it); ALPN; keylog_filename; TLS 1.2
and 1.3; session tickets and the server context's statistics.

Every test runs on stock asyncio (the spec) and on tideloop, once per TLS route
(the ``tls_route`` fixture, tests/net/conftest.py)."""
import asyncio
import socket
import ssl

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, collapse, fd_leak_check, open_fds,
    wait, wait_until,
)
from tls_helpers import (
    SERVER_ECDSA, SERVER_RSA, BufferedRecorder, cert_der, client_context,
    handler_calls, server_context,
)

pytestmark = pytest.mark.usefixtures("tls_route")

SIZES = [1, 16 << 10, 1 << 20]
SIZE_IDS = ["1B", "16KiB", "1MiB"]


def payload(n):
    return bytes(i * 7 % 251 for i in range(min(n, 251))) * (n // 251) + bytes(
        i * 7 % 251 for i in range(n % 251))


async def tls_server(loop, factory, ctx=None, **kw):
    srv = await loop.create_server(factory, "127.0.0.1", 0, ssl=ctx or server_context(), **kw)
    return srv, srv.sockets[0].getsockname()


async def tls_connect(loop, factory, addr, ctx=None, **kw):
    kw.setdefault("server_hostname", "localhost")
    return await wait(loop.create_connection(factory, *addr, ssl=ctx or client_context(), **kw))


def tls_echo_recorder(loop, accepted):
    """Server side: a Recorder that echoes what it gets."""
    def factory():
        p = Recorder(loop, on_data=lambda p, d: p.transport.write(d))
        accepted.append(p)
        return p
    return factory


# ---------------------------------------------------------------- echo

@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_echo_protocol(loop, size):
    data = payload(size)

    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted))
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        assert pr.events == ["made"]
        tr.write(data)
        assert await pr.wait_bytes(size) == data
        assert pr.data_types == {bytes}
        tr.close()
        assert await wait(pr.lost) is None
        (sp,) = accepted
        assert await wait(sp.lost) is None
        assert bytes(sp.data) == data
        # The closing side's eof_received() runs too, when the peer's
        # close_notify answers its own.
        assert collapse(pr.events) == ["made", "data", "eof", "lost"]
        assert collapse(sp.events) == ["made", "data", "eof", "lost"]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_echo_buffered_protocol(loop, size):
    data = payload(size)

    async def main():
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted))
        tr, pr = await tls_connect(loop, lambda: BufferedRecorder(loop), addr)
        tr.write(data)
        assert await pr.wait_bytes(size) == data
        assert sum(pr.updates) == size and all(n > 0 for n in pr.updates)
        assert all(isinstance(h, int) for h in pr.hints)
        tr.close()
        assert await wait(pr.lost) is None
        assert collapse(pr.events) == ["made", "data", "eof", "lost"]
        await close_server(srv)

    arun(loop, main())


def test_buffered_protocol_small_buffer(loop):
    """A BufferedProtocol whose buffer is smaller than a TLS record still
    gets every byte, in pieces no larger than its buffer."""
    data = payload(64 << 10)

    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await tls_connect(loop, lambda: BufferedRecorder(loop, bufsize=100), addr)
        tr.write(data)
        assert await pr.wait_bytes(len(data)) == data
        assert max(pr.updates) <= 100 and len(pr.updates) >= len(data) // 100
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_buffered_protocol_bytearray_buffer(request, loop, loop_name, tls_route):
    """get_buffer() may return any writable buffer, a bytearray too.  asyncio's
    SSLProtocol reads the second and later records of one batch into
    ``buf[offset:]``, which for a bytearray is a copy: buffer_updated() is told
    the full count but the buffer holds NULs there (CPython gh-156275, open).
    tideloop's TLS routes must deliver the bytes; the stock loop, and tideloop
    while it still runs asyncio's SSLProtocol (no route), carry the bug."""
    if loop_name == "asyncio" or tls_route is None:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=(
            "asyncio's SSLProtocol loses data read into a bytearray from "
            "get_buffer() (CPython gh-156275)")))
    data = payload(256 << 10)

    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await tls_connect(loop, lambda: BufferedRecorder(loop, view=False), addr)
        tr.write(data)
        got = await pr.wait_bytes(len(data))
        tr.close()
        await wait(pr.lost)
        await close_server(srv)
        assert got == data

    arun(loop, main())


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_echo_streams(loop, size):
    data = payload(size)
    server_seen = []

    async def handler(reader, writer):
        server_seen.append(writer.get_extra_info("ssl_object") is not None)
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
        server_seen.append("eof")
        writer.close()
        await writer.wait_closed()

    async def main():
        srv = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context())
        addr = srv.sockets[0].getsockname()
        reader, writer = await wait(asyncio.open_connection(
            *addr, ssl=client_context(), server_hostname="localhost"))
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.3", "TLSv1.2")
        writer.write(data)
        await wait(writer.drain())
        assert await wait(reader.readexactly(size)) == data
        assert not writer.can_write_eof()
        with pytest.raises(NotImplementedError):
            writer.write_eof()
        writer.close()
        await wait(writer.wait_closed())
        assert await wait(reader.read()) == b""
        assert reader.at_eof()
        await wait_until(lambda: "eof" in server_seen)
        assert server_seen == [True, "eof"]
        srv.close()
        await wait(srv.wait_closed())

    arun(loop, main())


def test_many_writes_and_writelines(loop):
    pieces = [b"%05d," % i for i in range(2000)]
    expected = b"".join(pieces) * 2 + b"abcdefghi"

    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        for p in pieces:
            tr.write(p)
        tr.writelines(pieces)
        tr.writelines([b"abc", bytearray(b"def"), memoryview(b"ghi")])
        tr.writelines(iter([]))
        tr.write(b"")
        assert await pr.wait_bytes(len(expected)) == expected
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_write_copies_mutable_data(loop):
    """A bytearray changed after write() goes out as it was at the call."""
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        buf = bytearray(b"before")
        tr.write(buf)
        buf[:] = b"AFTER!"
        assert await pr.wait_bytes(6) == b"before"
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_write_rejects_non_bytes(loop):
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        with pytest.raises(TypeError, match=r"^data: expecting a bytes-like instance, got str$"):
            tr.write("text")
        with pytest.raises(TypeError, match=r"^data: expecting a bytes-like instance, got int$"):
            tr.write(1)
        tr.write(b"ok")
        assert await pr.wait_bytes(2) == b"ok"
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_no_half_close(loop):
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        assert tr.can_write_eof() is False
        with pytest.raises(NotImplementedError):
            tr.write_eof()
        # the connection is still usable
        tr.write(b"still here")
        assert await pr.wait_bytes(10) == b"still here"
        assert not tr.is_closing()
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3],
                         ids=["TLSv1.2", "TLSv1.3"])
def test_protocol_versions(loop, version):
    async def main():
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted))
        ctx = client_context(max_version=version)
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, ctx)
        obj = tr.get_extra_info("ssl_object")
        assert obj.version() == version.name.replace("_", ".")
        tr.write(b"x" * 100_000)
        assert await pr.wait_bytes(100_000) == b"x" * 100_000
        assert accepted[0].transport.get_extra_info("ssl_object").version() == obj.version()
        tr.close()
        assert await wait(pr.lost) is None
        assert await wait(accepted[0].lost) is None
        await close_server(srv)

    arun(loop, main())


def test_echo_unix_socket(loop, tmp_path):
    """TLS over a Unix stream socket (create_unix_server/_connection)."""
    data = payload(100_000)

    async def main():
        path = str(tmp_path / "tls.sock")
        srv = await loop.create_unix_server(lambda: EchoProtocol(), path, ssl=server_context())
        tr, pr = await wait(loop.create_unix_connection(
            lambda: Recorder(loop), path, ssl=client_context(), server_hostname="localhost"))
        assert tr.get_extra_info("ssl_object").version() == "TLSv1.3"
        assert tr.get_extra_info("peername") == path
        assert tr.get_extra_info("socket").family == socket.AF_UNIX
        tr.write(data)
        assert await pr.wait_bytes(len(data)) == data
        tr.close()
        assert await wait(pr.lost) is None
        await close_server(srv)

    arun(loop, main())


def test_sendfile_falls_back(loop, tmp_path):
    """loop.sendfile() over TLS: no native sendfile, asyncio's fallback
    (read and write, with the transport's flow control) sends the file; with
    fallback=False it is refused."""
    path = tmp_path / "file.bin"
    content = payload(3 << 20)
    path.write_bytes(content)

    async def main():
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted))
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        await wait_until(lambda: accepted)
        sp = accepted[0]
        with open(path, "rb") as f:
            with pytest.raises(RuntimeError, match=r"^fallback is disabled and native sendfile "
                                                   r"is not supported for transport "):
                await loop.sendfile(tr, f, fallback=False)
            assert f.tell() == 0
            sent = await wait(loop.sendfile(tr, f, offset=100, count=(2 << 20)))
            assert sent == 2 << 20
            assert f.tell() == 100 + (2 << 20)
        assert tr.get_protocol() is pr  # the app protocol is back
        assert await pr.wait_bytes(2 << 20) == content[100:100 + (2 << 20)]
        assert bytes(sp.data) == content[100:100 + (2 << 20)]
        tr.write(b"after")
        assert (await pr.wait_bytes((2 << 20) + 5))[-5:] == b"after"
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


# ---------------------------------------------------------- extra info

def test_extra_info(loop):
    async def main():
        accepted = []
        sctx, cctx = server_context(), client_context()
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted), sctx)
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, cctx)
        await wait_until(lambda: accepted and accepted[0].transport)
        str_ = accepted[0].transport
        for t, ctx in ((tr, cctx), (str_, sctx)):
            obj = t.get_extra_info("ssl_object")
            assert isinstance(obj, ssl.SSLObject)
            assert t.get_extra_info("sslcontext") is ctx
            assert obj.context is ctx
            cipher = t.get_extra_info("cipher")
            assert cipher == obj.cipher() and len(cipher) == 3
            assert t.get_extra_info("compression") is None
            assert t.get_extra_info("compression", "dflt") is None  # present, None
            sock = t.get_extra_info("socket")
            assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
            assert t.get_extra_info("no such key") is None
            assert t.get_extra_info("no such key", "dflt") == "dflt"
        assert tr.get_extra_info("ssl_object").server_side is False
        assert str_.get_extra_info("ssl_object").server_side is True
        assert tr.get_extra_info("ssl_object").server_hostname == "localhost"
        assert tr.get_extra_info("peername") == addr
        assert str_.get_extra_info("sockname") == addr
        assert str_.get_extra_info("peername") == tr.get_extra_info("sockname")
        peercert = tr.get_extra_info("peercert")
        assert peercert == tr.get_extra_info("ssl_object").getpeercert()
        assert peercert["subject"] == ((("commonName", "localhost"),),)
        assert ("IP Address", "127.0.0.1") in peercert["subjectAltName"]
        # the server asked for no client certificate
        assert str_.get_extra_info("peercert") is None
        assert tr.get_extra_info("ssl_object").getpeercert(True) == cert_der(SERVER_ECDSA)
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_extra_info_after_connection_lost(loop):
    """What the TLS layer learnt in the handshake stays; what the socket
    transport answered goes with it (the default comes back)."""
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        ctx = client_context()
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, ctx)
        obj, cipher = tr.get_extra_info("ssl_object"), tr.get_extra_info("cipher")
        tr.close()
        await wait(pr.lost)
        assert tr.get_extra_info("ssl_object") is obj
        assert tr.get_extra_info("cipher") == cipher
        assert tr.get_extra_info("sslcontext") is ctx
        assert tr.get_extra_info("peercert")["subject"] == ((("commonName", "localhost"),),)
        assert tr.get_extra_info("peername") is None
        assert tr.get_extra_info("socket", "gone") == "gone"
        await close_server(srv)

    arun(loop, main())


def test_transport_protocol_accessors(loop):
    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        assert tr.get_protocol() is pr
        other = Recorder(loop)
        tr.set_protocol(other)
        assert tr.get_protocol() is other
        tr.write(b"to the new protocol")
        assert await other.wait_bytes(19) == b"to the new protocol"
        assert pr.data == b""
        assert isinstance(tr, asyncio.Transport)
        tr.close()
        assert await wait(other.lost) is None
        assert other.events == ["data", "eof", "lost"]
        assert pr.events == ["made"]
        await close_server(srv)

    arun(loop, main())


# ------------------------------------------------------ SNI, ALPN, keylog

def test_sni_callback_sees_server_hostname(loop):
    seen = []

    def sni(obj, name, ctx):
        seen.append((type(obj), name, ctx))

    async def main():
        sctx = server_context()
        sctx.sni_callback = sni
        srv, addr = await tls_server(loop, lambda: EchoProtocol(), sctx)
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, server_hostname="localhost")
        assert seen == [(ssl.SSLObject, "localhost", sctx)]
        tr.close()
        await wait(pr.lost)
        # no SNI for an IP address
        cctx = client_context()
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, cctx,
                                   server_hostname="127.0.0.1")
        assert seen[1] == (ssl.SSLObject, None, sctx)
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_sni_callback_switches_certificate(loop):
    """A server sni_callback that assigns another context to the SSLObject
    serves that context's certificate."""
    rsa = server_context(SERVER_RSA)

    def sni(obj, name, ctx):
        if name == "localhost":
            obj.context = rsa

    async def main():
        sctx = server_context(SERVER_ECDSA)
        sctx.sni_callback = sni
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted), sctx)
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, server_hostname="localhost")
        assert tr.get_extra_info("ssl_object").getpeercert(True) == cert_der(SERVER_RSA)
        await wait_until(lambda: accepted and accepted[0].transport)
        assert accepted[0].transport.get_extra_info("ssl_object").context is rsa
        tr.write(b"rsa")
        assert await pr.wait_bytes(3) == b"rsa"
        tr.close()
        await wait(pr.lost)
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, server_hostname="127.0.0.1")
        assert tr.get_extra_info("ssl_object").getpeercert(True) == cert_der(SERVER_ECDSA)
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_sni_callback_alert(loop):
    """An sni_callback returning an alert number fails the server's handshake.
    asyncio closes the server's socket at once, without sending the alert it
    holds (the failure is not a want-read/write, so nothing is flushed): the
    client sees the connection end mid-handshake."""
    async def main():
        calls = handler_calls(loop)
        sctx = server_context()
        sctx.sni_callback = lambda obj, name, ctx: ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        made = []
        srv, addr = await tls_server(loop, lambda: Recorder(loop, on_made=made.append), sctx)
        with pytest.raises(ConnectionResetError) as ei:
            await tls_connect(loop, lambda: Recorder(loop), addr)
        assert type(ei.value) is ConnectionResetError and ei.value.args == ()
        await asyncio.sleep(0.05)
        assert made == [] and calls == []
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("client, server, expected", [
    (["h2", "http/1.1"], ["http/1.1"], "http/1.1"),
    (["h2", "http/1.1"], ["h2", "http/1.1"], "h2"),
    (["h2"], None, None),
    (None, ["h2"], None),
], ids=["http1", "h2", "server-none", "client-none"])
def test_alpn(loop, client, server, expected):
    async def main():
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted),
                                     server_context(alpn=server))
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, client_context(alpn=client))
        assert tr.get_extra_info("ssl_object").selected_alpn_protocol() == expected
        await wait_until(lambda: accepted and accepted[0].transport)
        assert accepted[0].transport.get_extra_info("ssl_object").selected_alpn_protocol() == expected
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_alpn_no_overlap(loop):
    """No protocol in common: the server does not answer ALPN, the handshake
    goes on and neither side has a protocol."""
    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted),
                                     server_context(alpn=["h2"]))
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr,
                                   client_context(alpn=["spdy/1"]))
        assert tr.get_extra_info("ssl_object").selected_alpn_protocol() is None
        tr.write(b"a")
        assert await pr.wait_bytes(1) == b"a"
        assert accepted[0].transport.get_extra_info("ssl_object").selected_alpn_protocol() is None
        tr.close()
        await wait(pr.lost)
        assert calls == []
        await close_server(srv)

    arun(loop, main())


@pytest.mark.parametrize("version, labels", [
    (ssl.TLSVersion.TLSv1_3, {"CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET",
                              "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0",
                              "EXPORTER_SECRET"}),
    (ssl.TLSVersion.TLSv1_2, {"CLIENT_RANDOM"}),
], ids=["TLSv1.3", "TLSv1.2"])
def test_keylog_filename(loop, tmp_path, version, labels):
    ckeys, skeys = tmp_path / "client.keys", tmp_path / "server.keys"

    async def main():
        sctx = server_context()
        sctx.keylog_filename = str(skeys)
        cctx = client_context(max_version=version)
        cctx.keylog_filename = str(ckeys)
        srv, addr = await tls_server(loop, lambda: EchoProtocol(), sctx)
        for _ in range(2):
            tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, cctx)
            tr.write(b"k")
            await pr.wait_bytes(1)
            tr.close()
            await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())
    for path in (ckeys, skeys):
        lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
        assert {ln.split()[0] for ln in lines} == labels, lines
        # one line per label per connection, each "LABEL <client random> <secret>"
        assert len(lines) == 2 * len(labels)
        assert all(len(ln.split()) == 3 and len(ln.split()[1]) == 64 for ln in lines)
    # both sides logged the same secrets
    secrets = [sorted(ln for ln in path.read_text().splitlines() if ln and ln[0] != "#")
               for path in (ckeys, skeys)]
    assert secrets[0] == secrets[1]


# ----------------------------------------------------- sessions, statistics

def test_session_tickets_and_context_stats(loop):
    """asyncio has no way to offer a saved session to a new connection, so no
    connection resumes; a TLS 1.3 server still issues tickets, and its
    context counts every handshake."""
    async def main():
        sctx, cctx = server_context(), client_context()
        srv, addr = await tls_server(loop, lambda: EchoProtocol(), sctx)
        for i in range(3):
            tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr, cctx)
            tr.write(b"t")
            await pr.wait_bytes(1)  # the tickets arrive with or before the echo
            obj = tr.get_extra_info("ssl_object")
            assert obj.session_reused is False
            assert obj.session is not None and obj.session.has_ticket
            tr.close()
            await wait(pr.lost)
        stats = sctx.session_stats()
        assert stats["accept"] == stats["accept_good"] == 3
        assert stats["hits"] == 0
        assert cctx.session_stats()["connect_good"] == 3
        await close_server(srv)

    arun(loop, main())


def test_server_socket_and_fds(loop):
    """A TLS server and 20 connections leave no fd behind."""
    before = open_fds()

    async def main():
        srv, addr = await tls_server(loop, lambda: EchoProtocol())
        conns = [await tls_connect(loop, lambda: Recorder(loop), addr) for _ in range(20)]
        for i, (tr, pr) in enumerate(conns):
            tr.write(b"%d" % i)
        for i, (tr, pr) in enumerate(conns):
            assert await pr.wait_bytes(len(b"%d" % i)) == b"%d" % i
            tr.close()
        for tr, pr in conns:
            assert await wait(pr.lost) is None
        await close_server(srv)

    arun(loop, main())
    fd_leak_check(before)


def test_a_busy_connection_idles_and_is_busy_again(loop, tls_route):
    """Many small records (a busy connection: on tideloop's openssl route it
    keeps OpenSSL's record buffers), a pause long enough for the idle check
    to give them and the MemoryBIOs' storage back, then busy again: every
    byte arrives, in order, each time."""
    async def main():
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted))
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        sent = b""
        for round_ in range(2):
            for i in range(200):
                chunk = b"%d:%d;" % (round_, i)
                tr.write(chunk)
                sent += chunk
                if i % 10 == 0:
                    await asyncio.sleep(0.01)
            assert await pr.wait_bytes(len(sent)) == sent
            (sp,) = accepted
            engines = [vars(t._ssl_protocol).get("_tl_engine") for t in (tr, sp.transport)]
            if tls_route == "openssl":
                before = [e.buffers_released for e in engines]
                await wait_until(lambda: all(e.buffers_released > b
                                             for e, b in zip(engines, before)), timeout=20)
            else:
                await asyncio.sleep(1.2)
        tr.close()
        assert await wait(pr.lost) is None
        assert await wait(sp.lost) is None
        await close_server(srv)

    arun(loop, main())


def test_an_idle_connection_keeps_working_after_its_buffers_go(loop, tls_route):
    """An idle TLS connection: after a pause (on tideloop's openssl route,
    until the idle check has given OpenSSL's record buffers back) records
    flow both ways as before, small and large."""
    async def main():
        accepted = []
        srv, addr = await tls_server(loop, tls_echo_recorder(loop, accepted))
        tr, pr = await tls_connect(loop, lambda: Recorder(loop), addr)
        tr.write(b"first")
        assert await pr.wait_bytes(5) == b"first"
        (sp,) = accepted
        engines = [vars(t._ssl_protocol).get("_tl_engine") for t in (tr, sp.transport)]
        if tls_route == "openssl":
            assert all(e is not None and e.route == "openssl" for e in engines)
            await wait_until(lambda: all(e.buffers_released >= 1 for e in engines),
                             timeout=20)
        else:
            await asyncio.sleep(1.2)
        big = payload(1 << 20)
        tr.write(b"second")
        tr.write(big)
        assert await pr.wait_bytes(6 + len(big)) == b"first" + b"second" + big
        tr.close()
        assert await wait(pr.lost) is None
        assert await wait(sp.lost) is None
        await close_server(srv)

    arun(loop, main())
