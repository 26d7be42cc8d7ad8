#!/usr/bin/env python3
"""The portable mode's run: tests with TIDELOOP_PORTABLE=1, where every
run-time use of CPython's internals takes its public fallback.

By default the tests that the registry (src/tideloop/_internals.py) names for
each run-time choice -- the behavioural tests and CPython's test_asyncio
modules that exercise both of its sides -- plus the registry's own tests;
``--all`` runs the whole suite and the whole conformance run instead.  Both
steps always run; exit status 1 when either failed (or when the mode did not
take: the child interpreter is asked first).

    python tests/portable.py                 # CI, on every leg
    python tests/portable.py --all           # the long mode
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:    # the checkout's root (not its src/): tests.run
    sys.path.insert(0, ROOT)
from tests.run import step  # noqa: E402

# Tests that check the mode itself (they read TIDELOOP_PORTABLE's effects).
ALWAYS = ("tests/compat/test_internals.py", "tests/compat/test_compat.py")

CHECK = ("import sys, tideloop._core as c, tideloop._streams as s; "
         "sys.exit(0 if c.portable and not c.context_snapshots and not s.ENABLED "
         "and c.tls_route() == 'sslobject' else 'TIDELOOP_PORTABLE did not take')")


def registry():
    """src/tideloop/_internals.py's REGISTRY as (name, kind, tests, conformance),
    read without importing the package (its entries are literals): the
    tideloop under test is the installed one."""
    import ast
    with open(os.path.join(ROOT, "src", "tideloop", "_internals.py")) as f:
        tree = ast.parse(f.read())
    fields = next(node for node in tree.body if isinstance(node, ast.Assign) and any(
        getattr(t, "id", None) == "Internal" for t in node.targets)).value.args[1]
    names = ast.literal_eval(fields).split()
    entries = next(node.value.elts for node in tree.body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "REGISTRY" for t in node.targets))
    rows = []
    for call in entries:
        values = dict(zip(names, (ast.literal_eval(a) for a in call.args)))
        rows.append((values["name"], values["kind"], values.get("tests", ()),
                     values.get("conformance", ())))
    return rows


def selection():
    """(pytest paths, test_asyncio modules) the registry names, the modules
    limited to those this interpreter has."""
    paths, modules = list(ALWAYS), []
    for _, _, tests, conformance in registry():
        paths += [p for p in tests if p not in paths]
        modules += [m for m in conformance if m not in modules]
    modules = [m for m in modules
               if importlib.util.find_spec("test.test_asyncio." + m) is not None]
    return paths, modules


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true",
                    help="the whole suite and conformance run, not the registry's selection")
    ap.add_argument("--jobs", type=int, default=2,
                    help="pytest-xdist workers and conformance modules at a time (default 2)")
    ap.add_argument("--pytest-log", metavar="FILE", help="also write the suite's output there")
    ap.add_argument("--conformance-json", metavar="FILE",
                    help="the conformance report (tests/conformance/run.py --json)")
    ap.add_argument("--json", metavar="FILE", help="this run's summary")
    args = ap.parse_args(argv)
    py = sys.executable
    env = dict(os.environ, TIDELOOP_PORTABLE="1")
    if subprocess.call([py, "-c", CHECK], cwd=ROOT, env=env) != 0:
        return 1
    paths, modules = (["tests"], None) if args.all else selection()
    suite = [py, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider",
             "--ignore=tests/tooling/test_packaging.py"]
    if args.jobs > 1:
        suite += ["-n", str(args.jobs)]
    conformance = [py, "tests/conformance/run.py", "--loop", "both", "--strict", "--known",
                   "tests/conformance/known_failures.txt", "--jobs", str(max(args.jobs, 1))]
    if modules is not None:
        conformance += ["--modules", ",".join(modules)]
    if args.conformance_json:
        conformance += ["--json", args.conformance_json]
    results = [("suite", *step("portable mode, suite", suite, args.pytest_log, env)),
               ("conformance", *step("portable mode, conformance", conformance, env=env))]
    print()
    for name, passed, seconds in results:
        print(f"portable mode, {name:12s} {'PASS' if passed else 'FAIL'}  ({seconds:.0f} s)")
    ok = all(passed for _, passed, _ in results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(scope="all" if args.all else "registry", paths=paths,
                           modules=modules, ok=ok,
                           steps={n: dict(ok=p, seconds=round(s, 1)) for n, p, s in results}),
                      f, indent=1)
    print("portable mode:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
