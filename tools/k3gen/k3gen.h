/*
 * k3gen private header: what the tools/k3gen .c files share (types, the
 * inline RNG, and the functions one file defines and another calls).
 *
 * k3gen is deliberately independent of src/: it includes no src/ header and
 * does not link libdeltafin.  It re-implements on its own the safetensors,
 * index, config.json, tiktoken and GGUF writers, the safetensors reader
 * behind --from, and the MXFP4 / BF16 encodings, so that its output is an
 * independent oracle for the engine's loaders: a bug shared by the engine
 * and its test generator would otherwise pass unseen.  Keep it that way
 * (libc + libm only), even where that duplicates code in src/.
 */
#ifndef K3GEN_H
#define K3GEN_H

#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* growable string / byte buffer (util.c) */
typedef struct {
    char *buf;
    size_t len, cap;
} sbuf;

/* xoshiro256** stream, seeded per tensor by rng_seed (util.c) */
typedef struct {
    uint64_t s[4];
    int have_spare;
    float spare;
} rng;

/* inline here so the generator loops inline them as in one file */
static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return res;
}

/* uniform in [0, 1) */
static inline double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* standard normal, Box-Muller in float (two values per 64-bit draw) */
static inline float rng_normal(rng *r)
{
    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    uint64_t x = rng_next(r);
    float u1 = (float)((x >> 40) + 1) * 0x1.0p-24f; /* (0, 1] */
    float u2 = (float)((x >> 16) & 0xffffff) * 0x1.0p-24f;
    float rad = sqrtf(-2.0f * logf(u1));
    float th = 6.28318530717958647692f * u2;
    r->spare = rad * sinf(th);
    r->have_spare = 1;
    return rad * cosf(th);
}

/* text_config sizes (model.c: presets, --set keys, validation) */
typedef struct {
    long vocab_size, hidden_size, intermediate_size, num_hidden_layers,
        num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
        qk_rope_head_dim, v_head_dim, attn_res_block_size, num_experts,
        num_experts_per_token, num_shared_experts, moe_intermediate_size,
        routed_expert_hidden_size, kda_heads, kda_head_dim, mla_every,
        short_conv_kernel_size, first_k_dense_replace, moe_layer_freq;
} model_cfg;

typedef struct {
    const char *key;
    size_t off;
    long min;
} cfg_key;

typedef struct {
    const char *name;
    const char *about;
    model_cfg cfg;
    int shards;        /* > 0: split layers into this many shards by count */
    long shard_max_mb; /* used when shards == 0 */
} preset;

/* the safetensors roster (model.c) */
enum { DT_F32 = 0, DT_BF16 = 1, DT_U8 = 2 }; /* also the in-shard group order */
extern const char *const dtype_names[]; /* {"F32", "BF16", "U8"} */
extern const int dtype_sizes[];         /* {4, 2, 1} */

enum {
    INIT_NORMAL,     /* mean + sd * N(0,1) */
    INIT_A_LOG,      /* log(1 + 2u) for i < extra, else exactly 0 */
    INIT_MX_PACKED,  /* uniform random bytes (two E2M1 codes each) */
    INIT_MX_SCALE,   /* extra + {-1, 0, +1} */
};

typedef struct {
    char *name;
    int dtype, ndim, init;
    int64_t shape[3];
    float mean, sd;
    long extra;
    long group; /* 0 = embed, 1 + L = layer L, NL + 1 = tail */
    int shard;
    uint64_t offset;
    int src_shard;      /* --from: the source shard holding the bytes, */
    uint64_t src_off;   /* and their absolute offset in that file */
} tensor;

typedef struct {
    tensor *t;
    size_t n, cap;
} tensor_list;

/* tensor bytes are generated and handed to a sink this many bytes at a time (weights.c) */
#define CHUNK_BYTES (4u << 20)

typedef void (*sink_fn)(void *ctx, const unsigned char *p, size_t n);

/* files are written as NAME.k3gen-tmp and renamed into place when complete */
#define TMP_SUFFIX ".k3gen-tmp"

typedef struct {
    FILE *f;
    char *final_path, *tmp_path;
} out_file;

/* --from source checkpoint (source.c) */
#define SRC_MAX_DIMS 8

typedef struct {
    char *name, *dtype;
    int ndim;                       /* may exceed SRC_MAX_DIMS; then only those are kept */
    int64_t shape[SRC_MAX_DIMS];
    uint64_t begin, end;            /* absolute offsets in the file */
} src_entry;

typedef struct {
    char *file, *path;
    int fd;
    uint64_t size;
    src_entry *e; /* sorted by name */
    size_t n;
} src_shard;

typedef struct {
    const char *dir;
    src_shard *s;
    size_t n, cap;
} src_ckpt;

/* BPE vocabulary: token byte strings by rank (tokenizer.c) */
typedef struct {
    unsigned char *data;
    size_t data_len, data_cap;
    size_t *off;
    int *len;
    int n, cap;
    int *ht; /* open addressing over ids, -1 = empty */
    size_t ht_cap;
} vocab;

/* Spelling of a reserved id, by offset from V-256. */
typedef struct {
    int off;
    const char *spelling;
} special_token;

/* every checkpoint tensor name starts with this */
#define PFX "language_model."
extern const cfg_key cfg_keys[];
extern const size_t n_cfg_keys;
extern const preset presets[];
extern const size_t n_presets;
extern src_ckpt *g_src;          /* set by --from */
extern const char *g_tok_corpus; /* --tokenizer-corpus FILE, or NULL */

/* util.c: errors, allocation, string builder, rng seeding, output files */
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
void sb_reserve(sbuf *sb, size_t extra);
void sb_addn(sbuf *sb, const char *s, size_t n);
void sb_add(sbuf *sb, const char *s);
void sb_printf(sbuf *sb, const char *fmt, ...);
void sb_json_str(sbuf *sb, const char *s);
void rng_seed(rng *r, uint64_t seed, const char *name);
void write_all(FILE *f, const void *p, size_t n, const char *path);
char *path_join(const char *dir, const char *name);
out_file out_open(const char *dir, const char *name);
void out_close(out_file *o);
void write_text_file(const char *dir, const char *name, const char *text, size_t len);
void prepare_out_dir(const char *dir, int force);

/* model.c: model config, presets, tensor roster, config.json */
long *cfg_field(model_cfg *c, const char *key);
int is_mla_layer(const model_cfg *c, long l);
int is_moe_layer(const model_cfg *c, long l);
void validate_cfg(const model_cfg *c);
int64_t tensor_numel(const tensor *t);
uint64_t tensor_bytes(const tensor *t);
void build_roster(const model_cfg *c, tensor_list *tl);
void write_config(const char *dir, const model_cfg *c);

/* weights.c: deterministic tensor bytes (normal/BF16, A_log, MXFP4 packed + scale) */
void gen_tensor_data(const tensor *t, uint64_t seed, unsigned char *buf, sink_fn emit, void *ctx);
void write_tensor_data(FILE *f, const char *path, const tensor *t, uint64_t seed, unsigned char *buf);
unsigned char *gen_tensor_mem(const tensor *t, uint64_t seed, unsigned char *chunk);

/* source.c: --from: the safetensors reader */
int have_source(void);
void src_open(src_ckpt *sc, const char *dir, tensor_list *tl);
void src_close(src_ckpt *sc);
void src_read_tensor(const tensor *t, unsigned char *buf, sink_fn emit, void *ctx);

/* safetensors.c: safetensors shards + index writer */
int cmp_by_name(const void *a, const void *b);
int assign_shards(const model_cfg *c, tensor_list *tl, int shards, long shard_max_mb);
uint64_t write_shards(const char *dir, tensor_list *tl, int nshards, uint64_t seed, int dry_run);
void write_index(const char *dir, tensor_list *tl, int nshards, uint64_t total);

/* tokenizer.c: BPE trainer, tiktoken.model + tokenizer_config.json */
int vocab_find(const vocab *v, const unsigned char *p, int n);
int vocab_find_pair(const vocab *v, int a, int b, unsigned char *scratch);
void build_vocab(vocab *v, long vocab_size);
int load_vocab_tiktoken(vocab *v, const char *path);
int write_tokenizer(const char *dir, long V);
const unsigned char *vocab_bytes(const vocab *v, int id);
extern const special_token special_tokens[];
extern const size_t n_special_tokens;

/* gguf.c: GGUF writer */
uint64_t write_gguf(const char *path, const model_cfg *c, tensor_list *tl, uint64_t seed, int f32, int n_split);
void gg_report(const char *path, int n_split, int f32, uint64_t bytes);
/* --gguf-trunk q8_0|f16|q8_0-values (gguf.c) */
void gg_set_trunk(const char *mode);
/* --gguf-experts q8_0|q8_0-values (gguf.c) */
void gg_set_experts(const char *mode);
void gg_set_from(const char *dir);

#endif /* K3GEN_H */
