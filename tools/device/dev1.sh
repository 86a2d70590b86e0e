set -x
mkdir -p /tmp/jx && for f in .debs/*.deb; do dpkg -x $f /tmp/jx; done; rm -f /tmp/jx/usr/lib/x86_64-linux-gnu/libgnutls*
export C_INCLUDE_PATH=/tmp/jx/usr/include LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu
nvidia-smi -L; which nvcc; ls /usr/local/cuda/bin/nvcc
time make -j16 build/kapitsa build/test_unit > $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; exit 1; }
build/test_unit cuda 2>&1 | tee $OUT/unit_cuda.txt | tail -30
KAPITSA_TEST_DEVICE=cuda timeout 200 build/test_unit model 2>&1 | tail -15
KAPITSA_TEST_DEVICE=cuda timeout 200 build/test_unit spec 2>&1 | tail -8
for a in qwen3 qwen3_5 nemotron_h qwen3_moe qwen3_f16_linear; do build/kapitsa check tests/fixtures/$a --device cuda 2>&1 | tail -4; done
