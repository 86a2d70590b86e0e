#!/usr/bin/env bash
# serve's web page in a real browser: Debian's chromium, headless, driven by
# puppeteer-core (tests/web, node's test runner), installed from npm on first
# use. Without chromium the tests are reported skipped (tools/deps.sh test
# installs it). Ends with "web: N passed, N failed, N skipped".
# usage: tests/web.sh [KAPITSA_BINARY]
set -u
cd "$(dirname "$0")/web"
n=$(grep -c '^test(' chat.test.js)
chromium=${KAPITSA_CHROMIUM:-$(command -v chromium)}
if [ -z "$chromium" ] || [ ! -x "$chromium" ]; then
    echo "# no chromium (apt-get install chromium): the browser tests skipped"
    echo "web: 0 passed, 0 failed, $n skipped"
    exit 0
fi
if [ ! -d node_modules/puppeteer-core ]; then
    bash ../lib/npm_install.sh . || { echo "web: 0 passed, 1 failed (npm install)"; exit 1; }
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
KAPITSA_BIN=${1:-} KAPITSA_CHROMIUM=$chromium timeout 900 node --test --test-concurrency=1 . >"$out" 2>&1
rc=$?
grep -E "^(not )?ok " "$out"
# a failure: each failing test's report (its error, expected and actual values, stack)
[ "$rc" = 0 ] || awk '/^not ok /{p=1; print; next} /^ok /{p=0} p' "$out" | head -120
pass=$(sed -n 's/^# pass //p' "$out")
fail=$(sed -n 's/^# fail //p' "$out")
echo "web: ${pass:-0} passed, ${fail:-1} failed"
[ "$rc" = 0 ]
