"""The aiohttp.web application tests/ecosystem/test_servers.py serves with
gunicorn and with web.run_app: its answer says which loop and which process
served it."""
from aiohttp import web

from served import serve


async def info(request):
    q = request.query
    return web.json_response(await serve(float(q.get("block", 0)), float(q.get("sleep", 0))))


def build_app():
    app = web.Application()
    app.router.add_get("/", info)
    return app


async def make_app():
    """The factory gunicorn's aiohttp workers call: gunicorn aiohttp_app:make_app."""
    return build_app()
