/* convert: checkpoints to GGUF by a recipe (see convert.h). The tensor names,
 * metadata keys and tokenizer layout are those llama.cpp's converter writes,
 * so that its loader reads the result. */
#define _GNU_SOURCE
#include "convert.h"

#include "../base/err.h"
#include "../base/pool.h"
#include "../quant/quant.h"
#include "fp8.h"
#include "gguf.h"
#include "imatrix.h"
#include "model.h"
#include "safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const convert_recipes[] = {"Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "Q2_MOE",
                                       "F16",  "BF16", "F32",    NULL};

/* llama.cpp's choice of layers that get more bits in the _M mixes: the
 * first and last eighth, and every third layer between. */
static bool more_bits(int32_t l, int32_t n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }

/* The type for rows of `cols` columns: t, or the fallback llama.cpp writes
 * when the columns do not split into t's blocks. */
static enum dtype fit_cols(enum dtype t, int64_t cols)
{
    if (cols % dtype_block(t) == 0)
        return t;
    enum dtype f = t == DT_Q4_K ? DT_Q5_0 : t == DT_Q5_K ? DT_Q5_1 : t == DT_Q6_K ? DT_Q8_0 : DT_IQ4_NL;
    return cols % dtype_block(f) == 0 ? f : DT_F16;
}

int convert_recipe_type(const char *recipe, enum convert_role role, int32_t layer, int32_t n_layer, int64_t cols,
                        enum dtype *out)
{
    enum dtype t;
    const bool mb = more_bits(layer, n_layer);
    if (role == ROLE_VECTOR) {
        *out = DT_F32;
        return 0;
    }
    if (strcmp(recipe, "F16") == 0 || strcmp(recipe, "BF16") == 0 || strcmp(recipe, "F32") == 0 ||
        strcmp(recipe, "Q8_0") == 0) {
        dtype_parse(recipe, &t);
    } else if (strcmp(recipe, "Q6_K") == 0) {
        t = DT_Q6_K;
    } else if (strcmp(recipe, "Q5_K_M") == 0 || strcmp(recipe, "Q4_K_M") == 0) {
        const enum dtype base = recipe[1] == '5' ? DT_Q5_K : DT_Q4_K;
        t = role == ROLE_OUTPUT                                                          ? DT_Q6_K
            : (role == ROLE_ATTN_V || role == ROLE_FFN_DOWN || role == ROLE_EXP_DOWN) && mb ? DT_Q6_K
                                                                                          : base;
    } else if (strcmp(recipe, "Q3_K_M") == 0) {
        t = role == ROLE_OUTPUT                                  ? DT_Q6_K
            : role == ROLE_ATTN_V                                ? (layer < 2 ? DT_Q5_K : DT_Q4_K)
            : role == ROLE_FFN_DOWN || role == ROLE_EXP_DOWN     ? (layer < n_layer / 16 ? DT_Q5_K : mb ? DT_Q4_K : DT_Q3_K)
            : role == ROLE_ATTN_O                                ? DT_Q4_K
                                                                 : DT_Q3_K;
    } else if (strcmp(recipe, "Q2_K") == 0) {
        t = role == ROLE_OUTPUT                                                      ? DT_Q6_K
            : role == ROLE_ATTN_V || role == ROLE_FFN_DOWN || role == ROLE_EXP_DOWN ? DT_Q3_K
            : role == ROLE_EMBED                                                     ? DT_Q4_K
                                                                                     : DT_Q2_K;
    } else if (strcmp(recipe, "Q2_MOE") == 0) {
        /* the experts hold nearly all of a MoE model's bytes: 2-3 bits there, more elsewhere */
        t = role == ROLE_EXP_UP     ? DT_Q2_K
            : role == ROLE_EXP_DOWN ? DT_Q3_K
            : role == ROLE_OUTPUT   ? DT_Q8_0
            : role == ROLE_EMBED || role == ROLE_ATTN_V || role == ROLE_FFN_DOWN ? DT_Q6_K
            : role == ROLE_ROUTER   ? DT_Q8_0
                                    : DT_Q5_K;
    } else if (dtype_parse(recipe, &t) != 0 || t == DT_I32 || !quant_can_quantize(t)) {
        return err_set("quantize: '%s' is neither a recipe (Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q3_K_M, Q2_K, Q2_MOE, F16, "
                       "BF16, F32) nor a type to write every matrix in (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                       "Q5_K, IQ4_NL, IQ4_XS, IQ2_XXS)",
                       recipe);
    }
    *out = fit_cols(t, cols);
    return 0;
}

/* ---- the plan: every GGUF tensor, where its data comes from ---- */

struct plan_tensor {
    char name[96];           /* GGUF's */
    enum convert_role role;
    int32_t layer;
    int32_t n_dim;
    int64_t ne[3];           /* GGUF order: ne[0] the columns */
    enum dtype type;         /* written */
    /* source: one tensor (n_src 1), or one per expert, or a row range of each
     * expert's slice of a fused tensor */
    const struct st_tensor *src[1024];
    int32_t n_src;
    bool fused;              /* src[e] all one [E][height][cols] tensor, rows row0.. of slice e */
    int64_t row0;
};

struct plan {
    struct model_config cfg;
    struct safetensors st;
    struct gguf gg;          /* a GGUF source's mapping */
    struct plan_tensor *t;
    int32_t n, cap;
};

static struct plan_tensor *plan_add(struct plan *p, const char *name, enum convert_role role, int32_t layer,
                                    int64_t rows, int64_t cols, int64_t n_exp)
{
    if (p->n == p->cap) {
        int32_t cap = p->cap ? 2 * p->cap : 64;
        struct plan_tensor *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t) {
            err_set("quantize: out of memory");
            return NULL;
        }
        p->t = t;
        p->cap = cap;
    }
    struct plan_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->role = role;
    t->layer = layer;
    t->n_dim = n_exp ? 3 : rows ? 2 : 1;
    t->ne[0] = cols;
    t->ne[1] = rows ? rows : 1;
    t->ne[2] = n_exp ? n_exp : 1;
    return t;
}

static int plan_source(struct plan *p, struct plan_tensor *t, const char *hf, int64_t rows, int64_t cols)
{
    const struct st_tensor *s = st_find(&p->st, hf);
    if (!s)
        return err_set("quantize: the source has no tensor '%s'", hf);
    const int64_t want = rows ? rows * cols : cols;
    int64_t numel = 1;
    for (int32_t d = 0; d < s->n_dim; d++)
        numel *= s->shape[d];
    if (numel != want || s->shape[s->n_dim - 1] != cols)
        return err_set("quantize: %s: tensor '%s' does not have the shape the config gives", s->file, hf);
    t->src[t->n_src++] = s;
    return 0;
}

/* One tensor with one source. */
static int plan_one(struct plan *p, const char *gguf, const char *hf, enum convert_role role, int32_t layer,
                    int64_t rows, int64_t cols)
{
    struct plan_tensor *t = plan_add(p, gguf, role, layer, rows, cols, 0);
    return t ? plan_source(p, t, hf, rows, cols) : -1;
}

/* A MoE layer's experts of one projection: per-expert tensors, or a slice of
 * transformers 5's fused [E][2I][H] gate_up / [E][H][I] down tensors. */
static int plan_experts(struct plan *p, int32_t l, const char *gguf, const char *proj, enum convert_role role,
                        int64_t rows, int64_t cols)
{
    const struct model_config *c = &p->cfg;
    char name[160], hf[192];
    snprintf(name, sizeof name, "blk.%d.%s", l, gguf);
    struct plan_tensor *t = plan_add(p, name, role, l, rows, cols, c->n_expert);
    if (!t)
        return -1;
    if (c->n_expert > (int32_t)(sizeof t->src / sizeof t->src[0]))
        return err_set("quantize: %d experts a layer is more than this writer takes", (int)c->n_expert);
    const bool down = strcmp(proj, "down_proj") == 0;
    snprintf(hf, sizeof hf, "%slayers.%d.mlp.experts.%s", c->prefix, l, down ? "down_proj" : "gate_up_proj");
    const struct st_tensor *fused = st_find(&p->st, hf);
    if (fused) {
        if (fused->n_dim != 3 || fused->shape[0] != c->n_expert || fused->shape[1] != (down ? rows : 2 * rows) ||
            fused->shape[2] != cols)
            return err_set("quantize: %s: tensor '%s' does not have the shape the config gives", fused->file, hf);
        for (int32_t e = 0; e < c->n_expert; e++)
            t->src[t->n_src++] = fused;
        t->fused = true;
        t->row0 = strcmp(proj, "up_proj") == 0 ? rows : 0;
        return 0;
    }
    for (int32_t e = 0; e < c->n_expert; e++) {
        snprintf(hf, sizeof hf, "%slayers.%d.mlp.experts.%d.%s.weight", c->prefix, l, e, proj);
        if (plan_source(p, t, hf, rows, cols) != 0)
            return -1;
    }
    return 0;
}

static int plan_build(struct plan *p)
{
    const struct model_config *c = &p->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size, hd = c->head_dim;
    char g[96], hf[192];
    if (c->arch != ARCH_QWEN3 && c->arch != ARCH_QWEN3_MOE)
        return err_set("quantize: model_type '%s' cannot be written as GGUF yet (qwen3, qwen3_moe)", c->model_type);
    snprintf(hf, sizeof hf, "%sembed_tokens.weight", c->prefix);
    /* a tied embedding is also the LM head: the head's type */
    if (plan_one(p, "token_embd.weight", hf, c->tie_embeddings ? ROLE_OUTPUT : ROLE_EMBED, 0, V, H) != 0)
        return -1;
    snprintf(hf, sizeof hf, "%snorm.weight", c->prefix);
    if (plan_one(p, "output_norm.weight", hf, ROLE_VECTOR, 0, 0, H) != 0)
        return -1;
    if (!c->tie_embeddings && plan_one(p, "output.weight", "lm_head.weight", ROLE_OUTPUT, 0, V, H) != 0)
        return -1;
    static const struct {
        const char *gguf, *hf;
        enum convert_role role;
        int rows, cols; /* 0 none (a vector), 1 hidden, 2 q heads, 3 kv heads, 4 head_dim, 5 inter, 6 experts */
    } per_layer[] = {
        {"attn_norm", "input_layernorm", ROLE_VECTOR, 0, 1},
        {"attn_q", "self_attn.q_proj", ROLE_ATTN_QK, 2, 1},
        {"attn_k", "self_attn.k_proj", ROLE_ATTN_QK, 3, 1},
        {"attn_v", "self_attn.v_proj", ROLE_ATTN_V, 3, 1},
        {"attn_output", "self_attn.o_proj", ROLE_ATTN_O, 1, 2},
        {"attn_q_norm", "self_attn.q_norm", ROLE_VECTOR, 0, 4},
        {"attn_k_norm", "self_attn.k_norm", ROLE_VECTOR, 0, 4},
        {"ffn_norm", "post_attention_layernorm", ROLE_VECTOR, 0, 1},
    };
    for (int32_t l = 0; l < c->n_layer; l++) {
        const int64_t dims[] = {0, H, (int64_t)c->n_head * hd, (int64_t)c->n_kv_head * hd, hd,
                                c->intermediate_size, c->n_expert};
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++) {
            snprintf(g, sizeof g, "blk.%d.%s.weight", l, per_layer[i].gguf);
            snprintf(hf, sizeof hf, "%slayers.%d.%s.weight", c->prefix, l, per_layer[i].hf);
            if (plan_one(p, g, hf, per_layer[i].role, l, dims[per_layer[i].rows], dims[per_layer[i].cols]) != 0)
                return -1;
        }
        if (c->layer_ffn[l] == FFN_MOE) {
            const int64_t I = c->moe_intermediate_size;
            snprintf(g, sizeof g, "blk.%d.ffn_gate_inp.weight", l);
            snprintf(hf, sizeof hf, "%slayers.%d.mlp.gate.weight", c->prefix, l);
            if (plan_one(p, g, hf, ROLE_ROUTER, l, c->n_expert, H) != 0 ||
                plan_experts(p, l, "ffn_gate_exps.weight", "gate_proj", ROLE_EXP_UP, I, H) != 0 ||
                plan_experts(p, l, "ffn_up_exps.weight", "up_proj", ROLE_EXP_UP, I, H) != 0 ||
                plan_experts(p, l, "ffn_down_exps.weight", "down_proj", ROLE_EXP_DOWN, H, I) != 0)
                return -1;
        } else {
            const int64_t I = c->intermediate_size;
            static const char *const proj[3][2] = {{"ffn_gate", "gate_proj"}, {"ffn_up", "up_proj"},
                                                   {"ffn_down", "down_proj"}};
            for (int i = 0; i < 3; i++) {
                snprintf(g, sizeof g, "blk.%d.%s.weight", l, proj[i][0]);
                snprintf(hf, sizeof hf, "%slayers.%d.mlp.%s.weight", c->prefix, l, proj[i][1]);
                if (plan_one(p, g, hf, i == 2 ? ROLE_FFN_DOWN : ROLE_FFN_UP, l, i == 2 ? H : I, i == 2 ? I : H) != 0)
                    return -1;
            }
        }
    }
    return 0;
}

/* bits a weight of t takes */
static double type_bits(enum dtype t) { return 8.0 * (double)dtype_block_bytes(t) / (double)dtype_block(t); }

static int plan_types(struct plan *p, const struct convert_opts *o)
{
    for (int32_t i = 0; i < p->n; i++) {
        struct plan_tensor *t = &p->t[i];
        if (convert_recipe_type(o->recipe, t->role, t->layer, p->cfg.n_layer, t->ne[0], &t->type) != 0)
            return -1;
        /* a lossy source is never spread over more bits than it has */
        const enum dtype s = t->src[0]->type;
        if (dtype_is_block(s) && dtype_is_block(t->type) && type_bits(t->type) >= type_bits(s) &&
            t->ne[0] % dtype_block(s) == 0)
            t->type = s;
    }
    return 0;
}

/* ---- metadata ---- */

static void write_config(struct gguf_writer *w, const struct model_config *c, const char *name)
{
    const char *arch = c->arch == ARCH_QWEN3_MOE ? "qwen3moe" : "qwen3";
    char k[128];
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    gguf_writer_kv_str(w, "general.architecture", arch);
    gguf_writer_kv_str(w, "general.name", name);
    gguf_writer_kv_u32(w, "general.quantization_version", 2);
    gguf_writer_kv_u32(w, KEY("context_length"), (uint32_t)c->max_position);
    gguf_writer_kv_u32(w, KEY("embedding_length"), (uint32_t)c->hidden_size);
    gguf_writer_kv_u32(w, KEY("block_count"), (uint32_t)c->n_layer);
    gguf_writer_kv_u32(w, KEY("feed_forward_length"), (uint32_t)c->intermediate_size);
    gguf_writer_kv_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head);
    gguf_writer_kv_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_head);
    gguf_writer_kv_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
    gguf_writer_kv_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    gguf_writer_kv_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps);
    gguf_writer_kv_f32(w, KEY("rope.freq_base"), c->rope_theta);
    if (c->rope_type != ROPE_DEFAULT) {
        gguf_writer_kv_str(w, KEY("rope.scaling.type"), c->rope_type == ROPE_YARN ? "yarn" : "linear");
        gguf_writer_kv_f32(w, KEY("rope.scaling.factor"), c->rope_factor);
        if (c->rope_type == ROPE_YARN)
            gguf_writer_kv_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)c->rope_orig_max);
    }
    if (c->arch == ARCH_QWEN3_MOE) {
        gguf_writer_kv_u32(w, KEY("expert_count"), (uint32_t)c->n_expert);
        gguf_writer_kv_u32(w, KEY("expert_used_count"), (uint32_t)c->n_expert_used);
        gguf_writer_kv_u32(w, KEY("expert_feed_forward_length"), (uint32_t)c->moe_intermediate_size);
        gguf_writer_kv_bool(w, KEY("expert_weights_norm"), c->norm_topk_prob);
    }
#undef KEY
}

static json_t *load_json(const char *dir, const char *file)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        err_set("quantize: %s: %s", path, je.text);
    return j;
}

/* tokenizer.ggml.* from tokenizer.json as llama.cpp's converter writes a
 * byte-level BPE vocabulary: every id up to the model's vocabulary size
 * (ids with no token as "[PADn]", unused), added tokens as control (special)
 * or user-defined, merges as "a b". */
static int write_vocab_folder(struct gguf_writer *w, const char *dir, const struct model_config *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) != 0)
        return 0; /* weights alone (a test fixture): a GGUF Kapitsa loads, llama.cpp does not */
    json_t *tj = load_json(dir, "tokenizer.json"), *tc = tj ? load_json(dir, "tokenizer_config.json") : NULL;
    char **tok = NULL, **merges = NULL;
    int32_t *type = NULL;
    int rc = -1;
    size_t n_merges = 0;
    if (!tc)
        goto done;
    json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab");
    json_t *mj = json_object_get(json_object_get(tj, "model"), "merges"), *adds = json_object_get(tj, "added_tokens");
    if (!json_is_object(vocab) || !json_is_array(mj)) {
        err_set("quantize: %s/tokenizer.json: no BPE model vocab and merges", dir);
        goto done;
    }
    const int64_t n = c->vocab_size;
    tok = calloc((size_t)n, sizeof *tok);
    type = calloc((size_t)n, sizeof *type);
    merges = calloc(json_array_size(mj) + 1, sizeof *merges);
    if (!tok || !type || !merges) {
        err_set("quantize: out of memory");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        const json_int_t id = json_integer_value(v);
        if (json_is_integer(v) && id >= 0 && id < n && !tok[id]) {
            tok[id] = strdup(key);
            type[id] = 1;
        }
    }
    size_t i;
    json_array_foreach(adds, i, v)
    {
        const json_int_t id = json_integer_value(json_object_get(v, "id"));
        const char *s = json_string_value(json_object_get(v, "content"));
        if (s && id >= 0 && id < n) {
            free(tok[id]);
            tok[id] = strdup(s);
            type[id] = json_is_true(json_object_get(v, "special")) ? 3 : 4;
        }
    }
    for (int64_t id = 0; id < n; id++)
        if (!tok[id]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%lld]", (long long)id);
            tok[id] = strdup(pad);
            type[id] = 5;
        }
    json_array_foreach(mj, i, v)
    {
        if (json_is_string(v))
            merges[n_merges++] = strdup(json_string_value(v));
        else if (json_is_array(v) && json_array_size(v) == 2) {
            char *m = NULL;
            if (asprintf(&m, "%s %s", json_string_value(json_array_get(v, 0)) ?: "",
                         json_string_value(json_array_get(v, 1)) ?: "") > 0)
                merges[n_merges++] = m;
        }
    }
    for (int64_t id = 0; id < n; id++)
        if (!tok[id]) {
            err_set("quantize: out of memory");
            goto done;
        }
    gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_kv_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n);
    gguf_writer_kv_arr_i32(w, "tokenizer.ggml.token_type", type, (uint64_t)n);
    gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
    if (c->n_eos > 0)
        gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id[0]);
    if (c->bos_id >= 0)
        gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id);
    const char *pad = json_string_value(json_object_get(tc, "pad_token"));
    for (int64_t id = 0; pad && id < n; id++)
        if (strcmp(tok[id], pad) == 0) {
            gguf_writer_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)id);
            break;
        }
    gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", false);
    const char *tpl = json_string_value(json_object_get(tc, "chat_template"));
    if (tpl)
        gguf_writer_kv_str(w, "tokenizer.chat_template", tpl);
    rc = 0;
done:
    for (int64_t id = 0; tok && id < c->vocab_size; id++)
        free(tok[id]);
    for (size_t m = 0; merges && m < n_merges; m++)
        free(merges[m]);
    free(tok);
    free(type);
    free(merges);
    json_decref(tj);
    json_decref(tc);
    return rc;
}

/* A GGUF source's tokenizer.* KVs, as they are. */
static int write_vocab_gguf(struct gguf_writer *w, const struct gguf *g)
{
    for (int64_t i = 0; i < g->n_kv; i++) {
        const struct gguf_kv *kv = &g->kv[i];
        if (strncmp(kv->key, "tokenizer.", 10) != 0)
            continue;
        if (kv->type == GGUF_STRING) {
            char *s = strndup(kv->str.p, kv->str.n);
            if (!s)
                return err_set("quantize: out of memory");
            gguf_writer_kv_str(w, kv->key, s);
            free(s);
        } else if (kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING) {
            char **s = calloc(kv->n + 1, sizeof *s);
            uint64_t k = 0;
            for (; s && k < kv->n && (s[k] = strndup(kv->strs[k].p, kv->strs[k].n)); k++)
                ;
            if (s && k == kv->n)
                gguf_writer_kv_arr_str(w, kv->key, (const char *const *)s, kv->n);
            for (uint64_t j = 0; s && j < k; j++)
                free(s[j]);
            free(s);
            if (k != kv->n)
                return err_set("quantize: out of memory");
        } else if (kv->type == GGUF_ARRAY) {
            gguf_writer_kv_arr(w, kv->key, kv->arr_type, kv->arr, kv->n);
        } else if (kv->type == GGUF_BOOL) {
            gguf_writer_kv_bool(w, kv->key, kv->v.b);
        } else if (kv->type == GGUF_F32 || kv->type == GGUF_F64) {
            gguf_writer_kv_f32(w, kv->key, (float)kv->v.f);
        } else if (kv->type == GGUF_I8 || kv->type == GGUF_I16 || kv->type == GGUF_I32 || kv->type == GGUF_I64) {
            gguf_writer_kv_i32(w, kv->key, (int32_t)kv->v.i);
        } else {
            gguf_writer_kv_u32(w, kv->key, (uint32_t)kv->v.u);
        }
    }
    return 0;
}

/* ---- the data ---- */

struct fill_ctx {
    struct plan *p;
    struct pool *pool;
    const struct convert_opts *o;
    int failed;
    uint64_t done_bytes, total_bytes;
};

/* one task: rows [r0, r1) of slice e of a tensor, source values to fp32 then the written type */
struct rows_job {
    const struct plan_tensor *t;
    const struct fp8_weight *fp8; /* [n_src] the scales of the F8_E4M3 sources, or NULL when there are none */
    uint8_t *dst;
    int64_t rows_per_task;
    float *scratch; /* [threads][cols] */
    uint16_t *bf16; /* [threads][cols] with fp8 */
    const float *imp; /* [experts][cols] importance, or NULL */
    int failed;
};

static void rows_task(void *ctx, int32_t task, int32_t worker)
{
    struct rows_job *j = ctx;
    const struct plan_tensor *t = j->t;
    const int64_t cols = t->ne[0], rows = t->ne[1], per = rows * t->ne[2];
    const int64_t r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task < per ? r0 + j->rows_per_task : per;
    float *x = j->scratch + worker * cols;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t e = r / rows, row = r % rows;
        const struct st_tensor *s = t->src[e];
        const int64_t src_row = t->fused ? e * s->shape[1] + t->row0 + row : row;
        if (s->type == DT_F8_E4M3) { /* the BF16 values a model loads from it */
            uint16_t *h = j->bf16 + worker * cols;
            fp8_rows_bf16(&j->fp8[e], src_row, 1, h);
            quant_dequant(DT_BF16, h, cols, x);
        } else {
            quant_dequant(s->type, (const char *)s->data + dtype_bytes(s->type, src_row * cols), cols, x);
        }
        const float *imp = j->imp ? j->imp + e * cols : NULL;
        if (quant_quantize(t->type, x, cols, imp, j->dst + dtype_bytes(t->type, r * cols)) != 0)
            j->failed = 1;
    }
}

static void fill(void *ctx, int32_t i, void *buf, size_t n_bytes)
{
    struct fill_ctx *f = ctx;
    const struct plan_tensor *t = &f->p->t[i];
    const int64_t cols = t->ne[0], per = t->ne[1] * t->ne[2];
    if (f->o->progress)
        f->o->progress(f->o->progress_ctx, (int64_t)f->done_bytes, (int64_t)f->total_bytes, t->name);
    bool same = !t->fused;
    for (int32_t s = 0; same && s < t->n_src; s++)
        same = t->src[s]->type == t->type;
    if (same) { /* stored as written: the bytes as they are */
        size_t off = 0;
        for (int32_t s = 0; s < t->n_src; s++) {
            memcpy((char *)buf + off, t->src[s]->data, t->src[s]->n_bytes);
            off += t->src[s]->n_bytes;
        }
    } else {
        const int32_t nth = pool_n_threads(f->pool);
        struct rows_job j = {t, NULL, buf, per / (nth * 16) > 0 ? per / (nth * 16) : 1, NULL, NULL, NULL, 0};
        j.scratch = malloc((size_t)(cols * nth) * sizeof(float));
        const bool want_imp = f->o->im && dtype_is_block(t->type);
        float *imp = want_imp ? malloc((size_t)(cols * t->ne[2]) * sizeof(float)) : NULL;
        /* FP8 sources (checked when the source was opened): their scales, a row of BF16 a worker */
        bool any_fp8 = false, fp8_ok = true;
        for (int32_t s = 0; s < t->n_src; s++)
            any_fp8 |= t->src[s]->type == DT_F8_E4M3;
        struct fp8_weight *fp8 = any_fp8 ? calloc((size_t)t->n_src, sizeof *fp8) : NULL;
        for (int32_t s = 0; fp8 && s < t->n_src; s++)
            if (t->src[s]->type == DT_F8_E4M3)
                fp8_ok &= fp8_find(&f->p->st, &f->p->cfg, t->src[s], &fp8[s]) == 0;
        j.fp8 = fp8;
        j.bf16 = fp8 ? malloc((size_t)(cols * nth) * sizeof(uint16_t)) : NULL;
        if (!j.scratch || (want_imp && !imp) || (any_fp8 && (!fp8 || !j.bf16 || !fp8_ok))) {
            free(j.scratch);
            free(imp);
            free(fp8);
            free(j.bf16);
            f->failed = 1;
            memset(buf, 0, n_bytes);
            return;
        }
        /* sizes were checked before writing: an entry fits, or there is none */
        for (int32_t e = 0; imp && e < t->ne[2]; e++)
            if (imatrix_importance(f->o->im, t->name, cols, (int32_t)t->ne[2], e, imp + e * cols) != 0) {
                free(imp);
                imp = NULL;
            }
        j.imp = imp;
        pool_run(f->pool, rows_task, &j, (int32_t)((per + j.rows_per_task - 1) / j.rows_per_task));
        free(j.scratch);
        free(imp);
        free(fp8);
        free(j.bf16);
        f->failed |= j.failed;
    }
    f->done_bytes += n_bytes;
}

/* Every importance entry of a tensor the plan quantises fits its shape (as
 * llama-quantize refuses one that does not), and quantize.imatrix.* as
 * llama-quantize writes them. */
static int plan_imatrix(const struct plan *p, const struct imatrix *im, struct gguf_writer *w)
{
    int64_t cols = 1;
    for (int32_t i = 0; i < p->n; i++)
        cols = p->t[i].ne[0] > cols ? p->t[i].ne[0] : cols;
    float *imp = malloc((size_t)cols * sizeof(float));
    if (!imp)
        return err_set("quantize: out of memory");
    int rc = 0;
    for (int32_t i = 0; i < p->n && rc == 0; i++)
        if (dtype_is_block(p->t[i].type))
            rc = imatrix_importance(im, p->t[i].name, p->t[i].ne[0], (int32_t)p->t[i].ne[2], 0, imp) < 0 ? -1 : 0;
    free(imp);
    if (rc != 0)
        return -1;
    gguf_writer_kv_str(w, "quantize.imatrix.file", im->path ? im->path : "");
    if (im->n_datasets > 0)
        gguf_writer_kv_str(w, "quantize.imatrix.dataset", im->datasets[0]);
    gguf_writer_kv_u32(w, "quantize.imatrix.entries_count", (uint32_t)im->n);
    if (im->chunk_count > 0)
        gguf_writer_kv_u32(w, "quantize.imatrix.chunks_count", (uint32_t)im->chunk_count);
    return 0;
}

int convert_write(const char *src, const char *out, const struct convert_opts *o)
{
    struct plan p = {0};
    struct gguf_writer *w = NULL;
    struct fill_ctx f = {&p, NULL, o, 0, 0, 0};
    int rc = -1;
    if (model_source_open(src, &p.cfg, &p.st, &p.gg) != 0 || plan_build(&p) != 0 || plan_types(&p, o) != 0)
        goto done;
    if (gguf_writer_init(&w, out) != 0)
        goto done;
    const char *base = strrchr(src, '/');
    write_config(w, &p.cfg, base && base[1] ? base + 1 : src);
    if (o->im && plan_imatrix(&p, o->im, w) != 0)
        goto done;
    if ((p.gg.n_files ? write_vocab_gguf(w, &p.gg) : write_vocab_folder(w, src, &p.cfg)) != 0)
        goto done;
    for (int32_t i = 0; i < p.n; i++) {
        if (gguf_writer_tensor(w, p.t[i].name, p.t[i].type, p.t[i].n_dim, p.t[i].ne) != 0)
            goto done;
        f.total_bytes += dtype_bytes(p.t[i].type, p.t[i].ne[0]) * (uint64_t)(p.t[i].ne[1] * p.t[i].ne[2]);
    }
    if (!(f.pool = pool_init((int32_t)sysconf(_SC_NPROCESSORS_ONLN))))
        goto done;
    rc = gguf_writer_finish(w, fill, &f);
    w = NULL;
    if (o->progress)
        o->progress(o->progress_ctx, (int64_t)f.total_bytes, (int64_t)f.total_bytes, NULL);
    if (rc == 0 && f.failed) {
        unlink(out);
        rc = err_set("quantize: a tensor could not be quantised");
    }
done:
    gguf_writer_free(w);
    if (f.pool)
        pool_free(f.pool);
    st_close(&p.st);
    gguf_close(&p.gg);
    free(p.t);
    return rc;
}
