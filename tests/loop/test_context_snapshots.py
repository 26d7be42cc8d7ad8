"""Every callback runs in a copy of the context current when it was scheduled.

tideloop implements the copy as a snapshot of the context's variables
installed into a reused Context (see handle.c); these tests pin down that
nothing of the sharing is observable: isolation between callbacks, values as
of scheduling time, Tokens, nested contexts, threads and get_context().
"""
import asyncio
import contextvars
import threading

import pytest

var = contextvars.ContextVar("snapshot_var", default="unset")


def run_callbacks(loop, *callbacks):
    for cb in callbacks:
        loop.call_soon(cb)
    loop.call_soon(loop.stop)
    loop.run_forever()


def test_changes_do_not_leak_between_callbacks(loop):
    seen = []

    def writer():
        seen.append(("w", var.get()))
        var.set("written")
        seen.append(("w2", var.get()))

    def reader():
        seen.append(("r", var.get()))

    run_callbacks(loop, writer, reader, writer, reader)
    assert seen == [("w", "unset"), ("w2", "written"), ("r", "unset"),
                    ("w", "unset"), ("w2", "written"), ("r", "unset")]
    assert var.get() == "unset"


def test_value_is_taken_at_scheduling_time(loop):
    seen = []
    token = var.set("early")
    try:
        loop.call_soon(lambda: seen.append(var.get()))
        var.set("late")
        loop.call_soon(lambda: seen.append(var.get()))
    finally:
        var.reset(token)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == ["early", "late"]


def test_callback_scheduled_from_callback_sees_its_changes(loop):
    seen = []

    def parent():
        var.set("from-parent")
        loop.call_soon(lambda: seen.append(var.get()))

    run_callbacks(loop, parent)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == ["from-parent"]


def test_token_from_one_callback_cannot_reset_in_another(loop):
    tokens, errors = [], []

    def setter():
        tokens.append(var.set("x"))

    def resetter():
        try:
            var.reset(tokens[0])
        except ValueError as exc:
            errors.append(str(exc))

    run_callbacks(loop, setter, resetter)
    assert len(errors) == 1 and "different Context" in errors[0]


def test_token_reset_within_one_callback(loop):
    seen = []

    def cb():
        token = var.set("inner")
        seen.append(var.get())
        var.reset(token)
        seen.append(var.get())

    run_callbacks(loop, cb, cb)
    assert seen == ["inner", "unset", "inner", "unset"]


def test_copy_context_inside_callback_is_independent(loop):
    copies = []

    def cb():
        var.set("in-cb")
        copies.append(contextvars.copy_context())

    run_callbacks(loop, cb)
    run_callbacks(loop, lambda: var.set("other"))
    assert copies[0][var] == "in-cb"


def test_explicit_context_is_entered_and_keeps_changes(loop):
    ctx = contextvars.copy_context()
    run_callbacks(loop)  # warm up the loop
    loop.call_soon(var.set, "kept", context=ctx)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ctx[var] == "kept"
    assert var.get() == "unset"


def test_callback_running_ctx_run_on_its_own_copy(loop):
    """A callback can enter another context and come back."""
    seen = []
    other = contextvars.copy_context()

    def cb():
        var.set("outer")
        other.run(lambda: seen.append(var.get()))
        seen.append(var.get())

    run_callbacks(loop, cb)
    assert seen == ["unset", "outer"]


def test_threadsafe_uses_posting_threads_context(loop):
    seen = []

    def post():
        var.set("thread")
        loop.call_soon_threadsafe(lambda: seen.append(var.get()))
        loop.call_soon_threadsafe(loop.stop)

    t = threading.Thread(target=post)
    loop.call_soon(t.start)
    loop.run_forever()
    t.join()
    assert seen == ["thread"]


def test_timer_callbacks_are_isolated(loop):
    seen = []

    def a():
        var.set("a")
        seen.append(var.get())

    def b():
        seen.append(var.get())
        loop.stop()

    loop.call_later(0.001, a)
    loop.call_later(0.002, b)
    loop.run_forever()
    assert seen == ["a", "unset"]


def test_get_context_returns_the_context_the_callback_runs_in(loop):
    if not hasattr(loop.call_soon(lambda: None), "get_context"):
        pytest.skip("Handle.get_context() is 3.12+ on stock asyncio")
    seen = []
    h = loop.call_soon(lambda: seen.append(var.get()))
    ctx = h.get_context()
    assert isinstance(ctx, contextvars.Context)
    assert h.get_context() is ctx
    ctx.run(var.set, "via-get-context")
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert seen == ["via-get-context"]


def test_tasks_keep_their_own_context(loop):
    async def child(tag):
        var.set(tag)
        await asyncio.sleep(0)
        return var.get()

    async def main():
        return await asyncio.gather(child("a"), child("b"), child("c"))

    assert loop.run_until_complete(main()) == ["a", "b", "c"]
    assert var.get() == "unset"
