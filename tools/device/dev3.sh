mkdir -p /tmp/jx && for f in .debs/*.deb; do dpkg -x $f /tmp/jx; done; rm -f /tmp/jx/usr/lib/x86_64-linux-gnu/libgnutls*
export C_INCLUDE_PATH=/tmp/jx/usr/include LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu
make -j16 build/kapitsa build/test_unit > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
which nsys ncu; ls /usr/local/cuda/ | head -30
build/kapitsa synth --preset qwen3-8b --out /tmp/q8 > /dev/null
KAPITSA_PROFILE=1 build/kapitsa bench --model /tmp/q8 --device cuda --prompt 64 --gen 32 2>&1
KAPITSA_PROFILE=1 build/kapitsa bench --model /tmp/q8 --device cuda --prompt 2048 --batch 2048 --gen 2 2>&1
