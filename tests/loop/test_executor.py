"""run_in_executor, default executor, shutdown_default_executor."""
import asyncio
import concurrent.futures
import threading

import pytest


def test_run_in_executor_default(loop):
    main_ident = threading.get_ident()

    def work(a, b):
        return a + b, threading.get_ident(), threading.current_thread().name

    async def main():
        return await loop.run_in_executor(None, work, 2, 3)

    res, ident, name = loop.run_until_complete(main())
    assert res == 5
    assert ident != main_ident
    assert name.startswith("asyncio")


def test_run_in_executor_returns_future_on_loop(loop):
    fut = loop.run_in_executor(None, lambda: "x")
    assert isinstance(fut, asyncio.Future)
    assert fut.get_loop() is loop
    assert loop.run_until_complete(fut) == "x"


def test_run_in_executor_exception(loop):
    def bad():
        raise KeyError("in thread")

    with pytest.raises(KeyError, match="in thread"):
        loop.run_until_complete(loop.run_in_executor(None, bad))


def test_run_in_executor_custom_executor(loop):
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="custom") as ex:
        name = loop.run_until_complete(
            loop.run_in_executor(ex, lambda: threading.current_thread().name))
    assert name.startswith("custom")


def test_run_in_executor_many_parallel(loop):
    async def main():
        return await asyncio.gather(*(loop.run_in_executor(None, pow, i, 2) for i in range(50)))

    assert loop.run_until_complete(main()) == [i * i for i in range(50)]


def test_set_default_executor(loop):
    ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dflt")
    try:
        loop.set_default_executor(ex)
        name = loop.run_until_complete(
            loop.run_in_executor(None, lambda: threading.current_thread().name))
        assert name.startswith("dflt")
    finally:
        ex.shutdown(wait=True)


@pytest.mark.parametrize("bad", [object(), None, 1])
def test_set_default_executor_type_error(loop, bad):
    with pytest.raises(TypeError, match="^executor must be ThreadPoolExecutor instance$"):
        loop.set_default_executor(bad)


def test_set_default_executor_rejects_process_pool(loop):
    ex = concurrent.futures.ProcessPoolExecutor(1)
    try:
        with pytest.raises(TypeError, match="^executor must be ThreadPoolExecutor instance$"):
            loop.set_default_executor(ex)
    finally:
        ex.shutdown(wait=False)


def test_shutdown_default_executor(loop):
    threads = []

    def work():
        threads.append(threading.current_thread())
        return 1

    assert loop.run_until_complete(loop.run_in_executor(None, work)) == 1
    loop.run_until_complete(loop.shutdown_default_executor())
    # the worker thread was joined
    assert not threads[0].is_alive()
    with pytest.raises(RuntimeError, match="^Executor shutdown has been called$"):
        loop.run_in_executor(None, work)
    # a custom executor is still usable
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        assert loop.run_until_complete(loop.run_in_executor(ex, work)) == 1


def test_shutdown_default_executor_without_executor(loop):
    assert loop.run_until_complete(loop.shutdown_default_executor()) is None


def test_close_shuts_down_default_executor(new_loop):
    lp = new_loop()

    def work():
        return threading.current_thread()

    t = lp.run_until_complete(lp.run_in_executor(None, work))
    lp.close()
    t.join(timeout=10)
    assert not t.is_alive()


def test_run_in_executor_on_closed_loop(new_loop):
    lp = new_loop()
    lp.close()
    with pytest.raises(RuntimeError, match="^Event loop is closed$"):
        lp.run_in_executor(None, print)


def test_to_thread(loop):
    async def main():
        return await asyncio.to_thread(lambda x: x * 3, 5)

    assert loop.run_until_complete(main()) == 15
