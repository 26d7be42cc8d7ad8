"""tideloop: a drop-in asyncio event loop for CPython, written in C, for Linux.

    import tideloop
    tideloop.run(main())                                   # like asyncio.run
    asyncio.Runner(loop_factory=tideloop.new_event_loop)   # 3.11
    tideloop.install()                                     # policy for asyncio.run (3.11-3.15)

The per-event work (ready queue, timers, poller, handles, readers/writers,
signal dispatch, call_soon_threadsafe wakeups, tasks and futures creation)
lives in the C extension ``tideloop._core``.  This module is the thin public
layer: once-per-run orchestration that asyncio already defines.
"""

from . import _build_check  # noqa: F401  (first: an unbuilt checkout says so)

import asyncio
import collections.abc
import errno
import os
import selectors
import signal
import socket
import sys
import threading
import warnings
import weakref

from asyncio import constants as _constants
from asyncio import selector_events as _selector_events
from asyncio import sslproto as _sslproto
from asyncio import unix_events as _unix_events
from asyncio.log import logger as _logger

from . import _compat
from . import _core
from ._diag_state import register_loop as _register_loop
from . import _tls  # sets up the TLS engine and its routes at import
from . import _streams  # sets up asyncio streams' C data path at import
from ._version import __version__

__all__ = ("Loop", "new_event_loop", "run", "EventLoopPolicy", "install",
           "Handle", "TimerHandle", "__version__")

Handle = _core.Handle
TimerHandle = _core.TimerHandle

os.register_at_fork(after_in_child=_core._after_fork_child)

# Once-per-call orchestration that asyncio implements only in terms of the
# loop's API (getaddrinfo, sock_connect, _make_socket_transport,
# _start_serving, ...) is the running interpreter's own code, placed on the
# tideloop class: messages, log text and edge cases are the stock loop's of
# that version, while everything per event or per byte runs in C.
# (_compat.borrow records each and stands in for any a version lacks.)
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


class _SelectorView(collections.abc.Mapping):
    """A read-only view of the loop's fd table shaped like the selector of
    asyncio's selector loop (``loop._selector``: ``get_key``, ``get_map``),
    for code that inspects which fds have a reader or writer."""

    def __init__(self, loop):
        self._loop = loop

    def get_key(self, fileobj):
        info = self._loop._fd_handles(fileobj)
        if info is None:
            raise KeyError(f"{fileobj!r} is not registered")
        fd, reader, writer = info
        events = ((selectors.EVENT_READ if reader is not None else 0) |
                  (selectors.EVENT_WRITE if writer is not None else 0))
        return selectors.SelectorKey(fileobj, fd, events, (reader, writer))

    def get_map(self):
        return self

    def __getitem__(self, fd):
        return self.get_key(fd)

    def __iter__(self):
        return iter(self._loop._watched_fds())

    def __len__(self):
        return len(self._loop._watched_fds())


def _reap_quietly(pid):
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class Loop(_core.Loop, asyncio.AbstractEventLoop):
    """The tideloop event loop: asyncio's behaviour, in C."""

    _exception_handler = None
    _default_executor = None
    _executor_shutdown_called = False
    _asyncgens_shutdown_called = False
    _coroutine_origin_tracking_enabled = False
    _coroutine_origin_tracking_saved_depth = None
    _old_wakeup_fd = None
    _diag_on_close = None   # tideloop.diagnostics' report at close (leaks)

    def __init__(self):
        _register_loop(self)    # listed by tideloop.diagnostics.loops()
        self._asyncgens = weakref.WeakSet()
        self._set_debug_flag(_compat.is_debug_mode())
        # CPython's C Task looks up loop.call_soon with a plain getattr on
        # every wakeup, which allocates a bound method each time; one kept
        # in the instance dict is found first and reused.
        self.call_soon = self.call_soon
        self._child_pidfds = {}        # pidfd -> pid of watched children
        self._exited_children = set()  # exited, reaped on the next iteration
        if _compat.LOOP_WATCHERS:
            # 3.14: each loop has a child watcher of asyncio's kind (pidfd
            # where pidfds work, else a thread per child).  With the pidfd
            # one, tideloop watches the pidfds itself (_watch_child).
            self._watcher = _compat.LOOP_WATCHERS.new()
        if _compat.UNIX_SERVER_CLEANUP:
            # 3.13+: listening Unix sockets whose path is unlinked when the
            # server stops (asyncio's create_unix_server fills it in).
            self._unix_server_sockets = {}
        if os.environ.get("TIDELOOP_DIAGNOSTICS"):
            from . import diagnostics
            try:
                diagnostics._from_environment(self, os.environ["TIDELOOP_DIAGNOSTICS"])
            except BaseException:
                self.close()
                raise

    def __repr__(self):
        return (f"<{self.__class__.__name__} running={self.is_running()} "
                f"closed={self.is_closed()} debug={self.get_debug()}>")

    def __del__(self, _warn=warnings.warn):
        if not self.is_closed():
            _warn(f"unclosed event loop {self!r}", ResourceWarning, source=self)
            if not self.is_running():
                self.close()

    # -- lifecycle --------------------------------------------------------

    @property
    def _selector(self):
        return None if self.is_closed() else _SelectorView(self)

    _check_running = _borrow("_check_running")
    run_until_complete = _borrow("run_until_complete")
    _set_coroutine_origin_tracking = _borrow("_set_coroutine_origin_tracking")

    def set_debug(self, enabled):
        self._set_debug_flag(enabled)
        if self.is_running():
            self.call_soon_threadsafe(self._set_coroutine_origin_tracking,
                                      enabled)

    def close(self):
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self.is_closed():
            return
        if self.get_debug():
            _logger.debug("Close %r", self)
        if self._diag_on_close is not None:
            self._diag_on_close(self)
        # Signal handlers go first: the interpreter must stop writing signal
        # numbers into our pipe before the pipe is closed.
        if self._signal_handlers:
            if not sys.is_finalizing():
                for sig in list(self._signal_handlers):
                    self.remove_signal_handler(sig)
            else:
                warnings.warn(f"Closing the loop {self!r} on interpreter "
                              f"shutdown stage, skipping signal handlers "
                              f"removal", ResourceWarning, source=self)
                self._signal_handlers.clear()
                self._restore_wakeup_fd()
        if self._child_pidfds:
            self._release_children()
        # Servers' listening sockets belong to their Server objects: stop
        # accepting and let go of them, as the stock loop drops its selector.
        for listener in self.__dict__.pop("_listeners", {}).values():
            listener.close()
        super().close()
        self._signal_pipe_close()
        # The bound call_soon kept for Tasks (__init__) is a cycle through
        # the instance dict: without it a closed loop is freed as soon as
        # its last user lets go, not at the next collection (anyio checks
        # that asyncio.run() + to_thread leaves no loop behind).
        self.__dict__.pop("call_soon", None)
        self._executor_shutdown_called = True
        executor = self._default_executor
        if executor is not None:
            self._default_executor = None
            executor.shutdown(wait=False)

    # -- async generators, executors ---------------------------------------

    _asyncgen_firstiter_hook = _borrow("_asyncgen_firstiter_hook")
    _asyncgen_finalizer_hook = _borrow("_asyncgen_finalizer_hook")
    shutdown_asyncgens = _borrow("shutdown_asyncgens")
    shutdown_default_executor = _borrow("shutdown_default_executor")
    _do_shutdown = _borrow("_do_shutdown")
    _check_default_executor = _borrow("_check_default_executor")
    _check_callback = _borrow("_check_callback")
    run_in_executor = _borrow("run_in_executor")
    set_default_executor = _borrow("set_default_executor")

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

    # -- errors ------------------------------------------------------------

    get_exception_handler = _borrow("get_exception_handler")
    set_exception_handler = _borrow("set_exception_handler")
    default_exception_handler = _borrow("default_exception_handler")
    call_exception_handler = _borrow("call_exception_handler")

    # -- signals -----------------------------------------------------------

    def _check_signal(self, sig):
        if not isinstance(sig, int):
            raise TypeError(f"sig must be an int, not {sig!r}")
        if sig not in signal.valid_signals():
            raise ValueError(f"invalid signal number {sig}")

    def _restore_wakeup_fd(self):
        old, self._old_wakeup_fd = self._old_wakeup_fd, None
        try:
            signal.set_wakeup_fd(-1 if old is None else old)
        except (ValueError, OSError) as exc:
            _logger.info("set_wakeup_fd(-1) failed: %s", exc)

    def add_signal_handler(self, sig, callback, *args):
        """Add a handler for a signal.  Main thread only."""
        if (_compat.iscoroutine(callback) or
                _compat.iscoroutinefunction(callback)):
            raise TypeError("coroutines cannot be used "
                            "with add_signal_handler()")
        self._check_signal(sig)
        self._check_closed()
        wfd = self._signal_pipe_open()
        try:
            # Raises ValueError outside the main thread: a loop running in
            # another thread cannot take signals.
            old = signal.set_wakeup_fd(wfd)
        except (ValueError, OSError) as exc:
            raise RuntimeError(str(exc))
        if self._old_wakeup_fd is None and old != wfd:
            self._old_wakeup_fd = old
        handle = self._make_handle(callback, *args)
        self._signal_handlers[sig] = handle
        try:
            signal.signal(sig, _core._sighandler_noop)
            signal.siginterrupt(sig, False)
        except OSError as exc:
            del self._signal_handlers[sig]
            if not self._signal_handlers:
                self._restore_wakeup_fd()
            if exc.errno == errno.EINVAL:
                raise RuntimeError(f"sig {sig} cannot be caught")
            raise

    def remove_signal_handler(self, sig):
        """Remove a handler for a signal; True if one was removed."""
        self._check_signal(sig)
        try:
            del self._signal_handlers[sig]
        except KeyError:
            return False
        handler = (signal.default_int_handler if sig == signal.SIGINT
                   else signal.SIG_DFL)
        try:
            signal.signal(sig, handler)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise RuntimeError(f"sig {sig} cannot be caught")
            raise
        if not self._signal_handlers:
            self._restore_wakeup_fd()
        return True

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

    # Python transports (see _make_socket_transport), by fd; made on first use.
    _transports = None

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

    # -- datagrams, pipes, subprocesses (orchestration; transports in C) ---

    create_datagram_endpoint = _borrow("create_datagram_endpoint")
    connect_read_pipe = _borrow("connect_read_pipe")
    connect_write_pipe = _borrow("connect_write_pipe")
    subprocess_exec = _borrow("subprocess_exec")
    subprocess_shell = _borrow("subprocess_shell")
    _log_subprocess = _borrow("_log_subprocess")

    async def _make_subprocess_transport(self, protocol, args, shell,
                                         stdin, stdout, stderr, bufsize,
                                         extra=None, **kwargs):
        # asyncio's own subprocess transport: subprocess.Popen (so every
        # keyword Popen takes works), the pipes as tideloop's C transports,
        # and the exit watched through a pidfd instead of a child watcher --
        # unless the application set a watcher other than the per-process
        # ones (Threaded: asyncio's default, which get_child_watcher()
        # installs on first use; Pidfd): that one is used, since a watcher
        # that reaps every child would otherwise steal ours.
        watcher = _compat.current_child_watcher()
        if watcher is not None and not isinstance(
                watcher, _compat.PER_PROCESS_WATCHERS):
            return await self._make_subprocess_transport_with_watcher(
                protocol, args, shell, stdin, stdout, stderr, bufsize,
                extra=extra, **kwargs)
        waiter = self.create_future()
        transp = _unix_events._UnixSubprocessTransport(
            self, protocol, args, shell, stdin, stdout, stderr, bufsize,
            waiter=waiter, extra=extra, **kwargs)
        if _compat.LOOP_WATCHERS and not isinstance(
                self._watcher, _compat.LOOP_WATCHERS.pidfd):
            # 3.14 without usable pidfds: the stock per-loop thread watcher.
            self._watcher.add_child_handler(transp.get_pid(),
                                            self._exit_published, transp)
        else:
            self._watch_child(transp)
        try:
            await waiter
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException:
            transp.close()
            if _compat.PY >= (3, 14):
                # 3.14 shields the wait from the cancellation that got here.
                await asyncio.shield(transp._wait())
            else:
                await transp._wait()
            raise
        return transp

    if _compat.HAS_CHILD_WATCHERS:   # 3.11-3.13: an application's watcher
        _make_subprocess_transport_with_watcher = _borrow(
            "_make_subprocess_transport", _UnixLoop)
        _child_watcher_callback = _borrow("_child_watcher_callback", _UnixLoop)

    def _watch_child(self, transp):
        pid = transp.get_pid()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            # No pidfd (kernel < 5.3, or a seccomp filter): a thread blocks
            # in waitpid() for this child, as asyncio's default watcher does.
            threading.Thread(target=self._wait_child_thread,
                             args=(pid, transp), daemon=True,
                             name=f"tideloop-waitpid-{pid}").start()
            return
        self._child_pidfds[pidfd] = pid
        self._add_reader(pidfd, self._child_pidfd_ready, pidfd, pid, transp)

    @staticmethod
    def _reap(pid, transp, flags):
        try:
            wpid, status = os.waitpid(pid, flags)
        except ChildProcessError:
            # Reaped elsewhere: Popen.poll() (the transport's close() calls
            # it) knows the code; asyncio's watchers report 255.
            code = transp._proc.returncode if transp._proc is not None else None
            if code is None:
                _logger.warning("Unknown child process pid %d, will report "
                                "returncode 255", pid)
                code = 255
            return code
        if wpid == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def _child_pidfd_ready(self, pidfd, pid, transp):
        # Readable: the child has exited (a zombie until reaped, so its PID
        # cannot be reused).  It is reaped and its exit published in one
        # step (gh-127049: in between, a send_signal() could hit a recycled
        # PID), when the stock loop of this interpreter publishes it: at once
        # on 3.14, an iteration later before.
        self._stop_watching_pidfd(pidfd)
        # Logged where the stock default watcher logs it (3.11's threaded one).
        log = not _compat.STOCK_WATCHES_PIDFD
        if _compat.EXIT_PUBLISHED_AT_ONCE:
            self._reap_and_publish(pid, transp, log)
        else:
            self._exited_children.add(pid)      # reaped on close if still here
            self.call_soon(self._reap_and_publish, pid, transp, log)

    def _stop_watching_pidfd(self, pidfd):
        self._remove_reader(pidfd)
        del self._child_pidfds[pidfd]
        os.close(pidfd)

    @staticmethod
    def _exit_published(pid, code, transp):
        transp._process_exited(code)

    def _wait_child_thread(self, pid, transp):
        # Wait without reaping (WNOWAIT): the PID stays the child's until the
        # loop thread reaps it and publishes the exit in one step.
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        try:
            self.call_soon_threadsafe(self._reap_and_publish, pid, transp, True)
        except RuntimeError:        # the loop closed meanwhile
            _reap_quietly(pid)
            _logger.warning("Loop %r that handles pid %r is closed", self, pid)

    def _reap_and_publish(self, pid, transp, log):
        self._exited_children.discard(pid)
        code = self._reap(pid, transp, 0)
        if log and self.get_debug():
            _logger.debug("process %s exited with returncode %s", pid, code)
        transp._process_exited(code)

    def _release_children(self):
        # The loop closes with children still running: stop watching them,
        # but reap them when they exit (no zombies), as asyncio's threaded
        # watcher would.
        pidfds, self._child_pidfds = self._child_pidfds, {}
        for pidfd, pid in pidfds.items():
            self._remove_reader(pidfd)
            os.close(pidfd)
            threading.Thread(target=_reap_quietly, args=(pid,), daemon=True,
                             name=f"tideloop-waitpid-{pid}").start()
        exited, self._exited_children = self._exited_children, set()
        for pid in exited:      # exited, their reaping still queued
            _reap_quietly(pid)

    # -- diagnostics -------------------------------------------------------

    def diagnostics(self):
        """The loop's health as plain data (safe from any thread): counters
        of what it has done, where its time went, the current ready, timer
        and fd counts, and histograms of iteration time, poll time,
        scheduling lag, timer lateness and (while callback timing is on)
        callback time.  See :mod:`tideloop.diagnostics`."""
        return self._diagnostics()

    def stats(self):
        """Counters of what the loop has done: iterations, callbacks run,
        I/O events, timers fired, slow callbacks, seconds spent polling, and
        the current ready/timer/fd counts (a subset of :meth:`diagnostics`)."""
        d = self._diagnostics()
        s = {k: d[k] for k in _STATS_COUNTERS}
        s["poll_time"] = d["time_polling"]
        for k in ("ready", "timers", "fds", "backend"):
            s[k] = d[k]
        return s


_STATS_COUNTERS = ("iterations", "polls", "callbacks", "io_events", "timers_fired",
                   "slow_callbacks")


def new_event_loop():
    """Return a new tideloop event loop."""
    return Loop()


_NO_POLICIES = (
    "{what} needs asyncio's event loop policies, which Python {version} "
    "does not have; choose the loop where the program runs instead: "
    "tideloop.run(main()), asyncio.run(main(), loop_factory=tideloop.new_event_loop) "
    "or asyncio.Runner(loop_factory=tideloop.new_event_loop) "
    "('python -m tideloop run app.py' runs a whole program on tideloop)")


def _no_policies(what):
    return RuntimeError(_NO_POLICIES.format(what=what, version=sys.version.split()[0]))


_POLICY_DOC = """An asyncio policy whose new_event_loop() returns tideloop loops.

    The policy API is deprecated from Python 3.14: prefer
    ``asyncio.run(main(), loop_factory=tideloop.new_event_loop)`` or
    ``tideloop.run(main())``.  Where asyncio has no policies any more
    (CPython 3.16) the name stays, so that code naming it still imports,
    but making one raises RuntimeError saying what to use instead."""

if _compat.DefaultPolicyBase is not None:
    class EventLoopPolicy(_compat.DefaultPolicyBase):
        __doc__ = _POLICY_DOC
        _loop_factory = Loop

        def __repr__(self):
            return f"<{self.__class__.__name__}>"
else:
    class EventLoopPolicy:
        __doc__ = _POLICY_DOC

        def __new__(cls, *args, **kwargs):
            raise _no_policies("tideloop.EventLoopPolicy")


def install():
    """Make tideloop the loop that asyncio.new_event_loop()/asyncio.run() use,
    by setting tideloop's policy (tideloop.EventLoopPolicy).

    Where asyncio has no policies (CPython 3.16), nothing can make
    asyncio.run() choose tideloop short of replacing asyncio's own functions,
    which the library does not do to a process: install() raises RuntimeError
    and changes nothing.  Use ``tideloop.run(main())`` or
    ``asyncio.run(main(), loop_factory=tideloop.new_event_loop)`` there, or
    ``python -m tideloop run app.py`` for a whole program."""
    if not _compat.POLICY_API:
        raise _no_policies("tideloop.install()")
    _compat.set_event_loop_policy(EventLoopPolicy())


def run(main, *, debug=None):
    """Run a coroutine on a new tideloop loop: the contract of asyncio.run()."""
    if asyncio.events._get_running_loop() is not None:
        raise RuntimeError(
            "asyncio.run() cannot be called from a running event loop")
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)
