"""Minimal safetensors reader/writer (numpy) and MXFP4 dequantisation (spec sections 3 and 8)."""
import json
import os
import struct

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n).decode("utf-8"))
    return hdr, 8 + n


def read_safetensors(path):
    """-> dict name -> (dtype string, numpy array in its stored dtype; BF16 as uint16)."""
    hdr, base = read_header(path)
    data = np.fromfile(path, dtype=np.uint8)
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b: base + e]
        dt = info["dtype"]
        npdt = {"BF16": np.uint16, "F32": np.float32, "U8": np.uint8, "F16": np.float16}[dt]
        arr = raw.view(npdt).reshape(info["shape"]) if raw.size else np.zeros(info["shape"], npdt)
        out[name] = (dt, arr)
    return out


def bf16_to_f64(a):
    return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f32_to_bf16(a):
    """round-to-nearest-even float32 -> bf16 bits (uint16)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u >> 16) & 1) + 0x7FFF
    out = ((u + r) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    out[nan] = 0x7FC0
    return out


def mxfp4_dequant(packed, scale):
    """packed U8 [R, C/2], scale U8 [R, C/32] -> float64 [R, C] (exact, ldexp)."""
    R = packed.shape[0]
    lo = packed & 0x0F
    hi = packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(R, -1)
    vals = E2M1[codes]
    C = vals.shape[1]
    exps = scale.astype(np.int64) - 127
    vals = vals.reshape(R, C // 32, 32)
    return np.ldexp(vals, exps[:, :, None]).reshape(R, C)


def load_checkpoint(dirpath):
    """-> (config dict, dict name -> float64 numpy array), experts dequantised to logical [R, C] w."""
    cfg = json.load(open(os.path.join(dirpath, "config.json")))
    idx = json.load(open(os.path.join(dirpath, "model.safetensors.index.json")))
    shards = sorted(set(idx["weight_map"].values()))
    raw = {}
    for s in shards:
        raw.update(read_safetensors(os.path.join(dirpath, s)))
    out = {}
    for name, (dt, arr) in raw.items():
        if name.startswith("vision_tower.") or name.startswith("mm_projector."):
            continue
        if name.endswith(".weight_scale"):
            continue
        if name.endswith(".weight_packed"):
            base = name[: -len(".weight_packed")]
            sc = raw[base + ".weight_scale"][1]
            out[base] = mxfp4_dequant(arr, sc)
            continue
        if dt == "BF16":
            out[name] = bf16_to_f64(arr)
        else:
            out[name] = arr.astype(np.float64)
    return cfg, out


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype string, numpy array) written in the given order."""
    hdr = {}
    off = 0
    blobs = []
    for name, dt, arr in tensors:
        b = np.ascontiguousarray(arr).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hdr["__metadata__"] = metadata or {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off
