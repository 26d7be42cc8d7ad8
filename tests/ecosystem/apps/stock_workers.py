"""The stock side of the gunicorn tests: uvicorn's worker on asyncio's own
loop (uvicorn_worker.UvicornWorker's "auto" takes uvloop where it is
installed)."""
import uvicorn_worker


class AsyncioUvicornWorker(uvicorn_worker.UvicornWorker):
    CONFIG_KWARGS = {**uvicorn_worker.UvicornWorker.CONFIG_KWARGS, "loop": "asyncio"}
