"""Stress scenario a: 10,000 concurrent connections (server here, clients in a
helper process), all held open at once, each echoing seeded random messages,
every byte checked.

Run it alone: python stress/run.py --quick --only a
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import time

from .common import raise_nofile, read_line, spawn_helper, wait_until


class CountingEcho(asyncio.Protocol):
    def __init__(self, st):
        self.st = st

    def connection_made(self, tr):
        self.tr = tr
        st = self.st
        st["made"] += 1
        st["live"].add(self)
        st["peak"] = max(st["peak"], len(st["live"]))

    def data_received(self, data):
        self.st["bytes"] += len(data)
        self.tr.write(data)

    def eof_received(self):
        self.st["eofs"] += 1  # the clients never half-close first

    def connection_lost(self, exc):
        self.st["live"].discard(self)
        self.st["lost"] += 1
        if exc is not None:
            self.st["lost_exc"].append(repr(exc))


async def scenario_a(loop, res, sz, loop_name):
    raise_nofile()
    n = sz["a_conns"]
    st = dict(made=0, lost=0, peak=0, bytes=0, eofs=0, live=set(), lost_exc=[])
    srv = await loop.create_server(lambda: CountingEcho(st), "127.0.0.1", 0, backlog=4096)
    port = srv.sockets[0].getsockname()[1]
    proc = spawn_helper("a_clients", loop_name, port, n, sz["a_rounds"], sz["a_size"])
    try:
        line = await read_line(loop, proc.stdout, 60)
        if not line.startswith("ECHOED "):
            res.err(f"clients did not finish echoing: {line!r}")
            return
        echoed = json.loads(line[7:])
        # Every client got >= 1 echo and none closed: all n are live here.
        res["conns"] = len(st["live"])
        res["details"]["server_peak"] = st["peak"]
        if len(st["live"]) != n or st["peak"] != n:
            res.err(f"live={len(st['live'])} peak={st['peak']} expected {n}")
        for p in list(st["live"]):
            p.tr.close()  # the server closes first: its side keeps TIME_WAIT
        line = await read_line(loop, proc.stdout, 60)
        closed = json.loads(line[7:]) if line.startswith("CLOSED ") else None
        if closed is None:
            res.err(f"clients did not see every close: {line!r}")
            return
        rc = await asyncio.wait_for(loop.run_in_executor(None, proc.wait), 30)
        if rc != 0:
            res.err(f"client process exit status {rc}")
        for k in ("requests", "bytes_sent", "bytes_verified"):
            res[k] = echoed[k]
        for e in echoed["errors"] + closed["errors"]:
            res.err("client: " + e)
        res["details"].update(client_connect_s=echoed["connect_s"],
                              client_echo_s=echoed["echo_s"],
                              client_rss_kb=closed["rss_kb"],
                              clients_saw_eof=closed["eofs"])
        if closed["eofs"] != n:
            res.err(f"clients saw {closed['eofs']} EOFs, expected {n}")
        if st["bytes"] != res["bytes_sent"]:
            res.err(f"server echoed {st['bytes']} bytes, clients sent {res['bytes_sent']}")
        if res["requests"] != n * sz["a_rounds"]:
            res.err(f"requests {res['requests']} != {n} x {sz['a_rounds']}")
        if not await wait_until(lambda: st["lost"] == n, 10):
            res.err(f"server connection_lost {st['lost']} of {n}")
        if st["lost_exc"]:
            res.err(f"server connection_lost with exceptions: {st['lost_exc'][:3]}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        srv.close()
        await srv.wait_closed()
        res["details"]["client_rss_kb_total"] = resource.getrusage(
            resource.RUSAGE_CHILDREN).ru_maxrss


class EchoClient(asyncio.Protocol):
    """Sends `rounds` seeded random messages one at a time, checks each echo."""

    def __init__(self, i, cs):
        self.rng = random.Random(1000003 * 7 + i)
        self.cs = cs
        self.round = 0
        self.eof = False
        self.done = False
        self.finished = False

    def connection_made(self, tr):
        self.tr = tr

    def start(self):
        self.send_next()

    def send_next(self):
        self.msg = self.rng.randbytes(self.rng.randint(1, self.cs["size"]))
        self.buf = bytearray()
        self.cs["bytes_sent"] += len(self.msg)
        self.tr.write(self.msg)

    def data_received(self, data):
        cs = self.cs
        self.buf += data
        if len(self.buf) < len(self.msg):
            return
        if bytes(self.buf) != self.msg:
            cs["errors"].append(f"echo mismatch ({len(self.buf)} bytes for {len(self.msg)})")
            self.finish()
            self.tr.abort()
            return
        cs["bytes_verified"] += len(self.msg)
        cs["requests"] += 1
        self.round += 1
        if self.round < cs["rounds"]:
            self.send_next()
        else:
            self.done = True
            self.finish()

    def finish(self):
        # once per client, success or failure: a failure must not leave the
        # run waiting for its timeout
        if not self.finished:
            self.finished = True
            self.cs["finished"] += 1
            if self.cs["finished"] == self.cs["n"]:
                self.cs["all_done"].set_result(None)

    def eof_received(self):
        self.eof = True

    def connection_lost(self, exc):
        cs = self.cs
        if exc is not None or not self.done or not self.eof:
            cs["errors"].append(f"connection lost early/unclean: done={self.done} "
                                f"eof={self.eof} exc={exc!r}")
        self.finish()
        cs["eofs"] += self.eof
        cs["lost"] += 1
        if cs["lost"] == cs["n"]:
            cs["all_lost"].set_result(None)


async def helper_a_clients(loop, args):
    raise_nofile()
    port, n, rounds, size = map(int, args)
    cs = dict(n=n, rounds=rounds, size=size, bytes_sent=0, bytes_verified=0,
              requests=0, finished=0, eofs=0, lost=0, errors=[],
              all_done=loop.create_future(), all_lost=loop.create_future())
    handler_errors = []
    loop.set_exception_handler(lambda lp, ctx: handler_errors.append(
        f"{ctx.get('message')}: {ctx.get('exception')!r}"))
    clients = []
    t0 = time.monotonic()
    wave = 1000  # connect in waves (SYN backlog), keeping every one open
    for start in range(0, n, wave):
        rs = await asyncio.gather(
            *(loop.create_connection(lambda i=i: EchoClient(i, cs), "127.0.0.1", port)
              for i in range(start, min(n, start + wave))),
            return_exceptions=True)
        for r in rs:
            if isinstance(r, BaseException):
                cs["errors"].append(f"connect: {r!r}")
            else:
                clients.append(r[1])
    t1 = time.monotonic()
    if len(clients) != n:
        cs["all_done"].set_result(None)  # report what we have
    for c in clients:  # barrier passed: all connected, now echo on all
        c.start()
    try:
        await asyncio.wait_for(cs["all_done"], 50)
    except asyncio.TimeoutError:
        cs["errors"].append(f"echo timed out: {cs['finished']} of {n} finished")
    t2 = time.monotonic()
    out = {k: cs[k] for k in ("requests", "bytes_sent", "bytes_verified")}
    out.update(errors=cs["errors"][:20] + handler_errors[:20],
               connect_s=round(t1 - t0, 3), echo_s=round(t2 - t1, 3))
    print("ECHOED " + json.dumps(out), flush=True)
    cs["errors"].clear()
    handler_errors.clear()
    try:
        await asyncio.wait_for(cs["all_lost"], 50)
    except asyncio.TimeoutError:
        cs["errors"].append(f"close timed out: {cs['lost']} of {n} closed")
    out = dict(eofs=cs["eofs"], errors=cs["errors"][:20] + handler_errors[:20],
               rss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    print("CLOSED " + json.dumps(out), flush=True)
