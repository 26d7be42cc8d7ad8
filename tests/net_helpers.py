"""Helpers shared by the networking tests (TCP / Unix stream transports,
servers, sock_* methods, sendfile, streams).  Import as ``net_helpers``.

Everything here is loop-agnostic: it only uses the public asyncio API, so the
same test runs on the stock selector loop (the spec) and on tideloop.
"""
import asyncio
import gc
import os
import resource
import socket
import struct

import pytest

# Bounded waits: no single await in a test should take longer than this.
STEP_TIMEOUT = 5.0


def open_fds():
    """The set of open file descriptors of this process."""
    return set(os.listdir("/proc/self/fd"))


def fd_leak_check(before, collect=False):
    """Assert no fd opened since ``before`` is still open.

    No garbage collection first (unless ``collect``): asyncio closes a
    transport's socket when connection_lost runs, not when the transport is
    collected, so an fd that only a finalizer would close counts as leaked."""
    if collect:
        gc.collect()
    after = open_fds()
    leaked = sorted(after - before, key=int)
    details = []
    for fd in leaked:
        try:
            details.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    # The fd that listdir itself used may differ between snapshots only if
    # something else leaked, so plain set comparison is exact enough.
    assert not details, f"leaked fds: {details}"


def arun(loop, coro, timeout=STEP_TIMEOUT * 2):
    """Run ``coro`` on ``loop`` with an overall time bound."""
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


async def wait(aw, timeout=STEP_TIMEOUT):
    return await asyncio.wait_for(aw, timeout)


async def wait_until(pred, timeout=STEP_TIMEOUT, interval=0.005):
    """Poll ``pred()`` until true (or fail after ``timeout`` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached in {timeout} s: {pred}")
        await asyncio.sleep(interval)


def ipv6_available():
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not ipv6_available(), reason="::1 cannot bind")


@pytest.fixture
def dead_port():
    """A loopback TCP port where nothing listens (bound, never listening, so
    no one else can take it): connecting to it is refused."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def rst_close(sock):
    """Close ``sock`` so the peer gets a RST (SO_LINGER on, timeout 0)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def raise_nofile(need):
    """Raise the soft RLIMIT_NOFILE to the hard limit when below ``need``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        target = hard if hard != resource.RLIM_INFINITY else need
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")


def collapse(events):
    """Collapse runs of the same event ('data', 'data', 'data' -> 'data')."""
    out = []
    for ev in events:
        if not out or out[-1] != ev:
            out.append(ev)
    return out


class Recorder(asyncio.Protocol):
    """A protocol that records its callbacks in order.

    ``events`` holds 'made', 'data', 'eof', 'lost', 'pause', 'resume' (use
    ``collapse(events)`` to merge the runs of 'data').  Hooks (``on_made``,
    ``on_data``, ``on_eof``) run inside the callback with the protocol as
    argument; ``keep_open`` is what eof_received() returns.
    """

    def __init__(self, loop=None, *, keep_open=False, on_made=None,
                 on_data=None, on_eof=None, on_lost=None):
        self.loop = loop or asyncio.get_event_loop()
        self.events = []
        self.data = bytearray()
        self.chunks = 0
        self.data_types = set()
        self.transport = None
        self.exc = "never called"
        self.keep_open = keep_open
        self.on_made, self.on_data, self.on_eof, self.on_lost = (
            on_made, on_data, on_eof, on_lost)
        self.made = self.loop.create_future()
        self.eof = self.loop.create_future()
        self.lost = self.loop.create_future()
        self.paused = self.loop.create_future()
        self.resumed = self.loop.create_future()
        self._waiters = []

    def connection_made(self, transport):
        self.events.append("made")
        self.transport = transport
        if self.on_made:
            self.on_made(self)
        if not self.made.done():
            self.made.set_result(transport)

    def data_received(self, data):
        self.events.append("data")
        self.data_types.add(type(data))
        self.data += data
        self.chunks += 1
        if self.on_data:
            self.on_data(self, data)
        self._check_waiters()

    def eof_received(self):
        self.events.append("eof")
        if self.on_eof:
            self.on_eof(self)
        if not self.eof.done():
            self.eof.set_result(None)
        return self.keep_open

    def connection_lost(self, exc):
        self.events.append("lost")
        self.exc = exc
        if self.on_lost:
            self.on_lost(self, exc)
        if not self.lost.done():
            self.lost.set_result(exc)
        self._check_waiters()

    def pause_writing(self):
        self.events.append("pause")
        if not self.paused.done():
            self.paused.set_result(None)

    def resume_writing(self):
        self.events.append("resume")
        if not self.resumed.done():
            self.resumed.set_result(None)

    def _check_waiters(self):
        for n, fut in list(self._waiters):
            if (len(self.data) >= n or "lost" in self.events) and not fut.done():
                fut.set_result(None)
                self._waiters.remove((n, fut))

    async def wait_bytes(self, n, timeout=STEP_TIMEOUT):
        """Wait until at least ``n`` bytes arrived (or the connection ended)."""
        if len(self.data) < n and "lost" not in self.events:
            fut = self.loop.create_future()
            self._waiters.append((n, fut))
            await asyncio.wait_for(fut, timeout)
        return bytes(self.data)


class EchoProtocol(asyncio.Protocol):
    """Server side: echo everything; on EOF flush the echo and close."""

    def __init__(self, registry=None):
        self.registry = registry
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        if self.registry is not None:
            self.registry.append(self)

    def data_received(self, data):
        self.transport.write(data)

    def eof_received(self):
        self.transport.close()

    def connection_lost(self, exc):
        pass


async def start_server(loop, kind, factory, tmp_path=None, **kw):
    """Start a TCP (127.0.0.1, port 0) or Unix (tmp_path) server.

    Returns (server, address) where address is what create_connection /
    create_unix_connection needs.
    """
    if kind == "tcp":
        srv = await loop.create_server(factory, "127.0.0.1", 0, **kw)
        return srv, srv.sockets[0].getsockname()
    path = str(tmp_path / "s.sock") if tmp_path is not None else "\0tideloop-test-%d-%d" % (
        os.getpid(), id(factory))
    srv = await loop.create_unix_server(factory, path, **kw)
    return srv, path


async def connect(loop, kind, factory, addr, **kw):
    if kind == "tcp":
        return await loop.create_connection(factory, *addr, **kw)
    return await loop.create_unix_connection(factory, addr, **kw)


async def connected_pair(loop, kind, client_factory, server_factory,
                         tmp_path=None, **server_kw):
    """A server, a client transport/protocol and the server-side protocol
    (after its connection_made ran).  Returns (server, ctr, cproto, sproto)."""
    accepted = []

    def sfactory():
        p = server_factory()
        accepted.append(p)
        return p

    srv, addr = await start_server(loop, kind, sfactory, tmp_path, **server_kw)
    ctr, cproto = await connect(loop, kind, client_factory, addr)
    await wait_until(lambda: accepted and getattr(accepted[0], "transport", None))
    return srv, ctr, cproto, accepted[0]


async def close_server(srv):
    srv.close()
    await asyncio.wait_for(srv.wait_closed(), STEP_TIMEOUT)


def raw_client(kind, addr, blocking=True):
    """A plain connected client socket."""
    if kind == "tcp":
        s = socket.create_connection(addr, timeout=STEP_TIMEOUT)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(STEP_TIMEOUT)
        try:
            s.connect(addr)
        except BaseException:
            s.close()
            raise
    if not blocking:
        s.setblocking(False)
    return s


def recv_all(sock, n=None):
    """Blocking: read until EOF (or ``n`` bytes)."""
    buf = bytearray()
    while n is None or len(buf) < n:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def bind_error_message(err, address):
    """str() of the OSError asyncio raises when binding ``address`` fails with
    errno ``err``, worded as this interpreter's base_events words it (later
    3.13 and 3.14 releases put str(exc) where earlier ones put strerror)."""
    import inspect
    import os
    detail = os.strerror(err).lower()
    if "{str(exc).lower()}" in inspect.getsource(asyncio.base_events):
        detail = f"[errno {err}] {detail}"
    return f"[Errno {err}] error while attempting to bind on address {address!r}: {detail}"
