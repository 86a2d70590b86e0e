/* config: config.json / generation_config.json reader (see config.h).
 * Field names and defaults follow transformers' configuration classes of each
 * family; rope follows transformers' modeling_rope_utils (v5 semantics). */
#define _GNU_SOURCE
#include "config.h"

#include "../base/err.h"

#include <jansson.h>
#include <math.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

struct cfg_reader {
    const char *path;
    json_t *root;
    int failed;
};

static json_t *cfg_get(struct cfg_reader *r, json_t *obj, const char *key, int required)
{
    json_t *v = json_object_get(obj, key);
    if (json_is_null(v))
        v = NULL;
    if (!v && required && !r->failed) {
        err_set("config: %s: missing field '%s'", r->path, key);
        r->failed = 1;
    }
    return v;
}

/* An integer field in [lo, hi]; `def` when absent and not required. */
static int32_t cfg_int(struct cfg_reader *r, json_t *obj, const char *key, int required,
                       int64_t def, int64_t lo, int64_t hi)
{
    json_t *v = cfg_get(r, obj, key, required);
    if (!v)
        return (int32_t)def;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        if (!r->failed)
            err_set("config: %s: field '%s' must be an integer in [%lld, %lld]", r->path, key,
                    (long long)lo, (long long)hi);
        r->failed = 1;
        return (int32_t)def;
    }
    return (int32_t)json_integer_value(v);
}

static double cfg_num(struct cfg_reader *r, json_t *obj, const char *key, int required, double def)
{
    json_t *v = cfg_get(r, obj, key, required);
    if (!v)
        return def;
    if (!json_is_number(v) || !isfinite(json_number_value(v))) {
        if (!r->failed)
            err_set("config: %s: field '%s' must be a number", r->path, key);
        r->failed = 1;
        return def;
    }
    return json_number_value(v);
}

static int cfg_bool(struct cfg_reader *r, json_t *obj, const char *key, int def)
{
    json_t *v = cfg_get(r, obj, key, 0);
    if (!v)
        return def;
    if (!json_is_boolean(v)) {
        if (!r->failed)
            err_set("config: %s: field '%s' must be true or false", r->path, key);
        r->failed = 1;
        return def;
    }
    return json_is_true(v);
}

/* eos_token_id: an integer or a list of integers. */
static void cfg_eos(struct cfg_reader *r, json_t *obj, struct model_config *c)
{
    json_t *v = cfg_get(r, obj, "eos_token_id", 0);
    if (!v)
        return;
    if (json_is_integer(v)) {
        c->n_eos = 1;
        c->eos_id[0] = cfg_int(r, obj, "eos_token_id", 1, -1, 0, INT32_MAX);
        return;
    }
    if (!json_is_array(v) || json_array_size(v) > CFG_MAX_EOS) {
        err_set("config: %s: field 'eos_token_id' must be an integer or a list of at most %d",
                r->path, CFG_MAX_EOS);
        r->failed = 1;
        return;
    }
    c->n_eos = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX) {
            err_set("config: %s: field 'eos_token_id' holds a non-integer", r->path);
            r->failed = 1;
            return;
        }
        c->eos_id[c->n_eos++] = (int32_t)json_integer_value(e);
    }
}

static void cfg_rope(struct cfg_reader *r, json_t *root, struct model_config *c)
{
    /* transformers 5 writes rope_parameters; older checkpoints have rope_theta at
     * the top and an optional rope_scaling dict. */
    json_t *rp = cfg_get(r, root, "rope_parameters", 0);
    json_t *rs = cfg_get(r, root, "rope_scaling", 0);
    json_t *params = rp ? rp : rs;
    if (params && !json_is_object(params)) {
        err_set("config: %s: field '%s' must be an object", r->path, rp ? "rope_parameters" : "rope_scaling");
        r->failed = 1;
        return;
    }
    c->rope_theta = (float)cfg_num(r, rp ? rp : root, "rope_theta", 0, 10000.0);
    double partial = cfg_num(r, rp ? rp : root, "partial_rotary_factor", 0, 1.0);
    c->rope_dim = (int32_t)(c->head_dim * partial);
    c->rope_type = ROPE_DEFAULT;
    c->rope_factor = 1.0f;
    c->rope_attn_factor = 1.0f;
    if (!params)
        return;
    json_t *jt = json_object_get(params, "rope_type");
    if (!jt)
        jt = json_object_get(params, "type");
    const char *type = json_is_string(jt) ? json_string_value(jt) : "default";
    if (strcmp(type, "default") == 0)
        return;
    double factor = cfg_num(r, params, "factor", 0, 0.0);
    if (strcmp(type, "linear") == 0) {
        if (factor <= 0 && !r->failed) {
            err_set("config: %s: linear rope needs a positive 'factor'", r->path);
            r->failed = 1;
        }
        c->rope_type = ROPE_LINEAR;
        c->rope_factor = (float)factor;
        return;
    }
    if (strcmp(type, "yarn") != 0) {
        err_set("config: %s: rope_type '%s' is not supported (default, linear, yarn)", r->path, type);
        r->failed = 1;
        return;
    }
    c->rope_type = ROPE_YARN;
    c->rope_orig_max = cfg_int(r, params, "original_max_position_embeddings", 0, c->max_position, 1,
                               INT32_MAX);
    if (factor <= 0)
        factor = (double)c->max_position / c->rope_orig_max;
    c->rope_factor = (float)factor;
    double mscale = cfg_num(r, params, "mscale", 0, 0.0);
    double mscale_all = cfg_num(r, params, "mscale_all_dim", 0, 0.0);
#define YARN_MSCALE(s, m) ((s) <= 1 ? 1.0 : 0.1 * (m) * log(s) + 1.0)
    double attn = YARN_MSCALE(factor, 1.0);
    if (mscale != 0 && mscale_all != 0)
        attn = YARN_MSCALE(factor, mscale) / YARN_MSCALE(factor, mscale_all);
#undef YARN_MSCALE
    c->rope_attn_factor = (float)cfg_num(r, params, "attention_factor", 0, attn);
    c->rope_beta_fast = (float)cfg_num(r, params, "beta_fast", 0, 32.0);
    c->rope_beta_slow = (float)cfg_num(r, params, "beta_slow", 0, 1.0);
    c->rope_truncate = cfg_bool(r, params, "truncate", 1);
}

static const struct {
    const char *type;
    enum arch arch;
} cfg_archs[] = {
    {"qwen3", ARCH_QWEN3},           {"qwen3_moe", ARCH_QWEN3_MOE},         {"qwen3_next", ARCH_QWEN3_NEXT},
    {"qwen3_5_text", ARCH_QWEN3_NEXT}, {"qwen3_5_moe_text", ARCH_QWEN3_NEXT}, {"qwen3_5", ARCH_QWEN3_NEXT},
    {"qwen3_5_moe", ARCH_QWEN3_NEXT}, {"nemotron_h", ARCH_NEMOTRON_H},
};

__attribute__((format(printf, 2, 3))) static int cfg_fail(struct cfg_reader *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->failed = 1;
    return err_set("config: %s: %s", r->path, msg);
}

/* The qwen MoE rule: every decoder_sparse_step-th layer, minus mlp_only_layers. */
static int cfg_qwen_moe(struct cfg_reader *r, json_t *root, struct model_config *c)
{
    /* transformers 5 names it num_local_experts in some writers */
    const char *ne = json_object_get(root, "num_experts") ? "num_experts" : "num_local_experts";
    c->n_expert = cfg_int(r, root, ne, c->arch == ARCH_QWEN3_MOE, 0, 0, 4096);
    for (int32_t l = 0; l < c->n_layer; l++)
        c->layer_ffn[l] = FFN_DENSE;
    if (c->n_expert == 0 || r->failed)
        return r->failed ? -1 : 0;
    c->n_expert_used = cfg_int(r, root, "num_experts_per_tok", 1, 0, 1, 4096);
    c->moe_intermediate_size = cfg_int(r, root, "moe_intermediate_size", 1, 0, 1, 1 << 20);
    c->norm_topk_prob = cfg_bool(r, root, "norm_topk_prob", 0);
    c->shared_intermediate_size = cfg_int(r, root, "shared_expert_intermediate_size", 0, 0, 0, 1 << 20);
    c->shared_gate = c->shared_intermediate_size > 0;
    c->routed_scale = 1.0f;
    int32_t step = cfg_int(r, root, "decoder_sparse_step", 0, 1, 1, CFG_MAX_LAYER);
    if (r->failed)
        return -1;
    if (c->n_expert_used > c->n_expert)
        return cfg_fail(r, "num_experts_per_tok %d > experts %d", c->n_expert_used, c->n_expert);
    for (int32_t l = 0; l < c->n_layer; l++)
        c->layer_ffn[l] = (l + 1) % step == 0 ? FFN_MOE : FFN_DENSE;
    json_t *only = cfg_get(r, root, "mlp_only_layers", 0);
    if (only && !json_is_array(only))
        return cfg_fail(r, "field 'mlp_only_layers' must be a list");
    size_t i;
    json_t *e;
    json_array_foreach(only, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->n_layer)
            return cfg_fail(r, "'mlp_only_layers' holds a bad layer index");
        c->layer_ffn[json_integer_value(e)] = FFN_DENSE;
    }
    return 0;
}

/* qwen3_next / qwen3_5: layer_types, or every full_attention_interval-th layer. */
static int cfg_qwen_hybrid(struct cfg_reader *r, json_t *root, struct model_config *c)
{
    json_t *lt = cfg_get(r, root, "layer_types", 0);
    int32_t every = cfg_int(r, root, "full_attention_interval", 0, 4, 1, CFG_MAX_LAYER);
    if (lt && (!json_is_array(lt) || (int32_t)json_array_size(lt) != c->n_layer))
        return cfg_fail(r, "'layer_types' must list one type per layer (%d layers)", c->n_layer);
    for (int32_t l = 0; l < c->n_layer; l++) {
        const char *t = lt ? json_string_value(json_array_get(lt, (size_t)l)) : NULL;
        if (!lt)
            t = (l + 1) % every == 0 ? "full_attention" : "linear_attention";
        if (t && strcmp(t, "full_attention") == 0)
            c->layer_mixer[l] = MIX_ATTN;
        else if (t && strcmp(t, "linear_attention") == 0)
            c->layer_mixer[l] = MIX_DELTA;
        else
            return cfg_fail(r, "layer %d has unknown type '%s' (full_attention, linear_attention)", l, t ? t : "?");
    }
    c->lin_n_k_head = cfg_int(r, root, "linear_num_key_heads", 1, 0, 1, 1024);
    c->lin_n_v_head = cfg_int(r, root, "linear_num_value_heads", 1, 0, 1, 1024);
    c->lin_k_dim = cfg_int(r, root, "linear_key_head_dim", 1, 0, 1, 256);
    c->lin_v_dim = cfg_int(r, root, "linear_value_head_dim", 1, 0, 1, 256);
    c->conv_kernel = cfg_int(r, root, "linear_conv_kernel_dim", 0, 4, 2, 16);
    if (r->failed)
        return -1;
    if (c->lin_n_v_head % c->lin_n_k_head != 0)
        return cfg_fail(r, "linear_num_value_heads (%d) is not a multiple of linear_num_key_heads (%d)",
                        c->lin_n_v_head, c->lin_n_k_head);
    c->rec_conv_dim = 2 * (int64_t)c->lin_n_k_head * c->lin_k_dim + (int64_t)c->lin_n_v_head * c->lin_v_dim;
    c->rec_state_dim = (int64_t)c->lin_n_v_head * c->lin_k_dim * c->lin_v_dim;
    c->norm_plus_one = true;
    c->attn_out_gate = cfg_bool(r, root, "attn_output_gate", 1);
    return r->failed ? -1 : 0;
}

/* A number, or infinity written as transformers 5 does ({"__float__": "Infinity"})
 * or as Python's json module does (a bare Infinity, see cfg_load_json). */
static float cfg_float_or_inf(json_t *v, float def)
{
    if (json_is_number(v))
        return (float)json_number_value(v);
    json_t *f = json_is_object(v) ? json_object_get(v, "__float__") : v;
    const char *s = json_string_value(f);
    if (s && strcmp(s, "Infinity") == 0)
        return INFINITY;
    if (s && strcmp(s, "-Infinity") == 0)
        return -INFINITY;
    return def;
}

/* nemotron_h: layers_block_type (names of transformers 4 or 5), or the
 * hybrid_override_pattern string (M mamba, * attention, - mlp, E moe). */
static int cfg_nemotron(struct cfg_reader *r, json_t *root, struct model_config *c)
{
    json_t *bt = cfg_get(r, root, "layers_block_type", 0);
    json_t *pat = cfg_get(r, root, "hybrid_override_pattern", 0);
    if (!bt && !pat)
        return cfg_fail(r, "needs 'layers_block_type' or 'hybrid_override_pattern'");
    int32_t n = bt ? (json_is_array(bt) ? (int32_t)json_array_size(bt) : -1)
                   : (json_is_string(pat) ? (int32_t)strlen(json_string_value(pat)) : -1);
    if (c->n_layer < 0 && n >= 1 && n <= CFG_MAX_LAYER)
        c->n_layer = n;
    if (n < 1 || n != c->n_layer)
        return cfg_fail(r, "the layer pattern %sdescribes %d layers, num_hidden_layers is %d",
                        n < 0 ? "(not a list or string) " : "", n, c->n_layer);
    bool any_moe = false;
    for (int32_t l = 0; l < n; l++) {
        char t[32] = "?";
        if (bt) {
            const char *s = json_string_value(json_array_get(bt, (size_t)l));
            if (s)
                snprintf(t, sizeof t, "%s", s);
        } else {
            char ch = json_string_value(pat)[l];
            snprintf(t, sizeof t, "%s", ch == 'M' ? "mamba" : ch == '*' ? "attention" : ch == '-' ? "mlp" : ch == 'E' ? "moe" : "?");
        }
        c->layer_mixer[l] = MIX_NONE;
        c->layer_ffn[l] = FFN_NONE;
        if (strcmp(t, "mamba") == 0 || strcmp(t, "linear_attention") == 0)
            c->layer_mixer[l] = MIX_MAMBA;
        else if (strcmp(t, "attention") == 0 || strcmp(t, "full_attention") == 0)
            c->layer_mixer[l] = MIX_ATTN;
        else if (strcmp(t, "mlp") == 0)
            c->layer_ffn[l] = FFN_DENSE;
        else if (strcmp(t, "moe") == 0)
            c->layer_ffn[l] = FFN_MOE, any_moe = true;
        else
            return cfg_fail(r, "layer %d has unknown type '%s' (mamba, attention, mlp, moe)", l, t);
    }
    c->ssm_n_head = cfg_int(r, root, "mamba_num_heads", 1, 0, 1, 4096);
    c->ssm_head_dim = cfg_int(r, root, "mamba_head_dim", 1, 0, 1, 256);
    c->ssm_n_group = cfg_int(r, root, "n_groups", 0, 1, 1, 1024);
    c->ssm_state = cfg_int(r, root, "ssm_state_size", 1, 0, 1, 256);
    c->conv_kernel = cfg_int(r, root, "conv_kernel", 0, 4, 2, 16);
    c->ssm_chunk = cfg_int(r, root, "chunk_size", 0, 128, 1, 4096);
    c->ssm_conv_bias = cfg_bool(r, root, "use_conv_bias", 1);
    c->ssm_dt_min = (float)cfg_num(r, root, "time_step_min", 0, 0.001);
    json_t *lim = cfg_get(r, root, "time_step_limit", 0);
    c->ssm_dt_lo = 0.0f;
    c->ssm_dt_hi = INFINITY;
    if (lim && json_is_array(lim) && json_array_size(lim) == 2) {
        c->ssm_dt_lo = cfg_float_or_inf(json_array_get(lim, 0), 0.0f);
        c->ssm_dt_hi = cfg_float_or_inf(json_array_get(lim, 1), INFINITY);
    }
    if (r->failed)
        return -1;
    if (cfg_bool(r, root, "use_bias", 0) || cfg_bool(r, root, "mamba_proj_bias", 0) || cfg_bool(r, root, "mlp_bias", 0))
        return cfg_fail(r, "biases on the projections (use_bias, mamba_proj_bias, mlp_bias) are not supported");
    if (c->ssm_n_head % c->ssm_n_group != 0)
        return cfg_fail(r, "mamba_num_heads (%d) is not a multiple of n_groups (%d)", c->ssm_n_head, c->ssm_n_group);
    json_t *act = cfg_get(r, root, "mlp_hidden_act", 0);
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "relu2") != 0))
        return cfg_fail(r, "mlp_hidden_act must be \"relu2\"");
    act = cfg_get(r, root, "mamba_hidden_act", 0);
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return cfg_fail(r, "mamba_hidden_act must be \"silu\"");
    const int64_t inner = (int64_t)c->ssm_n_head * c->ssm_head_dim;
    c->rec_conv_dim = inner + 2 * (int64_t)c->ssm_n_group * c->ssm_state;
    c->rec_state_dim = inner * c->ssm_state;
    c->relu2 = true;
    c->rope_dim = 0;
    if (any_moe) {
        c->n_expert = cfg_int(r, root, "n_routed_experts", 1, 0, 1, 4096);
        c->n_expert_used = cfg_int(r, root, "num_experts_per_tok", 1, 0, 1, 4096);
        c->moe_intermediate_size = cfg_int(r, root, "moe_intermediate_size", 1, 0, 1, 1 << 20);
        c->norm_topk_prob = cfg_bool(r, root, "norm_topk_prob", 1);
        c->routed_scale = (float)cfg_num(r, root, "routed_scaling_factor", 0, 1.0);
        c->n_group = cfg_int(r, root, "n_group", 0, 1, 1, 4096);
        c->topk_group = cfg_int(r, root, "topk_group", 0, 1, 1, 4096);
        int32_t n_shared = cfg_int(r, root, "n_shared_experts", 0, 1, 0, 1);
        c->shared_intermediate_size =
            n_shared ? cfg_int(r, root, "moe_shared_expert_intermediate_size", 1, 0, 1, 1 << 20) : 0;
        c->router_sigmoid = true;
        if (r->failed)
            return -1;
        if (cfg_get(r, root, "moe_latent_size", 0))
            return cfg_fail(r, "moe_latent_size (latent expert projections) is not supported");
        if (c->n_expert % c->n_group != 0 || c->topk_group > c->n_group || c->n_expert_used > c->n_expert ||
            (c->n_expert / c->n_group) * c->topk_group < c->n_expert_used)
            return cfg_fail(r, "n_routed_experts %d, n_group %d, topk_group %d and num_experts_per_tok %d do not fit",
                            c->n_expert, c->n_group, c->topk_group, c->n_expert_used);
    }
    return 0;
}

/* quantization_config: Hugging Face's block-scaled FP8 alone (what fp8.h reads). */
static int cfg_quant(struct cfg_reader *r, struct model_config *c)
{
    json_t *q = cfg_get(r, r->root, "quantization_config", 0);
    if (!q)
        return 0;
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    const char *fmt = json_string_value(json_object_get(q, "fmt"));
    json_t *bs = json_object_get(q, "weight_block_size");
    if (!json_is_object(q) || !method)
        return err_set("config: %s: quantization_config must be an object with a quant_method", r->path);
    if (strcmp(method, "fp8") != 0)
        return err_set("config: %s: quantization_config.quant_method '%s' is not supported (fp8)", r->path, method);
    if (json_object_get(q, "fmt") && (!fmt || strcmp(fmt, "e4m3") != 0))
        return err_set("config: %s: quantization_config.fmt must be \"e4m3\"", r->path);
    if (!json_is_array(bs) || json_array_size(bs) != 2)
        return err_set("config: %s: quantization_config.weight_block_size must be [rows, cols] (FP8 with a scale "
                       "per tensor or per row is not supported)", r->path);
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_array_get(bs, i);
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 20)
            return err_set("config: %s: quantization_config.weight_block_size must be two integers in [1, %d]",
                           r->path, 1 << 20);
        c->fp8_block[i] = (int32_t)json_integer_value(v);
    }
    return 0;
}

static int cfg_parse(struct cfg_reader *r, struct model_config *c)
{
    json_t *root = r->root;
    json_t *mt = cfg_get(r, root, "model_type", 1);
    if (!mt)
        return -1;
    const char *type = json_string_value(mt);
    if (!type)
        return err_set("config: %s: field 'model_type' must be a string", r->path);
    size_t a = 0, n_arch = sizeof cfg_archs / sizeof cfg_archs[0];
    while (a < n_arch && strcmp(cfg_archs[a].type, type) != 0)
        a++;
    if (a == n_arch)
        return err_set("config: %s: model_type '%s' is not supported (qwen3, qwen3_moe, qwen3_next, qwen3_5, "
                       "qwen3_5_moe, nemotron_h)", r->path, type);
    c->arch = cfg_archs[a].arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", type);
    snprintf(c->prefix, sizeof c->prefix, "%s", c->arch == ARCH_NEMOTRON_H ? "backbone." : "model.");
    json_t *text = json_object_get(root, "text_config");
    c->tie_embeddings = cfg_bool(r, root, "tie_word_embeddings", 0);
    if (strcmp(type, "qwen3_5") == 0 || strcmp(type, "qwen3_5_moe") == 0) {
        if (!json_is_object(text))
            return err_set("config: %s: model_type '%s' needs a 'text_config' object", r->path, type);
        root = text; /* the multimodal wrapper: its language model only */
        snprintf(c->prefix, sizeof c->prefix, "model.language_model.");
        if (json_object_get(text, "tie_word_embeddings"))
            c->tie_embeddings = cfg_bool(r, text, "tie_word_embeddings", 0);
    }
    const bool nemo = c->arch == ARCH_NEMOTRON_H;

    c->vocab_size = cfg_int(r, root, "vocab_size", 1, 0, 1, 1 << 24);
    c->hidden_size = cfg_int(r, root, "hidden_size", 1, 0, 1, 1 << 16);
    /* nemotron_h (transformers 5) derives the layer count from its pattern */
    c->n_layer = cfg_int(r, root, "num_hidden_layers", !nemo, -1, 1, CFG_MAX_LAYER);
    c->n_head = cfg_int(r, root, "num_attention_heads", 1, 0, 1, 1024);
    c->n_kv_head = cfg_int(r, root, "num_key_value_heads", 0, c->n_head, 1, 1024);
    c->head_dim = cfg_int(r, root, "head_dim", 0, c->n_head ? c->hidden_size / c->n_head : 0, 2, 1024);
    c->intermediate_size = cfg_int(r, root, "intermediate_size", 1, 0, 1, 1 << 20);
    c->max_position = cfg_int(r, root, "max_position_embeddings", 0, 32768, 1, INT32_MAX);
    c->rms_eps = (float)cfg_num(r, root, nemo ? "layer_norm_epsilon" : "rms_norm_eps", 0, nemo ? 1e-5 : 1e-6);
    if (r->failed)
        return -1;
    if (c->n_head % c->n_kv_head != 0)
        return err_set("config: %s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                       r->path, c->n_head, c->n_kv_head);
    if (c->head_dim % 2 != 0)
        return err_set("config: %s: head_dim %d must be even", r->path, c->head_dim);
    if (cfg_bool(r, root, "attention_bias", 0))
        return err_set("config: %s: attention_bias=true is not supported", r->path);
    if (cfg_bool(r, root, "use_sliding_window", 0) || (nemo && cfg_get(r, root, "sliding_window", 0)))
        return err_set("config: %s: sliding-window attention is not supported", r->path);
    json_t *act = cfg_get(r, root, "hidden_act", 0);
    if (!nemo && act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return err_set("config: %s: hidden_act must be \"silu\"", r->path);

    for (int32_t l = 0; l < c->n_layer; l++)
        c->layer_mixer[l] = MIX_ATTN;
    if (nemo) {
        if (cfg_nemotron(r, root, c) != 0)
            return -1;
    } else {
        cfg_rope(r, root, c);
        if (r->failed)
            return -1;
        if (c->rope_dim < 2 || c->rope_dim > c->head_dim || c->rope_dim % 2)
            return err_set("config: %s: rotary dims %d do not fit head_dim %d", r->path, c->rope_dim, c->head_dim);
        if (cfg_qwen_moe(r, root, c) != 0)
            return -1;
        if (c->arch == ARCH_QWEN3_NEXT && cfg_qwen_hybrid(r, root, c) != 0)
            return -1;
        c->delta_qkvz_fused = strcmp(type, "qwen3_next") == 0;
    }
    for (int32_t l = 0; l < c->n_layer; l++) {
        c->n_attn_layer += c->layer_mixer[l] == MIX_ATTN;
        c->n_rec_layer += c->layer_mixer[l] == MIX_DELTA || c->layer_mixer[l] == MIX_MAMBA;
    }
    c->route_spread = c->n_expert > 0 && cfg_bool(r, r->root, "kapitsa_route_spread", 0);
    if (cfg_quant(r, c) != 0)
        return -1;
    c->bos_id = cfg_int(r, root, "bos_token_id", 0, -1, 0, INT32_MAX);
    cfg_eos(r, root, c);
    if (root != r->root) {
        if (json_object_get(r->root, "bos_token_id"))
            c->bos_id = cfg_int(r, r->root, "bos_token_id", 0, -1, 0, INT32_MAX);
        cfg_eos(r, r->root, c);
    }
    return r->failed ? -1 : 0;
}

/* Python's json module writes Infinity, -Infinity and NaN as bare words, which
 * is not JSON (NVIDIA's Nemotron configs carry time_step_limit [0.0, Infinity]).
 * Loads the file with such words outside strings turned into strings, which the
 * fields that may hold them accept. */
/* generation_config.json's sampling fields, in the ranges the sampler takes. */
static void cfg_sampling(struct cfg_reader *r, json_t *root, struct model_config *c)
{
    static const char *const keys[] = {"do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        c->gen_given = c->gen_given || cfg_get(r, root, keys[i], 0) != NULL;
    const bool sample = cfg_bool(r, root, "do_sample", 1);
    c->gen_temperature = (float)cfg_num(r, root, "temperature", 0, 1.0);
    c->gen_top_p = (float)cfg_num(r, root, "top_p", 0, 1.0);
    c->gen_top_k = cfg_int(r, root, "top_k", 0, 0, 0, INT32_MAX);
    c->gen_min_p = (float)cfg_num(r, root, "min_p", 0, 0.0);
    c->gen_repeat_penalty = (float)cfg_num(r, root, "repetition_penalty", 0, 1.0);
    if (!sample)
        c->gen_temperature = 0.0f;
    const char *bad = c->gen_temperature < 0                          ? "temperature"
                      : !(c->gen_top_p > 0 && c->gen_top_p <= 1)       ? "top_p"
                      : c->gen_min_p < 0 || c->gen_min_p > 1           ? "min_p"
                      : !(c->gen_repeat_penalty > 0)                   ? "repetition_penalty"
                                                                       : NULL;
    if (bad && !r->failed) {
        err_set("config: %s: field '%s' is out of range", r->path, bad);
        r->failed = 1;
    }
}

static json_t *cfg_load_json(const char *path, json_error_t *je)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(je->text, sizeof je->text, "%s", strerror(errno));
        je->line = 0;
        return NULL;
    }
    char *in = NULL, *out = NULL;
    size_t n = 0, cap = 0, o = 0;
    for (;;) {
        if (n + 4096 > cap) {
            char *p = realloc(in, cap = 2 * cap + 8192);
            if (!p)
                break;
            in = p;
        }
        size_t k = fread(in + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    fclose(f);
    json_t *j = NULL;
    out = in ? malloc(n * 3 + 1) : NULL; /* each bare word grows by at most 2 quotes */
    if (out) {
        int str = 0, esc = 0;
        for (size_t i = 0; i < n; i++) {
            const char *w = NULL;
            if (!str && (in[i] == 'I' || in[i] == 'N' || (in[i] == '-' && i + 1 < n && in[i + 1] == 'I'))) {
                static const char *const words[] = {"-Infinity", "Infinity", "NaN"};
                for (int q = 0; q < 3 && !w; q++)
                    if (n - i >= strlen(words[q]) && memcmp(in + i, words[q], strlen(words[q])) == 0)
                        w = words[q];
            }
            if (w) {
                o += (size_t)sprintf(out + o, "\"%s\"", w);
                i += strlen(w) - 1;
                continue;
            }
            if (str && esc)
                esc = 0;
            else if (str && in[i] == '\\')
                esc = 1;
            else if (in[i] == '"')
                str = !str;
            out[o++] = in[i];
        }
        j = json_loadb(out, o, 0, je);
    } else {
        snprintf(je->text, sizeof je->text, "out of memory");
    }
    free(in);
    free(out);
    return j;
}

int config_parse(struct model_config *c, json_t *config, const char *what, json_t *gen, const char *gen_what)
{
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    struct cfg_reader r = {what, config, 0};
    int rc = json_is_object(config) ? cfg_parse(&r, c) : err_set("config: %s: not a JSON object", what);
    if (rc != 0)
        return rc;
    c->gen_temperature = c->gen_top_p = c->gen_repeat_penalty = 1.0f;
    if (!gen)
        return 0;
    if (!json_is_object(gen))
        return err_set("config: %s: not a JSON object", gen_what);
    struct cfg_reader g = {gen_what, gen, 0};
    if (json_object_get(gen, "bos_token_id"))
        c->bos_id = cfg_int(&g, gen, "bos_token_id", 0, -1, 0, INT32_MAX);
    cfg_eos(&g, gen, c);
    cfg_sampling(&g, gen, c);
    return g.failed ? -1 : 0;
}

int config_load(struct model_config *c, const char *dir)
{
    char path[4096], gpath[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = cfg_load_json(path, &je), *gen = NULL;
    if (!root)
        return err_set("config: %s: %s (line %d)", path, je.text, je.line);
    snprintf(gpath, sizeof gpath, "%s/generation_config.json", dir);
    FILE *f = fopen(gpath, "rb");
    if (f) {
        fclose(f);
        gen = json_load_file(gpath, 0, &je);
        if (!gen) {
            json_decref(root);
            return err_set("config: %s: not a JSON object (%s)", gpath, je.text);
        }
    }
    int rc = config_parse(c, root, path, gen, gpath);
    json_decref(root);
    json_decref(gen);
    return rc;
}

void config_rope_inv_freq(const struct model_config *c, float *inv_freq)
{
    const int32_t dim = c->rope_dim, half = dim / 2;
    const float base = c->rope_theta;
    for (int32_t i = 0; i < half; i++) {
        /* torch: base ** (arange(0, dim, 2).float() / dim), all in fp32 */
        float pos_freq = powf(base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq;
        if (c->rope_type == ROPE_LINEAR) {
            inv_freq[i] = extra / c->rope_factor;
        } else if (c->rope_type == ROPE_YARN) {
            float inter = 1.0f / (c->rope_factor * pos_freq);
            double lo = dim * log(c->rope_orig_max / (c->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
            double hi = dim * log(c->rope_orig_max / (c->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
            if (c->rope_truncate) {
                lo = floor(lo);
                hi = ceil(hi);
            }
            if (lo < 0)
                lo = 0;
            if (hi > dim - 1)
                hi = dim - 1;
            if (lo == hi)
                hi += 0.001;
            float ramp = ((float)i - (float)lo) / ((float)hi - (float)lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float extra_factor = 1.0f - ramp;
            inv_freq[i] = inter * (1 - extra_factor) + extra * extra_factor;
        } else {
            inv_freq[i] = extra;
        }
    }
}
