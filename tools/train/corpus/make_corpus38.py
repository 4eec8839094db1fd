#!/usr/bin/python3
"""Training data for issue 38 (k3-mini that does its tricks), deterministic (seeds below).

  /usr/bin/python3 tools/train/corpus/make_corpus38.py OUT

Writes into OUT:
  train.jsonl, val.jsonl   rows for build/corpus_ids: {"text": ...} prose, or
                           {"messages": [...], "think": bool[, "tools": [...]]} conversations
  heldout.txt              the same held-out prose as make_corpus.py (byte-identical: the split
                           below replays make_corpus.py's random stream), for perplexity
  heldout_docs.txt         Python library documentation that no training row contains (the part
                           of the library past make_corpus.RST_MAX): long system prompts for the
                           long-context evaluation
  stats.json               counts per kind
and tools/train/corpus/heldout38.json: the held-out subtraction and multiplication pairs, the
held-out tool-request phrasings (and the addition pairs of heldout_pairs.txt, read, never
regenerated). Nothing held out appears in train.jsonl or val.jsonl.

The tokenizer is NOT retrained (models/k3-mini's tiktoken.model stays): run build38.sh, not
build.sh, for this data.

Kinds of rows (see tools/train/README.md, "Issue 38"):
  prose      every training document of make_corpus.py (KJV, Jargon File, fortunes, Python docs)
  chat       make_corpus.py's greetings / small talk / capitals / facts / fortunes / two-turn
             conversations, without its addition rows (replaced below)
  add        A + B, A, B in 10..99, held-out pairs excluded; pairs whose ones digits carry get
             more copies (CARRY_COPIES vs PLAIN_COPIES); each copy think on or off
  sub, mul   A - B and A * B, A in 10..99, B in 1..9 (mul: 2..9), minus held-out pairs
  tool       one to three OpenAI tools offered (the right one among them), a request, the call
             (K3's tool-call markup via the engine's template), the tool's result, an answer from
             it; some rows ask something no tool is needed for (answered directly)
  long       a long system prompt of training documentation (about LONG_IDS ids), then a
             question (a sum, a difference, a product, a capital, or a tool request)
With thinking on, arithmetic answers carry a short digit-by-digit scratchpad in the think
channel (reasoning_content); the response is always "A + B = C." (or "-", "*").
"""
import json
import os
import random
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_corpus as mc  # noqa: E402

SEED38 = 38038
CARRY_COPIES, PLAIN_COPIES = 4, 2
SUB_COPIES, MUL_COPIES = 5, 8
N_TOOL = 9000
N_LONG = 500
BYTES_PER_ID = 3.4  # prose bytes per token of the k3-mini tokenizer (DATA.md)

# ------------------------------------------------------------------ arithmetic

ADD_Q = mc.ADD_Q
SUB_Q = [("What is {a} - {b}?", 60), ("What is {a} minus {b}?", 12), ("What's {a} - {b}?", 8),
         ("Compute {a} - {b}.", 6), ("{a} - {b} = ?", 6), ("Subtract {b} from {a}.", 4),
         ("How much is {a} - {b}?", 4)]
MUL_Q = [("What is {a} * {b}?", 45), ("What is {a} times {b}?", 20), ("What is {a} x {b}?", 8),
         ("What's {a} * {b}?", 8), ("Compute {a} * {b}.", 6), ("{a} * {b} = ?", 6),
         ("Multiply {a} by {b}.", 7)]


def add_think(a, b):
    u = a % 10 + b % 10
    c = u // 10
    t = a // 10 + b // 10 + c
    s = "%d + %d = %d" % (a % 10, b % 10, u)
    s += ", write %d, carry 1. " % (u % 10) if c else ". "
    s += "%d + %d%s = %d. " % (a // 10, b // 10, " + 1" if c else "", t)
    return s + "So %d + %d = %d." % (a, b, a + b)


def sub_think(a, b):
    u = a % 10
    if u >= b:
        return "%d - %d = %d. The tens stay %d. So %d - %d = %d." % (u, b, u - b, a // 10, a, b, a - b)
    return "%d - %d needs a borrow: %d - %d = %d. %d - 1 = %d. So %d - %d = %d." % (
        u, b, u + 10, b, u + 10 - b, a // 10, a // 10 - 1, a, b, a - b)


def mul_think(a, b):
    u = (a % 10) * b
    t = (a // 10) * b + u // 10
    s = "%d * %d = %d" % (a % 10, b, u)
    s += ", write %d, carry %d. " % (u % 10, u // 10) if u >= 10 else ". "
    s += "%d * %d%s = %d. " % (a // 10, b, " + %d" % (u // 10) if u >= 10 else "", t)
    return s + "So %d * %d = %d." % (a, b, a * b)


def arith_conv(rng, op, a, b, think, q=None):
    if op == "+":
        q = q or mc.pick(rng, ADD_Q).format(a=a, b=b)
        ans, th = "%d + %d = %d." % (a, b, a + b), add_think(a, b)
    elif op == "-":
        q = q or mc.pick(rng, SUB_Q).format(a=a, b=b)
        ans, th = "%d - %d = %d." % (a, b, a - b), sub_think(a, b)
    else:
        q = q or mc.pick(rng, MUL_Q).format(a=a, b=b)
        ans, th = "%d * %d = %d." % (a, b, a * b), mul_think(a, b)
    reply = {"role": "assistant", "content": ans}
    if think:
        reply["reasoning_content"] = th
    return [{"role": "user", "content": q}, reply]


# ------------------------------------------------------------------ tools

CITIES = ["Paris", "London", "Berlin", "Tokyo", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Vienna", "Dublin",
          "Lisbon", "Athens", "Warsaw", "Prague", "Helsinki", "Nairobi", "Toronto", "Sydney", "Chicago", "Boston",
          "Seattle", "Denver", "Mumbai", "Delhi", "Seoul", "Beijing", "Bangkok", "Havana", "Santiago", "Moscow",
          "Istanbul", "Stockholm", "Copenhagen", "Amsterdam", "Brussels", "Zurich", "Geneva", "Munich", "Hamburg",
          "Milan", "Naples", "Barcelona", "Valencia", "Porto", "Edinburgh", "Glasgow", "Manchester", "Bristol",
          "Montreal", "Vancouver", "Mexico City", "Buenos Aires", "Cape Town", "Lagos", "Casablanca", "Dubai",
          "Singapore", "Jakarta", "Manila", "Hanoi", "Osaka", "Kyoto", "Auckland", "Perth", "Reykjavik"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "partly cloudy", "stormy"]
FOLDERS = ["docs", "src", "tests", "build", "images", "notes", "scripts", "config", "data", "examples", "tools",
           "assets", "lib", "include", "bin", "logs", "templates", "static", "models", "reports", "drafts",
           "downloads", "music", "photos", "backup", "home", "web", "api", "server", "client"]
FILE_STEMS = ["README", "index", "main", "notes", "setup", "config", "todo", "intro", "guide", "changelog", "app",
              "utils", "test_main", "report", "plan", "api", "style", "data", "install", "LICENSE", "Makefile",
              "server", "client", "model", "train", "export", "schema", "routes", "helpers", "overview"]
FILE_EXTS = [".md", ".txt", ".py", ".c", ".h", ".json", ".js", ".html", ".css", ".yaml", ".toml", ".sh", ""]
TIMEZONE_CITIES = CITIES
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "INR", "CNY", "MXN"]
TICKERS = ["ACME", "AAPL", "MSFT", "GOOG", "AMZN", "TSLA", "NVDA", "IBM", "ORCL", "INTC", "SAP", "SONY"]
TOPICS = ["the tallest mountain", "Python list comprehensions", "the history of Rome", "how bees make honey",
          "the speed of light", "solar panels", "the Eiffel Tower", "how to bake bread", "black holes",
          "the French revolution", "electric cars", "the Moon landing", "jazz music", "the Great Wall of China",
          "volcanoes", "the human heart", "machine learning", "coffee", "the Amazon river", "chess openings",
          "the printing press", "tea ceremonies", "quantum computers", "whales", "the Olympic games"]
PEOPLE = ["alice@example.com", "bob@example.com", "carol@example.org", "dave@example.net", "erin@example.com",
          "frank@example.org", "grace@example.com", "heidi@example.net"]
SUBJECTS = ["Meeting tomorrow", "Lunch", "Project update", "The report", "Hello", "Weekend plans", "Invoice",
            "Thank you", "Schedule change", "Quick question"]

# Each tool: names and argument-key variants (the model must copy the offered schema's spelling),
# a description, request phrasings ({x} placeholders), a result maker and an answer maker.
# Phrasings marked with a leading "!" are held out (evaluation only).
TOOLS = {
    "weather": {
        "names": ["get_weather", "get_current_weather", "weather", "lookup_weather"],
        "desc": ["Get the current weather in a city.", "Returns the current weather for a location.",
                 "Look up today's weather for a given city."],
        "args": [("city", "string", "The city name")], "argkeys": [["city"], ["location"], ["city"], ["place"]],
        "asks": ["What is the weather in {city}?", "What's the weather like in {city}?", "How is the weather in {city}?",
                 "Tell me the weather in {city}.", "Is it raining in {city}?", "weather in {city}?",
                 "Can you check the weather in {city} for me?", "What is the temperature in {city} right now?",
                 "!How's the weather in {city} today?", "!Do I need an umbrella in {city}?",
                 "!Check the current weather for {city}.", "!I'm going to {city}. What is the weather there?"],
    },
    "list_files": {
        "names": ["list_files", "list_directory", "ls", "list_dir"],
        "desc": ["List the files in a directory.", "Lists the entries of a folder.",
                 "Return the names of the files in the given directory."],
        "args": [("path", "string", "The directory path")], "argkeys": [["path"], ["directory"], ["path"], ["dir"]],
        "asks": ["List the files in the {folder} folder.", "What files are in {folder}?", "Show me the files in {folder}.",
                 "What is in the {folder} directory?", "list files in {folder}", "Which files does {folder} contain?",
                 "Can you list the contents of the {folder} folder?", "Show the directory listing of {folder}.",
                 "!List the files in the {folder} directory.", "!What's inside the {folder} folder?",
                 "!Please show me what files are in {folder}.", "!ls {folder}"],
    },
    "read_file": {
        "names": ["read_file", "cat_file", "open_file", "read"],
        "desc": ["Read a text file and return its contents.", "Returns the contents of a file.",
                 "Open a file and read it."],
        "args": [("path", "string", "Path of the file")], "argkeys": [["path"], ["file"], ["filename"], ["path"]],
        "asks": ["Read the file {file}.", "What does {file} say?", "Show me the contents of {file}.",
                 "Open {file} and tell me what it says.", "What is in {file}?", "cat {file}",
                 "Please read {file} for me.", "Print the file {file}.",
                 "!What's written in {file}?", "!Read {file} and tell me what's in it.",
                 "!Can you open the file {file}?", "!Display the contents of {file}."],
    },
    "get_time": {
        "names": ["get_time", "get_current_time", "current_time", "world_clock"],
        "desc": ["Get the current local time in a city.", "Returns the local time for a city.",
                 "Look up what time it is in a place."],
        "args": [("city", "string", "The city name")], "argkeys": [["city"], ["location"], ["timezone_city"], ["city"]],
        "asks": ["What time is it in {city}?", "What is the time in {city}?", "Tell me the current time in {city}.",
                 "What's the local time in {city}?", "time in {city}?", "Can you check the time in {city}?",
                 "How late is it in {city} now?", "Give me the current time in {city}.",
                 "!What time is it now in {city}?", "!Do you know the time in {city}?",
                 "!Check the clock in {city} for me.", "!What's the current time in {city}?"],
    },
    "search_web": {
        "names": ["search_web", "web_search", "search", "google"],
        "desc": ["Search the web and return the top results.", "Run a web search for a query.",
                 "Find pages on the internet about a topic."],
        "args": [("query", "string", "The search query")], "argkeys": [["query"], ["q"], ["query"], ["search_terms"]],
        "asks": ["Search the web for {topic}.", "Find information about {topic}.", "Look up {topic} online.",
                 "Can you search for {topic}?", "Google {topic}.", "Search for {topic}.",
                 "What does the internet say about {topic}?", "Do a web search on {topic}.",
                 "!Please look up {topic} on the web.", "!Find me something about {topic}.",
                 "!I want to learn about {topic}. Search the web.", "!Run a search for {topic}."],
    },
    "send_email": {
        "names": ["send_email", "email", "send_mail", "compose_email"],
        "desc": ["Send an email.", "Send an email message to a recipient.", "Compose and send an email."],
        "args": [("to", "string", "Recipient address"), ("subject", "string", "Subject line")],
        "argkeys": [["to", "subject"], ["recipient", "subject"], ["to", "title"], ["address", "subject"]],
        "asks": ["Send an email to {to} with the subject {subject}.", "Email {to} about {subject}.",
                 "Write an email to {to}, subject: {subject}.", "Please send {to} an email titled {subject}.",
                 "Send a mail to {to} with subject {subject}.", "Mail {to}: subject {subject}.",
                 "!Could you email {to} with the subject {subject}?", "!Send {to} a message about {subject}.",
                 "!Drop an email to {to}, subject {subject}."],
    },
    "convert_currency": {
        "names": ["convert_currency", "currency_convert", "exchange", "convert_money"],
        "desc": ["Convert an amount of money from one currency to another.", "Currency conversion at today's rate.",
                 "Convert money between currencies."],
        "args": [("amount", "number", "The amount"), ("from", "string", "Currency code to convert from"),
                 ("to", "string", "Currency code to convert to")],
        "argkeys": [["amount", "from", "to"], ["amount", "from_currency", "to_currency"], ["value", "source", "target"],
                    ["amount", "from", "to"]],
        "asks": ["Convert {amount} {cur1} to {cur2}.", "How much is {amount} {cur1} in {cur2}?",
                 "What is {amount} {cur1} in {cur2}?", "Change {amount} {cur1} into {cur2}.",
                 "{amount} {cur1} to {cur2}?", "Convert {amount} {cur1} into {cur2} please.",
                 "!How many {cur2} do I get for {amount} {cur1}?", "!Exchange {amount} {cur1} to {cur2}.",
                 "!What are {amount} {cur1} worth in {cur2}?"],
    },
    "stock_price": {
        "names": ["get_stock_price", "stock_quote", "get_quote", "stock_price"],
        "desc": ["Get the latest price of a stock.", "Returns the current share price for a ticker symbol.",
                 "Look up a stock quote."],
        "args": [("symbol", "string", "The ticker symbol")], "argkeys": [["symbol"], ["ticker"], ["symbol"], ["stock"]],
        "asks": ["What is the stock price of {ticker}?", "How much is {ticker} trading at?", "Get a quote for {ticker}.",
                 "What's {ticker} stock at?", "Price of {ticker}?", "Check the share price of {ticker}.",
                 "!Look up the price of {ticker} stock.", "!How is {ticker} doing on the market today?",
                 "!What does one {ticker} share cost?"],
    },
}
TOOL_KINDS = sorted(TOOLS)


def split_asks(kind):
    tr = [a for a in TOOLS[kind]["asks"] if not a.startswith("!")]
    ho = [a[1:] for a in TOOLS[kind]["asks"] if a.startswith("!")]
    return tr, ho


def tool_def(kind, variant):
    t = TOOLS[kind]
    v = variant % len(t["names"])
    keys = t["argkeys"][v]
    props, req = {}, []
    for (k0, typ, d), k in zip(t["args"], keys):
        props[k] = {"type": typ, "description": d}
        req.append(k)
    return {"type": "function", "function": {"name": t["names"][v], "description": t["desc"][variant % len(t["desc"])],
                                             "parameters": {"type": "object", "properties": props, "required": req}}}


def rand_file(rng):
    stem, ext = rng.choice(FILE_STEMS), rng.choice(FILE_EXTS)
    if stem in ("Makefile", "LICENSE"):
        ext = ""
    p = stem + ext
    if rng.random() < 0.35:
        p = rng.choice(FOLDERS) + "/" + p
    return p


FILE_TEXTS = ["Meeting at 10 am on Monday in room 4.", "Buy milk, eggs and bread.", "The build passes on Linux.",
              "Version 1.2 fixes the login bug.", "Remember to call the dentist.", "TODO: write the tests.",
              "Hello, world!", "The server listens on port 8080.", "Deadline is Friday.",
              "Install with make and run ./app.", "The budget is 500 dollars.", "All tests passed."]


def tool_case(rng, kind, ask):
    """-> (user text, call arguments in schema order (values), result JSON text, answer)"""
    if kind == "weather":
        city = rng.choice(CITIES)
        temp, cond = rng.randint(-5, 35), rng.choice(CONDITIONS)
        res = json.dumps({"city": city, "temperature_c": temp, "condition": cond})
        ans = rng.choice(["It is {t} degrees Celsius and {c} in {city}.", "In {city} it is {c} and {t} degrees Celsius.",
                          "The weather in {city} is {c}, {t} degrees Celsius."]).format(t=temp, c=cond, city=city)
        return ask.format(city=city), [city], res, ans
    if kind == "list_files":
        folder = rng.choice(FOLDERS)
        n = rng.randint(1, 5)
        names = sorted(set(rng.choice(FILE_STEMS) + rng.choice(FILE_EXTS[:-1]) for _ in range(n)))
        res = json.dumps({"path": folder, "files": names}) if rng.random() < 0.5 else "\n".join(names)
        lst = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        ans = ("The {f} folder contains {n} file{s}: {l}." if rng.random() < 0.6 else "In {f} there {v}: {l}.").format(
            f=folder, n=len(names), s="" if len(names) == 1 else "s", l=lst,
            v="is one file" if len(names) == 1 else "are %d files" % len(names))
        return ask.format(folder=folder), [folder], res, ans
    if kind == "read_file":
        f = rand_file(rng)
        txt = rng.choice(FILE_TEXTS)
        return ask.format(file=f), [f], txt, rng.choice(["The file {f} says: {t}", "{f} contains: {t}"]).format(
            f=f, t=txt)
    if kind == "get_time":
        city = rng.choice(TIMEZONE_CITIES)
        tm = "%02d:%02d" % (rng.randint(0, 23), rng.randint(0, 59))
        res = json.dumps({"city": city, "time": tm})
        return ask.format(city=city), [city], res, rng.choice(["It is {t} in {c}.", "The local time in {c} is {t}."]).format(
            t=tm, c=city)
    if kind == "search_web":
        topic = rng.choice(TOPICS)
        title = topic[0].upper() + topic[1:] + rng.choice([" - Wikipedia", ": a short guide", " explained",
                                                           " | Encyclopedia"])
        res = json.dumps({"results": [{"title": title, "url": "https://example.org/%d" % rng.randint(1, 999)}]})
        return ask.format(topic=topic), [topic], res, "The top result is \"%s\"." % title
    if kind == "send_email":
        to, subj = rng.choice(PEOPLE), rng.choice(SUBJECTS)
        res = json.dumps({"status": "sent", "to": to})
        return ask.format(to=to, subject=subj), [to, subj], res, "Done: the email \"%s\" was sent to %s." % (subj, to)
    if kind == "convert_currency":
        amount = rng.choice([rng.randint(1, 999), rng.randint(1, 99) * 10])
        c1, c2 = rng.sample(CURRENCIES, 2)
        rate = round(rng.uniform(0.05, 3.0), 2)
        val = round(amount * rate, 2)
        res = json.dumps({"amount": amount, "from": c1, "to": c2, "result": val})
        return ask.format(amount=amount, cur1=c1, cur2=c2), [amount, c1, c2], res, "%d %s is %s %s." % (
            amount, c1, val, c2)
    if kind == "stock_price":
        tk = rng.choice(TICKERS)
        price = round(rng.uniform(5, 900), 2)
        res = json.dumps({"symbol": tk, "price": price, "currency": "USD"})
        return ask.format(ticker=tk), [tk], res, "%s is trading at %s USD." % (tk, price)
    raise KeyError(kind)


def tool_conv(rng, held_sets, heldout=False, n_tools=None, kind=None):
    """A tool conversation: -> (messages, tools). heldout: use held-out phrasings only."""
    kind = kind or rng.choice(TOOL_KINDS)
    variant = rng.randrange(12)
    n_tools = n_tools or rng.choice([1, 1, 2, 2, 2, 3])
    others = rng.sample([k for k in TOOL_KINDS if k != kind], n_tools - 1)
    offered = [(kind, variant)] + [(k, rng.randrange(12)) for k in others]
    rng.shuffle(offered)
    tools = [tool_def(k, v) for k, v in offered]
    tr, ho = split_asks(kind)
    ask = rng.choice(ho if heldout else tr)
    user, vals, res, ans = tool_case(rng, kind, ask)
    if not heldout and rng.random() < 0.1:
        user = user.lower() if rng.random() < 0.5 else user.rstrip(".?") 
    td = tool_def(kind, variant)["function"]
    keys = list(td["parameters"]["properties"])
    args = json.dumps(dict(zip(keys, vals)), ensure_ascii=False)
    cid = "call_%d" % rng.randrange(10 ** 6)
    msgs = [{"role": "user", "content": user},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": td["name"], "arguments": args}}]},
            {"role": "tool", "tool_call_id": cid, "content": res},
            {"role": "assistant", "content": ans}]
    return msgs, tools, {"kind": kind, "tool": td["name"], "args": dict(zip(keys, vals)), "ask": ask, "user": user,
                         "answer": ans}


def no_tool_conv(rng, held_add, think):
    """tools are offered but the question needs none: answered directly"""
    r = rng.random()
    if r < 0.4:
        while True:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if (a, b) not in held_add:
                break
        return arith_conv(rng, "+", a, b, think)
    if r < 0.6:
        return mc.chat(rng.choice(mc.GREET_Q), rng.choice(mc.GREET_A))
    if r < 0.8:
        c, cap = rng.choice(mc.CAPITALS)
        return mc.chat("What is the capital of %s?" % c, "The capital of %s is %s." % (c, cap))
    q, a = rng.choice(mc.FACTS)
    return mc.chat(q, a)


# ------------------------------------------------------------------ prose split (replays make_corpus.py)


def prose_split():
    """-> (rng after the split, train docs, val docs, heldout docs, fortunes, chat convs of make_corpus)"""
    rng = random.Random(mc.SEED)
    fdocs, fortunes = mc.fortune_docs()
    sources = [("kjv", mc.kjv_docs()), ("jargon", mc.jargon_docs()), ("fortunes", fdocs), ("pydoc", mc.python_docs())]
    train, val, heldout = [], [], []
    by_src = {}
    for name, docs in sources:
        idx = list(range(len(docs)))
        rng.shuffle(idx)
        n_val = max(1, len(docs) // 50)
        n_held = 0
        src_held = 0
        while src_held < 20_000:
            d = docs[idx[n_val + n_held]]
            heldout.append(d)
            src_held += len(d.encode())
            n_held += 1
        for j, i in enumerate(idx):
            if j < n_val:
                val.append(docs[i])
            elif j >= n_val + n_held:
                train.append(docs[i])
                by_src.setdefault(name, []).append(docs[i])
    conv, held = mc.chats(rng, fortunes)
    return train, val, heldout, by_src, conv, held


def python_docs_rest():
    """Python library documentation past make_corpus.RST_MAX (in no training row)."""
    docs, total = [], 0
    for c in mc.python_doc_chunks():
        if total >= mc.RST_MAX:
            if len(c) > 200:
                docs.append(c)
            continue
        if len(c) > 200:
            total += len(c)
    return docs


SYS_HEADS = ["You are a helpful assistant. The documentation below is for reference.\n\n",
             "You are K3 mini, a small assistant. Answer briefly.\n\n# Reference documentation\n\n",
             "You are an assistant for software developers. Use the following notes if they help.\n\n",
             "Answer the user's question. Context:\n\n"]


def long_system(rng, docs, n_ids):
    want = int(n_ids * BYTES_PER_ID)
    parts, n = [], 0
    while n < want:
        d = rng.choice(docs)
        parts.append(d)
        n += len(d.encode()) + 2
    text = "\n\n".join(parts).encode()[:want].decode("utf-8", "ignore")
    return rng.choice(SYS_HEADS) + text


def long_len(rng):
    r = rng.random()
    if r < 0.55:
        return rng.randint(1000, 2500)
    if r < 0.85:
        return rng.randint(2500, 5000)
    if r < 0.97:
        return rng.randint(5000, 9000)
    return rng.randint(9000, 15000)


# ------------------------------------------------------------------ main


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    train_docs, val_docs, heldout, by_src, conv0, held_add = prose_split()
    held_add_set = set(held_add)
    file_pairs = set()
    for line in open(os.path.join(HERE, "heldout_pairs.txt")):
        if line.strip() and not line.startswith("#"):
            a, b = line.split()[:2]
            file_pairs.add((int(a), int(b)))
    assert file_pairs == held_add_set, "heldout_pairs.txt does not match make_corpus.py's held-out pairs"

    rng = random.Random(SEED38)
    sub_pairs = [(a, b) for a in range(10, 100) for b in range(1, 10)]
    mul_pairs = [(a, b) for a in range(10, 100) for b in range(2, 10)]
    # A >= 20: a borrow step of the scratchpad ("12 - 3 = 9" inside 62 - 3) never states a held-out pair
    held_sub = sorted(rng.sample([p for p in sub_pairs if p[0] >= 20], 50))
    held_mul = sorted(rng.sample(mul_pairs, 50))
    hs, hm = set(held_sub), set(held_mul)

    rows = []  # (kind, row)
    stats = {}

    def add(kind, msgs, think, tools=None):
        r = {"messages": msgs, "think": think}
        if tools:
            r["tools"] = tools
        rows.append((kind, r))
        stats[kind] = stats.get(kind, 0) + 1

    # make_corpus's other chat (not its addition rows)
    add_re = re.compile(r"^\d+ \+ \d+ = \d+\.$")
    for m, t in conv0:
        if len(m) == 2 and add_re.match(m[1]["content"]):
            continue
        if t:  # thinking on: sums in these conversations get the same scratchpad as the add rows
            for x in m:
                if x["role"] == "assistant" and add_re.match(x["content"]):
                    a, b = (int(v) for v in re.findall(r"\d+", x["content"])[:2])
                    x["reasoning_content"] = add_think(a, b)
        add("chat", m, t)
    # addition, carry-weighted
    for a in range(10, 100):
        for b in range(10, 100):
            if (a, b) in held_add_set:
                continue
            n = CARRY_COPIES if a % 10 + b % 10 >= 10 else PLAIN_COPIES
            for k in range(n):
                add("add", arith_conv(rng, "+", a, b, k % 2 == 0), k % 2 == 0)
    for a, b in sub_pairs:
        if (a, b) not in hs:
            for k in range(SUB_COPIES):
                add("sub", arith_conv(rng, "-", a, b, k % 2 == 0), k % 2 == 0)
    for a, b in mul_pairs:
        if (a, b) not in hm:
            for k in range(MUL_COPIES):
                add("mul", arith_conv(rng, "*", a, b, k % 2 == 0), k % 2 == 0)
    # tools
    for i in range(N_TOOL):
        think = rng.random() < 0.5
        if rng.random() < 0.12:
            kinds = rng.sample(TOOL_KINDS, rng.choice([1, 2]))
            tools = [tool_def(k, rng.randrange(12)) for k in kinds]
            add("tool_none", no_tool_conv(rng, held_add_set, think), think, tools)
            continue
        msgs, tools, _ = tool_conv(rng, None)
        if rng.random() < 0.2:  # a second request in the same conversation
            m2, t2, _ = tool_conv(rng, None)
            names = {t["function"]["name"] for t in tools}
            for t in t2:
                if t["function"]["name"] not in names:
                    tools.append(t)
            # the second call's tool must be offered under the name it is called by
            cid = m2[1]["tool_calls"][0]["id"]
            m2[2]["tool_call_id"] = cid
            msgs = msgs + m2
            tools = tools[:4]
            if m2[1]["tool_calls"][0]["function"]["name"] not in {t["function"]["name"] for t in tools}:
                msgs = msgs[:4]
        add("tool", msgs, think, tools)
    # long context: a long system prompt of training documentation, then a question
    docs = by_src["pydoc"] + by_src["jargon"] + by_src["kjv"][:200]
    for i in range(N_LONG):
        sysm = {"role": "system", "content": long_system(rng, docs, long_len(rng))}
        think = rng.random() < 0.5
        r = rng.random()
        tools = None
        if r < 0.45:
            while True:
                a, b = rng.randint(10, 99), rng.randint(10, 99)
                if (a, b) not in held_add_set:
                    break
            msgs = arith_conv(rng, "+", a, b, think)
        elif r < 0.55:
            a, b = rng.choice([p for p in sub_pairs if p not in hs])
            msgs = arith_conv(rng, "-", a, b, think)
        elif r < 0.65:
            a, b = rng.choice([p for p in mul_pairs if p not in hm])
            msgs = arith_conv(rng, "*", a, b, think)
        elif r < 0.8:
            c, cap = rng.choice(mc.CAPITALS)
            msgs = mc.chat("What is the capital of %s?" % c, "The capital of %s is %s." % (c, cap))
        else:
            msgs, tools, _ = tool_conv(rng, None)
        add("long", [sysm] + msgs, think, tools)

    # prose rows
    prose = [("prose", {"text": d}) for d in train_docs]
    stats["prose"] = len(prose)
    allrows = rows + prose
    rng.shuffle(allrows)
    # validation: 2% of the generated conversations of each kind + make_corpus's validation prose
    val, train = [], []
    seen = {}
    for kind, r in allrows:
        seen[kind] = seen.get(kind, 0) + 1
        if kind != "prose" and seen[kind] % 50 == 0:
            val.append(r)
        else:
            train.append(r)
    val += [{"text": d} for d in val_docs]
    rng.shuffle(val)
    for fname, rs in (("train.jsonl", train), ("val.jsonl", val)):
        with open(os.path.join(out, fname), "w", encoding="utf-8") as f:
            for r in rs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(heldout) + "\n")
    rest = python_docs_rest()
    with open(os.path.join(out, "heldout_docs.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(rest) + "\n")
    stats["heldout_docs_bytes"] = sum(len(d.encode()) for d in rest)
    stats["train_rows"], stats["val_rows"] = len(train), len(val)
    json.dump(stats, open(os.path.join(out, "stats.json"), "w"), indent=1)
    ho = {"seed": SEED38,
          "add_pairs_file": "tools/train/corpus/heldout_pairs.txt",
          "sub_pairs": held_sub, "mul_pairs": held_mul,
          "tool_phrasings": {k: split_asks(k)[1] for k in TOOL_KINDS}}
    with open(os.path.join(HERE, "heldout38.json"), "w") as f:
        json.dump(ho, f, indent=1)
        f.write("\n")
    print("make_corpus38:", json.dumps(stats))


if __name__ == "__main__":
    main()
