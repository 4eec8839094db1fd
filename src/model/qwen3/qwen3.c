/* qwen3.c - see qwen3.h.  The scalar reference of the Qwen3 forward pass:
 * each row's matrix products, norms, RoPE and attention accumulate in
 * double in index order, so a position's logits depend only on the ids
 * before it, never on how the ids were chunked.  Weights are f32 in memory
 * (BF16/F16 widened exactly).  With a kernel table (qwen3_set_kernels) the
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
#include "util.h"

#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct q3_layer {
    float *attn_norm, *q, *k, *v, *o, *q_norm, *k_norm, *ffn_norm, *gate, *up, *down;
} q3_layer;

struct qwen3_model {
    qwen3_config c;
    float *embed, *norm, *head; /* head == embed when tied */
    q3_layer *l;
    double *inv_freq;           /* [head_dim / 2] */
    const kernel_table *kt;     /* the matrix products' kernels, NULL: the double reference */
};

struct qwen3_state {
    int n_ctx, pos;
    float *k, *v;               /* [layers][n_ctx][kv_heads][head_dim] */
    /* scratch for one position */
    double *x, *h, *q, *kk, *vv, *att, *o, *g, *u, *sc;
    float *xf, *yf;             /* a product's input and output rows in float (kernel path) */
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

/* The shard files: model.safetensors, or those the index names */
typedef struct shards {
    st_file *f;
    int *fd;
    int n;
} shards;

static void shards_free(shards *s)
{
    for (int i = 0; i < s->n; i++) {
        if (s->fd[i] >= 0) close(s->fd[i]);
        st_deinit(&s->f[i]);
    }
    free(s->f);
    free(s->fd);
    memset(s, 0, sizeof *s);
}

static int shard_add(shards *s, const char *path, df_error *err)
{
    s->f = xrealloc(s->f, (size_t)(s->n + 1) * sizeof *s->f);
    s->fd = xrealloc(s->fd, (size_t)(s->n + 1) * sizeof *s->fd);
    s->fd[s->n] = -1;
    if (st_open(path, &s->f[s->n], err)) return -1;
    s->fd[s->n] = open(path, O_RDONLY | O_CLOEXEC);
    s->n++;
    if (s->fd[s->n - 1] < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open it", path);
    return 0;
}

static int open_shards(const char *dir, shards *s, df_error *err)
{
    memset(s, 0, sizeof *s);
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (stat(path, &sb) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        return shard_add(s, path, err);
    }
    char *buf;
    size_t len;
    if (read_small_file(path, &buf, &len, (size_t)64 << 20, err)) return -1;
    json_doc *d = json_parse(buf, len, err);
    free(buf);
    if (!d) {
        df_err_prefix(err, "%s", path);
        return -1;
    }
    const json_value *wm = json_get(json_root(d), "weight_map");
    int rc = wm && wm->type == JSON_OBJECT ? 0 : df_err_set(err, DF_ERR_FORMAT, -1, "%s: no weight_map", path);
    for (size_t i = 0; !rc && i < wm->len; i++) {
        const json_value *v = wm->items[i];
        if (v->type != JSON_STRING || strchr(v->str, '/')) {
            rc = df_err_set(err, DF_ERR_FORMAT, v->pos, "%s: weight_map[\"%s\"] is not a file name", path, wm->keys[i]);
            break;
        }
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++) seen = !strcmp(wm->items[j]->str, v->str);
        if (seen) continue;
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/%s", dir, v->str);
        rc = shard_add(s, sp, err);
    }
    json_free(d);
    return rc;
}

/* Tensor `name` of the given shape into new f32 memory */
static float *load_tensor(const shards *s, const char *name, int64_t d0, int64_t d1, df_error *err)
{
    for (int i = 0; i < s->n; i++) {
        const st_tensor *t = st_find(&s->f[i], name);
        if (!t) continue;
        int ok = (d1 ? t->n_dims == 2 && t->shape[1] == d1 : t->n_dims == 1) && t->shape[0] == d0;
        if (!ok) {
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s has the wrong shape (expected [%lld%s%lld])", s->f[i].path, name,
                       (long long)d0, d1 ? ", " : "", d1 ? (long long)d1 : 0LL);
            return NULL;
        }
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
            df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %s is %s (deltafin reads F32, BF16 and F16)", s->f[i].path, name,
                       st_dtype_name(t->dtype));
            return NULL;
        }
        size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1), es = st_dtype_size(t->dtype);
        uint8_t *raw = xmalloc(n * es);
        float *out = xmalloc(n * sizeof *out);
        if (pread(s->fd[i], raw, n * es, (off_t)t->offset) != (ssize_t)(n * es)) {
            free(raw);
            free(out);
            df_err_set(err, DF_ERR_IO, -1, "%s: reading %s failed", s->f[i].path, name);
            return NULL;
        }
        for (size_t j = 0; j < n; j++) {
            uint16_t h;
            if (t->dtype == ST_F32) {
                memcpy(&out[j], raw + 4 * j, 4);
                continue;
            }
            memcpy(&h, raw + 2 * j, 2);
            out[j] = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        free(raw);
        return out;
    }
    df_err_set(err, DF_ERR_FORMAT, -1, "the model has no tensor %s", name);
    return NULL;
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
typedef float *(*tensor_loader)(const void *src, const char *name, int64_t out, int64_t in, df_error *err);

static int load_layers(qwen3_model *m, const void *src, tensor_loader load, int gguf, df_error *err)
{
    const qwen3_config *c = &m->c;
    m->l = xcalloc((size_t)c->layers, sizeof *m->l);
    char n[160];
    for (int il = 0; il < c->layers; il++)
        for (size_t r = 0; r < sizeof q3_roster / sizeof q3_roster[0]; r++) {
            snprintf(n, sizeof n, gguf ? "blk.%d.%s" : "model.layers.%d.%s", il, gguf ? q3_roster[r].gguf : q3_roster[r].hf);
            float *w = load(src, n, roster_dim(c, q3_roster[r].out), roster_dim(c, q3_roster[r].in), err);
            if (!w) return -1;
            *(float **)((char *)&m->l[il] + q3_roster[r].field) = w;
        }
    return 0;
}

static float *st_loader(const void *src, const char *name, int64_t out, int64_t in, df_error *err)
{
    return load_tensor(src, name, out, in, err);
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

static int gguf_config(const gguf_file *g, qwen3_config *c, df_error *err)
{
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
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: no 2-D token_embd.weight", g->path);
    c->vocab = (int)emb->ne[1];
    c->tied = !gguf_find_tensor(g, "output.weight");
    if (gguf_find_tensor(g, "blk.0.attn_qkv.weight"))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: a fused blk.N.attn_qkv.weight is not read yet", g->path);
    return 0;
}

/* GGUF tensor `name` ({in, out} in ggml order: rows of `in` values) into new f32 memory */
static float *gguf_tensor_f32(const gguf_file *g, int fd, const char *name, int64_t out_dim, int64_t in_dim, df_error *err)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: no tensor %s", g->path, name);
        return NULL;
    }
    int ok = in_dim ? t->n_dims == 2 && t->ne[0] == in_dim && t->ne[1] == out_dim : t->n_dims == 1 && t->ne[0] == out_dim;
    if (!ok) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s has the wrong shape (expected {%lld%s%lld})", g->path, name,
                   (long long)(in_dim ? in_dim : out_dim), in_dim ? ", " : "", in_dim ? (long long)out_dim : 0LL);
        return NULL;
    }
    size_t n = (size_t)out_dim * (size_t)(in_dim ? in_dim : 1);
    const qblock_fmt *q = NULL;
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_BF16 &&
        (!(q = qblock_fmt_of_ggml(t->type)) || (in_dim ? in_dim : out_dim) % q->block)) {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %s has ggml type %u (deltafin reads F32, F16, BF16, %s)", g->path,
                   name, t->type, qblock_names());
        return NULL;
    }
    size_t bytes = q ? n / (size_t)q->block * (size_t)q->bytes : n * (t->type == GGML_TYPE_F32 ? 4 : 2);
    if (bytes != t->nbytes) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s holds %llu bytes, its type and shape say %zu", g->path, name,
                   (unsigned long long)t->nbytes, bytes);
        return NULL;
    }
    uint8_t *raw = xmalloc(bytes);
    float *o = xmalloc(n * sizeof *o);
    if (pread(fd, raw, bytes, (off_t)t->offset) != (ssize_t)bytes) {
        free(raw), free(o);
        df_err_set(err, DF_ERR_IO, -1, "%s: reading %s failed", g->path, name);
        return NULL;
    }
    for (size_t j = 0; q && j < n / (size_t)q->block; j++) q->decode(raw + j * (size_t)q->bytes, o + j * (size_t)q->block);
    for (size_t j = 0; !q && j < n; j++) {
        uint16_t h;
        if (t->type == GGML_TYPE_F32) {
            memcpy(&o[j], raw + 4 * j, 4);
            continue;
        }
        memcpy(&h, raw + 2 * j, 2);
        o[j] = t->type == GGML_TYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    free(raw);
    return o;
}

typedef struct {
    const gguf_file *g;
    int fd;
} gguf_src;

static float *gguf_loader(const void *src, const char *name, int64_t out, int64_t in, df_error *err)
{
    const gguf_src *s = src;
    return gguf_tensor_f32(s->g, s->fd, name, out, in, err);
}

static int gguf_weights(qwen3_model *m, const gguf_file *g, int fd, df_error *err)
{
    const qwen3_config *c = &m->c;
    gguf_src src = {g, fd};
    if (!(m->embed = gguf_tensor_f32(g, fd, "token_embd.weight", c->vocab, c->hidden, err)) ||
        !(m->norm = gguf_tensor_f32(g, fd, "output_norm.weight", c->hidden, 0, err)) ||
        load_layers(m, &src, gguf_loader, 1, err))
        return -1;
    m->head = c->tied ? m->embed : gguf_tensor_f32(g, fd, "output.weight", c->vocab, c->hidden, err);
    return m->head ? 0 : -1;
}

static int open_gguf(const char *path, qwen3_model *m, df_error *err)
{
    gguf_file g;
    if (gguf_open(path, &g, err)) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = fd < 0 ? df_err_set(err, DF_ERR_IO, -1, "%s: cannot open it", path) : 0;
    if (!rc) rc = gguf_config(&g, &m->c, err) || gguf_weights(m, &g, fd, err) ? -1 : 0;
    if (fd >= 0) close(fd);
    gguf_deinit(&g);
    return rc;
}

int qwen3_open(const char *dir, qwen3_model **out, df_error *err)
{
    *out = NULL;
    qwen3_model *m = xcalloc(1, sizeof *m);
    shards s = {0};
    struct stat sb;
    int rc;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) {
        rc = open_gguf(dir, m, err);
        goto loaded;
    }
    rc = load_config(dir, &m->c, err) || open_shards(dir, &s, err) ? -1 : 0;
    if (!rc) {
        const qwen3_config *c = &m->c;
        if (!(m->embed = load_tensor(&s, "model.embed_tokens.weight", c->vocab, c->hidden, err)) ||
            !(m->norm = load_tensor(&s, "model.norm.weight", c->hidden, 0, err)) || load_layers(m, &s, st_loader, 0, err))
            rc = -1;
    }
    if (!rc) {
        if (m->c.tied) m->head = m->embed;
        else if (!(m->head = load_tensor(&s, "lm_head.weight", m->c.vocab, m->c.hidden, err))) rc = -1;
    }
    shards_free(&s);
loaded:
    if (rc) {
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

void qwen3_free(qwen3_model *m)
{
    if (!m) return;
    for (int il = 0; m->l && il < m->c.layers; il++) {
        q3_layer *L = &m->l[il];
        free(L->attn_norm), free(L->q), free(L->k), free(L->v), free(L->o), free(L->q_norm), free(L->k_norm);
        free(L->ffn_norm), free(L->gate), free(L->up), free(L->down);
    }
    if (m->head != m->embed) free(m->head);
    free(m->embed);
    free(m->norm);
    free(m->l);
    free(m->inv_freq);
    free(m);
}

const qwen3_config *qwen3_cfg(const qwen3_model *m) { return &m->c; }

int qwen3_read_config(const char *path, qwen3_config *c, df_error *err)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        gguf_file g;
        if (gguf_open(path, &g, err)) return -1;
        int rc = gguf_config(&g, c, err);
        gguf_deinit(&g);
        return rc;
    }
    return load_config(path, c, err);
}

size_t qwen3_bytes(const qwen3_config *c, int n_ctx)
{
    size_t E = (size_t)c->hidden, HD = (size_t)c->heads * (size_t)c->head_dim;
    size_t KD = (size_t)c->kv_heads * (size_t)c->head_dim, F = (size_t)c->ffn, V = (size_t)c->vocab;
    size_t layer = 2 * E + 2 * (size_t)c->head_dim + HD * E * 2 + KD * E * 2 + 3 * F * E;
    size_t weights = (V * E * (c->tied ? 1 : 2) + E + layer * (size_t)c->layers) * sizeof(float);
    size_t kv = 2 * (size_t)c->layers * (size_t)n_ctx * KD * sizeof(float);
    return weights + kv;
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
    size_t KD = (size_t)c->kv_heads * (size_t)c->head_dim, F = (size_t)c->ffn;
    s->x = xmalloc(E * sizeof *s->x);
    s->h = xmalloc(E * sizeof *s->h);
    s->q = xmalloc(HD * sizeof *s->q);
    s->kk = xmalloc(KD * sizeof *s->kk);
    s->vv = xmalloc(KD * sizeof *s->vv);
    s->att = xmalloc(HD * sizeof *s->att);
    s->o = xmalloc(E * sizeof *s->o);
    s->g = xmalloc(F * sizeof *s->g);
    s->u = xmalloc(F * sizeof *s->u);
    s->sc = xmalloc((size_t)n_ctx * sizeof *s->sc);
    size_t widest = E > HD ? E : HD;
    widest = widest > F ? widest : F;
    s->xf = xmalloc(widest * sizeof *s->xf);
    s->yf = xmalloc(widest * sizeof *s->yf);
    *out = s;
    return 0;
}

void qwen3_state_free(qwen3_state *s)
{
    if (!s) return;
    free(s->k), free(s->v), free(s->x), free(s->h), free(s->q), free(s->kk), free(s->vv), free(s->att);
    free(s->o), free(s->g), free(s->u), free(s->sc), free(s->xf), free(s->yf);
    free(s);
}

int qwen3_state_pos(const qwen3_state *s) { return s->pos; }

void qwen3_truncate(qwen3_state *s, int pos)
{
    if (pos >= 0 && pos < s->pos) s->pos = pos;
}

/* y[o] = sum_i W[o][i] x[i], in index order, in double */
static void matvec(const float *W, const double *x, double *y, int out, int in)
{
    for (int o = 0; o < out; o++) {
        const float *w = W + (size_t)o * (size_t)in;
        double a = 0;
        for (int i = 0; i < in; i++) a += (double)w[i] * x[i];
        y[o] = a;
    }
}

void qwen3_set_kernels(qwen3_model *m, const kernel_table *kt) { m->kt = kt; }

/* y = W x by the model's path: the reference above, or the kernel table on
 * x rounded to float (s->xf), its float results widened into y */
static void product(const qwen3_model *m, qwen3_state *s, const float *W, const double *x, double *y, int out, int in)
{
    if (!m->kt) {
        matvec(W, x, y, out, in);
        return;
    }
    for (int i = 0; i < in; i++) s->xf[i] = (float)x[i];
    m->kt->matmul_f32(W, (size_t)in, in, s->xf, (size_t)in, 1, s->yf, (size_t)out, 0, out);
    for (int o = 0; o < out; o++) y[o] = (double)s->yf[o];
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

static void attention(const qwen3_model *m, qwen3_state *s, int il)
{
    const qwen3_config *c = &m->c;
    int D = c->head_dim, KV = c->kv_heads, rep = c->heads / c->kv_heads, n = s->pos + 1;
    const float *K = s->k + (size_t)il * s->n_ctx * KV * D, *V = s->v + (size_t)il * s->n_ctx * KV * D;
    double scale = 1.0 / sqrt((double)D);
    for (int h = 0; h < c->heads; h++) {
        int g = h / rep; /* repeat_kv: query head h reads kv head h / (H / KV) */
        const double *q = s->q + (size_t)h * D;
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
        double *o = s->att + (size_t)h * D;
        for (int i = 0; i < D; i++) o[i] = 0;
        for (int p = 0; p < n; p++) {
            const float *v = V + ((size_t)p * KV + g) * D;
            double w = s->sc[p] / sum;
            for (int i = 0; i < D; i++) o[i] += w * (double)v[i];
        }
    }
}

static void layer(const qwen3_model *m, qwen3_state *s, int il)
{
    const qwen3_config *c = &m->c;
    const q3_layer *L = &m->l[il];
    int E = c->hidden, D = c->head_dim, HD = c->heads * D, KD = c->kv_heads * D, F = c->ffn;
    rmsnorm(s->x, L->attn_norm, s->h, E, c->eps);
    product(m, s, L->q, s->h, s->q, HD, E);
    product(m, s, L->k, s->h, s->kk, KD, E);
    product(m, s, L->v, s->h, s->vv, KD, E);
    /* per head: QK-norm, then RoPE */
    for (int h = 0; h < c->heads; h++) {
        rmsnorm(s->q + (size_t)h * D, L->q_norm, s->q + (size_t)h * D, D, c->eps);
        rope(s->q + (size_t)h * D, D, s->pos, m->inv_freq);
    }
    size_t at = (((size_t)il * s->n_ctx + (size_t)s->pos) * c->kv_heads) * D;
    for (int h = 0; h < c->kv_heads; h++) {
        rmsnorm(s->kk + (size_t)h * D, L->k_norm, s->kk + (size_t)h * D, D, c->eps);
        rope(s->kk + (size_t)h * D, D, s->pos, m->inv_freq);
    }
    for (int i = 0; i < KD; i++) s->k[at + i] = (float)s->kk[i], s->v[at + i] = (float)s->vv[i];
    attention(m, s, il);
    product(m, s, L->o, s->att, s->o, E, HD);
    for (int i = 0; i < E; i++) s->x[i] += s->o[i];
    rmsnorm(s->x, L->ffn_norm, s->h, E, c->eps);
    product(m, s, L->gate, s->h, s->g, F, E);
    product(m, s, L->up, s->h, s->u, F, E);
    for (int i = 0; i < F; i++) s->g[i] = s->g[i] / (1.0 + exp(-s->g[i])) * s->u[i];
    product(m, s, L->down, s->g, s->o, E, F);
    for (int i = 0; i < E; i++) s->x[i] += s->o[i];
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
    for (int t = 0; t < n; t++) {
        const float *e = m->embed + (size_t)ids[t] * (size_t)c->hidden;
        for (int i = 0; i < c->hidden; i++) s->x[i] = (double)e[i];
        for (int il = 0; il < c->layers; il++) layer(m, s, il);
        if (logits && (!last_only || t == n - 1)) {
            rmsnorm(s->x, m->norm, s->h, c->hidden, c->eps);
            float *row = logits + (last_only ? 0 : (size_t)t * (size_t)c->vocab);
            if (m->kt) { /* the head straight into the logits row */
                for (int i = 0; i < c->hidden; i++) s->xf[i] = (float)s->h[i];
                m->kt->matmul_f32(m->head, (size_t)c->hidden, c->hidden, s->xf, (size_t)c->hidden, 1, row,
                                  (size_t)c->vocab, 0, c->vocab);
                s->pos++;
                continue;
            }
            for (int o = 0; o < c->vocab; o++) {
                const float *w = m->head + (size_t)o * (size_t)c->hidden;
                double a = 0;
                for (int i = 0; i < c->hidden; i++) a += (double)w[i] * s->h[i];
                row[o] = (float)a;
            }
        }
        s->pos++;
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
    fi->weight_bytes = qwen3_bytes(&c, 0);
    fi->state_per_pos = qwen3_bytes(&c, 1) - fi->weight_bytes;
    snprintf(fi->summary, sizeof fi->summary, "Qwen3, %d layers, %d wide, %s head: f32 weights", c.layers, c.hidden,
             c.tied ? "tied" : "untied");
    return 0;
}

static int fam_open(const char *path, const kernel_table *kt, df_family_model **out, df_error *err)
{
    qwen3_model *m;
    if (qwen3_open(path, &m, err)) return -1;
    qwen3_set_kernels(m, kt);
    *out = (df_family_model *)m;
    return 0;
}

static void fam_close(df_family_model *m) { qwen3_free((qwen3_model *)m); }
static int fam_vocab(const df_family_model *m) { return qwen3_cfg((const qwen3_model *)m)->vocab; }

static int fam_state_new(const df_family_model *m, int n_ctx, df_family_state **out, df_error *err)
{
    return qwen3_state_new((const qwen3_model *)m, n_ctx, (qwen3_state **)out, err);
}

static void fam_state_free(df_family_state *s) { qwen3_state_free((qwen3_state *)s); }
static int fam_pos(const df_family_state *s) { return qwen3_state_pos((const qwen3_state *)s); }
static void fam_truncate(df_family_state *s, int pos) { qwen3_truncate((qwen3_state *)s, pos); }

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
    .engine = 0,
    .info = fam_info,
    .open = fam_open,
    .close = fam_close,
    .vocab = fam_vocab,
    .state_new = fam_state_new,
    .state_free = fam_state_free,
    .pos = fam_pos,
    .truncate = fam_truncate,
    .forward = fam_forward,
};
