/* ops.h - the block-level backend: where and how a layer's blocks run.
 *
 * The forward pass (layer.c's phases, the engine's schedule) decides WHAT
 * runs on which rows; a backend decides WHERE and HOW.  Everything that
 * touches a block's numbers goes through one table of operations, k3_ops,
 * each on a block of rows of one layer:
 *
 *   norm_rows   RMSNorm of T rows                          (spec 4.1)
 *   mix_rows    the AttnRes mix of T rows over the anchors  (spec 4.3)
 *   add_rows, copy_rows  the partial sum's updates and the anchors
 *   kda_rows    KDA attention of T rows at s->pos           (spec 5)
 *   kda_replay  the KDA recurrence again over kept rows (rollback)
 *   mla_rows    MLA attention of T rows at s->pos           (spec 6)
 *   dense_mlp   the dense MLP of T rows                     (spec 7.4)
 *   route       router, top-k and latent inputs of rows [t0, t0+nt)
 *               (and the shared experts' gate/up when asked) (spec 7.1-7.2)
 *   experts     a group of distinct routed experts, each over its gathered
 *               rows, from the bytes in their cache slots   (spec 7.3)
 *   shared_down the shared experts' activation and down-projection
 *   combine     the route-order weighted sum, latent norm and up-projection
 *               added to the shared output of rows [t0, t0+nt)
 *   project     a dense trunk product (the output head; the prefetcher's
 *               router guess)
 *   alloc/release/sync  a session's buffers by role; waiting for the work
 *               queued so far (the host backends finish each op before it
 *               returns, so their sync does nothing)
 *
 * What a backend must keep (the reduction-order contract): every output row
 * depends only on its own inputs, with the summation orders kernels.h fixes
 * for the products and mla_attend, the orders mathfn.h fixes for norms,
 * SiTU and the router score, and the orders written in kda.c, mla.c and
 * moe.c for the recurrence, the absorbed attention and the route-order sum.
 * Then neither the thread count, nor the row slices, nor the batching of
 * experts, nor the backend changes a bit of the logits: tests/test_backend.c
 * runs the reference backend (ops_ref.c, single-threaded plain C over the
 * scalar kernels) against the CPU backend and compares logits for equality.
 *
 * The orchestration around the ops is not the backend's: the schedule, the
 * anchors, the distinct-expert lists, expert reads and the cache, ranks,
 * checkpoints and rollback bookkeeping, observation.  A new model family
 * (the Qwen3 drafters' dense GQA + RoPE + QK-norm + SwiGLU) adds ops to this
 * table; it does not get a second engine.
 *
 * Choosing one: k3_backend_open's spec string, the engine's --backend:
 *   cpu            the CPU backend, the best kernels this CPU runs
 *   cpu:avx512     ... forced AVX-512 kernels (cpu:avx2, and cpu:neon on AArch64, likewise)
 *   cpu:scalar     ... on the scalar reference kernels (alias cpu:ref)
 *   ref            the reference backend
 * --kernels ISA and $DF_KERNELS are spellings of cpu:ISA (engine.c).
 */
#ifndef DF_OPS_H
#define DF_OPS_H

#include <stddef.h>
#include "backend_cpu.h"
#include "df_error.h"
#include "kernels.h"
#include "threadpool.h"

struct model_ctx;
struct session_bufs;
struct k3_layer;
typedef struct k3_backend k3_backend;

/* What a session buffer holds (alloc's role): a device backend puts state
 * and scratch in its own memory and keeps the host's bookkeeping there. */
enum buf_role {
    BUF_STATE,       /* KDA state, conv history, the MLA latent cache, rollback and checkpoint copies */
    BUF_RESIDUAL,    /* the partial sums and the AttnRes anchors of a chunk's rows */
    BUF_ROWS,        /* a row slice's h-wide rows (mix, norm, attention, MLP outputs) */
    BUF_WIDE,        /* a row slice's projections (the six wide buffers, the two narrow ones) */
    BUF_EXPERT_ROWS, /* routed-expert inputs, activations and outputs, gathered by expert */
    BUF_WORKER,      /* per-worker scratch (a KDA head's rows, MLA scores) */
    BUF_HOST,        /* routes, distinct-expert lists, logits: read by the host every chunk */
    BUF_N_ROLES
};

typedef struct k3_ops {
    const char *name;  /* "cpu", "ref" */
    void (*norm_rows)(const struct model_ctx *mc, const float *x, const float *w, int T, int n, float eps, float *y);
    void (*mix_rows)(const struct model_ctx *mc, const float *anc, int n_anc, size_t astride, const float *p, int T,
                     int n, const float *nwpw, float eps, float *out, float *probs);
    void (*add_rows)(const struct model_ctx *mc, float *dst, const float *src, size_t n);   /* dst += src */
    void (*copy_rows)(const struct model_ctx *mc, float *dst, const float *src, size_t n);
    void (*kda_rows)(const struct model_ctx *mc, struct session_bufs *s, const struct k3_layer *L, const float *x,
                     int T, float *out);
    void (*kda_replay)(const struct model_ctx *mc, struct session_bufs *s, const struct k3_layer *L, int rows);
    int (*mla_rows)(const struct model_ctx *mc, struct session_bufs *s, const struct k3_layer *L, const float *x,
                    int T, float *out, df_error *err);
    void (*dense_mlp)(const struct model_ctx *mc, struct session_bufs *s, const struct k3_layer *L, const float *y,
                      int T, float *out);
    void (*route)(const struct model_ctx *mc, struct session_bufs *s, const struct k3_layer *L, const float *y,
                  int t0, int nt, int shared);
    void (*experts)(const struct model_ctx *mc, struct session_bufs *s, int il, const int *us, int n);
    void (*shared_down)(const struct model_ctx *mc, struct session_bufs *s, const struct k3_layer *L, int T,
                        float *out);
    void (*combine)(const struct model_ctx *mc, struct session_bufs *s, const struct k3_layer *L, const float *y,
                    int t0, int nt, float *out, int shared_done);
    void (*project)(const struct model_ctx *mc, wmat w, const float *x, int T, float *y);
    void *(*alloc)(const k3_backend *bk, enum buf_role role, size_t bytes);
    void (*release)(const k3_backend *bk, void *p);
    void (*sync)(const k3_backend *bk);
} k3_ops;

struct k3_backend {
    const k3_ops *ops;
    char name[32];             /* what was chosen, as printed: "cpu:avx512", "ref" */
    threadpool *pool;          /* the CPU backend's workers (ref: NULL) */
    const kernel_table *kt;    /* the host kernels (ref: the scalar ones) */
    int n_workers;             /* per-worker scratch the backend uses (ref: 1) */
};

extern const k3_ops k3_ops_cpu; /* ops_cpu.c */
extern const k3_ops k3_ops_ref; /* ops_ref.c */

/* The host's buffer ops (both host backends use them). */
void *ops_host_alloc(const k3_backend *bk, enum buf_role role, size_t bytes);
void ops_host_release(const k3_backend *bk, void *p);
void ops_host_sync(const k3_backend *bk);

/* Parse spec (NULL or "" = "cpu") and set bk up; n_threads workers for the
 * CPU backend.  An unknown spec or an ISA this CPU lacks is an error naming
 * it and the choices. */
int k3_backend_open(k3_backend *bk, const char *spec, int n_threads, df_error *err);
void k3_backend_close(k3_backend *bk);
/* Whether spec names a backend k3_backend_open accepts (no side effect). */
int k3_backend_spec_ok(const char *spec, df_error *err);

#endif
