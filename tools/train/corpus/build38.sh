#!/bin/bash
# Regenerate the issue-38 training data (deterministic) with the SHIPPED tokenizer
# (models/k3-mini/tiktoken.model is read, never retrained: do not run build.sh for this data).
#   1. installs the Debian packages the prose comes from (when missing)
#   2. tools/train/corpus/make_corpus38.py -> build/train38/corpus/*.jsonl, heldout.txt,
#      heldout_docs.txt, stats.json, and tools/train/corpus/heldout38.json
#   3. build/corpus_ids renders + tokenizes with the engine's own template (tools included) ->
#      build/train38/{train,val}.u16 (+ .mask: 1 = prose or assistant-reply id), heldout.txt
# Usage: tools/train/corpus/build38.sh   (from anywhere; MAKE_ARGS="..." is passed to make)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=build/train38
MODEL=models/k3-mini

need=()
for p in bible-kjv bible-kjv-text jargon-text fortunes fortunes-min python3-doc; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "build38.sh: installing ${need[*]}"
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

mkdir -p "$OUT/corpus"
/usr/bin/python3 tools/train/corpus/make_corpus38.py "$OUT/corpus"
# shellcheck disable=SC2086
make -j2 ${MAKE_ARGS:-} build/deltafin build/corpus_ids
./build/corpus_ids --model "$MODEL" --in "$OUT/corpus/train.jsonl" --out "$OUT/train.u16" --mask "$OUT/train.mask"
./build/corpus_ids --model "$MODEL" --in "$OUT/corpus/val.jsonl" --out "$OUT/val.u16" --mask "$OUT/val.mask"
/usr/bin/python3 tools/train/corpus/check_heldout38.py "$OUT/corpus/train.jsonl" "$OUT/corpus/val.jsonl"
cp "$OUT/corpus/heldout.txt" "$OUT/heldout.txt"
cp "$OUT/corpus/heldout_docs.txt" "$OUT/heldout_docs.txt"
echo "build38.sh: summary"
for f in train val; do
    echo "  $OUT/$f.u16: $(( $(stat -c %s "$OUT/$f.u16") / 2 )) ids"
done
cmp -s "$OUT/heldout.txt" build/train_data/heldout.txt 2>/dev/null && echo "  heldout.txt identical to build/train_data/heldout.txt" || true
