"""The scripts in bench/ take their shared code from tideloop's benchmark
package, src/tideloop/_bench/ (see its __init__.py), not from copies here.

    from _harness import harness, procs, micro, plot

This checkout's copy is loaded by path, under the name ``tideloop_bench``, so
that it works before the C core is built and whatever tideloop is installed;
without a checkout's src/ (bench/ copied elsewhere) the installed package's.
"""
import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(ROOT, "src")
PACKAGE_DIR = os.path.join(SRC, "tideloop", "_bench")
NAME = "tideloop_bench"


def _load():
    if NAME in sys.modules:
        return sys.modules[NAME]
    if not os.path.isfile(os.path.join(PACKAGE_DIR, "__init__.py")):
        return importlib.import_module("tideloop._bench")
    spec = importlib.util.spec_from_file_location(
        NAME, os.path.join(PACKAGE_DIR, "__init__.py"),
        submodule_search_locations=[PACKAGE_DIR])
    package = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = package
    try:
        spec.loader.exec_module(package)
    except BaseException:
        del sys.modules[NAME]
        raise
    return package


package = _load()
harness = importlib.import_module(package.__name__ + ".harness")
procs = importlib.import_module(package.__name__ + ".procs")
micro = importlib.import_module(package.__name__ + ".micro")
plot = importlib.import_module(package.__name__ + ".plot")
