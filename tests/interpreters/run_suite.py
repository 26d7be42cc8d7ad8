#!/usr/bin/env python3
"""Run the loop/net behavioural tests inside an isolated subinterpreter, on
both loops, and compare the params test by test.

    python tests/interpreters/run_suite.py [FILE ...] [--all] [--json OUT]
        [--jobs N] [--chunk-files N] [--test-timeout S] [--strict] [-v]
        [--known FILE] [--workdir DIR] [-- PYTEST_ARGS ...]

FILE: test files relative to the checkout (the same list for every
interpreter); default: DEFAULT_FILES, a subset covering every transport and
the loop's main APIs (80-100 s on a 2-core machine); --all: every file of
tests/loop, tests/net and tests/pipes (110-135 s).

The files go in chunks of --chunk-files (default 4); each chunk runs in a
fresh child process (this file with --child), whose main interpreter makes
an isolated subinterpreter (its own GIL, multi-phase-init extensions only)
and runs pytest.main() in it, with plugin autoload off, no faulthandler and
no cacheprovider (neither loads there).  Results come back through a file of
JSON lines written by the plugin tests/interpreters/si_report.py: objects
cannot cross interpreters.

The child starts with SIGINT's default disposition (a subinterpreter can
give its own children neither preexec_fn nor signal.signal, so the tests
that Ctrl-C a child rely on that).  There is no SIGALRM watchdog in a
subinterpreter: a test (or collection, or teardown) that goes --test-timeout
seconds without an event is a hang, and its child is killed.  A child that
dies of a signal is a crash, reported with its signal and the test that was
running; after a crash or a hang the chunk goes on in a new child without the
tests already done (up to --max-restarts times).

Report: per test id (the id without its loop parameter) the outcome on each
param (asyncio, tideloop, tideloop-openssl, ...), printed for every test not
passed on all of them (-v: every test); then the verdict:
  regressions            the asyncio param passes, a tideloop param does not
  unpaired failures      a test with one param only (tideloop-only API) fails
  failing on both params listed by cause (the asyncio param's message)
  asyncio param fails    ... where tideloop passes (stock's own trouble)
  main interpreter only  skips with the reasons
  crashes and hangs      per chunk: signal, test
and how long each stage took.  --json OUT writes all of it.

Exit status 1 on a regression, an unpaired failure, a crash, a hang, a file
that did not collect or a chunk that did not finish; with --strict also on a
test failing on both params.  2: this interpreter has no subinterpreters.
--known FILE (tests/interpreters/known_failures.txt): regressions and
unpaired failures of the tests listed there (one test id a line, "*" for
any text, "# reason" after it: a tideloop bug known and tracked) are
reported as known and do not fail the run; a listed test that no longer
fails does (the list must shrink when the bug is fixed).

On 3.12 the child leaves with os._exit() once the subinterpreter is
destroyed and the results are written: 3.12.1's main-interpreter
finalization aborts ("free(): invalid pointer" in _PyTuple_Fini) after any
isolated subinterpreter imported _asyncio, tideloop or not (CPython
gh-112140).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DIRS = ("tests/loop", "tests/net", "tests/pipes")

# Every transport (TCP, Unix, UDP, pipes, subprocesses, TLS), asyncio streams,
# sock_*, servers, executors, timers, scheduling, readers/writers, threadsafe,
# tasks/futures, lifecycle, exceptions, the diagnostics, signals and fork (main
# interpreter only but for the argument checks: their skips are reported).
# About three quarters of --all's time (--all: 111-135 s on 3.12-3.15 on a
# 2-core machine).  Left to --all: files whose tests mostly run in child
# processes (test_diag_planted, test_debug), hypothesis (test_model) and the
# transports' finer points (test_tcp_buffered, _context, _faults,
# _flow_control, _large, test_sendfile, test_udp_sendto_forms, ...).
DEFAULT_FILES = [
    "tests/loop/test_scheduling.py",
    "tests/loop/test_timers.py",
    "tests/loop/test_readers_writers.py",
    "tests/loop/test_threadsafe.py",
    "tests/loop/test_tasks_futures.py",
    "tests/loop/test_executor.py",
    "tests/loop/test_lifecycle.py",
    "tests/loop/test_exceptions.py",
    "tests/loop/test_signals.py",
    "tests/loop/test_fork.py",
    "tests/loop/test_diagnostics.py",
    "tests/loop/test_diagnostics_live.py",
    "tests/loop/test_diagnostics_otel.py",
    "tests/loop/test_diagnostics_tasks.py",
    "tests/net/test_tcp_transport.py",
    "tests/net/test_tcp_connect.py",
    "tests/net/test_unix_server.py",
    "tests/net/test_udp.py",
    "tests/net/test_server.py",
    "tests/net/test_sock_ops.py",
    "tests/net/test_streams.py",
    "tests/net/test_streams_c.py",
    "tests/net/test_tls.py",
    "tests/net/test_tls_close.py",
    "tests/net/test_tls_faults.py",
    "tests/net/test_tls_flow.py",
    "tests/net/test_tls_leaks.py",
    "tests/net/test_tls_routes.py",
    "tests/net/test_tls_setup.py",
    "tests/net/test_tls_verify.py",
    "tests/pipes/test_pipes.py",
    "tests/pipes/test_subprocess.py",
]

PASS = {"passed", "xpassed"}
FAIL = {"failed", "crash", "hang", "missing"}
MAIN_ONLY = "main interpreter only: "


# ---------------------------------------------------------------- the child

_SUBINTERP_CODE = """\
import os, sys
os.chdir({root!r})
sys.path.insert(0, {root!r})
sys.argv = ["pytest"]
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"   # hypothesis's plugin does not load here
import pytest
pytest.main({args!r})
"""


def _subinterpreters():
    """The low-level module: 3.13+'s _interpreters, 3.12's _xxsubinterpreters;
    None before 3.12 (3.11's cannot make an isolated interpreter)."""
    if sys.version_info < (3, 12):
        return None
    try:
        import _interpreters as m
    except ImportError:
        import _xxsubinterpreters as m
    return m


def child_main(spec_path):
    spec = json.loads(Path(spec_path).read_text())
    fd = os.open(spec["events"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(**event):
        event["t"] = time.time()
        os.write(fd, (json.dumps(event) + "\n").encode())

    import faulthandler     # the main interpreter's: a crash shows its traceback
    faulthandler.enable(all_threads=True)
    m = _subinterpreters()
    if hasattr(m, "new_config"):        # 3.13+
        interp = m.create("isolated")
        cfg = m.get_config(interp)
        config = {"gil": cfg.gil, "check_multi_interp_extensions":
                  cfg.check_multi_interp_extensions, "allow_fork": cfg.allow_fork}
    else:
        interp = m.create(isolated=True)
        config = {"gil": "own", "check_multi_interp_extensions": True}
    emit(event="interp_created", config=config)
    code = _SUBINTERP_CODE.format(root=str(ROOT), args=spec["pytest_args"])
    error = None
    if hasattr(m, "exec"):
        info = m.exec(interp, code)
        if info is not None:
            error = getattr(info, "errdisplay", None) or getattr(info, "formatted", str(info))
    else:
        try:
            m.run_string(interp, code)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    emit(event="exec_done", error=error)
    m.destroy(interp)
    emit(event="destroyed")
    sys.stdout.flush()
    sys.stderr.flush()
    rc = 3 if error else 0
    if sys.version_info < (3, 13):
        os._exit(rc)        # gh-112140: see the module's docstring
    return rc


# ---------------------------------------------------------------- the runner

def _sigint_default():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signame(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _tideloop_root():
    sys.path.insert(0, str(TESTS))
    try:
        from loop_helpers import _tideloop_root as root
    finally:
        sys.path.remove(str(TESTS))
    return str(root())


class Chunk:
    def __init__(self, index, files):
        self.index = index
        self.files = files
        self.items = {}         # nodeid -> {side, key, variant}
        self.results = {}       # nodeid -> {outcome, message, duration}
        self.collect_errors = []
        self.collect_skips = []
        self.incidents = []     # crashes and hangs
        self.problems = []      # a child that did not finish for another reason
        self.stages = Counter()
        self.attempts = 0
        self.wall = 0.0
        self.config = None
        self.main_interpreter = None


def _read_events(path, pos):
    """New whole lines of the events file since byte pos."""
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except FileNotFoundError:
        return [], pos
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], pos + end


def run_chunk(chunk, args, workdir, env, log):
    t_chunk = time.monotonic()
    cdir = workdir / f"chunk{chunk.index:02d}"
    cdir.mkdir(parents=True, exist_ok=True)
    done = set()
    while True:
        chunk.attempts += 1
        attempt = chunk.attempts
        events_path = cdir / f"events{attempt}.jsonl"
        deselect_path = cdir / f"deselect{attempt}.json"
        deselect_path.write_text(json.dumps(sorted(done)))
        # (--continue-on-collection-errors: a file that does not collect is
        # reported, the chunk's other files still run)
        pytest_args = [*chunk.files, "-p", "tests.interpreters.si_report",
                       "--continue-on-collection-errors",
                       "-p", "no:cacheprovider", "-p", "no:faulthandler", "-q",
                       *args.pytest_args]
        spec = cdir / f"spec{attempt}.json"
        spec.write_text(json.dumps({"events": str(events_path), "pytest_args": pytest_args}))
        # (TMPDIR stays: a longer one makes the tests' Unix socket paths too long)
        cenv = dict(env, TIDELOOP_SI_EVENTS=str(events_path),
                    TIDELOOP_SI_DESELECT=str(deselect_path))
        out_path = cdir / f"output{attempt}.txt"
        t0 = time.time()
        with open(out_path, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child",
                                     str(spec)], cwd=ROOT, env=cenv, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_sigint_default, start_new_session=True)
        pos, last, current, hang = 0, time.monotonic(), None, False
        marks = {"spawn": t0}
        while True:
            rc = proc.poll()
            events, pos = _read_events(events_path, pos)
            for ev in events:
                last = time.monotonic()
                kind = ev["event"]
                marks.setdefault(kind, ev["t"])
                if kind == "interp_created":
                    chunk.config = ev["config"]
                elif kind == "session":
                    chunk.main_interpreter = ev["main_interpreter"]
                elif kind == "item":
                    chunk.items[ev["nodeid"]] = {k: ev[k] for k in ("side", "key", "variant")}
                elif kind == "collect_error":
                    chunk.collect_errors.append({"nodeid": ev["nodeid"], "message": ev["message"]})
                elif kind == "collect_skip":
                    chunk.collect_skips.append({"file": ev["nodeid"], "reason": ev["message"]})
                elif kind == "start":
                    current = ev["nodeid"]
                elif kind == "result":
                    chunk.results[ev["nodeid"]] = {k: ev[k] for k in ("outcome", "message",
                                                                       "duration")}
                    done.add(ev["nodeid"])
                    current = None
                elif kind == "finish":
                    marks["finish"] = ev["t"]
                    current = None
                elif kind == "exec_done" and ev["error"]:
                    chunk.problems.append(f"attempt {attempt}: pytest.main raised in the "
                                          f"subinterpreter:\n{ev['error']}")
            if rc is not None:
                break
            if time.monotonic() - last > args.test_timeout:
                hang = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = proc.returncode
                events, pos = _read_events(events_path, pos)   # (none after SIGKILL)
                break
            time.sleep(0.1)
        marks["exit"] = time.time()
        # the stages of this attempt (wall clock, all chunks added up)
        order = [("spawn", "interp_created", "child start + isolated interpreter"),
                 ("interp_created", "session", "pytest import + configure"),
                 ("session", "collected", "collection"),
                 ("collected", "finish", "tests"),
                 ("finish", "exec_done", "pytest teardown"),
                 ("exec_done", "destroyed", "subinterpreter destroy"),
                 ("destroyed", "exit", "child exit")]
        for a, b, name in order:
            if a in marks and b in marks:
                chunk.stages[name] += marks[b] - marks[a]
        tail = out_path.read_text(errors="replace")[-3000:]
        finished = "destroyed" in marks
        if hang or (rc is not None and rc < 0) or not finished:
            if hang:
                what, sig = "hang", None
                detail = f"no progress for {args.test_timeout:.0f} s; killed"
            elif rc < 0:
                what, sig = "crash", _signame(-rc)
                detail = f"killed by {sig}"
            else:
                what, sig = "crash", None
                detail = f"exit status {rc} before the subinterpreter was destroyed"
            phase = ("during a test" if current else
                     "before the session" if "session" not in marks else
                     "during collection" if "collected" not in marks else
                     "after the tests, in pytest's teardown" if "exec_done" not in marks else
                     "while the subinterpreter was destroyed" if "destroyed" not in marks else
                     "at the child's exit" if "finish" in marks else "between tests")
            chunk.incidents.append({"kind": what, "signal": sig, "test": current,
                                    "phase": phase, "detail": detail, "attempt": attempt,
                                    "files": chunk.files, "output_tail": tail})
            log(f"chunk {chunk.index}: {what} ({detail}) {phase}"
                + (f": {current}" if current else ""))
            if current:
                chunk.results[current] = {"outcome": what, "message": detail, "duration": None}
                done.add(current)
            if current and attempt <= args.max_restarts and "finish" not in marks:
                continue        # go on with the tests not done yet
        elif rc != 0:
            chunk.problems.append(f"attempt {attempt}: child exit status {rc}:\n{tail}")
        break
    for nodeid in chunk.items:
        chunk.results.setdefault(nodeid, {"outcome": "missing",
                                          "message": "collected but never reported",
                                          "duration": None})
    chunk.wall = time.monotonic() - t_chunk
    return chunk


def _norm(message):
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    first = re.sub(r"0x[0-9a-fA-F]+", "0x…", first)
    first = re.sub(r"\b\d{4,}\b", "N", first)
    return first[:240]


def build_report(chunks, files, wall, stages):
    tests = {}
    for chunk in chunks:
        for nodeid, res in chunk.results.items():
            info = chunk.items.get(nodeid) or {"side": None, "key": nodeid, "variant": None}
            variant = info["variant"] or info["side"] or "(no loop param)"
            t = tests.setdefault(info["key"], {"file": nodeid.split("::")[0], "params": {}})
            t["params"][variant] = dict(res, side=info["side"], nodeid=nodeid)
    counts = {side: Counter() for side in ("asyncio", "tideloop", "(no loop param)")}
    regressions, unpaired, both, stock_only, main_only = [], [], defaultdict(list), [], Counter()
    other_skips = Counter()
    for key, t in sorted(tests.items()):
        params = t["params"]
        for variant, r in params.items():
            side = r["side"] or "(no loop param)"
            counts[side][r["outcome"]] += 1
            if r["outcome"] == "skipped":
                if r["message"].startswith(MAIN_ONLY):
                    main_only[r["message"][len(MAIN_ONLY):]] += 1
                else:
                    other_skips[r["message"]] += 1
        stock = params.get("asyncio")
        tide = {v: r for v, r in params.items() if r["side"] == "tideloop"}
        if stock is None or not tide:
            bad = {v: r for v, r in params.items() if r["outcome"] in FAIL}
            if bad:
                unpaired.append({"test": key, "params": {v: r["outcome"] for v, r in bad.items()},
                                 "message": next(iter(bad.values()))["message"]})
            continue
        not_passed = {v: r for v, r in tide.items() if r["outcome"] not in PASS}
        if stock["outcome"] in PASS and not_passed:
            regressions.append({"test": key,
                                "params": {v: r["outcome"] for v, r in params.items()},
                                "message": next(iter(not_passed.values()))["message"]})
        elif stock["outcome"] in FAIL:
            failing = [v for v, r in tide.items() if r["outcome"] in FAIL]
            if failing:
                both[_norm(stock["message"])].append(key)
            elif all(r["outcome"] in PASS for r in tide.values()):
                stock_only.append({"test": key, "message": _norm(stock["message"])})
    incidents = [dict(i, chunk=c.index) for c in chunks for i in c.incidents]
    collect_errors = [e for c in chunks for e in c.collect_errors]
    skipped_files = [e for c in chunks for e in c.collect_skips]
    problems = [p for c in chunks for p in c.problems]
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "files": files,
        "interpreter": {"isolated_config": next((c.config for c in chunks if c.config), None),
                        "main_interpreter": sorted({str(c.main_interpreter) for c in chunks})},
        "counts": {side: dict(c) for side, c in counts.items() if c},
        "tests": tests,
        "regressions": regressions,
        "unpaired_failures": unpaired,
        "failing_on_both": {cause: keys for cause, keys in sorted(both.items())},
        "failing_on_asyncio_only": stock_only,
        "main_interpreter_only": dict(main_only),
        "other_skips": dict(other_skips),
        "skipped_files": skipped_files,
        "incidents": incidents,
        "collect_errors": collect_errors,
        "problems": problems,
        "timing": {"wall": round(wall, 2), "stages": {k: round(v, 2) for k, v in stages.items()},
                   "chunks": [{"chunk": c.index, "files": c.files, "wall": round(c.wall, 2),
                               "attempts": c.attempts,
                               "stages": {k: round(v, 2) for k, v in c.stages.items()}}
                              for c in chunks]},
    }


def print_report(rep, verbose, out=sys.stdout):
    def p(*a):
        print(*a, file=out)

    p(f"\n== per test: outcome on each param (python {rep['python']}, isolated subinterpreter"
      f" {rep['interpreter']['isolated_config']}, main_interpreter seen by the tests:"
      f" {', '.join(rep['interpreter']['main_interpreter'])}) ==")
    for key, t in sorted(rep["tests"].items()):
        params = t["params"]
        if verbose or any(r["outcome"] not in PASS for r in params.values()):
            shown = "  ".join(f"{v}={r['outcome']}" for v, r in sorted(params.items()))
            p(f"{key}  {shown}")
    p("\n== counts per side (each param of a test counts once) ==")
    for side, c in rep["counts"].items():
        p(f"  {side:16s} " + ", ".join(f"{n} {o}" for o, n in sorted(c.items())))
    p("\n== verdict ==")
    p(f"regressions (asyncio param passes, a tideloop param does not): {len(rep['regressions'])}")
    for r in rep["regressions"]:
        p(f"  {r['test']}  {r['params']}\n      {_norm(r['message'])}")
    p(f"unpaired tests (one loop param only) failing: {len(rep['unpaired_failures'])}")
    for r in rep["unpaired_failures"]:
        p(f"  {r['test']}  {r['params']}\n      {_norm(r['message'])}")
    if "known" in rep:
        p(f"known (listed in --known, not counted): {len(rep['known'])}")
        for r in rep["known"]:
            p(f"  {r['test']}  {r['params']}\n      {_norm(r['message'])}\n"
              f"      known: {r['reason']}")
        if rep["stale_known"]:
            p(f"listed in --known but not failing (remove them): {len(rep['stale_known'])}")
            for k in rep["stale_known"]:
                p(f"  {k}")
    nboth = sum(len(v) for v in rep["failing_on_both"].values())
    p(f"failing on both params: {nboth}")
    for cause, keys in rep["failing_on_both"].items():
        p(f"  [{len(keys)}] {cause}")
        for k in keys:
            p(f"        {k}")
    p(f"failing on the asyncio param only: {len(rep['failing_on_asyncio_only'])}")
    for r in rep["failing_on_asyncio_only"]:
        p(f"  {r['test']}\n      {r['message']}")
    p(f"skipped as main interpreter only: {sum(rep['main_interpreter_only'].values())}")
    for reason, n in sorted(rep["main_interpreter_only"].items()):
        p(f"  [{n}] {reason}")
    for e in rep["skipped_files"]:
        p(f"  [whole file] {e['file']}: {e['reason']}")
    p(f"other skips: {sum(rep['other_skips'].values())}")
    for reason, n in sorted(rep["other_skips"].items()):
        p(f"  [{n}] {_norm(reason)}")
    p(f"crashes and hangs: {len(rep['incidents'])}")
    for i in rep["incidents"]:
        p(f"  chunk {i['chunk']} (attempt {i['attempt']}): {i['kind']}, {i['detail']}, "
          f"{i['phase']}" + (f": {i['test']}" if i["test"] else f" (files {i['files']})"))
        for line in i["output_tail"].splitlines()[-25:]:
            p(f"      | {line}")
    if rep["collect_errors"]:
        p(f"files that did not collect: {len(rep['collect_errors'])}")
        for e in rep["collect_errors"]:
            p(f"  {e['nodeid']}\n" + "\n".join("      | " + x
                                                for x in e["message"].splitlines()[-15:]))
    for prob in rep["problems"]:
        p(f"problem: {prob}")
    p("\n== timing (s) ==")
    for c in rep["timing"]["chunks"]:
        p(f"  chunk {c['chunk']:2d} {c['wall']:7.1f}  attempts {c['attempts']}  "
          + ", ".join(os.path.basename(f) for f in c["files"]))
    for name, v in rep["timing"]["stages"].items():
        p(f"  {name:40s} {v:8.1f}")
    p(f"  {'total (wall clock)':40s} {rep['timing']['wall']:8.1f}")


def parse_known(text):
    """{test id pattern: reason} from a known-failures file."""
    known = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, _, reason = line.partition("#")
        pattern, reason = pattern.strip(), reason.strip()
        if not reason or " " in pattern:
            raise ValueError(f"line {n}: expected 'TEST_ID  # reason', got {line!r}")
        if pattern in known:
            raise ValueError(f"line {n}: {pattern} listed twice")
        known[pattern] = reason
    return known


def _matches(test, pattern):
    """Whether a known-failures pattern names the test: "*" stands for any
    text, everything else is literal (the ids' brackets too)."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), test) is not None


def apply_known(rep, known):
    """Move the listed regressions and unpaired failures to rep["known"];
    the patterns that name tests which ran and failed in none of these ways
    go to rep["stale_known"]."""
    used = set()
    rep["known"] = []
    for section in ("regressions", "unpaired_failures"):
        keep = []
        for r in rep[section]:
            hit = next((p for p in known if _matches(r["test"], p)), None)
            if hit is None:
                keep.append(r)
            else:
                used.add(hit)
                rep["known"].append(dict(r, reason=known[hit], section=section))
        rep[section] = keep
    # (an entry whose tests did not run here, another file's, is not stale)
    rep["stale_known"] = sorted(p for p in set(known) - used
                                if any(_matches(test, p) for test in rep["tests"]))


def verdict(rep, strict):
    return bool(rep["regressions"] or rep["unpaired_failures"] or rep["incidents"]
                or rep["collect_errors"] or rep["problems"] or rep.get("stale_known")
                or (strict and rep["failing_on_both"]))


def _files(args):
    if args.all:
        files = sorted(str(p.relative_to(ROOT)) for d in DIRS for p in (ROOT / d).glob("test_*.py"))
    elif args.files:
        files = []
        for f in args.files:
            path = (Path.cwd() / f).resolve() if not Path(f).is_absolute() else Path(f)
            if not path.exists():
                path = (ROOT / f).resolve()
            if not path.is_file():
                raise SystemExit(f"run_suite: no such test file: {f}")
            files.append(str(path.relative_to(ROOT)))
    else:
        files = list(DEFAULT_FILES)
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Arguments after -- go to pytest (e.g. -- -k EXPR).",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="test files (default: the subset DEFAULT_FILES)")
    ap.add_argument("--all", action="store_true", help="every file of " + ", ".join(DIRS))
    ap.add_argument("--json", metavar="OUT", help="write the report there")
    ap.add_argument("--jobs", type=int, default=1, help="chunks at a time (default 1)")
    ap.add_argument("--chunk-files", type=int, default=4, help="test files per child (default 4)")
    ap.add_argument("--test-timeout", type=float, default=90.0,
                    help="seconds without progress that make a hang (default 90)")
    ap.add_argument("--max-restarts", type=int, default=3,
                    help="new children for a chunk after crashes in a test (default 3)")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 also when a test fails on both params")
    ap.add_argument("--known", metavar="FILE",
                    help="known tideloop failures (tests/interpreters/known_failures.txt)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every test's outcomes")
    ap.add_argument("--workdir", help="keep the children's files there (default: a temporary "
                                      "directory, removed at the end)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    if argv is None:
        argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = ap.parse_args(argv)
    args.pytest_args = extra
    if args.child:
        return child_main(args.child)
    if _subinterpreters() is None:
        print(f"run_suite: Python {sys.version.split()[0]} has no isolated subinterpreters "
              "(3.12+)", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    stages = Counter()
    t = time.monotonic()
    files = _files(args)
    known = parse_known(Path(args.known).read_text()) if args.known else None
    step = max(1, args.chunk_files)
    chunks = [Chunk(i, files[j:j + step]) for i, j in enumerate(range(0, len(files), step))]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (_tideloop_root(), env.get("PYTHONPATH"))
                                        if x)
    stages["setup (file list, chunks)"] = time.monotonic() - t
    print(f"run_suite: python {sys.version.split()[0]}, {len(files)} files in {len(chunks)} "
          f"chunks, {args.jobs} at a time, tideloop from {_tideloop_root()}", flush=True)
    lock = threading.Lock()

    def log(msg):
        with lock:
            print(msg, flush=True)

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="si-suite-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        def one(chunk):
            run_chunk(chunk, args, workdir, env, log)
            n = Counter(r["outcome"] for r in chunk.results.values())
            log(f"chunk {chunk.index:2d} {chunk.wall:6.1f} s  "
                + ", ".join(f"{v} {k}" for k, v in sorted(n.items())) + "  "
                + " ".join(os.path.basename(f) for f in chunk.files))
            return chunk

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(one, chunks))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    for c in chunks:
        for name, v in c.stages.items():
            stages[f"children: {name}"] += v
    t = time.monotonic()
    rep = build_report(chunks, files, time.monotonic() - t_start, stages)
    if known is not None:
        apply_known(rep, known)
    rep["timing"]["stages"]["report"] = round(time.monotonic() - t, 3)
    rep["timing"]["wall"] = round(time.monotonic() - t_start, 2)
    print_report(rep, args.verbose)
    failed = verdict(rep, args.strict)
    rep["exit_status"] = int(failed)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1, sort_keys=True))
    known_note = f" (+{len(rep['known'])} known)" if rep.get("known") else ""
    print(f"\nrun_suite: {'FAILED' if failed else 'OK'}: {len(rep['regressions'])} regressions"
          f"{known_note}, "
          f"{len(rep['incidents'])} crashes/hangs, "
          f"{sum(len(v) for v in rep['failing_on_both'].values())} failing on both params")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
