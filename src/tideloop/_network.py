"""Networking: name resolution, connections, servers, sockets, TLS, datagrams.

Once per connection or server, the running interpreter's own asyncio code
(``_compat.borrow``: messages, log text and edge cases are the stock loop's
of that version); everything per event or per byte -- transports, the
accept path of plain servers, ``sock_recv``/``sock_sendall``/``sock_accept``
-- runs in the C core.
"""

import socket
import weakref

from asyncio import constants as _constants
from asyncio import selector_events as _selector_events
from asyncio import unix_events as _unix_events
from asyncio.log import logger as _logger

from . import _compat
from . import _core
from . import _tls

_borrow = _compat.borrow
_SelectorLoop = _selector_events.BaseSelectorEventLoop
_UnixLoop = _unix_events._UnixSelectorEventLoop


def _numeric_host(host):
    if host is None:
        return True
    if isinstance(host, bytes):
        try:
            host = host.decode("idna")
        except UnicodeError:
            return False
    if not isinstance(host, str):
        return False
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except (OSError, ValueError):
            pass
    return False


def _numeric_port(port):
    if port is None or isinstance(port, int):
        return True
    if isinstance(port, (str, bytes)):
        try:
            int(port)
            return True
        except ValueError:
            return False
    return False


class Network:
    """The loop's networking (bound on the Loop class)."""

    # Python transports (see _make_socket_transport), by fd; made on first use.
    _transports = None

    def _init_network(self):
        if _compat.UNIX_SERVER_CLEANUP:
            # 3.13+: listening Unix sockets whose path is unlinked when the
            # server stops (asyncio's create_unix_server fills it in).
            self._unix_server_sockets = {}

    # -- name resolution ---------------------------------------------------

    _getaddrinfo_debug = _borrow("_getaddrinfo_debug")
    getnameinfo = _borrow("getnameinfo")

    async def getaddrinfo(self, host, port, *, family=0, type=0, proto=0,
                          flags=0):
        if not self.get_debug() and _numeric_host(host) and _numeric_port(port):
            # Numeric hosts and ports never touch DNS or /etc/services: the
            # libc call returns at once, so a thread hop only adds latency.
            return socket.getaddrinfo(host, port, family, type, proto, flags)
        getaddr_func = (self._getaddrinfo_debug if self.get_debug()
                        else socket.getaddrinfo)
        return await self.run_in_executor(
            None, getaddr_func, host, port, family, type, proto, flags)

    # -- networking: orchestration (once per connection or server) ---------

    _ensure_resolved = _borrow("_ensure_resolved")
    _connect_sock = _borrow("_connect_sock")
    create_connection = _borrow("create_connection")
    _create_connection_transport = _borrow("_create_connection_transport")
    _create_server_getaddrinfo = _borrow("_create_server_getaddrinfo")
    create_server = _borrow("create_server")
    connect_accepted_socket = _borrow("connect_accepted_socket")
    create_unix_connection = _borrow("create_unix_connection", _UnixLoop)
    create_unix_server = _borrow("create_unix_server", _UnixLoop)
    sendfile = _borrow("sendfile")
    _sendfile_fallback = _borrow("_sendfile_fallback")
    sock_sendfile = _borrow("sock_sendfile")
    _sock_sendfile_fallback = _borrow("_sock_sendfile_fallback")
    _check_sendfile_params = _borrow("_check_sendfile_params")
    _sock_sendfile_native = _borrow("_sock_sendfile_native", _UnixLoop)
    _sock_sendfile_native_impl = _borrow("_sock_sendfile_native_impl", _UnixLoop)
    _sock_sendfile_update_filepos = _borrow("_sock_sendfile_update_filepos",
                                            _UnixLoop)
    _sock_add_cancellation_callback = _borrow("_sock_add_cancellation_callback",
                                              _UnixLoop)

    # sock_recv, sock_recv_into, sock_sendall and sock_accept are C
    # awaitables (try the syscall first, wait only if it would block); the
    # address-taking ones below are asyncio's coroutines.
    _sock_read_done = _borrow("_sock_read_done", _SelectorLoop)
    sock_recvfrom = _borrow("sock_recvfrom", _SelectorLoop)
    _sock_recvfrom = _borrow("_sock_recvfrom", _SelectorLoop)
    sock_recvfrom_into = _borrow("sock_recvfrom_into", _SelectorLoop)
    _sock_recvfrom_into = _borrow("_sock_recvfrom_into", _SelectorLoop)
    sock_sendto = _borrow("sock_sendto", _SelectorLoop)
    _sock_sendto = _borrow("_sock_sendto", _SelectorLoop)
    sock_connect = _borrow("sock_connect", _SelectorLoop)
    _sock_connect = _borrow("_sock_connect", _SelectorLoop)
    _sock_write_done = _borrow("_sock_write_done", _SelectorLoop)
    _sock_connect_cb = _borrow("_sock_connect_cb", _SelectorLoop)

    def _ensure_fd_no_transport(self, fd):
        # The C reader/writer methods refuse fds of live transports; this
        # asks them without changing anything.
        self._check_fd_transport(fd)

    def _make_socket_transport(self, sock, protocol, waiter=None, *,
                               extra=None, server=None, context=None):
        # context (3.15+): the Context every protocol callback of the
        # connection runs in (asyncio passes a copy of the caller's, or of
        # the server's, context).
        if isinstance(sock, socket.socket):
            return _core.Loop._make_socket_transport(
                self, sock, protocol, waiter, extra=extra, server=server,
                context=context)
        # Not a socket (a test double, say): the C transport works on the
        # file descriptor itself, asyncio's Python one only through the
        # object's methods, so that one is used.
        if self._transports is None:
            self._transports = weakref.WeakValueDictionary()
        kwargs = {"context": context} if context is not None else {}
        return _selector_events._SelectorSocketTransport(
            self, sock, protocol, waiter, extra, server, **kwargs)

    # TLS: asyncio's SSLProtocol over a C transport; the transport gives it
    # a C engine for its hot paths (tideloop._tls.adopt).
    _accept_connection = _borrow("_accept_connection", _SelectorLoop)
    _accept_connection2 = _borrow("_accept_connection2", _SelectorLoop)
    start_tls = _borrow("start_tls")

    def _make_ssl_transport(
            self, rawsock, protocol, sslcontext, waiter=None,
            *, server_side=False, server_hostname=None,
            extra=None, server=None,
            ssl_handshake_timeout=_constants.SSL_HANDSHAKE_TIMEOUT,
            ssl_shutdown_timeout=_constants.SSL_SHUTDOWN_TIMEOUT,
            context=None):
        ssl_protocol = _tls.new_ssl_protocol(
            self, protocol, sslcontext, waiter, server_side, server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout)
        self._make_socket_transport(rawsock, ssl_protocol, extra=extra,
                                    server=server, context=context)
        return ssl_protocol._app_transport

    def _start_serving(self, protocol_factory, sock, sslcontext=None,
                       server=None, backlog=100,
                       ssl_handshake_timeout=_constants.SSL_HANDSHAKE_TIMEOUT,
                       ssl_shutdown_timeout=_constants.SSL_SHUTDOWN_TIMEOUT,
                       context=None):
        # context (3.15+): the Server's context; each connection runs in a
        # copy of it.
        if sslcontext:
            # TLS servers accept through asyncio's path (the handshake
            # dominates their cost); plain ones through the C listener.
            # (Its context argument exists where the Server passes one.)
            extra = (context,) if context is not None else ()
            self._add_reader(sock.fileno(), self._accept_connection,
                             protocol_factory, sock, sslcontext, server,
                             backlog, ssl_handshake_timeout,
                             ssl_shutdown_timeout, *extra)
            return
        listeners = self.__dict__.setdefault("_listeners", {})
        old = listeners.pop(sock.fileno(), None)
        if old is not None:
            old.close()
        listeners[sock.fileno()] = self._serve(protocol_factory, sock, server,
                                               backlog, context)

    def _stop_serving(self, sock):
        # 3.13+: a Unix server socket made with cleanup_socket=True has its
        # path unlinked, if it is still the same file (asyncio's rule).
        cleanup = getattr(self, "_unix_server_sockets", None)
        path = sock.getsockname() if cleanup and sock in cleanup else None
        listener = self.__dict__.get("_listeners", {}).pop(sock.fileno(), None)
        if listener is not None:
            listener.close()
        else:
            self._remove_reader(sock.fileno())
        sock.close()
        if path is not None:
            prev_ino = cleanup.pop(sock)
            try:
                self._unlink_unix_socket(path, prev_ino)
            except OSError as err:
                _logger.error("Unable to clean up listening UNIX socket "
                              "%r: %r", path, err)

    async def _sendfile_native(self, transp, file, offset, count):
        transp._release_fd()
        resume_reading = transp.is_reading()
        transp.pause_reading()
        await transp._make_empty_waiter()
        try:
            return await self.sock_sendfile(transp._sock, file, offset, count,
                                            fallback=False)
        finally:
            transp._reset_empty_waiter()
            if resume_reading:
                transp.resume_reading()
            transp._claim_fd()

    def _close_listeners(self):
        # Servers' listening sockets belong to their Server objects: stop
        # accepting and let go of them, as the stock loop drops its selector.
        for listener in self.__dict__.pop("_listeners", {}).values():
            listener.close()

    # -- datagrams ----------------------------------------------------------

    create_datagram_endpoint = _borrow("create_datagram_endpoint")
