#!/usr/bin/env python3
"""st_reshard.py - a Hugging Face model folder written again with its tensors in N shards.

  st_reshard.py SRC_DIR DST_DIR N

SRC_DIR's tensors (the shards its model.safetensors.index.json names, or its one model.safetensors)
go to DST_DIR in their order, byte for byte with the same dtype and shape: N = 1 writes one
model.safetensors and no index; N > 1 writes model-0000i-of-0000N.safetensors and an index whose
weight_map names each tensor's shard (an expert's tensors, NAME.experts.E.*, kept in one).  Every other file of SRC_DIR (config.json, the tokenizer) is
copied as it is.  For the loaders' tests (tests/test_loader.c, tests/test_qwen3.c): the same model in
each layout must give the same bits.  Standard library only."""
import json
import os
import re
import shutil
import struct
import sys


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
    return head, 8 + n


def tensors_of(src):
    """[(name, dtype, shape, path, begin, end)] in file order, shard by shard"""
    idx = os.path.join(src, "model.safetensors.index.json")
    files = []
    if os.path.exists(idx):
        for shard in json.load(open(idx))["weight_map"].values():
            if shard not in files:
                files.append(shard)
    else:
        files = ["model.safetensors"]
    out = []
    for name in files:
        path = os.path.join(src, name)
        head, start = read_header(path)
        items = [(k, v) for k, v in head.items() if k != "__metadata__"]
        items.sort(key=lambda kv: kv[1]["data_offsets"][0])
        for k, v in items:
            b, e = v["data_offsets"]
            out.append((k, v["dtype"], v["shape"], path, start + b, start + e))
    return out, files


def write_shard(path, tensors):
    head, off = {}, 0
    for name, dtype, shape, _, b, e in tensors:
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + e - b]}
        off += e - b
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, src, b, e in tensors:
            with open(src, "rb") as s:
                s.seek(b)
                f.write(s.read(e - b))


def main(src, dst, n):
    tensors, shard_files = tensors_of(src)
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name not in shard_files and name != "model.safetensors.index.json" and \
                os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    if n <= 1:
        write_shard(os.path.join(dst, "model.safetensors"), tensors)
        return
    # an expert's tensors (...experts.E.*) stay in one shard, as K3's loader needs
    groups = []
    for t in tensors:
        key = re.sub(r"(\.experts\.\d+)\..*", r"\1", t[0])
        if groups and groups[-1][0] == key:
            groups[-1][1].append(t)
        else:
            groups.append((key, [t]))
    per = -(-len(groups) // n)
    weight_map = {}
    for i in range(n):
        part = [t for _, g in groups[i * per:(i + 1) * per] for t in g]
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        write_shard(os.path.join(dst, fname), part)
        for t in part:
            weight_map[t[0]] = fname
    total = sum(t[5] - t[4] for t in tensors)
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
