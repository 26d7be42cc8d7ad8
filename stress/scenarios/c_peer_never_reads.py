"""Stress scenario c: peers that never read: a protocol honouring pause_writing
keeps get_write_buffer_size() and RSS bounded by the high-water mark; then
the peers drain and every byte is checked.

Run it alone: python stress/run.py --quick --only c
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

from .common import rss_now_kb, pattern_bytes, StreamChecker, wait_until


async def scenario_c(loop, res, sz, loop_name):
    high, chunk = 256 << 10, 64 << 10
    n, total = sz["c_conns"], sz["c_total"]
    st = dict(pauses=0, resumes=0, max_buf=0, written=0, lost=0)

    class Pump(asyncio.Protocol):
        """Writes the seeded stream chunk by chunk while not paused."""

        def connection_made(self, tr):
            self.tr = tr
            self.off = 0
            self.paused = False
            tr.set_write_buffer_limits(high=high)
            loop.call_soon(self.pump)

        def pump(self):
            if self.paused or self.tr.is_closing():
                return
            if self.off >= total:
                self.tr.close()  # flushes what is buffered, then EOF
                return
            k = min(chunk, total - self.off)
            self.tr.write(pattern_bytes(self.off, k))
            self.off += k
            st["written"] += k
            st["max_buf"] = max(st["max_buf"], self.tr.get_write_buffer_size())
            loop.call_soon(self.pump)

        def pause_writing(self):
            st["pauses"] += 1
            self.paused = True

        def resume_writing(self):
            st["resumes"] += 1
            self.paused = False
            loop.call_soon(self.pump)

        def connection_lost(self, exc):
            st["lost"] += 1
            if exc is not None:
                res.err(f"pump connection_lost({exc!r})")

    class Rude(asyncio.Protocol):
        """Ignores pause_writing: writes everything at once (not bounded,
        only its bytes are checked)."""

        def connection_made(self, tr):
            tr.write(pattern_bytes(0, total))
            st["written"] += total
            tr.close()

        def connection_lost(self, exc):
            st["lost"] += 1

    res.watch_handler(loop)
    srv = await loop.create_server(Pump, "127.0.0.1", 0)
    rude = await loop.create_server(Rude, "127.0.0.1", 0)
    peers = []
    for srv_ in [srv] * n + [rude]:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        s.setblocking(False)
        await loop.sock_connect(s, srv_.sockets[0].getsockname())
        peers.append(s)
    try:
        rss0 = rss_now_kb()
        # Phase 1: the peers never read.  Sample the buffers and RSS.
        deadline = time.monotonic() + sz["c_idle"]
        max_rss = rss0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            max_rss = max(max_rss, rss_now_kb())
        bound = high + chunk
        res["details"].update(high_water=high, max_write_buffer=st["max_buf"],
                              pauses_idle=st["pauses"],
                              rss_growth_kb=max_rss - rss0, written_idle=st["written"])
        if st["max_buf"] > bound:
            res.err(f"write buffer reached {st['max_buf']} > high water {high} + one chunk")
        if st["pauses"] < n:
            res.err(f"pause_writing ran {st['pauses']} times for {n} stalled connections")
        # the rude writer's `total` is in RSS; the n respectful ones are not
        rss_bound = (total + n * bound) // 1024 * 2 + 64 * 1024
        # (not under ASan: its quarantine holds freed memory back)
        if max_rss - rss0 > rss_bound and os.environ.get("TIDELOOP_SANITIZE_RUN") != "1":
            res.err(f"RSS grew {max_rss - rss0} KiB > {rss_bound} KiB")

        # Phase 2: the peers drain and check every byte (pause/resume cycles).
        def drain(s):
            s.setblocking(True)
            s.settimeout(30)
            chk = StreamChecker()
            while True:
                data = s.recv(1 << 17)
                if not data:
                    break
                chk.feed(data)
            s.close()
            return chk.offset, chk.bad

        outs = await asyncio.wait_for(asyncio.gather(
            *(loop.run_in_executor(None, drain, s) for s in peers)), 60)
        got = sum(o for o, _ in outs)
        res["bytes_sent"] = st["written"]
        res["bytes_verified"] = sum(o for o, b in outs if not b)
        if any(b for _, b in outs) or any(o != total for o, _ in outs):
            res.err(f"peers got {[o for o, _ in outs]} bytes, bad chunks "
                    f"{sum(b for _, b in outs)}, expected {total} each")
        if got != st["written"]:
            res.err(f"peers got {got} bytes, server wrote {st['written']}")
        res["conns"] = n + 1
        res["requests"] = st["pauses"]
        res["details"].update(pauses=st["pauses"], resumes=st["resumes"],
                              max_write_buffer=st["max_buf"])
        if st["max_buf"] > bound:
            res.err(f"write buffer reached {st['max_buf']} > {bound} while draining")
        if not await wait_until(lambda: st["lost"] == n + 1, 10):
            res.err(f"connection_lost ran {st['lost']} of {n + 1} times")
    finally:
        for s in peers:
            s.close()
        for s in (srv, rude):
            s.close()
            await s.wait_closed()
