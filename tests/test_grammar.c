/* test_grammar.c - the grammar network and its matcher: the mask equals a
 * brute-force check of every token against the reference simulator, along
 * random walks, on hand-built grammars with recursion, counters, specials
 * and ambiguity; building refuses empty languages; stepping allocates
 * nothing.
 */
#include "grammar.h"
#include "harness.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x1234567;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* value := num | arr | "x" <|sep|>;  num := [0-9]{1,3} (counted);
 * arr := "[" value ("," value){0,2} "]" (items counted 1..3);
 * top := value <|end_of_msg|> */
static gr_grammar *nested(void)
{
    df_error err = {0};
    gr_builder *b = gr_builder_new();
    int top = gr_machine(b, "top"), val = gr_machine(b, "value"), num = gr_machine(b, "num"),
        arr = gr_machine(b, "arr");
    gr_counter(b, num, 1, 3);
    int n1 = gr_state(b, num);
    gr_range(b, num, 0, n1, '0', '9', GR_INC);
    gr_range(b, num, n1, n1, '0', '9', GR_INC);
    gr_accept(b, num, n1);
    gr_counter(b, arr, 1, 3);
    int a1 = gr_state(b, arr), a2 = gr_state(b, arr), a3 = gr_state(b, arr), a4 = gr_state(b, arr);
    gr_sym(b, arr, 0, a1, '[', 0);
    gr_call(b, arr, a1, a2, val, GR_INC);
    gr_sym(b, arr, a2, a3, ',', 0);
    gr_call(b, arr, a3, a2, val, GR_INC);
    gr_sym(b, arr, a2, a4, ']', GR_NEEDMIN);
    gr_accept(b, arr, a4);
    int v1 = gr_state(b, val), v2 = gr_state(b, val);
    gr_call(b, val, 0, v1, num, 0);
    gr_call(b, val, 0, v1, arr, 0);
    gr_sym(b, val, 0, v2, 'x', 0);
    gr_sym(b, val, v2, v1, GR_SYM_SEP, 0);
    gr_accept(b, val, v1);
    int t1 = gr_state(b, top), t2 = gr_state(b, top);
    gr_call(b, top, 0, t1, val, 0);
    gr_sym(b, top, t1, t2, GR_SYM_EOM, 0);
    gr_accept(b, top, t2);
    gr_grammar *g = NULL;
    TCHECKF(gr_build(b, top, &g, &err) == 0, "%s", err.msg);
    gr_builder_free(b);
    return g;
}

/* ambiguous: s := ("ab" | "a" "b"+ | "a" t) <|end_of_msg|>, t := "bb"* ; a
 * string body with a big counter: q := '"' [a-z]{0,524288} '"' */
static gr_grammar *ambiguous(void)
{
    df_error err = {0};
    gr_builder *b = gr_builder_new();
    int s = gr_machine(b, "s"), t = gr_machine(b, "t"), body = gr_machine(b, "body");
    int e = gr_state(b, s), f = gr_state(b, s), x1 = gr_state(b, s), x2 = gr_state(b, s);
    gr_lit(b, s, 0, e, "ab", 2);
    gr_sym(b, s, 0, x1, 'a', 0);
    gr_sym(b, s, x1, x2, 'b', 0);
    gr_sym(b, s, x2, x2, 'b', 0);
    gr_eps(b, s, x2, e);
    gr_call(b, s, x1, e, t, 0);
    int q1 = gr_state(b, s), q2 = gr_state(b, s);
    gr_sym(b, s, e, q1, '"', 0);
    gr_call(b, s, q1, q2, body, 0);
    gr_sym(b, s, q2, f, '"', 0);
    int g2 = gr_state(b, s);
    gr_sym(b, s, f, g2, GR_SYM_EOM, 0);
    gr_accept(b, s, g2);
    int t1 = gr_state(b, t);
    gr_lit(b, t, 0, t1, "bb", 2);
    gr_eps(b, t, t1, 0);
    gr_accept(b, t, 0);
    gr_counter(b, body, 0, 524288);
    gr_range(b, body, 0, 0, 'a', 'z', GR_INC);
    gr_accept(b, body, 0);
    gr_grammar *g = NULL;
    TCHECKF(gr_build(b, s, &g, &err) == 0, "%s", err.msg);
    gr_builder_free(b);
    return g;
}

typedef struct tvocab {
    int n;
    char **bytes;
    size_t *len;
    int *special;
    gr_vocab *v;
} tvocab;

static void make_vocab(tvocab *tv, const char *alphabet, int n_ord, int maxlen)
{
    int na = (int)strlen(alphabet);
    tv->n = n_ord + 4;
    tv->bytes = xcalloc((size_t)tv->n, sizeof *tv->bytes);
    tv->len = xcalloc((size_t)tv->n, sizeof *tv->len);
    tv->special = xcalloc((size_t)tv->n, sizeof *tv->special);
    for (int i = 0; i < n_ord; i++) {
        int l = 1 + (int)(rnd() % (unsigned)maxlen);
        if (i < na) l = 1;
        tv->bytes[i] = xmalloc((size_t)l);
        for (int k = 0; k < l; k++) tv->bytes[i][k] = i < na ? alphabet[i] : alphabet[rnd() % (unsigned)na];
        tv->len[i] = (size_t)l;
        tv->special[i] = -1;
    }
    tv->special[n_ord] = GR_SYM_EOM;
    tv->special[n_ord + 1] = GR_SYM_SEP;
    tv->special[n_ord + 2] = -2;
    tv->special[n_ord + 3] = GR_SYM_OPEN;
    tv->v = gr_vocab_new(tv->n, (const char *const *)tv->bytes, tv->len, tv->special);
}

static void free_vocab(tvocab *tv)
{
    gr_vocab_free(tv->v);
    for (int i = 0; i < tv->n; i++) free(tv->bytes[i]);
    free(tv->bytes);
    free(tv->len);
    free(tv->special);
}

static int tok_syms(const tvocab *tv, int id, int *out)
{
    if (tv->special[id] == -2) return 0;
    if (tv->special[id] >= 0) {
        out[0] = tv->special[id];
        return 1;
    }
    for (size_t k = 0; k < tv->len[id]; k++) out[k] = (unsigned char)tv->bytes[id][k];
    return (int)tv->len[id];
}

/* random walks: at each step the mask must equal the reference on every
 * token; returns the number of steps checked */
static int walk_check(gr_grammar *g, tvocab *tv, int walks, int max_steps, int warm)
{
    gr_matcher *m = gr_matcher_new(g, tv->v);
    if (warm) TCHECK(gr_matcher_warm(m) > 0);
    uint64_t *bits = xcalloc(((size_t)tv->n + 63) / 64, sizeof *bits);
    int hist[512], nh, steps = 0, sy[16];
    for (int w = 0; w < walks; w++) {
        gr_matcher_reset(m);
        nh = 0;
        for (int st = 0; st < max_steps; st++) {
            int pick_open = -1;
            size_t allowed = gr_matcher_mask(m, bits);
            size_t count = 0;
            int pick = -1, seen = 0;
            for (int id = 0; id < tv->n; id++) {
                int n = tok_syms(tv, id, sy);
                int ref = 0;
                if (n && nh + n <= 512) {
                    memcpy(hist + nh, sy, (size_t)n * sizeof *sy);
                    ref = gr_reference_accepts(g, hist, (size_t)(nh + n), 0);
                }
                int got = (int)(bits[id >> 6] >> (id & 63) & 1);
                TCHECKF(got == ref, "walk %d step %d token %d (%.*s): mask %d, reference %d", w, st, id,
                        tv->special[id] == -1 ? (int)tv->len[id] : 4, tv->special[id] == -1 ? tv->bytes[id] : "spec",
                        got, ref);
                if (got != ref) goto out;
                if (got) {
                    count++;
                    /* walks that end at once check little: tokens that open
                     * an array are preferred */
                    int opens = n > 0 && sy[0] == '[';
                    if (rnd() % (unsigned)++seen == 0) pick = id;
                    if (opens && rnd() % 2) pick_open = id;
                }
            }
            TCHECK(count == allowed);
            steps++;
            if (pick_open >= 0 && rnd() % 4) pick = pick_open;
            if (pick < 0) {
                TCHECK(gr_matcher_done(m));
                break;
            }
            int n = tok_syms(tv, pick, sy);
            TCHECK(gr_matcher_accept(m, pick) == 0);
            memcpy(hist + nh, sy, (size_t)n * sizeof *sy);
            nh += n;
            if (gr_matcher_ended(m)) {
                TCHECK(gr_reference_accepts(g, hist, (size_t)nh, 1));
                break;
            }
        }
    }
out:
    TCHECK(!gr_matcher_overflow(m));
    free(bits);
    gr_matcher_free(m);
    return steps;
}

static void t_nested_mask(void)
{
    gr_grammar *g = nested();
    if (!g) return;
    tvocab tv;
    make_vocab(&tv, "[],0123456789x", 400, 4);
    int steps = walk_check(g, &tv, 60, 40, 0);
    printf("    nested: %d steps checked\n", steps);
    TCHECK(steps > 300);
    steps = walk_check(g, &tv, 20, 40, 1);
    TCHECK(steps > 80);
    free_vocab(&tv);
    gr_grammar_free(g);
}

static void t_ambiguous_mask(void)
{
    gr_grammar *g = ambiguous();
    if (!g) return;
    tvocab tv;
    make_vocab(&tv, "ab\"xyz", 300, 5);
    TCHECK(walk_check(g, &tv, 60, 30, 0) > 200);
    free_vocab(&tv);
    /* the big counter is one state, not 524288 */
    TCHECK(gr_grammar_n_states(g) < 40);
    gr_grammar_free(g);
}

/* s := body "xyz" <|end_of_msg|>, body := [a-z]{0,2} (counted): a token
 * such as "abx" runs past body's count and is allowed only by leaving body
 * after "ab", while its sibling "abc" is refused; the mask skips what a
 * refused token rules out, never a sibling subtree */
static void t_counted_exit_mask(void)
{
    df_error err = {0};
    gr_builder *b = gr_builder_new();
    int s = gr_machine(b, "s"), body = gr_machine(b, "body");
    gr_counter(b, body, 0, 2);
    gr_range(b, body, 0, 0, 'a', 'z', GR_INC);
    gr_accept(b, body, 0);
    int s1 = gr_state(b, s), s2 = gr_state(b, s), s3 = gr_state(b, s);
    gr_call(b, s, 0, s1, body, 0);
    gr_lit(b, s, s1, s2, "xyz", 3);
    gr_sym(b, s, s2, s3, GR_SYM_EOM, 0);
    gr_accept(b, s, s3);
    gr_grammar *g = NULL;
    TCHECKF(gr_build(b, s, &g, &err) == 0, "%s", err.msg);
    gr_builder_free(b);
    if (!g) return;
    tvocab tv;
    make_vocab(&tv, "abcxyz", 400, 4);
    TCHECK(walk_check(g, &tv, 40, 10, 0) > 100);
    free_vocab(&tv);
    gr_grammar_free(g);
}

/* top := L0 <|end_of_msg|>, Li := "(" L(i+1) ")", L11 := "x": a stack 13
 * frames deep, and tokens such as "x))))))))" that return past the top
 * frames a token is first simulated on */
static void t_deep_return_mask(void)
{
    df_error err = {0};
    gr_builder *b = gr_builder_new();
    int top = gr_machine(b, "top"), L[12];
    for (int i = 0; i < 12; i++) L[i] = gr_machine(b, "level");
    for (int i = 0; i < 11; i++) {
        int a = gr_state(b, L[i]), c = gr_state(b, L[i]), d = gr_state(b, L[i]);
        gr_sym(b, L[i], 0, a, '(', 0);
        gr_call(b, L[i], a, c, L[i + 1], 0);
        gr_sym(b, L[i], c, d, ')', 0);
        gr_accept(b, L[i], d);
    }
    int x = gr_state(b, L[11]);
    gr_sym(b, L[11], 0, x, 'x', 0);
    gr_accept(b, L[11], x);
    int t1 = gr_state(b, top), t2 = gr_state(b, top);
    gr_call(b, top, 0, t1, L[0], 0);
    gr_sym(b, top, t1, t2, GR_SYM_EOM, 0);
    gr_accept(b, top, t2);
    gr_grammar *g = NULL;
    TCHECKF(gr_build(b, top, &g, &err) == 0, "%s", err.msg);
    gr_builder_free(b);
    if (!g) return;
    tvocab tv;
    make_vocab(&tv, "()x", 300, 9);
    /* tokens 3..26: "x" and "(" each followed by 1..12 ")" */
    gr_vocab_free(tv.v);
    for (int k = 1; k <= 24; k++) {
        int id = 2 + k, r = (k - 1) % 12 + 1;
        free(tv.bytes[id]);
        tv.bytes[id] = xmalloc((size_t)r + 1);
        tv.bytes[id][0] = k <= 12 ? 'x' : '(';
        memset(tv.bytes[id] + 1, ')', (size_t)r);
        tv.len[id] = (size_t)r + 1;
    }
    tv.v = gr_vocab_new(tv.n, (const char *const *)tv.bytes, tv.len, tv.special);
    TCHECK(walk_check(g, &tv, 20, 30, 0) > 40);
    free_vocab(&tv);
    gr_grammar_free(g);
}

static void t_counts(void)
{
    gr_grammar *g = nested();
    if (!g) return;
    int s[8];
    const char *ok[] = {"123", "[1,2,3]", "[[1],[22,[333]]]", "x"};
    const char *bad[] = {"1234", "[1,2,3,4]", "[]", "[1,]", "y"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int sy[64], n = 0;
        for (const char *p = ok[i]; *p; p++) sy[n++] = (unsigned char)*p;
        if (!strcmp(ok[i], "x")) sy[n++] = GR_SYM_SEP;
        sy[n++] = GR_SYM_EOM;
        TCHECKF(gr_reference_accepts(g, sy, (size_t)n, 1), "%s", ok[i]);
        tvocab tv;
        make_vocab(&tv, "[],0123456789x", 0, 1);
        gr_matcher *m = gr_matcher_new(g, tv.v);
        TCHECKF(gr_matcher_feed(m, sy, (size_t)n) == 0 && gr_matcher_done(m), "%s", ok[i]);
        gr_matcher_free(m);
        free_vocab(&tv);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int sy[64], n = 0;
        for (const char *p = bad[i]; *p; p++) sy[n++] = (unsigned char)*p;
        sy[n++] = GR_SYM_EOM;
        TCHECKF(!gr_reference_accepts(g, sy, (size_t)n, 1), "%s", bad[i]);
    }
    (void)s;
    gr_grammar_free(g);
}

static void t_empty_language(void)
{
    df_error err = {0};
    gr_builder *b = gr_builder_new();
    int m = gr_machine(b, "nothing");
    int x = gr_state(b, m);
    gr_sym(b, m, 0, x, 'a', 0); /* x never accepts */
    gr_grammar *g = NULL;
    TCHECK(gr_build(b, m, &g, &err) != 0 && !g);
    TCHECKF(strstr(err.msg, "nothing") != NULL, "%s", err.msg);
    gr_builder_free(b);
    /* a counter that cannot be met: [a]{5,} within a machine that allows at most 2 */
    memset(&err, 0, sizeof err);
    b = gr_builder_new();
    m = gr_machine(b, "short");
    int y = gr_state(b, m), z = gr_state(b, m);
    gr_counter(b, m, 5, GR_COUNT_INF);
    gr_sym(b, m, 0, y, 'a', GR_INC);
    gr_sym(b, m, y, z, 'a', GR_INC);
    gr_accept(b, m, y);
    gr_accept(b, m, z);
    TCHECK(gr_build(b, m, &g, &err) != 0 && !g);
    gr_builder_free(b);
}

static const test_case tests[] = {
    {"nested_mask", t_nested_mask},
    {"ambiguous_mask", t_ambiguous_mask},
    {"counted_exit_mask", t_counted_exit_mask},
    {"deep_return_mask", t_deep_return_mask},
    {"counts", t_counts},
    {"empty_language", t_empty_language},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
