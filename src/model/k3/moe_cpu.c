/* moe_cpu.c - the CPU backend's FFN ops (ops.h): the dense MLP, routing,
 * a group of routed experts, the shared experts and the combine, on the
 * thread pool with the kernel table (spec section 7).
 *
 * Routed experts run in batches of pieces whose rows fit g_h1/g_h3 (an
 * expert with more rows than a batch in pieces): one job list for every
 * gate and up product of a batch, SiTU and the reordering by row on every
 * worker, one job list for the down products.  Each (position, route j)
 * output lands in its own row of g_out; the combine sums a position's
 * outputs in route order (the descending biased score), so the result does
 * not depend on which other positions share the chunk, the row slices or
 * the batches.  Reading experts and the distinct lists are moe.c's and
 * expert_fetch.c's; this file only computes.
 */
#include "model.h"
#include "mathfn.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <string.h>

typedef struct situ_ctx {
    const kernel_table *kt;
    const float *g, *u;
    float *out;
    float b1, b2;
} situ_ctx;

static void situ_range(void *v, size_t a, size_t b, int worker)
{
    (void)worker;
    situ_ctx *c = v;
    c->kt->situ_n(c->g + a, c->u + a, b - a, c->b1, c->b2, c->out + a);
}

/* SiTU over n elements (out may be g), on every worker when there are many:
 * each element's result is its own, whatever the split */
static void situ_par(const model_ctx *eng, const float *g, const float *u, size_t n, float b1, float b2, float *out)
{
    if (n < 65536) {
        eng->bk->kt->situ_n(g, u, n, b1, b2, out);
        return;
    }
    situ_ctx c = {.kt = eng->bk->kt, .g = g, .u = u, .out = out, .b1 = b1, .b2 = b2};
    parallel_for(eng->bk->pool, n, 8192, situ_range, &c);
}

/* In blocks of as many rows as big0/big1 hold at Dff floats each (a row's
 * products do not depend on the block: the kernels' contract). */
void cpu_dense_mlp(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int T, float *out)
{
    const k3_config *c = &eng->cfg;
    size_t h = (size_t)c->h, Dff = (size_t)c->Dff;
    int rows = (int)(s->big_cap / Dff);
    CHECK(rows >= 1);
    for (int t0 = 0; t0 < T; t0 += rows) {
        int nt = T - t0 < rows ? T - t0 : rows;
        const float *yt = y + (size_t)t0 * h;
        mm_job jobs[2] = {
            {.w = L->gate, .x = yt, .xs = h, .y = s->big0, .ys = Dff, .T = nt},
            {.w = L->up, .x = yt, .xs = h, .y = s->big1, .ys = Dff, .T = nt},
        };
        mm_run(eng->bk->pool, eng->bk->kt, jobs, 2);
        situ_par(eng, s->big0, s->big1, (size_t)nt * Dff, c->b1, c->b2, s->big0);
        mm_one(eng->bk->pool, eng->bk->kt, L->down, s->big0, nt, out + (size_t)t0 * h);
    }
}

typedef struct act_ctx {
    const model_ctx *eng;
    session_bufs *s;
    int il;
} act_ctx;

/* Rows [f0, f1) of g_h1/g_h3 (a batch's rows, packed): h1 = SiTU(h1, h3),
 * then h3 = h1 as the down-projection reads it (reordered for MXFP4; h3 is
 * not needed after SiTU). */
static void act_rows(void *v, size_t f0, size_t f1, int worker)
{
    (void)worker;
    act_ctx *a = v;
    session_bufs *s = a->s;
    const k3_config *c = &a->eng->cfg;
    size_t I = (size_t)c->I;
    for (size_t f = f0; f < f1; f++) {
        float *h1 = s->g_h1 + f * I, *h3 = s->g_h3 + f * I;
        a->eng->bk->kt->situ_n(h1, h3, I, c->b1, c->b2, h1);
        moe_prep_rows(a->eng->store, a->il, 1, h1, (int)I, h3);
    }
}

/* A piece of one distinct expert's gathered rows: [off, off + n) of its
 * uniq_count[u] rows (an expert with more rows than g_rows runs in pieces;
 * a row's products do not depend on which piece or batch holds it). */
typedef struct piece {
    int u, off, n;
} piece;

/* The three expert products of a batch of pieces whose rows fit g_h1/g_h3
 * (packed there in the batch's order).  Without g_x_full the batch's input
 * rows are gathered from zp here, into g_x's first rows. */
static void run_expert_batch(const model_ctx *eng, session_bufs *s, int il, const piece *pc, int n)
{
    const k3_config *c = &eng->cfg;
    int E = c->E, Lt = c->Lt, I = c->I;
    mm_job jobs[MM_MAX_JOBS];
    int nj = 0, rows = 0;
    CHECK(n > 0 && 2 * n <= MM_MAX_JOBS);
    for (int i = 0; i < n; i++) {
        int u = pc[i].u, nt = pc[i].n;
        const expert_loc *loc = &eng->store->loc[(size_t)il * E + (size_t)s->uniq[u]];
        const uint8_t *slot = s->uniq_slot[u];
        size_t r0 = (size_t)s->uniq_first[u] + (size_t)pc[i].off;
        const float *x = s->g_x + r0 * Lt;
        if (!s->g_x_full) {
            float *gx = s->g_x + (size_t)rows * Lt;
            for (int r = 0; r < nt; r++)
                memcpy(gx + (size_t)r * Lt, s->zp + (size_t)s->row_pos[r0 + (size_t)r] * Lt, (size_t)Lt * sizeof(float));
            x = gx;
        }
        jobs[nj++] = (mm_job){.w = moe_expert_mat(eng->store, loc, slot, 0, I, Lt), .x = x, .xs = (size_t)Lt,
                              .y = s->g_h1 + (size_t)rows * I, .ys = (size_t)I, .T = nt};
        jobs[nj++] = (mm_job){.w = moe_expert_mat(eng->store, loc, slot, 2, I, Lt), .x = x, .xs = (size_t)Lt,
                              .y = s->g_h3 + (size_t)rows * I, .ys = (size_t)I, .T = nt};
        rows += nt;
    }
    mm_run(eng->bk->pool, eng->bk->kt, jobs, nj);
    /* SiTU and the reordering, row by row, on every worker; a few rows
     * (decode) are not worth waking the workers for */
    act_ctx a = {.eng = eng, .s = s, .il = il};
    if ((size_t)rows * (size_t)I < 32768) act_rows(&a, 0, (size_t)rows, 0);
    else parallel_for(eng->bk->pool, (size_t)rows, 4, act_rows, &a);
    nj = 0;
    rows = 0;
    for (int i = 0; i < n; i++) {
        int u = pc[i].u, nt = pc[i].n;
        const expert_loc *loc = &eng->store->loc[(size_t)il * E + (size_t)s->uniq[u]];
        size_t r0 = (size_t)s->uniq_first[u] + (size_t)pc[i].off;
        jobs[nj++] = (mm_job){.w = moe_expert_mat(eng->store, loc, s->uniq_slot[u], 1, Lt, I),
                              .x = s->g_h3 + (size_t)rows * I, .xs = (size_t)I, .y = s->g_out + r0 * Lt,
                              .ys = (size_t)Lt, .T = nt};
        rows += nt;
    }
    mm_run(eng->bk->pool, eng->bk->kt, jobs, nj);
}

/* The listed distinct experts (indices into s->uniq), each over the rows
 * gathered for it, in batches whose rows fit g_h1/g_h3 (g_rows: a prompt
 * chunk's T*k rows need not all be held at once, nor one expert's T). */
void cpu_experts(const model_ctx *eng, session_bufs *s, int il, const int *us, int n)
{
    piece pc[MM_MAX_JOBS / 2];
    int np = 0;
    size_t rows = 0;
    CHECK(n > 0 && s->g_rows > 0);
    for (int i = 0; i < n; i++) {
        int u = us[i], cnt = s->uniq_count[u];
        for (int off = 0; off < cnt;) {
            size_t room = s->g_rows - rows;
            int take = (size_t)(cnt - off) < room ? cnt - off : (int)room;
            pc[np++] = (piece){.u = u, .off = off, .n = take};
            rows += (size_t)take;
            off += take;
            if (rows == s->g_rows || np == MM_MAX_JOBS / 2) {
                run_expert_batch(eng, s, il, pc, np);
                np = 0;
                rows = 0;
            }
        }
    }
    if (np) run_expert_batch(eng, s, il, pc, np);
}

/* shared experts: SiTU of the gate/up products already in big0/big1, then
 * the down-projection into out (zeros when the model has none) */
void cpu_shared_down(const model_ctx *eng, session_bufs *s, const k3_layer *L, int T, float *out)
{
    const k3_config *c = &eng->cfg;
    int NsI = c->Ns * c->I;
    if (NsI) {
        situ_par(eng, s->big0, s->big1, (size_t)T * NsI, c->b1, c->b2, s->big0);
        mm_one(eng->bk->pool, eng->bk->kt, L->sh_down, s->big0, T, out);
    } else {
        memset(out, 0, (size_t)T * c->h * sizeof(float));
    }
}

void cpu_route(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, int shared)
{
    const k3_config *c = &eng->cfg;
    int E = c->E, k = c->k, Lt = c->Lt, h = c->h, NsI = c->Ns * c->I;

    /* router, latent down-projection (and shared experts) in one job list */
    float *rlog = s->big2, *z = s->big3;
    mm_job jobs[MM_MAX_JOBS];
    int nj = 0;
    jobs[nj++] = (mm_job){.w = L->router, .x = y, .xs = (size_t)h, .y = rlog, .ys = (size_t)E, .T = nt};
    jobs[nj++] = (mm_job){.w = L->lat_down, .x = y, .xs = (size_t)h, .y = z, .ys = (size_t)Lt, .T = nt};
    if (shared && NsI) {
        jobs[nj++] = (mm_job){.w = L->sh_gate, .x = y, .xs = (size_t)h, .y = s->big0, .ys = (size_t)NsI, .T = nt};
        jobs[nj++] = (mm_job){.w = L->sh_up, .x = y, .xs = (size_t)h, .y = s->big1, .ys = (size_t)NsI, .T = nt};
    }
    mm_run(eng->bk->pool, eng->bk->kt, jobs, nj);

    /* routing; sig/choice scratch in big4/big5 */
    for (int t = 0; t < nt; t++)
        moe_route_row(c, rlog + (size_t)t * E, L->router_bias, s->route_ids + (size_t)(t0 + t) * k,
                      s->route_w + (size_t)(t0 + t) * k, s->route_s + (size_t)(t0 + t) * k, s->big4, s->big5);
    int il = (int)(L - eng->layers);
    for (int t = 0; t < nt; t++) moe_prep_rows(eng->store, il, 0, z + (size_t)t * Lt, Lt, s->zp + (size_t)(t0 + t) * Lt);
}

void cpu_combine(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, float *out,
                int shared_done)
{
    const k3_config *c = &eng->cfg;
    int k = c->k, Lt = c->Lt, h = c->h, NsI = c->Ns * c->I;
    if (!shared_done) {
        if (NsI) {
            mm_job jobs[2] = {
                {.w = L->sh_gate, .x = y, .xs = (size_t)h, .y = s->big0, .ys = (size_t)NsI, .T = nt},
                {.w = L->sh_up, .x = y, .xs = (size_t)h, .y = s->big1, .ys = (size_t)NsI, .T = nt},
            };
            mm_run(eng->bk->pool, eng->bk->kt, jobs, 2);
        }
        cpu_shared_down(eng, s, L, nt, out);
    }
    /* weighted sum in route order, latent norm, up-projection, + shared */
    float *acc = s->big4;
    for (int t = 0; t < nt; t++) {
        float *a = acc + (size_t)t * Lt;
        size_t tt = (size_t)(t0 + t);
        for (int i = 0; i < Lt; i++) a[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            const float *o = s->g_out + (size_t)s->row_of[tt * k + j] * Lt;
            float w = s->route_w[tt * k + j];
            for (int i = 0; i < Lt; i++) a[i] = a[i] + o[i] * w;
        }
        rmsnorm(a, L->lat_norm, Lt, c->eps, a);
    }
    mm_one(eng->bk->pool, eng->bk->kt, L->lat_up, acc, nt, s->big5);
    for (size_t i = 0; i < (size_t)nt * h; i++) out[i] = s->big5[i] + out[i];
}

