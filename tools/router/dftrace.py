#!/usr/bin/python3
"""dftrace.py - read deltafin's route traces (src/engine/trace_format.h) with numpy.

    import dftrace
    tr = dftrace.read("run.trace")
    tr.header            # dict: model, layers, experts, top_k, hidden, vocab, shared_experts, moe_layers
    tr.evals             # list of (pos0, ids: int32 array) in file order
    tr.routes            # structured array, one row per (position, MoE layer), in file order:
                         #   eval (index into evals), pos, layer, experts[k] int32,
                         #   scores[k] float32, weights[k] float32 (the engine's bits)

    dftrace.stats(tr, n_reuse=4)   # what `deltafin trace stats --json` prints, computed here
                                   # independently (numpy); full=False: `trace reuse --json`

Both formats: the binary default and the older JSON lines (--trace-format
jsonl, which has no scores: they read as NaN, and its weights are rounded to
seven digits).  Run as a script, it prints the trace as `deltafin trace dump`
does, or (--stats N / --reuse N) the figures of `trace stats` / `trace reuse`
as JSON; a test compares them with deltafin's.
"""
import json
import struct
import sys

import numpy as np

MAGIC = b"DFTRACE\n"
EVAL, ROUTE, ATTN, KDA, PREDICT = 1, 2, 3, 4, 5


class Trace:
    def __init__(self, header, evals, routes, binary, attn=None, order=None):
        self.header, self.evals, self.routes, self.binary = header, evals, routes, binary
        self.attn = attn if attn is not None else []   # (pos0, layer, head0, positions[T][nh][K], weights[T][nh][K])
        self.order = order or []                       # the records in file order: ("eval"|"route"|"attn"|"kda", index)
        self.kda = []                                  # (pos0, layer, stats[T][Hk][4]: beta, decay mean, decay min, gate mean)
        self.predict = []                              # (pos0, from, to, d, top[T][k]): --trace-lookahead


def _route_dtype(k):
    return np.dtype([("eval", "<i4"), ("pos", "<i4"), ("layer", "<i4"), ("experts", "<i4", (k,)),
                     ("scores", "<f4", (k,)), ("weights", "<f4", (k,))])


def _read_binary(data, path):
    ver, hlen = struct.unpack_from("<II", data, 8)
    if ver != 1:
        raise ValueError(f"{path}: trace version {ver}")
    header = json.loads(data[16:16 + hlen].decode("utf-8"))
    k, pos = header["top_k"], 16 + hlen
    evals, parts, attn, order, nroutes, kda, predict = [], [], [], [], 0, [], []
    while pos < len(data):
        if len(data) - pos < 8:
            raise ValueError(f"{path}: byte {pos}: a record cut short")
        tag, n = struct.unpack_from("<II", data, pos)
        body = pos + 8
        if n % 4 or n > len(data) - body:
            raise ValueError(f"{path}: byte {pos}: record length {n} does not fit")
        if tag == EVAL:
            pos0, cnt = struct.unpack_from("<II", data, body)
            evals.append((pos0, np.frombuffer(data, "<i4", cnt, body + 8).copy()))
            order.append(("eval", len(evals) - 1))
        elif tag == ATTN:
            pos0, layer, T, h0, nh, K = struct.unpack_from("<IIIIII", data, body)
            if n != 24 + 8 * T * nh * K:
                raise ValueError(f"{path}: byte {pos}: a bad attention record")
            a = body + 24
            attn.append((pos0, layer, h0, np.frombuffer(data, "<i4", T * nh * K, a).reshape(T, nh, K),
                         np.frombuffer(data, "<f4", T * nh * K, a + 4 * T * nh * K).reshape(T, nh, K)))
            order.append(("attn", len(attn) - 1))
        elif tag == PREDICT:
            pos0, frm, to, d, T, kk = struct.unpack_from("<IIIIII", data, body)
            if n != 24 + 4 * T * kk:
                raise ValueError(f"{path}: byte {pos}: a bad look-ahead record")
            predict.append((pos0, frm, to, d, np.frombuffer(data, "<i4", T * kk, body + 24).reshape(T, kk)))
        elif tag == KDA:
            pos0, layer, T, nh = struct.unpack_from("<IIII", data, body)
            if n != 16 + 16 * T * nh:
                raise ValueError(f"{path}: byte {pos}: a bad KDA record")
            kda.append((pos0, layer, np.frombuffer(data, "<f4", T * nh * 4, body + 16).reshape(T, nh, 4)))
            order.append(("kda", len(kda) - 1))
        elif tag == ROUTE:
            pos0, layer, T, kk = struct.unpack_from("<IIII", data, body)
            if kk != k or n != 16 + 12 * T * k:
                raise ValueError(f"{path}: byte {pos}: a bad route record")
            a = body + 16
            r = np.zeros(T, _route_dtype(k))
            r["eval"] = len(evals) - 1
            r["pos"] = pos0 + np.arange(T)
            r["layer"] = layer
            r["experts"] = np.frombuffer(data, "<i4", T * k, a).reshape(T, k)
            r["scores"] = np.frombuffer(data, "<f4", T * k, a + 4 * T * k).reshape(T, k)
            r["weights"] = np.frombuffer(data, "<f4", T * k, a + 8 * T * k).reshape(T, k)
            parts.append(r)
            order.append(("route", nroutes))
            nroutes += 1
        pos = body + n
    routes = np.concatenate(parts) if parts else np.zeros(0, _route_dtype(k))
    tr = Trace(header, evals, routes, True, attn, order)
    tr.route_parts = parts
    tr.kda = kda
    tr.predict = predict
    return tr


def _read_jsonl(data, path):
    lines = data.decode("utf-8").splitlines()
    header = json.loads(lines[0])
    rows = [json.loads(l) for l in lines[1:] if l.strip()]
    k = max((len(r["experts"]) for r in rows), default=header.get("top_k", 16))
    routes = np.zeros(len(rows), _route_dtype(k))
    routes["eval"] = -1
    routes["scores"] = np.nan
    for i, r in enumerate(rows):
        routes[i]["pos"], routes[i]["layer"] = r.get("pos", 0), r["layer"]
        routes[i]["experts"][:len(r["experts"])] = r["experts"]
        if "weights" in r:
            routes[i]["weights"][:len(r["weights"])] = r["weights"]
    return Trace(header, [], routes, False)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(MAGIC):
        return _read_binary(data, path)
    if data.startswith(b"{"):
        return _read_jsonl(data, path)
    raise ValueError(f"{path}: not a deltafin route trace")


def _g9(x):
    """C's %.9g for a float32 value"""
    return "%.9g" % float(x)


def _route_line(r, binary):
    line = '{"pos":%d,"layer":%d,"experts":[%s]' % (r["pos"], r["layer"], ",".join(str(int(e)) for e in r["experts"]))
    if binary:
        line += ',"scores":[%s]' % ",".join(_g9(x) for x in r["scores"])
    return line + ',"weights":[%s]}' % ",".join(_g9(x) for x in r["weights"])


def dump(tr, out=sys.stdout):
    h = tr.header
    head = {"trace": "deltafin routes", "format": "binary" if tr.binary else "jsonl", "model": h.get("model", ""),
            "layers": h["layers"], "experts": h["experts"], "top_k": h["top_k"]}
    if tr.binary:
        head.update(hidden=h["hidden"], vocab=h["vocab"], shared_experts=h["shared_experts"],
                    moe_layers=h["moe_layers"])
    out.write(json.dumps(head, separators=(",", ":")) + "\n")
    if not tr.binary:
        for r in tr.routes:
            out.write(_route_line(r, False) + "\n")
        return
    for kind, i in tr.order:
        if kind == "eval":
            pos0, ids = tr.evals[i]
            out.write('{"eval":{"pos0":%d,"ids":[%s]}}\n' % (pos0, ",".join(str(int(x)) for x in ids)))
        elif kind == "route":
            for r in tr.route_parts[i]:
                out.write(_route_line(r, True) + "\n")
        elif kind == "kda":
            pos0, layer, st = tr.kda[i]
            for q in range(st.shape[0]):
                for hh in range(st.shape[1]):
                    b, dm, dn, g = (_g9(x) for x in st[q, hh])
                    out.write('{"kda":{"pos":%d,"layer":%d,"head":%d,"beta":%s,"decay_mean":%s,"decay_min":%s,'
                              '"gate_mean":%s}}\n' % (pos0 + q, layer, hh, b, dm, dn, g))
        else:
            pos0, layer, h0, P, W = tr.attn[i]
            for q in range(P.shape[0]):
                for hh in range(P.shape[1]):
                    top = ",".join("[%d,%s]" % (int(p), _g9(w)) for p, w in zip(P[q, hh], W[q, hh]) if p >= 0)
                    out.write('{"attn":{"pos":%d,"layer":%d,"head":%d,"top":[%s]}}\n' % (pos0 + q, layer, h0 + hh, top))


def _layer_stats(rows, pos, E, k, n_reuse, full):
    """rows: [R][k] sorted expert ids of one layer in file order; pos: [R]"""
    R = len(rows)
    st = {"rows": R, "uses": R * k}
    sets = [set(map(int, r)) for r in rows]
    hits, tot = np.zeros(n_reuse, np.int64), np.zeros(n_reuse, np.int64)
    for t in range(R):
        for d in range(1, min(n_reuse, t) + 1):
            hits[d - 1] += len(sets[t] & sets[t - d])
            tot[d - 1] += k
    reuse = [float(h) / float(n) if n else 0.0 for h, n in zip(hits, tot)]
    if not full:
        st["reuse"] = reuse
        return st, hits, tot, 0
    cnt = np.bincount(rows.reshape(-1), minlength=E).astype(np.int64)
    uses = R * k
    p = cnt[cnt > 0] / uses
    h = float(-(p * np.log2(p)).sum()) if uses else 0.0
    st["unused"] = int((cnt == 0).sum())
    st["entropy_bits"] = h
    st["entropy_norm"] = h / np.log2(E) if E > 1 and uses else 0.0
    st["max_over_mean"] = float(cnt.max()) / (uses / E) if uses else 0.0
    order = sorted((e for e in range(E) if cnt[e]), key=lambda e: (-cnt[e], e))[:5]
    st["top"] = [[e, int(cnt[e])] for e in order]
    pc = {}
    for r in rows:
        r = [int(x) for x in r]
        for i in range(k):
            for j in range(i + 1, k):
                pc[(r[i], r[j])] = pc.get((r[i], r[j]), 0) + 1
    st["pairs"] = [[i, j, c] for (i, j), c in sorted(pc.items(), key=lambda x: (-x[1], x[0]))[:5]]
    nb = ch = ov = 0
    for t in range(1, R):
        if pos[t] == pos[t - 1] + 1:
            o = len(sets[t] & sets[t - 1])
            nb += 1
            ch += o != k
            ov += o
    st["neighbours"], st["changed"] = nb, ch
    st["mean_overlap"] = ov / nb / k if nb else 0.0
    st["reuse"] = reuse
    return st, hits, tot, ov


def stats(tr, n_reuse=4, full=True):
    """the figures of `deltafin trace stats --json` (full) or `trace reuse --json`"""
    E = tr.header["experts"]
    k = tr.routes["experts"].shape[1] if len(tr.routes) else 0
    layers, P = [], {"rows": 0, "uses": 0}
    ph, pt = np.zeros(n_reuse, np.int64), np.zeros(n_reuse, np.int64)
    pov = 0
    if full:
        P.update(unused=0, entropy_bits=0.0, entropy_norm=0.0, max_over_mean=0.0, neighbours=0, changed=0)
    for il in range(tr.header["layers"]):
        sel = tr.routes[tr.routes["layer"] == il]
        if not len(sel):
            continue
        rows = np.sort(sel["experts"], axis=1)
        st, hits, tot, ov = _layer_stats(rows, sel["pos"], E, k, n_reuse, full)
        layers.append(dict(layer=il, **st))
        ph += hits
        pt += tot
        pov += ov
        P["rows"] += st["rows"]
        P["uses"] += st["uses"]
        if full:
            for key in ("unused", "neighbours", "changed"):
                P[key] += st[key]
            for key in ("entropy_bits", "entropy_norm", "max_over_mean"):
                P[key] += st[key] * st["rows"]
    if full:
        for key in ("entropy_bits", "entropy_norm", "max_over_mean"):
            P[key] = P[key] / P["rows"] if P["rows"] else 0.0
        P["mean_overlap"] = pov / P["neighbours"] / k if P["neighbours"] else 0.0
    P["reuse"] = [float(h) / float(n) if n else 0.0 for h, n in zip(ph, pt)]
    return {"experts": E, "top_k": k, "layers": layers, "pooled": P}


def prefetch(tr):
    """what `deltafin trace prefetch --json` prints, from the look-ahead records and each
    position's last route"""
    k = tr.header["top_k"]
    m = max(k // 2, 1)
    last = {}
    for r in tr.routes:
        last[(int(r["pos"]), int(r["layer"]))] = set(int(e) for e in r["experts"])
    acc = {}
    for pos0, frm, to, d, top in tr.predict:
        for q in range(top.shape[0]):
            route = last.get((pos0 + q, to))
            if route is None:
                continue
            h = sum(1 for e in top[q] if int(e) in route)
            hm = sum(1 for e in top[q][:m] if int(e) in route)
            for key in ((d, -1), (d, to)):
                a = acc.setdefault(key, [0, 0, 0])
                a[0] += 1
                a[1] += hm
                a[2] += h
    rows = [{"d": d, "layer": l, "compared": a[0], "hits_m": a[1], "hits_k": a[2]}
            for (d, l), a in sorted(acc.items())]
    return {"top_k": k, "m": m, "rows": rows}


def _steps(tr, layer=None):
    """the cache replay's steps: each route record's distinct experts (a chunk's positions at one layer;
    a JSON line is one position), keyed layer * E + expert, in file order"""
    E = tr.header["experts"]
    parts = tr.route_parts if tr.binary else [tr.routes[i:i + 1] for i in range(len(tr.routes))]
    out = []
    for part in parts:
        if not len(part) or (layer is not None and int(part["layer"][0]) != layer):
            continue
        keys = []
        for r in part:
            for e in r["experts"]:
                key = int(r["layer"]) * E + int(e)
                if key not in keys:
                    keys.append(key)
        out.append(keys)
    return out


def _lru(steps, slots):
    """as the engine's cache: a step's experts pinned together, slots at a time when more"""
    res, hits, tick = {}, 0, 0      # key -> last use
    groups = [keys[g:g + slots] for keys in steps for g in range(0, len(keys), slots)]
    for keys in groups:
        pinned = set()
        for key in keys:
            tick += 1
            if key in res:
                hits += 1
            elif len(res) >= slots:
                free = [k for k in res if k not in pinned]
                if not free:
                    continue
                del res[min(free, key=lambda k: res[k])]
            res[key] = tick
            pinned.add(key)
    return hits


def _static(steps, slots):
    cnt = {}
    for keys in steps:
        for key in keys:
            cnt[key] = cnt.get(key, 0) + 1
    top = sorted(cnt, key=lambda k: (-cnt[k], k))[:slots]
    return sum(cnt[k] - 1 for k in top)


def _next_use(flat):
    """for each (group, key) access, the index of that key's next access (inf: none)"""
    nxt, last = [0] * len(flat), {}
    for j in range(len(flat) - 1, -1, -1):
        key = flat[j][1]
        nxt[j] = last.get(key, float("inf"))
        last[key] = j
    return nxt


def _belady(steps, slots):
    flat = [(i, key) for i, keys in enumerate(steps) for key in keys]
    nxt = _next_use(flat)
    res, hits = {}, 0               # key -> [next use, step]
    for j, (step, key) in enumerate(flat):
        if key in res:
            hits += 1
            res[key] = [nxt[j], step]
            continue
        if len(res) >= slots:
            cand = [k for k in res if res[k][1] != step]
            if not cand:
                continue
            far = max(cand, key=lambda k: res[k][0])
            if nxt[j] > res[far][0]:
                continue
            del res[far]
        res[key] = [nxt[j], step]
    return hits


def _belady_demand(steps, slots):
    """Belady where every expert used is read into the cache (no streaming around it): a step in
    groups of `slots`, a miss evicts the resident outside its group used farthest ahead"""
    flat = [(gi, key) for gi, keys in enumerate(g for keys in steps for g in
                                              [keys[i:i + slots] for i in range(0, len(keys), slots)])
            for key in keys]
    nxt = _next_use(flat)
    res, hits = {}, 0               # key -> [next use, group]
    for j, (group, key) in enumerate(flat):
        if key in res:
            hits += 1
        elif len(res) >= slots:
            far = max((k for k in res if res[k][1] != group), key=lambda k: res[k][0])
            del res[far]
        res[key] = [nxt[j], group]
    return hits


def cache(tr, slots):
    """`deltafin trace cache --json`'s LRU, static and both Belady figures, pooled and per layer
    (LFU and TLFU are the engine's own cache code: test_engine works them out by hand)"""
    def row(steps, s):
        s = max(s, 1)
        return {"slots": s, "steps": len(steps), "accesses": sum(len(k) for k in steps),
                "hits_lru": _lru(steps, s), "hits_static": _static(steps, s), "hits_belady": _belady(steps, s),
                "hits_belady_demand": _belady_demand(steps, s)}
    layers = sorted(set(int(l) for l in tr.routes["layer"]))
    pooled = _steps(tr)
    return {"pooled": [row(pooled, s) for s in slots],
            "layers": [{"layer": l, "rows": [row(_steps(tr, l), s // len(layers)) for s in slots]} for l in layers]}


def diff(ta, tb):
    """`deltafin trace diff A B --json`"""
    def last(tr):
        out = {}
        for r in tr.routes:
            out[(int(r["pos"]), int(r["layer"]))] = (list(map(int, r["experts"])), r["weights"].copy())
        return out
    A, B = last(ta), last(tb)
    k = ta.header["top_k"]
    per, only_a, only_b = {}, 0, 0
    for key in sorted(set(A) | set(B)):
        if key not in B:
            only_a += 1
            continue
        if key not in A:
            only_b += 1
            continue
        (ea, wa), (eb, wb) = A[key], B[key]
        d = per.setdefault(key[1], {"layer": key[1], "compared": 0, "set_differs": 0, "order_differs": 0,
                                    "weight_differs": 0, "ovl": 0, "max_weight_diff": 0.0, "first_pos": -1})
        o = len(set(ea) & set(eb))
        d["compared"] += 1
        d["ovl"] += o
        if o != k:
            d["set_differs"] += 1
            if d["first_pos"] < 0 or key[0] < d["first_pos"]:
                d["first_pos"] = key[0]
            continue
        if ea != eb:
            d["order_differs"] += 1
            continue
        if wa.tobytes() != wb.tobytes():
            d["weight_differs"] += 1
        d["max_weight_diff"] = max(d["max_weight_diff"], float(np.max(np.abs(wa.astype(np.float64) - wb.astype(np.float64)))))
    layers = [per[l] for l in sorted(per)]
    P = {"compared": 0, "set_differs": 0, "order_differs": 0, "weight_differs": 0, "ovl": 0, "max_weight_diff": 0.0,
         "first_pos": -1}
    for d in layers:
        for key in ("compared", "set_differs", "order_differs", "weight_differs", "ovl"):
            P[key] += d[key]
        P["max_weight_diff"] = max(P["max_weight_diff"], d["max_weight_diff"])
        if d["first_pos"] >= 0 and (P["first_pos"] < 0 or d["first_pos"] < P["first_pos"]):
            P["first_pos"] = d["first_pos"]
    def fin(d):
        ovl = d.pop("ovl")
        d["mean_overlap"] = ovl / d["compared"] / k if d["compared"] else 0.0
        return {key: d[key] for key in (["layer"] if "layer" in d else []) + ["compared", "set_differs",
                "order_differs", "weight_differs", "mean_overlap", "max_weight_diff", "first_pos"]}
    return {"top_k": k, "only_a": only_a, "only_b": only_b, "layers": [fin(d) for d in layers], "pooled": fin(P)}


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--cache":
        print(json.dumps(cache(read(args[2]), [int(s) for s in args[1].split(",")])))
        sys.exit(0)
    if len(args) == 3 and args[0] == "--diff":
        print(json.dumps(diff(read(args[1]), read(args[2]))))
        sys.exit(0)
    if len(args) == 2 and args[0] == "--prefetch":
        print(json.dumps(prefetch(read(args[1]))))
        sys.exit(0)
    if len(args) == 3 and args[0] in ("--stats", "--reuse"):
        print(json.dumps(stats(read(args[2]), int(args[1]), full=args[0] == "--stats")))
        sys.exit(0)
    if len(args) != 1:
        sys.exit("usage: dftrace.py TRACE | dftrace.py --stats N TRACE | dftrace.py --reuse N TRACE | "
                 "dftrace.py --prefetch TRACE | dftrace.py --cache SLOTS TRACE | dftrace.py --diff A B")
    dump(read(args[0]))
