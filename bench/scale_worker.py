"""One in-process scale measurement on one loop (bench.scale runs it in a
fresh process per sample):

    python -m bench.scale_worker --loop tideloop --what timers --n 100000

* timers -- N call_later() handles pending (delays 1-2 hours, in random
            order): ns per call_later, bytes of RSS per pending timer, ns
            per cancel(); then N timers due within 50 ms run to the last:
            ns per timer fired (the heap's pops)
* tasks  -- N tasks each awaiting asyncio.sleep(3600), all started: ns per
            task created and run to its sleep, bytes of RSS per sleeping
            task, ns per task cancelled and finished

The lists that hold the handles and tasks are made before the first RSS
reading, so their 8 bytes a slot are not in the figure.  The cyclic GC is
off while timing (as in python -m tideloop bench).  Prints one JSON line.
"""

import argparse
import asyncio
import gc
import json
import random
import time

from tideloop._bench import harness

WHATS = ("timers", "tasks")
PAGE = 4096


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def noop():
    pass


async def timers(n):
    loop = asyncio.get_running_loop()
    delays = [3600 + random.random() * 3600 for _ in range(n)]
    handles = [None] * n
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter_ns()
    for i in range(n):
        handles[i] = loop.call_later(delays[i], noop)
    t1 = time.perf_counter_ns()
    rss1 = rss_bytes()
    for h in handles:
        h.cancel()
    t2 = time.perf_counter_ns()
    await asyncio.sleep(0)
    handles = [None] * n
    del handles
    # N timers due within 50 ms: what firing them costs, heap pops included
    done = loop.create_future()
    left = [n]

    def fire():
        left[0] -= 1
        if not left[0]:
            done.set_result(None)

    soon = [random.random() * 0.05 for _ in range(n)]
    for d in soon:
        loop.call_later(d, fire)
    # the loop blocked until every one is due: the next iteration pops them
    # all from the heap and runs them, which is what t4 - t3 is
    time.sleep(0.06)
    t3 = time.perf_counter_ns()
    await done
    t4 = time.perf_counter_ns()
    return {"ns_per_call_later": (t1 - t0) / n, "rss_per_timer": (rss1 - rss0) / n,
            "ns_per_cancel": (t2 - t1) / n, "ns_per_fired": (t4 - t3) / n}


async def sleeper():
    await asyncio.sleep(3600)


async def tasks(n):
    loop = asyncio.get_running_loop()
    made = [None] * n
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter_ns()
    for i in range(n):
        made[i] = loop.create_task(sleeper())
    await asyncio.sleep(0)              # every task's first step runs before this returns
    t1 = time.perf_counter_ns()
    rss1 = rss_bytes()
    started = sum(1 for t in made if not t.done())
    for t in made:
        t.cancel()
    await asyncio.gather(*made, return_exceptions=True)
    t2 = time.perf_counter_ns()
    cancelled = sum(1 for t in made if t.cancelled())
    if started != n or cancelled != n:
        raise RuntimeError(f"{started} of {n} tasks sleeping, {cancelled} cancelled")
    return {"ns_per_task": (t1 - t0) / n, "rss_per_task": (rss1 - rss0) / n,
            "ns_per_task_cancel": (t2 - t1) / n}


async def main(args):
    gc.disable()
    return await (timers if args.what == "timers" else tasks)(args.n)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loop", required=True)
    p.add_argument("--what", choices=WHATS, required=True)
    p.add_argument("--n", type=int, required=True)
    args = p.parse_args()

    def body():
        random.seed(args.n)
        print(json.dumps(harness.run_on_loop(args.loop, main, args)), flush=True)

    harness.worker_main("scale_worker", body)
