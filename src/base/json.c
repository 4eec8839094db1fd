/* json.c - recursive-descent JSON parser with an arena (see json.h).
 *
 * The cursor keeps the first error and its offset, so the grammar functions
 * read straight through and bail out with `if (p->err) return NULL`.
 * Containers are built in a temporary growable list and then copied into the
 * arena, so a document costs one arena plus transient lists.
 */
#include "json.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    unsigned char data[];
} arena_block;

struct json_doc {
    arena_block *blocks;
    json_value *root;
};

typedef struct {
    const char *s;
    size_t n, i;
    int depth;
    json_doc *doc;
    df_error *err;
    int failed;
} cursor;

static void *arena_alloc(json_doc *d, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    arena_block *b = d->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = xmalloc(sizeof *b + cap);
        b->cap = cap;
        b->used = 0;
        b->next = d->blocks;
        d->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

static void fail(cursor *p, const char *what)
{
    if (p->failed) return;
    p->failed = 1;
    df_err_set(p->err, DF_ERR_FORMAT, (int64_t)p->i, "JSON: %s at byte %zu", what, p->i);
}

static void skip_ws(cursor *p)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
        else break;
    }
}

static json_value *new_value(cursor *p, enum json_type t)
{
    json_value *v = arena_alloc(p->doc, sizeof *v);
    memset(v, 0, sizeof *v);
    v->type = t;
    v->pos = (int64_t)p->i;
    return v;
}

static int hex4(cursor *p, unsigned *out)
{
    if (p->n - p->i < 4) { fail(p, "truncated \\u escape"); return -1; }
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else { p->i--; fail(p, "bad hex digit in \\u escape"); return -1; }
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63)); return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63)); return 4;
}

static const char *parse_string_raw(cursor *p, size_t *out_len)
{
    /* p->s[p->i] == '"' */
    p->i++;
    size_t start = p->i, cap = 0;
    /* First pass: find the end and the decoded size bound. */
    size_t j = start;
    while (j < p->n && p->s[j] != '"') {
        if (p->s[j] == '\\') j++;
        j++;
    }
    if (j >= p->n) { fail(p, "unterminated string"); return NULL; }
    cap = j - start + 1;
    char *o = arena_alloc(p->doc, cap + 4);
    size_t k = 0;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') { p->i++; o[k] = 0; *out_len = k; return o; }
        if (c < 0x20) { fail(p, "control character in string"); return NULL; }
        if (c == '\\') {
            p->i++;
            if (p->i >= p->n) break;
            char e = p->s[p->i++];
            switch (e) {
            case '"': o[k++] = '"'; break;
            case '\\': o[k++] = '\\'; break;
            case '/': o[k++] = '/'; break;
            case 'b': o[k++] = '\b'; break;
            case 'f': o[k++] = '\f'; break;
            case 'n': o[k++] = '\n'; break;
            case 'r': o[k++] = '\r'; break;
            case 't': o[k++] = '\t'; break;
            case 'u': {
                unsigned cp;
                if (hex4(p, &cp)) return NULL;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                        fail(p, "unpaired surrogate in \\u escape");
                        return NULL;
                    }
                    p->i += 2;
                    if (hex4(p, &lo)) return NULL;
                    if (lo < 0xDC00 || lo > 0xDFFF) { fail(p, "bad low surrogate"); return NULL; }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    fail(p, "unpaired low surrogate");
                    return NULL;
                }
                k += put_utf8(o + k, cp);
                break;
            }
            default: p->i--; fail(p, "bad escape in string"); return NULL;
            }
            continue;
        }
        size_t l = utf8_char_len((const unsigned char *)p->s + p->i, p->n - p->i);
        if (!l) { fail(p, "invalid UTF-8 in string"); return NULL; }
        memcpy(o + k, p->s + p->i, l);
        k += l;
        p->i += l;
    }
    fail(p, "unterminated string");
    return NULL;
}

static json_value *parse_value(cursor *p);

/* The number grammar alone (no value, no allocation): advances p->i past
 * the literal; 0, or -1 after fail(). */
static int scan_number(cursor *p, int *is_int)
{
    *is_int = 1;
    if (p->i < p->n && p->s[p->i] == '-') p->i++;
    if (p->i >= p->n) { fail(p, "truncated number"); return -1; }
    if (p->s[p->i] == '0') p->i++;
    else if (p->s[p->i] >= '1' && p->s[p->i] <= '9') { while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++; }
    else { fail(p, "bad number"); return -1; }
    if (p->i < p->n && p->s[p->i] == '.') {
        *is_int = 0;
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') { fail(p, "bad fraction"); return -1; }
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        *is_int = 0;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') { fail(p, "bad exponent"); return -1; }
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    return 0;
}

static json_value *parse_number(cursor *p)
{
    json_value *v = new_value(p, JSON_NUMBER);
    size_t s = p->i;
    int is_int;
    if (scan_number(p, &is_int)) return NULL;
    char tmp[64];
    size_t len = p->i - s;
    if (len >= sizeof tmp) {
        /* Long literals: parse the double only. */
        char *big = xmalloc(len + 1);
        memcpy(big, p->s + s, len);
        big[len] = 0;
        v->num = strtod(big, NULL);
        free(big);
        if (isinf(v->num)) { fail(p, "number out of range (it overflows a double)"); return NULL; }
        return v;
    }
    memcpy(tmp, p->s + s, len);
    tmp[len] = 0;
    v->num = strtod(tmp, NULL);
    /* a literal past a double's range would come back as infinity, which
     * no JSON writer may spell: refused here, where the input is named */
    if (isinf(v->num)) { fail(p, "number out of range (it overflows a double)"); return NULL; }
    if (is_int) {
        /* exact int64 when it fits */
        int neg = tmp[0] == '-';
        uint64_t acc = 0;
        int ok = 1;
        for (const char *c = tmp + neg; *c; c++) {
            unsigned d = (unsigned)(*c - '0');
            if (acc > (UINT64_MAX - d) / 10) { ok = 0; break; }
            acc = acc * 10 + d;
        }
        if (ok && (neg ? acc <= (uint64_t)INT64_MAX + 1 : acc <= (uint64_t)INT64_MAX)) {
            v->is_int = 1;
            v->i = neg ? (int64_t)(0 - acc) : (int64_t)acc;
        }
    }
    return v;
}

typedef struct {
    json_value **items;
    const char **keys;
    size_t n, cap;
} list;

static void list_push(list *l, const char *key, json_value *v)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 8;
        l->items = xrealloc(l->items, l->cap * sizeof *l->items);
        l->keys = xrealloc(l->keys, l->cap * sizeof *l->keys);
    }
    l->items[l->n] = v;
    l->keys[l->n] = key;
    l->n++;
}

static void list_finish(cursor *p, list *l, json_value *v, int with_keys)
{
    v->len = l->n;
    v->items = arena_alloc(p->doc, (l->n ? l->n : 1) * sizeof *v->items);
    if (l->n) memcpy(v->items, l->items, l->n * sizeof *v->items);
    if (with_keys) {
        v->keys = arena_alloc(p->doc, (l->n ? l->n : 1) * sizeof *v->keys);
        if (l->n) memcpy(v->keys, l->keys, l->n * sizeof *v->keys);
    }
    free(l->items);
    free(l->keys);
}

/* Duplicate-key check: objects with many keys (safetensors headers hold
 * thousands) use a sort of key pointers, small ones a quadratic scan. */
static int cmp_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int has_duplicate_keys(list *l)
{
    if (l->n < 2) return 0;
    if (l->n <= 16) {
        for (size_t a = 0; a < l->n; a++)
            for (size_t b = a + 1; b < l->n; b++)
                if (!strcmp(l->keys[a], l->keys[b])) return 1;
        return 0;
    }
    const char **tmp = xmalloc(l->n * sizeof *tmp);
    memcpy(tmp, l->keys, l->n * sizeof *tmp);
    qsort(tmp, l->n, sizeof *tmp, cmp_key);
    int dup = 0;
    for (size_t a = 1; a < l->n && !dup; a++) dup = !strcmp(tmp[a - 1], tmp[a]);
    free(tmp);
    return dup;
}

static json_value *parse_container(cursor *p, int is_obj)
{
    json_value *v = new_value(p, is_obj ? JSON_OBJECT : JSON_ARRAY);
    if (++p->depth > JSON_MAX_DEPTH) { fail(p, "nesting too deep"); return NULL; }
    p->i++;
    list l = {0};
    skip_ws(p);
    char close = is_obj ? '}' : ']';
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        list_finish(p, &l, v, is_obj);
        p->depth--;
        return v;
    }
    for (;;) {
        skip_ws(p);
        const char *key = NULL;
        if (is_obj) {
            if (p->i >= p->n || p->s[p->i] != '"') { fail(p, "expected object key"); goto bad; }
            size_t kl;
            key = parse_string_raw(p, &kl);
            if (!key) goto bad;
            if (strlen(key) != kl) { fail(p, "NUL in object key"); goto bad; }
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') { fail(p, "expected ':'"); goto bad; }
            p->i++;
            skip_ws(p);
        }
        json_value *item = parse_value(p);
        if (!item) goto bad;
        list_push(&l, key, item);
        skip_ws(p);
        if (p->i >= p->n) { fail(p, "unterminated container"); goto bad; }
        if (p->s[p->i] == ',') { p->i++; continue; }
        if (p->s[p->i] == close) { p->i++; break; }
        fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        goto bad;
    }
    if (is_obj && has_duplicate_keys(&l)) {
        p->i = (size_t)v->pos;
        fail(p, "duplicate key in object");
        goto bad;
    }
    list_finish(p, &l, v, is_obj);
    p->depth--;
    return v;
bad:
    free(l.items);
    free(l.keys);
    return NULL;
}

static int match_lit(cursor *p, const char *lit)
{
    size_t n = strlen(lit);
    if (p->n - p->i < n || memcmp(p->s + p->i, lit, n) != 0) return 0;
    p->i += n;
    return 1;
}

static json_value *parse_value(cursor *p)
{
    skip_ws(p);
    if (p->i >= p->n) { fail(p, "unexpected end of input"); return NULL; }
    char c = p->s[p->i];
    if (c == '{') return parse_container(p, 1);
    if (c == '[') return parse_container(p, 0);
    if (c == '"') {
        json_value *v = new_value(p, JSON_STRING);
        v->str = parse_string_raw(p, &v->len);
        return v->str ? v : NULL;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
    json_value *v = new_value(p, JSON_NULL);
    if (match_lit(p, "null")) return v;
    if (match_lit(p, "true")) { v->type = JSON_BOOL; v->b = 1; return v; }
    if (match_lit(p, "false")) { v->type = JSON_BOOL; v->b = 0; return v; }
    fail(p, "unexpected character");
    return NULL;
}

json_doc *json_parse(const char *text, size_t len, df_error *err)
{
    json_doc *d = xcalloc(1, sizeof *d);
    cursor p = {.s = text, .n = len, .doc = d, .err = err};
    json_value *v = parse_value(&p);
    if (v) {
        skip_ws(&p);
        if (p.i != p.n) { fail(&p, "trailing characters after JSON value"); v = NULL; }
    }
    if (!v) {
        if (!p.failed) fail(&p, "invalid JSON");
        json_free(d);
        return NULL;
    }
    d->root = v;
    return d;
}

int json_scalar_type(const char *text, size_t len, enum json_type *type)
{
    cursor p = {.s = text, .n = len};
    int is_int;
    skip_ws(&p);
    if (p.i >= p.n) return -1;
    char c = p.s[p.i];
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (scan_number(&p, &is_int)) return -1;
        *type = JSON_NUMBER;
    } else if (match_lit(&p, "null")) {
        *type = JSON_NULL;
    } else if (match_lit(&p, "true") || match_lit(&p, "false")) {
        *type = JSON_BOOL;
    } else {
        return -1;
    }
    skip_ws(&p);
    return p.i == p.n ? 0 : -1;
}

void json_free(json_doc *doc)
{
    if (!doc) return;
    arena_block *b = doc->blocks;
    while (b) {
        arena_block *n = b->next;
        free(b);
        b = n;
    }
    free(doc);
}

const json_value *json_root(const json_doc *doc) { return doc->root; }

const json_value *json_get(const json_value *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (!strcmp(obj->keys[i], key)) return obj->items[i];
    return NULL;
}

const json_value *json_at(const json_value *arr, size_t i)
{
    if (!arr || (arr->type != JSON_ARRAY && arr->type != JSON_OBJECT) || i >= arr->len) return NULL;
    return arr->items[i];
}

int json_get_int(const json_value *obj, const char *key, int64_t *out)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER || !v->is_int) return -1;
    *out = v->i;
    return 0;
}

int json_get_num(const json_value *obj, const char *key, double *out)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER) return -1;
    *out = v->num;
    return 0;
}

int json_get_bool(const json_value *obj, const char *key, int *out)
{
    const json_value *v = json_get(obj, key);
    if (!v || v->type != JSON_BOOL) return -1;
    *out = v->b;
    return 0;
}

const char *json_get_str(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

const char *json_type_name(enum json_type t)
{
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "boolean";
    case JSON_NUMBER: return "number";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "array";
    case JSON_OBJECT: return "object";
    }
    return "?";
}
