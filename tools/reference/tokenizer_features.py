"""Small tokenizer.json files exercising what the Qwen3 tokenizer does not: Split
behaviors (removed, merged_with_previous, merged_with_next, contiguous, invert),
Digits, ByteLevel with its own regex and add_prefix_space, merges written as
"a b" strings, and added tokens with lstrip / rstrip / single_word. Each is
trained with Hugging Face tokenizers on this machine's Python sources and
encodes a fixed set of texts; made on the GPU machine:

  python3 tokenizer_features.py OUTDIR      -> OUTDIR/<name>/tokenizer.json, OUTDIR/features.json
"""
import glob, json, os, sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
files = sorted(glob.glob("/usr/lib/python3*/*.py"))[:60]
lines = [l for f in files for l in open(f, encoding="utf-8", errors="ignore").read().splitlines()][:20000]
lines += ["Ünïcödé café 数字123 😀👍🏽", "x=1_000_000; y = 3.14159e-10", "tabs\tand\r\nCRLF"] * 50

TEXTS = ["Hello world 12345 and 6789!", "  leading and   inner   spaces  ", "def f(x):\n\treturn x+42\n",
         "a<sep>b <sep> c<sep>  d", "[W] x[W]y [W]z word[W]", "<s>start</s> 3.14 and 2025-11-30",
         "Ünïcödé café 数字123 😀👍🏽", "mixed\r\n\r\nnewlines\n\n", "", "1", "   ", "x" * 300]

SPLIT = pre_tokenizers.Split
VARIANTS = {
    "split_removed": [SPLIT(Regex(r"\s+"), behavior="removed"), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "split_prev": [SPLIT(Regex(r"\s+"), behavior="merged_with_previous"), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "split_next": [SPLIT(Regex(r"\s+"), behavior="merged_with_next"), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "split_contiguous": [SPLIT(Regex(r"[0-9]"), behavior="contiguous"), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "split_invert": [SPLIT(Regex(r"\w+"), behavior="isolated", invert=True), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "split_string": [SPLIT(" ", behavior="isolated"), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "digits_each": [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "digits_runs": [pre_tokenizers.Digits(individual_digits=False), pre_tokenizers.ByteLevel(False, use_regex=False)],
    "bytelevel_regex": [pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)],
}

goldens = []
for name, pres in VARIANTS.items():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(pres)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tok.add_tokens([AddedToken("<sep>", lstrip=True, rstrip=True), AddedToken("[W]", single_word=True)])
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    if name.startswith("split_"):  # the older merges form: "a b" strings
        j = json.load(open(path))
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        json.dump(j, open(path, "w"), ensure_ascii=False)
        tok = Tokenizer.from_file(path)
    for t in TEXTS:
        ids = tok.encode(t, add_special_tokens=False).ids
        goldens.append({"tokenizer": name, "text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
json.dump(goldens, open(os.path.join(out, "features.json"), "w"), ensure_ascii=False, indent=1)
print(len(goldens), "cases")
