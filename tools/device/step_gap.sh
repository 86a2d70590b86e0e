#!/usr/bin/env bash
# How long the GPU idles between two decode steps, while the host reads the
# step's token, commits it and uploads and launches the next step: the most
# that overlapping a step's host part with the GPU's previous step (feeding
# the token on the device, one step ahead) could gain. Prepared in session
# 55, not yet run. On the device machine, from main, .debs carried (see
# cuda_bench.sh):
#
#   bash tools/device/step_gap.sh
#
# builds, synthesises 12-layer qwen3-8b and qwen3-30b-a3b, and for each runs
# bench (decode tok/s) and a ktrace timeline of 16 decode steps summarised by
# `ktrace_sum.py --steps` (every forward's span and the idle time after it),
# with the host's CUDA calls (KTRACE_API=1) for qwen3-8b. About 2 minutes.
set -u
OUT=${OUT:-/tmp/step_gap}
mkdir -p "$OUT"
. tools/device/debs.sh
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$OUT/log.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
make -j"$(nproc)" build/kapitsa > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
say built
timeout 100 build/kapitsa synth --preset qwen3-8b --layers 12 --out /dev/shm/q8l > /dev/null &
timeout 100 build/kapitsa synth --preset qwen3-30b-a3b --layers 12 --out /dev/shm/q30l > /dev/null
wait
say synthesised
for m in q8l q30l; do
    build/kapitsa bench --model /dev/shm/$m --device cuda --prompt 512 --gen 128 2>&1 | grep decode |
        sed "s/^/$m /" | tee -a "$OUT/bench.txt"
    timeout 60 bash tools/device/ktrace.sh "$OUT/$m.csv" --steps -- --model /dev/shm/$m --device cuda \
        --prompt 512 --gen 16 > "$OUT/${m}_steps.txt" 2>&1
    tail -1 "$OUT/${m}_steps.txt"
    if [ $m = q8l ]; then
        KTRACE_API=1 timeout 60 bash tools/device/ktrace.sh "$OUT/${m}_api.csv" --steps -- --model /dev/shm/$m \
            --device cuda --prompt 512 --gen 16 > "$OUT/${m}_api_steps.txt" 2>&1
        python3 tools/device/ktrace_sum.py "$OUT/${m}_api.csv" --lines > "$OUT/${m}_api_lines.txt" 2>&1
    fi
    say $m
done
gzip -f "$OUT"/*.csv
