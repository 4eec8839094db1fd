/* test_gguf.c - the GGUF header parser on hand-made inputs, and k3gen's GGUF
 * output checked value for value against its safetensors checkpoint.
 * Hand-made inputs are placed so that they end exactly at an unreadable
 * page, so an over-read faults instead of passing silently. */
#define _GNU_SOURCE
#include "gguf.h"
#include "harness.h"
#include "quant.h"
#include "safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------- a GGUF builder */

typedef struct {
    uint8_t b[8192];
    size_t n;
} buf;

static void put(buf *o, const void *p, size_t n) { memcpy(o->b + o->n, p, n); o->n += n; }
static void u8(buf *o, uint8_t v) { put(o, &v, 1); }
static void u32(buf *o, uint32_t v) { for (int i = 0; i < 4; i++) u8(o, (uint8_t)(v >> (8 * i))); }
static void u64(buf *o, uint64_t v) { for (int i = 0; i < 8; i++) u8(o, (uint8_t)(v >> (8 * i))); }
static void str(buf *o, const char *s) { u64(o, strlen(s)); put(o, s, strlen(s)); }
static void f32(buf *o, float f) { uint32_t u; memcpy(&u, &f, 4); u32(o, u); }
static void pad(buf *o, size_t a) { while (o->n % a) u8(o, 0); }

/* Mutations of the valid file, selected per case. */
enum {
    M_NONE, M_MAGIC, M_VERSION1, M_VERSION4, M_HUGE_TENSORS, M_HUGE_KV, M_STRLEN, M_KVTYPE, M_ARR_ARR,
    M_ARR_TYPE, M_ARR_HUGE, M_MISALIGNED, M_OVERLAP, M_OUTSIDE, M_GGML_TYPE, M_DIMS_OVERFLOW, M_NDIMS,
    M_BLOCK, M_ALIGN_TYPE, M_ALIGN_POW2, M_DUP_KEY, M_DUP_TENSOR, M_EMPTY_NAME, M_LONG_NAME, M_BOOL,
    M_NEG_DIM,
};

/* A small valid v3 file: 6 KVs (string, u32, f32, bool, int array, string
 * array) + general.alignment 64, and two tensors: "a" F32 [4, 2] at 0 and
 * "w" MXFP4 [64] at 64.  `m` corrupts one thing. */
static size_t build(uint8_t *outp, int m)
{
    static buf o;
    o.n = 0;
    put(&o, m == M_MAGIC ? "GGUX" : "GGUF", 4);
    u32(&o, m == M_VERSION1 ? 1 : m == M_VERSION4 ? 4 : 3);
    u64(&o, m == M_HUGE_TENSORS ? (1ull << 40) : 2);
    u64(&o, m == M_HUGE_KV ? UINT64_MAX / 2 : (m == M_DUP_KEY ? 8 : 7));
    str(&o, "general.architecture");
    u32(&o, m == M_KVTYPE ? 13 : 8);
    if (m == M_STRLEN) u64(&o, 1u << 20), put(&o, "kimi-k3", 7);
    else str(&o, "kimi-k3");
    str(&o, "k.block_count"); u32(&o, 4); u32(&o, 93);
    str(&o, "k.eps"); u32(&o, 6); f32(&o, 1e-5f);
    str(&o, "k.norm"); u32(&o, 7); u8(&o, m == M_BOOL ? 2 : 1);
    str(&o, "k.head_count_kv"); u32(&o, 9);
    u32(&o, m == M_ARR_ARR ? 9 : m == M_ARR_TYPE ? 99 : 4);
    u64(&o, m == M_ARR_HUGE ? (1ull << 60) : 3);
    u32(&o, 0); u32(&o, 0); u32(&o, 1);
    str(&o, "k.tokens"); u32(&o, 9); u32(&o, 8); u64(&o, 2); str(&o, "a"); str(&o, "bc");
    str(&o, "general.alignment");
    if (m == M_ALIGN_TYPE) u32(&o, 10), u64(&o, 64);
    else u32(&o, 4), u32(&o, m == M_ALIGN_POW2 ? 48 : 64);
    if (m == M_DUP_KEY) { str(&o, "k.eps"); u32(&o, 6); f32(&o, 2.0f); }
    /* tensor a */
    str(&o, m == M_EMPTY_NAME ? "" : m == M_LONG_NAME ? "a_name_that_is_far_too_long_for_ggml_because_it_has_64_characters" : "a");
    u32(&o, m == M_NDIMS ? 5 : 2);
    if (m == M_DIMS_OVERFLOW) u64(&o, 1ull << 40), u64(&o, 1ull << 40);
    else if (m == M_NEG_DIM) u64(&o, UINT64_MAX), u64(&o, 2);
    else u64(&o, 4), u64(&o, 2);
    u32(&o, 0);
    u64(&o, m == M_MISALIGNED ? 8 : 0);
    /* tensor w */
    str(&o, m == M_DUP_TENSOR ? "a" : "w");
    u32(&o, 1);
    u64(&o, m == M_BLOCK ? 48 : 64);
    u32(&o, m == M_GGML_TYPE ? 4 : 39);
    u64(&o, m == M_OVERLAP ? 0 : m == M_OUTSIDE ? 128 : 64);
    pad(&o, 64);
    for (int i = 0; i < 16; i++) f32(&o, i < 8 ? (float)i : 0.0f); /* a: 32 bytes, then 32 of padding */
    for (int i = 0; i < 34; i++) u8(&o, (uint8_t)(0x40 + i)); /* w: 2 blocks of 17 bytes, at EOF */
    memcpy(outp, o.b, o.n);
    return o.n;
}

static int parse_buf(const uint8_t *b, size_t n, gguf_file *f, df_error *err)
{
    memset(err, 0, sizeof *err);
    return gguf_parse(guard_place(b, n), n, n, "x.gguf", f, err);
}

static void test_valid(void)
{
    static uint8_t b[8192];
    size_t n = build(b, M_NONE);
    gguf_file f;
    df_error err;
    TCHECKF(parse_buf(b, n, &f, &err) == 0, "%s", err.msg);
    if (err.code) return;
    TCHECK(f.version == 3 && f.alignment == 64 && f.n_kv == 7 && f.n_tensors == 2);
    TCHECK(f.data_start % 64 == 0);
    uint32_t u = 0;
    int32_t i32 = 0;
    float e = 0;
    int bl = 0;
    const char *s = NULL;
    size_t len = 0, cnt = 0;
    int64_t arr[4] = {0};
    TCHECK(gguf_get_u32(&f, "k.block_count", &u, &err) == 0 && u == 93);
    TCHECK(gguf_get_i32(&f, "k.block_count", &i32, &err) == 0 && i32 == 93);
    TCHECK(gguf_get_f32(&f, "k.eps", &e, &err) == 0 && e == 1e-5f);
    TCHECK(gguf_get_bool(&f, "k.norm", &bl, &err) == 0 && bl == 1);
    TCHECK(gguf_get_str(&f, "general.architecture", &s, &len, &err) == 0 && len == 7 && !memcmp(s, "kimi-k3", 7));
    TCHECK(gguf_get_arr_int(&f, "k.head_count_kv", arr, 4, &cnt, &err) == 0 && cnt == 3 && arr[0] == 0 &&
           arr[2] == 1);
    TCHECK(gguf_get_arr_str(&f, "k.tokens", 1, &s, &len, &err) == 0 && len == 2 && !memcmp(s, "bc", 2));
    /* wrong types and missing keys name the key */
    memset(&err, 0, sizeof err);
    TCHECK(gguf_get_u32(&f, "k.eps", &u, &err) == -1 && strstr(err.msg, "k.eps") && strstr(err.msg, "FLOAT32"));
    memset(&err, 0, sizeof err);
    TCHECK(gguf_get_f32(&f, "k.missing", &e, &err) == -1 && strstr(err.msg, "missing key k.missing"));
    memset(&err, 0, sizeof err);
    TCHECK(gguf_get_arr_str(&f, "k.tokens", 2, &s, &len, &err) == -1 && strstr(err.msg, "index"));
    memset(&err, 0, sizeof err);
    TCHECK(gguf_get_arr_int(&f, "k.tokens", arr, 4, &cnt, &err) == -1 && strstr(err.msg, "STRING"));
    const gguf_tensor *a = gguf_find_tensor(&f, "a"), *w = gguf_find_tensor(&f, "w");
    TCHECK(a && w && !gguf_find_tensor(&f, "b"));
    if (a && w) {
        TCHECK(a->type == GGML_TYPE_F32 && a->n_dims == 2 && a->ne[0] == 4 && a->ne[1] == 2 && a->ne[2] == 1);
        TCHECK(a->offset == f.data_start && a->nbytes == 32);
        TCHECK(w->type == GGML_TYPE_MXFP4 && w->nbytes == 34 && w->offset == f.data_start + 64);
        float v;
        memcpy(&v, b + a->offset + 4 * 5, 4);
        TCHECK(v == 5.0f);
    }
    gguf_deinit(&f);
    /* gguf_deinit on an empty struct and twice is harmless */
    gguf_deinit(&f);
}

static void test_invalid(void)
{
    static const struct { int m; const char *msg; } bad[] = {
        {M_MAGIC, "bad magic"},
        {M_VERSION1, "version 1 is not supported"},
        {M_VERSION4, "version 4 is not supported"},
        {M_HUGE_TENSORS, "tensor count"},
        {M_HUGE_KV, "KV count"},
        {M_STRLEN, "general.architecture: string value length 1048576"},
        {M_KVTYPE, "key general.architecture: unknown value type 13"},
        {M_ARR_ARR, "key k.head_count_kv: array of arrays"},
        {M_ARR_TYPE, "array of unknown element type 99"},
        {M_ARR_HUGE, "cannot fit"},
        {M_MISALIGNED, "tensor a: data offset 8 is not a multiple of the alignment 64"},
        {M_OVERLAP, "overlap"},
        {M_OUTSIDE, "tensor w: data [128, +34) lies outside"},
        {M_GGML_TYPE, "tensor w: unknown ggml type 4"},
        {M_DIMS_OVERFLOW, "tensor a: element count overflows"},
        {M_NDIMS, "tensor a: n_dims 5"},
        {M_BLOCK, "tensor w: ne[0] = 48 is not a multiple of the MXFP4 block size 32"},
        {M_ALIGN_TYPE, "general.alignment has type UINT64"},
        {M_ALIGN_POW2, "general.alignment = 48 is not a power of two"},
        {M_DUP_KEY, "duplicate key k.eps"},
        {M_DUP_TENSOR, "duplicate tensor name a"},
        {M_EMPTY_NAME, "empty name"},
        {M_LONG_NAME, "the limit is 63"},
        {M_BOOL, "k.norm: bool value 2"},
        {M_NEG_DIM, "ne[0]"},
    };
    static uint8_t b[8192];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = build(b, bad[i].m);
        gguf_file f;
        df_error err;
        int rc = parse_buf(b, n, &f, &err);
        TCHECKF(rc == -1, "case %zu accepted", i);
        TCHECKF(strstr(err.msg, bad[i].msg) && strstr(err.msg, "x.gguf") && err.code == DF_ERR_FORMAT &&
                    (err.pos >= 0 || bad[i].m == M_OVERLAP),
                "case %zu: code %d pos %lld message \"%s\"", i, err.code, (long long)err.pos, err.msg);
        if (rc == 0) gguf_deinit(&f);
    }
}

/* Every proper prefix of a valid file fails with a message (never a crash),
 * and a short read of a longer file asks for more (DF_ERR_LIMIT). */
static void test_truncated(void)
{
    static uint8_t b[8192];
    size_t n = build(b, M_NONE);
    int bad = 0;
    for (size_t k = 0; k < n && !bad; k++) {
        gguf_file f;
        df_error err;
        int rc = parse_buf(b, k, &f, &err);
        if (rc != -1 || !strstr(err.msg, "x.gguf") || err.code != DF_ERR_FORMAT) {
            t_fail(__FILE__, __LINE__, "prefix %zu of %zu: rc %d code %d \"%s\"", k, n, rc, err.code, err.msg);
            bad = 1;
            if (rc == 0) gguf_deinit(&f);
        }
    }
    /* the whole header is enough even without the data */
    gguf_file f;
    df_error err = {0};
    size_t hdr = 0;
    if (parse_buf(b, n, &f, &err) == 0) {
        hdr = (size_t)f.data_start;
        gguf_deinit(&f);
    }
    memset(&err, 0, sizeof err);
    TCHECKF(hdr && gguf_parse(guard_place(b, hdr), hdr, n, "x.gguf", &f, &err) == 0, "%s", err.msg);
    if (!err.code && hdr) gguf_deinit(&f);
    /* a readable head that ends inside the header asks for more */
    for (size_t k = 0; k < hdr; k++) {
        memset(&err, 0, sizeof err);
        if (gguf_parse(guard_place(b, k), k, n, "x.gguf", &f, &err) == 0) gguf_deinit(&f);
        else if (err.code != DF_ERR_LIMIT) {
            t_fail(__FILE__, __LINE__, "head %zu of %zu: code %d \"%s\"", k, n, err.code, err.msg);
            break;
        }
    }
}

/* gguf_open on files: a valid one, a missing one, and one with a header
 * bigger than the first read (grows the read). */
static void test_open(void)
{
    static uint8_t b[8192];
    size_t n = build(b, M_NONE);
    char path[512];
    snprintf(path, sizeof path, "%s/small.gguf", test_scratch());
    FILE *fp = fopen(path, "wb");
    TCHECK(fp && fwrite(b, 1, n, fp) == n);
    if (fp) fclose(fp);
    gguf_file f;
    df_error err = {0};
    TCHECKF(gguf_open(path, &f, &err) == 0, "%s", err.msg);
    if (!err.code) {
        TCHECK(f.n_tensors == 2 && f.path && !strcmp(f.path, path));
        gguf_deinit(&f);
    }
    memset(&err, 0, sizeof err);
    TCHECK(gguf_open("/nonexistent/x.gguf", &f, &err) == -1 && err.code == DF_ERR_IO);
    /* a 3 MiB string KV: the header does not fit the first 1 MiB read */
    snprintf(path, sizeof path, "%s/big.gguf", test_scratch());
    fp = fopen(path, "wb");
    size_t big = 3u << 20;
    uint8_t hdr[64];
    buf *o = malloc(sizeof *o);
    o->n = 0;
    put(o, "GGUF", 4); u32(o, 3); u64(o, 0); u64(o, 1); str(o, "big"); u32(o, 8); u64(o, big);
    memcpy(hdr, o->b, o->n);
    TCHECK(fp && fwrite(hdr, 1, o->n, fp) == o->n);
    char *payload = calloc(1, big);
    memset(payload, 'x', big);
    if (fp) { TCHECK(fwrite(payload, 1, big, fp) == big); fclose(fp); }
    memset(&err, 0, sizeof err);
    TCHECKF(gguf_open(path, &f, &err) == 0, "%s", err.msg);
    const char *s;
    size_t len;
    if (!err.code) {
        TCHECK(gguf_get_str(&f, "big", &s, &len, &err) == 0 && len == big && s[big - 1] == 'x');
        gguf_deinit(&f);
    }
    free(payload);
    free(o);
}

/* ----------------------------------------- k3gen: GGUF vs safetensors */

#define MAX_SHARDS 8
static st_file shards[MAX_SHARDS];
static int n_shards;

static int open_shards(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *de;
    while ((de = readdir(d)) && n_shards < MAX_SHARDS) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        df_error err = {0};
        if (st_open(p, &shards[n_shards], &err)) {
            t_fail(__FILE__, __LINE__, "%s", err.msg);
            continue;
        }
        n_shards++;
    }
    closedir(d);
    return 0;
}

static void close_shards(void)
{
    for (int i = 0; i < n_shards; i++) st_deinit(&shards[i]);
    n_shards = 0;
}

static uint8_t *read_at(const char *path, uint64_t off, uint64_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    int fd = open(path, O_RDONLY);
    if (fd < 0 || pread(fd, p, n, (off_t)off) != (ssize_t)n) {
        if (fd >= 0) close(fd);
        free(p);
        return NULL;
    }
    close(fd);
    return p;
}

/* A safetensors tensor's bytes (NULL if absent). */
static uint8_t *hf_bytes(const char *name, const st_tensor **out)
{
    for (int i = 0; i < n_shards; i++) {
        const st_tensor *t = st_find(&shards[i], name);
        if (t) {
            *out = t;
            return read_at(shards[i].path, t->offset, t->nbytes);
        }
    }
    return NULL;
}

static float hf_value(const st_tensor *t, const uint8_t *p, size_t i)
{
    return t->dtype == ST_BF16 ? load_bf16(p, i) : load_f32(p, i);
}

/* The GGUF side decoded to floats; MXFP4 per ggml's block_mxfp4 (value j in
 * the low nibble of qs[j], value j+16 in the high nibble, E8M0 scale byte). */
static float *gg_values(const gguf_tensor *t, const uint8_t *p, uint64_t *count)
{
    uint64_t n = (uint64_t)t->ne[0] * (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
    float *v = malloc(n * sizeof *v);
    *count = n;
    for (uint64_t i = 0; i < n; i++) {
        if (t->type == GGML_TYPE_F32) v[i] = load_f32(p, i);
        else if (t->type == GGML_TYPE_BF16) v[i] = load_bf16(p, i);
        else if (t->type == GGML_TYPE_MXFP4) {
            const uint8_t *blk = p + (i / 32) * GGUF_MXFP4_BYTES;
            unsigned j = (unsigned)(i % 32);
            unsigned code = j < 16 ? (blk[1 + j] & 15u) : (blk[1 + j - 16] >> 4);
            v[i] = e2m1_table[code] * e8m0_table[blk[0]];
        } else {
            v[i] = NAN;
        }
    }
    return v;
}

static int same(float a, float b, int exact_bits)
{
    if (exact_bits) return !memcmp(&a, &b, 4);
    return a == b; /* MXFP4: ggml decodes code 8 as +0, OCP as -0 */
}

static const struct { const char *gg, *hf, *hf2; } name_map[] = {
    {"attn_norm.weight", "input_layernorm.weight", NULL},
    {"attn_res_score.weight", "self_attention_res_norm.weight", "self_attention_res_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight", NULL},
    {"ffn_res_score.weight", "mlp_res_norm.weight", "mlp_res_proj.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight", NULL},
    {"attn_k.weight", "self_attn.k_proj.weight", NULL},
    {"attn_v.weight", "self_attn.v_proj.weight", NULL},
    {"ssm_g.weight", "self_attn.g_proj.weight", NULL},
    {"attn_gate.weight", "self_attn.g_proj.weight", NULL},
    {"ssm_f_a.weight", "self_attn.f_a_proj.weight", NULL},
    {"ssm_f_b.weight", "self_attn.f_b_proj.weight", NULL},
    {"ssm_beta.weight", "self_attn.b_proj.weight", NULL},
    {"attn_output.weight", "self_attn.o_proj.weight", NULL},
    {"ssm_conv1d_q.weight", "self_attn.q_conv1d.weight", NULL},
    {"ssm_conv1d_k.weight", "self_attn.k_conv1d.weight", NULL},
    {"ssm_conv1d_v.weight", "self_attn.v_conv1d.weight", NULL},
    {"ssm_a", "self_attn.A_log", NULL},
    {"ssm_dt.bias", "self_attn.dt_bias", NULL},
    {"ssm_norm.weight", "self_attn.o_norm.weight", NULL},
    {"attn_q_a.weight", "self_attn.q_a_proj.weight", NULL},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", NULL},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight", NULL},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", NULL},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", NULL},
    {"attn_k_b.weight", "self_attn.kv_b_proj.weight", NULL},
    {"attn_v_b.weight", "self_attn.kv_b_proj.weight", NULL},
    {"ffn_gate.weight", "mlp.gate_proj.weight", NULL},
    {"ffn_up.weight", "mlp.up_proj.weight", NULL},
    {"ffn_down.weight", "mlp.down_proj.weight", NULL},
    {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight", NULL},
    {"exp_probs_b.bias", "block_sparse_moe.gate.e_score_correction_bias", NULL},
    {"ffn_routed_down.weight", "block_sparse_moe.routed_expert_down_proj.weight", NULL},
    {"ffn_routed_norm.weight", "block_sparse_moe.routed_expert_norm.weight", NULL},
    {"ffn_routed_up.weight", "block_sparse_moe.routed_expert_up_proj.weight", NULL},
    {"ffn_gate_shexp.weight", "block_sparse_moe.shared_experts.gate_proj.weight", NULL},
    {"ffn_up_shexp.weight", "block_sparse_moe.shared_experts.up_proj.weight", NULL},
    {"ffn_down_shexp.weight", "block_sparse_moe.shared_experts.down_proj.weight", NULL},
    {"ffn_gate_exps.weight", "w1", NULL},
    {"ffn_up_exps.weight", "w3", NULL},
    {"ffn_down_exps.weight", "w2", NULL},
};

#define PFX "language_model."

/* Compare one GGUF tensor with its source(s); returns the number of HF
 * tensors it accounts for, or -1 on a mismatch (already reported). */
static long check_tensor(const gguf_file *g, const gguf_tensor *t)
{
    char hf[512], hf2[512];
    int layer = -1;
    const char *suffix = t->name;
    if (!strncmp(t->name, "blk.", 4)) {
        layer = atoi(t->name + 4);
        suffix = strchr(t->name + 4, '.') + 1;
    }
    const char *src = NULL, *src2 = NULL;
    int exps = 0;
    if (layer < 0) {
        if (!strcmp(suffix, "token_embd.weight")) src = "model.embed_tokens.weight";
        else if (!strcmp(suffix, "output_norm.weight")) src = "model.norm.weight";
        else if (!strcmp(suffix, "output.weight")) src = "lm_head.weight";
        else if (!strcmp(suffix, "output_res_score.weight"))
            src = "model.output_attn_res_norm.weight", src2 = "model.output_attn_res_proj.weight";
        if (src) snprintf(hf, sizeof hf, PFX "%s", src);
        if (src2) snprintf(hf2, sizeof hf2, PFX "%s", src2);
    } else {
        for (size_t i = 0; i < sizeof name_map / sizeof name_map[0]; i++)
            if (!strcmp(suffix, name_map[i].gg)) {
                src = name_map[i].hf;
                src2 = name_map[i].hf2;
                exps = strstr(suffix, "_exps") != NULL;
            }
        if (src) snprintf(hf, sizeof hf, PFX "model.layers.%d.%s", layer, src);
        if (src2) snprintf(hf2, sizeof hf2, PFX "model.layers.%d.%s", layer, src2);
    }
    if (!src) {
        t_fail(__FILE__, __LINE__, "GGUF tensor %s has no known source", t->name);
        return -1;
    }
    uint8_t *gp = read_at(g->path, t->offset, t->nbytes);
    uint64_t n = 0;
    float *gv = gp ? gg_values(t, gp, &n) : NULL;
    long used = 1, bad = 0;
    if (!gv) {
        t_fail(__FILE__, __LINE__, "%s: cannot read", t->name);
        free(gp);
        return -1;
    }
    if (exps) {
        int64_t cols = t->ne[0], rows = t->ne[1], E = t->ne[2];
        used = 0;
        for (int64_t e = 0; e < E && !bad; e++) {
            char pn[512], sn[512];
            snprintf(pn, sizeof pn, PFX "model.layers.%d.block_sparse_moe.experts.%lld.%s.weight_packed", layer,
                     (long long)e, src);
            snprintf(sn, sizeof sn, PFX "model.layers.%d.block_sparse_moe.experts.%lld.%s.weight_scale", layer,
                     (long long)e, src);
            const st_tensor *pt = NULL, *stt = NULL;
            uint8_t *pk = hf_bytes(pn, &pt), *sc = hf_bytes(sn, &stt);
            if (!pk || !sc || pt->shape[0] != rows || pt->shape[1] * 2 != cols) {
                t_fail(__FILE__, __LINE__, "%s: expert %lld source %s missing or shaped wrong", t->name,
                       (long long)e, pn);
                bad = 1;
            }
            for (int64_t r = 0; r < rows && !bad; r++)
                for (int64_t c = 0; c < cols && !bad; c++) {
                    float want = mxfp4_value(pk + r * (cols / 2), sc + r * (cols / 32), (size_t)c);
                    float got = gv[(e * rows + r) * cols + c];
                    if (!same(got, want, 0)) {
                        t_fail(__FILE__, __LINE__, "%s[%lld][%lld][%lld] = %g, safetensors %g", t->name,
                               (long long)e, (long long)r, (long long)c, (double)got, (double)want);
                        bad = 1;
                    }
                }
            used += 2;
            free(pk);
            free(sc);
        }
    } else {
        const st_tensor *a = NULL, *b = NULL;
        uint8_t *ap = hf_bytes(hf, &a), *bp = src2 ? hf_bytes(hf2, &b) : NULL;
        if (!ap || (src2 && !bp)) {
            t_fail(__FILE__, __LINE__, "%s: source %s missing", t->name, hf);
            bad = 1;
        }
        int neg_exp = !strcmp(suffix, "ssm_a");
        int kb = !strcmp(suffix, "attn_k_b.weight"), vb = !strcmp(suffix, "attn_v_b.weight");
        int64_t H = t->ne[2], dn = 0, dv = 0, Rkv = 0;
        if (!bad && (kb || vb)) {
            /* kv_b [H*(dn+dv), Rkv] split per head: k_b {dn, Rkv, H}, v_b {Rkv, dv, H} */
            Rkv = kb ? t->ne[1] : t->ne[0];
            int64_t per = a->n_dims == 2 && H > 0 ? a->shape[0] / H : 0;
            dn = kb ? t->ne[0] : per - t->ne[1];
            dv = per - dn;
            if (t->n_dims != 3 || a->n_dims != 2 || a->shape[1] != Rkv || per * H != a->shape[0] || dn < 1 ||
                dv < 1) {
                t_fail(__FILE__, __LINE__, "%s: shape does not split kv_b per head", t->name);
                bad = 1;
            }
        }
        if (!bad && !neg_exp && !src2 && !kb && !vb) {
            /* dims reversed, same element count */
            int ok = a->n_dims == t->n_dims;
            for (int d = 0; ok && d < a->n_dims; d++) ok = a->shape[d] == t->ne[t->n_dims - 1 - d];
            if (!ok) {
                t_fail(__FILE__, __LINE__, "%s: ne does not reverse the safetensors shape", t->name);
                bad = 1;
            }
            if (a->dtype == ST_BF16 && a->n_dims >= 2 && t->type != GGML_TYPE_BF16 && t->type != GGML_TYPE_F32) {
                t_fail(__FILE__, __LINE__, "%s: type %u", t->name, t->type);
                bad = 1;
            }
        }
        if (!bad && neg_exp && (t->n_dims != 1 || t->ne[0] > a->shape[0])) {
            t_fail(__FILE__, __LINE__, "%s: shape", t->name);
            bad = 1;
        }
        for (uint64_t i = 0; i < n && !bad; i++) {
            uint64_t si = i;
            if (kb) { /* i = (h*Rkv + j)*dn + r */
                uint64_t r = i % (uint64_t)dn, j = i / (uint64_t)dn % (uint64_t)Rkv, hh = i / (uint64_t)(dn * Rkv);
                si = (hh * (uint64_t)(dn + dv) + r) * (uint64_t)Rkv + j;
            } else if (vb) { /* i = (h*dv + d)*Rkv + j */
                uint64_t j = i % (uint64_t)Rkv, d = i / (uint64_t)Rkv % (uint64_t)dv, hh = i / (uint64_t)(Rkv * dv);
                si = (hh * (uint64_t)(dn + dv) + (uint64_t)dn + d) * (uint64_t)Rkv + j;
            }
            float want = hf_value(a, ap, si);
            if (src2) want = want * hf_value(b, bp, i); /* exact for BF16 x BF16 */
            if (neg_exp) want = (float)-exp((double)want);
            if (!same(gv[i], want, 1)) {
                t_fail(__FILE__, __LINE__, "%s[%llu] = %a, safetensors gives %a", t->name, (unsigned long long)i,
                       (double)gv[i], (double)want);
                bad = 1;
            }
        }
        used = src2 ? 2 : vb ? 0 : 1; /* kv_b counts once, with k_b */
        free(ap);
        free(bp);
    }
    free(gv);
    free(gp);
    return bad ? -1 : used;
}

static void check_generated(const char *name, const char *extra, int f32)
{
    char dir[512], gpath[600], args[1024];
    snprintf(gpath, sizeof gpath, "%s/%s.gguf", test_scratch(), name);
    snprintf(args, sizeof args, "%s --gguf %s%s", extra, gpath, f32 ? " --gguf-f32" : "");
    if (gen_model(name, args, dir, sizeof dir)) return;
    gguf_file g;
    df_error err = {0};
    if (gguf_open(gpath, &g, &err)) {
        t_fail(__FILE__, __LINE__, "%s", err.msg);
        return;
    }
    open_shards(dir);
    size_t n_hf = 0;
    for (int i = 0; i < n_shards; i++) n_hf += shards[i].n_tensors;
    /* metadata */
    const char *s;
    size_t len, cnt = 0;
    uint32_t nl = 0, ne = 0, al = 0;
    int64_t hkv[128];
    TCHECKF(gguf_get_str(&g, "general.architecture", &s, &len, &err) == 0 && len == 7 && !memcmp(s, "kimi-k3", 7),
            "%s", err.msg);
    TCHECKF(gguf_get_u32(&g, "kimi-k3.block_count", &nl, &err) == 0, "%s", err.msg);
    TCHECKF(gguf_get_u32(&g, "kimi-k3.expert_count", &ne, &err) == 0, "%s", err.msg);
    TCHECKF(gguf_get_u32(&g, "general.alignment", &al, &err) == 0 && al == g.alignment, "%s", err.msg);
    TCHECKF(gguf_get_arr_int(&g, "kimi-k3.attention.head_count_kv", hkv, 128, &cnt, &err) == 0 && cnt == nl,
            "%s", err.msg);
    TCHECKF(gguf_get_arr_str(&g, "tokenizer.ggml.tokens", 0, &s, &len, &err) == 0, "%s", err.msg);
    float beta = 0;
    TCHECK(gguf_get_f32(&g, "kimi-k3.activation.situ_beta", &beta, &err) == 0 && beta == 4.0f);
    /* the MLA layers are the ones with a k_b */
    for (size_t l = 0; l < cnt && l < 128; l++) {
        char n[64];
        snprintf(n, sizeof n, "blk.%zu.attn_k_b.weight", l);
        TCHECKF((hkv[l] == 1) == (gguf_find_tensor(&g, n) != NULL), "layer %zu head_count_kv %lld", l,
                (long long)hkv[l]);
    }
    /* every tensor decodes to the safetensors values; every safetensors
     * tensor is used once (g_proj feeds ssm_g or attn_gate) */
    long used = 0;
    int types_ok = 1;
    for (size_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor *t = &g.tensors[i];
        if (f32 && t->type != GGML_TYPE_F32) types_ok = 0;
        if (!f32 && strstr(t->name, "_exps") && t->type != GGML_TYPE_MXFP4) types_ok = 0;
        long u = check_tensor(&g, t);
        if (u < 0) break;
        used += u;
    }
    TCHECKF(types_ok, "%s: unexpected tensor types", name);
    TCHECKF((size_t)used == n_hf, "%s: GGUF tensors cover %ld of %zu safetensors tensors", name, used, n_hf);
    close_shards();
    gguf_deinit(&g);
}

static void test_k3gen_mxfp4(void) { check_generated("gg_tiny", "--preset tiny --seed 5", 0); }
static void test_k3gen_f32(void) { check_generated("gg_tiny_f32", "--preset tiny --seed 5", 1); }
static void test_k3gen_shape(void)
{
    check_generated("gg_shape", "--preset tiny-a-shape --set kda_heads=3 --set kda_head_dim=16", 0);
}

static void test_cleanup(void) { test_scratch_remove(); }

/* deltafin quantize: a Q8_0 trunk file that loads and runs with the same
 * bits on both backends (make llama-oracle checks it against llama.cpp's
 * own output, tensor by tensor); bad input refused by name, and a run that
 * fails midway (a truncated input) leaves neither OUT nor OUT.tmp. */
static void test_quantize_cli(void)
{
    char dir[512], src[600], out[600], tmpf[700], trunc_[600], args[1200];
    snprintf(src, sizeof src, "%s/qsrc.gguf", test_scratch());
    snprintf(out, sizeof out, "%s/qout.gguf", test_scratch());
    snprintf(tmpf, sizeof tmpf, "%s.tmp", out);
    snprintf(trunc_, sizeof trunc_, "%s/qtrunc.gguf", test_scratch());
    snprintf(args, sizeof args, "--preset tiny --set hidden_size=64 --seed 9 --gguf %s", src);
    if (gen_model("qsrc", args, dir, sizeof dir)) return;
    char o_[4096], e_[4096];
    const char *q[] = {build_bin("deltafin"), "quantize", "--trunk", "q8_0", src, out, NULL};
    TCHECKF(t_run(q, o_, sizeof o_, e_, sizeof e_) == 0 && strstr(e_, "to Q8_0"), "%s", e_);
    gguf_file g;
    df_error err = {0};
    TCHECKF(gguf_open(out, &g, &err) == 0, "%s", err.msg);
    int n_q8 = 0, router_kept = 1, experts_kept = 1;
    for (size_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor *t = &g.tensors[i];
        n_q8 += t->type == GGML_TYPE_Q8_0;
        if (strstr(t->name, "ffn_gate_inp")) router_kept &= t->type != GGML_TYPE_Q8_0;
        if (strstr(t->name, "_exps")) experts_kept &= t->type == GGML_TYPE_MXFP4;
    }
    const gguf_kv *ft = gguf_find_kv(&g, "general.file_type");
    uint32_t ftv = 0;
    if (ft) memcpy(&ftv, ft->data, 4);
    TCHECKF(n_q8 > 10 && router_kept && experts_kept && ft && ftv == 7, "q8 %d router %d experts %d file_type %u",
            n_q8, router_kept, experts_kept, ftv);
    gguf_deinit(&g);
    const char *r1[] = {build_bin("deltafin"), "run", "--model", out, "--prompt-ids", "5,9,17,3", "--max-new", "3",
                        "--print-ids", NULL};
    const char *r2[] = {build_bin("deltafin"), "run", "--model", out, "--prompt-ids", "5,9,17,3", "--max-new", "3",
                        "--print-ids", "--backend", "ref", NULL};
    char a1[256], a2[256];
    TCHECKF(t_run(r1, a1, sizeof a1, e_, sizeof e_) == 0, "%s", e_);
    TCHECKF(strstr(e_, "plan:") && strstr(e_, "q8_0") && strstr(e_, "quantized"),
            "the plan line does not say the trunk is quantized: %s", e_);
    TCHECKF(t_run(r2, a2, sizeof a2, e_, sizeof e_) == 0 && !strcmp(a1, a2), "cpu %s vs ref %s", a1, a2);
    /* --experts q8_0: the routed experts requantized from their MXFP4 values, ggml's rounding (the
     * file k3gen --gguf-experts q8_0 writes for the same model: the experts' bytes equal) */
    char kq[600], kdir[512], outq[600];
    snprintf(kq, sizeof kq, "%s/qsrc-k3e.gguf", test_scratch());
    snprintf(outq, sizeof outq, "%s/qout-e.gguf", test_scratch());
    snprintf(args, sizeof args, "--preset tiny --set hidden_size=64 --seed 9 --gguf %s --gguf-experts q8_0", kq);
    const char *qe[] = {build_bin("deltafin"), "quantize", "--trunk", "q8_0", "--experts", "q8_0", src, outq, NULL};
    if (gen_model("qsrc-k3e", args, kdir, sizeof kdir) == 0 && t_run(qe, o_, sizeof o_, e_, sizeof e_) == 0) {
        gguf_file a, b;
        df_error ea = {0}, eb = {0};
        int same = 0, n_exps = 0;
        if (gguf_open(outq, &a, &ea) == 0 && gguf_open(kq, &b, &eb) == 0) {
            size_t na = 0, nb = 0;
            char *fa = t_slurp(outq, &na), *fb = t_slurp(kq, &nb);
            same = fa && fb;
            for (size_t i = 0; i < a.n_tensors; i++) {
                const gguf_tensor *x = &a.tensors[i];
                if (!strstr(x->name, "_exps")) continue;
                const gguf_tensor *y = gguf_find_tensor(&b, x->name);
                n_exps++;
                same &= y && x->type == GGML_TYPE_Q8_0 && y->type == GGML_TYPE_Q8_0 && x->nbytes == y->nbytes &&
                        !memcmp(fa + x->offset, fb + y->offset, x->nbytes);
            }
            free(fa), free(fb);
            gguf_deinit(&a), gguf_deinit(&b);
        }
        TCHECKF(same && n_exps > 0, "--experts q8_0: %d expert tensors, not k3gen's Q8_0 bytes (%s %s)", n_exps, ea.msg,
                eb.msg);
    } else {
        t_fail(__FILE__, __LINE__, "quantize --experts q8_0: %s", e_);
    }
    const char *bad_e[] = {build_bin("deltafin"), "quantize", "--trunk", "q8_0", "--experts", "q4_k", src, out, NULL};
    TCHECKF(t_run(bad_e, NULL, 0, e_, sizeof e_) != 0 && strstr(e_, "--experts q4_k"), "%s", e_);
    /* refusals */
    const char *bad_t[] = {build_bin("deltafin"), "quantize", "--trunk", "q4_0", src, out, NULL};
    TCHECKF(t_run(bad_t, NULL, 0, e_, sizeof e_) != 0 && strstr(e_, "q4_0"), "%s", e_);
    const char *bad_in[] = {build_bin("deltafin"), "quantize", "--trunk", "q8_0", "/nonexistent.gguf", out, NULL};
    TCHECKF(t_run(bad_in, NULL, 0, e_, sizeof e_) != 0 && strstr(e_, "/nonexistent.gguf"), "%s", e_);
    /* a truncated input: the header parses, the data runs out */
    unlink(out);
    size_t n = 0;
    char *bytes = t_slurp(src, &n);
    FILE *f = fopen(trunc_, "wb");
    TCHECK(bytes && f && fwrite(bytes, 1, n - n / 3, f) == n - n / 3);
    if (f) fclose(f);
    free(bytes);
    const char *tq[] = {build_bin("deltafin"), "quantize", "--trunk", "q8_0", trunc_, out, NULL};
    TCHECKF(t_run(tq, NULL, 0, e_, sizeof e_) != 0, "a truncated input was quantized");
    struct stat st;
    TCHECKF(stat(out, &st) != 0 && stat(tmpf, &st) != 0, "a failed quantize left %s or its .tmp", out);
}

static const test_case tests[] = {
    {"gguf_valid", test_valid},
    {"gguf_invalid_named", test_invalid},
    {"gguf_truncated", test_truncated},
    {"gguf_open", test_open},
    {"gguf_k3gen_mxfp4", test_k3gen_mxfp4},
    {"gguf_k3gen_f32", test_k3gen_f32},
    {"gguf_k3gen_shape", test_k3gen_shape},
    {"quantize_cli", test_quantize_cli},
    {"gguf_cleanup", test_cleanup},
};

int main(int argc, char **argv)
{
    quant_init();
    return test_main(tests, NTESTS(tests), argc, argv);
}
