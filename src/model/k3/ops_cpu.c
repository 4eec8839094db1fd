/* ops_cpu.c - the CPU backend (ops.h): the block ops on the thread pool
 * with a kernel table, and choosing a backend from its spec string.
 *
 * The CPU backend owns the pool (parallel_for) and the kernel table
 * (mm_run / mm_one); its attention and FFN ops are kda.c's, mla.c's and
 * moe_cpu.c's, its row ops are here.  Row-local work (norms, mixes) runs on
 * every worker when there are enough rows: a row's result is its own,
 * whatever the split.  Buffers are host memory, zeroed, 64-byte aligned;
 * every op has finished when it returns, so sync does nothing.
 */
#include "model.h"
#include "mathfn.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

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

static void cpu_norm_rows(const model_ctx *mc, const float *x, const float *w, int T, int n, float eps, float *y)
{
    rows_ctx r = {.x = x, .w = w, .n = n, .eps = eps, .y = y};
    if (T < ROWS_PAR_MIN) norm_range(&r, 0, (size_t)T, 0);
    else parallel_for(mc->bk->pool, (size_t)T, 4, norm_range, &r);
}

static void cpu_mix_rows(const model_ctx *mc, const float *anc, int n_anc, size_t astride, const float *p, int T,
                         int n, const float *nwpw, float eps, float *out, float *probs)
{
    rows_ctx r = {.x = p, .w = nwpw, .anc = anc, .n = n, .n_anc = n_anc, .astride = astride, .eps = eps, .y = out,
                  .probs = probs};
    if (T < ROWS_PAR_MIN) mix_range(&r, 0, (size_t)T, 0);
    else parallel_for(mc->bk->pool, (size_t)T, 4, mix_range, &r);
}

static void cpu_add_rows(const model_ctx *mc, float *dst, const float *src, size_t n)
{
    (void)mc;
    for (size_t i = 0; i < n; i++) dst[i] = dst[i] + src[i];
}

static void cpu_copy_rows(const model_ctx *mc, float *dst, const float *src, size_t n)
{
    (void)mc;
    memcpy(dst, src, n * sizeof(float));
}

static void cpu_project(const model_ctx *mc, wmat w, const float *x, int T, float *y)
{
    mm_one(mc->bk->pool, mc->bk->kt, w, x, T, y);
}

static void *host_alloc(const k3_backend *bk, enum buf_role role, size_t bytes)
{
    (void)bk;
    (void)role;
    return aligned_alloc_zero(bytes ? bytes : 1);
}

static void host_release(const k3_backend *bk, void *p)
{
    (void)bk;
    aligned_free(p);
}

static void host_sync(const k3_backend *bk) { (void)bk; }

const k3_ops k3_ops_cpu = {
    .name = "cpu",
    .norm_rows = cpu_norm_rows,
    .mix_rows = cpu_mix_rows,
    .add_rows = cpu_add_rows,
    .copy_rows = cpu_copy_rows,
    .kda_rows = kda_forward,
    .kda_replay = kda_replay,
    .mla_rows = mla_forward,
    .dense_mlp = cpu_dense_mlp,
    .route = cpu_route,
    .experts = cpu_experts,
    .shared_down = cpu_shared_down,
    .combine = cpu_combine,
    .project = cpu_project,
    .alloc = host_alloc,
    .release = host_release,
    .sync = host_sync,
};

/* The host buffer ops, shared with the reference backend. */
void *ops_host_alloc(const k3_backend *bk, enum buf_role role, size_t bytes) { return host_alloc(bk, role, bytes); }
void ops_host_release(const k3_backend *bk, void *p) { host_release(bk, p); }
void ops_host_sync(const k3_backend *bk) { host_sync(bk); }

/* "cpu" or "cpu:ISA" -> the kernel name kernels_select takes ("" = best) */
static int cpu_isa(const char *spec, const char **isa)
{
    if (!strcmp(spec, "cpu")) {
        *isa = "";
        return 0;
    }
    if (strncmp(spec, "cpu:", 4)) return -1;
    const char *x = spec + 4;
    if (!strcmp(x, "scalar") || !strcmp(x, "ref")) *isa = "ref";
    else if (!strcmp(x, "avx2") || !strcmp(x, "avx512") || !strcmp(x, "neon")) *isa = x;
    else return -1;
    return 0;
}

#define BACKEND_CHOICES "cpu, cpu:avx512, cpu:avx2, cpu:neon, cpu:scalar or ref"

int k3_backend_spec_ok(const char *spec, df_error *err)
{
    const char *isa;
    if (!spec || !*spec || !strcmp(spec, "ref") || !cpu_isa(spec, &isa)) return 0;
    return df_err_set(err, DF_ERR_ARG, -1, "unknown backend '%s' (one of " BACKEND_CHOICES ")", spec);
}

int k3_backend_open(k3_backend *bk, const char *spec, int n_threads, df_error *err)
{
    memset(bk, 0, sizeof *bk);
    if (!spec || !*spec) spec = "cpu";
    if (k3_backend_spec_ok(spec, err)) return -1;
    if (!strcmp(spec, "ref")) {
        /* one thread, the scalar kernels: nothing here runs in parallel */
        bk->ops = &k3_ops_ref;
        bk->kt = kernels_ref();
        bk->n_workers = 1;
        snprintf(bk->name, sizeof bk->name, "ref");
        return 0;
    }
    const char *isa = "";
    cpu_isa(spec, &isa);
    df_error e2 = {0};
    bk->kt = kernels_select(isa, &e2);
    if (!bk->kt)
        return df_err_set(err, e2.code ? e2.code : DF_ERR_UNSUPPORTED, -1, "backend '%s': %s", spec, e2.msg);
    bk->ops = &k3_ops_cpu;
    bk->n_workers = n_threads < 1 ? 1 : n_threads;
    bk->pool = threadpool_new(bk->n_workers);
    snprintf(bk->name, sizeof bk->name, "cpu:%s", bk->kt == kernels_ref() ? "scalar" : bk->kt->name);
    return 0;
}

void k3_backend_close(k3_backend *bk)
{
    if (bk->pool) threadpool_free(bk->pool);
    memset(bk, 0, sizeof *bk);
}
