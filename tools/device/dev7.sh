mkdir -p /tmp/jx && for f in .debs/*.deb; do dpkg -x $f /tmp/jx; done; rm -f /tmp/jx/usr/lib/x86_64-linux-gnu/libgnutls*
export C_INCLUDE_PATH=/tmp/jx/usr/include LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu
make -j16 build/kapitsa build/test_unit > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
build/test_unit cuda 2>&1 | grep -v "^ok"
KAPITSA_TEST_DEVICE=cuda timeout 100 build/test_unit sched_spec 2>&1 | grep -E "check failed|unit:"
KAPITSA_CUDA_GRAPHS=0 KAPITSA_TEST_DEVICE=cuda timeout 100 build/test_unit sched_spec 2>&1 | grep -E "check failed|unit:"
build/kapitsa synth --preset qwen3-8b --out /tmp/q8 > /dev/null
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512 --gen 128 2>&1
KAPITSA_CUDA_GRAPHS=0 build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512 --gen 64 2>&1 | grep decode
for n in 1 2 4 8 16 32 64; do echo "T($n)"; build/kapitsa bench --model /tmp/q8 --device cuda --prompt $((n*32)) --batch $n --gen 1 2>&1 | grep prefill; done
timeout 60 ncu --kernel-name regex:k_mmv --launch-skip 300 --launch-count 3 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size build/kapitsa bench --model /tmp/q8 --device cuda --prompt 8 --gen 4 2>&1 | grep -E "duration|bytes_read|grid_size" | head -12
