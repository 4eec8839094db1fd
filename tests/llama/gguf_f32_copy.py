#!/usr/bin/python3
"""gguf-py (llama.cpp's own Python GGUF package) as an independent reader of
quantized GGUF files, for run_llama_oracle.sh.

  gguf_f32_copy.py GGUF_PY LIBDIR check FILE...
      every tensor of a block or half type in the files: gguf-py's
      dequantize() against ggml's own dequantize_row_<type> (libggml-base
      from the npm prebuilt, through ctypes), bit for bit; prints what was
      compared per type; exits 1 on a difference.
  gguf_f32_copy.py GGUF_PY LIBDIR copy IN OUT
      OUT = IN with every tensor in a block or half type dequantized to F32
      by gguf-py (the values IN stores), metadata and tensor order kept.
      MXFP4 tensors are copied as they are: K3's experts as released, whose
      kernel has its own reduction order (kernels.h), so an F32 copy of them
      would be another computation, not the same values in another format.

Needs /usr/bin/python3 with numpy (Debian's python3-numpy).
"""
import ctypes
import os
import sys

import numpy as np


def load(gguf_py):
    sys.path.insert(0, gguf_py)
    import gguf  # noqa: E402
    from gguf.quants import dequantize  # noqa: E402
    return gguf, dequantize


GGML_DEQ = {2: "dequantize_row_q4_0", 3: "dequantize_row_q4_1", 6: "dequantize_row_q5_0", 7: "dequantize_row_q5_1",
            8: "dequantize_row_q8_0", 10: "dequantize_row_q2_K", 11: "dequantize_row_q3_K", 12: "dequantize_row_q4_K",
            13: "dequantize_row_q5_K", 14: "dequantize_row_q6_K", 20: "dequantize_row_iq4_nl",
            39: "dequantize_row_mxfp4", 1: "ggml_fp16_to_fp32_row", 30: "ggml_bf16_to_fp32_row"}


def check(gguf, dequantize, libdir, files):
    lib = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
    seen, bad = {}, 0
    for fn in files:
        r = gguf.GGUFReader(fn)
        for t in r.tensors:
            q = int(t.tensor_type)
            if q == 0:
                continue
            if q not in GGML_DEQ:
                print("gguf_f32_copy: %s: %s is type %d, not compared" % (fn, t.name, q))
                bad += 1
                continue
            mine = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
            raw = np.ascontiguousarray(t.data).view(np.uint8)
            ref = np.zeros(mine.size, dtype=np.float32)
            f = getattr(lib, GGML_DEQ[q])
            f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            f.restype = None
            f(raw.ctypes.data, ref.ctypes.data, ref.size)
            if mine.tobytes() != ref.tobytes():
                diff = int(np.sum(mine.view(np.uint32) != ref.view(np.uint32)))
                print("gguf_f32_copy: %s: %s (%s): %d of %d values differ from ggml's" % (
                    fn, t.name, t.tensor_type.name, diff, ref.size))
                bad += 1
            s = seen.setdefault(t.tensor_type.name, [0, 0])
            s[0] += 1
            s[1] += ref.size
    print("gguf-py = ggml's dequantization, bit for bit: " +
          ", ".join("%s %d tensors (%d values)" % (k, v[0], v[1]) for k, v in sorted(seen.items())))
    return 1 if bad else 0


def copy(gguf, dequantize, inp, out):
    r = gguf.GGUFReader(inp)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(out, arch)
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vt = field.types[0]
        st = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        v = field.contents()
        if vt == gguf.GGUFValueType.ARRAY and not len(v):
            continue  # gguf-py cannot write an empty array (a small vocabulary's merges): left out
        w.add_key_value(field.name, v, vt, sub_type=st)
    n = 0
    for t in r.tensors:
        q = int(t.tensor_type)
        if q in (0, 39):
            data, qt = t.data, t.tensor_type
            # gguf-py returns block types as raw bytes [.., bytes per row]
            w.add_tensor(t.name, np.asarray(data), raw_shape=data.shape, raw_dtype=qt)
            continue
        v = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w.add_tensor(t.name, v.reshape([int(x) for x in reversed(t.shape)]), raw_dtype=gguf.GGMLQuantizationType.F32)
        n += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("gguf_f32_copy: %s -> %s: %d tensors dequantized to F32 by gguf-py" % (inp, out, n))
    return 0


def main():
    if len(sys.argv) < 5 or sys.argv[3] not in ("check", "copy"):
        sys.exit(__doc__)
    gguf, dequantize = load(sys.argv[1])
    if sys.argv[3] == "check":
        sys.exit(check(gguf, dequantize, sys.argv[2], sys.argv[4:]))
    sys.exit(copy(gguf, dequantize, sys.argv[4], sys.argv[5]))


if __name__ == "__main__":
    main()
