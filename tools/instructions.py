#!/usr/bin/env python3
"""Instruction counts of the loop's hot paths, exact enough to guard in CI.

    python tools/instructions.py                   # measure; compare with the baseline
    python tools/instructions.py --update          # measure; write the baseline
    python tools/instructions.py --only echo-streams --json out.json
    python tools/instructions.py --src /tmp/old/src     # an earlier commit, built in place
    python tools/instructions.py --figures out.json     # compare a saved run, no measuring
    python tools/instructions.py --history REV [REV ...]  # those commits, for the docs

By default the extension is built from this checkout in a scratch copy
(setup.py's flags), so that the figures are of the code, not of whatever
build src/ holds.

Each workload runs in one process, on one loop, with one operation in flight
(so nothing depends on timing: every poll finds exactly what the previous
step made ready), under valgrind's callgrind: a warm-up run of R
operations, then R, then 3R (callgrind dumps its counts at a marker after
each run).  The slope, (Ir(3R) - Ir(R)) / 2R, is the user-space
instructions one more operation costs, without start-up, imports and exit.
glibc's allocator (malloc, free and their internals) is left out of the
figure and its calls are counted instead, a second guarded figure: what a
call costs in glibc's bins depends on the heap's history, not on the code
(one tree's echo-protocol moved by 7 % with the number of unrelated objects
made first).  The interpreter runs with PYTHONHASHSEED=0, address-space
randomisation off (setarch -R), glibc's baseline x86-64 copy and string
routines (GLIBC_TUNABLES, whatever the CPU), from paths of fixed length with
a minimal environment, so a figure repeats to within a few instructions
from one machine or checkout to another.  The figure is the least over five
orders of the interpreter's type tags (TAG_SHIFTS: the method cache's
collisions otherwise move it by a percent or more).

Workloads (tideloop, CPython of this interpreter):
  call-soon        call_soon() and the callback's run, 100 an iteration
  timers           call_later(), 100 an iteration, half of them cancelled
  echo-protocol    asyncio.Protocol echo of 1 KiB over a Unix socket pair:
                   the client protocol writes, the server echoes
  echo-streams     asyncio streams (open_connection(sock=), a handler task:
                   read(65536), write, drain) against a Protocol client
  echo-sockets     loop.sock_recv / sock_sendall echo task against a
                   Protocol client
  echo-tls         the Protocol echo over TLS (start_tls on both ends)

Server-only workloads: the client is another process (a blocking socket,
not traced by valgrind), so the figure is the server's alone, as a load
test measures it, still with one request in flight:
  server-protocol  asyncio.Protocol echo of 1 KiB
  server-streams   asyncio streams echo of 1 KiB (read(65536), write, drain)
  server-lines     asyncio streams, HTTP/1-like: readline() up to the blank
                   line of a 10-line header block, a 1 KiB response
  server-frames    asyncio streams, framed: readexactly(4) for the length,
                   readexactly(n) for the 1 KiB body, the frame written back

--loop asyncio or uvloop measures that loop instead (figures side by side;
no baseline).

The baseline is results/instructions.json.  The exit status is 1 when any
workload costs more than --tolerance (default 3 %) above its baseline or
calls the allocator more often than that, when one could not run, or when
one is missing from the baseline; a change that
makes a path dearer on purpose updates the baseline in the same commit
(--update), so the reason stands beside the number.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# One baseline per CPython minor version: the interpreter's own costs move
# between them.  3.11's keeps its first name (the history and docs read it).
BASELINE_311 = os.path.join(REPO, "results", "instructions.json")


def baseline_path(version=None):
    """results/instructions.json for 3.11, results/instructions-X.Y.json else."""
    minor = ".".join((version or platform.python_version()).split(".")[:2])
    if minor == "3.11":
        return BASELINE_311
    return os.path.join(REPO, "results", f"instructions-{minor}.json")
HISTORY = os.path.join(REPO, "results", "instructions-history.json")
# The measured child runs from a copy of this file; it finds the certificates here.
CERTS = os.environ.get("TIDELOOP_INSTR_CERTS") or os.path.join(REPO, "tests", "certs")

WORKLOADS = {          # name: operations of the R run
    "call-soon": 10000,        # callbacks, 100 an iteration
    "timers": 10000,           # timers, 100 an iteration, half cancelled
    "echo-protocol": 1000,     # round trips of 1 KiB
    "echo-streams": 500,
    "echo-sockets": 500,
    "echo-tls": 500,
    "server-protocol": 1000,
    "server-streams": 500,
    "server-lines": 500,
    "server-frames": 500,
}
# The interpreter's method cache is a table indexed by a type's version tag
# and the address of the attribute's name: which hot lookups collide depends
# on the order types were tagged in and where the names were made, so an
# unrelated change to the workloads' own file moved echo-sockets by 1 % (a
# second miss a round trip, each a walk of the MRO).  Each workload runs
# with the tags shifted by 0 to 4 throwaway types first, and its figure is
# the least of the five: the path's cost without an unlucky collision.
TAG_SHIFTS = (0, 1, 2, 3, 4)
UNIT = "user-space instructions per operation, glibc's allocator left out"
BATCH = 100
MESSAGE = b"x" * 1024


# ---- the workloads (run in the measured child) ----------------------------

def _new_loop():
    """The loop the workload runs on: tideloop's, unless --loop names
    asyncio's own or uvloop (for side-by-side figures)."""
    which = os.environ.get("TIDELOOP_INSTR_LOOP", "tideloop")
    if which == "asyncio":
        import asyncio
        return asyncio.new_event_loop()
    if which == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    import tideloop
    return tideloop.new_event_loop()


def run_call_soon(loop, n):
    import asyncio

    def cb():
        pass

    async def main():
        lp = asyncio.get_running_loop()
        for _ in range(n // BATCH):
            for _ in range(BATCH):
                lp.call_soon(cb)
            await asyncio.sleep(0)
    loop.run_until_complete(main())


def run_timers(loop, n):
    import asyncio

    def cb():
        pass

    async def main():
        lp = asyncio.get_running_loop()
        for _ in range(n // BATCH):
            hs = [lp.call_later(1e-9 * i, cb) for i in range(BATCH)]
            for h in hs[::2]:
                h.cancel()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
    loop.run_until_complete(main())


class _Client:
    """The client side of every echo: write one message, wait for it whole,
    write the next; n round trips, then close."""

    def __init__(self, loop, n):
        import asyncio
        self.n = n
        self.done = loop.create_future()
        self.got = 0
        self._proto_base = asyncio.Protocol

    def connection_made(self, transport):
        self.transport = transport
        transport.write(MESSAGE)

    def data_received(self, data):
        self.got += len(data)
        if self.got % len(MESSAGE) == 0:
            self.n -= 1
            if self.n == 0:
                self.transport.close()
            else:
                self.transport.write(MESSAGE)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(self.got)

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


def _socketpair():
    import socket
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def _client(loop, sock, n, ssl=None):
    import asyncio

    async def start():
        c = _Client(loop, n)
        await loop.create_connection(lambda: c, sock=sock, ssl=ssl,
                                     server_hostname="localhost" if ssl else None)
        return await c.done
    return start()


class _Echo:
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        pass


class _TLSEcho(_Echo):
    """start_tls() does not call connection_made again: the TLS transport
    comes from its result, and what arrives before that waits."""

    def connection_made(self, transport):
        self.transport, self.early = None, []

    def data_received(self, data):
        if self.transport is None:
            self.early.append(data)
        else:
            self.transport.write(data)

    def upgraded(self, transport):
        self.transport = transport
        for data in self.early:
            transport.write(data)


def run_echo_protocol(loop, n):
    a, b = _socketpair()

    async def main():
        await loop.create_connection(_Echo, sock=a)
        return await _client(loop, b, n)
    return loop.run_until_complete(main())


def run_echo_streams(loop, n):
    import asyncio
    a, b = _socketpair()

    async def handler(reader, writer):
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    async def main():
        reader, writer = await asyncio.open_connection(sock=a)
        task = asyncio.ensure_future(handler(reader, writer))
        got = await _client(loop, b, n)
        await task
        return got
    return loop.run_until_complete(main())


def run_echo_sockets(loop, n):
    import asyncio
    a, b = _socketpair()

    async def server():
        while True:
            data = await loop.sock_recv(a, 65536)
            if not data:
                break
            await loop.sock_sendall(a, data)
        a.close()

    async def main():
        task = asyncio.ensure_future(server())
        got = await _client(loop, b, n)
        await task
        return got
    return loop.run_until_complete(main())


def run_echo_tls(loop, n):
    import ssl
    a, b = _socketpair()
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(os.path.join(CERTS, "server-ecdsa.pem"))
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.load_verify_locations(os.path.join(CERTS, "ca.pem"))

    async def main():
        import asyncio
        # The server end of the socket pair takes TLS by start_tls(), begun
        # (its reading paused, SSLProtocol in place) before the client says
        # hello.
        tr, proto = await loop.create_connection(_TLSEcho, sock=a)
        tls_server = loop.create_task(loop.start_tls(tr, proto, sctx, server_side=True))
        await asyncio.sleep(0)
        client = loop.create_task(_client(loop, b, n, ssl=cctx))
        proto.upgraded(await tls_server)
        return await client
    return loop.run_until_complete(main())


# ---- server-only workloads: the client is another (untraced) process ----

HEADERS = b"".join(b"Header-%d: %s\r\n" % (i, b"v" * 60) for i in range(9))
REQUEST_LINES = b"GET /item HTTP/1.1\r\n" + HEADERS + b"\r\n"

# The client: blocking, one request in flight; it sends n requests of its
# kind and reads each reply whole, then closes its end.
CLIENT = r"""
import socket, struct, sys
kind, n, fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(fileno=fd)
msg = b"x" * 1024
req = {"echo": msg, "lines": %(lines)r,
       "frames": struct.pack(">I", len(msg)) + msg}[kind]
want = {"echo": len(msg), "lines": len(msg), "frames": 4 + len(msg)}[kind]
for _ in range(n):
    s.sendall(req)
    got = 0
    while got < want:
        b = s.recv(65536)
        if not b:
            sys.exit("server closed early")
        got += len(b)
s.close()
""" % {"lines": REQUEST_LINES}


def _serve(loop, n, kind, serve):
    """Run serve(reader-side socket) on loop against the client process."""
    import socket
    a, b = socket.socketpair()
    a.setblocking(False)
    client = subprocess.Popen([sys.executable, "-c", CLIENT, kind, str(n), str(b.fileno())],
                              pass_fds=[b.fileno()])
    b.close()
    try:
        return loop.run_until_complete(serve(a))
    finally:
        if client.wait(timeout=600) != 0:
            raise SystemExit(f"the client failed ({client.returncode})")


def run_server_protocol(loop, n):
    async def serve(sock):
        done = loop.create_future()

        class Echo(_Echo):
            got = 0

            def data_received(self, data):
                self.got += len(data)
                self.transport.write(data)

            def connection_lost(self, exc):
                done.set_result(self.got)
        await loop.create_connection(Echo, sock=sock)
        return await done
    return _serve(loop, n, "echo", serve)


def _stream_server(handler):
    async def serve(sock):
        import asyncio
        reader, writer = await asyncio.open_connection(sock=sock)
        got = await handler(reader, writer)
        writer.close()
        return got
    return serve


def run_server_streams(loop, n):
    async def handler(reader, writer):
        got = 0
        while True:
            data = await reader.read(65536)
            if not data:
                return got
            got += len(data)
            writer.write(data)
            await writer.drain()
    return _serve(loop, n, "echo", _stream_server(handler))


def run_server_lines(loop, n):
    async def handler(reader, writer):
        got = 0
        while True:
            line = await reader.readline()
            if not line:
                return got
            while line != b"\r\n":
                line = await reader.readline()
            got += len(MESSAGE)
            writer.write(MESSAGE)
            await writer.drain()
    return _serve(loop, n, "lines", _stream_server(handler))


def run_server_frames(loop, n):
    import asyncio

    async def handler(reader, writer):
        got = 0
        while True:
            try:
                head = await reader.readexactly(4)
            except asyncio.IncompleteReadError:
                return got
            body = await reader.readexactly(int.from_bytes(head, "big"))
            got += len(body)
            writer.write(head + body)
            await writer.drain()
    return _serve(loop, n, "frames", _stream_server(handler))


RUNNERS = {"call-soon": run_call_soon, "timers": run_timers,
           "echo-protocol": run_echo_protocol, "echo-streams": run_echo_streams,
           "echo-sockets": run_echo_sockets, "echo-tls": run_echo_tls,
           "server-protocol": run_server_protocol, "server-streams": run_server_streams,
           "server-lines": run_server_lines, "server-frames": run_server_frames}


def child(name, n, shift=0):
    """A warm-up run of n operations, then n and 3n on the same loop, each
    run followed by os.getppid(): libc's getppid is the marker callgrind
    dumps its counts at (--dump-before), so the driver reads the two measured runs' own counts."""
    import gc
    shifted = [type(f"Shift{k}", (), {"tag": k}) for k in range(shift)]
    assert [t.tag for t in shifted] == list(range(shift))   # (a lookup tags a type)
    loop = _new_loop()
    gc.disable()          # collections at allocation counts: deterministic, but noise
    try:
        for ops in (n, n, 3 * n):
            got = RUNNERS[name](loop, ops)
            os.getppid()
            if name.startswith(("echo-", "server-")) and got != ops * len(MESSAGE):
                raise SystemExit(f"{name}: {got} bytes echoed, {ops * len(MESSAGE)} expected")
    finally:
        loop.close()


# ---- the driver -------------------------------------------------------------

# glibc picks its copy and string routines by the CPU (callgrind shows the guest
# a CPU like the host's): an AVX2 memcpy of 1 KiB is half the instructions of
# the SSE2 one, and rep movsb counts one per byte.  The figures are of the
# loop, so every machine runs the baseline x86-64 variants.
_X86_FEATURES_OFF = (
    "AVX", "AVX2", "AVX512F", "AVX512CD", "AVX512BW", "AVX512DQ", "AVX512VL",
    "ERMS", "FSRM", "SSSE3", "SSE4_1", "SSE4_2", "BMI1", "BMI2", "LZCNT", "MOVBE",
    "POPCNT", "RTM", "FMA", "FMA4", "XSAVEC",
    "Fast_Unaligned_Load", "Fast_Unaligned_Copy", "Fast_Copy_Backward",
    "Fast_Rep_String", "Prefer_ERMS", "Prefer_FSRM", "Prefer_PMINUB_for_stringop",
    "AVX_Fast_Unaligned_Load", "Slow_BSF", "Slow_SSE4_2")
GLIBC_PIN = ("glibc.cpu.hwcaps=" + ",".join("-" + f for f in _X86_FEATURES_OFF)
             + ":glibc.cpu.x86_non_temporal_threshold=0x4000000"
             + ":glibc.cpu.x86_rep_movsb_threshold=0x4000000"
             + ":glibc.cpu.x86_rep_stosb_threshold=0x4000000")


# glibc's allocator serves the 1 KiB payloads (too large for the
# interpreter's pymalloc and for glibc's tcache) from its bins, and what a
# call costs there depends on the heap's history: whether the freed chunk
# coalesces with a free neighbour, what the unsorted bin holds.  On one tree
# it moved echo-protocol's figure from 7,041 to 7,577 with the number of
# throwaway types made before the loop, every other function's count equal.
# The figure leaves out the self cost of these functions and counts the calls
# into the allocator instead, guarded apart: the code decides how often it
# allocates, not what glibc's bins cost that run.
ALLOCATOR_ENTRIES = frozenset((
    "malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign",
    "aligned_alloc", "memalign", "valloc", "pvalloc"))
ALLOCATOR_INTERNALS = frozenset((
    "_int_malloc", "_int_free", "_int_realloc", "_int_memalign", "unlink_chunk",
    "malloc_consolidate", "alloc_perturb", "free_perturb", "sysmalloc", "systrim",
    "tcache_init", "tcache_get", "tcache_put", "ptmalloc_init", "arena_get2",
    "_mid_memalign", "__libc_malloc", "__libc_free", "__libc_calloc",
    "__libc_realloc", "__libc_memalign", "__default_morecore", "__glibc_morecore"))


def _symbol(fn):
    """A function's name without a compiler clone's or a version's suffix
    (unlink_chunk.constprop.0, memcpy@GLIBC_2.2.5)."""
    return fn.split(".")[0].split("@")[0]


def _allocator(ob, fn):
    """Whether fn (of object ob) is glibc's allocator: an entry point or its
    internals."""
    return "libc.so" in ob and (_symbol(fn) in ALLOCATOR_ENTRIES
                                or _symbol(fn) in ALLOCATOR_INTERNALS)


def dump_costs(path):
    """(instructions outside glibc's allocator, calls into it, total) of one
    callgrind dump part.  A function's self cost is the cost lines of its fn=
    block, except the line after each calls=, which is the callee's inclusive
    cost; names are compressed as "(id) name" once, "(id)" after."""
    names = {"ob": {}, "fn": {}}

    def name(kind, rest):
        rest = rest.strip()
        if not rest.startswith("("):
            return rest
        ident, _, text = rest[1:].partition(")")
        if text.strip():
            names[kind][ident] = text.strip()
        return names[kind].get(ident, "?")
    outside = inside = calls = 0
    total = None
    ob = fn = callee_ob = callee = ""
    in_allocator = skip_next = False
    with open(path) as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                if skip_next:            # a call's inclusive cost, not self
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) > 1:
                    if in_allocator:
                        inside += int(parts[1])
                    else:
                        outside += int(parts[1])
                continue
            key, _, rest = line.partition("=")
            if key == "ob":
                ob = name("ob", rest)
                in_allocator = _allocator(ob, fn)
            elif key == "fn":
                fn = name("fn", rest)
                callee_ob = ob
                in_allocator = _allocator(ob, fn)
            elif key == "cob":
                callee_ob = name("ob", rest)
            elif key == "cfn":
                callee = name("fn", rest)
            elif key == "calls":
                skip_next = True
                # calls into an entry point from outside the allocator (its
                # internal calls, realloc calling malloc say, are not the code's)
                if (not in_allocator and "libc.so" in callee_ob
                        and _symbol(callee) in ALLOCATOR_ENTRIES):
                    calls += int(rest.split()[0])
                callee_ob = ob
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    if total is None or total != outside + inside:
        raise RuntimeError(f"{path}: the functions' costs ({outside + inside:,}) do not "
                           f"add up to the part's total ({total})")
    return outside, calls, total


def callgrind_slope(name, n, work, python, env, shift=0):
    """What one more operation costs: one process under callgrind (child()),
    its counts dumped at each marker; each figure (count(3n) - count(n)) / 2n.
    (instructions outside glibc's allocator, allocator calls, all instructions)."""
    # Not in `work`: the child's import system lists its script's directory,
    # and earlier runs' files there would move the heap (1 % on echo-sockets).
    os.makedirs(os.path.join(work, "out"), exist_ok=True)
    out = os.path.join(work, "out", f"cg.{name}.{shift}.%p.out")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           # libc's getppid, which os.getppid() calls: its name is in libc's
           # dynamic symbols, so a stripped interpreter (Debian's 3.14 and
           # 3.15) has the marker too; os_getppid is in the symbol table only
           "--dump-before=getppid",
           python, os.path.join(work, "child.py"), "--child", name, "--n", str(n),
           "--shift", str(shift)]
    if shutil.which("setarch"):
        cmd = ["setarch", platform.machine(), "-R", *cmd]
    with subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as p:
        try:
            _, err = p.communicate(timeout=1200)
        except subprocess.TimeoutExpired:
            p.kill()            # (run() would; Popen for the pid the dumps carry)
            raise
    if p.returncode != 0:
        raise RuntimeError(f"{name} failed: {err.strip().splitlines()[-1:]}")
    base = out.replace("%p", str(p.pid))   # (setarch execs valgrind: one pid)
    # Dumps: .1 start-up and warm-up, .2 the n run, .3 the 3n run.
    short, long_ = dump_costs(f"{base}.2"), dump_costs(f"{base}.3")
    keep = os.environ.get("TIDELOOP_INSTR_KEEP")    # --keep DIR: for callgrind_annotate
    for part in os.listdir(os.path.dirname(base)):
        if keep:
            shutil.move(os.path.join(os.path.dirname(base), part), os.path.join(keep, part))
        else:
            os.unlink(os.path.join(os.path.dirname(base), part))
    return tuple((b - a) / (2 * n) for a, b in zip(short, long_))


def build_scratch(python, where):
    """This checkout's extension built in a copy of the tree (so that nothing
    importing src/ meanwhile sees a half-written module): its src/."""
    for name in ("src", "setup.py", "pyproject.toml", "README.md", "LICENSE"):
        path = os.path.join(REPO, name)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(where, name),
                            ignore=shutil.ignore_patterns("*.so", "__pycache__", "build"))
        elif os.path.exists(path):
            shutil.copy(path, where)
    t = time.monotonic()
    p = subprocess.run([python, "setup.py", "-q", "build_ext", "--inplace"], cwd=where,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("building the extension failed: " + p.stderr.strip()[-2000:])
    print(f"  extension built in a scratch copy ({time.monotonic() - t:.0f} s)", flush=True)
    return os.path.join(where, "src")


def prepare(work, python, src):
    """The measured child's world, the same on every machine and checkout:
    the workloads, the certificates and tideloop's tree at paths of fixed
    length in `work` (string sizes move the heap's layout, and a copy's
    alignment changes its instruction count), and an environment of only
    what the figures depend on.  src None: this checkout, built there."""
    shutil.copy(os.path.abspath(__file__), os.path.join(work, "child.py"))
    shutil.copytree(CERTS, os.path.join(work, "certs"))
    if src is None:
        os.mkdir(os.path.join(work, "tree"))
        # built by the interpreter this tool runs on (a venv's has setuptools;
        # the base interpreter that runs the workloads may not: Debian's 3.14)
        built = build_scratch(sys.executable, os.path.join(work, "tree"))
        os.rename(built, os.path.join(work, "src"))
    else:
        shutil.copytree(src, os.path.join(work, "src"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    # Compiled now, so that every run imports the same way (a run that
    # compiles the modules writes __pycache__ and leaves another heap).
    p = subprocess.run([python, "-m", "compileall", "-q", os.path.join(work, "src")],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("compiling tideloop's modules failed: " + p.stdout[-1000:])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONPATH": os.path.join(work, "src"),
           "GLIBC_TUNABLES": GLIBC_PIN,
           "TIDELOOP_INSTR_LOOP": os.environ.get("TIDELOOP_INSTR_LOOP", "tideloop"),
           "TIDELOOP_INSTR_CERTS": os.path.join(work, "certs")}
    loop = env["TIDELOOP_INSTR_LOOP"]
    if loop not in ("tideloop", "asyncio"):
        # the base interpreter runs the workloads: the loop's package from
        # wherever this interpreter (a venv, say) imports it
        import importlib.util
        found = importlib.util.find_spec(loop)
        if found is None or not found.submodule_search_locations:
            raise RuntimeError(f"{loop} is not installed for {sys.executable}")
        site = os.path.dirname(list(found.submodule_search_locations)[0])
        env["PYTHONPATH"] += os.pathsep + site
    if os.environ.get("TIDELOOP_PORTABLE"):     # the portable mode's price
        env["TIDELOOP_PORTABLE"] = os.environ["TIDELOOP_PORTABLE"]
    return env


def measure(names, python, src, shifts=TAG_SHIFTS):
    """{name: (instructions outside glibc's allocator, allocator calls)} per
    operation, each workload in one callgrind run."""
    # mkdtemp's names have a fixed length; /tmp, not $TMPDIR, whose length varies.
    work = tempfile.mkdtemp(prefix="tlinstr-", dir="/tmp")
    figures, calls = {}, {}
    try:
        env = prepare(work, python, src)
        for name in names:
            t = time.monotonic()
            runs = [callgrind_slope(name, WORKLOADS[name], work, python, env, shift)
                    for shift in shifts]
            figures[name] = round(min(r[0] for r in runs))
            calls[name] = round(max(r[1] for r in runs), 2)
            print(f"  {name:<15} {figures[name]:>9,} instructions per operation, "
                  f"{calls[name]:g} allocator calls (tag shifts: "
                  f"{', '.join(f'{r[0]:,.0f}' for r in runs)}; with glibc's allocator: "
                  f"{', '.join(f'{r[2]:,.0f}' for r in runs)}; "
                  f"{time.monotonic() - t:.0f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures, calls


def compare(base, figures, names, tolerance, base_calls=None, calls=None):
    """(table lines, failures, workloads cheaper than the baseline by more than
    ``tolerance``): a workload fails when it costs more than ``tolerance``
    above its baseline or has none, or when it calls the allocator more
    often than ``tolerance`` above its baseline's calls (and 0.05 a call)."""
    base_calls, calls = base_calls or {}, calls or {}
    lines = [f"{'workload':<15} {'baseline':>10} {'now':>10} {'ratio':>7}"
             f" {'allocator calls':>17}"]
    failed, lower = [], []
    for name in names:
        b = base.get(name)
        now = figures[name]
        if b is None:
            failed.append(f"{name}: not in the baseline")
            lines.append(f"{name:<15} {'-':>10} {now:>10,} {'-':>7}  FAIL")
            continue
        ratio = now / b
        bc, nc = base_calls.get(name), calls.get(name)
        more_calls = bc is not None and nc is not None and nc > bc * (1 + tolerance) + 0.05
        mark = "  FAIL" if ratio > 1 + tolerance or more_calls else ""
        both = f"{bc:g} -> {nc:g}" if bc is not None and nc is not None else "-"
        lines.append(f"{name:<15} {b:>10,} {now:>10,} {ratio:>6.3f}x {both:>17}{mark}")
        if ratio > 1 + tolerance:
            failed.append(f"{name}: {ratio:.3f}x its baseline")
        if more_calls:
            failed.append(f"{name}: {nc:g} allocator calls, the baseline {bc:g}")
        if not mark and ratio < 1 - tolerance:
            lower.append(f"{name} {ratio:.3f}x")
    return lines, failed, lower


def history(revs, python):
    """Measure each commit's tree (a git worktree, built in place with
    setup.py's flags) and write results/instructions-history.json: the
    figures of earlier commits, measured by this tool, for the docs."""
    def git(*args, cwd=REPO):
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                              text=True).stdout.strip()
    tool = git("rev-parse", "--short=7", "HEAD")
    commits = []
    for rev in revs:
        where = tempfile.mkdtemp(prefix="tlhist-")
        try:
            git("worktree", "add", "--detach", "-f", where, rev)
            commit, date, subject = git("log", "-1", "--format=%H%n%cs%n%s", rev).split("\n", 2)
            print(f"{commit[:7]} {subject[:60]}", flush=True)
            p = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                               cwd=where, capture_output=True, text=True, timeout=600,
                               env={k: v for k, v in os.environ.items() if k != "TIDELOOP_DEV"})
            if p.returncode != 0:
                raise RuntimeError(f"{rev}: the build failed: {p.stderr.strip()[-500:]}")
            figures, calls = measure(list(WORKLOADS), python, os.path.join(where, "src"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", where], cwd=REPO,
                           capture_output=True)
            shutil.rmtree(where, ignore_errors=True)
        commits.append({"commit": commit[:12], "date": date, "subject": subject,
                        "figures": figures, "allocator_calls": calls})
    with open(HISTORY, "w") as f:
        json.dump({"unit": UNIT, "python": platform.python_version(),
                   "tool": f"tools/instructions.py at {tool}, --history on each commit's tree",
                   "commits": commits}, f, indent=1)
        f.write("\n")
    print(f"instructions: {len(commits)} commit(s) written ({HISTORY})")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated workloads (default: all)")
    ap.add_argument("--update", action="store_true", help="write the baseline")
    ap.add_argument("--baseline", default=baseline_path(),
                    help="default: results/instructions.json on 3.11, "
                         "results/instructions-X.Y.json on CPython X.Y (%(default)s here)")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--shifts", type=int, default=len(TAG_SHIFTS), choices=range(1, 6),
                    metavar="N", help="measure the first N type-tag shifts (default: all "
                    "%(default)s; the figure is their lowest, so fewer can only read "
                    "higher: CI's check takes 2)")
    ap.add_argument("--src", default=None,
                    help="where tideloop is imported from, built in place (an earlier "
                         "commit's tree measures its figures); default: this checkout, "
                         "built in a scratch copy with setup.py's flags")
    ap.add_argument("--figures", metavar="JSON",
                    help="compare the figures of an earlier --json file instead of measuring")
    ap.add_argument("--history", nargs="+", metavar="REV",
                    help="measure these commits' trees and write " + os.path.relpath(HISTORY, REPO))
    ap.add_argument("--loop", choices=("tideloop", "asyncio", "uvloop"), default="tideloop",
                    help="the loop measured (asyncio's and uvloop's figures have no baseline)")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep callgrind's dumps in DIR (.2: the R run, .3: the 3R run; "
                         "callgrind_annotate --diff shows where one more operation goes)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--shift", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.n, args.shift)
        return 0
    if args.figures:
        with open(args.figures) as f:
            measured = json.load(f)
        names = list(measured["figures"])
        return check(measured["figures"], names, args, measured.get("allocator_calls"))
    if not shutil.which("valgrind"):
        print("instructions: valgrind is needed (apt-get install valgrind)", file=sys.stderr)
        return 1
    names = list(WORKLOADS) if not args.only else [x.strip() for x in args.only.split(",")]
    for name in names:
        if name not in WORKLOADS:
            ap.error(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    python = os.path.realpath(sys.executable)
    os.environ["TIDELOOP_INSTR_LOOP"] = args.loop
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        os.environ["TIDELOOP_INSTR_KEEP"] = os.path.abspath(args.keep)
    if args.history:
        try:
            return history(args.history, python)
        except (RuntimeError, subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
            print(f"instructions: FAIL: {exc}", file=sys.stderr)
            return 1
    print(f"instructions: {len(names)} workload(s) under callgrind on "
          f"{platform.python_implementation()} {platform.python_version()}, {args.loop}",
          flush=True)
    try:
        if args.update and args.shifts != len(TAG_SHIFTS):
            ap.error("--update measures every tag shift (no --shifts)")
        figures, calls = measure(names, python, args.src and os.path.abspath(args.src),
                                 TAG_SHIFTS[:args.shifts])
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"instructions: FAIL: {exc}", file=sys.stderr)
        return 1
    doc = {"python": platform.python_version(), "unit": UNIT,
           "figures": figures, "allocator_calls": calls}
    if args.loop != "tideloop":
        doc["loop"] = args.loop
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.loop != "tideloop":
        print(f"instructions: {args.loop}'s figures (not compared with a baseline)")
        return 0
    if args.update:
        old = {}
        if os.path.exists(args.baseline):
            with open(args.baseline) as f:
                old = json.load(f)
        for key in ("figures", "allocator_calls"):
            doc[key] = {**old.get(key, {}), **doc[key]}
        with open(args.baseline, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"instructions: baseline written ({args.baseline})")
        return 0
    return check(figures, names, args, calls)


def check(figures, names, args, calls=None):
    """Compare with the baseline and print the verdict: the exit status."""
    try:
        with open(args.baseline) as f:
            base = json.load(f)
    except OSError:
        print(f"instructions: FAIL: no baseline ({args.baseline}); run with --update",
              file=sys.stderr)
        return 1
    if base.get("python", "").rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]:
        print(f"instructions: FAIL: the baseline is of Python {base.get('python')}, "
              f"this is {platform.python_version()}", file=sys.stderr)
        return 1
    lines, failed, lower = compare(base["figures"], figures, names, args.tolerance,
                                   base.get("allocator_calls"), calls)
    print("\n" + "\n".join(lines))
    if failed:
        print(f"\ninstructions: FAIL (more than {args.tolerance:.0%} above the baseline: "
              + "; ".join(failed) + "). A change that costs this on purpose updates "
              "results/instructions.json in the same commit (--update).")
        return 1
    if lower:
        print(f"\ninstructions: cheaper than the baseline by more than {args.tolerance:.0%}: "
              + ", ".join(lower) + " (--update keeps the gain guarded)")
    print(f"\ninstructions: PASS (every workload within {args.tolerance:.0%} of the baseline "
          "or below it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
