#!/usr/bin/env bash
# Regenerate the README's pictures from fresh runs: each benchmark writes its
# results document to results/<name>.json and draws docs/plots/<name>.svg
# (--json and --plot).  Needs the in-place build (TIDELOOP_DEV=1 python3
# setup.py build_ext --inplace) and the bench and plot extras (uvloop,
# matplotlib).  About 10 minutes on a 2-CPU machine.
#
#   bash tools/plots.sh              # micro, net and io
#   bash tools/plots.sh micro net    # some of them
#   bash tools/plots.sh apps         # the real-app benchmark (its services, ~14 min)
#   python3 -m bench.plot results/net.json docs/plots/net.svg   # redraw only
#
# The runs: micro-benchmarks with their defaults (full sizes, median of 5);
# the I/O benchmark with its defaults (median of 3); the network benchmark's
# --quick cells (plain 1 KiB x10 and 100 KiB x100, TLS 1 KiB x10, handshakes;
# 1 s windows, median of 3): its full matrix takes about 25 minutes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="${PYTHON:-python3}"
cd "$ROOT"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"   # relative: the commands the JSON records work in any checkout
mkdir -p results docs/plots
[ $# -eq 0 ] && set -- micro net io
for name in "$@"; do
    out=(--json "results/$name.json" --plot "docs/plots/$name.svg")
    case "$name" in
        micro) "$PY" -m tideloop bench "${out[@]}" ;;
        net)   "$PY" -m bench.net --quick "${out[@]}" ;;
        io)    "$PY" -m bench.io "${out[@]}" ;;
        apps)  "$PY" -m bench.apps --repeat 5 "${out[@]}" ;;   # about 14 minutes: by name only
        *)     echo "plots.sh: unknown benchmark '$name' (micro, net, io, apps)" >&2; exit 2 ;;
    esac
done
