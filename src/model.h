/* model.h - L3 internals shared by the model files (model, attnres, kda, mla,
 * moe, engine): the K3 config, the per-layer weight views, the engine and the
 * session with its scratch.  Front ends never include this (engine.h only);
 * tests may, to reach debug records and internals.
 *
 * Weights: matrices are views into the read-only shard mappings (wmat);
 * small vectors (norm weights, biases, conv taps) are upcast once at load to
 * owned f32 arrays, because every kernel would otherwise convert them on
 * each use.  Routed experts are not mapped: moe reads them through
 * expert_cache / expert_store.
 */
#ifndef DF_MODEL_H
#define DF_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "backend_cpu.h"
#include "engine.h"
#include "expert_cache.h"
#include "expert_store.h"
#include "file.h"
#include "kernels.h"
#include "prefetch.h"
#include "threadpool.h"

enum { LAYER_KDA = 0, LAYER_MLA = 1 };

typedef struct k3_config {
    int V, h, NL, B;
    int Hk, Dk, P, Wc;
    float glb;
    int Hm, Rq, Rkv, dn, dr, dv;
    int Dff, E, k, Ns, I, Lt;
    float eps, b1, b2, rsf;
    int first_dense, moe_freq;
    int bos, eos, pad;
    uint8_t *layer_kind;      /* [NL] LAYER_KDA / LAYER_MLA */
    uint8_t *layer_moe;       /* [NL] 1 = MoE block, 0 = dense MLP */
} k3_config;

typedef struct k3_layer {
    int kind, moe;
    int kda_idx, mla_idx;     /* index among layers of its kind, for state arrays */
    float *attn_res_nwpw;     /* [h] self_attention_res_norm * self_attention_res_proj */
    float *mlp_res_nwpw;      /* [h] mlp_res_norm * mlp_res_proj */
    float *input_ln;          /* [h] */
    float *post_ln;           /* [h] */
    /* KDA */
    wmat q, k, v, g;          /* [P, h] */
    wmat fa;                  /* [Dk, h] */
    wmat fb;                  /* [P, Dk] */
    wmat b;                   /* [Hk, h] */
    wmat o;                   /* [h, P] (KDA) or [h, Hm*dv] (MLA) */
    float *conv[3];           /* q, k, v: [P][Wc] taps */
    float *A_exp;             /* [Hk] exp(A_log), rounded once to f32 at load (a GGUF
                               * stores -exp(A_log) as ssm_a: both give these values) */
    float *dt_bias;           /* [P] */
    float *o_norm;            /* [Dk] */
    /* MLA */
    wmat q_a;                 /* [Rq, h] */
    wmat q_b;                 /* [Hm*(dn+dr), Rq] */
    wmat kv_a;                /* [Rkv+dr, h] */
    wmat kv_b;                /* [Hm*(dn+dv), Rkv] (kv_split = 0) */
    int kv_split;             /* 1: kv_b given per head as k_b and v_b (llama.cpp's layout) */
    wmat k_b;                 /* [Hm][Rkv][dn]: each head's key rows, transposed */
    wmat v_b;                 /* [Hm][dv][Rkv]: each head's value rows */
    wmat mg;                  /* [Hm*dv, h] output gate */
    float *q_a_ln;            /* [Rq] */
    float *kv_a_ln;           /* [Rkv] */
    /* dense MLP */
    wmat gate, up, down;      /* [Dff, h], [Dff, h], [h, Dff] */
    /* MoE */
    wmat router;              /* [E, h] */
    float *router_bias;       /* [E] e_score_correction_bias */
    wmat lat_down;            /* [Lt, h] */
    float *lat_norm;          /* [Lt] */
    wmat lat_up;              /* [h, Lt] */
    wmat sh_gate, sh_up;      /* [Ns*I, h] */
    wmat sh_down;             /* [h, Ns*I] */
} k3_layer;

typedef struct shard_map {
    char *path;
    int fd;                   /* opened on first trunk tensor, -1 before */
} shard_map;

/* A trunk matrix: where it lives, for streaming it when the trunk does not
 * fit the memory budget (trunk_stream.c re-points w->data per layer). */
typedef struct trunk_tensor {
    int layer;                /* -1 embedding (stays mapped), 0..NL-1, NL = lm_head */
    wmat *w;
    int shard;
    uint64_t off, nbytes;     /* in the shard */
    uint64_t buf_off;         /* streamed: aligned offset in the layer buffer */
    uint32_t lead;            /* streamed: off - aligned read start */
} trunk_tensor;

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
} trunk_stream;

/* The last prompt (an eval of several positions): what it needed and read. */
typedef struct prompt_stats {
    uint64_t positions, unique, reads, bytes;
    int chunk;
    double seconds;
} prompt_stats;

typedef struct tensor_map {
    void *base;               /* read-only mapping of one trunk tensor's pages */
    size_t size;
} tensor_map;

struct df_engine {
    k3_config cfg;
    k3_layer *layers;
    wmat embed;               /* [V, h] */
    wmat lm_head;             /* [V, h] */
    float *final_norm;        /* [h] */
    float *out_res_nwpw;      /* [h] */
    int n_kda, n_mla;
    shard_map *shards;
    int n_shards;
    tensor_map *maps;
    int n_maps, cap_maps;
    uint64_t trunk_mapped_bytes;
    trunk_tensor *trunk;      /* every mapped trunk matrix */
    int n_trunk, cap_trunk;
    trunk_stream ts;
    uint64_t embed_bytes;     /* the embedding's share of trunk_mapped_bytes */
    int embed_shard;          /* where its rows are (read by row when the trunk streams) */
    uint64_t embed_off;
    expert_store store;
    expert_cache cache;
    threadpool *pool;
    const kernel_table *kt;
    enum io_mode io_mode;     /* expert reads: O_DIRECT / buffered / auto */
    int io_depth;             /* reads in flight */
    enum io_backend io_backend;
    int n_threads;
    uint64_t tokens;
    FILE *trace;              /* route trace (--trace), or NULL */
    char *heat_path;          /* heat file (--heat), or NULL */
    FILE *events;             /* per-call JSON lines (--events), or NULL */
    char *events_buf;
    double *layer_sec;        /* [NL] time of each layer in the last call (events) */
    int quiet;
    prefetch pf;              /* the router look-ahead prefetch (prefetch.c) */
    prompt_stats prompt;      /* the last multi-position eval */
    int all_resident;         /* every routed expert was preloaded and the cache holds them all:
                               * nothing is ever read again, so nothing is predicted */
    char *trace_buf;
    df_plan plan;             /* plan.c's decision, acted on at open */
    uint64_t session_room;    /* bytes sessions may take: the planned one + the plan's unused part */
    uint64_t sessions_bytes;  /* taken by the sessions alive now */
    uint64_t owned_bytes;     /* owned f32 vectors */
    int headers_only;         /* df_plan_model: sizes from headers, no weight read or mapped */
    float **owned;            /* owned f32 vectors, freed at close */
    int n_owned, cap_owned;
};

/* Per-layer debug record at one position (tests compare with the fixtures). */
#define DBG_MAX_ANCHORS 64
#define DBG_MAX_K 64
typedef struct dbg_layer {
    int n_attn_probs, n_mlp_probs;
    double attn_probs[DBG_MAX_ANCHORS + 1], mlp_probs[DBG_MAX_ANCHORS + 1];
    double attn_input_norm, attn_output_norm, mlp_input_norm, mlp_output_norm, partial_sum_norm;
    int n_experts;
    int expert_ids[DBG_MAX_K];
    double expert_weights[DBG_MAX_K];
} dbg_layer;

typedef struct dbg_record {
    int enabled;
    int t;                    /* which position of the next eval call to record (-1 = last) */
    double embedding_norm, final_mix_norm, final_normed_norm, logits_norm;
    dbg_layer *layers;        /* [NL], caller-allocated */
} dbg_record;

struct df_session {
    df_engine *eng;
    int n_ctx, max_batch, pos;
    uint64_t bytes;           /* state + scratch, counted against the engine's session_room */
    /* KDA state */
    float *kda_S;             /* [n_kda][Hk][Dk][Dk] */
    float *kda_hist;          /* [n_kda][3][Wc-1][P] raw projections, oldest first */
    /* MLA latent cache */
    float *mla_cache;         /* [n_mla][n_ctx][Rkv+dr] */
    /* scratch, all sized for max_batch positions */
    float *H;                 /* [T][h] running block partial sum */
    float *anchors;           /* [n_anchor_max][T][h] */
    int n_anchor_max;
    float *ain, *xn, *att, *min, *y, *ffn;   /* [T][h] */
    float *big0, *big1, *big2, *big3, *big4, *big5;  /* [T][big_w] */
    float *small0, *small1;   /* [T][max(Dk, Hk, Rq, Rkv+dr)] */
    size_t big_w;
    float *probs;             /* [T][n_anchor_max+1] */
    float *logits_tmp;        /* [V] */
    float *worker_buf;        /* [n_threads][worker_w] */
    size_t worker_w;
    /* MoE scratch */
    int *route_ids;           /* [T][k] */
    float *route_w;           /* [T][k] */
    float *zp;                /* [T][Lt] reordered latent inputs */
    float *g_x;               /* [T*k][Lt] gathered expert inputs (reordered) */
    float *g_h1, *g_h3;       /* [T*k][I] */
    float *g_a;               /* [T*k][I] reordered activations */
    float *g_out;             /* [T*k][Lt] */
    int *uniq;                /* [T*k] unique experts of a layer */
    int *slot_of;             /* [T*k] gathered row of (t, j) */
    int *uniq_first, *uniq_count; /* [T*k] gathered rows per unique expert */
    uint8_t **uniq_slot;      /* [T*k] slot of each distinct expert */
    int *uniq_state;          /* [T*k] 1 = bytes present in the slot */
    int *ready_list;          /* [T*k] */
    df_progress_fn progress;  /* between chunks of a long eval, or NULL */
    void *progress_ctx;
    uint8_t *seen;            /* [NL][E] experts the current prompt needed (accounting) */
    uint64_t n_seen;
    dbg_record *dbg;          /* optional, owned by the caller */
};

/* model.c */
int k3_config_parse(const char *text, size_t len, k3_config *c, df_error *err);
/* Checks shared by every config source (label names it in messages). */
int k3_config_check(const k3_config *c, const char *label, df_error *err);
/* Map bytes [off, off + nbytes) of shard `shard` read-only as a [rows, cols]
 * trunk matrix of `type` and register it for trunk streaming. */
int model_map_mat(df_engine *eng, int layer, int shard, uint64_t off, uint64_t nbytes, enum wtype type, int rows,
                  int cols, const char *name, wmat *out, df_error *err);
/* eng->layers for cfg, with each layer's index among its kind. */
void model_layers_alloc(df_engine *eng);
/* A zeroed f32 array freed with the engine. */
float *model_own_vec(df_engine *eng, size_t n);
/* Read n bytes at off (no allocation; the token loop may call it); -1 on error. */
int model_pread_fd(int fd, uint8_t *dst, size_t n, uint64_t off);
int model_pread(const char *path, uint8_t *dst, size_t n, uint64_t off, df_error *err);
/* model_gguf.c: the same model from one llama.cpp kimi-k3 GGUF file */
int model_load_gguf(df_engine *eng, const char *path, df_error *err);
struct gguf_file;
/* K3's hyper-parameters from a parsed GGUF's kimi-k3.* keys (and the
 * embedding's shape); k3_config_free() afterwards either way. */
int k3_config_from_gguf(const struct gguf_file *g, k3_config *c, df_error *err);
void k3_config_free(k3_config *c);
int model_load(df_engine *eng, const char *dir, df_error *err);
/* Sizes from a config.json alone (eng->headers_only set): a BF16 trunk and MXFP4 experts as K3 ships. */
int model_load_config_only(df_engine *eng, const char *path, df_error *err);
void model_unload(df_engine *eng);

/* trunk_stream.c: the trunk read layer by layer into two buffers (one
 * computing, one loading) when it does not fit the memory budget */
uint64_t trunk_stream_buffer_bytes(const df_engine *eng);
int trunk_stream_init(df_engine *eng, df_error *err);
void trunk_stream_deinit(df_engine *eng);
/* Make layer il's trunk resident (il == NL: the output head) and start
 * reading the next one into the other buffer. */
int trunk_stream_layer(df_engine *eng, int il, df_error *err);
/* Make layer il's trunk resident without starting anything else. */
int trunk_stream_ready(df_engine *eng, int il, df_error *err);
/* The trunk fits: copy its matrices (not the embedding) from the files into
 * one anonymous, huge-page-backed block and point the views there. */
int trunk_load_resident(df_engine *eng, df_error *err);

/* place.c: read --expert-path manifests into the store's sources */
int engine_use_expert_paths(df_engine *eng, const char *const *dirs, int n, df_error *err);

/* attnres.c: out[t] = Mix(anchors, p[t]) for t < T; probs [T][m+1] optional */
void attnres_mix(const float *anchors, int n_anchors, size_t anchor_stride, const float *p, int T, int h,
                 const float *nwpw, float eps, float *out, float *probs);

/* kda.c / mla.c / moe.c: one layer's block for T positions at s->pos */
void kda_forward(df_session *s, const k3_layer *L, const float *x, int T, float *out);
int mla_forward(df_session *s, const k3_layer *L, const float *x, int T, float *out, df_error *err);
int moe_forward(df_session *s, int il, const k3_layer *L, const float *y, int T, float *out, df_error *err);
void dense_mlp_forward(df_session *s, const k3_layer *L, const float *y, int T, float *out);

#endif
