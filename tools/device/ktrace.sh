#!/usr/bin/env bash
# One bench run under tools/device/ktrace.c, summarised by ktrace_sum.py: where
# a forward's time goes on the GPU, kernel by kernel, gaps and overlaps
# included. Run from the repository root on the GPU machine, kapitsa built:
#   bash tools/device/ktrace.sh OUT.csv [ktrace_sum options --] bench arguments...
# e.g. bash tools/device/ktrace.sh /tmp/q8.csv --lines -- --model /dev/shm/q8 --device cuda --prompt 512 --gen 16
# The default window is the second-to-last forward (a decode step when --gen > 1).
# KTRACE_API=1 in the environment adds the host's CUDA API calls to the trace.
set -euo pipefail
out=$1
shift
sum=()
if [[ " $* " == *" -- "* ]]; then
    while [ "$1" != "--" ]; do
        sum+=("$1")
        shift
    done
    shift
fi
lib=$(find /usr/local/cuda/ -name 'libcupti.so' 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "ktrace.sh: no libcupti.so under /usr/local/cuda" >&2; exit 1; }
dir=$(dirname "$lib")
so=$(mktemp --suffix .so)
gcc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include tools/device/ktrace.c -o "$so" -L"$dir" -Wl,-rpath,"$dir" -lcupti
KTRACE_OUT=$out CUDA_INJECTION64_PATH=$so build/kapitsa bench "$@"
rm -f "$so"
[ -s "$out" ] || { echo "ktrace.sh: no trace written to $out (no CUDA device, or CUPTI refused)" >&2; exit 1; }
python3 tools/device/ktrace_sum.py "$out" "${sum[@]}"
