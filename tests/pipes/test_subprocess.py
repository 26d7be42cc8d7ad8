"""Subprocesses: asyncio.create_subprocess_exec/_shell and
loop.subprocess_exec/_shell with a SubprocessProtocol; exit codes and
signals; stdio as PIPE/DEVNULL/STDOUT/fd/file; the Popen keywords; large
transfers and flow control; errors; reaping (no zombie, no fd leaked);
explicit child watchers; tideloop's waiter-thread fallback when pidfd_open()
is unavailable.

Every test runs on the stock selector loop (the spec) and on tideloop unless
marked tideloop-only.  The policy's child watcher is reset to None around
each test: the stock loop installs a ThreadedChildWatcher on first use, and
tideloop honours a watcher that is set, so without the reset every tideloop
test after a stock one would exercise the watcher path, not its own."""
import asyncio
import errno
import gc
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

from loop_helpers import sigint_default_kwargs
from net_helpers import arun, fd_leak_check, open_fds, raise_nofile, wait, wait_until

PY = [sys.executable, "-I", "-S", "-c"]
SH = "/bin/sh"

PREEXEC_ONLY_IN_MAIN = pytest.mark.main_interpreter(
    "preexec_fn: a subinterpreter refuses it (RuntimeError: preexec_fn not supported "
    "within subinterpreters), on both loops")
# Without pidfds the stock loop watches each child from a daemon thread
# (asyncio's thread-per-child watcher), and an isolated subinterpreter refuses
# daemon threads (RuntimeError: daemon threads are disabled in this
# (sub)interpreter).
NO_PIDFD_ONLY_IN_MAIN = pytest.mark.main_interpreter(
    "without pidfds asyncio watches each child from a daemon thread, which an isolated "
    "subinterpreter refuses (RuntimeError: daemon threads are disabled)")

# Child watchers: 3.11-3.13 (deprecated, warning, in 3.12-3.13), gone in 3.14.
HAS_CHILD_WATCHERS = hasattr(asyncio, "set_child_watcher")


def _stock_watches_pidfd():
    """What the stock loop of this interpreter watches a child with when no
    watcher was set: a thread per child on 3.11; a pidfd from 3.12 on, where
    pidfds work (asyncio.unix_events.can_use_pidfd)."""
    can = getattr(asyncio.unix_events, "can_use_pidfd", None)
    return sys.version_info >= (3, 12) and can is not None and can()


STOCK_WATCHES_PIDFD = _stock_watches_pidfd()


def reset_child_watcher(watcher=None):
    if HAS_CHILD_WATCHERS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(watcher)
PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT


# ---------------------------------------------------------------- fixtures


def _children():
    """{pid: state} of this process's children, from /proc."""
    me = os.getpid()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rindex(b")") + 2:].split()
        if int(rest[1]) == me:
            out[int(name)] = rest[0].decode()
    return out


def is_reaped(pid):
    """True once ``pid`` is no longer a child of ours (not even a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):   # gone, or going (ESRCH)
        return True
    rest = stat[stat.rindex(b")") + 2:].split()
    return int(rest[1]) != os.getpid()


def wait_reaped(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    pending = [p for p in pids if not is_reaped(p)]
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
        pending = [p for p in pending if not is_reaped(p)]
    return pending


@pytest.fixture(autouse=True)
def no_new_children():
    """Around every test: the policy's watcher is reset; at the end, no child
    started by the test is left (zombie or running)."""
    reset_child_watcher()
    before = set(_children())
    yield
    reset_child_watcher()
    left = [p for p in set(_children()) - before]
    left = wait_reaped(left, timeout=3.0)
    states = {p: s for p, s in _children().items() if p in left}
    for p in left:  # do not leak them into the next test
        try:
            os.kill(p, signal.SIGKILL)
            os.waitpid(p, 0)
        except OSError:
            pass
    assert not states, f"children left behind (pid: state): {states}"


@pytest.fixture
def fds_checked():
    before = open_fds()
    yield
    fd_leak_check(before)


def xfail_on_tideloop(request, loop_name, reason):
    """A known tideloop divergence from the stock loop (see the reason)."""
    if loop_name == "tideloop":
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))


class SubRecorder(asyncio.SubprocessProtocol):
    """Records SubprocessProtocol callbacks in order."""

    def __init__(self, loop):
        self.loop = loop
        self.events = []
        self.data = {1: bytearray(), 2: bytearray()}
        self.transport = None
        self.made = loop.create_future()
        self.exited = loop.create_future()
        self.lost = loop.create_future()

    def connection_made(self, transport):
        self.events.append(("made",))
        self.transport = transport
        self.made.set_result(transport)

    def pipe_data_received(self, fd, data):
        assert type(data) is bytes
        if not self.events or self.events[-1] != ("data", fd):
            self.events.append(("data", fd))
        self.data[fd] += data

    def pipe_connection_lost(self, fd, exc):
        self.events.append(("pipe_lost", fd, exc))

    def process_exited(self):
        self.events.append(("exited",))
        self.exited.set_result(self.transport.get_returncode())

    def connection_lost(self, exc):
        self.events.append(("lost", exc))
        self.lost.set_result(exc)

    def check_order(self, fds):
        """The order constraints that hold on the stock loop."""
        ev = self.events
        assert ev[0] == ("made",), ev
        assert ev[-1] == ("lost", None), ev
        assert ev.count(("exited",)) == 1, ev
        assert sum(e[0] == "lost" for e in ev) == 1, ev
        for fd in fds:
            lost = [i for i, e in enumerate(ev) if e == ("pipe_lost", fd, None)]
            assert len(lost) == 1, (fd, ev)
            data = [i for i, e in enumerate(ev) if e == ("data", fd)]
            assert all(i < lost[0] for i in data), (fd, ev)
        assert sum(e[0] == "pipe_lost" for e in ev) == len(fds), ev


def py(code):
    return [*PY, code]


# ---------------------------------------------------------------- basics


def test_exec_communicate(loop, fds_checked):
    code = ("import sys; d = sys.stdin.buffer.read(); "
            "sys.stdout.buffer.write(d.upper()); sys.stderr.buffer.write(b'err:' + d); "
            "sys.exit(3)")

    async def main():
        proc = await asyncio.create_subprocess_exec(
            *py(code), stdin=PIPE, stdout=PIPE, stderr=PIPE)
        assert proc.pid > 0 and proc.returncode is None
        assert all(s is not None for s in (proc.stdin, proc.stdout, proc.stderr))
        out, err = await wait(proc.communicate(b"hello"))
        assert (out, err) == (b"HELLO", b"err:hello")
        assert proc.returncode == 3
        assert await proc.wait() == 3
        return proc.pid

    pid = arun(loop, main())
    assert is_reaped(pid)


def test_shell(loop, fds_checked):
    async def main():
        proc = await asyncio.create_subprocess_shell(
            "echo \"$GREETING\" from sh; echo oops >&2; exit 7",
            stdout=PIPE, stderr=PIPE, env={"GREETING": "hi", "PATH": os.defpath})
        out, err = await wait(proc.communicate())
        assert (out, err, proc.returncode) == (b"hi from sh\n", b"oops\n", 7)

    arun(loop, main())


@pytest.mark.parametrize("code", [0, 1, 2, 42, 127, 255])
def test_exit_codes(loop, code):
    async def main():
        proc = await asyncio.create_subprocess_exec(SH, "-c", f"exit {code}")
        assert await wait(proc.wait()) == code
        assert proc.returncode == code

    arun(loop, main())


@pytest.mark.parametrize("how", ["send_signal", "terminate", "kill", "self"])
def test_killed_by_signal(loop, how):
    expected = {"send_signal": -signal.SIGUSR1, "terminate": -signal.SIGTERM,
                "kill": -signal.SIGKILL, "self": -signal.SIGUSR2}[how]

    async def main():
        if how == "self":
            proc = await asyncio.create_subprocess_exec(SH, "-c", "kill -USR2 $$; sleep 5")
        else:
            # the child tells us (one line) when it is running
            proc = await asyncio.create_subprocess_exec(
                SH, "-c", "echo ready; exec sleep 10", stdout=PIPE)
            assert await wait(proc.stdout.readline()) == b"ready\n"
            if how == "send_signal":
                proc.send_signal(signal.SIGUSR1)
            else:
                getattr(proc, how)()
        assert await wait(proc.wait()) == expected
        assert proc.returncode == expected
        # wait() may return before the transport finished (its pipes closing;
        # gh-119710). Until then, 3.14+ ignores a signal to the exited child.
        transport = proc._transport
        if sys.version_info >= (3, 14) and transport._proc is not None:
            assert proc.kill() is None and proc.send_signal(signal.SIGTERM) is None
        # Once the transport finished, signalling is an error.
        await wait_until(lambda: transport._proc is None)
        for meth in (proc.kill, proc.terminate, lambda: proc.send_signal(signal.SIGTERM)):
            with pytest.raises(ProcessLookupError):
                meth()

    arun(loop, main())


def test_wait_from_many_tasks(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec(SH, "-c", "sleep 0.05; exit 9")
        codes = await wait(asyncio.gather(*(proc.wait() for _ in range(10))))
        assert codes == [9] * 10
        assert await proc.wait() == 9

    arun(loop, main())


def test_communicate_large(loop, fds_checked):
    """16 MiB in and out through cat, both directions at once."""
    payload = os.urandom(1 << 20) * 16

    async def main():
        proc = await asyncio.create_subprocess_exec("cat", stdin=PIPE, stdout=PIPE)
        out, err = await wait(proc.communicate(payload), 20)
        assert err is None and proc.returncode == 0
        assert len(out) == len(payload)
        assert hashlib.sha256(out).digest() == hashlib.sha256(payload).digest()

    arun(loop, main(), timeout=25)


def test_stream_write_and_read(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec("cat", stdin=PIPE, stdout=PIPE)
        for i in range(50):
            proc.stdin.write(b"line %d\n" % i)
            await proc.stdin.drain()
            assert await wait(proc.stdout.readline()) == b"line %d\n" % i
        proc.stdin.write(b"tail")
        proc.stdin.write_eof()
        assert await wait(proc.stdout.read()) == b"tail"
        assert await wait(proc.wait()) == 0

    arun(loop, main())


def test_input_to_child_that_does_not_read(loop):
    """communicate(input) with a child that exits without reading stdin: the
    broken pipe is swallowed; the exit code is reported."""
    async def main():
        proc = await asyncio.create_subprocess_exec(SH, "-c", "exit 4", stdin=PIPE, stdout=PIPE)
        out, err = await wait(proc.communicate(b"x" * (4 << 20)))
        assert (out, err, proc.returncode) == (b"", None, 4)

    arun(loop, main())


# ---------------------------------------------------------------- protocol


def test_protocol_callbacks(loop, fds_checked):
    code = ("import sys, os\n"
            "d = sys.stdin.buffer.read()\n"
            "os.write(1, b'out:' + d)\n"
            "os.write(2, b'err:' + d)\n"
            "sys.exit(5)\n")

    async def main():
        tr, p = await loop.subprocess_exec(lambda: SubRecorder(loop), *py(code),
                                           stdin=PIPE, stdout=PIPE, stderr=PIPE)
        assert p.made.done() and p.transport is tr
        assert isinstance(tr, asyncio.SubprocessTransport)
        pid = tr.get_pid()
        assert pid > 0 and tr.get_returncode() is None
        assert isinstance(tr.get_extra_info("subprocess"), subprocess.Popen)
        assert tr.get_extra_info("subprocess").pid == pid
        assert not tr.is_closing()
        stdin = tr.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        for fd in (1, 2):
            assert isinstance(tr.get_pipe_transport(fd), asyncio.ReadTransport)
        assert tr.get_pipe_transport(3) is None
        stdin.write(b"payload")
        stdin.close()
        assert await wait(p.exited) == 5
        assert await wait(p.lost) is None
        assert tr.get_returncode() == 5
        assert bytes(p.data[1]) == b"out:payload" and bytes(p.data[2]) == b"err:payload"
        p.check_order([0, 1, 2])
        tr.close()
        assert tr.is_closing()
        tr.close()
        return pid

    pid = arun(loop, main())
    assert is_reaped(pid)


def test_protocol_no_pipes(loop, fds_checked):
    async def main():
        tr, p = await loop.subprocess_exec(lambda: SubRecorder(loop), SH, "-c", "exit 2",
                                           stdin=None, stdout=None, stderr=None)
        for fd in (0, 1, 2):
            assert tr.get_pipe_transport(fd) is None
        assert await wait(p.lost) is None
        assert p.events == [("made",), ("exited",), ("lost", None)]
        assert tr.get_returncode() == 2
        tr.close()

    arun(loop, main())


def test_protocol_shell(loop):
    async def main():
        tr, p = await loop.subprocess_shell(lambda: SubRecorder(loop), "echo shell-out",
                                            stdin=DEVNULL, stdout=PIPE, stderr=DEVNULL)
        assert tr.get_pipe_transport(0) is None and tr.get_pipe_transport(2) is None
        await wait(p.lost)
        assert bytes(p.data[1]) == b"shell-out\n"
        p.check_order([1])
        tr.close()

    arun(loop, main())


def test_transport_kill_terminate_send_signal(loop):
    async def main():
        for meth, sig in (("kill", signal.SIGKILL), ("terminate", signal.SIGTERM),
                          ("send_signal", signal.SIGINT)):
            # (sh cannot undo a SIGINT ignored on entry: the child starts
            # with the default, whatever this run has)
            tr, p = await loop.subprocess_exec(
                lambda: SubRecorder(loop), SH, "-c", "echo go; exec sleep 10", stdout=PIPE,
                **sigint_default_kwargs())
            await wait_until(lambda: bytes(p.data[1]) == b"go\n")
            if meth == "send_signal":
                tr.send_signal(sig)
            else:
                getattr(tr, meth)()
            assert await wait(p.exited) == -sig
            await wait(p.lost)
            assert tr.get_returncode() == -sig
            p.check_order([0, 1, 2])
            with pytest.raises(ProcessLookupError):
                tr.kill()
            tr.close()

    arun(loop, main())


def test_transport_close_kills_running_child(loop):
    async def main():
        tr, p = await loop.subprocess_exec(
            lambda: SubRecorder(loop), SH, "-c", "echo go; exec sleep 10", stdout=PIPE)
        await wait_until(lambda: bytes(p.data[1]) == b"go\n")
        tr.close()
        assert tr.is_closing()
        await wait(p.lost)
        assert tr.get_returncode() == -signal.SIGKILL
        assert ("exited",) in p.events

    arun(loop, main())


def test_exception_in_pipe_data_received(loop):
    boom = ValueError("boom")

    class P(SubRecorder):
        def pipe_data_received(self, fd, data):
            super().pipe_data_received(fd, data)
            raise boom

    async def main():
        calls = []
        loop.set_exception_handler(lambda lp, ctx: calls.append(ctx))
        tr, p = await loop.subprocess_exec(lambda: P(loop), SH, "-c", "echo hi", stdout=PIPE)
        await wait(p.lost)
        assert calls and calls[0]["exception"] is boom
        assert bytes(p.data[1]) == b"hi\n"
        tr.close()

    arun(loop, main())


# ---------------------------------------------------------------- stdio


def test_stdio_devnull(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec(
            SH, "-c", "cat; echo out; echo err >&2", stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
        assert proc.stdin is None and proc.stdout is None and proc.stderr is None
        assert await wait(proc.communicate()) == (None, None)
        assert proc.returncode == 0

    arun(loop, main())


def test_stderr_to_stdout(loop):
    async def main():
        proc = await asyncio.create_subprocess_exec(
            SH, "-c", "echo one; echo two >&2; echo three", stdout=PIPE, stderr=STDOUT)
        assert proc.stderr is None
        out, err = await wait(proc.communicate())
        assert (out, err) == (b"one\ntwo\nthree\n", None)

    arun(loop, main())


def test_stdio_fds_and_files(loop, tmp_path, fds_checked):
    infile = tmp_path / "in"
    infile.write_bytes(b"from a file\n")
    r, w = os.pipe()

    async def main():
        # stdin from a file object, stdout into a raw fd (a pipe), stderr to a file
        with open(infile, "rb") as fin, open(tmp_path / "err", "wb") as ferr:
            proc = await asyncio.create_subprocess_exec(
                SH, "-c", "cat; echo to-err >&2", stdin=fin, stdout=w, stderr=ferr)
            assert proc.stdin is None and proc.stdout is None and proc.stderr is None
            assert await wait(proc.wait()) == 0
        os.close(w)
        assert os.read(r, 100) == b"from a file\n"
        assert (tmp_path / "err").read_bytes() == b"to-err\n"
        # stdin from a raw fd, stdout to a file object
        rr, ww = os.pipe()
        os.write(ww, b"through an fd")
        os.close(ww)
        with open(tmp_path / "out", "wb") as fout:
            proc = await asyncio.create_subprocess_exec("cat", stdin=rr, stdout=fout)
            assert await wait(proc.wait()) == 0
        os.close(rr)
        assert (tmp_path / "out").read_bytes() == b"through an fd"

    try:
        arun(loop, main())
    finally:
        os.close(r)


# ---------------------------------------------------------------- Popen keywords


def run_capture(loop, args, **kw):
    async def main():
        proc = await asyncio.create_subprocess_exec(*args, stdout=PIPE, **kw)
        out, _ = await wait(proc.communicate())
        return proc.returncode, out

    return arun(loop, main())


def test_cwd_env_executable(loop, tmp_path):
    assert run_capture(loop, [SH, "-c", "pwd"], cwd=tmp_path) == (0, f"{tmp_path}\n".encode())
    assert run_capture(loop, [SH, "-c", "pwd"], cwd=str(tmp_path)) == (0, f"{tmp_path}\n".encode())
    os.environ["TIDELOOP_TEST_PARENT_ONLY"] = "parent"
    try:
        assert run_capture(loop, [SH, "-c", 'echo "$ONLY:$TIDELOOP_TEST_PARENT_ONLY"'],
                           env={"ONLY": "this"}) == (0, b"this:\n")
        assert run_capture(loop, [SH, "-c", 'echo "$ONLY:$TIDELOOP_TEST_PARENT_ONLY"']
                           ) == (0, b":parent\n")
    finally:
        del os.environ["TIDELOOP_TEST_PARENT_ONLY"]
    assert run_capture(loop, ["fake-name", "-c", 'echo "$0"'], executable=SH) == (0, b"fake-name\n")
    assert run_capture(loop, [os.fsencode(SH), b"-c", b"echo bytes-args"]) == (0, b"bytes-args\n")


def test_pass_fds_and_close_fds(loop, fds_checked):
    r, w = os.pipe()
    r2, w2 = os.pipe()
    os.set_inheritable(w2, True)
    code = ("import os, sys\n"
            "fd = int(sys.argv[1])\n"
            "try:\n"
            "    os.write(fd, b'child wrote')\n"
            "    print('ok')\n"
            "except OSError as e:\n"
            "    print('closed', e.errno)\n")
    try:
        assert run_capture(loop, [*py(code), str(w)], pass_fds=(w,)) == (0, b"ok\n")
        assert os.read(r, 100) == b"child wrote"
        # not passed: closed in the child
        assert run_capture(loop, [*py(code), str(w)]) == (0, b"closed %d\n" % errno.EBADF)
        # inheritable and close_fds=False: inherited; close_fds=True: not
        assert run_capture(loop, [*py(code), str(w2)], close_fds=False) == (0, b"ok\n")
        assert os.read(r2, 100) == b"child wrote"
        assert run_capture(loop, [*py(code), str(w2)], close_fds=True) == (0, b"closed %d\n" % errno.EBADF)
    finally:
        for fd in (r, w, r2, w2):
            os.close(fd)


def test_session_and_process_group(loop):
    code = "import os; print(os.getpid() == os.getsid(0), os.getpid() == os.getpgid(0))"
    assert run_capture(loop, py(code)) == (0, b"False False\n")
    assert run_capture(loop, py(code), start_new_session=True) == (0, b"True True\n")
    assert run_capture(loop, py(code), process_group=0) == (0, b"False True\n")


@PREEXEC_ONLY_IN_MAIN
def test_umask_and_preexec_fn(loop):
    code = "import os; print(oct(os.umask(0)), os.nice(0))"
    base = os.nice(0)
    rc, out = run_capture(loop, py(code), umask=0o027, preexec_fn=lambda: os.nice(2))
    assert rc == 0 and out == f"0o27 {min(base + 2, 19)}\n".encode()


@pytest.mark.skipif(os.geteuid() != 0, reason="user/group/extra_groups need root")
def test_user_group_extra_groups(loop):
    code = "import os; print(os.getuid(), os.getgid(), os.getgroups())"
    uid, gid = os.getuid(), os.getgid()
    rc, out = run_capture(loop, py(code), user=uid, group=gid, extra_groups=[gid])
    assert (rc, out) == (0, f"{uid} {gid} [{gid}]\n".encode())


@pytest.mark.parametrize("kw", [
    dict(text=True), dict(universal_newlines=True), dict(encoding="utf-8"),
    dict(errors="strict"), dict(bufsize=1), dict(shell=True),
])
def test_rejected_keywords_exec(loop, kw, fds_checked):
    with pytest.raises(ValueError):
        arun(loop, asyncio.create_subprocess_exec(SH, "-c", "exit 0", **kw))
    with pytest.raises(ValueError):
        arun(loop, loop.subprocess_exec(asyncio.SubprocessProtocol, SH, "-c", "exit 0", **kw))


@pytest.mark.parametrize("kw", [
    dict(text=True), dict(universal_newlines=True), dict(encoding="utf-8"),
    dict(errors="strict"), dict(bufsize=1), dict(shell=False),
])
def test_rejected_keywords_shell(loop, kw):
    with pytest.raises(ValueError):
        arun(loop, loop.subprocess_shell(asyncio.SubprocessProtocol, "exit 0", **kw))


def test_shell_needs_a_string(loop):
    with pytest.raises(ValueError):
        arun(loop, loop.subprocess_shell(asyncio.SubprocessProtocol, [SH, "-c", "true"]))


def test_bad_argument_types(loop, fds_checked):
    with pytest.raises(TypeError):
        arun(loop, asyncio.create_subprocess_exec(SH, "-c", 1))
    with pytest.raises(TypeError):
        arun(loop, asyncio.create_subprocess_exec(SH, "-c", "true", nonsense_keyword=1))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("api", ["create_subprocess_exec", "subprocess_exec", "shell_cwd"])
def test_missing_executable(loop, tmp_path, api, fds_checked):
    missing = str(tmp_path / "no-such-program")

    async def main():
        if api == "create_subprocess_exec":
            await asyncio.create_subprocess_exec(missing, stdin=PIPE, stdout=PIPE, stderr=PIPE)
        elif api == "subprocess_exec":
            await loop.subprocess_exec(asyncio.SubprocessProtocol, missing,
                                       stdin=PIPE, stdout=PIPE, stderr=PIPE)
        else:
            await asyncio.create_subprocess_shell("true", stdout=PIPE, cwd=missing)

    with pytest.raises(FileNotFoundError):
        arun(loop, main())
    gc.collect()


def test_permission_denied(loop, tmp_path, fds_checked):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    # (root too: exec needs an execute bit)
    with pytest.raises(PermissionError):
        arun(loop, asyncio.create_subprocess_exec(str(script), stdout=PIPE))
    gc.collect()


@PREEXEC_ONLY_IN_MAIN
def test_preexec_fn_raising(loop, fds_checked):
    def bad():
        raise RuntimeError("in preexec_fn")

    with pytest.raises(subprocess.SubprocessError):
        arun(loop, asyncio.create_subprocess_exec(SH, "-c", "exit 0", stdout=PIPE, preexec_fn=bad))
    gc.collect()


def test_cancelled_while_starting(loop, fds_checked):
    """Cancelling create_subprocess_exec() while it connects the pipes kills
    and reaps the child."""
    async def main():
        task = loop.create_task(asyncio.create_subprocess_exec(
            SH, "-c", "exec sleep 10", stdin=PIPE, stdout=PIPE, stderr=PIPE))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait(task)
        # The pipes' connection_lost (which closes them) is scheduled by
        # close(); the stock loop may report the child's exit first (seen
        # on 3.13t), so let both loops run what they scheduled.
        for _ in range(10):
            await asyncio.sleep(0.01)

    t0 = time.monotonic()
    arun(loop, main())
    assert time.monotonic() - t0 < 5


# ---------------------------------------------------------------- behaviour


def test_child_closes_stdout_early(loop):
    """The child closes its stdout and keeps running: EOF on stdout while the
    process is alive; its exit is reported later."""
    async def main():
        proc = await asyncio.create_subprocess_exec(
            SH, "-c", "echo bye; exec 1>&-; cat >/dev/null; exit 6", stdin=PIPE, stdout=PIPE)
        assert await wait(proc.stdout.read()) == b"bye\n"
        await asyncio.sleep(0.05)
        assert proc.returncode is None  # still running (blocked on stdin)
        proc.stdin.close()
        assert await wait(proc.wait()) == 6

        tr, p = await loop.subprocess_exec(
            lambda: SubRecorder(loop), SH, "-c", "exec 1>&-; cat >/dev/null",
            stdin=PIPE, stdout=PIPE)
        await wait_until(lambda: ("pipe_lost", 1, None) in p.events)
        await asyncio.sleep(0.05)
        assert ("exited",) not in p.events
        tr.get_pipe_transport(0).close()
        await wait(p.lost)
        assert p.events.index(("pipe_lost", 1, None)) < p.events.index(("exited",))
        p.check_order([0, 1, 2])
        tr.close()

    arun(loop, main())


def test_child_exits_while_grandchild_holds_stdout(loop):
    """The process exits while a grandchild keeps its stdout open: exit is
    reported (wait() returns) before stdout reaches EOF."""
    async def main():
        proc = await asyncio.create_subprocess_exec(
            SH, "-c", "(sleep 0.3; echo late) & echo early; exit 3", stdout=PIPE)
        assert await wait(proc.stdout.readline()) == b"early\n"
        await wait_until(lambda: proc.returncode is not None)
        assert proc.returncode == 3
        assert not proc.stdout.at_eof()
        # wait() itself waits for the pipes too
        assert await wait(proc.wait()) == 3
        assert await wait(proc.stdout.read()) == b"late\n"

        tr, p = await loop.subprocess_exec(
            lambda: SubRecorder(loop), SH, "-c", "(sleep 0.2; echo late) & exit 2",
            stdin=DEVNULL, stdout=PIPE, stderr=DEVNULL)
        assert await wait(p.exited) == 2
        assert ("pipe_lost", 1, None) not in p.events
        await wait(p.lost)
        assert p.events.index(("exited",)) < p.events.index(("pipe_lost", 1, None))
        assert bytes(p.data[1]) == b"late\n"
        p.check_order([1])
        tr.close()

    arun(loop, main())
    # the grandchild is not ours: nothing to reap


def test_flooding_child_with_slow_reader(loop):
    """The child writes 32 MiB as fast as it can; we read slowly.  Reading
    from the pipe pauses (StreamReader limit), so memory stays bounded and
    the child blocks; everything arrives in the end."""
    total = 32 << 20
    limit = 1 << 16
    code = ("import os\n"
            "b = bytes(range(256)) * 4096\n"
            f"for _ in range({total} // len(b)):\n"
            "    os.write(1, b)\n")

    async def main():
        proc = await asyncio.create_subprocess_exec(*py(code), stdout=PIPE, limit=limit)
        first = await wait(proc.stdout.readexactly(10))
        assert first == bytes(range(10))
        await asyncio.sleep(0.3)
        buffered = len(proc.stdout._buffer)
        assert buffered < 2 * limit + (1 << 20), buffered
        assert proc.returncode is None  # blocked: the pipe is not drained
        n = 10
        h = hashlib.sha256(first)
        while True:
            chunk = await wait(proc.stdout.read(1 << 20))
            if not chunk:
                break
            n += len(chunk)
            h.update(chunk)
            assert len(proc.stdout._buffer) < 2 * limit + (1 << 20)
        assert n == total
        assert h.digest() == hashlib.sha256(bytes(range(256)) * (total // 256)).digest()
        assert await wait(proc.wait()) == 0

    arun(loop, main(), timeout=25)


def test_write_flow_control_to_slow_child(loop):
    """Writing faster than the child reads: the stdin pipe transport pauses
    the protocol (drain() blocks) and resumes it."""
    async def main():
        tr, p = await loop.subprocess_exec(
            lambda: FlowRecorder(loop), SH, "-c", "sleep 0.2; exec cat >/dev/null",
            stdin=PIPE)
        stdin = tr.get_pipe_transport(0)
        stdin.set_write_buffer_limits(high=64 * 1024)
        stdin.write(b"x" * (1 << 20))
        assert p.flow == ["pause"]
        assert stdin.get_write_buffer_size() > 0
        await wait(p.resumed)
        assert p.flow == ["pause", "resume"]
        stdin.close()
        await wait(p.lost)
        assert tr.get_returncode() == 0
        p.check_order([0, 1, 2])
        tr.close()

    arun(loop, main())


class FlowRecorder(SubRecorder):
    def __init__(self, loop):
        super().__init__(loop)
        self.flow = []
        self.resumed = loop.create_future()

    def pause_writing(self):
        self.flow.append("pause")

    def resume_writing(self):
        self.flow.append("resume")
        if not self.resumed.done():
            self.resumed.set_result(None)


def test_many_concurrent_subprocesses(loop):
    raise_nofile(2048)
    n = 200

    async def one(i):
        proc = await asyncio.create_subprocess_exec(
            SH, "-c", f"echo {i}; exit {i % 7}", stdout=PIPE)
        out, _ = await proc.communicate()
        return proc.pid, proc.returncode, out

    async def main():
        return await wait(asyncio.gather(*(one(i) for i in range(n))), 25)

    before = open_fds()
    results = arun(loop, main(), timeout=28)
    assert [(rc, out) for _, rc, out in results] == [(i % 7, b"%d\n" % i) for i in range(n)]
    assert len({pid for pid, _, _ in results}) == n
    assert not [pid for pid, _, _ in results if not is_reaped(pid)]
    fd_leak_check(before)


def test_debug_mode_logging(loop, caplog):
    """In debug mode the same lines are logged: the process created, its
    exit seen (DEBUG), the transport noticing it (INFO)."""
    import logging

    loop.set_debug(True)
    try:
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            async def main():
                proc = await asyncio.create_subprocess_exec(SH, "-c", "exit 3")
                assert await wait(proc.wait()) == 3
                return proc.pid

            pid = arun(loop, main())
    finally:
        loop.set_debug(False)
    recs = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "asyncio"]
    assert (logging.DEBUG, f"process {SH!r} created: pid {pid}") in recs, recs
    # Only the thread-per-child watcher logs the exit (3.11's default).
    exit_line = (logging.DEBUG, f"process {pid} exited with returncode 3")
    assert (exit_line not in recs if STOCK_WATCHES_PIDFD else exit_line in recs), recs
    assert [m for lvl, m in recs if lvl == logging.INFO and f"pid={pid}" in m
            and m.endswith(" exited with return code 3")], recs


def test_subprocess_from_loop_in_other_thread(raw_loop_factory):
    """A loop running in a non-main thread can run subprocesses."""
    result = {}

    def target():
        lp = raw_loop_factory()
        try:
            async def main():
                proc = await asyncio.create_subprocess_exec("cat", stdin=PIPE, stdout=PIPE)
                out, _ = await asyncio.wait_for(proc.communicate(b"threaded"), 10)
                procs = [await asyncio.create_subprocess_exec(SH, "-c", f"exit {i}")
                         for i in range(5)]
                codes = await asyncio.wait_for(
                    asyncio.gather(*(p.wait() for p in procs)), 10)
                return out, proc.returncode, codes

            result["value"] = lp.run_until_complete(main())
        except BaseException as e:  # reported by the main thread
            result["error"] = e
        finally:
            lp.close()

    t = threading.Thread(target=target)
    t.start()
    t.join(20)
    assert not t.is_alive()
    if "error" in result:
        raise result["error"]
    assert result["value"] == (b"threaded", 0, [0, 1, 2, 3, 4])


# ---------------------------------------------------------------- watchers


@pytest.mark.parametrize("kind", [
    # (asyncio.ThreadedChildWatcher: a daemon thread per child)
    pytest.param("threaded", marks=pytest.mark.main_interpreter(
        "ThreadedChildWatcher watches each child from a daemon thread, which an isolated "
        "subinterpreter refuses (RuntimeError: daemon threads are disabled)")),
    "pidfd",
    pytest.param("safe", marks=pytest.mark.main_interpreter(
        "SafeChildWatcher installs a SIGCHLD handler: signal handlers work in the main "
        "thread of the main interpreter only"))])
def test_explicit_child_watcher(loop, loop_name, kind):
    """A child watcher set by the application works.  The stock loop always
    uses it; tideloop uses a watcher that reaps every child (Safe, Fast,
    MultiLoop: else it would steal tideloop's children), and keeps its own
    pidfds in place of the per-process ones (Threaded -- which
    get_child_watcher() installs on first use, so "set" says little -- and
    Pidfd), whose behaviour is the same."""
    if not HAS_CHILD_WATCHERS:
        pytest.skip(f"Python {sys.version_info[0]}.{sys.version_info[1]} has no child watchers")
    if kind == "threaded":
        watcher = asyncio.ThreadedChildWatcher()
    elif kind == "pidfd":
        watcher = asyncio.PidfdChildWatcher()
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            watcher = asyncio.SafeChildWatcher()
    reset_child_watcher(watcher)
    if kind != "threaded":
        watcher.attach_loop(loop)
    added = []
    orig = watcher.add_child_handler

    def spy(pid, cb, *args):
        added.append(pid)
        return orig(pid, cb, *args)

    watcher.add_child_handler = spy

    async def main():
        proc = await asyncio.create_subprocess_exec("cat", stdin=PIPE, stdout=PIPE)
        out, _ = await wait(proc.communicate(b"watched"))
        assert (out, proc.returncode) == (b"watched", 0)
        procs = [await asyncio.create_subprocess_exec(SH, "-c", f"exit {i}") for i in range(5)]
        assert await wait(asyncio.gather(*(p.wait() for p in procs))) == list(range(5))
        proc = await asyncio.create_subprocess_exec(SH, "-c", "exec sleep 10")
        proc.kill()
        assert await wait(proc.wait()) == -signal.SIGKILL
        return proc.pid

    try:
        arun(loop, main())
        used = loop_name == "asyncio" or kind == "safe"
        assert len(added) == (7 if used else 0)
    finally:
        reset_child_watcher()


def test_default_path_uses_no_waiter_thread(loop, loop_name):
    """With no watcher set, the stock loop of 3.11 installs a
    ThreadedChildWatcher (a thread per child), 3.12+ a pidfd watcher;
    tideloop watches a pidfd and starts no thread."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:   # e.g. under valgrind, which lacks the syscall
        pytest.skip(f"pidfd_open unavailable here: {exc}")
    started = []
    orig_start = threading.Thread.start

    def spy(self):
        started.append(self.name)
        return orig_start(self)

    async def main():
        threading.Thread.start = spy
        try:
            proc = await asyncio.create_subprocess_exec(SH, "-c", "exit 1")
        finally:
            threading.Thread.start = orig_start
        assert await wait(proc.wait()) == 1

    arun(loop, main())
    if loop_name == "tideloop" or STOCK_WATCHES_PIDFD:
        assert started == []
    else:
        assert len(started) == 1


# ---------------------------------------------------------------- tideloop only


# Requested before the loop: 3.14's stock loop picks its child watcher when it is made.
@pytest.fixture
def no_pidfd(monkeypatch):
    def unavailable(pid, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", unavailable)


@NO_PIDFD_ONLY_IN_MAIN
def test_tideloop_pidfd_unavailable_fallback(no_pidfd, loop, loop_name, fds_checked):
    """TIDELOOP-ONLY: tideloop's own fallback when os.pidfd_open() fails (old
    kernel, seccomp): a thread waits for each child.  Everything works the
    same.  (The stock loop does not call pidfd_open at all; it runs too, as
    a check that the scenario is valid.)"""
    async def main():
        proc = await asyncio.create_subprocess_exec("cat", stdin=PIPE, stdout=PIPE)
        out, _ = await wait(proc.communicate(b"x" * (1 << 20)))
        assert out == b"x" * (1 << 20) and proc.returncode == 0
        procs = [await asyncio.create_subprocess_exec(SH, "-c", f"exit {i}") for i in range(20)]
        assert await wait(asyncio.gather(*(p.wait() for p in procs))) == list(range(20))
        proc = await asyncio.create_subprocess_exec(SH, "-c", "echo go; exec sleep 10", stdout=PIPE)
        assert await wait(proc.stdout.readline()) == b"go\n"
        proc.terminate()
        assert await wait(proc.wait()) == -signal.SIGTERM
        tr, p = await loop.subprocess_exec(lambda: SubRecorder(loop), SH, "-c", "echo hi; exit 3",
                                           stdout=PIPE)
        assert await wait(p.exited) == 3
        await wait(p.lost)
        p.check_order([0, 1, 2])
        tr.close()
        return [pp.pid for pp in procs]

    started = []
    orig_start = threading.Thread.start

    def spy(self):
        started.append(self.name)
        return orig_start(self)

    threading.Thread.start = spy
    try:
        pids = arun(loop, main())
    finally:
        threading.Thread.start = orig_start
    assert not [pid for pid in pids if not is_reaped(pid)]
    # one waiter thread per child: 1 + 20 + 1 + 1 (stock: its own watcher's)
    assert sum("waitpid-" in name for name in started) == 23, started


@NO_PIDFD_ONLY_IN_MAIN
def test_tideloop_pidfd_fallback_loop_closed_with_child(new_loop, no_pidfd):
    """TIDELOOP-ONLY path (runs on both): no pidfd, the loop closes while the
    child runs; the waiter thread still reaps it."""
    loop = new_loop()

    async def main():
        return await asyncio.create_subprocess_exec(SH, "-c", "sleep 0.2")

    proc = loop.run_until_complete(main())
    pid = proc.pid
    loop.close()
    assert wait_reaped([pid]) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        del proc
        gc.collect()


# ---------------------------------------------------------------- loop closing


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("pipes", [False, True])
def test_loop_closed_with_child_running(new_loop, loop_name, pipes, caplog):
    """The loop closes while a child runs: the child is still reaped when it
    exits (no zombie), on tideloop and on 3.11's stock loop.  A deliberate
    difference from 3.12+: the stock pidfd watcher's reader dies with the
    loop and the child stays a zombie (asserted, then reaped here)."""
    loop = new_loop()
    kw = dict(stdin=PIPE, stdout=PIPE, stderr=PIPE) if pipes else {}

    async def main():
        proc = await asyncio.create_subprocess_exec(SH, "-c", "sleep 0.2", **kw)
        return proc

    proc = loop.run_until_complete(main())
    pid = proc.pid
    loop.close()
    assert not is_reaped(pid)
    if loop_name == "asyncio" and STOCK_WATCHES_PIDFD:
        assert wait_reaped([pid], timeout=1.0) == [pid]
        os.waitpid(pid, 0)
    else:
        assert wait_reaped([pid]) == [], "zombie (or still running) after loop close"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        del proc
        gc.collect()
