/* qwen3_next: weight binding and forward of the Qwen hybrids (see qwen3_next.h).
 * Reference: transformers modeling_qwen3_next.py, modeling_qwen3_5.py:
 *   x = embed(ids); every RMSNorm scales by (1 + w)
 *   per layer: h = norm(x), then
 *     full attention: [q | gate] per head = h Wq^T; q,k per-head norm; partial
 *       rope; a = attention(q, k, v) * sigmoid(gate); x += a Wo^T
 *     Gated DeltaNet: qkv, z, b, a from h (qwen3_next: one fused qkvz and one ba
 *       projection, grouped per key head); qkv = silu(causal conv(qkv));
 *       o = gated delta rule(q, k, v, a, b); o = w * norm(o) * silu(z) per
 *       value head; x += o Wout^T
 *   h = norm(x); x += SwiGLU MLP(h), or routed experts + sigmoid-gated shared expert
 *   logits = norm(x) lm_head^T */
#include "qwen3_next.h"

#include "../base/err.h"
#include "layers.h"
#include "qwen3.h"
#include "weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Column maps from the stored fused layouts to the grouped ones. */
static int qwen3_next_maps(struct model *m)
{
    const struct model_config *c = &m->cfg;
    const int32_t nh = c->n_head, hd = c->head_dim;
    const int32_t Hk = c->lin_n_k_head, Hv = c->lin_n_v_head, dk = c->lin_k_dim, dv = c->lin_v_dim, r = Hv / Hk;
    const int64_t n_qg = 2 * (int64_t)nh * hd, n_qkvz = 2 * (int64_t)Hk * dk + 2 * (int64_t)Hv * dv;
    int32_t *map = malloc((size_t)(n_qg > n_qkvz ? n_qg : n_qkvz) * sizeof(int32_t));
    if (!map)
        return err_set("model: out of memory");
    int rc = 0;
    /* per head [q (hd) | gate (hd)] -> [q of all heads | gates of all heads] */
    for (int32_t h = 0; h < nh; h++)
        for (int32_t i = 0; i < hd; i++) {
            map[h * hd + i] = h * 2 * hd + i;
            map[nh * hd + h * hd + i] = h * 2 * hd + hd + i;
        }
    rc = weights_make_map(m, &m->perm_qg, map, n_qg);
    if (rc == 0 && c->delta_qkvz_fused && c->n_rec_layer) {
        /* per key head g: [q (dk) | k (dk) | v (r*dv) | z (r*dv)] -> [q.. | k.. | v.. | z..] */
        const int32_t W = 2 * dk + 2 * r * dv;
        for (int32_t g = 0; g < Hk; g++) {
            for (int32_t i = 0; i < dk; i++) {
                map[g * dk + i] = g * W + i;
                map[Hk * dk + g * dk + i] = g * W + dk + i;
            }
            for (int32_t i = 0; i < r * dv; i++) {
                map[2 * Hk * dk + g * r * dv + i] = g * W + 2 * dk + i;
                map[2 * Hk * dk + Hv * dv + g * r * dv + i] = g * W + 2 * dk + r * dv + i;
            }
        }
        rc = weights_make_map(m, &m->perm_qkvz, map, n_qkvz);
        /* per key head g: [b (r) | a (r)] -> [b.. | a..] */
        for (int32_t g = 0; rc == 0 && g < Hk; g++)
            for (int32_t i = 0; i < r; i++) {
                map[g * r + i] = g * 2 * r + i;
                map[Hv + g * r + i] = g * 2 * r + r + i;
            }
        if (rc == 0)
            rc = weights_make_map(m, &m->perm_ba, map, 2 * (int64_t)Hv);
    }
    free(map);
    return rc;
}

static int bind_delta(struct model *m, struct layer_weights *L, int32_t l)
{
    const struct model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, Hv = c->lin_n_v_head, vd = Hv * c->lin_v_dim, cd = c->rec_conv_dim;
    char name[256];
#define NAME(suffix) (snprintf(name, sizeof name, "%slayers.%d.linear_attn.%s", c->prefix, l, suffix), name)
    if (c->delta_qkvz_fused) {
        if (weights_bind(m, &L->in_proj, NAME("in_proj_qkvz.weight"), cd + vd, H) != 0 ||
            weights_bind(m, &L->in_b, NAME("in_proj_ba.weight"), 2 * Hv, H) != 0)
            return -1;
    } else if (weights_bind(m, &L->in_proj, NAME("in_proj_qkv.weight"), cd, H) != 0 ||
               weights_bind(m, &L->in_z, NAME("in_proj_z.weight"), vd, H) != 0 ||
               weights_bind(m, &L->in_b, NAME("in_proj_b.weight"), Hv, H) != 0 ||
               weights_bind(m, &L->in_a, NAME("in_proj_a.weight"), Hv, H) != 0) {
        return -1;
    }
    if (weights_bind_conv(m, &L->conv_w, NAME("conv1d.weight"), cd, c->conv_kernel) != 0 ||
        weights_bind(m, &L->A_log, NAME("A_log"), 0, Hv) != 0 ||
        weights_bind(m, &L->dt_bias, NAME("dt_bias"), 0, Hv) != 0 ||
        weights_bind(m, &L->mix_norm, NAME("norm.weight"), 0, c->lin_v_dim) != 0 ||
        weights_bind(m, &L->out_proj, NAME("out_proj.weight"), H, vd) != 0)
        return -1;
#undef NAME
    return 0;
}

int qwen3_next_bind(struct model *m)
{
    const struct model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim, I = c->intermediate_size;
    char name[256];
    if (qwen3_bind_embed(m) != 0 || qwen3_next_maps(m) != 0)
        return -1;
    for (int32_t l = 0; l < c->n_layer; l++) {
        struct layer_weights *L = &m->layers[l];
        const bool attn = c->layer_mixer[l] == MIX_ATTN, dense = c->layer_ffn[l] == FFN_DENSE;
        struct {
            struct tensor *dst;
            const char *suffix;
            int64_t rows, cols;
            bool norm, need;
        } b[] = {
            {&L->attn_norm, "input_layernorm.weight", 0, H, true, true},
            {&L->ffn_norm, "post_attention_layernorm.weight", 0, H, true, true},
            {&L->q, "self_attn.q_proj.weight", (c->attn_out_gate ? 2 : 1) * c->n_head * hd, H, false, attn},
            {&L->k, "self_attn.k_proj.weight", c->n_kv_head * hd, H, false, attn},
            {&L->v, "self_attn.v_proj.weight", c->n_kv_head * hd, H, false, attn},
            {&L->o, "self_attn.o_proj.weight", H, c->n_head * hd, false, attn},
            {&L->q_norm, "self_attn.q_norm.weight", 0, hd, true, attn},
            {&L->k_norm, "self_attn.k_norm.weight", 0, hd, true, attn},
            {&L->gate, "mlp.gate_proj.weight", I, H, false, dense},
            {&L->up, "mlp.up_proj.weight", I, H, false, dense},
            {&L->down, "mlp.down_proj.weight", H, I, false, dense},
        };
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
            if (!b[i].need)
                continue;
            snprintf(name, sizeof name, "%slayers.%d.%s", c->prefix, l, b[i].suffix);
            int rc = b[i].norm ? weights_bind_norm(m, b[i].dst, name, b[i].cols, true)
                               : weights_bind(m, b[i].dst, name, b[i].rows, b[i].cols);
            if (rc != 0)
                return -1;
        }
        if (!attn && bind_delta(m, L, l) != 0)
            return -1;
        if (!dense && qwen3_bind_moe(m, L, l) != 0)
            return -1;
    }
    return 0;
}

/* Gated full attention: x += attention(RMSNorm(x)). */
static void gated_attention(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t l,
                            struct tensor *x, int32_t n)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    const int64_t qd = (int64_t)c->n_head * c->head_dim;
    struct tensor raw = tensor_rows(&s->p1, 0, n), qg = tensor_rows(&s->p2, 0, n);
    struct tensor k = tensor_rows(&s->k, 0, n), v = tensor_rows(&s->v, 0, n), att = tensor_rows(&s->att, 0, n);
    struct tensor q = tensor_rows(&s->q, 0, n), gate = qg;
    if (c->attn_out_gate)
        raw.n_cols = qg.n_cols = 2 * qd;
    layers_norm_in(m, s, &L->attn_norm, 3, (struct tensor *const[]){c->attn_out_gate ? &raw : &q, &k, &v},
                   (const struct tensor *const[]){&L->q, &L->k, &L->v}, x);
    if (c->attn_out_gate) {
        op->permute_cols(be, &qg, &raw, &m->perm_qg);
        q = tensor_cols(&qg, 0, qd);
        gate = tensor_cols(&qg, qd, qd);
    }
    struct tensor *kc = &kv->k[m->kv_layer[l]], *vc = &kv->v[m->kv_layer[l]];
    const struct attn_prep prep = {&L->q_norm, &L->k_norm, c->rms_eps, c->n_head, c->n_kv_head, c->head_dim,
                                     c->rope_dim, &m->inv_freq, c->rope_attn_factor};
    op->attn_prep(be, &q, &k, &v, kc, vc, &prep);
    op->attention(be, &att, &q, kc, vc, c->n_head, c->n_kv_head, c->head_dim, 1.0f / sqrtf((float)c->head_dim));
    if (c->attn_out_gate)
        op->sigmoid_mul(be, &att, &gate);
    layers_residual(m, s, x, &att, &L->o);
}

/* Gated DeltaNet: x += the mixer of RMSNorm(x). p1 holds [qkv (conv_dim) | z | b | a]; p2 the
 * conv output and then the core output. */
static void gated_deltanet(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t l,
                           struct tensor *x, int32_t n)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    const int64_t Hk = c->lin_n_k_head, Hv = c->lin_n_v_head, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const int64_t cd = c->rec_conv_dim, vd = Hv * dv;
    struct tensor p1 = tensor_rows(&s->p1, 0, n), p2 = tensor_rows(&s->p2, 0, n);
    struct tensor qkv = tensor_cols(&p1, 0, cd), z = tensor_cols(&p1, cd, vd), b = tensor_cols(&p1, cd + vd, Hv),
                  a = tensor_cols(&p1, cd + vd + Hv, Hv);
    if (c->delta_qkvz_fused) {
        struct tensor raw = tensor_cols(&p2, 0, cd + vd), raw_ba = tensor_cols(&p2, cd + vd, 2 * Hv);
        struct tensor qkvz = tensor_cols(&p1, 0, cd + vd), ba = tensor_cols(&p1, cd + vd, 2 * Hv);
        layers_norm_in(m, s, &L->attn_norm, 2, (struct tensor *const[]){&raw, &raw_ba},
                       (const struct tensor *const[]){&L->in_proj, &L->in_b}, x);
        op->permute_cols(be, &qkvz, &raw, &m->perm_qkvz);
        op->permute_cols(be, &ba, &raw_ba, &m->perm_ba);
    } else {
        layers_norm_in(m, s, &L->attn_norm, 4, (struct tensor *const[]){&qkv, &z, &b, &a},
                       (const struct tensor *const[]){&L->in_proj, &L->in_z, &L->in_b, &L->in_a}, x);
    }
    const int32_t r = m->rec_layer[l];
    struct tensor conv = tensor_cols(&p2, 0, cd), core = tensor_cols(&p2, cd, vd);
    op->conv1d(be, &conv, &qkv, &L->conv_w, NULL, &kv->conv[r]);
    struct tensor q = tensor_cols(&conv, 0, Hk * dk), k = tensor_cols(&conv, Hk * dk, Hk * dk), v = tensor_cols(&conv, 2 * Hk * dk, vd);
    op->delta_rule(be, &core, &q, &k, &v, &a, &b, &L->A_log, &L->dt_bias, &kv->ssm[r], (int32_t)Hk, (int32_t)Hv,
                   (int32_t)dk, (int32_t)dv);
    op->rmsnorm_gated(be, &core, &core, &z, &L->mix_norm, c->rms_eps, dv, false);
    layers_residual(m, s, x, &core, &L->out_proj);
}

void qwen3_next_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                        int32_t n_out, const struct model_trace *trace)
{
    const struct model_config *c = &m->cfg;
    struct tensor x = layers_embed(m, s, n_tokens, trace);
    for (int32_t l = 0; l < c->n_layer; l++) {
        if (c->layer_mixer[l] == MIX_ATTN)
            gated_attention(m, s, kv, l, &x, n_tokens);
        else
            gated_deltanet(m, s, kv, l, &x, n_tokens);
        layers_ffn(m, s, l, &m->layers[l].ffn_norm, &x, n_tokens);
        if (l + 1 < c->n_layer)
            layers_trace(m, trace, l + 1, &x, n_tokens);
    }
    layers_logits(m, s, &x, n_tokens, n_out, trace);
}
