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

static void write_tensor_data(FILE *f, const char *path, const tensor *t, uint64_t seed,
                              unsigned char *buf)
{
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
        write_all(f, buf, (size_t)(cnt * es), path);
        done += cnt;
    }
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
static void split_text(piece_map *pm, const char *text, long weight)
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
        split_text(&pm, corpus[i], 1);
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

/* --------------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: k3gen --out DIR [--preset NAME] [--seed N] [--set key=value ...]\n"
            "             [--shard-max-mb N | --shards N] [--force] [--dry-run]\n"
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
            "  --dry-run          print the summary without writing anything\n");
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
    const char *out = NULL, *preset_name = "tiny";
    uint64_t seed = 0;
    int force = 0, dry_run = 0, shards = -1;
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
        } else {
            die("unknown argument '%s' (see --help)", a);
        }
#undef NEED_ARG
    }
    if (!out && !dry_run)
        die("--out DIR is required (see --help)");
    if (shards > 0 && shard_max_mb > 0)
        die("--shards and --shard-max-mb are mutually exclusive");

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
    if (shards > 0 && shards > cfg.num_hidden_layers)
        die("%d shards requested but only %ld layers (a layer never spans shards); "
            "use --shards or --shard-max-mb", shards, cfg.num_hidden_layers);

    double t0 = now_s();
    tensor_list tl = {0};
    build_roster(&cfg, &tl);
    int nshards = assign_shards(&cfg, &tl, shards > 0 ? shards : 0, shard_max_mb);

    if (!dry_run) {
        prepare_out_dir(out, force);
        write_config(out, &cfg);
        write_tokenizer(out, cfg.vocab_size);
    }
    uint64_t total = write_shards(out, &tl, nshards, seed, dry_run);
    if (!dry_run)
        write_index(out, &tl, nshards, total); /* last: marks the directory complete */

    long nmla = 0;
    for (long l = 0; l < cfg.num_hidden_layers; l++)
        nmla += is_mla_layer(&cfg, l);
    printf("k3gen: %s %s: preset %s seed %llu, V=%ld h=%ld layers=%ld (%ld KDA, %ld MLA) "
           "E=%ld k=%ld I=%ld Lt=%ld; %llu bytes (%.1f MiB) in %d shard%s, %zu tensors, %.2f s\n",
           dry_run ? "would write" : "wrote", out ? out : "(dry run)", pr->name,
           (unsigned long long)seed, cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers,
           cfg.num_hidden_layers - nmla, nmla, cfg.num_experts, cfg.num_experts_per_token,
           cfg.moe_intermediate_size, cfg.routed_expert_hidden_size, (unsigned long long)total,
           (double)total / (1 << 20), nshards, nshards == 1 ? "" : "s", tl.n, now_s() - t0);
    for (size_t i = 0; i < tl.n; i++)
        free(tl.t[i].name);
    free(tl.t);
    free(sets);
    return 0;
}
