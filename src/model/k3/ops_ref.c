/* ops_ref.c - the reference backend (ops.h): every block op as the
 * architecture spec writes it, one position at a time, one thread, over
 * the scalar kernels (kernels_ref) and the scalar math of mathfn.h.
 *
 * It is the oracle the other backends are tested against
 * (tests/test_backend.c: identical logits, bit for bit), so it is written
 * for reading, not speed: no thread pool, no job lists, no row slices, no
 * batches of experts, no vector code.  Where the CPU backend fuses work
 * (the KDA state's four passes in two, several heads per attention call,
 * all of a chunk's products in one job list), this file does the plain
 * form; the reduction-order contract (ops.h, kernels.h) is what makes the
 * two agree.  It shares the bookkeeping that is not arithmetic with the
 * CPU backend (KDA checkpoints and rollback rows, the routing rule, where
 * an expert's projections are in its slot).
 *
 * Scratch: the session's buffers, each position's vectors in row 0 of a
 * block buffer or worker 0's buffer.
 */
#include "model.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <string.h>

/* y = W x for one position (kernels.h's contract, scalar kernels) */
static void matvec(wmat w, const float *x, float *y)
{
    const kernel_table *k = kernels_ref();
    switch (w.type) {
    case W_F32: k->matmul_f32(w.data, (size_t)w.cols, w.cols, x, 0, 1, y, 0, 0, w.rows); break;
    case W_BF16: k->matmul_bf16(w.data, (size_t)w.cols, w.cols, x, 0, 1, y, 0, 0, w.rows); break;
    case W_MXFP4: k->matmul_mxfp4(w.data, w.scales, w.cols, x, 0, 1, y, 0, 0, w.rows); break;
    case W_MXFP4_GG: k->matmul_mxfp4_gg(w.data, NULL, w.cols, x, 0, 1, y, 0, 0, w.rows); break;
    case W_F16: k->matmul_f16(w.data, (size_t)w.cols, w.cols, x, 0, 1, y, 0, 0, w.rows); break;
    case W_Q8_0: k->matmul_q8_0(w.data, NULL, w.cols, x, 0, 1, y, 0, 0, w.rows); break;
    case W_QB: k->matmul_qblock(w.qb, w.data, w.cols, x, 0, 1, y, 0, 0, w.rows); break;
    }
}

static void ref_norm_rows(const model_ctx *mc, const float *x, const float *w, int T, int n, float eps, float *y)
{
    (void)mc;
    for (int t = 0; t < T; t++) rmsnorm(x + (size_t)t * n, w, n, eps, y + (size_t)t * n);
}

static void ref_mix_rows(const model_ctx *mc, const float *anc, int n_anc, size_t astride, const float *p, int T, int n,
                         const float *nwpw, float eps, float *out, float *probs)
{
    (void)mc;
    for (int t = 0; t < T; t++) {
        size_t r = (size_t)t * n;
        attnres_mix(anc + r, n_anc, astride, p + r, 1, n, nwpw, eps, out + r,
                    probs ? probs + (size_t)t * (n_anc + 1) : NULL);
    }
}

static void ref_add_rows(const model_ctx *mc, float *dst, const float *src, size_t n)
{
    (void)mc;
    for (size_t i = 0; i < n; i++) dst[i] = dst[i] + src[i];
}

static void ref_copy_rows(const model_ctx *mc, float *dst, const float *src, size_t n)
{
    (void)mc;
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

static void ref_project(const model_ctx *mc, wmat w, const float *x, int T, float *y)
{
    (void)mc;
    for (int t = 0; t < T; t++) matvec(w, x + (size_t)t * w.cols, y + (size_t)t * w.rows);
}

/* ---- KDA (spec 5) ---- */

/* The raw projections of a block of rows, where kda_keep_rows and the
 * recurrence read them: [T][P] q, k, v, g, f_b and [T][Hk] b. */
typedef struct kda_rows_in {
    const float *q, *k, *v, *g, *fb, *b;
} kda_rows_in;

/* One head hh at row t: short convolutions over the head's channels (the
 * history shifted), the normalised q and k, the gate, the delta rule in its
 * four textbook passes, and the gated, normalised output into o (or none). */
static void kda_step(const model_ctx *mc, session_bufs *s, const k3_layer *L, const kda_rows_in *in, int t, size_t hh,
                     float *S, float *hist_layer, float *o)
{
    const k3_config *cf = &mc->cfg;
    int Dk = cf->Dk, P = cf->P, Wc = cf->Wc, Hk = cf->Hk;
    float *w = s->worker_buf;
    float *q = w, *k = w + Dk, *v = w + 2 * Dk, *pred = w + 3 * Dk, *oh = w + 4 * Dk, *decay = w + 5 * Dk;
    size_t c0 = hh * (size_t)Dk;
    const float *raw[3] = {in->q + (size_t)t * P + c0, in->k + (size_t)t * P + c0, in->v + (size_t)t * P + c0};
    float *conv_out[3] = {q, k, v};
    for (int which = 0; which < 3; which++) {
        float *hist = hist_layer + (size_t)which * (Wc - 1) * P;
        const float *taps = L->conv[which];
        for (int d = 0; d < Dk; d++) {
            size_t ch = c0 + (size_t)d;
            /* taps oldest first, the current row last */
            float acc = 0.0f;
            for (int j = 0; j < Wc - 1; j++) acc += taps[ch * Wc + j] * hist[(size_t)j * P + ch];
            acc += taps[ch * Wc + (Wc - 1)] * raw[which][d];
            conv_out[which][d] = df_siluf(acc);
            for (int j = 0; j < Wc - 2; j++) hist[(size_t)j * P + ch] = hist[(size_t)(j + 1) * P + ch];
            if (Wc > 1) hist[(size_t)(Wc - 2) * P + ch] = raw[which][d];
        }
    }
    /* L2 normalisation in double; q also scaled by 1/sqrt(Dk) */
    double sq = 0.0, sk = 0.0;
    for (int d = 0; d < Dk; d++) sq += (double)q[d] * q[d];
    for (int d = 0; d < Dk; d++) sk += (double)k[d] * k[d];
    float rq = (float)(1.0 / sqrt(sq + 1e-6)), rk = (float)(1.0 / sqrt(sk + 1e-6));
    const float qscale = (float)(1.0 / sqrt((double)Dk));
    for (int d = 0; d < Dk; d++) q[d] = (q[d] * rq) * qscale;
    for (int d = 0; d < Dk; d++) k[d] = k[d] * rk;
    float beta = df_sigmoidf(in->b[(size_t)t * Hk + hh]);
    /* per-channel decay exp(g), g = glb * sigmoid(A * (f_b + dt_bias)) */
    double A = (double)L->A_exp[hh];
    for (int d = 0; d < Dk; d++) {
        float z = in->fb[(size_t)t * P + c0 + d] + L->dt_bias[c0 + d];
        float g = cf->glb * (float)(1.0 / (1.0 + df_exp(-A * (double)z)));
        decay[d] = df_expf(g);
    }
    /* S = diag(decay) S */
    for (int d = 0; d < Dk; d++)
        for (int j = 0; j < Dk; j++) S[(size_t)d * Dk + j] *= decay[d];
    /* pred = k^T S, summed over d in order */
    for (int j = 0; j < Dk; j++) pred[j] = 0.0f;
    for (int d = 0; d < Dk; d++)
        for (int j = 0; j < Dk; j++) pred[j] += k[d] * S[(size_t)d * Dk + j];
    /* S += (beta k) (v - pred)^T */
    for (int j = 0; j < Dk; j++) pred[j] = v[j] - pred[j];
    for (int d = 0; d < Dk; d++) {
        float bk = beta * k[d];
        for (int j = 0; j < Dk; j++) S[(size_t)d * Dk + j] += bk * pred[j];
    }
    /* o = q^T S */
    for (int j = 0; j < Dk; j++) oh[j] = 0.0f;
    for (int d = 0; d < Dk; d++)
        for (int j = 0; j < Dk; j++) oh[j] += q[d] * S[(size_t)d * Dk + j];
    if (!o) return;
    rmsnorm(oh, L->o_norm, Dk, cf->eps, oh);
    const float *gate = in->g + (size_t)t * P + c0;
    for (int d = 0; d < Dk; d++) o[d] = oh[d] * df_sigmoidf(gate[d]);
}

/* rows [0, T) over the layer's state, position by position, head by head;
 * the checkpoints asked for inside the rows are taken after their row */
static void kda_recur(const model_ctx *mc, session_bufs *s, const k3_layer *L, const kda_rows_in *in, int T,
                      float *heads_out, int takes)
{
    const k3_config *cf = &mc->cfg;
    size_t Dk = (size_t)cf->Dk, P = (size_t)cf->P, Hk = (size_t)cf->Hk;
    float *S_layer = s->kda_S + (size_t)L->kda_idx * Hk * Dk * Dk;
    float *hist_layer = s->kda_hist + (size_t)L->kda_idx * 3 * (size_t)(cf->Wc - 1) * P;
    int take_t[KDA_TAKES_MAX], take_entry[KDA_TAKES_MAX];
    int n_take = takes ? kda_takes(s, T, take_t, take_entry) : 0, k = 0;
    for (int t = 0; t < T; t++) {
        for (size_t hh = 0; hh < Hk; hh++)
            kda_step(mc, s, L, in, t, hh, S_layer + hh * Dk * Dk, hist_layer,
                     heads_out ? heads_out + (size_t)t * P + hh * Dk : NULL);
        for (; k < n_take && take_t[k] == t; k++)
            for (size_t hh = 0; hh < Hk; hh++)
                kda_take_head(cf, s, L, S_layer + hh * Dk * Dk, hist_layer, hh, take_entry[k]);
    }
}

static void ref_kda_rows(const model_ctx *mc, session_bufs *s, const k3_layer *L, const float *x, int T, float *out)
{
    const k3_config *c = &mc->cfg;
    size_t h = (size_t)c->h, P = (size_t)c->P, Hk = (size_t)c->Hk, Dk = (size_t)c->Dk;
    float *q = s->big0, *k = s->big1, *v = s->big2, *g = s->big3, *fb = s->big4, *b = s->small1, *fa = s->small0;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * h;
        matvec(L->q, xt, q + t * P);
        matvec(L->k, xt, k + t * P);
        matvec(L->v, xt, v + t * P);
        matvec(L->g, xt, g + t * P);
        matvec(L->fa, xt, fa + t * Dk);
        matvec(L->fb, fa + t * Dk, fb + t * P);
        matvec(L->b, xt, b + t * Hk);
    }
    kda_keep_rows(c, s, L, q, k, v, fb, b, T);
    kda_rows_in in = {.q = q, .k = k, .v = v, .g = g, .fb = fb, .b = b};
    /* a head's output replaces its raw q channels of the row (read first) */
    kda_recur(mc, s, L, &in, T, q, 1);
    for (int t = 0; t < T; t++) matvec(L->o, q + t * P, out + (size_t)t * h);
}

static void ref_kda_replay(const model_ctx *mc, session_bufs *s, const k3_layer *L, int rows)
{
    const k3_config *c = &mc->cfg;
    size_t R = (size_t)s->rb_rows, P = (size_t)c->P;
    const float *rec = kda_rec_layer(c, s, L->kda_idx);
    kda_rows_in in = {.q = rec, .k = rec + R * P, .v = rec + 2 * R * P, .fb = rec + 3 * R * P, .b = rec + 4 * R * P};
    kda_recur(mc, s, L, &in, rows, NULL, 0);
}

/* ---- MLA (spec 6), kv_b absorbed into the query and the output ---- */

static int ref_mla_rows(const model_ctx *mc, session_bufs *s, const k3_layer *L, const float *x, int T, float *out,
                        df_error *err)
{
    (void)err;
    const k3_config *c = &mc->cfg;
    int Rq = c->Rq, Rkv = c->Rkv, dr = c->dr, dn = c->dn, dv = c->dv, Hm = c->Hm;
    size_t h = (size_t)c->h, row_w = (size_t)Rkv + (size_t)dr, qs = (size_t)(dn + dr);
    const float scale = (float)(1.0 / sqrt((double)(dn + dr)));
    float *qa = s->small0, *kva = s->small1, *q = s->big0, *gate = s->big1, *heads = s->big2;
    float *cache = s->mla_cache + (size_t)L->mla_idx * (size_t)s->n_ctx * row_w;
    float *oh = s->worker_buf, *qabs = oh + dv, *ctx = qabs + Rkv, *sc = ctx + Rkv;
    const wmat *kw = L->kv_split ? &L->k_b : &L->kv_b;
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * h;
        matvec(L->q_a, xt, qa);
        rmsnorm(qa, L->q_a_ln, Rq, c->eps, qa);
        matvec(L->q_b, qa, q);
        matvec(L->kv_a, xt, kva);
        matvec(L->mg, xt, gate);
        /* this position's cache row: the normalised latent, then k_rope */
        int pos = s->pos + t;
        float *row = cache + (size_t)pos * row_w;
        rmsnorm(kva, L->kv_a_ln, Rkv, c->eps, row);
        for (int j = 0; j < dr; j++) row[Rkv + j] = kva[Rkv + j];
        for (int hh = 0; hh < Hm; hh++) {
            const float *qn = q + (size_t)hh * qs;
            /* q_abs[j] = sum over i of k_b[hh][i][j] * q_nope[i], i in order */
            for (int j = 0; j < Rkv; j++) {
                float a = 0.0f;
                for (int i = 0; i < dn; i++) {
                    size_t e = L->kv_split ? (size_t)hh * dn * Rkv + (size_t)i + (size_t)j * dn
                                           : (size_t)hh * (dn + dv) * Rkv + (size_t)i * Rkv + (size_t)j;
                    a += wmat_get(kw, e) * qn[i];
                }
                qabs[j] = a;
            }
            kernels_ref()->mla_attend(cache, row_w, Rkv, dr, pos + 1, qabs, (size_t)Rkv, qn + dn, qs, 1, scale, sc,
                                      ctx);
            /* the head's value rows times the context */
            size_t vrow0 = L->kv_split ? (size_t)hh * dv : (size_t)hh * (dn + dv) + (size_t)dn;
            matvec(wmat_rows(L->kv_split ? L->v_b : L->kv_b, (int)vrow0, dv), ctx, oh);
            const float *gt = gate + (size_t)hh * dv;
            for (int j = 0; j < dv; j++) heads[(size_t)hh * dv + j] = oh[j] * df_sigmoidf(gt[j]);
        }
        matvec(L->o, heads, out + (size_t)t * h);
    }
    return 0;
}

/* ---- FFN (spec 7) ---- */

static void ref_dense_mlp(const model_ctx *mc, session_bufs *s, const k3_layer *L, const float *y, int T, float *out)
{
    const k3_config *c = &mc->cfg;
    size_t h = (size_t)c->h, Dff = (size_t)c->Dff;
    for (int t = 0; t < T; t++) {
        matvec(L->gate, y + (size_t)t * h, s->big0);
        matvec(L->up, y + (size_t)t * h, s->big1);
        kernels_ref()->situ_n(s->big0, s->big1, Dff, c->b1, c->b2, s->big0);
        matvec(L->down, s->big0, out + (size_t)t * h);
    }
}

static void ref_route(const model_ctx *mc, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt,
                      int shared)
{
    const k3_config *c = &mc->cfg;
    size_t h = (size_t)c->h, NsI = (size_t)c->Ns * c->I;
    float *logits = s->big2, *z = s->big3;
    for (int t = 0; t < nt; t++) {
        const float *yt = y + (size_t)t * h;
        size_t tt = (size_t)(t0 + t);
        matvec(L->router, yt, logits);
        moe_route_row(c, logits, L->router_bias, s->route_ids + tt * c->k, s->route_w + tt * c->k,
                      s->route_s + tt * c->k, s->big4, s->big5);
        matvec(L->lat_down, yt, z);
        moe_prep_rows(mc->store, (int)(L - mc->layers), 0, z, c->Lt, s->zp + tt * c->Lt);
        if (shared && NsI) {
            matvec(L->sh_gate, yt, s->big0 + (size_t)t * NsI);
            matvec(L->sh_up, yt, s->big1 + (size_t)t * NsI);
        }
    }
}

static void ref_experts(const model_ctx *mc, session_bufs *s, int il, const int *us, int n)
{
    const k3_config *c = &mc->cfg;
    int Lt = c->Lt, I = c->I;
    for (int i = 0; i < n; i++) {
        int u = us[i];
        const expert_loc *loc = &mc->store->loc[(size_t)il * c->E + (size_t)s->uniq[u]];
        wmat w1 = moe_expert_mat(mc->store, loc, s->uniq_slot[u], 0, I, Lt);
        wmat w2 = moe_expert_mat(mc->store, loc, s->uniq_slot[u], 1, Lt, I);
        wmat w3 = moe_expert_mat(mc->store, loc, s->uniq_slot[u], 2, I, Lt);
        for (int r = 0; r < s->uniq_count[u]; r++) {
            size_t row = (size_t)s->uniq_first[u] + (size_t)r;
            const float *x = s->g_x_full ? s->g_x + row * Lt : s->zp + (size_t)s->row_pos[row] * Lt;
            matvec(w1, x, s->g_h1);
            matvec(w3, x, s->g_h3);
            kernels_ref()->situ_n(s->g_h1, s->g_h3, (size_t)I, c->b1, c->b2, s->g_h1);
            moe_prep_rows(mc->store, il, 1, s->g_h1, I, s->g_h3);
            matvec(w2, s->g_h3, s->g_out + row * Lt);
        }
    }
}

static void ref_shared_down(const model_ctx *mc, session_bufs *s, const k3_layer *L, int T, float *out)
{
    const k3_config *c = &mc->cfg;
    size_t h = (size_t)c->h, NsI = (size_t)c->Ns * c->I;
    for (int t = 0; t < T; t++) {
        if (!NsI) {
            for (size_t i = 0; i < h; i++) out[(size_t)t * h + i] = 0.0f;
            continue;
        }
        float *a = s->big0 + (size_t)t * NsI;
        kernels_ref()->situ_n(a, s->big1 + (size_t)t * NsI, NsI, c->b1, c->b2, a);
        matvec(L->sh_down, a, out + (size_t)t * h);
    }
}

static void ref_combine(const model_ctx *mc, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt,
                        float *out, int shared_done)
{
    const k3_config *c = &mc->cfg;
    size_t h = (size_t)c->h, NsI = (size_t)c->Ns * c->I, Lt = (size_t)c->Lt;
    if (!shared_done) {
        for (int t = 0; t < nt && NsI; t++) {
            matvec(L->sh_gate, y + (size_t)t * h, s->big0 + (size_t)t * NsI);
            matvec(L->sh_up, y + (size_t)t * h, s->big1 + (size_t)t * NsI);
        }
        ref_shared_down(mc, s, L, nt, out);
    }
    float *a = s->big4, *up = s->big5;
    for (int t = 0; t < nt; t++) {
        size_t tt = (size_t)(t0 + t);
        /* the routed outputs weighted, in route order */
        for (size_t i = 0; i < Lt; i++) a[i] = 0.0f;
        for (int j = 0; j < c->k; j++) {
            const float *o = s->g_out + (size_t)s->row_of[tt * c->k + j] * Lt;
            float w = s->route_w[tt * c->k + j];
            for (size_t i = 0; i < Lt; i++) a[i] = a[i] + o[i] * w;
        }
        rmsnorm(a, L->lat_norm, (int)Lt, c->eps, a);
        matvec(L->lat_up, a, up);
        for (size_t i = 0; i < h; i++) out[(size_t)t * h + i] = up[i] + out[(size_t)t * h + i];
    }
}

const k3_ops k3_ops_ref = {
    .name = "ref",
    .norm_rows = ref_norm_rows,
    .mix_rows = ref_mix_rows,
    .add_rows = ref_add_rows,
    .copy_rows = ref_copy_rows,
    .kda_rows = ref_kda_rows,
    .kda_replay = ref_kda_replay,
    .mla_rows = ref_mla_rows,
    .dense_mlp = ref_dense_mlp,
    .route = ref_route,
    .experts = ref_experts,
    .shared_down = ref_shared_down,
    .combine = ref_combine,
    .project = ref_project,
    .alloc = ops_host_alloc,
    .release = ops_host_release,
    .sync = ops_host_sync,
};
