"""A large tokenizer golden set and the reference's encoding speed, made on the GPU
machine with Hugging Face tokenizers:

  python3 tokenizer_corpus.py TOKENIZER_DIR OUT.jsonl [TARGET_BYTES]

Documents (at most 8 KiB each, about TARGET_BYTES in all, default 1.5 MB), chosen
with a fixed seed from what that machine has: Python sources, C headers, reST and
text docs, plus generated text in many scripts, emoji sequences, control
characters, long whitespace runs and CRLF. Each line of OUT is
{"text", "ids", "decoded"}. Prints the reference's single-thread encode speed
over the same documents (one Tokenizer.encode per document, no batching).
"""
import glob, json, os, random, sys, time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
from tokenizers import Tokenizer

tok_dir, out = sys.argv[1], sys.argv[2]
target = int(sys.argv[3]) if len(sys.argv) > 3 else 1_500_000
rng = random.Random(20261130)


def files(patterns):
    got = []
    for p in patterns:
        got += glob.glob(p, recursive=True)
    got = sorted(set(f for f in got if os.path.isfile(f) and os.path.getsize(f) > 200))
    rng.shuffle(got)
    return got


def chunk(text):
    if len(text) <= 8192:
        return text
    s = rng.randrange(0, len(text) - 8192)
    return text[s:s + 8192]


SCRIPTS = [(0x0041, 0x007a), (0x00c0, 0x024f), (0x0370, 0x03ff), (0x0400, 0x04ff), (0x0590, 0x05ff),
           (0x0600, 0x06ff), (0x0900, 0x097f), (0x0e00, 0x0e7f), (0x3040, 0x30ff), (0x4e00, 0x9fff),
           (0xac00, 0xd7a3), (0x1f300, 0x1faff), (0x0300, 0x036f), (0x2000, 0x206f), (0x2190, 0x22ff)]
EMOJI = ["👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🧑🏿‍💻", "😀", "🚀", "🔥", "✅"]


def generated():
    parts = []
    for _ in range(rng.randrange(20, 200)):
        k = rng.random()
        if k < 0.55:
            lo, hi = rng.choice(SCRIPTS)
            parts.append("".join(chr(rng.randrange(lo, hi + 1)) for _ in range(rng.randrange(1, 12))))
        elif k < 0.65:
            parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 4))))
        elif k < 0.75:
            parts.append(rng.choice([" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009"]) * rng.randrange(1, 40))
        elif k < 0.8:
            parts.append("".join(chr(rng.randrange(0, 32)) for _ in range(rng.randrange(1, 5))))
        elif k < 0.9:
            parts.append(str(rng.randrange(0, 10 ** rng.randrange(1, 15))))
        else:
            parts.append(rng.choice(["'s", "'LL", "'ve", "n't", "I'M", "<|im_start|>", "<think>", "</tool_call>",
                                     "<|endoftext|>", "e\u0301", "\ufeff", "\u200b", "\U0010fffd"]))
        parts.append(rng.choice(["", " ", " ", "\n"]))
    return "".join(parts)


sources = [files(["/usr/lib/python3*/**/*.py", "/opt/**/site-packages/**/*.py"]),
           files(["/usr/include/**/*.h", "/usr/local/cuda*/include/**/*.h", "/opt/**/*.cu*"]),
           files(["/usr/share/doc/**/*.txt", "/opt/**/site-packages/**/*.rst", "/opt/**/site-packages/**/*.md",
                  "/usr/share/doc/**/README*"])]
docs, total = [], 0
while total < target:
    k = rng.random()
    text = None
    if k < 0.25:
        text = generated()
    else:
        src = sources[0 if k < 0.6 else 1 if k < 0.8 else 2]
        if src:
            try:
                text = chunk(open(src.pop(), encoding="utf-8").read())
            except (UnicodeDecodeError, OSError):
                text = None
    if text:
        docs.append(text)
        total += len(text.encode())

tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
for d in docs[:20]:
    tok.encode(d, add_special_tokens=False)
best = None
for _ in range(3):
    t0 = time.perf_counter()
    encs = [tok.encode(d, add_special_tokens=False) for d in docs]
    dt = time.perf_counter() - t0
    best = dt if best is None else min(best, dt)
n_ids = sum(len(e.ids) for e in encs)
with open(out, "w") as f:
    for d, e in zip(docs, encs):
        f.write(json.dumps({"text": d, "ids": e.ids, "decoded": tok.decode(e.ids, skip_special_tokens=False)},
                           ensure_ascii=False) + "\n")
print(json.dumps({"docs": len(docs), "bytes": total, "ids": n_ids, "hf_encode_s": round(best, 4),
                  "hf_MB_s": round(total / best / 1e6, 3)}))
