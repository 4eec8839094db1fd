"""Synthetic span-copy rows shaped like a tool call's arguments (train.py --span-frac).

copy_check.py's rows copy a whole span right after <|sep|>. A tool argument is a span found INSIDE a
sentence, one of several, ended at the right id. Each example here is

    [BOS] prefix  (key_1 [conn] open v_1 close filler) .. (key_k [conn] open v_k close filler)  suffix
          <|sep|>  key_a v_a END  key_b v_b END ..  [EOS]

* k = 1..--max-values values; each v_i is 1..--max-len random non-special ids;
* prefix / filler / suffix / conn are random non-special ids ("a sentence");
* key_i is a random id that occurs exactly once before <|sep|>: the value is the span after it;
* the framing varies per example: "quote" (open = close = one random id, like "..."), "pair" (a random
  open id and a different random close id, the same for every value of the example) or "punct" (no open
  id; each value is closed by a boundary token: . , ? ! ) : ; \\n " and to in or; those ids never occur
  inside a value then), so the end must be read from the sentence;
* the answer lists the values in sentence order or (half of the examples) shuffled, each led by its key
  (teacher-forced, no loss) and closed by END (the id of '"', as in a JSON string);
* loss only on the copied ids and their END markers.

Stage I additions (defaults keep the stage-H generator and its held-out set exactly):
* a fourth framing, "word" (--modes ...,word:P): the value is ONE WORD of the tokenizer: a space-led
  letter id (` Bei`) then 0..2 letter ids without a space (`jing`); it is closed by the next word (a
  space-led id; 1 in 4 times a boundary token instead), so the end must be read from the word
  boundary, as in "weather in Beijing today"; no connector. Half the time (when the tokenizer has
  it) the copy starts with the same piece WITHOUT its space (`Bei`), as a JSON string value does;
* clean=True: a connector id only in the quote / pair framings (behind the key, before the open id);
  without an open id, a connector made the value's first id ambiguous (the connector or the value?).

Stage J addition (off by default: common=0 draws nothing extra, so the stage-I stream is unchanged):
* common=P (train.py --span-common-next P): in the "word" framing, with probability P the word that
  closes a value is a FREQUENT English word (` today`, ` doing`, ` worth`, ` now`, ` the`, ...; the
  space-led single ids of COMMON_WORDS), not a random one: the engine's run-ons (`Beijing today`,
  `GOOG doing`) end before a known word, and random next words rarely look like one. The fixed
  word-framing set with common next words (seed 30_013) is logged as "span-common eval".

Stage P addition (off unless the modes name it: without "spell" the streams above are unchanged):
* a fifth framing, "spell" (--modes ...,spell:P): the "word" framing as the JSON value really needs it. A
  request says ` Chicago` (ids ` Ch` `ic` `ago`), but the string value is tokenized without the space
  (`C` `hic` `ago`): only 425 of the tokenizer's 1,941 space-led letter ids have the same piece without
  the space, so the "word" framing's copy (the space-led id kept half the time, or swapped for its
  space-less twin) never showed the other 78 %. Here the word is a space-led letter piece of the form
  Upper*lower* (drawn uniformly from all of them, so every one is seen) and 0..2 lowercase pieces; the
  sentence holds its canonical tokenization WITH the space and the answer the canonical tokenization
  WITHOUT it (spell(): the tokenizer's byte-pair merges by rank, checked against the engine's tokenizer by
  `copy_span.py --check-spell`). The fixed set of seed 30_014 is logged as "span-spell eval".
* a sixth framing, "bare" (--modes ...,bare:P): the spelling table alone, ` W` <|sep|> W END, ~20 to a
  window (the space-led word, then the same word without the space); held-out set seed 30_015, logged
  as "span-bare eval".

Examples are packed into windows of T+1 ids like copy_check.make_windows (the rest is PAD) and returned
in the same form (x, mask, example id per target, number of examples), so copy_check.evaluate scores
them (token accuracy over values + END, full-copy = every value of the example right).
"""
import numpy as np
import torch

# boundary tokens of the k3-mini tokenizer (tiktoken ids): . , ? ! ) " : ; \n .\n and to in or
PUNCT = np.array([13, 11, 30, 0, 8, 1, 25, 26, 198, 325, 331, 339, 322, 510], dtype=np.int64)
END = 1  # '"'
MODES = ("quote", "pair", "punct", "word", "spell", "bare")
# train.py --span-recut: the "spell" and "bare" framings copy the word the way corpus_ids --recut-values writes a
# tool-call value: the first piece of the space-led word spelled without its space (its one-piece twin where the
# vocabulary has one), then the word's other pieces verbatim; off, the copy is the word's canonical cut
RECUT = False
DEFAULT_MODES = (0.35, 0.2, 0.45, 0.0)
_WORDS = None
_COMMON = None
_SPELL = None
COMMON_WORDS = """today doing worth now right please there here the a an is are was be to of in on at for with by
from and or but not this that these those it its my me your our their his her share shares stock price cost
costs trading market weather time folder directory file files tonight tomorrow morning evening week
again also too then so just still already very much many more most some any all what how when where which who
why do does did have has had will would can could should may might get got go going make like know think see
look find tell say said use used want need help thanks thank currently these days ago later soon yet first
last next new old good great big small long little same other only own up down out over under about into
through after before between during without""".split()


def word_ids():
    """(space-led letter ids, letter ids without a space, {space-led id: the same piece without its space})
    of the k3-mini tokenizer (models/k3-mini/tiktoken.model: base64 piece + id per line)"""
    global _WORDS
    if _WORDS is None:
        toks, inv = _pieces()
        start = sorted(i for i, t in toks.items() if len(t) > 1 and t[:1] == b" " and t[1:].isalpha())
        cont = sorted(i for i, t in toks.items() if t.isalpha())
        strip = {i: inv[toks[i][1:]] for i in start if toks[i][1:] in inv}
        _WORDS = (np.array(start, dtype=np.int64), np.array(cont, dtype=np.int64), strip)
    return _WORDS


def _pieces():
    """{id: bytes} and {bytes: id} of the k3-mini tokenizer"""
    import base64
    import os
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "k3-mini",
                        "tiktoken.model")
    toks = {}
    for line in open(path):
        b, r = line.split()
        toks[int(r)] = base64.b64decode(b)
    return toks, {t: i for i, t in toks.items()}


def spell_tables():
    """(space-led letter ids of the form ' ' Upper* lower*, lowercase letter ids, {bytes: id})"""
    global _SPELL
    if _SPELL is None:
        import re
        toks, inv = _pieces()
        pat = re.compile(rb"^ [A-Z]*[a-z]*$")
        start = sorted(i for i, t in toks.items() if len(t) > 2 and pat.match(t))
        low = sorted(i for i, t in toks.items() if re.match(rb"^[a-z]+$", t))
        _SPELL = (np.array(start, dtype=np.int64), np.array(low, dtype=np.int64), inv, toks)
    return _SPELL


def spell(data, inv):
    """canonical ids of ONE pre-token (bytes): byte-pair merges by rank, lowest first (tiktoken's rule)"""
    parts = [bytes([b]) for b in data]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = inv.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return [inv[p] for p in parts]


def copy_cut(src, w, inv, toks):
    """the ids of word w (bytes) written without its space, given src = spell(b" " + w): canonical, or with RECUT
    the first piece's text without the space spelled alone, then src[1:] as they are"""
    if not RECUT:
        return spell(w, inv)
    first = toks[int(src[0])]
    assert first[:1] == b" ", first
    return (spell(first[1:], inv) if len(first) > 1 else []) + list(src[1:])


def common_ids():
    """the space-led single ids of COMMON_WORDS (` today`, ` doing`, ...) in the k3-mini tokenizer"""
    global _COMMON
    if _COMMON is None:
        import base64
        import os
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "k3-mini",
                            "tiktoken.model")
        inv = {}
        for line in open(path):
            b, r = line.split()
            inv[base64.b64decode(b)] = int(r)
        _COMMON = np.array(sorted({inv[(" " + w).encode()] for w in COMMON_WORDS if (" " + w).encode() in inv}),
                           dtype=np.int64)
    return _COMMON


def parse_modes(text):
    """ "quote:0.25,pair:0.15,punct:0.2,word:0.4" -> probabilities in MODES order (normalised)"""
    if not text:
        return DEFAULT_MODES
    d = {}
    for q in text.split(","):
        k, v = q.split(":")
        if k.strip() not in MODES:
            raise ValueError("unknown span mode %r (one of %s)" % (k, MODES))
        d[k.strip()] = float(v)
    keys = MODES if d.get("spell", 0.0) + d.get("bare", 0.0) > 0 else MODES[:4]   # neither: the stream of before
    p = np.array([d.get(k, 0.0) for k in keys])
    return tuple(float(x) for x in p / p.sum())


def span_spec(c, min_len=1, max_len=6, max_values=3, modes=None, clean=False, common=0.0):
    """make_span_windows' arguments after (rng, nwin, T) for a text config c"""
    V = c["vocab_size"]
    spec = (V, min_len, max_len, max_values, c["bos_token_id"], V - 256 + 5, c["eos_token_id"],
            c["pad_token_id"])
    if (modes is None or tuple(modes) == DEFAULT_MODES) and not clean:
        return spec                      # the stage-H generator (same random stream)
    if not common:
        return spec + (tuple(modes or DEFAULT_MODES), bool(clean))   # the stage-I generator
    return spec + (tuple(modes or DEFAULT_MODES), bool(clean), float(common))


def _draw(rng, nsym, n, bad):
    """n random ids in 0..nsym-1 avoiding the ids in the set bad"""
    out = rng.integers(0, nsym, size=n)
    if bad:
        for i in range(n):
            while int(out[i]) in bad:
                out[i] = rng.integers(0, nsym)
    return out


def make_example(rng, nsym, lo, hi, max_values, bos, sep, eos, modes=None, clean=False, common=0.0):
    """-> ids (np int64), target mask over ids[1:] (float32, 1 = predicted id is a copied id or END)"""
    k = int(rng.integers(1, max_values + 1))
    if modes is None:
        mode = rng.choice(3, p=[0.35, 0.2, 0.45])  # quote, pair, punct (the stage-H stream)
    elif len(modes) == 4:
        mode = rng.choice(4, p=list(modes))        # quote, pair, punct, word
    else:
        mode = rng.choice(len(modes), p=list(modes))   # ..., spell, bare
    if mode == 3:
        return _word_example(rng, nsym, k, hi, bos, sep, eos, common)
    if mode == 4:
        return _spell_example(rng, nsym, k, hi, bos, sep, eos, common)
    if mode == 5:
        return _bare_example(rng, nsym, hi, sep)
    punct = set(int(p) for p in PUNCT)
    bad = {END}
    if mode == 0:
        q = int(_draw(rng, nsym, 1, punct | bad)[0])
        opn, cls = q, q
        bad |= {q}
    elif mode == 1:
        opn = int(_draw(rng, nsym, 1, punct | bad)[0])
        cls = int(_draw(rng, nsym, 1, punct | bad | {opn})[0])
        bad |= {opn, cls}
    else:
        opn, cls = None, None
        bad |= punct
    vals = [_draw(rng, nsym, int(rng.integers(lo, hi + 1)), bad) for _ in range(k)]
    keys = []
    used = set(bad)
    for v in vals:
        used |= set(int(t) for t in v)
    for _ in range(k):
        key = int(_draw(rng, nsym, 1, used)[0])
        used.add(key)
        keys.append(key)
    # filler: never a key (keys are unique in the sentence); punct ids allowed except inside values
    fill_bad = set(keys) | ({opn, cls} - {None}) | {END}
    sent = [bos]
    sent += list(_draw(rng, nsym, int(rng.integers(1, 7)), fill_bad))
    for i in range(k):
        sent.append(keys[i])
        if (not clean or opn is not None) and rng.random() < 0.5:
            sent += list(_draw(rng, nsym, 1, fill_bad))
        if opn is not None:
            sent.append(opn)
        sent += [int(t) for t in vals[i]]
        sent.append(cls if cls is not None else int(PUNCT[rng.integers(len(PUNCT))]))
        sent += list(_draw(rng, nsym, int(rng.integers(0, 5)), fill_bad))
    sent += list(_draw(rng, nsym, int(rng.integers(0, 4)), fill_bad))
    sent.append(sep)
    order = list(range(k))
    if rng.random() < 0.5:
        rng.shuffle(order)
    ids = list(sent)
    tgt = [0.0] * (len(ids) - 1)
    for i in order:
        ids.append(keys[i])
        tgt.append(0.0)           # predicting the key: no loss
        for t in vals[i]:
            ids.append(int(t))
            tgt.append(1.0)
        ids.append(END)
        tgt.append(1.0)
    ids.append(eos)
    tgt.append(0.0)
    return np.array(ids, dtype=np.int64), np.array(tgt, dtype=np.float32)


def _answer(rng, sent, keys, vals, outs, sep, eos):
    ids = list(sent) + [sep]
    tgt = [0.0] * (len(ids) - 1)
    order = list(range(len(keys)))
    if rng.random() < 0.5:
        rng.shuffle(order)
    for i in order:
        ids.append(keys[i])
        tgt.append(0.0)           # predicting the key: no loss
        for t in outs[i]:
            ids.append(int(t))
            tgt.append(1.0)
        ids.append(END)
        tgt.append(1.0)
    ids.append(eos)
    tgt.append(0.0)
    return np.array(ids, dtype=np.int64), np.array(tgt, dtype=np.float32)


def _word_example(rng, nsym, k, hi, bos, sep, eos, common=0.0):
    """the "word" framing: key, then a one-word value (space-led id + 0..2 letter ids), closed by the
    next word (a space-led id) or, 1 in 4, a boundary token; the copy drops the space half the time;
    common > 0: the next word is one of common_ids() with probability common (one extra draw per value)"""
    start, cont, strip = word_ids()
    start, cont = start[start < nsym], cont[cont < nsym]
    freq = (common_ids(), common) if common else None
    vals, outs = [], []
    used = {END}
    for _ in range(k):
        n = int(rng.integers(1, min(hi, 3) + 1))
        v = [int(start[rng.integers(len(start))])] + [int(cont[rng.integers(len(cont))]) for _ in range(n - 1)]
        vals.append(v)
        o = list(v)
        if v[0] in strip and rng.random() < 0.5:
            o[0] = strip[v[0]]
        outs.append(o)
    for v in vals:
        used |= set(v)
    keys, sent = _word_sentence(rng, nsym, vals, used, start, freq, bos)
    return _answer(rng, sent, keys, vals, outs, sep, eos)


def _word_sentence(rng, nsym, vals, used, nexts, freq, bos):
    """-> (keys, sentence) of the word framings: a fresh key per value (none in used), each value behind its
    key and closed by a next word (nexts; freq's with probability common when freq is given) or, 1 in 4, a
    boundary token, with random filler around"""
    keys = []
    for _ in range(len(vals)):
        key = int(_draw(rng, nsym, 1, used)[0])
        used.add(key)
        keys.append(key)
    fill_bad = set(keys) | {END}
    sent = [bos] + list(_draw(rng, nsym, int(rng.integers(1, 7)), fill_bad))
    for i in range(len(vals)):
        sent.append(keys[i])
        sent += vals[i]
        if rng.random() < 0.75:
            if freq is not None and rng.random() < freq[1]:
                sent.append(int(freq[0][rng.integers(len(freq[0]))]))
            else:
                sent.append(int(nexts[rng.integers(len(nexts))]))
        else:
            sent.append(int(PUNCT[rng.integers(len(PUNCT))]))
        sent += list(_draw(rng, nsym, int(rng.integers(0, 5)), fill_bad))
    sent += list(_draw(rng, nsym, int(rng.integers(0, 4)), fill_bad))
    return keys, sent


def _spell_example(rng, nsym, k, hi, bos, sep, eos, common=0.0):
    """the "spell" framing: as "word", but the word is written with its space in the sentence and copied
    without it, both in their canonical tokenization (the JSON string value's ids)"""
    start, low, inv, toks = spell_tables()
    start, low = start[start < nsym], low[low < nsym]
    wstart = word_ids()[0]
    wstart = wstart[wstart < nsym]
    freq = (common_ids(), common) if common else None
    vals, outs = [], []
    for _ in range(k):
        n = int(rng.integers(1, min(hi, 3) + 1))
        w = toks[int(start[rng.integers(len(start))])][1:] + b"".join(
            toks[int(low[rng.integers(len(low))])] for _ in range(n - 1))
        vals.append(spell(b" " + w, inv))
        outs.append(copy_cut(vals[-1], w, inv, toks))
    used = {END}
    for v in vals + outs:
        used |= set(v)
    keys, sent = _word_sentence(rng, nsym, vals, used, wstart, freq, bos)
    return _answer(rng, sent, keys, vals, outs, sep, eos)


def _spell_word(rng, hi):
    """(ids with the space, ids without it) of a random word: a space-led Upper*lower* piece + 0..2 lowercase"""
    start, low, inv, toks = spell_tables()
    w = toks[int(start[rng.integers(len(start))])][1:] + b"".join(
        toks[int(low[rng.integers(len(low))])] for _ in range(int(rng.integers(0, min(hi, 3)))))
    src = spell(b" " + w, inv)
    return src, copy_cut(src, w, inv, toks)


def _bare_example(rng, nsym, hi, sep):
    """the "bare" framing: the spelling table alone, `` Chicago`` <|sep|> ``Chicago`` END (no BOS, no key:
    a window packs ~20 of them); loss on the word without its space and END"""
    src, out = _spell_word(rng, hi)
    ids = list(src) + [sep] + list(out) + [END]
    tgt = [0.0] * len(src) + [1.0] * (len(out) + 1)
    return np.array(ids, dtype=np.int64), np.array(tgt, dtype=np.float32)


def make_span_windows(rng, nwin, T, V, lo, hi, max_values, bos, sep, eos, pad, modes=None, clean=False, common=0.0):
    """-> x [nwin, T+1] int64, mask [nwin, T], seqid [nwin, T] (-1 where no target), number of examples"""
    nsym = V - 256
    x = np.full((nwin, T + 1), pad, dtype=np.int64)
    m = np.zeros((nwin, T), dtype=np.float32)
    sid = np.full((nwin, T), -1, dtype=np.int64)
    kx = 0
    for w in range(nwin):
        p = 0
        while True:
            ids, tg = make_example(rng, nsym, lo, hi, max_values, bos, sep, eos, modes, clean, common)
            L = len(ids)
            if p + L > T + 1:
                if p == 0:
                    raise ValueError("window too short for a span example")
                break
            x[w, p:p + L] = ids
            # target at t predicts x[t+1]; tg[j] belongs to predicting ids[j+1]
            m[w, p:p + L - 1] = tg
            sid[w, p:p + L - 1][tg > 0] = kx
            kx += 1
            p += L
    return torch.from_numpy(x), torch.from_numpy(m), torch.from_numpy(sid), kx


def heldout_set(spec, T, windows):
    """the fixed held-out span set (seed 30_011; training draws from train.py's seed + 39_000); always the
    stage-H generator (spec[:8]), so its numbers compare across stages"""
    return make_span_windows(np.random.default_rng(30_011), windows, T, *spec[:8])


def heldout_word_set(spec, T, windows):
    """a fixed held-out set of the "word" framing only (seed 30_012)"""
    return make_span_windows(np.random.default_rng(30_012), windows, T, *spec[:8], (0.0, 0.0, 0.0, 1.0), True)


def heldout_common_set(spec, T, windows):
    """a fixed held-out set of the "word" framing whose next words are all frequent words (seed 30_013)"""
    return make_span_windows(np.random.default_rng(30_013), windows, T, *spec[:8], (0.0, 0.0, 0.0, 1.0), True, 1.0)


def heldout_spell_set(spec, T, windows):
    """a fixed held-out set of the "spell" framing only (seed 30_014)"""
    return make_span_windows(np.random.default_rng(30_014), windows, T, *spec[:8], (0.0, 0.0, 0.0, 0.0, 1.0), True,
                             0.5)


def heldout_bare_set(spec, T, windows):
    """a fixed held-out set of the "bare" framing only (seed 30_015)"""
    return make_span_windows(np.random.default_rng(30_015), windows, T, *spec[:8], (0.0, 0.0, 0.0, 0.0, 0.0, 1.0), True)


def check_spell(model_dir, n, seed):
    """spell() against the engine's tokenizer (deltafin tokenize) on n random words of the spell framing"""
    import subprocess
    start, low, inv, toks = spell_tables()
    rng = np.random.default_rng(seed)
    words = []
    for _ in range(n):
        w = toks[int(start[rng.integers(len(start))])][1:] + b"".join(
            toks[int(low[rng.integers(len(low))])] for _ in range(int(rng.integers(0, 3))))
        words.append(w.decode())
    bad = 0
    for w in words:
        for text in (" " + w, w):
            out = subprocess.run(["./build/deltafin", "tokenize", "--model", model_dir, text],
                                 capture_output=True, text=True, check=True).stdout.split()
            got = [int(x) for x in out[-1].split(",")]
            if got != spell(text.encode(), inv):
                bad += 1
                print("differs: %r engine %s spell %s" % (text, got, spell(text.encode(), inv)))
    print("check-spell: %d words, %d tokenizations differ" % (n, bad))
    return bad


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 1 and sys.argv[1] == "--check-spell":
        sys.exit(1 if check_spell("models/k3-mini", int(sys.argv[2]) if len(sys.argv) > 2 else 200, 7) else 0)
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids, tg = make_example(rng, 3840, 1, 6, 3, 3840, 3845, 3842)
        print(list(ids))
        print([int(ids[j + 1]) for j in range(len(tg)) if tg[j] > 0])
    x, m, sid, k = make_span_windows(rng, 4, 512, 4096, 1, 6, 3, 3840, 3845, 3842, 4095)
    print(x.shape, m.sum().item(), k, (sid >= 0).sum().item())
