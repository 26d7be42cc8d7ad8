"""What bench/worker_spread.py runs under gunicorn: the applications, the
worker classes of the "before" side, and the gunicorn config that counts
requests per worker.

    gunicorn -c python:worker_spread_app worker_spread_app:app -k ...        (ASGI)
    gunicorn -c python:worker_spread_app worker_spread_app:make_app -k ...   (aiohttp)

Every request (but /ready) is counted in the worker that served it, and the
count (and how many connections they came on) is written to $SPREAD_DIR/<pid> as the worker stops: by gunicorn's
worker_exit hook (this module, read as the config) and, for uvicorn's
workers, which die of the SIGTERM they raise again, at the ASGI lifespan's
shutdown.  The answer is the worker's pid.
"""
import asyncio
import os
import socket
from urllib.parse import parse_qsl

COUNT = [0]
PEERS = set()       # the client ports seen: the connections this worker accepted


async def _wait(query):
    """?sleep=S: the handler waits S seconds (an I/O-bound request: a worker's
    requests then follow its connections, not its share of the CPUs)."""
    if "sleep" in query:
        await asyncio.sleep(float(query["sleep"]))


def _body(path, peer):
    if path != "/ready":        # the driver's readiness checks are not counted
        COUNT[0] += 1
        if peer:
            PEERS.add(peer[1])
    return b"%d" % os.getpid()


async def app(scope, receive, send):
    """A bare ASGI app (uvicorn's own cost dominates, not a framework's)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                # uvicorn's workers end by raising SIGTERM again (the
                # process dies of it): gunicorn's worker_exit never runs.
                write_count()
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = _body(scope["path"], scope.get("client"))
    await _wait(dict(parse_qsl(scope["query_string"].decode())))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def make_app():
    from aiohttp import web

    async def pid(request):
        await _wait(request.query)
        return web.Response(body=_body(request.path, request.transport.get_extra_info("peername")), content_type="text/plain")

    application = web.Application()
    application.router.add_get("/", pid)
    application.router.add_get("/ready", pid)
    return application


# -- gunicorn config (gunicorn -c python:worker_spread_app) ---------------------

def write_count():
    directory = os.environ.get("SPREAD_DIR")
    if directory:
        with open(os.path.join(directory, str(os.getpid())), "w") as f:
            f.write(f"{COUNT[0]} {len(PEERS)}")


def worker_exit(server, worker):
    write_count()


# -- worker classes of the "before" side ------------------------------------------

def _uvicorn_base():
    import uvicorn_worker
    return uvicorn_worker.UvicornWorker


try:
    _UvicornBase = _uvicorn_base()
except ImportError:         # pragma: no cover (the bench extra has it)
    _UvicornBase = None

if _UvicornBase is not None:
    class SharedUvicornWorker(_UvicornBase):
        """tideloop.workers.UvicornWorker as it was: tideloop's loop, the
        arbiter's socket shared by every worker."""
        CONFIG_KWARGS = {**_UvicornBase.CONFIG_KWARGS, "loop": "tideloop:new_event_loop"}

    class AsyncioUvicornWorker(_UvicornBase):
        """uvicorn-worker's UvicornWorker on asyncio's own loop (its "auto"
        takes uvloop where it is installed)."""
        CONFIG_KWARGS = {**_UvicornBase.CONFIG_KWARGS, "loop": "asyncio"}

    class StrayArbiterSocketWorker(SharedUvicornWorker):
        """The trap: each worker binds a SO_REUSEPORT socket of its own after
        fork (as gunicorn 24+'s reuse_port does), while the arbiter's socket
        (given SO_REUSEPORT so that they may bind) stays listening in the
        group, with nobody accepting on it."""

        def init_process(self):
            own = []
            for lnr in self.sockets:
                lnr.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                s = socket.socket(lnr.family, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                s.bind(lnr.getsockname())
                s.listen(2048)
                s.setblocking(False)
                own.append(s)
                lnr.close()         # this worker's copy; the arbiter keeps its own
            self.sockets = own
            super().init_process()


def _aiohttp_shared():
    from aiohttp import worker
    from gunicorn.workers import base

    import tideloop

    class SharedAiohttpWorker(worker.GunicornWebWorker):
        """tideloop.workers.AiohttpWorker as it was (the shared socket)."""

        def init_process(self):
            self.loop = tideloop.new_event_loop()
            asyncio.set_event_loop(self.loop)
            base.Worker.init_process(self)

    return SharedAiohttpWorker


def __getattr__(name):
    if name == "SharedAiohttpWorker":
        cls = _aiohttp_shared()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
