#!/usr/bin/env bash
# Runs each test binary given, sums their "unit:" lines and prints the total
# as the last line.  Exit status is nonzero if any binary failed.
# $TEST_RUNNER, when set, runs each one (qemu-aarch64 for a cross build).
# $TEST_JOBS (default 1) binaries run at once; each one's output is printed
# whole, in the order given, with its wall time, once it has finished (every
# test keeps its files in its own scratch folder, test_scratch()).
set -u
jobs=${TEST_JOBS:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tp=0; tf=0; ts=0; bad=0
n=$#
run_one() { # INDEX BINARY
    local t0 t1
    t0=$(date +%s%N)
    ${TEST_RUNNER:+$TEST_RUNNER} "$2" >"$tmp/$1.out" 2>&1
    echo $? >"$tmp/$1.rc"
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000000 )) >"$tmp/$1.ms"
}
report() { # INDEX BINARY
    local t=$2 rc line p f s
    echo "== $(basename "$t")"
    rc=$(cat "$tmp/$1.rc")
    grep -v '^unit:' "$tmp/$1.out"
    line=$(grep '^unit:' "$tmp/$1.out" | tail -1)
    if [ -z "$line" ]; then
        echo "  $(basename "$t"): no unit line (crashed, rc=$rc)"; tf=$((tf + 1)); bad=1; return
    fi
    echo "  $line ($(awk -v m="$(cat "$tmp/$1.ms")" 'BEGIN { printf "%.1f", m / 1000 }') s)"
    read -r p f s < <(printf '%s\n' "$line" | sed -E 's/unit: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/')
    tp=$((tp + p)); tf=$((tf + f)); ts=$((ts + s))
    [ "$rc" -ne 0 ] && bad=1
}
i=0; next=0
for t in "$@"; do
    i=$((i + 1))
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$i" "$t" &
    # print every finished binary in order, as soon as those before it are done
    while [ "$next" -lt "$i" ] && [ -f "$tmp/$((next + 1)).ms" ]; do
        next=$((next + 1)); report "$next" "${!next}"
    done
done
wait
while [ "$next" -lt "$n" ]; do
    next=$((next + 1)); report "$next" "${!next}"
done
echo "unit: $tp passed, $tf failed, $ts skipped"
exit $bad
