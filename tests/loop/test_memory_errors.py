"""A MemoryError raised where the loop cleans up must surface, never vanish.

The core used to drop some errors of its own cleanup steps (PyErr_Clear on
any exception).  These tests plant a MemoryError in such a step and check it
surfaces as on stock asyncio.
"""
import pytest


class Planted(SystemExit):
    """The error that ends run_forever() first (a BaseException, as asyncio
    lets those out of a callback)."""


def _loop_class_failing_cleanup(raw_loop_factory):
    probe = raw_loop_factory()
    base = type(probe)
    probe.close()

    class FailingCleanup(base):
        # run_forever() calls it twice: on the way in (with the debug flag),
        # then in its cleanup (with False).  The second call fails.
        calls = 0

        def _set_coroutine_origin_tracking(self, enabled):
            FailingCleanup.calls += 1
            if FailingCleanup.calls == 2:
                raise MemoryError("planted in run_forever's finally")
            parent = getattr(super(), "_set_coroutine_origin_tracking", None)
            if parent is not None:
                parent(enabled)

    return FailingCleanup


def _exit_run_forever():
    raise Planted("first")


def test_memory_error_in_run_forever_cleanup_surfaces(raw_loop_factory):
    # asyncio's run_forever() runs the cleanup in a `finally:`: an error there
    # replaces the one that ended the run, which becomes its __context__.
    loop = _loop_class_failing_cleanup(raw_loop_factory)()
    try:
        loop.call_soon(_exit_run_forever)
        with pytest.raises(MemoryError, match="planted") as info:
            loop.run_forever()
        assert isinstance(info.value.__context__, Planted)
        assert not loop.is_running()
    finally:
        loop.close()


def test_memory_error_in_run_forever_cleanup_alone(raw_loop_factory):
    # Without an earlier error, the cleanup's error is the one raised.
    loop = _loop_class_failing_cleanup(raw_loop_factory)()
    try:
        loop.call_soon(loop.stop)
        with pytest.raises(MemoryError, match="planted") as info:
            loop.run_forever()
        assert info.value.__context__ is None
        assert not loop.is_running()
    finally:
        loop.close()
