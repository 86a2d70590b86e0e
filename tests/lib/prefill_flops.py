#!/usr/bin/env python3
"""The FLOPs of an n-token prefill of a checkpoint, counted from its files
alone (safetensors headers and config.json), as `kapitsa bench` defines
them: two per weight element of the decoder's matrices (routed experts at
their active share) per token, the embedding table (a lookup) and the LM
head (one row) left out, and the causal attention's q.k and p.v products
over n(n+1)/2 pairs per head of each attention layer.

  python3 tests/lib/prefill_flops.py CHECKPOINT_DIR N
"""
import glob
import json
import math
import os
import struct
import sys


def main():
    d, n = sys.argv[1], int(sys.argv[2])
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg = cfg.get("text_config", cfg)
    shapes = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with open(f, "rb") as fh:
            size = struct.unpack("<Q", fh.read(8))[0]
            shapes.update({k: v["shape"] for k, v in json.loads(fh.read(size)).items() if k != "__metadata__"})
    nemotron = any(k.startswith("backbone.") for k in shapes)
    prefix = "backbone." if nemotron else "model.language_model." if any(
        k.startswith("model.language_model.") for k in shapes) else "model."
    embed = prefix + ("embeddings.weight" if nemotron else "embed_tokens.weight")
    n_expert = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 1
    w = 0.0
    for name, shape in shapes.items():
        if len(shape) != 2 or not name.startswith(prefix) or name == embed:
            continue
        e = float(math.prod(shape))
        if ".experts." in name:
            e *= cfg["num_experts_per_tok"] / n_expert
        w += e
    if "layers_block_type" in cfg:
        n_attn = cfg["layers_block_type"].count("full_attention")
    elif "layer_types" in cfg:
        n_attn = cfg["layer_types"].count("full_attention")
    else:
        n_attn = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    att = 4.0 * cfg["num_attention_heads"] * head_dim * n_attn * n * (n + 1) / 2
    print(f"{2.0 * w * n + att:.0f}")


main()
