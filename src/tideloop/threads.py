"""One event loop per thread, in one process: N threads serving one port.

    import asyncio, tideloop.threads

    async def main():
        sock = tideloop.threads.reuse_port_socket("0.0.0.0", 8000)
        server = await asyncio.start_server(handle, sock=sock)
        async with server:                  # leaving it waits for the connections
            await asyncio.Event().wait()    # until run() cancels this thread's main

    tideloop.threads.run(main)              # one tideloop loop per CPU, each running main()

``run(main)`` calls ``main()`` once in each of N new threads, each on a new
event loop of its own (tideloop's, or ``loop_factory``'s), while the calling
thread waits.  ``reuse_port_socket(host, port)`` gives each thread's server a
socket of its own on the same port (``SO_REUSEPORT``), so the kernel spreads
the connections over the threads instead of one thread taking most of them.

Stopping: SIGINT or SIGTERM (they reach the main thread only) cancels every
thread's main task, through ``call_soon_threadsafe``, and ``run()`` waits for
the threads and returns normally (a server's graceful shutdown: write it where
the cancellation arrives, as the recipes below do).  A second signal, or
``shutdown_timeout`` seconds without every thread having finished, stops the
loops themselves (``loop.stop()``: the runner cancels what is left and closes
the loop); after a second signal the signal is then raised again with the
handler that was there before ``run()`` (SIGINT: ``KeyboardInterrupt``;
SIGTERM: the process ends).

Errors: an exception out of one thread's ``main()`` stops the others (as a
signal does) and ``run()`` raises it once they have finished; exceptions from
several threads come out as one ``ExceptionGroup`` (``BaseExceptionGroup``
when one of them is, say, ``SystemExit``).

Recipes (each is run by ``tests/ecosystem/test_threads_servers.py`` in a real
process, on tideloop and on asyncio's loop):

uvicorn (0.36+; its ``Server.serve()`` installs no signal handlers outside the
main thread, and its graceful shutdown is ``should_exit``)::

    async def main():
        sock = tideloop.threads.reuse_port_socket("0.0.0.0", 8000)
        server = uvicorn.Server(uvicorn.Config(app))      # a Config per thread
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            await asyncio.shield(serving)
        except asyncio.CancelledError:
            server.should_exit = True                     # uvicorn's own graceful stop
            await serving

aiohttp::

    async def main():
        runner = web.AppRunner(make_app())                # an Application per thread
        await runner.setup()
        try:
            sock = tideloop.threads.reuse_port_socket("0.0.0.0", 8000)
            await web.SockSite(runner, sock).start()
            await asyncio.Event().wait()                  # until run() cancels it
        finally:
            await runner.cleanup()                        # aiohttp's graceful stop

On a GIL build the threads share one core's worth of Python, so this pays
only where the loops wait more than they compute; on a free-threaded build
(3.13t+) they run in parallel: tideloop's core runs there without the GIL.
Worker processes (gunicorn with
``tideloop.workers``) use every core on any build.
"""

import asyncio
import logging
import os
import select
import signal
import socket
import threading
import time

from . import _compat

__all__ = ("run", "reuse_port_socket")

_logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# After the loops are stopped by force: how long run() still waits for the
# threads to finish their runner's cleanup before it gives up on them.
_FORCE_GRACE = 2.0


def _cpu_count():
    count = getattr(os, "process_cpu_count", None)       # 3.13+
    if count is not None:
        return count() or 1
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def reuse_port_socket(host, port, *, family=socket.AF_UNSPEC):
    """A TCP socket bound to (host, port) with SO_REUSEPORT, for one thread's server.

    Every thread calls it with the same host and port and hands its socket to
    its own server (``asyncio.start_server(..., sock=sock)``,
    ``loop.create_server(..., sock=sock)``, ``uvicorn.Server.serve(sockets=[sock])``,
    ``aiohttp.web.SockSite(runner, sock)``); the kernel then spreads new
    connections over the sockets of the group.

    The socket is bound but not listening: the server listens when it starts,
    so the kernel sends a thread connections only once its server is up (and
    none to a thread whose server never starts).  It is non-blocking, with
    SO_REUSEADDR as asyncio's servers have, and IPV6_V6ONLY for IPv6.  host
    is resolved with getaddrinfo (passive): the first address is used.  The
    port must be given: with port 0 each socket would get a port of its own.
    Linux (SO_REUSEPORT with load balancing: 3.9+)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("SO_REUSEPORT is not available on this platform")
    if port in (0, "0", None):
        raise ValueError("reuse_port_socket needs a port: with port 0 each "
                         "socket would be bound to a port of its own")
    infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0,
                               socket.AI_PASSIVE)
    if not infos:       # pragma: no cover (getaddrinfo raises instead)
        raise OSError(f"getaddrinfo({host!r}, {port!r}) returned nothing")
    af, kind, proto, _, address = infos[0]
    sock = socket.socket(af, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if af == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _LoopThread:
    """One thread, its loop and its main task; what run() may ask of them
    from the main thread is request_stop() and force()."""

    def __init__(self, index, main, args, loop_factory, wake):
        self.index = index
        self.main, self.args = main, args
        self.loop_factory = loop_factory
        self.wake = wake            # run()'s wakeup pipe (write end)
        self.lock = threading.Lock()
        self.done = False
        self.abandoned = False      # run() gave up on it and closed the pipe
        self.loop = None
        self.task = None
        self.stop_requested = False
        self.forced = False
        self.result = None
        self.error = None
        self.name = f"tideloop-{index}"
        self.thread = threading.Thread(target=self._body, name=self.name,
                                       daemon=_compat.DAEMON_THREADS)

    def start(self):
        self.thread.start()

    def join(self):
        self.thread.join()

    def _body(self):
        try:
            with asyncio.Runner(loop_factory=self.loop_factory) as runner:
                loop = runner.get_loop()
                with self.lock:
                    self.loop = loop
                self.result = runner.run(self._main())
        except asyncio.CancelledError as exc:
            if not self.stop_requested:
                self.error = exc        # cancelled by something else than run()
        except BaseException as exc:
            # loop.stop() by force() makes runner.run()/close() raise
            # RuntimeError: that is the forced stop, not the thread's error.
            if not (self.forced and isinstance(exc, RuntimeError)):
                self.error = exc
            # A SystemExit or KeyboardInterrupt raised by another task (uvicorn's
            # sys.exit() when its startup fails) leaves the loop at once, and the
            # runner's clean-up hands it on to the main task: it is reported
            # here, not as a task exception never retrieved.
            task = self.task
            if task is not None and task.done() and not task.cancelled():
                task.exception()
        finally:
            with self.lock:
                self.loop = self.task = None
                self.done = True
                if not self.abandoned:
                    os.write(self.wake, b"\0")

    async def _main(self):
        with self.lock:
            if self.stop_requested:
                raise asyncio.CancelledError
            self.task = asyncio.current_task()
        return await self.main(*self.args)

    def _call(self, callback):
        # The loop may have closed since: then there is nothing to stop.
        try:
            self.loop.call_soon_threadsafe(callback)
        except RuntimeError:
            pass

    def request_stop(self):
        with self.lock:
            self.stop_requested = True
            if self.task is not None:
                self._call(self.task.cancel)

    def force(self):
        with self.lock:
            self.stop_requested = self.forced = True
            if self.loop is not None:
                self._call(self.loop.stop)


def run(main, *args, threads=None, loop_factory=None, shutdown_timeout=30.0):
    """Run ``main(*args)`` in ``threads`` new threads, one new event loop each.

    threads defaults to the number of CPUs this process may use
    (``os.process_cpu_count()``); loop_factory to ``tideloop.new_event_loop``
    (``asyncio.SelectorEventLoop`` or ``asyncio.new_event_loop`` run the same
    program on asyncio's loop).  The calling thread waits; called from the
    main thread, run() handles SIGINT and SIGTERM until it returns (it puts
    the previous handlers back after).

    Returns the list of what each thread's main() returned, in thread order
    (None for a thread whose main() ended by the cancellation).  Raises what a thread's main()
    raised (an ExceptionGroup if several did), or TimeoutError when threads
    were still running after their loops were stopped by force; see the
    module's docstring for stopping and errors."""
    if asyncio.iscoroutine(main):
        raise TypeError("run() needs the async function, not a coroutine: "
                        "each thread calls it for a coroutine of its own")
    if not callable(main):
        raise TypeError(f"main must be an async function, not {main!r}")
    if threads is None:
        threads = _cpu_count()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, not {threads!r}")
    if shutdown_timeout is not None and shutdown_timeout < 0:
        raise ValueError("shutdown_timeout must be >= 0 or None")
    if asyncio._get_running_loop() is not None:
        raise RuntimeError("tideloop.threads.run() cannot be called from a running event loop")
    if loop_factory is None:
        from ._loop import new_event_loop as loop_factory

    wake_r, wake_w = _wake_pipe()
    workers = [_LoopThread(i, main, args, loop_factory, wake_w) for i in range(threads)]
    return _supervise(workers, wake_r, wake_w, shutdown_timeout, "loop threads")


def _wake_pipe():
    # The main thread sleeps in select() on a pipe that wakes it: each
    # worker writes a 0 byte to it when it ends, and the interpreter's C
    # signal handler writes the signal's number (signal.set_wakeup_fd)
    # whichever thread the kernel delivered the signal to.  (A thread other
    # than the main one may take it, and then nothing else would wake the
    # main thread from a blocking wait until its timeout.)
    return os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)


def _takes_signals():
    """Signal handlers can be set here: the main thread of the main
    interpreter (in a subinterpreter signal.signal() raises ValueError)."""
    from . import _core
    return (_core.main_interpreter and
            threading.current_thread() is threading.main_thread())


def _supervise(workers, wake_r, wake_w, shutdown_timeout, what):
    """Start the workers (tideloop.threads' loop threads, or
    tideloop.interpreters' interpreters), wait for them, stop them on a
    signal or an error, and return their results or raise their errors.

    A worker has index, name, lock, done, abandoned, error, result, start(),
    join(), request_stop() and force(); it writes a byte to wake_w under its
    lock when it ends, unless abandoned."""
    previous, old_wakeup = {}, None
    left = workers
    resignal = None
    try:
        if _takes_signals():
            old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            for sig in _SIGNALS:
                # The number comes through the pipe; the Python handler only
                # keeps the signal from its default action.
                previous[sig] = signal.signal(sig, _ignore)
        for w in workers:
            w.start()
        resignal, left = _wait(workers, wake_r, shutdown_timeout, what)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if old_wakeup is not None:
            signal.set_wakeup_fd(old_wakeup)
        for w in workers:
            # A worker still running must not write to the closed pipe; one
            # that is done may still be writing its byte, under its lock.
            with w.lock:
                w.abandoned = True
        os.close(wake_r)
        os.close(wake_w)
    for w in workers:
        if w not in left:
            w.join()        # it has posted "done": only its return is left
    if resignal is not None:
        # A second signal forced the stop: let it have its usual effect now.
        signal.raise_signal(resignal)
    errors = [w.error for w in workers if w.error is not None]
    if left:
        names = ", ".join(w.name for w in left)
        raise TimeoutError(f"{len(left)} of {len(workers)} {what} ({names}) were still "
                           f"running after their loops were stopped") from (
            _group(errors, what) if errors else None)
    if errors:
        raise _group(errors, what)
    return [w.result for w in workers]


def _group(errors, what):
    if len(errors) == 1:
        return errors[0]
    # BaseExceptionGroup() makes an ExceptionGroup when all are Exceptions.
    return BaseExceptionGroup(f"errors in {len(errors)} {what}", errors)


def _ignore(signum, frame):
    pass


def _wait(workers, wake, shutdown_timeout, what):
    """The main thread's part: wait for every worker, stop them on a signal
    or an error, force them after a second signal or the timeout.  Returns
    (the signal to raise again or None, the workers still running)."""
    pending = {w.index for w in workers}
    stopping = forced = False
    deadline = None
    resignal = None

    def stop(why):
        nonlocal stopping, deadline
        stopping = True
        _logger.info("stopping %d %s: %s", len(pending), what, why)
        if shutdown_timeout is not None:
            deadline = time.monotonic() + shutdown_timeout
        for w in workers:
            w.request_stop()

    def force(why):
        nonlocal forced, stopping, deadline
        forced = stopping = True
        _logger.warning("stopping the loops of %d %s by force: %s", len(pending), what, why)
        deadline = time.monotonic() + _FORCE_GRACE
        for w in workers:
            w.force()

    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([wake], [], [], timeout)[0]:
            if forced:
                break
            force(f"still running {shutdown_timeout} s after the stop was asked")
            continue
        try:
            data = os.read(wake, 4096)
        except BlockingIOError:
            continue
        for w in workers:
            if w.index in pending and w.done:
                pending.discard(w.index)
                if w.error is not None and not stopping:
                    stop(f"{w.name} failed with {type(w.error).__name__}: {w.error}")
        for signum in data:
            if signum not in _SIGNALS:
                continue        # a thread's 0, or a signal someone else handles
            name = signal.Signals(signum).name
            if not stopping:
                stop(name)
            elif not forced:
                resignal = signum
                force(f"a second signal ({name})")
    return resignal, [w for w in workers if w.index in pending]
