#!/usr/bin/env bash
# Run the test suite against an ASan+UBSan build of the extension.
#
# The extension is built with -fsanitize=address,undefined in a scratch copy
# of the tree (the checkout's own build is left alone), the sanitizer
# runtimes are preloaded into the interpreter, and PYTHONMALLOC=malloc lets
# ASan see every Python allocation.  Any report aborts the process, so the
# run fails.  Leak detection is off: the interpreter itself does not free
# everything at exit (tests/stress/test_leaks.py checks our leaks instead).
#
#   bash tools/sanitize.sh                 # the whole suite (.ci/run --full)
#   bash tools/sanitize.sh --loops tideloop    # tideloop's side of it (CI)
#   bash tools/sanitize.sh -k timers       # extra pytest arguments
# The stock loop's side runs no code of ours: --loops tideloop keeps every
# test that does (the loop-parametrised ones on tideloop, and the rest).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="${PYTHON:-python3}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$ROOT/src" "$ROOT/tests" "$ROOT/examples" "$ROOT/stress" "$ROOT/tools" "$ROOT/bench" "$ROOT/results" \
      "$ROOT/docs" "$ROOT/setup.py" "$ROOT/pyproject.toml" \
      "$ROOT/README.md" "$ROOT/LICENSE" "$WORK/"
cd "$WORK"
find src -name '*.so' -delete
TIDELOOP_SANITIZE=1 TIDELOOP_DEV=1 "$PY" setup.py -q build_ext --inplace
nm -D src/tideloop/_core*.so > symbols.txt
grep -q __asan_ symbols.txt || { echo "not an ASan build"; exit 1; }
grep -q __assert_fail symbols.txt || { echo "the core's assert()s are not compiled in"; exit 1; }

export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export PYTHONMALLOC=malloc
export TIDELOOP_SANITIZE_RUN=1   # stress sizes scaled down (ASan is slower)
export TIDELOOP_TEST_SLOW=2      # and the tests' time limits doubled
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
set +e
# tests/tooling/test_packaging.py builds release artefacts from a complete tree (this
# copy is not one) and runs no tideloop code in this process: not here.
PYTHONPATH=src "$PY" -m pytest tests -q -p no:cacheprovider \
    --ignore=tests/tooling/test_packaging.py "$@" 2>&1 | tee log.txt
rc=${PIPESTATUS[0]}
set -e
if grep -qE "ERROR: AddressSanitizer|runtime error:" log.txt; then
    echo "sanitizer reports found"
    exit 1
fi
exit "$rc"
