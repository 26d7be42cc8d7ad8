#!/usr/bin/env python3
"""Run tideloop's checks on every supported CPython: the version matrix.

    python tools/matrix.py [--only 3.12,3.14] [--jobs N] [--json OUT]
                           [--dev-mode LEG] [--no-conformance]
                           [--conformance-legs LEGS] [--conformance-jobs N]

For each interpreter (a "leg"): find or build it, make a fresh venv, install
tideloop with its test extra from this checkout (warnings are errors:
TIDELOOP_DEV=1), import it under ``-W error``, run the behavioural suite
(with the quick stress run) and CPython's own asyncio tests of that
interpreter on both loops (``tests/conformance/run.py --strict``, known
failures: none).  The verdicts come from exit codes and parsed reports (the
pytest summary line, the conformance JSON), never from reading the output.

Legs (the interpreters CI tests; README "Supported versions"):
  3.11     the machine's python3 (or $PYTHON)
  3.12     pyenv's 3.12.1
  3.13.0   pyenv's 3.13.0
  3.13     the newest 3.13 release, built from the Debian archive's source
           (tools/build_python.sh; cached under ~/.cache/cpython)
  3.14     Debian sid's python3.14 binaries in a private root
           (tools/python_from_debian.sh; cached under ~/.cache/cpython-debian)
  3.15     Debian sid's python3.15 binaries, the same way
  3.13t    the newest 3.13, free-threaded build (--disable-gil), with the
           GIL off: tideloop._core declares Py_mod_gil = Py_MOD_GIL_NOT_USED,
           and the import step fails if the GIL is on after `import tideloop`

In isolated subinterpreters (``--subinterpreter-legs``, 3.12+): the loop/net
behavioural subset run inside one on both loops
(``tests/interpreters/run_suite.py``: 0 regressions, no crash), and on
``--subinterpreter-conformance-legs`` CPython's asyncio tests inside one
(``tests/conformance/run.py --subinterpreter``).

In the portable mode (``--portable-legs``): ``tests/portable.py`` with
``TIDELOOP_PORTABLE=1`` -- the tests the internals registry names for each
run-time choice and their test_asyncio modules, or with ``--portable-all``
the whole suite and conformance run.

A failed step's failing tests (pytest's FAILED/ERROR lines, the conformance
run's regressions) are printed with its verdict.

Each leg's suite runs in ``--test-workers`` pytest-xdist workers (default 2),
without the repository's tooling tests (marker ``checkout``); legs not in
``--whole-suite-legs`` (default: all) leave out tests/stress and
tests/ecosystem as well.
``--dev-mode LEG`` runs that leg's suite under ``-X dev`` with
``PYTHONMALLOC=debug`` (children inherit the debug allocator).  Legs run
``--jobs`` at a time (default 1); their logs go to ``--logdir``.
``--conformance-legs`` limits the conformance run to some legs (CI: 3.14, the
one with every module; ``.ci/run --full``: all), ``--conformance-jobs`` is
run.py's ``--jobs`` (modules at a time within a leg).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                     "tideloop-matrix")

LEGS = ["3.11", "3.12", "3.13.0", "3.13", "3.14", "3.15", "3.13t"]
# Left out of the suite on legs not in --whole-suite-legs.
LONG_TEST_DIRS = ("stress", "ecosystem")
INSTALL_LOCK = threading.Lock()


def log(msg):
    print(f"[matrix {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pyenv_python(version):
    try:
        prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    py = os.path.join(prefix, "bin", "python3")
    return py if os.path.exists(py) else None


def last_line(cmd, logf):
    """Run a builder script; its last stdout line is the interpreter."""
    with open(logf, "a") as f:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True)
    if p.returncode != 0:
        return None
    lines = p.stdout.strip().splitlines()
    return lines[-1] if lines else None


def find_interpreter(leg, logdir):
    blog = os.path.join(logdir, f"build-{leg}.log")
    if leg == "3.11":
        return os.environ.get("PYTHON") or shutil.which("python3")
    if leg == "3.12":
        return pyenv_python("3.12.1") or last_line(
            ["bash", os.path.join(HERE, "build_python.sh"), "3.12"], blog)
    if leg == "3.13.0":
        return pyenv_python("3.13.0") or last_line(
            ["bash", os.path.join(HERE, "build_python.sh"), "3.13.0"], blog)
    if leg == "3.13":
        return last_line(["bash", os.path.join(HERE, "build_python.sh"), "3.13"], blog)
    if leg == "3.13t":
        return last_line(["bash", os.path.join(HERE, "build_python.sh"), "3.13",
                          "--disable-gil"], blog)
    if leg in ("3.14", "3.15"):
        return last_line(["bash", os.path.join(HERE, "python_from_debian.sh"), leg], blog)
    raise ValueError(leg)


# What a failed step's log says failed: pytest's short summary lines, the
# conformance run's regressions, a crash.
FAILURE_LINE = re.compile(r"^(FAILED |ERROR |REGRESSION|regression|.*Fatal Python error|"
                          r".*Segmentation fault|.*\[matrix\] timed out)")


def failure_lines(logf, offset, limit=25):
    """The lines of logf past offset that name what failed (at most limit)."""
    with open(logf, errors="replace") as f:
        f.seek(offset)
        found = [ln.rstrip() for ln in f if FAILURE_LINE.match(ln)]
    return found[:limit] + ([f"... and {len(found) - limit} more"] if len(found) > limit else [])


def run(cmd, logf, env=None, cwd=REPO, timeout=None):
    with open(logf, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                               cwd=cwd, timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f"\n[matrix] timed out after {timeout} s\n")
            return 124
    return p.returncode


def pytest_counts(logf):
    """The last pytest summary line's counts, e.g. {'passed': 1600, ...}."""
    text = open(logf, errors="replace").read()
    lines = [ln for ln in text.splitlines()
             if re.search(r"\d+ (passed|failed)", ln) and " in " in ln]
    if not lines:
        return {}
    return {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", lines[-1])}


def run_leg(leg, args):
    logdir = args.logdir
    logf = os.path.join(logdir, f"{leg}.log")
    open(logf, "w").close()
    res = {"leg": leg, "ok": False, "steps": {}}
    t0 = time.monotonic()
    py = find_interpreter(leg, logdir)
    if not py:
        res["error"] = "interpreter not found and could not be built"
        return res
    version = subprocess.run([py, "-c", "import sys; print(sys.version.split()[0] + "
                              "('t' if not getattr(sys, '_is_gil_enabled', lambda: True)() "
                              "else ''))"], capture_output=True, text=True).stdout.strip()
    res["python"] = version
    res["executable"] = py
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(TIDELOOP_DEV="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_PREFER_BINARY="1")
    env.pop("PYTHON_GIL", None)     # free-threaded legs: the GIL stays off
    # A directory of this run's own: two runs at once (two checkouts' CI on
    # one machine) must not share a leg's venv.  Removed when the leg passes.
    venv = tempfile.mkdtemp(prefix=f"venv-{leg}-", dir=CACHE)
    try:
        res.update(leg_steps(leg, args, py, env, venv, logf))
    finally:
        if res["ok"]:
            shutil.rmtree(venv, ignore_errors=True)
        else:
            log(f"{leg}: venv kept in {venv}")
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def leg_steps(leg, args, py, env, venv, logf):
    """The leg's steps in its fresh venv: {"ok", "steps", "pytest", "conformance"}."""
    logdir = args.logdir
    res = {"ok": False, "steps": {}}
    steps = res["steps"]

    def step(name, cmd, **kw):
        t = time.monotonic()
        offset = os.path.getsize(logf)
        rc = run(cmd, logf, env=kw.pop("env", env), **kw)
        steps[name] = {"rc": rc, "seconds": round(time.monotonic() - t, 1)}
        log(f"{leg}: {name}: {'ok' if rc == 0 else f'FAILED (rc {rc})'} "
            f"({steps[name]['seconds']} s)")
        if rc != 0:
            for line in failure_lines(logf, offset):
                log(f"{leg}:   {line}")
        return rc == 0

    vpy = os.path.join(venv, "bin", "python")
    ok = step("venv", [py, "-m", "venv", venv])
    # One install at a time: pip builds in the checkout, and concurrent
    # builds would share src/tideloop.egg-info.  --prefer-binary: a newer
    # release without a wheel for this interpreter (3.13t has none of
    # matplotlib 3.11.2's, nor of hypothesis's compiled core from 6.156)
    # would be built from its sdist, which needs the network; an older
    # release's wheel is taken instead.
    with INSTALL_LOCK:
        ok = ok and step("install", [vpy, "-m", "pip", "install", "-q", "--prefer-binary",
                                     ".[test]"])
    ok = (ok and
          step("import -W error", [vpy, "-W", "error", "-c",
                                   "import sys, tideloop, tideloop._core as c; "
                                   "print(tideloop.__file__, dict(c.compat)); "
                                   "gil = getattr(sys, '_is_gil_enabled', lambda: None)(); "
                                   "sys.exit('the GIL is on after import tideloop' "
                                   "if gil and c.compat['free_threading'] != 'gil-build' else 0)"],
               cwd=tempfile.gettempdir()))
    if ok:
        cmd = [vpy]
        test_env = dict(env)
        if leg == args.dev_mode:
            cmd += ["-X", "dev"]
            test_env["PYTHONMALLOC"] = "debug"
            # slower: time limits and timer grids doubled (loop_helpers.SLOW)
            test_env["TIDELOOP_TEST_SLOW"] = "2"
        # (the repository's tooling tests are the same on every interpreter:
        # the 3.11 stage runs them)
        cmd += ["-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
                "--ignore=tests/tooling/test_packaging.py", "-m", "not checkout"]
        if leg not in args.whole_suite_legs:
            # the stress scenarios and the frameworks in real processes: a
            # third of the suite's time; run on the other legs
            cmd += [f"--ignore=tests/{d}" for d in LONG_TEST_DIRS]
        if args.test_workers > 1:
            cmd += ["-n", str(args.test_workers)]
        ok_tests = step("suite" + (" (-X dev, debug allocator)" if leg == args.dev_mode else ""),
                        cmd, env=test_env)
        res["pytest"] = pytest_counts(logf)
        ok = ok_tests
        def conformance(title, name, *extra):
            """One conformance run: (its verdict, its summary or None)."""
            cj = os.path.join(logdir, f"{name}-{leg}.json")
            passed = step(title, [vpy, "tests/conformance/run.py", *extra, "--loop", "both",
                                  "--strict", "--known", "tests/conformance/known_failures.txt",
                                  "--jobs", str(args.conformance_jobs), "--json", cj])
            try:
                with open(cj) as f:
                    return passed, summarize_conformance(json.load(f))
            except (OSError, ValueError):
                return False, None

        if not args.no_conformance and leg in args.conformance_legs:
            ok_conf, res["conformance"] = conformance("conformance", "conformance")
            ok = ok and ok_conf
        if leg in args.subinterpreter_legs:
            sj = os.path.join(logdir, f"subinterpreter-suite-{leg}.json")
            ok_si = step("suite in a subinterpreter",
                         [vpy, "tests/interpreters/run_suite.py", "--known",
                          "tests/interpreters/known_failures.txt", "--json", sj])
            res["subinterpreter_suite"] = summarize_subinterpreter_suite(sj)
            ok = ok and ok_si and res["subinterpreter_suite"] is not None
        if not args.no_conformance and leg in args.subinterpreter_conformance_legs:
            ok_sc, res["subinterpreter_conformance"] = conformance(
                "conformance in a subinterpreter", "conformance-subinterpreter",
                "--subinterpreter")
            ok = ok and ok_sc
        if leg in args.portable_legs:
            pj = os.path.join(logdir, f"portable-{leg}.json")
            ok_p = step("portable mode" + (" (all)" if args.portable_all else ""),
                        [vpy, "tests/portable.py", "--jobs", str(max(args.test_workers, 1)),
                         "--json", pj] + (["--all"] if args.portable_all else []))
            try:
                with open(pj) as f:
                    res["portable"] = json.load(f)
            except (OSError, ValueError):
                res["portable"] = None
            ok = ok and ok_p and res["portable"] is not None
    res["ok"] = ok
    return res


def summarize_subinterpreter_suite(path):
    """Passed per param and the regressions, from run_suite.py's --json."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    counts = data.get("counts", {})
    return {"asyncio_passed": counts.get("asyncio", {}).get("passed", 0),
            "tideloop_passed": counts.get("tideloop", {}).get("passed", 0),
            "regressions": len(data.get("regressions", [])) +
                           len(data.get("unpaired_failures", [])),
            "incidents": len(data.get("incidents", [])),
            "files": len(data.get("files", []))}


def summarize_conformance(data):
    """Totals per side and the regression count, from run.py's --json."""
    totals, regressions = {}, 0
    for d in data.get("modules", {}).values():
        for side in ("stock", "tideloop"):
            c = (d.get(side) or {}).get("counts") or {}
            t = totals.setdefault(side, {})
            for k, v in c.items():
                t[k] = t.get(k, 0) + v
        regressions += len(d.get("regressions", []))
    return {"totals": totals, "regressions": regressions,
            "modules": len(data.get("modules", {}))}


def recorded_leg(leg, pytest_log, conformance_json, seconds, portable_json=None):
    """A leg that ran outside the matrix (CI's 3.11 stage: the README's test
    command, on the interpreter running this script), as a result record."""
    ft = not getattr(sys, "_is_gil_enabled", lambda: True)()
    res = {"leg": leg, "python": sys.version.split()[0] + ("t" if ft else ""),
           "executable": sys.executable, "steps": {}, "recorded": True,
           "pytest": pytest_counts(pytest_log), "seconds": seconds}
    ok = bool(res["pytest"].get("passed")) and not any(
        res["pytest"].get(k) for k in ("failed", "error", "errors"))
    res["steps"]["suite"] = {"rc": 0 if ok else 1}
    if conformance_json:
        try:
            with open(conformance_json) as f:
                res["conformance"] = summarize_conformance(json.load(f))
        except (OSError, ValueError):
            res["conformance"] = None
        c = res["conformance"] or {}
        conf_ok = c.get("regressions") == 0 and bool(c.get("modules"))
        res["steps"]["conformance"] = {"rc": 0 if conf_ok else 1}
        ok = ok and conf_ok
    if portable_json:
        try:
            with open(portable_json) as f:
                res["portable"] = json.load(f)
        except (OSError, ValueError):
            res["portable"] = None
        ok = ok and bool((res["portable"] or {}).get("ok"))
    res["ok"] = ok
    return res


def _subinterpreter_cell(r):
    """The isolated-interpreter column: the suite's and the conformance's
    passed on asyncio/tideloop, with their regressions; - where not run."""
    parts = []
    si = r.get("subinterpreter_suite")
    if si:
        parts.append("suite {}/{}, {} regr.".format(si["asyncio_passed"], si["tideloop_passed"],
                                                    si["regressions"] + si["incidents"]))
    sc = r.get("subinterpreter_conformance")
    if sc:
        tot = sc.get("totals") or {}
        parts.append("conformance {}/{}, {} regr.".format(
            tot.get("stock", {}).get("passed", "-"), tot.get("tideloop", {}).get("passed", "-"),
            sc.get("regressions", "-")))
    return "; ".join(parts) or "-"


def _portable_cell(r):
    """The portable mode's column: its verdict and what it ran; - where not run."""
    p = r.get("portable")
    if not p:
        return "-"
    what = "whole suite and conformance" if p.get("scope") == "all" else "registry's tests"
    return "{} ({})".format("ok" if p.get("ok") else "FAILED", what)


def markdown_report(results):
    """The README's "Supported versions" table, from a --json file."""
    lines = ["| leg | interpreter | build, import -W error | behavioural suite "
             "(passed / failed / skipped / xfailed) | conformance: stock passed | "
             "tideloop passed | regressions | in an isolated interpreter "
             "(passed asyncio/tideloop) | portable mode | result |",
             "|:---|:---|:---|:---|---:|---:|---:|:---|:---|:---|"]
    for r in results:
        pc = r.get("pytest", {})
        c = r.get("conformance") or {}
        tot = c.get("totals") or {}
        steps = r.get("steps", {})
        built = r.get("recorded") or all(steps.get(k, {}).get("rc") == 0
                                         for k in ("venv", "install", "import -W error"))
        suite = "{} / {} / {} / {}".format(
            pc.get("passed", 0), pc.get("failed", 0) + pc.get("error", 0) + pc.get("errors", 0),
            pc.get("skipped", 0), pc.get("xfailed", 0))
        dev = " (-X dev, debug allocator)" if any("-X dev" in k for k in steps) else ""
        lines.append("| {} | {} | {} | {}{} | {} | {} | {} | {} | {} | {} |".format(
            r["leg"], r.get("python", "?"), "ok" if built else "FAILED", suite, dev,
            tot.get("stock", {}).get("passed", "-"), tot.get("tideloop", {}).get("passed", "-"),
            c.get("regressions", "-"), _subinterpreter_cell(r), _portable_cell(r),
            "ok" if r.get("ok") else "FAILED"))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(LEGS),
                    help="comma-separated legs (default: all: %(default)s)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--logdir", default=None)
    ap.add_argument("--dev-mode", default=None, metavar="LEG")
    ap.add_argument("--no-conformance", action="store_true")
    ap.add_argument("--conformance-legs", default=None, metavar="LEGS",
                    help="comma-separated legs that run the conformance tests "
                         "(default: every leg)")
    ap.add_argument("--conformance-jobs", type=int, default=1, metavar="N",
                    help="tests/conformance/run.py --jobs (default %(default)s)")
    ap.add_argument("--subinterpreter-legs", default="", metavar="LEGS",
                    help="comma-separated legs (3.12+) that also run the behavioural subset "
                         "inside an isolated subinterpreter (default: none)")
    ap.add_argument("--subinterpreter-conformance-legs", default="", metavar="LEGS",
                    help="comma-separated legs (3.12+) that also run the conformance tests "
                         "inside an isolated subinterpreter (default: none)")
    ap.add_argument("--whole-suite-legs", default=None, metavar="LEGS",
                    help="legs whose suite includes tests/stress and tests/ecosystem "
                         "(default: every leg)")
    ap.add_argument("--portable-legs", default="", metavar="LEGS",
                    help="comma-separated legs that also run tests/portable.py "
                         "(TIDELOOP_PORTABLE=1; default: none)")
    ap.add_argument("--portable-all", action="store_true",
                    help="the portable run takes the whole suite and conformance run")
    ap.add_argument("--test-workers", type=int, default=2, metavar="N",
                    help="pytest-xdist workers for each leg's suite (1: no xdist; "
                         "default %(default)s: the suite mostly waits on timers and children)")
    ap.add_argument("--include", metavar="JSON", action="append", default=[],
                    help="results of legs run elsewhere (--record-leg), put first in --json")
    ap.add_argument("--record-leg", metavar="LEG",
                    help="write (--json) the record of LEG run outside the matrix on this "
                         "interpreter, from --pytest-log and --conformance-json, and exit "
                         "(status 1 unless it passed)")
    ap.add_argument("--pytest-log", metavar="LOG")
    ap.add_argument("--conformance-json", metavar="JSON")
    ap.add_argument("--portable-json", metavar="JSON", help="tests/portable.py --json")
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--report", metavar="JSON",
                    help="print the markdown table of a --json file and exit "
                         "(status 1 unless every leg passed)")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            results = json.load(f)
        print(markdown_report(results))
        return 0 if results and all(r["ok"] for r in results) else 1
    if args.record_leg:
        if not (args.pytest_log and args.json):
            ap.error("--record-leg needs --pytest-log and --json")
        rec = recorded_leg(args.record_leg, args.pytest_log, args.conformance_json,
                           args.seconds, args.portable_json)
        with open(args.json, "w") as f:
            json.dump([rec], f, indent=1)
        return 0 if rec["ok"] else 1
    included = []
    for path in args.include:
        with open(path) as f:
            included += json.load(f)
    legs = [x.strip() for x in args.only.split(",") if x.strip()]
    for leg in legs:
        if leg not in LEGS:
            ap.error(f"unknown leg {leg!r} (known: {', '.join(LEGS)})")
    args.conformance_legs = legs if args.conformance_legs is None else [
        x.strip() for x in args.conformance_legs.split(",") if x.strip()]
    for leg in args.conformance_legs:
        if leg not in legs:
            ap.error(f"--conformance-legs: {leg!r} is not among the legs run ({', '.join(legs)})")
    args.whole_suite_legs = legs if args.whole_suite_legs is None else [
        x.strip() for x in args.whole_suite_legs.split(",") if x.strip()]
    args.portable_legs = [x.strip() for x in args.portable_legs.split(",") if x.strip()]
    for opt in ("whole_suite_legs", "portable_legs"):
        for leg in getattr(args, opt):
            if leg not in legs:
                ap.error(f"--{opt.replace('_', '-')}: {leg!r} is not among the legs run "
                         f"({', '.join(legs)})")
    for opt in ("subinterpreter_legs", "subinterpreter_conformance_legs"):
        chosen = [x.strip() for x in getattr(args, opt).split(",") if x.strip()]
        for leg in chosen:
            if leg not in legs or leg == "3.11":
                ap.error(f"--{opt.replace('_', '-')}: {leg!r} is not among the legs run "
                         f"with subinterpreters ({', '.join(legs)})")
        setattr(args, opt, chosen)
    args.logdir = args.logdir or tempfile.mkdtemp(prefix="tideloop-matrix-")
    os.makedirs(args.logdir, exist_ok=True)
    os.makedirs(CACHE, exist_ok=True)
    log(f"legs {legs}, {args.jobs} at a time, logs in {args.logdir}")
    t0 = time.monotonic()
    # The longest legs start first (conformance; the free-threaded build,
    # whose gc.collect() walks every object; -X dev), so that the last one to
    # finish does not run alone; results stay in --only's order.
    def weight(leg):
        return (not args.no_conformance and leg in args.conformance_legs,
                leg.endswith("t"), leg in args.subinterpreter_conformance_legs,
                leg == args.dev_mode)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        futures = {leg: ex.submit(run_leg, leg, args)
                   for leg in sorted(legs, key=weight, reverse=True)}
        results = included + [futures[leg].result() for leg in legs]
    print()
    print(f"{'leg':<7} {'python':<10} {'result':<7} {'suite p/f/s':<16} "
          f"{'conformance stock/tideloop passed':<34} {'regr':<5} {'min':>5}")
    for r in results:
        c = r.get("conformance") or {}
        tot = c.get("totals") or {}
        st, tl = tot.get("stock", {}), tot.get("tideloop", {})
        pc = r.get("pytest", {})
        print(f"{r['leg']:<7} {r.get('python', '?'):<10} {'ok' if r['ok'] else 'FAIL':<7} "
              f"{pc.get('passed', 0)}/{pc.get('failed', 0) + pc.get('error', 0) + pc.get('errors', 0)}/"
              f"{pc.get('skipped', 0):<10} "
              f"{str(st.get('passed', '-')) + '/' + str(tl.get('passed', '-')):<34} "
              f"{str(c.get('regressions', '-')):<5} {r.get('seconds', 0) / 60:>5.1f}")
        if r.get("error"):
            print(f"        {r['error']}")
    print(f"\nmatrix: {time.monotonic() - t0:.0f} s; logs in {args.logdir}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
