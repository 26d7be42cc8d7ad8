"""Packaging as a user meets it.

Builds the sdist and, from that sdist, the wheel (``python -m build``, with
build isolation: setuptools comes from PyPI through pip), then checks what a
user gets: the metadata (SPDX license, classifiers, Requires-Python, project
URLs, the README as the long description), what the sdist carries (everything
its tests, benchmarks and stress runs need, no build artefacts) and what the
wheel carries (the built extension and the Python files and stubs, no C
sources).  Last, the sdist is unpacked, installed into a fresh venv with its
``test`` extra, and a few of its own tests run from the unpacked tree against
that installation: the sdist is self-sufficient.

The slow work is done once per module, by two module-scoped fixtures (module
fixtures are set up before conftest's per-test watchdog is armed; every
subprocess has its own timeout).  It works on a copy of the source tree, so
the checkout is never written to (no src/*.egg-info, no build/).

Building needs a C compiler, the Python headers and PyPI through pip.  Where
that is impossible, TIDELOOP_SKIP_PACKAGING=1 skips this module, visibly
(``-ra`` lists the reason); nothing else skips it: a failed build fails.
"""
import email.parser
import email.policy
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_VAR = "TIDELOOP_SKIP_PACKAGING"

pytestmark = [
    pytest.mark.packaging,
    pytest.mark.skipif(
        os.environ.get(SKIP_VAR) == "1",
        reason=f"{SKIP_VAR}=1: building the sdist and the wheel is impossible here",
    ),
]

CLASSIFIERS = [
    "Development Status :: 4 - Beta",
    "Framework :: AsyncIO",
    "Intended Audience :: Developers",
    "Operating System :: POSIX :: Linux",
    "Programming Language :: C",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3 :: Only",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
    "Programming Language :: Python :: 3.14",
    "Programming Language :: Python :: 3.15",
    "Programming Language :: Python :: Implementation :: CPython",
    "Topic :: Software Development :: Libraries",
    "Topic :: System :: Networking",
]
REPO_URL = "https://github.com/tideloop/tideloop"
PROJECT_URLS = {
    "Homepage": REPO_URL,
    "Documentation": f"{REPO_URL}/blob/main/README.md",
    "Source": REPO_URL,
    "Issues": f"{REPO_URL}/issues",
}

# Copied with the tree: none of it is source, and some of it is big.
_COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".hypothesis", ".pytest_cache", ".benchmarks", ".venv", "build",
    "dist", "*.egg-info")
# Planted in the copy, so that the sdist's exclusions are checked whatever
# happens to lie in the checkout: none of these may reach the sdist.
_ARTEFACTS = [
    "bench/bin/loadgen",
    "build/temp.linux-x86_64-cpython-311/src/tideloop/_core/loop.o",
    "dist/tideloop-0.0.0.tar.gz",
    "src/tideloop/_core/loop.o",
    "src/tideloop/_core.cpython-399-x86_64-linux-gnu.so",
    "tests/__pycache__/conftest.cpython-311-pytest-9.0.3.pyc",
    "stress/__pycache__/run.cpython-311.pyc",
]
# Children build and test normally, whatever this run is under (-X dev,
# the debug allocator, sanitizers), and see no tideloop but their own.
_ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "PYTHONMALLOC", "PYTHONDEVMODE",
             "PYTHONASYNCIODEBUG", "PYTHONSTARTUP", "LD_PRELOAD", "ASAN_OPTIONS",
             "UBSAN_OPTIONS", "TIDELOOP_SANITIZE", "TIDELOOP_SANITIZE_RUN",
             "VIRTUAL_ENV")


def _env():
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _run(cmd, *, cwd, timeout, what):
    try:
        p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        pytest.fail(f"{what}: timed out after {timeout} s\n{(out or '')[-6000:]}",
                    pytrace=False)
    if p.returncode != 0:
        errors = [ln for ln in p.stdout.splitlines() if re.search(r"(?i)\berror\b", ln)]
        pytest.fail(f"{what}: exit status {p.returncode}\n$ {' '.join(map(str, cmd))}\n"
                    + "\n".join(errors[:20]) + "\n--- output tail:\n" + p.stdout[-3000:]
                    + f"\n(if building is impossible on this machine, set {SKIP_VAR}=1)",
                    pytrace=False)
    return p


def _metadata(text):
    return email.parser.Parser(policy=email.policy.compat32).parsestr(text)


def _expected_sdist_files(tree):
    """What the sdist must carry, listed from the (copied) source tree."""
    want = {"LICENSE", "README.md", "MANIFEST.in", "setup.py", "pyproject.toml"}
    globs = [
        "src/tideloop/*.py", "src/tideloop/*.pyi", "src/tideloop/py.typed",
        "src/tideloop/_core/*.c", "src/tideloop/_core/*.h",
        "tests/**/*.py", "tests/conformance/*",
        "bench/*.py", "bench/*.c", "bench/*.h", "bench/README.md",
        "stress/**/*.py", "tools/*.sh", "tools/*.py",
    ]
    for g in globs:
        want.update(p.relative_to(tree).as_posix()
                    for p in tree.glob(g) if p.is_file())
    return want


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """Build the sdist, then the wheel from the sdist, from a copy of the tree."""
    work = tmp_path_factory.mktemp("packaging")
    # cwd is never the checkout: its build/ directory would shadow the
    # 'build' package for `python -m build`.
    _run([sys.executable, "-m", "build", "--version"], cwd=work, timeout=60,
         what="python -m build (the 'build' package: pip install '.[test]')")
    tree = work / "tree"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=_COPY_IGNORE)
    for rel in _ARTEFACTS:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(b"not source\n")
    out = work / "dist"
    _run([sys.executable, "-m", "build", "--outdir", out, tree],
         cwd=work, timeout=600, what="python -m build (sdist, then wheel from it)")
    sdists = sorted(out.glob("tideloop-*.tar.gz"))
    wheels = sorted(out.glob("tideloop-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(os.listdir(out))
    sdist, wheel = sdists[0], wheels[0]

    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        top = names[0].split("/")[0]
        assert all(n == top or n.startswith(top + "/") for n in names), names
        sdist_files = {n[len(top) + 1:] for n in names
                       if n != top and tf.getmember(n).isfile()}
        sdist_meta = tf.extractfile(f"{top}/PKG-INFO").read().decode()
        sdist_license = tf.extractfile(f"{top}/LICENSE").read().decode()
    with zipfile.ZipFile(wheel) as zf:
        wheel_files = set(zf.namelist())
        info = next(n.split("/")[0] for n in wheel_files
                    if n.split("/")[0].endswith(".dist-info"))
        wheel_meta = zf.read(f"{info}/METADATA").decode()
        wheel_license = (zf.read(f"{info}/licenses/LICENSE").decode()
                         if f"{info}/licenses/LICENSE" in wheel_files else None)
    return {
        "tree": tree, "work": work, "sdist": sdist, "wheel": wheel, "top": top,
        "sdist_files": sdist_files, "wheel_files": wheel_files, "dist_info": info,
        "meta": {"sdist": _metadata(sdist_meta), "wheel": _metadata(wheel_meta)},
        "license": {"sdist": sdist_license, "wheel": wheel_license},
        "readme": (tree / "README.md").read_text(),
    }


@pytest.fixture(params=["sdist", "wheel"])
def meta(dists, request):
    return dists["meta"][request.param]


# --- metadata -----------------------------------------------------------------


def test_license_is_an_spdx_expression_with_its_file(meta, dists):
    assert meta["Metadata-Version"] in ("2.4", "2.5"), meta["Metadata-Version"]
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    # PEP 639: no legacy License field, no license classifier beside an expression.
    assert meta["License"] is None
    assert not [c for c in meta.get_all("Classifier") if c.startswith("License ::")]
    for kind in ("sdist", "wheel"):
        text = dists["license"][kind]
        assert text is not None, f"LICENSE is missing from the {kind}"
        assert text.startswith("MIT License")
        assert "Copyright (c) 2026 the tideloop authors" in text


def test_classifiers_and_keywords(meta):
    assert meta.get_all("Classifier") == CLASSIFIERS
    keywords = [k.strip() for k in meta["Keywords"].split(",")]
    assert "asyncio" in keywords


def _ci_minor_versions():
    """The minor versions CI runs the suite on: tools/matrix.py's legs."""
    import ast
    tree = ast.parse((ROOT / "tools" / "matrix.py").read_text())
    legs = next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "LEGS" for t in node.targets))
    return sorted({tuple(int(x) for x in leg.rstrip("t").split(".")[:2]) for leg in legs})


def test_versions_are_the_ones_ci_tests(meta):
    minors = _ci_minor_versions()
    listed = sorted(tuple(int(x) for x in c.rsplit(" ", 1)[1].split("."))
                    for c in meta.get_all("Classifier")
                    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert listed == minors
    from packaging.specifiers import SpecifierSet
    low, high = minors[0], minors[-1]
    assert SpecifierSet(meta["Requires-Python"]) == \
        SpecifierSet(f">=3.{low[1]}, <3.{high[1] + 1}")


def test_requires_python(meta):
    assert ">=3.11" in meta["Requires-Python"].split(",")
    assert meta["Name"] == "tideloop"
    assert meta["Summary"]


def test_project_urls(meta):
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls == PROJECT_URLS


def test_test_extra_installs_what_the_tests_use(meta):
    assert "test" in meta.get_all("Provides-Extra")
    reqs = [r for r in meta.get_all("Requires-Dist") if 'extra == "test"' in r]
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs}
    assert {"pytest", "hypothesis", "build"} <= names, reqs


def _extra(meta, name):
    reqs = [r for r in meta.get_all("Requires-Dist") if f'extra == "{name}"' in r]
    return sorted(re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs)


def test_bench_extra_is_what_the_main_benchmark_needs(meta):
    """pip install ".[bench]" && python -m tideloop bench: uvloop to compare
    with, not the app benchmark's frameworks and clients."""
    assert _extra(meta, "bench") == ["uvloop"]


def test_bench_apps_extra_has_the_app_benchmark_packages(meta):
    assert "bench-apps" in meta.get_all("Provides-Extra")
    assert {"uvloop", "aiohttp", "uvicorn", "starlette", "gunicorn", "asyncpg", "redis",
            "websockets"} <= set(_extra(meta, "bench-apps"))


def test_plot_extra_is_matplotlib(meta):
    """The benchmarks' --plot names this extra when matplotlib is missing."""
    assert "plot" in meta.get_all("Provides-Extra")
    reqs = [r for r in meta.get_all("Requires-Dist") if 'extra == "plot"' in r]
    assert [re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs] == ["matplotlib"]


def test_long_description_is_the_readme_starting_with_the_intro(meta, dists):
    assert meta["Description-Content-Type"] == "text/markdown"
    desc = meta.get_payload()
    assert desc.strip() == dists["readme"].strip()
    # On PyPI the page must say first what tideloop is, then how to install
    # it: the title, an opening paragraph "tideloop is ...", and "## Install"
    # as the first section, before any command or code.
    lines = desc.lstrip().splitlines()
    assert lines[0].strip() == "# tideloop", lines[0]
    body = "\n".join(lines[1:])
    sections = re.split(r"(?m)^## ", body)
    intro = sections[0].strip()
    assert intro.startswith("tideloop is ") and "asyncio" in intro and "```" not in intro, (
        "README.md must open, right under '# tideloop', with a paragraph 'tideloop is ...' "
        f"(no code before '## Install'); it opens with:\n{intro[:300]}")
    assert len(sections) > 1, "README.md has no ## sections"
    first = sections[1].splitlines()[0].strip()
    assert first == "Install", f"README.md's first section must be '## Install', not {first!r}"
    install = sections[1]
    for needed in ("python3-dev", "build-essential", "pip install ."):
        assert needed in install, f"## Install does not mention {needed!r}"


# --- contents -----------------------------------------------------------------


def test_sdist_carries_what_its_tests_need(dists):
    files = dists["sdist_files"]
    required = {
        "LICENSE", "README.md", "setup.py", "pyproject.toml", "MANIFEST.in",
        "tests/conftest.py", "tests/loop_helpers.py", "tests/net_helpers.py",
        "tests/compat/test_public_api.py", "tests/tooling/test_packaging.py",
        "tests/conformance/run.py", "tests/conformance/conftest.py",
        "tests/conformance/child.py", "tests/conformance/standin.py",
        "tests/conformance/known_failures.txt",
        "bench/README.md", "stress/run.py", "tools/sanitize.sh", "tools/memcheck.sh",
        "src/tideloop/__init__.py", "src/tideloop/__init__.pyi", "src/tideloop/py.typed",
        "src/tideloop/_version.py", "src/tideloop/_core/loop.c",
        "src/tideloop/_core/internal.h",
    }
    # ...and whatever else the tree has in those places (new tests, new C files).
    required |= _expected_sdist_files(dists["tree"])
    required -= set(_ARTEFACTS)
    missing = sorted(required - files)
    assert not missing, f"missing from the sdist: {missing}"
    assert any(f.startswith("bench/") and f.endswith(".c") for f in files)
    assert any(f.startswith("bench/") and f.endswith(".py") for f in files)


def test_sdist_has_no_build_artefacts(dists):
    files = dists["sdist_files"]
    bad = sorted(f for f in files
                 if f.endswith((".so", ".o", ".a", ".pyc", ".pyo"))
                 or "__pycache__/" in f
                 or f.startswith(("bench/bin/", "build/", "dist/", ".git/")))
    assert not bad, f"build artefacts in the sdist: {bad}"
    for rel in _ARTEFACTS:
        assert rel not in files


def test_wheel_ships_the_extension_and_python_files_not_c_sources(dists):
    files = dists["wheel_files"]
    for rel in ("tideloop/__init__.py", "tideloop/__init__.pyi", "tideloop/py.typed",
                "tideloop/_version.py", "tideloop/__main__.py"):
        assert rel in files, f"{rel} missing from the wheel"
    ext = [f for f in files if re.fullmatch(r"tideloop/_core\.[^/]*\.so", f)]
    assert len(ext) == 1, sorted(files)
    c_files = sorted(f for f in files if f.endswith((".c", ".h")))
    assert not c_files, f"C sources in the wheel: {c_files}"
    # src/tideloop/_core/ is the extension's source directory, not a package.
    core_dir = sorted(f for f in files if f.startswith("tideloop/_core/"))
    assert not core_dir, f"tideloop/_core/ installed as a package: {core_dir}"
    assert f"{dists['dist_info']}/licenses/LICENSE" in files
    top = {f.split("/")[0] for f in files}
    assert top == {"tideloop", dists["dist_info"]}, top


def test_wheel_ships_the_micro_benchmark_only(dists):
    """``python -m tideloop bench`` is in the wheel; the network, I/O and app
    benchmarks, their child-process tooling and the plotting stay in the
    source checkout's bench/ package."""
    files = dists["wheel_files"]
    bench = sorted(f for f in files if f.startswith("tideloop/_bench/"))
    assert bench == ["tideloop/_bench/__init__.py", "tideloop/_bench/__main__.py",
                     "tideloop/_bench/harness.py",
                     "tideloop/_bench/micro.py"], bench
    extra = sorted(f for f in files if re.search(r"(?i)plot|procs|loadgen|echo_server", f))
    assert not extra, f"benchmark tooling in the wheel: {extra}"


# --- the sdist on its own -------------------------------------------------------


@pytest.fixture(scope="module")
def sdist_install(dists):
    """Install the sdist (with its test extra) into a fresh venv and unpack it."""
    work = dists["work"]
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=work, timeout=300,
         what="python -m venv")
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q",
          f"tideloop[test] @ {dists['sdist'].as_uri()}"],
         cwd=work, timeout=900, what="pip install <sdist>[test] into a fresh venv")
    unpacked = work / "unpacked"
    with tarfile.open(dists["sdist"]) as tf:
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(unpacked, **kw)
    return py, unpacked / dists["top"]


def test_sdist_installs_and_its_own_tests_pass(sdist_install):
    py, src = sdist_install
    venv = py.parents[1]
    where = _run([py, "-c", "import tideloop, tideloop._core as c; "
                  "print(tideloop.__file__); print(c.__file__)"],
                 cwd=src, timeout=60, what="import tideloop from the venv")
    paths = [Path(p) for p in where.stdout.split()]
    assert len(paths) == 2 and all(venv in p.parents for p in paths), where.stdout
    assert not list((src / "src" / "tideloop").glob("_core*.so"))
    p = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
              "tests/compat/test_public_api.py"],
             cwd=src, timeout=300, what="the unpacked sdist's tests/compat/test_public_api.py")
    m = re.search(r"(\d+) passed", p.stdout)
    assert m and int(m.group(1)) > 0, p.stdout[-2000:]
    assert not re.search(r"\d+ (failed|error)", p.stdout), p.stdout[-4000:]
