#!/usr/bin/env python3
"""The test command: the behavioural suite (every test on stock asyncio and on
tideloop), then CPython's own test_asyncio modules on both loops (failing on
any test that passes on stock asyncio and not on tideloop).  Both steps always
run, each prints its verdict and time, and the exit status is 1 when either
failed: a failing suite does not hide the conformance verdict.

    python tests/run.py                      # what the README and CI run
    python tests/run.py --jobs 2 --pytest-log suite.log --conformance-json conf.json
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step(name, cmd, log=None, env=None):
    """Run cmd from the checkout (in env); its output goes to the terminal
    (and to log). Returns (passed, seconds)."""
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    if log is None:
        rc = subprocess.call(cmd, cwd=ROOT, env=env)
    else:
        with open(log, "w") as f:
            p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            for line in p.stdout:
                sys.stdout.write(line)
                f.write(line)
            rc = p.wait()
    return rc == 0, time.monotonic() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3,
                    help="pytest-xdist workers and conformance modules at a time (default 3)")
    ap.add_argument("--pytest-log", metavar="FILE", help="also write the suite's output there")
    ap.add_argument("--conformance-json", metavar="FILE",
                    help="the conformance report (tests/conformance/run.py --json)")
    args = ap.parse_args(argv)
    py = sys.executable
    suite = [py, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-n", str(args.jobs)]
    conformance = [py, "tests/conformance/run.py", "--loop", "both", "--strict", "--known",
                   "tests/conformance/known_failures.txt", "--jobs", str(args.jobs)]
    if args.conformance_json:
        conformance += ["--json", args.conformance_json]
    results = [("behavioural suite", *step("behavioural suite", suite, args.pytest_log)),
               ("conformance (test_asyncio)", *step("conformance", conformance))]
    print()
    for name, passed, seconds in results:
        print(f"{name:28s} {'PASS' if passed else 'FAIL'}  ({seconds:.0f} s)")
    ok = all(passed for _, passed, _ in results)
    print("tests:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
