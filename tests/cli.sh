#!/usr/bin/env bash
# Command-line tests: kapitsa check on the fixtures and on broken checkpoints
# (each must fail with exit status 1 and a message naming the file and the
# tensor or field; never crash, also under ASan/UBSan), synth and bench.
# usage: tests/cli.sh KAPITSA_BINARY [--quick]   (--quick: skip synth/bench)
set -u
bin=$1
quick=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
fx=${KAPITSA_FIXTURES:-$here/fixtures}
tmp=$(mktemp -d)
export KAPITSA_CACHE="$tmp/cache" # the KFlash tuning cache, kept out of $HOME
trap 'rm -rf "$tmp"' EXIT
export KAPITSA_DEVICE=cpu # the cpu unless a test names --device
export ASAN_OPTIONS=exitcode=99:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1
. "$here/lib/lib.sh"

for arch in qwen3 qwen3_moe qwen3_yarn_sharded qwen3_f16_linear qwen3_moe_mixed; do
    expect "check $arch" 0 "ok" "ids identical ok" -- "$bin" check "$fx/$arch"
    expect "check $arch in chunks" 0 "in chunks" -- "$bin" check "$fx/$arch" --chunks 13,1,64 --threads 1
done
expect "check with fp32 rope reports the mismatch" 1 "MISMATCH" -- "$bin" check "$fx/qwen3" --rope-f32

# the cuda backend, when this build has it and the machine a GPU: every fixture,
# whole and in chunks, against the same goldens (tolerance 1e-3: the GPU scans
# each sequence token by token where the reference prefills in chunks, which
# over the 1000-token hybrid fixtures differs by up to 2.5e-4)
if "$bin" run --device cuda --max-tokens 1 x >/dev/null 2>&1; then
    for arch in qwen3 qwen3_moe qwen3_yarn_sharded qwen3_f16_linear qwen3_moe_mixed qwen3_next qwen3_5 qwen3_5_moe \
        nemotron_h nemotron_h_moe qwen3_5_wrapper qwen3_next_mixed nemotron_h_groups; do
        expect "cuda: check $arch" 0 "ok" "ids identical ok" -- "$bin" check "$fx/$arch" --device cuda --tol 1e-3
        expect "cuda: check $arch in chunks" 0 "in chunks" "ids identical ok" -- \
            "$bin" check "$fx/$arch" --device cuda --chunks 13,1,70,5 --tol 1e-3
    done
else
    echo "# no CUDA device: cuda checks skipped"
fi
expect "an unknown device" 1 "unknown device 'tpu'" -- "$bin" check "$fx/qwen3" --device tpu
expect "KAPITSA_PROFILE times each op" 0 "profile (cpu)" "matmul" "attention" -- \
    env KAPITSA_PROFILE=1 "$bin" run --model "$here/../models/kapitsa-tiny" --max-tokens 3 hello

# hybrids: prefill chunks smaller than, equal to and not multiples of the scan
# chunks (64 for the gated delta rule, 32 in the Mamba2 fixtures), 1 and 2 threads
for arch in qwen3_next qwen3_5 qwen3_5_moe nemotron_h nemotron_h_moe qwen3_5_wrapper qwen3_next_mixed nemotron_h_groups; do
    expect "check $arch" 0 "ok" "ids identical ok" -- "$bin" check "$fx/$arch"
    for t in 1 2; do
        for ch in 13,1,5 32 64 65,7 33,100; do
            expect "check $arch in chunks $ch, $t threads" 0 "in chunks" "ok" "ids identical ok" -- \
                "$bin" check "$fx/$arch" --chunks "$ch" --threads "$t"
        done
    done
done
python3 "$here/lib/break_hybrid.py" "$fx" "$tmp/hybrid"
h="$tmp/hybrid"
expect "hybrid: layer_types too short" 1 "'layer_types' must list one type per layer (4 layers)" -- "$bin" check "$h/qwen_pattern_len"
expect "hybrid: unknown layer type" 1 "layer 1 has unknown type 'sliding_attention'" -- "$bin" check "$h/qwen_unknown_type"
expect "hybrid: value heads" 1 "linear_num_value_heads (3) is not a multiple of linear_num_key_heads (2)" -- "$bin" check "$h/qwen_v_heads"
expect "hybrid: attention heads" 1 "num_attention_heads (5) is not a multiple of num_key_value_heads (2)" -- "$bin" check "$h/qwen_kv_heads"
expect "nemotron: pattern length" 1 "describes 6 layers, num_hidden_layers is 7" -- "$bin" check "$h/nemo_pattern_len"
expect "nemotron: unknown block" 1 "layer 2 has unknown type 'conv'" -- "$bin" check "$h/nemo_unknown_type"
expect "nemotron: mamba heads" 1 "mamba_num_heads (7) is not a multiple of n_groups (2)" -- "$bin" check "$h/nemo_heads"
expect "nemotron: expert groups" 1 "n_routed_experts 8, n_group 3" -- "$bin" check "$h/nemo_groups"
expect "nemotron: bare Infinity and the pattern form" 0 "ids identical ok" -- "$bin" check "$h/nemo_python_json"
expect "qwen3.5 without the output gate wants a smaller q_proj" 1 "q_proj.weight' has shape [256, 64], expected [128, 64]" -- "$bin" check "$h/qwen_no_gate"
expect "nemotron: pattern not a list" 1 "layer pattern (not a list or string)" -- "$bin" check "$h/nemo_list"

python3 "$here/lib/break_checkpoint.py" "$fx/qwen3" "$tmp/broken"
b=$tmp/broken
expect "truncated weights" 1 "model.safetensors" "outside" -- "$bin" check "$b/truncated"
expect "offsets past the end" 1 "model.safetensors" "q_proj.weight" "outside" -- "$bin" check "$b/past_end"
expect "overlapping tensors" 1 "model.safetensors" "overlap" "q_proj.weight" -- "$bin" check "$b/overlap"
expect "missing tensor" 1 "missing tensor 'model.layers.1.mlp.up_proj.weight'" -- "$bin" check "$b/missing_tensor"
expect "wrong shape" 1 "q_proj.weight' has shape [64, 128], expected [128, 64]" -- "$bin" check "$b/wrong_shape"
expect "unknown dtype" 1 "unsupported dtype 'F8_E5M2'" "q_proj.weight" -- "$bin" check "$b/unknown_dtype"
expect "integer weights" 1 "model.norm.weight' has dtype I32" -- "$bin" check "$b/int_weights"
expect "config without hidden_size" 1 "config.json" "missing field 'hidden_size'" -- "$bin" check "$b/no_hidden_size"
expect "malformed config" 1 "config.json" -- "$bin" check "$b/bad_json"
expect "unsupported model_type" 1 "model_type 'llama' is not supported" -- "$bin" check "$b/llama"
expect "config field of the wrong type" 1 "'num_attention_heads' must be an integer" -- "$bin" check "$b/heads_string"
expect "no config.json" 1 "config.json" -- "$bin" check "$b/no_config"
expect "no weights" 1 "model.safetensors" "No such file" -- "$bin" check "$b/no_weights"
expect "no such folder" 1 "nowhere" "No such file" -- "$bin" check "$tmp/nowhere"
tok=$here/../models/qwen3-tokenizer
expect "tokenize ids" 0 "[9707, 11, 1879, 0]" -- "$bin" tokenize --model "$tok" --ids "Hello, world!"
expect "tokenize pieces" 0 '"Ġworld"' -- "$bin" tokenize --model "$tok" --pieces "Hello world"
printf 'bad \xff utf8' >"$tmp/bad.txt"
expect "tokenize invalid UTF-8 from stdin" 1 "not valid UTF-8 (byte 4)" -- sh -c "'$bin' tokenize --model '$tok' - < '$tmp/bad.txt'"
expect "detokenize" 0 "Hello, world!" -- "$bin" detokenize --model "$tok" 9707 11 1879 0
expect "detokenize a bad id" 1 "not in the vocabulary" -- "$bin" detokenize --model "$tok" 99999999
expect "detokenize a non-number" 2 "is not a token id" -- "$bin" detokenize --model "$tok" 12x
cat >"$tmp/req.json" <<'JSON'
{"messages": [{"role": "user", "content": "List files"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
    "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
  {"role": "tool", "tool_call_id": "c1", "content": "a.c"}],
 "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object",
    "properties": {"path": {"type": "string"}}}}}],
 "chat_template_kwargs": {"enable_thinking": false}}
JSON
expect "render qwen3" 0 '{"name": "ls", "arguments": {"path": "."}}' "<tool_response>" "<think>" -- \
    sh -c "'$bin' render --model '$tok' < '$tmp/req.json'"
expect "render with another template" 0 "<function=ls>" "<parameter=path>" -- \
    sh -c "'$bin' render --model '$tok' --template '$fx/templates/Qwen3-Coder.jinja' < '$tmp/req.json'"
expect "render ids" 0 "[151644, 8948, 198" "151667, 271, 151668, 271]" -- sh -c "'$bin' render --model '$tok' --ids < '$tmp/req.json'"
printf '{%% if x %%}unclosed' >"$tmp/broken.jinja"
expect "render a broken template" 1 "broken.jinja" "jinja: line 1" -- \
    sh -c "'$bin' render --model '$tok' --template '$tmp/broken.jinja' < '$tmp/req.json'"
printf '{{ raise_exception("roles must alternate") }}' >"$tmp/raise.jinja"
expect "render a template that raises" 1 "roles must alternate" -- \
    sh -c "'$bin' render --model '$tok' --template '$tmp/raise.jinja' < '$tmp/req.json'"
expect "render a bad request" 1 "messages list" -- sh -c "echo '{\"messages\": 3}' | '$bin' render --model '$tok'"
expect "run the default model (greedy)" 0 "    return np.array([1, 2, 3" -- \
    sh -c "cd '$here/..' && '$bin' run --max-tokens 12 'def is_prime(n):
'"
expect "run --verbose: the timings on stderr, as ollama run --verbose gives them" 0 "load duration:" \
    "prompt eval count:    5 token(s), 0 of them from the cache" "prompt eval rate:" "eval count:           12 token(s)" \
    "eval rate:" -- sh -c "cd '$here/..' && '$bin' run --verbose --max-tokens 12 'def is_prime(n):
' 2>&1 >/dev/null"
expect "run --verbose: the same text on stdout" 0 "    return np.array([1, 2, 3" -- \
    sh -c "cd '$here/..' && '$bin' run --verbose --max-tokens 12 'def is_prime(n):
' 2>/dev/null"
expect "run --precision exact (fp32 products): the same greedy text" 0 "    return np.array([1, 2, 3" -- \
    sh -c "cd '$here/..' && '$bin' run --precision exact --max-tokens 12 'def is_prime(n):
'"
expect "--precision takes exact or fast" 2 "--precision takes exact or fast" -- "$bin" run --precision bogus hi
expect "run with an f32 KV cache: the same greedy text as the default bf16" 0 "    return np.array([1, 2, 3" -- \
    sh -c "cd '$here/..' && '$bin' run --kv-type f32 --max-tokens 12 'def is_prime(n):
'"
expect "run --kv-type with a bad type" 2 "--kv-type is f32 or bf16, not 'q8'" -- "$bin" run --kv-type q8 "x"
expect "check --kv-type bf16: the logits move past 2e-4, greedy ids stay" 1 "MISMATCH" "40/40 ids identical" -- \
    "$bin" check "$fx/qwen3" --kv-type bf16
expect "run as a chat turn, sampled" 0 "" -- "$bin" run --model "$here/../models/kapitsa-tiny" --chat --temp 0.8 --seed 1 --max-tokens 8 "hi"
expect "run a missing model" 1 "kapitsa:" -- "$bin" run --model "$tmp/nowhere" "x"

# KFlash through run: the same text as plain decoding, greedy and sampled with a seed's distribution
m="$here/../models"
"$bin" run --model "$m/kapitsa-tiny" --max-tokens 80 "$(cat "$here/../tools/bench_tasks/complete.txt")" > "$tmp/plain.txt" 2>/dev/null
for spec in "--spec lookup" "--draft $m/kapitsa-tiny-draft" "--draft $m/kapitsa-tiny-draft --spec chain --spec-tree 5,5" \
            "--draft $m/kapitsa-tiny-draft --spec-tree 8,4"; do
    if "$bin" run --model "$m/kapitsa-tiny" --max-tokens 80 $spec "$(cat "$here/../tools/bench_tasks/complete.txt")" \
        > "$tmp/spec.txt" 2>"$tmp/spec.err" && cmp -s "$tmp/plain.txt" "$tmp/spec.txt" && grep -q "target passes" "$tmp/spec.err"; then
        ok "run $spec: identical to plain decoding"
    else
        bad "run $spec: differs from plain decoding"; diff "$tmp/plain.txt" "$tmp/spec.txt" | head -5
    fi
done
# and over an f32 KV cache (the runs above use the default, bf16): a tree node reads the rows its plain step would
"$bin" run --model "$m/kapitsa-tiny" --kv-type f32 --max-tokens 80 "$(cat "$here/../tools/bench_tasks/complete.txt")" \
    > "$tmp/plain32.txt" 2>/dev/null
if "$bin" run --model "$m/kapitsa-tiny" --kv-type f32 --draft "$m/kapitsa-tiny-draft" --max-tokens 80 \
    "$(cat "$here/../tools/bench_tasks/complete.txt")" > "$tmp/spec32.txt" 2>/dev/null && cmp -s "$tmp/plain32.txt" "$tmp/spec32.txt"; then
    ok "run --kv-type f32 --draft: identical to plain decoding on the f32 cache"
else
    bad "run --kv-type f32 --draft: differs from plain decoding"; diff "$tmp/plain32.txt" "$tmp/spec32.txt" | head -5
fi
# kapitsa chat: several turns (the sequence kept between them), the same with KFlash
turns='Write a function that adds two numbers.\nNow one that subtracts.\n/reset\nhello\n'
printf "$turns" | "$bin" chat --model "$m/kapitsa-tiny" --max-tokens 24 > "$tmp/chat1.txt" 2>"$tmp/chat1.err"
printf "$turns" | "$bin" chat --model "$m/kapitsa-tiny" --max-tokens 24 --draft "$m/kapitsa-tiny-draft" > "$tmp/chat2.txt" 2>"$tmp/chat2.err"
if [ "$(grep -c '' "$tmp/chat1.txt")" -ge 3 ] && cmp -s "$tmp/chat1.txt" "$tmp/chat2.txt"; then
    ok "chat: three turns, the same with KFlash"
else
    bad "chat: plain and KFlash conversations differ"; cat "$tmp/chat1.err" "$tmp/chat2.err" | head -5
fi
# chat samples as the model's generation_config.json asks (here temperature 1.5: two seeds,
# two conversations), greedily with --temperature 0 (the same as kapitsa-tiny's, which names none)
g="$tmp/gencfg"
mkdir -p "$g"
for f in "$m/kapitsa-tiny"/*; do [ "$(basename "$f")" = generation_config.json ] || ln -sf "$f" "$g/"; done
echo '{"temperature": 1.5, "eos_token_id": [151645, 151643]}' > "$g/generation_config.json"
for s in 1 2; do printf "$turns" | "$bin" chat --model "$g" --max-tokens 24 --seed $s > "$tmp/chat_s$s.txt" 2>/dev/null; done
printf "$turns" | "$bin" chat --model "$g" --max-tokens 24 --temperature 0 > "$tmp/chat_t0.txt" 2>/dev/null
if ! cmp -s "$tmp/chat_s1.txt" "$tmp/chat_s2.txt" && cmp -s "$tmp/chat_t0.txt" "$tmp/chat1.txt"; then
    ok "chat: the model's generation_config sampling by default, --temperature 0 greedy"
else
    bad "chat: generation_config sampling"; head -3 "$tmp/chat_s1.txt" "$tmp/chat_s2.txt" "$tmp/chat_t0.txt"
fi
if grep -q "kapitsa-tiny-draft.*|cpu|1	" "$tmp/cache/kflash.tsv" 2>/dev/null; then
    ok "the tuned tree shape is cached per machine, model pair and device"
else
    bad "no tuning cache written to $tmp/cache/kflash.tsv"
fi
expect "run --draft again: the tuner goes on from what it learnt before" 0 "the tuner goes on from what it learnt before" -- \
    "$bin" run --model "$m/kapitsa-tiny" --max-tokens 8 --draft "$m/kapitsa-tiny-draft" "def f(x):"
# a message over several lines (a trailing backslash, or a block between lines of three quotes)
# is one turn: /stats counts its prompt tokens, the same either way
printf 'one\\\ntwo\n/stats\n/reset\n\"\"\"\none\ntwo\n\"\"\"\n/stats\n' |
    "$bin" chat --model "$m/kapitsa-tiny" --max-tokens 4 >/dev/null 2>"$tmp/chat3.err"
n1=$(grep -o 'prompt eval count: *[0-9]*' "$tmp/chat3.err" | sed -n 1p)
n2=$(grep -o 'prompt eval count: *[0-9]*' "$tmp/chat3.err" | sed -n 2p)
if [ -n "$n1" ] && [ "$n1" = "$n2" ] && grep -q "eval count:           4 token(s)" "$tmp/chat3.err"; then
    ok "chat: multi-line messages and /stats"
else
    bad "chat: multi-line messages and /stats ($n1 / $n2)"; head -5 "$tmp/chat3.err"
fi
# chat's banner and commands; /bye ends it (the /stats after it is never read)
expect "chat: the banner, /help, /think, /stats before a reply, an unknown command, /bye" 0 \
    "kapitsa chat with kapitsa-tiny, 8192 tokens of context. /help lists the commands" "/reset          start" \
    "thinking on" "thinking off" "unknown command '/frob' (/help lists them)" "no reply yet" "eval count:           4 token(s)" -- \
    sh -c "printf '/help\n/think\n/think off\n/frob\n/stats\nhi\n/stats\n/bye\n/stats\n' |
        '$bin' chat --model '$m/kapitsa-tiny' -n 4"
[ "$(grep -c 'prompt eval count' "$tmp/out")" = 1 ] && ok "chat: nothing is read after /bye" ||
    bad "chat: lines after /bye were read"
# /think renders the turn with reasoning (Qwen3's template then leaves out its empty <think></think>)
t_off=$(printf 'hi\n/stats\n' | "$bin" chat --model "$m/kapitsa-tiny" -n 2 2>&1 >/dev/null | grep -o 'prompt eval count: *[0-9]*')
t_on=$(printf '/think\nhi\n/stats\n' | "$bin" chat --model "$m/kapitsa-tiny" -n 2 2>&1 >/dev/null | grep -o 'prompt eval count: *[0-9]*')
if [ -n "$t_on" ] && [ -n "$t_off" ] && [ "${t_on##* }" -lt "${t_off##* }" ]; then
    ok "chat /think: the prompt without the empty reasoning block (${t_on##* } < ${t_off##* } tokens)"
else bad "chat /think: prompt tokens '$t_on' with, '$t_off' without"; fi
# past the context, the oldest turns go and the conversation goes on
expect "chat: past the context the oldest turns are dropped with a note" 0 "oldest turn" "dropped" -- \
    sh -c "printf 'a\nb\nc\nd\ne\nf\n' | '$bin' chat --model '$m/kapitsa-tiny' -c 100 -n 24 --temperature 0 &&
        ! printf 'a\nb\nc\nd\ne\nf\n' | '$bin' chat --model '$m/kapitsa-tiny' -c 100 -n 24 2>&1 | grep -q 'exceed the context'"
# Ctrl-C (SIGINT) stops a reply, twice, and the conversation goes on: the second turn's prompt holds
# the first turn and what its reply said before it was stopped (a context of twice -n, so that a
# second turn never drops the first however late the signal comes)
mkfifo "$tmp/chat_in"
"$bin" chat --model "$m/kapitsa-tiny" -c 16384 -n 8000 --temperature 0 <"$tmp/chat_in" >"$tmp/cc.out" 2>"$tmp/cc.err" &
cpid=$!
exec 7>"$tmp/chat_in"
echo "Write a long story." >&7
for _ in $(seq 600); do [ -s "$tmp/cc.out" ] && break; sleep 0.1; done
kill -INT $cpid
for _ in $(seq 600); do grep -q "stopped after" "$tmp/cc.err" && break; sleep 0.1; done
printf '/stats\nAnother one.\n' >&7
n0=$(wc -c <"$tmp/cc.out")
for _ in $(seq 600); do [ "$(wc -c <"$tmp/cc.out")" -gt "$n0" ] && break; sleep 0.1; done
kill -INT $cpid
printf '/stats\n/bye\n' >&7
exec 7>&-
wait $cpid
crc=$?
p1=$(grep -o 'prompt eval count: *[0-9]*' "$tmp/cc.err" | sed -n '1s/.* //p')
p2=$(grep -o 'prompt eval count: *[0-9]*' "$tmp/cc.err" | sed -n '2s/.* //p')
s1=$(grep -o 'stopped after [0-9]*' "$tmp/cc.err" | sed -n '1s/.* //p')
if [ "$crc" = 0 ] && [ "$(grep -c 'stopped after' "$tmp/cc.err")" = 2 ] && [ -n "$p2" ] && [ "$p2" -gt $((p1 + s1)) ]; then
    ok "chat: Ctrl-C stops the reply, the conversation goes on with what it said ($p1 + $s1 < $p2 tokens)"
else
    bad "chat: Ctrl-C (exit $crc)"; head -20 "$tmp/cc.err"
fi
expect "run --spec tree without a draft" 2 "needs --draft" -- "$bin" run --spec tree "x"
expect "run --spec with a bad name" 2 "--spec takes" -- "$bin" run --spec fast "x"
expect "bench --draft: four ways, identical; the verify curve beside the tuned shape" 0 '"spec":"tree+ngram"' \
    '"identical":true' '"verify_curve":[{"n":1,' '{"n":64,' '"tuned":{"nodes":' -- \
    "$bin" bench --model "$m/kapitsa-tiny" --draft "$m/kapitsa-tiny-draft" --prompt-file "$here/../tools/bench_tasks/edit.txt" --gen 48 --json
for f in qwen3 qwen3_moe nemotron_h_moe qwen3_5_wrapper qwen3_next; do
    expect "bench: $f's prefill FLOPs as its files count them (no embedding, no LM head)" 0 \
        "\"prefill_flops\":$(python3 "$here/lib/prefill_flops.py" "$fx/$f" 40)," -- \
        "$bin" bench --model "$fx/$f" --prompt 40 --gen 1 --json
done
expect "bench at several prompt lengths: a row each with the time to first token" 0 '"prompt":16' '"prompt":48' '"ttft_ms"' -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16,48 --gen 4 --json
expect "bench -r: the mean ± the standard deviation of the runs" 0 "mean ± standard deviation of 3 runs" \
    "decode        4 tokens" " ± " -- "$bin" bench -m "$m/kapitsa-tiny" -p 16 -n 4 -r 3
expect "bench --json: one shape, a row per length, with -r's deviations" 0 "ok" -- sh -c "
    '$bin' bench -m '$m/kapitsa-tiny' -p 16 -n 4 -r 2 --json >'$tmp/b1.json' &&
    '$bin' bench -m '$m/kapitsa-tiny' -p 16,32 -n 4 --repetitions=3 --json >'$tmp/b2.json' &&
    python3 -c 'import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert set(a) == set(b) and (a[\"reps\"], b[\"reps\"]) == (2, 3), (a, b)
assert [r[\"prompt\"] for r in a[\"rows\"]] == [16] and [r[\"prompt\"] for r in b[\"rows\"]] == [16, 32], (a, b)
assert all(set(r) == set(a[\"rows\"][0]) for r in b[\"rows\"]), b
assert all(r[\"decode_tok_s\"] > 0 and r[\"decode_tok_s_sd\"] >= 0 and r[\"prefill_tok_s_sd\"] >= 0 for r in a[\"rows\"] + b[\"rows\"])
print(\"ok\")' '$tmp/b1.json' '$tmp/b2.json'"
expect "bench -r 0 is refused" 2 "usage: kapitsa bench" -- "$bin" bench -m "$m/kapitsa-tiny" -r 0
expect "bench: prompts longer than a batch, with a last chunk of another size" 0 '"prompt":16' '"prompt":40' -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16,40 --batch 16 --gen 4 --json
expect "bench --seqs: sequences decoding together" 0 '"seqs":3' '"decode_tok_s_total"' -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16 --gen 4 --seqs 3 --json
expect "bench --mix: the prompt beside the decoding sequences, in chunks of the batch's rest" 0 '"mix_chunk":29' \
    '"mix_steps":3' '"mix_ttft_ms"' '"mix_decode_tok_s"' -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 70 --batch 32 --gen 4 --seqs 3 --mix --json
expect "bench --mix needs a batch larger than --seqs" 2 "usage" -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16 --batch 3 --seqs 3 --mix
expect "bench --sample with top_k: the top logits read" 0 "top_k 20, the top logits read" -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16 --gen 4 --seqs 2 --sample 0.7,20
expect "bench --sample without top_k: whole rows" 0 "top_k 0, whole rows read" -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16 --gen 4 --sample 1,0
expect "bench: a bf16 KV cache by default" 0 '"kv_type":"BF16"' -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16 --gen 4 --json
expect "bench --kv-type f32" 0 '"kv_type":"F32"' -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16 --gen 4 --kv-type f32 --json
expect "KAPITSA_PROFILE over an f32 KV cache" 0 "profile (cpu)" "attention" -- \
    env KAPITSA_PROFILE=1 "$bin" bench --model "$m/kapitsa-tiny" --prompt 16 --gen 4 --kv-type f32
expect "bench --sample needs T,K" 2 "usage" -- "$bin" bench --model "$m/kapitsa-tiny" --sample 0.7
expect "serve --prefill-chunk 0 is refused" 2 "--prefill-chunk TOKENS" "4096 tokens a step on a GPU" -- \
    "$bin" serve --prefill-chunk 0
expect "serve --prefill-chunk past 16384 is refused" 2 "--prefill-chunk TOKENS" -- "$bin" serve --prefill-chunk 20000
expect "serve --port past 65535 is refused" 2 "--port 0 takes any free port" -- "$bin" serve --port 65536
expect "serve --port -1 is refused" 2 "[--port N]" -- "$bin" serve --port -1
expect "serve --cors takes one origin, not a list" 2 "--cors takes one origin" -- "$bin" serve --cors "http://a, http://b"
expect "serve --cors takes no empty origin" 2 "--cors takes one origin" -- "$bin" serve --cors ""
expect "bench --seqs with several prompt lengths is refused" 2 "usage" -- \
    "$bin" bench --model "$m/kapitsa-tiny" --prompt 16,48 --seqs 3
expect "bench --draft with another vocabulary" 1 "vocabulary" -- \
    "$bin" bench --model "$m/kapitsa-tiny" --draft "$fx/qwen3" --prompt-file "$here/../tools/bench_tasks/edit.txt" --gen 8
# launch: stand-in agents (the real ones run in make test-agents) print what
# kapitsa launch gave them: the configuration each reads, pointing at the
# server it started, whose model id it asked for, in a folder of the agent's
# own under XDG_STATE_HOME (else ~/.local/state), the same at each launch
fake="$tmp/agents"
mkdir -p "$fake" "$tmp/lhome"
printf '#!/bin/sh\necho "home=$PI_CODING_AGENT_DIR args=$*"; cat "$PI_CODING_AGENT_DIR/models.json" "$PI_CODING_AGENT_DIR/settings.json"\ncurl -sf -H "x-api-key: $KAPITSA_API_KEY" http://127.0.0.1:$LPORT/v1/models\n' > "$fake/pi"
printf '#!/bin/sh\necho "home=$CODEX_HOME key=$KAPITSA_API_KEY"; cat "$CODEX_HOME/config.toml"\nexit 3\n' > "$fake/codex"
printf '#!/bin/sh\necho "home=$(dirname "$OPENCODE_CONFIG")"; cat "$OPENCODE_CONFIG"\n' > "$fake/opencode"
printf '#!/bin/sh\necho "home=$QWEN_HOME url=$OPENAI_BASE_URL key=$OPENAI_API_KEY model=$OPENAI_MODEL out=$QWEN_CODE_MAX_OUTPUT_TOKENS args=$*"; cat "$QWEN_HOME/settings.json"\n' > "$fake/qwen"
printf '#!/bin/sh\necho "home=$CLAUDE_CONFIG_DIR url=$ANTHROPIC_BASE_URL model=$ANTHROPIC_MODEL attribution=$CLAUDE_CODE_ATTRIBUTION_HEADER"\n' > "$fake/claude"
chmod +x "$fake"/*
LPORT=$(free_port)
export LPORT
expect "launch pi: models.json and settings.json for the served model" 0 '"id": "kapitsa-tiny"' \
    '"contextWindow": 65536' '"defaultModel": "kapitsa-tiny"' 'args=-p hi there' '"max_model_len":65536' \
    "loading kapitsa-tiny: 20.6 MB in" -- \
    env -u XDG_STATE_HOME HOME="$tmp/lhome" PATH="$fake:$PATH" "$bin" launch pi --port $LPORT -- -p "hi there"
home=$(sed -n 's/^home=\([^ ]*\).*/\1/p' "$tmp/out")
if [ "$home" = "$tmp/lhome/.local/state/kapitsa/agents/pi" ] && [ -f "$home/models.json" ] &&
    [ "$(ls -A "$tmp/lhome")" = ".local" ] && [ "$(stat -c %a "$home")" = 700 ]; then
    ok "launch keeps pi's config in ~/.local/state/kapitsa/agents/pi (mode 700) and writes nothing else in HOME"
else bad "launch put pi's config in '$home' or wrote elsewhere in HOME: $(ls -A "$tmp/lhome")"; fi
export XDG_STATE_HOME="$tmp/state" # the other launches' folders, kept out of the user's
expect "launch codex: a Responses provider in CODEX_HOME, the agent's exit status passed on" 3 \
    "home=$tmp/state/kapitsa/agents/codex " 'model = "kapitsa-tiny"' "base_url = \"http://127.0.0.1:$LPORT/v1\"" 'wire_api = "responses"' 'key=local' -- \
    env PATH="$fake:$PATH" "$bin" launch codex --port $LPORT
expect "launch opencode: an openai-compatible provider through OPENCODE_CONFIG" 0 \
    "home=$tmp/state/kapitsa/agents/opencode" '"model": "kapitsa/kapitsa-tiny"' "\"baseURL\": \"http://127.0.0.1:$LPORT/v1\"" '"context": 65536' -- \
    env PATH="$fake:$PATH" "$bin" launch opencode --port $LPORT
expect "launch claude: the Anthropic base URL, the model, no attribution line" 0 \
    "home=$tmp/state/kapitsa/agents/claude url=http://127.0.0.1:$LPORT model=kapitsa-tiny attribution=0" -- \
    env PATH="$fake:$PATH" "$bin" launch claude --port $LPORT
echo "a memory Claude Code wrote" > "$tmp/state/kapitsa/agents/claude/CLAUDE.md"
expect "launch claude again: the same CLAUDE_CONFIG_DIR (its path is in Claude Code's prompt), what it holds kept" 0 \
    "home=$tmp/state/kapitsa/agents/claude url=" -- \
    env PATH="$fake:$PATH" "$bin" launch claude --port $LPORT
[ -f "$tmp/state/kapitsa/agents/claude/CLAUDE.md" ] && ok "launch keeps what the agent wrote in its folder" ||
    bad "launch removed the agent's own files"
expect "launch: XDG_STATE_HOME relative is ignored (the XDG rule)" 3 "home=$tmp/lhome/.local/state/kapitsa/agents/codex" -- \
    env XDG_STATE_HOME=rel HOME="$tmp/lhome" PATH="$fake:$PATH" "$bin" launch codex --port $LPORT
expect "launch qwen: Qwen Code's OpenAI variables and QWEN_HOME/settings.json with the context" 0 \
    "home=$tmp/state/kapitsa/agents/qwen url=http://127.0.0.1:$LPORT/v1 key=local model=kapitsa-tiny out=4096 args=-p hi" \
    '"selectedType": "openai"' '"name": "kapitsa-tiny"' '"contextWindowSize": 65536' '"$version": 4' -- \
    env PATH="$fake:$PATH" "$bin" launch qwen --port $LPORT -- -p hi
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/state/kapitsa/agents/qwen/settings.json" &&
    ok "launch qwen: settings.json is JSON" || bad "launch qwen: settings.json is not JSON"
# checked before a server starts: a model that cannot load is never reached
expect "launch: an agent that is not installed, named before a server starts" 127 \
    "kapitsa launch: 'pi' is not on PATH; install it with: npm i -g @mariozechner/pi-coding-agent" -- \
    env PATH="/usr/bin:/bin" "$bin" launch pi --port "$(free_port)" --model "$tmp/nowhere"
expect "launch: an unknown agent" 2 "unknown agent" -- "$bin" launch vim
expect "bad flag" 2 "--chunks needs sizes" -- "$bin" check "$fx/qwen3" --chunks 0
expect "unknown command" 2 "unknown command" -- "$bin" frobnicate
# the command line every command shares: --help (and -h) on stdout with status 0,
# unknown options named with status 2, --flag=value, the short flags llama.cpp's users type
for c in check synth bench eval chat tokenize detokenize launch serve run pull list quantize imatrix rm doctor \
    render "bench compare" show ps; do
    expect "$c --help: its usage on stdout" 0 "usage: kapitsa $c" -- sh -c "'$bin' $c --help 2>/dev/null"
    expect "$c -h" 0 "usage: kapitsa $c" -- sh -c "'$bin' $c -h 2>/dev/null"
    expect "$c: an unknown option is named" 2 "kapitsa $c: unknown option '--frob'" -- "$bin" $c --frob
done
expect "run: an unknown short option is named" 2 "kapitsa run: unknown option '-q'" -- "$bin" run -q x
expect "detokenize --help is not read as a token id" 0 "usage: kapitsa detokenize" -- "$bin" detokenize --model "$tok" --help
expect "serve: an unexpected argument" 2 "kapitsa serve: unexpected argument 'x'" -- "$bin" serve x
expect "--version: version, commit, backends, the cpu kernels and the one chosen" 0 \
    "kapitsa $(cat "$here/../VERSION") (commit " "backends     cpu" "cpu kernels  ref avx2 avx512; running " -- "$bin" --version
expect "version, forced to the reference kernels" 0 "running ref" -- env KAPITSA_KERN=ref "$bin" version
expect "help names the five agents" 0 "claude, codex, opencode, pi or qwen" -- "$bin" --help
expect "a flag's value missing" 2 "kapitsa run: -n needs a value" -- "$bin" run x -n
expect "run --flag=value" 0 "    return np.array([1, 2, 3" -- \
    sh -c "cd '$here/..' && '$bin' run --max-tokens=12 --model=models/kapitsa-tiny --temperature=0 'def is_prime(n):
'"
expect "run -m -n -p -t --temp, as llama-cli takes them" 0 "    return np.array([1, 2, 3" -- \
    "$bin" run -m "$m/kapitsa-tiny" -n 12 -t 1 --temp 0 -p 'def is_prime(n):
'
expect "tokenize -m" 0 "[9707, 11, 1879, 0]" -- "$bin" tokenize -m "$tok" --ids "Hello, world!"
expect "bench -m -p -n -t, as llama-bench takes them" 0 '"prompt":16' '"gen":3' -- \
    "$bin" bench -m "$m/kapitsa-tiny" -p 16 -n 3 -t 1 --json
expect "serve --ctx-size=0 is refused" 2 "[-c|--ctx TOKENS]" -- "$bin" serve --ctx-size=0
expect "chat -c past the limit is refused" 2 "usage: kapitsa chat" -- "$bin" chat -c 99999999
expect "KAPITSA_PORT not a port" 2 "KAPITSA_PORT is 'http', not a number from 0 to 65535" -- \
    env KAPITSA_PORT=http "$bin" serve
expect "KAPITSA_CTX not a number" 2 "KAPITSA_CTX is '8k'" -- env KAPITSA_CTX=8k "$bin" chat
# KAPITSA_HOST, KAPITSA_PORT and KAPITSA_CTX set serve's defaults; launch finds that server by KAPITSA_PORT
# (the stand-in pi prints the server's /v1/models) and starts none of its own
SPORT=$(free_port)
KAPITSA_HOST=127.0.0.1 KAPITSA_PORT=$SPORT KAPITSA_CTX=3000 "$bin" serve --model "$m/kapitsa-tiny" 2>"$tmp/serve_env.log" &
spid=$!
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$SPORT/health" >/dev/null && break; sleep 0.1; done
expect "serve from KAPITSA_HOST/PORT/CTX, found by launch through KAPITSA_PORT" 0 '"max_model_len":3000' -- \
    env KAPITSA_PORT=$SPORT LPORT=$SPORT HOME="$tmp/lhome" PATH="$fake:$PATH" "$bin" launch pi
kill $spid
wait $spid 2>/dev/null
# serve --port 0 ARGS... in the background: its pid in $spid, the URL its first line names in $surl
serve_start() {
    local out=$1
    shift
    "$bin" serve --port 0 "$@" >"$out" 2>"$out.err" &
    spid=$!
    for _ in $(seq 600); do
        grep -q "^kapitsa: serving" "$out" || { kill -0 $spid 2>/dev/null && sleep 0.1 && continue; }
        break
    done
    surl=$(sed -n 's/^kapitsa: serving .* on //p' "$out")
}
serve_stop() { kill $spid; wait $spid 2>/dev/null; }
serve_start "$tmp/s_local" --host localhost --model "$m/kapitsa-tiny"
expect "serve --host localhost: named so in the banner, reached at 127.0.0.1" 0 '"status":"ok"' -- \
    sh -c "echo '$surl' | grep -q '^http://localhost:[0-9]*$' && curl -sf 'http://127.0.0.1:${surl##*:}/health'"
serve_stop
expect "serve: the model's load on stderr, a line per tenth and its end (not a terminal)" 0 \
    "loading kapitsa-tiny: " "(94%)" "loading kapitsa-tiny: 20.6 MB in " -- cat "$tmp/s_local.err"
if python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null; then
    for h in ::1 '[::1]'; do
        serve_start "$tmp/s_v6" --host "$h" --model "$m/kapitsa-tiny"
        expect "serve --host $h: an IPv6 address, bracketed in the URL" 0 '"status":"ok"' -- \
            sh -c "echo '$surl' | grep -q '^http://\[::1\]:[0-9]*$' && curl -gsf '$surl/health'"
        serve_stop
    done
else
    echo "# no IPv6 loopback: serve --host ::1 skipped"
fi
# --ctx past the model's positions (kapitsa-tiny: 65536) is capped, with a warning, and so advertised
serve_start "$tmp/s_ctx" --ctx 100000 --model "$m/kapitsa-tiny"
expect "serve --ctx past max_position_embeddings: capped, max_model_len says so" 0 '"max_model_len":65536' -- \
    curl -sf "$surl/v1/models"
serve_stop
expect "serve --ctx past max_position_embeddings: the warning" 0 \
    "warning: --ctx 100000 is past the model's context (max_position_embeddings 65536)" "KV cache:      65536 tokens" -- \
    cat "$tmp/s_ctx.err"
# the KFlash tuner across a restart: a server tunes as its requests go (kept once it settles and at
# shutdown), and the next server on this machine, model pair and device goes on from there
export KAPITSA_CACHE="$tmp/cache_serve"
serve_start "$tmp/s_tune" --model "$m/kapitsa-tiny" --draft "$m/kapitsa-tiny-draft"
curl -sf "$surl/v1/completions" -H 'content-type: application/json' \
    -d '{"model":"kapitsa-tiny","prompt":"def is_prime(n):","max_tokens":60,"temperature":0}' >/dev/null
serve_stop
expect "serve --draft: the tuner starts from nothing and is kept at shutdown" 0 "learns the tree shapes that pay here from nothing" \
    "kapitsa-tiny-draft|0|cpu|1" -- cat "$tmp/s_tune.err" "$KAPITSA_CACHE/kflash.tsv"
serve_start "$tmp/s_tune2" --model "$m/kapitsa-tiny" --draft "$m/kapitsa-tiny-draft"
serve_stop
expect "serve --draft again: the tuner goes on from what the last server learnt" 0 \
    "goes on from what it learnt before on this machine, model pair and device" -- cat "$tmp/s_tune2.err"
export KAPITSA_CACHE="$tmp/cache"
# show: a model's make-up from its headers, the same parameter count from its GGUF
expect "show: the embedded model" 0 "architecture   qwen3: 8 layers, hidden 64, 4 heads / 2 KV heads, head_dim 32" \
    "parameters     10.3M (10315328)" "weights        BF16 90 tensors" "context        65536 tokens" \
    "chat template  yes" "draft          kapitsa-tiny-draft" "model-00001-of-00002.safetensors" -- "$bin" show
expect "show --json: a hybrid's layers, no template" 0 "ok" -- sh -c "'$bin' show '$fx/qwen3_5' --json | python3 -c 'import json, sys
d = json.load(sys.stdin)
a = d[\"architecture\"]
assert d[\"format\"] == \"safetensors\" and a[\"recurrent_layers\"] > 0 and a[\"attention_layers\"] > 0, d
assert a[\"layers\"] == a[\"recurrent_layers\"] + a[\"attention_layers\"] and d[\"chat_template\"] is False, d
assert d[\"draft\"] is None and d[\"parameters\"] > 0 and \"config.json\" in [f[\"name\"] for f in d[\"files\"]], d
print(\"ok\")'"
expect "quantize: its progress, a line per tenth and the end" 0 "quantize: 0.0 MB / 10.8 MB (0%)  token_embd.weight" \
    "quantize: 10.8 MB in " -- "$bin" quantize "$m/kapitsa-tiny" "$tmp/tiny.gguf" --recipe Q4_K_M
# on a terminal (script's pseudo-terminal), one line redrawn in place: the end replaces the first line
if command -v script >/dev/null; then
    script -qec "'$bin' quantize '$m/kapitsa-tiny' '$tmp/tiny_tty.gguf' --recipe Q8_0" /dev/null >"$tmp/qtty" 2>&1
    if head -n 1 "$tmp/qtty" | grep -q $'^\r\e\[Kquantize: 0.0 MB / .*\r\e\[Kquantize: 11.0 MB in '; then
        ok "quantize on a terminal: one line, redrawn"
    else bad "quantize on a terminal: one line, redrawn"; od -c "$tmp/qtty" | head -8; fi
else
    echo "# no script(1): the terminal's progress line untested"
fi
if command -v script >/dev/null; then
    python3 -c 'print("def f(x): return x + 1\n" * 120, end="")' >"$tmp/long_prompt"
    script -qec "'$bin' run --max-tokens 2 \"\$(cat '$tmp/long_prompt')\" >/dev/null" /dev/null >"$tmp/ptty" 2>&1
    if grep -q $'\r\e\[Kprompt: 1199 tokens in ' "$tmp/ptty"; then
        ok "run on a terminal: a long prompt's prefill shows its progress"
    else bad "run on a terminal: a long prompt's prefill shows its progress"; od -c "$tmp/ptty" | head -8; fi
fi
python3 -c "import random, struct, sys
random.seed(1)
open(sys.argv[1], 'wb').write(struct.pack('<2000i', *[random.randrange(1000) for _ in range(2000)]))" "$tmp/ids.bin"
expect "eval: its progress in tokens" 0 "eval: held-out loss: 0 / 512 tokens (0%)" "eval: held-out loss: 512 tokens in " \
    '"tokens":512' -- "$bin" eval --model "$m/kapitsa-tiny" --ids "$tmp/ids.bin" --tokens 513
expect "show a GGUF: its types tensor by tensor, the checkpoint's parameter count" 0 "ok" -- \
    sh -c "'$bin' show '$tmp/tiny.gguf' --json | python3 -c 'import json, sys
d = json.load(sys.stdin)
assert d[\"format\"] == \"gguf\" and d[\"parameters\"] == 10315328 and d[\"chat_template\"] is True, d
assert \"Q4_K\" in d[\"dtypes\"] and \"Q6_K\" in d[\"dtypes\"] and d[\"context\"] == 65536, d
assert [f[\"name\"] for f in d[\"files\"]] == [\"tiny.gguf\"], d
print(\"ok\")'"
expect "show a missing model" 1 "nowhere" -- "$bin" show "$tmp/nowhere"
# ps: what a running server has loaded, from its /v1/models and /metrics
serve_start "$tmp/s_ps" --ctx 2048 --parallel 2 --api-key sesame --model "$m/kapitsa-tiny"
curl -sf -H "x-api-key: sesame" "$surl/v1/chat/completions" \
    -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": true}' >/dev/null
expect "ps: the model, its KV cache, memory, requests and resident conversations" 0 \
    "model      kapitsa-tiny on cpu, 2048 tokens of context" "KV cache   2048 tokens, bf16" "2 requests generated together" \
    "1 since it started" "resident   1 conversation kept for prefix reuse, " -- \
    env KAPITSA_API_KEY=sesame "$bin" ps --port "${surl##*:}"
expect "ps --json" 0 "ok" -- sh -c "'$bin' ps --port ${surl##*:} --api-key sesame --json | python3 -c 'import json, sys
d = json.load(sys.stdin)
assert (d[\"model\"], d[\"device\"], d[\"max_model_len\"], d[\"sequences\"]) == (\"kapitsa-tiny\", \"cpu\", 2048, 2), d
assert d[\"kv_cache\"] == {\"tokens\": 2048, \"bytes\": 2048 * 8 * 2 * 64 * 2, \"type\": \"bf16\"}, d
m = d[\"memory\"]
assert m[\"resident_bytes\"] > m[\"weights_bytes\"] == 20630656, m
r = d[\"requests\"]
assert (r[\"active\"], r[\"queued\"], r[\"total\"], r[\"generated_tokens\"]) == (0, 0, 1, 4), r
p = r[\"prompt_tokens\"]
assert d[\"resident\"] == {\"sequences\": 1, \"tokens\": p + 3}, (d[\"resident\"], p)
print(\"ok\")'"
expect "ps without the server's key" 1 "status 401" "--api-key or KAPITSA_API_KEY" -- "$bin" ps --port "${surl##*:}"
serve_stop
expect "ps with no server" 1 "kapitsa ps: no server answers at http://127.0.0.1:${surl##*:}" -- "$bin" ps --port "${surl##*:}"
# doctor and list with the catalog's quantised sizes; then a catalog of one model no machine holds in bf16
# whose Qwen-style GGUF is small: doctor says bf16 does not fit, shows the recipe that does and recommends it
NPORT=$(free_port)
expect "doctor" 0 "what fits" "GB/s, measured" "the rule: the most parameters that keep 32k" "recommended:" \
    "embedded kapitsa-tiny (" "the default --model: runs with no download" \
    "server   none at http://127.0.0.1:$NPORT (kapitsa serve starts one)" ", qwen " -- env KAPITSA_PORT=$NPORT "$bin" doctor
# doctor finds a server already on serve's default address (KAPITSA_PORT here)
serve_start "$tmp/s_doc" --model "$m/kapitsa-tiny"
expect "doctor: a server already running" 0 "server   kapitsa-tiny is served at $surl (kapitsa ps" -- \
    env KAPITSA_PORT="${surl##*:}" "$bin" doctor
expect "doctor --json: the embedded model and the server" 0 "ok" -- sh -c "KAPITSA_PORT=${surl##*:} '$bin' doctor --json |
    python3 -c 'import json, sys
d = json.load(sys.stdin)
e, s = d[\"embedded\"], d[\"server\"]
assert e[\"name\"] == \"kapitsa-tiny\" and e[\"bytes\"] > 1000000 and e[\"draft\"] == \"kapitsa-tiny-draft\", e
assert s == {\"url\": \"$surl\", \"answers\": True, \"model\": \"kapitsa-tiny\"}, s
print(\"ok\")'"
serve_stop
expect "list: the bf16 and Q4_K_M sizes" 0 "Q4_K_M" "61.1 GB   18.5 GB" -- "$bin" list
expect "list: the embedded models first" 0 "embedded (no download):" "kapitsa-tiny               the default --model" \
    "kapitsa-tiny-draft         its KFlash draft" -- "$bin" list
expect "list --json" 0 "ok" -- sh -c "'$bin' list --json | python3 -c 'import json, sys
d = json.load(sys.stdin)
assert [e[\"name\"] for e in d[\"embedded\"]] == [\"kapitsa-tiny\", \"kapitsa-tiny-draft\"], d[\"embedded\"]
assert d[\"embedded\"][0][\"bytes\"] > 1000000
q = [m for m in d[\"catalog\"] if m[\"name\"] == \"qwen3-30b-a3b\"][0]
assert q[\"bytes\"] == 61064245248 and q[\"q4_k_m_bytes\"] > 0 and q[\"draft\"] and type(q[\"installed\"]) is bool, q
assert type(d[\"other\"]) is list and type(d[\"gguf\"]) is list
print(\"ok\")'"
cat >"$tmp/catalog.json" <<'JSON'
{"models": [{"name": "huge", "repo": "org/huge", "revision": "main", "arch": "qwen3", "params": 5000000000000,
  "bytes": 10000000000000, "active_bytes": 10000000000000, "context": 40960, "kv_bytes_per_token": 4096,
  "state_bytes": 0, "gguf": {"repo": "org/huge-GGUF", "quants": ["Q4_K_M"]},
  "quant": {"Q8_0": {"bytes": 5000000000000, "active_bytes": 5000000000000},
            "Q4_K_M": {"bytes": 100000000, "active_bytes": 1000000}}}]}
JSON
expect "doctor: nothing fits in bf16, a recipe does" 0 "huge                       bf16    10000.0 GB  does not fit" \
    "Q4_K_M     0.1 GB  cpu (memory)" "recommended: huge Q4_K_M on the cpu, 40960 tokens of context" \
    "kapitsa pull org/huge-GGUF:Q4_K_M" -- env KAPITSA_CATALOG="$tmp/catalog.json" "$bin" doctor
expect "doctor --json: the same report as one object" 0 "ok" -- sh -c "KAPITSA_CATALOG='$tmp/catalog.json' '$bin' doctor --json |
    python3 -c 'import json, sys
d = json.load(sys.stdin)
assert d[\"cpu\"][\"cores\"] >= 1 and d[\"memory\"][\"total_bytes\"] > 0 and d[\"read_bandwidth_gb_s\"] > 0, d
assert [(m[\"name\"], m[\"weights\"], m[\"where\"]) for m in d[\"models\"]] == [(\"huge\", \"bf16\", None), (\"huge\", \"Q4_K_M\", \"cpu\")], d[\"models\"]
r = d[\"recommended\"]
assert (r[\"name\"], r[\"weights\"], r[\"context\"]) == (\"huge\", \"Q4_K_M\", 40960) and \"huge-GGUF:Q4_K_M\" in r[\"next\"], r
assert set(d[\"agents\"]) == {\"claude\", \"codex\", \"opencode\", \"pi\", \"qwen\"}
print(\"ok\")'"
# make install: the binary under test and its data under a prefix; the installed binary runs the
# embedded model from any folder, as the build does; a binary copied without its data says where it
# looked, and KAPITSA_DATA points it at the data
inst="$tmp/inst"
absbin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
expect "make install PREFIX=" 0 -- env -u MAKEFLAGS -u MAKELEVEL make -s -C "$here/.." install PREFIX="$inst" INSTALL_BIN="$absbin"
(cd "$here/.." && "$bin" run --max-tokens 4 hello >"$tmp/run_src.txt" 2>/dev/null)
if (cd / && "$inst/bin/kapitsa" run --max-tokens 4 hello >"$tmp/run_inst.txt" 2>"$tmp/run_inst.err") &&
    [ -s "$tmp/run_src.txt" ] && cmp -s "$tmp/run_src.txt" "$tmp/run_inst.txt"; then
    ok "installed: run --max-tokens 4 from / gives the build's text"
else
    bad "installed: run differs or fails"; head -3 "$tmp/run_inst.err" "$tmp/run_inst.txt"
fi
expect "installed: --version" 0 "kapitsa $(cat "$here/../VERSION")" -- "$inst/bin/kapitsa" --version
expect "installed: list finds the catalog" 0 "Q4_K_M" -- sh -c "cd / && '$inst/bin/kapitsa' list"
expect "installed: the embedded model is the installed copy" 0 "\"path\": \"$inst/share/kapitsa/models/kapitsa-tiny\"" -- \
    sh -c "cd / && '$inst/bin/kapitsa' list --json"
expect "installed: a systemd user unit for serve" 0 "ExecStart=$inst/bin/kapitsa serve" -- \
    cat "$inst/lib/systemd/user/kapitsa.service"
# the installed binary serves its web page from share/kapitsa/web
bin_build=$bin
bin=$inst/bin/kapitsa
cd /
serve_start "$tmp/s_inst" --model "$inst/share/kapitsa/models/kapitsa-tiny"
cd "$OLDPWD" || exit 1
expect "installed: serve's page and its script" 0 '<script src="app.js"' "/v1/chat/completions" -- \
    sh -c "curl -sf '$surl/' && curl -sf '$surl/app.js'"
serve_stop
bin=$bin_build
mkdir -p "$tmp/copied"
cp "$bin" "$tmp/copied/kapitsa"
expect "a binary copied without its data says where it looked" 1 "kapitsa-tiny is in none of" \
    "share/kapitsa/models" "make install" -- sh -c "cd / && '$tmp/copied/kapitsa' run --max-tokens 4 hello"
expect "a copied binary with KAPITSA_DATA" 0 "Q4_K_M" -- \
    sh -c "cd / && KAPITSA_DATA='$inst/share/kapitsa/models' '$tmp/copied/kapitsa' list"
# without its web page, serve's base URL still says that the server is up (clients probe it)
bin=$tmp/copied/kapitsa
cd /
serve_start "$tmp/s_copied" --model "$inst/share/kapitsa/models/kapitsa-tiny"
cd "$OLDPWD" || exit 1
expect "a copied binary without its web page: GET / says the server is up" 0 '"status":"ok"' -- curl -sf "$surl/"
serve_stop
bin=$bin_build
# tools/deps.sh (make's set-up) against stand-ins for dpkg, id and apt-get: nothing to do when every
# package is installed; as root it installs the missing ones; without root or sudo it prints the command
stub="$tmp/deps_stub"
mkdir -p "$stub"
printf '#!/bin/sh\necho 1000\n' >"$stub/id"
printf '#!/bin/sh\n[ "$2" = libssl-dev ] && echo "Status: install ok installed"\nexit 0\n' >"$stub/dpkg"
printf '#!/bin/sh\necho "apt-get $*"\n' >"$stub/apt-get"
chmod +x "$stub"/*
ln -s "$(command -v sh)" "$stub/sh"
deps=$here/../tools/deps.sh
expect "deps: without root or sudo, the one command to run" 1 "could not install" \
    "apt-get install -y --no-install-recommends build-essential libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libedit-dev" -- \
    env PATH="$stub" /bin/bash "$deps" build
expect "deps: test adds the tests' packages (npm absent here)" 1 "libedit-dev clang libclang-rt-14-dev xz-utils python3 curl chromium nodejs npm" -- \
    env PATH="$stub" /bin/bash "$deps" test
printf '#!/bin/sh\necho 0\n' >"$stub/id"
expect "deps: as root, apt-get installs what is missing" 0 "apt-get update" \
    "apt-get install -y --no-install-recommends build-essential libjansson-dev" -- env PATH="$stub" /bin/bash "$deps" build
printf '#!/bin/sh\necho "Status: install ok installed"\n' >"$stub/dpkg"
expect "deps: nothing missing, nothing done" 0 -- env PATH="$stub" /bin/bash "$deps" test
if [ ! -s "$tmp/out" ]; then ok "deps: silent when nothing is missing"; else bad "deps: output when nothing is missing"; cat "$tmp/out"; fi
expect "deps: a bad mode" 2 "usage: tools/deps.sh build|test" -- /bin/bash "$deps"
# kapitsa synth's MoE checkpoints ask for spread routing in their config; bench says so
cp -r "$fx/qwen3_moe" "$tmp/moe_spread"
sed -i '0,/{/s//{"kapitsa_route_spread": true, /' "$tmp/moe_spread/config.json"
expect "bench: a MoE model without spread routing" 0 '"route_spread":false' -- \
    "$bin" bench --model "$fx/qwen3_moe" --prompt 8 --gen 2 --json
expect "bench: spread routing" 0 '"route_spread":true' '"decode_tok_s"' -- \
    "$bin" bench --model "$tmp/moe_spread" --prompt 8 --gen 2 --json

if [ "$quick" != "--quick" ]; then
    expect "synth qwen3-0.6b" 0 "wrote" -- "$bin" synth --preset qwen3-0.6b --out "$tmp/q06"
    expect "bench on the synth checkpoint" 0 '"decode_tok_s"' '"prefill_tok_s"' -- \
        "$bin" bench --model "$tmp/q06" --prompt 16 --gen 2 --json
    expect "synth unknown preset" 2 "unknown preset" -- "$bin" synth --preset qwen9 --out "$tmp/x"
    expect "synth --layers: the first 2 layers of qwen3-0.6b" 0 "wrote" -- \
        "$bin" synth --preset qwen3-0.6b --layers 2 --out "$tmp/q06l"
    expect "synth --layers: the config says 2 layers" 0 '"num_hidden_layers": 2' -- cat "$tmp/q06l/config.json"
    expect "synth --layers: bench runs the short model" 0 '"decode_tok_s"' -- \
        "$bin" bench --model "$tmp/q06l" --prompt 8 --gen 2 --json
    expect "synth --layers 1: the Qwen3 tokenizer beside the weights, the progress of the weights" 0 "tokenizer: Qwen3's" \
        "synth: 0.0 MB / 342.6 MB (0%)" "synth: 342.6 MB in " -- \
        "$bin" synth --preset qwen3-0.6b --layers 1 --out "$tmp/q06one"
    expect "synth: a greedy generation_config" 0 '"do_sample": false' -- cat "$tmp/q06one/generation_config.json"
    expect "run on a synth checkpoint as it is" 0 -- "$bin" run --model "$tmp/q06one" --max-tokens 2 hello
    expect "synth qwen3.5: Qwen3's tokenizer as a stand-in" 0 "as a stand-in" -- \
        "$bin" synth --preset qwen3.5-0.8b --layers 1 --out "$tmp/q35one"
    expect "run on a synth qwen3.5 checkpoint" 0 -- "$bin" run --model "$tmp/q35one" --max-tokens 2 hello
    # serve's memory check before the KV cache (f32, 2^24 tokens of qwen3-0.6b's 28 layers: 3.8 TB), and an
    # allocation that fails (under a 3 GB address space: a cuda build's libraries take some) naming what it was for; the copies' configs allow
    # that many positions
    for d in q06 q06one; do
        mkdir -p "$tmp/${d}_long"
        for f in "$tmp/$d"/*; do ln -s "$f" "$tmp/${d}_long/"; done
        rm "$tmp/${d}_long/config.json"
        sed 's/"max_position_embeddings": 40960/"max_position_embeddings": 16777216/' "$tmp/$d/config.json" \
            >"$tmp/${d}_long/config.json"
    done
    expect "serve: a KV cache past the memory left is refused, saying what to lower" 1 "the KV cache of 16777216 tokens (f32) needs" \
        "lower --ctx (" "or take --kv-type bf16" -- "$bin" serve --model "$tmp/q06_long" --port 0 --ctx 16777216 --kv-type f32
    expect "serve: a failed allocation names the KV cache" 1 "for the KV cache of 1048576 tokens" -- \
        sh -c "ulimit -v 3000000; exec '$bin' serve --model '$tmp/q06one_long' --port 0 --ctx 1048576 -t 1"
    expect "synth --layers 0" 2 "--layers takes 1 to 28" -- "$bin" synth --preset qwen3-0.6b --layers 0 --out "$tmp/x"
    expect "synth --layers past the preset" 2 "--layers takes 1 to 28" -- \
        "$bin" synth --preset qwen3-0.6b --layers 29 --out "$tmp/x"
fi
echo "cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
