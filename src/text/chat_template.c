/* chat_template.c - K3's XTML chat template and output parser (see
 * chat_template.h; spec section 10; reference: Deltafin's
 * native/deltafin/src/chat.rs, build_chat_segments).
 *
 * Rendering is one pass over the messages after a reordering pass (tool
 * results follow the order of the assistant's tool_calls ids).  Segments
 * point either at static spellings (markers, tag words, attribute keys) or
 * at copies in text blocks that never move, so a segment pointer stays valid
 * until chat_segments_free.
 * Where this file departs from chat.rs (all on input chat.rs would render
 * oddly or silently drop): non-object messages, unknown roles, image parts,
 * non-string text parts, unknown tool_choice / response_format values are
 * errors; an explicit null "reasoning" is absent (chat.rs would render the
 * text "None"); tool_choice naming a function renders as "required" (the
 * server's grammar holds the reply to that tool).
 *
 * The parser is a small state machine over ids.  Markers are special ids; a
 * tag's words and attributes are ordinary text between <|open|>/<|close|>
 * and <|sep|>, so that text is held in tagbuf until the <|sep|> decides:
 * a tag that fits the current state moves the state, anything else goes
 * out verbatim as text of the current state (reasoning, content, or the
 * argument value being collected).
 */
#include "chat_template.h"
#include "json_write.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SP_OPEN "<|open|>"
#define SP_CLOSE "<|close|>"
#define SP_SEP "<|sep|>"
#define SP_END "<|end_of_msg|>"

static const char EFFORT_FMT[] =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
    "channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=%s`.";
static const char TOOLS_HEAD[] = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
static const char NEW_TOOLS_HEAD[] =
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n"
    "```json\n";
static const char TOOLS_TAIL[] = "\n```";
static const char TOOL_CHOICE_REQUIRED[] =
    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
static const char TOOL_CHOICE_NONE[] =
    "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.";
static const char RF_JSON_OBJECT[] =
    "The system is invoked with `response_format=json_object`.\nYour response must be raw JSON data without "
    "markdown code blocks (```json) or any additional formatting.";
static const char RF_JSON_SCHEMA_HEAD[] =
    "The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data without "
    "markdown code blocks (```json) or any additional formatting.\nThe JSON data must match the following "
    "schema:\n```json\n";

/* ---- small helpers ------------------------------------------------------ */

/* Python str.isspace for one code point. */
static int py_space(unsigned cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

/* Decode the code point at s[0..n); *k = its byte length (1 for bad bytes). */
static unsigned utf8_at(const unsigned char *s, size_t n, size_t *k)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n) { *k = 1; return 0xfffd; }
    unsigned cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) { *k = 1; return 0xfffd; }
        cp = cp << 6 | (s[i] & 0x3f);
    }
    *k = len;
    return cp;
}

/* Python str.strip(): trims s[*b..*e) in place. */
static void py_strip(const char *s, size_t *b, size_t *e)
{
    const unsigned char *u = (const unsigned char *)s;
    while (*b < *e) {
        size_t k;
        if (!py_space(utf8_at(u + *b, *e - *b, &k))) break;
        *b += k;
    }
    while (*e > *b) {
        size_t st = *e - 1;
        while (st > *b && (u[st] & 0xc0) == 0x80 && *e - st < 4) st--;
        size_t k;
        unsigned cp = utf8_at(u + st, *e - st, &k);
        if (st + k != *e || !py_space(cp)) break;
        *e = st;
    }
}

static int is_blank(const char *s, size_t n)
{
    size_t b = 0, e = n;
    py_strip(s, &b, &e);
    return b == e;
}

/* Python truthiness of a JSON value (NULL = absent = false). */
static int truthy(const json_value *v)
{
    if (!v) return 0;
    switch (v->type) {
    case JSON_NULL: return 0;
    case JSON_BOOL: return v->b;
    case JSON_NUMBER: return v->is_int ? v->i != 0 : v->num != 0;
    case JSON_STRING:
    case JSON_ARRAY:
    case JSON_OBJECT: return v->len != 0;
    }
    return 0;
}

/* Python str() of a JSON value as chat.rs spells it: strings raw, None,
 * True/False, numbers, containers as spaced JSON. Appends to b. */
static void py_str(json_buf *b, const json_value *v)
{
    switch (v->type) {
    case JSON_STRING: json_buf_put(b, v->str, v->len); return;
    case JSON_NULL: json_buf_puts(b, "None"); return;
    case JSON_BOOL: json_buf_puts(b, v->b ? "True" : "False"); return;
    case JSON_NUMBER: json_write_number(b, v); return;
    case JSON_ARRAY:
    case JSON_OBJECT: json_write_value(b, v, JSON_WRITE_SPACED); return;
    }
}

static int str_is(const json_value *v, const char *s)
{
    return v && v->type == JSON_STRING && v->len == strlen(s) && !memcmp(v->str, s, v->len);
}

static int64_t pos_of(const json_value *v) { return v ? v->pos : -1; }

/* The function object of a tool call: call["function"] if present, else the
 * call itself (flat form); NULL when that is not an object. */
static const json_value *tool_function(const json_value *call)
{
    if (!call || call->type != JSON_OBJECT) return NULL;
    const json_value *f = json_get(call, "function");
    if (!f) return call;
    return f->type == JSON_OBJECT ? f : NULL;
}

/* Stable merge sort of indices with a comparator over a context. */
typedef int (*idx_cmp)(const void *ctx, size_t a, size_t b);

static void msort(size_t *a, size_t *tmp, size_t n, idx_cmp cmp, const void *ctx)
{
    if (n < 2) return;
    size_t h = n / 2;
    msort(a, tmp, h, cmp, ctx);
    msort(a + h, tmp, n - h, cmp, ctx);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp(ctx, a[j], a[i]) < 0 ? a[j++] : a[i++];
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

/* ---- segments ----------------------------------------------------------- */

struct chat_text_block {
    struct chat_text_block *next;
    size_t used, cap;
    char data[];
};

static void seg_push(chat_segments *s, const char *text, size_t len, int control)
{
    if (!len) return;
    if (s->n == s->cap_) {
        s->cap_ = s->cap_ ? 2 * s->cap_ : 64;
        s->seg = xrealloc(s->seg, s->cap_ * sizeof *s->seg);
    }
    s->seg[s->n++] = (chat_segment){text, len, control};
}

static void seg_copy(chat_segments *s, const char *text, size_t len)
{
    if (!len) return;
    struct chat_text_block *b = s->text_;
    if (!b || b->cap - b->used < len + 1) {
        size_t cap = len + 1 > 16384 ? len + 1 : 16384;
        b = xmalloc(sizeof *b + cap);
        b->cap = cap;
        b->used = 0;
        b->next = s->text_;
        s->text_ = b;
    }
    char *d = b->data + b->used;
    memcpy(d, text, len);
    d[len] = 0;
    b->used += len + 1;
    seg_push(s, d, len, 0);
}

#define CTL(s, sp) seg_push((s), sp, sizeof sp - 1, 1)
#define LIT(s, str) seg_push((s), str, strlen(str), 0) /* static text */

void chat_segments_free(chat_segments *s)
{
    if (!s) return;
    for (struct chat_text_block *b = s->text_, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(s->seg);
    free(s);
}

char *chat_segments_join(const chat_segments *s, size_t *len)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += s->seg[i].len;
    char *out = xmalloc(n + 1), *q = out;
    for (size_t i = 0; i < s->n; i++) {
        memcpy(q, s->seg[i].text, s->seg[i].len);
        q += s->seg[i].len;
    }
    *q = 0;
    if (len) *len = n;
    return out;
}

void chat_options_init(chat_options *o)
{
    memset(o, 0, sizeof *o);
    o->thinking = 1;
    o->thinking_effort = "max";
    o->add_generation_prompt = 1;
}

/* ---- rendering ---------------------------------------------------------- */

typedef struct rctx {
    chat_segments *s;
    df_error *err;
    json_buf tmp;
} rctx;

typedef struct attr {
    const char *key;  /* static, with its leading space: " role" */
    const char *val;
    size_t len;
} attr;

/* open(tag, attrs): values escaped & -> &amp; then " -> &quot;. */
static void open_tag(rctx *c, const char *tag, const attr *a, int n)
{
    CTL(c->s, SP_OPEN);
    LIT(c->s, tag);
    for (int i = 0; i < n; i++) {
        LIT(c->s, a[i].key);
        LIT(c->s, "=\"");
        c->tmp.len = 0;
        for (size_t k = 0; k < a[i].len; k++) {
            char ch = a[i].val[k];
            if (ch == '&') json_buf_puts(&c->tmp, "&amp;");
            else if (ch == '"') json_buf_puts(&c->tmp, "&quot;");
            else json_buf_putc(&c->tmp, ch);
        }
        seg_copy(c->s, c->tmp.p, c->tmp.len);
        LIT(c->s, "\"");
    }
    CTL(c->s, SP_SEP);
}

static void close_tag(rctx *c, const char *tag)
{
    CTL(c->s, SP_CLOSE);
    LIT(c->s, tag);
    CTL(c->s, SP_SEP);
}

static void end_msg(rctx *c) { CTL(c->s, SP_END); }

static void open_plain(rctx *c, const char *tag) { open_tag(c, tag, NULL, 0); }

static void sysmsg(rctx *c, const char *type, const char *body, size_t len)
{
    attr a[2] = {{" role", "system", 6}, {" type", type, strlen(type)}};
    open_tag(c, "message", a, 2);
    size_t b = 0, e = len;
    py_strip(body, &b, &e);
    seg_copy(c->s, body + b, e - b);
    close_tag(c, "message");
    end_msg(c);
}

/* tool-declare: the tools JSON key-sorted recursively and compact. */
static void tool_declare(rctx *c, const json_value *tools, int dynamic)
{
    json_buf body;
    json_buf_init(&body);
    json_buf_puts(&body, dynamic ? NEW_TOOLS_HEAD : TOOLS_HEAD);
    json_write_value(&body, tools, JSON_WRITE_SORTED);
    json_buf_puts(&body, TOOLS_TAIL);
    attr a[2] = {{" role", "system", 6}, {" type", "tool-declare", 12}};
    open_tag(c, "message", a, 2);
    seg_copy(c->s, body.p, body.len);
    close_tag(c, "message");
    end_msg(c);
    json_buf_free(&body);
}

static int render_content(rctx *c, const json_value *v, size_t im)
{
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type == JSON_STRING) {
        seg_copy(c->s, v->str, v->len);
        return 0;
    }
    if (v->type != JSON_ARRAY)
        return df_err_set(c->err, DF_ERR_ARG, v->pos,
                          "messages[%zu].content: expected a string, an array of parts or null, got %s", im,
                          json_type_name(v->type));
    for (size_t k = 0; k < v->len; k++) {
        const json_value *part = v->items[k];
        if (part->type != JSON_OBJECT)
            return df_err_set(c->err, DF_ERR_ARG, part->pos, "messages[%zu].content[%zu]: expected an object, got %s",
                              im, k, json_type_name(part->type));
        const json_value *type = json_get(part, "type");
        if (str_is(type, "image_url") || str_is(type, "image"))
            return df_err_set(c->err, DF_ERR_UNSUPPORTED, type->pos,
                              "messages[%zu].content[%zu].type: \"%s\" parts are not supported (this engine is "
                              "text-only)",
                              im, k, type->str);
        const json_value *text = json_get(part, "text");
        if (!text)
            return df_err_set(c->err, DF_ERR_ARG, part->pos, "messages[%zu].content[%zu].text: missing", im, k);
        if (text->type != JSON_STRING)
            return df_err_set(c->err, DF_ERR_ARG, text->pos,
                              "messages[%zu].content[%zu].text: expected a string, got %s", im, k,
                              json_type_name(text->type));
        seg_copy(c->s, text->str, text->len);
    }
    return 0;
}

/* open("message", role=ROLE[, name=NAME]) with a name only when truthy. */
static void open_message(rctx *c, const json_value *m, const char *role)
{
    attr a[2] = {{" role", role, strlen(role)}, {" name", NULL, 0}};
    const json_value *name = json_get(m, "name");
    json_buf nb;
    json_buf_init(&nb);
    int n = 1;
    if (truthy(name)) {
        py_str(&nb, name);
        a[1].val = nb.p, a[1].len = nb.len;
        n = 2;
    }
    open_tag(c, "message", a, n);
    json_buf_free(&nb);
}

static void render_args(rctx *c, const json_value *args)
{
    json_buf val;
    json_buf_init(&val);
    for (size_t i = 0; i < args->len; i++) {
        const json_value *v = args->items[i];
        const char *type = v->type == JSON_BOOL ? "boolean" : v->type == JSON_NULL ? "null"
                         : v->type == JSON_NUMBER ? "number" : v->type == JSON_STRING ? "string"
                         : v->type == JSON_OBJECT ? "object" : "array";
        attr a[2] = {{" key", args->keys[i], strlen(args->keys[i])}, {" type", type, strlen(type)}};
        open_tag(c, "argument", a, 2);
        if (v->type == JSON_STRING) {
            seg_copy(c->s, v->str, v->len);
        } else {
            val.len = 0;
            json_write_value(&val, v, JSON_WRITE_SPACED);
            seg_copy(c->s, val.p, val.len);
        }
        close_tag(c, "argument");
    }
    json_buf_free(&val);
}

static int render_call(rctx *c, const json_value *call, size_t im, size_t k)
{
    const json_value *f = tool_function(call);
    if (!f) {
        if (call->type == JSON_OBJECT)
            return df_err_set(c->err, DF_ERR_ARG, pos_of(json_get(call, "function")),
                              "messages[%zu].tool_calls[%zu].function: expected an object", im, k);
        return df_err_set(c->err, DF_ERR_ARG, call->pos, "messages[%zu].tool_calls[%zu]: expected an object, got %s",
                          im, k, json_type_name(call->type));
    }
    const char *fp = f == call ? "" : ".function";
    const json_value *name = json_get(f, "name");
    if (!name || name->type != JSON_STRING)
        return df_err_set(c->err, DF_ERR_ARG, name ? name->pos : f->pos,
                          "messages[%zu].tool_calls[%zu]%s.name: %s", im, k, fp,
                          name ? "expected a string" : "missing");
    const json_value *args = json_get(f, "arguments");
    json_doc *doc = NULL;
    const char *raw = NULL;
    size_t raw_len = 0;
    if (args && args->type == JSON_STRING) {
        if (is_blank(args->str, args->len)) {
            args = NULL;
        } else {
            df_error perr = {0};
            doc = json_parse(args->str, args->len, &perr);
            if (!doc) {
                raw = args->str, raw_len = args->len;
                args = NULL;
            } else if (json_root(doc)->type != JSON_OBJECT) {
                enum json_type t = json_root(doc)->type;
                json_free(doc);
                return df_err_set(c->err, DF_ERR_ARG, args->pos,
                                  "messages[%zu].tool_calls[%zu]%s.arguments: must encode a JSON object, not %s",
                                  im, k, fp, json_type_name(t));
            } else {
                args = json_root(doc);
            }
        }
    } else if (args && args->type == JSON_NULL) {
        args = NULL;
    } else if (args && args->type != JSON_OBJECT) {
        return df_err_set(c->err, DF_ERR_ARG, args->pos,
                          "messages[%zu].tool_calls[%zu]%s.arguments: expected a JSON string or object, got %s",
                          im, k, fp, json_type_name(args->type));
    }
    char idx[24];
    int nidx = snprintf(idx, sizeof idx, "%zu", k + 1);
    attr a[2] = {{" tool", name->str, name->len}, {" index", idx, (size_t)nidx}};
    open_tag(c, "call", a, 2);
    if (raw) {
        attr t = {" type", "object", 6};
        open_tag(c, "json", &t, 1);
        seg_copy(c->s, raw, raw_len);
        close_tag(c, "json");
    } else if (args) {
        render_args(c, args);
    }
    close_tag(c, "call");
    json_free(doc);
    return 0;
}

static int render_assistant(rctx *c, const json_value *m, size_t im, int thinking)
{
    open_message(c, m, "assistant");
    if (thinking) {
        const json_value *r = json_get(m, "reasoning_content");
        if (!truthy(r)) r = json_get(m, "reasoning");
        open_plain(c, "think");
        if (r && r->type != JSON_NULL) {
            c->tmp.len = 0;
            py_str(&c->tmp, r);
            if (!is_blank(c->tmp.p, c->tmp.len)) seg_copy(c->s, c->tmp.p, c->tmp.len);
        }
        close_tag(c, "think");
    }
    open_plain(c, "response");
    if (render_content(c, json_get(m, "content"), im)) return -1;
    close_tag(c, "response");
    const json_value *tc = json_get(m, "tool_calls");
    if (truthy(tc)) {
        if (tc->type != JSON_ARRAY)
            return df_err_set(c->err, DF_ERR_ARG, tc->pos, "messages[%zu].tool_calls: expected an array, got %s", im,
                              json_type_name(tc->type));
        open_plain(c, "tools");
        for (size_t k = 0; k < tc->len; k++)
            if (render_call(c, tc->items[k], im, k)) return -1;
        close_tag(c, "tools");
    }
    close_tag(c, "message");
    end_msg(c);
    return 0;
}

/* ---- tool results in call order ---------------------------------------- */

typedef struct rmsg {
    const json_value *m;
    size_t idx;                   /* index in the request */
    const json_value *tool_name;  /* the matched call's function name, or NULL */
} rmsg;

typedef struct call_id {
    size_t off, len;  /* python str of the id in keys */
    size_t pos;       /* 1-based position in tool_calls */
    const json_value *name;
} call_id;

typedef struct id_table {
    call_id *ids;
    size_t n;
    json_buf keys;
} id_table;

static int id_cmp(const void *ctx, size_t a, size_t b)
{
    const id_table *t = ctx;
    const call_id *x = &t->ids[a], *y = &t->ids[b];
    size_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(t->keys.p + x->off, t->keys.p + y->off, n);
    if (r) return r;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* The ids of an assistant's tool_calls, sorted (stable, so the first call
 * with a given id wins, as in chat.rs). */
static void id_table_build(id_table *t, const json_value *calls)
{
    t->n = 0;
    t->keys.len = 0;
    if (!truthy(calls) || calls->type != JSON_ARRAY) return;
    t->ids = xrealloc(t->ids, (calls->len ? calls->len : 1) * sizeof *t->ids);
    for (size_t k = 0; k < calls->len; k++) {
        const json_value *call = calls->items[k];
        if (call->type != JSON_OBJECT) continue;
        const json_value *id = json_get(call, "id");
        if (!id || id->type == JSON_NULL) continue;
        call_id *e = &t->ids[t->n++];
        e->off = t->keys.len;
        py_str(&t->keys, id);
        e->len = t->keys.len - e->off;
        e->pos = k + 1;
        const json_value *f = tool_function(call), *name = f ? json_get(f, "name") : NULL;
        e->name = name && name->type != JSON_NULL ? name : NULL;
    }
    size_t *ord = xmalloc((2 * t->n + 1) * sizeof *ord);
    for (size_t i = 0; i < t->n; i++) ord[i] = i;
    msort(ord, ord + t->n, t->n, id_cmp, t);
    call_id *sorted = xmalloc((t->n + 1) * sizeof *sorted);
    for (size_t i = 0; i < t->n; i++) sorted[i] = t->ids[ord[i]];
    free(t->ids);
    t->ids = sorted;
    free(ord);
}

/* The first call whose id spells s[0..n), or NULL. */
static const call_id *id_table_find(const id_table *t, const char *s, size_t n)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const call_id *e = &t->ids[mid];
        size_t m = e->len < n ? e->len : n;
        int r = memcmp(t->keys.p + e->off, s, m);
        if (!r) r = e->len < n ? -1 : e->len > n;
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < t->n && t->ids[lo].len == n && !memcmp(t->keys.p + t->ids[lo].off, s, n)) return &t->ids[lo];
    return NULL;
}

typedef struct run_item {
    size_t pos, offset;
} run_item;

static int run_cmp(const void *ctx, size_t a, size_t b)
{
    const run_item *r = ctx;
    if (r[a].pos != r[b].pos) return r[a].pos < r[b].pos ? -1 : 1;
    return r[a].offset < r[b].offset ? -1 : r[a].offset > r[b].offset;
}

/* Build the render order: each run of consecutive tool messages whose ids
 * all match the last assistant's tool_calls is sorted by call position and
 * takes the call's tool name; a run with any unmatched id stays as sent. */
static void order_messages(const json_value *msgs, rmsg *out)
{
    id_table t = {0};
    json_buf key;
    json_buf_init(&key);
    size_t n = msgs->len, o = 0, i = 0;
    while (i < n) {
        const json_value *m = msgs->items[i];
        const json_value *role = json_get(m, "role");
        if (str_is(role, "assistant")) id_table_build(&t, json_get(m, "tool_calls"));
        if (!str_is(role, "tool")) {
            out[o++] = (rmsg){m, i, NULL};
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && str_is(json_get(msgs->items[j], "role"), "tool")) j++;
        size_t rn = j - i;
        run_item *items = xmalloc(rn * sizeof *items);
        const json_value **names = xmalloc(rn * sizeof *names);
        int unresolved = 0;
        for (size_t r = 0; r < rn; r++) {
            const json_value *tm = msgs->items[i + r];
            const json_value *id = json_get(tm, "tool_call_id");
            if (!id) id = json_get(tm, "id");
            const call_id *hit = NULL;
            if (id && id->type != JSON_NULL) {
                key.len = 0;
                py_str(&key, id);
                hit = id_table_find(&t, key.p, key.len);
            }
            if (!hit) unresolved = 1;
            items[r] = (run_item){hit ? hit->pos : 0, r};
            names[r] = hit ? hit->name : NULL;
        }
        size_t *ord = xmalloc(2 * rn * sizeof *ord);
        for (size_t r = 0; r < rn; r++) ord[r] = r;
        if (!unresolved) msort(ord, ord + rn, rn, run_cmp, items);
        for (size_t r = 0; r < rn; r++)
            out[o++] = (rmsg){msgs->items[i + ord[r]], i + ord[r], unresolved ? NULL : names[ord[r]]};
        free(ord);
        free(names);
        free(items);
        i = j;
    }
    free(t.ids);
    json_buf_free(&t.keys);
    json_buf_free(&key);
}

static int render_tool(rctx *c, const rmsg *r, size_t tool_index, const json_value *prev_calls)
{
    const json_value *m = r->m;
    json_buf name;
    json_buf_init(&name);
    if (r->tool_name) {
        py_str(&name, r->tool_name);
    } else {
        const json_value *v = json_get(m, "tool");
        if (!v) v = json_get(m, "name");
        if (v && v->type == JSON_STRING) {
            json_buf_put(&name, v->str, v->len);
        } else {
            const json_value *call = prev_calls && prev_calls->type == JSON_ARRAY && tool_index <= prev_calls->len
                                         ? prev_calls->items[tool_index - 1] : NULL;
            const json_value *f = tool_function(call), *fn = f ? json_get(f, "name") : NULL;
            if (!fn || fn->type != JSON_STRING) {
                json_buf_free(&name);
                return df_err_set(c->err, DF_ERR_ARG, m->pos,
                                  "messages[%zu]: a tool message needs a tool name: give \"tool\" or \"name\", "
                                  "or a tool_call_id / position matching the assistant's tool_calls",
                                  r->idx);
            }
            json_buf_put(&name, fn->str, fn->len);
        }
    }
    char idx[24];
    int nidx = snprintf(idx, sizeof idx, "%zu", tool_index);
    attr a[3] = {{" role", "tool", 4}, {" tool", name.p ? name.p : "", name.len}, {" index", idx, (size_t)nidx}};
    open_tag(c, "message", a, 3);
    json_buf_free(&name);
    if (render_content(c, json_get(m, "content"), r->idx)) return -1;
    close_tag(c, "message");
    end_msg(c);
    return 0;
}

/* {"type": "function", "function": {"name": N}}: K3's template has no
 * named form; it renders as "required" and the caller's grammar holds the
 * reply to that tool (json_schema.h) */
static int named_choice(const json_value *tc)
{
    const json_value *fn = tc && tc->type == JSON_OBJECT ? json_get(tc, "function") : NULL;
    return fn && str_is(json_get(tc, "type"), "function") && json_get_str(fn, "name");
}

static int check_options(const chat_options *o, df_error *err)
{
    if (o->thinking && o->thinking_effort && strcmp(o->thinking_effort, "low") &&
        strcmp(o->thinking_effort, "high") && strcmp(o->thinking_effort, "max"))
        return df_err_set(err, DF_ERR_ARG, -1,
                          "thinking_effort: unsupported value \"%s\"; supported values are low, high and max",
                          o->thinking_effort);
    const json_value *tc = o->tool_choice;
    if (tc && tc->type != JSON_NULL && !str_is(tc, "auto") && !str_is(tc, "none") && !str_is(tc, "required") &&
        !named_choice(tc)) {
        if (tc->type == JSON_OBJECT)
            return df_err_set(err, DF_ERR_ARG, tc->pos,
                              "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
        return df_err_set(err, DF_ERR_ARG, tc->pos,
                          "tool_choice: expected \"auto\", \"none\" or \"required\"");
    }
    const json_value *rf = o->response_format;
    if (rf && rf->type != JSON_NULL) {
        const json_value *type = rf->type == JSON_OBJECT ? json_get(rf, "type") : rf;
        if (!str_is(type, "text") && !str_is(type, "json_object") && !str_is(type, "json_schema"))
            return df_err_set(err, DF_ERR_ARG, type ? type->pos : rf->pos,
                              "response_format.type: expected \"text\", \"json_object\" or \"json_schema\"");
    }
    return 0;
}

static int check_messages(const json_value *msgs, df_error *err)
{
    if (!msgs || msgs->type != JSON_ARRAY)
        return df_err_set(err, DF_ERR_ARG, pos_of(msgs), "messages: expected an array, got %s",
                          msgs ? json_type_name(msgs->type) : "nothing");
    for (size_t i = 0; i < msgs->len; i++) {
        const json_value *m = msgs->items[i];
        if (m->type != JSON_OBJECT)
            return df_err_set(err, DF_ERR_ARG, m->pos, "messages[%zu]: expected an object, got %s", i,
                              json_type_name(m->type));
        const json_value *role = json_get(m, "role");
        if (!role) return df_err_set(err, DF_ERR_ARG, m->pos, "messages[%zu].role: missing", i);
        if (role->type != JSON_STRING)
            return df_err_set(err, DF_ERR_ARG, role->pos, "messages[%zu].role: expected a string, got %s", i,
                              json_type_name(role->type));
        if (!str_is(role, "system") && !str_is(role, "developer") && !str_is(role, "user") &&
            !str_is(role, "assistant") && !str_is(role, "tool"))
            return df_err_set(err, DF_ERR_ARG, role->pos,
                              "messages[%zu].role: unknown role \"%.64s\" (expected system, developer, user, "
                              "assistant or tool)",
                              i, role->str);
    }
    return 0;
}

static void render_response_format(rctx *c, const json_value *rf)
{
    if (!rf || rf->type == JSON_NULL) return;
    const json_value *type = rf->type == JSON_OBJECT ? json_get(rf, "type") : rf;
    if (str_is(type, "json_object")) {
        sysmsg(c, "response-format", RF_JSON_OBJECT, sizeof RF_JSON_OBJECT - 1);
    } else if (str_is(type, "json_schema")) {
        /* the schema: json_schema.schema, else json_schema.json_schema, else
         * json_schema itself; null when absent (chat.rs). */
        const json_value *js = rf->type == JSON_OBJECT ? json_get(rf, "json_schema") : NULL, *schema = js;
        if (js && js->type == JSON_OBJECT) {
            schema = json_get(js, "schema");
            if (!schema) schema = json_get(js, "json_schema");
            if (!schema) schema = js;
        }
        json_buf body;
        json_buf_init(&body);
        json_buf_puts(&body, RF_JSON_SCHEMA_HEAD);
        if (schema) json_write_value(&body, schema, JSON_WRITE_SORTED);
        else json_buf_puts(&body, "null");
        json_buf_puts(&body, TOOLS_TAIL);
        sysmsg(c, "response-format", body.p, body.len);
        json_buf_free(&body);
    }
}

int chat_render(const json_value *messages, const chat_options *opt, chat_segments **out, df_error *err)
{
    *out = NULL;
    if (check_messages(messages, err) || check_options(opt, err)) return -1;
    rctx c = {xcalloc(1, sizeof(chat_segments)), err, {0}};
    size_t n = messages->len;
    rmsg *order = xmalloc((n ? n : 1) * sizeof *order);
    order_messages(messages, order);

    if (truthy(opt->tools)) tool_declare(&c, opt->tools, 0);
    if (opt->thinking && opt->thinking_effort) {
        char body[sizeof EFFORT_FMT + 8];
        int len = snprintf(body, sizeof body, EFFORT_FMT, opt->thinking_effort);
        sysmsg(&c, "thinking-effort", body, (size_t)len);
    }
    const json_value *prev_calls = NULL;
    size_t tool_index = 0;
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        const json_value *m = order[k].m, *role = json_get(m, "role");
        size_t im = order[k].idx;
        if (str_is(role, "user")) {
            open_message(&c, m, "user");
            rc = render_content(&c, json_get(m, "content"), im);
            close_tag(&c, "message");
            end_msg(&c);
        } else if (str_is(role, "system") || str_is(role, "developer")) {
            /* OpenAI's "developer" role is its newer name for system instructions */
            const json_value *tools = json_get(m, "tools");
            if (truthy(tools)) {
                tool_declare(&c, tools, 1);
                continue;
            }
            open_message(&c, m, "system");
            rc = render_content(&c, json_get(m, "content"), im);
            close_tag(&c, "message");
            end_msg(&c);
        } else if (str_is(role, "assistant")) {
            prev_calls = json_get(m, "tool_calls");
            tool_index = 0;
            rc = render_assistant(&c, m, im, opt->thinking);
        } else {
            rc = render_tool(&c, &order[k], ++tool_index, prev_calls);
        }
    }
    if (!rc) {
        if (str_is(opt->tool_choice, "required") || named_choice(opt->tool_choice))
            sysmsg(&c, "tool-choice", TOOL_CHOICE_REQUIRED, sizeof TOOL_CHOICE_REQUIRED - 1);
        else if (str_is(opt->tool_choice, "none"))
            sysmsg(&c, "tool-choice", TOOL_CHOICE_NONE, sizeof TOOL_CHOICE_NONE - 1);
        render_response_format(&c, opt->response_format);
        if (opt->add_generation_prompt) {
            attr a = {" role", "assistant", 9};
            open_tag(&c, "message", &a, 1);
            open_plain(&c, opt->thinking ? "think" : "response");
        }
    }
    free(order);
    json_buf_free(&c.tmp);
    if (rc) {
        chat_segments_free(c.s);
        return -1;
    }
    *out = c.s;
    return 0;
}

int chat_encode(const tokenizer *t, const chat_segments *s, int32_t **ids, size_t *n, size_t *cap, df_error *err)
{
    for (size_t i = 0; i < s->n; i++) {
        const chat_segment *g = &s->seg[i];
        if (!g->control) {
            if (tokenizer_encode(t, g->text, g->len, 0, ids, n, cap, err)) return -1;
            continue;
        }
        int32_t id = tokenizer_special_id(t, g->text);
        if (id < 0)
            return df_err_set(err, DF_ERR_FORMAT, -1, "chat template: the tokenizer has no special token %s",
                              g->text);
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 256;
            *ids = xrealloc(*ids, *cap * sizeof **ids);
        }
        (*ids)[(*n)++] = id;
    }
    return 0;
}

/* ---- arguments back to JSON --------------------------------------------- */

static const char *const ARG_TYPE_NAMES[] = {"string", "number", "boolean", "null", "object", "array"};

const char *chat_arg_type_name(enum chat_arg_type t)
{
    return (unsigned)t < sizeof ARG_TYPE_NAMES / sizeof *ARG_TYPE_NAMES ? ARG_TYPE_NAMES[t] : "string";
}

static enum chat_arg_type arg_type_of(const char *s, size_t n)
{
    for (int t = 0; t < (int)(sizeof ARG_TYPE_NAMES / sizeof *ARG_TYPE_NAMES); t++)
        if (strlen(ARG_TYPE_NAMES[t]) == n && !memcmp(ARG_TYPE_NAMES[t], s, n)) return (enum chat_arg_type)t;
    return CHAT_ARG_STRING;
}

static void arg_value_json(json_buf *b, enum chat_arg_type type, const char *v, size_t n)
{
    if (type != CHAT_ARG_STRING) {
        size_t lo = 0, hi = n;
        py_strip(v, &lo, &hi);
        static const enum json_type want[] = {JSON_STRING, JSON_NUMBER, JSON_BOOL, JSON_NULL, JSON_OBJECT, JSON_ARRAY};
        int ok;
        if (type == CHAT_ARG_OBJECT || type == CHAT_ARG_ARRAY) {
            df_error e = {0};
            json_doc *d = json_parse(v + lo, hi - lo, &e);
            ok = d && json_root(d)->type == want[type];
            json_free(d);
        } else { /* scalars: checked without building a tree (no allocation) */
            enum json_type jt;
            ok = json_scalar_type(v + lo, hi - lo, &jt) == 0 && jt == want[type];
        }
        if (ok) {
            json_buf_put(b, v + lo, hi - lo);
            return;
        }
    }
    json_write_string(b, v, n);
}

static void args_json(json_buf *b, const chat_arg *args, size_t n)
{
    json_buf_putc(b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i) json_buf_putc(b, ',');
        json_write_string(b, args[i].key, args[i].key_len);
        json_buf_putc(b, ':');
        arg_value_json(b, args[i].type, args[i].value, args[i].value_len);
    }
    json_buf_putc(b, '}');
}

char *chat_args_to_json(const chat_arg *args, size_t n, size_t *len)
{
    json_buf b;
    json_buf_init(&b);
    args_json(&b, args, n);
    if (len) *len = b.len;
    return b.p;
}

/* ---- output parser ------------------------------------------------------- */

enum pstate {
    P_THINK,           /* inside <think>: text is reasoning */
    P_AFTER_THINK,     /* message level, think closed */
    P_RESPONSE,        /* inside <response>: text is content */
    P_AFTER_RESPONSE,  /* message level, response (or tools) closed */
    P_TOOLS,           /* inside <tools>, between calls */
    P_CALL,            /* inside <call>, between arguments */
    P_ARG,             /* inside <argument>: text is the value */
    P_JSON,            /* inside <json>: text is the raw block */
    P_AFTER_MESSAGE,   /* message closed, waiting for <|end_of_msg|> */
    P_DONE,
};

enum { TAG_NONE, TAG_OPEN, TAG_CLOSE };

/* A tag longer than this is not one: the template's longest is a call or
 * argument with its name/key, which are identifiers in practice. */
#define TAG_MAX 4096
#define MAX_ATTRS 8

typedef struct ev_rec {
    enum chat_event_type type;
    size_t toff, tlen, noff, nlen; /* into out; noff = SIZE_MAX: no name */
    enum chat_arg_type arg_type;
    int index;
} ev_rec;

typedef struct arg_rec {
    size_t koff, klen, voff, vlen;
    enum chat_arg_type type;
} arg_rec;

struct chat_parser {
    const tokenizer *t;
    int32_t id_open, id_close, id_sep, id_end;
    int n_vocab;
    tok_decoder dec;
    enum pstate st;
    int tag;              /* TAG_* while between a marker and <|sep|> */
    json_buf tagbuf;      /* the tag's text so far */
    int n_calls;          /* calls begun in this message */
    json_buf call_name;
    json_buf arg_key, arg_val;
    enum chat_arg_type arg_type;
    json_buf json_block;  /* the open or last JSON block of the call */
    int has_json;
    json_buf args_text;   /* finished arguments of the open call */
    arg_rec *args;
    size_t n_args, cap_args;
    json_buf out;         /* texts of this feed's events */
    ev_rec *recs;
    size_t n_recs, cap_recs;
    chat_event *evs;
    size_t cap_evs;
    char *dbuf;           /* decoder output, tok_decoder_max_out bytes */
    size_t dcap;
    chat_arg *call_args;  /* end_call's view of args, cap_args + 1 entries */
    json_buf call_json;   /* end_call's arguments JSON */
};

static void emit(chat_parser *p, enum chat_event_type type, const char *text, size_t tlen, const char *name,
                 size_t nlen, enum chat_arg_type at, int index)
{
    int is_text = type == CHAT_EV_REASONING || type == CHAT_EV_CONTENT;
    if (is_text && !tlen) return;
    if (is_text && p->n_recs) {
        ev_rec *last = &p->recs[p->n_recs - 1];
        if (last->type == type && last->toff + last->tlen + 1 == p->out.len) {
            p->out.len--;
            json_buf_put(&p->out, text, tlen);
            json_buf_putc(&p->out, 0);
            last->tlen += tlen;
            return;
        }
    }
    if (p->n_recs == p->cap_recs) {
        p->cap_recs = p->cap_recs ? 2 * p->cap_recs : 16;
        p->recs = xrealloc(p->recs, p->cap_recs * sizeof *p->recs);
    }
    ev_rec *r = &p->recs[p->n_recs++];
    r->type = type;
    r->arg_type = at;
    r->index = index;
    r->noff = SIZE_MAX;
    r->nlen = 0;
    if (name) {
        r->noff = p->out.len;
        r->nlen = nlen;
        json_buf_put(&p->out, name, nlen);
        json_buf_putc(&p->out, 0);
    }
    r->toff = p->out.len;
    r->tlen = tlen;
    json_buf_put(&p->out, text, tlen);
    json_buf_putc(&p->out, 0);
}

/* Text belonging to the current state (never tag text). */
static void sink(chat_parser *p, const char *s, size_t n)
{
    if (!n) return;
    switch (p->st) {
    case P_THINK: emit(p, CHAT_EV_REASONING, s, n, NULL, 0, CHAT_ARG_STRING, 0); return;
    case P_ARG: json_buf_put(&p->arg_val, s, n); return;
    case P_JSON: json_buf_put(&p->json_block, s, n); return;
    case P_DONE: return;
    default: emit(p, CHAT_EV_CONTENT, s, n, NULL, 0, CHAT_ARG_STRING, 0); return;
    }
}

static void sink_str(chat_parser *p, const char *s) { sink(p, s, strlen(s)); }

static void degrade_tag(chat_parser *p)
{
    int tag = p->tag;
    p->tag = TAG_NONE;
    sink_str(p, tag == TAG_OPEN ? SP_OPEN : SP_CLOSE);
    sink(p, p->tagbuf.p, p->tagbuf.len);
    p->tagbuf.len = 0;
}

/* Ordinary decoded text: tag text while a tag is open, else the state's. */
static void text_in(chat_parser *p, const char *s, size_t n)
{
    if (!n) return;
    if (p->tag == TAG_NONE) {
        sink(p, s, n);
        return;
    }
    json_buf_put(&p->tagbuf, s, n);
    if (p->tagbuf.len > TAG_MAX) degrade_tag(p);
}

static void grow_args(chat_parser *p, size_t cap)
{
    p->cap_args = cap;
    p->args = xrealloc(p->args, cap * sizeof *p->args);
    p->call_args = xrealloc(p->call_args, (cap + 1) * sizeof *p->call_args);
}

static void end_arg(chat_parser *p)
{
    if (p->n_args == p->cap_args) grow_args(p, p->cap_args ? 2 * p->cap_args : 8);
    arg_rec *a = &p->args[p->n_args++];
    a->type = p->arg_type;
    a->koff = p->args_text.len;
    a->klen = p->arg_key.len;
    json_buf_put(&p->args_text, p->arg_key.p, p->arg_key.len);
    a->voff = p->args_text.len;
    a->vlen = p->arg_val.len;
    json_buf_put(&p->args_text, p->arg_val.p, p->arg_val.len);
    emit(p, CHAT_EV_CALL_ARG, p->arg_val.p ? p->arg_val.p : "", p->arg_val.len, p->arg_key.p ? p->arg_key.p : "",
         p->arg_key.len, p->arg_type, p->n_calls - 1);
    p->arg_key.len = p->arg_val.len = 0;
    p->st = P_CALL;
}

static void end_json(chat_parser *p)
{
    emit(p, CHAT_EV_CALL_JSON, p->json_block.p ? p->json_block.p : "", p->json_block.len, NULL, 0, CHAT_ARG_STRING,
         p->n_calls - 1);
    p->has_json = 1;
    p->st = P_CALL;
}

static void end_call(chat_parser *p)
{
    json_buf *a = &p->call_json;
    a->len = 0;
    if (p->has_json && !p->n_args) {
        json_buf_put(a, p->json_block.p ? p->json_block.p : "", p->json_block.len);
    } else {
        chat_arg *args = p->call_args;
        for (size_t i = 0; i < p->n_args; i++) {
            const arg_rec *r = &p->args[i];
            args[i] = (chat_arg){p->args_text.p + r->koff, r->klen, r->type, p->args_text.p + r->voff, r->vlen};
        }
        args_json(a, args, p->n_args);
    }
    emit(p, CHAT_EV_CALL_END, a->p ? a->p : "", a->len, p->call_name.p ? p->call_name.p : "", p->call_name.len,
         CHAT_ARG_STRING, p->n_calls - 1);
    p->n_args = 0;
    p->args_text.len = 0;
    p->json_block.len = 0;
    p->has_json = 0;
    p->call_name.len = 0;
    p->st = P_TOOLS;
}

/* Close whatever call structure is open (end of message or of stream). */
static void finalize(chat_parser *p)
{
    if (p->tag != TAG_NONE) degrade_tag(p);
    if (p->st == P_ARG) end_arg(p);
    if (p->st == P_JSON) end_json(p);
    if (p->st == P_CALL) end_call(p);
}

typedef struct tag_attr {
    const char *k, *v;
    size_t kl, vl;
} tag_attr;

/* name( key="value")*; returns -1 when the text is not of that shape. */
static int parse_tag(const char *s, size_t n, size_t *name_len, tag_attr *at, int *n_at)
{
    size_t i = 0;
    while (i < n && s[i] != ' ' && s[i] != '"' && s[i] != '=') i++;
    if (!i || (i < n && s[i] != ' ')) return -1;
    *name_len = i;
    *n_at = 0;
    while (i < n) {
        if (s[i++] != ' ' || *n_at == MAX_ATTRS) return -1;
        size_t k = i;
        while (i < n && s[i] != '=' && s[i] != ' ' && s[i] != '"') i++;
        if (i == k || n - i < 2 || s[i] != '=' || s[i + 1] != '"') return -1;
        size_t kl = i - k;
        i += 2;
        size_t v = i;
        while (i < n && s[i] != '"') i++;
        if (i == n) return -1;
        at[(*n_at)++] = (tag_attr){s + k, s + v, kl, i - v};
        i++;
    }
    return 0;
}

static const tag_attr *find_attr(const tag_attr *at, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (at[i].kl == strlen(key) && !memcmp(at[i].k, key, at[i].kl)) return &at[i];
    return NULL;
}

/* The inverse of the template's escaping (&amp; and &quot; only). */
static void unescape(json_buf *b, const char *s, size_t n)
{
    b->len = 0;
    json_buf_reserve(b, n);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '&' && n - i >= 5 && !memcmp(s + i, "&amp;", 5)) {
            json_buf_putc(b, '&');
            i += 4;
        } else if (s[i] == '&' && n - i >= 6 && !memcmp(s + i, "&quot;", 6)) {
            json_buf_putc(b, '"');
            i += 5;
        } else {
            json_buf_putc(b, s[i]);
        }
    }
}

static int name_is(const char *s, size_t n, const char *name) { return n == strlen(name) && !memcmp(s, name, n); }

/* A tag has ended with <|sep|>: take it if it fits the state. */
static int apply_tag(chat_parser *p)
{
    const char *s = p->tagbuf.p ? p->tagbuf.p : "";
    size_t nl;
    tag_attr at[MAX_ATTRS];
    int na;
    if (parse_tag(s, p->tagbuf.len, &nl, at, &na)) return -1;
    enum pstate st = p->st;
    if (p->tag == TAG_CLOSE) {
        if (na) return -1;
        if (name_is(s, nl, "think") && st == P_THINK) p->st = P_AFTER_THINK;
        else if (name_is(s, nl, "response") && st == P_RESPONSE) p->st = P_AFTER_RESPONSE;
        else if (name_is(s, nl, "argument") && st == P_ARG) end_arg(p);
        else if (name_is(s, nl, "json") && st == P_JSON) end_json(p);
        else if (name_is(s, nl, "call") && st == P_CALL) end_call(p);
        else if (name_is(s, nl, "tools") && st == P_TOOLS) p->st = P_AFTER_RESPONSE;
        else if (name_is(s, nl, "message") && (st == P_THINK || st == P_AFTER_THINK || st == P_RESPONSE ||
                                               st == P_AFTER_RESPONSE || st == P_TOOLS))
            p->st = P_AFTER_MESSAGE;
        else return -1;
        return 0;
    }
    if (name_is(s, nl, "response") && (st == P_THINK || st == P_AFTER_THINK)) {
        p->st = P_RESPONSE;
    } else if (name_is(s, nl, "tools") && (st == P_AFTER_THINK || st == P_RESPONSE || st == P_AFTER_RESPONSE)) {
        p->st = P_TOOLS;
    } else if (name_is(s, nl, "call") && st == P_TOOLS) {
        const tag_attr *tool = find_attr(at, na, "tool");
        if (!tool) return -1;
        unescape(&p->call_name, tool->v, tool->vl);
        p->n_args = 0;
        p->args_text.len = 0;
        p->has_json = 0;
        p->json_block.len = 0;
        p->st = P_CALL;
        emit(p, CHAT_EV_CALL_BEGIN, "", 0, p->call_name.p, p->call_name.len, CHAT_ARG_STRING, p->n_calls++);
    } else if (name_is(s, nl, "argument") && st == P_CALL) {
        const tag_attr *key = find_attr(at, na, "key"), *type = find_attr(at, na, "type");
        if (!key) return -1;
        unescape(&p->arg_key, key->v, key->vl);
        p->arg_type = type ? arg_type_of(type->v, type->vl) : CHAT_ARG_STRING;
        p->arg_val.len = 0;
        p->st = P_ARG;
    } else if (name_is(s, nl, "json") && st == P_CALL) {
        p->json_block.len = 0;
        p->st = P_JSON;
    } else {
        return -1;
    }
    return 0;
}

static void special_in(chat_parser *p, int32_t id)
{
    if (p->tag != TAG_NONE) {
        if (id == p->id_sep) {
            if (apply_tag(p)) {
                degrade_tag(p);
                sink_str(p, SP_SEP);
            }
            p->tag = TAG_NONE;
            p->tagbuf.len = 0;
            return;
        }
        degrade_tag(p);
    }
    if (id == p->id_open || id == p->id_close) {
        p->tag = id == p->id_open ? TAG_OPEN : TAG_CLOSE;
        p->tagbuf.len = 0;
    } else if (id == p->id_end) {
        finalize(p);
        emit(p, CHAT_EV_END, "", 0, NULL, 0, CHAT_ARG_STRING, 0);
        p->st = P_DONE;
    } else {
        size_t n = 0;
        const char *sp = tokenizer_token_bytes(p->t, id, &n);
        if (sp) sink(p, sp, n);
    }
}

static size_t publish(chat_parser *p, const chat_event **ev)
{
    if (p->n_recs > p->cap_evs) {
        p->cap_evs = p->n_recs;
        p->evs = xrealloc(p->evs, p->cap_evs * sizeof *p->evs);
    }
    for (size_t i = 0; i < p->n_recs; i++) {
        const ev_rec *r = &p->recs[i];
        p->evs[i] = (chat_event){r->type, p->out.p + r->toff, r->tlen, r->noff == SIZE_MAX ? "" : p->out.p + r->noff,
                                 r->nlen, r->arg_type, r->index};
    }
    *ev = p->evs;
    return p->n_recs;
}

static void begin_batch(chat_parser *p)
{
    p->n_recs = 0;
    p->out.len = 0;
}

static void flush_decoder(chat_parser *p)
{
    size_t n = tok_decoder_flush(&p->dec, p->dbuf, p->dcap);
    text_in(p, p->dbuf, n);
}

size_t chat_parser_feed(chat_parser *p, int32_t id, const chat_event **ev)
{
    begin_batch(p);
    if (p->st != P_DONE && id >= 0 && id < p->n_vocab) {
        if (tokenizer_is_special(p->t, id)) {
            flush_decoder(p);
            special_in(p, id);
        } else {
            size_t n = tok_decoder_feed(&p->dec, id, p->dbuf, p->dcap);
            text_in(p, p->dbuf, n);
        }
    }
    return publish(p, ev);
}

size_t chat_parser_finish(chat_parser *p, const chat_event **ev)
{
    begin_batch(p);
    /* a tag the cut interrupted is markup the model was still writing, not
     * text (a forced call cut by max_tokens must not leave "<|open|>argument
     * key=" in the content); one the model itself ended is degraded in feed */
    if (p->tag != TAG_NONE) {
        p->tag = TAG_NONE;
        p->tagbuf.len = 0;
    }
    if (p->st != P_DONE) {
        flush_decoder(p);
        finalize(p);
    }
    return publish(p, ev);
}

int chat_parser_done(const chat_parser *p) { return p->st == P_DONE; }

void chat_parser_reset(chat_parser *p, int start_in_think)
{
    tok_decoder_init(&p->dec, p->t);
    p->st = start_in_think ? P_THINK : P_RESPONSE;
    p->tag = TAG_NONE;
    p->tagbuf.len = 0;
    p->n_calls = 0;
    p->call_name.len = p->arg_key.len = p->arg_val.len = p->json_block.len = p->args_text.len = 0;
    p->has_json = 0;
    p->n_args = 0;
    p->n_recs = 0;
    p->out.len = 0;
}

int chat_parser_new(const tokenizer *t, int start_in_think, chat_parser **out, df_error *err)
{
    *out = NULL;
    int32_t open = tokenizer_special_id(t, SP_OPEN), close = tokenizer_special_id(t, SP_CLOSE);
    int32_t sep = tokenizer_special_id(t, SP_SEP), end = tokenizer_special_id(t, SP_END);
    if (open < 0 || close < 0 || sep < 0 || end < 0)
        return df_err_set(err, DF_ERR_FORMAT, -1,
                          "chat parser: the tokenizer lacks one of " SP_OPEN " " SP_CLOSE " " SP_SEP " " SP_END);
    chat_parser *p = xcalloc(1, sizeof *p);
    p->t = t;
    p->id_open = open, p->id_close = close, p->id_sep = sep, p->id_end = end;
    p->n_vocab = tokenizer_n_vocab(t);
    /* Reserve up front: a reply grows a buffer only where it exceeds these
     * (4 KiB of events text per token, 16 events per token, 8 arguments
     * and 4 KiB of arguments per call); an object- or array-typed argument
     * is checked by parsing it (allocates).  Otherwise feeding a token
     * allocates nothing (test_chat_template feeds a whole reply with a tool
     * call under the allocation guard). */
    json_buf_reserve(&p->out, 4096);
    json_buf_reserve(&p->tagbuf, 256);
    json_buf_reserve(&p->call_name, 256);
    json_buf_reserve(&p->arg_key, 256);
    json_buf_reserve(&p->arg_val, 4096);
    json_buf_reserve(&p->json_block, 4096);
    json_buf_reserve(&p->args_text, 4096);
    json_buf_reserve(&p->call_json, 4096);
    p->cap_recs = p->cap_evs = 16;
    p->recs = xmalloc(p->cap_recs * sizeof *p->recs);
    p->evs = xmalloc(p->cap_evs * sizeof *p->evs);
    grow_args(p, 8);
    p->dcap = tok_decoder_max_out(t); /* enough for any one feed or flush */
    p->dbuf = xmalloc(p->dcap);
    chat_parser_reset(p, start_in_think);
    *out = p;
    return 0;
}

void chat_parser_free(chat_parser *p)
{
    if (!p) return;
    json_buf_free(&p->tagbuf);
    json_buf_free(&p->call_name);
    json_buf_free(&p->arg_key);
    json_buf_free(&p->arg_val);
    json_buf_free(&p->json_block);
    json_buf_free(&p->args_text);
    json_buf_free(&p->out);
    json_buf_free(&p->call_json);
    free(p->call_args);
    free(p->args);
    free(p->recs);
    free(p->evs);
    free(p->dbuf);
    free(p);
}

const char *chat_parser_closing(const chat_parser *p)
{
#define END_MSG "<|close|>message<|sep|><|end_of_msg|>"
#define END_TOOLS "<|close|>tools<|sep|>" END_MSG
#define END_CALL "<|close|>call<|sep|>" END_TOOLS
    /* an unfinished tag (between a marker and <|sep|>) is ended first */
    static const char *const with_sep[] = {
        [P_THINK] = "<|sep|><|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>" END_MSG,
        [P_AFTER_THINK] = "<|sep|><|open|>response<|sep|><|close|>response<|sep|>" END_MSG,
        [P_RESPONSE] = "<|sep|><|close|>response<|sep|>" END_MSG,
        [P_AFTER_RESPONSE] = "<|sep|>" END_MSG,
        [P_TOOLS] = "<|sep|>" END_TOOLS,
        [P_CALL] = "<|sep|>" END_CALL,
        [P_ARG] = "<|sep|><|close|>argument<|sep|>" END_CALL,
        [P_JSON] = "<|sep|><|close|>json<|sep|>" END_CALL,
        [P_AFTER_MESSAGE] = "<|sep|><|end_of_msg|>",
        [P_DONE] = "",
    };
    const char *s = with_sep[p->st];
    if (p->st == P_DONE) return "";
    return p->tag ? s : s + strlen("<|sep|>");
#undef END_MSG
#undef END_TOOLS
#undef END_CALL
}
