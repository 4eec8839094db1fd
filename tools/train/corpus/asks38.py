#!/usr/bin/python3
"""A grammar of training requests for the tool rows (stage X): thousands of phrasings per tool kind.

Stage R's held-out misses are mostly about WHERE the value is, not how to spell it: a request shaped unlike
the ~35 training phrasings of its kind gets a value copied from the wrong words (`wi` for the folder of
"What's inside the ... folder?", `one SONY`, `Sesterdam`, `press` for "the printing press"). A model that
has seen each kind asked a few dozen ways learns those ways' positions; this grammar asks each kind in
thousands (a verb or question, an object phrase, the value in one of several frames: `in X`, `the X
folder`, `X's`, `X:` first, after a context sentence; optional greetings, thanks, lower case, no final
punctuation), so the value has to be found by what it is, not by where it sits.

Written from scratch for stage X. It has seen the held-out phrasings of heldout38.json (the stage-R
evaluation output quotes them), so `near_heldout` rejects every generated phrasing within a small word edit
distance of a held-out phrasing of the same kind (contractions expanded, case and punctuation dropped),
and check_heldout38.py still checks every row for an exact held-out pattern.

  grammar_ask(rng, kind) -> a phrasing with make_corpus38's slots ({city}, {folder}, {file}, {topic}, {to},
  {subject}, {amount}, {cur1}, {cur2}, {ticker})
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_heldout38  # noqa: E402

PREFIX = ["Hi! ", "Hey, ", "Hello. ", "Quick question: ", "Okay, ", "So, ", "Excuse me, ", "Sorry to bother you, ",
          "Hi there. ", "Good morning! ", "One thing: ", "Right, ", "If you can, ", "When you get a chance, "]
SUFFIX = [" Thanks!", " Thank you.", " Thanks a lot.", " Cheers.", " I need it quickly.", " Appreciate it.",
          " Ta.", " Much obliged.", " No rush.", " Just curious."]

# each kind: "v" imperative verbs, "o" object phrases, "p" value frames (the value's own slot inside),
# "q" question templates with {P} for a frame, "s" whole sentences (the value anywhere), "ctx" context
# sentences that may come first; "qp" (optional) the frames the questions take instead of "p"
G = {
    "weather": {
        "v": ["Tell me", "Give me", "Show me", "Get me", "Fetch", "Look up", "Find", "Report", "Pull up", "Check",
              "Find out", "I'd like", "I want", "Can I get", "Could you get me"],
        "o": ["the weather", "the forecast", "the current conditions", "today's weather", "the temperature",
              "the weather report", "the conditions outside", "the local weather", "the weather right now"],
        "p": ["in {city}", "for {city}", "over in {city}", "around {city}", "in the city of {city}",
              "in {city} right now", "in {city} this afternoon"],
        "q": ["Is it sunny {P}?", "Is it cold {P}?", "Will it rain {P}?", "How warm is it {P}?", "Is it snowing {P}?",
              "What are the conditions like {P}?", "Is the weather nice {P}?", "Is it hot {P} today?",
              "Any sunshine {P}?", "What's the forecast {P}?", "How cold does it get {P} today?",
              "What is it like outside {P}?", "Is it foggy {P}?", "Should I bring a jacket {P}?"],
        "s": ["{city} weather, please.", "{city}: what's the weather?", "Weather for {city}?",
              "{city} - how is the weather?", "{city}, is it raining?", "The weather in {city}, please.",
              "My flight lands in {city} tonight. What's the weather doing?", "We're in {city}. Is it warm out?",
              "About {city}: sunny or cloudy right now?", "I live in {city}. What's it like outside?",
              "For {city}, give me today's weather.", "Is {city} warm or cold today?",
              "Current weather conditions in {city}?", "Weather check: {city}."],
        "ctx": ["I'm planning a walk.", "We have a picnic planned.", "I'm packing a bag.", "I'm about to head out.",
                "My kids want to play outside."],
    },
    "get_time": {
        "v": ["Tell me", "Give me", "Show me", "Get me", "Look up", "Find", "Check", "Find out", "I need",
              "Can I get", "Could you get me", "Please find"],
        "o": ["the time", "the local time", "the current time", "the hour", "the exact time", "what time it is",
              "the time of day", "the clock time", "the present time"],
        "p": ["in {city}", "for {city}", "over in {city}", "in {city} right now", "in the city of {city}",
              "where {city} is"],
        "q": ["What hour is it {P}?", "Is it late {P}?", "Is it early morning {P}?", "Is it night {P}?",
              "What's the time {P}?", "How late is it {P}?", "Is it daytime {P}?", "Is it evening yet {P}?",
              "Is it past noon {P}?", "What time do they have {P}?"],
        "s": ["{city} time?", "Time in {city}, please.", "{city}: what time is it?", "{city} - current time?",
              "My brother is in {city}. What time is it for him?", "I have a call with {city}. What time is it there?",
              "The clock in {city}, please.", "Is {city} ahead of us? What's the time there?",
              "For {city}, what's the local time?", "Local time for {city}?", "{city}, what hour is it?",
              "Time check: {city}."],
        "ctx": ["I need to call someone.", "I have a meeting soon.", "I'm booking a call.", "My phone died."],
    },
    "list_files": {
        "v": ["List", "Show", "Show me", "Display", "Print", "Give me", "Tell me", "Enumerate", "Get", "Fetch",
              "I need", "I'd like to see", "Can I see", "Let me see", "Could you show me", "Please list"],
        "o": ["the files in", "the contents of", "everything in", "the listing of", "the entries of",
              "the file names in", "the directory listing for", "all files in", "each file in"],
        "p": ["{folder}", "the {folder} folder", "the {folder} directory", "the folder {folder}",
              "the directory {folder}", "my {folder} folder", "the {folder} dir", "folder {folder}",
              "the {folder} path"],
        "q": ["What files are in {P}?", "What is stored in {P}?", "Which files live in {P}?", "What does {P} contain?",
              "Anything in {P}?", "How many files does {P} have?", "What have I got in {P}?",
              "Which files are under {P}?", "What sits in {P}?", "Are there files in {P}?"],
        "s": ["{folder}: list the files.", "Files in {folder}?", "{folder} - what files are there?",
              "Directory {folder}, list it please.", "The {folder} folder: what's in there?",
              "I need a file list for {folder}.", "Check the folder named {folder}.",
              "For the {folder} folder, list everything.", "Contents of {folder}?", "dir {folder}?"],
        "ctx": ["I'm cleaning up my disk.", "I lost a file.", "I'm looking for something.", "I just copied some files."],
    },
    "read_file": {
        "v": ["Read", "Show", "Show me", "Display", "Print", "Give me", "Open", "Load", "Fetch", "Output",
              "I need", "Can I see", "Let me see", "Could you read", "Please open", "Tell me"],
        "o": ["the file", "the contents of", "the text of", "the document", "the body of", "everything in",
              "the lines of"],
        "p": ["{file}", "the file {file}", "{file} for me", "my {file}", "the {file} file"],
        "q": ["What does {P} contain?", "What is in {P}?", "What text is in {P}?", "What does {P} say exactly?",
              "What's inside {P}?", "What did they put in {P}?", "Can you tell me what {P} says?",
              "What is the content of {P}?", "Is there anything in {P}?"],
        "s": ["{file}: show it.", "{file} - contents?", "Contents of {file}?", "File {file}, please read it.",
              "I need to see {file}.", "Open up {file} for me.", "Read me {file}.",
              "For {file}, print the contents.", "Here's a path: {file}. What's in it?", "cat the file {file}"],
        "ctx": ["I forgot what I wrote.", "I'm reviewing my notes.", "A colleague sent me a file.",
                "I need to check something."],
    },
    "search_web": {
        "v": ["Search for", "Look up", "Find", "Google", "Research", "Find me", "Look for", "Search the web for",
              "Search online for", "Find pages about", "Look into", "Dig up"],
        "o": ["", "information on", "articles about", "pages on", "facts about", "a source on", "something on",
              "news about", "details on"],
        "p": ["{topic}", "{topic} online", "{topic} on the internet", "{topic} for me"],
        "q": ["What can you find about {P}?", "Is there anything online about {P}?", "Can you search {P}?",
              "Could you find me a page about {P}?", "What does the web say on {P}?", "Any good pages on {P}?",
              "Can you look into {P}?", "Where can I read about {P}?"],
        "s": ["{topic}: search it.", "Search: {topic}.", "{topic} - find me a page.", "Topic: {topic}. Search the web.",
              "I'm writing about {topic}. Find a source.", "Do a search, {topic}.", "Web search {topic}",
              "My question is about {topic}; search online."],
        "ctx": ["I'm writing an essay.", "I'm curious.", "My friend asked me something.", "I have a school project."],
    },
    "send_email": {
        "v": ["Send", "Write", "Compose", "Shoot", "Fire off", "Send off", "Please send", "Could you send",
              "Draft and send"],
        "o": ["an email", "a mail", "a message", "a note", "an email message", "a quick email"],
        "p": ["to {to} with the subject {subject}", "to {to}, subject {subject}", "to {to} titled {subject}",
              "to {to} about {subject}", "to {to} with subject line {subject}", "to {to}; subject: {subject}"],
        "q": [],
        "s": ["Email to {to}, subject {subject}.", "To: {to}. Subject: {subject}. Send it.",
              "{to} needs an email about {subject}.", "Mail {to} with the title {subject}.",
              "Send {to} an email with the subject {subject}.", "Write to {to} - subject {subject}.",
              "Let {to} know; subject line {subject}.", "Can you mail {to}? Subject: {subject}.",
              "Email {to}. The subject is {subject}.", "Reach {to} by email about {subject}."],
        "ctx": ["I'm at my desk.", "This is for work.", "It's about the project.", "I'm in a hurry."],
    },
    "convert_currency": {
        "v": ["Convert", "Change", "Turn", "Exchange", "Translate", "Work out", "Calculate", "Compute"],
        "o": [""],
        "p": ["{amount} {cur1} to {cur2}", "{amount} {cur1} into {cur2}", "{amount} {cur1} in {cur2}",
              "{amount} {cur1} as {cur2}"],
        "q": ["How much is {amount} {cur1} in {cur2}?", "What do {amount} {cur1} make in {cur2}?",
              "In {cur2}, how much is {amount} {cur1}?", "What's {amount} {cur1} in {cur2} today?",
              "How much {cur2} is {amount} {cur1}?", "{amount} {cur1} equals how much {cur2}?",
              "What would {amount} {cur1} be in {cur2}?", "What is the {cur2} value of {amount} {cur1}?"],
        "s": ["{amount} {cur1} -> {cur2}", "From {cur1} to {cur2}: {amount}.", "Convert from {cur1} to {cur2}, amount {amount}.",
              "I have {amount} {cur1} and need {cur2}.", "{amount} {cur1}, in {cur2} please.",
              "Currency: {amount} {cur1} to {cur2}.", "My budget is {amount} {cur1}. Convert it to {cur2}."],
        "ctx": ["I'm travelling.", "I'm shopping online.", "I got paid.", "I'm splitting a bill."],
    },
    "stock_price": {
        "v": ["Get", "Tell me", "Show me", "Look up", "Fetch", "Check", "Find", "Give me", "Pull up", "I need"],
        "o": ["the price of", "the stock price of", "a quote for", "the share price of", "the latest price for",
              "the current quote on", "the trading price of", "the market price of"],
        "p": ["{ticker}", "{ticker} stock", "{ticker} shares", "the ticker {ticker}", "{ticker} right now"],
        "q": ["What is {P} trading at?", "How much is {P}?", "What's {P} at today?", "Where is {P} now?",
              "What's the price on {P}?", "How much does {P} cost?", "Is {P} up today?"],
        "qp": ["{ticker}", "{ticker} stock", "the ticker {ticker}"],
        "s": ["{ticker}: price?", "{ticker} quote, please.", "Ticker {ticker}. Price?", "{ticker} - how much?",
              "I'm watching {ticker}. What's the price?", "Price check on {ticker}.", "Stock {ticker}, latest price.",
              "Quote {ticker} for me."],
        "ctx": ["I'm thinking of investing.", "The market is busy today.", "I own some shares.", "I follow the market."],
    },
}

CONTRACT = [("what's", "what is"), ("how's", "how is"), ("i'm", "i am"), ("it's", "it is"), ("i'd", "i would"),
            ("can't", "cannot"), ("we're", "we are"), ("here's", "here is"), ("let's", "let us")]


def norm(s):
    s = s.lower()
    for a, b in CONTRACT:
        s = s.replace(a, b)
    s = re.sub(r"\{[a-z0-9]+\}", " X ", s)
    return re.findall(r"[a-z]+|X", s)


def edit(a, b):
    d = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(b) + 1):
            cur = d[j]
            d[j] = min(d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
            prev = cur
    return d[-1]


_HELD = None


def held():
    """-> ({kind: normalised held-out phrasings}, check_heldout38.py's patterns of every kind)"""
    global _HELD
    if _HELD is None:
        ho = json.load(open(os.path.join(HERE, "heldout38.json")))["tool_phrasings"]
        _HELD = ({k: [norm(p) for p in v] for k, v in ho.items()}, check_heldout38.heldout_patterns(ho))
    return _HELD


def near_heldout(kind, ask):
    """a phrasing within a small word edit distance of a held-out phrasing of its kind, or one that
    check_heldout38.py's patterns (a slot matches any text) would flag whatever its values"""
    near, pats = held()
    a = norm(ask)
    return (any(edit(a, h) <= max(1, round(0.25 * len(h))) for h in near[kind]) or
            any(p.match(ask) for p in pats))


def core(rng, kind):
    g = G[kind]
    r = rng.random()
    if r < 0.4 and g["v"]:
        o = rng.choice(g["o"])
        s = rng.choice(g["v"]) + (" " + o if o else "") + " " + rng.choice(g["p"])
        return s + rng.choice([".", ".", "!", "", " please.", ", please."])
    if r < 0.7 and g["q"]:
        return rng.choice(g["q"]).replace("{P}", rng.choice(g.get("qp", g["p"])))
    return rng.choice(g["s"])


def grammar_ask(rng, kind):
    """one training phrasing of the kind, never near a held-out one"""
    for _ in range(1000):
        s = core(rng, kind)
        if rng.random() < 0.15:
            s = rng.choice(G[kind]["ctx"]) + " " + s
        if rng.random() < 0.25:
            p = rng.choice(PREFIX)
            s = p + (s[0].lower() + s[1:] if p.endswith((", ", ": ")) and not s.startswith("{") and
                     not s.startswith("I ") and not s.startswith("I'") else s)
        if rng.random() < 0.2 and s[-1] in ".!?":
            s += rng.choice(SUFFIX)
        if rng.random() < 0.08:
            s = s.rstrip(".!?")
        if rng.random() < 0.06:
            s = re.sub(r"(^|\s)([A-Z])(?![A-Z])", lambda m: m.group(1) + m.group(2).lower(), s)
        if not near_heldout(kind, s):
            return s
    raise RuntimeError("asks38: no phrasing of %s away from the held-out ones" % kind)
