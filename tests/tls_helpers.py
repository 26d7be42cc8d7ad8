"""Helpers shared by the TLS tests (tests/net/test_tls*.py) and the TLS stress
scenario.  Import as ``tls_helpers``.

Everything here is loop-agnostic: contexts made from the test certificates
(tests/certs/README.md), a blocking TLS peer driven by ``ssl.SSLObject`` over
a plain socket (so the peer's bytes do not depend on the loop under test and
can be sent in any split), and small recording protocols.
"""
import asyncio
import re
import socket
import ssl
import time
from pathlib import Path

from net_helpers import STEP_TIMEOUT

CERTS = Path(__file__).resolve().parent / "certs"
CA = str(CERTS / "ca.pem")
SERVER_ECDSA = str(CERTS / "server-ecdsa.pem")
SERVER_RSA = str(CERTS / "server-rsa.pem")
CLIENT = str(CERTS / "client.pem")

# The routes of tideloop's C TLS transport (issue 12) the tests run on.
TLS_ROUTES = ("openssl", "sslobject")


def server_context(cert=SERVER_ECDSA, *, max_version=None, alpn=None,
                   client_ca=False, verify_mode=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert)
    if max_version is not None:
        ctx.maximum_version = max_version
    if alpn:
        ctx.set_alpn_protocols(alpn)
    if client_ca:
        ctx.load_verify_locations(CA)
    if verify_mode is not None:
        ctx.verify_mode = verify_mode
    return ctx


def client_context(*, trust=True, cert=None, max_version=None, alpn=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if trust:
        ctx.load_verify_locations(CA)
    if cert is not None:
        ctx.load_cert_chain(cert)
    if max_version is not None:
        ctx.maximum_version = max_version
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def cert_der(pem_path):
    """DER bytes of the first certificate in a PEM file."""
    text = Path(pem_path).read_text()
    start = text.index("-----BEGIN CERTIFICATE-----")
    end = text.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
    return ssl.PEM_cert_to_DER_cert(text[start:end])


def client_hello(server_hostname="localhost", ctx=None):
    """The first flight of a real TLS client (its ClientHello record)."""
    ctx = ctx or client_context()
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=server_hostname)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def _pump(a_out, b_in, b_out, a_in):
    b_in.write(a_out.read())
    a_in.write(b_out.read())


def openssl_error(data, *, after_handshake=False):
    """The SSLError this ssl module raises for a server that receives
    ``data`` instead of a ClientHello (or, ``after_handshake``, as the next
    record after a completed handshake, from ``read()``), or None.  The
    loops must raise exactly this one: the same type, args (with its
    ``_ssl.c`` line), library and reason."""
    server, s_in = _server_object(after_handshake)
    s_in.write(data)
    try:
        if after_handshake:
            server.read(1024)
        else:
            server.do_handshake()
    except ssl.SSLError as e:
        if isinstance(e, ssl.SSLWantReadError):
            return None
        return e
    return None


def _server_object(handshaken):
    """A server SSLObject and its incoming MemoryBIO; ``handshaken``: after
    a completed handshake with a client SSLObject."""
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_context().wrap_bio(s_in, s_out, server_side=True)
    if handshaken:
        c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = client_context().wrap_bio(c_in, c_out, server_hostname="localhost")
        done = set()
        for _ in range(10):
            for name, obj in (("client", client), ("server", server)):
                if name in done:
                    continue
                try:
                    obj.do_handshake()
                    done.add(name)
                except ssl.SSLWantReadError:
                    pass
            _pump(c_out, s_in, s_out, c_in)
        assert done == {"client", "server"}
    return server, s_in


def write_error_after(record):
    """What this ssl module's write() raises on a server whose read() met
    ``record`` after the handshake and failed (None if it writes)."""
    server, s_in = _server_object(True)
    s_in.write(record)
    try:
        server.read(1024)
    except ssl.SSLError:
        pass
    else:
        raise AssertionError("the record did not fail the read")
    try:
        server.write(b"late")
    except ssl.SSLError as e:
        return e
    return None


def openssl_reason(data, *, after_handshake=False):
    """openssl_error()'s reason: the reasons differ between OpenSSL releases
    (3.0 says DATA_LENGTH_TOO_LONG for an oversized record, 3.6
    RECORD_LAYER_FAILURE), the loops must agree with the library."""
    e = openssl_error(data, after_handshake=after_handshake)
    return None if e is None else e.reason


def ssl_error_fields(exc):
    """What must match between two raises of one SSL error."""
    return (type(exc), exc.args, str(exc), getattr(exc, "library", None),
            getattr(exc, "reason", None))


def ssl_read_line():
    """The _ssl.c line that this interpreter's SSLObject.read() reports
    its errors at (part of every such error's message)."""
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_context().wrap_bio(s_in, s_out, server_side=True)
    s_in.write(b"GET / HTTP/1.0\r\n\r\n")
    try:
        server.read(16)
    except ssl.SSLError as e:
        return int(re.search(r"\(_ssl\.c:(\d+)\)$", str(e)).group(1))
    raise AssertionError("read() of garbage raised nothing")


def record_length(head):
    """Total length of the TLS record whose 5-byte header is ``head``."""
    return 5 + int.from_bytes(head[3:5], "big")


class SyncTLSPeer:
    """A blocking TLS endpoint over a plain socket, driven through
    ssl.SSLObject + MemoryBIO.  ``chunk`` is how many bytes each send() of
    the peer carries (1: one byte at a time, with TCP_NODELAY and a pause
    between bytes so the loop sees them separately).  Meant to run in a
    thread (loop.run_in_executor)."""

    def __init__(self, sock, ctx, *, server_side=False, server_hostname="localhost",
                 chunk=None, pause=0.0):
        self.sock = sock
        self.sock.settimeout(STEP_TIMEOUT)
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.inc, self.out, server_side=server_side,
                                server_hostname=None if server_side else server_hostname)
        self.chunk = chunk
        self.pause = pause
        self.sent_raw = 0
        if chunk:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _flush(self):
        data = self.out.read()
        if not data:
            return
        if not self.chunk:
            self.sock.sendall(data)
        else:
            for i in range(0, len(data), self.chunk):
                self.sock.sendall(data[i:i + self.chunk])
                if self.pause:
                    time.sleep(self.pause)
        self.sent_raw += len(data)

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            self.inc.write_eof()
            return False
        self.inc.write(data)
        return True

    def handshake(self):
        while True:
            try:
                self.obj.do_handshake()
                self._flush()
                return
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    raise ConnectionResetError("peer closed during the handshake")

    def send(self, data):
        view = memoryview(data)
        while view:
            n = self.obj.write(view)
            view = view[n:]
            self._flush()

    def recv_exactly(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.obj.read(n - len(buf))
                if not chunk:
                    break
                buf += chunk
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    break
        self._flush()
        return bytes(buf)

    def recv_until_close(self):
        """Read application data until the peer's close_notify (returns
        (data, "close_notify")) or a plain EOF / reset (returns (data, the
        exception's type name))."""
        buf = bytearray()
        while True:
            try:
                chunk = self.obj.read(1 << 16)
                if not chunk:
                    return bytes(buf), "close_notify"
                buf += chunk
            except ssl.SSLWantReadError:
                self._flush()
                try:
                    if not self._fill():
                        continue  # the BIO's EOF makes read() raise next
                except OSError as e:
                    return bytes(buf), type(e).__name__
            except ssl.SSLError as e:
                return bytes(buf), type(e).__name__

    def unwrap(self):
        """Send our close_notify and wait for the peer's."""
        while True:
            try:
                self.obj.unwrap()
                self._flush()
                return
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    raise ConnectionResetError("EOF before the peer's close_notify")


class BufferedRecorder(asyncio.BufferedProtocol):
    """A BufferedProtocol that records its callbacks; ``bufsize`` is the size
    of the buffer get_buffer() hands out, a memoryview of a bytearray (the
    bytearray itself with ``view=False``)."""

    def __init__(self, loop, bufsize=1 << 16, view=True):
        self.loop = loop
        self.buf = memoryview(bytearray(bufsize)) if view else bytearray(bufsize)
        self.data = bytearray()
        self.events = []
        self.updates = []
        self.hints = []
        self.transport = None
        self.lost = loop.create_future()
        self._want = None

    def connection_made(self, transport):
        self.transport = transport
        self.events.append("made")

    def get_buffer(self, sizehint):
        self.hints.append(sizehint)
        return self.buf

    def buffer_updated(self, nbytes):
        self.events.append("data")
        self.updates.append(nbytes)
        self.data += self.buf[:nbytes]
        if self._want and len(self.data) >= self._want[0] and not self._want[1].done():
            self._want[1].set_result(None)

    def eof_received(self):
        self.events.append("eof")

    def connection_lost(self, exc):
        self.events.append("lost")
        if not self.lost.done():
            self.lost.set_result(exc)

    async def wait_bytes(self, n, timeout=STEP_TIMEOUT):
        if len(self.data) < n:
            self._want = (n, self.loop.create_future())
            await asyncio.wait_for(self._want[1], timeout)
        return bytes(self.data)


def handler_calls(loop):
    """Install an exception handler that records every context it gets."""
    calls = []
    loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
    return calls
