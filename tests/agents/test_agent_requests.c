/* test_agent_requests.c - what coding agents send, rendered by the rules
 * README's "Coding agents" section documents.
 *
 * The recorded requests (tests/agents/recorded/AGENT/NAME.json: bodies as
 * the agents sent them to `deltafin serve`, captured by record_proxy.mjs)
 * are validated and rendered exactly as the server does (request_job, on
 * the default model's tokenizer, at a 64K context; Claude Code on
 * /v1/messages, Codex on /v1/responses, Continue and OpenCode on chat
 * completions), and the rendered prompt
 * is checked: every request accepted; Claude Code's billing line left out
 * (kept with --keep-billing-header); its trailing system message rendered
 * as a system turn after the user's; a deferred tool absent; two sessions
 * sharing everything before the first user message.  Synthetic bodies
 * (built here from the same shapes, since the small default model seldom
 * calls tools) check the rules the recordings cannot reach: thinking kept
 * per clear_thinking and restored from its signature, clear_tool_uses,
 * tool_reference loading a deferred tool in K3's lazy-loading form, effort
 * mapping, and the fields refused by name.
 * Built and run by tests/agents/run_agent_tests.sh (needs build/libdeltafin.a).
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

#include "../server/server_stubs.h"

static srv S;
static const char *REC = "tests/agents/recorded/claude-code";

/* The "body" of a recording, as JSON text (name: under REC, or AGENT/NAME
 * under tests/agents/recorded). */
static char *recorded_body(const char *name)
{
    char path[512];
    size_t n = 0;
    if (strchr(name, '/')) snprintf(path, sizeof path, "tests/agents/recorded/%s.json", name);
    else snprintf(path, sizeof path, "%s/%s.json", REC, name);
    char *text = t_slurp(path, &n);
    if (!text) {
        t_fail(__FILE__, __LINE__, "%s: cannot read", path);
        return NULL;
    }
    df_error err = {0};
    json_doc *d = json_parse(text, n, &err);
    free(text);
    const json_value *b = d ? json_get(json_root(d), "body") : NULL;
    if (!b) {
        t_fail(__FILE__, __LINE__, "%s: no body (%s)", path, err.msg);
        json_free(d);
        return NULL;
    }
    json_buf out;
    json_buf_init(&out);
    json_write_value(&out, b, 0);
    json_buf_put(&out, "", 1);
    json_free(d);
    return out.p;
}

/* A job from a /v1/messages body, or NULL with the error message in msg. */
static job *messages_job(const char *body, char *msg, size_t n)
{
    rq_err e = {0};
    job *j = request_job(&S, API_MESSAGES, body, strlen(body), &e);
    if (!j && msg) snprintf(msg, n, "%d %s (param %s)", e.status, e.msg, e.param);
    return j;
}

/* The rendered prompt as text (special tokens spelled out). */
static char *prompt_text(const job *j)
{
    json_buf b;
    json_buf_init(&b);
    for (size_t i = 0; i < j->n_ids; i++) {
        size_t len = 0;
        const char *s = tokenizer_token_bytes(S.tok, j->ids[i], &len);
        if (s) json_buf_put(&b, s, len);
    }
    json_buf_put(&b, "", 1);
    return b.p;
}

/* Position (in ids) of the first id whose text completes `needle`, or n_ids. */
static size_t pos_of(const job *j, const char *needle)
{
    json_buf b;
    json_buf_init(&b);
    size_t i = 0;
    for (; i < j->n_ids; i++) {
        size_t len = 0;
        const char *s = tokenizer_token_bytes(S.tok, j->ids[i], &len);
        if (s) json_buf_put(&b, s, len);
        json_buf_put(&b, "", 1);
        b.len--;
        if (strstr(b.p, needle)) break;
    }
    json_buf_free(&b);
    return i;
}

static void test_recorded_accepted(void)
{
    static const char *const names[] = {"session-a-turn1", "session-a-turn2", "session-b-turn1"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *body = recorded_body(names[i]), msg[700] = "";
        if (!body) continue;
        job *j = messages_job(body, msg, sizeof msg);
        TCHECKF(j, "%s refused: %s", names[i], msg);
        if (j) {
            printf("# %s: %zu prompt tokens, applied_edits %s\n", names[i], j->n_ids, j->ctx_edits ? j->ctx_edits : "-");
            /* clear_thinking keep "all" is sent: reported, nothing cleared */
            TCHECK(j->ctx_edits && !strcmp(j->ctx_edits, "[]"));
            TCHECK(j->think && j->think_omit);
            job_unref(j);
        }
        free(body);
    }
}

/* Continue and OpenCode speak chat completions, Codex the Responses API:
 * accepted as recorded */
static void test_recorded_chat_accepted(void)
{
    static const char *const names[] = {"continue/turn1", "opencode/title", "opencode/turn1", "codex/turn1",
                                        "codex/turn2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *body = recorded_body(names[i]);
        if (!body) continue;
        rq_err e = {0};
        job *j = request_job(&S, strncmp(names[i], "codex/", 6) ? API_CHAT : API_RESPONSES, body, strlen(body), &e);
        TCHECKF(j, "%s refused: %d %s (param %s)", names[i], e.status, e.msg, e.param);
        if (j) {
            printf("# %s: %zu prompt tokens\n", names[i], j->n_ids);
            job_unref(j);
        }
        free(body);
    }
}

/* Codex's second turn sends the first turn's items back: its prompt
 * starts with the first turn's whole prompt (the prefix a slot reuses) */
static void test_codex_turns_share_prefix(void)
{
    char *a = recorded_body("codex/turn1"), *b = recorded_body("codex/turn2");
    rq_err e = {0};
    job *ja = a ? request_job(&S, API_RESPONSES, a, strlen(a), &e) : NULL;
    job *jb = b ? request_job(&S, API_RESPONSES, b, strlen(b), &e) : NULL;
    TCHECKF(ja && jb, "%s", e.msg);
    if (ja && jb) {
        size_t lcp = 0;
        while (lcp < ja->n_ids && lcp < jb->n_ids && ja->ids[lcp] == jb->ids[lcp]) lcp++;
        printf("# codex turns: %zu and %zu tokens, %zu in common\n", ja->n_ids, jb->n_ids, lcp);
        TCHECK(lcp + 1 >= ja->n_ids && jb->n_ids > ja->n_ids);
    }
    if (ja) job_unref(ja);
    if (jb) job_unref(jb);
    free(a);
    free(b);
}

static void test_billing_line(void)
{
    char *body = recorded_body("session-a-turn1");
    if (!body) return;
    TCHECK(strstr(body, "x-anthropic-billing-header"));
    job *j = messages_job(body, NULL, 0);
    TCHECK(j);
    S.keep_billing = 1;
    job *k = messages_job(body, NULL, 0);
    S.keep_billing = 0;
    TCHECK(k);
    if (j && k) {
        char *a = prompt_text(j), *b = prompt_text(k);
        TCHECKF(!strstr(a, "x-anthropic-billing-header"), "the billing line was rendered");
        TCHECK(strstr(b, "x-anthropic-billing-header: cc_version="));
        TCHECK(strstr(a, "You are a Claude agent"));
        TCHECK(k->n_ids > j->n_ids);
        free(a);
        free(b);
    }
    if (j) job_unref(j);
    if (k) job_unref(k);
    free(body);
}

/* Claude Code ends with a system message after the user turn: rendered as
 * a system turn there, after the prompt's text. */
static void test_trailing_system_turn(void)
{
    char *body = recorded_body("session-a-turn1");
    if (!body) return;
    job *j = messages_job(body, NULL, 0);
    TCHECK(j);
    if (j) {
        char *t = prompt_text(j);
        const char *user = strstr(t, "<|open|>message role=\"user\"<|sep|>");
        const char *q = user ? strstr(user, "What is 23 + 45?") : NULL;
        const char *sys = q ? strstr(q, "<|open|>message role=\"system\"<|sep|>") : NULL;
        TCHECKF(user && q && sys, "no system turn after the user's question");
        TCHECK(sys && strstr(sys, "<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\""));
        /* the deferred placeholder stays out; the eager tools are declared */
        TCHECK(!strstr(t, "DeferredToolPlaceholder"));
        TCHECK(strstr(t, "\"name\":\"ToolSearch\""));
        /* output_config.effort "medium" (and the system turn's own) -> K3's "high" */
        TCHECK(strstr(t, "thinking_effort=high"));
        free(t);
        job_unref(j);
    }
    free(body);
}

/* Two sessions (other billing line suffix, other question) share the
 * whole tool list and system prompt. */
static void test_sessions_share_prefix(void)
{
    char *a = recorded_body("session-a-turn1"), *b = recorded_body("session-b-turn1");
    job *ja = a ? messages_job(a, NULL, 0) : NULL, *jb = b ? messages_job(b, NULL, 0) : NULL;
    TCHECK(ja && jb);
    if (ja && jb) {
        size_t lcp = 0;
        while (lcp < ja->n_ids && lcp < jb->n_ids && ja->ids[lcp] == jb->ids[lcp]) lcp++;
        size_t first_user = pos_of(ja, "<|open|>message role=\"user\"");
        printf("# sessions a and b: %zu and %zu tokens, %zu in common; the first user message at %zu\n", ja->n_ids,
               jb->n_ids, lcp, first_user);
        TCHECKF(lcp >= first_user && first_user > ja->n_ids / 2, "common prefix %zu < first user message at %zu", lcp,
                first_user);
        S.keep_billing = 1;
        job *ka = messages_job(a, NULL, 0), *kb = messages_job(b, NULL, 0);
        S.keep_billing = 0;
        size_t lcp2 = 0;
        while (ka && kb && lcp2 < ka->n_ids && lcp2 < kb->n_ids && ka->ids[lcp2] == kb->ids[lcp2]) lcp2++;
        printf("# with --keep-billing-header: %zu in common\n", lcp2);
        TCHECK(ka && kb && lcp2 < first_user);
        if (ka) job_unref(ka);
        if (kb) job_unref(kb);
    }
    if (ja) job_unref(ja);
    if (jb) job_unref(jb);
    free(a);
    free(b);
}

static char *sig_of(const char *text)
{
    json_buf b;
    json_buf_init(&b);
    anth_signature(&b, text, strlen(text));
    json_buf_put(&b, "", 1);
    return b.p;
}

/* A conversation of two assistant turns with thinking (signatures only, as
 * display "omitted" returns them), then a user turn. */
static char *thinking_body(const char *ed_json, const char *sig2_override, const char *text2)
{
    char *s1 = sig_of("FIRST-THOUGHT"), *s2 = sig_of("SECOND-THOUGHT");
    size_t cap = 4096;
    char *b = xmalloc(cap);
    snprintf(b, cap,
             "{\"model\":\"k3\",\"max_tokens\":8,\"thinking\":{\"type\":\"adaptive\",\"display\":\"omitted\"}%s%s%s,"
             "\"messages\":[{\"role\":\"user\",\"content\":\"one\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":%s},"
             "{\"type\":\"text\",\"text\":\"A1\"}]},{\"role\":\"user\",\"content\":\"two\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"%s\",\"signature\":%s},"
             "{\"type\":\"text\",\"text\":\"A2\"}]},{\"role\":\"user\",\"content\":\"three\"}]}",
             ed_json ? ",\"context_management\":{\"edits\":[" : "", ed_json ? ed_json : "", ed_json ? "]}" : "", s1,
             text2, sig2_override ? sig2_override : s2);
    free(s1);
    free(s2);
    return b;
}

static void test_thinking_kept_and_cleared(void)
{
    char msg[700] = "";
    /* keep "all": both turns' thinking rendered from their signatures */
    char *body = thinking_body("{\"type\":\"clear_thinking_20251015\",\"keep\":\"all\"}", NULL, "");
    job *all = messages_job(body, msg, sizeof msg);
    TCHECKF(all, "%s", msg);
    free(body);
    /* no edit: Anthropic's default keeps the last turn's only */
    body = thinking_body(NULL, NULL, "");
    job *def = messages_job(body, msg, sizeof msg);
    TCHECKF(def, "%s", msg);
    free(body);
    /* keep 1 turn, explicitly: the same prompt, and the edit reported with exact counts */
    body = thinking_body("{\"type\":\"clear_thinking_20251015\",\"keep\":{\"type\":\"thinking_turns\",\"value\":1}}",
                         NULL, "");
    job *one = messages_job(body, msg, sizeof msg);
    TCHECKF(one, "%s", msg);
    free(body);
    if (all && def && one) {
        char *ta = prompt_text(all), *td = prompt_text(def);
        TCHECK(strstr(ta, "<|open|>think<|sep|>FIRST-THOUGHT<|close|>think<|sep|>"));
        TCHECK(strstr(ta, "SECOND-THOUGHT"));
        TCHECK(!strstr(td, "FIRST-THOUGHT") && strstr(td, "SECOND-THOUGHT"));
        TCHECK(def->n_ids == one->n_ids && !memcmp(def->ids, one->ids, def->n_ids * sizeof *def->ids));
        char want[200];
        snprintf(want, sizeof want, "[{\"type\":\"clear_thinking_20251015\",\"cleared_thinking_turns\":1,"
                 "\"cleared_input_tokens\":%zu}]", all->n_ids - one->n_ids);
        TCHECKF(one->ctx_edits && !strcmp(one->ctx_edits, want), "applied_edits %s, want %s",
                one->ctx_edits ? one->ctx_edits : "(none)", want);
        TCHECK(!def->ctx_edits && all->ctx_edits && !strcmp(all->ctx_edits, "[]"));
        free(ta);
        free(td);
    }
    if (all) job_unref(all);
    if (def) job_unref(def);
    if (one) job_unref(one);
    /* a signature that is not this server's, and a thinking text changed under its signature */
    body = thinking_body(NULL, "\"dfk3.1.!!!\"", "");
    TCHECK(!messages_job(body, msg, sizeof msg) && strstr(msg, "signature"));
    free(body);
    body = thinking_body(NULL, NULL, "SECOND-THOUGHT");
    job *same = messages_job(body, msg, sizeof msg);
    TCHECKF(same, "the text sent with its own signature: %s", msg);
    if (same) job_unref(same);
    free(body);
    body = thinking_body(NULL, NULL, "CHANGED");
    TCHECK(!messages_job(body, msg, sizeof msg) && strstr(msg, "thinking text was changed"));
    free(body);
}

static char *tools_body(const char *ed_json)
{
    size_t cap = 8192;
    char *b = xmalloc(cap);
    int n = snprintf(b, cap, "{\"model\":\"k3\",\"max_tokens\":8%s%s%s,\"tools\":[{\"name\":\"Read\",\"input_schema\":"
                     "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\"}}}},{\"name\":\"WebFetch\","
                     "\"description\":\"fetch a page\",\"defer_loading\":true,\"input_schema\":{\"type\":\"object\"}}],"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"go\"}",
                     ed_json ? ",\"context_management\":{\"edits\":[" : "", ed_json ? ed_json : "", ed_json ? "]}" : "");
    for (int i = 1; i <= 3; i++)
        n += snprintf(b + n, cap - (size_t)n,
                      ",{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t%d\",\"name\":\"Read\","
                      "\"input\":{\"p\":\"INPUT-%d\"}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                      "\"tool_use_id\":\"t%d\",\"content\":[{\"type\":\"text\",\"text\":\"RESULT-%d has a long text\"}%s]}]}",
                      i, i, i, i, i == 2 ? ",{\"type\":\"tool_reference\",\"tool_name\":\"WebFetch\"}" : "");
    snprintf(b + n, cap - (size_t)n, "]}");
    return b;
}

static void test_clear_tool_uses(void)
{
    char msg[700] = "";
    char *body = tools_body(NULL);
    job *plain = messages_job(body, msg, sizeof msg);
    TCHECKF(plain, "%s", msg);
    free(body);
    body = tools_body("{\"type\":\"clear_tool_uses_20250919\",\"trigger\":{\"type\":\"tool_uses\",\"value\":2},"
                      "\"keep\":{\"type\":\"tool_uses\",\"value\":1},\"clear_tool_inputs\":true}");
    job *cl = messages_job(body, msg, sizeof msg);
    TCHECKF(cl, "%s", msg);
    free(body);
    body = tools_body("{\"type\":\"clear_tool_uses_20250919\",\"trigger\":{\"type\":\"tool_uses\",\"value\":2},"
                      "\"clear_at_least\":{\"type\":\"input_tokens\",\"value\":100000}}");
    job *least = messages_job(body, msg, sizeof msg);
    TCHECKF(least, "%s", msg);
    free(body);
    body = tools_body("{\"type\":\"clear_tool_uses_20250919\"}"); /* default trigger: 100,000 input tokens */
    job *idle = messages_job(body, msg, sizeof msg);
    TCHECKF(idle, "%s", msg);
    free(body);
    if (plain && cl && least && idle) {
        char *tp = prompt_text(plain), *tc = prompt_text(cl);
        TCHECK(strstr(tp, "RESULT-1") && strstr(tp, "RESULT-2") && strstr(tp, "RESULT-3") && strstr(tp, "INPUT-1"));
        TCHECK(!strstr(tc, "RESULT-1") && !strstr(tc, "RESULT-2") && strstr(tc, "RESULT-3"));
        TCHECK(!strstr(tc, "INPUT-1") && !strstr(tc, "INPUT-2") && strstr(tc, "INPUT-3"));
        TCHECK(strstr(tc, CLEARED_RESULT));
        char want[200];
        snprintf(want, sizeof want, "[{\"type\":\"clear_tool_uses_20250919\",\"cleared_tool_uses\":2,"
                 "\"cleared_input_tokens\":%zu}]", plain->n_ids - cl->n_ids);
        TCHECKF(cl->ctx_edits && !strcmp(cl->ctx_edits, want), "applied_edits %s, want %s",
                cl->ctx_edits ? cl->ctx_edits : "(none)", want);
        /* not enough to clear, or not triggered: the prompt as sent, nothing reported */
        TCHECK(least->n_ids == plain->n_ids && !strcmp(least->ctx_edits, "[]"));
        TCHECK(idle->n_ids == plain->n_ids && !strcmp(idle->ctx_edits, "[]"));
        /* the deferred tool: out of the declaration, loaded right after the result that references it */
        const char *decl = strstr(tp, "# Tools");
        const char *r2 = strstr(tp, "RESULT-2"), *nt = r2 ? strstr(r2, "## New Tools Available") : NULL;
        const char *r3 = strstr(tp, "RESULT-3");
        TCHECK(decl && strstr(decl, "\"name\":\"Read\"") && (!strstr(tp, "WebFetch") || strstr(tp, "WebFetch") > r2));
        TCHECKF(nt && r3 && nt < r3 && strstr(nt, "\"name\":\"WebFetch\""), "WebFetch not loaded after its reference");
        free(tp);
        free(tc);
    }
    if (plain) job_unref(plain);
    if (cl) job_unref(cl);
    if (least) job_unref(least);
    if (idle) job_unref(idle);
}

static job *body_job(const char *body)
{
    char msg[700] = "";
    job *j = messages_job(body, msg, sizeof msg);
    TCHECKF(j, "%s: %s", body, msg);
    return j;
}

static int same_ids(const job *a, const job *b)
{
    return a && b && a->n_ids == b->n_ids && !memcmp(a->ids, b->ids, a->n_ids * sizeof *a->ids);
}

/* The README's smaller rules: input_examples rendered, cache_control and
 * eager_input_streaming change no token, clear_at drops a system message a
 * later user message follows, a system message's per-turn effort wins. */
static void test_tool_and_system_fields(void)
{
    job *plain = body_job("{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
                          "[{\"type\":\"text\",\"text\":\"x\"}]}],\"tools\":[{\"name\":\"a\",\"input_schema\":"
                          "{\"type\":\"object\"}}]}");
    job *cached = body_job("{\"model\":\"k\",\"max_tokens\":4,\"cache_control\":{\"type\":\"ephemeral\"},"
                           "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\","
                           "\"cache_control\":{\"type\":\"ephemeral\"}}]}],\"tools\":[{\"name\":\"a\","
                           "\"cache_control\":{\"type\":\"ephemeral\"},\"eager_input_streaming\":true,"
                           "\"input_schema\":{\"type\":\"object\"}}]}");
    job *ex = body_job("{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                       "\"tools\":[{\"name\":\"a\",\"input_examples\":[{\"q\":\"EXAMPLE-INPUT\"}],"
                       "\"input_schema\":{\"type\":\"object\"}}]}");
    TCHECKF(same_ids(plain, cached), "cache_control / eager_input_streaming changed the prompt");
    char *t = ex ? prompt_text(ex) : NULL;
    TCHECK(t && strstr(t, "\"input_examples\":[{\"q\":\"EXAMPLE-INPUT\"}]"));
    free(t);
    job *ca = body_job("{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                       "{\"role\":\"system\",\"content\":\"GONE-NOTE\",\"clear_at\":\"next_user_message\"},"
                       "{\"role\":\"system\",\"content\":\"KEPT-NOTE\"},{\"role\":\"user\",\"content\":\"b\"},"
                       "{\"role\":\"system\",\"content\":\"LAST-NOTE\",\"clear_at\":\"next_user_message\"}]}");
    t = ca ? prompt_text(ca) : NULL;
    TCHECK(t && !strstr(t, "GONE-NOTE") && strstr(t, "KEPT-NOTE") && strstr(t, "LAST-NOTE"));
    free(t);
    job *eff = body_job("{\"model\":\"k\",\"max_tokens\":4,\"thinking\":{\"type\":\"adaptive\"},\"output_config\":"
                        "{\"effort\":\"low\"},\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
                        "\"system\",\"content\":\"n\",\"output_config\":{\"effort\":\"max\"}}]}");
    t = eff ? prompt_text(eff) : NULL;
    TCHECK(t && strstr(t, "thinking_effort=max`") && !strstr(t, "thinking_effort=low`"));
    free(t);
    job *jobs[] = {plain, cached, ex, ca, eff};
    for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++)
        if (jobs[i]) job_unref(jobs[i]);
}

static void test_refused_by_name(void)
{
    static const struct {
        const char *body, *param, *msg;
    } cases[] = {
        /* structured output is enforced: what the grammar cannot guarantee is named with its place */
        {"{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"output_config\":{"
         "\"format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"object\",\"not\":{}}}}}", "output_config",
         "\"not\" is not supported by the grammar engine (at output_config.format.schema/not)"},
        {"{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":"
         "\"a\",\"strict\":true,\"input_schema\":{\"type\":\"object\",\"properties\":{\"l\":{\"type\":\"array\","
         "\"uniqueItems\":true}}}}]}", "tools", "\"uniqueItems\""},
        {"{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":"
         "\"a\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"b\"}}", "tool_choice",
         "\"b\", which is not among the tools"},
        {"{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":"
         "\"adaptive\"},\"context_management\":{\"edits\":[{\"type\":\"compact_20260112\"}]}}", "context_management",
         "compact"},
        {"{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"context_management\":"
         "{\"edits\":[{\"type\":\"clear_thinking_20251015\"}]}}", "context_management", "thinking enabled"},
        {"{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":"
         "\"a\",\"input_schema\":{\"type\":\"object\"},\"allowed_callers\":[]}]}", "allowed_callers", "allowed_callers"},
        {"{\"model\":\"k\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"x\",\"content\":[{\"type\":\"tool_reference\",\"tool_name\":\"nope\"}]}]}]}", "messages[0]",
         "tool_reference_unresolved"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rq_err e = {0};
        job *j = request_job(&S, API_MESSAGES, cases[i].body, strlen(cases[i].body), &e);
        TCHECKF(!j && e.status == 400 && !strcmp(e.param, cases[i].param) && strstr(e.msg, cases[i].msg),
                "case %zu: %d param '%s': %s", i, e.status, e.param, e.msg);
        if (j) job_unref(j);
    }
    /* every effort Anthropic's SDK allows maps onto K3's three */
    static const char *const eff[][2] = {{"low", "low"}, {"medium", "high"}, {"high", "high"}, {"xhigh", "max"},
                                         {"max", "max"}};
    for (size_t i = 0; i < sizeof eff / sizeof eff[0]; i++) {
        char body[400], want[64];
        snprintf(body, sizeof body, "{\"model\":\"k\",\"max_tokens\":4,\"thinking\":{\"type\":\"adaptive\"},"
                 "\"output_config\":{\"effort\":\"%s\"},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", eff[i][0]);
        snprintf(want, sizeof want, "thinking_effort=%s`", eff[i][1]);
        job *j = messages_job(body, NULL, 0);
        char *t = j ? prompt_text(j) : NULL;
        TCHECKF(t && strstr(t, want), "effort %s: no %s", eff[i][0], want);
        free(t);
        if (j) job_unref(j);
    }
}

int main(int argc, char **argv)
{
    df_error err = {0};
    const char *model = getenv("DF_AGENT_MODEL") ? getenv("DF_AGENT_MODEL") : "models/k3-mini";
    if (tokenizer_load(model, &S.tok, &err)) {
        fprintf(stderr, "test_agent_requests: %s\n", err.msg);
        return 1;
    }
    S.name = "k3-mini";
    S.n_ctx = 65536;
    S.max_tokens_cap = 0;
    server_set_caps(&S);
    static const test_case tests[] = {
        {"recorded_accepted", test_recorded_accepted},
        {"recorded_chat_accepted", test_recorded_chat_accepted},
        {"codex_turns_share_prefix", test_codex_turns_share_prefix},
        {"billing_line", test_billing_line},
        {"trailing_system_turn", test_trailing_system_turn},
        {"sessions_share_prefix", test_sessions_share_prefix},
        {"thinking_kept_and_cleared", test_thinking_kept_and_cleared},
        {"clear_tool_uses", test_clear_tool_uses},
        {"tool_and_system_fields", test_tool_and_system_fields},
        {"refused_by_name", test_refused_by_name},
    };
    int rc = test_main(tests, NTESTS(tests), argc, argv);
    tokenizer_free(S.tok);
    return rc;
}
