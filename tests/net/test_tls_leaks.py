"""No leaks over many TLS connections (issue 12), in the style of
tests/stress/test_leaks.py: a warm-up, a baseline (allocated blocks, open
fds, RSS), then N connections (each: handshake, a 1 KiB echo, clean close),
and after garbage collection every figure back to its baseline, and every
transport, protocol and ssl_object of those connections (client and server
side, tracked by weakref) collected.

N is 300 in the normal suite, 10,000 with TIDELOOP_LONG=1.  The checker must
catch one object kept per connection (test_checker_catches_kept_objects)."""
import asyncio
import gc
import os
import signal
import sys
import weakref

import pytest

try:
    import faulthandler
except ImportError:     # an isolated subinterpreter: faulthandler is per process
    faulthandler = None

from net_helpers import STEP_TIMEOUT, open_fds
from tls_helpers import client_context, server_context

pytestmark = pytest.mark.usefixtures("tls_route")

LONG = os.environ.get("TIDELOOP_LONG") == "1"
CONNECTIONS = 10_000 if LONG else 300
WARMUP = 30
CONCURRENCY = 10
PAGE = os.sysconf("SC_PAGE_SIZE")
RSS_TOLERANCE = 8 << 20
PYMALLOC = not os.environ.get("PYTHONMALLOC", "").startswith("malloc")
MESSAGE = bytes(range(256)) * 4


class Server(asyncio.Protocol):
    def __init__(self, tracked, leak):
        self.tracked, self.leak = tracked, leak

    def connection_made(self, tr):
        self.tr = tr
        self.tracked.add_all(tr, self, tr.get_extra_info("ssl_object"))
        if self.leak is not None:
            self.leak(self)  # the planted leak of the checker's own tests

    def data_received(self, data):
        self.tr.write(data)

    def connection_lost(self, exc):
        self.tracked.lost += 1
        self.tr = None


class Client(asyncio.Protocol):
    def __init__(self, loop):
        self.buf = bytearray()
        self.got = loop.create_future()
        self.closed = loop.create_future()

    def connection_made(self, tr):
        self.tr = tr

    def data_received(self, data):
        self.buf += data
        if len(self.buf) >= len(MESSAGE) and not self.got.done():
            self.got.set_result(bytes(self.buf))

    def connection_lost(self, exc):
        self.closed.set_result(exc)
        self.tr = None


class Tracked:
    def __init__(self):
        self.refs = []
        self.lost = 0
        self.count = 0

    def add_all(self, *objs):
        self.count += 1
        self.refs.extend(weakref.ref(o) for o in objs)

    def alive(self):
        gc.collect()
        gc.collect()
        return [r() for r in self.refs if r() is not None]


def workload(loop, n, tracked, leak=None):
    async def one(addr, ctx):
        tr, pr = await loop.create_connection(lambda: Client(loop), *addr, ssl=ctx,
                                              server_hostname="localhost")
        tracked.add_all(tr, pr, tr.get_extra_info("ssl_object"))
        tr.write(MESSAGE)
        assert await asyncio.wait_for(pr.got, STEP_TIMEOUT) == MESSAGE
        tr.close()
        assert await asyncio.wait_for(pr.closed, STEP_TIMEOUT) is None

    async def main():
        lost0 = tracked.lost
        srv = await loop.create_server(lambda: Server(tracked, leak), "127.0.0.1", 0,
                                       ssl=server_context())
        addr = srv.sockets[0].getsockname()
        cctx = client_context()
        try:
            for start in range(0, n, CONCURRENCY):
                await asyncio.gather(*(one(addr, cctx)
                                       for _ in range(min(CONCURRENCY, n - start))))
            deadline = loop.time() + STEP_TIMEOUT
            while tracked.lost - lost0 < n and loop.time() < deadline:
                await asyncio.sleep(0.005)
            assert tracked.lost - lost0 == n, "server connection_lost() missing"
        finally:
            srv.close()
            await srv.wait_closed()

    loop.run_until_complete(asyncio.wait_for(main(), 60 if not LONG else 1200))


def snapshot():
    gc.collect()
    gc.collect()
    # CPython's type attribute cache keeps the last name string looked up in
    # each of its slots: names made afresh for each lookup (C code calling
    # PyObject_GetAttrString() & co) would fill it slowly, up to its 4,096
    # slots, and count as growth.
    (getattr(sys, "_clear_internal_caches", None) or sys._clear_type_cache)()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * PAGE
    return sys.getallocatedblocks(), open_fds(), rss


def check(loop, n, leak=None):
    warm = Tracked()
    workload(loop, WARMUP, warm)
    assert warm.alive() == []
    blocks0, fds0, rss0 = snapshot()
    tracked = Tracked()
    workload(loop, n, tracked, leak)
    alive = tracked.alive()
    total = len(tracked.refs)
    tracked.refs.clear()  # the weakrefs themselves are blocks too
    alive_desc = [repr(o) for o in alive[:6]]
    n_alive = len(alive)
    del alive
    blocks1, fds1, rss1 = snapshot()
    assert tracked.count == 2 * n
    assert fds1 == fds0, f"open fds {sorted(fds0, key=int)} -> {sorted(fds1, key=int)}"
    assert n_alive == 0, f"{n_alive} of {total} objects still alive: {alive_desc}"
    if PYMALLOC:
        # one block per 10 connections
        tolerance = max(n // 10, 10)
        assert blocks1 - blocks0 < tolerance, (
            f"allocated blocks grew by {blocks1 - blocks0} over {n} TLS connections "
            f"(tolerance {tolerance})")
    # (Not under tools/sanitize.sh: ASan's quarantine keeps freed memory.)
    if os.environ.get("TIDELOOP_SANITIZE_RUN") != "1":
        assert rss1 - rss0 < RSS_TOLERANCE, f"RSS grew by {(rss1 - rss0) >> 10} KiB"


@pytest.fixture
def long_watchdog():
    """TIDELOOP_LONG=1: the 10,000 connections take longer than the suite's
    per-test watchdog (tests/conftest.py) allows; give this test 30 minutes
    (the watchdog fixture disarms both timers after the test).  Not in a
    subinterpreter, which has neither: tests/interpreters/run_suite.py's
    --test-timeout applies there."""
    if LONG and faulthandler is not None:
        signal.setitimer(signal.ITIMER_REAL, 1800)
        faulthandler.dump_traceback_later(1900, exit=True)


def test_no_leak_tls_connections(loop, long_watchdog):
    check(loop, CONNECTIONS - WARMUP)


def test_checker_catches_kept_objects(loop):
    """One server protocol in 40 kept alive: the checker must fail."""
    kept = []

    def leak(protocol):
        if len(kept) * 40 < protocol.tracked.count:
            kept.append(protocol)

    with pytest.raises(AssertionError, match="objects still alive"):
        check(loop, 120, leak)
    assert len(kept) >= 2


@pytest.mark.skipif(not PYMALLOC, reason="counts pymalloc blocks")
def test_checker_catches_one_block_per_connection(loop):
    sink = []
    with pytest.raises(AssertionError, match="allocated blocks grew"):
        check(loop, 120, lambda protocol: sink.append(object()))
