/* server_json.c - what every server file writes with (L5): printf into a
 * JSON buffer, JSON strings (put_str_utf8 repairs bytes that are not
 * UTF-8, as single tokens may be), and a refused request (rq_fail) with
 * its API-shaped error body; a job's last output handed over (emit_last).
 * Below the request, output and API files: it calls none of them, so none
 * of them needs another for these.
 */
#define _GNU_SOURCE
#include "server_impl.h"

/* ---- JSON writing -------------------------------------------------------- */

void bprintf(json_buf *b, const char *fmt, ...)
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
void put_str_utf8(json_buf *b, const char *s, size_t n)
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

void put_str(json_buf *b, const char *s) { json_write_string(b, s, strlen(s)); }

/* ---- request errors ----------------------------------------------------- */

int rq_fail(rq_err *e, int status, const char *param, const char *fmt, ...)
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
void error_body(json_buf *b, int api, const rq_err *e)
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

/* The job's last output: its bytes handed to the HTTP side, the job marked
 * done (server_emit.c's replies and server_responses.c's end with it). */
void emit_last(job *j, json_buf *b)
{
    pthread_mutex_lock(&j->mu);
    if (!j->stream && j->fin == FIN_ERROR) j->status = 500;
    json_buf_put(&j->out, b->p, b->len);
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    json_buf_free(b);
}
