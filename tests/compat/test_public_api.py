"""tideloop's public API, and run()/Runner contracts compared with asyncio."""
import asyncio
import sys

import pytest


@pytest.fixture
def run_func(loop_name):
    """asyncio.run for the stock param, tideloop.run for tideloop."""
    if loop_name == "asyncio":
        return asyncio.run
    import tideloop

    return tideloop.run


# --- tideloop only ------------------------------------------------------------


def test_tideloop_version():
    import tideloop

    assert isinstance(tideloop.__version__, str)
    assert tideloop.__version__
    from tideloop._version import __version__

    assert tideloop.__version__ == __version__


def test_tideloop_loop_is_abstract_event_loop():
    import tideloop

    assert isinstance(tideloop.Loop, type)
    assert issubclass(tideloop.Loop, asyncio.AbstractEventLoop)
    lp = tideloop.new_event_loop()
    try:
        assert type(lp) is tideloop.Loop or isinstance(lp, tideloop.Loop)
        assert isinstance(lp, asyncio.AbstractEventLoop)
    finally:
        lp.close()


def test_tideloop_loop_constructor():
    import tideloop

    lp = tideloop.Loop()
    try:
        assert lp.run_until_complete(asyncio.sleep(0, result=1)) == 1
    finally:
        lp.close()


def test_tideloop_policy_and_install():
    import tideloop

    saved = asyncio.get_event_loop_policy()
    try:
        policy = tideloop.EventLoopPolicy()
        assert isinstance(policy, asyncio.AbstractEventLoopPolicy)
        lp = policy.new_event_loop()
        assert isinstance(lp, tideloop.Loop)
        lp.close()

        tideloop.install()
        assert isinstance(asyncio.get_event_loop_policy(), tideloop.EventLoopPolicy)
        lp = asyncio.new_event_loop()
        try:
            assert isinstance(lp, tideloop.Loop)
        finally:
            lp.close()

        async def main():
            return type(asyncio.get_running_loop())

        assert issubclass(asyncio.run(main()), tideloop.Loop)
    finally:
        asyncio.set_event_loop_policy(saved)
    assert not isinstance(asyncio.get_event_loop_policy(), tideloop.EventLoopPolicy)


def test_tideloop_run_uses_tideloop_loop():
    import tideloop

    async def main():
        return asyncio.get_running_loop()

    lp = tideloop.run(main())
    assert isinstance(lp, tideloop.Loop)
    assert lp.is_closed()


def test_tideloop_runner_loop_factory():
    import tideloop

    async def main():
        await asyncio.sleep(0.001)
        return type(asyncio.get_running_loop())

    with asyncio.Runner(loop_factory=tideloop.new_event_loop) as runner:
        assert issubclass(runner.run(main()), tideloop.Loop)
        assert runner.run(asyncio.sleep(0, result="again")) == "again"


def test_tideloop_all_exports():
    import tideloop

    for name in ("Loop", "new_event_loop", "run", "EventLoopPolicy", "install", "__version__"):
        assert hasattr(tideloop, name), name
    if hasattr(tideloop, "__all__"):
        for name in tideloop.__all__:
            assert hasattr(tideloop, name), name


def test_tideloop_loop_has_abstract_loop_methods():
    """Every public AbstractEventLoop method exists on tideloop.Loop."""
    import tideloop

    missing = [
        name for name in dir(asyncio.AbstractEventLoop)
        if not name.startswith("_") and not hasattr(tideloop.Loop, name)
    ]
    assert missing == []


# --- run() contract, both loops ------------------------------------------------


def test_run_returns_value(run_func):
    async def main():
        await asyncio.sleep(0)
        return "value"

    assert run_func(main()) == "value"


def test_run_propagates_exception(run_func):
    async def main():
        raise LookupError("nope")

    with pytest.raises(LookupError, match="nope"):
        run_func(main())


def test_run_debug_flag(run_func):
    async def main():
        return asyncio.get_running_loop().get_debug()

    assert run_func(main(), debug=True) is True
    assert run_func(main(), debug=False) is False


def test_run_closes_loop_and_cancels_leftover_tasks(run_func):
    cancelled = []
    loops = []

    async def leftover():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        loops.append(asyncio.get_running_loop())
        asyncio.create_task(leftover())
        await asyncio.sleep(0)

    run_func(main())
    assert cancelled == [True]
    assert loops[0].is_closed()


def test_run_shuts_down_asyncgens(run_func):
    log = []
    keep = []

    async def agen():
        try:
            yield 1
            yield 2
        finally:
            log.append("finalized")

    async def main():
        g = agen()
        keep.append(g)
        await g.__anext__()

    run_func(main())
    assert log == ["finalized"]


def test_run_refuses_running_loop(run_func, loop):
    async def inner():
        pass

    async def main():
        coro = inner()
        try:
            with pytest.raises(RuntimeError, match="cannot be called from a running event loop"):
                run_func(coro)
        finally:
            coro.close()
        return "ok"

    assert loop.run_until_complete(main()) == "ok"


def test_run_requires_coroutine(run_func):
    # 3.14's Runner.run() takes any awaitable (and refuses anything else).
    if sys.version_info >= (3, 14):
        expected = pytest.raises(
            TypeError, match="^An asyncio.Future, a coroutine or an awaitable is required$")
    else:
        expected = pytest.raises(ValueError, match="a coroutine was expected")
    with expected:
        run_func(asyncio.sleep)


def test_run_leaves_no_current_loop(run_func):
    async def main():
        return 1

    assert run_func(main()) == 1
    assert asyncio._get_running_loop() is None
