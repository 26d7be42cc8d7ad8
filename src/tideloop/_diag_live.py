"""The live view: ``tideloop.diagnostics.serve()`` in a process, ``python -m
tideloop top PID`` outside it.

Server: a daemon thread (not the loop: the view works while the loop is
stalled) listens on a Unix socket ``<pid>.sock`` (``<pid>.<id>.sock`` in
isolated interpreter ``<id>``: each serves its own loops) in a private directory --
``$XDG_RUNTIME_DIR/tideloop`` when that is usable, else
``/tmp/tideloop-<uid>`` -- of mode 0700, the socket 0600, and accepts only
peers of the same user (or root).  A client sends one JSON line (``{"want":
"view"}``) and gets one JSON document back: per loop, its health (a
snapshot, read from the server thread), its last stalls and slow callbacks,
and its top tasks by CPU, which only the loop's own thread may compute: the
server asks the loop with ``call_soon_threadsafe`` and waits
:data:`PROBE_TIMEOUT`; a loop that does not answer is reported busy, with
where its thread is now.

Client: :func:`top_main` (``python -m tideloop top``) finds the process's
socket, or on Python 3.14 starts the server in it with ``sys.remote_exec``
(the user must be allowed to ptrace it), and draws the screen.
"""
import atexit
import concurrent.futures
import itertools
import json
import os
import platform
import shutil
import socket
import stat
import struct
import sys
import threading
import time
import traceback
import weakref

from . import _compat
from . import _core
from . import _diag_state as _st
from . import _diag_tasks

PROBE_TIMEOUT = 0.5     # s the server waits for a loop to answer
_LEAK_PENDING_FOR = 60.0    # s pending that the view calls long-pending
RECENT = 5              # stalls and slow callbacks per loop in a view
ATTACH_WAIT = 3.0       # s top waits for a process to run the attach code
MAX_REQUEST = 1 << 16

# -- where the sockets live ------------------------------------------------------


def _usable_runtime_dir(path, uid):
    """$XDG_RUNTIME_DIR is usable: an absolute path to a directory of the user
    that it may write to."""
    if not path or not os.path.isabs(path):
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and os.access(path, os.W_OK | os.X_OK)


def _dir_for(uid, xdg):
    if _usable_runtime_dir(xdg, uid):
        return os.path.join(xdg, "tideloop")
    return "/tmp/tideloop-%d" % uid


def _check_private(path, uid):
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError("%s is not a directory" % path)
    if st.st_uid != uid:
        raise PermissionError("%s belongs to uid %d, not to uid %d" % (path, st.st_uid, uid))
    if st.st_mode & 0o077:
        raise PermissionError("%s is open to other users (mode %o; it must be 0700)"
                              % (path, stat.S_IMODE(st.st_mode)))


def _make_private(path, uid):
    """Create the directory (mode 0700, owned by uid) unless it exists; refuse
    one that another user owns or that others may enter."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)           # whatever the umask said
        if uid != os.getuid():
            os.chown(path, uid, -1)
    _check_private(path, uid)
    return path


def _socket_name(pid, interp):
    """<pid>.sock for the main interpreter, <pid>.<id>.sock for another:
    each isolated interpreter has its own loops, modules and server."""
    return "%d.sock" % pid if interp == 0 else "%d.%d.sock" % (pid, interp)


def private_dir():
    """This process's socket directory, created if need be."""
    uid = os.getuid()
    return _make_private(_dir_for(uid, os.environ.get("XDG_RUNTIME_DIR")), uid)


# -- the server ----------------------------------------------------------------

_lock = threading.Lock()
_server = None
_numbers = weakref.WeakKeyDictionary()     # loop -> its number in the view
_counter = itertools.count(1)


def serve(path=None):
    """Start the server thread unless it runs; return its socket's path."""
    global _server
    with _lock:
        if _server is not None and _server.pid == os.getpid():
            return _server.path
        if path is None:
            path = os.path.join(private_dir(), _socket_name(os.getpid(), _core.interpreter_id))
        _server = _Server(os.fspath(path))
        return _server.path


def stop_serving():
    """Stop the server thread and remove its socket (no error when none runs)."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None and server.pid == os.getpid():
        server.stop()


def _after_fork():
    # The child has the listening socket but no thread: close it, keep the
    # parent's file.  serve() in the child starts its own server.
    global _server, _lock
    _lock = threading.Lock()
    if _server is not None:
        try:
            _server.sock.close()
        except OSError:
            pass
        _server = None


os.register_at_fork(after_in_child=_after_fork)
if _compat.DAEMON_THREADS:
    atexit.register(stop_serving)
else:
    # An isolated interpreter: the server thread is not a daemon, and the
    # interpreter's end waits for such threads before atexit's functions
    # run; threading's own exit hooks run before that wait.
    threading._register_atexit(stop_serving)


class _Server:
    def __init__(self, path):
        self.pid = os.getpid()
        self.path = path
        self.closing = False
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            # A socket left by a dead process of the same pid (or a server
            # that was stopped): replaced.  Anything else is not ours to remove.
            if not stat.S_ISSOCK(st.st_mode):
                raise FileExistsError("%s exists and is not a socket" % path)
            if _answers(path):
                raise FileExistsError("%s is in use" % path)
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(8)
            self.ino = os.stat(path).st_ino
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.thread = threading.Thread(target=self._run, name="tideloop-live-view",
                                       daemon=_compat.DAEMON_THREADS)
        self.thread.start()

    def stop(self):
        self.closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)    # wakes accept()
        except OSError:
            pass
        self.thread.join(2.0)
        self.sock.close()
        try:
            if os.stat(self.path).st_ino == self.ino:
                os.unlink(self.path)
        except OSError:
            pass

    def _run(self):
        while not self.closing:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self.closing:
                    return
                time.sleep(0.1)         # EMFILE and the like: try again
                continue
            try:
                with conn:
                    self._answer(conn)
            except Exception:       # noqa: BLE001 - one bad client must not end the server
                pass

    def _answer(self, conn):
        conn.settimeout(2.0)
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  struct.calcsize("3i")))[1]
        if uid not in (os.getuid(), 0):
            reply = {"error": "permission denied"}
        else:
            data = b""
            while b"\n" not in data and len(data) < MAX_REQUEST:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            try:
                request = json.loads(data.decode("utf-8", "replace") or "{}")
                if not isinstance(request, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                reply = {"error": "bad request: %s" % exc}
            else:
                reply = _reply(request)
        conn.sendall(json.dumps(reply, default=repr).encode() + b"\n")


def _answers(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def _reply(request):
    want = request.get("want", "view")
    if want == "ping":
        return {"pid": os.getpid()}
    if want != "view":
        return {"error": "unknown request %r (view, ping)" % (want,)}
    try:
        return view(int(request.get("tasks", 10)), int(request.get("recent", RECENT)))
    except Exception as exc:        # noqa: BLE001 - reported to the client instead
        return {"error": "%s: %s" % (type(exc).__name__, exc)}


def _label(loop):
    n = _numbers.get(loop)
    if n is None:
        n = _numbers[loop] = next(_counter)
    tid = loop._thread_id
    if tid is None:
        return n, "loop-%d (not running)" % n
    name = next((t.name for t in threading.enumerate() if t.ident == tid), tid)
    return n, "loop-%d (thread %s)" % (n, name)


def _probe(loop, n_tasks):
    """Ask the loop's thread for its top tasks and suspected task leaks; a
    Future of (latency, tasks, why there are none, leaks or None)."""
    fut = concurrent.futures.Future()
    asked = time.monotonic()

    def on_loop():
        if not fut.set_running_or_notify_cancel():
            return                      # the server gave up on this one
        latency = time.monotonic() - asked
        try:
            tasks = _diag_tasks.top_tasks(n_tasks, loop)
            leaks = _diag_tasks.task_leaks(_LEAK_PENDING_FOR, loop)
        except Exception as exc:    # noqa: BLE001 - never raised into the loop (tracking off)
            fut.set_result((latency, None, str(exc), None))
        else:
            fut.set_result((latency, tasks, None, leaks))

    try:
        loop.call_soon_threadsafe(on_loop)
    except Exception as exc:        # noqa: BLE001 - closed meanwhile
        fut.set_running_or_notify_cancel()
        fut.set_exception(exc)
    return fut


def _answer(fut, loop, deadline):
    """What a probe found: (latency, tasks, why there are no tasks, leaks,
    the loop thread's stack when it did not answer in time)."""
    try:
        try:
            latency, tasks, note, leaks = fut.result(max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            if fut.cancel():
                return None, None, "loop busy (stalled?)", None, _where_now(loop)
            latency, tasks, note, leaks = fut.result(PROBE_TIMEOUT)    # answering right now
    except Exception as exc:        # noqa: BLE001 - shown, not raised
        return None, None, "%s: %s" % (type(exc).__name__, exc), None, None
    return latency, tasks, note, leaks, None


def _where_now(loop):
    frame = _st.thread_frame(loop)
    if frame is None:
        return None
    stack = _st.without_runner([tuple(f) for f in traceback.extract_stack(frame)])
    return [list(f) for f in stack[-8:]]


def _recent_reports(get, loop, n):
    for _ in range(3):
        try:
            return get(loop)[-n:] if n > 0 else []
        except RuntimeError:        # appended to while copied
            continue
    return []


def view(n_tasks=10, recent=RECENT):
    """The document a client gets: every open loop's health, recent stalls and
    slow callbacks, and top tasks."""
    from ._version import __version__
    loops = []
    for lp in _st.loops():
        try:
            # Health first: the probes would show in the ready queues.
            now, snap = time.monotonic(), lp._diagnostics()
        except Exception:       # noqa: BLE001 - closed meanwhile
            continue
        n, label = _label(lp)
        if _core.interpreter_id != 0:
            label = "interpreter %d: %s" % (_core.interpreter_id, label)
        loops.append((n, label, lp, now, snap))
    loops.sort(key=lambda x: x[0])
    probes = {id(lp): _probe(lp, n_tasks) for _, _, lp, _, _ in loops if lp.is_running()}
    deadline = time.monotonic() + PROBE_TIMEOUT
    out = []
    for _, label, lp, now, snap in loops:
        hists = snap.pop("histograms")
        entry = {
            "label": label, "running": lp.is_running(), "debug": lp.get_debug(),
            "now": now, "health": snap, "histograms": hists,
            "summaries": {name: _st.summary(h) for name, h in hists.items()},
            "watching_stalls": lp in _st.watched,
            "stalls_total": _st.stall_totals.get(lp, 0),
            "stalls": _recent_reports(_st.stalls, lp, recent),
            "slow_callbacks": _recent_reports(_st.slow_callbacks, lp, recent),
            "tasks": None, "tasks_note": None, "probe_latency": None, "leaks": None,
        }
        fut = probes.get(id(lp))
        if fut is None:
            entry["tasks_note"] = "loop not running"
        else:
            (entry["probe_latency"], entry["tasks"], entry["tasks_note"], entry["leaks"],
             busy) = _answer(fut, lp, deadline)
            if busy is not None:
                entry["busy_stack"] = busy
        out.append(entry)
    return {"pid": os.getpid(), "argv": sys.argv, "python": platform.python_version(),
            "tideloop": __version__, "time": time.time(), "interpreter": _core.interpreter_id,
            "loops": out}


# -- the client ----------------------------------------------------------------


class TopError(Exception):
    """What top prints as its one-line error (exit status 1)."""


def _proc_uid(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except FileNotFoundError:
        raise TopError("no such process: %d" % pid) from None


def _target_env(pid, name):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return os.fsdecode(item[len(prefix):])
    return None


def socket_candidates(pid):
    """Where process pid's socket may be: its user's runtime directory (as
    this process and as the target see it), then /tmp/tideloop-<uid>."""
    uid = _proc_uid(pid)
    dirs = []
    for xdg in (os.environ.get("XDG_RUNTIME_DIR"), _target_env(pid, "XDG_RUNTIME_DIR")):
        d = _dir_for(uid, xdg)
        if d not in dirs:
            dirs.append(d)
    if "/tmp/tideloop-%d" % uid not in dirs:
        dirs.append("/tmp/tideloop-%d" % uid)
    return [os.path.join(d, "%d.sock" % pid) for d in dirs]


def request(path, req, timeout=10.0):
    """Send one request to the socket at path, return the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(json.dumps(req).encode() + b"\n")
        chunks = []
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    return json.loads(b"".join(chunks).decode())


def _connect(pid, paths):
    """The first of paths that a server answers on; None if none does."""
    denied = None
    for path in paths:
        try:
            request(path, {"want": "ping"}, timeout=3.0)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            continue                    # none there, or a stale socket
        except PermissionError:
            denied = path
            continue
        except (OSError, ValueError) as exc:
            raise TopError("process %d's live view at %s does not answer: %s"
                           % (pid, path, exc)) from None
        return path
    if denied is not None:
        raise TopError("permission denied: %s (run top as the user of process %d)"
                       % (denied, pid))
    return None


def _tideloop_in(pid):
    """The Python tag (e.g. '311') of the tideloop extension loaded in process
    pid, None if there is none."""
    try:
        with open("/proc/%d/maps" % pid) as f:
            maps = f.read()
    except FileNotFoundError:
        raise TopError("no such process: %d" % pid) from None
    except PermissionError:
        raise TopError("permission denied: cannot read /proc/%d/maps (run top as the "
                       "user of process %d)" % (pid, pid)) from None
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue
        directory, name = os.path.split(fields[5])
        if name.startswith("_core.cpython-") and os.path.basename(directory) == "tideloop":
            return name.split("-")[1]
    return None


OPT_IN = ("call tideloop.diagnostics.serve() in it, or start it with "
          "TIDELOOP_DIAGNOSTICS=serve")

_ATTACH_SCRIPT = '''\
import os, sys
try:
    os.unlink(%(script)r)
except OSError:
    pass
try:
    if "tideloop" in sys.modules:
        import tideloop.diagnostics
        tideloop.diagnostics.serve()
except Exception as exc:
    try:
        with open(%(err)r + ".tmp", "w") as f:
            f.write("%%s: %%s" %% (type(exc).__name__, exc))
        os.replace(%(err)r + ".tmp", %(err)r)
    except OSError:
        pass
'''


def _attach(pid, uid, tag):
    """Python 3.14: make process pid call serve() with sys.remote_exec."""
    if tag != "%d%d" % sys.version_info[:2]:
        raise TopError("process %d is not serving the live view; %s (top attaches without "
                       "that only to a process of its own Python version: it runs Python "
                       "%s.%s, top runs %d.%d)" % ((pid, OPT_IN, tag[0], tag[1:])
                                                   + sys.version_info[:2]))
    d = private_dir() if uid == os.getuid() else _make_private("/tmp/tideloop-%d" % uid, uid)
    _forget_dead_attaches(d)
    script = os.path.join(d, "attach-%d.py" % pid)
    err = os.path.join(d, "attach-%d.err" % pid)
    for p in (script, err):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_ATTACH_SCRIPT % {"script": script, "err": err})
    if uid != os.getuid():
        os.chown(script, uid, -1)
    try:
        sys.remote_exec(pid, script)
    except PermissionError as exc:
        _unlink(script)
        raise TopError("permission denied: cannot attach to process %d (%s); ptrace is "
                       "not permitted (see /proc/sys/kernel/yama/ptrace_scope), so %s"
                       % (pid, exc.strerror or exc, OPT_IN)) from None
    except (OSError, RuntimeError) as exc:
        _unlink(script)
        why = str(exc)
        cause = exc.__cause__
        while cause is not None:                # the chain says where it failed
            why += " (%s)" % cause
            cause = cause.__cause__
        raise TopError("cannot attach to process %d: %s; %s" % (pid, why, OPT_IN)) from None
    deadline = time.monotonic() + ATTACH_WAIT
    paths = socket_candidates(pid)
    while time.monotonic() < deadline:
        path = _connect(pid, paths)
        if path is not None:
            return path
        try:
            with open(err) as f:
                why = f.read()
        except FileNotFoundError:
            pass
        else:
            _unlink(err)
            raise TopError("process %d could not serve the live view: %s" % (pid, why))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise TopError("process %d exited" % pid) from None
        time.sleep(0.05)
    # The script stays: the process runs it (and removes it) when it next
    # runs Python code, and serves from then on.
    raise TopError("process %d did not run the attach code within %.0f s: its main thread "
                   "is not running Python code (an idle loop waiting in the poller runs it "
                   "at its next event or timer, and serves from then on); try again, or %s"
                   % (pid, ATTACH_WAIT, OPT_IN))


def _forget_dead_attaches(d):
    """Remove the attach files left for processes that died before running them."""
    for name in os.listdir(d):
        stem, _, ext = name.partition(".")
        if stem.startswith("attach-") and stem[7:].isdigit() and ext in ("py", "err"):
            try:
                os.kill(int(stem[7:]), 0)
            except ProcessLookupError:
                _unlink(os.path.join(d, name))
            except OSError:
                pass


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def find_server(pid, socket_path=None):
    """The socket of process pid's live view; attaches on 3.14 if need be.
    Raises TopError with what is wrong."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise TopError("no such process: %d" % pid) from None
    except PermissionError:
        raise TopError("permission denied: process %d belongs to another user (run top "
                       "as that user)" % pid) from None
    if socket_path is not None:
        path = _connect(pid, [socket_path])
        if path is None:
            raise TopError("nothing serves the live view at %s" % socket_path)
        return path
    uid = _proc_uid(pid)
    path = _connect(pid, socket_candidates(pid))
    if path is not None:
        return path
    tag = _tideloop_in(pid)
    if tag is None:
        raise TopError("process %d does not use tideloop (its extension is not loaded "
                       "there)" % pid)
    if not hasattr(sys, "remote_exec"):
        raise TopError("process %d is not serving the live view; %s (on Python 3.14 top "
                       "attaches without it)" % (pid, OPT_IN))
    return _attach(pid, uid, tag)


def interpreter_sockets(pid):
    """The live view's sockets of process pid's subinterpreters
    (<pid>.<id>.sock: each isolated interpreter serves its own loops) that
    answer, in interpreter order."""
    prefix, found = "%d." % pid, []
    for d in dict.fromkeys(os.path.dirname(p) for p in socket_candidates(pid)):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        ids = sorted(int(n[len(prefix):-5]) for n in names
                     if n.startswith(prefix) and n.endswith(".sock") and
                     n[len(prefix):-5].isdigit())
        for i in ids:
            path = _connect(pid, [os.path.join(d, _socket_name(pid, i))])
            if path is not None and path not in found:
                found.append(path)
    return found


def find_servers(pid, socket_path=None):
    """Every socket of process pid's live view: the main interpreter's
    (attached on 3.14 if need be) and its subinterpreters'."""
    if socket_path is not None:
        return [find_server(pid, socket_path)]
    subs = interpreter_sockets(pid)
    try:
        main = find_server(pid)
    except TopError:
        if subs:
            return subs     # the main interpreter serves nothing: theirs only
        raise
    return [main] + subs


def fetch_all(pid, paths, n_tasks=10):
    """One document for the process: the loops of every interpreter that
    serves (fetch's errors when none has a loop)."""
    docs, last = [], None
    for path in paths:
        try:
            docs.append(fetch(pid, path, n_tasks))
        except TopError as exc:
            if len(paths) == 1:
                raise
            last = exc
    if not docs:
        raise last
    doc = docs[0]
    for other in docs[1:]:
        doc["loops"].extend(other["loops"])
    return doc


def fetch(pid, path, n_tasks=10):
    try:
        doc = request(path, {"want": "view", "tasks": n_tasks})
    except (FileNotFoundError, ConnectionRefusedError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise TopError("process %d exited" % pid) from None
        raise TopError("process %d stopped serving the live view" % pid) from None
    except (OSError, ValueError) as exc:
        raise TopError("process %d's live view failed: %s" % (pid, exc)) from None
    if "error" in doc:
        raise TopError("process %d's live view: %s" % (pid, doc["error"]))
    if not doc.get("loops"):
        raise TopError("process %d has no open tideloop loop" % pid)
    return doc


# -- the screen ----------------------------------------------------------------


def _secs(x):
    if x is None:
        return "-"
    if x >= 1:
        return "%.2f s" % x
    if x >= 1e-3:
        return "%.3g ms" % (x * 1e3)
    return "%.3g us" % (x * 1e6)


def _interval(before, after):
    """Histogram summaries over the interval (None: a reset in between)."""
    if before is None or before["health"]["since"] != after["health"]["since"]:
        return None
    out = {}
    for name, h in after["histograms"].items():
        b = before["histograms"][name]
        counts = [x - y for x, y in zip(h["counts"], b["counts"])]
        out[name] = _st.summary({"counts": counts, "sum": h["sum"] - b["sum"], "max": h["max"]})
        # "max" is since the start; the interval's is its highest bucket's bound.
        top = max((i for i, c in enumerate(counts) if c), default=None)
        out[name]["max"] = 0.0 if top is None else _st.bucket_upper(top, h)
    return out


def _frame_text(f):
    filename, line, func = f[0], f[1], f[2]
    text = ("%s:%s %s" % (_short(filename), line, func))
    return text + (": " + f[3].strip() if len(f) > 3 and f[3] else "")


def _short(path):
    home = os.path.expanduser("~")
    cwd = os.getcwd() + os.sep
    if path.startswith(cwd):
        return path[len(cwd):]
    if home != "/" and path.startswith(home + os.sep):
        return "~" + path[len(home):]
    return path


def render(prev, doc, width=None):
    """One screen: the process, then each loop (prev: the document of the
    last refresh, for rates; None for averages since the loop began)."""
    argv = list(doc.get("argv") or [""])
    argv[0] = os.path.basename(argv[0])
    head = "tideloop top - pid %s (%s) - tideloop %s, Python %s - %s" % (
        doc["pid"], " ".join(argv)[:60], doc["tideloop"], doc["python"],
        time.strftime("%H:%M:%S", time.localtime(doc["time"])))
    lines = [head]
    before = {e["label"]: e for e in prev["loops"]} if prev else {}
    for e in doc["loops"]:
        lines.append("")
        lines.extend(_render_loop(before.get(e["label"]), e))
    if width:
        lines = [ln if len(ln) <= width else ln[:width - 1] + "~" for ln in lines]
    return "\n".join(lines) + "\n"


def _render_loop(b, e):
    h = e["health"]
    ivl = _interval(b, e)
    if ivl is not None:
        dt = max(e["now"] - b["now"], 1e-9)
        d = {k: h[k] - b["health"][k] for k in ("iterations", "callbacks", "io_events",
                                                "time_running", "time_polling")}
        span = "last %.1f s" % dt
        sums = ivl
    else:
        dt = max(e["now"] - h["since"], 1e-9)
        d = h
        span = "since start, %.0f s" % dt
        sums = e["summaries"]
    busy = d["time_running"] + d["time_polling"]
    out = ["%s%s  [%s]" % (e["label"], "" if e["running"] else " - not running", span)]
    if e.get("busy_stack"):
        busytext = "stuck"      # the counters move when the iteration ends
    else:
        busytext = "%5.1f %%" % (100.0 * d["time_running"] / busy if busy > 0 else 0.0)
    out.append("  health   %8.0f iterations/s %8.0f callbacks/s %7.0f io/s   busy %s"
               % (d["iterations"] / dt, d["callbacks"] / dt, d["io_events"] / dt, busytext))
    out.append("           ready %d  timers %d  fds %d  %s  probe %s"
               % (h["ready"], h["timers"], h["fds"], h.get("backend", ""),
                  _secs(e["probe_latency"])))
    cb = sums["callback"]
    lag = sums["scheduling_lag"]
    it = sums["iteration"]
    if h.get("callback_timing"):
        cbtext = "callback p50 %s p99 %s max %s" % (_secs(cb["p50"]), _secs(cb["p99"]),
                                                    _secs(cb["max"]))
    else:
        cbtext = "callback (timing off: TIDELOOP_DIAGNOSTICS=timing)"
    out.append("  latency  %s | lag p50 %s p99 %s | iteration p99 %s"
               % (cbtext, _secs(lag["p50"]), _secs(lag["p99"]), _secs(it["p99"])))
    if e.get("busy_stack"):
        out.append("  BUSY     the loop did not answer within %.1f s; its thread is at:"
                   % PROBE_TIMEOUT)
        for f in e["busy_stack"][-4:]:
            out.append("    %s" % _frame_text(f))
    stalls = e["stalls"]
    if not e["watching_stalls"] and not stalls:
        out.append("  stalls   (not watched: TIDELOOP_DIAGNOSTICS=stalls=0.1)")
    else:
        out.append("  stalls   %d in all; recent:" % e["stalls_total"] if stalls
                   else "  stalls   none")
        seen = {}                       # where -> [longest, how many], newest first
        for s in reversed(stalls):
            f = s.get("blocked_at") or _st.blocking_frame(s.get("stack"))
            end = s.get("ended")        # no stack: where the task's step ended
            text = (_frame_text(f) if f else
                    "%s:%s %s (its step's end)" % (_short(end[1]), end[2], end[0]) if end
                    else s["callback"])
            if s.get("task"):
                text += "  [task %r (%s)]" % (s["task"], s["coroutine"])
            where = seen.setdefault(text, [0.0, 0])
            where[0] = max(where[0], s["duration"])
            where[1] += 1
        for where, (longest, n) in seen.items():
            out.append("    %9s %4s  %s" % (_secs(longest), "x%d" % n if n > 1 else "", where))
    # A slow callback that was a stall too is in the stalls above: one
    # incident, one line.
    slow = [s for s in e["slow_callbacks"] if not s.get("stall")]
    if slow:
        out.append("  slowest recent callbacks:")
        for s in sorted(slow, key=lambda s: -s["duration"]):
            out.append("    %9s %4s  %s" % (_secs(s["duration"]), "", _slow_text(s)))
    else:
        out.append("  slowest recent callbacks: none")
    out.extend(_leak_lines(e.get("leaks")))
    if e["tasks"] is None:
        out.append("  tasks: (%s)" % e["tasks_note"])
    else:
        out.append("  tasks by CPU:")
        out.append("    %8s %7s %8s %8s  %-9s %-16s %s"
                   % ("cpu", "steps", "age", "idle", "state", "task", "coroutine"))
        for t in e["tasks"]:
            out.append("    %8s %7s %8s %8s  %-9s %-16s %s"
                       % (_secs(t.get("cpu")), t.get("steps", "-"), _num_s(t.get("age")),
                          _secs(t.get("idle")), t.get("state", "-"), t.get("task", "-"),
                          t.get("coroutine", "-")))
        if not e["tasks"]:
            out.append("    (none)")
    return out


def _slow_text(s):
    if s.get("task") is None:
        return s["callback"]
    end = s.get("ended") or s.get("started")
    at = "%s:%s %s" % (_short(end[1]), end[2], end[0]) if end else "an unknown line"
    how = "ended at" if s.get("state", "pending") == "pending" else "returned at"
    return "task %r (%s) %s %s" % (s["task"], s["coroutine"], how, at)


def _leak_lines(leaks):
    """The suspected task leaks (tasks that finished with nobody awaiting
    them) and the long-pending tasks nothing awaits."""
    if not leaks:
        return []
    out = []
    for kind, title in (("unwaited", "LEAKS    finished with nobody awaiting them (results "
                                     "and exceptions lost):"),
                        ("pending", "  long-pending tasks no task awaits (over %.0f s):"
                         % _LEAK_PENDING_FOR)):
        groups = leaks.get(kind) or []
        if not groups:
            continue
        out.append(("  " if kind == "unwaited" else "") + title)
        for g in groups[:5]:
            origin = g.get("origin")
            out.append("    %6d x %s, created at %s" % (
                g["count"], g["coroutine"],
                "%s:%s" % (_short(origin[0]), origin[1]) if origin else
                "? (TIDELOOP_DIAGNOSTICS=tasks=origins records it)"))
    return out


def _num_s(x):
    return "-" if x is None else "%.1f s" % x


def top_main(args):
    """python -m tideloop top: returns the exit status."""
    try:
        return _top(args)
    except TopError as exc:
        print("tideloop top: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:             # top ... | head
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0


def _top(args):
    if args.pid <= 0:
        raise TopError("no such process: %d" % args.pid)
    if args.interval <= 0:
        raise TopError("--interval must be positive")
    paths = find_servers(args.pid, args.socket)
    doc = fetch_all(args.pid, paths, args.tasks)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    tty = sys.stdout.isatty()
    time.sleep(min(args.interval, 1.0))     # the first frame's rates need two samples
    first = True
    while True:
        prev, doc = doc, fetch_all(args.pid, paths, args.tasks)
        width = shutil.get_terminal_size().columns if tty else None
        text = render(prev, doc, width)
        if tty:
            sys.stdout.write("\x1b[H\x1b[2J" + text)
        else:
            sys.stdout.write(text if first else "\n" + text)
        sys.stdout.flush()
        first = False
        if args.once:
            return 0
        time.sleep(args.interval)
