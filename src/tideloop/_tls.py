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
shared object and report the same ``OPENSSL_VERSION``; for a client and a
server ``SSLObject``, the pointers read at the known offsets link up as
``_ssl`` links them (``SSL_get_rbio``/``wbio`` = the MemoryBIOs,
``SSL_get_SSL_CTX`` = the context, the app data = the ``_SSLSocket``,
``SSL_is_server``); a ClientHello made by a C ``SSL_do_handshake`` is the
one Python sees in the outgoing MemoryBIO; and after a fatal error found
in C, the same call through ``_ssl`` raises what a Python-only run raises
(the engine relies on that to report errors as the stock loop does).
``TLS_ROUTE_PROOF`` holds the reason when it failed.
"""
from __future__ import annotations

import os

from . import _core

try:
    import ssl as _ssl_mod
    import _ssl
    from asyncio import sslproto as _sslproto
except ImportError:          # an interpreter without ssl
    _ssl_mod = None

TLS_ROUTE_PROOF = "no ssl module"


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
    engine = _core.TLSEngine(protocol, route)
    protocol._tl_engine = engine
    # Every path of SSLProtocol that reads (_do_flush, the end of the
    # handshake, resume_reading, a full app buffer) calls self._do_read().
    protocol._do_read = engine.do_read
    # The engine receives into the loop's buffer, never through
    # get_buffer(): the protocol's own 256 KiB read buffer goes (get_buffer
    # makes a new one if something still calls it).
    protocol._ssl_buffer = bytearray()
    protocol._ssl_buffer_view = memoryview(protocol._ssl_buffer)
    app_transport = protocol._app_transport
    if app_transport is not None:
        app_transport.write = engine.app_write
    return engine


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


def _prove():
    """None when the openssl route is safe on this interpreter, else why."""
    here = getattr(_ssl, "__file__", None)
    why = _core._tls_setup(
        _sslproto.SSLProtocol,
        (_sslproto.SSLProtocolState.DO_HANDSHAKE, _sslproto.SSLProtocolState.WRAPPED,
         _sslproto.SSLProtocolState.FLUSHING, _sslproto.SSLProtocolState.SHUTDOWN),
        _sslproto.SSLAgainErrors, _sslproto._SSLProtocolTransport.write, adopt,
        _ssl._SSLSocket, _ssl.MemoryBIO, here, _ssl_mod.OPENSSL_VERSION)
    if why is not None:
        return why
    client_ctx = _ssl_mod.SSLContext(_ssl_mod.PROTOCOL_TLS_CLIENT)
    server_ctx = _ssl_mod.SSLContext(_ssl_mod.PROTOCOL_TLS_SERVER)

    def wrap(ctx, server_side):
        incoming, outgoing = _ssl_mod.MemoryBIO(), _ssl_mod.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=server_side,
                           server_hostname=None if server_side else "tideloop.invalid")
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
    if _core._tls_handshake_step(client._sslobj, b"") != 2:      # WANT_READ
        return "SSL_do_handshake from C did not want to read"
    hello = c_out.read()
    if hello[:1] != b"\x16" or len(hello) < 50:
        return "no ClientHello in the outgoing MemoryBIO"
    # Errors: a fatal error met in C, raised again through _ssl, must be
    # the one a Python-only run raises.
    garbage = b"GET / HTTP/1.0\r\n\r\n"
    control, k_in, _ = wrap(server_ctx, True)
    k_in.write(garbage)
    seen = []
    try:
        control.do_handshake()
    except _ssl_mod.SSLError as exc:
        seen.append((type(exc), exc.args, exc.library, exc.reason))
    # (Nothing may call _ssl between the C step and the replay: some of its
    # calls clear OpenSSL's error queue, as the engine's replay never does.)
    if _core._tls_handshake_step(server._sslobj, garbage) != 1:  # SSL_ERROR_SSL
        return "garbage did not fail the handshake in C"
    try:
        server.do_handshake()
    except _ssl_mod.SSLError as exc:
        seen.append((type(exc), exc.args, exc.library, exc.reason))
    if len(seen) != 2 or seen[0] != seen[1]:
        return "an error met in C is raised differently through _ssl: %r" % (seen,)
    if not 0 <= s_in.pending < len(garbage):
        return "the bytes C wrote were not read from Python's MemoryBIO"
    return None


def _setup():
    global TLS_ROUTE_PROOF
    if _ssl_mod is None:
        return ("asyncio",)
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
