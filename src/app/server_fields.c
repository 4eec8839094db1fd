/* server_fields.c - what every API's request parser reads a request with
 * (L5): typed field readers that refuse with the field's name (check_fields,
 * get_*), the options the APIs share (stops, sampling, max tokens, the
 * conversation key, K3's effort), and rendering a request's messages with
 * the chat template and tokenizing them (render_encode).  server_request.c,
 * server_anthropic.c and server_responses.c call these; these call none of
 * them.
 */
#define _GNU_SOURCE
#include "server_impl.h"

/* ---- request fields ----------------------------------------------------- */

uint64_t conv_key(const json_value *v)
{
    if (!v || v->type != JSON_STRING || !v->len) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < v->len; i++) h = (h ^ (unsigned char)v->str[i]) * 0x100000001b3ull;
    return h | 1;
}

const json_value *field(const json_value *o, const char *k)
{
    const json_value *v = json_get(o, k);
    return v && v->type == JSON_NULL ? NULL : v;
}

int check_fields(const json_value *o, const char *const *allowed, rq_err *e)
{
    for (size_t i = 0; i < o->len; i++) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, o->keys[i]);
        if (!ok)
            return rq_fail(e, 400, o->keys[i], "Unrecognized request argument supplied: %.*s (this server honours "
                           "only fields it can apply exactly)", (int)utf8_cut(o->keys[i], strlen(o->keys[i]), 80),
                           o->keys[i]);
    }
    return 0;
}

int get_num(const json_value *o, const char *k, double lo, double hi, double *out, rq_err *e)
{
    const json_value *v = field(o, k);
    if (!v) return 0;
    if (v->type != JSON_NUMBER)
        return rq_fail(e, 400, k, "%s: expected a number, got %s", k, json_type_name(v->type));
    if (!(v->num >= lo && v->num <= hi)) return rq_fail(e, 400, k, "%s: must be in [%g, %g]", k, lo, hi);
    *out = v->num;
    return 0;
}

int get_int(const json_value *o, const char *k, int64_t lo, int64_t hi, int64_t *out, int *set, rq_err *e)
{
    const json_value *v = field(o, k);
    if (!v) return 0;
    /* an integer literal past int64 (or written with an exponent, 1e30) is
     * not exact; it is out of range, not a fraction */
    if (v->type == JSON_NUMBER && !v->is_int && v->num == floor(v->num))
        return rq_fail(e, 400, k, "%s: %.17g is out of range [%lld, %lld]", k, v->num, (long long)lo, (long long)hi);
    if (v->type != JSON_NUMBER || !v->is_int)
        return rq_fail(e, 400, k, "%s: expected an integer, got %s", k,
                       v->type == JSON_NUMBER ? "a fraction" : json_type_name(v->type));
    if (v->i < lo || v->i > hi)
        return rq_fail(e, 400, k, "%s: must be in [%lld, %lld]", k, (long long)lo, (long long)hi);
    *out = v->i;
    if (set) *set = 1;
    return 0;
}

int get_bool(const json_value *o, const char *k, int *out, rq_err *e)
{
    const json_value *v = field(o, k);
    if (!v) return 0;
    if (v->type != JSON_BOOL) return rq_fail(e, 400, k, "%s: expected a boolean, got %s", k, json_type_name(v->type));
    *out = v->b;
    return 0;
}

int get_stops(job *j, const json_value *o, const char *k, rq_err *e)
{
    const json_value *v = field(o, k);
    if (!v) return 0;
    if (v->type == JSON_STRING) {
        if (!v->len) return rq_fail(e, 400, k, "%s: empty stop sequence", k);
        j->stops[j->n_stops++] = xstrdup(v->str);
    } else if (v->type == JSON_ARRAY) {
        if (v->len > MAX_STOPS) return rq_fail(e, 400, k, "%s: at most %d stop sequences", k, MAX_STOPS);
        for (size_t i = 0; i < v->len; i++) {
            const json_value *s = v->items[i];
            if (s->type != JSON_STRING || !s->len || memchr(s->str, 0, s->len))
                return rq_fail(e, 400, k, "%s[%zu]: expected a non-empty string", k, i);
            j->stops[j->n_stops++] = xstrdup(s->str);
        }
    } else {
        return rq_fail(e, 400, k, "%s: expected a string or an array of strings", k);
    }
    for (int i = 0; i < j->n_stops; i++)
        if (strlen(j->stops[i]) > j->max_stop) j->max_stop = strlen(j->stops[i]);
    return 0;
}

/* Fields every API shares: model, sampling, stream. */
int get_common(srv *S, job *j, const json_value *o, rq_err *e)
{
    const json_value *m = field(o, "model");
    if (m && m->type != JSON_STRING) return rq_fail(e, 400, "model", "model: expected a string");
    j->model = xstrdup(m ? m->str : S->name);
    j->top_p = 1;
    if (get_num(o, "temperature", 0, 2, &j->temperature, e) || get_num(o, "top_p", 0, 1, &j->top_p, e) ||
        get_bool(o, "stream", &j->stream, e))
        return -1;
    if (j->top_p <= 0) return rq_fail(e, 400, "top_p", "top_p: must be greater than 0");
    int64_t seed = 0;
    int seed_set = 0;
    if (get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, &seed_set, e)) return -1;
    j->seed = seed_set ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)atomic_load(&S->job_counter) << 32);
    return 0;
}

/* Refusing by bytes before tokenizing: a token is at most the vocabulary's
 * longest token, so text of more than n_ctx x that many bytes cannot fit
 * the context, whatever it tokenizes to (a 100 MB prompt used to be
 * tokenized, 30 s of a connection thread, before the context refused it).
 * The body of a request may be up to 8x its text (JSON escapes, at most 6
 * bytes per byte, and the structure) plus 1 MiB of tools and options;
 * --max-request-bytes overrides that cap. */
void server_set_caps(srv *S)
{
    size_t longest = 1;
    for (int id = 0; S->tok && id < tokenizer_n_vocab(S->tok); id++) {
        size_t len = 0;
        if (tokenizer_token_bytes(S->tok, id, &len) && len > longest) longest = len;
    }
    S->max_text = (size_t)(S->n_ctx > 0 ? S->n_ctx : 1) * longest;
    S->doc.max_text = S->max_text;
    if (!S->max_body_set) {
        /* a document travels as base64: 4 / 3 of its bytes */
        size_t doc = S->doc.max_bytes ? S->doc.max_bytes : DOC_MAX_BYTES_DEFAULT;
        size_t cap = ((size_t)1 << 20) + 8 * S->max_text + doc / 3 * 4;
        S->max_body = cap < ((size_t)128 << 20) ? cap : ((size_t)128 << 20);
    }
}

int text_fits(srv *S, size_t bytes, const char *param, rq_err *e)
{
    if (!S->max_text || bytes <= S->max_text) return 0;
    e->code = "context_length_exceeded";
    return rq_fail(e, 400, param,
                   "the prompt's text is %zu bytes; this server's context of %d tokens holds at most %zu bytes "
                   "(%d x the vocabulary's longest token): start the server with a larger --ctx",
                   bytes, S->n_ctx, S->max_text, S->n_ctx);
}

/* max_tokens: absent = the rest of the context up to the server's ceiling. */
int set_max_tokens(srv *S, job *j, const char *k, int64_t v, int set, rq_err *e)
{
    if (set && S->max_tokens_cap > 0 && v > S->max_tokens_cap)
        return rq_fail(e, 400, k, "%s: %lld is above this server's limit of %d", k, (long long)v, S->max_tokens_cap);
    if (j->n_ids >= (size_t)S->n_ctx) {
        e->code = "context_length_exceeded";
        return rq_fail(e, 400, j->api == API_COMPLETIONS ? "prompt" : "messages",
                       "the prompt has %zu tokens; this server's context holds %d: start the server with a "
                       "larger --ctx (now %d)",
                       j->n_ids, S->n_ctx, S->n_ctx);
    }
    int room = S->n_ctx - (int)j->n_ids;
    /* no --max-tokens: the context bounds a reply (agents ask for 128,000
     * and mean "as much as fits"; a reply that fills the context ends as
     * "length") */
    int want = set ? (int)(v < INT32_MAX ? v : INT32_MAX) : S->max_tokens_cap > 0 ? S->max_tokens_cap : room;
    j->max_tokens = want < room ? want : room;
    j->ctx_bound = want > room;
    return 0;
}

int render_encode(srv *S, job *j, const json_value *messages, const chat_options *co, rq_err *e)
{
    chat_segments *seg;
    df_error err = {0};
    if (chat_render(messages, co, &seg, &err)) {
        const char *param = strncmp(err.msg, "tool_choice", 11) == 0 ? "tool_choice" : strncmp(err.msg, "tools", 5) == 0
                            ? "tools" : strncmp(err.msg, "response_format", 15) == 0
                            ? "response_format" : strncmp(err.msg, "thinking", 8) == 0 ? "reasoning_effort" : "messages";
        return rq_fail(e, 400, param, "%s", err.msg);
    }
    size_t text = 0;
    for (size_t i = 0; i < seg->n; i++) text += seg->seg[i].len;
    if (text_fits(S, text, "messages", e)) {
        chat_segments_free(seg);
        return -1;
    }
    size_t cap = 0;
    int rc = chat_encode(S->tok, seg, &j->ids, &j->n_ids, &cap, &err);
    chat_segments_free(seg);
    if (rc) return rq_fail(e, 400, "messages", "%s", err.msg);
    j->think = co->thinking;
    /* a guarantee asked for (a forced tool, a schema, a strict tool): its grammar, or a 400 naming what cannot be */
    gr_grammar_free(j->grammar);
    j->grammar = NULL;
    return job_constraint(S, j, co, e);
}

/* One chat_render message, {"role": R[, "tool_call_id": ID], "content": TEXT},
 * as the API converters (Anthropic, Responses) write them. */
void put_message(json_buf *d, const char *role, const char *tool_call_id, const char *text, size_t n)
{
    json_buf_puts(d, "{\"role\":");
    put_str(d, role);
    if (tool_call_id) {
        json_buf_puts(d, ",\"tool_call_id\":");
        put_str(d, tool_call_id);
    }
    json_buf_puts(d, ",\"content\":");
    json_write_string(d, text ? text : "", n);
    json_buf_puts(d, "}");
}

/* K3's template offers three levels; the APIs' five to seven map onto them
 * rounding up (a request never thinks less than it asked):
 *   none -> thinking off; minimal, low -> low; medium, high -> high;
 *   xhigh, max -> max. */
const char *k3_effort(const char *api_effort, int *off)
{
    static const char *const map[][2] = {{"minimal", "low"}, {"low", "low"},   {"medium", "high"},
                                         {"high", "high"},   {"xhigh", "max"}, {"max", "max"}};
    *off = 0;
    if (!api_effort) return NULL;
    if (!strcmp(api_effort, "none")) {
        *off = 1;
        return NULL;
    }
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(api_effort, map[i][0])) return map[i][1];
    return NULL;
}

