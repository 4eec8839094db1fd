/* fuzz_grammar.c - libFuzzer target for the schema compiler and the matcher.
 *
 * Input: a JSON Schema text, a NUL byte, then a byte string (no NUL: the
 * whole input is the schema and the string is empty).  The schema (at most
 * 4 KB, nesting bounded by json_parse) is compiled as a JSON value
 * (js_value + gr_build); when it compiles, the byte string is fed one byte
 * at a time to a matcher over a small byte-level vocabulary (the 256 single
 * bytes, some multi-byte tokens sharing prefixes, partial UTF-8, K3's four
 * specials and a token that is never allowed), and at each of the first 64
 * steps the mask is checked against gr_reference_accepts on the prefix plus
 * the token: for every token at the first step, then for 8 of the
 * multi-byte ones (in turn), the specials, the next byte and 8 others.  Feeding stops at the first
 * byte the mask refuses (gr_matcher_accept must refuse it too).  While the
 * matcher has overflowed (more stacks than it keeps) it may refuse what the
 * grammar allows, never the reverse, so only that direction is checked.
 * Then the same schema is compiled as K3 tool arguments (js_arguments) and
 * as whole replies (gr_reply_grammar: JSON content with thinking, one
 * forced tool), whose start mask must allow something.  Any disagreement
 * aborts; errors must carry a message.
 */
#include "grammar.h"
#include "json.h"
#include "json_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SCHEMA 4096
#define MAX_STEPS 64

static const char *const multi[] = {
    "\"",    "{\"",   "\":",     "\":\"",   "\",\"", "\",",  "true", "false", "null",      "},",     "}]",
    "}}",    "[{",    "[]",      "{}",      "12",    "-0",   "1e",   ".5",    "0.",        "  ",     "\n ",
    "ab",    "abc",   "a\"",     "\\u00",   "\\n",   "é",    "\xe2\x82", "\xac", "\xf0\x9f", "2024-", "-01",
    "T12:",  "http", "://",     "@",       "type",  "argument", " key=\"", "\" type=\"",
};
#define N_MULTI ((int)(sizeof multi / sizeof multi[0]))
#define N_VOCAB (256 + N_MULTI + 5)

static gr_vocab *vocab;
static int tok_len[N_VOCAB];
static int tok_sym[N_VOCAB][16];

static void make_vocab(void)
{
    static char one[256];
    const char *bytes[N_VOCAB];
    size_t len[N_VOCAB];
    int special[N_VOCAB];
    for (int i = 0; i < 256; i++) {
        one[i] = (char)i;
        bytes[i] = &one[i];
        len[i] = 1;
        special[i] = -1;
    }
    for (int i = 0; i < N_MULTI; i++) {
        bytes[256 + i] = multi[i];
        len[256 + i] = strlen(multi[i]);
        special[256 + i] = -1;
    }
    static const int sp[5] = {GR_SYM_OPEN, GR_SYM_CLOSE, GR_SYM_SEP, GR_SYM_EOM, -2};
    for (int i = 0; i < 5; i++) {
        bytes[256 + N_MULTI + i] = NULL;
        len[256 + N_MULTI + i] = 0;
        special[256 + N_MULTI + i] = sp[i];
    }
    for (int i = 0; i < N_VOCAB; i++) {
        if (special[i] >= 0) {
            tok_len[i] = 1;
            tok_sym[i][0] = special[i];
        } else if (special[i] == -2) {
            tok_len[i] = 0;
        } else {
            tok_len[i] = (int)len[i];
            for (size_t k = 0; k < len[i]; k++) tok_sym[i][k] = (uint8_t)bytes[i][k];
        }
    }
    vocab = gr_vocab_new(N_VOCAB, bytes, len, special);
}

/* token `id` against the reference after prefix syms[0..n) (room for 16 more) */
static void check_token(const gr_grammar *g, const gr_matcher *m, const uint64_t *bits, int *syms, int n, int id)
{
    int set = (int)(bits[id >> 6] >> (id & 63) & 1);
    int ref = 0;
    if (tok_len[id]) {
        memcpy(syms + n, tok_sym[id], (size_t)tok_len[id] * sizeof *syms);
        ref = gr_reference_accepts(g, syms, (size_t)n + (size_t)tok_len[id], 0);
    }
    if (set == ref) return;
    if (!set && gr_matcher_overflow(m)) return;
    fprintf(stderr, "fuzz_grammar: token %d after %d symbols: mask %d, reference %d\n", id, n, set, ref);
    abort();
}

static void matcher_walk(gr_grammar *g, const uint8_t *s, size_t n)
{
    gr_matcher *m = gr_matcher_new(g, vocab);
    uint64_t bits[(N_VOCAB + 63) / 64 + 1];
    int syms[MAX_STEPS + 16];
    size_t steps = n < MAX_STEPS ? n : MAX_STEPS;
    for (size_t i = 0; i <= steps; i++) {
        size_t allowed = gr_matcher_mask(m, bits);
        int ni = (int)i;
        int done = gr_matcher_done(m);
        if (done != gr_reference_accepts(g, syms, i, 1) && !gr_matcher_overflow(m)) {
            fprintf(stderr, "fuzz_grammar: done %d after %zu bytes disagrees with the reference\n", done, i);
            abort();
        }
        if (!allowed && !done && !gr_matcher_overflow(m)) {
            fprintf(stderr, "fuzz_grammar: nothing allowed after %zu bytes of a valid prefix\n", i);
            abort();
        }
        if (i == 0) {
            for (int id = 0; id < N_VOCAB; id++) check_token(g, m, bits, syms, ni, id);
        } else {
            for (int k = 0; k < 8; k++) check_token(g, m, bits, syms, ni, 256 + (int)((i * 8 + (size_t)k) % N_MULTI));
            for (int id = 256 + N_MULTI; id < N_VOCAB; id++) check_token(g, m, bits, syms, ni, id);
            for (int k = 0; k < 8; k++) check_token(g, m, bits, syms, ni, (int)((i * 97 + (size_t)k * 31 + 7) & 255));
        }
        if (i == steps) break;
        int b = s[i];
        check_token(g, m, bits, syms, ni, b);
        int set = (int)(bits[b >> 6] >> (b & 63) & 1);
        int rc = gr_matcher_accept(m, b);
        if (rc != (set ? 0 : -1) && !gr_matcher_overflow(m)) {
            fprintf(stderr, "fuzz_grammar: accept(%d) = %d but the mask says %d\n", b, rc, set);
            abort();
        }
        if (!set) break;
        syms[i] = b;
    }
    gr_matcher_free(m);
}

/* a whole reply: builds, or fails with a message; its start allows something */
static void reply(const gr_reply_spec *sp)
{
    df_error err = {0};
    gr_grammar *g = NULL;
    if (gr_reply_grammar(sp, &g, &err)) {
        if (!err.msg[0] || g) abort();
        return;
    }
    gr_matcher *m = gr_matcher_new(g, vocab);
    uint64_t bits[(N_VOCAB + 63) / 64 + 1];
    if (!gr_matcher_mask(m, bits)) abort();
    gr_matcher_free(m);
    gr_grammar_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!vocab) make_vocab();
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    if (slen > MAX_SCHEMA) return 0;
    const uint8_t *str = nul ? nul + 1 : data + size;
    size_t n = nul ? size - slen - 1 : 0;
    df_error err = {0};
    json_doc *d = json_parse((const char *)data, slen, &err);
    if (!d) return 0;
    const json_value *root = json_root(d);

    gr_builder *b = gr_builder_new();
    js_compiler *c = js_compiler_new(b, root);
    int v = js_value(c, root, "schema", &err);
    js_compiler_free(c);
    if (v < 0) {
        if (!err.msg[0]) abort();
    } else {
        gr_grammar *g = NULL;
        if (gr_build(b, v, &g, &err)) {
            if (!err.msg[0]) abort();
        } else {
            matcher_walk(g, str, n);
            gr_grammar_free(g);
        }
    }
    gr_builder_free(b);

    b = gr_builder_new();
    c = js_compiler_new(b, root);
    err = (df_error){0};
    v = js_arguments(c, root, "tools[t].parameters", &err);
    js_compiler_free(c);
    if (v < 0 && !err.msg[0]) abort();
    if (v >= 0) {
        gr_grammar *g = NULL;
        if (gr_build(b, v, &g, &err)) {
            if (!err.msg[0]) abort();
        } else {
            gr_grammar_free(g);
        }
    }
    gr_builder_free(b);

    gr_reply_spec sp = {0};
    sp.kind = GR_REPLY_JSON;
    sp.thinking = 1;
    sp.schema = sp.schema_root = root;
    sp.path = "response_format.json_schema.schema";
    reply(&sp);
    gr_tool t = {"t\"&", root, root, 1};
    sp = (gr_reply_spec){0};
    sp.kind = GR_REPLY_TOOLS;
    sp.tools = &t;
    sp.n_tools = 1;
    sp.single = 1;
    reply(&sp);
    json_free(d);
    return 0;
}
