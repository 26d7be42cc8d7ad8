"""tideloop.interpreters.run(): one program in N isolated interpreters, a
loop each, one port; stopped by SIGINT/SIGTERM in the main interpreter; an
exception in one stops the others and comes out of run() with its
traceback.  Each program runs in a child process, on tideloop's loop and on
asyncio's (loop_factory), so the runner is shown to be loop-agnostic."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from interp_helpers import needs_subinterpreters
from loop_helpers import SLOW, child_env, sigint_default

FACTORIES = {"asyncio": "asyncio:new_event_loop", "tideloop": "tideloop:new_event_loop"}

APP = '''
import asyncio, os, sys, time
import tideloop.interpreters

async def handle(reader, writer):
    while line := await reader.readline():
        writer.write(b"%d " % os.getpid() + line)     # the process is one
    writer.close()

async def serve(port, greeting, *, ready_dir):
    sock = tideloop.interpreters.reuse_port_socket("127.0.0.1", port)
    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        open(os.path.join(ready_dir, str(id(server))), "w").close()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return greeting + " from " + type(asyncio.get_running_loop()).__module__

class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("no")

async def fail(flag_dir, kind):
    try:
        os.mkdir(os.path.join(flag_dir, "chosen"))
    except FileExistsError:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "stopped"
    await asyncio.sleep(0.05)
    if kind == "plain":
        raise ValueError("boom in one interpreter")    # THE FAILING LINE
    raise Unpicklable("cannot travel")

async def stubborn(ready_dir):
    open(os.path.join(ready_dir, "x%d" % id(ready_dir)), "w").close()
    while True:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass                            # ignores the graceful stop

async def value(x, *, scale):
    return {"sum": sum(x) * scale, "loop": type(asyncio.get_running_loop()).__module__}

def main():
    mode, factory = sys.argv[1], sys.argv[2]
    if mode == "serve":
        port, ready = int(sys.argv[3]), sys.argv[4]
        print(tideloop.interpreters.run(serve, port, "hello", ready_dir=ready,
                                        interpreters=2, loop_factory=factory), flush=True)
    elif mode in ("plain", "unpicklable"):
        try:
            tideloop.interpreters.run(fail, sys.argv[3], mode, interpreters=2,
                                      loop_factory=factory)
        except BaseException as exc:
            print(type(exc).__name__, exc, flush=True)
            print("CAUSE", exc.__cause__, flush=True)
    elif mode == "stubborn":
        tideloop.interpreters.run(stubborn, sys.argv[3], interpreters=2,
                                  loop_factory=factory, shutdown_timeout=60)
    elif mode == "value":
        print(tideloop.interpreters.run(value, [1, 2, 3], scale=10, interpreters=3,
                                        loop_factory=factory))

if __name__ == "__main__":
    main()
'''


@pytest.fixture(params=list(FACTORIES))
def factory(request):
    return FACTORIES[request.param]


@pytest.fixture
def app(tmp_path):
    path = tmp_path / "app.py"
    path.write_text(APP)
    return path


def start(app, *args):
    return subprocess.Popen([sys.executable, str(app), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=str(app.parent), preexec_fn=sigint_default)


def wait_for_files(d, n, proc, timeout=30 * SLOW):
    deadline = time.monotonic() + timeout
    while len(os.listdir(d)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the interpreters did not start"
        time.sleep(0.02)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_subinterpreters
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serves_one_port_and_stops_cleanly_on_a_signal(app, factory, tmp_path, sig):
    import socket
    ready = tmp_path / "ready"
    ready.mkdir()
    port = free_port()
    proc = start(app, "serve", factory, str(port), str(ready))
    try:
        wait_for_files(ready, 2, proc)
        for i in range(20):
            with socket.create_connection(("127.0.0.1", port)) as c:
                c.sendall(b"line %d\n" % i)
                assert c.makefile("rb").readline() == b"%d line %d\n" % (proc.pid, i)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30 * SLOW)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    loop_module = factory.split(":")[0].replace("asyncio", "asyncio.unix_events")
    assert out.splitlines() == [repr([f"hello from {loop_module}"] * 2)]


@needs_subinterpreters
def test_an_exception_in_one_interpreter_stops_the_others_and_comes_out(app, factory, tmp_path):
    proc = start(app, "plain", factory, str(tmp_path))
    out, err = proc.communicate(timeout=60 * SLOW)
    assert proc.returncode == 0, err
    first, cause = out.split("CAUSE", 1)
    assert first.strip() == "ValueError boom in one interpreter"
    # The other interpreter's main was cancelled; the traceback text is that
    # of the interpreter where it was raised, down to the line.
    assert "(in interpreter-" in cause
    assert 'raise ValueError("boom in one interpreter")    # THE FAILING LINE' in cause
    assert "in fail" in cause


@needs_subinterpreters
def test_an_exception_that_cannot_travel_comes_out_as_interpreter_error(app, factory, tmp_path):
    proc = start(app, "unpicklable", factory, str(tmp_path))
    out, err = proc.communicate(timeout=60 * SLOW)
    assert proc.returncode == 0, err
    assert out.startswith("InterpreterError interpreter-"), out
    assert "Unpicklable: cannot travel" in out
    assert 'raise Unpicklable("cannot travel")' in out


@needs_subinterpreters
def test_arguments_and_results_cross_by_pickle(app, factory):
    proc = start(app, "value", factory)
    out, err = proc.communicate(timeout=60 * SLOW)
    assert proc.returncode == 0, err
    loop_module = factory.split(":")[0].replace("asyncio", "asyncio.unix_events")
    assert out.strip() == repr([{"sum": 60, "loop": loop_module}] * 3)


@needs_subinterpreters
def test_a_second_signal_stops_the_loops_by_force(app, factory, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    proc = start(app, "stubborn", factory, str(ready))
    try:
        wait_for_files(ready, 2, proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert proc.poll() is None          # main() ignores the graceful stop
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30 * SLOW)
    finally:
        proc.kill()
    # As tideloop.threads: the loops stopped, then SIGINT's usual effect
    # (an uncaught KeyboardInterrupt ends Python by SIGINT).
    assert "KeyboardInterrupt" in err, err
    assert proc.returncode == -signal.SIGINT


def test_arguments_are_checked_before_anything_starts():
    import tideloop.interpreters as ti
    if not ti.available():
        with pytest.raises(NotImplementedError, match="CPython 3.1[23]"):
            ti.run("os:getpid")
        return

    async def local():
        pass
    with pytest.raises(TypeError, match="module-level function"):
        ti.run(local)
    with pytest.raises(TypeError, match="module-level function"):
        ti.run(lambda: None)
    with pytest.raises(ValueError, match="'module:name'"):
        ti.run("nocolon")
    with pytest.raises(ValueError, match="positive int"):
        ti.run("os:getpid", interpreters=0)
    with pytest.raises(ValueError, match="shutdown_timeout"):
        ti.run("os:getpid", shutdown_timeout=-1)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="the versions without it")
def test_not_implemented_before_3_13_says_why():
    import tideloop.interpreters as ti
    assert not ti.available()
    with pytest.raises(NotImplementedError) as info:
        ti.run("os:getpid")
    assert "tideloop.threads" in str(info.value)
