#!/usr/bin/env bash
# bench_vs_llama.sh - deltafin against llama.cpp v0.4.0 (npm prebuilt) on the
# same GGUF, the scenarios of the GGUF issues, one table each:
#   (a) in RAM: a K3-shaped GGUF of ~2.6 GB (k3gen preset bench2g);
#   (b) K3's real situation: a K3-shaped GGUF of ~25 GB (128 experts of
#       17.5 MB per layer, K3's expert size) with a helper process holding
#       memory locked so that only ~6 GiB stay available to either engine;
#       page cache dropped before every run; deltafin gets --mem 5G,
#       llama.cpp runs from its mmap without repacked copies;
#   (c) (a)'s model with its trunk in Q8_0 and its experts kept MXFP4, made
#       by llama.cpp's own quantizer (llama_model_quantize, as K3's Q8_0
#       GGUFs are made), in RAM;
#   (d) (b)'s model the same way, at 4x the memory, both engines squeezed.
# The prefill ratio of (c)/(d) is llama.cpp's int8 dot products against
# deltafin's f32 ones: llama.cpp rounds every activation row to 8 bits
# (Q8_0) before its integer dot products with the Q8_0 trunk, which is
# cheaper per weight but is not the stored values times the activation;
# deltafin multiplies the stored values by the f32 activations (kernels.h),
# the one reduction order whatever the weight format.
# Each table: medians over interleaved repetitions (A B, B A, ...) of
# prefill and decode tok/s, peak RSS and disk bytes read per decoded token,
# and the deltafin / llama.cpp ratios (deltafin bench --vs-llama), then each
# engine's roofline fractions against the machine's memory read bandwidth
# and the kernels' in-cache rate, measured in the same run.
# Needs root for mlock and drop_caches in (b), `npm ci --prefix tests/llama`,
# ~28 GB free under BENCH_DIR (default: a temp dir in /var/tmp, deleted
# afterwards unless BENCH_KEEP=1).  Env: BENCH_THREADS (default: all CPUs),
# BENCH_SKIP_A / BENCH_SKIP_B / BENCH_SKIP_C / BENCH_SKIP_D = 1 to skip a scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s all build/llama_peer
# a BENCH_DIR given is kept; a directory made here is removed at exit
# unless BENCH_KEEP=1
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /var/tmp/deltafin-vsllama.XXXXXX); made=1; fi
cleanup() { [ "$made" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
threads=${BENCH_THREADS:-$(nproc)}
gen() { # name, k3gen args...: GGUF only (the safetensors copy is deleted)
    local name=$1
    shift
    [ -f "$dir/$name.gguf" ] && return
    build/k3gen --out "$dir/$name.st" --gguf "$dir/$name.gguf" "$@" >/dev/null
    rm -rf "$dir/$name.st"
}
if [ "${BENCH_SKIP_A:-0}" != 1 ]; then
    echo "== (a) in RAM: K3-shaped GGUF, bench2g"
    gen a --preset bench2g
    # the five cells of issue 40: 1 and 2 threads, 64- and 2,048-token
    # prompts, 2 threads at 8,192 (fewer decoded tokens and repetitions:
    # each run evaluates the whole prompt); BENCH_A_CELLS picks some
    # ("1:64 2:8192"), BENCH_THREADS does not apply here
    for cell in ${BENCH_A_CELLS:-1:64 1:2048 2:64 2:2048 2:8192}; do
        t=${cell%%:*} p=${cell##*:}
        g=32 r=3
        [ "$p" -ge 8192 ] && g=8 r=2
        echo "-- (a) $t thread(s), $p-token prompt, $g decoded, $r repetitions"
        build/deltafin bench --vs-llama --model "$dir/a.gguf" --threads "$t" --prompt-len "$p" --gen "$g" --reps "$r"
    done
fi
if [ "${BENCH_SKIP_B:-0}" != 1 ]; then
    echo "== (b) larger than RAM: ~25 GB K3-shaped GGUF, ~6 GiB available"
    gen b --preset bench1g --set num_experts=128 --set num_experts_per_token=8 --set moe_intermediate_size=3072 \
        --set routed_expert_hidden_size=3584 --set num_shared_experts=1
    build/deltafin bench --vs-llama --model "$dir/b.gguf" --threads "$threads" --prompt-len 16 --gen 8 --reps 2 \
        --mem 5G --squeeze-to 6G --drop-caches --llama-no-repack
fi
lib=tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
q8() { # name: NAME-q8.gguf from NAME.gguf by llama.cpp's quantizer, experts kept
    [ -f "$dir/$1-q8.gguf" ] && return
    build/llama_peer --lib "$lib" --model "$dir/$1.gguf" --quantize "$dir/$1-q8.gguf" --quantize-type q8_0 \
        --threads "$threads"
}
if [ "${BENCH_SKIP_C:-0}" != 1 ]; then
    echo "== (c) in RAM: (a)'s GGUF with a Q8_0 trunk (llama.cpp's quantizer, experts kept MXFP4)"
    gen a --preset bench2g
    q8 a
    build/deltafin bench --vs-llama --model "$dir/a-q8.gguf" --threads "$threads" --prompt-len 64 --gen 32 --reps 3
fi
if [ "${BENCH_SKIP_D:-0}" != 1 ]; then
    echo "== (d) larger than RAM: (b)'s GGUF with a Q8_0 trunk, ~6 GiB available"
    gen b --preset bench1g --set num_experts=128 --set num_experts_per_token=8 --set moe_intermediate_size=3072 \
        --set routed_expert_hidden_size=3584 --set num_shared_experts=1
    q8 b
    build/deltafin bench --vs-llama --model "$dir/b-q8.gguf" --threads "$threads" --prompt-len 16 --gen 8 --reps 2 \
        --mem 5G --squeeze-to 6G --drop-caches --llama-no-repack
fi
