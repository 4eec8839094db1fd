/* test_server_emit.c - the server's output layer on scripted model output.
 *
 * The test model has random weights and never emits a tool call, so the
 * end-to-end tests cannot reach the tool-call and content paths of the
 * response writers.  This test includes server.c, renders a real assistant
 * message (reasoning, content, one tool call) with the chat template, encodes
 * it, and drives exactly the worker's path (chat_parser -> handle_events ->
 * emit_finish) for the OpenAI, Anthropic and Responses shapes, streaming and not; every
 * SSE event and body must be valid JSON with the expected fields.
 * Built and run by run_server_tests.sh (needs build/libdeltafin.a).
 */
#include "../../src/app/server.c"
#include "../../src/app/server_emit.c"
#include "../../src/app/server_request.c"
#include "../../src/app/server_fields.c"
#include "../../src/app/server_anthropic.c"
#include "../../src/app/server_responses.c"
#include "../../src/app/server_grammar.c"
#include "../../src/app/server_json.c"
#include "../../src/app/server_docs.c"
#include "../../src/app/document.c"
#include "harness.h"

#include "server_stubs.h"

static srv S;

/* The ids the model would produce after the generation prompt (two: a
 * second call after the first). */
static int two_calls;
static int32_t *reply_ids(size_t *n)
{
    static const char one[] =
        "hmm<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>"
        "Paris<|close|>argument<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    static const char two[] =
        "hmm<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>"
        "Paris<|close|>argument<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
        "<|close|>call<|sep|><|open|>call tool=\"get_weather\" index=\"2\"<|sep|><|open|>argument key=\"city\" "
        "type=\"string\"<|sep|>Rome<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
        "<|end_of_msg|>";
    const char *text = two_calls ? two : one;
    size_t len = two_calls ? sizeof two - 1 : sizeof one - 1;
    int32_t *ids = NULL;
    size_t cap = 0;
    df_error err = {0};
    *n = 0;
    if (tokenizer_encode(S.tok, text, len, 1, &ids, n, &cap, &err)) t_fail(__FILE__, __LINE__, "%s", err.msg);
    return ids;
}

/* Run the scripted reply through a job of the given shape; returns its output. */
static int script_single; /* the job's parallel_tool_calls is false */
static char *run_script(int api, int stream)
{
    job *j = xcalloc(1, sizeof *j);
    j->single_call = script_single;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->S = &S;
    j->api = api;
    j->stream = stream;
    j->include_usage = 1;
    j->model = xstrdup("m");
    snprintf(j->id, sizeof j->id, "%s", api == API_MESSAGES ? "msg_0001" : "chatcmpl-0001");
    j->gate_ch = -1;
    j->n_ids = 10;
    emit_begin(j);
    size_t n;
    int32_t *ids = reply_ids(&n);
    chat_parser_reset(S.parser, 1);
    for (size_t i = 0; i < n; i++) {
        const chat_event *ev;
        size_t k = chat_parser_feed(S.parser, ids[i], &ev);
        j->n_gen++;
        handle_events(j, ev, k);
        if (reply_ends(j, ev, k)) break; /* as the worker does */
    }
    TCHECK(chat_parser_done(S.parser) || j->single_call);
    gate_flush(j);
    j->fin = FIN_STOP;
    emit_finish(j);
    char *out = xstrdup(j->out.p ? j->out.p : "");
    free(ids);
    job_unref(j);
    return out;
}

static const json_value *path(const json_value *v, const char *p)
{
    char key[64];
    while (v && *p) {
        size_t k = strcspn(p, ".");
        snprintf(key, sizeof key, "%.*s", (int)k, p);
        v = key[0] >= '0' && key[0] <= '9' ? json_at(v, (size_t)atoi(key)) : json_get(v, key);
        p += k + (p[k] == '.');
    }
    return v;
}

static int str_eq(const json_value *v, const char *s) { return v && v->type == JSON_STRING && !strcmp(v->str, s); }

/* Every "data: " line of an SSE stream parsed; appends to text what each
 * event's field at fpath holds (strings).  Returns the number of events. */
static int sse_collect(const char *out, const char *fpath, char *text, size_t cap, const char *(*names)[64])
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, "data: ")); ) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (!strncmp(p, "[DONE]", 6)) { p = e; continue; }
        df_error err = {0};
        json_doc *d = json_parse(p, (size_t)(e - p), &err);
        TCHECKF(d, "bad SSE JSON: %.*s (%s)", (int)(e - p), p, err.msg);
        if (d) {
            const json_value *v = path(json_root(d), fpath);
            if (v && v->type == JSON_STRING) snprintf(text + strlen(text), cap - strlen(text), "%s", v->str);
            if (names && n < 64) {
                const char *t = json_get_str(json_root(d), "type");
                (*names)[n] = t ? (strstr(t, "content_block_start") ? "start" : strstr(t, "content_block_stop") ? "stop"
                                   : strstr(t, "message_stop") ? "message_stop" : "other") : "other";
            }
            json_free(d);
        }
        n++;
        p = e;
    }
    return n;
}

static void test_openai_chat(void)
{
    char *out = run_script(API_CHAT, 0);
    df_error err = {0};
    json_doc *d = json_parse(out, strlen(out), &err);
    TCHECKF(d, "%s: %s", err.msg, out);
    if (d) {
        const json_value *r = json_root(d);
        TCHECK(str_eq(path(r, "choices.0.message.content"), "ok"));
        TCHECK(str_eq(path(r, "choices.0.message.reasoning_content"), "hmm"));
        TCHECK(str_eq(path(r, "choices.0.message.tool_calls.0.function.name"), "get_weather"));
        TCHECK(str_eq(path(r, "choices.0.message.tool_calls.0.type"), "function"));
        TCHECKF(str_eq(path(r, "choices.0.message.tool_calls.0.function.arguments"), "{\"city\":\"Paris\",\"n\":3}"), "%s", out);
        TCHECK(str_eq(path(r, "choices.0.finish_reason"), "tool_calls"));
        json_free(d);
    }
    free(out);
    out = run_script(API_CHAT, 1);
    char content[256] = "", reasoning[256] = "", args[256] = "", name[64] = "";
    sse_collect(out, "choices.0.delta.content", content, sizeof content, NULL);
    sse_collect(out, "choices.0.delta.reasoning_content", reasoning, sizeof reasoning, NULL);
    sse_collect(out, "choices.0.delta.tool_calls.0.function.arguments", args, sizeof args, NULL);
    sse_collect(out, "choices.0.delta.tool_calls.0.function.name", name, sizeof name, NULL);
    TCHECKF(!strcmp(content, "ok") && !strcmp(reasoning, "hmm"), "content %s reasoning %s", content, reasoning);
    TCHECKF(!strcmp(args, "{\"city\":\"Paris\",\"n\":3}") && !strcmp(name, "get_weather"), "args %s name %s", args, name);
    TCHECK(strstr(out, "\"finish_reason\":\"tool_calls\"") != NULL);
    TCHECK(strstr(out, "data: [DONE]\n\n") != NULL);
    free(out);
}

/* parallel_tool_calls false under tool_choice auto: a reply whose model
 * goes on to a second call ends after the first (finish "tool_calls");
 * without it both calls are returned. */
static void test_single_call(void)
{
    two_calls = 1;
    for (int single = 0; single < 2; single++) {
        script_single = single;
        char *out = run_script(API_CHAT, 0);
        df_error err = {0};
        json_doc *d = json_parse(out, strlen(out), &err);
        TCHECKF(d, "%s", err.msg);
        if (d) {
            const json_value *calls = path(json_root(d), "choices.0.message.tool_calls");
            TCHECKF(calls && calls->type == JSON_ARRAY && calls->len == (single ? 1u : 2u), "single %d: %s", single, out);
            TCHECK(str_eq(path(json_root(d), "choices.0.message.tool_calls.0.function.name"), "get_weather"));
            TCHECK(str_eq(path(json_root(d), "choices.0.finish_reason"), "tool_calls"));
            json_free(d);
        }
        free(out);
        out = run_script(API_MESSAGES, 1);
        TCHECKF(strstr(out, "\"stop_reason\":\"tool_use\"") && (strstr(out, "Rome") != NULL) == !single, "single %d: %s",
                single, out);
        free(out);
    }
    two_calls = script_single = 0;
}

static void test_anthropic(void)
{
    char *out = run_script(API_MESSAGES, 0);
    df_error err = {0};
    json_doc *d = json_parse(out, strlen(out), &err);
    TCHECKF(d, "%s: %s", err.msg, out);
    if (d) {
        const json_value *r = json_root(d);
        TCHECK(str_eq(path(r, "content.0.type"), "thinking"));
        TCHECK(str_eq(path(r, "content.0.thinking"), "hmm"));
        TCHECK(str_eq(path(r, "content.1.text"), "ok"));
        TCHECK(str_eq(path(r, "content.2.type"), "tool_use"));
        TCHECK(str_eq(path(r, "content.2.name"), "get_weather"));
        TCHECK(str_eq(path(r, "content.2.input.city"), "Paris"));
        const json_value *nv = path(r, "content.2.input.n");
        TCHECK(nv && nv->type == JSON_NUMBER && nv->i == 3);
        TCHECK(str_eq(path(r, "stop_reason"), "tool_use"));
        json_free(d);
    }
    free(out);
    out = run_script(API_MESSAGES, 1);
    char text[256] = "", thinking[256] = "", pj[256] = "";
    const char *names[64] = {0};
    int n = sse_collect(out, "delta.text", text, sizeof text, &names);
    sse_collect(out, "delta.thinking", thinking, sizeof thinking, NULL);
    sse_collect(out, "delta.partial_json", pj, sizeof pj, NULL);
    TCHECKF(!strcmp(text, "ok") && !strcmp(thinking, "hmm"), "text %s thinking %s", text, thinking);
    TCHECKF(!strcmp(pj, "{\"city\":\"Paris\",\"n\":3}"), "partial_json %s", pj);
    int starts = 0, stops = 0, depth = 0, ok = 1;
    for (int i = 0; i < n && i < 64; i++) {
        if (names[i] && !strcmp(names[i], "start")) starts++, ok &= depth++ == 0;
        if (names[i] && !strcmp(names[i], "stop")) stops++, ok &= --depth == 0;
    }
    TCHECKF(starts == 3 && stops == 3 && ok, "blocks: %d starts, %d stops, nested %d\n%s", starts, stops, !ok, out);
    TCHECK(n > 0 && names[n - 1] && !strcmp(names[n - 1], "message_stop"));
    TCHECK(strstr(out, "\"stop_reason\":\"tool_use\"") != NULL);
    TCHECK(strstr(out, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,"
                       "\"content_block\":{\"type\":\"tool_use\"") != NULL);
    free(out);
}

static void test_stop_gate(void)
{
    job j;
    memset(&j, 0, sizeof j);
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    j.S = &S;
    j.api = API_COMPLETIONS;
    j.gate_ch = -1;
    j.stops[j.n_stops++] = xstrdup("STOP");
    j.stops[j.n_stops++] = xstrdup("\xC3\xA9x");
    j.max_stop = 4;
    const char *parts[] = {"abc S", "TO", "xyzSTO", "P tail"};
    for (int i = 0; i < 4 && !j.stopped; i++) emit_text(&j, CH_CONTENT, parts[i], strlen(parts[i]));
    TCHECKF(j.acc[CH_CONTENT].len == 10 && !memcmp(j.acc[CH_CONTENT].p, "abc STOxyz", 10), "got %.*s",
            (int)j.acc[CH_CONTENT].len, j.acc[CH_CONTENT].p);
    TCHECK(j.stopped && !strcmp(j.stop_hit, "STOP"));
    /* a held-back tail never splits a UTF-8 character */
    j.stopped = 0;
    j.acc[CH_CONTENT].len = 0;
    emit_text(&j, CH_CONTENT, "\xC3\xA9\xC3\xA9\xC3\xA9", 6);
    TCHECK(j.acc[CH_CONTENT].len == 2 || j.acc[CH_CONTENT].len == 4);
    gate_flush(&j);
    TCHECK(j.acc[CH_CONTENT].len == 6);
    for (int i = 0; i < j.n_stops; i++) free(j.stops[i]);
    json_buf_free(&j.acc[CH_CONTENT]);
    json_buf_free(&j.gate);
}

/* Issue 10, finding 7 (found by fuzz_server_request): an unknown field
 * whose name holds multibyte characters.  The 400's param (95 bytes at
 * most) and message (the name cut to 80 bytes) used to cut the name inside
 * a UTF-8 sequence, so the body was neither UTF-8 nor JSON. */
static void test_error_cut_on_utf8_boundary(void)
{
    static const char body[] =
        "{\"mode<|end_of_msg|>ppiiiiiiiiie\\ue888is+_ebb\\ue88888+_eb>ppiiiiiiiiie\\ue888is+_ebb\\ue88888+_ebb"
        "\\ue88888is_ebb\\ue8888iiiiii\":3,\"stop\":\"END\"}";
    server_limits lim = {.tok = S.tok, .n_ctx = 2048, .max_tokens_cap = 1024, .name = "t"};
    for (int ep = 0; ep < 3; ep++) {
        char *err_body = NULL;
        int status = server_parse_request(&lim, ep, body, sizeof body - 1, &err_body, NULL);
        TCHECKF(status == 400 && err_body, "endpoint %d: status %d", ep, status);
        if (!err_body) continue;
        TCHECKF(utf8_valid(err_body, strlen(err_body)), "endpoint %d: error body is not UTF-8: %s", ep, err_body);
        df_error err = {0};
        json_doc *d = json_parse(err_body, strlen(err_body), &err);
        TCHECKF(d, "endpoint %d: error body is not JSON (%s): %s", ep, err.msg, err_body);
        const json_value *e = d ? json_get(json_root(d), "error") : NULL;
        const char *msg = json_get_str(e, "message"), *param = json_get_str(e, "param");
        /* the name as the parser decoded it, in UTF-8 */
        const char *name = "mode<|end_of_msg|>ppiiiiiiiiie\xEE\xA2\x88is+_ebb";
        TCHECKF(msg && strstr(msg, name) && !strstr(msg, "\xEF\xBF\xBD"), "endpoint %d: message %s", ep,
                msg ? msg : "(none)");
        if (ep != SERVER_EP_MESSAGES) /* OpenAI's shape carries the field; the cut is exact, not repaired */
            TCHECKF(param && !strncmp(param, name, strlen(name)) && strlen(param) <= 95 && strlen(param) >= 92 &&
                        !strstr(param, "\xEF\xBF\xBD"),
                    "endpoint %d: param %s", ep, param ? param : "(none)");
        json_free(d);
        free(err_body);
    }
    /* every cut of a long message or param lands on a character boundary */
    char big[700];
    for (int shift = 0; shift < 3; shift++) {
        size_t n = 0;
        for (int i = 0; i < shift; i++) big[n++] = 'x';
        while (n + 3 < sizeof big) memcpy(big + n, "\xEE\xA2\x88", 3), n += 3;
        big[n] = 0;
        rq_err e = {0};
        rq_fail(&e, 400, big, "%s", big);
        TCHECKF(utf8_valid(e.param, strlen(e.param)) && strlen(e.param) >= sizeof e.param - 3,
                "shift %d: param cut at %zu", shift, strlen(e.param));
        TCHECKF(utf8_valid(e.msg, strlen(e.msg)) && strlen(e.msg) >= sizeof e.msg - 3, "shift %d: message cut at %zu",
                shift, strlen(e.msg));
    }
}

/* The Responses API on the scripted reply, with the tool offered inside a
 * namespace: reasoning, message and function_call items (the call named
 * back as {name, namespace}), the event sequence when streaming, and the
 * stored conversation a previous_response_id continues. */
static job *resp_job_run(const char *body, int stream)
{
    rq_err e = {0};
    char *b = xmalloc(strlen(body) + 32);
    snprintf(b, strlen(body) + 32, "{\"stream\":%s,%s", stream ? "true" : "false", body + 1);
    job *j = request_job(&S, API_RESPONSES, b, strlen(b), &e);
    free(b);
    TCHECKF(j, "request refused: %s", e.msg);
    if (!j) return NULL;
    j->gate_ch = -1;
    emit_begin(j);
    static const char text[] =
        "hmm<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"weather__get\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>"
        "Paris<|close|>argument<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    df_error err = {0};
    if (tokenizer_encode(S.tok, text, sizeof text - 1, 1, &ids, &n, &cap, &err)) t_fail(__FILE__, __LINE__, "%s", err.msg);
    chat_parser_reset(S.parser, 1);
    for (size_t i = 0; i < n; i++) {
        const chat_event *ev;
        size_t k = chat_parser_feed(S.parser, ids[i], &ev);
        j->n_gen++;
        handle_events(j, ev, k);
    }
    free(ids);
    TCHECK(chat_parser_done(S.parser));
    gate_flush(j);
    j->fin = FIN_STOP;
    emit_finish(j);
    return j;
}

static void test_responses(void)
{
    static const char body[] =
        "{\"model\":\"m\",\"input\":[{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"user\",\"content\":[{\"type\":"
        "\"input_text\",\"text\":\"Weather?\"}]}],\"include\":[\"reasoning.encrypted_content\"],\"tools\":[{\"type\":"
        "\"namespace\",\"name\":\"weather\",\"description\":\"d\",\"tools\":[{\"type\":\"function\",\"name\":\"get\","
        "\"strict\":false,\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"n\":"
        "{\"type\":\"number\"}}}}]},{\"type\":\"web_search\"}]}";
    S.n_ctx = 4096;
    S.max_tokens_cap = 64;
    S.name = "t";
    S.rstore = resp_store_new();
    job *j = resp_job_run(body, 0);
    if (!j) return;
    TCHECK(!strcmp(resp_omitted_tools(j), "web_search"));
    df_error err = {0};
    json_doc *d = json_parse(j->out.p, j->out.len, &err);
    TCHECKF(d, "%s: %.*s", err.msg, (int)j->out.len, j->out.p);
    if (d) {
        const json_value *r = json_root(d);
        TCHECK(str_eq(path(r, "object"), "response") && str_eq(path(r, "status"), "completed"));
        TCHECK(str_eq(path(r, "output.0.type"), "reasoning") && str_eq(path(r, "output.0.content.0.text"), "hmm"));
        TCHECK(str_eq(path(r, "output.0.encrypted_content"), "dfr1:aG1t"));
        TCHECK(path(r, "output.0.summary") && path(r, "output.0.summary")->len == 0);
        TCHECK(str_eq(path(r, "output.1.type"), "message") && str_eq(path(r, "output.1.content.0.text"), "ok"));
        TCHECK(str_eq(path(r, "output.2.type"), "function_call"));
        TCHECKF(str_eq(path(r, "output.2.name"), "get") && str_eq(path(r, "output.2.namespace"), "weather"), "%s", j->out.p);
        TCHECK(str_eq(path(r, "output.2.arguments"), "{\"city\":\"Paris\",\"n\":3}"));
        TCHECK(str_eq(path(r, "tools.0.type"), "namespace") && !path(r, "tools.1"));
        json_free(d);
    }
    /* the stored conversation, continued, renders as the items sent back explicitly */
    char body2[1024], body3[2048];
    snprintf(body2, sizeof body2, "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"input\":\"next\",\"tools\":"
             "[{\"type\":\"namespace\",\"name\":\"weather\",\"tools\":[{\"type\":\"function\",\"name\":\"get\"}]}]}", j->id);
    snprintf(body3, sizeof body3, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"type\":"
             "\"reasoning\",\"summary\":[],\"encrypted_content\":\"dfr1:aG1t\"},{\"type\":\"message\",\"role\":"
             "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\"}]},{\"type\":\"function_call\","
             "\"call_id\":\"call_%s_0\",\"namespace\":\"weather\",\"name\":\"get\",\"arguments\":"
             "\"{\\\"city\\\":\\\"Paris\\\",\\\"n\\\":3}\"},{\"role\":\"user\",\"content\":\"next\"}],\"tools\":"
             "[{\"type\":\"namespace\",\"name\":\"weather\",\"tools\":[{\"type\":\"function\",\"name\":\"get\"}]}]}",
             j->id + 5);
    rq_err e = {0};
    job *a = request_job(&S, API_RESPONSES, body2, strlen(body2), &e);
    TCHECKF(a, "%s", e.msg);
    job *b = request_job(&S, API_RESPONSES, body3, strlen(body3), &e);
    TCHECKF(b, "%s", e.msg);
    if (a && b) TCHECKF(a->n_ids == b->n_ids && !memcmp(a->ids, b->ids, a->n_ids * sizeof *a->ids),
                        "stored %zu ids, explicit %zu", a->n_ids, b->n_ids);
    if (a) job_unref(a);
    if (b) job_unref(b);
    job_unref(j);

    /* streaming: the events in order, each with its event line and number */
    j = resp_job_run(body, 1);
    if (!j) return;
    char *out = xstrdup(j->out.p);
    int seq = -1, n_added = 0, ok = 1;
    char text[64] = "", reasoning[64] = "", last[64] = "";
    for (char *p = out; (p = strstr(p, "event: "));) {
        char *nl = strchr(p, '\n'), *end = strstr(p, "\n\n");
        if (!nl || !end || strncmp(nl + 1, "data: ", 6)) { ok = 0; break; }
        json_doc *ev = json_parse(nl + 7, (size_t)(end - nl - 7), &err);
        TCHECKF(ev, "bad event JSON: %.*s", (int)(end - p), p);
        if (!ev) break;
        const json_value *r = json_root(ev);
        const char *type = json_get_str(r, "type");
        int64_t sn = -1;
        json_get_int(r, "sequence_number", &sn);
        ok &= type && (size_t)(nl - p - 7) == strlen(type) && !strncmp(p + 7, type, strlen(type)) && sn == seq + 1;
        seq = (int)sn;
        if (type && !strcmp(type, "response.output_item.added")) {
            int64_t oi = -1;
            json_get_int(r, "output_index", &oi);
            ok &= oi == n_added++;
        }
        if (type && !strcmp(type, "response.output_text.delta"))
            snprintf(text + strlen(text), sizeof text - strlen(text), "%s", json_get_str(r, "delta"));
        if (type && !strcmp(type, "response.reasoning_text.delta"))
            snprintf(reasoning + strlen(reasoning), sizeof reasoning - strlen(reasoning), "%s", json_get_str(r, "delta"));
        if (type && !strcmp(type, "response.function_call_arguments.done"))
            TCHECK(str_eq(json_get(r, "name"), "get") && str_eq(json_get(r, "arguments"), "{\"city\":\"Paris\",\"n\":3}"));
        if (type && !strcmp(type, "response.completed"))
            TCHECK(str_eq(path(r, "response.output.2.namespace"), "weather") && path(r, "response.usage.total_tokens"));
        snprintf(last, sizeof last, "%s", type ? type : "");
        json_free(ev);
        p = end;
    }
    TCHECKF(ok && n_added == 3, "event order (%d items)\n%s", n_added, out);
    TCHECKF(!strcmp(text, "ok") && !strcmp(reasoning, "hmm"), "text %s reasoning %s", text, reasoning);
    TCHECK(!strcmp(last, "response.completed"));
    TCHECK(!strncmp(out, "event: response.created\n", 24));
    /* a keepalive between events takes the next number */
    pthread_mutex_lock(&j->mu);
    char ka[128];
    size_t k = resp_keepalive(j, ka, sizeof ka);
    pthread_mutex_unlock(&j->mu);
    char want[96];
    snprintf(want, sizeof want, "\"sequence_number\":%d}\n\n", seq + 1);
    TCHECKF(k > 0 && strstr(ka, "event: keepalive\ndata: {\"type\":\"keepalive\"") && strstr(ka, want), "%.*s", (int)k, ka);
    free(out);
    job_unref(j);
    resp_store_free(S.rstore);
    S.rstore = NULL;
}

int main(int argc, char **argv)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/k3-tiny-a/checkpoint", testdata_dir());
    df_error err = {0};
    if (tokenizer_load(dir, &S.tok, &err) || chat_parser_new(S.tok, 1, &S.parser, &err)) {
        fprintf(stderr, "test_server_emit: %s\n", err.msg);
        return 1;
    }
    static const test_case tests[] = {
        {"openai_chat_tool_call", test_openai_chat},
        {"single_call_ends_the_reply", test_single_call},
        {"anthropic_tool_use", test_anthropic},
        {"stop_gate", test_stop_gate},
        {"error_cut_on_utf8_boundary", test_error_cut_on_utf8_boundary},
        {"responses_items_events_store", test_responses},
    };
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    chat_parser_free(S.parser);
    tokenizer_free(S.tok);
    return rc;
}
