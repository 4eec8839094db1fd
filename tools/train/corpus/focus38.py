"""Curriculum stages for issue 38: focused subsets of build/train38/corpus/train.jsonl.

Stage A (default): every short conversation (arithmetic, tools, tools-not-needed, small talk), a
fixed share of the prose documents (so English is rehearsed, not forgotten) and none of the
long-context rows (the full mix has those).
Stage "arith" (--arith): every arithmetic conversation (A + B, A - B, A * B: two messages, the
reply `A op B = C.`), and only shares of the rest (--tool-frac of the tool conversations,
--chat-frac of the other chat, --prose-frac of the prose), so that most of the loss is on sums.
The held-out sets are untouched: this only subsets rows that build38.sh already checked with
check_heldout38.py. Deterministic (seed 38039).

usage: focus38.py IN.jsonl OUT.jsonl [--prose-frac 0.15]
       focus38.py IN.jsonl OUT.jsonl --arith [--tool-frac 0.3 --chat-frac 0.25 --prose-frac 0.05]
       [--arith-kinds sub,mul,add_nothink]   (stage I: keep only these arithmetic kinds; default all:
       add_think, add_nothink, sub, mul; rows are otherwise chosen exactly as without the option)
"""
import argparse
import json
import random
import re

ARITH = re.compile(r"^\d+ [-+*] \d+ = -?\d+\.$")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--prose-frac", type=float, default=0.15)
    ap.add_argument("--arith", action="store_true", help="the arithmetic stage")
    ap.add_argument("--tool-frac", type=float, default=0.3)
    ap.add_argument("--chat-frac", type=float, default=0.25)
    ap.add_argument("--arith-kinds", default="",
                    help="with --arith: keep only these arithmetic rows (add_think, add_nothink, sub, mul)")
    ap.add_argument("--long-chars", type=int, default=2000,
                    help="a system message longer than this marks a long-context row (dropped)")
    a = ap.parse_args()
    rng = random.Random(38039)
    n = {"prose": 0, "long": 0, "chat": 0, "prose_dropped": 0, "arith": 0, "tool": 0, "dropped": 0}
    with open(a.inp, encoding="utf-8") as f, open(a.out, "w", encoding="utf-8") as g:
        for line in f:
            r = json.loads(line)
            if "text" in r:
                if rng.random() >= a.prose_frac:
                    n["prose_dropped"] += 1
                    continue
                n["prose"] += 1
            else:
                m = r["messages"]
                if m and m[0]["role"] == "system" and len(m[0]["content"]) > a.long_chars:
                    n["long"] += 1
                    continue
                if a.arith:
                    is_arith = len(m) == 2 and "tools" not in r and ARITH.match(m[1].get("content") or "")
                    kind = "arith" if is_arith else "tool" if "tools" in r else "chat"
                    keep = {"arith": 1.0, "tool": a.tool_frac, "chat": a.chat_frac}[kind]
                    if rng.random() >= keep:
                        n["dropped"] += 1
                        continue
                    if is_arith and a.arith_kinds:
                        op = m[1]["content"].split()[1]
                        ak = {"+": "add_think" if r.get("think") else "add_nothink", "-": "sub", "*": "mul"}[op]
                        if ak not in a.arith_kinds.split(","):
                            n["dropped"] += 1
                            continue
                    n[kind] += 1
                else:
                    n["chat"] += 1
            g.write(line)
    print("focus38:", json.dumps(n))


if __name__ == "__main__":
    main()
