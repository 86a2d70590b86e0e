#!/usr/bin/env bash
# The HTTP server through the official OpenAI and Anthropic SDKs, the Vercel AI
# SDK and LangChain (tests/server, node's test runner); installs the pinned
# packages from npm on first use, or when package.json changed them. Ends with
# "server: N passed, N failed".
# usage: tests/server.sh [KAPITSA_BINARY] ["EXTRA SERVE FLAGS"]
set -u
cd "$(dirname "$0")/server"
if ! npm ls --depth=0 >/dev/null 2>&1; then
    bash ../lib/npm_install.sh . || { echo "server: 0 passed, 1 failed (npm install)"; exit 1; }
fi
out=$(mktemp)
cache=$(mktemp -d) # the KFlash tuning file of servers with --draft, kept out of $HOME
trap 'rm -rf "$out" "$cache"' EXIT
KAPITSA_CACHE=$cache KAPITSA_BIN=${1:-} KAPITSA_SERVE_ARGS=${2:-} timeout 1500 node --test --test-concurrency=1 . >"$out" 2>&1
rc=$?
grep -E "^(not )?ok " "$out"
# a failure: each failing test's report (its error, expected and actual values, stack)
[ "$rc" = 0 ] || awk '/^not ok /{p=1; print; next} /^ok /{p=0} p' "$out" | head -120
pass=$(sed -n 's/^# pass //p' "$out")
fail=$(sed -n 's/^# fail //p' "$out")
echo "server: ${pass:-0} passed, ${fail:-1} failed"
[ "$rc" = 0 ]
