#!/usr/bin/python3
"""Issue-38 skills of a model, measured through the C engine's server on held-out cases.

  /usr/bin/python3 tools/train/eval_skills.py --model tools/train/wip/k3-mini-next \
      [--tasks add,add_nothink,sub,mul,tool,tool_anthropic,long] [--n 100] [--long-ids 14000] [--json FILE]

Starts `build/deltafin serve` (greedy: temperature 0) on a free local port and sends requests:
  add, add_nothink  "What is A + B?" for the held-out pairs of tools/train/corpus/heldout_pairs.txt,
                    OpenAI chat completions, thinking on (effort max, the default) / off
                    (reasoning_effort "none"); right if the reply states A + B = (A+B)
  sub, mul          the same for the held-out A - B and A * B pairs of heldout38.json (thinking off)
  tool              OpenAI tools: one or two tools (the right one among them), a held-out phrasing
                    (heldout38.json); right if the reply is a call of the right tool whose arguments
                    are JSON equal to the expected object, and, after the tool's result is sent back,
                    the answer contains the result's key facts
  tool_anthropic    the same through /v1/messages (Anthropic tools, thinking disabled)
  long              "What is A + B?" (held-out pairs) after a system prompt of about --long-ids ids of
                    held-out documentation (build/train38/heldout_docs.txt; build38.sh writes it)
Prints one line per task and, with --json, writes every case.
Stdlib only (no numpy/torch), so it runs anywhere build/deltafin does.
"""
import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "corpus"))
import make_corpus38 as mc38  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, model, ctx, threads, deltafin):
        self.port = free_port()
        cmd = [deltafin, "serve", "--model", model, "--port", str(self.port), "--ctx", str(ctx),
               "--parallel", "1"]
        if threads:
            cmd += ["--threads", str(threads)]
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t0 = time.time()
        while time.time() - t0 < 120:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                if self.p.poll() is not None:
                    raise RuntimeError("deltafin serve exited: " + self.p.stderr.read().decode()[-2000:])
                time.sleep(0.3)
        raise RuntimeError("deltafin serve did not come up")

    def post(self, path, body):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return {"error": e.read().decode("utf-8", "replace")[:500]}

    def close(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def chat(S, messages, think=True, tools=None, max_tokens=96):
    body = {"model": "m", "messages": messages, "temperature": 0, "max_tokens": max_tokens}
    if not think:
        body["reasoning_effort"] = "none"
    if tools:
        body["tools"] = tools
    r = S.post("/v1/chat/completions", body)
    if "choices" not in r:
        return {"content": "", "error": r.get("error", r)}
    return r["choices"][0]["message"]


def read_pairs(path):
    out = []
    for line in open(path):
        if line.strip() and not line.startswith("#"):
            a, b = line.split()[:2]
            out.append((int(a), int(b)))
    return out


def arith(S, pairs, op, think, system=None, max_tokens=96):
    rows, ok_n = [], 0
    for a, b in pairs:
        want = a + b if op == "+" else a - b if op == "-" else a * b
        msgs = [{"role": "user", "content": "What is %d %s %d?" % (a, op, b)}]
        if system:
            msgs.insert(0, {"role": "system", "content": system})
        m = chat(S, msgs, think, max_tokens=max_tokens)
        txt = m.get("content") or ""
        g = re.search(r"=\s*(-?\d+)", txt)
        ok = bool(g) and int(g.group(1)) == want
        ok_n += ok
        row = {"q": msgs[-1]["content"], "reply": txt, "ok": ok}
        if m.get("reasoning_content"):
            row["reasoning"] = m["reasoning_content"]
        rows.append(row)
    return ok_n, rows


def tool_cases(n, seed, heldout=True):
    """n tool cases of the seed's sequence; heldout=False draws the TRAINING phrasings instead (a diagnostic of
    the held-out gap, never a skill number)"""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        kind = mc38.TOOL_KINDS[i % len(mc38.TOOL_KINDS)]
        msgs, tools, info = mc38.tool_conv(rng, None, heldout=heldout, n_tools=rng.choice([1, 2]), kind=kind)
        cases.append((msgs, tools, info))
    return cases


def facts_ok(kind, result, answer):
    """the answer contains the tool result's key facts"""
    a = answer.lower()
    try:
        r = json.loads(result)
    except ValueError:
        r = None
    if kind == "weather":
        return str(r["temperature_c"]) in a and r["condition"] in a
    if kind == "list_files":
        names = r["files"] if isinstance(r, dict) else result.split("\n")
        return all(x.lower() in a for x in names)
    if kind == "read_file":
        return result.lower().rstrip(".!") in a
    if kind == "get_time":
        return r["time"] in a
    if kind == "search_web":
        return r["results"][0]["title"].lower() in a
    if kind == "send_email":
        return "sent" in a or r["to"] in a
    if kind == "convert_currency":
        return str(r["result"]) in a
    if kind == "stock_price":
        return str(r["price"]) in a
    return False


def tool_eval(S, cases, anthropic=False, think=True):
    rows, ok_n, call_n = [], 0, 0
    for msgs, tools, info in cases:
        user = msgs[0]["content"]
        if anthropic:
            atools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                       "input_schema": t["function"]["parameters"]} for t in tools]
            body = {"model": "m", "max_tokens": 128, "temperature": 0, "tools": atools,
                    "messages": [{"role": "user", "content": user}]}
            r = S.post("/v1/messages", body)
            blocks = r.get("content", [])
            uses = [b for b in blocks if b.get("type") == "tool_use"]
            name = uses[0]["name"] if uses else None
            args = uses[0].get("input") if uses else None
        else:
            m = chat(S, [{"role": "user", "content": user}], think, tools, max_tokens=128)
            calls = m.get("tool_calls") or []
            name = calls[0]["function"]["name"] if calls else None
            try:
                args = json.loads(calls[0]["function"]["arguments"]) if calls else None
            except ValueError:
                args = "INVALID JSON: " + calls[0]["function"]["arguments"]
        call_ok = name == info["tool"] and args == info["args"]
        call_n += call_ok
        ans, ans_ok = "", False
        if call_ok:
            res = msgs[2]["content"]
            if anthropic:
                tid = uses[0]["id"]
                body["messages"] += [{"role": "assistant", "content": blocks},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid,
                                                                   "content": res}]}]
                r2 = S.post("/v1/messages", body)
                ans = "".join(b.get("text", "") for b in r2.get("content", []) if b.get("type") == "text")
            else:
                hist = [{"role": "user", "content": user},
                        {"role": "assistant", "content": m.get("content") or "", "tool_calls": calls},
                        {"role": "tool", "tool_call_id": calls[0]["id"], "content": res}]
                ans = chat(S, hist, think, tools, max_tokens=96).get("content") or ""
            ans_ok = facts_ok(info["kind"], res, ans)
        ok_n += call_ok and ans_ok
        rows.append({"user": user, "want": [info["tool"], info["args"]], "got": [name, args], "call_ok": call_ok,
                     "result": msgs[2]["content"], "answer": ans, "ok": call_ok and ans_ok})
    return ok_n, call_n, rows


def long_system(path, n_ids, seed):
    text = open(path, encoding="utf-8").read()
    rng = random.Random(seed)
    want = int(n_ids * mc38.BYTES_PER_ID)
    start = rng.randrange(0, max(1, len(text) - want))
    body = text[start:start + want]
    return "You are a helpful assistant. The documentation below is for reference.\n\n" + body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tools/train/wip/k3-mini-next")
    ap.add_argument("--tasks", default="add,add_nothink,sub,mul,tool,tool_anthropic,long")
    ap.add_argument("--n", type=int, default=100, help="cases per task (at most the held-out set)")
    ap.add_argument("--long-ids", type=int, default=14000)
    ap.add_argument("--long-docs", default="build/train38/heldout_docs.txt")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--deltafin", default="build/deltafin")
    ap.add_argument("--seed", type=int, default=3838)
    ap.add_argument("--tool-n", type=int, default=0, help="tool cases (default --n)")
    ap.add_argument("--tool-skip", type=int, default=0,
                    help="drop the first K tool cases of the seed's sequence (cases K+1 .. K+tool-n), e.g. those "
                         "that chose among training exports")
    ap.add_argument("--train-phrasings", action="store_true",
                    help="tool cases phrased as the TRAINING rows are (values and tools drawn as for the held-out "
                         "cases): how much of the held-out miss rate is the phrasing; not a held-out number")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.tool_n < 0 or a.tool_skip < 0:
        raise SystemExit("--tool-n and --tool-skip must be >= 0")
    if a.train_phrasings:
        print("eval_skills: tool cases in the TRAINING phrasings (--train-phrasings): a diagnostic, not held out")
    ho = json.load(open(os.path.join(HERE, "corpus", "heldout38.json")))
    add_pairs = read_pairs(os.path.join(HERE, "corpus", "heldout_pairs.txt"))
    S = Server(a.model, a.ctx, a.threads, a.deltafin)
    res = {"model": a.model, "train_phrasings": a.train_phrasings}
    try:
        for task in a.tasks.split(","):
            t0 = time.time()
            if task in ("add", "add_nothink"):
                ok, rows = arith(S, add_pairs[: a.n], "+", task == "add")
                n = len(rows)
            elif task in ("sub", "mul"):
                pairs = [tuple(p) for p in ho["sub_pairs" if task == "sub" else "mul_pairs"]][: a.n]
                ok, rows = arith(S, pairs, "-" if task == "sub" else "*", False)
                n = len(rows)
            elif task in ("tool", "tool_anthropic"):
                tn = a.tool_n or a.n
                cases = tool_cases(a.tool_skip + tn, a.seed, not a.train_phrasings)[a.tool_skip:]
                ok, calls, rows = tool_eval(S, cases, anthropic=task == "tool_anthropic")
                n = len(rows)
                res[task + "_calls_right"] = calls
                res[task + "_first_case"] = a.tool_skip + 1
            elif task == "long":
                rows, ok = [], 0
                for i, (x, y) in enumerate(add_pairs[: min(a.n, 20)]):
                    sysm = long_system(a.long_docs, a.long_ids, a.seed + i)
                    k, r = arith(S, [(x, y)], "+", False, system=sysm)
                    ok += k
                    rows += r
                n = len(rows)
                for r in rows:
                    r.pop("q", None)
            else:
                raise SystemExit("unknown task " + task)
            res[task] = {"right": ok, "of": n, "seconds": round(time.time() - t0, 1), "cases": rows}
            extra = " (%d right calls)" % res[task + "_calls_right"] if task.startswith("tool") else ""
            print("%-15s %3d / %3d%s   [%.0f s]  e.g. %r" % (task, ok, n, extra, time.time() - t0,
                                                             (rows[0].get("reply") or rows[0].get("answer") or
                                                              rows[0].get("got")) if rows else ""), flush=True)
    finally:
        S.close()
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
