"""The weights of a llama.cpp kimi-k3 GGUF as the release's checkpoint names, in float64, for the
float64 reference (k3.py): every tensor dequantized by gguf-py (llama.cpp's own Python reader,
whose values tests/llama/gguf_f32_copy.py checks against ggml's) and llama.cpp's conversions
undone, independently of deltafin's loader (src/model/k3/model_gguf.c):

  * names: blk.L.attn_q.weight -> language_model.model.layers.L.self_attn.q_proj.weight, ...
    (the table below, written from llama.cpp's tensor names and the release's);
  * {attn,ffn,output}_res_score = res_norm * res_proj: the norm becomes ones and the projection
    the score (the same product the model uses);
  * ssm_a = -exp(A_log) over the KDA heads: A_log = log(-ssm_a), padded with zeros to the head dim;
  * attn_k_b ne {dn, Rkv, H} (transposed per head) and attn_v_b ne {Rkv, dv, H}: kv_b_proj
    rebuilt as [H * (dn + dv), Rkv]; a fused attn_kv_b is kv_b_proj itself;
  * ffn_{gate,down,up}_exps [E, rows, cols]: expert e's w1 / w2 / w3.

  load(gguf_path, gguf_py_dir, shapes) -> {name: float64 numpy array}
shapes: the checkpoint names -> shapes the model expects (k3.K3(cfg).state_dict() with the
"language_model." prefix): each tensor is checked against it, and A_log padded to it.
"""
import re
import sys

import numpy as np

PFX = "language_model."
LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "ssm_g.weight": "self_attn.g_proj.weight",
    "ssm_f_a.weight": "self_attn.f_a_proj.weight",
    "ssm_f_b.weight": "self_attn.f_b_proj.weight",
    "ssm_beta.weight": "self_attn.b_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ssm_conv1d_q.weight": "self_attn.q_conv1d.weight",
    "ssm_conv1d_k.weight": "self_attn.k_conv1d.weight",
    "ssm_conv1d_v.weight": "self_attn.v_conv1d.weight",
    "ssm_dt.bias": "self_attn.dt_bias",
    "ssm_norm.weight": "self_attn.o_norm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_gate.weight": "self_attn.g_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "block_sparse_moe.gate.weight",
    "exp_probs_b.bias": "block_sparse_moe.gate.e_score_correction_bias",
    "ffn_routed_down.weight": "block_sparse_moe.routed_expert_down_proj.weight",
    "ffn_routed_norm.weight": "block_sparse_moe.routed_expert_norm.weight",
    "ffn_routed_up.weight": "block_sparse_moe.routed_expert_up_proj.weight",
    "ffn_gate_shexp.weight": "block_sparse_moe.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "block_sparse_moe.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "block_sparse_moe.shared_experts.down_proj.weight",
}
SCORES = {"attn_res_score.weight": "self_attention_res", "ffn_res_score.weight": "mlp_res"}
EXPS = {"ffn_gate_exps.weight": "w1", "ffn_down_exps.weight": "w2", "ffn_up_exps.weight": "w3"}
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
       "output_norm.weight": "model.norm.weight"}


def load(path, gguf_py, shapes):
    sys.path.insert(0, gguf_py)
    import gguf  # noqa: E402
    from gguf.quants import dequantize  # noqa: E402
    r = gguf.GGUFReader(path)
    out = {}
    kb = {}

    def val(t):
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)

    def put(name, a):
        want = shapes.get(name)
        if want is None:
            raise ValueError("%s: %s maps to %s, which the model does not have" % (path, t.name, name))
        a = np.asarray(a, dtype=np.float64)
        if a.size != int(np.prod(want)):
            raise ValueError("%s: %s has %d values, %s needs %s" % (path, t.name, a.size, name, tuple(want)))
        out[name] = a.reshape(want)

    for t in r.tensors:
        n = t.name
        if n in TOP:
            put(PFX + TOP[n], val(t))
            continue
        if n == "output_res_score.weight":
            s = val(t).reshape(-1)
            put(PFX + "model.output_attn_res_norm.weight", np.ones_like(s))
            put(PFX + "model.output_attn_res_proj.weight", s)
            continue
        m = re.match(r"blk\.(\d+)\.(.+)$", n)
        if not m:
            raise ValueError("%s: tensor %s is not one of K3's" % (path, n))
        L, rest = int(m.group(1)), m.group(2)
        lp = PFX + "model.layers.%d." % L
        if rest in LAYER:
            put(lp + LAYER[rest], val(t))
        elif rest in SCORES:
            s = val(t).reshape(-1)
            put(lp + SCORES[rest] + "_norm.weight", np.ones_like(s))
            put(lp + SCORES[rest] + "_proj.weight", s)
        elif rest == "ssm_a":
            a = val(t).reshape(-1)
            name = lp + "self_attn.A_log"
            full = np.zeros(int(np.prod(shapes[name])))
            full[:a.size] = np.log(-a)
            put(name, full)
        elif rest in ("attn_k_b.weight", "attn_v_b.weight"):
            kb.setdefault(L, {})[rest] = val(t)  # [H, Rkv, dn] / [H, dv, Rkv]
        elif rest in EXPS:
            w = val(t)  # [E, rows, cols]: k3.state_from_checkpoint stacks them back and checks the shape
            for e in range(w.shape[0]):
                out[lp + "block_sparse_moe.experts.%d.%s" % (e, EXPS[rest])] = w[e]
        else:
            raise ValueError("%s: tensor %s is not one of K3's" % (path, n))
    for L, d in kb.items():
        k, v = d["attn_k_b.weight"], d["attn_v_b.weight"]
        H, Rkv, dn = k.shape
        dv = v.shape[1]
        kv = np.zeros((H, dn + dv, Rkv))
        kv[:, :dn, :] = np.transpose(k, (0, 2, 1))
        kv[:, dn:, :] = v
        put(PFX + "model.layers.%d.self_attn.kv_b_proj.weight" % L, kv.reshape(H * (dn + dv), Rkv))
    return out  # k3.state_from_checkpoint names what is missing or extra
