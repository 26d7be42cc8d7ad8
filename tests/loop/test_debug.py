"""Debug mode: slow callbacks, wrong-thread checks, callback checks, unclosed loops."""
import asyncio
import gc
import logging
import re
import threading
import time
import warnings

import pytest

HERE = __file__


def slow():
    time.sleep(0.1)


def plain():
    pass


PLAIN_LINE = plain.__code__.co_firstlineno


async def coro_func():
    pass


def test_slow_callback_warning(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 0.05
    loop.call_soon(slow)
    loop.call_soon(plain)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_forever()
    msgs = [r.getMessage() for r in caplog.records
            if r.name == "asyncio" and r.levelno == logging.WARNING]
    assert len(msgs) == 1, msgs
    assert re.fullmatch(
        r"Executing <Handle slow\(\) at .*test_debug\.py:\d+ created at .*:\d+> "
        r"took \d+\.\d{3} seconds", msgs[0]), msgs[0]
    took = float(msgs[0].rsplit(" ", 2)[1])
    assert 0.09 <= took < 5


def test_slow_callback_duration_default_and_settable(loop):
    assert loop.slow_callback_duration == 0.1
    loop.slow_callback_duration = 0.5
    assert loop.slow_callback_duration == 0.5


def test_no_slow_callback_warning_without_debug(loop, caplog):
    loop.slow_callback_duration = 0.05
    loop.set_debug(False)
    loop.call_soon(slow)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        loop.run_forever()
    assert not [r for r in caplog.records if "Executing" in r.getMessage()]


def test_slow_task_step_warning(loop, caplog):
    loop.set_debug(True)
    loop.slow_callback_duration = 0.05

    async def main():
        time.sleep(0.1)

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_until_complete(main())
    msgs = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert any(m.startswith("Executing <Task ") and " took " in m for m in msgs), msgs


@pytest.mark.parametrize("method", ["call_soon", "call_later", "call_at"])
def test_wrong_thread_detected_in_debug(loop, method):
    loop.set_debug(True)
    errors = []
    started = threading.Event()

    def worker():
        started.wait(10)
        fn = getattr(loop, method)
        try:
            if method == "call_soon":
                fn(plain)
            elif method == "call_later":
                fn(1, plain)
            else:
                fn(loop.time() + 1, plain)
        except RuntimeError as e:
            errors.append(str(e))
        finally:
            loop.call_soon_threadsafe(loop.stop)

    t = threading.Thread(target=worker)
    t.start()
    loop.call_soon(started.set)
    loop.call_later(10, loop.stop)
    loop.run_forever()
    t.join()
    assert errors == ["Non-thread-safe operation invoked on an event loop other than the current one"]


def test_wrong_thread_not_checked_when_not_running(loop):
    loop.set_debug(True)
    handles = []
    t = threading.Thread(target=lambda: handles.append(loop.call_soon(plain)))
    t.start()
    t.join()
    assert len(handles) == 1
    handles[0].cancel()


def test_wrong_thread_create_task_in_debug(loop):
    loop.set_debug(True)
    errors = []
    started = threading.Event()

    def worker():
        started.wait(10)
        coro = coro_func()
        try:
            loop.create_task(coro)
        except RuntimeError as e:
            errors.append(str(e))
        finally:
            coro.close()
            loop.call_soon_threadsafe(loop.stop)

    t = threading.Thread(target=worker)
    t.start()
    loop.call_soon(started.set)
    loop.call_later(10, loop.stop)
    loop.run_forever()
    t.join()
    assert errors == ["Non-thread-safe operation invoked on an event loop other than the current one"]


@pytest.mark.parametrize("method", ["call_soon", "call_soon_threadsafe"])
def test_debug_rejects_coroutines_and_non_callables(loop, method):
    loop.set_debug(True)
    fn = getattr(loop, method)
    with pytest.raises(TypeError, match=rf"^coroutines cannot be used with {method}\(\)$"):
        fn(coro_func)
    coro = coro_func()
    try:
        with pytest.raises(TypeError, match=rf"^coroutines cannot be used with {method}\(\)$"):
            fn(coro)
    finally:
        coro.close()
    with pytest.raises(TypeError, match=rf"^a callable object was expected by {method}\(\), got 1$"):
        fn(1)


def test_debug_rejects_in_call_at_and_call_later(loop):
    loop.set_debug(True)
    with pytest.raises(TypeError, match=r"^coroutines cannot be used with call_at\(\)$"):
        loop.call_at(loop.time() + 1, coro_func)
    with pytest.raises(TypeError, match=r"^a callable object was expected by call_at\(\), got 1$"):
        loop.call_at(loop.time() + 1, 1)
    # stock asyncio's call_later delegates to call_at and reports "call_at()"
    with pytest.raises(TypeError, match=r"^coroutines cannot be used with call_(at|later)\(\)$"):
        loop.call_later(1, coro_func)
    with pytest.raises(TypeError, match=r"^a callable object was expected by call_(at|later)\(\), got 1$"):
        loop.call_later(1, 1)


def test_debug_run_in_executor_rejects_coroutine_function(loop):
    loop.set_debug(True)
    with pytest.raises(TypeError, match=r"^coroutines cannot be used with run_in_executor\(\)$"):
        loop.run_in_executor(None, coro_func)


def test_non_debug_accepts_non_callable(loop):
    """Without debug, call_soon(1) is accepted; the TypeError surfaces in the
    exception handler when the callback runs (stock asyncio behaviour)."""
    loop.set_debug(False)
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    h = loop.call_soon(1)
    assert repr(h) == "<Handle 1()>"
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert len(contexts) == 1
    assert contexts[0]["message"] == "Exception in callback 1()"
    assert isinstance(contexts[0]["exception"], TypeError)
    assert str(contexts[0]["exception"]) == "'int' object is not callable"
    assert contexts[0]["handle"] is h


def test_debug_handle_repr_has_source(loop):
    import inspect

    loop.set_debug(True)
    h, h_line = loop.call_soon(plain), inspect.currentframe().f_lineno
    assert repr(h) == f"<Handle plain() at {HERE}:{PLAIN_LINE} created at {HERE}:{h_line}>"
    th, th_line = loop.call_later(5, plain), inspect.currentframe().f_lineno
    assert repr(th).startswith(f"<TimerHandle when={th.when()} plain() at {HERE}:{PLAIN_LINE}")
    assert repr(th).endswith(f" created at {HERE}:{th_line}>")
    # a cancelled handle keeps its repr in debug mode
    h.cancel()
    assert repr(h) == f"<Handle cancelled plain() at {HERE}:{PLAIN_LINE} created at {HERE}:{h_line}>"
    th.cancel()


def test_debug_exception_context_has_source_traceback(loop):
    loop.set_debug(True)
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

    def bad():
        raise ValueError

    loop.call_soon(bad)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert set(contexts[0]) == {"message", "exception", "handle", "source_traceback"}
    frames = contexts[0]["source_traceback"]
    assert frames[-1].filename == HERE
    assert frames[-1].name == "test_debug_exception_context_has_source_traceback"


def test_unclosed_loop_resource_warning(raw_loop_factory):
    lp = raw_loop_factory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lp
        gc.collect()
    msgs = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert any(m.startswith("unclosed event loop <") for m in msgs), msgs


def test_closed_loop_no_resource_warning(raw_loop_factory):
    lp = raw_loop_factory()
    lp.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lp
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.parametrize("how", ["env", "devmode", "none"])
def test_debug_mode_from_environment(run_script, how):
    env = {"PYTHONASYNCIODEBUG": "1"} if how == "env" else None
    flags = ("-X", "dev") if how == "devmode" else ()
    proc = run_script(
        """
        loop = new_loop()
        print(loop.get_debug())
        loop.close()
        """,
        env=env, pyflags=flags,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("False" if how == "none" else "True")


def test_set_debug_while_running_enables_checks(loop, caplog):
    loop.slow_callback_duration = 0.05

    def enable():
        loop.set_debug(True)

    loop.call_soon(enable)
    loop.call_later(0.01, slow)
    loop.call_later(0.2, loop.stop)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_forever()
    msgs = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(msgs) == 1 and msgs[0].startswith("Executing <TimerHandle ")


def test_coroutine_origin_tracking_in_debug(loop):
    import sys

    from asyncio import constants

    before = sys.get_coroutine_origin_tracking_depth()
    loop.set_debug(True)
    seen = []
    loop.call_soon(lambda: seen.append(sys.get_coroutine_origin_tracking_depth()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == [constants.DEBUG_STACK_DEPTH]
    assert sys.get_coroutine_origin_tracking_depth() == before
    loop.set_debug(False)
    loop.call_soon(lambda: seen.append(sys.get_coroutine_origin_tracking_depth()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen[1] == before


def test_debug_close_is_logged(new_loop, caplog):
    lp = new_loop()
    lp.set_debug(True)
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        lp.close()
    # the record is formatted lazily ("Close %r"), so closed= may read either way
    msgs = [rec.getMessage() for rec in caplog.records if rec.name == "asyncio"]
    assert len(msgs) == 1
    assert re.fullmatch(r"Close <\w+ running=False closed=(True|False) debug=True>", msgs[0]), msgs


def test_debug_default_handler_logs_source_traceback(loop, caplog):
    loop.set_debug(True)

    def bad():
        raise ValueError("dbg")

    loop.call_soon(bad)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.run_forever()
    msgs = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(msgs) == 1
    lines = msgs[0].split("\n")
    assert lines[0].startswith("Exception in callback ")
    assert lines[1].startswith("handle: <Handle ")
    assert lines[2] == "source_traceback: Object created at (most recent call last):"
    assert "test_debug_default_handler_logs_source_traceback" in msgs[0]


def test_debug_call_exception_handler_inside_callback_adds_handle_traceback(loop, caplog):
    loop.set_debug(True)

    def reporter():
        loop.call_exception_handler({"message": "reported from callback"})

    loop.call_soon(reporter)
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.run_forever()
    msgs = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(msgs) == 1
    lines = msgs[0].split("\n")
    assert lines[0] == "reported from callback"
    assert lines[1] == "handle_traceback: Handle created at (most recent call last):"
    assert "test_debug_call_exception_handler_inside_callback_adds_handle_traceback" in msgs[0]


def test_no_handle_traceback_without_debug(loop, caplog):
    loop.call_soon(lambda: loop.call_exception_handler({"message": "plain"}))
    loop.call_soon(loop.stop)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.run_forever()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == ["plain"]
