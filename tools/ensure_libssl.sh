#!/usr/bin/env bash
# Makes sure OpenSSL's C headers are installed (the TLS benchmark's C programs,
# bench/tls_loadgen.c and bench/tls_echo_server.c, include <openssl/ssl.h> and
# link -lssl -lcrypto).  Silent when they are there already; otherwise installs
# Debian/Ubuntu's libssl-dev with apt-get (through sudo when not root).
#
#   bash tools/ensure_libssl.sh
set -euo pipefail
HEADER=/usr/include/openssl/ssl.h
[ -f "$HEADER" ] && exit 0

command -v apt-get >/dev/null || {
    echo "ensure_libssl: $HEADER is missing and there is no apt-get: install OpenSSL's development headers (libssl-dev, openssl-devel)" >&2
    exit 1
}
SUDO=
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "ensure_libssl: not root and no sudo to install libssl-dev" >&2; exit 1; }
    SUDO=sudo
fi
echo "ensure_libssl: $HEADER is missing; installing libssl-dev"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq libssl-dev >/dev/null
[ -f "$HEADER" ] || { echo "ensure_libssl: libssl-dev installed but $HEADER is still missing" >&2; exit 1; }
echo "ensure_libssl: installed ($HEADER)"
