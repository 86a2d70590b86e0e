#!/usr/bin/env bash
# make test: every suite, the release build, the ASan+UBSan build, and the unit
# tests and the server under TSan; prints one total line "N passed, N failed, N skipped"
# and fails if anything failed.
#
# The suites run in groups, several groups at once (KAPITSA_TEST_JOBS, default
# the number of cores, at least 2; 1 runs them one after another). A group's
# suites run in turn: those that pick TCP ports with free_port (tests/lib/lib.sh:
# cli, compare) share one group, so that no two pick at once; the server suites
# take their ports from the kernel (--port 0), but share one group for their
# npm install on first use. Each suite's output is printed whole when it ends.
set -u
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=exitcode=99:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs=${KAPITSA_TEST_JOBS:-$(nproc)}
[ -n "${KAPITSA_TEST_JOBS:-}" ] || [ "$jobs" -ge 2 ] || jobs=2

# run CMD...: one suite, in a fresh TMPDIR (removed at the end); its output goes to
# the shared log and the terminal under a lock once it ends, a failure to $work/failed
n=0
run() {
    n=$((n + 1))
    local out="$work/$BASHPID.$n.out"
    echo "== $*" >"$out"
    TMPDIR=$(mktemp -d -p "$work") "$@" >>"$out" 2>&1 || echo "$*" >>"$work/failed"
    flock "$work/lock" sh -c 'cat "$1" | tee -a "$2/log"' sh "$out" "$work"
}

group_unit() {
    run build/test_unit
    # with a GPU: the model, scheduler and KFlash tests again on the cuda backend
    if build/kapitsa run --device cuda --max-tokens 1 x >/dev/null 2>&1; then
        for t in test_model test_sched test_spec test_gguf_model_device test_fp8_device; do KAPITSA_TEST_DEVICE=cuda run build/test_unit $t; done
    fi
    run build/asan/test_unit
}
# the same suite under ThreadSanitizer: the pool's handshake, the engine thread and its callers
group_tsan_unit() {
    TSAN_OPTIONS=halt_on_error=1:exitcode=97 run build/tsan/test_unit
}
group_ports() {
    run bash tests/cli.sh build/kapitsa
    run bash tests/cli.sh build/asan/kapitsa --quick
    run bash tests/compare.sh build/kapitsa
}
group_pull() {
    run bash tests/pull.sh build/kapitsa
    run bash tests/pull.sh build/asan/kapitsa
    run bash tests/fuzz.sh 10
    # serve's web page in headless chromium (skipped without it)
    run bash tests/web.sh "$PWD/build/kapitsa"
}
group_server() {
    run bash tests/server.sh "$PWD/build/kapitsa"
    run bash tests/server.sh "$PWD/build/kapitsa" "--draft $PWD/models/kapitsa-tiny-draft"
    # (with a GPU's chunking: a prompt's chunk as large as the batch, the decoding requests' tokens beside it)
    run bash tests/server.sh "$PWD/build/asan/kapitsa" "--prefill-chunk 512"
    # the server under ThreadSanitizer (HTTP threads beside the engine thread, disconnects,
    # SIGTERM): any report fails the run
    local tsan_dir
    tsan_dir=$(mktemp -d)
    TSAN_OPTIONS="log_path=$tsan_dir/race" run bash tests/server.sh "$PWD/build/tsan/kapitsa"
    if ls "$tsan_dir"/race.* >/dev/null 2>&1; then
        flock "$work/lock" sh -c 'head -80 "$1"/race.* | tee -a "$2/log"; echo "tsan: 0 passed, 1 failed" | tee -a "$2/log"' \
            sh "$tsan_dir" "$work"
        echo "tsan" >>"$work/failed"
    fi
    rm -rf "$tsan_dir"
}

# the longest groups first, so that the last to end starts early
running=0
for g in group_server group_tsan_unit group_unit group_ports group_pull; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    "$g" &
    running=$((running + 1))
done
wait
touch "$work/log"
# a suite's summary: "name: N passed, N failed", the unit runner's and tests/web.sh's with ", N skipped"
summary='^[a-z]+: [0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$'
passed=$(grep -E "$summary" "$work/log" | awk '{s += $2} END {print s + 0}')
failed=$(grep -E "$summary" "$work/log" | awk '{s += $4} END {print s + 0}')
skipped=$(grep -E "$summary" "$work/log" | awk '{s += $6} END {print s + 0}')
status=0
[ -s "$work/failed" ] && status=1
[ "$status" = 0 ] || [ "$failed" != 0 ] || failed=1 # a suite that crashed before its summary
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
