#!/usr/bin/env python3
"""Fault runs: the loop's I/O with system calls that fail at random.

tools/faults/faultinject.c, preloaded, makes send/recv/sendmsg/recvmsg/
recvmmsg/accept4/read/write/writev/epoll_wait/epoll_ctl calls on the
non-blocking sockets and pipes of a loop fail with an errno, or move fewer
bytes than asked.  Under it, one child per loop runs a checksummed workload
for a while: TCP, Unix and TLS echo (streams clients, protocol servers), UDP
datagrams, a pipe through `cat` (create_subprocess_exec), subprocesses'
exit codes and timers.  Two sets of faults, each on both loops:

  safe       EINTR, EAGAIN, short reads and writes: nothing may fail; every
             byte comes back, in order
  failing    ECONNRESET, EPIPE, ENOBUFS on stream sockets, EPIPE on pipes,
             EMFILE/ECONNABORTED/ENOBUFS on accept, ENOMEM on adding an
             epoll watch, with the safe ones: connections may fail, with the
             error the stock loop gives for the same fault (the exception
             types, compared across the loops); the others' bytes must come
             back intact

The verdict, per run: the child ended by itself (no crash signal, no hang
past its deadline), 0 corrupt transfers, 0 hangs of an operation, and for
the safe set 0 failed operations; the exit status counts tideloop's runs
(the stock loop's are the reference: its failures are listed, not counted).
The report lists every injected fault by call and kind (summed over the
child's processes) and, per operation, the exceptions each loop raised.

    python stress/faults.py                 # both sets, both loops, 30 s each
    python stress/faults.py --ci            # CI's bounded run (about 2 minutes)
    python stress/faults.py --minutes 30    # the long run, by hand
"""
import argparse
import asyncio
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time

STRESS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(STRESS)
SOURCE = os.path.join(ROOT, "tools", "faults", "faultinject.c")
CERTS = os.path.join(ROOT, "tests", "certs")

SETS = {
    "safe": "EINTR,EAGAIN,SHORT",
    "failing": "EINTR,EAGAIN,SHORT,ECONNRESET,EPIPE,ENOBUFS,ENOMEM,EMFILE,ECONNABORTED",
}
# What a failed operation may raise under the failing set (anything else is
# an error of the run): the faults' errnos as asyncio and ssl report them.
EXPECTED_FAILURES = {"ConnectionResetError", "BrokenPipeError", "ConnectionAbortedError",
                     "OSError", "SSLError", "SSLEOFError", "SSLZeroReturnError",
                     "IncompleteReadError", "MemoryError", "ConnectionError", "EOFError",
                     "TimeoutError", "Lost"}
# An operation that takes longer hung.  Under the failing set that may be the
# fault's due: a connection whose reader could not be added (ENOMEM from
# epoll_ctl) waits for ever on the stock loop too; it counts as a failure of
# that operation (TimeoutError).  Under the safe set nothing may hang.
OP_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
REFERENCE = "asyncio"


def build(out_dir):
    """The interposer, compiled for this machine: its path."""
    out = os.path.join(out_dir, "faultinject.so")
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-o", out, SOURCE, "-ldl"], check=True)
    return out


# ---------------------------------------------------------------------------
# the child: one loop, the workload, a JSON line with the outcomes

class Outcomes:
    def add(self, what, status, detail=None):
        table = getattr(self, status)
        table[what] = table.get(what, 0) + 1
        if detail is not None:
            self.failures.setdefault(what, {})
            self.failures[what][detail] = self.failures[what].get(detail, 0) + 1

    def __init__(self, fault_set):
        self.fault_set = fault_set
        self.ok, self.failed, self.corrupt, self.hung = {}, {}, {}, {}
        self.bytes = 0
        self.failures = {}

    async def run(self, what, coro):
        try:
            verified = await asyncio.wait_for(coro, OP_TIMEOUT)
        except asyncio.TimeoutError:
            if self.fault_set == "safe":
                self.add(what, "hung")
            else:
                self.add(what, "failed", "TimeoutError")
        except Corrupt as exc:
            self.add(what, "corrupt", str(exc))
        except Lost as exc:
            if self.fault_set == "safe":
                self.add(what, "corrupt", str(exc))
            else:
                self.add(what, "failed", "Lost")
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, MemoryError,
                ConnectionError, EOFError) as exc:
            self.add(what, "failed", type(exc).__name__)
        else:
            self.bytes += verified
            self.add(what, "ok")


class Corrupt(Exception):
    pass


class Lost(Exception):
    """Datagrams that never came back: a failure where faults may fail a
    registration (the endpoint never reads), corruption otherwise."""


# --sabotage: the echo servers flip a bit in their first read and in every
# 50th after it (the first for certain: a slow run may make few reads)
SABOTAGE = [0]


# The echo servers' open connections: aborted at the end of the run, whose
# last faults may have left some that neither side will ever close (a
# reader that could not be added), where Server.wait_closed() would wait.
ECHO_TRANSPORTS = set()


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        ECHO_TRANSPORTS.add(transport)

    def connection_lost(self, exc):
        ECHO_TRANSPORTS.discard(self.transport)

    def data_received(self, data):
        if SABOTAGE[0]:
            SABOTAGE[0] += 1
            if SABOTAGE[0] % 50 == 2:
                data = bytes(data[:-1]) + bytes([data[-1] ^ 1])
        self.transport.write(data)

    def eof_received(self):
        self.transport.close()


class DatagramEcho(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(data, addr)


async def stream_round_trip(rng, open_conn):
    """Random writes out, the same bytes back, in order: the byte count."""
    reader, writer = await open_conn()
    sent, got = hashlib.sha256(), hashlib.sha256()
    total = 0
    try:
        for _ in range(rng.randrange(4, 24)):
            chunk = rng.randbytes(rng.randrange(1, 32 << 10))
            sent.update(chunk)
            total += len(chunk)
            writer.write(chunk)
            if rng.random() < 0.5:
                await writer.drain()
        await writer.drain()
        received = 0
        while received < total:
            data = await reader.read(min(65536, total - received))
            if not data:
                raise EOFError("the echo ended early")
            got.update(data)
            received += len(data)
        if got.digest() != sent.digest():
            raise Corrupt("echoed bytes differ")
    finally:
        # Bounded: after a fault a close may never complete on either loop
        # (a TLS close_notify or buffered bytes the peer will not read);
        # then the connection is aborted.
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT)
        except (OSError, ssl.SSLError):
            pass
        except asyncio.TimeoutError:
            writer.transport.abort()
    return total


async def datagrams(rng, loop, addr):
    """Numbered datagrams with their checksum: those that come back must be
    intact and each come once (no fault drops one; a late one may be lost)."""
    back = asyncio.Queue()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data, addr):
            back.put_nowait(data)
    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=addr)
    count, seen, verified = 40, set(), 0
    try:
        for i in range(count):
            body = rng.randbytes(rng.randrange(1, 1200))
            transport.sendto(i.to_bytes(4, "big") + hashlib.sha256(body).digest() + body)
        deadline = loop.time() + 5
        while len(seen) < count and loop.time() < deadline:
            try:
                data = await asyncio.wait_for(back.get(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            n, digest, body = int.from_bytes(data[:4], "big"), data[4:36], data[36:]
            if hashlib.sha256(body).digest() != digest or n in seen:
                raise Corrupt("a datagram came back changed or twice")
            seen.add(n)
            verified += len(data)
        if len(seen) < count:
            raise Lost("%d of %d datagrams never came back" % (count - len(seen), count))
    finally:
        transport.close()
    return verified


async def pipe_through_cat(rng):
    proc = await asyncio.create_subprocess_exec(
        "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    data = rng.randbytes(rng.randrange(1, 256 << 10))
    out, _ = await proc.communicate(data)
    if proc.returncode != 0:
        raise OSError("cat exited with %d" % proc.returncode)
    if out != data:
        # A write fault on cat's stdin (EPIPE) ends the input early, and
        # communicate() swallows BrokenPipeError by design: cat's output is
        # then a prefix of what was sent -- lost, not corrupted.
        if data.startswith(out):
            raise Lost("cat's output stopped after %d of %d bytes" % (len(out), len(data)))
        raise Corrupt("the pipe's bytes differ")
    return len(data)


async def child_exit_codes(rng):
    codes = [rng.randrange(0, 5) for _ in range(3)]
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-c",
                                                  "import sys; sys.exit(%d)" % c)
             for c in codes]
    got = [await p.wait() for p in procs]
    if got != codes:
        raise Corrupt("exit codes %r, not %r" % (got, codes))
    return 0


async def timers(rng, loop):
    fired, done = [], loop.create_future()
    delays = [rng.random() * 0.02 for _ in range(200)]
    start = loop.time()
    for i, d in enumerate(delays):
        loop.call_at(start + d, fired.append, i)
    loop.call_at(start + 0.05, done.set_result, None)
    await done
    order = sorted(range(len(delays)), key=lambda i: (delays[i], i))
    if fired != order:
        raise Corrupt("timers fired %d of %d, or out of order" % (len(fired), len(delays)))
    return 0


async def workload(loop, seconds, seed, arm, fault_set):
    rng = random.Random(seed)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(os.path.join(CERTS, "server-ecdsa.pem"))
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(os.path.join(CERTS, "ca.pem"))
    workdir = tempfile.mkdtemp(prefix="tideloop-faults-")
    unix_path = os.path.join(workdir, "echo.sock")
    tcp = await loop.create_server(Echo, "127.0.0.1", 0)
    unix = await loop.create_unix_server(Echo, unix_path)
    tls = await loop.create_server(Echo, "127.0.0.1", 0, ssl=server_ctx)
    udp, _ = await loop.create_datagram_endpoint(DatagramEcho, local_addr=("127.0.0.1", 0))
    tcp_port, tls_port = tcp.sockets[0].getsockname()[1], tls.sockets[0].getsockname()[1]
    udp_addr = udp.get_extra_info("sockname")
    out = Outcomes(fault_set)
    kinds = {
        "tcp": lambda r: stream_round_trip(
            r, lambda: asyncio.open_connection("127.0.0.1", tcp_port)),
        "unix": lambda r: stream_round_trip(r, lambda: asyncio.open_unix_connection(unix_path)),
        "tls": lambda r: stream_round_trip(r, lambda: asyncio.open_connection(
            "127.0.0.1", tls_port, ssl=client_ctx, server_hostname="localhost")),
        "udp": lambda r: datagrams(r, loop, udp_addr),
        "pipe": pipe_through_cat,
        "subprocess": child_exit_codes,
        "timers": lambda r: timers(r, loop),
    }
    open(arm, "w").close()          # faults from now on
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            batch = []
            for what, make in kinds.items():
                for _ in range(3 if what in ("tcp", "unix", "tls") else 1):
                    batch.append(out.run(what, make(random.Random(rng.random()))))
            await asyncio.gather(*batch)
    finally:
        os.unlink(arm)              # no faults while closing and reporting
        for server in (tcp, unix, tls):
            server.close()
        for transport in list(ECHO_TRANSPORTS):
            transport.abort()
        for server in (tcp, unix, tls):
            await asyncio.wait_for(server.wait_closed(), CLOSE_TIMEOUT)
        udp.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def child_main(loop_name, seconds, seed, arm, fault_set, sabotage=False):
    SABOTAGE[0] = int(sabotage)
    if loop_name == "tideloop":
        try:
            import tideloop     # installed, or on PYTHONPATH
        except ImportError:     # a checkout built in place
            sys.path.insert(0, os.path.join(ROOT, "src"))
            import tideloop
        loop = tideloop.new_event_loop()
    else:
        loop = asyncio.SelectorEventLoop()
    try:
        out = loop.run_until_complete(workload(loop, seconds, seed, arm, fault_set))
    finally:
        loop.close()
    print("RESULT " + json.dumps(dict(ok=out.ok, failed=out.failed, corrupt=out.corrupt,
                                      hung=out.hung, bytes=out.bytes, failures=out.failures)),
          flush=True)


# ---------------------------------------------------------------------------
# the parent: runs, verdicts, the report

def run_child(lib, loop_name, fault_set, seconds, seed, rate, workdir, sabotage=False):
    arm = os.path.join(workdir, "armed-%s-%s" % (loop_name, fault_set))
    prefix = os.path.join(workdir, "report-%s-%s" % (loop_name, fault_set))
    if fault_set == "failing":
        rate /= 2       # most operations must still get through
    # After what is preloaded already (a sanitizer's runtime must come first).
    preload = ":".join(filter(None, (os.environ.get("LD_PRELOAD"), lib)))
    env = dict(os.environ, LD_PRELOAD=preload, TL_FAULTS=SETS[fault_set], TL_FAULT_RATE=str(rate),
               TL_FAULT_SEED=str(seed), TL_FAULT_REPORT=prefix, TL_FAULT_ARM=arm)
    env.pop("PYTHONASYNCIODEBUG", None)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", loop_name,
                          "--seconds", str(seconds), "--seed", str(seed), "--arm", arm,
                          "--sets", fault_set] + (["--sabotage"] if sabotage else []),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = p.communicate(timeout=seconds + 120)
        hung = False
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        hung = True
    faults = {}
    for path in glob.glob(prefix + ".*.json"):
        with open(path) as f:
            for call, counts in json.load(f)["calls"].items():
                for kind, n in counts.items():
                    cell = faults.setdefault(call, {})
                    cell[kind] = cell.get(kind, 0) + n
    result = next((json.loads(line[7:]) for line in stdout.splitlines()
                   if line.startswith("RESULT ")), None)
    return dict(loop=loop_name, set=fault_set, seconds=round(time.monotonic() - t0, 1),
                returncode=p.returncode, hung=hung, result=result, faults=faults,
                stderr=stderr[-3000:])


def verdict(run):
    """The reasons this run failed ([] when it passed)."""
    why = []
    if run["hung"]:
        why.append("the child hung past its deadline")
    elif run["returncode"] != 0:
        why.append("the child exited with %s" % run["returncode"])
    res = run["result"]
    if res is None:
        return why + ["no result"]
    if res["corrupt"]:
        why.append("corrupt transfers: %s" % res["failures"])
    if res["hung"]:
        why.append("operations hung: %s" % res["hung"])
    if run["set"] == "safe" and res["failed"]:
        why.append("operations failed under safe faults: %s" % res["failures"])
    unexpected = {d for what in res["failures"].values() for d in what} - EXPECTED_FAILURES
    if run["set"] == "failing" and unexpected and not res["corrupt"]:
        why.append("unexpected failures: %s" % sorted(unexpected))
    if not res["ok"]:
        why.append("no operation succeeded")
    injected = sum(n for counts in run["faults"].values()
                   for k, n in counts.items() if k != "seen")
    if injected == 0:
        why.append("no fault was injected")
    return why


def report(runs):
    print("\n%-9s %-8s %6s %8s %8s %7s %5s %9s  %s" % (
        "loop", "faults", "secs", "ok", "failed", "corrupt", "hung", "MiB", "verdict"))
    for run in runs:
        res = run["result"] or {}
        count = lambda key: sum((res.get(key) or {}).values())     # noqa: E731
        why = verdict(run)
        print("%-9s %-8s %6.0f %8d %8d %7d %5d %9.1f  %s" % (
            run["loop"], run["set"], run["seconds"], count("ok"), count("failed"),
            count("corrupt"), count("hung"), res.get("bytes", 0) / 2**20,
            "PASS" if not why else "FAIL: " + "; ".join(why)))
    print("\nfaults injected, by call and kind (all runs, each loop's processes summed):")
    calls = {}
    for run in runs:
        for call, counts in run["faults"].items():
            for kind, n in counts.items():
                if kind != "seen":
                    key = (call, kind)
                    calls.setdefault(key, {})
                    calls[key][run["loop"]] = calls[key].get(run["loop"], 0) + n
    for (call, kind), per_loop in sorted(calls.items()):
        print("  %-11s %-13s %s" % (call, kind, "  ".join(
            "%s %d" % (loop, n) for loop, n in sorted(per_loop.items()))))
    print("\nfailed operations by exception (failing set):")
    for run in runs:
        if run["set"] == "failing" and run["result"]:
            kinds = {}
            for what in run["result"]["failures"].values():
                for exc, n in what.items():
                    kinds[exc] = kinds.get(exc, 0) + n
            print("  %-9s %s" % (run["loop"], ", ".join(
                "%s %d" % kv for kv in sorted(kinds.items())) or "none"))
    rows, differ = error_comparison(runs)
    if rows:
        print("\nper operation, the exceptions each loop raised (failing set; the same "
              "seed, so the same faults in the same order of calls):")
        for what, per_loop in rows:
            print("  %-22s %s" % (what, "  |  ".join(
                "%s: %s" % (loop, ", ".join("%s %d" % kv for kv in sorted(excs.items()))
                            or "-") for loop, excs in sorted(per_loop.items()))))
        print("  exceptions tideloop raised that the stock loop never raised for that "
              "operation: %s" % (", ".join("%s %s" % d for d in differ) or "none"))


def error_comparison(runs):
    """The failing set's exceptions per operation and loop: ([(operation,
    {loop: {exception: count}})], [(operation, exception)] that tideloop
    raised where the stock loop failed that operation too, but never so)."""
    per_op = {}
    for run in runs:
        if run["set"] != "failing" or not run["result"]:
            continue
        for what, excs in run["result"]["failures"].items():
            mine = per_op.setdefault(what, {}).setdefault(run["loop"], {})
            for exc, n in excs.items():
                mine[exc] = mine.get(exc, 0) + n
    differ = []
    for what, per_loop in sorted(per_op.items()):
        stock, ours = per_loop.get("asyncio"), per_loop.get("tideloop")
        if stock and ours:
            differ += [(what, exc) for exc in sorted(set(ours) - set(stock))]
    return sorted(per_op.items()), differ


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ci", action="store_true", help="CI's bounded run (12 s per run)")
    ap.add_argument("--minutes", type=float, help="total time, split over the runs")
    ap.add_argument("--seconds", type=float, default=30.0, help="per run (default 30)")
    ap.add_argument("--rate", type=float, default=0.02, help="fault probability per call")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loops", default="asyncio,tideloop")
    ap.add_argument("--sets", default="safe,failing")
    ap.add_argument("--json", help="write the runs there")
    ap.add_argument("--sabotage", action="store_true",
                    help="the echo servers corrupt a byte now and then: the run must fail")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child, args.seconds, args.seed, args.arm, args.sets, args.sabotage)
        return 0
    loops, sets = args.loops.split(","), args.sets.split(",")
    seconds = 12.0 if args.ci else args.seconds
    if args.minutes:
        seconds = args.minutes * 60 / (len(loops) * len(sets))
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="tideloop-faults-")
    try:
        lib = build(workdir)
        runs = []
        for fault_set in sets:
            for loop_name in loops:         # the same seed on each loop
                runs.append(run_child(lib, loop_name, fault_set, seconds, args.seed,
                                      args.rate, workdir, args.sabotage))
                print("[%5.0fs] %s, %s faults: %s" % (
                    time.monotonic() - t0, loop_name, fault_set,
                    "PASS" if not verdict(runs[-1]) else "FAIL"), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(runs)
    # The stock loop's runs are the reference (the exceptions it raises for
    # the same faults): their failures are shown, and are not tideloop's
    # (it loses a wake-up when its self-pipe write fails with the injected
    # EINTR or EAGAIN, which _write_to_self() swallows: a subprocess wait
    # then hangs until something else wakes the loop).
    failed = [r for r in runs if verdict(r) and r["loop"] != REFERENCE]
    reference_failed = [r for r in runs if verdict(r) and r["loop"] == REFERENCE]
    if reference_failed:
        print("\nthe stock loop (the reference, not counted) failed: " + "; ".join(
            "%s faults: %s" % (r["set"], "; ".join(verdict(r))) for r in reference_failed))
    for r in failed + reference_failed:
        if r["stderr"].strip():
            print("\n--- %s, %s faults: the child's stderr (end) ---\n%s" % (
                r["loop"], r["set"], r["stderr"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(runs=runs, seconds_per_run=seconds, rate=args.rate,
                           seed=args.seed), f, indent=1)
    print("\nfaults: %s (%d runs, %.0f s)" % ("PASS" if not failed else "FAIL", len(runs),
                                              time.monotonic() - t0))
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
