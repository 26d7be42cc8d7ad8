"""TLS on tideloop: asyncio's own SSLProtocol with a C engine under it.

The interpreter's ``asyncio.sslproto.SSLProtocol`` stays the TLS state
machine (so handshake, shutdown, timeouts and errors are exactly that
interpreter's); when a tideloop stream transport gets one as its protocol
(``_make_ssl_transport``, ``start_tls``), :func:`adopt` gives it a
``_core.TLSEngine`` that carries the hot paths in C: received bytes in the
WRAPPED state, and the app transport's ``write()``.

Routes (``tideloop._core.tls_route()``, ``set_tls_route(name)``; the
environment variable ``TIDELOOP_TLS_ROUTE`` picks the first one):

``openssl``
    The engine calls OpenSSL on the ``SSL*`` and ``BIO*`` inside ``_ssl``'s
    objects, through the libssl ``_ssl`` itself loaded.  Only when the proof
    below passed on this interpreter.
``sslobject``
    The engine calls ``_ssl``'s methods (``read`` into the loop's buffer,
    ``write``, the MemoryBIOs') from C: no private layout is assumed.
``asyncio``
    No engine: asyncio's SSLProtocol alone, as on the stock loop.

The proof (run at import): the OpenSSL functions resolve through ``_ssl``'s
shared object and report the same ``OPENSSL_VERSION`` (3.0 or newer); for a
client and a server ``SSLObject``, the pointers read at the known offsets
link up as ``_ssl`` links them (``SSL_get_rbio``/``wbio`` = the MemoryBIOs,
``SSL_get_SSL_CTX`` = the context, the app data = the ``_SSLSocket``,
``SSL_is_server``); a ClientHello made by a C ``SSL_do_handshake`` is the
one Python sees in the outgoing MemoryBIO.  Errors: the engine raises
``_ssl``'s exceptions itself, as ``_ssl`` makes them (it cannot make the
failed call again through ``_ssl``: OpenSSL 3.6 reports an error once).
For that the proof finds ``_ssl``'s error-name dicts in its module state
(behind its twelve known types and exceptions), learns the ``_ssl.c``
lines of ``read()`` and ``write()`` (and of 3.14's repeated SSLEOFError,
with the flag it keeps in the ``_SSLSocket``), and checks that errors met
in C -- a bad ClientHello on read and on write, an alert, EOF read twice
then a write -- come out exactly as ``_ssl`` raises them (type, args,
message, library, reason).  ``TLS_ROUTE_PROOF`` holds the reason when it
failed.
"""
from __future__ import annotations

import collections
import os
import re

from . import _core

try:
    import ssl as _ssl_mod
    import _ssl
    from asyncio import sslproto as _sslproto
except ImportError:          # an interpreter without ssl
    _ssl_mod = None

TLS_ROUTE_PROOF = "no ssl module"


_EMPTY_BUFFER = bytearray()
_EMPTY_VIEW = memoryview(_EMPTY_BUFFER)


def adopt(protocol):
    """The engine for an asyncio SSLProtocol (made once), or None."""
    engine = protocol.__dict__.get("_tl_engine")
    if engine is not None:
        return engine
    route = _core.tls_route()
    if route == "asyncio":
        return None
    # A context with a message callback (ssl tracing) keeps _ssl in the
    # loop for every record, where the callback's errors are raised.
    if route == "openssl" and getattr(protocol._sslcontext, "_msg_callback", None):
        route = "sslobject"
    _slim(protocol)
    engine = _core.TLSEngine(protocol, route)
    protocol._tl_engine = engine
    # Every path of SSLProtocol that reads (_do_flush, the end of the
    # handshake, resume_reading, a full app buffer) calls self._do_read().
    protocol._do_read = engine.do_read
    # The engine receives into the loop's buffer, never through
    # get_buffer(): the protocol's own 256 KiB read buffer goes (get_buffer
    # makes a new one if something still calls it).  One empty buffer and
    # its view serve every connection (370 bytes each otherwise): nothing
    # can be written into a view of nothing, and the view's export keeps
    # the bytearray from growing.
    protocol._ssl_buffer = _EMPTY_BUFFER
    protocol._ssl_buffer_view = _EMPTY_VIEW
    app_transport = protocol._app_transport
    if app_transport is not None:
        app_transport.write = engine.app_write
    return engine


# SSLProtocol's methods (any version) that would need a real deque for
# _write_backlog; with none of them in its code, a list does (append, [0],
# del [0], clear, len): 56 bytes empty against the deque's 760.
_DEQUE_ONLY = {"popleft", "appendleft", "extendleft", "rotate", "maxlen"}
_BACKLOG_AS_LIST = None


def _backlog_list_ok():
    global _BACKLOG_AS_LIST
    if _BACKLOG_AS_LIST is None:
        names = set()
        for cls in (_sslproto.SSLProtocol, _sslproto._SSLProtocolTransport):
            for fn in vars(cls).values():
                code = getattr(fn, "__code__", None)
                if code is not None:
                    names.update(code.co_names)
        _BACKLOG_AS_LIST = not (names & _DEQUE_ONLY)
    return _BACKLOG_AS_LIST


def _slim(protocol):
    """What an idle connection keeps, smaller (before the engine reads the
    protocol's __dict__): the empty write backlog as a list, and the
    __dict__ copied into a table sized for its keys.  asyncio's SSLProtocol
    sets ~32 attributes in __init__, more than an instance's shared keys
    hold, so its __dict__ became a table for 85 keys (1,584 bytes); the copy
    is one for 42 (832 bytes), room for the few keys adopt() and the
    handshake add after this (36 in all on 3.11)."""
    d = protocol.__dict__
    backlog = d.get("_write_backlog")
    if type(backlog) is collections.deque and not backlog and _backlog_list_ok():
        d["_write_backlog"] = []
    try:
        protocol.__dict__ = dict(d)
    except (AttributeError, TypeError):
        pass


def new_ssl_protocol(*args, **kwargs):
    """asyncio's SSLProtocol(*args, **kwargs) for a tideloop transport.

    With the C engine (any route but "asyncio") its 256 KiB read buffer is
    never used: __init__ is run with max_size 0 for this one instance, so
    it makes an empty one, and the class's max_size is back right after
    (get_buffer() and the Python read paths see 256 KiB as always)."""
    if _core.tls_route() == "asyncio":
        return _sslproto.SSLProtocol(*args, **kwargs)
    protocol = _sslproto.SSLProtocol.__new__(_sslproto.SSLProtocol)
    protocol.max_size = 0
    try:
        protocol.__init__(*args, **kwargs)
    finally:
        del protocol.max_size
    return protocol


def _setup_engine():
    """Hand the engine asyncio's SSLProtocol pieces and _ssl's types: None,
    or why the openssl route cannot be offered."""
    return _core._tls_setup(
        _sslproto.SSLProtocol,
        (_sslproto.SSLProtocolState.DO_HANDSHAKE, _sslproto.SSLProtocolState.WRAPPED,
         _sslproto.SSLProtocolState.FLUSHING, _sslproto.SSLProtocolState.SHUTDOWN),
        _sslproto.SSLAgainErrors, _sslproto._SSLProtocolTransport.write, adopt,
        _ssl._SSLSocket, _ssl.MemoryBIO, getattr(_ssl, "__file__", None),
        _ssl_mod.OPENSSL_VERSION)


def _prove():
    """None when the openssl route is safe on this interpreter, else why."""
    why = _setup_engine()
    if why is not None:
        return why
    client_ctx = _ssl_mod.SSLContext(_ssl_mod.PROTOCOL_TLS_CLIENT)
    # No server name: encoding one loads the IDNA codec (stringprep,
    # unicodedata), memory each isolated interpreter would pay for.
    client_ctx.check_hostname = False
    server_ctx = _ssl_mod.SSLContext(_ssl_mod.PROTOCOL_TLS_SERVER)

    def wrap(ctx, server_side):
        incoming, outgoing = _ssl_mod.MemoryBIO(), _ssl_mod.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=server_side,
                           server_hostname=None)
        return obj, incoming, outgoing

    client, c_in, c_out = wrap(client_ctx, False)
    why = _core._tls_prove(client._sslobj, c_in, c_out, client_ctx, False)
    if why is not None:
        return "client: " + why
    server, s_in, s_out = wrap(server_ctx, True)
    why = _core._tls_prove(server._sslobj, s_in, s_out, server_ctx, True)
    if why is not None:
        return "server: " + why
    # Round trip: a ClientHello written by C shows in Python's MemoryBIO.
    if _core._tls_handshake_step(client._sslobj) != 2:      # WANT_READ
        return "SSL_do_handshake from C did not want to read"
    hello = c_out.read()
    if hello[:1] != b"\x16" or len(hello) < 50:
        return "no ClientHello in the outgoing MemoryBIO"
    # Errors: the engine raises _ssl's exceptions itself (OpenSSL 3.6 does
    # not report an error twice, so the failed call cannot be made again
    # through _ssl).  It needs _ssl's error-name dicts and the _ssl.c lines
    # of read() and write(), learnt here from errors _ssl raises; then each
    # error met in C must come out as _ssl raises it.
    garbage = b"GET / HTTP/1.0\r\n\r\n"

    def stock(data, op, eof=False):
        obj, incoming, _ = wrap(server_ctx, True)
        incoming.write(data)
        if eof:
            incoming.write_eof()
        try:
            obj.write(b"x") if op == "write" else obj.read(64)
        except _ssl_mod.SSLError as exc:
            return exc
        return None

    def seen(exc):
        return (type(exc), exc.args, exc.library, exc.reason, str(exc))

    lines = []
    for op in ("read", "write"):
        exc = stock(garbage, op)
        found = re.search(r"\(_ssl\.c:(\d+)\)$", str(exc)) if exc is not None else None
        if found is None:
            return "_ssl's %s() of garbage raised %r" % (op, exc)
        lines.append(int(found.group(1)))
    expected = (_ssl._SSLContext, _ssl._SSLSocket, _ssl.MemoryBIO, _ssl.SSLSession,
                _ssl.Certificate, _ssl.SSLError, _ssl.SSLCertVerificationError,
                _ssl.SSLZeroReturnError, _ssl.SSLWantReadError, _ssl.SSLWantWriteError,
                _ssl.SSLSyscallError, _ssl.SSLEOFError)
    names = None
    if hasattr(_ssl, "lib_codes_to_names"):    # 3.11 still exposes them
        names = (_ssl.err_codes_to_names, _ssl.lib_codes_to_names)
    # 3.14: after an SSLEOFError, read() and write() raise it again from a
    # flag in the _SSLSocket, at another line; elsewhere they call OpenSSL.
    obj, incoming, _ = wrap(server_ctx, True)
    before = _core._tls_eof_flag(obj._sslobj)
    incoming.write_eof()
    errors = []
    for op in ("read", "read", "write"):
        try:
            obj.write(b"x") if op == "write" else obj.read(64)
        except _ssl_mod.SSLEOFError as exc:
            errors.append(exc)
    if len(errors) != 3:
        return "read() at EOF did not raise SSLEOFError three times"
    after = _core._tls_eof_flag(obj._sslobj)
    again = [re.search(r"\(_ssl\.c:(\d+)\)$", str(e)) for e in errors[1:]]
    again = {int(m.group(1)) if m else None for m in again}
    line_eof = 0
    if len(again) == 1 and None not in again and not again & set(lines):
        if (before, after) != (0, 1):
            return "SSLEOFError raised again, but not from the known flag"
        line_eof = again.pop()
    elif again != {lines[0], lines[1]}:
        return "SSLEOFError raised again in an unknown way: %r" % (errors,)
    why = _core._tls_errors(_ssl, expected, *lines, names, line_eof)
    if why is not None:
        return why
    alert = b"\x15\x03\x03\x00\x02\x02\x28"
    cases = [(garbage, ["read"], False), (garbage, ["write"], False),
             (alert, ["read"], False), (b"", ["read", "read", "write"], True)]
    for data, ops, eof in cases:
        want, got = [], []
        for calls, out in ((stock_calls, want), (c_calls, got)):
            obj, incoming, _ = wrap(server_ctx, True)
            incoming.write(data)
            if eof:
                incoming.write_eof()
            # (Nothing may call _ssl between the BIO writes and the C call.)
            for op in ops:
                try:
                    calls(obj, op)
                    out.append(None)
                except _ssl_mod.SSLError as exc:
                    out.append(seen(exc))
        if want != got or None in want:
            return "errors met in C (%s, %r) differ from _ssl's: %r, %r" % (
                ops, data, want, got)
    return None


def stock_calls(obj, op):
    obj.write(b"x") if op == "write" else obj.read(64)


def c_calls(obj, op):
    _core._tls_fail_step(obj._sslobj, op == "write")


def _setup():
    global TLS_ROUTE_PROOF
    if _ssl_mod is None:
        return ("asyncio",)
    if _core.portable:      # TIDELOOP_PORTABLE: no private layout of _ssl's
        _setup_engine()
        TLS_ROUTE_PROOF = "TIDELOOP_PORTABLE is set: the openssl route is not tried"
        _core._tls_set_proven(False)
        _core.set_tls_route(os.environ.get("TIDELOOP_TLS_ROUTE") or "sslobject")
        return ("sslobject", "asyncio")
    try:
        TLS_ROUTE_PROOF = _prove()
    except Exception as exc:    # noqa: BLE001 - a failed proof is a verdict
        TLS_ROUTE_PROOF = "%s: %s" % (type(exc).__name__, exc)
    proven = TLS_ROUTE_PROOF is None
    _core._tls_set_proven(proven)
    routes = ("openssl", "sslobject") if proven else ("sslobject",)
    wanted = os.environ.get("TIDELOOP_TLS_ROUTE") or routes[0]
    _core.set_tls_route(wanted)
    return routes + ("asyncio",)


tls_routes = _setup()
_core.tls_routes = tls_routes[:-1]      # the engine's routes, best first
