#!/usr/bin/env bash
# tests/lib/npm_install.sh DIR [PACKAGE...]: npm install in DIR (its package.json,
# or the packages named), tried three times with a pause between, since the
# registry now and then drops a connection mid-install. On the last failure it
# prints the end of npm's own output, so CI's log says why.
set -u
dir=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pause in 15 45 0; do
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "$@") >"$log" 2>&1 && exit 0
    [ "$pause" = 0 ] || { echo "npm install failed; again in $pause s" >&2; sleep "$pause"; }
done
tail -20 "$log" | sed 's/^/    npm: /' >&2
exit 1
