#!/usr/bin/env python3
"""Loop micro-benchmarks: asyncio vs uvloop vs tideloop (same as `python -m tideloop bench`).

    PYTHONPATH=src python bench/micro.py [--quick] [--repeat N] [--loops ...] [--json PATH] [--markdown]

Works before the C core is built: the benchmark code (src/tideloop/_bench/) is
loaded by path (bench/_harness.py); if the tideloop package cannot be imported,
tideloop is reported as skipped (with the reason) and the other loops are
still measured.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


if __name__ == "__main__":
    if SRC not in sys.path and os.path.isdir(os.path.join(SRC, "tideloop")):
        # Prefer an explicit PYTHONPATH / installed package, else the checkout.
        sys.path.append(SRC)
    from _harness import micro
    invocation = [os.path.relpath(os.path.abspath(__file__))]
    sys.exit(micro.main(prog="bench/micro.py", invocation=invocation))
