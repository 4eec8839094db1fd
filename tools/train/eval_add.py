"""Addition accuracy through the C engine: for each held-out pair A B, run
`build/deltafin run --model M --chat --prompt "What is A + B?"` (greedy, the default; thinking on
unless --no-think) and check the reply states A + B = (A+B).

  /usr/bin/python3 tools/train/eval_add.py --model models/k3-mini [--no-think] [--n 100]
"""
import argparse
import json
import re
import subprocess


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/k3-mini")
    ap.add_argument("--pairs", default="tools/train/corpus/heldout_pairs.txt")
    ap.add_argument("--no-think", action="store_true")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    pairs = []
    for line in open(a.pairs):
        if line.strip() and not line.startswith("#"):
            x, y = line.split()[:2]
            pairs.append((int(x), int(y)))
    pairs = pairs[: a.n]
    exact = correct = 0
    rows = []
    for x, y in pairs:
        cmd = ["build/deltafin", "run", "--model", a.model, "--chat", "--prompt", "What is %d + %d?" % (x, y),
               "--max-new", "48"]
        if a.no_think:
            cmd.append("--no-think")
        r = subprocess.run(cmd, capture_output=True)
        out = r.stdout.decode("utf-8", "replace").strip()
        m = re.search(r"=\s*(-?\d+)", out)
        got = int(m.group(1)) if m else None
        ok = got == x + y
        ex = out.startswith("%d + %d = %d." % (x, y, x + y))
        correct += ok
        exact += ex
        rows.append({"a": x, "b": y, "reply": out, "sum_ok": ok, "exact": ex})
    n = len(pairs)
    res = {"model": a.model, "think": not a.no_think, "pairs": n, "sum_correct": correct, "exact_reply": exact,
           "accuracy": correct / n, "examples": rows[:10], "wrong": [r for r in rows if not r["sum_ok"]][:20]}
    print("%s think=%s: %d/%d sums correct (%d exact 'A + B = C.' replies)" %
          (a.model, not a.no_think, correct, n, exact))
    for r in rows[:5]:
        print("  What is %d + %d? -> %r" % (r["a"], r["b"], r["reply"]))
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
