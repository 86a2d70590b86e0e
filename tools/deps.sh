#!/usr/bin/env bash
# The Debian packages Kapitsa needs, installed where this machine lacks them: apt-get as
# root, else through sudo, else the one command to run is printed and the script fails.
# The Makefile runs it once before compiling (the stamps build/deps-*.stamp).
# usage: tools/deps.sh build|test   (build: compiling build/kapitsa; test: make test's suites too)
set -u
case ${1:-} in
build | test) ;;
*) echo "usage: tools/deps.sh build|test" >&2; exit 2 ;;
esac
pkgs="build-essential libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libssl-dev libedit-dev"
if [ "$1" = test ]; then
    # clang and its runtime build the fuzzers; xz unpacks the test data; python3 and curl drive the
    # shell suites; chromium runs serve's web page (tests/web.sh); node and npm run the server
    # tests with the official SDKs (a machine without npm gets Debian's)
    pkgs="$pkgs clang libclang-rt-14-dev xz-utils python3 curl chromium"
    command -v npm >/dev/null 2>&1 || pkgs="$pkgs nodejs npm"
fi
if ! command -v dpkg >/dev/null 2>&1; then
    echo "deps: not a Debian system; install the equivalents of: $pkgs" >&2
    exit 0
fi
missing=""
for p in $pkgs; do
    case $(dpkg -s "$p" 2>/dev/null) in
    *"Status: install ok installed"*) ;;
    *) missing="$missing $p" ;;
    esac
done
[ -n "$missing" ] || exit 0
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends$missing"
echo "deps: installing the Debian packages this machine lacks:$missing" >&2
if [ "$(id -u)" = 0 ]; then
    sh -c "$cmd" && exit 0
elif command -v sudo >/dev/null 2>&1; then
    sudo sh -c "$cmd" && exit 0
fi
echo "deps: could not install them; run as root, then make again:" >&2
echo "    $cmd" >&2
exit 1
