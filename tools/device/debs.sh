# Sourced by the device scripts, from the repository root: the headers and
# libraries the device image lacks, unpacked from .debs/extra.txz (carried;
# cuda_bench.sh's header says how it is made) into /tmp/jx, and the compiler's
# and loader's paths pointed at them. Without the archive (a machine with the
# build's dependencies installed) it does nothing.
if [ -f .debs/extra.txz ]; then
    mkdir -p /tmp/jx && tar xJf .debs/extra.txz -C /tmp/jx
    export C_INCLUDE_PATH=/tmp/jx/usr/include:/tmp/jx/usr/include/x86_64-linux-gnu
    export LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=/tmp/jx/usr/lib/x86_64-linux-gnu:/tmp/jx/lib/x86_64-linux-gnu
fi
