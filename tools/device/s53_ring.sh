#!/usr/bin/env bash
# exp/s53-ring, prepared in session 53 and kept here as a patch on main (a
# new checkout holds main only): k_mmv's lone token tile and k_mmv_slices'
# plain products take their weights through a ring in shared memory, copied
# by cp.async in rows of 256 bytes (the L2's preferred shape on an H200,
# read_bw.cu) and read back as the mma fragments, so the bits stay main's.
# On the device machine, from main, .debs carried (see cuda_bench.sh):
#
#   bash tools/device/s53_ring.sh
#
# applies the patch, builds, runs the cuda unit tests (test_cuda_matmul_fused
# compares a row alone, on the rings, with it in batches of 4, 8 (k_mmv's
# ring) and 13+ (no ring) bitwise), then ab.sh: the patch against main on
# 12-layer qwen3-8b (one and four sequences) and nemotron-nano-9b-v2, then
# `check --device cuda` of every fixture and lat_load. About 6 minutes.
set -u
OUT=${OUT:-/tmp/s53_ring}
mkdir -p "$OUT"
. tools/device/debs.sh
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$OUT/log.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
git apply tools/device/s53_ring.patch || { say "the patch does not apply"; exit 1; }
nvcc -O3 -std=c++17 -arch=sm_90 tools/device/lat_load.cu -o /tmp/lat_load > "$OUT/tools_build.txt" 2>&1 &
make -j"$(nproc)" build/kapitsa build/test_unit > "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
say built
build/test_unit cuda 2>&1 | grep -v "^ok" | tee "$OUT/tests.txt"
cp build/kapitsa /tmp/kapitsa_ring
say tested
OUT=$OUT/ab timeout 330 bash tools/device/ab.sh -r 2 -v ring -v main=tools/device/s53_ring.patch \
    -s qwen3-8b:q8l:12 -s nemotron-nano-9b-v2:nn9l:12 \
    -b 'q8l_1|q8l --prompt 512 --gen 128' -b 'q8l_s4|q8l --prompt 512 --gen 64 --seqs 4' \
    -b 'nn9l_1|nn9l --prompt 512 --gen 128'
say ab
for f in tests/fixtures/*/; do
    [ -f "$f/config.json" ] && echo "$f $(timeout 60 /tmp/kapitsa_ring check "$f" --device cuda --tol 1e-3 2>&1 | tail -1)"
done | tee -a "$OUT/tests.txt"
say checked
wait
timeout 30 /tmp/lat_load > "$OUT/lat_load.txt" 2>&1
say done
