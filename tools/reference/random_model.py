"""A small random transformers checkpoint (qwen3 or qwen3_moe) whose matrices
have rows of whole 256-element blocks: config.json and model.safetensors, bf16.
usage: random_model.py OUT_DIR qwen3|qwen3_moe"""
import json
import os
import struct
import sys

import numpy as np

out, kind = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1234 if kind == "qwen3" else 5678)
H, I, V, L, NH, NKV, HD, E, K, MI = 256, 256, 32, 1, 4, 2, 64, 2, 1, 256
cfg = {"model_type": kind, "architectures": ["Qwen3ForCausalLM" if kind == "qwen3" else "Qwen3MoeForCausalLM"],
       "hidden_size": H, "intermediate_size": I, "vocab_size": V, "num_hidden_layers": L,
       "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "rms_norm_eps": 1e-6,
       "rope_theta": 1000000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
       "bos_token_id": 1, "eos_token_id": 2}
if kind == "qwen3_moe":
    cfg.update({"num_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": MI, "norm_topk_prob": True,
                "decoder_sparse_step": 1, "mlp_only_layers": []})
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)

tensors = {}


def w(name, *shape, scale=None):
    s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
    # heavy-ish tails, as trained weights have
    tensors[name] = (rng.standard_t(5, size=shape) * s * 0.7).astype(np.float32)


w("model.embed_tokens.weight", V, H, scale=1.0)
w("lm_head.weight", V, H)
tensors["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
for l in range(L):
    p = f"model.layers.{l}."
    tensors[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    tensors[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    tensors[p + "self_attn.q_norm.weight"] = (1 + 0.1 * rng.standard_normal(HD)).astype(np.float32)
    tensors[p + "self_attn.k_norm.weight"] = (1 + 0.1 * rng.standard_normal(HD)).astype(np.float32)
    w(p + "self_attn.q_proj.weight", NH * HD, H)
    w(p + "self_attn.k_proj.weight", NKV * HD, H)
    w(p + "self_attn.v_proj.weight", NKV * HD, H)
    w(p + "self_attn.o_proj.weight", H, NH * HD)
    if kind == "qwen3":
        w(p + "mlp.gate_proj.weight", I, H)
        w(p + "mlp.up_proj.weight", I, H)
        w(p + "mlp.down_proj.weight", H, I)
    else:
        w(p + "mlp.gate.weight", E, H)
        for e in range(E):
            w(p + f"mlp.experts.{e}.gate_proj.weight", MI, H)
            w(p + f"mlp.experts.{e}.up_proj.weight", MI, H)
            w(p + f"mlp.experts.{e}.down_proj.weight", H, MI)


def bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


header, blobs, off = {}, [], 0
for name in sorted(tensors):
    b = bf16(tensors[name]).tobytes()
    header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
        f.write(b)
