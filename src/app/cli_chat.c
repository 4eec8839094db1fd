/* cli_chat.c - text in, text out for the command line: `run --prompt`
 * (raw continuation), `run --chat` (one templated turn), the `chat` REPL,
 * `tokenize` and `perplexity`.
 *
 * Owns: turning text into ids (tokenizer, chat template), streaming the
 * generated text (incremental UTF-8 decoding; reasoning and answer kept
 * apart by the chat output parser), the REPL's conversation state (the
 * session keeps every turn: a new turn encodes only the new user message and
 * the generation prompt, never the history again), Ctrl-C handling (stop
 * the reply, close the assistant message in the session so the
 * conversation stays well-formed) and the --stats status line (kept on the
 * terminal's last row while text scrolls above it; plain lines when piped).
 */
#define _GNU_SOURCE
#include "chat_template.h"
#include "cli.h"
#include "document.h"
#include "spec_state.h"
#include "grammar.h"
#include "json_schema.h"
#include "json.h"
#include "json_write.h"
#include "lineedit.h"
#include "tokenizer.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

typedef struct {
    df_engine *eng;
    df_session *s;
    tokenizer *tok;
    df_model_info info;
    chat_parser *parser;
    const run_args *a;
    float *logits;
    int32_t *ids;
    size_t n_ids, cap_ids;
    char *dbuf;
    size_t dcap;
    int n_turns;
    json_buf docs;            /* documents (--attach, chat's /attach) for the next user message */
    /* statistics of the last reply */
    int gen_tokens, prompt_tokens;
    double t_start, t_first, t_end;
    /* status line */
    int status_tty, rows;
    int out_tty;
    /* run --prompt: --dump-logits, --print-ids, --bench-json */
    logits_sink sink;
    int32_t *gen_ids;         /* [max_new + 1] the last reply's ids */
    sampler smp;              /* greedy unless --temp */
    gen_loop gl;              /* the generation loop (generate.h), drafts when --draft */
    df_drafter *dr;
    int gl_open;
    /* run --json-schema: the schema (as chat's response_format) and its grammar */
    json_doc *rf_doc;
    gr_grammar *gram;
    gr_vocab *gvocab;
    gr_matcher *gm;
} gen_ctx;

static int load_tokenizer(const char *dir, tokenizer **tok)
{
    df_error err = {0};
    if (tokenizer_load(dir, tok, &err)) {
        fprintf(stderr, "deltafin: cannot load the tokenizer: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void status_begin(gen_ctx *g)
{
    g->status_tty = g->a->stats && isatty(2) && isatty(1);
    if (!g->status_tty) return;
    struct winsize ws;
    g->rows = ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 2 ? ws.ws_row : 24;
    /* text scrolls in rows 1..rows-1; the status owns the last row */
    fprintf(stderr, "\n\033[1;%dr\033[%d;1H", g->rows - 1, g->rows - 1);
    fflush(stderr);
}

static void status_text(const gen_ctx *g, char *buf, size_t n)
{
    double t = now_sec();
    double dec = g->t_first > 0 && g->gen_tokens > 1 ? (g->gen_tokens - 1) / (t - g->t_first) : 0.0;
    df_stats st;
    df_engine_stats(g->eng, &st);
    uint64_t uses = st.expert_hits + st.expert_misses;
    snprintf(buf, n, "%d tokens, %.2f tok/s, first token %.2f s, context %d/%d, expert hits %.0f%%", g->gen_tokens,
             dec, g->t_first > 0 ? g->t_first - g->t_start : t - g->t_start, df_session_pos(g->s), df_session_n_ctx(g->s),
             uses ? 100.0 * st.expert_hits / uses : 0.0);
}

static void status_update(gen_ctx *g, int final)
{
    if (!g->a->stats) return;
    char line[256];
    status_text(g, line, sizeof line);
    if (g->status_tty) {
        fprintf(stderr, "\0337\033[%d;1H\033[2K\033[7m %s \033[0m\0338", g->rows, line);
        if (final) fprintf(stderr, "\0337\033[r\0338");
        fflush(stderr);
    } else if (final) {
        fprintf(stderr, "deltafin: %s\n", line);
    }
}

static int feed(gen_ctx *g, const int32_t *ids, size_t n)
{
    df_error err = {0};
    if (gen_feed(&g->gl, ids, n, &err)) {
        fprintf(stderr, "\ndeltafin: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Print parser events: reasoning dim (terminal) or on stderr (run --chat). */
static void show_events(gen_ctx *g, const chat_event *ev, size_t n, int repl)
{
    for (size_t i = 0; i < n; i++) {
        const chat_event *e = &ev[i];
        switch (e->type) {
        case CHAT_EV_REASONING:
            if (repl && g->out_tty) printf("\033[2m%.*s\033[0m", (int)e->len, e->text);
            else if (repl) printf("%.*s", (int)e->len, e->text);
            else fprintf(stderr, "%.*s", (int)e->len, e->text);
            break;
        case CHAT_EV_CONTENT: printf("%.*s", (int)e->len, e->text); break;
        case CHAT_EV_CALL_END: printf("\n[tool call %.*s(%.*s)]\n", (int)e->name_len, e->name, (int)e->len, e->text); break;
        default: break;
        }
    }
    fflush(stdout);
    fflush(stderr);
}

/* Generate until eos, max_new, a full context or Ctrl-C.  chat: through the
 * output parser, and the assistant message is closed in the session when
 * the reply stops early.  Returns 0, or -1 on an engine error. */
static int generate(gen_ctx *g, int chat, int repl)
{
    tok_decoder dec;
    tok_decoder_init(&dec, g->tok);
    g->gen_tokens = 0;
    g->t_first = 0;
    int ended = 0, rc = 0;
    df_error err = {0};
    size_t n0;
    gen_history(&g->gl, &n0);
    int n_ctx = df_session_n_ctx(g->s);
    while (!interrupted && g->gen_tokens < g->a->max_new) {
        int32_t next;
        if (gen_next(&g->gl, &next, &err)) {
            fprintf(stderr, "\ndeltafin: %s\n", err.msg);
            return -1;
        }
        /* the logits after the previous token: the row this one came from */
        if (g->gen_tokens && sink_write(&g->sink, gen_logits(&g->gl), 1)) return -1;
        if (!g->gen_tokens) g->t_first = now_sec();
        g->gen_tokens++;
        if (chat) {
            const chat_event *ev;
            size_t n = chat_parser_feed(g->parser, next, &ev);
            show_events(g, ev, n, repl);
        } else if (next != g->info.eos_id) {
            size_t n = tok_decoder_feed(&dec, next, g->dbuf, g->dcap);
            fwrite(g->dbuf, 1, n, stdout);
            fflush(stdout);
        }
        g->gen_ids[g->gen_tokens - 1] = next;
        status_update(g, 0);
        if (next == g->info.eos_id) {
            ended = 1;
            break;
        }
        if (n0 + (size_t)g->gen_tokens >= (size_t)n_ctx) break; /* the context is full */
    }
    /* the session holds the reply, its last token evaluated */
    if (g->gen_tokens && (gen_settle(&g->gl, 1, &err) || sink_write(&g->sink, gen_logits(&g->gl), 1))) {
        fprintf(stderr, "\ndeltafin: %s\n", err.msg[0] ? err.msg : "writing the --dump-logits file failed");
        return -1;
    }
    if (!chat) {
        size_t n = tok_decoder_flush(&dec, g->dbuf, g->dcap);
        fwrite(g->dbuf, 1, n, stdout);
    }
    if (chat && !ended) {
        const chat_event *ev;
        size_t n = chat_parser_finish(g->parser, &ev);
        show_events(g, ev, n, repl);
        /* close the assistant message in the session */
        const char *close = chat_parser_closing(g->parser);
        if (*close) {
            g->n_ids = 0;
            if (tokenizer_encode(g->tok, close, strlen(close), 1, &g->ids, &g->n_ids, &g->cap_ids, &err) ||
                feed(g, g->ids, g->n_ids))
                rc = -1;
        }
    }
    if (interrupted) printf("%s[interrupted]", g->out_tty ? "\033[0m" : "");
    g->t_end = now_sec();
    printf("\n");
    fflush(stdout);
    status_update(g, 1);
    if (!rc) spec_state_save(g->a, &g->gl);
    return rc;
}

static int setup_tokenizer(gen_ctx *g, run_args *a)
{
    memset(g, 0, sizeof *g);
    g->a = a;
    g->out_tty = isatty(1);
    json_buf_init(&g->docs);
    if (a->attach_text) json_buf_puts(&g->docs, a->attach_text);
    return load_tokenizer(a->model, &g->tok);
}

/* The engine, planned for a->ctx_plan (context_for) or --ctx. */
static int setup_engine(gen_ctx *g, run_args *a)
{
    g->eng = open_engine(a);
    df_engine_info(g->eng, &g->info);
    if (tokenizer_n_vocab(g->tok) != g->info.vocab) {
        fprintf(stderr, "deltafin: the tokenizer has %d ids but the model's vocabulary is %d\n",
                tokenizer_n_vocab(g->tok), g->info.vocab);
        return -1;
    }
    g->s = open_session(g->eng, a);
    g->logits = malloc((size_t)g->info.vocab * sizeof(float));
    g->dcap = tok_decoder_max_out(g->tok) + 16;
    g->dbuf = malloc(g->dcap);
    g->gen_ids = malloc(((size_t)a->max_new + 1) * sizeof *g->gen_ids);
    sampler_from_args(&g->smp, a, g->info.vocab);
    g->dr = open_drafter(a, g->info.vocab, df_session_n_ctx(g->s));
    gen_from_args(&g->gl, a, g->eng, g->s, &g->smp, g->dr);
    g->gl_open = 1;
    if (!g->logits || !g->dbuf || !g->gen_ids) {
        fprintf(stderr, "deltafin: out of memory\n");
        return -1;
    }
    return 0;
}

static void teardown(gen_ctx *g)
{
    json_buf_free(&g->docs);
    gr_matcher_free(g->gm);
    gr_grammar_free(g->gram);
    gr_vocab_free(g->gvocab);
    json_free(g->rf_doc);
    chat_parser_free(g->parser);
    sink_abort(&g->sink);
    if (g->gl_open) gen_free(&g->gl);
    df_drafter_free(g->dr);
    if (g->smp.work) sampler_free(&g->smp);
    free(g->gen_ids);
    df_session_free(g->s);
    df_engine_close(g->eng);
    tokenizer_free(g->tok);
    free(g->logits);
    free(g->ids);
    free(g->dbuf);
}

/* Encode one chat turn: [system] user message + generation prompt; the
 * effort message only at the start of a conversation. */
static int encode_turn(gen_ctx *g, const char *user)
{
    json_buf j;
    json_buf_init(&j);
    json_buf_puts(&j, "[");
    if (!g->n_turns && g->a->system) {
        json_buf_puts(&j, "{\"role\":\"system\",\"content\":");
        json_write_string(&j, g->a->system, strlen(g->a->system));
        json_buf_puts(&j, "},");
    }
    json_buf_puts(&j, "{\"role\":\"user\",\"content\":");
    if (g->docs.len) {
        /* the documents first, as the server renders a user message [document, text] */
        json_buf_puts(&g->docs, user);
        json_write_string(&j, g->docs.p, g->docs.len);
        g->docs.len = 0;
    } else {
        json_write_string(&j, user, strlen(user));
    }
    json_buf_puts(&j, "}]");
    df_error err = {0};
    json_doc *d = json_parse(j.p, j.len, &err);
    json_buf_free(&j);
    if (!d) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return -1;
    }
    chat_options o;
    chat_options_init(&o);
    o.thinking = !g->a->no_think;
    o.thinking_effort = g->n_turns ? NULL : (g->a->effort ? g->a->effort : "max");
    o.response_format = g->rf_doc ? json_root(g->rf_doc) : NULL;
    chat_segments *seg;
    int rc = chat_render(json_root(d), &o, &seg, &err);
    json_free(d);
    if (rc) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return -1;
    }
    g->n_ids = 0;
    rc = chat_encode(g->tok, seg, &g->ids, &g->n_ids, &g->cap_ids, &err);
    chat_segments_free(seg);
    if (rc) fprintf(stderr, "deltafin: %s\n", err.msg);
    return rc;
}

static int start_reply(gen_ctx *g)
{
    df_error err = {0};
    if (!g->parser && chat_parser_new(g->tok, !g->a->no_think, &g->parser, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return -1;
    }
    chat_parser_reset(g->parser, !g->a->no_think);
    if (df_session_pos(g->s) + (int)g->n_ids >= df_session_n_ctx(g->s)) {
        fprintf(stderr, "deltafin: the conversation is full (%d of %d tokens); /reset to start over\n",
                df_session_pos(g->s), df_session_n_ctx(g->s));
        return 1;
    }
    g->t_start = now_sec();
    g->prompt_tokens = (int)g->n_ids;
    return feed(g, g->ids, g->n_ids);
}

static int mask_cb(void *ctx, float *logits, df_error *err)
{
    if (!gr_matcher_apply(ctx, logits)) return df_err_set(err, DF_ERR_ARG, -1, "the schema allows no further token");
    return 0;
}

static int accept_cb(void *ctx, int32_t id, df_error *err)
{
    if (gr_matcher_accept(ctx, id)) return df_err_set(err, DF_ERR_ARG, -1, "token %d does not fit the schema", (int)id);
    return 0;
}

/* --json-schema FILE: the prompt asks for it (a response-format system
 * message) and the grammar holds the reply to it */
static int load_schema(gen_ctx *g, const char *path)
{
    size_t n = 0;
    char *text = read_prompt_file(path, "--json-schema", &n);
    df_error err = {0};
    json_doc *d = json_parse(text, n, &err);
    free(text);
    if (!d) {
        fprintf(stderr, "deltafin: --json-schema %s: not JSON: %s (byte %lld)\n", path, err.msg, (long long)err.pos);
        return -1;
    }
    json_buf j;
    json_buf_init(&j);
    json_buf_puts(&j, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"output\",\"strict\":true,\"schema\":");
    json_write_value(&j, json_root(d), 0);
    json_buf_puts(&j, "}}");
    json_free(d);
    g->rf_doc = json_parse(j.p, j.len, &err);
    json_buf_free(&j);
    if (!g->rf_doc) {
        fprintf(stderr, "deltafin: --json-schema %s: %s\n", path, err.msg);
        return -1;
    }
    gr_reply_spec sp = {0};
    sp.kind = GR_REPLY_JSON;
    sp.thinking = !g->a->no_think;
    sp.schema = sp.schema_root = json_get(json_get(json_root(g->rf_doc), "json_schema"), "schema");
    sp.path = "#";
    if (gr_reply_grammar(&sp, &g->gram, &err)) {
        fprintf(stderr, "deltafin: --json-schema %s: %s\n", path, err.msg);
        return -1;
    }
    return 0;
}

int run_text(run_args *a)
{
    gen_ctx g;
    int rc = 1;
    if (setup_tokenizer(&g, a)) goto done;
    if (a->json_schema && load_schema(&g, a->json_schema)) goto done;
    if (a->chat) {
        if (encode_turn(&g, a->prompt)) goto done;
    } else {
        df_error err = {0};
        const char *text = a->prompt;
        json_buf with_docs;
        json_buf_init(&with_docs);
        if (a->attach_text) {
            json_buf_puts(&with_docs, a->attach_text);
            json_buf_puts(&with_docs, a->prompt);
            json_buf_putc(&with_docs, 0);
            text = with_docs.p;
        }
        int erc = tokenizer_encode(g.tok, text, strlen(text), 0, &g.ids, &g.n_ids, &g.cap_ids, &err);
        json_buf_free(&with_docs);
        if (erc) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            goto done;
        }
        if (!g.n_ids) die("--prompt is empty");
    }
    context_for(a, (int)g.n_ids);
    if (setup_engine(&g, a)) goto done;
    size_t V = (size_t)g.info.vocab;
    int batch = df_session_max_batch(g.s);
    float *rows = NULL;
    if (a->dump) {
        rows = malloc((size_t)batch * V * sizeof *rows);
        if (!rows || sink_open(&g.sink, a->dump, V)) goto done;
    }
    signal(SIGINT, on_sigint);
    interrupted = 0;
    status_begin(&g);
    unsigned long long rb0 = proc_read_bytes();
    g.t_start = now_sec();
    df_error err = {0};
    if (a->chat && !g.parser && chat_parser_new(g.tok, !a->no_think, &g.parser, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        free(rows);
        goto done;
    }
    g.prompt_tokens = (int)g.n_ids;
    int held = a->session ? session_resume(&g.gl, g.s, a->session, g.ids, (int)g.n_ids) : 0;
    if (held < 0 ||
        (held ? gen_feed(&g.gl, g.ids + held, g.n_ids - (size_t)held, &err)
              : eval_prompt(g.s, g.ids, (int)g.n_ids, batch, g.logits, rows, V, &g.sink, &err))) {
        if (held >= 0) fprintf(stderr, "\ndeltafin: %s\n", err.msg);
        free(rows);
        goto done;
    }
    free(rows);
    if (!held) gen_prime(&g.gl, g.ids, g.n_ids, g.logits);
    if (g.gram) {
        g.gvocab = gr_vocab_from_tokenizer(g.tok);
        g.gm = gr_matcher_new(g.gram, g.gvocab);
        gr_matcher_warm(g.gm); /* the token loop allocates nothing */
        gen_constraint c = {mask_cb, accept_cb, g.gm};
        gen_constrain(&g.gl, &c);
    }
    double t1 = now_sec();
    unsigned long long rb1 = proc_read_bytes();
    rc = generate(&g, a->chat, 0) ? 1 : 0;
    double t2 = now_sec();
    unsigned long long rb2 = proc_read_bytes();
    if (!rc && a->print_ids) {
        for (int i = 0; i < g.gen_tokens; i++) printf("%s%d", i ? "," : "", g.gen_ids[i]);
        printf("\n");
        fflush(stdout);
    }
    if (!rc && a->bench_json)
        print_bench_json(g.eng, g.prompt_tokens, t1 - g.t_start, rb1 - rb0, g.gen_tokens, t2 - t1, rb2 - rb1, g.gen_ids,
                         &g.gl.st);
    if (!rc && sink_commit(&g.sink)) rc = 1;
    if (!rc && a->session && session_store(&g.gl, g.s, a->session)) rc = 1;
    if (!rc && a->stats) print_run_stats(g.eng, g.prompt_tokens, t1 - g.t_start, g.gen_tokens, t2 - t1);
    if (!rc && a->stats && g.dr) print_draft_stats(&g.gl.st), print_xtok_stats(g.dr);
done:
    teardown(&g);
    return rc;
}

static void print_stats(gen_ctx *g)
{
    df_stats st;
    df_engine_stats(g->eng, &st);
    double dt = g->t_end - g->t_first;
    uint64_t uses = st.expert_hits + st.expert_misses;
    printf("context: %d of %d tokens\n", df_session_pos(g->s), df_session_n_ctx(g->s));
    printf("last reply: %d tokens, %.2f tok/s, first token after %.2f s (prompt %d tokens)\n", g->gen_tokens,
           g->gen_tokens > 1 && dt > 0 ? (g->gen_tokens - 1) / dt : 0.0, g->t_first - g->t_start, g->prompt_tokens);
    printf("experts: %.1f%% hits, %.1f MiB read, %.2f s waiting for I/O\n", uses ? 100.0 * st.expert_hits / uses : 0.0,
           st.expert_bytes_read / 1048576.0, st.io_wait_sec);
    if (g->dr) {
        const gen_stats *d = &g->gl.st;
        printf("drafts (%s): %llu proposed, %llu accepted; %.2f tokens per pass\n", g->dr->name,
               (unsigned long long)d->proposed, (unsigned long long)d->accepted,
               d->passes ? (double)d->emitted / (double)d->passes : 0.0);
    }
}

/* /attach FILE: a document (text, Markdown, PDF) for the next message */
static void attach_command(gen_ctx *g, const char *path)
{
    while (*path == ' ') path++;
    df_error err = {0};
    size_t before = g->docs.len;
    doc_limits lim = {0};
    if (doc_render_file(&lim, path, &g->docs, &err)) {
        g->docs.len = before;
        printf("(%s)\n", err.msg);
        return;
    }
    printf("(attached %s: %zu bytes of text, sent with your next message)\n", path, g->docs.len - before);
}

int cmd_chat(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (!a.max_new_set) a.max_new = 4096;
    gen_ctx g;
    int rc = 1;
    if (setup_tokenizer(&g, &a) || setup_engine(&g, &a)) goto done;
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL); /* no SA_RESTART: a blocked read returns */
    if (a.session) {
        int held = session_resume(&g.gl, g.s, a.session, NULL, 0);
        if (held < 0) goto done;
        g.n_turns = held > 0; /* a resumed conversation has had its system message */
    }
    lineedit le;
    lineedit_init(&le);
    if (g.out_tty)
        printf("deltafin chat: %d layers, %d experts; /attach FILE, /reset, /stats, /quit; Ctrl-C stops a reply\n",
               g.info.n_layers, g.info.n_experts);
    status_begin(&g);
    for (;;) {
        int cancelled;
        char *line = lineedit_read(&le, "> ", &cancelled);
        if (!line) break;
        if (cancelled || !*line) {
            free(line);
            continue;
        }
        lineedit_history_add(&le, line);
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) {
            free(line);
            break;
        } else if (!strcmp(line, "/reset")) {
            gen_reset(&g.gl);
            g.n_turns = 0;
            printf("(conversation reset)\n");
        } else if (!strcmp(line, "/stats")) {
            print_stats(&g);
        } else if (!strncmp(line, "/attach ", 8)) {
            attach_command(&g, line + 8);
        } else if (line[0] == '/') {
            printf("unknown command %s (try /attach FILE, /reset, /stats, /quit)\n", line);
        } else {
            interrupted = 0; /* a Ctrl-C from here on stops this reply, even during the prompt */
            int r = encode_turn(&g, line);
            if (!r) r = start_reply(&g);
            if (r < 0) {
                free(line);
                break;
            }
            if (r == 0) {
                if (generate(&g, 1, 1)) {
                    free(line);
                    break;
                }
                g.n_turns++;
                if (a.session && session_store(&g.gl, g.s, a.session)) {
                    free(line);
                    break;
                }
            }
        }
        fflush(stdout);
        free(line);
    }
    lineedit_free(&le);
    rc = a.session && session_store(&g.gl, g.s, a.session) ? 1 : 0;
done:
    teardown(&g);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    tokenizer *tok;
    if (load_tokenizer(a.model, &tok)) return 1;
    df_error err = {0};
    int rc = 0;
    if (a.decode) {
        int32_t *ids;
        int n = parse_ids(a.decode, "--decode", &ids);
        char *text;
        size_t len;
        if (tokenizer_decode(tok, ids, (size_t)n, &text, &len, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            rc = 1;
        } else {
            fwrite(text, 1, len, stdout);
            printf("\n");
            free(text);
        }
        free(ids);
    } else {
        if (!a.text) die("tokenize needs a text argument (or --decode LIST)");
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        if (tokenizer_encode(tok, a.text, strlen(a.text), a.special, &ids, &n, &cap, &err)) {
            fprintf(stderr, "deltafin: %s\n", err.msg);
            rc = 1;
        } else {
            for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
            printf("\n");
        }
        free(ids);
    }
    tokenizer_free(tok);
    return rc;
}

/* perplexity: a text file's perplexity and bits per byte, as llama.cpp's
 * llama-perplexity reports them and tools/train/reference.py computes them:
 * the file is encoded as raw text (no specials, no BOS) and cut into
 * consecutive non-overlapping windows of --window ids; each window starts
 * from an empty state; every id of a window but its first is scored by the
 * natural-log softmax of the logits after the ids before it (in double);
 * a last partial window with >= 2 ids counts.  bits per byte divides by the
 * UTF-8 bytes of the scored tokens (bits_per_file_byte: by the file's). */
static double row_nll(const float *logits, int V, int32_t next)
{
    double mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx - (double)logits[next];
}

/* perplexity's running sums, fed one prompt chunk's rows at a time: row
 * t of a window scores the window's id t + 1 (the last row scores none);
 * with --save-logits each scored row also goes to the base file, with
 * --kl-divergence each is compared with the base's (cli_kld.c) */
typedef struct ppl_acc {
    const tokenizer *tok;
    size_t V;
    const int32_t *ids; /* the window's ids */
    size_t m, t;        /* its length; the next row's position in it */
    double nll;
    uint64_t scored, bytes;
    kld_writer *save;
    kld_reader *base;
    double *kls, base_nll;
    uint64_t same_top;
} ppl_acc;

static int ppl_rows(void *ctx, const float *rows, int n_rows)
{
    ppl_acc *a = ctx;
    for (int r = 0; r < n_rows; r++, a->t++) {
        if (a->t + 1 >= a->m) continue;
        int32_t next = a->ids[a->t + 1];
        const float *row = rows + (size_t)r * a->V;
        a->nll += row_nll(row, (int)a->V, next);
        if (a->save && kld_writer_row(a->save, row)) return -1;
        if (a->base) {
            double kl, bn;
            int same;
            if (kld_reader_row(a->base, row, next, &kl, &bn, &same)) return -1;
            a->kls[a->scored] = kl;
            a->base_nll += bn;
            a->same_top += (uint64_t)same;
        }
        size_t bl = 0;
        tokenizer_token_bytes(a->tok, next, &bl);
        a->bytes += bl;
        a->scored++;
    }
    return 0;
}

static char *read_text_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) die("--file %s: %s", path, strerror(errno));
    size_t cap = 1 << 16;
    char *text = malloc(cap);
    *len = 0;
    for (size_t k; text && (k = fread(text + *len, 1, cap - *len, f)) > 0;) {
        *len += k;
        if (*len == cap) text = realloc(text, cap *= 2);
    }
    fclose(f);
    if (!text) die("out of memory reading %s", path);
    return text;
}

/* Every window of ids through the session, its rows into acc; 0 or -1 (printed). */
static int ppl_windows(df_session *s, const int32_t *ids, size_t n, int W, float *logits, ppl_acc *acc)
{
    df_error err = {0};
    double t0 = now_sec();
    size_t n_windows = (n + (size_t)W - 1) / (size_t)W;
    int tty = isatty(2);
    for (size_t w = 0; w < n_windows; w++) {
        size_t start = w * (size_t)W, m = n - start < (size_t)W ? n - start : (size_t)W;
        if (m < 2) break;
        df_session_reset(s);
        acc->ids = ids + start;
        acc->m = m;
        acc->t = 0;
        if (df_session_eval_each(s, ids + start, (int)m, logits, ppl_rows, acc, &err)) {
            if (tty) fprintf(stderr, "\r\033[K");
            if (acc->base && err.code == DF_ERR_IO)
                fprintf(stderr, "deltafin: --kl-divergence: the base file ends before the text does\n");
            else
                fprintf(stderr, "deltafin: %s\n", err.msg);
            return -1;
        }
        double dt = now_sec() - t0;
        if (tty)
            fprintf(stderr, "\rdeltafin: window %zu/%zu, perplexity so far %.4f, %.0f s left   ", w + 1, n_windows,
                    exp(acc->nll / (double)acc->scored), dt / (double)(w + 1) * (double)(n_windows - w - 1));
    }
    if (tty) fprintf(stderr, "\r\033[K");
    return 0;
}

/* the base model's run of --kl-divergence: its own line goes to stderr */
static int ppl_base_run;

/* Is path a --save-logits file (rather than a model)? */
static int is_kld_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char m[8] = {0};
    int yes = f && fread(m, 8, 1, f) == 1 && !memcmp(m, "DFKLD001", 8);
    if (f) fclose(f);
    return yes;
}

int cmd_perplexity(int argc, char **argv)
{
    run_args a;
    parse_common(argc, argv, &a);
    if (!a.file) die("perplexity needs --file TEXT");
    if (a.kld_base && a.save_logits) die("--kl-divergence and --save-logits: give one");
    char tmp_base[4096] = "";
    if (a.kld_base && !is_kld_file(a.kld_base)) {
        /* a base model: its run first, into a temporary base file (the two
         * engines never hold memory at the same time) */
        const char *td = getenv("TMPDIR");
        snprintf(tmp_base, sizeof tmp_base, "%s/deltafin-kld-XXXXXX", td && *td ? td : "/tmp");
        int fd = mkstemp(tmp_base);
        if (fd < 0) die("--kl-divergence: cannot create a temporary file: %s", strerror(errno));
        close(fd);
        char *bargv[64], *base_model = xstrdup(a.kld_base);
        int bn = 0;
        for (int i = 0; i < argc && bn < 60; i++) {
            if (!strcmp(argv[i], "--kl-divergence") || !strcmp(argv[i], "--json")) {
                i += !strcmp(argv[i], "--kl-divergence");
                continue;
            }
            bargv[bn++] = argv[i];
            if (!strcmp(argv[i], "--model") && i + 1 < argc) bargv[bn++] = base_model, i++;
        }
        static char save_flag[] = "--save-logits";
        bargv[bn++] = save_flag;
        bargv[bn++] = tmp_base;
        bargv[bn] = NULL;
        fprintf(stderr, "deltafin: --kl-divergence: the base model %s first\n", a.kld_base);
        ppl_base_run = 1;
        int brc = cmd_perplexity(bn, bargv);
        ppl_base_run = 0;
        free(base_model);
        if (brc) {
            unlink(tmp_base);
            return 1;
        }
        a.kld_base = tmp_base;
    }
    int W = a.window ? a.window : 256;
    size_t len = 0;
    char *text = read_text_file(a.file, &len);
    tokenizer *tok;
    if (load_tokenizer(a.model, &tok)) return 1;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    df_error err = {0};
    if (tokenizer_encode(tok, text, len, 0, &ids, &n, &cap, &err)) {
        fprintf(stderr, "deltafin: %s: %s\n", a.file, err.msg);
        return 1;
    }
    if (n < 2) die("--file %s: fewer than 2 tokens", a.file);
    a.ctx = W;
    df_engine *eng = open_engine(&a);
    df_model_info info;
    df_engine_info(eng, &info);
    if (tokenizer_n_vocab(tok) != info.vocab)
        die("the tokenizer has %d ids but the model's vocabulary is %d", tokenizer_n_vocab(tok), info.vocab);
    df_session *s = open_session(eng, &a);
    size_t V = (size_t)info.vocab;
    /* one prompt chunk's rows at a time (df_session_eval_each), each row's
     * loss taken as it arrives: a window costs a chunk's logits, not its
     * own (16,384 x 4,096 floats used to be 256 MiB outside the plan) */
    int B = df_session_max_batch(s);
    float *logits = malloc((size_t)B * V * sizeof *logits);
    if (!logits) die("cannot allocate the logits of a prompt chunk of %d", B);
    ppl_acc acc = {.tok = tok, .V = V};
    kld_writer kw;
    kld_reader kr;
    if (a.save_logits) {
        if (kld_writer_open(&kw, a.save_logits, (int)V, W, ids, n)) return 1;
        acc.save = &kw;
    }
    if (a.kld_base) {
        char why[600];
        if (kld_reader_open(&kr, a.kld_base, (int)V, W, ids, n, why, sizeof why))
            die("--kl-divergence %s", why);
        acc.base = &kr;
        acc.kls = xmalloc(n * sizeof *acc.kls);
    }
    double t0 = now_sec();
    int rc = ppl_windows(s, ids, n, W, logits, &acc);
    if (acc.save && (kld_writer_close(&kw) || rc)) {
        if (!rc) fprintf(stderr, "deltafin: --save-logits %s: write failed\n", a.save_logits);
        unlink(a.save_logits);
        rc = -1;
    }
    if (rc) {
        if (tmp_base[0]) unlink(tmp_base);
        return 1;
    }
    double nll = acc.nll;
    uint64_t scored = acc.scored, bytes = acc.bytes;
    size_t n_windows = (n + (size_t)W - 1) / (size_t)W;
    double mean = nll / (double)scored, ppl = exp(mean);
    double bpb = nll / log(2.0) / (double)bytes, bpfb = nll / log(2.0) / (double)len;
    if (acc.base) {
        kld_report(a.file, acc.kls, (size_t)scored, acc.same_top, nll, acc.base_nll, a.json);
        kld_reader_close(&kr);
        free(acc.kls);
    } else if (a.json) {
        printf("{\"file\":\"%s\",\"window\":%d,\"windows\":%zu,\"scored_tokens\":%llu,\"scored_bytes\":%llu,"
               "\"nll_sum\":%.10g,\"mean_nll\":%.10g,\"perplexity\":%.10g,\"bits_per_byte\":%.10g,"
               "\"bits_per_file_byte\":%.10g,\"seconds\":%.3f,\"peak_rss_kb\":%ld}\n",
               a.file, W, n_windows, (unsigned long long)scored, (unsigned long long)bytes, nll, mean, ppl, bpb, bpfb,
               now_sec() - t0, proc_peak_rss_kb());
    } else {
        fprintf(ppl_base_run ? stderr : stdout,
               "%s%s: %llu tokens scored in %zu windows of %d: perplexity %.4f, mean NLL %.5f nats, %.4f bits per "
               "byte (%.4f per file byte), %.1f s\n", ppl_base_run ? "deltafin: base: " : "",
               a.file, (unsigned long long)scored, n_windows, W, ppl, mean, bpb, bpfb, now_sec() - t0);
    }
    if (tmp_base[0]) unlink(tmp_base);
    free(logits);
    free(ids);
    free(text);
    df_session_free(s);
    df_engine_close(eng);
    tokenizer_free(tok);
    return 0;
}
