/* plan.h - the memory plan as a pure function (L3).
 *
 * Owns: the decision of where every byte of --mem goes: the trunk resident
 * or streamed through two layer buffers, the session (state + scratch at
 * the planned context and batch), a process reserve and the expert cache
 * with what is left.  It allocates nothing and touches no file: inputs are
 * sizes (from an open engine, or computed from a config alone for
 * `deltafin plan`), the output is a df_plan (engine.h) or an error that
 * gives the numbers.  The engine acts on the plan; tests check the plan.
 *
 * Invariant: a returned plan has used <= budget.  A configuration that
 * cannot fit is refused (-1, DF_ERR_NOMEM) with what it would need; nothing
 * is silently left outside the budget (there is no "paged" trunk mode: a
 * file mapping's pages count in the resident set like any other).
 */
#ifndef DF_PLAN_IMPL_H
#define DF_PLAN_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "df_error.h"
#include "df_plan.h"

/* One line: "--mem 4.00 GiB: trunk 1.20 GiB resident, ... unused 0.10 GiB". */
void df_plan_summary(const df_plan *p, char *buf, size_t n);
/* Why the plan has its context, e.g. "default for serve: 64K fits beside the
 * expert cache"; "" for DF_CTX_GIVEN. */
void df_plan_ctx_reason(const df_plan *p, char *buf, size_t n);
/* The full table, one line per item, each prefixed by `prefix`. */
void df_plan_print(const df_plan *p, const char *prefix, FILE *f);

typedef struct plan_sizes {
    uint64_t trunk_bytes;      /* layer matrices + output head (streamed or resident) */
    uint64_t embed_bytes;      /* the embedding: mapped when resident, read by row when streamed */
    uint64_t vec_bytes;        /* small vectors upcast to f32 at load */
    uint64_t stream_buf_bytes; /* one trunk-stream buffer: the largest layer, aligned reads */
    int n_trunk_layers;        /* NL + 1 (the output head is layer NL); 0: streamed whole only */
    const uint64_t *layer_bytes; /* [n_trunk_layers] each layer's trunk matrices, bytes in the file */
    const uint64_t *layer_span;  /* [n_trunk_layers] the same as aligned reads: a buffer's need, and an
                                    upper bound of its resident copy */
    uint64_t expert_bytes;     /* one routed expert's bytes on disk */
    uint64_t slot_bytes;       /* one cache slot (aligned) */
    uint64_t n_experts;        /* routed experts in the model (MoE layers x E) */
    int k;                     /* experts per token */
    int n_moe_layers;
    uint64_t state_bytes;      /* the planned session: KDA state + MLA cache at n_ctx */
    uint64_t scratch_bytes;    /* its scratch at max_batch (a fixed batch), or: */
    uint64_t scratch_base;     /* scratch <= scratch_base + T * scratch_per_row (equal from a
                                  session's row slice on; less below it) */
    uint64_t scratch_per_row;
    uint64_t scratch_default;  /* the scratch at PLAN_BATCH_DEFAULT (or n_ctx, when smaller) */
    uint64_t reserve_bytes;    /* binary, libc, stacks, I/O rings, tokenizer (and mpi_bytes) */
    uint64_t mpi_bytes;        /* of it: Open MPI's share under mpirun (plan_mpi_bytes) */
    uint64_t remote_bytes;     /* of it: libcurl's share when experts stream from a mirror */
    int mpi_ranks;
    int n_ctx, max_batch;
} plan_sizes;

typedef struct plan_request {
    uint64_t budget;           /* bytes (> 0) */
    int budget_given;          /* 1: the user's --mem; 0: the default share of RAM */
    int trunk_stream;          /* 0 auto, 1 always, -1 never */
    uint64_t expert_cache_bytes; /* 0: what is left; else this much (must fit) */
    int tlfu;                  /* TLFU keeps k transient slots out of the cache's share */
    int auto_batch;            /* choose max_batch (prompt chunk) from the budget: see plan.c */
} plan_request;

#define PLAN_BATCH_DEFAULT 32  /* the smallest auto chunk (the chunk before the plan is known) */
#define PLAN_BATCH_FAST 256    /* the auto chunk when nothing streams and its scratch fits */
#define PLAN_BATCH_MAX 2048    /* the largest automatic chunk */

/* serve's default context (plan_serve_ctx): 64K where it fits, halved down
 * to the session default */
#define PLAN_SERVE_CTX 65536
#define PLAN_SERVE_CTX_MIN 4096

/* The process reserve for n_threads workers and a tokenizer of `vocab`. */
uint64_t plan_reserve_bytes(int n_threads, int vocab);
/* Open MPI's share of a rank's memory under mpirun with n ranks (n 0: not
 * under mpirun, nothing). */
uint64_t plan_mpi_bytes(int n_ranks);
/* libcurl's share when a streamed install fetches experts from a mirror
 * (0: the experts are local). */
uint64_t plan_remote_bytes(int from_mirror);

/* Fill *p from sz and rq, or fail with the numbers (p is still filled with
 * what the cheapest configuration would need, for messages and tables). */
int plan_compute(const plan_sizes *sz, const plan_request *rq, df_plan *p, df_error *err);

/* The expert cache's streaming minimum: one token's experts in every MoE
 * layer (k x n_moe_layers slots, at most every expert).  A smaller cache
 * evicts, within one token, experts the next token needs in the same
 * layers: decode then reads nearly all of them again every token. */
uint64_t plan_stream_min_slots(const plan_sizes *sz);

/* The sizes of the planned session(s) at a context of n_ctx tokens (the
 * engine's dry run; tests give their own). */
typedef int (*plan_sizes_at)(void *arg, int n_ctx, plan_sizes *sz, df_error *err);

/* serve's default context, the one rule (plan.c's comment): the largest of
 * min(PLAN_SERVE_CTX, n_ctx_max), then halvings down to PLAN_SERVE_CTX_MIN,
 * whose plan fits, keeps the trunk as the floor's plan has it and leaves the
 * expert cache at least plan_stream_min_slots (or --expert-cache's size);
 * else the floor, planned (and refused) as plan_compute does.  n_ctx_max 0:
 * the model gives no maximum.  *p is the chosen plan, with ctx_rule,
 * ctx_want, ctx_why and stream_min_slots set. */
int plan_serve_ctx(plan_sizes_at sizes, void *arg, int n_ctx_max, const plan_request *rq, df_plan *p,
                   df_error *err);

#endif
