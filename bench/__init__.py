"""tideloop's benchmarks and their tooling, run from the checkout's root:

    python -m bench.net        echo over TCP and TLS against C load generators
    python -m bench.io         UDP, subprocesses, pipes
    python -m bench.apps       real apps: aiohttp, uvicorn, gunicorn, asyncpg, ...
    python -m bench.threads    N loops in N threads
    python -m bench.plot       a saved results document drawn as bars

The loop micro-benchmarks ship with tideloop (``python -m tideloop bench``,
src/tideloop/_bench/); the code every benchmark shares (loops by name,
medians, tables) is its ``tideloop._bench.harness``.  Here: procs.py
(measuring loops in child processes), plot.py, the workers and the C load
generators (built into bench/bin/ on first use).
"""
