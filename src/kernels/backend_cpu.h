/* backend_cpu.h - run matrix products on the thread pool with a kernel table.
 *
 * Owns: splitting the rows of one or several matrix products (a "job list")
 * across the pool's workers, so that independent projections of the same
 * layer (q, k, v, g ...) share one parallel_for.  Each output row is computed
 * by exactly one kernel call, so the thread count never changes a result.
 * Does not own: the weights (views) or the activations (caller scratch).
 */
#ifndef DF_BACKEND_CPU_H
#define DF_BACKEND_CPU_H

#include <stddef.h>
#include <stdint.h>
#include "kernels.h"
#include "qblock.h"
#include "threadpool.h"

enum wtype { W_F32, W_BF16, W_MXFP4, W_MXFP4_GG /* ggml blocks in data, scales unused */, W_F16,
             W_Q8_0 /* ggml blocks of 32 (F16 scale, 32 int8) in data; cols a multiple of 32 */,
             W_QB /* blocks of the format qb (qblock.h) in data; cols a multiple of its block */ };

/* A weight matrix view: [rows, cols]. For MXFP4, data = packed bytes and
 * scales = E8M0 bytes. Borrowed: valid while the mapping / cache slot is. */
typedef struct wmat {
    enum wtype type;
    const void *data;
    const uint8_t *scales;
    int rows, cols;
    const qblock_fmt *qb;     /* W_QB */
} wmat;

/* Bytes of one row of w (MXFP4: the packed bytes), and the first n values
 * of a row of w's type as f32 (the stored values exactly: what the kernels
 * multiply by; MXFP4 rows are not read this way; n whole blocks). */
size_t wmat_row_bytes(const wmat *w);
void wmat_row_f32(const wmat *w, const void *row, int n, float *out);
/* The same in place: buf holds the row's bytes at its start and receives
 * its n values as f32 (widened from the last block down, so that no byte is
 * overwritten before it is read: true of every row-readable type). */
void wmat_row_widen(const wmat *w, void *buf, int n);

typedef struct mm_job {
    wmat w;
    const float *x;   /* [T][xs] (MXFP4: reordered with mxfp4_prep_x) */
    size_t xs;
    float *y;         /* [T][ys] */
    size_t ys;
    int T;
} mm_job;

#define MM_MAX_JOBS 512

/* Element i of w in row-major order (row i / cols), as f32: for the few
 * weights also read by element (MLA's kv_b), in any row-readable type. */
float wmat_get(const wmat *w, size_t i);
/* Rows [r0, r1) of w times one position x, on the calling thread: y[r]. */
void mm_rows(const kernel_table *kt, wmat w, const float *x, float *y, int r0, int r1);
/* w's rows [r0, r0 + n) as a matrix of their own (a view). */
wmat wmat_rows(wmat w, int r0, int n);

/* Run all jobs; returns when every output is written. */
void mm_run(threadpool *pool, const kernel_table *kt, const mm_job *jobs, int n_jobs);
/* Convenience: one product y[T][w.rows] = w * x[T][w.cols], dense strides. */
void mm_one(threadpool *pool, const kernel_table *kt, wmat w, const float *x, int T, float *y);

#endif
