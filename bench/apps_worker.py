#!/usr/bin/env python3
"""The Python side of the app benchmark (bench/apps.py): one row, one loop,
one process.

    python -m bench.apps_worker --loop asyncio|uvloop|tideloop --kind KIND [options]

Servers (print "READY <port>", serve until SIGTERM; the driver loads them with
wrk and reads this process's CPU from /proc):

* aiohttp    -- bench/apps_app.py's aiohttp application under
                ``aiohttp.web.run_app(app, sock=..., loop=<a new loop>)``,
                access log off.
* uvicorn    -- its Starlette application under uvicorn:
                ``uvicorn.Config(app, loop=L, http="auto", access_log=False)``
                with L = "asyncio", "uvloop" or "tideloop:new_event_loop"
                (uvicorn makes the loop from that name: its own code path for a
                loop factory), lifespan off.

Clients (run a warm-up of a tenth of --count, then --count operations, and
print one JSON line: ops, wall_s, cpu_s (this process: utime+stime of all its
threads, resource.getrusage(RUSAGE_SELF)), utime_s, stime_s; the services'
own CPU is not counted):

* asyncpg-query   -- asyncpg pool of 10 connections, --concurrency tasks
                     sharing --count ``pool.fetchval("SELECT $1::int", i)``;
                     one op = one query.
* asyncpg-copy    -- ``pool.copy_records_to_table`` of --count rows (int, text,
                     float8) into an UNLOGGED table, --rounds times; one op =
                     one row.
* asyncpg-fetch   -- ``pool.fetch("SELECT ... FROM <table>")`` of --count
                     rows (made with generate_series first), --rounds times;
                     one op = one row.
* redis           -- redis.asyncio.Redis, --concurrency tasks sharing --count
                     commands, alternately SET and GET, each awaited (no
                     pipelining); one op = one command.
* redis-pipeline  -- the same commands in pipelines (transaction=False) of
                     --batch, --concurrency pipelines at a time; one op = one
                     command.
* websockets      -- a websockets (``websockets.asyncio``) echo server and
                     --concurrency client connections in this process, on one
                     loop; each client sends a 64-byte text message and awaits
                     its echo, --count messages in all, compression off; one op
                     = one message there and back (both ends' CPU counted).

With --window, a client prints "WINDOW" before the measured operations and
"END" after them and each time waits for a line on stdin (bench/apps_callgrind.py
switches callgrind's instrumentation on and dumps there).

The loop is chosen with asyncio.Runner(loop_factory=...) (aiohttp: run_app's
loop=, uvicorn: its loop= option).  A failure exits with status 1 and
"apps_worker: ERROR: <reason>" on stderr.
"""

import argparse
import asyncio
import json
import os
import resource
import socket
import sys
import time

from tideloop._bench import harness

SERVER_KINDS = ("aiohttp", "uvicorn")
CLIENT_KINDS = ("asyncpg-query", "asyncpg-copy", "asyncpg-fetch", "redis",
                "redis-pipeline", "websockets")
KINDS = SERVER_KINDS + CLIENT_KINDS
UVICORN_LOOP = {"asyncio": "asyncio", "uvloop": "uvloop", "tideloop": "tideloop:new_event_loop"}
POOL_SIZE = 10
WS_MESSAGE = "x" * 64


def listening_socket(host, port):
    # proto IPPROTO_TCP, as loop.create_server's sockets have it (asyncio sets
    # TCP_NODELAY only on sockets whose proto says TCP)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock


# -- servers --------------------------------------------------------------------

def serve_aiohttp(args):
    from aiohttp import web
    from bench import apps_app

    sock = listening_socket(args.host, args.port)
    port = sock.getsockname()[1]
    loop = harness.loop_factory(args.loop)()
    asyncio.set_event_loop(loop)
    web.run_app(apps_app.aiohttp_app(), sock=sock, loop=loop, access_log=None,
                shutdown_timeout=1.0,
                print=lambda *_: print(f"READY {port}", flush=True))


def serve_uvicorn(args):
    import uvicorn
    from bench import apps_app

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            port = self.servers[0].sockets[0].getsockname()[1]
            print(f"READY {port}", flush=True)

    # uvicorn binds the port itself, as uvicorn.run(app, host=..., port=...) does.
    config = uvicorn.Config(apps_app.asgi_app, host=args.host, port=args.port,
                            loop=UVICORN_LOOP[args.loop], http="auto", lifespan="off",
                            access_log=False, log_level="warning",
                            timeout_graceful_shutdown=1)
    Server(config).run()


# -- clients ----------------------------------------------------------------------

class Window:
    """Marks the measured operations (--window) and measures them."""

    def __init__(self, enabled):
        self.enabled = enabled

    def _mark(self, word):
        if self.enabled:
            print(word, flush=True)
            sys.stdin.readline()        # blocks the loop: nothing else is running

    def __enter__(self):
        self._mark("WINDOW")
        self.ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.utime = ru.ru_utime - self.ru0.ru_utime
        self.stime = ru.ru_stime - self.ru0.ru_stime
        if exc[0] is None:
            self._mark("END")

    def result(self, ops, **extra):
        return {"ops": ops, "wall_s": round(self.wall, 6),
                "cpu_s": round(self.utime + self.stime, 6),
                "utime_s": round(self.utime, 6), "stime_s": round(self.stime, 6), **extra}


def split(total, parts):
    """``total`` as ``parts`` near-equal non-negative integers."""
    q, r = divmod(total, parts)
    return [q + (i < r) for i in range(parts)]


async def asyncpg_client(args):
    import asyncpg

    table = f"tideloop_apps_{os.getpid()}"
    pool = await asyncpg.create_pool(args.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE)
    try:
        async def queries(n):
            async def task(k):
                for i in range(k):
                    if await pool.fetchval("SELECT $1::int", i) != i:
                        raise AssertionError("wrong answer to SELECT $1::int")
            await asyncio.gather(*(task(k) for k in split(n, args.concurrency)))

        if args.kind == "asyncpg-query":
            await queries(max(args.count // 10, args.concurrency))
            with Window(args.window) as w:
                await queries(args.count)
            return w.result(args.count)

        if args.kind == "asyncpg-copy":
            await pool.execute(f"CREATE UNLOGGED TABLE {table} "
                               f"(id int, name text, value float8)")
            records = [(i, f"name-{i}", i * 0.5) for i in range(args.count)]
            await pool.copy_records_to_table(table, records=records[:args.count // 10])
            await pool.execute(f"TRUNCATE {table}")
            with Window(args.window) as w:
                for _ in range(args.rounds):
                    await pool.copy_records_to_table(table, records=records)
            n = await pool.fetchval(f"SELECT count(*) FROM {table}")
            if n != args.count * args.rounds:
                raise AssertionError(f"COPY stored {n} rows, not {args.count * args.rounds}")
            return w.result(args.count * args.rounds)

        # asyncpg-fetch
        await pool.execute(f"CREATE UNLOGGED TABLE {table} AS SELECT i AS id, "
                           f"'name-' || i AS name, i * 0.5 AS value "
                           f"FROM generate_series(1, {args.count}) AS i")
        query = f"SELECT id, name, value FROM {table}"
        await pool.fetch(query + f" LIMIT {max(args.count // 10, 1)}")
        with Window(args.window) as w:
            for _ in range(args.rounds):
                rows = await pool.fetch(query)
                if len(rows) != args.count:
                    raise AssertionError(f"fetched {len(rows)} rows, not {args.count}")
                del rows
        return w.result(args.count * args.rounds)
    finally:
        try:
            await pool.execute(f"DROP TABLE IF EXISTS {table}")
        finally:
            await pool.close()


async def redis_client(args):
    import redis.asyncio as aioredis

    client = aioredis.Redis(host=args.host, port=args.port,
                            max_connections=args.concurrency + 1)
    value = b"v" * 32
    prefix = f"tideloop:{os.getpid()}:"
    try:
        if args.kind == "redis":
            async def run(n):
                async def task(t, k):
                    key = f"{prefix}{t}"
                    for i in range(k // 2):
                        await client.set(key, value)
                        if await client.get(key) != value:
                            raise AssertionError("GET did not return what SET stored")
                    if k % 2:
                        await client.set(key, value)
                await asyncio.gather(*(task(t, k) for t, k in
                                       enumerate(split(n, args.concurrency))))
        else:
            async def run(n):
                batches = split(n, max(1, -(-n // args.batch)))
                queue = iter(enumerate(batches))

                async def task():
                    for b, size in queue:
                        pipe = client.pipeline(transaction=False)
                        key = f"{prefix}{b % 100}"
                        for i in range(size):
                            (pipe.set(key, value) if i % 2 == 0 else pipe.get(key))
                        results = await pipe.execute()
                        if len(results) != size:
                            raise AssertionError("a pipeline lost replies")
                await asyncio.gather(*(task() for _ in range(args.concurrency)))

        await run(max(args.count // 10, args.concurrency * 2))
        with Window(args.window) as w:
            await run(args.count)
        return w.result(args.count)
    finally:
        await client.aclose()


async def websockets_client(args):
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async with serve(echo, args.host, 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        url = f"ws://{args.host}:{port}/"
        conns = [await connect(url, compression=None) for _ in range(args.concurrency)]

        async def run(n):
            async def task(ws, k):
                for _ in range(k):
                    await ws.send(WS_MESSAGE)
                    if await ws.recv() != WS_MESSAGE:
                        raise AssertionError("the echo differs")
            await asyncio.gather(*(task(ws, k) for ws, k in
                                   zip(conns, split(n, args.concurrency))))

        try:
            await run(max(args.count // 10, args.concurrency))
            with Window(args.window) as w:
                await run(args.count)
        finally:
            for ws in conns:
                await ws.close()
    return w.result(args.count)


CLIENTS = {"asyncpg": asyncpg_client, "redis": redis_client, "websockets": websockets_client}


def run_client(args):
    main = CLIENTS[args.kind.split("-")[0]]
    result = harness.run_on_loop(args.loop, main, args)
    print(json.dumps(result), flush=True)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loop", choices=harness.ALL_LOOPS, required=True)
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0,
                   help="servers: the port to listen on (0: a free one); redis: the "
                        "server's port")
    p.add_argument("--dsn", default=None, help="asyncpg: the PostgreSQL DSN")
    p.add_argument("--count", type=int, default=1000, help="clients: operations measured")
    p.add_argument("--concurrency", type=int, default=50,
                   help="clients: tasks (websockets: connections) at a time")
    p.add_argument("--rounds", type=int, default=1,
                   help="asyncpg-copy, asyncpg-fetch: how many times the --count-row "
                        "COPY / fetch is measured (ops = rows in all)")
    p.add_argument("--batch", type=int, default=100, help="redis-pipeline: commands "
                   "per pipeline")
    p.add_argument("--window", action="store_true",
                   help="clients: print WINDOW/END around the measured part and wait "
                        "for a line on stdin at each")
    return p


def main():
    args = build_parser().parse_args()
    if args.kind == "aiohttp":
        serve_aiohttp(args)
    elif args.kind == "uvicorn":
        serve_uvicorn(args)
    else:
        run_client(args)


if __name__ == "__main__":
    harness.worker_main("apps_worker", main)
