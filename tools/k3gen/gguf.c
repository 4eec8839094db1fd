/*
 * k3gen GGUF writer: --gguf FILE writes the same model as a GGUF v3 file (or
 * --gguf-split N files) in llama.cpp's kimi-k3 layout, for running llama.cpp
 * as an oracle: metadata keys, the byte-level tokenizer with merges recovered
 * by rank-limited BPE, and every tensor renamed, reshaped (dims reversed) or
 * transformed (experts repacked as 3-D ggml MXFP4, AttnRes score fold, KDA
 * A_log -> -exp, MLA kv_b split) from the safetensors roster's bytes.
 * Invariants:
 *  - values are exact: every transform is lossless (see the notes below);
 *    --gguf-f32 dequantizes MXFP4 exactly.
 *  - tensor data is aligned to GG_ALIGN; each file is written as a
 *    .k3gen-tmp temporary and renamed when complete.
 * The detailed mapping and what is still uncertain follow.
 */
#include "k3gen.h"
#include "qblock.h"
#include "quant.h"

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
 *    bytes are read from DIR's shards (see source.c;
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

enum { GG_F32 = 0, GG_F16 = 1, GG_Q8_0 = 8, GG_BF16 = 30, GG_MXFP4 = 39 };

/* --gguf-trunk: the type of the 2-D trunk matrices (the embedding, the output
 * head, attention and MLP projections, the router; not kv_b's per-head
 * split, not the experts): as converted (BF16/F32), Q8_0 or F16 as ggml's
 * quantize_row_q8_0_ref / its FP32->FP16 conversion write them, or "q8_0-values": F32
 * holding exactly the values the Q8_0 file stores (its dequantized copy, for
 * the exactness test: a Q8_0 model's logits equal this file's). */
enum { TRUNK_AS_IS, TRUNK_Q8_0, TRUNK_F16, TRUNK_Q8_0_VALUES };
static int gg_trunk_mode = TRUNK_AS_IS;

void gg_set_trunk(const char *mode)
{
    if (!strcmp(mode, "q8_0")) gg_trunk_mode = TRUNK_Q8_0;
    else if (!strcmp(mode, "f16")) gg_trunk_mode = TRUNK_F16;
    else if (!strcmp(mode, "q8_0-values")) gg_trunk_mode = TRUNK_Q8_0_VALUES;
    else die("--gguf-trunk: expected q8_0, f16 or q8_0-values, not %s", mode);
}

/* One block of 32 values through the engine's Q8_0 quantizer (ggml's
 * rounding, src/formats/qblock.c); out: 34 bytes, and the values it stands
 * for into vals when given. */
static void q8_0_block(const float *x, unsigned char *out, float *vals);

/* --gguf-experts: the routed experts as MXFP4 (as shipped), or requantized
 * to Q8_0 from their MXFP4 values ("q8_0"), or "q8_0-values": F32 holding
 * exactly the values that Q8_0 file stores (its dequantized copy, for the
 * exactness test of requantized experts). */
enum { EXPERTS_AS_IS, EXPERTS_Q8_0, EXPERTS_Q8_0_VALUES };
static int gg_experts_mode = EXPERTS_AS_IS;

void gg_set_experts(const char *mode)
{
    if (!strcmp(mode, "q8_0")) gg_experts_mode = EXPERTS_Q8_0;
    else if (!strcmp(mode, "q8_0-values")) gg_experts_mode = EXPERTS_Q8_0_VALUES;
    else die("--gguf-experts: expected q8_0 or q8_0-values, not %s", mode);
}

static void q8_0_block(const float *x, unsigned char *out, float *vals)
{
    q8_0_quantize_block(x, out);
    if (vals) qblock_fmt_of_ggml(GG_Q8_0)->decode(out, vals);
}enum { GK_COPY, GK_SCORE, GK_NEG_EXP, GK_EXPS, GK_KB, GK_VB };
#define GG_ALIGN 32u

typedef struct {
    char name[64];
    int type, nd, kind;
    int64_t ne[4];
    const tensor *a, *b;   /* sources (b: the projection for GK_SCORE) */
    const tensor **exps;   /* GK_EXPS: [E][2] packed, scale */
    int64_t take;          /* GK_NEG_EXP: leading elements used */
    int quant;             /* GK_COPY under --gguf-trunk q8_0 / q8_0-values: through Q8_0 blocks */
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
    if (t->nd == 2 && gg_trunk_mode != TRUNK_AS_IS) {
        if (gg_trunk_mode == TRUNK_F16) t->type = GG_F16;
        else if (t->ne[0] % 32) {
            /* as llama.cpp's quantizer: a row that is not whole blocks keeps its type */
        } else {
            t->type = gg_trunk_mode == TRUNK_Q8_0 ? GG_Q8_0 : GG_F32;
            t->quant = 1;
        }
    }
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
    if (gg_trunk_mode == TRUNK_F16) {
        t->type = GG_F16;
    } else if (gg_trunk_mode != TRUNK_AS_IS && t->ne[0] % 32 == 0) {
        t->type = gg_trunk_mode == TRUNK_Q8_0 ? GG_Q8_0 : GG_F32;
        t->quant = 1;
    }
}

/* One output row of n values (f32) in t's type: F32, BF16 (exact: the
 * values are BF16), F16, or Q8_0 blocks / their values (t->quant). */
static void gg_put_row(FILE *f, const char *path, const gg_tensor *t, const float *x, int64_t n)
{
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
        int k = n - i0 < 32 ? (int)(n - i0) : 32;
        if (t->quant) {
            unsigned char blk[34];
            float v[32];
            q8_0_block(x + i0, blk, v);
            if (t->type == GG_Q8_0) write_all(f, blk, 34, path);
            else write_all(f, v, 32 * 4, path);
            continue;
        }
        for (int j = 0; j < k; j++) {
            float xv = x[i0 + j];
            uint32_t u;
            memcpy(&u, &xv, 4);
            if (t->type == GG_F32) {
                write_all(f, &xv, 4, path);
            } else {
                uint16_t hb = t->type == GG_F16 ? f32_to_f16(xv) : (uint16_t)(u >> 16);
                unsigned char o[2] = {(unsigned char)hb, (unsigned char)(hb >> 8)};
                write_all(f, o, 2, path);
            }
        }
    }
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
    if (gg_experts_mode != EXPERTS_AS_IS) {
        t->type = gg_experts_mode == EXPERTS_Q8_0 ? GG_Q8_0 : GG_F32;
        t->quant = 1;
    }
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
    case GG_F16:
        return 2 * n;
    case GG_Q8_0:
        return n / 32 * 34;
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

/* --from DIR: the GGUF carries DIR's own vocabulary (its tiktoken.model),
 * not a generated one, so the converted file tokenizes as the model does */
static const char *gg_from_dir;
void gg_set_from(const char *dir) { gg_from_dir = dir; }

static void gg_tokenizer(kvbuf *k, long V)
{
    vocab v = {0};
    char tk[4096];
    snprintf(tk, sizeof tk, "%s/tiktoken.model", gg_from_dir ? gg_from_dir : "");
    if (!gg_from_dir || load_vocab_tiktoken(&v, tk))
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
            for (size_t j = 0; j < n_special_tokens; j++)
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
        if (t->quant || t->type == GG_F16) {
            /* the values as f32, then Q8_0 blocks (or their values), or halves */
            for (uint64_t i0 = 0; i0 < n; i0 += 32) {
                float x[32], v[32];
                int k = n - i0 < 32 ? (int)(n - i0) : 32;
                for (int j = 0; j < k; j++) {
                    uint64_t i = i0 + (uint64_t)j;
                    if (t->a->dtype == DT_BF16) {
                        uint32_t u = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
                        memcpy(&x[j], &u, 4);
                    } else {
                        memcpy(&x[j], src + 4 * i, 4);
                    }
                }
                if (t->type == GG_F16) {
                    for (int j = 0; j < k; j++) {
                        uint16_t hb = f32_to_f16(x[j]);
                        unsigned char o[2] = {(unsigned char)hb, (unsigned char)(hb >> 8)};
                        write_all(f, o, 2, path);
                    }
                    continue;
                }
                unsigned char blk[34];
                q8_0_block(x, blk, v);
                if (t->type == GG_Q8_0) write_all(f, blk, 34, path);
                else write_all(f, v, 32 * 4, path);
            }
        } else if (t->type == GG_F32 && t->a->dtype == DT_BF16) {
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
        size_t in_sz = t->a->dtype == DT_BF16 ? 2 : 4;
        float *row = xmalloc((size_t)(t->dn > t->Rkv ? t->dn : t->Rkv) * sizeof *row);
        for (int64_t hh = 0; hh < t->H; hh++) {
            int64_t rows = t->kind == GK_KB ? t->dn : t->dv;
            int64_t row0 = hh * (t->dn + t->dv) + (t->kind == GK_KB ? 0 : t->dn);
            /* element (r, j) of this head's rows; k_b is written j-major */
            int64_t n_outer = t->kind == GK_KB ? t->Rkv : rows, n_inner = t->kind == GK_KB ? rows : t->Rkv;
            for (int64_t o = 0; o < n_outer; o++) {
                for (int64_t in = 0; in < n_inner; in++) {
                    int64_t r = t->kind == GK_KB ? in : o, j = t->kind == GK_KB ? o : in;
                    const unsigned char *src = a + ((size_t)(row0 + r) * (size_t)t->Rkv + (size_t)j) * in_sz;
                    uint32_t u = in_sz == 2 ? (uint32_t)(src[0] | src[1] << 8) << 16
                                            : (uint32_t)(src[0] | src[1] << 8 | src[2] << 16 | (uint32_t)src[3] << 24);
                    memcpy(&row[in], &u, 4);
                }
                gg_put_row(f, path, t, row, n_inner);
            }
        }
        free(row);
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
        size_t row_out = t->type == GG_F32 ? (size_t)cols * 4 : t->type == GG_Q8_0 ? (size_t)cols / 32 * 34
                                                                                     : (size_t)cols / 32 * 17;
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
                    if (t->quant) { /* requantized: the MXFP4 values through ggml's Q8_0 rounding */
                        static const float e2m1q[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6,
                                                        -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
                        float v[32], vals[32];
                        unsigned char qb[34];
                        for (int j = 0; j < 32; j++) v[j] = ldexpf(e2m1q[codes[j]], (int)srow[blk] - 127);
                        q8_0_block(v, qb, vals);
                        if (t->type == GG_Q8_0) memcpy(out + blk * 34, qb, 34);
                        else memcpy(out + 4 * (blk * 32), vals, sizeof vals);
                    } else if (t->type == GG_F32) {
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
uint64_t write_gguf(const char *path, const model_cfg *c, tensor_list *tl, uint64_t seed, int f32,
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

void gg_report(const char *path, int n_split, int f32, uint64_t bytes)
{
    char *first = gg_split_path(path, 0, n_split);
    printf("k3gen: wrote %s%s: GGUF v3 kimi-k3, %s experts, %llu bytes (%.1f MiB)\n", first,
           n_split > 1 ? " and the other splits" : "",
           gg_experts_mode == EXPERTS_Q8_0          ? "Q8_0"
           : f32 || gg_experts_mode != EXPERTS_AS_IS ? "F32"
                                                     : "MXFP4",
           (unsigned long long)bytes,
           (double)bytes / (1 << 20));
    free(first);
}

