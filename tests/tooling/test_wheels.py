"""tools/wheels.py: the checks it makes on a repaired wheel (issue 14, part 6).

The real run (build, auditwheel repair, twine check, install into a fresh
venv, smoke) is CI's "wheels" stage on every interpreter of the matrix
(.ci/run), not this module: here check_wheel() is given wheels made up in
place, a good one and one with each fault, and must pass the first and name
the fault in each of the others.  TIDELOOP_WHEEL_TEST=1 adds the real run on
this interpreter (about half a minute; needs PyPI through pip).
"""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import wheels

ROOT = Path(__file__).resolve().parents[2]

PLAIN = {"py": "cp313", "free_threaded": False, "machine": "x86_64",
         "ext_suffix": ".cpython-313-x86_64-linux-gnu.so"}
FT = {"py": "cp313", "free_threaded": True, "machine": "x86_64",
      "ext_suffix": ".cpython-313t-x86_64-linux-gnu.so"}


def make_wheel(tmp_path, expect=PLAIN, *, abi=None, plat="manylinux_2_35_x86_64",
               tag=None, drop=(), extra=()):
    py = expect["py"]
    abi = abi or py + ("t" if expect["free_threaded"] else "")
    name = f"tideloop-0.1.0-{py}-{abi}-{plat}.whl"
    info = "tideloop-0.1.0.dist-info"
    files = {
        "tideloop/__init__.py": "", "tideloop/__init__.pyi": "", "tideloop/py.typed": "",
        "tideloop/__main__.py": "", f"tideloop/_core{expect['ext_suffix']}": "ELF",
        f"{info}/METADATA": "Name: tideloop\n", f"{info}/licenses/LICENSE": "MIT License\n",
        f"{info}/WHEEL": ("Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                          f"Tag: {tag or f'{py}-{abi}-{plat}'}\n"),
        f"{info}/RECORD": "",
    }
    for rel in drop:
        del files[rel]
    files.update(dict.fromkeys(extra, "x"))
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
    return path


@pytest.mark.parametrize("expect", [PLAIN, FT], ids=["cp313", "cp313t"])
def test_a_good_wheel_passes(tmp_path, expect):
    assert wheels.check_wheel(make_wheel(tmp_path, expect), expect, glibc=36) == []


@pytest.mark.parametrize("kwargs, expect, fault", [
    ({"plat": "linux_x86_64"}, PLAIN, "is not manylinux_2_N_x86_64"),
    ({"plat": "manylinux_2_39_x86_64"}, PLAIN, "asks for glibc 2.39, this machine has 2.36"),
    ({"plat": "manylinux_2_35_aarch64"}, PLAIN, "is not manylinux_2_N_x86_64"),
    ({"abi": "cp313"}, FT, "the interpreter's are cp313-cp313t"),
    ({"abi": "abi3"}, PLAIN, "the interpreter's are cp313-cp313"),
    ({"tag": "cp313-cp313-linux_x86_64"}, PLAIN, "are not the file name's"),
    ({"drop": ["tideloop/py.typed"]}, PLAIN, "tideloop/py.typed is missing"),
    ({"drop": ["tideloop/__init__.pyi"]}, PLAIN, "tideloop/__init__.pyi is missing"),
    ({"drop": ["tideloop/_core.cpython-313-x86_64-linux-gnu.so"]}, PLAIN, "extension []"),
    ({"extra": ["tideloop.libs/libssl-1a2b3c.so.3"]}, PLAIN, "grafted libraries"),
    ({"extra": ["tideloop/_core/loop.c"]}, PLAIN, "C sources in the wheel"),
    ({"extra": ["tests/conftest.py"]}, PLAIN, "top-level entries"),
])
def test_each_fault_is_named(tmp_path, kwargs, expect, fault):
    problems = wheels.check_wheel(make_wheel(tmp_path, expect, **kwargs), expect, glibc=36)
    assert any(fault in p for p in problems), problems


def test_a_free_threaded_wheel_with_the_default_builds_extension(tmp_path):
    path = make_wheel(tmp_path, FT, drop=["tideloop/_core.cpython-313t-x86_64-linux-gnu.so"],
                      extra=["tideloop/_core.cpython-313-x86_64-linux-gnu.so"])
    problems = wheels.check_wheel(path, FT, glibc=36)
    assert any("expected tideloop/_core.cpython-313t-x86_64-linux-gnu.so" in p
               for p in problems), problems


def test_not_a_wheel_name(tmp_path):
    path = tmp_path / "tideloop-0.1.0.whl"
    path.write_bytes(b"")
    assert "file name" in wheels.check_wheel(path, PLAIN)[0]


@pytest.mark.skipif(os.environ.get("TIDELOOP_WHEEL_TEST") != "1",
                    reason="the real run is CI's wheels stage; TIDELOOP_WHEEL_TEST=1 runs it here")
def test_real_run_on_this_interpreter():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "wheels.py"),
                        "--python", sys.executable], capture_output=True, text=True,
                       timeout=900)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    assert p.returncode == 0 and last.startswith("wheels: PASS"), p.stdout[-4000:] + p.stderr
