/* forward.c - the forward pass over a chunk of positions (spec section 4.2):
 * the embedding, per layer the AttnRes mixes and block boundary
 * bookkeeping, attention (kda.c, mla.c) and the FFN (moe.c, the routed
 * experts over all rows of the chunk with a wavefront of early reads), the
 * final mix, norm and lm_head; and df_session_eval, which cuts an input into
 * chunks and runs them under the allocation guard.  Observation (debug
 * records, the route trace, events, prompt accounting) is here too for now.
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

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Embedding rows.  A resident trunk keeps the embedding mapped (counted in
 * the plan); a streamed one reads each row from the file into H (BF16 rows
 * land in the row's first half and are widened from the end, so no value is
 * overwritten before it is read): touching rows of a mapping would grow the
 * resident set with every new token, outside the budget. */
static int embed_rows(const df_engine *eng, const int32_t *ids, int T, float *H, df_error *err)
{
    const k3_config *c = &eng->m.cfg;
    size_t es = eng->m.embed.type == W_BF16 ? 2 : 4;
    for (int t = 0; t < T; t++) {
        size_t base = (size_t)ids[t] * c->h;
        float *row = H + (size_t)t * c->h;
        if (eng->ts.on) {
            size_t n = (size_t)c->h * es;
            uint64_t off = eng->m.embed_off + (uint64_t)base * es;
            if (model_pread_fd(eng->m.shards[eng->m.embed_shard].fd, (uint8_t *)row, n, off))
                return df_err_set(err, DF_ERR_IO, (int64_t)off, "%s: reading the embedding row of token %d failed",
                                  eng->m.shards[eng->m.embed_shard].path, ids[t]);
            if (es == 2)
                for (int i = c->h - 1; i >= 0; i--) row[i] = load_bf16(row, (size_t)i);
            continue;
        }
        for (int i = 0; i < c->h; i++)
            row[i] = eng->m.embed.type == W_BF16 ? load_bf16(eng->m.embed.data, base + i) : load_f32(eng->m.embed.data, base + i);
    }
    return 0;
}

static void add_rows(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dst[i] + src[i];
}

/* Non-finite values.  A NaN or infinity in a weight (or an overflow)
 * spreads through every later layer into the logits, and greedy decoding
 * of NaN logits is token 0 forever.  So the rows a part of a layer adds to
 * the residual stream are tested where they are added (an exponent test
 * per float, integer OR: O(h) per row against the part's O(h^2) work, and
 * no effect on any value), the earliest layer and part is kept, and the
 * chunk fails at its end with an error naming it.  The logits are tested
 * too (the output norm and lm_head). */
static int any_nonfinite(const float *x, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad != 0;
}

static void check_finite(df_session *s, const float *x, size_t n, int layer, const char *part)
{
    if (s->nf_layer <= layer) return; /* already seen no later than this */
    if (any_nonfinite(x, n)) {
        s->nf_layer = layer;
        s->nf_part = part;
    }
}

/* Row-local work of a chunk (norms, the residual mixes) on every worker
 * when there are enough rows: a row's result is its own, whatever the split. */
typedef struct rows_ctx {
    const float *x, *w, *anc;
    int n, n_anc;
    size_t astride;
    float eps;
    float *y, *probs;
} rows_ctx;

static void norm_range(void *v, size_t a, size_t b, int worker)
{
    (void)worker;
    const rows_ctx *r = v;
    for (size_t t = a; t < b; t++) rmsnorm(r->x + t * r->n, r->w, r->n, r->eps, r->y + t * r->n);
}

static void mix_range(void *v, size_t a, size_t b, int worker)
{
    (void)worker;
    const rows_ctx *r = v;
    size_t n = (size_t)r->n;
    attnres_mix(r->anc + a * n, r->n_anc, r->astride, r->x + a * n, (int)(b - a), r->n, r->w, r->eps, r->y + a * n,
                r->probs ? r->probs + a * (size_t)(r->n_anc + 1) : NULL);
}

enum { ROWS_PAR_MIN = 16 };

static void norm_rows(threadpool *pool, const float *x, const float *w, int T, int n, float eps, float *y)
{
    rows_ctx r = {.x = x, .w = w, .n = n, .eps = eps, .y = y};
    if (T < ROWS_PAR_MIN) norm_range(&r, 0, (size_t)T, 0);
    else parallel_for(pool, (size_t)T, 4, norm_range, &r);
}

/* attnres_mix over T rows (probs: [T][n_anc+1] or NULL) */
static void mix_rows(threadpool *pool, const float *anc, int n_anc, size_t astride, const float *p, int T, int n,
                     const float *nwpw, float eps, float *out, float *probs)
{
    rows_ctx r = {.x = p, .w = nwpw, .anc = anc, .n = n, .n_anc = n_anc, .astride = astride, .eps = eps, .y = out,
                  .probs = probs};
    if (T < ROWS_PAR_MIN) mix_range(&r, 0, (size_t)T, 0);
    else parallel_for(pool, (size_t)T, 4, mix_range, &r);
}

/* Route trace: one JSON line per (position, MoE layer), experts in route
 * order with their weights (--trace; the input of `deltafin cachesim`). */
static void trace_routes(const df_session *s, int il, int T)
{
    const df_engine *eng = s->eng;
    int k = eng->m.cfg.k;
    for (int t = 0; t < T; t++) {
        fprintf(eng->trace, "{\"pos\":%d,\"layer\":%d,\"experts\":[", s->b.pos + t, il);
        for (int j = 0; j < k; j++) fprintf(eng->trace, "%s%d", j ? "," : "", s->b.route_ids[t * k + j]);
        fprintf(eng->trace, "],\"weights\":[");
        for (int j = 0; j < k; j++) fprintf(eng->trace, "%s%.7g", j ? "," : "", (double)s->b.route_w[t * k + j]);
        fprintf(eng->trace, "]}\n");
    }
}

/* Rows [t0, t0 + nt) of layer il up to the MoE block's routed experts:
 * the residual mix, attention (at positions pos0 + t0...), and then either
 * the dense MLP (added to H) or the MoE router (moe_route; with the shared
 * experts' gate and up when the chunk is one block).  dl: the debug record
 * when this block holds the chunk's last position (row ld). */
static int layer_rows(df_session *s, int il, int t0, int nt, int n_anc, int pos0, int one_block, dbg_layer *dl,
                      int ld, df_error *err)
{
    df_engine *eng = s->eng;
    const model_ctx *mc = &eng->mc;
    const k3_config *c = &eng->m.cfg;
    const k3_layer *L = &eng->m.layers[il];
    size_t h = (size_t)c->h, nh = (size_t)nt * h;
    size_t astride = (size_t)s->b.max_batch * h;
    float *H = s->b.H + (size_t)t0 * h;
    const float *anc = s->b.anchors + (size_t)t0 * h;
    int boundary = il % c->B == 0;
    const float *ain = H;
    if (n_anc) {
        mix_rows(eng->pool, anc, n_anc, astride, H, nt, (int)h, L->attn_res_nwpw, c->eps, s->b.ain, s->b.probs);
        ain = s->b.ain;
    }
    if (dl) {
        dl->n_attn_probs = n_anc + 1;
        for (int j = 0; j <= n_anc; j++) dl->attn_probs[j] = n_anc ? s->b.probs[(size_t)ld * (n_anc + 1) + j] : 1.0;
        dl->attn_input_norm = l2norm(ain + (size_t)ld * h, (int)h);
    }
    if (boundary) memcpy(s->b.anchors + (size_t)n_anc++ * astride + (size_t)t0 * h, H, nh * sizeof(float));
    norm_rows(eng->pool, ain, L->input_ln, nt, (int)h, c->eps, s->b.xn);
    s->b.pos = pos0 + t0;
    int rc = 0;
    if (L->kind == LAYER_KDA) kda_forward(mc, &s->b, L, s->b.xn, nt, s->b.att);
    else rc = mla_forward(mc, &s->b, L, s->b.xn, nt, s->b.att, err);
    s->b.pos = pos0;
    if (rc) return -1;
    if (boundary) memcpy(H, s->b.att, nh * sizeof(float));
    else add_rows(H, s->b.att, nh);
    check_finite(s, H, nh, il, L->kind == LAYER_KDA ? "KDA attention" : "MLA attention");
    mix_rows(eng->pool, anc, n_anc, astride, H, nt, (int)h, L->mlp_res_nwpw, c->eps, s->b.min, s->b.probs);
    if (dl) {
        dl->attn_output_norm = l2norm(s->b.att + (size_t)ld * h, (int)h);
        dl->n_mlp_probs = n_anc + 1;
        for (int j = 0; j <= n_anc; j++) dl->mlp_probs[j] = s->b.probs[(size_t)ld * (n_anc + 1) + j];
        dl->mlp_input_norm = l2norm(s->b.min + (size_t)ld * h, (int)h);
    }
    norm_rows(eng->pool, s->b.min, L->post_ln, nt, (int)h, c->eps, s->b.y);
    if (L->moe) {
        moe_route(mc, &s->b, L, s->b.y, t0, nt, one_block);
    } else {
        dense_mlp_forward(mc, &s->b, L, s->b.y, nt, s->b.ffn);
        add_rows(H, s->b.ffn, nh);
        check_finite(s, H, nh, il, "dense MLP");
        if (dl) dl->mlp_output_norm = l2norm(s->b.ffn + (size_t)ld * h, (int)h);
    }
    return 0;
}

/* Rows [t0, t0 + nt) of MoE layer il after its routed experts ran: the
 * shared experts (unless one_block: done during the reads) and the routed
 * sum, added to H.  n_anc: the anchors layer il mixes.  dl: its debug
 * record, filled when the block holds the chunk's last position dt. */
static void finish_block(df_session *s, int il, int n_anc, int t0, int nt, int one_block, dbg_layer *dl, int dt,
                         int tl)
{
    df_engine *eng = s->eng;
    const k3_config *c = &eng->m.cfg;
    const k3_layer *L = &eng->m.layers[il];
    size_t h = (size_t)c->h, astride = (size_t)s->b.max_batch * h;
    float *H = s->b.H + (size_t)t0 * h;
    if (!one_block) {
        /* the block's MoE input again, from the unchanged H and anchors */
        mix_rows(eng->pool, s->b.anchors + (size_t)t0 * h, n_anc, astride, H, nt, (int)h, L->mlp_res_nwpw, c->eps,
                 s->b.min, s->b.probs);
        norm_rows(eng->pool, s->b.min, L->post_ln, nt, (int)h, c->eps, s->b.y);
    }
    moe_finish(&eng->mc, &s->b, L, s->b.y, t0, nt, s->b.ffn, one_block);
    add_rows(H, s->b.ffn, (size_t)nt * h);
    check_finite(s, H, (size_t)nt * h, il, "MoE (router, shared or routed experts)");
    if (dl && t0 == tl) {
        dl->mlp_output_norm = l2norm(s->b.ffn + (size_t)(dt - tl) * h, (int)h);
        dl->partial_sum_norm = l2norm(s->b.H + (size_t)dt * h, (int)h);
    }
}

/* One chunk of T <= max_batch positions, layer by layer: each layer's
 * attention, dense work and routing in blocks of row_block rows, then its
 * routed experts over all T rows (each distinct expert read once per
 * chunk), then the blocks' shared experts and routed sums (interleaved
 * with the next layer's blocks: the wavefront below).  Only H, the
 * anchors and the routed rows are held for every position; every row's
 * result is the same whatever the chunk and block widths (HACKING.md).
 * logits: NULL, or [T][V] when all_rows, or [V] for the last position. */
static int forward_chunk(df_session *s, const int32_t *ids, int T, float *logits, int all_rows, df_error *err)
{
    df_engine *eng = s->eng;
    const model_ctx *mc = &eng->mc;
    const k3_config *c = &eng->m.cfg;
    size_t h = (size_t)c->h;
    size_t astride = (size_t)s->b.max_batch * h;
    dbg_record *dbg = s->dbg && s->dbg->enabled ? s->dbg : NULL;
    int dt = T - 1;  /* debug position: the chunk's last */
    int RB = s->b.row_block, one_block = T <= RB, pos0 = s->b.pos;
    int tl = dt / RB * RB; /* the first row of the last block */
    double t_start = now_sec(), t_layer = t_start;
    uint64_t hits0 = eng->cache.hits, miss0 = eng->cache.misses, bytes0 = eng->m.store.st.bytes_io;
    uint64_t pfi0 = eng->pf.issued, pfu0 = eng->cache.pf_used, late0 = eng->cache.late;
    double wait0 = eng->m.store.st.wait_sec;
    CHECK(T >= 1 && T <= s->b.max_batch);
    if (embed_rows(eng, ids, T, s->b.H, err)) goto fail;
    s->nf_layer = INT_MAX;
    s->nf_part = NULL;
    check_finite(s, s->b.H, (size_t)T * h, -1, "token embedding");
    if (dbg) dbg->embedding_norm = l2norm(s->b.H + dt * h, (int)h);
    int n_anc = 0;
    /* Several blocks, trunk in memory: a MoE layer's blocks are finished
     * one by one inside the next layer's block loop (a wavefront), since
     * block b of layer L+1 needs only block b of layer L.  So the next
     * layer's first block routes, and its reads start, right after this
     * layer's first block is finished, not after all of them.  (A streamed
     * trunk holds only two layers' weights, so it finishes each layer
     * before the next starts.) */
    int wave = !one_block && !eng->ts.on;
    int pend = -1, pend_anc = 0; /* the MoE layer whose blocks are still to finish, its anchor count */
    for (int il = 0; il < c->NL; il++) {
        const k3_layer *L = &eng->m.layers[il];
        dbg_layer *dl = dbg ? &dbg->layers[il] : NULL;
        if (eng->ts.on && trunk_stream_layer(eng, il, err)) goto fail;
        for (int t0 = 0; t0 < T; t0 += RB) {
            int nt = T - t0 < RB ? T - t0 : RB;
            if (pend >= 0) finish_block(s, pend, pend_anc, t0, nt, one_block, dbg ? &dbg->layers[pend] : NULL, dt, tl);
            if (layer_rows(s, il, t0, nt, n_anc, pos0, one_block, t0 == tl ? dl : NULL, dt - tl, err)) goto fail;
            /* the experts these rows need start reading while the next
             * blocks' attention runs */
            if (L->moe && t0 + nt < T) moe_start(mc, &s->b, il, err);
        }
        pend = -1;
        if (il % c->B == 0) n_anc++;
        if (L->moe) {
            /* one block: the shared experts' down-projection overlaps the
             * first reads; several: each block's shared experts run at its finish */
            if (moe_experts(mc, &s->b, il, L, T, one_block ? s->b.ffn : NULL, err)) goto fail;
            if (eng->trace) trace_routes(s, il, T);
            if (dl) {
                /* before the next layer's routing takes these rows */
                dl->n_experts = c->k;
                for (int j = 0; j < c->k && j < DBG_MAX_K; j++) {
                    dl->expert_ids[j] = s->b.route_ids[dt * c->k + j];
                    dl->expert_weights[j] = s->b.route_w[dt * c->k + j];
                }
            }
            if (wave && il + 1 < c->NL) {
                pend = il;
                pend_anc = n_anc;
            } else {
                for (int t0 = 0; t0 < T; t0 += RB)
                    finish_block(s, il, n_anc, t0, T - t0 < RB ? T - t0 : RB, one_block, dl, dt, tl);
            }
        } else if (dl) {
            dl->n_experts = 0;
            dl->partial_sum_norm = l2norm(s->b.H + dt * h, (int)h);
        }
        prefetch_after_layer(mc, &s->b, il, T, s->b.H);
        if (eng->events) {
            double t = now_sec();
            eng->layer_sec[il] = t - t_layer;
            t_layer = t;
        }
    }
    if (eng->ts.on && trunk_stream_layer(eng, c->NL, err)) goto fail;
    /* the output mix and norm, by block; the last position alone when only
     * its logits are wanted */
    for (int t0 = all_rows ? 0 : dt; t0 < T; t0 += RB) {
        int nt = T - t0 < RB ? T - t0 : RB;
        mix_rows(eng->pool, s->b.anchors + (size_t)t0 * h, n_anc, astride, s->b.H + (size_t)t0 * h, nt, (int)h,
                 eng->m.out_res_nwpw, c->eps, s->b.ain, NULL);
        norm_rows(eng->pool, s->b.ain, eng->m.final_norm, nt, (int)h, c->eps, s->b.xn);
        if (dbg && t0 + nt == T) {
            dbg->final_mix_norm = l2norm(s->b.ain + (size_t)(dt - t0) * h, (int)h);
            dbg->final_normed_norm = l2norm(s->b.xn + (size_t)(dt - t0) * h, (int)h);
        }
        if (logits) {
            float *lr = all_rows ? logits + (size_t)t0 * c->V : logits;
            mm_one(eng->pool, eng->kt, eng->m.lm_head, s->b.xn, nt, lr);
            check_finite(s, lr, (size_t)(all_rows ? nt : 1) * c->V, c->NL, "output norm and lm_head");
        }
    }
    if (s->nf_layer != INT_MAX) {
        /* the session's state past this chunk's start is not usable: its
         * position stays where it was and the caller resets or truncates */
        if (s->nf_layer < 0 || s->nf_layer >= c->NL)
            df_err_set(err, DF_ERR_NUMERIC, -1,
                       "non-finite values (NaN or infinity) at positions %d-%d, first in the %s: the model's "
                       "weights hold a NaN or infinity there, or the values overflowed",
                       pos0, pos0 + T - 1, s->nf_part);
        else
            df_err_set(err, DF_ERR_NUMERIC, -1,
                       "non-finite values (NaN or infinity) at positions %d-%d, first in layer %d's %s "
                       "(model.layers.%d): the model's weights hold a NaN or infinity there, or the values overflowed",
                       pos0, pos0 + T - 1, s->nf_layer, s->nf_part, s->nf_layer);
        goto fail;
    }
    if (logits && dbg) dbg->logits_norm = l2norm(all_rows ? logits + (size_t)dt * c->V : logits, c->V);
    if (eng->events) {
        /* one JSON line per forward call (per token while decoding) */
        double dt_s = now_sec() - t_start, wait = eng->m.store.st.wait_sec - wait0;
        uint64_t hits = eng->cache.hits - hits0, miss = eng->cache.misses - miss0;
        uint64_t bytes = eng->m.store.st.bytes_io - bytes0;
        fprintf(eng->events,
                "{\"pos\":%d,\"tokens\":%d,\"ms\":%.3f,\"expert_hits\":%llu,\"expert_misses\":%llu,"
                "\"hit_rate\":%.4f,\"bytes_read\":%llu,\"io_wait_ms\":%.3f,\"io_wait_share\":%.4f,"
                "\"read_gbps\":%.3f,\"prefetch\":%d,\"prefetch_issued\":%llu,\"prefetch_used\":%llu,"
                "\"prefetch_late\":%llu,\"layer_ms\":[",
                s->b.pos, T, 1e3 * dt_s, (unsigned long long)hits, (unsigned long long)miss,
                hits + miss ? (double)hits / (double)(hits + miss) : 1.0, (unsigned long long)bytes, 1e3 * wait,
                dt_s > 0 ? wait / dt_s : 0.0, dt_s > 0 ? (double)bytes / dt_s / 1e9 : 0.0, eng->pf.active,
                (unsigned long long)(eng->pf.issued - pfi0), (unsigned long long)(eng->cache.pf_used - pfu0),
                (unsigned long long)(eng->cache.late - late0));
        for (int il = 0; il < c->NL; il++) fprintf(eng->events, "%s%.3f", il ? "," : "", 1e3 * eng->layer_sec[il]);
        fprintf(eng->events, "]}\n");
        fflush(eng->events);
    }
    prefetch_step_timed(&eng->pf, T, now_sec() - t_start, eng->mc.quiet);
    s->b.pos += T;
    eng->tokens += (uint64_t)T;
    /* predictions may still be reading: they are taken in by later waits
     * (or when a group needs their slots), never waited for here */
    return 0;
fail:
    moe_abandon(&eng->mc, &s->b);
    fetch_drain(&eng->mc, NULL);
    return -1;
}

static int eval_impl(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_rows_fn each,
                     void *each_ctx, df_error *err);

int df_session_eval(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_error *err)
{
    return eval_impl(s, ids, n, logits, all_rows, NULL, NULL, err);
}

int df_session_eval_each(df_session *s, const int32_t *ids, int n, float *rows, df_rows_fn each, void *ctx,
                         df_error *err)
{
    return eval_impl(s, ids, n, rows, 1, each, ctx, err);
}

static int eval_impl(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_rows_fn each,
                     void *each_ctx, df_error *err)
{
    const k3_config *c = &s->eng->m.cfg;
    if (n <= 0) return df_err_set(err, DF_ERR_ARG, -1, "no tokens to evaluate");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->V)
            return df_err_set(err, DF_ERR_ARG, i, "token id %d at index %d is outside the vocabulary [0, %d)", ids[i],
                              i, c->V);
    if (n > s->b.n_ctx - s->b.pos)
        return df_err_set(err, DF_ERR_LIMIT, -1, "context full: %d tokens held, %d more requested, capacity %d",
                          s->b.pos, n, s->b.n_ctx);
    /* rows past what the mark can take back: the mark is dropped */
    if (s->b.rb_mark >= 0 && s->b.pos + n - s->b.rb_mark > s->b.rb_rows) s->b.rb_mark = -1;
    int rc = 0;
    df_engine *eng = s->eng;
    uint64_t reads0 = eng->m.store.st.n_reads, bytes0 = eng->m.store.st.bytes_read;
    double t0 = now_sec();
    if (n > 1) {
        /* a prompt: count the distinct (layer, expert) pairs it needs */
        memset(s->b.seen, 0, (size_t)c->NL * (size_t)c->E);
        s->b.n_seen = 0;
    }
    alloc_guard_enter();
    for (int off = 0; off < n && !rc; off += s->b.max_batch) {
        int T = n - off < s->b.max_batch ? n - off : s->b.max_batch;
        int last = off + T == n;
        float *dst = NULL;
        if (logits && each) dst = logits; /* one chunk's rows at a time, handed to each */
        else if (logits && all_rows) dst = logits + (size_t)off * c->V;
        else if (logits && last) dst = logits;
        int p0 = s->b.pos;
        rc = forward_chunk(s, ids + off, T, dst, all_rows, err);
        session_ck_settle(s, p0, p0 + T, !rc);
        if (!rc && each) {
            alloc_guard_leave();
            if (each(each_ctx, dst, T)) rc = df_err_set(err, DF_ERR_IO, off, "the rows' consumer failed");
            alloc_guard_enter();
        }
        if (!rc && s->progress && off + T < n) {
            alloc_guard_leave();
            s->progress(s->progress_ctx, off + T, n);
            alloc_guard_enter();
        }
    }
    alloc_guard_leave();
    if (n > 1) {
        prompt_stats *ps = &eng->prompt;
        ps->positions = (uint64_t)n;
        ps->chunk = s->b.max_batch;
        ps->unique = s->b.n_seen;
        ps->reads = eng->m.store.st.n_reads - reads0;
        ps->bytes = eng->m.store.st.bytes_read - bytes0;
        ps->seconds = now_sec() - t0;
    }
    return rc;
}
