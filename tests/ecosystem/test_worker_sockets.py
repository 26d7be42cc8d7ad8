"""tideloop.workers: each gunicorn worker accepts on a listening socket of its own.

gunicorn runs tideloop's worker classes (UvicornWorker, AiohttpWorker) with
two workers on one port; the tests read the listening sockets of the port
from /proc/net/tcp and which process holds which from /proc/PID/fd, and ask
the server over HTTP:

- every worker holds one listening socket of the port and no other, and
  there are as many as workers: no socket is left listening with nobody
  accepting on it (the arbiter's own is one worker's);
- the kernel spreads new connections over the workers;
- the sockets outlive their workers: a restart (--max-requests, a worker
  killed) or a graceful reload (HUP) keeps the same listening sockets, and
  connections waiting in a dead worker's queue are answered by its
  replacement (with a socket bound in each worker, as gunicorn's own
  --reuse-port does from gunicorn 24, the kernel resets them);
- fewer workers (TTOU) close the surplus socket, gunicorn's own included
  (another worker's takes its place), more (TTIN) add one.

These are features of tideloop's worker classes, not loop behaviour: the
stock side (uvicorn's and aiohttp's own workers, which share the arbiter's
one socket) is the "before" of bench/worker_spread.py, not a spec here.
"""
import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .test_servers import (GUNICORN_APP, GUNICORN_NEEDS, free_port, get, gunicorn_args,
                           needs, server)

WORKER = {"uvicorn": "tideloop.workers.UvicornWorker", "aiohttp": "tideloop.workers.AiohttpWorker"}
KINDS = ["uvicorn", "aiohttp"]
SETTLE_TIMEOUT = 20


def listening_inodes(port):
    """The inodes of the sockets listening on TCP port (IPv4 and IPv6)."""
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def socket_inodes(pid):
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def workers_of(master):
    try:
        with open(f"/proc/{master}/task/{master}/children") as f:
            return sorted(int(p) for p in f.read().split())
    except OSError:
        return []


def layout(srv):
    """{worker pid: the port's listening sockets it holds}, the master's, all."""
    listening = listening_inodes(srv.port)
    workers = {pid: socket_inodes(pid) & listening for pid in workers_of(srv.proc.pid)}
    return workers, socket_inodes(srv.proc.pid) & listening, listening


def settled(srv, count):
    """Wait until there are `count` workers, each holding exactly one
    listening socket of its own, and as many sockets listening: the layout."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        workers, master, listening = layout(srv)
        held = [next(iter(s)) for s in workers.values() if len(s) == 1]
        if (len(workers) == count and len(held) == count and len(set(held)) == count
                and set(held) == listening and master == listening):
            return workers, listening
        if srv.proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no settled layout of {count} workers: workers {workers}, "
                        f"master {master}, listening {listening}\n{srv.log()}")
        time.sleep(0.1)


def start(tmp_path, kind, *extra):
    needs(*GUNICORN_NEEDS[kind])
    port = free_port()
    args = gunicorn_args(GUNICORN_APP[kind], WORKER[kind], port) + list(extra)
    return server(tmp_path, args, port)


def pids_answering(port, count):
    return [get(port)["pid"] for _ in range(count)]


@pytest.mark.parametrize("kind", KINDS)
def test_each_worker_accepts_on_a_socket_of_its_own(tmp_path, kind):
    with start(tmp_path, kind) as srv:
        srv.wait_ready()
        workers, listening = settled(srv, 2)
        # gunicorn's own listener is one of them (the master holds them all)
        assert "SO_REUSEPORT socket of its own" in srv.log()
        # 80 new connections over two sockets: both workers get some
        pids = pids_answering(srv.port, 80)
        assert set(pids) == set(workers), (pids, workers)
        assert min(pids.count(p) for p in workers) >= 10, pids
        assert srv.stop() == 0
        assert "Shutting down: Master" in srv.log()


def connect_and_ask(port):
    """A request on a new connection, sent at once: its answer's pid."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data
    import json
    return json.loads(body)["pid"]


@pytest.mark.parametrize("kind", KINDS)
def test_connections_queued_for_a_dead_worker_are_answered(tmp_path, kind):
    """A worker stopped (SIGSTOP) while connections arrive for it, then
    killed: its replacement, on the same socket, answers them all."""
    with start(tmp_path, kind) as srv:
        srv.wait_ready()
        workers, listening = settled(srv, 2)
        victim = min(workers)
        victim_socket = next(iter(workers[victim]))
        os.kill(victim, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(20) as pool:
                answers = [pool.submit(connect_and_ask, srv.port) for _ in range(20)]
                # some of the 20 wait in the stopped worker's queue
                deadline = time.monotonic() + 10
                while queue_length(srv.port, victim_socket) == 0:
                    assert time.monotonic() < deadline, "nothing queued for the stopped worker"
                    time.sleep(0.05)
                os.kill(victim, signal.SIGKILL)
                pids = [a.result(timeout=SETTLE_TIMEOUT) for a in answers]
        finally:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert victim not in pids
        after, listening_after = settled(srv, 2)
        assert listening_after == listening            # the same two sockets
        replacement = next(p for p in after if p not in workers)
        assert after[replacement] == {victim_socket}   # the dead worker's, taken over
        assert replacement in pids                     # it answered the queued ones


def queue_length(port, inode):
    """Connections waiting in the accept queue of the listening socket
    `inode` (rx_queue of /proc/net/tcp, for a listening socket)."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[9]) == inode:
                    return int(fields[4].split(":")[1], 16)
    return 0


class Client:
    """Requests one after another on new connections, in a thread, until
    stopped; keeps the pids that answered and the errors."""

    def __init__(self, port):
        self.port, self.pids, self.errors = port, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.pids.append(connect_and_ask(self.port))
            except (OSError, AssertionError) as exc:
                self.errors.append(exc)
            time.sleep(0.005)

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        return self


def check_no_refused(client):
    refused = [e for e in client.errors if isinstance(e, ConnectionRefusedError)]
    assert not refused, client.errors
    # The servers' own graceful shutdown may close a connection it has
    # accepted and not read yet (uvicorn's and aiohttp's: on gunicorn's own
    # shared socket too); each of these is such a reset, never a refusal.
    assert len(client.errors) <= max(2, len(client.pids) // 50), client.errors


@pytest.mark.parametrize("kind", KINDS)
def test_graceful_reload_keeps_the_sockets(tmp_path, kind):
    """HUP: new workers are forked into the old workers' slots, the old ones
    finish; the listening sockets stay the same, no connection is refused."""
    with start(tmp_path, kind) as srv:
        srv.wait_ready()
        workers, listening = settled(srv, 2)
        client = Client(srv.port)
        try:
            for _ in range(2):
                time.sleep(0.5)
                old = set(workers_of(srv.proc.pid))
                srv.proc.send_signal(signal.SIGHUP)
                deadline = time.monotonic() + SETTLE_TIMEOUT
                while set(workers_of(srv.proc.pid)) & old:
                    assert time.monotonic() < deadline, srv.log()
                    time.sleep(0.05)
                after, listening_after = settled(srv, 2)
                assert listening_after == listening
                assert not set(after) & old
            time.sleep(0.5)
        finally:
            client.stop()
        check_no_refused(client)
        assert len(set(client.pids)) >= 4        # the first workers and the reloads'
        assert srv.stop() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_max_requests_restarts_keep_the_sockets(tmp_path, kind):
    with start(tmp_path, kind, "--max-requests", "40") as srv:
        srv.wait_ready()
        workers, listening = settled(srv, 2)
        client = Client(srv.port)
        try:
            deadline = time.monotonic() + 40
            while len(set(client.pids)) < 5:
                assert time.monotonic() < deadline, (client.pids, client.errors, srv.log())
                time.sleep(0.1)
        finally:
            client.stop()
        check_no_refused(client)
        after, listening_after = settled(srv, 2)
        assert listening_after == listening
        assert srv.stop() == 0


@pytest.mark.parametrize("kind", ["uvicorn"])
def test_more_and_fewer_workers(tmp_path, kind):
    """TTIN adds a worker with a socket of its own; TTOU kills the oldest
    worker, whose socket is gunicorn's own listener: that one takes over
    another worker's socket, and the surplus closes, so no socket is left
    that nobody accepts on."""
    with start(tmp_path, kind) as srv:
        srv.wait_ready()
        workers, listening = settled(srv, 2)
        srv.proc.send_signal(signal.SIGTTIN)
        three, listening3 = settled(srv, 3)
        assert listening < listening3
        assert set(pids_answering(srv.port, 90)) == set(three)

        srv.proc.send_signal(signal.SIGTTOU)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while len(workers_of(srv.proc.pid)) != 2:
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
        two, listening2 = settled(srv, 2)
        assert min(workers) not in two               # the oldest went
        assert "the listener's own socket closes, it takes over another worker's" in srv.log()
        assert len(listening2) == 2 and listening2 < listening3
        pids = pids_answering(srv.port, 60)
        assert set(pids) == set(two)
        srv.proc.send_signal(signal.SIGTTOU)
        one, listening1 = settled(srv, 1)
        # the oldest again, which holds gunicorn's listener since the first TTOU
        assert srv.log().count("tideloop.workers: fewer workers:") == 2, srv.log()
        assert set(pids_answering(srv.port, 10)) == set(one)
        assert srv.stop() == 0


def test_gunicorn_reuse_port_is_refused(tmp_path):
    """gunicorn 24+'s --reuse-port binds a socket in each worker after fork
    (and none in the arbiter): the worker classes say to leave it out."""
    needs("gunicorn", "uvicorn_worker")
    import gunicorn
    if gunicorn.version_info < (24,):
        pytest.skip("gunicorn 23's --reuse-port binds the arbiter's socket, which the "
                    "workers take as their first slot")
    port = free_port()
    args = gunicorn_args(GUNICORN_APP["uvicorn"], WORKER["uvicorn"], port) + ["--reuse-port"]
    with server(tmp_path, args, port) as srv:
        try:
            rc = srv.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail(srv.log())
        assert rc != 0
        assert "leave out gunicorn's reuse_port" in srv.log()


def test_reload_with_fewer_workers_closes_the_surplus_socket(tmp_path):
    """A HUP whose new config asks for fewer workers: the new worker goes to
    gunicorn's own socket, the other socket closes once its old worker is gone."""
    needs(*GUNICORN_NEEDS["uvicorn"])
    conf = tmp_path / "gunicorn_conf.py"
    conf.write_text("workers = 2\n")
    port = free_port()
    args = gunicorn_args(GUNICORN_APP["uvicorn"], WORKER["uvicorn"], port) + ["-c", str(conf)]
    args.remove("-w")
    args.remove("2")
    with server(tmp_path, args, port) as srv:
        srv.wait_ready()
        workers, listening = settled(srv, 2)
        master_before = socket_inodes(srv.proc.pid) & listening
        conf.write_text("workers = 1\n")
        srv.proc.send_signal(signal.SIGHUP)
        one, listening1 = settled(srv, 1)
        assert not set(one) & set(workers)
        assert len(listening1) == 1 and listening1 < master_before
        assert "tideloop.workers: fewer workers: a worker socket closes" in srv.log()
        assert set(pids_answering(srv.port, 10)) == set(one)
        assert srv.stop() == 0


# -- the arbiter's bookkeeping, without processes -----------------------------------

class FakeWorker:
    pass


class FakeArbiter:
    """What _Slots reads of gunicorn's Arbiter: LISTENERS, WORKERS,
    num_workers, cfg, log."""

    def __init__(self, workers=2):
        import logging

        from gunicorn import sock
        from gunicorn.config import Config
        self.cfg = Config()
        self.cfg.set("bind", [f"127.0.0.1:{free_port()}"])
        self.log = logging.getLogger("test.arbiter")
        self.LISTENERS = sock.create_sockets(self.cfg, self.log)
        self.WORKERS = {}
        self.num_workers = workers
        self.next_pid = 1

    def spawn(self, slots):
        w = FakeWorker()
        w.pid = "[booting]"
        slots.assign(self, w)
        w.pid = self.next_pid          # as gunicorn's spawn_worker does after fork
        self.WORKERS[self.next_pid] = w
        self.next_pid += 1
        return w

    def reap(self, slots, w):
        pid = next(p for p, x in self.WORKERS.items() if x is w)
        del self.WORKERS[pid]
        slots.exited(self)

    def close(self, slots):
        for s in slots.slots + slots.retired:
            s.close()
        for lnr in self.LISTENERS:
            lnr.close()


def test_slots_bookkeeping():
    needs("gunicorn", "uvicorn_worker")
    from tideloop.workers import _Slots
    slots, arbiter = _Slots(), FakeArbiter(workers=2)
    try:
        a, b = arbiter.spawn(slots), arbiter.spawn(slots)
        assert a.sockets == arbiter.LISTENERS                  # slot 0: gunicorn's own
        assert b.sockets != a.sockets and len(slots.slots) == 2
        port = arbiter.LISTENERS[0].getsockname()
        assert b.sockets[0].getsockname() == port
        assert not b.sockets[0].get_inheritable()              # not across a USR2 re-exec

        # a restart: the replacement gets the dead worker's slot (b dies
        # before anything else happened in the arbiter)
        arbiter.reap(slots, b)
        assert len(slots.slots) == 2                           # the socket stays open
        b2 = arbiter.spawn(slots)
        assert b2.sockets == b.sockets

        # a reload: new workers beside the old ones, one per slot
        c, d = arbiter.spawn(slots), arbiter.spawn(slots)
        assert {id(c.sockets[0]), id(d.sockets[0])} == {id(a.sockets[0]), id(b.sockets[0])}
        for w in (a, b2):
            arbiter.reap(slots, w)
        assert len(slots.slots) == 2

        # an exit while a pre_fork runs (gunicorn 23 reaps from its SIGCHLD
        # handler) waits for the end of the pre_fork
        arbiter.num_workers = 1
        slots.busy = True
        arbiter.reap(slots, d)
        assert slots.deferred is arbiter and len(slots.slots) == 2
        slots.busy = False
        assert c.sockets == arbiter.LISTENERS and d.sockets != c.sockets
        slots.exited(arbiter)           # the next call runs the deferred one too
        assert slots.deferred is None
        assert len(slots.slots) == 1                           # d's socket closed
        assert d.sockets[0].sock is None
    finally:
        arbiter.close(slots)
