#!/usr/bin/env python3
"""GGUF files of the reference fixtures written by llama.cpp's own converter.

usage: /usr/bin/python3 tools/reference/convert_fixtures.py LLAMA_CPP [OUT]
  LLAMA_CPP: a llama.cpp checkout (convert_hf_to_gguf.py, conversion/, gguf-py/)
  OUT: tests/data/gguf/fixtures by default

Each tests/fixtures/<arch> in ARCHS goes through convert_hf_to_gguf.main()
(`--outtype bf16`, and `--no-mtp` for the Qwen hybrids, whose fixtures have
no MTP block) unchanged but for what the fixtures or Debian's torch 1.13
lack:
  - transformers is not imported: a stand-in module whose AutoConfig fails,
    so the converter reads config.json itself (its own fallback);
  - the vocabulary: the fixtures have no tokenizer files, so set_vocab writes
    vocab_size placeholder tokens as a "gpt2" vocabulary, and bos/eos from
    config.json as llama.cpp's SpecialVocab reads them;
  - torch 1.13 has no float8 dtypes, which the converter names in its dtype
    tables: they stand for uint8 (one byte, as they are; no fixture holds any).
Every tensor and hyperparameter is converted by llama.cpp's code as it is.
Needs torch and numpy (Debian: python3-torch, python3-numpy, python3-tqdm,
python3-yaml).
"""
import sys
import types
from pathlib import Path

# the Qwen hybrids' converter expects an MTP block unless told there is none
NO_MTP = {"qwen3_next", "qwen3_next_mixed", "qwen3_5", "qwen3_5_moe", "qwen3_5_wrapper"}
ARCHS = ["qwen3", "qwen3_moe", "qwen3_next", "qwen3_next_mixed", "qwen3_5", "qwen3_5_moe", "qwen3_5_wrapper",
         "nemotron_h", "nemotron_h_moe", "nemotron_h_groups"]


def stub_transformers():
    """A transformers module whose AutoConfig fails: load_hparams then reads config.json."""
    class AutoConfig:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise OSError("transformers is not installed here")

    mod = types.ModuleType("transformers")
    mod.AutoConfig = AutoConfig
    sys.modules["transformers"] = mod


def old_torch():
    """The float8 dtypes of the converter's dtype tables, as uint8 (torch 1.13 has none)."""
    import torch
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if not hasattr(torch, name):
            setattr(torch, name, torch.uint8)


def placeholder_vocab(self):
    import gguf
    n = self.find_hparam(["vocab_size"])
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("default")
    self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
    self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
    gguf.SpecialVocab(self.dir_model, load_merges=False, n_vocab=n).add_to_gguf(self.gguf_writer)


def main():
    llama = Path(sys.argv[1]).resolve()
    repo = Path(__file__).resolve().parents[2]
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else repo / "tests/data/gguf/fixtures"
    out.mkdir(parents=True, exist_ok=True)
    stub_transformers()
    old_torch()
    sys.path.insert(0, str(llama))
    sys.path.insert(1, str(llama / "gguf-py"))
    import convert_hf_to_gguf as conv

    get_class = conv.get_model_class

    def with_placeholder_vocab(*args, **kwargs):
        cls = get_class(*args, **kwargs)
        return type(cls.__name__, (cls,), {"model_arch": cls.model_arch, "set_vocab": placeholder_vocab})

    conv.get_model_class = with_placeholder_vocab
    failed = []
    for arch in ARCHS:
        dst = out / f"{arch}.gguf"
        sys.argv = ["convert_hf_to_gguf.py", str(repo / "tests/fixtures" / arch), "--outtype", "bf16",
                    "--outfile", str(dst)] + (["--no-mtp"] if arch in NO_MTP else [])
        try:
            conv.main()
        except Exception as e:  # a fixture llama.cpp cannot convert: say which and why, go on
            dst.unlink(missing_ok=True)
            failed.append(f"{arch}: {type(e).__name__}: {e}")
            continue
        print(f"{dst}: {dst.stat().st_size} bytes")
    for f in failed:
        print(f"not converted: {f}")


if __name__ == "__main__":
    main()
