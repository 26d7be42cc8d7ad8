#!/usr/bin/env python3
"""The server side of bench/interpreters.py: one app run by N loops in N
isolated interpreters, in N threads of one interpreter, or by one loop in
the main interpreter (a worker process of its own).

    python -m bench.interpreters_worker serve --way interpreters --n 2 --port 8000
    python -m bench.interpreters_worker inproc --way threads --n 2 --trips 20000

The app: an asyncio.Protocol that, for each request of --size bytes (the C
load generator's closed-loop echo: one request in flight per connection),
does a little Python work (handle_request: fields of a header parsed into a
dict, a checksum loop over the first --work bytes, the dict encoded as JSON;
about 10-15 us on CPython 3.14) and echoes the request, which loadgen checks.

--way: interpreters   tideloop.interpreters.run(main, interpreters=N,
                      loop_factory=...): N isolated interpreters, a GIL each
       threads        tideloop.threads.run(main, threads=N): N threads of the
                      main interpreter, one GIL
       main           one loop on the main thread of the main interpreter
                      (asyncio.Runner), N must be 1: a worker process
--loop: tideloop or asyncio (the loop factory each interpreter or thread
        calls: "tideloop:new_event_loop", "asyncio:new_event_loop").

serve:  each loop serves the app on its own SO_REUSEPORT socket bound to
        127.0.0.1:--port (tideloop.interpreters.reuse_port_socket; the driver
        holds the port); "READY <port>" once every loop listens.  SIGTERM
        stops the loops through the runner (tideloop.interpreters.run's and
        tideloop.threads.run's own signal handling); then "DONE conns=<the
        connections each loop accepted>" and exit status 0.

inproc: each loop runs a client and the app's server over a Unix socket pair
        of its own, no load generator, nothing shared: the client sends --size
        bytes, the server does the app's work and echoes, the client sends the
        next on receipt (one round trip in flight).  After --warmup-trips
        round trips, every loop waits at a barrier (pipes: the main
        interpreter's coordinator thread releases them together), then runs
        --trips / N round trips (a fixed total split over the loops) and reads
        its own CPU time (time.thread_time()) and the clock.  Prints one JSON
        line: per loop its round trips, CPU seconds, start and end; the wall
        time from the release to the last loop's end; the CPU the rest of the
        machine used meanwhile (/proc/stat less this process's own CPU) and
        the hypervisor's steal.

Failures exit with status 1 and "interpreters_worker: ERROR: ..." on stderr.
This module is imported again in every isolated interpreter: standard
library and tideloop only.
"""

import argparse
import asyncio
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
PROG = "interpreters_worker"
LOOP_FACTORIES = {"tideloop": "tideloop:new_event_loop", "asyncio": "asyncio:new_event_loop"}
WAYS = ("interpreters", "threads", "main", "processes")
START_TIMEOUT = 60.0


# -- the app ---------------------------------------------------------------------

def handle_request(data, work):
    """The app's Python work for one request: a header's fields parsed into
    a dict, a checksum over the first ``work`` bytes, the dict as JSON."""
    head = data[:64]
    record = {"size": len(data), "first": data[0], "last": data[-1], "sum": sum(head)}
    for i in range(0, len(head), 8):
        field = head[i:i + 8].hex()
        record[f"field{i // 8}"] = field.upper() if i % 16 else field
    checksum = 0
    for b in data[:work]:
        checksum = (checksum * 31 + b) & 0xFFFFFFFF
    record["checksum"] = checksum
    return json.dumps(record, separators=(",", ":"))


class AppProtocol(asyncio.Protocol):
    """Each complete request (``size`` bytes) is handled, then echoed."""

    def __init__(self, size, work, counter=None):
        self.size = size
        self.work = work
        self.counter = counter
        self.buffer = b""
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        if self.counter is not None:
            self.counter[0] += 1

    def data_received(self, data):
        if self.buffer:
            data = self.buffer + data
            self.buffer = b""
        size = len(data)
        if size < self.size:
            self.buffer = data
            return
        whole = size - size % self.size
        for off in range(0, whole, self.size):
            handle_request(data if whole == size == self.size
                           else data[off:off + self.size], self.work)
        if whole != size:
            self.buffer = data[whole:]
            data = data[:whole]
        self.transport.write(data)

    def connection_lost(self, exc):
        self.transport = None


# -- serve: N loops on one port ----------------------------------------------------

async def serve_main(port, size, work, ready_fd):
    """One loop's server (in each interpreter or thread): until cancelled;
    returns the connections it accepted."""
    from tideloop.interpreters import reuse_port_socket
    loop = asyncio.get_running_loop()
    conns = [0]
    sock = reuse_port_socket(HOST, port)
    server = await loop.create_server(lambda: AppProtocol(size, work, conns),
                                      sock=sock, backlog=1024)
    os.write(ready_fd, b"r")
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass
    server.close()
    return conns[0]


def read_bytes(fd, count, timeout):
    """``count`` bytes from a pipe before ``timeout`` seconds, else RuntimeError."""
    got = b""
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise RuntimeError(f"{len(got)} of {count} loops ready within {timeout:g} s")
        chunk = os.read(fd, count - len(got))
        if not chunk:
            raise RuntimeError("the ready pipe closed")
        got += chunk
    return got


MODULE = "bench.interpreters_worker"     # __name__ is "__main__" under -m


def run_loops(way, loop, n, name, args):
    """``name``(*args), a function of this module, on ``n`` loops of ``loop``
    run the ``way`` asked; the list of what each returned."""
    from tideloop._interp_child import resolve
    factory = LOOP_FACTORIES[loop]
    if way == "interpreters":
        import tideloop.interpreters
        return tideloop.interpreters.run(f"{MODULE}:{name}", *args, interpreters=n,
                                         loop_factory=factory)
    main = globals()[name]
    if way == "threads":
        import tideloop.threads
        return tideloop.threads.run(main, *args, threads=n, loop_factory=resolve(factory))
    # main: the main thread's loop; SIGTERM / SIGINT cancel it
    with asyncio.Runner(loop_factory=resolve(factory)) as runner:
        aloop = runner.get_loop()
        task = None

        async def body():
            nonlocal task
            task = asyncio.current_task()
            return await main(*args)

        for sig in (signal.SIGTERM, signal.SIGINT):
            aloop.add_signal_handler(sig, lambda: task and task.cancel())
        try:
            return [runner.run(body())]
        except asyncio.CancelledError:
            return [None]


def serve(args):
    ready_r, ready_w = os.pipe()
    failed = []

    def announce():
        try:
            read_bytes(ready_r, args.n, START_TIMEOUT)
        except RuntimeError as exc:
            failed.append(exc)
            print(f"{PROG}: ERROR: {exc}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        print(f"READY {args.port}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    conns = run_loops(args.way, args.loop, args.n, "serve_main",
                      (args.port, args.size, args.work, ready_w))
    if failed:
        raise failed[0]
    print(f"DONE conns={','.join(str(c or 0) for c in conns)}", flush=True)


# -- inproc: each loop's own client and server ----------------------------------------

class PingClient(asyncio.Protocol):
    """Sends a message, and the next one when the whole echo is back, until
    ``run(k)`` has seen k round trips."""

    def __init__(self, message):
        self.message = message
        self.pending = 0
        self.left = 0
        self.done = None

    def connection_made(self, transport):
        self.transport = transport

    def run(self, trips):
        self.left = trips
        self.done = asyncio.get_running_loop().create_future()
        self._send()
        return self.done

    def _send(self):
        self.pending = len(self.message)
        self.transport.write(self.message)

    def data_received(self, data):
        self.pending -= len(data)
        if self.pending <= 0:
            self.left -= 1
            if self.left > 0:
                self._send()
            else:
                self.done.set_result(None)

    def connection_lost(self, exc):
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc!r}"))


async def inproc_main(trips, warmup_trips, size, work, ready_fd, go_fd, done_fd):
    """One loop's client and server over a socket pair: warm up, wait for the
    go, run ``trips`` round trips; returns its figures."""
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    server, _ = await loop.connect_accepted_socket(lambda: AppProtocol(size, work), a)
    client = PingClient(bytes(range(256)) * (size // 256) + bytes(size % 256))
    transport, _ = await loop.create_connection(lambda: client, sock=b)
    try:
        await client.run(warmup_trips)
        os.write(ready_fd, b"r")
        # Blocking: every loop waits here until the coordinator releases them all.
        if os.read(go_fd, 1) != b"g":
            raise RuntimeError("no go from the coordinator")
        cpu0, t0 = time.thread_time(), time.perf_counter()
        await client.run(trips)
        cpu1, t1 = time.thread_time(), time.perf_counter()
        os.write(done_fd, b"d")
    finally:
        transport.close()
        server.close()
    await asyncio.sleep(0)
    return {"round_trips": trips, "cpu_s": cpu1 - cpu0, "start": t0, "end": t1,
            "wall_s": t1 - t0}


def machine_busy():
    """(busy, steal) seconds of the whole machine from /proc/stat: busy is
    user, nice, system, irq and softirq over all CPUs, steal the hypervisor's."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    fields += [0] * (8 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def own_cpu(pids=()):
    """(CPU seconds, system CPU seconds, minor page faults) of this process
    (all its threads, every interpreter) and of ``pids`` (its worker
    processes, from /proc/<pid>/stat)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu, sys_cpu, faults = ru.ru_utime + ru.ru_stime, ru.ru_stime, ru.ru_minflt
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / tick
        sys_cpu += int(fields[12]) / tick
        faults += int(fields[7])
    return cpu, sys_cpu, faults


def coordinate(n, ready_r, go_w, done_r, window, pids=()):
    """The barrier: wait until the ``n`` loops have warmed up, release them
    together, wait until every one has done its share; ``window`` gets the
    release time, the wall time and the CPU the rest of the machine used."""
    read_bytes(ready_r, n, START_TIMEOUT)
    (busy0, steal0), own0, t0 = machine_busy(), own_cpu(pids), time.perf_counter()
    os.write(go_w, b"g" * n)
    read_bytes(done_r, n, 600)
    t1 = time.perf_counter()
    (busy1, steal1), own1 = machine_busy(), own_cpu(pids)
    cpu = own1[0] - own0[0]
    window.update(go=t0, wall_s=t1 - t0, process_cpu_s=cpu, process_sys_s=own1[1] - own0[1],
                  minor_faults=own1[2] - own0[2],
                  other_cpu=max(0.0, (busy1 - busy0) - cpu) / (t1 - t0),
                  steal_cpu=(steal1 - steal0) / (t1 - t0))


def inproc_processes(args, fds, window):
    """--way processes: ``n`` worker processes (this module, --way main,
    each one loop), the pipes passed down; their per-loop results."""
    ready_r, ready_w, go_r, go_w, done_r, done_w = fds
    cmd = [sys.executable, "-m", MODULE, "inproc", "--way", "main", "--loop", args.loop,
           "--trips", str(args.trips // args.n), "--warmup-trips", str(args.warmup_trips),
           "--size", str(args.size), "--work", str(args.work),
           "--child-fds", f"{ready_w},{go_r},{done_w}"]
    children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, pass_fds=(ready_w, go_r, done_w))
                for _ in range(args.n)]
    failed = []
    try:
        try:
            coordinate(args.n, ready_r, go_w, done_r, window, [c.pid for c in children])
        except BaseException as exc:        # noqa: BLE001 - the children's errors first
            failed.append(exc)
            os.close(go_w)
        results = []
        for c in children:
            out, _ = c.communicate(timeout=600)
            lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
            if c.returncode != 0 or not lines:
                raise RuntimeError(f"a worker process failed (status {c.returncode})")
            results.append(json.loads(lines[-1])["loops"][0])
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    if failed:
        raise failed[0]
    return results


def inproc(args):
    if args.trips % args.n:
        raise SystemExit(f"{PROG}: --trips must be a multiple of --n")
    share = args.trips // args.n
    if args.child_fds:                      # a worker process of --way processes
        ready_w, go_r, done_w = map(int, args.child_fds.split(","))
        (r,) = run_loops("main", args.loop, 1, "inproc_main",
                         (share, args.warmup_trips, args.size, args.work, ready_w, go_r, done_w))
        print(json.dumps({"loops": [r]}), flush=True)
        return
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    window = {}
    if args.way == "processes":
        per_loop = inproc_processes(args, (ready_r, ready_w, go_r, go_w, done_r, done_w),
                                    window)
    else:
        failed = []

        def coordinator():
            try:
                coordinate(args.n, ready_r, go_w, done_r, window)
            except BaseException as exc:    # noqa: BLE001 - reported below
                failed.append(exc)
                os.close(go_w)              # a loop waiting for the go reads EOF

        thread = threading.Thread(target=coordinator, daemon=True)
        thread.start()
        per_loop = run_loops(args.way, args.loop, args.n, "inproc_main",
                             (share, args.warmup_trips, args.size, args.work,
                              ready_w, go_r, done_w))
        thread.join(10)
        if failed:
            raise failed[0]
    if not window:
        raise RuntimeError("the coordinator did not finish")
    trips = sum(r["round_trips"] for r in per_loop)
    cpu = sum(r["cpu_s"] for r in per_loop)
    print(json.dumps({
        "loops": [{k: round(r[k], 6) if isinstance(r[k], float) else r[k]
                   for k in ("round_trips", "cpu_s", "wall_s")} for r in per_loop],
        "round_trips": trips, "cpu_s": round(cpu, 6),
        "cpu_us_per_req": cpu / trips * 1e6,
        # the fixed total's wall time: from the release to the last loop's end
        # (perf_counter is one clock for the whole machine: CLOCK_MONOTONIC)
        "wall_s": round(max(window["wall_s"],
                            max(r["end"] for r in per_loop) - window["go"]), 6),
        "start_skew_s": round(max(r["start"] for r in per_loop)
                              - min(r["start"] for r in per_loop), 6),
        "rps": trips / window["wall_s"],
        "process_cpu_s": round(window["process_cpu_s"], 6),
        # where the CPU went: the kernel's share, and page faults per round
        # trip (a recv buffer that glibc maps and unmaps each time shows here)
        "process_sys_s": round(window["process_sys_s"], 6),
        "faults_per_req": round(window["minor_faults"] / trips, 3),
        "other_cpu": round(window["other_cpu"], 3),
        "steal_cpu": round(window["steal_cpu"], 3),
    }), flush=True)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("serve", "inproc"))
    p.add_argument("--way", choices=WAYS, required=True)
    p.add_argument("--loop", choices=tuple(LOOP_FACTORIES), default="tideloop")
    p.add_argument("--n", type=int, default=1, help="loops (interpreters or threads)")
    p.add_argument("--port", type=int, default=0, help="serve: the port (held by the driver)")
    p.add_argument("--size", type=int, default=1024, help="request size")
    p.add_argument("--work", type=int, default=128,
                   help="bytes of each request the app's checksum loop reads")
    p.add_argument("--trips", type=int, default=20000,
                   help="inproc: round trips in all, split over the loops")
    p.add_argument("--warmup-trips", type=int, default=2000,
                   help="inproc: unmeasured round trips of each loop first")
    p.add_argument("--child-fds", default=None, help=argparse.SUPPRESS)
    return p


def main():
    args = build_parser().parse_args()
    if args.n < 1 or (args.way == "main" and args.n != 1):
        raise SystemExit(f"{PROG}: --n must be positive (1 for --way main)")
    if args.mode == "serve":
        if args.way == "processes":
            raise SystemExit(f"{PROG}: serve --way processes: the driver starts one "
                             "--way main server per process")
        if not args.port:
            raise SystemExit(f"{PROG}: serve needs --port")
        serve(args)
    else:
        inproc(args)


if __name__ == "__main__":
    from tideloop._bench import harness
    harness.worker_main(PROG, main)
