# The conformance runner (run.py, child.py) drives CPython's own asyncio tests
# in subprocesses; nothing here is a pytest test.
collect_ignore_glob = ["*"]
