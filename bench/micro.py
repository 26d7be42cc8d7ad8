#!/usr/bin/env python3
"""Loop micro-benchmarks: asyncio vs uvloop vs tideloop (same as `python -m tideloop bench`).

    PYTHONPATH=src python bench/micro.py [--quick] [--repeat N] [--loops ...] [--json PATH] [--markdown]

Works before the C core is built: if the tideloop package cannot be imported, the
benchmark module is loaded from src/tideloop/_bench.py by path, tideloop is reported
as skipped (with the reason) and the other loops are still measured.
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def _load_bench():
    try:
        from tideloop import _bench
        return _bench
    except Exception:
        pass
    # Package import failed (core not built?): load the module file itself.
    path = os.path.join(SRC, "tideloop", "_bench.py")
    spec = importlib.util.spec_from_file_location("tideloop_bench_standalone", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    if SRC not in sys.path and os.path.isdir(os.path.join(SRC, "tideloop")):
        # Prefer an explicit PYTHONPATH / installed package, else the checkout.
        sys.path.append(SRC)
    bench = _load_bench()
    invocation = [os.path.relpath(os.path.abspath(__file__))]
    sys.exit(bench.main(prog="bench/micro.py", invocation=invocation))
