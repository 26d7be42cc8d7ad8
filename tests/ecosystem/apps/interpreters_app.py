"""The recipes of tideloop.interpreters (docs/usage.md), as programs: N
isolated interpreters, one loop each, each serving the port on a
SO_REUSEPORT socket of its own, run by tideloop.interpreters.run() until
SIGINT or SIGTERM.

    python interpreters_app.py asyncio|uvicorn|aiohttp tideloop|asyncio PORT [fail]

The same program in every interpreter: this file is run there under another
name (run()'s __main__ functions), with this process's argv.  Every answer
is JSON: the loop's class, the pid and the interpreter that served it
(``interpreter-<index>``).  ``?sleep=S`` keeps a request in flight S seconds.
With ``fail``, interpreter 1 fails once it serves (asyncio: its main raises;
uvicorn: its app's lifespan startup raises; aiohttp: its on_startup raises),
which must stop the others and come out of run().
"""
import asyncio
import json
import os
import sys
import time

import tideloop.interpreters

RECIPE, LOOP, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
FAIL = "fail" in sys.argv[4:]
HOST = "127.0.0.1"
INTERPRETERS = 3
FACTORIES = {"tideloop": "tideloop:new_event_loop", "asyncio": "asyncio:SelectorEventLoop"}


def name():
    return f"interpreter-{tideloop.interpreters.index()}"


def answer():
    cls = type(asyncio.get_running_loop())
    return {"loop": f"{cls.__module__}.{cls.__qualname__}", "pid": os.getpid(),
            "thread": name()}


def say(what):
    # print() of each interpreter writes to the same fd: one write a line.
    os.write(1, f"{name()} {what}\n".encode())


async def serving():
    """Called once an interpreter serves: with FAIL, interpreter 1 fails."""
    if FAIL and tideloop.interpreters.index() == 1:
        await asyncio.sleep(0.5)
        raise RuntimeError(f"{name()} failed on purpose")


async def in_flight(sleep):
    if sleep:
        say(f"in flight: {sleep}")
        await asyncio.sleep(sleep)


# -- asyncio.start_server ----------------------------------------------------------

async def handle(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    target = head.split(b" ", 2)[1].decode()
    await in_flight(float(target.split("sleep=")[1]) if "sleep=" in target else 0)
    body = json.dumps(answer()).encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def asyncio_main():
    sock = tideloop.interpreters.reuse_port_socket(HOST, PORT)
    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        say("serving")
        await serving()
        await asyncio.Event().wait()        # until run() cancels it


# -- uvicorn (its h11 protocol: httptools does not load in isolated interpreters) ---

async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await serving()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    qs = scope["query_string"].decode()
    await in_flight(float(qs.split("sleep=")[1]) if "sleep=" in qs else 0)
    body = json.dumps(answer()).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def uvicorn_main():
    import uvicorn
    sock = tideloop.interpreters.reuse_port_socket(HOST, PORT)
    server = uvicorn.Server(uvicorn.Config(asgi_app, http="h11", lifespan="on"))
    serving_task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(serving_task)
    except asyncio.CancelledError:
        server.should_exit = True           # uvicorn's own graceful shutdown
        await serving_task


# -- aiohttp (its pure-Python parsers: the C ones refuse isolated interpreters) --------

def make_app():
    from aiohttp import web

    async def info(request):
        await in_flight(float(request.query.get("sleep", 0)))
        return web.json_response(answer())

    async def on_startup(app):
        await serving()

    app = web.Application()
    app.router.add_get("/", info)
    app.on_startup.append(on_startup)
    return app


async def aiohttp_main():
    from aiohttp import web
    runner = web.AppRunner(make_app())
    await runner.setup()
    try:
        sock = tideloop.interpreters.reuse_port_socket(HOST, PORT)
        await web.SockSite(runner, sock).start()
        say("serving")
        await asyncio.Event().wait()        # until run() cancels it
    finally:
        await runner.cleanup()              # aiohttp's graceful shutdown


MAINS = {"asyncio": asyncio_main, "uvicorn": uvicorn_main, "aiohttp": aiohttp_main}


async def main():
    try:
        return await MAINS[RECIPE]()
    finally:
        say("stopped")


if __name__ == "__main__":
    started = time.monotonic()
    results = tideloop.interpreters.run(main, interpreters=INTERPRETERS,
                                        loop_factory=FACTORIES[LOOP])
    print(f"run() returned {results} after {time.monotonic() - started:.1f} s", flush=True)
