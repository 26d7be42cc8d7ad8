"""Bad input and faults on TLS connections (issue 12): bytes that are not a
ClientHello, a peer that ends the connection mid-handshake (FIN or reset, on
either side), peers that send one byte at a time, garbage after the
handshake, renegotiation (refused, and allowed), exceptions raised by the
application's protocol, and what the exception handler receives for all of
these (its context's keys, message and exception), in normal and debug mode.

The raw peers are plain blocking sockets driven from threads; their TLS bytes
come from ssl.SSLObject (tls_helpers.SyncTLSPeer), so they do not depend on
the loop under test."""
import asyncio
import shutil
import socket
import ssl
import subprocess
import threading

import pytest

from net_helpers import (
    EchoProtocol, Recorder, arun, close_server, rst_close, wait, wait_until,
)
from tls_helpers import (
    CA, SyncTLSPeer, client_context, client_hello, handler_calls, openssl_error, openssl_reason,
    ssl_error_fields, ssl_read_line, write_error_after,
    record_length, server_context,
)

pytestmark = pytest.mark.usefixtures("tls_route")

ACCEPT_ERROR = "Error on transport creation for incoming connection"


async def tls_server(loop, accepted, ctx=None, factory=None, **kw):
    def f():
        p = (factory or (lambda: Recorder(loop, on_data=lambda p, d: p.transport.write(d))))()
        accepted.append(p)
        return p

    srv = await loop.create_server(f, "127.0.0.1", 0, ssl=ctx or server_context(), **kw)
    return srv, srv.sockets[0].getsockname()


def raw_exchange(addr, data, *, shut_wr=False, reset=False):
    """Blocking: connect, send ``data``, optionally half-close or reset, and
    read until EOF; returns what the server sent (or the error's name)."""
    s = socket.create_connection(addr, timeout=5)
    try:
        s.sendall(data)
        if reset:
            rst_close(s)
            return None
        if shut_wr:
            s.shutdown(socket.SHUT_WR)
        buf = bytearray()
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                return bytes(buf)
            buf += chunk
    except ConnectionResetError:
        return "reset"
    finally:
        if s.fileno() != -1:
            s.close()


# ------------------------------------------------------ not a ClientHello

# The reasons are OpenSSL's (the ones of OpenSSL 3.0; 3.6 says
# RECORD_LAYER_FAILURE for the oversized record): the test takes them from
# the library itself (tls_helpers.openssl_reason) and checks it still says so.
GARBAGE = [
    (b"\x00" * 64, {"WRONG_VERSION_NUMBER"}),
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", {"HTTP_REQUEST"}),
    (b"\x16\x03\x01\x00\x05hello", {"UNEXPECTED_MESSAGE"}),
    (b"\x17\x03\x03\x00\x05hello", {"UNEXPECTED_MESSAGE"}),
    (b"\x16\x03\x01\x40\x01" + b"\x01" * 16385, {"DATA_LENGTH_TOO_LONG",
                                                    "RECORD_LAYER_FAILURE"}),
]
GARBAGE_IDS = ["zeros", "http", "bad-handshake-record", "early-appdata", "oversized-record"]


@pytest.mark.parametrize("debug", [False, True], ids=["normal", "debug"])
@pytest.mark.parametrize("data, reasons", GARBAGE, ids=GARBAGE_IDS)
def test_garbage_instead_of_client_hello(loop, data, reasons, debug):
    """The server closes the connection without a word (no alert reaches the
    client); its protocol is made but never connected.  Outside debug mode
    the exception handler hears nothing; in debug mode it gets asyncio's
    accept-path context with the SSLError."""
    reason = openssl_reason(data)
    assert reason in reasons
    loop.set_debug(debug)

    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, accepted)
        got = await wait(loop.run_in_executor(None, raw_exchange, addr, data))
        assert got == b""
        await asyncio.sleep(0.05)
        assert [p.events for p in accepted] == [[]]
        if not debug:
            assert calls == []
        else:
            (ctx,) = calls
            assert sorted(ctx) == ["exception", "message", "protocol", "transport"]
            assert ctx["message"] == ACCEPT_ERROR
            exc = ctx["exception"]
            assert type(exc) is ssl.SSLError and exc.reason == reason and exc.library == "SSL"
            assert ctx["protocol"] is accepted[0]
            assert isinstance(ctx["transport"], asyncio.Transport)
        # the server still serves
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(), server_hostname="localhost"))
        tr.write(b"ok")
        assert await pr.wait_bytes(2) == b"ok"
        tr.close()
        await wait(pr.lost)
        await close_server(srv)

    try:
        arun(loop, main())
    finally:
        loop.set_debug(False)


def test_garbage_instead_of_server_hello(loop):
    """The client's view: the server answers the ClientHello with bytes that
    are not TLS: create_connection() raises the SSLError."""
    async def main():
        calls = handler_calls(loop)
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)

        def serve():
            s, _ = lsock.accept()
            with s:
                s.settimeout(5)
                head = s.recv(5)
                s.recv(record_length(head) - 5, socket.MSG_WAITALL)
                s.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                s.recv(100)  # until the client goes

        th = loop.run_in_executor(None, serve)
        try:
            with pytest.raises(ssl.SSLError) as ei:
                await wait(loop.create_connection(
                    lambda: Recorder(loop), *lsock.getsockname(), ssl=client_context(),
                    server_hostname="localhost"))
            assert type(ei.value) is ssl.SSLError
            assert ei.value.reason == "WRONG_VERSION_NUMBER"
            await wait(th)
        finally:
            lsock.close()
        assert calls == []

    arun(loop, main())


# --------------------------------------------------- ends mid-handshake

@pytest.mark.parametrize("debug", [False, True], ids=["normal", "debug"])
@pytest.mark.parametrize("how", ["fin", "rst"])
def test_client_ends_mid_handshake(loop, how, debug):
    """Half a ClientHello, then the client half-closes (FIN) or resets: the
    server drops the connection; in debug mode the handler is told with
    ConnectionResetError: asyncio's own (no arguments) for an EOF, the
    socket's (errno ECONNRESET) for a reset."""
    hello = client_hello()
    loop.set_debug(debug)

    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, accepted)
        got = await wait(loop.run_in_executor(
            None, lambda: raw_exchange(addr, hello[:len(hello) // 2],
                                       shut_wr=how == "fin", reset=how == "rst")))
        if how == "fin":
            assert got == b""
        await wait_until(lambda: accepted)
        await asyncio.sleep(0.05)
        assert [p.events for p in accepted] == [[]]
        if not debug:
            assert calls == []
        else:
            await wait_until(lambda: calls)
            (ctx,) = calls
            assert ctx["message"] == ACCEPT_ERROR
            assert sorted(ctx) == ["exception", "message", "protocol", "transport"]
            exc = ctx["exception"]
            assert type(exc) is ConnectionResetError
            if how == "fin":
                assert exc.args == ()
            else:
                assert exc.errno == 104
        await close_server(srv)

    try:
        arun(loop, main())
    finally:
        loop.set_debug(False)


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_server_ends_mid_handshake(loop, how):
    """The server reads the whole ClientHello and closes (FIN) or resets:
    create_connection() raises ConnectionResetError, asyncio's own (no
    arguments) for the EOF, the socket's for the reset; no handler call."""
    async def main():
        calls = handler_calls(loop)
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)

        def serve():
            s, _ = lsock.accept()
            s.settimeout(5)
            head = s.recv(5)
            s.recv(record_length(head) - 5, socket.MSG_WAITALL)
            if how == "rst":
                rst_close(s)
            else:
                s.close()

        th = loop.run_in_executor(None, serve)
        try:
            with pytest.raises(ConnectionResetError) as ei:
                await wait(loop.create_connection(
                    lambda: Recorder(loop), *lsock.getsockname(), ssl=client_context(),
                    server_hostname="localhost"))
            await wait(th)
        finally:
            lsock.close()
        assert type(ei.value) is ConnectionResetError
        if how == "fin":
            assert ei.value.args == ()
        else:
            assert ei.value.errno == 104
        assert calls == []

    arun(loop, main())


# ------------------------------------------------ one byte at a time

def test_client_sends_one_byte_at_a_time(loop):
    """A TLS client whose every byte (handshake and records) arrives in a
    send() of its own: the server completes the handshake and gets the data."""
    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, accepted)

        def client():
            sock = socket.create_connection(addr, timeout=5)
            peer = SyncTLSPeer(sock, client_context(), chunk=1, pause=0.0001)
            try:
                peer.handshake()
                peer.send(b"dribble" * 20)
                echo = peer.recv_exactly(140)
                peer.unwrap()
                return echo, peer.sent_raw
            finally:
                sock.close()

        echo, sent_raw = await wait(loop.run_in_executor(None, client))
        assert echo == b"dribble" * 20
        assert sent_raw > 140
        await wait_until(lambda: accepted)
        p = accepted[0]
        assert await wait(p.lost) is None
        assert p.data == b"dribble" * 20
        assert p.events[0] == "made" and p.events[-2:] == ["eof", "lost"]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_server_sends_one_byte_at_a_time(loop):
    async def main():
        calls = handler_calls(loop)
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)

        def serve():
            s, _ = lsock.accept()
            peer = SyncTLSPeer(s, server_context(), server_side=True, chunk=1, pause=0.0001)
            try:
                peer.handshake()
                data = peer.recv_exactly(5)
                peer.send(data[::-1] * 10)
                peer.unwrap()
            finally:
                s.close()

        th = loop.run_in_executor(None, serve)
        try:
            tr, pr = await wait(loop.create_connection(
                lambda: Recorder(loop), *lsock.getsockname(), ssl=client_context(),
                server_hostname="localhost"))
            tr.write(b"abcde")
            assert await pr.wait_bytes(50) == b"edcba" * 10
            assert await wait(pr.lost) is None
            assert pr.events[0] == "made" and pr.events[-2:] == ["eof", "lost"]
            await wait(th)
        finally:
            lsock.close()
        assert calls == []

    arun(loop, main())


# ------------------------------------------------ after the handshake

def echo_then_send(addr, record, go=None):
    """Blocking client: a handshake and one echoed record, then (once `go`
    is set, if given) `record` raw; returns what it reads until the end."""
    sock = socket.create_connection(addr, timeout=5)
    peer = SyncTLSPeer(sock, client_context())
    try:
        peer.handshake()
        peer.send(b"fine")
        assert peer.recv_exactly(4) == b"fine"
        assert go is None or go.wait(5)
        sock.sendall(record)
        return peer.recv_until_close()
    finally:
        sock.close()


def test_garbage_after_handshake(loop):
    """A record that does not decrypt: connection_lost() gets the SSLError
    that _ssl's read() raises for it (type, args with the _ssl.c line,
    library, reason: the openssl route makes it in C); no exception-handler
    call (an SSLError is an OSError)."""
    bad_record = b"\x17\x03\x03\x00\x20" + b"\x5a" * 32
    expected = openssl_error(bad_record, after_handshake=True)
    # OpenSSL 3.0's reason; 3.6 says RECORD_LAYER_FAILURE
    assert expected.reason in ("DECRYPTION_FAILED_OR_BAD_RECORD_MAC", "RECORD_LAYER_FAILURE")

    async def main():
        calls = handler_calls(loop)
        accepted = []
        srv, addr = await tls_server(loop, accepted)

        data, end = await wait(loop.run_in_executor(None, echo_then_send, addr, bad_record))
        await wait_until(lambda: accepted)
        exc = await wait(accepted[0].lost)
        assert ssl_error_fields(exc) == ssl_error_fields(expected)
        assert accepted[0].events == ["made", "data", "lost"]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


def test_write_while_failing(loop):
    """The app writes while a failed read is being reported (from inside
    SSLProtocol._fatal_error, before connection_lost): the write meets the
    TLS object in its error state.  As on the stock loop, the data waits in
    SSLProtocol's write backlog and the error of _ssl's write() in that state
    (here computed from a Python-only run: type, args with the _ssl.c line,
    library, reason) goes to _fatal_error too -- on the openssl route, the
    engine makes that error in C."""
    bad_record = b"\x17\x03\x03\x00\x20" + b"\x5a" * 32
    expected_read = openssl_error(bad_record, after_handshake=True)
    expected_write = write_error_after(bad_record)
    assert isinstance(expected_write, ssl.SSLEOFError)

    async def main():
        accepted = []
        srv, addr = await tls_server(loop, accepted)
        errors, backlog = [], []
        patched = threading.Event()

        fut = loop.run_in_executor(None, echo_then_send, addr, bad_record, patched)
        await wait_until(lambda: accepted and accepted[0].data == b"fine")
        app_transport = accepted[0].transport
        proto = app_transport._ssl_protocol
        stock_fatal = proto._fatal_error

        def fatal_error(exc, message="Fatal error on transport"):
            errors.append(exc)
            if len(errors) == 1:
                app_transport.write(b"late")
                backlog.append((list(proto._write_backlog), proto._write_buffer_size))
            return stock_fatal(exc, message)

        proto._fatal_error = fatal_error
        patched.set()
        await wait(fut)
        await wait(accepted[0].lost)
        assert [ssl_error_fields(e) for e in errors] == [
            ssl_error_fields(expected_read), ssl_error_fields(expected_write)]
        assert backlog == [([b"late"], 4)]
        await close_server(srv)

    arun(loop, main())


def _s_client(port, *extra):
    return subprocess.Popen(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-tls1_2", "-CAfile", CA,
         "-servername", "localhost", "-no_ign_eof", *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _read_until(stream, marker):
    """Blocking: read lines until one equals ``marker``; returns them all."""
    lines = []
    for line in iter(stream.readline, b""):
        lines.append(line)
        if line.rstrip(b"\n") == marker:
            break
    return lines


needs_openssl_cli = pytest.mark.skipif(shutil.which("openssl") is None,
                                       reason="needs the openssl command")

# OpenSSL 3's SSL_OP_ALLOW_CLIENT_RENEGOTIATION (Python has no name for it).
ALLOW_CLIENT_RENEGOTIATION = 0x100


@needs_openssl_cli
@pytest.mark.parametrize("allowed", [False, True], ids=["refused", "allowed"])
def test_client_renegotiation(loop, allowed):
    """A TLS 1.2 client renegotiates (openssl s_client's 'R' command; Python's
    ssl module cannot start a renegotiation).  OpenSSL 3 servers refuse it by
    default: the client's alert ends the connection and connection_lost()
    gets it.  With client renegotiation allowed, the data that follows is
    served as before."""
    if allowed and ssl.OPENSSL_VERSION_INFO < (3, 0):
        pytest.skip("SSL_OP_ALLOW_CLIENT_RENEGOTIATION is OpenSSL 3's")

    async def main():
        calls = handler_calls(loop)
        accepted = []
        sctx = server_context()
        if allowed:
            sctx.options |= ALLOW_CLIENT_RENEGOTIATION
        srv, addr = await tls_server(
            loop, accepted, sctx,
            factory=lambda: Recorder(loop, on_data=lambda p, d: p.transport.write(d.upper())))
        proc = _s_client(addr[1])
        try:
            proc.stdin.write(b"hello\n")
            proc.stdin.flush()
            await wait(loop.run_in_executor(None, _read_until, proc.stdout, b"HELLO"))
            proc.stdin.write(b"R\n")
            proc.stdin.flush()
            if allowed:
                # s_client took the line as its command: the renegotiation
                # runs before it writes what comes next
                await wait(loop.run_in_executor(None, _read_until, proc.stderr,
                                                b"RENEGOTIATING"))
                proc.stdin.write(b"world\n")
                proc.stdin.flush()
                await wait(loop.run_in_executor(None, _read_until, proc.stdout, b"WORLD"))
                proc.stdin.close()
                assert await wait(loop.run_in_executor(None, proc.wait)) == 0
                err = await wait(loop.run_in_executor(None, proc.stderr.read))
                # the server's certificate was verified again: a new handshake
                assert err.count(b"depth=0 CN = localhost") == 1, err
            else:
                err = await wait(loop.run_in_executor(None, proc.stderr.read))
                assert b"RENEGOTIATING" in err and b"no renegotiation" in err
                assert await wait(loop.run_in_executor(None, proc.wait)) == 1
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if not f.closed:
                    f.close()
        p = accepted[0]
        exc = await wait(p.lost)
        if allowed:
            assert exc is None
            assert p.data == b"hello\nworld\n"
            assert p.events == ["made", "data", "data", "eof", "lost"]
        else:
            # the alert arrives in the data phase: raised as _ssl's read() does
            assert type(exc) is ssl.SSLError
            assert exc.reason == "SSLV3_ALERT_HANDSHAKE_FAILURE" and exc.library == "SSL"
            assert exc.args[0] == 1 and str(exc) == exc.args[1]
            assert exc.args[1].startswith("[SSL: SSLV3_ALERT_HANDSHAKE_FAILURE] ")
            assert exc.args[1].endswith("(_ssl.c:%d)" % ssl_read_line())
            assert p.events == ["made", "data", "lost"]
        assert calls == []
        await close_server(srv)

    arun(loop, main())


# ------------------------------------------ the application's exceptions

class Boom(Exception):
    pass


def test_data_received_raises(loop):
    """An exception from data_received() over TLS: the handler gets
    'Fatal error on SSL protocol' with it, connection_lost() gets it."""
    async def main():
        calls = handler_calls(loop)
        boom = Boom("from data_received")

        def raise_(p, d):
            raise boom

        accepted = []
        srv, addr = await tls_server(loop, accepted,
                                     factory=lambda: Recorder(loop, on_data=raise_))
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(), server_hostname="localhost"))
        tr.write(b"trigger")
        assert await wait(accepted[0].lost) is boom
        assert accepted[0].events == ["made", "data", "lost"]
        (ctx,) = calls
        assert ctx["message"] == "Fatal error on SSL protocol"
        assert ctx["exception"] is boom
        assert sorted(ctx) == ["exception", "message", "protocol", "transport"]
        # the client sees the server drop the connection without close_notify
        assert await wait(pr.lost) is None
        assert pr.events == ["made", "eof", "lost"]
        tr.close()
        await close_server(srv)

    arun(loop, main())


def test_eof_received_raises(loop):
    async def main():
        calls = handler_calls(loop)
        boom = Boom("from eof_received")

        def raise_(p):
            raise boom

        accepted = []
        srv, addr = await tls_server(loop, accepted,
                                     factory=lambda: Recorder(loop, on_eof=raise_))
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(), server_hostname="localhost"))
        tr.close()
        assert await wait(accepted[0].lost) is boom
        assert accepted[0].events == ["made", "eof", "lost"]
        (ctx,) = calls
        assert ctx["message"] == "Error calling eof_received()"
        assert ctx["exception"] is boom
        assert sorted(ctx) == ["exception", "message", "protocol", "transport"]
        await wait(pr.lost)
        await close_server(srv)

    arun(loop, main())


def test_connection_made_raises_client(loop):
    """connection_made() of a TLS client's protocol runs when the handshake
    completes, inside the socket transport's read callback: its exception
    fails create_connection() and reaches the handler as the socket
    transport's 'Fatal error: protocol.buffer_updated() call failed.'."""
    async def main():
        calls = handler_calls(loop)
        boom = Boom("from connection_made")

        def raise_(p):
            raise boom

        accepted = []
        srv, addr = await tls_server(loop, accepted)
        with pytest.raises(Boom) as ei:
            await wait(loop.create_connection(
                lambda: Recorder(loop, on_made=raise_), *addr, ssl=client_context(),
                server_hostname="localhost"))
        assert ei.value is boom
        await wait_until(lambda: calls)
        (ctx,) = calls
        assert ctx["message"] == "Fatal error: protocol.buffer_updated() call failed."
        assert ctx["exception"] is boom
        assert sorted(ctx) == ["exception", "message", "protocol", "transport"]
        # The client's last handshake message was never sent: the server's
        # handshake fails on the EOF and its protocol is never connected.
        await wait_until(lambda: accepted)
        await asyncio.sleep(0.05)
        assert accepted[0].events == []
        await close_server(srv)

    arun(loop, main())


def test_connection_made_raises_server(loop):
    async def main():
        calls = handler_calls(loop)
        boom = Boom("server connection_made")

        def raise_(p):
            raise boom

        accepted = []
        srv, addr = await tls_server(loop, accepted,
                                     factory=lambda: Recorder(loop, on_made=raise_))
        tr, pr = await wait(loop.create_connection(
            lambda: Recorder(loop), *addr, ssl=client_context(), server_hostname="localhost"))
        await wait_until(lambda: calls)
        (ctx,) = calls
        assert ctx["message"] == "Fatal error: protocol.buffer_updated() call failed."
        assert ctx["exception"] is boom
        # the server's protocol: made (raised), then lost with the exception
        assert await wait(accepted[0].lost) is boom
        assert accepted[0].events == ["made", "lost"]
        assert await wait(pr.lost) is None
        tr.close()
        await close_server(srv)

    arun(loop, main())


# ------------------------------------------------ connection lost mid-call

def test_lower_connection_lost_inside_data_received(loop):
    """The lower transport's connection_lost() run from inside the app's
    data_received() (the TLS protocol is torn down while its read is still
    on the stack): the loop carries on, the client sees EOF, nothing is
    reported.  On tideloop the C engine must keep what it uses until its
    call ends (it crashed when it let go at once)."""
    class Killer(asyncio.Protocol):
        def connection_made(self, tr):
            self.tr = tr

        def data_received(self, data):
            self.tr._ssl_protocol._transport._call_connection_lost(None)
            self.tr.write(data)

    async def main():
        calls = handler_calls(loop)
        srv = await loop.create_server(Killer, "127.0.0.1", 0, ssl=server_context())
        reader, writer = await wait(asyncio.open_connection(
            *srv.sockets[0].getsockname(), ssl=client_context(), server_hostname="localhost"))
        writer.write(b"hello")
        assert await wait(reader.read(100)) == b""
        writer.close()
        await close_server(srv)
        assert calls == []

    arun(loop, main())
