#!/usr/bin/env bash
# The grammar matcher's step against a decode step (build/bench_grammar, see
# its header): generate a K3-size tokenizer (163,840 tokens, k3gen
# --tokenizer-only, ~4 MB) outside the repo, run the typical schemas, each
# of Claude Code's tools forced and JSON mode with thinking on over the
# default model's vocabulary and the K3-size one, delete the tokenizer.
# BENCH_DIR picks the scratch location (default: a new dir under /var/tmp);
# BENCH_KEEP=1 keeps it; BENCH_STEPS, BENCH_SEED, BENCH_THREADS as the options.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s all build/bench_grammar
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /var/tmp/deltafin-bench-grammar.XXXXXX); made=1; fi
cleanup() { [ "$made" = 1 ] && [ "${BENCH_KEEP:-0}" != 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
tok="$dir/k3-tokenizer"
if [ ! -f "$tok/tiktoken.model" ]; then
    rm -rf "$tok"
    build/k3gen --out "$tok" --tokenizer-only --set vocab_size=163840 >/dev/null
fi
build/bench_grammar models/k3-mini --k3-tokenizer "$tok" \
    --tools tests/agents/recorded/claude-code/session-a-turn1.json \
    --steps "${BENCH_STEPS:-400}" --seed "${BENCH_SEED:-1}" --threads "${BENCH_THREADS:-1}"
