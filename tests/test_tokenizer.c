/* test_tokenizer.c - K3's tokenizer (spec section 9) on the k3-tiny-a fixture:
 * the fixture's encode and chat cases and special ids, the pre-tokenizer's
 * pieces (expected splits taken from tiktoken), safety splitting, invalid
 * UTF-8 (Python errors="replace" semantics), the heap BPE against tiktoken's
 * reference algorithm, round trips, the incremental decoder (never half a
 * character, specials whole, never past cap), loader errors on corrupted
 * copies written to /tmp, concurrent encodes, and timings (1 MB encode; a
 * K3-sized vocabulary from build/k3gen, skipped when k3gen is absent).
 * Ids are checked against tiktoken itself by tests/oracle/.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"
#include "json.h"
#include "tokenizer.h"
#include "util.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static tokenizer *fixture_tok(void)
{
    static tokenizer *t;
    static int tried;
    if (!tried) {
        tried = 1;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
        df_error err = {0};
        if (tokenizer_load(dir, &t, &err)) fprintf(stderr, "    load %s: %s\n", dir, err.msg);
    }
    return t;
}

/* The fixture tokenizer is committed with the tests: a test that needs it
 * fails (never skips) when it does not load. */
#define NEED_TOK(t)                                                                         \
    do {                                                                                    \
        if (!(t)) {                                                                         \
            t_fail(__FILE__, __LINE__, "the fixture tokenizer (testdata/k3-tiny-a) did not load"); \
            return;                                                                         \
        }                                                                                   \
    } while (0)

typedef struct idvec {
    int32_t *v;
    size_t n, cap;
} idvec;

static int enc(const tokenizer *t, const char *s, size_t len, int special, idvec *out)
{
    df_error err = {0};
    out->n = 0;
    int rc = tokenizer_encode(t, s, len, special, &out->v, &out->n, &out->cap, &err);
    if (rc) t_fail(__FILE__, __LINE__, "encode: %s", err.msg);
    return rc;
}

/* decode(ids) as a new string */
static char *dec(const tokenizer *t, const idvec *ids, size_t *len)
{
    df_error err = {0};
    char *s = NULL;
    if (tokenizer_decode(t, ids->v, ids->n, &s, len, &err)) t_fail(__FILE__, __LINE__, "decode: %s", err.msg);
    return s;
}

static int same_ids(const idvec *a, const json_value *ids)
{
    if (!ids || ids->type != JSON_ARRAY || ids->len != a->n) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (!ids->items[i]->is_int || ids->items[i]->i != a->v[i]) return 0;
    return 1;
}

static json_doc *load_json(const char *rel)
{
    char path[512], *buf;
    size_t len;
    df_error err = {0};
    snprintf(path, sizeof path, "%s/%s", testdata_dir(), rel);
    if (read_small_file(path, &buf, &len, 64 << 20, &err)) {
        t_fail(__FILE__, __LINE__, "%s", err.msg);
        return NULL;
    }
    json_doc *d = json_parse(buf, len, &err);
    free(buf);
    if (!d) t_fail(__FILE__, __LINE__, "%s: %s", path, err.msg);
    return d;
}

/* ------------------------------------------------------------- fixtures */

static void test_fixture_cases(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    json_doc *d = load_json("k3-tiny-a/fixtures/tokenizer_cases.json");
    if (!d) return;
    const json_value *cases = json_get(json_root(d), "encode_cases");
    TCHECK(cases && cases->len > 0);
    idvec ids = {0};
    for (size_t i = 0; cases && i < cases->len; i++) {
        const json_value *c = cases->items[i];
        const json_value *text = json_get(c, "text");
        int allow = 0;
        json_get_bool(c, "allow_special", &allow);
        if (enc(t, text->str, text->len, allow, &ids)) continue;
        TCHECKF(same_ids(&ids, json_get(c, "ids")), "case %zu \"%s\" allow_special=%d: %zu ids differ", i, text->str,
                allow, ids.n);
        size_t dl;
        char *back = dec(t, &ids, &dl);
        TCHECKF(back && dl == text->len && !memcmp(back, text->str, dl), "case %zu: decode differs", i);
        free(back);
    }
    /* chat cases: each segment encoded on its own, concatenated */
    const json_value *chats = json_get(json_root(d), "chat_cases");
    for (size_t i = 0; chats && i < chats->len; i++) {
        const json_value *segs = json_get(chats->items[i], "segments");
        idvec all = {0}, one = {0};
        for (size_t k = 0; segs && k < segs->len; k++) {
            const json_value *tx = json_get(segs->items[k], "text");
            int allow = 0;
            json_get_bool(segs->items[k], "allow_special", &allow);
            enc(t, tx->str, tx->len, allow, &one);
            for (size_t j = 0; j < one.n; j++) {
                if (all.n == all.cap) {
                    all.cap = all.cap ? 2 * all.cap : 256;
                    all.v = xrealloc(all.v, all.cap * sizeof *all.v);
                }
                all.v[all.n++] = one.v[j];
            }
        }
        TCHECKF(same_ids(&all, json_get(chats->items[i], "ids")), "chat case %zu differs", i);
        free(all.v);
        free(one.v);
    }
    free(ids.v);
    json_free(d);
}

static void test_fixture_specials(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    TCHECK(tokenizer_n_vocab(t) == 640 && tokenizer_n_ranks(t) == 384);
    json_doc *d = load_json("k3-tiny-a/fixtures/tokenizer_cases.json");
    if (!d) return;
    const json_value *sp = json_get(json_root(d), "special_token_ids");
    TCHECK(sp && sp->len == 16);
    for (size_t i = 0; sp && i < sp->len; i++) {
        int32_t id = tokenizer_special_id(t, sp->keys[i]);
        TCHECKF(id == sp->items[i]->i, "%s -> %d, want %lld", sp->keys[i], id, (long long)sp->items[i]->i);
        size_t len;
        const char *b = tokenizer_token_bytes(t, id, &len);
        TCHECK(b && len == strlen(sp->keys[i]) && !memcmp(b, sp->keys[i], len));
        TCHECK(tokenizer_is_special(t, id));
        idvec ids = {0};
        enc(t, sp->keys[i], strlen(sp->keys[i]), 1, &ids);
        TCHECKF(ids.n == 1 && ids.v[0] == id, "%s alone with allow_special", sp->keys[i]);
        enc(t, sp->keys[i], strlen(sp->keys[i]), 0, &ids);
        TCHECKF(ids.n > 1, "%s without allow_special must be text", sp->keys[i]);
        for (size_t k = 0; k < ids.n; k++) TCHECK(!tokenizer_is_special(t, ids.v[k]));
        free(ids.v);
    }
    json_free(d);
    /* spec 9.1: gold byte ranks, GPT-2 order */
    static const struct { unsigned char b; int32_t id; } gold[] = {{'!', 0}, {',', 11}, {'a', 64}, {0x1c, 216}, {' ', 220}};
    for (size_t i = 0; i < sizeof gold / sizeof gold[0]; i++) {
        idvec ids = {0};
        enc(t, (const char *)&gold[i].b, 1, 0, &ids);
        TCHECKF(ids.n == 1 && ids.v[0] == gold[i].id, "byte 0x%02x", gold[i].b);
        free(ids.v);
    }
    TCHECK(tokenizer_special_id(t, "<|reserved_token_392|>") == 392);
    TCHECK(tokenizer_special_id(t, "<|open|") == -1 && tokenizer_special_id(t, "") == -1);
    TCHECK(!tokenizer_is_special(t, 383) && !tokenizer_is_special(t, 640) && !tokenizer_is_special(t, -1));
    size_t len = 99;
    TCHECK(tokenizer_token_bytes(t, 640, &len) == NULL && len == 0);
    TCHECK(tokenizer_token_bytes(t, -1, NULL) == NULL);
}

/* --------------------------------------------------------- pre-tokenizer */

/* Expected pieces, produced by tiktoken 1.0.22 with the spec's pattern on a
 * vocabulary holding every substring of each text (so each piece is one token). */
static const char *const split_cases[][12] = {
    {"ab  \n c", "ab", "  \n", " c"},
    {"\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82\xe4\xbd\xa0\xe5\xa5\xbd", "\xe4\xb8\x96\xe7\x95\x8c", "\xe3\x80\x82",
     "\xe4\xbd\xa0\xe5\xa5\xbd"}, /* 世界。你好: 。 is Script=Common */
    {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x80\x81\xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88",
     "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "\xe3\x80\x81\xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88"}, /* 日本語、テスト */
    {"it'\xc5\xbf ok", "it'\xc5\xbf", " ok"},            /* 'ſ matches (?i:'s) */
    {"x\xe1\xa0\x8ey", "x", "\xe1\xa0\x8ey"},             /* U+180E is not \s */
    {"a   b", "a", "  ", " b"},
    {"a   ", "a", "   "},
    {"I'M we're they'LL 1234567", "I'M", " we're", " they'LL", " ", "123", "456", "7"},
    {"Hello\n\nworld  ", "Hello", "\n\n", "world", "  "},
    {" \x1c a", " \x1c", " a"},
    {"x\t\t\n\r\n  \tfoo", "x", "\t\t\n\r\n", "  ", "\tfoo"},
    {"\xc2\xa0\xc2\xa0x", "\xc2\xa0", "\xc2\xa0x"},
    {"CamelCaseWORDSand", "Camel", "Case", "WORDSand"},
    {"x = 1;\r\n\r\n", "x", " =", " ", "1", ";\r\n\r\n"},
    {"\xf0\x9f\x99\x82\xf0\x9f\x9a\x80 ok!!\n\n", "\xf0\x9f\x99\x82\xf0\x9f\x9a\x80", " ok", "!!\n\n"},
    {"na\xc3\xafve caf\xc3\xa9", "na\xc3\xafve", " caf\xc3\xa9"},
    {"...\n", "...\n"},
    {" ?!\r\n\r\nz", " ?!\r\n\r\n", "z"},
    {"\xe0\xa5\xa7\xe0\xa5\xa8\xe0\xa5\xa9\xe0\xa5\xaa \xe0\xa4\x95\xe0\xa4\xbf", "\xe0\xa5\xa7\xe0\xa5\xa8\xe0\xa5\xa9",
     "\xe0\xa5\xaa", " \xe0\xa4\x95\xe0\xa4\xbf"}, /* १२३४ कि */
    {"\xe3\x90\x80\xf0\xa0\x80\x80\xe3\x80\x85\xe3\x80\x87", "\xe3\x90\x80\xf0\xa0\x80\x80\xe3\x80\x85\xe3\x80\x87"},
    {"abc\xe3\x80\x80" "def", "abc", "\xe3\x80\x80" "def"},
    {"a\xe2\x80\xa8" "b", "a", "\xe2\x80\xa8" "b"},
    {"a\xf0\xb1\x8d\x90" "b", "a", "\xf0\xb1\x8d\x90", "b"}, /* U+31350, CJK ext. H (Unicode 15) */
};

static void test_pretokenizer(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    size_t *ends = NULL, n, cap = 0;
    for (size_t i = 0; i < sizeof split_cases / sizeof split_cases[0]; i++) {
        const char *s = split_cases[i][0];
        df_error err = {0};
        n = 0;
        TCHECK(tokenizer_split(t, s, strlen(s), &ends, &n, &cap, &err) == 0);
        size_t want = 0, at = 0;
        int ok = 1;
        for (int k = 1; k < 12 && split_cases[i][k]; k++, want++) {
            at += strlen(split_cases[i][k]);
            if (want >= n || ends[want] != at) ok = 0;
        }
        TCHECKF(ok && n == want, "split case %zu: %zu pieces, want %zu", i, n, want);
        if (!ok || n != want)
            for (size_t k = 0; k < n; k++) fprintf(stderr, "      end %zu\n", ends[k]);
    }
    df_error err = {0};
    n = 0;
    TCHECK(tokenizer_split(t, "a\xff", 2, &ends, &n, &cap, &err) != 0 && err.code == DF_ERR_ARG);
    free(ends);
}

static char *repeat(const char *unit, size_t times, size_t *len)
{
    size_t u = strlen(unit);
    char *s = xmalloc(u * times + 1);
    for (size_t i = 0; i < times; i++) memcpy(s + i * u, unit, u);
    s[u * times] = 0;
    *len = u * times;
    return s;
}

static int has_end(const size_t *ends, size_t n, size_t at)
{
    for (size_t i = 0; i < n; i++)
        if (ends[i] == at) return 1;
    return 0;
}

static void test_safety_split(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    size_t *ends = NULL, n = 0, cap = 0, len;
    df_error err = {0};
    /* 60,000 letters: cut at 25,000 and 50,000 */
    char *s = repeat("a", 60000, &len);
    TCHECK(tokenizer_split(t, s, len, &ends, &n, &cap, &err) == 0);
    TCHECKF(n == 3 && ends[0] == 25000 && ends[1] == 50000 && ends[2] == 60000, "%zu pieces", n);
    free(s);
    /* 30,000 digits: groups of three restart at the cut (25,000 = 3 * 8333 + 1) */
    s = repeat("7", 30000, &len);
    n = 0;
    TCHECK(tokenizer_split(t, s, len, &ends, &n, &cap, &err) == 0);
    TCHECK(has_end(ends, n, 24999) && has_end(ends, n, 25000) && has_end(ends, n, 25003) && !has_end(ends, n, 25002));
    free(s);
    /* counting is in characters: 30,000 x U+00E9 (2 bytes) cut after 25,000 chars */
    s = repeat("\xc3\xa9", 30000, &len);
    n = 0;
    TCHECK(tokenizer_split(t, s, len, &ends, &n, &cap, &err) == 0);
    TCHECK(n == 2 && ends[0] == 50000);
    free(s);
    /* alternating classes never trigger a cut; U+001C counts as space here
     * (str.isspace) although the regex treats it as punctuation */
    s = repeat("ab \x1c", 20000, &len);
    n = 0;
    TCHECK(tokenizer_split(t, s, len, &ends, &n, &cap, &err) == 0);
    TCHECK(n == 40000);
    free(s);
    /* a special spelling cut by the 400,000-scalar slice boundary is text;
     * one wholly inside a slice is recognised (as in tokenization_kimi.py) */
    idvec ids = {0};
    for (int shift = 0; shift < 2; shift++) {
        size_t pre = 400000 - 3 - (shift ? 10 : 0);
        char *u = xmalloc(pre + 16);
        for (size_t i = 0; i < pre; i++) u[i] = (i % 8 == 7) ? ' ' : 'x';
        memcpy(u + pre, "<|open|>", 8);
        enc(t, u, pre + 8, 1, &ids);
        int found = 0;
        for (size_t i = 0; i < ids.n; i++) found |= ids.v[i] == 387;
        TCHECKF(found == shift, "slice boundary %s the spelling: special %s", shift ? "before" : "inside",
                found ? "found" : "not found");
        size_t dl;
        char *back = dec(t, &ids, &dl);
        TCHECK(back && dl == pre + 8 && !memcmp(back, u, dl));
        free(back);
        free(u);
    }
    free(ids.v);
    free(ends);
}

/* ------------------------------------------------------------- UTF-8 repair */

static void test_invalid_utf8(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    /* input -> Python's bytes.decode("utf-8", errors="replace") */
#define FFFD "\xef\xbf\xbd"
    static const struct { const char *in, *out; } cases[] = {
        {"a\xff" "b", "a" FFFD "b"},
        {"\xe4\xbd", FFFD},                        /* truncated: one per maximal subpart */
        {"\xe4\xbd" "a", FFFD "a"},
        {"\xf0\x80\x80", FFFD FFFD FFFD},          /* F0 80 is never valid */
        {"\xed\xa0\x80", FFFD FFFD FFFD},          /* a surrogate */
        {"\xc0\xaf", FFFD FFFD},                   /* overlong */
        {"\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD}, /* above U+10FFFF */
        {"\x80\x80 x", FFFD FFFD " x"},
        {"\xf0\x9f\x98" "\xf0\x9f\x98\x80", FFFD "\xf0\x9f\x98\x80"},
        {"<|open|\xff>", "<|open|" FFFD ">"},
        {"<|op\xff" "en|>", "<|op" FFFD "en|>"},
    };
    idvec a = {0}, b = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int sp = 0; sp < 2; sp++) {
            enc(t, cases[i].in, strlen(cases[i].in), sp, &a);
            enc(t, cases[i].out, strlen(cases[i].out), sp, &b);
            TCHECKF(a.n == b.n && !memcmp(a.v, b.v, a.n * sizeof *a.v), "case %zu: ids differ from the repaired text's",
                    i);
            size_t dl;
            char *back = dec(t, &a, &dl);
            TCHECKF(back && dl == strlen(cases[i].out) && !memcmp(back, cases[i].out, dl), "case %zu: decode", i);
            free(back);
        }
    /* NUL is an ordinary character */
    enc(t, "a\0b", 3, 0, &a);
    TCHECK(a.n == 3);
    free(a.v);
    free(b.v);
}

/* ------------------------------------------------------------------ BPE */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static void test_bpe_heap_matches_reference(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    int nr = tokenizer_n_ranks(t);
    idvec a = {0}, b = {0};
    unsigned char *buf = xmalloc(8192);
    int bad = 0;
    for (int iter = 0; iter < 400; iter++) {
        /* concatenations of random tokens, sometimes with stray bytes, so
         * many merges apply and ties occur */
        size_t len = 0, target = 1 + rnd() % (iter < 300 ? 300 : 4000);
        int alphabet = 1 + (int)(rnd() % 6);
        while (len < target) {
            int32_t id = rnd() % 8 == 0 ? (int32_t)(rnd() % 256)
                                        : (int32_t)(rnd() % (uint32_t)(alphabet * 40 + 1)) % nr;
            size_t tl;
            const char *tb = tokenizer_token_bytes(t, id, &tl);
            if (len + tl > 8192) break;
            memcpy(buf + len, tb, tl);
            len += tl;
        }
        a.n = b.n = 0;
        tokenizer_bpe(t, buf, len, 1, &a.v, &a.n, &a.cap);
        tokenizer_bpe(t, buf, len, 0, &b.v, &b.n, &b.cap);
        if (a.n != b.n || memcmp(a.v, b.v, a.n * sizeof *a.v)) bad++;
        /* the result spells the piece */
        size_t at = 0;
        for (size_t i = 0; i < b.n; i++) {
            size_t tl;
            const char *tb = tokenizer_token_bytes(t, b.v[i], &tl);
            if (at + tl > len || memcmp(buf + at, tb, tl)) bad++;
            at += tl;
        }
        if (at != len) bad++;
    }
    /* runs of one byte: every pair ties, leftmost first */
    memset(buf, ' ', 5000);
    a.n = b.n = 0;
    tokenizer_bpe(t, buf, 5000, 1, &a.v, &a.n, &a.cap);
    tokenizer_bpe(t, buf, 5000, 0, &b.v, &b.n, &b.cap);
    if (a.n != b.n || memcmp(a.v, b.v, a.n * sizeof *a.v)) bad++;
    TCHECKF(bad == 0, "%d heap/reference disagreements", bad);
    free(buf);
    free(a.v);
    free(b.v);
}

/* --------------------------------------------------------- round trips */

static const char *const corpus[] = {
    "The capital of France is Paris.",
    "Hello\n\nworld  \n\n\n   \t\r\n",
    "def forward(x):\n    return x * 2\n\n\tif (a && b) { c[i] = 0x1F; }\r\n",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81\xe6\xbc\xa2\xe5\xad\x97",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x80\x82",
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xe2\x80\x94 caf\xc3\xa9 na\xc3\xafve",
    "\xf0\x9f\x99\x82\xf0\x9f\x9a\x80\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb",
    "12345678901234567890 3.14159 -42 1e10",
    "a\x1c" "b\x1d" "c\x1e" "d\x1f" " \x1c a",
    "<|open|>message<|sep|>hi<|close|>[BOS][EOS]<|reserved_token_500|>",
    "<|open|<|open|>>[[BOS]]<|<|sep|>|>",
    "I'M we're they'LL it'\xc5\xbf DON'T",
    "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80 \xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9",
    "trailing spaces   ",
    "\xc2\xa0\xe2\x80\x83\xe3\x80\x80mixed\xe2\x80\xa8space",
};

static void append_random_char(char *s, size_t *n)
{
    static const uint32_t ranges[][2] = {{0x20, 0x7e},     {0x09, 0x0d},     {0x1c, 0x20},   {0xa0, 0x17f},
                                         {0x400, 0x4ff},   {0x900, 0x97f},   {0x3000, 0x30ff}, {0x4e00, 0x9fff},
                                         {0xac00, 0xd7a3}, {0x1f300, 0x1faff}, {0x2000, 0x206f}, {0x0, 0x10ffff}};
    uint32_t r = rnd() % (sizeof ranges / sizeof ranges[0]);
    uint32_t c;
    do c = ranges[r][0] + rnd() % (ranges[r][1] - ranges[r][0] + 1);
    while (c >= 0xd800 && c <= 0xdfff);
    unsigned char *o = (unsigned char *)s + *n;
    if (c < 0x80) o[0] = (unsigned char)c, *n += 1;
    else if (c < 0x800) o[0] = (unsigned char)(0xc0 | c >> 6), o[1] = (unsigned char)(0x80 | (c & 63)), *n += 2;
    else if (c < 0x10000)
        o[0] = (unsigned char)(0xe0 | c >> 12), o[1] = (unsigned char)(0x80 | (c >> 6 & 63)),
        o[2] = (unsigned char)(0x80 | (c & 63)), *n += 3;
    else
        o[0] = (unsigned char)(0xf0 | c >> 18), o[1] = (unsigned char)(0x80 | (c >> 12 & 63)),
        o[2] = (unsigned char)(0x80 | (c >> 6 & 63)), o[3] = (unsigned char)(0x80 | (c & 63)), *n += 4;
}

static void check_roundtrip(const tokenizer *t, const char *s, size_t len, int *bad)
{
    idvec ids = {0};
    for (int sp = 0; sp < 2; sp++) {
        enc(t, s, len, sp, &ids);
        size_t dl;
        char *back = dec(t, &ids, &dl);
        if (!back || dl != len || memcmp(back, s, len)) (*bad)++;
        for (size_t i = 0; i < ids.n; i++)
            if (ids.v[i] < 0 || ids.v[i] >= tokenizer_n_vocab(t) || (!sp && tokenizer_is_special(t, ids.v[i])))
                (*bad)++;
        free(back);
    }
    free(ids.v);
}

static void test_roundtrip(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    int bad = 0;
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) check_roundtrip(t, corpus[i], strlen(corpus[i]), &bad);
    char *s = xmalloc(4 * 600 + 64);
    for (int iter = 0; iter < 500; iter++) {
        size_t n = 0, chars = rnd() % 600;
        for (size_t k = 0; k < chars; k++) {
            if (rnd() % 50 == 0) {
                const char *sp = rnd() % 2 ? "<|open|>" : "[EOS]";
                memcpy(s + n, sp, strlen(sp));
                n += strlen(sp);
            } else {
                append_random_char(s, &n);
            }
        }
        check_roundtrip(t, s, n, &bad);
    }
    free(s);
    TCHECKF(bad == 0, "%d round-trip failures", bad);
}

/* ------------------------------------------------------------ decoder */

/* The id of the single-byte token b (encode would repair a lone invalid byte). */
static int32_t byte_id(const tokenizer *t, unsigned char b)
{
    for (int32_t id = 0; id < tokenizer_n_ranks(t); id++) {
        size_t l;
        const char *p = tokenizer_token_bytes(t, id, &l);
        if (l == 1 && (unsigned char)p[0] == b) return id;
    }
    return -1;
}

static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        int need = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!need || i + (size_t)need > n) return 0;
        for (int k = 1; k < need; k++)
            if ((s[i + (size_t)k] & 0xc0) != 0x80) return 0;
        if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f) || (c == 0xf0 && s[i + 1] < 0x90) ||
            (c == 0xf4 && s[i + 1] > 0x8f))
            return 0;
        i += (size_t)need;
    }
    return 1;
}

static void test_decoder_incremental(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    idvec ids = {0};
    int bad = 0;
    char out[512];
    for (size_t c = 0; c < sizeof corpus / sizeof corpus[0]; c++) {
        const char *s = corpus[c];
        size_t len = strlen(s);
        for (int sp = 0; sp < 2; sp++) {
            enc(t, s, len, sp, &ids);
            tok_decoder d;
            tok_decoder_init(&d, t);
            char acc[1024];
            size_t at = 0;
            for (size_t i = 0; i < ids.n; i++) {
                size_t tl;
                tokenizer_token_bytes(t, ids.v[i], &tl);
                memset(out, 0x55, sizeof out);
                size_t m = tok_decoder_feed(&d, ids.v[i], out, tl + 8);
                if (m > tl + 8 || out[tl + 8] != 0x55) bad++;
                if (!valid_utf8((const unsigned char *)out, m)) bad++; /* never half a character */
                if (tokenizer_is_special(t, ids.v[i])) {
                    /* emitted whole, as the last bytes of this call */
                    if (m < tl || memcmp(out + m - tl, tokenizer_token_bytes(t, ids.v[i], NULL), tl)) bad++;
                }
                memcpy(acc + at, out, m);
                at += m;
            }
            at += tok_decoder_flush(&d, acc + at, 8);
            if (at != len || memcmp(acc, s, len)) bad++;
        }
    }
    TCHECKF(bad == 0, "%d incremental decode failures", bad);
    /* invalid streams: bytes that cannot form a character become U+FFFD,
     * the same as decoding the concatenation with errors="replace" */
    static const struct { const char *bytes, *out; } streams[] = {
        {"\xe4\xbd\xa0", "\xe4\xbd\xa0"},
        {"\xe4\xbd" "a", FFFD "a"},
        {"\xe0\x80\x80\x80" "a", FFFD FFFD FFFD FFFD "a"},
        {"\xff\xfe", FFFD FFFD},
        {"\xf0\x9f\x98", FFFD}, /* flushed at the end */
    };
    for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++) {
        tok_decoder d;
        tok_decoder_init(&d, t);
        char acc[64];
        size_t at = 0;
        for (const char *p = streams[i].bytes; *p; p++)
            at += tok_decoder_feed(&d, byte_id(t, (unsigned char)*p), acc + at, sizeof acc - at);
        at += tok_decoder_flush(&d, acc + at, sizeof acc - at);
        TCHECKF(at == strlen(streams[i].out) && !memcmp(acc, streams[i].out, at), "stream %zu", i);
    }
    /* a special after an incomplete character: U+FFFD, then the spelling */
    tok_decoder d;
    tok_decoder_init(&d, t);
    size_t m = tok_decoder_feed(&d, byte_id(t, 0xe4), out, sizeof out);
    TCHECK(m == 0);
    m = tok_decoder_feed(&d, 387, out, sizeof out);
    TCHECK(m == 3 + 8 && !memcmp(out, FFFD "<|open|>", m));
    TCHECK(tok_decoder_feed(&d, -5, out, sizeof out) == 0 && tok_decoder_feed(&d, 640, out, sizeof out) == 0);
    TCHECK(tok_decoder_flush(&d, out, sizeof out) == 0);
    free(ids.v);
}

/* The decoder never writes more than tok_decoder_max_out(t), from any
 * pending state, and never more than cap. */
static void test_decoder_bounds(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    size_t maxo = tok_decoder_max_out(t);
    TCHECK(maxo >= 3);
    static const char *const pend[] = {"", "\xe0", "\xf0", "\xe4\xbd", "\xf0\x9f", "\xf0\x9f\x98", "\xc3", "\xf4\x8f"};
    char out[256];
    int bad = 0;
    for (size_t p = 0; p < sizeof pend / sizeof pend[0]; p++)
        for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
            tok_decoder d;
            tok_decoder_init(&d, t);
            for (const char *q = pend[p]; *q; q++)
                if (tok_decoder_feed(&d, byte_id(t, (unsigned char)*q), out, sizeof out) != 0) bad++;
            size_t m = tok_decoder_feed(&d, id, out, sizeof out);
            if (m > maxo) bad++;
            size_t f = tok_decoder_flush(&d, out, sizeof out);
            if (f > 3) bad++;
            /* a too-small cap is never overrun, and what is written is whole characters */
            tok_decoder_init(&d, t);
            for (const char *q = pend[p]; *q; q++) tok_decoder_feed(&d, byte_id(t, (unsigned char)*q), out, sizeof out);
            memset(out, 0x55, sizeof out);
            size_t cap = m / 2;
            size_t m2 = tok_decoder_feed(&d, id, out, cap);
            if (m2 > cap || out[cap] != 0x55 || !valid_utf8((const unsigned char *)out, m2)) bad++;
        }
    TCHECKF(bad == 0, "%d bound violations (max_out %zu)", bad, maxo);
}

/* ------------------------------------------------------------- loader */

static char tmp_root[64];

static const char *tmp_dir(void)
{
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/df_tok_XXXXXX");
        CHECK(mkdtemp(tmp_root));
    }
    return tmp_root;
}

static void write_file(const char *dir, const char *name, const char *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        t_fail(__FILE__, __LINE__, "cannot write %s", path);
        return;
    }
    if (fwrite(data, 1, len, f) != len) t_fail(__FILE__, __LINE__, "short write to %s", path);
    fclose(f);
}

static char *read_fixture(const char *name, size_t *len)
{
    char path[512], *buf = NULL;
    df_error err = {0};
    snprintf(path, sizeof path, "%s/k3-tiny-a/checkpoint/%s", testdata_dir(), name);
    if (read_small_file(path, &buf, len, 64 << 20, &err)) t_fail(__FILE__, __LINE__, "%s", err.msg);
    return buf;
}

/* Writes model + config into a fresh subdirectory and loads it; returns the
 * load status, the error in *err. */
static int try_load(const char *name, const char *model, size_t mlen, const char *config, size_t clen,
                    df_error *err, tokenizer **out)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_dir(), name);
    mkdir(dir, 0755);
    if (model) write_file(dir, "tiktoken.model", model, mlen);
    if (config) write_file(dir, "tokenizer_config.json", config, clen);
    memset(err, 0, sizeof *err);
    tokenizer *t = NULL;
    int rc = tokenizer_load(dir, &t, err);
    if (out) *out = t;
    else tokenizer_free(t);
    return rc;
}

/* The fixture model with line `line` (1-based) replaced by repl (NULL: deleted). */
static char *edit_line(const char *model, size_t mlen, int line, const char *repl, size_t *out_len)
{
    char *o = xmalloc(mlen + 256);
    size_t n = 0, pos = 0;
    for (int ln = 1; pos < mlen; ln++) {
        const char *nl = memchr(model + pos, '\n', mlen - pos);
        size_t e = nl ? (size_t)(nl - model) + 1 : mlen;
        if (ln == line) {
            if (repl) {
                memcpy(o + n, repl, strlen(repl));
                n += strlen(repl);
            }
        } else {
            memcpy(o + n, model + pos, e - pos);
            n += e - pos;
        }
        pos = e;
    }
    *out_len = n;
    return o;
}

static void test_loader_errors(void)
{
    size_t mlen, clen;
    char *model = read_fixture("tiktoken.model", &mlen), *config = read_fixture("tokenizer_config.json", &clen);
    if (!model || !config) return;
    df_error err;
    TCHECK(try_load("ok", model, mlen, config, clen, &err, NULL) == 0);
    /* line 5 is "JQ== 4" ('%') in GPT-2 order; line 300 a merge */
    static const struct { int line; const char *repl; const char *msg; } bad[] = {
        {5, "JQ== 5\n", ":5: rank 5, expected 4"},
        {5, NULL, ":5: rank 5, expected 4"},
        {5, "JQ==  4\n", ":5: bad rank"},
        {5, "JQ==4\n", ":5: expected \"base64 rank\""},
        {5, "JQ= 4\n", ":5: invalid base64"},
        {5, "J*== 4\n", ":5: invalid base64"},
        {5, "JR== 4\n", ":5: invalid base64"}, /* nonzero unused bits */
        {5, " 4\n", ":5: invalid base64"},
        {5, "\n", ":5: empty line"},
        {5, "JQ== 4x\n", ":5: bad rank"},
        {5, "JQ== -4\n", ":5: bad rank"},
        {300, "IQ== 299\n", "duplicates the byte string of line 1"},
        {5, "JSU= 4\n", "byte 0x25 has no token"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n;
        char *m = edit_line(model, mlen, bad[i].line, bad[i].repl, &n);
        char name[32];
        snprintf(name, sizeof name, "bad%zu", i);
        int rc = try_load(name, m, n, config, clen, &err, NULL);
        TCHECKF(rc != 0 && err.code == DF_ERR_FORMAT && strstr(err.msg, bad[i].msg) && strstr(err.msg, "tiktoken.model"),
                "case %zu: rc %d, \"%s\"", i, rc, err.msg);
        free(m);
    }
    /* CRLF line ends and a missing final newline are accepted */
    {
        char *m = xmalloc(2 * mlen), *c = m;
        for (size_t i = 0; i < mlen; i++) {
            if (model[i] == '\n') *c++ = '\r';
            *c++ = model[i];
        }
        TCHECK(try_load("crlf", m, (size_t)(c - m) - 2, config, clen, &err, NULL) == 0);
        free(m);
    }
    /* missing files */
    TCHECK(try_load("nomodel", NULL, 0, config, clen, &err, NULL) != 0 && err.code == DF_ERR_IO &&
           strstr(err.msg, "tiktoken.model"));
    TCHECK(try_load("noconfig", model, mlen, NULL, 0, &err, NULL) != 0 && err.code == DF_ERR_IO &&
           strstr(err.msg, "tokenizer_config.json"));
    /* config errors */
    static const struct { const char *cfg, *msg; } badcfg[] = {
        {"{}", "no \"added_tokens_decoder\""},
        {"{\"added_tokens_decoder\": {\"383\": {\"content\": \"x\"}}}", "outside the reserved range [384, 640)"},
        {"{\"added_tokens_decoder\": {\"640\": {\"content\": \"x\"}}}", "outside the reserved range"},
        {"{\"added_tokens_decoder\": {\"x1\": {\"content\": \"x\"}}}", "is not an id"},
        {"{\"added_tokens_decoder\": {\"400\": {\"content\": \"\"}}}", "non-empty \"content\""},
        {"{\"added_tokens_decoder\": {\"400\": {}}}", "non-empty \"content\""},
        {"{\"added_tokens_decoder\": {\"400\": {\"content\": \"a\"}, \"401\": {\"content\": \"a\"}}}",
         "same spelling \"a\""},
        {"{\"added_tokens_decoder\": {\"400\": {\"content\": \"<|reserved_token_401|>\"}}}", "same spelling"},
        {"{\"added_tokens_decoder\": [", "tokenizer_config.json"},
    };
    for (size_t i = 0; i < sizeof badcfg / sizeof badcfg[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "cfg%zu", i);
        int rc = try_load(name, model, mlen, badcfg[i].cfg, strlen(badcfg[i].cfg), &err, NULL);
        TCHECKF(rc != 0 && strstr(err.msg, badcfg[i].msg) && strstr(err.msg, "tokenizer_config.json"),
                "config %zu: rc %d, \"%s\"", i, rc, err.msg);
    }
    /* unlisted ids default to <|reserved_token_{id}|>; a prefix pair picks the longest */
    const char *cfg = "{\"added_tokens_decoder\": {\"384\": {\"content\": \"<a>\"}, \"385\": {\"content\": \"<a>b\"}}}";
    tokenizer *t = NULL;
    TCHECK(try_load("dflt", model, mlen, cfg, strlen(cfg), &err, &t) == 0);
    if (t) {
        TCHECK(tokenizer_special_id(t, "<|reserved_token_386|>") == 386);
        TCHECK(tokenizer_special_id(t, "<|reserved_token_639|>") == 639);
        TCHECK(tokenizer_special_id(t, "[BOS]") == -1);
        idvec ids = {0};
        enc(t, "x<a>b<a>", 8, 1, &ids);
        TCHECK(ids.n == 3 && ids.v[1] == 385 && ids.v[2] == 384);
        free(ids.v);
        tokenizer_free(t);
    }
    free(model);
    free(config);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir());
    TCHECK(system(cmd) == 0);
    tmp_root[0] = 0;
}

/* --------------------------------------------------------- concurrency */

typedef struct enc_job {
    const tokenizer *t;
    const char *text;
    size_t len;
    idvec ids;
} enc_job;

static void *enc_thread(void *arg)
{
    enc_job *j = arg;
    df_error err = {0};
    for (int r = 0; r < 3; r++) {
        j->ids.n = 0;
        tokenizer_encode(j->t, j->text, j->len, 1, &j->ids.v, &j->ids.n, &j->ids.cap, &err);
    }
    return NULL;
}

/* ~1 MB of mixed text: English, code, CJK, Cyrillic, emoji, numbers, whitespace, specials */
static char *mixed_text(size_t target, size_t *len)
{
    char *s = xmalloc(target + 1024);
    size_t n = 0;
    uint64_t saved = rng_state;
    rng_state = 12345;
    while (n < target) {
        const char *c = corpus[rnd() % (sizeof corpus / sizeof corpus[0])];
        size_t cl = strlen(c);
        memcpy(s + n, c, cl);
        n += cl;
        s[n++] = rnd() % 3 ? ' ' : '\n';
        if (rnd() % 4 == 0)
            for (int k = 0; k < 20; k++) append_random_char(s, &n);
    }
    rng_state = saved;
    *len = n;
    return s;
}

static void test_concurrent_encode(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    size_t len;
    char *text = mixed_text(100000, &len);
    idvec ref = {0};
    enc(t, text, len, 1, &ref);
    enum { NT = 4 };
    enc_job jobs[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (enc_job){t, text, len, {0}};
        CHECK(pthread_create(&th[i], NULL, enc_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        TCHECK(jobs[i].ids.n == ref.n && !memcmp(jobs[i].ids.v, ref.v, ref.n * sizeof *ref.v));
        free(jobs[i].ids.v);
    }
    free(ref.v);
    free(text);
}

/* ------------------------------------------------------------- timings */

static void test_encode_1mb_timing(void)
{
    tokenizer *t = fixture_tok();
    NEED_TOK(t);
    size_t len;
    char *text = mixed_text(1 << 20, &len);
    idvec ids = {0};
    double t0 = now_sec();
    enc(t, text, len, 1, &ids);
    double dt = now_sec() - t0;
    fprintf(stderr, "    encode %.2f MB mixed text: %.3f s, %zu ids (%.1f MB/s)\n", len / 1e6, dt, ids.n,
            len / 1e6 / dt);
    /* generous: CI machines are noisy, and sanitizers slow everything */
    double limit = getenv("DF_SANITIZED") ? 30.0 : 3.0;
    TCHECKF(dt < limit, "1 MB took %.2f s", dt);
    size_t dl;
    char *back = dec(t, &ids, &dl);
    TCHECK(back && dl == len && !memcmp(back, text, len));
    free(back);
    free(ids.v);
    free(text);
}

static void test_large_vocab(void)
{
    const char *b = getenv("BUILD");
    char gen[512], dir[600], cmd[2400];
    snprintf(gen, sizeof gen, "%s/k3gen", b && *b ? b : "build");
    if (access(gen, X_OK) != 0) TSKIP("%s not built", gen);
    snprintf(dir, sizeof dir, "%s/big", tmp_dir());
    snprintf(cmd, sizeof cmd, "%s --out %s --preset tiny --set vocab_size=163840 --gguf %s.gguf >/dev/null 2>&1", gen,
             dir, dir);
    if (system(cmd) != 0) {
        t_fail(__FILE__, __LINE__, "%s failed", cmd);
        return;
    }
    tokenizer *t = NULL;
    df_error err = {0};
    double t0 = now_sec();
    int rc = tokenizer_load(dir, &t, &err);
    double dt = now_sec() - t0;
    TCHECKF(rc == 0, "%s", err.msg);
    if (!rc) {
        fprintf(stderr, "    load 163,584 ranks + 256 specials: %.3f s\n", dt);
        TCHECK(tokenizer_n_vocab(t) == 163840 && tokenizer_special_id(t, "<|end_of_msg|>") == 163586);
        TCHECK(dt < (getenv("DF_SANITIZED") ? 20.0 : 2.0));
        size_t len;
        char *text = mixed_text(1 << 20, &len);
        idvec ids = {0};
        t0 = now_sec();
        enc(t, text, len, 0, &ids);
        dt = now_sec() - t0;
        fprintf(stderr, "    encode %.2f MB with it: %.3f s, %zu ids\n", len / 1e6, dt, ids.n);
        size_t dl;
        char *back = dec(t, &ids, &dl);
        TCHECK(back && dl == len && !memcmp(back, text, len));
        /* heap and reference BPE agree on long pieces of this vocabulary */
        idvec a = {0}, h = {0};
        int bad = 0;
        for (size_t off = 0; off + 3000 < len; off += len / 16) {
            a.n = h.n = 0;
            tokenizer_bpe(t, (const unsigned char *)text + off, 3000, 1, &a.v, &a.n, &a.cap);
            tokenizer_bpe(t, (const unsigned char *)text + off, 3000, 0, &h.v, &h.n, &h.cap);
            bad += a.n != h.n || memcmp(a.v, h.v, a.n * sizeof *a.v);
        }
        TCHECKF(bad == 0, "%d heap/reference disagreements", bad);
        /* the same vocabulary read from the GGUF (byte-level strings + token
         * types): every token's bytes, every special and the ids of the
         * whole text (with specials allowed) are the same */
        char gpath[700];
        snprintf(gpath, sizeof gpath, "%s.gguf", dir);
        tokenizer *g = NULL;
        t0 = now_sec();
        TCHECKF(tokenizer_load(gpath, &g, &err) == 0, "%s", err.msg);
        fprintf(stderr, "    load the same vocabulary from the GGUF: %.3f s\n", now_sec() - t0);
        if (g) {
            TCHECK(tokenizer_n_vocab(g) == 163840 && tokenizer_n_ranks(g) == tokenizer_n_ranks(t));
            int diff = 0;
            for (int32_t id = 0; id < 163840; id++) {
                size_t l1, l2;
                const char *p1 = tokenizer_token_bytes(t, id, &l1), *p2 = tokenizer_token_bytes(g, id, &l2);
                diff += !p1 || !p2 || l1 != l2 || memcmp(p1, p2, l1);
            }
            TCHECKF(diff == 0, "%d tokens differ between tiktoken.model and the GGUF", diff);
            idvec gi = {0}, ti = {0};
            static const char sp[] = "<|open|>user<|end_of_msg|> <|reserved_token_163700|>";
            char *mix = malloc(len + sizeof sp);
            memcpy(mix, sp, sizeof sp - 1);
            memcpy(mix + sizeof sp - 1, text, len);
            enc(t, mix, len + sizeof sp - 1, 1, &ti);
            enc(g, mix, len + sizeof sp - 1, 1, &gi);
            TCHECKF(ti.n == gi.n && !memcmp(ti.v, gi.v, ti.n * sizeof *ti.v), "GGUF vocabulary encodes differently");
            TCHECK(ti.n > 3 && ti.v[0] == tokenizer_special_id(t, "<|open|>"));
            free(mix);
            free(gi.v);
            free(ti.v);
            tokenizer_free(g);
        }
        free(a.v);
        free(h.v);
        free(back);
        free(ids.v);
        free(text);
        tokenizer_free(t);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir());
    TCHECK(system(cmd) == 0);
    tmp_root[0] = 0;
}

static void test_free_fixture(void)
{
    tokenizer_free(fixture_tok());
    tokenizer_free(NULL);
}

static const test_case tests[] = {
    {"tok_fixture_cases", test_fixture_cases},
    {"tok_fixture_specials", test_fixture_specials},
    {"tok_pretokenizer", test_pretokenizer},
    {"tok_safety_split", test_safety_split},
    {"tok_invalid_utf8", test_invalid_utf8},
    {"tok_bpe_heap_matches_reference", test_bpe_heap_matches_reference},
    {"tok_roundtrip", test_roundtrip},
    {"tok_decoder_incremental", test_decoder_incremental},
    {"tok_decoder_bounds", test_decoder_bounds},
    {"tok_loader_errors", test_loader_errors},
    {"tok_concurrent_encode", test_concurrent_encode},
    {"tok_encode_1mb_timing", test_encode_1mb_timing},
    {"tok_large_vocab", test_large_vocab},
    {"tok_zz_free", test_free_fixture},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
