"""The recipes of tideloop.threads (its docstring, the README), as programs:
N threads, one loop each, each serving the port on a SO_REUSEPORT socket of
its own, run by tideloop.threads.run() until SIGINT or SIGTERM.

    python threads_app.py asyncio|uvicorn|aiohttp tideloop|asyncio PORT [fail]

Every answer is JSON: the loop's class, the pid and the thread that served
it.  ``?sleep=S`` keeps a request in flight S seconds.  With ``fail``, thread
tideloop-1 fails once the other threads serve (the asyncio recipe: its main
raises; uvicorn: its app's lifespan startup raises; aiohttp: its
on_startup raises), which must stop the others and come out of run().
"""
import asyncio
import json
import sys
import threading
import time

import tideloop.threads

RECIPE, LOOP, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
FAIL = "fail" in sys.argv[4:]
HOST = "127.0.0.1"
THREADS = 3
SERVING = threading.Barrier(THREADS) if FAIL else None


def answer():
    cls = type(asyncio.get_running_loop())
    return {"loop": f"{cls.__module__}.{cls.__qualname__}", "pid": __import__("os").getpid(),
            "thread": threading.current_thread().name}


_OUT = threading.Lock()


def say(what):
    with _OUT:      # one write per line: the threads' lines do not mix
        sys.stdout.write(f"{threading.current_thread().name} {what}\n")
        sys.stdout.flush()


async def serving():
    """Called once a thread serves: with FAIL, tideloop-1 fails once the
    others do."""
    name = threading.current_thread().name
    if SERVING is None:
        return
    if name == "tideloop-1":
        await asyncio.get_running_loop().run_in_executor(None, SERVING.wait, 10)
        raise RuntimeError(f"{name} failed on purpose")
    await asyncio.get_running_loop().run_in_executor(None, SERVING.wait, 10)


async def in_flight(sleep):
    if sleep:
        say(f"in flight: {sleep}")
        await asyncio.sleep(sleep)


# -- asyncio.start_server ----------------------------------------------------------

async def handle(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    target = head.split(b" ", 2)[1].decode()
    sleep = float(target.split("sleep=")[1]) if "sleep=" in target else 0
    await in_flight(sleep)
    body = json.dumps(answer()).encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def asyncio_main():
    sock = tideloop.threads.reuse_port_socket(HOST, PORT)
    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        say("serving")
        if threading.current_thread().name == "tideloop-1":
            await serving()
        else:
            asyncio.ensure_future(serving())
        # not serve_forever(): cancelled, it closes the connections in flight
        # (close_clients(): 3.13.15, 3.14+; not 3.13.0); leaving `async with` waits for them
        await asyncio.Event().wait()


# -- uvicorn --------------------------------------------------------------------------

async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if threading.current_thread().name == "tideloop-1":
                        await serving()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
                if threading.current_thread().name != "tideloop-1":
                    asyncio.ensure_future(serving())
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
    sock = tideloop.threads.reuse_port_socket(HOST, PORT)
    server = uvicorn.Server(uvicorn.Config(asgi_app, lifespan="on"))   # a Config per thread
    serving_task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(serving_task)
    except asyncio.CancelledError:
        server.should_exit = True           # uvicorn's own graceful shutdown
        await serving_task


# -- aiohttp -----------------------------------------------------------------------------

def make_app():
    from aiohttp import web

    async def info(request):
        await in_flight(float(request.query.get("sleep", 0)))
        return web.json_response(answer())

    async def on_startup(app):
        if threading.current_thread().name == "tideloop-1":
            await serving()

    app = web.Application()
    app.router.add_get("/", info)
    app.on_startup.append(on_startup)
    return app


async def aiohttp_main():
    from aiohttp import web
    runner = web.AppRunner(make_app())      # an Application per thread
    await runner.setup()
    try:
        sock = tideloop.threads.reuse_port_socket(HOST, PORT)
        await web.SockSite(runner, sock).start()
        say("serving")
        if threading.current_thread().name != "tideloop-1":
            asyncio.ensure_future(serving())
        await asyncio.Event().wait()        # until run() cancels this thread's main
    finally:
        await runner.cleanup()              # aiohttp's graceful shutdown


MAINS = {"asyncio": asyncio_main, "uvicorn": uvicorn_main, "aiohttp": aiohttp_main}


async def main():
    try:
        return await MAINS[RECIPE]()
    finally:
        say("stopped")


if __name__ == "__main__":
    factory = asyncio.SelectorEventLoop if LOOP == "asyncio" else None
    started = time.monotonic()
    results = tideloop.threads.run(main, threads=THREADS, loop_factory=factory)
    print(f"run() returned {results} after {time.monotonic() - started:.1f} s", flush=True)
