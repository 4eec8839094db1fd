#!/usr/bin/python3
"""Extra tool-call conversations for issue 38's tools stage (deterministic, seed 38041).

The first curriculum stages taught the model the call markup, but not to copy: held-out requests
got a well-formed call to a tool name it had memorised (`get_weather` when the request offered
`lookup_weather`) with an argument it had memorised (`Munich` when the user asked about Rome).
With a few dozen cities and four names per tool, memorising is as good as copying on the
training rows. These rows make it worse than copying:

  * the values are drawn from pools far wider than make_corpus38's (made-up place names, folder
    and file names, tickers, topics and addresses built from syllables and words), so a value
    can only come from the request;
  * half the rows rename the offered tools and their argument keys (a synonym, a prefix, a
    suffix), consistently in the tool list and in the call, so the name and the keys can only
    come from the schema;
  * the result and the answer are make_corpus38's, so answering from the tool's result stays
    trained.

Only training phrasings are used (make_corpus38.split_asks); held-out phrasings, pairs and the
evaluation's tool lists are untouched (check_heldout38.py checks the output). The evaluation
(eval_skills.py) still uses make_corpus38's own pools and names.

  /usr/bin/python3 tools/train/corpus/tools38.py OUT.jsonl [--n 30000]
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus38 as m38  # noqa: E402

SYL = ["ka", "lo", "ver", "min", "to", "ra", "del", "sa", "bri", "mon", "tal", "ne", "gor", "vi", "lan", "do",
       "ser", "pa", "qui", "nor", "el", "ast", "ber", "cu", "fen", "hol", "jo", "mar", "os", "ul", "zen", "wi"]
WORDS = ["alpha", "river", "stone", "green", "paper", "cloud", "north", "sun", "iron", "glass", "maple", "fox",
         "orbit", "delta", "ember", "harbor", "pixel", "quartz", "raven", "signal", "timber", "violet", "winter",
         "atlas", "beacon", "cedar", "dune", "falcon", "garden", "meadow", "nectar", "oak", "pepper", "summit"]
NOUNS = ["gardens", "rivers", "ancient Egypt", "glaciers", "the Roman army", "honey bees", "steam engines",
         "the violin", "coral reefs", "the Silk Road", "comets", "origami", "the Vikings", "deserts", "sourdough",
         "lighthouses", "the piano", "owls", "tides", "bridges", "typewriters", "the Nile", "maple syrup"]
ADJ = ["the history of", "how to grow", "facts about", "the science of", "a guide to", "the best", "cheap",
       "famous", "the origin of", "recipes with"]
CURR_MORE = ["BRL", "ZAR", "KRW", "SGD", "HKD", "NZD", "PLN", "CZK", "DKK", "TRY", "THB", "ILS", "HUF", "AED"]
DOMAINS = ["example.com", "example.org", "example.net", "mail.test", "corp.example"]

NAME_WORDS = {
    "weather": ["weather", "forecast", "wx", "conditions", "climate"],
    "list_files": ["files", "dir", "directory", "folder", "listing"],
    "read_file": ["file", "contents", "text", "document", "read"],
    "get_time": ["time", "clock", "local_time", "hour", "timezone"],
    "search_web": ["search", "web", "lookup", "query", "find"],
    "send_email": ["email", "mail", "message", "send", "notify"],
    "convert_currency": ["currency", "fx", "exchange", "convert", "money"],
    "stock_price": ["stock", "quote", "ticker", "price", "shares"],
}
KEY_WORDS = ["value", "input", "name", "target", "arg", "text", "item", "param", "key", "term", "spec", "what"]


def place(rng):
    s = "".join(rng.choice(SYL) for _ in range(rng.choice([2, 2, 3])))
    s = s[0].upper() + s[1:]
    if rng.random() < 0.15:
        s += " " + rng.choice(["City", "Falls", "Bay", "Springs", "Harbor"])
    return s


def word(rng):
    return rng.choice(WORDS) if rng.random() < 0.6 else "".join(rng.choice(SYL) for _ in range(2))


def widen(rng):
    """rebind make_corpus38's value pools to wider ones (its tool_case reads them at call time)"""
    m38.CITIES = m38.CITIES + sorted({place(rng) for _ in range(600)})
    m38.TIMEZONE_CITIES = m38.CITIES
    m38.FOLDERS = m38.FOLDERS + sorted({word(rng) + rng.choice(["", "", "_" + word(rng), "/" + word(rng)])
                                        for _ in range(400)})
    m38.FILE_STEMS = m38.FILE_STEMS + sorted({word(rng) + rng.choice(["", "_" + word(rng), "-" + word(rng)])
                                              for _ in range(400)})
    m38.TICKERS = m38.TICKERS + sorted({"".join(chr(65 + rng.randrange(26)) for _ in range(rng.choice([3, 4])))
                                        for _ in range(300)})
    m38.CURRENCIES = m38.CURRENCIES + CURR_MORE
    m38.TOPICS = m38.TOPICS + sorted({rng.choice(ADJ) + " " + rng.choice(NOUNS) for _ in range(200)} |
                                     {rng.choice(NOUNS) for _ in range(30)})
    m38.PEOPLE = m38.PEOPLE + sorted({"%s%s@%s" % (word(rng), rng.choice(["", ".", "_"]) + word(rng)
                                                  if rng.random() < 0.4 else "", rng.choice(DOMAINS))
                                      for _ in range(300)})
    m38.SUBJECTS = m38.SUBJECTS + sorted({rng.choice(["Notes on", "About", "Re:", "Plans for", "Question about"])
                                          + " " + rng.choice(NOUNS + WORDS) for _ in range(200)})


def new_name(rng, kind):
    w = rng.choice(NAME_WORDS[kind])
    pre = rng.choice(["", "get_", "fetch_", "lookup_", "do_", "run_", "tool_", "my_"])
    suf = rng.choice(["", "", "_v2", "_now", "_tool", "_api", "2"])
    return pre + w + suf


def rename(rng, msgs, tools):
    """rename every offered tool and its argument keys, consistently in the list and the call"""
    call = msgs[1]["tool_calls"][0]["function"]
    taken = set()
    kind_of = {}
    for kind in m38.TOOL_KINDS:
        for n in m38.TOOLS[kind]["names"]:
            kind_of[n] = kind
    for t in tools:
        f = t["function"]
        old = f["name"]
        name = new_name(rng, kind_of.get(old, rng.choice(m38.TOOL_KINDS)))
        while name in taken:
            name += "_" + rng.choice(SYL)
        taken.add(name)
        keymap = {}
        for k in list(f["parameters"]["properties"]):
            nk = k if rng.random() < 0.5 else rng.choice(KEY_WORDS + [k + "_" + rng.choice(KEY_WORDS)])
            while nk in keymap.values():
                nk += "_" + rng.choice(SYL)
            keymap[k] = nk
        f["parameters"]["properties"] = {keymap[k]: v for k, v in f["parameters"]["properties"].items()}
        f["parameters"]["required"] = [keymap[k] for k in f["parameters"]["required"]]
        if old == call["name"]:
            call["name"] = name
            args = json.loads(call["arguments"])
            call["arguments"] = json.dumps({keymap[k]: v for k, v in args.items()}, ensure_ascii=False)
        f["name"] = name
    return msgs, tools


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=30000)
    ap.add_argument("--seed", type=int, default=38041)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    widen(rng)
    n = {"tool": 0, "renamed": 0}
    with open(a.out, "w", encoding="utf-8") as g:
        for i in range(a.n):
            think = rng.random() < 0.5
            msgs, tools, _ = m38.tool_conv(rng, None)
            if rng.random() < 0.5:
                msgs, tools = rename(rng, msgs, tools)
                n["renamed"] += 1
            g.write(json.dumps({"messages": msgs, "think": think, "tools": tools}, ensure_ascii=False) + "\n")
            n["tool"] += 1
    print("tools38:", json.dumps(n))


if __name__ == "__main__":
    main()
