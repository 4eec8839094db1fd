"""Step 1 check: float64 forward of tools/train/k3.py against testdata/k3-tiny-a fixtures.

usage: /usr/bin/python3 tools/train/check_fixture.py [testdata/k3-tiny-a]
Prints max |logit diff| per prompt and whether greedy continuations match; exit 1 on failure.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3  # noqa: E402
import st  # noqa: E402


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "testdata/k3-tiny-a"
    torch.set_num_threads(2)
    cfg, tens = st.load_checkpoint(os.path.join(root, "checkpoint"))
    model = k3.K3(cfg).double()
    k3.state_from_checkpoint(model, {k: torch.from_numpy(v) for k, v in tens.items()})
    model.eval()
    V = k3.text_config(cfg)["vocab_size"]
    prompts = json.load(open(os.path.join(root, "fixtures", "prompts.json")))
    ok = True
    worst = 0.0
    for p in prompts:
        meta = json.load(open(os.path.join(root, "fixtures", p["name"] + ".json")))
        ids = meta["all_ids"]
        ref = np.fromfile(os.path.join(root, "fixtures", meta["logits_file"]), dtype="<f4").reshape(len(ids), V)
        with torch.no_grad():
            lg = model(torch.tensor([ids]))[0].numpy()
        d = np.abs(lg - ref).max()
        worst = max(worst, d)
        # free-running greedy
        cur = list(meta["prompt_ids"])
        with torch.no_grad():
            for _ in range(len(meta["continuation_ids"])):
                cur.append(int(model(torch.tensor([cur]))[0, -1].argmax()))
        gm = cur[len(meta["prompt_ids"]):] == meta["continuation_ids"]
        print("%s: T=%d max|diff|=%.3e greedy_match=%s" % (p["name"], len(ids), d, gm))
        ok = ok and gm and d < 1e-4
    print("worst max|diff| = %.3e -> %s" % (worst, "PASS" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
