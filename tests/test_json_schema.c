/* test_json_schema.c - JSON Schema to grammar, end to end without a model:
 * random walks through the default model's real vocabulary under the
 * mask (the tokens a sampler at temperature 1 could pick), the output read
 * back by chat_template's own parser, and every value checked by a small
 * validator of the supported subset (patterns by PCRE2); the mask checked
 * against the reference simulator on the way; constraining keywords
 * refused by name, annotations accepted; every Claude Code tool compiled
 * and forced.  (The server tests check the same with ajv through the real
 * SDKs; this one runs in the unit suite.)
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "chat_template.h"
#include "grammar.h"
#include "harness.h"
#include "json.h"
#include "json_schema.h"
#include "json_write.h"
#include "tokenizer.h"
#include "util.h"

#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

static tokenizer *g_tok;
static gr_vocab *g_voc;

static int setup(void)
{
    if (g_tok) return 0;
    df_error err = {0};
    if (tokenizer_load("models/k3-mini", &g_tok, &err)) {
        t_fail(__FILE__, __LINE__, "the default model's tokenizer (models/k3-mini): %s", err.msg);
        return -1;
    }
    g_voc = gr_vocab_from_tokenizer(g_tok);
    return 0;
}

static uint64_t rng;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* ---- a validator of the supported subset -------------------------------- */

static const json_value *root_schema;

static size_t cp_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static int valid(const json_value *v, const json_value *s, char *why, size_t wn);

static int type_ok(const json_value *v, const char *t)
{
    if (!strcmp(t, "string")) return v->type == JSON_STRING;
    if (!strcmp(t, "number")) return v->type == JSON_NUMBER;
    if (!strcmp(t, "integer")) return v->type == JSON_NUMBER && v->num == floor(v->num);
    if (!strcmp(t, "boolean")) return v->type == JSON_BOOL;
    if (!strcmp(t, "null")) return v->type == JSON_NULL;
    if (!strcmp(t, "object")) return v->type == JSON_OBJECT;
    if (!strcmp(t, "array")) return v->type == JSON_ARRAY;
    return 0;
}

static int equal(const json_value *a, const json_value *b)
{
    json_buf x, y;
    json_buf_init(&x);
    json_buf_init(&y);
    json_write_value(&x, a, 0);
    json_write_value(&y, b, 0);
    int eq = x.len == y.len && !memcmp(x.p, y.p, x.len);
    json_buf_free(&x);
    json_buf_free(&y);
    return eq;
}

#define BAD(...) (snprintf(why, wn, __VA_ARGS__), 0)

static int valid(const json_value *v, const json_value *s, char *why, size_t wn)
{
    if (!s || s->type == JSON_BOOL) return !s || s->b ? 1 : BAD("false schema");
    const json_value *ref = json_get(s, "$ref");
    if (ref) {
        const char *r = ref->str;
        const json_value *d = !strcmp(r, "#") ? root_schema
                              : !strncmp(r, "#/$defs/", 8) ? json_get(json_get(root_schema, "$defs"), r + 8)
                                                           : json_get(json_get(root_schema, "definitions"), r + 14);
        return valid(v, d, why, wn);
    }
    const json_value *t = json_get(s, "type");
    if (t && t->type == JSON_STRING && !type_ok(v, t->str)) return BAD("type %s", t->str);
    if (t && t->type == JSON_ARRAY) {
        int ok = 0;
        for (size_t i = 0; i < t->len; i++) ok |= type_ok(v, t->items[i]->str);
        if (!ok) return BAD("none of the types");
    }
    const json_value *en = json_get(s, "enum"), *cn = json_get(s, "const");
    if (cn && !equal(v, cn)) return BAD("const");
    if (en) {
        int ok = 0;
        for (size_t i = 0; i < en->len; i++) ok |= equal(v, en->items[i]);
        if (!ok) return BAD("enum");
    }
    const json_value *alt = json_get(s, "anyOf") ? json_get(s, "anyOf") : json_get(s, "oneOf");
    if (alt) {
        int n = 0;
        for (size_t i = 0; i < alt->len; i++) n += valid(v, alt->items[i], why, wn);
        if (!n) return BAD("no alternative");
    }
    const json_value *all = json_get(s, "allOf");
    for (size_t i = 0; all && i < all->len; i++)
        if (!valid(v, all->items[i], why, wn)) return 0;
    if (v->type == JSON_NUMBER) {
        double x = v->num, b;
        if (!json_get_num(s, "minimum", &b) && x < b) return BAD("minimum");
        if (!json_get_num(s, "maximum", &b) && x > b) return BAD("maximum");
        if (!json_get_num(s, "exclusiveMinimum", &b) && x <= b) return BAD("exclusiveMinimum");
        if (!json_get_num(s, "exclusiveMaximum", &b) && x >= b) return BAD("exclusiveMaximum");
    }
    if (v->type == JSON_STRING) {
        int64_t k;
        size_t n = cp_len(v->str, v->len);
        if (!json_get_int(s, "minLength", &k) && (int64_t)n < k) return BAD("minLength");
        if (!json_get_int(s, "maxLength", &k) && (int64_t)n > k) return BAD("maxLength");
        const char *pat = json_get_str(s, "pattern");
        if (pat) {
            int ec;
            PCRE2_SIZE eo;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
            if (!re) return BAD("pattern does not compile");
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
            int r = pcre2_match(re, (PCRE2_SPTR)v->str, v->len, 0, 0, md, NULL);
            pcre2_match_data_free(md);
            pcre2_code_free(re);
            if (r < 0) return BAD("pattern %s", pat);
        }
    }
    if (v->type == JSON_ARRAY) {
        int64_t k;
        if (!json_get_int(s, "minItems", &k) && (int64_t)v->len < k) return BAD("minItems");
        if (!json_get_int(s, "maxItems", &k) && (int64_t)v->len > k) return BAD("maxItems");
        const json_value *it = json_get(s, "items");
        for (size_t i = 0; it && i < v->len; i++)
            if (!valid(v->items[i], it, why, wn)) return 0;
    }
    if (v->type == JSON_OBJECT) {
        const json_value *pr = json_get(s, "properties"), *rq = json_get(s, "required"),
                         *ap = json_get(s, "additionalProperties");
        for (size_t i = 0; rq && i < rq->len; i++)
            if (!json_get(v, rq->items[i]->str)) return BAD("required %s", rq->items[i]->str);
        for (size_t i = 0; i < v->len; i++) {
            const json_value *ps = pr ? json_get(pr, v->keys[i]) : NULL;
            if (!ps && ap && ap->type == JSON_BOOL && !ap->b) return BAD("additional property %s", v->keys[i]);
            if (!ps && ap && ap->type == JSON_OBJECT) ps = ap;
            if (ps && !valid(v->items[i], ps, why, wn)) return 0;
        }
    }
    return 1;
}

/* ---- walks ----------------------------------------------------------------- */

typedef struct walk_out {
    json_buf content;     /* response text */
    json_buf args[8];     /* each call's OpenAI arguments string */
    char names[8][64];
    int n_calls;
    int ended;
    int steps;
} walk_out;

/* A random walk under the mask through the real vocabulary, fed to the
 * chat parser; every `check_every` steps the mask is compared with the
 * reference simulator on every token. */
static void walk(gr_grammar *g, int thinking, uint64_t seed, int max_steps, int check_every, walk_out *o)
{
    memset(o, 0, sizeof *o);
    json_buf_init(&o->content);
    for (int i = 0; i < 8; i++) json_buf_init(&o->args[i]);
    rng = seed * 2654435761u + 1;
    gr_matcher *m = gr_matcher_new(g, g_voc);
    int V = tokenizer_n_vocab(g_tok);
    uint64_t *bits = xcalloc(((size_t)V + 63) / 64, sizeof *bits);
    int *hist = xmalloc(64 * (size_t)max_steps * sizeof *hist), nh = 0;
    chat_parser *p = NULL;
    df_error err = {0};
    TCHECK(chat_parser_new(g_tok, thinking, &p, &err) == 0);
    int *allowed = xmalloc((size_t)V * sizeof *allowed);
    int sy[128];
    for (int st = 0; st < max_steps && p; st++) {
        gr_matcher_mask(m, bits);
        int na = 0, ending = -1, quote = -1;
        for (int id = 0; id < V; id++)
            if (bits[id >> 6] >> (id & 63) & 1) {
                allowed[na++] = id;
                size_t n = 0;
                const char *b = tokenizer_is_special(g_tok, id) ? NULL : tokenizer_token_bytes(g_tok, id, &n);
                if (!b && (ending < 0 || rnd() % 2)) ending = id;
                if (b && n < 4 && memchr(b, '"', n) && (quote < 0 || rnd() % 2)) quote = id;
            }
        /* the reference replays the whole history per token: early steps only */
        if (check_every && st % check_every == 0 && st < 150) {
            for (int id = 0; id < V; id++) {
                int n = 0;
                if (tokenizer_is_special(g_tok, id)) {
                    const char *names[4] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
                    for (int k = 0; k < 4; k++)
                        if (tokenizer_special_id(g_tok, names[k]) == id) sy[n++] = GR_SYM_OPEN + k;
                } else {
                    size_t len = 0;
                    const char *b = tokenizer_token_bytes(g_tok, id, &len);
                    for (size_t k = 0; k < len && k < 120; k++) sy[n++] = (unsigned char)b[k];
                }
                int ref = 0;
                if (n) {
                    memcpy(hist + nh, sy, (size_t)n * sizeof *sy);
                    ref = gr_reference_accepts(g, hist, (size_t)(nh + n), 0);
                }
                int got = (int)(bits[id >> 6] >> (id & 63) & 1);
                TCHECKF(got == ref, "step %d token %d: mask %d, reference %d", st, id, got, ref);
                if (got != ref) goto out;
            }
        }
        TCHECKF(na > 0, "step %d: nothing allowed", st);
        if (!na) break;
        /* specials and quotes end things: preferred, or walks never end */
        int pick = allowed[rnd() % (unsigned)na];
        unsigned r = rnd() % 10;
        if (ending >= 0 && r < 3) pick = ending;
        else if (quote >= 0 && r < 5) pick = quote;
        TCHECK(gr_matcher_accept(m, pick) == 0);
        if (tokenizer_is_special(g_tok, pick)) {
            const char *names[4] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
            for (int k = 0; k < 4; k++)
                if (tokenizer_special_id(g_tok, names[k]) == pick) hist[nh++] = GR_SYM_OPEN + k;
        } else {
            size_t len = 0;
            const char *b = tokenizer_token_bytes(g_tok, pick, &len);
            for (size_t k = 0; k < len; k++) hist[nh++] = (unsigned char)b[k];
        }
        const chat_event *ev;
        size_t ne = chat_parser_feed(p, pick, &ev);
        for (size_t k = 0; k < ne; k++) {
            if (ev[k].type == CHAT_EV_CONTENT) json_buf_put(&o->content, ev[k].text, ev[k].len);
            if (ev[k].type == CHAT_EV_CALL_END && o->n_calls < 8) {
                json_buf_put(&o->args[o->n_calls], ev[k].text, ev[k].len);
                snprintf(o->names[o->n_calls], sizeof o->names[0], "%.*s", (int)ev[k].name_len, ev[k].name);
                o->n_calls++;
            }
        }
        o->steps = st + 1;
        if (gr_matcher_ended(m)) {
            o->ended = 1;
            TCHECK(chat_parser_done(p));
            TCHECK(gr_reference_accepts(g, hist, (size_t)nh, 1));
            break;
        }
    }
out:
    TCHECK(!gr_matcher_overflow(m));
    chat_parser_free(p);
    free(allowed);
    free(hist);
    free(bits);
    gr_matcher_free(m);
}

static void walk_free(walk_out *o)
{
    json_buf_free(&o->content);
    for (int i = 0; i < 8; i++) json_buf_free(&o->args[i]);
}

static gr_grammar *json_grammar(const json_value *schema, int thinking)
{
    gr_reply_spec sp = {0};
    sp.kind = GR_REPLY_JSON;
    sp.thinking = thinking;
    sp.schema = sp.schema_root = schema;
    sp.path = "schema";
    gr_grammar *g = NULL;
    df_error err = {0};
    TCHECKF(gr_reply_grammar(&sp, &g, &err) == 0, "%s", err.msg);
    return g;
}

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\","
    "\"minimum\":18,\"maximum\":99},\"email\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"name\",\"age\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":"
    "\"^[a-z]{2,4}-\\\\d{3}$\"},\"score\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1},\"ok\":{\"type\":"
    "\"boolean\"}},\"required\":[\"id\",\"score\"]},\"minItems\":1,\"maxItems\":3}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"enum\":[\"a\",\"b\",3,null]},\"kids\":{\"type\":"
    "\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"],\"additionalProperties\":"
    "false}},\"$ref\":\"#/$defs/node\"}",
    "{\"anyOf\":[{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},{\"type\":\"integer\",\"minimum\":-40,\"maximum\":"
    "-3},{\"type\":\"null\"}]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},\"title\":\"a map\"}",
    "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date-time\"},\"id\":{\"type\":"
    "\"string\",\"format\":\"uuid\"},\"note\":{\"type\":\"string\",\"pattern\":\"^[\\\\s\\\\S]{0,30}$\"},\"k\":{\"const\":"
    "\"fixed\"}},\"required\":[\"when\",\"id\",\"k\"],\"allOf\":[{\"properties\":{\"extra\":{\"type\":[\"number\","
    "\"null\"],\"minimum\":-2.5,\"maximum\":2.5}},\"required\":[\"extra\"]}]}",
};

static void t_json_outputs_valid(void)
{
    if (setup()) return;
    int n_ended = 0, n_walks = 0, n_dup = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        df_error err = {0};
        json_doc *d = json_parse(schemas[i], strlen(schemas[i]), &err);
        TCHECKF(d, "schema %zu: %s", i, err.msg);
        if (!d) continue;
        root_schema = json_root(d);
        for (int thinking = 0; thinking < 2; thinking++) {
            gr_grammar *g = json_grammar(json_root(d), thinking);
            if (!g) continue;
            for (uint64_t seed = 1; seed <= 4; seed++) {
                walk_out o;
                walk(g, thinking, seed + 100 * i, 3000, seed == 1 && thinking == (int)(i % 2) ? 8 : 0, &o);
                n_walks++;
                if (o.ended) {
                    n_ended++;
                    json_doc *v = json_parse(o.content.p ? o.content.p : "", o.content.len, &err);
                    /* a map may repeat a key (json_schema.c says so; JSON.parse keeps the last):
                     * this reader refuses those, nothing else */
                    if (!v && strstr(err.msg, "duplicate key") && json_get(json_root(d), "additionalProperties") &&
                        !json_get(json_root(d), "properties")) {
                        n_dup++;
                        walk_free(&o);
                        continue;
                    }
                    TCHECKF(v, "schema %zu seed %llu: the content does not parse (%s): %.*s", i,
                            (unsigned long long)seed, err.msg, (int)o.content.len, o.content.p);
                    char why[200] = "";
                    if (v)
                        TCHECKF(valid(json_root(v), json_root(d), why, sizeof why),
                                "schema %zu seed %llu: %s: %.*s", i, (unsigned long long)seed, why,
                                (int)o.content.len, o.content.p);
                    json_free(v);
                }
                walk_free(&o);
            }
            gr_grammar_free(g);
        }
        json_free(d);
    }
    printf("    %d of %d walks ended (%d maps with a repeated key)\n", n_ended, n_walks, n_dup);
    TCHECK(n_ended * 4 >= n_walks * 3);
}

static void t_refused_keywords(void)
{
    static const char *const kw[] = {"patternProperties", "not", "if", "uniqueItems", "multipleOf", "contains",
                                     "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                                     "prefixItems", "unevaluatedProperties", "nullable", "contentEncoding"};
    for (size_t i = 0; i < sizeof kw / sizeof *kw; i++) {
        char text[300];
        snprintf(text, sizeof text, "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"array\",\"%s\":1}}}", kw[i]);
        df_error err = {0};
        json_doc *d = json_parse(text, strlen(text), &err);
        gr_reply_spec sp = {.kind = GR_REPLY_JSON, .schema = json_root(d), .schema_root = json_root(d),
                            .path = "response_format.json_schema.schema"};
        gr_grammar *g = NULL;
        TCHECK(gr_reply_grammar(&sp, &g, &err) != 0 && !g);
        char want[80];
        snprintf(want, sizeof want, "\"%s\"", kw[i]);
        TCHECKF(strstr(err.msg, want) && strstr(err.msg, "properties/x"), "%s: %s", kw[i], err.msg);
        json_free(d);
    }
}

static void t_annotations_accepted(void)
{
    const char *text = "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"$id\":\"x\",\"title\":\"t\","
                       "\"description\":\"d\",\"$comment\":\"c\",\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                       "\"string\",\"default\":\"q\",\"examples\":[\"e\"],\"deprecated\":false,\"readOnly\":true,"
                       "\"writeOnly\":false,\"description\":\"x\"}},\"required\":[\"a\"]}";
    df_error err = {0};
    json_doc *d = json_parse(text, strlen(text), &err);
    gr_reply_spec sp = {.kind = GR_REPLY_JSON, .schema = json_root(d), .schema_root = json_root(d), .path = "s"};
    gr_grammar *g = NULL;
    TCHECKF(gr_reply_grammar(&sp, &g, &err) == 0, "%s", err.msg);
    gr_grammar_free(g);
    json_free(d);
}

/* Claude Code's own tool schemas, from the request its agent test records:
 * each forced by name, and all of them under "required"; every call's
 * arguments valid */
static void t_claude_code_tools(void)
{
    if (setup()) return;
    size_t n = 0;
    char *text = t_slurp("tests/agents/recorded/claude-code/session-a-turn1.json", &n);
    TCHECKF(text, "tests/agents/recorded/claude-code/session-a-turn1.json is missing");
    if (!text) return;
    df_error err = {0};
    json_doc *d = json_parse(text, n, &err);
    free(text);
    TCHECKF(d, "%s", err.msg);
    if (!d) return;
    const json_value *body = json_get(json_root(d), "body") ? json_get(json_root(d), "body") : json_root(d);
    const json_value *tools = json_get(body, "tools");
    TCHECK(tools && tools->len >= 10);
    gr_tool *gt = xcalloc(tools->len, sizeof *gt);
    for (size_t i = 0; i < tools->len; i++)
        gt[i] = (gr_tool){json_get_str(tools->items[i], "name"), json_get(tools->items[i], "input_schema"),
                          json_get(tools->items[i], "input_schema"), 0};
    int valid_calls = 0;
    for (size_t i = 0; i <= tools->len; i++) {
        gr_reply_spec sp = {.kind = GR_REPLY_TOOLS, .thinking = 1, .tools = i < tools->len ? &gt[i] : gt,
                            .n_tools = i < tools->len ? 1 : (int)tools->len, .single = i < tools->len};
        gr_grammar *g = NULL;
        TCHECKF(gr_reply_grammar(&sp, &g, &err) == 0, "%s: %s", i < tools->len ? gt[i].name : "all", err.msg);
        if (!g) continue;
        for (uint64_t seed = 1; seed <= 2; seed++) {
            walk_out o;
            walk(g, 1, seed + 31 * i, 4000, seed == 1 && i % 6 == 0 ? 15 : 0, &o);
            for (int c = 0; c < o.n_calls; c++) {
                json_doc *a = json_parse(o.args[c].p, o.args[c].len, &err);
                TCHECKF(a, "%s: arguments do not parse: %.*s", o.names[c], (int)o.args[c].len, o.args[c].p);
                const json_value *schema = NULL;
                for (size_t k = 0; k < tools->len; k++)
                    if (!strcmp(gt[k].name, o.names[c])) schema = gt[k].params;
                TCHECKF(schema, "a call of %s, which is not a tool", o.names[c]);
                if (i < tools->len) TCHECK(!strcmp(o.names[c], gt[i].name));
                root_schema = schema;
                char why[200] = "";
                if (a && schema) {
                    int ok = valid(json_root(a), schema, why, sizeof why);
                    TCHECKF(ok, "%s: %s: %.*s", o.names[c], why, (int)o.args[c].len, o.args[c].p);
                    valid_calls += ok;
                }
                json_free(a);
            }
            if (o.ended) TCHECK(o.n_calls >= 1 && (i == tools->len || o.n_calls == 1));
            walk_free(&o);
        }
        gr_grammar_free(g);
    }
    printf("    %d valid calls of %zu tools\n", valid_calls, tools->len);
    TCHECK(valid_calls >= (int)tools->len);
    free(gt);
    json_free(d);
}

static const test_case tests[] = {
    {"json_outputs_valid", t_json_outputs_valid},
    {"refused_keywords", t_refused_keywords},
    {"annotations_accepted", t_annotations_accepted},
    {"claude_code_tools", t_claude_code_tools},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    gr_vocab_free(g_voc);
    tokenizer_free(g_tok);
    return rc;
}
