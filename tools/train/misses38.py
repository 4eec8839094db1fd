#!/usr/bin/python3
"""The tool-call misses of an eval_skills.py --json file, by kind (issue 38's stage tables):
value = the right tool with a wrong argument value, tool = a wrong tool or no call, answer = a right call and
an answer without the result's facts; each miss counted once.  With -v, every value miss (want / got).

  /usr/bin/python3 tools/train/misses38.py EVAL.json [-v]
"""
import json
import sys


def main():
    r = json.load(open(sys.argv[1]))
    for task in ("tool", "tool_anthropic"):
        if task not in r:
            continue
        n = {"value": 0, "tool": 0, "answer": 0}
        vals = []
        for c in r[task]["cases"]:
            if c["ok"]:
                continue
            if c["call_ok"]:
                n["answer"] += 1
            elif c["got"][0] == c["want"][0]:
                n["value"] += 1
                vals.append((c["want"][1], c["got"][1]))
            else:
                n["tool"] += 1
        print("%-15s misses: value %d / tool %d / answer %d" % (task, n["value"], n["tool"], n["answer"]))
        if "-v" in sys.argv:
            for w, g in vals:
                print("    want %s got %s" % (json.dumps(w), json.dumps(g)))


if __name__ == "__main__":
    main()
