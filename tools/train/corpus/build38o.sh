#!/bin/bash
# Stage N and O data on a fresh machine (deterministic; the commands of build38.sh and of the stage I-O sections of
# tools/train/README.md section 5, one process at a time, nice 19): build/train38/{val,mix_j,sums_l,long_k}, heldout.txt,
# heldout_docs.txt, build/train38n/mix_n4, build/train38o/mix_o (+ .mask). Needs build/corpus_ids (make) and
# build38.sh's Debian packages. Usage: tools/train/corpus/build38o.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd); cd "$ROOT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
P="nice -n 19 /usr/bin/python3"
CI="nice -n 19 ./build/corpus_ids --model models/k3-mini"
B=build/train38; C=$B/corpus; N=build/train38n
mkdir -p $C $N build/train38o
t() { echo "$(date -u +%T) $*"; }
t make_corpus38; $P tools/train/corpus/make_corpus38.py $C
t val; $CI --in $C/val.jsonl --out $B/val.u16 --mask $B/val.mask
cp $C/heldout.txt $B/heldout.txt; cp $C/heldout_docs.txt $B/heldout_docs.txt
t mix_c; $P tools/train/corpus/focus38.py $C/train.jsonl $C/mix_c.jsonl --arith --tool-frac 1 --chat-frac 0.5 --prose-frac 1
t tools_extra; $P tools/train/corpus/tools38.py $C/tools_extra.jsonl --n 30000
(cd $B && cat corpus/mix_c.jsonl corpus/tools_extra.jsonl | shuf --random-source=<(yes) > corpus/mix_d.jsonl)
t mix_d ids; $CI --in $C/mix_d.jsonl --out $B/mix_d.u16 --mask $B/mix_d.mask
t toolspan_i; $P tools/train/corpus/toolspan38.py $C/toolspan_i.jsonl --n 8000 --seed 38052 --one-word-frac 0.6
$P tools/train/corpus/focus38.py $C/train.jsonl $C/arith_i.jsonl --arith --tool-frac 0 --chat-frac 0 --prose-frac 0 --arith-kinds sub,mul,add_nothink
(cd $B && cat corpus/toolspan_i.jsonl corpus/arith_i.jsonl | shuf --random-source=<(yes) > corpus/block_i.jsonl)
t block_i ids; $CI --in $C/block_i.jsonl --out $B/block_i.u16 --mask $B/block_i.mask
t toolspan_j; $P tools/train/corpus/toolspan38.py $C/toolspan_j.jsonl --n 8000 --seed 38053 --one-word-frac 0.6 --tail-frac 0.5 --multi-frac 0.5
$CI --in $C/toolspan_j.jsonl --out $B/toolspan_j.u16 --mask $B/toolspan_j.mask
for e in u16 mask; do cat $B/mix_d.$e $B/block_i.$e $B/toolspan_j.$e > $B/mix_j.$e; done
t sums_l; $P tools/train/corpus/sums38.py $C/arith_i.jsonl $C/sums_l.jsonl
$CI --in $C/sums_l.jsonl --out $B/sums_l.u16 --mask $B/sums_l.mask
t toolspan_n; $P tools/train/corpus/toolspan38.py $N/toolspan_n.jsonl --n 10000 --seed 38071 --one-word-frac 0.6 --tail-frac 0.5 --multi-frac 0.6
$CI --in $N/toolspan_n.jsonl --out $N/toolspan_n.u16 --mask $N/toolspan_n.mask
for e in u16 mask; do cat $B/mix_j.$e $B/sums_l.$e $B/sums_l.$e $B/sums_l.$e $B/sums_l.$e $N/toolspan_n.$e > $N/mix_n4.$e; done
t long_k; $P tools/train/corpus/long38.py $C/long_k.jsonl --n 2000
$CI --in $C/long_k.jsonl --out $B/long_k.u16 --mask $B/long_k.mask
t toolspan_o; $P tools/train/corpus/toolspan38.py build/train38o/toolspan_o.jsonl --n 24000 --seed 38081 --one-word-frac 0.6 --tail-frac 0.3 --multi-frac 0.8 --vary-frac 0.7
$P tools/train/corpus/check_heldout38.py $N/toolspan_n.jsonl build/train38o/toolspan_o.jsonl
$CI --in build/train38o/toolspan_o.jsonl --out build/train38o/toolspan_o.u16 --mask build/train38o/toolspan_o.mask
for e in u16 mask; do cat $B/mix_j.$e $B/sums_l.$e $B/sums_l.$e $B/sums_l.$e $B/sums_l.$e $B/sums_l.$e $N/toolspan_n.$e build/train38o/toolspan_o.$e > build/train38o/mix_o.$e; done
t sizes
for f in $B/val $B/mix_d $B/block_i $B/toolspan_j $B/mix_j $B/sums_l $N/toolspan_n $N/mix_n4 $B/long_k build/train38o/toolspan_o build/train38o/mix_o; do echo "$f $(( $(stat -c %s $f.u16) / 2 ))"; done
t done
