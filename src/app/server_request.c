/* server_request.c - request validation (L5): a JSON body becomes a job
 * or an API-shaped error naming the field; the three APIs are mapped onto
 * chat_render's OpenAI-shaped messages, rendered and tokenized here, on the
 * connection thread (the OpenAI chat and completions requests here, the
 * Messages API in server_anthropic.c, the Responses API in
 * server_responses.c; the field readers they all use in server_fields.c).
 * Touches no HTTP, queue or model, so server_parse_request exposes it to
 * the fuzz target. */
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
    json_doc *ex = NULL; /* the messages with their file parts as text, when there are any */
    if (chat_expand_files(S, msgs, &ex, e)) return -1;
    int rc = render_encode(S, j, ex ? json_root(ex) : msgs, &co, e);
    json_free(ex);
    if (rc) return -1;
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
