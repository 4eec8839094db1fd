"""Curriculum stage A for issue 38: a focused subset of build/train38/corpus/train.jsonl.

Keeps every short conversation (arithmetic, tools, tools-not-needed, small talk), a fixed share
of the prose documents (so English is rehearsed, not forgotten) and none of the long-context rows
(stage B, the full mix, has those). The held-out sets are untouched: this only subsets rows that
build38.sh already checked with check_heldout38.py. Deterministic (seed 38039).

usage: focus38.py IN.jsonl OUT.jsonl [--prose-frac 0.15]
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--prose-frac", type=float, default=0.15)
    ap.add_argument("--long-chars", type=int, default=2000,
                    help="a system message longer than this marks a long-context row (dropped)")
    a = ap.parse_args()
    rng = random.Random(38039)
    n = {"prose": 0, "long": 0, "chat": 0, "prose_dropped": 0}
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
                n["chat"] += 1
            g.write(line)
    print("focus38:", json.dumps(n))


if __name__ == "__main__":
    main()
