#!/usr/bin/env bash
# The trunk when it does not fit, side by side in one run (this VM's disk
# drifts between 0.6 and 2 GB/s, so each pair runs back to back, twice,
# in alternating order, from a cold page cache):
#   1. a model whose trunk is about twice --mem: the whole trunk streamed
#      (--trunk-stream on) against partial residency (the planner keeps the
#      layers that pay and streams the rest): trunk and expert bytes read
#      per decoded token, tok/s, and the ratios;
#   2. the same model as a GGUF with a BF16 trunk and with a Q8_0 trunk
#      (k3gen --gguf-trunk q8_0, ggml's rounding) at a --mem the BF16 trunk
#      does not fit and the Q8_0 one does: tok/s and bytes per token.
# The model (K3-shaped bench1g with 16 experts a layer and an 8K vocabulary:
# ~0.35 GB, most of it trunk, no layer above 1/10 of it) is generated under BENCH_DIR (default a new /var/tmp dir) and
# deleted at the end unless BENCH_KEEP=1.  Needs root for drop_caches (it
# is skipped with a warning otherwise).  BENCH_TOKENS (default 16) decoded
# tokens per run, BENCH_THREADS (default 2).  Prompt chunks of 32 (--batch 32)
# in every plan and run, so the budgets compare decode alone.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/deltafin build/k3gen
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /var/tmp/deltafin-trunk.XXXXXX); made=1; fi
cleanup() { [ "$made" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
model="$dir/model"
gen="--preset bench1g --set num_experts=16 --set vocab_size=8192 --seed 5"
if [ ! -f "$model/model.safetensors.index.json" ]; then
    # shellcheck disable=SC2086
    build/k3gen --out "$model" $gen >/dev/null
    # shellcheck disable=SC2086
    build/k3gen --from "$model" $gen --gguf "$dir/bf16.gguf" >/dev/null
    # shellcheck disable=SC2086
    build/k3gen --from "$model" $gen --gguf "$dir/q8.gguf" --gguf-trunk q8_0 >/dev/null
fi
DF=build/deltafin
ntok=${BENCH_TOKENS:-16}
thr=${BENCH_THREADS:-2}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: not root)" >&2; }
gib() { awk -v b="$1" 'BEGIN { printf "%.3f", b / 1073741824 }'; }
# plan_json MODEL MEM [opts]: the plan's trunk_bytes, and a budget a fraction of it
plan_field() { "$DF" plan --model "$1" --mem "$2" --ctx 256 --batch 32 --json "${@:4}" | grep -o "\"$3\":[0-9]*" | head -1 | cut -d: -f2; }
# one run: "tok/s bytes/token trunk-mode"
one() {
    local m=$1 mem=$2; shift 2
    drop
    local j
    j=$("$DF" run --model "$m" --prompt-ids 1,2,3,4 --max-new "$ntok" --mem "$mem" --ctx 256 --batch 32 --threads "$thr" \
        --bench-json "$@" 2>/dev/null)
    /usr/bin/python3 -c '
import json, sys
j = json.loads(sys.argv[1])
n = max(j["decode_steps"], 1)
print("%.3f %.0f" % (j["decode_tps"], j["decode_read_bytes"] / n))' "$j"
}
trunk=$(plan_field "$model" 64G trunk_bytes)
mem=$((trunk / 2 / 1048576))M
echo "== partial residency: trunk $(gib "$trunk") GiB, --mem $mem ($ntok tokens, $thr threads, cold page cache each run)"
"$DF" plan --model "$model" --mem "$mem" --ctx 256 --batch 32 2>&1 | grep -E "trunk, |per decoded token" | sed 's/^/  /'
printf '  %-34s %9s %14s\n' "run" "tok/s" "MB read/token"
declare -A tps bytes
for round in 1 2; do
    order=("whole" "partial"); [ "$round" = 2 ] && order=("partial" "whole")
    for w in "${order[@]}"; do
        if [ "$w" = whole ]; then r=$(one "$model" "$mem" --trunk-stream on); else r=$(one "$model" "$mem"); fi
        read -r t b <<<"$r"
        tps[$w]="${tps[$w]:-} $t"; bytes[$w]="${bytes[$w]:-} $b"
        printf '  %-34s %9s %14.1f\n' "round $round, $w" "$t" "$(awk -v b="$b" 'BEGIN{print b/1e6}')"
    done
done
mean() { awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.4f", s / NF }' <<<"$1"; }
pt=$(mean "${tps[partial]}"); wt=$(mean "${tps[whole]}"); pb=$(mean "${bytes[partial]}"); wb=$(mean "${bytes[whole]}")
echo "  partial / whole-stream: tok/s x$(awk -v a="$pt" -v b="$wt" 'BEGIN{printf "%.2f", a/b}'), bytes read per token x$(awk -v a="$pb" -v b="$wb" 'BEGIN{printf "%.2f", a/b}')"

tb=$(plan_field "$dir/bf16.gguf" 64G trunk_bytes)
tq=$(plan_field "$dir/q8.gguf" 64G trunk_bytes)
rq=$(plan_field "$dir/q8.gguf" 64G resident_from)
mem2=$(((rq + 8388608) / 1048576))M
echo "== BF16 trunk against Q8_0 trunk (GGUF): trunk $(gib "$tb") vs $(gib "$tq") GiB, --mem $mem2 (the Q8_0 trunk fits, the BF16 one does not)"
for f in bf16 q8; do
    printf '  %-6s %s\n' "$f" "$("$DF" plan --model "$dir/$f.gguf" --mem "$mem2" --ctx 256 --batch 32 2>&1 | grep -E "trunk, " | sed 's/^ *//')"
done
printf '  %-34s %9s %14s\n' "run" "tok/s" "MB read/token"
declare -A t2
for round in 1 2; do
    order=(bf16 q8); [ "$round" = 2 ] && order=(q8 bf16)
    for f in "${order[@]}"; do
        r=$(one "$dir/$f.gguf" "$mem2")
        read -r t b <<<"$r"
        t2[$f]="${t2[$f]:-} $t"
        printf '  %-34s %9s %14.1f\n' "round $round, $f trunk" "$t" "$(awk -v b="$b" 'BEGIN{print b/1e6}')"
    done
done
echo "  Q8_0 / BF16 trunk: tok/s x$(awk -v a="$(mean "${t2[q8]}")" -v b="$(mean "${t2[bf16]}")" 'BEGIN{printf "%.2f", a/b}') (the Q8_0 file's logits are its own: perplexity --kl-divergence measures the difference)"
