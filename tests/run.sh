#!/usr/bin/env bash
# make test: every suite, the release build, the ASan+UBSan build, and the unit
# tests and the server under TSan; prints one total line "N passed, N failed"
# and fails if anything failed.
set -u
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=exitcode=99:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
run() {
    echo "== $*"
    TMPDIR=$(mktemp -d) "$@" 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
}
run build/test_unit
# with a GPU: the model, scheduler and KFlash tests again on the cuda backend
if build/kapitsa run --device cuda --max-tokens 1 x >/dev/null 2>&1; then
    for t in test_model test_sched test_spec test_gguf_model_device; do KAPITSA_TEST_DEVICE=cuda run build/test_unit $t; done
fi
run build/asan/test_unit
# the same suite under ThreadSanitizer: the pool's handshake, the engine thread and its callers
TSAN_OPTIONS=halt_on_error=1:exitcode=97 run build/tsan/test_unit
run bash tests/cli.sh build/kapitsa
run bash tests/cli.sh build/asan/kapitsa --quick
run bash tests/pull.sh build/kapitsa
run bash tests/pull.sh build/asan/kapitsa
run bash tests/compare.sh build/kapitsa
run bash tests/fuzz.sh 10
run bash tests/server.sh "$PWD/build/kapitsa"
run bash tests/server.sh "$PWD/build/kapitsa" "--draft $PWD/models/kapitsa-tiny-draft"
# (with a GPU's chunking: a prompt's chunk as large as the batch, the decoding requests' tokens beside it)
run bash tests/server.sh "$PWD/build/asan/kapitsa" "--prefill-chunk 512"
# the server under ThreadSanitizer (HTTP threads beside the engine thread, disconnects,
# SIGTERM): any report fails the run
tsan_dir=$(mktemp -d)
TSAN_OPTIONS="log_path=$tsan_dir/race" run bash tests/server.sh "$PWD/build/tsan/kapitsa"
if ls "$tsan_dir"/race.* >/dev/null 2>&1; then
    head -80 "$tsan_dir"/race.* | tee -a "$log"
    echo "tsan: 0 passed, 1 failed" | tee -a "$log"
    status=1
fi
rm -rf "$tsan_dir"
passed=$(grep -E '^[a-z]+: [0-9]+ passed, [0-9]+ failed$' "$log" | awk '{s += $2} END {print s + 0}')
failed=$(grep -E '^[a-z]+: [0-9]+ passed, [0-9]+ failed$' "$log" | awk '{s += $4} END {print s + 0}')
[ "$status" = 0 ] || [ "$failed" != 0 ] || failed=1 # a suite that crashed before its summary
echo "$passed passed, $failed failed"
exit $status
