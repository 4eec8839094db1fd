#!/usr/bin/python3
"""Check that no held-out case of issue 38 is in the training or validation rows:
the addition pairs (heldout_pairs.txt), the subtraction / multiplication pairs and the tool-request
phrasings (heldout38.json).  Exits 1 on a leak.

  /usr/bin/python3 tools/train/corpus/check_heldout38.py build/train38/corpus/train.jsonl build/train38/corpus/val.jsonl
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def heldout_patterns(tool_phrasings=None):
    """one regular expression per held-out tool phrasing (a slot matches any text)"""
    if tool_phrasings is None:
        tool_phrasings = json.load(open(os.path.join(HERE, "heldout38.json")))["tool_phrasings"]
    return [re.compile("^" + re.sub(r"\\\{[a-z0-9]+\\\}", ".+", re.escape(p)) + "$")
            for v in tool_phrasings.values() for p in v]


def main():
    ho = json.load(open(os.path.join(HERE, "heldout38.json")))
    held = {"+": set(), "-": set(map(tuple, ho["sub_pairs"])), "*": set(map(tuple, ho["mul_pairs"]))}
    for line in open(os.path.join(HERE, "heldout_pairs.txt")):
        if line.strip() and not line.startswith("#"):
            a, b = line.split()[:2]
            held["+"].add((int(a), int(b)))
    pats = heldout_patterns(ho["tool_phrasings"])
    leaks = 0
    for fn in sys.argv[1:]:
        for line in open(fn, encoding="utf-8"):
            r = json.loads(line)
            for m in r.get("messages", []):
                c = m.get("content") or ""
                for x in (c, m.get("reasoning_content") or ""):
                    for a, op, b in re.findall(r"(\d+) ([-+*]) (\d+) =", x):
                        if (int(a), int(b)) in held[op]:
                            leaks += 1
                            print("leak:", fn, x[:80])
                if m["role"] == "user" and any(p.match(c) for p in pats):
                    leaks += 1
                    print("leak (phrasing):", fn, c[:80])
    print("check_heldout38: %d leaks" % leaks)
    sys.exit(1 if leaks else 0)


if __name__ == "__main__":
    main()
