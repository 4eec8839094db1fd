/* server_responses.c - the OpenAI Responses API, POST /v1/responses (L5):
 * its request mapped onto chat_render's OpenAI-shaped messages, its output
 * items and stream events, and the store behind previous_response_id.
 *
 * Owns: the input items -> messages mapping (below), tool flattening
 * (namespaces, hosted tools left out), the Response object, the event
 * sequence and its sequence_number (taken under job->mu, so that the
 * keepalive events stream_reader sends in idle time stay in order), the
 * reasoning item's encrypted_content, and a small in-memory store of the
 * last RESP_STORE_N responses' conversations.  Does not own: HTTP, the
 * queue or the worker (server.c), the shared field readers (server_request.c,
 * the rq_* wrappers), the template (chat_template.c).
 *
 * Mapping rules (README "POST /v1/responses" documents them for users):
 *   - instructions: a system message first; never carried to a later
 *     response through previous_response_id (as OpenAI does).
 *   - message items (typed or "easy"): roles developer/system/user/assistant,
 *     text parts input_text/output_text concatenated; ids ignored.
 *   - reasoning, assistant message and function_call items in a row make
 *     one assistant message (reasoning_content, content, tool_calls); a
 *     reasoning item starts a new one.  The reasoning text is taken from
 *     encrypted_content when it is ours ("dfr1:" + base64 of the text: NOT
 *     encrypted, only encoded, so the next request renders exactly the
 *     tokens the model produced), else from content[].reasoning_text;
 *     summaries are never rendered (K3 has no summarizer: summary is []).
 *   - function_call_output: a tool message answering call_id.
 *   - a namespace's tools are offered as "<namespace>__<name>"; a call of
 *     such a name comes back as {name, namespace}, and an incoming
 *     function_call with a namespace is rendered under the flat name.
 *   - hosted tools (web_search, file_search, ...) are left out of the prompt
 *     and named in the x-deltafin-omitted-tools response header.
 * Invariants: every event written has a sequence_number one above the one
 * before it on that stream; response.created is the stream's first event
 * (written at validation, before the job is queued); output_index of an
 * item equals the number of items before it.
 */
#define _GNU_SOURCE
#include "server_impl.h"

#define RESP_STORE_N 16
#define ENC_PREFIX "dfr1:"

enum { RI_NONE, RI_REASONING, RI_MESSAGE, RI_CALL };

typedef struct ns_tool {
    char *flat;     /* "<namespace>__<name>" */
    size_t ns_len;  /* bytes of <namespace> */
} ns_tool;

struct resp_job {
    /* request, read-only once the job is queued */
    int include_enc, store, n_ns;
    ns_tool *ns;
    char *omitted;          /* hosted tools left out, comma-separated, or NULL */
    json_buf echo;          /* the request fields the Response object echoes: ,"k":v... */
    json_buf conv;          /* the conversation without instructions, messages comma-separated (store) */
    /* output: sequence numbers under job->mu, the rest worker-only */
    int seq;
    int n_items, open, reasoning_tokens;
    char item_id[80], call_id[96];
    json_buf text;          /* the open item's text */
    json_buf items;         /* the finished output items, comma-separated */
    json_buf reasoning, content, calls; /* the whole reply, for the store's assistant message */
    int n_calls;
};

typedef struct store_entry {
    char id[48];
    char *conv;  /* messages, comma-separated */
    size_t len;
} store_entry;

struct resp_store {
    pthread_mutex_t mu;
    int next;
    store_entry e[RESP_STORE_N];
};

resp_store *resp_store_new(void)
{
    resp_store *s = xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void resp_store_free(resp_store *s)
{
    if (!s) return;
    for (int i = 0; i < RESP_STORE_N; i++) free(s->e[i].conv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* A copy of the conversation stored under id, or NULL. */
static char *store_get(resp_store *s, const char *id, size_t *len)
{
    char *out = NULL;
    if (!s) return NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < RESP_STORE_N && !out; i++)
        if (s->e[i].conv && !strcmp(s->e[i].id, id)) {
            out = xmalloc(s->e[i].len + 1);
            memcpy(out, s->e[i].conv, s->e[i].len);
            out[s->e[i].len] = 0;
            *len = s->e[i].len;
        }
    pthread_mutex_unlock(&s->mu);
    return out;
}

/* Takes conv (xmalloc'd); the oldest entry leaves. */
static void store_put(resp_store *s, const char *id, char *conv, size_t len)
{
    pthread_mutex_lock(&s->mu);
    store_entry *e = &s->e[s->next];
    s->next = (s->next + 1) % RESP_STORE_N;
    free(e->conv);
    snprintf(e->id, sizeof e->id, "%s", id);
    e->conv = conv;
    e->len = len;
    pthread_mutex_unlock(&s->mu);
}

void resp_job_free(resp_job *r)
{
    if (!r) return;
    for (int i = 0; i < r->n_ns; i++) free(r->ns[i].flat);
    free(r->ns);
    free(r->omitted);
    json_buf *bufs[] = {&r->echo, &r->conv, &r->text, &r->items, &r->reasoning, &r->content, &r->calls};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) json_buf_free(bufs[i]);
    free(r);
}

const char *resp_omitted_tools(const job *j) { return j->rj ? j->rj->omitted : NULL; }

/* ---- encrypted_content: base64, not encryption ------------------------- */

static void b64_put(json_buf *b, const char *s, size_t n)
{
    char *enc = xmalloc(4 * (n / 3 + 1) + 1);
    b64_encode((const unsigned char *)s, n, enc);
    json_buf_puts(b, enc);
    free(enc);
}

/* Decodes ENC_PREFIX + base64 into out; -1 when s is not ours. */
static int b64_get(const char *s, size_t n, json_buf *out)
{
    size_t p = sizeof ENC_PREFIX - 1;
    if (n < p || memcmp(s, ENC_PREFIX, p)) return -1;
    if (n == p) return 0;
    unsigned char *dec = xmalloc((n - p) / 4 * 3 + 1);
    long got = b64_decode((const unsigned char *)s + p, n - p, dec);
    if (got >= 0) json_buf_put(out, (const char *)dec, (size_t)got);
    free(dec);
    return got < 0 ? -1 : 0;
}

/* ---- request: items -> messages ----------------------------------------- */

/* The pending assistant message (reasoning, content, tool calls). */
typedef struct asst {
    srv *S;                     /* the server (its document limits) */
    int open, has_reason, has_content;
    json_buf reason, content, calls;
    int n_calls;
} asst;

static void put_sep(json_buf *b)
{
    if (b->len) json_buf_putc(b, ',');
}

static void asst_flush(asst *a, json_buf *conv)
{
    if (!a->open) return;
    put_sep(conv);
    json_buf_puts(conv, "{\"role\":\"assistant\",\"content\":");
    json_write_string(conv, a->content.p ? a->content.p : "", a->content.len);
    if (a->has_reason) {
        json_buf_puts(conv, ",\"reasoning_content\":");
        json_write_string(conv, a->reason.p ? a->reason.p : "", a->reason.len);
    }
    if (a->n_calls) {
        json_buf_puts(conv, ",\"tool_calls\":[");
        json_buf_put(conv, a->calls.p, a->calls.len);
        json_buf_puts(conv, "]");
    }
    json_buf_puts(conv, "}");
    a->open = a->has_reason = a->has_content = a->n_calls = 0;
    a->reason.len = a->content.len = a->calls.len = 0;
}

/* Text of a string or an array of text parts (input_text, output_text;
 * allow_output: output_text too).  where names the value in errors. */
static int item_text(srv *S, const json_value *v, const char *where, json_buf *out, rq_err *e)
{
    if (v && v->type == JSON_STRING) {
        json_buf_put(out, v->str, v->len);
        return 0;
    }
    if (!v || v->type != JSON_ARRAY) return rq_fail(e, 400, "input", "%s: expected a string or an array of parts", where);
    for (size_t k = 0; k < v->len; k++) {
        const char *t = json_get_str(v->items[k], "type");
        if (!t) return rq_fail(e, 400, "input", "%s[%zu].type: missing", where, k);
        if (!strcmp(t, "input_file") && S) {
            if (resp_input_file(S, v->items[k], where, k, out, e)) return -1;
            continue;
        }
        if (strcmp(t, "input_text") && strcmp(t, "output_text"))
            return rq_fail(e, 400, "input", "%s[%zu].type: \"%.*s\" parts are not supported (K3 here reads text: "
                           "input_text, output_text and input_file)", where, k, (int)utf8_cut(t, strlen(t), 40), t);
        const json_value *x = json_get(v->items[k], "text");
        if (!x || x->type != JSON_STRING) return rq_fail(e, 400, "input", "%s[%zu].text: expected a string", where, k);
        json_buf_put(out, x->str, x->len);
    }
    return 0;
}

/* The name a call is rendered under: "<namespace>__<name>" or name. */
static void flat_name(json_buf *b, const char *ns, const char *name)
{
    if (ns && *ns) {
        json_buf_puts(b, ns);
        json_buf_puts(b, "__");
    }
    json_buf_puts(b, name);
}

static int convert_item(const json_value *it, size_t i, asst *a, json_buf *conv, rq_err *e)
{
    char where[64];
    snprintf(where, sizeof where, "input[%zu]", i);
    if (it->type != JSON_OBJECT) return rq_fail(e, 400, "input", "%s: expected an object", where);
    const char *type = json_get_str(it, "type");
    const json_value *tv = json_get(it, "type");
    if (tv && tv->type != JSON_STRING && tv->type != JSON_NULL)
        return rq_fail(e, 400, "input", "%s.type: expected a string", where);
    if (!type || !strcmp(type, "message")) {
        const char *role = json_get_str(it, "role");
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                      strcmp(role, "developer")))
            return rq_fail(e, 400, "input", "%s.role: expected \"user\", \"assistant\", \"system\" or \"developer\"",
                           where);
        char cw[80];
        snprintf(cw, sizeof cw, "%s.content", where);
        json_buf text;
        json_buf_init(&text);
        int rc = item_text(a->S, json_get(it, "content"), cw, &text, e);
        if (!rc && !strcmp(role, "assistant")) {
            /* joins the reasoning before it; after content or calls it is a new message */
            if (a->open && (a->has_content || a->n_calls)) asst_flush(a, conv);
            a->open = a->has_content = 1;
            json_buf_put(&a->content, text.p, text.len);
        } else if (!rc) {
            asst_flush(a, conv);
            put_sep(conv);
            put_message(conv, role, NULL, text.p, text.len);
        }
        json_buf_free(&text);
        return rc;
    }
    if (!strcmp(type, "reasoning")) {
        if (a->open) asst_flush(a, conv);
        a->open = a->has_reason = 1;
        const json_value *enc = json_get(it, "encrypted_content"), *content = json_get(it, "content");
        if (enc && enc->type == JSON_STRING && !b64_get(enc->str, enc->len, &a->reason)) return 0;
        a->reason.len = 0;
        if (content && content->type == JSON_ARRAY) {
            for (size_t k = 0; k < content->len; k++) {
                const json_value *p = content->items[k], *x = json_get(p, "text");
                const char *t = json_get_str(p, "type");
                if (!t || strcmp(t, "reasoning_text") || !x || x->type != JSON_STRING)
                    return rq_fail(e, 400, "input", "%s.content[%zu]: expected {\"type\": \"reasoning_text\", "
                                   "\"text\": string}", where, k);
                json_buf_put(&a->reason, x->str, x->len);
            }
        } else if (content && content->type != JSON_NULL) {
            return rq_fail(e, 400, "input", "%s.content: expected an array", where);
        }
        return 0;
    }
    if (!strcmp(type, "function_call")) {
        const char *call_id = json_get_str(it, "call_id"), *name = json_get_str(it, "name");
        const char *ns = json_get_str(it, "namespace");
        const json_value *args = json_get(it, "arguments");
        if (!call_id || !name || !*name)
            return rq_fail(e, 400, "input", "%s: a function_call needs call_id and name strings", where);
        if (!args || args->type != JSON_STRING)
            return rq_fail(e, 400, "input", "%s.arguments: expected a string of JSON", where);
        df_error err = {0};
        json_doc *d = args->len ? json_parse(args->str, args->len, &err) : NULL;
        int ok = !args->len || (d && json_root(d)->type == JSON_OBJECT);
        json_free(d);
        if (!ok)
            return rq_fail(e, 400, "input", "%s.arguments: not a JSON object (%s)", where,
                           err.msg[0] ? err.msg : "another JSON value");
        a->open = 1;
        if (a->n_calls++) json_buf_putc(&a->calls, ',');
        json_buf_puts(&a->calls, "{\"id\":");
        put_str(&a->calls, call_id);
        json_buf_puts(&a->calls, ",\"type\":\"function\",\"function\":{\"name\":");
        json_buf fn;
        json_buf_init(&fn);
        flat_name(&fn, ns, name);
        json_write_string(&a->calls, fn.p, fn.len);
        json_buf_free(&fn);
        json_buf_puts(&a->calls, ",\"arguments\":");
        json_write_string(&a->calls, args->len ? args->str : "{}", args->len ? args->len : 2);
        json_buf_puts(&a->calls, "}}");
        return 0;
    }
    if (!strcmp(type, "function_call_output")) {
        const char *call_id = json_get_str(it, "call_id");
        if (!call_id) return rq_fail(e, 400, "input", "%s.call_id: expected a string", where);
        char ow[80];
        snprintf(ow, sizeof ow, "%s.output", where);
        json_buf text;
        json_buf_init(&text);
        int rc = item_text(a->S, json_get(it, "output"), ow, &text, e);
        if (!rc) {
            asst_flush(a, conv);
            put_sep(conv);
            put_message(conv, "tool", call_id, text.p, text.len);
        }
        json_buf_free(&text);
        return rc;
    }
    return rq_fail(e, 400, "input", "%s.type: \"%.*s\" items are not supported (this server takes message, reasoning, "
                   "function_call and function_call_output items)", where, (int)utf8_cut(type, strlen(type), 40), type);
}

static const char *const hosted_tools[] = {
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "image_generation", "computer_use_preview", "computer", "computer_use", "mcp", "local_shell",
    "shell", "apply_patch", "tool_search", NULL};

static int str_is_v(const json_value *v, const char *s)
{
    return v && v->type == JSON_STRING && !strcmp(v->str, s);
}

/* One function tool (top level or inside a namespace) as chat_render's
 * {"type":"function","function":{...}}; ns: its namespace or NULL. */
static int convert_function(resp_job *r, const json_value *t, const char *where, const char *ns, json_buf *d, rq_err *e)
{
    static const char *const allowed[] = {"type", "name", "description", "parameters", "strict", NULL};
    rq_err fe = {0};
    if (check_fields(t, allowed, &fe))
        return rq_fail(e, 400, "tools", "%s.%s: not supported in a function tool", where, fe.param);
    const char *name = json_get_str(t, "name");
    const json_value *desc = json_get(t, "description"), *params = json_get(t, "parameters"),
                     *strict = json_get(t, "strict");
    if (!name || !*name) return rq_fail(e, 400, "tools", "%s.name: expected a non-empty string", where);
    if (desc && desc->type != JSON_STRING && desc->type != JSON_NULL)
        return rq_fail(e, 400, "tools", "%s.description: expected a string", where);
    if (params && params->type != JSON_OBJECT && params->type != JSON_NULL)
        return rq_fail(e, 400, "tools", "%s.parameters: expected a JSON Schema object", where);
    if (strict && strict->type != JSON_BOOL && strict->type != JSON_NULL)
        return rq_fail(e, 400, "tools", "%s.strict: expected a boolean", where);
    json_buf fn;
    json_buf_init(&fn);
    flat_name(&fn, ns, name);
    json_buf_putc(&fn, 0);
    if (ns) {
        r->ns = xrealloc(r->ns, (size_t)(r->n_ns + 1) * sizeof *r->ns);
        r->ns[r->n_ns].flat = xstrdup(fn.p);
        r->ns[r->n_ns++].ns_len = strlen(ns);
    }
    put_sep(d);
    json_buf_puts(d, "{\"type\":\"function\",\"function\":{\"name\":");
    put_str(d, fn.p);
    json_buf_free(&fn);
    if (desc && desc->type == JSON_STRING) {
        json_buf_puts(d, ",\"description\":");
        json_write_string(d, desc->str, desc->len);
    }
    if (strict && strict->type == JSON_BOOL && strict->b) json_buf_puts(d, ",\"strict\":true");
    if (params && params->type == JSON_OBJECT) {
        json_buf_puts(d, ",\"parameters\":");
        json_write_value(d, params, 0);
    }
    json_buf_puts(d, "}}");
    return 0;
}

/* tools -> d (chat_render's tools, comma-separated) and echo (the applied
 * tools as sent); hosted tools are named in r->omitted. */
static int convert_tools(resp_job *r, const json_value *tools, json_buf *d, json_buf *echo, rq_err *e)
{
    if (tools->type != JSON_ARRAY) return rq_fail(e, 400, "tools", "tools: expected an array");
    json_buf om;
    json_buf_init(&om);
    int rc = 0;
    for (size_t i = 0; i < tools->len && !rc; i++) {
        const json_value *t = tools->items[i];
        char where[48];
        snprintf(where, sizeof where, "tools[%zu]", i);
        const char *type = json_get_str(t, "type");
        if (t->type != JSON_OBJECT || !type) {
            rc = rq_fail(e, 400, "tools", "%s: expected an object with a type", where);
            break;
        }
        int hosted = 0;
        for (const char *const *h = hosted_tools; *h && !hosted; h++) hosted = !strcmp(*h, type);
        if (hosted) {
            /* named once each */
            size_t tl = strlen(type);
            int seen = 0;
            for (const char *p = om.p; p && p < om.p + om.len && !seen; p += strcspn(p, ",") + 1)
                seen = strcspn(p, ",") == tl && !memcmp(p, type, tl);
            if (!seen) {
                if (om.len) json_buf_putc(&om, ',');
                json_buf_put(&om, type, tl);
                json_buf_putc(&om, 0);
                om.len--;
            }
            continue;
        }
        if (!strcmp(type, "function")) {
            rc = convert_function(r, t, where, NULL, d, e);
        } else if (!strcmp(type, "namespace")) {
            const char *ns = json_get_str(t, "name");
            const json_value *inner = json_get(t, "tools");
            if (!ns || !*ns || strstr(ns, "__")) {
                rc = rq_fail(e, 400, "tools", "%s.name: expected a non-empty namespace name without \"__\"", where);
                break;
            }
            if (!inner || inner->type != JSON_ARRAY) {
                rc = rq_fail(e, 400, "tools", "%s.tools: expected an array of function tools", where);
                break;
            }
            for (size_t k = 0; k < inner->len && !rc; k++) {
                char iw[80];
                snprintf(iw, sizeof iw, "%s.tools[%zu]", where, k);
                const char *it = json_get_str(inner->items[k], "type");
                if (!it || strcmp(it, "function"))
                    rc = rq_fail(e, 400, "tools", "%s.type: a namespace here holds function tools only", iw);
                else rc = convert_function(r, inner->items[k], iw, ns, d, e);
            }
        } else {
            rc = rq_fail(e, 400, "tools", "%s.type: \"%.*s\" tools are not supported (function and namespace tools "
                         "are offered; hosted tools such as web_search are left out)", where,
                         (int)utf8_cut(type, strlen(type), 40), type);
        }
        if (!rc) {
            put_sep(echo);
            json_write_value(echo, t, 0);
        }
    }
    if (om.len) r->omitted = xstrdup(om.p);
    json_buf_free(&om);
    return rc;
}

/* reasoning.effort -> K3's thinking (k3_effort, README's table). */
static int effort_map(const char *eff, chat_options *co)
{
    int off = 0;
    const char *k3 = k3_effort(eff, &off);
    if (off) co->thinking = 0;
    else if (k3) co->thinking_effort = k3;
    else return -1;
    return 0;
}

static void echo_str(json_buf *b, const char *k, const json_value *v)
{
    bprintf(b, ",\"%s\":", k);
    if (v && v->type == JSON_STRING) json_write_string(b, v->str, v->len);
    else json_buf_puts(b, "null");
}

static void resp_event(job *j, const char *type, const json_buf *rest);
static void response_object(json_buf *b, const job *j, const char *status, const char *error_code, const char *error_msg);

/* What parse_responses collects from a request's fields for the render and
 * the echo. */
typedef struct resp_opts {
    int parallel, mt_set;
    int64_t mt;
    const json_value *eff, *summ, *fmt;      /* reasoning.effort / summary, text.format */
    const json_value *ins, *prev, *md;        /* instructions, previous_response_id, metadata */
} resp_opts;

/* the request's options: background, parallel tool calls, max output
 * tokens, stream options, include, truncation */
static int resp_options(const json_value *o, resp_job *r, resp_opts *p, rq_err *e)
{
    int bg = 0;
    int64_t top = 0, mtc = 0;
    p->parallel = 1;
    if (get_bool(o, "background", &bg, e) || get_bool(o, "parallel_tool_calls", &p->parallel, e) ||
        get_int(o, "max_output_tokens", 1, INT32_MAX, &p->mt, &p->mt_set, e) ||
        get_int(o, "top_logprobs", 0, 0, &top, NULL, e))
        return -1;
    if (bg) return rq_fail(e, 400, "background", "background: true is not supported (answers are streamed or returned)");
    if (field(o, "max_tool_calls") && get_int(o, "max_tool_calls", INT32_MAX, INT32_MAX, &mtc, NULL, e))
        return rq_fail(e, 400, "max_tool_calls", "max_tool_calls: not supported (K3's calls are not counted while "
                       "generating)");
    const json_value *so = field(o, "stream_options");
    if (so) {
        static const char *const so_allowed[] = {"include_obfuscation", NULL};
        int obf = 0;
        if (so->type != JSON_OBJECT) return rq_fail(e, 400, "stream_options", "stream_options: expected an object");
        if (check_fields(so, so_allowed, e) || get_bool(so, "include_obfuscation", &obf, e)) return -1;
    }
    const json_value *inc = field(o, "include");
    if (inc && inc->type != JSON_ARRAY) return rq_fail(e, 400, "include", "include: expected an array of strings");
    for (size_t i = 0; inc && i < inc->len; i++) {
        const json_value *v = inc->items[i];
        if (v->type != JSON_STRING) return rq_fail(e, 400, "include", "include[%zu]: expected a string", i);
        if (!strcmp(v->str, "reasoning.encrypted_content")) r->include_enc = 1;
        else if (!strcmp(v->str, "message.output_text.logprobs"))
            return rq_fail(e, 400, "include", "include: message.output_text.logprobs is not supported here");
        /* the others name hosted tools' outputs, which never occur here */
    }
    const json_value *tr = field(o, "truncation");
    if (tr && (tr->type != JSON_STRING || strcmp(tr->str, "disabled")))
        return rq_fail(e, 400, "truncation", "truncation: only \"disabled\" is supported (a prompt longer than the "
                       "context is refused, never cut)");
    return 0;
}

/* reasoning (effort, summary) and text.format, which becomes chat's
 * response_format in rf */
static int resp_reasoning_text(const json_value *o, chat_options *co, resp_opts *p, json_buf *rf, rq_err *e)
{
    const json_value *rs = field(o, "reasoning"), *eff = NULL, *summ = NULL;
    if (rs) {
        static const char *const rs_allowed[] = {"effort", "summary", "generate_summary", NULL};
        if (rs->type != JSON_OBJECT) return rq_fail(e, 400, "reasoning", "reasoning: expected an object");
        if (check_fields(rs, rs_allowed, e)) return -1;
        eff = field(rs, "effort");
        summ = field(rs, "summary");
        if (!summ) summ = field(rs, "generate_summary");
        if (eff && (eff->type != JSON_STRING || effort_map(eff->str, co)))
            return rq_fail(e, 400, "reasoning.effort", "reasoning.effort: expected none, minimal, low, medium, high, "
                           "xhigh or max");
        if (summ && (summ->type != JSON_STRING || (strcmp(summ->str, "auto") && strcmp(summ->str, "concise") &&
                                                   strcmp(summ->str, "detailed"))))
            return rq_fail(e, 400, "reasoning.summary", "reasoning.summary: expected auto, concise or detailed");
    }
    const json_value *text = field(o, "text"), *fmt = text ? field(text, "format") : NULL;
    if (text) {
        static const char *const t_allowed[] = {"format", NULL};
        if (text->type != JSON_OBJECT) return rq_fail(e, 400, "text", "text: expected an object");
        if (check_fields(text, t_allowed, e)) return -1;
    }
    if (fmt) {
        const char *ft = json_get_str(fmt, "type");
        const json_value *schema = json_get(fmt, "schema");
        if (!ft || (strcmp(ft, "text") && strcmp(ft, "json_object") && strcmp(ft, "json_schema")))
            return rq_fail(e, 400, "text.format", "text.format.type: expected text, json_object or json_schema");
        if (!strcmp(ft, "json_schema") && (!schema || schema->type != JSON_OBJECT))
            return rq_fail(e, 400, "text.format", "text.format.schema: expected a JSON Schema object");
        bprintf(rf, "{\"type\":\"%s\"", ft);
        if (!strcmp(ft, "json_schema")) {
            json_buf_puts(rf, ",\"json_schema\":{\"schema\":");
            json_write_value(rf, schema, 0);
            json_buf_puts(rf, "}");
        }
        json_buf_puts(rf, "}");
    }
    p->eff = eff;
    p->summ = summ;
    p->fmt = fmt;
    return 0;
}

/* the string and object fields checked for their types */
static int resp_fields(const json_value *o, resp_opts *p, rq_err *e)
{
    const json_value *ins = field(o, "instructions"), *prev = field(o, "previous_response_id");
    const json_value *md = field(o, "metadata");
    if (ins && ins->type != JSON_STRING) return rq_fail(e, 400, "instructions", "instructions: expected a string");
    if (prev && prev->type != JSON_STRING)
        return rq_fail(e, 400, "previous_response_id", "previous_response_id: expected a string");
    if (md && md->type != JSON_OBJECT) return rq_fail(e, 400, "metadata", "metadata: expected an object");
    static const char *const strs[] = {"prompt_cache_key", "prompt_cache_retention", "service_tier", "user",
                                       "safety_identifier", NULL};
    for (const char *const *k = strs; *k; k++) {
        const json_value *v = field(o, *k);
        if (v && v->type != JSON_STRING) return rq_fail(e, 400, *k, "%s: expected a string", *k);
    }
    const json_value *cm = field(o, "client_metadata");
    if (cm && cm->type != JSON_OBJECT) return rq_fail(e, 400, "client_metadata", "client_metadata: expected an object");
    p->ins = ins;
    p->prev = prev;
    p->md = md;
    return 0;
}

/* the conversation: a stored one (previous_response_id), then the input */
static int resp_conversation(srv *S, resp_job *r, const json_value *o, const json_value *prev, rq_err *e)
{
    int rc = 0;
    if (prev) {
        size_t n = 0;
        char *c = store_get(S->rstore, prev->str, &n);
        if (!c) {
            e->code = "previous_response_not_found";
            return rq_fail(e, 400, "previous_response_id", "Previous response with id '%.*s' not found (this server "
                           "keeps the last %d stored responses in memory)", (int)utf8_cut(prev->str, prev->len, 80),
                           prev->str, RESP_STORE_N);
        }
        json_buf_put(&r->conv, c, n);
        free(c);
    }
    const json_value *in = json_get(o, "input");
    if (!in || in->type == JSON_NULL) rc = rq_fail(e, 400, "input", "input: missing");
    else if (in->type == JSON_STRING) {
        put_sep(&r->conv);
        put_message(&r->conv, "user", NULL, in->str, in->len);
    } else if (in->type != JSON_ARRAY) {
        rc = rq_fail(e, 400, "input", "input: expected a string or an array of items");
    } else {
        asst a = {.S = S};
        for (size_t i = 0; i < in->len && !rc; i++) rc = convert_item(in->items[i], i, &a, &r->conv, e);
        if (!rc) asst_flush(&a, &r->conv);
        json_buf_free(&a.reason);
        json_buf_free(&a.content);
        json_buf_free(&a.calls);
    }
    if (!rc && !r->conv.len) rc = rq_fail(e, 400, "input", "input: no messages");
    return rc;
}

/* the document chat_render reads (instructions, the conversation, tools,
 * tool_choice, response_format), rendered and tokenized */
static int resp_render(srv *S, job *j, resp_job *r, const resp_opts *p, const json_buf *tools,
                       const json_value *tc, const char *tc_name, const json_buf *rf, chat_options co, rq_err *e)
{
    const json_value *ins = p->ins;
    int rc = 0;
    json_buf d;
    json_buf_init(&d);
    {
        json_buf_puts(&d, "{\"messages\":[");
        if (ins) {
            put_message(&d, "system", NULL, ins->str, ins->len);
            json_buf_puts(&d, ",");
        }
        json_buf_put(&d, r->conv.p, r->conv.len);
        json_buf_puts(&d, "],\"tools\":[");
        json_buf_put(&d, tools->p, tools->len);
        json_buf_puts(&d, "]");
        if (tc_name) {
            json_buf_puts(&d, ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":");
            put_str(&d, tc_name);
            json_buf_puts(&d, "}}");
        } else if (tc) {
            json_buf_puts(&d, ",\"tool_choice\":");
            put_str(&d, tc->str);
        }
        if (rf->len) {
            json_buf_puts(&d, ",\"response_format\":");
            json_buf_put(&d, rf->p, rf->len);
        }
        json_buf_puts(&d, "}");
        df_error err = {0};
        json_doc *doc = json_parse(d.p, d.len, &err);
        if (!doc) {
            rc = rq_fail(e, 400, "input", "the request cannot be converted: %s (JSON nesting is limited to %d levels, "
                         "and a function's parameters are nested one level deeper in conversion)", err.msg,
                         JSON_MAX_DEPTH);
        } else {
            const json_value *root = json_root(doc);
            const json_value *ct = json_get(root, "tools");
            co.tools = ct && ct->len ? ct : NULL;
            co.tool_choice = json_get(root, "tool_choice");
            co.response_format = json_get(root, "response_format");
            rc = render_encode(S, j, json_get(root, "messages"), &co, e);
            json_free(doc);
        }
    }
    json_buf_free(&d);
    return rc;
}

/* the Response object's echo of the request */
static void resp_echo(job *j, resp_job *r, const json_value *o, const resp_opts *p, const json_value *tc,
                      const json_buf *techo)
{
    const json_value *ins = p->ins, *prev = p->prev, *eff = p->eff, *summ = p->summ, *fmt = p->fmt, *md = p->md;
    int64_t mt = p->mt;
    int mt_set = p->mt_set, parallel = p->parallel;
    {
        json_buf *b = &r->echo;
        echo_str(b, "instructions", ins);
        if (mt_set) bprintf(b, ",\"max_output_tokens\":%lld", (long long)mt);
        else json_buf_puts(b, ",\"max_output_tokens\":null");
        bprintf(b, ",\"parallel_tool_calls\":%s", parallel ? "true" : "false");
        echo_str(b, "previous_response_id", prev);
        json_buf_puts(b, ",\"reasoning\":{\"effort\":");
        if (eff) put_str(b, eff->str);
        else json_buf_puts(b, "null");
        json_buf_puts(b, ",\"summary\":");
        if (summ) put_str(b, summ->str);
        else json_buf_puts(b, "null");
        bprintf(b, "},\"store\":%s,\"temperature\":", r->store ? "true" : "false");
        json_write_double(b, j->temperature);
        json_buf_puts(b, ",\"top_p\":");
        json_write_double(b, j->top_p);
        json_buf_puts(b, ",\"text\":{\"format\":");
        if (fmt) json_write_value(b, fmt, 0);
        else json_buf_puts(b, "{\"type\":\"text\"}");
        json_buf_puts(b, "},\"tool_choice\":");
        if (tc && tc->type == JSON_OBJECT) json_write_value(b, tc, 0);
        else put_str(b, tc ? tc->str : "auto");
        json_buf_puts(b, ",\"tools\":[");
        json_buf_put(b, techo->p, techo->len);
        json_buf_puts(b, "],\"truncation\":\"disabled\",\"metadata\":");
        if (md) json_write_value(b, md, 0);
        else json_buf_puts(b, "{}");
        echo_str(b, "prompt_cache_key", field(o, "prompt_cache_key"));
    }
}

int parse_responses(srv *S, job *j, const json_value *o, rq_err *e)
{
    static const char *const allowed[] = {
        "model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options", "include",
        "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature", "top_p", "seed",
        "reasoning", "text", "truncation", "metadata", "prompt_cache_key", "prompt_cache_retention", "service_tier",
        "user", "safety_identifier", "client_metadata", "background", "top_logprobs", "max_tool_calls", NULL};
    resp_job *r = j->rj = xcalloc(1, sizeof *r);
    r->store = 1;
    if (check_fields(o, allowed, e) || get_common(S, j, o, e) || get_bool(o, "store", &r->store, e))
        return -1;
    resp_opts p = {0};
    chat_options co;
    chat_options_init(&co);
    json_buf rf, tools, techo; /* text.format as chat's response_format; the tools converted, and echoed */
    json_buf_init(&rf);
    json_buf_init(&tools);
    json_buf_init(&techo);
    int rc = resp_options(o, r, &p, e) || resp_reasoning_text(o, &co, &p, &rf, e) || resp_fields(o, &p, e) ||
                     resp_conversation(S, r, o, p.prev, e)
                 ? -1 : 0;
    const json_value *tl = field(o, "tools"), *tc = field(o, "tool_choice");
    if (!rc && tl) rc = convert_tools(r, tl, &tools, &techo, e);
    const char *tc_name = tc && tc->type == JSON_OBJECT && str_is_v(json_get(tc, "type"), "function")
                              ? json_get_str(tc, "name") : NULL;
    if (!rc && tc && !tc_name && !(tc->type == JSON_STRING && (!strcmp(tc->str, "auto") || !strcmp(tc->str, "none") ||
                                                   !strcmp(tc->str, "required"))))
        rc = rq_fail(e, 400, "tool_choice", "tool_choice: expected \"auto\", \"none\", \"required\" or {\"type\": "
                     "\"function\", \"name\": ...}");
    j->single_call = !p.parallel;
    j->conv_key = conv_key(field(o, "prompt_cache_key"));
    if (!rc) rc = resp_render(S, j, r, &p, &tools, tc, tc_name, &rf, co, e);
    if (!rc) rc = set_max_tokens(S, j, "max_output_tokens", p.mt, p.mt_set, e);
    if (!rc) resp_echo(j, r, o, &p, tc, &techo);
    json_buf_free(&tools);
    json_buf_free(&techo);
    json_buf_free(&rf);
    if (rc) return -1;
    if (j->stream) {
        /* the stream's first events, before the job is queued: keepalives
         * (stream_reader) may only follow response.created */
        json_buf b;
        json_buf_init(&b);
        json_buf_puts(&b, ",\"response\":");
        response_object(&b, j, "in_progress", NULL, NULL);
        resp_event(j, "response.created", &b);
        resp_event(j, "response.in_progress", &b);
        json_buf_free(&b);
    }
    return 0;
}

/* ---- output ------------------------------------------------------------- */

/* One event: "event: TYPE" and data {"type":TYPE,"sequence_number":N<rest>}. */
static void resp_event(job *j, const char *type, const json_buf *rest)
{
    pthread_mutex_lock(&j->mu);
    bprintf(&j->out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d", type, type, j->rj->seq++);
    if (rest) json_buf_put(&j->out, rest->p, rest->len);
    json_buf_puts(&j->out, "}\n\n");
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* A keepalive event into buf (at most max bytes); called by stream_reader
 * with j->mu held when nothing came for --ping-ms.  0 when it does not fit. */
size_t resp_keepalive(job *j, char *buf, size_t max)
{
    char tmp[96];
    int n = snprintf(tmp, sizeof tmp, "event: keepalive\ndata: {\"type\":\"keepalive\",\"sequence_number\":%d}\n\n",
                     j->rj->seq);
    if (n <= 0 || (size_t)n > max) return 0;
    j->rj->seq++;
    memcpy(buf, tmp, (size_t)n);
    return (size_t)n;
}

static void resp_usage_json(json_buf *b, const job *j)
{
    bprintf(b, "{\"input_tokens\":%zu,\"input_tokens_details\":{\"cached_tokens\":%d},\"output_tokens\":%d,"
            "\"output_tokens_details\":{\"reasoning_tokens\":%d},\"total_tokens\":%zu}", j->n_ids, j->n_reused,
            j->n_gen, j->rj->reasoning_tokens, j->n_ids + (size_t)j->n_gen);
}

/* The Response object; output and usage once it is no longer in progress. */
static void response_object(json_buf *b, const job *j, const char *status, const char *error_code, const char *error_msg)
{
    const resp_job *r = j->rj;
    int final = strcmp(status, "in_progress") != 0;
    json_buf_puts(b, "{\"id\":");
    put_str(b, j->id);
    bprintf(b, ",\"object\":\"response\",\"created_at\":%ld,\"status\":\"%s\",\"background\":false,\"error\":",
            j->created, status);
    if (error_code) {
        json_buf_puts(b, "{\"code\":");
        put_str(b, error_code);
        json_buf_puts(b, ",\"message\":");
        put_str_utf8(b, error_msg, strlen(error_msg));
        json_buf_puts(b, "}");
    } else {
        json_buf_puts(b, "null");
    }
    json_buf_puts(b, ",\"incomplete_details\":");
    json_buf_puts(b, strcmp(status, "incomplete") ? "null" : j->fin == FIN_TIMEOUT ? "{\"reason\":\"timeout\"}"
                                                       : "{\"reason\":\"max_output_tokens\"}");
    json_buf_puts(b, ",\"model\":");
    put_str(b, j->model);
    json_buf_puts(b, ",\"output\":[");
    if (final) json_buf_put(b, r->items.p, r->items.len);
    json_buf_puts(b, "]");
    json_buf_put(b, r->echo.p, r->echo.len);
    json_buf_puts(b, ",\"usage\":");
    if (final) resp_usage_json(b, j);
    else json_buf_puts(b, "null");
    json_buf_puts(b, "}");
}

/* the item's id: rs_/msg_/fc_ + the response id's tail + its index */
static void item_id(job *j, const char *prefix)
{
    snprintf(j->rj->item_id, sizeof j->rj->item_id, "%s_%s_%d", prefix, j->id + 5, j->rj->n_items);
}

/* ,"item_id":..,"output_index":N into b */
static void ev_head(json_buf *b, const job *j)
{
    json_buf_puts(b, ",\"item_id\":");
    put_str(b, j->rj->item_id);
    bprintf(b, ",\"output_index\":%d", j->rj->n_items);
}

static void item_open(job *j, int kind)
{
    resp_job *r = j->rj;
    item_id(j, kind == RI_REASONING ? "rs" : "msg");
    r->open = kind;
    r->text.len = 0;
    if (!j->stream) return;
    json_buf b;
    json_buf_init(&b);
    bprintf(&b, ",\"output_index\":%d,\"item\":{\"id\":", r->n_items);
    put_str(&b, r->item_id);
    json_buf_puts(&b, kind == RI_REASONING ? ",\"type\":\"reasoning\",\"summary\":[],\"content\":[]}"
                                           : ",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\","
                                             "\"content\":[]}");
    resp_event(j, "response.output_item.added", &b);
    b.len = 0;
    ev_head(&b, j);
    json_buf_puts(&b, kind == RI_REASONING ? ",\"content_index\":0,\"part\":{\"type\":\"reasoning_text\",\"text\":\"\"}"
                                           : ",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\","
                                             "\"annotations\":[],\"logprobs\":[]}");
    resp_event(j, "response.content_part.added", &b);
    json_buf_free(&b);
}

/* Ends the open reasoning or message item: its .done events and the item. */
static void item_close(job *j, const char *status)
{
    resp_job *r = j->rj;
    if (r->open != RI_REASONING && r->open != RI_MESSAGE) return;
    int reasoning = r->open == RI_REASONING;
    const char *t = r->text.p ? r->text.p : "";
    json_buf part, item, b;
    json_buf_init(&part);
    json_buf_init(&item);
    json_buf_init(&b);
    json_buf_puts(&part, reasoning ? "{\"type\":\"reasoning_text\",\"text\":" : "{\"type\":\"output_text\",\"text\":");
    json_write_string(&part, t, r->text.len);
    json_buf_puts(&part, reasoning ? "}" : ",\"annotations\":[],\"logprobs\":[]}");
    json_buf_puts(&item, "{\"id\":");
    put_str(&item, r->item_id);
    if (reasoning) {
        /* the tokens up to here (the think tags among them) */
        r->reasoning_tokens = j->n_gen;
        json_buf_puts(&item, ",\"type\":\"reasoning\",\"summary\":[],\"content\":[");
        json_buf_put(&item, part.p, part.len);
        json_buf_puts(&item, "]");
        if (r->include_enc) {
            json_buf_puts(&item, ",\"encrypted_content\":\"" ENC_PREFIX);
            b64_put(&item, t, r->text.len);
            json_buf_puts(&item, "\"");
        }
        json_buf_puts(&item, "}");
    } else {
        bprintf(&item, ",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[", status);
        json_buf_put(&item, part.p, part.len);
        json_buf_puts(&item, "]}");
    }
    if (j->stream) {
        ev_head(&b, j);
        json_buf_puts(&b, ",\"content_index\":0,\"text\":");
        json_write_string(&b, t, r->text.len);
        if (!reasoning) json_buf_puts(&b, ",\"logprobs\":[]");
        resp_event(j, reasoning ? "response.reasoning_text.done" : "response.output_text.done", &b);
        b.len = 0;
        ev_head(&b, j);
        json_buf_puts(&b, ",\"content_index\":0,\"part\":");
        json_buf_put(&b, part.p, part.len);
        resp_event(j, "response.content_part.done", &b);
        b.len = 0;
        bprintf(&b, ",\"output_index\":%d,\"item\":", r->n_items);
        json_buf_put(&b, item.p, item.len);
        resp_event(j, "response.output_item.done", &b);
    }
    put_sep(&r->items);
    json_buf_put(&r->items, item.p, item.len);
    r->n_items++;
    r->open = RI_NONE;
    json_buf_free(&part);
    json_buf_free(&item);
    json_buf_free(&b);
}

void resp_text(job *j, int ch, const char *s, size_t n)
{
    resp_job *r = j->rj;
    int kind = ch == CH_REASONING ? RI_REASONING : RI_MESSAGE;
    if (r->open != kind) {
        item_close(j, "completed");
        item_open(j, kind);
    }
    json_buf_put(&r->text, s, n);
    json_buf_put(kind == RI_REASONING ? &r->reasoning : &r->content, s, n);
    if (!j->stream) return;
    json_buf b;
    json_buf_init(&b);
    ev_head(&b, j);
    json_buf_puts(&b, ",\"content_index\":0,\"delta\":");
    json_write_string(&b, s, n);
    if (kind == RI_MESSAGE) json_buf_puts(&b, ",\"logprobs\":[]");
    resp_event(j, kind == RI_REASONING ? "response.reasoning_text.delta" : "response.output_text.delta", &b);
    json_buf_free(&b);
}

/* The namespace a rendered call name belongs to: its length, or 0. */
static size_t ns_of(const resp_job *r, const char *name)
{
    for (int i = 0; i < r->n_ns; i++)
        if (!strcmp(r->ns[i].flat, name)) return r->ns[i].ns_len;
    return 0;
}

/* ,"call_id":..,"name":..[,"namespace":..] of a call rendered as flat */
static void call_fields(json_buf *b, const resp_job *r, const char *flat)
{
    size_t nl = ns_of(r, flat);
    json_buf_puts(b, ",\"call_id\":");
    put_str(b, r->call_id);
    json_buf_puts(b, ",\"name\":");
    put_str(b, flat + (nl ? nl + 2 : 0));
    if (nl) {
        json_buf_puts(b, ",\"namespace\":");
        json_write_string(b, flat, nl);
    }
}

void resp_call_begin(job *j, int idx, const char *name)
{
    resp_job *r = j->rj;
    item_close(j, "completed");
    item_id(j, "fc");
    snprintf(r->call_id, sizeof r->call_id, "call_%s_%d", j->id + 5, idx);
    r->open = RI_CALL;
    r->text.len = 0;
    json_buf_puts(&r->text, name);  /* the flat name until the call ends */
    json_buf_putc(&r->text, 0);
    if (!j->stream) return;
    json_buf b;
    json_buf_init(&b);
    bprintf(&b, ",\"output_index\":%d,\"item\":{\"id\":", r->n_items);
    put_str(&b, r->item_id);
    json_buf_puts(&b, ",\"type\":\"function_call\",\"status\":\"in_progress\",\"arguments\":\"\"");
    call_fields(&b, r, name);
    json_buf_puts(&b, "}");
    resp_event(j, "response.output_item.added", &b);
    json_buf_free(&b);
}

void resp_call_end(job *j, const char *args, size_t n)
{
    resp_job *r = j->rj;
    if (r->open != RI_CALL) return;
    const char *flat = r->text.p;
    size_t nl = ns_of(r, flat);
    json_buf item, b;
    json_buf_init(&item);
    json_buf_init(&b);
    json_buf_puts(&item, "{\"id\":");
    put_str(&item, r->item_id);
    json_buf_puts(&item, ",\"type\":\"function_call\",\"status\":\"completed\",\"arguments\":");
    json_write_string(&item, args, n);
    call_fields(&item, r, flat);
    json_buf_puts(&item, "}");
    if (j->stream) {
        ev_head(&b, j);
        json_buf_puts(&b, ",\"delta\":");
        json_write_string(&b, args, n);
        resp_event(j, "response.function_call_arguments.delta", &b);
        b.len = 0;
        ev_head(&b, j);
        json_buf_puts(&b, ",\"name\":");
        put_str(&b, flat + (nl ? nl + 2 : 0));
        json_buf_puts(&b, ",\"arguments\":");
        json_write_string(&b, args, n);
        resp_event(j, "response.function_call_arguments.done", &b);
        b.len = 0;
        bprintf(&b, ",\"output_index\":%d,\"item\":", r->n_items);
        json_buf_put(&b, item.p, item.len);
        resp_event(j, "response.output_item.done", &b);
    }
    /* the assistant message the store keeps renders the flat name */
    if (r->n_calls++) json_buf_putc(&r->calls, ',');
    json_buf_puts(&r->calls, "{\"id\":");
    put_str(&r->calls, r->call_id);
    json_buf_puts(&r->calls, ",\"type\":\"function\",\"function\":{\"name\":");
    put_str(&r->calls, flat);
    json_buf_puts(&r->calls, ",\"arguments\":");
    json_write_string(&r->calls, args, n);
    json_buf_puts(&r->calls, "}}");
    put_sep(&r->items);
    json_buf_put(&r->items, item.p, item.len);
    r->n_items++;
    r->open = RI_NONE;
    json_buf_free(&item);
    json_buf_free(&b);
}

/* The end: the terminal event (response.completed / .incomplete / .failed)
 * or the whole body; a completed or cut reply is stored when asked. */
void resp_finish(job *j)
{
    resp_job *r = j->rj;
    json_buf b;
    json_buf_init(&b);
    int incomplete = j->fin == FIN_LENGTH || j->fin == FIN_TIMEOUT;
    if (j->fin != FIN_ERROR) item_close(j, incomplete ? "incomplete" : "completed");
    if (r->open == RI_CALL) resp_call_end(j, "{}", 2);
    const char *status = j->fin == FIN_ERROR ? "failed" : incomplete ? "incomplete" : "completed";
    if (j->fin != FIN_ERROR && r->store && j->S->rstore) {
        json_buf c;
        json_buf_init(&c);
        json_buf_put(&c, r->conv.p, r->conv.len);
        asst a = {.open = 1, .has_reason = r->reasoning.len > 0, .reason = r->reasoning, .content = r->content,
                  .calls = r->calls, .n_calls = r->n_calls};
        asst_flush(&a, &c);
        store_put(j->S->rstore, j->id, c.p, c.len);
    }
    if (j->stream) {
        json_buf_puts(&b, ",\"response\":");
        response_object(&b, j, status, j->fin == FIN_ERROR ? "server_error" : NULL, j->errmsg);
        resp_event(j, j->fin == FIN_ERROR ? "response.failed" : incomplete ? "response.incomplete" : "response.completed",
                   &b);
        b.len = 0;
    } else if (j->fin == FIN_ERROR) {
        rq_err e = {0};
        rq_fail(&e, 500, NULL, "%s", j->errmsg);
        error_body(&b, j->api, &e);
    } else {
        response_object(&b, j, status, NULL, NULL);
    }
    emit_last(j, &b);
}

/* A stream refused at validation whose client wants events, not a 4xx
 * (Codex reads a too-long prompt as response.failed with
 * context_length_exceeded): created, then failed.  Into out. */
void resp_failed_stream(srv *S, const rq_err *e, json_buf *out)
{
    job j;
    resp_job r;
    memset(&j, 0, sizeof j);
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    j.S = S;
    j.rj = &r;
    j.created = (long)time(NULL);
    j.model = (char *)(uintptr_t)S->name;
    unsigned long seq = atomic_fetch_add(&S->job_counter, 1) + 1;
    snprintf(j.id, sizeof j.id, "resp_%08lx%08lx", (unsigned long)(j.created & 0xffffffff), seq);
    json_buf_puts(&r.echo, ",\"tools\":[]");
    json_buf b;
    json_buf_init(&b);
    json_buf_puts(&b, ",\"response\":");
    response_object(&b, &j, "in_progress", NULL, NULL);
    resp_event(&j, "response.created", &b);
    b.len = 0;
    json_buf_puts(&b, ",\"response\":");
    response_object(&b, &j, "failed", e->code ? e->code : "invalid_request", e->msg);
    resp_event(&j, "response.failed", &b);
    json_buf_put(out, j.out.p, j.out.len);
    json_buf_free(&b);
    json_buf_free(&j.out);
    json_buf_free(&r.echo);
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv);
}
