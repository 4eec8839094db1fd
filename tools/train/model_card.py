#!/usr/bin/python3
"""The model card's numbers for a k3-mini snapshot, measured, never typed (issue 38).

  /usr/bin/python3 tools/train/model_card.py --model tools/train/wip/k3-mini-next \
      [--n 100] [--tool-n 200] [--tool-skip 100] [--long 20] [--base DIR | --base-commit REV] [--draft DIR] [--snapshot FILE] \
      [--card models/k3-mini/README.md] [--json build/eval/card.json]

Runs, through the C engine:
  - tools/train/eval_skills.py on the held-out cases: sums with thinking on and off, A - B and
    A * B with a one-digit B, a tool call (OpenAI and Anthropic; by default cases 101-300 of seed
    3838, since cases 1-100 chose among training exports through stage Q and read high: stage Q got
    72 of those 100 and 64 of the next 100), and (--long N) sums after a ~14,000-id system prompt
    of held-out documentation;
  - `deltafin perplexity` on the held-out prose (build/train38/heldout.txt, windows of 256),
    beside the base model's for the +2 % criterion (--base DIR, or --base-commit REV: models/k3-mini
    as committed at REV, written to build/card-base-REV with `git show`);
  - the routing statistics of both on the same text: `deltafin perplexity --trace` and
    `deltafin trace stats --json` (per MoE layer: experts never used, the load's entropy over its
    maximum, the busiest expert's load over the mean, how often consecutive positions change
    experts);
  - greedy samples (`deltafin run`, chat and raw prompts; the answer, not the reasoning);
  - with --draft DIR, the drafter's acceptance in real speculative decoding against the model
    (bench/spec_accept.sh: chat answers and code, drafts forced with --draft-k 1 and 4), in a block
    of its own (`<!-- card-draft:begin -->` ... `<!-- card-draft:end -->`); --draft-only measures
    and writes only that block;
  - the snapshot's training record (snapshot.json in the model, or --snapshot FILE: steps, ids, minutes).
Prints markdown; with --card FILE it replaces the text between the lines `<!-- card:begin -->`
and `<!-- card:end -->` of FILE (added at its end when missing).
Stdlib only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def perplexity(deltafin, model, text, trace=None):
    cmd = [deltafin, "perplexity", "--model", model, "--file", text, "--window", "256", "--json", "--threads", "1"]
    if trace:
        cmd += ["--trace", trace]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def routing(deltafin, trace):
    out = subprocess.run([deltafin, "trace", "stats", trace, "--json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def base_from_commit(rev):
    """models/k3-mini as committed at rev, in build/card-base-REV (git show of each file)"""
    full = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev], capture_output=True, text=True,
                          check=True).stdout.strip()
    out = os.path.join(ROOT, "build", "card-base-" + full)
    names = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", full, "models/k3-mini/"],
                           capture_output=True, text=True, check=True).stdout.split()
    os.makedirs(out, exist_ok=True)
    for n in names:
        data = subprocess.run(["git", "-C", ROOT, "show", "%s:%s" % (full, n)], capture_output=True, check=True).stdout
        open(os.path.join(out, os.path.basename(n)), "wb").write(data)
    return out


SAMPLES = [("chat", "What is 23 + 45?"), ("chat", "What is 36 + 52?"), ("chat_nothink", "What is 58 + 67?"),
           ("chat", "What is 47 - 5?"), ("chat", "Hello!"), ("chat", "What is the capital of France?"),
           ("chat", "What is your name?"), ("raw", "In the beginning God created"),
           ("raw", "The history of the English language")]


def samples(deltafin, model):
    rows = []
    for kind, prompt in SAMPLES:
        cmd = [deltafin, "run", "--model", model, "--prompt", prompt, "--max-new", "48", "--threads", "1"]
        if kind != "raw":
            cmd += ["--chat"] + (["--no-think"] if kind == "chat_nothink" else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append((kind, prompt, out))
    return rows


def acceptance(model, draft):
    out = subprocess.run([os.path.join(ROOT, "bench", "spec_accept.sh"), model, draft], capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def skills(model, n, long_n, deltafin, tool_n, tool_skip):
    path = os.path.join(ROOT, "build", "eval", "card-skills.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tasks = "add,add_nothink,sub,mul,tool,tool_anthropic" + (",long" if long_n else "")
    cmd = [sys.executable, os.path.join(HERE, "eval_skills.py"), "--model", model, "--tasks", tasks, "--n", str(n),
           "--tool-n", str(tool_n), "--tool-skip", str(tool_skip), "--deltafin", deltafin, "--json", path]
    subprocess.run(cmd, check=True)
    return json.load(open(path))


def table(model, sk, ppl, ppl_base, snap, base_name, rt, rt_base, smp):
    def cell(task):
        r = sk.get(task)
        return "%d / %d (%.0f %%)" % (r["right"], r["of"], 100.0 * r["right"] / max(1, r["of"])) if r else "not run"

    def tool_span(task):
        first = sk.get(task + "_first_case", 1)
        return "%d-%d" % (first, first + sk[task]["of"] - 1) if sk.get(task) else "-"
    rows = [
        ("What is A + B? (A, B in 10..99), thinking on", cell("add")),
        ("What is A + B?, thinking off", cell("add_nothink")),
        ("A - B, one-digit B", cell("sub")),
        ("A * B, one-digit B", cell("mul")),
        ("a tool call and an answer from its result (OpenAI tools; cases %s)" % tool_span("tool"), cell("tool")),
        ("the same through /v1/messages (Anthropic tools; cases %s)" % tool_span("tool_anthropic"),
         cell("tool_anthropic")),
        ("a sum after a ~14,000-id system prompt", cell("long")),
        ("held-out prose perplexity (windows of 256)", "%.2f (%s %.2f: %+.1f %%)" % (
            ppl["perplexity"], base_name, ppl_base["perplexity"],
            100.0 * (ppl["perplexity"] / ppl_base["perplexity"] - 1))),
        ("held-out prose, bits per byte", "%.4f (%s %.4f)" % (ppl["bits_per_byte"], base_name,
                                                             ppl_base["bits_per_byte"])),
    ]
    if snap.get("soup"):
        trained = "the average of %d runs' end weights (%s; %s ids in all)" % (
            len(snap["soup"]), ", ".join("%s: %s steps, %s minutes" % (r.get("run", "?"), r.get("step", "?"),
                                                                        r.get("elapsed_minutes", "?"))
                                         for r in snap["soup"]), snap.get("ids_total", "?"))
    else:
        trained = "%s steps, %s ids in all, %s minutes in the last run" % (
            snap.get("step", "?"), snap.get("ids_total", snap.get("ids", "?")), snap.get("elapsed_minutes", "?"))
    lines = ["<!-- card:begin -->",
             "Measured by `/usr/bin/python3 tools/train/model_card.py %s` on held-out cases (greedy, through "
             "`deltafin serve`); training: %s." % (" ".join(sys.argv[1:]), trained),
             "", "| skill | result |", "|---|---|"]
    lines += ["| %s | %s |" % r for r in rows]
    tr = "`deltafin perplexity --trace` on the held-out prose, then `deltafin trace stats --json`"
    lines += ["", "Routing on the held-out prose (%d positions, %d experts, top %d; %s): per MoE layer, experts "
              "never chosen, the entropy of the experts' load over its maximum (1 = even), the busiest expert's "
              "load over the mean, and the share of consecutive positions whose experts differ; %s in brackets." % (
                  rt["layers"][0]["rows"], rt["experts"], rt["top_k"], tr, base_name),
              "", "| layer | unused | entropy / max | max / mean | changed |", "|---|---|---|---|---|"]
    lb = {l["layer"]: l for l in rt_base["layers"]}
    for l in rt["layers"] + [dict(rt["pooled"], layer="all")]:
        b = lb.get(l["layer"], dict(rt_base["pooled"], layer="all") if l["layer"] == "all" else None)
        ch = l["changed"] / max(1, l["neighbours"])
        chb = b["changed"] / max(1, b["neighbours"])
        lines.append("| %s | %d (%d) | %.3f (%.3f) | %.2f (%.2f) | %.1f %% (%.1f %%) |" % (
            l["layer"], l["unused"], b["unused"], l["entropy_norm"], b["entropy_norm"], l["max_over_mean"],
            b["max_over_mean"], 100 * ch, 100 * chb))
    lines += ["", "Greedy samples (`deltafin run --model %s --max-new 48`, with `--chat` or `--chat --no-think`; "
              "the answer only):" % os.path.relpath(model, ROOT), ""]
    for kind, prompt, out in smp:
        flag = {"chat": "--chat", "chat_nothink": "--chat --no-think", "raw": "raw"}[kind]
        shown = " ".join(out.split())
        lines.append("    %-18s %-34s %s" % (flag, json.dumps(prompt), shown[:110] + (" ..." if len(shown) > 110 else "")))
    lines.append("<!-- card:end -->")
    return "\n".join(lines) + "\n"


def draft_block(model, draft, acc):
    lines = ["<!-- card-draft:begin -->",
             "Measured by `/usr/bin/python3 tools/train/model_card.py %s`: the drafter `%s` in real speculative "
             "decoding against `%s` (`bench/spec_accept.sh %s %s`: greedy, 64 new tokens, drafts forced with "
             "`--draft-k`, ids checked against drafts off; chat answers with thinking on, and raw code):" % (
                 " ".join(sys.argv[1:]), os.path.relpath(draft, ROOT), os.path.relpath(model, ROOT),
                 os.path.relpath(model, ROOT), os.path.relpath(draft, ROOT)), ""]
    lines += ["    " + a for a in acc]
    lines.append("<!-- card-draft:end -->")
    return "\n".join(lines) + "\n"


def write_block(path, block, tag):
    text = open(path).read() if os.path.exists(path) else ""
    b, e = text.find("<!-- %s:begin -->" % tag), text.find("<!-- %s:end -->" % tag)
    if b >= 0 and e > b:
        text = text[:b] + block + text[e + len("<!-- %s:end -->\n" % tag):]
    else:
        text = text + ("\n" if text and not text.endswith("\n") else "") + block
    tmp = path + ".tmp"
    open(tmp, "w").write(text)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--tool-n", type=int, default=200, help="tool-call cases (each API)")
    ap.add_argument("--tool-skip", type=int, default=100,
                    help="skip the first K tool cases: cases 1-100 of seed 3838 chose among training exports up to "
                         "stage Q, so the card measures on cases the choice never saw")
    ap.add_argument("--long", type=int, default=0, help="cases of the long-context sum (about 25 s each)")
    ap.add_argument("--deltafin", default=os.path.join(ROOT, "build", "deltafin"))
    ap.add_argument("--heldout", default=os.path.join(ROOT, "build", "train38", "heldout.txt"))
    ap.add_argument("--base", default=os.path.join(ROOT, "models", "k3-mini"), help="the model compared against")
    ap.add_argument("--base-commit", default="", help="compare against models/k3-mini as committed at this revision")
    ap.add_argument("--draft", default="", help="a draft model: its acceptance against --model (bench/spec_accept.sh), "
                    "written between <!-- card-draft:begin --> and <!-- card-draft:end -->")
    ap.add_argument("--draft-only", action="store_true", help="measure and write only the drafter's block")
    ap.add_argument("--snapshot", default="", help="the training record (default: MODEL/snapshot.json)")
    ap.add_argument("--card", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.draft_only:
        if not a.draft:
            raise SystemExit("--draft-only needs --draft DIR")
        blk = draft_block(a.model, a.draft, acceptance(a.model, a.draft))
        print(blk)
        if a.card:
            write_block(a.card, blk, "card-draft")
        return
    if not os.path.exists(a.heldout):
        raise SystemExit("%s is missing: run tools/train/corpus/build38.sh" % a.heldout)
    base, base_name = a.base, "the shipped model"
    if a.base_commit:
        base = base_from_commit(a.base_commit)
        base_name = "models/k3-mini at %s" % os.path.basename(base)[len("card-base-"):]
    sk = skills(a.model, a.n, a.long, a.deltafin, a.tool_n, a.tool_skip)
    with tempfile.TemporaryDirectory() as tmp:
        ta, tb = os.path.join(tmp, "model.trace"), os.path.join(tmp, "base.trace")
        ppl, ppl_base = perplexity(a.deltafin, a.model, a.heldout, ta), perplexity(a.deltafin, base, a.heldout, tb)
        rt, rt_base = routing(a.deltafin, ta), routing(a.deltafin, tb)
    smp = samples(a.deltafin, a.model)
    acc = acceptance(a.model, a.draft) if a.draft else []
    sp = a.snapshot or os.path.join(a.model, "snapshot.json")
    snap = json.load(open(sp)) if os.path.exists(sp) else {}
    t = table(a.model, sk, ppl, ppl_base, snap, base_name, rt, rt_base, smp)
    print(t)
    blk = draft_block(a.model, a.draft, acc) if a.draft else ""
    if blk:
        print(blk)
    if a.json:
        json.dump({"skills": {k: {kk: vv for kk, vv in v.items() if kk != "cases"} if isinstance(v, dict) else v
                              for k, v in sk.items()},
                   "perplexity": ppl, "base_perplexity": ppl_base, "routing": rt, "base_routing": rt_base,
                   "samples": smp, "acceptance": acc, "snapshot": snap}, open(a.json, "w"), indent=1)
    if a.card:
        write_block(a.card, t, "card")
        if blk:
            write_block(a.card, blk, "card-draft")

if __name__ == "__main__":
    main()
