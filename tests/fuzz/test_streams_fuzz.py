"""Differential fuzzing of asyncio streams: random scenarios of peer actions
and StreamReader/StreamWriter calls run on stock asyncio, on tideloop with
the C data path of streams (``tideloop-c``) and on tideloop with it off
(``tideloop-python``); the three outcome traces must be identical.

A scenario is a stream pair (open_connection() over a socket pair, a TCP or
Unix client, or a start_server() TCP/Unix server connection; sometimes a
small ``limit=``) and a list of actions:

* the peer (a plain non-blocking socket, driven by the test itself) sends
  chunks split at random points, half-closes, closes or resets;
* the reader's read(n)/read(-1)/readline()/readexactly(n)/readuntil(sep)
  and async iteration (odd arguments too), each in its own task, left in
  flight, cancelled (at once, after k loop iterations, or in the same step
  as the peer's bytes), or called while another one waits; asyncio's own
  methods taking turns with the C ones on one reader; a read's coroutine
  driven by hand (send/throw/close, reuse);
* at_eof()/exception(), feed_data()/feed_eof()/set_exception() called
  directly (feeding after an exception, after EOF), the transport's
  pause_reading()/resume_reading();
* the writer's write()/writelines() (bad types too), drain(), write_eof(),
  close() and wait_closed().

Timing is made deterministic: after every action the test "settles" the
loop -- it runs loop iterations (``await asyncio.sleep(0)``, the peer
draining what the writer sent) until no bytes are in flight either way
(FIONREAD/SIOCOUTQ on both sockets), the transport's write buffer is
empty, an expected EOF has arrived, and nothing observable changed for a
few iterations.  Between settles the only timing is the action itself, so
all three loops see the same byte boundaries.

The trace holds every call's result (bytes) or exception (type, and the key
attributes: IncompleteReadError.partial/expected, LimitOverrunError.consumed
and message, str() of ValueError/RuntimeError/TypeError, errno of OSError),
and after every action the reader's remaining buffer, _eof, at_eof(), its
exception, the calls still in flight and what the peer received.  Calls
that finish within one settle are compared as a set: which of two tasks
woken in the same iteration runs first is not part of streams' contract.

TIDELOOP_FUZZ_EXAMPLES sets the number of examples per test (CI: the
default 150 for the socket-pair test, 60 for the network one); the long
mode is e.g. ``TIDELOOP_FUZZ_EXAMPLES=5000``.  TIDELOOP_FUZZ_DEBUG=1 prints why a settle ran out of time.
"""
import asyncio
import contextlib
import faulthandler
import fcntl
import functools
import itertools
import os
import shutil
import signal
import socket
import struct
import tempfile
import termios
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_ENV_EXAMPLES = os.environ.get("TIDELOOP_FUZZ_EXAMPLES")


def _fuzz(default):
    return settings(
        max_examples=int(_ENV_EXAMPLES or default),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )




@pytest.fixture(autouse=True)
def _scaled_watchdog():
    """conftest's watchdog gives every test 30 s; a long run (and shrinking
    a failure) gets time in proportion to its examples.  conftest's
    teardown disarms both timers."""
    examples = int(_ENV_EXAMPLES or 150)
    if threading.current_thread() is threading.main_thread():
        budget = 30 + 0.4 * examples
        signal.setitimer(signal.ITIMER_REAL, budget)
        faulthandler.dump_traceback_later(3 * budget, exit=True)
    yield


ATTEMPTS = 3              # a mismatch is re-run: only reproducible ones fail
QUIET = 3                 # iterations with nothing changing that end a settle
SPIN = 300                # iterations of a settle before it sleeps
SETTLE_TIMEOUT = 5.0      # seconds a settle may take at most
SIOCOUTQ = termios.TIOCOUTQ
SIOCINQ = termios.FIONREAD

# ---------------------------------------------------------------------------
# scenarios
# ---------------------------------------------------------------------------

TOKENS = [b"\n", b"\r\n", b"-", b"--", b"a", b"b", b"ab", b"abc", b"xxxxxxx",
          b"\x00", b"\xff", b"\n\n"]
chunk = st.one_of(
    st.lists(st.sampled_from(TOKENS), min_size=1, max_size=8).map(b"".join),
    st.binary(min_size=1, max_size=24),
)


class Big(bytes):
    """A long payload (past the writer's high-water mark, past twice a small
    limit) that hypothesis reports in a few words."""

    def __new__(cls, size, unit):
        self = super().__new__(cls, (unit * (size // len(unit) + 1))[:size])
        self.desc = (size, unit)
        return self

    def __repr__(self):
        return f"Big{self.desc!r}"



# The loop reads at most 128 KiB - 256 bytes a time (asyncio: 256 KiB): a
# peer's bytes are held back when more than MAX_PENDING would wait in the
# kernel, so that every loop takes them in the same pieces.  Over TCP the
# bytes must also all be in the loop's socket before the loop runs (else
# it may read the first segments alone): less, within the first receive
# window, and the peer waits until they were acknowledged.
MAX_PENDING = 100000
MAX_PENDING_TCP = 32768
big = st.builds(Big, st.sampled_from([300, 5000, 70000, 100000]),
                st.sampled_from([b"a", b"ab\n", b"-\n-"]))
data = st.one_of(chunk, chunk, chunk, big)

SEPARATORS = [b"\n", b"--", b"ab", b"\r\n", b"abc", b"a", b"xxxxxxxxx", b"",
              bytearray(b"\n"), memoryview(b"--"), (b"\n", b"--"), (b"abc", b"b"),
              [b"-", b"\n\n"], (), (b"",), (b"a", b""), "\n", None]

read_op = st.one_of(
    st.tuples(st.just("read"), st.one_of(
        st.sampled_from([-1, 0, 1, 2, 3, 5, 8, 100, 100000, 2 ** 70, -2 ** 70,
                         True, 2.0, None, "1"]),
        st.integers(1, 40))),
    st.tuples(st.just("readline")),
    st.tuples(st.just("readexactly"), st.one_of(
        st.sampled_from([-1, 0, 1, 2, 3, 100, 70000, 2 ** 70, -2 ** 70, False, 2.0]),
        st.integers(1, 40))),
    st.tuples(st.just("readuntil"), st.sampled_from(SEPARATORS)),
    st.tuples(st.just("readuntil_default")),
)

action = st.one_of(
    # the peer
    st.tuples(st.just("send"), st.lists(data, min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("send"), st.lists(data, min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("peer_eof")),
    st.tuples(st.just("peer_close"), st.booleans()),          # True: reset
    # the reader
    st.tuples(st.just("op"), read_op),
    st.tuples(st.just("op"), read_op),
    st.tuples(st.just("op"), read_op),
    st.tuples(st.just("pyop"), read_op),
    st.tuples(st.just("op"), st.just(("anext",))),
    st.tuples(st.just("op_cancel"), read_op, st.integers(0, 2)),
    st.tuples(st.just("cancel"), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("send_cancel"), chunk, st.integers(0, 5), st.booleans()),
    st.tuples(st.just("coro"), read_op, st.sampled_from(
        ["close_new", "throw_new", "throw_stop_new", "send_value", "send_close", "send_throw",
         "send_twice", "send_done"])),
    st.tuples(st.just("at_eof")),
    st.tuples(st.just("feed_data"), st.one_of(chunk, st.just(b""))),
    st.tuples(st.just("feed_eof")),
    st.tuples(st.just("set_exception")),
    st.tuples(st.just("pause_reading")),
    st.tuples(st.just("resume_reading")),
    # the writer
    st.tuples(st.just("write"), data),
    st.tuples(st.just("writelines"), st.lists(st.one_of(
        chunk, chunk.map(bytearray), chunk.map(memoryview)), max_size=4)),
    st.tuples(st.just("write_bad"), st.sampled_from(["str", 5, None, [b"ok", "str"]])),
    st.tuples(st.just("drain")),
    st.tuples(st.just("write_eof")),
    st.tuples(st.just("close")),
    st.tuples(st.just("wait_closed")),
)
LIMITS = st.sampled_from([None, None, 1, 2, 3, 5, 8, 16, 64, 1000, 2 ** 70, 2.5, True])
actions = st.lists(action, min_size=3, max_size=30)


# ---------------------------------------------------------------------------
# outcomes
# ---------------------------------------------------------------------------

def describe(exc):
    """What is compared of an exception."""
    if exc is None:
        return None
    name = type(exc).__name__
    if isinstance(exc, asyncio.IncompleteReadError):
        return (name, exc.partial, exc.expected)
    if isinstance(exc, asyncio.LimitOverrunError):
        return (name, exc.consumed, str(exc))
    if isinstance(exc, asyncio.CancelledError):
        return (name,)
    if isinstance(exc, OSError):
        return (name, exc.errno)
    if isinstance(exc, (ValueError, RuntimeError, TypeError, AssertionError)):
        return (name, str(exc))
    return (name,)


def _ioctl(sock, request):
    try:
        if sock.fileno() < 0:
            return 0
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0"))[0]
    except OSError:
        return 0


class Peer:
    """The other end: a plain non-blocking socket the test drives."""

    def __init__(self, sock, tcp):
        self.sock = sock
        self.tcp = tcp
        self.sock.setblocking(False)
        self.received = bytearray()
        self.eof = False
        self.closed = False
        self.shut = False
        self.errors = []

    def drain(self):
        while not self.closed and not self.eof:
            try:
                got = self.sock.recv(262144)
            except BlockingIOError:
                return
            except OSError as exc:
                self.errors.append(describe(exc))
                return
            if not got:
                self.eof = True
                return
            self.received += got

    def send(self, payload, pending):
        """pending: the bytes waiting in the loop's socket."""
        if self.closed:
            return "peer closed"
        if pending + len(payload) > (MAX_PENDING_TCP if self.tcp else MAX_PENDING):
            return "held back"
        view = memoryview(bytes(payload))
        while view:
            try:
                n = self.sock.send(view)
            except BlockingIOError:
                return "blocked"       # reading is paused and buffers are full
            except OSError as exc:
                return describe(exc)
            view = view[n:]
        deadline = time.monotonic() + 1.0
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.0001)
        return None

    def in_flight(self):
        """Bytes sent by the peer and not yet in the loop's socket."""
        if self.closed or not self.tcp:
            return 0
        return _ioctl(self.sock, SIOCOUTQ)

    def close(self, reset):
        if self.closed:
            return
        if reset:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 struct.pack("ii", 1, 0))
        self.sock.close()
        self.closed = True


class Scenario:
    """One run of a scenario on one loop; .trace is what is compared."""

    def __init__(self, reader, writer, peer):
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self.sock = writer.get_extra_info("socket")
        self.trace = []
        self.done = []                 # (op id, outcome) since the last action
        self.tasks = {}                # op id -> task, in flight
        self.next_id = 0
        self.expect_eof = False

    # ---- the loop, settled ----

    def _state(self):
        r = self.reader
        return (len(r._buffer), r._eof, r._paused, r._exception is not None,
                r._waiter is None, len(self.done), len(self.tasks),
                len(self.peer.received), self.peer.eof,
                self.writer.transport.is_closing(), self.writer.transport.is_reading())

    def unread(self):
        """The peer's bytes the loop has not read yet."""
        if self.writer.transport.is_closing():
            return 0
        return _ioctl(self.sock, SIOCINQ) + self.peer.in_flight()

    def _busy_why(self):
        tr = self.writer.transport
        return dict(peer_outq=self.peer.in_flight(), closing=tr.is_closing(),
                    reading=tr.is_reading(), inq=_ioctl(self.sock, SIOCINQ),
                    outq=_ioctl(self.sock, SIOCOUTQ), wbuf=tr.get_write_buffer_size(),
                    expect_eof=self.expect_eof, peer_closed=self.peer.closed)

    def _busy(self):
        r, tr = self.reader, self.writer.transport
        closing = tr.is_closing()
        # bytes on their way in matter while the loop reads them
        if not closing and tr.is_reading() and (
                self.peer.in_flight() or _ioctl(self.sock, SIOCINQ)):
            return True
        if not closing and not self.peer.closed and _ioctl(self.sock, SIOCOUTQ):
            return True
        # (3.12/3.13.0's writelines() after the connection was lost leaves
        # its bytes in the stock transport's buffer for good)
        if (tr.get_write_buffer_size() and not self.peer.closed
                and not self.writer._protocol._connection_lost):
            return True
        if self.expect_eof and not (r._eof or not tr.is_reading() or
                                    self.writer._protocol._connection_lost or
                                    isinstance(r._exception, OSError)):
            return True
        return False

    async def settle(self):
        quiet, last = 0, None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_TIMEOUT
        for i in itertools.count():
            # bytes on their way through the kernel under load: after a
            # burst of iterations, short sleeps
            await asyncio.sleep(0 if i < SPIN else 0.0005)
            self.peer.drain()
            state = self._state()
            if state == last and not self._busy():
                quiet += 1
                if quiet >= QUIET:
                    return
            else:
                quiet = 0
            last = state
            if loop.time() > deadline:
                self.trace.append("unsettled")
                if os.environ.get("TIDELOOP_FUZZ_DEBUG"):
                    print("unsettled", self._busy_why(), self._state(), flush=True)
                return

    def snapshot(self, label):
        r = self.reader
        self.trace.append((
            label,
            tuple(sorted(self.done, key=repr)),
            bytes(r._buffer), r._eof, r.at_eof(), describe(r.exception()),
            tuple(sorted(self.tasks)),
            bytes(self.peer.received), self.peer.eof,
        ))
        self.done = []

    # ---- the calls ----

    def start(self, op, python=False):
        """op in a task of its own; python: asyncio's own method (the
        class's function) on the same reader, taking turns with the C one."""
        ident = self.next_id
        self.next_id += 1
        name, *args = op
        if name == "readuntil_default":
            name = "readuntil"
        if name in ("drain", "wait_closed"):
            coro_fn = getattr(self.writer, name)
        elif name == "anext":
            coro_fn = self.reader.__anext__
        elif python:
            coro_fn = getattr(asyncio.StreamReader, name).__get__(self.reader)
        else:
            coro_fn = getattr(self.reader, name)

        async def run():
            try:
                result = await coro_fn(*args)
            except BaseException as exc:   # noqa: B902 -- recorded
                self.done.append((ident, "raised", describe(exc)))
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            finally:
                self.tasks.pop(ident, None)
            self.done.append((ident, "returned", result))

        self.tasks[ident] = asyncio.get_running_loop().create_task(run())
        return ident

    def coro_protocol(self, op, how):
        """The coroutine protocol driven by hand on a read's awaitable (the
        C path's StreamOp, or asyncio's coroutine): send, throw, close and
        reuse, as a program (or a framework's task) may."""
        name, *args = op
        if name == "readuntil_default":
            name = "readuntil"
        try:
            coro = (self.reader.__anext__() if name == "anext"
                    else getattr(self.reader, name)(*args))
        except Exception as exc:
            return ("raised", describe(exc))
        steps = []

        def step(fn, *a):
            try:
                got = fn(*a)
            except StopIteration as exc:
                steps.append(("returned", exc.value))
                return False
            except Exception as exc:
                steps.append(("raised", describe(exc)))
                return False
            steps.append(("yielded", asyncio.isfuture(got) and not got.done()))
            return True

        try:
            if how == "close_new":
                steps.append(("closed", coro.close()))
            elif how == "throw_new":
                step(coro.throw, ValueError("thrown"))
            elif how == "throw_stop_new":      # PEP 479
                step(coro.throw, StopIteration("thrown"))
            elif how == "send_value":
                step(coro.send, 1)
            elif step(coro.send, None):
                if how == "send_close":
                    steps.append(("closed", coro.close()))
                elif how == "send_throw":
                    step(coro.throw, ValueError("thrown"))
                elif how == "send_twice":
                    step(coro.send, None)       # the future is not done
                elif how == "send_done":
                    self.reader.feed_data(b"\n")
                    step(coro.send, None)
            step(coro.send, None)               # reuse: over by now
        finally:
            coro.close()
        return (tuple(steps), self.reader._waiter is None)

    def pick(self, j):
        if not self.tasks:
            return None
        return self.tasks[sorted(self.tasks)[j % len(self.tasks)]]

    def call(self, fn, *args):
        try:
            return ("returned", fn(*args))
        except Exception as exc:
            return ("raised", describe(exc))

    async def act(self, action):
        kind = action[0]
        out = None
        if kind == "send":
            pieces, settle_between = action[1], action[2]
            out = []
            for piece in pieces:
                out.append(self.peer.send(piece, self.unread()))
                if settle_between:
                    await self.settle()
        elif kind == "peer_eof":
            if not self.peer.closed and not self.peer.shut:
                try:
                    self.peer.sock.shutdown(socket.SHUT_WR)
                except OSError as exc:          # reset by the loop's side
                    out = describe(exc)
                self.peer.shut = True
                self.expect_eof = True
        elif kind == "peer_close":
            self.peer.drain()
            self.peer.close(action[1])
            self.expect_eof = True
        elif kind == "op":
            out = self.start(action[1])
        elif kind == "pyop":
            out = self.start(action[1], python=True)
        elif kind in ("pause_reading", "resume_reading"):
            out = self.call(getattr(self.writer.transport, kind))
        elif kind == "op_cancel":
            task = self.tasks[self.start(action[1])]
            for _ in range(action[2]):
                await asyncio.sleep(0)
            out = task.cancel()
        elif kind == "cancel":
            task = self.pick(action[1])
            if task is not None:
                for _ in range(action[2]):
                    await asyncio.sleep(0)
                out = task.cancel()
        elif kind == "send_cancel":
            # the bytes and the cancellation in the same step, either order
            payload, j, send_first = action[1:]
            task = self.pick(j)
            if send_first:
                out = self.peer.send(payload, self.unread())
            if task is not None:
                task.cancel()
            if not send_first:
                out = self.peer.send(payload, self.unread())
        elif kind == "coro":
            out = self.coro_protocol(action[1], action[2])
        elif kind == "at_eof":
            out = (self.reader.at_eof(), describe(self.reader.exception()))
        elif kind == "feed_data":
            out = self.call(self.reader.feed_data, action[1])
        elif kind == "feed_eof":
            out = self.call(self.reader.feed_eof)
        elif kind == "set_exception":
            out = self.call(self.reader.set_exception, ValueError("fuzz"))
        elif kind == "write":
            out = self.call(self.writer.write, bytes(action[1]))
        elif kind == "write_bad":
            out = self.call(self.writer.write, action[1])
        elif kind == "writelines" and (self.writer.transport.is_closing()
                                       and _stock_writelines_fails_after_close()):
            out = "skipped: the stock transport raises TypeError here"
        elif kind == "writelines":
            out = self.call(self.writer.writelines, action[1])
        elif kind == "write_eof":
            out = self.call(self.writer.write_eof)
        elif kind == "close":
            out = self.call(self.writer.close)
        elif kind in ("drain", "wait_closed"):
            out = self.start((kind,))
        else:  # pragma: no cover
            raise AssertionError(kind)
        await self.settle()
        self.snapshot((kind, out))

    async def finish(self):
        """Everything still in flight ends: the peer's EOF, then cancel."""
        if not self.peer.closed and not self.peer.shut:
            with contextlib.suppress(OSError):
                self.peer.sock.shutdown(socket.SHUT_WR)
            self.expect_eof = True
        await self.settle()
        self.snapshot("peer eof")
        for ident in sorted(self.tasks):
            self.tasks[ident].cancel()
        await self.settle()
        self.snapshot("cancelled")
        self.writer.close()
        await self.settle()
        # (a cancelled wait_closed() task cancelled the protocol's future)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self.writer.wait_closed()
        self.peer.drain()
        self.snapshot("closed")


@functools.cache
def _stock_writelines_fails_after_close():
    """Does stock asyncio's socket transport raise TypeError for a
    writelines() after close() (3.12, 3.13.0: close() drops the method
    writelines() calls)?  tideloop does not copy that."""
    loop = asyncio.SelectorEventLoop()
    a, b = socket.socketpair()

    async def probe():
        _, writer = await asyncio.open_connection(sock=a)
        writer.close()
        try:
            writer.writelines([b"x"])
        except TypeError:
            return True
        finally:
            await asyncio.sleep(0)
        return False

    try:
        return loop.run_until_complete(probe())
    finally:
        loop.close()
        a.close()
        b.close()


# ---------------------------------------------------------------------------
# stream pairs
# ---------------------------------------------------------------------------

async def _wait_for(fut, what):
    for _ in range(5000):
        if fut.done():
            return fut.result()
        await asyncio.sleep(0.001)
    raise AssertionError(f"no {what}")


def _listener(family, address):
    lsock = socket.socket(family, socket.SOCK_STREAM)
    lsock.bind(address)
    lsock.listen(1)
    return lsock


async def open_pair(kind, limit, tmpdir):
    """(reader, writer, peer socket, things to close) for a pair kind."""
    kw = {} if limit is None else {"limit": limit}
    loop = asyncio.get_running_loop()
    if kind == "pair":
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=a, **kw)
        return reader, writer, b, []
    if kind in ("tcp_client", "unix_client"):
        if kind == "tcp_client":
            lsock = _listener(socket.AF_INET, ("127.0.0.1", 0))
            host, port = lsock.getsockname()
            reader, writer = await asyncio.open_connection(host, port, **kw)
        else:
            path = os.path.join(tmpdir, "s")
            lsock = _listener(socket.AF_UNIX, path)
            reader, writer = await asyncio.open_unix_connection(path, **kw)
        lsock.settimeout(5)
        peer, _ = lsock.accept()
        return reader, writer, peer, [lsock]
    got = loop.create_future()

    def connected(r, w):
        if not got.done():
            got.set_result((r, w))

    if kind == "tcp_server":
        server = await asyncio.start_server(connected, "127.0.0.1", 0, **kw)
        peer = socket.create_connection(server.sockets[0].getsockname()[:2], timeout=5)
    else:
        path = os.path.join(tmpdir, "s")
        server = await asyncio.start_unix_server(connected, path, **kw)
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.settimeout(5)
        peer.connect(path)
    reader, writer = await _wait_for(got, "connection")
    server.close()
    return reader, writer, peer, []


async def run_scenario(kind, limit, steps):
    tmpdir = tempfile.mkdtemp(prefix="tl-sfuzz-")
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda lp, ctx: None)
    closers = []
    try:
        reader, writer, peer_sock, closers = await open_pair(kind, limit, tmpdir)
        closers.append(peer_sock)
        sc = Scenario(reader, writer, Peer(peer_sock, kind.startswith("tcp")))
        await sc.settle()
        sc.snapshot("open")
        for step in steps:
            await sc.act(step)
        await sc.finish()
        return sc.trace
    finally:
        for s in closers:
            s.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


# ---------------------------------------------------------------------------
# the three loops
# ---------------------------------------------------------------------------

def _run(factory, kind, limit, steps):
    loop = factory()
    try:
        return loop.run_until_complete(run_scenario(kind, limit, steps))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        asyncio.set_event_loop(None)


def _tideloop():
    import tideloop  # plain import: a broken build must FAIL, not skip

    return tideloop.new_event_loop()


def _traces(kind, limit, steps):
    from tideloop import _core

    _stock_writelines_fails_after_close()      # known before a loop runs
    before = _core.streams_stats()["connections"]
    # the switch is read when a connection is made: on for the whole run
    previous = _core.set_streams_fast_path(True)
    try:
        c = _run(_tideloop, kind, limit, steps)
    finally:
        _core.set_streams_fast_path(previous)
    adopted = _core.streams_stats()["connections"] - before
    previous = _core.set_streams_fast_path(False)
    try:
        python = _run(_tideloop, kind, limit, steps)
    finally:
        _core.set_streams_fast_path(previous)
    stock = _run(asyncio.SelectorEventLoop, kind, limit, steps)
    return {"asyncio": stock, "tideloop-c": c, "tideloop-python": python}, adopted


def _short(obj):
    """obj with long bytes abridged, for the failure message."""
    if isinstance(obj, (bytes, bytearray)) and len(obj) > 60:
        return f"<{len(obj)} bytes {bytes(obj[:20])!r}...{bytes(obj[-20:])!r}>"
    if isinstance(obj, (tuple, list)):
        return type(obj)(_short(x) for x in obj)
    return obj


def _first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    return len(a), a[len(a):], b[len(a):]


def differential(kind, limit, steps):
    from tideloop import _core

    on = _core.set_streams_fast_path(True)
    _core.set_streams_fast_path(on)
    last = None
    for _ in range(ATTEMPTS):
        traces, adopted = _traces(kind, limit, steps)
        if on:
            assert adopted >= 1, "the C path of streams did not adopt the connection"
        stock = traces["asyncio"]
        if all(t == stock for t in traces.values()):
            return
        last = traces
    stock = last["asyncio"]
    for name in ("tideloop-c", "tideloop-python"):
        got = last[name]
        if got != stock:
            i, want, have = _first_difference(stock, got)
            pytest.fail(f"{name} differs from asyncio at step {i}:\n"
                        f"  asyncio: {_short(want)!r}\n  {name}: {_short(have)!r}\n"
                        f"scenario: kind={kind!r} limit={limit!r} steps={steps!r}")


@_fuzz(150)
@given(limit=LIMITS, steps=actions)
def test_streams_socketpair_differential(limit, steps):
    differential("pair", limit, steps)


@_fuzz(60)
@given(kind=st.sampled_from(["tcp_client", "tcp_server", "unix_client", "unix_server"]),
       limit=LIMITS, steps=actions)
def test_streams_network_differential(kind, limit, steps):
    differential(kind, limit, steps)
