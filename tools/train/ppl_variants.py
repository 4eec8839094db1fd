"""Held-out perplexity of the exported model with MXFP4 experts (as shipped) vs the same trunk with
BF16 experts (the training checkpoint's expert weights rounded to BF16), float32, same windows as
reference.py.

  /usr/bin/python3 tools/train/ppl_variants.py --model models/k3-mini --ckpt build/train_ckpt/final.pt
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3  # noqa: E402
import reference  # noqa: E402
import st  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/k3-mini")
    ap.add_argument("--ckpt", default="build/train_ckpt/final.pt")
    ap.add_argument("--heldout", default="build/train_data/heldout.txt")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg, model = reference.load_model(a.model, torch.float32)
    V = k3.text_config(cfg)["vocab_size"]
    text = open(a.heldout, "rb").read()
    ids = reference.tokenize_raw(a.model, text.decode("utf-8"))
    tb = reference.token_byte_lengths(a.model, V)
    res = {}
    nll, n, nb, _ = reference.perplexity(model, ids, a.window, tb)
    res["mxfp4_experts"] = {"mean_nll": nll / n, "perplexity": math.exp(nll / n), "bits_per_byte": nll / math.log(2) / nb}
    ck = torch.load(a.ckpt, map_location="cpu")["model"]
    with torch.no_grad():
        for i, m in enumerate(model.model.layers):
            if m.is_moe:
                for w in ("w1", "w2", "w3"):
                    src = ck["model.layers.%d.block_sparse_moe.%s" % (i, w)].numpy()
                    bf = st.bf16_to_f64(st.f32_to_bf16(src)).astype(np.float32)
                    getattr(m.block_sparse_moe, w).copy_(torch.from_numpy(bf))
    nll, n, nb, _ = reference.perplexity(model, ids, a.window, tb)
    res["bf16_experts"] = {"mean_nll": nll / n, "perplexity": math.exp(nll / n), "bits_per_byte": nll / math.log(2) / nb}
    res["scored_tokens"] = n
    res["window"] = a.window
    print(json.dumps(res, indent=1))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
