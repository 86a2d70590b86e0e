# On the GPU machine: build, the cuda op tests, doctor, and qwen3-8b prefill /
# time to first token / decode at several prompt lengths.
. tools/device/debs.sh
ldconfig -p | grep -E 'libcurl.so.4|libcrypto.so.3' | head -3
make -j16 build/kapitsa build/test_unit > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
build/test_unit cuda 2>&1 | tail -1
KAPITSA_TEST_DEVICE=cuda timeout 100 build/test_unit test_spec 2>&1 | tail -1
build/kapitsa doctor 2>&1 | tee $OUT/doctor.txt
build/kapitsa synth --preset qwen3-8b --out /tmp/q8 > /dev/null
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512,2048,4096 --batch 4096 --gen 32 2>&1 | tee $OUT/bench_lens.txt
