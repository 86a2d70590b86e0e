"""More reference fixtures for the features the shared ones leave out, made the
same way as goldens.py (transformers, fp32 compute over stored weights, eager
attention) but with this project's own seed and shapes:

  qwen3_yarn_sharded  YaRN rope (factor 4, theta 1e4, original 2048), untied
                      embeddings, 3 layers, head_dim 32 with hidden 96, and the
                      checkpoint saved in shards (model.safetensors.index.json)
  qwen3_f16_linear    linear rope scaling (factor 2), weights stored as float16
  qwen3_moe_mixed     12 experts top-3, norm_topk_prob false, a dense layer
                      (mlp_only_layers [1]) between sparse ones

usage: python3 extra_fixtures.py OUTDIR
"""
import json, os, sys

import torch
import transformers
from safetensors.torch import save_file

OUT = sys.argv[1]
torch.backends.cuda.matmul.allow_tf32 = False
SEED, V = 4242, 512


def base(c):
    c.vocab_size, c.max_position_embeddings, c.rms_norm_eps = V, 8192, 1e-6
    c.bos_token_id, c.eos_token_id, c.pad_token_id = 1, 1, None
    return c


def yarn():
    c = base(transformers.Qwen3Config())
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim = 96, 6, 2, 32
    c.intermediate_size, c.num_hidden_layers, c.tie_word_embeddings = 160, 3, False
    c.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                         "original_max_position_embeddings": 2048}
    c.layer_types = ["full_attention"] * 3
    return c, transformers.Qwen3ForCausalLM, torch.bfloat16, "60KB"


def f16_linear():
    c = base(transformers.Qwen3Config())
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim = 64, 4, 1, 16
    c.intermediate_size, c.num_hidden_layers, c.tie_word_embeddings = 96, 2, True
    c.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}
    c.layer_types = ["full_attention"] * 2
    return c, transformers.Qwen3ForCausalLM, torch.float16, None


def moe_mixed():
    c = base(transformers.Qwen3MoeConfig())
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim = 64, 4, 2, 32
    c.num_hidden_layers, c.intermediate_size, c.moe_intermediate_size = 3, 96, 24
    c.num_experts, c.num_experts_per_tok, c.norm_topk_prob = 12, 3, False
    c.decoder_sparse_step, c.mlp_only_layers, c.tie_word_embeddings = 1, [1], False
    c.rope_parameters = {"rope_type": "default", "rope_theta": 1000000.0}
    return c, transformers.Qwen3MoeForCausalLM, torch.bfloat16, None


g = torch.Generator().manual_seed(SEED)
PREFILL = torch.randint(2, V, (1, 160), generator=g)
PROMPT = torch.randint(2, V, (1, 9), generator=g)
for name, make in {"qwen3_yarn_sharded": yarn, "qwen3_f16_linear": f16_linear,
                   "qwen3_moe_mixed": moe_mixed}.items():
    torch.manual_seed(SEED)
    cfg, cls, dtype, shard = make()
    cfg._attn_implementation = "eager"
    model = cls(cfg).to(dtype).eval()
    with torch.no_grad():
        for n_, p in model.named_parameters():
            if p.dim() >= 2 and "embed" not in n_:
                p.mul_(2.5)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    if shard:
        model.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
    else:
        model.save_pretrained(d, safe_serialization=True)
    ref = model.float()
    with torch.no_grad():
        out = ref(PREFILL, output_hidden_states=True, use_cache=False)
        gen = ref.generate(PROMPT, max_new_tokens=32, do_sample=False, min_new_tokens=32,
                           eos_token_id=None, pad_token_id=0)
    t = {"prefill_ids": PREFILL[0].to(torch.int32).contiguous(),
         "prefill_logits": out.logits[0].contiguous(),
         "prompt_ids": PROMPT[0].to(torch.int32).contiguous(),
         "greedy_ids": gen[0, PROMPT.shape[1]:].to(torch.int32).contiguous()}
    t.update({f"hidden.{i}": h[0].contiguous() for i, h in enumerate(out.hidden_states)})
    save_file(t, os.path.join(d, "golden.safetensors"),
              metadata={"about": "transformers " + transformers.__version__ + ", extra_fixtures.py"})
    print(name, sorted(os.listdir(d)), float(out.logits.std()), flush=True)
