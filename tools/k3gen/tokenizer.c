/*
 * k3gen tokenizer: trains a byte-level BPE vocabulary and writes it as
 * tiktoken.model (base64 bytes + rank) and tokenizer_config.json (the 256
 * reserved/special ids, spelled as in K3 / k3-tiny-a).
 * Invariants:
 *  - the tokenizer depends only on vocab_size (and --tokenizer-corpus): ranks
 *    0..255 = bytes in GPT-2 order, then BPE merges (XTML words first, each a
 *    single token once V >= ~570), then filler concatenations of two existing
 *    tokens; all byte strings are unique.
 *  - merges follow tiktoken semantics (lowest-rank adjacent pair first), over
 *    a simplified K3 pre-tokenizer; digits stay single-byte tokens when
 *    training on a corpus file.
 * The GGUF writer reuses the vocabulary (build_vocab) for its tokenizer keys.
 */
#include "k3gen.h"

static uint64_t bytes_hash(const unsigned char *p, int n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

const unsigned char *vocab_bytes(const vocab *v, int id) { return v->data + v->off[id]; }

int vocab_find(const vocab *v, const unsigned char *p, int n)
{
    size_t mask = v->ht_cap - 1, i = bytes_hash(p, n) & mask;
    for (;; i = (i + 1) & mask) {
        int id = v->ht[i];
        if (id < 0)
            return -1;
        if (v->len[id] == n && !memcmp(vocab_bytes(v, id), p, (size_t)n))
            return id;
    }
}

static int vocab_add(vocab *v, const unsigned char *p, int n)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 1024;
        v->off = xrealloc(v->off, (size_t)v->cap * sizeof *v->off);
        v->len = xrealloc(v->len, (size_t)v->cap * sizeof *v->len);
    }
    if ((size_t)(v->n + 1) * 2 > v->ht_cap) {
        size_t cap = v->ht_cap ? v->ht_cap * 2 : 4096;
        free(v->ht);
        v->ht = xmalloc(cap * sizeof *v->ht);
        v->ht_cap = cap;
        memset(v->ht, 0xff, cap * sizeof *v->ht);
        for (int id = 0; id < v->n; id++) {
            size_t i = bytes_hash(vocab_bytes(v, id), v->len[id]) & (cap - 1);
            while (v->ht[i] >= 0)
                i = (i + 1) & (cap - 1);
            v->ht[i] = id;
        }
    }
    if (v->data_len + (size_t)n > v->data_cap) {
        v->data_cap = (v->data_cap ? v->data_cap : 65536);
        while (v->data_len + (size_t)n > v->data_cap)
            v->data_cap *= 2;
        v->data = xrealloc(v->data, v->data_cap);
    }
    memcpy(v->data + v->data_len, p, (size_t)n);
    int id = v->n++;
    v->off[id] = v->data_len;
    v->len[id] = n;
    v->data_len += (size_t)n;
    size_t i = bytes_hash(p, n) & (v->ht_cap - 1);
    while (v->ht[i] >= 0)
        i = (i + 1) & (v->ht_cap - 1);
    v->ht[i] = id;
    return id;
}

/* id of the concatenation of tokens a and b, or -1 */
int vocab_find_pair(const vocab *v, int a, int b, unsigned char *scratch)
{
    memcpy(scratch, vocab_bytes(v, a), (size_t)v->len[a]);
    memcpy(scratch + v->len[a], vocab_bytes(v, b), (size_t)v->len[b]);
    return vocab_find(v, scratch, v->len[a] + v->len[b]);
}

/* tiktoken semantics: repeatedly merge the adjacent pair whose concatenation
 * has the lowest rank (leftmost on ties). Returns the token count. */
static int bpe_encode(const vocab *v, const unsigned char *p, int n, int *out,
                      unsigned char *scratch)
{
    for (int i = 0; i < n; i++)
        out[i] = vocab_find(v, p + i, 1);
    int m = n;
    for (;;) {
        int best = -1, best_id = -1;
        for (int i = 0; i + 1 < m; i++) {
            int id = vocab_find_pair(v, out[i], out[i + 1], scratch);
            if (id >= 0 && (best_id < 0 || id < best_id)) {
                best_id = id;
                best = i;
            }
        }
        if (best < 0)
            return m;
        out[best] = best_id;
        memmove(out + best + 1, out + best + 2, (size_t)(m - best - 2) * sizeof *out);
        m--;
    }
}

typedef struct {
    int *toks;
    int n;
    long count;
} bpe_word;

typedef struct {
    bpe_word *w;
    int n, cap;
} word_set;

/* Each piece becomes a word (merged with an existing identical one). */
typedef struct {
    unsigned char **s;
    int *len;
    long *count;
    int n, cap;
    int *ht;
    size_t ht_cap;
} piece_map;

static void piece_add(piece_map *pm, const unsigned char *p, int n, long count)
{
    if ((size_t)(pm->n + 1) * 2 > pm->ht_cap) {
        size_t cap = pm->ht_cap ? pm->ht_cap * 2 : 1024;
        free(pm->ht);
        pm->ht = xmalloc(cap * sizeof *pm->ht);
        memset(pm->ht, 0xff, cap * sizeof *pm->ht);
        pm->ht_cap = cap;
        for (int k = 0; k < pm->n; k++) {
            size_t i = bytes_hash(pm->s[k], pm->len[k]) & (cap - 1);
            while (pm->ht[i] >= 0)
                i = (i + 1) & (cap - 1);
            pm->ht[i] = k;
        }
    }
    size_t mask = pm->ht_cap - 1, i = bytes_hash(p, n) & mask;
    for (;; i = (i + 1) & mask) {
        int k = pm->ht[i];
        if (k < 0)
            break;
        if (pm->len[k] == n && !memcmp(pm->s[k], p, (size_t)n)) {
            pm->count[k] += count;
            return;
        }
    }
    if (pm->n == pm->cap) {
        pm->cap = pm->cap ? pm->cap * 2 : 1024;
        pm->s = xrealloc(pm->s, (size_t)pm->cap * sizeof *pm->s);
        pm->len = xrealloc(pm->len, (size_t)pm->cap * sizeof *pm->len);
        pm->count = xrealloc(pm->count, (size_t)pm->cap * sizeof *pm->count);
    }
    pm->s[pm->n] = xmalloc((size_t)n);
    memcpy(pm->s[pm->n], p, (size_t)n);
    pm->len[pm->n] = n;
    pm->count[pm->n] = count;
    pm->ht[i] = pm->n++;
}

/* Character classes of the simplified pre-tokenizer. */
enum { C_LET, C_HAN, C_DIG, C_SP, C_NL, C_PUN };

static int cp_class(uint32_t cp)
{
    if (cp < 0x80) {
        if ((unsigned)((cp | 32) - 'a') < 26u)
            return C_LET;
        if ((unsigned)(cp - '0') < 10u)
            return C_DIG;
        if (cp == '\n' || cp == '\r')
            return C_NL;
        if (cp == ' ' || (cp >= '\t' && cp <= '\r'))
            return C_SP;
        return C_PUN;
    }
    if ((cp >= 0x80 && cp <= 0xbf) || cp == 0xd7 || cp == 0xf7 || (cp >= 0x2000 && cp <= 0x206f) ||
        (cp >= 0x3000 && cp <= 0x303f) || (cp >= 0xff00 && cp <= 0xff0f) ||
        (cp >= 0xff1a && cp <= 0xff20) || (cp >= 0xff3b && cp <= 0xff40) ||
        (cp >= 0xff5b && cp <= 0xff65))
        return C_PUN;
    if ((cp >= 0x3400 && cp <= 0x4dbf) || (cp >= 0x4e00 && cp <= 0x9fff) ||
        (cp >= 0xf900 && cp <= 0xfaff))
        return C_HAN;
    return C_LET;
}

/* Decode one UTF-8 code point at s (n bytes left); invalid bytes decode as
 * themselves (class punctuation) with length 1. */
static int utf8_decode(const unsigned char *s, int n, uint32_t *cp)
{
    int k = s[0] < 0x80 ? 0 : (s[0] & 0xe0) == 0xc0 ? 1 : (s[0] & 0xf0) == 0xe0 ? 2
                                                     : (s[0] & 0xf8) == 0xf0 ? 3 : -1;
    if (k < 0 || k >= n) {
        *cp = k == 0 ? s[0] : 0x80; /* 0x80 classifies as punctuation */
        return 1;
    }
    uint32_t v = k == 0 ? s[0] : (uint32_t)(s[0] & (0x3f >> k));
    for (int j = 1; j <= k; j++) {
        if ((s[j] & 0xc0) != 0x80) {
            *cp = 0x80;
            return 1;
        }
        v = (v << 6) | (s[j] & 0x3fu);
    }
    *cp = v;
    return k + 1;
}

/* Simplified K3 pre-tokenizer over code points: Han runs; [x]letters (x any
 * single non-letter non-digit non-newline char); digits{1,3}; [ ]punct+[\r\n]*;
 * \s*[\r\n]+; space runs (leaving the last one to start the next piece). */
static void split_text(piece_map *pm, const char *text, long weight, int skip_digits)
{
    const unsigned char *s = (const unsigned char *)text;
    int n = (int)strlen(text), m = 0;
    int *pos = xmalloc((size_t)(n + 1) * sizeof *pos), *cls = xmalloc((size_t)(n + 1) * sizeof *cls);
    for (int i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_decode(s + i, n - i, &cp);
        pos[m] = i;
        cls[m++] = cp_class(cp);
        i += l;
    }
    pos[m] = n;
    cls[m] = -1;
    for (int i = 0; i < m;) {
        int j = i + 1, c = cls[i];
        if (c == C_LET || c == C_HAN) {
            while (j < m && cls[j] == c)
                j++;
        } else if (c != C_DIG && c != C_NL && cls[i + 1] == C_LET) {
            while (j < m && cls[j] == C_LET)
                j++;
        } else if (c == C_DIG) {
            while (j < m && j - i < 3 && cls[j] == C_DIG)
                j++;
        } else if (c == C_PUN || (s[pos[i]] == ' ' && cls[i + 1] == C_PUN)) {
            while (j < m && cls[j] == C_PUN)
                j++;
            while (j < m && cls[j] == C_NL)
                j++;
        } else { /* whitespace */
            while (j < m && (cls[j] == C_SP || cls[j] == C_NL))
                j++;
            int last_nl = -1;
            for (int k = i; k < j; k++)
                if (cls[k] == C_NL)
                    last_nl = k;
            if (last_nl >= 0)
                j = last_nl + 1;
            else if (j < m && j - i > 1)
                j--;
        }
        if (!(skip_digits && c == C_DIG))
            piece_add(pm, s + pos[i], pos[j] - pos[i], weight);
        i = j;
    }
    free(pos);
    free(cls);
}

/* Built-in training corpus: English, code, numbers, CJK, XTML chat renders. */
static const char *const corpus[] = {
    "The quick brown fox jumps over the lazy dog. The lazy dog sleeps in the sun, and the "
    "quick fox runs into the forest. Every morning the model reads a message, thinks about "
    "the question, and writes a response for the user.\n\n",
    "A tokenizer splits text into tokens. Byte-level BPE starts from the 256 single bytes "
    "and repeatedly merges the most frequent adjacent pair. The merged pair becomes a new "
    "token with the next rank, so common words such as the, and, of, to, in, is, it and "
    "that end up as single tokens, while rare words are split into several pieces.\n\n",
    "Mixture-of-experts models route every token to a small number of experts. The router "
    "computes a score for each expert, selects the top experts, and mixes their outputs. "
    "Linear attention keeps a recurrent state instead of a growing cache, which makes long "
    "context cheap. Kimi uses delta-rule attention with a gated decay, and a few full "
    "attention layers with latent keys and values.\n\n",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness. There were a king with a large jaw and a queen with a plain "
    "face, on the throne of England. In both countries it was clearer than crystal to the "
    "lords of the State preserves of loaves and fishes, that things in general were settled "
    "for ever.\n\n",
    "Please summarize the following document in three sentences. What is the capital of "
    "France? The capital of France is Paris. How many legs does a spider have? A spider has "
    "eight legs. Can you help me write a function that sorts a list of numbers? Sure, here "
    "is a simple example that you can adapt to your needs.\n\n",
    "Hello, world! Hello again, world. I'm sure it's fine; we'll see what they've done, and "
    "you'd know if I'd said it. Don't worry: it isn't broken, it's just slow.\n",
    "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n    for (int i = 0; i < argc; "
    "i++)\n        printf(\"%d: %s\\n\", i, argv[i]);\n    return 0;\n}\n\n",
    "static float dot(const float *a, const float *b, size_t n)\n{\n    float s = 0.0f;\n"
    "    for (size_t i = 0; i < n; i++)\n        s += a[i] * b[i];\n    return s;\n}\n\n",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\n\nclass Tokenizer:\n    def __init__(self, path):\n        self.ranks = "
    "load(path)\n\n    def encode(self, text):\n        return [self.ranks[t] for t in "
    "split(text)]\n\n",
    "import json\nwith open(\"config.json\") as f:\n    config = json.load(f)\nprint(config["
    "\"hidden_size\"], config[\"num_hidden_layers\"])\n\n",
    "for (let i = 0; i < items.length; i++) { console.log(items[i].name, items[i].value); "
    "}\nconst result = await fetch(url, { method: \"POST\", body: JSON.stringify(data) });\n\n",
    "The year 2024 had 366 days. Pi is about 3.14159265358979, and e is about "
    "2.718281828. The population grew from 1,234,567 to 7,654,321 between 1990 and 2020. "
    "Call 555-0123 before 10:30 on 12/31/2025. The answer is 42, not 41 or 43. Version "
    "1.2.3 fixed 17 bugs; 100% of tests pass in 0.25 seconds.\n",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 100 128 256 512 1000 1024 2048 4096 "
    "8192 16384 32768 65536 1000000\n\n",
    "今天天气很好，我们一起去公园散步吧。机器学习模型可以理解自然语言。"
    "人工智能正在改变世界。中国的首都是北京。\n\n",
    "こんにちは、世界。東京は日本の首都です。私は毎朝コーヒーを飲みます。"
    "ありがとうございます。\n\n",
    "Voilà un café très élégant à côté de la gare. Über die Brücke gehen wir schnell. "
    "El niño está en la playa. Привет, мир!\n\n",
    "message role=\"system\" type=\"thinking-effort\"\nmessage role=\"user\"\nmessage "
    "role=\"assistant\"\nthink\nresponse\nmessage role=\"tool\" tool=\"get_weather\" "
    "index=\"1\"\ntools\ncall tool=\"get_weather\" index=\"1\"\nargument key=\"city\" "
    "type=\"string\"\nargument key=\"days\" type=\"number\"\njson type=\"object\"\n\n",
    "message role=\"system\" type=\"tool-declare\"\n# Tools\nHere are the available tools, "
    "described in JSONSchema.\n\n```json\n{\"name\":\"get_weather\",\"parameters\":"
    "{\"properties\":{\"city\":{\"type\":\"string\"}},\"type\":\"object\"}}\n```\n\n",
    "`thinking_effort` guides on how much to think in your thinking channel (not including "
    "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=max`.\n\n",
    "message role=\"user\"\nWhat is the weather in Paris today?\nmessage role=\"assistant\"\n"
    "think\nThe user wants the weather, so I should call the tool.\nresponse\nLet me check "
    "the weather for you.\ntools\ncall tool=\"get_weather\" index=\"1\"\nargument "
    "key=\"city\" type=\"string\"\nParis\nmessage role=\"tool\" tool=\"get_weather\" "
    "index=\"1\"\n{\"temperature\": 18, \"sky\": \"cloudy\"}\nmessage role=\"assistant\"\n"
    "response\nIt is 18 degrees and cloudy in Paris.\n\n",
};

/* Forms that must each end up as a single token (phase 1 of training). */
static const char *const xtml_words[] = {
    "message", "role", "system", "user", "assistant", "think", "response", "tool",
    "tools", "call", "argument", "type", " role", " type", " tool",
};
#define N_XTML (sizeof xtml_words / sizeof xtml_words[0])

/* Pair-count table, cleared via the list of used slots. */
typedef struct {
    uint64_t *key;
    long *cnt;
    size_t cap;
    size_t *used;
    size_t nused;
} pair_table;

static void pair_table_init(pair_table *pt, size_t min_cap)
{
    size_t cap = 1024;
    while (cap < min_cap * 2)
        cap *= 2;
    pt->cap = cap;
    pt->key = xmalloc(cap * sizeof *pt->key);
    pt->cnt = xmalloc(cap * sizeof *pt->cnt);
    pt->used = xmalloc(cap * sizeof *pt->used);
    memset(pt->key, 0xff, cap * sizeof *pt->key);
    pt->nused = 0;
}

static void pair_table_free(pair_table *pt)
{
    free(pt->key);
    free(pt->cnt);
    free(pt->used);
}

static void pair_table_clear(pair_table *pt)
{
    for (size_t k = 0; k < pt->nused; k++)
        pt->key[pt->used[k]] = UINT64_MAX;
    pt->nused = 0;
}

static void pair_table_addc(pair_table *pt, uint64_t key, long c)
{
    size_t mask = pt->cap - 1, i = (size_t)((key * 0x9e3779b97f4a7c15ULL) >> 20) & mask;
    for (;; i = (i + 1) & mask) {
        if (pt->key[i] == key) {
            pt->cnt[i] += c;
            return;
        }
        if (pt->key[i] == UINT64_MAX) {
            pt->key[i] = key;
            pt->cnt[i] = c;
            pt->used[pt->nused++] = i;
            return;
        }
    }
}

/* Train merges on the words of pm until no pair is left (returns 1) or the
 * vocabulary holds `target` tokens (returns 0). */
static int bpe_train(vocab *v, const piece_map *pm, int target, unsigned char *scratch)
{
    int total_syms = 0, maxlen = 1;
    for (int k = 0; k < pm->n; k++) {
        total_syms += pm->len[k];
        if (pm->len[k] > maxlen)
            maxlen = pm->len[k];
    }
    bpe_word *w = xmalloc((size_t)pm->n * sizeof *w);
    int *store = xmalloc((size_t)total_syms * sizeof *store);
    for (int k = 0, pos = 0; k < pm->n; k++) {
        w[k].toks = store + pos;
        w[k].n = bpe_encode(v, pm->s[k], pm->len[k], w[k].toks, scratch);
        w[k].count = pm->count[k];
        pos += pm->len[k];
    }
    pair_table pt;
    pair_table_init(&pt, (size_t)total_syms + 16);
    int exhausted = 0;
    while (v->n < target) {
        pair_table_clear(&pt);
        for (int k = 0; k < pm->n; k++)
            for (int i = 0; i + 1 < w[k].n; i++)
                pair_table_addc(&pt, ((uint64_t)w[k].toks[i] << 32) | (uint32_t)w[k].toks[i + 1],
                                w[k].count);
        if (pt.nused == 0) {
            exhausted = 1;
            break;
        }
        uint64_t best = UINT64_MAX;
        long best_cnt = 0;
        for (size_t k = 0; k < pt.nused; k++) {
            size_t i = pt.used[k];
            if (pt.cnt[i] > best_cnt || (pt.cnt[i] == best_cnt && pt.key[i] < best)) {
                best = pt.key[i];
                best_cnt = pt.cnt[i];
            }
        }
        int a = (int)(best >> 32), b = (int)(best & 0xffffffffu);
        int c = vocab_find_pair(v, a, b, scratch);
        if (c < 0)
            c = vocab_add(v, scratch, v->len[a] + v->len[b]);
        for (int k = 0; k < pm->n; k++) {
            int *t = w[k].toks, m = 0;
            for (int i = 0; i < w[k].n; i++) {
                if (i + 1 < w[k].n && t[i] == a && t[i + 1] == b) {
                    t[m++] = c;
                    i++;
                } else {
                    t[m++] = t[i];
                }
            }
            w[k].n = m;
        }
    }
    pair_table_free(&pt);
    free(store);
    free(w);
    return exhausted;
}

static void piece_map_free(piece_map *pm)
{
    for (int k = 0; k < pm->n; k++)
        free(pm->s[k]);
    free(pm->s);
    free(pm->len);
    free(pm->count);
    free(pm->ht);
    memset(pm, 0, sizeof *pm);
}

/* 1: token is [A-Za-z]+, 2: token is ' '[A-Za-z]+, 0: anything else */
static int word_token_kind(const unsigned char *p, int n)
{
    int start = p[0] == ' ' ? 1 : 0;
    if (n <= start)
        return 0;
    for (int i = start; i < n; i++)
        if ((unsigned)((p[i] | 32) - 'a') >= 26u)
            return 0;
    return start ? 2 : 1;
}

/* --tokenizer-corpus FILE: phase 2 trains on FILE instead of the built-in
 * corpus.  The file is pre-tokenized a paragraph at a time (cut after a blank
 * line that is followed by a non-space character, so no piece spans a cut).
 * Digit runs are left out of training: digits stay single-byte tokens, so
 * numbers are spelled digit by digit (what arithmetic wants). */
const char *g_tok_corpus;

static void split_corpus_file(piece_map *pm, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("--tokenizer-corpus %s: %s", path, strerror(errno));
    sbuf sb = {0};
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        sb_addn(&sb, buf, n);
    if (ferror(f))
        die("--tokenizer-corpus %s: read error", path);
    fclose(f);
    sb_addn(&sb, "", 1); /* NUL terminator */
    char *p = sb.buf, *end = sb.buf + sb.len - 1;
    long n_par = 0;
    while (p < end) {
        char *q = p;
        for (;;) {
            q = strstr(q, "\n\n");
            if (!q || q + 2 >= end || (q[2] != ' ' && q[2] != '\n' && q[2] != '\r' && q[2] != '\t'))
                break;
            q++;
        }
        char *cut = q ? q + 2 : end, save = *cut;
        *cut = 0;
        split_text(pm, p, 1, 1);
        *cut = save;
        p = cut;
        n_par++;
    }
    fprintf(stderr, "k3gen: tokenizer corpus %s: %zu bytes, %ld paragraphs, %d distinct pieces\n", path,
            sb.len - 1, n_par, pm->n);
    free(sb.buf);
}

/* A vocabulary read from a tiktoken.model file (base64 bytes, rank; ranks
 * 0..n-1 in order): 0 and v filled, or -1 when the file is absent. */
int load_vocab_tiktoken(vocab *v, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int rank_want = 0;
    while (fgets(line, sizeof line, f)) {
        char *sp = strchr(line, ' ');
        if (!sp) die("%s: a line without a rank", path);
        *sp = 0;
        unsigned char bytes[3072];
        int n = 0;
        unsigned acc = 0, bits = 0;
        for (const char *p = line; *p && *p != '='; p++) {
            const char *al = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            const char *q = strchr(al, *p);
            if (!q) die("%s: not base64: %s", path, line);
            acc = acc << 6 | (unsigned)(q - al);
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                if (n < (int)sizeof bytes) bytes[n++] = (unsigned char)(acc >> bits);
                acc &= (1u << bits) - 1;
            }
        }
        if (atoi(sp + 1) != rank_want) die("%s: rank %d where %d was expected", path, atoi(sp + 1), rank_want);
        vocab_add(v, bytes, n);
        rank_want++;
    }
    fclose(f);
    return 0;
}

void build_vocab(vocab *v, long vocab_size)
{
    const int target = (int)(vocab_size - 256);
    unsigned char *scratch = xmalloc(1 << 16);
    /* ranks 0..255: single bytes in GPT-2 order */
    for (int b = 0x21; b <= 0x7e; b++)
        vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    for (int b = 0xa1; b <= 0xac; b++)
        vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    for (int b = 0xae; b <= 0xff; b++)
        vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    for (int b = 0; b <= 0xff; b++)
        if (vocab_find(v, (unsigned char[]){(unsigned char)b}, 1) < 0)
            vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    if (v->n != 256)
        die("internal: byte alphabet has %d entries", v->n);

    /* phase 1: XTML words, so they are single tokens even in tiny vocabularies */
    piece_map pm = {0};
    for (size_t i = 0; i < N_XTML; i++)
        piece_add(&pm, (const unsigned char *)xtml_words[i], (int)strlen(xtml_words[i]), 1);
    int xtml_done = bpe_train(v, &pm, target, scratch);
    piece_map_free(&pm);

    /* phase 2: the corpus */
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++)
        if (!g_tok_corpus)
            split_text(&pm, corpus[i], 1, 0);
    if (g_tok_corpus)
        split_corpus_file(&pm, g_tok_corpus);
    bpe_train(v, &pm, target, scratch);
    piece_map_free(&pm);

    /* phase 3: filler tokens = concatenation of an existing token matching
     * ` ?[A-Za-z]+` and one matching `[A-Za-z]+` (so the pre-tokenizer can
     * produce them), never duplicating a string */
    int *pool = xmalloc((size_t)target * sizeof *pool), npool = 0;
    int *tail = xmalloc((size_t)target * sizeof *tail), ntail = 0;
    for (int id = 0; id < v->n; id++) {
        int kind = word_token_kind(vocab_bytes(v, id), v->len[id]);
        if (kind)
            pool[npool++] = id;
        if (kind == 1)
            tail[ntail++] = id;
    }
    rng r;
    rng_seed(&r, 0x6b3367656e746f6bULL, "filler");
    int maxlen = 12, fails = 0;
    while (v->n < target) {
        int a = pool[rng_next(&r) % (uint64_t)npool];
        int b = tail[rng_next(&r) % (uint64_t)ntail];
        int n = v->len[a] + v->len[b];
        if (n > maxlen || vocab_find_pair(v, a, b, scratch) >= 0) {
            if (++fails > 10000) {
                maxlen += 4;
                fails = 0;
            }
            continue;
        }
        fails = 0;
        int id = vocab_add(v, scratch, n);
        pool[npool++] = id;
        if (scratch[0] != ' ')
            tail[ntail++] = id;
    }
    free(pool);
    free(tail);

    /* invariant: every XTML form encodes to exactly one token (when the
     * vocabulary has room for the ~50 merges that takes) */
    int ids[64];
    if (!xtml_done)
        fprintf(stderr, "k3gen: note: vocab_size %ld leaves only %ld BPE merges; the XTML "
                        "words are not single tokens\n", vocab_size, vocab_size - 512);
    for (size_t i = 0; xtml_done && i < N_XTML; i++) {
        const char *wd = xtml_words[i];
        int m = bpe_encode(v, (const unsigned char *)wd, (int)strlen(wd), ids, scratch);
        if (m != 1)
            die("internal: XTML word \"%s\" encodes to %d tokens", wd, m);
    }
    free(scratch);
}

static void b64_append(sbuf *sb, const unsigned char *p, int n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char o[4];
    for (int i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            x |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            x |= p[i + 2];
        o[0] = tab[(x >> 18) & 63];
        o[1] = tab[(x >> 12) & 63];
        o[2] = i + 1 < n ? tab[(x >> 6) & 63] : '=';
        o[3] = i + 2 < n ? tab[x & 63] : '=';
        sb_addn(sb, o, 4);
    }
}

/* Spellings of the reserved ids, by offset from V-256 (as in K3 / k3-tiny-a). */
const special_token special_tokens[] = {
    {0, "[BOS]"},           {1, "[EOS]"},           {2, "<|end_of_msg|>"},
    {3, "<|open|>"},        {4, "<|close|>"},       {5, "<|sep|>"},
    {6, "[start_header_id]"}, {7, "[end_header_id]"}, {9, "[EOT]"},
    {18, "<|media_begin|>"}, {19, "<|media_content|>"}, {20, "<|media_end|>"},
    {21, "<|media_pad|>"},  {65, "<osagent_mode>"}, {254, "[UNK]"},
    {255, "[PAD]"},
};
const size_t n_special_tokens = sizeof special_tokens / sizeof special_tokens[0];

int write_tokenizer(const char *dir, long V)
{
    vocab v = {0};
    build_vocab(&v, V);
    sbuf sb = {0};
    for (int id = 0; id < v.n; id++) {
        b64_append(&sb, vocab_bytes(&v, id), v.len[id]);
        sb_printf(&sb, " %d\n", id);
    }
    write_text_file(dir, "tiktoken.model", sb.buf, sb.len);
    sb.len = 0;

    sb_add(&sb, "{\n  \"added_tokens_decoder\": {\n");
    for (int off = 0; off < 256; off++) {
        long id = V - 256 + off;
        char spelling[64];
        snprintf(spelling, sizeof spelling, "<|reserved_token_%ld|>", id);
        for (size_t k = 0; k < n_special_tokens; k++)
            if (special_tokens[k].off == off)
                snprintf(spelling, sizeof spelling, "%s", special_tokens[k].spelling);
        sb_printf(&sb, "    \"%ld\": {\n      \"content\": ", id);
        sb_json_str(&sb, spelling);
        sb_printf(&sb,
                  ",\n      \"lstrip\": false,\n      \"normalized\": false,\n"
                  "      \"rstrip\": false,\n      \"single_word\": false,\n"
                  "      \"special\": true\n    }%s\n",
                  off < 255 ? "," : "");
    }
    sb_add(&sb, "  },\n"
                "  \"bos_token\": \"[BOS]\",\n"
                "  \"eos_token\": \"[EOS]\",\n"
                "  \"pad_token\": \"[PAD]\",\n"
                "  \"unk_token\": \"[UNK]\",\n"
                "  \"clean_up_tokenization_spaces\": false,\n"
                "  \"model_max_length\": 1048576,\n"
                "  \"tokenizer_class\": \"TikTokenTokenizer\"\n"
                "}");
    write_text_file(dir, "tokenizer_config.json", sb.buf, sb.len);
    free(sb.buf);
    int n = v.n;
    free(v.data);
    free(v.off);
    free(v.len);
    free(v.ht);
    return n;
}

