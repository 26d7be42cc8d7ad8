"""Servers on tideloop, as their users start them (issue 14, part 3).

Each test starts a real server process with the command line or script line
the README shows (uvicorn's CLI and uvicorn.run, gunicorn with
tideloop.workers.UvicornWorker and tideloop.workers.AiohttpWorker and two
worker processes on one port, aiohttp's web.run_app, anyio.run), asks it
over HTTP with urllib from this process, reads which loop served the
request from the answer, and stops it with SIGTERM, checking that it shut
down the way the server promises.  The same lines on asyncio's own loop are
the spec: each test runs on both loops and expects the same behaviour.

The applications live in apps/ (put on the children's PYTHONPATH).
"""
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from loop_helpers import child_env, sigint_default

APPS = Path(__file__).resolve().parent / "apps"
READY_TIMEOUT = 20      # until a started server answers
STOP_TIMEOUT = 15       # from SIGTERM to the process's exit
TWO_WORKERS_TIMEOUT = 15

LOOP_CLASS = {
    "asyncio": f"{asyncio.SelectorEventLoop.__module__}.{asyncio.SelectorEventLoop.__qualname__}",
    "tideloop": "tideloop.Loop",
}


def needs(*modules):
    for name in modules:
        pytest.importorskip(name, reason=f"{name} is not installed (pip install '.[test]')")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path="/", timeout=10):
    """One request on a new connection: the JSON answer."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        assert r.status == 200
        return json.loads(r.read())


class Server:
    def __init__(self, proc, log_path, port):
        self.proc, self.log_path, self.port = proc, log_path, port

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_ready(self):
        """The first answer, once the server takes connections."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with {self.proc.returncode} before "
                            f"it answered:\n{self.log()}")
            try:
                return get(self.port, timeout=2)
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"no answer on port {self.port} in {READY_TIMEOUT} s:\n{self.log()}")
                time.sleep(0.1)

    def stop_in_flight(self):
        """stop() while a request is in flight; that request still gets its
        answer (the servers here shut down gracefully).  Returns both."""
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(get, self.port, "/?sleep=1")
            deadline = time.monotonic() + READY_TIMEOUT
            while "in flight: " not in self.log():
                assert time.monotonic() < deadline, f"the request never came in:\n{self.log()}"
                assert not in_flight.done(), in_flight.result()
                time.sleep(0.02)
            rc = self.stop()
            return rc, in_flight.result()

    def stop(self):
        """SIGTERM, then the exit status; the log shows no traceback."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {STOP_TIMEOUT} s after SIGTERM:\n{self.log()}")
        assert "Traceback" not in self.log(), self.log()
        return rc


@contextmanager
def server(tmp_path, args, port):
    """A server process (python ARGS) with apps/ and the tideloop under test
    on its path; whatever is left of it is killed at the end."""
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(APPS), env["PYTHONPATH"]])
    env["PYTHONUNBUFFERED"] = "1"
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        # A session of its own: gunicorn's workers go with the master.
        # SIGINT's default disposition: the tests stop servers with it.
        proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=APPS, env=env,
                                start_new_session=True, preexec_fn=sigint_default)
    try:
        yield Server(proc, log_path, port)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # workers left behind, if any
        except ProcessLookupError:
            pass


# -- uvicorn ------------------------------------------------------------------

# uvicorn's own spelling of each loop: tideloop's is the import string of its
# loop factory, which uvicorn (0.36+) imports and calls for a new loop.
UVICORN_LOOP = {"asyncio": "asyncio", "tideloop": "tideloop:new_event_loop"}

UVICORN_RUN = """\
import sys, uvicorn
from asgi_app import app
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), loop=sys.argv[1])
"""


def check_uvicorn(srv, loop_name):
    answer = {"loop": LOOP_CLASS[loop_name], "pid": srv.proc.pid}
    assert srv.wait_ready() == answer
    assert get(srv.port, "/thread") == {"thread": True}
    # uvicorn lets the request in flight finish, shuts down, then raises the
    # signal it caught again, with its former handler (SIG_DFL): the process
    # dies of SIGTERM.
    assert srv.stop_in_flight() == (-signal.SIGTERM, answer)
    assert f"Finished server process [{srv.proc.pid}]" in srv.log()


def test_uvicorn_cli(tmp_path, loop_name):
    """uvicorn asgi_app:app --loop tideloop:new_event_loop"""
    needs("uvicorn", "starlette")
    port = free_port()
    args = ["-m", "uvicorn", "asgi_app:app", "--loop", UVICORN_LOOP[loop_name],
            "--host", "127.0.0.1", "--port", str(port)]
    with server(tmp_path, args, port) as srv:
        check_uvicorn(srv, loop_name)


def test_uvicorn_run(tmp_path, loop_name):
    """uvicorn.run(app, loop="tideloop:new_event_loop")"""
    needs("uvicorn", "starlette")
    port = free_port()
    with server(tmp_path, ["-c", UVICORN_RUN, UVICORN_LOOP[loop_name], str(port)], port) as srv:
        check_uvicorn(srv, loop_name)


# -- gunicorn: two worker processes on one port --------------------------------

GUNICORN_WORKER = {
    "uvicorn": {"asyncio": "stock_workers.AsyncioUvicornWorker",
                "tideloop": "tideloop.workers.UvicornWorker"},
    "aiohttp": {"asyncio": "aiohttp.worker.GunicornWebWorker",
                "tideloop": "tideloop.workers.AiohttpWorker"},
}
GUNICORN_APP = {"uvicorn": "asgi_app:app", "aiohttp": "aiohttp_app:make_app"}
GUNICORN_NEEDS = {"uvicorn": ("gunicorn", "uvicorn_worker", "starlette"),
                  "aiohttp": ("gunicorn", "aiohttp")}
# What each worker logs as it finishes a clean shutdown.
WORKER_DONE = {"uvicorn": "Finished server process [{pid}]",
               "aiohttp": "Worker exiting (pid: {pid})"}


def gunicorn_args(app, worker, port):
    args = ["-m", "gunicorn", app, "-k", worker, "-w", "2", "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "5"]
    from gunicorn.config import KNOWN_SETTINGS
    if any(s.name == "control_socket_disable" for s in KNOWN_SETTINGS):
        # gunicorn 25+: no control socket in $HOME shared by the tests' masters
        args.append("--no-control-socket")
    return args


def parent_pid(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("PPid:"):
                return int(line.split()[1])


def two_workers(srv):
    """Answers from two distinct worker processes: a request that holds its
    worker (?block) is followed, while it holds it, by one that only the
    other worker can accept."""
    answers = {}
    deadline = time.monotonic() + TWO_WORKERS_TIMEOUT
    with ThreadPoolExecutor(1) as pool:
        while len(answers) < 2:
            assert time.monotonic() < deadline, \
                f"answers came from one worker only in {TWO_WORKERS_TIMEOUT} s: {answers}"
            seen = srv.log().count("held: ")
            held = pool.submit(get, srv.port, "/?block=0.6")
            while srv.log().count("held: ") == seen and not held.done():
                time.sleep(0.01)
            other = get(srv.port)
            for a in (held.result(), other):
                answers[a["pid"]] = a
    return list(answers.values())


@pytest.mark.parametrize("kind", ["uvicorn", "aiohttp"])
def test_gunicorn_two_workers(tmp_path, loop_name, kind):
    """gunicorn asgi_app:app -k tideloop.workers.UvicornWorker -w 2
    gunicorn aiohttp_app:make_app -k tideloop.workers.AiohttpWorker -w 2"""
    needs(*GUNICORN_NEEDS[kind])
    port = free_port()
    args = gunicorn_args(GUNICORN_APP[kind], GUNICORN_WORKER[kind][loop_name], port)
    with server(tmp_path, args, port) as srv:
        srv.wait_ready()
        workers = two_workers(srv)
        for w in workers:
            assert w["loop"] == LOOP_CLASS[loop_name]
            assert parent_pid(w["pid"]) == srv.proc.pid     # forked by this master
        # gunicorn's arbiter passes SIGTERM on to its workers, which let the
        # request in flight finish; it waits for them and exits 0.
        rc, answer = srv.stop_in_flight()
        assert rc == 0
        assert answer["loop"] == LOOP_CLASS[loop_name]
        log = srv.log()
        for w in workers:
            assert WORKER_DONE[kind].format(pid=w["pid"]) in log, log
        assert "Shutting down: Master" in log


# -- aiohttp.web.run_app --------------------------------------------------------

RUN_APP = """\
import asyncio, sys
from aiohttp import web
from aiohttp_app import build_app
if sys.argv[1] == "tideloop":
    import tideloop
    loop = tideloop.new_event_loop()
else:
    loop = asyncio.new_event_loop()
web.run_app(build_app(), host="127.0.0.1", port=int(sys.argv[2]), loop=loop)
print("run_app returned; loop closed:", loop.is_closed())
"""


def test_aiohttp_run_app(tmp_path, loop_name):
    """web.run_app(app, loop=tideloop.new_event_loop())"""
    needs("aiohttp")
    port = free_port()
    with server(tmp_path, ["-c", RUN_APP, loop_name, str(port)], port) as srv:
        answer = {"loop": LOOP_CLASS[loop_name], "pid": srv.proc.pid}
        assert srv.wait_ready() == answer
        # run_app's SIGTERM handler (loop.add_signal_handler) raises
        # GracefulExit out of the loop; run_app lets the request in flight
        # finish, cleans up and returns.
        assert srv.stop_in_flight() == (0, answer)
        assert "run_app returned; loop closed: True" in srv.log()


# -- anyio.run ------------------------------------------------------------------

def test_anyio_run(tmp_path, loop_name):
    """anyio.run(main, backend="asyncio",
                 backend_options={"loop_factory": tideloop.new_event_loop})"""
    needs("anyio")
    port = free_port()
    with server(tmp_path, ["anyio_app.py", loop_name, str(port)], port) as srv:
        answer = srv.wait_ready()
        assert answer == {"loop": LOOP_CLASS[loop_name], "pid": srv.proc.pid, "thread": True}
        # anyio's signal receiver (loop.add_signal_handler) hands SIGTERM to
        # the task group, which is cancelled; anyio.run returns.
        assert srv.stop() == 0
        assert "stopping on SIGTERM" in srv.log()


# -- tideloop.workers without the servers installed ----------------------------

MISSING = """\
import sys
for name in sys.argv[1:]:
    sys.modules[name] = None        # as if not installed
import tideloop.workers as w
try:
    w.UvicornWorker
except ImportError as e:
    print("UvicornWorker:", e)
try:
    w.AiohttpWorker
except ImportError as e:
    print("AiohttpWorker:", e)
"""


def test_workers_module_imports_without_the_servers():
    """Importing tideloop.workers needs neither server; looking a class up
    without its package says what to install."""
    out = subprocess.run([sys.executable, "-c", MISSING, "uvicorn_worker", "aiohttp"],
                         capture_output=True, text=True, env=child_env(), timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("UvicornWorker: tideloop.workers.UvicornWorker needs "
                               "gunicorn and uvicorn-worker (pip install gunicorn uvicorn-worker)")
    assert lines[1].startswith("AiohttpWorker: tideloop.workers.AiohttpWorker needs "
                               "gunicorn and aiohttp (pip install gunicorn aiohttp)")


def test_workers_classes():
    needs("gunicorn", "uvicorn_worker", "aiohttp")
    import aiohttp.worker
    import uvicorn_worker

    import tideloop.workers

    uw, aw = tideloop.workers.UvicornWorker, tideloop.workers.AiohttpWorker
    assert issubclass(uw, uvicorn_worker.UvicornWorker)
    assert uw.CONFIG_KWARGS["loop"] == "tideloop:new_event_loop"
    assert issubclass(aw, aiohttp.worker.GunicornWebWorker)
    for cls in (uw, aw):
        assert f"{cls.__module__}.{cls.__qualname__}" == f"tideloop.workers.{cls.__name__}"
    assert tideloop.workers.UvicornWorker is uw             # made once
    assert {"UvicornWorker", "AiohttpWorker"} <= set(dir(tideloop.workers))
    with pytest.raises(AttributeError):
        tideloop.workers.NoSuchWorker
