/* server_emit.c - the server's output (L5): jobs' byte streams, the three
 * APIs' response shapes and SSE events (the Responses API's are
 * server_responses.c's, reached from emit_*), tool calls, stop-sequence holding,
 * finish reasons, usage and logprobs.  Written by the worker only (see
 * server.c); connection threads read job->out under job->mu. */
#define _GNU_SOURCE
#include "server_impl.h"

/* ---- small helpers ------------------------------------------------------ */

/* Append to the job's output and wake its connection thread. */
void out_put(job *j, const char *s, size_t n)
{
    pthread_mutex_lock(&j->mu);
    json_buf_put(&j->out, s, n);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ---- output: API-shaped events ----------------------------------------- */

static void usage_json(json_buf *b, const job *j)
{
    if (j->api == API_MESSAGES)
        /* Anthropic counts tokens read from a cache apart from input_tokens */
        bprintf(b, "{\"input_tokens\":%zu,\"cache_read_input_tokens\":%d,\"cache_creation_input_tokens\":0,"
                "\"output_tokens\":%d}", j->n_ids - (size_t)j->n_reused, j->n_reused, j->n_gen);
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
    if (j->blk == BLK_THINK) {
        /* the signature carries the thinking (server_anthropic.c), so a later
         * request renders the tokens the model produced */
        bprintf(&b, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"signature_delta\","
                "\"signature\":", j->blk_idx);
        anth_signature(&b, j->acc[CH_REASONING].p ? j->acc[CH_REASONING].p : "", j->acc[CH_REASONING].len);
        json_buf_puts(&b, "}}");
        anth_event(j, "content_block_delta", &b);
    }
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
    if (j->api == API_RESPONSES) {
        resp_text(j, ch, s, n);
        return;
    }
    if (!j->stream) {
        json_buf_put(&j->acc[ch], s, n);
        return;
    }
    json_buf b;
    json_buf_init(&b);
    if (j->api == API_MESSAGES) {
        anth_block_open(j, ch == CH_REASONING ? BLK_THINK : BLK_TEXT);
        if (ch == CH_REASONING) {
            json_buf_put(&j->acc[CH_REASONING], s, n); /* for the signature */
            if (j->think_omit) {
                json_buf_free(&b);
                return;
            }
        }
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

void gate_flush(job *j)
{
    size_t n = j->gate.len;
    j->gate.len = 0;
    emit_raw(j, j->gate_ch, j->gate.p, n);
}

/* Text through the stop-sequence gate: the last (longest stop - 1) bytes
 * are held back until they cannot start a stop sequence. */
void emit_text(job *j, int ch, const char *s, size_t n)
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

void emit_call_begin(job *j, int idx, const char *name)
{
    if (j->stopped) return;
    gate_flush(j);
    if (j->api == API_RESPONSES) {
        j->call_open = 1;
        j->n_calls++;
        resp_call_begin(j, idx, name);
        return;
    }
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

void emit_call_end(job *j, int idx, const char *args, size_t n)
{
    if (!j->call_open) return;
    j->call_open = 0;
    if (j->api == API_RESPONSES) {
        resp_call_end(j, args, n);
        return;
    }
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

void emit_begin(job *j)
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
                "\"cache_read_input_tokens\":%d,\"cache_creation_input_tokens\":0,\"output_tokens\":0}}}",
                j->n_ids - (size_t)j->n_reused, j->n_reused);
        anth_event(j, "message_start", &b);
    }
    json_buf_free(&b);
}

const char *finish_name(const job *j)
{
    if (j->fin == FIN_TIMEOUT) return "timeout"; /* serve --timeout: its own reason on every API */
    if (j->api == API_MESSAGES)
        return j->fin == FIN_LENGTH ? (j->ctx_bound && j->n_gen >= j->max_tokens ? "model_context_window_exceeded" : "max_tokens")
             : j->fin == FIN_STOPSEQ ? "stop_sequence"
             : j->n_calls ? "tool_use" : "end_turn";
    return j->fin == FIN_LENGTH ? "length" : j->n_calls && j->fin == FIN_STOP ? "tool_calls" : "stop";
}

/* The end of the response: the final stream events, or the whole body. */
void emit_finish(job *j)
{
    if (j->api == API_RESPONSES) {
        resp_finish(j);
        return;
    }
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
        bprintf(&b, "},\"usage\":{\"output_tokens\":%d}", j->n_gen);
        if (j->ctx_edits) bprintf(&b, ",\"context_management\":{\"applied_edits\":%s}", j->ctx_edits);
        json_buf_puts(&b, "}");
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
            json_write_string(&b, j->acc[0].p, j->think_omit ? 0 : j->acc[0].len);
            json_buf_puts(&b, ",\"signature\":");
            anth_signature(&b, j->acc[0].p, j->acc[0].len);
            json_buf_puts(&b, "}");
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
        if (j->ctx_edits) bprintf(&b, ",\"context_management\":{\"applied_edits\":%s}", j->ctx_edits);
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
    emit_last(j, &b);
}

/* The job's last bytes (a body, or the final events): out, done, woken. */

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

/* log-softmax of the logits the id was chosen from, in double: entries for the chosen id
 * and the top alternatives, appended to the job's pending logprobs. */
void record_logprobs(srv *S, job *j, const float *lg, int32_t id, size_t text_len)
{
    int V = S->info.vocab;
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
