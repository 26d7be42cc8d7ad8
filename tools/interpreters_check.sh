#!/usr/bin/env bash
# tideloop in isolated interpreters under the memory checkers: stress
# scenario j (server interpreters serving TCP and Unix echo while
# interpreters are made, talk to them, make and close loops, and are
# destroyed) and tests/interpreters, on tideloop, on CPython 3.13 built from
# source (tools/build_python.sh: the system's glibc; Debian's 3.14/3.15
# bring their own loader, which valgrind cannot redirect, and 3.12 aborts at
# exit once asyncio is imported in an isolated interpreter).
#
#   1. valgrind memcheck, --leak-check=full: no error with a frame in the
#      extension, no block definitely lost that the extension allocated
#      (tools/memcheck_verdict.py --leaks), the scenario's own checks pass.
#      Except what the module's init made (core_exec): 3.13 does not free a
#      destroyed interpreter's import-time objects, the standard library's
#      modules' alike (thousands of blocks per run); 3.14 does (stress
#      scenario j: RSS flat there).  What loops, transports and handles
#      allocate must all be freed;
#   2. ASan + UBSan (preloaded, PYTHONMALLOC=malloc): no report, the
#      scenario and the tests pass.
# Each in a scratch copy of the tree (the checkout's builds are left alone).
#
#   bash tools/interpreters_check.sh            # both (CI), about 3 minutes
#   bash tools/interpreters_check.sh memcheck   # one of them
#   MEMCHECK_SECONDS=120 ASAN_SECONDS=60 bash tools/interpreters_check.sh   # longer
#       (the scenario's traffic window under each: 20 and 8 s by default)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHAT=${1:-all}
START=$(date +%s)
stamp() { echo "== interpreters_check [$(( $(date +%s) - START )) s] $*"; }
PY313=$(bash "$ROOT/tools/build_python.sh" 3.13 | tail -1)
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/tideloop-ci/interpreters-3.13
[ -x "$VENV/bin/python" ] || "$PY313" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "setuptools>=77" pytest
PY="$VENV/bin/python"
REALPY=$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))')
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tideloop-interp-check.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
copy() {
    mkdir -p "$1"
    cp -r "$ROOT/src" "$ROOT/stress" "$ROOT/tests" "$ROOT/setup.py" "$ROOT/pyproject.toml" \
          "$ROOT/README.md" "$ROOT/LICENSE" "$1/"
    find "$1/src" -name '*.so' -delete
}
# The scenario's RESULT line: its errors (the child's exit status is 0 either way).
scenario_ok() {
    "$PY" - "$1" <<'PYEOF'
import json, sys
res = [json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
if len(res) != 1:
    sys.exit("scenario j: no RESULT line")
r = res[0]
print("scenario j: %d interpreters made, %d bytes verified, errors: %s"
      % (r["details"].get("interpreters_created", 0), r["bytes_verified"], r["errors"] or "none"))
sys.exit(1 if r["errors"] or r.get("skipped") else 0)
PYEOF
}
rc=0
export TIDELOOP_SANITIZE_RUN=1     # scenario j's sizes for slow runs
if [ "$WHAT" = all ] || [ "$WHAT" = memcheck ]; then
    stamp "memcheck: build"
    copy "$WORK/mc"
    (cd "$WORK/mc" && TIDELOOP_DEV=1 "$PY" setup.py -q build_ext --inplace)
    stamp "memcheck: stress scenario j on tideloop"
    set +e
    (cd "$WORK/mc" && PYTHONPATH="$WORK/mc/src" PYTHONMALLOC=malloc \
        TIDELOOP_SANITIZE_SECONDS=${MEMCHECK_SECONDS:-20} \
        valgrind --tool=memcheck --error-exitcode=0 --num-callers=40 \
        --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
        --xml=yes --xml-file="$WORK/memcheck.%p.xml" --log-file="$WORK/valgrind.%p.log" \
        "$REALPY" stress/run.py --child j --loop tideloop --mode quick --scale 0.1 \
        > "$WORK/mc.out")
    prog_rc=$?
    set -e
    cat "$WORK/mc.out" | grep -v '^RESULT ' || true
    scenario_ok "$WORK/mc.out" || rc=1
    "$PY" "$ROOT/tools/memcheck_verdict.py" "$WORK"/memcheck.*.xml \
        --pytest-rc "$prog_rc" --ours "tideloop/_core" --leaks --leak-ignore core_exec || rc=1
fi
if [ "$WHAT" = all ] || [ "$WHAT" = asan ]; then
    stamp "ASan+UBSan: build"
    copy "$WORK/asan"
    (cd "$WORK/asan" && TIDELOOP_SANITIZE=1 TIDELOOP_DEV=1 "$PY" setup.py -q build_ext --inplace)
    # (into a file: under pipefail, grep -q leaving early can fail nm with SIGPIPE)
    nm -D "$WORK"/asan/src/tideloop/_core*.so > "$WORK/asan-symbols.txt"
    grep -q __asan_ "$WORK/asan-symbols.txt" || { echo "not an ASan build"; exit 1; }
    stamp "ASan+UBSan: stress scenario j and tests/interpreters on tideloop"
    set +e
    (cd "$WORK/asan" &&
        export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
               PYTHONMALLOC=malloc PYTHONPATH="$WORK/asan/src" \
               TIDELOOP_SANITIZE_SECONDS=${ASAN_SECONDS:-8} \
               ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
               UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 &&
        "$REALPY" stress/run.py --child j --loop tideloop --mode quick --scale 0.1 > "$WORK/asan.out" 2>&1 &&
        "$PY" -m pytest -q -p no:cacheprovider tests/interpreters -k "not asyncio]" \
            2>&1 | tee "$WORK/asan-pytest.log"; exit "${PIPESTATUS[0]}")
    test_rc=$?
    set -e
    grep -v '^RESULT ' "$WORK/asan.out" || true
    scenario_ok "$WORK/asan.out" || rc=1
    [ "$test_rc" = 0 ] || { echo "ASan: scenario or tests failed (status $test_rc)"; rc=1; }
    if grep -qE "ERROR: AddressSanitizer|runtime error:" "$WORK/asan.out" "$WORK/asan-pytest.log"; then
        echo "ASan: sanitizer reports found"; rc=1
    fi
fi
stamp "$([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
