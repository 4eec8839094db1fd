/* kda.c - Kimi Delta Attention layer (spec section 5): the CPU backend's
 * kda_rows and kda_replay ops (ops.h), and the checkpoint and rollback
 * bookkeeping every backend's KDA shares.
 *
 * Projections for all T positions run as one batched job list; the short
 * convolution and the delta-rule recurrence then run per head (heads are
 * independent, so they are spread over the pool) and, within a head,
 * position by position in order.  Per-head state: S [Dk][Dk] and the conv
 * history of the head's channels.  Every sum has a fixed order (loops over
 * d outer, v inner; conv taps oldest first), so neither T nor the thread
 * count changes a bit.  A_log is read per head (spec D1); the engine keeps
 * exp(A_log) rounded to f32 (L->A_exp), the value a GGUF's -exp(A_log) holds.
 * Rollback (engine.h df_session_mark / df_session_truncate): the state
 * cannot be shortened, so after a mark each row's recurrence inputs (the
 * raw q, k, v and f_b projections and b) are kept; kda_replay runs the
 * first rows of them again over the state copied at the mark, through the
 * same per-row code, which gives the state of having evaluated only those.
 */
#include "model.h"
#include "mathfn.h"

#include <math.h>
#include <string.h>

enum { KDA_EXP_CHUNK = 64 }; /* decays per exp_n call (a stack array of doubles) */

typedef struct {
    const model_ctx *eng;
    session_bufs *s;
    const k3_layer *L;
    int T;
    float *rq, *rk, *rv, *rg, *fb, *b;   /* [T][P] / [T][Hk] projections */
    float *out;                           /* [T][P], may alias rq */
    int n_take;                           /* checkpoints inside these rows (session_bufs.ck_want): */
    int take_t[KDA_TAKES_MAX], take_entry[KDA_TAKES_MAX]; /* after row take_t, into checkpoint entry take_entry */
} kda_ctx;

/* One position of one head: the short convolutions (their history
 * shifted), the normalisations, the gate and the delta-rule update of S;
 * the head's output (before o_proj) into o[0..Dk) when o is not NULL.  The
 * forward pass and the rollback replay (kda_replay) both run this, so a
 * replayed state is the evaluated one, bit for bit. */
static void kda_row(kda_ctx *c, float *wb, float *S, float *hist_layer, size_t hh, int t, float *o, float *stat)
{
    const k3_config *cf = &c->eng->cfg;
    const k3_layer *L = c->L;
    const kernel_table *kt = c->eng->bk->kt;
    int Dk = cf->Dk, P = cf->P, Wc = cf->Wc, Hk = cf->Hk;
    float *qh = wb, *kh = wb + Dk, *vh = wb + 2 * Dk, *pred = wb + 3 * Dk, *oh = wb + 4 * Dk, *bk = wb + 5 * Dk;
    const float qscale = (float)(1.0 / sqrt((double)Dk));
    size_t c0 = hh * (size_t)Dk;
    double ea = (double)L->A_exp[hh];
    const float *raw[3] = {c->rq + (size_t)t * P + c0, c->rk + (size_t)t * P + c0, c->rv + (size_t)t * P + c0};
    float *dst[3] = {qh, kh, vh};
    for (int which = 0; which < 3; which++) {
        float *hist = hist_layer + (size_t)which * (Wc - 1) * P;
        const float *w = L->conv[which];
        for (int d = 0; d < Dk; d++) {
            size_t p = c0 + (size_t)d;
            float acc = 0.0f;
            for (int j = 0; j < Wc - 1; j++) acc += w[p * Wc + j] * hist[(size_t)j * P + p];
            acc += w[p * Wc + (Wc - 1)] * raw[which][d];
            dst[which][d] = acc;
            for (int j = 0; j + 1 < Wc - 1; j++) hist[(size_t)j * P + p] = hist[(size_t)(j + 1) * P + p];
            if (Wc > 1) hist[(size_t)(Wc - 2) * P + p] = raw[which][d];
        }
        kt->silu_n(dst[which], (size_t)Dk, dst[which]);
    }
    double sq = 0.0, sk = 0.0;
    for (int d = 0; d < Dk; d++) {
        sq += (double)qh[d] * qh[d];
        sk += (double)kh[d] * kh[d];
    }
    float rq = (float)(1.0 / sqrt(sq + 1e-6)), rk = (float)(1.0 / sqrt(sk + 1e-6));
    for (int d = 0; d < Dk; d++) {
        qh[d] = (qh[d] * rq) * qscale;
        kh[d] = kh[d] * rk;
    }
    float beta = df_sigmoidf(c->b[(size_t)t * Hk + hh]);
    /* S = diag(decay) S; pred = k^T S (each row decayed, then added
     * in row order); S += (beta k) (v - pred)^T; o = q^T S.  Two
     * passes over S, the kernel table's kda_decay_pred and
     * kda_update_out: every element sees the same operations in the
     * same order as four separate passes would (no fused multiply-add,
     * sums over d in increasing d), at any vector width. */
    /* the row's decay, for now: bk[d] = df_expf(glb * sigmoid(ea * z)), the
     * two exps through the table's exp_n (df_exp bit for bit) */
    for (int d0 = 0; d0 < Dk; d0 += KDA_EXP_CHUNK) {
        int m = Dk - d0 < KDA_EXP_CHUNK ? Dk - d0 : KDA_EXP_CHUNK;
        double e[KDA_EXP_CHUNK];
        for (int i = 0; i < m; i++) {
            float z = c->fb[(size_t)t * P + c0 + (size_t)(d0 + i)] + L->dt_bias[c0 + (size_t)(d0 + i)];
            e[i] = -ea * (double)z;
        }
        kt->exp_n(e, e, (size_t)m);
        for (int i = 0; i < m; i++) e[i] = (double)(cf->glb * (float)(1.0 / (1.0 + e[i])));
        kt->exp_n(e, e, (size_t)m);
        for (int i = 0; i < m; i++) bk[d0 + i] = (float)e[i];
    }
    if (stat) { /* the attention dump's statistics (session_bufs.kda_stat), sums in d order */
        double sum = 0.0;
        float mn = bk[0];
        for (int d = 0; d < Dk; d++) sum += bk[d], mn = bk[d] < mn ? bk[d] : mn;
        stat[0] = beta, stat[1] = (float)(sum / Dk), stat[2] = mn;
    }
    for (int v = 0; v < Dk; v++) pred[v] = 0.0f;
    kt->kda_decay_pred(S, Dk, bk, kh, pred);
    for (int v = 0; v < Dk; v++) pred[v] = vh[v] - pred[v];
    for (int d = 0; d < Dk; d++) bk[d] = beta * kh[d];
    for (int v = 0; v < Dk; v++) oh[v] = 0.0f;
    kt->kda_update_out(S, Dk, bk, pred, qh, oh);
    if (!o) return;
    rmsnorm(oh, L->o_norm, Dk, cf->eps, oh);
    const float *gate = c->rg + (size_t)t * P + c0;
    kt->sigmoid_n(gate, (size_t)Dk, o);
    if (stat) {
        double sum = 0.0;
        for (int d = 0; d < Dk; d++) sum += o[d];
        stat[3] = (float)(sum / Dk);
    }
    for (int d = 0; d < Dk; d++) o[d] = oh[d] * o[d];
}

/* A checkpoint taken inside a pass: this head's S and the conv history of
 * its channels, as they are after the row, into the checkpoint entry's copy
 * of the layer (session.c lays an entry out as kda_S then kda_hist, all layers). */
void kda_take_head(const k3_config *cf, session_bufs *s, const k3_layer *L, const float *S, const float *hist_layer,
                   size_t hh, int entry)
{
    size_t Dk = (size_t)cf->Dk, P = (size_t)cf->P, Wc1 = (size_t)cf->Wc - 1;
    size_t nS = s->ck_nS;
    float *dst = s->ck_state + (size_t)entry * (nS + s->ck_nH);
    memcpy(dst + ((size_t)L->kda_idx * cf->Hk + hh) * Dk * Dk, S, Dk * Dk * sizeof(float));
    float *dh = dst + nS + (size_t)L->kda_idx * 3 * Wc1 * P;
    for (size_t r = 0; r < 3 * Wc1; r++) memcpy(dh + r * P + hh * Dk, hist_layer + r * P + hh * Dk, Dk * sizeof(float));
}

/* The checkpoints asked for inside rows [0, T) at s->pos
 * (df_session_checkpoint_at), in row order: take_t[i] is the row after
 * which checkpoint entry take_entry[i] is taken (the state after row t is the state at
 * position pos+t+1).  Returns how many (at most KDA_TAKES_MAX). */
int kda_takes(const session_bufs *s, int T, int *take_t, int *take_entry)
{
    int n = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < s->n_ck && n < KDA_TAKES_MAX; i++)
            if (s->ck_want[i] == s->pos + t + 1) {
                take_t[n] = t;
                take_entry[n++] = i;
            }
    return n;
}

static void kda_heads(void *vctx, size_t h0, size_t h1, int worker)
{
    kda_ctx *c = vctx;
    session_bufs *s = c->s;
    const k3_config *cf = &c->eng->cfg;
    int Dk = cf->Dk, P = cf->P, Wc = cf->Wc, Hk = cf->Hk;
    float *wb = s->worker_buf + (size_t)worker * s->worker_w;
    float *S_layer = s->kda_S + (size_t)c->L->kda_idx * (size_t)Hk * Dk * Dk;
    float *hist_layer = s->kda_hist + (size_t)c->L->kda_idx * 3 * (size_t)(Wc - 1) * P;
    int stats = c->out && s->attn_on && s->attn_on[c->L - c->eng->layers];
    for (size_t hh = h0; hh < h1; hh++) {
        float *S = S_layer + hh * (size_t)Dk * Dk;
        int k = 0;
        for (int t = 0; t < c->T; t++) {
            kda_row(c, wb, S, hist_layer, hh, t, c->out ? c->out + (size_t)t * P + hh * (size_t)Dk : NULL,
                    stats ? s->kda_stat + ((size_t)t * Hk + hh) * 4 : NULL);
            for (; k < c->n_take && c->take_t[k] == t; k++)
                kda_take_head(cf, s, c->L, S, hist_layer, hh, c->take_entry[k]);
        }
    }
}

/* Where a KDA layer's rows after the rollback mark are kept:
 * [rb_rows][P] each of q, k, v, f_b, then [rb_rows][Hk] b. */
float *kda_rec_layer(const k3_config *c, session_bufs *s, int kda_idx)
{
    return s->kda_rec + (size_t)kda_idx * (size_t)s->rb_rows * (4 * (size_t)c->P + (size_t)c->Hk);
}

/* Rows after a rollback mark: keep the recurrence inputs (kda_replay). */
void kda_keep_rows(const k3_config *c, session_bufs *s, const k3_layer *L, const float *rq, const float *rk,
                   const float *rv, const float *fb, const float *b, int T)
{
    if (s->rb_mark < 0) return;
    size_t R = (size_t)s->rb_rows, P = (size_t)c->P, r0 = (size_t)(s->pos - s->rb_mark);
    float *rec = kda_rec_layer(c, s, L->kda_idx);
    const float *src[4] = {rq, rk, rv, fb};
    for (int i = 0; i < 4; i++) memcpy(rec + i * R * P + r0 * P, src[i], (size_t)T * P * sizeof(float));
    memcpy(rec + 4 * R * P + r0 * (size_t)c->Hk, b, (size_t)T * c->Hk * sizeof(float));
}

void kda_replay(const model_ctx *eng, session_bufs *s, const k3_layer *L, int rows)
{
    const k3_config *c = &eng->cfg;
    size_t R = (size_t)s->rb_rows, P = (size_t)c->P;
    float *rec = kda_rec_layer(c, s, L->kda_idx);
    kda_ctx k = {.eng = eng, .s = s, .L = L, .T = rows, .rq = rec, .rk = rec + R * P, .rv = rec + 2 * R * P,
                 .fb = rec + 3 * R * P, .b = rec + 4 * R * P, .rg = NULL, .out = NULL};
    parallel_for(eng->bk->pool, (size_t)c->Hk, 1, kda_heads, &k);
}

void kda_forward(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *x, int T, float *out)
{
    const k3_config *c = &eng->cfg;
    kda_ctx k = {.eng = eng, .s = s, .L = L, .T = T, .rq = s->big0, .rk = s->big1, .rv = s->big2, .rg = s->big3,
                 .fb = s->big4, .b = s->small1, .out = s->big0};
    size_t h = (size_t)c->h;
    mm_job jobs[6] = {
        {.w = L->q, .x = x, .xs = h, .y = k.rq, .ys = (size_t)c->P, .T = T},
        {.w = L->k, .x = x, .xs = h, .y = k.rk, .ys = (size_t)c->P, .T = T},
        {.w = L->v, .x = x, .xs = h, .y = k.rv, .ys = (size_t)c->P, .T = T},
        {.w = L->g, .x = x, .xs = h, .y = k.rg, .ys = (size_t)c->P, .T = T},
        {.w = L->fa, .x = x, .xs = h, .y = s->small0, .ys = (size_t)c->Dk, .T = T},
        {.w = L->b, .x = x, .xs = h, .y = k.b, .ys = (size_t)c->Hk, .T = T},
    };
    mm_run(eng->bk->pool, eng->bk->kt, jobs, 6);
    mm_one(eng->bk->pool, eng->bk->kt, L->fb, s->small0, T, k.fb);
    k.n_take = kda_takes(s, T, k.take_t, k.take_entry);
    kda_keep_rows(c, s, L, k.rq, k.rk, k.rv, k.fb, k.b, T);
    parallel_for(eng->bk->pool, (size_t)c->Hk, 1, kda_heads, &k);
    mm_one(eng->bk->pool, eng->bk->kt, L->o, k.out, T, out);
}
