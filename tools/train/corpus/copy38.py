#!/usr/bin/python3
"""Copy rows for issue 38's tools stage (deterministic, seed 38042): short conversations whose
answer is a span of the request, copied exactly.

After the tool-heavy stage D the model still wrote tool calls with memorised values (`Mima`,
`garden@example.com`) instead of the request's: it had not learnt to copy a span from its
context (an induction circuit), and in a tool row that span is a few ids among hundreds of
schema ids.  These rows put the copy alone in front of the loss: the request names a value (a
place, a word, an address, a path, a ticker, a number) in a sentence, and the reply is that value
and nothing else.  The values come from tools38.py's wide pools (made-up names built from
syllables and words), so no reply can be memorised.  No held-out phrasing, pair or tool case is
used (check_heldout38.py checks the output).

  /usr/bin/python3 tools/train/corpus/copy38.py OUT.jsonl [--n 40000]
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus38 as m38  # noqa: E402
import tools38  # noqa: E402

ASKS = [
    ("Repeat after me: {v}", "{v}"),
    ("Say {v}.", "{v}"),
    ("Copy this exactly: {v}", "{v}"),
    ("Write back the following: {v}", "{v}"),
    ("Please echo {v}", "{v}"),
    ("What did I just say? {v}", "{v}"),
]
EXTRACT = {
    "place": [("I flew to {v} last week. Which city did I mention?", "{v}"),
              ("My sister lives in {v}. Where does she live?", "She lives in {v}."),
              ("Name the place in this sentence: the train to {v} is late.", "{v}")],
    "file": [("Open the file {v}, please. Which file did I ask for?", "{v}"),
             ("The bug is in {v}. Which file is it in?", "It is in {v}.")],
    "folder": [("Everything is in the {v} folder. Which folder?", "The {v} folder.")],
    "email": [("Write to {v} tomorrow. Whose address is that?", "{v}"),
              ("My address is {v}. What is my address?", "Your address is {v}.")],
    "ticker": [("I bought shares of {v}. Which ticker?", "{v}")],
    "topic": [("Tell me later about {v}. What topic did I name?", "{v}")],
    "number": [("The code is {v}. What is the code?", "The code is {v}.")],
}


def value(rng, kind):
    if kind == "place":
        return rng.choice(m38.CITIES)
    if kind == "file":
        return m38.rand_file(rng)
    if kind == "folder":
        return rng.choice(m38.FOLDERS)
    if kind == "email":
        return rng.choice(m38.PEOPLE)
    if kind == "ticker":
        return rng.choice(m38.TICKERS)
    if kind == "topic":
        return rng.choice(m38.TOPICS)
    return str(rng.randint(10, 99999))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=40000)
    ap.add_argument("--seed", type=int, default=38042)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    tools38.widen(rng)
    kinds = sorted(EXTRACT)
    n = {"repeat": 0, "extract": 0}
    with open(a.out, "w", encoding="utf-8") as g:
        for i in range(a.n):
            kind = rng.choice(kinds)
            v = value(rng, kind)
            if rng.random() < 0.4:
                q, r = rng.choice(ASKS)
                n["repeat"] += 1
            else:
                q, r = rng.choice(EXTRACT[kind])
                n["extract"] += 1
            msgs = [{"role": "user", "content": q.format(v=v)}, {"role": "assistant", "content": r.format(v=v)}]
            g.write(json.dumps({"messages": msgs, "think": False}, ensure_ascii=False) + "\n")
    print("copy38:", json.dumps(n))


if __name__ == "__main__":
    main()
