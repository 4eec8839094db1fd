"""Synthetic copy check: can a K3 shape (tools/train/k3.py) learn to copy a span of made-up ids?

Each example is  [BOS] x1..xn [SEP] x1..xn [EOS]  with n uniform in [--min-len, --max-len] and the
x random non-special ids (0 .. V-257). Whole examples are packed into windows of --seq ids (the
rest of a window is PAD, never a target); the loss counts only the copy half: the targets x1..xn
and the closing EOS (the ids after SEP). Held-out examples (a different RNG stream, fixed across
evals) are scored teacher-forced with argmax: token accuracy over the copied x's and EOS, and the
share of examples copied fully right (all x's and the EOS; teacher-forced all-correct is the same
as an exact greedy copy).

The model is built as train.py builds it: configs.preset("mini", **overrides) from scratch, or the
config.json + weights of an exported folder with --init-from (e.g. tools/train/wip/k3-mini-next);
AdamW, warmup then cosine on the --minutes budget, clip 1.0, the router-bias update of train.py.
No MXFP4 QAT here (this only asks what the shape can learn).

Eval is always on the FULL id set (every non-special id). When training draws from a smaller alphabet
(--alphabet A, or the current stage of --alphabet-schedule), a second, smaller held-out set drawn from
that alphabet is scored too ("small" columns).

--alphabet-schedule "64:300,512:600,3840": alphabet 64 for steps 0..299, 512 for 300..599, then 3840
(the last entry has no step bound; an alphabet >= V-256 or 0 means every non-special id).

Checkpoints (model, optimizer, step, clock, RNG state, curve) go to --ckpt (default
build/copy_check/<json name or 'run'>.pt) every --ckpt-minutes of wall time and at the end;
--resume PATH carries on from one (same command line otherwise; the cosine schedule keeps running on
the --minutes budget of the resumed command).

usage:
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 19 /usr/bin/python3 tools/train/copy_check.py \
      --minutes 15 [--layers 8 --mla-every 4 --mla-heads 4] [--init-from tools/train/wip/k3-mini-next]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import configs  # noqa: E402
import k3  # noqa: E402
import st  # noqa: E402
from train import lr_at, update_router_bias  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def make_windows(rng, nwin, T, V, lo, hi, bos, sep, eos, pad, alphabet=0):
    """-> x [nwin, T+1] int64 (inputs x[:, :-1], targets x[:, 1:]), mask [nwin, T] (1 = copy target),
    seqid [nwin, T] (example number of each target, -1 where none), number of examples."""
    nsym = alphabet if alphabet > 0 else V - 256
    x = np.full((nwin, T + 1), pad, dtype=np.int64)
    m = np.zeros((nwin, T), dtype=np.float32)
    sid = np.full((nwin, T), -1, dtype=np.int64)
    k = 0
    for w in range(nwin):
        p = 0
        while True:
            n = int(rng.integers(lo, hi + 1))
            L = 2 * n + 3
            if p + L > T + 1:
                if p == 0:
                    raise ValueError("--seq too short for --max-len")
                break
            s = rng.integers(0, nsym, size=n)
            x[w, p] = bos
            x[w, p + 1:p + 1 + n] = s
            x[w, p + 1 + n] = sep
            x[w, p + 2 + n:p + 2 + 2 * n] = s
            x[w, p + 2 + 2 * n] = eos
            # targets at positions t predict x[t+1]: the copy half is x[p+2+n .. p+2+2n]
            t0, t1 = p + 1 + n, p + 2 + 2 * n       # target indices t0..t1-1 (n x's + EOS)
            m[w, t0:t1] = 1.0
            sid[w, t0:t1] = k
            k += 1
            p += L
    return torch.from_numpy(x), torch.from_numpy(m), torch.from_numpy(sid), k


def parse_schedule(text, conv):
    """ "V1:S1,V2:S2,V3" -> [(conv(V1), S1), (conv(V2), S2), (conv(V3), None)]: value V1 for steps < S1,
    V2 for steps < S2, then V3 (the last entry has no step bound; if it has one, its value stays)."""
    sched = []
    parts = [q.strip() for q in text.split(",") if q.strip()]
    for i, q in enumerate(parts):
        if ":" in q:
            a, u = q.split(":")
            sched.append((conv(a), int(u)))
        else:
            if i != len(parts) - 1:
                raise ValueError("only the last schedule entry may lack a step bound: %r" % text)
            sched.append((conv(q), None))
    if sched[-1][1] is not None:
        sched.append((sched[-1][0], None))
    return sched


def value_at(sched, step):
    for a, u in sched:
        if u is None or step < u:
            return a
    return sched[-1][0]


def alphabet_conv(V):
    """--alphabet-schedule entries: an alphabet >= V-256 or <= 0 means every non-special id (0)"""
    V0 = V - 256
    return lambda q: 0 if int(q) <= 0 or int(q) >= V0 else int(q)


def copy_spec(c, min_len=4, max_len=24):
    """make_windows' arguments after (rng, nwin, T) for a text config c: V, lo, hi, bos, sep, eos, pad"""
    V = c["vocab_size"]
    return (V, min_len, max_len, c["bos_token_id"], V - 256 + 5, c["eos_token_id"], c["pad_token_id"])


def heldout_sets(spec, T, windows, small_windows, alphabets):
    """the fixed held-out sets: the full id set (seed 10_007) and one per small alphabet (seed 20_000 + A)"""
    ev = make_windows(np.random.default_rng(10_000 + 7), windows, T, *spec, 0)
    small = {}
    if small_windows > 0:
        for a in alphabets:
            if a > 0 and a not in small:
                small[a] = make_windows(np.random.default_rng(20_000 + a), small_windows, T, *spec, a)
    return ev, small


def masked_loss(model, x, m):
    lg = model(x[:, :-1])
    ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
    return (ce * m.reshape(-1)).sum() / m.sum().clamp(min=1.0), lg


@torch.no_grad()
def evaluate(model, ev, bsz):
    model.eval()
    x, m, sid, nex = ev
    tot_loss, tok_ok, tok_n = 0.0, 0, 0
    wrong = torch.zeros(nex, dtype=torch.int64)
    for i in range(0, x.shape[0], bsz):
        xb, mb, sb = x[i:i + bsz], m[i:i + bsz], sid[i:i + bsz]
        loss, lg = masked_loss(model, xb, mb)
        tot_loss += loss.item() * mb.sum().item()
        ok = (lg.argmax(-1) == xb[:, 1:]) & (mb > 0)
        tok_ok += ok.sum().item()
        tok_n += int(mb.sum().item())
        bad = (~ok) & (mb > 0)
        wrong.index_add_(0, sb[bad], torch.ones(int(bad.sum().item()), dtype=torch.int64))
    model.train()
    return tot_loss / max(tok_n, 1), tok_ok / max(tok_n, 1), (wrong == 0).float().mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mla-every", type=int, default=4, help="layer L (1-based) is MLA when L %% mla_every == 0")
    ap.add_argument("--mla-heads", type=int, default=4)
    ap.add_argument("--config-over", default="{}", help="JSON dict of further make_config overrides")
    ap.add_argument("--init-from", default="", help="exported model folder (config.json + safetensors); its "
                    "config is used and --layers/--mla-every/--mla-heads are ignored")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: --minutes only)")
    ap.add_argument("--minutes", type=float, default=15.0, help="training-time budget (eval time excluded)")
    ap.add_argument("--seq", type=int, default=128, help="window length (ids)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-len", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=24)
    ap.add_argument("--alphabet", type=int, default=0,
                    help="draw the x's from ids 0..A-1 only (0: every non-special id, V-256 of them)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--kda-chunk", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=50, help="steps between evals")
    ap.add_argument("--eval-windows", type=int, default=64, help="held-out windows per eval")
    ap.add_argument("--stop-at", type=float, default=0.97, help="stop once full-copy accuracy reaches this")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="write the eval curve here")
    ap.add_argument("--alphabet-schedule", default="",
                    help='e.g. "64:300,512:600,3840": alphabet A until step S, ...; overrides --alphabet')
    ap.add_argument("--small-eval-windows", type=int, default=32,
                    help="held-out windows for the small-alphabet eval (0: none)")
    ap.add_argument("--ckpt", default="", help="checkpoint file (default build/copy_check/<json stem|run>.pt)")
    ap.add_argument("--ckpt-minutes", type=float, default=10.0, help="wall minutes between checkpoints")
    ap.add_argument("--resume", default="", help="checkpoint to resume from")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    k3.KDA_MODE["chunk"] = args.kda_chunk
    torch.manual_seed(args.seed)

    if args.init_from:
        cfg = json.load(open(os.path.join(args.init_from, "config.json")))
    else:
        over = dict(layers=args.layers, mla_every=args.mla_every, mla_heads=args.mla_heads)
        over.update(json.loads(args.config_over))
        cfg = configs.preset("mini", **over)
    c = k3.text_config(cfg)
    V = c["vocab_size"]
    model = k3.K3(cfg)
    if args.init_from:
        _, tens = st.load_checkpoint(args.init_from)
        k3.state_from_checkpoint(model, {k: torch.from_numpy(v).to(torch.float32) for k, v in tens.items()})
        log("initialised from the exported model", args.init_from)
    la = c["linear_attn_config"]
    nparam = sum(p.numel() for p in model.parameters())
    log("layers %d MLA %s KDA %s mla heads %d rope %d hidden %d params %d" %
        (c["num_hidden_layers"], la["full_attn_layers"], la["kda_layers"], c["num_attention_heads"],
         c["qk_rope_head_dim"], c["hidden_size"], nparam))

    V0 = V - 256
    bos, sep, eos, pad = c["bos_token_id"], V0 + 5, c["eos_token_id"], c["pad_token_id"]

    norm_a = alphabet_conv(V)
    # alphabet schedule: list of (alphabet, until_step) with the last until_step None
    if args.alphabet_schedule:
        sched = parse_schedule(args.alphabet_schedule, norm_a)
    else:
        sched = [(norm_a(args.alphabet), None)]

    def alphabet_at(st_):
        return value_at(sched, st_)

    def spec_for(a):
        return (V, args.min_len, args.max_len, bos, sep, eos, pad, a)

    ev, small_ev = heldout_sets(spec_for(0)[:-1], args.seq, args.eval_windows, args.small_eval_windows,
                                [a for a, _ in sched])
    log("held-out (full id set): %d examples in %d windows of %d; copy targets %d" %
        (ev[3], args.eval_windows, args.seq, int(ev[1].sum().item())))
    for a, e in small_ev.items():
        log("held-out (alphabet %d): %d examples in %d windows" % (a, e[3], args.small_eval_windows))
    log("alphabet schedule:", sched)
    rng = np.random.default_rng(args.seed)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "conv1d" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))

    budget = args.minutes * 60.0
    curve = []
    step, elapsed, ids = 0, 0.0, 0
    run_loss, run_n, ids_since, t_since = 0.0, 0, 0, 0.0

    ckpt_path = args.ckpt or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "copy_check",
        (os.path.splitext(os.path.basename(args.json))[0] if args.json else "run") + ".pt")
    ckpt_path = os.path.normpath(ckpt_path)

    def save_ckpt():
        tmp = ckpt_path + ".tmp"
        torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), step=step, elapsed=elapsed, ids=ids,
                        rng=rng.bit_generator.state, torch_rng=torch.get_rng_state(), curve=curve,
                        args=vars(args)), tmp)
        os.replace(tmp, ckpt_path)
        log("checkpoint", ckpt_path, "step", step)

    if args.resume:
        ck = torch.load(args.resume, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, ids, curve = ck["step"], ck["elapsed"], ck["ids"], ck["curve"]
        rng.bit_generator.state = ck["rng"]
        torch.set_rng_state(ck["torch_rng"])
        log("resumed from", args.resume, "at step", step, "train-min %.1f" % (elapsed / 60))

    def do_eval():
        el, ta, fa = evaluate(model, ev, 16)
        rate = ids_since / max(t_since, 1e-9)
        a = alphabet_at(max(step - 1, 0))
        extra, rec = "", {}
        if a in small_ev:
            sl, sa, sf = evaluate(model, small_ev[a], 16)
            extra = "  | A=%d eval-loss %.4f tok-acc %.4f full-copy %.4f" % (a, sl, sa, sf)
            rec = dict(small_alphabet=a, small_eval_loss=round(sl, 4), small_tok_acc=round(sa, 4),
                       small_full_copy=round(sf, 4))
        log("step %5d  train-min %5.1f  ids %8d  ids/s %5.0f  train-loss %.4f  eval-loss %.4f  tok-acc %.4f  "
            "full-copy %.4f%s" % (step, elapsed / 60, ids, rate, run_loss / max(run_n, 1), el, ta, fa, extra))
        curve.append(dict(step=step, minutes=round(elapsed / 60, 2), ids=ids, ids_per_s=round(rate),
                          alphabet=a or V0, train_loss=round(run_loss / max(run_n, 1), 4), eval_loss=round(el, 4),
                          tok_acc=round(ta, 4), full_copy=round(fa, 4), **rec))
        if args.json:
            json.dump(dict(args=vars(args), curve=curve), open(args.json, "w"), indent=1)
        return fa

    if not args.resume:
        do_eval()
    last_ckpt = time.time()
    while elapsed < budget and (args.steps == 0 or step < args.steps):
        t0 = time.time()
        frac = elapsed / budget
        lr = lr_at(args, step, frac)
        for g in opt.param_groups:
            g["lr"] = lr
        x, m, _, _ = make_windows(rng, args.batch, args.seq, *spec_for(alphabet_at(step)))
        loss, _ = masked_loss(model, x, m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(loss) and torch.isfinite(gn):
            opt.step()
        update_router_bias(model, args.bias_gamma)
        step += 1
        ids += args.batch * args.seq
        dt = time.time() - t0
        elapsed += dt
        run_loss += loss.item()
        run_n += 1
        ids_since += args.batch * args.seq
        t_since += dt
        if step % args.eval_every == 0:
            fa = do_eval()
            run_loss, run_n, ids_since, t_since = 0.0, 0, 0, 0.0
            if fa >= args.stop_at:
                log("full-copy accuracy %.4f >= %.2f: stopping" % (fa, args.stop_at))
                break
        if time.time() - last_ckpt >= args.ckpt_minutes * 60:
            save_ckpt()
            last_ckpt = time.time()
    if step % args.eval_every != 0:
        do_eval()
    save_ckpt()
    log("done", json.dumps(curve[-1]))


if __name__ == "__main__":
    main()
