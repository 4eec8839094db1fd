"""Kimi K3 text forward pass in PyTorch, written from shared/docs/k3-architecture.md.

One module tree whose parameter names mirror the checkpoint (minus the `language_model.`
prefix), except that each MoE layer's routed experts are stored stacked:
    block_sparse_moe.w1 [E, I, Lt], .w2 [E, Lt, I], .w3 [E, I, Lt]
(split into experts.{e}.w{1,2,3} on export/import).

Runs in any dtype: float64 for reference outputs, float32 for training.
The forward pass takes a whole batch of sequences [B, T] at once (causal everywhere), which
is mathematically the same as the spec's position-by-position loop.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# E2M1 code table (spec section 8)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def text_config(cfg):
    return cfg["text_config"] if "text_config" in cfg else cfg


class Weight(nn.Module):
    """A module holding a single `weight` (to mirror checkpoint names)."""

    def __init__(self, *shape, init=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape))
        if init is not None:
            init(self.weight)


def linear(out_f, in_f, std=None):
    w = Weight(out_f, in_f)
    nn.init.normal_(w.weight, 0.0, std if std is not None else 1.0 / math.sqrt(in_f))
    return w


def ones(n):
    w = Weight(n)
    nn.init.ones_(w.weight)
    return w


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def situ(g, u, b1, b2):
    return (torch.tanh(g / b1) * b1 * torch.sigmoid(g)) * (torch.tanh(u / b2) * b2)


def mm(x, w):
    """x [..., in] times weight [out, in] -> [..., out]"""
    return x @ w.t()


# ---------------------------------------------------------------- MXFP4 helpers (training side)

def _mxfp4_scaled(w):
    """-> (x = w / 2^e grouped [..., C/32, 32], e [..., C/32]) with e the smallest exponent such that
    max|w_group| / 2^e <= 6 (no clipping), clamped to the E8M0 range."""
    shp = w.shape
    g = w.reshape(*shp[:-1], shp[-1] // 32, 32)
    amax = g.abs().amax(-1)
    m, E = torch.frexp(amax / 6.0)                       # amax/6 = m * 2^E, m in [0.5, 1)
    e = torch.where(m > 0.5, E, E - 1).to(g.dtype)       # ceil(log2(amax/6))
    e = torch.where(amax > 0, e, torch.full_like(e, -127.0)).clamp(-127, 127)
    x = g / torch.pow(2.0, e).unsqueeze(-1)
    return x, e


def _e2m1_round_mag(a):
    """round |x| in [0, inf) to the nearest E2M1 magnitude, ties to the even code, clamp at 6."""
    a = a.clamp(max=6.0)
    return torch.where(a < 2.0, torch.round(a * 2.0) * 0.5,
                       torch.where(a < 4.0, torch.round(a), torch.round(a * 0.5) * 2.0)).clamp(max=6.0)


def mxfp4_quantize_codes(w):
    """w [..., C] (C multiple of 32) -> (codes uint8 [..., C] (E2M1 nibbles), scale bytes uint8 [..., C/32])."""
    w = w.detach()
    x, e = _mxfp4_scaled(w)
    m = _e2m1_round_mag(x.abs())
    code = torch.where(m < 2.0, m * 2.0, torch.where(m < 4.0, m + 2.0, m * 0.5 + 4.0)).to(torch.int64)
    code = code + ((x < 0) & (code > 0)).to(torch.int64) * 8
    return code.reshape(w.shape).to(torch.uint8), (e + 127).to(torch.uint8)


def mxfp4_dequant_codes(codes, scale, dtype=torch.float64):
    table = torch.tensor(E2M1, dtype=torch.float64)
    vals = table[codes.long()]
    shp = vals.shape
    g = vals.reshape(*shp[:-1], shp[-1] // 32, 32)
    s = torch.pow(2.0, scale.to(torch.float64) - 127.0).unsqueeze(-1)
    return (g * s).reshape(shp).to(dtype)


def mxfp4_round(w):
    """MXFP4 round-trip of w (same dtype; identical values to mxfp4_dequant_codes(*mxfp4_quantize_codes(w)))."""
    w = w.detach()
    x, e = _mxfp4_scaled(w)
    q = torch.sign(x) * _e2m1_round_mag(x.abs())
    return (q * torch.pow(2.0, e).unsqueeze(-1)).reshape(w.shape)


def mxfp4_ste(w):
    """straight-through estimator: forward with MXFP4-rounded weights, gradient of identity."""
    return w + (mxfp4_round(w) - w).detach()


# ---------------------------------------------------------------- modules

def attnres_mix(anchors, p, nw, pw, eps):
    """Mix(A, p, nw, pw) of spec 4.1, vectorised over positions."""
    if not anchors:
        return p, None
    vals = torch.stack(list(anchors) + [p], dim=-2)            # [..., m+1, h]
    s = (rmsnorm(vals, nw, eps) * pw).sum(-1)                  # [..., m+1]
    a = torch.softmax(s, dim=-1)
    return (a.unsqueeze(-1) * vals).sum(-2), a


class KDA(nn.Module):
    def __init__(self, c):
        super().__init__()
        la = c["linear_attn_config"]
        h = c["hidden_size"]
        self.H, self.D = la["num_heads"], la["head_dim"]
        self.Wc = la["short_conv_kernel_size"]
        self.glb = la["gate_lower_bound"]
        self.eps = c["rms_norm_eps"]
        P = self.H * self.D
        self.q_proj, self.k_proj, self.v_proj, self.g_proj = (linear(P, h) for _ in range(4))
        self.f_a_proj = linear(self.D, h)
        self.f_b_proj = linear(P, self.D)
        self.b_proj = linear(self.H, h)
        self.o_proj = linear(h, P, std=0.5 / math.sqrt(P))
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (Weight(P, 1, self.Wc) for _ in range(3))
        for cv in (self.q_conv1d, self.k_conv1d, self.v_conv1d):
            with torch.no_grad():
                cv.weight.normal_(0.0, 0.1)
                cv.weight[:, 0, -1] += 1.0
        # training init: A = exp(A_log) = 1 per head (entries >= H are padding, kept 0), dt_bias in
        # [-5, -1] so that per-step decays exp(-5*sigmoid(z)) span long (0.97) to short (0.26) memory
        self.A_log = nn.Parameter(torch.zeros(self.D))
        self.dt_bias = nn.Parameter(torch.empty(P).uniform_(-5.0, -1.0))
        self.o_norm = ones(self.D)

    def forward(self, x):
        B, T, _ = x.shape
        H, D, Wc = self.H, self.D, self.Wc
        P = H * D

        def conv(r, w):
            y = F.conv1d(F.pad(r.transpose(1, 2), (Wc - 1, 0)), w, groups=P)
            return F.silu(y.transpose(1, 2))

        q = conv(mm(x, self.q_proj.weight), self.q_conv1d.weight).view(B, T, H, D)
        k = conv(mm(x, self.k_proj.weight), self.k_conv1d.weight).view(B, T, H, D)
        v = conv(mm(x, self.v_proj.weight), self.v_conv1d.weight).view(B, T, H, D)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        q = q / math.sqrt(D)
        beta = torch.sigmoid(mm(x, self.b_proj.weight))                      # [B,T,H]
        z = mm(mm(x, self.f_a_proj.weight), self.f_b_proj.weight) + self.dt_bias
        z = z.view(B, T, H, D)
        A = torch.exp(self.A_log[:H]).view(1, 1, H, 1)                      # per head (D1)
        g = self.glb * torch.sigmoid(A * z)                                  # log-decay [B,T,H,D]
        if KDA_MODE["chunk"]:
            o = kda_chunked(q, k, v, beta, g, KDA_MODE["chunk"])
        else:
            o = kda_recurrence(q, k, v, beta, torch.exp(g))                  # [B,T,H,D]
        o = rmsnorm(o, self.o_norm.weight, self.eps)
        o = o * torch.sigmoid(mm(x, self.g_proj.weight).view(B, T, H, D))
        return mm(o.reshape(B, T, P), self.o_proj.weight)


# chunk = 0: the literal per-position loop of spec 5.5; chunk = C > 0: the equivalent chunked
# (WY) form below, much faster for training.
KDA_MODE = {"chunk": 16}


def kda_chunked(q, k, v, beta, g, C):
    """Chunked form of the same recurrence. Within a chunk, with G_t = sum_{s<=t} g_s (per channel),
    S_t = diag(e^{G_t}) S0 + sum_{s<=t} diag(e^{G_t-G_s}) k_s u_s^T, where the pseudo-values solve
    u_t + beta_t sum_{s<t} (k_t e^{G_t-G_s} . k_s) u_s = beta_t (v_t - (k_t e^{G_t})^T S0)."""
    B, T, H, D = q.shape
    pad = (-T) % C
    if pad:
        z = lambda x: F.pad(x, (0, 0, 0, 0, 0, pad))
        q, k, v, g = z(q), z(k), z(v), z(g)
        beta = F.pad(beta, (0, 0, 0, pad))
    n = (T + pad) // C
    # -> [B,H,n,C,D]
    r = lambda x: x.reshape(B, n, C, H, -1).permute(0, 3, 1, 2, 4)
    q, k, v, g = r(q), r(k), r(v), r(g)
    beta = beta.reshape(B, n, C, H).permute(0, 3, 1, 2)                      # [B,H,n,C]
    G = torch.cumsum(g, dim=3)                                               # [B,H,n,C,D]
    ref = G[:, :, :, C // 2: C // 2 + 1, :]                                  # mid-chunk reference
    kin = k * torch.exp(G - ref)                                             # k_t e^{G_t - r}
    kout = k * torch.exp(ref - G)                                            # k_s e^{r - G_s}
    qin = q * torch.exp(G - ref)
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(0)
    # mask before scaling: above the diagonal the products can overflow to inf for long chunks, and
    # inf * beta there would make beta's gradient NaN (0 * inf) even though the value is masked
    A = (kin @ kout.transpose(-1, -2)).masked_fill(~strict, 0.0) * beta.unsqueeze(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    Mb = torch.linalg.solve_triangular(eye + A, torch.diag_embed(beta), upper=False, unitriangular=True)
    eG = torch.exp(G)
    W = Mb @ (k * eG)                                                        # [B,H,n,C,D]
    Ub = Mb @ v
    Pm = (qin @ kout.transpose(-1, -2)).masked_fill(~incl, 0.0)              # [B,H,n,C,C]
    qG = q * eG
    kend = k * torch.exp(G[:, :, :, -1:, :] - G)                             # k_s e^{G_C - G_s}
    dend = eG[:, :, :, -1, :]                                                # [B,H,n,D]
    S = q.new_zeros(B, H, D, v.shape[-1])
    outs = []
    for i in range(n):
        U = Ub[:, :, i] - W[:, :, i] @ S
        outs.append(qG[:, :, i] @ S + Pm[:, :, i] @ U)
        S = dend[:, :, i].unsqueeze(-1) * S + kend[:, :, i].transpose(-1, -2) @ U
    o = torch.stack(outs, 2)                                                 # [B,H,n,C,Dv]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, n * C, H, -1)
    return o[:, :T]


def kda_recurrence(q, k, v, beta, decay):
    """Per-position delta rule (spec 5.5). q,k,v,decay [B,T,H,D]; beta [B,T,H]."""
    B, T, H, D = q.shape
    S = q.new_zeros(B, H, D, D)
    outs = []
    for t in range(T):
        S = S * decay[:, t].unsqueeze(-1)
        kt = k[:, t]
        pred = torch.einsum("bhd,bhdv->bhv", kt, S)
        S = S + (beta[:, t, :, None, None] * kt.unsqueeze(-1)) * (v[:, t] - pred).unsqueeze(-2)
        outs.append(torch.einsum("bhd,bhdv->bhv", q[:, t], S))
    return torch.stack(outs, 1)


class MLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.Hm = c["num_attention_heads"]
        self.Rq, self.Rkv = c["q_lora_rank"], c["kv_lora_rank"]
        self.dn, self.dr, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.eps = c["rms_norm_eps"]
        Hm = self.Hm
        self.q_a_proj = linear(self.Rq, h)
        self.q_a_layernorm = ones(self.Rq)
        self.q_b_proj = linear(Hm * (self.dn + self.dr), self.Rq)
        self.kv_a_proj_with_mqa = linear(self.Rkv + self.dr, h)
        self.kv_a_layernorm = ones(self.Rkv)
        self.kv_b_proj = linear(Hm * (self.dn + self.dv), self.Rkv)
        self.g_proj = linear(Hm * self.dv, h)
        self.o_proj = linear(h, Hm * self.dv, std=0.5 / math.sqrt(Hm * self.dv))

    def forward(self, x):
        B, T, _ = x.shape
        Hm, dn, dr, dv = self.Hm, self.dn, self.dr, self.dv
        qa = rmsnorm(mm(x, self.q_a_proj.weight), self.q_a_layernorm.weight, self.eps)
        q = mm(qa, self.q_b_proj.weight).view(B, T, Hm, dn + dr)
        ckv = mm(x, self.kv_a_proj_with_mqa.weight)
        lat = rmsnorm(ckv[..., : self.Rkv], self.kv_a_layernorm.weight, self.eps)
        k_rope = ckv[..., self.Rkv:]                                          # [B,T,dr]
        kv = mm(lat, self.kv_b_proj.weight).view(B, T, Hm, dn + dv)
        key = torch.cat([kv[..., :dn], k_rope.unsqueeze(2).expand(B, T, Hm, dr)], -1)
        val = kv[..., dn:]
        qh, kh, vh = q.transpose(1, 2), key.transpose(1, 2), val.transpose(1, 2)  # [B,Hm,T,*]
        sc = (qh @ kh.transpose(-1, -2)) / math.sqrt(dn + dr)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        sc = sc.masked_fill(mask, float("-inf"))
        p = torch.softmax(sc, -1)
        o = (p @ vh).transpose(1, 2).reshape(B, T, Hm * dv)
        o = o * torch.sigmoid(mm(x, self.g_proj.weight))
        return mm(o, self.o_proj.weight)


class DenseMLP(nn.Module):
    def __init__(self, c, width=None):
        super().__init__()
        h = c["hidden_size"]
        I = width if width is not None else c["intermediate_size"]
        self.b1, self.b2 = c["activation_situ_beta"], c["activation_situ_linear_beta"]
        self.gate_proj = linear(I, h)
        self.up_proj = linear(I, h)
        self.down_proj = linear(h, I, std=0.5 / math.sqrt(I))

    def forward(self, y):
        return mm(situ(mm(y, self.gate_proj.weight), mm(y, self.up_proj.weight), self.b1, self.b2),
                  self.down_proj.weight)


class Gate(nn.Module):
    def __init__(self, E, h):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, h) / math.sqrt(h))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        E, I, Lt = c["num_experts"], c["moe_intermediate_size"], c["routed_expert_hidden_size"]
        self.E, self.k, self.I, self.Lt = E, c["num_experts_per_token"], I, Lt
        self.rsf = c["routed_scaling_factor"]
        self.eps = c["rms_norm_eps"]
        self.b1, self.b2 = c["activation_situ_beta"], c["activation_situ_linear_beta"]
        self.gate = Gate(E, h)
        self.routed_expert_down_proj = linear(Lt, h)
        self.routed_expert_norm = ones(Lt)
        self.routed_expert_up_proj = linear(h, Lt, std=0.5 / math.sqrt(Lt))
        self.shared_experts = DenseMLP(c, c["num_shared_experts"] * I)
        self.w1 = nn.Parameter(torch.randn(E, I, Lt) / math.sqrt(Lt))
        self.w2 = nn.Parameter(torch.randn(E, Lt, I) / math.sqrt(I))
        self.w3 = nn.Parameter(torch.randn(E, I, Lt) / math.sqrt(Lt))
        self.qat = False
        self.last_load = None

    def forward(self, y):
        shp = y.shape
        yf = y.reshape(-1, shp[-1])
        N = yf.shape[0]
        s = torch.sigmoid(mm(yf, self.gate.weight))                          # [N,E]
        choice = s.detach() + self.gate.e_score_correction_bias.to(s.dtype)
        ids = torch.topk(choice, self.k, dim=-1, sorted=True).indices          # [N,k]
        sw = s.gather(1, ids)
        w = sw / (sw.sum(-1, keepdim=True) + 1e-20) * self.rsf                  # [N,k]
        z = mm(yf, self.routed_expert_down_proj.weight)                         # [N,Lt]
        w1, w2, w3 = self.w1, self.w2, self.w3
        if self.qat:
            w1, w2, w3 = mxfp4_ste(w1), mxfp4_ste(w2), mxfp4_ste(w3)
        flat_ids = ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=self.E)
        self.last_load = counts.detach()
        tok = order // self.k
        wsel = w.reshape(-1)[order]
        acc = z.new_zeros(N, self.Lt)
        start = 0
        cl = counts.tolist()
        for e in range(self.E):
            n = cl[e]
            if n == 0:
                continue
            ti = tok[start:start + n]
            ze = z.index_select(0, ti)
            a = situ(mm(ze, w1[e]), mm(ze, w3[e]), self.b1, self.b2)
            out = mm(a, w2[e]) * wsel[start:start + n].unsqueeze(-1)
            acc = acc.index_add(0, ti, out)
            start += n
        r = mm(rmsnorm(acc, self.routed_expert_norm.weight, self.eps), self.routed_expert_up_proj.weight)
        return (r + self.shared_experts(yf)).reshape(shp)


class Layer(nn.Module):
    def __init__(self, c, L):
        super().__init__()
        h = c["hidden_size"]
        la = c["linear_attn_config"]
        self.L = L
        self.eps = c["rms_norm_eps"]
        self.B = c["attn_res_block_size"]
        self.input_layernorm = ones(h)
        self.self_attention_res_norm = ones(h)
        self.self_attention_res_proj = Weight(1, h, init=nn.init.zeros_)
        self.post_attention_layernorm = ones(h)
        self.mlp_res_norm = ones(h)
        self.mlp_res_proj = Weight(1, h, init=nn.init.zeros_)
        if (L + 1) in la["full_attn_layers"]:
            self.self_attn = MLA(c)
            self.kind = "mla"
        elif (L + 1) in la["kda_layers"]:
            self.self_attn = KDA(c)
            self.kind = "kda"
        else:
            raise ValueError("layer %d in neither kda_layers nor full_attn_layers" % L)
        self.is_moe = L >= c["first_k_dense_replace"] and L % c["moe_layer_freq"] == 0
        if self.is_moe:
            self.block_sparse_moe = MoE(c)
        else:
            self.mlp = DenseMLP(c)

    def forward(self, h, anchors, dbg=None):
        eps = self.eps
        a_in, aw = attnres_mix(anchors, h, self.self_attention_res_norm.weight,
                               self.self_attention_res_proj.weight[0], eps)
        if self.L % self.B == 0:
            anchors = anchors + [h]
            partial = None
        else:
            partial = h
        att = self.self_attn(rmsnorm(a_in, self.input_layernorm.weight, eps))
        partial = att if partial is None else partial + att
        m_in, mw = attnres_mix(anchors, partial, self.mlp_res_norm.weight, self.mlp_res_proj.weight[0], eps)
        y = rmsnorm(m_in, self.post_attention_layernorm.weight, eps)
        ffn = self.block_sparse_moe(y) if self.is_moe else self.mlp(y)
        if dbg is not None:
            dbg.append(dict(attn_input_norm=a_in[..., -1, :].norm(-1), attn_output_norm=att[..., -1, :].norm(-1),
                            mlp_input_norm=m_in[..., -1, :].norm(-1), mlp_output_norm=ffn[..., -1, :].norm(-1)))
        return partial + ffn, anchors


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, V = c["hidden_size"], c["vocab_size"]
        self.embed_tokens = Weight(V, h, init=lambda w: nn.init.normal_(w, 0.0, 1.0))
        self.norm = ones(h)
        self.output_attn_res_norm = ones(h)
        self.output_attn_res_proj = Weight(1, h, init=nn.init.zeros_)
        self.layers = nn.ModuleList([Layer(c, L) for L in range(c["num_hidden_layers"])])


class K3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = text_config(cfg)
        self.c = c
        self.eps = c["rms_norm_eps"]
        self.model = Inner(c)
        self.lm_head = linear(c["vocab_size"], c["hidden_size"], std=0.5 / math.sqrt(c["hidden_size"]))

    def moe_layers(self):
        return [l.block_sparse_moe for l in self.model.layers if l.is_moe]

    def set_qat(self, on):
        for m in self.moe_layers():
            m.qat = on

    def hidden(self, ids, dbg=None):
        m = self.model
        h = m.embed_tokens.weight[ids]
        anchors = []
        for layer in m.layers:
            h, anchors = layer(h, anchors, dbg)
        f, _ = attnres_mix(anchors, h, m.output_attn_res_norm.weight, m.output_attn_res_proj.weight[0], self.eps)
        return rmsnorm(f, m.norm.weight, self.eps)

    def forward(self, ids):
        return mm(self.hidden(ids), self.lm_head.weight)


# ---------------------------------------------------------------- checkpoint name mapping

PREFIX = "language_model."


def state_from_checkpoint(model, tensors):
    """tensors: dict checkpoint name -> torch tensor (already dequantised to float). Loads in place."""
    sd = model.state_dict()
    new = {}
    experts = {}
    for name, t in tensors.items():
        if not name.startswith(PREFIX):
            continue
        n = name[len(PREFIX):]
        if ".block_sparse_moe.experts." in n:
            pre, rest = n.split(".block_sparse_moe.experts.")
            e, w = rest.split(".")[:2]
            experts.setdefault((pre, w), {})[int(e)] = t
            continue
        new[n] = t
    for (pre, w), d in experts.items():
        new[pre + ".block_sparse_moe." + w] = torch.stack([d[e] for e in range(len(d))])
    missing = set(sd) - set(new)
    extra = set(new) - set(sd)
    if missing or extra:
        raise ValueError("missing %s extra %s" % (sorted(missing)[:5], sorted(extra)[:5]))
    for k, v in new.items():
        if tuple(v.shape) != tuple(sd[k].shape):
            raise ValueError("shape %s %s vs %s" % (k, tuple(v.shape), tuple(sd[k].shape)))
        sd[k] = v.to(sd[k].dtype)
    model.load_state_dict(sd)
