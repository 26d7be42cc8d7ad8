"""Pipes and subprocesses: asyncio's orchestration over tideloop's C pipe
transports, and the child's exit watched by the loop (``_children``)."""

import asyncio
from asyncio import unix_events as _unix_events

from . import _compat

_borrow = _compat.borrow
_UnixLoop = _unix_events._UnixSelectorEventLoop


class Subprocesses:
    """connect_read_pipe, connect_write_pipe, subprocess_exec and
    subprocess_shell (bound on the Loop class)."""

    connect_read_pipe = _borrow("connect_read_pipe")
    connect_write_pipe = _borrow("connect_write_pipe")
    subprocess_exec = _borrow("subprocess_exec")
    subprocess_shell = _borrow("subprocess_shell")
    _log_subprocess = _borrow("_log_subprocess")

    async def _make_subprocess_transport(self, protocol, args, shell,
                                         stdin, stdout, stderr, bufsize,
                                         extra=None, **kwargs):
        # asyncio's own subprocess transport: subprocess.Popen (so every
        # keyword Popen takes works), the pipes as tideloop's C transports,
        # and the exit watched through a pidfd instead of a child watcher --
        # unless the application set a watcher other than the per-process
        # ones (Threaded: asyncio's default, which get_child_watcher()
        # installs on first use; Pidfd): that one is used, since a watcher
        # that reaps every child would otherwise steal ours.
        watcher = _compat.current_child_watcher()
        if watcher is not None and not isinstance(
                watcher, _compat.PER_PROCESS_WATCHERS):
            return await self._make_subprocess_transport_with_watcher(
                protocol, args, shell, stdin, stdout, stderr, bufsize,
                extra=extra, **kwargs)
        waiter = self.create_future()
        transp = _unix_events._UnixSubprocessTransport(
            self, protocol, args, shell, stdin, stdout, stderr, bufsize,
            waiter=waiter, extra=extra, **kwargs)
        if _compat.LOOP_WATCHERS and not isinstance(
                self._watcher, _compat.LOOP_WATCHERS.pidfd):
            # 3.14 without usable pidfds: the stock per-loop thread watcher.
            self._watcher.add_child_handler(transp.get_pid(),
                                            self._exit_published, transp)
        else:
            self._watch_child(transp)
        try:
            await waiter
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException:
            transp.close()
            if _compat.PY >= (3, 14):
                # 3.14 shields the wait from the cancellation that got here.
                await asyncio.shield(transp._wait())
            else:
                await transp._wait()
            raise
        return transp

    if _compat.HAS_CHILD_WATCHERS:   # 3.11-3.13: an application's watcher
        _make_subprocess_transport_with_watcher = _borrow(
            "_make_subprocess_transport", _UnixLoop)
        _child_watcher_callback = _borrow("_child_watcher_callback", _UnixLoop)
