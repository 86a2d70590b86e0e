#!/usr/bin/env python3
"""Writes models/catalog.json: the models Kapitsa supports, with sizes computed
from the shapes of their published config.json (the same shapes as
`kapitsa synth`'s presets, src/cli/synth.c).

bytes: the bf16 checkpoint's tensors; active_bytes: what one decode step reads
(routed experts at their active share, the input embedding table not counted
unless tied); kv_bytes_per_token: Kapitsa's fp32 KV cache; state_bytes: the
recurrent state (fp32) one sequence keeps on hybrids.
quant: for the architectures `kapitsa quantize` writes (qwen3, qwen3_moe), the
bytes and active bytes of each recipe, tensor by tensor as
src/model/convert.c types them (Q2_MOE on MoE models only).
gguf: Qwen's own GGUF repo and those of its quantisations named like a recipe.
usage: tools/catalog_sizes.py > models/catalog.json"""
import json

# GGUF storage: (bytes, weights) per block
BLOCK = {"F32": (4, 1), "Q8_0": (34, 32), "Q6_K": (210, 256), "Q5_K": (176, 256), "Q4_K": (144, 256),
         "Q3_K": (110, 256), "Q2_K": (84, 256)}
RECIPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_MOE", "Q2_K"]  # highest bits first


def more_bits(l, n):
    """llama.cpp's layers that get more bits in the _M mixes (convert.c's more_bits)."""
    return l < n // 8 or l >= 7 * n // 8 or (l - n // 8) % 3 == 2


def recipe_type(recipe, role, l, n):
    """convert_recipe_type: the type `recipe` gives a matrix of `role` in layer l of n."""
    down = role in ("ffn_down", "exp_down")
    if role == "vector":
        return "F32"
    if recipe in ("Q8_0", "Q6_K"):
        return recipe
    if recipe in ("Q5_K_M", "Q4_K_M"):
        if role == "output" or (role == "attn_v" or down) and more_bits(l, n):
            return "Q6_K"
        return recipe[:2] + "_K"
    if recipe == "Q3_K_M":
        if role == "output":
            return "Q6_K"
        if role == "attn_v":
            return "Q5_K" if l < 2 else "Q4_K"
        if down:
            return "Q5_K" if l < n // 16 else "Q4_K" if more_bits(l, n) else "Q3_K"
        return "Q4_K" if role == "attn_o" else "Q3_K"
    if recipe == "Q2_K":
        if role == "output":
            return "Q6_K"
        return "Q3_K" if role == "attn_v" or down else "Q4_K" if role == "embed" else "Q2_K"
    assert recipe == "Q2_MOE"
    return {"exp_up": "Q2_K", "exp_down": "Q3_K", "output": "Q8_0", "router": "Q8_0", "embed": "Q6_K",
            "attn_v": "Q6_K", "ffn_down": "Q6_K"}.get(role, "Q5_K")


def qwen3_tensors(V, H, L, nh, nkv, hd, I, tied, E, k, mi):
    """(role, layer, elements, columns of a row, share of it a decode step reads) of each
    tensor, as convert.c's plan_build lists them; a tied embedding is the LM head (and read
    as it); a token reads k of the E experts."""
    one, none, picks = (1, 1), (0, 1), (k, E)
    t = [("output" if tied else "embed", 0, V * H, H, one if tied else none), ("vector", 0, H, H, one)]
    if not tied:
        t.append(("output", 0, V * H, H, one))
    for l in range(L):
        t += [("vector", l, H, H, one), ("attn_qk", l, nh * hd * H, H, one), ("attn_qk", l, nkv * hd * H, H, one),
              ("attn_v", l, nkv * hd * H, H, one), ("attn_o", l, H * nh * hd, nh * hd, one),
              ("vector", l, hd, hd, one), ("vector", l, hd, hd, one), ("vector", l, H, H, one)]
        if E:
            t += [("router", l, E * H, H, one), ("exp_up", l, 2 * E * mi * H, H, picks),
                  ("exp_down", l, E * H * mi, mi, picks)]
        else:
            t += [("ffn_up", l, 2 * I * H, H, one), ("ffn_down", l, H * I, I, one)]
    return t


def quant_sizes(tensors, L, moe):
    out = {}
    for r in RECIPES:
        if r == "Q2_MOE" and not moe:
            continue
        total = active = 0
        for role, l, n, cols, (num, den) in tensors:
            b, w = BLOCK[recipe_type(r, role, l, L)]
            # convert.c writes rows that do not split into blocks in a fallback type;
            # no catalog model has such rows
            assert cols % w == 0, (r, role, cols)
            total += n // w * b
            active += n // w * b * num // den
        out[r] = {"bytes": total, "active_bytes": active}
    return out


def qwen3(name, repo, H, L, nh, nkv, I, tied, E=0, k=0, mi=0, draft=None, ctx=40960, gguf=None):
    hd, V = 128, 151936
    tensors = qwen3_tensors(V, H, L, nh, nkv, hd, I, tied, E, k, mi)
    total = sum(n for _, _, n, _, _ in tensors)
    active = sum(n * num // den for _, _, n, _, (num, den) in tensors)
    kv = 2 * L * nkv * hd * 4
    m = dict(name=name, repo=repo, arch="qwen3_moe" if E else "qwen3", params=total, bytes=2 * total,
             active_bytes=2 * active, context=ctx, kv_bytes_per_token=kv, state_bytes=0, draft=draft,
             quant=quant_sizes(tensors, L, E > 0))
    if gguf:
        m["gguf"] = {"repo": repo + "-GGUF", "quants": gguf}
    return m


def qwen35(name, repo, arch, V, H, L, nh, nkv, I, tied, kh, vh, E=0, k=0, mi=0, si=0, draft=None, ctx=262144):
    hd, d = 256, 128
    n_attn = L // 4
    attn = H * 2 * nh * hd + 2 * H * nkv * hd + nh * hd * H + 2 * hd
    conv = 2 * kh * d + vh * d
    delta = H * (2 * kh * d + 2 * vh * d) + H * 2 * vh + conv * 4 + vh * d * H + 3 * vh + d
    ffn = E * 3 * H * mi + E * H + 3 * H * si + H if E else 3 * H * I
    act_ffn = k * 3 * H * mi + E * H + 3 * H * si + H if E else ffn
    emb = V * H * (1 if tied else 2)
    total = emb + n_attn * attn + (L - n_attn) * delta + L * (ffn + 2 * H) + H
    active = V * H + n_attn * attn + (L - n_attn) * delta + L * (act_ffn + 2 * H) + H
    kv = 2 * n_attn * nkv * hd * 4
    state = (L - n_attn) * (vh * d * d + 3 * conv) * 4
    return dict(name=name, repo=repo, arch=arch, params=total, bytes=2 * total, active_bytes=2 * active,
                context=ctx, kv_bytes_per_token=kv, state_bytes=state, draft=draft)

def nemotron(name, repo, V, H, nh, nkv, I, pattern, sh, shd, sg, ss, E=0, k=0, mi=0, si=0, draft=None, ctx=131072):
    hd = 128
    inner, conv = sh * shd, sh * shd + 2 * sg * ss
    mamba = H * (2 * inner + 2 * sg * ss + sh) + conv * 4 + conv + inner * H + 3 * sh + inner + H
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H + H
    mlp = 2 * H * I + H
    moe = E * 2 * H * mi + 2 * H * si + E * H + E + H
    act_moe = k * 2 * H * mi + 2 * H * si + E * H + E + H
    cnt = {c: pattern.count(c) for c in "M*-E"}
    body = cnt["M"] * mamba + cnt["*"] * attn + cnt["-"] * mlp
    total = 2 * V * H + body + cnt["E"] * moe + H
    active = V * H + body + cnt["E"] * act_moe + H
    kv = 2 * cnt["*"] * nkv * hd * 4
    state = cnt["M"] * (sh * shd * ss + 3 * conv) * 4
    return dict(name=name, repo=repo, arch="nemotron_h", params=total, bytes=2 * total, active_bytes=2 * active,
                context=ctx, kv_bytes_per_token=kv, state_bytes=state, draft=draft)

N9 = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
# the recipes of which Qwen publishes a GGUF beside the 4B and larger Qwen3 checkpoints (the 0.6B
# and 1.7B: Q8_0 only)
QWEN_GGUF = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M"]
N30 = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
models = [
    qwen3("qwen3-0.6b", "Qwen/Qwen3-0.6B", 1024, 28, 16, 8, 3072, True, gguf=["Q8_0"]),
    qwen3("qwen3-1.7b", "Qwen/Qwen3-1.7B", 2048, 28, 16, 8, 6144, True, draft="qwen3-0.6b", gguf=["Q8_0"]),
    qwen3("qwen3-4b", "Qwen/Qwen3-4B", 2560, 36, 32, 8, 9728, True, draft="qwen3-0.6b", gguf=QWEN_GGUF),
    qwen3("qwen3-8b", "Qwen/Qwen3-8B", 4096, 36, 32, 8, 12288, False, draft="qwen3-0.6b", gguf=QWEN_GGUF),
    qwen3("qwen3-14b", "Qwen/Qwen3-14B", 5120, 40, 40, 8, 17408, False, draft="qwen3-0.6b", gguf=QWEN_GGUF),
    qwen3("qwen3-32b", "Qwen/Qwen3-32B", 5120, 64, 64, 8, 25600, False, draft="qwen3-0.6b", gguf=QWEN_GGUF),
    qwen3("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 2048, 48, 32, 4, 0, False, E=128, k=8, mi=768, draft="qwen3-0.6b",
          gguf=QWEN_GGUF),
    qwen35("qwen3.5-0.8b", "Qwen/Qwen3.5-0.8B", "qwen3_5", 248320, 1024, 24, 8, 2, 3584, True, 16, 16),
    qwen35("qwen3.5-4b", "Qwen/Qwen3.5-4B", "qwen3_5", 248320, 2560, 32, 16, 4, 9216, True, 16, 32,
           draft="qwen3.5-0.8b"),
    qwen35("qwen3.5-9b", "Qwen/Qwen3.5-9B", "qwen3_5", 248320, 4096, 32, 16, 4, 12288, False, 16, 32,
           draft="qwen3.5-0.8b"),
    qwen35("qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", "qwen3_5_moe", 248320, 2048, 40, 16, 2, 0, False, 16, 32,
           E=256, k=8, mi=512, si=512, draft="qwen3.5-0.8b"),
    qwen35("qwen3-next-80b-a3b", "Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3_next", 151936, 2048, 48, 16, 2, 0,
           False, 16, 32, E=512, k=10, mi=512, si=512, draft="qwen3-0.6b"),
    nemotron("nemotron-nano-9b-v2", "nvidia/NVIDIA-Nemotron-Nano-9B-v2", 131072, 4480, 40, 8, 15680, N9,
             128, 80, 8, 128),
    nemotron("nemotron-3-nano-30b-a3b", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 131072, 2688, 32, 2, 0, N30,
             64, 64, 8, 128, E=128, k=6, mi=1856, si=3712, ctx=262144),
]
for m in models:
    m["revision"] = "main"
    m["dtypes"] = ["bf16"]
print(json.dumps({"comment": "generated by tools/catalog_sizes.py; sizes from the published configs' shapes",
                  "models": models}, indent=1))
