"""The ASGI application tests/ecosystem/test_servers.py serves with uvicorn:
a Starlette app whose answer says which loop and which process served it."""
import threading

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from served import serve


async def info(request):
    q = request.query_params
    return JSONResponse(await serve(float(q.get("block", 0)), float(q.get("sleep", 0))))


def in_thread(request):
    # A plain function: Starlette runs it in anyio's worker threads.
    return JSONResponse({"thread": threading.current_thread() is not threading.main_thread()})


app = Starlette(routes=[Route("/", info), Route("/thread", in_thread)])
