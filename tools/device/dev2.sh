mkdir -p /tmp/jx && for f in .debs/*.deb; do dpkg -x $f /tmp/jx; done; rm -f /tmp/jx/usr/lib/x86_64-linux-gnu/libgnutls*
export C_INCLUDE_PATH=/tmp/jx/usr/include LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu
make -j16 build/kapitsa build/test_unit > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
build/test_unit cuda 2>&1 | tail -12
KAPITSA_TEST_DEVICE=cuda timeout 200 build/test_unit hybrid_state 2>&1 | tail -3
bash tests/cli.sh build/kapitsa --quick > $OUT/cli.txt 2>&1; grep -E "cuda|device|passed" $OUT/cli.txt | tail -32
for a in qwen3 qwen3_5_wrapper nemotron_h_groups qwen3_next_mixed; do build/kapitsa check tests/fixtures/$a --device cuda 2>&1 | grep -E "logits|prefill"; build/kapitsa check tests/fixtures/$a --device cuda --fast 2>&1 | grep -E "logits|prefill|greedy"; done
build/kapitsa synth --preset qwen3-8b --out /tmp/q8 > /dev/null && ls -la /tmp/q8 | head -3
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512 --gen 64 2>&1
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 4096 --batch 4096 --gen 16 2>&1
nvidia-smi --query-gpu=clocks.max.memory,clocks.max.sm,memory.total --format=csv
