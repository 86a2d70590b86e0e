#!/usr/bin/env bash
# A short run of each libFuzzer target on its committed seeds (tests/fuzz/corpus.tar.xz,
# unpacked by make into build/fuzz/seed; to add one: unpack it, add the file under
# corpus/TARGET, and pack it again with tar cJf),
# new inputs kept in a scratch folder; any crash, leak, timeout or hang fails.
# usage: tests/fuzz.sh SECONDS_PER_TARGET
set -u
secs=${1:-10}
pass=0
fail=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in tokenizer jinja parser json_guard tool_grammar json_schema request checkpoint tokenizer_load gguf; do
    mkdir -p "$work/$f"
    dict=()
    [ -f "tests/fuzz/$f.dict" ] && dict=(-dict="tests/fuzz/$f.dict")
    if build/fuzz/fuzz_$f "${dict[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
        "$work/$f" "build/fuzz/seed/$f" >"$work/$f.log" 2>&1; then
        echo "ok - fuzz_$f $(grep -o 'Done [0-9]* runs' "$work/$f.log")"
        pass=$((pass + 1))
    else
        echo "not ok - fuzz_$f"
        tail -30 "$work/$f.log"
        fail=$((fail + 1))
    fi
done
echo "fuzz: $pass passed, $fail failed"
[ "$fail" = 0 ]
