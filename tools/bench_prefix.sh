#!/usr/bin/env bash
# Time to first token with a prefix the server holds, against a fresh server.
# An agent's second turn: warm (the first turn is resident and extended) and
# cold (a fresh server). New sessions sharing the first turn's ~6 kB system
# prompt, each with its own question: the second and the third such session
# (on a model with recurrent layers the second pays for the system prompt
# again, since a state exists only where a conversation stopped, and keeps one
# where its prompt leaves the first's; the third starts there).
# usage: tools/bench_prefix.sh [RUNS] [MODEL]   (one line per run, then the medians;
# MODEL: a folder or catalog name, the embedded default model if none)
set -eu
cd "$(dirname "$0")/.."
runs=${1:-3}
model=${2:+--model $2}
port=$((20000 + RANDOM % 20000))
base=http://127.0.0.1:$port
sys=$(python3 -c 'import json,sys; print(json.dumps(open("src/engine/engine.c").read()[:6000]))')
ask() { echo "{\"messages\":[{\"role\":\"system\",\"content\":$sys},{\"role\":\"user\",\"content\":\"$1\"}],\"max_tokens\":$2,\"temperature\":0}"; }
turn1=$(ask "What does engine_forward check?" 16)
start() { build/kapitsa serve $model --port $port >/dev/null 2>&1 & pid=$!; until curl -sf $base/health >/dev/null; do sleep 0.1; done; }
stop() { kill $pid; wait $pid 2>/dev/null || true; }
post() { curl -s -o /tmp/kapitsa-bench-prefix.json -w '%{time_total}' $base/v1/chat/completions -d "$1"; }
cached() { python3 -c 'import json; u=json.load(open("/tmp/kapitsa-bench-prefix.json"))["usage"]; print(u["prompt_tokens_details"]["cached_tokens"], "/", u["prompt_tokens"], sep="")'; }
warm_all=() cold_all=() s2_all=() s3_all=()
for r in $(seq "$runs"); do
    start
    post "$turn1" >/dev/null
    answer=$(python3 -c 'import json; print(json.dumps(json.load(open("/tmp/kapitsa-bench-prefix.json"))["choices"][0]["message"]["content"]))')
    s2=$(post "$(ask "Which fields does struct engine own?" 1)")
    c2=$(cached)
    s3=$(post "$(ask "Where is the KV cache allocated?" 1)")
    c3=$(cached)
    turn2="{\"messages\":[{\"role\":\"system\",\"content\":$sys},{\"role\":\"user\",\"content\":\"What does engine_forward check?\"},{\"role\":\"assistant\",\"content\":$answer},{\"role\":\"user\",\"content\":\"And engine_commit?\"}],\"max_tokens\":1,\"temperature\":0}"
    warm=$(post "$turn2")
    cw=$(cached)
    stop
    start
    cold=$(post "$turn2")
    stop
    echo "run $r: second turn (cached/prompt tokens $cw) warm ${warm}s, cold ${cold}s;" \
        "new sessions: second ($c2) ${s2}s, third ($c3) ${s3}s"
    warm_all+=("$warm") cold_all+=("$cold") s2_all+=("$s2") s3_all+=("$s3")
done
python3 - "${warm_all[*]}" "${cold_all[*]}" "${s2_all[*]}" "${s3_all[*]}" <<'PY'
import statistics, sys
w, c, s2, s3 = (statistics.median(float(x) for x in a.split()) for a in sys.argv[1:5])
print(f"median first-token time: second turn warm {w:.3f} s, cold {c:.3f} s (cold/warm {c / w:.1f}x); "
      f"new sessions: second {s2:.3f} s, third {s3:.3f} s (second/third {s2 / s3:.1f}x)")
PY
