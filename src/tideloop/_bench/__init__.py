"""tideloop's benchmark code: the one home of what the benchmarks share.

    harness.py  loops by name, interleaved runs, medians and ratios, tables,
                command-line pieces, the environment, JSON (standard library)
    procs.py    measuring loops in child processes: /proc CPU, the machine's
                other load, a server under a C load generator (bench/net.py,
                bench/io.py)
    micro.py    the loop micro-benchmarks: ``python -m tideloop bench``
    plot.py     results documents drawn as bars (--plot; matplotlib, imported
                only to draw): ``python -m tideloop._bench.plot``

Nothing here imports tideloop itself at import time: ``bench/*.py`` load this
package by path when the C core is not built.
"""

from .micro import BENCHMARKS, add_arguments, build_parser, main, run_from_args

__all__ = ["BENCHMARKS", "add_arguments", "build_parser", "main", "run_from_args"]
