"""The project's tooling scripts (python tools/NAME.py); a package so that the
benchmarks can import tools.pgcluster from the checkout's root."""
