/* engine.h - the only header the front ends (cli, server, tools) include.
 *
 * An engine is a loaded, validated K3 checkpoint plus its thread pool,
 * kernels and expert cache; a session is one sequence's state (KDA state,
 * MLA latent cache, position) and its preallocated scratch.  Types are
 * opaque.  Every fallible call returns 0 or -1 and fills a df_error; nothing
 * here exits.  df_session_eval is the token loop: it allocates nothing
 * (enforced by the allocation guard) and gives bit-identical logits whatever
 * the batch width, thread count or kernel set.  One session is used by one
 * thread at a time; sessions of one engine share its cache and must not run
 * concurrently.
 */
#ifndef DF_ENGINE_H
#define DF_ENGINE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include "df_error.h"
#include "df_plan.h"

typedef struct df_engine df_engine;
typedef struct df_session df_session;

typedef struct df_engine_opts {
    int n_threads;              /* 0 = all online CPUs */
    const char *backend;        /* where and how blocks run: "cpu", "cpu:avx512", "cpu:avx2", "cpu:neon", "cpu:scalar",
                                   "ref" (model/ops.h); NULL = $DF_BACKEND, else "cpu" */
    const char *kernels;        /* the same as backend "cpu:ISA" ("ref" = scalar, "avx2", "avx512"); NULL =
                                   $DF_KERNELS; naming a different backend than `backend` is an error */
    size_t mem_budget;          /* --mem: bytes for everything (0 = 70% of physical RAM) */
    size_t expert_cache_bytes;  /* override the planner's expert cache size (0 = plan from mem_budget) */
    int plan_rollback;          /* ... with this many rollback rows (df_session_opts.rollback_rows) */
    int plan_checkpoints;       /* ... and checkpoints (df_session_opts.checkpoints; -1: serve's
                                   default, as many as 1/64 of the budget holds over the planned
                                   sessions, from 2 to 8; df_plan.checkpoints says how many) */
    int plan_sessions;          /* ... times this many sessions (serve --parallel N), planned
                                   before the expert cache takes what is left (0 = 1) */
    int plan_ctx_serve;         /* plan_ctx 0: choose the context by serve's default rule (64K where
                                   the expert cache keeps its streaming minimum: plan.c; the plan's
                                   n_ctx is the answer) instead of 4096 */
    int plan_ctx, plan_batch;   /* the session the planner reserves for (0 = 4096 tokens; batch
                                   0 = chosen by the planner: 32 when nothing streams, else as
                                   large as the budget pays for, so a prompt reads its experts
                                   once per chunk) */
    const char *io_mode;        /* expert reads: "auto" (O_DIRECT where possible), "direct", "buffered" */
    const char *io_backend;     /* "auto" (io_uring where possible), "uring", "threads" */
    int io_depth;               /* expert reads in flight (0 = 32) */
    uint64_t disk_cache_max;    /* a streamed install's disk cache cap (0: what setup recorded) */
    const char *cache_policy;   /* "lfu" (default), "tlfu" or "lru" */
    const char *trace_path;     /* write the route trace here (trace_format.h), or NULL */
    int trace_jsonl;            /* ... as JSON lines (the older format) instead */
    int trace_lookahead;        /* binary trace: at each layer's end, the top k of the next 1..D MoE
                                 * layers' routers on the hidden state (TRACE_PREDICT; 0 = none) */
    /* attention dump (trace_format.h's TRACE_ATTN records): the attn_top
     * largest weights (0 = 16) of every query of heads [attn_h0, attn_h1) at
     * the MLA layers in [attn_l0, attn_l1) (attn_h1 = 0: to the last head;
     * attn_l1 = 0: to the last layer) */
    const char *attn_path;
    int attn_top, attn_l0, attn_l1, attn_h0, attn_h1;
    const char *events_path;    /* JSON line per forward call: hits, bytes, I/O wait, per-layer ms */
    const char *heat_path;      /* per-expert heat histogram: warms the cache at open, saved at close */
    int no_prefetch;            /* turn the router look-ahead prefetch off */
    int prefetch_k;             /* experts predicted per position and layer (0 = top_k / 2) */
    const char *const *expert_paths; /* --expert-path dirs written by df_place (NULL: the model dir) */
    int n_expert_paths;
    int trunk_stream;           /* 0: stream the trunk only when it does not fit mem_budget;
                                   1: always stream it; -1: never (the kernel pages it) */
    int prefault;               /* fault the expert cache memory in from a background thread at open */
    int preload;                /* read every routed expert into the cache at open: 1 on, -1 off,
                                   0 auto = when the cache holds them all and the trunk is resident */
    int quiet;                  /* no log lines on stderr */
    int experts_only;           /* an MPI rank that only computes experts (ranks.c): no trunk is loaded
                                   or planned, the budget goes to the expert cache */
} df_engine_opts;

typedef struct df_session_opts {
    int n_ctx;                  /* context capacity in tokens (0 = 4096) */
    int max_batch;              /* positions per forward call (0 = the engine's plan: --batch auto);
                                   longer inputs are chunked */
    int rollback_rows;          /* rows df_session_truncate can take back after a mark (0: none);
                                   costs a copy of the KDA state and the rows' recurrence inputs */
    int checkpoints;            /* positions df_session_checkpoint can keep (0: none); each costs
                                   a copy of the KDA state */
    int row_slice;              /* rows a layer's attention, dense and shared-expert work take at a
                                   time within a longer chunk (0 = 256): only the residual stream,
                                   anchors and routed-expert rows are held per position of a chunk.
                                   Results do not depend on it */
} df_session_opts;

typedef struct df_model_info {
    int vocab, hidden, n_layers, n_mla_layers, n_kda_layers;
    int n_experts, n_experts_used;
    const uint8_t *layer_moe;     /* [n_layers] 1 where the layer routes to experts (the engine's, valid
                                     while it is open; NULL from a plan) */
    int bos_id, eos_id, pad_id;
    uint64_t expert_bytes;        /* one routed expert (six tensors) */
    uint64_t ctx_bytes_per_token; /* MLA latent cache per token of context */
    uint64_t fixed_state_bytes;   /* KDA recurrent state + conv history */
    const char *kernels;
    const char *backend;          /* "cpu:avx512", "ref", ... */
    char trunk[40];               /* the trunk matrices' types by bytes, most first: "bf16", "q8_0+bf16" */
    int trunk_quantized;          /* some trunk matrix is in a block format (Q8_0): the logits are not
                                     those of the BF16 model the weights came from */
    char experts[40];             /* the routed experts' types by bytes: "mxfp4" (as K3 ships them),
                                     "q4_k+q6_k" (a GGUF that requantized them) */
    int experts_requantized;      /* some expert piece is not MXFP4: not the released experts */
    int n_threads;
    int n_cache_slots;
    /* The work of one position, for roofline figures (bench): FLOP (2 per
     * multiply-add) of the trunk's matrices in the layers (not the
     * embedding or the output head) and of the k routed experts of every
     * MoE layer; attention over the context and the elementwise work are
     * not counted.  The weights one decoded token reads: every trunk matrix
     * with the output head, and k routed experts per MoE layer. */
    uint64_t trunk_flops_per_position, expert_flops_per_position;
    uint64_t weight_bytes_per_token;
} df_model_info;

typedef struct df_stats {
    uint64_t tokens;              /* positions evaluated */
    uint64_t expert_hits, expert_misses;
    uint64_t expert_bytes_read;   /* expert bytes delivered by reads */
    uint64_t expert_bytes_io;     /* bytes transferred (aligned spans) */
    uint64_t expert_reads;
    double io_wait_sec;           /* time the token loop waited for expert reads */
    uint64_t source_reads[8];     /* expert reads per source: [0] model dir, [1..] --expert-path dirs */
    uint64_t trunk_bytes_read;    /* streamed trunk */
    double trunk_wait_sec;
    uint64_t prefetch_issued;     /* look-ahead reads started */
    uint64_t prefetch_used;       /* of those, experts later used */
    uint64_t prefetch_wasted;     /* evicted before any use */
    uint64_t prefetch_late;       /* used while still in flight (counted as misses) */
    int prefetch_ab_rounds;       /* on/off timing comparisons made (see --events "prefetch") */
    int prefetch_ab_on;           /* the last one's choice: 1 on, 0 off (-1 none yet) */
    double prefetch_ab_on_ms, prefetch_ab_off_ms; /* its mean decode step with and without */
    uint64_t prefetch_predicted, prefetch_correct, prefetch_actual;  /* precision = correct / predicted,
                                                                         recall = correct / actual */
    /* the last prompt (eval of several positions): its positions, the chunk
     * it ran in, the distinct (layer, expert) pairs it needed, the expert
     * reads and bytes it took (reads / unique = 1.00 when every needed
     * expert was read once) and its seconds */
    uint64_t prompt_positions, prompt_unique_experts, prompt_expert_reads, prompt_expert_bytes;
    int prompt_chunk;
    double prompt_sec;
    /* a streamed install (setup --stream): experts fetched over the network
     * (their time is inside io_wait_sec), reads its disk cache served,
     * transfers retried, disk cache slots reused; of the bytes, the second
     * copies of experts without a SHA-256 fetched only to compare (and how
     * many), and how many experts' first two copies differed */
    int streamed;
    uint64_t remote_fetches, remote_bytes, remote_retries, disk_cache_hits, disk_cache_evictions;
    uint64_t remote_compare_fetches, remote_compare_bytes, remote_copy_mismatches;
    double remote_sec;
} df_stats;

typedef struct df_plan_opts {
    size_t mem_budget;            /* 0 = 70% of physical RAM */
    size_t expert_cache_bytes;
    int n_ctx, max_batch;         /* 0 = session defaults */
    int rollback_rows;            /* as df_session_opts */
    int n_threads;                /* 0 = online CPUs */
    int trunk_stream;             /* as df_engine_opts */
    const char *cache_policy;
    int serve;                    /* n_ctx 0: serve's default context (df_engine_opts.plan_ctx_serve) */
    int n_sessions;               /* sessions planned (serve --parallel N; 0 = 1) */
    int checkpoints;              /* as df_engine_opts.plan_checkpoints (-1: serve's default rule) */
    const char *trunk_type;       /* config.json only, a what-if: the trunk's matrices as "bf16" (K3's
                                     release, the default), "f16" or "q8_0" (llama.cpp's K3 conversion:
                                     every 2-D trunk matrix but the router in Q8_0) */
} df_plan_opts;

/* The plan for a model without reading its weights: `path` is a model
 * directory or .gguf (config and headers only: nothing is mapped, no
 * weight is read) or a config.json alone (sizes from the config, a BF16
 * trunk as K3 ships).  Returns -1 with the numbers when it cannot fit;
 * *p is filled either way (sizes of the cheapest configuration). */
int df_plan_model(const char *path, const df_plan_opts *o, df_plan *p, df_model_info *info, df_error *err);
/* The plan an open engine runs under. */
void df_engine_plan(const df_engine *eng, df_plan *p);

void df_engine_opts_default(df_engine_opts *o);
/* --mem's default: 70% of physical memory. */
size_t df_mem_budget_default(void);
/* What this machine offers the engine (deltafin doctor): the kernel set an
 * engine would choose (honouring $DF_KERNELS), and whether io_uring works
 * here (0 with the reason in why otherwise). */
const char *df_kernels_chosen(void);
int df_io_uring_works(char *why, size_t n);
/* One JSON line (without the newline) to the --events file, if any. */
void df_engine_event(df_engine *eng, const char *json);
void df_session_opts_default(df_session_opts *o);

int df_engine_open(const char *model_dir, const df_engine_opts *opts, df_engine **out, df_error *err);
void df_engine_close(df_engine *eng);
void df_engine_info(const df_engine *eng, df_model_info *info);
void df_engine_stats(const df_engine *eng, df_stats *st);

int df_session_new(df_engine *eng, const df_session_opts *opts, df_session **out, df_error *err);
void df_session_free(df_session *s);
void df_session_reset(df_session *s);
/* Called between the chunks of a long eval (done positions of total), on
 * the evaluating thread, outside the allocation guard; NULL to stop. */
/* Route counts (observe_routes.c): after df_session_count_routes, every row
 * the session evaluates adds its k experts at each MoE layer to a [layers]
 * [experts] table (a verify pass's rows included), until reset.  The table
 * (layers x experts x 4 bytes) is outside the memory plan's session bytes. */
int df_session_count_routes(df_session *s, df_error *err);
void df_session_route_counts_reset(df_session *s);
/* The table ([n_layers][n_experts], dense layers' rows 0), NULL when not counting; *rows: rows counted. */
const uint32_t *df_session_route_counts(const df_session *s, uint64_t *rows);
typedef void (*df_progress_fn)(void *ctx, int done, int total);
void df_session_set_progress(df_session *s, df_progress_fn fn, void *ctx);
int df_session_pos(const df_session *s);
int df_session_n_ctx(const df_session *s);
int df_session_max_batch(const df_session *s);
/* Consume ids[0..n).  On failure (bad id, context full: nothing consumed;
 * an expert read error: the state is partial) reset the session before
 * reusing it after a read error.   logits (may be NULL): when all_rows, [n][vocab] with
 * row t the distribution after ids[t]; otherwise [vocab] after the last id. */
int df_session_eval(df_session *s, const int32_t *ids, int n, float *logits, int all_rows, df_error *err);
/* The same with every row's logits, handed over one chunk (at most
 * max_batch rows, in rows: [max_batch][vocab]) at a time to each, which
 * returns nonzero to stop with an error; the prompt's accounting (stats)
 * covers the whole call. */
typedef int (*df_rows_fn)(void *ctx, const float *rows, int n_rows);
int df_session_eval_each(df_session *s, const int32_t *ids, int n, float *rows, df_rows_fn each, void *ctx,
                         df_error *err);

/* Rollback (speculative decoding, edited histories).  df_session_mark
 * remembers the session at its current position; df_session_truncate(s,
 * pos) then returns it to any position from the mark's to the current one,
 * after which the session is bit for bit the one that only ever evaluated
 * the first pos tokens (the MLA cache is shortened; the KDA state is copied
 * back from the mark and the kept rows' recurrences replayed).  Needs a
 * session opened with rollback_rows > 0; evaluating more than rollback_rows
 * rows after a mark drops it.  The mark stays valid across truncations.
 * pos 0 is always allowed (a reset).  Errors name the positions. */
int df_session_mark(df_session *s, df_error *err);
int df_session_truncate(df_session *s, int pos, df_error *err);
/* The mark's position, or -1 when there is none. */
int df_session_mark_pos(const df_session *s);
/* Checkpoints (conversation prefixes): keep the KDA state at the current
 * position (in a session opened with checkpoints > 0; the least recently
 * used one is replaced), after which df_session_truncate can return
 * exactly to that position.  Checkpoints past a truncation are dropped. */
int df_session_checkpoint(df_session *s, df_error *err);
/* The same, at a position ahead (pos > the session's; pos == it is
 * df_session_checkpoint): the forward pass that evaluates position pos
 * keeps the state there, inside its chunk (no pass is split: a prompt is
 * read once whatever checkpoints it holds).  The entry is chosen now, by the
 * rule above; the checkpoint is reachable once the pass has evaluated pos,
 * and dropped if that pass fails or the session is truncated first. */
int df_session_checkpoint_at(df_session *s, int pos, df_error *err);
/* The largest position <= pos df_session_truncate can return to: pos
 * itself at or after the mark, else the largest checkpoint <= pos, else 0. */
int df_session_reachable(const df_session *s, int pos);
/* Make dst hold src's conversation up to pos, where src can return without
 * evaluating (its end or one of its checkpoints): the KDA state there and
 * the MLA cache before it are copied (memory bandwidth, no forward pass);
 * dst's own history, mark and checkpoints are dropped, and pos becomes one
 * of its checkpoints.  Two sessions of one engine and context.  A server
 * gives a new conversation the system prompt another one evaluated. */
int df_session_copy_prefix(df_session *dst, const df_session *src, int pos, df_error *err);

/* Session files: the ids a session holds (n == its position), the KDA
 * state and conv history and the MLA latent cache, under a versioned
 * header naming the model (a hash of its config, tensor table and sampled
 * weight bytes) with a CRC per section; written beside the path and
 * renamed into place (a crash leaves the previous file).  Loading checks
 * everything and leaves the session empty on any error (wrong model,
 * truncated, corrupted, too long for the context).  ids: room for cap. */
int df_session_save(df_session *s, const int32_t *ids, int n, const char *path, df_error *err);
int df_session_load(df_session *s, const char *path, int32_t *ids, int cap, int *n, df_error *err);
/* A session file's ids alone (header, model identity and the ids' CRC
 * checked), to choose among files without loading their state. */
int df_session_file_ids(df_engine *eng, const char *path, int32_t *ids, int cap, int *n, df_error *err);


/* A model directory installed by `setup --stream`: where its experts come
 * from and what its disk cache holds (read from its install.json,
 * experts.manifest and disk cache index; the model is not opened).
 * Returns 1 for a streamed install, 0 for anything else, -1 on a damaged
 * install.json or manifest. */
typedef struct df_install_info {
    char base[1024], repo[512], commit[128];
    uint64_t cache_max, cache_used;   /* the disk cache's cap and the bytes of experts in it */
    int cache_filled, cache_slots;
    size_t experts, experts_hashed;   /* routed experts, and those with a SHA-256 in the manifest */
} df_install_info;
int df_install_describe(const char *dir, df_install_info *out, df_error *err);

/* Routed experts over several processes with MPI (ranks.c; built where
 * mpicc is found, else one rank).  Under `mpirun -np N`, df_ranks_init
 * (first thing in main) returns this process's rank; rank 0 opens the
 * engine and df_ranks_attach partitions the experts (by the heat file's
 * counts when given, else round robin) for sessions of up to max_batch
 * positions; ranks 1..N-1 open the same model and df_ranks_serve computes
 * their experts until rank 0 closes its engine.  Logits are bit-identical
 * at any rank count. */
typedef struct df_rank_stats {
    int rank;
    uint64_t expert_calls;        /* experts computed (one expert over its rows = 1) */
    uint64_t rows;                /* rows sent to the rank */
    uint64_t bytes_sent, bytes_received; /* by rank 0, to and from the rank */
    uint64_t expert_bytes_read;   /* the rank's own expert reads */
    double expert_sec;            /* the rank's time computing experts */
    double wait_sec;              /* rank 0: time waiting for answers */
    long peak_rss_kb;             /* the rank's peak resident set */
} df_rank_stats;
int df_ranks_init(int *argc, char ***argv);
int df_ranks_size(void);
/* 1 when started by mpirun (Open MPI initialized), even with one rank. */
int df_ranks_mpi(void);
int df_ranks_rank(void);
void df_ranks_finalize(void);
int df_ranks_attach(df_engine *eng, const char *heat_path, int max_batch, df_error *err);
/* ranks > 0, before opening the engine: rank 0's session batch (it sends
 * it once its engine is open), to plan an experts-only engine for */
int df_ranks_hello(int *max_batch, df_error *err);
int df_ranks_serve(df_engine *eng, df_error *err);
/* rank 0: one row per rank (the others asked for theirs); returns the count */
int df_ranks_stats(df_engine *eng, df_rank_stats *out, int max);

/* Device read bandwidth with the engine's read size and queue depth. */
typedef struct df_iobench_opts {
    size_t chunk_bytes;   /* bytes per read (0 = one K3 expert, 17,547,264) */
    int depth;            /* reads in flight (0 = 32) */
    double seconds;       /* duration (0 = 5) */
    int buffered;         /* measure buffered reads instead of O_DIRECT */
} df_iobench_opts;
typedef struct df_iobench_result {
    uint64_t bytes, reads;
    double seconds, gbps;
    size_t chunk_bytes;
    int depth, direct;
    char backend[32];
} df_iobench_result;
int df_iobench(const char *dir, const df_iobench_opts *o, df_iobench_result *r, df_error *err);

/* The machine's own limits, measured now (machine.c), for roofline
 * figures: memory read bandwidth (a parallel sum over 1 GiB, or a quarter of
 * the available memory when less; best of three)
 * and, per weight format, the selected kernels' matrix products with the
 * weights in cache (~192 KiB), in GFLOP/s (2 per multiply-add), at 32
 * positions (a prompt chunk) and at one (the _1 fields: decode).  kernels:
 * as --kernels ("" or NULL = the best for this CPU).  About 3 s. */
typedef struct df_limits {
    int threads;
    const char *kernels;
    double mem_read_gbs;
    double bf16_gflops, f16_gflops, q8_0_gflops, mxfp4_gflops, mxfp4_gg_gflops;
    double bf16_gflops_1, f16_gflops_1, q8_0_gflops_1, mxfp4_gflops_1, mxfp4_gg_gflops_1;
} df_limits;
int df_measure_limits(const char *kernels, int threads, df_limits *out, df_error *err);

/* Copy the routed experts of model_dir to the directories dirs[0..n):
 * every expert to every directory (replicas) or expert i to directory
 * i mod n (stripe), keeping file names and offsets; each directory gets a
 * manifest that --expert-path reads.  progress(ctx, done, total) after each
 * expert. */
typedef void (*df_place_progress)(void *ctx, uint64_t done, uint64_t total);
int df_place(const char *model_dir, const char *const *dirs, int n, int stripe, df_place_progress progress,
             void *ctx, df_error *err);

/* Greedy choice: the first index of the maximum (ties go to the lower id). */
int df_argmax(const float *logits, int n);

#endif
