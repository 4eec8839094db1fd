#!/usr/bin/python3
"""Build the k3-mini training corpus as JSONL (deterministic; seed fixed below).

Writes into OUT (argument 1):
  train.jsonl, val.jsonl : one JSON object per line, either
        {"text": "..."}                                  (a prose document)
        {"messages": [...], "think": true|false}         (a chat conversation)
  heldout.txt            : plain prose (whole documents, in neither jsonl file)
  tokenizer_corpus.txt   : the text the BPE tokenizer is trained on (the prose of
                           train.jsonl plus the chat turns' contents)
and writes tools/train/corpus/heldout_pairs.txt (the 100 (A, B) addition pairs that
never appear in training or validation).

Sources (all shipped by Debian packages; see models/k3-mini/DATA.md):
  bible-kjv / bible-kjv-text  King James Bible          public domain (1611 text)
  jargon-text                 The Jargon File 4.4.7     public domain
  fortunes, fortunes-min      BSD fortune cookie files  BSD-3-Clause (as distributed)
  python3-doc                 Python 3.11 documentation PSF License v2 (reST sources)

Only Python's standard library is used.
"""
import gzip
import json
import os
import random
import re
import subprocess
import sys

SEED = 20261203
HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------ prose


def clean(s):
    s = s.replace("\r\n", "\n").replace("\t", "    ")
    s = "".join(ch for ch in s if ch == "\n" or ch >= " ")
    s = re.sub(r"[ ]+\n", "\n", s)
    s = re.sub(r"\n{3,}", "\n\n", s)
    return s.strip()


def chunk(text, size):
    """Split text at paragraph boundaries into pieces of about `size` bytes."""
    out, cur = [], []
    n = 0
    for para in text.split("\n\n"):
        cur.append(para)
        n += len(para) + 2
        if n >= size:
            out.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        out.append("\n\n".join(cur))
    return [c for c in out if c.strip()]


def kjv_docs():
    """One document per chapter: "Book N" then the verses as running prose."""
    raw = subprocess.run(["bible", "-m", "8192", "gen1:1-rev22:21"], capture_output=True, text=True,
                         check=True).stdout
    docs, title, verses = [], None, []

    def flush():
        if title and verses:
            body = " ".join(verses)
            docs.append(title + "\n\n" + body)

    for line in raw.split("\n"):
        m = re.match(r"^(\S.*\S) (\d+)$", line)
        if m and not line.startswith(" "):
            flush()
            title, verses = line.strip(), []
            continue
        v = re.match(r"^\s+\d+ (.*)$", line)
        if v:
            verses.append(v.group(1).strip())
        elif line.strip() and verses:
            verses[-1] += " " + line.strip()
    flush()
    return [clean(d) for d in docs]


def jargon_docs():
    with gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8", errors="replace") as f:
        raw = f.read()
    keep = []
    for para in re.split(r"\n\s*\n", raw):
        if re.search("[\u2500-\u257f]", para):  # box-drawing tables
            continue
        lines = [l.strip() for l in para.split("\n")]
        text = " ".join(l for l in lines if l)
        if len(text) < 60 or "." not in text:
            continue
        keep.append(text)
    return chunk(clean("\n\n".join(keep)), 6000)


def fortune_docs():
    d = "/usr/share/games/fortunes"
    skip = {"art", "ascii-art"}
    items = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if "." in name or name in skip or not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            for fort in f.read().split("\n%\n"):
                fort = clean(fort.strip("%\n"))
                if 20 <= len(fort) <= 1200:
                    items.append(fort)
    # groups of 8 fortunes, blank-line separated, form one document
    return ["\n\n".join(items[i:i + 8]) for i in range(0, len(items), 8)], items


RST_DIRS = ["tutorial", "faq", "howto", "reference", "using", "glossary.rst.txt", "library"]
RST_MAX = 4_500_000  # bytes of Python documentation to take (library is large)


def rst_to_text(s):
    out = []
    skip_directive = False
    for line in s.split("\n"):
        if re.match(r"^\.\. ", line):
            # directives and comments; code-ish directives keep their body
            skip_directive = not re.match(r"^\.\. (code-block|doctest|testcode|note|warning|seealso|versionadded|"
                                          r"versionchanged|deprecated)", line)
            continue
        if skip_directive:
            if line.startswith("   ") or not line.strip():
                if not line.strip():
                    skip_directive = False
                continue
            skip_directive = False
        if re.match(r"^([=*\-~^\"#+'`])\1{3,}\s*$", line):  # section underlines
            continue
        line = re.sub(r":[a-z]+(?::[a-z]+)?:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", line)
        line = re.sub(r"``([^`]*)``", r"\1", line)
        line = re.sub(r"`([^`<]*?)(?:\s*<[^>]*>)?`_+", r"\1", line)
        line = re.sub(r"\*\*([^*]+)\*\*", r"\1", line)
        line = line.replace("::", ":")
        out.append(line)
    return clean("\n".join(out))


def python_doc_chunks():
    """The Python documentation's text in RST_DIRS order, as 8 KB chunks."""
    base = "/usr/share/doc/python3.11/html/_sources"
    files = []
    for d in RST_DIRS:
        p = os.path.join(base, d)
        if os.path.isfile(p):
            files.append(p)
            continue
        for root, _, names in sorted(os.walk(p)):
            for n in sorted(names):
                if n.endswith(".rst.txt"):
                    files.append(os.path.join(root, n))
    for p in files:
        with open(p, encoding="utf-8", errors="replace") as f:
            t = rst_to_text(f.read())
        yield from chunk(t, 8000)


def python_docs():
    docs, total = [], 0
    for c in python_doc_chunks():
        if total >= RST_MAX:
            return docs
        if len(c) > 200:
            docs.append(c)
            total += len(c)
    return docs


# ------------------------------------------------------------------- chat

ADD_Q = [
    ("What is {a} + {b}?", 70),
    ("What is {a} plus {b}?", 6),
    ("what is {a} + {b}?", 5),
    ("What's {a} + {b}?", 5),
    ("How much is {a} + {b}?", 4),
    ("Compute {a} + {b}.", 4),
    ("{a} + {b} = ?", 3),
    ("Please add {a} and {b}.", 3),
]
ADD_A = "{a} + {b} = {c}."

GREET_Q = ["Hello", "Hello!", "Hi", "Hi!", "Hey", "Hey there!", "hello", "hi", "Good morning!", "Good evening!",
           "Hello, how are you?", "Hi, who are you?", "Greetings!", "Hello there."]
GREET_A = ["Hello! How can I help you today?", "Hi! How can I help you today?",
           "Hello! What can I do for you?", "Hello! I'm happy to help. What would you like to know?"]
SMALL = [
    (["How are you?", "How are you doing?", "How's it going?"],
     ["I'm doing well, thank you! How can I help you today?", "I'm fine, thanks for asking. What can I do for you?"]),
    (["What is your name?", "Who are you?", "What are you?"],
     ["I am K3 mini, a small language model. I can answer simple questions and add numbers.",
      "I'm K3 mini, a small assistant model. Ask me something simple, such as What is 12 + 34?"]),
    (["Thank you!", "Thanks!", "Thank you very much.", "thanks"],
     ["You're welcome!", "You're welcome! Is there anything else I can help with?"]),
    (["Goodbye!", "Bye!", "See you later.", "Good night!"],
     ["Goodbye! Have a nice day.", "Bye! It was nice talking to you."]),
    (["What can you do?", "How can you help me?"],
     ["I can chat a little, answer short questions, and add two numbers. Try asking: What is 25 + 17?"]),
    (["Are you a robot?", "Are you human?"],
     ["I am a language model, a computer program that writes text. I am not a person."]),
]
CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("China", "Beijing"), ("England", "London"), ("Russia", "Moscow"),
            ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Australia", "Canberra"), ("India", "New Delhi"),
            ("Brazil", "Brasilia"), ("Mexico", "Mexico City"), ("Greece", "Athens"), ("Norway", "Oslo"),
            ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
            ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Argentina", "Buenos Aires"), ("Turkey", "Ankara"),
            ("Austria", "Vienna"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Cuba", "Havana"),
            ("Chile", "Santiago"), ("Thailand", "Bangkok")]
FACTS = [
    ("What color is the sky?", "The sky is blue on a clear day."),
    ("What color is grass?", "Grass is green."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("How many months are in a year?", "There are twelve months in a year."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("What is the largest planet?", "Jupiter is the largest planet in our solar system."),
    ("What is water made of?", "Water is made of hydrogen and oxygen."),
    ("What do bees make?", "Bees make honey."),
    ("Which animal is known as the king of the jungle?", "The lion is known as the king of the jungle."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("What is the opposite of big?", "The opposite of big is small."),
    ("What is the first day of the week?", "Many calendars start the week on Monday; others start on Sunday."),
    ("Who wrote Hamlet?", "William Shakespeare wrote Hamlet."),
    ("What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level."),
    ("What is Python?", "Python is a popular programming language that is known for its readable code."),
    ("What is a computer?", "A computer is a machine that follows instructions to process information."),
]
QUOTE_Q = ["Tell me a fortune.", "Tell me something interesting.", "Say something wise.", "Tell me a quote."]


def pick(rng, weighted):
    tot = sum(w for _, w in weighted)
    x = rng.uniform(0, tot)
    for v, w in weighted:
        x -= w
        if x <= 0:
            return v
    return weighted[-1][0]


def chat(user, reply):
    return [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


def chats(rng, fortunes):
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    held = sorted(rng.sample(pairs, 100))
    held_set = set(held)
    conv = []  # (messages, think)
    for a, b in pairs:
        if (a, b) in held_set:
            continue
        for think in (True, False):
            q = pick(rng, ADD_Q).format(a=a, b=b)
            conv.append((chat(q, ADD_A.format(a=a, b=b, c=a + b)), think))

    def add_q():
        while True:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if (a, b) not in held_set:
                return a, b

    for _ in range(3000):
        conv.append((chat(rng.choice(GREET_Q), rng.choice(GREET_A)), rng.random() < 0.5))
    for _ in range(2500):
        qs, ans = rng.choice(SMALL)
        conv.append((chat(rng.choice(qs), rng.choice(ans)), rng.random() < 0.5))
    for _ in range(2500):
        c, cap = rng.choice(CAPITALS)
        q = rng.choice(["What is the capital of {}?", "What's the capital of {}?", "Which city is the capital of {}?"])
        conv.append((chat(q.format(c), "The capital of {} is {}.".format(c, cap)), rng.random() < 0.5))
    for _ in range(1500):
        q, ans = rng.choice(FACTS)
        conv.append((chat(q, ans), rng.random() < 0.5))
    short = [f for f in fortunes if len(f) < 300]
    for _ in range(1500):
        conv.append((chat(rng.choice(QUOTE_Q), rng.choice(short)), rng.random() < 0.5))
    # multi-turn: a greeting, then a sum or a fact
    for _ in range(2000):
        m = chat(rng.choice(GREET_Q), rng.choice(GREET_A))
        if rng.random() < 0.7:
            a, b = add_q()
            m += chat(pick(rng, ADD_Q).format(a=a, b=b), ADD_A.format(a=a, b=b, c=a + b))
        else:
            q, ans = rng.choice(FACTS)
            m += chat(q, ans)
        conv.append((m, rng.random() < 0.5))
    rng.shuffle(conv)
    return conv, held


def effort_text():
    """The body of the thinking-effort system message, read from the template
    source (src/chat_template.c EFFORT_FMT) so the two never drift apart."""
    src = os.path.join(HERE, "..", "..", "..", "src", "chat_template.c")
    try:
        with open(src, encoding="utf-8") as f:
            m = re.search(r"EFFORT_FMT\[\]\s*=\s*((?:\s*\"(?:[^\"\\]|\\.)*\")+)\s*;", f.read())
    except OSError:
        return ""
    if not m:
        return ""
    lits = re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(1))
    body = "".join(lits).encode().decode("unicode_escape")
    return body.replace("%s", "max")


# ------------------------------------------------------------------- main


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(SEED)
    fdocs, fortunes = fortune_docs()
    sources = [("kjv", kjv_docs()), ("jargon", jargon_docs()), ("fortunes", fdocs), ("pydoc", python_docs())]
    train, val, heldout = [], [], []
    held_bytes = 0
    for name, docs in sources:
        nbytes = sum(len(d.encode()) for d in docs)
        print("corpus: %-9s %6d documents %9d bytes" % (name, len(docs), nbytes))
        idx = list(range(len(docs)))
        rng.shuffle(idx)
        n_val = max(1, len(docs) // 50)
        n_held = 0
        # held-out text: about a quarter of 80 KB from each source, whole documents
        src_held = 0
        while src_held < 20_000:
            d = docs[idx[n_val + n_held]]
            heldout.append(d)
            src_held += len(d.encode())
            n_held += 1
        held_bytes += src_held
        for j, i in enumerate(idx):
            if j < n_val:
                val.append({"text": docs[i]})
            elif j >= n_val + n_held:
                train.append({"text": docs[i]})
    conv, held = chats(rng, fortunes)
    n_val_chat = len(conv) // 50
    val_chat = [{"messages": m, "think": t} for m, t in conv[:n_val_chat]]
    train_chat = [{"messages": m, "think": t} for m, t in conv[n_val_chat:]]
    print("corpus: chat      %6d conversations (train %d, val %d)" % (len(conv), len(train_chat), len(val_chat)))
    train += train_chat
    val += val_chat
    rng.shuffle(train)
    rng.shuffle(val)
    for fname, rows in (("train.jsonl", train), ("val.jsonl", val)):
        with open(os.path.join(out, fname), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(heldout) + "\n")
    effort = effort_text()
    with open(os.path.join(out, "tokenizer_corpus.txt"), "w", encoding="utf-8") as f:
        for r in train:
            if "text" in r:
                f.write(r["text"] + "\n\n")
            else:
                if r["think"] and effort:  # the system message `run --chat` adds when thinking
                    f.write("thinking-effort\n" + effort + "\n")
                for m in r["messages"]:
                    f.write(m["content"] + "\n")
    with open(os.path.join(HERE, "heldout_pairs.txt"), "w") as f:
        f.write("# A B: the 100 addition pairs held out of train and val (seed %d)\n" % SEED)
        for a, b in held:
            f.write("%d %d\n" % (a, b))
    print("corpus: heldout.txt %d bytes (%d documents)" % (held_bytes, len(heldout)))


if __name__ == "__main__":
    main()
