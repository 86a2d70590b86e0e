"""Writes copies of the hybrid fixtures with malformed configs, for
tests/cli.sh: python3 break_hybrid.py FIXTURES OUT. Standard library only."""
import json, os, shutil, sys

fx, out = sys.argv[1], sys.argv[2]


def variant(src, name, edit):
    d = os.path.join(out, name)
    shutil.copytree(os.path.join(fx, src), d)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    edit(c)
    json.dump(c, open(p, "w"))


variant("qwen3_5", "qwen_pattern_len", lambda c: c["layer_types"].pop())
variant("qwen3_5", "qwen_unknown_type", lambda c: c["layer_types"].__setitem__(1, "sliding_attention"))
variant("qwen3_5", "qwen_v_heads", lambda c: c.update(linear_num_value_heads=3))
variant("qwen3_next", "qwen_kv_heads", lambda c: c.update(num_attention_heads=5))


def nemo_pattern(c):
    c.pop("layers_block_type")
    c.update(hybrid_override_pattern="M-M*-M", num_hidden_layers=7)


variant("nemotron_h", "nemo_pattern_len", nemo_pattern)
variant("nemotron_h", "nemo_unknown_type", lambda c: c["layers_block_type"].__setitem__(2, "conv"))
variant("nemotron_h", "nemo_heads", lambda c: c.update(mamba_num_heads=7))
variant("nemotron_h_moe", "nemo_groups", lambda c: c.update(n_group=3))
variant("nemotron_h", "nemo_list", lambda c: c.update(layers_block_type="M-M*-M-"))


def python_json(c):
    """Not broken: the way Python's json module writes infinity, and the pattern form."""
    c["time_step_limit"] = [0.0, float("inf")]
    c["note"] = 'a "quoted \\" Infinity" string stays'
    c.pop("layers_block_type")
    c.update(hybrid_override_pattern="M-M*-M-", num_hidden_layers=7)


variant("nemotron_h", "nemo_python_json", python_json)


def no_gate(c):
    """Broken: without an output gate q_proj must be half as tall."""
    c["attn_output_gate"] = False


variant("qwen3_5", "qwen_no_gate", no_gate)
