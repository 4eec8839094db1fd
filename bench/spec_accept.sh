#!/usr/bin/env bash
# spec_accept.sh - how often a draft model's proposals are accepted in real
# speculative decoding against a target: chat answers, code and (SPEC_SETS)
# prose continuations, greedy.
#
#   bench/spec_accept.sh [TARGET] [DRAFTER]     (defaults: models/k3-mini, models/k3-mini-draft)
#
# DRAFTER may be a Qwen3 model folder (cross-tokenizer drafting, issue 42: e.g.
# build/qwen3-drafter from tools/train/qwen3_drafter.sh); proposed / accepted
# then count the K3 ids its translated drafts became.  SPEC_WIDE=PATH adds
# --draft-wide PATH (a second Qwen3 drafter asked when the first is unsure);
# the wide drafter's share of the proposals taken is then printed per set.
#
# Every run is `deltafin run ... --draft model:DRAFTER --draft-k K --bench-json`
# with the draft count forced (--draft-k goes past the cost model and the guard,
# so every step is drafted and acceptance is the drafter's, not the guard's);
# proposed and accepted drafts are summed over the prompts of a set.  Printed
# per set and K: accepted / proposed, and the target's tokens per pass (1 + the
# accepted drafts per pass).  K 1 is the first draft's hit rate.  One thread,
# nice 19 (nothing here is a speed claim).  Env: SPEC_NEW (tokens per answer,
# 64), SPEC_K ("1 4"), SPEC_SETS ("chat code"; "chat prose code" adds five
# openings of held-out prose documents, build/train38/heldout.txt's, in neither
# model's training data).  The ids are checked against drafts off: a difference
# fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-models/k3-mini}
drafter=${2:-models/k3-mini-draft}
new=${SPEC_NEW:-64}
ks=${SPEC_K:-1 4}
sets=${SPEC_SETS:-chat code}
if [ ! -e "$drafter" ]; then
    echo "spec_accept.sh: no drafter at $drafter (a model folder or a GGUF file)" >&2
    exit 2
fi
make -s build/deltafin
field() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p"; }
ids_of() { sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p'; }

chat=("What is 23 + 45?" "What is 17 + 38?" "Hello!" "What is your name?" "What is the capital of France?"
      "Tell me about the sea and the ships on it." "How are you today?" "Tell me a fortune." "What is 64 + 29?"
      "Thanks for your help!")
code=('def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef factorial(n):\n    if n < 2:\n        return 1\n    return'
      'import os\nimport sys\n\n\ndef main():\n    for name in os.listdir(sys.argv[1]):\n        print(name)\n\n\nif __name__ =='
      'class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n        return'
      '>>> d = {"a": 1, "b": 2}\n>>> for key, value in d.items():\n...     print(key, value)\n'
      'with open("data.txt") as f:\n    for line in f:\n        line = line.strip()\n        if not line:\n            continue\n')
prose=("To every thing there is a season, and a time to every purpose under the heaven: A time to be born, and a time to die; a time to plant,"
       "The term ‘hacker’ also tends to connote membership in the global community defined by the net"
       "The denunciation of the young is a necessary part of the hygiene of older"
       "The modules described in this chapter parse various miscellaneous file formats"
       "The tilde (~) is commonly used in a quantifying sense of ‘approximately’; that is,")
fail=0
wide=()
[ -z "${SPEC_WIDE:-}" ] || wide=(--draft-wide "$SPEC_WIDE")
errf=$(mktemp)
trap 'rm -f "$errf"' EXIT
run_set() {
    local label=$1 kind=$2; shift 2
    for k in $ks; do
        local prop=0 acc=0 steps=0 passes=0 asked=0 taken=0 dsec=0
        for p in "$@"; do
            local pa=(--prompt "$(printf "$p")")
            [ "$kind" = chat ] && pa=(--chat --prompt "$p")
            off=$(nice -n 19 build/deltafin run --model "$target" "${pa[@]}" --max-new "$new" --threads 1 --draft none \
                  --bench-json 2>/dev/null | tail -1)
            on=$(nice -n 19 build/deltafin run --model "$target" "${pa[@]}" --max-new "$new" --threads 1 \
                 --draft "model:$drafter" "${wide[@]}" --draft-k "$k" --bench-json --stats 2>"$errf" | tail -1)
            local wl; wl=$(grep 'wide drafter: asked for' "$errf" || true)
            if [ -n "$wl" ]; then
                asked=$((asked + $(echo "$wl" | sed 's/.*asked for \([0-9]*\) .*/\1/')))
                taken=$((taken + $(echo "$wl" | sed 's/.*unsure of, \([0-9]*\) .*/\1/')))
            fi
            dsec=$(awk -v a="$dsec" -v b="$(sed -n 's/.*; \([0-9.]*\) s drafting$/\1/p' "$errf")" 'BEGIN { print a + b }')
            if [ "$(echo "$off" | ids_of)" != "$(echo "$on" | ids_of)" ]; then
                echo "  !! $label: ids differ from drafts off for: $p"; fail=1
            fi
            prop=$((prop + $(echo "$on" | field draft_proposed))); acc=$((acc + $(echo "$on" | field draft_accepted)))
            steps=$((steps + $(echo "$on" | field decode_steps))); passes=$((passes + $(echo "$on" | field decode_passes)))
        done
        awk -v l="$label" -v k="$k" -v n="$#" -v p="$prop" -v a="$acc" -v s="$steps" -v q="$passes" -v w="$asked" \
            -v t="$taken" -v ds="$dsec" -v wide="${#wide[@]}" 'BEGIN {
            printf "%-6s k=%d  %2d prompts  accepted %5d / %5d = %5.1f %%   tokens per target pass %.2f (%d tokens)   drafting %.3f s",
                   l, k, n, a, p, p ? 100 * a / p : 0, q ? s / q : 0, s, ds
            if (wide) printf "   wide asked %d, taken %d", w, t
            printf "\n" }'
    done
}
echo "target $target, drafter $drafter${SPEC_WIDE:+ with --draft-wide $SPEC_WIDE}, greedy, $new new tokens, --draft-k forced, 1 thread"
for set in $sets; do
    case $set in
    chat) run_set chat chat "${chat[@]}" ;;
    prose) run_set prose text "${prose[@]}" ;;
    code) run_set code text "${code[@]}" ;;
    *) echo "spec_accept.sh: unknown set $set (chat, prose, code)" >&2; exit 2 ;;
    esac
done
exit "$fail"
