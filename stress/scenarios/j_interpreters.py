"""Stress scenario j: loops in isolated interpreters (own GIL; 3.13+), many
at once, for a bounded time:

- ``j_servers`` long-lived interpreters, each running a loop of the kind
  under test that serves TCP echo (a Protocol, its own port) and Unix echo
  (streams, its own path) until told to stop through a pipe;
- churn threads of the main interpreter that, the whole time, create an
  isolated interpreter, run in it a loop that talks to every server
  interpreter over TCP and Unix (seeded payloads, every byte checked),
  create and close a few more loops there (one with a timer and a
  call_soon_threadsafe round trip, one never run), then destroy the
  interpreter -- interpreters created and destroyed while the others serve;
- the main interpreter's own loop of the same kind echoing to the servers
  too (loops of three interpreters at once);
- after a warm-up slice of churn, RSS and the number of open fds are
  sampled; at the end they must be flat: a leak per interpreter created
  (an interpreter is several MiB) shows, as does an fd left open.

Each interpreter reports to the main one through a small JSON file (objects
never cross): bytes verified, errors.  Skipped before 3.13 (3.12's asyncio
aborts the process at exit once imported in an isolated interpreter).

Run it alone: python stress/run.py --quick --only j --loop tideloop
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import time

from .common import SRC, open_fds, rss_now_kb

# RSS may still grow by allocator noise after the warm-up (arenas of the
# interpreters made and freed); a leaked interpreter is >= 2 MiB each, and
# a quick run destroys dozens after the sample.  Judged on 3.14+ (3.13
# keeps much of each destroyed interpreter's memory: see below); our own
# leaks are judged under valgrind on every version (tools/interpreters_check.sh).
RSS_GROWTH_LIMIT_KB = 24 * 1024

_PRE = """\
import sys, json, os
sys.path[:0] = {path!r}
import asyncio, random, socket
LOOP = {loop!r}
def make_loop():
    if LOOP == "asyncio":
        return asyncio.SelectorEventLoop()
    if LOOP == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    import tideloop
    return tideloop.new_event_loop()
if {sabotage!r}:
    # --sabotage: flip a bit in every 50th write of the stock loop's sockets.
    from asyncio import selector_events as se
    _write, _count = se._SelectorSocketTransport.write, [0]
    def _flipping_write(self, data):
        _count[0] += 1
        if _count[0] % 50 == 0 and data:
            data = bytes(data[:-1]) + bytes([data[-1] ^ 1])
        return _write(self, data)
    se._SelectorSocketTransport.write = _flipping_write
def report(path, **kw):
    with open(path + ".tmp", "w") as f:
        json.dump(kw, f)
    os.replace(path + ".tmp", path)
"""

_SERVER = """
class Echo(asyncio.Protocol):
    def connection_made(self, tr):
        self.tr = tr
    def data_received(self, data):
        self.tr.write(data)

async def unix_echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()

async def main():
    loop = asyncio.get_running_loop()
    tcp = await loop.create_server(Echo, "127.0.0.1", 0)
    unix = await asyncio.start_unix_server(unix_echo, {unix!r})
    report({ready!r}, port=tcp.sockets[0].getsockname()[1])
    stop = loop.create_future()
    loop.add_reader({control!r}, lambda: stop.done() or stop.set_result(None))
    await stop
    loop.remove_reader({control!r})
    tcp.close(); unix.close()
    await tcp.wait_closed(); await unix.wait_closed()

loop = make_loop()
try:
    loop.run_until_complete(main())
finally:
    loop.close()
"""

_CLIENT = """
errors, verified = [], 0
rng = random.Random({seed!r})

async def talk(reader, writer):
    global verified
    for _ in range({rounds!r}):
        payload = rng.randbytes(rng.randrange(1, {msg!r}))
        writer.write(payload)
        got = await asyncio.wait_for(reader.readexactly(len(payload)), 20)
        if got != payload:
            errors.append("echo mismatch")
        verified += len(got)
    writer.close()
    await writer.wait_closed()

async def main():
    for port in {ports!r}:
        await talk(*await asyncio.open_connection("127.0.0.1", port))
    for path in {paths!r}:
        await talk(*await asyncio.open_unix_connection(path))

def side_loops():
    # Loops made and closed inside this interpreter: one with a timer and a
    # call_soon_threadsafe round trip from a thread, one never run.
    import threading
    side = make_loop()
    fired = []
    side.call_later(0.001, fired.append, 1)
    t = threading.Thread(target=lambda: side.call_soon_threadsafe(fired.append, 2))
    t.start()
    side.run_until_complete(asyncio.sleep(0.01))
    t.join()
    side.run_until_complete(asyncio.sleep(0))
    side.close()
    if sorted(fired) != [1, 2]:
        errors.append("side loop ran %r" % (fired,))
    make_loop().close()

loop = make_loop()
try:
    loop.run_until_complete(main())
except BaseException as exc:
    errors.append(repr(exc))
finally:
    loop.close()
try:
    side_loops()
except BaseException as exc:
    errors.append(repr(exc))
report({out!r}, verified=verified, errors=errors)
"""


def _api():
    sys.path.insert(0, SRC)
    from tideloop import _compat
    return _compat.SUBINTERPRETERS


def _in_thread(api, interp, code, failures):
    failure = api.run(interp, code)
    if failure:
        failures.append(failure[-1500:])


def _wait_file(path, timeout, failures):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if failures or time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    with open(path) as f:
        return json.load(f)


def scenario_j(loop_name, res, sz, sabotage=False):
    if sys.version_info < (3, 13):
        res["skipped"] = ("isolated interpreters where asyncio runs: 3.13+ (3.12's abort "
                          "at exit once asyncio is imported in one)")
        return
    if loop_name == "uvloop":
        res["skipped"] = "uvloop does not load in isolated interpreters"
        return
    if os.environ.get("TIDELOOP_SANITIZE_RUN") == "1":
        # Under ASan or valgrind an interpreter takes seconds to make: fewer
        # of them, more time (the leak verdict is valgrind's there).
        # TIDELOOP_SANITIZE_SECONDS: how long (tools/interpreters_check.sh).
        seconds = float(os.environ.get("TIDELOOP_SANITIZE_SECONDS", "30"))
        sz = dict(sz, j_churn=1, j_warmup=1, j_duration=max(sz["j_duration"], seconds))
    api = _api()
    work = tempfile.mkdtemp(prefix="tideloop-stress-j-")
    path = [SRC] + sys.path
    pre = lambda: _PRE.format(path=path, loop=loop_name, sabotage=sabotage)      # noqa: E731
    fds_before = open_fds()
    failures = []
    servers = []
    for k in range(sz["j_servers"]):
        r, w = os.pipe()
        ready = os.path.join(work, "server%d.json" % k)
        unix = os.path.join(work, "s%d.sock" % k)
        interp = api.create()
        code = pre() + _SERVER.format(unix=unix, ready=ready, control=r)
        t = threading.Thread(target=_in_thread, args=(api, interp, code, failures))
        t.start()
        servers.append(dict(interp=interp, thread=t, r=r, w=w, ready=ready, unix=unix))
    ports = []
    for s in servers:
        info = _wait_file(s["ready"], 30, failures)
        if info is None:
            res.err("a server interpreter did not start: %s" % (failures[:1],))
            break
        ports.append(info["port"])
    paths = [s["unix"] for s in servers]

    counts = dict(created=0, verified=0)
    lock = threading.Lock()
    deadline = time.monotonic() + sz["j_duration"]
    samples = {}

    def churn(n):
        i = 0
        while time.monotonic() < deadline and not failures:
            out = os.path.join(work, "client-%d-%d.json" % (n, i))
            code = pre() + _CLIENT.format(seed=n * 100000 + i, rounds=sz["j_rounds"], msg=sz["j_msg"],
                                          ports=ports, paths=paths, out=out)
            interp = api.create()
            try:
                _in_thread(api, interp, code, failures)
            finally:
                api.destroy(interp)
            with open(out) as f:
                got = json.load(f)
            os.unlink(out)
            with lock:
                counts["created"] += 1
                counts["verified"] += got["verified"]
                for e in got["errors"]:
                    res.err("client interpreter: " + e)
            i += 1

    async def main_loop_clients(loop):
        # The main interpreter's loop talks to the servers as well.
        verified = 0
        while time.monotonic() < deadline and not failures:
            for port in ports:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                payload = os.urandom(4096)
                writer.write(payload)
                if await reader.readexactly(len(payload)) != payload:
                    res.err("main loop: echo mismatch")
                verified += len(payload)
                writer.close()
                await writer.wait_closed()
            if "rss" not in samples and counts["created"] >= sz["j_warmup"]:
                samples["rss"], samples["fds"] = rss_now_kb(), len(open_fds())
                samples["created"] = counts["created"]
            await asyncio.sleep(0.01)
        return verified

    churners = [threading.Thread(target=churn, args=(n,)) for n in range(sz["j_churn"])]
    for t in churners:
        t.start()
    from .common import make_loop
    loop = make_loop(loop_name)
    try:
        main_verified = loop.run_until_complete(main_loop_clients(loop)) if ports else 0
    finally:
        loop.close()
    for t in churners:
        t.join()
    rss_end, fds_end = rss_now_kb(), len(open_fds())
    for s in servers:
        os.write(s["w"], b"x")
    for s in servers:
        s["thread"].join(30)
        if s["thread"].is_alive():
            res.err("a server interpreter did not stop")
            continue
        api.destroy(s["interp"])
        os.close(s["r"])
        os.close(s["w"])
    for f in failures:
        res.err("interpreter failed: " + f)
    res["conns"] = counts["created"] * len(ports) * 2
    res["bytes_verified"] = res["bytes_sent"] = counts["verified"] + main_verified
    res["requests"] = counts["created"]
    res["details"].update(interpreters_created=counts["created"] + len(servers),
                          servers=len(servers), samples=samples, rss_end_kb=rss_end,
                          fds_end=fds_end)
    if counts["created"] < sz["j_warmup"] + sz["j_churn"]:
        res.err("only %d interpreters made in %.1f s" % (counts["created"], sz["j_duration"]))
    elif "rss" in samples:
        grown = rss_end - samples["rss"]
        res["details"]["rss_growth_kb"] = grown
        if sys.version_info < (3, 14):
            # 3.13 keeps most of what a destroyed interpreter allocated
            # (1.7 MiB for an empty one, ~6 MiB once asyncio is imported,
            # on the stock loop alike): its RSS says nothing about ours.
            res["notes"].append("RSS grew by %d KiB over %d interpreters (3.13 keeps a "
                                "destroyed interpreter's memory; not judged)"
                                % (grown, counts["created"] - samples["created"]))
        elif grown > RSS_GROWTH_LIMIT_KB:
            res.err("RSS grew by %d KiB over %d interpreters after the warm-up"
                    % (grown, counts["created"] - samples["created"]))
        if fds_end > samples["fds"]:
            res.err("%d more fds open than after the warm-up" % (fds_end - samples["fds"]))
    left = open_fds() - fds_before
    if left:
        res.err("fds left open: %s" % sorted(left))
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)
