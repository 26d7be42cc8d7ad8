"""Build the C core. Everything else lives in pyproject.toml.

TIDELOOP_DEV=1 turns warnings into errors and compiles the core's assert()s
in (development and CI builds; a release build has -DNDEBUG: none);
TIDELOOP_SANITIZE=1 builds with ASan+UBSan (tools/sanitize.sh);
TIDELOOP_SANITIZE=thread with ThreadSanitizer (tools/tsan.sh: only with an
interpreter built with it, tools/build_python.sh --with-thread-sanitizer,
whose compiler and TSan runtime the extension then shares).
"""
import glob
import os

from setuptools import Extension, setup

# -fvisibility=hidden: only PyInit__core is exported, so that calls between
# the C files go direct instead of through the PLT (and nothing clashes with
# other extensions' symbols).
extra_compile_args = ["-std=c11", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden",
                      "-Wno-missing-field-initializers", "-fno-strict-aliasing"]
extra_link_args = []
sanitize = os.environ.get("TIDELOOP_SANITIZE")
if os.environ.get("TIDELOOP_DEV"):
    extra_compile_args.append("-Werror")
# The interpreter's own CFLAGS carry -DNDEBUG (a release CPython): the
# invariants the core states with assert() are checked in development and
# sanitizer builds only.
extra_compile_args.append("-UNDEBUG" if os.environ.get("TIDELOOP_DEV") or sanitize
                          else "-DNDEBUG")
if sanitize:
    kinds = "thread" if sanitize == "thread" else "address,undefined"
    san = [f"-fsanitize={kinds}", "-fno-omit-frame-pointer", "-O1", "-g"]
    extra_compile_args += san
    extra_link_args += san

setup(
    ext_modules=[
        Extension(
            "tideloop._core",
            sources=sorted(glob.glob("src/tideloop/_core/*.c")),
            depends=sorted(glob.glob("src/tideloop/_core/*.h")),
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
            libraries=["dl"],
        )
    ],
)
