"""Train a K3-architecture model (tools/train/k3.py) on uint16 token files.

Time-budgeted: the schedule (warmup, cosine LR, MXFP4 QAT phase) is a function of the fraction
of --minutes spent training, so a run ends on time whatever the machine's speed. Checkpoints
(model + optimizer + schedule position) go to --out every --ckpt-minutes; --resume continues from
<out>/last.pt (the elapsed training time is restored, so the schedule continues where it stopped).

Router correction bias: K3's aux-loss-free balancing, not trained by gradient: after every step
bias_e += gamma * sign(mean_load - load_e) per MoE layer.

usage (detached):
  nohup /usr/bin/python3 tools/train/train.py --preset mini --minutes 85 --out build/train_ckpt \
      > build/train.log 2>&1 &
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
import export as k3export  # noqa: E402
import k3  # noqa: E402
import st  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Data:
    """Random windows of T+1 ids from a uint16 file; with a .mask file next to it (uint8 per id,
    1 = prose or assistant-reply id), the loss only counts targets whose mask is 1."""

    def __init__(self, path, V, seed, use_mask=True):
        self.a = np.memmap(path, dtype="<u2", mode="r") if path else None
        mp = path[: -len(".u16")] + ".mask" if path else None
        self.m = np.memmap(mp, dtype=np.uint8, mode="r") if (use_mask and mp and os.path.exists(mp)) else None
        self.V = V
        self.rng = np.random.default_rng(seed)

    def conversation_starts(self, open_id, end_id, system_role, user_role):
        """offsets of chat conversation starts: a message `<|open|>message role="system"|"user"`
        right after an `<|end_of_msg|>` whose own message was not a system message."""
        a = np.asarray(self.a)
        starts = np.where((a[1:-4] == open_id) & (a[:-5] == end_id))[0] + 1
        role = a[starts + 4]
        starts = starts[(role == system_role) | (role == user_role)]
        msg_starts = np.where((a[1:-4] == open_id) & (a[:-5] == end_id))[0] + 1
        # previous message start for each start
        j = np.searchsorted(msg_starts, starts) - 1
        prev_role = np.where(j >= 0, a[msg_starts[np.maximum(j, 0)] + 4], -1)
        self.conv = starts[prev_role != system_role]
        self.conv = self.conv[self.conv < len(a) - 300]
        return self.conv

    def long_reply_ends(self, sep_id, end_id, min_len):
        """offsets of the <|end_of_msg|> that ends an assistant reply (mask 1, after <|sep|>) at least
        min_len ids after its conversation's start (needs conversation_starts first): the ends of
        the long-context conversations (a long system prompt, then a question)."""
        a = np.asarray(self.a)
        m = np.asarray(self.m)
        ends = np.where((a[1:] == end_id) & (a[:-1] == sep_id) & (m[1:] == 1))[0] + 1
        j = np.searchsorted(self.conv, ends) - 1
        ok = j >= 0
        dist = ends - np.where(ok, self.conv[np.maximum(j, 0)], 0)
        self.long_ends = ends[ok & (dist >= min_len)]
        return self.long_ends

    def batch(self, B, T, rng=None, chat_frac=0.0, long_frac=0.0):
        rng = rng or self.rng
        if self.a is None:
            x = torch.from_numpy(rng.integers(0, self.V, size=(B, T + 1)).astype(np.int64))
            return x, torch.ones(B, T)
        off = rng.integers(0, len(self.a) - T - 1, size=B)
        if chat_frac > 0:
            pick = rng.random(B) < chat_frac
            off = np.where(pick, self.conv[rng.integers(0, len(self.conv), size=B)], off)
        if long_frac > 0:
            # windows that end at a long conversation's last reply: the question and answer come
            # after as much of the long system prompt as the window holds
            pick = rng.random(B) < long_frac
            e = self.long_ends[rng.integers(0, len(self.long_ends), size=B)]
            off = np.where(pick, np.maximum(e - T, 0), off)
        # a conversation or long-reply window near the end of the file is moved back so that it
        # holds T + 1 ids (conversation_starts only keeps starts 300 ids from the end)
        off = np.minimum(off, len(self.a) - T - 1)
        self.last_off = off  # the windows' start offsets (train.py --kl-weight-from)
        x = torch.from_numpy(np.stack([np.asarray(self.a[o:o + T + 1]) for o in off]).astype(np.int64))
        if self.m is None:
            return x, torch.ones(B, T)
        m = torch.from_numpy(np.stack([np.asarray(self.m[o + 1:o + T + 1]) for o in off]).astype(np.float32))
        return x, m


OPEN_ID, CLOSE_ID, TOOLS_ID = 3843, 3844, 294  # k3-mini tokenizer: <|open|>, <|close|>, `tools`


def call_ids_mask(x):
    """(B, T) float mask over the targets x[:, 1:]: 1 inside a tool-call block, from the id after
    `<|open|>tools` to the `tools` of `<|close|>tools` (a window that starts inside a block counts
    from its start)"""
    a = x.numpy()
    B, T1 = a.shape
    ev = np.zeros((B, T1), dtype=np.int64)
    op = (a[:, :-1] == OPEN_ID) & (a[:, 1:] == TOOLS_ID)
    cl = (a[:, :-1] == CLOSE_ID) & (a[:, 1:] == TOOLS_ID)
    ev[:, 1:] += op.astype(np.int64)
    ev[:, 1:] -= cl.astype(np.int64)
    for b in range(B):
        nz = np.nonzero(ev[b])[0]
        if len(nz) and ev[b, nz[0]] < 0:
            ev[b, 0] += 1
    depth = np.cumsum(ev, axis=1)
    # target j is x[j + 1]: inside when the depth after position j is > 0, or it is the closing `tools`
    ins = (depth[:, :-1] > 0)
    return torch.from_numpy(ins.astype(np.float32))


SEP_ID, END_ID, QUOTE_ID, EQQ_ID, TOOL_KEY_ID = 3845, 3842, 1, 2995, 291  # <|sep|> <|end_of_msg|> `"` `="` ` tool`
TOOL_MSG = (3843, 306, 292, 2995, 258)  # <|open|>message role="tool


def call_weights(x, msk, call_w, first_w, answer_w, want_answer=False):
    """(B, T) LM-loss weights over the targets x[:, 1:] (stage N): call_w inside a tool-call block
    (call_ids_mask), first_w on the first id of each argument value (after `type="string"<|sep|>`,
    i.e. `"` then <|sep|>) and of the tool name (after ` tool="`) in a block, answer_w on the reply
    ids after a tool message (up to the reply's masked <|end_of_msg|>), 1 elsewhere. Returns the
    weights and the call mask (want_answer: and the answer mask, as a third value)."""
    cm = call_ids_mask(x)
    w = torch.ones_like(msk) + (call_w - 1) * cm
    a = x.numpy()
    if first_w > 0:
        prev, cur = a[:, :-2], a[:, 1:-1]  # target j >= 1: x[j - 1], x[j]
        f = ((cur == SEP_ID) & (prev == QUOTE_ID)) | ((cur == EQQ_ID) & (prev == TOOL_KEY_ID))
        fm = torch.zeros_like(msk)
        fm[:, 1:] = torch.from_numpy(f.astype(np.float32))
        fm = fm * cm
        w = torch.where(fm > 0, torch.full_like(w, first_w), w)
    if answer_w != 1.0 or want_answer:
        mk = msk.numpy()
        am = np.zeros(mk.shape, dtype=np.float32)
        B, T1 = a.shape
        L = len(TOOL_MSG)
        for b in range(B):
            hs = np.nonzero(np.all([a[b, k:T1 - L + 1 + k] == TOOL_MSG[k] for k in range(L)], axis=0))[0]
            for h in hs:
                # targets j (x[j + 1]) from the header on, through the first masked <|end_of_msg|>
                j0 = h + L - 1
                ends = np.nonzero((a[b, j0 + 1:] == END_ID) & (mk[b, j0:] > 0))[0]
                j1 = j0 + ends[0] + 1 if len(ends) else T1 - 1
                am[b, j0:j1] = 1.0
        am = torch.from_numpy(am) * msk
        w = torch.where(am > 0, torch.full_like(w, answer_w), w)
    if want_answer:
        return w, cm, am
    return w, cm


def lm_loss(model, xb, logits=None):
    x, m = xb
    lg = model(x[:, :-1]) if logits is None else logits
    ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
    return (ce * m.reshape(-1)).sum() / m.sum().clamp(min=1.0)


@torch.no_grad()
def update_router_bias(model, gamma):
    """The router's load-balancing bias step: each expert's correction bias
    moves by gamma towards the mean load (aux-loss-free balancing)."""
    with torch.no_grad():
        for m in model.moe_layers():
            load = m.last_load.to(torch.float32)
            m.gate.e_score_correction_bias += gamma * torch.sign(load.mean() - load)


def lr_at(args, step, frac):
    """Linear warmup over args.warmup steps, then cosine from args.lr down to
    args.min_lr_frac of it over the time budget (frac: share of it spent)."""
    prime = getattr(args, "adam_prime", 0)
    if step < prime:
        return 0.0  # the optimizer's moments fill up; the weights do not move
    if step - prime < args.warmup:
        return args.lr * (step - prime + 1) / args.warmup
    if args.anneal_minutes > 0:
        # stage O: constant args.lr, then the cosine over the budget's last --anneal-minutes only
        a = min(args.anneal_minutes / args.minutes, 1.0)
        frac = max(0.0, (frac - (1.0 - a)) / a)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def evaluate(model, data, B, T, nb, seed=1234):
    model.eval()
    rng = np.random.default_rng(seed)
    tot = 0.0
    for _ in range(nb):
        tot += lm_loss(model, data.batch(B, T, rng)).item()
    model.train()
    return tot / nb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--config-over", default="{}", help="JSON dict of make_config overrides")
    ap.add_argument("--train", default="build/train_data/train.u16")
    ap.add_argument("--val", default="build/train_data/val.u16")
    ap.add_argument("--random-data", action="store_true", help="smoke test on random ids")
    ap.add_argument("--out", default="build/train_ckpt")
    ap.add_argument("--minutes", type=float, default=85.0, help="training-time budget")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=60, help="warmup steps")
    ap.add_argument("--anneal-minutes", type=float, default=0.0,
                    help="stage O: lr constant (--lr) after the warmup, then the cosine down to --min-lr-frac over "
                         "the budget's last M minutes only; 0 = the cosine over the whole budget")
    ap.add_argument("--qat-frac", type=float, default=0.12, help="last fraction of the budget with MXFP4 QAT")
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--ckpt-minutes", type=float, default=5.0)
    ap.add_argument("--eval-minutes", type=float, default=5.0)
    ap.add_argument("--eval-batches", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init-from", default="",
                    help="start from weights only (fresh optimizer, --warmup): a train.py checkpoint FILE.pt or an "
                         "exported model folder (config.json + safetensors, e.g. models/k3-mini)")
    ap.add_argument("--export-dir", default="",
                    help="every --export-minutes and at the end, write the weights as an exported model folder "
                         "(release layout, MXFP4 experts, ~14 MB; no optimizer state) that --init-from takes")
    ap.add_argument("--export-minutes", type=float, default=30.0)
    ap.add_argument("--tokenizer-from", default="models/k3-mini", help="tokenizer files copied into --export-dir")
    ap.add_argument("--distill-from", default="", help="teacher checkpoint (KL on its logits + LM loss): a train.py "
                    ".pt, or (stage O) an exported model folder (config.json + safetensors, as --init-from reads it)")
    ap.add_argument("--kl-weight", type=float, default=0.5,
                    help="with --distill-from: short steps' loss = (1 - W) x LM loss + W x KL to the teacher")
    ap.add_argument("--kl-weight-from", default="",
                    help='"OFF:W": rows of the --train file whose window starts at id offset >= OFF (e.g. a block '
                         'of sum rows appended after OFF ids) get KL weight W instead of --kl-weight (per-id mix '
                         'over the batch\'s masked ids; copy / span rows keep --kl-weight); "OFF1:W1,OFF2:W2,...": '
                         'the largest OFFi <= the window start applies')
    ap.add_argument("--synth-kl", type=float, default=-1.0,
                    help="stage P, with --kl-weight-from: KL weight of the copy / span rows instead of --kl-weight "
                         "(0: plain LM loss, so a skill the teacher lacks is not pulled back to it); < 0 = off")
    ap.add_argument("--synth-lr-mult", type=float, default=0.0,
                    help="stage Q: a step with copy / span rows and --train rows makes two updates, the synthetic "
                         "rows alone at lr x M, then the --train rows at lr (0 = one update over the whole batch)")
    ap.add_argument("--adam-prime", type=int, default=0,
                    help="the first K steps run at lr 0, so that a fresh optimizer (--init-from) starts with moments "
                         "averaged over K batches instead of the sign-like first steps of an empty Adam; the warmup "
                         "follows them (0 = off)")
    ap.add_argument("--synth-params", default="",
                    help="stage Q, with --synth-lr-mult: the synthetic-row update changes only the parameters whose "
                         "name matches this regular expression (e.g. 'layers\\.[67]\\.block_sparse_moe\\.(w[123]|shared)')")
    ap.add_argument("--call-weight", type=float, default=1.0,
                    help="stage N: LM-loss weight of the reply ids inside a tool-call block (`<|open|>tools` .. "
                         "`<|close|>tools`: the tool name, argument keys and values) in the short steps; 1 = off")
    ap.add_argument("--call-kl", type=float, default=-1.0,
                    help="stage N, with --distill-from: KL weight of the ids inside a tool-call block instead of "
                         "their row's weight (e.g. 0: plain LM loss on the call); < 0 = off")
    ap.add_argument("--call-first-weight", type=float, default=0.0,
                    help="stage N: LM-loss weight of the FIRST id of each argument value and of the tool name inside "
                         "a tool-call block (instead of --call-weight); 0 = --call-weight")
    ap.add_argument("--answer-weight", type=float, default=1.0,
                    help="stage N: LM-loss weight of the assistant reply right after a tool result (`<|open|>message "
                         "role=\"tool\"` .. the reply's `<|end_of_msg|>`); 1 = off")
    ap.add_argument("--answer-kl", type=float, default=-1.0,
                    help="stage X, with --distill-from: KL weight of the reply ids after a tool result (the ids "
                         "--answer-weight weighs) instead of their row's weight (0: plain LM loss, so answers "
                         "written in a new form are not pulled back to the teacher's); < 0 = off")
    ap.add_argument("--no-mask", action="store_true", help="train on every id (ignore the .mask files)")
    ap.add_argument("--chat-frac", type=float, default=0.0,
                    help="fraction of training windows that start at a chat conversation start")
    ap.add_argument("--long-frac", type=float, default=0.0,
                    help="fraction of training windows that end at the last reply of a conversation at least "
                         "--long-min ids long (long system prompt, then the question)")
    ap.add_argument("--long-min", type=int, default=1000)
    ap.add_argument("--kda-chunk", type=int, default=16,
                    help="KDA chunk length of the chunked form (same result; 32 is ~30%% faster at 2K windows; "
                         "64 overflows float32)")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--max-step-seconds", type=float, default=0.0,
                    help="count at most this many wall seconds of one step towards --minutes (0: no cap); keeps "
                         "the schedule on course when the process is paused (SIGSTOP) or starved for a while")
    ap.add_argument("--copy-frac", type=float, default=0.0,
                    help="share of each batch's rows that are synthetic copy windows (copy_check.py's generator: "
                         "[BOS] x1..xn <|sep|> x1..xn <|end_of_msg|> packed, loss on the copied half only); "
                         "a fractional row count is drawn (floor + Bernoulli)")
    ap.add_argument("--copy-frac-schedule", default="",
                    help='e.g. "1.0:600,0.25": copy share 1.0 until step 600, then 0.25 (overrides --copy-frac)')
    ap.add_argument("--copy-alphabet-schedule", default="",
                    help='copy ids drawn from ids 0..A-1, e.g. "64:300,512:600,3840" (copy_check.py\'s '
                         '--alphabet-schedule; empty: every non-special id)')
    ap.add_argument("--copy-min-len", type=int, default=4)
    ap.add_argument("--copy-max-len", type=int, default=24)
    ap.add_argument("--copy-eval-seq", type=int, default=128,
                    help="held-out copy eval windows (128 x 64: copy_check.py's default held-out set, 236 examples)")
    ap.add_argument("--copy-eval-windows", type=int, default=64)
    ap.add_argument("--span-frac", type=float, default=0.0,
                    help="share of each batch's rows that are synthetic span-copy windows (copy_span.py: 1-3 values "
                         "inside a random-id sentence, framed per example, copied after <|sep|> each behind its key "
                         "and closed by an end id; loss on the copied ids and end ids only); floor + Bernoulli")
    ap.add_argument("--span-frac-schedule", default="",
                    help='e.g. "0.5:400,0.2": span share 0.5 until step 400, then 0.2 (overrides --span-frac)')
    ap.add_argument("--span-min-len", type=int, default=1)
    ap.add_argument("--span-max-len", type=int, default=6)
    ap.add_argument("--span-max-values", type=int, default=3)
    ap.add_argument("--span-modes", default="",
                    help='span framings and their shares, e.g. "quote:0.25,pair:0.15,punct:0.2,word:0.4" (copy_span.py; '
                         'empty: the stage-H mix quote 0.35 / pair 0.2 / punct 0.45); with word > 0 a held-out '
                         'word-framing set is logged too ("span-word eval"); spell:P (stage P) adds the spell framing '
                         '(the value without its space, canonically tokenized) and logs "span-spell eval"; bare:P the '
                         'spelling table alone ("span-bare eval")')
    ap.add_argument("--span-recut", action="store_true",
                    help="spell / bare span rows copy the word as corpus_ids --recut-values writes a tool-call "
                         "value (the first piece spelled without its space, the other pieces verbatim) instead of "
                         "its canonical cut; the span-spell / span-bare evals then measure that copy")
    ap.add_argument("--span-clean", action="store_true",
                    help="span rows: a connector id only before an open id (quote / pair framings)")
    ap.add_argument("--span-common-next", type=float, default=0.0,
                    help="word-framing span rows: share of values closed by a frequent English word (` today`, "
                         "` doing`; copy_span.COMMON_WORDS) instead of a random word; > 0 also logs a held-out "
                         "set of such rows (\"span-common eval\"); 0 = the stage-I rows exactly")
    ap.add_argument("--span-eval-seq", type=int, default=128)
    ap.add_argument("--long-every", type=int, default=0,
                    help="every K-th step is a long step instead (0: none): --long-batch windows of one of "
                         "--long-seqs ids from --long-train, each ending at the last reply of a conversation at "
                         "least --long-min ids long (a long system prompt, then the question); no copy / span rows")
    ap.add_argument("--long-train", default="", help="token file of the long steps (default: --train)")
    ap.add_argument("--long-seqs", default="2048",
                    help='window lengths of the long steps, one drawn per step, e.g. "2048,4096,4096" (repeat to weight)')
    ap.add_argument("--long-batch", type=int, default=1)
    ap.add_argument("--long-prompt-weight", type=float, default=0.0,
                    help="long steps: loss = mean over the reply ids (mask 1) + W * mean over the other ids of the "
                         "window (the documentation of the system prompt, the question): W > 0 also trains the "
                         "language model at long positions")
    ap.add_argument("--span-eval-windows", type=int, default=64)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    k3.KDA_MODE["chunk"] = args.kda_chunk
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    last = os.path.join(args.out, "last.pt")

    state = None
    if args.resume:
        state = torch.load(last, map_location="cpu")
        cfg = state["config"]
        log("resuming from", last, "step", state["step"], "elapsed %.1f min" % (state["elapsed"] / 60))
    elif args.init_from and os.path.isdir(args.init_from):
        cfg = json.load(open(os.path.join(args.init_from, "config.json")))
    else:
        cfg = configs.preset(args.preset, **json.loads(args.config_over))
    c = k3.text_config(cfg)
    V = c["vocab_size"]
    model = k3.K3(cfg)
    nparam = sum(p.numel() for p in model.parameters())
    nexp = sum(m.w1.numel() + m.w2.numel() + m.w3.numel() for m in model.moe_layers())
    log("params %d (routed experts %d, active/token ~%d)" %
        (nparam, nexp, nparam - nexp + nexp * c["num_experts_per_token"] // c["num_experts"]))
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=1)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "conv1d" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    step, elapsed = 0, 0.0
    prior_ids = 0  # training ids behind an exported --init-from folder (its snapshot.json)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed = state["step"], state["elapsed"]
        prior_ids = state.get("prior_ids", 0)
        np_rng_state = state.get("np_rng")
    elif args.init_from and os.path.isdir(args.init_from):
        _, tens = st.load_checkpoint(args.init_from)
        k3.state_from_checkpoint(model, {k: torch.from_numpy(v).to(torch.float32) for k, v in tens.items()})
        log("initialised from the exported model", args.init_from, "(fresh optimizer, warmup %d steps)" % args.warmup)
        sp = os.path.join(args.init_from, "snapshot.json")
        if os.path.exists(sp):
            prior = json.load(open(sp))
            prior_ids = prior.get("ids_total", prior.get("ids", 0))
            log("the snapshot had %d training ids (step %s)" % (prior_ids, prior.get("step")))
    elif args.init_from:
        model.load_state_dict(torch.load(args.init_from, map_location="cpu")["model"])
        log("initialised from", args.init_from)

    teacher = None
    if args.distill_from:
        if os.path.isdir(args.distill_from):
            teacher = k3.K3(json.load(open(os.path.join(args.distill_from, "config.json"))))
            _, ttens = st.load_checkpoint(args.distill_from)
            k3.state_from_checkpoint(teacher, {k: torch.from_numpy(v).to(torch.float32) for k, v in ttens.items()})
            del ttens
        else:
            ts = torch.load(args.distill_from, map_location="cpu")
            teacher = k3.K3(ts["config"])
            teacher.load_state_dict(ts["model"])
        teacher.eval()
        teacher.set_qat(True)
        for p in teacher.parameters():
            p.requires_grad_(False)
        log("distilling from", args.distill_from)

    train = Data(None if args.random_data else args.train, V, args.seed + step, not args.no_mask)
    val = Data(None if args.random_data else args.val, V, 999, not args.no_mask)
    if state is not None and np_rng_state is not None:
        train.rng.bit_generator.state = np_rng_state
    if args.chat_frac > 0:
        V0 = V - 256
        n = len(train.conversation_starts(V0 + 3, V0 + 2, 301, 303))
        log("chat-frac %.2f: %d conversation starts" % (args.chat_frac, n))
    if args.long_frac > 0:
        V0 = V - 256
        if args.chat_frac <= 0:
            train.conversation_starts(V0 + 3, V0 + 2, 301, 303)
        n = len(train.long_reply_ends(V0 + 5, V0 + 2, args.long_min))
        log("long-frac %.2f: %d replies at least %d ids into their conversation" % (args.long_frac, n, args.long_min))
    long_on = args.long_every > 0
    long_rng, long_ids = None, 0
    if long_on:
        V0 = V - 256
        long_seqs = [int(t) for t in args.long_seqs.split(",")]
        ldata = Data(args.long_train or args.train, V, args.seed + 40_000, not args.no_mask)
        ldata.conversation_starts(V0 + 3, V0 + 2, 301, 303)
        n = len(ldata.long_reply_ends(V0 + 5, V0 + 2, args.long_min))
        long_rng = np.random.default_rng(args.seed + 41_000)
        if state is not None:
            if state.get("long_rng"):
                long_rng.bit_generator.state = state["long_rng"]
                ldata.rng.bit_generator.state = state["long_data_rng"]
            long_ids = state.get("long_ids", 0)
        log("long steps: every %d steps, %d x %s ids from %s, %d replies at least %d ids into their conversation, "
            "prompt weight %.2f" % (args.long_every, args.long_batch, long_seqs, args.long_train or args.train, n,
                                    args.long_min, args.long_prompt_weight))

    def long_loss(xb):
        x, m = xb
        lg = model(x[:, :-1])
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
        m = m.reshape(-1)
        loss = (ce * m).sum() / m.sum().clamp(min=1.0)
        if args.long_prompt_weight > 0:
            mp = 1.0 - m
            loss = loss + args.long_prompt_weight * (ce * mp).sum() / mp.sum().clamp(min=1.0)
        return loss

    # synthetic copy rows (copy_check.py), only with --copy-frac / --copy-frac-schedule
    copy_on = args.copy_frac > 0 or bool(args.copy_frac_schedule)
    copy_rng, copy_ids, evals = None, 0, []
    if copy_on:
        import copy_check as cc
        copy_spec = cc.copy_spec(c, args.copy_min_len, args.copy_max_len)
        copy_alpha = cc.parse_schedule(args.copy_alphabet_schedule or "0", cc.alphabet_conv(V))
        copy_fracs = (cc.parse_schedule(args.copy_frac_schedule, float) if args.copy_frac_schedule
                      else [(args.copy_frac, None)])
        copy_ev, copy_small_ev = cc.heldout_sets(copy_spec, args.copy_eval_seq, args.copy_eval_windows, 32,
                                                 [a for a, _ in copy_alpha])
        copy_rng = np.random.default_rng(args.seed + 38_000)
        if state is not None:
            if state.get("copy_rng"):
                copy_rng.bit_generator.state = state["copy_rng"]
            copy_ids = state.get("copy_ids", 0)
            evals = state.get("evals", [])
        log("copy rows: share %s, alphabet %s, held-out %d examples (+ %s small-alphabet sets)" %
            (copy_fracs, copy_alpha, copy_ev[3], sorted(copy_small_ev)))

    # synthetic span-copy rows (copy_span.py), only with --span-frac
    span_on = args.span_frac > 0 or bool(args.span_frac_schedule)
    span_rng, span_ids = None, 0
    if span_on:
        import copy_check as cc
        import copy_span as cs
        cs.RECUT = args.span_recut
        span_modes = cs.parse_modes(args.span_modes)
        span_spec = cs.span_spec(c, args.span_min_len, args.span_max_len, args.span_max_values, span_modes,
                                 args.span_clean, args.span_common_next)
        span_ev = cs.heldout_set(span_spec, args.span_eval_seq, args.span_eval_windows)
        span_word_ev = (cs.heldout_word_set(span_spec, args.span_eval_seq, args.span_eval_windows)
                        if span_modes[3] > 0 else None)
        span_common_ev = (cs.heldout_common_set(span_spec, args.span_eval_seq, args.span_eval_windows)
                          if span_modes[3] > 0 and args.span_common_next > 0 else None)
        span_spell_ev = (cs.heldout_spell_set(span_spec, args.span_eval_seq, args.span_eval_windows)
                         if len(span_modes) > 4 else None)
        span_bare_ev = (cs.heldout_bare_set(span_spec, args.span_eval_seq, args.span_eval_windows)
                        if len(span_modes) > 5 else None)
        span_fracs = (cc.parse_schedule(args.span_frac_schedule, float) if args.span_frac_schedule
                      else [(args.span_frac, None)])
        span_rng = np.random.default_rng(args.seed + 39_000)
        if state is not None:
            if state.get("span_rng"):
                span_rng.bit_generator.state = state["span_rng"]
            span_ids = state.get("span_ids", 0)
            evals = state.get("evals", [])
        log("span rows: share %s, values 1-%d of %d-%d ids, framings %s%s, held-out %d examples%s" %
            (span_fracs, args.span_max_values, args.span_min_len, args.span_max_len, span_modes,
             " (clean)" if args.span_clean else "", span_ev[3],
             " + %d word-framing examples" % span_word_ev[3] if span_word_ev is not None else ""))
        if span_common_ev is not None:
            log("span rows: word-framing values closed by a frequent word with p %.2f (%d word ids), held-out "
                "%d such examples" % (args.span_common_next, len(cs.common_ids()), span_common_ev[3]))

    def span_rows_at(st_, budget_rows):
        f = cc.value_at(span_fracs, st_) * args.batch
        n = int(math.floor(f))
        n += int(span_rng.random() < f - n)
        return min(n, budget_rows)

    def span_eval():
        el, ta, fa = cc.evaluate(model, span_ev, 16)
        log("step %d span eval loss %.4f tok-acc %.4f full-copy %.4f" % (step, el, ta, fa))
        rec = dict(span_eval_loss=round(el, 4), span_tok_acc=round(ta, 4), span_full=round(fa, 4))
        if span_word_ev is not None:
            el, ta, fa = cc.evaluate(model, span_word_ev, 16)
            log("step %d span-word eval loss %.4f tok-acc %.4f full-copy %.4f" % (step, el, ta, fa))
            rec.update(span_word_eval_loss=round(el, 4), span_word_tok_acc=round(ta, 4), span_word_full=round(fa, 4))
        if span_common_ev is not None:
            el, ta, fa = cc.evaluate(model, span_common_ev, 16)
            log("step %d span-common eval loss %.4f tok-acc %.4f full-copy %.4f" % (step, el, ta, fa))
            rec.update(span_common_eval_loss=round(el, 4), span_common_tok_acc=round(ta, 4),
                       span_common_full=round(fa, 4))
        if span_spell_ev is not None:
            el, ta, fa = cc.evaluate(model, span_spell_ev, 16)
            log("step %d span-spell eval loss %.4f tok-acc %.4f full-copy %.4f" % (step, el, ta, fa))
            rec.update(span_spell_eval_loss=round(el, 4), span_spell_tok_acc=round(ta, 4),
                       span_spell_full=round(fa, 4))
        if span_bare_ev is not None:
            el, ta, fa = cc.evaluate(model, span_bare_ev, 16)
            log("step %d span-bare eval loss %.4f tok-acc %.4f full-copy %.4f" % (step, el, ta, fa))
            rec.update(span_bare_eval_loss=round(el, 4), span_bare_tok_acc=round(ta, 4), span_bare_full=round(fa, 4))
        return rec

    def synth_evals():
        return {**(copy_eval() if copy_on else {}), **(span_eval() if span_on else {})}

    def copy_rows_at(st_):
        f = cc.value_at(copy_fracs, st_) * args.batch
        n = int(math.floor(f))
        n += int(copy_rng.random() < f - n)
        return min(n, args.batch)

    def copy_eval():
        """copy_check.py's held-out eval: loss, token accuracy, full-copy share (full id set and, while the
        alphabet is small, that alphabet's set)"""
        el, ta, fa = cc.evaluate(model, copy_ev, 16)
        rec = dict(copy_eval_loss=round(el, 4), copy_tok_acc=round(ta, 4), copy_full=round(fa, 4))
        a = cc.value_at(copy_alpha, max(step - 1, 0))
        msg = "step %d copy eval loss %.4f tok-acc %.4f full-copy %.4f" % (step, el, ta, fa)
        if a in copy_small_ev:
            sl, sa, sf = cc.evaluate(model, copy_small_ev[a], 16)
            rec.update(small_alphabet=a, small_tok_acc=round(sa, 4), small_full=round(sf, 4))
            msg += "  | A=%d loss %.4f tok-acc %.4f full-copy %.4f" % (a, sl, sa, sf)
        log(msg)
        return rec

    if (copy_on or span_on) and state is None:
        v0 = evaluate(model, val, args.batch, args.seq, args.eval_batches)
        log("step 0 val loss %.4f" % v0)
        evals.append(dict(step=0, minutes=0.0, ids=0, copy_ids=0, **({"span_ids": 0} if span_on else {}),
                          val_loss=round(v0, 4), qat=False, **synth_evals()))

    budget = args.minutes * 60.0
    t_last = time.time()
    t_ck = time.time()
    t_ev = time.time()
    t_ex = time.time()
    run_loss, run_n = 0.0, 0
    step_ids = 0  # ids of the steps since the last log line (long steps have other shapes)
    qat_on = False
    t20 = time.time()

    def export_snapshot():
        """weights-only snapshot in the release layout, replaced atomically (tmp dir + rename)"""
        if not args.export_dir:
            return
        d = args.export_dir.rstrip("/")
        tmp, old = d + ".tmp", d + ".old"
        import shutil
        for x in (tmp, old):
            if os.path.isdir(x):
                shutil.rmtree(x)
        k3export.export_model(model, cfg, tmp, 4, args.tokenizer_from, quiet=True)
        ids = step * args.batch * args.seq
        if long_on:  # long steps have their own shape
            ids = (step - step // args.long_every) * args.batch * args.seq + long_ids
        json.dump({"step": step, "elapsed_minutes": round(elapsed / 60, 2), "ids": ids,
                   "ids_total": prior_ids + ids,
                   "seq": args.seq, "batch": args.batch, "init_from": args.init_from, "qat": qat_on,
                   **({"copy_ids": copy_ids} if copy_on else {}),
                   **({"span_ids": span_ids} if span_on else {}),
                   **({"long_ids": long_ids, "long_seqs": args.long_seqs, "long_every": args.long_every}
                      if long_on else {}),
                   "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())},
                  open(os.path.join(tmp, "snapshot.json"), "w"), indent=1)
        if os.path.isdir(d):
            os.rename(d, old)
        os.rename(tmp, d)
        if os.path.isdir(old):
            shutil.rmtree(old)
        log("exported snapshot to", d, "at step", step)

    def save(tag="last"):
        tmp = os.path.join(args.out, tag + ".pt.tmp")
        torch.save({"config": cfg, "model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": elapsed, "np_rng": train.rng.bit_generator.state, "args": vars(args),
                    "qat": qat_on, "prior_ids": prior_ids,
                    **({"copy_rng": copy_rng.bit_generator.state, "copy_ids": copy_ids, "evals": evals}
                       if copy_on else {}),
                    **({"span_rng": span_rng.bit_generator.state, "span_ids": span_ids, "evals": evals}
                       if span_on else {}),
                    **({"long_rng": long_rng.bit_generator.state, "long_data_rng": ldata.rng.bit_generator.state,
                        "long_ids": long_ids} if long_on else {})}, tmp)
        os.replace(tmp, os.path.join(args.out, tag + ".pt"))

    kl_from = None
    kl_rows_hi = 0  # rows trained with the --kl-weight-from weight
    if args.kl_weight_from:
        kl_from = [(int(t.split(":")[0]), float(t.split(":")[1])) for t in args.kl_weight_from.split(",")]
        kl_from.sort()
        for o, wv in kl_from:
            log("KL weight %.2f; %.2f on --train rows from offset %d" % (args.kl_weight, wv, o))
    call_on = (args.call_weight != 1.0 or args.call_first_weight > 0 or args.answer_weight != 1.0
               or (teacher is not None and (args.call_kl >= 0 or args.answer_kl >= 0)))
    call_ids = 0  # reply ids inside tool-call blocks in the short steps (with --call-weight / --call-kl)
    if call_on:
        log("tool-call ids: LM weight %.2f (first ids %.2f), KL weight %s; replies after a tool result: LM weight %.2f, "
            "KL weight %s" % (args.call_weight, args.call_first_weight or args.call_weight,
                              args.call_kl if args.call_kl >= 0 else "the row's", args.answer_weight,
                              args.answer_kl if args.answer_kl >= 0 else "the row's"))
    frozen_synth = []
    if args.synth_params:
        import re
        rx = re.compile(args.synth_params)
        frozen_synth = [p_ for n_, p_ in model.named_parameters() if not rx.search(n_)]
        n_on = sum(p_.numel() for n_, p_ in model.named_parameters() if rx.search(n_))
        log("synthetic-row updates touch %d parameters (%r); %d tensors left alone"
            % (n_on, args.synth_params, len(frozen_synth)))
    def step_loss(xb, nc, ns):
        """this step's loss over the rows xb, whose first nc rows are copy rows and next ns span rows"""
        nonlocal kl_rows_hi, call_ids
        if is_long:
            return long_loss(xb)
        elif teacher is None and not call_on:
            loss = lm_loss(model, xb)
        elif teacher is None:
            x, msk = xb
            cw, cm = call_weights(x, msk, args.call_weight, args.call_first_weight, args.answer_weight)
            call_ids += int((cm * msk).sum())
            lg = model(x[:, :-1])
            ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1),
                                 reduction="none").reshape(msk.shape)
            loss = (ce * cw * msk).sum() / msk.sum().clamp(min=1.0)
        elif (kl_from or call_on) and nc + ns == xb[0].shape[0] and args.synth_kl == 0:
            # synthetic rows alone at KL weight 0 (the same loss as the branch below): no teacher pass
            kl_rows_hi += int(args.kl_weight != 0) * (nc + ns)
            return lm_loss(model, xb)
        else:
            x, msk = xb
            lg = model(x[:, :-1])
            with torch.no_grad():
                tl = teacher(x[:, :-1])
            if not kl_from and not call_on:
                lml = lm_loss(model, xb, lg)
                kl = (F.kl_div(F.log_softmax(lg, -1), F.log_softmax(tl, -1), log_target=True,
                               reduction="none").sum(-1) * msk).sum() / msk.sum().clamp(min=1.0)
                loss = (1 - args.kl_weight) * lml + args.kl_weight * kl
            else:
                # per-row KL weight: the train-file rows (the batch's last rows) by their window start (kl_from)
                w = torch.full((x.shape[0], 1), args.kl_weight)
                nt = x.shape[0] - nc - ns
                if nt > 0 and kl_from:
                    offs = train.last_off[-nt:]
                    wr = np.full(nt, args.kl_weight)
                    for o, wv in kl_from:  # sorted by offset: the largest offset <= the start wins
                        wr = np.where(offs >= o, wv, wr)
                    w[nc + ns:, 0] = torch.from_numpy(wr).to(w.dtype)
                if args.synth_kl >= 0 and nc + ns > 0:
                    w[:nc + ns, 0] = args.synth_kl
                kl_rows_hi += int((w[:, 0] != args.kl_weight).sum())
                ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1),
                                     reduction="none").reshape(msk.shape)
                kd = F.kl_div(F.log_softmax(lg, -1), F.log_softmax(tl, -1), log_target=True,
                              reduction="none").sum(-1)
                if call_on:
                    cw, cm, am = call_weights(x, msk, args.call_weight, args.call_first_weight, args.answer_weight,
                                              want_answer=True)
                    cm = cm * msk
                    call_ids += int(cm.sum())
                    w = w.expand_as(msk)
                    if args.call_kl >= 0:
                        w = torch.where(cm > 0, torch.full_like(w, args.call_kl), w)
                    if args.answer_kl >= 0:
                        w = torch.where(am > 0, torch.full_like(w, args.answer_kl), w)
                    loss = (((1 - w) * ce * cw + w * kd) * msk).sum() / msk.sum().clamp(min=1.0)
                else:
                    loss = (((1 - w) * ce + w * kd) * msk).sum() / msk.sum().clamp(min=1.0)
        return loss

    def update(loss, only=None):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if only is not None:  # the other parameters keep no gradient, so Adam leaves them (and their moments) alone
            for p_ in frozen_synth:
                p_.grad = None
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not (torch.isfinite(loss) and torch.isfinite(gn)):
            log("step %d: non-finite loss/gradient, update skipped" % step)
            opt.zero_grad(set_to_none=True)
            return torch.zeros(()), gn
        opt.step()
        return loss, gn

    is_long = False
    while elapsed < budget and (args.max_steps == 0 or step < args.max_steps):
        frac = elapsed / budget
        lr = lr_at(args, step, frac)
        for g in opt.param_groups:
            g["lr"] = lr
        want_qat = frac >= 1.0 - args.qat_frac
        if want_qat != qat_on:
            qat_on = want_qat
            model.set_qat(qat_on)
            log("MXFP4 QAT", "on" if qat_on else "off", "at step", step)

        is_long = long_on and step % args.long_every == args.long_every - 1
        nc = copy_rows_at(step) if copy_on and not is_long else 0
        ns = span_rows_at(step, args.batch - nc) if span_on and not is_long else 0
        if is_long:
            T_long = long_seqs[int(long_rng.integers(0, len(long_seqs)))]
            xb = ldata.batch(args.long_batch, T_long, long_frac=1.0)
            long_ids += args.long_batch * T_long
            step_ids += args.long_batch * T_long
        elif nc == 0 and ns == 0:
            xb = train.batch(args.batch, args.seq, chat_frac=args.chat_frac, long_frac=args.long_frac)
        else:
            parts = []
            if nc > 0:
                cx, cm, _, _ = cc.make_windows(copy_rng, nc, args.seq, *copy_spec, cc.value_at(copy_alpha, step))
                copy_ids += nc * args.seq
                parts.append((cx, cm))
            if ns > 0:
                sx, sm, _, _ = cs.make_span_windows(span_rng, ns, args.seq, *span_spec)
                span_ids += ns * args.seq
                parts.append((sx, sm))
            if nc + ns < args.batch:
                parts.append(train.batch(args.batch - nc - ns, args.seq, chat_frac=args.chat_frac,
                                         long_frac=args.long_frac))
            xb = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        if not is_long:
            step_ids += args.batch * args.seq
        k_syn = nc + ns
        if args.synth_lr_mult > 0 and not is_long and 0 < k_syn < args.batch:
            # two updates: the synthetic rows alone at lr x mult, then the --train rows at lr (stage Q)
            for g in opt.param_groups:
                g["lr"] = lr * args.synth_lr_mult
            ls, gn = update(step_loss((xb[0][:k_syn], xb[1][:k_syn]), nc, ns), args.synth_params or None)
            for g in opt.param_groups:
                g["lr"] = lr
            lm_, gn = update(step_loss((xb[0][k_syn:], xb[1][k_syn:]), 0, 0))
            loss = (ls.detach() * k_syn + lm_.detach() * (args.batch - k_syn)) / args.batch
        else:
            loss, gn = update(step_loss(xb, nc, ns))
        update_router_bias(model, args.bias_gamma)
        step += 1
        now = time.time()
        elapsed += (now - t_last) if args.max_step_seconds <= 0 else min(now - t_last, args.max_step_seconds)
        t_last = now
        run_loss += loss.item()
        run_n += 1
        if step % 20 == 0:
            loads = [m.last_load.float() for m in model.moe_layers()]
            imb = max((l.max() / l.mean()).item() for l in loads) if loads else 0.0
            log("step %d elapsed %.1fm lr %.2e loss %.4f gnorm %.2f max-load/mean %.2f tok/s %.0f%s" %
                (step, elapsed / 60, lr, run_loss / run_n, gn.item(), imb,
                 step_ids / max(1e-9, now - t20),
                 " copy-rows %d/%d alphabet %d" % (nc, args.batch, cc.value_at(copy_alpha, step - 1) or V - 256)
                 if copy_on else "") + (" span-rows %d/%d" % (ns, args.batch) if span_on else "")
                + (" long-ids %d" % long_ids if long_on else "")
                + (" kl-rows-hi %d" % kl_rows_hi if kl_from else "")
                + (" call-ids %d" % call_ids if call_on else ""))
            t20 = now
            run_loss, run_n, step_ids = 0.0, 0, 0
        if now - t_ev > args.eval_minutes * 60:
            v = evaluate(model, val, args.batch, args.seq, args.eval_batches)
            log("step %d val loss %.4f (qat %s)" % (step, v, qat_on))
            if copy_on or span_on:
                evals.append(dict(step=step, minutes=round(elapsed / 60, 2), ids=step * args.batch * args.seq,
                                  copy_ids=copy_ids, **({"span_ids": span_ids} if span_on else {}),
                                  val_loss=round(v, 4), qat=qat_on, **synth_evals()))
                json.dump(evals, open(os.path.join(args.out, "evals.json"), "w"), indent=1)
            t_ev = time.time()
            t_last = t_ev  # evaluation time is not training time
        if now - t_ck > args.ckpt_minutes * 60:
            save()
            t_ck = time.time()
            t_last = t_ck
            log("checkpoint saved at step", step)
        if args.export_dir and now - t_ex > args.export_minutes * 60:
            export_snapshot()
            t_ex = time.time()
            t_last = t_ex
    save()
    save("final")
    export_snapshot()
    nb = args.eval_batches * 3
    model.set_qat(False)
    vb = evaluate(model, val, args.batch, args.seq, nb, seed=4321)
    model.set_qat(True)
    vq = evaluate(model, val, args.batch, args.seq, nb, seed=4321)
    tl = evaluate(model, train, args.batch, args.seq, nb, seed=4321)
    res = {"steps": step, "train_minutes": elapsed / 60, "tokens": step * args.batch * args.seq,
           "val_loss_bf16_experts_fp32": vb, "val_loss_mxfp4_experts": vq, "train_loss_mxfp4_experts": tl,
           "eval_tokens": nb * args.batch * args.seq}
    if long_on:  # "tokens" above counts every step as a short one
        res.update(long_ids=long_ids, tokens=(step - step // args.long_every) * args.batch * args.seq + long_ids)
    if copy_on or span_on:
        if copy_on:
            res.update(copy_ids=copy_ids, copy_eval_mxfp4=copy_eval())
        if span_on:
            res.update(span_ids=span_ids, span_eval_mxfp4=span_eval())
        evals.append(dict(step=step, minutes=round(elapsed / 60, 2), ids=step * args.batch * args.seq,
                          copy_ids=copy_ids, **({"span_ids": span_ids} if span_on else {}),
                          val_loss=round(vq, 4), qat=True, final=True,
                          **res.get("copy_eval_mxfp4", {}), **res.get("span_eval_mxfp4", {})))
        json.dump(evals, open(os.path.join(args.out, "evals.json"), "w"), indent=1)
    json.dump(res, open(os.path.join(args.out, "final.json"), "w"), indent=1)
    log("done", json.dumps(res))


if __name__ == "__main__":
    main()
