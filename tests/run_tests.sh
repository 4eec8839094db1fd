#!/usr/bin/env bash
# Runs each test binary given, sums their "unit:" lines and prints the total
# as the last line.  Exit status is nonzero if any binary failed.
# $TEST_RUNNER, when set, runs each one (qemu-aarch64 for a cross build).
set -u
tp=0; tf=0; ts=0; bad=0
for t in "$@"; do
    echo "== $(basename "$t")"
    out=$(${TEST_RUNNER:+$TEST_RUNNER} "$t" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -v '^unit:'
    line=$(printf '%s\n' "$out" | grep '^unit:' | tail -1)
    if [ -z "$line" ]; then
        echo "  $(basename "$t"): no unit line (crashed, rc=$rc)"; tf=$((tf + 1)); bad=1; continue
    fi
    echo "  $line"
    read -r p f s < <(printf '%s\n' "$line" | sed -E 's/unit: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/')
    tp=$((tp + p)); tf=$((tf + f)); ts=$((ts + s))
    [ "$rc" -ne 0 ] && bad=1
done
echo "unit: $tp passed, $tf failed, $ts skipped"
exit $bad
