"""Command line: ``python -m tideloop {run,bench} ...``.

    python -m tideloop run SCRIPT [ARGS...]     run SCRIPT as __main__ on tideloop
    python -m tideloop run -m MODULE [ARGS...]  the same for a module, like python -m
    python -m tideloop bench [options]          loop micro-benchmarks (see bench --help)
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
                    "tideloop installed first (tideloop.install()), so that "
                    "asyncio.run(), asyncio.new_event_loop() and asyncio.Runner "
                    "use tideloop loops. sys.argv is [SCRIPT, ARGS...]; "
                    "the script's exit status is the command's.",
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
    parser.run_parser = run
    return parser


def _install():
    import tideloop
    tideloop.install()


def _run_script(script, args):
    if not os.path.exists(script):
        print(f"{PROG} run: can't open file {script!r}: "
              f"[Errno 2] No such file or directory", file=sys.stderr)
        return 2
    _install()
    sys.argv = [script] + list(args)
    if os.path.isfile(script):
        # As 'python SCRIPT' does: the script's directory comes first on sys.path.
        # (For a directory or zip file, run_path puts it there itself.)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


def _run_module(module, args):
    _install()
    sys.argv = [module] + list(args)    # run_module replaces argv[0] with the file
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


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
    sys.exit(main())
