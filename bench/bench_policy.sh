#!/usr/bin/env bash
# The expert cache's policy side by side (issue 43's policy study): the
# default LFU, which counts the rows a chunk routes to each expert, against
# LFU counting one use per chunk (`--cache-policy lfu-steps`, the default
# before), and LRU / TLFU for reference.  The default model (trained
# routing; a random model routes uniformly and no policy can help), its
# experts read from disk (O_DIRECT) into an expert cache of 1/8, 1/4 and
# 1/2 of its 224 experts, a ~3,000-token prompt (the start of HACKING.md)
# evaluated in chunks of --batch then 64 greedy tokens.  Per policy, from
# the engine's --events: the prompt's expert hit rate and MB read, then
# decode's hit rate, MB read per token and tok/s (the first decode step
# skipped); runs interleaved, BENCH_REPS rounds (default 2), the last
# column the ratio of MB read to lfu-steps' in the same round.
# The greedy tokens are compared across policies (a policy never changes
# a token).  Usage: bench/bench_policy.sh  (BENCH_MODEL, BENCH_BATCH,
# BENCH_REPS, BENCH_TOKENS)
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/deltafin
DF=build/deltafin
model=${BENCH_MODEL:-models/k3-mini}
batch=${BENCH_BATCH:-256}
reps=${BENCH_REPS:-2}
ntok=${BENCH_TOKENS:-64}
dir=$(mktemp -d /tmp/deltafin-policy.XXXXXX)
trap 'rm -rf "$dir"' EXIT
$DF tokenize --model "$model" "$(head -c 7000 HACKING.md)" | tail -1 > "$dir/prompt.ids"
# the slot size from the plan: N experts held at a known byte budget
slot=$($DF plan --model "$model" --expert-cache 1M 2>/dev/null | awk 'NR==2 {split($6, a, "/"); print int(1048576 / a[1]); exit}')
nexp=$($DF plan --model "$model" --expert-cache 1M 2>/dev/null | awk 'NR==2 {split($6, a, "/"); print a[2]; exit}')
slot=$(( slot / 4096 * 4096 ))
echo "model $model: $nexp experts, $slot bytes a cache slot; prompt $(tr ',' '\n' < "$dir/prompt.ids" | wc -l) ids in chunks of $batch, $ntok tokens decoded, --threads 1"
printf '%5s %6s %-10s %10s %10s %10s %10s %10s %8s %10s\n' round slots policy "prompt hit" "prompt MB" "decode hit" \
    "MB/token" "tok/s" "same ids" "MB/steps'"
for r in $(seq 1 "$reps"); do
  for frac in 8 4 2; do
    slots=$(( nexp / frac ))
    base=""
    for pol in ${BENCH_POLICIES:-lfu-steps lfu tlfu lru}; do
      ev="$dir/ev-$pol.jsonl"
      $DF run --model "$model" --prompt-ids @"$dir/prompt.ids" --max-new "$ntok" --temp 0 --batch "$batch" \
          --expert-cache $(( slots * slot )) --cache-policy "$pol" --threads 1 --events "$ev" > "$dir/out-$pol.txt" 2>/dev/null
      same=yes
      [ "$pol" = lfu-steps ] || cmp -s "$dir/out-$pol.txt" "$dir/out-lfu-steps.txt" || same=NO
      line=$(/usr/bin/python3 - "$ev" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pr = [r for r in rows if r["tokens"] > 1]
dec = [r for r in rows if r["tokens"] == 1][1:]
def hit(rs):
    h = sum(r["expert_hits"] for r in rs); m = sum(r["expert_misses"] for r in rs)
    return h / max(h + m, 1)
pb = sum(r["bytes_read"] for r in pr) / 1e6
db = sum(r["bytes_read"] for r in dec) / 1e6
ms = sum(r["ms"] for r in dec)
print(f"{hit(pr):.3f} {pb:.2f} {hit(dec):.3f} {db / len(dec):.3f} {len(dec) / (ms / 1e3):.1f} {pb + db:.4f}")
PY
)
      read -r ph pmb dh dmb tps tot <<< "$line"
      [ -n "$base" ] || base=$tot
      ratio=$(awk -v a="$tot" -v b="$base" 'BEGIN {printf "%.3f", a / b}')
      printf '%5s %6s %-10s %10s %10s %10s %10s %10s %8s %10s\n' "$r" "$slots" "$pol" "$ph" "$pmb" "$dh" "$dmb" "$tps" \
          "$same" "$ratio"
    done
  done
done
echo "MB/steps': the run's expert MB read (prompt + decode) over lfu-steps' in the same round and cache size"
