#!/usr/bin/env bash
# bench_prefill.sh - prompts read each needed expert once per chunk: time to
# first token and expert bytes read by deltafin at `--batch 32` (the old
# default) against `--batch auto` (the planner's chunk), for prompts of 128,
# 512 and 2,048 tokens, side by side in one run (the rows of one length run
# back to back, page cache dropped before each when root), with the reads /
# needed ratio the engine counts; then, when llama.cpp is installed
# (`npm ci --prefix tests/llama`), `deltafin bench --vs-llama` on the same
# model as a GGUF with the longest prompt.
#
# The model is K3-shaped (k3gen, MXFP4 experts hold most of the bytes) and
# --mem keeps deltafin's expert cache far below the experts it needs, as on
# a machine where the model is several times the memory.  Env: BENCH_PRESET
# (default bench1g, ~1.2 GB), BENCH_SET (k3gen --set assignments, space
# separated, e.g. "num_experts=576" for a ~2.9 GB model), BENCH_MEM (default
# 600M), BENCH_LENS (default "128 512 2048"), BENCH_BATCHES (default "32
# auto"), BENCH_THREADS, BENCH_DIR / BENCH_KEEP (the scratch model: a temp
# dir under /var/tmp deleted afterwards unless BENCH_KEEP=1; a BENCH_DIR
# given is kept, and its model reused),
# BENCH_LLAMA=0 to skip llama.cpp, BENCH_SQUEEZE (default 1G: the memory left
# to llama.cpp and deltafin alike in the comparison, by `bench --squeeze-to`;
# 0 = no squeeze).
#
# BENCH_READ_BPS (e.g. 170M; root only): every run reads its drive through a
# cgroup limit of that many bytes per second (blkio.throttle, or io.max under
# cgroup v2), llama.cpp included.  Whether a prompt's time is its reads or
# its compute depends on the drive and the cores: at K3's size on a
# workstation, reads are most of it (86 % of a 512-token prompt's time to
# first token in users' measurements); on a small machine with a fast drive
# and a model of 1 GB, compute is.  The limit puts this machine back at that
# ratio, and the table says which drive speed it ran at.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/deltafin build/k3gen
# a BENCH_DIR given is kept (its model is reused by the next run); a
# directory made here is removed at exit unless BENCH_KEEP=1
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /var/tmp/deltafin-prefill.XXXXXX); made=1; fi
cleanup() { [ "$made" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
threads=${BENCH_THREADS:-$(nproc)}
mem=${BENCH_MEM:-600M}
lens=${BENCH_LENS:-"128 512 2048"}
preset=${BENCH_PRESET:-bench1g}
want_llama=${BENCH_LLAMA:-1}
[ -f tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.4.0.so ] || want_llama=0
batches=${BENCH_BATCHES:-"32 auto"}
sets=()
for a in ${BENCH_SET:-}; do sets+=(--set "$a"); done
if [ ! -f "$dir/m/config.json" ]; then
    if [ "$want_llama" = 1 ]; then build/k3gen --out "$dir/m" --preset "$preset" "${sets[@]}" --gguf "$dir/m.gguf" >/dev/null
    else build/k3gen --out "$dir/m" --preset "$preset" "${sets[@]}" >/dev/null; fi
fi
drop() { if [ "$(id -u)" = 0 ]; then sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; fi; }
# throttle BPS: this shell and its children read the model's drive at BPS bytes per second
cg=""
throttle() {
    local bps=$1 src disk mm
    [ "$(id -u)" = 0 ] || { echo "BENCH_READ_BPS needs root (a cgroup's read limit)" >&2; exit 2; }
    src=$(findmnt -no SOURCE -T "$dir" | head -1)
    disk=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
    [ -n "$disk" ] || disk=$(basename "$src")
    mm=$(lsblk -dno MAJ:MIN "/dev/$disk" | tr -d ' ')
    [ -n "$mm" ] || { echo "BENCH_READ_BPS: no block device under $dir ($src)" >&2; exit 2; }
    if [ -w /sys/fs/cgroup/blkio ]; then
        cg=/sys/fs/cgroup/blkio/deltafin-bench-$$
        mkdir -p "$cg"
        echo "$mm $bps" > "$cg/blkio.throttle.read_bps_device"
    elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw io /sys/fs/cgroup/cgroup.controllers; then
        echo +io > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
        cg=/sys/fs/cgroup/deltafin-bench-$$
        mkdir -p "$cg"
        echo "$mm rbps=$bps" > "$cg/io.max"
    else
        echo "BENCH_READ_BPS: no blkio or io cgroup controller here" >&2; exit 2
    fi
    echo $$ > "$cg/cgroup.procs"
    echo "reads limited to $bps B/s on /dev/$disk ($mm) by $cg"
}
unthrottle() {
    [ -n "$cg" ] || return 0
    local root; root=$(dirname "$cg")
    echo $$ > "$root/cgroup.procs" 2>/dev/null || true
    rmdir "$cg" 2>/dev/null || true
}
trap 'unthrottle; cleanup' EXIT
bps=${BENCH_READ_BPS:-}
if [ -n "$bps" ]; then
    bps=$(numfmt --from=iec "$bps")
    throttle "$bps"
fi
field() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p"; }
ids() { awk -v n="$1" 'BEGIN { s = 12345; for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648;
        printf "%s%d", (i ? "," : ""), 5 + s % 3000 } }'; }
echo "model: $dir/m ($(du -sh "$dir/m" | cut -f1)), --mem $mem, $threads threads, experts streamed (no prefetch)${bps:+, reads limited to $bps B/s}"
printf '%-7s %-7s %7s %10s %12s %14s %12s %12s\n' prompt batch chunk "TTFT s" "expert MiB" "needed pairs" "reads" "reads/need"
for n in $lens; do
    p=$(ids "$n")
    declare -A ttft=()
    for b in $batches; do
        drop
        out=$(build/deltafin run --model "$dir/m" --prompt-ids "$p" --max-new 1 --mem "$mem" --batch "$b" \
              --threads "$threads" --no-prefetch --bench-json 2>/dev/null | tail -1)
        t=$(echo "$out" | field prefill_s); by=$(echo "$out" | field prefill_expert_bytes)
        u=$(echo "$out" | field prefill_unique_experts); r=$(echo "$out" | field prefill_expert_reads)
        c=$(echo "$out" | field prefill_chunk)
        ttft[$b]=$t
        awk -v n="$n" -v b="$b" -v c="$c" -v t="$t" -v by="$by" -v u="$u" -v r="$r" 'BEGIN {
            printf "%-7s %-7s %7s %10.2f %12.1f %14d %12d %12.2f\n", n, b, c, t, by / 1048576, u, r, u ? r / u : 0 }'
    done
    [ -n "${ttft[32]:-}" ] && [ -n "${ttft[auto]:-}" ] &&
        awk -v a="${ttft[32]}" -v b="${ttft[auto]}" -v n="$n" 'BEGIN { printf "%-7s time to first token, batch 32 / auto: %.2fx\n", n, (b > 0 ? a / b : 0) }'
done
if [ "$want_llama" = 1 ]; then
    last=${lens##* }
    echo "== llama.cpp and deltafin (--batch auto) on the same GGUF, prompt $last, --mem $mem"
    squeeze=${BENCH_SQUEEZE:-1G}
    # squeezed, llama.cpp runs from its mapping alone: its repacked copies of
    # the weights would not fit (they got the squeeze helper killed)
    sq=(); [ "$squeeze" = 0 ] || sq=(--squeeze-to "$squeeze" --llama-no-repack)
    build/deltafin bench --vs-llama --model "$dir/m.gguf" --threads "$threads" --prompt-len "$last" --gen 2 --reps 1 \
        --mem "$mem" --drop-caches "${sq[@]}"
else
    echo "(llama.cpp not installed: npm ci --prefix tests/llama, or BENCH_LLAMA=0)"
fi
