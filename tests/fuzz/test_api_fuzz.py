"""API fuzzing: public loop, handle and transport methods called
with wrong types, huge and negative numbers, NaN, closed objects and
re-entrant calls.  The only acceptable outcomes are a return value or one of
the exceptions asyncio itself raises for bad input -- never a crash.

TIDELOOP_FUZZ_EXAMPLES sets the number of examples (CI: the default 60).
"""
import asyncio
import math
import numbers
import os
import socket

import pytest
from hypothesis import given, settings, strategies as st

EXAMPLES = int(os.environ.get("TIDELOOP_FUZZ_EXAMPLES", "60"))

ACCEPTABLE = (TypeError, ValueError, RuntimeError, OSError, OverflowError,
              AttributeError, NotImplementedError, KeyError, IndexError,
              asyncio.InvalidStateError)


def _noop(*args):
    return None


async def _coro():
    return None


WEIRD = st.sampled_from([
    None, 0, -1, 1, 2 ** 63, -(2 ** 63), 2 ** 200, 1.5, -1.5, math.nan,
    math.inf, -math.inf, "str", b"bytes", bytearray(b"ba"), memoryview(b"mv"),
    (), [], {}, object(), _noop, print, len, int, type, Exception("x"),
    socket.SOCK_STREAM, 10 ** 6, "127.0.0.1",
])

LOOP_METHODS = [
    "call_soon", "call_soon_threadsafe", "call_later", "call_at", "time",
    "stop", "is_running", "is_closed", "get_debug", "set_debug",
    "add_reader", "remove_reader", "add_writer", "remove_writer",
    "create_future", "create_task", "set_task_factory", "get_task_factory",
    "set_exception_handler", "get_exception_handler",
    "call_exception_handler", "default_exception_handler",
    "add_signal_handler", "remove_signal_handler", "run_in_executor",
    "set_default_executor", "sock_recv", "sock_recv_into", "sock_sendall",
    "sock_accept",
]


def _loops():
    import tideloop
    return [("asyncio", asyncio.SelectorEventLoop),
            ("tideloop", tideloop.new_event_loop)]


def _call(loop, name, args, kwargs):
    method = getattr(loop, name)
    try:
        result = method(*args, **kwargs)
    except ACCEPTABLE:
        return "raised"
    # Coroutines / awaitables: drive them one step and close them.
    if hasattr(result, "send") and hasattr(result, "close"):
        try:
            result.send(None)
        except StopIteration:
            pass
        except ACCEPTABLE:
            pass
        finally:
            result.close()
    elif asyncio.isfuture(result):
        result.cancel()
    return "returned"


@settings(max_examples=EXAMPLES, deadline=None)
@given(name=st.sampled_from(LOOP_METHODS),
       args=st.lists(WEIRD, max_size=4),
       kw=st.dictionaries(st.sampled_from(["context", "name", "n", "sock"]),
                          WEIRD, max_size=1),
       closed=st.booleans())
def test_loop_methods_with_bad_input(name, args, kw, closed):
    for _, factory in _loops():
        loop = factory()
        try:
            if closed:
                loop.close()
            _call(loop, name, args, kw)
            if not loop.is_closed():
                # Whatever was scheduled runs (and fails) without a crash.
                loop.set_exception_handler(lambda lp, ctx: None)
                loop.call_soon(loop.stop)
                try:
                    loop.run_forever()
                except ACCEPTABLE:
                    pass
        finally:
            try:
                for sig in list(getattr(loop, "_signal_handlers", {})):
                    loop.remove_signal_handler(sig)
            except ACCEPTABLE:
                pass
            loop.close()


def _timer_outcome(factory, method, when):
    """The exception type that scheduling a timer at/after ``when`` and
    running one iteration raises (None if none): tideloop may raise at
    scheduling, the stock loop in the run, when the heap or the clock meets
    ``when``; the type must agree."""
    loop = factory()
    try:
        getattr(loop, method)(when, _noop)
        loop.call_soon(loop.stop)
        loop.run_forever()
    except Exception as exc:
        return type(exc)
    finally:
        loop.close()
    return None


@settings(max_examples=EXAMPLES, deadline=None)
@given(method=st.sampled_from(["call_at", "call_later"]),
       when=WEIRD.filter(lambda v: not isinstance(v, numbers.Real)))
def test_timers_with_non_numbers_fail_alike(method, when):
    outcomes = {name: _timer_outcome(factory, method, when) for name, factory in _loops()}
    assert outcomes["tideloop"] == outcomes["asyncio"] == TypeError, outcomes


@settings(max_examples=EXAMPLES, deadline=None)
@given(ops=st.lists(st.sampled_from(
    ["cancel", "cancel", "when", "repr", "cancelled", "run_loop",
     "close_loop", "hash", "compare"]), max_size=8))
def test_handles_in_any_state(ops):
    for _, factory in _loops():
        loop = factory()
        handles = [loop.call_soon(_noop), loop.call_later(0.001, _noop),
                   loop.call_at(loop.time() + 1000, _noop)]
        for op in ops:
            for h in handles:
                if op == "cancel":
                    h.cancel()
                elif op == "when" and hasattr(h, "when"):
                    h.when()
                elif op == "repr":
                    repr(h)
                elif op == "cancelled":
                    h.cancelled()
                elif op == "hash" and hasattr(h, "when"):
                    hash(h)
                elif op == "compare" and hasattr(h, "when"):
                    try:
                        h < handles[1]
                    except TypeError:
                        pass
            if op == "run_loop" and not loop.is_closed():
                loop.call_soon(loop.stop)
                loop.run_forever()
            elif op == "close_loop":
                loop.close()
        loop.close()


def _transport_outcomes(loop, bad):
    a, b = socket.socketpair()

    async def main():
        tr, pr = await loop.create_connection(asyncio.Protocol, sock=a)
        outcomes = []
        for name, args in [("write", (bad,)), ("writelines", (bad,)),
                           ("set_write_buffer_limits", (bad,)),
                           ("get_extra_info", (bad,)), ("set_protocol", (bad,))]:
            try:
                getattr(tr, name)(*args)
                outcomes.append((name, "ok"))
            except ACCEPTABLE as exc:
                outcomes.append((name, type(exc).__name__))
        tr.abort()
        tr.abort()
        tr.close()
        for name in ("write", "write_eof", "pause_reading", "resume_reading"):
            try:
                getattr(tr, name)(*((b"x",) if name == "write" else ()))
            except ACCEPTABLE:
                pass
        await asyncio.sleep(0.01)
        return outcomes

    try:
        return loop.run_until_complete(main())
    finally:
        b.close()
        loop.close()


@pytest.mark.parametrize("bad", [None, "str", 1.5, object(), [b"a", 1], -5])
def test_transport_methods_with_bad_input(bad):
    """The same exception types as asyncio's transport, method by method."""
    results = {name: _transport_outcomes(factory(), bad)
               for name, factory in _loops()}
    assert results["tideloop"] == results["asyncio"]


def _call_all(tr, calls, acceptable=ACCEPTABLE):
    outcomes = []
    for name, args in calls:
        try:
            getattr(tr, name)(*args)
            outcomes.append((name, "ok"))
        except acceptable as exc:
            outcomes.append((name, type(exc).__name__))
    return outcomes


def _datagram_outcomes(loop, bad, connected):
    reports = []
    loop.set_exception_handler(
        lambda lp, ctx: reports.append(
            ("handler", ctx["message"], type(ctx.get("exception")).__name__)))

    class Proto(asyncio.DatagramProtocol):
        def error_received(self, exc):
            reports.append(("error_received", type(exc).__name__))

        def connection_lost(self, exc):
            reports.append(("connection_lost", type(exc).__name__))

    async def main():
        kw = ({"remote_addr": ("127.0.0.1", 9)} if connected
              else {"local_addr": ("127.0.0.1", 0)})
        tr, pr = await loop.create_datagram_endpoint(Proto, **kw)
        outcomes = _call_all(tr, [
            ("sendto", (bad,)), ("sendto", (b"x", bad)),
            ("set_write_buffer_limits", (bad,)), ("get_extra_info", (bad,)),
            ("set_write_buffer_limits", (bad,))])
        tr.abort()
        tr.abort()
        tr.close()
        outcomes += _call_all(tr, [("sendto", (b"x",)), ("pause_reading", ()),
                                   ("resume_reading", ())])
        await asyncio.sleep(0.01)
        return outcomes + reports

    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize("connected", [False, True])
@pytest.mark.parametrize("bad", [None, "str", 1.5, object(), ("127.0.0.1",),
                                 ("nohost.invalid", 1), -5])
def test_datagram_transport_methods_with_bad_input(bad, connected):
    """Datagram transports: asyncio's exceptions, or its error_received/
    exception-handler path, method by method."""
    results = {name: _datagram_outcomes(factory(), bad, connected)
               for name, factory in _loops()}
    assert results["tideloop"] == results["asyncio"]


def _pipe_outcomes(loop, bad):
    r, w = os.pipe()
    rf, wf = os.fdopen(r, "rb"), os.fdopen(w, "wb")

    async def main():
        rt, _ = await loop.connect_read_pipe(asyncio.Protocol, rf)
        wt, _ = await loop.connect_write_pipe(asyncio.Protocol, wf)
        # The stock write pipe asserts its argument's type.
        acceptable = ACCEPTABLE + (AssertionError,)
        outcomes = _call_all(wt, [("write", (bad,)), ("writelines", (bad,)),
                                  ("set_write_buffer_limits", (bad,)),
                                  ("get_extra_info", (bad,))], acceptable)
        outcomes += _call_all(rt, [("get_extra_info", (bad,)),
                                   ("pause_reading", ()), ("resume_reading", ())])
        wt.abort()
        wt.abort()
        wt.close()
        rt.close()
        rt.close()
        outcomes += _call_all(wt, [("write", (b"x",)), ("write_eof", ())],
                              acceptable)
        outcomes += _call_all(rt, [("pause_reading", ()), ("resume_reading", ())])
        await asyncio.sleep(0.01)
        return outcomes

    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize("bad", [None, "str", 1.5, object(), [b"a", 1], -5])
def test_pipe_transport_methods_with_bad_input(bad):
    results = {name: _pipe_outcomes(factory(), bad)
               for name, factory in _loops()}
    assert results["tideloop"] == results["asyncio"]
