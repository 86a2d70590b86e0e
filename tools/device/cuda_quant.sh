#!/usr/bin/env bash
# Quantised weights on the GPU (BENCHMARKS.md's GGUF-on-CUDA rows), on the
# device machine (repository root, .debs carried, $OUT set), in two calls
# issued back to back (the machine stays warm ~30 s between them):
#
#   bash tools/device/cuda_quant.sh test    build; the cuda unit tests, the
#                                           quantised fixtures on cuda; starts
#                                           qwen3-8b's synth + quantize behind
#   bash tools/device/cuda_quant.sh bench   waits for those files, then decode,
#                                           prefill and batched decode of the
#                                           Q4_K_M and Q8_0 GGUFs and of bf16
#   bash tools/device/cuda_quant.sh all     both in one call, on 12 of the 8B
#                                           model's 36 layers
set -u
part=${1:-}
OUT=${OUT:-/tmp/cuda_quant}
mkdir -p "$OUT"
. tools/device/debs.sh
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)
bench() { build/kapitsa bench --device cuda "$@" 2>&1; }

case $part in
test)
    echo "$gpu" | tee "$OUT/gpu.txt"
    make -j16 build/kapitsa build/test_unit > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
    # the 8B model's files, made while the tests run
    setsid bash -c 'build/kapitsa synth --preset qwen3-8b --out /dev/shm/q8 > /dev/shm/prep.txt 2>&1 &&
        build/kapitsa quantize /dev/shm/q8 /dev/shm/q8-q4km.gguf --recipe Q4_K_M >> /dev/shm/prep.txt 2>&1 &&
        build/kapitsa quantize /dev/shm/q8 /dev/shm/q8-q80.gguf --recipe Q8_0 >> /dev/shm/prep.txt 2>&1;
        echo done >> /dev/shm/prep.txt' < /dev/null > /dev/null 2>&1 &
    build/test_unit test_cuda 2>&1 | grep -v "^ok" | tee "$OUT/unit.txt"
    KAPITSA_TEST_DEVICE=cuda build/test_unit test_gguf_model_device test_model test_spec 2>&1 | grep -v "^ok" |
        tee -a "$OUT/unit.txt"
    ;;
bench)
    while ! grep -q done /dev/shm/prep.txt 2>/dev/null; do sleep 2; done
    cat /dev/shm/prep.txt | tail -3
    ls -la /dev/shm/*.gguf
    for m in /dev/shm/q8-q4km.gguf /dev/shm/q8-q80.gguf /dev/shm/q8; do
        echo "== $m"
        bench --model "$m" --prompt 512 --gen 128
        bench --model "$m" --prompt 512 --gen 128 | grep decode
        bench --model "$m" --prompt 4096 --batch 4096 --gen 8 | grep prefill
        for s in 4 16 64; do bench --model "$m" --prompt 128 --gen 32 --seqs $s | grep decode; done
    done 2>&1 | tee "$OUT/bench.txt"
    ;;
all)
    # one call: the build, the block-type tests, then qwen3-8b's first 12
    # layers (real shapes, a third of the weights) at Q4_K_M and bf16, with
    # k_mmq's rows a warp (KAPITSA_MMQ_R) 1 and 2 side by side
    echo "$gpu" | tee "$OUT/gpu.txt"
    make -j16 build/kapitsa build/test_unit > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
    (build/kapitsa synth --preset qwen3-8b --layers 12 --out /dev/shm/q8 > /dev/null &&
        build/kapitsa quantize /dev/shm/q8 /dev/shm/q8-q4km.gguf --recipe Q4_K_M > /dev/null) &
    for t in test_cuda_matmul_q test_cuda_moe test_cuda_matmul test_cuda_tree_invariance; do
        timeout 120 build/test_unit $t 2>&1 | grep -v "^ok"
    done | tee "$OUT/unit.txt"
    KAPITSA_MMQ_R=1 timeout 120 build/test_unit test_cuda_matmul_q 2>&1 | grep -v "^ok" | tee -a "$OUT/unit.txt"
    for t in test_gguf_model_device test_fp8_device; do
        KAPITSA_TEST_DEVICE=cuda timeout 120 build/test_unit $t 2>&1
    done | tee -a "$OUT/unit.txt"
    wait
    {
        build/kapitsa doctor | grep "^gpu"
        for r in 1 2; do
            echo "== Q4_K_M, KAPITSA_MMQ_R=$r"
            KAPITSA_MMQ_R=$r bench --model /dev/shm/q8-q4km.gguf --prompt 512 --gen 128 | grep -E "decode|roofline"
            for s in 4 16 64; do KAPITSA_MMQ_R=$r bench --model /dev/shm/q8-q4km.gguf --prompt 128 --gen 32 --seqs $s | grep decode; done
        done
        echo "== Q4_K_M prefill"
        bench --model /dev/shm/q8-q4km.gguf --prompt 4096 --batch 4096 --gen 8 | grep prefill
        echo "== bf16"
        bench --model /dev/shm/q8 --prompt 512 --gen 128 | grep -E "decode|roofline"
        bench --model /dev/shm/q8 --prompt 4096 --batch 4096 --gen 8 | grep prefill
        for s in 4 16 64; do bench --model /dev/shm/q8 --prompt 128 --gen 32 --seqs $s | grep decode; done
    } 2>&1 | tee "$OUT/bench.txt"
    ;;
*) echo "cuda_quant.sh: test, bench or all" >&2; exit 2 ;;
esac
