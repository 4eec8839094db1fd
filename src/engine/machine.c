/* machine.c - the machine's own limits, measured now, for the roofline
 * figures `deltafin bench` prints beside tok/s (engine.h df_measure_limits).
 *
 * Memory: a parallel sum of 64-bit words over a 1 GiB buffer (a quarter of
 * the available memory when less, at least 256 MiB), every thread on its
 * own slices (the way decode streams weights), best of three passes.
 * Compute: each weight format's kernel of the selected table (the same
 * kernels the forward pass calls) on a matrix small enough to stay in a
 * core's L2 (192 KiB of weights), with 32 positions (a prompt chunk: what
 * prefill runs) and with one (decode); every thread runs its own copy of the
 * loop, the figure is the total.  2 FLOP per multiply-add.  So the compute
 * roof is what these kernels reach when memory is not in the way, not a
 * datasheet FMA count: a prefill at 90 % of it has little left to gain
 * without new kernels.  Weights are synthetic (normal values; MXFP4 scales
 * near 1; no subnormals, which would slow some CPUs).
 */
#define _GNU_SOURCE
#include "engine.h"
#include "engine_impl.h"
#include "clock.h"
#include "threadpool.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { LIM_COLS = 1024, LIM_T = 32, LIM_MAXW = 64 };

typedef struct {
    const uint64_t *buf;
    size_t words;
    uint64_t sink[LIM_MAXW];
} mem_ctx;

static void mem_worker(void *v, size_t b, size_t e, int worker)
{
    mem_ctx *c = v;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = b * 8192; i < e * 8192 && i < c->words; i += 4) {
        s0 += c->buf[i];
        s1 += c->buf[i + 1];
        s2 += c->buf[i + 2];
        s3 += c->buf[i + 3];
    }
    c->sink[worker % LIM_MAXW] += s0 ^ s1 ^ s2 ^ s3;
}

typedef struct {
    const kernel_table *kt;
    int type;                 /* 0 bf16, 1 f16, 2 q8_0, 3 mxfp4 (packed), 4 mxfp4 (ggml blocks) */
    const uint8_t *w, *scales;
    int rows, T;
    float *x, *y;             /* per worker: [LIM_MAXW][LIM_T * LIM_COLS], [LIM_MAXW][LIM_T * rows] */
} mm_ctx;

static void mm_worker(void *v, size_t b, size_t e, int worker)
{
    mm_ctx *c = v;
    const kernel_table *kt = c->kt;
    float *x = c->x + (size_t)(worker % LIM_MAXW) * LIM_T * LIM_COLS;
    float *y = c->y + (size_t)(worker % LIM_MAXW) * LIM_T * (size_t)c->rows;
    for (size_t it = b; it < e; it++) {
        switch (c->type) {
        case 0: kt->matmul_bf16(c->w, LIM_COLS, LIM_COLS, x, LIM_COLS, c->T, y, (size_t)c->rows, 0, c->rows); break;
        case 1: kt->matmul_f16(c->w, LIM_COLS, LIM_COLS, x, LIM_COLS, c->T, y, (size_t)c->rows, 0, c->rows); break;
        case 2: kt->matmul_q8_0(c->w, NULL, LIM_COLS, x, LIM_COLS, c->T, y, (size_t)c->rows, 0, c->rows); break;
        case 3:
            kt->matmul_mxfp4(c->w, c->scales, LIM_COLS, x, LIM_COLS, c->T, y, (size_t)c->rows, 0, c->rows);
            break;
        default:
            kt->matmul_mxfp4_gg(c->w, NULL, LIM_COLS, x, LIM_COLS, c->T, y, (size_t)c->rows, 0, c->rows);
            break;
        }
    }
}

static uint64_t lim_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* a value of about unit size, never subnormal */
static float lim_val(uint64_t *s) { return (float)((double)(lim_rng(s) % 2001) / 1000.0 - 1.0) + 0.001f; }

/* the value's top 16 bits: exact for lim_val's values' purposes (timing) */
static uint16_t lim_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* GFLOP/s of one format at T positions: calls of the kernel over `rows`
 * rows, spread over the pool, for about `sec` seconds after one warm pass */
static double measure_mm(threadpool *pool, mm_ctx *c, double sec)
{
    int nw = threadpool_size(pool);
    parallel_for(pool, (size_t)nw, 1, mm_worker, c); /* warm: pages, caches, clocks */
    double flop_per_call = 2.0 * c->rows * (double)LIM_COLS * c->T;
    size_t n = (size_t)nw * 4;
    double t0 = now_sec(), t;
    size_t done = 0;
    do {
        parallel_for(pool, n, 1, mm_worker, c);
        done += n;
        t = now_sec() - t0;
        if (t < sec / 8) n *= 2;
    } while (t < sec);
    return done * flop_per_call / t / 1e9;
}

int df_measure_limits(const char *kernels, int threads, df_limits *out, df_error *err)
{
    memset(out, 0, sizeof *out);
    if (threads < 1) threads = 1;
    if (threads > LIM_MAXW) threads = LIM_MAXW;
    const kernel_table *kt = kernels_select(kernels, err);
    if (!kt) return -1;
    threadpool *pool = threads > 1 ? threadpool_new(threads) : NULL;
    if (threads > 1 && !pool) return df_err_set(err, DF_ERR_NOMEM, -1, "cannot start %d threads", threads);
    out->threads = threads;
    out->kernels = kt->name;

    /* 1 GiB (far past any cache), or a quarter of the available memory when
     * that is less, never under 256 MiB */
    size_t bytes = (size_t)1 << 30;
    long avp = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (avp > 0 && psz > 0 && (size_t)avp / 4 * (size_t)psz < bytes) bytes = (size_t)avp / 4 * (size_t)psz;
    if (bytes < ((size_t)256 << 20)) bytes = (size_t)256 << 20;
    size_t words = bytes / 8;
    uint64_t *buf = aligned_alloc_raw(words * 8);
    /* the matrices: 192 KiB of BF16 weights at 1024 columns = 96 rows; the
     * other formats take as many rows in about the same bytes or fewer */
    int rows = 96;
    size_t xw = (size_t)LIM_MAXW * LIM_T * LIM_COLS, yw = (size_t)LIM_MAXW * LIM_T * (size_t)(rows * 4);
    float *x = malloc(xw * sizeof(float)), *y = malloc(yw * sizeof(float));
    uint8_t *w = malloc((size_t)rows * 4 * LIM_COLS * 2), *sc = malloc((size_t)rows * 4 * LIM_COLS / 32);
    if (!buf || !x || !y || !w || !sc) {
        aligned_free(buf), free(x), free(y), free(w), free(sc);
        threadpool_free(pool);
        return df_err_set(err, DF_ERR_NOMEM, -1, "out of memory for the machine measurement (%zu MiB)", bytes >> 20);
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < words; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < xw; i++) x[i] = lim_val(&s);
    mem_ctx mc = {.buf = buf, .words = words};
    size_t blocks = (words + 8191) / 8192;
    parallel_for(pool, blocks, 64, mem_worker, &mc);
    for (int r = 0; r < 3; r++) {
        double t0 = now_sec();
        parallel_for(pool, blocks, 64, mem_worker, &mc);
        double g = (double)words * 8 / (now_sec() - t0) / 1e9;
        if (g > out->mem_read_gbs) out->mem_read_gbs = g;
    }
    aligned_free(buf);

    mm_ctx c = {.kt = kt, .x = x, .y = y};
    for (int type = 0; type < 5; type++) {
        /* rows of the format in ~192 KiB: bf16/f16 2 B a value, q8_0 34/32,
         * mxfp4 17/32 */
        c.rows = type <= 1 ? rows : type == 2 ? rows * 2 - 8 : rows * 4;
        c.type = type;
        c.w = w;
        c.scales = sc;
        size_t nv = (size_t)c.rows * LIM_COLS;
        if (type <= 1) {
            uint16_t *h = (uint16_t *)w;
            for (size_t i = 0; i < nv; i++) h[i] = type == 0 ? lim_bf16(lim_val(&s)) : f32_to_f16(lim_val(&s));
        } else if (type == 2) {
            for (size_t b = 0; b < nv / 32; b++) {
                uint16_t d = f32_to_f16(0.01f);
                memcpy(w + b * 34, &d, 2);
                for (int j = 0; j < 32; j++) w[b * 34 + 2 + j] = (uint8_t)(lim_rng(&s) % 255);
            }
        } else if (type == 3) {
            for (size_t i = 0; i < nv / 2; i++) w[i] = (uint8_t)lim_rng(&s);
            for (size_t i = 0; i < nv / 32; i++) sc[i] = (uint8_t)(124 + lim_rng(&s) % 4);
        } else {
            for (size_t b = 0; b < nv / 32; b++) {
                w[b * 17] = (uint8_t)(124 + lim_rng(&s) % 4);
                for (int j = 1; j < 17; j++) w[b * 17 + j] = (uint8_t)lim_rng(&s);
            }
        }
        for (int ti = 0; ti < 2; ti++) {
            c.T = ti ? 1 : LIM_T;
            double g = measure_mm(pool, &c, 0.25);
            double *slot = type == 0   ? (ti ? &out->bf16_gflops_1 : &out->bf16_gflops)
                           : type == 1 ? (ti ? &out->f16_gflops_1 : &out->f16_gflops)
                           : type == 2 ? (ti ? &out->q8_0_gflops_1 : &out->q8_0_gflops)
                           : type == 3 ? (ti ? &out->mxfp4_gflops_1 : &out->mxfp4_gflops)
                                       : (ti ? &out->mxfp4_gg_gflops_1 : &out->mxfp4_gg_gflops);
            *slot = g;
        }
    }
    free(x), free(y), free(w), free(sc);
    threadpool_free(pool);
    return 0;
}
