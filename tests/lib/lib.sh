# Shared by the shell test suites (sourced): pass/fail counters and `expect`.
# The sourcing script sets $tmp (a scratch folder) first.
pass=0
fail=0

# free_port: a TCP port on 127.0.0.1 that nothing listens on now, below
# Linux's ephemeral range (32768 up), where outgoing connections take theirs
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 12000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
}

ok() { echo "ok - $1"; pass=$((pass + 1)); }
bad() { echo "not ok - $1"; fail=$((fail + 1)); }

# expect NAME STATUS SUBSTRING... -- COMMAND...: the command exits with STATUS
# and its output (stdout and stderr) contains every SUBSTRING
expect() {
    local name=$1 want=$2
    shift 2
    local subs=()
    while [ "$1" != "--" ]; do subs+=("$1"); shift; done
    shift
    "$@" >"$tmp/out" 2>&1
    local got=$?
    if [ "$got" != "$want" ]; then
        bad "$name (exit $got, wanted $want)"; sed 's/^/    /' "$tmp/out" | head -20; return
    fi
    for s in "${subs[@]}"; do
        if ! grep -qF -- "$s" "$tmp/out"; then
            bad "$name (output lacks '$s')"; sed 's/^/    /' "$tmp/out" | head -20; return
        fi
    done
    ok "$name"
}
