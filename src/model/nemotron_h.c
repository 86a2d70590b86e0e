/* nemotron_h: weight binding and forward of Nemotron-H (see nemotron_h.h).
 * Reference: transformers modeling_nemotron_h.py:
 *   x = embed(ids)
 *   per layer (one block each): x += mixer(rmsnorm(x)), the mixer being
 *     Mamba2: [z | xBC | dt] = h Win^T; xBC = silu(causal conv(xBC) + bias);
 *       y = SSD scan(x, B, C, dt) + D x; y = w * groupnorm(y * silu(z)); y Wout^T
 *     attention: plain GQA without rope or QK-norm
 *     MLP: down(relu(up h)^2)
 *     MoE: sigmoid router with score-correction bias and group-limited top-k,
 *       relu^2 experts scaled by routed_scaling_factor, plus a shared relu^2 MLP
 *   logits = rmsnorm(x) lm_head^T */
#include "nemotron_h.h"

#include "../base/err.h"
#include "layers.h"
#include "weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int bind_moe(struct model *m, struct layer_weights *L, int32_t l)
{
    const struct model_config *c = &m->cfg;
    const int32_t E = c->n_expert, H = c->hidden_size, I = c->moe_intermediate_size, S = c->shared_intermediate_size;
    char name[256];
#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
    if (weights_bind(m, &L->router, NAME("backbone.layers.%d.mixer.gate.weight", l), E, H) != 0 ||
        weights_bind(m, &L->router_bias, NAME("backbone.layers.%d.mixer.gate.e_score_correction_bias", l), 0, E) != 0)
        return -1;
    if (S && (weights_bind(m, &L->sh_up, NAME("backbone.layers.%d.mixer.shared_experts.up_proj.weight", l), S, H) ||
              weights_bind(m, &L->sh_down, NAME("backbone.layers.%d.mixer.shared_experts.down_proj.weight", l), H, S)))
        return -1;
    L->ex_up = calloc((size_t)E, sizeof(struct tensor));
    L->ex_down = calloc((size_t)E, sizeof(struct tensor));
    if (!L->ex_up || !L->ex_down)
        return err_set("model: out of memory");
    L->experts = (struct moe_experts){E, NULL, L->ex_up, L->ex_down};
    if (weights_has(m, NAME("backbone.layers.%d.mixer.experts.up_proj", l))) { /* transformers 5 fused layout */
        if (weights_bind_slices(m, L->ex_up, name, E, I, 0, I, H) != 0)
            return -1;
        return weights_bind_slices(m, L->ex_down, NAME("backbone.layers.%d.mixer.experts.down_proj", l), E, H, 0, H, I);
    }
    for (int32_t e = 0; e < E; e++)
        if (weights_bind(m, &L->ex_up[e], NAME("backbone.layers.%d.mixer.experts.%d.up_proj.weight", l, e), I, H) ||
            weights_bind(m, &L->ex_down[e], NAME("backbone.layers.%d.mixer.experts.%d.down_proj.weight", l, e), H, I))
            return -1;
#undef NAME
    return 0;
}

static int bind_mamba(struct model *m, struct layer_weights *L, int32_t l)
{
    const struct model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, nh = c->ssm_n_head, inner = nh * c->ssm_head_dim, cd = c->rec_conv_dim;
    char name[256];
#define NAME(suffix) (snprintf(name, sizeof name, "backbone.layers.%d.mixer.%s", l, suffix), name)
    if (weights_bind(m, &L->in_proj, NAME("in_proj.weight"), inner + cd + nh, H) != 0 ||
        weights_bind_conv(m, &L->conv_w, NAME("conv1d.weight"), cd, c->conv_kernel) != 0 ||
        (c->ssm_conv_bias && weights_bind(m, &L->conv_b, NAME("conv1d.bias"), 0, cd) != 0) ||
        weights_bind(m, &L->A_log, NAME("A_log"), 0, nh) != 0 || weights_bind(m, &L->D, NAME("D"), 0, nh) != 0 ||
        weights_bind(m, &L->dt_bias, NAME("dt_bias"), 0, nh) != 0 ||
        weights_bind(m, &L->mix_norm, NAME("norm.weight"), 0, inner) != 0 ||
        weights_bind(m, &L->out_proj, NAME("out_proj.weight"), H, inner) != 0)
        return -1;
#undef NAME
    return 0;
}

int nemotron_h_bind(struct model *m)
{
    const struct model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim, I = c->intermediate_size;
    char name[256];
    if (weights_bind(m, &m->embed, "backbone.embeddings.weight", c->vocab_size, H) != 0 ||
        weights_bind(m, &m->out_norm, "backbone.norm_f.weight", 0, H) != 0)
        return -1;
    m->embed_stored = st_find(&m->st, "backbone.embeddings.weight");
    /* transformers' NemotronH never ties: a stored head is the head whatever
     * tie_word_embeddings says (Qwen's classes tie when it is set) */
    if (c->tie_embeddings && weights_has(m, "lm_head.weight"))
        m->cfg.tie_embeddings = false;
    if (c->tie_embeddings)
        m->lm_head = m->embed;
    else if (weights_bind(m, &m->lm_head, "lm_head.weight", c->vocab_size, H) != 0)
        return -1;
    for (int32_t l = 0; l < c->n_layer; l++) {
        struct layer_weights *L = &m->layers[l];
        snprintf(name, sizeof name, "backbone.layers.%d.norm.weight", l);
        if (weights_bind(m, &L->attn_norm, name, 0, H) != 0)
            return -1;
        const uint8_t mix = c->layer_mixer[l], ffn = c->layer_ffn[l];
        if (mix == MIX_MAMBA && bind_mamba(m, L, l) != 0)
            return -1;
        if (ffn == FFN_MOE && bind_moe(m, L, l) != 0)
            return -1;
        const struct {
            struct tensor *dst;
            const char *suffix;
            int64_t rows, cols;
            bool need;
        } b[] = {
            {&L->q, "q_proj.weight", c->n_head * hd, H, mix == MIX_ATTN},
            {&L->k, "k_proj.weight", c->n_kv_head * hd, H, mix == MIX_ATTN},
            {&L->v, "v_proj.weight", c->n_kv_head * hd, H, mix == MIX_ATTN},
            {&L->o, "o_proj.weight", H, c->n_head * hd, mix == MIX_ATTN},
            {&L->up, "up_proj.weight", I, H, ffn == FFN_DENSE},
            {&L->down, "down_proj.weight", H, I, ffn == FFN_DENSE},
        };
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
            snprintf(name, sizeof name, "backbone.layers.%d.mixer.%s", l, b[i].suffix);
            if (b[i].need && weights_bind(m, b[i].dst, name, b[i].rows, b[i].cols) != 0)
                return -1;
        }
    }
    return 0;
}

/* Mamba2 mixer: x += the mixer of RMSNorm(x). p1 holds [z | xBC | dt]; p2 [conv out | y]. */
static void mamba2(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t l, struct tensor *x,
                   int32_t n)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    const int64_t nh = c->ssm_n_head, inner = nh * c->ssm_head_dim, cd = c->rec_conv_dim;
    const int64_t gn = (int64_t)c->ssm_n_group * c->ssm_state;
    struct tensor p1 = tensor_rows(&s->p1, 0, n), p2 = tensor_rows(&s->p2, 0, n);
    struct tensor proj = tensor_cols(&p1, 0, inner + cd + nh);
    layers_norm_in(m, s, &L->attn_norm, 1, (struct tensor *const[]){&proj}, (const struct tensor *const[]){&L->in_proj},
                   x);
    struct tensor z = tensor_cols(&p1, 0, inner), xbc = tensor_cols(&p1, inner, cd), dt = tensor_cols(&p1, inner + cd, nh);
    struct tensor conv = tensor_cols(&p2, 0, cd), y = tensor_cols(&p2, cd, inner);
    const int32_t r = m->rec_layer[l];
    op->conv1d(be, &conv, &xbc, &L->conv_w, c->ssm_conv_bias ? &L->conv_b : NULL, &kv->conv[r]);
    struct tensor xs = tensor_cols(&conv, 0, inner), B = tensor_cols(&conv, inner, gn), C = tensor_cols(&conv, inner + gn, gn);
    const struct ssd_params sp = {
        .n_head = c->ssm_n_head, .head_dim = c->ssm_head_dim, .n_group = c->ssm_n_group, .d_state = c->ssm_state,
        .chunk = c->ssm_chunk, .dt_min = c->ssm_dt_min, .dt_lo = c->ssm_dt_lo, .dt_hi = c->ssm_dt_hi,
    };
    op->ssd(be, &y, &xs, &B, &C, &dt, &L->A_log, &L->D, &L->dt_bias, &kv->ssm[r], &sp);
    op->rmsnorm_gated(be, &y, &y, &z, &L->mix_norm, c->rms_eps, inner / c->ssm_n_group, true);
    layers_residual(m, s, x, &y, &L->out_proj);
}

/* x += attention(RMSNorm(x)) */
static void attention(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t l,
                      struct tensor *x, int32_t n)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct tensor q = tensor_rows(&s->q, 0, n), k = tensor_rows(&s->k, 0, n), v = tensor_rows(&s->v, 0, n);
    struct tensor att = tensor_rows(&s->att, 0, n);
    layers_norm_in(m, s, &L->attn_norm, 3, (struct tensor *const[]){&q, &k, &v},
                   (const struct tensor *const[]){&L->q, &L->k, &L->v}, x);
    struct tensor *kc = &kv->k[m->kv_layer[l]], *vc = &kv->v[m->kv_layer[l]];
    op->kv_store(be, kc, vc, &k, &v);
    op->attention(be, &att, &q, kc, vc, c->n_head, c->n_kv_head, c->head_dim, 1.0f / sqrtf((float)c->head_dim));
    layers_residual(m, s, x, &att, &L->o);
}

void nemotron_h_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                        int32_t n_out, const struct model_trace *trace)
{
    const struct model_config *c = &m->cfg;
    struct tensor x = layers_embed(m, s, n_tokens, trace);
    for (int32_t l = 0; l < c->n_layer; l++) {
        /* a layer is one block: Mamba2, attention, or a feed-forward (MLP or MoE) */
        if (c->layer_mixer[l] == MIX_MAMBA)
            mamba2(m, s, kv, l, &x, n_tokens);
        else if (c->layer_mixer[l] == MIX_ATTN)
            attention(m, s, kv, l, &x, n_tokens);
        else
            layers_ffn(m, s, l, &m->layers[l].attn_norm, &x, n_tokens);
        if (l + 1 < c->n_layer)
            layers_trace(m, trace, l + 1, &x, n_tokens);
    }
    layers_logits(m, s, &x, n_tokens, n_out, trace);
}
