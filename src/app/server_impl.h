/* server_impl.h - the server's private types and the functions its files
 * share (L5): server.c (HTTP, the worker, the command), server_request.c
 * (request fields, validation, the three APIs mapped onto chat_render's
 * messages), server_emit.c (API-shaped output, SSE, logprobs),
 * server_responses.c (the Responses API: its request, events and store).
 * server.c's opening comment documents the threads and the rules.
 */
#ifndef DF_SERVER_IMPL_H
#define DF_SERVER_IMPL_H

#include "server.h"
#include "document.h"
#include "chat_template.h"
#include "options.h"
#include "engine.h"
#include "json.h"
#include "json_write.h"
#include "draft.h"
#include "grammar.h"
#include "json_schema.h"
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

enum { API_CHAT, API_COMPLETIONS, API_MESSAGES, API_RESPONSES };
enum { CH_REASONING, CH_CONTENT };
enum { FIN_STOP, FIN_LENGTH, FIN_STOPSEQ, FIN_CANCEL, FIN_ERROR, FIN_TIMEOUT };
enum { BLK_NONE, BLK_THINK, BLK_TEXT, BLK_TOOL };
#define MAX_STOPS 16
#define MAX_TOP_LOGPROBS 20

typedef struct job job;
typedef struct resp_job resp_job;     /* server_responses.c: a Responses job's state */
typedef struct resp_store resp_store; /* server_responses.c: stored conversations */

/* A seat: one of --parallel N places a conversation is kept in (a session,
 * its generation loop's id history, generate.h, and whether that history
 * may be reused).  "Seat", not "slot": slots are the expert cache's (and a
 * session's checkpoints are "checkpoints"). */
typedef struct seat {
    df_session *s;
    gen_loop gl;
    int hist_ok;                /* the history is valid once last was delivered */
    job *last;                  /* the job that left it (a reference) */
    uint64_t used;              /* when it last ran a job (LRU among equals) */
    int ck_pos;                 /* the last conversation checkpoint taken (0 none) */
    uint64_t key;               /* the conversation key of the job that left it (0 none) */
    /* the route counts of the rows its last finished job evaluated (GET /v1/routes), a copy made
     * under the server's mu as the job ends: [layers][experts], the rows, the job's id */
    uint32_t *routes;
    uint64_t routes_rows;
    char routes_id[64];
} seat;

typedef struct srv {
    /* set at start, read-only afterwards */
    const char *host, *api_key, *name;
    int port, queue_max, max_tokens_cap, n_ctx, ping_ms;
    _Atomic size_t max_body;   /* written once the context is known, read by connection threads */
    int max_body_set;           /* --max-request-bytes given (else derived from the context) */
    size_t max_text;            /* prompt text bytes the context can hold: n_ctx x the longest token */
    doc_limits doc;             /* documents: --max-document-bytes, PDF text at most max_text */
    double timeout;             /* --timeout: a job's limit, prompt and reply (0: none) */
    int conn_timeout;           /* --conn-timeout: libmicrohttpd's idle connection limit */
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
    df_stats stats;             /* engine counters, snapshot by the worker after each job and, while
                                 * one runs, every --ping-ms/4 at most (live_refresh) */
    gen_stats gstats;           /* generation loop counters (drafts), likewise */
    double gen_seconds, last_tps;
    /* the job running (0 when none): its prompt's ids evaluated of the total,
     * the tokens of its reply so far and their rate; when /metrics was last refreshed */
    int run_prompt_done, run_prompt_total, run_gen;
    double run_tps, live_t;
    atomic_ulong job_counter;
    /* worker-only */
    struct seat *seats;         /* --parallel: the conversations kept */
    int n_seats;
    chat_parser *parser;
    sampler smp;                /* temperature / top_p / seed of the current job (sampler.c) */
    df_drafter *dr;             /* --draft, or NULL (shared by the seats) */
    const char *pcache_dir;     /* --prompt-cache DIR, or NULL (server_cache.c) */
    uint64_t pcache_max;        /* --prompt-cache-max bytes */
    int32_t *pc_ids;            /* [n_ctx] scratch: a cached file's ids */
    resp_store *rstore;         /* /v1/responses: the last responses' conversations (own lock) */
    int32_t end_of_msg;         /* <|end_of_msg|>: a checkpoint after the prompt's last one */
    int32_t turn_open[3][8];    /* the ids opening a user, assistant, tool message (first_turn) */
    size_t turn_len[3];
    int keep_billing;           /* --keep-billing-header: Claude Code's billing line stays in the prompt */
    char *dbuf;
    size_t dcap;
    gr_vocab *gvocab;           /* worker-only: the vocabulary for grammars, built on first use */
} srv;

struct job {
    srv *S;
    int api, stream, include_usage;
    int32_t *ids;
    size_t n_ids;
    int think;                  /* chat: the prompt ends inside the think channel */
    int think_omit;             /* messages: thinking.display "omitted" (generated, not returned) */
    char *ctx_edits;            /* messages: the applied_edits JSON array, when context_management was sent */
    int max_tokens;
    int ctx_bound;              /* max_tokens is what the context has left, less than asked */
    int count_only;             /* /v1/messages/count_tokens: rendered and counted, never run */
    size_t n_cleared;           /* prompt tokens context_management's edits removed */
    int n_copied;               /* prompt ids copied from another conversation's checkpoint */
    int prompt_cut;             /* the client left during the prompt: ids evaluated by then */
    char *stops[MAX_STOPS];
    int n_stops;
    size_t max_stop;
    double temperature, top_p;
    uint64_t seed;
    int logprobs, top_logprobs; /* logprobs: 1 = wanted; top: alternatives per token */
    char id[48];
    char *model;
    long created;
    double deadline;            /* now + --timeout, or 0: none */
    /* shared with the connection thread, guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    json_buf out;
    size_t sent;
    int status, done, refs;
    /* the prompt's evaluation so far (the progress pings): ids done of total, reused, started at */
    int prompt_done, prompt_total, prompt_reused;
    double prompt_t0;
    atomic_int cancelled, delivered;
    job *next;
    /* worker-only output state */
    json_buf acc[2], calls, lp[4];
    int n_calls, call_open, lp_n, blk, blk_idx, gate_ch, stopped, fin, n_gen, n_reused;
    const char *stop_hit;
    json_buf gate;
    size_t text_off;
    char errmsg[800];
    resp_job *rj;               /* API_RESPONSES: request echo, item state (server_responses.c) */
    /* constrained decoding (server_grammar.c) */
    int single_call;            /* parallel_tool_calls false / disable_parallel_tool_use: one call at most */
    uint64_t conv_key;          /* the client's conversation key (prompt_cache_key; Anthropic's
                                   metadata.user_id), hashed; 0: none (conv_key) */
    gr_grammar *grammar;        /* the reply's grammar, compiled with the request, or NULL */
    gr_matcher *matcher;        /* worker-only, while the job runs */
};

typedef struct rq_err {
    int status;
    const char *type;   /* OpenAI error type */
    const char *code;   /* OpenAI code or NULL */
    char param[96];
    char msg[600];
    int stream;         /* the refused request asked for a stream */
} rq_err;

/* server_json.c */
void bprintf(json_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void put_str_utf8(json_buf *b, const char *s, size_t n);
void put_str(json_buf *b, const char *s);
int rq_fail(rq_err *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void error_body(json_buf *b, int api, const rq_err *e);

/* server_emit.c */
void out_put(job *j, const char *s, size_t n);
void emit_begin(job *j);
void emit_text(job *j, int ch, const char *s, size_t n);
void emit_call_begin(job *j, int idx, const char *name);
void emit_call_end(job *j, int idx, const char *args, size_t n);
void emit_finish(job *j);
void emit_last(job *j, json_buf *b);
void gate_flush(job *j);
void record_logprobs(srv *S, job *j, const float *logits, int32_t id, size_t text_len);
const char *finish_name(const job *j);

/* server_grammar.c */
int job_constraint(srv *S, job *j, const chat_options *co, rq_err *e);

/* server_request.c */
void job_unref(job *j);
void job_ref(job *j);
job *request_job(srv *S, int api, const char *body, size_t len, rq_err *e);
/* count_only: the prompt alone (Anthropic's count_tokens: no max_tokens,
 * no context check; the job is never run). */
job *request_job_ex(srv *S, int api, int count_only, const char *body, size_t len, rq_err *e);
/* The request-field helpers every API's parser shares (server_request.c):
 * each returns 0, or -1 with e filled naming the field. */
const json_value *field(const json_value *o, const char *k); /* NULL for absent or null */
/* A conversation key string hashed (FNV-1a, never 0), 0 for absent or empty. */
uint64_t conv_key(const json_value *v);
int check_fields(const json_value *o, const char *const *allowed, rq_err *e);
int get_num(const json_value *o, const char *k, double lo, double hi, double *out, rq_err *e);
int get_int(const json_value *o, const char *k, int64_t lo, int64_t hi, int64_t *out, int *set, rq_err *e);
int get_bool(const json_value *o, const char *k, int *out, rq_err *e);
int get_stops(job *j, const json_value *o, const char *k, rq_err *e);
int get_common(srv *S, job *j, const json_value *o, rq_err *e);
int text_fits(srv *S, size_t bytes, const char *param, rq_err *e);
int set_max_tokens(srv *S, job *j, const char *k, int64_t v, int set, rq_err *e);
int render_encode(srv *S, job *j, const json_value *messages, const chat_options *co, rq_err *e);
/* An API's effort level (OpenAI's reasoning_effort, Anthropic's
 * output_config.effort) as K3's template spells it: low, high or max;
 * *off = 1 for "none"; NULL for a value the APIs do not define. */
const char *k3_effort(const char *api_effort, int *off);
/* {"role": R[, "tool_call_id": ID], "content": TEXT} into d (no separator). */
void put_message(json_buf *d, const char *role, const char *tool_call_id, const char *text, size_t n);

/* server_anthropic.c: the Messages API */
int parse_messages(srv *S, job *j, const json_value *o, rq_err *e);
/* The signature of a thinking block holding `text` (what a later request
 * sends back, decoded by the same file), into b. */
void anth_signature(json_buf *b, const char *text, size_t n);

/* server_responses.c: POST /v1/responses */
int parse_responses(srv *S, job *j, const json_value *o, rq_err *e);
void resp_job_free(resp_job *r);
/* the worker's output, called from server_emit.c's emit_* for API_RESPONSES */
void resp_text(job *j, int ch, const char *s, size_t n);
void resp_call_begin(job *j, int idx, const char *name);
void resp_call_end(job *j, const char *args, size_t n);
void resp_finish(job *j);
/* A keepalive event into buf; stream_reader calls it with j->mu held. */
size_t resp_keepalive(job *j, char *buf, size_t max);
/* The hosted tools the request named and the prompt left out, or NULL. */
const char *resp_omitted_tools(const job *j);
/* A stream refused at validation as events: response.created, response.failed. */
void resp_failed_stream(srv *S, const rq_err *e, json_buf *out);
resp_store *resp_store_new(void);
void resp_store_free(resp_store *s);

/* server_cache.c: --prompt-cache DIR */
/* Save a seat's conversation (up to its last checkpoint) before it is reused. */
/* The text cap (max_text) from the tokenizer and the context; and, unless
 * --max-request-bytes was given, the body cap derived from it. */
void server_set_caps(srv *S);
/* At start: removes a killed save's temporary files, evicts past the cap. */
void pcache_init(srv *S);
int pcache_save(srv *S, seat *sl);
/* The longest saved conversation that is a proper prefix of j's prompt and
 * longer than `longer_than`: its length (path in path), or 0. */
int pcache_find(srv *S, const job *j, size_t longer_than, char *path, size_t n_path);

/* server_docs.c: documents in the three APIs, rendered by document.c */
int anth_document(srv *S, const json_value *b, const char *where, size_t k, json_buf *out, rq_err *e);
int chat_expand_files(srv *S, const json_value *msgs, json_doc **doc, rq_err *e);
int resp_input_file(srv *S, const json_value *p, const char *where, size_t k, json_buf *out, rq_err *e);

#endif
