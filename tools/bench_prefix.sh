#!/usr/bin/env bash
# Time to first token of an agent's second turn, warm (the first turn is resident
# and its prefix reused) against cold (a fresh server), on the default model.
# usage: tools/bench_prefix.sh [RUNS]   (prints one line per run and the medians)
set -eu
cd "$(dirname "$0")/.."
runs=${1:-3}
port=$((20000 + RANDOM % 20000))
base=http://127.0.0.1:$port
sys=$(python3 -c 'import json,sys; print(json.dumps(open("src/engine/engine.c").read()[:6000]))')
turn1="{\"messages\":[{\"role\":\"system\",\"content\":$sys},{\"role\":\"user\",\"content\":\"What does engine_forward check?\"}],\"max_tokens\":16,\"temperature\":0}"
start() { build/kapitsa serve --port $port >/dev/null 2>&1 & pid=$!; until curl -sf $base/health >/dev/null; do sleep 0.1; done; }
stop() { kill $pid; wait $pid 2>/dev/null || true; }
post() { curl -s -o /tmp/kapitsa-bench-prefix.json -w '%{time_total}' $base/v1/chat/completions -d "$1"; }
warm_all=() cold_all=()
for r in $(seq "$runs"); do
    start
    post "$turn1" >/dev/null
    answer=$(python3 -c 'import json; print(json.dumps(json.load(open("/tmp/kapitsa-bench-prefix.json"))["choices"][0]["message"]["content"]))')
    turn2="{\"messages\":[{\"role\":\"system\",\"content\":$sys},{\"role\":\"user\",\"content\":\"What does engine_forward check?\"},{\"role\":\"assistant\",\"content\":$answer},{\"role\":\"user\",\"content\":\"And engine_commit?\"}],\"max_tokens\":1,\"temperature\":0}"
    warm=$(post "$turn2")
    usage=$(python3 -c 'import json; u=json.load(open("/tmp/kapitsa-bench-prefix.json"))["usage"]; print(u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])')
    stop
    start
    cold=$(post "$turn2")
    stop
    echo "run $r: prompt/cached tokens $usage, first token warm ${warm}s, cold ${cold}s"
    warm_all+=("$warm") cold_all+=("$cold")
done
python3 - "${warm_all[*]}" "${cold_all[*]}" <<'PY'
import statistics, sys
w = [float(x) for x in sys.argv[1].split()]; c = [float(x) for x in sys.argv[2].split()]
print(f"median first-token time: warm {statistics.median(w):.3f} s, cold {statistics.median(c):.3f} s, "
      f"cold/warm {statistics.median(c) / statistics.median(w):.1f}x")
PY
