"""Export a training checkpoint (tools/train/train.py) in Kimi K3's release layout.

  /usr/bin/python3 tools/train/export.py --ckpt build/train_ckpt/final.pt --out models/k3-mini

Writes config.json (root kimi_k3 + nested text_config + quantization_config),
model.safetensors.index.json and shards model-0000i-of-00000N.safetensors:
  * BF16 (round-to-nearest-even) for every trunk matrix and norm weight;
  * F32 for KDA A_log / dt_bias / q,k,v_conv1d / o_norm and the router's e_score_correction_bias;
  * routed experts as compressed-tensors MXFP4: experts.{e}.w{1,2,3}.weight_packed U8 [R, C/2]
    (low nibble = even column) + .weight_scale U8 [R, C/32] (E8M0, 2^(s-127)), quantised with
    k3.mxfp4_quantize_codes (the same rounding the QAT forward used).
Inside a shard tensors are ordered F32 group, BF16 group, U8 group, each sorted by name (the
safetensors writer convention of K3 and testdata/k3-tiny-a), so an expert's six tensors are
contiguous in the order w1 packed, w1 scale, w2 packed, w2 scale, w3 packed, w3 scale, and all
experts of a layer are in one shard. Tokenizer files are not touched (copy them with --tokenizer-from).
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3  # noqa: E402
import st  # noqa: E402

F32_SUFFIXES = ("self_attn.A_log", "self_attn.dt_bias", "q_conv1d.weight", "k_conv1d.weight",
                "v_conv1d.weight", "self_attn.o_norm.weight", "gate.e_score_correction_bias")


def pack_mxfp4(w):
    """w [R, C] float tensor -> (packed uint8 [R, C/2], scale uint8 [R, C/32])."""
    codes, scale = k3.mxfp4_quantize_codes(w)
    c = codes.numpy().astype(np.uint8)
    packed = (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)
    return packed, scale.numpy().astype(np.uint8)


def checkpoint_tensors(state, cfg):
    """-> dict checkpoint name -> (dtype, numpy array)."""
    out = {}
    for n, t in state.items():
        t = t.detach().to(torch.float32)
        if n.endswith(".block_sparse_moe.w1") or n.endswith(".block_sparse_moe.w2") or \
                n.endswith(".block_sparse_moe.w3"):
            pre, w = n.rsplit(".", 1)
            for e in range(t.shape[0]):
                p, s = pack_mxfp4(t[e])
                base = "%s%s.experts.%d.%s" % (k3.PREFIX, pre, e, w)
                out[base + ".weight_packed"] = ("U8", p)
                out[base + ".weight_scale"] = ("U8", s)
            continue
        name = k3.PREFIX + n
        if n.endswith(F32_SUFFIXES):
            out[name] = ("F32", t.numpy().astype("<f4"))
        else:
            out[name] = ("BF16", st.f32_to_bf16(t.numpy()))
    return out


def shard_of(name, nl, nshards):
    """embed + first layers in shard 1, ..., final norm / lm_head in the last shard."""
    n = name[len(k3.PREFIX):]
    if n.startswith("model.layers."):
        L = int(n.split(".")[2])
        per = -(-nl // (nshards - 1)) if nshards > 1 else nl
        return min(L // per, nshards - 2) + 1 if nshards > 1 else 1
    if n.startswith("model.embed_tokens"):
        return 1
    return nshards


def export(ckpt_path, out_dir, nshards, tokenizer_from=None):
    ck = torch.load(ckpt_path, map_location="cpu")
    cfg = ck["config"]
    model = k3.K3(cfg)
    model.load_state_dict(ck["model"])
    return export_model(model, cfg, out_dir, nshards, tokenizer_from)


def export_model(model, cfg, out_dir, nshards, tokenizer_from=None, quiet=False):
    """Write model (a k3.K3 with fp32 weights) to out_dir in the release layout."""
    c = k3.text_config(cfg)
    tens = checkpoint_tensors(model.state_dict(), cfg)
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.startswith("model-") and f.endswith(".safetensors"):
            os.remove(os.path.join(out_dir, f))
    nshards = max(1, min(nshards, c["num_hidden_layers"] + 1))
    groups = {i: [] for i in range(1, nshards + 1)}
    for name in tens:
        groups[shard_of(name, c["num_hidden_layers"], nshards)].append(name)
    weight_map = {}
    total = 0
    order = {"F32": 0, "BF16": 1, "U8": 2}
    for i, names in groups.items():
        fn = "model-%05d-of-%06d.safetensors" % (i, nshards)
        names.sort(key=lambda n: (order[tens[n][0]], n))
        total += st.write_safetensors(os.path.join(out_dir, fn), [(n, tens[n][0], tens[n][1]) for n in names])
        for n in names:
            weight_map[n] = fn
    idx = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    json.dump(idx, open(os.path.join(out_dir, "model.safetensors.index.json"), "w"), indent=2)
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
    if tokenizer_from:
        for f in ("tiktoken.model", "tokenizer_config.json"):
            src = os.path.join(tokenizer_from, f)
            if os.path.abspath(src) != os.path.abspath(os.path.join(out_dir, f)):
                shutil.copyfile(src, os.path.join(out_dir, f))
    nparam = sum(p.numel() for p in model.parameters())
    if not quiet:
        print("exported %s: %d tensors in %d shards, %d bytes of tensor data, %d parameters" %
              (out_dir, len(tens), nshards, total, nparam))
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--tokenizer-from", default=None, help="directory with tiktoken.model + tokenizer_config.json")
    a = ap.parse_args()
    export(a.ckpt, a.out, a.shards, a.tokenizer_from)


if __name__ == "__main__":
    main()
