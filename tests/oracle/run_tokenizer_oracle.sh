#!/usr/bin/env bash
# run_tokenizer_oracle.sh - checks deltafin's tokenizer against OpenAI tiktoken.
#
# Compares the ids of build/tests/tok_dump with tiktoken's (npm package
# `tiktoken`, pinned in tests/oracle/package-lock.json) on a corpus of
# English, Chinese, Japanese, code, numbers, whitespace runs, emoji,
# U+001C..U+001F, invalid UTF-8, every special spelling and long texts that
# hit the safety splitting, both with and without allow_special, on:
#   - the fixture vocabulary (testdata/k3-tiny-a),
#   - two vocabularies k3gen writes into a temp dir (preset small: 4,096 ids;
#     vocab_size=163840: K3's size),
#   - two synthetic ones the oracle derives from the corpus (every substring
#     a token, so ids show exact pre-tokenizer pieces; and a random subset in
#     random rank order, for BPE merge order).
# Installs nothing.  One-time setup (needs the npm registry):
#     npm ci --prefix tests/oracle
# then:
#     tests/oracle/run_tokenizer_oracle.sh
# Exit status is nonzero on any mismatch.  Env: BUILD (default build),
# TOK_DUMP / K3GEN to use other binaries, NODE (default node).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
build=${BUILD:-build}
node=${NODE:-node}
if [ ! -d "$here/node_modules/tiktoken" ]; then
    echo "run_tokenizer_oracle.sh: tiktoken is not installed; run: npm ci --prefix tests/oracle" >&2
    exit 2
fi
tok_dump=${TOK_DUMP:-$build/tests/tok_dump}
k3gen=${K3GEN:-$build/k3gen}
if [ -z "${TOK_DUMP:-}" ] || [ -z "${K3GEN:-}" ]; then
    make --no-print-directory -s BUILD="$build" "$tok_dump" "$k3gen"
fi
work=$(mktemp -d /tmp/df_tok_oracle.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$k3gen" --out "$work/k3gen-small" --preset small >/dev/null
"$k3gen" --out "$work/k3gen-163840" --preset tiny --set vocab_size=163840 >/dev/null
"$node" "$here/tokenizer_oracle.cjs" --tok-dump "$tok_dump" --work "$work" --corpus "$here/tokenizer_corpus.json" \
    testdata/k3-tiny-a/checkpoint "$work/k3gen-small" "$work/k3gen-163840"
