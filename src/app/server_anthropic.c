/* server_anthropic.c - the Anthropic Messages API (L5): a /v1/messages body
 * becomes chat_render's OpenAI-shaped messages, rendered and tokenized on
 * the connection thread like the other APIs (server_request.c).
 *
 * What current Claude Code sends is applied, not skipped (README, "Coding
 * agents"); what cannot be applied exactly is refused by name:
 *   thinking      enabled (budget -> effort), disabled, adaptive (K3 thinks;
 *                 effort "high" unless output_config says); display
 *                 "omitted": generated, returned as an empty thinking block
 *                 whose signature carries it; "summarized": the full text
 *                 (K3 has no summariser).
 *   output_config.effort   low -> low; medium, high -> high; xhigh, max ->
 *                 max (k3_effort); format and task_budget: refused by name.
 *   context_management.edits   clear_thinking_20251015 (keep "all" | N
 *                 turns; default without the edit: the last turn's, as
 *                 Anthropic documents) and clear_tool_uses_20250919
 *                 (trigger, keep, clear_at_least, exclude_tools,
 *                 clear_tool_inputs) are applied to what is rendered; the
 *                 response reports applied_edits with exact token counts
 *                 (the prompt rendered with and without the edit).
 *                 compact_*: refused (needs a summarisation pass).
 *   role "system" messages   rendered where they stand as K3 system turns;
 *                 clear_at "next_user_message" drops one a later user
 *                 message follows.
 *   tools         defer_loading keeps a tool out of the prompt until a
 *                 tool_result holds a tool_reference to it; it is then
 *                 declared right there with K3's lazy-loading form (a
 *                 system turn carrying tools: "New Tools Available").
 *                 input_examples are rendered inside the declaration;
 *                 cache_control and eager_input_streaming change no token
 *                 (the prompt cache is automatic; tool input is sent when
 *                 the call ends either way); strict: true enforces the
 *                 tool's input_schema on its calls (server_grammar.c).
 *   the billing line   a system block starting "x-anthropic-billing-header:"
 *                 (Claude Code's, different in every session) is left out
 *                 of the prompt unless serve --keep-billing-header: it is
 *                 not for the model, and it would end the prefix that two
 *                 sessions share.
 * A thinking block's signature is SIG_PREFIX + base64 of its text: not a
 * secret (the text is the model's own output), but what lets a later
 * request render exactly the tokens the model produced, so its prefix is
 * reused even when the client was never shown the text.
 */
#define _GNU_SOURCE
#include "server_impl.h"

#include <limits.h>

#define SIG_PREFIX "dfk3.1."
#define BILLING_PREFIX "x-anthropic-billing-header:"
#define CLEARED_RESULT "[tool result cleared by context management]"
#define MAX_ANTH_TOOLS 1024

typedef struct anth_tool {
    const char *name;
    int deferred, loaded;
    size_t off, len;            /* its OpenAI-shaped declaration in conv.defs */
} anth_tool;

typedef struct clear_ent {
    const char *id;             /* tool_use id whose result is replaced */
    int input;                  /* its input blanked too */
} clear_ent;

typedef struct anth_conv {
    srv *S;
    int thinking;
    int keep_turns;             /* assistant turns with thinking whose thinking is rendered (from the last) */
    int n_think;                /* assistant messages with thinking */
    size_t last_user;           /* index of the last user message (SIZE_MAX: none) */
    const char *turn_effort;    /* the last system message's output_config.effort, as K3 spells it */
    anth_tool *tools;
    int n_tools;
    json_buf defs;
    clear_ent *clear;
    int n_clear;
} anth_conv;

/* ---- signatures -------------------------------------------------------- */

void anth_signature(json_buf *b, const char *text, size_t n)
{
    char *enc = xmalloc(4 * (n / 3 + 1) + 1);
    b64_encode((const unsigned char *)text, n, enc);
    json_buf_puts(b, "\"" SIG_PREFIX);
    json_buf_puts(b, enc);
    json_buf_puts(b, "\"");
    free(enc);
}

/* The text a thinking block stands for: its signature's when the signature
 * is ours (the text, if sent too, must be the same), else the text sent. */
static int thinking_text(const json_value *b, const char *where, size_t k, json_buf *out, rq_err *e)
{
    const json_value *t = json_get(b, "thinking"), *sig = json_get(b, "signature");
    if (t && t->type != JSON_STRING)
        return rq_fail(e, 400, where, "%s.content[%zu].thinking: expected a string", where, k);
    if (sig && sig->type == JSON_STRING && !strncmp(sig->str, SIG_PREFIX, strlen(SIG_PREFIX))) {
        const char *s = sig->str + strlen(SIG_PREFIX);
        size_t n = sig->len - strlen(SIG_PREFIX);
        unsigned char *dec = xmalloc(n / 4 * 3 + 1);
        long got = n ? b64_decode((const unsigned char *)s, n, dec) : 0;
        int ok = got >= 0 && (!t || !t->len || ((size_t)got == t->len && !memcmp(dec, t->str, t->len)));
        if (ok) json_buf_put(out, (const char *)dec, (size_t)got);
        free(dec);
        if (!ok)
            return rq_fail(e, 400, where, "%s.content[%zu].signature: %s", where, k,
                           got < 0 ? "not a signature this server wrote" : "the thinking text was changed");
        return 0;
    }
    if (t) json_buf_put(out, t->str, t->len);
    return 0;
}

/* ---- text blocks -------------------------------------------------------- */

static int is_billing(const char *s, size_t n)
{
    return n >= strlen(BILLING_PREFIX) && !memcmp(s, BILLING_PREFIX, strlen(BILLING_PREFIX));
}

/* Text of a string or an array of text blocks (cache_control accepted: it
 * changes no token).  billing: leave Claude Code's billing line out. */
static int anth_text(const json_value *v, const char *where, int billing, json_buf *out, rq_err *e)
{
    if (v->type == JSON_STRING) {
        const char *s = v->str;
        size_t n = v->len;
        if (billing && is_billing(s, n)) {
            const char *nl = memchr(s, '\n', n);
            n = nl ? n - (size_t)(nl + 1 - s) : 0;
            s = nl ? nl + 1 : s;
        }
        json_buf_put(out, s, n);
        return 0;
    }
    if (v->type != JSON_ARRAY) return rq_fail(e, 400, where, "%s: expected a string or an array of blocks", where);
    for (size_t i = 0; i < v->len; i++) {
        const json_value *b = v->items[i];
        const char *t = json_get_str(b, "type");
        if (!t) return rq_fail(e, 400, where, "%s[%zu]: a block needs a type", where, i);
        if (!strcmp(t, "text")) {
            const json_value *x = json_get(b, "text");
            if (!x || x->type != JSON_STRING) return rq_fail(e, 400, where, "%s[%zu].text: expected a string", where, i);
            if (billing && is_billing(x->str, x->len)) continue;
            json_buf_put(out, x->str, x->len);
        } else {
            return rq_fail(e, 400, where, "%s[%zu]: block type \"%.*s\" is not supported here (text only)", where, i,
                           (int)utf8_cut(t, strlen(t), 40), t);
        }
    }
    return 0;
}

/* ---- tools --------------------------------------------------------------- */

static int find_tool(const anth_conv *cv, const char *name)
{
    for (int i = 0; i < cv->n_tools; i++)
        if (!strcmp(cv->tools[i].name, name)) return i;
    return -1;
}

/* Each tool checked and declared (OpenAI-shaped, into cv->defs). */
static int anth_tools(const json_value *o, anth_conv *cv, rq_err *e)
{
    static const char *const allowed[] = {"name", "description", "input_schema", "type", "cache_control",
                                          "defer_loading", "strict", "input_examples", "eager_input_streaming", NULL};
    const json_value *tools = field(o, "tools");
    if (!tools) return 0;
    if (tools->type != JSON_ARRAY) return rq_fail(e, 400, "tools", "tools: expected an array");
    if (tools->len > MAX_ANTH_TOOLS) return rq_fail(e, 400, "tools", "tools: at most %d tools", MAX_ANTH_TOOLS);
    cv->tools = xcalloc(tools->len ? tools->len : 1, sizeof *cv->tools);
    for (size_t i = 0; i < tools->len; i++) {
        const json_value *t = tools->items[i];
        if (t->type != JSON_OBJECT)
            return rq_fail(e, 400, "tools", "tools[%zu]: expected an object, got %s", i, json_type_name(t->type));
        const char *type = json_get_str(t, "type");
        if (type && strcmp(type, "custom"))
            return rq_fail(e, 400, "tools", "tools[%zu].type: \"%.*s\" is a tool the API would run; this server runs "
                           "none (client tools only: type \"custom\" or none)", i, (int)utf8_cut(type, strlen(type), 60),
                           type);
        if (check_fields(t, allowed, e)) return -1;
        const char *name = json_get_str(t, "name");
        const json_value *schema = json_get(t, "input_schema"), *desc = json_get(t, "description"),
                         *ex = field(t, "input_examples");
        if (!name || !*name || !schema)
            return rq_fail(e, 400, "tools", "tools[%zu]: expected a client tool with name and input_schema", i);
        if (schema->type != JSON_OBJECT)
            return rq_fail(e, 400, "tools", "tools[%zu].input_schema: expected a JSON Schema object, got %s", i,
                           json_type_name(schema->type));
        if (desc && desc->type != JSON_STRING && desc->type != JSON_NULL)
            return rq_fail(e, 400, "tools", "tools[%zu].description: expected a string", i);
        if (ex && ex->type != JSON_ARRAY)
            return rq_fail(e, 400, "tools", "tools[%zu].input_examples: expected an array", i);
        int strict = 0, deferred = 0, eager = 0;
        if (get_bool(t, "strict", &strict, e) || get_bool(t, "defer_loading", &deferred, e) ||
            get_bool(t, "eager_input_streaming", &eager, e))
            return -1;
        if (find_tool(cv, name) >= 0)
            return rq_fail(e, 400, "tools", "tools[%zu].name: \"%.*s\" is declared twice", i,
                           (int)utf8_cut(name, strlen(name), 60), name);
        anth_tool *at = &cv->tools[cv->n_tools++];
        at->name = name;
        at->deferred = deferred;
        at->off = cv->defs.len;
        json_buf_puts(&cv->defs, "{\"type\":\"function\",\"function\":{\"name\":");
        put_str(&cv->defs, name);
        if (desc && desc->type == JSON_STRING) {
            json_buf_puts(&cv->defs, ",\"description\":");
            json_write_string(&cv->defs, desc->str, desc->len);
        }
        json_buf_puts(&cv->defs, ",\"parameters\":");
        json_write_value(&cv->defs, schema, 0);
        if (strict) json_buf_puts(&cv->defs, ",\"strict\":true"); /* its calls' arguments are enforced */
        if (ex) {
            json_buf_puts(&cv->defs, ",\"input_examples\":");
            json_write_value(&cv->defs, ex, 0);
        }
        json_buf_puts(&cv->defs, "}}");
        at->len = cv->defs.len - at->off;
    }
    return 0;
}

/* ---- messages ----------------------------------------------------------- */

static const clear_ent *cleared(const anth_conv *cv, const char *id)
{
    for (int i = 0; id && i < cv->n_clear; i++)
        if (!strcmp(cv->clear[i].id, id)) return &cv->clear[i];
    return NULL;
}

static void anth_sep(json_buf *d, int *first)
{
    if (!*first) json_buf_puts(d, ",");
    *first = 0;
}

/* A tool_result's content: text, and tool_reference blocks that load a
 * deferred tool (its index appended to load[]). */
static int tool_result_text(anth_conv *cv, const json_value *v, const char *where, json_buf *out, int *load,
                            int *n_load, rq_err *e)
{
    if (v->type != JSON_ARRAY) return anth_text(v, where, 0, out, e);
    for (size_t i = 0; i < v->len; i++) {
        const json_value *b = v->items[i];
        const char *t = json_get_str(b, "type");
        if (t && !strcmp(t, "tool_reference")) {
            const char *name = json_get_str(b, "tool_name");
            int ti = name ? find_tool(cv, name) : -1;
            if (ti < 0)
                return rq_fail(e, 400, where, "%s[%zu]: tool_reference to \"%.*s\", which is not in tools "
                               "(tool_reference_unresolved)", where, i, name ? (int)utf8_cut(name, strlen(name), 60) : 0,
                               name ? name : "");
            if (cv->tools[ti].deferred && !cv->tools[ti].loaded) {
                cv->tools[ti].loaded = 1;
                load[(*n_load)++] = ti;
            }
            continue;
        }
        const json_value *x = t && !strcmp(t, "text") ? json_get(b, "text") : NULL;
        if (!t) return rq_fail(e, 400, where, "%s[%zu]: a block needs a type", where, i);
        if (!strcmp(t, "document")) {
            if (anth_document(cv->S, b, where, i, out, e)) return -1;
            continue;
        }
        if (strcmp(t, "text"))
            return rq_fail(e, 400, where, "%s[%zu]: block type \"%.*s\" is not supported in a tool result (text, "
                           "document and tool_reference)", where, i, (int)utf8_cut(t, strlen(t), 40), t);
        if (!x || x->type != JSON_STRING) return rq_fail(e, 400, where, "%s[%zu].text: expected a string", where, i);
        json_buf_put(out, x->str, x->len);
    }
    return 0;
}

/* A system turn from `system` or a system message (the billing line left out). */
static int system_turn(const anth_conv *cv, const json_value *v, const char *where, json_buf *d, int *first, rq_err *e)
{
    json_buf t;
    json_buf_init(&t);
    int rc = anth_text(v, where, !cv->S->keep_billing, &t, e);
    if (!rc) {
        anth_sep(d, first);
        put_message(d, "system", NULL, t.p, t.len);
    }
    json_buf_free(&t);
    return rc;
}

/* Map the request onto {"messages": [...], "tools": [...], "tool_choice": ...}. */
static int anth_convert(const json_value *o, anth_conv *cv, json_buf *d, rq_err *e)
{
    for (int i = 0; i < cv->n_tools; i++) cv->tools[i].loaded = 0;
    json_buf_puts(d, "{\"messages\":[");
    int first = 1;
    const json_value *sys = field(o, "system");
    if (sys && system_turn(cv, sys, "system", d, &first, e)) return -1;
    const json_value *msgs = json_get(o, "messages");
    int think_idx = 0;
    int *load = xmalloc((size_t)(cv->n_tools ? cv->n_tools : 1) * sizeof *load);
    int rc = 0;
    for (size_t i = 0; !rc && i < msgs->len; i++) {
        const json_value *m = msgs->items[i];
        const char *role = json_get_str(m, "role");
        const json_value *c = json_get(m, "content");
        char where[48];
        snprintf(where, sizeof where, "messages[%zu]", i);
        if (!strcmp(role, "system")) {
            const char *clear_at = json_get_str(m, "clear_at");
            if (clear_at && !strcmp(clear_at, "next_user_message") && cv->last_user != SIZE_MAX && cv->last_user > i)
                continue;
            rc = system_turn(cv, c, where, d, &first, e);
            continue;
        }
        int user = !strcmp(role, "user");
        json_buf text, calls, think;
        json_buf_init(&text);
        json_buf_init(&calls);
        json_buf_init(&think);
        int n_calls = 0, has_text = 0, has_think = 0, n_load = 0;
        if (c->type == JSON_STRING) {
            json_buf_put(&text, c->str, c->len);
            has_text = 1;
        }
        for (size_t k = 0; !rc && c->type == JSON_ARRAY && k < c->len; k++) {
            const json_value *b = c->items[k];
            const char *t = json_get_str(b, "type");
            if (!strcmp(t, "text")) {
                const json_value *x = json_get(b, "text");
                json_buf_put(&text, x->str, x->len);
                has_text = 1;
            } else if (user && !strcmp(t, "document")) {
                rc = anth_document(cv->S, b, where, k, &text, e);
                has_text = 1;
            } else if (!user && !strcmp(t, "thinking")) {
                rc = thinking_text(b, where, k, &think, e);
                has_think = 1;
            } else if (!user && !strcmp(t, "redacted_thinking")) {
                /* another model's encrypted thinking: nothing this server can render */
            } else if (!user && !strcmp(t, "tool_use")) {
                const char *id = json_get_str(b, "id"), *name = json_get_str(b, "name");
                const json_value *in = json_get(b, "input");
                const clear_ent *ce = cleared(cv, id);
                json_buf args;
                json_buf_init(&args);
                if (ce && ce->input) json_buf_puts(&args, "{}");
                else json_write_value(&args, in, 0);
                json_buf_puts(&calls, n_calls++ ? ",{\"id\":" : "{\"id\":");
                put_str(&calls, id);
                json_buf_puts(&calls, ",\"type\":\"function\",\"function\":{\"name\":");
                put_str(&calls, name);
                json_buf_puts(&calls, ",\"arguments\":");
                json_write_string(&calls, args.p, args.len);
                json_buf_puts(&calls, "}}");
                json_buf_free(&args);
            } else if (user && !strcmp(t, "tool_result")) {
                const char *id = json_get_str(b, "tool_use_id");
                const json_value *rv = field(b, "content");
                json_buf r;
                json_buf_init(&r);
                if (rv) rc = tool_result_text(cv, rv, where, &r, load, &n_load, e);
                if (!rc) {
                    anth_sep(d, &first);
                    if (cleared(cv, id)) put_message(d, "tool", id, CLEARED_RESULT, strlen(CLEARED_RESULT));
                    else put_message(d, "tool", id, r.p, r.len);
                }
                json_buf_free(&r);
            }
        }
        if (!rc && n_load) {
            /* K3's lazy-loading form: a system turn declaring the tools just loaded */
            anth_sep(d, &first);
            json_buf_puts(d, "{\"role\":\"system\",\"content\":\"\",\"tools\":[");
            for (int l = 0; l < n_load; l++) {
                if (l) json_buf_puts(d, ",");
                json_buf_put(d, cv->defs.p + cv->tools[load[l]].off, cv->tools[load[l]].len);
            }
            json_buf_puts(d, "]}");
        }
        if (!rc && (has_text || n_calls || !user)) {
            anth_sep(d, &first);
            json_buf_puts(d, "{\"role\":");
            put_str(d, role);
            json_buf_puts(d, ",\"content\":");
            json_write_string(d, text.p ? text.p : "", text.len);
            if (has_think && think_idx++ >= cv->n_think - cv->keep_turns && think.len) {
                json_buf_puts(d, ",\"reasoning_content\":");
                json_write_string(d, think.p, think.len);
            }
            if (n_calls) {
                json_buf_puts(d, ",\"tool_calls\":[");
                json_buf_put(d, calls.p, calls.len);
                json_buf_puts(d, "]");
            }
            json_buf_puts(d, "}");
        }
        json_buf_free(&text);
        json_buf_free(&calls);
        json_buf_free(&think);
    }
    free(load);
    if (rc) return -1;
    json_buf_puts(d, "]");
    int n_eager = 0;
    for (int i = 0; i < cv->n_tools; i++) n_eager += !cv->tools[i].deferred;
    if (n_eager) {
        json_buf_puts(d, ",\"tools\":[");
        for (int i = 0, n = 0; i < cv->n_tools; i++) {
            if (cv->tools[i].deferred) continue;
            if (n++) json_buf_puts(d, ",");
            json_buf_put(d, cv->defs.p + cv->tools[i].off, cv->tools[i].len);
        }
        json_buf_puts(d, "]");
    }
    const json_value *tc = field(o, "tool_choice");
    if (tc) {
        static const char *const tc_allowed[] = {"type", "name", "disable_parallel_tool_use", NULL};
        const char *t = json_get_str(tc, "type");
        const char *m = !t ? NULL : !strcmp(t, "auto") ? "auto" : !strcmp(t, "any") ? "required"
                      : !strcmp(t, "none") ? "none" : !strcmp(t, "tool") ? "tool" : NULL;
        if (!m) return rq_fail(e, 400, "tool_choice", "tool_choice.type: expected \"auto\", \"any\", \"tool\" or "
                               "\"none\"");
        if (check_fields(tc, tc_allowed, e)) return -1;
        json_buf_puts(d, ",\"tool_choice\":");
        if (!strcmp(m, "tool")) {
            const char *name = json_get_str(tc, "name");
            if (!name) return rq_fail(e, 400, "tool_choice", "tool_choice.name: a tool's name is required with type "
                                      "\"tool\"");
            json_buf_puts(d, "{\"type\":\"function\",\"function\":{\"name\":");
            put_str(d, name);
            json_buf_puts(d, "}}");
        } else {
            put_str(d, m);
        }
    }
    json_buf_puts(d, "}");
    return 0;
}

/* The shapes anth_convert relies on, checked once; counts the thinking
 * turns and finds the last user message. */
static int anth_check(const json_value *o, anth_conv *cv, rq_err *e)
{
    const json_value *msgs = json_get(o, "messages");
    if (!msgs || msgs->type != JSON_ARRAY || !msgs->len)
        return rq_fail(e, 400, "messages", "messages: expected a non-empty array");
    cv->last_user = SIZE_MAX;
    for (size_t i = 0; i < msgs->len; i++) {
        const json_value *m = msgs->items[i];
        const char *role = m->type == JSON_OBJECT ? json_get_str(m, "role") : NULL;
        const json_value *c = m->type == JSON_OBJECT ? json_get(m, "content") : NULL;
        char where[48];
        snprintf(where, sizeof where, "messages[%zu]", i);
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
            return rq_fail(e, 400, where, "%s.role: expected \"user\", \"assistant\" or \"system\"", where);
        if (!c) return rq_fail(e, 400, where, "%s.content: missing", where);
        if (c->type != JSON_STRING && c->type != JSON_ARRAY)
            return rq_fail(e, 400, where, "%s.content: expected a string or an array of blocks", where);
        if (!strcmp(role, "system")) {
            static const char *const sys_allowed[] = {"role", "content", "clear_at", "cache_control", "output_config",
                                                      NULL};
            static const char *const oc_allowed[] = {"effort", NULL};
            if (check_fields(m, sys_allowed, e)) return -1;
            const json_value *oc = field(m, "output_config");
            if (oc) {
                /* a per-turn effort: the last one sent is the effort of the turn generated now */
                const json_value *ef = oc->type == JSON_OBJECT ? field(oc, "effort") : NULL;
                int off = 0;
                const char *k3 = ef && ef->type == JSON_STRING && strcmp(ef->str, "none") && strcmp(ef->str, "minimal")
                                     ? k3_effort(ef->str, &off) : NULL;
                if (oc->type != JSON_OBJECT || check_fields(oc, oc_allowed, e) || (ef && !k3))
                    return e->status ? -1 : rq_fail(e, 400, where, "%s.output_config: expected {\"effort\": low, medium, "
                                                    "high, xhigh or max}", where);
                if (k3) cv->turn_effort = k3;
            }
            const json_value *ca = field(m, "clear_at");
            if (ca && (ca->type != JSON_STRING || (strcmp(ca->str, "never") && strcmp(ca->str, "next_user_message"))))
                return rq_fail(e, 400, where, "%s.clear_at: expected \"never\" or \"next_user_message\"", where);
            continue;
        }
        int user = !strcmp(role, "user"), think = 0;
        if (user) cv->last_user = i;
        for (size_t k = 0; c->type == JSON_ARRAY && k < c->len; k++) {
            const json_value *b = c->items[k];
            const char *t = b->type == JSON_OBJECT ? json_get_str(b, "type") : NULL;
            if (!t) return rq_fail(e, 400, where, "%s.content[%zu]: a block needs a type", where, k);
            if (!strcmp(t, "text")) {
                const json_value *x = json_get(b, "text");
                if (!x || x->type != JSON_STRING)
                    return rq_fail(e, 400, where, "%s.content[%zu].text: expected a string", where, k);
            } else if (!user && (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking"))) {
                think |= !strcmp(t, "thinking");
            } else if (!user && !strcmp(t, "tool_use")) {
                const char *id = json_get_str(b, "id"), *name = json_get_str(b, "name");
                const json_value *in = json_get(b, "input");
                if (!id || !name || !in || in->type != JSON_OBJECT)
                    return rq_fail(e, 400, where, "%s.content[%zu]: tool_use needs id, name and an input object", where,
                                   k);
            } else if (user && !strcmp(t, "document")) {
                /* checked where it is rendered (server_docs.c) */
            } else if (user && !strcmp(t, "tool_result")) {
                if (!json_get_str(b, "tool_use_id"))
                    return rq_fail(e, 400, where, "%s.content[%zu].tool_use_id: missing", where, k);
            } else {
                return rq_fail(e, 400, where, "%s.content[%zu]: block type \"%.*s\" is not supported (K3 here is "
                               "text-only)", where, k, (int)utf8_cut(t, strlen(t), 40), t);
            }
        }
        cv->n_think += think;
    }
    return 0;
}

/* Convert, render and encode into j->ids (replacing what was there). */
static int anth_build(srv *S, job *j, const json_value *o, anth_conv *cv, chat_options *co, rq_err *e)
{
    free(j->ids);
    j->ids = NULL;
    j->n_ids = 0;
    json_buf d;
    json_buf_init(&d);
    int rc = anth_convert(o, cv, &d, e);
    if (!rc) {
        df_error err = {0};
        json_doc *doc = json_parse(d.p, d.len, &err);
        if (!doc) {
            /* the converted request nests one level deeper than the one
             * sent: a request at the reader's depth limit ends here */
            json_buf_free(&d);
            return rq_fail(e, 400, "messages",
                           "the request cannot be converted: %s (JSON nesting is limited to %d levels, and a "
                           "tool's input_schema or a content block is nested one level deeper in conversion)",
                           err.msg, JSON_MAX_DEPTH);
        }
        const json_value *r = json_root(doc);
        co->tools = json_get(r, "tools");
        co->tool_choice = json_get(r, "tool_choice");
        rc = render_encode(S, j, json_get(r, "messages"), co, e);
        co->tools = co->tool_choice = NULL;
        json_free(doc);
    }
    json_buf_free(&d);
    return rc;
}

/* ---- context_management ------------------------------------------------- */

typedef struct edits {
    int think_edit;             /* a clear_thinking edit was sent (its keep in keep_turns) */
    int keep_turns;
    int tools_edit;             /* a clear_tool_uses edit was sent: */
    int trig_uses;              /* trigger counts tool uses (else input tokens) */
    int64_t trigger, keep_uses, at_least;
    const json_value *exclude, *clear_inputs;
    int order_tools_first;      /* the tool edit was listed before the thinking edit */
} edits;

static int typed_value(const json_value *v, const char *where, const char *const *types, int *type_idx, int64_t lo,
                       int64_t *out, rq_err *e)
{
    static const char *const allowed[] = {"type", "value", NULL};
    if (v->type != JSON_OBJECT) return rq_fail(e, 400, "context_management", "%s: expected an object", where);
    if (check_fields(v, allowed, e)) return -1;
    const char *t = json_get_str(v, "type");
    int k = -1;
    for (int i = 0; t && types[i]; i++)
        if (!strcmp(t, types[i])) k = i;
    if (k < 0) return rq_fail(e, 400, "context_management", "%s.type: expected \"%s\"%s%s%s", where, types[0],
                              types[1] ? " or \"" : "", types[1] ? types[1] : "", types[1] ? "\"" : "");
    if (type_idx) *type_idx = k;
    int set = 0;
    if (get_int(v, "value", lo, INT32_MAX, out, &set, e)) return -1;
    if (!set) return rq_fail(e, 400, "context_management", "%s.value: missing", where);
    return 0;
}

static int parse_edits(const json_value *o, int thinking, edits *ed, rq_err *e)
{
    memset(ed, 0, sizeof *ed);
    ed->keep_turns = 1;
    const json_value *cm = field(o, "context_management");
    if (!cm) return 0;
    static const char *const cm_allowed[] = {"edits", NULL};
    if (cm->type != JSON_OBJECT) return rq_fail(e, 400, "context_management", "context_management: expected an object");
    if (check_fields(cm, cm_allowed, e)) return -1;
    const json_value *list = field(cm, "edits");
    if (list && list->type != JSON_ARRAY)
        return rq_fail(e, 400, "context_management", "context_management.edits: expected an array");
    for (size_t i = 0; list && i < list->len; i++) {
        const json_value *ed_v = list->items[i];
        char where[64];
        snprintf(where, sizeof where, "context_management.edits[%zu]", i);
        const char *t = ed_v->type == JSON_OBJECT ? json_get_str(ed_v, "type") : NULL;
        if (!t) return rq_fail(e, 400, "context_management", "%s: expected an object with a type", where);
        if (!strcmp(t, "clear_thinking_20251015")) {
            static const char *const allowed[] = {"type", "keep", NULL};
            if (check_fields(ed_v, allowed, e)) return -1;
            if (!thinking)
                return rq_fail(e, 400, "context_management", "%s: clear_thinking_20251015 needs thinking enabled", where);
            if (ed->think_edit) return rq_fail(e, 400, "context_management", "%s: a second clear_thinking edit", where);
            ed->think_edit = 1;
            const json_value *keep = field(ed_v, "keep");
            const char *kt = keep && keep->type == JSON_OBJECT ? json_get_str(keep, "type") : NULL;
            if (!keep) {
                ed->keep_turns = 1;
            } else if ((keep->type == JSON_STRING && !strcmp(keep->str, "all")) || (kt && !strcmp(kt, "all"))) {
                static const char *const all_allowed[] = {"type", NULL};
                if (keep->type == JSON_OBJECT && check_fields(keep, all_allowed, e)) return -1;
                ed->keep_turns = INT_MAX;
            } else {
                static const char *const turns[] = {"thinking_turns", NULL};
                int64_t v = 0;
                char w[96];
                snprintf(w, sizeof w, "%s.keep", where);
                if (keep->type == JSON_STRING)
                    return rq_fail(e, 400, "context_management", "%s: expected \"all\" or an object", w);
                if (typed_value(keep, w, turns, NULL, 1, &v, e)) return -1;
                ed->keep_turns = (int)v;
            }
        } else if (!strcmp(t, "clear_tool_uses_20250919")) {
            static const char *const allowed[] = {"type", "trigger", "keep", "clear_at_least", "exclude_tools",
                                                  "clear_tool_inputs", NULL};
            if (check_fields(ed_v, allowed, e)) return -1;
            if (ed->tools_edit) return rq_fail(e, 400, "context_management", "%s: a second clear_tool_uses edit", where);
            ed->tools_edit = 1;
            ed->order_tools_first = !ed->think_edit;
            ed->trigger = 100000;
            ed->keep_uses = 3;
            const json_value *v;
            char w[96];
            if ((v = field(ed_v, "trigger"))) {
                static const char *const types[] = {"input_tokens", "tool_uses", NULL};
                int k = 0;
                snprintf(w, sizeof w, "%s.trigger", where);
                if (typed_value(v, w, types, &k, 1, &ed->trigger, e)) return -1;
                ed->trig_uses = k == 1;
            }
            if ((v = field(ed_v, "keep"))) {
                static const char *const types[] = {"tool_uses", NULL};
                snprintf(w, sizeof w, "%s.keep", where);
                if (typed_value(v, w, types, NULL, 0, &ed->keep_uses, e)) return -1;
            }
            if ((v = field(ed_v, "clear_at_least"))) {
                static const char *const types[] = {"input_tokens", NULL};
                snprintf(w, sizeof w, "%s.clear_at_least", where);
                if (typed_value(v, w, types, NULL, 0, &ed->at_least, e)) return -1;
            }
            if ((v = field(ed_v, "exclude_tools"))) {
                for (size_t k = 0; v->type == JSON_ARRAY && k < v->len; k++)
                    if (v->items[k]->type != JSON_STRING) v = NULL;
                if (!v || v->type != JSON_ARRAY)
                    return rq_fail(e, 400, "context_management", "%s.exclude_tools: expected an array of names", where);
                ed->exclude = v;
            }
            if ((v = field(ed_v, "clear_tool_inputs"))) {
                int ok = v->type == JSON_BOOL || v->type == JSON_ARRAY;
                for (size_t k = 0; ok && v->type == JSON_ARRAY && k < v->len; k++) ok = v->items[k]->type == JSON_STRING;
                if (!ok)
                    return rq_fail(e, 400, "context_management", "%s.clear_tool_inputs: expected a boolean or an array "
                                   "of names", where);
                ed->clear_inputs = v;
            }
        } else if (!strncmp(t, "compact_", 8)) {
            return rq_fail(e, 400, "context_management", "%s: \"%.*s\" is not supported (compaction needs a "
                           "summarisation pass this server does not run; clear_tool_uses and clear_thinking are "
                           "applied)", where, (int)utf8_cut(t, strlen(t), 40), t);
        } else {
            return rq_fail(e, 400, "context_management", "%s.type: \"%.*s\" is not an edit this server knows "
                           "(clear_thinking_20251015, clear_tool_uses_20250919)", where,
                           (int)utf8_cut(t, strlen(t), 40), t);
        }
    }
    return 0;
}

static int name_in(const json_value *list, const char *name)
{
    for (size_t i = 0; list && list->type == JSON_ARRAY && i < list->len; i++)
        if (!strcmp(list->items[i]->str, name)) return 1;
    return 0;
}

/* The tool uses clear_tool_uses would clear now (oldest first, all but the
 * newest keep_uses, never an excluded tool's): into cv->clear. */
static void plan_tool_clearing(const json_value *o, const edits *ed, anth_conv *cv, int64_t *n_uses)
{
    const json_value *msgs = json_get(o, "messages");
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t seen = 0;
        for (size_t i = 0; i < msgs->len; i++) {
            const json_value *m = msgs->items[i], *c = json_get(m, "content");
            if (strcmp(json_get_str(m, "role"), "assistant") || c->type != JSON_ARRAY) continue;
            for (size_t k = 0; k < c->len; k++) {
                const json_value *b = c->items[k];
                if (strcmp(json_get_str(b, "type"), "tool_use")) continue;
                if (pass == 0) {
                    total++;
                    continue;
                }
                const char *name = json_get_str(b, "name");
                if (seen++ + (size_t)ed->keep_uses >= total || name_in(ed->exclude, name)) continue;
                clear_ent *ce = &cv->clear[cv->n_clear++];
                ce->id = json_get_str(b, "id");
                ce->input = ed->clear_inputs && (ed->clear_inputs->type == JSON_BOOL ? ed->clear_inputs->b
                                                                                     : name_in(ed->clear_inputs, name));
            }
        }
        if (pass == 0) cv->clear = xcalloc(total ? total : 1, sizeof *cv->clear);
    }
    *n_uses = (int64_t)total;
}

/* ---- the request ------------------------------------------------------- */

/* thinking: on or off, whether its text is returned, the effort its budget
 * asks for (K3 takes an effort level, not a budget) */
static int msg_thinking(const json_value *o, job *j, chat_options *co, const char **effort, rq_err *e)
{
    const json_value *th = field(o, "thinking");
    if (th) {
        const char *t = th->type == JSON_OBJECT ? json_get_str(th, "type") : NULL;
        if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive")))
            return rq_fail(e, 400, "thinking", "thinking.type: expected \"enabled\", \"adaptive\" or \"disabled\"");
        static const char *const en_allowed[] = {"type", "budget_tokens", "display", NULL};
        static const char *const ad_allowed[] = {"type", "display", NULL};
        static const char *const dis_allowed[] = {"type", NULL};
        if (check_fields(th, !strcmp(t, "enabled") ? en_allowed : !strcmp(t, "adaptive") ? ad_allowed : dis_allowed, e))
            return -1;
        const json_value *disp = field(th, "display");
        if (disp && (disp->type != JSON_STRING || (strcmp(disp->str, "summarized") && strcmp(disp->str, "omitted"))))
            return rq_fail(e, 400, "thinking", "thinking.display: expected \"summarized\" or \"omitted\" (K3 has no "
                           "summariser: \"summarized\" returns the whole thinking)");
        j->think_omit = disp && !strcmp(disp->str, "omitted");
        if (!strcmp(t, "enabled")) {
            int64_t budget = 0;
            co->thinking = 1;
            if (get_int(th, "budget_tokens", 1, INT32_MAX, &budget, NULL, e)) return -1;
            /* K3 takes an effort level, not a budget */
            *effort = !budget ? "max" : budget < 4096 ? "low" : budget < 16384 ? "high" : "max";
        } else if (!strcmp(t, "adaptive")) {
            co->thinking = 1;
            *effort = "high"; /* Anthropic's default effort */
        }
    }
    return 0;
}

/* output_config: an effort, and structured output (output_config.format,
 * or the earlier beta's output_format) as chat's response_format, enforced
 * by a grammar; *rf_doc owns the schema's copy */
static int msg_output_config(const json_value *o, chat_options *co, const char **effort, json_doc **rf_doc, rq_err *e)
{
    const json_value *oc = field(o, "output_config");
    if (oc) {
        static const char *const oc_allowed[] = {"effort", "format", "task_budget", NULL};
        if (oc->type != JSON_OBJECT) return rq_fail(e, 400, "output_config", "output_config: expected an object");
        if (check_fields(oc, oc_allowed, e)) return -1;
        if (field(oc, "task_budget"))
            return rq_fail(e, 400, "output_config", "output_config.task_budget: not supported (K3 takes an effort "
                           "level, not a token budget)");
        const json_value *ef = field(oc, "effort");
        if (ef) {
            int off = 0;
            const char *k3 = ef->type == JSON_STRING && strcmp(ef->str, "none") && strcmp(ef->str, "minimal")
                                 ? k3_effort(ef->str, &off) : NULL;
            if (!k3) return rq_fail(e, 400, "output_config", "output_config.effort: expected low, medium, high, xhigh "
                                    "or max");
            *effort = k3;
        }
    }
    const json_value *fmt = oc ? field(oc, "format") : NULL;
    const char *fmt_name = "output_config.format";
    if (!fmt && field(o, "output_format")) fmt = field(o, "output_format"), fmt_name = "output_format";
    if (fmt) {
        static const char *const f_allowed[] = {"type", "schema", NULL};
        const char *ft = fmt->type == JSON_OBJECT ? json_get_str(fmt, "type") : NULL;
        const json_value *schema = fmt->type == JSON_OBJECT ? json_get(fmt, "schema") : NULL;
        if (!ft || strcmp(ft, "json_schema"))
            return rq_fail(e, 400, "output_config", "%s.type: expected \"json_schema\"", fmt_name);
        if (check_fields(fmt, f_allowed, e)) return -1;
        if (!schema || schema->type != JSON_OBJECT)
            return rq_fail(e, 400, "output_config", "%s.schema: expected a JSON Schema object", fmt_name);
        json_buf rb;
        json_buf_init(&rb);
        json_buf_puts(&rb, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"output\",\"strict\":true,"
                           "\"schema\":");
        json_write_value(&rb, schema, 0);
        json_buf_puts(&rb, "}}");
        df_error perr = {0};
        *rf_doc = json_parse(rb.p, rb.len, &perr);
        json_buf_free(&rb);
        if (!*rf_doc)
            return rq_fail(e, 400, "output_config", "%s.schema: %s (JSON nesting is limited to %d levels)", fmt_name,
                           perr.msg, JSON_MAX_DEPTH);
        co->response_format = json_root(*rf_doc);
    }
    return 0;
}

/* the keys of a request that are not its messages: parallel tool use, the
 * conversation key (Claude Code's user_id names its session), cache_control */
static int msg_keys(const json_value *o, job *j, rq_err *e)
{
    const json_value *tcv = field(o, "tool_choice");
    int dpt = 0;
    if (tcv && tcv->type == JSON_OBJECT && get_bool(tcv, "disable_parallel_tool_use", &dpt, e)) return -1;
    j->single_call = dpt;
    const json_value *md = field(o, "metadata");
    if (md && md->type != JSON_OBJECT) return rq_fail(e, 400, "metadata", "metadata: expected an object");
    const json_value *uid = md ? field(md, "user_id") : NULL;
    if (uid && uid->type != JSON_STRING)
        return rq_fail(e, 400, "metadata.user_id", "metadata.user_id: expected a string");
    j->conv_key = conv_key(uid);
    const json_value *cc = field(o, "cache_control");
    if (cc && cc->type != JSON_OBJECT) return rq_fail(e, 400, "cache_control", "cache_control: expected an object");
    return 0;
}

/* The prompt, rendered with the context edits the request asks for
 * (clear_thinking, clear_tool_uses) applied and reported in ctx_edits. */
static int msg_edited_prompt(srv *S, job *j, const json_value *o, chat_options *cop, rq_err *e)
{
    chat_options co = *cop;
    edits ed;
    anth_conv cv = {.S = S, .thinking = co.thinking};
    json_buf_init(&cv.defs);
    json_buf applied;
    json_buf_init(&applied);
    int rc = parse_edits(o, co.thinking, &ed, e) || anth_check(o, &cv, e) || anth_tools(o, &cv, e) ? -1 : 0;
    cv.keep_turns = ed.keep_turns;
    if (!rc && co.thinking && cv.turn_effort) co.thinking_effort = cv.turn_effort;
    json_buf think_rep, tools_rep;
    json_buf_init(&think_rep);
    json_buf_init(&tools_rep);
    if (!rc) {
        /* clear_thinking: what it cleared is measured against the same
         * prompt with every turn's thinking kept */
        int cleared_turns = co.thinking && ed.think_edit && cv.n_think > ed.keep_turns ? cv.n_think - ed.keep_turns : 0;
        size_t n_all = 0;
        if (cleared_turns) {
            cv.keep_turns = INT_MAX;
            rc = anth_build(S, j, o, &cv, &co, e);
            n_all = j->n_ids;
            cv.keep_turns = ed.keep_turns;
            if (!rc && co.thinking && cv.turn_effort) co.thinking_effort = cv.turn_effort;
        }
        if (!rc) rc = anth_build(S, j, o, &cv, &co, e);
        if (!rc && cleared_turns) j->n_cleared += n_all - j->n_ids;
        if (!rc && cleared_turns)
            bprintf(&think_rep, "{\"type\":\"clear_thinking_20251015\",\"cleared_thinking_turns\":%d,"
                    "\"cleared_input_tokens\":%zu}", cleared_turns, n_all - j->n_ids);
    }
    if (!rc && ed.tools_edit) {
        int64_t n_uses = 0;
        plan_tool_clearing(o, &ed, &cv, &n_uses);
        int fire = ed.trig_uses ? n_uses > ed.trigger : (int64_t)j->n_ids > ed.trigger;
        if (fire && cv.n_clear) {
            size_t before = j->n_ids;
            rc = anth_build(S, j, o, &cv, &co, e);
            if (!rc && (int64_t)(before - j->n_ids) < ed.at_least) {
                /* it cannot clear clear_at_least tokens: not applied */
                cv.n_clear = 0;
                rc = anth_build(S, j, o, &cv, &co, e);
            } else if (!rc) {
                j->n_cleared += before - j->n_ids;
                bprintf(&tools_rep, "{\"type\":\"clear_tool_uses_20250919\",\"cleared_tool_uses\":%d,"
                        "\"cleared_input_tokens\":%zu}", cv.n_clear, before - j->n_ids);
            }
        }
    }
    if (!rc && field(o, "context_management")) {
        const json_buf *a = ed.order_tools_first ? &tools_rep : &think_rep, *b = ed.order_tools_first ? &think_rep
                                                                                                       : &tools_rep;
        json_buf_puts(&applied, "[");
        if (a->len) json_buf_put(&applied, a->p, a->len);
        if (a->len && b->len) json_buf_puts(&applied, ",");
        if (b->len) json_buf_put(&applied, b->p, b->len);
        json_buf_puts(&applied, "]");
        json_buf_put(&applied, "", 1);
        j->ctx_edits = applied.p;
        applied.p = NULL;
    }
    json_buf_free(&applied);
    json_buf_free(&think_rep);
    json_buf_free(&tools_rep);
    json_buf_free(&cv.defs);
    free(cv.tools);
    free(cv.clear);
    return rc;
}

int parse_messages(srv *S, job *j, const json_value *o, rq_err *e)
{
    static const char *const allowed[] = {"model", "messages", "system", "max_tokens", "stop_sequences",
                                          "temperature", "top_p", "stream", "tools", "tool_choice", "thinking",
                                          "metadata", "service_tier", "output_config", "context_management",
                                          "cache_control", "output_format", NULL};
    if (check_fields(o, allowed, e) || get_common(S, j, o, e) || get_stops(j, o, "stop_sequences", e)) return -1;
    int64_t mt = 0;
    int mt_set = 0;
    if (get_int(o, "max_tokens", 1, INT32_MAX, &mt, &mt_set, e)) return -1;
    if (!mt_set && !j->count_only) return rq_fail(e, 400, "max_tokens", "max_tokens: Field required");
    chat_options co;
    chat_options_init(&co);
    co.thinking = 0;
    co.thinking_effort = NULL;
    const char *effort = NULL;
    json_doc *rf_doc = NULL;
    if (msg_thinking(o, j, &co, &effort, e)) return -1;
    if (msg_output_config(o, &co, &effort, &rf_doc, e) || msg_keys(o, j, e)) {
        json_free(rf_doc);
        return -1;
    }
    if (co.thinking) co.thinking_effort = effort;
    int rc = msg_edited_prompt(S, j, o, &co, e);
    json_free(rf_doc);
    if (rc) return -1;
    return j->count_only ? 0 : set_max_tokens(S, j, "max_tokens", mt, 1, e);
}
