/* config: config.json / generation_config.json reader (see config.h).
 * Field names and defaults follow transformers' Qwen3Config / Qwen3MoeConfig;
 * rope follows transformers' modeling_rope_utils (v5 semantics). */
#define _GNU_SOURCE
#include "config.h"

#include "../base/err.h"

#include <jansson.h>
#include <math.h>
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

static int cfg_parse(struct cfg_reader *r, struct model_config *c)
{
    json_t *root = r->root;
    json_t *mt = cfg_get(r, root, "model_type", 1);
    if (!mt)
        return -1;
    const char *type = json_string_value(mt);
    if (!type) {
        return err_set("config: %s: field 'model_type' must be a string", r->path);
    }
    if (strcmp(type, "qwen3") == 0)
        c->arch = ARCH_QWEN3;
    else if (strcmp(type, "qwen3_moe") == 0)
        c->arch = ARCH_QWEN3_MOE;
    else
        return err_set("config: %s: model_type '%s' is not supported (qwen3, qwen3_moe)", r->path, type);
    snprintf(c->model_type, sizeof c->model_type, "%s", type);

    c->vocab_size = cfg_int(r, root, "vocab_size", 1, 0, 1, 1 << 24);
    c->hidden_size = cfg_int(r, root, "hidden_size", 1, 0, 1, 1 << 16);
    c->n_layer = cfg_int(r, root, "num_hidden_layers", 1, 0, 1, CFG_MAX_LAYER);
    c->n_head = cfg_int(r, root, "num_attention_heads", 1, 0, 1, 1024);
    c->n_kv_head = cfg_int(r, root, "num_key_value_heads", 0, c->n_head, 1, 1024);
    c->head_dim = cfg_int(r, root, "head_dim", 0, c->n_head ? c->hidden_size / c->n_head : 0, 2, 1024);
    c->intermediate_size = cfg_int(r, root, "intermediate_size", 1, 0, 1, 1 << 20);
    c->max_position = cfg_int(r, root, "max_position_embeddings", 0, 32768, 1, INT32_MAX);
    c->rms_eps = (float)cfg_num(r, root, "rms_norm_eps", 0, 1e-6);
    c->tie_embeddings = cfg_bool(r, root, "tie_word_embeddings", 0);
    if (r->failed)
        return -1;
    if (c->n_head % c->n_kv_head != 0)
        return err_set("config: %s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                       r->path, c->n_head, c->n_kv_head);
    if (c->head_dim % 2 != 0)
        return err_set("config: %s: head_dim %d must be even", r->path, c->head_dim);
    if (cfg_bool(r, root, "attention_bias", 0))
        return err_set("config: %s: attention_bias=true is not supported", r->path);
    if (cfg_bool(r, root, "use_sliding_window", 0))
        return err_set("config: %s: use_sliding_window=true is not supported", r->path);
    json_t *act = cfg_get(r, root, "hidden_act", 0);
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return err_set("config: %s: hidden_act must be \"silu\"", r->path);

    cfg_rope(r, root, c);
    if (r->failed)
        return -1;
    if (c->rope_dim < 2 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        return err_set("config: %s: rotary dims %d do not fit head_dim %d", r->path, c->rope_dim, c->head_dim);

    if (c->arch == ARCH_QWEN3_MOE) {
        /* transformers 5 names it num_local_experts in some writers */
        const char *ne = json_object_get(root, "num_experts") ? "num_experts" : "num_local_experts";
        c->n_expert = cfg_int(r, root, ne, 1, 0, 1, 4096);
        c->n_expert_used = cfg_int(r, root, "num_experts_per_tok", 1, 0, 1, 4096);
        c->moe_intermediate_size = cfg_int(r, root, "moe_intermediate_size", 1, 0, 1, 1 << 20);
        c->norm_topk_prob = cfg_bool(r, root, "norm_topk_prob", 0);
        int32_t step = cfg_int(r, root, "decoder_sparse_step", 0, 1, 1, CFG_MAX_LAYER);
        if (r->failed)
            return -1;
        if (c->n_expert_used > c->n_expert)
            return err_set("config: %s: num_experts_per_tok %d > experts %d", r->path, c->n_expert_used,
                           c->n_expert);
        for (int32_t l = 0; l < c->n_layer; l++)
            c->layer_moe[l] = (l + 1) % step == 0;
        json_t *only = cfg_get(r, root, "mlp_only_layers", 0);
        if (only && !json_is_array(only))
            return err_set("config: %s: field 'mlp_only_layers' must be a list", r->path);
        size_t i;
        json_t *e;
        json_array_foreach(only, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->n_layer)
                return err_set("config: %s: 'mlp_only_layers' holds a bad layer index", r->path);
            c->layer_moe[json_integer_value(e)] = 0;
        }
    }
    c->bos_id = cfg_int(r, root, "bos_token_id", 0, -1, 0, INT32_MAX);
    cfg_eos(r, root, c);
    return r->failed ? -1 : 0;
}

int config_load(struct model_config *c, const char *dir)
{
    char path[4096];
    json_error_t je;
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct cfg_reader r = {path, json_load_file(path, 0, &je), 0};
    if (!r.root)
        return err_set("config: %s: %s (line %d)", path, je.text, je.line);
    int rc = json_is_object(r.root) ? cfg_parse(&r, c) : err_set("config: %s: not a JSON object", path);
    json_decref(r.root);
    if (rc != 0)
        return rc;

    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fclose(f);
    struct cfg_reader g = {path, json_load_file(path, 0, &je), 0};
    if (!g.root || !json_is_object(g.root)) {
        json_decref(g.root);
        return err_set("config: %s: not a JSON object (%s)", path, je.text);
    }
    if (json_object_get(g.root, "bos_token_id"))
        c->bos_id = cfg_int(&g, g.root, "bos_token_id", 0, -1, 0, INT32_MAX);
    cfg_eos(&g, g.root, c);
    json_decref(g.root);
    return g.failed ? -1 : 0;
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
