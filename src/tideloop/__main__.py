"""Command line: ``python -m tideloop {run,bench,top} ...``.

    python -m tideloop run SCRIPT [ARGS...]     run SCRIPT as __main__ on tideloop
    python -m tideloop run -m MODULE [ARGS...]  the same for a module, like python -m
    python -m tideloop bench [options]          loop micro-benchmarks (see bench --help)
    python -m tideloop top PID [options]        a live view of a process's loops
    python -m tideloop --version
"""

import argparse
import os
import runpy
import sys

PROG = "python -m tideloop"


def _version():
    try:
        from tideloop._version import __version__
    except Exception:       # pragma: no cover - broken checkout
        return "unknown"
    return __version__


def build_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="tideloop: a drop-in asyncio event loop for CPython, written in C.",
        epilog=f"Run '{PROG} COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version",
                        version=f"tideloop {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser(
        "run", prog=f"{PROG} run",
        usage=f"{PROG} run [-h] (SCRIPT | -m MODULE) [ARGS ...]",
        help="run a Python script (or module) with tideloop as the asyncio loop",
        description="Run SCRIPT as __main__, like 'python SCRIPT ARGS...', with "
                    "tideloop installed first, so that asyncio.run(), "
                    "asyncio.new_event_loop() and asyncio.Runner use tideloop "
                    "loops (a loop_factory the program passes still wins): "
                    "through tideloop.install() where asyncio has event loop "
                    "policies (Python 3.11 to 3.15); where it has none (3.16), "
                    "by replacing asyncio.new_event_loop() in this process only. "
                    "Otherwise the program runs as under "
                    "'python SCRIPT' / 'python -m MODULE': the same sys.argv, "
                    "__file__, sys.path[0] and __main__ module, the same "
                    "traceback for an uncaught exception (no frames of this "
                    "runner), the same error messages and exit status.",
        epilog="Everything after SCRIPT (or -m MODULE) is passed to it unchanged, "
               "options included.")
    run.add_argument("script", metavar="SCRIPT", nargs="?",
                     help="path of the script (or a directory / zip file with __main__.py)")
    run.add_argument("-m", dest="module", metavar="MODULE",
                     help="run library module MODULE as a script instead, like 'python -m'")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                     help="arguments for the script")

    from tideloop import _bench
    bench = commands.add_parser(
        "bench", prog=f"{PROG} bench",
        help="micro-benchmarks: asyncio vs uvloop vs tideloop in one run",
        description=_bench.build_parser().description)
    _bench.add_arguments(bench)

    commands.add_parser(
        "info", prog=f"{PROG} info",
        help="which of tideloop's paths this interpreter runs and why",
        description="Print the interpreter, the poller, the TLS routes, and each "
                    "CPython-private layout or name tideloop relies on: whether it is "
                    "in use here, and why not (TIDELOOP_PORTABLE=1 turns every one "
                    "that has a fallback off).")

    top = commands.add_parser(
        "top", prog=f"{PROG} top",
        help="a live view of a running process's loops: health, stalls, slow "
             "callbacks, tasks by CPU",
        description="Show the tideloop loops of process PID, refreshed every "
                    "--interval seconds until Ctrl-C: per loop, iterations, "
                    "callbacks and I/O events per second, the share of time "
                    "spent running rather than waiting in the poller, queued "
                    "callbacks, timers and fds, callback time and scheduling "
                    "lag percentiles, recent stalls with the line they were "
                    "caught at, the slowest recent callbacks and the tasks that "
                    "used the most CPU. The process opts in with "
                    "tideloop.diagnostics.serve() or TIDELOOP_DIAGNOSTICS=serve "
                    "(a Unix socket only its user can open). On Python 3.14 top "
                    "attaches to a process that did not opt in with "
                    "sys.remote_exec, if this user may ptrace it and it runs "
                    "the same Python version.",
        epilog="Exit status 0, or 1 with a one-line message: no such process, "
               "permission denied, not opted in, no tideloop loop.")
    top.add_argument("pid", type=int, metavar="PID", help="the process to look at")
    top.add_argument("--interval", type=float, default=2.0, metavar="S",
                     help="seconds between refreshes (default: %(default)s)")
    top.add_argument("--once", action="store_true",
                     help="print one frame and exit (rates over the first second)")
    top.add_argument("--json", action="store_true",
                     help="print the process's raw view as JSON once and exit")
    top.add_argument("--tasks", type=int, default=10, metavar="N",
                     help="tasks to show per loop (default: %(default)s)")
    top.add_argument("--socket", metavar="PATH",
                     help="the socket, when the process passed a path to serve()")
    parser.run_parser = run
    return parser


def _install():
    import tideloop
    from tideloop import _compat

    if _compat.POLICY_API:
        tideloop.install()
    else:
        # No policies (CPython 3.16): this process exists to run the program
        # on tideloop, so here, and only here, asyncio's new_event_loop() is
        # replaced (see the help text).
        _compat.set_default_loop_factory(tideloop.new_event_loop)


# --------------------------------------------------------------------------
# 'run': do what the interpreter does for 'python SCRIPT' / 'python -m MODULE'
# (Modules/main.c pymain_run_python, Python/pythonrun.c _PyRun_SimpleFileObject,
# runpy._run_module_as_main), with tideloop installed first.
# --------------------------------------------------------------------------

def _interpreter_path0():
    """The entry 'python -m tideloop' put first on sys.path: the current
    directory; None under -P / PYTHONSAFEPATH / -I, where it puts none."""
    if getattr(sys.flags, "safe_path", False) or not sys.path:
        return None
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    return sys.path[0] if sys.path[0] == cwd else None


# Taken when this module starts, before anything can change sys.path.
_PATH0 = _interpreter_path0() if __name__ == "__main__" else None

# The exception the user's program ended with, once printed (see _report_uncaught).
_uncaught = []


def _set_path0(entry):
    """Replace the entry 'python -m tideloop' put first on sys.path by the one
    the interpreter puts there for the program (None: no entry)."""
    if _PATH0 is not None and sys.path and sys.path[0] == _PATH0:
        del sys.path[0]
    if entry is not None:
        sys.path.insert(0, entry)


def _abspath(path):
    """The interpreter's absolute form of the script path (config.run_filename,
    _Py_abspath): the current directory joined to it, not normalised, so that
    __file__ and tracebacks read exactly as under 'python SCRIPT'."""
    if os.path.isabs(path):
        return path
    try:
        cwd = os.getcwd()
    except OSError:
        return path         # the interpreter keeps the relative path then
    if path in ("", "."):
        return cwd
    return cwd + os.sep + path


def _program_name():
    """What the interpreter calls itself in its own messages (config.program_name)."""
    orig = getattr(sys, "orig_argv", None)
    return orig[0] if orig and orig[0] else "python3"


def _get_importer(path):
    """sys.path_importer_cache / sys.path_hooks lookup, as the interpreter does
    to decide whether SCRIPT is a directory or zip file (an import path entry)."""
    cache = sys.path_importer_cache
    if path in cache:
        return cache[path]
    cache[path] = None
    for hook in sys.path_hooks:
        try:
            importer = hook(path)
        except ImportError:
            continue
        cache[path] = importer
        return importer
    return None


def _new_main_module():
    """A fresh __main__ module, as the interpreter's starts (add_main_module):
    the runner's own globals must not leak into the program's."""
    import builtins
    import importlib.machinery
    import types

    old = sys.modules.get("__main__")
    main = types.ModuleType("__main__")
    d = main.__dict__
    if old is not None and "__annotations__" in vars(old):      # CPython < 3.14
        d["__annotations__"] = {}
    d["__builtins__"] = builtins
    d["__loader__"] = importlib.machinery.BuiltinImporter
    sys.modules["__main__"] = main
    return main


def _runner_files():
    """co_filename of the frames that run the program and are not part of it:
    this module, runpy and the import system (frozen or not)."""
    files = {_runner_files.__code__.co_filename, "<frozen runpy>",
             "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>",
             "<frozen zipimport>"}
    for name, func in (("runpy", "run_path"),
                       ("importlib._bootstrap", "_call_with_frames_removed"),
                       ("importlib._bootstrap_external", "decode_source"),
                       ("zipimport", "_get_module_code")):
        module = sys.modules.get(name)
        if module is None:
            continue
        if getattr(module, "__file__", None):
            files.add(module.__file__)
        code = getattr(getattr(module, func, None), "__code__", None)
        if code is not None:
            files.add(code.co_filename)
    return files


def _user_traceback(tb):
    """tb without its leading runner frames (this module, runpy, importlib)."""
    files = _runner_files()
    while tb is not None and tb.tb_frame.f_code.co_filename in files:
        tb = tb.tb_next
    return tb


def _report_uncaught(exc):
    """Print an exception the program did not catch as the interpreter does
    (PyErr_Print): sys.last_*, then sys.excepthook, without the runner's frames.
    Returns the exit status; the exception is kept for _exit_as_uncaught."""
    tb = _user_traceback(exc.__traceback__)
    exc.__traceback__ = tb
    typ = type(exc)
    sys.last_type, sys.last_value, sys.last_traceback = typ, exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    _uncaught[:] = [exc]
    missing = object()
    hook = getattr(sys, "excepthook", missing)
    if hook is missing:
        _write_stderr("sys.excepthook is missing\n")
        sys.__excepthook__(typ, exc, tb)
        return 1
    try:
        hook(typ, exc, tb)
    except SystemExit:
        raise
    except BaseException as err:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        err_tb = err.__traceback__ = _user_traceback(err.__traceback__)
        _write_stderr("Error in sys.excepthook:\n")
        sys.__excepthook__(type(err), err, err_tb)
        _write_stderr("\nOriginal exception was:\n")
        sys.__excepthook__(typ, exc, tb)
    return 1


def _write_stderr(text):
    try:
        sys.stderr.write(text)
    except Exception:
        pass


def _called_by_interpreter():
    """True if only runpy (or nothing) is above this module's frame: the
    interpreter itself runs us ('python -m tideloop') and will print and exit
    on an exception that leaves this module."""
    own = _runner_files.__code__.co_filename
    files = _runner_files() - {own}
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == own:
        frame = frame.f_back
    while frame is not None:
        if frame.f_code.co_filename not in files:
            return False
        frame = frame.f_back
    return True


def _exit_as_uncaught(exc):
    """Let the interpreter end the process for exc, already printed by
    _report_uncaught: it exits with status 1, or for a KeyboardInterrupt
    finalises and then re-raises SIGINT (status -2 / 130), exactly as after
    'python SCRIPT'. A one-shot sys.excepthook keeps it from printing exc again
    and puts back the program's hook, sys.last_* and exc's traceback."""
    tb = exc.__traceback__
    missing = object()
    hook = getattr(sys, "excepthook", missing)

    def already_printed(typ, value, traceback):
        if hook is missing:
            del sys.excepthook
        else:
            sys.excepthook = hook
        if value is not exc:            # something else went wrong on the way out
            (sys.excepthook if hook is not missing else sys.__excepthook__)(
                typ, value, traceback)
            return
        exc.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        if sys.version_info >= (3, 12):
            sys.last_exc = exc

    sys.excepthook = already_printed
    raise exc


def _run_main(func, *args):
    """Call func(*args), which runs the program; an uncaught exception other
    than SystemExit is reported as the interpreter reports it. Returns the
    exit status; SystemExit propagates (code and message as usual)."""
    try:
        func(*args)
    except SystemExit:
        raise
    except BaseException as exc:
        uncaught = exc
    else:
        return 0
    # Reported outside the except clause: an error in sys.excepthook must not
    # get the program's exception as its __context__ (PyErr_Print has
    # cleared it when it calls the hook).
    return _report_uncaught(uncaught)


def _run_module_as_main(mod_name, alter_argv):
    """runpy._run_module_as_main: what 'python -m MOD' (alter_argv) and
    'python DIR_OR_ZIP' (not) run. A fallback on the public runpy API for a
    runpy without it (it is private; CPython 3.11 to 3.14 have it)."""
    func = getattr(runpy, "_run_module_as_main", None)
    if func is not None:
        return func(mod_name, alter_argv)
    try:
        if alter_argv:
            runpy.run_module(mod_name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(sys.path[0], run_name="__main__")
    except ImportError as exc:
        tb = exc.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        if tb.tb_frame.f_code.co_filename not in _runner_files():
            raise           # raised by the program, not by runpy's look-up
        sys.exit(f"{sys.executable}: {exc}")


def _is_pyc(filename, source):
    """maybe_pyc_file(): a .pyc file by its name or its magic number."""
    import importlib.util

    return filename.endswith(".pyc") or source[:2] == importlib.util.MAGIC_NUMBER[:2]


def _exec_script(filename, source, d):
    """Run the script's code in d as _PyRun_SimpleFileObject does."""
    from importlib.machinery import SourceFileLoader, SourcelessFileLoader

    pyc = _is_pyc(filename, source)
    d["__loader__"] = (SourcelessFileLoader if pyc else SourceFileLoader)(
        "__main__", filename)
    if pyc:                                     # run_pyc_file()
        import importlib.util
        import marshal
        import types

        if source[:4] != importlib.util.MAGIC_NUMBER:
            raise RuntimeError("Bad magic number in .pyc file")
        code = marshal.loads(source[16:])
        if not isinstance(code, types.CodeType):
            raise RuntimeError("Bad code object in .pyc file")
    else:
        code = compile(source, filename, "exec", dont_inherit=True)
    exec(code, d)


def _run_script(script, args):
    sys.argv = [script] + list(args)
    filename = _abspath(script)
    if _get_importer(filename) is not None:
        # A directory or zip file: its __main__ module runs, found on sys.path[0].
        _set_path0(filename)
        _install()
        _new_main_module()
        return _run_main(_run_module_as_main, "__main__", False)

    try:
        with open(filename, "rb") as f:
            source = f.read()
    except OSError as exc:
        _write_stderr(f"{_program_name()}: can't open file {filename!r}: "
                      f"[Errno {exc.errno}] {exc.strerror}\n")
        return 2
    # The script's directory, symbolic links resolved (_PyPathConfig_ComputeSysPath0).
    _set_path0(None if getattr(sys.flags, "safe_path", False)
               else os.path.dirname(os.path.realpath(script)))
    _install()
    main = _new_main_module()
    d = main.__dict__
    d["__file__"] = filename
    from tideloop import _compat
    if _compat.SCRIPT_MAIN_HAS_CACHED:
        d["__cached__"] = None
    status = _run_main(_exec_script, filename, source, d)
    # As the interpreter does once the script ended (but not on SystemExit,
    # where it exits at once): atexit handlers see no __file__.
    d.pop("__file__", None)
    d.pop("__cached__", None)
    return status


def _run_module(module, args):
    sys.argv = ["-m"] + list(args)      # argv[0] becomes the module's file
    _install()
    _new_main_module()
    return _run_main(_run_module_as_main, module, True)


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    argv = list(argv)

    # 'run' is parsed by hand, as the interpreter does: everything after SCRIPT
    # (or -m MODULE) belongs to the script, even things that look like options.
    if argv[:1] == ["run"]:
        rest = argv[1:]
        if rest and rest[0] == "-m" and len(rest) >= 2:
            return _run_module(rest[1], rest[2:])
        if rest and rest[0].startswith("-m") and len(rest[0]) > 2:     # -mMODULE
            return _run_module(rest[0][2:], rest[1:])
        if rest and rest[0] not in ("-h", "--help") and (
                not rest[0].startswith("-") or rest[0] == "-"):
            if rest[0] == "-":
                print(f"{PROG} run: reading the script from stdin is not supported",
                      file=sys.stderr)
                return 2
            return _run_script(rest[0], rest[1:])
        # No script, -h, or an unknown option: let argparse print help / the error.

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        from tideloop import _bench
        return _bench.run_from_args(args, invocation=("-m", "tideloop", "bench"))
    if args.command == "info":
        from tideloop import _internals
        return _internals.info()
    if args.command == "top":
        from tideloop import _diag_live
        return _diag_live.top_main(args)
    if args.command == "run":       # only reached for odd spellings argparse accepted
        if not args.script and not args.module:
            parser.run_parser.error("a SCRIPT (or -m MODULE) to run is required")
        if args.module:
            return _run_module(args.module, ([args.script] if args.script else [])
                               + args.args)
        return _run_script(args.script, args.args)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    status = main()
    if _uncaught and _called_by_interpreter():
        _exit_as_uncaught(_uncaught.pop())
    sys.exit(status)
