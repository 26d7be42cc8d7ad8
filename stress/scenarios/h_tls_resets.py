"""Stress scenario h: TLS clients that reset (SO_LINGER 0) mid-handshake and
mid-write / mid-read against a TLS server (issue 12).  The server survives,
makes no exception-handler call (asyncio makes none: every failure here is an
OSError), every protocol it made is connected at most once and lost exactly
once when connected, it serves healthy TLS clients afterwards, leaks no fd,
and its RSS after the faulty clients is where it was after a warm-up slice of
them.

On tideloop the scenario runs once per TLS route of its C transport
(tideloop._core.tls_routes), each on a fresh server.

The clients are blocking sockets in threads; their TLS comes from the ssl
module (an SSLObject over memory BIOs for the partial ClientHello, an
SSLSocket otherwise), so the faults do not depend on the loop under test.

Run it alone: python stress/run.py --quick --only h
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import gc
import os
import random
import socket
import ssl
import sysconfig
import threading
import time

from .common import ROOT, open_fds, rss_now_kb, rst_close, pattern_bytes, wait_until, _fd_desc

CERTS = os.path.join(ROOT, "tests", "certs")
MODES = ("mid-hello", "after-hello", "mid-write", "mid-read")


def server_context():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(CERTS, "server-ecdsa.pem"))
    return ctx


def client_context():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(CERTS, "ca.pem"))
    return ctx


def client_hello(ctx):
    out = ssl.MemoryBIO()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def live_rss_kb():
    """RSS once garbage is collected and the C allocator has returned its
    free memory: failed handshakes leave reference cycles (an exception, its
    traceback and frames) that hold a TLS layer's 256 KiB read buffer until
    the garbage collector runs, and glibc keeps the freed heap; neither is a
    leak (rss_growth_untrimmed_kb in the details shows the raw figure)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return rss_now_kb()


def _routes():
    """tideloop's TLS routes (tideloop._core.tls_routes)."""
    from tideloop import _core
    return list(_core.tls_routes)


def _set_route(route):
    if route is None:
        return None
    from tideloop import _core
    return _core.set_tls_route(route)


async def scenario_h(loop, res, sz, loop_name):
    routes = _routes() if loop_name == "tideloop" else [None]
    res["details"]["routes"] = [r or "default" for r in routes]
    res.watch_handler(loop)  # asyncio calls the handler for none of these
    sctx, cctx = server_context(), client_context()
    # Warm-up: fds a loop opens lazily with its first server are not leaks.
    warm = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=sctx)
    warm.close()
    await warm.wait_closed()
    for route in routes:
        previous = _set_route(route)
        try:
            await _one_route(loop, res, sz, route or "default", sctx, cctx)
        finally:
            if route is not None:
                _set_route(previous)


async def _one_route(loop, res, sz, route, sctx, cctx):
    n = sz["h_clients"]
    payload = pattern_bytes(0, sz["h_payload"])
    upload = sz["h_upload"]
    st = dict(created=0, made=0, lost=0, live=0, healthy_ok=0,
              lost_exc=collections.Counter(), double_made=0, double_lost=0)

    class Server(asyncio.Protocol):
        def __init__(self):
            st["created"] += 1
            self.state = "new"
            self.got = 0

        def connection_made(self, tr):
            if self.state != "new":
                st["double_made"] += 1
            self.state = "made"
            self.tr = tr
            st["made"] += 1
            st["live"] += 1
            tr.write(payload)  # mostly buffered: the client resets while we write

        def data_received(self, data):
            self.got += len(data)
            if self.got == upload and data.endswith(b"\n"):
                self.tr.write(b"OK\n")

        def connection_lost(self, exc):
            if self.state != "made":
                st["double_lost"] += 1
            self.state = "lost"
            st["lost"] += 1
            st["live"] -= 1
            st["lost_exc"][type(exc).__name__ if exc else "None"] += 1

    before = open_fds()
    srv = await loop.create_server(Server, "127.0.0.1", 0, ssl=sctx, backlog=1024)
    addr = srv.sockets[0].getsockname()
    hello = client_hello(cctx)
    counters = dict(faults=0, errors=[], modes=collections.Counter())
    lock = threading.Lock()

    def faulty(j):
        rng = random.Random(j)
        mode = MODES[j % 4]
        raw = socket.create_connection(addr, timeout=10)
        s = raw
        try:
            if mode == "mid-hello":
                raw.sendall(hello[:rng.randint(1, len(hello) - 1)])
            elif mode == "after-hello":
                # the whole ClientHello and part of the server's answer: the
                # server is waiting for our Finished
                raw.sendall(hello)
                raw.recv(rng.randint(1, 200))
            else:
                s = cctx.wrap_socket(raw, server_hostname="localhost")
                if mode == "mid-write":
                    s.sendall(pattern_bytes(0, rng.randint(1, upload - 1)))
                else:
                    want = rng.randint(1, len(payload) // 2)
                    got = 0
                    while got < want:
                        chunk = s.recv(min(65536, want - got))
                        if not chunk:
                            break
                        got += len(chunk)
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.002)
        finally:
            rst_close(s)  # SO_LINGER 0 on the socket under the TLS layer
        with lock:
            counters["faults"] += 1
            counters["modes"][mode] += 1

    def run_faulty(first, last):
        def worker(t, nthreads):
            try:
                for j in range(first + t, last, nthreads):
                    faulty(j)
            except Exception as e:
                with lock:
                    counters["errors"].append(f"faulty client: {e!r}")
        return asyncio.gather(*(loop.run_in_executor(None, worker, t, 4) for t in range(4)))

    def healthy(_):
        raw = socket.create_connection(addr, timeout=10)
        with cctx.wrap_socket(raw, server_hostname="localhost") as s:
            buf = bytearray()
            while len(buf) < len(payload):
                chunk = s.recv(1 << 18)
                if not chunk:
                    break
                buf += chunk
            s.sendall(pattern_bytes(0, upload - 1) + b"\n")
            ok = s.recv(3)
            s.unwrap()
            return bytes(buf) == payload and ok == b"OK\n", len(buf)

    try:
        # a warm-up slice, then the RSS baseline, then the rest
        warm = max(n // 10, 1)
        await run_faulty(0, warm)
        await wait_until(lambda: st["live"] == 0, 3)  # checked below
        rss0 = live_rss_kb()
        await run_faulty(warm, n)
        for e in counters["errors"]:
            res.err(f"[{route}] {e}")
        if not await wait_until(lambda: st["live"] == 0 and st["created"] >= n, 5):
            res.err(f"[{route}] {st['live']} connections still live, {st['created']} of {n} "
                    "accepted")
        rss1_raw = rss_now_kb()
        rss1 = live_rss_kb()
        hs = await asyncio.wait_for(asyncio.gather(
            *(loop.run_in_executor(None, healthy, i) for i in range(3))), 30)
        for ok, got in hs:
            if not ok:
                res.err(f"[{route}] healthy TLS client got a wrong answer ({got} bytes)")
            else:
                st["healthy_ok"] += 1
        total = n + 3
        if not await wait_until(lambda: st["lost"] == st["made"] and st["created"] == total, 5):
            res.err(f"[{route}] {st['created']} protocols for {total} connections, "
                    f"{st['made']} made, {st['lost']} lost")
        if st["double_made"] or st["double_lost"]:
            res.err(f"[{route}] connection_made twice {st['double_made']}, "
                    f"connection_lost without/after connection_made {st['double_lost']}")
        # (a free-threaded build's allocator, mimalloc, keeps more freed
        # pages in its per-thread heaps: the stock loop's RSS grew 16 MiB there)
        free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
        rss_bound = int(os.environ.get("TIDELOOP_STRESS_H_RSS_KB",
                                       (24 if free_threaded else 8) * 1024))
        if rss1 - rss0 > rss_bound and os.environ.get("TIDELOOP_SANITIZE_RUN") != "1":
            res.err(f"[{route}] RSS grew {rss1 - rss0} KiB over {n - warm} faulty TLS clients "
                    f"(bound {rss_bound} KiB)")
        res["faults"] += counters["faults"]
        res["conns"] += total
        res["requests"] += total
        res["bytes_sent"] += 3 * (len(payload) + upload)
        res["bytes_verified"] += sum(g + upload for ok, g in hs if ok)
        res["details"][route] = dict(
            made=st["made"], lost=st["lost"], protocols=st["created"],
            handshakes_failed=st["created"] - st["made"],
            modes=dict(counters["modes"]), connection_lost_exc=dict(st["lost_exc"]),
            rss_growth_kb=rss1 - rss0, rss_growth_untrimmed_kb=rss1_raw - rss0,
            healthy_ok=st["healthy_ok"])
    finally:
        srv.close()
        await srv.wait_closed()
    await asyncio.sleep(0.05)
    leaked = open_fds() - before
    if leaked:
        res.err(f"[{route}] {len(leaked)} fds leaked: "
                + ", ".join(sorted(str(_fd_desc(fd)) for fd in list(leaked)[:5])))
