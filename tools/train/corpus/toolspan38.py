#!/usr/bin/python3
"""Tool conversations with random made-up argument values (issue 38, stage H; deterministic, seed 38051).

tools38.py (stage D) drew values from wider but fixed pools (a few hundred places, tickers, files); the
model still copies values only in part (`GOG` for GOOG, `tml/notes.html` for scripts/notes.html, a
leading space). Here every row gets fresh values: random letter strings (mixed case, digits, dots,
dashes, underscores, slashes), so a value is never memorised and its ids (after a space in the request,
without it inside the JSON string) can only come from the request. The structure (offered tools,
phrasings, call markup, result, answer) is make_corpus38's tool_conv; half the rows rename the tools
and keys as tools38.py does.

Only training phrasings are used (make_corpus38.split_asks); held-out phrasings, pairs and the
evaluation's tool lists are untouched (check_heldout38.py checks the output).

  /usr/bin/python3 tools/train/corpus/toolspan38.py OUT.jsonl [--n 20000] [--seed 38051] [--one-word-frac 0]
      [--tail-frac 0] [--multi-frac 0]

Stage J (both off by default; with both at 0 the rows are byte-identical to before):
* --tail-frac F: with probability F the request is one of TAIL_ASKS (training-only phrasings in which
  ordinary words FOLLOW the value: "What is the weather like in {city} today?", "How are {ticker} shares
  doing this week?", "I am flying to {city}. How is the weather?"), so the call must end the value at a
  word boundary before a known word (stage I's run-ons: `Beijing today`, `GOOG doing`, `Osaka. What`);
* --multi-frac F: with probability F the row offers 2 or 3 tools (else 1-3 as make_corpus38 draws), so
  more rows need the tool picked from the request (stage I: wrong tool / no call 4 -> 10 of 100).
"""
import argparse
import json
import os
import random
import string
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus38 as m38  # noqa: E402
import tools38  # noqa: E402

LOW, UP, DIG = string.ascii_lowercase, string.ascii_uppercase, string.digits
CV_C, CV_V = "bcdfghjklmnprstvwz", "aeiou"


def rword(rng, lo=2, hi=9):
    """a random word: letters (sometimes pronounceable), sometimes with digits"""
    n = rng.randint(lo, hi)
    r = rng.random()
    if r < 0.4:
        s = "".join(rng.choice(CV_C) + rng.choice(CV_V) for _ in range((n + 1) // 2))[:n]
    elif r < 0.8:
        s = "".join(rng.choice(LOW) for _ in range(n))
    else:
        s = "".join(rng.choice(LOW + DIG) for _ in range(n))
    return s


def rplace(rng):
    s = rword(rng, 3, 10)
    s = s[0].upper() + s[1:] if rng.random() < 0.85 else s
    if rng.random() < 0.2:
        w = rword(rng, 2, 7)
        s += " " + w[0].upper() + w[1:]
    return s


def rname(rng):
    """folder / file stem: word, word_word, word-word, word.word, CamelWord"""
    s = rword(rng)
    r = rng.random()
    if r < 0.25:
        s += rng.choice("_-.") + rword(rng, 2, 7)
    elif r < 0.35:
        s = s[0].upper() + s[1:]
    return s


def rfolder(rng):
    s = rname(rng)
    if rng.random() < 0.3:
        s += "/" + rname(rng)
    return s


def rcode(rng, lo, hi):
    return "".join(rng.choice(UP) for _ in range(rng.randint(lo, hi)))


def remail(rng):
    dom = rword(rng, 3, 8) + "." + rng.choice(["com", "org", "net", "io", "test", "example", "dev"])
    local = rword(rng, 2, 8) + (rng.choice("._") + rword(rng, 2, 6) if rng.random() < 0.4 else "")
    return local + "@" + dom


def rphrase(rng, lo, hi):
    return " ".join(rword(rng, 2, 8) if rng.random() < 0.7 else rng.choice(tools38.WORDS)
                    for _ in range(rng.randint(lo, hi)))


def rebind(rng, one_word=0.0):
    """fresh one-row value pools for make_corpus38.tool_case; with probability one_word (stage I,
    --one-word-frac) the row's place, topic and subject are ONE word (no extra draw when it is 0)"""
    if one_word > 0 and rng.random() < one_word:
        w = rword(rng, 3, 10)
        m38.CITIES = [w[0].upper() + w[1:] if rng.random() < 0.85 else w]
        m38.TIMEZONE_CITIES = m38.CITIES
        m38.FOLDERS = [rname(rng)]
        m38.FILE_STEMS = [rname(rng) for _ in range(5)]
        m38.TICKERS = [rcode(rng, 2, 5)]
        c1 = rcode(rng, 3, 3)
        c2 = rcode(rng, 3, 3)
        while c2 == c1:
            c2 = rcode(rng, 3, 3)
        m38.CURRENCIES = [c1, c2]
        m38.TOPICS = [rphrase(rng, 1, 1)]
        m38.PEOPLE = [remail(rng)]
        w = rphrase(rng, 1, 1)
        m38.SUBJECTS = [w[0].upper() + w[1:]]
        return
    m38.CITIES = [rplace(rng)]
    m38.TIMEZONE_CITIES = m38.CITIES
    m38.FOLDERS = [rfolder(rng)]
    m38.FILE_STEMS = [rname(rng) for _ in range(5)]
    m38.TICKERS = [rcode(rng, 2, 5)]
    c1 = rcode(rng, 3, 3)
    c2 = rcode(rng, 3, 3)
    while c2 == c1:
        c2 = rcode(rng, 3, 3)
    m38.CURRENCIES = [c1, c2]
    m38.TOPICS = [rphrase(rng, 1, 4)]
    m38.PEOPLE = [remail(rng)]
    w = rphrase(rng, 1, 4)
    m38.SUBJECTS = [w[0].upper() + w[1:]]


# Stage J (--tail-frac): training phrasings with words after the value. None matches a held-out phrasing of
# heldout38.json (check_heldout38.py checks the rows).
TAIL_ASKS = {
    "weather": ["What is the weather like in {city} today?", "Is it cold in {city} this morning?",
                "Tell me the weather in {city} tonight.", "What's the forecast for {city} this week?",
                "Is it sunny in {city} at the moment?", "Weather in {city} now, please.",
                "I am flying to {city}. How is the weather?", "I live in {city}. Is it raining?",
                "How warm is {city} these days?", "Check the weather in {city} before I go."],
    "get_time": ["What time is it in {city} right now?", "Tell me the time in {city} please.",
                 "What is the local time in {city} today?", "I have a call with {city}. What time is it there?",
                 "Is it late in {city} now?", "How late is it in {city} at the moment?",
                 "Give me the time in {city} so I can call.", "What hour is it in {city} this evening?"],
    "list_files": ["List the files in {folder} please.", "What files does {folder} have now?",
                   "Show me what {folder} contains today.", "Open {folder} and list the files.",
                   "Which files are in {folder} at the moment?", "I need the files in {folder}. List them."],
    "read_file": ["Read {file} for me please.", "What does {file} contain now?",
                  "Show me {file} so I can check it.", "Open {file}. What does it say?",
                  "Print {file} to the chat please.", "What is written in {file} today?"],
    "search_web": ["Search for {topic} please.", "Look up {topic} for me.", "Find pages about {topic} today.",
                   "Search the web for {topic} and tell me the top result.",
                   "I need {topic}. Can you search?", "Find {topic} on the internet now."],
    "send_email": ["Email {to} now with the subject {subject}.", "Send {to} an email today, subject: {subject}.",
                   "Write to {to} please, the subject is {subject}.", "Mail {to} for me with subject {subject}."],
    "convert_currency": ["Convert {amount} {cur1} to {cur2} for me.", "How much is {amount} {cur1} in {cur2} today?",
                         "Change {amount} {cur1} to {cur2} now please.",
                         "What would {amount} {cur1} be in {cur2} at the current rate?",
                         "I have {amount} {cur1}. How much is that in {cur2}?"],
    "stock_price": ["How are {ticker} shares doing this week?", "What is {ticker} trading at today?",
                    "Is {ticker} up or down today?", "Tell me the price of {ticker} now.",
                    "What is {ticker} worth at the moment?", "I own {ticker}. What is the price?",
                    "Check {ticker} for me please."],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=38051)
    ap.add_argument("--one-word-frac", type=float, default=0.0,
                    help="share of rows whose place / topic / subject / folder is one word (stage I: 0.6; "
                         "0 = the stage-H rows exactly)")
    ap.add_argument("--tail-frac", type=float, default=0.0,
                    help="share of rows asked with a TAIL_ASKS phrasing (words after the value; stage J)")
    ap.add_argument("--multi-frac", type=float, default=0.0,
                    help="share of rows offering 2-3 tools (stage J); 0 = make_corpus38's 1-3 draw only")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    n = {"tool": 0, "renamed": 0}
    with open(a.out, "w", encoding="utf-8") as g:
        for i in range(a.n):
            think = rng.random() < 0.5
            rebind(rng, a.one_word_frac)
            if a.tail_frac > 0 or a.multi_frac > 0:
                kind = rng.choice(m38.TOOL_KINDS)
                n_tools = rng.choice([2, 3]) if a.multi_frac > 0 and rng.random() < a.multi_frac else None
                tail = a.tail_frac > 0 and rng.random() < a.tail_frac
                saved = m38.TOOLS[kind]["asks"]
                if tail:
                    m38.TOOLS[kind]["asks"] = TAIL_ASKS[kind]
                    n["tail"] = n.get("tail", 0) + 1
                try:
                    msgs, tools, _ = m38.tool_conv(rng, None, n_tools=n_tools, kind=kind)
                finally:
                    m38.TOOLS[kind]["asks"] = saved
                n["offered_%d" % len(tools)] = n.get("offered_%d" % len(tools), 0) + 1
            else:
                msgs, tools, _ = m38.tool_conv(rng, None)
            if rng.random() < 0.5:
                msgs, tools = tools38.rename(rng, msgs, tools)
                n["renamed"] += 1
            g.write(json.dumps({"messages": msgs, "think": think, "tools": tools}, ensure_ascii=False) + "\n")
            n["tool"] += 1
    print("toolspan38:", json.dumps(n))


if __name__ == "__main__":
    main()
