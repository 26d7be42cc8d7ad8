"""call_soon, the ready queue's snapshot semantics, Handle, contexts, reprs."""
import asyncio
import contextvars
import functools
import re

import pytest

from loop_helpers import norm, shown_args, stop_after

HERE = __file__


def test_call_soon_fifo(loop):
    out = []
    for i in range(100):
        loop.call_soon(out.append, i)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == list(range(100))


def test_call_soon_passes_args(loop):
    out = []

    def cb(*args):
        out.append(args)

    loop.call_soon(cb)
    loop.call_soon(cb, 1)
    loop.call_soon(cb, 1, "two", None)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == [(), (1,), (1, "two", None)]


def test_callbacks_scheduled_by_callbacks_run_next_iteration(loop):
    out = []

    def a():
        out.append("a")
        loop.call_soon(out.append, "a2")

    def b():
        out.append("b")
        loop.call_soon(out.append, "b2")

    loop.call_soon(a)
    loop.call_soon(b)
    loop.call_soon(out.append, "c")
    stop_after(loop, 0.05)
    loop.run_forever()
    assert out == ["a", "b", "c", "a2", "b2"]


def test_stop_from_callback_snapshot(loop):
    """stop() inside a callback: callbacks already queued in this iteration
    still run; callbacks scheduled during it wait for the next run."""
    out = []

    def first():
        out.append("first")
        loop.stop()
        loop.call_soon(out.append, "later")

    loop.call_soon(first)
    loop.call_soon(out.append, "queued1")
    loop.call_soon(out.append, "queued2")
    loop.run_forever()
    assert out == ["first", "queued1", "queued2"]

    # the callback scheduled during the stopped iteration runs on the next run
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == ["first", "queued1", "queued2", "later"]


def test_self_rescheduling_callback_yields_to_others(loop):
    """A callback that reschedules itself must not starve later callbacks."""
    out = []
    count = [0]

    def spin():
        count[0] += 1
        out.append("spin")
        if count[0] < 3:
            loop.call_soon(spin)

    loop.call_soon(spin)
    loop.call_soon(out.append, "other")
    loop.call_later(0.02, loop.stop)
    loop.run_forever()
    assert out == ["spin", "other", "spin", "spin"]


def test_handle_cancel_before_run(loop):
    out = []
    h = loop.call_soon(out.append, "x")
    assert h.cancelled() is False
    h.cancel()
    assert h.cancelled() is True
    h.cancel()  # idempotent
    assert h.cancelled() is True
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == []


def test_cancel_handle_from_earlier_callback_same_iteration(loop):
    out = []
    handles = {}

    def a():
        out.append("a")
        handles["b"].cancel()

    loop.call_soon(a)
    handles["b"] = loop.call_soon(out.append, "b")
    loop.call_soon(out.append, "c")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert out == ["a", "c"]


def test_cancel_after_run_is_harmless(loop):
    out = []
    h = loop.call_soon(out.append, 1)
    loop.call_soon(loop.stop)
    loop.run_forever()
    h.cancel()
    assert h.cancelled() is True
    assert out == [1]


# --- contexts ---------------------------------------------------------------

var = contextvars.ContextVar("var", default="default")


def test_default_context_is_copied_per_callback(loop):
    seen = []

    def setter():
        var.set("set-in-callback")
        seen.append(("setter", var.get()))

    def reader():
        seen.append(("reader", var.get()))

    loop.call_soon(setter)
    loop.call_soon(reader)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == [("setter", "set-in-callback"), ("reader", "default")]
    assert var.get() == "default"


def test_context_captured_at_schedule_time(loop):
    seen = []
    token = var.set("outer")
    try:
        loop.call_soon(lambda: seen.append(var.get()))
        loop.call_later(0, lambda: seen.append(var.get()))
    finally:
        var.reset(token)
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert seen == ["outer", "outer"]


@pytest.mark.parametrize("method", ["call_soon", "call_later", "call_at", "call_soon_threadsafe"])
def test_explicit_context_argument(loop, method):
    ctx = contextvars.copy_context()
    ctx.run(var.set, "in-ctx")
    seen = []

    def cb(arg):
        seen.append((arg, var.get()))
        var.set("changed-by-callback")

    fn = getattr(loop, method)
    if method == "call_later":
        h = fn(0, cb, "x", context=ctx)
    elif method == "call_at":
        h = fn(loop.time(), cb, "x", context=ctx)
    else:
        h = fn(cb, "x", context=ctx)
    # Handle.get_context() is 3.12+; a loop that offers it must return ctx
    if hasattr(h, "get_context"):
        assert h.get_context() is ctx
    loop.call_later(0.01, loop.stop)
    loop.run_forever()
    assert seen == [("x", "in-ctx")]
    # the callback ran *inside* ctx, so its change is visible there
    assert ctx[var] == "changed-by-callback"
    assert var.get() == "default"


def test_get_context_matches_stock_availability(loop):
    """CPython 3.11's Handle has no get_context() (added in 3.12); if a loop
    offers it anyway, it must return the callback's Context."""
    h = loop.call_soon(lambda: None)
    th = loop.call_later(10, lambda: None)
    for handle in (h, th):
        if hasattr(handle, "get_context"):
            assert isinstance(handle.get_context(), contextvars.Context)
    th.cancel()
    h.cancel()


def test_context_not_leaked_after_exception(loop):
    seen = []
    loop.set_exception_handler(lambda lp, c: seen.append("handler"))

    def bad():
        var.set("bad")
        raise ValueError

    loop.call_soon(bad)
    loop.call_soon(lambda: seen.append(var.get()))
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == ["handler", "default"]
    assert var.get() == "default"


# --- reprs ------------------------------------------------------------------


def plain_cb(*args):
    pass


PLAIN_LINE = plain_cb.__code__.co_firstlineno


class Obj:
    def meth(self):
        pass


def test_handle_repr_function(loop):
    h = loop.call_soon(plain_cb)
    assert repr(h) == f"<Handle plain_cb() at {HERE}:{PLAIN_LINE}>"
    h2 = loop.call_soon(plain_cb, 1, "a")
    args = shown_args("(1, 'a')")
    assert repr(h2) == f"<Handle plain_cb{args} at {HERE}:{PLAIN_LINE}>"


def test_handle_repr_builtin_and_partial_and_method(loop):
    assert repr(loop.call_soon(print, "hi")) == "<Handle print" + shown_args("('hi')") + ">"
    p = functools.partial(plain_cb, 1)
    assert repr(loop.call_soon(p, 2)) == (
        f"<Handle plain_cb{shown_args('(1)')}{shown_args('(2)')} at {HERE}:{PLAIN_LINE}>"
    )
    assert repr(loop.call_soon(Obj().meth)) == "<Handle Obj.meth()>"


def test_handle_repr_cancelled(loop):
    h = loop.call_soon(plain_cb)
    h.cancel()
    assert repr(h) == "<Handle cancelled>"


def test_timer_handle_repr(loop):
    when = loop.time() + 100
    th = loop.call_at(when, plain_cb, 3)
    assert repr(th) == (
        f"<TimerHandle when={when} plain_cb{shown_args('(3)')} at {HERE}:{PLAIN_LINE}>")
    th.cancel()
    assert repr(th) == f"<TimerHandle cancelled when={when}>"


def test_handle_repr_matches_stock_loop(loop):
    """Normalised reprs of the same calls must be identical to stock asyncio's."""
    ref = asyncio.SelectorEventLoop()
    ref.set_debug(False)
    try:
        calls = [
            lambda lp: lp.call_soon(plain_cb, [1, 2], {"k": Obj}),
            lambda lp: lp.call_soon(plain_cb, Obj()),
            lambda lp: lp.call_soon(functools.partial(plain_cb, a=1)),
            lambda lp: lp.call_soon(Obj().meth),
            lambda lp: lp.call_soon(len, "x" * 100),
            lambda lp: lp.call_at(12345.5, plain_cb),
        ]
        for make in calls:
            got, want = make(loop), make(ref)
            assert norm(repr(got)) == norm(repr(want))
            got.cancel()
            want.cancel()
            assert norm(repr(got)) == norm(repr(want))
    finally:
        ref.close()


def test_call_soon_returns_handle_type_name(loop):
    h = loop.call_soon(plain_cb)
    th = loop.call_later(1, plain_cb)
    assert type(h).__name__ == "Handle"
    assert type(th).__name__ == "TimerHandle"
    th.cancel()
