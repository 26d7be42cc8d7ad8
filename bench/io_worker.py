#!/usr/bin/env python3
"""The loop side of the I/O benchmark (bench/io.py), one workload per process.

    python -m bench.io_worker --loop asyncio|uvloop|tideloop --kind KIND [options]

Kinds:

* udp        -- a DatagramProtocol echo server on 127.0.0.1:--port (0: a free
                one): datagram_received(data, addr) -> transport.sendto(data, addr).
                Prints "READY <port>" and serves until killed (SIGTERM); the
                driver measures this process's CPU from /proc.
* spawn      -- --count processes of /bin/true, at most --concurrency at a
                time: proc = await asyncio.create_subprocess_exec("/bin/true");
                await proc.wait()  (exit status checked).
* spawn_pipe -- the same with asyncio.create_subprocess_exec("/bin/echo", "tideloop",
                stdout=PIPE) and await proc.communicate()  (output checked).
* pipe_read  -- a child (`dd if=/dev/zero bs=1M`, started with subprocess.Popen)
                writes --bytes into a pipe; the loop reads it with
                loop.connect_read_pipe and an asyncio.Protocol that counts
                data_received() bytes, until connection_lost.
* pipe_write -- the loop writes --bytes in --chunk-byte writes (one preallocated
                bytes object) with loop.connect_write_pipe into a child
                (`cat`, stdout /dev/null), stopping at pause_writing() and going
                on at resume_writing(); done when, after close(), connection_lost
                says the last byte went into the pipe.

For every kind but udp, the workload first runs a warm-up (a twentieth of its
size, at least a few units) on the same loop, then the measured run; the
process prints one JSON line: units, wall_s (time.perf_counter() read inside
the running loop), cpu_s (utime+stime of this process, all threads, from
resource.getrusage(RUSAGE_SELF)), utime_s, stime_s, children_cpu_s (the
children's own CPU, RUSAGE_CHILDREN: informational, the same for every loop).

The loop is chosen with asyncio.Runner(loop_factory=...), as in
bench/echo_servers.py.  --loop blocking (pipe_* only) is the floor: the same
child and byte count with no event loop, a blocking os.readv() into one
256 KiB bytearray / os.write() of each chunk, so what is left is the kernel's
copy and the syscalls.  Any failure exits with status 1 and a one-line reason
on stderr ("io_worker: ERROR: ..."), after the traceback.
"""

import asyncio
import json
import os
import resource
import subprocess
import time

from tideloop._bench import harness

KINDS = ("udp", "spawn", "spawn_pipe", "pipe_read", "pipe_write")
LOOPS = harness.ALL_LOOPS + ("blocking",)
ECHO_TEXT = b"tideloop"


# -- udp ----------------------------------------------------------------------

class EchoDatagram(asyncio.DatagramProtocol):
    transport = None

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(data, addr)

    def error_received(self, exc):
        pass


async def serve_udp(args):
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        EchoDatagram, local_addr=(args.host, args.port))
    port = transport.get_extra_info("sockname")[1]
    print(f"READY {port}", flush=True)
    await asyncio.Future()          # serve until killed


# -- subprocesses ---------------------------------------------------------------

async def spawn_many(count, concurrency, pipe):
    sem = asyncio.Semaphore(concurrency)
    create = asyncio.create_subprocess_exec
    PIPE = asyncio.subprocess.PIPE

    async def one():
        async with sem:
            if pipe:
                proc = await create("/bin/echo", ECHO_TEXT.decode(), stdout=PIPE)
                out, _ = await proc.communicate()
                if out != ECHO_TEXT + b"\n":
                    raise AssertionError(f"child wrote {out!r}")
            else:
                proc = await create("/bin/true")
                await proc.wait()
            if proc.returncode != 0:
                raise AssertionError(f"child exited with status {proc.returncode}")

    await asyncio.gather(*[one() for _ in range(count)])
    return count


# -- pipes --------------------------------------------------------------------

class CountingReader(asyncio.Protocol):
    def __init__(self, done):
        self.done = done
        self.received = 0

    def data_received(self, data):
        self.received += len(data)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        if not self.done.done():
            if exc is None:
                self.done.set_result(self.received)
            else:
                self.done.set_exception(exc)


def zeros_child(nbytes):
    """A child writing ``nbytes`` (whole MiB) of zeros into its stdout pipe."""
    return subprocess.Popen(["dd", "if=/dev/zero", "bs=1M", f"count={nbytes >> 20}",
                             "status=none"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)


def reap(child, pipe):
    """Close our end of the child's pipe, wait for the child; its exit status."""
    try:
        pipe.close()
    except OSError:
        pass
    return child.wait()


def check_read(got, nbytes, status):
    if got != nbytes or status != 0:
        raise AssertionError(f"read {got} of {nbytes} bytes; writer exited with {status}")


def sink_child():
    """A child reading its stdin pipe to the end (into /dev/null)."""
    with open(os.devnull, "wb") as devnull:
        return subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=devnull)


def check_written(status):
    if status != 0:
        raise AssertionError(f"cat exited with status {status}")


async def pipe_read(nbytes):
    loop = asyncio.get_running_loop()
    if nbytes % (1 << 20):
        raise ValueError("--bytes must be a multiple of 1 MiB for pipe_read")
    child = zeros_child(nbytes)
    try:
        done = loop.create_future()
        transport, proto = await loop.connect_read_pipe(lambda: CountingReader(done), child.stdout)
        got = await done
        transport.close()
    finally:
        status = reap(child, child.stdout)
    check_read(got, nbytes, status)
    return nbytes


class PacedWriter(asyncio.Protocol):
    """Writes ``total`` bytes in ``chunk``s while not paused; ``written`` is
    set once the last write() was made, ``done`` at connection_lost.  The
    caller closes the transport: closing from inside resume_writing() makes
    asyncio 3.11's write pipe call connection_lost twice
    (_UnixWritePipeTransport._write_ready)."""

    def __init__(self, chunk, total, written, done):
        self.chunk = chunk
        self.left = total
        self.written = written
        self.done = done
        self.paused = False
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def pump(self):
        write = self.transport.write
        chunk = self.chunk
        n = len(chunk)
        while self.left >= n and not self.paused:
            self.left -= n
            write(chunk)
        if self.left == 0 and not self.written.done():
            self.written.set_result(None)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.pump()

    def connection_lost(self, exc):
        if not self.done.done():
            if exc is None and self.left == 0:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc or AssertionError(
                    f"pipe closed with {self.left} bytes left to write"))
        if not self.written.done():
            self.written.set_exception(exc or AssertionError("pipe closed early"))


async def pipe_write(nbytes, chunk_size):
    loop = asyncio.get_running_loop()
    if nbytes % chunk_size:
        raise ValueError("--bytes must be a multiple of --chunk for pipe_write")
    child = sink_child()
    try:
        written = loop.create_future()
        done = loop.create_future()
        chunk = bytes(chunk_size)
        transport, proto = await loop.connect_write_pipe(
            lambda: PacedWriter(chunk, nbytes, written, done), child.stdin)
        proto.pump()
        await written
        transport.close()           # connection_lost once the buffer is flushed
        await done
    finally:
        status = reap(child, child.stdin)
    check_written(status)
    return nbytes


def blocking_pipe_read(nbytes):
    child = zeros_child(nbytes)
    fd = child.stdout.fileno()
    bufs = [bytearray(256 * 1024)]
    got = 0
    readv = os.readv
    try:
        while True:
            n = readv(fd, bufs)
            if not n:
                break
            got += n
    finally:
        status = reap(child, child.stdout)
    check_read(got, nbytes, status)
    return nbytes


def blocking_pipe_write(nbytes, chunk_size):
    child = sink_child()
    fd = child.stdin.fileno()
    chunk = bytes(chunk_size)
    write = os.write
    try:
        for _ in range(nbytes // chunk_size):
            if write(fd, chunk) != chunk_size:      # blocking pipe: all or error
                raise AssertionError("short write to a blocking pipe")
    finally:
        status = reap(child, child.stdin)
    check_written(status)
    return nbytes


# -- measuring ----------------------------------------------------------------

def _cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime, ru.ru_stime, rc.ru_utime + rc.ru_stime


def workload(args, scale):
    """A coroutine function running the kind's workload at ``scale`` x its size."""
    if args.kind in ("spawn", "spawn_pipe"):
        count = max(5, int(args.count * scale))
        return lambda: spawn_many(count, args.concurrency, args.kind == "spawn_pipe")
    if args.kind == "pipe_read":
        nbytes = max(1 << 20, int(args.bytes * scale) >> 20 << 20)
        if args.loop == "blocking":
            return lambda: _done(blocking_pipe_read(nbytes))
        return lambda: pipe_read(nbytes)
    nbytes = max(args.chunk, int(args.bytes * scale) // args.chunk * args.chunk)
    if args.loop == "blocking":
        return lambda: _done(blocking_pipe_write(nbytes, args.chunk))
    return lambda: pipe_write(nbytes, args.chunk)


async def _done(value):
    return value


async def measure(args):
    if args.warmup:
        await workload(args, 0.05)()
    run = workload(args, 1.0)
    u0, s0, c0 = _cpu()
    t0 = time.perf_counter()
    units = await run()
    t1 = time.perf_counter()
    u1, s1, c1 = _cpu()
    print(json.dumps({
        "units": units,
        "wall_s": t1 - t0,
        "cpu_s": (u1 - u0) + (s1 - s0),
        "utime_s": u1 - u0,
        "stime_s": s1 - s0,
        "children_cpu_s": c1 - c0,
    }), flush=True)


def build_parser():
    p = harness.worker_parser(__doc__, LOOPS, KINDS, port_help="udp: UDP port on --host "
                              "(0: a free one, printed after READY)")
    p.add_argument("--count", type=int, default=1000,
                   help="spawn*: processes (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=50,
                   help="spawn*: processes at a time (default: %(default)s)")
    p.add_argument("--bytes", type=int, default=1 << 30,
                   help="pipe_*: bytes through the pipe (default: 1 GiB)")
    p.add_argument("--chunk", type=int, default=65536,
                   help="pipe_write: bytes per transport.write() (default: %(default)s)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the warm-up run")
    return p


def run(args):
    if args.loop == "blocking":
        if not args.kind.startswith("pipe_"):
            raise ValueError(f"--loop blocking is for pipe_read/pipe_write, not {args.kind}")
        # No event loop: drive the coroutines by hand (they never suspend).
        coro = measure(args)
        try:
            coro.send(None)
        except StopIteration:
            pass
        else:
            raise RuntimeError("the blocking workload suspended")
        return
    harness.run_on_loop(args.loop, serve_udp if args.kind == "udp" else measure, args)


def main():
    args = build_parser().parse_args()
    harness.worker_main("io_worker", lambda: run(args))


if __name__ == "__main__":
    main()
