/* qwen3: weight binding and forward for Qwen3 and Qwen3-MoE.
 * Reference: transformers modeling_qwen3.py / modeling_qwen3_moe.py:
 *   x = embed(ids)
 *   per layer: h = rmsnorm(x); q,k,v = h W^T; q,k = per-head rmsnorm (QK-norm);
 *              rope(q,k); a = softmax(q k^T / sqrt(hd) + mask) v; x += a Wo^T
 *              h = rmsnorm(x); x += swiglu MLP(h)  or  top-k softmax-routed experts
 *   logits = rmsnorm(x) lm_head^T */
#include "qwen3.h"

#include "../base/err.h"
#include "layers.h"
#include "weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The shared expert of qwen3_next / qwen3_5_moe and its sigmoid gate. */
static int qwen3_bind_shared(struct model *m, struct layer_weights *L, int32_t l)
{
    const struct model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, S = c->shared_intermediate_size;
    if (S == 0)
        return 0;
    const struct {
        struct tensor *dst;
        const char *suffix;
        int64_t rows, cols;
    } b[] = {
        {&L->sh_gate, "shared_expert.gate_proj.weight", S, H},
        {&L->sh_up, "shared_expert.up_proj.weight", S, H},
        {&L->sh_down, "shared_expert.down_proj.weight", H, S},
        {&L->sh_mix, "shared_expert_gate.weight", 1, H},
    };
    char name[256];
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        snprintf(name, sizeof name, "%slayers.%d.mlp.%s", c->prefix, l, b[i].suffix);
        if (weights_bind(m, b[i].dst, name, b[i].rows, b[i].cols) != 0)
            return -1;
    }
    return 0;
}

int qwen3_bind_moe(struct model *m, struct layer_weights *L, int32_t l)
{
    const struct model_config *c = &m->cfg;
    const int32_t E = c->n_expert, H = c->hidden_size, I = c->moe_intermediate_size;
    const char *pf = c->prefix;
    char name[256];
    snprintf(name, sizeof name, "%slayers.%d.mlp.gate.weight", pf, l);
    if (weights_bind(m, &L->router, name, E, H) != 0)
        return -1;
    L->ex_gate = calloc((size_t)E, sizeof(struct tensor));
    L->ex_up = calloc((size_t)E, sizeof(struct tensor));
    L->ex_down = calloc((size_t)E, sizeof(struct tensor));
    if (!L->ex_gate || !L->ex_up || !L->ex_down)
        return err_set("model: out of memory");
    L->experts = (struct moe_experts){E, L->ex_gate, L->ex_up, L->ex_down};
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", pf, l);
    if (weights_has(m, name)) { /* transformers 5 fused layout */
        if (weights_bind_slices(m, L->ex_gate, name, E, 2 * I, 0, I, H) != 0 ||
            weights_bind_slices(m, L->ex_up, name, E, 2 * I, I, I, H) != 0)
            return -1;
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.down_proj", pf, l);
        if (weights_bind_slices(m, L->ex_down, name, E, H, 0, H, I) != 0)
            return -1;
        return qwen3_bind_shared(m, L, l);
    }
    for (int32_t e = 0; e < E; e++) {
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%d.gate_proj.weight", pf, l, e);
        if (weights_bind(m, &L->ex_gate[e], name, I, H) != 0)
            return -1;
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%d.up_proj.weight", pf, l, e);
        if (weights_bind(m, &L->ex_up[e], name, I, H) != 0)
            return -1;
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%d.down_proj.weight", pf, l, e);
        if (weights_bind(m, &L->ex_down[e], name, H, I) != 0)
            return -1;
    }
    return qwen3_bind_shared(m, L, l);
}

int qwen3_bind_embed(struct model *m)
{
    const struct model_config *c = &m->cfg;
    char name[256];
    snprintf(name, sizeof name, "%sembed_tokens.weight", c->prefix);
    if (weights_bind(m, &m->embed, name, c->vocab_size, c->hidden_size) != 0)
        return -1;
    m->embed_stored = st_find(&m->st, name);
    snprintf(name, sizeof name, "%snorm.weight", c->prefix);
    if (weights_bind_norm(m, &m->out_norm, name, c->hidden_size, c->norm_plus_one) != 0)
        return -1;
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
        return 0;
    }
    return weights_bind(m, &m->lm_head, "lm_head.weight", c->vocab_size, c->hidden_size);
}

int qwen3_bind(struct model *m)
{
    const struct model_config *c = &m->cfg;
    const int32_t H = c->hidden_size, hd = c->head_dim;
    char name[256];
    if (qwen3_bind_embed(m) != 0)
        return -1;
    for (int32_t l = 0; l < c->n_layer; l++) {
        struct layer_weights *L = &m->layers[l];
        struct {
            struct tensor *dst;
            const char *suffix;
            int64_t rows, cols;
        } b[] = {
            {&L->attn_norm, "input_layernorm.weight", 0, H},
            {&L->ffn_norm, "post_attention_layernorm.weight", 0, H},
            {&L->q, "self_attn.q_proj.weight", (int64_t)c->n_head * hd, H},
            {&L->k, "self_attn.k_proj.weight", (int64_t)c->n_kv_head * hd, H},
            {&L->v, "self_attn.v_proj.weight", (int64_t)c->n_kv_head * hd, H},
            {&L->o, "self_attn.o_proj.weight", H, (int64_t)c->n_head * hd},
            {&L->q_norm, "self_attn.q_norm.weight", 0, hd},
            {&L->k_norm, "self_attn.k_norm.weight", 0, hd},
            {&L->gate, "mlp.gate_proj.weight", c->intermediate_size, H},
            {&L->up, "mlp.up_proj.weight", c->intermediate_size, H},
            {&L->down, "mlp.down_proj.weight", H, c->intermediate_size},
        };
        int32_t n_b = c->layer_ffn[l] == FFN_MOE ? 8 : 11;
        for (int32_t i = 0; i < n_b; i++) {
            snprintf(name, sizeof name, "%slayers.%d.%s", c->prefix, l, b[i].suffix);
            if (weights_bind(m, b[i].dst, name, b[i].rows, b[i].cols) != 0)
                return -1;
        }
        if (c->layer_ffn[l] == FFN_MOE && qwen3_bind_moe(m, L, l) != 0)
            return -1;
    }
    return 0;
}

void qwen3_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                   int32_t n_out, const struct model_trace *trace)
{
    const struct model_config *c = &m->cfg;
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    const float scale = 1.0f / sqrtf((float)c->head_dim);
#define ROWS(t) struct tensor t = tensor_rows(&s->t, 0, n_tokens)
    ROWS(q);
    ROWS(k);
    ROWS(v);
    ROWS(att);
#undef ROWS
    struct tensor x = layers_embed(m, s, n_tokens, trace);
    for (int32_t l = 0; l < c->n_layer; l++) {
        const struct layer_weights *L = &m->layers[l];
        layers_norm_in(m, s, &L->attn_norm, 3, (struct tensor *const[]){&q, &k, &v},
                       (const struct tensor *const[]){&L->q, &L->k, &L->v}, &x);
        struct tensor *kc = &kv->k[m->kv_layer[l]], *vc = &kv->v[m->kv_layer[l]];
        const struct attn_prep prep = {&L->q_norm, &L->k_norm, c->rms_eps, c->n_head, c->n_kv_head, c->head_dim,
                                         c->rope_dim, &m->inv_freq, c->rope_attn_factor};
        op->attn_prep(be, &q, &k, &v, kc, vc, &prep);
        op->attention(be, &att, &q, kc, vc, c->n_head, c->n_kv_head, c->head_dim, scale);
        layers_residual(m, s, &x, &att, &L->o);
        layers_ffn(m, s, l, &L->ffn_norm, &x, n_tokens);
        if (l + 1 < c->n_layer)
            layers_trace(m, trace, l + 1, &x, n_tokens);
    }
    layers_logits(m, s, &x, n_tokens, n_out, trace);
}
