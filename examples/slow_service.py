"""A slow service, diagnosed: the walk-through of README's "Diagnosing a slow
service", run for real.

An asyncio.start_server echo service whose handler hides a blocking call
(a synchronous "cache lookup" that sleeps 120 ms every 20th request) is
served on tideloop with TIDELOOP_DIAGNOSTICS-style settings made in code:
the stall watchdog at 50 ms, slow-callback reports at 30 ms and task
tracking with origins.  The handler also starts an "audit" task per request
that nobody awaits or keeps: a second planted fault, a fire-and-forget task
whose result (or exception) is lost.  A client sends 60 requests.  The
script prints what each tool shows (the log records, the stall's stack, the
slow step's task and await chain, the top tasks by CPU, the leak report,
the health summary) and exits 1 unless the tools found the planted faults:
the stall's stack ends on the blocking line, the slow step is the
handler's, the handler's task tops the CPU list, the audit tasks are in
the leak report with the line that created them, and ``python -m tideloop
top`` run on this process (which calls diagnostics.serve()) shows the
blocking function and the handler's task while the service keeps answering.

    PYTHONPATH=src python examples/slow_service.py
"""
import asyncio
import logging
import os
import sys
import time

import tideloop
from tideloop import diagnostics


def cache_lookup(key):
    if key % 20 == 19:
        time.sleep(0.12)            # the hidden blocking call
    return key


HANDLED = []


async def audit(key):
    await asyncio.sleep(0)
    return key


async def handle(reader, writer):
    while line := await reader.readline():
        key = int(line)
        asyncio.create_task(audit(key))     # fire and forget: nobody awaits it
        value = cache_lookup(key)
        writer.write(b"%d\n" % value)
        await writer.drain()
    writer.close()
    await writer.wait_closed()
    HANDLED.append(True)


async def main():
    loop = asyncio.get_running_loop()
    diagnostics.watch_stalls(0.05)
    diagnostics.report_slow_callbacks(0.03)
    diagnostics.track_tasks(origins=True)
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
    before = diagnostics.snapshot()
    for i in range(60):
        writer.write(b"%d\n" % i)
        assert int(await reader.readline()) == i
    after = diagnostics.snapshot()
    # What the tools saw over the 60 requests (starting the viewer below is
    # a blocking fork and exec, itself a stall on a loaded machine).
    seen = diagnostics.stalls(), diagnostics.slow_callbacks()
    print("\n== top_tasks(3), the connection still open")
    top = diagnostics.top_tasks(3)
    # The live view, from another process, while the service keeps
    # answering (keys that do not block: the stalls above stay the last).
    diagnostics.serve()
    viewer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tideloop", "top", str(os.getpid()), "--once",
        stdout=asyncio.subprocess.PIPE)
    looking = asyncio.create_task(viewer.communicate())
    requests = 60
    while not looking.done():
        writer.write(b"0\n")
        assert int(await reader.readline()) == 0
        requests += 1
        await asyncio.sleep(0.005)
    view = looking.result()[0].decode()
    writer.close()
    await writer.wait_closed()
    while not HANDLED:              # the handler sees the end and returns
        await asyncio.sleep(0.01)
    server.close()
    await server.wait_closed()
    for t in top:
        print("%-8s %-8s %-10s cpu %.3f s in %d steps, age %.3f s" % (
            t["task"], t["coroutine"], t["state"], t["cpu"], t["steps"], t["age"]))
    print("\n== python -m tideloop top PID --once (exit status %d)" % viewer.returncode)
    print(view.rstrip())
    print("\n== report_task_leaks(pending_for=60)")
    leaks = diagnostics.report_task_leaks(pending_for=60)
    live = viewer.returncode == 0 and "cache_lookup" in view and "handle" in view
    return loop, diagnostics.diff(before, after), top, leaks, (live, requests), seen


def fmt(summary):
    return ", ".join("%s %.3g ms" % (k, v * 1e3) for k, v in summary.items() if k != "count")


AUDIT_LINE = handle.__code__.co_firstlineno + 3


if __name__ == "__main__":
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    loop = tideloop.new_event_loop()
    try:
        loop, health, top, leaks, (live, requests), (stalls, slow) = \
            loop.run_until_complete(main())
    finally:
        loop.close()
    print("\n== health over the 60 requests (tideloop.diagnostics.diff + summary)")
    print("iterations %d, callbacks %d, io_events %d, time running %.3f s, polling %.3f s"
          % (health["iterations"], health["callbacks"], health["io_events"],
             health["time_running"], health["time_polling"]))
    for name in ("iteration", "scheduling_lag", "callback"):
        s = diagnostics.summary(health["histograms"][name])
        print("%-15s count %d: %s" % (name, s["count"], fmt(s)))
    print("\n== stalls() over the 60 requests: %d" % len(stalls))
    print("\n== slow_callbacks() over the 60 requests: %d" % len(slow))
    line = "time.sleep(0.12)            # the hidden blocking call"
    ok = (len(stalls) == 3 and all(r["stack"] and r["stack"][-1][3] == line and
                                   r["stack"][-2][2] == "handle" for r in stalls)
          and len(slow) == 3 and all(r.get("coroutine") == "handle" and
                                     r["started"][0] == "handle" for r in slow)
          and top[0]["coroutine"] == "handle" and top[0]["cpu"] >= 0.36
          and [(g["coroutine"], g["count"], g["origin"][1]) for g in leaks["unwaited"]]
          == [("audit", requests, AUDIT_LINE)] and leaks["pending"] == [] and live)
    print("verdict:", "OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)
