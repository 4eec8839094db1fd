"""Stage L's sum block (issue 38): the no-thinking `A + B` rows of a focus38.py arithmetic file, the rows
whose ones digits do not carry repeated (stage K's no-thinking misses add a carry that is not there:
`11 + 48 = 69.`, `21 + 18 = 49.`). The rows are copied as they are (training pairs and phrasings,
already checked by check_heldout38.py upstream); deterministic (seed 38070).

usage: sums38.py build/train38/corpus/arith_i.jsonl OUT.jsonl [--no-carry-copies 3]
"""
import argparse
import json
import random
import re

SUM = re.compile(r"^(\d+) \+ (\d+) = ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--no-carry-copies", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(38070)
    out, n = [], {"carry": 0, "no_carry": 0}
    with open(a.inp, encoding="utf-8") as f:
        for line in f:
            m = json.loads(line)["messages"]
            if m[-1].get("reasoning_content"):
                continue
            mm = SUM.match(m[-1].get("content") or "")
            if not mm:
                continue
            x, y = int(mm.group(1)), int(mm.group(2))
            k = "no_carry" if x % 10 + y % 10 < 10 else "carry"
            n[k] += 1
            out += [line] * (a.no_carry_copies if k == "no_carry" else 1)
    rng.shuffle(out)
    with open(a.out, "w", encoding="utf-8") as g:
        g.writelines(out)
    print(json.dumps(dict(n, rows=len(out))))


if __name__ == "__main__":
    main()
