/* model.c - K3 config parsing, binding tensors by name, validation.
 *
 * Owns: reading config.json (root "kimi_k3" with a nested text_config, or a
 * flat "kimi_linear" text config), the shard index and every shard header;
 * checking that each tensor K3 needs for each layer kind (the per-layer
 * ones listed in roster.c) exists with the right dtype and shape; mapping
 * the trunk tensors (each tensor's own byte range, read-only, so routed
 * experts are never mapped) and registering the routed experts with the
 * expert_store.  Vision tensors are skipped.
 * Every failure names the file, the tensor or key, and what is wrong.
 * Does not own: the forward pass, sessions, the cache.
 */
#define _GNU_SOURCE
#include "model.h"
#include "expert_remote.h"
#include "json.h"
#include "mathfn.h"
#include "quant.h"
#include "roster.h"
#include "safetensors.h"
#include "util.h"
#include "weights.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PFX "language_model."

/* ---------------------------------------------------------------- config */

static int cfg_int(const json_value *o, const char *key, int lo, int hi, int *out, df_error *err)
{
    const json_value *v = json_get(o, key);
    if (!v) return df_err_set(err, DF_ERR_FORMAT, -1, "config.json: missing key \"%s\"", key);
    if (v->type != JSON_NUMBER || !v->is_int)
        return df_err_set(err, DF_ERR_FORMAT, v->pos, "config.json: \"%s\" must be an integer, found %s", key,
                          v->type == JSON_NUMBER ? "a fraction" : json_type_name(v->type));
    if (v->i < lo || v->i > hi)
        return df_err_set(err, DF_ERR_FORMAT, v->pos, "config.json: \"%s\" = %lld is outside [%d, %d]", key,
                          (long long)v->i, lo, hi);
    *out = (int)v->i;
    return 0;
}

static int cfg_float(const json_value *o, const char *key, double lo, double hi, float *out, df_error *err)
{
    const json_value *v = json_get(o, key);
    if (!v) return df_err_set(err, DF_ERR_FORMAT, -1, "config.json: missing key \"%s\"", key);
    if (v->type != JSON_NUMBER)
        return df_err_set(err, DF_ERR_FORMAT, v->pos, "config.json: \"%s\" must be a number, found %s", key,
                          json_type_name(v->type));
    if (!(v->num >= lo && v->num <= hi))
        return df_err_set(err, DF_ERR_FORMAT, v->pos, "config.json: \"%s\" = %g is outside [%g, %g]", key, v->num,
                          lo, hi);
    *out = (float)v->num;
    return 0;
}

static int cfg_expect_str(const json_value *o, const char *key, const char *want, int required, df_error *err)
{
    const json_value *v = json_get(o, key);
    if (!v) return required ? df_err_set(err, DF_ERR_FORMAT, -1, "config.json: missing key \"%s\"", key) : 0;
    if (v->type != JSON_STRING || strcmp(v->str, want))
        return df_err_set(err, DF_ERR_UNSUPPORTED, v->pos, "config.json: \"%s\" must be \"%s\"", key, want);
    return 0;
}

static int cfg_expect_bool(const json_value *o, const char *key, int want, df_error *err)
{
    const json_value *v = json_get(o, key);
    if (!v) return 0; /* defaults are the K3 values */
    if (v->type != JSON_BOOL || v->b != want)
        return df_err_set(err, DF_ERR_UNSUPPORTED, v->pos, "config.json: \"%s\" must be %s for K3", key,
                          want ? "true" : "false");
    return 0;
}

void k3_config_free(k3_config *c)
{
    if (!c) return;
    free(c->layer_kind);
    free(c->layer_moe);
    c->layer_kind = c->layer_moe = NULL;
}

static int parse_layer_list(const json_value *lac, const char *key, int NL, uint8_t *seen, int kind, uint8_t *kinds,
                            df_error *err)
{
    const json_value *a = json_get(lac, key);
    if (!a || a->type != JSON_ARRAY)
        return df_err_set(err, DF_ERR_FORMAT, a ? a->pos : -1, "config.json: linear_attn_config.%s must be an array",
                          key);
    for (size_t i = 0; i < a->len; i++) {
        const json_value *v = a->items[i];
        if (v->type != JSON_NUMBER || !v->is_int || v->i < 1 || v->i > NL)
            return df_err_set(err, DF_ERR_FORMAT, v->pos,
                              "config.json: linear_attn_config.%s[%zu] is not a 1-based layer number in [1, %d]", key,
                              i, NL);
        int L = (int)v->i - 1;
        if (seen[L])
            return df_err_set(err, DF_ERR_FORMAT, v->pos,
                              "config.json: layer %d (1-based) is listed twice in kda_layers/full_attn_layers", L + 1);
        seen[L] = 1;
        kinds[L] = (uint8_t)kind;
    }
    return 0;
}

int k3_config_check(const k3_config *c, const char *label, df_error *err)
{
    if (c->k > c->E)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: num_experts_per_token %d > num_experts %d", label, c->k, c->E);
    if (c->bos >= c->V || c->eos >= c->V || c->pad >= c->V)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: bos/eos/pad token ids must be < vocab_size %d", label, c->V);
    if (c->Lt % 32 || c->I % 32)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s: routed_expert_hidden_size (%d) and moe_intermediate_size (%d) must be multiples of 32 "
                          "for MXFP4",
                          label, c->Lt, c->I);
    if (c->Hk > c->Dk)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s: linear_attn_config.num_heads %d > head_dim %d (A_log is stored as [head_dim])", label,
                          c->Hk, c->Dk);
    return 0;
}

int k3_config_parse(const char *text, size_t len, k3_config *c, df_error *err)
{
    memset(c, 0, sizeof *c);
    df_error jerr = {0};
    json_doc *doc = json_parse(text, len, &jerr);
    if (!doc) return df_err_set(err, DF_ERR_FORMAT, jerr.pos, "config.json: %s", jerr.msg);
    int rc = -1;
    uint8_t *seen = NULL;
    const json_value *root = json_root(doc), *tc;
    if (root->type != JSON_OBJECT) {
        df_err_set(err, DF_ERR_FORMAT, 0, "config.json: top level is not an object");
        goto done;
    }
    const char *mt = json_get_str(root, "model_type");
    if (mt && !strcmp(mt, "kimi_k3")) {
        tc = json_get(root, "text_config");
        if (!tc || tc->type != JSON_OBJECT) {
            df_err_set(err, DF_ERR_FORMAT, -1, "config.json: model_type kimi_k3 needs a \"text_config\" object");
            goto done;
        }
        int tie;
        if (!json_get_bool(root, "tie_word_embeddings", &tie) && tie) {
            df_err_set(err, DF_ERR_UNSUPPORTED, -1, "config.json: tie_word_embeddings must be false for K3");
            goto done;
        }
    } else if (mt && !strcmp(mt, "kimi_linear")) {
        tc = root;
    } else {
        df_err_set(err, DF_ERR_UNSUPPORTED, -1, "config.json: model_type is %s%s%s, expected \"kimi_k3\"",
                   mt ? "\"" : "", mt ? mt : "missing", mt ? "\"" : "");
        goto done;
    }
    const int BIG = 1 << 24;
    if (cfg_int(tc, "vocab_size", 1, BIG, &c->V, err) || cfg_int(tc, "hidden_size", 1, 1 << 17, &c->h, err) ||
        cfg_int(tc, "num_hidden_layers", 1, 4096, &c->NL, err) ||
        cfg_int(tc, "attn_res_block_size", 1, 4096, &c->B, err) ||
        cfg_int(tc, "num_attention_heads", 1, 4096, &c->Hm, err) ||
        cfg_int(tc, "q_lora_rank", 1, 1 << 16, &c->Rq, err) || cfg_int(tc, "kv_lora_rank", 1, 1 << 16, &c->Rkv, err) ||
        cfg_int(tc, "qk_nope_head_dim", 1, 4096, &c->dn, err) ||
        cfg_int(tc, "qk_rope_head_dim", 0, 4096, &c->dr, err) || cfg_int(tc, "v_head_dim", 1, 4096, &c->dv, err) ||
        cfg_int(tc, "intermediate_size", 1, 1 << 20, &c->Dff, err) ||
        cfg_int(tc, "num_experts", 1, 1 << 16, &c->E, err) ||
        cfg_int(tc, "num_experts_per_token", 1, 1 << 10, &c->k, err) ||
        cfg_int(tc, "num_shared_experts", 0, 64, &c->Ns, err) ||
        cfg_int(tc, "moe_intermediate_size", 1, 1 << 20, &c->I, err) ||
        cfg_int(tc, "routed_expert_hidden_size", 1, 1 << 20, &c->Lt, err) ||
        cfg_int(tc, "first_k_dense_replace", 0, 4096, &c->first_dense, err) ||
        cfg_int(tc, "moe_layer_freq", 1, 4096, &c->moe_freq, err) ||
        cfg_int(tc, "bos_token_id", 0, BIG, &c->bos, err) || cfg_int(tc, "eos_token_id", 0, BIG, &c->eos, err) ||
        cfg_int(tc, "pad_token_id", 0, BIG, &c->pad, err) ||
        cfg_float(tc, "rms_norm_eps", 0.0, 1.0, &c->eps, err) ||
        cfg_float(tc, "activation_situ_beta", 1e-6, 1e6, &c->b1, err) ||
        cfg_float(tc, "activation_situ_linear_beta", 1e-6, 1e6, &c->b2, err) ||
        cfg_float(tc, "routed_scaling_factor", 0.0, 1e6, &c->rsf, err))
        goto done;
    if (json_get(tc, "max_position_embeddings") &&
        cfg_int(tc, "max_position_embeddings", 1, 1 << 30, &c->n_ctx_max, err))
        goto done;
    if (cfg_expect_str(tc, "hidden_act", "situ", 0, err) ||
        cfg_expect_str(tc, "moe_router_activation_func", "sigmoid", 0, err) ||
        cfg_expect_str(tc, "topk_method", "noaux_tc", 0, err) || cfg_expect_bool(tc, "mla_use_nope", 1, err) ||
        cfg_expect_bool(tc, "mla_use_output_gate", 1, err) || cfg_expect_bool(tc, "latent_moe_use_norm", 1, err) ||
        cfg_expect_bool(tc, "moe_renormalize", 1, err))
        goto done;
    int ng = 1, tg = 1, mtp = 0;
    if ((json_get(tc, "num_expert_group") && cfg_int(tc, "num_expert_group", 1, 1, &ng, err)) ||
        (json_get(tc, "topk_group") && cfg_int(tc, "topk_group", 1, 1, &tg, err)) ||
        (json_get(tc, "num_nextn_predict_layers") && cfg_int(tc, "num_nextn_predict_layers", 0, 0, &mtp, err)))
        goto done;
    const json_value *lac = json_get(tc, "linear_attn_config");
    if (!lac || lac->type != JSON_OBJECT) {
        df_err_set(err, DF_ERR_FORMAT, -1, "config.json: missing \"linear_attn_config\" object");
        goto done;
    }
    if (cfg_int(lac, "num_heads", 1, 4096, &c->Hk, err) || cfg_int(lac, "head_dim", 1, 4096, &c->Dk, err) ||
        cfg_int(lac, "short_conv_kernel_size", 1, 64, &c->Wc, err) ||
        cfg_float(lac, "gate_lower_bound", -1e6, 0.0, &c->glb, err) ||
        cfg_expect_bool(lac, "use_full_rank_gate", 1, err))
        goto done;
    if (k3_config_check(c, "config.json", err)) goto done;
    c->P = c->Hk * c->Dk;
    c->layer_kind = xcalloc((size_t)c->NL, 1);
    c->layer_moe = xcalloc((size_t)c->NL, 1);
    seen = xcalloc((size_t)c->NL, 1);
    if (parse_layer_list(lac, "kda_layers", c->NL, seen, LAYER_KDA, c->layer_kind, err) ||
        parse_layer_list(lac, "full_attn_layers", c->NL, seen, LAYER_MLA, c->layer_kind, err))
        goto done;
    for (int L = 0; L < c->NL; L++)
        if (!seen[L]) {
            df_err_set(err, DF_ERR_FORMAT, -1,
                       "config.json: layer %d (1-based) is in neither kda_layers nor full_attn_layers", L + 1);
            goto done;
        }
    for (int L = 0; L < c->NL; L++) c->layer_moe[L] = L >= c->first_dense && L % c->moe_freq == 0;
    /* quantization: inside text_config (K3) or at the root (spec D4) */
    const json_value *q = json_get(tc, "quantization_config");
    if (!q) q = json_get(root, "quantization_config");
    if (q) {
        const char *fmt = json_get_str(q, "format");
        if (fmt && strcmp(fmt, "mxfp4-pack-quantized")) {
            df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                       "config.json: quantization_config.format \"%s\" is not supported (expected mxfp4-pack-quantized)",
                       fmt);
            goto done;
        }
    }
    rc = 0;
done:
    free(seen);
    json_free(doc);
    if (rc) k3_config_free(c);
    return rc;
}

/* ------------------------------------------------------------ tensor index */

typedef struct loader {
    k3_model *eng;
    int cur_layer;      /* the layer being bound (-1 embedding, NL the output head) */
    const wset *ws;     /* the weight files (NULL when synthetic) */
    /* config only (df_plan_model on a config.json): every tensor is made
     * up with the expected shape, BF16 floats and U8 experts as K3 ships,
     * laid out one after another in the one "file" syn_path */
    int synthetic;
    const char *syn_path;
    st_tensor syn;
    uint64_t syn_off;
} loader;

static int is_vision(const char *name)
{
    return !strncmp(name, "vision_tower.", 13) || !strncmp(name, "mm_projector.", 13) ||
           !strncmp(name, PFX "vision_tower.", sizeof PFX + 12) || !strncmp(name, PFX "mm_projector.", sizeof PFX + 12);
}

static const char *shard_path(const loader *ld, int shard)
{
    return ld->synthetic ? ld->syn_path : wset_path(ld->ws, shard);
}

static void fmt_shape(const st_tensor *t, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int d = 0; d < t->n_dims && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Look up a tensor and check its shape (d1 = 0 for a vector) and dtype set. */
static const st_tensor *expect(loader *ld, const char *name, int64_t d0, int64_t d1, int64_t d2, unsigned dtypes,
                               int *shard, df_error *err)
{
    if (ld->synthetic) {
        st_tensor *y = &ld->syn;
        y->dtype = dtypes & (1u << ST_BF16) ? ST_BF16 : dtypes & (1u << ST_U8) ? ST_U8 : ST_F32;
        y->n_dims = d2 ? 3 : d1 ? 2 : 1;
        y->shape[0] = d0, y->shape[1] = d1, y->shape[2] = d2;
        y->nbytes = (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1) * (uint64_t)(d2 ? d2 : 1) * st_dtype_size(y->dtype);
        y->offset = ld->syn_off;
        ld->syn_off += y->nbytes;
        *shard = 0;
        return y;
    }
    const st_tensor *t = wset_st(ld->ws, name, shard, err);
    if (!t) return NULL;
    const char *path = shard_path(ld, *shard);
    if (!((1u << t->dtype) & dtypes)) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s has dtype %s, expected %s", path, name,
                   st_dtype_name(t->dtype),
                   dtypes == (1u << ST_U8) ? "U8" : dtypes == (1u << ST_F32) ? "F32" : "BF16 or F32");
        return NULL;
    }
    int nd = d2 ? 3 : d1 ? 2 : 1;
    int64_t want[3] = {d0, d1, d2};
    int ok = t->n_dims == nd;
    for (int d = 0; ok && d < nd; d++) ok = t->shape[d] == want[d];
    if (!ok) {
        char got[128];
        fmt_shape(t, got, sizeof got);
        if (nd == 1) df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s has shape %s, expected [%lld]", path, name, got, (long long)d0);
        else if (nd == 2)
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s has shape %s, expected [%lld, %lld]", path, name, got,
                       (long long)d0, (long long)d1);
        else
            df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s has shape %s, expected [%lld, %lld, %lld]", path, name,
                       got, (long long)d0, (long long)d1, (long long)d2);
        return NULL;
    }
    return t;
}

#define DT_FLOAT ((1u << ST_BF16) | (1u << ST_F32))

/* Map a trunk matrix's own byte range read-only. */
static int bind_mat(loader *ld, const char *name, int rows, int cols, wmat *out, df_error *err)
{
    int shard;
    const st_tensor *t = expect(ld, name, rows, cols, 0, DT_FLOAT, &shard, err);
    if (!t) return -1;
    enum wtype type = t->dtype == ST_BF16 ? W_BF16 : W_F32;
    uint64_t nbytes = t->nbytes;
    enum wtype what_if = ld->eng->syn_trunk;
    /* a config.json's what-if (plan --trunk): the matrix sized as that type;
     * llama.cpp's Q8_0 conversion keeps the router and rows that are not
     * whole blocks as they are */
    if (ld->synthetic && what_if == W_F16) type = W_F16;
    if (ld->synthetic && what_if == W_Q8_0 && cols % Q8_0_BLOCK == 0 && !strstr(name, "block_sparse_moe.gate.weight")) {
        type = W_Q8_0;
        nbytes = (uint64_t)rows * (uint64_t)(cols / Q8_0_BLOCK) * Q8_0_BYTES;
        ld->syn_off += nbytes - t->nbytes; /* keep offsets as if laid out so */
    }
    return model_map_mat(ld->eng, ld->cur_layer, shard, t->offset, nbytes, type, rows, cols, name, out, err);
}

int model_map_mat(k3_model *eng, int layer, int shard, uint64_t off, uint64_t nbytes, enum wtype type, int rows,
                  int cols, const char *name, wmat *out, df_error *err)
{
    shard_map *sm = &eng->shards[shard];
    const void *data = NULL;
    /* df_plan_model (headers_only): sizes only, nothing mapped */
    if (!eng->headers_only) {
        if (sm->fd < 0) {
            sm->fd = open(sm->path, O_RDONLY | O_CLOEXEC);
            if (sm->fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", sm->path, strerror(errno));
        }
        /* map only this tensor's pages: routed experts share the shards and must
         * never be mapped (they are read into cache slots by expert_store) */
        uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t start = off & ~(page - 1);
        size_t span = (size_t)(off + nbytes - start);
        void *p = mmap(NULL, span ? span : 1, PROT_READ, MAP_SHARED, sm->fd, (off_t)start);
        if (p == MAP_FAILED)
            return df_err_set(err, DF_ERR_IO, -1, "%s: mmap of %s failed: %s", sm->path, name, strerror(errno));
        if (eng->n_maps == eng->cap_maps) {
            eng->cap_maps = eng->cap_maps ? eng->cap_maps * 2 : 64;
            eng->maps = xrealloc(eng->maps, (size_t)eng->cap_maps * sizeof *eng->maps);
        }
        eng->maps[eng->n_maps].base = p;
        eng->maps[eng->n_maps].size = span ? span : 1;
        eng->n_maps++;
        data = (const uint8_t *)p + (off - start);
    }
    eng->trunk_mapped_bytes += nbytes;
    if (layer < 0) {
        eng->embed_bytes = nbytes;
        eng->embed_shard = shard;
        eng->embed_off = off;
    }
    if (eng->n_trunk == eng->cap_trunk) {
        eng->cap_trunk = eng->cap_trunk ? eng->cap_trunk * 2 : 256;
        eng->trunk = xrealloc(eng->trunk, (size_t)eng->cap_trunk * sizeof *eng->trunk);
    }
    eng->trunk[eng->n_trunk++] = (trunk_tensor){.layer = layer, .w = out, .shard = shard,
                                                .off = off, .nbytes = nbytes};
    out->type = type;
    out->data = data;
    out->scales = NULL;
    out->rows = rows;
    out->cols = cols;
    return 0;
}

float *model_own_vec(k3_model *eng, size_t n)
{
    if (eng->n_owned == eng->cap_owned) {
        eng->cap_owned = eng->cap_owned ? eng->cap_owned * 2 : 64;
        eng->owned = xrealloc(eng->owned, (size_t)eng->cap_owned * sizeof *eng->owned);
    }
    float *v = aligned_alloc_zero(n * sizeof(float));
    CHECK(v);
    eng->owned_bytes += align_up(n * sizeof(float), 64);
    eng->owned[eng->n_owned++] = v;
    return v;
}

int model_pread_fd(int fd, uint8_t *dst, size_t n, uint64_t off)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

int model_pread(const char *path, uint8_t *dst, size_t n, uint64_t off, df_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return df_err_set(err, DF_ERR_IO, -1, "%s: cannot open: %s", path, strerror(errno));
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            close(fd);
            return df_err_set(err, DF_ERR_IO, (int64_t)(off + got), "%s: read failed: %s", path,
                              r < 0 ? strerror(errno) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    return 0;
}

/* Read a small vector (or [d0, d1] array) and upcast it to owned f32. */
static float *load_vec(loader *ld, const char *name, int64_t d0, int64_t d1, int64_t d2, unsigned dtypes,
                       df_error *err)
{
    int shard;
    const st_tensor *t = expect(ld, name, d0, d1, d2, dtypes, &shard, err);
    if (!t) return NULL;
    size_t n = (size_t)d0 * (size_t)(d1 ? d1 : 1) * (size_t)(d2 ? d2 : 1);
    uint8_t *raw = xcalloc(t->nbytes ? t->nbytes : 1, 1);
    if (!ld->eng->headers_only && model_pread(shard_path(ld, shard), raw, t->nbytes, t->offset, err)) {
        free(raw);
        return NULL;
    }
    float *v = model_own_vec(ld->eng, n);
    for (size_t i = 0; i < n; i++) v[i] = t->dtype == ST_BF16 ? load_bf16(raw, i) : load_f32(raw, i);
    free(raw);
    return v;
}

static float *nwpw(loader *ld, const char *norm, const char *proj, int h, df_error *err)
{
    float *nw = load_vec(ld, norm, h, 0, 0, DT_FLOAT, err);
    if (!nw) return NULL;
    float *pw = load_vec(ld, proj, 1, h, 0, DT_FLOAT, err);
    if (!pw) return NULL;
    for (int i = 0; i < h; i++) nw[i] = nw[i] * pw[i];
    return nw;
}

static int bind_layer(loader *ld, int il, df_error *err)
{
    k3_model *eng = ld->eng;
    const k3_config *c = &eng->cfg;
    k3_layer *L = &eng->layers[il];
    char n1[256], n2[256];
#define NAME(buf, suffix) (snprintf(buf, sizeof buf, PFX "model.layers.%d.%s", il, suffix), buf)
    L->kind = c->layer_kind[il];
    L->moe = c->layer_moe[il];
    for (int i = 0; i < roster_n; i++) {
        const roster_entry *r = &roster[i];
        if (!roster_applies(r, L->kind, L->moe)) continue;
        if (r->kind == ROSTER_MAT) {
            if (bind_mat(ld, NAME(n1, r->st), roster_dim(c, r->rows), roster_dim(c, r->cols), roster_mat(L, r), err))
                return -1;
            continue;
        }
        int64_t d0 = roster_dim(c, r->st_shape[0]), d1 = roster_dim(c, r->st_shape[1]),
                d2 = roster_dim(c, r->st_shape[2]);
        float **v = roster_vec(L, r);
        if (r->fix == ROSTER_FIX_RES_SCORE) *v = nwpw(ld, NAME(n1, r->st), NAME(n2, r->st2), (int)d0, err);
        else *v = load_vec(ld, NAME(n1, r->st), d0, d1, d2, DT_FLOAT, err);
        if (!*v) return -1;
        if (r->fix == ROSTER_FIX_DECAY)
            for (int hh = 0; hh < c->Hk; hh++) (*v)[hh] = (float)df_exp((double)(*v)[hh]);
    }
    if (!L->moe) return 0;
    /* routed experts: located through header offsets, registered with the store */
    static const char *parts[EX_N] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                                      "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};
    const int64_t shp[EX_N][2] = {{c->I, c->Lt / 2}, {c->I, c->Lt / 32}, {c->Lt, c->I / 2},
                                  {c->Lt, c->I / 32}, {c->I, c->Lt / 2}, {c->I, c->Lt / 32}};
    for (int e = 0; e < c->E; e++) {
        int file = -1;
        for (int p = 0; p < EX_N; p++) {
            char suffix[128];
            snprintf(suffix, sizeof suffix, "block_sparse_moe.experts.%d.%s", e, parts[p]);
            int shard;
            const st_tensor *t = expect(ld, NAME(n1, suffix), shp[p][0], shp[p][1], 0, 1u << ST_U8, &shard, err);
            if (!t) return -1;
            int f = expert_store_add_file(&eng->store, shard_path(ld, shard), err);
            if (f < 0) return -1;
            if (file >= 0 && f != file)
                return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                                  "layer %d expert %d: its tensors are split across shards %s and %s", il, e,
                                  eng->store.paths[file], eng->store.paths[f]);
            file = f;
            expert_store_set(&eng->store, il, e, p, f, t->offset);
        }
    }
    return 0;
#undef NAME
}

void model_layers_alloc(k3_model *eng)
{
    const k3_config *c = &eng->cfg;
    eng->layers = xcalloc((size_t)c->NL, sizeof *eng->layers);
    for (int il = 0; il < c->NL; il++) {
        k3_layer *L = &eng->layers[il];
        L->kda_idx = L->mla_idx = -1;
        if (c->layer_kind[il] == LAYER_KDA) L->kda_idx = eng->n_kda++;
        else L->mla_idx = eng->n_mla++;
    }
}

static int path_join(char *out, size_t n, const char *dir, const char *file, df_error *err)
{
    if ((size_t)snprintf(out, n, "%s/%s", dir, file) >= n)
        return df_err_set(err, DF_ERR_ARG, -1, "path too long: %s/%s", dir, file);
    return 0;
}

int model_load_safetensors(k3_model *eng, const char *dir, df_error *err)
{
    char path[PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    wset ws = {0};
    loader ld = {.eng = eng, .ws = &ws};
    int rc = -1;
    k3_config *c = &eng->cfg;

    if (path_join(path, sizeof path, dir, "config.json", err) ||
        read_small_file(path, &text, &len, 64u << 20, err))
        goto done;
    if (k3_config_parse(text, len, c, err)) {
        df_err_prefix(err, "%s", dir);
        goto done;
    }
    /* the shards (the index's, or one model.safetensors), vision skipped */
    if (wset_open(dir, is_vision, &ws, err)) goto done;
    eng->shards = xcalloc((size_t)ws.n_files + 1, sizeof *eng->shards);
    eng->n_shards = ws.n_files;
    for (int s = 0; s < ws.n_files; s++) {
        eng->shards[s].fd = -1;
        eng->shards[s].path = xstrdup(wset_path(&ws, s));
    }

    /* globals */
    ld.cur_layer = -1;
    if (bind_mat(&ld, PFX "model.embed_tokens.weight", c->V, c->h, &eng->embed, err)) goto done;
    ld.cur_layer = c->NL;
    if (bind_mat(&ld, PFX "lm_head.weight", c->V, c->h, &eng->lm_head, err)) goto done;
    if (!(eng->final_norm = load_vec(&ld, PFX "model.norm.weight", c->h, 0, 0, DT_FLOAT, err))) goto done;
    if (!(eng->out_res_nwpw = nwpw(&ld, PFX "model.output_attn_res_norm.weight",
                                   PFX "model.output_attn_res_proj.weight", c->h, err)))
        goto done;

    expert_store_init(&eng->store, c->NL, c->E, c->I, c->Lt);
    model_layers_alloc(eng);
    for (int il = 0; il < c->NL; il++) {
        ld.cur_layer = il;
        if (bind_layer(&ld, il, err)) goto done;
    }
    /* a streamed install (expert_remote.h): its shards hold the trunk only */
    int stream = expert_remote_detect(dir, err);
    if (stream < 0) goto done;
    eng->from_mirror = stream; /* planned even when only the headers are read (deltafin plan) */
    if (eng->headers_only) stream = 0;
    eng->store.stream = stream;
    if (expert_store_finish(&eng->store, c->layer_moe, eng->io_mode, eng->io_depth, eng->io_backend, err)) goto done;
    if (stream && expert_remote_open(&eng->store, dir, eng->disk_cache_max, err)) goto done;
    rc = 0;
done:
    free(text);
    wset_close(&ws);
    return rc;
}

/* A config.json alone: the model's sizes for the planner (headers_only
 * must be set; nothing is read but the config). */
int model_load_config_only(k3_model *eng, const char *path, df_error *err)
{
    char *text = NULL;
    size_t len = 0;
    k3_config *c = &eng->cfg;
    CHECK(eng->headers_only);
    if (read_small_file(path, &text, &len, 64u << 20, err)) return -1;
    int rc = k3_config_parse(text, len, c, err);
    free(text);
    if (rc) {
        df_err_prefix(err, "%s", path);
        return -1;
    }
    eng->shards = xcalloc(1, sizeof *eng->shards);
    eng->shards[0].fd = -1;
    eng->shards[0].path = xstrdup(path);
    eng->n_shards = 1;
    loader ld = {.eng = eng, .synthetic = 1, .syn_path = eng->shards[0].path};
    ld.cur_layer = -1;
    if (bind_mat(&ld, PFX "model.embed_tokens.weight", c->V, c->h, &eng->embed, err)) return -1;
    ld.cur_layer = c->NL;
    if (bind_mat(&ld, PFX "lm_head.weight", c->V, c->h, &eng->lm_head, err)) return -1;
    if (!(eng->final_norm = load_vec(&ld, PFX "model.norm.weight", c->h, 0, 0, DT_FLOAT, err))) return -1;
    if (!(eng->out_res_nwpw = nwpw(&ld, PFX "model.output_attn_res_norm.weight",
                                   PFX "model.output_attn_res_proj.weight", c->h, err)))
        return -1;
    expert_store_init(&eng->store, c->NL, c->E, c->I, c->Lt);
    model_layers_alloc(eng);
    for (int il = 0; il < c->NL; il++) {
        ld.cur_layer = il;
        if (bind_layer(&ld, il, err)) return -1;
    }
    return 0;
}

void model_unload(k3_model *eng)
{
    for (int s = 0; s < eng->n_shards; s++) {
        shard_map *sm = &eng->shards[s];
        if (sm->fd >= 0) close(sm->fd);
        free(sm->path);
    }
    for (int i = 0; i < eng->n_maps; i++) munmap(eng->maps[i].base, eng->maps[i].size);
    free(eng->maps);
    free(eng->trunk);
    free(eng->shards);
    for (int i = 0; i < eng->n_owned; i++) aligned_free(eng->owned[i]);
    free(eng->owned);
    free(eng->layers);
    expert_store_deinit(&eng->store);
    k3_config_free(&eng->cfg);
}
