#!/usr/bin/python3
"""Tool-call argument values by how their pieces line up with the user's message, and how often each kind
is right in an eval_skills.py result (--json FILE of a run with the tool / tool_anthropic tasks).

A value the user wrote after a space ("Find me something about coffee.") is tokenized there with the space in
its first piece: " coffee" -> [ co][ff][ee].  The call writes it after a quote, "coffee" -> [c][off][ee].  The
first piece always differs (the space); this script asks whether the rest does too.  Where the rest is the
same, the model writes the value by spelling one piece and copying the others; where it differs, the whole
word has to be cut anew.  It also counts the values whose message-side first piece (" co") has a space-less
twin in the vocabulary ("co").  A second line splits the values by the cut the call needs: the twin of the
message's first piece then a copy of the rest; the first piece spelled in 2+ pieces then a copy; or a cut that
differs from both (the only kind corpus_ids --recut-values rewrites).  Run from the repository root (it needs
build/deltafin):

  /usr/bin/python3 tools/train/value_pieces.py --model models/k3-mini build/eval/card-skills.json
"""
import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="eval_skills.py --json files")
    ap.add_argument("--model", default="models/k3-mini", help="the model folder whose tokenizer to use")
    ap.add_argument("--deltafin", default="build/deltafin")
    a = ap.parse_args()
    cache = {}  # text -> ids and id -> text: values and first pieces repeat across cases

    def tok(s):
        if s not in cache:
            r = subprocess.run([a.deltafin, "tokenize", "--model", a.model, s], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit("value_pieces: deltafin tokenize failed: " + r.stderr.strip())
            cache[s] = [int(x) for x in r.stdout.replace(",", " ").split()]
        return cache[s]

    def decode(i):
        if i in cache:
            return cache[i]
        r = subprocess.run([a.deltafin, "tokenize", "--model", a.model, "--decode", str(i)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            sys.exit("value_pieces: deltafin tokenize --decode failed: " + r.stderr.strip())
        cache[i] = r.stdout.rstrip("\n")
        return cache[i]

    for path in a.results:
        try:
            d = json.load(open(path))
        except (OSError, ValueError) as e:
            sys.exit("value_pieces: %s: %s" % (path, e))
        for task in ("tool", "tool_anthropic"):
            if task not in d:
                continue
            tab = {"rest equal": [0, 0], "rest differs": [0, 0]}
            # the cut the call needs, against "the first piece's twin, then a copy" (corpus_ids --recut-values)
            kinds = {"twin + copy": [0, 0], "first spelled + copy": [0, 0], "cut differs": [0, 0]}
            twins = 0  # values whose message-side first piece has a one-piece twin without the space
            for c in d[task]["cases"]:
                want_name, want = c["want"]
                got_name, got = c["got"]
                for k, v in want.items():
                    # only string values the user wrote after a space (or first): the copy case
                    if not isinstance(v, str) or (" " + v) not in (" " + c["user"]):
                        continue
                    call = tok('"' + v + '"')[1:-1]   # as the call writes it, after the quote
                    src = tok(" " + v)                # as the message has it, after a space
                    key = "rest equal" if call[1:] == src[1:] else "rest differs"
                    first = decode(src[0])
                    twins += first.startswith(" ") and len(tok(first[1:])) == 1
                    right = got_name == want_name and isinstance(got, dict) and got.get(k) == v
                    tab[key][0] += right
                    tab[key][1] += 1
                    if first.startswith(" "):
                        head = tok(first[1:]) if len(first) > 1 else []
                        kind = ("cut differs" if head + src[1:] != call else
                                "twin + copy" if len(head) == 1 else "first spelled + copy")
                        kinds[kind][0] += right
                        kinds[kind][1] += 1
            print("%s %s: " % (path, task) + ", ".join(
                "%s %d / %d right" % (key, r, n) for key, (r, n) in tab.items()) +
                "; first piece has a space-less twin: %d of %d" % (twins, sum(n for _, n in tab.values())))
            print("%s %s: " % (path, task) + ", ".join("%s %d / %d right" % (key, r, n) for key, (r, n) in kinds.items()))


if __name__ == "__main__":
    main()
