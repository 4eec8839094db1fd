#!/usr/bin/env bash
# The aarch64 build under qemu-aarch64 (user mode: the aarch64 binaries run
# on this x86-64 machine, slowly and exactly), with Debian's arm64 libraries.
#
#   tests/qemu/run_qemu_tests.sh XBUILD HOSTBUILD TEST...  # make check (qemu-check):
#       the kernel, parser and tokenizer tests, then the fixture forward pass
#   tests/qemu/run_qemu_tests.sh XBUILD HOSTBUILD          # make check-slow
#       (qemu-check-all): every test program in XBUILD/tests, then the same
#
# The fixture forward pass: k3-tiny-a's greedy ids and every logit of the
# aarch64 build (NEON, scalar, the reference backend, one and two threads,
# a one-slot expert cache, a batched prefill) equal to the x86-64 build's
# bit for bit.  Test programs that start deltafin or k3gen find them through
# $BUILD, which points at wrappers that run the aarch64 binaries under qemu.
set -euo pipefail
cd "$(dirname "$0")/../.."
XB=${1:?aarch64 build dir}; HB=${2:?host build dir}; shift 2
QEMU=${QEMU:-qemu-aarch64}
# The loader and libc must come from one glibc build: Debian's libc6:arm64
# (multiarch, pulled in by the :arm64 -dev packages) when it is installed,
# else the cross toolchain's copy.  Mixing the two (the cross ld.so with the
# multiarch libc.so.6) hangs in pthread_create.
if [ -z "${QEMU_LD_PREFIX:-}" ]; then
    if [ -e /lib/ld-linux-aarch64.so.1 ]; then QEMU_LD_PREFIX=/; else QEMU_LD_PREFIX=/usr/aarch64-linux-gnu; fi
fi
export QEMU_LD_PREFIX
if ! command -v "$QEMU" >/dev/null; then
    echo "qemu-check: $QEMU not found (apt-get install qemu-user); the aarch64 build was NOT tested" >&2
    exit 1
fi
[ -d "$QEMU_LD_PREFIX" ] || { echo "qemu-check: $QEMU_LD_PREFIX missing (apt-get install libc6-dev-arm64-cross)" >&2; exit 1; }

# wrappers: $BUILD/deltafin and $BUILD/k3gen for the test programs
W="$XB/qemu-bin"
mkdir -p "$W"
for b in deltafin k3gen; do
    printf '#!/bin/sh\nexec %s %s "$@"\n' "$QEMU" "$(realpath "$XB/$b")" > "$W/$b"
    chmod +x "$W/$b"
done

fail=0
echo "== qemu: $("$QEMU" --version | head -1)"

# 1. unit tests
skip=""
if [ $# = 0 ]; then
    tests=$(ls "$XB"/tests/test_* | grep -v '\.[od]$')
    # what would take hours under qemu, each named with its native time and why
    skip=$(grep -v '^#' tests/qemu/skip.list | awk 'NF >= 2 {printf "%s%s:%s", n++ ? "," : "", $1, $2}')
    echo "== every test program; $(grep -vc '^#' tests/qemu/skip.list) subtests listed in tests/qemu/skip.list are skipped"
else
    tests=""
    for t in "$@"; do tests="$tests $XB/tests/$t"; done
fi
BUILD="$W" TEST_RUNNER="$QEMU" DF_UNDER_QEMU=1 DF_TEST_SKIP="$skip" tests/run_tests.sh $tests || fail=1

# 2. the fixture forward pass, aarch64 against x86-64, bit for bit: k3-tiny-a
# (BF16 trunk, MXFP4 experts from safetensors) and k3-quant (a GGUF with a
# Q8_0/F16 trunk and Q4_K experts: the block-format kernels end to end)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompt="The capital of France is"
run_one() { # name runner binary model extra-args...
    local name=$1 runner=$2 bin=$3 model=$4; shift 4
    $runner "$bin" run --model "$model" --prompt "$prompt" --max-new 12 --print-ids \
        --dump-logits "$tmp/$name.logits" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" || {
        echo "  FAIL $name: deltafin exited $? ($(tail -2 "$tmp/$name.err" | tr '\n' ' '))"; fail=1; return; }
}
n_ok=0; n_all=0
for model in testdata/k3-tiny-a/checkpoint testdata/k3-quant/model.gguf; do
    m=$(basename "$(dirname "$model")")
    run_one "$m-host" "" "$HB/deltafin" "$model" --threads 1
    for cfg in "neon-1t:--backend cpu:neon --threads 1" "neon-2t:--backend cpu:neon --threads 2" \
               "scalar:--backend cpu:scalar --threads 2" "ref:--backend ref" \
               "onecache:--backend cpu:neon --threads 2 --expert-cache 1" \
               "batch1:--backend cpu:neon --threads 2 --batch 1" \
               "auto:--threads 2"; do
        name=$m-${cfg%%:*}; args=${cfg#*:}
        n_all=$((n_all + 1))
        # shellcheck disable=SC2086
        run_one "$name" "$QEMU" "$XB/deltafin" "$model" $args
        [ -f "$tmp/$name.logits" ] || continue
        if cmp -s "$tmp/$m-host.logits" "$tmp/$name.logits" && cmp -s "$tmp/$m-host.out" "$tmp/$name.out"; then
            n_ok=$((n_ok + 1))
        else
            echo "  FAIL aarch64 $name: logits or ids differ from x86-64's"; fail=1
        fi
    done
    echo "  $m: $(( $(stat -c %s "$tmp/$m-host.logits") / 4 )) logits and ids $(tail -1 "$tmp/$m-host.out")"
done
echo "  fixture forward pass: $n_ok of $n_all aarch64 runs equal the x86-64 build's logits and ids bit for bit"
[ $fail = 0 ] && echo "qemu-check: passed" || echo "qemu-check: FAILED"
exit $fail
