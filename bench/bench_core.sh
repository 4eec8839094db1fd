#!/usr/bin/env bash
# make bench: generate a K3-shaped model of ~1.2 GB (k3gen preset bench1g)
# outside the repo, run bench_core on it at 1 and 2 threads, delete it.
# BENCH_DIR picks the scratch location (default: a new dir under /tmp);
# BENCH_PRESET=bench2g for the ~2.6 GB model; BENCH_KEEP=1 keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s all build/bench_core
# a BENCH_DIR given is kept; a directory made here is removed at exit
# unless BENCH_KEEP=1
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /tmp/deltafin-bench.XXXXXX); made=1; fi
model="$dir/model"
if [ ! -f "$model/model.safetensors.index.json" ]; then
    rm -rf "$model"
    build/k3gen --out "$model" --preset "${BENCH_PRESET:-bench1g}"
fi
cleanup() { [ "$made" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
build/bench_core "$model" --threads-list "${BENCH_THREADS:-1,2}" --reps "${BENCH_REPS:-3}"
