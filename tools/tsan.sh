#!/usr/bin/env bash
# The thread-heavy tests and stress scenario e under ThreadSanitizer, with the
# GIL off, on a free-threaded TSan interpreter.
#
# The interpreter is CPython 3.13t built with --with-thread-sanitizer
# (tools/build_python.sh 3.13 --disable-gil --with-thread-sanitizer, cached;
# PYTHON=... to use another TSan build).  The extension is built with
# TIDELOOP_SANITIZE=thread (-fsanitize=thread, same compiler as the
# interpreter, so one TSan runtime) in a scratch copy of the tree; the tests
# run from it with PYTHON_GIL=0 (the core declares Py_mod_gil, so the GIL
# stays off anyway: the variable keeps it off whatever else is imported), tideloop's side
# only (--loops tideloop: the stock loop runs no code of ours), stress sizes
# scaled to 0.1 (TIDELOOP_SANITIZE_RUN=1).  TSan writes one log per process
# (children included) and tools/tsan_verdict.py reads them: the run fails on
# a report with a frame of tideloop's C code, on a crash, or on a failing test.
#
# tools/tsan-suppressions.txt lists CPython's own reports (each with its
# reason).  The verdict applies it, not TSan: TSan would also hide a report of
# ours that passes through a suppressed CPython function, the verdict never
# does (see tools/tsan_verdict.py).
#
#   bash tools/tsan.sh                       # the default set below
#   bash tools/tsan.sh tests/loop/test_threadsafe.py -k storm
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T0=$SECONDS
stage_t=0
stage() { stage_t=$SECONDS; echo "tsan: $* ..."; }
done_() { echo "tsan:   $1: $((SECONDS - stage_t)) s"; }

stage "interpreter: CPython 3.13t with ThreadSanitizer (tools/build_python.sh, cached)"
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
else
    PY=$(bash "$ROOT/tools/build_python.sh" 3.13 --disable-gil --with-thread-sanitizer | tail -n1)
fi
"$PY" -c 'import sys, sysconfig
sys.exit(not sysconfig.get_config_var("Py_GIL_DISABLED")
         or "-fsanitize=thread" not in sysconfig.get_config_var("PY_CFLAGS"))' ||
    { echo "tsan: $PY is not a free-threaded ThreadSanitizer build"; exit 1; }
done_ "$("$PY" -c 'import sys; print(sys.version.split()[0])')t at $PY"

OUT=$(mktemp -d "${TMPDIR:-/tmp}/tideloop-tsan.XXXXXX")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The interpreter's own runs outside the tests (pip, the build) report too:
# those logs are CPython's alone and are not read.
export TSAN_OPTIONS="exitcode=0:abort_on_error=1:log_path=$OUT/setup/tsan"
mkdir -p "$OUT/setup"

stage "venv with the tests' dependencies (cached)"
# (the default set needs no hypothesis: its newest releases build a Rust part
# from source on 3.13t, which cannot be fetched here)
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/tideloop-tsan/venv
DEPS='pytest>=7 prometheus_client>=0.16 opentelemetry-api>=1.20 opentelemetry-sdk>=1.20 setuptools>=77'
WANT="$(cat "$(dirname "$(dirname "$PY")")/.built" 2>/dev/null || echo "$PY") | $DEPS"
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$WANT" ]; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check $DEPS
    echo "$WANT" >"$VENV/.stamp"
fi
VPY=$VENV/bin/python
done_ venv

stage "build the extension with -fsanitize=thread (scratch copy of the tree)"
cp -r "$ROOT/src" "$ROOT/tests" "$ROOT/stress" "$ROOT/tools" "$ROOT/setup.py" \
      "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/LICENSE" "$WORK/"
cd "$WORK"
find src -name '*.so' -delete
TIDELOOP_SANITIZE=thread TIDELOOP_DEV=1 "$VPY" setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 ||
    { cat "$OUT/build.log"; echo "tsan: the extension does not build"; exit 1; }
# (grep -c reads it all: grep -q would stop nm with SIGPIPE, a failure under pipefail)
nm -D src/tideloop/_core*.so | grep -c __tsan_ >/dev/null || { echo "tsan: not a TSan build"; exit 1; }
nm -D src/tideloop/_core*.so | grep -c __assert_fail >/dev/null || { echo "tsan: the core's assert()s are not compiled in"; exit 1; }
done_ "$(ls src/tideloop/_core*.so | xargs -n1 basename)"

# One pytest process per target: a crash (expected while the core is not
# thread-safe) then costs one file's tests, not the rest of the run.
TARGETS=()
if [ $# -eq 0 ]; then
    # Threads: call_soon_threadsafe from many threads, the stall watchdog's C
    # thread and its captures (diagnostics), the executor, scenario e (8
    # threads storming call_soon_threadsafe), and the many-loops-in-many-threads
    # stress tests when there are any.
    TARGETS=(tests/loop/test_threadsafe.py tests/loop/test_thread_contract.py
             tests/loop/test_diagnostics*.py tests/loop/test_executor.py
             tests/stress/test_stress.py::test_call_soon_threadsafe_storm)
    for f in tests/stress/test_threads*.py; do [ -e "$f" ] && TARGETS+=("$f"); done
fi
mkdir -p "$OUT/run"
# exitcode=0: pytest's status is the tests', the verdict judges the reports;
# abort_on_error=1: TSan ends a crashed process with that same exitcode
# otherwise (a segfault in a child would read as a clean exit), with it by
# SIGABRT, which the tests' crash checks see.
# suppress_equal_addresses=0: a CPython report on some memory must not stop
# TSan from reporting our own race on the same memory.
# report_signal_unsafe=0: with it, a crash while other threads are reporting
# races deadlocks TSan (the crashing thread's report takes the report lock,
# then its unwinder's malloc the thread registry's, which a racing thread
# holds while it waits for the report lock); the process hangs instead of
# dying with its stack.  Our C code installs no signal handler of its own.
# history_size=7 (the most): with 4, one report in seven lost the stack of
# its previous access ("failed to restore the stack").
export TSAN_OPTIONS="log_path=$OUT/run/tsan:exitcode=0:abort_on_error=1:halt_on_error=0:suppress_equal_addresses=0:report_signal_unsafe=0:second_deadlock_stack=1:history_size=7"
export PYTHON_GIL=0 TIDELOOP_SANITIZE_RUN=1 PYTHONPATH=src
# -p no:faulthandler: pytest's fatal-signal handler, run on TSan's abort
# after a crash report, walks the thread states and trips a race report
# while the crash report still holds TSan's lock: a deadlock (seen here).
# TSan's report gives the crash's native stack instead of the Python one.
# A process that hangs anyway (TSan's own locks, a deadlock of ours) is
# stopped after TSAN_TIMEOUT seconds (status 124, or 137 once killed).
TIMEOUT=${TSAN_TIMEOUT:-1500}
rc=0
run_pytest() {
    local r
    stage "pytest under TSan, PYTHON_GIL=0: $*"
    set +e
    timeout -k 30 "$TIMEOUT" "$VPY" -m pytest -q -p no:cacheprovider -p no:faulthandler \
        --loops tideloop "$@" 2>&1 |
        tee -a "$OUT/pytest.log"
    r=${PIPESTATUS[0]}
    set -e
    # 5: nothing collected (a -k that matches nothing in this target)
    [ "$r" = 0 ] || [ "$r" = 5 ] || rc=$r
    done_ "exit status $r"
}
# Under TSan everything runs 5-20x slower: tests that time a child's start-up
# or a live view against a wall clock (they pass without TSan, GIL off) are
# left out of the default set; their code still runs in the other live tests.
WALL_CLOCK_BOUND="not (test_serve_from_the_environment_and_the_screen or test_refreshes_are_separate_frames or test_a_stalled_loop_still_shows_its_health)"
if [ ${#TARGETS[@]} -gt 0 ]; then
    for t in "${TARGETS[@]}"; do
        case $t in
            *test_diagnostics_live.py) run_pytest "$t" -k "$WALL_CLOCK_BOUND" ;;
            *) run_pytest "$t" ;;
        esac
    done
else
    run_pytest "$@"
fi

stage "verdict (tools/tsan_verdict.py over $(ls "$OUT/run" | wc -l) process log(s))"
shopt -s nullglob
set +e
python3 "$ROOT/tools/tsan_verdict.py" "$OUT"/run/tsan.* "$OUT/pytest.log" \
    --suppressions "$ROOT/tools/tsan-suppressions.txt" --pytest-rc "$rc" --json "$OUT/verdict.json" |
    tee "$OUT/verdict.txt"
verdict=${PIPESTATUS[0]}
set -e
done_ verdict
echo "tsan: total $((SECONDS - T0)) s"
if [ "$verdict" -eq 0 ]; then
    rm -rf "$OUT"
else
    echo "tsan: logs kept in $OUT (run/tsan.PID: TSan's, pytest.log, verdict.txt, verdict.json)"
fi
exit "$verdict"
