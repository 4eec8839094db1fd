#!/usr/bin/python3
"""The model card's numbers for a k3-mini snapshot, measured, never typed (issue 38).

  /usr/bin/python3 tools/train/model_card.py --model tools/train/wip/k3-mini-next \
      [--n 100] [--long 20] [--card models/k3-mini/README.md] [--json build/eval/card.json]

Runs, through the C engine:
  - tools/train/eval_skills.py on the held-out cases: sums with thinking on and off, A - B and
    A * B with a one-digit B, a tool call (OpenAI and Anthropic), and (--long N) sums after a
    ~14,000-id system prompt of held-out documentation;
  - `deltafin perplexity` on the held-out prose (build/train38/heldout.txt, windows of 256),
    beside the shipped model's for the +2 % criterion;
  - the snapshot's training record (snapshot.json: steps, ids, minutes).
Prints a markdown table; with --card FILE the table replaces the text between the lines
`<!-- card:begin -->` and `<!-- card:end -->` of FILE (added at its end when missing).
Stdlib only.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def perplexity(deltafin, model, text):
    out = subprocess.run([deltafin, "perplexity", "--model", model, "--file", text, "--window", "256", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def skills(model, n, long_n, deltafin):
    path = os.path.join(ROOT, "build", "eval", "card-skills.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tasks = "add,add_nothink,sub,mul,tool,tool_anthropic" + (",long" if long_n else "")
    cmd = [sys.executable, os.path.join(HERE, "eval_skills.py"), "--model", model, "--tasks", tasks, "--n", str(n),
           "--deltafin", deltafin, "--json", path]
    subprocess.run(cmd, check=True)
    return json.load(open(path))


def table(model, sk, ppl, ppl_base, snap):
    def cell(task):
        r = sk.get(task)
        return "%d / %d (%.0f %%)" % (r["right"], r["of"], 100.0 * r["right"] / max(1, r["of"])) if r else "not run"
    rows = [
        ("What is A + B? (A, B in 10..99), thinking on", cell("add")),
        ("What is A + B?, thinking off", cell("add_nothink")),
        ("A - B, one-digit B", cell("sub")),
        ("A * B, one-digit B", cell("mul")),
        ("a tool call and an answer from its result (OpenAI tools)", cell("tool")),
        ("the same through /v1/messages (Anthropic tools)", cell("tool_anthropic")),
        ("a sum after a ~14,000-id system prompt", cell("long")),
        ("held-out prose perplexity (windows of 256)", "%.2f (shipped model %.2f: %+.1f %%)" % (
            ppl["perplexity"], ppl_base["perplexity"], 100.0 * (ppl["perplexity"] / ppl_base["perplexity"] - 1))),
    ]
    lines = ["<!-- card:begin -->",
             "Measured by `tools/train/model_card.py --model %s` on held-out cases (greedy, through "
             "`deltafin serve`); training: %s steps, %s ids in all, %s minutes in the last run." % (
                 os.path.relpath(model, ROOT), snap.get("step", "?"), snap.get("ids_total", snap.get("ids", "?")),
                 snap.get("elapsed_minutes", "?")),
             "", "| skill | result |", "|---|---|"]
    lines += ["| %s | %s |" % r for r in rows]
    lines.append("<!-- card:end -->")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--long", type=int, default=0, help="cases of the long-context sum (about 25 s each)")
    ap.add_argument("--deltafin", default=os.path.join(ROOT, "build", "deltafin"))
    ap.add_argument("--heldout", default=os.path.join(ROOT, "build", "train38", "heldout.txt"))
    ap.add_argument("--base", default=os.path.join(ROOT, "models", "k3-mini"), help="the shipped model (perplexity)")
    ap.add_argument("--card", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if not os.path.exists(a.heldout):
        raise SystemExit("%s is missing: run tools/train/corpus/build38.sh" % a.heldout)
    sk = skills(a.model, a.n, a.long, a.deltafin)
    ppl, ppl_base = perplexity(a.deltafin, a.model, a.heldout), perplexity(a.deltafin, a.base, a.heldout)
    sp = os.path.join(a.model, "snapshot.json")
    snap = json.load(open(sp)) if os.path.exists(sp) else {}
    t = table(a.model, sk, ppl, ppl_base, snap)
    print(t)
    if a.json:
        json.dump({"skills": {k: {kk: vv for kk, vv in v.items() if kk != "cases"} if isinstance(v, dict) else v
                              for k, v in sk.items()},
                   "perplexity": ppl, "base_perplexity": ppl_base, "snapshot": snap}, open(a.json, "w"), indent=1)
    if a.card:
        text = open(a.card).read() if os.path.exists(a.card) else ""
        b, e = text.find("<!-- card:begin -->"), text.find("<!-- card:end -->")
        if b >= 0 and e > b:
            text = text[:b] + t + text[e + len("<!-- card:end -->\n"):]
        else:
            text = text + ("\n" if text and not text.endswith("\n") else "") + t
        tmp = a.card + ".tmp"
        open(tmp, "w").write(text)
        os.replace(tmp, a.card)


if __name__ == "__main__":
    main()
