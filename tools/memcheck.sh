#!/usr/bin/env bash
# A representative subset of the suite (tideloop side only) under valgrind
# memcheck, with PYTHONMALLOC=malloc so every allocation is tracked, through
# interpreter exit (module teardown included).  valgrind writes XML and
# tools/memcheck_verdict.py reads it: the run fails on any error with a frame
# in tideloop's extension (by object file or source file), and on a crash of
# the interpreter.  Errors entirely inside the interpreter (its GC reads
# uninitialised words by design) are counted and listed, not failed on.
# CI runs it; about 2 minutes for the default subset.
#
#   bash tools/memcheck.sh            # the default subset
#   bash tools/memcheck.sh tests/loop/test_timers.py -k tideloop
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="${PYTHON:-python3}"
REALPY=$("$PY" -c 'import sys; print(sys.executable)')
cd "$ROOT"
if [ $# -eq 0 ]; then
    set -- tests/loop/test_scheduling.py tests/loop/test_timers.py tests/loop/test_context_snapshots.py \
           tests/loop/test_readers_writers.py tests/net/test_tcp_transport.py tests/net/test_sock_ops.py \
           tests/net/test_udp.py tests/pipes/test_pipes.py tests/loop/test_stats.py tests/loop/test_lifecycle.py \
           tests/net/test_tls.py tests/net/test_tls_close.py tests/net/test_streams_c.py \
           -k "tideloop and not accumulate and (not test_tls or echo_protocol or echo_buffered or many_writes or clean_close or test_abort or without_close_notify)"
    # (accumulate is a timing test; of the TLS tests, the engine's paths:
    # reads for Protocol and BufferedProtocol apps, writes, the closings)
fi
command -v valgrind >/dev/null || { echo "memcheck: valgrind is not installed"; exit 1; }
OUT=$(mktemp -d "${TMPDIR:-/tmp}/tideloop-memcheck.XXXXXX")
# The tests under test: an in-place build in src/ if there is one for this
# interpreter, else the installed package.
if "$PY" -c 'import sys, glob, sysconfig; sys.exit(not glob.glob("src/tideloop/_core" + sysconfig.get_config_var("EXT_SUFFIX")))'; then
    export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi
# One report per process (%p): forked children inherit valgrind until they
# exec.  Leaks are not checked here (tests/stress/test_leaks.py does that);
# valgrind 3.19 still writes every "possibly lost" block into the XML with
# --leak-check=no (500 MB, and minutes to write and read, for the main
# process alone): --show-leak-kinds=none leaves them out.
# Plugins are not autoloaded: pytest would rewrite the asserts of every
# module of a plugin's distribution (all of hypothesis, compiled afresh under
# valgrind on each run); hypothesis's plugin is loaded by name instead.  The
# test modules' asserts are rewritten as usual.
set +e
# TIDELOOP_TEST_SLOW: the tests' time limits made 4 times longer (a 64 MiB
# pipe transfer took over 30 s under valgrind on a loaded machine).
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONMALLOC=malloc TIDELOOP_TEST_SLOW=4 \
valgrind --tool=memcheck --error-exitcode=0 --num-callers=40 \
    --leak-check=no --show-leak-kinds=none --xml=yes --xml-file="$OUT/memcheck.%p.xml" \
    --log-file="$OUT/valgrind.%p.log" \
    "$REALPY" -m pytest -q -p no:cacheprovider -p _hypothesis_pytestplugin "$@"
rc=$?
set -e
"$PY" "$ROOT/tools/memcheck_verdict.py" "$OUT"/memcheck.*.xml --main-ppid $$ \
    --pytest-rc "$rc" --ours "tideloop/_core"
verdict=$?
if [ "$verdict" -eq 0 ]; then
    rm -rf "$OUT"
else
    echo "memcheck: logs kept in $OUT"
fi
exit "$verdict"
