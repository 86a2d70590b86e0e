#!/usr/bin/env bash
# GGUF files quantised by llama.cpp's own llama-quantize, for tests/unit/test_gguf_model.c:
# two small random models (a dense qwen3 and a qwen3moe, one layer each) whose
# rows are whole 256-element blocks, so that every K-quant applies, written as
# F32 GGUF by `kapitsa quantize`, then quantised by llama-quantize into
# tests/data/gguf/, xz-compressed (the Makefile unpacks them into build/testdata).
# usage: tools/reference/llama_ggufs.sh LLAMA_CPP_BUILD_BIN   (e.g. /work/llama.cpp/build/bin)
set -euo pipefail
bin=$1
cd "$(dirname "$0")/../.."
out=tests/data/gguf
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 tools/reference/random_model.py "$work/dense" qwen3
/usr/bin/python3 tools/reference/random_model.py "$work/moe" qwen3_moe
mkdir -p "$out"
for m in dense moe; do
    build/kapitsa quantize "$work/$m" "$work/$m-f32.gguf" --recipe F32
done
for t in Q4_K_M Q3_K_M Q2_K IQ4_XS; do
    "$bin/llama-quantize" "$work/dense-f32.gguf" "$work/dense-$t.gguf" "$t" >/dev/null 2>&1
    xz -9e -c "$work/dense-$t.gguf" >"$out/dense-$t.gguf.xz"
done
"$bin/llama-quantize" "$work/moe-f32.gguf" "$work/moe-Q4_K_M.gguf" Q4_K_M >/dev/null 2>&1
xz -9e -c "$work/moe-Q4_K_M.gguf" >"$out/moe-Q4_K_M.gguf.xz"
ls -la "$out"
