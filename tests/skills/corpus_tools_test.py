#!/usr/bin/python3
"""Stage X's corpus tools (a few seconds; `make skills-test` runs it).

codenames38.py: a list_files answer after either result form (JSON object, one name per line) is
rewritten with its names as code, and then each name's ids in the answer are exactly its ids in the
result (the property the rewrite exists for; the ids come from `deltafin tokenize`, and the test first
checks the premise that the plain answer's ids differ); any other row passes through byte for byte.
asks38.py: thousands of phrasings per kind, every one with its kind's slots, none near a held-out
phrasing and none that check_heldout38.py's patterns flag.

  /usr/bin/python3 tests/skills/corpus_tools_test.py --deltafin build/deltafin
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODEL = os.path.join(ROOT, "models", "k3-mini")
CORPUS = os.path.join(ROOT, "tools", "train", "corpus")
sys.path.insert(0, CORPUS)
import asks38  # noqa: E402
import check_heldout38  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from unit import check, finish  # noqa: E402


def contains(hay, needle):
    return any(hay[i:i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deltafin", default="build/deltafin")
    a = ap.parse_args()

    def tok(s):
        r = subprocess.run([a.deltafin, "tokenize", "--model", MODEL, s], capture_output=True, text=True, check=True)
        return [int(x) for x in r.stdout.replace(",", " ").split()]

    names = ["api.txt", "test_main.txt", "coffee.md"]
    res_json = json.dumps({"path": "docs", "files": names})
    res_lines = "\n".join(names)
    plain = "The docs folder contains 3 files: api.txt, test_main.txt and coffee.md."

    def conv(res, ans):
        return {"messages": [
            {"role": "user", "content": "List the files in docs."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "list_files", "arguments": json.dumps({"path": "docs"})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": res},
            {"role": "assistant", "content": ans}], "think": False}

    other = {"messages": [{"role": "user", "content": "Read a.txt"},
                          {"role": "tool", "tool_call_id": "c", "content": "hello there"},
                          {"role": "assistant", "content": "It says: api.txt, b.txt and c.txt."}]}
    prose = {"text": "The docs folder contains 3 files: api.txt, test_main.txt and coffee.md."}
    single = conv("notes.txt", "In docs there is one file: notes.txt.")
    rows = [conv(res_json, plain), conv(res_lines, "In docs there are 3 files: api.txt, test_main.txt and coffee.md."),
            other, prose, single, conv(res_json, "Something else entirely.")]
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(src, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        p = subprocess.run(["/usr/bin/python3", os.path.join(CORPUS, "codenames38.py"), src, dst],
                           capture_output=True, text=True)
        check(p.returncode == 0 and "3 list_files answers" in p.stdout, "codenames38 output: %r %r" % (p.stdout, p.stderr))
        src_lines = open(src, encoding="utf-8").read().splitlines()
        out_lines = open(dst, encoding="utf-8").read().splitlines()
    check(len(out_lines) == len(rows), "codenames38 keeps every row")
    out = [json.loads(x) for x in out_lines]
    want = "The docs folder contains 3 files: `api.txt`, `test_main.txt` and `coffee.md`."
    check(out[0]["messages"][3]["content"] == want, "JSON-result answer: %r" % out[0]["messages"][3]["content"])
    check(out[1]["messages"][3]["content"] ==
          "In docs there are 3 files: `api.txt`, `test_main.txt` and `coffee.md`.", "line-result answer")
    check(out[4]["messages"][3]["content"] == "In docs there is one file: `notes.txt`.", "one-file answer")
    for i in (2, 3, 5):
        check(out_lines[i] == src_lines[i], "row %d passes through unchanged" % i)
    check(out[0]["messages"][:3] == rows[0]["messages"][:3], "only the answer changes")

    # the property: every name's ids in the code answer are its ids in the result
    rj, rl, ans, pl = tok(res_json), tok(res_lines), tok(want), tok(plain)
    for n in names:
        bare = tok("\n" + n)[1:]  # the name's ids after a newline (no space before it)
        check(contains(rj, bare) and contains(rl, bare), "premise: %r is cut %r in both results" % (n, bare))
        check(contains(ans, bare), "the code answer holds %r's result ids" % n)
    check(not all(contains(pl, tok("\n" + n)[1:]) for n in names),
          "premise: the plain answer re-spells some name (else the rewrite shows nothing)")

    # asks38: many phrasings, the right slots, nothing near the held-out ones
    slots = {"weather": {"city"}, "get_time": {"city"}, "list_files": {"folder"}, "read_file": {"file"},
             "search_web": {"topic"}, "send_email": {"to", "subject"},
             "convert_currency": {"amount", "cur1", "cur2"}, "stock_price": {"ticker"}}
    held = json.load(open(os.path.join(CORPUS, "heldout38.json")))["tool_phrasings"]
    pats = check_heldout38.heldout_patterns(held)
    rng = random.Random(7)
    for kind, want_slots in slots.items():
        got = [asks38.grammar_ask(rng, kind) for _ in range(600)]
        check(len(set(got)) >= 150, "%s: only %d distinct phrasings in 600" % (kind, len(set(got))))
        bad = [g for g in got if set(re.findall(r"\{([a-z0-9]+)\}", g)) != want_slots]
        check(not bad, "%s: phrasings with the wrong slots: %r" % (kind, bad[:3]))
        leak = [g for g in got if any(p.match(g) for p in pats)]
        check(not leak, "%s: phrasings check_heldout38 flags: %r" % (kind, leak[:3]))
        near = [g for g in got if asks38.near_heldout(kind, g)]
        check(not near, "%s: phrasings near a held-out one: %r" % (kind, near[:3]))
        check(not any(g in held[kind] for g in got), "%s: a held-out phrasing itself" % kind)
    # near_heldout itself: a held-out phrasing, its contraction and a one-word edit are near; a far one is not
    check(asks38.near_heldout("list_files", held["list_files"][0]), "a held-out phrasing is near itself")
    check(asks38.near_heldout("weather", "How is the weather in {city} today?"), "contraction expanded is near")
    check(not asks38.near_heldout("weather", "Tell me the forecast for {city}."), "a far phrasing is not near")

    finish()


if __name__ == "__main__":
    main()
