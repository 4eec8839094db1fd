#!/bin/bash
# One export's issue-38 checks, as every stage since H measured them (greedy, held-out, one thread, nice 19):
# held-out prose perplexity (window 256), sums with / without thinking and tool calls through both APIs (n 100),
# and with "long" the sum after a ~14,000-id system prompt (n 20); then the tool misses by kind (misses38.py).
#   tools/train/stage_eval.sh MODEL_DIR OUT_DIR TAG [long]      (run from the repository root; needs
#   build/deltafin and build/train38/{heldout.txt,heldout_docs.txt} from corpus/build38o.sh)
set -euo pipefail
M=$1; O=$2; T=$3
mkdir -p "$O"
N="nice -n 19"
$N ./build/deltafin perplexity --model "$M" --file build/train38/heldout.txt --window 256 --threads 1 \
    > "$O/$T.ppl" 2>&1
$N /usr/bin/python3 tools/train/eval_skills.py --model "$M" --n 100 --tasks add,add_nothink,tool,tool_anthropic \
    --threads 1 --json "$O/$T.json" > "$O/$T.txt" 2>&1
if [ "${4:-}" = long ]; then
    $N /usr/bin/python3 tools/train/eval_skills.py --model "$M" --n 20 --tasks long --long-ids 14000 --threads 1 \
        --json "$O/$T.long.json" >> "$O/$T.txt" 2>&1
fi
/usr/bin/python3 tools/train/misses38.py "$O/$T.json" >> "$O/$T.txt"
echo "$T $(grep -o 'perplexity[^,]*' "$O/$T.ppl" | tail -1)"; cat "$O/$T.txt"
