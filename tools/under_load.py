#!/usr/bin/env python3
"""Run a command beside CPU hogs, several times: is it green on a busy machine?

    python tools/under_load.py                        # the README's test command,
                                                      # 3 runs beside 2 hogs
    python tools/under_load.py --runs 1 --hogs 2 -- python -m pytest tests/net

Each hog is a Python process spinning on one core for the whole run (two
on this 2-core machine: every test then shares its core with a process that
never sleeps).  The verdict per run is the command's exit status; the exit
status is 1 unless every run passed.  Each run's output goes to
``--logdir`` (default: a temporary directory, printed).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOG = "while True: pass"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--logdir")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="after --; default: python tests/run.py")
    args = ap.parse_args(argv)
    cmd = [c for c in args.command if c != "--"] or [sys.executable, "tests/run.py"]
    logdir = args.logdir or tempfile.mkdtemp(prefix="tideloop-under-load-")
    os.makedirs(logdir, exist_ok=True)
    print(f"under_load: {' '.join(cmd)}; {args.runs} run(s) beside {args.hogs} CPU hog(s); "
          f"logs in {logdir}", flush=True)
    results = []
    for i in range(1, args.runs + 1):
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
        t0 = time.monotonic()
        try:
            with open(os.path.join(logdir, f"run-{i}.log"), "w") as log:
                rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        secs = time.monotonic() - t0
        results.append(rc)
        print(f"under_load: run {i}: {'PASS' if rc == 0 else f'FAIL (exit {rc})'} "
              f"({secs:.0f} s)", flush=True)
    ok = all(rc == 0 for rc in results)
    print(f"under_load: {'PASS' if ok else 'FAIL'} ({sum(rc == 0 for rc in results)} "
          f"of {len(results)} green)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
