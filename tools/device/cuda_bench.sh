#!/usr/bin/env bash
# The H200 figures of BENCHMARKS.md, in one run on the device machine (the
# repository root as working directory, the .debs folder carried, $OUT set).
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
mkdir -p /tmp/jx && tar xJf .debs/extra.txz -C /tmp/jx
export C_INCLUDE_PATH=/tmp/jx/usr/include:/tmp/jx/usr/include/x86_64-linux-gnu LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu:/tmp/jx/lib/x86_64-linux-gnu
make -j16 build/kapitsa build/test_unit build/bench_gemv > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# the read ceiling, and the decode products alone at a decode step's, a KFlash tree's and 64 tokens
nvcc -O3 -arch=sm_90 tools/device/read_bw.cu -o /tmp/read_bw && /tmp/read_bw | tee $OUT/read_bw.txt
for n in 1 24 64; do build/bench_gemv $n 10; done | tee $OUT/gemv.txt
(build/kapitsa synth --preset qwen3-8b --out /tmp/q8 > /dev/null) &
build/test_unit cuda 2>&1 | grep -v "^ok"
KAPITSA_TEST_DEVICE=cuda timeout 200 build/test_unit model 2>&1 | grep -E "check failed|unit:"
KAPITSA_TEST_DEVICE=cuda timeout 200 build/test_unit s 2>&1 | grep -E "check failed|verify passes|unit:"
bash tests/cli.sh build/kapitsa --quick > $OUT/cli.txt 2>&1; grep -E "not ok|passed" $OUT/cli.txt | tail -5
wait
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512 --gen 128 2>&1 | tee $OUT/bench_q8.txt
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 4096 --batch 4096 --gen 8 2>&1 | tee -a $OUT/bench_q8.txt | head -2
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512 --gen 64 --seqs 4 2>&1 | tee -a $OUT/bench_q8.txt
for a in "--sample 0.6,20" "--sample 0.6,0"; do build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512 --gen 128 $a 2>&1 | grep decode; done | tee -a $OUT/bench_q8.txt
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512,2048,4096 --batch 4096 --gen 32 2>&1 | tee $OUT/ttft.txt
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 25000 --batch 4096 --gen 8 2>&1 | tee -a $OUT/ttft.txt
for n in 1 2 4 8 16 32 64; do echo "T($n) $(build/kapitsa bench --model /tmp/q8 --device cuda --prompt $((n*32)) --batch $n --gen 1 2>&1 | grep prefill)"; done | tee $OUT/tn.txt
build/kapitsa bench --model models/kapitsa-tiny --draft models/kapitsa-tiny-draft --prompt-file tools/bench_tasks/edit.txt --gen 200 --device cuda 2>&1 | tail -8 | tee $OUT/spec_b.txt
build/kapitsa bench --model models/kapitsa-tiny --draft models/kapitsa-tiny-draft --prompt-file tools/bench_tasks/complete.txt --gen 200 --device cuda 2>&1 | tail -8 | tee $OUT/spec_a.txt
rm -rf /tmp/q8; for p in qwen3.5-0.8b qwen3.5-9b nemotron-nano-9b-v2; do timeout 150 build/kapitsa synth --preset $p --out /tmp/$p > /dev/null && build/kapitsa bench --model /tmp/$p --device cuda --prompt 512 --gen 64 2>&1 | tee -a $OUT/bench_hy.txt && build/kapitsa bench --model /tmp/$p --device cuda --prompt 4096 --batch 4096 --gen 8 2>&1 | tee -a $OUT/bench_hy.txt; rm -rf /tmp/$p; done
# qwen3-30b-a3b: 61 GB of weights, more than the disk holds beside the rest: in memory (/dev/shm)
timeout 300 build/kapitsa synth --preset qwen3-30b-a3b --out /dev/shm/q30 > /dev/null
build/kapitsa bench --model /dev/shm/q30 --device cuda --prompt 512 --gen 128 2>&1 | tee $OUT/bench_moe.txt
build/kapitsa bench --model /dev/shm/q30 --device cuda --prompt 512 --gen 64 --seqs 4 2>&1 | tee -a $OUT/bench_moe.txt
build/kapitsa bench --model /dev/shm/q30 --device cuda --prompt 4096 --batch 4096 --gen 8 2>&1 | tee -a $OUT/bench_moe.txt
build/kapitsa bench --model /dev/shm/q30 --device cuda --prompt 512,2048 --batch 4096 --gen 32 2>&1 | tee -a $OUT/bench_moe.txt
for n in 1 4 16 64; do echo "T($n) $(build/kapitsa bench --model /dev/shm/q30 --device cuda --prompt $((n*32)) --batch $n --gen 1 2>&1 | grep prefill)"; done | tee -a $OUT/bench_moe.txt
rm -rf /dev/shm/q30
