"""asyncio without its event loop policies: CPython's main branch (3.16)
removes them, and nothing in tideloop may need them.

Every test runs child interpreters whose asyncio has lost the policy API
before anything else is imported: a ``sitecustomize.py`` first on their
PYTHONPATH (NO_POLICIES) deletes every policy name from asyncio's modules,
public and private (the classes, the getters and setters, the global
policy), and puts in a ``get_event_loop()``, ``set_event_loop()`` and
``new_event_loop()`` that need no policy, as asyncio keeps them without one
(``new_event_loop()`` makes the default loop).  Each child checks that the
names are gone (CHECK) before it does anything else.

Behaviour that the stock loop has too runs on both loops (``loop_name``) and
must agree; what only tideloop has (install(), EventLoopPolicy, the worker
classes) runs on tideloop.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from loop_helpers import child_env

TIMEOUT = 30
PY = sys.version_info[:2]

NO_POLICIES = '''\
"""The policy API taken out of asyncio (tests/compat/test_no_policy_api.py)."""
import sys
import threading

assert "tideloop" not in sys.modules
import asyncio
from asyncio import events

def _policy_name(name):
    return "EventLoopPolicy" in name or "event_loop_policy" in name

def _no_policy_getattr(module, getattr_):
    def __getattr__(name):
        if _policy_name(name) or getattr_ is None:
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        return getattr_(name)
    return __getattr__

for _module in [m for n, m in sys.modules.items()
                if n == "asyncio" or n.startswith("asyncio.")]:
    _d = vars(_module)
    for _name in [n for n in _d if _policy_name(n)]:
        del _d[_name]
    if "__all__" in _d:
        _module.__all__ = type(_d["__all__"])(n for n in _d["__all__"] if not _policy_name(n))
    if "__getattr__" in _d:     # 3.14+: the deprecated names are served lazily
        _module.__getattr__ = _no_policy_getattr(_module, _d["__getattr__"])

# What asyncio has in place of the policy: a current loop per thread, and
# the default loop from new_event_loop().
class _Current(threading.local):
    loop = None

_current = _Current()

def get_event_loop():
    loop = events._get_running_loop()
    if loop is None:
        loop = _current.loop
    if loop is None:
        raise RuntimeError("There is no current event loop in thread %r."
                           % threading.current_thread().name)
    return loop

def set_event_loop(loop):
    if loop is not None and not isinstance(loop, events.AbstractEventLoop):
        raise TypeError(f"loop must be an instance of AbstractEventLoop or None, "
                        f"not {type(loop).__name__!r}")
    _current.loop = loop

def new_event_loop():
    return asyncio.SelectorEventLoop()

for _module in (asyncio, events):
    _module.get_event_loop = get_event_loop
    _module.set_event_loop = set_event_loop
    _module.new_event_loop = new_event_loop
if hasattr(events, "_get_event_loop"):      # 3.11-3.13
    events._get_event_loop = lambda stacklevel=3: get_event_loop()
'''

# The names the children must not find (the public API and the private
# names tideloop's compatibility layer looks up, on every version).
CHECK = '''\
import asyncio, asyncio.events, asyncio.unix_events
for _module, _names in [
        (asyncio, ("AbstractEventLoopPolicy", "DefaultEventLoopPolicy",
                   "get_event_loop_policy", "set_event_loop_policy")),
        (asyncio.events, ("AbstractEventLoopPolicy", "_AbstractEventLoopPolicy",
                          "BaseDefaultEventLoopPolicy", "_BaseDefaultEventLoopPolicy",
                          "get_event_loop_policy", "set_event_loop_policy",
                          "_get_event_loop_policy", "_set_event_loop_policy",
                          "_event_loop_policy")),
        (asyncio.unix_events, ("_UnixDefaultEventLoopPolicy", "DefaultEventLoopPolicy",
                               "_DefaultEventLoopPolicy"))]:
    for _name in _names:
        assert not hasattr(_module, _name), f"{_module.__name__}.{_name} is still there"
'''

LOOP_CLASS = {"asyncio": "asyncio.unix_events._UnixSelectorEventLoop",
              "tideloop": "tideloop.Loop"}


@pytest.fixture
def env(tmp_path):
    """The children's environment: NO_POLICIES as their sitecustomize."""
    site = tmp_path / "no-policies"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_POLICIES)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    return env


def child(env, *args, cwd=None):
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                       env=env, cwd=cwd, timeout=TIMEOUT)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def script(code):
    return CHECK + textwrap.dedent(code)


# -- the loop at work -------------------------------------------------------

ECHO_AND_TIMER = script("""\
    import json, socket, subprocess, sys
    LOOP_NAME = sys.argv[1]
    if LOOP_NAME == "tideloop":
        import tideloop
        factory = tideloop.new_event_loop
    else:
        factory = asyncio.new_event_loop        # the default loop

    def name(cls):
        return f"{cls.__module__}.{cls.__qualname__}"

    async def echo(loop, listener):
        conn, _ = await loop.sock_accept(listener)
        with conn:
            await loop.sock_sendall(conn, await loop.sock_recv(conn, 100))

    async def main():
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket() as client:
            listener.setblocking(False)
            client.setblocking(False)
            server = asyncio.ensure_future(echo(loop, listener))
            await loop.sock_connect(client, listener.getsockname())
            await loop.sock_sendall(client, b"ping")
            echoed = await loop.sock_recv(client, 100)
            await server
        start = loop.time()
        fired = loop.create_future()
        loop.call_later(0.05, fired.set_result, "fired")
        timer = [await fired, loop.time() - start >= 0.05]
        result = [name(type(loop)), echoed.decode(), timer]
        # Before 3.14 the stock loop watches children through the policy's
        # child watcher; tideloop never needs one.
        if LOOP_NAME == "tideloop" or sys.version_info >= (3, 14):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "print('child')", stdout=subprocess.PIPE)
            out, _ = await proc.communicate()
            result.append([out.decode().strip(), proc.returncode])
        return result

    results = {}
    with asyncio.Runner(loop_factory=factory) as runner:
        results["Runner"] = runner.run(main())
    if sys.version_info >= (3, 12):
        results["asyncio.run"] = asyncio.run(main(), loop_factory=factory)
    loop = factory()
    try:
        results["run_until_complete"] = loop.run_until_complete(main())
    finally:
        loop.close()
    if LOOP_NAME == "tideloop":
        results["tideloop.run"] = tideloop.run(main())
    print(json.dumps(results))
""")


def test_echo_timer_and_subprocess(env, loop_name):
    """tideloop.run, tideloop.new_event_loop and asyncio.Runner(loop_factory=)
    (asyncio.run(loop_factory=) from 3.12) run a TCP echo, a timer and a
    child process, as the stock loop does."""
    results = json.loads(child(env, "-W", "error", "-c", ECHO_AND_TIMER, loop_name))
    expected = [LOOP_CLASS[loop_name], "ping", ["fired", True]]
    if loop_name == "tideloop" or PY >= (3, 14):
        expected.append(["child", 0])
    ways = ["Runner", "run_until_complete"] + (["asyncio.run"] if PY >= (3, 12) else [])
    if loop_name == "tideloop":
        ways.append("tideloop.run")
    assert results == {way: expected for way in ways}


# -- install() and EventLoopPolicy --------------------------------------------

INSTALL = script("""\
    import tideloop
    from tideloop import *
    from tideloop import _compat

    def name(cls):
        return f"{cls.__module__}.{cls.__qualname__}"

    print(_compat.ENTRIES["policy_api"][1], _compat.ENTRIES["default_policy"][1])
    for make in (tideloop.install, tideloop.EventLoopPolicy):
        try:
            make()
        except RuntimeError as exc:
            print(exc)
        else:
            print("no error")
    # Nothing changed: asyncio's default loop is still the stock one.
    loop = asyncio.new_event_loop()
    print(name(type(loop)))
    loop.close()
    async def main():
        return name(type(asyncio.get_running_loop()))
    print(asyncio.run(main()))
""")


def test_install_and_event_loop_policy(env):
    """install() raises RuntimeError saying what to use instead and changes
    nothing; EventLoopPolicy stays a name (``from tideloop import *`` works)
    and making one raises the same way."""
    out = child(env, "-W", "error", "-c", INSTALL).splitlines()
    assert out[0] == "absent none"
    for line, what in zip(out[1:3], ("tideloop.install()", "tideloop.EventLoopPolicy")):
        assert line.startswith(f"{what} needs asyncio's event loop policies, which Python "), line
        assert "tideloop.run(main())" in line, line
        assert "asyncio.run(main(), loop_factory=tideloop.new_event_loop)" in line, line
        assert "python -m tideloop run" in line, line
    assert out[3:] == [LOOP_CLASS["asyncio"]] * 2


# -- the pytest plugin --------------------------------------------------------

PLUGIN_TESTS = """\
import asyncio, os
import pytest

pytestmark = pytest.mark.anyio

def loop_class():
    cls = type(asyncio.get_running_loop())
    return f"{cls.__module__}.{cls.__qualname__}"

@pytest.fixture
async def fixture_loop():
    return loop_class()

async def test_loop(anyio_backend_name, fixture_loop):
    assert not hasattr(asyncio, "get_event_loop_policy")
    assert loop_class() == fixture_loop == os.environ["EXPECT"]

def test_sync():
    pass
"""


def test_pytest_plugin(env, tmp_path, loop_name):
    """pytest --loop=tideloop runs anyio's async tests and fixtures on
    tideloop (--loop=asyncio: on the default loop).  pytest-asyncio (1.5)
    needs the policies itself, so the child loads only anyio's plugin and
    tideloop's."""
    pytest.importorskip("anyio")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "test_plugin.py").write_text(PLUGIN_TESTS)
    (proj / "conftest.py").write_text(CHECK)
    env = dict(env, EXPECT=LOOP_CLASS[loop_name], PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        env.pop(var, None)
    out = child(env, "-m", "pytest", "-p", "no:cacheprovider", "-p", "anyio",
                "-p", "tideloop.pytest_plugin", f"--loop={loop_name}",
                "-k", "not trio", "-rA", cwd=proj)
    assert "PASSED test_plugin.py::test_loop[asyncio]" in out, out
    assert "PASSED test_plugin.py::test_sync" in out, out
    assert " 2 passed" in out, out
    header = [line for line in out.splitlines() if line.startswith("tideloop:")]
    if loop_name == "tideloop":
        assert header[0].startswith("tideloop: loop=tideloop (command line) under anyio"), out
    else:
        assert header == ["tideloop: loop=asyncio (the stock loop; command line)"], out


# -- python -m tideloop run -----------------------------------------------------

APP = script("""\
    import json, sys

    def name(cls):
        return f"{cls.__module__}.{cls.__qualname__}"

    async def main():
        await asyncio.sleep(0.01)
        return name(type(asyncio.get_running_loop()))

    results = {"asyncio.run": asyncio.run(main())}
    with asyncio.Runner() as runner:
        results["Runner"] = runner.run(main())
    loop = asyncio.new_event_loop()
    results["new_event_loop"] = name(type(loop))
    loop.close()
    if sys.version_info >= (3, 12):    # a loop_factory the program passes wins
        results["explicit"] = asyncio.run(main(), loop_factory=asyncio.SelectorEventLoop)
    print(json.dumps(results))
""")


@pytest.mark.parametrize("how", ["script", "module"])
def test_cli_run(env, tmp_path, loop_name, how):
    """'python -m tideloop run app.py' (and 'run -m app') runs the program
    with tideloop as the loop that asyncio.run(), asyncio.Runner() and
    asyncio.new_event_loop() make, as 'python app.py' does with the stock one."""
    (tmp_path / "app.py").write_text(APP)
    target = ["app.py"] if how == "script" else ["-m", "app"]
    runner = ["-m", "tideloop", "run"] if loop_name == "tideloop" else []
    results = json.loads(child(env, "-W", "error", *runner, *target, cwd=tmp_path))
    expected = dict.fromkeys(["asyncio.run", "Runner", "new_event_loop"],
                             LOOP_CLASS[loop_name])
    if PY >= (3, 12):
        expected["explicit"] = LOOP_CLASS["asyncio"]
    assert results == expected


# -- tideloop.workers -----------------------------------------------------------

WORKERS = script("""\
    import json
    import tideloop.workers

    def name(cls):
        return f"{cls.__module__}.{cls.__qualname__}"

    async def running():
        return name(type(asyncio.get_running_loop()))

    # UvicornWorker.run(): uvicorn's asyncio_run with the loop factory its
    # Config resolves from the worker's loop= option.
    from uvicorn._compat import asyncio_run
    from uvicorn.config import Config
    config = Config(app="app:app", **tideloop.workers.UvicornWorker.CONFIG_KWARGS)
    results = {"uvicorn": asyncio_run(running(), loop_factory=config.get_loop_factory())}

    # AiohttpWorker.init_process() without gunicorn's own, which would go on
    # to run the worker.
    from gunicorn.workers import base
    base.Worker.init_process = lambda self: None
    worker = object.__new__(tideloop.workers.AiohttpWorker)
    worker.sockets = []     # gunicorn's Worker.__init__ sets it: the listeners
    worker.init_process()
    results["aiohttp"] = [name(type(worker.loop)), asyncio.get_event_loop() is worker.loop,
                          worker.loop.run_until_complete(running())]
    asyncio.set_event_loop(None)
    worker.loop.close()
    print(json.dumps(results))
""")


def test_workers(env):
    """The gunicorn worker classes make their tideloop loops without
    policies: UvicornWorker through uvicorn's loop factory, AiohttpWorker in
    its init_process (which also makes it the current loop)."""
    for module in ("gunicorn", "uvicorn_worker", "aiohttp"):
        pytest.importorskip(module)
    results = json.loads(child(env, "-W", "error", "-c", WORKERS))
    assert results == {"uvicorn": "tideloop.Loop",
                       "aiohttp": ["tideloop.Loop", True, "tideloop.Loop"]}
