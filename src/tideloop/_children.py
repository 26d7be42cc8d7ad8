"""Child watching: how the loop learns that a subprocess has exited.

A pidfd per child, watched as a reader of the loop (a child's exit makes it
readable), where the kernel has pidfds; else a thread per child blocked in
waitid().  Either way the child is reaped and its exit published in one step
on the loop's thread, so its PID cannot be recycled in between.
"""

import os
import threading
from asyncio.log import logger as _logger

from . import _compat


def _reap_quietly(pid):
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _start_waiter(target, pid, *args):
    threading.Thread(target=target, args=(pid, *args), daemon=_compat.DAEMON_THREADS,
                     name=f"tideloop-waitpid-{pid}").start()


class ChildWatching:
    """The loop's part in watching its subprocesses (bound on the Loop
    class)."""

    def _init_children(self):
        self._child_pidfds = {}        # pidfd -> pid of watched children
        self._exited_children = set()  # exited, reaped on the next iteration
        if _compat.LOOP_WATCHERS:
            # 3.14: each loop has a child watcher of asyncio's kind (pidfd
            # where pidfds work, else a thread per child).  With the pidfd
            # one, tideloop watches the pidfds itself (_watch_child).
            self._watcher = _compat.LOOP_WATCHERS.new()

    def _watch_child(self, transp):
        pid = transp.get_pid()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            # No pidfd (kernel < 5.3, or a seccomp filter): a thread blocks
            # in waitpid() for this child, as asyncio's default watcher does.
            _start_waiter(self._wait_child_thread, pid, transp)
            return
        self._child_pidfds[pidfd] = pid
        self._add_reader(pidfd, self._child_pidfd_ready, pidfd, pid, transp)

    @staticmethod
    def _reap(pid, transp, flags):
        try:
            wpid, status = os.waitpid(pid, flags)
        except ChildProcessError:
            # Reaped elsewhere: Popen.poll() (the transport's close() calls
            # it) knows the code; asyncio's watchers report 255.
            code = transp._proc.returncode if transp._proc is not None else None
            if code is None:
                _logger.warning("Unknown child process pid %d, will report "
                                "returncode 255", pid)
                code = 255
            return code
        if wpid == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def _child_pidfd_ready(self, pidfd, pid, transp):
        # Readable: the child has exited (a zombie until reaped, so its PID
        # cannot be reused).  It is reaped and its exit published in one
        # step (gh-127049: in between, a send_signal() could hit a recycled
        # PID), when the stock loop of this interpreter publishes it: at once
        # on 3.14, an iteration later before.
        self._stop_watching_pidfd(pidfd)
        # Logged where the stock default watcher logs it (3.11's threaded one).
        log = not _compat.STOCK_WATCHES_PIDFD
        if _compat.EXIT_PUBLISHED_AT_ONCE:
            self._reap_and_publish(pid, transp, log)
        else:
            self._exited_children.add(pid)      # reaped on close if still here
            self.call_soon(self._reap_and_publish, pid, transp, log)

    def _stop_watching_pidfd(self, pidfd):
        self._remove_reader(pidfd)
        del self._child_pidfds[pidfd]
        os.close(pidfd)

    @staticmethod
    def _exit_published(pid, code, transp):
        transp._process_exited(code)

    def _wait_child_thread(self, pid, transp):
        # Wait without reaping (WNOWAIT): the PID stays the child's until the
        # loop thread reaps it and publishes the exit in one step.
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        try:
            self.call_soon_threadsafe(self._reap_and_publish, pid, transp, True)
        except RuntimeError:        # the loop closed meanwhile
            _reap_quietly(pid)
            _logger.warning("Loop %r that handles pid %r is closed", self, pid)

    def _reap_and_publish(self, pid, transp, log):
        self._exited_children.discard(pid)
        code = self._reap(pid, transp, 0)
        if log and self.get_debug():
            _logger.debug("process %s exited with returncode %s", pid, code)
        transp._process_exited(code)

    def _release_children(self):
        # The loop closes with children still running: stop watching them,
        # but reap them when they exit (no zombies), as asyncio's threaded
        # watcher would.
        if not self._child_pidfds:
            return
        pidfds, self._child_pidfds = self._child_pidfds, {}
        for pidfd, pid in pidfds.items():
            self._remove_reader(pidfd)
            os.close(pidfd)
            _start_waiter(_reap_quietly, pid)
        exited, self._exited_children = self._exited_children, set()
        for pid in exited:      # exited, their reaping still queued
            _reap_quietly(pid)
