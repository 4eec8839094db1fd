#!/bin/bash
# Regenerate the k3-mini training data and tokenizer (deterministic):
#   1. installs the Debian packages the corpus comes from (when missing)
#   2. tools/train/corpus/make_corpus.py -> build/train_data/corpus/*.jsonl, heldout.txt,
#      tokenizer_corpus.txt, and tools/train/corpus/heldout_pairs.txt
#   3. k3gen trains the BPE tokenizer (V = 4096) -> models/k3-mini/{tiktoken.model,tokenizer_config.json}
#   4. build/corpus_ids renders + tokenizes with the engine's own code ->
#      build/train_data/{train,val}.u16 (+ .mask: 1 = prose or assistant-reply id), heldout.txt
# Usage: tools/train/corpus/build.sh   (from anywhere; MAKE_ARGS="..." is passed to make)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=build/train_data
MODEL=models/k3-mini
V=4096

need=()
for p in bible-kjv bible-kjv-text jargon-text fortunes fortunes-min python3-doc; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "build.sh: installing ${need[*]}"
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

mkdir -p "$OUT/corpus" "$MODEL"
/usr/bin/python3 tools/train/corpus/make_corpus.py "$OUT/corpus"

# shellcheck disable=SC2086
make -j2 ${MAKE_ARGS:-} build/k3gen build/corpus_ids
./build/k3gen --out "$MODEL" --tokenizer-only --tokenizer-corpus "$OUT/corpus/tokenizer_corpus.txt" \
    --set vocab_size=$V

./build/corpus_ids --model "$MODEL" --in "$OUT/corpus/train.jsonl" --out "$OUT/train.u16" --mask "$OUT/train.mask"
./build/corpus_ids --model "$MODEL" --in "$OUT/corpus/val.jsonl" --out "$OUT/val.u16" --mask "$OUT/val.mask"
cp "$OUT/corpus/heldout.txt" "$OUT/heldout.txt"
/usr/bin/python3 -c 'import json,sys; print(json.dumps({"text": open(sys.argv[1], encoding="utf-8").read()}))' \
    "$OUT/heldout.txt" > "$OUT/corpus/heldout.jsonl"
./build/corpus_ids --model "$MODEL" --in "$OUT/corpus/heldout.jsonl" --out "$OUT/corpus/heldout.u16"

echo "build.sh: summary (V=$V, document separator <|end_of_msg|> = $((V - 254)))"
for f in train val; do
    echo "  $OUT/$f.u16: $(( $(stat -c %s "$OUT/$f.u16") / 2 )) tokens"
done
echo "  $OUT/heldout.txt: $(stat -c %s "$OUT/heldout.txt") bytes, $(( $(stat -c %s "$OUT/corpus/heldout.u16") / 2 )) tokens (incl. 1 separator)"
echo "  $MODEL: tiktoken.model, tokenizer_config.json"
