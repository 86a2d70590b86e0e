#!/usr/bin/env bash
# ab: side-by-side builds of the working tree and of the same tree with
# patches reversed, benchmarked alternately in one run (the device machine's
# figures move between calls and machines: a comparison is only worth what
# one run measures). Run from the repository root; on the device machine
# with .debs carried (see cuda_bench.sh), elsewhere with the build's
# dependencies installed.
#
#   bash tools/device/ab.sh [options] [-- EXTRA BENCH ARGS]
#   -v NAME[=PATCH]   a variant, in order: the first is the tree as it is; each
#                     next one reverses its PATCH on top of the one before
#                     (a stack, newest change first). At least two.
#   -s PRESET:NAME[:LAYERS]  synthesise a checkpoint into $SHM/NAME with the
#                     first variant's binary (in the background, while it is tested)
#   -b 'LABEL|ARGS'   a bench row: `kapitsa bench --model $SHM/ARGS...`, i.e.
#                     ARGS starts with the model's NAME; run for every variant
#   -r ROUNDS         rounds of the rows (default 2), the variants alternating
#                     in each, their order reversed every other round
#   -t                test the first variant first: the cuda unit tests, every
#                     unit test on the device, `check` of every fixture there
#   -d DEVICE         cuda (default) or cpu
#   -j JOBS           make's jobs (default: the machine's cores)
# Output: $OUT/ab.txt (OUT defaults to /tmp/ab), one line a bench row and
# variant: "LABEL VARIANT" and bench's prefill and decode lines (or the rows
# of its table of prompt lengths; or its last line, an error). The tree is
# left as the last variant has it: run it in a copy (the device machine's is
# one).
#
# e.g. bash tools/device/ab.sh -v new -v main=scratch/x.patch -s qwen3-8b:q8 \
#        -b 'decode|q8 --prompt 512 --gen 128' -b 'prefill|q8 --prompt 4096 --batch 4096 --gen 2'
set -uo pipefail
OUT=${OUT:-/tmp/ab}
SHM=${SHM:-/dev/shm}
names=() patches=() synths=() rows=()
rounds=2 tests=0 device=cuda jobs=$(nproc)
while getopts "v:s:b:r:td:j:" o; do
    case $o in
    v) names+=("${OPTARG%%=*}"); [[ $OPTARG == *=* ]] && patches+=("${OPTARG#*=}") || patches+=("") ;;
    s) synths+=("$OPTARG") ;;
    b) rows+=("$OPTARG") ;;
    r) rounds=$OPTARG ;;
    t) tests=1 ;;
    d) device=$OPTARG ;;
    j) jobs=$OPTARG ;;
    *) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
extra=("$@")
((${#names[@]} >= 2)) || { echo "ab.sh: two variants at least (-v)" >&2; exit 2; }
[ -z "${patches[0]}" ] || { echo "ab.sh: the first variant is the tree as it is (no patch)" >&2; exit 2; }
for p in "${patches[@]:1}"; do
    [ -f "$p" ] || { echo "ab.sh: no patch file '$p'" >&2; exit 2; }
done
mkdir -p "$OUT" "$SHM"
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$OUT/ab.txt"; }
. tools/device/debs.sh
bin=$(mktemp -d)
for v in "${!names[@]}"; do
    if [ -n "${patches[$v]}" ]; then
        patch -R -p1 -s < "${patches[$v]}" || { say "patch ${patches[$v]} does not reverse"; exit 1; }
    fi
    targets=(build/kapitsa)
    ((v == 0 && tests)) && targets+=(build/test_unit)
    make -j"$jobs" "${targets[@]}" > "$OUT/build_${names[$v]}.txt" 2>&1 ||
        { tail -30 "$OUT/build_${names[$v]}.txt"; say "variant ${names[$v]} does not build"; exit 1; }
    cp build/kapitsa "$bin/${names[$v]}"
    say "built ${names[$v]}"
    ((v == 0)) || continue
    (for s in "${synths[@]}"; do
        IFS=: read -r preset name layers <<< "$s"
        "$bin/${names[0]}" synth --preset "$preset" ${layers:+--layers "$layers"} --out "$SHM/$name" > /dev/null ||
            echo "synth $s failed"
    done) > "$OUT/synth.txt" 2>&1 &
    synth_pid=$!
    if ((tests)); then
        [ "$device" = cuda ] && build/test_unit cuda 2>&1 | grep -v "^ok" | tee -a "$OUT/ab.txt"
        KAPITSA_TEST_DEVICE=$device timeout 300 build/test_unit 2>&1 | grep -E "not ok|check failed|unit:" |
            tee -a "$OUT/ab.txt"
        for f in tests/fixtures/*/; do
            [ -f "$f/config.json" ] || continue
            echo "$f $(build/kapitsa check "$f" --device "$device" --tol 1e-3 2>&1 | tail -1)"
        done | tee -a "$OUT/ab.txt"
        say "tested ${names[0]}"
    fi
done
wait "$synth_pid"
tee -a "$OUT/ab.txt" < "$OUT/synth.txt"
say "synthesised"
for ((r = 1; r <= rounds; r++)); do
    order=("${!names[@]}")
    ((r % 2 == 0)) && mapfile -t order < <(printf "%s\n" "${order[@]}" | tac)
    for row in "${rows[@]}"; do
        label=${row%%|*}
        read -r -a args <<< "${row#*|}"
        for v in "${order[@]}"; do
            log=$("$bin/${names[$v]}" bench --model "$SHM/${args[0]}" --device "$device" "${args[@]:1}" "${extra[@]}" 2>&1)
            res=$(grep -E "^(prefill|decode) |^ +[0-9]+ +[0-9.]+ " <<< "$log" | tr -s ' \n' ' ')
            echo "$label ${names[$v]} ${res:-$(tail -1 <<< "$log")}" | tee -a "$OUT/ab.txt"
        done
    done
done
say "done"
rm -rf "$bin"
