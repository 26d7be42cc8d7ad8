"""Stress scenario g: a loop closed with live transports, a server and pending
timers: no crash, no late callback, every fd closed after gc, the
ResourceWarnings asyncio gives.

Run it alone: python stress/run.py --quick --only g
"""

from __future__ import annotations

import asyncio
import collections
import gc
import warnings

from .common import make_loop, open_fds, _fd_desc


def warning_kind(msg, listen_addr=None):
    if "unclosed transport" in msg:
        return "unclosed transport"
    if msg.startswith("unclosed <socket.socket"):
        # A connected socket whose peer is already gone shows no raddr
        # either, so the listening one is told by its address.
        if listen_addr is not None:
            listening = f"laddr={tuple(listen_addr)!r}" in msg and "raddr=" not in msg
        else:
            listening = "raddr=" not in msg
        return "unclosed listening socket" if listening else "unclosed connected socket"
    if "unclosed event loop" in msg:
        return "unclosed event loop"
    if msg.startswith("unclosed resource"):  # uvloop's wording
        return "unclosed resource"
    return msg[:60]


# What stock asyncio (3.11) warns for the scenario below: a transport's
# __del__ warns once for each of the 2n live transports (client and server
# side) and closes its socket; the listening socket is owned by the
# never-closed Server and warns from socket.__del__.  A transport's socket
# may warn first on its own, depending on the collector's order, so
# connected sockets are not counted.  uvloop words everything "unclosed
# resource", so only its fds are checked.
def expected_warnings(n):
    return {"unclosed transport": 2 * n, "unclosed listening socket": 1}


def scenario_g(loop_name, res, sz, sabotage=False):
    """Synchronous: the loop is created, closed and collected here."""
    n, ntimers = sz["g_conns"], sz["g_timers"]
    gc.collect()
    before = open_fds()
    loop = make_loop(loop_name)
    res.watch_handler(loop)
    state = dict(closed=False, late=[], timer_calls=0)

    class Rec(asyncio.Protocol):
        def connection_made(self, tr):
            self.tr = tr

        def data_received(self, data):
            if state["closed"]:
                state["late"].append("data_received")

        def connection_lost(self, exc):
            if state["closed"]:
                state["late"].append("connection_lost")

    server_side = []

    class Reader(Rec):
        def connection_made(self, tr):
            super().connection_made(tr)
            # Held strongly: a transport whose reading is paused is not in
            # the selector, and asyncio lets an unreferenced one be collected
            # (and closed) at any time.
            server_side.append(self)
            tr.pause_reading()  # the client's writes stay buffered

    class Target:
        def fire(self):
            state["timer_calls"] += 1

    import weakref
    target = Target()
    target_ref = weakref.ref(target)
    held = {}

    async def setup():
        srv = await loop.create_server(Reader, "127.0.0.1", 0)
        addr = srv.sockets[0].getsockname()
        clients = [await loop.create_connection(Rec, *addr) for _ in range(n)]
        for tr, _ in clients:
            tr.write(b"x" * (256 << 10))  # partly pending in the transport
        for i in range(ntimers):
            loop.call_later(3600 + i, target.fire)
        await asyncio.sleep(0.1)
        held.update(srv=srv, clients=clients)
        state["listen_addr"] = addr

    loop.run_until_complete(setup())
    # record from here: whatever close() or the collector emits counts
    wctx = warnings.catch_warnings(record=True)
    w = wctx.__enter__()
    warnings.simplefilter("always")
    loop.call_soon(loop.stop)
    loop.run_forever()
    loop.call_soon(target.fire)  # still pending at close
    loop.call_later(0, target.fire)
    del target
    loop.close()
    state["closed"] = True
    res["conns"] = n
    res["requests"] = ntimers
    try:
        held.clear()
        server_side.clear()
        for _ in range(3):
            gc.collect()
        # The closed loop is still referenced here (as is usual: a Runner or
        # the policy holds it): it must not keep transports, servers' sockets
        # or their fds alive.  asyncio keeps none.
        leaked_with_loop = open_fds() - before
    finally:
        wctx.__exit__(None, None, None)
    kinds = collections.Counter(warning_kind(str(x.message), state.get("listen_addr"))
                                for x in w if issubclass(x.category, ResourceWarning))
    other = [f"{x.category.__name__}: {x.message}" for x in w
             if not issubclass(x.category, ResourceWarning)]
    # A recorded warning keeps its source (a transport, hence the loop)
    # alive: drop them, then the loop, then check every fd is closed.
    w.clear()
    del loop
    for _ in range(3):
        gc.collect()
    leaked = open_fds() - before
    res["details"].update(resource_warnings=dict(kinds),
                          fds_open_with_loop_alive=len(leaked_with_loop))
    res["faults"] = sum(kinds.values())
    if leaked_with_loop and loop_name != "uvloop":  # uvloop frees its pipes on dealloc
        res.err(f"{len(leaked_with_loop)} fds still open after gc while the closed "
                "loop is alive (asyncio: none)")
    if leaked:
        msg = f"{len(leaked)} fds leaked after gc: " + ", ".join(
            sorted(map(str, (_fd_desc(fd) for fd in list(leaked)[:5]))))
        if loop_name == "uvloop":
            # libuv cannot close a loop that still has handles: uvloop keeps
            # its signal pipe open.  A comparison loop: noted, not failed.
            res["notes"].append("uvloop: " + msg)
        else:
            res.err(msg)
    counted = {k: v for k, v in kinds.items() if k != "unclosed connected socket"}
    if loop_name != "uvloop" and counted != expected_warnings(n):
        res.err(f"ResourceWarnings {dict(kinds)}, asyncio gives {expected_warnings(n)}")
    if other:
        res.err(f"other warnings: {other[:3]}")
    if state["late"]:
        res.err(f"protocol callbacks after close: {collections.Counter(state['late'])}")
    if state["timer_calls"]:
        res.err(f"{state['timer_calls']} timer callbacks ran")
    if target_ref() is not None:
        res.err("pending timer callbacks still referenced after close + gc")
