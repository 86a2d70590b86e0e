#!/usr/bin/env bash
# kapitsa bench compare against two local servers (plain and KFlash): the
# table, the JSON, the SVG chart, and a clear error for a server that is not there.
# usage: tests/compare.sh KAPITSA_BINARY
set -u
bin=$1
tmp=$(mktemp -d)
export KAPITSA_DEVICE=cpu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/lib.sh"
p1=$(free_port)
p2=$(free_port)
while [ "$p2" = "$p1" ]; do p2=$(free_port); done
"$bin" serve --model "$here/../models/kapitsa-tiny" --port $p1 >"$tmp/s1" 2>&1 &
s1=$!
"$bin" serve --model "$here/../models/kapitsa-tiny" --draft "$here/../models/kapitsa-tiny-draft" --port $p2 >"$tmp/s2" 2>&1 &
s2=$!
p3=$(free_port)
while [ "$p3" = "$p1" ] || [ "$p3" = "$p2" ]; do p3=$(free_port); done
"$bin" serve --model "$here/../models/kapitsa-tiny" --api-key sesame --port $p3 >"$tmp/s3" 2>&1 &
s3=$!
trap 'kill $s1 $s2 $s3 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$p1/health" >/dev/null && curl -sf "http://127.0.0.1:$p2/health" >/dev/null &&
        curl -sf "http://127.0.0.1:$p3/health" >/dev/null && break
    sleep 0.1
done
pass=0
fail=0
check() { if eval "$2"; then echo "ok - $1"; pass=$((pass + 1)); else echo "not ok - $1"; fail=$((fail + 1)); fi; }
a=http://127.0.0.1:$p1/v1 b=http://127.0.0.1:$p2/v1
"$bin" bench compare --against $a --against $b/ --prompts 16,64 --gen 24 --reps 3 --svg "$tmp/c.svg" >"$tmp/out" 2>&1
rc=$?
check "compare runs against two servers" '[ $rc = 0 ]'
check "its progress on stderr, a line per tenth of the requests and the end" \
    'grep -q "^bench compare: 0 / 16 requests (0%)" "$tmp/out" && grep -q "^bench compare: 16 requests in " "$tmp/out"'
check "a row per server and prompt length" '[ $(grep -cE "^http://127.0.0.1:($p1|$p2)/v1 +(16|64) " "$tmp/out") = 4 ]'
check "decode speeds are positive, each row's min <= median <= max" \
    'awk "/^http/ { if (\$9 <= 0 || \$4 > \$5 || \$5 > \$6 || \$7 > \$8 || \$8 > \$9) bad = 1 } END { exit bad }" "$tmp/out"'
check "the chart names both servers" 'grep -q "<svg" "$tmp/c.svg" && grep -q ":$p1/v1)<" "$tmp/c.svg" && grep -q ":$p2/v1)<" "$tmp/c.svg"'
check "the chart names the model, the machine and the date" 'grep -q "kapitsa-tiny vs kapitsa-tiny" "$tmp/c.svg" && grep -q "$(date -u +%Y-%m-%d)" "$tmp/c.svg"'
check "the chart's axes have ticks" '[ $(grep -c "stroke=\"#ddd\"" "$tmp/c.svg") -ge 4 ]'
c=http://127.0.0.1:$p3/v1
"$bin" bench compare --against $c --prompts 8 --gen 8 --reps 1 >"$tmp/k" 2>&1
check "a server that wants a key: the message names --api-key" '[ $? = 1 ] && grep -q -- "--api-key" "$tmp/k"'
"$bin" bench compare --against $c --api-key sesame --model kapitsa-tiny --prompts 8 --gen 8 --reps 1 --json >"$tmp/k" 2>"$tmp/k.err"
check "--api-key and --model" 'python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; assert r[\"model\"] == \"kapitsa-tiny\" and r[\"completion_tokens\"] >= 1" "$tmp/k"'
"$bin" bench compare --against $a --against $b --model x --model y --model z >"$tmp/e" 2>&1
check "three --model for two servers is a usage error" '[ $? = 2 ] && grep -q "3 --model for 2 --against" "$tmp/e"'
"$bin" bench compare --against $a --prompts 8 --gen 8 --reps 2 --json >"$tmp/j" 2>"$tmp/j.err"
check "--json" 'python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; assert r[\"completion_tokens\"] >= 1 and r[\"ttft_s\"][0] <= r[\"ttft_s\"][2]" "$tmp/j"'
"$bin" bench compare --against http://127.0.0.1:1/v1 >"$tmp/e" 2>&1
check "a server that is not there" '[ $? = 1 ] && grep -q "Couldn.t connect" "$tmp/e"'
"$bin" bench compare --prompts 8 >"$tmp/e" 2>&1
check "no --against is a usage error" '[ $? = 2 ]'
curl -s "http://127.0.0.1:$p1/v1/completions" -d '{"prompt": "hi", "max_tokens": 60, "ignore_eos": true, "temperature": 0}' >"$tmp/ie"
check "ignore_eos generates max_tokens" 'grep -q "\"completion_tokens\":60" "$tmp/ie"'
[ "$fail" = 0 ] || { cat "$tmp/out"; }
echo "compare: $pass passed, $fail failed"
[ "$fail" = 0 ]
