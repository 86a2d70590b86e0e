"""Trains Kapitsa's embedded default models on the GPU machine: kapitsa-tiny (the
target) and kapitsa-tiny-draft (its speculative-decoding draft), both of the qwen3
architecture with the real Qwen3 tokenizer, on the Python sources and docs that
machine has, plus chat-formatted samples (code requests, tool calls) rendered with
the Qwen3 chat template. See tools/train/README.md for the exact command.

usage: python3 train.py TOKENIZER_DIR OUTDIR [TARGET_SECONDS DRAFT_SECONDS]

Writes OUTDIR/kapitsa-tiny, OUTDIR/kapitsa-tiny-draft (save_pretrained, bf16,
tied embeddings; golden.safetensors in the format of tests/fixtures/README.md),
OUTDIR/metrics.json and OUTDIR/data_listing.txt (every training file and its sha256).
"""
import ast, glob, hashlib, json, math, os, random, sys, time

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer

TOK_DIR, OUT = sys.argv[1], sys.argv[2]
T_TARGET = float(sys.argv[3]) if len(sys.argv) > 3 else 180
T_DRAFT = float(sys.argv[4]) if len(sys.argv) > 4 else 90
SEED = 20261130
SEQ, BATCH = 512, 64
random.seed(SEED)
torch.manual_seed(SEED)
torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"
os.makedirs(OUT, exist_ok=True)
t_start = time.time()

# ---- data: deduplicated sources, split by file ----
paths = sorted(set(f for pat in ("/usr/lib/python3*/**/*.py", "/opt/**/site-packages/**/*.py",
                                   "/opt/**/site-packages/**/*.md", "/opt/**/site-packages/**/*.rst")
                   for f in glob.glob(pat, recursive=True, include_hidden=True)))  # the venv is /opt/*/.venv
random.shuffle(paths)
seen, docs, n_bytes = set(), [], 0
for p in paths:
    if n_bytes > 150_000_000:
        break
    try:
        if not os.path.isfile(p) or not 200 <= os.path.getsize(p) <= 200_000:
            continue
        text = open(p, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    h = hashlib.sha256(text.encode()).hexdigest()
    if h in seen:
        continue
    seen.add(h)
    docs.append((p, h, text))
    n_bytes += len(text)
docs.sort(key=lambda d: d[0])
random.shuffle(docs)
n_held = max(50, len(docs) // 100)
held, train_docs = docs[:n_held], docs[n_held:]
with open(os.path.join(OUT, "data_listing.txt"), "w") as f:
    for split, ds in (("heldout", held), ("train", train_docs)):
        for p, h, _ in ds:
            f.write(f"{split}\t{h}\t{p}\n")

# chat samples, rendered by the real template (so the models learn its exact format)
at = transformers.AutoTokenizer.from_pretrained(TOK_DIR)
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]
chats = []
for p, _, text in train_docs:
    if not p.endswith(".py") or len(chats) > 6000:
        continue
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        continue
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and ast.get_docstring(n)]
    for fn in fns[:2]:
        src = ast.get_source_segment(text, fn)
        if not src or len(src) > 1500:
            continue
        doc = ast.get_docstring(fn).strip().splitlines()[0]
        msgs = [{"role": "user", "content": f"Write a Python function `{fn.name}`: {doc}"},
                {"role": "assistant", "content": f"```python\n{src}\n```"}]
        chats.append(at.apply_chat_template(msgs, tokenize=False, enable_thinking=False))
    if fns and random.random() < 0.3:
        rel = os.path.basename(p)
        names = ", ".join(f"`{n.name}`" for n in fns[:4])
        msgs = [{"role": "user", "content": f"What is in {rel}?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": "read_file", "arguments": {"path": rel}}}]},
                {"role": "tool", "content": "\n".join(text.splitlines()[:12])},
                {"role": "assistant", "content": f"{rel} defines {names}."}]
        chats.append(at.apply_chat_template(msgs, tools=TOOLS, tokenize=False, enable_thinking=False))

tok = Tokenizer.from_file(os.path.join(TOK_DIR, "tokenizer.json"))
EOT = tok.token_to_id("<|endoftext|>")


def stream(texts):
    ids = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(e.ids)
        ids.append(EOT)
    return torch.tensor(ids, dtype=torch.int32)


train_ids = torch.cat([stream([t for _, _, t in train_docs]), stream(chats)])
held_ids = stream([t for _, _, t in held])
print(f"data: {len(train_docs)} train files, {len(held)} held-out, {len(chats)} chats; "
      f"{train_ids.numel()} train tokens, {held_ids.numel()} held-out tokens ({time.time() - t_start:.0f}s)", flush=True)
train_gpu = train_ids.to(dev).long()


def make(hidden, layers, heads, kv, head_dim, inter):
    # max_position_embeddings: the context kapitsa launch serves it with (an agent's prompt runs to ~20k
    # tokens; kapitsa serve caps --ctx at it); trained on 512-token windows, it writes nonsense that far out
    c = transformers.Qwen3Config(vocab_size=151936, hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                                 intermediate_size=inter, max_position_embeddings=65536, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    c.layer_types = ["full_attention"] * layers
    return transformers.Qwen3ForCausalLM(c).to(dev)


def train(model, seconds, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    t0, step, losses = time.time(), 0, []
    while True:
        el = time.time() - t0
        if el > seconds:
            break
        frac = el / seconds
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        starts = torch.randint(0, train_gpu.numel() - SEQ - 1, (BATCH,), device=dev)
        idx = starts[:, None] + torch.arange(SEQ + 1, device=dev)[None, :]
        x = train_gpu[idx]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item()) if step % 50 == 0 else None
        step += 1
    print(f"  {step} steps in {time.time() - t0:.0f}s, last loss {losses[-1]:.3f}", flush=True)
    return step, time.time() - t0


@torch.no_grad()
def heldout_loss(model, n_tok=262144):
    model.eval()
    ids = held_ids[: n_tok + 1].to(dev).long()
    total, count = 0.0, 0
    for s in range(0, ids.numel() - 1 - SEQ, SEQ):
        x = ids[s: s + SEQ + 1][None]
        logits = model(x[:, :-1]).logits.float()
        total += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
        count += SEQ
    return total / count


target = make(64, 8, 4, 2, 32, 256)
draft = make(32, 2, 2, 1, 32, 96)
print("training target", flush=True)
steps_t, secs_t = train(target, T_TARGET, 3e-3)
print("training draft", flush=True)
steps_d, secs_d = train(draft, T_DRAFT, 4e-3)

# export in bf16, then measure everything on the exported (bf16-rounded) weights in fp32,
# exactly what the C engine and kapitsa check see; TF32 (fine for training) would put
# about 1e-2 of error into the reference logits, so it is off from here on
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
metrics = {"seed": SEED, "torch": torch.__version__, "transformers": transformers.__version__,
           "train_files": len(train_docs), "heldout_files": len(held), "chat_samples": len(chats),
           "train_tokens": int(train_ids.numel()), "heldout_tokens": int(held_ids.numel()),
           "seq": SEQ, "batch": BATCH}
g = torch.Generator().manual_seed(SEED)
pos = torch.randint(0, held_ids.numel() - 600, (1,), generator=g).item()
PREFILL = held_ids[pos: pos + 16].long()[None]
PROMPT = torch.tensor([tok.encode("def is_prime(n):\n", add_special_tokens=False).ids])
for name, model, steps, secs in (("kapitsa-tiny", target, steps_t, secs_t), ("kapitsa-tiny-draft", draft, steps_d, secs_d)):
    d = os.path.join(OUT, name)
    model = model.to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = [151645, 151643]
    model.generation_config.bos_token_id = 151643
    model.save_pretrained(d, safe_serialization=True, max_shard_size="14MB")
    ref = model.float()
    loss = heldout_loss(ref)
    with torch.no_grad():
        out = ref(PREFILL.to(dev), output_hidden_states=True, use_cache=False)
        gen = ref.generate(PROMPT.to(dev), max_new_tokens=40, do_sample=False, min_new_tokens=40,
                           eos_token_id=None, pad_token_id=0)
    t = {"prefill_ids": PREFILL[0].to(torch.int32).contiguous(),
         "prefill_logits": out.logits[0].float().cpu().contiguous(),
         "prompt_ids": PROMPT[0].to(torch.int32).contiguous(),
         "greedy_ids": gen[0, PROMPT.shape[1]:].to(torch.int32).cpu().contiguous()}
    t.update({f"hidden.{i}": h[0].float().cpu().contiguous() for i, h in enumerate(out.hidden_states)})
    save_file(t, os.path.join(d, "golden.safetensors"),
              metadata={"about": "transformers " + transformers.__version__ + ", fp32 over the bf16 weights"})
    params = sum(p.numel() for p in model.parameters())
    metrics[name] = {"params": params, "train_steps": steps, "train_seconds": round(secs, 1),
                     "heldout_loss": round(loss, 4), "heldout_ppl": round(math.exp(loss), 2),
                     "sample": tok.decode(gen[0].tolist())}
    print(name, metrics[name], flush=True)
    if name == "kapitsa-tiny":
        target_ref = ref
    else:
        draft_ref = ref

# draft agreement on held-out text: teacher-forced top-1 match, and the mean accepted
# length of a 5-token greedy draft chain verified by the target's greedy continuation
with torch.no_grad():
    ids = held_ids[:65537].to(dev).long()
    match = total = 0
    for s in range(0, 65536 - SEQ, SEQ):
        x = ids[s: s + SEQ][None]
        a = target_ref(x).logits.argmax(-1)
        b = draft_ref(x).logits.argmax(-1)
        match += (a == b).sum().item()
        total += a.numel()
    acc = []
    gpos = torch.randint(64, held_ids.numel() - 600, (200,), generator=g)
    for p0 in gpos.tolist():
        ctx = held_ids[p0 - 64: p0].long()[None].to(dev)
        tg = target_ref.generate(ctx, max_new_tokens=5, do_sample=False, min_new_tokens=5, eos_token_id=None,
                                 pad_token_id=0)[0, 64:]
        dg = draft_ref.generate(ctx, max_new_tokens=5, do_sample=False, min_new_tokens=5, eos_token_id=None,
                                pad_token_id=0)[0, 64:]
        k = 0
        while k < 5 and tg[k] == dg[k]:
            k += 1
        acc.append(k)
metrics["draft_top1_match"] = round(match / total, 4)
metrics["draft_mean_accepted_of_5"] = round(sum(acc) / len(acc), 3)
metrics["total_seconds"] = round(time.time() - t_start, 1)
json.dump(metrics, open(os.path.join(OUT, "metrics.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, dict)}), flush=True)
