/* model_gguf.c - the K3 model from one llama.cpp "kimi-k3" GGUF file.
 *
 * Owns: reading K3's hyper-parameters from the kimi-k3.* metadata keys and
 * binding llama.cpp's tensor names (the per-layer ones from roster.c's
 * table) onto the same engine model that model.c builds from the
 * safetensors release, undoing llama.cpp's conversions:
 *   - dims are ne[0]-first: a Linear [out, in] is ne {in, out}, same bytes;
 *   - layer kind: attention.head_count_kv[l] == 0 marks a KDA layer; the
 *     KDA and MLA head counts come from attention.head_count (scalar, or
 *     per layer; llama.cpp itself only runs files where they are equal);
 *   - {attn,ffn,output}_res_score = res_norm * res_proj (what the engine
 *     keeps anyway), ssm_a = -exp(A_log) (the engine keeps exp(A_log) as
 *     f32), conv taps ne {Wc, 1, P[, 1]}, MLA kv_b fused (attn_kv_b) or
 *     split per head (attn_k_b ne {dn, Rkv, H} transposed, attn_v_b ne
 *     {Rkv, dv, H}), used in place through strides;
 *   - routed experts: ffn_{gate,down,up}_exps are 3-D tensors, ggml MXFP4
 *     as K3 ships them or requantized (any block format of qblock.h, or
 *     F32/F16/BF16; each layer's pieces in types of their own); expert e
 *     is slice e of each, three pieces the expert_store reads directly
 *     (aligned, O_DIRECT) into a cache slot, where the kernels read the
 *     blocks as stored, so the file is never converted.
 * A model split by llama.cpp's gguf-split (PREFIX-00001-of-0000N.gguf, the
 * metadata in the first file, each tensor whole in one file) is opened from
 * its first file; every split is one shard, and an expert's three pieces
 * may lie in different ones.
 * Trunk matrices are F32, BF16, F16 or a block format of qblock.h (mapped,
 * or streamed like the safetensors trunk); small vectors are F32, BF16 or
 * F16.  Other ggml types are refused with the tensor's name and the list of
 * those read.  Every failure names the file, the key or tensor, and
 * what is wrong.  The GGUF's vocabulary is read by tokenizer.c.
 * Does not own: GGUF parsing (gguf.c), the forward pass.
 */
#define _GNU_SOURCE
#include "gguf.h"
#include "model.h"
#include "qblock.h"
#include "quant.h"
#include "roster.h"
#include "util.h"
#include "weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define A "kimi-k3."

typedef struct gload {
    k3_model *eng;
    const wset *ws;     /* the file and its splits (weights.h) */
    const gguf_file *g; /* the first file, which holds the metadata */
    int n_files;
    int layer;
    int *store_file;    /* [n_files] expert_store file index */
    int at;             /* file of the tensor gfind found last */
} gload;

/* A tensor by name in whichever split holds it (sets gl->at). */
static const gguf_tensor *find_any(gload *gl, const char *name) { return wset_gguf(gl->ws, name, &gl->at, NULL); }

static const char *type_name(uint32_t type)
{
    const char *n = NULL;
    uint32_t b, by;
    return gguf_type_info(type, &n, &b, &by) && n ? n : "unknown";
}

enum { T_F32 = 1u << 0, T_F16 = 1u << 1, T_BF16 = 1u << 2, T_MXFP4 = 1u << 3, T_Q8_0 = 1u << 4, T_QB = 1u << 5 };
/* trunk matrices: through the kernels, or by element (MLA's kv_b); T_QB:
 * the other block formats of qblock.h */
#define T_TRUNK (T_F32 | T_BF16 | T_F16 | T_Q8_0 | T_QB)
/* routed experts: MXFP4 as K3 ships them, or requantized into any of the others */
#define T_EXPERT (T_TRUNK | T_MXFP4)

static unsigned type_bit(uint32_t t)
{
    switch (t) {
    case GGML_TYPE_F32: return T_F32;
    case GGML_TYPE_F16: return T_F16;
    case GGML_TYPE_BF16: return T_BF16;
    case GGML_TYPE_MXFP4: return T_MXFP4;
    case GGML_TYPE_Q8_0: return T_Q8_0;
    default: return qblock_fmt_of_ggml(t) ? T_QB : 0;
    }
}

/* Find a tensor with dims ne[0..nd) (missing dims are 1 on both sides) and
 * one of the allowed types; NULL with a message naming it otherwise. */
static const gguf_tensor *gfind(gload *gl, const char *name, int nd, const int64_t *ne, unsigned types,
                                df_error *err)
{
    const gguf_tensor *t = find_any(gl, name);
    if (!t) {
        df_err_set(err, DF_ERR_FORMAT, -1, "%s: tensor %s is missing%s", gl->g->path, name,
                   gl->n_files > 1 ? " (from every split)" : "");
        return NULL;
    }
    const char *path = wset_path(gl->ws, gl->at);
    int ok = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) ok &= t->ne[d] == (d < nd ? ne[d] : 1);
    if (!ok) {
        df_err_set(err, DF_ERR_FORMAT, (int64_t)t->info_pos,
                   "%s: tensor %s has ne {%lld, %lld, %lld, %lld}, expected {%lld, %lld, %lld}", path, name,
                   (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                   (long long)ne[0], (long long)(nd > 1 ? ne[1] : 1), (long long)(nd > 2 ? ne[2] : 1));
        return NULL;
    }
    if (!(type_bit(t->type) & types)) {
        char list[160] = "";
        static const struct {
            unsigned bit;
            const char *name;
        } names[] = {{T_F32, "F32"}, {T_BF16, "BF16"}, {T_F16, "F16"}, {T_Q8_0, "Q8_0"}, {T_MXFP4, "MXFP4"}};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (types & names[i].bit)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? ", " : "", names[i].name);
        if (types & T_QB) /* Q8_0 is among them */
            snprintf(list + strlen(list), sizeof list - strlen(list), ", %s", strchr(qblock_names(), ' ') + 1);
        df_err_set(err, DF_ERR_UNSUPPORTED, (int64_t)t->info_pos, "%s: tensor %s is %s; deltafin reads it as one of %s",
                   path, name, type_name(t->type), list);
        return NULL;
    }
    return t;
}

enum wtype model_wtype_of_ggml(uint32_t t)
{
    return t == GGML_TYPE_BF16 ? W_BF16 : t == GGML_TYPE_F16 ? W_F16 : t == GGML_TYPE_Q8_0 ? W_Q8_0
           : t == GGML_TYPE_F32 ? W_F32 : W_QB;
}

/* map a trunk tensor of any type gfind allowed, its block format kept */
static int map_typed(gload *gl, int file, const gguf_tensor *t, int rows, int cols, const char *name, wmat *out,
                     df_error *err)
{
    const qblock_fmt *f = qblock_fmt_of_ggml(t->type);
    if (f && cols % f->block)
        return df_err_set(err, DF_ERR_FORMAT, (int64_t)t->info_pos, "%s: tensor %s is %s with rows of %d values, "
                          "not whole blocks of %d", wset_path(gl->ws, file), name, f->name, cols, f->block);
    if (model_map_mat(gl->eng, gl->layer, file, t->offset, t->nbytes, model_wtype_of_ggml(t->type), rows, cols, name, out, err))
        return -1;
    out->qb = model_wtype_of_ggml(t->type) == W_QB ? f : NULL;
    return 0;
}

/* A [rows, cols] trunk matrix of one of `types`: ne {cols, rows}. */
static int gmat_t(gload *gl, const char *name, int rows, int cols, unsigned types, wmat *out, df_error *err)
{
    int64_t ne[2] = {cols, rows};
    const gguf_tensor *t = gfind(gl, name, 2, ne, types, err);
    if (!t) return -1;
    return map_typed(gl, gl->at, t, rows, cols, name, out, err);
}

static int gmat(gload *gl, const char *name, int rows, int cols, wmat *out, df_error *err)
{
    return gmat_t(gl, name, rows, cols, T_TRUNK, out, err);
}

/* A small tensor of ne {n0, n1, n2} upcast to owned f32 (same element order). */
static float *gvec(gload *gl, const char *name, int64_t n0, int64_t n1, int64_t n2, df_error *err)
{
    int64_t ne[3] = {n0, n1, n2};
    const gguf_tensor *t = gfind(gl, name, 3, ne, T_F32 | T_BF16 | T_F16, err);
    if (!t) return NULL;
    size_t n = (size_t)(n0 * n1 * n2);
    uint8_t *raw = xcalloc(t->nbytes ? (size_t)t->nbytes : 1, 1);
    if (!gl->eng->headers_only && model_pread(wset_path(gl->ws, gl->at), raw, (size_t)t->nbytes, t->offset, err)) {
        free(raw);
        return NULL;
    }
    float *v = model_own_vec(gl->eng, n);
    for (size_t i = 0; i < n; i++) {
        if (t->type == GGML_TYPE_F32) v[i] = load_f32(raw, i);
        else if (t->type == GGML_TYPE_BF16) v[i] = load_bf16(raw, i);
        else v[i] = load_f16(raw, i);
    }
    free(raw);
    return v;
}

/* ------------------------------------------------------------- metadata */

static int get_int(const gguf_file *g, const char *key, int lo, int hi, int optional, int def, int *out, df_error *err)
{
    if (!gguf_find_kv(g, key)) {
        if (optional) {
            *out = def;
            return 0;
        }
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: metadata key %s is missing", g->path, key);
    }
    uint64_t v;
    if (gguf_get_u64(g, key, &v, err)) return -1;
    if (v < (uint64_t)lo || v > (uint64_t)hi)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s = %llu is outside [%d, %d]", g->path, key,
                          (unsigned long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

static int get_float(const gguf_file *g, const char *key, double lo, double hi, int optional, float def, float *out,
                     df_error *err)
{
    if (!gguf_find_kv(g, key)) {
        if (optional) {
            *out = def;
            return 0;
        }
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: metadata key %s is missing", g->path, key);
    }
    if (gguf_get_f32(g, key, out, err)) return -1;
    if (!(*out >= lo && *out <= hi))
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s = %g is outside [%g, %g]", g->path, key, (double)*out, lo, hi);
    return 0;
}

/* A key that may be one value or one per layer: out[0..NL). */
static int get_per_layer(const gguf_file *g, const char *key, int NL, int64_t *out, df_error *err)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return df_err_set(err, DF_ERR_FORMAT, -1, "%s: metadata key %s is missing", g->path, key);
    if (kv->type != GGUF_KV_ARRAY) {
        uint64_t v;
        if (gguf_get_u64(g, key, &v, err)) return -1;
        for (int l = 0; l < NL; l++) out[l] = (int64_t)v;
        return 0;
    }
    size_t n = 0;
    if (gguf_get_arr_int(g, key, out, (size_t)NL, &n, err)) return -1;
    if (n != (size_t)NL)
        return df_err_set(err, DF_ERR_FORMAT, (int64_t)kv->pos, "%s: %s has %zu entries for %d layers", g->path, key, n,
                          NL);
    return 0;
}

/* One value for all layers l with kind[l] == want. */
static int same_for(const gguf_file *g, const char *key, const int64_t *v, const uint8_t *kind, int want, int NL, int *out,
                    df_error *err)
{
    int have = 0;
    for (int l = 0; l < NL; l++) {
        if (kind[l] != want) continue;
        if (v[l] < 1 || v[l] > 4096)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s[%d] = %lld is outside [1, 4096]", g->path, key, l,
                              (long long)v[l]);
        if (have && v[l] != *out)
            return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %s differs between layers of one kind (%d and %lld)",
                              g->path, key, *out, (long long)v[l]);
        *out = (int)v[l];
        have = 1;
    }
    if (!have) *out = 1;
    return 0;
}

int k3_config_from_gguf(const gguf_file *g, k3_config *c, df_error *err)
{
    memset(c, 0, sizeof *c);
    const char *arch;
    size_t alen;
    if (gguf_get_str(g, "general.architecture", &arch, &alen, err)) return -1;
    if (alen != 7 || memcmp(arch, "kimi-k3", 7))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: general.architecture is \"%.*s\"; deltafin runs kimi-k3",
                          g->path, (int)(alen > 64 ? 64 : alen), arch);
    const int BIG = 1 << 24;
    if (get_int(g, A "embedding_length", 1, 1 << 17, 0, 0, &c->h, err) ||
        get_int(g, A "block_count", 1, 2048, 0, 0, &c->NL, err) ||
        get_int(g, A "attn_res.block_size", 1, 4096, 0, 0, &c->B, err) ||
        get_int(g, A "attention.q_lora_rank", 1, 1 << 16, 0, 0, &c->Rq, err) ||
        get_int(g, A "attention.kv_lora_rank", 1, 1 << 16, 0, 0, &c->Rkv, err) ||
        get_int(g, A "rope.dimension_count", 0, 4096, 1, 0, &c->dr, err) ||
        get_int(g, A "attention.value_length_mla", 1, 4096, 0, 0, &c->dv, err) ||
        get_int(g, A "expert_count", 1, 1 << 16, 0, 0, &c->E, err) ||
        get_int(g, A "expert_used_count", 1, 1 << 10, 0, 0, &c->k, err) ||
        get_int(g, A "expert_shared_count", 0, 64, 0, 0, &c->Ns, err) ||
        get_int(g, A "expert_latent_length", 1, 1 << 20, 0, 0, &c->Lt, err) ||
        get_int(g, A "leading_dense_block_count", 0, 4096, 1, 0, &c->first_dense, err) ||
        get_int(g, A "kda.head_dim", 1, 4096, 0, 0, &c->Dk, err) ||
        get_int(g, A "ssm.conv_kernel", 1, 64, 0, 0, &c->Wc, err) ||
        get_int(g, "tokenizer.ggml.bos_token_id", 0, BIG, 1, 0, &c->bos, err) ||
        get_int(g, "tokenizer.ggml.eos_token_id", 0, BIG, 1, 0, &c->eos, err) ||
        get_int(g, "tokenizer.ggml.padding_token_id", 0, BIG, 1, 0, &c->pad, err) ||
        get_int(g, A "context_length", 1, 1 << 30, 1, 0, &c->n_ctx_max, err) ||
        get_float(g, A "attention.layer_norm_rms_epsilon", 0.0, 1.0, 0, 0, &c->eps, err) ||
        get_float(g, A "activation.situ_beta", 1e-6, 1e6, 0, 0, &c->b1, err) ||
        get_float(g, A "activation.situ_linear_beta", 1e-6, 1e6, 0, 0, &c->b2, err) ||
        get_float(g, A "expert_weights_scale", 0.0, 1e6, 1, 1.0f, &c->rsf, err))
        return -1;
    if (!gguf_find_kv(g, A "kda.gate_lower_bound"))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s: kimi-k3.kda.gate_lower_bound is missing (K3's sigmoid-bounded KDA gate; the "
                          "kimi-linear softplus gate is not K3)",
                          g->path);
    if (get_float(g, A "kda.gate_lower_bound", -1e6, 0.0, 0, 0, &c->glb, err)) return -1;
    int kmla, norm = 1, gating = 2, groups = 1;
    if (get_int(g, A "attention.key_length_mla", 1, 8192, 0, 0, &kmla, err) ||
        get_int(g, A "expert_gating_func", 0, 16, 1, 2, &gating, err) ||
        get_int(g, A "expert_group_count", 0, 1 << 16, 1, 1, &groups, err))
        return -1;
    if (gguf_find_kv(g, A "expert_weights_norm") && gguf_get_bool(g, A "expert_weights_norm", &norm, err)) return -1;
    if (!norm) return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: K3 renormalizes expert weights; %s is false", g->path, A "expert_weights_norm");
    if (gating != 2)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %s = %d; K3's router is sigmoid (2)", g->path,
                          A "expert_gating_func", gating);
    if (groups > 1)
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1, "%s: %s = %d; K3 routes without expert groups", g->path,
                          A "expert_group_count", groups);
    c->dn = kmla - c->dr;
    if (c->dn < 1)
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: attention.key_length_mla %d leaves no NoPE part after %d rope dims",
                          g->path, kmla, c->dr);
    c->moe_freq = 1;
    /* vocabulary: the embedding's shape is the truth */
    const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (emb) {
        if (emb->ne[1] < 1 || emb->ne[1] > BIG)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: token_embd.weight has %lld rows", g->path,
                              (long long)emb->ne[1]);
        c->V = (int)emb->ne[1];
        int vs;
        if (get_int(g, A "vocab_size", 1, BIG, 1, c->V, &vs, err)) return -1;
        if (vs != c->V)
            return df_err_set(err, DF_ERR_FORMAT, -1, "%s: vocab_size %d but token_embd.weight has %d rows", g->path,
                              vs, c->V);
    } else if (get_int(g, A "vocab_size", 1, BIG, 0, 0, &c->V, err)) {
        /* the embedding is in another split: its shape is checked when bound */
        return -1;
    }
    int64_t *hkv = xcalloc((size_t)c->NL, sizeof *hkv), *hc = xcalloc((size_t)c->NL, sizeof *hc),
            *ff = xcalloc((size_t)c->NL, sizeof *ff);
    c->layer_kind = xcalloc((size_t)c->NL, 1);
    c->layer_moe = xcalloc((size_t)c->NL, 1);
    int rc = -1;
    if (get_per_layer(g, A "attention.head_count_kv", c->NL, hkv, err) ||
        get_per_layer(g, A "attention.head_count", c->NL, hc, err) ||
        get_per_layer(g, A "expert_feed_forward_length", c->NL, ff, err))
        goto out;
    for (int l = 0; l < c->NL; l++) {
        c->layer_kind[l] = hkv[l] == 0 ? LAYER_KDA : LAYER_MLA;
        c->layer_moe[l] = l >= c->first_dense;
    }
    if (same_for(g, A "attention.head_count", hc, c->layer_kind, LAYER_KDA, c->NL, &c->Hk, err) ||
        same_for(g, A "attention.head_count", hc, c->layer_kind, LAYER_MLA, c->NL, &c->Hm, err) ||
        same_for(g, A "expert_feed_forward_length", ff, c->layer_moe, 1, c->NL, &c->I, err))
        goto out;
    if (c->first_dense > 0 && get_int(g, A "feed_forward_length", 1, 1 << 20, 0, 0, &c->Dff, err)) goto out;
    c->P = c->Hk * c->Dk;
    rc = k3_config_check(c, g->path, err);
out:
    free(hkv);
    free(hc);
    free(ff);
    return rc;
}

/* ---------------------------------------------------------------- layers */

static const char *lname(char *buf, size_t n, int il, const char *s)
{
    snprintf(buf, n, "blk.%d.%s", il, s);
    return buf;
}

/* ROSTER_FIX_KV_B: kv_b fused (attn_kv_b, the roster's name) or split per
 * head as llama.cpp writes it (attn_k_b ne {dn, Rkv, Hm}, attn_v_b ne
 * {Rkv, dv, Hm}), bound as k_b [Hm*Rkv, dn] and v_b [Hm*dv, Rkv]. */
static int bind_kv_b(gload *gl, int il, const roster_entry *r, df_error *err)
{
    k3_model *eng = gl->eng;
    const k3_config *c = &eng->cfg;
    k3_layer *L = &eng->layers[il];
    char n[96];
    int64_t ne_k[3] = {c->dn, c->Rkv, c->Hm}, ne_v[3] = {c->Rkv, c->dv, c->Hm};
    if (find_any(gl, lname(n, sizeof n, il, "attn_k_b.weight"))) {
        const gguf_tensor *kb = gfind(gl, lname(n, sizeof n, il, "attn_k_b.weight"), 3, ne_k, T_TRUNK, err);
        if (!kb) return -1;
        int kb_file = gl->at;
        const gguf_tensor *vb = gfind(gl, lname(n, sizeof n, il, "attn_v_b.weight"), 3, ne_v, T_TRUNK, err);
        if (!vb) return -1;
        L->kv_split = 1;
        if (map_typed(gl, kb_file, kb, c->Hm * c->Rkv, c->dn, kb->name, &L->k_b, err) ||
            map_typed(gl, gl->at, vb, c->Hm * c->dv, c->Rkv, vb->name, &L->v_b, err))
            return -1;
        return 0;
    }
    if (!find_any(gl, lname(n, sizeof n, il, r->gg)))
        return df_err_set(err, DF_ERR_FORMAT, -1, "%s: layer %d has neither attn_k_b/attn_v_b nor attn_kv_b",
                          gl->g->path, il);
    return gmat(gl, lname(n, sizeof n, il, r->gg), roster_dim(c, r->rows), roster_dim(c, r->cols), roster_mat(L, r),
                err);
}

static int bind_layer(gload *gl, int il, df_error *err)
{
    k3_model *eng = gl->eng;
    const k3_config *c = &eng->cfg;
    k3_layer *L = &eng->layers[il];
    char n[96];
    L->kind = c->layer_kind[il];
    L->moe = c->layer_moe[il];
    /* kv_b is looked up after the other MLA tensors (llama.cpp's file order;
     * it also keeps which error a broken file reports first) */
    const roster_entry *kv_b = NULL;
    for (int i = 0; i < roster_n; i++) {
        const roster_entry *r = &roster[i];
        if (!roster_applies(r, L->kind, L->moe)) continue;
        if (kv_b && r->when != ROSTER_MLA) {
            if (bind_kv_b(gl, il, kv_b, err)) return -1;
            kv_b = NULL;
        }
        if (r->fix == ROSTER_FIX_KV_B) {
            kv_b = r;
            continue;
        }
        if (r->kind == ROSTER_MAT) {
            if (gmat(gl, lname(n, sizeof n, il, r->gg), roster_dim(c, r->rows), roster_dim(c, r->cols),
                     roster_mat(L, r), err))
                return -1;
            continue;
        }
        float **v = roster_vec(L, r);
        if (!(*v = gvec(gl, lname(n, sizeof n, il, r->gg), roster_dim(c, r->gg_ne[0]), roster_dim(c, r->gg_ne[1]),
                        roster_dim(c, r->gg_ne[2]), err)))
            return -1;
        /* headers only (info, plan): no values were read, none to check */
        if (r->fix == ROSTER_FIX_DECAY && !gl->eng->headers_only)
            for (int hh = 0; hh < c->Hk; hh++) {
                float a = -(*v)[hh];
                if (!(a > 0.0f && a < INFINITY))
                    return df_err_set(err, DF_ERR_FORMAT, -1, "%s: %s[%d] = %g, but it holds -exp(A_log) (< 0)",
                                      gl->g->path, lname(n, sizeof n, il, r->gg), hh, (double)(*v)[hh]);
                (*v)[hh] = a;
            }
    }
    if (kv_b && bind_kv_b(gl, il, kv_b, err)) return -1;
    if (!L->moe) return 0;
    /* routed experts: piece p of expert e is slice e of the 3-D tensor */
    static const char *pieces[3] = {"ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight"};
    const int64_t ne[3][3] = {{c->Lt, c->I, c->E}, {c->I, c->Lt, c->E}, {c->Lt, c->I, c->E}};
    for (int p = 0; p < 3; p++) {
        const gguf_tensor *t = gfind(gl, lname(n, sizeof n, il, pieces[p]), 3, ne[p], T_EXPERT, err);
        if (!t) return -1;
        const qblock_fmt *f = qblock_fmt_of_ggml(t->type);
        if (f && ne[p][0] % f->block)
            return df_err_set(err, DF_ERR_FORMAT, (int64_t)t->info_pos,
                              "%s: tensor %s is %s with rows of %lld values, not whole blocks of %d", wset_path(gl->ws, gl->at),
                              t->name, f->name, (long long)ne[p][0], f->block);
        /* one expert's slice: the tensor's bytes over E (gguf.c checked
         * nbytes against the type's block size and ne) */
        uint64_t slice = t->nbytes / (uint64_t)c->E;
        if (slice * (uint64_t)c->E != t->nbytes || slice > UINT32_MAX)
            return df_err_set(err, DF_ERR_FORMAT, (int64_t)t->info_pos, "%s: tensor %s: %llu bytes are not %d slices",
                              wset_path(gl->ws, gl->at), t->name, (unsigned long long)t->nbytes, c->E);
        expert_store_set_piece_type(&eng->store, il, p, t->type, (uint32_t)slice);
        for (int e = 0; e < c->E; e++)
            expert_store_set_piece(&eng->store, il, e, p, gl->store_file[gl->at], t->offset + (uint64_t)e * slice);
    }
    /* gate and up read one input row: MXFP4's reordered one, or column order */
    const uint32_t *ty = &eng->store.gg_type[il * 3];
    if ((ty[0] == GGML_TYPE_MXFP4) != (ty[2] == GGML_TYPE_MXFP4))
        return df_err_set(err, DF_ERR_UNSUPPORTED, -1,
                          "%s: layer %d's ffn_gate_exps is %s and its ffn_up_exps %s: deltafin needs both MXFP4 or "
                          "neither", gl->g->path, il, type_name(ty[0]), type_name(ty[2]));
    return 0;
}

int model_load_gguf(k3_model *eng, const char *path, df_error *err)
{
    wset ws = {0};
    int n_files = 0, rc = -1;
    int *store_file = NULL;
    if (wset_open(path, NULL, &ws, err)) goto done;
    n_files = ws.n_files;
    const gguf_file *g = ws.gg;
    k3_config *c = &eng->cfg;
    if (k3_config_from_gguf(&g[0], c, err)) goto done;
    eng->shards = xcalloc((size_t)n_files, sizeof *eng->shards);
    for (int f = 0; f < n_files; f++) {
        eng->shards[f].fd = -1;
        eng->shards[f].path = xstrdup(g[f].path);
    }
    eng->n_shards = n_files;
    store_file = xcalloc((size_t)n_files, sizeof *store_file);
    gload gl = {.eng = eng, .ws = &ws, .g = g, .n_files = n_files, .layer = -1, .store_file = store_file};
    if (gmat(&gl, "token_embd.weight", c->V, c->h, &eng->embed, err)) goto done;
    gl.layer = c->NL;
    if (gmat(&gl, "output.weight", c->V, c->h, &eng->lm_head, err)) goto done;
    if (!(eng->final_norm = gvec(&gl, "output_norm.weight", c->h, 1, 1, err)) ||
        !(eng->out_res_nwpw = gvec(&gl, "output_res_score.weight", c->h, 1, 1, err)))
        goto done;
    expert_store_init_ggml(&eng->store, c->NL, c->E, c->I, c->Lt);
    for (int f = 0; f < n_files; f++)
        if ((store_file[f] = expert_store_add_file(&eng->store, g[f].path, err)) < 0) goto done;
    model_layers_alloc(eng);
    for (int il = 0; il < c->NL; il++) {
        gl.layer = il;
        if (bind_layer(&gl, il, err)) goto done;
    }
    if (expert_store_finish(&eng->store, c->layer_moe, eng->io_mode, eng->io_depth, eng->io_backend, err)) goto done;
    rc = 0;
done:
    wset_close(&ws);
    free(store_file);
    return rc;
}
