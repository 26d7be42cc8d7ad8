"""Exceptions from callbacks, exception handlers, default handler logging."""
import asyncio
import logging

import pytest

from loop_helpers import norm, shown_args

HERE = __file__


def boom(*args):
    raise ValueError("boom")


BOOM_LINE = boom.__code__.co_firstlineno


def _run_one_iteration(loop):
    loop.call_soon(loop.stop)
    loop.run_forever()


def test_callback_exception_goes_to_handler(loop):
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append((lp, ctx)))
    h = loop.call_soon(boom, 1, "x")
    _run_one_iteration(loop)
    assert len(contexts) == 1
    lp, ctx = contexts[0]
    assert lp is loop
    assert set(ctx) == {"message", "exception", "handle"}
    args = shown_args("(1, 'x')")
    assert ctx["message"] == f"Exception in callback boom{args} at {HERE}:{BOOM_LINE}"
    assert isinstance(ctx["exception"], ValueError)
    assert ctx["exception"].args == ("boom",)
    assert ctx["exception"].__traceback__ is not None
    assert ctx["handle"] is h


def test_timer_callback_exception_goes_to_handler(loop):
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    th = loop.call_later(0, boom)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert len(contexts) == 1
    assert set(contexts[0]) == {"message", "exception", "handle"}
    assert contexts[0]["message"] == f"Exception in callback boom() at {HERE}:{BOOM_LINE}"
    assert contexts[0]["handle"] is th


def test_exception_message_matches_stock_loop(loop):
    """Messages and handle reprs agree with stock asyncio after normalising."""

    class Thing:
        def method(self):
            raise KeyError("k")

    callbacks = [(boom, (1, [2])), (Thing().method, ()), (int, ("x",))]
    ref = asyncio.SelectorEventLoop()
    ref.set_debug(False)
    try:
        results = []
        for lp in (loop, ref):
            got = []
            lp.set_exception_handler(lambda _lp, ctx, got=got: got.append(
                (norm(ctx["message"]), norm(repr(ctx["handle"])), type(ctx["exception"]))))
            for cb, args in callbacks:
                lp.call_soon(cb, *args)
            _run_one_iteration(lp)
            results.append(got)
        assert results[0] == results[1]
        assert len(results[0]) == 3
    finally:
        ref.close()


def test_loop_keeps_running_after_exceptions(loop):
    out = []
    loop.set_exception_handler(lambda lp, ctx: out.append("handler"))
    loop.call_soon(boom)
    loop.call_soon(out.append, "after-1")
    loop.call_later(0.01, boom)
    loop.call_later(0.02, out.append, "after-2")
    loop.call_later(0.03, loop.stop)
    loop.run_forever()
    assert out == ["handler", "after-1", "handler", "after-2"]


def test_default_handler_logs_error(loop, caplog):
    h = loop.call_soon(boom)
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        _run_one_iteration(loop)
    recs = [r for r in caplog.records if r.name == "asyncio"]
    assert len(recs) == 1
    rec = recs[0]
    assert rec.levelno == logging.ERROR
    assert rec.getMessage() == (
        f"Exception in callback boom() at {HERE}:{BOOM_LINE}\n"
        f"handle: {h!r}"
    )
    assert rec.exc_info is not None and rec.exc_info[0] is ValueError


def test_set_exception_handler_type_error(loop):
    with pytest.raises(TypeError, match="^A callable object or None is expected, got 1$"):
        loop.set_exception_handler(1)
    assert loop.get_exception_handler() is None


def test_get_and_reset_exception_handler(loop, caplog):
    def handler(lp, ctx):
        pass

    assert loop.get_exception_handler() is None
    loop.set_exception_handler(handler)
    assert loop.get_exception_handler() is handler
    loop.set_exception_handler(None)
    assert loop.get_exception_handler() is None
    loop.call_soon(boom)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _run_one_iteration(loop)
    assert [r.levelno for r in caplog.records if r.name == "asyncio"] == [logging.ERROR]


def test_call_exception_handler_direct(loop):
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    ctx = {"message": "hello", "custom": 1}
    loop.call_exception_handler(ctx)
    assert contexts == [{"message": "hello", "custom": 1}]


def test_call_exception_handler_default_logs(loop, caplog):
    exc = OSError("disk")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.call_exception_handler({"message": "custom msg", "exception": exc, "zeta": 3, "alpha": "a"})
        loop.call_exception_handler({})
    msgs = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    # extra keys are sorted and repr()'d
    assert msgs == ["custom msg\nalpha: 'a'\nzeta: 3", "Unhandled exception in event loop"]


def test_default_exception_handler_callable_directly(loop, caplog):
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.default_exception_handler({"message": "direct"})
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == ["direct"]


def test_error_in_custom_handler(loop, caplog):
    def bad_handler(lp, ctx):
        raise RuntimeError("handler broke")

    loop.set_exception_handler(bad_handler)
    loop.call_soon(boom)
    loop.call_soon(lambda: None)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _run_one_iteration(loop)
    recs = [r for r in caplog.records if r.name == "asyncio"]
    assert len(recs) == 1
    msg = recs[0].getMessage()
    assert msg.startswith("Unhandled error in exception handler\ncontext: {")
    assert "'message': 'Exception in callback boom()" in msg
    assert recs[0].exc_info[0] is RuntimeError


def test_custom_handler_can_defer_to_default(loop, caplog):
    def handler(lp, ctx):
        lp.default_exception_handler(ctx)

    loop.set_exception_handler(handler)
    loop.call_soon(boom)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _run_one_iteration(loop)
    msgs = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(msgs) == 1 and msgs[0].startswith("Exception in callback boom()")


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_propagate_from_run_forever(loop, exc_type):
    out = []
    handler_calls = []
    loop.set_exception_handler(lambda lp, ctx: handler_calls.append(ctx))

    def raiser():
        raise exc_type("stop!")

    loop.call_soon(raiser)
    loop.call_soon(out.append, "next")
    loop.call_later(5, loop.stop)
    with pytest.raises(exc_type):
        loop.run_forever()
    assert handler_calls == []
    assert not loop.is_running()
    assert asyncio._get_running_loop() is None
    # the rest of the snapshot stays queued and runs on the next run
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == ["next"]


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_propagate_from_run_until_complete(loop, exc_type):
    async def main():
        await asyncio.sleep(0)
        raise exc_type()

    with pytest.raises(exc_type):
        loop.run_until_complete(main())
    assert not loop.is_running()


def test_keyboard_interrupt_from_custom_handler_propagates(loop):
    def handler(lp, ctx):
        raise KeyboardInterrupt

    loop.set_exception_handler(handler)
    loop.call_soon(boom)
    loop.call_later(5, loop.stop)
    with pytest.raises(KeyboardInterrupt):
        loop.run_forever()


def test_exception_in_task_reported_when_not_retrieved_is_via_handler(loop):
    import gc

    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

    async def bad():
        raise ValueError("task boom")

    task = loop.create_task(bad())
    loop.run_until_complete(asyncio.sleep(0.01))
    del task
    gc.collect()
    assert len(contexts) == 1
    assert contexts[0]["message"] == "Task exception was never retrieved"
    assert set(contexts[0]) >= {"message", "exception", "future"}
