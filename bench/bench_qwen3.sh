#!/usr/bin/env bash
# A Qwen3 drafter's decode step, the double scalar reference against the
# kernel tables (build/bench_qwen3, see its header): generate a random
# Qwen3 of Qwen3-0.6B's width (hidden 1024, 16 heads of 128 over 8 kv heads,
# ffn 3072, vocabulary 151,936; BENCH_LAYERS layers, default 4 of its 28)
# outside the repo with tools/qwen3/qwen3_toy.py, run, delete it.
# BENCH_DIR picks the scratch location; BENCH_STEPS, BENCH_REPS, BENCH_THREADS as the options.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/bench_qwen3
dir=${BENCH_DIR:-$(mktemp -d /var/tmp/deltafin-bench-qwen3.XXXXXX)}
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 tools/qwen3/qwen3_toy.py make "$dir/m" --layers "${BENCH_LAYERS:-4}" --hidden 1024 --heads 16 \
    --kv-heads 8 --head-dim 128 --ffn 3072 --vocab 151936 --dtype bf16 >/dev/null
build/bench_qwen3 "$dir/m" --steps "${BENCH_STEPS:-8}" --reps "${BENCH_REPS:-3}" --threads "${BENCH_THREADS:-1}"
