"""Frameworks' own test suites on the stock loop and on tideloop, test by test.

    python tests/ecosystem/suites.py                 # CI mode: the quick selection
    python tests/ecosystem/suites.py --full          # the whole suites (by hand)
    python tests/ecosystem/suites.py --suites anyio,asyncpg --json results/ecosystem-suites.json

For each pinned release (SUITES below) the runner takes the sdist from PyPI
(it carries the tests), unpacks it into ~/.cache/tideloop-suites (or
$TIDELOOP_SUITES_CACHE), makes a venv for it there (no system site-packages)
with the same release installed from PyPI plus the suite's test requirements,
and runs the suite's pytest twice side by side: once on the stock loop, once
on tideloop (tests/ecosystem/suites_plugin.py, loaded with -p, switches the
loop; tideloop itself comes from src/ by PYTHONPATH, built in place first).
asyncpg's suite runs against a throw-away PostgreSQL cluster per side
(tools/pgcluster.py; Debian's postgresql, installed when missing).

Outcomes come from each run's junit XML.  A test that passed on the stock
loop and did not pass on tideloop (failed, error, skipped or missing) is run
once more on both loops: it is a regression only if it passes on the stock
loop and fails on tideloop again (otherwise it is reported as flaky).  The
run fails on any regression not listed in tests/ecosystem/known_failures.txt
(one "SUITE NODEID  # reason" a line), on a suite whose pytest could not run
(usage error, crash, wall-clock limit, no junit XML), or when the tideloop
side made no tideloop loop; listed tests that passed on tideloop are reported.

Each pytest process has a per-test timeout (pytest-timeout) and a wall-clock
limit for the whole suite.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
KNOWN_FILE = HERE / "known_failures.txt"
CACHE = Path(os.environ.get("TIDELOOP_SUITES_CACHE",
                            Path.home() / ".cache" / "tideloop-suites"))
LOOPS = ("stock", "tideloop")
TIDELOOP_SRC = REPO / "src"      # where the suites' interpreters import tideloop from


@dataclass
class Suite:
    name: str
    version: str
    requirements: list           # besides NAME==VERSION (installed from PyPI)
    quick: list                  # pytest paths of the CI selection
    full: list = field(default_factory=lambda: ["tests"])
    source_dir: str = ""         # the sdist's import package, hidden so the installed release is tested
    addopts: str = None          # replaces the suite's own addopts (xdist, coverage) when set
    args: list = field(default_factory=list)
    timeout: int = 60            # per test (pytest-timeout; None: not used)
    wall: int = 300              # per pytest process, quick mode
    wall_full: int = 3600
    postgres: bool = False
    env: dict = field(default_factory=dict)


# uvloop is left out everywhere: the suites' uvloop parameters skip on both
# loops.  Lint, typing, coverage and docs requirements are left out too.
SUITES = {s.name: s for s in [
    Suite("anyio", "4.16.0",
          ["pytest>=9.0", "pytest-mock>=3.14", "pytest-timeout>=2.4.0", "trustme>=1.0.0",
           "truststore>=0.9.1", "hypothesis>=4.18.2", "psutil>=5.9", "blockbuster>=1.5.29"],
          # all but the pytester runs (test_pytest_plugin.py, 2 minutes), the
          # import-time and process-pool modules
          quick=["tests/streams", *(f"tests/test_{m}.py" for m in (
              "concurrency_utils", "contextmanagers", "debugging", "eventloop", "fileio",
              "from_thread", "functools", "futures", "itertools", "lowlevel", "signals",
              "sockets", "subprocesses", "synchronization", "taskgroups", "tempfile",
              "to_thread", "typedattr"))]),
    Suite("uvicorn", "0.54.0",
          ["pytest>=9", "pytest-mock", "pytest-timeout", "pytest-codspeed", "trustme", "cryptography",
           "httpx2", "a2wsgi", "wsproto", "httptools>=0.8.0", "python-dotenv>=0.13",
           "PyYAML>=5.1", "watchfiles>=0.20", "websockets>=13.0", "zttp>=0.0.34"],
          # all but the process supervisors (tests/supervisors: reload and
          # multiprocess workers, 45 s) and the benchmarks
          quick=["tests/protocols", "tests/middleware", "tests/importer", *(f"tests/test_{m}.py" for m in (
              "server", "ssl", "main", "lifespan", "compat", "config", "cli", "default_headers",
              "auto_detection", "subprocess"))],
          source_dir="uvicorn",
          addopts="-rxXs --strict-config --strict-markers"),
    Suite("aiohttp", "3.14.5",
          ["pytest>=8.4", "pytest-mock", "pytest-timeout", "pytest-codspeed", "coverage", "trustme",
           "freezegun", "blockbuster", "proxy.py>=2.4.4rc5", "isal", "zlib_ng", "gunicorn",
           "aiodns>=3.3.0", "Brotli>=1.2",
           "backports.zstd; python_version < '3.14'"],
          # the modules that run clients and servers on the loop
          quick=[f"tests/test_{m}.py" for m in (
              "client_functional", "web_functional", "client_ws_functional",
              "web_websocket_functional", "web_server", "run_app", "web_sendfile_functional",
              "streams", "test_utils", "loop", "base_protocol", "connector", "proxy_functional",
              "client_proto", "web_protocol")],
          source_dir="aiohttp",
          addopts="-ra --strict-markers",
          # --aiohttp-fast, aiohttp's own option: no gc.collect() after each
          # test's loop (0.1-0.3 s a test, 5/6 of the time; the whole suite
          # takes about 3 minutes with it, 40 without)
          args=["-m", "not dev_mode and not autobahn and not internal", "--aiohttp-fast"]),
    Suite("asyncpg", "0.32.0",
          ["pytest", "pytest-timeout", "distro"],
          # all but the type-codec and introspection modules and the source checks
          quick=[f"tests/test_{m}.py" for m in (
              "execute", "prepare", "copy", "timeout", "cancellation", "listeners", "transaction",
              "cursor", "pool", "adversity", "cache_invalidation", "connect", "exceptions")],
          source_dir="asyncpg",
          addopts="--assert=plain --strict-markers --tb=native --import-mode=importlib",
          postgres=True),
]}


# ---------------------------------------------------------------- comparison

def nodeid_of(testcase):
    """The pytest node id of a junit <testcase> (xunit1: it has file=)."""
    file = testcase.get("file") or ""
    classname = testcase.get("classname") or ""
    name = testcase.get("name") or ""
    if file.endswith(".py"):
        module = file[:-3].replace("/", ".")
        if classname == module:
            return f"{file}::{name}"
        if classname.startswith(module + "."):
            return "::".join([file, *classname[len(module) + 1:].split("."), name])
    return "::".join(p for p in (classname, name) if p)


_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def parse_junit(path):
    """{node id: "passed" | "failed" | "skipped"} from a junit XML file
    (error counts as failed, xfail as skipped; a test reported twice, as
    with an error at teardown, gets its worst outcome)."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        nodeid = nodeid_of(case)
        if nodeid in results and _RANK[results[nodeid]] >= _RANK[outcome]:
            continue
        results[nodeid] = outcome
    return results


def counts(results):
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in results.values():
        out[outcome] += 1
    return out


def parse_known(text):
    """{(suite, node id): reason} from known_failures.txt: one
    "SUITE NODEID  # reason" a line; blank lines and # comments ignored."""
    known = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        entry, sep, reason = line.partition(" # ")
        parts = entry.split()
        if not sep or not reason.strip() or len(parts) != 2:
            raise ValueError(f"known failures line {number}: want 'SUITE NODEID  # reason': {raw!r}")
        key = (parts[0], parts[1])
        if key in known:
            raise ValueError(f"known failures line {number}: {parts[0]} {parts[1]} listed twice")
        known[key] = reason.strip()
    return known


def compare(stock, tideloop, known=(), rerun=None):
    """Test by test.  stock, tideloop: {node id: outcome} of one suite;
    known: the node ids listed for it; rerun: (stock, tideloop) outcomes of
    the candidates run again, or None when there was no rerun.

    candidates: passed on stock, did not pass on tideloop (first run);
    regressions: candidates that passed on stock and did not pass on tideloop
    in the rerun too (all candidates when there was no rerun), split into
    listed and unlisted; flaky: candidates that passed on tideloop when run
    again; inconclusive: candidates that did not pass on stock when run again;
    known_passing: listed tests whose last tideloop outcome is passed."""
    known = set(known)
    candidates = sorted(t for t, o in stock.items() if o == "passed" and tideloop.get(t) != "passed")
    regressions, flaky, inconclusive = [], [], []
    for test in candidates:
        if rerun is None:
            regressions.append(test)
            continue
        again_stock, again_tideloop = rerun[0].get(test), rerun[1].get(test)
        if again_tideloop == "passed":
            flaky.append(test)
        elif again_stock != "passed":
            inconclusive.append(test)
        else:
            regressions.append(test)
    last = dict(tideloop)
    if rerun is not None:
        last.update({t: o for t, o in rerun[1].items() if t in last or t in candidates})
    return {
        "candidates": candidates,
        "listed": [t for t in regressions if t in known],
        "unlisted": [t for t in regressions if t not in known],
        "flaky": flaky,
        "inconclusive": inconclusive,
        "known_passing": sorted(t for t in known if last.get(t) == "passed"),
    }


# ------------------------------------------------------------------ the runs

def log(msg):
    print(f"[suites] {msg}", flush=True)


def _check_call(argv, **kwargs):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    return proc.stdout


def unpacked_sdist(suite):
    """The sdist of the pinned release, unpacked once into the cache, with its
    import package renamed (the tests must import the installed release)."""
    root = CACHE / f"src-{suite.name}-{suite.version}"
    ready = root / ".tideloop-ready"
    if ready.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    downloads = CACHE / "sdists"
    downloads.mkdir(parents=True, exist_ok=True)
    sdist = downloads / f"{suite.name}-{suite.version}.tar.gz"
    if not sdist.exists():
        log(f"{suite.name}: downloading the {suite.version} sdist")
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            _check_call([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                         "--no-deps", "-d", tmp, f"{suite.name}=={suite.version}"])
            found = [p for p in Path(tmp).iterdir() if p.name.endswith(".tar.gz")]
            if len(found) != 1:
                raise RuntimeError(f"{suite.name}: expected one sdist, got {found}")
            os.replace(found[0], sdist)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        with tarfile.open(sdist) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        (top,) = Path(tmp).iterdir()
        if suite.source_dir:
            os.rename(top / suite.source_dir, top / f"{suite.source_dir}.sdist-source")
        (top / ".tideloop-ready").write_text(f"{suite.name} {suite.version}\n")
        os.rename(top, root)
    return root


def venv_for(suite):
    """A venv (no system site-packages) with the release and its test
    requirements, made once per requirement set."""
    reqs = [f"{suite.name}=={suite.version}", *suite.requirements]
    digest = hashlib.sha256("\n".join([sys.version, *reqs]).encode()).hexdigest()[:10]
    venv = CACHE / f"venv-{suite.name}-{suite.version}-{digest}"
    python = venv / "bin" / "python"
    if (venv / ".tideloop-ready").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    log(f"{suite.name}: making {venv.name} ({len(reqs)} requirements)")
    _check_call([sys.executable, "-m", "venv", str(venv)])
    _check_call([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs])
    (venv / ".tideloop-ready").write_text("\n".join(reqs) + "\n")
    return python


def build_tideloop():
    """The extension built in place in src/ (incremental: a no-op when up to date)."""
    _check_call([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=REPO,
                env={**os.environ, "TIDELOOP_DEV": os.environ.get("TIDELOOP_DEV", "1")})


_children = set()           # process groups of the running pytest processes


def _kill_children():
    for pgid in list(_children):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run_threads(threads):
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        while t.is_alive():
            # a join with no timeout is not woken by a signal that another
            # thread received: SIGTERM would wait for the suite to end
            t.join(0.2)


def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class Run:
    loop: str
    returncode: int = None
    timed_out: bool = False
    results: dict = None
    stats: dict = None
    seconds: float = 0.0
    log: Path = None
    problem: str = ""


def run_pytest(suite, python, root, loop, targets, workdir, tag, wall, env_extra):
    """One pytest process of a suite on one loop; its outcomes from junit XML."""
    junit = workdir / f"{suite.name}-{tag}-{loop}.xml"
    stats = workdir / f"{suite.name}-{tag}-{loop}.stats.json"
    logfile = workdir / f"{suite.name}-{tag}-{loop}.log"
    for p in (junit, stats):
        p.unlink(missing_ok=True)
    argv = [str(python), "-m", "pytest", *targets, "-p", "suites_plugin", "-p", "no:cacheprovider",
            f"--junitxml={junit}", "-o", "junit_family=xunit1", "-o", "junit_logging=no",
            "-q", *suite.args]
    if suite.timeout is not None:
        argv += [f"--timeout={suite.timeout}", "-o", "timeout_method=signal"]
    if suite.addopts is not None:
        argv += ["-o", f"addopts={suite.addopts}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env.update({"PYTHONPATH": os.pathsep.join([str(HERE), str(TIDELOOP_SRC)]),
                "TIDELOOP_SUITES_LOOP": loop, "TIDELOOP_SUITES_STATS": str(stats),
                "PYTHONDONTWRITEBYTECODE": "1", **suite.env, **env_extra})
    run = Run(loop, log=logfile)
    start = time.monotonic()
    with open(logfile, "w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        _children.add(proc.pid)
        try:
            run.returncode = proc.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            run.timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            run.returncode = proc.wait()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)     # anything the tests left running
            except ProcessLookupError:
                pass
            _children.discard(proc.pid)
    run.seconds = time.monotonic() - start
    if run.timed_out:
        run.problem = f"killed at the wall-clock limit ({wall} s)"
    elif run.returncode not in (0, 1):
        run.problem = f"pytest exit status {run.returncode}"
    if junit.exists():
        try:
            run.results = parse_junit(junit)
        except ET.ParseError as exc:
            run.problem = run.problem or f"unreadable junit XML: {exc}"
    else:
        run.problem = run.problem or "no junit XML"
    if stats.exists():
        run.stats = json.loads(stats.read_text())
    return run


def run_both(suite, python, root, targets, workdir, tag, wall):
    """The suite on both loops side by side (asyncpg: a cluster each)."""
    runs = {}
    clusters = []
    try:
        envs = {}
        for loop in LOOPS:
            env = {}
            if suite.postgres:
                from tools.pgcluster import PgCluster
                cluster = PgCluster()
                clusters.append(cluster)
                cluster.start()
                env = cluster.env()
            envs[loop] = env

        def one(loop):
            runs[loop] = run_pytest(suite, python, root, loop, targets, workdir, tag, wall, envs[loop])

        _run_threads([threading.Thread(target=one, args=(loop,)) for loop in LOOPS])
    finally:
        for cluster in clusters:
            cluster.stop()
    return runs["stock"], runs["tideloop"]


def prepare(suite):
    """(sdist root, venv python) of a suite, made when missing."""
    root = unpacked_sdist(suite)
    python = venv_for(suite)
    if suite.postgres:
        _check_call(["bash", str(REPO / "tools" / "ensure_debian_package.sh"), "postgresql"])
    return root, python


def prepare_all(suites):
    """prepare() for every suite at once (pip spends its time waiting on the
    index and on unpacking: side by side takes about as long as the slowest).
    {name: (root, python) or the exception}."""
    prepared = {}

    def one(suite):
        t0 = time.monotonic()
        try:
            prepared[suite.name] = (*prepare(suite), time.monotonic() - t0)
        except Exception as exc:
            prepared[suite.name] = exc

    _run_threads([threading.Thread(target=one, args=(s,)) for s in suites])
    return prepared


def run_suite(suite, full, known, workdir, prepared=None, deadline=None):
    t0 = time.monotonic()
    root, python, setup_seconds = prepared or (*prepare(suite), 0.0)
    setup_seconds += time.monotonic() - t0
    targets = suite.full if full else suite.quick
    wall = suite.wall_full if full else suite.wall
    if deadline is not None:
        wall = max(1, min(wall, int(deadline - time.monotonic())))
    log(f"{suite.name} {suite.version}: {' '.join(targets)} on both loops")
    stock, tide = run_both(suite, python, root, targets, workdir, "main", wall)
    problems = [f"{r.loop}: {r.problem} (log: {r.log})" for r in (stock, tide) if r.problem]
    if tide.stats is None or tide.stats["loops"]["tideloop"] == 0:
        problems.append(f"tideloop: no tideloop loop was made (plugin stats: {tide.stats})")
    if stock.stats is None or stock.stats["loops"]["tideloop"] != 0:
        problems.append(f"stock: plugin stats {stock.stats}")
    suite_known = {t for (s, t) in known if s == suite.name}
    rerun = None
    if stock.results is not None and tide.results is not None:
        first = compare(stock.results, tide.results, suite_known)
        if first["candidates"]:
            log(f"{suite.name}: {len(first['candidates'])} passed on stock and not on tideloop:"
                " running them again on both loops")
            if deadline is not None:
                wall = max(1, min(wall, int(deadline - time.monotonic())))
            again = run_both(suite, python, root, first["candidates"], workdir, "rerun", wall)
            problems += [f"rerun {r.loop}: {r.problem} (log: {r.log})" for r in again if r.problem]
            if all(r.results is not None for r in again):
                rerun = (again[0].results, again[1].results)
        verdict = compare(stock.results, tide.results, suite_known, rerun)
    else:
        verdict = None
    entry = {
        "version": suite.version,
        "mode": "full" if full else "quick",
        "selection": targets,
        "seconds": round(time.monotonic() - t0, 1),
        "setup_seconds": round(setup_seconds, 1),
        "problems": problems,
    }
    for run in (stock, tide):
        entry[run.loop] = {**(counts(run.results) if run.results is not None else {}),
                           "exit_status": run.returncode, "seconds": round(run.seconds, 1),
                           "loops_made": (run.stats or {}).get("loops")}
    if verdict is not None:
        entry["regressions"] = {"listed": verdict["listed"], "unlisted": verdict["unlisted"]}
        entry["flaky"] = verdict["flaky"]
        entry["inconclusive"] = verdict["inconclusive"]
        entry["known_now_passing"] = verdict["known_passing"]
        entry["rerun"] = len(verdict["candidates"])
    entry["ok"] = not problems and verdict is not None and not verdict["unlisted"]
    return entry


def report(name, e):
    def side(loop):
        c = e[loop]
        return f"{c.get('passed', '?')} passed, {c.get('failed', '?')} failed, {c.get('skipped', '?')} skipped"
    log(f"{name} {e['version']} ({e['mode']}): stock {side('stock')} | tideloop {side('tideloop')}"
        f" | {e['seconds']} s")
    if "regressions" in e:
        r = e["regressions"]
        log(f"{name}: regressions {len(r['listed'])} listed, {len(r['unlisted'])} unlisted;"
            f" flaky (passed on tideloop when run again) {len(e['flaky'])};"
            f" failed on stock when run again {len(e['inconclusive'])};"
            f" listed but passing now {len(e['known_now_passing'])}")
        for t in r["unlisted"]:
            log(f"  UNLISTED REGRESSION {name} {t}")
        for t in e["flaky"]:
            log(f"  flaky on tideloop (passed when run again): {name} {t}")
        for t in e["inconclusive"]:
            log(f"  failed on stock too when run again: {name} {t}")
        for t in e["known_now_passing"]:
            log(f"  listed in known_failures.txt but passed on tideloop: {name} {t}")
    for p in e["problems"]:
        log(f"  PROBLEM {name}: {p}")


def main(argv=None):
    # SIGTERM (a CI timeout) unwinds like ^C: the pytest process groups are
    # killed and the PostgreSQL clusters stopped on the way out.
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:
        log(f"FAIL: interrupted ({exc or 'SIGINT'}); the pytest processes killed, the clusters stopped")
        return 130
    finally:
        _kill_children()


def _main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="whole suites (default: the CI selection)")
    ap.add_argument("--suites", default=",".join(SUITES), help="comma-separated, of: " + ", ".join(SUITES))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--known", default=str(KNOWN_FILE))
    ap.add_argument("--logdir", help="keep the pytest logs and junit XML here (default: a temp dir, kept on failure)")
    ap.add_argument("--no-build", action="store_true", help="do not build the extension in place first")
    ap.add_argument("--max-seconds", type=float,
                    help="deadline for the pytest runs, counted once the venvs are made (default: 420 in quick mode, none"
                         " with --full); a suite still running then is killed and fails the run")
    args = ap.parse_args(argv)
    names = [n for n in args.suites.split(",") if n]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        ap.error(f"unknown suites: {unknown}")
    known = parse_known(Path(args.known).read_text())
    strays = sorted({s for s, _ in known} - set(SUITES))
    if strays:
        ap.error(f"{args.known}: unknown suites {strays}")
    CACHE.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.logdir or tempfile.mkdtemp(prefix="tideloop-suites-"))
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    if not args.no_build:
        build_tideloop()
    max_seconds = args.max_seconds if args.max_seconds is not None else (None if args.full else 420)
    prepared = prepare_all([SUITES[n] for n in names])
    log(f"prepared in {time.monotonic() - start:.0f} s (cache: {CACHE})")
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    results = {}
    for name in names:
        try:
            if isinstance(prepared[name], Exception):
                raise prepared[name]
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"not run: past the deadline ({max_seconds:.0f} s)")
            results[name] = run_suite(SUITES[name], args.full, known, workdir, prepared[name], deadline)
        except Exception as exc:      # setup failures fail the run, with the reason
            results[name] = {"version": SUITES[name].version, "ok": False, "problems": [str(exc)],
                             "mode": "full" if args.full else "quick", "seconds": None,
                             "stock": {}, "tideloop": {}}
        report(name, results[name])
    total = round(time.monotonic() - start, 1)
    ok = all(e["ok"] for e in results.values())
    tide_passed = sum(e["tideloop"].get("passed", 0) for e in results.values())
    unlisted = sum(len(e.get("regressions", {}).get("unlisted", [])) for e in results.values())
    listed = sum(len(e.get("regressions", {}).get("listed", [])) for e in results.values())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "mode": "full" if args.full else "quick", "python": sys.version.split()[0],
            "seconds": total, "ok": ok, "tideloop_passed": tide_passed,
            "regressions_listed": listed, "regressions_unlisted": unlisted,
            "suites": results}, indent=1) + "\n")
    if ok and not args.logdir:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        log(f"logs and junit XML: {workdir}")
    log(f"{'PASS' if ok else 'FAIL'}: {len(results)} suites in {total} s; tideloop passed {tide_passed} tests;"
        f" regressions: {unlisted} unlisted, {listed} listed in {Path(args.known).name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
