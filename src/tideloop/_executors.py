"""Executors and async generators: asyncio's own code on the tideloop class.

Once-per-call orchestration that asyncio implements only in terms of the
loop's API is the running interpreter's own code (``_compat.borrow``), so
messages and edge cases are those of the stock loop of that version.
"""

from . import _compat

_borrow = _compat.borrow


class Executors:
    """run_in_executor, the default executor, async generators' hooks and
    their shutdowns (bound on the Loop class)."""

    _default_executor = None
    _executor_shutdown_called = False
    _asyncgens_shutdown_called = False

    _asyncgen_firstiter_hook = _borrow("_asyncgen_firstiter_hook")
    _asyncgen_finalizer_hook = _borrow("_asyncgen_finalizer_hook")
    shutdown_asyncgens = _borrow("shutdown_asyncgens")
    shutdown_default_executor = _borrow("shutdown_default_executor")
    _do_shutdown = _borrow("_do_shutdown")
    _check_default_executor = _borrow("_check_default_executor")
    _check_callback = _borrow("_check_callback")
    run_in_executor = _borrow("run_in_executor")
    set_default_executor = _borrow("set_default_executor")

    def _drop_default_executor(self):
        # On close, as the stock loop does: no new work, and the default
        # executor shut down without waiting for its threads.
        self._executor_shutdown_called = True
        executor = self._default_executor
        if executor is not None:
            self._default_executor = None
            executor.shutdown(wait=False)
