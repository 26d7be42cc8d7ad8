"""Each interpreter's new loop features, on the stock loop and on tideloop:

- 3.12: eager task factories, shutdown_default_executor(timeout=);
- 3.13: Server.close_clients()/abort_clients(), create_server(keep_alive=),
  create_unix_server(cleanup_socket=), servers tracking their transports;
- 3.13.3+/3.14: create_task(coro, **kwargs) with eager_start=;
- 3.14: asyncio.capture_call_graph()/print_call_graph(), and
  `python -m asyncio ps|pstree PID` on a process running tideloop; no child
  watchers; the policy API deprecated (asyncio.run(loop_factory=) works).

A test that needs a feature the interpreter lacks skips, naming the version."""
import asyncio
import io
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from loop_helpers import child_env

PY = sys.version_info[:3]
needs_312 = pytest.mark.skipif(PY < (3, 12), reason="new in Python 3.12")
needs_313 = pytest.mark.skipif(PY < (3, 13), reason="new in Python 3.13")
needs_3133 = pytest.mark.skipif(PY < (3, 13, 3),
                                reason="loop.create_task(**kwargs) is new in Python 3.13.3")
needs_314 = pytest.mark.skipif(PY < (3, 14), reason="new in Python 3.14")


# ---- 3.12: eager tasks ------------------------------------------------------

@needs_312
def test_eager_task_factory_runs_first_step_at_once(loop, run):
    order = []

    async def quick():
        order.append("quick ran")
        return 42

    async def slow():
        order.append("slow started")
        await asyncio.sleep(0)
        order.append("slow resumed")
        return 7

    async def main():
        loop.set_task_factory(asyncio.eager_task_factory)
        try:
            t = asyncio.create_task(quick())
            order.append("after create quick")
            assert t.done() and t.result() == 42
            s = loop.create_task(slow(), name="slow")
            order.append("after create slow")
            assert not s.done() and s.get_name() == "slow"
            assert await s == 7
        finally:
            loop.set_task_factory(None)

    run(main())
    assert order == ["quick ran", "after create quick", "slow started",
                     "after create slow", "slow resumed"]


@needs_312
def test_create_eager_task_factory_with_custom_task(loop, run):
    made = []

    class MyTask(asyncio.Task):
        def __init__(self, *a, **kw):
            made.append(kw.get("eager_start"))
            super().__init__(*a, **kw)

    async def main():
        loop.set_task_factory(asyncio.create_eager_task_factory(MyTask))
        try:
            async def f():
                return asyncio.current_task()
            t = loop.create_task(f())
            assert t.done()
            assert isinstance(t, MyTask) and t.result() is t
        finally:
            loop.set_task_factory(None)

    run(main())
    assert made == [True]


@needs_312
def test_eager_task_contextvars_and_current_task(loop, run):
    import contextvars
    var = contextvars.ContextVar("v", default="unset")

    async def main():
        loop.set_task_factory(asyncio.eager_task_factory)
        try:
            var.set("outer")
            seen = []

            async def child():
                seen.append((var.get(), asyncio.current_task() is not None))
                var.set("inner")
            t = asyncio.create_task(child())
            await t
            assert seen == [("outer", True)]
            assert var.get() == "outer"
        finally:
            loop.set_task_factory(None)

    run(main())


def _shutdown_with_timeout(factory):
    """What shutdown_default_executor(timeout=0.1) does with a worker busy
    for 1 s: (warned, waited for the worker)."""
    import threading
    import warnings
    release = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(None, release.wait, 1.0)
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await loop.shutdown_default_executor(timeout=0.1)
        waited = time.monotonic() - t0 > 0.5
        release.set()
        await asyncio.wait_for(asyncio.shield(fut), 5)
        return ([str(w.message) for w in caught if w.category is RuntimeWarning], waited)

    with asyncio.Runner(loop_factory=factory) as r:
        return r.run(main())


@needs_312
def test_shutdown_default_executor_timeout():
    """The timeout's meaning changed within 3.12 (3.12.0-3.12.x: it bounds the
    join after the shutdown; later: the wait itself, with a RuntimeWarning):
    tideloop does what the stock loop of this interpreter does."""
    import tideloop
    stock = _shutdown_with_timeout(asyncio.SelectorEventLoop)
    ours = _shutdown_with_timeout(tideloop.new_event_loop)
    assert ours == stock
    if PY >= (3, 13):
        assert stock == (["The executor did not finishing joining its threads "
                          "within 0.1 seconds."], False)


# ---- 3.13: servers ------------------------------------------------------------

class _Sink(asyncio.Protocol):
    lost = None

    def __init__(self, loop, made):
        self.loop = loop
        self.made = made
        self.closed = loop.create_future()

    def connection_made(self, tr):
        self.made.append(tr)

    def connection_lost(self, exc):
        if not self.closed.done():
            self.closed.set_result(exc)


async def _serve_two_clients(loop):
    made, protos = [], []

    def factory():
        p = _Sink(loop, made)
        protos.append(p)
        return p
    srv = await loop.create_server(factory, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    clients = []
    for _ in range(2):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        clients.append((r, w))
    for _ in range(200):
        if len(made) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(made) == 2
    return srv, protos, clients


@needs_313
@pytest.mark.parametrize("how", ["close_clients", "abort_clients"])
def test_server_close_or_abort_clients(loop, run, how):
    async def main():
        srv, protos, clients = await _serve_two_clients(loop)
        srv.close()
        getattr(srv, how)()
        excs = await asyncio.wait_for(asyncio.gather(*(p.closed for p in protos)), 5)
        await asyncio.wait_for(srv.wait_closed(), 5)
        # the peers see the close (EOF) or the reset
        for r, w in clients:
            try:
                data = await asyncio.wait_for(r.read(), 5)
                assert data == b""
            except ConnectionResetError:
                assert how == "abort_clients"
            w.close()
        return [type(e).__name__ if e else None for e in excs]

    assert run(main()) == [None, None]


@needs_313
def test_server_wait_closed_waits_for_clients(loop, run):
    """3.13 Server tracks its transports (_attach/_detach take them):
    wait_closed() returns only once every client connection is gone."""
    async def main():
        srv, protos, clients = await _serve_two_clients(loop)
        srv.close()
        waiter = asyncio.ensure_future(srv.wait_closed())
        await asyncio.sleep(0.1)
        assert not waiter.done()
        for r, w in clients:
            w.close()
        await asyncio.wait_for(waiter, 5)

    run(main())


@needs_313
@pytest.mark.parametrize("keep_alive", [True, False])
def test_create_server_keep_alive(loop, run, keep_alive):
    async def main():
        made = []
        srv = await loop.create_server(lambda: _Sink(loop, made), "127.0.0.1", 0,
                                       keep_alive=keep_alive)
        ls = srv.sockets[0]
        opt = ls.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        srv.close()
        await srv.wait_closed()
        return bool(opt)

    assert run(main()) is keep_alive


@needs_313
@pytest.mark.parametrize("cleanup", [True, False, None])
def test_create_unix_server_cleanup_socket(loop, run, tmp_path, cleanup):
    path = str(tmp_path / "srv.sock")

    async def main():
        kw = {} if cleanup is None else {"cleanup_socket": cleanup}
        srv = await loop.create_unix_server(asyncio.Protocol, path, **kw)
        assert os.path.exists(path)
        srv.close()
        await srv.wait_closed()
        return os.path.exists(path)

    # cleanup_socket defaults to True
    assert run(main()) is (cleanup is False)


@needs_313
def test_unix_server_cleanup_spares_a_replaced_file(loop, run, tmp_path):
    """The path is unlinked only if it is still the socket the server made."""
    path = str(tmp_path / "srv.sock")

    async def main():
        srv = await loop.create_unix_server(asyncio.Protocol, path)
        os.unlink(path)
        with open(path, "w") as f:
            f.write("someone else's")
        srv.close()
        await srv.wait_closed()
        return open(path).read()

    assert run(main()) == "someone else's"


# ---- 3.13.3+ / 3.14: create_task(**kwargs) ---------------------------------------

@needs_3133
def test_create_task_eager_start_kwarg(loop, run):
    async def main():
        async def quick():
            return 1
        t = loop.create_task(quick(), eager_start=True)
        return t.done()

    # 3.14 Task takes eager_start; 3.13.3+ passes it on and Task (3.13)
    # also accepts it.
    assert run(main()) is True


@needs_3133
def test_create_task_kwargs_reach_the_task_factory(loop, run):
    seen = []

    def factory(loop_, coro, **kwargs):
        seen.append(sorted(kwargs))
        return asyncio.Task(coro, loop=loop_, **kwargs)

    async def main():
        loop.set_task_factory(factory)
        try:
            async def f():
                return 3
            t = loop.create_task(f(), name="x", eager_start=False)
            assert await t == 3
            return t.get_name()
        finally:
            loop.set_task_factory(None)

    name = run(main())
    assert name == "x"
    assert seen and "eager_start" in seen[0]


def test_create_task_unknown_keyword(loop, run):
    """Whatever the interpreter does with a keyword create_task does not
    know, tideloop does the same (3.11-3.13.2: TypeError from create_task;
    later: the Task's own TypeError)."""
    async def main():
        async def f():
            pass
        c = f()
        try:
            loop.create_task(c, bogus=1)
        except TypeError as exc:
            return re.sub(r"^\S+\(\)", "F()", str(exc))
        finally:
            c.close()
        return None

    msg = run(main())
    assert msg is not None and "bogus" in msg


# ---- 3.14 ---------------------------------------------------------------------

@needs_314
def test_capture_and_print_call_graph(loop, run):
    async def leaf(ev):
        await ev.wait()

    async def mid(ev):
        await asyncio.create_task(leaf(ev), name="leaf")

    async def main():
        ev = asyncio.Event()
        m = asyncio.create_task(mid(ev), name="mid")
        await asyncio.sleep(0.01)
        leaf_task = next(t for t in asyncio.all_tasks() if t.get_name() == "leaf")
        graph = asyncio.capture_call_graph(leaf_task)
        buf = io.StringIO()
        asyncio.print_call_graph(leaf_task, file=buf)
        ev.set()
        await m
        return graph, buf.getvalue()

    graph, text = run(main())
    assert graph.future.get_name() == "leaf"
    assert [a.future.get_name() for a in graph.awaited_by] == ["mid"]
    assert "leaf()" in text and "mid()" in text


@needs_314
def test_asyncio_ps_and_pstree_see_tideloop_tasks(loop_name, tmp_path):
    """`python -m asyncio ps|pstree PID` read the tasks of a running process
    from outside; on tideloop they show the same tree as on the stock loop."""
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(f"""
        import asyncio, sys
        async def leaf():
            await asyncio.sleep(60)
        async def mid():
            await asyncio.create_task(leaf(), name="leaf-task")
        async def main():
            t = asyncio.create_task(mid(), name="mid-task")
            print("ready", flush=True)
            await t
        if {loop_name!r} == "tideloop":
            import tideloop
            tideloop.run(main())
        else:
            asyncio.run(main())
    """))
    proc = subprocess.Popen([sys.executable, str(app)], stdout=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        tree = subprocess.run([sys.executable, "-m", "asyncio", "pstree", str(proc.pid)],
                              capture_output=True, text=True, timeout=30)
        table = subprocess.run([sys.executable, "-m", "asyncio", "ps", str(proc.pid)],
                               capture_output=True, text=True, timeout=30)
    finally:
        proc.kill()
        proc.wait()
    if tree.returncode != 0 and "ermission" in tree.stderr:
        pytest.skip(f"this machine does not let us read another process: {tree.stderr[-200:]}")
    assert tree.returncode == 0, tree.stderr
    lines = [re.sub(r"\s+", " ", ln).strip(" │└├─") for ln in tree.stdout.splitlines()]
    expected_order = ["(T) Task-1", "main", "(T) mid-task", "mid", "(T) leaf-task", "leaf"]
    found = [next((i for i, ln in enumerate(lines) if ln.startswith(e)), None)
             for e in expected_order]
    assert None not in found and found == sorted(found), tree.stdout
    assert table.returncode == 0, table.stderr
    rows = {ln.split()[2]: ln for ln in table.stdout.splitlines()[2:] if ln.strip()}
    assert set(rows) == {"Task-1", "mid-task", "leaf-task"}
    assert "mid-task" in rows["leaf-task"] and "Task-1" in rows["mid-task"]


@needs_314
def test_no_child_watchers_subprocess_works(loop, run):
    assert not hasattr(asyncio, "get_child_watcher")

    async def main():
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "print('hi')", stdout=subprocess.PIPE)
        out, _ = await p.communicate()
        return p.returncode, out

    assert run(main()) == (0, b"hi\n")


def test_asyncio_run_with_loop_factory_no_warnings(loop_name):
    code = textwrap.dedent("""
        import asyncio, sys, warnings
        warnings.simplefilter("error")
        async def main():
            return type(asyncio.get_running_loop()).__module__
        if sys.argv[1] == "tideloop":
            import tideloop
            factory = tideloop.new_event_loop
            tideloop.install()            # the policy route still works quietly
            print(asyncio.run(main()))
            print(tideloop.run(main()))
        else:
            factory = asyncio.SelectorEventLoop
        if sys.version_info >= (3, 12):
            print(asyncio.run(main(), loop_factory=factory))
        else:
            with asyncio.Runner(loop_factory=factory) as r:
                print(r.run(main()))
    """)
    env = child_env()
    p = subprocess.run([sys.executable, "-c", code, loop_name], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    want = "tideloop" if loop_name == "tideloop" else "asyncio.unix_events"
    assert set(p.stdout.split()) == {want}
