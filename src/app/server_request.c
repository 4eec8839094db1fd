/* server_request.c - request validation (L5): a JSON body becomes a job
 * or an API-shaped error naming the field; the three APIs are mapped onto
 * chat_render's OpenAI-shaped messages, rendered and tokenized here, on the
 * connection thread.  Touches no HTTP, queue or model, so
 * server_parse_request exposes it to the fuzz target. */
#define _GNU_SOURCE
#include "server_impl.h"

/* ---- a job's references (created here, freed by its last holder) ------- */

void job_unref(job *j)
{
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    free(j->ids);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    free(j->model);
    free(j->ctx_edits);
    resp_job_free(j->rj);
    gr_grammar_free(j->grammar);
    gr_matcher_free(j->matcher);
    json_buf_free(&j->out);
    for (int i = 0; i < 2; i++) json_buf_free(&j->acc[i]);
    for (int i = 0; i < 4; i++) json_buf_free(&j->lp[i]);
    json_buf_free(&j->calls);
    json_buf_free(&j->gate);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void job_ref(job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

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
    if (!S->max_body_set) {
        size_t cap = ((size_t)1 << 20) + 8 * S->max_text;
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

/* OpenAI tools: [{"type": "function", "function": {"name": string,
 * "description"?: string, "parameters"?: object}}]; anything else is named,
 * not rendered as whatever it happens to be. */
static int check_openai_tools(const json_value *tools, rq_err *e)
{
    for (size_t i = 0; tools && i < tools->len; i++) {
        const json_value *t = tools->items[i];
        if (t->type != JSON_OBJECT)
            return rq_fail(e, 400, "tools", "tools[%zu]: expected an object, got %s", i, json_type_name(t->type));
        const json_value *type = json_get(t, "type"), *fn = json_get(t, "function");
        if (!type || type->type != JSON_STRING || strcmp(type->str, "function"))
            return rq_fail(e, 400, "tools", "tools[%zu].type: expected \"function\"", i);
        if (!fn || fn->type != JSON_OBJECT)
            return rq_fail(e, 400, "tools", "tools[%zu].function: expected an object", i);
        const json_value *name = json_get(fn, "name"), *desc = json_get(fn, "description"),
                         *params = json_get(fn, "parameters");
        if (!name || name->type != JSON_STRING || !name->len)
            return rq_fail(e, 400, "tools", "tools[%zu].function.name: expected a non-empty string%s%s", i,
                           name ? ", got " : "", name ? json_type_name(name->type) : "");
        if (desc && desc->type != JSON_STRING && desc->type != JSON_NULL)
            return rq_fail(e, 400, "tools", "tools[%zu].function.description: expected a string", i);
        if (params && params->type != JSON_OBJECT && params->type != JSON_NULL)
            return rq_fail(e, 400, "tools", "tools[%zu].function.parameters: expected a JSON Schema object, got %s", i,
                           json_type_name(params->type));
    }
    return 0;
}

/* An assistant message's tool_calls: each function's arguments a string
 * holding a JSON object (as the API defines it) or an object. */
static int check_tool_calls(const json_value *msgs, rq_err *e)
{
    for (size_t m = 0; msgs && msgs->type == JSON_ARRAY && m < msgs->len; m++) {
        const json_value *calls = json_get(msgs->items[m], "tool_calls");
        if (!calls || calls->type == JSON_NULL) continue;
        if (calls->type != JSON_ARRAY)
            return rq_fail(e, 400, "messages", "messages[%zu].tool_calls: expected an array", m);
        for (size_t c = 0; c < calls->len; c++) {
            const json_value *fn = json_get(calls->items[c], "function");
            const json_value *name = fn ? json_get(fn, "name") : NULL, *args = fn ? json_get(fn, "arguments") : NULL;
            if (!fn || fn->type != JSON_OBJECT || !name || name->type != JSON_STRING)
                return rq_fail(e, 400, "messages", "messages[%zu].tool_calls[%zu].function: expected an object with a "
                               "string name", m, c);
            if (!args || args->type == JSON_OBJECT) continue;
            if (args->type != JSON_STRING)
                return rq_fail(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments: expected a "
                               "string of JSON, got %s", m, c, json_type_name(args->type));
            df_error err = {0};
            json_doc *d = json_parse(args->str, args->len, &err);
            int ok = d && json_root(d)->type == JSON_OBJECT;
            json_free(d);
            if (!ok)
                return rq_fail(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments: not a JSON "
                               "object (%s)", m, c, err.msg[0] ? err.msg : "another JSON value");
        }
    }
    return 0;
}

static int parse_chat(srv *S, job *j, const json_value *o, rq_err *e)
{
    static const char *const allowed[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "stop", "temperature", "top_p", "seed",
        "logprobs", "top_logprobs", "tools", "tool_choice", "reasoning_effort", "stream", "stream_options",
        "response_format", "user", "metadata", "store", "service_tier", "parallel_tool_calls", "n",
        "frequency_penalty", "presence_penalty", "prompt_cache_key", NULL};
    if (check_fields(o, allowed, e) || get_common(S, j, o, e) || get_stops(j, o, "stop", e)) return -1;
    int64_t n = 1, mt = 0, top = 0;
    int mt_set = 0;
    double pen = 0;
    if (get_int(o, "n", 1, 1, &n, NULL, e)) return -1;
    if (get_num(o, "frequency_penalty", 0, 0, &pen, e) || get_num(o, "presence_penalty", 0, 0, &pen, e)) return -1;
    if (get_int(o, "max_completion_tokens", 1, INT32_MAX, &mt, &mt_set, e) ||
        (!mt_set && get_int(o, "max_tokens", 1, INT32_MAX, &mt, &mt_set, e)))
        return -1;
    if (get_bool(o, "logprobs", &j->logprobs, e) ||
        get_int(o, "top_logprobs", 0, MAX_TOP_LOGPROBS, &top, NULL, e))
        return -1;
    j->top_logprobs = (int)top;
    if (top && !j->logprobs) return rq_fail(e, 400, "top_logprobs", "top_logprobs needs logprobs: true");
    const json_value *so = field(o, "stream_options");
    if (so) {
        static const char *const so_allowed[] = {"include_usage", NULL};
        if (so->type != JSON_OBJECT) return rq_fail(e, 400, "stream_options", "stream_options: expected an object");
        if (check_fields(so, so_allowed, e) || get_bool(so, "include_usage", &j->include_usage, e)) return -1;
    }
    const json_value *msgs = json_get(o, "messages");
    if (!msgs) return rq_fail(e, 400, "messages", "messages: missing");
    if (msgs->type != JSON_ARRAY || !msgs->len) return rq_fail(e, 400, "messages", "messages: expected a non-empty array");
    chat_options co;
    chat_options_init(&co);
    const json_value *eff = field(o, "reasoning_effort");
    if (eff) {
        int off = 0;
        const char *k3 = eff->type == JSON_STRING ? k3_effort(eff->str, &off) : NULL;
        if (!k3 && !off)
            return rq_fail(e, 400, "reasoning_effort", "reasoning_effort: expected one of none, minimal, low, medium, "
                           "high, xhigh, max");
        if (off) co.thinking = 0;
        else co.thinking_effort = k3;
    }
    co.tools = field(o, "tools");
    co.tool_choice = field(o, "tool_choice");
    co.response_format = field(o, "response_format");
    if (co.tools && co.tools->type != JSON_ARRAY) return rq_fail(e, 400, "tools", "tools: expected an array");
    if (check_openai_tools(co.tools, e) || check_tool_calls(msgs, e)) return -1;
    int ptc = 1;
    if (get_bool(o, "parallel_tool_calls", &ptc, e)) return -1;
    j->single_call = !ptc;
    const json_value *pck = field(o, "prompt_cache_key");
    if (pck && pck->type != JSON_STRING) return rq_fail(e, 400, "prompt_cache_key", "prompt_cache_key: expected a string");
    j->conv_key = conv_key(pck);
    if (render_encode(S, j, msgs, &co, e)) return -1;
    return set_max_tokens(S, j, mt_set ? (field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens")
                                       : "max_tokens", mt, mt_set, e);
}

static int parse_completions(srv *S, job *j, const json_value *o, rq_err *e)
{
    static const char *const allowed[] = {"model", "prompt", "max_tokens", "stop", "temperature", "top_p", "seed",
                                          "logprobs", "stream", "stream_options", "user", "n", "echo", NULL};
    if (check_fields(o, allowed, e) || get_common(S, j, o, e) || get_stops(j, o, "stop", e)) return -1;
    int64_t n = 1, mt = 0, lp = 0;
    int mt_set = 0, lp_set = 0, echo = 0;
    if (get_int(o, "n", 1, 1, &n, NULL, e) || get_int(o, "max_tokens", 1, INT32_MAX, &mt, &mt_set, e) ||
        get_int(o, "logprobs", 0, MAX_TOP_LOGPROBS, &lp, &lp_set, e) || get_bool(o, "echo", &echo, e))
        return -1;
    if (echo) return rq_fail(e, 400, "echo", "echo: true is not supported");
    j->logprobs = lp_set;
    j->top_logprobs = (int)lp;
    const json_value *so = field(o, "stream_options");
    if (so) {
        static const char *const so_allowed[] = {"include_usage", NULL};
        if (so->type != JSON_OBJECT) return rq_fail(e, 400, "stream_options", "stream_options: expected an object");
        if (check_fields(so, so_allowed, e) || get_bool(so, "include_usage", &j->include_usage, e)) return -1;
    }
    const json_value *p = json_get(o, "prompt");
    if (p && p->type == JSON_ARRAY && p->len == 1 && p->items[0]->type == JSON_STRING) p = p->items[0];
    size_t cap = 0;
    df_error err = {0};
    if (p && p->type == JSON_STRING) {
        if (text_fits(S, p->len, "prompt", e)) return -1;
        if (tokenizer_encode(S->tok, p->str, p->len, 0, &j->ids, &j->n_ids, &cap, &err))
            return rq_fail(e, 400, "prompt", "prompt: %s", err.msg);
    } else if (p && p->type == JSON_ARRAY) {
        j->ids = xmalloc((p->len ? p->len : 1) * sizeof *j->ids);
        for (size_t i = 0; i < p->len; i++) {
            const json_value *v = p->items[i];
            if (v->type != JSON_NUMBER || !v->is_int || v->i < 0 || v->i >= S->info.vocab)
                return rq_fail(e, 400, "prompt", "prompt: expected a string or an array of token ids in [0, %d)",
                               S->info.vocab);
            j->ids[j->n_ids++] = (int32_t)v->i;
        }
    } else {
        return rq_fail(e, 400, "prompt", "prompt: expected a string or an array of token ids");
    }
    if (!j->n_ids) return rq_fail(e, 400, "prompt", "prompt: empty");
    return set_max_tokens(S, j, "max_tokens", mt, mt_set, e);
}

/* Parses and validates BODY for API into a new job (one reference), or
 * returns NULL with E filled.  No HTTP here: server_parse_request and the
 * fuzz target call it too. */
job *request_job(srv *S, int api, const char *body, size_t len, rq_err *e)
{
    return request_job_ex(S, api, 0, body, len, e);
}

job *request_job_ex(srv *S, int api, int count_only, const char *body, size_t len, rq_err *e)
{
    df_error err = {0};
    json_doc *doc = json_parse(body ? body : "", len, &err);
    if (!doc) {
        rq_fail(e, 400, NULL, "We could not parse the JSON body of your request: %s (byte %lld)", err.msg,
                (long long)err.pos);
        return NULL;
    }
    const json_value *o = json_root(doc);
    job *j = xcalloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->S = S;
    j->api = api;
    j->count_only = count_only;
    j->status = 200;
    j->created = (long)time(NULL);
    unsigned long seq = atomic_fetch_add(&S->job_counter, 1) + 1;
    snprintf(j->id, sizeof j->id, "%s%08lx%08lx", api == API_CHAT ? "chatcmpl-" : api == API_MESSAGES ? "msg_"
             : api == API_RESPONSES ? "resp_" : "cmpl-", (unsigned long)(j->created & 0xffffffff), seq);
    int rc;
    if (o->type != JSON_OBJECT) rc = rq_fail(e, 400, NULL, "the request body must be a JSON object");
    else if (api == API_CHAT) rc = parse_chat(S, j, o, e);
    else if (api == API_COMPLETIONS) rc = parse_completions(S, j, o, e);
    else if (api == API_RESPONSES) rc = parse_responses(S, j, o, e);
    else rc = parse_messages(S, j, o, e);
    json_free(doc);
    if (rc) {
        e->stream = j->stream;
        job_unref(j);
        return NULL;
    }
    return j;
}

int server_parse_request(const server_limits *lim, int endpoint, const char *body, size_t len, char **err_body,
                         size_t *n_ids)
{
    static const int apis[] = {API_CHAT, API_COMPLETIONS, API_MESSAGES, API_RESPONSES};
    CHECK(endpoint >= 0 && endpoint < 4);
    srv *S = xcalloc(1, sizeof *S);
    S->name = lim->name ? lim->name : "deltafin";
    S->tok = lim->tok;
    S->n_ctx = lim->n_ctx;
    S->max_tokens_cap = lim->max_tokens_cap;
    server_set_caps(S);
    rq_err e = {0};
    job *j = request_job(S, apis[endpoint], body, len, &e);
    int status = 200;
    *err_body = NULL;
    if (j) {
        if (n_ids) *n_ids = j->n_ids;
        job_unref(j);
    } else {
        json_buf b;
        json_buf_init(&b);
        error_body(&b, apis[endpoint], &e);
        json_buf_put(&b, "", 1);
        *err_body = b.p;
        status = e.status;
    }
    free(S);
    return status;
}
