"""tideloop.threads' and tideloop.interpreters' recipes in real processes: N
threads (or N isolated interpreters) of one process, one loop each, serving
one port with a SO_REUSEPORT socket each.

Each recipe (asyncio.start_server, uvicorn.Server.serve(sockets=...),
aiohttp's AppRunner + SockSite; apps/threads_app.py, as the README shows
them) is started with three threads, asked over HTTP on new connections from
this process, and must answer from every thread (the kernel spreads the
connections over the threads' sockets); SIGINT or SIGTERM, with a request in
flight, must stop it cleanly (the request answered, exit status 0, no
traceback); a thread that fails must stop the others and its error must come
out of run().  Each runs on tideloop and on asyncio's loop (run()'s
loop_factory).  The interpreters' recipes need 3.13+.
"""
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from interp_helpers import _has_subinterpreters
from .test_servers import LOOP_CLASS, READY_TIMEOUT, STOP_TIMEOUT, free_port, get, needs, server

RECIPES = ["asyncio", "uvicorn", "aiohttp"]
NEEDS = {"asyncio": (), "uvicorn": ("uvicorn",), "aiohttp": ("aiohttp",)}
# runner -> (its recipes' program, the names its workers answer with)
RUNNERS = {"threads": ("threads_app.py", "tideloop-"),
           "interpreters": ("interpreters_app.py", "interpreter-")}


@pytest.fixture(params=list(RUNNERS))
def runner(request):
    if request.param == "interpreters" and not _has_subinterpreters():
        pytest.skip("isolated interpreters where asyncio runs: 3.13+")
    return request.param


# CPython 3.13 crashes (a double free in the tuple freelist at
# Py_EndInterpreter) when several isolated interpreters have imported
# uvicorn or aiohttp.web at once, without tideloop and on any loop
# (docs/compatibility.md); 3.14 and 3.15 do not.
CPY313_IMPORT_CRASH = sys.version_info[:2] == (3, 13)


def skip_313_frameworks(runner, recipe):
    if runner == "interpreters" and recipe != "asyncio" and CPY313_IMPORT_CRASH:
        pytest.skip("CPython 3.13 crashes when interpreters that imported uvicorn or "
                    "aiohttp are destroyed (without tideloop too)")


def names(runner):
    return [RUNNERS[runner][1] + str(i) for i in range(3)]

# Server.wait_closed() waits for the connections only from 3.12.1 (before, it
# returns once the listener is closed, and asyncio.Runner then cancels the
# handlers in flight), so the asyncio recipe is graceful only there.
ASYNCIO_GRACEFUL = sys.version_info >= (3, 12, 1)


def answers_by_thread(port, count=60, timeout=READY_TIMEOUT):
    """At least ``count`` requests, each on a new connection, and more until
    every thread has answered or ``timeout`` (a thread's server listens only
    once it has started: until then the kernel sends it nothing)."""
    seen = {}
    deadline = time.monotonic() + timeout
    n = 0
    while n < count or (len(seen) < 3 and time.monotonic() < deadline):
        a = get(port)
        seen.setdefault(a["thread"], a)
        n += 1
    return seen


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_serves_from_every_thread_and_stops(tmp_path, runner, loop_name, recipe,
                                                   signame):
    needs(*NEEDS[recipe])
    skip_313_frameworks(runner, recipe)
    port = free_port()
    with server(tmp_path, [RUNNERS[runner][0], recipe, loop_name, str(port)], port) as srv:
        first = srv.wait_ready()
        assert first["loop"] == LOOP_CLASS[loop_name]
        assert first["pid"] == srv.proc.pid
        seen = answers_by_thread(port)
        # new connections over 3 listening sockets: every thread gets some
        assert sorted(seen) == names(runner), seen
        assert {a["loop"] for a in seen.values()} == {LOOP_CLASS[loop_name]}

        graceful = recipe != "asyncio" or ASYNCIO_GRACEFUL
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(get, port, "/?sleep=1") if graceful else None
            deadline = time.monotonic() + READY_TIMEOUT
            while graceful and "in flight: " not in srv.log():
                assert time.monotonic() < deadline, srv.log()
                time.sleep(0.02)
            srv.proc.send_signal(getattr(signal, signame))
            try:
                rc = srv.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {STOP_TIMEOUT} s after {signame}:\n{srv.log()}")
            if graceful:
                assert in_flight.result()["loop"] == LOOP_CLASS[loop_name]
        log = srv.log()
        assert rc == 0, log
        assert "Traceback" not in log, log
        assert "run() returned [None, None, None]" in log, log
        for name in names(runner):
            assert f"{name} stopped" in log, log


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_error_in_one_thread(tmp_path, runner, loop_name, recipe):
    """Worker 1 fails once the others serve: they are stopped, and its
    error comes out of run() (uvicorn's sys.exit(3) after a failed startup:
    SystemExit(3), the process's exit status)."""
    needs(*NEEDS[recipe])
    skip_313_frameworks(runner, recipe)
    port = free_port()
    one = names(runner)[1]
    with server(tmp_path, [RUNNERS[runner][0], recipe, loop_name, str(port), "fail"],
                port) as srv:
        try:
            rc = srv.proc.wait(READY_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {READY_TIMEOUT} s after {one} failed:\n{srv.log()}")
        log = srv.log()
        if recipe == "uvicorn":
            assert rc == 3, log
            assert f"RuntimeError('{one} failed on purpose')" in log, log
            assert "Application startup failed. Exiting." in log, log
        else:
            assert rc == 1, log
            assert f"RuntimeError: {one} failed on purpose" in log, log
        for name in names(runner):
            assert f"{name} stopped" in log, log
        assert "run() returned" not in log, log
