"""A small price service with two planted faults, to run as a user would,
with the diagnostics switched on from the environment:

    TIDELOOP_DIAGNOSTICS=stalls=0.1,slow=0.05,leaks=0.3 \\
        python -m tideloop run examples/price_service.py

- every fourth price lookup blocks the loop in ``time.sleep`` (a stall and
  a slow callback: reported once, naming the line of the sleep);
- every request starts an ``audit`` task that nobody awaits or keeps (a
  fire-and-forget task whose result is lost: a task leak, reported when
  the loop closes, with the line that created it).

Its long-lived tasks -- two workers, a ticker and the feeder, gathered by
``main`` for the life of the service -- are no leaks, and no report names
them.  ``--report`` also calls ``tideloop.diagnostics.report_task_leaks``
from a task of its own while the service runs (and prints the report as
JSON); ``--seconds N`` keeps it serving N seconds after the requests (for
``python -m tideloop top PID``); ``--requests N``: N requests, not 12.
"""
import asyncio
import json
import sys
import time

REQUESTS = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 12


def lookup_price(symbol):
    if symbol % 4 == 3:
        time.sleep(0.2)                         # planted: blocks the loop
    return 100 + symbol


async def audit(symbol):
    await asyncio.sleep(0)
    return symbol


async def fetch_price(symbol):
    asyncio.create_task(audit(symbol))          # planted: fire and forget
    await asyncio.sleep(0.01)
    return lookup_price(symbol)


async def worker(queue, results):
    while (symbol := await queue.get()) is not None:
        results.append(await asyncio.create_task(fetch_price(symbol)))


async def ticker(done):
    while not done.is_set():
        await asyncio.sleep(0.02)


async def feed(queue, results, done, workers, seconds, report):
    for symbol in range(REQUESTS):
        queue.put_nowait(symbol)
        await asyncio.sleep(0.03)
    while len(results) < REQUESTS:
        await asyncio.sleep(0.01)
    await asyncio.sleep(max(seconds, 0.4 if report else 0))
    if report:
        from tideloop import diagnostics
        found = diagnostics.report_task_leaks(pending_for=0.3)
        print(json.dumps({kind: [[g["coroutine"], g["count"], g["origin"] and g["origin"][1]]
                                 for g in found[kind]] for kind in ("pending", "unwaited")}))
    for _ in range(workers):
        queue.put_nowait(None)
    done.set()


async def main():
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 0
    queue, results, done = asyncio.Queue(), [], asyncio.Event()
    workers = [asyncio.create_task(worker(queue, results)) for _ in range(2)]
    await asyncio.gather(*workers, asyncio.create_task(ticker(done)),
                         asyncio.create_task(feed(queue, results, done, len(workers), seconds,
                                                  "--report" in sys.argv)))
    print("served", len(results))


if __name__ == "__main__":
    asyncio.run(main())
