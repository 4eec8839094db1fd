/* moe.c - the K3 latent MoE block's orchestration (spec section 7): which
 * rows go to which experts, when experts are read, where their outputs
 * land.  The numbers are the backend's ops (ops.h: route, experts,
 * shared_down, combine; the CPU backend's are moe_cpu.c's).
 *
 * Data path: moe -> expert_cache -> expert_store.  For a chunk of T
 * positions the MoE block runs in three steps (model.h): moe_route, by row
 * slice, routes the rows and extends the layer's list of distinct experts
 * in first-use order (moe_start may begin reading them between slices);
 * moe_experts then acquires each distinct expert once (read once on a
 * miss), gathers the rows routed to it (row_of, row_pos) and hands ready
 * groups of experts to the backend; moe_finish, by row slice, adds the
 * shared experts and each position's routed outputs (the backend's
 * combine, in route order).  When more distinct experts are needed than
 * the cache has slots, they stream through it: each computed expert's slot
 * takes the next read (expert_fetch.c), still one read per expert.
 * Reading them (and everything about slots and pins) is expert_fetch.c's;
 * predicting the next layer's experts is prefetch.c's.
 * Across processes (model_ctx.ranks): the distinct experts are ordered this
 * rank's first, then each other rank's; the other ranks get their gathered
 * rows first and compute while this one does its own (moe_experts_for is
 * their side); their output rows land in the same g_out rows, so the
 * route-order sum, and the logits, are the same at any rank count.
 */
#include "model.h"
#include "expert_fetch.h"
#include "gguf.h"
#include "mathfn.h"
#include "prefetch.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <string.h>

/* Top-k by biased score, descending; ties go to the lower expert id.
 * score[j]: the chosen experts' router scores (sig, unbiased). */
void moe_route_row(const k3_config *c, const float *logits, const float *bias, int *ids, float *w, float *score,
                   float *sig, float *choice)
{
    df_router_score(logits, bias, c->E, sig, choice);
    df_topk(choice, c->E, c->k, ids);
    for (int j = 0; j < c->k; j++) score[j] = sig[ids[j]];
    double sum = 0.0;
    for (int j = 0; j < c->k; j++) sum += sig[ids[j]];
    for (int j = 0; j < c->k; j++) w[j] = (float)((double)sig[ids[j]] / (sum + 1e-20) * (double)c->rsf);
}

static uint32_t piece_type(const expert_store *st, int il, int p)
{
    return st->ggml ? st->gg_type[il * 3 + p] : GGML_TYPE_MXFP4 /* the safetensors release */;
}

wmat moe_expert_mat(const expert_store *st, const expert_loc *loc, const uint8_t *slot, int p, int rows, int cols)
{
    int il = (int)((size_t)(loc - st->loc) / (size_t)st->n_experts);
    wmat m = {.type = st->ggml ? W_MXFP4_GG : W_MXFP4, .rows = rows, .cols = cols};
    m.data = expert_store_proj(st, loc, slot, p, &m.scales);
    uint32_t t = piece_type(st, il, p);
    if (t != GGML_TYPE_MXFP4 && (m.type = model_wtype_of_ggml(t)) == W_QB) {
        m.qb = qblock_fmt_of_ggml(t);
        CHECK(m.qb);
    }
    return m;
}

void moe_prep_rows(const expert_store *st, int il, int p, const float *x, int C, float *out)
{
    if (piece_type(st, il, p) == GGML_TYPE_MXFP4) mxfp4_prep_x(x, C, out);
    else memcpy(out, x, (size_t)C * sizeof *out);
}

typedef struct {
    const k3_layer *L;
    int T;
    float *out;
} shared_ctx;

static void shared_overlap(const model_ctx *eng, session_bufs *s, void *ctx)
{
    shared_ctx *sh = ctx;
    eng->bk->ops->shared_down(eng, s, sh->L, sh->T, sh->out);
}

/* a ready group of distinct experts, on the backend */
static void run_experts(const model_ctx *eng, session_bufs *s, int il, const int *us, int n)
{
    eng->bk->ops->experts(eng, s, il, us, n);
}

void moe_route(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, int shared)
{
    const k3_config *c = &eng->cfg;
    int k = c->k;
    eng->bk->ops->route(eng, s, L, y, t0, nt, shared);

    /* distinct experts in first-use order (row order: the slices come in
     * order, so each slice's list extends the previous one's), with each
     * one's row count */
    if (t0 == 0) s->n_u = 0;
    for (int i = t0 * k; i < (t0 + nt) * k; i++) {
        int e = s->route_ids[i], u = s->u_of_e[e];
        if (u < 0) {
            u = s->n_u++;
            s->uniq[u] = e;
            s->uniq_count[u] = 0;
            s->u_of_e[e] = u;
        }
        s->uniq_count[u]++;
    }
}

void moe_start(const model_ctx *eng, session_bufs *s, int il, df_error *err)
{
    /* across ranks the list is reordered by owner first: no early reads */
    if (eng->ranks && eng->ranks->n > 1) return;
    if (!s->fg.open) fetch_begin(s, il, 0);
    fetch_extend(eng, s, s->n_u, err);
}

void moe_abandon(const model_ctx *eng, session_bufs *s)
{
    fetch_abandon(eng, s);
    for (int u = 0; u < s->n_u; u++) s->u_of_e[s->uniq[u]] = -1;
    s->n_u = 0;
}

int moe_experts(const model_ctx *eng, session_bufs *s, int il, const k3_layer *L, int T, float *out, df_error *err)
{
    const k3_config *c = &eng->cfg;
    int E = c->E, k = c->k, Lt = c->Lt;

    /* the distinct experts and their row counts (moe_route) */
    int n_u = s->n_u;
    /* across ranks: this rank's experts first, then each other rank's
     * together (which rows an expert's outputs land in does not change them) */
    const moe_ranks *R = eng->ranks;
    int n_local = n_u;
    if (R && R->n > 1) {
        int *tid = s->uniq_first, *tcnt = s->uniq_state, m = 0;
        for (int r = 0; r < R->n; r++)
            for (int u = 0; u < n_u; u++)
                if (R->owner[(size_t)il * E + (size_t)s->uniq[u]] == r) tid[m] = s->uniq[u], tcnt[m++] = s->uniq_count[u];
        CHECK(m == n_u);
        memcpy(s->uniq, tid, (size_t)n_u * sizeof *tid);
        memcpy(s->uniq_count, tcnt, (size_t)n_u * sizeof *tcnt);
        for (int u = 0; u < n_u; u++) s->u_of_e[s->uniq[u]] = u;
        for (n_local = 0; n_local < n_u && R->owner[(size_t)il * E + (size_t)s->uniq[n_local]] == 0; n_local++) {}
    }
    for (int u = 0, acc = 0; u < n_u; u++) {
        s->uniq_first[u] = acc;
        acc += s->uniq_count[u];
        s->uniq_count[u] = 0;
    }
    for (int i = 0; i < T * k; i++) {
        int u = s->u_of_e[s->route_ids[i]];
        int row = s->uniq_first[u] + s->uniq_count[u]++;
        s->row_of[i] = row;
        s->row_pos[row] = i / k;
        if (s->g_x_full) memcpy(s->g_x + (size_t)row * Lt, s->zp + (size_t)(i / k) * Lt, (size_t)Lt * sizeof(float));
    }
    for (int u = 0; u < n_u; u++) s->u_of_e[s->uniq[u]] = -1;
    /* the cache's use counts follow the rows: each expert gets its share of
     * the chunk's rows over the mean share, so a chunk adds as much in all
     * as one count per expert (a long prompt does not outweigh the decode
     * after it) but an expert 200 of its rows route to counts more than one
     * with 2 (issue 43's policy study); a decode step adds one to each */
    for (int u = 0; u < n_local; u++) {
        float w = (float)s->uniq_count[u] * (float)n_u / (float)(T * k);
        if (w != 1.0f) expert_cache_add_uses(eng->cache, il, s->uniq[u], w - 1.0f);
    }

    if (s->probe) {
        /* observers: prompt accounting, the prefetcher's scoring */
        probe_ev ev = {.point = PROBE_EXPERTS, .il = il, .nt = T, .T = T, .experts = s->uniq, .n_experts = n_u};
        s->probe(s->probe_ctx, &ev);
    }

    /* the other ranks' experts go out first and compute while this one works */
    for (int u0 = n_local; u0 < n_u;) {
        int r = R->owner[(size_t)il * E + (size_t)s->uniq[u0]], u1 = u0;
        while (u1 < n_u && R->owner[(size_t)il * E + (size_t)s->uniq[u1]] == r) u1++;
        int row0 = s->uniq_first[u0], rows = s->uniq_first[u1 - 1] + s->uniq_count[u1 - 1] - row0;
        CHECK(s->g_x_full);
        if (R->post(R->ctx, r, il, s->uniq + u0, s->uniq_count + u0, u1 - u0, s->g_x + (size_t)row0 * Lt, rows,
                    s->g_out + (size_t)row0 * Lt, err))
            return -1;
        u0 = u1;
    }
    /* this rank's experts streamed through the cache: the first reads
     * overlap the shared experts' down-projection (when out is given);
     * computed experts give their slots to the next reads (expert_fetch.c) */
    shared_ctx sh = {.L = L, .T = T, .out = out};
    if (s->fg.open) {
        /* reads started between row slices (moe_start): the rest now */
        fetch_extend(eng, s, n_local, err);
        if (fetch_finish(eng, s, run_experts, out ? shared_overlap : NULL, &sh, err)) return -1;
    } else if (!n_local) {
        if (out) eng->bk->ops->shared_down(eng, s, L, T, out);
    } else if (fetch_group(eng, s, il, 0, n_local, run_experts, out ? shared_overlap : NULL, &sh, err)) {
        return -1;
    }
    if (R && R->n > 1) *R->local_calls += (uint64_t)n_local;
    if (n_local < n_u && R->collect(R->ctx, il, err)) return -1;
    return 0;
}

void moe_finish(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, float *out,
                int shared_done)
{
    eng->bk->ops->combine(eng, s, L, y, t0, nt, out, shared_done);
}

int moe_experts_for(const model_ctx *eng, session_bufs *s, int il, const int *ids, const int *counts, int n,
                    const float *x, float *out, df_error *err)
{
    int Lt = eng->cfg.Lt, rows = 0;
    for (int u = 0; u < n; u++) {
        s->uniq[u] = ids[u];
        s->uniq_first[u] = rows;
        s->uniq_count[u] = counts[u];
        rows += counts[u];
    }
    CHECK(s->g_x_full);
    memcpy(s->g_x, x, (size_t)rows * Lt * sizeof(float));
    if (fetch_group(eng, s, il, 0, n, run_experts, NULL, NULL, err)) return -1;
    memcpy(out, s->g_out, (size_t)rows * Lt * sizeof(float));
    return 0;
}
