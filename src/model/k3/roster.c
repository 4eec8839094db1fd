/* roster.c - the table of a K3 layer's tensors (see roster.h).
 *
 * Owns: one entry per k3_layer weight field, in lookup order: the four
 * tensors every layer has, then KDA or MLA attention, then the dense MLP or
 * the MoE block's trunk part.  `o` has two entries (KDA [h, P], MLA
 * [h, Hm*dv]); conv has one per tap set (q, k, v).  k_b, v_b and kv_split
 * are set by the GGUF's ROSTER_FIX_KV_B, not listed.
 * Does not own: binding (model.c bind_layer for the safetensors release,
 * model_gguf.c bind_layer for a GGUF), the routed experts.
 * tools/k3gen keeps its own list of names on purpose: it is the independent
 * oracle the loaders are tested against.
 */
#include "roster.h"
#include "util.h"

#define MAT(f, w, r, c, stn, ggn)                                                                               \
    {.field = offsetof(k3_layer, f), .kind = ROSTER_MAT, .when = ROSTER_##w, .fix = ROSTER_FIX_NONE,         \
     .rows = RD_##r, .cols = RD_##c, .st = stn, .gg = ggn}
/* MAT with a fix */
#define MATX(f, w, fx, r, c, stn, ggn)                                                                          \
    {.field = offsetof(k3_layer, f), .kind = ROSTER_MAT, .when = ROSTER_##w, .fix = ROSTER_FIX_##fx,         \
     .rows = RD_##r, .cols = RD_##c, .st = stn, .gg = ggn}
/* a vector: safetensors shape st[...], GGUF ne gg[...] */
#define VEC(f, w, fx, stn, st2n, s0, s1, s2, ggn, g0, g1, g2)                                                   \
    {.field = offsetof(k3_layer, f), .kind = ROSTER_VEC, .when = ROSTER_##w, .fix = ROSTER_FIX_##fx,         \
     .st_shape = {RD_##s0, RD_##s1, RD_##s2}, .gg_ne = {RD_##g0, RD_##g1, RD_##g2}, .st = stn, .st2 = st2n,     \
     .gg = ggn}

const roster_entry roster[] = {
    /* every layer */
    VEC(attn_res_nwpw, ALL, RES_SCORE, "self_attention_res_norm.weight", "self_attention_res_proj.weight", H, NONE,
        NONE, "attn_res_score.weight", H, ONE, ONE),
    VEC(mlp_res_nwpw, ALL, RES_SCORE, "mlp_res_norm.weight", "mlp_res_proj.weight", H, NONE, NONE,
        "ffn_res_score.weight", H, ONE, ONE),
    VEC(input_ln, ALL, NONE, "input_layernorm.weight", NULL, H, NONE, NONE, "attn_norm.weight", H, ONE, ONE),
    VEC(post_ln, ALL, NONE, "post_attention_layernorm.weight", NULL, H, NONE, NONE, "ffn_norm.weight", H, ONE, ONE),
    /* KDA attention */
    MAT(q, KDA, P, H, "self_attn.q_proj.weight", "attn_q.weight"),
    MAT(k, KDA, P, H, "self_attn.k_proj.weight", "attn_k.weight"),
    MAT(v, KDA, P, H, "self_attn.v_proj.weight", "attn_v.weight"),
    MAT(g, KDA, P, H, "self_attn.g_proj.weight", "ssm_g.weight"),
    MAT(fa, KDA, DK, H, "self_attn.f_a_proj.weight", "ssm_f_a.weight"),
    MAT(fb, KDA, P, DK, "self_attn.f_b_proj.weight", "ssm_f_b.weight"),
    MAT(b, KDA, HK, H, "self_attn.b_proj.weight", "ssm_beta.weight"),
    MAT(o, KDA, H, P, "self_attn.o_proj.weight", "attn_output.weight"),
    /* conv taps: [P, 1, Wc] in the release, ne {Wc, 1, P} in a GGUF: the same element order */
    VEC(conv[0], KDA, NONE, "self_attn.q_conv1d.weight", NULL, P, ONE, WC, "ssm_conv1d_q.weight", WC, ONE, P),
    VEC(conv[1], KDA, NONE, "self_attn.k_conv1d.weight", NULL, P, ONE, WC, "ssm_conv1d_k.weight", WC, ONE, P),
    VEC(conv[2], KDA, NONE, "self_attn.v_conv1d.weight", NULL, P, ONE, WC, "ssm_conv1d_v.weight", WC, ONE, P),
    /* A_log is read as [Dk] (the release's shape) and its first Hk values used */
    VEC(A_exp, KDA, DECAY, "self_attn.A_log", NULL, DK, NONE, NONE, "ssm_a", HK, ONE, ONE),
    VEC(dt_bias, KDA, NONE, "self_attn.dt_bias", NULL, P, NONE, NONE, "ssm_dt.bias", P, ONE, ONE),
    VEC(o_norm, KDA, NONE, "self_attn.o_norm.weight", NULL, DK, NONE, NONE, "ssm_norm.weight", DK, ONE, ONE),
    /* MLA attention */
    MAT(q_a, MLA, RQ, H, "self_attn.q_a_proj.weight", "attn_q_a.weight"),
    MAT(q_b, MLA, HM_QK, RQ, "self_attn.q_b_proj.weight", "attn_q_b.weight"),
    MAT(kv_a, MLA, RKV_DR, H, "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"),
    MATX(kv_b, MLA, KV_B, HM_KV, RKV, "self_attn.kv_b_proj.weight", "attn_kv_b.weight"),
    MAT(mg, MLA, HM_DV, H, "self_attn.g_proj.weight", "attn_gate.weight"),
    MAT(o, MLA, H, HM_DV, "self_attn.o_proj.weight", "attn_output.weight"),
    VEC(q_a_ln, MLA, NONE, "self_attn.q_a_layernorm.weight", NULL, RQ, NONE, NONE, "attn_q_a_norm.weight", RQ, ONE,
        ONE),
    VEC(kv_a_ln, MLA, NONE, "self_attn.kv_a_layernorm.weight", NULL, RKV, NONE, NONE, "attn_kv_a_norm.weight", RKV,
        ONE, ONE),
    /* dense MLP */
    MAT(gate, DENSE, DFF, H, "mlp.gate_proj.weight", "ffn_gate.weight"),
    MAT(up, DENSE, DFF, H, "mlp.up_proj.weight", "ffn_up.weight"),
    MAT(down, DENSE, H, DFF, "mlp.down_proj.weight", "ffn_down.weight"),
    /* MoE: router, latent projections and shared experts (routed experts are per format) */
    MAT(router, MOE, E, H, "block_sparse_moe.gate.weight", "ffn_gate_inp.weight"),
    VEC(router_bias, MOE, NONE, "block_sparse_moe.gate.e_score_correction_bias", NULL, E, NONE, NONE,
        "exp_probs_b.bias", E, ONE, ONE),
    MAT(lat_down, MOE, LT, H, "block_sparse_moe.routed_expert_down_proj.weight", "ffn_routed_down.weight"),
    VEC(lat_norm, MOE, NONE, "block_sparse_moe.routed_expert_norm.weight", NULL, LT, NONE, NONE,
        "ffn_routed_norm.weight", LT, ONE, ONE),
    MAT(lat_up, MOE, H, LT, "block_sparse_moe.routed_expert_up_proj.weight", "ffn_routed_up.weight"),
    MAT(sh_gate, MOE, NS_I, H, "block_sparse_moe.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"),
    MAT(sh_up, MOE, NS_I, H, "block_sparse_moe.shared_experts.up_proj.weight", "ffn_up_shexp.weight"),
    MAT(sh_down, MOE, H, NS_I, "block_sparse_moe.shared_experts.down_proj.weight", "ffn_down_shexp.weight"),
};

const int roster_n = (int)(sizeof roster / sizeof roster[0]);

int roster_dim(const k3_config *c, int d)
{
    switch (d) {
    case RD_NONE: return 0;
    case RD_ONE: return 1;
    case RD_H: return c->h;
    case RD_P: return c->P;
    case RD_DK: return c->Dk;
    case RD_HK: return c->Hk;
    case RD_WC: return c->Wc;
    case RD_RQ: return c->Rq;
    case RD_RKV: return c->Rkv;
    case RD_RKV_DR: return c->Rkv + c->dr;
    case RD_HM_QK: return c->Hm * (c->dn + c->dr);
    case RD_HM_KV: return c->Hm * (c->dn + c->dv);
    case RD_HM_DV: return c->Hm * c->dv;
    case RD_DFF: return c->Dff;
    case RD_E: return c->E;
    case RD_LT: return c->Lt;
    case RD_NS_I: return c->Ns * c->I;
    }
    CHECK(!"roster_dim: unknown dim");
    return 0;
}

int roster_applies(const roster_entry *r, int kind, int moe)
{
    switch (r->when) {
    case ROSTER_ALL: return 1;
    case ROSTER_KDA: return kind == LAYER_KDA;
    case ROSTER_MLA: return kind == LAYER_MLA;
    case ROSTER_DENSE: return !moe;
    case ROSTER_MOE: return moe != 0;
    }
    CHECK(!"roster_applies: unknown layer class");
    return 0;
}

wmat *roster_mat(k3_layer *L, const roster_entry *r)
{
    CHECK(r->kind == ROSTER_MAT);
    return (wmat *)((char *)L + r->field);
}

float **roster_vec(k3_layer *L, const roster_entry *r)
{
    CHECK(r->kind == ROSTER_VEC);
    return (float **)((char *)L + r->field);
}
