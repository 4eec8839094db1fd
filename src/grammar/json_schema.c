/* json_schema.c - JSON Schema to grammar machines (see json_schema.h).
 *
 * Supported (everything else that constrains is refused by name, with a
 * JSON pointer to it):
 *   type (one or a list), enum, const, properties, required,
 *   additionalProperties (false; true or a schema when there are no
 *   properties: a map), items (one schema), minItems, maxItems, anyOf,
 *   oneOf, allOf (of object schemas: their properties, required lists and
 *   additionalProperties merged; of string schemas: every pattern, format
 *   and length bound at once, the patterns' intersection), $ref to #, #/$defs/..., #/definitions/...
 *   (recursion allowed), minimum, maximum, exclusiveMinimum,
 *   exclusiveMaximum (numbers, or draft-04 booleans), minLength, maxLength,
 *   pattern and format (gr_string.h).
 * Ignored annotations: $schema $id $anchor title description default
 *   examples $comment deprecated readOnly writeOnly, and $defs/definitions
 *   themselves (read when referenced).
 *
 * What the generated text is, within the schema (always valid, a subset of
 * the valid texts where noted):
 *   - a map's keys (an object without properties) have at most JS_MAX_KEY
 *     characters, and a key may repeat (a grammar cannot remember the keys
 *     it wrote; JSON allows it, and JSON.parse and ajv keep the last);
 *   - properties come in the schema's order, each optional one present or
 *     not; no property outside `properties` is written (additionalProperties
 *     true or a schema beside properties allows more: they are not written);
 *   - numbers: no exponent, at most 16 integer digits (JSON's integers past
 *     2^53 lose precision anyway), a fraction of at most 15 digits ending in
 *     a non-zero one; bounds that are not integers are met by the integers
 *     and fractions around the nearest integers inside them;
 *   - strings: see gr_string.h; enum and const values are written as given,
 *     compactly, keeping only those of an allowed type;
 *   - oneOf is generated as anyOf: alternatives that overlap can produce a
 *     value matching two of them (valid for anyOf, not oneOf);
 *   - whitespace between JSON tokens: none, a space, or a newline and at
 *     most JS_MAX_WS spaces or tabs.
 * A schema without `type` takes the types its keywords imply (properties:
 * object, items: array, minLength: string, minimum: number...), or any.
 * Machines are memoized per (schema node, types, raw), so $ref cycles and
 * shared definitions are built once.
 */
#include "json_schema.h"
#include "gr_string.h"
#include "json_write.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    T_STRING = 1,
    T_NUMBER = 2,
    T_INTEGER = 4,
    T_BOOL = 8,
    T_NULL = 16,
    T_OBJECT = 32,
    T_ARRAY = 64,
    T_ALL = 127,
};

#define INT_CAP 9999999999999999LL /* 16 digits */
#define FRAC_MAX 15

typedef struct memo {
    const json_value *s;
    unsigned tmask;
    int raw;
    int m;
} memo;

struct js_compiler {
    gr_builder *b;
    const json_value *root;
    memo *memo;
    size_t n_memo, cap_memo;
    int ws;            /* bounded whitespace */
    int str_any[2];    /* plain string bodies, JSON / raw */
    int key_body;      /* a free map's keys */
    int depth;
};

js_compiler *js_compiler_new(gr_builder *b, const json_value *root)
{
    js_compiler *c = xcalloc(1, sizeof *c);
    c->b = b;
    c->root = root;
    c->ws = c->str_any[0] = c->str_any[1] = c->key_body = -1;
    return c;
}

void js_compiler_free(js_compiler *c)
{
    if (!c) return;
    free(c->memo);
    free(c);
}

/* fmt is a literal at every call, with one %s for a */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static int fail(df_error *err, const json_value *at, const char *fmt, const char *a, const char *path)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a);
#pragma GCC diagnostic pop
    return df_err_set(err, DF_ERR_UNSUPPORTED, at ? at->pos : -1, "%s (at %s)", msg, path && *path ? path : "the schema");
}

static void sub_path(char *out, size_t n, const char *path, const char *key)
{
    snprintf(out, n, "%s/%s", path, key);
}

/* ---- keywords ------------------------------------------------------------ */

static const char *const annotations[] = {"$schema", "$id", "$anchor", "title", "description", "default",
                                           "examples", "$comment", "deprecated", "readOnly", "writeOnly",
                                           "$defs", "definitions", NULL};
static const char *const handled[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                       "items", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref",
                                       "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
                                       "maxLength", "pattern", "format", NULL};

static int in_list(const char *k, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(k, *list)) return 1;
    return 0;
}

static int check_keys(const json_value *s, const char *path, df_error *err)
{
    for (size_t i = 0; i < s->len; i++) {
        const char *k = s->keys[i];
        if (in_list(k, annotations) || in_list(k, handled)) continue;
        char p[512];
        sub_path(p, sizeof p, path, k);
        return fail(err, s->items[i], "JSON Schema keyword \"%s\" is not supported by the grammar engine", k, p);
    }
    return 0;
}

static int is_annotation_only(const json_value *s, const char *except)
{
    for (size_t i = 0; i < s->len; i++)
        if (!in_list(s->keys[i], annotations) && strcmp(s->keys[i], except)) return 0;
    return 1;
}

static unsigned type_bit(const char *t)
{
    if (!strcmp(t, "string")) return T_STRING;
    if (!strcmp(t, "number")) return T_NUMBER | T_INTEGER;
    if (!strcmp(t, "integer")) return T_INTEGER;
    if (!strcmp(t, "boolean")) return T_BOOL;
    if (!strcmp(t, "null")) return T_NULL;
    if (!strcmp(t, "object")) return T_OBJECT;
    if (!strcmp(t, "array")) return T_ARRAY;
    return 0;
}

static unsigned value_type(const json_value *v)
{
    switch (v->type) {
    case JSON_STRING: return T_STRING;
    case JSON_NUMBER: return v->is_int || (isfinite(v->num) && v->num == floor(v->num)) ? T_INTEGER | T_NUMBER
                                                                                          : T_NUMBER;
    case JSON_BOOL: return T_BOOL;
    case JSON_NULL: return T_NULL;
    case JSON_OBJECT: return T_OBJECT;
    case JSON_ARRAY: return T_ARRAY;
    }
    return 0;
}

static int resolve(js_compiler *c, const json_value *ref, const char *path, const json_value **out, df_error *err)
{
    if (ref->type != JSON_STRING) return fail(err, ref, "%s must be a string", "$ref", path);
    const char *r = ref->str;
    if (!strcmp(r, "#")) {
        *out = c->root;
        return 0;
    }
    const char *name = NULL;
    const json_value *defs = NULL;
    if (!strncmp(r, "#/$defs/", 8)) {
        name = r + 8;
        defs = json_get(c->root, "$defs");
    } else if (!strncmp(r, "#/definitions/", 14)) {
        name = r + 14;
        defs = json_get(c->root, "definitions");
    }
    if (!name || strchr(name, '/') || strchr(name, '~') || strchr(name, '%'))
        return fail(err, ref, "$ref \"%s\" is not supported (only #, #/$defs/NAME and #/definitions/NAME)", r, path);
    const json_value *d = defs ? json_get(defs, name) : NULL;
    if (!d) return df_err_set(err, DF_ERR_ARG, ref->pos, "$ref \"%s\" names no definition (at %s)", r, path);
    *out = d;
    return 0;
}

/* the types a schema admits (following $ref, anyOf/oneOf, enum, const) */
static unsigned types_of(js_compiler *c, const json_value *s, int depth)
{
    if (!s || (s->type == JSON_BOOL && s->b)) return T_ALL;
    if (s->type != JSON_OBJECT || depth > 32) return 0;
    const json_value *ref = json_get(s, "$ref");
    if (ref) {
        const json_value *d = NULL;
        df_error e = {0};
        return resolve(c, ref, "", &d, &e) ? 0 : types_of(c, d, depth + 1);
    }
    const json_value *alt = json_get(s, "anyOf") ? json_get(s, "anyOf") : json_get(s, "oneOf");
    if (alt && alt->type == JSON_ARRAY) {
        unsigned t = 0;
        for (size_t i = 0; i < alt->len; i++) t |= types_of(c, alt->items[i], depth + 1);
        return t;
    }
    const json_value *en = json_get(s, "enum"), *cn = json_get(s, "const");
    unsigned t = T_ALL;
    const json_value *ty = json_get(s, "type");
    if (ty && ty->type == JSON_STRING) t = type_bit(ty->str);
    else if (ty && ty->type == JSON_ARRAY) {
        t = 0;
        for (size_t i = 0; i < ty->len; i++)
            if (ty->items[i]->type == JSON_STRING) t |= type_bit(ty->items[i]->str);
    } else if (!ty) {
        unsigned implied = 0;
        if (json_get(s, "properties") || json_get(s, "additionalProperties") || json_get(s, "required"))
            implied |= T_OBJECT;
        if (json_get(s, "items") || json_get(s, "minItems") || json_get(s, "maxItems")) implied |= T_ARRAY;
        if (json_get(s, "minLength") || json_get(s, "maxLength") || json_get(s, "pattern") || json_get(s, "format"))
            implied |= T_STRING;
        if (json_get(s, "minimum") || json_get(s, "maximum") || json_get(s, "exclusiveMinimum") ||
            json_get(s, "exclusiveMaximum"))
            implied |= T_NUMBER | T_INTEGER;
        if (implied) t = implied;
    }
    const json_value *all = json_get(s, "allOf");
    for (size_t i = 0; all && all->type == JSON_ARRAY && i < all->len; i++) t &= types_of(c, all->items[i], depth + 1);
    if (cn) return t & value_type(cn);
    if (en && en->type == JSON_ARRAY) {
        unsigned u = 0;
        for (size_t i = 0; i < en->len; i++) u |= value_type(en->items[i]);
        return t & u;
    }
    return t;
}

/* ---- small machines ------------------------------------------------------ */

/* whitespace between JSON tokens: none, one space, or a newline and an
 * indent of at most JS_MAX_WS spaces or tabs (a pretty-printed value
 * fits; an endless run of blanks does not) */
static int ws_machine(js_compiler *c)
{
    if (c->ws >= 0) return c->ws;
    int m = gr_machine(c->b, "whitespace");
    int sp = gr_state(c->b, m), nl = gr_state(c->b, m);
    gr_accept(c->b, m, 0);
    gr_sym(c->b, m, 0, sp, ' ', 0);
    gr_accept(c->b, m, sp);
    gr_sym(c->b, m, 0, nl, '\n', 0);
    gr_accept(c->b, m, nl);
    int prev = nl;
    for (int i = 0; i < JS_MAX_WS; i++) {
        int s = gr_state(c->b, m);
        gr_sym(c->b, m, prev, s, ' ', 0);
        gr_sym(c->b, m, prev, s, '\t', 0);
        gr_accept(c->b, m, s);
        prev = s;
    }
    return c->ws = m;
}

/* optional whitespace from -> returned state */
static int ws(js_compiler *c, int m, int from)
{
    int s = gr_state(c->b, m);
    gr_call(c->b, m, from, s, ws_machine(c), 0);
    return s;
}

static int lit(js_compiler *c, int m, int from, const char *s)
{
    int t = gr_state(c->b, m);
    gr_lit(c->b, m, from, t, s, strlen(s));
    return t;
}

/* the digits of integers in [lo, hi] (0 <= lo <= hi), same length n: A..B */
static void any_digits(gr_builder *b, int m, int from, int to, int n)
{
    int cur = from;
    for (int i = 0; i < n; i++) {
        int nx = i + 1 == n ? to : gr_state(b, m);
        gr_range(b, m, cur, nx, '0', '9', 0);
        cur = nx;
    }
    if (!n) gr_eps(b, m, from, to);
}

static void same_len(gr_builder *b, int m, int from, int to, const char *A, const char *B, int n)
{
    if (n == 0) {
        gr_eps(b, m, from, to);
        return;
    }
    int full = 1;
    for (int i = 1; i < n; i++)
        if (A[i] != '0' || B[i] != '9') full = 0;
    if (full) {
        int s = n > 1 ? gr_state(b, m) : to;
        gr_range(b, m, from, s, A[0], B[0], 0);
        if (n > 1) any_digits(b, m, s, to, n - 1);
        return;
    }
    if (A[0] == B[0]) {
        int s = gr_state(b, m);
        gr_sym(b, m, from, s, A[0], 0);
        same_len(b, m, s, to, A + 1, B + 1, n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int s1 = gr_state(b, m);
    gr_sym(b, m, from, s1, A[0], 0);
    same_len(b, m, s1, to, A + 1, nines, n - 1);
    if (A[0] + 1 <= B[0] - 1) {
        int s2 = gr_state(b, m);
        gr_range(b, m, from, s2, A[0] + 1, B[0] - 1, 0);
        any_digits(b, m, s2, to, n - 1);
    }
    int s3 = gr_state(b, m);
    gr_sym(b, m, from, s3, B[0], 0);
    same_len(b, m, s3, to, zeros, B + 1, n - 1);
}

static uint64_t pow10u(int n)
{
    uint64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
}

static int ndigits(uint64_t x)
{
    int n = 1;
    while (x >= 10) {
        x /= 10;
        n++;
    }
    return n;
}

static void uint_range(gr_builder *b, int m, int from, int to, uint64_t lo, uint64_t hi)
{
    for (int nd = ndigits(lo); nd <= ndigits(hi); nd++) {
        uint64_t a = nd == 1 ? 0 : pow10u(nd - 1), z = pow10u(nd) - 1;
        if (a < lo) a = lo;
        if (z > hi) z = hi;
        if (a > z) continue;
        char A[24], B[24];
        snprintf(A, sizeof A, "%llu", (unsigned long long)a);
        snprintf(B, sizeof B, "%llu", (unsigned long long)z);
        same_len(b, m, from, to, A, B, nd);
    }
}

/* integers in [lo, hi] as JSON text */
static void int_range(gr_builder *b, int m, int from, int to, int64_t lo, int64_t hi)
{
    if (lo > hi) return;
    if (lo <= -1) {
        int64_t top = hi < -1 ? hi : -1;
        int s = gr_state(b, m);
        gr_sym(b, m, from, s, '-', 0);
        uint_range(b, m, s, to, (uint64_t)(-top), (uint64_t)(-lo));
    }
    if (hi >= 0) uint_range(b, m, from, to, (uint64_t)(lo > 0 ? lo : 0), (uint64_t)hi);
}

/* "." then 1..FRAC_MAX digits, the last non-zero */
static void fraction(gr_builder *b, int m, int from, int to)
{
    int s = gr_state(b, m);
    gr_sym(b, m, from, s, '.', 0);
    for (int i = 0; i < FRAC_MAX; i++) {
        gr_range(b, m, s, to, '1', '9', 0);
        if (i + 1 < FRAC_MAX) {
            int t = gr_state(b, m);
            gr_range(b, m, s, t, '0', '9', 0);
            s = t;
        }
    }
}

typedef struct bounds {
    double lo, hi;
    int lo_x, hi_x; /* exclusive */
} bounds;

static int get_bounds(const json_value *s, const char *path, bounds *bd, df_error *err)
{
    bd->lo = -(double)INT_CAP;
    bd->hi = (double)INT_CAP;
    bd->lo_x = bd->hi_x = 0;
    const char *keys[4] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        const json_value *v = json_get(s, keys[k]);
        if (!v) continue;
        char p[512];
        sub_path(p, sizeof p, path, keys[k]);
        if (v->type == JSON_BOOL && k >= 2) { /* draft-04 */
            if (k == 2) bd->lo_x = v->b;
            else bd->hi_x = v->b;
            continue;
        }
        if (v->type != JSON_NUMBER) return df_err_set(err, DF_ERR_ARG, v->pos, "%s: expected a number", p);
        double x = v->num;
        if (k == 0 || k == 2) {
            if (x > bd->lo || (x == bd->lo && k == 2)) {
                bd->lo = x;
                bd->lo_x = k == 2;
            }
        } else if (x < bd->hi || (x == bd->hi && k == 3)) {
            bd->hi = x;
            bd->hi_x = k == 3;
        }
    }
    if (bd->lo < -(double)INT_CAP) bd->lo = -(double)INT_CAP, bd->lo_x = 0;
    if (bd->hi > (double)INT_CAP) bd->hi = (double)INT_CAP, bd->hi_x = 0;
    return 0;
}

static int number_machine(js_compiler *c, const json_value *s, int integer, const char *path, df_error *err)
{
    bounds bd;
    if (get_bounds(s, path, &bd, err)) return -1;
    gr_builder *b = c->b;
    int m = gr_machine(b, path);
    int end = gr_state(b, m);
    gr_accept(b, m, end);
    /* integer literals */
    double klo = bd.lo_x && bd.lo == floor(bd.lo) ? bd.lo + 1 : ceil(bd.lo);
    double khi = bd.hi_x && bd.hi == floor(bd.hi) ? bd.hi - 1 : floor(bd.hi);
    int any = 0;
    if (klo <= khi) {
        int_range(b, m, 0, end, (int64_t)klo, (int64_t)khi);
        any = 1;
    }
    if (!integer) {
        /* i.f in (i, i+1): needs lo <= i and i + 1 <= hi */
        double plo = ceil(bd.lo) > 0 ? ceil(bd.lo) : 0, phi = floor(bd.hi) - 1;
        if (plo <= phi) {
            int s1 = gr_state(b, m);
            uint_range(b, m, 0, s1, (uint64_t)plo, (uint64_t)phi);
            fraction(b, m, s1, end);
            any = 1;
        }
        /* -i.f in (-(i+1), -i): needs lo <= -(i+1) and -i <= hi */
        double nlo = ceil(-bd.hi) > 0 ? ceil(-bd.hi) : 0, nhi = floor(-bd.lo) - 1;
        if (nlo <= nhi) {
            int s1 = gr_state(b, m), s2 = gr_state(b, m);
            gr_sym(b, m, 0, s1, '-', 0);
            uint_range(b, m, s1, s2, (uint64_t)nlo, (uint64_t)nhi);
            fraction(b, m, s2, end);
            any = 1;
        }
    }
    if (!any) {
        df_err_set(err, DF_ERR_ARG, s ? s->pos : -1, "%s: no %s satisfies the bounds", path,
                   integer ? "integer" : "number");
        return -1;
    }
    return m;
}

/* ---- strings ------------------------------------------------------------- */

static int get_count(const json_value *s, const char *key, const char *path, uint32_t *out, df_error *err)
{
    const json_value *v = json_get(s, key);
    if (!v) return 0;
    if (v->type != JSON_NUMBER || !v->is_int || v->i < 0)
        return df_err_set(err, DF_ERR_ARG, v->pos, "%s/%s: expected a non-negative integer", path, key);
    *out = v->i > (int64_t)GR_COUNT_INF - 2 ? GR_COUNT_INF - 2 : (uint32_t)v->i;
    return 0;
}

/* the characters of a string (no quotes), JSON-escaped or raw */
/* the string keywords of one schema node (or an allOf member of it) into
 * the lists: patterns (a format as its pattern), length bounds narrowed */
#define MAX_STR_PATS 16
typedef struct strspec {
    const char *pats[MAX_STR_PATS];
    size_t lens[MAX_STR_PATS];
    char where[MAX_STR_PATS][512];
    int n;
    uint32_t cmin, cmax;
} strspec;

static int string_keys(const json_value *s, const char *path, strspec *sp, int member, df_error *err)
{
    char p[512];
    if (member) { /* an allOf member: string keywords and annotations only */
        static const char *const ok[] = {"type", "minLength", "maxLength", "pattern", "format", NULL};
        for (size_t i = 0; i < s->len; i++)
            if (!in_list(s->keys[i], annotations) && !in_list(s->keys[i], ok)) {
                sub_path(p, sizeof p, path, s->keys[i]);
                return fail(err, s->items[i], "\"%s\" in an allOf of string schemas is not supported", s->keys[i], p);
            }
        const json_value *t = json_get(s, "type");
        if (t && !(t->type == JSON_STRING && !strcmp(t->str, "string"))) {
            sub_path(p, sizeof p, path, "type");
            return fail(err, t, "allOf mixing %s with other types is not supported", "string", p);
        }
    }
    uint32_t lo = 0, hi = GR_COUNT_INF;
    if (get_count(s, "minLength", path, &lo, err) || get_count(s, "maxLength", path, &hi, err)) return -1;
    if (lo > sp->cmin) sp->cmin = lo;
    if (hi < sp->cmax) sp->cmax = hi;
    static const char *const keys[2] = {"pattern", "format"};
    for (int k = 0; k < 2; k++) {
        const json_value *v = json_get(s, keys[k]);
        if (!v) continue;
        sub_path(p, sizeof p, path, keys[k]);
        if (v->type != JSON_STRING) return df_err_set(err, DF_ERR_ARG, v->pos, "%s: expected a string", p);
        const char *pat = k == 0 ? v->str : gr_format_pattern(v->str);
        if (!pat) return fail(err, v, "format \"%s\" is not supported (date, time, date-time, uuid, uri, email, "
                              "ipv4, hostname are)", v->str, p);
        if (sp->n == MAX_STR_PATS) return fail(err, v, "more than 16 %s in one string", "patterns and formats", p);
        sp->pats[sp->n] = pat;
        sp->lens[sp->n] = strlen(pat);
        snprintf(sp->where[sp->n], sizeof sp->where[0], "%s", p);
        sp->n++;
    }
    return 0;
}

/* the characters of a string (no quotes), JSON-escaped or raw: its own
 * keywords and those of an allOf of string schemas, every pattern and
 * format at once (their intersection) within the length bounds */
static int string_body(js_compiler *c, const json_value *s, int raw, const char *path, df_error *err)
{
    enum gr_str_mode mode = raw ? GR_STR_RAW : GR_STR_JSON;
    strspec sp = {.cmin = 0, .cmax = GR_COUNT_INF};
    if (s && string_keys(s, path, &sp, 0, err)) return -1;
    const json_value *all = s ? json_get(s, "allOf") : NULL;
    for (size_t i = 0; all && all->type == JSON_ARRAY && i < all->len; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/allOf/%zu", path, i);
        const json_value *x = all->items[i];
        if (x->type == JSON_BOOL && x->b) continue;
        if (x->type != JSON_OBJECT) return df_err_set(err, DF_ERR_ARG, x->pos, "%s: expected a schema object", p), -1;
        if (string_keys(x, p, &sp, 1, err)) return -1;
    }
    int plain = !sp.n && sp.cmin == 0 && sp.cmax == GR_COUNT_INF;
    if (plain && c->str_any[raw] >= 0) return c->str_any[raw];
    gr_builder *b = c->b;
    int m = gr_machine(b, plain ? (raw ? "raw string" : "string") : path);
    int end = gr_state(b, m);
    gr_accept(b, m, end);
    if (sp.n) {
        df_error e2 = {0};
        if (gr_patterns(b, m, 0, end, sp.pats, sp.lens, sp.n, mode, GR_INC, &sp.cmin, &sp.cmax, &e2)) {
            /* "pattern I of N: ..." names the operand: the place of the first is a fair pointer */
            df_err_set(err, e2.code, -1, "%s (at %s)", e2.msg, sp.n == 1 ? sp.where[0] : path);
            return -1;
        }
    } else {
        gr_cpset any;
        gr_cpset_init(&any);
        gr_cpset_all(&any);
        gr_chars(b, m, end, end, &any, mode, GR_INC);
        gr_cpset_free(&any);
        gr_eps(b, m, 0, end);
    }
    if (sp.cmin > sp.cmax) {
        df_err_set(err, DF_ERR_ARG, s ? s->pos : -1, "%s: minLength %u is above maxLength %u", path, sp.cmin, sp.cmax);
        return -1;
    }
    if (sp.cmin > 0 || sp.cmax != GR_COUNT_INF) gr_counter(b, m, sp.cmin, sp.cmax);
    if (plain) c->str_any[raw] = m;
    return m;
}

static int key_body(js_compiler *c)
{
    gr_builder *b = c->b;
    int m = gr_machine(b, "key");
    gr_cpset all;
    gr_cpset_init(&all);
    gr_cpset_all(&all);
    gr_chars(b, m, 0, 0, &all, GR_STR_JSON, GR_INC);
    gr_cpset_free(&all);
    gr_accept(b, m, 0);
    gr_counter(b, m, 0, JS_MAX_KEY);
    return m;
}

/* ---- values -------------------------------------------------------------- */

static int value(js_compiler *c, const json_value *s, unsigned tmask, int raw, const char *path, df_error *err);

static int literal_machine(js_compiler *c, const json_value *const *vals, size_t n, unsigned tmask, int raw,
                           const char *path, df_error *err)
{
    gr_builder *b = c->b;
    int m = gr_machine(b, path);
    int end = gr_state(b, m);
    gr_accept(b, m, end);
    int any = 0;
    json_buf jb;
    json_buf_init(&jb);
    for (size_t i = 0; i < n; i++) {
        const json_value *v = vals[i];
        if (!(value_type(v) & tmask)) continue;
        if (raw && v->type == JSON_STRING) {
            gr_lit(b, m, 0, end, v->str, v->len);
        } else {
            jb.len = 0;
            json_write_value(&jb, v, 0);
            gr_lit(b, m, 0, end, jb.p, jb.len);
        }
        any = 1;
    }
    json_buf_free(&jb);
    if (!any) {
        df_err_set(err, DF_ERR_ARG, -1, "%s: no enum/const value has an allowed type", path);
        return -1;
    }
    return m;
}

typedef struct prop {
    const char *key;
    const json_value *schema;
    int required;
} prop;

typedef struct props {
    prop *p;
    size_t n, cap;
    int closed;                   /* additionalProperties: false somewhere */
    const json_value *extra;      /* additionalProperties schema (no properties: a map) */
    int has_props;
} props;

static int collect_props(js_compiler *c, const json_value *s, const char *path, props *ps, int depth,
                         df_error *err)
{
    if (depth > 16) return df_err_set(err, DF_ERR_LIMIT, s->pos, "%s: allOf nested too deeply", path);
    if (s->type == JSON_BOOL) return 0;
    if (s->type != JSON_OBJECT) return df_err_set(err, DF_ERR_ARG, s->pos, "%s: expected a schema object", path);
    if (check_keys(s, path, err)) return -1;
    const json_value *ref = json_get(s, "$ref");
    if (ref) {
        const json_value *d;
        if (resolve(c, ref, path, &d, err)) return -1;
        char p[512];
        sub_path(p, sizeof p, path, "$ref");
        if (collect_props(c, d, p, ps, depth + 1, err)) return -1;
    }
    const json_value *pr = json_get(s, "properties"), *rq = json_get(s, "required"),
                     *ap = json_get(s, "additionalProperties"), *all = json_get(s, "allOf");
    if (pr) {
        if (pr->type != JSON_OBJECT) return df_err_set(err, DF_ERR_ARG, pr->pos, "%s/properties: expected an object", path);
        ps->has_props = 1;
        for (size_t i = 0; i < pr->len; i++) {
            size_t k = 0;
            while (k < ps->n && strcmp(ps->p[k].key, pr->keys[i])) k++;
            if (k < ps->n) {
                char p[512];
                snprintf(p, sizeof p, "%s/properties/%s", path, pr->keys[i]);
                return fail(err, pr->items[i], "property \"%s\" defined twice through allOf is not supported",
                            pr->keys[i], p);
            }
            if (ps->n == ps->cap) {
                ps->cap = ps->cap ? 2 * ps->cap : 8;
                ps->p = xrealloc(ps->p, ps->cap * sizeof *ps->p);
            }
            ps->p[ps->n++] = (prop){pr->keys[i], pr->items[i], 0};
        }
    }
    if (rq) {
        if (rq->type != JSON_ARRAY) return df_err_set(err, DF_ERR_ARG, rq->pos, "%s/required: expected an array", path);
        for (size_t i = 0; i < rq->len; i++) {
            if (rq->items[i]->type != JSON_STRING)
                return df_err_set(err, DF_ERR_ARG, rq->items[i]->pos, "%s/required: expected strings", path);
            size_t k = 0;
            while (k < ps->n && strcmp(ps->p[k].key, rq->items[i]->str)) k++;
            if (k == ps->n) {
                /* required but not described: any value (the schema allows it) */
                if (ps->n == ps->cap) {
                    ps->cap = ps->cap ? 2 * ps->cap : 8;
                    ps->p = xrealloc(ps->p, ps->cap * sizeof *ps->p);
                }
                ps->p[ps->n++] = (prop){rq->items[i]->str, NULL, 1};
                ps->has_props = 1;
            } else {
                ps->p[k].required = 1;
            }
        }
    }
    if (ap) {
        if (ap->type == JSON_BOOL && !ap->b) ps->closed = 1;
        else if (ap->type == JSON_OBJECT) ps->extra = ap;
        else if (ap->type != JSON_BOOL)
            return df_err_set(err, DF_ERR_ARG, ap->pos, "%s/additionalProperties: expected a boolean or a schema", path);
    }
    if (all) {
        if (all->type != JSON_ARRAY) return df_err_set(err, DF_ERR_ARG, all->pos, "%s/allOf: expected an array", path);
        for (size_t i = 0; i < all->len; i++) {
            const json_value *x = all->items[i];
            char p[512];
            snprintf(p, sizeof p, "%s/allOf/%zu", path, i);
            if (x->type == JSON_OBJECT && !(types_of(c, x, 0) & T_OBJECT))
                return fail(err, x, "%s of schemas other than objects is not supported", "allOf", p);
            if (collect_props(c, x, p, ps, depth + 1, err)) return -1;
        }
    }
    return 0;
}

/* a JSON key literal: "key" */
static int key_lit(js_compiler *c, int m, int from, const char *key)
{
    json_buf jb;
    json_buf_init(&jb);
    json_write_string(&jb, key, strlen(key));
    int t = gr_state(c->b, m);
    gr_lit(c->b, m, from, t, jb.p, jb.len);
    json_buf_free(&jb);
    return t;
}

static int object_machine(js_compiler *c, const json_value *s, const char *path, df_error *err)
{
    props ps = {0};
    if (s && collect_props(c, s, path, &ps, 0, err)) {
        free(ps.p);
        return -1;
    }
    gr_builder *b = c->b;
    int m = gr_machine(b, path);
    int open = ws(c, m, lit(c, m, 0, "{"));
    int end = gr_state(b, m);
    gr_accept(b, m, end);
    if (!ps.has_props) {
        if (ps.closed) { /* {} only */
            gr_lit(b, m, open, end, "}", 1);
            free(ps.p);
            return m;
        }
        /* a map: string keys (at most JS_MAX_KEY characters: a key that
         * never ends is no key), values of additionalProperties (any) */
        int key = c->key_body >= 0 ? c->key_body : (c->key_body = key_body(c));
        char p[512];
        sub_path(p, sizeof p, path, "additionalProperties");
        int val = value(c, ps.extra, T_ALL, 0, p, err);
        if (key < 0 || val < 0) {
            free(ps.p);
            return -1;
        }
        /* open (after "{"): "}" or a key; after a value: "}" or "," and a key (never ",}") */
        int key0 = gr_state(b, m), k0 = gr_state(b, m), k1 = gr_state(b, m), k2 = gr_state(b, m),
            after = gr_state(b, m);
        gr_eps(b, m, open, key0);
        gr_sym(b, m, key0, k0, '"', 0);
        gr_call(b, m, k0, k1, key, 0);
        gr_sym(b, m, k1, k2, '"', 0);
        int colon = ws(c, m, lit(c, m, ws(c, m, k2), ":"));
        gr_call(b, m, colon, after, val, 0);
        int a2 = ws(c, m, after);
        int comma = ws(c, m, lit(c, m, a2, ","));
        gr_eps(b, m, comma, key0);
        gr_sym(b, m, a2, end, '}', 0);
        gr_sym(b, m, open, end, '}', 0);
        free(ps.p);
        return m;
    }
    /* properties in order: first[i] = before property i, nothing written yet; rest[i]: something written */
    int n = (int)ps.n;
    int *first = xmalloc(((size_t)n + 1) * sizeof *first), *rest = xmalloc(((size_t)n + 1) * sizeof *rest);
    for (int i = 0; i <= n; i++) {
        first[i] = i == 0 ? open : gr_state(b, m);
        rest[i] = gr_state(b, m);
    }
    for (int i = 0; i < n; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/properties/%s", path, ps.p[i].key);
        int val = value(c, ps.p[i].schema, T_ALL, 0, p, err);
        if (val < 0) {
            free(first);
            free(rest);
            free(ps.p);
            return -1;
        }
        /* from first: "key": value ; from rest: , "key": value */
        int k = key_lit(c, m, first[i], ps.p[i].key);
        int colon = ws(c, m, lit(c, m, ws(c, m, k), ":"));
        gr_call(b, m, colon, rest[i + 1], val, 0);
        int comma = ws(c, m, lit(c, m, ws(c, m, rest[i]), ","));
        int k2 = key_lit(c, m, comma, ps.p[i].key);
        int colon2 = ws(c, m, lit(c, m, ws(c, m, k2), ":"));
        gr_call(b, m, colon2, rest[i + 1], val, 0);
        if (!ps.p[i].required) {
            gr_eps(b, m, first[i], first[i + 1]);
            gr_eps(b, m, rest[i], rest[i + 1]);
        }
    }
    gr_sym(b, m, first[n], end, '}', 0);
    gr_sym(b, m, ws(c, m, rest[n]), end, '}', 0);
    free(first);
    free(rest);
    free(ps.p);
    return m;
}

static int array_machine(js_compiler *c, const json_value *s, const char *path, df_error *err)
{
    uint32_t mn = 0, mx = GR_COUNT_INF;
    const json_value *items = s ? json_get(s, "items") : NULL;
    if (s && (get_count(s, "minItems", path, &mn, err) || get_count(s, "maxItems", path, &mx, err))) return -1;
    if (items && items->type == JSON_ARRAY) {
        char p[512];
        sub_path(p, sizeof p, path, "items");
        return fail(err, items, "%s as an array (tuple form) is not supported; use one schema", "items", p), -1;
    }
    char p[512];
    sub_path(p, sizeof p, path, "items");
    int val = value(c, items, T_ALL, 0, p, err);
    if (val < 0) return -1;
    gr_builder *b = c->b;
    int m = gr_machine(b, path);
    if (mn > 0 || mx != GR_COUNT_INF) gr_counter(b, m, mn, mx);
    int open = ws(c, m, lit(c, m, 0, "["));
    int end = gr_state(b, m), after = gr_state(b, m);
    gr_accept(b, m, end);
    gr_call(b, m, open, after, val, GR_INC);
    int a2 = ws(c, m, after);
    int comma = ws(c, m, lit(c, m, a2, ","));
    gr_call(b, m, comma, after, val, GR_INC);
    gr_sym(b, m, a2, end, ']', GR_NEEDMIN);
    gr_sym(b, m, open, end, ']', GR_NEEDMIN);
    return m;
}

static int alternatives(js_compiler *c, const int *ms, int n, const char *name)
{
    if (n == 1) return ms[0];
    int m = gr_machine(c->b, name);
    int end = gr_state(c->b, m);
    gr_accept(c->b, m, end);
    for (int i = 0; i < n; i++) gr_call(c->b, m, 0, end, ms[i], 0);
    return m;
}

static int typed(js_compiler *c, const json_value *s, unsigned t, int raw, const char *path, df_error *err)
{
    gr_builder *b = c->b;
    switch (t) {
    case T_STRING: {
        int body = string_body(c, s, raw, path, err);
        if (body < 0 || raw) return body;
        int m = gr_machine(b, path);
        int s1 = gr_state(b, m), s2 = gr_state(b, m), s3 = gr_state(b, m);
        gr_sym(b, m, 0, s1, '"', 0);
        gr_call(b, m, s1, s2, body, 0);
        gr_sym(b, m, s2, s3, '"', 0);
        gr_accept(b, m, s3);
        return m;
    }
    case T_NUMBER: return number_machine(c, s, 0, path, err);
    case T_INTEGER: return number_machine(c, s, 1, path, err);
    case T_BOOL: {
        int m = gr_machine(b, "boolean");
        int e = gr_state(b, m);
        gr_lit(b, m, 0, e, "true", 4);
        gr_lit(b, m, 0, e, "false", 5);
        gr_accept(b, m, e);
        return m;
    }
    case T_NULL: {
        int m = gr_machine(b, "null");
        int e = gr_state(b, m);
        gr_lit(b, m, 0, e, "null", 4);
        gr_accept(b, m, e);
        return m;
    }
    case T_OBJECT: return object_machine(c, s, path, err);
    case T_ARRAY: return array_machine(c, s, path, err);
    }
    return -1;
}

static int value(js_compiler *c, const json_value *s, unsigned tmask, int raw, const char *path, df_error *err)
{
    if (s && s->type == JSON_BOOL && !s->b)
        return df_err_set(err, DF_ERR_ARG, s->pos, "%s: the schema false allows no value", path), -1;
    if (s && s->type == JSON_BOOL) s = NULL;
    if (s && s->type != JSON_OBJECT)
        return df_err_set(err, DF_ERR_ARG, s->pos, "%s: expected a schema (an object or a boolean)", path), -1;
    if (s && !s->len) s = NULL;
    for (size_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].s == s && c->memo[i].tmask == tmask && c->memo[i].raw == raw) return c->memo[i].m;
    if (++c->depth > 64) {
        c->depth--;
        return df_err_set(err, DF_ERR_LIMIT, s ? s->pos : -1, "%s: the schema nests too deeply", path), -1;
    }
    int result = -1;
    if (s && check_keys(s, path, err)) goto out;
    const json_value *ref = s ? json_get(s, "$ref") : NULL;
    if (ref) {
        for (size_t i = 0; i < s->len; i++)
            if (!in_list(s->keys[i], annotations) && strcmp(s->keys[i], "$ref")) {
                char p[512];
                sub_path(p, sizeof p, path, s->keys[i]);
                fail(err, s->items[i], "\"%s\" beside $ref is not supported", s->keys[i], p);
                goto out;
            }
        const json_value *d;
        if (resolve(c, ref, path, &d, err)) goto out;
        /* a forward machine: the definition may refer back here */
        int fwd = gr_machine(c->b, "ref");
        int e = gr_state(c->b, fwd);
        gr_accept(c->b, fwd, e);
        if (c->n_memo == c->cap_memo) {
            c->cap_memo = c->cap_memo ? 2 * c->cap_memo : 32;
            c->memo = xrealloc(c->memo, c->cap_memo * sizeof *c->memo);
        }
        c->memo[c->n_memo++] = (memo){s, tmask, raw, fwd};
        char p[512];
        snprintf(p, sizeof p, "%s", ref->str);
        int inner = value(c, d, tmask, raw, p, err);
        if (inner < 0) goto out;
        gr_call(c->b, fwd, 0, e, inner, 0);
        c->depth--;
        return fwd;
    }
    /* memoize before building so that recursion through $ref meets it */
    unsigned types = types_of(c, s, 0) & tmask;
    const json_value *alt = s ? (json_get(s, "anyOf") ? json_get(s, "anyOf") : json_get(s, "oneOf")) : NULL;
    const char *altname = s && json_get(s, "anyOf") ? "anyOf" : "oneOf";
    if (s && json_get(s, "anyOf") && json_get(s, "oneOf")) {
        fail(err, json_get(s, "oneOf"), "%s together with anyOf is not supported", "oneOf", path);
        goto out;
    }
    if (alt) {
        if (alt->type != JSON_ARRAY || !alt->len) {
            df_err_set(err, DF_ERR_ARG, alt->pos, "%s/%s: expected a non-empty array", path, altname);
            goto out;
        }
        if (!is_annotation_only(s, altname)) {
            for (size_t i = 0; i < s->len; i++)
                if (!in_list(s->keys[i], annotations) && strcmp(s->keys[i], altname)) {
                    char p[512];
                    sub_path(p, sizeof p, path, s->keys[i]);
                    fail(err, s->items[i], "\"%s\" beside anyOf/oneOf is not supported (move it into each alternative)",
                         s->keys[i], p);
                    goto out;
                }
        }
        int *ms = xmalloc(alt->len * sizeof *ms);
        int n = 0;
        for (size_t i = 0; i < alt->len; i++) {
            char p[512];
            snprintf(p, sizeof p, "%s/%s/%zu", path, altname, i);
            if (!(types_of(c, alt->items[i], 0) & tmask)) continue;
            int x = value(c, alt->items[i], tmask, raw, p, err);
            if (x < 0) {
                free(ms);
                goto out;
            }
            ms[n++] = x;
        }
        if (!n) {
            free(ms);
            df_err_set(err, DF_ERR_ARG, alt->pos, "%s/%s: no alternative has an allowed type", path, altname);
            goto out;
        }
        result = alternatives(c, ms, n, altname);
        free(ms);
        goto out;
    }
    const json_value *en = s ? json_get(s, "enum") : NULL, *cn = s ? json_get(s, "const") : NULL;
    if (cn) {
        result = literal_machine(c, &cn, 1, types, raw, path, err);
        goto out;
    }
    if (en) {
        if (en->type != JSON_ARRAY || !en->len) {
            df_err_set(err, DF_ERR_ARG, en->pos, "%s/enum: expected a non-empty array", path);
            goto out;
        }
        result = literal_machine(c, (const json_value *const *)en->items, en->len, types, raw, path, err);
        goto out;
    }
    if (!types) {
        df_err_set(err, DF_ERR_ARG, s ? s->pos : -1, "%s: the schema allows no value of the types asked for", path);
        goto out;
    }
    if (s && json_get(s, "allOf") && (types & ~(unsigned)(T_OBJECT | T_STRING))) {
        char p[512];
        sub_path(p, sizeof p, path, "allOf");
        fail(err, json_get(s, "allOf"), "%s is supported for object and string schemas only (give this one a type)",
             "allOf", p);
        goto out;
    }
    {
        /* a free value may recur (arrays of any, maps of any): memoize a
         * forward machine first */
        int fwd = gr_machine(c->b, path);
        int e = gr_state(c->b, fwd);
        gr_accept(c->b, fwd, e);
        if (c->n_memo == c->cap_memo) {
            c->cap_memo = c->cap_memo ? 2 * c->cap_memo : 32;
            c->memo = xrealloc(c->memo, c->cap_memo * sizeof *c->memo);
        }
        size_t at = c->n_memo++;
        c->memo[at] = (memo){s, tmask, raw, fwd};
        int ms[7], n = 0;
        static const unsigned order[] = {T_OBJECT, T_ARRAY, T_STRING, T_INTEGER, T_NUMBER, T_BOOL, T_NULL};
        for (int i = 0; i < 7; i++) {
            unsigned t = order[i];
            if (!(types & t)) continue;
            if (t == T_INTEGER && (types & T_NUMBER)) continue; /* number covers integers */
            int x = typed(c, s, t, raw, path, err);
            if (x < 0) goto out;
            ms[n++] = x;
        }
        for (int i = 0; i < n; i++) gr_call(c->b, fwd, 0, e, ms[i], 0);
        c->depth--;
        return fwd;
    }
out:
    c->depth--;
    if (result >= 0) {
        if (c->n_memo == c->cap_memo) {
            c->cap_memo = c->cap_memo ? 2 * c->cap_memo : 32;
            c->memo = xrealloc(c->memo, c->cap_memo * sizeof *c->memo);
        }
        c->memo[c->n_memo++] = (memo){s, tmask, raw, result};
    }
    return result;
}

int js_value(js_compiler *c, const json_value *schema, const char *path, df_error *err)
{
    return value(c, schema, T_ALL, 0, path ? path : "", err);
}

/* ---- tool-call arguments ------------------------------------------------- */

void js_attr_escape(json_buf *jb, const char *s)
{
    for (; *s; s++) {
        if (*s == '&') json_buf_puts(jb, "&amp;");
        else if (*s == '"') json_buf_puts(jb, "&quot;");
        else json_buf_putc(jb, *s);
    }
}

/* one argument: <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>,
 * from -> to; key NULL: a free key */
static int argument(js_compiler *c, int m, int from, int to, const char *key, const json_value *schema,
                    const char *path, df_error *err)
{
    gr_builder *b = c->b;
    json_buf jb;
    json_buf_init(&jb);
    int s = gr_state(b, m);
    gr_sym(b, m, from, s, GR_SYM_OPEN, 0);
    int k;
    if (key) {
        json_buf_puts(&jb, "argument key=\"");
        js_attr_escape(&jb, key);
        json_buf_puts(&jb, "\" type=\"");
        k = gr_state(b, m);
        gr_lit(b, m, s, k, jb.p, jb.len);
    } else {
        int k0 = lit(c, m, s, "argument key=\"");
        int k1 = gr_state(b, m);
        gr_range(b, m, k0, k1, 'A', 'Z', 0);
        gr_range(b, m, k0, k1, 'a', 'z', 0);
        gr_sym(b, m, k0, k1, '_', 0);
        gr_range(b, m, k1, k1, 'A', 'Z', 0);
        gr_range(b, m, k1, k1, 'a', 'z', 0);
        gr_range(b, m, k1, k1, '0', '9', 0);
        gr_sym(b, m, k1, k1, '_', 0);
        gr_sym(b, m, k1, k1, '-', 0);
        gr_sym(b, m, k1, k1, '.', 0);
        k = lit(c, m, k1, "\" type=\"");
    }
    json_buf_free(&jb);
    unsigned t = types_of(c, schema, 0);
    static const struct { unsigned bit; const char *name; } tn[] = {
        {T_STRING, "string"}, {T_NUMBER | T_INTEGER, "number"}, {T_BOOL, "boolean"},
        {T_NULL, "null"},     {T_OBJECT, "object"},             {T_ARRAY, "array"}};
    int any = 0;
    for (size_t i = 0; i < sizeof tn / sizeof *tn; i++) {
        if (!(t & tn[i].bit)) continue;
        int v = value(c, schema, t & tn[i].bit, tn[i].bit == T_STRING, path, err);
        if (v < 0) return -1;
        char head[32];
        snprintf(head, sizeof head, "%s\"", tn[i].name);
        int h = lit(c, m, k, head);
        int h2 = gr_state(b, m);
        gr_sym(b, m, h, h2, GR_SYM_SEP, 0);
        int h3 = gr_state(b, m);
        gr_call(b, m, h2, h3, v, 0);
        int h4 = gr_state(b, m);
        gr_sym(b, m, h3, h4, GR_SYM_CLOSE, 0);
        int h5 = lit(c, m, h4, "argument");
        gr_sym(b, m, h5, to, GR_SYM_SEP, 0);
        any = 1;
    }
    if (!any) return df_err_set(err, DF_ERR_ARG, schema ? schema->pos : -1, "%s: the schema allows no value", path);
    return 0;
}

int js_arguments(js_compiler *c, const json_value *schema, const char *path, df_error *err)
{
    props ps = {0};
    if (schema && schema->type == JSON_OBJECT && schema->len) {
        unsigned t = types_of(c, schema, 0);
        if (!(t & T_OBJECT))
            return df_err_set(err, DF_ERR_ARG, schema->pos, "%s: tool parameters must be an object schema", path), -1;
        if (json_get(schema, "anyOf") || json_get(schema, "oneOf") || json_get(schema, "enum") ||
            json_get(schema, "const"))
            return fail(err, schema, "%s at the top of tool parameters is not supported (parameters are one object)",
                        json_get(schema, "anyOf") ? "anyOf" : json_get(schema, "oneOf") ? "oneOf" : "enum/const", path),
                   -1;
        if (collect_props(c, schema, path, &ps, 0, err)) {
            free(ps.p);
            return -1;
        }
    }
    gr_builder *b = c->b;
    int m = gr_machine(b, path);
    int n = (int)ps.n;
    int *st = xmalloc(((size_t)n + 1) * sizeof *st);
    st[0] = 0;
    for (int i = 1; i <= n; i++) st[i] = gr_state(b, m);
    gr_accept(b, m, st[n]);
    for (int i = 0; i < n; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/properties/%s", path, ps.p[i].key);
        if (argument(c, m, st[i], st[i + 1], ps.p[i].key, ps.p[i].schema, p, err)) {
            free(st);
            free(ps.p);
            return -1;
        }
        if (!ps.p[i].required) gr_eps(b, m, st[i], st[i + 1]);
    }
    if (!ps.has_props && !ps.closed) {
        char p[512];
        sub_path(p, sizeof p, path, "additionalProperties");
        /* free arguments: any number of named values */
        if (argument(c, m, st[n], st[n], NULL, ps.extra, p, err)) {
            free(st);
            free(ps.p);
            return -1;
        }
    }
    free(st);
    free(ps.p);
    return m;
}
