"""Reference fixtures of the hybrid families beyond the shared ones, made the
same way as goldens.py (transformers, fp32 compute over the bf16 weights, eager
attention) with this project's seed and shapes, and a 1000-token prefill that
crosses many scan chunks. Vocabulary 256 and no per-layer hidden states, to
keep the files small.

  qwen3_5_wrapper   Qwen3.5 dense, 8 layers, hidden 96, 3 value heads per key
                    head, tied embeddings, conv width 3, saved as the
                    multimodal wrapper (model_type qwen3_5 with text_config,
                    tensors under model.language_model.)
  qwen3_next_mixed  Qwen3-Next, 12 experts top-3 without renormalisation, a
                    dense layer (mlp_only_layers [2]), full attention every 2nd
  nemotron_h_groups Nemotron 3 style with group-limited routing (4 groups, top 2),
                    4 SSM groups, scan chunk 64, written with
                    hybrid_override_pattern instead of layers_block_type

usage: python3 hybrid_fixtures.py OUTDIR
"""
import json, os, sys

import torch
import transformers
from safetensors.torch import load_file, save_file

OUT = sys.argv[1]
torch.backends.cuda.matmul.allow_tf32 = False
SEED, V, L = 777, 256, 1000


def base(c):
    c.vocab_size, c.max_position_embeddings, c.rms_norm_eps = V, 8192, 1e-6
    c.bos_token_id, c.eos_token_id, c.pad_token_id = 1, 1, None
    return c


def qwen_common(c, n, every):
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim = 96, 6, 2, 32
    c.num_hidden_layers = n
    c.layer_types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    c.rope_parameters = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}
    c.intermediate_size = 160


def qwen3_5_wrapper():
    m = __import__("transformers.models.qwen3_5", fromlist=["x"])
    c = base(m.Qwen3_5TextConfig())
    qwen_common(c, 8, 4)
    c.linear_num_key_heads, c.linear_num_value_heads = 2, 6
    c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim = 16, 24, 3
    c.tie_word_embeddings = True
    return c, m.Qwen3_5ForCausalLM


def qwen3_next_mixed():
    c = base(transformers.Qwen3NextConfig())
    qwen_common(c, 6, 2)
    c.linear_num_key_heads, c.linear_num_value_heads = 2, 4
    c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim = 16, 16, 4
    c.num_experts, c.num_experts_per_tok, c.norm_topk_prob = 12, 3, False
    c.moe_intermediate_size, c.shared_expert_intermediate_size = 24, 40
    c.decoder_sparse_step, c.mlp_only_layers, c.tie_word_embeddings = 1, [2], False
    return c, transformers.Qwen3NextForCausalLM


PATTERN = "ME*EMEM-"


def nemotron_h_groups():
    kind = {"M": "mamba", "-": "mlp", "*": "attention", "E": "moe"}
    try:
        c = transformers.NemotronHConfig(hybrid_override_pattern=PATTERN, num_hidden_layers=len(PATTERN))
    except Exception:
        c = transformers.NemotronHConfig(layers_block_type=[kind[ch] for ch in PATTERN], num_hidden_layers=len(PATTERN))
    base(c)
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim = 80, 4, 1, 20
    c.intermediate_size = 112
    c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size, c.n_groups = 8, 12, 24, 4
    c.conv_kernel, c.chunk_size, c.expand = 4, 64, 2
    c.mamba_hidden_act, c.mlp_hidden_act, c.tie_word_embeddings = "silu", "relu2", False
    c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size = 16, 3, 24
    c.moe_shared_expert_intermediate_size, c.n_shared_experts = 40, 1
    c.n_group, c.topk_group, c.routed_scaling_factor, c.norm_topk_prob = 4, 2, 1.5, True
    return c, transformers.NemotronHForCausalLM


def to_wrapper(d):
    """Rewrites a saved Qwen3_5ForCausalLM folder into the multimodal wrapper's layout."""
    cj = json.load(open(os.path.join(d, "config.json")))
    text = {k: v for k, v in cj.items() if k not in ("architectures", "transformers_version")}
    wrap = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": text, "tie_word_embeddings": cj.get("tie_word_embeddings", False),
            "transformers_version": cj.get("transformers_version")}
    json.dump(wrap, open(os.path.join(d, "config.json"), "w"), indent=2)
    st = load_file(os.path.join(d, "model.safetensors"))
    st = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
          for k, v in st.items()}
    save_file(st, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def to_pattern(d):
    p = os.path.join(d, "config.json")
    cj = json.load(open(p))
    cj.pop("layers_block_type", None)
    cj["hybrid_override_pattern"] = PATTERN
    json.dump(cj, open(p, "w"), indent=2)


g = torch.Generator().manual_seed(SEED)
PREFILL = torch.randint(2, V, (1, L), generator=g)
PROMPT = torch.randint(2, V, (1, 13), generator=g)
report = {}
for name, make, post in (("qwen3_5_wrapper", qwen3_5_wrapper, to_wrapper),
                         ("qwen3_next_mixed", qwen3_next_mixed, None),
                         ("nemotron_h_groups", nemotron_h_groups, to_pattern)):
    try:
        torch.manual_seed(SEED)
        cfg, cls = make()
        cfg._attn_implementation = "eager"
        model = cls(cfg).to(torch.bfloat16).eval()
        with torch.no_grad():
            for n_, p in model.named_parameters():
                if p.dim() >= 2 and "embed" not in n_:
                    p.mul_(2.5)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        ref = model.float()
        with torch.no_grad():
            out = ref(PREFILL, use_cache=False)
            gen = ref.generate(PROMPT, max_new_tokens=40, do_sample=False, min_new_tokens=40,
                               eos_token_id=None, pad_token_id=0)
        t = {"prefill_ids": PREFILL[0].to(torch.int32).contiguous(),
             "prefill_logits": out.logits[0].contiguous(),
             "prompt_ids": PROMPT[0].to(torch.int32).contiguous(),
             "greedy_ids": gen[0, PROMPT.shape[1]:].to(torch.int32).contiguous()}
        save_file(t, os.path.join(d, "golden.safetensors"),
                  metadata={"about": "transformers " + transformers.__version__ + ", hybrid_fixtures.py"})
        if post:
            post(d)
        lg = out.logits[0]
        top2 = lg.topk(2, dim=-1).values
        report[name] = {"ok": True, "logit_std": float(lg.std()),
                        "min_top_gap": float((top2[:, 0] - top2[:, 1]).min()), "files": sorted(os.listdir(d))}
    except Exception as e:
        import traceback
        report[name] = {"ok": False, "error": repr(e)[:1500], "trace": traceback.format_exc()[-2500:]}
    print(name, json.dumps(report[name])[:3000], flush=True)
json.dump(report, open(os.path.join(OUT, "report.json"), "w"), indent=1)
