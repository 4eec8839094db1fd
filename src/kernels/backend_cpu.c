/* backend_cpu.c - see backend_cpu.h.
 *
 * Rows are numbered across all jobs (job 0's rows first), and parallel_for
 * hands out row ranges; a range that crosses a job boundary is cut there.
 * The grain keeps ranges large enough that a worker streams a useful piece
 * of weight memory per claim.
 */
#include "backend_cpu.h"
#include "quant.h"
#include "util.h"

#include <string.h>

typedef struct {
    const kernel_table *kt;
    const mm_job *jobs;
    int n_jobs;
    size_t starts[MM_MAX_JOBS + 1];
} mm_ctx;

static void run_rows(const kernel_table *kt, const mm_job *j, int r0, int r1)
{
    switch (j->w.type) {
    case W_F32:
        kt->matmul_f32(j->w.data, (size_t)j->w.cols, j->w.cols, j->x, j->xs, j->T, j->y, j->ys, r0, r1);
        break;
    case W_BF16:
        kt->matmul_bf16(j->w.data, (size_t)j->w.cols, j->w.cols, j->x, j->xs, j->T, j->y, j->ys, r0, r1);
        break;
    case W_MXFP4:
        kt->matmul_mxfp4(j->w.data, j->w.scales, j->w.cols, j->x, j->xs, j->T, j->y, j->ys, r0, r1);
        break;
    case W_MXFP4_GG:
        kt->matmul_mxfp4_gg(j->w.data, NULL, j->w.cols, j->x, j->xs, j->T, j->y, j->ys, r0, r1);
        break;
    case W_F16:
        kt->matmul_f16(j->w.data, (size_t)j->w.cols, j->w.cols, j->x, j->xs, j->T, j->y, j->ys, r0, r1);
        break;
    case W_Q8_0:
        kt->matmul_q8_0(j->w.data, NULL, j->w.cols, j->x, j->xs, j->T, j->y, j->ys, r0, r1);
        break;
    case W_QB:
        kt->matmul_qblock(j->w.qb, j->w.data, j->w.cols, j->x, j->xs, j->T, j->y, j->ys, r0, r1);
        break;
    }
}

/* element c of a row of w's type (W_QB: its block decoded) */
static float row_value(const wmat *w, const void *row, size_t c)
{
    switch (w->type) {
    case W_F32: return load_f32(row, c);
    case W_BF16: return load_bf16(row, c);
    case W_F16: return load_f16(row, c);
    case W_Q8_0: return load_q8_0(row, c);
    case W_QB: {
        float v[QBLOCK_MAX];
        size_t b = c / (size_t)w->qb->block;
        w->qb->decode((const uint8_t *)row + b * (size_t)w->qb->bytes, v);
        return v[c - b * (size_t)w->qb->block];
    }
    default: CHECK(!"not a row-readable weight type"); return 0;
    }
}

size_t wmat_row_bytes(const wmat *w)
{
    size_t c = (size_t)w->cols;
    switch (w->type) {
    case W_F32: return 4 * c;
    case W_BF16:
    case W_F16: return 2 * c;
    case W_MXFP4: return c / 2;
    case W_MXFP4_GG: return c / 32 * 17;
    case W_Q8_0: return c / Q8_0_BLOCK * Q8_0_BYTES;
    case W_QB: return c / (size_t)w->qb->block * (size_t)w->qb->bytes;
    }
    return 0;
}

void wmat_row_f32(const wmat *w, const void *row, int n, float *out)
{
    if (w->type == W_QB) {
        for (int b = 0; b * w->qb->block < n; b++)
            w->qb->decode((const uint8_t *)row + (size_t)b * w->qb->bytes, out + (size_t)b * w->qb->block);
        return;
    }
    for (int i = 0; i < n; i++) out[i] = row_value(w, row, (size_t)i);
}

void wmat_row_widen(const wmat *w, void *buf, int n)
{
    float *out = buf;
    if (w->type == W_QB) {
        /* block by block from the last: a block's floats start past its own
         * bytes' start and end before any earlier block's bytes are needed */
        int bl = w->qb->block, by = w->qb->bytes;
        for (int b = n / bl - 1; b >= 0; b--) {
            uint8_t tmp[512];
            memcpy(tmp, (const uint8_t *)buf + (size_t)b * by, (size_t)by);
            w->qb->decode(tmp, out + (size_t)b * bl);
        }
        return;
    }
    for (int i = n - 1; i >= 0; i--) {
        float v = row_value(w, buf, (size_t)i);
        out[i] = v;
    }
}

float wmat_get(const wmat *w, size_t i)
{
    size_t cols = (size_t)w->cols, r = i / cols;
    return row_value(w, (const uint8_t *)w->data + r * wmat_row_bytes(w), i - r * cols);
}

void mm_rows(const kernel_table *kt, wmat w, const float *x, float *y, int r0, int r1)
{
    mm_job j = {.w = w, .x = x, .xs = 0, .y = y, .ys = 0, .T = 1};
    run_rows(kt, &j, r0, r1);
}

wmat wmat_rows(wmat w, int r0, int n)
{
    CHECK(w.type != W_MXFP4 && r0 >= 0 && n >= 0 && r0 + n <= w.rows);
    w.data = (const uint8_t *)w.data + (size_t)r0 * wmat_row_bytes(&w);
    w.rows = n;
    return w;
}

static void mm_worker(void *vctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    mm_ctx *c = vctx;
    int j = 0;
    while (j < c->n_jobs && c->starts[j + 1] <= begin) j++;
    while (begin < end && j < c->n_jobs) {
        size_t jend = c->starts[j + 1] < end ? c->starts[j + 1] : end;
        run_rows(c->kt, &c->jobs[j], (int)(begin - c->starts[j]), (int)(jend - c->starts[j]));
        begin = jend;
        j++;
    }
}

void mm_run(threadpool *pool, const kernel_table *kt, const mm_job *jobs, int n_jobs)
{
    CHECK(n_jobs >= 0 && n_jobs <= MM_MAX_JOBS);
    mm_ctx c = {.kt = kt, .jobs = jobs, .n_jobs = n_jobs};
    size_t total = 0, work = 0;
    for (int j = 0; j < n_jobs; j++) {
        c.starts[j] = total;
        total += (size_t)jobs[j].w.rows;
        work += (size_t)jobs[j].w.rows * (size_t)jobs[j].w.cols * (size_t)jobs[j].T;
    }
    c.starts[n_jobs] = total;
    if (!total) return;
    /* aim for >= ~64K multiply-adds per claimed range */
    size_t per_row = work / total + 1;
    size_t grain = 65536 / per_row + 1;
    parallel_for(pool, total, grain, mm_worker, &c);
}

void mm_one(threadpool *pool, const kernel_table *kt, wmat w, const float *x, int T, float *y)
{
    mm_job j = {.w = w, .x = x, .xs = (size_t)w.cols, .y = y, .ys = (size_t)w.rows, .T = T};
    mm_run(pool, kt, &j, 1);
}
