#!/usr/bin/env python3
"""Run CPython's own asyncio tests (Lib/test/test_asyncio) on the stock loop and
on tideloop (optionally also on uvloop), and compare them test by test.

    python tests/conformance/run.py [--loop asyncio|tideloop|uvloop|both|all|SIDE,SIDE...]
        [--modules m1,m2] [--json out.json] [--verbose]
        [--strict] [--known FILE] [--timeout 300] [--test-timeout 120] [--jobs N]
        [--subinterpreter]

Every (module, loop) pair runs in a fresh subprocess (child.py), so a crash or
hang is contained: the test that was running is recorded as "crash"/"hang" and
the module is resumed after it (up to --max-restarts times). On the tideloop
side the child patches asyncio so that every way the tests obtain a real loop
(asyncio.new_event_loop, the default policy, asyncio.run / Runner,
IsolatedAsyncioTestCase) produces tideloop.Loop, and checks that it did before
running anything. test_events' concrete loop classes are replaced by a
TideloopEventLoopTests class (see child.py).

A regression is a test that passes on stock and does not pass on tideloop.
One that failed with NotImplementedError (anywhere in its exception chain) is
counted as "nyi" (not yet implemented) instead, one that tideloop's run
skipped (the test decided it does not apply, e.g. "loop is not a
BaseSelectorEventLoop") as "skip". The exit code is 0 unless --strict, where it
is 1 if any regression is not listed in --known (one test key per line,
fnmatch patterns allowed, "# reason" comment after it).

Results are keyed by "module.Class.test" (test_events' loop classes all map to
"test_events.EventLoopTests.test_...").

Child logs go to a temporary work directory, removed at the end of the run
(also after an error, Ctrl-C or a crashed child) unless --keep is given or
--workdir names the directory to keep them in. The children run with TMPDIR
and their working directory in a directory of their own (inside the work
directory), so whatever CPython's tests leave behind (temporary files, Unix
sockets, os_helper.TESTFN after a crash) goes too.

--jobs N runs N (module, loop) pairs at a time (CI: 3), each child in a
temporary directory of its own; the report is the same as one after the other.

The children start with SIGINT's default disposition even when the runner
ignores SIGINT (a background job, many CI runners): CPython's tests interrupt
themselves and wait for the KeyboardInterrupt.

--loop all (or a list such as stock,tideloop,uvloop) adds a uvloop side,
patched exactly like the tideloop side but with uvloop.Loop (--uvloop-factory),
for comparison: the table gets uvloop columns and "uv regr" (passes on stock,
does not pass on uvloop: failures, errors, nyi and skips alike). --strict and
--known apply to the tideloop side only. The tideloop package is taken from
<repo>/src when an in-place build for this interpreter is there, else from
the installed package.

--subinterpreter (3.12+) runs each (module, loop) pair in an isolated
subinterpreter (own GIL) that its child process creates: the patch, its check
and the tests all run there, on both sides, and the subinterpreter is
destroyed at the end (child.py). A regression is then a test that passes on
stock in a subinterpreter and not on tideloop in a subinterpreter. Tests
that cannot run in an isolated subinterpreter (fork, exec of a preexec_fn,
signal handlers, daemon threads, faulthandler, single-phase C test modules)
fail on both sides and are not regressions; the scaffolding of some tests is
adapted on both sides (helper threads, child watchers in setUp, tests that
interrupt themselves: child.adapt_for_subinterpreter). The report says
"subinterpreter": true; each side has the interpreter it ran in, the
subinterpreter's config, whether it was destroyed, and the adaptations.
"""

import argparse
import concurrent.futures
import fnmatch
import sysconfig
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHILD = os.path.join(HERE, "child.py")

from child import key_for  # noqa: E402  (beside this script: sys.path[0]; same id -> key mapping as the child)

# Modules of Lib/test/test_asyncio run by default, per issue:
#   #2 (loop core: scheduling, timers, readers/writers, signals, tasks).
#      test_events also holds the network/pipe/subprocess tests.
# Modules with their own concrete loop classes need an adapter in child.py.
MODULES = [
    "test_tasks", "test_futures", "test_futures2", "test_locks", "test_queues",
    "test_timeouts", "test_taskgroups", "test_runners", "test_context",
    "test_pep492", "test_waitfor", "test_events",
    # TCP/Unix networking
    "test_sock_lowlevel", "test_streams", "test_server", "test_sendfile",
    "test_buffered_proto", "test_ssl", "test_sslproto",
    # UDP, pipes, subprocesses (UDP and pipes: test_events)
    "test_subprocess", "test_unix_events",
]
# Modules of newer interpreters, run where this interpreter has them: eager
# task factories (3.12+), staggered starts (3.13+), call graphs and
# free-threaded use of asyncio (3.14).
NEWER_MODULES = ["test_eager_task_factory", "test_staggered", "test_graph",
                 "test_free_threading"]


def default_modules():
    """MODULES, then those of NEWER_MODULES that this interpreter ships."""
    import importlib.util
    return MODULES + [m for m in NEWER_MODULES
                      if importlib.util.find_spec("test.test_asyncio." + m) is not None]

SIDES = {"asyncio": ["stock"], "tideloop": ["tideloop"], "uvloop": ["uvloop"],
         "both": ["stock", "tideloop"], "all": ["stock", "tideloop", "uvloop"]}
SIDE_ORDER = ["stock", "tideloop", "uvloop"]


def parse_sides(value):
    """--loop: a name of SIDES or a comma-separated list of sides."""
    if value in SIDES:
        return SIDES[value]
    names = {"asyncio": "stock"}
    sides = {names.get(v.strip(), v.strip()) for v in value.split(",") if v.strip()}
    bad = sides - set(SIDE_ORDER)
    if bad or not sides:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(SIDES)} or a list of {', '.join(SIDE_ORDER)}")
    return [s for s in SIDE_ORDER if s in sides]
PASSING = {"pass", "xfail"}


# --------------------------------------------------------------------------
# Running one (module, side)
# --------------------------------------------------------------------------

def child_env(tmpdir=None):
    env = dict(os.environ)
    src = os.path.join(REPO, "src")
    # The children run in tmpdir, not here: relative entries keep their meaning.
    path = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Only a build for this interpreter: src/ may hold builds for other versions,
    # and src/tideloop would then shadow the installed package.
    if os.path.exists(os.path.join(src, "tideloop",
                                   "_core" + sysconfig.get_config_var("EXT_SUFFIX"))):
        path.insert(0, src)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    env.pop("PYTHONASYNCIODEBUG", None)   # same conditions on both sides
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return env


# AF_UNIX socket paths the tests make in the children's temporary directory
# must stay under 108 bytes: a longer directory is not used for it.
MAX_CHILD_TMP_LEN = 60


def make_child_tmp(workdir):
    """A new directory for the children's TMPDIR and working directory."""
    path = tempfile.mkdtemp(prefix="tmp-", dir=workdir)
    if len(path) <= MAX_CHILD_TMP_LEN:
        return path
    os.rmdir(path)
    return tempfile.mkdtemp(prefix="tideloop-conformance-tmp-")


def remove_tree(path):
    """rmtree that also gets through directories a test left unwritable.
    Returns True if path is gone."""
    def retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
    return not os.path.lexists(path)


def sigint_default():
    """preexec_fn of the children: SIGINT's default disposition.  A run with
    SIGINT ignored (a background job of a non-interactive shell, many
    CI runners) would hand that on through exec, and the child's interpreter
    would then install no KeyboardInterrupt handler: test_runners' tests that
    interrupt themselves (_thread.interrupt_main(), which does nothing for an
    ignored SIGINT) would spin in their loop until the watchdog, one after
    the other."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_records(path):
    recs = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    recs.append(json.loads(line))
                except ValueError:      # torn last line after a crash
                    pass
    except FileNotFoundError:
        pass
    return recs


def tail(path, n=3000):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def describe_exit(rc):
    if rc is None:
        return "killed (module timeout)"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


class Stopped(Exception):
    """The run is being interrupted: start no more children."""


# With --jobs > 1, the children running now (so that an interrupted run can
# stop them all: signals reach the main thread only) and the flag that keeps
# the workers from starting new ones.
_live = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


def stop_children():
    _stopping.set()
    with _live_lock:
        for proc in _live:
            kill_group(proc.pid)


def run_side(module, side, args, workdir, child_tmp=None):
    """Run one module on one side, resuming after crashes. Returns a dict.
    child_tmp: the children's TMPDIR and working directory (default
    args.child_tmp; concurrent runs each have their own)."""
    child_tmp = child_tmp or args.child_tmp
    out = os.path.join(workdir, f"{module}.{side}.jsonl")
    log = os.path.join(workdir, f"{module}.{side}.log")
    skipf = os.path.join(workdir, f"{module}.{side}.skip")
    for p in (out, log, skipf):
        if os.path.exists(p):
            os.unlink(p)
    info = {"log": log, "crashes": [], "restarts": 0, "error": None,
            "loop_type": None, "loops_created": 0, "checked": None}
    results = {}            # key -> record
    skip_ids = set()
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    while True:
        cmd = [args.python, CHILD, "--module", module, "--side", side,
               "--out", out, "--test-timeout", str(args.test_timeout)]
        if side == "tideloop":
            cmd += ["--loop-factory", args.loop_factory]
        elif side == "uvloop":
            cmd += ["--loop-factory", args.uvloop_factory]
        if skip_ids:
            with open(skipf, "w", encoding="utf-8") as f:
                f.write("\n".join(sorted(skip_ids)) + "\n")
            cmd += ["--skip", skipf]
        if args.verbose:
            cmd.append("--verbose")
        if args.subinterpreter:
            cmd.append("--subinterpreter")
        start_len = len(read_records(out))
        with open(log, "ab") as logf:
            with _live_lock:
                if _stopping.is_set():
                    raise Stopped()
                # cwd: os_helper.TESTFN and some Unix socket names are relative.
                proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL,
                                        env=child_env(child_tmp),
                                        cwd=child_tmp, start_new_session=True,
                                        preexec_fn=sigint_default)
                _live.add(proc)
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
                rc = None
            except BaseException:
                # Ctrl-C, SIGTERM, an error here: the child has a session of
                # its own, so nothing else stops it (and its files).
                kill_group(proc.pid)
                proc.wait()
                raise
            else:
                kill_group(proc.pid)    # leftovers (grandchildren) of a crashed child
            finally:
                with _live_lock:
                    _live.discard(proc)
        if _stopping.is_set():
            raise Stopped()
        recs = read_records(out)[start_len:]
        running = None
        done = False
        loops = 0
        for r in recs:
            ev = r.get("ev")
            if ev == "meta":
                info["loop_type"] = r["loop_type"]
                info["checked"] = r["checked"]
                info["interpreter"] = r.get("interpreter")
                if "adaptations" in r:      # --subinterpreter
                    info["adaptations"] = r["adaptations"]
            elif ev == "start":
                running = r["id"]
                skip_ids.add(r["id"])
            elif ev == "result":
                results[r["key"]] = r
                skip_ids.add(r["id"])
                if r["id"] == running:
                    running = None
                loops = r.get("loops", loops)
            elif ev == "done":
                done = True
                loops = r["loops_created"]
            elif ev == "interp":
                info["subinterpreter"] = {"id": r["id"], "config": r["config"],
                                          "destroyed": False}
            elif ev == "destroyed":
                info["subinterpreter"]["destroyed"] = True
        info["loops_created"] += loops
        if rc is not None and done:
            if rc != 0:     # all the tests ran: e.g. a crash at interpreter exit
                info["exit_after_done"] = describe_exit(rc)
            break
        how = describe_exit(rc)
        if rc == 1 and running is not None and "Timeout (" in tail(log, 20000):
            how = f"hang (> {args.test_timeout:g} s, watchdog)"
        if running is None:
            # died outside any test: import error, patch check failed, ...
            if not any(r.get("ev") == "start" for r in recs):
                info["error"] = f"child failed before running tests ({how}): " + tail(log, 1500)
            else:
                info["error"] = f"child died between tests ({how})"
            break
        from_child = tail(log, 2500)
        outcome = "hang" if how.startswith(("hang", "killed")) else "crash"
        rec = {"id": running, "key": key_for(running), "outcome": outcome,
               "message": how, "tb": from_child, "exc": [], "nyi": False}
        results[rec["key"]] = rec
        info["crashes"].append({"id": running, "how": how})
        if rc is None or info["restarts"] >= args.max_restarts:
            if rc is None:
                info["error"] = f"module timeout ({args.timeout:g} s)"
            else:
                info["error"] = f"gave up after {info['restarts']} restarts"
            break
        info["restarts"] += 1
    info["time"] = round(time.monotonic() - t0, 2)
    info["results"] = results
    return info


# --------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------

def counts(results):
    c = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "crashed": 0}
    for r in results.values():
        o = r["outcome"]
        if o in PASSING:
            c["passed"] += 1
        elif o in ("fail", "xpass"):
            c["failed"] += 1
        elif o == "error":
            c["errors"] += 1
        elif o == "skip":
            c["skipped"] += 1
        else:
            c["crashed"] += 1
    return c


def load_known(path):
    known = []
    if not path:
        return known
    with open(path, encoding="utf-8") as f:
        for line in f:
            pat, _, reason = line.partition("#")
            pat = pat.strip()
            if pat:
                known.append((pat, reason.strip()))
    return known


def known_reason(key, known):
    for pat, reason in known:
        if key == pat or fnmatch.fnmatchcase(key, pat):
            return reason or "known"
    return None


def brief(r):
    keep = ("id", "key", "outcome", "exc", "nyi", "message", "subtest", "reason", "tb")
    return {k: r[k] for k in keep if k in r}


def compare(stock, tide, args, known, side="tideloop"):
    regressions, nyi, skipped, fixed = [], [], [], []
    for key, s in sorted(stock.items()):
        if s["outcome"] not in PASSING:
            continue
        t = tide.get(key)
        if t is None:
            t = {"key": key, "outcome": "missing",
                 "message": f"not run on {side} (module timeout/crash)"}
        if t["outcome"] in PASSING:
            continue
        entry = brief(t)
        entry["stock_outcome"] = s["outcome"]
        if t["outcome"] == "skip":
            skipped.append(entry)
        elif t.get("nyi") and not args.nyi_as_regression:
            nyi.append(entry)
        else:
            reason = known_reason(key, known)
            entry["known"] = reason is not None
            if reason:
                entry["known_reason"] = reason
            regressions.append(entry)
    for key, t in sorted(tide.items()):
        if t["outcome"] in PASSING and key in stock and stock[key]["outcome"] not in PASSING:
            fixed.append(key)
    return regressions, nyi, skipped, fixed


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def fmt_counts(c):
    if c is None:
        return "-"
    s = f"{c['passed']}/{c['failed']}/{c['errors']}/{c['skipped']}"
    if c["crashed"]:
        s += f" +{c['crashed']}crash"
    return s


def print_table(report, sides):
    hdr = ["module"]
    if "stock" in sides:
        hdr += ["stock p/f/e/s", "s"]
    if "tideloop" in sides:
        hdr += ["tideloop p/f/e/s", "s", "loops"]
    if "uvloop" in sides:
        hdr += ["uvloop p/f/e/s", "s", "loops"]
    both = "stock" in sides and "tideloop" in sides
    uv = "stock" in sides and "uvloop" in sides
    if both:
        hdr += ["regr", "nyi", "skip"]
    if uv:
        hdr.append("uv regr")
    hdr.append("notes")
    rows = []
    for m, d in report["modules"].items():
        row = [m]
        notes = []
        for side in sides:
            sd = d[side]
            row += [fmt_counts(sd.get("counts")), f"{sd.get('time', 0):.1f}"]
            if side != "stock":
                row.append(str(sd.get("loops_created", 0)))
            bad = [c["how"].split()[0] if c["how"].startswith("hang") else c["how"]
                   for c in sd.get("crashes", [])]
            if bad:
                notes.append(f"{side}: " + ", ".join(
                    f"{bad.count(b)}x {b}" for b in sorted(set(bad))))
            if sd.get("error"):
                notes.append(f"{side}: {sd['error'].splitlines()[0][:70]}")
            if sd.get("exit_after_done"):
                notes.append(f"{side}: after the tests: {sd['exit_after_done']}")
            if sd.get("subinterpreter") and not sd["subinterpreter"]["destroyed"]:
                notes.append(f"{side}: subinterpreter not destroyed")
        if both:
            regs = d["regressions"]
            unknown = sum(1 for r in regs if not r["known"])
            row += [f"{len(regs)}" + (f" ({unknown} new)" if unknown != len(regs) else ""),
                    str(len(d["nyi"])), str(len(d["skipped_on_tideloop"]))]
        if uv:
            row.append(str(len(d["uvloop_regressions"])))
        row.append("; ".join(notes))
        rows.append(row)
    tot = ["TOTAL"]
    for side in sides:
        c = {k: sum(d[side]["counts"][k] for d in report["modules"].values()
                    if d[side].get("counts")) for k in
             ("passed", "failed", "errors", "skipped", "crashed")}
        tot += [fmt_counts(c), f"{sum(d[side].get('time', 0) for d in report['modules'].values()):.1f}"]
        if side != "stock":
            tot.append(str(sum(d[side].get("loops_created", 0) for d in report["modules"].values())))
    if both:
        tot += [str(sum(len(d["regressions"]) for d in report["modules"].values())),
                str(sum(len(d["nyi"]) for d in report["modules"].values())),
                str(sum(len(d["skipped_on_tideloop"]) for d in report["modules"].values()))]
    if uv:
        tot.append(str(sum(len(d["uvloop_regressions"]) for d in report["modules"].values())))
    tot.append("")
    rows.append(tot)
    widths = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    line = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
    print(line(hdr))
    print(line(["-" * w for w in widths]))
    for r in rows[:-1]:
        print(line(r))
    print(line(["-" * w for w in widths]))
    print(line(rows[-1]))
    loop_sides = " / ".join(s for s in sides if s != "stock") or "tideloop"
    print("p/f/e/s = passed/failed/errors/skipped, s = seconds, loops = loops the "
          f"{loop_sides} side created (0: the module only tests asyncio's own base classes)")
    if both:
        print("regr = passes on stock, not on tideloop; nyi = failed on tideloop with "
              "NotImplementedError; skip = skipped on tideloop")
    if uv:
        print("uv regr = passes on stock, not on uvloop (failed, error, nyi or skipped)")


def one_line(r):
    msg = (r.get("message") or r.get("reason") or "").strip().splitlines()
    msg = msg[0][:110] if msg else ""
    exc = (r.get("exc") or [""])[0]
    return f"{r['outcome']:7} {r['key']}  {exc}: {msg}".rstrip(": ")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loop", type=parse_sides, default="both", metavar="|".join(SIDES),
                    help="sides to run, or a comma-separated list of %s" % ",".join(SIDE_ORDER))
    ap.add_argument("--modules", help="comma-separated (default: %s, and where the "
                    "interpreter has them %s)" % (",".join(MODULES), ",".join(NEWER_MODULES)))
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--verbose", action="store_true",
                    help="list the ids of regressions, nyi and skipped tests")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 on a regression not in --known")
    ap.add_argument("--known", help="known-failures file (key per line, # reason)")
    ap.add_argument("--nyi-as-regression", action="store_true",
                    help="count NotImplementedError failures as regressions")
    ap.add_argument("--timeout", type=float, default=300, help="per module and loop, seconds")
    ap.add_argument("--test-timeout", type=float, default=120,
                    help="per test watchdog, seconds (0 = off)")
    ap.add_argument("--max-restarts", type=int, default=30,
                    help="resume a module after this many crashes at most")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="run N (module, loop) pairs at a time, each child in a "
                         "temporary directory of its own (default 1: one after "
                         "the other); most of a module's time is its tests' "
                         "sleeps, so 3 take about a third of the time on 2 cores")
    ap.add_argument("--workdir",
                    help="keep the child logs in this directory (default: a "
                         "temporary directory, removed at the end of the run)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the child logs and the children's temporary files")
    ap.add_argument("--subinterpreter", action="store_true",
                    help="run each module in an isolated subinterpreter of its "
                         "child process, on both sides (3.12+)")
    ap.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    ap.add_argument("--loop-factory", default="tideloop:Loop", help=argparse.SUPPRESS)
    ap.add_argument("--uvloop-factory", default="uvloop:Loop", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    modules = args.modules.split(",") if args.modules else default_modules()
    sides = args.loop
    known = load_known(args.known)
    if os.sep in args.python:           # the children do not run in this directory
        args.python = os.path.abspath(args.python)

    # Everything this run creates is under these two directories; both go at
    # the end, however the run ends, unless the user asked to keep them
    # (--workdir: the logs, --keep: everything).
    if args.workdir:
        workdir = os.path.abspath(args.workdir)
        os.makedirs(workdir, exist_ok=True)
    else:
        workdir = tempfile.mkdtemp(prefix="tideloop-conformance-")
    args.jobs = max(1, args.jobs)
    args.child_tmp, args.child_tmps = None, []
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        # SIGTERM (a CI timeout, kill): unwind like Ctrl-C, through the clean-up.
        signal.signal(signal.SIGTERM, _on_sigterm)
        for _ in range(args.jobs):      # one per child running at a time
            args.child_tmps.append(make_child_tmp(workdir))
        args.child_tmp = args.child_tmps[0]
        return run_all(args, modules, sides, known, workdir)
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        clean_up(args, workdir)


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def clean_up(args, workdir):
    if args.keep:
        print(f"kept: child logs in {workdir}, the children's temporary files in "
              f"{', '.join(args.child_tmps)}", file=sys.stderr)
        return
    left = [p for p in args.child_tmps if not remove_tree(p)]
    if not args.workdir and not remove_tree(workdir):
        left.append(workdir)
    for path in left:
        print(f"conformance: could not remove {path}", file=sys.stderr)


# Scheduled first when pairs run concurrently (--jobs): the longest modules,
# so that the run does not end waiting on one of them.
LONG_MODULES = ["test_tasks", "test_subprocess", "test_ssl", "test_taskgroups",
                "test_sslproto", "test_events"]


def run_pairs(args, pairs, workdir, t0):
    """Run every (module, side) pair: {pair: info}."""
    def one(pair, child_tmp):
        m, side = pair
        print(f"[{time.monotonic() - t0:6.1f}s] {m} on {side} ...", file=sys.stderr, flush=True)
        info = run_side(m, side, args, workdir, child_tmp)
        info["counts"] = counts(info["results"]) if info["results"] or not info["error"] else None
        return info

    if args.jobs == 1:
        return {pair: one(pair, args.child_tmp) for pair in pairs}
    rank = {m: i for i, m in enumerate(LONG_MODULES)}
    todo = sorted(pairs, key=lambda p: rank.get(p[0], len(rank)))
    free = list(args.child_tmps)        # a directory per running child
    lock = threading.Lock()

    def task(pair):
        with lock:
            child_tmp = free.pop()
        try:
            return one(pair, child_tmp)
        finally:
            with lock:
                free.append(child_tmp)

    ex = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    try:
        futures = {pair: ex.submit(task, pair) for pair in todo}
        infos = {pair: futures[pair].result() for pair in todo}
    except BaseException:
        # Ctrl-C or SIGTERM (in this thread), an error in a worker: stop
        # the children that run now and start no other.
        stop_children()
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown()
    return {pair: infos[pair] for pair in pairs}


def run_all(args, modules, sides, known, workdir):
    t0 = time.monotonic()
    report = {"command": " ".join([os.path.relpath(__file__, REPO)] + sys.argv[1:]),
              "python": sys.version.split()[0],
              "loop": next((k for k, v in SIDES.items() if v == sides), ",".join(sides)),
              "loop_factory": args.loop_factory if "tideloop" in sides else None,
              "subinterpreter": args.subinterpreter,
              "workdir": workdir, "logs_kept": bool(args.keep or args.workdir),
              "modules": {}}
    infos = run_pairs(args, [(m, side) for m in modules for side in sides], workdir, t0)
    for m in modules:
        d = {side: infos[m, side] for side in sides}
        if "stock" in sides and "tideloop" in sides:
            regs, nyi, skipped, fixed = compare(d["stock"]["results"], d["tideloop"]["results"],
                                                args, known)
            d["regressions"], d["nyi"], d["skipped_on_tideloop"], d["fixed"] = regs, nyi, skipped, fixed
            lc = d["tideloop"]["loops_created"]
            if d["tideloop"]["loop_type"] and lc == 0:
                d["tideloop"].setdefault("warnings", []).append(
                    "no loop created through the patched paths")
        if "stock" in sides and "uvloop" in sides:
            regs, nyi, skipped, _ = compare(d["stock"]["results"], d["uvloop"]["results"],
                                            args, [], side="uvloop")
            d["uvloop_regressions"] = sorted(regs + nyi + skipped, key=lambda r: r["key"])
        report["modules"][m] = d
    report["wall_time_s"] = round(time.monotonic() - t0, 1)

    print()
    if args.subinterpreter:
        ran = [(m, side, d[side].get("interpreter")) for m, d in report["modules"].items()
               for side in sides if d[side]["loop_type"]]
        outside = [f"{m} [{side}]" for m, side, where in ran
                   if not (where or "").startswith("subinterpreter")]
        print(f"ran in isolated subinterpreters: {len(ran) - len(outside)} of "
              f"{len(ran)} (module, loop) pairs"
              + (f"; NOT in one: {', '.join(outside)}" if outside else ""))
    for side in (s for s in sides if s != "stock"):
        types = {d[side]["loop_type"] for d in report["modules"].values()}
        print(f"{side} side ran on: {', '.join(sorted(t for t in types if t) or ['(nothing)'])}")
    print_table(report, sides)

    new_regs = []
    if "stock" in sides and "tideloop" in sides:
        for m, d in report["modules"].items():
            new_regs += [r for r in d["regressions"] if not r["known"]]
        if args.verbose:
            for m, d in report["modules"].items():
                for title, lst in (("regressions", d["regressions"]), ("nyi", d["nyi"]),
                                   ("skipped on tideloop", d["skipped_on_tideloop"])):
                    if lst:
                        print(f"\n{m}: {title} ({len(lst)})")
                        for r in lst:
                            k = "  [known: %s]" % r["known_reason"] if r.get("known") else ""
                            print("  " + one_line(r) + k)
        elif new_regs:
            print(f"\n{len(new_regs)} regression(s) not in the known list:")
            for r in new_regs[:50]:
                print("REGRESSION " + one_line(r))
        # known entries for the modules that ran which no longer fail
        failing = [r["key"] for d in report["modules"].values()
                   for r in d["regressions"] + d["nyi"] + d["skipped_on_tideloop"]]
        stale = [pat for pat, _ in known
                 if pat.split(".")[0] in report["modules"]
                 and not any(k == pat or fnmatch.fnmatchcase(k, pat) for k in failing)]
        report["stale_known"] = stale
        if stale:
            print(f"\nknown-failure entries that now pass (remove them): {', '.join(stale)}")
    if "stock" in sides and "uvloop" in sides and args.verbose:
        for m, d in report["modules"].items():
            if d["uvloop_regressions"]:
                print(f"\n{m}: not passing on uvloop ({len(d['uvloop_regressions'])})")
                for r in d["uvloop_regressions"]:
                    print("  " + one_line(r) + ("  [nyi]" if r.get("nyi") else ""))
    if args.keep or args.workdir:
        where = f"child logs in {workdir}"
    else:
        where = "child logs removed (--keep or --workdir DIR keeps them)"
    print(f"\nwall time {report['wall_time_s']:.1f} s; {where}")

    if args.json:
        for d in report["modules"].values():
            for side in sides:
                res = d[side].pop("results")
                d[side]["not_passing"] = [brief(r) for r in res.values()
                                          if r["outcome"] not in PASSING]
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"report written to {args.json}")

    failed_runs = [m for m, d in report["modules"].items()   # uvloop side: not checked
                   if any(d[s].get("error") and not d[s].get("counts")
                          for s in sides if s != "uvloop")]
    if args.strict and (new_regs or failed_runs):
        print(f"--strict: {len(new_regs)} unknown regression(s), "
              f"{len(failed_runs)} module(s) that did not run", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("conformance: interrupted", file=sys.stderr)
        sys.exit(130)
