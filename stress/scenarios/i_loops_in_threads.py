"""Stress scenario i: one loop in each of 8+ threads for a bounded time (the
free-threading issue), all at once:

- every worker loop serves TCP echo (a Protocol; its own port, plus one port
  all workers share through SO_REUSEPORT) and Unix echo (streams); every
  worker's clients talk to the other workers' servers and the shared port,
  new connections all along, every byte checked;
- call_soon_threadsafe storms between the worker loops, each callback with a
  per-(sender, receiver) sequence number: every callback runs exactly once,
  in per-sender order (a sender's end marker, FIFO behind its callbacks, says
  when the receiver has seen them all); a window keeps the backlog bounded;
- timers (call_later, a quarter cancelled): none fires early (before its
  deadline less the loop's clock resolution), none is lost, no cancelled one
  runs;
- subprocesses from every worker loop at once (asyncio.create_subprocess_exec:
  ``sh -c 'exit K'``, ``cat`` echoing a checked payload through pipes, and
  ``sh -c 'kill -USR1 <pid>; exit K'``): exit codes checked;
- SIGUSR1 sent to the process (os.kill from the worker threads and the kill
  of those shells) while every thread is busy: the handler on the main
  thread's loop runs there and counts them, 0 < handled <= sent;
- a churn thread creating and closing loops the whole time (each runs timers,
  a call_soon_threadsafe round trip through a worker loop and a TCP echo to a
  worker, or is closed without running, or closed with a pending timer);
- RSS sampled from the main loop after a warm-up slice and at the end of the
  load: flat within RSS_GROWTH_LIMIT (below); every fd opened is closed again.

The loop under test (the runner's --loop) is every loop here: the main
thread's, the workers' and the churned ones.

Run it alone: python stress/run.py --quick --only i
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

from .common import make_loop, open_fds, pattern_bytes, raise_nofile, rss_now_kb, _fd_desc

# RSS: the load is stationary after the warm-up slice (every thread, loop,
# server, socket buffer and allocator arena exists by then; the storm window
# and the clients bound what is in flight), so what RSS still gains is
# allocator noise: measured 1-3 MiB on 3.11 and 4-8 MiB on 3.13t (mimalloc),
# in quick runs and in 20 s ones alike (it levels off).  The limit sits
# above that noise and below what a leak would add in the measured part of
# a quick run (tideloop: ~1e6 storm callbacks, ~4e3 echo requests, ~600
# subprocesses, ~200 churned loops; asyncio about a fifth of that): a leaked
# handle per callback (>= 64 B) is >= 60 MiB, a leaked request buffer (8 KiB
# on average) >= 30 MiB; a leaked loop per churn cycle is a few MiB but
# leaves its epoll fd and self-pipe open (the fd check).
RSS_GROWTH_LIMIT_MIB = 16
# Free-threaded builds (3.13t): RSS is no measure there.  Their allocator
# keeps what one thread frees of another thread's allocations: four pure-
# Python threads passing small tuples to each other through deques, with
# ~50k blocks alive throughout, grow RSS by ~11 MiB/s (GIL on or off; 3.11
# stays flat at 17 MiB).  The loops in this scenario do exactly that (every
# call_soon_threadsafe() handle is made by one thread and freed by
# another), so RSS there grows with the storm rate, for asyncio as for
# tideloop.  What is alive is counted instead: sys.getallocatedblocks()
# (objects and PyMem blocks, tideloop's buffers included), the median of the
# samples around the warm-up against that of the last ones; a leaked handle
# per storm callback would add about a million.
BLOCKS_GROWTH_LIMIT = 100_000
FREE_THREADED = not getattr(sys, "_is_gil_enabled", lambda: True)() or bool(
    __import__("sysconfig").get_config_var("Py_GIL_DISABLED"))
WARMUP_FRACTION = 0.4          # of the duration, before the first RSS sample
DRAIN_TIMEOUT = 20.0           # after the deadline, for every worker to finish


class BrokenBarrier(Exception):
    pass


class LoopBarrier:
    """A barrier for coroutines on different loops: ``await wait()`` parks
    the caller on its own loop (which keeps serving meanwhile); the last to
    arrive wakes every loop with call_soon_threadsafe.  ``released_at`` is
    the monotonic time of the release."""

    def __init__(self, parties):
        self.parties = parties
        self.lock = threading.Lock()
        self.waiting = []
        self.broken = False
        self.released_at = None

    async def wait(self, timeout):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.lock:
            if self.broken:
                raise BrokenBarrier("barrier broken")
            self.waiting.append((loop, fut))
            wake = None
            if len(self.waiting) == self.parties:
                wake, self.waiting = self.waiting, []
                self.released_at = time.monotonic()
        if wake:
            for lp, f in wake:
                lp.call_soon_threadsafe(_set_result, f, None)
        return await asyncio.wait_for(fut, timeout)

    def abort(self):
        with self.lock:
            self.broken = True
            wake, self.waiting = self.waiting, []
        for lp, f in wake:
            try:
                lp.call_soon_threadsafe(_set_exception, f, BrokenBarrier("barrier broken"))
            except RuntimeError:       # that loop is closed already
                pass


def _set_result(fut, value):
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut, exc):
    if not fut.done():
        fut.set_exception(exc)


class Shared:
    """What the threads share: the registry of workers, the barriers, the
    errors (a lock around them: several threads append)."""

    def __init__(self, n, loop_name, sz, tmpdir, main_pid):
        self.n = n
        self.loop_name = loop_name
        self.sz = sz
        self.tmpdir = tmpdir
        self.main_pid = main_pid
        self.workers = []
        self.lock = threading.Lock()
        self.errors = []
        self.ready = LoopBarrier(n + 1)      # the workers and the main loop
        self.drained = LoopBarrier(n + 1)
        self.deadline = None                 # set by the main loop at `ready`
        self.shared_port = None
        self.signals_sent = 0

    def err(self, msg):
        with self.lock:
            if len(self.errors) < 200:
                self.errors.append(str(msg))

    def add_signals(self, k):
        with self.lock:
            self.signals_sent += k

    def abort(self, why):
        self.err(why)
        self.ready.abort()
        self.drained.abort()

    def running(self):
        return time.monotonic() < self.deadline


class EchoProtocol(asyncio.Protocol):
    def __init__(self, worker):
        self.w = worker

    def connection_made(self, tr):
        self.tr = tr
        self.w.st["server_conns"] += 1

    def data_received(self, data):
        self.w.st["server_bytes"] += len(data)
        self.tr.write(data)

    def connection_lost(self, exc):
        if exc is not None:
            self.w.err(f"TCP server connection_lost({exc!r})")


class Worker:
    def __init__(self, sh, idx):
        self.sh = sh
        self.idx = idx
        self.loop = None
        self.phase = "starting"
        self.rng = random.Random(1000 + idx)
        n = sh.n
        self.st = dict(server_conns=0, server_bytes=0, unix_server_conns=0,
                       conns=0, requests=0, bytes_sent=0, bytes_verified=0,
                       storm_sent=0, storm_run=0, storm_order_errors=0,
                       timers_scheduled=0, timers_fired=0, timers_cancelled=0,
                       timers_early=0, timer_max_late_ms=0.0,
                       subprocesses=0, handler_calls=0)
        self.sent_seq = [0] * n          # next sequence number to each receiver
        self.inbox_next = [0] * n        # next sequence number expected from each sender
        self.ends = {}                   # sender -> count it says it sent
        self.ends_done = None            # future on this loop
        self.port = None
        self.unix_path = os.path.join(sh.tmpdir, f"w{idx}.sock")

    def err(self, msg):
        self.sh.err(f"worker {self.idx} ({self.phase}): {msg}")

    # -- the thread ---------------------------------------------------------

    def run(self):
        try:
            loop = self.loop = make_loop(self.sh.loop_name)
        except BaseException as e:
            self.sh.abort(f"worker {self.idx}: creating its loop raised {e!r}")
            return
        self.ends_done = loop.create_future()

        def handler(lp, ctx):
            self.st["handler_calls"] += 1
            self.err(f"exception handler: {ctx.get('message')}: {ctx.get('exception')!r}")
        loop.set_exception_handler(handler)
        try:
            loop.run_until_complete(self.main())
        except BaseException as e:
            import traceback
            traceback.print_exc()
            self.sh.abort(f"worker {self.idx} ({self.phase}) raised {e!r}")
        finally:
            self.phase = "closing"
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
            self.phase = "closed"

    async def main(self):
        loop = self.loop
        sh = self.sh
        self.phase = "setup"
        srv = await loop.create_server(lambda: EchoProtocol(self), "127.0.0.1", 0)
        self.port = srv.sockets[0].getsockname()[1]
        shared = await loop.create_server(lambda: EchoProtocol(self), "127.0.0.1",
                                          sh.shared_port, reuse_port=True)
        usrv = await asyncio.start_unix_server(self.unix_echo, self.unix_path)
        self.phase = "ready"
        await sh.ready.wait(30)
        self.phase = "load"
        others = [w for w in sh.workers if w is not self]
        tasks = [loop.create_task(coro) for coro in (
            self.tcp_clients(others, 0), self.tcp_clients(others, 1),
            self.unix_clients(others), self.storm(others), self.timers(),
            self.subprocesses(), self.signals())]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        # Everything this worker sends is sent: the end markers, FIFO behind
        # the storm callbacks to each receiver.
        self.phase = "storm ends"
        for w in others:
            w.loop.call_soon_threadsafe(w.on_storm_end, self.idx, self.sent_seq[w.idx])
        try:
            await asyncio.wait_for(asyncio.shield(self.ends_done), DRAIN_TIMEOUT / 2)
        except asyncio.TimeoutError:
            missing = sorted(set(range(sh.n)) - {self.idx} - set(self.ends))
            self.err(f"no storm end marker from workers {missing}")
        self.phase = "drained"
        await sh.drained.wait(DRAIN_TIMEOUT)
        # Nobody uses this worker's servers or loop from now on.
        self.phase = "shutdown"
        await asyncio.sleep(0.02)           # a duplicate callback would run now
        self.check_storm()
        for s in (srv, shared, usrv):
            s.close()
            await s.wait_closed()

    # -- echo -----------------------------------------------------------------

    async def unix_echo(self, reader, writer):
        self.st["unix_server_conns"] += 1
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                self.st["server_bytes"] += len(data)
                writer.write(data)
                await writer.drain()
        except Exception as e:
            self.err(f"Unix server: {e!r}")
        finally:
            writer.close()

    async def echo_conn(self, reader, writer, what):
        rng = self.rng
        st = self.st
        st["conns"] += 1
        try:
            for _ in range(rng.randint(1, 8)):
                n = rng.randint(1, self.sh.sz["i_msg"])
                off = rng.randrange(1 << 30)
                data = pattern_bytes(off, n)
                writer.write(data)
                st["bytes_sent"] += n
                got = await asyncio.wait_for(reader.readexactly(n), 30)
                if got != data:
                    self.err(f"{what}: echo of {n} bytes differs")
                else:
                    st["bytes_verified"] += n
                st["requests"] += 1
                if not self.sh.running():
                    break
        finally:
            writer.close()
            await writer.wait_closed()

    async def tcp_clients(self, others, which):
        while self.sh.running():
            if which == 1 and self.rng.random() < 0.5:
                port, what = self.sh.shared_port, "TCP shared port"
            else:
                w = self.rng.choice(others)
                port, what = w.port, f"TCP to worker {w.idx}"
            try:
                r, wr = await asyncio.open_connection("127.0.0.1", port)
                await self.echo_conn(r, wr, what)
            except Exception as e:
                self.err(f"{what}: {e!r}")
                await asyncio.sleep(0.01)

    async def unix_clients(self, others):
        while self.sh.running():
            w = self.rng.choice(others)
            what = f"Unix to worker {w.idx}"
            try:
                r, wr = await asyncio.open_unix_connection(w.unix_path)
                await self.echo_conn(r, wr, what)
            except Exception as e:
                self.err(f"{what}: {e!r}")
                await asyncio.sleep(0.01)

    # -- call_soon_threadsafe storms -----------------------------------------

    def on_storm(self, sender, seq):
        # runs on this worker's loop; `sender` is another worker's index
        if seq != self.inbox_next[sender]:
            self.st["storm_order_errors"] += 1
            if self.st["storm_order_errors"] <= 5:
                self.err(f"storm callback #{seq} from worker {sender} ran when "
                         f"#{self.inbox_next[sender]} was due (lost, repeated or "
                         f"out of order)")
        self.inbox_next[sender] = seq + 1
        self.st["storm_run"] += 1

    def on_storm_end(self, sender, count):
        self.ends[sender] = count
        if len(self.ends) == self.sh.n - 1 and not self.ends_done.done():
            self.ends_done.set_result(None)

    def check_storm(self):
        for sender, count in sorted(self.ends.items()):
            if self.inbox_next[sender] != count:
                self.err(f"worker {sender} sent "
                         f"{count} storm callbacks, the last one that ran here was "
                         f"#{self.inbox_next[sender] - 1}")
        expected = sum(self.ends.values())
        if self.st["storm_run"] != expected:
            self.err(f"{self.st['storm_run']} storm callbacks ran here, "
                     f"{expected} were sent")

    async def storm(self, others):
        rng = self.rng
        burst_max = self.sh.sz["i_burst"]
        window = 4 * burst_max          # callbacks in flight to one receiver
        while self.sh.running():
            w = rng.choice(others)
            if self.sent_seq[w.idx] - w.inbox_next[self.idx] > window:
                await asyncio.sleep(0.001)   # that receiver is behind
                continue
            cst = w.loop.call_soon_threadsafe
            cb = w.on_storm
            seq = self.sent_seq[w.idx]
            k = rng.randint(1, burst_max)
            for i in range(seq, seq + k):
                cst(cb, self.idx, i)
            self.sent_seq[w.idx] = seq + k
            self.st["storm_sent"] += k
            await asyncio.sleep(0 if rng.random() < 0.8 else 0.001)

    # -- timers ---------------------------------------------------------------

    async def timers(self):
        loop = self.loop
        rng = self.rng
        st = self.st
        tolerance = getattr(loop, "_clock_resolution", 1e-9) + 1e-6
        pending = {}                     # key -> handle of a timer still due
        key = 0

        def fired(cell):
            # cell: [key, deadline, cancelled]; a cell, not a set of the
            # cancelled keys, so that nothing grows with the run's length
            now = loop.time()
            k, when, cancelled = cell
            if cancelled:
                self.err(f"cancelled timer {k} ran")
                return
            if pending.pop(k, None) is None:
                self.err(f"timer {k} ran twice")
                return
            st["timers_fired"] += 1
            if now < when - tolerance:
                st["timers_early"] += 1
                if st["timers_early"] <= 3:
                    self.err(f"timer ran {(when - now) * 1e6:.1f} us before its deadline")
            st["timer_max_late_ms"] = max(st["timer_max_late_ms"], (now - when) * 1000)

        while self.sh.running():
            for _ in range(20):
                delay = rng.choice((0, rng.uniform(0, 0.002), rng.uniform(0, 0.03)))
                when = loop.time() + delay
                cell = [key, when, False]
                h = loop.call_at(when, fired, cell)
                pending[key] = h
                st["timers_scheduled"] += 1
                if rng.random() < 0.25:
                    h.cancel()
                    cell[2] = True
                    del pending[key]
                    st["timers_cancelled"] += 1
                key += 1
            await asyncio.sleep(rng.uniform(0, 0.01))
        # the last ones are due within 30 ms; give them time under load
        deadline = time.monotonic() + 10
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if pending:
            late = min(h.when() for h in pending.values())
            self.err(f"{len(pending)} timers never ran (the first due "
                     f"{loop.time() - late:.2f} s ago)")

    # -- subprocesses ----------------------------------------------------------

    async def subprocesses(self):
        rng = self.rng
        k = 0
        while self.sh.running():
            kind = k % 3
            code = (self.idx * 7 + k) % 100
            try:
                if kind == 0:
                    p = await asyncio.create_subprocess_exec("sh", "-c", f"exit {code}")
                    rc = await asyncio.wait_for(p.wait(), 30)
                elif kind == 1:
                    data = pattern_bytes(rng.randrange(1 << 20), rng.randint(1, 64 << 10))
                    p = await asyncio.create_subprocess_exec(
                        "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
                    out, _ = await asyncio.wait_for(p.communicate(data), 30)
                    rc, code = p.returncode, 0
                    if out != data:
                        self.err(f"cat echoed {len(out)} bytes of {len(data)}, or other bytes")
                else:
                    p = await asyncio.create_subprocess_exec(
                        "sh", "-c", f"kill -USR1 {self.sh.main_pid} && exit {code}")
                    rc = await asyncio.wait_for(p.wait(), 30)
                    if rc == code:
                        self.sh.add_signals(1)
                if rc != code:
                    self.err(f"subprocess {kind}: exit code {rc}, expected {code}")
                self.st["subprocesses"] += 1
            except Exception as e:
                self.err(f"subprocess {kind}: {e!r}")
            k += 1
            await asyncio.sleep(rng.uniform(0, 0.03))

    # -- signals -------------------------------------------------------------

    async def signals(self):
        rng = self.rng
        while self.sh.running():
            os.kill(self.sh.main_pid, signal.SIGUSR1)
            self.sh.add_signals(1)
            await asyncio.sleep(rng.uniform(0.001, 0.02))


# -- the churn thread -----------------------------------------------------

def churn_thread(sh, stats):
    rng = random.Random(77)
    cycles = 0
    try:
        while time.monotonic() < sh.deadline:
            lp = make_loop(sh.loop_name)
            try:
                mode = cycles % 6
                if mode == 5:
                    pass                                    # never run
                else:
                    lp.run_until_complete(churn_once(sh, lp, rng, stats, mode))
            finally:
                lp.close()
            cycles += 1
    except BaseException as e:
        import traceback
        traceback.print_exc()
        sh.err(f"churn thread, cycle {cycles}: {e!r}")
    stats["churn_loops"] = cycles


async def churn_once(sh, lp, rng, stats, mode):
    await asyncio.sleep(0)
    await asyncio.sleep(0.001)
    # a round trip through a worker loop: worker -> this fresh loop
    w = rng.choice(sh.workers)
    fut = lp.create_future()
    token = rng.random()
    w.loop.call_soon_threadsafe(lp.call_soon_threadsafe, _set_result, fut, token)
    got = await asyncio.wait_for(fut, 10)
    if got != token:
        sh.err("churn: the round trip through a worker loop returned another value")
    stats["churn_roundtrips"] += 1
    if mode in (1, 3):
        r, wr = await asyncio.open_connection("127.0.0.1", w.port)
        data = pattern_bytes(rng.randrange(1 << 20), 4096)
        wr.write(data)
        got = await asyncio.wait_for(r.readexactly(len(data)), 10)
        if got != data:
            sh.err("churn: TCP echo differs")
        wr.close()
        await wr.wait_closed()
        stats["churn_echoes"] += 1
    if mode == 4:
        # closed with a timer still pending: it must never run
        lp.call_later(3600, sh.err, "churn: a timer of a closed loop ran")


# -- the scenario -------------------------------------------------------------

async def scenario_i(loop, res, sz, loop_name):
    res.watch_handler(loop)
    raise_nofile()
    n = sz["i_threads"]
    main_ident = threading.get_ident()
    tmpdir = tempfile.mkdtemp(prefix="tideloop-stress-i-")
    sh = Shared(n, loop_name, sz, tmpdir, os.getpid())
    sig = dict(handled=0, wrong_thread=0)

    def on_signal():
        sig["handled"] += 1
        if threading.get_ident() != main_ident:
            sig["wrong_thread"] += 1

    loop.add_signal_handler(signal.SIGUSR1, on_signal)
    # The shared port: a bound (not listening) SO_REUSEPORT socket holds it
    # until every worker listens on it.
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    sh.shared_port = holder.getsockname()[1]
    gc.collect()
    fds_before = open_fds()

    sh.workers = [Worker(sh, t) for t in range(n)]
    threads = [threading.Thread(target=w.run, name=f"stress-i-loop-{w.idx}", daemon=True)
               for w in sh.workers]
    for th in threads:
        th.start()
    churn_stats = dict(churn_loops=0, churn_roundtrips=0, churn_echoes=0)
    churn = None
    rss = []                                      # (seconds since the start, KiB)
    blocks = []                                   # sys.getallocatedblocks(), with rss
    blocks_warm_at = None
    try:
        try:
            sh.deadline = time.monotonic() + 3600     # until `ready`
            await sh.ready.wait(30)
        except (BrokenBarrier, asyncio.TimeoutError) as e:
            sh.abort(f"the workers did not start: {e!r}")
            raise
        finally:
            holder.close()
        t0 = sh.ready.released_at
        sh.deadline = t0 + sz["i_duration"]
        churn = threading.Thread(target=churn_thread, args=(sh, churn_stats),
                                 name="stress-i-churn", daemon=True)
        churn.start()
        warm_at = t0 + sz["i_duration"] * WARMUP_FRACTION
        rss_warm = stats_warm = None
        while time.monotonic() < sh.deadline - 0.05:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            rss.append((round(now - t0, 2), rss_now_kb()))
            blocks.append(sys.getallocatedblocks())
            if rss_warm is None and now >= warm_at:
                rss_warm = rss[-1][1]
                blocks_warm_at = len(blocks) - 1
                stats_warm = _totals(sh.workers)
        rss_end = rss_now_kb()
        stats_end = _totals(sh.workers)
        # the churn thread stops at the deadline
        if not await _join(churn, 15):
            res.err("the churn thread did not stop")
        await sh.drained.wait(DRAIN_TIMEOUT)
    except (BrokenBarrier, asyncio.TimeoutError) as e:
        res.err(f"main loop: {e!r}")
        rss_warm = rss_end = None
    finally:
        stuck = []
        for th, w in zip(threads, sh.workers):
            if not await _join(th, DRAIN_TIMEOUT):
                stuck.append(f"{w.idx} ({w.phase})")
        if stuck:
            res.err(f"worker threads still running: {', '.join(stuck)}")
            faulthandler.dump_traceback(sys.stderr, all_threads=True)
        await asyncio.sleep(0.05)      # signals still in flight are counted
        loop.remove_signal_handler(signal.SIGUSR1)
    for e in sh.errors:
        res.err(e)

    tot = _totals(sh.workers)
    d = res["details"]
    d.update(threads=n, duration_s=sz["i_duration"], **tot, **churn_stats,
             signals_sent=sh.signals_sent, signals_handled=sig["handled"])
    res["conns"] = tot["conns"] + churn_stats["churn_echoes"]
    res["requests"] = tot["requests"]
    res["bytes_sent"] = tot["bytes_sent"]
    res["bytes_verified"] = tot["bytes_verified"]
    if tot["storm_run"] != tot["storm_sent"]:
        res.err(f"{tot['storm_run']} storm callbacks ran, {tot['storm_sent']} were sent")
    if tot["timers_fired"] != tot["timers_scheduled"] - tot["timers_cancelled"]:
        res.err(f"{tot['timers_fired']} timers ran of "
                f"{tot['timers_scheduled'] - tot['timers_cancelled']} not cancelled")
    if not 0 < sig["handled"] <= sh.signals_sent:
        res.err(f"SIGUSR1 handler ran {sig['handled']} times for {sh.signals_sent} sent")
    if sig["wrong_thread"]:
        res.err(f"the signal handler ran {sig['wrong_thread']} times off the main thread")
    for w in sh.workers:
        if w.st["subprocesses"] == 0 and not res["errors"]:
            res.err(f"worker {w.idx} ran no subprocess")
        if w.st["requests"] == 0 and not res["errors"]:
            res.err(f"worker {w.idx} made no echo request")
    if churn_stats["churn_loops"] == 0:
        res.err("the churn thread closed no loop")

    if rss_warm is not None and stats_warm is not None:
        growth = (rss_end - rss_warm) / 1024
        d.update(rss_warm_kb=rss_warm, rss_end_kb=rss_end,
                 rss_growth_mib=round(growth, 1), rss_limit_mib=RSS_GROWTH_LIMIT_MIB,
                 rss_series=rss,
                 after_warmup={k: stats_end[k] - stats_warm[k]
                               for k in ("storm_run", "requests", "subprocesses",
                                         "timers_fired")})
        warm = sorted(blocks[max(0, blocks_warm_at - 2):blocks_warm_at + 3])
        last = sorted(blocks[-5:])
        blocks_growth = last[len(last) // 2] - warm[len(warm) // 2]
        d.update(blocks_growth=blocks_growth, blocks_limit=BLOCKS_GROWTH_LIMIT,
                 free_threaded=FREE_THREADED)
        if FREE_THREADED:
            if blocks_growth > BLOCKS_GROWTH_LIMIT:
                res.err(f"allocated blocks grew by {blocks_growth} after the warm-up "
                        f"(limit {BLOCKS_GROWTH_LIMIT})")
            res["notes"].append(f"free-threaded build: RSS {rss_warm // 1024} -> {rss_end // 1024} MiB "
                     "after the warm-up is not checked (its allocator keeps memory freed "
                     "across threads); allocated blocks "
                     f"{blocks_growth:+d} (limit {BLOCKS_GROWTH_LIMIT})")
        elif os.environ.get("TIDELOOP_SANITIZE_RUN") == "1":
            # ASan's quarantine holds freed memory: RSS says nothing there
            res["notes"].append(f"sanitizer run: RSS {rss_warm // 1024} -> "
                                f"{rss_end // 1024} MiB after the warm-up is not checked")
        elif growth > RSS_GROWTH_LIMIT_MIB:
            res.err(f"RSS grew by {growth:.1f} MiB after the warm-up "
                    f"({rss_warm // 1024} -> {rss_end // 1024} MiB), limit "
                    f"{RSS_GROWTH_LIMIT_MIB} MiB")

    # every fd the workers, the churned loops and the subprocesses opened is closed
    shutil.rmtree(tmpdir, ignore_errors=True)
    alive = [w.idx for w, th in zip(sh.workers, threads) if th.is_alive()]
    if not alive:
        sh.workers = []
        gc.collect()
        leaked = open_fds() - fds_before
        d["fds_leaked"] = len(leaked)
        if leaked:
            res.err(f"{len(leaked)} fds left open: "
                    f"{sorted(map(_fd_desc, leaked), key=str)[:10]}")


def _totals(workers):
    tot = {}
    for w in workers:
        for k, v in w.st.items():
            if k == "timer_max_late_ms":
                tot[k] = round(max(tot.get(k, 0.0), v), 2)
            else:
                tot[k] = tot.get(k, 0) + v
    return tot


async def _join(th, timeout):
    """Wait for a thread without blocking the loop (a poll, not an executor:
    the main loop keeps handling signals and barrier wake-ups)."""
    deadline = time.monotonic() + timeout
    while th.is_alive():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    th.join()
    return True
