#!/usr/bin/python3
"""Held-out loss by position (issue 38): windows of --window ids of held-out documentation text
(build/train38/heldout_docs.txt, in no training row), float32 PyTorch forward of an exported
model, mean cross-entropy (nats/id) of the targets in position bins 0-512, 512-2K, 2K-8K, 8K-16K.

  /usr/bin/python3 tools/train/eval_positions.py --model tools/train/wip/k3-mini-next [--windows 4]

MLA attention is evaluated in blocks of queries here (same result, bounded memory at 16K ids);
k3.py itself is not changed. Needs build/corpus_ids (tokenization with the model's tokenizer).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k3  # noqa: E402
import st  # noqa: E402

BINS = [(0, 512), (512, 2048), (2048, 8192), (8192, 16384)]


def mla_blocked(self, x, qblock=2048):
    B, T, _ = x.shape
    Hm, dn, dr, dv = self.Hm, self.dn, self.dr, self.dv
    qa = k3.rmsnorm(k3.mm(x, self.q_a_proj.weight), self.q_a_layernorm.weight, self.eps)
    q = k3.mm(qa, self.q_b_proj.weight).view(B, T, Hm, dn + dr)
    ckv = k3.mm(x, self.kv_a_proj_with_mqa.weight)
    lat = k3.rmsnorm(ckv[..., : self.Rkv], self.kv_a_layernorm.weight, self.eps)
    k_rope = ckv[..., self.Rkv:]
    kv = k3.mm(lat, self.kv_b_proj.weight).view(B, T, Hm, dn + dv)
    key = torch.cat([kv[..., :dn], k_rope.unsqueeze(2).expand(B, T, Hm, dr)], -1)
    val = kv[..., dn:]
    qh, kh, vh = q.transpose(1, 2), key.transpose(1, 2), val.transpose(1, 2)
    outs = []
    for s in range(0, T, qblock):
        e = min(T, s + qblock)
        sc = (qh[:, :, s:e] @ kh[:, :, :e].transpose(-1, -2)) / math.sqrt(dn + dr)
        mask = torch.ones(e - s, e, dtype=torch.bool).triu(s + 1)
        sc = sc.masked_fill(mask, float("-inf"))
        outs.append(torch.softmax(sc, -1) @ vh[:, :, :e])
    o = torch.cat(outs, 2).transpose(1, 2).reshape(B, T, Hm * dv)
    o = o * torch.sigmoid(k3.mm(x, self.g_proj.weight))
    return k3.mm(o, self.o_proj.weight)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tools/train/wip/k3-mini-next")
    ap.add_argument("--docs", default="build/train38/heldout_docs.txt")
    ap.add_argument("--window", type=int, default=16384)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--corpus-ids", default="build/corpus_ids")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    k3.KDA_MODE["chunk"] = 32
    k3.MLA.forward = mla_blocked
    with tempfile.TemporaryDirectory() as d:
        j = os.path.join(d, "docs.jsonl")
        with open(j, "w") as f:
            f.write(json.dumps({"text": open(a.docs, encoding="utf-8").read()}) + "\n")
        subprocess.run([a.corpus_ids, "--model", a.model, "--in", j, "--out", os.path.join(d, "ids.u16")],
                       check=True, capture_output=True)
        ids = np.fromfile(os.path.join(d, "ids.u16"), dtype="<u2").astype(np.int64)[:-1]
    cfg, tens = st.load_checkpoint(a.model)
    model = k3.K3(cfg)
    k3.state_from_checkpoint(model, {k: torch.from_numpy(v).to(torch.float32) for k, v in tens.items()})
    model.eval()
    W = a.window
    n = min(a.windows, (len(ids) - 1) // (W + 1))
    tot = np.zeros(W)
    for w in range(n):
        x = torch.from_numpy(ids[w * (W + 1): (w + 1) * (W + 1)])[None]
        with torch.no_grad():
            lg = model(x[:, :-1])
            ce = F.cross_entropy(lg[0], x[0, 1:], reduction="none").numpy()
        tot += ce
        print("window %d/%d: mean %.4f" % (w + 1, n, ce.mean()), flush=True)
    tot /= max(n, 1)
    res = {"model": a.model, "window": W, "windows": n, "ids": int(len(ids)), "mean": float(tot.mean())}
    for lo, hi in BINS:
        if lo < W:
            res["loss_%d_%d" % (lo, min(hi, W))] = float(tot[lo:min(hi, W)].mean())
    print(json.dumps(res))
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
