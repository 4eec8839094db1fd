/* session.c - a session's buffers: every buffer the token loop needs is
 * sized here, from the config, n_ctx and max_batch, through one ALLOC macro
 * so the planner sizes a session with the same code (a dry run); sessions
 * take their bytes from the plan's room.  Reset and the progress hook.
 */
#define _GNU_SOURCE
#include "heat.h"
#include "expert_fetch.h"
#include "plan.h"
#include "prefetch.h"
#include "engine_impl.h"
#include "expert_remote.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"
#include "schedule.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

/* rows a chunk's layer work takes at a time (df_session_opts.row_slice) */
#define SESSION_ROW_SLICE 256

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* Every session buffer goes through ALLOC, so the memory planner can size a
 * session with the same code (dry = 1 counts bytes and allocates nothing),
 * and every one is the backend's, with its role (model/ops.h buf_role). */
#define ALLOC(role, field, count)                                                                 \
    do {                                                                                          \
        size_t n_ = (size_t)(count);                                                              \
        if (!dry && !((field) = eng->bk.ops->alloc(&eng->bk, (role), n_ * sizeof *(field)))) goto nomem; \
        bytes += n_ * sizeof *(field);                                                            \
    } while (0)

/* A session's KDA state and conv history, in floats (all KDA layers). */
size_t kda_state_floats(const df_engine *eng)
{
    const k3_config *c = &eng->m.cfg;
    return (size_t)eng->m.n_kda * c->Hk * c->Dk * c->Dk;
}

size_t kda_hist_floats(const df_engine *eng)
{
    const k3_config *c = &eng->m.cfg;
    return (size_t)eng->m.n_kda * 3 * (size_t)(c->Wc > 1 ? c->Wc - 1 : 1) * c->P;
}

uint64_t checkpoint_bytes(const df_engine *eng)
{
    return (uint64_t)(kda_state_floats(eng) + kda_hist_floats(eng)) * sizeof(float);
}

/* The attention dump's part of a session (--dump-attention): its settings,
 * and the entries its buffers hold for T rows (0 without a dump). */
static size_t session_attn(df_session *s, const df_engine *eng, int T)
{
    if (!eng->attn_on) return 0;
    s->b.attn_on = eng->attn_on;
    s->b.attn_h0 = eng->attn_h0, s->b.attn_nh = eng->attn_nh, s->b.attn_top = eng->attn_top;
    return (size_t)T * (size_t)eng->attn_nh * (size_t)eng->attn_top;
}

int session_alloc(df_engine *eng, const df_session_opts *opts, int dry, df_session **out, size_t *state_bytes,
                  size_t *scratch_bytes, df_error *err)
{
    df_session_opts def;
    df_session_opts_default(&def);
    if (!opts) opts = &def;
    if (out) *out = NULL;
    const k3_config *c = &eng->m.cfg;
    int n_ctx = opts->n_ctx > 0 ? opts->n_ctx : def.n_ctx;
    int T = opts->max_batch > 0 ? opts->max_batch : eng->plan.max_batch > 0 ? eng->plan.max_batch : 32;
    if (T > 4096) return df_err_set(err, DF_ERR_ARG, -1, "max_batch %d is too large (at most 4096)", T);
    if (opts->row_slice < 0 || opts->row_slice > 4096)
        return df_err_set(err, DF_ERR_ARG, -1, "row_slice %d is outside [0, 4096]", opts->row_slice);
    /* a chunk's layer work runs in slices of Tb rows; only the residual
     * stream, the anchors and the routed-expert rows are per position */
    int Tb = opts->row_slice > 0 ? opts->row_slice : SESSION_ROW_SLICE;
    if (Tb > T) Tb = T;
    df_session *s = xcalloc(1, sizeof *s);
    s->eng = eng;
    s->b.n_ctx = n_ctx, s->b.max_batch = T, s->b.row_slice = Tb;
    size_t bytes = 0, h = (size_t)c->h;
    s->b.n_anchor_max = (c->NL + c->B - 1) / c->B;
    if (s->b.n_anchor_max > DBG_MAX_ANCHORS) {
        int n = s->b.n_anchor_max;
        free(s);
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%d AttnRes blocks exceed the supported %d", n,
                          DBG_MAX_ANCHORS);
    }
    size_t row_w = (size_t)c->Rkv + (size_t)c->dr;
    ALLOC(BUF_STATE, s->b.kda_S, kda_state_floats(eng));
    ALLOC(BUF_STATE, s->b.kda_hist, kda_hist_floats(eng));
    ALLOC(BUF_STATE, s->b.mla_cache, (size_t)eng->m.n_mla * (size_t)n_ctx * row_w);
    s->b.rb_mark = -1;
    if (opts->rollback_rows < 0 || opts->rollback_rows > 4096) {
        int r = opts->rollback_rows;
        df_session_free(s);
        return df_err_set(err, DF_ERR_ARG, -1, "rollback_rows %d is outside [0, 4096]", r);
    }
    if (opts->rollback_rows > 0) {
        s->b.rb_rows = opts->rollback_rows;
        ALLOC(BUF_STATE, s->b.kda_S0, kda_state_floats(eng));
        ALLOC(BUF_STATE, s->b.kda_hist0, kda_hist_floats(eng));
        ALLOC(BUF_STATE, s->b.kda_rec, (size_t)eng->m.n_kda * (size_t)s->b.rb_rows * (4 * (size_t)c->P + (size_t)c->Hk));
    }
    if (opts->checkpoints < 0 || opts->checkpoints > 64) {
        int k = opts->checkpoints;
        df_session_free(s);
        return df_err_set(err, DF_ERR_ARG, -1, "checkpoints %d is outside [0, 64]", k);
    }
    if (opts->checkpoints > 0) {
        s->b.n_ck = opts->checkpoints;
        ALLOC(BUF_STATE, s->b.ck_state, (size_t)s->b.n_ck * (kda_state_floats(eng) + kda_hist_floats(eng)));
        if (!dry) {
            s->b.ck_pos = xmalloc((size_t)s->b.n_ck * sizeof *s->b.ck_pos);
            s->b.ck_age = xcalloc((size_t)s->b.n_ck, sizeof *s->b.ck_age);
            s->b.ck_want = xmalloc((size_t)s->b.n_ck * sizeof *s->b.ck_want);
            s->b.ck_nS = kda_state_floats(eng);
            s->b.ck_nH = kda_hist_floats(eng);
            for (int i = 0; i < s->b.n_ck; i++) s->b.ck_pos[i] = s->b.ck_want[i] = -1;
        }
    }
    size_t state = bytes;
    ALLOC(BUF_RESIDUAL, s->b.H, (size_t)T * h);
    ALLOC(BUF_RESIDUAL, s->b.anchors, (size_t)s->b.n_anchor_max * T * h);
    ALLOC(BUF_ROWS, s->b.ain, (size_t)Tb * h);
    ALLOC(BUF_ROWS, s->b.xn, (size_t)Tb * h);
    ALLOC(BUF_ROWS, s->b.att, (size_t)Tb * h);
    ALLOC(BUF_ROWS, s->b.min, (size_t)Tb * h);
    ALLOC(BUF_ROWS, s->b.y, (size_t)Tb * h);
    ALLOC(BUF_ROWS, s->b.ffn, (size_t)Tb * h);
    size_t bw = h;
    bw = max_sz(bw, (size_t)c->P);
    bw = max_sz(bw, (size_t)c->Hm * (c->dn + c->dr));
    bw = max_sz(bw, (size_t)c->Hm * c->dv);
    bw = max_sz(bw, (size_t)c->Ns * c->I);
    bw = max_sz(bw, (size_t)c->E);
    bw = max_sz(bw, (size_t)c->Lt);
    /* the dense MLP's Dff-wide rows (the widest at K3's size: 33,792 against
     * 18,432) go through big0/big1 in blocks of rows (dense_mlp_forward), so
     * the six buffers need not be Dff wide for every position of a chunk */
    s->b.big_w = bw;
    s->b.big_cap = max_sz((size_t)Tb * bw, (size_t)c->Dff);
    ALLOC(BUF_WIDE, s->b.big0, s->b.big_cap);
    ALLOC(BUF_WIDE, s->b.big1, s->b.big_cap);
    ALLOC(BUF_WIDE, s->b.big2, s->b.big_cap);
    ALLOC(BUF_WIDE, s->b.big3, s->b.big_cap);
    ALLOC(BUF_WIDE, s->b.big4, s->b.big_cap);
    ALLOC(BUF_WIDE, s->b.big5, s->b.big_cap);
    size_t sw = max_sz(max_sz((size_t)c->Dk, (size_t)c->Hk), max_sz((size_t)c->Rq, row_w));
    ALLOC(BUF_WIDE, s->b.small0, (size_t)Tb * sw);
    ALLOC(BUF_WIDE, s->b.small1, (size_t)Tb * sw);
    ALLOC(BUF_ROWS, s->b.probs, (size_t)Tb * (s->b.n_anchor_max + 1));
    ALLOC(BUF_HOST, s->b.logits_tmp, (size_t)c->V);
    /* per worker: KDA's rows, or MLA attention for a block of heads at a
     * full context ([oh | q_abs / ctx per head | scores per head], mla.c
     * heads_per_call): up to MLA_NH_MAX heads per pass over the latent
     * cache, not one (K3 at 128K: 17 MB per thread, ~6x faster attention) */
    size_t nh = c->Hm < MLA_NH_MAX ? (size_t)c->Hm : MLA_NH_MAX;
    if (!nh) nh = 1;
    s->b.worker_w = max_sz(6 * (size_t)c->Dk,
                           max_sz(2 * (size_t)c->Rkv + (size_t)c->dv + (size_t)n_ctx,
                                  (size_t)c->dv + nh * ((size_t)c->Rkv + (size_t)n_ctx))) +
                    16;
    ALLOC(BUF_WORKER, s->b.worker_buf, (size_t)eng->n_threads * s->b.worker_w);
    size_t na = session_attn(s, eng, T); /* 0: no attention dump */
    if (na) ALLOC(BUF_HOST, s->b.attn_pos, na);
    if (na) ALLOC(BUF_HOST, s->b.attn_p, na);
    if (na) ALLOC(BUF_HOST, s->b.kda_stat, (size_t)T * c->Hk * 4);
    size_t Tk = (size_t)T * c->k;
    ALLOC(BUF_HOST, s->b.route_ids, Tk);
    ALLOC(BUF_HOST, s->b.route_w, Tk);
    ALLOC(BUF_HOST, s->b.route_s, Tk);
    ALLOC(BUF_EXPERT_ROWS, s->b.zp, (size_t)T * c->Lt);
    /* a chunk's experts run in batches of rows (moe.c): all T*k rows at
     * once only for small T (decode, verify passes), else 2 Tb + 256 rows
     * (an expert with more runs in pieces), gathered from zp per batch;
     * across ranks the other ranks' rows are posted whole, so all T*k */
    s->b.g_rows = min_sz(Tk, 2 * (size_t)Tb + 256);
    s->b.g_x_full = eng->n_ranks > 1;
    ALLOC(BUF_EXPERT_ROWS, s->b.g_x, (s->b.g_x_full ? Tk : s->b.g_rows) * c->Lt);
    ALLOC(BUF_HOST, s->b.row_pos, Tk);
    ALLOC(BUF_EXPERT_ROWS, s->b.g_h1, s->b.g_rows * c->I);
    ALLOC(BUF_EXPERT_ROWS, s->b.g_h3, s->b.g_rows * c->I);
    ALLOC(BUF_EXPERT_ROWS, s->b.g_out, Tk * c->Lt);
    ALLOC(BUF_HOST, s->b.uniq, Tk);
    ALLOC(BUF_HOST, s->b.u_of_e, (size_t)c->E);
    ALLOC(BUF_HOST, s->b.row_of, Tk);
    ALLOC(BUF_HOST, s->b.uniq_first, Tk);
    ALLOC(BUF_HOST, s->b.uniq_count, Tk);
    ALLOC(BUF_HOST, s->b.uniq_slot, Tk);
    ALLOC(BUF_HOST, s->b.uniq_state, Tk);
    ALLOC(BUF_HOST, s->b.ready_list, Tk);
    ALLOC(BUF_HOST, s->b.seen, (size_t)c->NL * (size_t)c->E);
    s->sched_cap = sched_capacity(c->NL, T, Tb);
    ALLOC(BUF_HOST, s->sched, s->sched_cap);
    if (!dry)
        for (int e = 0; e < c->E; e++) s->b.u_of_e[e] = -1;
    if (state_bytes) *state_bytes = state;
    if (scratch_bytes) *scratch_bytes = bytes - state;
    if (dry) {
        free(s);
        return 0;
    }
    *out = s;
    return 0;
nomem:
    df_session_free(s);
    return df_err_set(err, DF_ERR_NOMEM, -1,
                      "cannot allocate session buffers (%zu bytes so far; n_ctx %d, max_batch %d): lower --ctx",
                      bytes, n_ctx, T);
}

/* A session takes its bytes from the plan: the one the planner reserved
 * for, plus whatever the plan left unused.  A larger context or batch than
 * planned, or a second session the budget cannot hold, is refused with the
 * numbers instead of growing past --mem. */
int df_session_new(df_engine *eng, const df_session_opts *opts, df_session **out, df_error *err)
{
    size_t state = 0, scratch = 0;
    *out = NULL;
    if (session_alloc(eng, opts, 1, NULL, &state, &scratch, err)) return -1;
    uint64_t need = (uint64_t)state + scratch;
    if (eng->sessions_bytes + need > eng->session_room) {
        df_session_opts d;
        df_session_opts_default(&d);
        d.max_batch = eng->plan.max_batch;
        return df_err_set(err, DF_ERR_NOMEM, -1,
                          "a session with a context of %d tokens and batch %d needs %.3f GiB, but the memory plan "
                          "(--mem %.2f GiB, planned for a context of %d) has %.3f GiB left for sessions: "
                          "lower --ctx or raise --mem",
                          opts && opts->n_ctx > 0 ? opts->n_ctx : d.n_ctx,
                          opts && opts->max_batch > 0 ? opts->max_batch : d.max_batch, gib(need),
                          gib(eng->plan.budget), eng->plan.n_ctx, gib(eng->session_room - eng->sessions_bytes));
    }
    if (session_alloc(eng, opts, 0, out, NULL, NULL, err)) return -1;
    (*out)->bytes = need;
    eng->sessions_bytes += need;
    return 0;
}

void df_session_free(df_session *s)
{
    if (!s) return;
    s->eng->sessions_bytes -= s->bytes;
    free(s->route_counts);
    free(s->b.ck_pos);
    free(s->b.ck_age);
    free(s->b.ck_want);
    float **fl[] = {&s->b.kda_S, &s->b.kda_hist, &s->b.kda_S0, &s->b.kda_hist0, &s->b.kda_rec, &s->b.ck_state, &s->b.mla_cache, &s->b.H, &s->b.anchors, &s->b.ain, &s->b.xn, &s->b.att,
                    &s->b.min, &s->b.y, &s->b.ffn, &s->b.big0, &s->b.big1, &s->b.big2, &s->b.big3, &s->b.big4, &s->b.big5,
                    &s->b.small0, &s->b.small1, &s->b.probs, &s->b.logits_tmp, &s->b.worker_buf, &s->b.route_w, &s->b.route_s, &s->b.attn_p, &s->b.kda_stat, &s->b.zp,
                    &s->b.g_x, &s->b.g_h1, &s->b.g_h3, &s->b.g_out};
    const k3_backend *bk = &s->eng->bk;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) bk->ops->release(bk, *fl[i]);
    void *other[] = {s->b.route_ids, s->b.attn_pos, s->b.uniq, s->b.u_of_e, s->b.row_pos, s->b.row_of, s->b.uniq_first,
                     s->b.uniq_count, s->b.uniq_slot, s->b.uniq_state, s->b.ready_list, s->b.seen, s->sched};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) bk->ops->release(bk, other[i]);
    free(s);
}

void df_session_reset(df_session *s)
{
    memset(s->b.kda_S, 0, kda_state_floats(s->eng) * sizeof(float));
    memset(s->b.kda_hist, 0, kda_hist_floats(s->eng) * sizeof(float));
    s->b.pos = 0;
    s->b.rb_mark = -1;
    for (int i = 0; i < s->b.n_ck; i++) s->b.ck_pos[i] = s->b.ck_want[i] = -1;
}

void df_session_set_progress(df_session *s, df_progress_fn fn, void *ctx)
{
    s->progress = fn;
    s->progress_ctx = ctx;
}
int df_session_max_batch(const df_session *s) { return s->b.max_batch; }

void df_session_opts_default(df_session_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_ctx = 4096;
    o->max_batch = 0; /* the plan's */
}

int df_session_pos(const df_session *s) { return s->b.pos; }
int df_session_n_ctx(const df_session *s) { return s->b.n_ctx; }
