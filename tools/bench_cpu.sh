#!/usr/bin/env bash
# Repeats `kapitsa bench` on a synth checkpoint and prints each run's JSON, so that
# BENCHMARKS.md can quote medians on a noisy shared machine.
# usage: tools/bench_cpu.sh PRESET THREADS RUNS [PROMPT GEN]
set -eu
preset=$1 threads=$2 runs=$3 prompt=${4:-128} gen=${5:-64}
dir=${SYNTH_DIR:-/tmp/kapitsa-synth}/$preset
[ -f "$dir/model.safetensors" ] || build/kapitsa synth --preset "$preset" --out "$dir" >/dev/null
for _ in $(seq "$runs"); do
    build/kapitsa bench --model "$dir" --threads "$threads" --prompt "$prompt" --gen "$gen" --json
done
