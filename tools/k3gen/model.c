/*
 * k3gen model description: the text_config sizes (model_cfg), the --set keys
 * and their aliases, the size presets, validation, the tensor roster (every
 * safetensors tensor's name, dtype, shape, init kind and layer group, in the
 * K3 / k3-tiny-a naming) and config.json.
 * Invariants:
 *  - MLA layers are the 1-based layers mla_every, 2*mla_every, ... and the
 *    last; MoE layers are those >= first_k_dense_replace with l % freq == 0.
 *  - MXFP4 expert matrices are a packed U8 [rows, cols/2] + scale U8
 *    [rows, cols/32] pair; scales centre on the E8M0 byte giving the target sd.
 *  - config.json matches k3-tiny-a's byte for byte (preset tiny-a-shape).
 * Owns no bytes of tensor data (weights.c) and no file layout (safetensors.c).
 */
#include "k3gen.h"

/* ------------------------------------------------------------------ config */

#define CK(k, m) {#k, offsetof(model_cfg, k), m}
const cfg_key cfg_keys[] = {
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
const size_t n_cfg_keys = sizeof cfg_keys / sizeof cfg_keys[0];

static const struct {
    const char *alias, *key;
} cfg_aliases[] = {
    {"linear_attn_config.num_heads", "kda_heads"},
    {"linear_attn_config.head_dim", "kda_head_dim"},
    {"linear_attn_config.short_conv_kernel_size", "short_conv_kernel_size"},
    {"num_heads", "kda_heads"},
    {"head_dim", "kda_head_dim"},
};

/*                        V     h   Dff  NL  Hm  Rq  Rkv dn  dr  dv  B   E    k  Ns  I    Lt   Hk  Dk  every Wc fkd freq */
const preset presets[] = {
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
const size_t n_presets = sizeof presets / sizeof presets[0];

long *cfg_field(model_cfg *c, const char *key)
{
    for (size_t i = 0; i < sizeof cfg_aliases / sizeof cfg_aliases[0]; i++)
        if (!strcmp(key, cfg_aliases[i].alias))
            key = cfg_aliases[i].key;
    for (size_t i = 0; i < sizeof cfg_keys / sizeof cfg_keys[0]; i++)
        if (!strcmp(key, cfg_keys[i].key))
            return (long *)((char *)c + cfg_keys[i].off);
    return NULL;
}

int is_mla_layer(const model_cfg *c, long l)
{
    return (l + 1) % c->mla_every == 0 || l == c->num_hidden_layers - 1;
}

int is_moe_layer(const model_cfg *c, long l)
{
    return l >= c->first_k_dense_replace && l % c->moe_layer_freq == 0;
}

void validate_cfg(const model_cfg *c)
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

const char *const dtype_names[] = {"F32", "BF16", "U8"};
const int dtype_sizes[] = {4, 2, 1};

int64_t tensor_numel(const tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

uint64_t tensor_bytes(const tensor *t)
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

void build_roster(const model_cfg *c, tensor_list *tl)
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

void write_config(const char *dir, const model_cfg *c)
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

