/* gr_string.c - see gr_string.h: code point sets, one character as bytes,
 * patterns and formats as NFA fragments of a gr_builder machine.
 *
 * Characters.  A set's ranges are cut so that each piece is a product of
 * byte ranges (the usual UTF-8 construction: split at the 1/2/3/4-byte
 * boundaries, then where a continuation byte would not span 80..BF), and
 * the pieces share their suffixes: one state per distinct tail of byte
 * ranges, so "any character" adds 7 states in raw mode (13 in JSON mode).
 * Surrogates and code points above 0x10FFFF are never encoded.  In JSON
 * mode each code point below 0x80 has exactly one spelling (gr_string.h),
 * so a string's text is a function of its value and the grammar stays
 * unambiguous.
 *
 * Patterns.  A recursive-descent parser builds a small tree (sets,
 * sequences, alternatives, repetitions); the emitter writes it as a
 * Thompson NFA whose fragments never add an edge into their entry state
 * or out of their exit state, so alternatives may share both and a loop
 * body may run from a state back to itself.  Bounded repetition is
 * unrolled: a bound above GR_PATTERN_MAX_REPEAT, or a pattern whose
 * unrolled form holds more than GR_PATTERN_MAX_ATOMS character positions,
 * is refused by name.  `^` / `$` anchor the alternative of the top level
 * that they begin / end (ECMAScript: `^a|b$` is `(^a)|(b$)`); an unanchored
 * side gets a loop of any character.  ECMAScript's `u`-mode syntax errors
 * (lone braces, a bad escape, out-of-order ranges) fail with DF_ERR_ARG,
 * constructs outside the regular subset with DF_ERR_UNSUPPORTED.  Escaped
 * ASCII punctuation is accepted outside classes as well (non-`u` engines
 * read it the same way), and named groups are plain groups.
 *
 * Intersections (gr_patterns).  Each pattern is emitted into a local NFA
 * through the same code (a sink: the builder or a local edge list), and
 * the operands are multiplied pairwise: a product state takes either
 * side's epsilon edges alone and symbol edges together on their common
 * byte range.  Only pairs reachable from (start, start) are made; the
 * builder trims the ones that cannot finish.  The same product with an
 * unrolled [\s\S]{min,max} puts small minLength/maxLength into the body
 * (see gr_patterns), where the counter's bounds alone could strand.
 *
 * Formats are anchored patterns (the table at the end) compiled the same
 * way; each text below also satisfies ajv-formats' full definition:
 *  - date: YYYY-MM-DD; month 01-12; day 01-28 in every month, 29-30 in all
 *    but 02, 31 in 01 03 05 07 08 10 12 (29 February is left out: whether
 *    it is valid depends on the year).
 *  - time: HH:MM:SS, an optional fraction .d+, then Z or +HH:MM / -HH:MM;
 *    HH 00-23, MM and SS 00-59 (no leap second).
 *  - date-time: date `T` time.
 *  - uuid: 8-4-4-4-12 hexadecimal digits (either case).
 *  - uri: http or https, `://`, a host of lower-case labels joined by dots
 *    (each [a-z0-9]+ pieces joined by single hyphens), an optional :port of
 *    1-5 digits, path segments `/` pchar*, an optional query `?` and an
 *    optional fragment `#` of (pchar | / | ?)*, where pchar is an unreserved
 *    character, one of !$&'()*+,;=:@ or a %XX escape (upper-case hex).
 *  - email: a local part of [A-Za-z0-9_+-]+ pieces joined by dots, `@`, two
 *    or more domain labels as in uri's host.
 *  - ipv4: four decimal octets 0-255 without leading zeros.
 *  - hostname: one to four labels joined by dots, each 1-61 characters of
 *    [A-Za-z0-9-] neither starting nor ending with `-` (at most 247
 *    characters, within ajv's 253).
 */
#include "gr_string.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CP_MAX 0x10FFFFu
#define SUR_LO 0xD800u
#define SUR_HI 0xDFFFu
#define GR_PATTERN_MAX_ATOMS 20000
#define MAX_NEST 64

/* ---- code point sets ------------------------------------------------------ */

void gr_cpset_init(gr_cpset *s) { memset(s, 0, sizeof *s); }

void gr_cpset_free(gr_cpset *s)
{
    free(s->r);
    memset(s, 0, sizeof *s);
}

static void cpset_reserve(gr_cpset *s, size_t n)
{
    if (n <= s->cap) return;
    size_t cap = s->cap ? s->cap * 2 : 8;
    while (cap < n) cap *= 2;
    s->r = xrealloc(s->r, cap * sizeof *s->r);
    s->cap = cap;
}

void gr_cpset_add(gr_cpset *s, uint32_t lo, uint32_t hi)
{
    if (hi > CP_MAX) hi = CP_MAX;
    if (lo > hi) return;
    size_t i = 0, j;
    while (i < s->n && s->r[i][1] + 1 < lo) i++; /* first range that touches or follows lo */
    for (j = i; j < s->n && s->r[j][0] <= hi + 1; j++) {} /* ranges [i, j) touch [lo, hi] */
    if (i == j) {
        cpset_reserve(s, s->n + 1);
        memmove(s->r + i + 1, s->r + i, (s->n - i) * sizeof *s->r);
        s->r[i][0] = lo;
        s->r[i][1] = hi;
        s->n++;
        return;
    }
    if (s->r[i][0] < lo) lo = s->r[i][0];
    if (s->r[j - 1][1] > hi) hi = s->r[j - 1][1];
    s->r[i][0] = lo;
    s->r[i][1] = hi;
    memmove(s->r + i + 1, s->r + j, (s->n - j) * sizeof *s->r);
    s->n -= j - i - 1;
}

static void cpset_clear(gr_cpset *s) { s->n = 0; }

static void cpset_union(gr_cpset *s, const gr_cpset *t)
{
    for (size_t i = 0; i < t->n; i++) gr_cpset_add(s, t->r[i][0], t->r[i][1]);
}

void gr_cpset_invert(gr_cpset *s)
{
    gr_cpset t;
    gr_cpset_init(&t);
    uint32_t next = 0; /* the lowest code point not yet decided */
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next) gr_cpset_add(&t, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= CP_MAX) gr_cpset_add(&t, next, CP_MAX);
    /* take the surrogates out of t */
    gr_cpset_free(s);
    gr_cpset_init(s);
    for (size_t i = 0; i < t.n; i++) {
        uint32_t lo = t.r[i][0], hi = t.r[i][1];
        if (lo < SUR_LO) gr_cpset_add(s, lo, hi < SUR_LO ? hi : SUR_LO - 1);
        if (hi > SUR_HI) gr_cpset_add(s, lo > SUR_HI ? lo : SUR_HI + 1, hi);
    }
    gr_cpset_free(&t);
}

void gr_cpset_all(gr_cpset *s)
{
    cpset_clear(s);
    gr_cpset_add(s, 0, SUR_LO - 1);
    gr_cpset_add(s, SUR_HI + 1, CP_MAX);
}

/* ---- where fragments go ------------------------------------------------------ */

/* Machine m of a builder, or (b NULL) a local NFA: the operands of an
 * intersection of patterns (gr_patterns), whose product goes to the builder. */
typedef struct ledge {
    int from, to, lo, hi; /* lo < 0: an epsilon edge */
    unsigned flags;
} ledge;

typedef struct lnfa {
    int n_states;
    ledge *e;
    size_t n_e, cap;
} lnfa;

typedef struct sink {
    gr_builder *b;
    int m;
    lnfa *l;
} sink;

static int sk_state(sink *k)
{
    if (k->b) return gr_state(k->b, k->m);
    return k->l->n_states++;
}

static void sk_edge(sink *k, int from, int to, int lo, int hi, unsigned flags)
{
    lnfa *l = k->l;
    if (l->n_e == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->e = xrealloc(l->e, l->cap * sizeof *l->e);
    }
    l->e[l->n_e++] = (ledge){from, to, lo, hi, flags};
}

static void sk_range(sink *k, int from, int to, int lo, int hi, unsigned flags)
{
    if (k->b) gr_range(k->b, k->m, from, to, lo, hi, flags);
    else sk_edge(k, from, to, lo, hi, flags);
}

static void sk_eps(sink *k, int from, int to)
{
    if (k->b) gr_eps(k->b, k->m, from, to);
    else sk_edge(k, from, to, -1, -1, 0);
}

/* ---- one character as bytes ------------------------------------------------ */

/* A tail of byte ranges that leads to `to`, and the state where it starts. */
typedef struct tail {
    int k;
    uint8_t lo[3], hi[3];
    int state;
} tail;

typedef struct chars_ctx {
    sink *k;
    int from, to;
    unsigned flags;
    tail *t;
    size_t n, cap;
} chars_ctx;

static int tail_state(chars_ctx *c, const uint8_t *lo, const uint8_t *hi, int k)
{
    if (k == 0) return c->to;
    for (size_t i = 0; i < c->n; i++)
        if (c->t[i].k == k && !memcmp(c->t[i].lo, lo, (size_t)k) && !memcmp(c->t[i].hi, hi, (size_t)k))
            return c->t[i].state;
    int next = tail_state(c, lo + 1, hi + 1, k - 1);
    int s = sk_state(c->k);
    sk_range(c->k, s, next, lo[0], hi[0], 0);
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->t = xrealloc(c->t, c->cap * sizeof *c->t);
    }
    tail *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    t->k = k;
    memcpy(t->lo, lo, (size_t)k);
    memcpy(t->hi, hi, (size_t)k);
    t->state = s;
    return s;
}

static int utf8_put(uint32_t c, uint8_t *o)
{
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | c >> 6);
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12);
        o[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18);
    o[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* lo..hi (no surrogates inside) as sequences of byte ranges. */
static void utf8_split(chars_ctx *c, uint32_t lo, uint32_t hi)
{
    static const uint32_t len_max[3] = {0x7F, 0x7FF, 0xFFFF};
    if (lo > hi) return;
    for (int k = 0; k < 3; k++)
        if (lo <= len_max[k] && hi > len_max[k]) {
            utf8_split(c, lo, len_max[k]);
            utf8_split(c, len_max[k] + 1, hi);
            return;
        }
    int n = hi < 0x80 ? 1 : hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t low = (1u << (6 * i)) - 1; /* the bits of the last i bytes */
        if ((lo & ~low) == (hi & ~low)) continue;
        if (lo & low) { /* lo's last i bytes do not start at 80: split there */
            utf8_split(c, lo, lo | low);
            utf8_split(c, (lo | low) + 1, hi);
            return;
        }
        if ((hi & low) != low) {
            utf8_split(c, lo, (hi & ~low) - 1);
            utf8_split(c, hi & ~low, hi);
            return;
        }
    }
    uint8_t a[4], z[4];
    utf8_put(lo, a);
    utf8_put(hi, z);
    int next = tail_state(c, a + 1, z + 1, n - 1);
    sk_range(c->k, c->from, next, a[0], z[0], c->flags);
}

static int hex_digit(int v) { return v < 10 ? '0' + v : 'a' + v - 10; }

/* The code points below 0x80 (ascii[c] set) as JSON string text. */
static void json_ascii(chars_ctx *c, const uint8_t *ascii)
{
    sink *k = c->k;
    for (int lo = 0x20; lo < 0x80; lo++) { /* literal: printable but '"' and '\\', and DEL */
        if (!ascii[lo] || lo == '"' || lo == '\\') continue;
        int hi = lo;
        while (hi + 1 < 0x80 && ascii[hi + 1] && hi + 1 != '"' && hi + 1 != '\\') hi++;
        sk_range(k, c->from, c->to, lo, hi, c->flags);
        lo = hi;
    }
    static const char short_esc[][2] = {{'"', '"'}, {'\\', '\\'}, {'\b', 'b'}, {'\f', 'f'},
                                        {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
    int need = 0;
    for (int i = 0; i < 0x20; i++) need |= ascii[i];
    need |= ascii['"'] | ascii['\\'];
    if (!need) return;
    int bs = sk_state(k);
    sk_range(k, c->from, bs, '\\', '\\', c->flags);
    uint8_t shortened[0x80] = {0};
    for (size_t i = 0; i < sizeof short_esc / sizeof short_esc[0]; i++) {
        int ch = short_esc[i][0];
        shortened[ch] = 1;
        if (ascii[ch]) sk_range(k, bs, c->to, short_esc[i][1], short_esc[i][1], 0);
    }
    int u00 = -1; /* after \u00 */
    for (int h = 0; h < 2; h++) {
        int any = 0;
        for (int l = 0; l < 16; l++) any |= ascii[h * 16 + l] && !shortened[h * 16 + l];
        if (!any) continue;
        if (u00 < 0) {
            int s1 = sk_state(k), s2 = sk_state(k);
            u00 = sk_state(k);
            sk_range(k, bs, s1, 'u', 'u', 0);
            sk_range(k, s1, s2, '0', '0', 0);
            sk_range(k, s2, u00, '0', '0', 0);
        }
        int hs = sk_state(k);
        sk_range(k, u00, hs, '0' + h, '0' + h, 0);
        for (int l = 0; l < 16; l++) {
            int ch = h * 16 + l;
            if (ascii[ch] && !shortened[ch]) sk_range(k, hs, c->to, hex_digit(l), hex_digit(l), 0);
        }
    }
}

static void chars_to(sink *k, int from, int to, const gr_cpset *s, enum gr_str_mode mode, unsigned first_flags)
{
    chars_ctx c = {k, from, to, first_flags, NULL, 0, 0};
    uint8_t ascii[0x80] = {0};
    int any_ascii = 0;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1] > CP_MAX ? CP_MAX : s->r[i][1];
        if (lo > hi) continue;
        if (mode == GR_STR_JSON && lo < 0x80) {
            for (uint32_t x = lo; x <= hi && x < 0x80; x++) ascii[x] = 1;
            any_ascii = 1;
            if (hi < 0x80) continue;
            lo = 0x80;
        }
        if (lo < SUR_LO) utf8_split(&c, lo, hi < SUR_LO ? hi : SUR_LO - 1);
        if (hi > SUR_HI) utf8_split(&c, lo > SUR_HI ? lo : SUR_HI + 1, hi);
    }
    if (any_ascii) json_ascii(&c, ascii);
    free(c.t);
}

void gr_chars(gr_builder *b, int m, int from, int to, const gr_cpset *s, enum gr_str_mode mode, unsigned first_flags)
{
    sink k = {b, m, NULL};
    chars_to(&k, from, to, s, mode, first_flags);
}

/* ---- patterns: the tree ----------------------------------------------------- */

enum { N_SET, N_CAT, N_ALT, N_REP };

typedef struct pnode {
    int kind;
    int kid, last, next; /* first and last child, next sibling; -1 for none */
    uint32_t min, max;   /* N_REP; max GR_COUNT_INF for none */
    unsigned anchors;    /* N_CAT of the top level: 1 = `^` before, 2 = `$` after */
    size_t off;          /* where it starts in the pattern */
    gr_cpset set;        /* N_SET */
} pnode;

typedef struct parser {
    const char *p;
    size_t n, i;
    pnode *nd;
    size_t n_nd, cap;
    df_error *err;
    const char *what; /* "pattern" or "format \"date\"": the messages' subject */
} parser;

static int node_new(parser *P, int kind, size_t off)
{
    if (P->n_nd == P->cap) {
        P->cap = P->cap ? P->cap * 2 : 32;
        P->nd = xrealloc(P->nd, P->cap * sizeof *P->nd);
    }
    pnode *x = &P->nd[P->n_nd];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->kid = x->last = x->next = -1;
    x->off = off;
    gr_cpset_init(&x->set);
    return (int)P->n_nd++;
}

static void node_add(parser *P, int parent, int kid)
{
    if (P->nd[parent].last < 0) P->nd[parent].kid = kid;
    else P->nd[P->nd[parent].last].next = kid;
    P->nd[parent].last = kid;
}

static void parser_free(parser *P)
{
    for (size_t i = 0; i < P->n_nd; i++) gr_cpset_free(&P->nd[i].set);
    free(P->nd);
    P->nd = NULL;
    P->n_nd = P->cap = 0;
}

static int unsupported(parser *P, size_t off, const char *what)
{
    return df_err_set(P->err, DF_ERR_UNSUPPORTED, (int64_t)off, "%s: %s at offset %zu is not supported", P->what,
                      what, off);
}

__attribute__((format(printf, 3, 4))) static int bad(parser *P, size_t off, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return df_err_set(P->err, DF_ERR_ARG, (int64_t)off, "%s: %s at offset %zu", P->what, msg, off);
}

static int peek(const parser *P) { return P->i < P->n ? (unsigned char)P->p[P->i] : -1; }

static void set_digit(gr_cpset *s) { gr_cpset_add(s, '0', '9'); }

static void set_word(gr_cpset *s)
{
    gr_cpset_add(s, '0', '9');
    gr_cpset_add(s, 'A', 'Z');
    gr_cpset_add(s, '_', '_');
    gr_cpset_add(s, 'a', 'z');
}

/* ECMAScript's WhiteSpace and LineTerminator */
static void set_space(gr_cpset *s)
{
    static const uint32_t r[][2] = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                    {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) gr_cpset_add(s, r[i][0], r[i][1]);
}

/* `.`: anything but the line terminators */
static void set_dot(gr_cpset *s)
{
    gr_cpset_add(s, '\n', '\n');
    gr_cpset_add(s, '\r', '\r');
    gr_cpset_add(s, 0x2028, 0x2029);
    gr_cpset_invert(s);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* exactly k hex digits at P->i; -1 when they are not there */
static int64_t hex_fixed(parser *P, int k)
{
    if (P->n - P->i < (size_t)k) return -1;
    int64_t v = 0;
    for (int j = 0; j < k; j++) {
        int h = hexval((unsigned char)P->p[P->i + (size_t)j]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    P->i += (size_t)k;
    return v;
}

/* One literal character of the pattern (UTF-8) into *cp. */
static int literal(parser *P, uint32_t *cp)
{
    size_t k = utf8_char_len((const unsigned char *)P->p + P->i, P->n - P->i);
    if (!k) return bad(P, P->i, "invalid UTF-8");
    *cp = utf8_cp((const unsigned char *)P->p + P->i, (int)k);
    P->i += k;
    return 0;
}

/* An escape at P->i (the backslash): a character (*cp, *is_set = 0) or a
 * class escape added to *set (*is_set = 1). */
static int escape(parser *P, int in_class, uint32_t *cp, gr_cpset *set, int *is_set)
{
    size_t at = P->i++;
    *is_set = 0;
    int c = peek(P);
    if (c < 0) return bad(P, at, "the pattern ends with a lone backslash");
    P->i++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': {
        gr_cpset t;
        gr_cpset_init(&t);
        if (c == 'd' || c == 'D') set_digit(&t);
        else if (c == 'w' || c == 'W') set_word(&t);
        else set_space(&t);
        if (c == 'D' || c == 'W' || c == 'S') gr_cpset_invert(&t);
        cpset_union(set, &t);
        gr_cpset_free(&t);
        *is_set = 1;
        return 0;
    }
    case 't': *cp = '\t'; return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0':
        if (peek(P) >= '0' && peek(P) <= '9') return bad(P, at, "octal escape \\0%c", peek(P));
        *cp = 0;
        return 0;
    case 'b':
        if (in_class) { *cp = '\b'; return 0; }
        return unsupported(P, at, "word boundary \\b");
    case 'B': return unsupported(P, at, "word boundary \\B");
    case 'k': return unsupported(P, at, "named backreference \\k");
    case 'p': case 'P': return unsupported(P, at, c == 'p' ? "Unicode property escape \\p" : "Unicode property escape \\P");
    case 'c': {
        int l = peek(P);
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) return bad(P, at, "\\c without a letter");
        P->i++;
        *cp = (uint32_t)l & 31;
        return 0;
    }
    case 'x': {
        int64_t v = hex_fixed(P, 2);
        if (v < 0) return bad(P, at, "\\x without two hexadecimal digits");
        *cp = (uint32_t)v;
        return 0;
    }
    case 'u': {
        if (peek(P) == '{') {
            P->i++;
            uint32_t v = 0;
            size_t nd = 0;
            int h;
            while ((h = hexval(peek(P))) >= 0) {
                v = v * 16 + (uint32_t)h;
                if (v > CP_MAX) return bad(P, at, "\\u{...} above 10FFFF");
                P->i++;
                nd++;
            }
            if (!nd || peek(P) != '}') return bad(P, at, "malformed \\u{...}");
            P->i++;
            *cp = v;
            return 0;
        }
        int64_t v = hex_fixed(P, 4);
        if (v < 0) return bad(P, at, "\\u without four hexadecimal digits");
        if (v >= 0xD800 && v <= 0xDBFF && P->n - P->i >= 6 && P->p[P->i] == '\\' && P->p[P->i + 1] == 'u') {
            size_t save = P->i;
            P->i += 2;
            int64_t lo = hex_fixed(P, 4);
            if (lo >= 0xDC00 && lo <= 0xDFFF) v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            else P->i = save;
        }
        *cp = (uint32_t)v;
        return 0;
    }
    default: break;
    }
    if (c >= '1' && c <= '9') return unsupported(P, at, "backreference");
    if (c == '-' || (c < 0x80 && c > 0x20 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                                               (c >= 'A' && c <= 'Z') || c == 0x7F))) {
        *cp = (uint32_t)c; /* escaped punctuation: itself */
        return 0;
    }
    return bad(P, at, "unknown escape \\%c", c >= 0x20 && c < 0x7F ? c : '?');
}

static int parse_class(parser *P, int *out)
{
    size_t at = P->i++;
    int x = node_new(P, N_SET, at);
    gr_cpset set;
    gr_cpset_init(&set);
    int neg = peek(P) == '^';
    if (neg) P->i++;
    while (peek(P) != ']') {
        if (peek(P) < 0) { gr_cpset_free(&set); return bad(P, at, "missing ] of the class"); }
        uint32_t lo, hi;
        int is_set;
        size_t a0 = P->i;
        if (peek(P) == '\\' ? escape(P, 1, &lo, &set, &is_set) : (is_set = 0, literal(P, &lo))) {
            gr_cpset_free(&set);
            return -1;
        }
        if (peek(P) == '-' && P->i + 1 < P->n && P->p[P->i + 1] != ']') {
            size_t dash = P->i++;
            int is_set2;
            if (peek(P) == '\\' ? escape(P, 1, &hi, &set, &is_set2) : (is_set2 = 0, literal(P, &hi))) {
                gr_cpset_free(&set);
                return -1;
            }
            if (is_set || is_set2) { gr_cpset_free(&set); return bad(P, dash, "a class escape as a range end"); }
            if (lo > hi) { gr_cpset_free(&set); return bad(P, a0, "range out of order in class"); }
            gr_cpset_add(&set, lo, hi);
        } else if (!is_set) {
            gr_cpset_add(&set, lo, lo);
        }
    }
    P->i++;
    if (neg) gr_cpset_invert(&set);
    gr_cpset_free(&P->nd[x].set);
    P->nd[x].set = set;
    *out = x;
    return 0;
}

static int parse_alt(parser *P, int depth, int top, int *out);

static int parse_group(parser *P, int depth, int *out)
{
    size_t at = P->i++;
    if (peek(P) == '?') {
        P->i++;
        int c = peek(P);
        if (c == ':') P->i++;
        else if (c == '=') return unsupported(P, at, "lookahead (?=");
        else if (c == '!') return unsupported(P, at, "lookahead (?!");
        else if (c == '<' && P->i + 1 < P->n && P->p[P->i + 1] == '=') return unsupported(P, at, "lookbehind (?<=");
        else if (c == '<' && P->i + 1 < P->n && P->p[P->i + 1] == '!') return unsupported(P, at, "lookbehind (?<!");
        else if (c == '<') { /* a named group: a group */
            P->i++;
            while (peek(P) >= 0 && peek(P) != '>') P->i++;
            if (peek(P) != '>') return bad(P, at, "unterminated group name");
            P->i++;
        } else {
            return unsupported(P, at, "group modifier (?");
        }
    }
    if (depth >= MAX_NEST) return unsupported(P, at, "nesting deeper than 64 groups");
    if (parse_alt(P, depth + 1, 0, out)) return -1;
    if (peek(P) != ')') return bad(P, at, "missing ) of the group");
    P->i++;
    /* (x) is x */
    pnode *a = &P->nd[*out];
    if (a->kid >= 0 && a->kid == a->last) {
        int cat = a->kid;
        if (P->nd[cat].kid >= 0 && P->nd[cat].kid == P->nd[cat].last) *out = P->nd[cat].kid;
    }
    return 0;
}

static int parse_atom(parser *P, int depth, int *out)
{
    size_t at = P->i;
    int c = peek(P);
    switch (c) {
    case '(': return parse_group(P, depth, out);
    case '[': return parse_class(P, out);
    case '*': case '+': case '?': case '{': return bad(P, at, "'%c' has nothing to repeat", c);
    case ']': case '}': return bad(P, at, "lone '%c'", c);
    default: break;
    }
    int x = node_new(P, N_SET, at);
    if (c == '.') {
        P->i++;
        set_dot(&P->nd[x].set);
    } else if (c == '\\') {
        uint32_t cp;
        int is_set;
        if (escape(P, 0, &cp, &P->nd[x].set, &is_set)) return -1;
        if (!is_set) gr_cpset_add(&P->nd[x].set, cp, cp);
    } else {
        uint32_t cp;
        if (literal(P, &cp)) return -1;
        gr_cpset_add(&P->nd[x].set, cp, cp);
    }
    *out = x;
    return 0;
}

static uint32_t number(parser *P, int *ok)
{
    uint32_t v = 0;
    *ok = 0;
    while (peek(P) >= '0' && peek(P) <= '9') {
        v = v > 100000000u ? 1000000000u : v * 10 + (uint32_t)(peek(P) - '0');
        P->i++;
        *ok = 1;
    }
    return v;
}

/* A quantifier after atom x, if any, into *out (x itself without one). */
static int parse_quant(parser *P, int x, int *out)
{
    size_t at = P->i;
    uint32_t lo, hi;
    int c = peek(P);
    *out = x;
    if (c == '*') lo = 0, hi = GR_COUNT_INF;
    else if (c == '+') lo = 1, hi = GR_COUNT_INF;
    else if (c == '?') lo = 0, hi = 1;
    else if (c == '{') {
        P->i++;
        int ok, ok2;
        lo = number(P, &ok);
        hi = lo;
        if (ok && peek(P) == ',') {
            P->i++;
            hi = number(P, &ok2);
            if (!ok2) hi = GR_COUNT_INF;
        }
        if (!ok || peek(P) != '}') return bad(P, at, "'{' that is not a quantifier {n}, {n,} or {n,m}");
        if (lo > hi) return bad(P, at, "numbers out of order in quantifier");
    } else {
        return 0;
    }
    P->i++;
    if (peek(P) == '?') P->i++; /* lazy: the same language */
    c = peek(P);
    if (c == '*' || c == '+' || c == '?' || c == '{') return bad(P, P->i, "'%c' has nothing to repeat", c);
    int r = node_new(P, N_REP, at);
    P->nd[r].min = lo;
    P->nd[r].max = hi;
    node_add(P, r, x);
    *out = r;
    return 0;
}

static int parse_seq(parser *P, int depth, int top, int *out)
{
    int cat = node_new(P, N_CAT, P->i);
    if (top && peek(P) == '^') {
        P->i++;
        P->nd[cat].anchors |= 1;
    }
    for (;;) {
        int c = peek(P);
        if (c < 0 || c == '|' || c == ')') break;
        if (c == '$') {
            if (top && (P->i + 1 == P->n || P->p[P->i + 1] == '|')) {
                P->i++;
                P->nd[cat].anchors |= 2;
                break;
            }
            return unsupported(P, P->i, "$ other than at the end of the pattern or of a top-level alternative");
        }
        if (c == '^') return unsupported(P, P->i, "^ other than at the start of the pattern or of a top-level alternative");
        int a = -1, q = -1;
        if (parse_atom(P, depth, &a) || parse_quant(P, a, &q)) return -1;
        node_add(P, cat, q);
    }
    *out = cat;
    return 0;
}

static int parse_alt(parser *P, int depth, int top, int *out)
{
    int alt = node_new(P, N_ALT, P->i);
    for (;;) {
        int s = -1;
        if (parse_seq(P, depth, top, &s)) return -1;
        node_add(P, alt, s);
        if (peek(P) != '|') break;
        P->i++;
    }
    if (top && peek(P) == ')') return bad(P, P->i, "unmatched )");
    *out = alt;
    return 0;
}

/* ---- patterns: the NFA ------------------------------------------------------ */

typedef struct emitter {
    sink *k;
    enum gr_str_mode mode;
    unsigned flags;
    parser *P;
} emitter;

/* Character positions after unrolling (saturating), or -1 after refusing a bound. */
static int64_t atoms(parser *P, int x)
{
    const pnode *n = &P->nd[x];
    if (n->kind == N_SET) return 1;
    if (n->kind == N_REP) {
        if (n->min > GR_PATTERN_MAX_REPEAT || (n->max != GR_COUNT_INF && n->max > GR_PATTERN_MAX_REPEAT)) {
            char what[96];
            snprintf(what, sizeof what, "a repetition bound above %d", GR_PATTERN_MAX_REPEAT);
            unsupported(P, n->off, what);
            return -1;
        }
        int64_t k = atoms(P, n->kid);
        if (k < 0) return -1;
        int64_t copies = n->max == GR_COUNT_INF ? (int64_t)n->min + 1 : (int64_t)n->max;
        int64_t t = k * copies;
        return t > GR_PATTERN_MAX_ATOMS ? GR_PATTERN_MAX_ATOMS + 1 : t;
    }
    int64_t t = 0;
    for (int k = n->kid; k >= 0; k = P->nd[k].next) {
        int64_t a = atoms(P, k);
        if (a < 0) return -1;
        t += a;
        if (t > GR_PATTERN_MAX_ATOMS) t = GR_PATTERN_MAX_ATOMS + 1;
    }
    return t;
}

static void emit(emitter *E, int x, int from, int to)
{
    const pnode *n = &E->P->nd[x];
    sink *sk = E->k;
    switch (n->kind) {
    case N_SET: chars_to(sk, from, to, &n->set, E->mode, E->flags); return;
    case N_ALT:
        for (int k = n->kid; k >= 0; k = E->P->nd[k].next) emit(E, k, from, to);
        return;
    case N_CAT: {
        if (n->kid < 0) { sk_eps(sk, from, to); return; }
        int s = from;
        for (int k = n->kid; k >= 0; k = E->P->nd[k].next) {
            int t = E->P->nd[k].next < 0 ? to : sk_state(sk);
            emit(E, k, s, t);
            s = t;
        }
        return;
    }
    case N_REP: {
        uint32_t lo = n->min, hi = n->max;
        int kid = n->kid, s = from;
        if (lo == 0 && hi == 0) { sk_eps(sk, from, to); return; }
        for (uint32_t k = 0; k < lo; k++) {
            int t = k + 1 == lo && hi == lo ? to : sk_state(sk);
            emit(E, kid, s, t);
            s = t;
        }
        if (hi == lo) return;
        if (hi == GR_COUNT_INF) {
            int l = sk_state(sk);
            sk_eps(sk, s, l);
            emit(E, kid, l, l);
            sk_eps(sk, l, to);
            return;
        }
        for (uint32_t k = lo; k < hi; k++) {
            sk_eps(sk, s, to);
            int t = k + 1 == hi ? to : sk_state(sk);
            emit(E, kid, s, t);
            s = t;
        }
        return;
    }
    default: CHECK(0);
    }
}

/* from -> loop state -> to: any number of characters of set. */
static void loop_chars(sink *k, int from, int to, const gr_cpset *set, enum gr_str_mode mode, unsigned flags)
{
    int l = sk_state(k);
    sk_eps(k, from, l);
    chars_to(k, l, l, set, mode, flags);
    sk_eps(k, l, to);
}

/* The pattern as its parse tree (top: an N_ALT of N_CATs with anchors). */
static int parse_pattern(parser *P, int *top)
{
    if (parse_alt(P, 0, 1, top)) return -1;
    CHECK(P->i == P->n);
    return 0;
}

/* The whole pattern one set C repeated between both anchors: its node and bounds. */
static int single_class(const parser *P, int top, int *set, uint32_t *lo, uint32_t *hi)
{
    const pnode *a = &P->nd[top];
    if (a->kid < 0 || a->kid != a->last) return 0;
    const pnode *cat = &P->nd[a->kid];
    if (cat->anchors != 3 || cat->kid < 0 || cat->kid != cat->last) return 0;
    const pnode *x = &P->nd[cat->kid];
    if (x->kind == N_SET) {
        *set = cat->kid;
        *lo = *hi = 1;
        return 1;
    }
    if (x->kind == N_REP && P->nd[x->kid].kind == N_SET) {
        *set = x->kid;
        *lo = x->min;
        *hi = x->max;
        return 1;
    }
    return 0;
}

/* One pattern into k, from -> to (from gets no edge in, to none out). */
static int compile(sink *k, int from, int to, const char *pat, size_t len, enum gr_str_mode mode, unsigned flags,
                   uint32_t *cmin, uint32_t *cmax, int *narrowed, const char *what, df_error *err)
{
    if (narrowed) *narrowed = 0;
    parser P = {pat, len, 0, NULL, 0, 0, err, what};
    int top = -1, rc = -1;
    if (parse_pattern(&P, &top)) goto done;
    int set = -1;
    uint32_t lo, hi;
    if (cmin && (flags & GR_INC) && single_class(&P, top, &set, &lo, &hi)) {
        uint32_t nmin = *cmin > lo ? *cmin : lo, nmax = *cmax < hi ? *cmax : hi;
        if (nmin > nmax) {
            df_err_set(err, DF_ERR_ARG, -1, "%s \"%.*s\" and minLength/maxLength allow no string", what,
                       len > 200 ? 200 : (int)len, pat);
            goto done;
        }
        *cmin = nmin;
        *cmax = nmax;
        if (narrowed) *narrowed = 1;
        loop_chars(k, from, to, &P.nd[set].set, mode, flags);
        rc = 0;
        goto done;
    }
    int64_t n_atoms = atoms(&P, top);
    if (n_atoms < 0) goto done;
    if (n_atoms > GR_PATTERN_MAX_ATOMS) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                   "%s: more than %d character positions once its repetitions are unrolled is not supported", what,
                   GR_PATTERN_MAX_ATOMS);
        goto done;
    }
    emitter E = {k, mode, flags, &P};
    gr_cpset any;
    gr_cpset_init(&any);
    gr_cpset_all(&any);
    int pre = -1, post = -1; /* the loops of any text before / after an unanchored side */
    for (int x = P.nd[top].kid; x >= 0; x = P.nd[x].next) {
        unsigned anc = P.nd[x].anchors;
        if (!(anc & 1) && pre < 0) {
            pre = sk_state(k);
            sk_eps(k, from, pre);
            chars_to(k, pre, pre, &any, mode, flags);
        }
        if (!(anc & 2) && post < 0) {
            post = sk_state(k);
            chars_to(k, post, post, &any, mode, flags);
            sk_eps(k, post, to);
        }
        emit(&E, x, anc & 1 ? from : pre, anc & 2 ? to : post);
    }
    gr_cpset_free(&any);
    rc = 0;
done:
    parser_free(&P);
    return rc;
}

int gr_pattern(gr_builder *b, int m, int from, int to, const char *pat, size_t len, enum gr_str_mode mode,
               unsigned first_flags, uint32_t *cmin, uint32_t *cmax, df_error *err)
{
    return gr_patterns(b, m, from, to, &pat, &len, pat ? 1 : 0, mode, first_flags, cmin, cmax, err);
}

/* ---- intersections -------------------------------------------------------------- */

/* Local NFAs have their start at 0 and their one accepting state at 1;
 * compile() adds no edge into 0 and none out of 1, and neither does the
 * product, so (0, 0) and (1, 1) are the product's 0 and 1. */

static void lnfa_free(lnfa *l)
{
    free(l->e);
    memset(l, 0, sizeof *l);
}

/* edges by source: idx[off[s] .. off[s + 1]) */
static void lnfa_index(const lnfa *l, int **off, int **idx)
{
    *off = xcalloc((size_t)l->n_states + 1, sizeof **off);
    *idx = xmalloc((l->n_e ? l->n_e : 1) * sizeof **idx);
    for (size_t i = 0; i < l->n_e; i++) (*off)[l->e[i].from + 1]++;
    for (int s = 0; s < l->n_states; s++) (*off)[s + 1] += (*off)[s];
    int *fill = xmalloc(((size_t)l->n_states + 1) * sizeof *fill);
    memcpy(fill, *off, ((size_t)l->n_states + 1) * sizeof *fill);
    for (size_t i = 0; i < l->n_e; i++) (*idx)[fill[l->e[i].from]++] = (int)i;
    free(fill);
}

typedef struct pairmap {
    uint64_t *key; /* (p << 32 | q) + 1; 0 = empty */
    int *val;
    size_t cap, n;
} pairmap;

static size_t pm_slot(const pairmap *h, uint64_t key)
{
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (h->cap - 1);
    while (h->key[i] && h->key[i] != key) i = (i + 1) & (h->cap - 1);
    return i;
}

static void pm_grow(pairmap *h)
{
    pairmap g = {xcalloc(h->cap * 2, sizeof *g.key), xmalloc(h->cap * 2 * sizeof *g.val), h->cap * 2, h->n};
    for (size_t i = 0; i < h->cap; i++)
        if (h->key[i]) {
            size_t j = pm_slot(&g, h->key[i]);
            g.key[j] = h->key[i];
            g.val[j] = h->val[i];
        }
    free(h->key);
    free(h->val);
    *h = g;
}

/* The state of pair (p, q) in r, made (and queued) when new. */
static int pair_state(pairmap *h, lnfa *r, int **queue, size_t *qn, size_t *qcap, int p, int q)
{
    if (p == 0 && q == 0) return 0;
    if (p == 1 && q == 1) return 1;
    uint64_t key = ((uint64_t)(uint32_t)p << 32 | (uint32_t)q) + 1;
    if (2 * (h->n + 1) > h->cap) pm_grow(h);
    size_t i = pm_slot(h, key);
    if (h->key[i]) return h->val[i];
    h->key[i] = key;
    h->val[i] = r->n_states++;
    h->n++;
    if (*qn + 2 > *qcap) {
        *qcap = *qcap ? *qcap * 2 : 256;
        *queue = xrealloc(*queue, *qcap * sizeof **queue);
    }
    (*queue)[(*qn)++] = p;
    (*queue)[(*qn)++] = q;
    return h->val[i];
}

/* r = a x b: both take their epsilon edges one at a time and their symbol
 * edges together on the common symbols. */
static int product(const lnfa *a, const lnfa *b, lnfa *r, int limit, df_error *err)
{
    int *ao, *ai, *bo, *bi;
    lnfa_index(a, &ao, &ai);
    lnfa_index(b, &bo, &bi);
    memset(r, 0, sizeof *r);
    r->n_states = 2;
    sink k = {NULL, 0, r};
    pairmap h = {xcalloc(1024, sizeof *h.key), xmalloc(1024 * sizeof *h.val), 1024, 0};
    int *queue = NULL;
    size_t qn = 0, qcap = 0, qi = 0;
    int rc = 0;
    /* the queue holds pairs other than (0, 0) and (1, 1); those two first */
    int todo[2][2] = {{0, 0}, {1, 1}};
    for (int t = 0;; t++) {
        int p, q;
        if (t < 2) p = todo[t][0], q = todo[t][1];
        else if (qi < qn) p = queue[qi], q = queue[qi + 1], qi += 2;
        else break;
        if (r->n_states > limit) {
            rc = df_err_set(err, DF_ERR_LIMIT, -1, "patterns: their intersection needs more than %d states", limit);
            break;
        }
        int me = pair_state(&h, r, &queue, &qn, &qcap, p, q);
        for (int x = ao[p]; x < ao[p + 1]; x++) {
            const ledge *e = &a->e[ai[x]];
            if (e->lo < 0) sk_eps(&k, me, pair_state(&h, r, &queue, &qn, &qcap, e->to, q));
        }
        for (int y = bo[q]; y < bo[q + 1]; y++) {
            const ledge *f = &b->e[bi[y]];
            if (f->lo < 0) sk_eps(&k, me, pair_state(&h, r, &queue, &qn, &qcap, p, f->to));
        }
        for (int x = ao[p]; x < ao[p + 1]; x++) {
            const ledge *e = &a->e[ai[x]];
            if (e->lo < 0) continue;
            for (int y = bo[q]; y < bo[q + 1]; y++) {
                const ledge *f = &b->e[bi[y]];
                if (f->lo < 0) continue;
                int lo = e->lo > f->lo ? e->lo : f->lo, hi = e->hi < f->hi ? e->hi : f->hi;
                if (lo > hi) continue;
                int to = pair_state(&h, r, &queue, &qn, &qcap, e->to, f->to);
                sk_range(&k, me, to, lo, hi, e->flags | f->flags);
            }
        }
    }
    free(ao);
    free(ai);
    free(bo);
    free(bi);
    free(h.key);
    free(h.val);
    free(queue);
    if (rc) lnfa_free(r);
    return rc;
}

int gr_patterns(gr_builder *b, int m, int from, int to, const char *const *pats, const size_t *lens, int n,
                enum gr_str_mode mode, unsigned first_flags, uint32_t *cmin, uint32_t *cmax, df_error *err)
{
    if (n <= 0) {
        gr_cpset any;
        gr_cpset_init(&any);
        gr_cpset_all(&any);
        sink k = {b, m, NULL};
        loop_chars(&k, from, to, &any, mode, first_flags);
        gr_cpset_free(&any);
        return 0;
    }
    lnfa acc = {0}, op = {0}, r = {0};
    int rc = -1, all_narrowed = 1;
    for (int i = 0; i < n; i++) {
        op.n_states = 2;
        sink k = {NULL, 0, &op};
        int nar;
        if (compile(&k, 0, 1, pats[i], lens[i], mode, first_flags, cmin, cmax, &nar, "pattern", err)) {
            if (n > 1) df_err_prefix(err, "pattern %d of %d: ", i + 1, n);
            goto done;
        }
        all_narrowed &= nar;
        if (i == 0) {
            acc = op;
        } else {
            if (product(&acc, &op, &r, GR_PATTERN_MAX_PRODUCT, err)) goto done;
            lnfa_free(&acc);
            lnfa_free(&op);
            acc = r;
            memset(&r, 0, sizeof r);
        }
        memset(&op, 0, sizeof op);
    }
    /* Lengths: the counter's window is exact for a loop of one class, but
     * its bounds (fewest / most characters left) can miss a gap in another
     * pattern's lengths (^(?:aaa)+$ with 4..5 would strand after "aaa"), so
     * the lengths go into the automaton too when that stays small (4 times
     * the pattern's states, or 1024): then every state left can finish inside
     * the window.  A bigger product (^[a-z]{1,64}@... with maxLength 254,
     * or an unanchored pattern) keeps the counter alone, whose bounds are
     * exact when each state's remaining lengths have no gap. */
    if (cmin && (first_flags & GR_INC) && !all_narrowed && (*cmin > 0 || *cmax != GR_COUNT_INF) &&
        *cmin <= GR_PATTERN_MAX_REPEAT && (*cmax <= GR_PATTERN_MAX_REPEAT || *cmax == GR_COUNT_INF)) {
        char lp[64];
        if (*cmax == GR_COUNT_INF) snprintf(lp, sizeof lp, "^[\\s\\S]{%u,}$", *cmin);
        else snprintf(lp, sizeof lp, "^[\\s\\S]{%u,%u}$", *cmin, *cmax);
        op.n_states = 2;
        sink k = {NULL, 0, &op};
        df_error scratch = {0};
        CHECK(compile(&k, 0, 1, lp, strlen(lp), mode, first_flags, NULL, NULL, NULL, "length", &scratch) == 0);
        int limit = 4 * acc.n_states;
        if (limit < 1024) limit = 1024;
        if (limit > GR_PATTERN_MAX_PRODUCT) limit = GR_PATTERN_MAX_PRODUCT;
        if (product(&acc, &op, &r, limit, &scratch) == 0) {
            lnfa_free(&acc);
            acc = r;
            memset(&r, 0, sizeof r);
        }
        lnfa_free(&op);
    }
    /* into the builder: 0 is from, 1 is to */
    int *id = xmalloc((size_t)acc.n_states * sizeof *id);
    id[0] = from;
    id[1] = to;
    for (int st = 2; st < acc.n_states; st++) id[st] = gr_state(b, m);
    for (size_t i = 0; i < acc.n_e; i++) {
        const ledge *e = &acc.e[i];
        if (e->lo < 0) gr_eps(b, m, id[e->from], id[e->to]);
        else gr_range(b, m, id[e->from], id[e->to], e->lo, e->hi, e->flags);
    }
    free(id);
    rc = 0;
done:
    lnfa_free(&acc);
    lnfa_free(&op);
    lnfa_free(&r);
    return rc;
}

/* ---- formats ------------------------------------------------------------------ */

#define FMT_DATE "[0-9]{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
#define FMT_TIME "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define FMT_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,59}[A-Za-z0-9])?"
#define FMT_DLABEL "[a-z0-9]+(?:-[a-z0-9]+)*"
#define FMT_HOST FMT_DLABEL "(?:\\." FMT_DLABEL ")*"
#define FMT_PCHAR "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-F]{2})"

static const struct {
    const char *name, *pattern;
} formats[] = {
    {"date", "^" FMT_DATE "$"},
    {"time", "^" FMT_TIME "$"},
    {"date-time", "^" FMT_DATE "T" FMT_TIME "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"uri", "^https?://" FMT_HOST "(?::[0-9]{1,5})?(?:/" FMT_PCHAR "*)*(?:\\?(?:" FMT_PCHAR "|[/?])*)?"
            "(?:#(?:" FMT_PCHAR "|[/?])*)?$"},
    {"email", "^[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@" FMT_DLABEL "(?:\\." FMT_DLABEL ")+$"},
    {"ipv4", "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
    {"hostname", "^" FMT_LABEL "(?:\\." FMT_LABEL "){0,3}$"},
};

const char *gr_format_pattern(const char *format)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (!strcmp(format, formats[i].name)) return formats[i].pattern;
    return NULL;
}

int gr_format(gr_builder *b, int m, int from, int to, const char *format, enum gr_str_mode mode, unsigned first_flags,
              df_error *err)
{
    const char *pat = gr_format_pattern(format);
    if (!pat)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "format \"%.100s\" is not supported (supported: date, time, date-time, uuid, uri, email, "
                          "ipv4, hostname)",
                          format);
    char what[64];
    snprintf(what, sizeof what, "format \"%s\"", format);
    sink k = {b, m, NULL};
    return compile(&k, from, to, pat, strlen(pat), mode, first_flags, NULL, NULL, NULL, what, err);
}
