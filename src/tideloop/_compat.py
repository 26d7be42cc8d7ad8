"""Every private name of asyncio and the standard library that tideloop uses,
resolved in one place, each with the interpreters it applies to and a
fallback.

A name that a later (or earlier) interpreter no longer has never fails the
import: it selects the fallback, and ``ENTRIES`` records which branch the
running interpreter took (``tests/compat/test_compat.py`` asserts the expected
branch per version).  The C core takes what it needs from here at module
init (``tideloop._core`` reads the attributes of this module), and its own
C-level entries live in ``_core/compat.h`` (listed as ``tideloop._core.compat``).

This module must import with the standard library only.
"""

import asyncio
import functools
import importlib
import importlib.util
import inspect
import reprlib
import sys
import traceback
from asyncio import base_events as _base_events
from asyncio import events as _events
from asyncio import unix_events as _unix_events

__all__ = ["ENTRIES", "borrow"]

PY = sys.version_info[:2]

#: name -> (versions it applies to, branch taken here, what it is)
ENTRIES = {}


def _names(func):
    """The global and attribute names a function's code (and the code of the
    functions it defines) uses: how probes recognise what a stock function
    does.  Reading its source instead would tokenize the whole file, memory
    that each isolated interpreter importing tideloop would keep."""
    code = func.__code__
    found = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            found.update(const.co_names)
    return found


def _lookup(dotted):
    """The object at 'module.attr.attr', or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _resolve(name, dotted, versions, fallback, what):
    """The stdlib's object when this interpreter has it, else the fallback."""
    obj = _lookup(dotted)
    if obj is not None:
        ENTRIES[name] = (versions, "stock", what)
        return obj
    ENTRIES[name] = (versions, "fallback", what)
    return fallback


def _record(name, versions, branch, what):
    ENTRIES[name] = (versions, branch, what)


# -- formatting (reprs, error reports, debug mode) ---------------------------

def _get_function_source(func):
    func = inspect.unwrap(func)
    if inspect.isfunction(func):
        code = func.__code__
        return (code.co_filename, code.co_firstlineno)
    if isinstance(func, (functools.partial, functools.partialmethod)):
        return _get_function_source(func.func)
    return None


def _format_args(args, kwargs, debug):
    if not debug:
        return "()"
    items = [reprlib.repr(a) for a in args or ()]
    items += [f"{k}={reprlib.repr(v)}" for k, v in (kwargs or {}).items()]
    return "(" + ", ".join(items) + ")"


def _format_callback(func, args, kwargs, debug, suffix=""):
    if isinstance(func, functools.partial):
        suffix = _format_args(args, kwargs, debug) + suffix
        return _format_callback(func.func, func.args, func.keywords, debug, suffix)
    text = (getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
            or repr(func))
    return text + _format_args(args, kwargs, debug) + suffix


def _format_callback_fallback(func, args, debug):
    # asyncio.format_helpers._format_callback_source as of 3.13: arguments
    # are shown in debug mode only.
    text = _format_callback(func, args, None, debug)
    source = _get_function_source(func)
    if source:
        text += f" at {source[0]}:{source[1]}"
    return text


_stock_format_callback_source = _lookup("asyncio.format_helpers._format_callback_source")
if _stock_format_callback_source is None:
    _record("format_callback_source", "3.11-3.14", "fallback",
            "asyncio.format_helpers._format_callback_source")

    def format_callback_source(func, args, debug):
        return _format_callback_fallback(func, args, debug)
elif "debug" in inspect.signature(_stock_format_callback_source).parameters:
    _record("format_callback_source", "3.13+ (debug=)", "stock-debug-arg",
            "asyncio.format_helpers._format_callback_source(func, args, *, debug)")

    def format_callback_source(func, args, debug, _f=_stock_format_callback_source):
        return _f(func, args, debug=debug)
else:
    _record("format_callback_source", "3.11-3.12", "stock",
            "asyncio.format_helpers._format_callback_source(func, args)")

    def format_callback_source(func, args, debug, _f=_stock_format_callback_source):
        return _f(func, args)


def _extract_stack_fallback(f=None, limit=None):
    if f is None:
        f = sys._getframe().f_back
    if limit is None:
        limit = getattr(asyncio.constants, "DEBUG_STACK_DEPTH", 10)
    stack = traceback.StackSummary.extract(traceback.walk_stack(f), limit=limit,
                                           lookup_lines=False)
    stack.reverse()
    return stack


extract_stack = _resolve(
    "extract_stack", "asyncio.format_helpers.extract_stack", "3.11-3.14",
    _extract_stack_fallback, "where a handle was created (debug mode)")


def _format_handle_fallback(handle):
    cb = handle._callback
    if isinstance(getattr(cb, "__self__", None), asyncio.Task):
        return repr(cb.__self__)
    return str(handle)


format_handle = _resolve(
    "format_handle", "asyncio.base_events._format_handle", "3.11-3.14",
    _format_handle_fallback, "the slow-callback warning's description")


def _set_result_unless_cancelled_fallback(fut, result):
    if fut.cancelled():
        return
    fut.set_result(result)


set_result_unless_cancelled = _resolve(
    "set_result_unless_cancelled", "asyncio.futures._set_result_unless_cancelled",
    "3.11-3.14", _set_result_unless_cancelled_fallback,
    "waking a connection's waiter")


def _is_debug_mode_fallback():
    import os
    return sys.flags.dev_mode or (not sys.flags.ignore_environment and
                                  bool(os.environ.get("PYTHONASYNCIODEBUG")))


is_debug_mode = _resolve(
    "is_debug_mode", "asyncio.coroutines._is_debug_mode", "3.11-3.14",
    _is_debug_mode_fallback, "a new loop's debug flag")


# 3.14 deprecates asyncio.iscoroutinefunction (it warns) and uses the
# private _iscoroutinefunction inside asyncio; so do we there.
iscoroutine = asyncio.coroutines.iscoroutine
_private_iscf = _lookup("asyncio.coroutines._iscoroutinefunction")
if _private_iscf is not None:
    iscoroutinefunction = _private_iscf
    _record("iscoroutinefunction", "3.14+ (the public one warns)", "private",
            "asyncio.coroutines._iscoroutinefunction")
else:
    iscoroutinefunction = asyncio.coroutines.iscoroutinefunction
    _record("iscoroutinefunction", "3.11-3.13", "public",
            "asyncio.coroutines.iscoroutinefunction")


# -- transports -------------------------------------------------------------

TransportSocket = _resolve(
    "TransportSocket", "asyncio.trsock.TransportSocket", "3.11-3.14", None,
    "extra['socket'] wrapper (fallback: the socket itself)")

FlowControlMixin = _resolve(
    "FlowControlMixin", "asyncio.transports._FlowControlMixin", "3.11-3.14", None,
    "base class of the C transports (fallback: they stand alone)")

_SendfileMode = _lookup("asyncio.constants._SendfileMode")
if _SendfileMode is not None:
    SENDFILE_TRY_NATIVE = _SendfileMode.TRY_NATIVE
    _record("sendfile_mode", "3.11-3.14", "stock",
            "asyncio.constants._SendfileMode.TRY_NATIVE (transport._sendfile_compatible)")
else:
    SENDFILE_TRY_NATIVE = object()
    _record("sendfile_mode", "3.11-3.14", "fallback",
            "asyncio.constants._SendfileMode.TRY_NATIVE (transport._sendfile_compatible)")

# Server._attach()/_detach(): 3.13 passes the transport (Server tracks its
# clients for close_clients()/abort_clients()).
_attach = _lookup("asyncio.base_events.Server._attach")
try:
    _attach_params = list(inspect.signature(_attach).parameters)[1:] if _attach else []
except (TypeError, ValueError):
    _attach_params = []
SERVER_ATTACH_TAKES_TRANSPORT = bool(_attach_params)
_record("server_attach", "3.11-3.12: no argument; 3.13+: the transport",
        "transport" if SERVER_ATTACH_TAKES_TRANSPORT else "no-argument",
        "asyncio.base_events.Server._attach/_detach")

# How the stock socket and datagram transports word and treat what is written
# differs between patch releases, so it is read off the stock classes
# themselves: each is called on a stand-in object (the checks run before any
# other use of self) and its error message or outcome is recorded.
class _ProbeTransport:
    _eof = False
    _empty_waiter = None
    _conn_lost = 0
    _address = None

    def __init__(self):
        self._buffer = []


def _type_error_prefix(method, fallback):
    """The message method(stand-in, 0) raises, without the trailing "'int'"."""
    try:
        method(_ProbeTransport(), 0)
    except TypeError as exc:
        text = str(exc)
        if text.endswith("'int'"):
            return text[:-len("'int'")], "probed"
    except Exception:
        pass
    return fallback, "fallback"


_sock_tr = _lookup("asyncio.selector_events._SelectorSocketTransport")
_dgram_tr = _lookup("asyncio.selector_events._SelectorDatagramTransport")
_OLD_WRITE_MESSAGE = "data argument must be a bytes-like object, not "
WRITE_TYPE_ERROR_PREFIX, _branch = _type_error_prefix(
    getattr(_sock_tr, "write", None), _OLD_WRITE_MESSAGE)
_record("write_type_error", "3.11-3.13.x: 'bytes-like'; later 3.13 and 3.14: "
        "'bytes, bytearray, or memoryview'", _branch,
        "message of _SelectorSocketTransport.write(non-bytes)")
SENDTO_TYPE_ERROR_PREFIX, _branch = _type_error_prefix(
    getattr(_dgram_tr, "sendto", None), _OLD_WRITE_MESSAGE)
_record("sendto_type_error", "3.11-3.14", _branch,
        "message of _SelectorDatagramTransport.sendto(non-bytes)")

# 3.12+: the socket transport has its own writelines(): the items are kept as
# memoryviews (no join), a false argument writes nothing, a non-buffer item
# fails in memoryview().  3.11 inherits WriteTransport.writelines (b"".join).
WRITELINES_VIEWS = _sock_tr is not None and "writelines" in vars(_sock_tr)
_record("writelines", "3.11: joined; 3.12+: views", "views" if WRITELINES_VIEWS else "joined",
        "_SelectorSocketTransport.writelines")


def _writelines_skips_empty():
    """Later releases (gh-155888) drop false items (b"", and any other false
    object) before making memoryviews of the rest."""
    if not WRITELINES_VIEWS:
        return False
    try:
        _sock_tr.writelines(_ProbeTransport(), [0])
    except TypeError:
        return False
    except Exception:
        return False
    return True


WRITELINES_SKIPS_EMPTY = _writelines_skips_empty()
_record("writelines_skips_empty", "3.14.x and later patch releases (probed)",
        "skips" if WRITELINES_SKIPS_EMPTY else "keeps",
        "_SelectorSocketTransport.writelines([false item])")

# 3.15+: a connection runs its protocol callbacks in one Context: a copy of
# the caller's (create_connection) or of the Server's (each accepted
# connection); the loop's transport methods take context=.
_selector_loop = _lookup("asyncio.selector_events.BaseSelectorEventLoop")
CONNECTION_CONTEXT = _selector_loop is not None and "context" in inspect.signature(
    _selector_loop._make_socket_transport).parameters
_record("connection_context", "3.11-3.14: a copy per callback; 3.15+: one per connection",
        "per-connection" if CONNECTION_CONTEXT else "per-callback",
        "BaseSelectorEventLoop._make_socket_transport(context=) and Server._context")

# 3.13+: sendto(b"") sends an empty datagram (3.11-3.12 drop it).
DGRAM_SENDS_EMPTY = sys.version_info >= (3, 13)
_record("dgram_empty", "3.11-3.12: dropped; 3.13+: sent",
        "sent" if DGRAM_SENDS_EMPTY else "dropped",
        "_SelectorDatagramTransport.sendto(b'')")

# -- the iteration ---------------------------------------------------------

# 3.15: _run_once takes the timers due before now + max(clock resolution,
# ulp(now)), so that a clock finer than a double's spacing at the current
# time (a long uptime) still moves the end past now.  Probed: patch releases
# may take it.
def _timer_end_ulp():
    try:
        return "ulp" in _names(_base_events.BaseEventLoop._run_once)
    except AttributeError:
        return PY >= (3, 15)


TIMER_END_ULP = _timer_end_ulp()
_record("timer_end_ulp", "3.15+ (probed)", "ulp" if TIMER_END_ULP else "resolution",
        "BaseEventLoop._run_once's end time: now + max(resolution, ulp(now))")

# 3.14: call_soon_threadsafe() returns a _ThreadSafeHandle (a cancel() from
# another thread waits for the running callback); None where there is none.
ThreadSafeHandle = _lookup("asyncio.events._ThreadSafeHandle")
_record("threadsafe_handle", "3.14+", "stock" if ThreadSafeHandle is not None else "none",
        "asyncio.events._ThreadSafeHandle (what call_soon_threadsafe returns)")

# -- the running loop -------------------------------------------------------

# Looked up on asyncio.events at every run (tests swap them), by name.
_record("running_loop", "3.11-3.14",
        "stock" if hasattr(_events, "_set_running_loop") else "fallback",
        "asyncio.events._get_running_loop/_set_running_loop")

# -- tasks --------------------------------------------------------------------

_create_task_params = inspect.signature(_base_events.BaseEventLoop.create_task).parameters
CREATE_TASK_KWARGS = any(p.kind is p.VAR_KEYWORD for p in _create_task_params.values())
_record("create_task_kwargs",
        "3.11-3.13.2: name/context only; 3.13.3+ and 3.14: **kwargs (eager_start)",
        "kwargs" if CREATE_TASK_KWARGS else "name-context",
        "BaseEventLoop.create_task's signature (the C fast path covers name/context; "
        "everything else goes through the stock method)")

# -- child processes ---------------------------------------------------------

# Child watchers exist until 3.13 (deprecated in 3.12, removed in 3.14).  The
# per-process ones are the ones tideloop's pidfd watching replaces.
PER_PROCESS_WATCHERS = tuple(
    w for w in (_lookup("asyncio.unix_events.ThreadedChildWatcher"),
                _lookup("asyncio.unix_events.PidfdChildWatcher")) if w is not None)
HAS_CHILD_WATCHERS = bool(PER_PROCESS_WATCHERS)
_record("child_watchers", "3.11-3.13; removed in 3.14",
        "stock" if HAS_CHILD_WATCHERS else "none",
        "asyncio.unix_events.ThreadedChildWatcher/PidfdChildWatcher")


# The stock loop's default way of watching a child: 3.11's ThreadedChildWatcher
# logs "process N exited with returncode R" in debug mode; from 3.12 on a pidfd
# watcher is the default where pidfds work, and it logs nothing.  tideloop's
# pidfd watching logs that line only where the stock default does.
_can_use_pidfd = _lookup("asyncio.unix_events.can_use_pidfd")
STOCK_WATCHES_PIDFD = sys.version_info >= (3, 12) and bool(
    _can_use_pidfd is not None and _can_use_pidfd())
_record("stock_default_child_watcher", "3.11: threaded; 3.12+: pidfd where usable",
        "pidfd" if STOCK_WATCHES_PIDFD else "threaded",
        "the watcher asyncio's own loop uses with no watcher set "
        "(asyncio.unix_events.can_use_pidfd)")


class _LoopWatchers:
    """3.14's per-loop child watchers: a loop gets a pidfd one where pidfds
    work (can_use_pidfd() when it is made), else a threaded one."""

    def __init__(self, pidfd, threaded):
        self.pidfd, self.threaded = pidfd, threaded

    def new(self):
        can = _lookup("asyncio.unix_events.can_use_pidfd")
        return self.pidfd() if can is not None and can() else self.threaded()


_pidfd_watcher = _lookup("asyncio.unix_events._PidfdChildWatcher")
_threaded_watcher = _lookup("asyncio.unix_events._ThreadedChildWatcher")
if _pidfd_watcher is not None and _threaded_watcher is not None:
    LOOP_WATCHERS = _LoopWatchers(_pidfd_watcher, _threaded_watcher)
else:
    LOOP_WATCHERS = None
_record("loop_watchers", "3.14+: loop._watcher", "stock" if LOOP_WATCHERS else "none",
        "asyncio.unix_events._PidfdChildWatcher/_ThreadedChildWatcher")


# When the stock loop publishes a child's exit: 3.14's watchers call
# transp._process_exited() at once; before, _child_watcher_callback defers it
# with call_soon_threadsafe (3.11: by two iterations).
_watcher_callback = _lookup("asyncio.unix_events._UnixSelectorEventLoop._child_watcher_callback")
try:
    EXIT_PUBLISHED_AT_ONCE = not any(n.startswith("call_soon") for n in _names(_watcher_callback))
except AttributeError:
    EXIT_PUBLISHED_AT_ONCE = False
_record("child_exit_published", "3.11-3.13: next iteration; 3.14: at once",
        "at-once" if EXIT_PUBLISHED_AT_ONCE else "next-iteration",
        "_UnixSelectorEventLoop._child_watcher_callback")


def current_child_watcher():
    """The watcher an application installed on the policy, if any (3.11-3.13);
    None where child watchers or policies no longer exist."""
    if not HAS_CHILD_WATCHERS or get_event_loop_policy is None:
        return None
    return getattr(get_event_loop_policy(), "_watcher", None)


# -- policies ----------------------------------------------------------------

# 3.14 deprecates the policy API (the public names warn); CPython's main
# branch (3.16) removes it.  Every name is looked up tolerantly: where asyncio
# has no policies, import, run() and new_event_loop() do not need them,
# install() says why it cannot work, and tideloop.EventLoopPolicy cannot be
# made.  The Unix default policy class and the private getter/setter do not
# warn; the public ones are the fallback before 3.14.
DefaultPolicyBase = _lookup("asyncio.unix_events._UnixDefaultEventLoopPolicy")
if DefaultPolicyBase is not None:
    _branch = "stock"
else:
    DefaultPolicyBase = (_lookup("asyncio.events._BaseDefaultEventLoopPolicy")
                         or _lookup("asyncio.events.BaseDefaultEventLoopPolicy"))
    _branch = "fallback" if DefaultPolicyBase is not None else "none"
_record("default_policy", "3.11-3.15; removed in 3.16", _branch,
        "asyncio.unix_events._UnixDefaultEventLoopPolicy (no deprecation warning), "
        "else asyncio.events.(_)BaseDefaultEventLoopPolicy: tideloop.EventLoopPolicy's base")
set_event_loop_policy = (_lookup("asyncio.events._set_event_loop_policy")
                         or _lookup("asyncio.events.set_event_loop_policy"))
get_event_loop_policy = (_lookup("asyncio.events._get_event_loop_policy")
                         or _lookup("asyncio.events.get_event_loop_policy"))
POLICY_API = (DefaultPolicyBase is not None and set_event_loop_policy is not None
              and get_event_loop_policy is not None)
_record("policy_api", "3.11-3.15; removed in 3.16", "stock" if POLICY_API else "absent",
        "asyncio.events.(_)get_event_loop_policy/(_)set_event_loop_policy "
        "(absent: tideloop.install() raises; python -m tideloop run uses "
        "set_default_loop_factory)")
POLICY_DEPRECATED = PY >= (3, 14)
_record("policy_deprecated", "3.14+", "deprecated" if POLICY_DEPRECATED else "current",
        "asyncio.set_event_loop_policy and friends warn from 3.14")


def set_default_loop_factory(factory):
    """Where asyncio has no policies: make factory() the loop that
    asyncio.new_event_loop() returns, which is what asyncio.run() and
    asyncio.Runner() call when given no loop_factory.  It replaces asyncio's
    function for the whole process, so only ``python -m tideloop run`` (whose
    purpose is running a program on tideloop) calls it; the library never."""
    _events.new_event_loop = factory     # asyncio.runners calls events.new_event_loop()
    asyncio.new_event_loop = factory


# -- Unix servers -------------------------------------------------------------

UNIX_SERVER_CLEANUP = "cleanup_socket" in inspect.signature(
    _unix_events._UnixSelectorEventLoop.create_unix_server).parameters
_record("unix_server_cleanup", "3.13+", "cleanup_socket" if UNIX_SERVER_CLEANUP else "none",
        "create_unix_server(cleanup_socket=) and loop._unix_server_sockets")

# -- running scripts (python -m tideloop run) ---------------------------------

# A script's __main__ module has __cached__ = None up to 3.14; 3.15 sets
# no __cached__ there.
SCRIPT_MAIN_HAS_CACHED = PY < (3, 15)
_record("script_main_cached", "3.11-3.14: None; 3.15+: absent",
        "none" if SCRIPT_MAIN_HAS_CACHED else "absent",
        "__main__.__cached__ of a script run by python -m tideloop run")

run_module_as_main = _lookup("runpy._run_module_as_main")
_record("runpy_run_module_as_main", "3.11-3.14",
        "stock" if run_module_as_main is not None else "fallback",
        "runpy._run_module_as_main (python -m semantics for 'tideloop run -m')")


# -- isolated subinterpreters (tideloop.interpreters) -------------------------

class _Subinterpreters:
    """Create, run code in and destroy isolated interpreters (own GIL): the
    public ``concurrent.interpreters`` from 3.14, the private module before
    (3.13 ``_interpreters``, 3.12 ``_xxsubinterpreters``).  ``run(i, code)``
    returns None, or the failure's traceback text when the code raised.  The
    module is imported at first use: concurrent.interpreters brings pickle
    and queue, memory that each interpreter importing tideloop would pay."""

    def __init__(self, branch):
        self.branch = branch

    def _module(self):
        return importlib.import_module(self.branch)

    def create(self):
        mod = self._module()
        if self.branch == "concurrent.interpreters":
            return mod.create()
        if self.branch == "_interpreters":
            return mod.create("isolated")
        return mod.create(isolated=True)

    def run(self, interp, code):
        mod = self._module()
        if self.branch == "concurrent.interpreters":
            try:
                interp.exec(code)
            except mod.ExecutionFailed as exc:
                return exc.excinfo.errdisplay or exc.excinfo.formatted
            return None
        if self.branch == "_interpreters":     # 3.13: exec() returns the failure
            info = mod.exec(interp, code)
            return None if info is None else (info.errdisplay or info.formatted)
        try:
            mod.run_string(interp, code)
        except mod.RunFailedError as exc:
            return str(exc)
        return None

    def destroy(self, interp):
        if self.branch == "concurrent.interpreters":
            interp.close()
        else:
            self._module().destroy(interp)


def _subinterpreters():
    def there(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False
    if PY >= (3, 14) and there("concurrent.interpreters"):
        return _Subinterpreters("concurrent.interpreters")
    if there("_interpreters"):
        return _Subinterpreters("_interpreters")
    if PY >= (3, 12) and there("_xxsubinterpreters"):    # 3.11's share the main GIL
        return _Subinterpreters("_xxsubinterpreters")
    return None


# Isolated interpreters refuse daemon threads (3.12+: "daemon threads are
# disabled in this (sub)interpreter"); tideloop's threads are daemons only
# where they may be, and stopped before the interpreter's end elsewhere.
_daemon_threads_allowed = _lookup("_thread.daemon_threads_allowed")
DAEMON_THREADS = _daemon_threads_allowed() if _daemon_threads_allowed is not None else True
_record("daemon_threads", "3.12+: _thread.daemon_threads_allowed",
        "allowed" if DAEMON_THREADS else "refused",
        "whether this interpreter lets tideloop start daemon threads")

SUBINTERPRETERS = _subinterpreters()
_record("subinterpreters", "3.12: _xxsubinterpreters; 3.13: _interpreters; "
        "3.14+: concurrent.interpreters",
        SUBINTERPRETERS.branch if SUBINTERPRETERS is not None else "none",
        "isolated interpreters with a GIL each (tideloop.interpreters)")


# -- methods reused from asyncio's loops --------------------------------------

#: (class name, method name) -> "stock" or "missing"
BORROWED = {}


def borrow(name, cls=_base_events.BaseEventLoop):
    """asyncio's own implementation of a loop method, to be placed on the
    tideloop class.  Where the running interpreter no longer has it, a stand-in
    that raises NotImplementedError names what is missing."""
    func = cls.__dict__.get(name)
    BORROWED[(cls.__name__, name)] = "stock" if func is not None else "missing"
    if func is not None:
        return func

    def missing(self, *args, **kwargs):
        raise NotImplementedError(
            f"tideloop reuses asyncio's {cls.__name__}.{name}, which Python "
            f"{sys.version.split()[0]} does not have")
    missing.__name__ = name
    return missing


# create_task's fast path is C; a task factory or keywords other than
# name/context (3.14's eager_start, say) take the stock method.
create_task_stock = borrow("create_task")

# What the stock create_task does with a task factory, read off the names its code uses;
# the C fast path does the same (0: unknown, always call the stock method).
# Values as TL_CREATE_TASK_* in _core/internal.h.
_CREATE_TASK_STYLES = {0: "stock", 1: "set_task_name-helper", 2: "set_name", 3: "kwargs"}
set_task_name = _lookup("asyncio.tasks._set_task_name")


def _create_task_style():
    try:
        names = _names(create_task_stock)
    except AttributeError:
        return 0
    params = list(inspect.signature(create_task_stock).parameters)
    if "_set_task_name" in names and set_task_name is not None:
        return 1
    if "set_name" in names and "name" in params:
        return 2
    if params == ["self", "coro", "kwargs"] and "_task_factory" in names:
        return 3
    return 0


CREATE_TASK_STYLE = _create_task_style()
_record("create_task_factory", "3.11-3.12: helper; 3.13: set_name; 3.14: kwargs",
        _CREATE_TASK_STYLES[CREATE_TASK_STYLE],
        "BaseEventLoop.create_task with a task factory (the C path does the same)")
