/* mla.c - NoPE multi-head latent attention with output gate (spec section 6):
 * the CPU backend's mla_rows op (ops.h).
 *
 * The cache holds the compact latent form per position: [RMSNorm(kv_a
 * latent) | k_rope], Rkv + dr floats per token per MLA layer.  kv_b_proj
 * (or llama.cpp's per-head k_b / v_b split of it: same values, other strides) is
 * absorbed: for head h, q_abs = W_kb_h^T q_nope (so score = q_abs . lat_s +
 * q_rope . k_rope_s) and the output is W_vb_h (sum_s p_s lat_s).  This is
 * the same function as expanding keys and values per head; only rounding
 * differs (spec D8).  Heads run in parallel in ranges; each range processes
 * the batch's positions in order, attending causally to cache rows
 * 0..pos+t.
 *
 * The attention over the cache (scores, softmax, the weighted sum of the
 * latent rows) is the kernel table's mla_attend: kernels.h fixes every sum's
 * order (each (head, position) score summed in j order in double, each
 * context column over positions in order, multiply then add in float), the
 * scalar reference (kernels_ref.c) is this file's former loop, and the SIMD
 * versions match it bit for bit whatever the number of heads per call.  So
 * this file only arranges a call: a block of heads' absorbed queries in the
 * worker's scratch (their rope parts are read where q_b_proj put them), as
 * many heads per call as the scratch holds scores for (one pass over the
 * cache then serves them all).  The scratch is
 * engine.c's worker_w, sized for ONE head's scores at n_ctx; near a full
 * context a call takes a single head (see heads_per_call).
 */
#include "model.h"
#include "mathfn.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"

#include <math.h>
#include <string.h>

typedef struct {
    const model_ctx *eng;
    session_bufs *s;
    const k3_layer *L;
    int T;
    const float *q;     /* [T][Hm*(dn+dr)] */
    const float *gate;  /* [T][Hm*dv] */
    float *out;         /* [T][Hm*dv] */
    float *cache;       /* this layer's [n_ctx][Rkv+dr] */
} mla_ctx;

static inline float wload(const wmat *w, size_t i)
{
    switch (w->type) {
    case W_BF16: return load_bf16(w->data, i);
    case W_F32: return load_f32(w->data, i);
    default: return wmat_get(w, i); /* F16, Q8_0: by row */
    }
}

/* The most heads one attention call can take for positions up to n_max in
 * a worker's scratch: [oh (dv) | q_abs, then ctx ([nb][Rkv]) | sc
 * ([n_max][nb])] (mla_attend writes ctx over the queries it has read).
 * engine.c's worker_w holds dv + min(Hm, MLA_NH_MAX) * (Rkv + n_ctx), so
 * every call gets its whole range of heads at any context. */
static int heads_per_call(const k3_config *cf, const session_bufs *s, int n_max, size_t heads)
{
    size_t nb = (s->worker_w - (size_t)cf->dv) / ((size_t)cf->Rkv + (size_t)n_max);
    if (nb > heads) nb = heads;
    if (nb > MLA_NH_MAX) nb = MLA_NH_MAX;
    CHECK(nb >= 1);
    return (int)nb;
}

/* The attention dump's entry for one query row and head: the K largest of
 * the n weights w[p * stride] (ties: the earlier position), largest first;
 * slots past n get position -1 and weight 0. */
static void attn_top(const float *w, size_t stride, int n, int K, int32_t *pos, float *p)
{
    for (int r = 0; r < K; r++) pos[r] = -1, p[r] = 0.0f;
    int have = 0;
    for (int i = 0; i < n; i++) {
        float x = w[(size_t)i * stride];
        if (have == K && !(x > p[K - 1])) continue;
        int r = have < K ? have++ : K - 1;
        while (r > 0 && x > p[r - 1]) {
            pos[r] = pos[r - 1], p[r] = p[r - 1];
            r--;
        }
        pos[r] = i, p[r] = x;
    }
}

static void mla_heads(void *vctx, size_t h0, size_t h1, int worker)
{
    mla_ctx *c = vctx;
    const model_ctx *eng = c->eng;
    session_bufs *s = c->s;
    const k3_config *cf = &eng->cfg;
    const k3_layer *L = c->L;
    const kernel_table *kt = eng->bk->kt;
    int Rkv = cf->Rkv, dn = cf->dn, dr = cf->dr, dv = cf->dv, Hm = cf->Hm;
    size_t row_w = (size_t)Rkv + (size_t)dr, qs = (size_t)(dn + dr);
    const float scale = (float)(1.0 / sqrt((double)(dn + dr)));
    /* key element (head hh, row i, column j) = kw[kh + i*ki + j*kj] */
    const wmat *kw = L->kv_split ? &L->k_b : &L->kv_b;
    size_t ki = L->kv_split ? 1 : (size_t)Rkv, kj = L->kv_split ? (size_t)dn : 1;
    int nb = heads_per_call(cf, s, s->pos + c->T, h1 - h0);
    float *oh = s->worker_buf + (size_t)worker * s->worker_w;
    float *q_abs = oh + dv, *ctx = q_abs, *sc = q_abs + (size_t)nb * Rkv;
    int dump = s->attn_on && s->attn_on[L - eng->layers];
    for (size_t hb = h0; hb < h1; hb += (size_t)nb) {
        int nh = h1 - hb < (size_t)nb ? (int)(h1 - hb) : nb;
        for (int t = 0; t < c->T; t++) {
            const float *qt = c->q + (size_t)t * Hm * qs + hb * qs; /* the block's first head */
            for (int b = 0; b < nh; b++) {
                size_t hh = hb + (size_t)b;
                size_t kh = L->kv_split ? hh * (size_t)dn * Rkv : hh * (size_t)(dn + dv) * Rkv;
                const float *qn = qt + (size_t)b * qs;
                float *qa = q_abs + (size_t)b * Rkv;
                for (int j = 0; j < Rkv; j++) qa[j] = 0.0f;
                for (int i = 0; i < dn; i++) {
                    size_t base = kh + (size_t)i * ki;
                    float qi = qn[i];
                    for (int j = 0; j < Rkv; j++) qa[j] += wload(kw, base + (size_t)j * kj) * qi;
                }
            }
            int n = s->pos + t + 1;
            kt->mla_attend(c->cache, row_w, Rkv, dr, n, q_abs, (size_t)Rkv, qt + dn, qs, nh, scale, sc, ctx);
            if (dump) /* the weights the kernel left in sc (kernels.h) */
                for (int b = 0; b < nh; b++) {
                    int a = (int)(hb + (size_t)b) - s->attn_h0;
                    if (a < 0 || a >= s->attn_nh) continue;
                    size_t at = ((size_t)t * s->attn_nh + (size_t)a) * (size_t)s->attn_top;
                    attn_top(sc + b, (size_t)nh, n, s->attn_top, s->attn_pos + at, s->attn_p + at);
                }
            for (int b = 0; b < nh; b++) {
                size_t hh = hb + (size_t)b;
                size_t kb0 = hh * (size_t)(dn + dv);
                /* the head's dv value rows through the kernel table (fixed per-row order) */
                size_t vrow0 = L->kv_split ? hh * (size_t)dv : kb0 + (size_t)dn;
                wmat vb = wmat_rows(L->kv_split ? L->v_b : L->kv_b, (int)vrow0, dv);
                mm_rows(kt, vb, ctx + (size_t)b * Rkv, oh, 0, dv);
                float *o = c->out + (size_t)t * Hm * dv + hh * (size_t)dv;
                const float *g = c->gate + (size_t)t * Hm * dv + hh * (size_t)dv;
                kt->sigmoid_n(g, (size_t)dv, o);
                for (int j = 0; j < dv; j++) o[j] = oh[j] * o[j];
            }
        }
    }
}

int mla_forward(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *x, int T, float *out, df_error *err)
{
    (void)err;
    const k3_config *c = &eng->cfg;
    size_t h = (size_t)c->h, row_w = (size_t)c->Rkv + (size_t)c->dr;
    float *qa = s->small0, *kva = s->small1;
    mm_job jobs[3] = {
        {.w = L->q_a, .x = x, .xs = h, .y = qa, .ys = (size_t)c->Rq, .T = T},
        {.w = L->kv_a, .x = x, .xs = h, .y = kva, .ys = row_w, .T = T},
        {.w = L->mg, .x = x, .xs = h, .y = s->big1, .ys = (size_t)c->Hm * c->dv, .T = T},
    };
    mm_run(eng->bk->pool, eng->bk->kt, jobs, 3);
    for (int t = 0; t < T; t++) rmsnorm(qa + (size_t)t * c->Rq, L->q_a_ln, c->Rq, c->eps, qa + (size_t)t * c->Rq);
    mm_one(eng->bk->pool, eng->bk->kt, L->q_b, qa, T, s->big0);
    float *cache = s->mla_cache + (size_t)L->mla_idx * (size_t)s->n_ctx * row_w;
    for (int t = 0; t < T; t++) {
        float *row = cache + (size_t)(s->pos + t) * row_w;
        const float *src = kva + (size_t)t * row_w;
        rmsnorm(src, L->kv_a_ln, c->Rkv, c->eps, row);
        memcpy(row + c->Rkv, src + c->Rkv, (size_t)c->dr * sizeof(float));
    }
    mla_ctx m = {.eng = eng, .s = s, .L = L, .T = T, .q = s->big0, .gate = s->big1, .out = s->big2, .cache = cache};
    /* Ranges of heads: each range reads the cache twice (scores, context),
     * so as few as give every worker an equal share, at most MLA_NH_MAX
     * heads (one mla_attend call) and at least four (its lanes are heads). */
    size_t workers = (size_t)threadpool_size(eng->bk->pool), hm = (size_t)c->Hm, grain = 0;
    for (size_t k = 1; !grain || grain > MLA_NH_MAX; k++) grain = (hm + workers * k - 1) / (workers * k);
    parallel_for(eng->bk->pool, hm, grain < 4 ? 4 : grain, mla_heads, &m);
    mm_one(eng->bk->pool, eng->bk->kt, L->o, s->big2, T, out);
    return 0;
}
