/* test_chat_template.c - K3's XTML chat template and output parser.
 *
 * Rendering: the fixture's chat_cases segment for segment and id for id;
 * Deltafin chat.rs's gold segment counts and segment hashes (FNV-1a over
 * len | allow_special << 31) for its tool and response-format cases; every
 * feature (tools, calls with typed / invalid arguments, tool results
 * reordered, names and escaping, thinking on/off, efforts, tool_choice,
 * response_format) and the error messages for bad input.
 * Parser: round trips (render an assistant turn, encode, feed its ids, get
 * the same reasoning, content and calls back), malformed and truncated
 * streams, random ids; feeding a reply allocates nothing (under the
 * allocation guard).  The fixture tokenizer is committed: a test that needs
 * it fails when it cannot be loaded.
 */
#define _GNU_SOURCE
#include "chat_template.h"
#include "harness.h"
#include "json.h"
#include "json_write.h"
#include "tokenizer.h"
#include "util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------ */

static char *path_in_testdata(const char *rel)
{
    const char *d = testdata_dir();
    size_t n = strlen(d) + strlen(rel) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", d, rel);
    return p;
}

static tokenizer *g_tok;
static int g_tok_tried;

static const tokenizer *tok(void)
{
    if (!g_tok_tried) {
        g_tok_tried = 1;
        char *dir = path_in_testdata("k3-tiny-a/checkpoint");
        df_error err = {0};
        if (tokenizer_load(dir, &g_tok, &err)) {
            fprintf(stderr, "    (tokenizer not loaded: %s)\n", err.msg);
            g_tok = NULL;
        }
        free(dir);
    }
    return g_tok;
}

/* The fixture tokenizer is committed with the tests: a test that needs it
 * fails (never skips) when it does not load. */
#define NEED_TOK()                                                                          \
    do {                                                                                    \
        if (!tok()) {                                                                       \
            t_fail(__FILE__, __LINE__, "the fixture tokenizer (testdata/k3-tiny-a) did not load"); \
            return;                                                                         \
        }                                                                                   \
    } while (0)

/* A request object shaped like the fixture's chat cases: messages plus
 * thinking, thinking_effort, add_generation_prompt, tools, tool_choice,
 * response_format (chat_options_init defaults when absent). */
static void options_from(const json_value *root, chat_options *o)
{
    chat_options_init(o);
    int b;
    if (!json_get_bool(root, "thinking", &b)) o->thinking = b;
    const json_value *e = json_get(root, "thinking_effort");
    if (e) o->thinking_effort = e->type == JSON_STRING ? e->str : NULL;
    if (!json_get_bool(root, "add_generation_prompt", &b)) o->add_generation_prompt = b;
    o->tools = json_get(root, "tools");
    o->tool_choice = json_get(root, "tool_choice");
    o->response_format = json_get(root, "response_format");
}

static int render_req(const char *req, chat_segments **out, df_error *err)
{
    memset(err, 0, sizeof *err);
    *out = NULL;
    json_doc *d = json_parse(req, strlen(req), err);
    if (!d) {
        fprintf(stderr, "    bad test JSON: %s\n", err->msg);
        return -1;
    }
    chat_options o;
    options_from(json_root(d), &o);
    int rc = chat_render(json_get(json_root(d), "messages"), &o, out, err);
    json_free(d);
    return rc;
}

/* The rendered text of a request, or NULL (the error is printed). */
static char *render_text(const char *req, size_t *n_seg, uint64_t *seg_hash)
{
    chat_segments *s;
    df_error err;
    if (render_req(req, &s, &err)) {
        fprintf(stderr, "    render failed: %s\n", err.msg);
        return NULL;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t v = (uint32_t)s->seg[i].len | (s->seg[i].control ? 1u << 31 : 0);
        for (int k = 0; k < 4; k++) {
            h ^= (v >> (8 * k)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    if (n_seg) *n_seg = s->n;
    if (seg_hash) *seg_hash = h;
    char *text = chat_segments_join(s, NULL);
    chat_segments_free(s);
    return text;
}

#define EFFORT(e)                                                                                                 \
    "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to "     \
    "think in your thinking channel (not including the response channel), supported values include `low`, "      \
    "`medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=" e "`.<|close|>message<|sep|>" \
    "<|end_of_msg|>"

static void check_render(const char *req, const char *want, int line)
{
    char *got = render_text(req, NULL, NULL);
    if (!got) {
        t_fail(__FILE__, line, "render failed");
        return;
    }
    if (strcmp(got, want)) t_fail(__FILE__, line, "rendered\n      got:  %s\n      want: %s", got, want);
    free(got);
}
#define CHECK_RENDER(req, want) check_render(req, want, __LINE__)

static int has_marker(const char *s, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '<' && s[i + 1] == '|') return 1;
    return 0;
}

/* Structural equality of two JSON trees (object key order ignored). */
static int json_equal(const json_value *a, const json_value *b)
{
    if (a->type != b->type) return 0;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return a->b == b->b;
    case JSON_NUMBER: return a->is_int == b->is_int && (a->is_int ? a->i == b->i : a->num == b->num);
    case JSON_STRING: return a->len == b->len && !memcmp(a->str, b->str, a->len);
    case JSON_ARRAY:
        if (a->len != b->len) return 0;
        for (size_t i = 0; i < a->len; i++)
            if (!json_equal(a->items[i], b->items[i])) return 0;
        return 1;
    case JSON_OBJECT:
        if (a->len != b->len) return 0;
        for (size_t i = 0; i < a->len; i++) {
            const json_value *o = json_get(b, a->keys[i]);
            if (!o || !json_equal(a->items[i], o)) return 0;
        }
        return 1;
    }
    return 0;
}

static int json_text_equal(const char *x, size_t nx, const char *y, size_t ny)
{
    df_error e = {0};
    json_doc *a = json_parse(x, nx, &e), *b = json_parse(y, ny, &e);
    int eq = a && b && json_equal(json_root(a), json_root(b));
    json_free(a);
    json_free(b);
    return eq;
}

/* ---- parser driver ------------------------------------------------------ */

#define MAX_CALLS 16

typedef struct parsed {
    json_buf reasoning, content;
    int n_calls, n_begin, n_args_ev, n_json_ev, ended, bad;
    char *call_name[MAX_CALLS];
    char *call_args[MAX_CALLS];
    char *call_json[MAX_CALLS];
    int deltas_with_marker;  /* text deltas containing "<|" */
    int deltas_bad_utf8;
} parsed;

static void parsed_free(parsed *r)
{
    json_buf_free(&r->reasoning);
    json_buf_free(&r->content);
    for (int i = 0; i < MAX_CALLS; i++) {
        free(r->call_name[i]);
        free(r->call_args[i]);
        free(r->call_json[i]);
    }
    memset(r, 0, sizeof *r);
}

static char *dup_n(const char *s, size_t n)
{
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Collect events and check the invariants every stream must keep: valid
 * UTF-8 deltas, CALL_BEGIN/END balanced with increasing indices, arguments
 * only inside a call, nothing after END. */
static void collect(parsed *r, const chat_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const chat_event *e = &ev[i];
        if (r->ended) r->bad |= 1;
        switch (e->type) {
        case CHAT_EV_REASONING:
        case CHAT_EV_CONTENT:
            if (!e->len) r->bad |= 2;
            if (!utf8_valid(e->text, e->len)) r->deltas_bad_utf8++;
            if (has_marker(e->text, e->len)) r->deltas_with_marker++;
            json_buf_put(e->type == CHAT_EV_REASONING ? &r->reasoning : &r->content, e->text, e->len);
            break;
        case CHAT_EV_CALL_BEGIN:
            if (r->n_begin != r->n_calls || e->index != r->n_calls) r->bad |= 4;
            r->n_begin++;
            if (r->n_calls < MAX_CALLS) r->call_name[r->n_calls] = dup_n(e->name, e->name_len);
            break;
        case CHAT_EV_CALL_ARG:
            if (r->n_begin != r->n_calls + 1 || e->index != r->n_calls) r->bad |= 8;
            if (!utf8_valid(e->text, e->len) || !utf8_valid(e->name, e->name_len)) r->bad |= 8;
            r->n_args_ev++;
            break;
        case CHAT_EV_CALL_JSON:
            if (r->n_begin != r->n_calls + 1) r->bad |= 16;
            if (r->n_calls < MAX_CALLS) {
                free(r->call_json[r->n_calls]);
                r->call_json[r->n_calls] = dup_n(e->text, e->len);
            }
            r->n_json_ev++;
            break;
        case CHAT_EV_CALL_END:
            if (r->n_begin != r->n_calls + 1 || e->index != r->n_calls) r->bad |= 32;
            if (r->n_calls < MAX_CALLS) r->call_args[r->n_calls] = dup_n(e->text, e->len);
            r->n_calls++;
            break;
        case CHAT_EV_END:
            if (r->n_begin != r->n_calls) r->bad |= 64;
            r->ended = 1;
            break;
        }
    }
}

static void run_parser(const int32_t *ids, size_t n, int think, int finish, parsed *r)
{
    memset(r, 0, sizeof *r);
    chat_parser *p;
    df_error err = {0};
    CHECK(!chat_parser_new(tok(), think, &p, &err));
    const chat_event *ev;
    for (size_t i = 0; i < n; i++) {
        size_t k = chat_parser_feed(p, ids[i], &ev);
        collect(r, ev, k);
    }
    if (finish) {
        size_t k = chat_parser_finish(p, &ev);
        collect(r, ev, k);
        if (r->n_begin != r->n_calls) r->bad |= 128;
    }
    chat_parser_free(p);
}

/* ids of text with special spellings recognised. */
static int32_t *encode_special(const char *text, size_t *n)
{
    int32_t *ids = NULL;
    size_t cap = 0;
    *n = 0;
    df_error err = {0};
    CHECK(!tokenizer_encode(tok(), text, strlen(text), 1, &ids, n, &cap, &err));
    return ids;
}

static void parse_text(const char *text, int think, parsed *r)
{
    size_t n;
    int32_t *ids = encode_special(text, &n);
    run_parser(ids, n, think, 1, r);
    free(ids);
}

static int32_t *render_ids(const char *req, size_t *n)
{
    chat_segments *s;
    df_error err;
    *n = 0;
    if (render_req(req, &s, &err)) {
        fprintf(stderr, "    render failed: %s\n", err.msg);
        return NULL;
    }
    int32_t *ids = NULL;
    size_t cap = 0;
    if (chat_encode(tok(), s, &ids, n, &cap, &err)) {
        fprintf(stderr, "    encode failed: %s\n", err.msg);
        free(ids);
        ids = NULL;
    }
    chat_segments_free(s);
    return ids;
}

/* ---- fixtures ----------------------------------------------------------- */

static json_doc *load_fixture(void)
{
    char *path = path_in_testdata("k3-tiny-a/fixtures/tokenizer_cases.json");
    char *text;
    size_t len;
    df_error err = {0};
    json_doc *d = NULL;
    if (!read_small_file(path, &text, &len, 64u << 20, &err)) {
        d = json_parse(text, len, &err);
        free(text);
    }
    /* committed with the tests: a fixture that does not load is a failure */
    if (!d) t_fail(__FILE__, __LINE__, "%s: %s", path, err.msg);
    free(path);
    return d;
}

static void test_fixture_segments(void)
{
    json_doc *d = load_fixture();
    if (!d) return;
    const json_value *cases = json_get(json_root(d), "chat_cases");
    TCHECK(cases && cases->type == JSON_ARRAY && cases->len == 3);
    for (size_t c = 0; cases && c < cases->len; c++) {
        const json_value *cs = cases->items[c], *want = json_get(cs, "segments");
        chat_options o;
        options_from(cs, &o);
        chat_segments *s;
        df_error err = {0};
        if (chat_render(json_get(cs, "messages"), &o, &s, &err)) {
            TCHECKF(0, "case %zu: %s", c, err.msg);
            continue;
        }
        TCHECKF(s->n == want->len, "case %zu: %zu segments, want %zu", c, s->n, want->len);
        for (size_t i = 0; i < s->n && i < want->len; i++) {
            const json_value *w = want->items[i];
            const char *wt = json_get_str(w, "text");
            int ws = 0;
            json_get_bool(w, "allow_special", &ws);
            TCHECKF(wt && s->seg[i].len == strlen(wt) && !memcmp(s->seg[i].text, wt, s->seg[i].len) &&
                        s->seg[i].control == ws,
                    "case %zu segment %zu: \"%.*s\"/%d, want \"%s\"/%d", c, i, (int)s->seg[i].len, s->seg[i].text,
                    s->seg[i].control, wt ? wt : "?", ws);
        }
        char *joined = chat_segments_join(s, NULL);
        TCHECKF(!strcmp(joined, json_get_str(cs, "rendered")), "case %zu: rendered text differs", c);
        free(joined);
        chat_segments_free(s);
    }
    json_free(d);
}

static void test_fixture_ids(void)
{
    json_doc *d = load_fixture();
    if (!d) return;
    if (!tok()) {
        json_free(d);
        NEED_TOK();
    }
    const json_value *cases = json_get(json_root(d), "chat_cases");
    for (size_t c = 0; cases && c < cases->len; c++) {
        const json_value *cs = cases->items[c], *want = json_get(cs, "ids");
        chat_options o;
        options_from(cs, &o);
        chat_segments *s;
        df_error err = {0};
        if (chat_render(json_get(cs, "messages"), &o, &s, &err)) {
            TCHECKF(0, "case %zu: %s", c, err.msg);
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        TCHECKF(!chat_encode(tok(), s, &ids, &n, &cap, &err), "case %zu: %s", c, err.msg);
        TCHECKF(n == want->len, "case %zu: %zu ids, want %zu", c, n, want->len);
        size_t bad = SIZE_MAX;
        for (size_t i = 0; i < n && i < want->len; i++)
            if (ids[i] != want->items[i]->i) {
                bad = i;
                break;
            }
        TCHECKF(bad == SIZE_MAX, "case %zu: first differing id at %zu: %d, want %" PRId64, c, bad,
                bad == SIZE_MAX ? 0 : ids[bad], bad == SIZE_MAX ? 0 : want->items[bad]->i);
        free(ids);
        chat_segments_free(s);
    }
    /* The user's literal "<|open|>" in case 0 stays ordinary: exactly the
     * four structural opens are special. */
    json_free(d);
}

/* ---- rendering ---------------------------------------------------------- */

/* Deltafin chat.rs's gold cases: segment count and segment-layout hash. */
static void test_chat_rs_gold(void)
{
    size_t n;
    uint64_t h;
    char *t = render_text("{\"messages\":[{\"role\":\"user\",\"content\":\"Hello <|open|> & goodbye\"}]}", &n, &h);
    TCHECK(t && n == 38 && h == 0x8d67f74027f3f8f4ull);
    free(t);

    static const char tools_req[] =
        "{\"thinking_effort\":\"low\",\"tools\":["
        "{\"type\":\"function\",\"function\":{\"description\":\"B tool\",\"name\":\"beta\",\"parameters\":{\"z\":"
        "{\"type\":\"number\"},\"a\":{\"type\":\"string\"}}}},"
        "{\"function\":{\"name\":\"alpha\",\"description\":\"A tool\",\"parameters\":{\"type\":\"object\"}},"
        "\"type\":\"function\"}],"
        "\"messages\":["
        "{\"role\":\"assistant\",\"reasoning_content\":\"Check.\",\"content\":\"Calling.\",\"tool_calls\":["
        "{\"id\":\"b\",\"function\":{\"name\":\"beta\",\"arguments\":\"{\\\"z\\\":1,\\\"a\\\":\\\"x\\\"}\"}},"
        "{\"id\":\"a\",\"function\":{\"name\":\"alpha\",\"arguments\":\"not valid <|open|>\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"name\":\"stale\",\"content\":\"alpha result\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"tool\":\"wrong\",\"content\":\"beta result\"}]}";
    t = render_text(tools_req, &n, &h);
    TCHECKF(t && n == 182 && h == 0xb060b0cf4e2a9500ull, "tools case: %zu segments, hash %016" PRIx64, n, h);
    static const char tools_want[] =
        "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, "
        "described in JSONSchema.\n\n```json\n"
        "[{\"function\":{\"description\":\"B tool\",\"name\":\"beta\",\"parameters\":{\"a\":{\"type\":\"string\"},"
        "\"z\":{\"type\":\"number\"}}},\"type\":\"function\"},{\"function\":{\"description\":\"A tool\",\"name\":"
        "\"alpha\",\"parameters\":{\"type\":\"object\"}},\"type\":\"function\"}]\n```<|close|>message<|sep|>"
        "<|end_of_msg|>" EFFORT("low")
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>Check.<|close|>think<|sep|>"
        "<|open|>response<|sep|>Calling.<|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"beta\" index=\"1\"<|sep|><|open|>argument key=\"z\" type=\"number\"<|sep|>1"
        "<|close|>argument<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>x<|close|>argument<|sep|>"
        "<|close|>call<|sep|><|open|>call tool=\"alpha\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>"
        "not valid <|open|><|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
        "<|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"beta\" index=\"1\"<|sep|>beta result<|close|>message<|sep|>"
        "<|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"alpha\" index=\"2\"<|sep|>alpha result<|close|>message<|sep|>"
        "<|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
    TCHECKF(t && !strcmp(t, tools_want), "tools case rendered:\n%s", t ? t : "(null)");
    free(t);

    static const char rf_req[] =
        "{\"thinking_effort\":\"high\",\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"name\":\"answer\",\"schema\":{\"required\":[\"b\",\"a\"],\"properties\":{\"b\":"
        "{\"type\":\"number\"},\"a\":{\"type\":\"string\"}},\"type\":\"object\"}}},"
        "\"messages\":[{\"role\":\"user\",\"name\":\"A&B\\\"\",\"content\":\"Return JSON.\"}]}";
    t = render_text(rf_req, &n, &h);
    TCHECKF(t && n == 74 && h == 0xc65d123d688dd863ull, "response-format case: %zu segments, hash %016" PRIx64, n,
            h);
    static const char rf_want[] =
        EFFORT("high")
        "<|open|>message role=\"user\" name=\"A&amp;B&quot;\"<|sep|>Return JSON.<|close|>message<|sep|>"
        "<|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked with "
        "`tool_choice=required`.\nYou MUST call tools in the next message.<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with "
        "`response_format=json_schema`.\nYour response must be raw JSON data without markdown code blocks "
        "(```json) or any additional formatting.\nThe JSON data must match the following schema:\n```json\n"
        "{\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"number\"}},\"required\":[\"b\",\"a\"],"
        "\"type\":\"object\"}\n```<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
    TCHECKF(t && !strcmp(t, rf_want), "response-format case rendered:\n%s", t ? t : "(null)");
    free(t);
}

static void test_system_tools_and_controls(void)
{
    /* A system message carrying tools becomes the lazy-loading declaration
     * (its content is dropped); tool_choice none; response_format
     * json_object; thinking off: no effort message, response prompt. */
    CHECK_RENDER(
        "{\"thinking\":false,\"tool_choice\":\"none\",\"response_format\":{\"type\":\"json_object\"},"
        "\"messages\":[{\"role\":\"system\",\"content\":\"ignored\",\"tools\":[{\"b\":1,\"a\":[{\"d\":2,\"c\":3}]}]},"
        "{\"role\":\"user\",\"content\":\"hi\"}]}",
        "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|>## New Tools Available\nThe system "
        "dynamically extends the toolset via lazy-loading.\nYou have access to all existing and extended tools.\n"
        "Here are the specs for the extended tools.\n\n```json\n[{\"a\":[{\"c\":3,\"d\":2}],\"b\":1}]\n```"
        "<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked with `tool_choice=none`."
        "\nYou MUST NOT call any tools in the next message.<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with "
        "`response_format=json_object`.\nYour response must be raw JSON data without markdown code blocks "
        "(```json) or any additional formatting.<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
    /* auto / null tool_choice, text response_format, empty tools: nothing;
     * no generation prompt. */
    CHECK_RENDER("{\"thinking\":false,\"tool_choice\":\"auto\",\"response_format\":{\"type\":\"text\"},\"tools\":[],"
                 "\"add_generation_prompt\":false,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                 "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>");
    /* effort max by default, NULL effort: no message. */
    CHECK_RENDER("{\"thinking_effort\":null,\"messages\":[]}",
                 "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
    CHECK_RENDER("{\"messages\":[],\"add_generation_prompt\":false}", EFFORT("max"));
    /* json_schema without a schema renders null (chat.rs). */
    char *t = render_text("{\"thinking\":false,\"response_format\":{\"type\":\"json_schema\"},\"messages\":[]}", NULL,
                          NULL);
    TCHECK(t && strstr(t, "schema:\n```json\nnull\n```<|close|>"));
    free(t);
}

static void test_assistant_and_reasoning(void)
{
    /* reasoning_content empty -> reasoning; blank reasoning omitted (but
     * non-blank is emitted untrimmed); content parts; thinking off drops the
     * think block; names and escaping. */
    CHECK_RENDER(
        "{\"add_generation_prompt\":false,\"thinking_effort\":null,\"messages\":["
        "{\"role\":\"assistant\",\"reasoning_content\":\"\",\"reasoning\":\"  r1 \",\"content\":[{\"type\":\"text\","
        "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}],\"name\":\"x&y\"},"
        "{\"role\":\"assistant\",\"reasoning_content\":\" \\n\\t\",\"content\":null},"
        "{\"role\":\"assistant\",\"reasoning_content\":null,\"reasoning\":null,\"content\":\"c\"}]}",
        "<|open|>message role=\"assistant\" name=\"x&amp;y\"<|sep|><|open|>think<|sep|>  r1 <|close|>think<|sep|>"
        "<|open|>response<|sep|>ab<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>"
        "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>c"
        "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>");
    CHECK_RENDER("{\"thinking\":false,\"add_generation_prompt\":false,\"messages\":["
                 "{\"role\":\"assistant\",\"reasoning_content\":\"hidden\",\"content\":\"shown\"}]}",
                 "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>shown<|close|>response<|sep|>"
                 "<|close|>message<|sep|><|end_of_msg|>");
    /* Names: Python str() of non-strings, falsy names dropped; content
     * markers stay text (they are ordinary segments). */
    chat_segments *s;
    df_error err;
    TCHECK(!render_req("{\"thinking\":false,\"add_generation_prompt\":false,\"messages\":["
                       "{\"role\":\"user\",\"name\":true,\"content\":\"<|open|>\"},"
                       "{\"role\":\"user\",\"name\":\"\",\"content\":\"x\"},{\"role\":\"system\",\"name\":0,"
                       "\"content\":\"y\"},{\"role\":\"user\",\"name\":2.5,\"content\":\"z\"}]}",
                       &s, &err));
    if (s) {
        char *t = chat_segments_join(s, NULL);
        TCHECKF(!strcmp(t, "<|open|>message role=\"user\" name=\"True\"<|sep|><|open|><|close|>message<|sep|>"
                           "<|end_of_msg|><|open|>message role=\"user\"<|sep|>x<|close|>message<|sep|><|end_of_msg|>"
                           "<|open|>message role=\"system\"<|sep|>y<|close|>message<|sep|><|end_of_msg|>"
                           "<|open|>message role=\"user\" name=\"2.5\"<|sep|>z<|close|>message<|sep|>"
                           "<|end_of_msg|>"),
                "%s", t);
        free(t);
        int n_ctl_open = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (s->seg[i].control) {
                n_ctl_open += !strcmp(s->seg[i].text, "<|open|>");
                TCHECK(s->seg[i].text[0] == '<' && s->seg[i].text[1] == '|');
            }
            TCHECK(s->seg[i].len > 0);
        }
        TCHECK(n_ctl_open == 4);
        chat_segments_free(s);
    }
}

static void test_tool_calls_and_results(void)
{
    /* Typed arguments (strings raw, others JSON with ", " / ": " in
     * insertion order, floats as Python repr), arguments given as an object,
     * flat calls without "function", blank / null arguments, tool names by
     * position when ids do not match, index counting since the assistant. */
    CHECK_RENDER(
        "{\"thinking\":false,\"add_generation_prompt\":false,\"messages\":["
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
        "{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{\\\"s\\\":\\\"a\\\\\\\"b&\\\",\\\"n\\\":1e16,\\\"f\\\":0.5,\\\"i\\\":-3,\\\"t\\\":true,\\\"z\\\":null,"
        "\\\"o\\\":{\\\"y\\\":[1,2],\\\"x\\\":{}},\\\"a\\\":[\\\"p\\\",1.0]}\"}},"
        "{\"id\":\"2\",\"name\":\"g\",\"arguments\":{\"k\":\"v\"}},"
        "{\"id\":\"3\",\"function\":{\"name\":\"h\",\"arguments\":\"  \"}},"
        "{\"function\":{\"name\":\"q&\\\"\",\"arguments\":null}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"r1\"},"
        "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":\"r2\"}]},"
        "{\"role\":\"user\",\"content\":\"u\"},"
        "{\"role\":\"tool\",\"name\":\"named\",\"content\":\"r3\"}]}",
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"f\" index=\"1\"<|sep|>"
        "<|open|>argument key=\"s\" type=\"string\"<|sep|>a\"b&<|close|>argument<|sep|>"
        "<|open|>argument key=\"n\" type=\"number\"<|sep|>1e+16<|close|>argument<|sep|>"
        "<|open|>argument key=\"f\" type=\"number\"<|sep|>0.5<|close|>argument<|sep|>"
        "<|open|>argument key=\"i\" type=\"number\"<|sep|>-3<|close|>argument<|sep|>"
        "<|open|>argument key=\"t\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
        "<|open|>argument key=\"z\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
        "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"y\": [1, 2], \"x\": {}}<|close|>argument<|sep|>"
        "<|open|>argument key=\"a\" type=\"array\"<|sep|>[\"p\", 1.0]<|close|>argument<|sep|>"
        "<|close|>call<|sep|>"
        "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>argument key=\"k\" type=\"string\"<|sep|>v"
        "<|close|>argument<|sep|><|close|>call<|sep|>"
        "<|open|>call tool=\"h\" index=\"3\"<|sep|><|close|>call<|sep|>"
        "<|open|>call tool=\"q&amp;&quot;\" index=\"4\"<|sep|><|close|>call<|sep|>"
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"f\" index=\"1\"<|sep|>r1<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"g\" index=\"2\"<|sep|>r2<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>u<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"named\" index=\"3\"<|sep|>r3<|close|>message<|sep|><|end_of_msg|>");
    /* Results reordered to the call order, names from the calls; numeric
     * ids compared by their Python str(); a second run after a new
     * assistant message counts from 1 again. */
    CHECK_RENDER(
        "{\"thinking\":false,\"add_generation_prompt\":false,\"messages\":["
        "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":7,\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}},"
        "{\"id\":\"x\",\"function\":{\"name\":\"b\",\"arguments\":\"{}\"}},"
        "{\"id\":\"y\",\"function\":{\"name\":\"c\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"y\",\"content\":\"C\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"7\",\"name\":\"old\",\"content\":\"A\"},"
        "{\"role\":\"tool\",\"id\":\"x\",\"content\":\"B\"},"
        "{\"role\":\"assistant\",\"content\":\"done\"},"
        "{\"role\":\"tool\",\"tool\":\"late\",\"content\":\"L\"}]}",
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"a\" index=\"1\"<|sep|><|close|>call<|sep|>"
        "<|open|>call tool=\"b\" index=\"2\"<|sep|><|close|>call<|sep|>"
        "<|open|>call tool=\"c\" index=\"3\"<|sep|><|close|>call<|sep|>"
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"a\" index=\"1\"<|sep|>A<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"b\" index=\"2\"<|sep|>B<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"c\" index=\"3\"<|sep|>C<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>done<|close|>response<|sep|>"
        "<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"late\" index=\"1\"<|sep|>L<|close|>message<|sep|><|end_of_msg|>");
}

static void test_errors(void)
{
    static const struct {
        const char *req;
        int code;
        const char *msg;
    } bad[] = {
        {"{\"messages\":{}}", DF_ERR_ARG, "messages: expected an array, got object"},
        {"{\"messages\":[1]}", DF_ERR_ARG, "messages[0]: expected an object, got number"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"x\"}]}", DF_ERR_ARG,
         "messages[1].role: missing"},
        {"{\"messages\":[{\"role\":3}]}", DF_ERR_ARG, "messages[0].role: expected a string, got number"},
        {"{\"messages\":[{\"role\":\"moderator\",\"content\":\"x\"}]}", DF_ERR_ARG,
         "messages[0].role: unknown role \"moderator\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", DF_ERR_ARG,
         "messages[0].content: expected a string, an array of parts or null, got number"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\","
         "\"image_url\":{\"url\":\"u\"}}]}]}",
         DF_ERR_UNSUPPORTED, "messages[0].content[1].type: \"image_url\" parts are not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", DF_ERR_ARG,
         "messages[0].content[0].text: missing"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}", DF_ERR_ARG,
         "messages[0].content[0].text: expected a string, got number"},
        {"{\"messages\":[{\"role\":\"system\",\"content\":[\"a\"]}]}", DF_ERR_ARG,
         "messages[0].content[0]: expected an object, got string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":{\"a\":1}}]}",
         DF_ERR_ARG, "messages[1].tool_calls: expected an array, got object"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[3]}]}", DF_ERR_ARG,
         "messages[0].tool_calls[0]: expected an object, got number"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":\"f\"}]}]}", DF_ERR_ARG,
         "messages[0].tool_calls[0].function: expected an object"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]}",
         DF_ERR_ARG, "messages[0].tool_calls[0].function.name: missing"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":"
         "\"[1]\"}}]}]}",
         DF_ERR_ARG, "messages[0].tool_calls[0].function.arguments: must encode a JSON object, not array"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"name\":\"f\",\"arguments\":5}]}]}", DF_ERR_ARG,
         "messages[0].tool_calls[0].arguments: expected a JSON string or object, got number"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"r\"}]}", DF_ERR_ARG,
         "messages[0]: a tool message needs a tool name"},
        /* the error names the index in the request, not the render order */
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\"}},"
         "{\"id\":\"b\",\"function\":{\"name\":\"g\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":1},"
         "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"ok\"}]}",
         DF_ERR_ARG, "messages[1].content: expected a string"},
        {"{\"thinking_effort\":\"medium\",\"messages\":[]}", DF_ERR_ARG,
         "thinking_effort: unsupported value \"medium\""},
        {"{\"tool_choice\":{\"type\":\"function\",\"function\":{}},\"messages\":[]}",
         DF_ERR_ARG, "tool_choice: expected {\"type\": \"function\""},
        {"{\"tool_choice\":\"sometimes\",\"messages\":[]}", DF_ERR_ARG, "tool_choice: expected"},
        {"{\"response_format\":{\"type\":\"xml\"},\"messages\":[]}", DF_ERR_ARG, "response_format.type: expected"},
        {"{\"response_format\":{},\"messages\":[]}", DF_ERR_ARG, "response_format.type: expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        chat_segments *s;
        df_error err;
        int rc = render_req(bad[i].req, &s, &err);
        TCHECKF(rc && !s, "accepted %s", bad[i].req);
        TCHECKF(err.code == bad[i].code && strstr(err.msg, bad[i].msg), "%s: code %d, message \"%s\"", bad[i].req,
                err.code, err.msg);
        chat_segments_free(s);
    }
    /* thinking off: the effort is not looked at (chat.rs) */
    chat_segments *s;
    df_error err;
    TCHECK(!render_req("{\"thinking\":false,\"thinking_effort\":\"medium\",\"messages\":[]}", &s, &err));
    chat_segments_free(s);
    /* the error position is the offending value's byte offset */
    static const char req[] = "{\"messages\":[{\"role\":\"user\",\"content\":5}]}";
    TCHECK(render_req(req, &s, &err) && err.pos == (int64_t)(strchr(req, '5') - req));
}

static void test_json_write(void)
{
    static const struct {
        double x;
        const char *want;
    } d[] = {
        {1e16, "1e+16"}, {1234567890123456.0, "1234567890123456.0"}, {0.0001, "0.0001"}, {0.00001, "1e-05"},
        {1.5e-7, "1.5e-07"}, {123.456, "123.456"}, {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"}, {0.30000000000000004, "0.30000000000000004"},
        {100.0, "100.0"}, {1e15, "1000000000000000.0"}, {-2.5e-5, "-2.5e-05"}, {-0.0, "-0.0"}, {0.0, "0.0"},
        {1e21, "1e+21"}, {12345678901234567890.0, "1.2345678901234567e+19"},
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        json_buf b;
        json_buf_init(&b);
        json_write_double(&b, d[i].x);
        TCHECKF(b.p && !strcmp(b.p, d[i].want), "%.17g -> %s, want %s", d[i].x, b.p ? b.p : "", d[i].want);
        json_buf_free(&b);
    }
    json_buf b;
    json_buf_init(&b);
    json_write_string(&b, "a\"\\\b\f\n\r\t\x01\x1f\x7f\xc3\xa9", 13);
    TCHECKF(!strcmp(b.p, "\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xc3\xa9\""), "%s", b.p);
    json_buf_free(&b);
    static const char src[] = "{\"b\":[1,{\"d\":null,\"c\":false}],\"a\":\"x\",\"\":1.5}";
    df_error err = {0};
    json_doc *doc = json_parse(src, strlen(src), &err);
    TCHECK(doc);
    if (!doc) return;
    json_buf_init(&b);
    json_write_value(&b, json_root(doc), JSON_WRITE_SORTED);
    TCHECKF(!strcmp(b.p, "{\"\":1.5,\"a\":\"x\",\"b\":[1,{\"c\":false,\"d\":null}]}"), "%s", b.p);
    b.len = 0;
    json_write_value(&b, json_root(doc), JSON_WRITE_SPACED);
    TCHECKF(!strcmp(b.p, "{\"b\": [1, {\"d\": null, \"c\": false}], \"a\": \"x\", \"\": 1.5}"), "%s", b.p);
    json_buf_free(&b);
    json_free(doc);
}

static void test_args_to_json(void)
{
    const chat_arg args[] = {
        {"s", 1, CHAT_ARG_STRING, "a\"b\n", 4},
        {"n", 1, CHAT_ARG_NUMBER, " 1e+16 ", 7},
        {"b", 1, CHAT_ARG_BOOLEAN, "false", 5},
        {"z", 1, CHAT_ARG_NULL, "null", 4},
        {"o", 1, CHAT_ARG_OBJECT, "{\"y\": [1, 2]}", 13},
        {"a", 1, CHAT_ARG_ARRAY, "[]", 2},
        {"bad", 3, CHAT_ARG_NUMBER, "twelve", 6},
        {"mismatch", 8, CHAT_ARG_BOOLEAN, "1", 1},
        {"k\"", 2, CHAT_ARG_STRING, "", 0},
    };
    size_t len;
    char *j = chat_args_to_json(args, sizeof args / sizeof args[0], &len);
    TCHECKF(!strcmp(j, "{\"s\":\"a\\\"b\\n\",\"n\":1e+16,\"b\":false,\"z\":null,\"o\":{\"y\": [1, 2]},\"a\":[],"
                       "\"bad\":\"twelve\",\"mismatch\":\"1\",\"k\\\"\":\"\"}") &&
                len == strlen(j),
            "%s", j);
    free(j);
    j = chat_args_to_json(NULL, 0, NULL);
    TCHECK(!strcmp(j, "{}"));
    free(j);
    TCHECK(!strcmp(chat_arg_type_name(CHAT_ARG_BOOLEAN), "boolean"));
}

/* ---- parser ------------------------------------------------------------- */

static const char RT_USER[] = "{\"role\":\"user\",\"content\":\"Weather? \xe2\x98\x80\"}";
static const char RT_ASSISTANT[] =
    "{\"role\":\"assistant\",\"reasoning_content\":\"Need tools: \xe6\xbc\xa2\xe5\xad\x97 & \\\"q\\\".\","
    "\"content\":\"Checking \xf0\x9f\x99\x82\",\"tool_calls\":["
    "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
    "\"{\\\"city\\\":\\\"Paris & \\\\\\\"Lyon\\\\\\\"\\\",\\\"days\\\":3,\\\"metric\\\":true,\\\"extra\\\":null,"
    "\\\"ratio\\\":0.5,\\\"tags\\\":[\\\"a\\\",\\\"b\\\"],\\\"opts\\\":{\\\"x\\\":1,\\\"y\\\":\\\"<|open|>\\\"},"
    "\\\"empty\\\":\\\"\\\",\\\"multi\\\":\\\"line1\\\\nline2 \xc3\xa9\\\"}\"}},"
    "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"na\\\"me&\",\"arguments\":\"not json {\"}},"
    "{\"id\":\"c3\",\"function\":{\"name\":\"noargs\",\"arguments\":\"\"}}]}";
static const char RT_ARGS0[] =
    "{\"city\":\"Paris & \\\"Lyon\\\"\",\"days\":3,\"metric\":true,\"extra\":null,\"ratio\":0.5,\"tags\":[\"a\","
    "\"b\"],\"opts\":{\"x\":1,\"y\":\"<|open|>\"},\"empty\":\"\",\"multi\":\"line1\\nline2 \xc3\xa9\"}";

/* ids of the assistant turn as the model would write it after the
 * generation prompt: render with and without the turn and take the tail. */
static int32_t *assistant_ids(int thinking, size_t *n)
{
    char prompt[4096], full[8192];
    snprintf(prompt, sizeof prompt, "{\"thinking\":%s,\"messages\":[%s]}", thinking ? "true" : "false", RT_USER);
    snprintf(full, sizeof full, "{\"thinking\":%s,\"add_generation_prompt\":false,\"messages\":[%s,%s]}",
             thinking ? "true" : "false", RT_USER, RT_ASSISTANT);
    size_t np, nf;
    int32_t *p = render_ids(prompt, &np), *f = render_ids(full, &nf);
    int32_t *tail = NULL;
    *n = 0;
    if (p && f && nf > np && !memcmp(p, f, np * sizeof *p)) {
        *n = nf - np;
        tail = xmalloc(*n * sizeof *tail);
        memcpy(tail, f + np, *n * sizeof *tail);
    }
    free(p);
    free(f);
    return tail;
}

static void check_round_trip(int thinking)
{
    size_t n;
    int32_t *ids = assistant_ids(thinking, &n);
    TCHECKF(ids, "the prompt's ids are not a prefix of the conversation's");
    if (!ids) return;
    parsed r;
    run_parser(ids, n, thinking, 0, &r);
    TCHECKF(!r.bad && r.ended, "bad %d ended %d", r.bad, r.ended);
    const char *want_reasoning = thinking ? "Need tools: \xe6\xbc\xa2\xe5\xad\x97 & \"q\"." : "";
    TCHECKF(!strcmp(r.reasoning.p ? r.reasoning.p : "", want_reasoning), "reasoning \"%s\"",
            r.reasoning.p ? r.reasoning.p : "");
    TCHECKF(r.content.p && !strcmp(r.content.p, "Checking \xf0\x9f\x99\x82"), "content \"%s\"",
            r.content.p ? r.content.p : "");
    TCHECK(!r.deltas_with_marker && !r.deltas_bad_utf8);
    TCHECKF(r.n_calls == 3, "%d calls", r.n_calls);
    if (r.n_calls == 3) {
        TCHECK(!strcmp(r.call_name[0], "get_weather"));
        TCHECKF(json_text_equal(r.call_args[0], strlen(r.call_args[0]), RT_ARGS0, strlen(RT_ARGS0)), "args %s",
                r.call_args[0]);
        TCHECK(!strcmp(r.call_name[1], "na\"me&"));
        TCHECK(!strcmp(r.call_args[1], "not json {") && r.call_json[1] && !strcmp(r.call_json[1], "not json {"));
        TCHECK(!strcmp(r.call_name[2], "noargs") && !strcmp(r.call_args[2], "{}"));
        TCHECK(r.n_args_ev == 9 && r.n_json_ev == 1);
    }
    parsed_free(&r);

    /* Every truncation: finish() keeps the invariants and closes calls. */
    for (size_t k = 0; k <= n; k++) {
        run_parser(ids, k, thinking, 1, &r);
        TCHECKF(!r.bad && !r.deltas_bad_utf8, "prefix %zu: bad %d, utf8 %d", k, r.bad, r.deltas_bad_utf8);
        parsed_free(&r);
    }
    free(ids);
}

static void test_parser_round_trip(void)
{
    NEED_TOK();
    check_round_trip(1);
    check_round_trip(0);
}

static void test_parser_events(void)
{
    NEED_TOK();
    chat_parser *p;
    df_error err = {0};
    TCHECK(!chat_parser_new(tok(), 0, &p, &err));
    if (!p) return;
    size_t n;
    int32_t *ids = encode_special("<|open|>tools<|sep|><|open|>call tool=\"f&amp;\" index=\"1\"<|sep|>"
                                  "<|open|>argument key=\"k\" type=\"number\"<|sep|>42<|close|>argument<|sep|>"
                                  "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
                                  &n);
    int seen_begin = 0, seen_arg = 0, seen_end = 0, seen_msg_end = 0;
    for (size_t i = 0; i < n; i++) {
        const chat_event *ev;
        size_t k = chat_parser_feed(p, ids[i], &ev);
        for (size_t j = 0; j < k; j++) {
            if (ev[j].type == CHAT_EV_CALL_BEGIN)
                seen_begin = !strcmp(ev[j].name, "f&") && ev[j].name_len == 2 && ev[j].index == 0;
            if (ev[j].type == CHAT_EV_CALL_ARG)
                seen_arg = !strcmp(ev[j].name, "k") && ev[j].arg_type == CHAT_ARG_NUMBER && !strcmp(ev[j].text, "42");
            if (ev[j].type == CHAT_EV_CALL_END)
                seen_end = !strcmp(ev[j].text, "{\"k\":42}") && !strcmp(ev[j].name, "f&");
            if (ev[j].type == CHAT_EV_END) seen_msg_end = 1;
            TCHECK(ev[j].type != CHAT_EV_CONTENT);
        }
    }
    TCHECK(seen_begin && seen_arg && seen_end && seen_msg_end && chat_parser_done(p));
    const chat_event *ev;
    TCHECK(chat_parser_feed(p, ids[0], &ev) == 0);
    /* reset starts over */
    chat_parser_reset(p, 1);
    TCHECK(!chat_parser_done(p));
    free(ids);
    ids = encode_special("abc", &n);
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = chat_parser_feed(p, ids[i], &ev);
        for (size_t j = 0; j < k; j++) got += ev[j].type == CHAT_EV_REASONING ? ev[j].len : 0;
    }
    TCHECK(got == 3);
    free(ids);
    chat_parser_free(p);
}

static void test_parser_malformed(void)
{
    NEED_TOK();
    static const struct {
        const char *text;
        int think;
        const char *reasoning, *content;
        int calls, ended;
        const char *args0;
    } cases[] = {
        /* unknown tags, tags in the wrong place, stray markers: text */
        {"Hello <|open|>bogus<|sep|>world<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", 0, "",
         "Hello <|open|>bogus<|sep|>world", 0, 1, NULL},
        {"a<|close|>think<|sep|>b<|sep|>c[EOS]<|end_of_msg|>", 0, "", "a<|close|>think<|sep|>b<|sep|>c[EOS]", 0, 1,
         NULL},
        {"x<|open|>response attr<|sep|>y", 0, "", "x<|open|>response attr<|sep|>y", 0, 0, NULL},
        {"r<|close|>think extra=\"1\"<|sep|>s", 1, "r<|close|>think extra=\"1\"<|sep|>s", "", 0, 0, NULL},
        /* an unfinished tag the model ended becomes text; one a cut (finish) interrupted is dropped */
        {"abc<|open|>respo<|end_of_msg|>", 0, "", "abc<|open|>respo", 0, 1, NULL},
        {"abc<|open|>respo", 0, "", "abc", 0, 0, NULL},
        {"<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=", 0, "", "", 1, 0,
         "{}"},
        {"abc<|open|><|close|>x<|sep|>", 0, "", "abc<|open|><|close|>x<|sep|>", 0, 0, NULL},
        /* think left implicitly by <response>; text between blocks is content */
        {"r1<|open|>response<|sep|>c1<|end_of_msg|>", 1, "r1", "c1", 0, 1, NULL},
        {"r<|close|>think<|sep|>\n<|open|>response<|sep|>c<|close|>response<|sep|>t<|end_of_msg|>", 1, "r",
         "\nct", 0, 1, NULL},
        /* markers inside an argument value stay in the value */
        {"<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"k\" "
         "type=\"string\"<|sep|>v<|open|>x<|sep|>w<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
         "<|end_of_msg|>",
         0, "", "", 1, 1, "{\"k\":\"v<|open|>x<|sep|>w\"}"},
        /* bad typed value: quoted; a call without tool= is not a call */
        {"<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>abc"
         "<|close|>argument<|sep|><|close|>call<|sep|>",
         0, "", "", 1, 0, "{\"n\":\"abc\"}"},
        {"<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|>", 0, "", "<|open|>call index=\"1\"<|sep|>", 0, 0, NULL},
        /* truncated inside an argument / a JSON block: emitted, call closed */
        {"<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"p\"<|sep|>par", 0, "", "", 1, 0,
         "{\"p\":\"par\"}"},
        {"<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>json type=\"object\"<|sep|>{\"a\":<|end_of_msg|>", 0,
         "", "", 1, 1, "{\"a\":"},
        /* attribute syntax errors: no quotes, unterminated value */
        {"<|open|>tools<|sep|><|open|>call tool=f<|sep|>", 0, "", "<|open|>call tool=f<|sep|>", 0, 0, NULL},
        {"<|open|>tools<|sep|><|open|>call tool=\"f<|sep|>", 0, "", "<|open|>call tool=\"f<|sep|>", 0, 0, NULL},
        /* after </message>: text is content until <|end_of_msg|> */
        {"c<|close|>message<|sep|>tail<|end_of_msg|>more", 0, "", "ctail", 0, 1, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        parsed r;
        parse_text(cases[i].text, cases[i].think, &r);
        const char *re = r.reasoning.p ? r.reasoning.p : "", *co = r.content.p ? r.content.p : "";
        TCHECKF(!r.bad && !r.deltas_bad_utf8, "case %zu: bad %d", i, r.bad);
        TCHECKF(!strcmp(re, cases[i].reasoning), "case %zu: reasoning \"%s\"", i, re);
        TCHECKF(!strcmp(co, cases[i].content), "case %zu: content \"%s\"", i, co);
        TCHECKF(r.n_calls == cases[i].calls && r.ended == cases[i].ended, "case %zu: %d calls, ended %d", i,
                r.n_calls, r.ended);
        if (cases[i].args0 && r.n_calls)
            TCHECKF(!strcmp(r.call_args[0], cases[i].args0), "case %zu: args %s", i, r.call_args[0]);
        parsed_free(&r);
    }
    /* a tag longer than the limit is text */
    size_t big = 10000;
    char *text = xmalloc(big + 64);
    strcpy(text, "<|open|>");
    memset(text + 8, 'a', big);
    strcpy(text + 8 + big, "<|sep|>z");
    parsed r;
    parse_text(text, 0, &r);
    TCHECK(r.content.p && r.content.len == big + 16 && !memcmp(r.content.p, "<|open|>aaa", 11) && !r.bad);
    parsed_free(&r);
    free(text);
}

static void test_parser_utf8(void)
{
    NEED_TOK();
    /* multi-byte characters split over byte tokens come out whole; an
     * incomplete sequence cut by a marker or the end becomes U+FFFD. */
    static const char s[] = "h\xc3\xa9llo \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x99\x82!";
    parsed r;
    parse_text(s, 0, &r);
    TCHECK(r.content.p && !strcmp(r.content.p, s) && !r.deltas_bad_utf8);
    parsed_free(&r);
    /* the byte 0xF0 alone, then a marker */
    size_t n;
    int32_t *a = encode_special("\xf0\x9f\x99\x82", &n);
    if (n >= 2) {
        int32_t ids[3] = {a[0], tokenizer_special_id(tok(), "<|sep|>"), a[n - 1]};
        run_parser(ids, 3, 0, 1, &r);
        TCHECKF(!r.deltas_bad_utf8 && r.content.p && strstr(r.content.p, "\xef\xbf\xbd<|sep|>"), "%s",
                r.content.p ? r.content.p : "");
        parsed_free(&r);
    }
    free(a);
}

static void test_parser_garbage(void)
{
    NEED_TOK();
    int nv = tokenizer_n_vocab(tok());
    int32_t markers[6] = {tokenizer_special_id(tok(), "<|open|>"), tokenizer_special_id(tok(), "<|close|>"),
                          tokenizer_special_id(tok(), "<|sep|>"), tokenizer_special_id(tok(), "<|end_of_msg|>"),
                          nv - 1, -5};
    size_t nw;
    int32_t *words = encode_special("tools call tool=\"f\" argument key=\"k\" type=\"number\" json response think "
                                    "message \xe6\xbc\xa2 ",
                                    &nw);
    size_t nrt;
    int32_t *rt = assistant_ids(1, &nrt);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    int32_t seq[400];
    int bad = 0, utf8 = 0;
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = 0;
        int mode = iter % 3;
        for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            unsigned r = (unsigned)(st >> 33);
            if (mode == 2 && rt && nrt) {
                /* a mutated round-trip stream */
                seq[len++] = r % 10 == 0 ? markers[r / 10 % 6] : r % 10 == 1 ? (int32_t)(r / 10 % (unsigned)nv)
                                                                           : rt[(i + r % 3) % nrt];
            } else if (r % 4 == 0) {
                seq[len++] = markers[r / 4 % 6];
            } else if (r % 4 == 1 || mode == 1) {
                seq[len++] = words[r / 4 % nw];
            } else {
                seq[len++] = (int32_t)(r / 4 % (unsigned)(nv + 8));
            }
            if (r % 97 == 0) break;
        }
        parsed p;
        run_parser(seq, len, iter & 1, 1, &p);
        bad += p.bad != 0;
        utf8 += p.deltas_bad_utf8;
        parsed_free(&p);
    }
    TCHECKF(!bad && !utf8, "%d streams broke an invariant, %d bad UTF-8 deltas", bad, utf8);
    free(words);
    free(rt);
}

static void test_developer_role(void)
{
    const char *a = "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]";
    const char *b = "[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]";
    df_error err = {0};
    json_doc *da = json_parse(a, strlen(a), &err), *db = json_parse(b, strlen(b), &err);
    TCHECK(da && db);
    chat_options o;
    chat_options_init(&o);
    chat_segments *sa = NULL, *sb = NULL;
    TCHECK(chat_render(json_root(da), &o, &sa, &err) == 0);
    TCHECKF(chat_render(json_root(db), &o, &sb, &err) == 0, "developer role: %s", err.msg);
    if (sa && sb) {
        char *ja = chat_segments_join(sa, NULL), *jb = chat_segments_join(sb, NULL);
        TCHECKF(!strcmp(ja, jb), "developer renders differently from system");
        free(ja);
        free(jb);
    }
    chat_segments_free(sa);
    chat_segments_free(sb);
    json_free(da);
    json_free(db);
}

/* The parser allocates nothing per token once made: a whole reply with
 * reasoning, content and a tool call with two typed arguments is fed under
 * the allocation guard (which sees every allocation of the process), in a
 * forked child because the guard aborts. */
static void test_parser_no_alloc_per_token(void)
{
    NEED_TOK();
    static const char text[] =
        "hmm<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>"
        "Paris<|close|>argument<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    df_error err = {0};
    chat_parser *p = NULL;
    if (tokenizer_encode(tok(), text, sizeof text - 1, 1, &ids, &n, &cap, &err) ||
        chat_parser_new(tok(), 1, &p, &err)) {
        t_fail(__FILE__, __LINE__, "%s", err.msg);
        free(ids);
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int calls = 0, content = 0, reasoning = 0;
        alloc_guard_enter();
        for (size_t i = 0; i < n; i++) {
            const chat_event *ev;
            size_t k = chat_parser_feed(p, ids[i], &ev);
            for (size_t j = 0; j < k; j++) {
                calls += ev[j].type == CHAT_EV_CALL_END;
                content += ev[j].type == CHAT_EV_CONTENT;
                reasoning += ev[j].type == CHAT_EV_REASONING;
            }
        }
        alloc_guard_leave();
        _exit(calls == 1 && content && reasoning ? 0 : 2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    TCHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "feeding a reply under the allocation guard: status %d (SIGABRT: the parser allocated)", st);
    chat_parser_free(p);
    free(ids);
}

static const test_case tests[] = {
    {"developer_role_is_system", test_developer_role},
    {"chat_fixture_segments", test_fixture_segments},
    {"chat_fixture_ids", test_fixture_ids},
    {"chat_rs_gold", test_chat_rs_gold},
    {"chat_system_tools_and_controls", test_system_tools_and_controls},
    {"chat_assistant_and_reasoning", test_assistant_and_reasoning},
    {"chat_tool_calls_and_results", test_tool_calls_and_results},
    {"chat_errors", test_errors},
    {"chat_json_write", test_json_write},
    {"chat_args_to_json", test_args_to_json},
    {"chat_parser_round_trip", test_parser_round_trip},
    {"chat_parser_events", test_parser_events},
    {"chat_parser_malformed", test_parser_malformed},
    {"chat_parser_utf8", test_parser_utf8},
    {"chat_parser_garbage", test_parser_garbage},
    {"chat_parser_no_alloc_per_token", test_parser_no_alloc_per_token},
};

int main(int argc, char **argv)
{
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    tokenizer_free(g_tok);
    return rc;
}
