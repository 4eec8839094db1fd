/* bench_mla.c - MLA attention over a long latent cache: the scalar reference
 * against the selected kernels, side by side in one run.
 *
 *   bench_mla MODEL_DIR [--ctx 4096,16384,32768] [--threads N] [--reps N] [--k3] [--engine-at N]
 *
 * For each context n, the attention time of one decode step: every MLA
 * layer (one latent cache of n random rows each), every head, called as
 * mla.c calls mla_attend (ranges of >= 4 heads on the pool, as many heads
 * per call as the range holds); with kernels_ref(), with the selected
 * kernels, and with the selected kernels one head per call (what mla.c falls
 * back to when a worker's scratch holds one head's scores only: engine.c's
 * worker_w near a full context).  Then the model's decode step measured by
 * the engine at a short context (everything but the attention), and the
 * share of a step the attention takes at n: attn / (base + attn).
 * --k3 repeats the attention rows for K3's shape (one MLA layer of Rkv 512,
 * dr 64, 96 heads; the step is 24 of them) up to 128K positions (the
 * reference only to 32K: seconds per step) and prints the 128K estimate.
 * --engine-at N also measures the engine's decode step after N positions
 * (a prefill of N - 1 tokens first; its steps alternate with the base's),
 * to check the sum above.
 * Each figure is the median of --reps; one round runs every variant.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "kernels.h"
#include "model.h"
#include "threadpool.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double median(double *v, int n) { return median_d(v, n); }

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rndf(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((float)((rng >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f) * 2.0f;
}

typedef struct {
    int Rkv, dr, dn, Hm, n_mla;
} shape;

typedef struct {
    const kernel_table *kt;
    const shape *sh;
    const float *cache;  /* [n][Rkv+dr] */
    const float *q;      /* [Hm][Rkv+dr] */
    int n, nb_max;
    float *scratch;      /* [threads][worker_w] */
    size_t worker_w;
    float *out;          /* [Hm][Rkv] */
} att_ctx;

/* mla.c's mla_heads without the query absorption and the value rows: the
 * block's q_abs in the worker's scratch, ctx written over it */
static void att_worker(void *vctx, size_t h0, size_t h1, int worker)
{
    att_ctx *c = vctx;
    int Rkv = c->sh->Rkv, dr = c->sh->dr, rw = Rkv + dr;
    int nb = h1 - h0 < (size_t)c->nb_max ? (int)(h1 - h0) : c->nb_max;
    float *ql = c->scratch + (size_t)worker * c->worker_w, *sc = ql + (size_t)nb * Rkv;
    float scale = (float)(1.0 / sqrt((double)(c->sh->dn + dr)));
    for (size_t hb = h0; hb < h1; hb += (size_t)nb) {
        int nh = h1 - hb < (size_t)nb ? (int)(h1 - hb) : nb;
        const float *q = c->q + hb * rw;
        for (int b = 0; b < nh; b++) memcpy(ql + (size_t)b * Rkv, q + (size_t)b * rw, (size_t)Rkv * sizeof(float));
        c->kt->mla_attend(c->cache, (size_t)rw, Rkv, dr, c->n, ql, (size_t)Rkv, q + Rkv, (size_t)rw, nh, scale, sc,
                          ql);
        memcpy(c->out + hb * Rkv, ql, (size_t)nh * Rkv * sizeof(float));
    }
}

/* seconds for one step's attention: n_layers layers of sh at context n */
static double attend_step(threadpool *pool, int threads, const kernel_table *kt, const shape *sh, float **caches,
                          int n_layers, const float *q, int n, int nb_max, float *scratch, float *out)
{
    att_ctx c = {.kt = kt, .sh = sh, .q = q, .n = n, .nb_max = nb_max, .scratch = scratch, .out = out};
    c.worker_w = (size_t)MLA_NH_MAX * ((size_t)sh->Rkv + (size_t)n);
    /* mla_forward's ranges */
    size_t hm = (size_t)sh->Hm, grain = 0;
    for (size_t k = 1; !grain || grain > MLA_NH_MAX; k++)
        grain = (hm + (size_t)threads * k - 1) / ((size_t)threads * k);
    if (grain < 4) grain = 4;
    double t0 = now_sec();
    for (int l = 0; l < n_layers; l++) {
        c.cache = caches[l];
        parallel_for(pool, hm, grain, att_worker, &c);
    }
    return now_sec() - t0;
}

typedef struct {
    double ref, fast, one; /* seconds per step; ref < 0: not measured */
} att_row;

static att_row measure(threadpool *pool, int threads, const kernel_table *kt, const shape *sh, int n_layers, int n,
                       int reps, int with_ref)
{
    size_t rw = (size_t)sh->Rkv + (size_t)sh->dr;
    float **caches = malloc((size_t)n_layers * sizeof *caches);
    for (int l = 0; l < n_layers; l++) {
        caches[l] = aligned_alloc_raw((size_t)n * rw * sizeof(float));
        for (size_t i = 0; i < (size_t)n * rw; i++) caches[l][i] = rndf();
    }
    float *q = malloc((size_t)sh->Hm * rw * sizeof(float));
    for (size_t i = 0; i < (size_t)sh->Hm * rw; i++) q[i] = rndf() * 0.25f;
    float *scratch = aligned_alloc_raw((size_t)threads * MLA_NH_MAX * (rw + (size_t)n) * sizeof(float));
    float *out = malloc((size_t)sh->Hm * sh->Rkv * sizeof(float));
    double *r = calloc((size_t)reps, sizeof(double)), *f = calloc((size_t)reps, sizeof(double)),
           *o = calloc((size_t)reps, sizeof(double));
    const kernel_table *ref = kernels_ref();
    attend_step(pool, threads, kt, sh, caches, n_layers, q, n, MLA_NH_MAX, scratch, out); /* warm */
    for (int i = 0; i < reps; i++) {
        if (with_ref) r[i] = attend_step(pool, threads, ref, sh, caches, n_layers, q, n, MLA_NH_MAX, scratch, out);
        f[i] = attend_step(pool, threads, kt, sh, caches, n_layers, q, n, MLA_NH_MAX, scratch, out);
        o[i] = attend_step(pool, threads, kt, sh, caches, n_layers, q, n, 1, scratch, out);
    }
    att_row row = {.ref = with_ref ? median(r, reps) : -1, .fast = median(f, reps), .one = median(o, reps)};
    for (int l = 0; l < n_layers; l++) aligned_free(caches[l]);
    free(caches);
    free(q);
    aligned_free(scratch);
    free(out);
    free(r);
    free(f);
    free(o);
    return row;
}

static df_session *session_at(df_engine *eng, int vocab, int ctx, int extra, float *logits)
{
    df_session_opts so;
    df_session_opts_default(&so);
    so.n_ctx = ctx + extra;
    df_session *s;
    df_error err = {0};
    int np = ctx - 1;
    int32_t *prompt = malloc((size_t)np * sizeof *prompt);
    for (int i = 0; i < np; i++) prompt[i] = (int32_t)((i * 7919 + 13) % (vocab - 256));
    if (df_session_new(eng, &so, &s, &err) || df_session_eval(s, prompt, np, logits, 0, &err)) {
        fprintf(stderr, "bench_mla: %s\n", err.msg);
        exit(1);
    }
    free(prompt);
    return s;
}

/* The engine's median decode step (seconds), every expert resident: base
 * after 64 positions (the step without attention, nearly), and, when ctx >
 * 0, after ctx positions; the two sessions' steps alternate, so machine
 * noise hits both alike.  A first round of steps warms the expert cache. */
static void engine_steps(const char *model, int threads, int ctx, int steps, double *base, double *at_ctx)
{
    df_engine_opts eo;
    df_engine_opts_default(&eo);
    eo.n_threads = threads;
    eo.quiet = 1;
    eo.expert_cache_bytes = (size_t)8 << 30;
    eo.plan_ctx = (ctx > 64 ? ctx : 64) + 2 * steps + 64;
    df_engine *eng;
    df_error err = {0};
    if (df_engine_open(model, &eo, &eng, &err)) {
        fprintf(stderr, "bench_mla: %s\n", err.msg);
        exit(1);
    }
    df_model_info info;
    df_engine_info(eng, &info);
    float *la = malloc((size_t)info.vocab * sizeof(float)), *lb = malloc((size_t)info.vocab * sizeof(float));
    df_session *sa = session_at(eng, info.vocab, 64, 2 * steps + 64, la);
    df_session *sb = ctx > 0 ? session_at(eng, info.vocab, ctx, 2 * steps + 64, lb) : NULL;
    double *ta = calloc((size_t)steps, sizeof(double)), *tb = calloc((size_t)steps, sizeof(double));
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < steps; i++) {
            int32_t nx = (int32_t)df_argmax(la, info.vocab);
            double t0 = now_sec();
            df_session_eval(sa, &nx, 1, la, 0, &err);
            ta[i] = now_sec() - t0;
            if (!sb) continue;
            nx = (int32_t)df_argmax(lb, info.vocab);
            t0 = now_sec();
            df_session_eval(sb, &nx, 1, lb, 0, &err);
            tb[i] = now_sec() - t0;
        }
    *base = median(ta, steps);
    if (at_ctx) *at_ctx = sb ? median(tb, steps) : 0;
    free(ta);
    free(tb);
    free(la);
    free(lb);
    df_session_free(sa);
    if (sb) df_session_free(sb);
    df_engine_close(eng);
}

static void print_row(const char *isa, int n, att_row a, int n_layers_step, double base)
{
    double k = n_layers_step; /* per-layer figures are scaled to a step */
    double per_pos = a.fast * k / n * 1e9;
    if (a.ref >= 0)
        printf("%8d %11.2f %11.2f %8.1fx %10.2f %10.2f %11.2f", n, a.ref * k * 1e3, a.fast * k * 1e3, a.ref / a.fast,
               a.ref * k / n * 1e9, per_pos, a.one * k * 1e3);
    else
        printf("%8d %11s %11.2f %9s %10s %10.2f %11.2f", n, "-", a.fast * k * 1e3, "-", "-", per_pos, a.one * k * 1e3);
    if (base > 0) {
        if (a.ref >= 0) printf(" %8.1f%%", 100 * a.ref * k / (base + a.ref * k));
        else printf(" %9s", "-");
        printf(" %8.1f%%", 100 * a.fast * k / (base + a.fast * k));
    }
    printf("\n");
    (void)isa;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_mla MODEL_DIR [--ctx 4096,16384,32768] [--threads N] [--reps N] [--k3] "
                        "[--engine-at N]\n");
        return 2;
    }
    const char *model = argv[1];
    int ctxs[16] = {4096, 16384, 32768}, n_ctx = 3, threads = 2, reps = 3, k3 = 0, engine_at = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--k3")) k3 = 1;
        else if (i + 1 >= argc) break;
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--engine-at")) engine_at = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx")) {
            n_ctx = 0;
            for (char *p = argv[++i]; *p && n_ctx < 16;) {
                ctxs[n_ctx++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
            }
        }
    }
    if (reps < 1) reps = 1;
    if (threads < 1) threads = 1;
    df_log_quiet = 1;
    df_error err = {0};
    const kernel_table *kt = kernels_select(getenv("DF_KERNELS"), &err);
    if (!kt) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    char path[4096], *json;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", model);
    k3_config cf;
    if (read_small_file(path, &json, &len, 1 << 20, &err) || k3_config_parse(json, len, &cf, &err)) {
        fprintf(stderr, "bench_mla: %s: %s\n", path, err.msg);
        return 1;
    }
    int n_mla = 0;
    for (int l = 0; l < cf.NL; l++) n_mla += cf.layer_kind[l] == LAYER_MLA;
    shape sh = {.Rkv = cf.Rkv, .dr = cf.dr, .dn = cf.dn, .Hm = cf.Hm, .n_mla = n_mla};
    threadpool *pool = threadpool_new(threads);

    printf("deltafin bench_mla: kernels %s, %d threads, median of %d\n", kt->name, threads, reps);
    double base, at_ctx = 0;
    engine_steps(model, threads, engine_at > 64 ? engine_at : 0, 24, &base, &at_ctx);
    printf("model %s: %d MLA layers of %d heads, Rkv %d, dr %d; decode step at context 64 (attention ~0): %.2f ms\n",
           model, sh.n_mla, sh.Hm, sh.Rkv, sh.dr, base * 1e3);
    printf("MLA attention per decode step (ms; ns per cached position and step), share of a decode step:\n");
    printf("%8s %11s %11s %9s %10s %10s %11s %9s %9s\n", "context", "ref ms", "simd ms", "speed-up", "ref ns/pos",
           "simd ns/pos", "1-head ms", "ref share", "simd share");
    for (int i = 0; i < n_ctx; i++) {
        att_row a = measure(pool, threads, kt, &sh, sh.n_mla, ctxs[i], reps, 1);
        print_row(kt->name, ctxs[i], a, 1, base);
    }
    if (engine_at > 64) {
        att_row a = measure(pool, threads, kt, &sh, sh.n_mla, engine_at, reps, 0);
        printf("engine decode step after %d positions: %.2f ms measured (steps alternating with the base's); "
               "base + attention above: %.2f ms (%.2f ms with one head per call)\n",
               engine_at, at_ctx * 1e3, (base + a.fast) * 1e3, (base + a.one) * 1e3);
    }
    if (k3) {
        shape k = {.Rkv = 512, .dr = 64, .dn = 128, .Hm = 96, .n_mla = 24};
        printf("K3's shape (one MLA layer measured, x24 for a step: 96 heads, Rkv 512, dr 64):\n");
        printf("%8s %11s %11s %9s %10s %10s %11s\n", "context", "ref ms", "simd ms", "speed-up", "ref ns/pos",
               "simd ns/pos", "1-head ms");
        int kc[] = {4096, 32768, 131072};
        double per_pos_ref = 0, per_pos_fast = 0, at128 = 0;
        for (int i = 0; i < 3; i++) {
            att_row a = measure(pool, threads, kt, &k, 1, kc[i], kc[i] > 32768 ? 1 : reps, kc[i] <= 32768);
            print_row(kt->name, kc[i], a, k.n_mla, 0);
            if (a.ref >= 0) { /* the longest context measured both ways */
                per_pos_ref = a.ref * k.n_mla / kc[i];
                per_pos_fast = a.fast * k.n_mla / kc[i];
            }
            if (kc[i] == 131072) at128 = a.fast * k.n_mla;
        }
        double expert_s = 25.8e9 / 1.5e9;
        printf("K3 at 128K context, per token: attention %.2f s measured (%.2f s from the cost per position at 32K; "
               "the reference %.1f s) vs expert reads %.1f s (25.8 GB at 1.5 GB/s)\n",
               at128, per_pos_fast * 131072, per_pos_ref * 131072, expert_s);
    }
    threadpool_free(pool);
    k3_config_free(&cf);
    free(json);
    return 0;
}
