/* server.c - `deltafin serve`: OpenAI and Anthropic HTTP APIs (front end, L5).
 *
 *   deltafin serve --model DIR [--host 127.0.0.1] [--port 8080] [--queue 16]
 *                  [--api-key KEY] [--max-request-bytes 128M] [--max-tokens N]
 *                  [--timeout SEC] [--conn-timeout 600] [--name NAME] [--ping-ms 2000] [--checkpoints N]
 *                  [--parallel N] [--prompt-cache DIR [--prompt-cache-max 8G]]
 *                  + the run options (--ctx, --mem, --threads, --batch, ...)
 *
 * Owns: HTTP (libmicrohttpd, one thread per connection), the job queue, the
 * inference worker, /health, /metrics and the chat page at /.  Request
 * validation and the mapping of the APIs onto chat_render's
 * OpenAI-shaped messages are server_request.c's; the API-shaped responses,
 * SSE streams and logprobs are server_emit.c's; the Responses API
 * (/v1/responses: items, events, previous_response_id's store) is
 * server_responses.c's; sampling is sampler.c's.
 * Does not own: the template, tokenizer or model (engine.h, tokenizer.h,
 * chat_template.h).
 *
 * Threads: MHD connection threads only parse, validate, render and encode a
 * request into a job and queue it (bounded: a full queue is 429).  The one
 * worker thread owns the session, the logits and the id history; it writes
 * each job's output bytes into job->out under job->mu and signals job->cv;
 * connection threads copy them out (SSE, with comment pings while nothing
 * comes; /v1/responses streams get keepalive events instead, numbered in
 * turn under job->mu, since Codex counts only JSON events) or wait for the
 * whole body.  A job is reference counted (request,
 * worker, stream response); job->cancelled is set when the connection ends
 * early (a failed SSE write, or a hang-up polled for while a non-streaming
 * request waits) and the worker stops at the next token.
 * Generation is generate.c's loop (the same as `run` and `chat`), with the
 * drafter of --draft for every request.  Conversations: --parallel N seats,
 * each a session with its loop's id history; a request goes to the seat
 * whose history it shares the most of (among equals the one that last
 * held the client's conversation key, then the least recently used) and is fed only from where they part, when the session can go back
 * there (an extension; the last generated id, not yet evaluated; a point
 * since the last verify pass; a checkpoint: one after each of the prompt's
 * latest <|end_of_msg|>, where the next turn's prompt parts from this
 * reply's reasoning and an edited history from its first changed message,
 * and one where the system prompt and tools end, first_turn; all taken
 * inside the prompt's passes, df_session_checkpoint_at), else the seat is
 * reset.  The prompt is fed one forward pass (the plan's chunk) at a time.  A new conversation that shares only that
 * system-prompt checkpoint with a seat, or any prefix of a seat that
 * another conversation key left, gets the prefix copied into another seat
 * (df_session_copy_prefix), so both conversations keep their histories.  A client that leaves during its prompt (or a job past
 * --timeout) stops within one piece; the ids evaluated stay, trusted, so
 * the same request sent again continues from them.  A history is trusted only once the
 * job that produced it was delivered completely (job->delivered, set when
 * MHD reports the request completed); otherwise the next job resets it.
 * One worker runs one forward pass at a time: rows of different seats are
 * not batched together.  The HTTP threads exempt themselves from the
 * process-wide allocation guard (util.h): they allocate while the worker
 * is inside df_session_eval.
 * Determinism: temperature 0 (the default) is greedy; temperature > 0
 * samples (sampler.c) in double from a splitmix64 stream seeded by "seed",
 * the same draws as `deltafin run --temp --seed`.
 * Validation (request_job: JSON body -> job or API-shaped error) touches no
 * HTTP, queue or model; server_parse_request exposes it to the fuzz target
 * (fuzz/fuzz_server_request.c).
 * Structured output: a request asking for a guarantee (a schema, a forced
 * or strict tool) carries a grammar compiled while it was validated
 * (server_grammar.c); the worker runs a matcher over it that masks each row
 * the generation loop decides from (gen_constrain).
 * Not done here: n > 1, penalties, images: 400s naming the field.
 */
#define _GNU_SOURCE
#include "server_impl.h"
#include "server.h"
#include "chat_template.h"
#include "options.h"
#include "plan.h"
#include "spec_state.h"
#include "engine.h"
#include "json.h"
#include "json_write.h"
#include "sampler.h"
#include "tokenizer.h"
#include "util.h"
#include "web_page.h"

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
#include <sys/stat.h>
#include <time.h>

/* ---- the worker ------------------------------------------------------- */

/* The seats' generation counters summed into S->gstats; with S->mu held. */
static void sum_gen_stats(srv *S)
{
    memset(&S->gstats, 0, sizeof S->gstats);
    for (int i = 0; i < S->n_seats; i++) {
        const gen_stats *g = &S->seats[i].gl.st;
        S->gstats.passes += g->passes;
        S->gstats.draft_passes += g->draft_passes;
        S->gstats.proposed += g->proposed;
        S->gstats.accepted += g->accepted;
    }
}

/* /metrics while a job runs: the engine's counters (positions, expert reads,
 * I/O wait), the drafts' and the running job's progress, refreshed between
 * forward passes by the worker (the only thread that drives the engine), at
 * most every --ping-ms / 4 (the page polls once a second) or when force is
 * set.  t_first: when the reply's first token came (0: none yet). */
static void live_refresh(srv *S, const job *j, double t_first, int force)
{
    double t = now_sec();
    if (!force && t - S->live_t < S->ping_ms / 4000.0) return;
    pthread_mutex_lock(&S->mu);
    S->live_t = t;
    df_engine_stats(S->eng, &S->stats);
    sum_gen_stats(S);
    S->run_prompt_done = j ? j->prompt_done : 0;
    S->run_prompt_total = j ? j->prompt_total : 0;
    S->run_gen = j ? j->n_gen : 0;
    S->run_tps = j && j->n_gen > 1 && t_first > 0 && t > t_first ? (j->n_gen - 1) / (t - t_first) : 0;
    pthread_mutex_unlock(&S->mu);
}

/* Feed a prompt's ids in pieces, so a cancelled job (1) or one past its
 * --timeout (2) stops soon. */
static int feed(seat *sl, job *j, const int32_t *ids, size_t n)
{
    df_error err = {0};
    /* a piece is one forward pass (the plan's prompt chunk, --batch): a
     * smaller piece would read the layers' experts again for each */
    size_t piece = (size_t)df_session_max_batch(sl->s);
    if (piece < 1) piece = 256;
    for (size_t o = 0; o < n;) {
        if (atomic_load(&j->cancelled)) return 1;
        if (j->deadline > 0 && now_sec() > j->deadline) return 2;
        size_t k = n - o < piece ? n - o : piece;
        if (gen_feed(&sl->gl, ids + o, k, &err)) {
            snprintf(j->errmsg, sizeof j->errmsg, "%s", err.msg);
            return -1;
        }
        o += k;
        pthread_mutex_lock(&j->mu);
        j->prompt_done = (int)(ids - j->ids + o);
        pthread_mutex_unlock(&j->mu);
        live_refresh(j->S, j, 0, 0);
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

/* Does the reply end with these events?  parallel_tool_calls false (or
 * Anthropic's disable_parallel_tool_use) under tool_choice auto: the first
 * call that ends is the last (under a forced choice the grammar allows only
 * one). */
static int reply_ends(const job *j, const chat_event *ev, size_t n)
{
    if (!j->single_call || j->grammar) return 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].type == CHAT_EV_CALL_END) return 1;
    return 0;
}

/* The prompt's longest common prefix with a seat's history that its
 * session can return to (0 when its history may not be reused). */
static size_t reusable(const seat *sl, const job *j)
{
    size_t lcp = 0, n_hist;
    const int32_t *hist = gen_history(&sl->gl, &n_hist);
    if (!sl->hist_ok) return 0;
    while (lcp < n_hist && lcp < j->n_ids && hist[lcp] == j->ids[lcp]) lcp++;
    if (lcp == j->n_ids) lcp--; /* at least one id is fed: the next token's logits */
    /* the common prefix itself when it extends what is evaluated or lies
     * after the last verify pass's mark, else the last conversation
     * checkpoint inside it */
    return lcp ? (size_t)df_session_reachable(sl->s, (int)lcp) : 0;
}

/* Where the prompt's first non-system turn opens (after the system prompt
 * and tools, which conversations of one agent share), or 0.  K3's template
 * encodes each segment alone (chat_template.h), so the opening of a user,
 * assistant or tool message is always the same ids (S->turn_open). */
static size_t first_turn(const srv *S, const job *j)
{
    for (size_t i = 1; i < j->n_ids; i++) {
        if (j->ids[i - 1] != S->end_of_msg) continue;
        for (int r = 0; r < 3; r++) {
            size_t n = S->turn_len[r];
            if (n && i + n <= j->n_ids && !memcmp(j->ids + i, S->turn_open[r], n * sizeof *j->ids)) return i;
        }
    }
    return 0;
}

/* Has the job that left this seat's history been delivered (or was it a
 * prompt cut short, whose evaluated ids are all the request's own)? */
static int seat_trusted(seat *sl)
{
    if (!sl->hist_ok || !sl->last) return sl->hist_ok;
    /* its connection thread may still be writing the last bytes: wait briefly for the verdict */
    job *l = sl->last;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&l->mu);
    while (!atomic_load(&l->delivered) && !atomic_load(&l->cancelled))
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT) break;
    pthread_mutex_unlock(&l->mu);
    return atomic_load(&l->delivered);
}

/* constrained decoding (server_grammar.c compiled the job's grammar): a
 * matcher over the model's vocabulary masks each row the loop decides from */

static int mask_cb(void *ctx, float *logits, df_error *err)
{
    gr_matcher *m = ctx;
    size_t n = gr_matcher_apply(m, logits);
    if (gr_matcher_overflow(m))
        return df_err_set(err, DF_ERR_LIMIT, -1, "the output grammar is too ambiguous (more than %d alternatives or "
                          "nesting past %d)", GR_MAX_STACKS, GR_MAX_DEPTH);
    if (!n) return df_err_set(err, DF_ERR_ARG, -1, "the output grammar allows no further token");
    return 0;
}

static int accept_cb(void *ctx, int32_t id, df_error *err)
{
    if (gr_matcher_accept(ctx, id))
        return df_err_set(err, DF_ERR_ARG, -1, "token %d does not fit the output grammar", (int)id);
    return 0;
}

static void job_constraint_begin(srv *S, job *j, gen_loop *gl)
{
    if (!j->grammar) return;
    if (!S->gvocab) S->gvocab = gr_vocab_from_tokenizer(S->tok);
    j->matcher = gr_matcher_new(j->grammar, S->gvocab);
    /* every state's token classes now, so the token loop allocates nothing
     * (a few ms at the default vocabulary; ~3.5 ms a state at K3's) */
    gr_matcher_warm(j->matcher);
    gen_constraint c = {mask_cb, accept_cb, j->matcher};
    gen_constrain(gl, &c);
}

static void job_constraint_end(job *j, gen_loop *gl)
{
    gen_constrain(gl, NULL);
    gr_matcher_free(j->matcher);
    j->matcher = NULL;
}

/* Is seat a a better home than seat b for job j, keeping fa and fb of its
 * prompt?  The one that keeps more; among equals the one that last held
 * the client's conversation key, then the least recently used. */
static int seat_better(const job *j, const seat *a, size_t fa, const seat *b, size_t fb)
{
    if (fa != fb) return fa > fb;
    int ka = j->conv_key && a->key == j->conv_key, kb = j->conv_key && b->key == j->conv_key;
    if (ka != kb) return ka;
    return a->used < b->used;
}

/* Where a prefix another conversation shares is copied to: the seat that
 * last held this client's conversation key, else the least recently used
 * one (never src). */
static seat *copy_target(srv *S, const job *j, const seat *src)
{
    seat *dst = NULL;
    for (int i = 0; i < S->n_seats; i++) {
        seat *c = &S->seats[i];
        if (c == src) continue;
        int kc = j->conv_key && c->key == j->conv_key, kd = dst && j->conv_key && dst->key == j->conv_key;
        if (!dst || kc > kd || (kc == kd && c->used < dst->used)) dst = c;
    }
    return dst;
}

/* The seat this job runs in: the one that keeps most of its prompt (*from
 * ids), or a copy of that prefix in another seat when it belongs to
 * another conversation. */
static seat *pick_seat(srv *S, job *j, size_t *from_out)
{
    seat *sl = &S->seats[0];
    size_t from = reusable(sl, j);
    for (int i = 1; i < S->n_seats; i++) {
        size_t f = reusable(&S->seats[i], j);
        if (seat_better(j, &S->seats[i], f, sl, from)) sl = &S->seats[i], from = f;
    }
    sl->used = atomic_load(&S->job_counter);
    /* the session's history counts only if the job that left it was delivered */
    int trusted = seat_trusted(sl);
    if (!trusted) from = 0;
    sl->hist_ok = trusted;
    /* the reuse ends inside a longer history that belongs to another
     * conversation: at or before where this prompt's first turn opens (the
     * same system prompt and tools, or a common start of them), or anywhere
     * when the client's conversation key says the seat holds another
     * conversation (two sessions that began alike).  Copied into another
     * seat (copy_target), so that conversation keeps its own history; with
     * one seat, it is saved (--prompt-cache) before it is rewound.  A
     * conversation going back within itself, to a later checkpoint, is
     * rewound in place */
    size_t n_src = 0, ft = first_turn(S, j);
    gen_history(&sl->gl, &n_src);
    int other = (j->conv_key && sl->key && sl->key != j->conv_key) || (ft && from <= ft);
    if (from > 0 && from < n_src && other && S->n_seats == 1) pcache_save(S, sl);
    if (from > 0 && from < n_src && other && S->n_seats > 1) {
        seat *dst = copy_target(S, j, sl);
        df_error cerr = {0};
        pcache_save(S, dst); /* its conversation leaves it */
        if (!df_session_copy_prefix(dst->s, sl->s, (int)from, &cerr)) {
            const int32_t *hist = gen_history(&sl->gl, &n_src);
            gen_resume(&dst->gl, hist, from);
            if (dst->last) job_unref(dst->last);
            dst->last = NULL;
            dst->hist_ok = 1;
            dst->ck_pos = (int)from;
            dst->used = sl->used;
            sl = dst;
            j->n_copied = (int)from;
        } else {
            fprintf(stderr, "deltafin: copying a prefix between conversations: %s\n", cerr.msg);
            pcache_save(S, sl); /* rewound in place: its conversation leaves it */
        }
    }
    *from_out = from;
    return sl;
}

/* The seat's session made to hold the job's first `from` prompt ids: a saved
 * conversation (--prompt-cache) that keeps more, or the seat rewound, or
 * emptied; returns the ids it holds. */
static size_t sync_seat(srv *S, job *j, seat *sl, size_t from)
{
    /* a saved conversation (--prompt-cache) that keeps more of the prompt */
    char cpath[1024];
    int cached = pcache_find(S, j, from, cpath, sizeof cpath);
    df_error rerr = {0};
    if (cached > 0 || !from) {
        /* this seat's conversation leaves it: saved first */
        pcache_save(S, sl);
        gen_reset(&sl->gl);
        sl->ck_pos = 0;
        from = 0;
        int m = 0;
        if (cached > 0 && !df_session_load(sl->s, cpath, S->pc_ids, S->n_ctx, &m, &rerr) && m == cached) {
            gen_resume(&sl->gl, S->pc_ids, (size_t)m);
            from = (size_t)m;
        } else if (cached > 0) {
            fprintf(stderr, "deltafin: --prompt-cache: %s\n", rerr.msg);
            gen_reset(&sl->gl);
        }
    } else if (gen_rewind(&sl->gl, from, &rerr)) {
        gen_reset(&sl->gl);
        from = 0;
    }
    if (sl->last) job_unref(sl->last);
    sl->last = NULL;
    sl->hist_ok = 0;
    sl->key = j->conv_key;
    j->n_reused = (int)from;
    j->gate_ch = -1;
    return from;
}

/* The prompt's ids past `from` evaluated, checkpoints asked for on the way;
 * feed's result (0 done, 1 the client left, 2 --timeout, -1 error). */
static int feed_prompt(srv *S, job *j, seat *sl, size_t from)
{
    df_error rerr = {0};
    /* checkpoints, taken inside the prompt's passes (no pass is split):
     * where each message of the prompt ends, the latest first (the next
     * turn's prompt parts from this reply's reasoning after the last one;
     * an edited history, its thinking or tool results cleared, parts at
     * the start of the first changed message), and where the system prompt
     * and tools end (first_turn: another conversation of the same agent, a
     * new session or a subagent, shares them), asked for last so that it
     * is the newest and is kept */
    size_t sys = S->a.checkpoints > 1 ? first_turn(S, j) : 0;
    if (sys <= from || sys >= j->n_ids) sys = 0;
    int n_msg = S->a.checkpoints - (sys ? 1 : 0), n_at = 0;
    size_t at[64];
    for (size_t i = j->n_ids - 1; S->end_of_msg >= 0 && i > from && n_at < n_msg && n_at < 64; i--)
        if (j->ids[i - 1] == S->end_of_msg && i != sys) at[n_at++] = i;
    size_t cut = n_at ? at[0] : 0; /* the last message's end */
    for (int k = n_at - 1; k >= 0; k--) df_session_checkpoint_at(sl->s, (int)at[k], &rerr);
    if (sys) df_session_checkpoint_at(sl->s, (int)sys, &rerr);
    pthread_mutex_lock(&j->mu);
    j->prompt_reused = j->prompt_done = (int)from;
    j->prompt_total = (int)j->n_ids;
    j->prompt_t0 = now_sec();
    pthread_mutex_unlock(&j->mu);
    int rc = feed(sl, j, j->ids + from, j->n_ids - from);
    if (!rc && cut) sl->ck_pos = (int)cut;
    if (rc > 0) {
        /* the client went away (or --timeout passed) while its prompt was
         * evaluated: what was evaluated stays (a checkpoint there), so the
         * same request sent again continues from it */
        size_t n_done = 0;
        gen_history(&sl->gl, &n_done);
        if (n_done > 0 && S->a.checkpoints > 0 && !df_session_checkpoint(sl->s, &rerr)) sl->ck_pos = (int)n_done;
        j->prompt_cut = (int)n_done;
        fprintf(stderr, "deltafin: %s: %s during its prompt: stopped after %zu of %zu ids (%zu evaluated here), kept "
                "for the same request sent again\n", j->id, rc == 2 ? "--timeout passed" : "the client left", n_done,
                j->n_ids, n_done - from);
    }
    return rc;
}

/* The reply: tokens sampled, parsed and emitted until it ends, then the
 * finish (or the cancellation) delivered; rc is feed_prompt's.
 * *t_first: when the first token came (0: none). */
static void generate_reply(srv *S, job *j, seat *sl, int rc, double *t_first_out)
{
    sampler_reset(&S->smp, j->temperature, j->top_p, 0, j->seed);
    tok_decoder dec;
    tok_decoder_init(&dec, S->tok);
    chat_parser_reset(S->parser, j->think);
    job_constraint_begin(S, j, &sl->gl);
    j->fin = FIN_STOP;
    double t_first = 0;
    df_error gerr = {0};
    while (!rc) {
        if (atomic_load(&j->cancelled)) { j->fin = FIN_CANCEL; break; }
        if (j->deadline > 0 && now_sec() > j->deadline) { j->fin = FIN_TIMEOUT; break; }
        int32_t next;
        if (gen_next(&sl->gl, &next, &gerr)) {
            snprintf(j->errmsg, sizeof j->errmsg, "%s", gerr.msg);
            rc = -1;
            break;
        }
        if (!j->n_gen++) t_first = now_sec();
        live_refresh(S, j, t_first, 0);
        size_t tl = 0;
        if (j->logprobs) tokenizer_token_bytes(S->tok, next, &tl);
        if (j->logprobs) record_logprobs(S, j, gen_logits(&sl->gl), next, tl);
        if (j->api == API_COMPLETIONS) {
            if (next == S->info.eos_id) break;
            size_t n = tok_decoder_feed(&dec, next, S->dbuf, S->dcap);
            emit_text(j, CH_CONTENT, S->dbuf, n);
        } else {
            const chat_event *ev;
            size_t n = chat_parser_feed(S->parser, next, &ev);
            handle_events(j, ev, n);
            if (reply_ends(j, ev, n)) break;
        }
        if (j->stopped) { j->fin = FIN_STOPSEQ; break; }
        if (next == S->info.eos_id || (j->api != API_COMPLETIONS && chat_parser_done(S->parser))) break;
        size_t n_hist;
        gen_history(&sl->gl, &n_hist);
        if (j->n_gen >= j->max_tokens || n_hist >= (size_t)S->n_ctx) { j->fin = FIN_LENGTH; break; }
    }
    job_constraint_end(j, &sl->gl);
    /* the session holds the history but its last id (verified drafts past
     * where the reply stopped are taken back) */
    if (!rc && gen_settle(&sl->gl, 0, &gerr)) {
        snprintf(j->errmsg, sizeof j->errmsg, "%s", gerr.msg);
        rc = -1;
    }
    if (!rc) spec_state_save(&S->a, &sl->gl);
    if (rc == 2) {
        j->fin = FIN_TIMEOUT;
        rc = 0;
    } else if (rc > 0) {
        j->fin = FIN_CANCEL;
    }
    if (rc < 0) j->fin = FIN_ERROR;
    if (j->fin == FIN_LENGTH || j->fin == FIN_STOPSEQ || j->fin == FIN_TIMEOUT) {
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
    *t_first_out = t_first;
}

/* The job's numbers into the server's counters (/health, /metrics). */
static void account_job(srv *S, const job *j, size_t from, double t0, double t_first)
{
    double t1 = now_sec();
    pthread_mutex_lock(&S->mu);
    S->tok_prompt += j->n_ids - from;
    S->tok_reused += from;
    S->tok_gen += (uint64_t)j->n_gen;
    S->gen_seconds += t1 - t0;
    if (j->n_gen > 1 && t_first > 0 && t1 > t_first) S->last_tps = (j->n_gen - 1) / (t1 - t_first);
    if (j->fin == FIN_ERROR) S->n_errors++;
    df_engine_stats(S->eng, &S->stats);
    sum_gen_stats(S);
    S->run_prompt_done = S->run_prompt_total = S->run_gen = 0;
    S->run_tps = 0;
    pthread_mutex_unlock(&S->mu);
}

/* The job's route counts kept with its seat for GET /v1/routes (the
 * session's table is reset by the seat's next job). */
static void keep_routes(srv *S, const job *j, seat *sl)
{
    uint64_t rows;
    const uint32_t *c = df_session_route_counts(sl->s, &rows);
    if (!c) return;
    pthread_mutex_lock(&S->mu);
    memcpy(sl->routes, c, (size_t)S->info.n_layers * (size_t)S->info.n_experts * sizeof *c);
    sl->routes_rows = rows;
    snprintf(sl->routes_id, sizeof sl->routes_id, "%s", j->id);
    pthread_mutex_unlock(&S->mu);
}

static void run_job(srv *S, job *j)
{
    double t0 = now_sec();
    size_t from;
    seat *sl = pick_seat(S, j, &from);
    df_session_route_counts_reset(sl->s);
    from = sync_seat(S, j, sl, from);
    emit_begin(j);
    int rc = feed_prompt(S, j, sl, from);
    double t_first;
    generate_reply(S, j, sl, rc, &t_first);
    account_job(S, j, from, t0, t_first);
    keep_routes(S, j, sl);
    if (j->fin == FIN_ERROR) {
        gen_reset(&sl->gl);
    } else if (j->prompt_cut) {
        /* only the request's own prompt ids: trusted whatever was delivered */
        sl->hist_ok = 1;
        job_unref(j);
        return;
    } else {
        sl->hist_ok = j->fin != FIN_CANCEL;
    }
    sl->last = j; /* keeps the worker's reference */
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

/* A comment ping that says how far the prompt is (the chat page's progress
 * bar): ": ping {"prompt_done":D,"prompt_total":T,"prompt_reused":R,
 * "seconds":S}", D of the prompt's T ids evaluated (R of them reused from the
 * conversation kept), S seconds since the evaluation began; still an SSE
 * comment, which every client skips.  With j->mu held; 0 when the prompt is
 * done (or not begun) or the line does not fit: the plain ping then. */
static size_t progress_ping(job *j, char *buf, size_t max)
{
    if (j->prompt_total <= 0 || j->prompt_done >= j->prompt_total) return 0;
    char tmp[160];
    int n = snprintf(tmp, sizeof tmp, ": ping {\"prompt_done\":%d,\"prompt_total\":%d,\"prompt_reused\":%d,\"seconds\":%.1f}\n\n",
                     j->prompt_done, j->prompt_total, j->prompt_reused, now_sec() - j->prompt_t0);
    if (n <= 0 || (size_t)n >= sizeof tmp || (size_t)n > max) return 0;
    memcpy(buf, tmp, (size_t)n);
    return (size_t)n;
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
            /* the timeout can race an event written just before it: that event goes first (a
             * Responses keepalive numbered after it, sent before it, would break the order) */
            if (j->sent != j->out.len || j->done) break;
            /* prefill or a slow token: a keep-alive clients count: an SSE comment, Anthropic's
             * own ping event on /v1/messages, a keepalive event on /v1/responses */
            /* while the prompt is evaluated, the progress comment first (every API: a comment is
             * skipped by every SSE reader, the SDKs' included), then the API's own keep-alive */
            size_t k = progress_ping(j, buf, max);
            if (j->api == API_RESPONSES) {
                size_t ka = resp_keepalive(j, buf + k, max - k);
                k += ka;
                if (!ka) k = 0; /* no room for the keepalive event: the progress alone goes next time */
            }
            pthread_mutex_unlock(&j->mu);
            static const char comment[] = ": ping\n\n", anth[] = "event: ping\ndata: {\"type\":\"ping\"}\n\n";
            if (j->api == API_MESSAGES && k + sizeof anth - 1 <= max) {
                memcpy(buf + k, anth, sizeof anth - 1);
                return (ssize_t)(k + sizeof anth - 1);
            }
            if (k) return (ssize_t)k;
            size_t n = sizeof comment - 1 < max ? sizeof comment - 1 : max;
            memcpy(buf, comment, n);
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
    if (!strcmp(url, "/responses")) return API_RESPONSES;
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
    /* the job running, refreshed between its forward passes (live_refresh); 0 when none */
    bprintf(&b, "# TYPE deltafin_running_prompt_done gauge\ndeltafin_running_prompt_done %d\n"
            "# TYPE deltafin_running_prompt_total gauge\ndeltafin_running_prompt_total %d\n"
            "# TYPE deltafin_running_generated_tokens gauge\ndeltafin_running_generated_tokens %d\n"
            "# TYPE deltafin_running_tokens_per_second gauge\ndeltafin_running_tokens_per_second %.3f\n",
            S->run_prompt_done, S->run_prompt_total, S->run_gen, S->run_tps);
    gen_stats gs = S->gstats;
    pthread_mutex_unlock(&S->mu);
    bprintf(&b, "# TYPE deltafin_conversations_kept gauge\ndeltafin_conversations_kept %d\n", S->n_seats);
    bprintf(&b, "# TYPE deltafin_decode_passes_total counter\ndeltafin_decode_passes_total %llu\n"
            "# TYPE deltafin_verify_passes_total counter\ndeltafin_verify_passes_total %llu\n"
            "# TYPE deltafin_draft_proposed_total counter\ndeltafin_draft_proposed_total %llu\n"
            "# TYPE deltafin_draft_accepted_total counter\ndeltafin_draft_accepted_total %llu\n",
            (unsigned long long)gs.passes, (unsigned long long)gs.draft_passes, (unsigned long long)gs.proposed,
            (unsigned long long)gs.accepted);
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

/* GET /v1/routes[?id=ID]: the route counts of the rows a finished job
 * evaluated (its prompt less the prefix reused, its reply, verify passes'
 * rows included): the job named, else the last one finished.  404 when no
 * seat keeps it (a later job on the same seat replaced it). */
static enum MHD_Result serve_routes(srv *S, struct MHD_Connection *c)
{
    const char *id = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "id");
    rq_err e = {0};
    json_buf b;
    json_buf_init(&b);
    pthread_mutex_lock(&S->mu);
    const seat *best = NULL;
    for (int i = 0; i < S->n_seats; i++) {
        const seat *sl = &S->seats[i];
        if (!sl->routes_id[0] || (id && strcmp(sl->routes_id, id))) continue;
        if (!best || sl->used > best->used) best = sl;
    }
    if (best) {
        int NL = S->info.n_layers, E = S->info.n_experts;
        json_buf_puts(&b, "{\"id\":");
        put_str(&b, best->routes_id);
        bprintf(&b, ",\"rows\":%llu,\"layers\":%d,\"experts\":%d,\"top_k\":%d,\"moe_layers\":[",
                (unsigned long long)best->routes_rows, NL, E, S->info.n_experts_used);
        for (int il = 0, n = 0; il < NL; il++)
            if (S->info.layer_moe[il]) bprintf(&b, "%s%d", n++ ? "," : "", il);
        json_buf_puts(&b, "],\"counts\":[");
        for (int il = 0, n = 0; il < NL; il++) {
            if (!S->info.layer_moe[il]) continue;
            json_buf_puts(&b, n++ ? ",[" : "[");
            for (int x = 0; x < E; x++) bprintf(&b, "%s%u", x ? "," : "", best->routes[(size_t)il * E + x]);
            json_buf_puts(&b, "]");
        }
        json_buf_puts(&b, "]}");
    }
    pthread_mutex_unlock(&S->mu);
    if (best) return reply_json(c, 200, &b);
    json_buf_free(&b);
    if (id) rq_fail(&e, 404, NULL, "no routes kept for %.*s: a seat keeps its last finished reply's only", (int)utf8_cut(id, strlen(id), 60), id);
    else rq_fail(&e, 404, NULL, "no reply has finished yet");
    return reply_error(c, API_CHAT, &e);
}

/* GET /v1/plan: the plan the server runs under (plan --json's object and
 * its text), the model's numbers, and its card (the model directory's
 * README.md, at most 256 KiB; null when there is none). */
static enum MHD_Result serve_plan(srv *S, struct MHD_Connection *c)
{
    if (!atomic_load(&S->ready)) {
        rq_err e = {0};
        rq_fail(&e, 503, NULL, "the model is still loading");
        return reply_error(c, API_CHAT, &e);
    }
    df_plan p;
    df_engine_plan(S->eng, &p);
    char *pj = NULL, *pt = NULL;
    size_t pjn = 0, ptn = 0;
    FILE *f = open_memstream(&pj, &pjn);
    if (f) plan_json(f, &p, 1, "");
    if (f) fclose(f);
    f = open_memstream(&pt, &ptn);
    if (f) df_plan_print(&p, "", f);
    if (f) fclose(f);
    json_buf b;
    json_buf_init(&b);
    json_buf_puts(&b, "{\"model\":");
    put_str(&b, S->name);
    json_buf_puts(&b, ",\"path\":");
    put_str(&b, S->a.model);
    const df_model_info *i = &S->info;
    bprintf(&b, ",\"info\":{\"layers\":%d,\"kda_layers\":%d,\"mla_layers\":%d,\"hidden\":%d,\"vocab\":%d,"
            "\"experts\":%d,\"experts_per_token\":%d,\"expert_bytes\":%llu,\"trunk\":\"%s\",\"expert_type\":\"%s\","
            "\"kernels\":",
            i->n_layers, i->n_kda_layers, i->n_mla_layers, i->hidden, i->vocab, i->n_experts, i->n_experts_used,
            (unsigned long long)i->expert_bytes, i->trunk, i->experts);
    put_str(&b, i->backend ? i->backend : "");
    bprintf(&b, ",\"threads\":%d,\"context\":%d}", i->n_threads, S->n_ctx);
    json_buf_puts(&b, ",\"plan\":");
    if (pj && pjn) json_buf_put(&b, pj, pjn - (pj[pjn - 1] == '\n'));
    else json_buf_puts(&b, "null");
    json_buf_puts(&b, ",\"plan_text\":");
    put_str(&b, pt ? pt : "");
    free(pj);
    free(pt);
    char path[4200], *card = NULL;
    size_t card_len = 0;
    df_error err = {0};
    snprintf(path, sizeof path, "%s/README.md", S->a.model);
    json_buf_puts(&b, ",\"card\":");
    if (!read_small_file(path, &card, &card_len, 256 << 10, &err)) json_write_string(&b, card, card_len);
    else json_buf_puts(&b, "null");
    free(card);
    json_buf_puts(&b, "}");
    return reply_json(c, 200, &b);
}

/* Does an Accept-Encoding value take gzip?  RFC 9110 12.5.3: a list of codings,
 * each with an optional ";q=" weight; gzip (or x-gzip) named with a weight
 * above 0, or not named and "*" with a weight above 0.  No header: no. */
static int accepts_gzip(const char *ae)
{
    int gzip = -1, star = -1; /* -1: not named; else whether its weight is above 0 */
    while (ae && *ae) {
        while (*ae == ' ' || *ae == '\t' || *ae == ',') ae++;
        const char *t = ae;
        while (*ae && *ae != ',' && *ae != ';' && *ae != ' ' && *ae != '\t') ae++;
        size_t n = (size_t)(ae - t);
        int ok = 1;
        while (*ae && *ae != ',') { /* parameters: only q matters */
            if (*ae == ';') {
                ae++;
                while (*ae == ' ' || *ae == '\t') ae++;
                if ((*ae == 'q' || *ae == 'Q') && ae[1] == '=') ok = strtod(ae + 2, NULL) > 0;
            } else ae++;
        }
        if ((n == 4 && !strncasecmp(t, "gzip", 4)) || (n == 6 && !strncasecmp(t, "x-gzip", 6))) gzip = ok;
        else if (n == 1 && *t == '*') star = ok;
    }
    return gzip >= 0 ? gzip : star > 0;
}

/* GET /: the chat page, the committed gzip bundle as it is (web_page.h).  A
 * client that does not take gzip (curl without --compressed, a script) gets a
 * short page saying so, not the compressed bytes and not a 406: every browser
 * sends Accept-Encoding: gzip. */
static enum MHD_Result serve_page(struct MHD_Connection *c)
{
    const char *ae = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept-Encoding");
    struct MHD_Response *r;
    if (accepts_gzip(ae)) {
        r = MHD_create_response_from_buffer(web_page_gz_len, (void *)(uintptr_t)web_page_gz, MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Content-Encoding", "gzip");
    } else {
        static const char plain[] =
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>deltafin</title></head><body>\n"
            "<p>deltafin's chat page is sent gzip-compressed, and this client did not accept gzip "
            "(its Accept-Encoding header). Every browser does; with curl, add --compressed.</p>\n"
            "<p>The APIs answer as usual: /v1/chat/completions, /v1/messages, /v1/responses, /v1/models, /metrics.</p>\n"
            "</body></html>\n";
        r = MHD_create_response_from_buffer(sizeof plain - 1, (void *)(uintptr_t)plain, MHD_RESPMEM_PERSISTENT);
    }
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Vary", "Accept-Encoding");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result serve_generate(srv *S, struct MHD_Connection *c, int api, req *r)
{
    rq_err e = {0};
    if (!atomic_load(&S->ready)) {
        rq_fail(&e, 503, NULL, "the model is still loading");
        return reply_error(c, api, &e);
    }
    job *j = request_job(S, api, r->body.p, r->body.len, &e);
    if (!j && api == API_RESPONSES && e.stream && e.code && !strcmp(e.code, "context_length_exceeded")) {
        /* Codex reads a too-long prompt from a response.failed event, not a 400 */
        json_buf b;
        json_buf_init(&b);
        resp_failed_stream(S, &e, &b);
        enum MHD_Result res = reply(c, 200, "text/event-stream", b.p, b.len);
        json_buf_free(&b);
        return res;
    }
    if (!j) return reply_error(c, api, &e);
    const char *omitted = api == API_RESPONSES ? resp_omitted_tools(j) : NULL;
    j->deadline = S->timeout > 0 ? now_sec() + S->timeout : 0;
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
        if (omitted) MHD_add_response_header(resp, "x-deltafin-omitted-tools", omitted);
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
    struct MHD_Response *resp = MHD_create_response_from_buffer(body.len, body.p ? body.p : (void *)(uintptr_t)"",
                                                                MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (omitted) MHD_add_response_header(resp, "x-deltafin-omitted-tools", omitted);
    job_unref(j);
    enum MHD_Result res = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    json_buf_free(&body);
    return res;
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
        /* a body up to 256 MiB over the limit is read and dropped, so that the
         * client sees the 413 instead of a reset while it is still sending
         * (closing a socket with unread bytes resets it, and the reset can
         * overtake the reply); a larger one is refused at once and the
         * connection closed: a client that sent "Expect: 100-continue" gets
         * the 413 before it sends the body, one that did not may see a reset */
        if (post && cl && strtoull(cl, NULL, 10) > S->max_body + ((size_t)256 << 20)) {
            r->too_big = 1;
            rq_err e = {0};
            rq_fail(&e, 413, NULL, "the request body is larger than %zu bytes (%s)", (size_t)S->max_body,
                    S->max_body_set ? "--max-request-bytes" : "derived from --ctx: 1 MiB + 8 x the text it holds + a document's base64; --max-request-bytes overrides");
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
        rq_fail(&e, 413, NULL, "the request body is larger than %zu bytes (%s)", (size_t)S->max_body,
                    S->max_body_set ? "--max-request-bytes" : "derived from --ctx: 1 MiB + 8 x the text it holds + a document's base64; --max-request-bytes overrides");
        return reply_error(c, api, &e);
    }
    const char *path = !strncmp(url, "/v1/", 4) ? url + 3 : url;
    if (!strcmp(url, "/") && !strcmp(method, "GET"))
        return serve_page(c);
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
    if (!strcmp(path, "/routes") && !strcmp(method, "GET")) return serve_routes(S, c);
    if (!strcmp(path, "/plan") && !strcmp(method, "GET")) return serve_plan(S, c);
    if (!strcmp(path, "/models") && !strcmp(method, "GET")) {
        json_buf b;
        json_buf_init(&b);
        json_buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
        put_str(&b, S->name);
        json_buf_puts(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"deltafin\",\"type\":\"model\",\"display_name\":");
        put_str(&b, S->name);
        /* a quantized trunk says so: its answers are not the BF16 model's */
        bprintf(&b, ",\"context_length\":%d,\"trunk\":\"%s\",\"trunk_quantized\":%s,\"experts\":\"%s\","
                "\"experts_requantized\":%s}]}", S->n_ctx, S->info.trunk, S->info.trunk_quantized ? "true" : "false",
                S->info.experts, S->info.experts_requantized ? "true" : "false");
        return reply_json(c, 200, &b);
    }
    if (!strcmp(path, "/messages/count_tokens") && post) {
        /* Anthropic's token count: the prompt rendered exactly as /v1/messages would */
        job *j = request_job_ex(S, API_MESSAGES, 1, r->body.p, r->body.len, &e);
        if (!j) return reply_error(c, API_MESSAGES, &e);
        json_buf b;
        json_buf_init(&b);
        bprintf(&b, "{\"input_tokens\":%zu", j->n_ids);
        if (j->ctx_edits) bprintf(&b, ",\"context_management\":{\"original_input_tokens\":%zu}", j->n_ids + j->n_cleared);
        json_buf_puts(&b, "}");
        job_unref(j);
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

/* serve's defaults and its own options (the rest go to parse_common, in
 * S->a); *parallel: --parallel or 0.  Returns the arguments left to
 * parse_common (the caller frees them). */
static char **serve_options(srv *S, int argc, char **argv, int *parallel_out)
{
    S->host = "127.0.0.1";
    S->port = 8080;
    S->queue_max = 16;
    S->max_body = (size_t)128 << 20;
    S->max_tokens_cap = 0; /* none: the context bounds a reply */
    S->timeout = 0; /* none: a job ends at its max_tokens, the context, or when its client leaves */
    S->conn_timeout = 600;
    S->ping_ms = 2000;
    S->pcache_max = (uint64_t)8 << 30;
    int checkpoints = -1, parallel = 0; /* -1: the plan's rule (engine.h plan_checkpoints) */
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
        else if (SERVE_OPT("--max-request-bytes")) {
            S->max_body = parse_size(argv[++i], f);
            S->max_body_set = 1;
        }
        else if (SERVE_OPT("--max-document-bytes")) S->doc.max_bytes = parse_size(argv[++i], f);
        else if (SERVE_OPT("--max-tokens")) S->max_tokens_cap = (int)parse_long(argv[++i], f, 1, 1 << 24);
        else if (SERVE_OPT("--timeout")) S->timeout = (double)parse_long(argv[++i], f, 0, 1 << 24);
        else if (SERVE_OPT("--conn-timeout")) S->conn_timeout = (int)parse_long(argv[++i], f, 1, 1 << 24);
        else if (SERVE_OPT("--name")) S->name = argv[++i];
        else if (SERVE_OPT("--ping-ms")) S->ping_ms = (int)parse_long(argv[++i], f, 10, 3600000);
        else if (SERVE_OPT("--checkpoints")) checkpoints = (int)parse_long(argv[++i], f, 0, 64);
        else if (SERVE_OPT("--parallel")) parallel = (int)parse_long(argv[++i], f, 1, 64);
        else if (SERVE_OPT("--prompt-cache")) S->pcache_dir = argv[++i];
        else if (SERVE_OPT("--prompt-cache-max")) S->pcache_max = parse_size(argv[++i], f);
        else if (!strcmp(f, "--keep-billing-header")) S->keep_billing = 1;
        else rest[n_rest++] = argv[i];
#undef SERVE_OPT
    }
    rest[n_rest] = NULL;
    parse_common(n_rest, rest, &S->a);
    S->a.checkpoints = checkpoints;
    *parallel_out = parallel;
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
    return rest;
}

/* The sessions' options: the context (--ctx, else the plan's), the
 * checkpoints (--checkpoints, else the plan's), the batch, the draft rows. */
static void serve_session_opts(srv *S, df_session_opts *so)
{
    df_session_opts_default(so);
    df_plan plan;
    df_engine_plan(S->eng, &plan);
    if (S->a.ctx) so->n_ctx = S->a.ctx;
    else so->n_ctx = plan.n_ctx;
    if (S->a.checkpoints < 0) S->a.checkpoints = plan.checkpoints;
    if (S->a.batch) so->max_batch = S->a.batch;
    if (drafting(&S->a)) so->rollback_rows = draft_rows(&S->a);
    so->checkpoints = S->a.checkpoints;
}

/* How a user, assistant or tool message opens, as ids (S->turn_open):
 * none when the tokenizer lacks the specials. */
static void find_turn_opens(srv *S)
{
    df_error err = {0};
    /* segment by segment as the template encodes it: <|open|> "message"
     * " role" "=\"" ROLE */
    static const char *const turn_roles[3] = {"user", "assistant", "tool"};
    int32_t open_id = tokenizer_special_id(S->tok, "<|open|>");
    for (int r = 0; r < 3 && open_id >= 0 && S->end_of_msg >= 0; r++) {
        const char *const segs[4] = {"message", " role", "=\"", turn_roles[r]};
        int32_t *t = NULL;
        size_t n = 0, cap = 0;
        int ok = 1;
        for (int k = 0; k < 4 && ok; k++) ok = !tokenizer_encode(S->tok, segs[k], strlen(segs[k]), 0, &t, &n, &cap, &err);
        if (ok && n + 1 <= sizeof S->turn_open[r] / sizeof S->turn_open[r][0]) {
            S->turn_open[r][0] = open_id;
            memcpy(S->turn_open[r] + 1, t, n * sizeof *t);
            S->turn_len[r] = n + 1;
        }
        err = (df_error){0};
        free(t);
    }
}

/* --parallel N sessions, each refused with the numbers when the plan has
 * no room; without it, as many as fit, up to 4.  Nonzero (printed) when
 * none (or not all N) can be made. */
static int open_seats(srv *S, const df_session_opts *so, int parallel)
{
    df_error err = {0};
    int want = parallel > 0 ? parallel : 4;
    S->seats = xcalloc((size_t)want, sizeof *S->seats);
    for (int i = 0; i < want; i++) {
        if (df_session_new(S->eng, so, &S->seats[i].s, &err)) {
            if (parallel > 0 || i == 0) {
                fprintf(stderr, "deltafin: session %d of %d: %s\n", i + 1, want, err.msg);
                return 1;
            }
            err = (df_error){0};
            break;
        }
        S->n_seats++;
        /* the page's router plot: each job's route counts (observe_routes.c) */
        if (df_session_count_routes(S->seats[i].s, &err)) {
            fprintf(stderr, "deltafin: session %d: %s\n", i + 1, err.msg);
            return 1;
        }
        S->seats[i].routes = xcalloc((size_t)S->info.n_layers * (size_t)S->info.n_experts, sizeof(uint32_t));
    }
    return 0;
}

/* After SIGINT or SIGTERM: HTTP stopped, the worker joined, the kept
 * conversations saved (--prompt-cache), everything freed. */
static void serve_stop(srv *S, struct MHD_Daemon *d, pthread_t worker)
{
    fprintf(stderr, "deltafin: stopping\n");
    MHD_stop_daemon(d);
    pthread_mutex_lock(&S->mu);
    S->stop = 1;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    pthread_join(worker, NULL);
    for (int i = 0; i < S->n_seats; i++) {
        seat *sl = &S->seats[i];
        /* the conversations kept are saved for the next start */
        if (sl->hist_ok && (!sl->last || atomic_load(&sl->last->delivered))) pcache_save(S, sl);
        if (sl->last) job_unref(sl->last);
    }
    while (S->head) {
        job *j = S->head;
        S->head = j->next;
        job_unref(j);
    }
    chat_parser_free(S->parser);
    for (int i = 0; i < S->n_seats; i++) {
        gen_free(&S->seats[i].gl);
        df_session_free(S->seats[i].s);
        free(S->seats[i].routes);
    }
    free(S->seats);
    free(S->pc_ids);
    resp_store_free(S->rstore);
    df_drafter_free(S->dr);
    df_engine_close(S->eng);
    tokenizer_free(S->tok);
    sampler_free(&S->smp);
    free(S->dbuf);
}

int cmd_serve(int argc, char **argv)
{
    static srv S_;
    srv *S = &S_;
    int parallel;
    char **rest = serve_options(S, argc, argv, &parallel);
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    S->rstore = resp_store_new();

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    /* under mpirun, ranks 1..N-1 serve experts to rank 0, not HTTP
     * (open_engine does not return there) */
    if (df_ranks_rank() > 0) open_engine(&S->a);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)S->port);
    const char *h = !strcmp(S->host, "localhost") ? "127.0.0.1" : S->host;
    if (inet_pton(AF_INET, h, &sa.sin_addr) != 1) die("--host needs an IPv4 address, got \"%s\"", S->host);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)S->port, NULL,
        NULL, on_request, S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
        S, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)S->conn_timeout, MHD_OPTION_CONNECTION_LIMIT, 512u, MHD_OPTION_END);
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
    S->a.plan_sessions = parallel; /* --parallel N: planned before the expert cache */
    S->a.serve = 1;                /* without --ctx: serve's default context, chosen by the plan */
    S->eng = open_engine(&S->a);
    df_engine_info(S->eng, &S->info);
    if (tokenizer_n_vocab(S->tok) != S->info.vocab) {
        fprintf(stderr, "deltafin: the tokenizer has %d ids but the model's vocabulary is %d\n",
                tokenizer_n_vocab(S->tok), S->info.vocab);
        return 1;
    }
    df_session_opts so;
    serve_session_opts(S, &so);
    S->end_of_msg = tokenizer_special_id(S->tok, "<|end_of_msg|>");
    find_turn_opens(S);
    if (chat_parser_new(S->tok, 1, &S->parser, &err)) {
        fprintf(stderr, "deltafin: %s\n", err.msg);
        return 1;
    }
    if (open_seats(S, &so, parallel)) return 1;
    S->n_ctx = so.n_ctx;
    server_set_caps(S);
    S->pc_ids = xmalloc((size_t)S->n_ctx * sizeof *S->pc_ids);
    if (S->pcache_dir) {
        struct stat st;
        if (mkdir(S->pcache_dir, 0755) && errno != EEXIST) die("--prompt-cache %s: %s", S->pcache_dir, strerror(errno));
        if (stat(S->pcache_dir, &st) || !S_ISDIR(st.st_mode)) die("--prompt-cache %s is not a directory", S->pcache_dir);
        pcache_init(S);
    }
    df_engine_stats(S->eng, &S->stats);
    sampler_init(&S->smp, S->info.vocab, 0, 1, 0, 0);
    S->dr = open_drafter(&S->a, S->info.vocab, S->n_ctx);
    for (int i = 0; i < S->n_seats; i++)
        gen_from_args(&S->seats[i].gl, &S->a, S->eng, S->seats[i].s, &S->smp, S->dr);
    S->dcap = tok_decoder_max_out(S->tok) + 16;
    S->dbuf = xmalloc(S->dcap);
    pthread_t worker;
    if (pthread_create(&worker, NULL, worker_main, S)) die("cannot start the worker thread");
    atomic_store(&S->ready, 1);
    fprintf(stderr, "deltafin: ready: model %s, context %d, %d conversation%s kept, queue %d\n", S->name, S->n_ctx,
            S->n_seats, S->n_seats == 1 ? "" : "s", S->queue_max);

    int sig = 0;
    sigwait(&sigs, &sig);
    while (sig == SIGPIPE) sigwait(&sigs, &sig);
    serve_stop(S, d, worker);
    free(rest);
    return 0;
}
