"""Gunicorn worker classes whose worker processes run on a tideloop loop.

    gunicorn app:app      -k tideloop.workers.UvicornWorker -w 2   # ASGI, through uvicorn
    gunicorn app:make_app -k tideloop.workers.AiohttpWorker -w 2   # aiohttp.web

One loop per process, one process per core.  Each worker accepts on a
listening socket of its own (Linux, ``SO_REUSEPORT``), so the kernel spreads
new connections evenly over the workers; with the one socket that gunicorn's
workers otherwise share, whichever worker wakes first takes them, and one
worker serves most of the requests (see ``_Slots`` for how the sockets are
kept across restarts and reloads).

Each class is made the first time it is looked up, from the server package
it extends (``uvicorn-worker`` for UvicornWorker, ``aiohttp`` for
AiohttpWorker), so importing this module needs neither, and looking up one
class needs only its own package.
"""

import asyncio
import os
import socket

from ._loop import new_event_loop

__all__ = ("UvicornWorker", "AiohttpWorker")

# The import string uvicorn (0.36+) resolves to a loop factory: the same
# value as ``uvicorn --loop tideloop:new_event_loop``.
UVICORN_LOOP = "tideloop:new_event_loop"


def _require(module, packages, name):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        raise ImportError(
            f"tideloop.workers.{name} needs {' and '.join(packages)} "
            f"(pip install {' '.join(packages)}): {exc}", name=exc.name) from exc



# -- a listening socket per worker ------------------------------------------
#
# Facts this rests on (gunicorn 23 to 27, Linux):
# - The arbiter binds its listeners (Arbiter.LISTENERS) in start(), before it
#   calls the worker class's check_config(cfg, log): a worker class cannot
#   change how they are bound.  gunicorn 24+'s own reuse_port binds nothing in
#   the arbiter and a socket in each worker after fork.
# - A socket in a SO_REUSEPORT group gets its share of new connections for as
#   long as it is listening, whether or not anyone accepts on it; closing one
#   resets the connections waiting in its accept queue (unless the kernel's
#   net.ipv4.tcp_migrate_req is 1).  So a socket per worker that the worker
#   binds and closes loses connections at every restart (--max-requests, a
#   reload), and an arbiter socket left listening beside the workers' ones
#   keeps a share of connections that nobody accepts.
# - SO_REUSEPORT set on a socket that is already listening is honoured when
#   the next socket binds the port: both join one group.
#
# So the arbiter keeps one listening socket per worker *slot*, made before the
# worker is forked (the pre_fork hook) and kept across the slot's workers:
# slot 0 is gunicorn's own listener (given SO_REUSEPORT), the others are twins
# bound to the same address.  A worker that exits (--max-requests, a crash)
# leaves its slot's socket open in the arbiter, so connections that arrive
# meanwhile wait in its queue for the replacement, which gets the same slot;
# a reload (HUP) forks the new workers into the existing slots beside the
# old ones, which finish while the new ones accept.  A slot is closed only
# when the arbiter wants fewer workers than there are slots (TTOU, a reload
# with fewer workers): what waits in its queue then is reset, as when any
# listener closes.  Each worker closes its copies of the other slots' sockets
# at start, so a closed slot is really closed.  Unix-socket listeners (no
# SO_REUSEPORT) stay shared by every worker.


class _Slot:
    """The sockets the workers of one slot accept on: one per arbiter
    listener, the arbiter's own (shared, or slot 0) or twins made for it."""

    def __init__(self, sockets, owned, arbiters=False):
        self.sockets = sockets      # what worker.sockets becomes
        self.owned = owned          # the twins among them: closed with the slot
        self.arbiters = arbiters    # the slot of gunicorn's own listeners

    def close(self):
        for s in self.owned:
            s.close()
        self.owned = []


def _balanceable(listener):
    try:
        if listener.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        return True
    except (AttributeError, OSError):
        return False


def _twin(listener, cfg):
    """A listening socket on the listener's address, in its SO_REUSEPORT
    group, made by gunicorn's own socket class (its options, cfg.backlog)."""
    s = socket.socket(listener.family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if listener.family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY,
                         listener.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
        s.bind(listener.getsockname())
    except BaseException:
        s.close()
        raise
    twin = type(listener)(listener.cfg_addr, cfg, listener.log, fd=s.detach())
    # Workers get it by fork; a master re-executed by USR2 must not inherit
    # it (it would keep listening there with nobody accepting).
    twin.sock.set_inheritable(False)
    return twin


class _Slots:
    """The arbiter's slots (state of the arbiter process; see above).

    gunicorn 23 reaps its workers, and so calls child_exit, from its
    SIGCHLD handler, which may run in the middle of a pre_fork: a call that
    comes while another one runs is deferred to the end of that one."""

    def __init__(self):
        self.listeners = None   # the arbiter's listeners the slots are made for
        self.balanced = []      # indexes of those that get twins
        self.slots = []
        self.retired = []       # slots made for earlier listeners (a reload changed the address)
        self.forking = None     # the worker last given a slot, until it is in WORKERS
        self.busy = False
        self.deferred = None    # the arbiter, when an exit came while busy

    def _same_listeners(self, arbiter):
        return (self.listeners is not None and len(self.listeners) == len(arbiter.LISTENERS)
                and all(a is b for a, b in zip(self.listeners, arbiter.LISTENERS)))

    def _refresh(self, arbiter):
        if self._same_listeners(arbiter):
            return
        self.retired.extend(s for s in self.slots if s.owned)
        self.listeners = list(arbiter.LISTENERS)
        self.slots = []
        self.balanced = [i for i, lnr in enumerate(self.listeners) if _balanceable(lnr)]
        if self.listeners:
            self.slots.append(_Slot(list(self.listeners), [], arbiters=True))
        if self.balanced:
            arbiter.log.info("tideloop.workers: each worker accepts on a SO_REUSEPORT socket "
                             "of its own on %s", ", ".join(str(self.listeners[i])
                                                            for i in self.balanced))

    def _new_slot(self, arbiter):
        sockets, owned = [], []
        for i, lnr in enumerate(self.listeners):
            twin = None
            if i in self.balanced:
                try:
                    twin = _twin(lnr, arbiter.cfg)
                except OSError as exc:
                    arbiter.log.warning("tideloop.workers: no socket of its own for a "
                                        "worker on %s (%s): it shares the arbiter's", lnr, exc)
            sockets.append(lnr if twin is None else twin)
            if twin is not None:
                owned.append(twin)
        slot = _Slot(sockets, owned)
        self.slots.append(slot)
        return slot

    def _occupancy(self, arbiter):
        count = {}
        workers = list(arbiter.WORKERS.values())
        if self.forking is not None:
            # Until the fork returns in the arbiter, the worker is in no list
            # (gunicorn sets its pid, then lists it); once forked, WORKERS
            # says whether it is alive.
            if isinstance(getattr(self.forking, "pid", None), int):
                self.forking = None
            else:
                workers.append(self.forking)
        for w in workers:
            slot = getattr(w, "_tideloop_slot", None)
            if slot is not None:
                count[slot] = count.get(slot, 0) + 1
        return count

    def _exclusive(self, arbiter, work, *args):
        if self.busy:
            self.deferred = arbiter
            return
        self.busy = True
        try:
            work(arbiter, *args)
            while self.deferred is not None:
                self.deferred = None
                self._exited(arbiter)
        finally:
            self.busy = False

    def assign(self, arbiter, worker):
        """pre_fork: the slot of the worker about to be forked."""
        self._exclusive(arbiter, self._assign, worker)

    def exited(self, arbiter):
        """child_exit: close the slots that no worker will accept on again."""
        self._exclusive(arbiter, self._exited)

    def _assign(self, arbiter, worker):
        self._refresh(arbiter)
        if not self.slots:
            return
        live = self._occupancy(arbiter)
        target = max(1, arbiter.num_workers)
        empty = [s for s in self.slots if not live.get(s)]
        if empty:
            slot = empty[0]
        elif self.balanced and len(self.slots) < target:
            slot = self._new_slot(arbiter)
        else:
            # A reload's new workers, beside the old ones until those finish.
            slot = min(self.slots, key=lambda s: live.get(s, 0))
        worker._tideloop_slot = slot
        worker.sockets = list(slot.sockets)
        self.forking = worker

    def _exited(self, arbiter):
        self._refresh(arbiter)
        live = self._occupancy(arbiter)
        for slot in list(self.retired):
            if not live.get(slot):
                slot.close()
                self.retired.remove(slot)
        while len(self.slots) > max(1, arbiter.num_workers):
            empty = [s for s in self.slots if not live.get(s)]
            if not empty:
                return
            slot = next((s for s in empty if not s.arbiters), None)
            if slot is not None:
                arbiter.log.info("tideloop.workers: fewer workers: a worker socket closes")
                slot.close()
                self.slots.remove(slot)
                continue
            # Only slot 0, gunicorn's own listeners, is left without workers:
            # they take over an occupied slot's sockets (dup2 onto the same fd
            # numbers, so gunicorn's objects stay valid) and that slot's own
            # copies close; the old ones close, as any surplus slot does.
            zero = empty[0]
            other = next((s for s in self.slots if s.owned), None)
            if other is None:
                return
            for i in self.balanced:
                twin = other.sockets[i]
                if twin in other.owned:
                    os.dup2(twin.fileno(), self.listeners[i].fileno(), inheritable=True)
            other.close()
            other.sockets = list(self.listeners)
            other.arbiters = True
            self.slots.remove(zero)
            arbiter.log.info("tideloop.workers: fewer workers: the listener's own socket "
                             "closes, it takes over another worker's")

    def forked(self, worker):
        """In the new worker: let go of every other slot's sockets."""
        mine = {id(s) for s in worker.sockets}
        for slot in self.slots + self.retired:
            for s in slot.sockets:
                if id(s) not in mine:
                    s.close()
        self.listeners, self.slots, self.retired = None, [], []


_SLOTS = _Slots()


def _wrap_hook(cfg, name, ours, first):
    setting = cfg.settings[name]
    user = setting.get()
    if getattr(user, "_tideloop_wraps", None) is not None:
        return      # this cfg is wrapped already

    def hook(server, worker):
        if first:
            ours(server, worker)
        try:
            user(server, worker)
        finally:
            if not first:
                ours(server, worker)
    hook._tideloop_wraps = user
    setting.value = hook


def _workers_bind(cfg):
    """Whether gunicorn binds a socket in each worker after fork (its
    reuse_port from gunicorn 24)."""
    import gunicorn
    return bool(getattr(cfg, "reuse_port", False)) and gunicorn.version_info >= (24,)


def _pre_fork(arbiter, worker):
    if not isinstance(worker, _OwnSocket):
        return
    if _workers_bind(arbiter.cfg):
        # Turned on by a reload's config (check_config refuses it at start):
        # the worker would bind a socket of its own after fork, beside the
        # slots, and nobody would accept on its slot's.
        arbiter.log.warning("tideloop.workers: reuse_port is ignored: the workers "
                            "get SO_REUSEPORT sockets of their own from the arbiter")
        arbiter.cfg.set("reuse_port", False)
    _SLOTS.assign(arbiter, worker)


def _child_exit(arbiter, worker):
    if isinstance(worker, _OwnSocket):
        _SLOTS.exited(arbiter)


class _OwnSocket:
    """What tideloop's worker classes add to their server's: a listening
    socket of their own (see _Slots)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Made in the arbiter, just before its pre_fork hook; a reload gives
        # the arbiter a new cfg, so every worker sees that its cfg is hooked.
        _wrap_hook(self.cfg, "pre_fork", _pre_fork, first=True)
        _wrap_hook(self.cfg, "child_exit", _child_exit, first=False)

    @classmethod
    def check_config(cls, cfg, log):
        if _workers_bind(cfg):
            # Then the arbiter bound nothing: gunicorn leaves it to each
            # worker after fork, and a worker's socket closes with it,
            # resetting the connections in its queue.
            raise RuntimeError(
                "tideloop.workers gives every worker a SO_REUSEPORT socket of its own, "
                "kept by the arbiter across restarts; leave out gunicorn's reuse_port "
                "(--reuse-port), which binds one in each worker instead")
        parent = getattr(super(), "check_config", None)
        if parent is not None:
            parent(cfg, log)

    def _take_slot(self):
        _SLOTS.forked(self)


def _uvicorn_worker():
    base = _require("uvicorn_worker", ("gunicorn", "uvicorn-worker"),
                    "UvicornWorker").UvicornWorker
    from uvicorn.config import Config
    if not hasattr(Config, "get_loop_factory"):
        # Before 0.36 uvicorn's loop= named one of its own loop setups only.
        raise ImportError("tideloop.workers.UvicornWorker needs uvicorn 0.36 or later "
                          "(pip install -U uvicorn uvicorn-worker)")

    class UvicornWorker(_OwnSocket, base):
        """uvicorn's gunicorn worker (``uvicorn_worker.UvicornWorker``) with
        tideloop as its loop: uvicorn's own option, ``loop=``, names the
        loop factory, and uvicorn runs the server on a loop it makes with it.
        Each worker accepts on a socket of its own (``SO_REUSEPORT``)."""

        CONFIG_KWARGS = {**base.CONFIG_KWARGS, "loop": UVICORN_LOOP}

        def init_process(self):
            self._take_slot()
            super().init_process()

    return UvicornWorker


def _aiohttp_worker():
    worker = _require("aiohttp.worker", ("gunicorn", "aiohttp"), "AiohttpWorker")
    from gunicorn.workers import base as gunicorn_base

    class AiohttpWorker(_OwnSocket, worker.GunicornWebWorker):
        """aiohttp's gunicorn worker (``aiohttp.worker.GunicornWebWorker``)
        on a tideloop loop.

        aiohttp's uvloop worker gets its loop by setting uvloop's policy
        before aiohttp's ``init_process`` makes one; asyncio deprecates
        policies from 3.14 (and CPython 3.16 has none), so this worker makes
        the loop itself, in aiohttp's place, and leaves the process's policy
        alone.  Each worker accepts on a socket of its own (``SO_REUSEPORT``)."""

        def init_process(self):
            self._take_slot()
            # What GunicornWebWorker.init_process does, with tideloop's loop
            # in place of asyncio.new_event_loop()'s, then gunicorn's own,
            # which ends by running the worker.  (aiohttp's first closes the
            # current loop; gunicorn's arbiter is synchronous and its workers
            # start with none.)
            self.loop = new_event_loop()
            asyncio.set_event_loop(self.loop)
            gunicorn_base.Worker.init_process(self)

    return AiohttpWorker


_MAKERS = {"UvicornWorker": _uvicorn_worker, "AiohttpWorker": _aiohttp_worker}


def __getattr__(name):
    maker = _MAKERS.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = maker()
    cls.__module__ = __name__
    cls.__qualname__ = name
    globals()[name] = cls
    return cls


def __dir__():
    return sorted(set(globals()) | set(_MAKERS))
