"""Stress scenario e: call_soon_threadsafe storm from 8 threads (loop idle and
loop busy), plus single-wakeup ping-pongs: every callback runs once, in
per-thread order, and the loop notices the last one promptly.

Run it alone: python stress/run.py --quick --only e
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
import threading
import time


async def scenario_e(loop, res, sz, loop_name, sabotage=False):
    k, nthreads = sz["e_k"], 8
    res.watch_handler(loop)
    if sabotage:  # drop one callback out of the whole storm
        orig, calls = loop.call_soon_threadsafe, [0]

        def dropping(cb, *args, **kw):
            calls[0] += 1
            if calls[0] == k * nthreads // 2:
                return None
            return orig(cb, *args, **kw)
        loop.call_soon_threadsafe = dropping

    async def storm(phase, pace):
        total = k * nthreads
        nxt = [0] * nthreads
        state = dict(count=0, order_errors=0)
        done = loop.create_future()
        last_sent = [0.0] * nthreads

        def cb(t, i):
            if i != nxt[t]:  # per-thread FIFO, each exactly once
                state["order_errors"] += 1
            nxt[t] = i + 1
            state["count"] += 1
            if state["count"] == total:
                done.set_result(time.perf_counter())

        barrier = threading.Barrier(nthreads)

        def worker(t):
            rng = random.Random(t)
            barrier.wait()
            for i in range(k):
                loop.call_soon_threadsafe(cb, t, i)
                if pace and rng.random() < 0.01:
                    time.sleep(rng.random() * 0.0005)  # let the loop fall asleep
            last_sent[t] = time.perf_counter()

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
        busy = dict(stop=False, spins=0)
        if not pace:
            # keep the loop busy: a self-rescheduling callback and a socketpair
            a, b = socket.socketpair()
            a.setblocking(False)
            b.setblocking(False)

            def spin():
                busy["spins"] += 1
                sum(range(200))
                try:
                    a.send(b"x")
                except BlockingIOError:
                    pass
                if not busy["stop"]:
                    loop.call_soon(spin)

            def on_read():
                try:
                    b.recv(4096)
                except BlockingIOError:
                    pass
            loop.add_reader(b.fileno(), on_read)
            loop.call_soon(spin)
        for th in threads:
            th.start()
        # One plain timer as the bound: no polling, no executor join before
        # `done` (either would wake the loop and hide a lost wakeup).
        try:
            t_done = await asyncio.wait_for(asyncio.shield(done), 5 + total / 50000)
        except asyncio.TimeoutError:
            t_done = None
        await loop.run_in_executor(None, lambda: [th.join() for th in threads])
        if not pace:
            busy["stop"] = True
            await asyncio.sleep(0.01)  # the last spin() runs
            loop.remove_reader(b.fileno())
            a.close()
            b.close()
        await asyncio.sleep(0.05)  # a duplicate would run now
        res["requests"] += state["count"]
        if state["count"] != total:
            res.err(f"{phase}: {state['count']} callbacks ran, expected {total}")
        if state["order_errors"]:
            res.err(f"{phase}: {state['order_errors']} callbacks out of order or repeated")
        if t_done is not None:
            lag = t_done - max(last_sent)
            res["details"][f"{phase}_last_lag_ms"] = round(lag * 1000, 2)
            # Idle: a lag is a lost wakeup.  Busy: the lag is the backlog the
            # 8 producers built up (bounded by the storm timeout above).
            if pace and lag > 1.0:
                res.err(f"{phase}: last callback ran {lag:.2f} s after it was scheduled")
        if not pace:
            res["details"]["busy_spins"] = busy["spins"]

    await storm("idle", pace=True)
    await storm("busy", pace=False)

    # single wakeups: the loop is asleep in poll with nothing else to do
    lags = []
    waker = collections.deque()
    ev = threading.Event()

    def waker_thread():
        rng = random.Random(5)
        while True:
            ev.wait()
            ev.clear()
            if not waker:
                return
            fut = waker.popleft()
            d = rng.choice((0, 0, 1e-5, 1e-4, 1e-3))  # 0: race with entering poll
            if d:
                time.sleep(d)
            loop.call_soon_threadsafe(fut.set_result, time.perf_counter())

    th = threading.Thread(target=waker_thread)
    th.start()
    try:
        for _ in range(sz["e_trials"]):
            fut = loop.create_future()
            waker.append(fut)
            ev.set()
            try:
                sent = await asyncio.wait_for(fut, 2)
            except asyncio.TimeoutError:
                res.err("lost wakeup: call_soon_threadsafe not noticed in 2 s")
                break
            lags.append(time.perf_counter() - sent)
            res["requests"] += 1
    finally:
        waker.clear()
        ev.set()
        th.join()
    if lags:
        lags.sort()
        res["details"]["wakeup_ms_p50"] = round(lags[len(lags) // 2] * 1000, 3)
        res["details"]["wakeup_ms_max"] = round(lags[-1] * 1000, 3)
        if lags[-1] > 0.5:
            res.err(f"a wakeup took {lags[-1]:.3f} s")
