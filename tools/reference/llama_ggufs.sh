#!/usr/bin/env bash
# GGUF files quantised by llama.cpp's own llama-quantize, for tests/unit/test_gguf_model.c:
# two small random models (a dense qwen3 and a qwen3moe) whose rows are whole
# 256-element blocks, so that every K-quant applies, written as F32 GGUF by
# `kapitsa quantize`, then quantised by llama-quantize into tests/data/gguf/.
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
for t in Q8_0 Q5_K_M Q4_K_M Q3_K_M Q2_K IQ4_XS; do
    "$bin/llama-quantize" "$work/dense-f32.gguf" "$out/dense-$t.gguf" "$t" >/dev/null 2>&1
done
for t in Q4_K_M; do
    "$bin/llama-quantize" "$work/moe-f32.gguf" "$out/moe-$t.gguf" "$t" >/dev/null 2>&1
done
ls -la "$out"
