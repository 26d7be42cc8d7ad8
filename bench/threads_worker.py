#!/usr/bin/env python3
"""The server side of bench/threads.py: loops in threads of one process.

    python -m bench.threads_worker echo --loop tideloop --loops-n 2
    python -m bench.threads_worker mixed --loop tideloop --loadgen bench/bin/loadgen \\
        --job-seconds 1 --window 1

echo:  N loops in N threads, each an asyncio.Protocol echo server
       (data_received -> transport.write) on its own listening socket bound
       with SO_REUSEPORT to one port on 127.0.0.1 (the kernel spreads the
       connections over the N sockets).  Prints
       "READY <port> gil=<0|1> tids=<native ids of the loop threads>" once
       every loop listens, then serves until SIGTERM; on SIGUSR1 it prints
       "STATS conns=<connections each loop accepted>".  The main thread runs
       no loop.

mixed: one loop (the main thread's) serving the same echo, counting the bytes
       it echoes, and a pure-Python CPU job run with asyncio.to_thread:
       calibrated to take about --job-seconds alone, then, with the loop idle,
       one job alone (t1) and two at once (t2_idle); then under load from the C
       load generator (bench/bin/loadgen, a child of this process, --conns
       connections of --size bytes): the echo rate alone (loadgen's figure
       over --window seconds, every byte checked by it) and, under a second
       load generator run, two jobs at once (t2_load) with the echo rate the
       loop kept meanwhile (bytes it echoed during the jobs / size / t2_load).
       Prints one JSON line, with the CPUs the rest of the machine used while
       t1 and t2_idle ran (other_cpu, from /proc/stat).

inproc: N loops in N threads, each with its own echo over a Unix socket
       pair inside that loop (a client Protocol writes --size bytes, the
       server Protocol echoes them, the client writes again on receipt: one
       request in flight), no load generator and nothing shared between the
       threads.  After --warmup s every thread counts round trips for
       --window s and reads its own CPU time (time.thread_time()).  Prints one
       JSON line: round trips and CPU seconds per thread.  With the threads on
       free cores, CPU per round trip only grows with N where the threads
       contend: in the loop's code, the allocator, the interpreter.

Both print the interpreter's GIL state after the loop module is imported and
the loops made (sys._is_gil_enabled(); 1 on builds with a GIL).  Failures exit
with status 1 and "threads_worker: ERROR: ..." on stderr.
"""

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

from bench import procs
from tideloop._bench import harness


def gil_enabled():
    return int(getattr(sys, "_is_gil_enabled", lambda: True)())


class EchoProtocol(asyncio.Protocol):
    transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)

    def connection_lost(self, exc):
        self.transport = None


# -- echo: N loops in N threads ----------------------------------------------

def serve_echo(args):
    factory = harness.loop_factory(args.loop)
    n = args.loops_n
    holder = socket.socket()            # holds the port until every loop listens
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((args.host, args.port))
    port = holder.getsockname()[1]
    ready = threading.Barrier(n + 1)
    failures = []
    tids = [None] * n
    conns = [0] * n                     # accepted, per loop (each loop its own slot)

    def run(i):
        class Counted(EchoProtocol):
            def connection_made(self, transport):
                conns[i] += 1
                self.transport = transport
        try:
            loop = factory()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(loop.create_server(
                Counted, args.host, port, reuse_port=True, backlog=1024))
            tids[i] = threading.get_native_id()
        except BaseException as exc:
            failures.append(exc)
            ready.abort()
            raise
        ready.wait()
        loop.run_forever()

    threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"loop-{i}")
               for i in range(n)]
    for th in threads:
        th.start()
    try:
        ready.wait(30)
    except threading.BrokenBarrierError:
        raise RuntimeError(f"a loop did not start: {failures[0]!r}" if failures
                           else "the loops did not start within 30 s") from None
    holder.close()
    # The loops run until the driver's SIGTERM; exit without tearing them down.
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    signal.signal(signal.SIGUSR1, lambda *a: print(
        f"STATS conns={','.join(map(str, conns))}", flush=True))
    print(f"READY {port} gil={gil_enabled()} tids={','.join(map(str, tids))}", flush=True)
    while True:
        signal.pause()


# -- inproc: N loops in N threads, each echoing to itself ------------------------

class PingClient(asyncio.Protocol):
    """Writes a message, and the next one when the echo is back."""

    def __init__(self, message, counter):
        self.message = message
        self.counter = counter          # [round trips]; the thread reads it
        self.pending = 0

    def connection_made(self, transport):
        self.transport = transport
        self.send()

    def send(self):
        self.pending = len(self.message)
        self.transport.write(self.message)

    def data_received(self, data):
        self.pending -= len(data)
        if self.pending <= 0:
            self.counter[0] += 1
            self.send()


def inproc(args):
    factory = harness.loop_factory(args.loop)
    n = args.loops_n
    message = b"x" * args.size
    start = threading.Barrier(n)
    results = [None] * n
    failures = []

    def run(i):
        try:
            loop = factory()
            asyncio.set_event_loop(loop)
            a, b = socket.socketpair()
            counter = [0]
            loop.run_until_complete(loop.connect_accepted_socket(EchoProtocol, a))
            client, _ = loop.run_until_complete(loop.create_connection(
                lambda: PingClient(message, counter), sock=b))
            start.wait(30)
            loop.run_until_complete(asyncio.sleep(args.warmup))
            trips0, cpu0, wall0 = counter[0], time.thread_time(), time.perf_counter()
            loop.run_until_complete(asyncio.sleep(args.window))
            results[i] = {"round_trips": counter[0] - trips0,
                          "cpu_s": time.thread_time() - cpu0,
                          "wall_s": time.perf_counter() - wall0}
            client.close()
            loop.run_until_complete(asyncio.sleep(0.01))
            loop.close()
        except BaseException as exc:
            failures.append(exc)
            start.abort()

    threads = [threading.Thread(target=run, args=(i,), name=f"loop-{i}") for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if failures:
        raise failures[0]
    trips = sum(r["round_trips"] for r in results)
    cpu = sum(r["cpu_s"] for r in results)
    if not trips:
        raise RuntimeError("no round trip completed")
    print(json.dumps({"threads": results, "round_trips": trips, "cpu_s": cpu,
                      "cpu_us_per_req": cpu / trips * 1e6,
                      "rps": sum(r["round_trips"] / r["wall_s"] for r in results),
                      "gil": gil_enabled()}), flush=True)


# -- mixed: one loop, CPU jobs in to_thread -------------------------------------

def cpu_job(n):
    """Pure Python, no I/O, no shared objects: scales with free cores when
    nothing serialises the threads."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return x


class CountingEcho(EchoProtocol):
    counter = [0]

    def data_received(self, data):
        self.counter[0] += len(data)
        self.transport.write(data)


def own_cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def timed_jobs(k, n, load=None):
    """Wall time of ``k`` jobs at once; with a ``load`` dict, also the CPUs
    the rest of the machine kept busy meanwhile (load["other_cpu"], max over
    the calls: 1.0 = a whole CPU not free for the jobs)."""
    busy0, _ = procs.machine_cpu()
    own0 = own_cpu()
    t0 = time.perf_counter()
    await asyncio.gather(*(asyncio.to_thread(cpu_job, n) for _ in range(k)))
    wall = time.perf_counter() - t0
    if load is not None:
        busy1, _ = procs.machine_cpu()
        other = max(0.0, (busy1 - busy0) - (own_cpu() - own0)) / wall
        load["other_cpu"] = round(max(load.get("other_cpu", 0.0), other), 3)
    return wall


def loadgen_cmd(args, port, duration):
    return [args.loadgen, args.host, str(port), "--conns", str(args.conns),
            "--size", str(args.size), "--duration", f"{duration:g}",
            "--warmup", f"{args.warmup:g}", "--hold"]


async def read_line(proc, timeout):
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
    return line.decode().strip()


def finish(proc):
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def mixed(args):
    loop = asyncio.get_running_loop()
    server = await loop.create_server(CountingEcho, args.host, args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    counter = CountingEcho.counter
    # calibrate: n iterations take about --job-seconds alone
    n = 200_000
    while True:
        t = await timed_jobs(1, n)
        if t >= 0.1:
            break
        n *= 4
    for _ in range(2):
        n = max(1, int(n * args.job_seconds / t))
        t = await timed_jobs(1, n)
    idle_load = {}
    t1 = min([await timed_jobs(1, n, idle_load) for _ in range(2)])
    t2_idle = await timed_jobs(2, n, idle_load)

    # echo alone: loadgen's own window and figure
    gen = subprocess.Popen(loadgen_cmd(args, port, args.window), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    try:
        line = await read_line(gen, 30)
        if line != "START":
            raise RuntimeError(f"loadgen: {line!r}")
        alone = json.loads(await read_line(gen, args.window + 30))
    finally:
        finish(gen)
    if alone["errors"] or not alone["requests"]:
        raise RuntimeError(f"loadgen (echo alone): {alone['errors']} errors, "
                           f"{alone['requests']} requests")

    # two jobs under load: the loop's own byte count over the jobs' time
    gen = subprocess.Popen(loadgen_cmd(args, port, 3600), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    try:
        line = await read_line(gen, 30)
        if line != "START":
            raise RuntimeError(f"loadgen: {line!r}")
        b0 = counter[0]
        t2_load = await timed_jobs(2, n)
        echoed = counter[0] - b0
    finally:
        gen.kill()                     # its window is not over: no figure of its own
        gen.wait()
    server.close()
    result = {
        "gil": gil_enabled(), "job_iterations": n,
        "t1_s": round(t1, 4), "t2_idle_s": round(t2_idle, 4), "t2_load_s": round(t2_load, 4),
        "ratio_idle": round(t2_idle / t1, 4), "ratio_load": round(t2_load / t1, 4),
        "echo_rps_alone": alone["rps"],
        "echo_rps_with_jobs": round(echoed / args.size / t2_load, 1),
        "echo_alone_latency_us": alone["latency_us"],
        # the machine's other load while t1 and t2_idle were measured: the
        # idle ratio means "on free cores" only when this is low
        "other_cpu": idle_load.get("other_cpu", 0.0),
    }
    print(json.dumps(result), flush=True)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("echo", "mixed", "inproc"))
    p.add_argument("--loop", choices=harness.ALL_LOOPS, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--loops-n", type=int, default=1, help="echo, inproc: loops (threads)")
    p.add_argument("--loadgen", help="mixed: the C load generator")
    p.add_argument("--conns", type=int, default=10, help="mixed: connections")
    p.add_argument("--size", type=int, default=1024, help="mixed, inproc: message size")
    p.add_argument("--warmup", type=float, default=0.25,
                   help="mixed: loadgen warm-up; inproc: unmeasured seconds")
    p.add_argument("--window", type=float, default=1.0,
                   help="mixed: seconds of the echo-alone window; inproc: measured seconds")
    p.add_argument("--job-seconds", type=float, default=1.0,
                   help="mixed: one job's wall time alone, about")
    return p


def main():
    args = build_parser().parse_args()
    if args.mode == "echo":
        serve_echo(args)
    elif args.mode == "inproc":
        inproc(args)
    else:
        if not args.loadgen:
            raise SystemExit("threads_worker: mixed needs --loadgen")
        harness.run_on_loop(args.loop, mixed, args)


if __name__ == "__main__":
    harness.worker_main("threads_worker", main)
