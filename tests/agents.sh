#!/usr/bin/env bash
# make test-agents: the five coding agents from npm (pinned versions), each
# run non-interactively through `kapitsa launch` against one local server on
# the default model, offline: Claude Code (`claude -p`, Anthropic Messages),
# Codex (`codex exec`, Responses), opencode (`opencode run`, chat completions),
# pi (`pi -p`, chat completions) and Qwen Code (`qwen -p`, chat completions). Each must exit 0, print no API error,
# and the server must have answered its requests without an error. Every
# agent gets a fresh HOME and working folder, so nothing of the user's is read
# or written. A second Claude Code session must find the first one's prompt in
# the cache: launch gives it the same config folder, which its prompt names. Slow on a CPU (Claude Code's ~19k-token prompt prefills at
# ~80 tok/s on 2 cores), so it is not part of make test.
set -u
cd "$(dirname "$0")/.."
dir=build/agents
pkgs="@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1 @qwen-code/qwen-code@0.24.4"
mkdir -p "$dir"
if [ "$(cat "$dir/.pkgs" 2>/dev/null)" != "$pkgs" ]; then
    # shellcheck disable=SC2086
    bash tests/lib/npm_install.sh "$dir" $pkgs || { echo "agents: 0 passed, 1 failed (npm install)"; exit 1; }
    echo "$pkgs" > "$dir/.pkgs"
fi
export PATH="$PWD/$dir/node_modules/.bin:$PATH"
. tests/lib/lib.sh
port=$(free_port)
log=$(mktemp)
tmp=$(mktemp -d)
trap 'kill $srv 2>/dev/null; rm -rf "$log" "$tmp"' EXIT
build/kapitsa serve --port $port --ctx 65536 2>"$log" &
srv=$!
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$log"; echo "agents: 0 passed, 1 failed (server)"; exit 1; }
pass=0
fail=0
# run NAME TIMEOUT AGENT ARGS...: one agent run through kapitsa launch
run() {
    local name=$1 limit=$2 agent=$3
    shift 3
    local before after out rc served errors
    before=$(wc -l < "$log")
    mkdir -p "$tmp/$agent/home" "$tmp/$agent/work"
    out=$(cd "$tmp/$agent/work" && HOME="$tmp/$agent/home" XDG_STATE_HOME= timeout "$limit" "$OLDPWD/build/kapitsa" launch "$agent" \
        --port $port -- "$@" < /dev/null 2>&1)
    rc=$?
    after=$(tail -n +"$((before + 1))" "$log")
    served=$(grep -cE "^kapitsa: request (stop|length|tool_calls)" <<<"$after")
    errors=$(grep -cE "^kapitsa: (error|request error)" <<<"$after")
    # the agents' own words for a failed API call (Claude Code, Codex); the
    # model's text itself is noise from the tiny model and is not judged
    if [ "$rc" = 0 ] && [ "$served" -ge 1 ] && [ "$errors" = 0 ] && ! grep -qE "^(API Error|ERROR:)" <<<"$out"; then
        echo "ok - $name through kapitsa launch ($served requests served)"
        pass=$((pass + 1))
    else
        echo "not ok - $name through kapitsa launch (exit $rc, $served requests served, $errors server errors)"
        echo "$out" | tail -20
        echo "$after" | tail -20
        fail=$((fail + 1))
    fi
}
run "pi -p" 600 pi -p "Reply with one word."
run "codex exec" 900 codex exec --skip-git-repo-check "Reply with one word."
run "opencode run" 900 opencode run "Reply with one word."
run "qwen -p" 900 qwen -p "Reply with one word."
run "claude -p" 1500 claude -p "Reply with one word." --max-turns 1
first=$(wc -l < "$log")
run "claude -p, a second session" 1500 claude -p "Reply with one word." --max-turns 1
cached=$(tail -n +"$((first + 1))" "$log" | sed -n 's/^kapitsa: request [a-z_]*: [0-9]* prompt tokens (\([0-9]*\) cached).*/\1/p' |
    sort -n | tail -1)
if [ "${cached:-0}" -ge 10000 ]; then
    echo "ok - claude's second session reuses the first one's prompt ($cached tokens cached)"
    pass=$((pass + 1))
else
    echo "not ok - claude's second session prefilled its prompt again (at most ${cached:-0} tokens cached)"
    fail=$((fail + 1))
fi
echo "agents: $pass passed, $fail failed"
[ "$fail" = 0 ]
