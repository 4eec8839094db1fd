/*
 * k3gen: writes a Kimi-K3-layout test checkpoint directory (config.json, index json,
 * model-NNNNN-of-NNNNNN.safetensors shards, tiktoken.model, tokenizer_config.json)
 * with deterministic random weights at any size (presets + --set). Layout follows
 * shared/docs/k3-architecture.md sections 2, 3, 3.1, 8, 9.1 and reproduces
 * shared/fixtures/k3-tiny-a/checkpoint byte for byte in everything but the values
 * and tiktoken.model (preset tiny-a-shape). Self-contained: libc + libm only.
 * Invariants:
 *  - a tensor's bytes depend only on (--seed, its name): own xoshiro256** stream
 *    seeded from the seed and the name's FNV-1a hash; data is streamed in chunks.
 *  - a shard holds the F32, then BF16, then U8 group, each strcmp-sorted, no gaps,
 *    so an expert's six tensors are contiguous; a layer (so all its experts) never
 *    spans shards; embed_tokens in the first shard, lm_head/model.norm/output_* last.
 *  - the tokenizer depends only on vocab_size: ranks 0..255 = bytes in GPT-2 order,
 *    then BPE merges (XTML words first, each a single token once V >= ~570), then
 *    filler concatenations of two existing tokens; all byte strings are unique.
 *  - files are written as NAME.k3gen-tmp and renamed when complete; the index json
 *    is written last, so its presence means the directory is complete.
 */
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

/* ------------------------------------------------------------------ errors */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("k3gen: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory allocating %zu bytes", n);
    return p;
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die("out of memory reallocating %zu bytes", n);
    return q;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

/* ---------------------------------------------------------- string builder */

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf;

static void sb_reserve(sbuf *sb, size_t extra)
{
    if (sb->len + extra + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 1024;
        while (sb->len + extra + 1 > cap)
            cap *= 2;
        sb->buf = xrealloc(sb->buf, cap);
        sb->cap = cap;
    }
}

static void sb_addn(sbuf *sb, const char *s, size_t n)
{
    sb_reserve(sb, n);
    memcpy(sb->buf + sb->len, s, n);
    sb->len += n;
    sb->buf[sb->len] = 0;
}

static void sb_add(sbuf *sb, const char *s) { sb_addn(sb, s, strlen(s)); }

static void sb_printf(sbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        die("internal: vsnprintf failed");
    sb_reserve(sb, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

/* JSON string literal with escapes. */
static void sb_json_str(sbuf *sb, const char *s)
{
    sb_add(sb, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[3] = {'\\', (char)c, 0};
            sb_add(sb, e);
        } else if (c < 0x20) {
            sb_printf(sb, "\\u%04x", c);
        } else {
            sb_addn(sb, (const char *)&c, 1);
        }
    }
    sb_add(sb, "\"");
}

/* --------------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct {
    uint64_t s[4];
    int have_spare;
    float spare;
} rng;

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void rng_seed(rng *r, uint64_t seed, const char *name)
{
    uint64_t x = seed * 0xd1b54a32d192ed03ULL ^ fnv1a64(name);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->have_spare = 0;
    r->spare = 0.0f;
}

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

/* ------------------------------------------------------------------ config */

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

#define CK(k, m) {#k, offsetof(model_cfg, k), m}
static const cfg_key cfg_keys[] = {
    CK(vocab_size, 512), CK(hidden_size, 1), CK(intermediate_size, 1),
    CK(num_hidden_layers, 1), CK(num_attention_heads, 1), CK(q_lora_rank, 1),
    CK(kv_lora_rank, 1), CK(qk_nope_head_dim, 1), CK(qk_rope_head_dim, 1),
    CK(v_head_dim, 1), CK(attn_res_block_size, 1), CK(num_experts, 1),
    CK(num_experts_per_token, 1), CK(num_shared_experts, 1),
    CK(moe_intermediate_size, 32), CK(routed_expert_hidden_size, 32),
    CK(kda_heads, 1), CK(kda_head_dim, 1), CK(mla_every, 1),
    CK(short_conv_kernel_size, 1), CK(first_k_dense_replace, 0), CK(moe_layer_freq, 1),
};
#undef CK

static const struct {
    const char *alias, *key;
} cfg_aliases[] = {
    {"linear_attn_config.num_heads", "kda_heads"},
    {"linear_attn_config.head_dim", "kda_head_dim"},
    {"linear_attn_config.short_conv_kernel_size", "short_conv_kernel_size"},
    {"num_heads", "kda_heads"},
    {"head_dim", "kda_head_dim"},
};

typedef struct {
    const char *name;
    const char *about;
    model_cfg cfg;
    int shards;        /* > 0: split layers into this many shards by count */
    long shard_max_mb; /* used when shards == 0 */
} preset;

/*                        V     h   Dff  NL  Hm  Rq  Rkv dn  dr  dv  B   E    k  Ns  I    Lt   Hk  Dk  every Wc fkd freq */
static const preset presets[] = {
    {"tiny", "smallest useful: 2 blocks, KDA+MLA, dense layer 0, Hk != Hm, h not a power of 2",
     {600, 40, 64, 6, 3, 16, 8, 8, 4, 8, 3, 8, 2, 1, 32, 32, 2, 8, 3, 4, 1, 1}, 2, 0},
    {"tiny-a-shape", "exactly the dimensions of shared/fixtures/k3-tiny-a",
     {640, 64, 128, 13, 3, 32, 16, 16, 8, 16, 4, 16, 4, 2, 32, 32, 4, 16, 4, 4, 1, 1}, 3, 0},
    {"small", "about 30 MB",
     {4096, 256, 768, 8, 4, 128, 64, 64, 32, 64, 4, 128, 8, 2, 128, 128, 4, 64, 4, 4, 1, 1}, 0, 16},
    {"bench1g", "about 1.2 GB, K3-shaped (most bytes in MXFP4 experts)",
     {32768, 1024, 3072, 12, 8, 256, 128, 128, 64, 128, 4, 192, 8, 2, 512, 512, 8, 128, 4, 4, 1, 1}, 0, 512},
    {"bench2g", "about 2.6 GB, K3-shaped (most bytes in MXFP4 experts)",
     {32768, 1536, 4608, 16, 12, 384, 128, 128, 64, 128, 4, 192, 8, 2, 512, 768, 12, 128, 4, 4, 1, 1}, 0, 1024},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

static long *cfg_field(model_cfg *c, const char *key)
{
    for (size_t i = 0; i < sizeof cfg_aliases / sizeof cfg_aliases[0]; i++)
        if (!strcmp(key, cfg_aliases[i].alias))
            key = cfg_aliases[i].key;
    for (size_t i = 0; i < sizeof cfg_keys / sizeof cfg_keys[0]; i++)
        if (!strcmp(key, cfg_keys[i].key))
            return (long *)((char *)c + cfg_keys[i].off);
    return NULL;
}

static int is_mla_layer(const model_cfg *c, long l)
{
    return (l + 1) % c->mla_every == 0 || l == c->num_hidden_layers - 1;
}

static int is_moe_layer(const model_cfg *c, long l)
{
    return l >= c->first_k_dense_replace && l % c->moe_layer_freq == 0;
}

static void validate_cfg(const model_cfg *c)
{
    for (size_t i = 0; i < sizeof cfg_keys / sizeof cfg_keys[0]; i++) {
        long v = *(const long *)((const char *)c + cfg_keys[i].off);
        if (v < cfg_keys[i].min)
            die("%s = %ld is too small (minimum %ld)", cfg_keys[i].key, v, cfg_keys[i].min);
        if (v > (1L << 30))
            die("%s = %ld is absurdly large", cfg_keys[i].key, v);
    }
    if (c->routed_expert_hidden_size % 32)
        die("routed_expert_hidden_size = %ld must be a multiple of 32 (it is the input "
            "dimension of MXFP4 w1/w3, quantized in groups of 32)", c->routed_expert_hidden_size);
    if (c->moe_intermediate_size % 32)
        die("moe_intermediate_size = %ld must be a multiple of 32 (it is the input "
            "dimension of MXFP4 w2, quantized in groups of 32)", c->moe_intermediate_size);
    if (c->num_experts_per_token > c->num_experts)
        die("num_experts_per_token = %ld exceeds num_experts = %ld",
            c->num_experts_per_token, c->num_experts);
    if (c->first_k_dense_replace > c->num_hidden_layers)
        die("first_k_dense_replace = %ld exceeds num_hidden_layers = %ld",
            c->first_k_dense_replace, c->num_hidden_layers);
    int any_kda = 0;
    for (long l = 0; l < c->num_hidden_layers; l++)
        any_kda |= !is_mla_layer(c, l);
    if (any_kda && c->kda_heads > c->kda_head_dim)
        die("kda_heads = %ld exceeds kda_head_dim = %ld: A_log is stored as [kda_head_dim] "
            "and must hold one entry per head", c->kda_heads, c->kda_head_dim);
}

/* ------------------------------------------------------------------ tensors */

enum { DT_F32 = 0, DT_BF16 = 1, DT_U8 = 2 }; /* also the in-shard group order */
static const char *dtype_names[] = {"F32", "BF16", "U8"};
static const int dtype_sizes[] = {4, 2, 1};

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

static int64_t tensor_numel(const tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

static uint64_t tensor_bytes(const tensor *t)
{
    return (uint64_t)tensor_numel(t) * (uint64_t)dtype_sizes[t->dtype];
}

static tensor *add_tensor(tensor_list *tl, long group, const char *name, int dtype, int ndim,
                          int64_t d0, int64_t d1, int64_t d2)
{
    if (tl->n == tl->cap) {
        tl->cap = tl->cap ? tl->cap * 2 : 256;
        tl->t = xrealloc(tl->t, tl->cap * sizeof *tl->t);
    }
    tensor *t = &tl->t[tl->n++];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->group = group;
    t->init = INIT_NORMAL;
    double numel = (double)d0 * (double)(ndim > 1 ? d1 : 1) * (double)(ndim > 2 ? d2 : 1);
    if (numel > 0x1.0p44)
        die("tensor %s would have %.3g elements; refusing (sizes too large)", name, numel);
    return t;
}

/* BF16/F32 tensor with entries mean + sd * N(0,1) */
static void add_normal(tensor_list *tl, long group, const char *name, int dtype, int ndim,
                       int64_t d0, int64_t d1, int64_t d2, double mean, double sd)
{
    tensor *t = add_tensor(tl, group, name, dtype, ndim, d0, d1, d2);
    t->mean = (float)mean;
    t->sd = (float)sd;
}

/* Matrix [out, in], N(0, gain / sqrt(in)) (the fixture's convention). */
static void add_matrix(tensor_list *tl, long group, const char *name, int64_t out, int64_t in,
                       double gain)
{
    add_normal(tl, group, name, DT_BF16, 2, out, in, 0, 0.0, gain / sqrt((double)in));
}

/* Norm weight [n], 1 + N(0, 0.1). */
static void add_norm(tensor_list *tl, long group, const char *name, int dtype, int64_t n)
{
    add_normal(tl, group, name, dtype, 1, n, 0, 0, 1.0, 0.1);
}

/* E8M0 byte whose 2^(s-127) times the RMS of uniform random E2M1 codes
 * (sqrt(68.5/8) = 2.926) gives the target standard deviation. */
static long mx_scale_center(double target_sd)
{
    long s = 127 + lround(log2(target_sd / 2.9261749));
    if (s < 101)
        s = 101;
    if (s > 149)
        s = 149;
    return s;
}

/* MXFP4 logical matrix [rows, cols]: packed [rows, cols/2] + scale [rows, cols/32]. */
static void add_mxfp4(tensor_list *tl, long group, const char *prefix, int64_t rows, int64_t cols,
                      double target_sd)
{
    char name[512];
    snprintf(name, sizeof name, "%s.weight_packed", prefix);
    tensor *t = add_tensor(tl, group, name, DT_U8, 2, rows, cols / 2, 0);
    t->init = INIT_MX_PACKED;
    snprintf(name, sizeof name, "%s.weight_scale", prefix);
    t = add_tensor(tl, group, name, DT_U8, 2, rows, cols / 32, 0);
    t->init = INIT_MX_SCALE;
    t->extra = mx_scale_center(target_sd);
}

#define PFX "language_model."

static void build_roster(const model_cfg *c, tensor_list *tl)
{
    const int64_t V = c->vocab_size, h = c->hidden_size, NL = c->num_hidden_layers;
    const int64_t Hk = c->kda_heads, Dk = c->kda_head_dim, P = Hk * Dk, Wc = c->short_conv_kernel_size;
    const int64_t Hm = c->num_attention_heads, Rq = c->q_lora_rank, Rkv = c->kv_lora_rank;
    const int64_t dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    const int64_t E = c->num_experts, I = c->moe_intermediate_size, Lt = c->routed_expert_hidden_size;
    const int64_t NsI = c->num_shared_experts * I, Dff = c->intermediate_size;
    char n[512], p[128];

    add_normal(tl, 0, PFX "model.embed_tokens.weight", DT_BF16, 2, V, h, 0, 0.0, 1.0);

    for (int64_t l = 0; l < NL; l++) {
        long g = (long)l + 1;
        snprintf(p, sizeof p, PFX "model.layers.%lld.", (long long)l);
#define NM(suffix) (snprintf(n, sizeof n, "%s%s", p, suffix), n)
        add_norm(tl, g, NM("input_layernorm.weight"), DT_BF16, h);
        add_norm(tl, g, NM("self_attention_res_norm.weight"), DT_BF16, h);
        add_matrix(tl, g, NM("self_attention_res_proj.weight"), 1, h, 1.5);
        add_norm(tl, g, NM("post_attention_layernorm.weight"), DT_BF16, h);
        add_norm(tl, g, NM("mlp_res_norm.weight"), DT_BF16, h);
        add_matrix(tl, g, NM("mlp_res_proj.weight"), 1, h, 1.5);
        if (!is_mla_layer(c, l)) {
            add_matrix(tl, g, NM("self_attn.q_proj.weight"), P, h, 1.0);
            add_matrix(tl, g, NM("self_attn.k_proj.weight"), P, h, 1.0);
            add_matrix(tl, g, NM("self_attn.v_proj.weight"), P, h, 1.0);
            add_matrix(tl, g, NM("self_attn.g_proj.weight"), P, h, 1.0);
            add_matrix(tl, g, NM("self_attn.f_a_proj.weight"), Dk, h, 1.0);
            add_matrix(tl, g, NM("self_attn.f_b_proj.weight"), P, Dk, 0.5);
            add_matrix(tl, g, NM("self_attn.b_proj.weight"), Hk, h, 1.0);
            add_matrix(tl, g, NM("self_attn.o_proj.weight"), h, P, 1.0);
            add_normal(tl, g, NM("self_attn.q_conv1d.weight"), DT_F32, 3, P, 1, Wc, 0.0, 0.6);
            add_normal(tl, g, NM("self_attn.k_conv1d.weight"), DT_F32, 3, P, 1, Wc, 0.0, 0.6);
            add_normal(tl, g, NM("self_attn.v_conv1d.weight"), DT_F32, 3, P, 1, Wc, 0.0, 0.6);
            tensor *t = add_tensor(tl, g, NM("self_attn.A_log"), DT_F32, 1, Dk, 0, 0);
            t->init = INIT_A_LOG;
            t->extra = (long)Hk;
            add_normal(tl, g, NM("self_attn.dt_bias"), DT_F32, 1, P, 0, 0, -1.5, 0.5);
            add_norm(tl, g, NM("self_attn.o_norm.weight"), DT_F32, Dk);
        } else {
            add_matrix(tl, g, NM("self_attn.q_a_proj.weight"), Rq, h, 1.0);
            add_norm(tl, g, NM("self_attn.q_a_layernorm.weight"), DT_BF16, Rq);
            add_matrix(tl, g, NM("self_attn.q_b_proj.weight"), Hm * (dn + dr), Rq, 1.0);
            add_matrix(tl, g, NM("self_attn.kv_a_proj_with_mqa.weight"), Rkv + dr, h, 1.0);
            add_norm(tl, g, NM("self_attn.kv_a_layernorm.weight"), DT_BF16, Rkv);
            add_matrix(tl, g, NM("self_attn.kv_b_proj.weight"), Hm * (dn + dv), Rkv, 1.0);
            add_matrix(tl, g, NM("self_attn.g_proj.weight"), Hm * dv, h, 1.0);
            add_matrix(tl, g, NM("self_attn.o_proj.weight"), h, Hm * dv, 1.0);
        }
        if (!is_moe_layer(c, l)) {
            add_matrix(tl, g, NM("mlp.gate_proj.weight"), Dff, h, 2.0);
            add_matrix(tl, g, NM("mlp.up_proj.weight"), Dff, h, 6.0);
            add_matrix(tl, g, NM("mlp.down_proj.weight"), h, Dff, 1.0 / 6.0);
        } else {
            add_matrix(tl, g, NM("block_sparse_moe.gate.weight"), E, h, 1.0);
            add_normal(tl, g, NM("block_sparse_moe.gate.e_score_correction_bias"), DT_F32, 1, E,
                       0, 0, 0.0, 0.1);
            add_matrix(tl, g, NM("block_sparse_moe.routed_expert_down_proj.weight"), Lt, h, 1.0);
            add_norm(tl, g, NM("block_sparse_moe.routed_expert_norm.weight"), DT_BF16, Lt);
            add_matrix(tl, g, NM("block_sparse_moe.routed_expert_up_proj.weight"), h, Lt, 1.0);
            add_matrix(tl, g, NM("block_sparse_moe.shared_experts.gate_proj.weight"), NsI, h, 2.0);
            add_matrix(tl, g, NM("block_sparse_moe.shared_experts.up_proj.weight"), NsI, h, 6.0);
            add_matrix(tl, g, NM("block_sparse_moe.shared_experts.down_proj.weight"), h, NsI,
                       1.0 / 6.0);
            for (int64_t e = 0; e < E; e++) {
                char ep[300];
                snprintf(ep, sizeof ep, "%sblock_sparse_moe.experts.%lld.", p, (long long)e);
                snprintf(n, sizeof n, "%sw1", ep);
                add_mxfp4(tl, g, n, I, Lt, 2.0 / sqrt((double)Lt));
                snprintf(n, sizeof n, "%sw2", ep);
                add_mxfp4(tl, g, n, Lt, I, 1.0 / (6.0 * sqrt((double)I)));
                snprintf(n, sizeof n, "%sw3", ep);
                add_mxfp4(tl, g, n, I, Lt, 6.0 / sqrt((double)Lt));
            }
        }
#undef NM
    }
    long tail = (long)NL + 1;
    add_norm(tl, tail, PFX "model.norm.weight", DT_BF16, h);
    add_norm(tl, tail, PFX "model.output_attn_res_norm.weight", DT_BF16, h);
    add_matrix(tl, tail, PFX "model.output_attn_res_proj.weight", 1, h, 1.5);
    add_matrix(tl, tail, PFX "lm_head.weight", V, h, 4.0);
}

/* ----------------------------------------------------------- data writing */

#define CHUNK_BYTES (4u << 20)

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fffu + ((b >> 16) & 1u); /* round to nearest even; values are finite */
    return (uint16_t)(b >> 16);
}

static void write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, f) != n)
        die("writing %s: %s", path, strerror(errno));
}

/* Generates t's bytes chunk by chunk into buf (CHUNK_BYTES) and hands each
 * chunk to emit; the bytes do not depend on where they go.  With --from the
 * bytes are read from the source checkpoint instead (src_read_tensor). */
typedef void (*sink_fn)(void *ctx, const unsigned char *p, size_t n);

static int have_source(void);
static void src_read_tensor(const tensor *t, unsigned char *buf, sink_fn emit, void *ctx);

static void gen_tensor_data(const tensor *t, uint64_t seed, unsigned char *buf, sink_fn emit,
                            void *ctx)
{
    if (have_source()) {
        src_read_tensor(t, buf, emit, ctx);
        return;
    }
    rng r;
    rng_seed(&r, seed, t->name);
    const int es = dtype_sizes[t->dtype];
    const int64_t total = tensor_numel(t);
    const int64_t per_chunk = CHUNK_BYTES / es;
    for (int64_t done = 0; done < total;) {
        int64_t cnt = total - done < per_chunk ? total - done : per_chunk;
        switch (t->init) {
        case INIT_NORMAL:
            if (t->dtype == DT_F32) {
                float *o = (float *)buf;
                for (int64_t i = 0; i < cnt; i++)
                    o[i] = t->mean + t->sd * rng_normal(&r);
            } else if (t->dtype == DT_BF16) {
                uint16_t *o = (uint16_t *)buf;
                for (int64_t i = 0; i < cnt; i++)
                    o[i] = f32_to_bf16(t->mean + t->sd * rng_normal(&r));
            } else {
                die("internal: normal init for U8 tensor %s", t->name);
            }
            break;
        case INIT_A_LOG: {
            float *o = (float *)buf;
            for (int64_t i = 0; i < cnt; i++) {
                int64_t idx = done + i;
                o[i] = idx < t->extra ? (float)log(1.0 + 2.0 * rng_uniform(&r)) : 0.0f;
            }
            break;
        }
        case INIT_MX_PACKED:
            for (int64_t i = 0; i < cnt; i += 8) {
                uint64_t x = rng_next(&r);
                int64_t m = cnt - i < 8 ? cnt - i : 8;
                memcpy(buf + i, &x, (size_t)m); /* byte order irrelevant: uniform bytes */
            }
            break;
        case INIT_MX_SCALE:
            for (int64_t i = 0; i < cnt; i++)
                buf[i] = (unsigned char)(t->extra - 1 + (long)((rng_next(&r) >> 32) % 3u));
            break;
        default:
            die("internal: bad init kind");
        }
        emit(ctx, buf, (size_t)(cnt * es));
        done += cnt;
    }
}

typedef struct {
    FILE *f;
    const char *path;
} file_sink;

static void emit_file(void *ctx, const unsigned char *p, size_t n)
{
    file_sink *fs = ctx;
    write_all(fs->f, p, n, fs->path);
}

static void write_tensor_data(FILE *f, const char *path, const tensor *t, uint64_t seed,
                              unsigned char *buf)
{
    file_sink fs = {f, path};
    gen_tensor_data(t, seed, buf, emit_file, &fs);
}

typedef struct {
    unsigned char *p;
    size_t len, cap;
} mem_sink;

static void emit_mem(void *ctx, const unsigned char *p, size_t n)
{
    mem_sink *ms = ctx;
    if (ms->len + n > ms->cap)
        die("internal: tensor larger than its computed size");
    memcpy(ms->p + ms->len, p, n);
    ms->len += n;
}

/* All of t's bytes in a new buffer (the same bytes the shard holds). */
static unsigned char *gen_tensor_mem(const tensor *t, uint64_t seed, unsigned char *chunk)
{
    size_t nb = (size_t)tensor_bytes(t);
    mem_sink ms = {xmalloc(nb), 0, nb};
    gen_tensor_data(t, seed, chunk, emit_mem, &ms);
    if (ms.len != nb)
        die("internal: tensor %s produced %zu of %zu bytes", t->name, ms.len, nb);
    return ms.p;
}

/* ------------------------------------------------------------- file helpers */

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

#define TMP_SUFFIX ".k3gen-tmp"

typedef struct {
    FILE *f;
    char *final_path, *tmp_path;
} out_file;

static out_file out_open(const char *dir, const char *name)
{
    out_file o;
    o.final_path = path_join(dir, name);
    size_t n = strlen(o.final_path) + sizeof TMP_SUFFIX;
    o.tmp_path = xmalloc(n);
    snprintf(o.tmp_path, n, "%s%s", o.final_path, TMP_SUFFIX);
    o.f = fopen(o.tmp_path, "wb");
    if (!o.f)
        die("cannot create %s: %s", o.tmp_path, strerror(errno));
    return o;
}

static void out_close(out_file *o)
{
    if (ferror(o->f) || fclose(o->f) != 0)
        die("writing %s failed: %s", o->tmp_path, strerror(errno));
    if (rename(o->tmp_path, o->final_path) != 0)
        die("cannot rename %s to %s: %s", o->tmp_path, o->final_path, strerror(errno));
    free(o->final_path);
    free(o->tmp_path);
}

static void write_text_file(const char *dir, const char *name, const char *text, size_t len)
{
    out_file o = out_open(dir, name);
    write_all(o.f, text, len, o.tmp_path);
    out_close(&o);
}

static void mkdir_p(const char *path)
{
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                die("cannot create directory %s: %s", p, strerror(errno));
            *s = '/';
        }
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
        die("cannot create directory %s: %s", p, strerror(errno));
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        die("%s exists and is not a directory", p);
    free(p);
}

static int is_our_file(const char *name)
{
    static const char *fixed[] = {"config.json", "model.safetensors.index.json",
                                  "tiktoken.model", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(name, fixed[i]))
            return 1;
    size_t n = strlen(name);
    if (n > strlen(TMP_SUFFIX) && !strcmp(name + n - strlen(TMP_SUFFIX), TMP_SUFFIX))
        return 1;
    /* model-NNNNN-of-NNNNNN.safetensors */
    const char *pat = "model-#####-of-######.safetensors";
    if (n != strlen(pat))
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (pat[i] == '#' ? (name[i] < '0' || name[i] > '9') : name[i] != pat[i])
            return 0;
    }
    return 1;
}

/* Create dir; refuse a non-empty one unless force, in which case stale files
 * this tool writes (shards, index, config, tokenizer, temporaries) are removed. */
static void prepare_out_dir(const char *dir, int force)
{
    mkdir_p(dir);
    DIR *d = opendir(dir);
    if (!d)
        die("cannot open directory %s: %s", dir, strerror(errno));
    struct dirent *de;
    int nonempty = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        nonempty = 1;
        if (force && is_our_file(de->d_name)) {
            char *p = path_join(dir, de->d_name);
            if (unlink(p) != 0)
                die("cannot remove stale %s: %s", p, strerror(errno));
            free(p);
        }
    }
    closedir(d);
    if (nonempty && !force)
        die("output directory %s exists and is not empty (use --force to overwrite)", dir);
}

/* ------------------------------------------------ --from: source checkpoint */
/*
 * --from DIR takes every tensor's bytes from an existing safetensors
 * checkpoint instead of the random generator; the roster (names, dtypes,
 * shapes) still comes from the preset and --set, and each roster tensor
 * must be in DIR with exactly that dtype and shape.  The shards are found
 * through DIR/model.safetensors.index.json ("weight_map": name -> shard
 * file) or, without an index, by reading the header of every
 * DIR/NAME.safetensors.  A shard is 8 bytes of little-endian header length,
 * that many bytes of JSON {"name": {"dtype": "BF16", "shape": [..],
 * "data_offsets": [begin, end]}, "__metadata__": {..}}, then the data; the
 * offsets are relative to the data and are checked against the file size.
 * The JSON is parsed properly (escapes decoded, keys compared whole).
 */

typedef struct {
    const char *start, *p, *end;
    const char *what; /* the file, for messages */
} jcur;

static void jdie(const jcur *j, const char *msg)
{
    die("%s: malformed JSON at byte %zu: %s", j->what, (size_t)(j->p - j->start), msg);
}

static int j_peek(jcur *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

static void j_expect(jcur *j, char c)
{
    if (j_peek(j) != (unsigned char)c) {
        char m[32];
        snprintf(m, sizeof m, "expected '%c'", c);
        jdie(j, m);
    }
    j->p++;
}

/* After an object's or array's opening bracket: 1 if another element
 * follows (its separating comma consumed), 0 at the closing bracket. */
static int j_more(jcur *j, char close, int *first)
{
    int c = j_peek(j);
    if (c == (unsigned char)close) {
        j->p++;
        return 0;
    }
    if (!*first) {
        if (c != ',')
            jdie(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        j->p++;
    }
    *first = 0;
    return 1;
}

static uint32_t j_hex4(jcur *j)
{
    if (j->end - j->p < 4)
        jdie(j, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *j->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            jdie(j, "bad hex digit in \\u escape");
    }
    return v;
}

/* A JSON string, decoded to a new NUL-terminated UTF-8 string. */
static char *j_string(jcur *j)
{
    j_expect(j, '"');
    sbuf sb = {0};
    sb_reserve(&sb, 0);
    for (;;) {
        if (j->p >= j->end)
            jdie(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"')
            break;
        if (c < 0x20)
            jdie(j, "control character in a string");
        if (c != '\\') {
            sb_addn(&sb, (const char *)&c, 1);
            continue;
        }
        if (j->p >= j->end)
            jdie(j, "unterminated string");
        c = (unsigned char)*j->p++;
        const char *e = NULL;
        switch (c) {
        case '"': e = "\""; break;
        case '\\': e = "\\"; break;
        case '/': e = "/"; break;
        case 'b': e = "\b"; break;
        case 'f': e = "\f"; break;
        case 'n': e = "\n"; break;
        case 'r': e = "\r"; break;
        case 't': e = "\t"; break;
        case 'u': break;
        default: jdie(j, "bad escape in a string");
        }
        if (e) {
            sb_add(&sb, e);
            continue;
        }
        uint32_t cp = j_hex4(j);
        if (cp >= 0xDC00 && cp < 0xE000)
            jdie(j, "lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp < 0xDC00) {
            if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                jdie(j, "high surrogate without its low half");
            j->p += 2;
            uint32_t lo = j_hex4(j);
            if (lo < 0xDC00 || lo >= 0xE000)
                jdie(j, "high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0)
            jdie(j, "\\u0000 in a string");
        unsigned char u[4];
        int n;
        if (cp < 0x80) {
            u[0] = (unsigned char)cp;
            n = 1;
        } else if (cp < 0x800) {
            u[0] = (unsigned char)(0xC0 | cp >> 6);
            u[1] = (unsigned char)(0x80 | (cp & 63));
            n = 2;
        } else if (cp < 0x10000) {
            u[0] = (unsigned char)(0xE0 | cp >> 12);
            u[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
            u[2] = (unsigned char)(0x80 | (cp & 63));
            n = 3;
        } else {
            u[0] = (unsigned char)(0xF0 | cp >> 18);
            u[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
            u[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
            u[3] = (unsigned char)(0x80 | (cp & 63));
            n = 4;
        }
        sb_addn(&sb, (const char *)u, (size_t)n);
    }
    return sb.buf;
}

/* A non-negative JSON integer (no sign, fraction or exponent). */
static uint64_t j_uint(jcur *j)
{
    int c = j_peek(j);
    if (c < '0' || c > '9')
        jdie(j, "expected a non-negative integer");
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p - '0');
        if (v > (UINT64_MAX - d) / 10)
            jdie(j, "integer too large");
        v = v * 10 + d;
        j->p++;
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        jdie(j, "expected an integer");
    return v;
}

/* Skips any JSON value. */
static void j_skip(jcur *j, int depth)
{
    if (depth > 64)
        jdie(j, "nested too deeply");
    int c = j_peek(j), first = 1;
    if (c == '{') {
        j->p++;
        while (j_more(j, '}', &first)) {
            free(j_string(j));
            j_expect(j, ':');
            j_skip(j, depth + 1);
        }
    } else if (c == '[') {
        j->p++;
        while (j_more(j, ']', &first))
            j_skip(j, depth + 1);
    } else if (c == '"') {
        free(j_string(j));
    } else if (c == 't' || c == 'f' || c == 'n') {
        const char *lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(lit);
        if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n))
            jdie(j, "bad literal");
        j->p += n;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        const char *s = j->p;
        while (j->p < j->end && *j->p && strchr("+-0123456789.eE", *j->p))
            j->p++;
        if (j->p == s + (c == '-'))
            jdie(j, "bad number");
    } else {
        jdie(j, "expected a value");
    }
}

static void j_finish(jcur *j)
{
    if (j_peek(j) != -1)
        jdie(j, "trailing data after the top-level object");
}

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

static src_ckpt *g_src; /* set by --from */

static int have_source(void) { return g_src != NULL; }

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const src_entry *)a)->name, ((const src_entry *)b)->name);
}

static const src_entry *src_find(const src_shard *sh, const char *name)
{
    size_t lo = 0, hi = sh->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(sh->e[mid].name, name);
        if (!c)
            return &sh->e[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Reads exactly n bytes at off; dies naming what on a short read. */
static void pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                       const char *what)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            die("%s: reading %s: %s", path, what, strerror(errno));
        if (r == 0)
            die("%s: reading %s: unexpected end of file (truncated?)", path, what);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
}

/* Opens DIR/file and parses its header; returns its index (opened once). */
static size_t src_shard_open(src_ckpt *sc, const char *file)
{
    for (size_t i = 0; i < sc->n; i++)
        if (!strcmp(sc->s[i].file, file))
            return i;
    if (!*file || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
        die("--from %s: shard name '%s' is not a file name in that directory", sc->dir, file);
    if (sc->n == sc->cap) {
        sc->cap = sc->cap ? 2 * sc->cap : 16;
        sc->s = xrealloc(sc->s, sc->cap * sizeof *sc->s);
    }
    src_shard *sh = &sc->s[sc->n];
    memset(sh, 0, sizeof *sh);
    sh->file = xstrdup(file);
    sh->path = path_join(sc->dir, file);
    sh->fd = open(sh->path, O_RDONLY);
    if (sh->fd < 0)
        die("--from: cannot open %s: %s", sh->path, strerror(errno));
    struct stat st;
    if (fstat(sh->fd, &st) != 0 || !S_ISREG(st.st_mode))
        die("--from: %s is not a regular file", sh->path);
    sh->size = (uint64_t)st.st_size;
    if (sh->size < 8)
        die("%s: %llu bytes, too short for a safetensors header", sh->path,
            (unsigned long long)sh->size);
    unsigned char len8[8];
    pread_full(sh->fd, len8, 8, 0, sh->path, "the header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    if (hlen > sh->size - 8)
        die("%s: header length %llu runs past the end of the file (%llu bytes)", sh->path,
            (unsigned long long)hlen, (unsigned long long)sh->size);
    if (hlen > (256u << 20))
        die("%s: header length %llu is implausibly large", sh->path, (unsigned long long)hlen);
    char *hdr = xmalloc((size_t)hlen);
    pread_full(sh->fd, hdr, (size_t)hlen, 8, sh->path, "the header");
    const uint64_t data0 = 8 + hlen, data_bytes = sh->size - data0;
    jcur j = {hdr, hdr, hdr + hlen, sh->path};
    size_t cap = 0;
    int first = 1;
    j_expect(&j, '{');
    while (j_more(&j, '}', &first)) {
        char *name = j_string(&j);
        j_expect(&j, ':');
        if (!strcmp(name, "__metadata__")) {
            j_skip(&j, 0);
            free(name);
            continue;
        }
        src_entry e = {name, NULL, -1, {0}, 0, 0};
        int have_off = 0, f2 = 1;
        j_expect(&j, '{');
        while (j_more(&j, '}', &f2)) {
            char *key = j_string(&j);
            j_expect(&j, ':');
            if (!strcmp(key, "dtype")) {
                free(e.dtype);
                e.dtype = j_string(&j);
            } else if (!strcmp(key, "shape")) {
                int f3 = 1;
                e.ndim = 0;
                j_expect(&j, '[');
                while (j_more(&j, ']', &f3)) {
                    uint64_t d = j_uint(&j);
                    if (d > (uint64_t)INT64_MAX)
                        jdie(&j, "dimension too large");
                    if (e.ndim < SRC_MAX_DIMS)
                        e.shape[e.ndim] = (int64_t)d;
                    if (++e.ndim > 64)
                        jdie(&j, "too many dimensions");
                }
            } else if (!strcmp(key, "data_offsets")) {
                int f3 = 1, k = 0;
                uint64_t o[2] = {0, 0};
                j_expect(&j, '[');
                while (j_more(&j, ']', &f3)) {
                    if (k == 2)
                        jdie(&j, "data_offsets has more than two entries");
                    o[k++] = j_uint(&j);
                }
                if (k != 2)
                    jdie(&j, "data_offsets needs two entries");
                if (o[0] > o[1] || o[1] > data_bytes)
                    die("%s: tensor %s: data_offsets [%llu, %llu] are not within the %llu data "
                        "bytes after the header", sh->path, name, (unsigned long long)o[0],
                        (unsigned long long)o[1], (unsigned long long)data_bytes);
                e.begin = data0 + o[0];
                e.end = data0 + o[1];
                have_off = 1;
            } else {
                j_skip(&j, 0);
            }
            free(key);
        }
        if (!e.dtype || e.ndim < 0 || !have_off)
            die("%s: tensor %s lacks %s in the header", sh->path, name,
                !e.dtype ? "\"dtype\"" : e.ndim < 0 ? "\"shape\"" : "\"data_offsets\"");
        if (sh->n == cap) {
            cap = cap ? 2 * cap : 256;
            sh->e = xrealloc(sh->e, cap * sizeof *sh->e);
        }
        sh->e[sh->n++] = e;
    }
    j_finish(&j);
    free(hdr);
    if (sh->n)
        qsort(sh->e, sh->n, sizeof *sh->e, cmp_entry);
    for (size_t i = 1; i < sh->n; i++)
        if (!strcmp(sh->e[i - 1].name, sh->e[i].name))
            die("%s: tensor %s appears twice in the header", sh->path, sh->e[i].name);
    return sc->n++;
}

typedef struct {
    char *name, *file;
} wm_entry;

static int cmp_wm(const void *a, const void *b)
{
    return strcmp(((const wm_entry *)a)->name, ((const wm_entry *)b)->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "weight_map" of DIR/model.safetensors.index.json, sorted by name. */
static wm_entry *read_weight_map(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("--from: cannot open %s: %s", path, strerror(errno));
    sbuf sb = {0};
    char buf[65536];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
        sb_addn(&sb, buf, r);
        if (sb.len > (1u << 30))
            die("%s: larger than 1 GiB; not an index", path);
    }
    if (ferror(f))
        die("reading %s: %s", path, strerror(errno));
    fclose(f);
    sb_reserve(&sb, 0);
    jcur j = {sb.buf, sb.buf, sb.buf + sb.len, path};
    wm_entry *wm = NULL;
    size_t n = 0, cap = 0;
    int first = 1, found = 0;
    j_expect(&j, '{');
    while (j_more(&j, '}', &first)) {
        char *key = j_string(&j);
        j_expect(&j, ':');
        if (!strcmp(key, "weight_map")) {
            if (found)
                die("%s: \"weight_map\" appears twice", path);
            found = 1;
            int f2 = 1;
            j_expect(&j, '{');
            while (j_more(&j, '}', &f2)) {
                if (n == cap) {
                    cap = cap ? 2 * cap : 1024;
                    wm = xrealloc(wm, cap * sizeof *wm);
                }
                wm[n].name = j_string(&j);
                j_expect(&j, ':');
                wm[n].file = j_string(&j);
                n++;
            }
        } else {
            j_skip(&j, 0);
        }
        free(key);
    }
    j_finish(&j);
    free(sb.buf);
    if (!found)
        die("%s has no \"weight_map\"", path);
    if (n)
        qsort(wm, n, sizeof *wm, cmp_wm);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(wm[i - 1].name, wm[i].name))
            die("%s: tensor %s appears twice in \"weight_map\"", path, wm[i].name);
    *n_out = n;
    return wm;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t len = 0;
    len += (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && d < SRC_MAX_DIMS && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (ndim > SRC_MAX_DIMS && len < n)
        len += (size_t)snprintf(buf + len, n - len, ", ...");
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* Roster tensor t against DIR's entry: same dtype, shape and byte count. */
static void src_check(const src_ckpt *sc, const src_shard *sh, const src_entry *e, const tensor *t)
{
    char want[160], got[160];
    shape_str(want, sizeof want, t->ndim, t->shape);
    shape_str(got, sizeof got, e->ndim, e->shape);
    int same = e->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = e->shape[d] == t->shape[d];
    if (strcmp(e->dtype, dtype_names[t->dtype]) || !same)
        die("--from %s: tensor %s is %s %s in %s, but the preset/--set shape needs %s %s "
            "(%s)", sc->dir, t->name, e->dtype, got, sh->file, dtype_names[t->dtype], want,
            strcmp(e->dtype, dtype_names[t->dtype]) ? "dtype mismatch" : "shape mismatch");
    if (e->end - e->begin != tensor_bytes(t))
        die("--from %s: tensor %s in %s has %llu data bytes, but %s %s is %llu bytes", sc->dir,
            t->name, sh->file, (unsigned long long)(e->end - e->begin), e->dtype, got,
            (unsigned long long)tensor_bytes(t));
}

/* Opens DIR, finds every roster tensor there and checks it; dies naming the
 * first tensor that is missing or differs, and refuses a DIR with further
 * language_model.* tensors (the shape options would then not describe it). */
static void src_open(src_ckpt *sc, const char *dir, tensor_list *tl)
{
    memset(sc, 0, sizeof *sc);
    sc->dir = dir;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        die("--from %s: not a directory", dir);
    char **roster = xmalloc(tl->n * sizeof *roster);
    for (size_t i = 0; i < tl->n; i++)
        roster[i] = tl->t[i].name;
    qsort(roster, tl->n, sizeof *roster, cmp_str);
    size_t extra = 0;
    char *first_extra = NULL;
    char *index = path_join(dir, "model.safetensors.index.json");
    if (stat(index, &st) == 0) {
        size_t nwm;
        wm_entry *wm = read_weight_map(index, &nwm);
        for (size_t i = 0; i < tl->n; i++) {
            tensor *t = &tl->t[i];
            wm_entry key = {t->name, NULL};
            const wm_entry *w = nwm ? bsearch(&key, wm, nwm, sizeof *wm, cmp_wm) : NULL;
            if (!w)
                die("--from %s: tensor %s is not in %s (\"weight_map\")", dir, t->name, index);
            size_t s = src_shard_open(sc, w->file);
            const src_entry *e = src_find(&sc->s[s], t->name);
            if (!e)
                die("--from %s: tensor %s: the index names %s, whose header lacks it", dir,
                    t->name, sc->s[s].file);
            src_check(sc, &sc->s[s], e, t);
            t->src_shard = (int)s;
            t->src_off = e->begin;
        }
        for (size_t i = 0; i < nwm; i++) {
            if (!strncmp(wm[i].name, PFX, strlen(PFX)) &&
                !bsearch(&wm[i].name, roster, tl->n, sizeof *roster, cmp_str) && !extra++)
                first_extra = xstrdup(wm[i].name);
            free(wm[i].name);
            free(wm[i].file);
        }
        free(wm);
    } else {
        if (errno != ENOENT)
            die("--from: cannot stat %s: %s", index, strerror(errno));
        DIR *d = opendir(dir);
        if (!d)
            die("--from: cannot open directory %s: %s", dir, strerror(errno));
        char **files = NULL;
        size_t nf = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t l = strlen(de->d_name);
            if (de->d_name[0] != '.' && l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                files = xrealloc(files, (nf + 1) * sizeof *files);
                files[nf++] = xstrdup(de->d_name);
            }
        }
        closedir(d);
        if (!nf)
            die("--from %s: neither model.safetensors.index.json nor any *.safetensors file", dir);
        qsort(files, nf, sizeof *files, cmp_str);
        for (size_t i = 0; i < nf; i++) {
            src_shard_open(sc, files[i]);
            free(files[i]);
        }
        free(files);
        for (size_t i = 0; i < tl->n; i++) {
            tensor *t = &tl->t[i];
            const src_entry *e = NULL;
            size_t at = 0;
            for (size_t s = 0; s < sc->n; s++) {
                const src_entry *x = src_find(&sc->s[s], t->name);
                if (x && e)
                    die("--from %s: tensor %s is in both %s and %s", dir, t->name,
                        sc->s[at].file, sc->s[s].file);
                if (x) {
                    e = x;
                    at = s;
                }
            }
            if (!e)
                die("--from %s: tensor %s is in none of its %zu *.safetensors files", dir,
                    t->name, sc->n);
            src_check(sc, &sc->s[at], e, t);
            t->src_shard = (int)at;
            t->src_off = e->begin;
        }
        for (size_t s = 0; s < sc->n; s++)
            for (size_t i = 0; i < sc->s[s].n; i++) {
                const char *nm = sc->s[s].e[i].name;
                if (!strncmp(nm, PFX, strlen(PFX)) &&
                    !bsearch(&nm, roster, tl->n, sizeof *roster, cmp_str) && !extra++)
                    first_extra = xstrdup(nm);
            }
    }
    if (extra)
        die("--from %s: %zu language_model tensor%s (first: %s) %s not part of the model the "
            "preset/--set options describe; pick options matching DIR's config.json", dir,
            extra, extra == 1 ? "" : "s", first_extra, extra == 1 ? "is" : "are");
    free(index);
    free(roster);
}

static void src_close(src_ckpt *sc)
{
    for (size_t s = 0; s < sc->n; s++) {
        src_shard *sh = &sc->s[s];
        close(sh->fd);
        for (size_t i = 0; i < sh->n; i++) {
            free(sh->e[i].name);
            free(sh->e[i].dtype);
        }
        free(sh->e);
        free(sh->file);
        free(sh->path);
    }
    free(sc->s);
}

static void src_read_tensor(const tensor *t, unsigned char *buf, sink_fn emit, void *ctx)
{
    const src_shard *sh = &g_src->s[t->src_shard];
    uint64_t left = tensor_bytes(t), off = t->src_off;
    while (left) {
        size_t n = left < CHUNK_BYTES ? (size_t)left : CHUNK_BYTES;
        pread_full(sh->fd, buf, n, off, sh->path, t->name);
        emit(ctx, buf, n);
        off += n;
        left -= n;
    }
}

/* ----------------------------------------------------------- shards/index */

static int cmp_in_shard(const void *a, const void *b)
{
    const tensor *x = *(const tensor *const *)a, *y = *(const tensor *const *)b;
    if (x->dtype != y->dtype)
        return x->dtype - y->dtype;
    return strcmp(x->name, y->name);
}

static int cmp_by_name(const void *a, const void *b)
{
    const tensor *x = *(const tensor *const *)a, *y = *(const tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Assign tensors to shards; returns the number of shards. */
static int assign_shards(const model_cfg *c, tensor_list *tl, int shards, long shard_max_mb)
{
    const long ngroups = c->num_hidden_layers + 2;
    uint64_t *gbytes = calloc((size_t)ngroups, sizeof *gbytes);
    int *gshard = calloc((size_t)ngroups, sizeof *gshard);
    if (!gbytes || !gshard)
        die("out of memory");
    for (size_t i = 0; i < tl->n; i++)
        gbytes[tl->t[i].group] += tensor_bytes(&tl->t[i]);
    int nshards;
    if (shards > 0) {
        long NL = c->num_hidden_layers;
        if (shards > NL)
            die("--shards %d exceeds the number of layers (%ld); a layer never spans shards",
                shards, NL);
        /* the first NL % shards shards get one extra layer (13 / 3 -> 5, 4, 4 as k3-tiny-a) */
        long base = NL / shards, extra = NL % shards, l = 0;
        for (int s = 0; s < shards; s++) {
            long cnt = base + (s < extra ? 1 : 0);
            for (long k = 0; k < cnt; k++, l++)
                gshard[1 + l] = s;
        }
        gshard[0] = 0;
        gshard[ngroups - 1] = shards - 1;
        nshards = shards;
    } else {
        uint64_t max = (uint64_t)shard_max_mb << 20, cur = 0;
        int s = 0;
        for (long g = 0; g < ngroups; g++) {
            if (gbytes[g] > max && g > 0 && g < ngroups - 1)
                fprintf(stderr, "k3gen: note: layer %ld alone is %.1f MiB, over --shard-max-mb %ld; "
                        "it gets a shard of its own\n", g - 1, (double)gbytes[g] / (1 << 20), shard_max_mb);
            if (cur > 0 && cur + gbytes[g] > max) {
                s++;
                cur = 0;
            }
            gshard[g] = s;
            cur += gbytes[g];
        }
        nshards = s + 1;
    }
    for (size_t i = 0; i < tl->n; i++)
        tl->t[i].shard = gshard[tl->t[i].group];
    free(gbytes);
    free(gshard);
    return nshards;
}

static void shard_name(char *buf, size_t n, int idx, int total)
{
    snprintf(buf, n, "model-%05d-of-%06d.safetensors", idx + 1, total);
}

/* Writes every shard; returns the total data bytes. */
static uint64_t write_shards(const char *dir, tensor_list *tl, int nshards, uint64_t seed,
                             int dry_run)
{
    tensor **order = xmalloc(tl->n * sizeof *order);
    unsigned char *buf = dry_run ? NULL : xmalloc(CHUNK_BYTES);
    uint64_t total = 0;
    for (int s = 0; s < nshards; s++) {
        size_t cnt = 0;
        for (size_t i = 0; i < tl->n; i++)
            if (tl->t[i].shard == s)
                order[cnt++] = &tl->t[i];
        if (cnt == 0)
            die("internal: shard %d is empty", s + 1);
        qsort(order, cnt, sizeof *order, cmp_in_shard);
        sbuf hdr = {0};
        uint64_t off = 0;
        sb_add(&hdr, "{");
        for (size_t i = 0; i < cnt; i++) {
            tensor *t = order[i];
            t->offset = off;
            uint64_t nb = tensor_bytes(t);
            sb_json_str(&hdr, t->name);
            sb_printf(&hdr, ":{\"dtype\":\"%s\",\"shape\":[", dtype_names[t->dtype]);
            for (int d = 0; d < t->ndim; d++)
                sb_printf(&hdr, "%s%lld", d ? "," : "", (long long)t->shape[d]);
            sb_printf(&hdr, "],\"data_offsets\":[%llu,%llu]},", (unsigned long long)off,
                      (unsigned long long)(off + nb));
            off += nb;
        }
        sb_add(&hdr, "\"__metadata__\":{\"format\":\"pt\"}}");
        while (hdr.len % 8)
            sb_add(&hdr, " ");
        total += off;
        if (!dry_run) {
            char name[64];
            shard_name(name, sizeof name, s, nshards);
            out_file o = out_open(dir, name);
            unsigned char len8[8];
            for (int i = 0; i < 8; i++)
                len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
            write_all(o.f, len8, 8, o.tmp_path);
            write_all(o.f, hdr.buf, hdr.len, o.tmp_path);
            for (size_t i = 0; i < cnt; i++)
                write_tensor_data(o.f, o.tmp_path, order[i], seed, buf);
            out_close(&o);
        }
        free(hdr.buf);
    }
    free(order);
    free(buf);
    return total;
}

static void write_index(const char *dir, tensor_list *tl, int nshards, uint64_t total)
{
    tensor **order = xmalloc(tl->n * sizeof *order);
    for (size_t i = 0; i < tl->n; i++)
        order[i] = &tl->t[i];
    qsort(order, tl->n, sizeof *order, cmp_by_name);
    sbuf sb = {0};
    sb_printf(&sb, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
              (unsigned long long)total);
    for (size_t i = 0; i < tl->n; i++) {
        char name[64];
        shard_name(name, sizeof name, order[i]->shard, nshards);
        sb_add(&sb, "    ");
        sb_json_str(&sb, order[i]->name);
        sb_add(&sb, ": ");
        sb_json_str(&sb, name);
        sb_add(&sb, i + 1 < tl->n ? ",\n" : "\n");
    }
    sb_add(&sb, "  }\n}");
    write_text_file(dir, "model.safetensors.index.json", sb.buf, sb.len);
    free(sb.buf);
    free(order);
}

/* ------------------------------------------------------------- config.json */

static void json_int_list(sbuf *sb, const char *indent, const long *v, long n)
{
    if (n == 0) {
        sb_add(sb, "[]");
        return;
    }
    sb_add(sb, "[\n");
    for (long i = 0; i < n; i++)
        sb_printf(sb, "%s  %ld%s\n", indent, v[i], i + 1 < n ? "," : "");
    sb_printf(sb, "%s]", indent);
}

static void write_config(const char *dir, const model_cfg *c)
{
    const long V = c->vocab_size, bos = V - 256, eos = V - 254, pad = V - 1, media = V - 256 + 21;
    sbuf sb = {0};
    sb_printf(&sb,
              "{\n"
              "  \"architectures\": [\n"
              "    \"KimiK3ForConditionalGeneration\"\n"
              "  ],\n"
              "  \"model_type\": \"kimi_k3\",\n"
              "  \"dtype\": \"bfloat16\",\n"
              "  \"bos_token_id\": %ld,\n"
              "  \"eos_token_id\": %ld,\n"
              "  \"pad_token_id\": %ld,\n"
              "  \"media_placeholder_token_id\": %ld,\n"
              "  \"tie_word_embeddings\": false,\n"
              "  \"text_config\": {\n"
              "    \"model_type\": \"kimi_linear\",\n"
              "    \"architectures\": [\n"
              "      \"KimiLinearForCausalLM\"\n"
              "    ],\n"
              "    \"dtype\": \"bfloat16\",\n"
              "    \"vocab_size\": %ld,\n"
              "    \"bos_token_id\": %ld,\n"
              "    \"eos_token_id\": %ld,\n"
              "    \"pad_token_id\": %ld,\n"
              "    \"hidden_size\": %ld,\n"
              "    \"intermediate_size\": %ld,\n"
              "    \"num_hidden_layers\": %ld,\n"
              "    \"num_attention_heads\": %ld,\n"
              "    \"num_key_value_heads\": %ld,\n"
              "    \"hidden_act\": \"situ\",\n"
              "    \"activation_situ_beta\": 4.0,\n"
              "    \"activation_situ_linear_beta\": 25.0,\n"
              "    \"rms_norm_eps\": 1e-05,\n"
              "    \"max_position_embeddings\": 1048576,\n"
              "    \"tie_word_embeddings\": false,\n"
              "    \"use_cache\": true,\n"
              "    \"attn_res_block_size\": %ld,\n"
              "    \"q_lora_rank\": %ld,\n"
              "    \"kv_lora_rank\": %ld,\n"
              "    \"qk_nope_head_dim\": %ld,\n"
              "    \"qk_rope_head_dim\": %ld,\n"
              "    \"v_head_dim\": %ld,\n"
              "    \"mla_use_nope\": true,\n"
              "    \"mla_use_output_gate\": true,\n"
              "    \"first_k_dense_replace\": %ld,\n"
              "    \"moe_layer_freq\": %ld,\n"
              "    \"num_experts\": %ld,\n"
              "    \"num_experts_per_token\": %ld,\n"
              "    \"num_shared_experts\": %ld,\n"
              "    \"moe_intermediate_size\": %ld,\n"
              "    \"routed_expert_hidden_size\": %ld,\n"
              "    \"latent_moe_use_norm\": true,\n"
              "    \"moe_router_activation_func\": \"sigmoid\",\n"
              "    \"moe_renormalize\": true,\n"
              "    \"routed_scaling_factor\": 1.0,\n"
              "    \"topk_method\": \"noaux_tc\",\n"
              "    \"use_grouped_topk\": true,\n"
              "    \"num_expert_group\": 1,\n"
              "    \"topk_group\": 1,\n"
              "    \"num_nextn_predict_layers\": 0,\n"
              "    \"linear_attn_config\": {\n"
              "      \"kda_layers\": ",
              bos, eos, pad, media, V, bos, eos, pad, c->hidden_size, c->intermediate_size,
              c->num_hidden_layers, c->num_attention_heads, c->num_attention_heads,
              c->attn_res_block_size, c->q_lora_rank, c->kv_lora_rank, c->qk_nope_head_dim,
              c->qk_rope_head_dim, c->v_head_dim, c->first_k_dense_replace, c->moe_layer_freq,
              c->num_experts, c->num_experts_per_token, c->num_shared_experts,
              c->moe_intermediate_size, c->routed_expert_hidden_size);
    long NL = c->num_hidden_layers, nk = 0, nm = 0;
    long *kda = xmalloc((size_t)NL * sizeof *kda), *mla = xmalloc((size_t)NL * sizeof *mla);
    for (long l = 0; l < NL; l++) {
        if (is_mla_layer(c, l))
            mla[nm++] = l + 1;
        else
            kda[nk++] = l + 1;
    }
    json_int_list(&sb, "      ", kda, nk);
    sb_add(&sb, ",\n      \"full_attn_layers\": ");
    json_int_list(&sb, "      ", mla, nm);
    free(kda);
    free(mla);
    sb_printf(&sb,
              ",\n"
              "      \"num_heads\": %ld,\n"
              "      \"head_dim\": %ld,\n"
              "      \"short_conv_kernel_size\": %ld,\n"
              "      \"use_full_rank_gate\": true,\n"
              "      \"gate_lower_bound\": -5.0\n"
              "    },\n",
              c->kda_heads, c->kda_head_dim, c->short_conv_kernel_size);
    sb_add(&sb,
           "    \"quantization_config\": {\n"
           "      \"quant_method\": \"compressed-tensors\",\n"
           "      \"format\": \"mxfp4-pack-quantized\",\n"
           "      \"quantization_status\": \"compressed\",\n"
           "      \"global_compression_ratio\": null,\n"
           "      \"kv_cache_scheme\": null,\n"
           "      \"config_groups\": {\n"
           "        \"group_0\": {\n"
           "          \"format\": \"mxfp4-pack-quantized\",\n"
           "          \"targets\": [\n"
           "            \"Linear\"\n"
           "          ],\n"
           "          \"input_activations\": null,\n"
           "          \"output_activations\": null,\n"
           "          \"weights\": {\n"
           "            \"num_bits\": 4,\n"
           "            \"type\": \"float\",\n"
           "            \"symmetric\": true,\n"
           "            \"group_size\": 32,\n"
           "            \"strategy\": \"group\",\n"
           "            \"dynamic\": false,\n"
           "            \"observer\": \"minmax\",\n"
           "            \"observer_kwargs\": {},\n"
           "            \"scale_dtype\": \"torch.uint8\",\n"
           "            \"zp_dtype\": null,\n"
           "            \"actorder\": null,\n"
           "            \"block_structure\": null\n"
           "          }\n"
           "        }\n"
           "      },\n"
           "      \"ignore\": [\n"
           "        \"re:.*self_attn.*\",\n"
           "        \"re:.*shared_experts.*\",\n"
           "        \"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\",\n"
           "        \"re:.*lm_head.*\",\n"
           "        \"re:.*vision_tower.*\",\n"
           "        \"re:.*mm_projector.*\"\n"
           "      ]\n"
           "    }\n"
           "  }\n"
           "}");
    write_text_file(dir, "config.json", sb.buf, sb.len);
    free(sb.buf);
}

/* ---------------------------------------------------------------- tokenizer */

typedef struct {
    unsigned char *data;
    size_t data_len, data_cap;
    size_t *off;
    int *len;
    int n, cap;
    int *ht; /* open addressing over ids, -1 = empty */
    size_t ht_cap;
} vocab;

static uint64_t bytes_hash(const unsigned char *p, int n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

static const unsigned char *vocab_bytes(const vocab *v, int id) { return v->data + v->off[id]; }

static int vocab_find(const vocab *v, const unsigned char *p, int n)
{
    size_t mask = v->ht_cap - 1, i = bytes_hash(p, n) & mask;
    for (;; i = (i + 1) & mask) {
        int id = v->ht[i];
        if (id < 0)
            return -1;
        if (v->len[id] == n && !memcmp(vocab_bytes(v, id), p, (size_t)n))
            return id;
    }
}

static int vocab_add(vocab *v, const unsigned char *p, int n)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 1024;
        v->off = xrealloc(v->off, (size_t)v->cap * sizeof *v->off);
        v->len = xrealloc(v->len, (size_t)v->cap * sizeof *v->len);
    }
    if ((size_t)(v->n + 1) * 2 > v->ht_cap) {
        size_t cap = v->ht_cap ? v->ht_cap * 2 : 4096;
        free(v->ht);
        v->ht = xmalloc(cap * sizeof *v->ht);
        v->ht_cap = cap;
        memset(v->ht, 0xff, cap * sizeof *v->ht);
        for (int id = 0; id < v->n; id++) {
            size_t i = bytes_hash(vocab_bytes(v, id), v->len[id]) & (cap - 1);
            while (v->ht[i] >= 0)
                i = (i + 1) & (cap - 1);
            v->ht[i] = id;
        }
    }
    if (v->data_len + (size_t)n > v->data_cap) {
        v->data_cap = (v->data_cap ? v->data_cap : 65536);
        while (v->data_len + (size_t)n > v->data_cap)
            v->data_cap *= 2;
        v->data = xrealloc(v->data, v->data_cap);
    }
    memcpy(v->data + v->data_len, p, (size_t)n);
    int id = v->n++;
    v->off[id] = v->data_len;
    v->len[id] = n;
    v->data_len += (size_t)n;
    size_t i = bytes_hash(p, n) & (v->ht_cap - 1);
    while (v->ht[i] >= 0)
        i = (i + 1) & (v->ht_cap - 1);
    v->ht[i] = id;
    return id;
}

/* id of the concatenation of tokens a and b, or -1 */
static int vocab_find_pair(const vocab *v, int a, int b, unsigned char *scratch)
{
    memcpy(scratch, vocab_bytes(v, a), (size_t)v->len[a]);
    memcpy(scratch + v->len[a], vocab_bytes(v, b), (size_t)v->len[b]);
    return vocab_find(v, scratch, v->len[a] + v->len[b]);
}

/* tiktoken semantics: repeatedly merge the adjacent pair whose concatenation
 * has the lowest rank (leftmost on ties). Returns the token count. */
static int bpe_encode(const vocab *v, const unsigned char *p, int n, int *out,
                      unsigned char *scratch)
{
    for (int i = 0; i < n; i++)
        out[i] = vocab_find(v, p + i, 1);
    int m = n;
    for (;;) {
        int best = -1, best_id = -1;
        for (int i = 0; i + 1 < m; i++) {
            int id = vocab_find_pair(v, out[i], out[i + 1], scratch);
            if (id >= 0 && (best_id < 0 || id < best_id)) {
                best_id = id;
                best = i;
            }
        }
        if (best < 0)
            return m;
        out[best] = best_id;
        memmove(out + best + 1, out + best + 2, (size_t)(m - best - 2) * sizeof *out);
        m--;
    }
}

typedef struct {
    int *toks;
    int n;
    long count;
} bpe_word;

typedef struct {
    bpe_word *w;
    int n, cap;
} word_set;

/* Each piece becomes a word (merged with an existing identical one). */
typedef struct {
    unsigned char **s;
    int *len;
    long *count;
    int n, cap;
    int *ht;
    size_t ht_cap;
} piece_map;

static void piece_add(piece_map *pm, const unsigned char *p, int n, long count)
{
    if ((size_t)(pm->n + 1) * 2 > pm->ht_cap) {
        size_t cap = pm->ht_cap ? pm->ht_cap * 2 : 1024;
        free(pm->ht);
        pm->ht = xmalloc(cap * sizeof *pm->ht);
        memset(pm->ht, 0xff, cap * sizeof *pm->ht);
        pm->ht_cap = cap;
        for (int k = 0; k < pm->n; k++) {
            size_t i = bytes_hash(pm->s[k], pm->len[k]) & (cap - 1);
            while (pm->ht[i] >= 0)
                i = (i + 1) & (cap - 1);
            pm->ht[i] = k;
        }
    }
    size_t mask = pm->ht_cap - 1, i = bytes_hash(p, n) & mask;
    for (;; i = (i + 1) & mask) {
        int k = pm->ht[i];
        if (k < 0)
            break;
        if (pm->len[k] == n && !memcmp(pm->s[k], p, (size_t)n)) {
            pm->count[k] += count;
            return;
        }
    }
    if (pm->n == pm->cap) {
        pm->cap = pm->cap ? pm->cap * 2 : 1024;
        pm->s = xrealloc(pm->s, (size_t)pm->cap * sizeof *pm->s);
        pm->len = xrealloc(pm->len, (size_t)pm->cap * sizeof *pm->len);
        pm->count = xrealloc(pm->count, (size_t)pm->cap * sizeof *pm->count);
    }
    pm->s[pm->n] = xmalloc((size_t)n);
    memcpy(pm->s[pm->n], p, (size_t)n);
    pm->len[pm->n] = n;
    pm->count[pm->n] = count;
    pm->ht[i] = pm->n++;
}

/* Character classes of the simplified pre-tokenizer. */
enum { C_LET, C_HAN, C_DIG, C_SP, C_NL, C_PUN };

static int cp_class(uint32_t cp)
{
    if (cp < 0x80) {
        if ((unsigned)((cp | 32) - 'a') < 26u)
            return C_LET;
        if ((unsigned)(cp - '0') < 10u)
            return C_DIG;
        if (cp == '\n' || cp == '\r')
            return C_NL;
        if (cp == ' ' || (cp >= '\t' && cp <= '\r'))
            return C_SP;
        return C_PUN;
    }
    if ((cp >= 0x80 && cp <= 0xbf) || cp == 0xd7 || cp == 0xf7 || (cp >= 0x2000 && cp <= 0x206f) ||
        (cp >= 0x3000 && cp <= 0x303f) || (cp >= 0xff00 && cp <= 0xff0f) ||
        (cp >= 0xff1a && cp <= 0xff20) || (cp >= 0xff3b && cp <= 0xff40) ||
        (cp >= 0xff5b && cp <= 0xff65))
        return C_PUN;
    if ((cp >= 0x3400 && cp <= 0x4dbf) || (cp >= 0x4e00 && cp <= 0x9fff) ||
        (cp >= 0xf900 && cp <= 0xfaff))
        return C_HAN;
    return C_LET;
}

/* Decode one UTF-8 code point at s (n bytes left); invalid bytes decode as
 * themselves (class punctuation) with length 1. */
static int utf8_decode(const unsigned char *s, int n, uint32_t *cp)
{
    int k = s[0] < 0x80 ? 0 : (s[0] & 0xe0) == 0xc0 ? 1 : (s[0] & 0xf0) == 0xe0 ? 2
                                                     : (s[0] & 0xf8) == 0xf0 ? 3 : -1;
    if (k < 0 || k >= n) {
        *cp = k == 0 ? s[0] : 0x80; /* 0x80 classifies as punctuation */
        return 1;
    }
    uint32_t v = k == 0 ? s[0] : (uint32_t)(s[0] & (0x3f >> k));
    for (int j = 1; j <= k; j++) {
        if ((s[j] & 0xc0) != 0x80) {
            *cp = 0x80;
            return 1;
        }
        v = (v << 6) | (s[j] & 0x3fu);
    }
    *cp = v;
    return k + 1;
}

/* Simplified K3 pre-tokenizer over code points: Han runs; [x]letters (x any
 * single non-letter non-digit non-newline char); digits{1,3}; [ ]punct+[\r\n]*;
 * \s*[\r\n]+; space runs (leaving the last one to start the next piece). */
static void split_text(piece_map *pm, const char *text, long weight, int skip_digits)
{
    const unsigned char *s = (const unsigned char *)text;
    int n = (int)strlen(text), m = 0;
    int *pos = xmalloc((size_t)(n + 1) * sizeof *pos), *cls = xmalloc((size_t)(n + 1) * sizeof *cls);
    for (int i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_decode(s + i, n - i, &cp);
        pos[m] = i;
        cls[m++] = cp_class(cp);
        i += l;
    }
    pos[m] = n;
    cls[m] = -1;
    for (int i = 0; i < m;) {
        int j = i + 1, c = cls[i];
        if (c == C_LET || c == C_HAN) {
            while (j < m && cls[j] == c)
                j++;
        } else if (c != C_DIG && c != C_NL && cls[i + 1] == C_LET) {
            while (j < m && cls[j] == C_LET)
                j++;
        } else if (c == C_DIG) {
            while (j < m && j - i < 3 && cls[j] == C_DIG)
                j++;
        } else if (c == C_PUN || (s[pos[i]] == ' ' && cls[i + 1] == C_PUN)) {
            while (j < m && cls[j] == C_PUN)
                j++;
            while (j < m && cls[j] == C_NL)
                j++;
        } else { /* whitespace */
            while (j < m && (cls[j] == C_SP || cls[j] == C_NL))
                j++;
            int last_nl = -1;
            for (int k = i; k < j; k++)
                if (cls[k] == C_NL)
                    last_nl = k;
            if (last_nl >= 0)
                j = last_nl + 1;
            else if (j < m && j - i > 1)
                j--;
        }
        if (!(skip_digits && c == C_DIG))
            piece_add(pm, s + pos[i], pos[j] - pos[i], weight);
        i = j;
    }
    free(pos);
    free(cls);
}

/* Built-in training corpus: English, code, numbers, CJK, XTML chat renders. */
static const char *const corpus[] = {
    "The quick brown fox jumps over the lazy dog. The lazy dog sleeps in the sun, and the "
    "quick fox runs into the forest. Every morning the model reads a message, thinks about "
    "the question, and writes a response for the user.\n\n",
    "A tokenizer splits text into tokens. Byte-level BPE starts from the 256 single bytes "
    "and repeatedly merges the most frequent adjacent pair. The merged pair becomes a new "
    "token with the next rank, so common words such as the, and, of, to, in, is, it and "
    "that end up as single tokens, while rare words are split into several pieces.\n\n",
    "Mixture-of-experts models route every token to a small number of experts. The router "
    "computes a score for each expert, selects the top experts, and mixes their outputs. "
    "Linear attention keeps a recurrent state instead of a growing cache, which makes long "
    "context cheap. Kimi uses delta-rule attention with a gated decay, and a few full "
    "attention layers with latent keys and values.\n\n",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness. There were a king with a large jaw and a queen with a plain "
    "face, on the throne of England. In both countries it was clearer than crystal to the "
    "lords of the State preserves of loaves and fishes, that things in general were settled "
    "for ever.\n\n",
    "Please summarize the following document in three sentences. What is the capital of "
    "France? The capital of France is Paris. How many legs does a spider have? A spider has "
    "eight legs. Can you help me write a function that sorts a list of numbers? Sure, here "
    "is a simple example that you can adapt to your needs.\n\n",
    "Hello, world! Hello again, world. I'm sure it's fine; we'll see what they've done, and "
    "you'd know if I'd said it. Don't worry: it isn't broken, it's just slow.\n",
    "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n    for (int i = 0; i < argc; "
    "i++)\n        printf(\"%d: %s\\n\", i, argv[i]);\n    return 0;\n}\n\n",
    "static float dot(const float *a, const float *b, size_t n)\n{\n    float s = 0.0f;\n"
    "    for (size_t i = 0; i < n; i++)\n        s += a[i] * b[i];\n    return s;\n}\n\n",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\n\nclass Tokenizer:\n    def __init__(self, path):\n        self.ranks = "
    "load(path)\n\n    def encode(self, text):\n        return [self.ranks[t] for t in "
    "split(text)]\n\n",
    "import json\nwith open(\"config.json\") as f:\n    config = json.load(f)\nprint(config["
    "\"hidden_size\"], config[\"num_hidden_layers\"])\n\n",
    "for (let i = 0; i < items.length; i++) { console.log(items[i].name, items[i].value); "
    "}\nconst result = await fetch(url, { method: \"POST\", body: JSON.stringify(data) });\n\n",
    "The year 2024 had 366 days. Pi is about 3.14159265358979, and e is about "
    "2.718281828. The population grew from 1,234,567 to 7,654,321 between 1990 and 2020. "
    "Call 555-0123 before 10:30 on 12/31/2025. The answer is 42, not 41 or 43. Version "
    "1.2.3 fixed 17 bugs; 100% of tests pass in 0.25 seconds.\n",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 100 128 256 512 1000 1024 2048 4096 "
    "8192 16384 32768 65536 1000000\n\n",
    "今天天气很好，我们一起去公园散步吧。机器学习模型可以理解自然语言。"
    "人工智能正在改变世界。中国的首都是北京。\n\n",
    "こんにちは、世界。東京は日本の首都です。私は毎朝コーヒーを飲みます。"
    "ありがとうございます。\n\n",
    "Voilà un café très élégant à côté de la gare. Über die Brücke gehen wir schnell. "
    "El niño está en la playa. Привет, мир!\n\n",
    "message role=\"system\" type=\"thinking-effort\"\nmessage role=\"user\"\nmessage "
    "role=\"assistant\"\nthink\nresponse\nmessage role=\"tool\" tool=\"get_weather\" "
    "index=\"1\"\ntools\ncall tool=\"get_weather\" index=\"1\"\nargument key=\"city\" "
    "type=\"string\"\nargument key=\"days\" type=\"number\"\njson type=\"object\"\n\n",
    "message role=\"system\" type=\"tool-declare\"\n# Tools\nHere are the available tools, "
    "described in JSONSchema.\n\n```json\n{\"name\":\"get_weather\",\"parameters\":"
    "{\"properties\":{\"city\":{\"type\":\"string\"}},\"type\":\"object\"}}\n```\n\n",
    "`thinking_effort` guides on how much to think in your thinking channel (not including "
    "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=max`.\n\n",
    "message role=\"user\"\nWhat is the weather in Paris today?\nmessage role=\"assistant\"\n"
    "think\nThe user wants the weather, so I should call the tool.\nresponse\nLet me check "
    "the weather for you.\ntools\ncall tool=\"get_weather\" index=\"1\"\nargument "
    "key=\"city\" type=\"string\"\nParis\nmessage role=\"tool\" tool=\"get_weather\" "
    "index=\"1\"\n{\"temperature\": 18, \"sky\": \"cloudy\"}\nmessage role=\"assistant\"\n"
    "response\nIt is 18 degrees and cloudy in Paris.\n\n",
};

/* Forms that must each end up as a single token (phase 1 of training). */
static const char *const xtml_words[] = {
    "message", "role", "system", "user", "assistant", "think", "response", "tool",
    "tools", "call", "argument", "type", " role", " type", " tool",
};
#define N_XTML (sizeof xtml_words / sizeof xtml_words[0])

/* Pair-count table, cleared via the list of used slots. */
typedef struct {
    uint64_t *key;
    long *cnt;
    size_t cap;
    size_t *used;
    size_t nused;
} pair_table;

static void pair_table_init(pair_table *pt, size_t min_cap)
{
    size_t cap = 1024;
    while (cap < min_cap * 2)
        cap *= 2;
    pt->cap = cap;
    pt->key = xmalloc(cap * sizeof *pt->key);
    pt->cnt = xmalloc(cap * sizeof *pt->cnt);
    pt->used = xmalloc(cap * sizeof *pt->used);
    memset(pt->key, 0xff, cap * sizeof *pt->key);
    pt->nused = 0;
}

static void pair_table_free(pair_table *pt)
{
    free(pt->key);
    free(pt->cnt);
    free(pt->used);
}

static void pair_table_clear(pair_table *pt)
{
    for (size_t k = 0; k < pt->nused; k++)
        pt->key[pt->used[k]] = UINT64_MAX;
    pt->nused = 0;
}

static void pair_table_addc(pair_table *pt, uint64_t key, long c)
{
    size_t mask = pt->cap - 1, i = (size_t)((key * 0x9e3779b97f4a7c15ULL) >> 20) & mask;
    for (;; i = (i + 1) & mask) {
        if (pt->key[i] == key) {
            pt->cnt[i] += c;
            return;
        }
        if (pt->key[i] == UINT64_MAX) {
            pt->key[i] = key;
            pt->cnt[i] = c;
            pt->used[pt->nused++] = i;
            return;
        }
    }
}

/* Train merges on the words of pm until no pair is left (returns 1) or the
 * vocabulary holds `target` tokens (returns 0). */
static int bpe_train(vocab *v, const piece_map *pm, int target, unsigned char *scratch)
{
    int total_syms = 0, maxlen = 1;
    for (int k = 0; k < pm->n; k++) {
        total_syms += pm->len[k];
        if (pm->len[k] > maxlen)
            maxlen = pm->len[k];
    }
    bpe_word *w = xmalloc((size_t)pm->n * sizeof *w);
    int *store = xmalloc((size_t)total_syms * sizeof *store);
    for (int k = 0, pos = 0; k < pm->n; k++) {
        w[k].toks = store + pos;
        w[k].n = bpe_encode(v, pm->s[k], pm->len[k], w[k].toks, scratch);
        w[k].count = pm->count[k];
        pos += pm->len[k];
    }
    pair_table pt;
    pair_table_init(&pt, (size_t)total_syms + 16);
    int exhausted = 0;
    while (v->n < target) {
        pair_table_clear(&pt);
        for (int k = 0; k < pm->n; k++)
            for (int i = 0; i + 1 < w[k].n; i++)
                pair_table_addc(&pt, ((uint64_t)w[k].toks[i] << 32) | (uint32_t)w[k].toks[i + 1],
                                w[k].count);
        if (pt.nused == 0) {
            exhausted = 1;
            break;
        }
        uint64_t best = UINT64_MAX;
        long best_cnt = 0;
        for (size_t k = 0; k < pt.nused; k++) {
            size_t i = pt.used[k];
            if (pt.cnt[i] > best_cnt || (pt.cnt[i] == best_cnt && pt.key[i] < best)) {
                best = pt.key[i];
                best_cnt = pt.cnt[i];
            }
        }
        int a = (int)(best >> 32), b = (int)(best & 0xffffffffu);
        int c = vocab_find_pair(v, a, b, scratch);
        if (c < 0)
            c = vocab_add(v, scratch, v->len[a] + v->len[b]);
        for (int k = 0; k < pm->n; k++) {
            int *t = w[k].toks, m = 0;
            for (int i = 0; i < w[k].n; i++) {
                if (i + 1 < w[k].n && t[i] == a && t[i + 1] == b) {
                    t[m++] = c;
                    i++;
                } else {
                    t[m++] = t[i];
                }
            }
            w[k].n = m;
        }
    }
    pair_table_free(&pt);
    free(store);
    free(w);
    return exhausted;
}

static void piece_map_free(piece_map *pm)
{
    for (int k = 0; k < pm->n; k++)
        free(pm->s[k]);
    free(pm->s);
    free(pm->len);
    free(pm->count);
    free(pm->ht);
    memset(pm, 0, sizeof *pm);
}

/* 1: token is [A-Za-z]+, 2: token is ' '[A-Za-z]+, 0: anything else */
static int word_token_kind(const unsigned char *p, int n)
{
    int start = p[0] == ' ' ? 1 : 0;
    if (n <= start)
        return 0;
    for (int i = start; i < n; i++)
        if ((unsigned)((p[i] | 32) - 'a') >= 26u)
            return 0;
    return start ? 2 : 1;
}

/* --tokenizer-corpus FILE: phase 2 trains on FILE instead of the built-in
 * corpus.  The file is pre-tokenized a paragraph at a time (cut after a blank
 * line that is followed by a non-space character, so no piece spans a cut).
 * Digit runs are left out of training: digits stay single-byte tokens, so
 * numbers are spelled digit by digit (what arithmetic wants). */
static const char *g_tok_corpus;

static void split_corpus_file(piece_map *pm, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("--tokenizer-corpus %s: %s", path, strerror(errno));
    sbuf sb = {0};
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        sb_addn(&sb, buf, n);
    if (ferror(f))
        die("--tokenizer-corpus %s: read error", path);
    fclose(f);
    sb_addn(&sb, "", 1); /* NUL terminator */
    char *p = sb.buf, *end = sb.buf + sb.len - 1;
    long n_par = 0;
    while (p < end) {
        char *q = p;
        for (;;) {
            q = strstr(q, "\n\n");
            if (!q || q + 2 >= end || (q[2] != ' ' && q[2] != '\n' && q[2] != '\r' && q[2] != '\t'))
                break;
            q++;
        }
        char *cut = q ? q + 2 : end, save = *cut;
        *cut = 0;
        split_text(pm, p, 1, 1);
        *cut = save;
        p = cut;
        n_par++;
    }
    fprintf(stderr, "k3gen: tokenizer corpus %s: %zu bytes, %ld paragraphs, %d distinct pieces\n", path,
            sb.len - 1, n_par, pm->n);
    free(sb.buf);
}

static void build_vocab(vocab *v, long vocab_size)
{
    const int target = (int)(vocab_size - 256);
    unsigned char *scratch = xmalloc(1 << 16);
    /* ranks 0..255: single bytes in GPT-2 order */
    for (int b = 0x21; b <= 0x7e; b++)
        vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    for (int b = 0xa1; b <= 0xac; b++)
        vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    for (int b = 0xae; b <= 0xff; b++)
        vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    for (int b = 0; b <= 0xff; b++)
        if (vocab_find(v, (unsigned char[]){(unsigned char)b}, 1) < 0)
            vocab_add(v, (unsigned char[]){(unsigned char)b}, 1);
    if (v->n != 256)
        die("internal: byte alphabet has %d entries", v->n);

    /* phase 1: XTML words, so they are single tokens even in tiny vocabularies */
    piece_map pm = {0};
    for (size_t i = 0; i < N_XTML; i++)
        piece_add(&pm, (const unsigned char *)xtml_words[i], (int)strlen(xtml_words[i]), 1);
    int xtml_done = bpe_train(v, &pm, target, scratch);
    piece_map_free(&pm);

    /* phase 2: the corpus */
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++)
        if (!g_tok_corpus)
            split_text(&pm, corpus[i], 1, 0);
    if (g_tok_corpus)
        split_corpus_file(&pm, g_tok_corpus);
    bpe_train(v, &pm, target, scratch);
    piece_map_free(&pm);

    /* phase 3: filler tokens = concatenation of an existing token matching
     * ` ?[A-Za-z]+` and one matching `[A-Za-z]+` (so the pre-tokenizer can
     * produce them), never duplicating a string */
    int *pool = xmalloc((size_t)target * sizeof *pool), npool = 0;
    int *tail = xmalloc((size_t)target * sizeof *tail), ntail = 0;
    for (int id = 0; id < v->n; id++) {
        int kind = word_token_kind(vocab_bytes(v, id), v->len[id]);
        if (kind)
            pool[npool++] = id;
        if (kind == 1)
            tail[ntail++] = id;
    }
    rng r;
    rng_seed(&r, 0x6b3367656e746f6bULL, "filler");
    int maxlen = 12, fails = 0;
    while (v->n < target) {
        int a = pool[rng_next(&r) % (uint64_t)npool];
        int b = tail[rng_next(&r) % (uint64_t)ntail];
        int n = v->len[a] + v->len[b];
        if (n > maxlen || vocab_find_pair(v, a, b, scratch) >= 0) {
            if (++fails > 10000) {
                maxlen += 4;
                fails = 0;
            }
            continue;
        }
        fails = 0;
        int id = vocab_add(v, scratch, n);
        pool[npool++] = id;
        if (scratch[0] != ' ')
            tail[ntail++] = id;
    }
    free(pool);
    free(tail);

    /* invariant: every XTML form encodes to exactly one token (when the
     * vocabulary has room for the ~50 merges that takes) */
    int ids[64];
    if (!xtml_done)
        fprintf(stderr, "k3gen: note: vocab_size %ld leaves only %ld BPE merges; the XTML "
                        "words are not single tokens\n", vocab_size, vocab_size - 512);
    for (size_t i = 0; xtml_done && i < N_XTML; i++) {
        const char *wd = xtml_words[i];
        int m = bpe_encode(v, (const unsigned char *)wd, (int)strlen(wd), ids, scratch);
        if (m != 1)
            die("internal: XTML word \"%s\" encodes to %d tokens", wd, m);
    }
    free(scratch);
}

static void b64_append(sbuf *sb, const unsigned char *p, int n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char o[4];
    for (int i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            x |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            x |= p[i + 2];
        o[0] = tab[(x >> 18) & 63];
        o[1] = tab[(x >> 12) & 63];
        o[2] = i + 1 < n ? tab[(x >> 6) & 63] : '=';
        o[3] = i + 2 < n ? tab[x & 63] : '=';
        sb_addn(sb, o, 4);
    }
}

/* Spellings of the reserved ids, by offset from V-256 (as in K3 / k3-tiny-a). */
static const struct {
    int off;
    const char *spelling;
} special_tokens[] = {
    {0, "[BOS]"},           {1, "[EOS]"},           {2, "<|end_of_msg|>"},
    {3, "<|open|>"},        {4, "<|close|>"},       {5, "<|sep|>"},
    {6, "[start_header_id]"}, {7, "[end_header_id]"}, {9, "[EOT]"},
    {18, "<|media_begin|>"}, {19, "<|media_content|>"}, {20, "<|media_end|>"},
    {21, "<|media_pad|>"},  {65, "<osagent_mode>"}, {254, "[UNK]"},
    {255, "[PAD]"},
};

static int write_tokenizer(const char *dir, long V)
{
    vocab v = {0};
    build_vocab(&v, V);
    sbuf sb = {0};
    for (int id = 0; id < v.n; id++) {
        b64_append(&sb, vocab_bytes(&v, id), v.len[id]);
        sb_printf(&sb, " %d\n", id);
    }
    write_text_file(dir, "tiktoken.model", sb.buf, sb.len);
    sb.len = 0;

    sb_add(&sb, "{\n  \"added_tokens_decoder\": {\n");
    for (int off = 0; off < 256; off++) {
        long id = V - 256 + off;
        char spelling[64];
        snprintf(spelling, sizeof spelling, "<|reserved_token_%ld|>", id);
        for (size_t k = 0; k < sizeof special_tokens / sizeof special_tokens[0]; k++)
            if (special_tokens[k].off == off)
                snprintf(spelling, sizeof spelling, "%s", special_tokens[k].spelling);
        sb_printf(&sb, "    \"%ld\": {\n      \"content\": ", id);
        sb_json_str(&sb, spelling);
        sb_printf(&sb,
                  ",\n      \"lstrip\": false,\n      \"normalized\": false,\n"
                  "      \"rstrip\": false,\n      \"single_word\": false,\n"
                  "      \"special\": true\n    }%s\n",
                  off < 255 ? "," : "");
    }
    sb_add(&sb, "  },\n"
                "  \"bos_token\": \"[BOS]\",\n"
                "  \"eos_token\": \"[EOS]\",\n"
                "  \"pad_token\": \"[PAD]\",\n"
                "  \"unk_token\": \"[UNK]\",\n"
                "  \"clean_up_tokenization_spaces\": false,\n"
                "  \"model_max_length\": 1048576,\n"
                "  \"tokenizer_class\": \"TikTokenTokenizer\"\n"
                "}");
    write_text_file(dir, "tokenizer_config.json", sb.buf, sb.len);
    free(sb.buf);
    int n = v.n;
    free(v.data);
    free(v.off);
    free(v.len);
    free(v.ht);
    return n;
}

/* -------------------------------------------------------------------- GGUF */
/*
 * --gguf FILE writes the same model as one GGUF v3 file in llama.cpp's
 * "kimi-k3" layout, for running llama.cpp as an oracle.  What the names,
 * keys and transforms follow (facts gathered from llama.cpp-family sources:
 * the kimi-k3 loader `llama_model_kimi_k3::load_arch_hparams/tensors`,
 * kimi-linear's tensor table, sglang's Kimi-K3 GGUF mapping tests and a
 * reader of kimi-k3.* keys; nothing copied):
 *  - dims are written ne[0]-first, i.e. the safetensors shape reversed; a
 *    Linear [out, in] becomes ne = {in, out} with the same bytes.
 *  - routed experts: one 3-D tensor per projection and layer,
 *    blk.N.ffn_{gate,up}_exps.weight ne = {Lt, I, E} (w1, w3) and
 *    blk.N.ffn_down_exps.weight ne = {I, Lt, E} (w2), as ggml MXFP4 blocks
 *    (E8M0 byte, then 16 bytes: value j low nibble, value j+16 high nibble),
 *    repacked exactly from compressed-tensors' packed/scale pair.
 *  - AttnRes: llama.cpp keeps one vector per mix, attn_res_score /
 *    ffn_res_score / output_res_score = res_norm * res_proj elementwise (the
 *    RMSNorm weight folded into the projection).  A product of two BF16
 *    values is exact in F32, so these are stored F32 and lose nothing.
 *  - KDA A_log: stored as blk.N.ssm_a (no .weight suffix), 1-D [Hk], holding
 *    -exp(A_log[h]) computed in double and rounded once to F32 (sglang's
 *    reader inverts exactly this transform).  Only the first Hk entries of
 *    K3's [Dk] A_log are used (k3-architecture.md 5.4).
 *  - 1-D tensors are F32 (llama.cpp's converter writes norms and biases as
 *    F32); BF16 source values upcast exactly.  2-D BF16 stays BF16.
 *    --gguf-f32 writes every tensor as F32 (MXFP4 dequantized exactly:
 *    e2m1 * 2^(s-127), exact for every scale byte s <= 252; the generator
 *    uses 101..149, and a --from source with a larger one is refused).
 *  - MLA kv_b is written split, as llama.cpp's converter does:
 *    blk.N.attn_k_b.weight ne {dn, Rkv, H} (each head's key rows transposed)
 *    and blk.N.attn_v_b.weight ne {Rkv, dv, H}.  llama.cpp v0.4.0's loader
 *    also accepts a fused attn_kv_b but its kimi-k3 graph then dereferences
 *    a null attention input and crashes, so the split pair is the only
 *    layout it runs.  MLA is stored as MQA: head_count_kv is a per-layer
 *    array, 0 for KDA layers and 1 for MLA.
 *  - --from DIR --gguf FILE converts an existing safetensors checkpoint
 *    instead: the same roster, mapping and transforms, but each tensor's
 *    bytes are read from DIR's shards (see "--from: source checkpoint";
 *    gen_tensor_data reads instead of generating), and no safetensors are
 *    written.  The preset/--set options must describe DIR: every roster
 *    tensor must be there with the same dtype and shape, and DIR may hold
 *    no other language_model.* tensor.  The metadata still comes from
 *    those options and the tokenizer from vocab_size (k3gen's own, not
 *    DIR's tiktoken.model), so the GGUF matches DIR for token ids, not
 *    text.  Of the generated model, --from gives the --gguf file byte for
 *    byte.
 * Uncertain (to be settled against the pinned llama.cpp by the oracle work):
 *  - the exact per-tensor dtypes llama.cpp's converter picks (F32 vs BF16
 *    for 2-D router / routed_down/up tensors) - values are exact either way.
 *  - attention.head_count: the loader sizes KDA from the layer-0 head count,
 *    so presets with kda_heads != num_attention_heads (tiny) get a
 *    per-layer array that llama.cpp may not accept for KDA; the oracle needs
 *    kda_heads == num_attention_heads.
 *  - attention.key_length/value_length (written kv_lora + rope / kv_lora, the
 *    MQA form) and the tokenizer keys (gpt2 byte-level tokens, merges
 *    recovered by rank-limited BPE, pre "kimi-k2").
 *  - moe_layer_freq != 1 cannot be expressed (llama.cpp: layers below
 *    leading_dense_block_count are dense, all others MoE) and is refused.
 */

enum { GG_F32 = 0, GG_BF16 = 30, GG_MXFP4 = 39 };
enum { GK_COPY, GK_SCORE, GK_NEG_EXP, GK_EXPS, GK_KB, GK_VB };
#define GG_ALIGN 32u

typedef struct {
    char name[64];
    int type, nd, kind;
    int64_t ne[4];
    const tensor *a, *b;   /* sources (b: the projection for GK_SCORE) */
    const tensor **exps;   /* GK_EXPS: [E][2] packed, scale */
    int64_t take;          /* GK_NEG_EXP: leading elements used */
    int64_t H, dn, dv, Rkv;/* GK_KB / GK_VB: kv_b split per head */
    uint64_t offset, nbytes;
} gg_tensor;

typedef struct {
    gg_tensor *t;
    size_t n, cap;
    tensor **sorted; /* the safetensors roster by name */
    size_t n_sorted;
    int f32;
} gg_list;

static const tensor *gg_src(const gg_list *g, const char *name)
{
    size_t lo = 0, hi = g->n_sorted;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(g->sorted[mid]->name, name);
        if (!c)
            return g->sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    die("internal: GGUF mapping needs %s, which is not in the roster", name);
    return NULL;
}

static gg_tensor *gg_new(gg_list *g, const char *name, int kind)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 256;
        g->t = xrealloc(g->t, g->cap * sizeof *g->t);
    }
    gg_tensor *t = &g->t[g->n++];
    memset(t, 0, sizeof *t);
    if (strlen(name) >= sizeof t->name)
        die("internal: GGUF tensor name %s is too long", name);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->ne[0] = t->ne[1] = t->ne[2] = t->ne[3] = 1;
    return t;
}

/* Same values, dims reversed. */
static void gg_copy(gg_list *g, const char *gname, const char *hf)
{
    gg_tensor *t = gg_new(g, gname, GK_COPY);
    t->a = gg_src(g, hf);
    t->nd = t->a->ndim;
    for (int d = 0; d < t->nd; d++)
        t->ne[d] = t->a->shape[t->nd - 1 - d];
    if (g->f32 || t->a->dtype == DT_F32 || t->nd == 1)
        t->type = GG_F32;
    else if (t->a->dtype == DT_BF16)
        t->type = GG_BF16;
    else
        die("internal: %s is not BF16/F32", hf);
}

static void gg_score(gg_list *g, const char *gname, const char *norm, const char *proj)
{
    gg_tensor *t = gg_new(g, gname, GK_SCORE);
    t->a = gg_src(g, norm);
    t->b = gg_src(g, proj);
    t->type = GG_F32;
    t->nd = 1;
    t->ne[0] = t->a->shape[0];
}

/* kv_b [H*(dn+dv), Rkv] split per head as llama.cpp's converter does:
 * k_b = the dn key rows of each head transposed, ne {dn, Rkv, H};
 * v_b = the dv value rows of each head, ne {Rkv, dv, H}. */
static void gg_kvb(gg_list *g, const char *gname, const char *hf, int kind, const model_cfg *c)
{
    gg_tensor *t = gg_new(g, gname, kind);
    t->a = gg_src(g, hf);
    t->H = c->num_attention_heads;
    t->dn = c->qk_nope_head_dim;
    t->dv = c->v_head_dim;
    t->Rkv = c->kv_lora_rank;
    t->nd = 3;
    t->ne[0] = kind == GK_KB ? t->dn : t->Rkv;
    t->ne[1] = kind == GK_KB ? t->Rkv : t->dv;
    t->ne[2] = t->H;
    if (g->f32 || t->a->dtype == DT_F32)
        t->type = GG_F32;
    else
        t->type = GG_BF16;
}

static void gg_exps(gg_list *g, const char *gname, const char *layer_pfx, const char *proj,
                    long E)
{
    gg_tensor *t = gg_new(g, gname, GK_EXPS);
    t->exps = xmalloc((size_t)E * 2 * sizeof *t->exps);
    char n[512];
    for (long e = 0; e < E; e++) {
        snprintf(n, sizeof n, "%sblock_sparse_moe.experts.%ld.%s.weight_packed", layer_pfx, e, proj);
        t->exps[2 * e] = gg_src(g, n);
        snprintf(n, sizeof n, "%sblock_sparse_moe.experts.%ld.%s.weight_scale", layer_pfx, e, proj);
        t->exps[2 * e + 1] = gg_src(g, n);
    }
    const tensor *p0 = t->exps[0];
    t->type = g->f32 ? GG_F32 : GG_MXFP4;
    t->nd = 3;
    t->ne[0] = p0->shape[1] * 2; /* columns (input dim) */
    t->ne[1] = p0->shape[0];     /* rows (output dim) */
    t->ne[2] = E;
}

static uint64_t gg_bytes(const gg_tensor *t)
{
    uint64_t n = (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
    switch (t->type) {
    case GG_F32:
        return 4 * n;
    case GG_BF16:
        return 2 * n;
    default:
        return n / 32 * 17;
    }
}

static void gg_roster(const model_cfg *c, tensor_list *tl, gg_list *g)
{
    g->sorted = xmalloc(tl->n * sizeof *g->sorted);
    for (size_t i = 0; i < tl->n; i++)
        g->sorted[i] = &tl->t[i];
    qsort(g->sorted, tl->n, sizeof *g->sorted, cmp_by_name);
    g->n_sorted = tl->n;
    char gn[64], hf[512], p[128], hf2[512];
#define HF(s) (snprintf(hf, sizeof hf, "%s%s", p, s), hf)
#define HF2(s) (snprintf(hf2, sizeof hf2, "%s%s", p, s), hf2)
#define GN(s) (snprintf(gn, sizeof gn, "blk.%ld.%s", l, s), gn)
    gg_copy(g, "token_embd.weight", PFX "model.embed_tokens.weight");
    for (long l = 0; l < c->num_hidden_layers; l++) {
        snprintf(p, sizeof p, PFX "model.layers.%ld.", l);
        gg_copy(g, GN("attn_norm.weight"), HF("input_layernorm.weight"));
        gg_score(g, GN("attn_res_score.weight"), HF("self_attention_res_norm.weight"),
                 HF2("self_attention_res_proj.weight"));
        gg_copy(g, GN("ffn_norm.weight"), HF("post_attention_layernorm.weight"));
        gg_score(g, GN("ffn_res_score.weight"), HF("mlp_res_norm.weight"), HF2("mlp_res_proj.weight"));
        if (!is_mla_layer(c, l)) {
            gg_copy(g, GN("attn_q.weight"), HF("self_attn.q_proj.weight"));
            gg_copy(g, GN("attn_k.weight"), HF("self_attn.k_proj.weight"));
            gg_copy(g, GN("attn_v.weight"), HF("self_attn.v_proj.weight"));
            gg_copy(g, GN("ssm_g.weight"), HF("self_attn.g_proj.weight"));
            gg_copy(g, GN("ssm_f_a.weight"), HF("self_attn.f_a_proj.weight"));
            gg_copy(g, GN("ssm_f_b.weight"), HF("self_attn.f_b_proj.weight"));
            gg_copy(g, GN("ssm_beta.weight"), HF("self_attn.b_proj.weight"));
            gg_copy(g, GN("attn_output.weight"), HF("self_attn.o_proj.weight"));
            gg_copy(g, GN("ssm_conv1d_q.weight"), HF("self_attn.q_conv1d.weight"));
            gg_copy(g, GN("ssm_conv1d_k.weight"), HF("self_attn.k_conv1d.weight"));
            gg_copy(g, GN("ssm_conv1d_v.weight"), HF("self_attn.v_conv1d.weight"));
            gg_tensor *t = gg_new(g, GN("ssm_a"), GK_NEG_EXP);
            t->a = gg_src(g, HF("self_attn.A_log"));
            t->type = GG_F32;
            t->nd = 1;
            t->take = c->kda_heads;
            t->ne[0] = c->kda_heads;
            gg_copy(g, GN("ssm_dt.bias"), HF("self_attn.dt_bias"));
            gg_copy(g, GN("ssm_norm.weight"), HF("self_attn.o_norm.weight"));
        } else {
            gg_copy(g, GN("attn_q_a.weight"), HF("self_attn.q_a_proj.weight"));
            gg_copy(g, GN("attn_q_a_norm.weight"), HF("self_attn.q_a_layernorm.weight"));
            gg_copy(g, GN("attn_q_b.weight"), HF("self_attn.q_b_proj.weight"));
            gg_copy(g, GN("attn_kv_a_mqa.weight"), HF("self_attn.kv_a_proj_with_mqa.weight"));
            gg_copy(g, GN("attn_kv_a_norm.weight"), HF("self_attn.kv_a_layernorm.weight"));
            gg_kvb(g, GN("attn_k_b.weight"), HF("self_attn.kv_b_proj.weight"), GK_KB, c);
            gg_kvb(g, GN("attn_v_b.weight"), HF("self_attn.kv_b_proj.weight"), GK_VB, c);
            gg_copy(g, GN("attn_gate.weight"), HF("self_attn.g_proj.weight"));
            gg_copy(g, GN("attn_output.weight"), HF("self_attn.o_proj.weight"));
        }
        if (!is_moe_layer(c, l)) {
            gg_copy(g, GN("ffn_gate.weight"), HF("mlp.gate_proj.weight"));
            gg_copy(g, GN("ffn_up.weight"), HF("mlp.up_proj.weight"));
            gg_copy(g, GN("ffn_down.weight"), HF("mlp.down_proj.weight"));
        } else {
            gg_copy(g, GN("ffn_gate_inp.weight"), HF("block_sparse_moe.gate.weight"));
            gg_copy(g, GN("exp_probs_b.bias"), HF("block_sparse_moe.gate.e_score_correction_bias"));
            gg_copy(g, GN("ffn_routed_down.weight"), HF("block_sparse_moe.routed_expert_down_proj.weight"));
            gg_copy(g, GN("ffn_routed_norm.weight"), HF("block_sparse_moe.routed_expert_norm.weight"));
            gg_copy(g, GN("ffn_routed_up.weight"), HF("block_sparse_moe.routed_expert_up_proj.weight"));
            gg_copy(g, GN("ffn_gate_shexp.weight"), HF("block_sparse_moe.shared_experts.gate_proj.weight"));
            gg_copy(g, GN("ffn_up_shexp.weight"), HF("block_sparse_moe.shared_experts.up_proj.weight"));
            gg_copy(g, GN("ffn_down_shexp.weight"), HF("block_sparse_moe.shared_experts.down_proj.weight"));
            gg_exps(g, GN("ffn_gate_exps.weight"), p, "w1", c->num_experts);
            gg_exps(g, GN("ffn_up_exps.weight"), p, "w3", c->num_experts);
            gg_exps(g, GN("ffn_down_exps.weight"), p, "w2", c->num_experts);
        }
    }
#undef HF
#undef HF2
#undef GN
    gg_copy(g, "output_norm.weight", PFX "model.norm.weight");
    gg_score(g, "output_res_score.weight", PFX "model.output_attn_res_norm.weight",
             PFX "model.output_attn_res_proj.weight");
    gg_copy(g, "output.weight", PFX "lm_head.weight");
}

/* --- little-endian binary builders */
static void bb_u32(sbuf *b, uint32_t v)
{
    char x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (char)(v >> (8 * i));
    sb_addn(b, x, 4);
}
static void bb_u64(sbuf *b, uint64_t v)
{
    char x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (char)(v >> (8 * i));
    sb_addn(b, x, 8);
}
static void bb_str(sbuf *b, const char *s, size_t n)
{
    bb_u64(b, n);
    sb_addn(b, s, n);
}
static void bb_f32(sbuf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    bb_u32(b, u);
}

enum { KV_U32 = 4, KV_I32 = 5, KV_F32 = 6, KV_BOOL = 7, KV_STR = 8, KV_ARR = 9 };

typedef struct {
    sbuf b;
    uint64_t n;
} kvbuf;

static void kv_key(kvbuf *k, const char *key, uint32_t type)
{
    bb_str(&k->b, key, strlen(key));
    bb_u32(&k->b, type);
    k->n++;
}
static void kv_u32(kvbuf *k, const char *key, long v)
{
    kv_key(k, key, KV_U32);
    bb_u32(&k->b, (uint32_t)v);
}
static void kv_u16(kvbuf *k, const char *key, unsigned v)
{
    kv_key(k, key, 2); /* UINT16 */
    char b[2] = {(char)(v & 0xFF), (char)(v >> 8)};
    sb_addn(&k->b, b, 2);
}
static void kv_i32(kvbuf *k, const char *key, long v)
{
    kv_key(k, key, KV_I32);
    bb_u32(&k->b, (uint32_t)v);
}
static void kv_f32(kvbuf *k, const char *key, float v)
{
    kv_key(k, key, KV_F32);
    bb_f32(&k->b, v);
}
static void kv_bool(kvbuf *k, const char *key, int v)
{
    kv_key(k, key, KV_BOOL);
    char c = (char)(v != 0);
    sb_addn(&k->b, &c, 1);
}
static void kv_str(kvbuf *k, const char *key, const char *s)
{
    kv_key(k, key, KV_STR);
    bb_str(&k->b, s, strlen(s));
}
static void kv_arr_hdr(kvbuf *k, const char *key, uint32_t et, uint64_t n)
{
    kv_key(k, key, KV_ARR);
    bb_u32(&k->b, et);
    bb_u64(&k->b, n);
}

/* GPT-2 byte-level spelling of a token (what llama.cpp's BPE vocab holds). */
static void byte_level(sbuf *sb, const unsigned char *p, int n)
{
    for (int i = 0; i < n; i++) {
        unsigned c = p[i], cp;
        if ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174) {
            cp = c;
        } else { /* the k-th byte outside those ranges maps to 256 + k */
            unsigned k = c <= 32 ? c : c <= 160 ? 33 + (c - 127) : 33 + 34;
            cp = 256 + k;
        }
        char u[3];
        if (cp < 0x80) {
            u[0] = (char)cp;
            sb_addn(sb, u, 1);
        } else {
            u[0] = (char)(0xc0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3f));
            sb_addn(sb, u, 2);
        }
    }
}

/* The two tokens whose merge made `id`: BPE on its bytes using only ranks
 * below id (the tiktoken -> GPT-2 merges recovery).  0 if not a pair. */
static int merge_pair(const vocab *v, int id, int *a, int *b, int *work, unsigned char *scratch)
{
    const unsigned char *p = vocab_bytes(v, id);
    int n = v->len[id], m = n;
    if (n < 2)
        return 0;
    for (int i = 0; i < n; i++)
        work[i] = vocab_find(v, p + i, 1);
    while (m > 2) {
        int best = -1, best_id = -1;
        for (int i = 0; i + 1 < m; i++) {
            int x = vocab_find_pair(v, work[i], work[i + 1], scratch);
            if (x >= 0 && x < id && (best_id < 0 || x < best_id)) {
                best_id = x;
                best = i;
            }
        }
        if (best < 0)
            return 0;
        work[best] = best_id;
        memmove(work + best + 1, work + best + 2, (size_t)(m - best - 2) * sizeof *work);
        m--;
    }
    *a = work[0];
    *b = work[1];
    return 1;
}

static void gg_tokenizer(kvbuf *k, long V)
{
    vocab v = {0};
    build_vocab(&v, V);
    if (v.n != V - 256)
        die("internal: vocab has %d ordinary tokens, expected %ld", v.n, V - 256);
    kv_str(k, "tokenizer.ggml.model", "gpt2");
    kv_str(k, "tokenizer.ggml.pre", "kimi-k2");
    kv_arr_hdr(k, "tokenizer.ggml.tokens", KV_STR, (uint64_t)V);
    sbuf s = {0};
    for (long id = 0; id < V; id++) {
        s.len = 0;
        if (id < v.n) {
            byte_level(&s, vocab_bytes(&v, (int)id), v.len[id]);
        } else {
            long off = id - (V - 256);
            sb_printf(&s, "<|reserved_token_%ld|>", id);
            for (size_t j = 0; j < sizeof special_tokens / sizeof special_tokens[0]; j++)
                if (special_tokens[j].off == off) {
                    s.len = 0;
                    sb_add(&s, special_tokens[j].spelling);
                }
        }
        bb_str(&k->b, s.buf ? s.buf : "", s.len);
    }
    kv_arr_hdr(k, "tokenizer.ggml.token_type", KV_I32, (uint64_t)V);
    for (long id = 0; id < V; id++)
        bb_u32(&k->b, id < v.n ? 1u : 3u); /* NORMAL, CONTROL */
    int maxlen = 2;
    for (int id = 0; id < v.n; id++)
        if (v.len[id] > maxlen)
            maxlen = v.len[id];
    int *work = xmalloc((size_t)maxlen * sizeof *work);
    unsigned char *scratch = xmalloc((size_t)2 * (size_t)maxlen + 2);
    sbuf merges = {0};
    uint64_t n_merges = 0;
    for (int id = 256; id < v.n; id++) {
        int a, b;
        if (!merge_pair(&v, id, &a, &b, work, scratch))
            continue;
        s.len = 0;
        byte_level(&s, vocab_bytes(&v, a), v.len[a]);
        sb_add(&s, " ");
        byte_level(&s, vocab_bytes(&v, b), v.len[b]);
        bb_str(&merges, s.buf, s.len);
        n_merges++;
    }
    kv_arr_hdr(k, "tokenizer.ggml.merges", KV_STR, n_merges);
    if (merges.len)
        sb_addn(&k->b, merges.buf, merges.len);
    kv_u32(k, "tokenizer.ggml.bos_token_id", V - 256);
    kv_u32(k, "tokenizer.ggml.eos_token_id", V - 255);
    kv_u32(k, "tokenizer.ggml.padding_token_id", V - 1);
    kv_u32(k, "tokenizer.ggml.unknown_token_id", V - 2);
    kv_bool(k, "tokenizer.ggml.add_bos_token", 0);
    free(merges.buf);
    free(s.buf);
    free(work);
    free(scratch);
    free(v.data);
    free(v.off);
    free(v.len);
    free(v.ht);
}

static void gg_metadata(kvbuf *k, const model_cfg *c)
{
    const long NL = c->num_hidden_layers;
#define A "kimi-k3."
    kv_str(k, "general.architecture", "kimi-k3");
    kv_str(k, "general.name", "k3gen");
    kv_u32(k, "general.alignment", GG_ALIGN);
    kv_u32(k, "general.file_type", 0);
    kv_u32(k, A "vocab_size", c->vocab_size);
    kv_u32(k, A "context_length", 1048576);
    kv_u32(k, A "embedding_length", c->hidden_size);
    kv_u32(k, A "feed_forward_length", c->intermediate_size);
    kv_u32(k, A "block_count", NL);
    if (c->kda_heads == c->num_attention_heads) {
        kv_u32(k, A "attention.head_count", c->num_attention_heads);
    } else {
        kv_arr_hdr(k, A "attention.head_count", KV_U32, (uint64_t)NL);
        for (long l = 0; l < NL; l++)
            bb_u32(&k->b, (uint32_t)(is_mla_layer(c, l) ? c->num_attention_heads : c->kda_heads));
    }
    kv_arr_hdr(k, A "attention.head_count_kv", KV_U32, (uint64_t)NL);
    for (long l = 0; l < NL; l++)
        bb_u32(&k->b, is_mla_layer(c, l) ? 1u : 0u);
    kv_f32(k, A "attention.layer_norm_rms_epsilon", 1e-5f);
    kv_u32(k, A "attention.q_lora_rank", c->q_lora_rank);
    kv_u32(k, A "attention.kv_lora_rank", c->kv_lora_rank);
    kv_u32(k, A "attention.key_length", c->kv_lora_rank + c->qk_rope_head_dim);
    kv_u32(k, A "attention.value_length", c->kv_lora_rank);
    kv_u32(k, A "attention.key_length_mla", c->qk_nope_head_dim + c->qk_rope_head_dim);
    kv_u32(k, A "attention.value_length_mla", c->v_head_dim);
    kv_u32(k, A "rope.dimension_count", c->qk_rope_head_dim);
    kv_u32(k, A "ssm.conv_kernel", c->short_conv_kernel_size);
    kv_u32(k, A "kda.head_dim", c->kda_head_dim);
    kv_f32(k, A "kda.gate_lower_bound", -5.0f);
    kv_u32(k, A "leading_dense_block_count", c->first_k_dense_replace);
    kv_u32(k, A "expert_count", c->num_experts);
    kv_u32(k, A "expert_used_count", c->num_experts_per_token);
    kv_u32(k, A "expert_shared_count", c->num_shared_experts);
    kv_u32(k, A "expert_feed_forward_length", c->moe_intermediate_size);
    kv_u32(k, A "expert_latent_length", c->routed_expert_hidden_size);
    kv_f32(k, A "expert_weights_scale", 1.0f);
    kv_bool(k, A "expert_weights_norm", 1);
    kv_u32(k, A "expert_gating_func", 2); /* sigmoid */
    kv_u32(k, A "expert_group_count", 1);
    kv_u32(k, A "expert_group_used_count", 1);
    kv_u32(k, A "attn_res.block_size", c->attn_res_block_size);
    kv_f32(k, A "activation.situ_beta", 4.0f);
    kv_f32(k, A "activation.situ_linear_beta", 25.0f);
#undef A
}

/* Write the data of one GGUF tensor. */
static void gg_write_data(FILE *f, const char *path, const gg_tensor *t, uint64_t seed,
                          unsigned char *chunk)
{
    if (t->kind == GK_COPY) {
        unsigned char *src = gen_tensor_mem(t->a, seed, chunk);
        uint64_t n = (uint64_t)tensor_numel(t->a);
        if (t->type == GG_F32 && t->a->dtype == DT_BF16) {
            for (uint64_t i = 0; i < n; i++) {
                uint32_t u = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
                unsigned char o[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                                      (unsigned char)(u >> 24)};
                write_all(f, o, 4, path);
            }
        } else {
            write_all(f, src, (size_t)tensor_bytes(t->a), path);
        }
        free(src);
    } else if (t->kind == GK_SCORE) {
        unsigned char *a = gen_tensor_mem(t->a, seed, chunk), *b = gen_tensor_mem(t->b, seed, chunk);
        for (int64_t i = 0; i < t->ne[0]; i++) {
            uint32_t ua = (uint32_t)(a[2 * i] | a[2 * i + 1] << 8) << 16;
            uint32_t ub = (uint32_t)(b[2 * i] | b[2 * i + 1] << 8) << 16;
            float fa, fb;
            memcpy(&fa, &ua, 4);
            memcpy(&fb, &ub, 4);
            float r = fa * fb; /* exact: 8-bit x 8-bit significands */
            write_all(f, &r, 4, path);
        }
        free(a);
        free(b);
    } else if (t->kind == GK_KB || t->kind == GK_VB) {
        unsigned char *a = gen_tensor_mem(t->a, seed, chunk);
        size_t in_sz = t->a->dtype == DT_BF16 ? 2 : 4, out_sz = t->type == GG_F32 ? 4 : 2;
        for (int64_t hh = 0; hh < t->H; hh++) {
            int64_t rows = t->kind == GK_KB ? t->dn : t->dv;
            int64_t row0 = hh * (t->dn + t->dv) + (t->kind == GK_KB ? 0 : t->dn);
            /* element (r, j) of this head's rows; k_b is written j-major */
            int64_t n_outer = t->kind == GK_KB ? t->Rkv : rows, n_inner = t->kind == GK_KB ? rows : t->Rkv;
            for (int64_t o = 0; o < n_outer; o++)
                for (int64_t in = 0; in < n_inner; in++) {
                    int64_t r = t->kind == GK_KB ? in : o, j = t->kind == GK_KB ? o : in;
                    const unsigned char *src = a + ((size_t)(row0 + r) * (size_t)t->Rkv + (size_t)j) * in_sz;
                    unsigned char ob[4];
                    if (in_sz == out_sz) {
                        memcpy(ob, src, out_sz);
                    } else { /* BF16 -> F32, exact */
                        ob[0] = ob[1] = 0;
                        ob[2] = src[0];
                        ob[3] = src[1];
                    }
                    write_all(f, ob, out_sz, path);
                }
        }
        free(a);
    } else if (t->kind == GK_NEG_EXP) {
        unsigned char *a = gen_tensor_mem(t->a, seed, chunk);
        for (int64_t i = 0; i < t->take; i++) {
            float x;
            memcpy(&x, a + 4 * i, 4);
            float r = (float)-exp((double)x);
            write_all(f, &r, 4, path);
        }
        free(a);
    } else {
        int64_t cols = t->ne[0], rows = t->ne[1];
        size_t row_out = t->type == GG_F32 ? (size_t)cols * 4 : (size_t)cols / 32 * 17;
        unsigned char *out = xmalloc(row_out);
        for (int64_t e = 0; e < t->ne[2]; e++) {
            unsigned char *pk = gen_tensor_mem(t->exps[2 * e], seed, chunk);
            unsigned char *sc = gen_tensor_mem(t->exps[2 * e + 1], seed, chunk);
            for (int64_t r = 0; r < rows; r++) {
                const unsigned char *prow = pk + r * (cols / 2), *srow = sc + r * (cols / 32);
                for (int64_t blk = 0; blk < cols / 32; blk++) {
                    const unsigned char *q = prow + blk * 16; /* 32 codes, 2j low / 2j+1 high */
                    unsigned char codes[32];
                    for (int j = 0; j < 16; j++) {
                        codes[2 * j] = q[j] & 15;
                        codes[2 * j + 1] = q[j] >> 4;
                    }
                    if (t->type == GG_F32) {
                        if (srow[blk] > 252) /* 6 * 2^(s-127) overflows F32; 255 is NaN */
                            die("--gguf-f32: %s expert %lld row %lld has E8M0 scale byte %d, "
                                "which F32 cannot hold exactly", t->name, (long long)e,
                                (long long)r, srow[blk]);
                        static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6,
                                                       -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
                        for (int j = 0; j < 32; j++) {
                            float v = ldexpf(e2m1[codes[j]], (int)srow[blk] - 127);
                            memcpy(out + 4 * (blk * 32 + j), &v, 4);
                        }
                    } else {
                        unsigned char *ob = out + blk * 17;
                        ob[0] = srow[blk];
                        for (int j = 0; j < 16; j++)
                            ob[1 + j] = (unsigned char)(codes[j] | codes[j + 16] << 4);
                    }
                }
                write_all(f, out, row_out, path);
            }
            free(pk);
            free(sc);
        }
        free(out);
    }
}

/* The name of split s of n for --gguf FILE (llama.cpp's gguf-split naming:
 * FILE without ".gguf", then -%05d-of-%05d.gguf); FILE itself when n == 1. */
static char *gg_split_path(const char *path, int s, int n)
{
    size_t len = strlen(path) + 32;
    char *out = xmalloc(len);
    if (n == 1)
        snprintf(out, len, "%s", path);
    else
        snprintf(out, len, "%.*s-%05d-of-%05d.gguf", (int)(strlen(path) - 5), path, s + 1, n);
    return out;
}

/* n_split > 1: llama.cpp's gguf-split layout.  Every tensor lies whole in
 * one file, files in roster order with about equal data; the metadata is
 * in the first file only, and every file carries split.no (UINT16),
 * split.count (UINT16) and split.tensors.count (INT32). */
static uint64_t write_gguf(const char *path, const model_cfg *c, tensor_list *tl, uint64_t seed, int f32,
                           int n_split)
{
    gg_list g = {0};
    g.f32 = f32;
    gg_roster(c, tl, &g);
    if (n_split < 1 || (size_t)n_split > g.n)
        die("--gguf-split %d: the model has %zu tensors", n_split, g.n);
    kvbuf k = {{0}, 0};
    gg_metadata(&k, c);
    gg_tokenizer(&k, c->vocab_size);
    uint64_t all = 0;
    for (size_t i = 0; i < g.n; i++) {
        g.t[i].nbytes = gg_bytes(&g.t[i]);
        all += (g.t[i].nbytes + GG_ALIGN - 1) / GG_ALIGN * GG_ALIGN;
    }
    /* file s takes tensors [first[s], first[s + 1]): cut when its share of the
     * bytes is reached, leaving at least one tensor for each later file */
    size_t *first = xmalloc(((size_t)n_split + 1) * sizeof *first);
    memset(first, 0, ((size_t)n_split + 1) * sizeof *first);
    uint64_t acc = 0;
    int s = 0;
    for (size_t i = 0; i < g.n; i++) {
        while (s + 1 < n_split && (acc >= all / (uint64_t)n_split * (uint64_t)(s + 1) ||
                                   g.n - i <= (size_t)(n_split - 1 - s)) && i > first[s])
            first[++s] = i;
        acc += (g.t[i].nbytes + GG_ALIGN - 1) / GG_ALIGN * GG_ALIGN;
    }
    first[n_split] = g.n;
    uint64_t total = 0;
    unsigned char *chunk = xmalloc(CHUNK_BYTES);
    static const char zeros[GG_ALIGN];
    for (s = 0; s < n_split; s++) {
        kvbuf sk = {{0}, 0};
        if (n_split > 1) {
            kv_u16(&sk, "split.no", (unsigned)s);
            kv_u16(&sk, "split.count", (unsigned)n_split);
            kv_i32(&sk, "split.tensors.count", (long)g.n);
        }
        sbuf h = {0};
        sb_addn(&h, "GGUF", 4);
        bb_u32(&h, 3);
        bb_u64(&h, first[s + 1] - first[s]);
        bb_u64(&h, (s == 0 ? k.n : 0) + sk.n);
        if (s == 0)
            sb_addn(&h, k.b.buf, k.b.len);
        if (sk.n)
            sb_addn(&h, sk.b.buf, sk.b.len);
        uint64_t off = 0;
        for (size_t i = first[s]; i < first[s + 1]; i++) {
            gg_tensor *t = &g.t[i];
            t->offset = off;
            off += (t->nbytes + GG_ALIGN - 1) / GG_ALIGN * GG_ALIGN;
            bb_str(&h, t->name, strlen(t->name));
            bb_u32(&h, (uint32_t)t->nd);
            for (int d = 0; d < t->nd; d++)
                bb_u64(&h, (uint64_t)t->ne[d]);
            bb_u32(&h, (uint32_t)t->type);
            bb_u64(&h, t->offset);
        }
        while (h.len % GG_ALIGN)
            sb_addn(&h, "", 1);
        char *out = gg_split_path(path, s, n_split);
        size_t plen = strlen(out) + sizeof TMP_SUFFIX;
        char *tmp = xmalloc(plen);
        snprintf(tmp, plen, "%s%s", out, TMP_SUFFIX);
        FILE *f = fopen(tmp, "wb");
        if (!f)
            die("cannot create %s: %s", tmp, strerror(errno));
        write_all(f, h.buf, h.len, tmp);
        for (size_t i = first[s]; i < first[s + 1]; i++) {
            gg_write_data(f, tmp, &g.t[i], seed, chunk);
            uint64_t pad = (GG_ALIGN - g.t[i].nbytes % GG_ALIGN) % GG_ALIGN;
            write_all(f, zeros, (size_t)pad, tmp);
        }
        if (ferror(f) || fclose(f) != 0)
            die("writing %s failed: %s", tmp, strerror(errno));
        if (rename(tmp, out) != 0)
            die("cannot rename %s to %s: %s", tmp, out, strerror(errno));
        total += h.len + off;
        free(out);
        free(tmp);
        free(h.buf);
        free(sk.b.buf);
    }
    for (size_t i = 0; i < g.n; i++)
        free(g.t[i].exps);
    free(first);
    free(g.t);
    free(g.sorted);
    free(k.b.buf);
    free(chunk);
    return total;
}

static void gg_report(const char *path, int n_split, int f32, uint64_t bytes)
{
    char *first = gg_split_path(path, 0, n_split);
    printf("k3gen: wrote %s%s: GGUF v3 kimi-k3, %s experts, %llu bytes (%.1f MiB)\n", first,
           n_split > 1 ? " and the other splits" : "", f32 ? "F32" : "MXFP4", (unsigned long long)bytes,
           (double)bytes / (1 << 20));
    free(first);
}

/* --------------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: k3gen --out DIR [--preset NAME] [--seed N] [--set key=value ...]\n"
            "             [--shard-max-mb N | --shards N] [--force] [--dry-run]\n"
            "             [--gguf FILE [--gguf-f32]]\n"
            "       k3gen --from DIR --gguf FILE [--gguf-f32] [--preset NAME] [--set key=value ...]\n"
            "       k3gen --out DIR --tokenizer-only [--tokenizer-corpus FILE] [--set vocab_size=V]\n"
            "Writes a Kimi-K3-layout checkpoint with deterministic random weights.\n"
            "  --out DIR          output directory (created; must be empty unless --force)\n"
            "  --preset NAME      size preset (default tiny):\n");
    for (size_t i = 0; i < N_PRESETS; i++)
        fprintf(f, "                       %-13s %s\n", presets[i].name, presets[i].about);
    fprintf(f,
            "  --seed N           weight seed (default 0); the tokenizer depends only on vocab_size\n"
            "  --set key=value    override a text_config size; keys:\n"
            "                      ");
    for (size_t i = 0; i < sizeof cfg_keys / sizeof cfg_keys[0]; i++)
        fprintf(f, "%s%s", cfg_keys[i].key,
                i + 1 < sizeof cfg_keys / sizeof cfg_keys[0] ? (i % 4 == 3 ? ",\n                      " : ", ") : "\n");
    fprintf(f,
            "                     mla_every=N: MLA at 1-based layers N, 2N, ... and the last layer\n"
            "  --shard-max-mb N   start a new shard before a layer that would push it past N MiB\n"
            "                     (a layer never spans shards; default: per preset, else 4096)\n"
            "  --shards N         split the layers into N shards by count (as k3-tiny-a: 5,4,4)\n"
            "  --force            write into a non-empty DIR (removes its old shards/index)\n"
            "  --dry-run          print the summary without writing anything\n"
            "  --gguf FILE        also write the same model as one GGUF v3 file in llama.cpp's\n"
            "                     kimi-k3 layout (experts as 3-D MXFP4 tensors, same values)\n"
            "  --gguf-f32         write every GGUF tensor as F32 (MXFP4 dequantized exactly)\n"
            "  --gguf-split N     write the GGUF as N files the way llama.cpp's gguf-split does\n"
            "                     (FILE-00001-of-0000N.gguf, ...; metadata in the first)\n"
            "  --from DIR         write only the GGUF, its tensor bytes read from the existing\n"
            "                     safetensors checkpoint DIR (index weight_map, else every shard);\n"
            "                     --preset/--set must give DIR's shape: each tensor is checked\n"
            "                     for name, dtype and shape; tokenizer/metadata are k3gen's\n"
            "  --tokenizer-corpus FILE  train the BPE merges on FILE's text instead of the\n"
            "                     built-in corpus (digit runs excluded: digits stay single tokens)\n"
            "  --tokenizer-only   write only tiktoken.model and tokenizer_config.json into DIR\n");
}

static long parse_long(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || end == s || *end)
        die("%s: '%s' is not an integer", what, s);
    return v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *preset_name = "tiny", *gguf_path = NULL, *from = NULL;
    int gguf_f32 = 0, gguf_split = 1;
    uint64_t seed = 0;
    int force = 0, dry_run = 0, shards = -1, tok_only = 0;
    long shard_max_mb = -1;
    const char **sets = xmalloc((size_t)argc * sizeof *sets);
    int nsets = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEED_ARG()                                                                          \
    do {                                                                                    \
        if (i + 1 >= argc)                                                                  \
            die("option %s needs an argument (see --help)", a);                            \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--out")) {
            NEED_ARG();
            out = argv[++i];
        } else if (!strcmp(a, "--preset")) {
            NEED_ARG();
            preset_name = argv[++i];
        } else if (!strcmp(a, "--seed")) {
            NEED_ARG();
            char *end;
            errno = 0;
            seed = strtoull(argv[++i], &end, 0);
            if (errno || end == argv[i] || *end || argv[i][0] == '-')
                die("--seed: '%s' is not a non-negative integer", argv[i]);
        } else if (!strcmp(a, "--set")) {
            NEED_ARG();
            sets[nsets++] = argv[++i];
        } else if (!strcmp(a, "--shard-max-mb")) {
            NEED_ARG();
            shard_max_mb = parse_long(argv[++i], "--shard-max-mb");
            if (shard_max_mb < 1)
                die("--shard-max-mb must be >= 1");
        } else if (!strcmp(a, "--shards")) {
            NEED_ARG();
            long s = parse_long(argv[++i], "--shards");
            if (s < 1 || s > 99999)
                die("--shards must be in 1..99999");
            shards = (int)s;
        } else if (!strcmp(a, "--force")) {
            force = 1;
        } else if (!strcmp(a, "--dry-run")) {
            dry_run = 1;
        } else if (!strcmp(a, "--gguf")) {
            NEED_ARG();
            gguf_path = argv[++i];
        } else if (!strcmp(a, "--gguf-f32")) {
            gguf_f32 = 1;
        } else if (!strcmp(a, "--gguf-split")) {
            NEED_ARG();
            long v = parse_long(argv[++i], "--gguf-split");
            if (v < 1 || v > 99999)
                die("--gguf-split wants 1 to 99999 files, not %ld", v);
            gguf_split = (int)v;
        } else if (!strcmp(a, "--from")) {
            NEED_ARG();
            from = argv[++i];
        } else if (!strcmp(a, "--tokenizer-corpus")) {
            NEED_ARG();
            g_tok_corpus = argv[++i];
        } else if (!strcmp(a, "--tokenizer-only")) {
            tok_only = 1;
        } else {
            die("unknown argument '%s' (see --help)", a);
        }
#undef NEED_ARG
    }
    if (from && out)
        die("--from writes only the GGUF (--gguf FILE); --out is not used with --from");
    if (from && !gguf_path)
        die("--from DIR needs --gguf FILE (it converts DIR's safetensors to one GGUF)");
    if (!out && !dry_run && !from)
        die("--out DIR is required (see --help)");
    if (shards > 0 && shard_max_mb > 0)
        die("--shards and --shard-max-mb are mutually exclusive");
    if (gguf_split > 1 && (!gguf_path || strlen(gguf_path) < 6 || strcmp(gguf_path + strlen(gguf_path) - 5, ".gguf")))
        die("--gguf-split needs --gguf FILE ending in .gguf (the files are FILE-00001-of-0000N.gguf, ...)");
    if (gguf_f32 && !gguf_path)
        die("--gguf-f32 needs --gguf FILE");
    if (g_tok_corpus && (gguf_path || from))
        die("--tokenizer-corpus: the GGUF writer has only the built-in tokenizer");
    if (tok_only && (!out || dry_run || gguf_path || from))
        die("--tokenizer-only needs --out DIR and no --dry-run/--gguf/--from");

    const preset *pr = NULL;
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcmp(presets[i].name, preset_name))
            pr = &presets[i];
    if (!pr) {
        fprintf(stderr, "k3gen: error: unknown preset '%s'; known:", preset_name);
        for (size_t i = 0; i < N_PRESETS; i++)
            fprintf(stderr, " %s", presets[i].name);
        fputc('\n', stderr);
        return 1;
    }
    model_cfg cfg = pr->cfg;
    for (int i = 0; i < nsets; i++) {
        const char *eq = strchr(sets[i], '=');
        if (!eq)
            die("--set '%s': expected key=value", sets[i]);
        char key[128];
        size_t kl = (size_t)(eq - sets[i]);
        if (kl == 0 || kl >= sizeof key)
            die("--set '%s': bad key", sets[i]);
        memcpy(key, sets[i], kl);
        key[kl] = 0;
        long *f = cfg_field(&cfg, key);
        if (!f)
            die("--set: unknown key '%s' (see --help for the list)", key);
        *f = parse_long(eq + 1, key);
    }
    validate_cfg(&cfg);
    if (shards < 0 && shard_max_mb < 0) {
        shards = pr->shards;
        shard_max_mb = pr->shard_max_mb > 0 ? pr->shard_max_mb : 4096;
    }
    if (gguf_path && cfg.moe_layer_freq != 1)
        die("--gguf: moe_layer_freq = %ld cannot be expressed in llama.cpp's kimi-k3 layout "
            "(dense layers are exactly those below leading_dense_block_count)", cfg.moe_layer_freq);
    if (shards > 0 && shards > cfg.num_hidden_layers)
        die("%d shards requested but only %ld layers (a layer never spans shards); "
            "use --shards or --shard-max-mb", shards, cfg.num_hidden_layers);

    double t0 = now_s();
    if (tok_only) {
        /* only tiktoken.model + tokenizer_config.json; other files in DIR stay */
        if (mkdir(out, 0755) && errno != EEXIST)
            die("mkdir %s: %s", out, strerror(errno));
        int n = write_tokenizer(out, cfg.vocab_size);
        printf("k3gen: wrote the tokenizer to %s: V=%ld (%d BPE ranks + 256 specials), %.2f s\n", out,
               cfg.vocab_size, n, now_s() - t0);
        free(sets);
        return 0;
    }
    tensor_list tl = {0};
    build_roster(&cfg, &tl);
    long nmla = 0;
    for (long l = 0; l < cfg.num_hidden_layers; l++)
        nmla += is_mla_layer(&cfg, l);

    if (from) {
        static src_ckpt src;
        src_open(&src, from, &tl); /* dies unless every roster tensor matches */
        g_src = &src;
        uint64_t total = 0;
        for (size_t i = 0; i < tl.n; i++)
            total += tensor_bytes(&tl.t[i]);
        uint64_t gguf_bytes = dry_run ? 0 : write_gguf(gguf_path, &cfg, &tl, seed, gguf_f32, gguf_split);
        printf("k3gen: %s %s from %s: preset %s, V=%ld h=%ld layers=%ld (%ld KDA, %ld MLA) "
               "E=%ld; %zu tensors, %llu bytes (%.1f MiB) read from %zu shard%s, %.2f s\n",
               dry_run ? "checked (dry run, not written)" : "wrote", gguf_path, from, pr->name,
               cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers,
               cfg.num_hidden_layers - nmla, nmla, cfg.num_experts, tl.n,
               (unsigned long long)total, (double)total / (1 << 20), src.n,
               src.n == 1 ? "" : "s", now_s() - t0);
        if (gguf_bytes)
            gg_report(gguf_path, gguf_split, gguf_f32, gguf_bytes);
        g_src = NULL;
        src_close(&src);
        for (size_t i = 0; i < tl.n; i++)
            free(tl.t[i].name);
        free(tl.t);
        free(sets);
        return 0;
    }

    int nshards = assign_shards(&cfg, &tl, shards > 0 ? shards : 0, shard_max_mb);

    if (!dry_run) {
        prepare_out_dir(out, force);
        write_config(out, &cfg);
        write_tokenizer(out, cfg.vocab_size);
    }
    uint64_t total = write_shards(out, &tl, nshards, seed, dry_run);
    uint64_t gguf_bytes = 0;
    if (gguf_path && !dry_run)
        gguf_bytes = write_gguf(gguf_path, &cfg, &tl, seed, gguf_f32, gguf_split);
    if (!dry_run)
        write_index(out, &tl, nshards, total); /* last: marks the directory complete */

    printf("k3gen: %s %s: preset %s seed %llu, V=%ld h=%ld layers=%ld (%ld KDA, %ld MLA) "
           "E=%ld k=%ld I=%ld Lt=%ld; %llu bytes (%.1f MiB) in %d shard%s, %zu tensors, %.2f s\n",
           dry_run ? "would write" : "wrote", out ? out : "(dry run)", pr->name,
           (unsigned long long)seed, cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers,
           cfg.num_hidden_layers - nmla, nmla, cfg.num_experts, cfg.num_experts_per_token,
           cfg.moe_intermediate_size, cfg.routed_expert_hidden_size, (unsigned long long)total,
           (double)total / (1 << 20), nshards, nshards == 1 ? "" : "s", tl.n, now_s() - t0);
    if (gguf_bytes)
        gg_report(gguf_path, gguf_split, gguf_f32, gguf_bytes);
    for (size_t i = 0; i < tl.n; i++)
        free(tl.t[i].name);
    free(tl.t);
    free(sets);
    return 0;
}
