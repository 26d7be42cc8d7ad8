"""API fuzzing, second half: Server objects, the server and
connection factories and sock_* methods with wrong keyword values, and
re-entrant calls from inside every kind of callback.

Every example runs the same program on the stock ``asyncio.SelectorEventLoop``
(the spec) and on ``tideloop.new_event_loop()`` and compares the two traces
exactly: the exception TYPE of every call (or its normalised return value),
RuntimeError messages that are part of the contract ("This event loop is
already running", ...), and for the re-entrancy programs which callbacks ran
in what order.  Anything outside asyncio's own exceptions fails the test.

Only what the stock loop itself makes deterministic is recorded, so the
stock loop gives the same trace on every run of a program:

* waits are bounded by loop iterations (``_ticks``), not wall-clock time,
  except where an I/O event must arrive (a client connecting, bytes or EOF
  from a peer, a signal): those wait for the event itself with a generous
  bound (``IO_WAIT``), and stop at once when the event cannot come (reading
  paused, transport closed);
* clients connect with blocking connects over loopback, which the kernel
  completes without the loop;
* values that depend on how many bytes the kernel took per send are reduced
  (``get_write_buffer_size() > 0``, "drained >= 1 MiB"), and write limits
  below the default are not fuzzed (with a tiny high-water mark the number
  of pause/resume rounds depends on how fast the peer drains -- on the stock
  loop too);
* one wall-clock verdict remains: a factory call still pending after 0.3 s
  is "slow" (a TLS handshake with a silent peer); a mismatch involving it is
  re-checked with a 3 s bound.

Pinned by their own tests at the end: what this fuzzing found and was fixed
(sock_recv of 0 bytes, sock_sendall of b""), one deliberate difference
(backlog <= 0: the stock loop never accepts, tideloop does), and a stock
asyncio bug that tideloop does not have (a deferred close() calls connection_lost() twice:
close()/abort() inside resume_writing, or close() inside pause_writing then
abort() inside connection_lost).

TIDELOOP_FUZZ_EXAMPLES sets the number of examples per test (default 60).
"""
import asyncio
import inspect
import faulthandler
import gc
import math
import os
import signal
import socket
import sys
import ssl
import tempfile
import threading
import warnings

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

EXAMPLES = int(os.environ.get("TIDELOOP_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

# What asyncio raises for bad input or a call in the wrong state.
ACCEPTABLE = (TypeError, ValueError, RuntimeError, OSError, OverflowError,
              AttributeError, NotImplementedError, KeyError, IndexError,
              asyncio.InvalidStateError, asyncio.TimeoutError,
              asyncio.CancelledError, ssl.SSLError)


@pytest.fixture(autouse=True)
def _scaled_watchdog():
    """conftest's watchdog gives every test 30 s, about 600 examples of the
    fuzz tests here; long runs (TIDELOOP_FUZZ_EXAMPLES=5000) get time in
    proportion.  conftest's teardown disarms both timers."""
    if EXAMPLES > 200 and threading.current_thread() is threading.main_thread():
        budget = 30 + 0.15 * EXAMPLES
        signal.setitimer(signal.ITIMER_REAL, budget)
        faulthandler.dump_traceback_later(3 * budget, exit=True)
    yield


def _ipv6_available():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


_IPV6 = socket.has_ipv6 and _ipv6_available()

# A bound for waits on real I/O (the event normally arrives in microseconds).
IO_WAIT = 2.0


def _factories():
    import tideloop  # plain import: a broken build must FAIL, not skip

    return [("asyncio", asyncio.SelectorEventLoop),
            ("tideloop", tideloop.new_event_loop)]


def _exc_name(exc):
    return type(exc).__name__


async def _ticks(n=5, until=None):
    """Let the loop run ``n`` iterations (fewer if ``until()`` is true)."""
    for _ in range(n):
        if until is not None and until():
            return
        await asyncio.sleep(0)


async def _wait_for_event(pred, timeout=IO_WAIT):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred() and loop.time() < deadline:
        await asyncio.sleep(0.001)
    return bool(pred())


def _outcome(task):
    if not task.done():
        return "pending"
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    if exc is not None:
        return _exc_name(exc)
    return ("ok", _norm(task.result()))


def _norm(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, asyncio.AbstractEventLoop):
        return "<loop>"
    if isinstance(value, tuple):
        return tuple(_norm(v) for v in value)
    return type(value).__name__


def _step_coro(coro):
    """Drive a coroutine one step without a loop (the loop is closed)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return ("ok", _norm(stop.value))
    except ACCEPTABLE as exc:
        return _exc_name(exc)
    else:
        return "yielded"
    finally:
        coro.close()


WEIRD = st.sampled_from([
    None, 0, -1, 1, 2 ** 63, -(2 ** 63), 2 ** 200, 1.5, -1.5, math.nan,
    math.inf, -math.inf, "str", b"bytes", bytearray(b"ba"), (), [], {},
    object(), print, True, False,
])


# ---------------------------------------------------------------------------
# 1. Server objects: random operations in random states, on both loops
# ---------------------------------------------------------------------------

SERVER_KINDS = ["tcp", "tcp2", "streams", "unix", "sock", "unix_sock"]

SERVER_OPS = st.one_of(
    st.tuples(st.sampled_from(
        ["close", "wait_closed", "start_serving", "serve_forever",
         "serve_forever_bg", "get_loop", "is_serving", "sockets",
         "async_with", "connect", "connect", "drop_clients", "repr",
         "close_loop", "run_loop", "close_clients", "abort_clients"]),
        st.just(())),
    # The same methods called with (wrong) extra arguments.
    st.tuples(st.sampled_from(
        ["close", "wait_closed", "start_serving", "serve_forever",
         "get_loop", "is_serving"]), st.lists(WEIRD, min_size=1, max_size=2)
        .map(tuple)),
)


# close_clients()/abort_clients() arrived in 3.13: on 3.11 both loops' Server
# objects must lack them alike (AttributeError), on 3.13 both must have them.
_SYNC_OPS = ("close", "get_loop", "is_serving", "sockets", "repr",
             "close_clients", "abort_clients")


class _ServerWorld:
    """One server plus its clients on one loop; ``run(ops)`` is the trace."""

    def __init__(self, loop, kind, start_serving, tmpdir):
        self.loop = loop
        self.kind = kind
        self.start_serving = start_serving
        self.tmpdir = tmpdir
        self.server = None
        self.addr = None
        self.family = None
        self.made = 0
        self.lost = 0
        self.clients = []
        self.server_transports = []
        self.readers = []
        self.bg = None
        self.trace = []

    # -- construction --------------------------------------------------

    def _protocol(self):
        world = self

        class P(asyncio.Protocol):
            def connection_made(self, tr):
                world.made += 1
                world.server_transports.append(tr)

            def connection_lost(self, exc):
                world.lost += 1

        return P()

    async def _on_stream(self, reader, writer):
        self.made += 1
        self.readers.append(reader)
        self.server_transports.append(writer.transport)

    async def create(self):
        loop, kind, ss = self.loop, self.kind, self.start_serving
        path = os.path.join(self.tmpdir, f"s-{kind}")
        if kind == "tcp":
            srv = await loop.create_server(self._protocol, "127.0.0.1", 0,
                                           start_serving=ss)
        elif kind == "tcp2":
            # Two listening sockets (one where ::1 cannot bind).
            hosts = ["127.0.0.1", "::1"] if _IPV6 else ["127.0.0.1"]
            srv = await loop.create_server(self._protocol, hosts, 0,
                                           start_serving=ss)
        elif kind == "streams":
            srv = await asyncio.start_server(self._on_stream, "127.0.0.1", 0,
                                             start_serving=ss)
        elif kind == "unix":
            srv = await loop.create_unix_server(self._protocol, path,
                                                start_serving=ss)
        elif kind == "sock":
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            srv = await loop.create_server(self._protocol, sock=s,
                                           start_serving=ss)
        else:
            s = socket.socket(socket.AF_UNIX)
            s.bind(path)
            srv = await loop.create_unix_server(self._protocol, sock=s,
                                                start_serving=ss)
        self.server = srv
        sock = srv.sockets[0]
        self.family = sock.family
        self.addr = sock.getsockname()
        self.trace.append(("created", srv.is_serving(), len(srv.sockets)))

    # -- operations ----------------------------------------------------

    def _sync(self, name, args):
        srv = self.server
        try:
            if name == "sockets":
                socks = srv.sockets
                return ("ok", tuple(sorted((s.family, s.type)
                                           for s in socks)))
            if name == "repr":
                return ("ok", repr(srv).startswith("<Server sockets=("))
            return ("ok", _norm(getattr(srv, name)(*args)))
        except ACCEPTABLE as exc:
            return _exc_name(exc)

    def _connect(self):
        try:
            c = socket.socket(self.family, socket.SOCK_STREAM)
            c.settimeout(IO_WAIT)
            c.connect(self.addr)
        except OSError as exc:
            c.close()
            return _exc_name(exc)
        self.clients.append(c)
        return "connected"

    async def op(self, name, args):
        srv, loop = self.server, self.loop
        if name in _SYNC_OPS:
            return self._sync(name, args)
        if name == "connect":
            before = self.made
            res = self._connect()
            if res != "connected":
                return res
            if srv.is_serving():
                ok = await _wait_for_event(lambda: self.made > before)
            else:
                await _ticks(5)
                ok = self.made > before
            return (res, ok)
        if name == "drop_clients":
            n = len(self.clients)
            for c in self.clients:
                c.close()
            self.clients.clear()
            # Every accepted connection whose client is gone closes; the
            # server-side connection_lost follows within a few iterations.
            # (A streams server keeps a half-closed connection open: there
            # the readers' EOF is the event.)
            streams = self.kind == "streams"
            await _wait_for_event(lambda: all(
                r.at_eof() for r in self.readers) if streams else all(
                tr.is_closing() for tr in self.server_transports))
            await _ticks(3)
            return ("dropped", n)
        if name == "run_loop":
            await _ticks(3)
            return "ran"
        if name == "async_with":
            async def body():
                async with srv as s:
                    return s is srv
            t = loop.create_task(body())
            await _ticks(5, t.done)
            if not t.done():
                t.cancel()
                await _ticks(5, t.done)
            return _outcome(t)
        if name == "serve_forever_bg":
            if self.bg is not None and not self.bg.done():
                return "already"
            self.bg = loop.create_task(srv.serve_forever())
            await _ticks(3, self.bg.done)
            return _outcome(self.bg)
        # Coroutine methods, bounded by loop iterations.
        try:
            coro = getattr(srv, name)(*args)
        except ACCEPTABLE as exc:
            return _exc_name(exc)
        t = loop.create_task(coro)
        await _ticks(5, t.done)
        first = _outcome(t)
        if t.done():
            return first
        t.cancel()
        await _ticks(10, t.done)
        return (first, _outcome(t))

    def op_closed_loop(self, name, args):
        """The same operations once the loop is closed."""
        if name in _SYNC_OPS:
            return self._sync(name, args)
        if name == "connect":
            return self._connect()
        if name in ("drop_clients", "run_loop", "close_loop"):
            return "skipped"
        if name == "async_with":
            return _step_coro(self.server.__aenter__())
        if name == "serve_forever_bg":
            name = "serve_forever"
        try:
            coro = getattr(self.server, name)(*args)
        except ACCEPTABLE as exc:
            return _exc_name(exc)
        return _step_coro(coro)

    # -- the program ---------------------------------------------------

    def run(self, ops):
        loop = self.loop
        try:
            loop.run_until_complete(self.create())
        except ACCEPTABLE as exc:
            self.trace.append(("create", _exc_name(exc)))
            return self.trace
        i = 0
        while i < len(ops):
            name, args = ops[i]
            if name == "close_loop":
                loop.run_until_complete(self.quiesce())
                loop.close()
                self.trace.append(("close_loop", loop.is_closed(),
                                   _outcome(self.bg) if self.bg else None))
                i += 1
                break

            async def one():
                return await self.op(name, args)
            self.trace.append((name, len(args),
                               loop.run_until_complete(one())))
            i += 1
        for name, args in ops[i:]:
            self.trace.append((name, len(args),
                               self.op_closed_loop(name, args)))
        if not loop.is_closed():
            self.trace.append(("bg", _outcome(self.bg) if self.bg else None))
        else:
            # Accepted connections outlive a closed loop: their transports'
            # methods must still fail (or not) as the stock ones do.
            for tr in self.server_transports:
                for meth, args in (("is_closing", ()), ("write", (b"x",)),
                                   ("pause_reading", ()), ("close", ()),
                                   ("abort", ())):
                    try:
                        res = ("ok", _norm(getattr(tr, meth)(*args)))
                    except ACCEPTABLE as exc:
                        res = _exc_name(exc)
                    self.trace.append(("closed_loop_transport", meth, res))
            self.server_transports.clear()
        return self.trace

    async def quiesce(self):
        """Before loop.close(): a background serve_forever stops first (else
        the loop closes with a pending task in it, on both loops alike)."""
        if self.bg is not None and not self.bg.done():
            self.bg.cancel()
            await _ticks(10, self.bg.done)

    def cleanup(self):
        loop = self.loop
        for c in self.clients:
            c.close()
        if not loop.is_closed():
            async def fin():
                if self.server is not None:
                    self.server.close()
                for tr in self.server_transports:
                    tr.abort()
                if self.bg is not None and not self.bg.done():
                    self.bg.cancel()
                await _ticks(10)
            try:
                loop.run_until_complete(fin())
            finally:
                loop.close()
        else:
            if self.server is not None:
                self.server.close()
            for tr in self.server_transports:
                try:
                    tr.abort()
                except ACCEPTABLE:
                    pass


def _server_program(factory, kind, start_serving, ops):
    loop = factory()
    loop.set_debug(False)
    with tempfile.TemporaryDirectory() as tmpdir:
        world = _ServerWorld(loop, kind, start_serving, tmpdir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                return world.run(ops)
            finally:
                world.cleanup()
                world = None
                gc.collect()


@FUZZ
@given(kind=st.sampled_from(SERVER_KINDS), start_serving=st.booleans(),
       ops=st.lists(SERVER_OPS, max_size=8))
def test_server_ops_in_random_states(kind, start_serving, ops):
    traces = {name: _server_program(f, kind, start_serving, ops)
              for name, f in _factories()}
    assert traces["tideloop"] == traces["asyncio"]


# ---------------------------------------------------------------------------
# 2. The factories and sock_* methods with wrong keyword values
# ---------------------------------------------------------------------------

def _udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    return s


def _closed():
    s = socket.socket()
    s.close()
    return s


def _fresh_tcp():
    s = socket.socket()
    s.setblocking(False)
    return s


def _fresh_unix():
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    return s


# Socket kinds, built per call by _SockKit.make(name).
SOCK_KINDS = ["pair", "pair_blocking", "tcp_conn", "udp", "closed",
              "listening", "listening_idle", "fresh_tcp", "fresh_unix",
              "int_fd", "object", "none"]


class _SockKit:
    """Sockets for one call: a TCP listener with a pending client, socketpair
    ends whose peers have already sent data, ..."""

    def __init__(self):
        self.owned = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.owned.append(self.listener)
        self.addr = self.listener.getsockname()

    def _own(self, *socks):
        self.owned.extend(socks)
        return socks[0]

    def make(self, kind):
        if kind in ("pair", "pair_blocking"):
            a, b = socket.socketpair()
            b.sendall(b"data")
            a.setblocking(kind == "pair_blocking")
            return self._own(a, b)
        if kind == "tcp_conn":
            c = socket.create_connection(self.addr, timeout=IO_WAIT)
            peer, _ = self.listener.accept()
            peer.sendall(b"data")
            c.setblocking(False)
            return self._own(c, peer)
        if kind in ("listening", "listening_idle"):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(4)
            s.setblocking(False)
            self._own(s)
            if kind == "listening":
                self._own(socket.create_connection(s.getsockname(),
                                                   timeout=IO_WAIT))
            return s
        if kind == "udp":
            return self._own(_udp())
        if kind == "closed":
            return _closed()
        if kind == "fresh_tcp":
            return self._own(_fresh_tcp())
        if kind == "fresh_unix":
            return self._own(_fresh_unix())
        if kind == "int_fd":
            a, b = socket.socketpair()
            self._own(a, b)
            return a.fileno()
        if kind == "object":
            return object()
        return None

    def close(self):
        for s in self.owned:
            s.close()


class _Sock:
    """A placeholder in a kwargs dict, replaced by a real socket per loop."""

    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"<sock {self.kind}>"


class _File:
    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"<file {self.kind}>"


TIMEOUTS = st.sampled_from([None, -1, 0, 0.5, 1e300, math.nan, math.inf,
                            -math.inf, "1", 2 ** 200, True])
BAD = WEIRD
SOCKS = st.sampled_from(SOCK_KINDS).map(_Sock)
SSL_VALUES = st.sampled_from([None, False, "str", 1, object(), True,
                              "client_ctx"])
PORTS = st.sampled_from([None, 0, -1, 65536, 2 ** 200, "0", 1.5, b"0",
                         "http", "no-such-service-xyz", "listener"])
HOSTS = st.sampled_from([None, "127.0.0.1", 1, b"127.0.0.1", object(),
                         ["127.0.0.1", 1], ("127.0.0.1",), "::1", ""])

# Per method: the valid baseline and the pools of (mostly wrong) values.
FACTORY_CALLS = {
    "create_server": (
        {"host": "127.0.0.1", "port": 0},
        {"host": HOSTS, "port": PORTS, "backlog": st.sampled_from(
            ["str", 2 ** 200, -1, 0, 2 ** 31, 1.5, None, True, 1]),
         "ssl": SSL_VALUES, "reuse_address": BAD, "reuse_port": BAD,
         "sock": SOCKS, "ssl_handshake_timeout": TIMEOUTS,
         "ssl_shutdown_timeout": TIMEOUTS, "start_serving": BAD,
         "family": BAD, "flags": BAD, "bogus_kw": BAD}),
    "start_server": (
        {"host": "127.0.0.1", "port": 0},
        {"host": HOSTS, "port": PORTS, "limit": BAD, "backlog": BAD,
         "ssl": SSL_VALUES, "sock": SOCKS, "start_serving": BAD,
         "ssl_handshake_timeout": TIMEOUTS}),
    "create_unix_server": (
        {"path": "PATH"},
        {"path": st.sampled_from([None, 1, b"PATH", "x" * 200, object(),
                                  "/nonexistent-dir/x", ""]),
         "sock": SOCKS, "backlog": st.sampled_from(["str", 2 ** 200, -1,
                                                    1.5, None]),
         "ssl": SSL_VALUES, "ssl_handshake_timeout": TIMEOUTS,
         "ssl_shutdown_timeout": TIMEOUTS, "start_serving": BAD}),
    "create_connection": (
        {"host": "127.0.0.1", "port": "listener"},
        {"host": HOSTS, "port": PORTS, "ssl": SSL_VALUES,
         "server_hostname": st.sampled_from([None, "", "x", 1, b"x"]),
         "sock": SOCKS, "local_addr": st.sampled_from(
             [None, ("127.0.0.1", 0), "str", ("127.0.0.1", -1), (1, 2, 3),
              ("::1", 0)]),
         "family": BAD, "proto": BAD, "flags": BAD,
         "ssl_handshake_timeout": TIMEOUTS, "ssl_shutdown_timeout": TIMEOUTS,
         "happy_eyeballs_delay": TIMEOUTS, "interleave": BAD}),
    "create_unix_connection": (
        {"path": "PATH"},
        {"path": st.sampled_from([None, 1, b"PATH", "x" * 200, object(),
                                  "/nonexistent-dir/x"]),
         "sock": SOCKS, "ssl": SSL_VALUES,
         "server_hostname": st.sampled_from([None, "x", 1]),
         "ssl_handshake_timeout": TIMEOUTS}),
    "connect_accepted_socket": (
        {"sock": _Sock("pair")},
        {"sock": SOCKS, "ssl": SSL_VALUES, "ssl_handshake_timeout": TIMEOUTS,
         "ssl_shutdown_timeout": TIMEOUTS}),
    "sock_recv": (
        {"sock": _Sock("pair"), "n": 100},
        {"sock": SOCKS, "n": BAD}),
    "sock_recv_into": (
        {"sock": _Sock("pair"), "buf": "bytearray"},
        {"sock": SOCKS, "buf": st.sampled_from(
            ["bytearray", "empty", "bytes", "readonly", "memoryview", None,
             "str", 1, "array"])}),
    "sock_sendall": (
        {"sock": _Sock("pair"), "data": b"x"},
        {"sock": SOCKS, "data": st.sampled_from(
            [b"", b"x", "str", None, 1, bytearray(b"y"), memoryview(b"z"),
             [b"a"], bytearray()])}),
    # (Not fuzzed: a 2-D memoryview.  The stock loop's sock_sendall compares
    # bytes sent with len(view) -- the number of rows -- and spins on the
    # writer forever: a stock asyncio bug, tideloop returns.)
    "sock_accept": (
        {"sock": _Sock("listening")},
        {"sock": SOCKS}),
    "sock_connect": (
        {"sock": _Sock("fresh_tcp"), "address": "listener"},
        {"sock": SOCKS, "address": st.sampled_from(
            ["listener", None, "str", (1, 2, 3), ("127.0.0.1", -1),
             ("127.0.0.1", 2 ** 200), ("127.0.0.1", "x"), ("256.0.0.1", 1),
             b"/nonexistent"])}),
    "sock_sendfile": (
        {"sock": _Sock("pair"), "file": _File("ok")},
        {"sock": SOCKS, "file": st.sampled_from(
            [_File("ok"), _File("closed"), _File("text"), None, "str"]),
         "offset": st.sampled_from([0, -1, 2 ** 200, 1.5, "1", None]),
         "count": st.sampled_from([None, 0, -1, 1, 2 ** 200, 1.5]),
         "fallback": BAD}),
}


def _materialise(kit, tmpdir, name, kwargs, opened):
    """Placeholders -> real objects, fresh for each loop."""
    out = {}
    path = os.path.join(tmpdir, "u.sock")
    for k, v in kwargs.items():
        if isinstance(v, _Sock):
            v = kit.make(v.kind)
        elif isinstance(v, _File):
            f = open(os.path.join(tmpdir, "f.bin"),
                     "r" if v.kind == "text" else "rb")
            opened.append(f)
            if v.kind == "closed":
                f.close()
            v = f
        elif v == "listener" and k in ("port", "address"):
            v = kit.addr[1] if k == "port" else kit.addr
        elif v == "client_ctx":
            v = ssl.create_default_context()
        elif isinstance(v, (str, bytes)) and v in ("PATH", b"PATH"):
            v = path if isinstance(v, str) else os.fsencode(path)
        elif k == "buf" and isinstance(v, str):
            v = {"bytearray": bytearray(10), "empty": bytearray(),
                 "bytes": b"0123456789", "readonly": memoryview(b"0123"),
                 "memoryview": memoryview(bytearray(8)), "str": "str",
                 "array": __import__("array").array("i", [0, 0])}[v]
        out[k] = v
    if name == "create_unix_connection" and out.get("path") == path:
        # Something must listen there.
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(4)
        kit.owned.append(srv)
    return out


def _norm_result(value):
    if (isinstance(value, tuple) and len(value) == 2
            and isinstance(value[0], str) and isinstance(value[1], int)):
        return "inet-address"
    if isinstance(value, (asyncio.BaseTransport, asyncio.BaseProtocol)):
        return "transport-or-protocol"
    if isinstance(value, socket.socket):
        return "socket"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, tuple):
        return tuple(_norm_result(v) for v in value)
    return _norm(value)


def _dispose(value):
    if isinstance(value, tuple):
        for v in value:
            _dispose(v)
    elif isinstance(value, asyncio.BaseTransport):
        value.abort() if hasattr(value, "abort") else value.close()
    elif isinstance(value, asyncio.AbstractServer):
        value.close()
    elif isinstance(value, socket.socket):
        value.close()


def _factory_call(factory, name, kwargs, debug, bound=0.3):
    loop = factory()
    loop.set_debug(debug)
    loop.set_exception_handler(lambda lp, ctx: None)
    kit = _SockKit()
    opened = []
    with tempfile.TemporaryDirectory() as tmpdir, warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        # Happy eyeballs with a bad delay: asyncio.staggered drops an
        # un-awaited Event.wait() coroutine, on both loops.
        warnings.simplefilter("ignore", RuntimeWarning)
        with open(os.path.join(tmpdir, "f.bin"), "wb") as f:
            f.write(b"f" * 1000)
        real = _materialise(kit, tmpdir, name, kwargs, opened)
        args = []
        if name.startswith("create_") or name == "connect_accepted_socket":
            args.append(asyncio.Protocol)
        if name == "start_server":
            async def on_client(reader, writer):
                writer.close()
            args.append(on_client)
            method = asyncio.start_server
        else:
            method = getattr(loop, name)

        async def main():
            try:
                aw = method(*args, **real)
            except ACCEPTABLE as exc:
                return ("call", _exc_name(exc))

            async def await_it():
                return await aw
            t = loop.create_task(await_it())
            # Every baseline call completes at once or after one I/O event
            # (a numeric getaddrinfo is an executor hop on the stock loop);
            # what is still pending after ``bound`` seconds (a TLS handshake
            # with a silent peer, a recv on an empty datagram socket) waits
            # for good.
            await _wait_for_event(t.done, bound)
            if not t.done():
                t.cancel()
                await _ticks(20, t.done)
                return ("slow", _outcome(t))
            if not t.cancelled() and t.exception() is None:
                res = t.result()
                _dispose(res)
                await _ticks(3)
                return ("ok", _norm_result(res))
            return ("await", _outcome(t))

        try:
            return loop.run_until_complete(main())
        finally:
            try:
                loop.run_until_complete(_ticks(3))
            finally:
                loop.close()
                kit.close()
                for f in opened:
                    f.close()
                gc.collect()


@st.composite
def _factory_calls(draw):
    name = draw(st.sampled_from(sorted(FACTORY_CALLS)))
    base, pools = FACTORY_CALLS[name]
    keys = draw(st.lists(st.sampled_from(sorted(pools)), min_size=1,
                         max_size=3, unique=True))
    kwargs = dict(base)
    for k in keys:
        kwargs[k] = draw(pools[k])
    return name, kwargs


@FUZZ
@given(call=_factory_calls(), debug=st.booleans())
def test_factories_and_sock_methods_with_wrong_keywords(call, debug):
    name, kwargs = call
    results = {lname: _factory_call(f, name, kwargs, debug)
               for lname, f in _factories()}
    if (results["tideloop"] != results["asyncio"]
            and "slow" in (results["tideloop"][0], results["asyncio"][0])):
        # "Still pending after 0.3 s" is a wall-clock verdict: on a loaded
        # machine confirm it with a 10x longer bound before comparing.
        results = {lname: _factory_call(f, name, kwargs, debug, bound=3.0)
                   for lname, f in _factories()}
    assert results["tideloop"] == results["asyncio"]


# ---------------------------------------------------------------------------
# 3. Re-entrant calls from inside callbacks
# ---------------------------------------------------------------------------

LOOP_SITES = ["soon", "timer", "reader", "exc_handler", "task_factory",
              "signal"]
TRANSPORT_SITES = ["made", "data", "eof", "lost", "pause_writing",
                   "resume_writing", "get_buffer", "buffer_updated"]
LOOP_ACTIONS = ["run_forever", "run_until_complete", "run_other_loop",
                "run_foreign_loop", "close_loop", "stop", "cancel_self",
                "remove_reader", "call_soon_nested", "raise", "is_running",
                "create_task"]
TRANSPORT_ACTIONS = ["tr_close", "tr_abort", "tr_write", "tr_write_eof",
                     "tr_pause_reading", "tr_resume_reading", "tr_set_limits",
                     "tr_get_size", "tr_is_closing", "server_close"]
# set_write_buffer_limits arguments.  Valid limits stay >= the default (a
# tiny high-water mark makes the number of pause/resume rounds depend on how
# fast the peer drains, i.e. on timing, on the stock loop too).
LIMITS = [(), (None, None), (2 ** 22,), (2 ** 22, 2 ** 20), (2 ** 200,),
          (-1,), (1, 5), ("x",), (math.nan,), (None, -1), (1.5e7,)]
BIG = 2 ** 20
SIG = signal.SIGUSR1

# RuntimeError messages that are part of the contract; other messages carry
# reprs and fd numbers, so only their type is compared.
CONTRACT_MESSAGES = {
    "This event loop is already running",
    "Cannot run the event loop while another loop is running",
    "Cannot close a running event loop",
    "Event loop stopped before Future completed.",
    "Event loop is closed",
    "Cannot call write() after write_eof()",
}

RULES = st.lists(st.one_of(
    st.tuples(st.sampled_from(LOOP_SITES + TRANSPORT_SITES),
              st.sampled_from(LOOP_ACTIONS), st.just(0)),
    st.tuples(st.sampled_from(TRANSPORT_SITES),
              st.sampled_from(TRANSPORT_ACTIONS),
              st.integers(0, len(LIMITS) - 1)),
), min_size=1, max_size=4)


def _exc_text(exc):
    msg = str(exc)
    if isinstance(exc, RuntimeError) and msg in CONTRACT_MESSAGES:
        return (type(exc).__name__, msg)
    return type(exc).__name__


def _ctx_text(ctx):
    msg = ctx.get("message", "")
    if msg.startswith("Exception in callback"):
        msg = "Exception in callback"
    exc = ctx.get("exception")
    return (msg, type(exc).__name__ if exc is not None else None)


class _Boom(Exception):
    pass


class _Reentry:
    """One program on one loop: loop-level callbacks first, then one
    transport driven through data, write pressure, EOF and close; the rules
    say which call to make from which callback (each rule fires the first
    time its callback runs)."""

    def __init__(self, loop, same_factory, foreign_factory, rules, mode,
                 buffered, tmpdir):
        self.loop = loop
        self.same_factory = same_factory
        self.foreign_factory = foreign_factory
        self.rules = {}
        for site, action, arg in rules:
            self.rules.setdefault(site, []).append((action, arg))
        self.sites = set(self.rules)
        self.mode = mode
        self.buffered = buffered
        self.tmpdir = tmpdir
        self.trace = []
        self.count = {}
        self.handle = None
        self.reader_fd = None
        self.tr = None
        self.server = None
        self.peer = None
        self.owned = []
        self.buf = bytearray(65536)

    # -- callbacks -----------------------------------------------------

    def hit(self, site, detail=None):
        self.trace.append(site if detail is None else (site, detail))
        self.count[site] = self.count.get(site, 0) + 1
        boom = False
        for action, arg in self.rules.pop(site, ()):
            if action == "raise":
                boom = True
                self.trace.append((site, "raise"))
                continue
            try:
                res = self.act(site, action, arg)
            except Exception as exc:
                self.trace.append((site, action, "raised", _exc_text(exc)))
            else:
                self.trace.append((site, action, "ok", res))
        if boom:
            raise _Boom(site)

    def act(self, site, action, arg):
        loop, tr = self.loop, self.tr
        if action == "run_forever":
            loop.run_forever()
            return "returned"
        if action == "run_until_complete":
            loop.run_until_complete(loop.create_future())
            return "returned"
        if action in ("run_other_loop", "run_foreign_loop"):
            other = (self.same_factory if action == "run_other_loop"
                     else self.foreign_factory)()
            try:
                other.call_soon(other.stop)
                other.run_forever()
            finally:
                other.close()
            # A nested loop that (wrongly) ran must not have unset ours.
            return asyncio.get_running_loop() is loop
        if action == "close_loop":
            loop.close()
            return "returned"
        if action == "stop":
            return loop.stop()
        if action == "cancel_self":
            if self.handle is None:
                return "n/a"
            self.handle.cancel()
            return self.handle.cancelled()
        if action == "remove_reader":
            if self.reader_fd is not None:
                return loop.remove_reader(self.reader_fd)
            if tr is not None and tr.get_extra_info("socket") is not None:
                return loop.remove_reader(
                    tr.get_extra_info("socket").fileno())
            return "n/a"
        if action == "call_soon_nested":
            loop.call_soon(self.trace.append, ("nested", site))
            return None
        if action == "is_running":
            return loop.is_running()
        if action == "create_task":
            async def body():
                self.trace.append(("task_ran", site))
            return type(loop.create_task(body())).__name__ == "Task"
        if action == "server_close":
            if self.server is None:
                return "n/a"
            return self.server.close()
        if tr is None:
            return "n/a"
        if action == "tr_close":
            return tr.close()
        if action == "tr_abort":
            return tr.abort()
        if action == "tr_write":
            return tr.write(b"x")
        if action == "tr_write_eof":
            return tr.write_eof()
        if action == "tr_pause_reading":
            return tr.pause_reading()
        if action == "tr_resume_reading":
            return tr.resume_reading()
        if action == "tr_set_limits":
            return tr.set_write_buffer_limits(*LIMITS[arg])
        if action == "tr_get_size":
            return tr.get_write_buffer_size() > 0
        if action == "tr_is_closing":
            return tr.is_closing()
        raise AssertionError(action)

    def _protocol(self):
        world = self

        class P(asyncio.Protocol):
            def connection_made(self, tr):
                world.tr = tr
                world.hit("made")

            def data_received(self, data):
                world.hit("data", bytes(data))

            def eof_received(self):
                world.hit("eof")

            def connection_lost(self, exc):
                world.hit("lost", _exc_name(exc) if exc else None)

            def pause_writing(self):
                world.hit("pause_writing")

            def resume_writing(self):
                world.hit("resume_writing")

        class BP(P, asyncio.BufferedProtocol):
            def get_buffer(self, sizehint):
                world.hit("get_buffer", sizehint)
                return world.buf

            def buffer_updated(self, nbytes):
                world.hit("buffer_updated", bytes(world.buf[:nbytes]))

        return BP() if self.buffered else P()

    def _exc_handler(self, loop, ctx):
        self.hit("exc_handler", _ctx_text(ctx))

    def _task_factory(self, loop, coro, **kwargs):
        try:
            self.hit("task_factory")
        except BaseException:
            coro.close()
            raise
        return asyncio.Task(coro, loop=loop, **kwargs)

    def _raiser(self):
        raise _Boom("scheduled")

    def _on_reader(self):
        try:
            os.read(self.reader_fd, 16)
        except BlockingIOError:
            pass
        self.hit("reader")

    # -- the driver ----------------------------------------------------

    def _reading(self):
        tr = self.tr
        return tr is not None and not tr.is_closing() and tr.is_reading()

    def _seen(self, *sites):
        return any(self.count.get(s) for s in sites)

    async def _step_sites(self):
        loop = self.loop
        if "soon" in self.sites:
            self.handle = loop.call_soon(self.hit, "soon")
            await _ticks(2)
        if "timer" in self.sites:
            self.handle = loop.call_later(0.001, self.hit, "timer")
            await _wait_for_event(lambda: self._seen("timer"))
        self.handle = None
        if "reader" in self.sites:
            a, b = socket.socketpair()
            self.owned += [a, b]
            a.setblocking(False)
            self.reader_fd = a.fileno()
            loop.add_reader(self.reader_fd, self._on_reader)
            b.send(b"r")
            await _wait_for_event(lambda: self._seen("reader"))
            self.trace.append(("driver_remove_reader",
                               loop.remove_reader(self.reader_fd)))
            self.reader_fd = None
        if "exc_handler" in self.sites:
            loop.call_soon(self._raiser)
            await _ticks(2)
        if "task_factory" in self.sites:
            async def body():
                return "body"
            loop.set_task_factory(self._task_factory)
            try:
                t = loop.create_task(body())
            except Exception as exc:
                self.trace.append(("driver_create_task", _exc_text(exc)))
                t = None
            finally:
                loop.set_task_factory(None)
            if t is not None:
                self.trace.append(("driver_task", await t))
        if "signal" in self.sites:
            loop.add_signal_handler(SIG, self.hit, "signal")
            os.kill(os.getpid(), SIG)
            await _wait_for_event(lambda: self._seen("signal"))
            self.trace.append(("driver_remove_signal",
                               loop.remove_signal_handler(SIG)))

    def _peer_call(self, fn, arg):
        try:
            fn(arg)
        except OSError as exc:
            # The transport was closed or aborted from a callback.
            self.trace.append(("peer", fn.__name__, _exc_name(exc)))

    async def _step_transport(self):
        loop = self.loop
        proto = self._protocol()
        if self.mode == "pair":
            a, b = socket.socketpair()
            self.owned += [a, b]
            await loop.connect_accepted_socket(lambda: proto, a)
        else:
            path = os.path.join(self.tmpdir, "r.sock")
            self.server = await loop.create_unix_server(lambda: proto, path)
            b = socket.socket(socket.AF_UNIX)
            self.owned.append(b)
            b.settimeout(IO_WAIT)
            b.connect(path)
            await _wait_for_event(lambda: self._seen("made"))
        self.peer = b
        b.setblocking(False)
        # 1. Bytes in.
        self._peer_call(b.sendall, b"data")
        await _wait_for_event(lambda: self._seen(
            "data", "buffer_updated", "lost") or not self._reading())
        self.trace.append(("step", "data", self._reading()))
        # 2. Write pressure: pause_writing inside write(), resume_writing
        #    as the peer drains.
        tr = self.tr
        if tr is not None and not tr.is_closing():
            try:
                tr.write(b"w" * BIG)
            except Exception as exc:
                self.trace.append(("driver_write", _exc_text(exc)))
        total = 0
        while total < BIG:
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(b, 1 << 18),
                                               IO_WAIT)
            except (OSError, asyncio.TimeoutError):
                break
            if not chunk:
                break
            total += len(chunk)
        self.trace.append(("step", "drained", total >= BIG))
        # 3. EOF in.
        self._peer_call(b.shutdown, socket.SHUT_WR)
        await _wait_for_event(lambda: self._seen("eof", "lost")
                              or not self._reading())
        self.trace.append(("step", "eof", self._reading()))
        # 4. The end: a transport that saw EOF closes itself; one that
        #    stopped reading (or never closes) is aborted by the driver.
        await _wait_for_event(lambda: self._seen("lost") or (
            not self._reading() and not (tr and tr.is_closing())))
        if not self._seen("lost") and self.tr is not None:
            self.trace.append(("driver_abort", self.tr.is_closing()))
            self.tr.abort()
            await _wait_for_event(lambda: self._seen("lost"))
        self.trace.append(("step", "end", self.count.get("lost")))

    async def main(self):
        self.loop.set_exception_handler(self._exc_handler)
        await self._step_sites()
        await self._step_transport()

    def run(self):
        loop = self.loop
        task = loop.create_task(self.main())
        for _ in range(20):
            try:
                loop.run_until_complete(task)
                break
            except RuntimeError as exc:
                if task.done():
                    raise
                self.trace.append(("driver", _exc_text(exc)))
        return self.trace

    def cleanup(self):
        loop = self.loop
        try:
            if not loop.is_closed():
                if self.tr is not None and not self._seen("lost"):
                    self.tr.abort()
                if self.server is not None:
                    self.server.close()
                if self.reader_fd is not None:
                    loop.remove_reader(self.reader_fd)
                loop.remove_signal_handler(SIG)
                loop.set_task_factory(None)
                # A stop() from a callback of the program's last iteration
                # can leave run_until_complete's own stop queued: the first
                # run here then ends early (the same on every loop).
                ticks = loop.create_task(_ticks(5))
                for _ in range(3):
                    try:
                        loop.run_until_complete(ticks)
                        break
                    except RuntimeError:
                        if ticks.done():
                            raise
        finally:
            for s in self.owned:
                s.close()
            if not loop.is_closed():
                loop.close()


def _stock_bug(rules):
    """Programs where the stock loop itself is wrong, kept out of the
    differential comparison (each has its own test below)."""
    pairs = {(site, action) for site, action, _ in rules}
    if pairs & {("resume_writing", "tr_close"), ("resume_writing", "tr_abort")}:
        # in the stock transport, _write_ready calls _call_connection_lost()
        # itself after close()/abort() already scheduled it, so the stock
        # loop reports an AttributeError from the second call.
        return "test_connection_lost_once_after_deferred_close"
    if {("pause_writing", "tr_close"), ("lost", "tr_abort")} <= pairs:
        # The same stock bug: a close() deferred until the buffer drains
        # ends in _write_ready without marking the connection lost, so an
        # abort() from connection_lost() schedules a second
        # _call_connection_lost().
        return "test_connection_lost_once_after_deferred_close"
    if STOCK_RUN_FOREVER_RESETS and any(a.startswith("run_") for _, a, _ in rules):
        # 3.13.0: a refused nested run_forever() (of this loop or another,
        # directly or through run_until_complete) still runs its clean-up
        # and unsets the running loop of the run it was called from.
        return "3.13.0 run_forever() clean-up bug"
    return None


# 3.13.0 calls _run_forever_setup() inside the try whose finally cleans up.
STOCK_RUN_FOREVER_RESETS = "try:\n            self._run_forever_setup()" in \
    inspect.getsource(asyncio.BaseEventLoop.run_forever)


def _reentry_program(names, rules, mode, buffered):
    factories = dict(_factories())
    same, foreign = names
    loop = factories[same]()
    loop.set_debug(False)
    with tempfile.TemporaryDirectory() as tmpdir, warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        world = _Reentry(loop, factories[same], factories[foreign], rules,
                         mode, buffered, tmpdir)
        try:
            return world.run()
        finally:
            world.cleanup()
            world = None
            gc.collect()


@FUZZ
@given(rules=RULES, mode=st.sampled_from(["pair", "server"]),
       buffered=st.booleans())
def test_reentrant_calls_from_callbacks(rules, mode, buffered):
    assume(_stock_bug(rules) is None)
    stock = _reentry_program(("asyncio", "tideloop"), rules, mode, buffered)
    tide = _reentry_program(("tideloop", "asyncio"), rules, mode, buffered)
    assert tide == stock


# ---------------------------------------------------------------------------
# 4. The differences found, pinned (kept out of the random programs above)
# ---------------------------------------------------------------------------

def _both(fn):
    return {name: fn(factory) for name, factory in _factories()}


# The stock accept loop runs range(backlog) times per readiness, 3.14's
# range(backlog + 1).
STOCK_ACCEPT_EXTRA = 1 if "range(backlog + 1)" in inspect.getsource(
    asyncio.selector_events.BaseSelectorEventLoop._accept_connection) else 0


@pytest.mark.parametrize("backlog", [0, -1])
def test_backlog_zero_or_negative_accepts(backlog):
    def run(factory):
        loop = factory()
        made = []

        class P(asyncio.Protocol):
            def connection_made(self, tr):
                made.append(tr)

        async def main():
            srv = await loop.create_server(P, "127.0.0.1", 0,
                                           backlog=backlog)
            c = socket.create_connection(srv.sockets[0].getsockname(),
                                         timeout=IO_WAIT)
            await asyncio.sleep(0.1)
            c.close()
            for tr in made:
                tr.abort()
            srv.close()
            await _ticks(3)
            return len(made)

        try:
            return loop.run_until_complete(main())
        finally:
            loop.close()

    # A deliberate difference: the stock loop's accept loop is
    # range(backlog) (3.14: range(backlog + 1)), so with backlog <= 0 (3.14:
    # < 0) it never accepts and spins on the ready listener; tideloop's C
    # listener accepts one at a time.
    results = _both(run)
    stock_accepts = 1 if backlog + STOCK_ACCEPT_EXTRA > 0 else 0
    assert results == {"asyncio": stock_accepts, "tideloop": 1}


def _recv_zero(factory, kind, method):
    loop = factory()
    if kind == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    elif kind == "unix":
        s = socket.socket(socket.AF_UNIX)
    else:
        s = socket.socket()
    s.setblocking(False)
    arg = 0 if method == "sock_recv" else bytearray()

    async def main():
        try:
            return ("ok", await asyncio.wait_for(
                getattr(loop, method)(s, arg), 0.2))
        except (OSError, asyncio.TimeoutError) as exc:
            return _exc_name(exc)

    try:
        return loop.run_until_complete(main())
    finally:
        s.close()
        loop.close()


@pytest.mark.parametrize("method", ["sock_recv", "sock_recv_into"])
@pytest.mark.parametrize("kind", ["tcp", "unix", "udp"])
def test_sock_recv_zero_bytes(kind, method):
    results = _both(lambda f: _recv_zero(f, kind, method))
    assert results["tideloop"] == results["asyncio"]


def _sendall_empty(factory, kind):
    loop = factory()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    if kind == "closed":
        s.close()

    async def main():
        try:
            return ("ok", await loop.sock_sendall(s, b""))
        except OSError as exc:
            return (_exc_name(exc), exc.errno)

    try:
        return loop.run_until_complete(main())
    finally:
        s.close()
        loop.close()


@pytest.mark.parametrize("kind", ["closed", "unconnected_udp"])
def test_sock_sendall_empty_data_calls_send(kind):
    results = _both(lambda f: _sendall_empty(f, kind))
    assert results["tideloop"] == results["asyncio"]


# Fixed in 3.14 (the transport's close() after connection_lost is a no-op).
STOCK_CONNECTION_LOST_TWICE = sys.version_info < (3, 14)


@pytest.mark.parametrize("name", [
    pytest.param("asyncio", marks=pytest.mark.xfail(
        STOCK_CONNECTION_LOST_TWICE, strict=True, reason=(
            "stock asyncio bug up to 3.13: the stock transport calls "
            "connection_lost() a second time and reports an AttributeError"))),
    "tideloop"])
@pytest.mark.parametrize("scenario", [
    "close_in_resume_writing", "abort_in_resume_writing",
    "close_in_pause_writing_abort_in_connection_lost"])
def test_connection_lost_once_after_deferred_close(name, scenario):
    """Why these (callback, call) pairs are kept out of the re-entrancy
    programs: there the stock loop is the one that is wrong."""
    loop = dict(_factories())[name]()
    events = []

    class P(asyncio.Protocol):
        def connection_made(self, tr):
            self.tr = tr

        def pause_writing(self):
            events.append("pause")
            if scenario.startswith("close_in_pause"):
                self.tr.close()

        def resume_writing(self):
            events.append("resume")
            if scenario.endswith("_in_resume_writing"):
                getattr(self.tr, scenario.split("_")[0])()

        def connection_lost(self, exc):
            events.append("lost")
            if scenario.endswith("abort_in_connection_lost"):
                self.tr.abort()

    loop.set_exception_handler(
        lambda lp, ctx: events.append(("exception", ctx["message"])))

    async def main():
        a, b = socket.socketpair()
        try:
            tr, _ = await loop.connect_accepted_socket(P, a)
            tr.write(b"w" * BIG)
            b.setblocking(False)
            total = 0
            while total < BIG:
                chunk = await asyncio.wait_for(loop.sock_recv(b, 1 << 18),
                                               IO_WAIT)
                if not chunk:
                    break
                total += len(chunk)
            await _wait_for_event(lambda: "lost" in events)
            await _ticks(5)
        finally:
            b.close()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert events.count("lost") == 1
    assert not [e for e in events if isinstance(e, tuple)]
