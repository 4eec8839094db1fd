#!/usr/bin/env python3
"""qwen3_toy.py - a small random Qwen3 model (transformers' Qwen3ForCausalLM layout) and its
float64 reference logits, for deltafin's Qwen3 tests (tests/test_qwen3.c).

  qwen3_toy.py make OUT_DIR [--layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 32
                            --ffn 96 --vocab 512 --untied --dtype f32|bf16 --seed 1 --embed-scale 0.5]
      config.json (model_type qwen3) and model.safetensors: weights N(0, 1/fan_in), norm weights
      1 + N(0, 0.1), embeddings N(0, embed-scale^2) (a large scale makes a confident drafter); tied embeddings unless --untied (then lm_head.weight).
  qwen3_toy.py scripted OUT_DIR IDS --vocab V [--wrong-at J] [--unsure-at J,K,...]
      a Qwen3 model that proposes a known chain: after chain id i it predicts chain id i + 1 with
      probability ~1 (one layer whose attention and MLP outputs are zero, so the hidden state is
      the embedding: chain id i's row is the one-hot e_i, scaled; the untied lm_head maps e_i to
      the next id; any other id gives all-zero logits, so no confident token).  Each chain id
      must have one successor (the caller cuts the chain where that stops holding).  --wrong-at J
      makes the successor of chain id J the id after next (a drafter that diverges there by
      skipping a piece of the text and goes on confidently), or an id outside the chain at its end.
      --unsure-at J,K,...: after those chain positions no id is confident (a drafter that knows the
      text but for a few places, sure again once the target has gone past them).
  qwen3_toy.py gguf MODEL_DIR OUT.gguf [--type f32|f16|bf16|q8_0] [--split N]
      the same model as llama.cpp's converter writes it (conversion/qwen.py: general.architecture
      qwen3, its keys, blk.N.* tensor names, no output.weight when tied) with the weights in that
      type (1-D norms stay F32); a minimal "gpt2" vocabulary of byte tokens so llama.cpp loads it.
      --split N: in N files as llama.cpp's gguf-split writes them (OUT-00001-of-0000N.gguf, ...:
      gguf-py's writer with at most ceil(tensors / N) tensors a file, the metadata in the first).
      Needs gguf-py (PYTHONPATH; tests/llama/get_gguf_py.sh).
  qwen3_toy.py ref MODEL_DIR|FILE.gguf IDS OUT.f64 [--mistake interleaved-rope|rope-before-norm|kv-mod]
      the logits of every position of the comma-separated ids, float64 [n][vocab], computed from
      the stored weights (bf16 widened exactly) as transformers' modeling_qwen3.py defines the
      model: pre-norm blocks, RMSNorm (eps from config) then weight, q/k RMS-normed per head
      before NeoX rotate-half RoPE (theta from config), GQA (query head h reads kv head
      h // (H / KV)), scores * head_dim^-0.5, causal softmax, SiLU MLP, final norm, lm_head.
      --mistake computes a deliberately wrong model (GPT-J interleaved RoPE, RoPE before the
      QK-norm, kv head h % KV): the tests check the engine is far from those.
Needs numpy (Debian's python3-numpy); writes safetensors itself."""
import json
import struct
import sys

import numpy as np


# Hugging Face tensor names -> llama.cpp's (gguf-py tensor_mapping.py)
GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}
GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def bf16_round(a):
    """float32 -> the bf16 bit patterns (round to nearest even), as uint16"""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, arr in tensors:
        if dtype == "bf16":
            b = bf16_round(arr).tobytes()
            dt = "BF16"
        else:
            b = arr.astype("<f4").tobytes()
            dt = "F32"
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "F32":
            x = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif t["dtype"] == "BF16":
            x = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise SystemExit("unsupported dtype " + t["dtype"])
        out[name] = x.reshape(t["shape"])
    return out


def arg(args, k, d):
    return type(d)(args[args.index(k) + 1]) if k in args else d


def make(out, args):
    import os
    L, E, H, KV = arg(args, "--layers", 2), arg(args, "--hidden", 64), arg(args, "--heads", 4), arg(args, "--kv-heads", 2)
    D, F, V = arg(args, "--head-dim", 32), arg(args, "--ffn", 96), arg(args, "--vocab", 512)
    dtype, seed, tied = arg(args, "--dtype", "f32"), arg(args, "--seed", 1), "--untied" not in args
    rng = np.random.default_rng(seed)
    w = lambda o, i: (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
    nw = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    t = [("model.embed_tokens.weight", (arg(args, "--embed-scale", 0.5) * rng.standard_normal((V, E))).astype(np.float32))]
    for l in range(L):
        p = "model.layers.%d." % l
        t += [(p + "input_layernorm.weight", nw(E)), (p + "self_attn.q_proj.weight", w(H * D, E)),
              (p + "self_attn.k_proj.weight", w(KV * D, E)), (p + "self_attn.v_proj.weight", w(KV * D, E)),
              (p + "self_attn.o_proj.weight", w(E, H * D)), (p + "self_attn.q_norm.weight", nw(D)),
              (p + "self_attn.k_norm.weight", nw(D)), (p + "post_attention_layernorm.weight", nw(E)),
              (p + "mlp.gate_proj.weight", w(F, E)), (p + "mlp.up_proj.weight", w(F, E)),
              (p + "mlp.down_proj.weight", w(E, F))]
    t.append(("model.norm.weight", nw(E)))
    if not tied:
        t.append(("lm_head.weight", w(V, E)))
    os.makedirs(out, exist_ok=True)
    write_safetensors(out + "/model.safetensors", t, dtype)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": E, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": D, "intermediate_size": F,
           "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": tied,
           "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 4096,
           "torch_dtype": "bfloat16" if dtype == "bf16" else "float32", "bos_token_id": 0, "eos_token_id": 1}
    json.dump(cfg, open(out + "/config.json", "w"), indent=1)


def scripted(out, chain, V, wrong_at, unsure_at=()):
    import os
    n = len(chain)
    E = max(16, ((n + 15) // 16) * 16)
    D, F = 16, 16
    emb = np.zeros((V, E), np.float32)
    head = np.zeros((V, E), np.float32)
    for i, t in enumerate(chain):
        emb[t, i] = 1.0
        if i + 1 < n:
            nxt = chain[i + 1]
            if i == wrong_at:
                # skip a chain id: the drafter stays confident (chain[i + 2] has its successor), so the
                # wrong text lies inside a proposal and is verified, not held back as its last, perhaps
                # unfinished, word; an id outside the chain when there is nothing to skip to
                nxt = chain[i + 2] if i + 2 < n and chain[i + 2] != chain[i + 1] else (chain[i + 1] + 1) % V
            if i not in unsure_at:
                head[nxt, i] = 8.0
    p = "model.layers.0."
    z = lambda o, i: np.zeros((o, i), np.float32)
    one = lambda k: np.ones(k, np.float32)
    t = [("model.embed_tokens.weight", emb), (p + "input_layernorm.weight", one(E)),
         (p + "self_attn.q_proj.weight", z(D, E)), (p + "self_attn.k_proj.weight", z(D, E)),
         (p + "self_attn.v_proj.weight", z(D, E)), (p + "self_attn.o_proj.weight", z(E, D)),
         (p + "self_attn.q_norm.weight", one(D)), (p + "self_attn.k_norm.weight", one(D)),
         (p + "post_attention_layernorm.weight", one(E)), (p + "mlp.gate_proj.weight", z(F, E)),
         (p + "mlp.up_proj.weight", z(F, E)), (p + "mlp.down_proj.weight", z(E, F)),
         ("model.norm.weight", one(E)), ("lm_head.weight", head)]
    os.makedirs(out, exist_ok=True)
    write_safetensors(out + "/model.safetensors", t, "f32")
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": E, "num_hidden_layers": 1,
           "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": D, "intermediate_size": F,
           "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
           "hidden_act": "silu", "torch_dtype": "float32"}
    json.dump(cfg, open(out + "/config.json", "w"), indent=1)


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, theta, interleaved):
    D = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.outer(pos, inv)                                   # [T, D/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]    # [T, 1, D/2]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2], y[..., 1::2] = x1 * c - x2 * s, x1 * s + x2 * c
        return y
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def read_gguf(path):
    """config and HF-named float64 weights of a qwen3 GGUF, dequantized by gguf-py (not by deltafin)"""
    import gguf
    r = gguf.GGUFReader(path)
    f = lambda k: r.fields[k].parts[r.fields[k].data[0]][0]
    cfg = {"hidden_size": int(f("qwen3.embedding_length")), "num_hidden_layers": int(f("qwen3.block_count")),
           "num_attention_heads": int(f("qwen3.attention.head_count")),
           "num_key_value_heads": int(f("qwen3.attention.head_count_kv")),
           "head_dim": int(f("qwen3.attention.key_length")), "rope_theta": float(f("qwen3.rope.freq_base")),
           "rms_norm_eps": float(f("qwen3.attention.layer_norm_rms_epsilon"))}
    back = {v: k for k, v in GGUF_TOP.items()}
    per = {v: k for k, v in GGUF_LAYER.items()}
    W = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
        if t.name in back:
            W[back[t.name]] = a
        else:
            parts = t.name.split(".")
            W["model.layers.%s.%s.weight" % (parts[1], per[parts[2]])] = a
    return cfg, W


def ref(model_dir, ids, out, mistake):
    if model_dir.endswith(".gguf"):
        cfg, W = read_gguf(model_dir)
    else:
        cfg = json.load(open(model_dir + "/config.json"))
        W = read_safetensors(model_dir + "/model.safetensors")
    E, L, H, KV = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", E // H)
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(L):
        p = "model.layers.%d." % l
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, D)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KV, D)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KV, D)
        il = mistake == "interleaved-rope"
        if mistake == "rope-before-norm":
            q = rms(rope(q, pos, theta, il), W[p + "self_attn.q_norm.weight"], eps)
            k = rms(rope(k, pos, theta, il), W[p + "self_attn.k_norm.weight"], eps)
        else:
            q = rope(rms(q, W[p + "self_attn.q_norm.weight"], eps), pos, theta, il)
            k = rope(rms(k, W[p + "self_attn.k_norm.weight"], eps), pos, theta, il)
        o = np.empty((T, H, D))
        for hh in range(H):
            kv = hh % KV if mistake == "kv-mod" else hh // (H // KV)
            sc = (q[:, hh, :] @ k[:, kv, :].T) * D ** -0.5
            sc[np.triu(np.ones((T, T), dtype=bool), 1)] = -np.inf
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            o[:, hh, :] = (sc / sc.sum(axis=1, keepdims=True)) @ v[:, kv, :]
        x = x + o.reshape(T, H * D) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    (x @ head.T).astype("<f8").tofile(out)


def to_gguf(model_dir, out, qtype, split=1):
    import gguf
    cfg = json.load(open(model_dir + "/config.json"))
    W = read_safetensors(model_dir + "/model.safetensors")
    E, L, H, KV = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, V = cfg.get("head_dim", E // H), cfg["vocab_size"]
    per_file = -(-len(W) // split) if split > 1 else 0
    w = gguf.GGUFWriter(out, "qwen3", split_max_tensors=per_file)
    w.add_block_count(L)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(E)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type({"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}[qtype])
    # a vocabulary llama.cpp accepts: V tokens, byte-level strings of distinct ids, no merges needed beyond one
    toks = ["<t%d>" % i for i in range(V)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types([1] * V)
    w.add_token_merges(["< t"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    qt = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[qtype]
    for name, arr in W.items():
        if name in GGUF_TOP:
            gname = GGUF_TOP[name]
        else:
            parts = name.split(".")
            gname = "blk.%s.%s.weight" % (parts[2], GGUF_LAYER[".".join(parts[3:-1])])
        a = arr.astype(np.float32)
        if a.ndim == 1 or qtype == "f32":
            w.add_tensor(gname, a)
        else:
            q = gguf.quants.quantize(a, qt)
            w.add_tensor(gname, q, raw_shape=q.shape if qtype == "f16" else None, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) >= 2 and a[0] == "make":
        make(a[1], a[2:])
    elif len(a) >= 3 and a[0] == "scripted":
        unsure = arg(a, "--unsure-at", "")
        scripted(a[1], [int(t) for t in a[2].split(",")], arg(a, "--vocab", 151936), arg(a, "--wrong-at", -1),
                 {int(t) for t in unsure.split(",")} if unsure else set())
    elif len(a) >= 3 and a[0] == "gguf":
        to_gguf(a[1], a[2], arg(a, "--type", "f32"), arg(a, "--split", 1))
    elif len(a) >= 4 and a[0] == "ref":
        ref(a[1], [int(t) for t in a[2].split(",")], a[3], arg(a, "--mistake", ""))
    else:
        sys.exit(__doc__)
