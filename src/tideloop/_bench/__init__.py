"""The loop micro-benchmark that ships with tideloop: ``python -m tideloop bench``.

    harness.py  loops by name, interleaved runs, medians and ratios, tables,
                command-line pieces, the environment, JSON (standard library);
                also what the checkout's benchmarks (bench/, ``python -m
                bench.net`` etc.) share with this one
    micro.py    the loop micro-benchmarks

The network, I/O and app benchmarks and the plotting live in the source
checkout's bench/ package, not in the installed one.
"""

from .micro import BENCHMARKS, add_arguments, build_parser, main, run_from_args

__all__ = ["BENCHMARKS", "add_arguments", "build_parser", "main", "run_from_args"]
