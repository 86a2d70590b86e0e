#!/usr/bin/env bash
# kapitsa pull / list / rm against a local server that speaks the Hugging Face
# hub protocol (tests/lib/hub_server.py): the cache layout huggingface_hub writes,
# resume after a dropped connection, a corrupted file refused, a gated model,
# unknown repos and revisions, a file size limit (a full disk), two pulls of
# one model at once, and model references resolving through the cache; one
# quantisation of a GGUF repo (ORG/NAME:QUANT), and GGUF models in Ollama's
# store and llama.cpp's cache.
# usage: tests/pull.sh KAPITSA_BINARY
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
export ASAN_OPTIONS=exitcode=99:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1
export KAPITSA_DEVICE=cpu KAPITSA_CATALOG="$here/../models/catalog.json"
mkdir -p "$tmp/gguf/BF16"
"$bin" quantize "$here/../models/kapitsa-tiny" "$tmp/gguf/tiny-Q8_0.gguf" --recipe Q8_0 2>/dev/null
"$bin" quantize "$here/../models/kapitsa-tiny" "$tmp/gguf/BF16/tiny-BF16.gguf" --recipe BF16 2>/dev/null
python3 "$here/lib/hub_server.py" "$here/../models/kapitsa-tiny" "$tmp/port" "$tmp/log" "$tmp/gguf" &
srv=$!
trap 'kill $srv 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 50); do [ -f "$tmp/port" ] && break; sleep 0.1; done
export HF_ENDPOINT="http://127.0.0.1:$(cat "$tmp/port")" HF_HOME="$tmp/hf"
unset HF_TOKEN HF_HUB_CACHE
. "$here/lib/lib.sh"
# the layout huggingface_hub writes: blobs named by sha256 (LFS) or git blob sha1,
# snapshot entries relative symlinks into blobs, refs/main holding the commit
layout() { # REPO_DIR
    python3 - "$1" "$here/../models/kapitsa-tiny" <<'PY'
import hashlib, os, sys
repo, src = sys.argv[1], sys.argv[2]
commit = open(os.path.join(repo, "refs", "main")).read()
assert len(commit) == 40 and "\n" not in commit, commit
snap = os.path.join(repo, "snapshots", commit)
names = sorted(os.listdir(snap))
assert names == sorted(os.listdir(src)) if "README.md" not in os.listdir(src) else names == sorted(n for n in os.listdir(src) if n != "README.md"), names
for n in names:
    p = os.path.join(snap, n)
    t = os.readlink(p)
    assert t.startswith("../../blobs/"), t
    data = open(p, "rb").read()
    assert data == open(os.path.join(src, n), "rb").read(), n
    want = hashlib.sha256(data).hexdigest() if n.endswith(".safetensors") else \
        hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert os.path.basename(t) == want, (n, t)
assert not [b for b in os.listdir(os.path.join(repo, "blobs")) if b.endswith(".incomplete")]
print("layout ok")
PY
}
repo_dir="$HF_HOME/hub/models--kapitsa--tiny"

expect "pull a model, then the command to run next" 0 "snapshots/" \
    "pull: done; next: kapitsa chat --model kapitsa/tiny (or kapitsa serve --model kapitsa/tiny)" -- "$bin" pull kapitsa/tiny
expect "the cache layout of huggingface_hub" 0 "layout ok" -- layout "$repo_dir"
"$bin" run --model "$here/../models/kapitsa-tiny" --max-tokens 12 "def add(a, b):" >"$tmp/want" 2>/dev/null
expect "run from the cache by hub id gives the same text" 0 "$(cat "$tmp/want")" -- \
    "$bin" run --model kapitsa/tiny --max-tokens 12 "def add(a, b):"
expect "run of a model not downloaded, without --pull and without a terminal: says how to pull it" 1 "kapitsa pull" -- \
    env HF_HOME="$tmp/hf-fresh" "$bin" run --model kapitsa/tiny --max-tokens 12 "def add(a, b):"
expect "run --pull pulls it first, then gives the same text" 0 "$(cat "$tmp/want")" -- \
    env HF_HOME="$tmp/hf-fresh" "$bin" run --pull --model kapitsa/tiny --max-tokens 12 "def add(a, b):"
n_before=$(wc -l <"$tmp/log")
expect "a second pull downloads nothing" 0 "snapshots/" -- "$bin" pull kapitsa/tiny
[ "$(wc -l <"$tmp/log")" = "$n_before" ] && ok "no blob fetched again" || bad "no blob fetched again"

expect "a dropped connection is resumed" 0 "snapshots/" -- "$bin" pull kapitsa/flaky --parallel 1
grep -qE '^kapitsa/flaky model-0000[12]-of-00002.safetensors bytes=[1-9][0-9]*-$' "$tmp/log" &&
    ok "the retry asked for the rest with Range" || { bad "the retry asked for the rest with Range"; cat "$tmp/log"; }
expect "the flaky pull's files are intact" 0 "layout ok" -- layout "$HF_HOME/hub/models--kapitsa--flaky"

expect "a corrupted file is refused" 1 "sha256 mismatch" "nothing installed" -- "$bin" pull kapitsa/corrupt
if ls "$HF_HOME/hub/models--kapitsa--corrupt/blobs" | grep -v -E '^[0-9a-f]{40}$' | grep -q .; then
    bad "no corrupt blob installed"; ls "$HF_HOME/hub/models--kapitsa--corrupt/blobs"
else ok "no corrupt blob installed"; fi
[ ! -e "$HF_HOME/hub/models--kapitsa--corrupt/refs/main" ] && ok "no ref for the failed pull" || bad "no ref for the failed pull"

expect "a file larger than listed is refused" 1 "more than the 16 bytes it lists" "nothing installed" -- \
    "$bin" pull kapitsa/oversize
if find "$HF_HOME/hub/models--kapitsa--oversize" -name '*.incomplete' | grep -q .; then
    bad "no partial file of the oversized download"
else ok "no partial file of the oversized download"; fi
"$bin" pull kapitsa/oddnames >"$tmp/odd" 2>&1
odd_rc=$?
[ "$odd_rc" = 0 ] && ok "names with a space and '#' are fetched (percent-encoded)" ||
    { bad "names with a space and '#' are fetched (percent-encoded)"; cat "$tmp/odd"; }
grep -q $'\x1b' "$tmp/odd" && bad "no control character reaches the terminal" ||
    ok "no control character reaches the terminal"
grep -qF 'evil\x1b[2J.safetensors' "$tmp/odd" && ok "a control character is shown escaped" ||
    { bad "a control character is shown escaped"; cat "$tmp/odd"; }
[ "$(grep -c 'leaves the snapshot folder' "$tmp/odd")" = 3 ] && ok "names leaving the snapshot are reported" ||
    { bad "names leaving the snapshot are reported"; cat "$tmp/odd"; }
[ ! -e "$HF_HOME/hub/escape.json" ] && [ ! -e "$HF_HOME/escape.json" ] && ok "nothing written outside the cache" ||
    bad "nothing written outside the cache"

expect "a gated model without a token" 1 "gated or private" "HF_TOKEN" -- "$bin" pull kapitsa/gated
expect "a gated model with a wrong token" 1 "no access" -- env HF_TOKEN=bad "$bin" pull kapitsa/gated
expect "a gated model with the token" 0 "snapshots/" -- env HF_TOKEN=good-token "$bin" pull kapitsa/gated
expect "an unknown revision" 1 "has no revision 'v9'" -- "$bin" pull kapitsa/tiny --revision v9
expect "an unknown repo" 1 "no model kapitsa/none" -- "$bin" pull kapitsa/none
expect "a malformed revision" 1 "is not a revision" -- "$bin" pull kapitsa/tiny --revision '../x'
expect "no hub" 1 "cannot reach http://127.0.0.1:1 (Couldn't connect" "offline? HF_ENDPOINT names the hub" -- \
    env HF_ENDPOINT=http://127.0.0.1:1 "$bin" pull kapitsa/tiny
expect "a hub whose name does not resolve" 1 "cannot reach http://hub.invalid (Couldn't resolve" "HF_ENDPOINT" -- \
    env HF_ENDPOINT=http://hub.invalid "$bin" pull kapitsa/tiny
# config.json first: an architecture Kapitsa does not run is refused before any weight is fetched
: >"$tmp/log"
expect "an architecture Kapitsa does not run" 1 \
    "kapitsa/llama is not a model Kapitsa runs (config: " "model_type 'llama' is not supported" "nothing more was downloaded" -- \
    "$bin" pull kapitsa/llama
if [ "$(cut -d' ' -f2 "$tmp/log")" = config.json ]; then ok "only its config.json was fetched"
else bad "only its config.json was fetched"; cat "$tmp/log"; fi
[ ! -e "$HF_HOME/hub/models--kapitsa--llama/refs/main" ] && ok "no ref for the refused model" || bad "no ref for the refused model"

# a file size limit stands in for a full disk: the pull fails, nothing looks
# complete, and a later pull resumes from the partial file
export HF_HOME="$tmp/hf2"
expect "a full disk" 1 "disk full or file size limit" -- bash -c "ulimit -f 4096; exec \"$bin\" pull kapitsa/tiny --parallel 1"
shopt -s nullglob
big=("$HF_HOME"/hub/models--kapitsa--tiny/blobs/*.incomplete)
[ ${#big[@]} -ge 1 ] && ok "the partial download is kept as .incomplete" || bad "the partial download is kept as .incomplete"
[ ! -e "$HF_HOME/hub/models--kapitsa--tiny/refs/main" ] && ok "no ref after the full disk" || bad "no ref after the full disk"
: >"$tmp/log"
expect "the pull resumes once there is space" 0 "snapshots/" -- "$bin" pull kapitsa/tiny
grep -q 'bytes=[1-9]' "$tmp/log" && ok "it resumed with Range" || bad "it resumed with Range"
expect "the resumed files are intact" 0 "layout ok" -- layout "$HF_HOME/hub/models--kapitsa--tiny"

export HF_HOME="$tmp/hf3"
"$bin" pull kapitsa/tiny >"$tmp/a" 2>&1 &
a=$!
"$bin" pull kapitsa/tiny >"$tmp/b" 2>&1
rb=$?
wait $a
ra=$?
[ "$ra" = 0 ] && [ "$rb" = 0 ] && ok "two pulls at once both succeed" || { bad "two pulls at once both succeed ($ra, $rb)"; cat "$tmp/a" "$tmp/b"; }
expect "after two pulls at once the files are intact" 0 "layout ok" -- layout "$HF_HOME/hub/models--kapitsa--tiny"

expect "list shows the cached model" 0 "kapitsa/tiny" "qwen3-8b" -- "$bin" list
expect "rm removes it" 0 "removed kapitsa/tiny" -- "$bin" rm kapitsa/tiny
expect "a removed model is not found" 1 "not downloaded; run: kapitsa pull kapitsa/tiny" -- \
    "$bin" run --model kapitsa/tiny hi
expect "rm of a model not in the cache" 1 "not in the cache" -- "$bin" rm kapitsa/tiny
expect "a catalog name that is not downloaded" 1 "kapitsa pull Qwen/Qwen3-0.6B" -- "$bin" run --model qwen3-0.6b hi
expect "doctor" 0 "memory" "what fits" "agents" -- "$bin" doctor

# a GGUF repo: one quantisation's files, run by the same name
: >"$tmp/log"
expect "pull of one quantisation of a GGUF repo" 0 "snapshots/" -- "$bin" pull kapitsa/tiny-GGUF:Q8_0
grep -q 'tiny-Q8_0.gguf' "$tmp/log" && ! grep -q 'BF16' "$tmp/log" && ok "only that quantisation is fetched" ||
    bad "only that quantisation is fetched"
"$bin" run --model "$tmp/gguf/tiny-Q8_0.gguf" --max-tokens 12 "def add(a, b):" >"$tmp/want_q8" 2>/dev/null
expect "run --model ORG/NAME:QUANT" 0 "$(head -c 20 "$tmp/want_q8")" -- "$bin" run --model kapitsa/tiny-GGUF:Q8_0 \
    --max-tokens 12 "def add(a, b):"
expect "a quantisation in a folder of the repo" 0 "snapshots/" -- "$bin" pull kapitsa/tiny-GGUF:bf16
expect "it runs" 0 "" -- "$bin" run --model kapitsa/tiny-GGUF:BF16 --max-tokens 2 "def"
expect "a quantisation the repo lacks" 1 "no .gguf file of quantisation Q3_K" -- "$bin" pull kapitsa/tiny-GGUF:Q3_K
expect "a quantisation not downloaded" 1 "holds no .gguf of quantisation Q6_K" -- \
    "$bin" run --model kapitsa/tiny-GGUF:Q6_K hi

# Ollama's store (manifests naming the model layer's blob) and llama.cpp's cache
sha=$(sha256sum "$tmp/gguf/tiny-Q8_0.gguf" | cut -d' ' -f1)
mkdir -p "$tmp/ollama/blobs" "$tmp/ollama/manifests/registry.ollama.ai/library/tiny" "$tmp/llamacache"
cp "$tmp/gguf/tiny-Q8_0.gguf" "$tmp/ollama/blobs/sha256-$sha"
cp "$tmp/gguf/tiny-Q8_0.gguf" "$tmp/llamacache/kapitsa_tiny-Q8_0.gguf"
printf '{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:%s","size":1}]}' \
    "$sha" >"$tmp/ollama/manifests/registry.ollama.ai/library/tiny/q8"
export OLLAMA_MODELS="$tmp/ollama" LLAMA_CACHE="$tmp/llamacache"
expect "run --model ollama:NAME:TAG" 0 "$(head -c 20 "$tmp/want_q8")" -- "$bin" run --model ollama:tiny:q8 \
    --max-tokens 12 "def add(a, b):"
expect "an Ollama model that is not there" 1 "no Ollama model tiny:latest" -- "$bin" run --model ollama:tiny hi
expect "list shows the GGUF models of the three stores" 0 "kapitsa/tiny-GGUF:tiny-Q8_0.gguf" \
    "kapitsa/tiny-GGUF:BF16/tiny-BF16.gguf" "ollama:tiny:q8" "llamacache/kapitsa_tiny-Q8_0.gguf" -- "$bin" list

echo "pull: $pass passed, $fail failed"
[ "$fail" = 0 ]
