"""Known-answer vectors for GGUF's quantised block formats, made by the
format's own reference code: gguf-py (llama.cpp's Python package), whose
quants.py dequantises every type below and quantises the 32-element legacy
ones the way ggml-quants.c's *_ref functions do.

For each type, tests/data/quant/<TYPE>.bin (little-endian):

  u32 magic 0x3156514b ("KQV1"), u32 ggml type id, u32 n_elems, u32 has_quant
  dequantisation vector:
    n_elems / block_elems * block_bytes  block bytes: pseudo-random, with
                                         every f16 scale/min field (d, dmin,
                                         m) set to a finite f16 of magnitude
                                         0.001 .. 0.05 and random sign
    n_elems f32                          gguf.quants.dequantize of them
  quantisation vector, only if has_quant (types gguf-py can quantise):
    n_elems f32                          inputs
    n_elems / block_elems * block_bytes  gguf.quants.quantize of them

The quantisation inputs are one all-zero block, one block of exact ties
(x * (1/d) lands on k + 0.5, d = 1: round-half handling), one constant block,
then normal(0, 1) times a per-block scale (log-uniform 1e-3 .. 1e2).

Deterministic: fixed seeds, one per type.

usage: python3 tools/reference/quant_vectors.py [--gguf-py DIR] [--out DIR]
  (defaults: /work/llama.cpp/gguf-py, tests/data/quant under the repo root;
  needs numpy: use the python3 that has it, e.g. /usr/bin/python3 on Debian)
"""
import argparse
import os
import struct
import sys
import zlib

import numpy as np

MAGIC = 0x3156514B  # "KQV1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# type name -> byte offsets of its f16 scale/min fields within one block
# (ggml-common.h's block_* structs)
F16_FIELDS = {
    "Q4_0": (0,),          # d, qs[16]
    "Q4_1": (0, 2),        # d, m, qs[16]
    "Q5_0": (0,),          # d, qh[4], qs[16]
    "Q5_1": (0, 2),        # d, m, qh[4], qs[16]
    "Q8_0": (0,),          # d, qs[32]
    "Q2_K": (80, 82),      # scales[16], qs[64], d, dmin
    "Q3_K": (108,),        # hmask[32], qs[64], scales[12], d
    "Q4_K": (0, 2),        # d, dmin, scales[12], qs[128]
    "Q5_K": (0, 2),        # d, dmin, scales[12], qh[32], qs[128]
    "Q6_K": (208,),        # ql[128], qh[64], scales[16] (int8), d
    "IQ4_NL": (0,),        # d, qs[16]
    "IQ4_XS": (0,),        # d, scales_h (u16, not f16), scales_l[4], qs[128]
    "IQ2_XXS": (0,),       # d, qs[32] (u16)
}
TYPES = list(F16_FIELDS)


def f16_fields(rng, n):
    mag = rng.uniform(0.001, 0.05, size=n)
    sign = np.where(rng.integers(0, 2, size=n) == 0, 1.0, -1.0)
    v = (mag * sign).astype(np.float16)
    assert np.all(np.isfinite(v)) and np.all(v != 0)
    return v


def dequant_case(gguf, qt, rng, n_blocks):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qt.name]:
        raw[:, off:off + 2] = f16_fields(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    out = gguf.quants.dequantize(raw.reshape(-1).copy(), qt)
    out = np.asarray(out, dtype=np.float32).reshape(-1)
    assert out.size == n_blocks * block_elems, (qt.name, out.size)
    assert np.all(np.isfinite(out)), qt.name
    return raw.reshape(-1), out


def ties_block(name, rng, n):
    """A block whose scale comes out exactly 1, the rest at k + 0.5."""
    if name == "Q4_0":
        b = rng.integers(-8, 8, size=n) + 0.5; b[0] = -8.0
    elif name == "Q5_0":
        b = rng.integers(-16, 16, size=n) + 0.5; b[0] = -16.0
    elif name == "Q8_0":
        b = rng.integers(-127, 127, size=n) + 0.5; b[0] = 127.0
    elif name == "Q4_1":
        b = rng.integers(0, 15, size=n) + 0.5; b[0], b[1] = 0.0, 15.0
    elif name == "Q5_1":
        b = rng.integers(0, 31, size=n) + 0.5; b[0], b[1] = 0.0, 31.0
    else:
        b = rng.normal(0, 1, size=n)
    return b


def quant_case(gguf, qt, rng, n_blocks):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
    x = np.empty((n_blocks, block_elems), dtype=np.float64)
    x[0] = 0.0
    x[1] = ties_block(qt.name, rng, block_elems)
    x[2] = 0.3
    scales = 10.0 ** rng.uniform(-3, 2, size=(n_blocks - 3, 1))
    x[3:] = rng.normal(0, 1, size=(n_blocks - 3, block_elems)) * scales
    x = x.astype(np.float32)
    q = np.asarray(gguf.quants.quantize(x.reshape(1, -1).copy(), qt), dtype=np.uint8).reshape(-1)
    assert q.size == n_blocks * block_bytes, (qt.name, q.size)
    return x.reshape(-1), q


def can_quantize(gguf, qt):
    try:
        block_elems, _ = gguf.GGML_QUANT_SIZES[qt]
        gguf.quants.quantize(np.zeros((1, block_elems), dtype=np.float32), qt)
        return True
    except NotImplementedError:
        return False


def write(path, tid, n_elems, dq_bytes, dq_vals, qin=None, qbytes=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<4I", MAGIC, tid, n_elems, 1 if qin is not None else 0))
        f.write(dq_bytes.astype(np.uint8).tobytes())
        f.write(dq_vals.astype("<f4").tobytes())
        if qin is not None:
            f.write(qin.astype("<f4").tobytes())
            f.write(qbytes.astype(np.uint8).tobytes())


def read(path, gguf):
    """Reads a file back; returns (type id, n_elems, dq_bytes, dq_vals, qin, qbytes)."""
    data = open(path, "rb").read()
    magic, tid, n, hq = struct.unpack_from("<4I", data, 0)
    assert magic == MAGIC and hq in (0, 1)
    qt = gguf.GGMLQuantizationType(tid)
    be, bb = gguf.GGML_QUANT_SIZES[qt]
    nb = n // be * bb
    o = 16
    dqb = np.frombuffer(data, np.uint8, nb, o); o += nb
    dqv = np.frombuffer(data, "<f4", n, o); o += 4 * n
    qin = qb = None
    if hq:
        qin = np.frombuffer(data, "<f4", n, o); o += 4 * n
        qb = np.frombuffer(data, np.uint8, nb, o); o += nb
    assert o == len(data), (path, o, len(data))
    return tid, n, dqb, dqv, qin, qb


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf-py", default="/work/llama.cpp/gguf-py")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "quant"))
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import gguf
    import gguf.quants  # noqa: F401

    os.makedirs(a.out, exist_ok=True)
    for name in TYPES:
        qt = gguf.GGMLQuantizationType[name]
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        n_blocks = 8 if block_elems == 256 else 16
        n = n_blocks * block_elems
        seed = zlib.crc32(name.encode())  # fixed, per type
        rng = np.random.default_rng(seed)
        dqb, dqv = dequant_case(gguf, qt, rng, n_blocks)
        qin = qb = None
        if can_quantize(gguf, qt):
            qin, qb = quant_case(gguf, qt, np.random.default_rng(seed + 1), n_blocks)
        path = os.path.join(a.out, name + ".bin")
        write(path, int(qt), n, dqb, dqv, qin, qb)

        # read back and check against a fresh run of the reference code
        tid, n2, dqb2, dqv2, qin2, qb2 = read(path, gguf)
        assert tid == int(qt) and n2 == n
        assert np.array_equal(dqb2, dqb)
        again = np.asarray(gguf.quants.dequantize(dqb2.copy(), qt), np.float32).reshape(-1)
        assert np.array_equal(again.view(np.uint32), dqv2.view(np.uint32))
        if qin is not None:
            again = np.asarray(gguf.quants.quantize(qin2.reshape(1, -1).copy(), qt), np.uint8).reshape(-1)
            assert np.array_equal(again, qb2)
            # and the quantised bytes dequantise to finite values
            rt = np.asarray(gguf.quants.dequantize(qb2.copy(), qt), np.float32).reshape(n_blocks, -1)
            assert np.all(np.isfinite(rt))
        print(f"{name:8s} type {int(qt):2d}  {n:5d} elems  quant={'yes' if qin is not None else 'no '}  "
              f"{os.path.getsize(path):6d} bytes  {path}")


if __name__ == "__main__":
    main()
