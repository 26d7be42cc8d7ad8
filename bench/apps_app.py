"""The web applications of the app benchmark (bench/apps.py), and the
gunicorn worker classes it compares.

Two endpoints, the same on both frameworks (TechEmpower's plain-text and
JSON tests):

    GET /text  ->  "Hello, World!"                 text/plain
    GET /json  ->  {"message": "Hello, World!"}    application/json

* ``asgi_app``          -- a Starlette application (served by uvicorn);
* ``make_aiohttp_app``  -- an aiohttp.web application factory (run_app and
                           aiohttp's gunicorn workers accept it);
* ``AsyncioUvicornWorker`` / ``UvloopUvicornWorker`` -- uvicorn-worker's
  gunicorn worker (``uvicorn_worker.UvicornWorker``) with uvicorn's ``loop=``
  set to ``asyncio`` / ``uvloop`` (its own default, ``auto``, means uvloop when
  it is installed); tideloop's is ``tideloop.workers.UvicornWorker``.  All
  three keep uvicorn's ``http="auto"``: httptools when it is installed.

Every name is made on first lookup, so that a row needs only its own
framework installed.
"""

TEXT = "Hello, World!"
MESSAGE = {"message": TEXT}


def _starlette_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    async def text(request):
        return PlainTextResponse(TEXT)

    async def json_(request):
        return JSONResponse(MESSAGE)

    return Starlette(routes=[Route("/text", text), Route("/json", json_)])


def aiohttp_app():
    from aiohttp import web

    async def text(request):
        return web.Response(text=TEXT)

    async def json_(request):
        return web.json_response(MESSAGE)

    app = web.Application()
    app.router.add_get("/text", text)
    app.router.add_get("/json", json_)
    return app


async def make_aiohttp_app():
    """aiohttp's gunicorn workers call this (``apps_app:make_aiohttp_app``)."""
    return aiohttp_app()


def _uvicorn_worker(loop):
    from uvicorn_worker import UvicornWorker

    class Worker(UvicornWorker):
        CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "loop": loop}

    Worker.__qualname__ = Worker.__name__ = f"{loop.capitalize()}UvicornWorker"
    Worker.__module__ = __name__
    return Worker


_MAKERS = {
    "asgi_app": _starlette_app,
    "AsyncioUvicornWorker": lambda: _uvicorn_worker("asyncio"),
    "UvloopUvicornWorker": lambda: _uvicorn_worker("uvloop"),
}


def __getattr__(name):
    maker = _MAKERS.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = maker()
    globals()[name] = value
    return value
