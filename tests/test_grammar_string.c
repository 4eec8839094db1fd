/* test_grammar_string.c - gr_string.c through the grammar builder and
 * gr_reference_accepts: code point sets; one character as raw UTF-8 and
 * as JSON string text (each code point's one spelling accepted, every
 * other spelling refused); patterns against a hand-written table and
 * against PCRE2 on random patterns and strings (the ECMAScript classes
 * spelled out for PCRE2 where the two differ); refused constructs with
 * their offsets; the character counter narrowed by `^C{n,m}$`; formats.
 */
#include "gr_string.h"
#include "grammar.h"
#include "harness.h"
#include "util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint32_t rnd(uint32_t n)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return n ? (uint32_t)(z % n) : 0;
}

static int put_utf8(uint32_t c, char *o)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | (c >> 6 & 0x3F)); o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* The one JSON spelling of UTF-8 text s[0..n) (no quotes) into o; its length. */
static size_t json_text(const char *s, size_t n, char *o)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                      : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (e) { memcpy(o + k, e, 2); k += 2; }
        else if (c < 0x20) k += (size_t)sprintf(o + k, "\\u%04x", c);
        else o[k++] = (char)c;
    }
    return k;
}

/* A machine "s" with start 0 and one accepting state, built with fill(). */
typedef struct mk {
    gr_builder *b;
    int m, to;
} mk;

static mk mk_new(void)
{
    mk k;
    k.b = gr_builder_new();
    k.m = gr_machine(k.b, "s");
    k.to = gr_state(k.b, k.m);
    gr_accept(k.b, k.m, k.to);
    return k;
}

static gr_grammar *mk_build(mk *k, df_error *err)
{
    gr_grammar *g = NULL;
    if (gr_build(k->b, k->m, &g, err)) g = NULL;
    gr_builder_free(k->b);
    k->b = NULL;
    return g;
}

static int accepts(const gr_grammar *g, const char *s, size_t n)
{
    int syms[4096];
    if (n > 4096) return -1;
    for (size_t i = 0; i < n; i++) syms[i] = (unsigned char)s[i];
    return gr_reference_accepts(g, syms, n, 1);
}

static int accepts_str(const gr_grammar *g, const char *s) { return accepts(g, s, strlen(s)); }

/* The pattern's grammar (counter from cmin..cmax when either is set). */
static gr_grammar *pattern_grammar(const char *pat, enum gr_str_mode mode, uint32_t *cmin, uint32_t *cmax,
                                   df_error *err, int *n_states)
{
    mk k = mk_new();
    uint32_t lo = cmin ? *cmin : 0, hi = cmax ? *cmax : GR_COUNT_INF;
    if (gr_pattern(k.b, k.m, 0, k.to, pat, strlen(pat), mode, GR_INC, &lo, &hi, err)) {
        gr_builder_free(k.b);
        return NULL;
    }
    if (lo > 0 || hi != GR_COUNT_INF) gr_counter(k.b, k.m, lo, hi);
    if (n_states) *n_states = gr_n_states(k.b, k.m);
    if (cmin) *cmin = lo;
    if (cmax) *cmax = hi;
    return mk_build(&k, err);
}

/* ---- code point sets ------------------------------------------------------- */

static int set_is(const gr_cpset *s, const uint32_t (*want)[2], size_t n)
{
    if (s->n != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (s->r[i][0] != want[i][0] || s->r[i][1] != want[i][1]) return 0;
    return 1;
}

static void test_cpset(void)
{
    gr_cpset s;
    gr_cpset_init(&s);
    gr_cpset_add(&s, 'm', 'p');
    gr_cpset_add(&s, 'a', 'c');
    gr_cpset_add(&s, 'x', 'z');
    gr_cpset_add(&s, 'd', 'd'); /* adjacent to a-c: merges */
    static const uint32_t w1[][2] = {{'a', 'd'}, {'m', 'p'}, {'x', 'z'}};
    TCHECK(set_is(&s, w1, 3));
    gr_cpset_add(&s, 'e', 'w'); /* bridges all three */
    static const uint32_t w2[][2] = {{'a', 'z'}};
    TCHECK(set_is(&s, w2, 1));
    gr_cpset_add(&s, 0x10FFF0, 0x7FFFFFFF); /* clipped to 0x10FFFF */
    gr_cpset_invert(&s);
    static const uint32_t w3[][2] = {{0, 'a' - 1}, {'z' + 1, 0xD7FF}, {0xE000, 0x10FFEF}};
    TCHECK(set_is(&s, w3, 3));
    gr_cpset_invert(&s);
    static const uint32_t w4[][2] = {{'a', 'z'}, {0x10FFF0, 0x10FFFF}}; /* the surrogates stay out */
    TCHECKF(set_is(&s, w4, 2), "invert twice: %zu ranges", s.n);
    gr_cpset_all(&s);
    static const uint32_t w5[][2] = {{0, 0xD7FF}, {0xE000, 0x10FFFF}};
    TCHECK(set_is(&s, w5, 2));
    gr_cpset_invert(&s);
    TCHECK(s.n == 0);
    /* random adds against a bitmap */
    static uint8_t bm[0x400];
    memset(bm, 0, sizeof bm);
    for (int i = 0; i < 300; i++) {
        uint32_t lo = rnd(0x400), hi = lo + rnd(8);
        if (hi >= 0x400) hi = 0x3FF;
        gr_cpset_add(&s, lo, hi);
        for (uint32_t c = lo; c <= hi; c++) bm[c] = 1;
    }
    int ok = 1;
    for (size_t i = 0; i < s.n; i++) {
        ok &= s.r[i][0] <= s.r[i][1];
        if (i) ok &= s.r[i][0] > s.r[i - 1][1] + 1; /* sorted, disjoint, not adjacent */
    }
    for (uint32_t c = 0, i = 0; c < 0x400; c++) {
        while (i < s.n && s.r[i][1] < c) i++;
        ok &= bm[c] == (i < s.n && s.r[i][0] <= c);
    }
    TCHECK(ok);
    gr_cpset_free(&s);
}

/* ---- one character ------------------------------------------------------------ */

static gr_grammar *chars_grammar(const gr_cpset *s, enum gr_str_mode mode, int *n_states)
{
    mk k = mk_new();
    gr_chars(k.b, k.m, 0, k.to, s, mode, GR_INC);
    if (n_states) *n_states = gr_n_states(k.b, k.m);
    df_error err = {0};
    gr_grammar *g = mk_build(&k, &err);
    TCHECKF(g, "build: %s", err.msg);
    return g;
}

static int in_set(const gr_cpset *s, uint32_t c)
{
    for (size_t i = 0; i < s->n; i++)
        if (c >= s->r[i][0] && c <= s->r[i][1]) return 1;
    return 0;
}

/* code points to try: everything below 0x800, the boundaries, random ones */
static size_t probe_points(uint32_t *o)
{
    size_t n = 0;
    for (uint32_t c = 0; c < 0x800; c++) o[n++] = c;
    static const uint32_t edge[] = {0x800, 0x801, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x10001,
                                    0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFE, 0x10FFFF, 0x2028, 0x20AC, 0x1F600};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) o[n++] = edge[i];
    for (int i = 0; i < 600; i++) {
        uint32_t c = rnd(0x110000);
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        o[n++] = c;
    }
    return n;
}

static void check_chars(const gr_cpset *s, const char *what)
{
    static uint32_t pts[4096];
    size_t np = probe_points(pts);
    for (int mode = 0; mode < 2; mode++) {
        gr_grammar *g = chars_grammar(s, mode ? GR_STR_RAW : GR_STR_JSON, NULL);
        if (!g) return;
        int bad = 0;
        for (size_t i = 0; i < np && bad < 5; i++) {
            char u[4], j[16];
            int n = put_utf8(pts[i], u);
            size_t jn = mode ? (memcpy(j, u, (size_t)n), (size_t)n) : json_text(u, (size_t)n, j);
            int want = in_set(s, pts[i]), got = accepts(g, j, jn);
            if (want != got) {
                bad++;
                t_fail(__FILE__, __LINE__, "%s, %s mode: U+%04X accepted %d, in the set %d", what,
                       mode ? "raw" : "JSON", pts[i], got, want);
            }
            /* its raw bytes in JSON mode only when that is the spelling */
            if (!mode && want && (jn != (size_t)n || memcmp(j, u, (size_t)n)))
                TCHECKF(!accepts(g, u, (size_t)n), "%s: U+%04X accepted unescaped", what, pts[i]);
        }
        /* never surrogates, overlongs, out-of-range or cut sequences */
        static const char *const never[] = {"\xED\xA0\x80", "\xED\xBF\xBF", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80",
                                            "\xE0\x9F\xBF", "\xF0\x80\x80\x80", "\xF0\x8F\xBF\xBF",
                                            "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\x80", "\xE2\x82", ""};
        for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
            TCHECKF(!accepts_str(g, never[i]), "%s: bad sequence %zu accepted", what, i);
        TCHECK(!accepts_str(g, "aa"));
        gr_grammar_free(g);
    }
}

static void test_chars(void)
{
    gr_cpset s;
    gr_cpset_init(&s);
    gr_cpset_all(&s);
    check_chars(&s, "all");
    int n_raw, n_json;
    gr_grammar_free(chars_grammar(&s, GR_STR_RAW, &n_raw));
    gr_grammar_free(chars_grammar(&s, GR_STR_JSON, &n_json));
    TCHECKF(n_raw <= 9 && n_json <= 16, "any character: %d NFA states raw, %d JSON", n_raw, n_json);
    gr_cpset_free(&s);

    static const uint32_t sets[][6] = {
        {'a', 'z', 0, 0, 0, 0},          {0, 0x1F, '"', '"', '\\', '\\'}, {0x80, 0x10FFFF, 0, 0, 0, 0},
        {0x7F, 0x7FF, 0xFFFF, 0x10000, 0, 0}, {0x7FE, 0x801, 0xD7F0, 0xE010, 0x10FFFE, 0x10FFFF},
        {0x3B1, 0x3C9, 0x20AC, 0x20AC, 0x1F600, 0x1F64F}, {0x5, 0x5, 0x0A, 0x0A, 0x1F, 0x20},
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        gr_cpset_init(&s);
        for (int k = 0; k < 3; k++)
            if (sets[i][2 * k + 1]) gr_cpset_add(&s, sets[i][2 * k], sets[i][2 * k + 1]);
        char what[32];
        snprintf(what, sizeof what, "set %zu", i);
        check_chars(&s, what);
        gr_cpset_free(&s);
    }
    for (int t = 0; t < 8; t++) { /* random sets */
        gr_cpset_init(&s);
        for (int k = 0; k < 12; k++) {
            uint32_t lo = rnd(4) ? rnd(0x900) : rnd(0x110000);
            gr_cpset_add(&s, lo, lo + rnd(rnd(2) ? 40 : 70000));
        }
        char what[32];
        snprintf(what, sizeof what, "random set %d", t);
        check_chars(&s, what);
        gr_cpset_free(&s);
    }
}

/* JSON mode: each character one spelling; the others are refused. */
static void test_json_spelling(void)
{
    gr_cpset s;
    gr_cpset_init(&s);
    gr_cpset_all(&s);
    gr_grammar *g = chars_grammar(&s, GR_STR_JSON, NULL);
    gr_cpset_free(&s);
    if (!g) return;
    static const char *const yes[] = {"a", "/", "\x7F", "\\\"", "\\\\", "\\n", "\\r", "\\t", "\\b", "\\f",
                                      "\\u0000", "\\u001f", "\\u000b", "\\u0011", "\xC3\xA9", "\xF0\x9F\x98\x80"};
    static const char *const no[] = {"\"", "\\", "\n", "\x01", "\\/", "\\u0041", "\\u001F", "\\u000a", "\\u000A",
                                     "\\u0022", "\\u00e9", "\\ud83d\\ude00", "\\x41", "\\a", "\\u00", "\\"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) TCHECKF(accepts_str(g, yes[i]) == 1, "refused %s", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) TCHECKF(accepts_str(g, no[i]) == 0, "accepted %s", no[i]);
    gr_grammar_free(g);
}

/* ---- patterns: a table ----------------------------------------------------------- */

typedef struct pcase {
    const char *pat, *s;
    int want; /* 1 match, 0 not, -1 the pattern matches nothing (the build fails) */
} pcase;

static const pcase table[] = {
    {"abc", "abc", 1}, {"abc", "xxabcxx", 1}, {"abc", "ab", 0}, {"^abc$", "abc", 1}, {"^abc$", "abcd", 0},
    {"^abc", "abcd", 1}, {"^abc", "xabc", 0}, {"abc$", "xabc", 1}, {"abc$", "abcx", 0}, {"", "anything", 1},
    {"^$", "", 1}, {"^$", "a", 0}, {"^a|b$", "ax", 1}, {"^a|b$", "xb", 1}, {"^a|b$", "xbx", 0},
    {"^(?:a|b)$", "ab", 0}, {"^(a|bc)+$", "abca", 1}, {"^(a|bc)+$", "abcb", 0}, {"^a*$", "", 1},
    {"^a*$", "aaaa", 1}, {"^a+$", "", 0}, {"^a?b$", "b", 1}, {"^a?b$", "aab", 0}, {"^a{3}$", "aaa", 1},
    {"^a{3}$", "aa", 0}, {"^a{2,}$", "aaaaa", 1}, {"^a{2,}$", "a", 0}, {"^a{2,3}$", "aaaa", 0},
    {"^a{0}$", "", 1}, {"^(?:ab){1,2}c$", "ababc", 1}, {"^(?:ab){1,2}c$", "abababc", 0},
    {"^a*?b+?c??$", "aab", 1}, {"^[a-c]+$", "abcba", 1}, {"^[a-c]+$", "abd", 0}, {"^[^a-c]$", "d", 1},
    {"^[^a-c]$", "b", 0}, {"^[^a]$", "\n", 1}, {"^[]$", "", -1}, {"^a[]|b$", "xb", 1}, {"^a[]|b$", "a", 0}, {"^[^]$", "\n", 1},
    {"^[-a]$", "-", 1}, {"^[a-]$", "-", 1}, {"^[a\\-z]$", "-", 1}, {"^[a\\-z]$", "b", 0}, {"^.$", "\n", 0},
    {"^.$", "\r", 0}, {"^.$", "\xE2\x80\xA8", 0}, {"^.$", "\xE2\x80\xA9", 0}, {"^.$", "\xE2\x80\xAA", 1},
    {"^.$", "\xF0\x9F\x98\x80", 1}, {"^.$", "\t", 1}, {"^\\d+$", "0129", 1}, {"^\\d$", "a", 0},
    {"^\\D$", "a", 1}, {"^\\D$", "5", 0}, {"^\\w+$", "aZ_09", 1}, {"^\\w$", "-", 0}, {"^\\w$", "\xC3\xA9", 0},
    {"^\\W$", "\xC3\xA9", 1}, {"^\\s$", " ", 1}, {"^\\s$", "\xC2\xA0", 1}, {"^\\s$", "\xEF\xBB\xBF", 1},
    {"^\\s$", "\xE3\x80\x80", 1}, {"^\\s$", "\xE2\x80\x8B", 0}, {"^\\s$", "\x0B", 1}, {"^\\s$", "\x1C", 0},
    {"^\\S$", "\xC2\xA0", 0}, {"^[\\s\\S]*$", "a\nb\xE2\x80\xA8", 1}, {"^[\\d\\s]+$", "1 2", 1},
    {"^[\\b]$", "\b", 1}, {"^\\t\\n\\r\\f\\v\\0$", "\t\n\r\f\v", 0}, {"^\\x41\\u0042\\u{43}$", "ABC", 1},
    {"^\\uD83D\\uDE00$", "\xF0\x9F\x98\x80", 1}, {"^\\u{1F600}$", "\xF0\x9F\x98\x80", 1}, {"^\\cJ$", "\n", 1},
    {"^\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\\\\\/$", ".*+?()[]{}|^$\\/", 1}, {"^\\-\\#$", "-#", 1},
    {"^\xC3\xA9+$", "\xC3\xA9\xC3\xA9", 1}, {"^[\xC3\xA0-\xC3\xBF]$", "\xC3\xA9", 1},
    {"^[\xC3\xA0-\xC3\xBF]$", "e", 0}, {"^(?<year>\\d{4})-(?<m>\\d\\d)$", "2024-05", 1},
    {"^(?:)$", "", 1}, {"^()+$", "", 1}, {"^(a|)$", "", 1}, {"^(a*)*$", "aaa", 1}, {"^(a*)*b$", "aaa", 0},
    {"^[a-z]{2,4}$", "abcde", 0}, {"^[a-z]{2,4}$", "abc", 1}, {"^(?:[0-9]{1,3}\\.){3}[0-9]{1,3}$", "10.0.0.1", 1},
    {"\\d{3}-\\d{4}", "call 555-1234 now", 1}, {"^[\\s\\S]{0,5}$", "\n\n\n\n\n\n", 0},
};

static void test_pattern_table(void)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        for (int mode = 0; mode < 2; mode++) {
            df_error err = {0};
            gr_grammar *g = pattern_grammar(table[i].pat, mode ? GR_STR_RAW : GR_STR_JSON, NULL, NULL, &err, NULL);
            if (table[i].want < 0) { /* no string at all: the builder says so */
                TCHECKF(!g && err.code == DF_ERR_ARG, "/%s/: %d %s", table[i].pat, err.code, err.msg);
                gr_grammar_free(g);
                continue;
            }
            TCHECKF(g, "/%s/: %s", table[i].pat, err.msg);
            if (!g) continue;
            char j[256];
            size_t n = strlen(table[i].s);
            size_t jn = mode ? (memcpy(j, table[i].s, n), n) : json_text(table[i].s, n, j);
            int got = accepts(g, j, jn);
            TCHECKF(got == table[i].want, "/%s/ on \"%s\" (%s): %d, want %d", table[i].pat, table[i].s,
                    mode ? "raw" : "JSON", got, table[i].want);
            gr_grammar_free(g);
        }
    }
}

/* ---- patterns against PCRE2 ---------------------------------------------------------- */

/* A random pattern as a tree, written in ECMAScript (for us) and in PCRE2
 * (where \s and `.` are spelled as ECMAScript defines them), and sampled. */
enum { R_LIT, R_CLASS, R_CAT, R_ALT, R_REP };
typedef struct rnode {
    int kind, a, b;  /* children (R_CAT, R_ALT: a, b; R_REP: a) */
    int lo, hi;      /* R_REP; hi -1 for none */
    int atom;        /* R_LIT / R_CLASS: index into atoms[] */
} rnode;

static const struct {
    const char *ecma, *pcre;
    const char *sample[4]; /* members, UTF-8 */
} atoms[] = {
    {"a", "a", {"a"}},
    {"b", "b", {"b"}},
    {"\\.", "\\.", {"."}},
    {"-", "-", {"-"}},
    {"\xC3\xA9", "\xC3\xA9", {"\xC3\xA9"}},
    {"\xE2\x82\xAC", "\xE2\x82\xAC", {"\xE2\x82\xAC"}},
    {"\\u{1F600}", "\\x{1F600}", {"\xF0\x9F\x98\x80"}},
    {"\\n", "\\n", {"\n"}},
    {"\\\"", "\"", {"\""}},
    {"\\\\", "\\\\", {"\\"}},
    {"[ab]", "[ab]", {"a", "b"}},
    {"[^ab]", "[^ab]", {"c", "\n", "\xC3\xA9", "\xF0\x9F\x98\x80"}},
    {"[a-c\xC3\xA9]", "[a-c\xC3\xA9]", {"a", "c", "\xC3\xA9"}},
    {"[\\u00e0-\\u{1F600}]", "[\\x{e0}-\\x{1F600}]", {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}},
    {"\\d", "\\d", {"0", "7"}},
    {"\\D", "\\D", {"a", "\xC3\xA9"}},
    {"\\w", "\\w", {"a", "_", "Z"}},
    {"\\W", "\\W", {"-", " ", "\xC3\xA9"}},
    {"\\s", "[\\t-\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}]",
     {" ", "\n", "\xC2\xA0", "\xE2\x80\xA8"}},
    {"\\S", "[^\\t-\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}]",
     {"a", "\xC3\xA9"}},
    {".", "[^\\n\\r\\x{2028}\\x{2029}]", {"a", "\xE2\x82\xAC", "\x01"}},
    {"[\\s\\d]", "[\\t-\\r 0-9\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}]",
     {"1", " "}},
    {"[^\\w.]", "[^\\w.]", {"-", "\xC3\xA9"}},
};
#define N_ATOMS ((int)(sizeof atoms / sizeof atoms[0]))

/* extra characters for the strings */
static const char *const noise[] = {"a", "b", "c", ".", "-", "0", "_", " ", "\n", "\r", "\xC3\xA9", "\xE2\x82\xAC",
                                    "\xF0\x9F\x98\x80", "\xE2\x80\xA8", "\xC2\xA0", "\"", "\\", "\x01", "\x7F"};

typedef struct rtree {
    rnode n[64];
    int nn;
} rtree;

static int rgen(rtree *t, int depth)
{
    int i = t->nn++;
    rnode *x = &t->n[i];
    memset(x, 0, sizeof *x);
    int r = depth >= 4 || t->nn > 50 ? rnd(2) : rnd(10);
    if (r < 2) {
        x->kind = rnd(2) ? R_LIT : R_CLASS;
        x->atom = (int)rnd(N_ATOMS);
        return i;
    }
    if (r < 6) {
        x->kind = R_CAT;
    } else if (r < 8) {
        x->kind = R_ALT;
    } else {
        x->kind = R_REP;
        static const int q[][2] = {{0, -1}, {1, -1}, {0, 1}, {2, 2}, {1, 3}, {2, -1}, {0, 2}};
        int k = (int)rnd(7);
        x->lo = q[k][0];
        x->hi = q[k][1];
        int a = rgen(t, depth + 1);
        t->n[i].a = a;
        return i;
    }
    int a = rgen(t, depth + 1);
    int b = rgen(t, depth + 1);
    t->n[i].a = a;
    t->n[i].b = b;
    return i;
}

static void rwrite(const rtree *t, int i, int pcre, char *o, size_t *k)
{
    const rnode *x = &t->n[i];
    switch (x->kind) {
    case R_LIT: case R_CLASS: {
        const char *s = pcre ? atoms[x->atom].pcre : atoms[x->atom].ecma;
        *k += (size_t)sprintf(o + *k, "%s", s);
        return;
    }
    case R_CAT:
        *k += (size_t)sprintf(o + *k, "(?:");
        rwrite(t, x->a, pcre, o, k);
        rwrite(t, x->b, pcre, o, k);
        *k += (size_t)sprintf(o + *k, ")");
        return;
    case R_ALT:
        *k += (size_t)sprintf(o + *k, "(?:");
        rwrite(t, x->a, pcre, o, k);
        *k += (size_t)sprintf(o + *k, "|");
        rwrite(t, x->b, pcre, o, k);
        *k += (size_t)sprintf(o + *k, ")");
        return;
    default:
        *k += (size_t)sprintf(o + *k, "(?:");
        rwrite(t, x->a, pcre, o, k);
        if (x->lo == 0 && x->hi < 0) *k += (size_t)sprintf(o + *k, ")*");
        else if (x->lo == 1 && x->hi < 0) *k += (size_t)sprintf(o + *k, ")+");
        else if (x->lo == 0 && x->hi == 1) *k += (size_t)sprintf(o + *k, ")?");
        else if (x->hi < 0) *k += (size_t)sprintf(o + *k, "){%d,}", x->lo);
        else if (x->hi == x->lo) *k += (size_t)sprintf(o + *k, "){%d}", x->lo);
        else *k += (size_t)sprintf(o + *k, "){%d,%d}", x->lo, x->hi);
        return;
    }
}

static void rsample(const rtree *t, int i, char *o, size_t *k, size_t cap)
{
    const rnode *x = &t->n[i];
    if (*k + 16 > cap) return;
    switch (x->kind) {
    case R_LIT: case R_CLASS: {
        int n = 0;
        while (n < 4 && atoms[x->atom].sample[n]) n++;
        const char *s = atoms[x->atom].sample[rnd((uint32_t)n)];
        memcpy(o + *k, s, strlen(s));
        *k += strlen(s);
        return;
    }
    case R_CAT: rsample(t, x->a, o, k, cap); rsample(t, x->b, o, k, cap); return;
    case R_ALT: rsample(t, rnd(2) ? x->a : x->b, o, k, cap); return;
    default: {
        int reps = x->lo + (int)rnd((uint32_t)((x->hi < 0 ? x->lo + 3 : x->hi) - x->lo + 1));
        for (int r = 0; r < reps; r++) rsample(t, x->a, o, k, cap);
    }
    }
}

static void append_noise(char *o, size_t *k, size_t cap)
{
    const char *s = noise[rnd(sizeof noise / sizeof noise[0])];
    if (*k + strlen(s) < cap) {
        memcpy(o + *k, s, strlen(s));
        *k += strlen(s);
    }
}

static void test_pattern_pcre2(void)
{
    int n_patterns = 0, n_strings = 0, n_match = 0, n_gave_up = 0;
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    for (int p = 0; p < 250; p++) {
        rtree t = {.nn = 0};
        int root = rgen(&t, 0);
        char ecma[2048], pcre[4096];
        size_t ke = 0, kp = 0;
        /* anchors around the whole, or around each top-level alternative (`^a|b$`) */
        int split = t.n[root].kind == R_ALT && rnd(2);
        for (int part = 0; part < (split ? 2 : 1); part++) {
            int x = split ? (part ? t.n[root].b : t.n[root].a) : root;
            int anc = (int)rnd(4);
            if (part) ecma[ke++] = '|', pcre[kp++] = '|';
            if (anc & 1) ecma[ke++] = '^', pcre[kp++] = '^';
            rwrite(&t, x, 0, ecma, &ke);
            rwrite(&t, x, 1, pcre, &kp);
            if (anc & 2) ecma[ke++] = '$', pcre[kp++] = '$';
        }
        ecma[ke] = pcre[kp] = 0;
        int errc;
        PCRE2_SIZE eoff;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)pcre, kp, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &errc, &eoff, NULL);
        TCHECKF(code, "PCRE2 refused %s", pcre);
        df_error err = {0};
        gr_grammar *g[2];
        g[0] = pattern_grammar(ecma, GR_STR_RAW, NULL, NULL, &err, NULL);
        g[1] = pattern_grammar(ecma, GR_STR_JSON, NULL, NULL, &err, NULL);
        TCHECKF(g[0] && g[1], "/%s/: %s", ecma, err.msg);
        if (!code || !g[0] || !g[1]) {
            pcre2_code_free(code);
            gr_grammar_free(g[0]);
            gr_grammar_free(g[1]);
            continue;
        }
        n_patterns++;
        int bad = 0;
        for (int s = 0; s < 40 && bad < 3; s++) {
            char str[600], js[3600];
            size_t k = 0;
            int how = (int)rnd(4);
            if (how == 0) { /* noise only */
                int len = (int)rnd(6);
                for (int c = 0; c < len; c++) append_noise(str, &k, 400);
            } else {
                if (how == 2) append_noise(str, &k, 400);
                rsample(&t, root, str, &k, 400);
                if (how == 3) { /* mutate one character */
                    size_t at = rnd((uint32_t)k + 1);
                    char tail[600];
                    memcpy(tail, str + at, k - at);
                    size_t kt = k - at;
                    k = at;
                    append_noise(str, &k, 400);
                    if (kt && rnd(2)) { kt--; memmove(tail, tail + 1, kt); } /* maybe drop a byte: bad UTF-8 too */
                    memcpy(str + k, tail, kt);
                    k += kt;
                }
                if (how == 2) append_noise(str, &k, 400);
            }
            int valid = utf8_valid(str, k);
            int rc = valid ? pcre2_match(code, (PCRE2_SPTR)str, k, 0, 0, md, NULL) : PCRE2_ERROR_NOMATCH;
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) { /* PCRE2's backtracking gave up (match limit) */
                n_gave_up++;
                continue;
            }
            int want = rc >= 0;
            int got = accepts(g[0], str, k);
            n_strings++;
            n_match += want;
            if (got != want) {
                bad++;
                t_fail(__FILE__, __LINE__, "/%s/ raw on \"%.*s\" (%zu bytes): %d, PCRE2 %d", ecma, (int)k, str, k,
                       got, want);
            }
            if (!valid) continue;
            size_t jn = json_text(str, k, js);
            got = accepts(g[1], js, jn);
            if (got != want) {
                bad++;
                t_fail(__FILE__, __LINE__, "/%s/ JSON on \"%.*s\": %d, PCRE2 %d", ecma, (int)jn, js, got, want);
            }
        }
        pcre2_code_free(code);
        gr_grammar_free(g[0]);
        gr_grammar_free(g[1]);
    }
    pcre2_match_data_free(md);
    printf("  %d random patterns, %d strings, %d matched (PCRE2 gave up on %d more)\n", n_patterns, n_strings,
           n_match, n_gave_up);
    TCHECK(n_patterns == 250 && n_match > n_strings / 5 && n_match < n_strings * 4 / 5 && n_gave_up < n_strings / 50);
}

/* ---- intersections against PCRE2 ------------------------------------------------------ */

static gr_grammar *patterns_grammar(const char *const *pats, int n, enum gr_str_mode mode, uint32_t *cmin,
                                    uint32_t *cmax, df_error *err)
{
    mk k = mk_new();
    size_t lens[8];
    for (int i = 0; i < n; i++) lens[i] = strlen(pats[i]);
    uint32_t lo = cmin ? *cmin : 0, hi = cmax ? *cmax : GR_COUNT_INF;
    if (gr_patterns(k.b, k.m, 0, k.to, pats, lens, n, mode, GR_INC, &lo, &hi, err)) {
        gr_builder_free(k.b);
        return NULL;
    }
    if (lo > 0 || hi != GR_COUNT_INF) gr_counter(k.b, k.m, lo, hi);
    if (cmin) *cmin = lo;
    if (cmax) *cmax = hi;
    return mk_build(&k, err);
}

static void test_intersection(void)
{
    /* by hand: classes, lengths, a format with a pattern */
    static const struct {
        const char *p[3];
        const char *s;
        int want;
    } cases[] = {
        {{"^[a-z]+$", "^.{2,3}$"}, "abc", 1},
        {{"^[a-z]+$", "^.{2,3}$"}, "abcd", 0},
        {{"^[a-z]+$", "^.{2,3}$"}, "aB", 0},
        {{"a", "b", "c"}, "xcxbxa", 1},
        {{"a", "b", "c"}, "xcxbx", 0},
        {{"^(?:ab)*$", "^(?:abab)*$|^ab$"}, "ababab", 0},
        {{"^(?:ab)*$", "^(?:abab)*$|^ab$"}, "abab", 1},
        {{"^(?:ab)*$", "^(?:abab)*$|^ab$"}, "ab", 1},
        {{"^\\d{4}-", "-01$"}, "2024-01", 1},
        {{"^[\\s\\S]{0,300}$", "^[^\\n]*$"}, "a b", 1},
        {{"^[\\s\\S]{0,300}$", "^[^\\n]*$"}, "a\nb", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = 0;
        while (n < 3 && cases[i].p[n]) n++;
        for (int mode = 0; mode < 2; mode++) {
            df_error err = {0};
            gr_grammar *g = patterns_grammar(cases[i].p, n, mode ? GR_STR_RAW : GR_STR_JSON, NULL, NULL, &err);
            TCHECKF(g, "case %zu: %s", i, err.msg);
            if (!g) continue;
            char j[64];
            size_t jn = mode ? strlen(strcpy(j, cases[i].s)) : json_text(cases[i].s, strlen(cases[i].s), j);
            TCHECKF(accepts(g, j, jn) == cases[i].want, "case %zu on \"%s\" (%s)", i, cases[i].s, mode ? "raw" : "JSON");
            gr_grammar_free(g);
        }
    }
    /* narrowing through every operand */
    uint32_t lo = 0, hi = 10;
    df_error err = {0};
    const char *nar[] = {"^[\\s\\S]{2,300}$", "^x", "^[a-z]{0,4}$"};
    gr_grammar *g = patterns_grammar(nar, 3, GR_STR_JSON, &lo, &hi, &err);
    TCHECKF(g && lo == 2 && hi == 4, "%s: %u..%u", err.msg, lo, hi);
    if (g) TCHECK(accepts_str(g, "xa") && accepts_str(g, "xabc") && !accepts_str(g, "x") && !accepts_str(g, "xabcd"));
    gr_grammar_free(g);
    /* a format and a pattern */
    const char *fp[] = {gr_format_pattern("date"), "-12-"};
    TCHECK(fp[0] && !gr_format_pattern("ipv6"));
    g = patterns_grammar(fp, 2, GR_STR_JSON, NULL, NULL, &err);
    TCHECKF(g, "%s", err.msg);
    if (g) TCHECK(accepts_str(g, "2024-12-31") && !accepts_str(g, "2024-11-30") && !accepts_str(g, "2024-12-32"));
    gr_grammar_free(g);
    /* errors: which operand, and the size limit */
    const char *bad[] = {"^a$", "(?=b)"};
    err = (df_error){0};
    g = patterns_grammar(bad, 2, GR_STR_JSON, NULL, NULL, &err);
    TCHECKF(!g && err.code == DF_ERR_UNSUPPORTED && strstr(err.msg, "pattern 2 of 2: ") && strstr(err.msg, "lookahead") &&
                err.pos == 0,
            "%s", err.msg);
    const char *big[] = {"^[a-z]{0,1000}[0-9]{0,1000}$", "^[0-9a-z]{0,1000}b[0-9a-z]{0,1000}$"};
    err = (df_error){0};
    g = patterns_grammar(big, 2, GR_STR_RAW, NULL, NULL, &err);
    TCHECKF(!g && err.code == DF_ERR_LIMIT && strstr(err.msg, "intersection"), "%d %s", err.code, err.msg);
    gr_grammar_free(g);

    /* random pairs against PCRE2: a string is in the intersection iff both match */
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    int n_pairs = 0, n_strings = 0, n_both = 0;
    for (int p = 0; p < 120; p++) {
        rtree t[2];
        int root[2];
        char ecma[2][2048], pcre[2][4096];
        pcre2_code *code[2];
        for (int i = 0; i < 2; i++) {
            t[i].nn = 0;
            root[i] = rgen(&t[i], 1);
            size_t ke = 0, kp = 0;
            int anc = (int)rnd(4);
            if (anc & 1) ecma[i][ke++] = '^', pcre[i][kp++] = '^';
            rwrite(&t[i], root[i], 0, ecma[i], &ke);
            rwrite(&t[i], root[i], 1, pcre[i], &kp);
            if (anc & 2) ecma[i][ke++] = '$', pcre[i][kp++] = '$';
            ecma[i][ke] = pcre[i][kp] = 0;
            int errc;
            PCRE2_SIZE eoff;
            code[i] = pcre2_compile((PCRE2_SPTR)pcre[i], kp, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &errc, &eoff, NULL);
            TCHECK(code[i]);
        }
        const char *pats[2] = {ecma[0], ecma[1]};
        gr_grammar *gg[2];
        err = (df_error){0};
        gg[0] = patterns_grammar(pats, 2, GR_STR_RAW, NULL, NULL, &err);
        gg[1] = patterns_grammar(pats, 2, GR_STR_JSON, NULL, NULL, &err);
        /* an empty intersection is refused by gr_build: then no string may match both */
        int empty = !gg[0] && err.code == DF_ERR_ARG;
        TCHECKF(gg[0] || empty, "/%s/ & /%s/: %s", ecma[0], ecma[1], err.msg);
        if (code[0] && code[1] && (gg[0] || empty)) {
            n_pairs++;
            int bad_n = 0;
            for (int s = 0; s < 30 && bad_n < 3; s++) {
                char str[600], js[3600];
                size_t k = 0;
                if (rnd(3)) append_noise(str, &k, 400);
                int first = (int)rnd(2);
                rsample(&t[first], root[first], str, &k, 400);
                if (rnd(2)) rsample(&t[!first], root[!first], str, &k, 400);
                if (rnd(3)) append_noise(str, &k, 400);
                int r0 = pcre2_match(code[0], (PCRE2_SPTR)str, k, 0, 0, md, NULL);
                int r1 = pcre2_match(code[1], (PCRE2_SPTR)str, k, 0, 0, md, NULL);
                if ((r0 < 0 && r0 != PCRE2_ERROR_NOMATCH) || (r1 < 0 && r1 != PCRE2_ERROR_NOMATCH)) continue;
                int want = r0 >= 0 && r1 >= 0;
                n_strings++;
                n_both += want;
                if (empty) {
                    TCHECKF(!want, "/%s/ & /%s/ refused as empty, both match \"%.*s\"", ecma[0], ecma[1], (int)k, str);
                    continue;
                }
                int got = accepts(gg[0], str, k);
                size_t jn = json_text(str, k, js);
                int got_j = accepts(gg[1], js, jn);
                if (got != want || got_j != want) {
                    bad_n++;
                    t_fail(__FILE__, __LINE__, "/%s/ & /%s/ on \"%.*s\": raw %d JSON %d, PCRE2 %d", ecma[0], ecma[1],
                           (int)k, str, got, got_j, want);
                }
            }
        }
        for (int i = 0; i < 2; i++) {
            pcre2_code_free(code[i]);
            gr_grammar_free(gg[i]);
        }
    }
    pcre2_match_data_free(md);
    printf("  %d random pairs, %d strings, %d in both\n", n_pairs, n_strings, n_both);
    TCHECK(n_pairs == 120 && n_both > n_strings / 10 && n_both < n_strings * 9 / 10);
}

/* ---- refused patterns ------------------------------------------------------------------ */

static void test_pattern_errors(void)
{
    static const struct {
        const char *pat;
        int code;
        int64_t pos;
        const char *msg;
    } cases[] = {
        {"abc(?=d)", DF_ERR_UNSUPPORTED, 3, "lookahead (?="},
        {"a(?!b)", DF_ERR_UNSUPPORTED, 1, "lookahead (?!"},
        {"(?<=a)b", DF_ERR_UNSUPPORTED, 0, "lookbehind (?<="},
        {"(?<!a)b", DF_ERR_UNSUPPORTED, 0, "lookbehind (?<!"},
        {"(a)\\1", DF_ERR_UNSUPPORTED, 3, "backreference"},
        {"(?<n>a)\\k<n>", DF_ERR_UNSUPPORTED, 7, "named backreference"},
        {"\\bword", DF_ERR_UNSUPPORTED, 0, "word boundary \\b"},
        {"a\\B", DF_ERR_UNSUPPORTED, 1, "word boundary \\B"},
        {"\\p{L}", DF_ERR_UNSUPPORTED, 0, "Unicode property"},
        {"(?i:a)", DF_ERR_UNSUPPORTED, 0, "group modifier"},
        {"a^b", DF_ERR_UNSUPPORTED, 1, "^ other than"},
        {"a$b", DF_ERR_UNSUPPORTED, 1, "$ other than"},
        {"(^a)", DF_ERR_UNSUPPORTED, 1, "^ other than"},
        {"^a{1001}b$", DF_ERR_UNSUPPORTED, 2, "above 1000"},
        {"^a{1001,}b$", DF_ERR_UNSUPPORTED, 2, "above 1000"},
        {"^(?:a{1000}){1000}$", DF_ERR_UNSUPPORTED, -1, "character positions"},
        {"a{2,1}", DF_ERR_ARG, 1, "out of order"},
        {"a{,2}", DF_ERR_ARG, 1, "not a quantifier"},
        {"*a", DF_ERR_ARG, 0, "nothing to repeat"},
        {"a**", DF_ERR_ARG, 2, "nothing to repeat"},
        {"a]", DF_ERR_ARG, 1, "lone ']'"},
        {"(ab", DF_ERR_ARG, 0, "missing )"},
        {"ab)", DF_ERR_ARG, 2, "unmatched )"},
        {"[ab", DF_ERR_ARG, 0, "missing ]"},
        {"[z-a]", DF_ERR_ARG, 1, "out of order"},
        {"[\\d-z]", DF_ERR_ARG, 3, "range end"},
        {"\\q", DF_ERR_ARG, 0, "unknown escape \\q"},
        {"\\x4", DF_ERR_ARG, 0, "two hexadecimal"},
        {"\\u12", DF_ERR_ARG, 0, "four hexadecimal"},
        {"\\u{110000}", DF_ERR_ARG, 0, "above 10FFFF"},
        {"ab\\", DF_ERR_ARG, 2, "lone backslash"},
        {"a\xC3", DF_ERR_ARG, 1, "invalid UTF-8"},
        {"\\01", DF_ERR_ARG, 0, "octal"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        df_error err = {0};
        gr_grammar *g = pattern_grammar(cases[i].pat, GR_STR_JSON, NULL, NULL, &err, NULL);
        TCHECKF(!g && err.code == cases[i].code && err.pos == cases[i].pos && strstr(err.msg, cases[i].msg),
                "/%s/: code %d pos %lld \"%s\"", cases[i].pat, err.code, (long long)err.pos, err.msg);
        gr_grammar_free(g);
    }
    /* the bound is no limit where the counter does the counting */
    uint32_t lo = 0, hi = GR_COUNT_INF;
    df_error err = {0};
    gr_grammar *g = pattern_grammar("^.{0,524288}$", GR_STR_JSON, &lo, &hi, &err, NULL);
    TCHECKF(g && lo == 0 && hi == 524288 && gr_grammar_n_states(g) <= 20, "%s", err.msg);
    gr_grammar_free(g);
}

/* Random text over the pattern alphabet: no crash (under the sanitizers),
 * and every refusal is DF_ERR_ARG / DF_ERR_UNSUPPORTED with a message and
 * an offset inside the pattern (or -1). */
static void test_pattern_garbage(void)
{
    static const char alpha[] = "ab0-^$.|*+?{}[]()\\,:=!<>dDwWsSbBuxck1{2,3}\xC3\xA9";
    int n_ok = 0, n_arg = 0, n_unsup = 0;
    for (int t = 0; t < 20000; t++) {
        char pat[40];
        size_t n = 1 + rnd(sizeof pat - 1);
        for (size_t i = 0; i < n; i++) pat[i] = alpha[rnd(sizeof alpha - 1)];
        mk k = mk_new();
        df_error err = {0};
        uint32_t lo = 0, hi = 40;
        int rc;
        if (t % 4 == 3) { /* with a second one: the intersection */
            static const char *const other[] = {"a", "^[ab]*$", "^.{0,5}$", "[^a]", "\\d|b"};
            const char *two[2] = {pat, other[rnd(5)]};
            size_t lens[2] = {n, strlen(two[1])};
            rc = gr_patterns(k.b, k.m, 0, k.to, two, lens, 2, t & 1 ? GR_STR_RAW : GR_STR_JSON, GR_INC, &lo, &hi, &err);
        } else {
            rc = gr_pattern(k.b, k.m, 0, k.to, pat, n, t & 1 ? GR_STR_RAW : GR_STR_JSON, GR_INC, &lo, &hi, &err);
        }
        if (rc == 0) {
            n_ok++;
            gr_counter(k.b, k.m, lo, hi);
            gr_grammar *g = mk_build(&k, &err);
            gr_grammar_free(g);
        } else {
            n_arg += err.code == DF_ERR_ARG;
            n_unsup += err.code == DF_ERR_UNSUPPORTED;
            TCHECKF((err.code == DF_ERR_ARG || err.code == DF_ERR_UNSUPPORTED) && err.msg[0] &&
                        err.pos >= -1 && err.pos <= (int64_t)n,
                    "/%.*s/: code %d pos %lld %s", (int)n, pat, err.code, (long long)err.pos, err.msg);
            gr_builder_free(k.b);
        }
    }
    printf("  garbage: %d compiled, %d syntax errors, %d unsupported\n", n_ok, n_arg, n_unsup);
    TCHECK(n_ok > 100 && n_arg > 100 && n_unsup > 100);
}

/* Lengths with gaps: whatever prefix the grammar allows can be finished
 * inside minLength..maxLength (the counter's bounds alone would let
 * ^(?:aaa)+$ with 4..5 start "aaa" and strand). */
static void test_length_gaps(void)
{
    df_error err = {0};
    uint32_t lo = 4, hi = 5;
    gr_grammar *g = pattern_grammar("^(?:aaa)+$", GR_STR_JSON, &lo, &hi, &err, NULL);
    TCHECKF(!g && err.code == DF_ERR_ARG, "^(?:aaa)+$ in 4..5: %d %s", err.code, err.msg);
    gr_grammar_free(g);
    lo = 4, hi = 5;
    err = (df_error){0};
    g = pattern_grammar("^(?:aaa)+$|^bbbb$", GR_STR_JSON, &lo, &hi, &err, NULL);
    TCHECKF(g, "%s", err.msg);
    if (g) {
        int a3[] = {'a', 'a', 'a'}, b4[] = {'b', 'b', 'b', 'b'};
        TCHECK(gr_reference_accepts(g, a3, 3, 0) == 0 && gr_reference_accepts(g, b4, 4, 1) == 1);
    }
    gr_grammar_free(g);

    /* random patterns over {a, b} and windows: every allowed prefix of up to 9
     * letters extends to a complete string */
    static const char *const piece[] = {"(?:aaa)+", "(?:ab|bbb)*", "a{2}(?:bb)?", "(?:a|bbb)", "b", "(?:aab){0,2}",
                                        "[ab]{3}", "(?:a{4})*"};
    int n_checked = 0, n_empty = 0;
    for (int t = 0; t < 60; t++) {
        char pat[128] = "^";
        for (int k = 1 + (int)rnd(3); k > 0; k--) strcat(pat, piece[rnd(sizeof piece / sizeof piece[0])]);
        strcat(pat, "$");
        lo = rnd(5);
        hi = lo + rnd(4);
        err = (df_error){0};
        g = pattern_grammar(pat, GR_STR_RAW, &lo, &hi, &err, NULL);
        if (!g) {
            TCHECKF(err.code == DF_ERR_ARG, "/%s/: %s", pat, err.msg);
            n_empty++;
            continue;
        }
        /* for every w over {a, b} of up to 9 letters (index 1 << len | bits):
         * complete, allowed as a prefix, finishable (complete, or a one-letter
         * extension is finishable; windows end at 7 letters) */
        static uint8_t done[1 << 10], pre[1 << 10], fin[1 << 10];
        for (int len = 9; len >= 0; len--)
            for (int bits = 0; bits < 1 << len; bits++) {
                int w[9], x = 1 << len | bits;
                for (int i = 0; i < len; i++) w[i] = bits >> i & 1 ? 'b' : 'a';
                done[x] = (uint8_t)gr_reference_accepts(g, w, (size_t)len, 1);
                pre[x] = (uint8_t)gr_reference_accepts(g, w, (size_t)len, 0);
                fin[x] = done[x] || (len < 9 && (fin[2 << len | bits] || fin[2 << len | 1 << len | bits]));
                if (done[x]) TCHECKF((uint32_t)len >= lo && (uint32_t)len <= hi, "/%s/ in %u..%u: %d letters", pat, lo, hi, len);
                if (pre[x]) {
                    n_checked++;
                    TCHECKF(fin[x], "/%s/ in %u..%u: a prefix of %d letters cannot be finished", pat, lo, hi, len);
                }
            }
        gr_grammar_free(g);
    }
    printf("  %d allowed prefixes checked, %d windows left no string\n", n_checked, n_empty);
    TCHECK(n_checked > 200 && n_empty > 3);
}

/* ---- the counter narrowed ---------------------------------------------------------------- */

static void test_narrowing(void)
{
    df_error err = {0};
    uint32_t lo = 0, hi = GR_COUNT_INF;
    int n_states = 0;
    gr_grammar *g = pattern_grammar("^[\\s\\S]{0,300}$", GR_STR_RAW, &lo, &hi, &err, &n_states);
    TCHECKF(g && lo == 0 && hi == 300, "%s: %u..%u", err.msg, lo, hi);
    TCHECKF(n_states <= 10 && (!g || gr_grammar_n_states(g) <= 10), "^[\\s\\S]{0,300}$: %d NFA states, %zu DFA states",
            n_states, g ? gr_grammar_n_states(g) : 0);
    if (g) {
        char s[400];
        memset(s, '\n', sizeof s);
        TCHECK(accepts(g, s, 300) == 1 && accepts(g, s, 301) == 0 && accepts(g, s, 0) == 1);
        TCHECK(accepts_str(g, "\xF0\x9F\x98\x80 \xE2\x80\xA8") == 1);
    }
    gr_grammar_free(g);

    /* [2,4] meets minLength 3 / maxLength 10 */
    lo = 3, hi = 10;
    g = pattern_grammar("^[a-z]{2,4}$", GR_STR_JSON, &lo, &hi, &err, &n_states);
    TCHECKF(g && lo == 3 && hi == 4 && n_states <= 4, "%s: %u..%u, %d states", err.msg, lo, hi, n_states);
    if (g) {
        static const char *const s[] = {"ab", "abc", "abcd", "abcde", "abC"};
        static const int want[] = {0, 1, 1, 0, 0};
        for (int i = 0; i < 5; i++) TCHECKF(accepts_str(g, s[i]) == want[i], "%s", s[i]);
    }
    gr_grammar_free(g);
    static const struct {
        const char *pat;
        uint32_t lo, hi;
    } q[] = {{"^a*$", 0, GR_COUNT_INF}, {"^a+$", 1, GR_COUNT_INF}, {"^a?$", 0, 1}, {"^a{5}$", 5, 5},
             {"^a{5,}$", 5, GR_COUNT_INF}, {"^(?:\\d)$", 1, 1}, {"^\\u{1F600}{2,3}$", 2, 3}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        lo = 0, hi = GR_COUNT_INF;
        g = pattern_grammar(q[i].pat, GR_STR_RAW, &lo, &hi, &err, NULL);
        TCHECKF(g && lo == q[i].lo && hi == q[i].hi, "%s: %u..%u", q[i].pat, lo, hi);
        gr_grammar_free(g);
    }
    /* the counter counts code points */
    lo = 0, hi = GR_COUNT_INF;
    g = pattern_grammar("^.{2,3}$", GR_STR_JSON, &lo, &hi, &err, NULL);
    if (g) {
        TCHECK(accepts_str(g, "\xF0\x9F\x98\x80\\t") == 1);
        TCHECK(accepts_str(g, "\xF0\x9F\x98\x80") == 0);
        TCHECK(accepts_str(g, "\\u0001\\u0002\\u0003") == 1);
        TCHECK(accepts_str(g, "\\u0001\\u0002\\u0003\\u0004") == 0);
    }
    gr_grammar_free(g);
    /* no string left */
    df_error e2 = {0};
    lo = 5, hi = 10;
    g = pattern_grammar("^[a-z]{2,4}$", GR_STR_JSON, &lo, &hi, &e2, NULL);
    TCHECKF(!g && e2.code == DF_ERR_ARG && strstr(e2.msg, "minLength/maxLength allow no string"), "%s", e2.msg);
    /* not one class: unrolled, the counter untouched */
    lo = 0, hi = 7;
    g = pattern_grammar("^[a-z]{2,4}x$", GR_STR_JSON, &lo, &hi, &err, NULL);
    TCHECK(g && lo == 0 && hi == 7);
    if (g) TCHECK(accepts_str(g, "abx") == 1 && accepts_str(g, "abcdex") == 0);
    gr_grammar_free(g);
}

/* ---- formats ------------------------------------------------------------------------------ */

static void test_formats(void)
{
    static const struct {
        const char *fmt;
        const char *yes[8], *no[14];
    } f[] = {
        {"date",
         {"2024-01-31", "1999-12-28", "0000-02-28", "2023-04-30", "2023-02-01", "9999-11-29"},
         {"2024-13-01", "2024-00-10", "2024-01-32", "2024-02-30", "2024-04-31", "2024-1-01", "24-01-01",
          "2024-01-00", "2024/01/01", "2024-01-01T", "2024-11-31", "2024-06-31", "2024-09-31"}},
        {"time",
         {"00:00:00Z", "23:59:59+05:30", "12:30:00.123456-01:00", "09:05:07.0Z"},
         {"24:00:00Z", "12:60:00Z", "12:00:60Z", "12:00:00", "12:00:00+24:00", "12:00:00+05:60", "12:00Z",
          "12:00:00.Z", "12:00:00z"}},
        {"date-time",
         {"2024-05-06T07:08:09Z", "2000-10-31T23:59:59.5+01:00"},
         {"2024-05-06 07:08:09Z", "2024-05-06T07:08:09", "2024-05-06t07:08:09Z", "2024-02-30T00:00:00Z"}},
        {"uuid",
         {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"},
         {"123e4567-e89b-12d3-a456-42661417400", "123e4567e89b12d3a456426614174000", "g23e4567-e89b-12d3-a456-426614174000",
          "urn:uuid:123e4567-e89b-12d3-a456-426614174000"}},
        {"uri",
         {"https://example.com", "http://a.b.c:8080/x/y_z~1.html?q=1&r=-", "https://x/", "https://x//a",
          "https://my-site.example.com:443/a%20b/c;d=e?x=1&y=/z?#top", "http://x.y/@:!$&'()*+,;=#/?"},
         {"example.com", "ftp://example.com", "https://", "https://Example.com", "https://a b", "https://a.b/%2",
          "https://a.b/%zz", "https://a..b", "https://a-.b", "https://-a.b", "https://a.b/#x#y", "https://a.b:123456",
          "https://a.b/[x]"}},
        {"email",
         {"a@b.c", "John.Smith2@mail.example.org", "first.last+tag@my-mail.example.org", "a_b@x-y.z"},
         {"a@b", "a.@b.c", ".a@b.c", "a@b..c", "a b@c.d", "a@B.c", "@b.c", "a@@b.c", "a@b-.c", "a@-b.c"}},
        {"ipv4",
         {"0.0.0.0", "255.255.255.255", "192.168.1.10", "10.0.99.249"},
         {"256.0.0.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.-4", "300.1.1.1"}},
        {"hostname",
         {"localhost", "a-b.example.com", "x1.y2.z3.w4", "A"},
         {"-a.com", "a-.com", "a..b", "a.b.c.d.e", ".a", "a_b.com", ""}},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        for (int mode = 0; mode < 2; mode++) {
            mk k = mk_new();
            df_error err = {0};
            int rc = gr_format(k.b, k.m, 0, k.to, f[i].fmt, mode ? GR_STR_RAW : GR_STR_JSON, GR_INC, &err);
            TCHECKF(rc == 0, "%s: %s", f[i].fmt, err.msg);
            gr_grammar *g = mk_build(&k, &err);
            TCHECKF(g, "%s: %s", f[i].fmt, err.msg);
            if (!g) continue;
            for (int j = 0; j < 8 && f[i].yes[j]; j++)
                TCHECKF(accepts_str(g, f[i].yes[j]) == 1, "%s refused %s", f[i].fmt, f[i].yes[j]);
            for (int j = 0; j < 14 && f[i].no[j]; j++)
                TCHECKF(accepts_str(g, f[i].no[j]) == 0, "%s accepted %s", f[i].fmt, f[i].no[j]);
            gr_grammar_free(g);
        }
    }
    /* every month and day, every octet, every hour and minute */
    static const int days[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    gr_grammar *gd = NULL, *gi = NULL, *gt = NULL;
    const char *names[3] = {"date", "ipv4", "time"};
    gr_grammar **gs[3] = {&gd, &gi, &gt};
    for (int i = 0; i < 3; i++) {
        mk k = mk_new();
        df_error err = {0};
        TCHECK(gr_format(k.b, k.m, 0, k.to, names[i], GR_STR_JSON, GR_INC, &err) == 0);
        *gs[i] = mk_build(&k, &err);
    }
    if (gd && gi && gt) {
        char s[64];
        for (int mo = 0; mo <= 13; mo++)
            for (int d = 0; d <= 32; d++) {
                snprintf(s, sizeof s, "2023-%02d-%02d", mo, d);
                int want = mo >= 1 && mo <= 12 && d >= 1 && d <= days[mo];
                TCHECKF(accepts_str(gd, s) == want, "date %s", s);
            }
        for (int o = 0; o <= 300; o++) {
            snprintf(s, sizeof s, "1.2.3.%d", o);
            TCHECKF(accepts_str(gi, s) == (o <= 255), "ipv4 %s", s);
            snprintf(s, sizeof s, "%d.0.0.1", o);
            TCHECKF(accepts_str(gi, s) == (o <= 255), "ipv4 %s", s);
            snprintf(s, sizeof s, "0%d.0.0.1", o);
            TCHECKF(accepts_str(gi, s) == 0, "ipv4 %s", s);
        }
        for (int h = 0; h <= 25; h++)
            for (int mi = 0; mi <= 61; mi++) {
                snprintf(s, sizeof s, "%02d:%02d:%02d-%02d:%02d", h, mi, mi, h, mi);
                TCHECKF(accepts_str(gt, s) == (h <= 23 && mi <= 59), "time %s", s);
            }
    }
    gr_grammar_free(gd);
    gr_grammar_free(gi);
    gr_grammar_free(gt);

    /* a hostname at its longest: four labels of 61 */
    char h[300];
    size_t n = 0;
    for (int l = 0; l < 4; l++) {
        if (l) h[n++] = '.';
        memset(h + n, 'a', 61);
        n += 61;
    }
    mk k = mk_new();
    df_error err = {0};
    TCHECK(gr_format(k.b, k.m, 0, k.to, "hostname", GR_STR_RAW, 0, &err) == 0);
    gr_grammar *g = mk_build(&k, &err);
    if (g) {
        TCHECK(accepts(g, h, n) == 1);
        h[n] = 'a';
        TCHECK(accepts(g, h, n + 1) == 0);
    }
    gr_grammar_free(g);
    k = mk_new();
    err = (df_error){0};
    TCHECK(gr_format(k.b, k.m, 0, k.to, "ipv6", GR_STR_JSON, 0, &err) == -1 && err.code == DF_ERR_UNSUPPORTED &&
           strstr(err.msg, "\"ipv6\""));
    gr_builder_free(k.b);
}

/* ---- the matcher on string grammars ------------------------------------------------------- */

/* Tokens cut from JSON string text: single bytes, escapes whole and cut,
 * UTF-8 whole and cut (a token may end or start inside a character), and
 * pieces of text.  The mask must equal the reference on every token. */
static void test_matcher(void)
{
    static const char *const frag[] = {"a", "b", "z", "0", "9", "x", " ", "\\", "\"", "\\n", "\\\"", "\\\\", "\\u00",
                                       "\\u001", "\\u0001", "1f", "\xC3", "\xA9", "\xC3\xA9", "\xE2\x82", "\xAC",
                                       "\xE2\x82\xAC", "\xF0\x9F", "\x98\x80", "\xF0\x9F\x98\x80", "\n", "\xE2\x80\xA8"};
    enum { N_TOK = 256 + 300 };
    char *bytes[N_TOK];
    size_t len[N_TOK];
    int special[N_TOK];
    for (int i = 0; i < N_TOK; i++) {
        special[i] = -1;
        bytes[i] = xmalloc(32);
        if (i < 256) {
            bytes[i][0] = (char)i;
            len[i] = 1;
            continue;
        }
        size_t n = 0;
        for (int k = 1 + (int)rnd(3); k > 0; k--) {
            const char *f = frag[rnd(sizeof frag / sizeof frag[0])];
            memcpy(bytes[i] + n, f, strlen(f));
            n += strlen(f);
        }
        len[i] = n;
    }
    gr_vocab *v = gr_vocab_new(N_TOK, (const char *const *)bytes, len, special);
    static const struct {
        const char *pat;
        enum gr_str_mode mode;
        uint32_t lo, hi;
    } g_of[] = {
        {"^(?:[a-z\xC3\xA9\xE2\x82\xAC\\n\"\\\\]|\\d{2})*x?$", GR_STR_JSON, 0, 12},
        {"^[\\s\\S]{0,6}$", GR_STR_JSON, 2, GR_COUNT_INF},
        {"^.{1,4}$", GR_STR_RAW, 0, GR_COUNT_INF},
        {"ab|\\u{1F600}", GR_STR_JSON, 0, 5},
    };
    uint64_t bits[(N_TOK + 63) / 64];
    int steps = 0;
    for (size_t gi = 0; gi < sizeof g_of / sizeof g_of[0]; gi++) {
        df_error err = {0};
        uint32_t lo = g_of[gi].lo, hi = g_of[gi].hi;
        gr_grammar *g = pattern_grammar(g_of[gi].pat, g_of[gi].mode, &lo, &hi, &err, NULL);
        TCHECKF(g, "/%s/: %s", g_of[gi].pat, err.msg);
        if (!g) continue;
        gr_matcher *m = gr_matcher_new(g, v);
        int hist[256];
        for (int w = 0; w < 12; w++) {
            gr_matcher_reset(m);
            size_t nh = 0;
            for (int st = 0; st < 24; st++) {
                size_t allowed = gr_matcher_mask(m, bits), count = 0;
                int pick = -1, seen = 0, bad = 0;
                for (int id = 0; id < N_TOK && !bad; id++) {
                    int ref = 0;
                    if (nh + len[id] <= 256) {
                        for (size_t k = 0; k < len[id]; k++) hist[nh + k] = (unsigned char)bytes[id][k];
                        ref = gr_reference_accepts(g, hist, nh + len[id], 0);
                    }
                    int got = (int)(bits[id >> 6] >> (id & 63) & 1);
                    if (got != ref) {
                        bad = 1;
                        t_fail(__FILE__, __LINE__, "/%s/ walk %d step %d token %d: mask %d, reference %d",
                               g_of[gi].pat, w, st, id, got, ref);
                    }
                    if (got && rnd((uint32_t)++seen) == 0) pick = id;
                    count += (size_t)got;
                }
                TCHECK(count == allowed);
                steps++;
                if (bad || pick < 0) break;
                TCHECK(gr_matcher_accept(m, pick) == 0);
                for (size_t k = 0; k < len[pick]; k++) hist[nh + k] = (unsigned char)bytes[pick][k];
                nh += len[pick];
                TCHECK(gr_matcher_done(m) == gr_reference_accepts(g, hist, nh, 1));
            }
        }
        gr_matcher_free(m);
        gr_grammar_free(g);
    }
    printf("  %d steps checked\n", steps);
    gr_vocab_free(v);
    for (int i = 0; i < N_TOK; i++) free(bytes[i]);
}

static const test_case tests[] = {
    {"cpset", test_cpset},
    {"chars", test_chars},
    {"json_spelling", test_json_spelling},
    {"pattern_table", test_pattern_table},
    {"pattern_pcre2", test_pattern_pcre2},
    {"intersection", test_intersection},
    {"pattern_errors", test_pattern_errors},
    {"pattern_garbage", test_pattern_garbage},
    {"narrowing", test_narrowing},
    {"length_gaps", test_length_gaps},
    {"formats", test_formats},
    {"matcher", test_matcher},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
