/* qwen3.c - see qwen3.h.  The scalar reference of the Qwen3 forward pass:
 * each row's matrix products, norms, RoPE and attention accumulate in
 * double in index order, so a position's logits depend only on the ids
 * before it, never on how the ids were chunked.  Matrices stay in memory in
 * their file's type (q3mat below); the weight files, a safetensors folder or
 * a GGUF and its splits, are opened by weights.h.  With a kernel table (qwen3_set_kernels) the
 * matrix products, which are nearly all of the work, run as the table's
 * matmul_f32 on float activations (rounded once from the double state):
 * one reduction order on every ISA, so the bits still depend on nothing
 * but the ids.
 */
#define _GNU_SOURCE
#include "qwen3.h"
#include "family.h"
#include "gguf.h"
#include "kernels.h"
#include "json.h"
#include "qblock.h"
#include "quant.h"
#include "safetensors.h"
#include "threadpool.h"
#include "util.h"
#include "weights.h"

#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A matrix [rows][cols] as the file stores it: F32, BF16, F16 or a ggml
 * block format (qblock.h).  Every kernel multiplies by the stored value
 * widened to f32 in the one reduction order of kernels.h, so keeping the
 * file's type changes no bit against widening it at load, and a BF16 model
 * takes half the memory and half the bytes a step reads. */
enum { Q3_F32, Q3_BF16, Q3_F16, Q3_QBLOCK };
typedef struct q3mat {
    int type;
    const qblock_fmt *q;        /* Q3_QBLOCK: its format */
    void *data;
    size_t bytes;               /* of data */
    int rows, cols;
} q3mat;

typedef struct q3_layer {
    float *attn_norm, *q_norm, *k_norm, *ffn_norm;
    q3mat q, k, v, o, gate, up, down;
} q3_layer;

struct qwen3_model {
    qwen3_config c;
    q3mat embed, head;          /* head is embed (the same data) when tied */
    float *norm;
    q3_layer *l;
    int widen;                  /* qwen3_open_f32: every matrix widened to F32 at load */
    double *inv_freq;           /* [head_dim / 2] */
    const kernel_table *kt;     /* the matrix products' kernels, NULL: the double reference */
    threadpool *pool;           /* qwen3_set_threads: the kernel path's products split by rows */
};

/* Ids are evaluated in chunks of up to Q3_ROWS: each layer's weights are
 * read once for the chunk's rows. */
#define Q3_ROWS 32

struct qwen3_state {
    int n_ctx, pos;
    float *k, *v;               /* [layers][n_ctx][kv_heads][head_dim] */
    /* scratch for a chunk of Q3_ROWS positions, [row][dim] */
    double *x, *h, *q, *kk, *vv, *att, *o, *g, *u, *sc;
    float *xf, *yf;             /* a product's input and output rows in float (kernel path) */
    float *wr;                  /* one weight row widened to f32 (the reference path, the embedding) */
};

static int cfg_int(const json_value *r, const char *k, int lo, int *out, const char *path, df_error *err)
{
    int64_t v;
    if (json_get_int(r, k, &v) || v < lo || v > (1 << 24))
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: \"%s\" is missing or out of range", path, k);
    *out = (int)v;
    return 0;
}

static int load_config(const char *dir, qwen3_config *c, df_error *err)
{
    char path[4096], *buf = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (read_small_file(path, &buf, &len, (size_t)1 << 20, err)) return -1;
    json_doc *d = json_parse(buf, len, err);
    free(buf);
    if (!d) {
        df_err_prefix(err, "%s", path);
        return -1;
    }
    const json_value *r = json_root(d), *rp = json_get(r, "rope_parameters");
    const char *mt = json_get_str(r, "model_type");
    int rc = -1, tied = 0;
    memset(c, 0, sizeof *c);
    if (!mt || strcmp(mt, "qwen3")) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: model_type \"%s\" is not qwen3", path, mt ? mt : "(none)");
        goto out;
    }
    if (cfg_int(r, "hidden_size", 1, &c->hidden, path, err) || cfg_int(r, "num_hidden_layers", 1, &c->layers, path, err) ||
        cfg_int(r, "num_attention_heads", 1, &c->heads, path, err) ||
        cfg_int(r, "num_key_value_heads", 1, &c->kv_heads, path, err) ||
        cfg_int(r, "intermediate_size", 1, &c->ffn, path, err) || cfg_int(r, "vocab_size", 1, &c->vocab, path, err))
        goto out;
    if (json_get(r, "head_dim") ? cfg_int(r, "head_dim", 2, &c->head_dim, path, err) : 0) goto out;
    if (!c->head_dim) c->head_dim = c->hidden / c->heads;
    if (c->heads % c->kv_heads || c->head_dim % 2) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: %d heads over %d kv heads, head_dim %d: not a Qwen3 attention", path,
                   c->heads, c->kv_heads, c->head_dim);
        goto out;
    }
    /* no silent defaults for what changes every logit */
    if (json_get_num(r, "rms_norm_eps", &c->eps) || !(c->eps > 0 && c->eps < 1)) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: \"rms_norm_eps\" is missing or out of range", path);
        goto out;
    }
    if ((json_get_num(r, "rope_theta", &c->theta) && (!rp || json_get_num(rp, "rope_theta", &c->theta))) ||
        !(c->theta > 1)) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: \"rope_theta\" is missing or out of range", path);
        goto out;
    }
    if (rp && json_get_str(rp, "rope_type") && strcmp(json_get_str(rp, "rope_type"), "default")) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: rope_type \"%s\" (deltafin implements the default RoPE)", path,
                   json_get_str(rp, "rope_type"));
        goto out;
    }
    const json_value *rs = json_get(r, "rope_scaling");
    if (rs && rs->type != JSON_NULL) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: rope_scaling is set (deltafin implements the default RoPE)", path);
        goto out;
    }
    const char *act = json_get_str(r, "hidden_act");
    if (act && strcmp(act, "silu")) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: hidden_act \"%s\" is not silu", path, act);
        goto out;
    }
    if (!json_get_bool(r, "attention_bias", &tied) && tied) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: attention_bias is true (Qwen3 has none)", path);
        goto out;
    }
    tied = 0;
    json_get_bool(r, "tie_word_embeddings", &tied); /* absent: false, as transformers' default */
    c->tied = tied;
    rc = 0;
out:
    json_free(d);
    return rc;
}

/* The weight files (weights.h) and a descriptor for each, to read from */
typedef struct q3src {
    wset ws;
    int *fd;
} q3src;

static void src_close(q3src *s)
{
    for (int i = 0; s->fd && i < s->ws.n_files; i++)
        if (s->fd[i] >= 0) close(s->fd[i]);
    free(s->fd);
    wset_close(&s->ws);
}

/* opens the files for reading unless size_only */
static int src_open(q3src *s, const char *path, int size_only, df_error *err)
{
    memset(s, 0, sizeof *s);
    if (wset_open(path, NULL, &s->ws, err)) return -1;
    s->fd = xcalloc((size_t)s->ws.n_files, sizeof *s->fd);
    for (int i = 0; i < s->ws.n_files; i++) {
        s->fd[i] = size_only ? -1 : open(wset_path(&s->ws, i), O_RDONLY | O_CLOEXEC);
        if (!size_only && s->fd[i] < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open it", wset_path(&s->ws, i));
    }
    return 0;
}

/* What a tensor is kept as in memory: a vector (in == 0) as F32; a
 * matrix in the file's type (F32, BF16, F16, a ggml block format), or F32
 * when the model widens everything (qwen3_open_f32). */
static size_t kept_bytes(const q3mat *w, size_t n)
{
    switch (w->type) {
    case Q3_F32: return n * 4;
    case Q3_BF16:
    case Q3_F16: return n * 2;
    default: return n / (size_t)w->q->block * (size_t)w->q->bytes;
    }
}

/* n BF16 (bf16) or F16 values at raw widened into new f32 memory; raw is freed */
static float *widen16(uint8_t *raw, size_t n, int bf16)
{
    float *out = xmalloc(n * sizeof *out);
    for (size_t j = 0; j < n; j++) {
        uint16_t h;
        memcpy(&h, raw + 2 * j, 2);
        out[j] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    free(raw);
    return out;
}

/* Tensor `name` of the given shape into dst (see kept_bytes); with
 * size_only nothing is read, dst says the type and bytes. */
static int st_load(const q3src *s, const char *name, int64_t d0, int64_t d1, int widen, int size_only, q3mat *dst,
                   df_error *err)
{
    int i;
    const st_tensor *t = wset_st(&s->ws, name, &i, err);
    if (!t) return -1;
    const char *path = wset_path(&s->ws, i);
    int ok = (d1 ? t->n_dims == 2 && t->shape[1] == d1 : t->n_dims == 1) && t->shape[0] == d0;
    if (!ok)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s has the wrong shape (expected [%lld%s%lld])", path, name,
                          (long long)d0, d1 ? ", " : "", d1 ? (long long)d1 : 0LL);
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %s is %s (deltafin reads F32, BF16 and F16)", path, name,
                          st_dtype_name(t->dtype));
    size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1), es = st_dtype_size(t->dtype);
    int keep = d1 && !widen && t->dtype != ST_F32;
    *dst = (q3mat){.type = keep ? (t->dtype == ST_BF16 ? Q3_BF16 : Q3_F16) : Q3_F32, .rows = (int)d0,
                   .cols = (int)(d1 ? d1 : 1)};
    dst->bytes = kept_bytes(dst, n);
    if (size_only) return 0;
    uint8_t *raw = xmalloc(n * es);
    if (pread(s->fd[i], raw, n * es, (off_t)t->offset) != (ssize_t)(n * es)) {
        free(raw);
        return df_err_set(err, DF_ERR_IO, -1, "%s: reading %s failed", path, name);
    }
    if (keep || t->dtype == ST_F32) {
        dst->data = raw;
        return 0;
    }
    dst->data = widen16(raw, n, t->dtype == ST_BF16);
    return 0;
}

/* A layer's tensors: the field, the safetensors and GGUF names after the
 * layer's prefix, and the shape (rows, row length; 0: a vector), both
 * loaders walk it. */
enum { D_E = 1, D_HD, D_KD, D_F, D_HEAD };
static const struct {
    size_t field;
    const char *hf, *gguf;
    int out, in;
} q3_roster[] = {
    {offsetof(q3_layer, attn_norm), "input_layernorm.weight", "attn_norm.weight", D_E, 0},
    {offsetof(q3_layer, q), "self_attn.q_proj.weight", "attn_q.weight", D_HD, D_E},
    {offsetof(q3_layer, k), "self_attn.k_proj.weight", "attn_k.weight", D_KD, D_E},
    {offsetof(q3_layer, v), "self_attn.v_proj.weight", "attn_v.weight", D_KD, D_E},
    {offsetof(q3_layer, o), "self_attn.o_proj.weight", "attn_output.weight", D_E, D_HD},
    {offsetof(q3_layer, q_norm), "self_attn.q_norm.weight", "attn_q_norm.weight", D_HEAD, 0},
    {offsetof(q3_layer, k_norm), "self_attn.k_norm.weight", "attn_k_norm.weight", D_HEAD, 0},
    {offsetof(q3_layer, ffn_norm), "post_attention_layernorm.weight", "ffn_norm.weight", D_E, 0},
    {offsetof(q3_layer, gate), "mlp.gate_proj.weight", "ffn_gate.weight", D_F, D_E},
    {offsetof(q3_layer, up), "mlp.up_proj.weight", "ffn_up.weight", D_F, D_E},
    {offsetof(q3_layer, down), "mlp.down_proj.weight", "ffn_down.weight", D_E, D_F},
};

static int64_t roster_dim(const qwen3_config *c, int d)
{
    return d == D_E ? c->hidden : d == D_HD ? (int64_t)c->heads * c->head_dim
         : d == D_KD ? (int64_t)c->kv_heads * c->head_dim : d == D_F ? c->ffn : d == D_HEAD ? c->head_dim : 0;
}

/* Loads one tensor by its full name (a safetensors folder's or a GGUF's) */
typedef int (*tensor_loader)(const q3src *src, const char *name, int64_t out, int64_t in, int widen, int size_only,
                             q3mat *dst, df_error *err);

/* Every tensor of the model through `load`, by the names of one format;
 * with size_only nothing is read and *bytes gets what they would take. */
static int load_all(qwen3_model *m, const q3src *src, tensor_loader load, int gguf, int size_only, uint64_t *bytes,
                    df_error *err)
{
    const qwen3_config *c = &m->c;
    q3mat w;
    uint64_t sum = 0;
    if (load(src, gguf ? "token_embd.weight" : "model.embed_tokens.weight", c->vocab, c->hidden, m->widen, size_only,
             &m->embed, err) ||
        load(src, gguf ? "output_norm.weight" : "model.norm.weight", c->hidden, 0, 1, size_only, &w, err))
        return -1;
    m->norm = w.data;
    sum += m->embed.bytes + w.bytes;
    m->l = xcalloc((size_t)c->layers, sizeof *m->l);
    char n[160];
    for (int il = 0; il < c->layers; il++)
        for (size_t r = 0; r < sizeof q3_roster / sizeof q3_roster[0]; r++) {
            snprintf(n, sizeof n, gguf ? "blk.%d.%s" : "model.layers.%d.%s", il, gguf ? q3_roster[r].gguf : q3_roster[r].hf);
            int in = q3_roster[r].in;
            if (load(src, n, roster_dim(c, q3_roster[r].out), roster_dim(c, in), in ? m->widen : 1, size_only, &w, err))
                return -1;
            sum += w.bytes;
            if (in) *(q3mat *)((char *)&m->l[il] + q3_roster[r].field) = w;
            else *(float **)((char *)&m->l[il] + q3_roster[r].field) = w.data;
        }
    if (c->tied) m->head = m->embed;
    else if (load(src, gguf ? "output.weight" : "lm_head.weight", c->vocab, c->hidden, m->widen, size_only, &m->head,
                  err))
        return -1;
    else sum += m->head.bytes;
    if (bytes) *bytes = sum;
    return 0;
}

/* ---- a llama.cpp GGUF (general.architecture "qwen3") ---- */

static int g_u32(const gguf_file *g, const char *key, int lo, int *out, df_error *err)
{
    uint32_t v;
    if (gguf_get_u32(g, key, &v, err)) return -1;
    if (v < (uint32_t)lo || v > (1u << 24)) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s = %u is out of range", g->path, key, v);
    *out = (int)v;
    return 0;
}

/* The configuration from the first file's keys; the tensors that say more
 * (the vocabulary's size, an untied head) are looked up in every split. */
static int gguf_config(const wset *ws, qwen3_config *c, df_error *err)
{
    const gguf_file *g = &ws->gg[0];
    int at;
    const char *arch;
    size_t al;
    memset(c, 0, sizeof *c);
    if (gguf_get_str(g, "general.architecture", &arch, &al, err)) return -1;
    if (al != 5 || memcmp(arch, "qwen3", 5))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: general.architecture \"%.*s\" is not qwen3", g->path,
                          (int)(al > 32 ? 32 : al), arch);
    float eps, theta;
    /* what llama.cpp would default silently (rope.freq_base 10,000; key_length E/H) is required here */
    if (g_u32(g, "qwen3.block_count", 1, &c->layers, err) || g_u32(g, "qwen3.embedding_length", 1, &c->hidden, err) ||
        g_u32(g, "qwen3.feed_forward_length", 1, &c->ffn, err) || g_u32(g, "qwen3.attention.head_count", 1, &c->heads, err) ||
        g_u32(g, "qwen3.attention.head_count_kv", 1, &c->kv_heads, err) ||
        g_u32(g, "qwen3.attention.key_length", 2, &c->head_dim, err) ||
        gguf_get_f32(g, "qwen3.rope.freq_base", &theta, err) ||
        gguf_get_f32(g, "qwen3.attention.layer_norm_rms_epsilon", &eps, err))
        return -1;
    c->theta = theta, c->eps = eps;
    if (c->heads % c->kv_heads || c->head_dim % 2 || !(c->theta > 1) || !(c->eps > 0 && c->eps < 1))
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: not a Qwen3 attention (heads, kv heads, head_dim, theta, eps)",
                          g->path);
    const gguf_tensor *emb = wset_gguf(ws, "token_embd.weight", &at, NULL);
    if (!emb || emb->n_dims != 2) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: no 2-D token_embd.weight", g->path);
    c->vocab = (int)emb->ne[1];
    c->tied = !wset_gguf(ws, "output.weight", &at, NULL);
    if (wset_gguf(ws, "blk.0.attn_qkv.weight", &at, NULL))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: a fused blk.N.attn_qkv.weight is not read yet", g->path);
    return 0;
}

/* GGUF tensor `name` ({in, out} in ggml order: rows of `in` values) into new f32 memory */
static int gguf_load(const q3src *src, const char *name, int64_t out_dim, int64_t in_dim, int widen, int size_only,
                     q3mat *dst, df_error *err)
{
    int file;
    const gguf_tensor *t = wset_gguf(&src->ws, name, &file, err);
    if (!t) return -1;
    const char *path = wset_path(&src->ws, file);
    int ok = in_dim ? t->n_dims == 2 && t->ne[0] == in_dim && t->ne[1] == out_dim : t->n_dims == 1 && t->ne[0] == out_dim;
    if (!ok)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s has the wrong shape (expected {%lld%s%lld})", path, name,
                          (long long)(in_dim ? in_dim : out_dim), in_dim ? ", " : "", in_dim ? (long long)out_dim : 0LL);
    size_t n = (size_t)out_dim * (size_t)(in_dim ? in_dim : 1);
    const qblock_fmt *q = NULL;
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_BF16 &&
        (!(q = qblock_fmt_of_ggml(t->type)) || (in_dim ? in_dim : out_dim) % q->block))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %s has ggml type %u (deltafin reads F32, F16, BF16, %s)",
                          path, name, t->type, qblock_names());
    size_t bytes = q ? n / (size_t)q->block * (size_t)q->bytes : n * (t->type == GGML_TYPE_F32 ? 4 : 2);
    if (bytes != t->nbytes)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s holds %llu bytes, its type and shape say %zu", path, name,
                          (unsigned long long)t->nbytes, bytes);
    int keep = in_dim && !widen && t->type != GGML_TYPE_F32;
    *dst = (q3mat){.type = !keep ? Q3_F32 : q ? Q3_QBLOCK : t->type == GGML_TYPE_BF16 ? Q3_BF16 : Q3_F16, .q = q,
                   .rows = (int)out_dim, .cols = (int)(in_dim ? in_dim : 1)};
    dst->bytes = kept_bytes(dst, n);
    if (size_only) return 0;
    uint8_t *raw = xmalloc(bytes);
    if (pread(src->fd[file], raw, bytes, (off_t)t->offset) != (ssize_t)bytes) {
        free(raw);
        return df_err_set(err, DF_ERR_IO, -1, "%s: reading %s failed", path, name);
    }
    if (keep || t->type == GGML_TYPE_F32) {
        dst->data = raw;
        return 0;
    }
    if (!q) {
        dst->data = widen16(raw, n, t->type == GGML_TYPE_BF16);
        return 0;
    }
    float *o = xmalloc(n * sizeof *o);
    for (size_t j = 0; j < n / (size_t)q->block; j++) q->decode(raw + j * (size_t)q->bytes, o + j * (size_t)q->block);
    free(raw);
    dst->data = o;
    return 0;
}

/* The model at path (a folder or a GGUF) read, or with size_only only
 * sized (*bytes) from its headers. */
static int read_model(const char *path, qwen3_model *m, int size_only, uint64_t *bytes, df_error *err)
{
    struct stat sb;
    int folder = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (folder && load_config(path, &m->c, err)) return -1; /* the config first: it names what the files must hold */
    q3src src;
    int rc = src_open(&src, path, size_only, err);
    if (!rc && !folder && src.ws.format == WSET_GGUF) rc = gguf_config(&src.ws, &m->c, err);
    if (!rc) rc = load_all(m, &src, folder ? st_load : gguf_load, !folder, size_only, bytes, err);
    src_close(&src);
    return rc;
}

static int open_as(const char *dir, int widen, qwen3_model **out, df_error *err)
{
    *out = NULL;
    qwen3_model *m = xcalloc(1, sizeof *m);
    m->widen = widen;
    if (read_model(dir, m, 0, NULL, err)) {
        df_err_prefix(err, "qwen3 %s", dir);
        qwen3_free(m);
        return -1;
    }
    const qwen3_config *c = &m->c;
    m->inv_freq = xmalloc((size_t)(c->head_dim / 2) * sizeof *m->inv_freq);
    for (int i = 0; i < c->head_dim / 2; i++) m->inv_freq[i] = 1.0 / pow(c->theta, 2.0 * i / c->head_dim);
    *out = m;
    return 0;
}

int qwen3_open(const char *dir, qwen3_model **out, df_error *err) { return open_as(dir, 0, out, err); }
int qwen3_open_f32(const char *dir, qwen3_model **out, df_error *err) { return open_as(dir, 1, out, err); }

int qwen3_weight_bytes(const char *path, uint64_t *bytes, df_error *err)
{
    qwen3_model m;
    memset(&m, 0, sizeof m);
    int rc = read_model(path, &m, 1, bytes, err);
    free(m.l);
    if (rc) df_err_prefix(err, "qwen3 %s", path);
    return rc;
}

void qwen3_free(qwen3_model *m)
{
    if (!m) return;
    for (int il = 0; m->l && il < m->c.layers; il++) {
        q3_layer *L = &m->l[il];
        free(L->attn_norm), free(L->q.data), free(L->k.data), free(L->v.data), free(L->o.data), free(L->q_norm);
        free(L->k_norm), free(L->ffn_norm), free(L->gate.data), free(L->up.data), free(L->down.data);
    }
    if (m->head.data != m->embed.data) free(m->head.data);
    free(m->embed.data);
    free(m->norm);
    free(m->l);
    free(m->inv_freq);
    threadpool_free(m->pool);
    free(m);
}

const qwen3_config *qwen3_cfg(const qwen3_model *m) { return &m->c; }

int qwen3_read_config(const char *path, qwen3_config *c, df_error *err)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        wset ws;
        if (wset_open(path, NULL, &ws, err)) return -1;
        int rc = gguf_config(&ws, c, err);
        wset_close(&ws);
        return rc;
    }
    return load_config(path, c, err);
}

size_t qwen3_state_bytes(const qwen3_config *c, int n_ctx)
{
    size_t KD = (size_t)c->kv_heads * (size_t)c->head_dim;
    return 2 * (size_t)c->layers * (size_t)n_ctx * KD * sizeof(float);
}

size_t qwen3_model_bytes(const qwen3_model *m)
{
    const qwen3_config *c = &m->c;
    size_t n = m->embed.bytes + (c->tied ? 0 : m->head.bytes) + (size_t)c->hidden * sizeof(float);
    for (int il = 0; il < c->layers; il++) {
        const q3_layer *L = &m->l[il];
        n += L->q.bytes + L->k.bytes + L->v.bytes + L->o.bytes + L->gate.bytes + L->up.bytes + L->down.bytes;
        n += (2 * (size_t)c->hidden + 2 * (size_t)c->head_dim) * sizeof(float);
    }
    return n;
}

int qwen3_state_new(const qwen3_model *m, int n_ctx, qwen3_state **out, df_error *err)
{
    const qwen3_config *c = &m->c;
    if (n_ctx < 1) return df_err_set(err, DF_ERR_ARG, -1, "qwen3: a context of %d positions", n_ctx);
    qwen3_state *s = xcalloc(1, sizeof *s);
    size_t kv = (size_t)c->layers * (size_t)n_ctx * (size_t)c->kv_heads * (size_t)c->head_dim;
    s->n_ctx = n_ctx;
    s->k = xmalloc(kv * sizeof *s->k);
    s->v = xmalloc(kv * sizeof *s->v);
    size_t E = (size_t)c->hidden, HD = (size_t)c->heads * (size_t)c->head_dim;
    size_t KD = (size_t)c->kv_heads * (size_t)c->head_dim, F = (size_t)c->ffn, R = Q3_ROWS;
    s->x = xmalloc(R * E * sizeof *s->x);
    s->h = xmalloc(R * E * sizeof *s->h);
    s->q = xmalloc(R * HD * sizeof *s->q);
    s->kk = xmalloc(R * KD * sizeof *s->kk);
    s->vv = xmalloc(R * KD * sizeof *s->vv);
    s->att = xmalloc(R * HD * sizeof *s->att);
    s->o = xmalloc(R * E * sizeof *s->o);
    s->g = xmalloc(R * F * sizeof *s->g);
    s->u = xmalloc(R * F * sizeof *s->u);
    s->sc = xmalloc((size_t)n_ctx * sizeof *s->sc);
    size_t widest = E > HD ? E : HD;
    widest = widest > F ? widest : F;
    s->xf = xmalloc(R * widest * sizeof *s->xf);
    s->yf = xmalloc(R * widest * sizeof *s->yf);
    s->wr = xmalloc(widest * sizeof *s->wr);
    *out = s;
    return 0;
}

void qwen3_state_free(qwen3_state *s)
{
    if (!s) return;
    free(s->k), free(s->v), free(s->x), free(s->h), free(s->q), free(s->kk), free(s->vv), free(s->att);
    free(s->o), free(s->g), free(s->u), free(s->sc), free(s->xf), free(s->yf), free(s->wr);
    free(s);
}

int qwen3_state_pos(const qwen3_state *s) { return s->pos; }

void qwen3_truncate(qwen3_state *s, int pos)
{
    if (pos >= 0 && pos < s->pos) s->pos = pos;
}

/* Row r of w as f32: the stored row, or its values widened into tmp
 * (w->cols floats) */
static const float *mat_row(const q3mat *w, int r, float *tmp)
{
    size_t C = (size_t)w->cols;
    switch (w->type) {
    case Q3_F32: return (const float *)w->data + (size_t)r * C;
    case Q3_BF16:
    case Q3_F16: {
        const uint16_t *h = (const uint16_t *)w->data + (size_t)r * C;
        for (size_t c = 0; c < C; c++) tmp[c] = w->type == Q3_BF16 ? bf16_to_f32(h[c]) : f16_to_f32(h[c]);
        return tmp;
    }
    default: {
        size_t nb = C / (size_t)w->q->block;
        const uint8_t *b = (const uint8_t *)w->data + (size_t)r * nb * (size_t)w->q->bytes;
        for (size_t j = 0; j < nb; j++) w->q->decode(b + j * (size_t)w->q->bytes, tmp + j * (size_t)w->q->block);
        return tmp;
    }
    }
}

/* y[o] = sum_i W[o][i] x[i], in index order, in double */
static void matvec(const q3mat *W, const double *x, double *y, float *tmp)
{
    for (int o = 0; o < W->rows; o++) {
        const float *w = mat_row(W, o, tmp);
        double a = 0;
        for (int i = 0; i < W->cols; i++) a += (double)w[i] * x[i];
        y[o] = a;
    }
}

/* Y[t][r0..r1) = W X[t] for the T rows of X (rows cols floats apart; Y's
 * rows w->rows apart) on the kernel table, by the stored type's kernel
 * (each gives the bits of matmul_f32 on the widened values; a row's result
 * depends on nothing but that row) */
static void mat_kernel(const kernel_table *kt, const q3mat *w, const float *x, int T, float *y, size_t ys, int r0,
                       int r1)
{
    size_t C = (size_t)w->cols;
    switch (w->type) {
    case Q3_F32: kt->matmul_f32(w->data, C, w->cols, x, C, T, y, ys, r0, r1); break;
    case Q3_BF16: kt->matmul_bf16(w->data, C, w->cols, x, C, T, y, ys, r0, r1); break;
    case Q3_F16: kt->matmul_f16(w->data, C, w->cols, x, C, T, y, ys, r0, r1); break;
    default:
        if (w->q->ggml_type == GGML_TYPE_Q8_0) kt->matmul_q8_0(w->data, NULL, w->cols, x, C, T, y, ys, r0, r1);
        else kt->matmul_qblock(w->q, w->data, w->cols, x, C, T, y, ys, r0, r1);
    }
}

void qwen3_set_kernels(qwen3_model *m, const kernel_table *kt) { m->kt = kt; }

void qwen3_set_threads(qwen3_model *m, int n_threads)
{
    threadpool_free(m->pool);
    m->pool = n_threads > 1 ? threadpool_new(n_threads) : NULL;
}

typedef struct rows_job {
    const kernel_table *kt;
    const q3mat *w;
    const float *x;
    int T;
    float *y;
    size_t ys;
} rows_job;

static void rows_fn(void *ctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    const rows_job *j = ctx;
    mat_kernel(j->kt, j->w, j->x, j->T, j->y, j->ys, (int)begin, (int)end);
}

/* Y = W X on the kernel table, W's rows over the pool when there is one */
static void mat_rows(const qwen3_model *m, const q3mat *w, const float *x, int T, float *y, size_t ys)
{
    if (!m->pool || w->rows < 128) {
        mat_kernel(m->kt, w, x, T, y, ys, 0, w->rows);
        return;
    }
    rows_job j = {m->kt, w, x, T, y, ys};
    parallel_for(m->pool, (size_t)w->rows, 64, rows_fn, &j);
}

/* Y[t] = W X[t] for T rows (X's rows W->cols apart, Y's W->rows apart) by
 * the model's path: the reference above, or the kernel table on X rounded
 * to float (s->xf), its float results widened into Y; the weights are read
 * once for the T rows */
static void product(const qwen3_model *m, qwen3_state *s, const q3mat *W, const double *x, double *y, int T)
{
    size_t in = (size_t)W->cols, out = (size_t)W->rows;
    if (!m->kt) {
        for (int t = 0; t < T; t++) matvec(W, x + (size_t)t * in, y + (size_t)t * out, s->wr);
        return;
    }
    for (size_t i = 0; i < (size_t)T * in; i++) s->xf[i] = (float)x[i];
    mat_rows(m, W, s->xf, T, s->yf, out);
    for (size_t o = 0; o < (size_t)T * out; o++) y[o] = (double)s->yf[o];
}

static void rmsnorm(const double *x, const float *w, double *y, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (double)w[i];
}

/* NeoX rotate-half: pairs (i, i + D/2) */
static void rope(double *x, int D, int pos, const double *inv_freq)
{
    for (int i = 0; i < D / 2; i++) {
        double a = pos * inv_freq[i], cs = cos(a), sn = sin(a), x1 = x[i], x2 = x[i + D / 2];
        x[i] = x1 * cs - x2 * sn;
        x[i + D / 2] = x2 * cs + x1 * sn;
    }
}

/* Row t's attention (its query q, its output att) over positions 0..pos */
static void attention(const qwen3_model *m, qwen3_state *s, int il, const double *qrow, double *att, int pos)
{
    const qwen3_config *c = &m->c;
    int D = c->head_dim, KV = c->kv_heads, rep = c->heads / c->kv_heads, n = pos + 1;
    const float *K = s->k + (size_t)il * s->n_ctx * KV * D, *V = s->v + (size_t)il * s->n_ctx * KV * D;
    double scale = 1.0 / sqrt((double)D);
    for (int h = 0; h < c->heads; h++) {
        int g = h / rep; /* repeat_kv: query head h reads kv head h / (H / KV) */
        const double *q = qrow + (size_t)h * D;
        double mx = -INFINITY;
        for (int p = 0; p < n; p++) {
            const float *k = K + ((size_t)p * KV + g) * D;
            double a = 0;
            for (int i = 0; i < D; i++) a += q[i] * (double)k[i];
            s->sc[p] = a * scale;
            if (s->sc[p] > mx) mx = s->sc[p];
        }
        double sum = 0;
        for (int p = 0; p < n; p++) sum += (s->sc[p] = exp(s->sc[p] - mx));
        double *o = att + (size_t)h * D;
        for (int i = 0; i < D; i++) o[i] = 0;
        for (int p = 0; p < n; p++) {
            const float *v = V + ((size_t)p * KV + g) * D;
            double w = s->sc[p] / sum;
            for (int i = 0; i < D; i++) o[i] += w * (double)v[i];
        }
    }
}

/* Layer il over the T rows of s->x at positions s->pos .. s->pos + T - 1:
 * each row's operations are those of one row alone, in the same order, so
 * a chunk gives the bits of its ids one at a time */
static void layer(const qwen3_model *m, qwen3_state *s, int il, int T)
{
    const qwen3_config *c = &m->c;
    const q3_layer *L = &m->l[il];
    size_t E = (size_t)c->hidden, D = (size_t)c->head_dim, HD = (size_t)c->heads * D, KD = (size_t)c->kv_heads * D,
           F = (size_t)c->ffn;
    for (int t = 0; t < T; t++) rmsnorm(s->x + t * E, L->attn_norm, s->h + t * E, (int)E, c->eps);
    product(m, s, &L->q, s->h, s->q, T);
    product(m, s, &L->k, s->h, s->kk, T);
    product(m, s, &L->v, s->h, s->vv, T);
    for (int t = 0; t < T; t++) {
        int pos = s->pos + t;
        double *q = s->q + t * HD, *kk = s->kk + t * KD, *vv = s->vv + t * KD;
        /* per head: QK-norm, then RoPE */
        for (int h = 0; h < c->heads; h++) {
            rmsnorm(q + (size_t)h * D, L->q_norm, q + (size_t)h * D, (int)D, c->eps);
            rope(q + (size_t)h * D, (int)D, pos, m->inv_freq);
        }
        for (int h = 0; h < c->kv_heads; h++) {
            rmsnorm(kk + (size_t)h * D, L->k_norm, kk + (size_t)h * D, (int)D, c->eps);
            rope(kk + (size_t)h * D, (int)D, pos, m->inv_freq);
        }
        size_t at = (((size_t)il * s->n_ctx + (size_t)pos) * c->kv_heads) * D;
        for (size_t i = 0; i < KD; i++) s->k[at + i] = (float)kk[i], s->v[at + i] = (float)vv[i];
    }
    /* causal: row t reads positions up to its own, all written above */
    for (int t = 0; t < T; t++) attention(m, s, il, s->q + t * HD, s->att + t * HD, s->pos + t);
    product(m, s, &L->o, s->att, s->o, T);
    for (int t = 0; t < T; t++) {
        double *x = s->x + t * E, *o = s->o + t * E;
        for (size_t i = 0; i < E; i++) x[i] += o[i];
        rmsnorm(x, L->ffn_norm, s->h + t * E, (int)E, c->eps);
    }
    product(m, s, &L->gate, s->h, s->g, T);
    product(m, s, &L->up, s->h, s->u, T);
    for (size_t i = 0; i < (size_t)T * F; i++) s->g[i] = s->g[i] / (1.0 + exp(-s->g[i])) * s->u[i];
    product(m, s, &L->down, s->g, s->o, T);
    for (size_t i = 0; i < (size_t)T * E; i++) s->x[i] += s->o[i];
}

static int eval_rows(const qwen3_model *m, qwen3_state *s, const int32_t *ids, int n, float *logits, int last_only,
                     df_error *err);

int qwen3_eval(const qwen3_model *m, qwen3_state *s, const int32_t *ids, int n, float *logits, df_error *err)
{
    return eval_rows(m, s, ids, n, logits, 0, err);
}

int qwen3_eval_last(const qwen3_model *m, qwen3_state *s, const int32_t *ids, int n, float *last, df_error *err)
{
    if (n < 1) return df_err_set(err, DF_ERR_ARG, -1, "qwen3: no ids to evaluate");
    return eval_rows(m, s, ids, n, last, 1, err);
}

/* The logits of rows [t0, t0 + T) of s->x (final norm, head) into out,
 * rows vocab apart */
static void head_rows(const qwen3_model *m, qwen3_state *s, int t0, int T, float *out)
{
    const qwen3_config *c = &m->c;
    size_t E = (size_t)c->hidden;
    for (int t = 0; t < T; t++) rmsnorm(s->x + (size_t)(t0 + t) * E, m->norm, s->h + (size_t)t * E, (int)E, c->eps);
    if (m->kt) { /* the head straight into the logits rows */
        for (size_t i = 0; i < (size_t)T * E; i++) s->xf[i] = (float)s->h[i];
        mat_rows(m, &m->head, s->xf, T, out, (size_t)c->vocab);
        return;
    }
    for (int t = 0; t < T; t++)
        for (int o = 0; o < c->vocab; o++) {
            const float *w = mat_row(&m->head, o, s->wr);
            const double *h = s->h + (size_t)t * E;
            double a = 0;
            for (size_t i = 0; i < E; i++) a += (double)w[i] * h[i];
            out[(size_t)t * (size_t)c->vocab + (size_t)o] = (float)a;
        }
}

static int eval_rows(const qwen3_model *m, qwen3_state *s, const int32_t *ids, int n, float *logits, int last_only,
                     df_error *err)
{
    const qwen3_config *c = &m->c;
    if (n < 0 || s->pos + n > s->n_ctx)
        return df_err_set(err, DF_ERR_LIMIT, -1, "qwen3: %d positions past %d do not fit a context of %d", n, s->pos,
                          s->n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return df_err_set(err, DF_ERR_ARG, i, "qwen3: id %d is outside the vocabulary (%d)", ids[i], c->vocab);
    size_t E = (size_t)c->hidden;
    for (int t0 = 0; t0 < n; t0 += Q3_ROWS) {
        int T = n - t0 < Q3_ROWS ? n - t0 : Q3_ROWS;
        for (int t = 0; t < T; t++) {
            const float *e = mat_row(&m->embed, ids[t0 + t], s->wr);
            for (size_t i = 0; i < E; i++) s->x[(size_t)t * E + i] = (double)e[i];
        }
        for (int il = 0; il < c->layers; il++) layer(m, s, il, T);
        if (logits && !last_only) head_rows(m, s, 0, T, logits + (size_t)t0 * (size_t)c->vocab);
        if (logits && last_only && t0 + T == n) head_rows(m, s, T - 1, 1, logits);
        s->pos += T;
    }
    return 0;
}

/* ---- the family table (family.h) ------------------------------------ */

static int fam_info(const char *path, df_family_info *fi, df_error *err)
{
    qwen3_config c;
    memset(fi, 0, sizeof *fi);
    if (qwen3_read_config(path, &c, err)) return -1;
    fi->layers = c.layers, fi->hidden = c.hidden, fi->vocab = c.vocab;
    if (qwen3_weight_bytes(path, &fi->weight_bytes, err)) return -1;
    fi->state_per_pos = qwen3_state_bytes(&c, 1);
    snprintf(fi->summary, sizeof fi->summary, "Qwen3, %d layers, %d wide, %s head: %.3f GiB of weights", c.layers,
             c.hidden, c.tied ? "tied" : "untied", (double)fi->weight_bytes / (1u << 30));
    return 0;
}

static int fam_plan(const char *path, const df_family_opts *o, uint64_t *bytes, char *what, size_t n_what,
                    df_error *err)
{
    df_family_info fi;
    if (fam_info(path, &fi, err)) return -1;
    int n_ctx = o->n_ctx > 0 ? o->n_ctx : 4096;
    *bytes = family_bytes(&fi, n_ctx);
    snprintf(what, n_what, "%s and a state of %d positions", fi.summary, n_ctx);
    if (o->mem_budget && *bytes > o->mem_budget)
        return df_err_set(err, DF_ERR_NOMEM, -1, "%s: %.2f GiB (%s) do not fit %.2f GiB", path,
                          (double)*bytes / (1u << 30), what, (double)o->mem_budget / (1u << 30));
    return 0;
}

static int fam_open(const char *path, const df_family_opts *o, df_family_model **out, df_error *err)
{
    /* the products on the kernel table asked for, else the best this CPU
     * has (the same bits on each; qwen3_open alone keeps the scalar
     * reference path) */
    const kernel_table *kt = o->kt ? o->kt : kernels_select(NULL, err);
    qwen3_model *m;
    if (!kt || qwen3_open(path, &m, err)) return -1;
    qwen3_set_kernels(m, kt);
    qwen3_set_threads(m, o->n_threads);
    *out = (df_family_model *)m;
    return 0;
}

static void fam_close(df_family_model *m) { qwen3_free((qwen3_model *)m); }
static int fam_vocab(const df_family_model *m) { return qwen3_cfg((const qwen3_model *)m)->vocab; }

static int fam_state_new(df_family_model *m, int n_ctx, df_family_state **out, df_error *err)
{
    return qwen3_state_new((const qwen3_model *)m, n_ctx, (qwen3_state **)out, err);
}

static void fam_state_free(df_family_state *s) { qwen3_state_free((qwen3_state *)s); }
static int fam_pos(const df_family_state *s) { return qwen3_state_pos((const qwen3_state *)s); }
static int fam_mark(df_family_state *s, df_error *err) { (void)s, (void)err; return 0; } /* a KV cache goes back anywhere */

static int fam_truncate(df_family_state *s, int pos)
{
    qwen3_truncate((qwen3_state *)s, pos);
    return qwen3_state_pos((qwen3_state *)s);
}

static int fam_forward(const df_family_model *m, df_family_state *s, const int32_t *ids, int n, float *logits,
                       int last_only, df_error *err)
{
    if (last_only && n < 1) return df_err_set(err, DF_ERR_ARG, -1, "qwen3: no ids to evaluate");
    return eval_rows((const qwen3_model *)m, (qwen3_state *)s, ids, n, logits, last_only, err);
}

static const char *const qwen3_types[] = {"qwen3", NULL};

const df_family df_family_qwen3 = {
    .name = "qwen3",
    .title = "Qwen3 (dense)",
    .types = qwen3_types,
    .target = 0,
    .info = fam_info,
    .plan = fam_plan,
    .open = fam_open,
    .close = fam_close,
    .vocab = fam_vocab,
    .state_new = fam_state_new,
    .state_free = fam_state_free,
    .pos = fam_pos,
    .mark = fam_mark,
    .truncate = fam_truncate,
    .forward = fam_forward,
};
