#!/usr/bin/env python3
"""An FP8 checkpoint made from a bf16 fixture, and the same weights dequantised.

usage: /usr/bin/python3 tools/reference/fp8_fixture.py SRC FP8_OUT DEQ_OUT [--block R C] [--fuse-layers L,...]
       /usr/bin/python3 tools/reference/fp8_fixture.py --c-table

SRC is a checkpoint folder (tests/fixtures/qwen3, qwen3_moe). FP8_OUT gets it
as Hugging Face publishes FP8 checkpoints (Qwen/Qwen3-*-FP8): every 2-D
projection weight (`*_proj.weight`, experts included) as F8_E4M3 with a F32
`weight_scale_inv` per R x C block (default 128 x 128; the blocks at the right
and bottom edges are smaller), config.json's quantization_config saying so;
embeddings, norms, routers and the LM head stay BF16 (modules_to_not_convert).
The scales are chosen as transformers' Fp8Quantize does: per block
scale = 448 / max|w|, q = e4m3(clamp(w * scale, -448, 448)), scale_inv = 1 / scale.
DEQ_OUT gets the same model with each quantised weight dequantised as
transformers' Fp8Dequantize gives it in bf16: bf16(fp32(q) * scale_inv), the
product rounded to fp32, then to bf16 (nearest even); the other tensors as
they are. --fuse-layers stores those MoE layers' experts fused as transformers 5
saves them (mlp.experts.gate_up_proj [E][2I][H], mlp.experts.down_proj
[E][H][I], their scales [E][.][.]) in both outputs.

e4m3 (torch.float8_e4m3fn, OCP FP8 E4M3) is implemented here with numpy
alone: the values of the 127 non-negative finite codes from the format's
definition, rounding to the nearest of them with ties to the even code.
--c-table prints the value of each of the 256 codes as C hex floats (NaN for
0x7f and 0xff), the table tests/unit/test_fp8.c checks the decoder against.

Needs numpy only.
"""
import json
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np


def e4m3_values():
    """Values of codes 0x00..0x7e (sign clear), increasing with the code."""
    code = np.arange(127)
    e, m = code >> 3, (code & 7).astype(np.float64)
    return np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))


E4M3 = e4m3_values()


def e4m3_encode(x):
    """float32 array with |x| <= 448 to e4m3 codes (uint8), nearest, ties to even."""
    a = np.abs(x.astype(np.float64))
    assert np.all(a <= 448)
    hi = np.clip(np.searchsorted(E4M3, a, side="left"), 1, 126)
    lo = hi - 1
    d_lo, d_hi = a - E4M3[lo], E4M3[hi] - a
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def e4m3_decode(code):
    v = E4M3[np.minimum(code & 0x7F, 126)].astype(np.float32)
    return np.where(code & 0x80, -v, v).astype(np.float32)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_st(path):
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8 : 8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "BF16", (k, v["dtype"])
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s : 8 + n + e], dtype=np.uint16).reshape(v["shape"])
    return out


def write_st(path, tensors):
    """tensors: name -> (dtype name, numpy array of the stored bytes' type)."""
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for k in sorted(tensors):
        dt, a = tensors[k]
        raw = np.ascontiguousarray(a).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for raw in blobs:
            f.write(raw)


def quantise(w, br, bc):
    """w float32 [..., rows, cols] -> (codes uint8, scale_inv float32 [..., ceil(rows/br), ceil(cols/bc)])."""
    rows, cols = w.shape[-2:]
    nrb, ncb = -(-rows // br), -(-cols // bc)
    q = np.zeros(w.shape, np.uint8)
    inv = np.zeros(w.shape[:-2] + (nrb, ncb), np.float32)
    for i in range(nrb):
        for j in range(ncb):
            blk = w[..., i * br : (i + 1) * br, j * bc : (j + 1) * bc]
            amax = np.abs(blk).max(axis=(-2, -1), keepdims=True).astype(np.float32)
            scale = np.where(amax > 0, np.float32(448) / np.where(amax > 0, amax, 1), 1).astype(np.float32)
            x = np.clip((blk * scale).astype(np.float32), -448, 448)
            q[..., i * br : (i + 1) * br, j * bc : (j + 1) * bc] = e4m3_encode(x)
            inv[..., i, j] = (np.float32(1) / scale)[..., 0, 0]
    return q, inv


def dequantise(q, inv, br, bc):
    s = np.repeat(np.repeat(inv, br, axis=-2), bc, axis=-1)[..., : q.shape[-2], : q.shape[-1]]
    return f32_to_bf16((e4m3_decode(q) * s).astype(np.float32))


def fuse(t, layers, n_expert):
    """Per-expert tensors of those layers as transformers 5's fused ones."""
    for l in layers:
        p = f"model.layers.{l}.mlp.experts."
        gate = [t.pop(f"{p}{e}.gate_proj.weight") for e in range(n_expert)]
        up = [t.pop(f"{p}{e}.up_proj.weight") for e in range(n_expert)]
        down = [t.pop(f"{p}{e}.down_proj.weight") for e in range(n_expert)]
        t[p + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up)])
        t[p + "down_proj"] = np.stack(down)


def c_table():
    codes = np.arange(256, dtype=np.uint8)
    v = e4m3_decode(codes)
    out = []
    for c in range(256):
        m = re.fullmatch(r"(-?0x[01])\.([0-9a-f]*)p(.*)", float(v[c]).hex())
        frac = m[2].rstrip("0")
        out.append("NAN" if c & 0x7F == 0x7F else f"{m[1]}{'.' + frac if frac else ''}p{m[3]}")
    for i in range(0, 256, 8):
        print("    " + ", ".join(out[i : i + 8]) + ",")


def main():
    if sys.argv[1:] == ["--c-table"]:
        c_table()
        return
    args = sys.argv[1:]
    br, bc, fused = 128, 128, []
    if "--block" in args:
        i = args.index("--block")
        br, bc = int(args[i + 1]), int(args[i + 2])
        del args[i : i + 3]
    if "--fuse-layers" in args:
        i = args.index("--fuse-layers")
        fused = [int(x) for x in args[i + 1].split(",")]
        del args[i : i + 2]
    src, fp8_out, deq_out = (Path(a) for a in args)
    cfg = json.loads((src / "config.json").read_text())
    t = read_st(src / "model.safetensors")
    if fused:
        fuse(t, fused, cfg["num_local_experts"])
    fp8, deq = {}, {}
    for k, a in t.items():
        if k.endswith("_proj.weight") or (k.endswith("_proj") and ".experts." in k):
            q, inv = quantise(bf16_to_f32(a), br, bc)
            fp8[k] = ("F8_E4M3", q)
            fp8[k + "_scale_inv"] = ("F32", inv)
            deq[k] = ("BF16", dequantise(q, inv, br, bc))
        else:
            fp8[k] = deq[k] = ("BF16", a)
    keep = ([] if cfg.get("tie_word_embeddings") else ["lm_head"]) + sorted(
        k[: -len(".weight")] for k in t if k.endswith(".mlp.gate.weight"))
    for out, tensors, quant in ((fp8_out, fp8, True), (deq_out, deq, False)):
        out.mkdir(parents=True, exist_ok=True)
        c = dict(cfg)
        if quant:
            c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                        "weight_block_size": [br, bc], "modules_to_not_convert": keep}
        (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
        shutil.copy(src / "generation_config.json", out / "generation_config.json")
        write_st(out / "model.safetensors", tensors)


if __name__ == "__main__":
    main()
