#!/usr/bin/python3
"""Long-context conversations for issue 38, stage K (deterministic, seed 38061): a long system prompt of
training documentation, then one question, answered in form.

make_corpus38.py's 500 long rows are few and mostly short (55 % of 1-2.5K ids, 3 % of 9-15K); a window of
4K-8K ids that ends at such a reply mostly starts in the rows before it. Here every row's system prompt is
long enough to fill the training window (--min-ids .. --max-ids ids, default 2,000-12,000, drawn
log-uniformly), so the question comes after as many ids of documentation as the window holds, as in the
evaluation (eval_skills.py --tasks long: "What is A + B?" after ~14,000 ids of held-out documentation).

Documentation: the same training documents as make_corpus38's long rows (Python docs up to
make_corpus.RST_MAX, the Jargon File, the first 200 KJV chapters; never heldout_docs.txt), joined in random
order; the system heads are make_corpus38.SYS_HEADS (one of them is the evaluation's). Questions (training
pairs and phrasings only; check_heldout38.py checks the output):

  add (no thinking) 40 %, add (thinking) 10 %, sub 7.5 %, mul 7.5 %, capital 10 %, a greeting or a fact 10 %,
  a tool request (OpenAI tools offered, make_corpus38.tool_conv) 15 %

  /usr/bin/python3 tools/train/corpus/long38.py OUT.jsonl [--n 2000] [--seed 38061] [--min-ids 2000] [--max-ids 12000]
"""
import argparse
import json
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus as mc  # noqa: E402
import make_corpus38 as m38  # noqa: E402


def held_sets():
    ho = json.load(open(os.path.join(HERE, "heldout38.json")))
    add = set()
    for line in open(os.path.join(HERE, "heldout_pairs.txt")):
        if line.strip() and not line.startswith("#"):
            a, b = line.split()[:2]
            add.add((int(a), int(b)))
    return add, set(map(tuple, ho["sub_pairs"])), set(map(tuple, ho["mul_pairs"]))


def pair(rng, lo_b, hi_b, held, lo_a=10):
    while True:
        a, b = rng.randint(lo_a, 99), rng.randint(lo_b, hi_b)
        if (a, b) not in held:
            return a, b


def question(rng, held):
    """-> (messages after the system prompt, think, tools or None, kind)"""
    h_add, h_sub, h_mul = held
    r = rng.random()
    if r < 0.40:
        a, b = pair(rng, 10, 99, h_add)
        return m38.arith_conv(rng, "+", a, b, False), False, None, "add"
    if r < 0.50:
        a, b = pair(rng, 10, 99, h_add)
        return m38.arith_conv(rng, "+", a, b, True), True, None, "add_think"
    if r < 0.575:
        a, b = pair(rng, 1, 9, h_sub)
        return m38.arith_conv(rng, "-", a, b, False), False, None, "sub"
    if r < 0.65:
        a, b = pair(rng, 2, 9, h_mul)
        return m38.arith_conv(rng, "*", a, b, False), False, None, "mul"
    if r < 0.75:
        c, cap = rng.choice(mc.CAPITALS)
        return mc.chat("What is the capital of %s?" % c, "The capital of %s is %s." % (c, cap)), False, None, "capital"
    if r < 0.85:
        if rng.random() < 0.5:
            return mc.chat(rng.choice(mc.GREET_Q), rng.choice(mc.GREET_A)), False, None, "chat"
        q, a = rng.choice(mc.FACTS)
        return mc.chat(q, a), False, None, "chat"
    think = rng.random() < 0.5
    msgs, tools, _ = m38.tool_conv(rng, None)
    return msgs, think, tools, "tool"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=38061)
    ap.add_argument("--min-ids", type=int, default=2000)
    ap.add_argument("--max-ids", type=int, default=12000)
    a = ap.parse_args()
    _, _, _, by_src, _, _ = m38.prose_split()
    docs = by_src["pydoc"] + by_src["jargon"] + by_src["kjv"][:200]
    held = held_sets()
    rng = random.Random(a.seed)
    stats = {}
    lo, hi = math.log(a.min_ids), math.log(a.max_ids)
    with open(a.out, "w", encoding="utf-8") as f:
        for _ in range(a.n):
            n_ids = int(math.exp(rng.uniform(lo, hi)))
            sysm = {"role": "system", "content": m38.long_system(rng, docs, n_ids)}
            msgs, think, tools, kind = question(rng, held)
            row = {"messages": [sysm] + msgs, "think": think}
            if tools:
                row["tools"] = tools
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            stats[kind] = stats.get(kind, 0) + 1
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
