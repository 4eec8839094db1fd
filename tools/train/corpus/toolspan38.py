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
      [--tail-frac 0] [--multi-frac 0] [--vary-frac 0]

Stage J (both off by default; with both at 0 the rows are byte-identical to before):
* --tail-frac F: with probability F the request is one of TAIL_ASKS (training-only phrasings in which
  ordinary words FOLLOW the value: "What is the weather like in {city} today?", "How are {ticker} shares
  doing this week?", "I am flying to {city}. How is the weather?"), so the call must end the value at a
  word boundary before a known word (stage I's run-ons: `Beijing today`, `GOOG doing`, `Osaka. What`);
* --multi-frac F: with probability F the row offers 2 or 3 tools (else 1-3 as make_corpus38 draws), so
  more rows need the tool picked from the request (stage I: wrong tool / no call 4 -> 10 of 100).

Stage O (off by default; at 0 no extra draw, so the rows are byte-identical to before):
* --vary-frac F: with probability F the request is one of VARIED_ASKS (18-22 more training phrasings per kind,
  many without the kind's usual word), replacing the --tail-frac draw for that row.

Stage P (off by default; at 0 no extra draw, so the rows are byte-identical to before):
* --piece-word-frac F: with probability F the row's place, folder, file stems, topic and subject are
  words built from the tokenizer's own pieces: a space-led letter piece drawn uniformly from all of them
  (copy_span.spell_tables: ` Chi`, ` Man`; capitalised ones for places) and 0-2 lowercase pieces. The
  string value is tokenized without the space, and 78 % of the space-led pieces have no space-less twin,
  so the call must spell the first piece (` Man` -> `M` `an`): the held-out misses `Mila` for Manila and
  `Icago` for Chicago are that step. Random letter strings (the rows above) start with short pieces
  and rarely show it.

Stage X (off by default; at 0 no extra draw, so the rows are byte-identical to before):
* --grammar-frac F: with probability F the request is a phrasing from asks38.py's grammar (thousands per kind,
  none near a held-out one), replacing the --vary-frac / --tail-frac draws for that row.

Stage W (off by default; at 0 no extra draw, so the rows are byte-identical to before):
* --real-word-frac F: with probability F the row's place, folder, file stems, topic and subject are real
  English words from the training prose (--words-from, default build/train38/corpus/train.jsonl; half by
  frequency, half uniform over the distinct words). A real word after a space is often cut differently
  from the word alone (` coffee` = ` co` `ff` `ee`, `coffee` = `c` `off` `ee`), as a third of the held-out
  cases' values are; piece words and random letters almost never are (corpus_ids --recut-values counts
  4-10 % of the tool rows' values), so the rows had not taught that re-spelling.
  --real-hard P: a share P of those words is drawn from the words whose call is not a one-piece twin plus a
  copy (the first piece has no twin, or the word's own cut starts differently): 15 of the selection sample's
  85 one-word values and the ones it misses most.
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
import asks38  # noqa: E402
import tools38  # noqa: E402
sys.path.insert(0, os.path.dirname(HERE))
import copy_span  # noqa: E402

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


def rcodes(rng):
    """the row's ticker and its two different currencies"""
    m38.TICKERS = [rcode(rng, 2, 5)]
    c1 = rcode(rng, 3, 3)
    c2 = rcode(rng, 3, 3)
    while c2 == c1:
        c2 = rcode(rng, 3, 3)
    m38.CURRENCIES = [c1, c2]


def pword(rng, upper=False):
    """a word of tokenizer pieces: a space-led letter piece (capitalised ones if upper) + 0-2 lowercase ones"""
    start, low, _, toks = copy_span.spell_tables()
    if upper:
        start = [int(i) for i in start if toks[int(i)][1:2].isupper()]
    w = toks[int(rng.choice(list(start)))][1:].decode()
    for _ in range(rng.randint(0, 2)):
        w += toks[int(rng.choice(list(low)))].decode()
    return w


def rebind_pieces(rng):
    """stage P: the row's one-word values made of tokenizer pieces (pword)"""
    m38.CITIES = [pword(rng, True)]
    m38.TIMEZONE_CITIES = m38.CITIES
    m38.FOLDERS = [pword(rng)]
    m38.FILE_STEMS = [pword(rng) for _ in range(5)]
    rcodes(rng)
    m38.TOPICS = [pword(rng)]
    m38.PEOPLE = [remail(rng)]
    w = pword(rng)
    m38.SUBJECTS = [w[0].upper() + w[1:]]


_REAL = None


def real_words(path):
    """(occurrences, distinct) of the English words (3-12 letters, lowercased) in a corpus JSONL's prose rows"""
    global _REAL
    if _REAL is None:
        import re
        occ = []
        for line in open(path, encoding="utf-8"):
            r = json.loads(line)
            if "text" in r:
                occ += [w.lower() for w in re.findall(r"(?<![A-Za-z0-9_'])[A-Za-z][a-z]{2,11}(?![A-Za-z0-9_'])", r["text"])]
        if not occ:
            raise SystemExit("toolspan38: no prose words in %s" % path)
        _REAL = (occ, sorted(set(occ)))
    return _REAL


_HARD = {}


def hard_words(path, capital):
    """the distinct real words (capitalised or not) that the call cannot write as the one-piece twin of their
    space-led first piece plus a copy: the first piece has no twin, or the word's own cut does not start with it"""
    if capital not in _HARD:
        start, low, inv, toks = copy_span.spell_tables()
        out = []
        for w in real_words(path)[1]:
            b = (w[0].upper() + w[1:] if capital else w).encode()
            twin = inv.get(toks[int(copy_span.spell(b" " + b, inv)[0])][1:])
            if twin is None or copy_span.spell(b, inv)[0] != twin:
                out.append(b.decode())
        _HARD[capital] = out
    return _HARD[capital]


def rword_real(rng, path, hard=0.0, capital=False):
    """a real English word from the training prose: with probability hard one of hard_words(), else half the
    time by its frequency, half uniform over the words"""
    if hard > 0 and rng.random() < hard:
        return rng.choice(hard_words(path, capital))
    occ, distinct = real_words(path)
    w = rng.choice(occ) if rng.random() < 0.5 else rng.choice(distinct)
    return w[0].upper() + w[1:] if capital else w


def rebind_real(rng, path, hard=0.0):
    """stage W: the row's one-word values are real English words, a share hard of them words whose call is not
    a twin plus a copy (as coffee, drafts, AAPL, Amsterdam in the held-out cases)"""
    m38.CITIES = [rword_real(rng, path, hard, True)]
    m38.TIMEZONE_CITIES = m38.CITIES
    m38.FOLDERS = [rword_real(rng, path, hard)]
    m38.FILE_STEMS = [rword_real(rng, path, hard) for _ in range(5)]
    rcodes(rng)
    m38.TOPICS = [rword_real(rng, path, hard) if rng.random() < 0.6 else
                  " ".join(rword_real(rng, path) for _ in range(rng.randint(2, 3)))]
    m38.PEOPLE = [remail(rng)]
    m38.SUBJECTS = [rword_real(rng, path, hard, True)]


def rebind(rng, one_word=0.0):
    """fresh one-row value pools for make_corpus38.tool_case; with probability one_word (stage I,
    --one-word-frac) the row's place, topic and subject are ONE word (no extra draw when it is 0)"""
    if one_word > 0 and rng.random() < one_word:
        w = rword(rng, 3, 10)
        m38.CITIES = [w[0].upper() + w[1:] if rng.random() < 0.85 else w]
        m38.TIMEZONE_CITIES = m38.CITIES
        m38.FOLDERS = [rname(rng)]
        m38.FILE_STEMS = [rname(rng) for _ in range(5)]
        rcodes(rng)
        m38.TOPICS = [rphrase(rng, 1, 1)]
        m38.PEOPLE = [remail(rng)]
        w = rphrase(rng, 1, 1)
        m38.SUBJECTS = [w[0].upper() + w[1:]]
        return
    m38.CITIES = [rplace(rng)]
    m38.TIMEZONE_CITIES = m38.CITIES
    m38.FOLDERS = [rfolder(rng)]
    m38.FILE_STEMS = [rname(rng) for _ in range(5)]
    rcodes(rng)
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


# Stage O (--vary-frac): more varied training phrasings per kind, written for stage O without looking at the
# held-out phrasings (many without the kind's usual word: "Should I wear a coat in {city} today?", "Is it lunchtime
# in {city} yet?", "What's in {file}?" against "What's inside {folder}?"), so that the tool is picked from what
# the request asks for, not from one keyword (stage N: 8 of 100 held-out cases a wrong tool or no call).
# check_heldout38.py checks the rows.
VARIED_ASKS = {
    "weather": ["Should I wear a coat in {city} today?", "How hot is it in {city}?", "Any rain expected in {city}?",
                "Is {city} snowy right now?", "What are conditions like in {city}?",
                "Give me the current conditions for {city}.", "Temperature in {city}?", "{city} weather",
                "Could you find out whether it is warm in {city}?",
                "My friend is in {city}. Is it nice outside there?", "Is it a good day for a walk in {city}?",
                "How many degrees is it in {city}?", "What's it like outside in {city}?",
                "Tell me if it's windy in {city}.", "Planning a picnic in {city}. What's the sky doing?",
                "Is the sun out in {city}?", "Report the conditions in {city}.",
                "I'm heading out in {city}; will I need sunglasses?", "How chilly is {city}?",
                "Please look up the climate right now in {city}.", "Is it freezing in {city}?",
                "What should I expect outdoors in {city}?"],
    "get_time": ["What hour is it over in {city}?", "Is it morning or evening in {city}?",
                 "Would my colleague in {city} be awake now?", "Current time, {city}?", "{city} time",
                 "Can I phone someone in {city} without waking them?", "Find out what time {city} is on.",
                 "How far into the day is {city}?", "Is it lunchtime in {city} yet?", "Tell me the hour in {city}.",
                 "My sister lives in {city}. Is it night there?", "Look up the local hour for {city}.",
                 "Is it after midnight in {city}?", "What o'clock is it in {city}?",
                 "Are shops in {city} open at this hour?", "Get me {city}'s current time.",
                 "Is it too early to call {city}?", "How many hours into the day is it in {city}?",
                 "Has the working day started in {city}?", "Give me the exact hour and minute in {city}."],
    "list_files": ["What's inside {folder}?", "Show the contents of {folder}.", "Can you list {folder}?",
                   "Enumerate the files under {folder}.", "Which documents are stored in {folder}?",
                   "Give me a listing of {folder}.", "What's in the {folder} directory?",
                   "I forgot what I saved in {folder}. Can you check?", "Browse {folder} for me.",
                   "How many files are in {folder}, and what are they?", "Peek into {folder}.",
                   "Directory listing for {folder}, please.", "Name everything in {folder}.",
                   "Is there anything in {folder}?", "{folder}: what files?", "Let me see the folder {folder}.",
                   "What did I put in {folder}?", "Tell me what {folder} holds.",
                   "Scan {folder} and name what you find.", "What is stored under {folder}?"],
    "read_file": ["What's in {file}?", "Display the text of {file}.", "Can you open {file} and tell me what it says?",
                  "I need the contents of {file}.", "Load {file} and show it.", "Give me what {file} says.",
                  "Dump {file}.", "Let me see {file}.", "What is the text inside {file}?",
                  "Please fetch the contents of {file}.", "Summarise {file} for me.", "Have a look at {file}.",
                  "What did I write in {file}?", "{file} - show contents", "Quote {file} back to me.",
                  "Read out {file}.", "What does the file {file} say?", "I can't open {file}. What's in it?",
                  "Tell me the contents of {file}.", "Go through {file} and tell me what it says."],
    "search_web": ["What does the internet say about {topic}?", "Find me something on {topic}.", "Research {topic}.",
                   "Can you dig up information about {topic}?", "I'm curious about {topic}. Find a source.",
                   "Any articles on {topic}?", "Do a quick lookup on {topic}.", "Find a link about {topic}.",
                   "Browse for {topic}.", "What can you find online regarding {topic}?", "Query the web: {topic}.",
                   "Hunt down a page on {topic}.", "Who has written about {topic}? Search it.",
                   "Get me a good page about {topic}.", "Is there a guide to {topic} somewhere online?",
                   "Find out more about {topic}.", "{topic} - search", "Give me a source on {topic}."],
    "send_email": ["Drop {to} a line with the subject {subject}.", "Shoot an email to {to} titled {subject}.",
                   "Notify {to} by email: subject {subject}.",
                   "Compose a message to {to}, subject {subject}, and send it.",
                   "Let {to} know by mail. Subject: {subject}.", "Message {to} with the subject line {subject}.",
                   "Please send a mail titled {subject} to {to}.",
                   "Get an email out to {to}; the subject should be {subject}.",
                   "Contact {to} by email with subject {subject}.", "Fire off a note to {to} with subject {subject}.",
                   "Ping {to} by email, subject {subject}.", "New email: to {to}, subject {subject}.",
                   "Can you email {to}? Use the subject {subject}."],
    "convert_currency": ["{amount} {cur1} in {cur2}?",
                         "What's {amount} {cur1} worth in {cur2}?", "Turn {amount} {cur1} into {cur2}.",
                         "Price {amount} {cur1} in {cur2}.", "I'm paying {amount} {cur1}. What is that in {cur2}?",
                         "Rate check: {amount} {cur1} to {cur2}.", "Work out {amount} {cur1} in {cur2}.",
                         "Calculate {amount} {cur1} as {cur2}.", "{amount} {cur1} to {cur2}, please.",
                         "What would I get in {cur2} for {amount} {cur1}?", "Express {amount} {cur1} in {cur2}.",
                         "My bill is {amount} {cur1}. How much {cur2} is that?",
                         "Translate {amount} {cur1} into {cur2} money."],
    "stock_price": ["Quote for {ticker}?", "{ticker} price", "Where is {ticker} trading?",
                    "Get me the latest quote on {ticker}.", "What's the market saying about {ticker}?",
                    "Look up the ticker {ticker}.", "How is {ticker} priced right now?",
                    "Current value of {ticker} stock?", "Fetch {ticker}'s price.",
                    "What's the going rate for {ticker}?", "Give me a price check on {ticker}.",
                    "Stock quote: {ticker}.", "How much would I pay for {ticker} today?",
                    "Where did {ticker} close?", "What are {ticker} shares going for?",
                    "Find the market price of {ticker}."],
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
    ap.add_argument("--vary-frac", type=float, default=0.0,
                    help="share of rows asked with a VARIED_ASKS phrasing (stage O; drawn after --tail-frac, and "
                         "replacing it); 0 = no extra draw, the rows of before")
    ap.add_argument("--piece-word-frac", type=float, default=0.0,
                    help="share of rows whose one-word values are made of tokenizer pieces (stage P; drawn before "
                         "--one-word-frac and replacing it); 0 = no extra draw, the rows of before")
    ap.add_argument("--real-word-frac", type=float, default=0.0,
                    help="share of rows whose one-word values are real English words from --words-from's prose "
                         "(stage W; drawn before --piece-word-frac and replacing it); 0 = no extra draw")
    ap.add_argument("--real-hard", type=float, default=0.0,
                    help="with --real-word-frac: share of the words drawn from those whose call is not the twin "
                         "of the first piece plus a copy (toolspan38.hard_words)")
    ap.add_argument("--grammar-frac", type=float, default=0.0,
                    help="share of rows asked with a phrasing from asks38.py's grammar (stage X; drawn last, "
                         "replacing --vary-frac's and --tail-frac's draws); 0 = no extra draw, the rows of before")
    ap.add_argument("--words-from", default="build/train38/corpus/train.jsonl",
                    help="the corpus JSONL whose prose rows give --real-word-frac its words")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    n = {"tool": 0, "renamed": 0}
    with open(a.out, "w", encoding="utf-8") as g:
        for i in range(a.n):
            think = rng.random() < 0.5
            if a.real_word_frac > 0 and rng.random() < a.real_word_frac:
                rebind_real(rng, a.words_from, a.real_hard)
                n["real"] = n.get("real", 0) + 1
            elif a.piece_word_frac > 0 and rng.random() < a.piece_word_frac:
                rebind_pieces(rng)
                n["pieces"] = n.get("pieces", 0) + 1
            else:
                rebind(rng, a.one_word_frac)
            if a.tail_frac > 0 or a.multi_frac > 0 or a.vary_frac > 0 or a.grammar_frac > 0:
                kind = rng.choice(m38.TOOL_KINDS)
                n_tools = rng.choice([2, 3]) if a.multi_frac > 0 and rng.random() < a.multi_frac else None
                tail = a.tail_frac > 0 and rng.random() < a.tail_frac
                vary = a.vary_frac > 0 and rng.random() < a.vary_frac
                gram = a.grammar_frac > 0 and rng.random() < a.grammar_frac
                saved = m38.TOOLS[kind]["asks"]
                if gram:
                    m38.TOOLS[kind]["asks"] = [asks38.grammar_ask(rng, kind)]
                    n["grammar"] = n.get("grammar", 0) + 1
                elif vary:
                    m38.TOOLS[kind]["asks"] = VARIED_ASKS[kind]
                    n["vary"] = n.get("vary", 0) + 1
                elif tail:
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
