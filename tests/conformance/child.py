"""Child process of the conformance runner: runs ONE CPython asyncio test module
on ONE loop and streams per-test results as JSON lines.

Not meant to be run by hand (run.py builds the command line), but it works:

    python tests/conformance/child.py --module test_locks --side tideloop \
        --out /tmp/r.jsonl [--subinterpreter]

--subinterpreter (3.12+): the process creates an isolated subinterpreter (its
own GIL) and runs everything below in it: the patch, the patch check, the test
module. The subinterpreter writes the records to --out itself (objects do not
cross interpreters, files do); the main interpreter keeps the per-test
watchdog (faulthandler does not load in an isolated subinterpreter), armed
and cancelled through a pipe, and destroys the subinterpreter at the end.

Records written to --out (one JSON object per line, flushed after each):
    {"ev": "meta", "loop_type": "tideloop.Loop", ...}   after the patch check
    {"ev": "start", "id": ...}                           before each test
    {"ev": "result", "id": ..., "key": ..., "outcome": ..., ...}
    {"ev": "done", "loops_created": N}                   clean end of run
    {"ev": "interp", ...}, {"ev": "destroyed", ...}      --subinterpreter: the
                          subinterpreter made (before "meta") and gone (after "done")

If the process dies mid-test (crash, per-test watchdog), the parent sees a
"start" without its "result" and re-runs the module with --skip.
"""

import argparse
import fnmatch
import asyncio
import asyncio.unix_events
import importlib
import json
import os
import sys
import time
import traceback
import unittest

try:
    import faulthandler
except ImportError:     # an isolated subinterpreter: it does not load there
    faulthandler = None

PKG = "test.test_asyncio."

# Sides other than "stock" patch in the loop class given by --loop-factory
# ("module:Class", e.g. "tideloop:Loop", "uvloop:Loop"). The classes the
# adapters below create for a side are named with its prefix.
LOOP_SIDES = {"tideloop": "Tideloop", "uvloop": "Uvloop"}

# test_events: the concrete loop test classes of the stock module. Only the
# epoll one is kept on the stock side (it is what asyncio.new_event_loop()
# gives on Linux); a loop side replaces it with <Prefix>EventLoopTests.
# All are reported under the key "test_events.EventLoopTests.<method>" so
# the sides compare per test method.
EVENTS_LOOP_CLASSES = {"EPollEventLoopTests", "PollEventLoopTests",
                       "SelectEventLoopTests", "KqueueEventLoopTests",
                       *(p + "EventLoopTests" for p in LOOP_SIDES.values())}
EVENTS_STOCK_CLASS = "EPollEventLoopTests"
EVENTS_KEY_CLASS = "EventLoopTests"


# Modules whose tests build their loop in a method of a concrete class: the
# stock side keeps that class (the epoll/selector loop), a loop side a
# subclass "<Prefix><Class>" (e.g. "Tideloop<Class>") whose method returns a
# loop of the side's class; all are
# reported under the stock class's name.  Other concrete loop classes of the
# module (poll, select, kqueue variants) are left out on both sides.
CLASS_SWAPS = {
    "test_sock_lowlevel": ("EPollEventLoopTests", "create_event_loop",
                           {"PollEventLoopTests", "SelectEventLoopTests",
                            "KqueueEventLoopTests"}),
    "test_sendfile": ("EPollEventLoopTests", "create_event_loop",
                      {"PollEventLoopTests", "SelectEventLoopTests",
                       "KqueueEventLoopTests"}),
    "test_server": ("SelectorStartServerTests", "new_loop", set()),
    "test_buffered_proto": ("BufferedProtocolSelectorTests", "new_loop", set()),
}


def short_id(test_id):
    return test_id[len(PKG):] if test_id.startswith(PKG) else test_id


def key_for(test_id):
    sid = short_id(test_id)
    parts = sid.split(".")
    if len(parts) >= 3 and parts[0] == "test_events" and parts[1] in EVENTS_LOOP_CLASSES:
        parts[1] = EVENTS_KEY_CLASS
    if (len(parts) >= 3 and parts[0] in CLASS_SWAPS
            and parts[1] in {p + CLASS_SWAPS[parts[0]][0] for p in LOOP_SIDES.values()}):
        parts[1] = CLASS_SWAPS[parts[0]][0]
    return ".".join(parts)


def resolve(spec):
    mod, _, attr = spec.partition(":")
    obj = importlib.import_module(mod)
    for part in (attr or "Loop").split("."):
        obj = getattr(obj, part)
    return obj


class Writer:
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, **rec):
        self.f.write(json.dumps(rec, default=repr) + "\n")
        self.f.flush()   # survives a crash of this process


# --------------------------------------------------------------------------
# Putting the loop under test in place
# --------------------------------------------------------------------------

class LoopCounter:
    """Wraps a loop factory and counts the loops it made."""

    def __init__(self, factory):
        self.factory = factory
        self.count = 0

    def __call__(self):
        self.count += 1
        return self.factory()


def patch_asyncio(counter):
    """Make every way the tests get a "real" loop produce counter()'s loops.

    asyncio.new_event_loop(), asyncio.get_event_loop() without a loop,
    asyncio.run(), asyncio.Runner() without loop_factory and
    IsolatedAsyncioTestCase all end in
    get_event_loop_policy().new_event_loop() -> self._loop_factory().
    Test modules call asyncio.set_event_loop_policy(None) in tearDownModule
    and some tests instantiate asyncio.DefaultEventLoopPolicy() themselves,
    so the default policy *class* is patched, not the current instance.
    Tests that install their own policy (test_runners' TestPolicy with mock
    loops) or build test_utils.TestLoop keep doing so: they test asyncio's
    own base classes, not the loop.
    """
    policy_cls = asyncio.DefaultEventLoopPolicy
    assert policy_cls is asyncio.unix_events._UnixDefaultEventLoopPolicy
    # staticmethod: a plain function stored on the class would be bound.
    policy_cls._loop_factory = staticmethod(counter)


def check_patch(loop_cls, counter):
    """Prove that the tests will really get loop_cls. Returns a description."""
    seen = {}
    asyncio.set_event_loop_policy(None)
    loop = asyncio.new_event_loop()
    seen["asyncio.new_event_loop"] = type(loop)
    loop.close()
    loop = asyncio.DefaultEventLoopPolicy().new_event_loop()
    seen["DefaultEventLoopPolicy().new_event_loop"] = type(loop)
    loop.close()
    with asyncio.Runner() as runner:
        seen["asyncio.Runner()"] = type(runner.get_loop())

    async def main():
        return type(asyncio.get_running_loop())
    seen["asyncio.run"] = asyncio.run(main())
    asyncio.set_event_loop_policy(None)
    bad = {k: v for k, v in seen.items() if not issubclass(v, loop_cls)}
    if bad:
        raise SystemExit(f"conformance: loop patch FAILED, expected {loop_cls!r}, got {bad!r}")
    counter.count = 0
    return {k: f"{v.__module__}.{v.__qualname__}" for k, v in seen.items()}


def adapt_test_events(module, side, counter):
    """Select the loop test classes of test_events for this side."""
    if side in LOOP_SIDES:
        te = module
        # The epoll class's own mixins: UnixEventLoopTestsMixin and
        # SubprocessTestsMixin up to 3.13; 3.14 dropped the Unix mixin.
        base = getattr(te, EVENTS_STOCK_CLASS).__bases__
        keep = LOOP_SIDES[side] + "EventLoopTests"
        cls = type(keep, base, {"create_event_loop": lambda self: counter()})
        cls.__module__ = module.__name__
        setattr(module, keep, cls)
    else:
        keep = EVENTS_STOCK_CLASS

    def wanted(test):
        name = type(test).__name__
        return name not in EVENTS_LOOP_CLASSES or name == keep
    return wanted


def adapt_class_swap(module, side, counter):
    """Run the module's loop test class on the side's loop (see CLASS_SWAPS)."""
    name = module.__name__.rpartition(".")[2]
    stock_name, method, dropped = CLASS_SWAPS[name]
    stock_cls = getattr(module, stock_name)
    if side in LOOP_SIDES:
        swapped = type(LOOP_SIDES[side] + stock_name, (stock_cls,),
                       {method: lambda self: counter()})
        swapped.__module__ = module.__name__
        setattr(module, swapped.__name__, swapped)
        keep = swapped.__name__
    else:
        keep = stock_name
    loop_classes = {stock_name} | {p + stock_name for p in LOOP_SIDES.values()} | dropped

    def wanted(test):
        cls = type(test).__name__
        return cls not in loop_classes or cls == keep
    return wanted


# Per-module adapters: module name -> function(module, side, counter)
# returning a predicate over test cases (None = keep all). Later issues add
# entries for modules with their own concrete loop classes (test_subprocess,
# test_unix_events, ...).
ADAPTERS = {
    "test_events": adapt_test_events,
    **{name: adapt_class_swap for name in CLASS_SWAPS},
}


# --------------------------------------------------------------------------
# Result collection
# --------------------------------------------------------------------------

RANK = {"pass": 0, "xfail": 0, "skip": 1, "xpass": 2, "fail": 3, "error": 4}


def exc_chain(exc):
    names, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        names.append(type(exc).__qualname__)
        exc = exc.__cause__ or exc.__context__
    return names


class FaulthandlerWatchdog:
    """The per-test watchdog: faulthandler ends the process ("Timeout (...)!"
    and exit 1, which the runner reports as a hang) if a test runs longer."""

    def __init__(self, timeout):
        self.timeout = timeout

    def arm(self):
        faulthandler.dump_traceback_later(self.timeout, exit=True)

    def cancel(self):
        faulthandler.cancel_dump_traceback_later()


class PipeWatchdog:
    """The per-test watchdog seen from a subinterpreter: one byte down a pipe
    to the main interpreter, whose thread arms ("+") or cancels ("-") a
    FaulthandlerWatchdog there (see watch_pipe)."""

    def __init__(self, fd):
        self.fd = fd

    def arm(self):
        os.write(self.fd, b"+")

    def cancel(self):
        os.write(self.fd, b"-")


def watch_pipe(fd, watchdog):
    """Main interpreter, a thread: obey a PipeWatchdog until end of file."""
    while True:
        data = os.read(fd, 256)
        if not data:
            watchdog.cancel()
            return
        # Only the last byte counts: a test's stop and the next one's start
        # can arrive together.
        if data[-1:] == b"+":
            watchdog.arm()
        else:
            watchdog.cancel()


class StreamingResult(unittest.TestResult):
    def __init__(self, writer, watchdog, verbose, counter):
        super().__init__()
        self.counter = counter
        self.w = writer
        self.watchdog = watchdog
        self.verbose = verbose
        self.cur = None

    # -- bookkeeping
    def startTest(self, test):
        super().startTest(test)
        if self.watchdog:
            self.watchdog.arm()
        self.cur = {"id": short_id(test.id()), "key": key_for(test.id()),
                    "outcome": None, "t0": time.monotonic()}
        self.w.write(ev="start", id=self.cur["id"])

    def stopTest(self, test):
        super().stopTest(test)
        if self.watchdog:
            self.watchdog.cancel()
        cur, self.cur = self.cur, None
        if cur is None:
            return
        if cur["outcome"] is None:   # e.g. only passing subtests
            cur["outcome"] = "pass"
        cur["time"] = round(time.monotonic() - cur.pop("t0"), 3)
        cur["loops"] = self.counter.count
        self.w.write(ev="result", **cur)
        if self.verbose:
            print(f"  {cur['outcome']:5} {cur['id']}", file=sys.__stderr__, flush=True)

    def _record(self, test, outcome, err=None, reason=None, sub=None):
        is_current = (self.cur is not None and
                      short_id(getattr(test, "id", lambda: "")()) == self.cur["id"])
        if is_current:
            rec = self.cur
        else:
            # setUpClass / setUpModule / tearDownModule errors (_ErrorHolder)
            tid = str(test.id()) if hasattr(test, "id") else str(test)
            rec = {"id": short_id(tid), "key": key_for(tid), "outcome": None,
                   "fixture": True}
        if rec["outcome"] is None or RANK[outcome] > RANK[rec["outcome"]]:
            rec["outcome"] = outcome
            if err is not None:
                etype, evalue, _tb = err
                rec["exc"] = exc_chain(evalue) if evalue is not None else [etype.__name__]
                rec["nyi"] = "NotImplementedError" in rec["exc"]
                rec["message"] = (str(evalue) or "")[:300]
                tb = self._exc_info_to_string(err, test)
                rec["tb"] = tb[-4000:]
                if sub is not None:
                    rec["subtest"] = sub
            if reason is not None:
                rec["reason"] = str(reason)[:300]
        if not is_current:
            self.w.write(ev="result", **rec)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", err)

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason=reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "xpass")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failure = issubclass(err[0], test.failureException)
            self._record(test, "fail" if failure else "error", err,
                         sub=subtest._subDescription())


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--side", choices=["stock", *LOOP_SIDES], required=True)
    ap.add_argument("--loop-factory", default=None,
                    help="module:Class of a loop side (default: <side>:Loop)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip", help="file with test ids (short form) not to run")
    ap.add_argument("--test-timeout", type=float, default=0,
                    help="per-test watchdog in seconds (0 = off)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--only", action="append", default=[], metavar="PATTERN",
                    help="run only tests whose short id matches (fnmatch; by hand)")
    ap.add_argument("--subinterpreter", action="store_true",
                    help="run in an isolated subinterpreter (3.12+)")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    if args.subinterpreter:
        sys.exit(run_in_subinterpreter(args))
    faulthandler.enable(all_threads=True)
    run_tests(args, FaulthandlerWatchdog(args.test_timeout) if args.test_timeout else None)


def run_tests(args, watchdog):
    """Patch, check the patch, run the module, in whichever interpreter this is."""
    w = Writer(args.out)

    if args.side in LOOP_SIDES:
        loop_cls = resolve(args.loop_factory or args.side + ":Loop")
    else:
        loop_cls = asyncio.unix_events._UnixSelectorEventLoop
    # Counting wrapper on both sides, so the report shows how many loops of
    # the kind under test each module actually created.
    counter = LoopCounter(loop_cls)
    patch_asyncio(counter)
    checked = check_patch(loop_cls, counter)
    where = current_interpreter()
    print(f"conformance: {args.module} [{args.side}] asyncio.new_event_loop() -> "
          f"{checked['asyncio.new_event_loop']}"
          + (f" in {where}" if where != "main" else ""), flush=True)

    module = importlib.import_module(PKG + args.module)
    adapter = ADAPTERS.get(args.module)
    wanted = adapter(module, args.side, counter) if adapter else None
    adapted = adapt_for_subinterpreter(module) if args.subinterpreter else []

    skip = set()
    if args.skip:
        with open(args.skip, encoding="utf-8") as f:
            skip = {line.strip() for line in f if line.strip()}

    tests = [t for t in flatten(unittest.defaultTestLoader.loadTestsFromModule(module))
             if (wanted is None or wanted(t)) and short_id(t.id()) not in skip
             and (not args.only or any(fnmatch.fnmatch(short_id(t.id()), p)
                                       for p in args.only))]
    w.write(ev="meta", module=args.module, side=args.side,
            loop_type=f"{loop_cls.__module__}.{loop_cls.__qualname__}",
            checked=checked, ntests=len(tests), pid=os.getpid(),
            python=sys.version.split()[0], interpreter=where,
            **({"adaptations": adapted} if args.subinterpreter else {}))

    result = StreamingResult(w, watchdog, args.verbose, counter)
    suite = unittest.TestSuite(tests)
    t0 = time.monotonic()
    suite.run(result)
    w.write(ev="done", loops_created=counter.count,
            time=round(time.monotonic() - t0, 3))
    sys.stdout.flush()
    sys.stderr.flush()


# --------------------------------------------------------------------------
# --subinterpreter
# --------------------------------------------------------------------------

def _interpreters_module():
    """The low-level interpreters module: _interpreters (3.13+; what 3.14's
    concurrent.interpreters is built on) or _xxsubinterpreters (3.12)."""
    try:
        import _interpreters
        return _interpreters
    except ImportError:
        import _xxsubinterpreters
        return _xxsubinterpreters


def current_interpreter():
    """"main", or "subinterpreter <id>" in any other interpreter."""
    try:
        mod = _interpreters_module()
    except ImportError:             # before 3.12
        return "main"
    # 3.13+: (id, whence) tuples; 3.12: InterpreterID objects.
    cur, main = (int(x[0] if isinstance(x, tuple) else x)
                 for x in (mod.get_current(), mod.get_main()))
    return "main" if cur == main else f"subinterpreter {cur}"


class Subinterpreter:
    """An isolated subinterpreter (own GIL; only extension modules that say
    they support a per-interpreter GIL load), made with 3.12's or 3.13+'s
    private module."""

    def __init__(self):
        self.mod = mod = _interpreters_module()
        if mod.__name__ == "_xxsubinterpreters":
            self.id = mod.create(isolated=True)
        else:
            self.id = mod.create("isolated")
        self.config = None
        if hasattr(mod, "get_config"):          # 3.13+
            self.config = dict(vars(mod.get_config(self.id)))

    def run(self, code):
        """Run code in the subinterpreter's __main__: None, or the text of
        the exception it did not handle."""
        if self.mod.__name__ == "_xxsubinterpreters":
            try:
                self.mod.run_string(self.id, code)
            except self.mod.RunFailedError as exc:
                return str(exc)
            return None
        excinfo = self.mod.exec(self.id, code)
        if excinfo is None:
            return None
        return getattr(excinfo, "errdisplay", None) or excinfo.formatted

    def destroy(self):
        self.mod.destroy(self.id)


def run_in_subinterpreter(args):
    """Main interpreter: run run_tests() in a new isolated subinterpreter,
    keep the per-test watchdog here, destroy the subinterpreter at the end.
    Returns the exit code."""
    import textwrap
    import threading
    if sys.version_info < (3, 12):
        raise SystemExit("conformance: --subinterpreter needs Python 3.12+")
    w = Writer(args.out)
    faulthandler.enable(all_threads=True)
    notify = watcher = None
    if args.test_timeout:
        rfd, notify = os.pipe()
        watcher = threading.Thread(target=watch_pipe, name="conformance-watchdog",
                                   args=(rfd, FaulthandlerWatchdog(args.test_timeout)),
                                   daemon=True)
        watcher.start()
    interp = Subinterpreter()
    w.write(ev="interp", id=int(interp.id), config=interp.config)
    sub_args = vars(args)
    # A new interpreter has the process's configuration, not this one's
    # sys.path[0] (this directory, where the child module is) or sys.argv.
    err = interp.run(textwrap.dedent(f"""\
        import sys
        sys.path[:] = {sys.path!r}
        sys.argv[:] = {sys.argv!r}
        import child
        child.in_subinterpreter({sub_args!r}, {notify!r})
        """))
    if err is not None:         # in_subinterpreter() handles everything else
        print(err, file=sys.stderr, flush=True)
        return 3
    if watcher is not None:
        # The last test's "-" is read before the destroy's own watchdog is
        # armed (faulthandler has one timer).
        os.close(notify)
        watcher.join()
        os.close(rfd)
    t0 = time.monotonic()
    if args.test_timeout:       # joining a thread a test left running can hang
        faulthandler.dump_traceback_later(args.test_timeout, exit=True)
    interp.destroy()            # joins its threads, frees its modules
    if args.test_timeout:
        faulthandler.cancel_dump_traceback_later()
    w.write(ev="destroyed", time=round(time.monotonic() - t0, 3))
    sys.stdout.flush()
    return 0


def adapt_for_subinterpreter(module):
    """The same changes to the tests' scaffolding on every side, where an
    isolated subinterpreter cannot have what it asks for: SIGCHLD handlers,
    daemon threads, a KeyboardInterrupt from _thread.interrupt_main(). The
    tests themselves, and the loop, are left as they are. Returns what was
    done, for the report."""
    import inspect
    import threading
    import types
    done = []

    # Daemon threads are disabled in an isolated subinterpreter.  The tests'
    # helper threads (functional.TestThreadedServer, test_ssl's server and
    # client threads, a few clients) ask for one only so that a failed test
    # cannot keep the process alive; they are stopped and joined by the tests.
    # Made from test.test_asyncio code, they become ordinary threads (those
    # asyncio itself starts, e.g. ThreadedChildWatcher's, are left alone).
    if not threading._daemon_threads_allowed() and not hasattr(threading.Thread, "_conf_patched"):
        def from_tests(depth):
            return sys._getframe(depth + 1).f_globals.get("__name__", "").startswith(PKG)
        init, prop = threading.Thread.__init__, threading.Thread.daemon

        def __init__(self, *args, daemon=None, **kwargs):
            if daemon and from_tests(1):
                daemon = False
            init(self, *args, daemon=daemon, **kwargs)

        def set_daemon(self, daemonic):
            prop.fset(self, False if daemonic and from_tests(1) else daemonic)
        threading.Thread.__init__ = __init__
        threading.Thread.daemon = property(prop.fget, set_daemon, doc=prop.__doc__)
        threading.Thread._conf_patched = True
        done.append("threading.Thread: daemon=True asked by test.test_asyncio code "
                    "makes a non-daemon thread (daemon threads are disabled here)")

    # 3.12/3.13 test_events: the setUp of the loop tests' mixin
    # (UnixEventLoopTestsMixin) and of the get_event_loop tests'
    # (GetEventLoopTestsMixin) attach a SafeChildWatcher, which needs a
    # SIGCHLD handler: every such test would fail in setUp, and
    # GetEventLoopTestsMixin would leave asyncio's running-loop functions
    # swapped for the next tests (its tearDown does not run).  During those
    # setUps, SafeChildWatcher is a PidfdChildWatcher (the policy's own
    # choice on Linux), which needs none.
    if hasattr(asyncio, "PidfdChildWatcher"):
        for cls in vars(module).values():
            setup = vars(cls).get("setUp") if isinstance(cls, type) else None
            if setup is None or "SafeChildWatcher" not in setup.__code__.co_names:
                continue

            def setUp(self, _setup=setup):
                saved = asyncio.SafeChildWatcher
                asyncio.SafeChildWatcher = asyncio.PidfdChildWatcher
                try:
                    _setup(self)
                finally:
                    asyncio.SafeChildWatcher = saved
            cls.setUp = setUp
            done.append(f"{cls.__name__}.setUp: PidfdChildWatcher for its "
                        "SafeChildWatcher (SIGCHLD handler)")

    # Tests that interrupt themselves with _thread.interrupt_main() (in a
    # callback, or a coroutine) wait for a KeyboardInterrupt that only the
    # main interpreter's main thread gets: they would spin until the
    # watchdog.  Skipped, with the reason.
    def uses(code, names):
        return bool(names & set(code.co_names)) or any(
            uses(c, names) for c in code.co_consts if isinstance(c, types.CodeType))
    names = {"interrupt_main", "interrupt_self"}
    skipped = []
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
            continue
        for name in dir(cls):
            func = inspect.unwrap(getattr(cls, name)) if name.startswith("test") else None
            code = getattr(func, "__code__", None)
            if code is not None and uses(code, names):
                setattr(cls, name, unittest.skip(
                    "subinterpreter: interrupts itself (_thread.interrupt_main); "
                    "SIGINT reaches only the main interpreter")(getattr(cls, name)))
                skipped.append(f"{cls.__name__}.{name}")
    if skipped:
        done.append("skipped (interrupt themselves): " + ", ".join(sorted(set(skipped))))
    return done


def in_subinterpreter(argdict, notify_fd):
    """Subinterpreter: run_tests(); end the process as main() would when the
    run goes wrong (an exception does not cross interpreters)."""
    args = argparse.Namespace(**argdict)
    try:
        run_tests(args, PipeWatchdog(notify_fd) if notify_fd is not None else None)
    except SystemExit as exc:
        code = exc.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        _exit_now(code)
    except BaseException:
        traceback.print_exc()
        _exit_now(3)


def _exit_now(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(3)
