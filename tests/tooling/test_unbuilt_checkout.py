"""Importing a checkout whose extension is not built says so.

The C sources live in src/tideloop/_core/, the extension's own name: without
the built extension that directory would be imported as a namespace package
and the first use of the core would fail with an AttributeError far from the
cause.  The package is copied without any built extension to a directory of
its own and imported in a child.
"""
import shutil
import subprocess
import sys
from pathlib import Path

from loop_helpers import SRC_DIR, child_env

CHILD = """\
import sys
try:
    import tideloop
except ImportError as exc:
    print("ImportError", exc.name)
    print(exc)
else:
    print("imported", tideloop.__file__)
"""


def _unbuilt_copy(tmp_path):
    dest = tmp_path / "tideloop"
    shutil.copytree(SRC_DIR / "tideloop", dest,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    assert not list(dest.rglob("*.so"))
    assert (dest / "_core").is_dir()        # the C sources' directory is there
    return tmp_path


def _import_in_child(path):
    return subprocess.run([sys.executable, "-I", "-c",
                           f"import sys; sys.path.insert(0, {str(path)!r})\n" + CHILD],
                          capture_output=True, text=True, timeout=60, cwd=path)


def test_unbuilt_checkout_import_says_build_it(tmp_path):
    out = _import_in_child(_unbuilt_copy(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "ImportError tideloop._core", out.stdout
    assert "the extension is not built: run pip install ." in lines[1]
    assert "python setup.py build_ext --inplace" in lines[1]


def test_built_copy_still_imports(tmp_path):
    """The check does not refuse a tree that has its extension (the one the
    tests use: the in-place build, else the installed package's)."""
    ext = subprocess.run([sys.executable, "-c", "import tideloop._core as c; print(c.__file__)"],
                         capture_output=True, text=True, timeout=60, env=child_env())
    assert ext.returncode == 0, ext.stderr
    ext = Path(ext.stdout.strip())
    path = _unbuilt_copy(tmp_path)
    shutil.copy2(ext, path / "tideloop" / ext.name)
    out = _import_in_child(path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("imported " + str(path / "tideloop")), out.stdout
