/* server.c - `deltafin serve`: OpenAI and Anthropic HTTP APIs (front end, L5).
 *
 *   deltafin serve --model DIR [--host 127.0.0.1] [--port 8080] [--queue 16]
 *                  [--api-key KEY] [--max-request-bytes 128M] [--max-tokens N]
 *                  [--timeout SEC] [--name NAME] [--ping-ms 2000]
 *                  + the run options (--ctx, --mem, --threads, --batch, ...)
 *
 * Owns: HTTP (libmicrohttpd, one thread per connection), request validation,
 * mapping the three APIs onto chat_render's OpenAI-shaped messages, the job
 * queue, the inference worker, sampling and log-probabilities, the API-shaped
 * responses and SSE streams, /health, /metrics and the chat page at /.
 * Does not own: the template, tokenizer or model (engine.h, tokenizer.h,
 * chat_template.h).
 *
 * Threads: MHD connection threads only parse, validate, render and encode a
 * request into a job and queue it (bounded: a full queue is 429).  The one
 * worker thread owns the session, the logits and the id history; it writes
 * each job's output bytes into job->out under job->mu and signals job->cv;
 * connection threads copy them out (SSE, with comment pings while nothing
 * comes) or wait for the whole body.  A job is reference counted (request,
 * worker, stream response); job->cancelled is set when the connection ends
 * early (a failed SSE write, or a hang-up polled for while a non-streaming
 * request waits) and the worker stops at the next token.
 * Conversation reuse: the worker keeps the ids its session holds; a prompt
 * that strictly extends them is fed only its new suffix.  That history is
 * trusted only once the job that produced it was delivered completely
 * (job->delivered, set when MHD reports the request completed); otherwise
 * the next job resets the session.
 * The last sampled token is not fed (the session holds exactly the ids in
 * the history).  The HTTP threads exempt themselves from the process-wide
 * allocation guard (util.h): they allocate while the worker is inside
 * df_session_eval.
 * Stop sequences are matched on the decoded text of each channel (reasoning,
 * content) separately; the last (longest stop - 1) bytes are held back until
 * they cannot begin a stop, so a stop is never emitted.
 * Determinism: temperature 0 (the default) is greedy (df_argmax); temperature
 * > 0 samples in double from a splitmix64 stream seeded by "seed".
 * Validation (request_job: JSON body -> job or API-shaped error) touches no
 * HTTP, queue or model; server_parse_request exposes it to the fuzz target
 * (fuzz/fuzz_server_request.c).
 * Not done here: tool_choice naming a function, n > 1, penalties, images,
 * constrained (strict) JSON schemas: all 400s naming the field.
 */
#define _GNU_SOURCE
#include "server.h"
#include "chat_template.h"
#include "cli.h"
#include "engine.h"
#include "json.h"
#include "json_write.h"
#include "sampler.h"
#include "tokenizer.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

enum { API_CHAT, API_COMPLETIONS, API_MESSAGES };
enum { CH_REASONING, CH_CONTENT };
enum { FIN_STOP, FIN_LENGTH, FIN_STOPSEQ, FIN_CANCEL, FIN_ERROR };
enum { BLK_NONE, BLK_THINK, BLK_TEXT, BLK_TOOL };
#define MAX_STOPS 16
#define MAX_TOP_LOGPROBS 20

extern const char server_page_html[];

typedef struct job job;

typedef struct srv {
    /* set at start, read-only afterwards */
    const char *host, *api_key, *name;
    int port, queue_max, max_tokens_cap, n_ctx, ping_ms;
    size_t max_body;
    double timeout;
    run_args a;
    tokenizer *tok;
    df_engine *eng;
    df_model_info info;
    atomic_int ready;
    /* queue, guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    int n_waiting, running, stop;
    /* counters, guarded by mu */
    uint64_t n_requests, n_rejected, n_errors, tok_prompt, tok_gen, tok_reused;
    df_stats stats;             /* engine counters, snapshot by the worker after each job */
    double gen_seconds, last_tps;
    atomic_ulong job_counter;
    /* worker-only */
    df_session *s;
    chat_parser *parser;
    float *logits;              /* [vocab] */
    sampler smp;                /* temperature / top_p / seed of the current job (sampler.c) */
    int32_t *hist;              /* ids the session holds */
    size_t n_hist, cap_hist;
    int hist_ok;                /* hist is valid once last was delivered */
    job *last;
    char *dbuf;
    size_t dcap;
} srv;

struct job {
    srv *S;
    int api, stream, include_usage;
    int32_t *ids;
    size_t n_ids;
    int think;                  /* chat: the prompt ends inside the think channel */
    int max_tokens;
    char *stops[MAX_STOPS];
    int n_stops;
    size_t max_stop;
    double temperature, top_p;
    uint64_t seed;
    int logprobs, top_logprobs; /* logprobs: 1 = wanted; top: alternatives per token */
    char id[48];
    char *model;
    long created;
    double deadline;
    /* shared with the connection thread, guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    json_buf out;
    size_t sent;
    int status, done, refs;
    atomic_int cancelled, delivered;
    job *next;
    /* worker-only output state */
    json_buf acc[2], calls, lp[4];
    int n_calls, call_open, lp_n, blk, blk_idx, gate_ch, stopped, fin, n_gen, n_reused;
    const char *stop_hit;
    json_buf gate;
    size_t text_off;
    char errmsg[800];
};

/* ---- small helpers ------------------------------------------------------ */

static void job_unref(job *j)
{
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    free(j->ids);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    free(j->model);
    json_buf_free(&j->out);
    for (int i = 0; i < 2; i++) json_buf_free(&j->acc[i]);
    for (int i = 0; i < 4; i++) json_buf_free(&j->lp[i]);
    json_buf_free(&j->calls);
    json_buf_free(&j->gate);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void job_ref(job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

/* Append to the job's output and wake its connection thread. */
static void out_put(job *j, const char *s, size_t n)
{
    pthread_mutex_lock(&j->mu);
    json_buf_put(&j->out, s, n);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void bprintf(json_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(json_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) json_buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string of bytes that may not be valid UTF-8 (single tokens): bad
 * bytes become U+FFFD. */
static void put_str_utf8(json_buf *b, const char *s, size_t n)
{
    json_buf t;
    json_buf_init(&t);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len((const unsigned char *)s + i, n - i);
        if (k) json_buf_put(&t, s + i, k), i += k;
        else json_buf_puts(&t, "\xEF\xBF\xBD"), i++;
    }
    json_write_string(b, t.p ? t.p : "", t.len);
    json_buf_free(&t);
}

static void put_str(json_buf *b, const char *s) { json_write_string(b, s, strlen(s)); }

/* ---- request errors ----------------------------------------------------- */

typedef struct rq_err {
    int status;
    const char *type;   /* OpenAI error type */
    const char *code;   /* OpenAI code or NULL */
    char param[96];
    char msg[600];
} rq_err;

static int rq_fail(rq_err *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rq_fail(rq_err *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    if (!e->type) e->type = status == 401 ? "authentication_error" : status == 429 ? "rate_limit_error"
                          : status == 404 ? "not_found_error" : status >= 500 ? "api_error" : "invalid_request_error";
    /* both may hold request text (field names, URLs): cut on a character
     * boundary, never inside a UTF-8 sequence */
    if (!param) param = "";
    size_t pn = utf8_cut(param, strlen(param), sizeof e->param - 1);
    memcpy(e->param, param, pn);
    e->param[pn] = 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->msg) e->msg[utf8_cut(e->msg, (size_t)n, sizeof e->msg - 1)] = 0;
    return -1;
}

/* msg and param may quote request bytes (an URL is not even checked to be
 * UTF-8): a byte that is not part of a character is written as U+FFFD, so
 * the body is always valid UTF-8 and JSON. */
static void error_body(json_buf *b, int api, const rq_err *e)
{
    if (api == API_MESSAGES) {
        const char *t = e->status == 413 ? "request_too_large" : e->type;
        json_buf_puts(b, "{\"type\":\"error\",\"error\":{\"type\":");
        put_str(b, t);
        json_buf_puts(b, ",\"message\":");
        put_str_utf8(b, e->msg, strlen(e->msg));
        json_buf_puts(b, "}}");
    } else {
        json_buf_puts(b, "{\"error\":{\"message\":");
        put_str_utf8(b, e->msg, strlen(e->msg));
        json_buf_puts(b, ",\"type\":");
        put_str(b, e->type);
        json_buf_puts(b, ",\"param\":");
        if (e->param[0]) put_str_utf8(b, e->param, strlen(e->param));
        else json_buf_puts(b, "null");
        json_buf_puts(b, ",\"code\":");
        if (e->code) put_str(b, e->code);
        else json_buf_puts(b, "null");
        json_buf_puts(b, "}}");
    }
}

/* ---- request fields ----------------------------------------------------- */

static const json_value *field(const json_value *o, const char *k)
{
    const json_value *v = json_get(o, k);
    return v && v->type == JSON_NULL ? NULL : v;
}

static int check_fields(const json_value *o, const char *const *allowed, rq_err *e)
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

static int get_num(const json_value *o, const char *k, double lo, double hi, double *out, rq_err *e)
{
    const json_value *v = field(o, k);
    if (!v) return 0;
    if (v->type != JSON_NUMBER)
        return rq_fail(e, 400, k, "%s: expected a number, got %s", k, json_type_name(v->type));
    if (!(v->num >= lo && v->num <= hi)) return rq_fail(e, 400, k, "%s: must be in [%g, %g]", k, lo, hi);
    *out = v->num;
    return 0;
}

static int get_int(const json_value *o, const char *k, int64_t lo, int64_t hi, int64_t *out, int *set, rq_err *e)
{
    const json_value *v = field(o, k);
    if (!v) return 0;
    if (v->type != JSON_NUMBER || !v->is_int)
        return rq_fail(e, 400, k, "%s: expected an integer, got %s", k,
                       v->type == JSON_NUMBER ? "a fraction" : json_type_name(v->type));
    if (v->i < lo || v->i > hi)
        return rq_fail(e, 400, k, "%s: must be in [%lld, %lld]", k, (long long)lo, (long long)hi);
    *out = v->i;
    if (set) *set = 1;
    return 0;
}

static int get_bool(const json_value *o, const char *k, int *out, rq_err *e)
{
    const json_value *v = field(o, k);
    if (!v) return 0;
    if (v->type != JSON_BOOL) return rq_fail(e, 400, k, "%s: expected a boolean, got %s", k, json_type_name(v->type));
    *out = v->b;
    return 0;
}

static int get_stops(job *j, const json_value *o, const char *k, rq_err *e)
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
static int get_common(srv *S, job *j, const json_value *o, rq_err *e)
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

/* max_tokens: absent = the rest of the context up to the server's ceiling. */
static int set_max_tokens(srv *S, job *j, const char *k, int64_t v, int set, rq_err *e)
{
    if (set && v > S->max_tokens_cap)
        return rq_fail(e, 400, k, "%s: %lld is above this server's limit of %d", k, (long long)v, S->max_tokens_cap);
    if (j->n_ids >= (size_t)S->n_ctx) {
        e->code = "context_length_exceeded";
        return rq_fail(e, 400, j->api == API_COMPLETIONS ? "prompt" : "messages",
                       "the prompt has %zu tokens; this server's context holds %d", j->n_ids,
                       S->n_ctx);
    }
    int room = S->n_ctx - (int)j->n_ids;
    int want = set ? (int)v : S->max_tokens_cap;
    j->max_tokens = want < room ? want : room;
    return 0;
}

static int render_encode(srv *S, job *j, const json_value *messages, const chat_options *co, rq_err *e)
{
    chat_segments *seg;
    df_error err = {0};
    if (chat_render(messages, co, &seg, &err)) {
        const char *param = strncmp(err.msg, "tool_choice", 11) == 0 ? "tool_choice" : strncmp(err.msg, "tools", 5) == 0
                            ? "tools" : strncmp(err.msg, "response_format", 15) == 0
                            ? "response_format" : strncmp(err.msg, "thinking", 8) == 0 ? "reasoning_effort" : "messages";
        return rq_fail(e, 400, param, "%s", err.msg);
    }
    size_t cap = 0;
    int rc = chat_encode(S->tok, seg, &j->ids, &j->n_ids, &cap, &err);
    chat_segments_free(seg);
    if (rc) return rq_fail(e, 400, "messages", "%s", err.msg);
    j->think = co->thinking;
    return 0;
}

static int parse_chat(srv *S, job *j, const json_value *o, rq_err *e)
{
    static const char *const allowed[] = {
        "model", "messages", "max_tokens", "max_completion_tokens", "stop", "temperature", "top_p", "seed",
        "logprobs", "top_logprobs", "tools", "tool_choice", "reasoning_effort", "stream", "stream_options",
        "response_format", "user", "metadata", "store", "service_tier", "parallel_tool_calls", "n",
        "frequency_penalty", "presence_penalty", NULL};
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
        if (eff->type != JSON_STRING) return rq_fail(e, 400, "reasoning_effort", "reasoning_effort: expected a string");
        if (!strcmp(eff->str, "none")) co.thinking = 0;
        else co.thinking_effort = eff->str;
    }
    co.tools = field(o, "tools");
    co.tool_choice = field(o, "tool_choice");
    co.response_format = field(o, "response_format");
    if (co.tools && co.tools->type != JSON_ARRAY) return rq_fail(e, 400, "tools", "tools: expected an array");
    /* json_schema is rendered as an instruction; a strict (guaranteed) schema would need constrained decoding */
    const json_value *js = co.response_format ? json_get(co.response_format, "json_schema") : NULL;
    const json_value *strict = js ? json_get(js, "strict") : NULL;
    if (strict && strict->type == JSON_BOOL && strict->b)
        return rq_fail(e, 400, "response_format", "response_format.json_schema.strict: true is not supported (the schema "
                       "is given to the model as an instruction, not enforced)");
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

/* Anthropic text of a string or an array of text blocks; NULL with e set. */
static int anth_text(const json_value *v, const char *where, json_buf *out, rq_err *e)
{
    if (v->type == JSON_STRING) {
        json_buf_put(out, v->str, v->len);
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
            json_buf_put(out, x->str, x->len);
        } else {
            return rq_fail(e, 400, where, "%s[%zu]: block type \"%.*s\" is not supported here (text only)", where, i,
                           (int)utf8_cut(t, strlen(t), 40), t);
        }
    }
    return 0;
}

/* Map an Anthropic Messages request onto an OpenAI-shaped document
 * {"messages": [...], "tools": [...], "tool_choice": ...} for chat_render. */
static int anth_convert(const json_value *o, json_buf *d, rq_err *e)
{
    json_buf_puts(d, "{\"messages\":[");
    int first = 1;
    const json_value *sys = field(o, "system");
    if (sys) {
        json_buf t;
        json_buf_init(&t);
        int rc = anth_text(sys, "system", &t, e);
        if (!rc) {
            json_buf_puts(d, "{\"role\":\"system\",\"content\":");
            json_write_string(d, t.p ? t.p : "", t.len);
            json_buf_puts(d, "}");
            first = 0;
        }
        json_buf_free(&t);
        if (rc) return -1;
    }
    const json_value *msgs = json_get(o, "messages");
    if (!msgs || msgs->type != JSON_ARRAY || !msgs->len)
        return rq_fail(e, 400, "messages", "messages: expected a non-empty array");
    for (size_t i = 0; i < msgs->len; i++) {
        const json_value *m = msgs->items[i];
        const char *role = json_get_str(m, "role");
        const json_value *c = json_get(m, "content");
        char where[48];
        snprintf(where, sizeof where, "messages[%zu]", i);
        if (m->type != JSON_OBJECT || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
            return rq_fail(e, 400, where, "%s.role: expected \"user\" or \"assistant\"", where);
        if (!c) return rq_fail(e, 400, where, "%s.content: missing", where);
        int user = !strcmp(role, "user");
        json_buf text, calls;
        json_buf_init(&text);
        json_buf_init(&calls);
        int n_calls = 0, has_text = 0, rc = 0;
        if (c->type == JSON_STRING) {
            json_buf_put(&text, c->str, c->len);
            has_text = 1;
        } else if (c->type != JSON_ARRAY) {
            rc = rq_fail(e, 400, where, "%s.content: expected a string or an array of blocks", where);
        }
        for (size_t k = 0; !rc && c->type == JSON_ARRAY && k < c->len; k++) {
            const json_value *b = c->items[k];
            const char *t = json_get_str(b, "type");
            if (!t) { rc = rq_fail(e, 400, where, "%s.content[%zu]: a block needs a type", where, k); break; }
            if (!strcmp(t, "text")) {
                const json_value *x = json_get(b, "text");
                if (!x || x->type != JSON_STRING) {
                    rc = rq_fail(e, 400, where, "%s.content[%zu].text: expected a string", where, k);
                    break;
                }
                json_buf_put(&text, x->str, x->len);
                has_text = 1;
            } else if (!user && (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking"))) {
                /* echoed reasoning: accepted, not rendered (K3 drops earlier turns' reasoning) */
            } else if (!user && !strcmp(t, "tool_use")) {
                const char *id = json_get_str(b, "id"), *name = json_get_str(b, "name");
                const json_value *in = json_get(b, "input");
                if (!id || !name || !in || in->type != JSON_OBJECT) {
                    rc = rq_fail(e, 400, where, "%s.content[%zu]: tool_use needs id, name and an input object", where, k);
                    break;
                }
                json_buf args;
                json_buf_init(&args);
                json_write_value(&args, in, 0);
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
                const json_value *rc_v = json_get(b, "content");
                json_buf r;
                json_buf_init(&r);
                if (!id) rc = rq_fail(e, 400, where, "%s.content[%zu].tool_use_id: missing", where, k);
                else if (rc_v && rc_v->type != JSON_NULL) rc = anth_text(rc_v, where, &r, e);
                if (!rc) {
                    json_buf_puts(d, first ? "" : ",");
                    json_buf_puts(d, "{\"role\":\"tool\",\"tool_call_id\":");
                    put_str(d, id);
                    json_buf_puts(d, ",\"content\":");
                    json_write_string(d, r.p ? r.p : "", r.len);
                    json_buf_puts(d, "}");
                    first = 0;
                }
                json_buf_free(&r);
            } else {
                rc = rq_fail(e, 400, where, "%s.content[%zu]: block type \"%.*s\" is not supported (K3 here is "
                             "text-only)", where, k, (int)utf8_cut(t, strlen(t), 40), t);
            }
        }
        if (!rc && (has_text || n_calls || !user)) {
            json_buf_puts(d, first ? "{\"role\":" : ",{\"role\":");
            put_str(d, role);
            json_buf_puts(d, ",\"content\":");
            json_write_string(d, text.p ? text.p : "", text.len);
            if (n_calls) {
                json_buf_puts(d, ",\"tool_calls\":[");
                json_buf_put(d, calls.p, calls.len);
                json_buf_puts(d, "]");
            }
            json_buf_puts(d, "}");
            first = 0;
        }
        json_buf_free(&text);
        json_buf_free(&calls);
        if (rc) return -1;
    }
    json_buf_puts(d, "]");
    const json_value *tools = field(o, "tools");
    if (tools) {
        if (tools->type != JSON_ARRAY) return rq_fail(e, 400, "tools", "tools: expected an array");
        json_buf_puts(d, ",\"tools\":[");
        for (size_t i = 0; i < tools->len; i++) {
            const json_value *t = tools->items[i];
            const char *name = json_get_str(t, "name"), *type = json_get_str(t, "type");
            const json_value *schema = json_get(t, "input_schema"), *desc = json_get(t, "description");
            if (!name || !schema || (type && strcmp(type, "custom")))
                return rq_fail(e, 400, "tools", "tools[%zu]: expected a client tool with name and input_schema", i);
            json_buf_puts(d, i ? ",{\"type\":\"function\",\"function\":{\"name\":" : "{\"type\":\"function\",\"function\":{\"name\":");
            put_str(d, name);
            if (desc && desc->type == JSON_STRING) {
                json_buf_puts(d, ",\"description\":");
                json_write_string(d, desc->str, desc->len);
            }
            json_buf_puts(d, ",\"parameters\":");
            json_write_value(d, schema, 0);
            json_buf_puts(d, "}}");
        }
        json_buf_puts(d, "]");
    }
    const json_value *tc = field(o, "tool_choice");
    if (tc) {
        const char *t = json_get_str(tc, "type");
        const char *m = !t ? NULL : !strcmp(t, "auto") ? "auto" : !strcmp(t, "any") ? "required"
                      : !strcmp(t, "none") ? "none" : NULL;
        if (!m) return rq_fail(e, 400, "tool_choice", "tool_choice: expected {\"type\": \"auto\" | \"any\" | \"none\"} "
                               "(naming a tool is not supported by K3's template)");
        json_buf_puts(d, ",\"tool_choice\":");
        put_str(d, m);
    }
    json_buf_puts(d, "}");
    return 0;
}

static int parse_messages(srv *S, job *j, const json_value *o, rq_err *e)
{
    static const char *const allowed[] = {"model", "messages", "system", "max_tokens", "stop_sequences",
                                          "temperature", "top_p", "stream", "tools", "tool_choice", "thinking",
                                          "metadata", "service_tier", NULL};
    if (check_fields(o, allowed, e) || get_common(S, j, o, e) || get_stops(j, o, "stop_sequences", e)) return -1;
    int64_t mt = 0;
    int mt_set = 0;
    if (get_int(o, "max_tokens", 1, INT32_MAX, &mt, &mt_set, e)) return -1;
    if (!mt_set) return rq_fail(e, 400, "max_tokens", "max_tokens: Field required");
    chat_options co;
    chat_options_init(&co);
    co.thinking = 0;
    co.thinking_effort = NULL;
    const json_value *th = field(o, "thinking");
    if (th) {
        const char *t = json_get_str(th, "type");
        int64_t budget = 0;
        if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled")))
            return rq_fail(e, 400, "thinking", "thinking.type: expected \"enabled\" or \"disabled\"");
        if (!strcmp(t, "enabled")) {
            co.thinking = 1;
            if (get_int(th, "budget_tokens", 1, INT32_MAX, &budget, NULL, e)) return -1;
            /* K3 takes an effort level, not a budget */
            co.thinking_effort = !budget ? "max" : budget < 4096 ? "low" : budget < 16384 ? "high" : "max";
        }
    }
    json_buf d;
    json_buf_init(&d);
    int rc = anth_convert(o, &d, e);
    if (!rc) {
        df_error err = {0};
        json_doc *doc = json_parse(d.p, d.len, &err);
        CHECK(doc);
        const json_value *r = json_root(doc);
        co.tools = json_get(r, "tools");
        co.tool_choice = json_get(r, "tool_choice");
        rc = render_encode(S, j, json_get(r, "messages"), &co, e);
        json_free(doc);
    }
    json_buf_free(&d);
    return rc ? -1 : set_max_tokens(S, j, "max_tokens", mt, 1, e);
}

/* ---- output: API-shaped events ----------------------------------------- */

static void usage_json(json_buf *b, const job *j)
{
    if (j->api == API_MESSAGES)
        bprintf(b, "{\"input_tokens\":%zu,\"output_tokens\":%d}", j->n_ids, j->n_gen);
    else
        bprintf(b, "{\"prompt_tokens\":%zu,\"completion_tokens\":%d,\"total_tokens\":%zu,"
                "\"prompt_tokens_details\":{\"cached_tokens\":%d}}", j->n_ids, j->n_gen, j->n_ids + (size_t)j->n_gen,
                j->n_reused);
}

static void chunk_head(json_buf *b, const job *j)
{
    json_buf_puts(b, "data: {\"id\":");
    put_str(b, j->id);
    bprintf(b, ",\"object\":\"%s\",\"created\":%ld,\"model\":",
            j->api == API_CHAT ? "chat.completion.chunk" : "text_completion", j->created);
    put_str(b, j->model);
    json_buf_puts(b, ",\"choices\":[");
}

static void chunk_tail(json_buf *b, const job *j)
{
    json_buf_puts(b, j->include_usage ? "],\"usage\":null}\n\n" : "]}\n\n");
}

static void anth_event(job *j, const char *name, json_buf *data)
{
    json_buf b;
    json_buf_init(&b);
    bprintf(&b, "event: %s\ndata: ", name);
    json_buf_put(&b, data->p, data->len);
    json_buf_puts(&b, "\n\n");
    out_put(j, b.p, b.len);
    json_buf_free(&b);
    data->len = 0;
}

/* Pending log-probability entries as the API's logprobs value. */
static void logprobs_json(json_buf *b, job *j)
{
    if (!j->logprobs) {
        json_buf_puts(b, "null");
        return;
    }
    if (j->api == API_CHAT) {
        json_buf_puts(b, "{\"content\":[");
        json_buf_put(b, j->lp[0].p, j->lp[0].len);
        json_buf_puts(b, "]}");
    } else {
        static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
        for (int i = 0; i < 4; i++) {
            bprintf(b, "%s\"%s\":[", i ? "," : "{", keys[i]);
            json_buf_put(b, j->lp[i].p, j->lp[i].len);
            json_buf_puts(b, "]");
        }
        json_buf_puts(b, "}");
    }
    for (int i = 0; i < 4; i++) j->lp[i].len = 0;
    j->lp_n = 0;
}

static void anth_block_close(job *j)
{
    if (j->blk == BLK_NONE) return;
    json_buf b;
    json_buf_init(&b);
    bprintf(&b, "{\"type\":\"content_block_stop\",\"index\":%d}", j->blk_idx++);
    anth_event(j, "content_block_stop", &b);
    json_buf_free(&b);
    j->blk = BLK_NONE;
}

static void anth_block_open(job *j, int blk)
{
    if (j->blk == blk) return;
    anth_block_close(j);
    json_buf b;
    json_buf_init(&b);
    bprintf(&b, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":%s}", j->blk_idx,
            blk == BLK_THINK ? "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"
                             : "{\"type\":\"text\",\"text\":\"\"}");
    anth_event(j, "content_block_start", &b);
    json_buf_free(&b);
    j->blk = blk;
}

/* Text after the stop-sequence gate. */
static void emit_raw(job *j, int ch, const char *s, size_t n)
{
    if (!n) return;
    if (!j->stream) {
        json_buf_put(&j->acc[ch], s, n);
        return;
    }
    json_buf b;
    json_buf_init(&b);
    if (j->api == API_MESSAGES) {
        anth_block_open(j, ch == CH_REASONING ? BLK_THINK : BLK_TEXT);
        bprintf(&b, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", j->blk_idx,
                ch == CH_REASONING ? "thinking_delta" : "text_delta", ch == CH_REASONING ? "thinking" : "text");
        json_write_string(&b, s, n);
        json_buf_puts(&b, "}}");
        anth_event(j, "content_block_delta", &b);
    } else {
        chunk_head(&b, j);
        if (j->api == API_CHAT) {
            json_buf_puts(&b, ch == CH_REASONING ? "{\"index\":0,\"delta\":{\"reasoning_content\":"
                                                 : "{\"index\":0,\"delta\":{\"content\":");
            json_write_string(&b, s, n);
            json_buf_puts(&b, "},\"logprobs\":");
        } else {
            json_buf_puts(&b, "{\"index\":0,\"text\":");
            json_write_string(&b, s, n);
            json_buf_puts(&b, ",\"logprobs\":");
        }
        logprobs_json(&b, j);
        json_buf_puts(&b, ",\"finish_reason\":null}");
        chunk_tail(&b, j);
        out_put(j, b.p, b.len);
    }
    json_buf_free(&b);
}

static void gate_flush(job *j)
{
    size_t n = j->gate.len;
    j->gate.len = 0;
    emit_raw(j, j->gate_ch, j->gate.p, n);
}

/* Text through the stop-sequence gate: the last (longest stop - 1) bytes
 * are held back until they cannot start a stop sequence. */
static void emit_text(job *j, int ch, const char *s, size_t n)
{
    if (j->stopped || !n) return;
    if (!j->n_stops) {
        emit_raw(j, ch, s, n);
        return;
    }
    if (ch != j->gate_ch) {
        gate_flush(j);
        j->gate_ch = ch;
    }
    json_buf_put(&j->gate, s, n);
    size_t best = SIZE_MAX;
    int which = -1;
    for (int i = 0; i < j->n_stops; i++) {
        const char *p = memmem(j->gate.p, j->gate.len, j->stops[i], strlen(j->stops[i]));
        if (p && (size_t)(p - j->gate.p) < best) best = (size_t)(p - j->gate.p), which = i;
    }
    if (which >= 0) {
        j->gate.len = 0;
        emit_raw(j, ch, j->gate.p, best);
        j->stopped = 1;
        j->stop_hit = j->stops[which];
        return;
    }
    size_t keep = j->max_stop - 1;
    if (j->gate.len > keep) {
        size_t cut = j->gate.len - keep;
        while (cut > 0 && ((unsigned char)j->gate.p[cut] & 0xC0) == 0x80) cut--;
        if (cut) {
            char *tmp = xmalloc(cut);
            memcpy(tmp, j->gate.p, cut);
            memmove(j->gate.p, j->gate.p + cut, j->gate.len - cut);
            j->gate.len -= cut;
            emit_raw(j, ch, tmp, cut);
            free(tmp);
        }
    }
}

static void call_id(char *buf, size_t n, const job *j, int idx)
{
    snprintf(buf, n, "%s_%s_%d", j->api == API_MESSAGES ? "toolu" : "call", j->id + (j->api == API_MESSAGES ? 4 : 9), idx);
}

static void emit_call_begin(job *j, int idx, const char *name)
{
    if (j->stopped) return;
    gate_flush(j);
    char id[96];
    call_id(id, sizeof id, j, idx);
    j->call_open = 1;
    if (!j->stream) {
        if (j->n_calls++) json_buf_puts(&j->calls, ",");
        if (j->api == API_MESSAGES) {
            json_buf_puts(&j->calls, "{\"type\":\"tool_use\",\"id\":");
            put_str(&j->calls, id);
            json_buf_puts(&j->calls, ",\"name\":");
            put_str(&j->calls, name);
        } else {
            json_buf_puts(&j->calls, "{\"id\":");
            put_str(&j->calls, id);
            json_buf_puts(&j->calls, ",\"type\":\"function\",\"function\":{\"name\":");
            put_str(&j->calls, name);
        }
        return;
    }
    j->n_calls++;
    json_buf b;
    json_buf_init(&b);
    if (j->api == API_MESSAGES) {
        anth_block_close(j);
        bprintf(&b, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":{\"type\":\"tool_use\",\"id\":",
                j->blk_idx);
        put_str(&b, id);
        json_buf_puts(&b, ",\"name\":");
        put_str(&b, name);
        json_buf_puts(&b, ",\"input\":{}}}");
        anth_event(j, "content_block_start", &b);
        j->blk = BLK_TOOL;
    } else {
        chunk_head(&b, j);
        bprintf(&b, "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":%d,\"id\":", idx);
        put_str(&b, id);
        json_buf_puts(&b, ",\"type\":\"function\",\"function\":{\"name\":");
        put_str(&b, name);
        json_buf_puts(&b, ",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}");
        chunk_tail(&b, j);
        out_put(j, b.p, b.len);
    }
    json_buf_free(&b);
}

static void emit_call_end(job *j, int idx, const char *args, size_t n)
{
    if (!j->call_open) return;
    j->call_open = 0;
    if (!j->stream) {
        if (j->api == API_MESSAGES) {
            df_error err = {0};
            json_doc *d = json_parse(args, n, &err);
            json_buf_puts(&j->calls, ",\"input\":");
            if (d && json_root(d)->type == JSON_OBJECT) json_write_value(&j->calls, json_root(d), 0);
            else json_buf_puts(&j->calls, "{}");
            json_free(d);
            json_buf_puts(&j->calls, "}");
        } else {
            json_buf_puts(&j->calls, ",\"arguments\":");
            json_write_string(&j->calls, args, n);
            json_buf_puts(&j->calls, "}}");
        }
        return;
    }
    json_buf b;
    json_buf_init(&b);
    if (j->api == API_MESSAGES) {
        bprintf(&b, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\","
                "\"partial_json\":", j->blk_idx);
        json_write_string(&b, args, n);
        json_buf_puts(&b, "}}");
        anth_event(j, "content_block_delta", &b);
        anth_block_close(j);
    } else {
        chunk_head(&b, j);
        bprintf(&b, "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", idx);
        json_write_string(&b, args, n);
        json_buf_puts(&b, "}}]},\"logprobs\":null,\"finish_reason\":null}");
        chunk_tail(&b, j);
        out_put(j, b.p, b.len);
    }
    json_buf_free(&b);
}

static void emit_begin(job *j)
{
    if (!j->stream) return;
    json_buf b;
    json_buf_init(&b);
    if (j->api == API_CHAT) {
        chunk_head(&b, j);
        json_buf_puts(&b, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                          "\"finish_reason\":null}");
        chunk_tail(&b, j);
        out_put(j, b.p, b.len);
    } else if (j->api == API_MESSAGES) {
        json_buf_puts(&b, "{\"type\":\"message_start\",\"message\":{\"id\":");
        put_str(&b, j->id);
        json_buf_puts(&b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        put_str(&b, j->model);
        bprintf(&b, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%zu,"
                "\"output_tokens\":0}}}", j->n_ids);
        anth_event(j, "message_start", &b);
    }
    json_buf_free(&b);
}

static const char *finish_name(const job *j)
{
    if (j->api == API_MESSAGES)
        return j->fin == FIN_LENGTH ? "max_tokens" : j->fin == FIN_STOPSEQ ? "stop_sequence"
             : j->n_calls ? "tool_use" : "end_turn";
    return j->fin == FIN_LENGTH ? "length" : j->n_calls && j->fin == FIN_STOP ? "tool_calls" : "stop";
}

/* The end of the response: the final stream events, or the whole body. */
static void emit_finish(job *j)
{
    json_buf b;
    json_buf_init(&b);
    if (j->fin == FIN_ERROR) {
        rq_err e = {0};
        rq_fail(&e, 500, NULL, "%s", j->errmsg);
        if (j->stream) {
            if (j->api == API_MESSAGES) json_buf_puts(&b, "event: error\n");
            json_buf_puts(&b, "data: ");
            error_body(&b, j->api, &e);
            json_buf_puts(&b, "\n\n");
        } else {
            error_body(&b, j->api, &e);
        }
    } else if (j->stream && j->api == API_MESSAGES) {
        anth_block_close(j);
        json_buf_puts(&b, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":");
        put_str(&b, finish_name(j));
        json_buf_puts(&b, ",\"stop_sequence\":");
        if (j->stop_hit) put_str(&b, j->stop_hit);
        else json_buf_puts(&b, "null");
        bprintf(&b, "},\"usage\":{\"output_tokens\":%d}}", j->n_gen);
        anth_event(j, "message_delta", &b);
        json_buf_puts(&b, "{\"type\":\"message_stop\"}");
        anth_event(j, "message_stop", &b);
    } else if (j->stream) {
        chunk_head(&b, j);
        json_buf_puts(&b, j->api == API_CHAT ? "{\"index\":0,\"delta\":{},\"logprobs\":" : "{\"index\":0,\"text\":\"\",\"logprobs\":");
        if (j->lp_n) logprobs_json(&b, j);
        else json_buf_puts(&b, "null");
        json_buf_puts(&b, ",\"finish_reason\":");
        put_str(&b, finish_name(j));
        json_buf_puts(&b, "}");
        chunk_tail(&b, j);
        if (j->include_usage) {
            chunk_head(&b, j);
            json_buf_puts(&b, "],\"usage\":");
            usage_json(&b, j);
            json_buf_puts(&b, "}\n\n");
        }
        json_buf_puts(&b, "data: [DONE]\n\n");
    } else if (j->api == API_MESSAGES) {
        json_buf_puts(&b, "{\"id\":");
        put_str(&b, j->id);
        json_buf_puts(&b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        put_str(&b, j->model);
        json_buf_puts(&b, ",\"content\":[");
        int nb = 0;
        if (j->acc[CH_REASONING].len) {
            json_buf_puts(&b, "{\"type\":\"thinking\",\"thinking\":");
            json_write_string(&b, j->acc[0].p, j->acc[0].len);
            json_buf_puts(&b, ",\"signature\":\"\"}");
            nb++;
        }
        if (j->acc[CH_CONTENT].len || (!nb && !j->n_calls)) {
            json_buf_puts(&b, nb++ ? ",{\"type\":\"text\",\"text\":" : "{\"type\":\"text\",\"text\":");
            json_write_string(&b, j->acc[1].p ? j->acc[1].p : "", j->acc[1].len);
            json_buf_puts(&b, "}");
        }
        if (j->n_calls) {
            if (nb) json_buf_puts(&b, ",");
            json_buf_put(&b, j->calls.p, j->calls.len);
        }
        json_buf_puts(&b, "],\"stop_reason\":");
        put_str(&b, finish_name(j));
        json_buf_puts(&b, ",\"stop_sequence\":");
        if (j->stop_hit) put_str(&b, j->stop_hit);
        else json_buf_puts(&b, "null");
        json_buf_puts(&b, ",\"usage\":");
        usage_json(&b, j);
        json_buf_puts(&b, "}");
    } else {
        json_buf_puts(&b, "{\"id\":");
        put_str(&b, j->id);
        bprintf(&b, ",\"object\":\"%s\",\"created\":%ld,\"model\":", j->api == API_CHAT ? "chat.completion"
                : "text_completion", j->created);
        put_str(&b, j->model);
        json_buf_puts(&b, ",\"choices\":[{\"index\":0,");
        if (j->api == API_CHAT) {
            json_buf_puts(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
            if (j->acc[1].len || !j->n_calls) json_write_string(&b, j->acc[1].p ? j->acc[1].p : "", j->acc[1].len);
            else json_buf_puts(&b, "null");
            if (j->acc[0].len) {
                json_buf_puts(&b, ",\"reasoning_content\":");
                json_write_string(&b, j->acc[0].p, j->acc[0].len);
            }
            if (j->n_calls) {
                json_buf_puts(&b, ",\"tool_calls\":[");
                json_buf_put(&b, j->calls.p, j->calls.len);
                json_buf_puts(&b, "]");
            }
            json_buf_puts(&b, "},");
        } else {
            json_buf_puts(&b, "\"text\":");
            json_write_string(&b, j->acc[1].p ? j->acc[1].p : "", j->acc[1].len);
            json_buf_puts(&b, ",");
        }
        json_buf_puts(&b, "\"logprobs\":");
        logprobs_json(&b, j);
        json_buf_puts(&b, ",\"finish_reason\":");
        put_str(&b, finish_name(j));
        json_buf_puts(&b, "}],\"usage\":");
        usage_json(&b, j);
        json_buf_puts(&b, "}");
    }
    pthread_mutex_lock(&j->mu);
    if (!j->stream && j->fin == FIN_ERROR) j->status = 500;
    json_buf_put(&j->out, b.p, b.len);
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    json_buf_free(&b);
}

/* ---- log-probabilities (sampling is sampler.c's) ------------------------ */

static void token_text_chat(json_buf *b, srv *S, int32_t id, double lp)
{
    size_t n;
    const char *s = tokenizer_token_bytes(S->tok, id, &n);
    json_buf_puts(b, "{\"token\":");
    put_str_utf8(b, s, n);
    json_buf_puts(b, ",\"logprob\":");
    json_write_double(b, lp);
    json_buf_puts(b, ",\"bytes\":[");
    for (size_t i = 0; i < n; i++) bprintf(b, "%s%u", i ? "," : "", (unsigned char)s[i]);
    json_buf_puts(b, "]");
}

/* log-softmax of the current logits in double: entries for the chosen id
 * and the top alternatives, appended to the job's pending logprobs. */
static void record_logprobs(srv *S, job *j, int32_t id, size_t text_len)
{
    int V = S->info.vocab;
    const float *lg = S->logits;
    double lse = sampler_logsumexp(lg, V);
    int top[MAX_TOP_LOGPROBS];
    int k = sampler_top_ids(lg, V, j->top_logprobs, top);
    if (j->api == API_CHAT) {
        json_buf *b = &j->lp[0];
        if (j->lp_n) json_buf_puts(b, ",");
        token_text_chat(b, S, id, (double)lg[id] - lse);
        json_buf_puts(b, ",\"top_logprobs\":[");
        for (int i = 0; i < k; i++) {
            if (i) json_buf_puts(b, ",");
            token_text_chat(b, S, top[i], (double)lg[top[i]] - lse);
            json_buf_puts(b, "}");
        }
        json_buf_puts(b, "]}");
    } else {
        const char *sep = j->lp_n ? "," : "";
        size_t n;
        const char *s = tokenizer_token_bytes(S->tok, id, &n);
        json_buf_puts(&j->lp[0], sep);
        put_str_utf8(&j->lp[0], s, n);
        json_buf_puts(&j->lp[1], sep);
        json_write_double(&j->lp[1], (double)lg[id] - lse);
        json_buf_puts(&j->lp[2], sep);
        json_buf_puts(&j->lp[2], "{");
        for (int i = 0; i < k; i++) {
            s = tokenizer_token_bytes(S->tok, top[i], &n);
            if (i) json_buf_puts(&j->lp[2], ",");
            put_str_utf8(&j->lp[2], s, n);
            json_buf_puts(&j->lp[2], ":");
            json_write_double(&j->lp[2], (double)lg[top[i]] - lse);
        }
        json_buf_puts(&j->lp[2], "}");
        bprintf(&j->lp[3], "%s%zu", sep, j->text_off);
    }
    j->text_off += text_len;
    j->lp_n++;
}

/* ---- the worker ------------------------------------------------------- */

static int feed(srv *S, job *j, const int32_t *ids, size_t n)
{
    df_error err = {0};
    for (size_t o = 0; o < n;) {
        if (atomic_load(&j->cancelled)) return 1;
        size_t k = n - o < 256 ? n - o : 256;
        if (df_session_eval(S->s, ids + o, (int)k, S->logits, 0, &err)) {
            snprintf(j->errmsg, sizeof j->errmsg, "%s", err.msg);
            return -1;
        }
        if (S->n_hist + k > S->cap_hist) {
            S->cap_hist = (S->n_hist + k) * 2;
            S->hist = xrealloc(S->hist, S->cap_hist * sizeof *S->hist);
        }
        memcpy(S->hist + S->n_hist, ids + o, k * sizeof *ids);
        S->n_hist += k;
        o += k;
    }
    return 0;
}

static void handle_events(job *j, const chat_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const chat_event *e = &ev[i];
        switch (e->type) {
        case CHAT_EV_REASONING: emit_text(j, CH_REASONING, e->text, e->len); break;
        case CHAT_EV_CONTENT: emit_text(j, CH_CONTENT, e->text, e->len); break;
        case CHAT_EV_CALL_BEGIN: emit_call_begin(j, e->index, e->name); break;
        case CHAT_EV_CALL_END: emit_call_end(j, e->index, e->text, e->len); break;
        default: break;
        }
    }
}

static void run_job(srv *S, job *j)
{
    double t0 = now();
    /* the session's history counts only if the job that left it was delivered */
    int reuse = S->hist_ok;
    if (reuse && S->last) {
        /* its connection thread may still be writing the last bytes: wait briefly for the verdict */
        job *l = S->last;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_mutex_lock(&l->mu);
        while (!atomic_load(&l->delivered) && !atomic_load(&l->cancelled))
            if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT) break;
        pthread_mutex_unlock(&l->mu);
        reuse = atomic_load(&l->delivered);
    }
    if (S->last) job_unref(S->last);
    S->last = NULL;
    S->hist_ok = 0;
    size_t from = 0;
    if (reuse && S->n_hist && S->n_hist < j->n_ids && !memcmp(S->hist, j->ids, S->n_hist * sizeof *j->ids)) {
        from = S->n_hist;
    } else {
        df_session_reset(S->s);
        S->n_hist = 0;
    }
    j->n_reused = (int)from;
    j->gate_ch = -1;
    emit_begin(j);
    int rc = feed(S, j, j->ids + from, j->n_ids - from);
    sampler_reset(&S->smp, j->temperature, j->top_p, 0, j->seed);
    tok_decoder dec;
    tok_decoder_init(&dec, S->tok);
    chat_parser_reset(S->parser, j->think);
    j->fin = FIN_STOP;
    double t_first = 0;
    while (!rc) {
        if (atomic_load(&j->cancelled)) { j->fin = FIN_CANCEL; break; }
        if (now() > j->deadline) { j->fin = FIN_LENGTH; break; }
        int32_t next = sampler_next(&S->smp, S->logits);
        if (!j->n_gen++) t_first = now();
        size_t tl = 0;
        if (j->logprobs) tokenizer_token_bytes(S->tok, next, &tl);
        if (j->logprobs) record_logprobs(S, j, next, tl);
        if (j->api == API_COMPLETIONS) {
            if (next == S->info.eos_id) break;
            size_t n = tok_decoder_feed(&dec, next, S->dbuf, S->dcap);
            emit_text(j, CH_CONTENT, S->dbuf, n);
        } else {
            const chat_event *ev;
            size_t n = chat_parser_feed(S->parser, next, &ev);
            handle_events(j, ev, n);
        }
        if (j->stopped) { j->fin = FIN_STOPSEQ; break; }
        if (next == S->info.eos_id || (j->api != API_COMPLETIONS && chat_parser_done(S->parser))) break;
        /* the last token is not fed: the session holds exactly what was evaluated */
        if (j->n_gen >= j->max_tokens || df_session_pos(S->s) + 1 >= S->n_ctx) { j->fin = FIN_LENGTH; break; }
        rc = feed(S, j, &next, 1);
    }
    if (rc > 0) j->fin = FIN_CANCEL;
    if (rc < 0) j->fin = FIN_ERROR;
    if (j->fin == FIN_LENGTH || j->fin == FIN_STOPSEQ) {
        if (j->api == API_COMPLETIONS) {
            size_t n = tok_decoder_flush(&dec, S->dbuf, S->dcap);
            emit_text(j, CH_CONTENT, S->dbuf, n);
        } else {
            const chat_event *ev;
            size_t n = chat_parser_finish(S->parser, &ev);
            handle_events(j, ev, n);
        }
        if (j->stopped) j->fin = FIN_STOPSEQ;
    }
    if (!j->stopped) gate_flush(j);
    if (j->fin != FIN_CANCEL) emit_finish(j);
    else {
        pthread_mutex_lock(&j->mu);
        j->done = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
    double t1 = now();
    pthread_mutex_lock(&S->mu);
    S->tok_prompt += j->n_ids - from;
    S->tok_reused += from;
    S->tok_gen += (uint64_t)j->n_gen;
    S->gen_seconds += t1 - t0;
    if (j->n_gen > 1 && t_first > 0 && t1 > t_first) S->last_tps = (j->n_gen - 1) / (t1 - t_first);
    if (j->fin == FIN_ERROR) S->n_errors++;
    df_engine_stats(S->eng, &S->stats);
    pthread_mutex_unlock(&S->mu);
    if (j->fin == FIN_ERROR) {
        df_session_reset(S->s);
        S->n_hist = 0;
    } else {
        S->hist_ok = j->fin != FIN_CANCEL;
    }
    S->last = j; /* keeps the worker's reference */
}

static void *worker_main(void *arg)
{
    srv *S = arg;
    for (;;) {
        pthread_mutex_lock(&S->mu);
        while (!S->head && !S->stop) pthread_cond_wait(&S->cv, &S->mu);
        if (S->stop) {
            pthread_mutex_unlock(&S->mu);
            break;
        }
        job *j = S->head;
        S->head = j->next;
        if (!S->head) S->tail = NULL;
        S->n_waiting--;
        S->running = 1;
        pthread_mutex_unlock(&S->mu);
        run_job(S, j);
        pthread_mutex_lock(&S->mu);
        S->running = 0;
        pthread_mutex_unlock(&S->mu);
    }
    return NULL;
}

/* ---- HTTP -------------------------------------------------------------- */

typedef struct req {
    json_buf body;
    int too_big;
    job *j;
} req;

static enum MHD_Result reply(struct MHD_Connection *c, int status, const char *type, const char *body, size_t n)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)(uintptr_t)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 429) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, int status, json_buf *b)
{
    enum MHD_Result rc = reply(c, status, "application/json", b->p ? b->p : "", b->len);
    json_buf_free(b);
    return rc;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, int api, rq_err *e)
{
    json_buf b;
    json_buf_init(&b);
    error_body(&b, api, e);
    return reply_json(c, e->status, &b);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += j->S->ping_ms / 1000;
    ts.tv_nsec += (long)(j->S->ping_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (j->sent == j->out.len && !j->done) {
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) {
            /* prefill or a slow token: an SSE comment keeps proxies and clients from timing out */
            pthread_mutex_unlock(&j->mu);
            static const char ping[] = ": ping\n\n";
            size_t n = sizeof ping - 1 < max ? sizeof ping - 1 : max;
            memcpy(buf, ping, n);
            return (ssize_t)n;
        }
    }
    size_t n = j->out.len - j->sent;
    if (!n) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (n > max) n = max;
    memcpy(buf, j->out.p + j->sent, n);
    j->sent += n;
    pthread_mutex_unlock(&j->mu);
    return (ssize_t)n;
}

static void stream_free(void *cls) { job_unref(cls); }

static int route(const char *url)
{
    if (!strncmp(url, "/v1/", 4)) url += 3;
    if (!strcmp(url, "/chat/completions")) return API_CHAT;
    if (!strcmp(url, "/completions")) return API_COMPLETIONS;
    if (!strcmp(url, "/messages")) return API_MESSAGES;
    return -1;
}

static int authorized(srv *S, struct MHD_Connection *c)
{
    if (!S->api_key) return 1;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (auth && !strncasecmp(auth, "Bearer ", 7) && !strcmp(auth + 7, S->api_key)) return 1;
    return x && !strcmp(x, S->api_key);
}

static enum MHD_Result serve_metrics(srv *S, struct MHD_Connection *c)
{
    json_buf b;
    json_buf_init(&b);
    pthread_mutex_lock(&S->mu);
    df_stats st = S->stats;
    uint64_t uses = st.expert_hits + st.expert_misses, prompt_all = S->tok_prompt + S->tok_reused;
    bprintf(&b, "# TYPE deltafin_requests_total counter\ndeltafin_requests_total %llu\n"
            "# TYPE deltafin_requests_rejected_total counter\ndeltafin_requests_rejected_total %llu\n"
            "# TYPE deltafin_requests_failed_total counter\ndeltafin_requests_failed_total %llu\n",
            (unsigned long long)S->n_requests, (unsigned long long)S->n_rejected, (unsigned long long)S->n_errors);
    bprintf(&b, "# TYPE deltafin_prompt_tokens_total counter\ndeltafin_prompt_tokens_total %llu\n"
            "# TYPE deltafin_prompt_tokens_reused_total counter\ndeltafin_prompt_tokens_reused_total %llu\n"
            "# TYPE deltafin_generated_tokens_total counter\ndeltafin_generated_tokens_total %llu\n",
            (unsigned long long)S->tok_prompt, (unsigned long long)S->tok_reused, (unsigned long long)S->tok_gen);
    bprintf(&b, "# TYPE deltafin_decode_tokens_per_second gauge\ndeltafin_decode_tokens_per_second %.3f\n"
            "# TYPE deltafin_generation_seconds_total counter\ndeltafin_generation_seconds_total %.3f\n"
            "# TYPE deltafin_queue_length gauge\ndeltafin_queue_length %d\n"
            "# TYPE deltafin_busy gauge\ndeltafin_busy %d\n",
            S->last_tps, S->gen_seconds, S->n_waiting, S->running);
    bprintf(&b, "# TYPE deltafin_prompt_cache_hit_ratio gauge\ndeltafin_prompt_cache_hit_ratio %.4f\n",
            prompt_all ? (double)S->tok_reused / (double)prompt_all : 0.0);
    pthread_mutex_unlock(&S->mu);
    bprintf(&b, "# TYPE deltafin_positions_evaluated_total counter\ndeltafin_positions_evaluated_total %llu\n"
            "# TYPE deltafin_expert_cache_hit_ratio gauge\ndeltafin_expert_cache_hit_ratio %.4f\n"
            "# TYPE deltafin_expert_bytes_read_total counter\ndeltafin_expert_bytes_read_total %llu\n"
            "# TYPE deltafin_expert_reads_total counter\ndeltafin_expert_reads_total %llu\n"
            "# TYPE deltafin_io_wait_seconds_total counter\ndeltafin_io_wait_seconds_total %.3f\n",
            (unsigned long long)st.tokens, uses ? (double)st.expert_hits / (double)uses : 0.0,
            (unsigned long long)st.expert_bytes_read, (unsigned long long)st.expert_reads, st.io_wait_sec);
    enum MHD_Result rc = reply(c, 200, "text/plain; version=0.0.4", b.p, b.len);
    json_buf_free(&b);
    return rc;
}

/* Parses and validates BODY for API into a new job (one reference), or
 * returns NULL with E filled.  No HTTP here: server_parse_request and the
 * fuzz target call it too. */
static job *request_job(srv *S, int api, const char *body, size_t len, rq_err *e)
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
    j->status = 200;
    j->created = (long)time(NULL);
    unsigned long seq = atomic_fetch_add(&S->job_counter, 1) + 1;
    snprintf(j->id, sizeof j->id, "%s%08lx%08lx", api == API_CHAT ? "chatcmpl-" : api == API_MESSAGES ? "msg_" : "cmpl-",
             (unsigned long)(j->created & 0xffffffff), seq);
    int rc;
    if (o->type != JSON_OBJECT) rc = rq_fail(e, 400, NULL, "the request body must be a JSON object");
    else if (api == API_CHAT) rc = parse_chat(S, j, o, e);
    else if (api == API_COMPLETIONS) rc = parse_completions(S, j, o, e);
    else rc = parse_messages(S, j, o, e);
    json_free(doc);
    if (rc) {
        job_unref(j);
        return NULL;
    }
    return j;
}

int server_parse_request(const server_limits *lim, int endpoint, const char *body, size_t len, char **err_body,
                         size_t *n_ids)
{
    static const int apis[] = {API_CHAT, API_COMPLETIONS, API_MESSAGES};
    CHECK(endpoint >= 0 && endpoint < 3);
    srv *S = xcalloc(1, sizeof *S);
    S->name = lim->name ? lim->name : "deltafin";
    S->tok = lim->tok;
    S->n_ctx = lim->n_ctx;
    S->max_tokens_cap = lim->max_tokens_cap;
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

static enum MHD_Result serve_generate(srv *S, struct MHD_Connection *c, int api, req *r)
{
    rq_err e = {0};
    if (!atomic_load(&S->ready)) {
        rq_fail(&e, 503, NULL, "the model is still loading");
        return reply_error(c, api, &e);
    }
    job *j = request_job(S, api, r->body.p, r->body.len, &e);
    if (!j) return reply_error(c, api, &e);
    j->deadline = now() + S->timeout;
    pthread_mutex_lock(&S->mu);
    S->n_requests++;
    if (S->n_waiting >= S->queue_max) {
        S->n_rejected++;
        pthread_mutex_unlock(&S->mu);
        job_unref(j);
        rq_fail(&e, 429, NULL, "the server is busy (%d requests queued); retry later", S->queue_max);
        return reply_error(c, api, &e);
    }
    j->refs += 2; /* the worker's; the connection's (req) */
    if (S->tail) S->tail->next = j;
    else S->head = j;
    S->tail = j;
    S->n_waiting++;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    r->j = j;
    if (j->stream) {
        job_ref(j);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j,
                                                                      stream_free);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        enum MHD_Result res = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        job_unref(j); /* the creation reference; r->j keeps one */
        return res;
    }
    /* wait for the body; a client that hangs up meanwhile cancels the job
     * (polled: this thread is blocked here, not in MHD's socket code) */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT && fd >= 0) {
            struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
            if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) atomic_store(&j->cancelled, 1);
        }
    }
    int status = j->status;
    json_buf body = j->out;
    json_buf_init(&j->out);
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
    return reply_json(c, status, &body);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    alloc_guard_exempt_thread();
    srv *S = cls;
    req *r = *con_cls;
    int post = !strcmp(method, "POST");
    int api = route(url);
    if (!r) {
        r = xcalloc(1, sizeof *r);
        *con_cls = r;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        /* a body a little over the limit is read and dropped, so that the client
         * sees the 413 instead of a reset while it is still sending; a huge one
         * is refused at once and the connection closed */
        if (post && cl && strtoull(cl, NULL, 10) > S->max_body + ((size_t)16 << 20)) {
            r->too_big = 1;
            rq_err e = {0};
            rq_fail(&e, 413, NULL, "the request body is larger than %zu bytes", S->max_body);
            return reply_error(c, api, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!r->too_big && r->body.len + *upload_size > S->max_body) {
            r->too_big = 1;
            json_buf_free(&r->body);
        }
        if (!r->too_big) json_buf_put(&r->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    rq_err e = {0};
    if (r->too_big) {
        rq_fail(&e, 413, NULL, "the request body is larger than %zu bytes", S->max_body);
        return reply_error(c, api, &e);
    }
    const char *path = !strncmp(url, "/v1/", 4) ? url + 3 : url;
    if (!strcmp(url, "/") && !strcmp(method, "GET"))
        return reply(c, 200, "text/html; charset=utf-8", server_page_html, strlen(server_page_html));
    if (!strcmp(path, "/health")) {
        int ok = atomic_load(&S->ready);
        const char *b = ok ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}";
        return reply(c, ok ? 200 : 503, "application/json", b, strlen(b));
    }
    if (!authorized(S, c)) {
        e.code = "invalid_api_key";
        rq_fail(&e, 401, NULL, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)");
        return reply_error(c, api, &e);
    }
    if (!strcmp(path, "/metrics") && !strcmp(method, "GET")) return serve_metrics(S, c);
    if (!strcmp(path, "/models") && !strcmp(method, "GET")) {
        json_buf b;
        json_buf_init(&b);
        json_buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
        put_str(&b, S->name);
        json_buf_puts(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"deltafin\",\"type\":\"model\",\"display_name\":");
        put_str(&b, S->name);
        bprintf(&b, ",\"context_length\":%d}]}", S->n_ctx);
        return reply_json(c, 200, &b);
    }
    if (api >= 0 && post) return serve_generate(S, c, api, r);
    if (api >= 0) {
        rq_fail(&e, 405, NULL, "%s needs POST", url);
        return reply_error(c, api, &e);
    }
    rq_fail(&e, 404, NULL, "no route for %s %.*s", method, (int)utf8_cut(url, strlen(url), 200), url);
    return reply_error(c, API_CHAT, &e);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    alloc_guard_exempt_thread();
    req *r = *con_cls;
    if (!r) return;
    if (r->j) {
        pthread_mutex_lock(&r->j->mu);
        if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) atomic_store(&r->j->delivered, 1);
        else atomic_store(&r->j->cancelled, 1);
        pthread_cond_broadcast(&r->j->cv);
        pthread_mutex_unlock(&r->j->mu);
        job_unref(r->j);
    }
    json_buf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

/* ---- command ------------------------------------------------------------ */

int cmd_serve(int argc, char **argv)
{
    static srv S_;
    srv *S = &S_;
    S->host = "127.0.0.1";
    S->port = 8080;
    S->queue_max = 16;
    S->max_body = (size_t)128 << 20;
    S->max_tokens_cap = 32768;
    S->timeout = 600;
    S->ping_ms = 2000;
    /* serve's own options; the rest go to parse_common */
    char **rest = xmalloc(((size_t)argc + 1) * sizeof *rest);
    int n_rest = 0;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
#define SERVE_OPT(name) (!strcmp(f, name) && (has || (die("%s needs a value", name), 0)))
        if (i < 2) rest[n_rest++] = argv[i];
        else if (SERVE_OPT("--host")) S->host = argv[++i];
        else if (SERVE_OPT("--port")) S->port = (int)parse_long(argv[++i], f, 0, 65535);
        else if (SERVE_OPT("--queue")) S->queue_max = (int)parse_long(argv[++i], f, 1, 1 << 20);
        else if (SERVE_OPT("--api-key")) S->api_key = argv[++i];
        else if (SERVE_OPT("--max-request-bytes")) S->max_body = parse_size(argv[++i], f);
        else if (SERVE_OPT("--max-tokens")) S->max_tokens_cap = (int)parse_long(argv[++i], f, 1, 1 << 24);
        else if (SERVE_OPT("--timeout")) S->timeout = (double)parse_long(argv[++i], f, 1, 1 << 24);
        else if (SERVE_OPT("--name")) S->name = argv[++i];
        else if (SERVE_OPT("--ping-ms")) S->ping_ms = (int)parse_long(argv[++i], f, 10, 3600000);
        else rest[n_rest++] = argv[i];
#undef SERVE_OPT
    }
    rest[n_rest] = NULL;
    parse_common(n_rest, rest, &S->a);
    if (!S->name) {
        /* the model directory's name ("checkpoint" names its parent) */
        char *m = xstrdup(S->a.model), *base;
        for (size_t n = strlen(m); n > 1 && m[n - 1] == '/'; n--) m[n - 1] = 0;
        base = strrchr(m, '/');
        if (base && !strcmp(base + 1, "checkpoint") && base > m) {
            *base = 0;
            base = strrchr(m, '/');
        }
        S->name = base ? base + 1 : m;
        if (!*S->name) S->name = "kimi-k3";
    }
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)S->port);
    const char *h = !strcmp(S->host, "localhost") ? "127.0.0.1" : S->host;
    if (inet_pton(AF_INET, h, &sa.sin_addr) != 1) die("--host needs an IPv4 address, got \"%s\"", S->host);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)S->port, NULL,
        NULL, on_request, S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
        S, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)S->timeout, MHD_OPTION_CONNECTION_LIMIT, 512u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "deltafin: cannot listen on %s:%d: %s\n", S->host, S->port, strerror(errno));
        return 1;
    }
    fprintf(stderr, "deltafin: listening on http://%s:%d/ (loading %s)\n", S->host, S->port, S->a.model);

    df_error err = {0};
    if (tokenizer_load(S->a.model, &S->tok, &err)) {
        fprintf(stderr, "deltafin: cannot load the tokenizer: %s\n", err.msg);
        MHD_stop_daemon(d);
        return 1;
    }
    S->eng = open_engine(&S->a);
    df_engine_info(S->eng, &S->info);
    if (tokenizer_n_vocab(S->tok) != S->info.vocab) {
        fprintf(stderr, "deltafin: the tokenizer has %d ids but the model's vocabulary is %d\n",
                tokenizer_n_vocab(S->tok), S->info.vocab);
        return 1;
    }
    df_session_opts so;
    df_session_opts_default(&so);
    if (S->a.ctx) so.n_ctx = S->a.ctx;
    if (S->a.batch) so.max_batch = S->a.batch;
    if (df_session_new(S->eng, &so, &S->s, &err) || chat_parser_new(S->tok, 1, &S->parser, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    S->n_ctx = so.n_ctx;
    df_engine_stats(S->eng, &S->stats);
    S->logits = xmalloc((size_t)S->info.vocab * sizeof *S->logits);
    sampler_init(&S->smp, S->info.vocab, 0, 1, 0, 0);
    S->dcap = tok_decoder_max_out(S->tok) + 16;
    S->dbuf = xmalloc(S->dcap);
    pthread_t worker;
    if (pthread_create(&worker, NULL, worker_main, S)) die("cannot start the worker thread");
    atomic_store(&S->ready, 1);
    fprintf(stderr, "deltafin: ready: model %s, context %d, queue %d\n", S->name, S->n_ctx, S->queue_max);

    int sig = 0;
    sigwait(&sigs, &sig);
    while (sig == SIGPIPE) sigwait(&sigs, &sig);
    fprintf(stderr, "deltafin: stopping\n");
    MHD_stop_daemon(d);
    pthread_mutex_lock(&S->mu);
    S->stop = 1;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    pthread_join(worker, NULL);
    if (S->last) job_unref(S->last);
    while (S->head) {
        job *j = S->head;
        S->head = j->next;
        job_unref(j);
    }
    chat_parser_free(S->parser);
    df_session_free(S->s);
    df_engine_close(S->eng);
    tokenizer_free(S->tok);
    free(S->logits);
    sampler_free(&S->smp);
    free(S->dbuf);
    free(S->hist);
    free(rest);
    return 0;
}

/* ---- the chat page (GET /): self-contained, no external resources ------- */

const char server_page_html[] =
    "<!doctype html><html><head><meta charset=\"utf-8\"><title>deltafin</title>\n"
    "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n"
    "<style>body{font:15px/1.45 system-ui,sans-serif;max-width:820px;margin:0 auto;padding:12px;background:#fafafa}"
    "#log{min-height:60vh}.m{white-space:pre-wrap;margin:10px 0;padding:8px 10px;border-radius:8px}"
    ".user{background:#dde8ff}.assistant{background:#fff;border:1px solid #ddd}details{color:#666;font-size:13px}"
    "details pre{white-space:pre-wrap;margin:4px 0}#bar{display:flex;gap:6px}textarea{flex:1;height:60px}"
    "#st{color:#666;font-size:13px;margin:6px 0}input{width:140px}</style></head><body>\n"
    "<h3>deltafin</h3><div id=\"log\"></div><div id=\"st\"></div>\n"
    "<div id=\"bar\"><textarea id=\"q\" placeholder=\"Message (Enter sends, Shift+Enter: new line)\"></textarea>"
    "<div><button id=\"go\">Send</button><br><button id=\"stop\">Stop</button><br><button id=\"clr\">Clear</button>"
    "</div></div><p><label>API key <input id=\"key\" type=\"password\"></label> "
    "<label>effort <select id=\"eff\"><option>max</option><option>high</option><option>low</option>"
    "<option>none</option></select></label> <label>max tokens <input id=\"mt\" value=\"1024\" size=6></label></p>\n"
    "<script>\n"
    "const $=id=>document.getElementById(id);let hist=[],ctl=null;\n"
    "function add(cls){const d=document.createElement('div');d.className='m '+cls;$('log').appendChild(d);return d}\n"
    "async function send(){const text=$('q').value.trim();if(!text||ctl)return;$('q').value='';\n"
    " add('user').textContent=text;hist.push({role:'user',content:text});\n"
    " const box=add('assistant'),det=document.createElement('details'),sum=document.createElement('summary'),"
    "pre=document.createElement('pre'),ans=document.createElement('div');\n"
    " sum.textContent='reasoning';det.appendChild(sum);det.appendChild(pre);box.appendChild(det);box.appendChild(ans);\n"
    " ctl=new AbortController();let n=0,t0=performance.now(),t1=0,reasoning='',content='';\n"
    " const body={messages:hist,stream:true,stream_options:{include_usage:true},max_tokens:+$('mt').value||1024,"
    "reasoning_effort:$('eff').value};\n"
    " const h={'Content-Type':'application/json'};if($('key').value)h.Authorization='Bearer '+$('key').value;\n"
    " try{const r=await fetch('/v1/chat/completions',{method:'POST',headers:h,body:JSON.stringify(body),signal:ctl.signal});\n"
    "  if(!r.ok){ans.textContent='error '+r.status+': '+await r.text();hist.pop();return}\n"
    "  const rd=r.body.getReader(),dec=new TextDecoder();let buf='';\n"
    "  for(;;){const {done,value}=await rd.read();if(done)break;buf+=dec.decode(value,{stream:true});let i;\n"
    "   while((i=buf.indexOf('\\n\\n'))>=0){const ev=buf.slice(0,i);buf=buf.slice(i+2);\n"
    "    for(const line of ev.split('\\n')){if(!line.startsWith('data: '))continue;const d=line.slice(6);if(d==='[DONE]')continue;\n"
    "     const j=JSON.parse(d);if(j.error){ans.textContent+='\\n[error: '+j.error.message+']';continue}\n"
    "     const c=j.choices&&j.choices[0];if(!c||!c.delta)continue;\n"
    "     if(c.delta.reasoning_content){reasoning+=c.delta.reasoning_content;pre.textContent=reasoning;n++}\n"
    "     if(c.delta.content){content+=c.delta.content;ans.textContent=content;n++}\n"
    "     if(c.delta.tool_calls)ans.textContent+=' [tool call] '+JSON.stringify(c.delta.tool_calls);\n"
    "     if(!t1&&n)t1=performance.now();const dt=(performance.now()-t1)/1000;\n"
    "     $('st').textContent=n+' chunks'+(dt>0&&n>1?', '+((n-1)/dt).toFixed(1)+' tok/s':'')+', first token '+((t1-t0)/1000).toFixed(2)+' s'}}}\n"
    "  hist.push({role:'assistant',content:content,reasoning_content:reasoning});\n"
    " }catch(e){ans.textContent+=' ['+e.name+']';hist.push({role:'assistant',content:content})}\n"
    " finally{ctl=null;if(!reasoning)det.remove();stats()}}\n"
    "async function stats(){try{const h={};if($('key').value)h.Authorization='Bearer '+$('key').value;\n"
    " const t=await (await fetch('/metrics',{headers:h})).text();const g=k=>{const m=t.match(new RegExp('^'+k+' (\\\\S+)','m'));return m?+m[1]:null};\n"
    " const hr=g('deltafin_expert_cache_hit_ratio'),mb=g('deltafin_expert_bytes_read_total');\n"
    " if(hr!==null)$('st').textContent+=', expert cache hits '+(100*hr).toFixed(1)+'%'+(mb!==null?', '+(mb/1048576).toFixed(1)+' MiB read':'')}catch(e){}}\n"
    "$('go').onclick=send;$('stop').onclick=()=>ctl&&ctl.abort();$('clr').onclick=()=>{hist=[];$('log').innerHTML=''};\n"
    "$('q').addEventListener('keydown',e=>{if(e.key==='Enter'&&!e.shiftKey){e.preventDefault();send()}});\n"
    "</script></body></html>\n";
