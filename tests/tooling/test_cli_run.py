"""`python -m tideloop run`: the program must not see a difference from the
plain interpreter, apart from the loop.

Differential: every case runs as ``python X ARGS`` and as
``python -m tideloop run X ARGS`` (same interpreter, same cwd, same env) and
the outputs that matter are compared: what the program sees (__file__,
sys.argv, sys.path, its __main__ globals), tracebacks, the interpreter's
one-line errors and exit statuses. On the stock side of ``-m`` / directory /
zip cases the interpreter's own ``<frozen runpy>`` frames are removed before
comparing: the runner shows no runpy frames at all.
"""
import json
import os
import py_compile
import re
import subprocess
import sys
import textwrap
import zipfile

import pytest

from loop_helpers import child_env

TIMEOUT = 30

SHOW = """\
import asyncio, json, sys
async def _loop_class():
    loop = type(asyncio.get_running_loop())
    return f"{loop.__module__}.{loop.__qualname__}"
_g = dict(globals())
_main = sys.modules["__main__"]
print(json.dumps({
    "file": __file__,
    "argv": sys.argv,
    "path": sys.path,
    "globals": sorted(_g),
    "builtins": type(__builtins__).__name__,
    "loader": [type(__loader__).__name__, getattr(__loader__, "name", None)],
    "spec": None if __spec__ is None else [__spec__.name, __spec__.origin],
    "package": __package__,
    "cached": _g.get("__cached__"),
    "doc": __doc__,
    "main_is_me": _main.__dict__ is globals(),
    "loop": asyncio.run(_loop_class()),
}))
"""

ERR = """\
def f():
    raise ValueError("boom")
def g():
    try:
        f()
    except ValueError as e:
        raise RuntimeError("wrapped") from e
g()
"""

FILES = {
    "show.py": SHOW,
    "sub/show.py": SHOW,
    "dirapp/__main__.py": SHOW,
    "mod1.py": SHOW,
    "pkg/__init__.py": "",
    "pkg/__main__.py": SHOW,
    "pkg/sub.py": SHOW,
    "err.py": ERR,
    "errpkg/__init__.py": "",
    "errpkg/__main__.py": ERR,
    "errdir/__main__.py": ERR,
    "nomainpkg/__init__.py": "",
    "syn.py": "x = 1\ny = (\n",
    "badpkg/__init__.py": "raise ImportError('badpkg is broken')\n",
    "badpkg/mod.py": "",
    "kbi.py": "raise KeyboardInterrupt\n",
    "kbi_signal.py": "import signal\nsignal.raise_signal(signal.SIGINT)\n",
    "exit_msg.py": "import sys\nsys.exit('bye now')\n",
    "exit_3.py": "import sys\nsys.exit(3)\n",
    "exit_none.py": "raise SystemExit\n",
    "hook.py": textwrap.dedent("""\
        import sys, traceback
        def hook(t, v, tb):
            frames = [(f.filename, f.name) for f in traceback.extract_tb(tb)]
            print("HOOK", t.__name__, v, frames, file=sys.stderr)
            print("tb is v.__traceback__:", tb is v.__traceback__, file=sys.stderr)
        sys.excepthook = hook
        def f():
            1/0
        f()
    """),
    "hook_fails.py": textwrap.dedent("""\
        import sys
        def hook(t, v, tb):
            raise OSError("hook broke")
        sys.excepthook = hook
        1/0
    """),
    "at_exit.py": textwrap.dedent("""\
        import atexit, sys, traceback
        def report():
            print("atexit: __file__ in globals:", "__file__" in globals(), flush=True)
            print("atexit: main is this module:",
                  sys.modules["__main__"].__dict__ is globals(), flush=True)
            print("atexit: last_value:", repr(sys.last_value), flush=True)
            print("atexit: last_traceback:",
                  [(f.filename, f.name) for f in traceback.extract_tb(sys.last_traceback)],
                  flush=True)
        atexit.register(report)
        class Late:
            def __del__(self):
                print("finalizer ran", flush=True)
        late = Late()
        raise KeyboardInterrupt("ctrl-c")
    """),
}

ARGS = ["x", "-m", "--flag", "--", "-", "-c"]

# (id, what comes after 'python' / 'python -m tideloop run', interpreter flags)
LAYOUT_CASES = [
    ("script", ["show.py"], []),
    ("script-dot", ["./show.py"], []),
    ("script-dotdot", ["sub/../show.py"], []),
    ("script-subdir", ["sub//show.py"], []),
    ("script-absolute", ["<TMP>/sub/../show.py"], []),
    ("script-symlink", ["link.py"], []),
    ("script-safe-path", ["show.py"], ["-P"]),
    ("directory", ["dirapp"], []),
    ("directory-slash", ["./dirapp/"], []),
    ("directory-safe-path", ["dirapp"], ["-P"]),
    ("zipfile", ["app.zip"], []),
    ("module", ["-m", "mod1"], []),
    ("module-joined", ["-mmod1"], []),
    ("package", ["-m", "pkg"], []),
    ("submodule", ["-m", "pkg.sub"], []),
]

ERROR_CASES = [
    ("traceback", ["err.py"]),
    ("syntax-error", ["syn.py"]),
    ("pyc-script", ["err_compiled.pyc"]),
    ("keyboard-interrupt", ["kbi.py"]),
    ("sigint", ["kbi_signal.py"]),
    ("exit-message", ["exit_msg.py"]),
    ("exit-code", ["exit_3.py"]),
    ("exit-none", ["exit_none.py"]),
    ("excepthook", ["hook.py"]),
    ("excepthook-fails", ["hook_fails.py"]),
    ("atexit-after-interrupt", ["at_exit.py"]),
    ("module-traceback", ["-m", "err"]),
    ("package-traceback", ["-m", "errpkg"]),
    ("directory-traceback", ["errdir"]),
    ("parent-package-fails", ["-m", "badpkg.mod"]),
    ("missing-module", ["-m", "missing_module"]),
    ("missing-submodule", ["-m", "missing_pkg.sub"]),
    ("package-without-main", ["-m", "nomainpkg"]),
    ("directory-without-main", ["nomainpkg"]),
    ("empty-directory", ["emptydir"]),
    ("missing-script", ["missing.py"]),
    ("missing-script-in-dir", ["nodir/missing.py"]),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_run")
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "emptydir").mkdir()
    os.symlink("sub/show.py", root / "link.py")
    with zipfile.ZipFile(root / "app.zip", "w") as zf:
        zf.writestr("__main__.py", SHOW)
    py_compile.compile(str(root / "err.py"), cfile=str(root / "err_compiled.pyc"),
                       dfile=str(root / "err.py"), doraise=True)
    return root


def _run(cwd, argv):
    env = child_env()
    # Same conditions on both sides: no colour, no stray flags from the parent.
    # Buffered stdout as usual (output must survive the exits, SIGINT included).
    for name in ("PYTHONSAFEPATH", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUNBUFFERED"):
        env.pop(name, None)
    env.update(NO_COLOR="1", PYTHON_COLORS="0", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=TIMEOUT)


def _both(project, target, flags=()):
    target = [t.replace("<TMP>", str(project)) for t in target]
    stock = _run(project, [sys.executable, *flags, *target, *ARGS])
    run = _run(project, [sys.executable, *flags, "-m", "tideloop", "run", *target, *ARGS])
    return stock, run


_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+, in ')


def _without_runpy_frames(text):
    """Drop the frames of runpy (frozen, or runpy.py with its source lines)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        m = _FRAME.match(line)
        if m:
            f = m.group("file")
            skipping = f == "<frozen runpy>" or os.path.basename(f) == "runpy.py"
            if skipping:
                continue
        elif skipping and line.startswith("    "):
            continue
        else:
            skipping = False
        out.append(line)
    return "".join(out)


@pytest.mark.parametrize("target,flags", [c[1:] for c in LAYOUT_CASES],
                         ids=[c[0] for c in LAYOUT_CASES])
def test_program_sees_what_python_gives(project, target, flags):
    stock, run = _both(project, target, flags)
    assert stock.returncode == 0, stock.stderr
    assert (run.returncode, run.stderr) == (0, "")
    seen_stock = json.loads(stock.stdout)
    seen_run = json.loads(run.stdout)
    # The point of 'run': asyncio.run() gets a tideloop loop; stock gets asyncio's.
    assert seen_stock.pop("loop").startswith("asyncio.")
    assert seen_run.pop("loop").startswith("tideloop.")
    assert seen_run == seen_stock
    # Spelled out, for the record (both sides are equal by now):
    assert os.path.isabs(seen_run["file"])
    assert seen_run["argv"][1:] == ARGS
    assert seen_run["main_is_me"]
    if target[0].startswith("-m"):
        assert seen_run["argv"][0] == seen_run["file"]
    else:
        assert seen_run["argv"][0] == target[0].replace("<TMP>", str(project))


@pytest.mark.parametrize("target", [c[1] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_errors_and_exit_status_like_python(project, target):
    stock, run = _both(project, target)
    assert run.returncode == stock.returncode, run.stderr
    assert run.stdout == stock.stdout
    assert run.stderr == _without_runpy_frames(stock.stderr)
    # Nothing of the runner shows (the interpreter's own path may say anything).
    shown = run.stderr.replace(sys.executable, "<python>")
    assert "tideloop" not in shown
    assert "runpy" not in shown


def test_error_statuses_and_messages(project):
    """The facts the differential test relies on, checked on their own."""
    exe = sys.executable
    _, run = _both(project, ["missing.py"])
    assert run.returncode == 2
    assert run.stderr == (f"{exe}: can't open file {str(project / 'missing.py')!r}: "
                          "[Errno 2] No such file or directory\n")
    _, run = _both(project, ["-m", "missing_module"])
    assert (run.returncode, run.stderr) == (1, f"{exe}: No module named missing_module\n")
    _, run = _both(project, ["emptydir"])
    assert (run.returncode, run.stderr) == (
        1, f"{exe}: can't find '__main__' module in {str(project / 'emptydir')!r}\n")
    _, run = _both(project, ["kbi.py"])
    assert run.returncode == -2         # killed by SIGINT, as the interpreter does
    _, run = _both(project, ["err.py"])
    assert run.returncode == 1
    assert run.stderr.count("Traceback (most recent call last):") == 2
    assert f'  File "{project / "err.py"}", line 8, in <module>\n' in run.stderr
    assert "__main__.py" not in run.stderr
    _, run = _both(project, ["syn.py"])
    assert run.returncode == 1
    assert run.stderr.startswith(f'  File "{project / "syn.py"}", line 2\n')


def test_exit_message_and_code(project):
    _, run = _both(project, ["exit_msg.py"])
    assert (run.returncode, run.stderr) == (1, "bye now\n")
    _, run = _both(project, ["exit_3.py"])
    assert (run.returncode, run.stderr) == (3, "")


def test_run_without_private_runpy_helper(project):
    """runpy._run_module_as_main is private: without it the runner falls back
    on runpy.run_module / run_path."""
    code = textwrap.dedent("""\
        import runpy, sys
        del runpy._run_module_as_main
        from tideloop.__main__ import main
        sys.exit(main(sys.argv[1:]))
    """)
    env = child_env()
    base = [sys.executable, "-c", code, "run"]
    for target in (["-m", "mod1"], ["dirapp"]):
        out = subprocess.run(base + target + ["x"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT)
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout)
        assert seen["loop"].startswith("tideloop.")
        assert seen["argv"][1:] == ["x"]
        assert os.path.isabs(seen["file"]) and seen["file"].endswith(
            "mod1.py" if target[0] == "-m" else "__main__.py")
    out = subprocess.run(base + ["-m", "missing_module"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert (out.returncode, out.stderr) == (
        1, f"{sys.executable}: No module named missing_module\n")


def test_stdin_script_is_refused(project):
    out = _run(project, [sys.executable, "-m", "tideloop", "run", "-"])
    assert out.returncode == 2
    assert "not supported" in out.stderr


def test_run_needs_a_target(project):
    out = _run(project, [sys.executable, "-m", "tideloop", "run"])
    assert out.returncode == 2
    assert "SCRIPT" in out.stderr
