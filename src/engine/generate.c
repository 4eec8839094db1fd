/* generate.c - see generate.h. */
#include "generate.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* decay of the measured averages: about the last 20 observations count */
#define DECAY 0.95
/* drafting is retried (one draft) after this many steps when the model
 * says it does not pay (EXPLORE_SOON when the drafter is right more often
 * than not: then a wider pass measured slow once, by noise, is measured
 * again soon); the wait doubles after each retry (up to EXPLORE_MAX) and
 * is reset when the model finds drafting pays again */
#define EXPLORE_EVERY 64
#define EXPLORE_SOON 8
#define EXPLORE_MAX 4096
/* the acceptance prior (a weight of two observations at 0: no draft before
 * the drafter has been right) */
#define ACC_PRIOR 0.0
#define ACC_PRIOR_W 2.0
/* shadow proposals while they cost at most this share of a one-row pass;
 * past it, one id is asked again after SHADOW_RETRY steps, the wait
 * doubling up to SHADOW_RETRY_MAX */
#define SHADOW_SHARE 0.01
#define SHADOW_RETRY 16
#define SHADOW_RETRY_MAX 1024

void draft_guard_init(draft_guard *d)
{
    const ab_rule rule = {.window = DG_WINDOW, .hold_first = DG_HOLD_FIRST, .hold = DG_HOLD, .hold_max = DG_HOLD_MAX,
                          .off_scale = 1.0 + DG_MARGIN, .on_scale = 1.0};
    ab_timing_init(d, &rule);
}

int draft_guard_on(const draft_guard *d) { return ab_timing_on(d); }

int draft_guard_step(draft_guard *d, int tokens, double sec) { return ab_timing_step(d, tokens, sec); }

int gen_init(gen_loop *g, df_engine *eng, df_session *s, sampler *smp, df_drafter *dr, const gen_opts *o,
             df_error *err)
{
    memset(g, 0, sizeof *g);
    df_model_info info;
    df_engine_info(eng, &info);
    g->eng = eng;
    g->s = s;
    g->smp = smp;
    g->dr = dr;
    g->V = info.vocab;
    int kmax = o && o->draft_max > 0 ? o->draft_max : 8;
    if (o && o->draft_k > kmax) kmax = o->draft_k;
    if (kmax > GEN_MAX_DRAFT)
        return df_err_set(err, DF_ERR_ARG, -1, "at most %d drafts per step (asked for %d)", GEN_MAX_DRAFT, kmax);
    if (!dr) kmax = 0;
    if (kmax + 1 > df_session_max_batch(s)) kmax = df_session_max_batch(s) - 1;
    g->kmax = kmax;
    g->k_fixed = o && o->draft_k > 0 ? o->draft_k : 0;
    if (g->k_fixed > kmax) g->k_fixed = kmax;
    g->logits = xmalloc((size_t)(kmax + 1) * (size_t)g->V * sizeof *g->logits);
    g->cap = (size_t)df_session_n_ctx(s) + (size_t)kmax + 2;
    g->hist = xmalloc(g->cap * sizeof *g->hist);
    g->acc = ACC_PRIOR;
    g->acc_w = ACC_PRIOR_W;
    g->explore_at = EXPLORE_EVERY;
    g->st.last_k = 0;
    draft_guard_init(&g->guard);
    g->st.guard_on = -1;
    g->st.first_draft_pass = -1;
    return 0;
}

void gen_memory_get(const gen_loop *g, gen_memory *m)
{
    memset(m, 0, sizeof *m);
    m->kmax = g->kmax;
    for (int T = 1; T <= g->kmax + 1; T++) m->t_pass[T] = g->t_pass[T], m->t_count[T] = g->t_count[T];
    m->acc = g->acc;
    m->acc_w = g->acc_w;
    m->draft_tok_sec = g->draft_tok_sec;
    m->sh_cost = g->sh_cost;
    /* a round in progress is not kept: the next run starts between rounds */
    m->guard_hold = g->guard.hold;
    m->guard_hold_len = g->guard.hold_len;
    m->guard_choice = g->guard.choice;
    m->guard_rounds = g->guard.rounds;
    m->guard_last = g->guard.last;
    m->guard_mean[0] = g->guard.mean[0];
    m->guard_mean[1] = g->guard.mean[1];
}

static int finite_nonneg(double x) { return x >= 0 && x < 1e9; }

void gen_memory_put(gen_loop *g, const gen_memory *m)
{
    for (int T = 1; T <= g->kmax + 1 && T <= m->kmax + 1 && T < GEN_MAX_DRAFT + 2; T++)
        if (finite_nonneg(m->t_pass[T])) g->t_pass[T] = m->t_pass[T], g->t_count[T] = m->t_count[T];
    if (m->acc >= 0 && m->acc <= 1 && finite_nonneg(m->acc_w)) g->acc = m->acc, g->acc_w = m->acc_w;
    if (finite_nonneg(m->draft_tok_sec)) g->draft_tok_sec = m->draft_tok_sec;
    if (finite_nonneg(m->sh_cost)) g->sh_cost = m->sh_cost;
    if (m->guard_rounds > 0 && (m->guard_choice == 0 || m->guard_choice == 1) && m->guard_hold_len <= DG_HOLD_MAX) {
        draft_guard_init(&g->guard);
        g->guard.hold = m->guard_hold < m->guard_hold_len ? m->guard_hold : m->guard_hold_len;
        g->guard.hold_len = m->guard_hold_len;
        g->guard.choice = m->guard_choice;
        g->guard.rounds = m->guard_rounds;
        g->guard.last = m->guard_last;
        g->guard.mean[0] = m->guard_mean[0];
        g->guard.mean[1] = m->guard_mean[1];
        g->st.guard_rounds = m->guard_rounds;
        g->st.guard_on = m->guard_last;
    }
}

void gen_constrain(gen_loop *g, const gen_constraint *c)
{
    if (c) g->con = *c;
    else memset(&g->con, 0, sizeof g->con);
}

void gen_free(gen_loop *g)
{
    free(g->logits);
    free(g->hist);
    memset(g, 0, sizeof *g);
}

void gen_reset(gen_loop *g)
{
    df_session_reset(g->s);
    g->n_hist = 0;
    g->q_len = g->q_head = 0;
    g->has_pending = g->fresh = 0;
    g->sh_n = 0;
    if (g->dr && g->dr->reset) g->dr->reset(g->dr);
}

const float *gen_logits(const gen_loop *g) { return g->logits + (size_t)g->row * (size_t)g->V; }

const int32_t *gen_history(const gen_loop *g, size_t *n)
{
    *n = g->n_hist;
    return g->hist;
}

static int eval(gen_loop *g, const int32_t *ids, size_t n, int all_rows, df_error *err)
{
    return df_session_eval(g->s, ids, (int)n, g->logits, all_rows, err);
}

/* Take back verified drafts the caller did not take: the session then
 * holds the history, or the history but its last id. */
static int drop_queue(gen_loop *g, df_error *err)
{
    g->q_len = g->q_head = 0;
    g->sh_n = 0; /* the history may change under a shadow proposal */
    if ((size_t)df_session_pos(g->s) > g->n_hist && df_session_truncate(g->s, (int)g->n_hist, err)) return -1;
    return 0;
}

/* Let the drafter take in a prompt (its time is drafting time, not a
 * proposal's). */
static int sync_drafter(gen_loop *g, df_error *err)
{
    if (!g->dr || !g->dr->sync || !g->kmax) return 0;
    double t0 = now_sec();
    int rc = g->dr->sync(g->dr, g->hist, g->n_hist, err);
    double dt = now_sec() - t0;
    g->st.draft_sec += dt;
    /* a first estimate of the drafter's cost per id (a draft model's
     * prompt rows): enough to tell a costly drafter from a cheap one before
     * its first proposal */
    if (!rc && g->sh_cost <= 0 && g->n_hist) g->sh_cost = dt / (double)g->n_hist;
    return rc;
}

int gen_settle(gen_loop *g, int keep_last, df_error *err)
{
    int next_row = g->q_len ? g->qrow[g->q_head] : -1;
    if (drop_queue(g, err)) return -1;
    size_t pos = (size_t)df_session_pos(g->s);
    if (pos >= g->n_hist) {
        /* the last id is evaluated: the row the next one would come from */
        g->has_pending = 0;
        if (next_row >= 0) {
            g->fresh = 1;
            g->row = next_row;
        }
        return 0;
    }
    if (!keep_last) {
        g->has_pending = 1;
        g->fresh = 0;
        return 0;
    }
    if (eval(g, g->hist + pos, g->n_hist - pos, 0, err)) return -1;
    g->fresh = 1;
    g->row = 0;
    g->has_pending = 0;
    return 0;
}

int gen_rewind(gen_loop *g, size_t n, df_error *err)
{
    if (n >= g->n_hist) return 0;
    if (drop_queue(g, err)) return -1;
    if (n < (size_t)df_session_pos(g->s) && df_session_truncate(g->s, (int)n, err)) return -1;
    g->n_hist = n;
    g->has_pending = 0;
    g->fresh = 0;
    return 0;
}

int gen_feed(gen_loop *g, const int32_t *ids, size_t n, df_error *err)
{
    if (!n) return 0;
    if (drop_queue(g, err)) return -1;
    if (g->n_hist + n > g->cap)
        return df_err_set(err, DF_ERR_LIMIT, -1, "context full: %zu tokens held, %zu more, capacity %d", g->n_hist, n,
                          df_session_n_ctx(g->s));
    size_t pos = (size_t)df_session_pos(g->s);
    memcpy(g->hist + g->n_hist, ids, n * sizeof *ids);
    size_t n_hist = g->n_hist + n;
    if (eval(g, g->hist + pos, n_hist - pos, 0, err)) return -1;
    g->n_hist = n_hist;
    g->fresh = 1;
    g->row = 0;
    g->has_pending = 0;
    return sync_drafter(g, err);
}

void gen_prime(gen_loop *g, const int32_t *ids, size_t n, const float *last)
{
    if (g->n_hist + n > g->cap) n = g->cap - g->n_hist;
    memcpy(g->hist + g->n_hist, ids, n * sizeof *ids);
    g->n_hist += n;
    memcpy(g->logits, last, (size_t)g->V * sizeof *last);
    g->q_len = g->q_head = 0;
    g->sh_n = 0;
    g->fresh = 1;
    g->row = 0;
    g->has_pending = 0;
    df_error err = {0};
    sync_drafter(g, &err); /* a failure here shows again at the first proposal */
}

void gen_resume(gen_loop *g, const int32_t *ids, size_t n)
{
    if (n > g->cap) n = g->cap;
    memcpy(g->hist, ids, n * sizeof *ids);
    g->n_hist = n;
    g->q_len = g->q_head = 0;
    g->sh_n = 0;
    g->fresh = 0;
    g->has_pending = 0;
}

/* Estimated seconds of a pass of T rows: its measured average, else a line
 * through the measured widths; with none measured beyond one row, each row
 * is taken to add half a one-row pass (when experts stream, a row's own
 * experts are most of a pass), so a drafter must be right more often than
 * not before the first wider pass is paid for. */
static double est_pass(const gen_loop *g, int T)
{
    if (g->t_pass[T] > 0) return g->t_pass[T];
    double t1 = g->t_pass[1];
    int far = 0;
    for (int j = 2; j <= g->kmax + 1; j++)
        if (g->t_pass[j] > 0) far = j;
    double slope = far ? (g->t_pass[far] - t1) / (double)(far - 1) : 0.5 * t1;
    if (slope < 0) slope = 0;
    return t1 + slope * (double)(T - 1);
}

static int choose_k(gen_loop *g)
{
    if (!g->dr || !g->kmax) return 0;
    if (g->k_fixed) return g->k_fixed;
    if (!draft_guard_on(&g->guard)) return 0; /* drafts measured slower: held off */
    if (g->t_pass[1] <= 0) return 0; /* measure a plain step first */
    double a = g->acc, best_rate = 0;
    int best = 0;
    /* widths are tried one more at a time: an unmeasured width costs at
     * most one row more than a measured one */
    int reach = 1;
    for (int T = 2; T <= g->kmax + 1; T++)
        if (g->t_pass[T] > 0) reach = T;
    int kcap = reach < g->kmax ? reach : g->kmax;
    for (int k = 0; k <= kcap; k++) {
        double tokens = 0, p = 1;
        for (int i = 0; i <= k; i++, p *= a) tokens += p;
        double rate = tokens / (est_pass(g, k + 1) + (double)k * g->draft_tok_sec);
        if (rate > best_rate * 1.0000001) {
            best_rate = rate;
            best = k;
        }
    }
    /* now and then draft anyway, so the acceptance and the costs stay measured */
    if (best) {
        g->explore_wait = 0;
    } else if (g->step_no >= g->explore_at) {
        best = 1;
        uint64_t first = a >= 0.5 ? EXPLORE_SOON : EXPLORE_EVERY;
        g->explore_wait = g->explore_wait ? (g->explore_wait * 2 < EXPLORE_MAX ? g->explore_wait * 2 : EXPLORE_MAX)
                                          : first;
        g->explore_at = g->step_no + g->explore_wait;
    } else if (!g->explore_wait && a >= 0.5 && g->explore_at > g->step_no + EXPLORE_SOON) {
        g->explore_at = g->step_no + EXPLORE_SOON; /* no retry since drafting last paid: soon */
    }
    return best;
}

/* One observation of the drafter: a of nd proposed ids were right (in a run
 * from the first).  Each right id is a success, the first wrong one a
 * failure; later ids are not observed. */
static void observe_part(gen_loop *g, int a, int failed, int fresh)
{
    double trials = (double)a + failed;
    double w = (fresh ? DECAY : 1.0) * g->acc_w; /* one decay a proposal, however many parts */
    g->acc = (w * g->acc + (double)a) / (w + trials);
    g->acc_w = w + trials;
}

static void observe(gen_loop *g, int a, int nd) { observe_part(g, a, a < nd, 1); }

/* Score the shadow proposal against the tokens that followed it, as they
 * are decided: each id found right is observed then (a long proposal that
 * is right moves the acceptance from its first token on, not after all of
 * its tokens), the first wrong one ends it. */
static void score_shadow(gen_loop *g)
{
    /* the ids known: the history, then the queue of decided ones */
    size_t known = g->n_hist + (size_t)g->q_len;
    if (!g->sh_n || known <= g->sh_at) return;
    size_t seen = known - g->sh_at;
    int a = g->sh_done;
    for (; a < g->sh_n && (size_t)a < seen; a++) {
        size_t i = g->sh_at + (size_t)a;
        int32_t x = i < g->n_hist ? g->hist[i] : g->queue[g->q_head + (int)(i - g->n_hist)];
        if (x != g->sh_ids[a]) break;
    }
    int failed = a < g->sh_n && (size_t)a < seen;
    if (a > g->sh_done || failed) observe_part(g, a - g->sh_done, failed, g->sh_done == 0);
    if (!failed && a < g->sh_n) { /* right so far: the rest with the next tokens */
        g->sh_done = a;
        return;
    }
    g->st.shadow_scored++;
    g->st.shadow_proposed += (uint64_t)g->sh_n;
    g->st.shadow_right += (uint64_t)a;
    g->sh_n = 0;
}

/* A step without drafts: ask a cheap drafter what it would have proposed. */
static int shadow_propose(gen_loop *g, df_error *err)
{
    if (g->sh_n || g->k_fixed || !g->dr || !g->kmax || !draft_guard_on(&g->guard)) return 0;
    int retry = 0;
    if (g->sh_cost > 0 && g->sh_cost * g->kmax > SHADOW_SHARE * g->t_pass[1]) {
        /* too costly to shadow: measured again now and then (one id, the
         * wait doubling), so that one proposal the OS preempted does not
         * end shadowing for the rest of the answer */
        if (g->step_no < g->sh_retry_at) return 0;
        g->sh_retry_wait = !g->sh_retry_wait ? SHADOW_RETRY
                           : g->sh_retry_wait * 2 < SHADOW_RETRY_MAX ? g->sh_retry_wait * 2 : SHADOW_RETRY_MAX;
        g->sh_retry_at = g->step_no + g->sh_retry_wait;
        retry = 1;
    } else {
        g->sh_retry_wait = 0;
    }
    /* the history as the next step will see it: with the token this step decided */
    size_t at = g->n_hist + (size_t)g->q_len;
    if (at > g->cap) return 0;
    for (int i = 0; i < g->q_len; i++) g->hist[g->n_hist + (size_t)i] = g->queue[g->q_head + i];
    /* while its cost is unknown, one id: a costly drafter then costs one
     * of its passes to find out */
    int want = g->sh_cost > 0 && !retry ? g->kmax : 1;
    double t0 = now_sec();
    int n = g->dr->propose(g->dr, g->hist, at, g->sh_ids, want, err);
    double dt = now_sec() - t0;
    if (n < 0) return -1;
    g->st.draft_sec += dt;
    if (n > want) n = want;
    /* the cheapest recent cost per id, rising at most 10 % a proposal: a
     * proposal preempted by the OS does not end shadowing, a drafter whose
     * cost grows (a longer history to search) still shows it.  An empty
     * proposal costs its time as one id: a drafter that seldom proposes
     * but is costly to ask is not asked at every step for nothing */
    double c = dt / (n > 0 ? n : 1);
    g->sh_cost = g->sh_cost > 0 && c > g->sh_cost * 1.1 ? g->sh_cost * 1.1 : c;
    if (n > 0) {
        g->draft_tok_sec = g->draft_tok_sec > 0 ? DECAY * g->draft_tok_sec + (1 - DECAY) * dt / n : dt / n;
        g->sh_n = n;
        g->sh_done = 0;
        g->sh_at = at;
    }
    return 0;
}

static void push(gen_loop *g, int32_t tok, int row)
{
    int at = g->q_head + g->q_len++;
    g->queue[at] = tok;
    g->qrow[at] = row;
}

/* One target pass: [pending, drafts...] in, the decided tokens queued. */
static int step(gen_loop *g, df_error *err)
{
    int guarded = g->dr && g->kmax && !g->k_fixed;
    double t_step = now_sec();
    score_shadow(g);
    int k = choose_k(g);
    if (k > 0) g->sh_n = 0; /* real drafts are observed instead */
    g->step_no++;
    int nd = 0;
    g->ids[0] = g->hist[g->n_hist - 1];
    if (k > 0) {
        double t0 = now_sec();
        nd = g->dr->propose(g->dr, g->hist, g->n_hist, g->ids + 1, k, err);
        double dt = now_sec() - t0;
        if (nd < 0) return -1;
        if (nd > k) nd = k;
        g->st.draft_sec += dt;
        if (nd > 0) g->draft_tok_sec = g->draft_tok_sec > 0 ? DECAY * g->draft_tok_sec + (1 - DECAY) * dt / nd : dt / nd;
    }
    int pos0 = df_session_pos(g->s);
    if (pos0 + nd + 1 > df_session_n_ctx(g->s)) nd = df_session_n_ctx(g->s) - pos0 - 1;
    if (nd < 0) nd = 0;
    df_stats st0, st1;
    df_engine_stats(g->eng, &st0);
    /* the pass's cost: the mark (a copy of the KDA state), the rows, the
     * truncation (a replay) */
    double t0 = now_sec();
    if (nd > 0 && df_session_mark(g->s, err)) return -1;
    if (eval(g, g->ids, (size_t)nd + 1, 1, err)) return -1;
    df_engine_stats(g->eng, &st1);
    g->q_head = g->q_len = 0;
    int a = 0;
    for (int i = 0; i <= nd; i++) {
        float *row = g->logits + (size_t)i * (size_t)g->V;
        if (g->con.mask && g->con.mask(g->con.ctx, row, err)) return -1;
        int ok = 0;
        int32_t x = i == nd ? sampler_next(g->smp, row) : sampler_verify(g->smp, row, g->ids[i + 1], &ok);
        if (g->con.accept && g->con.accept(g->con.ctx, x, err)) return -1;
        push(g, x, i);
        if (i == nd || !ok) break;
        a++;
    }
    if (nd > 0 && a < nd && df_session_truncate(g->s, pos0 + 1 + a, err)) return -1;
    double dt = now_sec() - t0;
    /* a mean over the first measurements, then decayed: one slow pass (a
     * noisy neighbour) weighs no more than any other */
    double *tp = &g->t_pass[nd + 1];
    unsigned *tn = &g->t_count[nd + 1];
    double w = ++*tn < 1.0 / (1 - DECAY) ? 1.0 / *tn : 1 - DECAY;
    *tp = *tp > 0 ? (1 - w) * *tp + w * dt : dt;
    g->has_pending = 0;
    g->fresh = 0;
    g->st.passes++;
    g->st.expert_bytes += st1.expert_bytes_read - st0.expert_bytes_read;
    g->st.last_k = nd;
    if (nd > 0) {
        if (g->st.first_draft_pass < 0) g->st.first_draft_pass = (int64_t)g->st.passes - 1;
        g->st.draft_passes++;
        g->st.proposed += (uint64_t)nd;
        g->st.accepted += (uint64_t)a;
        observe(g, a, nd);
    } else if (k == 0) {
        score_shadow(g);
        if (shadow_propose(g, err)) return -1;
    }
    if (guarded && draft_guard_step(&g->guard, a + 1, now_sec() - t_step)) {
        g->st.guard_rounds = g->guard.rounds;
        g->st.guard_on = g->guard.last;
        g->st.guard_ms[0] = 1e3 * g->guard.mean[0];
        g->st.guard_ms[1] = 1e3 * g->guard.mean[1];
        char gev[160];
        snprintf(gev, sizeof gev, "{\"draft_guard\":{\"round\":%d,\"drafts\":\"%s\",\"ms_per_token_off\":%.3f,"
                 "\"ms_per_token_on\":%.3f}}",
                 g->guard.rounds, g->guard.last ? "allowed" : "held off", 1e3 * g->guard.mean[0], 1e3 * g->guard.mean[1]);
        df_engine_event(g->eng, gev);
    }
    if (!g->dr) return 0;
    char ev[256];
    snprintf(ev, sizeof ev,
             "{\"draft\":{\"k\":%d,\"proposed\":%d,\"accepted\":%d,\"tokens\":%d,\"pass_ms\":%.3f,"
             "\"expert_bytes\":%llu,\"acceptance\":%.4f}}",
             k, nd, a, a + 1, 1e3 * dt, (unsigned long long)(st1.expert_bytes_read - st0.expert_bytes_read), g->acc);
    df_engine_event(g->eng, ev);
    return 0;
}

int gen_next(gen_loop *g, int32_t *tok, df_error *err)
{
    if (!g->q_len) {
        if (g->fresh) {
            /* the distribution after a prompt (or a settle): no pass needed */
            float *row = g->logits + (size_t)g->row * (size_t)g->V;
            if (g->con.mask && g->con.mask(g->con.ctx, row, err)) return -1;
            int32_t x = sampler_next(g->smp, row);
            if (g->con.accept && g->con.accept(g->con.ctx, x, err)) return -1;
            if (g->n_hist >= g->cap) return df_err_set(err, DF_ERR_LIMIT, -1, "context full");
            g->hist[g->n_hist++] = x;
            g->fresh = 0;
            g->has_pending = 1;
            g->st.emitted++;
            *tok = x;
            return 0;
        }
        if (!g->has_pending || !g->n_hist)
            return df_err_set(err, DF_ERR_ARG, -1, "nothing to generate from: feed a prompt first");
        if (df_session_pos(g->s) + 1 > df_session_n_ctx(g->s))
            return df_err_set(err, DF_ERR_LIMIT, -1, "context full: %d tokens held, capacity %d",
                              df_session_pos(g->s), df_session_n_ctx(g->s));
        if (step(g, err)) return -1;
    }
    int at = g->q_head++;
    g->q_len--;
    int32_t x = g->queue[at];
    if (g->n_hist >= g->cap) return df_err_set(err, DF_ERR_LIMIT, -1, "context full");
    g->hist[g->n_hist++] = x;
    g->row = g->qrow[at];
    /* a queued token is in the session when a later one is queued after it */
    g->has_pending = g->q_len == 0;
    g->fresh = 0;
    g->st.emitted++;
    *tok = x;
    return 0;
}
