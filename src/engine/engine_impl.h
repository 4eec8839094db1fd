/* engine_impl.h - the engine's private types (L4): the engine and the
 * session behind engine.h's opaque handles, and the engine-level rooms that
 * act on them (the trunk streamed or resident, --expert-path manifests).
 * Included by the engine's own files and by tests that look inside; the
 * model-level files (model.h) never see these structs: they get a
 * model_ctx and a session's session_bufs.
 */
#ifndef DF_ENGINE_IMPL_H
#define DF_ENGINE_IMPL_H

#include <stdio.h>
#include "engine.h"
#include "model.h"
#include "prefetch.h"

typedef struct trunk_stream {
    int on;
    int *first;               /* [NL + 2] first trunk tensor of each layer (sorted by layer) */
    uint64_t buf_bytes;       /* one layer buffer */
    uint8_t *buf[2];
    int buf_layer[2];         /* layer held (or being read) by each buffer, -1 none */
    int buf_pending[2];       /* reads outstanding per buffer */
    df_file *files;           /* [n_shards] */
    io_queue *q;
    uint64_t bytes_read;
    double wait_sec;
    uint8_t *resident;        /* trunk_load_resident's copy (2 MiB aligned, huge pages) */
    size_t resident_bytes;    /* its mapping's length */
    uint8_t *resident_map;    /* the mapping itself */
    uint8_t *res;             /* [NL + 1] partial residency: layers in the resident copy, or NULL */
} trunk_stream;

/* The last prompt (an eval of several positions): what it needed and read. */
typedef struct prompt_stats {
    uint64_t positions, unique, reads, bytes;
    int chunk;
    double seconds;
} prompt_stats;

struct df_ranks;
/* ranks.c: stop the other ranks and free (rank 0) */
void ranks_close(struct df_ranks *R);

struct df_engine {
    k3_model m;               /* the checkpoint (model.c) */
    struct df_ranks *ranks;   /* experts across processes (ranks.c), or NULL */
    int n_ranks;              /* processes in the MPI world (df_ranks_size), set before anything is sized */
    int experts_only;         /* df_engine_opts.experts_only */
    trunk_stream ts;
    uint64_t *layer_bytes, *layer_span; /* [NL + 1] trunk_layer_sizes, for the planner */
    expert_cache cache;
    k3_backend bk;            /* where and how the blocks run (model/ops.h) */
    model_ctx mc;             /* the view the layer blocks get */
    int n_threads;
    uint64_t tokens;
    FILE *trace;              /* route trace (--trace), or NULL */
    char *heat_path;          /* heat file (--heat), or NULL */
    FILE *events;             /* per-call JSON lines (--events), or NULL */
    char *events_buf;
    double *layer_sec;        /* [NL] time of each layer in the last call (events) */
    prefetch pf;              /* the router look-ahead prefetch (prefetch.c) */
    prompt_stats prompt;      /* the last multi-position eval */
    char *trace_buf;
    int trace_jsonl;          /* --trace-format jsonl: the older JSON lines */
    int trace_lookahead;      /* --trace-lookahead D, and its scratch (observe_trace.c) */
    float *la_xn, *la_logits, *la_choice;
    int *la_top;
    FILE *attn;               /* attention dump (--dump-attention), or NULL */
    char *attn_buf;
    uint8_t *attn_on;         /* [NL]: the MLA layers dumped */
    int attn_h0, attn_nh, attn_top;
    df_plan plan;             /* plan.c's decision, acted on at open */
    uint64_t session_room;    /* bytes sessions may take: the planned one + the plan's unused part */
    uint64_t sessions_bytes;  /* taken by the sessions alive now */
    uint8_t model_id[16];     /* session files' model identity (session_file.c), once computed */
    int model_id_ok;
};

/* The prompt accounting observer's counters at a prompt's start (observe_prompt.c). */
typedef struct prompt_obs {
    int on;                   /* this evaluation is a prompt (more than one position) */
    uint64_t reads0, bytes0;
    double t0;
} prompt_obs;

/* The events observer's snapshot of a chunk's start (observe_events.c). */
typedef struct chunk_obs {
    double t_start, t_layer;
    uint64_t hits0, miss0, bytes0, pfi0, pfu0, late0;
    double wait0;
} chunk_obs;

struct df_session {
    df_engine *eng;
    session_bufs b;           /* state and scratch (model.h) */
    uint64_t bytes;           /* state + scratch, counted against the engine's session_room */
    df_progress_fn progress;  /* between chunks of a long eval, or NULL */
    void *progress_ctx;
    dbg_record *dbg;          /* optional, owned by the caller */
    struct sched_step *sched; /* a chunk's steps (schedule.c), room for the largest chunk */
    size_t sched_cap;
    chunk_obs obs;            /* the events observer's counters at the chunk's start (observe_events.c) */
    prompt_obs pobs;          /* the prompt accounting observer's (observe_prompt.c) */
    uint32_t *route_counts;   /* [NL][E] routes per layer and expert (observe_routes.c), or NULL */
    uint64_t route_rows;      /* rows they count */
};

/* session_file.c: the model's identity (config, trunk table, the content
 * hash of every weight file), computed once per engine; session files and
 * MPI ranks compare it. */
int engine_model_identity(df_engine *eng, uint8_t id[16], df_error *err);
/* The model at path into m (model_load), after refusing a model of a
 * family the engine does not run (family.h: a dense drafter) with what it
 * is for (engine_plan.c). */
int engine_model_load(k3_model *m, const char *path, df_error *err);

/* trunk_stream.c: the trunk read layer by layer into two buffers (one
 * computing, one loading) when it does not fit the memory budget */
uint64_t trunk_stream_buffer_bytes(const df_engine *eng);
/* Each layer's trunk matrices (0..NL, NL = the output head): their bytes,
 * and their bytes as aligned reads ([NL + 1] each). */
void trunk_layer_sizes(const df_engine *eng, uint64_t *bytes, uint64_t *span);
/* Stream the trunk; resident[L] (NULL: none) marks layers copied into
 * memory instead (partial residency), the buffers sized for the others. */
int trunk_stream_init(df_engine *eng, const uint8_t *resident, df_error *err);
void trunk_stream_deinit(df_engine *eng);
/* Make layer il's trunk resident (il == NL: the output head) and start
 * reading the next one into the other buffer. */
int trunk_stream_layer(df_engine *eng, int il, df_error *err);
/* Make layer il's trunk resident without starting anything else. */
int trunk_stream_ready(df_engine *eng, int il, df_error *err);
/* The trunk fits: copy its matrices (not the embedding) from the files into
 * one anonymous, huge-page-backed block and point the views there. */
int trunk_load_resident(df_engine *eng, df_error *err);

/* engine_plan.c: decide the plan (plan.c) for these options, then act on
 * it: the expert cache, the trunk streamed or copied resident */
int engine_plan_memory(df_engine *eng, const df_engine_opts *o, df_error *err);

/* session.c: a session's buffers (dry: only count the bytes, for the
 * planner); a session's KDA state, conv history and one checkpoint's size */
int session_alloc(df_engine *eng, const df_session_opts *opts, int dry, df_session **out, size_t *state_bytes,
                  size_t *scratch_bytes, df_error *err);
size_t kda_state_floats(const df_engine *eng);
size_t kda_hist_floats(const df_engine *eng);
uint64_t checkpoint_bytes(const df_engine *eng);

/* session_rollback.c: after a pass over positions (p0, p1], the checkpoints
 * asked for there are complete (ok) or dropped */
void session_ck_settle(df_session *s, int p0, int p1, int ok);

/* observe.c: the observers of a forward pass, subscribed to the points the
 * evaluation, the schedule and the layer blocks offer (model.h probe_ev);
 * each observer in its own file. */
void observe_probe(void *ctx, const probe_ev *ev);
void observe_debug(dbg_record *d, const probe_ev *ev);
void observe_trace(df_engine *eng, const probe_ev *ev);
void observe_routes(df_session *s, const probe_ev *ev);
int trace_open(df_engine *eng, const char *path, int jsonl, const char *model, df_error *err);
/* the binary format's header (model identity, then extra: more JSON fields
 * with their leading comma, or NULL) and an evaluation record */
int trace_header(df_engine *eng, FILE *f, const char *model, const char *extra);
void trace_eval(FILE *f, const probe_ev *ev);
void put_u32(FILE *f, uint32_t v); /* the trace format's little-endian u32 (observe_trace.c) */
void observe_lookahead(df_engine *eng, const probe_ev *ev);
int attn_open(df_engine *eng, const df_engine_opts *o, const char *model, df_error *err);
void observe_attn(df_engine *eng, const probe_ev *ev);
void observe_events(df_engine *eng, chunk_obs *o, const probe_ev *ev);
void observe_prompt(df_session *s, const probe_ev *ev);

/* expert_paths.c: read --expert-path manifests into the store's sources */
/* engine_info.c: the backend spec an engine opens (--backend / --kernels,
 * else $DF_BACKEND / $DF_KERNELS, else "cpu"; disagreeing spellings fail). */
int engine_backend_spec(const char *backend, const char *kernels, char *out, size_t n, df_error *err);
/* engine_info.c: the trunk matrices' types by bytes, most first ("q8_0+bf16"),
 * and whether any is block-quantized */
void engine_trunk_types(const k3_model *m, char *out, size_t n, int *quantized);
void engine_expert_types(const k3_model *m, char *out, size_t n, int *requantized);
int engine_use_expert_paths(df_engine *eng, const char *const *dirs, int n, df_error *err);
/* expert_paths.c: a placed directory's manifest, which place.c writes, and
 * the name it gives a shard: the path's last component */
#define PLACE_MANIFEST "deltafin-place.json"
const char *place_base_name(const char *p);

#endif
