#!/usr/bin/python3
"""corpus_ids --recut-values on the committed model's tokenizer (a few seconds; `make skills-test` runs it).

A tool call's string value that the user wrote after a space must come out in the message's pieces (the first
piece without its space, then the message's other pieces), the text unchanged, and every other id exactly what
the canonical rendering gives; a value the conversation never wrote after a space keeps its canonical cut.  The
conversation has the call, the tool's result and the answer, so corpus_ids' own prefix check over the mask's
sub-renderings runs on recut values too.  The expected ids come from `deltafin tokenize`, not from this file.

  /usr/bin/python3 tests/skills/corpus_ids_test.py --corpus-ids build/corpus_ids --deltafin build/deltafin
"""
import argparse
import array
import json
import os
import subprocess
import sys
import tempfile

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "k3-mini")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from unit import check, finish  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus-ids", default="build/corpus_ids")
    ap.add_argument("--deltafin", default="build/deltafin")
    a = ap.parse_args()

    def tok(s):
        r = subprocess.run([a.deltafin, "tokenize", "--model", MODEL, s], capture_output=True, text=True, check=True)
        return [int(x) for x in r.stdout.replace(",", " ").split()]

    def detok(ids):
        r = subprocess.run([a.deltafin, "tokenize", "--model", MODEL, "--decode", ",".join(map(str, ids))],
                           capture_output=True, text=True, check=True)
        return r.stdout.rstrip("\n")

    word, other = "coffee", "Mbxq Pumu"
    canon, src = tok(word), tok(" " + word)
    want = tok(detok(src[:1]).lstrip(" ")) + src[1:]
    # the premise: BPE cuts the word differently after a space (else this test shows nothing)
    check(canon != want and detok(want) == word, "premise: %r cuts the same with and without its space" % word)

    tools = [{"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "where": {"type": "string"}},
        "required": ["query"]}}}]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"query": word, "where": other})}}
    rows = [{"text": "A line of prose about %s." % word},
            {"messages": [{"role": "user", "content": "Find me something about %s in mbxq pumu." % word},
                          {"role": "assistant", "content": "", "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "A hot drink made from roasted beans."},
                          {"role": "assistant", "content": "It says %s is a drink." % word}],
             "think": False, "tools": tools}]
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in.jsonl")
        with open(inp, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        out = {}
        for flag in ("", "--recut-values"):
            u16, mask = os.path.join(d, "a%s.u16" % flag), os.path.join(d, "a%s.mask" % flag)
            r = subprocess.run([a.corpus_ids, "--model", MODEL, "--in", inp, "--out", u16, "--mask", mask] +
                               ([flag] if flag else []), capture_output=True, text=True)
            check(r.returncode == 0, "corpus_ids %s: %s" % (flag, r.stderr.strip()))
            ids = array.array("H")
            with open(u16, "rb") as f:
                ids.frombytes(f.read())
            if sys.byteorder != "little":
                ids.byteswap()
            m = open(mask, "rb").read()
            out[flag] = (list(ids), m, r.stdout)
        base, rec = out[""][0], out["--recut-values"][0]
        # the call's value: the canonical cut's occurrence inside the call, i.e. not the prose / message ones
        at = [i for i in range(len(base) - len(canon) + 1) if base[i:i + len(canon)] == canon]
        check(len(at) == 1, "the canonical cut of %r occurs once (in the call), found %d" % (word, len(at)))
        if at:
            i = at[0]
            expect = base[:i] + want + base[i + len(canon):]
            check(rec == expect, "recut ids = canonical ids with the value's pieces replaced")
            check(detok(rec) == detok(base), "the recut rendering decodes to the same text")
            mb, mr = out[""][1], out["--recut-values"][1]
            check(len(mr) == len(rec) and mr[i:i + len(want)] == b"\x01" * len(want),
                  "the recut value's ids are in the mask")
            check(mr[:i] == mb[:i] and mr[i + len(want):] == mb[i + len(canon):], "the rest of the mask is unchanged")
        o = tok(other)
        count = lambda ids: sum(ids[k:k + len(o)] == o for k in range(len(ids)))
        check(count(base) >= 1 and count(rec) == count(base),
              "a value never written after a space (%r) keeps its canonical cut" % other)
        # 2 string values in each of the 4 renderings that hold the call (the whole row; the call's reply through
        # it; the answer's prompt and the answer's reply through it); the spaced one is recut in each
        check("of 8 string argument values, 4 written with the message's pieces (4 of them differ" in
              out["--recut-values"][2], "corpus_ids reports the recut: " + out["--recut-values"][2])
    finish()


if __name__ == "__main__":
    main()
