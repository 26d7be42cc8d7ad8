"""What the scenarios share: the sizes per mode, the loops, the children's
environment, fd and RSS probes, the seeded byte stream and its checker, the
Result a child reports, helpers for child processes."""

from __future__ import annotations

import asyncio
import os
import random
import resource
import socket
import struct
import subprocess
import sys
import sysconfig
import time

# A str seed is hashed with sha512, whose module 3.13+ imports on first use:
# seed once now, before a scenario uses up the file descriptors.
random.Random("import the seed hash now")

STRESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(STRESS)
SRC = os.path.join(ROOT, "src")
RUN_PY = os.path.join(STRESS, "run.py")  # the entry point children run

# Sizes per mode.  --scale multiplies the count/byte entries (not the rounds
# or durations) so a sanitizer run can shrink everything by 10x.
SIZES = {
    "quick": dict(a_conns=10000, a_rounds=3, a_size=512,
                  b_clients=200, b_payload=2 << 20, b_send=256 << 10,
                  c_conns=16, c_idle=1.0, c_total=8 << 20,
                  d_limit=200, d_extra=100, d_rounds=3,
                  e_k=10000, e_trials=300,
                  f_duration=1.5, f_bytes=32 << 20,
                  g_conns=50, g_timers=2000,
                  h_clients=200, h_payload=256 << 10, h_upload=64 << 10,
                  i_threads=8, i_duration=4.0, i_burst=200, i_msg=16 << 10,
                  j_servers=4, j_churn=2, j_duration=4.0, j_warmup=4, j_rounds=20,
                  j_msg=16 << 10),
    "long": dict(a_conns=10000, a_rounds=100, a_size=4096,
                 b_clients=4000, b_payload=8 << 20, b_send=1 << 20,
                 c_conns=64, c_idle=15.0, c_total=32 << 20,
                 d_limit=2000, d_extra=1000, d_rounds=20,
                 e_k=300000, e_trials=3000,
                 f_duration=20.0, f_bytes=1 << 30,
                 g_conns=2000, g_timers=100000,
                 h_clients=2000, h_payload=256 << 10, h_upload=64 << 10,
                 i_threads=16, i_duration=60.0, i_burst=1000, i_msg=64 << 10,
                 j_servers=8, j_churn=2, j_duration=60.0, j_warmup=10, j_rounds=100,
                 j_msg=64 << 10),
}
# c_total stays: a smaller stream would fit in the kernel's socket buffers
# and never make the writer pause.
UNSCALED = {"a_rounds", "a_size", "b_payload", "b_send", "c_idle", "c_total",
            "d_rounds", "f_duration", "h_payload", "h_upload", "i_threads", "i_duration",
            "j_servers", "j_churn", "j_duration", "j_warmup"}
MIN_SIZE = {"a_conns": 50, "b_clients": 20, "c_conns": 2,
            "d_limit": 50, "d_extra": 20, "e_k": 500, "e_trials": 50,
            "f_bytes": 4 << 20, "g_conns": 5, "g_timers": 100,
            "h_clients": 20, "i_burst": 20, "i_msg": 1024, "j_rounds": 5, "j_msg": 1024}


def sizes(mode, scale):
    out = {}
    for k, v in SIZES[mode].items():
        if k in UNSCALED or scale == 1:
            out[k] = v
        else:
            out[k] = max(MIN_SIZE.get(k, 1), int(v * scale))
    return out


def make_loop(name):
    if name == "asyncio":
        return asyncio.SelectorEventLoop()
    if name == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    import tideloop
    return tideloop.new_event_loop()


def child_env():
    """Environment for children: the in-place build in src/ first on the
    path when there is one (as tests/conftest.py does), else the installed
    tideloop."""
    env = dict(os.environ)
    import glob
    if os.path.exists(os.path.join(SRC, "tideloop", "_core" + sysconfig.get_config_var("EXT_SUFFIX"))):
        env["PYTHONPATH"] = os.pathsep.join(
            [SRC] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("PYTHONASYNCIODEBUG", None)
    env.pop("PYTHONDEVMODE", None)
    return env


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_fds():
    return set(os.listdir("/proc/self/fd"))


def rss_now_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def rst_close(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# A seeded byte stream: offset o holds PATTERN[o % len].  The odd length
# makes a dropped, duplicated or reordered chunk show up as a mismatch.
PATTERN = random.Random(4).randbytes((1 << 20) + 7)
_PAT2 = PATTERN + PATTERN


def pattern_bytes(off, n):
    out = bytearray()
    while n > 0:
        o = off % len(PATTERN)
        k = min(n, len(PATTERN))
        out += _PAT2[o:o + k]
        off += k
        n -= k
    return bytes(out)


class StreamChecker:
    """Verifies that successive chunks continue the seeded stream."""

    def __init__(self):
        self.offset = 0
        self.bad = 0

    def feed(self, data):
        if data != pattern_bytes(self.offset, len(data)):
            self.bad += 1
        self.offset += len(data)


class Result:
    """The figures a child reports; ``errors`` must stay empty."""

    def __init__(self, scenario, loop_name):
        self.d = dict(scenario=scenario, loop=loop_name, conns=0, requests=0,
                      bytes_sent=0, bytes_verified=0, faults=0, errors=[], notes=[],
                      handler_calls=[], details={}, skipped=None)
        self.t0 = time.monotonic()

    def __getitem__(self, k):
        return self.d[k]

    def __setitem__(self, k, v):
        self.d[k] = v

    def err(self, msg):
        if len(self.d["errors"]) < 50:
            self.d["errors"].append(str(msg))
        else:
            self.d["details"]["errors_truncated"] = True

    def watch_handler(self, loop, allow=lambda ctx: False):
        """Record every exception-handler call; the ones ``allow`` does not
        accept are errors."""
        def handler(lp, ctx):
            exc = ctx.get("exception")
            desc = f"{ctx.get('message')}: {exc!r}"
            if len(self.d["handler_calls"]) < 200:
                self.d["handler_calls"].append(desc)
            if not allow(ctx):
                self.err("exception handler: " + desc)
        loop.set_exception_handler(handler)

    def finish(self, children_rss=0):
        self.d["wall"] = round(time.monotonic() - self.t0, 3)
        self.d["rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.d["child_rss_kb"] = children_rss or resource.getrusage(
            resource.RUSAGE_CHILDREN).ru_maxrss
        return self.d


async def read_line(loop, stream, timeout):
    """A line from a helper's pipe, read in a thread (loop-agnostic)."""
    line = await asyncio.wait_for(loop.run_in_executor(None, stream.readline), timeout)
    return line.strip()


def spawn_helper(name, loop_name, *args):
    return subprocess.Popen(
        [sys.executable, RUN_PY, "--helper", name,
         "--loop", loop_name, *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())


async def wait_until(pred, timeout, interval=0.01):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True


def _fd_desc(fd):
    try:
        return f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}"
    except OSError:
        return fd
