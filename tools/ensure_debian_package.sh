#!/usr/bin/env bash
# Makes sure Debian packages are installed (the ecosystem suites' PostgreSQL,
# the app benchmarks' redis-server, postgresql and wrk).  Silent when they are
# all there; otherwise one apt-get update and one install of the missing ones
# (through sudo when not root).  Concurrent callers wait on one lock: apt-get
# itself refuses to run twice.
#
#   bash tools/ensure_debian_package.sh PACKAGE...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: tools/ensure_debian_package.sh PACKAGE..." >&2; exit 2; }
missing() {
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"
    done | xargs
}
MISSING=$(missing "$@")
[ -z "$MISSING" ] && exit 0
command -v apt-get >/dev/null || { echo "ensure_debian_package: missing $MISSING and there is no apt-get" >&2; exit 1; }
SUDO=
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "ensure_debian_package: not root and no sudo to install $MISSING" >&2; exit 1; }
    SUDO=sudo
fi
LOCK=${TMPDIR:-/tmp}/tideloop-apt.lock
exec 9>"$LOCK"; flock 9
MISSING=$(missing "$@")          # another caller may have installed them meanwhile
[ -z "$MISSING" ] && exit 0
echo "ensure_debian_package: installing $MISSING"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $MISSING >/dev/null
STILL=$(missing "$@")
[ -z "$STILL" ] || { echo "ensure_debian_package: still missing after install: $STILL" >&2; exit 1; }
