#!/usr/bin/env bash
# A representative subset of the suite (tideloop side only) under valgrind
# memcheck, with PYTHONMALLOC=malloc so every allocation is tracked.  The
# interpreter itself trips memcheck (its GC reads uninitialised words), so
# the run fails only on errors whose stack goes through tideloop's
# extension.  Slow (about 3 minutes for the default subset): run by hand.
#
#   bash tools/memcheck.sh            # the default subset, a few minutes
#   bash tools/memcheck.sh tests/test_timers.py -k tideloop
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="${PYTHON:-python3}"
REALPY=$("$PY" -c 'import sys; print(sys.executable)')
cd "$ROOT"
if [ $# -eq 0 ]; then
    set -- tests/test_scheduling.py tests/test_timers.py tests/test_context_snapshots.py \
           tests/test_readers_writers.py tests/test_tcp_transport.py tests/test_sock_ops.py \
           tests/test_udp.py tests/test_pipes.py \
           -k "tideloop and not accumulate"   # (that one is a timing test)
fi
LOG=$(mktemp)
set +e
PYTHONMALLOC=malloc valgrind --tool=memcheck --error-exitcode=0 --num-callers=30 \
    --log-file="$LOG" "$REALPY" -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
ours=$(grep -v "Command:" "$LOG" | grep -c "tideloop" || true)
echo "valgrind log: $LOG; stack lines in tideloop's extension: $ours"
grep -E "ERROR SUMMARY" "$LOG" | tail -1
if [ "$ours" -ne 0 ]; then
    grep -v "Command:" "$LOG" | grep -B5 -A30 "tideloop" | head -120
    exit 1
fi
exit $rc
