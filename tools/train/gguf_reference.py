"""Float64 reference outputs of a (quantized) llama.cpp kimi-k3 GGUF, as fixtures for the C engine:
the weights are the values the file stores (gguf-py's dequantization, gguf_weights.py undoing
llama.cpp's conversions), the forward pass is k3.py's in float64.

  /usr/bin/python3 tools/train/gguf_reference.py --gguf M.gguf --config CONFIG.json \
      --gguf-py build/gguf-py --out DIR [--new 8] [--prompts 3]

CONFIG.json: the release config of the model the GGUF was made from (k3gen writes it beside).
Writes into DIR the same formats as testdata/k3-mini-ref (tests/test_mini.c reads both):
  prompts.json                [{name, ids}]
  <name>.json                 prompt_ids, continuation_ids (greedy, float64), all_ids, the smallest
                              top-1/top-2 gap of the decision rows and the smallest router margin
  <name>.logits.f32.bin       float32 LE [T, V]; row t = logits after all_ids[0..t]
  summary.json                the file, its tensor types, the tolerances
Prompts are chosen among deterministic candidates (id sequences) for robust decisions: every
decision row's top-1/top-2 gap >= 0.02 and every router's k-th/(k+1)-th margin >= 3e-5 (float32
engine arithmetic differs from float64 by ~1e-5), as reference.py does.
"""
import argparse
import json
import os
import random
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_weights  # noqa: E402
import k3  # noqa: E402
import reference  # noqa: E402

MIN_GAP, MIN_MARGIN = 0.02, 3e-5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--gguf-py", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--candidates", type=int, default=24)
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    torch.set_default_dtype(torch.float64)
    model = k3.K3(cfg).to(torch.float64)
    shapes = {k3.PREFIX + k: tuple(v.shape) for k, v in model.state_dict().items()}
    w = gguf_weights.load(a.gguf, a.gguf_py, shapes)
    k3.state_from_checkpoint(model, {k: torch.from_numpy(v) for k, v in w.items()})
    model.eval()
    V = k3.text_config(cfg)["vocab_size"]
    rng = random.Random(3939)
    os.makedirs(a.out, exist_ok=True)
    chosen = []
    for c in range(a.candidates):
        if len(chosen) == a.prompts:
            break
        n = [1, 9, 24][len(chosen) % 3]
        prompt = [rng.randrange(1, V - 1) for _ in range(n)]
        with torch.no_grad():
            ids = reference.greedy(model, prompt, a.new)
            lg = model(torch.tensor([ids]))[0].to(torch.float64)
        top = torch.topk(lg[len(prompt) - 1:], 2, dim=-1).values
        gap = float((top[:, 0] - top[:, 1]).min())
        margin = reference.router_margin(model, ids)
        print("candidate %d (%d ids): gap %.4f, router margin %.2e" % (c, n, gap, margin))
        if gap < MIN_GAP or margin < MIN_MARGIN:
            continue
        name = "q%d_%dids" % (len(chosen) + 1, n)
        lg.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(a.out, name + ".logits.f32.bin"))
        json.dump({"name": name, "prompt_ids": prompt, "continuation_ids": ids[len(prompt):], "all_ids": ids,
                   "logits_file": name + ".logits.f32.bin", "logits_shape": [len(ids), V], "logits_dtype": "float32",
                   "min_decision_gap": gap, "min_router_margin": margin},
                  open(os.path.join(a.out, name + ".json"), "w"), indent=1)
        chosen.append({"name": name, "ids": prompt})
    if len(chosen) < a.prompts:
        sys.exit("gguf_reference: only %d of %d candidates had robust decisions" % (len(chosen), a.prompts))
    json.dump(chosen, open(os.path.join(a.out, "prompts.json"), "w"), indent=1)
    sys.path.insert(0, a.gguf_py)
    import gguf  # noqa: E402
    types = {}
    for t in gguf.GGUFReader(a.gguf).tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    json.dump({"gguf": os.path.basename(a.gguf), "tensor_types": types, "dtype": "float64",
               "tolerance": {"max_abs_logit_diff": 5e-3, "greedy_ids": "exact"},
               "min_decision_gap": MIN_GAP, "min_router_margin": MIN_MARGIN},
              open(os.path.join(a.out, "summary.json"), "w"), indent=1)
    print("gguf_reference: wrote %d prompts to %s" % (len(chosen), a.out))


if __name__ == "__main__":
    main()
