mkdir -p /tmp/jx && for f in .debs/*.deb; do dpkg -x $f /tmp/jx; done; rm -f /tmp/jx/usr/lib/x86_64-linux-gnu/libgnutls*
export C_INCLUDE_PATH=/tmp/jx/usr/include LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu
make -j16 build/kapitsa build/test_unit > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
build/test_unit cuda 2>&1 | grep -v "^ok"
KAPITSA_TEST_DEVICE=cuda timeout 200 build/test_unit spec 2>&1 | grep -v "^ok"
bash tests/cli.sh build/kapitsa --quick > $OUT/cli.txt 2>&1; grep -E "not ok|passed" $OUT/cli.txt | tail -5
build/kapitsa synth --preset qwen3-8b --out /tmp/q8 > /dev/null
KAPITSA_PROFILE=1 build/kapitsa bench --model /tmp/q8 --device cuda --prompt 64 --gen 32 2>&1 | head -8
build/kapitsa bench --model /tmp/q8 --device cuda --prompt 512 --gen 64 2>&1
KAPITSA_PROFILE=1 build/kapitsa bench --model /tmp/q8 --device cuda --prompt 2048 --batch 2048 --gen 2 2>&1 | head -4
timeout 120 ncu --kernel-name regex:k_mmv --launch-skip 300 --launch-count 5 --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size build/kapitsa bench --model /tmp/q8 --device cuda --prompt 8 --gen 4 2>&1 | grep -E "duration|bytes_read|grid_size" | head -40
