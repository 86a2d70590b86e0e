"""Writes broken copies of a checkpoint folder, one per kind of damage, for
tests/cli.sh: python3 break_checkpoint.py SRC OUT. Standard library only."""
import json, os, shutil, struct, sys

src, out = sys.argv[1], sys.argv[2]


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()


def write_st(path, hdr, data):
    h = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def variant(name, edit_cfg=None, edit_st=None, truncate=None, remove=None):
    d = os.path.join(out, name)
    shutil.copytree(src, d)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    if edit_cfg:
        p = os.path.join(d, "config.json")
        text = edit_cfg(open(p).read())
        open(p, "w").write(text)
    st = os.path.join(d, "model.safetensors")
    if edit_st:
        hdr, data = read_st(st)
        edit_st(hdr)
        write_st(st, hdr, data)
    if truncate:
        os.truncate(st, truncate)
    if remove:
        os.remove(os.path.join(d, remove))


def cfg_json(fn):
    def edit(text):
        c = json.loads(text)
        fn(c)
        return json.dumps(c)
    return edit


Q = "model.layers.0.self_attn.q_proj.weight"
variant("truncated", truncate=100000)
variant("past_end", edit_st=lambda h: h[Q]["data_offsets"].__setitem__(1, 10**9))
variant("overlap", edit_st=lambda h: h["model.norm.weight"].__setitem__("data_offsets", [
    h[Q]["data_offsets"][0] + 2, h[Q]["data_offsets"][0] + 2 + 128]))
variant("missing_tensor", edit_st=lambda h: h.pop("model.layers.1.mlp.up_proj.weight"))
variant("wrong_shape", edit_st=lambda h: h[Q].__setitem__("shape", [64, 128]))
variant("unknown_dtype", edit_st=lambda h: h[Q].__setitem__("dtype", "F8_E5M2"))
variant("int_weights", edit_st=lambda h: h["model.norm.weight"].update(
    dtype="I32", shape=[32]))
variant("no_hidden_size", edit_cfg=cfg_json(lambda c: c.pop("hidden_size")))
variant("bad_json", edit_cfg=lambda t: t[: len(t) // 2])
variant("llama", edit_cfg=cfg_json(lambda c: c.update(model_type="llama")))
variant("heads_string", edit_cfg=cfg_json(lambda c: c.update(num_attention_heads="4")))
variant("no_config", remove="config.json")
variant("no_weights", remove="model.safetensors")
