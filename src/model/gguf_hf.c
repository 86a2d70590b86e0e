/* gguf_hf: GGUF metadata and tensors under transformers' names (see gguf_hf.h).
 * The names and keys are those of llama.cpp's convert_hf_to_gguf.py. */
#define _GNU_SOURCE
#include "gguf_hf.h"

#include "../base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-layer tensors: GGUF's name after "blk.N." and transformers' after
 * "model.layers.N.". Experts (stacked in GGUF) are handled apart. */
static const struct {
    const char *gguf, *hf;
} layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
};

static const struct {
    const char *gguf, *hf;
} global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

static const struct {
    const char *gguf, *hf; /* hf: the projection's name in an expert */
} expert_names[] = {
    {"ffn_gate_exps.weight", "gate_proj.weight"},
    {"ffn_up_exps.weight", "up_proj.weight"},
    {"ffn_down_exps.weight", "down_proj.weight"},
};

static const struct {
    const char *gguf, *model_type;
} archs[] = {{"qwen3", "qwen3"}, {"qwen3moe", "qwen3_moe"}};

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

/* The architecture's model_type, or NULL with err_set(). */
static const char *gguf_hf_arch(const struct gguf *g, char *arch, size_t cap)
{
    const char *p;
    size_t n;
    if (gguf_get_str(g, "general.architecture", &p, &n) != 0) {
        err_set("gguf: %s: no general.architecture string", gguf_path(g));
        return NULL;
    }
    snprintf(arch, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(arch, archs[i].gguf) == 0)
            return archs[i].model_type;
    err_set("gguf: %s: architecture '%s' is not supported (qwen3, qwen3moe)", gguf_path(g), arch);
    return NULL;
}

/* key "ARCH.name" into obj[field] as an integer; required: absent is an error */
static int put_int(json_t *obj, const struct gguf *g, const char *arch, const char *name, const char *field,
                   bool required)
{
    char key[160];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, name);
    int rc = gguf_get_i64(g, key, &v);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return required ? err_set("gguf: %s: missing key '%s'", gguf_path(g), key) : 0;
    json_object_set_new(obj, field, json_integer(v));
    return 0;
}

static int put_num(json_t *obj, const struct gguf *g, const char *key, const char *field)
{
    float v;
    int rc = gguf_get_f32(g, key, &v);
    if (rc == 0)
        json_object_set_new(obj, field, json_real(v));
    return rc < 0 ? -1 : 0;
}

json_t *gguf_hf_config(const struct gguf *g)
{
    char arch[64], key[160];
    const char *type = gguf_hf_arch(g, arch, sizeof arch);
    if (!type)
        return NULL;
    json_t *c = json_object();
    json_object_set_new(c, "model_type", json_string(type));
    const struct gguf_kv *toks;
    const struct gguf_tensor *emb = gguf_find(g, "token_embd.weight");
    if (put_int(c, g, arch, "vocab_size", "vocab_size", false) != 0)
        goto fail;
    if (!json_object_get(c, "vocab_size")) {
        if (emb && emb->n_dim == 2)
            json_object_set_new(c, "vocab_size", json_integer(emb->ne[1]));
        else if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &toks) == 0)
            json_object_set_new(c, "vocab_size", json_integer((json_int_t)toks->n));
    }
    const bool moe = strcmp(type, "qwen3_moe") == 0;
    if (put_int(c, g, arch, "embedding_length", "hidden_size", true) != 0 ||
        put_int(c, g, arch, "block_count", "num_hidden_layers", true) != 0 ||
        put_int(c, g, arch, "attention.head_count", "num_attention_heads", true) != 0 ||
        put_int(c, g, arch, "attention.head_count_kv", "num_key_value_heads", false) != 0 ||
        put_int(c, g, arch, "attention.key_length", "head_dim", false) != 0 ||
        put_int(c, g, arch, "feed_forward_length", "intermediate_size", !moe) != 0 ||
        put_int(c, g, arch, "context_length", "max_position_embeddings", false) != 0)
        goto fail;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if (put_num(c, g, key, "rms_norm_eps") != 0)
        goto fail;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if (put_num(c, g, key, "rope_theta") != 0)
        goto fail;
    if (moe) {
        bool norm = true; /* llama.cpp's qwen3moe always normalises the picks' weights */
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        if (gguf_get_bool(g, key, &norm) < 0 || put_int(c, g, arch, "expert_count", "num_experts", true) != 0 ||
            put_int(c, g, arch, "expert_used_count", "num_experts_per_tok", true) != 0 ||
            put_int(c, g, arch, "expert_feed_forward_length", "moe_intermediate_size", true) != 0)
            goto fail;
        json_object_set_new(c, "norm_topk_prob", json_boolean(norm));
        /* layers without a router are dense (transformers' mlp_only_layers) */
        json_t *dense = json_array();
        for (int64_t l = 0; l < json_integer_value(json_object_get(c, "num_hidden_layers")); l++) {
            snprintf(key, sizeof key, "blk.%lld.ffn_gate_inp.weight", (long long)l);
            if (!gguf_find(g, key))
                json_array_append_new(dense, json_integer(l));
        }
        json_object_set_new(c, "mlp_only_layers", dense);
        if (!json_object_get(c, "intermediate_size"))
            json_object_set(c, "intermediate_size", json_object_get(c, "moe_intermediate_size"));
    }
    const char *st;
    size_t sn;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_get_str(g, key, &st, &sn) == 0 && !(sn == 4 && memcmp(st, "none", 4) == 0)) {
        json_t *rs = json_object();
        json_object_set_new(rs, "rope_type", json_stringn(st, sn));
        json_object_set_new(c, "rope_scaling", rs);
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if (put_num(rs, g, key, "factor") != 0 ||
            put_int(rs, g, arch, "rope.scaling.original_context_length", "original_max_position_embeddings",
                    false) != 0)
            goto fail;
    }
    json_object_set_new(c, "tie_word_embeddings", json_boolean(gguf_find(g, "output.weight") == NULL));
    return c;
fail:
    json_decref(c);
    return NULL;
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
        if (put_num(gen, g, sampling[i].key, sampling[i].field) != 0)
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

/* One view: a tensor of g (or slice e of its outermost dimension when e >= 0)
 * under name, with its shape reversed. */
static int add_view(struct safetensors *st, const struct gguf_tensor *t, const char *name, int32_t e)
{
    struct st_tensor *v = &st->tensors[st->n_tensors];
    memset(v, 0, sizeof *v);
    v->name = strdup(name);
    if (!v->name)
        return err_set("gguf: out of memory");
    st->n_tensors++;
    v->type = t->type;
    v->file = t->file;
    v->n_dim = e >= 0 ? t->n_dim - 1 : t->n_dim;
    for (int32_t d = 0; d < v->n_dim; d++)
        v->shape[d] = t->ne[v->n_dim - 1 - d];
    v->n_bytes = e >= 0 ? t->n_bytes / (size_t)t->ne[t->n_dim - 1] : t->n_bytes;
    v->data = (const char *)t->data + (e >= 0 ? (size_t)e * v->n_bytes : 0);
    return 0;
}

int gguf_hf_tensors(const struct gguf *g, const struct model_config *c, struct safetensors *st)
{
    memset(st, 0, sizeof *st);
    int64_t n_views = 0;
    for (int64_t i = 0; i < g->n_tensors; i++)
        n_views += strstr(g->tensors[i].name, "_exps.") && g->tensors[i].n_dim == 3 ? g->tensors[i].ne[2] : 1;
    st->tensors = calloc((size_t)(n_views ? n_views : 1), sizeof *st->tensors);
    if (!st->tensors)
        return err_set("gguf: out of memory");
    char name[256];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        int layer = -1, used = 0;
        bool found = false;
        if (sscanf(t->name, "blk.%d.%n", &layer, &used) == 1 && used > 0 && layer >= 0 && layer < c->n_layer) {
            const char *rest = t->name + used;
            for (size_t k = 0; !found && k < sizeof layer_names / sizeof layer_names[0]; k++)
                if (strcmp(rest, layer_names[k].gguf) == 0) {
                    snprintf(name, sizeof name, "%slayers.%d.%s", c->prefix, layer, layer_names[k].hf);
                    if (add_view(st, t, name, -1) != 0)
                        goto fail;
                    found = true;
                }
            for (size_t k = 0; !found && k < sizeof expert_names / sizeof expert_names[0]; k++)
                if (strcmp(rest, expert_names[k].gguf) == 0) {
                    if (t->n_dim != 3) {
                        err_set("gguf: %s: tensor '%s' has %d dimensions; stacked experts have 3", t->file, t->name,
                                (int)t->n_dim);
                        goto fail;
                    }
                    for (int64_t e = 0; e < t->ne[2]; e++) {
                        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%lld.%s", c->prefix, layer,
                                 (long long)e, expert_names[k].hf);
                        if (add_view(st, t, name, (int32_t)e) != 0)
                            goto fail;
                    }
                    found = true;
                }
        }
        for (size_t k = 0; !found && k < sizeof global_names / sizeof global_names[0]; k++)
            if (strcmp(t->name, global_names[k].gguf) == 0) {
                if (add_view(st, t, global_names[k].hf, -1) != 0)
                    goto fail;
                found = true;
            }
        if (!found) {
            err_set("gguf: %s: tensor '%s' is not one of architecture %s's", t->file, t->name, c->model_type);
            goto fail;
        }
    }
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_name);
    return 0;
fail:
    st_close(st);
    return -1;
}
