/* gguf_hf: GGUF metadata and tensors under transformers' names (see gguf_hf.h).
 * The names, keys and transforms are those of llama.cpp's convert_hf_to_gguf.py
 * (conversion/qwen.py, nemotron.py, mamba.py, granite.py). */
#define _GNU_SOURCE
#include "gguf_hf.h"

#include "../base/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum family { FAM_QWEN3, FAM_HYBRID, FAM_NEMOTRON };

static const struct {
    const char *gguf;
    enum family fam;
    bool v_tiled; /* DeltaNet value heads stored in llama.cpp's tiled order (_LinearAttentionVReorderBase) */
} archs[] = {
    {"qwen3", FAM_QWEN3, false},         {"qwen3moe", FAM_QWEN3, false},     {"qwen3next", FAM_HYBRID, false},
    {"qwen35", FAM_HYBRID, true},        {"qwen35moe", FAM_HYBRID, true},    {"nemotron_h", FAM_NEMOTRON, false},
    {"nemotron_h_moe", FAM_NEMOTRON, false},
};
#define ARCH_LIST "qwen3, qwen3moe, qwen3next, qwen35, qwen35moe, nemotron_h, nemotron_h_moe"

/* What the converter did to a tensor besides renaming it and reversing its
 * shape, undone here: a view where the bytes are transformers' own in their
 * order; an owned copy where llama.cpp moved them (rows split or reordered),
 * or changed their values (then F32, the type the converter stored them in). */
enum xform {
    X_VIEW,
    X_VEC,      /* a vector stored as [n][1] (Mamba2's D) or [groups][n/groups] (its norm): a view as [n] */
    X_ROW,      /* a [1][n] matrix stored as a vector or [1][n] (the shared expert's gate) */
    X_CONV,     /* a depthwise conv weight [channels][1][width] stored squeezed to [channels][width] */
    X_PLUS_ONE, /* an RMSNorm weight w stored as 1 + w (Qwen3-Next, Qwen3.5): a copy v with 1 + v the stored value */
    X_NEG_EXP,  /* A_log stored as A = -exp(A_log): a copy log(-A) */
    X_EXPERTS,  /* a MoE layer's experts stacked into one 3-D tensor: a view of each slice */
    X_BA,       /* Qwen3-Next's in_proj_ba, [b | a] per key head: copied out as in_proj_b and in_proj_a */
    X_UNPAIR,   /* q/k rows of each head in llama.cpp's rotary pair order (LlamaModel.permute, which the
                   Nemotron-H converter applies though the model has no rope): rows copied back */
};

/* Where a tensor indexes DeltaNet value heads, which Qwen3.5's converter
 * reorders from grouped by key head (transformers': head g*r + i, r value heads
 * a key head) to tiled (position i*Hk + g); put back by copying. */
enum vorder {
    V_NONE,
    V_QKV,  /* rows after q and k (2*Hk*dk of them), dv a head: in_proj_qkv, the conv weight */
    V_ROWS, /* rows, dv a head: in_proj_z */
    V_HEAD, /* rows (elements of a vector), one a head: in_proj_a/b, A_log, dt_bias */
    V_COLS, /* columns, dv a head: out_proj */
};

struct tmap {
    const char *gguf, *hf; /* after "blk.N." and "PREFIXlayers.N."; hf a format of the expert's number
                              (X_EXPERTS) or of "b" and "a" (X_BA) */
    enum xform x;
    enum vorder v;
};

static const struct tmap qwen3_layer[] = {
    {"attn_norm.weight", "input_layernorm.weight", X_VIEW, V_NONE},
    {"attn_q.weight", "self_attn.q_proj.weight", X_VIEW, V_NONE},
    {"attn_k.weight", "self_attn.k_proj.weight", X_VIEW, V_NONE},
    {"attn_v.weight", "self_attn.v_proj.weight", X_VIEW, V_NONE},
    {"attn_output.weight", "self_attn.o_proj.weight", X_VIEW, V_NONE},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", X_VIEW, V_NONE},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", X_VIEW, V_NONE},
    {"ffn_norm.weight", "post_attention_layernorm.weight", X_VIEW, V_NONE},
    {"ffn_gate.weight", "mlp.gate_proj.weight", X_VIEW, V_NONE},
    {"ffn_up.weight", "mlp.up_proj.weight", X_VIEW, V_NONE},
    {"ffn_down.weight", "mlp.down_proj.weight", X_VIEW, V_NONE},
    {"ffn_gate_inp.weight", "mlp.gate.weight", X_VIEW, V_NONE},
    {"ffn_gate_exps.weight", "mlp.experts.%lld.gate_proj.weight", X_EXPERTS, V_NONE},
    {"ffn_up_exps.weight", "mlp.experts.%lld.up_proj.weight", X_EXPERTS, V_NONE},
    {"ffn_down_exps.weight", "mlp.experts.%lld.down_proj.weight", X_EXPERTS, V_NONE},
};

/* Qwen3-Next and Qwen3.5: every RMSNorm but the DeltaNet's gated one is stored as 1 + w. */
static const struct tmap hybrid_layer[] = {
    {"attn_norm.weight", "input_layernorm.weight", X_PLUS_ONE, V_NONE},
    {"post_attention_norm.weight", "post_attention_layernorm.weight", X_PLUS_ONE, V_NONE},
    {"attn_q.weight", "self_attn.q_proj.weight", X_VIEW, V_NONE},
    {"attn_k.weight", "self_attn.k_proj.weight", X_VIEW, V_NONE},
    {"attn_v.weight", "self_attn.v_proj.weight", X_VIEW, V_NONE},
    {"attn_output.weight", "self_attn.o_proj.weight", X_VIEW, V_NONE},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", X_PLUS_ONE, V_NONE},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", X_PLUS_ONE, V_NONE},
    {"attn_qkv.weight", "linear_attn.in_proj_qkv.weight", X_VIEW, V_QKV},
    {"attn_gate.weight", "linear_attn.in_proj_z.weight", X_VIEW, V_ROWS},
    {"ssm_beta.weight", "linear_attn.in_proj_b.weight", X_VIEW, V_HEAD},
    {"ssm_alpha.weight", "linear_attn.in_proj_a.weight", X_VIEW, V_HEAD},
    {"ssm_ba.weight", "linear_attn.in_proj_%s.weight", X_BA, V_NONE},
    {"ssm_a", "linear_attn.A_log", X_NEG_EXP, V_HEAD},
    {"ssm_dt.bias", "linear_attn.dt_bias", X_VIEW, V_HEAD},
    {"ssm_conv1d.weight", "linear_attn.conv1d.weight", X_CONV, V_QKV},
    {"ssm_norm.weight", "linear_attn.norm.weight", X_VIEW, V_NONE},
    {"ssm_out.weight", "linear_attn.out_proj.weight", X_VIEW, V_COLS},
    {"ffn_gate.weight", "mlp.gate_proj.weight", X_VIEW, V_NONE},
    {"ffn_up.weight", "mlp.up_proj.weight", X_VIEW, V_NONE},
    {"ffn_down.weight", "mlp.down_proj.weight", X_VIEW, V_NONE},
    {"ffn_gate_inp.weight", "mlp.gate.weight", X_VIEW, V_NONE},
    {"ffn_gate_exps.weight", "mlp.experts.%lld.gate_proj.weight", X_EXPERTS, V_NONE},
    {"ffn_up_exps.weight", "mlp.experts.%lld.up_proj.weight", X_EXPERTS, V_NONE},
    {"ffn_down_exps.weight", "mlp.experts.%lld.down_proj.weight", X_EXPERTS, V_NONE},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", X_VIEW, V_NONE},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", X_VIEW, V_NONE},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", X_VIEW, V_NONE},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", X_ROW, V_NONE},
};

static const struct tmap nemotron_layer[] = {
    {"attn_norm.weight", "norm.weight", X_VIEW, V_NONE},
    {"ssm_in.weight", "mixer.in_proj.weight", X_VIEW, V_NONE},
    {"ssm_conv1d.weight", "mixer.conv1d.weight", X_CONV, V_NONE},
    {"ssm_conv1d.bias", "mixer.conv1d.bias", X_VIEW, V_NONE},
    {"ssm_a", "mixer.A_log", X_NEG_EXP, V_NONE},
    {"ssm_d", "mixer.D", X_VEC, V_NONE},
    {"ssm_dt.bias", "mixer.dt_bias", X_VIEW, V_NONE},
    {"ssm_norm.weight", "mixer.norm.weight", X_VEC, V_NONE},
    {"ssm_out.weight", "mixer.out_proj.weight", X_VIEW, V_NONE},
    {"attn_q.weight", "mixer.q_proj.weight", X_UNPAIR, V_NONE},
    {"attn_k.weight", "mixer.k_proj.weight", X_UNPAIR, V_NONE},
    {"attn_v.weight", "mixer.v_proj.weight", X_VIEW, V_NONE},
    {"attn_output.weight", "mixer.o_proj.weight", X_VIEW, V_NONE},
    {"ffn_up.weight", "mixer.up_proj.weight", X_VIEW, V_NONE},
    {"ffn_down.weight", "mixer.down_proj.weight", X_VIEW, V_NONE},
    {"ffn_gate_inp.weight", "mixer.gate.weight", X_VIEW, V_NONE},
    {"exp_probs_b.bias", "mixer.gate.e_score_correction_bias", X_VIEW, V_NONE},
    {"ffn_up_exps.weight", "mixer.experts.%lld.up_proj.weight", X_EXPERTS, V_NONE},
    {"ffn_down_exps.weight", "mixer.experts.%lld.down_proj.weight", X_EXPERTS, V_NONE},
    {"ffn_up_shexp.weight", "mixer.shared_experts.up_proj.weight", X_VIEW, V_NONE},
    {"ffn_down_shexp.weight", "mixer.shared_experts.down_proj.weight", X_VIEW, V_NONE},
};

/* Whole-model tensors; hf after the config's prefix ("model.", "backbone.") unless lm_head. */
static const struct {
    const char *gguf, *hf[3]; /* [enum family] */
    enum xform x[3];
} global_names[] = {
    {"token_embd.weight",
     {"embed_tokens.weight", "embed_tokens.weight", "embeddings.weight"},
     {X_VIEW, X_VIEW, X_VIEW}},
    {"output_norm.weight", {"norm.weight", "norm.weight", "norm_f.weight"}, {X_VIEW, X_PLUS_ONE, X_VIEW}},
    {"output.weight", {"lm_head.weight", "lm_head.weight", "lm_head.weight"}, {X_VIEW, X_VIEW, X_VIEW}},
};

static const struct {
    const struct tmap *map;
    size_t n;
} layer_maps[] = {{qwen3_layer, sizeof qwen3_layer / sizeof qwen3_layer[0]},
                  {hybrid_layer, sizeof hybrid_layer / sizeof hybrid_layer[0]},
                  {nemotron_layer, sizeof nemotron_layer / sizeof nemotron_layer[0]}};

bool gguf_hf_is_gguf(const char *path)
{
    FILE *f = fopen(path, "rb");
    char magic[4];
    bool yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    if (f)
        fclose(f);
    return yes;
}

static const char *gguf_path(const struct gguf *g) { return g->n_files ? g->files[0].path : "?"; }

/* The architecture's index in archs, its name in arch; -1 with err_set(). */
static int gguf_hf_arch(const struct gguf *g, char *arch, size_t cap)
{
    const char *p;
    size_t n;
    if (gguf_get_str(g, "general.architecture", &p, &n) != 0)
        return err_set("gguf: %s: no general.architecture string", gguf_path(g));
    snprintf(arch, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(arch, archs[i].gguf) == 0)
            return (int)i;
    return err_set("gguf: %s: architecture '%s' is not supported (" ARCH_LIST ")", gguf_path(g), arch);
}

/* key "ARCH.name": 0 with *v set, 1 when absent, -1 with err_set() */
static int get_int(const struct gguf *g, const char *arch, const char *name, int64_t *v)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    return gguf_get_i64(g, key, v);
}

/* key "ARCH.name" into obj[field] as an integer; required: absent is an error */
static int put_int(json_t *obj, const struct gguf *g, const char *arch, const char *name, const char *field,
                   bool required)
{
    int64_t v;
    int rc = get_int(g, arch, name, &v);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return required ? err_set("gguf: %s: missing key '%s.%s'", gguf_path(g), arch, name) : 0;
    json_object_set_new(obj, field, json_integer(v));
    return 0;
}

/* key "ARCH.name" (name alone when arch is "") into obj[field] as a number, when present */
static int put_num(json_t *obj, const struct gguf *g, const char *arch, const char *name, const char *field)
{
    char key[160];
    float v;
    snprintf(key, sizeof key, "%s%s%s", arch, *arch ? "." : "", name);
    int rc = gguf_get_f32(g, key, &v);
    if (rc == 0)
        json_object_set_new(obj, field, json_real(v));
    return rc < 0 ? -1 : 0;
}

static bool has_tensor(const struct gguf *g, int64_t layer, const char *name)
{
    char full[160];
    snprintf(full, sizeof full, "blk.%lld.%s", (long long)layer, name);
    return gguf_find(g, full) != NULL;
}

static int64_t obj_int(json_t *c, const char *field) { return json_integer_value(json_object_get(c, field)); }

/* Keys every family shares: sizes, norm epsilon, rope, vocabulary, tied head
 * (not the MLP width: Nemotron-H's feed_forward_length is a per-layer array). */
static int put_common(json_t *c, const struct gguf *g, const char *arch)
{
    const struct gguf_kv *toks;
    const struct gguf_tensor *emb = gguf_find(g, "token_embd.weight");
    if (put_int(c, g, arch, "vocab_size", "vocab_size", false) != 0)
        return -1;
    if (!json_object_get(c, "vocab_size")) {
        if (emb && emb->n_dim == 2)
            json_object_set_new(c, "vocab_size", json_integer(emb->ne[1]));
        else if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &toks) == 0)
            json_object_set_new(c, "vocab_size", json_integer((json_int_t)toks->n));
    }
    int64_t blocks, mtp = 0;
    int rc = get_int(g, arch, "block_count", &blocks);
    if (rc == 0)
        rc = get_int(g, arch, "nextn_predict_layers", &mtp) < 0 ? -1 : 0;
    if (rc != 0)
        return rc < 0 ? -1 : err_set("gguf: %s: missing key '%s.block_count'", gguf_path(g), arch);
    /* the MTP blocks counted in block_count are no decoder layers (transformers drops mtp.*) */
    json_object_set_new(c, "num_hidden_layers", json_integer(blocks - mtp));
    if (put_int(c, g, arch, "embedding_length", "hidden_size", true) != 0 ||
        put_int(c, g, arch, "attention.head_count", "num_attention_heads", true) != 0 ||
        put_int(c, g, arch, "attention.key_length", "head_dim", false) != 0 ||
        put_int(c, g, arch, "context_length", "max_position_embeddings", false) != 0 ||
        put_num(c, g, arch, "attention.layer_norm_rms_epsilon", "rms_norm_eps") != 0 ||
        put_num(c, g, arch, "rope.freq_base", "rope_theta") != 0)
        return -1;
    char key[160];
    const char *st;
    size_t sn;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_get_str(g, key, &st, &sn) == 0 && !(sn == 4 && memcmp(st, "none", 4) == 0)) {
        json_t *rs = json_object();
        json_object_set_new(rs, "rope_type", json_stringn(st, sn));
        json_object_set_new(c, "rope_scaling", rs);
        if (put_num(rs, g, arch, "rope.scaling.factor", "factor") != 0 ||
            put_int(rs, g, arch, "rope.scaling.original_context_length", "original_max_position_embeddings",
                    false) != 0)
            return -1;
    }
    json_object_set_new(c, "tie_word_embeddings", json_boolean(gguf_find(g, "output.weight") == NULL));
    return 0;
}

/* The Qwen MoE fields (qwen3moe, qwen3next, qwen35moe): llama.cpp writes no
 * norm_topk_prob and always renormalises the picks' weights; layers without a
 * router are dense (transformers' mlp_only_layers). */
static int put_qwen_moe(json_t *c, const struct gguf *g, const char *arch)
{
    bool norm = true;
    char key[160];
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    if (gguf_get_bool(g, key, &norm) < 0 || put_int(c, g, arch, "expert_count", "num_experts", true) != 0 ||
        put_int(c, g, arch, "expert_used_count", "num_experts_per_tok", true) != 0 ||
        put_int(c, g, arch, "expert_feed_forward_length", "moe_intermediate_size", true) != 0 ||
        put_int(c, g, arch, "expert_shared_feed_forward_length", "shared_expert_intermediate_size", false) != 0)
        return -1;
    json_object_set_new(c, "norm_topk_prob", json_boolean(norm));
    json_t *dense = json_array();
    for (int64_t l = 0; l < obj_int(c, "num_hidden_layers"); l++)
        if (!has_tensor(g, l, "ffn_gate_inp.weight"))
            json_array_append_new(dense, json_integer(l));
    json_object_set_new(c, "mlp_only_layers", dense);
    if (!json_object_get(c, "intermediate_size"))
        json_object_set(c, "intermediate_size", json_object_get(c, "moe_intermediate_size"));
    return 0;
}

/* Qwen3-Next / Qwen3.5: the DeltaNet sizes from the ssm.* keys, the layer kinds
 * from attention.recurrent_layers (else full_attention_interval), the rotary
 * share from rope.dimension_count. */
static int put_hybrid(json_t *c, const struct gguf *g, const char *arch)
{
    int64_t nv, inner, rope_dim;
    if (put_int(c, g, arch, "ssm.group_count", "linear_num_key_heads", true) != 0 ||
        put_int(c, g, arch, "ssm.state_size", "linear_key_head_dim", true) != 0 ||
        put_int(c, g, arch, "ssm.conv_kernel", "linear_conv_kernel_dim", true) != 0 ||
        put_int(c, g, arch, "full_attention_interval", "full_attention_interval", false) != 0 ||
        put_int(c, g, arch, "ssm.time_step_rank", "linear_num_value_heads", true) != 0)
        return -1;
    int rc = get_int(g, arch, "ssm.inner_size", &inner);
    if (rc == 0)
        rc = get_int(g, arch, "rope.dimension_count", &rope_dim);
    if (rc != 0)
        return rc < 0 ? -1 : err_set("gguf: %s: missing key '%s.ssm.inner_size' or '%s.rope.dimension_count'",
                                     gguf_path(g), arch, arch);
    nv = obj_int(c, "linear_num_value_heads");
    if (nv <= 0 || inner % nv != 0)
        return err_set("gguf: %s: key '%s.ssm.inner_size' (%lld) is not a multiple of '%s.ssm.time_step_rank' (%lld)",
                       gguf_path(g), arch, (long long)inner, arch, (long long)nv);
    json_object_set_new(c, "linear_value_head_dim", json_integer(inner / nv));
    const int64_t hd = json_object_get(c, "head_dim") ? obj_int(c, "head_dim")
                                                      : obj_int(c, "hidden_size") / obj_int(c, "num_attention_heads");
    /* config_parse takes (int)(head_dim * factor) rotary dims: a factor that lands on them */
    double partial = hd > 0 ? (double)rope_dim / (double)hd : 0;
    if ((int64_t)((double)hd * partial) != rope_dim)
        partial = nextafter(partial, 2.0);
    json_object_set_new(c, "partial_rotary_factor", json_real(partial));
    const struct gguf_kv *rec;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", arch);
    if ((rc = gguf_get_arr(g, key, GGUF_BOOL, &rec)) < 0)
        return -1;
    if (rc == 0) {
        json_t *types = json_array();
        for (int64_t l = 0; l < obj_int(c, "num_hidden_layers") && l < (int64_t)rec->n; l++)
            json_array_append_new(types, json_string(((const uint8_t *)rec->arr)[l] ? "linear_attention"
                                                                                      : "full_attention"));
        json_object_set_new(c, "layer_types", types);
    }
    return 0;
}

/* Nemotron-H: a layer is the one block its tensors show (llama.cpp's keys name
 * the pattern only through per-layer arrays, and label a dense model saved by
 * transformers 5 nemotron_h_moe, all its MLPs 0 wide); the Mamba2 sizes from
 * the ssm.* keys, the MoE fields from expert_*. */
static int put_nemotron(json_t *c, const struct gguf *g, const char *arch)
{
    if (put_int(c, g, arch, "ssm.time_step_rank", "mamba_num_heads", true) != 0 ||
        put_int(c, g, arch, "ssm.group_count", "n_groups", true) != 0 ||
        put_int(c, g, arch, "ssm.state_size", "ssm_state_size", true) != 0 ||
        put_int(c, g, arch, "ssm.conv_kernel", "conv_kernel", true) != 0 ||
        put_num(c, g, arch, "attention.layer_norm_epsilon", "layer_norm_epsilon") != 0)
        return -1;
    /* transformers' NemotronH normalises with layer_norm_epsilon; a file without it has only the rms key */
    if (!json_object_get(c, "layer_norm_epsilon") && json_object_get(c, "rms_norm_eps"))
        json_object_set(c, "layer_norm_epsilon", json_object_get(c, "rms_norm_eps"));
    int64_t inner;
    const int64_t nh = obj_int(c, "mamba_num_heads"), n_layer = obj_int(c, "num_hidden_layers");
    int rc = get_int(g, arch, "ssm.inner_size", &inner);
    if (rc != 0)
        return rc < 0 ? -1 : err_set("gguf: %s: missing key '%s.ssm.inner_size'", gguf_path(g), arch);
    if (nh <= 0 || inner % nh != 0)
        return err_set("gguf: %s: key '%s.ssm.inner_size' (%lld) is not a multiple of '%s.ssm.time_step_rank' (%lld)",
                       gguf_path(g), arch, (long long)inner, arch, (long long)nh);
    json_object_set_new(c, "mamba_head_dim", json_integer(inner / nh));
    json_t *types = json_array();
    json_object_set_new(c, "layers_block_type", types);
    bool moe = false, conv_bias = false;
    for (int64_t l = 0; l < n_layer; l++) {
        const char *t = has_tensor(g, l, "ssm_in.weight")          ? "mamba"
                        : has_tensor(g, l, "attn_q.weight")        ? "attention"
                        : has_tensor(g, l, "ffn_up_exps.weight")   ? "moe"
                        : has_tensor(g, l, "ffn_up.weight")        ? "mlp"
                                                                   : NULL;
        if (!t)
            return err_set("gguf: %s: block %lld has none of ssm_in, attn_q, ffn_up, ffn_up_exps", gguf_path(g),
                           (long long)l);
        json_array_append_new(types, json_string(t));
        moe |= strcmp(t, "moe") == 0;
        conv_bias |= has_tensor(g, l, "ssm_conv1d.bias");
        char name[64];
        snprintf(name, sizeof name, "blk.%lld.attn_k.weight", (long long)l);
        const struct gguf_tensor *k = gguf_find(g, name);
        const int64_t hd = obj_int(c, "head_dim");
        if (k && k->n_dim == 2 && hd > 0)
            json_object_set_new(c, "num_key_value_heads", json_integer(k->ne[1] / hd));
        snprintf(name, sizeof name, "blk.%lld.ffn_up.weight", (long long)l);
        const struct gguf_tensor *up = gguf_find(g, name);
        if (up && up->n_dim == 2)
            json_object_set_new(c, "intermediate_size", json_integer(up->ne[1]));
    }
    json_object_set_new(c, "use_conv_bias", json_boolean(conv_bias));
    if (moe) {
        int64_t groups = 1, used;
        if ((rc = get_int(g, arch, "expert_group_count", &groups)) < 0 ||
            (rc = get_int(g, arch, "expert_group_used_count", &used)) < 0)
            return -1;
        if (groups > 1 && rc > 0)
            return err_set("gguf: %s: key '%s.expert_group_count' is %lld but '%s.expert_group_used_count' is missing",
                           gguf_path(g), arch, (long long)groups, arch);
        if (put_int(c, g, arch, "expert_count", "n_routed_experts", true) != 0 ||
            put_int(c, g, arch, "expert_used_count", "num_experts_per_tok", true) != 0 ||
            put_int(c, g, arch, "expert_feed_forward_length", "moe_intermediate_size", true) != 0 ||
            put_int(c, g, arch, "expert_shared_count", "n_shared_experts", false) != 0 ||
            put_int(c, g, arch, "expert_shared_feed_forward_length", "moe_shared_expert_intermediate_size",
                    false) != 0 ||
            put_int(c, g, arch, "expert_group_count", "n_group", false) != 0 ||
            put_int(c, g, arch, "expert_group_used_count", "topk_group", false) != 0 ||
            put_num(c, g, arch, "expert_weights_scale", "routed_scaling_factor") != 0)
            return -1;
        bool norm = true;
        char key[160];
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        if (gguf_get_bool(g, key, &norm) < 0)
            return -1;
        json_object_set_new(c, "norm_topk_prob", json_boolean(norm));
    }
    /* a model without MLP layers: the field is required but unused */
    if (!json_object_get(c, "intermediate_size"))
        json_object_set(c, "intermediate_size", json_object_get(c, "hidden_size"));
    return 0;
}

json_t *gguf_hf_config(const struct gguf *g)
{
    /* model_type by family and MoE: Qwen3-Next's converter splits in_proj_qkvz
     * into qkv and z, Qwen3.5's layout, so every hybrid file is read as a
     * Qwen3.5 text model */
    static const char *const types[3][2] = {
        {"qwen3", "qwen3_moe"}, {"qwen3_5_text", "qwen3_5_moe_text"}, {"nemotron_h", "nemotron_h"}};
    char arch[64];
    const int a = gguf_hf_arch(g, arch, sizeof arch);
    if (a < 0)
        return NULL;
    const enum family fam = archs[a].fam;
    int64_t n_expert;
    const int has_experts = get_int(g, arch, "expert_count", &n_expert);
    const bool moe = fam == FAM_QWEN3 ? strcmp(arch, "qwen3moe") == 0 : has_experts == 0;
    json_t *c = json_object();
    json_object_set_new(c, "model_type", json_string(types[fam][moe]));
    int rc = has_experts < 0 || put_common(c, g, arch) != 0 ? -1 : 0;
    if (rc == 0 && fam != FAM_NEMOTRON)
        rc = put_int(c, g, arch, "feed_forward_length", "intermediate_size", !moe) != 0 ||
                     put_int(c, g, arch, "attention.head_count_kv", "num_key_value_heads", false) != 0 ||
                     (fam == FAM_HYBRID && put_hybrid(c, g, arch) != 0) || (moe && put_qwen_moe(c, g, arch) != 0)
                 ? -1
                 : 0;
    if (rc == 0 && fam == FAM_NEMOTRON)
        rc = put_nemotron(c, g, arch);
    if (rc != 0) {
        json_decref(c);
        return NULL;
    }
    return c;
}

json_t *gguf_hf_generation(const struct gguf *g)
{
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    static const struct {
        const char *key, *field;
    } sampling[] = {{"general.sampling.temp", "temperature"},
                    {"general.sampling.top_p", "top_p"},
                    {"general.sampling.min_p", "min_p"},
                    {"general.sampling.penalty_repeat", "repetition_penalty"}};
    json_t *gen = json_object(), *eos = json_array();
    json_object_set_new(gen, "eos_token_id", eos);
    for (size_t i = 0; i < sizeof eos_keys / sizeof eos_keys[0]; i++) {
        int64_t id;
        const int rc = gguf_get_i64(g, eos_keys[i], &id);
        if (rc < 0)
            goto fail;
        bool seen = false;
        for (size_t j = 0; rc == 0 && j < json_array_size(eos); j++)
            seen |= json_integer_value(json_array_get(eos, j)) == id;
        if (rc == 0 && !seen)
            json_array_append_new(eos, json_integer(id));
    }
    if (json_array_size(eos) == 0)
        json_object_del(gen, "eos_token_id");
    int64_t v;
    int rc = gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v);
    if (rc < 0)
        goto fail;
    if (rc == 0)
        json_object_set_new(gen, "bos_token_id", json_integer(v));
    for (size_t i = 0; i < sizeof sampling / sizeof sampling[0]; i++)
        if (put_num(gen, g, "", sampling[i].key, sampling[i].field) != 0)
            goto fail;
    if ((rc = gguf_get_i64(g, "general.sampling.top_k", &v)) < 0)
        goto fail;
    if (rc == 0)
        json_object_set_new(gen, "top_k", json_integer(v));
    return gen;
fail:
    json_decref(gen);
    return NULL;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int64_t numel(const struct gguf_tensor *t)
{
    int64_t n = 1;
    for (int32_t d = 0; d < t->n_dim; d++)
        n *= t->ne[d];
    return n;
}

/* One view: a tensor of g (or slice e of its outermost dimension when e >= 0)
 * under name, with its shape reversed; NULL with err_set(). */
static struct st_tensor *add_view(struct safetensors *st, const struct gguf_tensor *t, const char *name, int64_t e)
{
    struct st_tensor *v = &st->tensors[st->n_tensors];
    memset(v, 0, sizeof *v);
    v->name = strdup(name);
    if (!v->name) {
        err_set("gguf: out of memory");
        return NULL;
    }
    st->n_tensors++;
    v->type = t->type;
    v->file = t->file;
    v->n_dim = e >= 0 ? t->n_dim - 1 : t->n_dim;
    for (int32_t d = 0; d < v->n_dim; d++)
        v->shape[d] = t->ne[v->n_dim - 1 - d];
    v->n_bytes = e >= 0 ? t->n_bytes / (size_t)t->ne[t->n_dim - 1] : t->n_bytes;
    v->data = (const char *)t->data + (e >= 0 ? (size_t)e * v->n_bytes : 0);
    return v;
}

/* A buffer of n_bytes for a copy of v; NULL with err_set(). */
static char *alloc_copy(const struct st_tensor *v, size_t n_bytes)
{
    char *p = aligned_alloc(64, (n_bytes + 63) & ~(size_t)63);
    if (!p)
        err_set("gguf: %s: out of memory for a copy of '%s' (%zu bytes)", v->file, v->name, n_bytes);
    return p;
}

/* v's data replaced by p (filled by the caller from v's old data, freed here if owned). */
static void install(struct st_tensor *v, char *p, size_t n_bytes)
{
    free(v->copy);
    v->copy = p;
    v->data = p;
    v->n_bytes = n_bytes;
}

/* The elements of a stored vector as floats into out[n]; -1 unless a plain type. */
static int read_floats(const struct st_tensor *v, const char *gname, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const void *p = v->data;
        switch (v->type) {
        case DT_F32: memcpy(&out[i], (const float *)p + i, sizeof(float)); break;
        case DT_F16: out[i] = f16_to_f32(((const uint16_t *)p)[i]); break;
        case DT_BF16: out[i] = bf16_to_f32(((const uint16_t *)p)[i]); break;
        default:
            return err_set("gguf: %s: tensor '%s' is %s; a vector must be F32, F16 or BF16", v->file, gname,
                           dtype_name(v->type));
        }
    }
    return 0;
}

/* The float v nearest s - 1 for which 1.0f + v is s itself, so that the
 * binding's 1 + w gives back the stored value bit for bit; false if none is near. */
static bool plus_one_inverse(float s, float *v)
{
    float lo = s - 1.0f, hi = lo;
    for (int k = 0; k < 4; k++) {
        if (1.0f + lo == s || 1.0f + hi == s) {
            *v = 1.0f + lo == s ? lo : hi;
            return true;
        }
        lo = nextafterf(lo, -INFINITY);
        hi = nextafterf(hi, INFINITY);
    }
    return false;
}

/* A_log back from A = -exp(A_log), computed by the converter in fp32 from the
 * checkpoint's value. Published checkpoints hold A_log in bf16: the bf16 value
 * nearest log(-A), when its exp is within the ulp torch's exp may miss by, is
 * that value itself (bf16 neighbours are hundreds of ulps of A apart). Else
 * the float nearest log(-A) whose expf (what the backends apply to A_log) is
 * -A itself, where one is; else the nearest. */
static float neg_exp_inverse(float A)
{
    const float a = -A, x0 = (float)log((double)a), xb = bf16_to_f32(f32_to_bf16(x0)), e = expf(xb);
    if (e == a || nextafterf(e, INFINITY) == a || nextafterf(e, -INFINITY) == a)
        return xb;
    float lo = x0, hi = x0;
    for (int k = 0; k < 4; k++) {
        if (expf(lo) == a || expf(hi) == a)
            return expf(lo) == a ? lo : hi;
        lo = nextafterf(lo, -INFINITY);
        hi = nextafterf(hi, INFINITY);
    }
    return x0;
}

/* X_PLUS_ONE and X_NEG_EXP: v (a vector) replaced by an owned F32 copy of transformers' values. */
static int undo_values(struct st_tensor *v, const char *gname, enum xform x)
{
    const int64_t n = v->shape[0];
    float *w = malloc((size_t)n * sizeof(float));
    if (!w)
        return err_set("gguf: out of memory");
    int rc = read_floats(v, gname, w, n);
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        if (x == X_PLUS_ONE && !plus_one_inverse(w[i], &w[i]))
            rc = err_set("gguf: %s: tensor '%s' [%lld] = %g is no 1 + w of a float w", v->file, gname, (long long)i,
                         (double)w[i]);
        else if (x == X_NEG_EXP && !(w[i] < 0 && isfinite(w[i])))
            rc = err_set("gguf: %s: tensor '%s' [%lld] = %g is not -exp(A_log) of a finite A_log", v->file, gname,
                         (long long)i, (double)w[i]);
        else if (x == X_NEG_EXP)
            w[i] = neg_exp_inverse(w[i]);
    }
    char *p = rc == 0 ? alloc_copy(v, (size_t)n * sizeof(float)) : NULL;
    if (p) {
        memcpy(p, w, (size_t)n * sizeof(float));
        install(v, p, (size_t)n * sizeof(float));
        v->type = DT_F32;
    }
    free(w);
    return p ? 0 : -1;
}

/* Value heads back from llama.cpp's tiled order to transformers' grouped one
 * (see enum vorder), by copying v's rows (or each row's column runs). */
static int untile_heads(struct st_tensor *v, const char *gname, enum vorder o, const struct model_config *c)
{
    const int64_t Hk = c->lin_n_k_head, Hv = c->lin_n_v_head, r = Hv / Hk;
    const int64_t head = o == V_HEAD ? 1 : c->lin_v_dim, skip = o == V_QKV ? 2 * Hk * c->lin_k_dim : 0;
    const int64_t rows = v->shape[0], cols = v->n_dim > 1 ? v->shape[v->n_dim - 1] : 1;
    if (o == V_COLS ? cols != Hv * head : rows != skip + Hv * head)
        return err_set("gguf: %s: tensor '%s' has %lld %s; %lld value heads of %lld (after %lld) expected", v->file,
                       gname, (long long)(o == V_COLS ? cols : rows), o == V_COLS ? "columns" : "rows", (long long)Hv,
                       (long long)head, (long long)skip);
    if (o == V_COLS && head % dtype_block(v->type) != 0)
        return err_set("gguf: %s: tensor '%s' is %s: its blocks of %lld columns span value heads of %lld, which "
                       "llama.cpp reordered", v->file, gname, dtype_name(v->type), (long long)dtype_block(v->type),
                       (long long)head);
    /* a run: one head's rows, or one head's columns of one row */
    const size_t run = o == V_COLS ? dtype_bytes(v->type, head) : v->n_bytes / (size_t)rows * (size_t)head;
    const int64_t n_outer = o == V_COLS ? rows : 1;
    const size_t outer = v->n_bytes / (size_t)n_outer;
    const size_t lead = o == V_COLS ? 0 : v->n_bytes / (size_t)rows * (size_t)skip;
    const char *src = v->data;
    char *dst = alloc_copy(v, v->n_bytes);
    if (!dst)
        return -1;
    for (int64_t q = 0; q < n_outer; q++) {
        memcpy(dst + q * outer, src + q * outer, lead);
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t i = 0; i < r; i++)
                memcpy(dst + q * outer + lead + (size_t)(g * r + i) * run,
                       src + q * outer + lead + (size_t)(i * Hk + g) * run, run);
    }
    install(v, dst, v->n_bytes);
    return 0;
}

/* X_UNPAIR: in each head of hd rows, llama.cpp's row 2p + s is transformers' s*hd/2 + p. */
static int unpair_rows(struct st_tensor *v, const char *gname, int64_t hd)
{
    const int64_t rows = v->shape[0], half = hd / 2;
    if (v->n_dim != 2 || hd % 2 != 0 || rows % hd != 0)
        return err_set("gguf: %s: tensor '%s' is not whole heads of %lld rows", v->file, gname, (long long)hd);
    const size_t row = v->n_bytes / (size_t)rows;
    const char *src = v->data;
    char *dst = alloc_copy(v, v->n_bytes);
    if (!dst)
        return -1;
    for (int64_t h = 0; h < rows / hd; h++)
        for (int64_t s = 0; s < 2; s++)
            for (int64_t p = 0; p < half; p++)
                memcpy(dst + (size_t)(h * hd + s * half + p) * row, src + (size_t)(h * hd + 2 * p + s) * row, row);
    install(v, dst, v->n_bytes);
    return 0;
}

/* Qwen3-Next's in_proj_ba [2*Hv][H], per key head g its r b rows then its r a
 * rows: in_proj_b and in_proj_a [Hv][H], rows copied out. */
static int split_ba(struct safetensors *st, const struct gguf_tensor *t, const char *fmt, const struct model_config *c)
{
    const int64_t Hk = c->lin_n_k_head, Hv = c->lin_n_v_head, r = Hv / Hk;
    if (t->n_dim != 2 || t->ne[1] != 2 * Hv)
        return err_set("gguf: %s: tensor '%s' has %lld rows; 2 x %lld value heads expected", t->file, t->name,
                       (long long)(t->n_dim == 2 ? t->ne[1] : -1), (long long)Hv);
    const size_t row = t->n_bytes / (size_t)t->ne[1];
    const char *names[2] = {"b", "a"};
    char name[256];
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, fmt, names[k]);
        struct st_tensor *v = add_view(st, t, name, -1);
        char *dst = v ? alloc_copy(v, t->n_bytes / 2) : NULL;
        if (!dst)
            return -1;
        for (int64_t g = 0; g < Hk; g++)
            memcpy(dst + (size_t)(g * r) * row, (const char *)t->data + (size_t)(g * 2 * r + k * r) * row,
                   (size_t)r * row);
        install(v, dst, t->n_bytes / 2);
        v->shape[0] = Hv;
    }
    return 0;
}

/* t under name with transform x (and, for v_tiled files, value-head order o). */
static int add_mapped(struct safetensors *st, const struct gguf_tensor *t, const char *name, enum xform x,
                      enum vorder o, bool v_tiled, const struct model_config *c)
{
    struct st_tensor *v = add_view(st, t, name, -1);
    if (!v)
        return -1;
    const int64_t n = numel(t);
    switch (x) {
    case X_VEC:
    case X_PLUS_ONE:
    case X_NEG_EXP:
        v->n_dim = 1;
        v->shape[0] = n;
        break;
    case X_ROW:
        v->n_dim = 2;
        v->shape[0] = 1;
        v->shape[1] = n;
        break;
    case X_CONV:
        if (t->n_dim == 2) {
            v->n_dim = 3;
            v->shape[2] = t->ne[0];
            v->shape[1] = 1;
            v->shape[0] = t->ne[1];
        }
        break;
    case X_VIEW:
    case X_EXPERTS:
    case X_BA:
    case X_UNPAIR: break;
    }
    if ((x == X_PLUS_ONE || x == X_NEG_EXP) && undo_values(v, t->name, x) != 0)
        return -1;
    if (x == X_UNPAIR && unpair_rows(v, t->name, c->head_dim) != 0)
        return -1;
    if (v_tiled && o != V_NONE && c->lin_n_v_head != c->lin_n_k_head && untile_heads(v, t->name, o, c) != 0)
        return -1;
    return 0;
}

int gguf_hf_tensors(const struct gguf *g, const struct model_config *c, struct safetensors *st)
{
    memset(st, 0, sizeof *st);
    char arch[64];
    const int a = gguf_hf_arch(g, arch, sizeof arch);
    if (a < 0)
        return -1;
    const enum family fam = archs[a].fam;
    int64_t mtp = 0;
    if (get_int(g, arch, "nextn_predict_layers", &mtp) < 0)
        return -1;
    int64_t n_views = 0;
    for (int64_t i = 0; i < g->n_tensors; i++)
        n_views += strstr(g->tensors[i].name, "_exps.") && g->tensors[i].n_dim == 3 ? g->tensors[i].ne[2]
                   : strstr(g->tensors[i].name, ".ssm_ba.")                         ? 2
                                                                                    : 1;
    st->tensors = calloc((size_t)(n_views ? n_views : 1), sizeof *st->tensors);
    if (!st->tensors)
        return err_set("gguf: out of memory");
    char name[256];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        int layer = -1, used = 0;
        bool found = false;
        const bool blk = sscanf(t->name, "blk.%d.%n", &layer, &used) == 1 && used > 0 && layer >= 0;
        if (blk && layer >= c->n_layer && layer < c->n_layer + mtp)
            continue; /* the MTP head's, which Kapitsa does not run */
        if (blk && layer < c->n_layer) {
            const char *rest = t->name + used;
            for (size_t k = 0; !found && k < layer_maps[fam].n; k++) {
                const struct tmap *e = &layer_maps[fam].map[k];
                if (strcmp(rest, e->gguf) != 0)
                    continue;
                found = true;
                int n = snprintf(name, sizeof name, "%slayers.%d.", c->prefix, layer);
                if (e->x == X_EXPERTS) {
                    if (t->n_dim != 3) {
                        err_set("gguf: %s: tensor '%s' has %d dimensions; stacked experts have 3", t->file, t->name,
                                (int)t->n_dim);
                        goto fail;
                    }
                    for (int64_t x = 0; x < t->ne[2]; x++) {
                        snprintf(name + n, sizeof name - (size_t)n, e->hf, (long long)x);
                        if (!add_view(st, t, name, x))
                            goto fail;
                    }
                } else if (e->x == X_BA) {
                    snprintf(name + n, sizeof name - (size_t)n, "%s", e->hf);
                    if (split_ba(st, t, name, c) != 0)
                        goto fail;
                } else {
                    snprintf(name + n, sizeof name - (size_t)n, "%s", e->hf);
                    if (add_mapped(st, t, name, e->x, e->v, archs[a].v_tiled, c) != 0)
                        goto fail;
                }
            }
        }
        for (size_t k = 0; !found && k < sizeof global_names / sizeof global_names[0]; k++)
            if (strcmp(t->name, global_names[k].gguf) == 0) {
                const char *hf = global_names[k].hf[fam];
                snprintf(name, sizeof name, "%s%s", strncmp(hf, "lm_head", 7) == 0 ? "" : c->prefix, hf);
                if (add_mapped(st, t, name, global_names[k].x[fam], V_NONE, false, c) != 0)
                    goto fail;
                found = true;
            }
        if (!found) {
            err_set("gguf: %s: tensor '%s' is not one of architecture %s's", t->file, t->name, arch);
            goto fail;
        }
    }
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_name);
    return 0;
fail:
    st_close(st);
    return -1;
}
