#!/usr/bin/python3
"""Average the weights of training checkpoints that share one model config (a "model soup"): runs continued
from the same export with different seeds or data, or one run's late checkpoints.  Every floating-point tensor
of the state dicts is averaged in float64 (optionally weighted); any other tensor must be equal in all inputs.
The output holds the config and the averaged weights only (no optimizer state), which export.py reads:

  /usr/bin/python3 tools/train/soup.py --out build/soup.pt build/stage_r/r1/final.pt build/stage_r/r2/final.pt
  /usr/bin/python3 tools/train/export.py --ckpt build/soup.pt --out build/soup --tokenizer-from models/k3-mini

The average is taken on the fp32 master weights, before MXFP4: export.py quantizes the averaged experts once.
An input may also be an exported model folder (config.json + safetensors, as train.py --init-from reads it):
its BF16 trunk and dequantized MXFP4 experts stand in for master weights that are gone (a new machine).
"""
import argparse
import json
import os
import sys

import torch


def load(path):
    """a train.py checkpoint, or an exported model folder read back as one ({config, model})"""
    if not os.path.isdir(path):
        return torch.load(path, map_location="cpu")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import k3
    import st
    cfg = json.load(open(os.path.join(path, "config.json")))
    model = k3.K3(cfg)
    _, tens = st.load_checkpoint(path)
    k3.state_from_checkpoint(model, {k: torch.from_numpy(v).to(torch.float32) for k, v in tens.items()})
    return {"config": cfg, "model": model.state_dict()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpts", nargs="+", help="train.py checkpoints (.pt) or exported model folders to average")
    ap.add_argument("--weights", default=None, help="comma-separated weights, one per checkpoint (default: equal)")
    ap.add_argument("--out", required=True, help="the averaged checkpoint (.pt)")
    a = ap.parse_args()
    if len(a.ckpts) < 2:
        sys.exit("soup: give at least two checkpoints")
    w = [1.0] * len(a.ckpts)
    if a.weights:
        try:
            w = [float(x) for x in a.weights.split(",")]
        except ValueError:
            sys.exit("soup: --weights %r is not a list of numbers" % a.weights)
        if len(w) != len(a.ckpts) or any(x < 0 for x in w) or sum(w) <= 0:
            sys.exit("soup: --weights needs %d non-negative numbers with a positive sum" % len(a.ckpts))
    w = [x / sum(w) for x in w]
    cfg = None
    acc = {}
    keep = {}
    dtypes = {}  # the first checkpoint's tensor order and dtypes, which the output keeps
    for path, wi in zip(a.ckpts, w):
        ck = load(path)
        if "config" not in ck or "model" not in ck:
            sys.exit("soup: %s is not a train.py checkpoint (no config / model)" % path)
        if cfg is None:
            cfg = ck["config"]
        elif json.dumps(ck["config"], sort_keys=True) != json.dumps(cfg, sort_keys=True):
            sys.exit("soup: %s has another model config than %s" % (path, a.ckpts[0]))
        sd = ck["model"]
        if not dtypes:
            dtypes = {n: t.dtype for n, t in sd.items()}
        if acc or keep:
            names = set(acc) | set(keep)
            if set(sd) != names:
                sys.exit("soup: %s has other tensors than %s" % (path, a.ckpts[0]))
        for n, t in sd.items():
            if t.is_floating_point():
                if n in acc:
                    if acc[n].shape != t.shape:
                        sys.exit("soup: %s: %s has shape %s, not %s" % (path, n, tuple(t.shape), tuple(acc[n].shape)))
                    acc[n] += wi * t.double()
                else:
                    acc[n] = wi * t.double()
            else:
                if n in keep and not torch.equal(keep[n], t):
                    sys.exit("soup: %s: the non-float tensor %s differs from %s's" % (path, n, a.ckpts[0]))
                keep.setdefault(n, t.clone())
        del ck, sd
    model = {n: (acc[n].to(dt) if n in acc else keep[n]) for n, dt in dtypes.items()}
    torch.save({"config": cfg, "model": model, "soup": {"ckpts": a.ckpts, "weights": w}}, a.out)
    print("soup: %d checkpoints, %d tensors averaged, %d kept -> %s" % (len(a.ckpts), len(acc), len(keep), a.out))


if __name__ == "__main__":
    main()
