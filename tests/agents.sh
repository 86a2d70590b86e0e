#!/usr/bin/env bash
# make test-agents: real coding agents from npm, run non-interactively through
# `kapitsa launch` against a local server on the default model, offline. Checks
# that each run ends without an API error and that the server answered it.
# Slow on a CPU (Claude Code's ~19k-token prompt is prefilled at ~80 tok/s on
# 2 cores), so it is not part of make test. Agents done: Claude Code.
set -u
cd "$(dirname "$0")/.."
dir=build/agents
mkdir -p "$dir"
if [ ! -x "$dir/node_modules/.bin/claude" ]; then
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error @anthropic-ai/claude-code >/dev/null 2>&1) ||
        { echo "agents: 0 passed, 1 failed (npm install)"; exit 1; }
fi
port=$((20000 + RANDOM % 20000))
log=$(mktemp)
trap 'kill $srv 2>/dev/null; rm -f "$log"' EXIT
build/kapitsa serve --port $port --ctx 65536 2>"$log" &
srv=$!
until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do sleep 0.2; done
pass=0
fail=0
out=$(PATH="$PWD/$dir/node_modules/.bin:$PATH" timeout 1200 build/kapitsa launch claude --port $port -- \
    -p "Reply with one word." --max-turns 1 2>&1)
rc=$?
served=$(grep -cE "^kapitsa: request (stop|length)" "$log")
if [ "$rc" = 0 ] && [ "$served" -ge 1 ] && ! grep -q "API Error" <<<"$out"; then
    echo "ok - claude -p through kapitsa launch ($served requests served)"
    pass=$((pass + 1))
else
    echo "not ok - claude -p through kapitsa launch (exit $rc, $served requests served)"
    echo "$out" | tail -20
    tail -20 "$log"
    fail=$((fail + 1))
fi
echo "agents: $pass passed, $fail failed"
[ "$fail" = 0 ]
