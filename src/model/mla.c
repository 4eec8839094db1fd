/* mla.c - NoPE multi-head latent attention with output gate (spec section 6).
 *
 * The cache holds the compact latent form per position: [RMSNorm(kv_a
 * latent) | k_rope], Rkv + dr floats per token per MLA layer.  kv_b_proj
 * (or llama.cpp's per-head k_b / v_b split of it: same values, other strides) is
 * absorbed: for head h, q_abs = W_kb_h^T q_nope (so score = q_abs . lat_s +
 * q_rope . k_rope_s) and the output is W_vb_h (sum_s p_s lat_s).  This is
 * the same function as expanding keys and values per head; only rounding
 * differs (spec D8).  Heads run in parallel; each head processes the batch's
 * positions in order, attending causally to cache rows 0..pos+t, with every
 * sum in a fixed order.
 */
#include "model.h"
#include "mathfn.h"
#include "quant.h"
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
    return w->type == W_BF16 ? load_bf16(w->data, i) : load_f32(w->data, i);
}

static void mla_heads(void *vctx, size_t h0, size_t h1, int worker)
{
    mla_ctx *c = vctx;
    const model_ctx *eng = c->eng;
    session_bufs *s = c->s;
    const k3_config *cf = &eng->cfg;
    const k3_layer *L = c->L;
    int Rkv = cf->Rkv, dn = cf->dn, dr = cf->dr, dv = cf->dv, Hm = cf->Hm;
    size_t row_w = (size_t)Rkv + (size_t)dr;
    float *wb = s->worker_buf + (size_t)worker * s->worker_w;
    float *q_abs = wb, *ctx = wb + Rkv, *oh = wb + 2 * Rkv, *sc = wb + 2 * Rkv + dv;
    const float scale = (float)(1.0 / sqrt((double)(dn + dr)));
    /* key element (head hh, row i, column j) = kw[kh + i*ki + j*kj] */
    const wmat *kw = L->kv_split ? &L->k_b : &L->kv_b;
    size_t ki = L->kv_split ? 1 : (size_t)Rkv, kj = L->kv_split ? (size_t)dn : 1;
    for (size_t hh = h0; hh < h1; hh++) {
        size_t kb0 = hh * (size_t)(dn + dv);
        size_t kh = L->kv_split ? hh * (size_t)dn * Rkv : kb0 * (size_t)Rkv;
        wmat vb = L->kv_split ? L->v_b : L->kv_b;  /* the head's dv value rows */
        size_t esz = vb.type == W_BF16 ? 2 : 4;
        size_t vrow0 = L->kv_split ? hh * (size_t)dv : kb0 + (size_t)dn;
        vb.data = (const uint8_t *)vb.data + vrow0 * (size_t)Rkv * esz;
        vb.rows = dv;
        for (int t = 0; t < c->T; t++) {
            const float *qn = c->q + (size_t)t * Hm * (dn + dr) + hh * (size_t)(dn + dr);
            const float *qr = qn + dn;
            for (int j = 0; j < Rkv; j++) q_abs[j] = 0.0f;
            for (int i = 0; i < dn; i++) {
                size_t base = kh + (size_t)i * ki;
                float qi = qn[i];
                for (int j = 0; j < Rkv; j++) q_abs[j] += wload(kw, base + (size_t)j * kj) * qi;
            }
            int n = s->pos + t + 1;
            double mx = -INFINITY;
            int p = 0;
            /* four cached positions at a time: four independent sums, each
             * in the same j order as one position alone (bit-identical; the
             * chains overlap instead of waiting on one add's latency) */
            for (; p + 4 <= n; p += 4) {
                const float *r0 = c->cache + (size_t)p * row_w, *r1 = r0 + row_w, *r2 = r1 + row_w, *r3 = r2 + row_w;
                double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
                for (int j = 0; j < Rkv; j++) {
                    double q = (double)q_abs[j];
                    a0 += q * r0[j];
                    a1 += q * r1[j];
                    a2 += q * r2[j];
                    a3 += q * r3[j];
                }
                for (int j = 0; j < dr; j++) {
                    double q = (double)qr[j];
                    a0 += q * r0[Rkv + j];
                    a1 += q * r1[Rkv + j];
                    a2 += q * r2[Rkv + j];
                    a3 += q * r3[Rkv + j];
                }
                sc[p] = (float)a0 * scale;
                sc[p + 1] = (float)a1 * scale;
                sc[p + 2] = (float)a2 * scale;
                sc[p + 3] = (float)a3 * scale;
                for (int i = 0; i < 4; i++)
                    if (sc[p + i] > mx) mx = sc[p + i];
            }
            for (; p < n; p++) {
                const float *row = c->cache + (size_t)p * row_w;
                double acc = 0.0;
                for (int j = 0; j < Rkv; j++) acc += (double)q_abs[j] * row[j];
                for (int j = 0; j < dr; j++) acc += (double)qr[j] * row[Rkv + j];
                sc[p] = (float)acc * scale;
                if (sc[p] > mx) mx = sc[p];
            }
            double sum = 0.0;
            for (p = 0; p < n; p++) {
                sc[p] = (float)df_exp((double)sc[p] - mx);
                sum += sc[p];
            }
            float inv = (float)(1.0 / sum);
            for (int j = 0; j < Rkv; j++) ctx[j] = 0.0f;
            for (p = 0; p < n; p++) {
                const float *row = c->cache + (size_t)p * row_w;
                float pp = sc[p] * inv;
                for (int j = 0; j < Rkv; j++) ctx[j] += pp * row[j];
            }
            /* value rows through the kernel table (fixed per-row order) */
            const kernel_table *kt = eng->kt;
            if (vb.type == W_BF16) kt->matmul_bf16(vb.data, (size_t)Rkv, Rkv, ctx, 0, 1, oh, 0, 0, dv);
            else kt->matmul_f32(vb.data, (size_t)Rkv, Rkv, ctx, 0, 1, oh, 0, 0, dv);
            float *o = c->out + (size_t)t * Hm * dv + hh * (size_t)dv;
            const float *g = c->gate + (size_t)t * Hm * dv + hh * (size_t)dv;
            for (int j = 0; j < dv; j++) o[j] = oh[j] * df_sigmoidf(g[j]);
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
    mm_run(eng->pool, eng->kt, jobs, 3);
    for (int t = 0; t < T; t++) rmsnorm(qa + (size_t)t * c->Rq, L->q_a_ln, c->Rq, c->eps, qa + (size_t)t * c->Rq);
    mm_one(eng->pool, eng->kt, L->q_b, qa, T, s->big0);
    float *cache = s->mla_cache + (size_t)L->mla_idx * (size_t)s->n_ctx * row_w;
    for (int t = 0; t < T; t++) {
        float *row = cache + (size_t)(s->pos + t) * row_w;
        const float *src = kva + (size_t)t * row_w;
        rmsnorm(src, L->kv_a_ln, c->Rkv, c->eps, row);
        memcpy(row + c->Rkv, src + c->Rkv, (size_t)c->dr * sizeof(float));
    }
    mla_ctx m = {.eng = eng, .s = s, .L = L, .T = T, .q = s->big0, .gate = s->big1, .out = s->big2, .cache = cache};
    parallel_for(eng->pool, (size_t)c->Hm, 1, mla_heads, &m);
    mm_one(eng->pool, eng->kt, L->o, s->big2, T, out);
    return 0;
}
