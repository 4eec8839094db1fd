#!/usr/bin/env bash
# bench_mpi.sh - routed experts over MPI ranks on this machine (mpirun
# --oversubscribe): for 1..BENCH_RANKS ranks, the same greedy generation on a
# generated K3-shaped model, interleaved over BENCH_ROUNDS rounds (medians):
# decode tok/s, experts each rank computed, and the message volume per token
# (what rank 0 sends each rank and gets back).  Every run's logits are
# compared with one process (bit-identical, or the bench fails).  On one
# 2-core machine the ranks share the cores: this shows the mechanism and its
# message volume, not a cluster's speed (README: the paper model).
# Usage: bench/bench_mpi.sh [build/deltafin]   env: BENCH_RANKS (4), BENCH_ROUNDS (3), BENCH_NEW (32)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/deltafin}
K3GEN=$(dirname "$BIN")/k3gen
RANKS=${BENCH_RANKS:-4}; ROUNDS=${BENCH_ROUNDS:-3}; NEW=${BENCH_NEW:-32}
command -v mpirun >/dev/null && ldd "$BIN" | grep -q libmpi || { echo "bench_mpi: needs Open MPI and a build with it"; exit 1; }
T=$(mktemp -d /tmp/deltafin-bmpi.XXXXXX); trap 'rm -rf "$T"' EXIT
MPI=(mpirun --oversubscribe); [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
"$K3GEN" --out "$T/m" --preset small --set num_experts=64 --set num_experts_per_token=8 --seed 3 >/dev/null
IDS=$(seq -s, 5 68)
run() { local np=$1 out=$2
    if [ "$np" = 1 ]; then "$BIN" run --model "$T/m" --prompt-ids "$IDS" --max-new "$NEW" --threads 1 --stats --bench-json \
        --dump-logits "$out.bin" >"$out.json" 2>"$out.err"
    else "${MPI[@]}" -np "$np" "$BIN" run --model "$T/m" --prompt-ids "$IDS" --max-new "$NEW" --threads 1 --stats --bench-json \
        --dump-logits "$out.bin" >"$out.json" 2>"$out.err"; fi
}
for r in $(seq 1 "$ROUNDS"); do
    for np in $(seq 1 "$RANKS"); do
        run "$np" "$T/r$r-$np"
        cmp -s "$T/r1-1.bin" "$T/r$r-$np.bin" || { echo "bench_mpi: logits at $np ranks differ from one process"; exit 1; }
    done
done
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
printf '%-6s %12s %26s %22s %22s\n' ranks "decode tok/s" "experts per rank" "KiB sent/token/rank" "KiB back/token/rank"
for np in $(seq 1 "$RANKS"); do
    tps=$(for r in $(seq 1 "$ROUNDS"); do sed -n 's/.*"decode_tps":\([0-9.]*\).*/\1/p' "$T/r$r-$np.json"; done | median)
    calls=$(sed -n 's/.*"rank_expert_calls":\[\([0-9,]*\)\].*/\1/p' "$T/r1-$np.json")
    sent=$(sed -n 's/.*rank [1-9][0-9]*: .*; \([0-9.]*\) KiB sent to it and \([0-9.]*\) KiB back per token/\1/p' "$T/r1-$np.err" | median)
    back=$(sed -n 's/.*rank [1-9][0-9]*: .*; \([0-9.]*\) KiB sent to it and \([0-9.]*\) KiB back per token/\2/p' "$T/r1-$np.err" | median)
    printf '%-6s %12s %26s %22s %22s\n' "$np" "$tps" "[$calls]" "${sent:--}" "${back:--}"
done
echo "every run's logits bit-identical to one process ($ROUNDS rounds, ranks interleaved)"
