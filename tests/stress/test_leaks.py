"""Leak checks: repeat a workload, compare sys.getallocatedblocks(); GC of loops."""
import asyncio
import gc
import socket
import sys
import warnings
import weakref

import pytest

contexts_var = __import__("contextvars").ContextVar("leakvar", default=0)


def _blocks():
    gc.collect()
    gc.collect()
    return sys.getallocatedblocks()


def _check_no_growth(workload, rounds=3, tolerance=3_000):
    workload()  # warm up caches, freelists
    workload()
    before = _blocks()
    for _ in range(rounds):
        workload()
    after = _blocks()
    assert after - before < tolerance, f"grew by {after - before} blocks"


class Payload:
    pass


def _cb(*args):
    pass


def _bad(*args):
    raise ValueError("x" * 10)


def test_no_leak_call_soon_and_timers(loop):
    def workload():
        for i in range(5_000):
            loop.call_soon(_cb, Payload(), i)
            loop.call_later(0, _cb, Payload())
            loop.call_at(loop.time() + 100, _cb, Payload()).cancel()
        loop.call_later(0.001, loop.stop)
        loop.run_forever()

    _check_no_growth(workload)


def test_no_leak_exceptions_in_callbacks(loop):
    loop.set_exception_handler(lambda lp, ctx: None)

    def workload():
        for i in range(2_000):
            loop.call_soon(_bad, Payload())
            loop.call_later(0, _bad)
        loop.call_later(0.001, loop.stop)
        loop.run_forever()

    _check_no_growth(workload)


def test_no_leak_default_handler_logging(loop):
    import logging

    logger = logging.getLogger("asyncio")
    old = logger.disabled
    logger.disabled = True
    try:
        def workload():
            for i in range(500):
                loop.call_soon(_bad, Payload())
            loop.call_soon(loop.stop)
            loop.run_forever()

        _check_no_growth(workload)
    finally:
        logger.disabled = old


def test_no_leak_contexts_and_threadsafe(loop):
    def workload():
        for i in range(3_000):
            ctx = __import__("contextvars").copy_context()
            loop.call_soon(contexts_var.set, i, context=ctx)
            loop.call_soon_threadsafe(_cb, Payload())
        loop.call_soon(loop.stop)
        loop.run_forever()

    _check_no_growth(workload)


def test_no_leak_tasks_and_futures(loop):
    async def child(i):
        await asyncio.sleep(0)
        if i % 3 == 0:
            raise KeyError(i)
        return Payload()

    async def main():
        await asyncio.gather(*(child(i) for i in range(1_000)), return_exceptions=True)
        async with asyncio.timeout(10):
            for _ in range(200):
                await asyncio.sleep(0)

    _check_no_growth(lambda: loop.run_until_complete(main()))


def test_no_leak_readers_writers(loop):
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        def workload():
            for i in range(1_000):
                loop.add_reader(a.fileno(), _cb, Payload())
                loop.add_writer(a.fileno(), _cb, Payload())
                loop.remove_writer(a.fileno())
                loop.remove_reader(a.fileno())
            state = {"n": 0}

            def on_read():
                a.recv(1)
                state["n"] += 1
                if state["n"] == 200:
                    loop.remove_reader(a.fileno())
                    loop.stop()

            loop.add_reader(a.fileno(), on_read)
            b.send(b"x" * 200)
            loop.call_later(5, loop.stop)
            loop.run_forever()

        _check_no_growth(workload)
    finally:
        a.close()
        b.close()


def test_no_leak_loop_create_close(raw_loop_factory):
    def workload():
        for _ in range(100):
            lp = raw_loop_factory()
            lp.call_soon(_cb, Payload())
            lp.call_later(10, _cb, Payload())
            lp.run_until_complete(asyncio.sleep(0))
            lp.close()

    _check_no_growth(workload, tolerance=5_000)


class Holder:
    def __init__(self, lp):
        self.lp = lp

    def method(self):
        pass


def test_closed_loop_is_collected(raw_loop_factory):
    lp = raw_loop_factory()
    lp.call_later(100, Holder(lp).method)
    lp.run_until_complete(asyncio.sleep(0))
    lp.close()
    ref = weakref.ref(lp)
    del lp
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("where", ["ready", "timer", "reader"])
def test_unclosed_loop_in_cycle_is_collected(raw_loop_factory, where):
    """A cycle through a pending callback (loop -> handle -> bound method ->
    Holder -> loop) must be visible to the GC."""
    a, b = socket.socketpair()
    try:
        lp = raw_loop_factory()
        cb = Holder(lp).method
        if where == "ready":
            lp.call_soon(cb)
        elif where == "timer":
            lp.call_later(100, cb)
        else:
            lp.add_reader(a.fileno(), cb)
        ref = weakref.ref(lp)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            del lp, cb
            gc.collect()
            gc.collect()
        assert ref() is None
    finally:
        a.close()
        b.close()
