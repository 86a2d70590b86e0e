#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md's summary table, on the device machine (the
# repository root as working directory, the .debs folder carried, $OUT set):
#
#   bash tools/device/cuda_bench.sh [dense|hybrid|moe|all]
#
# One part fits one device call (at most 600 s; on an H200 with a warm build:
# dense about 200 s, hybrid 150, moe 370), so a session runs them as three
# calls; all runs them one after another. Decode rooflines are over the GPU's
# HBM peak: 4.8 TB/s (bench's default, the H200), 3.35 on an H100.
#   dense:  the read ceiling, mmv_bounds (load shapes, the products' chain),
#           the decode products alone, the cuda unit tests and the model and
#           KFlash suites on cuda, qwen3-8b whole
#           (decode, prefill 4096 and 25,000, 4 sequences, sampled decode),
#           KFlash on kapitsa-tiny;
#   hybrid: qwen3.5-9b, nemotron-nano-9b-v2 and qwen3.5-0.8b whole;
#   moe:    qwen3-30b-a3b and nemotron-3-nano-30b-a3b whole, spread routing
#           (61 and 64 GB of weights: in memory, /dev/shm, one at a time).
# .debs/extra.txz (untracked, ~1 MB, under the device's 64 MiB carry limit):
# the headers and libraries the device image lacks, made here by
#   apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0
#     libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2
#     libmicrohttpd-dev libmicrohttpd12 libedit-dev libedit2 libbsd0 libbsd-dev
#     libmd0 libmd-dev libcurl4-openssl-dev libssl-dev
# then `dpkg -x` of each into one folder, its usr/share and static libraries
# removed, usr/lib/x86_64-linux-gnu/libcurl.so and libcrypto.so replaced by
# links to the device image's /usr/lib/x86_64-linux-gnu/libcurl.so.4 and
# libcrypto.so.3, and `tar cJf .debs/extra.txz .` in that folder.
set -u
part=${1:-all}
case $part in dense | hybrid | moe | all) ;; *) echo "cuda_bench.sh: no part '$part'" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/cuda_bench}
mkdir -p "$OUT"
. tools/device/debs.sh
make -j16 build/kapitsa build/test_unit build/bench_gemv > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)
echo "$gpu" | tee "$OUT/gpu.txt"
peak=()
[[ $gpu == *H100* ]] && peak=(--peak-gbs 3350)
bench() { build/kapitsa bench --device cuda "${peak[@]}" "$@" 2>&1; }

dense() {
    # the read ceiling; the products' bounds; the decode products alone at a
    # decode step's, a KFlash tree's and 64 tokens
    nvcc -O3 -arch=sm_90 tools/device/read_bw.cu -o /tmp/read_bw && /tmp/read_bw | tee "$OUT/read_bw.txt"
    nvcc -O3 -std=c++17 -arch=sm_90 tools/device/mmv_bounds.cu -o /tmp/mmv_bounds && /tmp/mmv_bounds > "$OUT/mmv_bounds.txt" 2>&1
    for n in 1 24 64; do build/bench_gemv $n 10; done | tee "$OUT/gemv.txt"
    (build/kapitsa synth --preset qwen3-8b --out /dev/shm/q8 > /dev/null) &
    build/test_unit cuda 2>&1 | grep -v "^ok"
    for t in test_model test_spec; do
        KAPITSA_TEST_DEVICE=cuda timeout 200 build/test_unit $t 2>&1 | grep -E "not ok|check failed|unit:"
    done
    wait
    local m=(--model /dev/shm/q8)
    for _ in 1 2; do bench "${m[@]}" --prompt 512 --gen 128; done | tee "$OUT/q8.txt"
    bench "${m[@]}" --prompt 4096 --batch 4096 --gen 8 | tee -a "$OUT/q8.txt"
    bench "${m[@]}" --prompt 512 --gen 64 --seqs 4 | tee -a "$OUT/q8.txt"
    bench "${m[@]}" --prompt 25000 --batch 4096 --gen 64 | tee -a "$OUT/q8.txt"
    for a in "0.6,20" "0.6,0"; do bench "${m[@]}" --prompt 512 --gen 128 --sample $a | grep decode; done | tee -a "$OUT/q8.txt"
    rm -rf /dev/shm/q8
    for t in edit complete; do
        bench --model models/kapitsa-tiny --draft models/kapitsa-tiny-draft --prompt-file tools/bench_tasks/$t.txt \
            --gen 200 | tail -8
    done | tee "$OUT/spec.txt"
}

hybrid() {
    for p in qwen3.5-9b nemotron-nano-9b-v2 qwen3.5-0.8b; do
        timeout 150 build/kapitsa synth --preset $p --out /dev/shm/$p > /dev/null || { echo "synth $p failed"; continue; }
        echo "== $p"
        bench --model /dev/shm/$p --prompt 512 --gen 128
        bench --model /dev/shm/$p --prompt 4096 --batch 4096 --gen 8
        bench --model /dev/shm/$p --prompt 512 --gen 64 --seqs 4
        rm -rf /dev/shm/$p
    done | tee "$OUT/hybrid.txt"
}

moe() {
    for p in qwen3-30b-a3b nemotron-3-nano-30b-a3b; do
        timeout 330 build/kapitsa synth --preset $p --out /dev/shm/m > /dev/null || { echo "synth $p failed"; rm -rf /dev/shm/m; continue; }
        echo "== $p"
        for _ in 1 2; do bench --model /dev/shm/m --prompt 512 --gen 128; done
        bench --model /dev/shm/m --prompt 512 --gen 64 --seqs 4
        bench --model /dev/shm/m --prompt 512,4096,16384 --batch 4096 --gen 4
        rm -rf /dev/shm/m
    done | tee "$OUT/moe.txt"
}

case $part in
all) dense; hybrid; moe ;;
*) $part ;;
esac
