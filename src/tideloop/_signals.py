"""Signal handlers of the loop (main thread only).

The interpreter's C-level handler writes the signal number into the loop's
signal pipe (``signal.set_wakeup_fd``); the C core reads it and runs the
handler registered here.
"""

import errno
import signal
import sys
import warnings
from asyncio.log import logger as _logger

from . import _compat
from . import _core


class Signals:
    """add_signal_handler / remove_signal_handler (bound on the Loop class)."""

    def _check_signal(self, sig):
        if not isinstance(sig, int):
            raise TypeError(f"sig must be an int, not {sig!r}")
        if sig not in signal.valid_signals():
            raise ValueError(f"invalid signal number {sig}")

    def _clear_wakeup_fd(self):
        # As the stock loop: no wakeup fd once the last handler is gone.  The
        # one set before the first add_signal_handler() is not put back: its
        # owner (another loop, say) may have closed it since, and the number
        # may be another socket's now, which signals would write bytes into.
        try:
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError) as exc:
            _logger.info("set_wakeup_fd(-1) failed: %s", exc)

    def add_signal_handler(self, sig, callback, *args):
        """Add a handler for a signal.  Main thread only."""
        if (_compat.iscoroutine(callback) or
                _compat.iscoroutinefunction(callback)):
            raise TypeError("coroutines cannot be used "
                            "with add_signal_handler()")
        self._check_signal(sig)
        self._check_closed()
        wfd = self._signal_pipe_open()
        try:
            # Raises ValueError outside the main thread: a loop running in
            # another thread cannot take signals.
            signal.set_wakeup_fd(wfd)
        except (ValueError, OSError) as exc:
            raise RuntimeError(str(exc))
        handle = self._make_handle(callback, *args)
        self._signal_handlers[sig] = handle
        try:
            signal.signal(sig, _core._sighandler_noop)
            signal.siginterrupt(sig, False)
        except OSError as exc:
            del self._signal_handlers[sig]
            if not self._signal_handlers:
                self._clear_wakeup_fd()
            if exc.errno == errno.EINVAL:
                raise RuntimeError(f"sig {sig} cannot be caught")
            raise

    def remove_signal_handler(self, sig):
        """Remove a handler for a signal; True if one was removed."""
        self._check_signal(sig)
        try:
            del self._signal_handlers[sig]
        except KeyError:
            return False
        handler = (signal.default_int_handler if sig == signal.SIGINT
                   else signal.SIG_DFL)
        try:
            signal.signal(sig, handler)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise RuntimeError(f"sig {sig} cannot be caught")
            raise
        if not self._signal_handlers:
            self._clear_wakeup_fd()
        return True

    def _remove_signal_handlers(self):
        # On close, before the signal pipe closes: the interpreter must stop
        # writing signal numbers into it first.
        if not self._signal_handlers:
            return
        if not sys.is_finalizing():
            for sig in list(self._signal_handlers):
                self.remove_signal_handler(sig)
        else:
            warnings.warn(f"Closing the loop {self!r} on interpreter "
                          f"shutdown stage, skipping signal handlers "
                          f"removal", ResourceWarning, source=self)
            self._signal_handlers.clear()
            self._clear_wakeup_fd()
