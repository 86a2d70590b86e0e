"""Held-out metrics of the committed pair by PyTorch, beside `kapitsa eval` (the C
engine) on the same tokens: rebuilds the held-out token stream of train.py from
data_listing.txt.gz (same files, same order, checked by sha256), writes it as
held.i32 (little-endian int32), and prints, for models/kapitsa-tiny and its draft:
the loss of each over the first N tokens in windows of 512 (each window on its own), the
draft's top-1 agreement on those positions, and the mean accepted length of a
5-token greedy draft chain at 200 evenly spread positions (64 tokens of context).

usage: python3 eval_pair.py OUTDIR [N]   (run from the repository root; N default 16384)
"""
import gzip, hashlib, json, math, sys

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

OUT, N = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16384
SEQ = 512
torch.backends.cuda.matmul.allow_tf32 = False
tok = Tokenizer.from_file("models/qwen3-tokenizer/tokenizer.json")
EOT = tok.token_to_id("<|endoftext|>")
texts = []
for line in gzip.open("tools/train/data_listing.txt.gz", "rt"):
    split, h, path = line.rstrip("\n").split("\t")
    if split != "heldout":
        continue
    t = open(path, encoding="utf-8").read()
    assert hashlib.sha256(t.encode()).hexdigest() == h, path
    texts.append(t)
ids = []
for e in tok.encode_batch(texts, add_special_tokens=False):
    ids.extend(e.ids)
    ids.append(EOT)
held = torch.tensor(ids, dtype=torch.int32)
held.numpy().astype("<i4").tofile(f"{OUT}/held.i32")

dev = "cuda" if torch.cuda.is_available() else "cpu"
tgt = AutoModelForCausalLM.from_pretrained("models/kapitsa-tiny", dtype=torch.float32).to(dev).eval()
dft = AutoModelForCausalLM.from_pretrained("models/kapitsa-tiny-draft", dtype=torch.float32).to(dev).eval()
res = {"tokens_in_split": len(ids)}
with torch.no_grad():
    x_all = held[: N + 1].long().to(dev)
    total = dtotal = count = match = 0
    s = 0
    while s + SEQ + 1 <= x_all.numel():
        x = x_all[s: s + SEQ + 1][None]
        lt = tgt(x[:, :-1]).logits.float()
        ld = dft(x[:, :-1]).logits.float()
        total += F.cross_entropy(lt[0], x[0, 1:], reduction="sum").item()
        dtotal += F.cross_entropy(ld[0], x[0, 1:], reduction="sum").item()
        match += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        count += SEQ
        s += SEQ
    res.update(tokens=count, heldout_loss=round(total / count, 4), heldout_ppl=round(math.exp(total / count), 2),
               draft_top1_match=round(match / count, 4), draft_heldout_loss=round(dtotal / count, 4),
               draft_heldout_ppl=round(math.exp(dtotal / count), 2))
    step = (len(ids) - 64 - 600) // 200
    acc = 0
    for i in range(200):
        p = 64 + i * step
        ctx = held[p - 64: p].long()[None].to(dev)
        a = tgt.generate(ctx, max_new_tokens=5, min_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 64:]
        b = dft.generate(ctx, max_new_tokens=5, min_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 64:]
        k = 0
        while k < 5 and a[k] == b[k]:
            k += 1
        acc += k
    res["draft_mean_accepted_of_5"] = round(acc / 200, 3)
print(json.dumps(res))
json.dump(res, open(f"{OUT}/torch_eval.json", "w"))
