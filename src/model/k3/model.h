/* model.h - L3 internals shared by the model files (model, attnres, kda, mla,
 * moe, prefetch, expert_fetch): the K3 config, the per-layer weight views,
 * the loaded model (k3_model), a session's state and scratch (session_bufs)
 * and the narrow view of the engine a layer block gets (model_ctx).  The
 * engine's own structs are in engine_impl.h (L4), which this file does not
 * see.  Front ends never include this (engine.h only).
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
#include "df_error.h"
#include "expert_cache.h"
#include "expert_store.h"
#include "file.h"
#include "kernels.h"
#include "ops.h"
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
    int n_ctx_max;            /* the longest context the model was made for: max_position_embeddings
                               * (GGUF: context_length); 0 when the file does not say */
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

typedef struct tensor_map {
    void *base;               /* read-only mapping of one trunk tensor's pages */
    size_t size;
} tensor_map;

/* A loaded checkpoint: config, weights (views into the shard mappings or
 * owned copies), where every trunk tensor lives, and the expert store that
 * knows where every routed expert's bytes are.  model.c / model_gguf.c
 * fill it; the engine owns it. */
typedef struct k3_model {
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
    uint64_t embed_bytes;     /* the embedding's share of trunk_mapped_bytes */
    int embed_shard;          /* where its rows are (read by row when the trunk streams) */
    uint64_t embed_off;
    expert_store store;
    enum io_mode io_mode;     /* expert reads: O_DIRECT / buffered / auto */
    int io_depth;             /* reads in flight */
    uint64_t disk_cache_max;  /* a streamed install's disk cache cap (0: the install's) */
    enum io_backend io_backend;
    uint64_t owned_bytes;     /* owned f32 vectors */
    int from_mirror;          /* a streamed install: experts fetched over HTTP (libcurl, planned) */
    int headers_only;         /* df_plan_model: sizes from headers, no weight read or mapped */
    enum wtype syn_trunk;     /* model_load_config_only: the trunk matrices' type (W_BF16, W_F16, W_Q8_0) */
    float **owned;            /* owned f32 vectors, freed at close */
    int n_owned, cap_owned;
} k3_model;

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

/* Observation points of a forward pass (layer.c and the engine's schedule
 * runner offer them; the engine's observers, engine/observe.c, subscribe):
 * rows [t0, t0+nt) of a chunk of T positions starting at pos0. */
enum {
    PROBE_CHUNK_BEGIN, PROBE_EMBED,        /* rows: the embedding [T][h] */
    PROBE_ATTN_MIX,                        /* rows: the attention input; probs [nt][n_probs] or NULL (no anchor yet) */
    PROBE_ATTN_OUT,                        /* rows: the attention output */
    PROBE_MLP_MIX,                         /* rows: the MLP input; probs */
    PROBE_MLP_OUT,                         /* rows: the MLP or MoE output, rows2 the partial sum after it */
    PROBE_ROUTE,                           /* ids, w, score: [T][k] the layer's routes */
    PROBE_EXPERTS,                         /* experts [n_experts]: the layer's distinct experts, before
                                              they are read (prompt accounting, prefetch scoring) */
    PROBE_PROMPT_BEGIN, PROBE_PROMPT_END,  /* an evaluation of T positions from pos0 (many chunks) */
    PROBE_LAYER_END,                       /* a layer's steps are done (its slices may still finish later) */
    PROBE_FINAL_MIX, PROBE_FINAL_NORM,     /* rows: the output mix, the final norm */
    PROBE_LOGITS,                          /* rows: the last position's logits [V] */
    PROBE_ATTN_PROBS,                      /* an MLA layer's rows: ids / w = session_bufs.attn_pos / attn_p;
                                              a KDA layer's: w = session_bufs.kda_stat, ids NULL */
    PROBE_CHUNK_END
};
typedef struct probe_ev {
    int point, il;                         /* il: the layer (-1 before the first, NL the output) */
    int t0, nt, T, pos0;
    int width;                             /* floats a row of rows and rows2 */
    const float *rows, *rows2;
    const float *probs;
    int n_probs;
    const int32_t *ids;
    const float *w;
    const float *score;                    /* PROBE_ROUTE: [T][k] the routes' router scores */
    int k;
    int moe;                               /* PROBE_MLP_OUT: the MoE (1) or a dense MLP (0) */
    const int *experts;                    /* PROBE_EXPERTS */
    int n_experts;
} probe_ev;
typedef void (*probe_fn)(void *ctx, const probe_ev *ev);

/* One sequence's state and scratch (the engine's session owns one): what
 * the layer blocks read and write.  Sized by engine.c's session_alloc. */
/* One layer's group of distinct experts going through the cache
 * (expert_fetch.c): uniq[u0..next) acquired, uniq[next..u1) not yet;
 * n_wait of the acquired still being read; n_ready present, not computed. */
typedef struct fetch_state {
    int il, u0, u1, next, n_wait, n_ready, rc, open;
} fetch_state;

typedef struct session_bufs {
    int n_ctx, max_batch, pos;
    /* KDA state */
    float *kda_S;             /* [n_kda][Hk][Dk][Dk] */
    float *kda_hist;          /* [n_kda][3][Wc-1][P] raw projections, oldest first */
    /* rollback: the KDA state at the mark and each later row's recurrence
     * inputs (kda.c), so the session can return to any position since */
    int rb_rows;              /* rows kept after a mark (0: no rollback) */
    int rb_mark;              /* the mark's position, -1 when none */
    float *kda_S0, *kda_hist0;  /* kda_S and kda_hist at the mark */
    float *kda_rec;           /* [n_kda][rb_rows][4P + Hk] */
    /* checkpoints: the KDA state and conv history at chosen positions, so
     * the session can return exactly there (conversation prefixes) */
    int n_ck;                 /* checkpoint entries */
    float *ck_state;          /* [n_ck][kda_S + kda_hist floats] */
    int *ck_pos;              /* [n_ck] position, -1 empty */
    uint64_t *ck_age;         /* [n_ck] last use, for replacing the oldest */
    uint64_t ck_clock;
    size_t ck_nS, ck_nH;      /* an entry: kda_S floats, then kda_hist floats */
    int *ck_want;             /* [n_ck] a position ahead the entry is taken at when the forward
                                 pass gets there (kda.c copies each head's state after that
                                 row), -1 none; it becomes ck_pos once the pass ends */
    /* MLA latent cache */
    float *mla_cache;         /* [n_mla][n_ctx][Rkv+dr] */
    /* scratch.  A chunk of T <= max_batch positions runs each layer's
     * attention, dense MLP, router and shared experts in slices of at most
     * row_slice rows (engine.c forward_chunk), and its routed experts over
     * all T rows at once (one read per distinct expert): the slice buffers
     * hold row_slice rows, the rest max_batch positions. */
    int row_slice;            /* rows of the slice buffers: min(max_batch, the session's row slice) */
    float *H;                 /* [max_batch][h] running partial sum (AttnRes: of the current block) */
    float *anchors;           /* [n_anchor_max][max_batch][h] */
    int n_anchor_max;
    float *ain, *xn, *att, *min, *y, *ffn;   /* [row_slice][h] */
    float *big0, *big1, *big2, *big3, *big4, *big5;  /* [row_slice][big_w], at least Dff floats (big_cap) */
    float *small0, *small1;   /* [row_slice][max(Dk, Hk, Rq, Rkv+dr)] */
    size_t big_w, big_cap;    /* big_w: every width but the dense MLP's (which runs in row slices) */
    float *probs;             /* [row_slice][n_anchor_max+1] */
    float *logits_tmp;        /* [V] */
    float *worker_buf;        /* [n_threads][worker_w] */
    size_t worker_w;
    /* MoE scratch, per position of a chunk (T = max_batch) */
    int *route_ids;           /* [T][k] */
    float *route_w;           /* [T][k] */
    float *route_s;           /* [T][k] the routes' router scores (traces) */
    float *zp;                /* [T][Lt] reordered latent inputs */
    float *g_x;               /* gathered expert inputs (reordered): [T*k][Lt] when g_x_full (several
                                 ranks: their rows are posted whole), else [g_rows][Lt], a batch's rows
                                 gathered from zp by row_pos as the batch runs */
    int g_x_full;
    int *row_pos;             /* [T*k] position of each gathered row */
    float *g_h1, *g_h3;       /* [g_rows][I]: a batch of experts' rows (moe.c run_experts); after
                                 SiTU, g_h3 holds the reordered activations */
    size_t g_rows;            /* min(T*k, 2 row_slice + 256) */
    float *g_out;             /* [T*k][Lt] */
    int *uniq;                /* [T*k] unique experts of a layer, in first use (row) order */
    int n_u;                  /* how many, over the rows routed so far (moe_route) */
    int *u_of_e;              /* [E] index in uniq of each expert while a layer routes, -1 none */
    fetch_state fg;           /* the layer's reads, started as its row slices route */
    int *row_of;             /* [T*k] gathered row of (t, j) */
    int *uniq_first, *uniq_count; /* [T*k] gathered rows per unique expert */
    uint8_t **uniq_slot;      /* [T*k] slot of each distinct expert */
    int *uniq_state;          /* [T*k] 1 = bytes present in its cache slot */
    int *ready_list;          /* [T*k] */
    uint8_t *seen;            /* [NL][E] experts the current prompt needed (accounting) */
    uint64_t n_seen;
    /* observation (layer.c offers its points when probe is set) */
    probe_fn probe;
    void *probe_ctx;
    /* the attention dump (--dump-attention): per row of a chunk, each chosen
     * head's attn_top largest weights (position, weight; -1 / 0 past the
     * context), [T][attn_nh][attn_top], filled by mla.c at the MLA layers
     * attn_on marks; attn_on NULL: no dump */
    const uint8_t *attn_on;
    int attn_h0, attn_nh, attn_top;
    int32_t *attn_pos;
    float *attn_p;
    float *kda_stat;          /* the dump at KDA layers: [T][Hk][4] beta, the decay's mean and min, the
                               * output gate's mean (kda.c) */
    /* the first layer whose rows held a NaN/infinity in this chunk (-1: the
     * embedding, NL: the output head, INT_MAX: none), and which part */
    int nf_layer;
    const char *nf_part;
} session_bufs;

/* What a layer block needs from the engine, borrowed for one forward pass:
 * the config and weights, the backend (ops.h), and for the
 * MoE block the expert cache and store, the prefetcher and whether the
 * streamed trunk has a layer in memory.  Built by the engine at open. */
struct prefetch;
/* Experts computed by other processes (engine/ranks.c, MPI).  owner[il * E
 * + e] is the rank that computes expert e of layer il (0: this process).
 * For one layer, moe_experts posts each other rank its experts' gathered
 * rows (non-blocking: ids, rows per expert, the rows), computes its own
 * meanwhile, then collect waits until every answer (one output row per
 * input row, written to out) has landed; an error names the rank. */
typedef struct moe_ranks {
    int n;
    const uint8_t *owner;
    int (*post)(void *ctx, int rank, int il, const int *ids, const int *counts, int n_ids, const float *x, int rows,
                float *out, df_error *err);
    int (*collect)(void *ctx, int il, df_error *err);
    void *ctx;
    uint64_t *local_calls;    /* experts this process computed */
} moe_ranks;

typedef struct model_ctx {
    k3_config cfg;            /* a copy (its arrays are the model's) */
    const k3_layer *layers;
    const k3_backend *bk;     /* where and how the blocks run (ops.h) */
    expert_cache *cache;
    expert_store *store;
    struct prefetch *pf;
    int all_resident;         /* every routed expert is in the cache for good: nothing to predict */
    int io_depth;
    int quiet;
    int trunk_streamed;       /* the trunk streams: layer weights are present only when ready */
    int (*trunk_ready)(void *eng, int il);   /* make layer il's weights present (0), else -1 */
    void *eng;
    const moe_ranks *ranks;   /* experts across processes, or NULL */
} model_ctx;

/* model.c */
int k3_config_parse(const char *text, size_t len, k3_config *c, df_error *err);
/* Checks shared by every config source (label names it in messages). */
int k3_config_check(const k3_config *c, const char *label, df_error *err);
/* Map bytes [off, off + nbytes) of shard `shard` read-only as a [rows, cols]
 * trunk matrix of `type` and register it for trunk streaming. */
int model_map_mat(k3_model *eng, int layer, int shard, uint64_t off, uint64_t nbytes, enum wtype type, int rows,
                  int cols, const char *name, wmat *out, df_error *err);
/* eng->layers for cfg, with each layer's index among its kind. */
void model_layers_alloc(k3_model *eng);
/* A zeroed f32 array freed with the engine. */
float *model_own_vec(k3_model *eng, size_t n);
/* Read n bytes at off (no allocation; the token loop may call it); -1 on error. */
int model_pread_fd(int fd, uint8_t *dst, size_t n, uint64_t off);
int model_pread(const char *path, uint8_t *dst, size_t n, uint64_t off, df_error *err);
/* model_gguf.c: the same model from one llama.cpp kimi-k3 GGUF file */
int model_load_gguf(k3_model *eng, const char *path, df_error *err);
struct gguf_file;
/* K3's hyper-parameters from a parsed GGUF's kimi-k3.* keys (and the
 * embedding's shape); k3_config_free() afterwards either way. */
int k3_config_from_gguf(const struct gguf_file *g, k3_config *c, df_error *err);
void k3_config_free(k3_config *c);
/* model_load.c: a GGUF file (model_load_gguf) or a checkpoint directory */
int model_load(k3_model *eng, const char *dir, df_error *err);
/* model.c: a checkpoint directory (config.json, safetensors shards) */
int model_load_safetensors(k3_model *eng, const char *dir, df_error *err);
/* Sizes from a config.json alone (eng->headers_only set): a BF16 trunk and MXFP4 experts as K3 ships. */
int model_load_config_only(k3_model *eng, const char *path, df_error *err);
void model_unload(k3_model *eng);

/* attnres.c: out[t] = Mix(anchors, p[t]) for t < T; probs [T][m+1] optional */
void attnres_mix(const float *anchors, int n_anchors, size_t anchor_stride, const float *p, int T, int h,
                 const float *nwpw, float eps, float *out, float *probs);

/* kda.c: the CPU backend's KDA (ops kda_rows, kda_replay), and the
 * bookkeeping every backend's KDA shares: the checkpoints taken inside a
 * pass (kda_takes, kda_take_head) and the rows kept after a rollback mark
 * (kda_keep_rows; kda_rec_layer is where a layer's kept rows are). */
void kda_forward(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *x, int T, float *out);
void kda_replay(const model_ctx *eng, session_bufs *s, const k3_layer *L, int rows);
enum { KDA_TAKES_MAX = 64 };
int kda_takes(const session_bufs *s, int T, int *take_t, int *take_entry);
void kda_take_head(const k3_config *cf, session_bufs *s, const k3_layer *L, const float *S, const float *hist_layer,
                   size_t hh, int entry);
void kda_keep_rows(const k3_config *c, session_bufs *s, const k3_layer *L, const float *rq, const float *rk,
                   const float *rv, const float *fb, const float *b, int T);
float *kda_rec_layer(const k3_config *c, session_bufs *s, int kda_idx);
/* mla.c: the CPU backend's MLA (op mla_rows) */
int mla_forward(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *x, int T, float *out, df_error *err);
/* moe.c: the MoE block's orchestration in three steps (the numbers are the
 * backend's ops route, experts, shared_down and combine), so a chunk's
 * attention and shared experts can run in row slices around one pass over
 * its routed experts:
 *   moe_route   rows [t0, t0+nt) (y: their inputs): router, routing and the
 *               latent inputs; with `shared`, the shared experts' gate and
 *               up products too (into big0/big1, for moe_experts' overlap);
 *   moe_experts all T rows routed so far: each distinct expert read once
 *               and applied to its gathered rows; out (the rows' [T][h]
 *               shared output) gets the shared down-projection overlapped
 *               with the first reads, or pass NULL;
 *   moe_finish  rows [t0, t0+nt): out = shared(y) (unless shared_done, when
 *               out already holds it) + up(norm(route-order sum)).
 */
void moe_route(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, int shared);
/* Between row slices: start reading the distinct experts the rows routed
 * so far need (as far as free slots allow), so the reads overlap the next
 * blocks' attention.  Only experts some row was routed to are read (a
 * prefix of the layer's final distinct list), each once; the reads are
 * collected by moe_experts, or by moe_abandon after an error. */
void moe_start(const model_ctx *eng, session_bufs *s, int il, df_error *err);
void moe_abandon(const model_ctx *eng, session_bufs *s);
int moe_experts(const model_ctx *eng, session_bufs *s, int il, const k3_layer *L, int T, float *out, df_error *err);
void moe_finish(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, float *out,
                int shared_done);
/* Another rank's side of moe_ranks: the n experts ids[] of layer il over
 * their gathered rows x (counts[u] rows each, in order), through this
 * process's cache and store; one output row per input row into out. */
int moe_experts_for(const model_ctx *eng, session_bufs *s, int il, const int *ids, const int *counts, int n,
                    const float *x, float *out, df_error *err);
/* moe_cpu.c: the CPU backend's FFN ops */
void cpu_dense_mlp(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int T, float *out);
void cpu_route(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, int shared);
void cpu_experts(const model_ctx *eng, session_bufs *s, int il, const int *us, int n);
void cpu_shared_down(const model_ctx *eng, session_bufs *s, const k3_layer *L, int T, float *out);
void cpu_combine(const model_ctx *eng, session_bufs *s, const k3_layer *L, const float *y, int t0, int nt, float *out,
                 int shared_done);
/* Top-k routing of one row's router logits (spec 7.1): ids and weights in
 * descending biased score, ties to the lower id; sig/choice: E floats of
 * scratch each.  Every backend routes with it. */
void moe_route_row(const k3_config *c, const float *logits, const float *bias, int *ids, float *w, float *score,
                   float *sig,
                   float *choice);
/* A routed expert's projection p (0 gate, 1 down, 2 up) from its cache slot. */
wmat moe_expert_mat(const expert_store *st, const expert_loc *loc, const uint8_t *slot, int p, int rows, int cols);
/* model_gguf.c: how a GGUF tensor of a row-readable ggml type is read
 * (F32, BF16, F16, Q8_0; any other block format of qblock.h is W_QB) */
enum wtype model_wtype_of_ggml(uint32_t ggml_type);
/* The input rows of layer il's piece p as its kernel reads them: MXFP4
 * pieces the reordering of mxfp4_prep_x, every other type column order
 * (a copy).  Gate and up share their input, so a layer's two are of the
 * same kind (model_gguf.c refuses a file where they are not). */
void moe_prep_rows(const expert_store *st, int il, int p, const float *x, int C, float *out);

/* layer.c: one layer on a slice of a chunk's rows, in the phase a step of
 * the engine's schedule names (layer.c's comment says what each does). */
enum { LAYER_ROWS, LAYER_READS, LAYER_EXPERTS, LAYER_FINISH };
typedef struct layer_call {
    int il, phase;
    int t0, nt;               /* the rows (ROWS, FINISH) */
    int n_anc;                /* the anchors the layer's mixes see: ROWS before its own boundary
                                 anchor, FINISH after it */
    int T, pos0, one_slice;   /* the chunk: T positions from pos0; one_slice: T fits one row slice */
} layer_call;
int k3_layer_forward(const model_ctx *mc, session_bufs *b, const k3_layer *L, const layer_call *lc, df_error *err);
/* The non-finite test of rows a part adds (the earliest layer and part
 * kept in b; the output step uses it too). */
void rows_check_finite(session_bufs *b, const float *x, size_t n, int layer, const char *part);

#endif
