/* generate.h - the one generation loop (L4), used by `run`, `chat` and
 * `serve`: sample the next token, hand it to the front end, evaluate it,
 * and, with a drafter, speculative decoding verified exactly.
 *
 * A step with drafts: the drafter proposes d1..dk to follow the history;
 * the session is marked (df_session_mark) and evaluates [last, d1..dk] as
 * one pass of k+1 rows with every row's logits; row i decides the token
 * after d_i (sampler_verify: greedy = its argmax; sampled = the rejection
 * rule), the longest run of drafts equal to those decisions is kept, plus
 * the target's own token after it, and the session is truncated back to
 * what was kept.  Because the engine's logits do not depend on the batch
 * width and a truncated session is bit for bit the one that never saw the
 * dropped rows, every token and every logit row is the one drafts-off
 * decoding gives (greedy).  Sampling keeps the output distribution, not
 * the draws.
 *
 * Choosing k (0..draft_max) each step, from measurement: the seconds of a
 * pass of T rows (an average per T, decayed, including the pass's mark and
 * truncation; a width is tried only after the one below it was measured,
 * and unmeasured widths are estimated from the measured ones), the
 * drafter's acceptance per draft (decayed) and its seconds per proposed
 * id.  The k maximising expected tokens per second is taken; k = 0 when
 * drafts do not pay, and then one draft is tried after 64 steps (8 when the
 * drafter is right more often than not), then after twice as many each
 * time drafting still does not pay, so the estimates follow the disk, the
 * cache and a noisy machine.  draft_k > 0 fixes k (tests and benchmarks).
 *
 * The acceptance starts at 0 (a drafter has to earn its first draft): a
 * drafter whose proposals cost under 1 % of a one-row pass (the model-free
 * ones) is asked for a *shadow* proposal at each step that does not draft,
 * which is never verified but scored against the tokens that follow, with
 * the same weight as a verified draft.  So a drafter that would be wrong
 * costs no verify pass to find out, and one that would be right starts
 * drafting within a step or two.  A costly drafter (a draft model) is
 * scored only by its real drafts: the first comes at the 64-step retry.
 *
 * The session and the loop agree on a history: gen_history() is every id
 * the caller has been given (prompt included).  The session holds them all
 * but the last returned one (`pending`, evaluated by the next step), and
 * may hold verified drafts not yet returned; gen_settle puts the session
 * exactly at the history (with or without the last token).  Nothing is
 * allocated after gen_init: the history has room for the session's context.
 */
#ifndef DF_GENERATE_H
#define DF_GENERATE_H

#include "ab_timing.h"
#include "engine.h"
#include "sampler.h"

#include <stddef.h>
#include <stdint.h>

#define GEN_MAX_DRAFT 16

/* A drafter proposes up to k ids to follow hist[0..n); returns how many
 * (0..k), or -1 with err set.  Drafters are in draft.h. */
typedef struct df_drafter {
    const char *name;
    int (*propose)(struct df_drafter *d, const int32_t *hist, size_t n, int32_t *out, int k, df_error *err);
    /* the history after a prompt, before any proposal (may be NULL): a
     * draft model evaluates the prompt then, as part of prompt processing */
    int (*sync)(struct df_drafter *d, const int32_t *hist, size_t n, df_error *err);
    void (*reset)(struct df_drafter *d);     /* a new conversation (may be NULL) */
    void (*destroy)(struct df_drafter *d);
    void *state;
} df_drafter;

/* A constraint on the tokens (a grammar, json_schema.h): before a token is
 * chosen from a row of logits, mask() sets the logits of every token that
 * cannot follow to -infinity (in place); once chosen, accept() advances it.
 * Rows are masked in order and only up to the first rejected draft, so the
 * state always follows the decided tokens: a draft the constraint refuses
 * is a rejected draft, never a sampled token, and the tokens and logits are
 * those drafts-off decoding gives. */
typedef struct gen_constraint {
    int (*mask)(void *ctx, float *logits, df_error *err);
    int (*accept)(void *ctx, int32_t id, df_error *err);
    void *ctx;
} gen_constraint;

typedef struct gen_opts {
    int draft_k;      /* > 0: exactly this many drafts per step (when the drafter has them) */
    int draft_max;    /* the most drafts per step (0 = 8, at most GEN_MAX_DRAFT) */
} gen_opts;

typedef struct gen_stats {
    uint64_t passes;          /* target passes that produced tokens (decode steps and verify passes) */
    int64_t first_draft_pass; /* index (from 0) among those of the first with drafts; -1 none yet */
    uint64_t draft_passes;    /* of those, with drafts */
    uint64_t proposed, accepted;
    uint64_t emitted;         /* tokens given to the caller */
    uint64_t expert_bytes;    /* expert bytes read by those passes */
    double draft_sec;         /* time in the drafter */
    int last_k;               /* k of the last step */
    int guard_rounds;         /* the guard's rounds (draft_guard) */
    int guard_on;             /* its last choice: 1 drafts allowed, 0 held off, -1 none yet */
    double guard_ms[2];       /* its last round's ms per token, [without drafts, with] */
    uint64_t shadow_scored;   /* shadow proposals scored against the tokens that followed */
    uint64_t shadow_proposed, shadow_right; /* their ids, and those that were right (in a run from the first) */
} gen_stats;

/* Do drafts pay, in time?  The cost model picks k from estimates; this
 * guard checks the outcome: tokens are timed in windows of at least
 * DG_WINDOW tokens with drafting allowed or not, in a counterbalanced order
 * (ABBA ABBA, the next round starting with the other arm), window
 * boundaries only between steps; after a round of DG_WINDOWS windows,
 * drafting is held off when its tokens cost more than DG_MARGIN more time
 * than plain steps' tokens, allowed otherwise, for DG_HOLD tokens (DG_HOLD_FIRST
 * after the first round; doubled after each round that decides the same as
 * the last, up to DG_HOLD_MAX);
 * then it is measured again.  Over a run where drafts lose, the loss is the
 * measuring windows' share of the drafts' own loss: about half a round's
 * tokens in every round plus hold, under 2 % of it once the hold has grown.
 * Pure (time is fed in; ab_timing.h); drafting never changes tokens, only speed. */
#define DG_WINDOW 8
#define DG_WINDOWS AB_WINDOWS
#define DG_HOLD_FIRST 128 /* the first round's verdict is the least sure: the drafter and the
                             cost model are still warming up */
#define DG_HOLD 1024
#define DG_HOLD_MAX 16384
#define DG_MARGIN 0.01

typedef ab_timing draft_guard; /* rule: DG_* above; ms per token = 1e3 * mean[] */

void draft_guard_init(draft_guard *d);
/* Whether the next step may draft. */
int draft_guard_on(const draft_guard *d);
/* A step that ran with draft_guard_on(d) emitted tokens in sec; returns 1
 * when it completed a round. */
int draft_guard_step(draft_guard *d, int tokens, double sec);

typedef struct gen_loop {
    df_session *s;
    df_engine *eng;
    sampler *smp;
    df_drafter *dr;
    int V, kmax, k_fixed;
    float *logits;            /* [kmax + 1][V] */
    int32_t *hist;            /* [cap]: ids given to the caller, prompt included */
    size_t n_hist, cap;
    int32_t ids[GEN_MAX_DRAFT + 1];
    /* tokens decided but not yet returned, with the logits row each was chosen from */
    int32_t queue[GEN_MAX_DRAFT + 1];
    int qrow[GEN_MAX_DRAFT + 1];
    int q_head, q_len;
    int has_pending;          /* the last returned id is not in the session yet */
    int fresh;                /* logits row `row` is the next token's distribution */
    int row;                  /* the logits row of the last returned token (or of the next, when fresh) */
    int base_pos;             /* session position where logits row 0 was evaluated */
    /* the cost model */
    double t_pass[GEN_MAX_DRAFT + 2]; /* seconds per pass of T rows (decayed mean), 0 = unmeasured */
    unsigned t_count[GEN_MAX_DRAFT + 2]; /* passes of T rows measured */
    double acc, acc_w;        /* acceptance per drafted id (decayed mean) and its weight */
    double draft_tok_sec;     /* drafter seconds per proposed id (decayed) */
    double sh_cost;           /* its recent cheapest seconds per id (shadow proposals' gate) */
    uint64_t sh_retry_at, sh_retry_wait; /* past the gate: the next re-measuring step, and the wait */
    uint64_t step_no;
    uint64_t explore_at, explore_wait; /* the next retry of drafting when it does not pay */
    draft_guard guard;        /* the outcome check (not with --draft-k) */
    /* a shadow proposal waiting to be scored: sh_n ids proposed to follow hist[0..sh_at) */
    int32_t sh_ids[GEN_MAX_DRAFT];
    int sh_n;
    int sh_done;              /* its first ids already observed right (scored as they are decided) */
    size_t sh_at;
    gen_stats st;
    gen_constraint con;       /* con.mask NULL: none (gen_constrain) */
} gen_loop;

int gen_init(gen_loop *g, df_engine *eng, df_session *s, sampler *smp, df_drafter *dr, const gen_opts *o,
             df_error *err);

/* What the cost model and the guard have learned: a gen_loop keeps it
 * across answers (gen_reset leaves it); gen_memory_get / gen_memory_put
 * carry it across runs (the front ends' --spec-state file).  A loop given an
 * earlier run's memory drafts from its first steps when drafts paid there,
 * and holds them off when they did not, instead of measuring again.  It
 * never changes a token, only when drafts are tried. */
typedef struct gen_memory {
    int kmax;                             /* widths 1 .. kmax + 1 below */
    double t_pass[GEN_MAX_DRAFT + 2];
    unsigned t_count[GEN_MAX_DRAFT + 2];
    double acc, acc_w, draft_tok_sec, sh_cost;
    /* the guard, between rounds: the arm held and for how many more tokens */
    uint64_t guard_hold, guard_hold_len;
    int guard_choice, guard_rounds, guard_last;
    double guard_mean[2];
} gen_memory;
void gen_memory_get(const gen_loop *g, gen_memory *m);
/* Takes what fits this loop (widths up to its kmax + 1); values out of
 * range are ignored. */
void gen_memory_put(gen_loop *g, const gen_memory *m);
void gen_free(gen_loop *g);
/* Forget the history and reset the session (and the drafter). */
void gen_reset(gen_loop *g);
/* Evaluate ids (appended to the history) after settling the session at the
 * history; the next token is then sampled from the last row's logits. */
int gen_feed(gen_loop *g, const int32_t *ids, size_t n, df_error *err);
/* The session already evaluated ids (appended to the history, which must
 * be what the session holds) and `last` is its last row's logits. */
void gen_prime(gen_loop *g, const int32_t *ids, size_t n, const float *last);
/* The session holds exactly ids (loaded from a session file): they become
 * the history; the next step must feed more ids. */
void gen_resume(gen_loop *g, const int32_t *ids, size_t n);
/* The next token into *tok; gen_logits() is the row it was chosen from. */
int gen_next(gen_loop *g, int32_t *tok, df_error *err);
const float *gen_logits(const gen_loop *g);
/* Put the session at the history (verified drafts the caller did not take
 * are taken back): with keep_last the last returned token is evaluated too
 * and gen_logits() is the distribution after it; without, it is left for
 * the next step when it was not evaluated yet. */
int gen_settle(gen_loop *g, int keep_last, df_error *err);
const int32_t *gen_history(const gen_loop *g, size_t *n);
/* Constrain the tokens from the next one decided on (NULL: no longer). */
void gen_constrain(gen_loop *g, const gen_constraint *c);
/* Drop history entries past n (n <= the history; the session follows). */
int gen_rewind(gen_loop *g, size_t n, df_error *err);

#endif
