"""Gunicorn worker classes whose worker processes run on a tideloop loop.

    gunicorn app:app      -k tideloop.workers.UvicornWorker -w 2   # ASGI, through uvicorn
    gunicorn app:make_app -k tideloop.workers.AiohttpWorker -w 2   # aiohttp.web

Gunicorn's arbiter binds the port once and forks the workers, which all
accept on it: one loop per process, one process per core.

Each class is made the first time it is looked up, from the server package
it extends (``uvicorn-worker`` for UvicornWorker, ``aiohttp`` for
AiohttpWorker), so importing this module needs neither, and looking up one
class needs only its own package.
"""

import asyncio

from . import new_event_loop

__all__ = ("UvicornWorker", "AiohttpWorker")

# The import string uvicorn (0.36+) resolves to a loop factory: the same
# value as ``uvicorn --loop tideloop:new_event_loop``.
UVICORN_LOOP = "tideloop:new_event_loop"


def _require(module, packages, name):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        raise ImportError(
            f"tideloop.workers.{name} needs {' and '.join(packages)} "
            f"(pip install {' '.join(packages)}): {exc}", name=exc.name) from exc


def _uvicorn_worker():
    base = _require("uvicorn_worker", ("gunicorn", "uvicorn-worker"),
                    "UvicornWorker").UvicornWorker
    from uvicorn.config import Config
    if not hasattr(Config, "get_loop_factory"):
        # Before 0.36 uvicorn's loop= named one of its own loop setups only.
        raise ImportError("tideloop.workers.UvicornWorker needs uvicorn 0.36 or later "
                          "(pip install -U uvicorn uvicorn-worker)")

    class UvicornWorker(base):
        """uvicorn's gunicorn worker (``uvicorn_worker.UvicornWorker``) with
        tideloop as its loop: uvicorn's own option, ``loop=``, names the
        loop factory, and uvicorn runs the server on a loop it makes with it."""

        CONFIG_KWARGS = {**base.CONFIG_KWARGS, "loop": UVICORN_LOOP}

    return UvicornWorker


def _aiohttp_worker():
    worker = _require("aiohttp.worker", ("gunicorn", "aiohttp"), "AiohttpWorker")
    from gunicorn.workers import base as gunicorn_base

    class AiohttpWorker(worker.GunicornWebWorker):
        """aiohttp's gunicorn worker (``aiohttp.worker.GunicornWebWorker``)
        on a tideloop loop.

        aiohttp's uvloop worker gets its loop by setting uvloop's policy
        before aiohttp's ``init_process`` makes one; asyncio deprecates
        policies from 3.14 (and CPython 3.16 has none), so this worker makes
        the loop itself, in aiohttp's place, and leaves the process's policy
        alone."""

        def init_process(self):
            # What GunicornWebWorker.init_process does, with tideloop's loop
            # in place of asyncio.new_event_loop()'s, then gunicorn's own,
            # which ends by running the worker.  (aiohttp's first closes the
            # current loop; gunicorn's arbiter is synchronous and its workers
            # start with none.)
            self.loop = new_event_loop()
            asyncio.set_event_loop(self.loop)
            gunicorn_base.Worker.init_process(self)

    return AiohttpWorker


_MAKERS = {"UvicornWorker": _uvicorn_worker, "AiohttpWorker": _aiohttp_worker}


def __getattr__(name):
    maker = _MAKERS.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = maker()
    cls.__module__ = __name__
    cls.__qualname__ = name
    globals()[name] = cls
    return cls


def __dir__():
    return sorted(set(globals()) | set(_MAKERS))
