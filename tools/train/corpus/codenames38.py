#!/usr/bin/python3
"""Write the file names of list_files answers as code (stage X; deterministic, no randomness).

A list_files result holds its file names inside JSON quotes or one per line, where this tokenizer cuts a
name with no leading space (`"api.txt"` -> `"` `ap` `i` `.t` `xt`); the answer wrote them after a space
(` a` `p` `i` `.t` `xt`), so every name had to be re-spelled across the space boundary, the step this
4,096-id tokenizer makes hard (issue 38: stage R answers 0 of 13 held-out list_files cases right, the
names garbled: `LICENSE.js.js`, `qfig.yaml`). Written as code, `` `api.txt` `` is cut `` ` ` `` then the
same pieces as in the result, so the answer is an exact copy of the result's ids, the copy the model does
well. The answer's text still holds every name (eval_skills.py's facts_ok is unchanged) and is what a
careful assistant writes anyway.

Reads a conversation JSONL (corpus rows: {"messages": [...], ...}; other rows pass through unchanged) and
rewrites each assistant reply that follows a tool message whose content is a file list (make_corpus38's
two forms: {"path": ..., "files": [...]} or one name per line) and contains that list as make_corpus38
writes it (`a, b and c` after ": "). Prints how many answers it rewrote.

  /usr/bin/python3 tools/train/corpus/codenames38.py IN.jsonl OUT.jsonl
"""
import json
import sys


def file_names(content):
    """-> the file names of a list_files result, or None"""
    try:
        r = json.loads(content)
    except ValueError:
        r = None
    if isinstance(r, dict) and isinstance(r.get("files"), list) and set(r) == {"path", "files"}:
        names = r["files"]
    elif r is None and content and "\n" not in content.strip("\n") and "." in content and " " not in content:
        names = [content]
    elif r is None and "\n" in content and " " not in content:
        names = content.split("\n")
    else:
        return None
    if not names or not all(isinstance(x, str) and x and " " not in x for x in names):
        return None
    return names


def joined(names, quote):
    q = [quote + x + quote for x in names]
    return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " and " + q[-1]


def rewrite(messages):
    """rewrite the list_files answers of one conversation in place -> how many"""
    n = 0
    for i in range(1, len(messages)):
        m, prev = messages[i], messages[i - 1]
        if m.get("role") != "assistant" or prev.get("role") != "tool" or not isinstance(m.get("content"), str):
            continue
        names = file_names(prev.get("content") or "")
        if names is None:
            continue
        plain = ": " + joined(names, "") + "."
        if m["content"].endswith(plain):
            m["content"] = m["content"][:-len(plain)] + ": " + joined(names, "`") + "."
            n += 1
    return n


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: codenames38.py IN.jsonl OUT.jsonl")
    n = rows = 0
    with open(sys.argv[1], encoding="utf-8") as f, open(sys.argv[2], "w", encoding="utf-8") as g:
        for line in f:
            r = json.loads(line)
            if isinstance(r.get("messages"), list):
                k = rewrite(r["messages"])
                if k:
                    n += k
                    line = json.dumps(r, ensure_ascii=False) + "\n"
            rows += 1
            g.write(line)
    print("codenames38: %d rows, %d list_files answers written as code" % (rows, n))


if __name__ == "__main__":
    main()
