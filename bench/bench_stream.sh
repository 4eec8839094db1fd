#!/usr/bin/env bash
# Experts from disk: a K3-shaped model whose experts (~12 GB, 17.5 MB each,
# K3's exact expert shape) far exceed the memory budget.  In one run:
#   1. the device's O_DIRECT bandwidth (deltafin iobench, K3 expert reads)
#   2. decode at several expert-cache sizes, cold page cache, prefetch off
#      and auto (the timing controller decides): tok/s, expert bytes/token,
#      true hit rate, expert GB/s and its ratio to the device bandwidth
#      measured again right before that row (this VM's disk drifts between
#      0.6 and 2 GB/s within minutes, so one measurement at the start is
#      not the ceiling of every row)
#   3. the route trace of the largest run replayed through LRU, LFU, TLFU
#      and Belady's optimal (deltafin cachesim)
# The model is generated under BENCH_DIR (default a new /var/tmp dir) and
# deleted at the end unless BENCH_KEEP=1.  Needs root for drop_caches (it
# is skipped with a warning otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s all
# a BENCH_DIR given is kept; a directory made here is removed at exit
# unless BENCH_KEEP=1
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /var/tmp/deltafin-stream.XXXXXX); made=1; fi
model="$dir/model"
cleanup() { [ "$made" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
if [ ! -f "$model/model.safetensors.index.json" ]; then
    build/k3gen --out "$model" --preset bench1g --set num_experts=64 --set num_experts_per_token=8 \
        --set moe_intermediate_size=3072 --set routed_expert_hidden_size=3584 --set num_shared_experts=1
fi
DF=build/deltafin
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: not root)"; }
ntok=${BENCH_TOKENS:-12}
prompt=1,2,3,4
echo "== device"
dev=$($DF iobench "$model" --seconds 5 | tee /dev/stderr | sed -E 's/.*: ([0-9.]+) GB\/s.*/\1/')
echo "== decode, cold page cache ($ntok tokens after a $prompt prompt)"
printf '%-14s %-9s %8s %12s %9s %10s %9s %12s\n' "expert cache" "prefetch" "tok/s" "MB/token" "hit rate" "GB/s" \
    "dev GB/s" "GB/s / dev"
for cache in ${BENCH_CACHES:-150M 1G 4G}; do
  for pf in off auto; do
    dev=$($DF iobench "$model" --seconds 2 | sed -E 's/.*: ([0-9.]+) GB\/s.*/\1/')
    drop
    ev="$dir/events-$cache-$pf.jsonl"
    flag=""; [ "$pf" = off ] && flag="--no-prefetch"
    $DF run --model "$model" --prompt-ids $prompt --max-new "$ntok" --expert-cache "$cache" --threads 2 $flag \
        --events "$ev" --trace "$dir/trace.jsonl" --trace-format jsonl >/dev/null 2>&1
    # decode lines only (tokens == 1), skipping the first decode step
    /usr/bin/python3 - "$ev" "$dev" "$cache" "$pf" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
dec = [r for r in rows if r["tokens"] == 1][1:]
ms = sum(r["ms"] for r in dec); b = sum(r["bytes_read"] for r in dec)
h = sum(r["expert_hits"] for r in dec); m = sum(r["expert_misses"] for r in dec)
gbps = b / (ms / 1e3) / 1e9 if ms else 0
dev = float(sys.argv[2])
print(f"{sys.argv[3]:<14} {sys.argv[4]:<9} {len(dec) / (ms / 1e3):8.3f} {b / len(dec) / 1e6:12.1f} "
      f"{h / max(h + m, 1):9.3f} {gbps:10.2f} {dev:9.2f} {gbps / dev:12.3f}")
PY
  done
done
echo "== route trace replay (last run's trace)"
$DF cachesim --trace "$dir/trace.jsonl" --slots 8,64,128,256,512
