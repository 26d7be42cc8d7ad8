"""Stress scenario b: clients that reset (SO_LINGER 0) mid-write / mid-read;
the server survives, makes no exception-handler call (asyncio makes none),
serves a healthy client afterwards and leaks no fd.

Run it alone: python stress/run.py --quick --only b
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
import threading
import time

from .common import open_fds, rst_close, pattern_bytes, StreamChecker, wait_until, _fd_desc


async def scenario_b(loop, res, sz, loop_name):
    payload = pattern_bytes(0, sz["b_payload"])
    send_total = sz["b_send"]
    st = dict(made=0, lost=0, live=0, bad=0, verified=0, lost_exc=collections.Counter(),
              healthy_ok=0)

    class Server(asyncio.Protocol):
        def connection_made(self, tr):
            self.tr = tr
            self.chk = StreamChecker()
            st["made"] += 1
            st["live"] += 1
            tr.write(payload)  # mostly buffered: the peer resets while we write

        def data_received(self, data):
            self.chk.feed(data)
            st["verified"] += len(data)

        def eof_received(self):
            # only healthy clients half-close: they sent everything
            if self.chk.offset == send_total and not self.chk.bad:
                st["healthy_ok"] += 1
            return False  # close after the payload is flushed

        def connection_lost(self, exc):
            st["lost"] += 1
            st["live"] -= 1
            st["bad"] += self.chk.bad
            st["lost_exc"][type(exc).__name__ if exc else "None"] += 1

    res.watch_handler(loop)  # asyncio makes no handler call for resets
    # Warm-up: fds a loop opens lazily with its first server (libuv's
    # reserve fd for EMFILE) are not leaks.
    warm = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
    warm.close()
    await warm.wait_closed()
    before = open_fds()
    srv = await loop.create_server(Server, "127.0.0.1", 0, backlog=1024)
    addr = srv.sockets[0].getsockname()
    n = sz["b_clients"]
    counters = dict(faults=0, sent=0, read=0, bad=0, errors=[])
    lock = threading.Lock()

    def faulty(j):
        rng = random.Random(j)
        s = socket.create_connection(addr, timeout=10)
        mode, sent, got = j % 4, 0, b""
        try:
            if mode in (1, 3):  # send part of our payload
                sent = rng.randint(1, send_total - 1)
                s.sendall(pattern_bytes(0, sent))
            if mode in (2, 3):  # read part of the server's payload
                want = rng.randint(1, len(payload) // 2)
                buf = bytearray()
                while len(buf) < want:
                    chunk = s.recv(min(65536, want - len(buf)))
                    if not chunk:
                        break
                    buf += chunk
                got = bytes(buf)
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.002)
        finally:
            rst_close(s)
        with lock:
            counters["faults"] += 1
            counters["sent"] += sent
            counters["read"] += len(got)
            counters["bad"] += got != payload[:len(got)]

    def worker(t, nthreads):
        try:
            for j in range(t, n, nthreads):
                faulty(j)
        except Exception as e:  # a client-side failure is a finding too
            with lock:
                counters["errors"].append(f"faulty client: {e!r}")

    def healthy(_):
        s = socket.create_connection(addr, timeout=10)
        try:
            s.sendall(pattern_bytes(0, send_total))
            s.shutdown(socket.SHUT_WR)
            buf = bytearray()
            while True:
                chunk = s.recv(1 << 18)
                if not chunk:
                    break
                buf += chunk
            return bytes(buf) == payload, len(buf)
        finally:
            s.close()

    try:
        await asyncio.gather(*(loop.run_in_executor(None, worker, t, 4) for t in range(4)))
        for e in counters["errors"]:
            res.err(e)
        res["faults"] = counters["faults"]
        # the server keeps serving: healthy clients get the whole payload
        hs = await asyncio.wait_for(asyncio.gather(
            *(loop.run_in_executor(None, healthy, i) for i in range(3))), 30)
        for ok, got in hs:
            if not ok:
                res.err(f"healthy client got a wrong payload ({got} bytes)")
        total = n + 3
        if not await wait_until(lambda: st["lost"] == total, 10):
            res.err(f"connection_lost ran {st['lost']} times for {total} connections")
        if st["made"] != total:
            res.err(f"connection_made ran {st['made']} times for {total} connections")
        if st["healthy_ok"] != 3:
            res.err(f"server verified {st['healthy_ok']} of 3 healthy uploads")
        if st["bad"] or counters["bad"]:
            res.err(f"corrupt data: server side {st['bad']}, client side {counters['bad']}")
        res["conns"] = total
        res["requests"] = total
        # Exact byte accounting only for the healthy clients: data a faulty
        # client sent just before its RST may be discarded by the kernel.
        res["bytes_sent"] = 3 * (send_total + len(payload))
        res["bytes_verified"] = st["healthy_ok"] * send_total + sum(
            g for ok, g in hs if ok)
        res["details"].update(faulty_bytes_sent=counters["sent"],
                              faulty_bytes_received_by_server=st["verified"] - 3 * send_total,
                              faulty_bytes_read_and_checked=counters["read"])
        if st["verified"] > counters["sent"] + 3 * send_total:
            res.err(f"server received {st['verified']} bytes, more than the clients "
                    f"sent ({counters['sent'] + 3 * send_total})")
        res["details"]["connection_lost_exc"] = dict(st["lost_exc"])
    finally:
        srv.close()
        await srv.wait_closed()
    leaked = open_fds() - before
    if leaked:
        res.err(f"{len(leaked)} fds leaked: "
                + ", ".join(sorted(_fd_desc(fd) for fd in list(leaked)[:5])))
