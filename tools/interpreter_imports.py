#!/usr/bin/env python3
"""Which extension modules import in an isolated subinterpreter (PEP 684).

    python tools/interpreter_imports.py [--python VERSION[=PATH]]...
        [--json results/interpreter-imports.json] [--modules a,b,...]
        [--reuse-venv] [--install-timeout S] [--probe-timeout S]

For each interpreter (default: 3.14 and 3.15, Debian's builds through
tools/python_from_debian.sh; ``--python 3.12=PATH`` names any other): make a
fresh venv under ~/.cache/tideloop-interp-imports/VERSION, pip-install
PACKAGES one at a time (pip's ``--prefer-binary``: a release with a wheel
for the interpreter before a source build; nothing pinned), build tideloop
in place from this checkout, then probe each module of PROBES in two fresh
child processes:

  main      ``import MODULE`` in the main interpreter: is it there at all?
  isolated  an isolated subinterpreter (its own GIL; what
            ``concurrent.interpreters.create()`` makes on 3.14+,
            ``_interpreters.create('isolated')`` on 3.13,
            ``_xxsubinterpreters.create(isolated=True)`` on 3.12) runs
            ``import MODULE``: ok, the exception a user sees, or the signal
            that killed the process (at the import, when the interpreter is
            closed, or at the process's exit).

Where a package falls back to pure Python when its C extension refuses, a
check (an expression such as ``yaml.__with_libyaml__``) is evaluated in both
interpreters: a different value says it fell back.  A package that pip
cannot install is recorded with pip's last error line.  Each stage is timed
(``seconds`` in the file), and a summary is printed per interpreter.
The results of each interpreter replace that interpreter's entry in the JSON
file (written atomically), so ``--python 3.12=...`` alone adds 3.12 to the
file.  tools/docs_tables.py makes the table in docs/usage.md from it.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                     "tideloop-interp-imports")
DEFAULT_JSON = os.path.join(REPO, "results", "interpreter-imports.json")
DEFAULT_VERSIONS = ("3.14", "3.15")

# What pip installs, one requirement at a time, in this order (a package's
# dependencies come with it).  setuptools builds tideloop in place.
PACKAGES = [
    "uvloop", "aiohttp", "yarl", "multidict", "frozenlist", "propcache", "aiosignal",
    "httptools", "h11", "uvicorn", "starlette", "fastapi", "pydantic", "msgspec", "orjson",
    "ujson", "msgpack", "asyncpg", "psycopg", "psycopg-binary", "redis", "hiredis",
    "websockets", "cryptography", "cffi", "numpy", "lxml", "PyYAML", "MarkupSafe",
    "SQLAlchemy", "grpcio", "anyio", "sniffio", "certifi", "charset-normalizer", "idna",
    "zstandard", "Brotli", "aiofiles", "httpx", "Jinja2", "gunicorn",
]
BUILD_PACKAGES = ["setuptools"]

STDLIB = "stdlib"
TIDELOOP = "tideloop"

# (module, package, prelude, check, ext): the package is a distribution's
# name as pip spells it, STDLIB, or TIDELOOP (this checkout).  A package whose
# C extension is imported lazily, or has a pure-Python fallback, has that
# extension probed on its own row (`ext`: a module a user does not import
# by name).  `prelude`: modules imported first in the same interpreter (their
# failure ignored); `check`: an expression evaluated after the import in both
# interpreters, which tells whether the package fell back to pure Python.
def _p(module, package, prelude=(), check=None, ext=False):
    return (module, package, tuple(prelude), check, ext)


PROBES = [_p(m, STDLIB) for m in (
    "asyncio", "_asyncio", "_socket", "select", "ssl", "_ssl", "_hashlib", "_posixsubprocess",
    "fcntl", "termios", "resource", "mmap", "_multiprocessing", "zlib", "_lzma", "_bz2",
    "_json", "_pickle", "_datetime", "_zoneinfo", "_decimal", "_uuid", "sqlite3", "_sqlite3",
    "ctypes", "_ctypes", "faulthandler", "readline", "_curses", "_tkinter")] + [
    _p("tideloop", TIDELOOP), _p("tideloop._core", TIDELOOP, ext=True),
    _p("uvloop", "uvloop"), _p("uvloop.loop", "uvloop", ext=True),
    _p("aiohttp", "aiohttp", check="aiohttp.http_parser.HttpRequestParser.__module__"),
    _p("aiohttp._http_parser", "aiohttp", ext=True), _p("aiohttp._http_writer", "aiohttp", ext=True),
    _p("aiohttp._websocket.reader_c", "aiohttp", ext=True), _p("aiohttp._websocket.mask", "aiohttp", ext=True),
    _p("yarl", "yarl", check="yarl._quoting._Quoter.__module__"),
    _p("yarl._quoting_c", "yarl", ext=True),
    _p("multidict", "multidict", check="multidict.MultiDict.__module__"),
    _p("multidict._multidict", "multidict", ext=True),
    _p("frozenlist", "frozenlist", check="frozenlist.FrozenList.__module__"),
    _p("frozenlist._frozenlist", "frozenlist", ext=True),
    _p("propcache", "propcache", check="propcache._helpers.under_cached_property.__module__"),
    _p("propcache._helpers_c", "propcache", ext=True),
    _p("aiosignal", "aiosignal"),
    _p("httptools", "httptools"), _p("httptools.parser.parser", "httptools", ext=True),
    _p("h11", "h11"), _p("uvicorn", "uvicorn"), _p("starlette", "starlette"),
    _p("fastapi", "fastapi"),
    _p("pydantic", "pydantic"), _p("pydantic_core", "pydantic-core", ext=True),
    _p("msgspec", "msgspec"), _p("orjson", "orjson"), _p("ujson", "ujson"),
    _p("msgpack", "msgpack", check="msgpack.Packer.__module__"),
    _p("msgpack._cmsgpack", "msgpack", ext=True),
    _p("asyncpg", "asyncpg"), _p("asyncpg.protocol.protocol", "asyncpg", ext=True),
    _p("psycopg", "psycopg", check="psycopg.pq.__impl__"),
    _p("psycopg_binary._psycopg", "psycopg-binary", prelude=["psycopg"], ext=True),
    _p("redis", "redis", check="redis.utils.HIREDIS_AVAILABLE"), _p("hiredis", "hiredis", ext=True),
    _p("websockets", "websockets", check="websockets.frames.apply_mask.__module__"),
    _p("websockets.speedups", "websockets", ext=True),
    _p("cryptography", "cryptography"), _p("cryptography.x509", "cryptography"),
    _p("cryptography.hazmat.bindings._rust", "cryptography", ext=True),
    _p("cffi", "cffi"), _p("_cffi_backend", "cffi", ext=True),
    _p("numpy", "numpy"), _p("lxml.etree", "lxml"),
    _p("yaml", "PyYAML", check="yaml.__with_libyaml__"), _p("yaml._yaml", "PyYAML", ext=True),
    _p("markupsafe", "MarkupSafe", check="markupsafe._escape_inner.__module__"),
    _p("markupsafe._speedups", "MarkupSafe", ext=True),
    _p("sqlalchemy", "SQLAlchemy"), _p("sqlalchemy.util._collections_cy", "SQLAlchemy", ext=True),
    _p("grpc", "grpcio"),
    _p("anyio", "anyio"), _p("sniffio", "sniffio"), _p("certifi", "certifi"),
    _p("charset_normalizer", "charset-normalizer"),
    _p("charset_normalizer.md", "charset-normalizer", ext=True),
    _p("idna", "idna"), _p("zstandard", "zstandard"), _p("zstandard.backend_c", "zstandard", ext=True),
    _p("brotli", "Brotli"), _p("_brotli", "Brotli", ext=True),
    _p("aiofiles", "aiofiles"), _p("httpx", "httpx"), _p("jinja2", "Jinja2"),
    _p("gunicorn", "gunicorn"),
]

# A package of PROBES that goes with another (the docs' table shows them
# together; pip may install it as the other's dependency).
PART_OF = {"pydantic-core": "pydantic", "psycopg-binary": "psycopg", "hiredis": "redis"}

# --- the child process -------------------------------------------------------
# argv: WHERE ("main" or "isolated"), SPEC (JSON: module, prelude, check), OUT.
# The import runs inside a try that writes its outcome to OUT as JSON, in the
# interpreter that imports, so the child process needs no API to carry an
# exception across; then (isolated) the interpreter is closed and a last line
# on stdout says how that went.  No OUT and a signal: the import crashed the
# process.
IMPORT_CODE = r'''
import json as _json
for _m in {prelude!r}:
    try:
        __import__(_m)
    except BaseException:
        pass
try:
    import importlib as _importlib
    _importlib.import_module({module!r})
except BaseException as _e:
    _t = type(_e)
    _r = {{"result": "error", "type": _t.__qualname__ if _t.__module__ == "builtins"
          else _t.__module__ + "." + _t.__qualname__, "detail": str(_e)[:2000], "causes": []}}
    _x = _e
    while len(_r["causes"]) < 5 and (_x.__cause__ or _x.__context__) is not None:
        _x = _x.__cause__ or _x.__context__
        _r["causes"].append(type(_x).__name__ + ": " + str(_x)[:500])
else:
    _r = {{"result": "ok"}}
    if {check!r}:
        try:
            _parts = {check!r}.split(".")
            for _i in range(2, len(_parts)):     # the modules the expression names
                try:
                    _importlib.import_module(".".join(_parts[:_i]))
                except ImportError:
                    break
            _r["check"] = repr(eval({check!r}, {{_parts[0]: __import__(_parts[0])}}))
        except BaseException as _e:
            _r["check"] = "error: " + type(_e).__name__
with open({out!r}, "w") as _f:
    _json.dump(_r, _f)
'''

CHILD = r'''
import json, sys
where, spec, out = sys.argv[1:4]
code = IMPORT_CODE.format(out=out, **json.loads(spec))
if where == "main":
    exec(compile(code, "<probe>", "exec"), {})
    sys.exit(0)
closing = "ok"
if sys.version_info >= (3, 14):
    from concurrent import interpreters
    interp = interpreters.create()
    try:
        interp.exec(code)
    except BaseException as e:
        closing = "exec: %s: %s" % (type(e).__name__, e)
    print('{"stage": "closing"}', flush=True)
    try:
        interp.close()
    except BaseException as e:
        closing = "close: %s: %s" % (type(e).__name__, e)
elif sys.version_info >= (3, 13):
    import _interpreters
    iid = _interpreters.create("isolated")
    exc = _interpreters.exec(iid, code)
    if exc is not None:
        closing = "exec: %s" % (exc.formatted,)
    print('{"stage": "closing"}', flush=True)
    try:
        _interpreters.destroy(iid)
    except BaseException as e:
        closing = "close: %s: %s" % (type(e).__name__, e)
elif sys.version_info >= (3, 12):
    import _xxsubinterpreters
    iid = _xxsubinterpreters.create(isolated=True)
    try:
        _xxsubinterpreters.run_string(iid, code)
    except BaseException as e:
        closing = "exec: %s: %s" % (type(e).__name__, e)
    print('{"stage": "closing"}', flush=True)
    try:
        _xxsubinterpreters.destroy(iid)
    except BaseException as e:
        closing = "close: %s: %s" % (type(e).__name__, e)
else:
    sys.exit("no isolated subinterpreters before Python 3.12")
print(json.dumps({"closing": closing}), flush=True)
'''


def child_code():
    return "IMPORT_CODE = " + repr(IMPORT_CODE) + "\n" + CHILD


def signal_name(returncode):
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def tail(text, n=8):
    return [ln for ln in (text or "").splitlines() if ln.strip()][-n:]


def reason(res):
    """The line of an import error that says why: the message's first line,
    unless another line of it or of its causes names subinterpreters (numpy
    wraps the refusal in advice: "Original error was: ...")."""
    lines = [res["message"]] + [ln for text in [res.get("detail")] + res.get("causes", [])
                                for ln in (text or "").splitlines()]
    for ln in lines:
        if "subinterpreter" in ln:
            ln = re.sub(r"^(Original error was:|\w*(Error|Exception):)\s*", "", ln.strip())
            return ln
    return res["message"]


def classify(returncode, out_text, stdout, stderr, timed_out=False, timeout=None):
    """One probe's outcome from what its child left: its exit status, the
    JSON the importing interpreter wrote (None: none), its stdout and stderr.

    {"result": "ok"} or {"result": "error", "type", "message", "detail"} from
    the import; {"result": "crash", "signal", "when": "import"} if the
    process died before the import finished; {"result": "timeout"}; and an
    import that finished but was followed by a crash or a failed close has
    "after": {"signal", "when": "close" (of the interpreter) or "exit"} or
    {"error": why the close failed}.
    """
    lines = (stdout or "").splitlines()
    closing = None
    for line in lines:
        if line.startswith('{"closing"'):
            closing = json.loads(line)["closing"]
    res = None
    if out_text:
        try:
            res = json.loads(out_text)
        except ValueError:
            res = None
    if res is not None and res.get("result") == "error":
        res["message"] = first_line(res.get("detail")) or res["type"]
        why = reason(res)
        if why != res["message"]:
            res["reason"] = why
    after = None
    if timed_out:
        if res is None:
            return {"result": "timeout", "seconds": timeout}
        after = {"timeout": timeout}
    elif returncode is not None and returncode < 0:
        if res is None:
            return {"result": "crash", "signal": signal_name(returncode), "when": "import",
                    "stderr": tail(stderr)}
        when = ("exit" if closing is not None else "close" if '{"stage": "closing"}' in lines
                else "import")
        after = {"signal": signal_name(returncode), "when": when, "stderr": tail(stderr)}
    else:
        if res is None:
            return {"result": "probe failed", "returncode": returncode,
                    "message": (tail(stderr, 1) or [closing or "no output"])[0],
                    "stderr": tail(stderr)}
        if returncode:
            after = {"exit": returncode, "stderr": tail(stderr)}
        elif closing not in (None, "ok"):
            after = {"error": first_line(closing)}
    if after:
        res["after"] = after
    return res


def probe(python, spec, where, env, timeout):
    """Import PROBES' `spec` in a fresh child of `python`: classify()'s dict."""
    module, _, prelude, check, _ = spec
    spec = json.dumps({"module": module, "prelude": list(prelude), "check": check})
    with tempfile.TemporaryDirectory(prefix="tl-probe-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [python, "-X", "faulthandler", "-c", child_code(), where, spec, out]
        timed_out = False
        try:
            p = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True,
                               errors="replace", timeout=timeout)
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            timed_out, rc = True, None
            stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
        out_text = None
        if os.path.exists(out):
            with open(out) as f:
                out_text = f.read()
        return classify(rc, out_text, stdout, stderr, timed_out, timeout)


# --- pip ---------------------------------------------------------------------

def pip_error_line(output):
    """pip's last error line: the last ``ERROR:``/``error:`` line, else the last line."""
    lines = [ln.strip() for ln in (output or "").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"(ERROR|error)\b", ln):
            return ln
    return lines[-1] if lines else ""


def pip_built(output):
    """The distributions pip built from source in this install."""
    m = re.findall(r"^Successfully built (.+)$", output or "", re.M)
    return sorted({name for line in m for name in line.split()})


def install(python, requirement, env, timeout, logf):
    """pip install one requirement: {"status", "seconds", "built", "error"}."""
    t0 = time.monotonic()
    cmd = [python, "-m", "pip", "install", "--prefer-binary", requirement]
    try:
        p = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True,
                           text=True, errors="replace", timeout=timeout)
        output, ok = p.stdout + p.stderr, p.returncode == 0
    except subprocess.TimeoutExpired as e:
        output = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
                  else (e.stdout or "")) + f"\nERROR: pip timed out after {timeout} s\n"
        ok = False
    with open(logf, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n{output}")
    rec = {"status": "installed" if ok else "not installable",
           "seconds": round(time.monotonic() - t0, 1)}
    built = pip_built(output)
    if built:
        rec["built_from_source"] = built
    if not ok:
        rec["error"] = pip_error_line(output)
        rec["tail"] = tail(output, 12)
    return rec


# --- the result file ---------------------------------------------------------

def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def module_record(spec, installed, main, isolated):
    module, package, _, check, ext = spec
    version = None
    if package == TIDELOOP:
        version = installed.get(TIDELOOP)
    elif package != STDLIB:
        version = installed.get(normalize(package))
    rec = {"module": module, "package": package, "version": version,
           "main": main, "isolated": isolated}
    if check:
        rec["check"] = check
    if ext:
        rec["ext"] = True
    return rec


def fell_back(rec):
    """(check, its value here, in the main interpreter) if the module imported
    in both but its check differs: it fell back to its pure-Python code."""
    main, iso = rec["main"], rec["isolated"]
    if rec.get("check") and main.get("result") == iso.get("result") == "ok" \
            and main.get("check") != iso.get("check"):
        return rec["check"], iso.get("check"), main.get("check")
    return None


def verdict(rec, packages=None):
    """A module's outcome in one interpreter, as one word: "ok", "refuses"
    (an error the main interpreter does not have), "crash" (the process died,
    or hung), "not installable" (pip could not install its package), "absent"
    (not in this build or not installed), "fails" (fails in the main
    interpreter too)."""
    main, iso = rec["main"], rec["isolated"]
    if main.get("result") != "ok":
        if main.get("type") == "ModuleNotFoundError":
            packages = packages or {}
            pkg = packages.get(rec["package"]) or packages.get(
                PART_OF.get(rec["package"]), {})
            return "not installable" if pkg.get("status") == "not installable" else "absent"
        return "fails"
    if iso.get("result") in ("crash", "timeout") or "signal" in iso.get("after", {}) \
            or "timeout" in iso.get("after", {}):
        return "crash"
    if iso.get("result") == "ok":
        return "ok"
    return "refuses"


def merge(doc, version, record, command):
    """The result file with one interpreter's record put in (replaced)."""
    doc = dict(doc or {})
    doc["tool"] = "tools/interpreter_imports.py"
    doc["command"] = command
    interps = dict(doc.get("interpreters") or {})
    interps[version] = record
    doc["interpreters"] = {k: interps[k] for k in sorted(
        interps, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))}
    return doc


def write_json(path, doc):
    """Write atomically: a temporary file in the same directory, renamed."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".interpreter-imports-", suffix=".json", dir=d)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)       # a file like the others, not mkstemp's 0600
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def summary(record):
    """Lines for the terminal: what refuses, crashes or is missing."""
    counts = {}
    lines = []
    for rec in record["modules"]:
        v = verdict(rec, record.get("packages"))
        counts[v] = counts.get(v, 0) + 1
        if v == "ok" and fell_back(rec):
            v = "ok, fell back"
        if v == "ok" and "after" not in rec["isolated"]:
            continue
        iso = rec["isolated"]
        what = {"refuses": f"{iso.get('type')}: {iso.get('reason') or iso.get('message')}",
                "ok, fell back": "%s is %s (main interpreter: %s)" % (fell_back(rec) or ("",) * 3),
                "crash": iso.get("signal") or iso.get("after", {}).get("signal")
                or iso.get("result"),
                "fails": f"{rec['main'].get('type')}: {rec['main'].get('message')}",
                "absent": rec["main"].get("message"),
                "not installable": (record.get("packages") or {}).get(rec["package"], {}).get(
                    "error"),
                }.get(v, "")
        if v == "ok":
            what = f"after the import: {iso['after']}"
        elif "after" in iso:
            what += f"; after the import: {iso['after']}"
        lines.append(f"  {v:16} {rec['module']:36} {what}")
    head = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return [head] + lines


# --- one interpreter ---------------------------------------------------------

def log(msg):
    print(f"[interp-imports {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def find_python(version):
    p = subprocess.run(["bash", os.path.join(HERE, "python_from_debian.sh"), version],
                       capture_output=True, text=True)
    lines = p.stdout.strip().splitlines()
    if p.returncode or not lines:
        raise SystemExit(f"python_from_debian.sh {version} failed: "
                         f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return lines[-1]


INSTALLED_CODE = r'''
import json, sys, importlib.metadata as md
print(json.dumps({"version": sys.version, "pip": md.version("pip"),
                  "installed": {d.metadata["Name"]: d.version for d in md.distributions()}}))
'''

EXTENSIONS_CODE = r'''
import json, importlib.metadata as md
found = {}
for d in md.distributions():
    for f in d.files or ():
        head, _, base = str(f).rpartition("/")
        if base.endswith(".so") and head and not head.startswith("..") and ".libs" not in head:
            mod = head.replace("/", ".") + "." + base.split(".")[0]
            found.setdefault(d.metadata["Name"], []).append(mod)
print(json.dumps(found))
'''


def api_name(version):
    """What makes the isolated interpreter on this version (the child's choice)."""
    v = tuple(int(x) for x in version.split()[0].split(".")[:2])
    return ("concurrent.interpreters.create()" if v >= (3, 14) else
            "_interpreters.create('isolated')" if v >= (3, 13) else
            "_xxsubinterpreters.create(isolated=True)")


def run_interpreter(version, python, args, env_base):
    stages = {}
    t0 = time.monotonic()
    venv = os.path.join(CACHE, version)
    vpy = os.path.join(venv, "bin", "python")
    logf = os.path.join(CACHE, f"{version}.log")
    os.makedirs(CACHE, exist_ok=True)
    env = dict(env_base)
    if not (args.reuse_venv and os.path.exists(vpy)):
        open(logf, "w").close()
        shutil.rmtree(venv, ignore_errors=True)
        log(f"{version}: venv in {venv} ({python})")
        subprocess.run([python, "-m", "venv", venv], check=True, env=env)
        stages["venv"] = round(time.monotonic() - t0, 1)
        packages = {}
        t1 = time.monotonic()
        for req in BUILD_PACKAGES + PACKAGES:
            rec = install(vpy, req, env, args.install_timeout, logf)
            packages[req] = rec
            log(f"{version}: pip install {req}: {rec['status']} in {rec['seconds']} s"
                + (f" (built {', '.join(rec['built_from_source'])})"
                   if rec.get("built_from_source") else "")
                + (f": {rec['error']}" if rec.get("error") else ""))
        stages["install"] = round(time.monotonic() - t1, 1)
        with open(os.path.join(venv, "packages.json"), "w") as f:
            json.dump(packages, f)
    else:
        log(f"{version}: reusing {venv}")
        with open(os.path.join(venv, "packages.json")) as f:
            packages = json.load(f)

    t1 = time.monotonic()
    b = subprocess.run([vpy, "setup.py", "build_ext", "--inplace"], cwd=REPO,
                       env=dict(env, TIDELOOP_DEV="1"), capture_output=True, text=True)
    with open(logf, "a") as f:
        f.write(f"\n$ TIDELOOP_DEV=1 {vpy} setup.py build_ext --inplace\n{b.stdout}{b.stderr}")
    packages[TIDELOOP] = {"status": "installed" if b.returncode == 0 else "not installable",
                          "seconds": round(time.monotonic() - t1, 1), "how": "built in place"}
    if b.returncode:
        packages[TIDELOOP]["error"] = pip_error_line(b.stdout + b.stderr)
    stages["build_tideloop"] = round(time.monotonic() - t1, 1)
    log(f"{version}: tideloop built in place: {packages[TIDELOOP]['status']}")

    env["PYTHONPATH"] = os.path.join(REPO, "src")
    info = json.loads(subprocess.run([vpy, "-c", INSTALLED_CODE], env=env, check=True,
                                     capture_output=True, text=True).stdout)
    installed = {normalize(k): v for k, v in info["installed"].items()}
    tl = subprocess.run([vpy, "-c", "import tideloop; print(tideloop.__version__)"], env=env,
                        capture_output=True, text=True)
    if tl.returncode == 0:
        installed[TIDELOOP] = tl.stdout.strip()

    t1 = time.monotonic()
    probes = [p for p in PROBES if not args.modules or p[0] in args.modules]
    modules = []
    for spec in probes:
        module = spec[0]
        main = probe(vpy, spec, "main", env, args.probe_timeout)
        iso = probe(vpy, spec, "isolated", env, args.probe_timeout)
        rec = module_record(spec, installed, main, iso)
        modules.append(rec)
        v = verdict(rec, packages)
        if v in ("absent", "not installable", "fails"):
            log(f"{version}: {module}: {v}: {main.get('message')}")
        elif fell_back(rec):
            log(f"{version}: {module}: ok, fell back: %s is %s (main interpreter: %s)"
                % fell_back(rec))
        if v not in ("ok", "absent", "not installable", "fails") or "after" in iso:
            log(f"{version}: {module}: {v}: "
                f"{iso.get('reason') or iso.get('message') or iso.get('signal') or ''}"
                + (f" (after the import: {iso['after']})" if "after" in iso else ""))
    stages["probe"] = round(time.monotonic() - t1, 1)

    ext = json.loads(subprocess.run([vpy, "-c", EXTENSIONS_CODE], env=env,
                                    capture_output=True, text=True).stdout or "{}")
    probed = {p[0] for p in PROBES}
    not_probed = {dist: sorted(m for m in mods if m not in probed)
                  for dist, mods in sorted(ext.items())}
    stages["total"] = round(time.monotonic() - t0, 1)
    return {
        "version": info["version"],
        "date": datetime.date.today().isoformat(),
        "executable": python.replace(os.path.expanduser("~"), "~"),
        "api": api_name(info["version"]),
        "pip": info["pip"],
        "packages": packages,
        "installed": dict(sorted(info["installed"].items(), key=lambda kv: kv[0].lower())),
        "modules": modules,
        "extensions_not_probed": {d: m for d, m in not_probed.items() if m},
        "seconds": stages,
    }


def parse_python(spec):
    version, _, path = spec.partition("=")
    if not re.fullmatch(r"3\.\d+", version):
        raise argparse.ArgumentTypeError(f"{spec!r}: VERSION is 3.N (then =PATH if not Debian's)")
    return version, path or None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", type=parse_python, metavar="VERSION[=PATH]",
                    help="an interpreter to probe (repeatable; default 3.14 and 3.15 from "
                         "tools/python_from_debian.sh)")
    ap.add_argument("--json", default=DEFAULT_JSON)
    ap.add_argument("--modules", type=lambda s: set(s.split(",")),
                    help="probe only these modules (a quick look; the file keeps the rest)")
    ap.add_argument("--reuse-venv", action="store_true",
                    help="keep the venv (and its packages) of an earlier run")
    ap.add_argument("--install-timeout", type=float, default=1200)
    ap.add_argument("--probe-timeout", type=float, default=120)
    args = ap.parse_args(argv)
    pythons = args.python or [(v, None) for v in DEFAULT_VERSIONS]
    command = "python tools/interpreter_imports.py" + "".join(
        f" --python {v}" + ("=PATH" if p else "") for v, p in (args.python or []))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHON_GIL",
                        "PYTHONFAULTHANDLER", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    t0 = time.monotonic()
    for version, path in pythons:
        t1 = time.monotonic()
        python = path or find_python(version)
        found = round(time.monotonic() - t1, 1)
        record = run_interpreter(version, python, args, env)
        record["seconds"] = {"find_python": found, **record["seconds"]}
        if args.modules:   # a partial run updates those rows only
            old = read_json(args.json).get("interpreters", {}).get(version)
            if old:
                new = {r["module"]: r for r in record["modules"]}
                record["modules"] = [new.pop(r["module"], r) for r in old["modules"]] + \
                    list(new.values())
        write_json(args.json, merge(read_json(args.json), version, record, command))
        print(f"\n{version}: {record['version'].split()[0]}: " + "\n".join(summary(record)))
        print(f"{version}: seconds: " + ", ".join(f"{k} {v}" for k, v in
                                                  record["seconds"].items()), flush=True)
    log(f"wrote {os.path.relpath(args.json)} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
