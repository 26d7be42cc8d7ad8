"""The live view: tideloop.diagnostics.serve() and ``python -m tideloop top
PID`` (issue 13, part 6).

Each test runs a real child process with a tideloop loop (opted in by a
call, by TIDELOOP_DIAGNOSTICS=serve, or not at all) and a planted blocking
callback, then runs ``top`` as another process and reads what it printed.
The errors (no such process, permission denied, not opted in, no tideloop)
are checked by their one-line messages.  On Python 3.14 ``top`` attaches
to a process that did not opt in with sys.remote_exec."""
import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from loop_helpers import SLOW, child_env, sigint_default_kwargs
from tideloop import _diag_live, diagnostics

TIMEOUT = 30
HAS_REMOTE_EXEC = hasattr(sys, "remote_exec")

CHILD = r'''
import asyncio, json, os, signal, sys, time
import tideloop
from tideloop import diagnostics

# call: serve() and the reports turned on here; env: TIDELOOP_DIAGNOSTICS did
# it; plain: no opt-in; idle: no opt-in and nothing to do until stdin has a line.
MODE = sys.argv[1]


def blocker():
    # Long against the 0.05 s stall threshold: on a loaded machine the
    # watchdog's thread may wake late, and its capture must still find the
    # stall going on to take the stack.
    time.sleep(0.5)         # the planted stall and slow callback


def stall():
    time.sleep(float(os.environ.get("STALL", "3")))


async def worker():
    while True:
        await asyncio.sleep(0.01)
        sum(range(5000))


async def main():
    loop = asyncio.get_running_loop()
    path = None
    if MODE == "call":
        path = diagnostics.serve()
        diagnostics.watch_stalls(0.05)
        diagnostics.report_slow_callbacks(0.03)
        if hasattr(diagnostics, "track_tasks"):
            diagnostics.track_tasks()
    elif MODE == "env":
        path = sys.modules["tideloop._diag_live"]._server.path
    loop.add_signal_handler(signal.SIGUSR1, stall)
    if MODE != "idle":
        for i in range(2):
            asyncio.create_task(worker(), name="worker-%d" % i)
        loop.call_soon(blocker)
        await asyncio.sleep(0.3)
    done = loop.create_future()

    def on_stdin():                 # a line wakes the loop; EOF ends the child
        if not os.read(0, 1024):
            loop.remove_reader(0)
            done.set_result(None)

    loop.add_reader(0, on_stdin)
    print(json.dumps({"path": path}), flush=True)
    await done


tideloop.run(main())
'''


@contextmanager
def child(tmp_path, mode="call", env=None):
    """A child running CHILD in mode; yields (process, the path it printed)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    errors = open(tmp_path / ("child-%s.err" % mode), "w+")
    proc = subprocess.Popen([sys.executable, str(script), mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=errors, env=child_env(env))
    try:
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
        line = proc.stdout.readline() if ready else b""
        if not line:
            proc.kill()
            proc.wait()
            errors.seek(0)
            pytest.fail("the child did not start:\n" + errors.read())
        yield proc, json.loads(line)["path"]
    finally:
        try:
            proc.stdin.close()
            proc.wait(10)
        except (subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.wait()
        proc.stdout.close()
        errors.close()


def top(*args, env=None, executable=None, **kw):
    return subprocess.run([executable or sys.executable, "-m", "tideloop", "top",
                           *map(str, args)], capture_output=True, text=True,
                          env=env or child_env(), timeout=TIMEOUT, **kw)


def view(pid, **kw):
    r = top(pid, "--json", **kw)
    assert r.returncode == 0 and not r.stderr, r
    return json.loads(r.stdout)


def innermost(stack):
    return stack[-1][2] if stack else None


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def error_line(r):
    """top failed with one line on stderr and no traceback."""
    assert r.returncode == 1, r
    assert r.stdout == "" and "Traceback" not in r.stderr, r
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tideloop top: "), r
    return lines[0]


# -- opted in -------------------------------------------------------------------


def test_serve_call_and_the_json_view(tmp_path):
    with child(tmp_path, "call", env={"XDG_RUNTIME_DIR": ""}) as (proc, path):
        # The socket: <pid>.sock in /tmp/tideloop-<uid>, 0600 in a 0700 directory.
        assert path == "/tmp/tideloop-%d/%d.sock" % (os.getuid(), proc.pid)
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.getuid()
        d = os.stat(os.path.dirname(path))
        assert stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == os.getuid()

        doc = view(proc.pid)
        assert doc["pid"] == proc.pid and doc["python"] == "%d.%d.%d" % sys.version_info[:3]
        (loop,) = doc["loops"]
        assert loop["label"] == "loop-1 (thread MainThread)" and loop["running"]
        h = loop["health"]
        assert h["iterations"] > 0 and h["callbacks"] > 0 and h["timers_fired"] > 0
        assert h["time_running"] > 0.5 and h["callback_timing"] is True
        assert loop["summaries"]["callback"]["max"] >= 0.5
        assert len(loop["histograms"]["callback"]["counts"]) == 64
        # The planted blocking call, as a stall (with the line) and a slow callback.
        (s,) = loop["stalls"]
        assert loop["watching_stalls"] and loop["stalls_total"] == 1
        assert s["duration"] >= 0.1 and innermost(s["stack"]) == "blocker"
        assert s["stack"][-1][3] == "time.sleep(0.5)         # the planted stall and slow callback"
        (slow,) = loop["slow_callbacks"]
        assert slow["duration"] >= 0.5 and "blocker" in slow["callback"]
        # The loop answered the probe.
        assert 0 <= loop["probe_latency"] < 0.5
        if hasattr(diagnostics, "top_tasks"):
            assert isinstance(loop["tasks"], list)
        else:
            assert loop["tasks"] is None and loop["tasks_note"] == "not available"

        proc.stdin.close()
        assert proc.wait(10) == 0
        assert not os.path.exists(path)             # removed at exit


def test_serve_from_the_environment_and_the_screen(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    spec = "serve,stalls=0.05,slow=0.03"
    with child(tmp_path, "env", env={"XDG_RUNTIME_DIR": str(run),
                                     "TIDELOOP_DIAGNOSTICS": spec}) as (proc, path):
        assert path == str(run / "tideloop" / ("%d.sock" % proc.pid))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(run / "tideloop").st_mode) == 0o700
        # top finds it through the child's environment, not its own.
        env = child_env()
        env.pop("XDG_RUNTIME_DIR", None)
        r = top(proc.pid, "--once", "--interval", "0.5", env=env)
        assert r.returncode == 0 and r.stderr == "", r
        out = r.stdout
    assert out.startswith("tideloop top - pid %d (child.py env) - tideloop " % proc.pid), out
    for heading in ("\nloop-1 (thread MainThread)  [last 0.5 s]\n", "\n  health ",
                    " iterations/s ", " callbacks/s ", " busy ", "\n  latency  callback p50 ",
                    " | lag p50 ", "\n  stalls   1 in all; recent:\n",
                    "blocker: time.sleep(0.5)",
                    # the slow callback was the stall: one incident, one line
                    "\n  slowest recent callbacks: none\n",
                    # both ways to turn tracking on
                    "\n  tasks: (task tracking is off for this loop: TIDELOOP_DIAGNOSTICS=tasks "
                    "(or tideloop.diagnostics.track_tasks()) turns it on)\n"):
        assert heading in out, (heading, out)
    assert out.count("blocker") == 1, out
    assert "\x1b[" not in out       # not a terminal: no escape sequences
    if not hasattr(diagnostics, "top_tasks"):
        assert "\n  tasks: (not available)\n" in out


def test_refreshes_are_separate_frames(tmp_path):
    with child(tmp_path, "call") as (proc, _):
        p = subprocess.Popen([sys.executable, "-m", "tideloop", "top", str(proc.pid),
                              "--interval", "0.3"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env(),
                             **sigint_default_kwargs())     # Ctrl-C reaches it
        try:
            # Ctrl-C once three frames are out (after a fixed 2 s, a run under
            # ASan on a loaded machine had printed one)
            shown, deadline = "", time.monotonic() + TIMEOUT
            while shown.count("tideloop top - pid ") < 3 and time.monotonic() < deadline:
                if select.select([p.stdout], [], [], 0.5)[0]:
                    chunk = os.read(p.stdout.fileno(), 65536).decode()
                    if not chunk:
                        break
                    shown += chunk
            p.send_signal(signal.SIGINT)           # Ctrl-C: exit status 0
            out, err = p.communicate(timeout=TIMEOUT)
            out = shown + out
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 0 and "Traceback" not in err, (out, err)
    frames = out.split("\n\ntideloop top - pid ")
    assert len(frames) >= 3, out
    # Each refresh covers the time since the last one: the interval, or more
    # when the machine is busy (0.4 s was seen on a loaded free-threaded run).
    windows = [re.search(r"loop-1 \(thread MainThread\)  \[last (\d+\.\d) s\]", f)
               for f in frames[1:]]
    assert all(w and 0.3 <= float(w.group(1)) < 2.0 for w in windows), out


@pytest.mark.skipif(not hasattr(diagnostics, "top_tasks"),
                    reason="diagnostics.top_tasks() is not in this tree yet")
def test_top_tasks(tmp_path):
    with child(tmp_path, "call") as (proc, _):
        doc = view(proc.pid)
        (loop,) = doc["loops"]
        names = {t["task"]: t for t in loop["tasks"]}
        assert {"worker-0", "worker-1"} <= set(names), loop["tasks"]
        w = names["worker-0"]
        assert set(w) >= {"task", "coroutine", "cpu", "steps", "age", "idle", "state"}
        assert w["coroutine"] == "worker" and w["steps"] > 0
        r = top(proc.pid, "--once", "--interval", "0.3")
        assert r.returncode == 0, r
        assert "\n  tasks by CPU:\n" in r.stdout and "worker-0" in r.stdout, r.stdout


def test_a_stalled_loop_still_shows_its_health(tmp_path):
    # The stall outlasts the checks by far (on a loaded 3.13t, starting the
    # `top` process alone took longer than a 4 s stall); the child is killed
    # after them rather than waited for.
    with child(tmp_path, "call", env={"STALL": "60"}) as (proc, _):
        before = view(proc.pid)["loops"][0]["health"]["iterations"]
        os.kill(proc.pid, signal.SIGUSR1)          # the loop sleeps in a callback
        time.sleep(0.3)
        t0 = time.monotonic()
        doc = view(proc.pid)
        took = time.monotonic() - t0
        r = top(proc.pid, "--once", "--interval", "0.2")
        proc.kill()
    assert took < 4 * SLOW, took                    # did not wait for the 60 s stall
    (loop,) = doc["loops"]
    assert loop["health"]["iterations"] >= before
    assert loop["tasks"] is None and loop["tasks_note"] == "loop busy (stalled?)"
    assert loop["probe_latency"] is None
    assert innermost(loop["busy_stack"]) == "stall"
    assert r.returncode == 0, r
    assert ("\n  BUSY     the loop did not answer within 0.5 s; its thread is at:\n"
            in r.stdout), r.stdout
    assert ("stall: time.sleep(float(os.environ.get(\"STALL\", \"3\")))\n  stalls "
            in r.stdout), r.stdout
    assert " busy stuck\n" in r.stdout
    assert "\n  tasks: (loop busy (stalled?))\n" in r.stdout


# -- serve() in this process ----------------------------------------------------


@pytest.fixture
def served():
    yield
    _diag_live.stop_serving()


def test_serve_is_idempotent_and_stop_serving_removes_the_socket(tmp_path, served):
    path = diagnostics.serve(tmp_path / "x.sock")
    assert path == str(tmp_path / "x.sock")
    assert diagnostics.serve() == path          # once per process
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert _diag_live.request(path, {"want": "ping"}) == {"pid": os.getpid()}
    assert "unknown request" in _diag_live.request(path, {"want": "?"})["error"]
    diagnostics.stop_serving()
    assert not os.path.exists(path)
    diagnostics.stop_serving()                  # no error when none runs


def test_a_loop_that_is_not_running(tmp_path, served):
    import tideloop
    loop = tideloop.new_event_loop()
    try:
        path = diagnostics.serve(tmp_path / "x.sock")
        doc = _diag_live.request(path, {"want": "view"})
        idle = [e for e in doc["loops"] if e["label"].endswith("(not running)")]
        assert idle and all(not e["running"] and e["tasks_note"] == "loop not running"
                            for e in idle)
        assert loop.diagnostics()["ready"] == 0     # nothing was queued on it
    finally:
        loop.close()


def test_a_directory_others_may_enter_is_refused(tmp_path, monkeypatch, served, caplog):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "tideloop").mkdir(mode=0o755)
    os.chmod(tmp_path / "tideloop", 0o755)
    with pytest.raises(PermissionError, match="open to other users"):
        diagnostics.serve()
    # From the environment, the program runs on without the view.
    import tideloop
    monkeypatch.setenv("TIDELOOP_DIAGNOSTICS", "serve")
    loop = tideloop.new_event_loop()
    loop.close()
    assert "cannot serve the live view: " in caplog.text
    assert os.listdir(tmp_path / "tideloop") == []


def test_a_stale_socket_is_replaced(tmp_path, served):
    import socket
    path = str(tmp_path / "x.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    assert diagnostics.serve(path) == path
    assert _diag_live.request(path, {"want": "ping"}) == {"pid": os.getpid()}


def test_a_socket_in_use_or_a_file_is_not_replaced(tmp_path, served):
    import socket
    path = str(tmp_path / "x.sock")
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(path)
        live.listen()
        with pytest.raises(FileExistsError, match="is in use"):
            diagnostics.serve(path)
    os.unlink(path)
    open(path, "w").close()
    with pytest.raises(FileExistsError, match="exists and is not a socket"):
        diagnostics.serve(path)
    assert os.path.isfile(path)


# -- errors ---------------------------------------------------------------------


def test_no_such_process():
    pid = dead_pid()
    assert error_line(top(pid)) == "tideloop top: no such process: %d" % pid


def test_not_a_tideloop_process():
    p = subprocess.Popen(["sleep", "30"])
    try:
        msg = error_line(top(p.pid))
    finally:
        p.kill()
        p.wait()
    assert msg == ("tideloop top: process %d does not use tideloop (its extension is not "
                   "loaded there)" % p.pid)


def test_not_opted_in(tmp_path):
    # On 3.14 top would attach; a process that refuses remote debugging cannot be.
    env = {"PYTHON_DISABLE_REMOTE_DEBUG": "1"} if HAS_REMOTE_EXEC else None
    with child(tmp_path, "plain", env=env) as (proc, _):
        msg = error_line(top(proc.pid))
    want = ("tideloop top: process %d is not serving the live view; call "
            "tideloop.diagnostics.serve() in it, or start it with TIDELOOP_DIAGNOSTICS=serve"
            % proc.pid)
    if HAS_REMOTE_EXEC:
        assert msg.startswith("tideloop top: cannot attach to process %d: " % proc.pid), msg
        assert msg.endswith("; call tideloop.diagnostics.serve() in it, or start it with "
                            "TIDELOOP_DIAGNOSTICS=serve"), msg
    else:
        assert msg == want + " (on Python 3.14 top attaches without it)"


def _interpreter_for(uid):
    """An interpreter of this version that user uid can run and that imports
    this tideloop (None if there is none)."""
    for exe in (sys.executable, "/usr/bin/python%d.%d" % sys.version_info[:2]):
        try:
            r = subprocess.run([exe, "-c", "import tideloop._diag_live"], user=uid, group=uid,
                               env=child_env(), capture_output=True, timeout=TIMEOUT)
        except OSError:
            continue
        if r.returncode == 0:
            return exe
    return None


def test_permission_denied():
    if os.stat("/proc/1").st_uid != os.getuid():
        msg = error_line(top(1))
        assert msg == ("tideloop top: permission denied: process 1 belongs to another user "
                       "(run top as that user)")
        return
    if os.getuid() != 0:
        pytest.skip("pid 1 is this user's and top cannot run as another user")
    nobody = 65534
    exe = _interpreter_for(nobody)
    if exe is None:
        pytest.skip("no interpreter of this version that user %d can run" % nobody)
    p = subprocess.Popen(["sleep", "30"])
    try:
        r = top(p.pid, executable=exe, user=nobody, group=nobody)
    finally:
        p.kill()
        p.wait()
    assert error_line(r) == ("tideloop top: permission denied: process %d belongs to another "
                             "user (run top as that user)" % p.pid)


def test_bad_arguments():
    r = top("--help")
    assert r.returncode == 0 and "TIDELOOP_DIAGNOSTICS=serve" in r.stdout
    r = top("x")
    assert r.returncode == 2 and "invalid int value: 'x'" in r.stderr
    assert error_line(top(0)) == "tideloop top: no such process: 0"


# -- Python 3.14: attaching with sys.remote_exec ----------------------------------


def attach_or_skip(r):
    if r.returncode and "permission denied: cannot attach" in r.stderr:
        pytest.skip("sys.remote_exec is not permitted here: " + r.stderr.strip())


@pytest.mark.skipif(not HAS_REMOTE_EXEC, reason="sys.remote_exec is Python 3.14's")
def test_attach_without_opt_in(tmp_path):
    with child(tmp_path, "plain", env={"XDG_RUNTIME_DIR": ""}) as (proc, _):
        r = top(proc.pid, "--json")
        attach_or_skip(r)
        assert r.returncode == 0 and not r.stderr, r
        (loop,) = json.loads(r.stdout)["loops"]
        assert loop["label"] == "loop-1 (thread MainThread)" and loop["health"]["callbacks"] > 0
        d = "/tmp/tideloop-%d" % os.getuid()
        path = os.path.join(d, "%d.sock" % proc.pid)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert not os.path.exists(os.path.join(d, "attach-%d.py" % proc.pid))
        # Served from now on: the next top finds the socket.
        assert view(proc.pid)["pid"] == proc.pid


@pytest.mark.skipif(not HAS_REMOTE_EXEC, reason="sys.remote_exec is Python 3.14's")
def test_attach_to_an_idle_loop(tmp_path):
    with child(tmp_path, "idle") as (proc, _):
        r = top(proc.pid, "--json")
        attach_or_skip(r)
        assert error_line(r).startswith(
            "tideloop top: process %d did not run the attach code within 3 s: its main "
            "thread is not running Python code (an idle loop waiting in the poller runs it "
            "at its next event or timer, and serves from then on)" % proc.pid), r
        proc.stdin.write(b"wake\n")                 # an event: the loop runs Python code
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while True:
            r = top(proc.pid, "--json")
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.returncode == 0, r
        assert json.loads(r.stdout)["loops"][0]["health"]["io_events"] >= 1


@pytest.mark.skipif(not HAS_REMOTE_EXEC, reason="sys.remote_exec is Python 3.14's")
def test_attach_says_why_the_process_could_not_serve(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "tideloop").mkdir(mode=0o755)
    os.chmod(run / "tideloop", 0o755)
    with child(tmp_path, "plain", env={"XDG_RUNTIME_DIR": str(run)}) as (proc, _):
        r = top(proc.pid, "--json")
        attach_or_skip(r)
    assert error_line(r) == (
        "tideloop top: process %d could not serve the live view: PermissionError: %s is "
        "open to other users (mode 755; it must be 0700)" % (proc.pid, run / "tideloop"))
