#!/usr/bin/env bash
# MLA attention over a long latent cache, the scalar reference against the
# selected kernels (build/bench_mla, see its header): generate the K3-shaped
# bench1g model (~1.2 GB, 3 MLA layers of 8 heads) outside the repo, run the
# attention rows at 4K/16K/32K positions, K3's own shape up to 128K (--k3)
# and one engine decode step after 4K positions, delete the model.
# BENCH_DIR picks the scratch location (default: a new dir under /var/tmp);
# BENCH_KEEP=1 keeps it; BENCH_CTX, BENCH_THREADS, BENCH_REPS as the options.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s all build/bench_mla
# a BENCH_DIR given is kept; a directory made here is removed at exit
# unless BENCH_KEEP=1
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /var/tmp/deltafin-bench-mla.XXXXXX); made=1; fi
model="$dir/model"
cleanup() { [ "$made" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
if [ ! -f "$model/model.safetensors.index.json" ]; then
    rm -rf "$model"
    build/k3gen --out "$model" --preset bench1g >/dev/null
fi
build/bench_mla "$model" --ctx "${BENCH_CTX:-4096,16384,32768}" --threads "${BENCH_THREADS:-2}" \
    --reps "${BENCH_REPS:-3}" --k3 --engine-at 4096
