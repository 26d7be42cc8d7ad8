"""Async generator hooks and shutdown_asyncgens."""
import asyncio
import gc
import sys


def test_shutdown_asyncgens_finalizes_unexhausted_generator(loop):
    log = []

    async def agen():
        try:
            yield 1
            yield 2
        finally:
            log.append(("finalized", asyncio.get_running_loop() is loop))

    keep = []

    async def main():
        g = agen()
        keep.append(g)  # keep it alive so GC does not finalize it
        assert await g.__anext__() == 1

    loop.run_until_complete(main())
    assert log == []
    loop.run_until_complete(loop.shutdown_asyncgens())
    assert log == [("finalized", True)]


def test_asyncgen_finalized_by_gc_while_running(loop):
    log = []

    async def agen():
        try:
            yield 1
            yield 2
        finally:
            log.append("finalized")

    async def main():
        g = agen()
        await g.__anext__()
        del g
        gc.collect()
        for _ in range(5):
            await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert log == ["finalized"]


def test_asyncgen_hooks_installed_while_running_and_restored(loop):
    def first(agen):
        pass

    def fin(agen):
        pass

    old = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=first, finalizer=fin)
    try:
        seen = []

        async def main():
            seen.append(sys.get_asyncgen_hooks())

        loop.run_until_complete(main())
        hooks = seen[0]
        assert hooks.firstiter is not None and hooks.firstiter is not first
        assert hooks.finalizer is not None and hooks.finalizer is not fin
        after = sys.get_asyncgen_hooks()
        assert after.firstiter is first
        assert after.finalizer is fin
    finally:
        sys.set_asyncgen_hooks(*old)


def test_asyncgen_hooks_restored_after_exception(loop):
    old = sys.get_asyncgen_hooks()

    async def main():
        raise ValueError

    try:
        loop.run_until_complete(main())
    except ValueError:
        pass
    assert sys.get_asyncgen_hooks() == old


def test_shutdown_asyncgens_reports_errors(loop):
    contexts = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

    async def agen():
        try:
            yield 1
        finally:
            raise ZeroDivisionError("in aclose")

    keep = []

    async def main():
        g = agen()
        keep.append(g)
        await g.__anext__()

    loop.run_until_complete(main())
    loop.run_until_complete(loop.shutdown_asyncgens())
    assert len(contexts) == 1
    assert contexts[0]["message"].startswith(
        "an error occurred during closing of asynchronous generator")
    assert isinstance(contexts[0]["exception"], ZeroDivisionError)
    assert contexts[0]["asyncgen"] is keep[0]


def test_shutdown_asyncgens_no_generators(loop):
    assert loop.run_until_complete(loop.shutdown_asyncgens()) is None


def test_exhausted_generator_needs_no_shutdown(loop):
    async def agen():
        yield 1

    async def main():
        return [x async for x in agen()]

    assert loop.run_until_complete(main()) == [1]
    assert loop.run_until_complete(loop.shutdown_asyncgens()) is None
