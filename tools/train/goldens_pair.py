"""Golden logits of the committed pair by transformers, in kapitsa check's format
(tests/fixtures/README.md), for `kapitsa check models/kapitsa-tiny --golden F --rope-f32`
(from_pretrained keeps the rotary frequencies in fp32). The prefill is the start of
tools/bench_tasks/complete.txt (24 tokens: the full logits of a 151,936-token
vocabulary are large), the greedy continuation 40 tokens of "def is_prime(n):\\n".

usage: python3 goldens_pair.py OUTDIR   (run from the repository root)
"""
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

OUT = sys.argv[1]
torch.backends.cuda.matmul.allow_tf32 = False
tok = Tokenizer.from_file("models/qwen3-tokenizer/tokenizer.json")
pre = torch.tensor([tok.encode(open("tools/bench_tasks/complete.txt").read(), add_special_tokens=False).ids[:24]])
prompt = torch.tensor([tok.encode("def is_prime(n):\n", add_special_tokens=False).ids])
for name in ("kapitsa-tiny", "kapitsa-tiny-draft"):
    m = AutoModelForCausalLM.from_pretrained(f"models/{name}", dtype=torch.float32).eval()
    m.config._attn_implementation = "eager"
    with torch.no_grad():
        out = m(pre, output_hidden_states=True)
        gen = m.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    t = {"prefill_ids": pre[0].to(torch.int32), "prefill_logits": out.logits[0].float().contiguous(),
         "prompt_ids": prompt[0].to(torch.int32), "greedy_ids": gen[0, prompt.shape[1]:].to(torch.int32).contiguous()}
    t.update({f"hidden.{i}": h[0].float().contiguous() for i, h in enumerate(out.hidden_states)})
    save_file(t, f"{OUT}/{name}.golden.safetensors")
    print(name, "ok", flush=True)
