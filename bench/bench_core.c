/* bench_core.c - in-RAM engine speed, measured side by side in one run.
 *
 *   bench_core MODEL_DIR [--threads-list 1,2] [--reps N]
 *
 * Prints, for each thread count: a plain memory read bandwidth (sum of a
 * 1 GiB buffer), the MXFP4 GEMV bandwidth of the selected kernels over
 * ~1 GiB of expert-shaped weights, the BF16 GEMV bandwidth, and the ratios
 * GEMV GB/s / memory GB/s; then the engine's prefill and decode tok/s on
 * MODEL_DIR with every expert resident (the cache is warmed first).  Each
 * figure is the median of --reps runs, and the measurements of one round are
 * interleaved, so machine noise hits all of them alike.
 */
#define _GNU_SOURCE
#include "backend_cpu.h"
#include "engine.h"
#include "kernels.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double median(double *v, int n) { return median_d(v, n); }

typedef struct {
    const uint64_t *buf;
    uint64_t sums[256];
} read_ctx;

static void read_worker(void *vctx, size_t b, size_t e, int worker)
{
    read_ctx *c = vctx;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = b * 512; i < e * 512; i += 4) {
        s0 += c->buf[i];
        s1 += c->buf[i + 1];
        s2 += c->buf[i + 2];
        s3 += c->buf[i + 3];
    }
    c->sums[worker] += s0 ^ s1 ^ s2 ^ s3;
}

static double mem_read_gbps(threadpool *pool, const uint64_t *buf, size_t bytes)
{
    read_ctx c = {.buf = buf};
    double t0 = now_sec();
    parallel_for(pool, bytes / 4096, 64, read_worker, &c);
    double t = now_sec() - t0;
    volatile uint64_t sink = c.sums[0];
    (void)sink;
    return (double)bytes / t / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_core MODEL_DIR [--threads-list 1,2] [--reps N]\n");
        return 2;
    }
    const char *model = argv[1];
    int threads[8] = {1, 2}, n_thr = 2, reps = 3;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads-list")) {
            n_thr = 0;
            for (char *p = argv[i + 1]; *p && n_thr < 8;) {
                threads[n_thr++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
            }
        }
    }
    if (reps < 1) reps = 1;
    df_log_quiet = 1;
    quant_init();
    df_error err = {0};
    const kernel_table *kt = kernels_select(getenv("DF_KERNELS"), &err);
    if (!kt) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }

    /* ~1 GiB of K3-shaped expert matrices (w1 shape: [3072, 3584]) */
    const int R = 3072, C = 3584;
    size_t pbytes = (size_t)R * C / 2, sbytes = (size_t)R * C / 32, per = pbytes + sbytes;
    int n_mats = (int)((1ull << 30) / per);
    uint8_t *wq = aligned_alloc_zero(per * (size_t)n_mats);
    for (size_t i = 0; i < per * (size_t)n_mats; i++) wq[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int m = 0; m < n_mats; m++) memset(wq + per * m + pbytes, 120, sbytes);
    size_t wq_bytes = per * (size_t)n_mats;
    /* ~1 GiB of BF16 [7168, 7168] matrices */
    const int Rb = 7168, Cb = 7168;
    size_t bper = (size_t)Rb * Cb * 2;
    int n_bm = (int)((1ull << 30) / bper);
    uint8_t *wb = aligned_alloc_zero(bper * (size_t)n_bm);
    for (size_t i = 0; i < bper * (size_t)n_bm; i += 2) wb[i + 1] = (uint8_t)(0x3c + (i >> 7) % 4);
    size_t wb_bytes = bper * (size_t)n_bm;
    size_t mem_bytes = 1ull << 30;
    uint64_t *mbuf = aligned_alloc_zero(mem_bytes);
    for (size_t i = 0; i < mem_bytes / 8; i++) mbuf[i] = i;
    float *x = aligned_alloc_zero((size_t)Cb * sizeof(float)), *xp = aligned_alloc_zero((size_t)C * sizeof(float));
    float *y = aligned_alloc_zero((size_t)Rb * sizeof(float));
    for (int i = 0; i < Cb; i++) x[i] = (float)((i % 17) - 8) * 0.01f;
    mxfp4_prep_x(x, C, xp);

    printf("deltafin bench_core: kernels %s, model %s, median of %d\n", kt->name, model, reps);
    printf("%-8s %10s %12s %12s %10s %10s %12s %12s\n", "threads", "mem GB/s", "mxfp4 GB/s", "bf16 GB/s",
           "mxfp4/mem", "bf16/mem", "prefill t/s", "decode t/s");
    for (int ti = 0; ti < n_thr; ti++) {
        int nt = threads[ti];
        threadpool *pool = threadpool_new(nt);
        double *m = calloc((size_t)reps, sizeof(double)), *q = calloc((size_t)reps, sizeof(double)),
               *b = calloc((size_t)reps, sizeof(double)), *pf = calloc((size_t)reps, sizeof(double)),
               *dc = calloc((size_t)reps, sizeof(double));
        df_engine_opts eo;
        df_engine_opts_default(&eo);
        eo.n_threads = nt;
        eo.quiet = 1;
        eo.expert_cache_bytes = (size_t)8 << 30;
        df_engine *eng;
        if (df_engine_open(model, &eo, &eng, &err)) {
            fprintf(stderr, "bench_core: %s\n", err.msg);
            return 1;
        }
        df_model_info info;
        df_engine_info(eng, &info);
        df_session_opts so;
        df_session_opts_default(&so);
        so.n_ctx = 512;
        df_session *s;
        if (df_session_new(eng, &so, &s, &err)) {
            fprintf(stderr, "bench_core: %s\n", err.msg);
            return 1;
        }
        enum { NP = 64, ND = 16 };
        int32_t prompt[NP];
        for (int i = 0; i < NP; i++) prompt[i] = (int32_t)((i * 7919 + 13) % (info.vocab - 256));
        float *logits = malloc((size_t)info.vocab * sizeof(float));
        /* warm: touch the trunk and load experts until the cache stops missing */
        for (int w = 0; w < 3; w++) {
            df_session_reset(s);
            df_session_eval(s, prompt, NP, logits, 0, &err);
            for (int i = 0; i < ND; i++) {
                int32_t nx = (int32_t)df_argmax(logits, info.vocab);
                df_session_eval(s, &nx, 1, logits, 0, &err);
            }
        }
        for (int r = 0; r < reps; r++) {
            m[r] = mem_read_gbps(pool, mbuf, mem_bytes);
            double t0 = now_sec();
            mm_job jobs[64];
            int nj = 0;
            for (int k = 0; k < n_mats && nj < 64; k++) {
                wmat w = {.type = W_MXFP4, .data = wq + per * k, .scales = wq + per * k + pbytes, .rows = R, .cols = C};
                jobs[nj++] = (mm_job){.w = w, .x = xp, .xs = (size_t)C, .y = y, .ys = (size_t)R, .T = 1};
            }
            mm_run(pool, kt, jobs, nj);
            q[r] = (double)wq_bytes / (now_sec() - t0) / 1e9;
            t0 = now_sec();
            nj = 0;
            for (int k = 0; k < n_bm; k++) {
                wmat w = {.type = W_BF16, .data = wb + bper * k, .rows = Rb, .cols = Cb};
                jobs[nj++] = (mm_job){.w = w, .x = x, .xs = (size_t)Cb, .y = y, .ys = (size_t)Rb, .T = 1};
            }
            mm_run(pool, kt, jobs, nj);
            b[r] = (double)wb_bytes / (now_sec() - t0) / 1e9;
            df_session_reset(s);
            t0 = now_sec();
            if (df_session_eval(s, prompt, NP, logits, 0, &err)) fprintf(stderr, "%s\n", err.msg);
            pf[r] = NP / (now_sec() - t0);
            t0 = now_sec();
            for (int i = 0; i < ND; i++) {
                int32_t nx = (int32_t)df_argmax(logits, info.vocab);
                if (df_session_eval(s, &nx, 1, logits, 0, &err)) fprintf(stderr, "%s\n", err.msg);
            }
            dc[r] = ND / (now_sec() - t0);
        }
        df_stats st;
        df_engine_stats(eng, &st);
        double mm = median(m, reps), qq = median(q, reps), bb = median(b, reps);
        printf("%-8d %10.2f %12.2f %12.2f %10.2f %10.2f %12.1f %12.2f\n", nt, mm, qq, bb, qq / mm, bb / mm,
               median(pf, reps), median(dc, reps));
        fprintf(stderr, "  (threads %d: expert cache %d slots, hits %llu misses %llu)\n", nt, info.n_cache_slots,
                (unsigned long long)st.expert_hits, (unsigned long long)st.expert_misses);
        free(logits);
        df_session_free(s);
        df_engine_close(eng);
        threadpool_free(pool);
        free(m), free(q), free(b), free(pf), free(dc);
    }
    return 0;
}
