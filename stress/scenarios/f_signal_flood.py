"""Stress scenario f: SIGUSR1 flood from another process while streaming over
TCP and a socketpair: every byte checked, handler ran (0 < n <= sent), no
EINTR leak.

Run it alone: python stress/run.py --quick --only f
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

from .common import pattern_bytes, StreamChecker, read_line, spawn_helper


async def scenario_f(loop, res, sz, loop_name):
    res.watch_handler(loop)
    st = dict(handled=0, during_io=0, streaming=True, tcp_sent=0, sp_sent=0)
    chunk = 256 << 10

    def on_signal():
        st["handled"] += 1
        st["during_io"] += st["streaming"]

    loop.add_signal_handler(signal.SIGUSR1, on_signal)
    stop = loop.create_future()

    class Sender(asyncio.Protocol):
        def connection_made(self, tr):
            self.tr = tr
            self.paused = False
            loop.call_soon(self.pump)

        def pump(self):
            while not self.paused:
                if stop.done() and st["tcp_sent"] >= sz["f_bytes"] // 2:
                    self.tr.close()
                    return
                self.tr.write(pattern_bytes(st["tcp_sent"], chunk))
                st["tcp_sent"] += chunk

        def pause_writing(self):
            self.paused = True

        def resume_writing(self):
            self.paused = False
            loop.call_soon(self.pump)

    class Receiver(asyncio.Protocol):
        def __init__(self):
            self.chk = StreamChecker()
            self.lost = loop.create_future()

        def data_received(self, data):
            self.chk.feed(data)

        def connection_lost(self, exc):
            self.lost.set_result(exc)

    async def sp_sender(a):
        while not (stop.done() and st["sp_sent"] >= sz["f_bytes"] // 2):
            await loop.sock_sendall(a, pattern_bytes(st["sp_sent"], chunk))
            st["sp_sent"] += chunk
        a.close()

    async def sp_receiver(b):
        chk = StreamChecker()
        while True:
            data = await loop.sock_recv(b, 1 << 16)
            if not data:
                break
            chk.feed(data)
        b.close()
        return chk

    srv = await loop.create_server(Sender, "127.0.0.1", 0)
    tr, recv = await loop.create_connection(Receiver, *srv.sockets[0].getsockname())
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    tasks = [loop.create_task(sp_sender(a)), loop.create_task(sp_receiver(b))]
    proc = spawn_helper("f_flooder", loop_name, os.getpid(), sz["f_duration"])
    try:
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        line = await read_line(loop, proc.stdout, sz["f_duration"] + 30)
        sent = int(line.split()[1]) if line.startswith("SENT ") else 0
        if not sent:
            res.err(f"flooder: {line!r}")
        stop.set_result(None)
        exc = await asyncio.wait_for(recv.lost, 60)
        if exc is not None:
            res.err(f"TCP receiver connection_lost({exc!r})")
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        chk = tasks[1].result()
        st["streaming"] = False
        await asyncio.sleep(0.05)  # signals still in flight are counted
        res["faults"] = sent
        res["requests"] = st["handled"]
        res["conns"] = 2
        res["bytes_sent"] = st["tcp_sent"] + st["sp_sent"]
        good = [c.offset for c in (recv.chk, chk) if not c.bad]
        res["bytes_verified"] = sum(good)
        if recv.chk.offset != st["tcp_sent"] or recv.chk.bad:
            res.err(f"TCP: got {recv.chk.offset} of {st['tcp_sent']}, bad {recv.chk.bad}")
        if chk.offset != st["sp_sent"] or chk.bad:
            res.err(f"socketpair: got {chk.offset} of {st['sp_sent']}, bad {chk.bad}")
        res["details"].update(signals_sent=sent, handled=st["handled"],
                              handled_during_io=st["during_io"])
        if not 0 < st["handled"] <= sent:
            res.err(f"signal handler ran {st['handled']} times for {sent} signals")
        if not st["during_io"]:
            res.err("no signal was handled while streaming")
    except Exception as e:  # e.g. an EINTR leaking out of a loop method
        res.err(f"exception during I/O: {e!r}")
        for t in tasks:
            t.cancel()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        loop.remove_signal_handler(signal.SIGUSR1)
        srv.close()
        await srv.wait_closed()


def helper_f_flooder(args):
    """Bursts of 5 signals every ~1 ms (~4,000/s).  Not flat out: at
    hundreds of thousands per second stock asyncio's wakeup socketpair fills,
    and CPython 3.11's signal handler then calls _PyEval_AddPendingCall
    (report_wakeup_write_error), which can deadlock on the pending-calls lock
    the main thread holds: an interpreter hang, not a loop property."""
    pid, duration = int(args[0]), float(args[1])
    assert sys.stdin.readline().strip() == "GO"
    n = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        for _ in range(5):
            os.kill(pid, signal.SIGUSR1)
        n += 5
        time.sleep(0.001)
    print(f"SENT {n}", flush=True)
