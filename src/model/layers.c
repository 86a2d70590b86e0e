/* layers: shared forward pieces (see layers.h). References: the MLP / MoE
 * blocks of transformers' modeling_qwen3_moe.py, modeling_qwen3_next.py and
 * modeling_nemotron_h.py (NemotronHMLP, NemotronHMoE). */
#include "layers.h"

void layers_trace(const struct model *m, const struct model_trace *trace, int32_t i, const struct tensor *x, int32_t n)
{
    if (trace && trace->hidden[i])
        m->be->ops->read(m->be, x, 0, n, trace->hidden[i]);
}

struct tensor layers_embed(const struct model *m, struct model_scratch *s, int32_t n, const struct model_trace *trace)
{
    struct tensor x = tensor_rows(&s->x, 0, n);
    m->be->ops->embed(m->be, &x, &m->embed);
    layers_trace(m, trace, 0, &x, n);
    return x;
}

void layers_norm_in(const struct model *m, struct model_scratch *s, const struct tensor *norm, int32_t n_w,
                    struct tensor *const *out, const struct tensor *const *w, const struct tensor *x)
{
    struct tensor h = tensor_rows(&s->h, 0, x->n_rows);
    const struct mm_fused in = {.pre = MM_PRE_RMSNORM, .norm = norm, .eps = m->cfg.rms_eps, .pre_buf = &h};
    m->be->ops->matmul_fused(m->be, n_w, out, w, x, &in);
}

void layers_residual(const struct model *m, struct model_scratch *s, struct tensor *x, const struct tensor *y,
                     const struct tensor *w)
{
    struct tensor h = tensor_rows(&s->h, 0, x->n_rows);
    const struct mm_fused residual = {.accumulate = true, .acc_buf = &h};
    m->be->ops->matmul_fused(m->be, 1, (struct tensor *const[]){x}, (const struct tensor *const[]){w}, y, &residual);
}

void layers_mlp(const struct model *m, struct model_scratch *s, const struct layer_weights *L, const struct tensor *norm,
                struct tensor *x, int32_t n)
{
    struct tensor g = tensor_rows(&s->g, 0, n), u = tensor_rows(&s->u, 0, n);
    struct tensor h = tensor_rows(&s->h, 0, n), acc = tensor_rows(&s->ffn, 0, n);
    const struct mlp_block p = {.gate = m->cfg.relu2 ? NULL : &L->gate, .up = &L->up, .down = &L->down,
                                .norm = norm, .eps = m->cfg.rms_eps, .g = &g, .u = &u, .h = &h, .acc = &acc};
    backend_mlp(m->be, &p, x, x, true);
}

void layers_moe(const struct model *m, struct model_scratch *s, const struct layer_weights *L, const struct tensor *norm,
                struct tensor *x, int32_t n)
{
    const struct model_config *c = &m->cfg;
    struct backend *be = m->be;
    struct tensor h = tensor_rows(&s->h, 0, n), r = tensor_rows(&s->router, 0, n), ids = tensor_rows(&s->ids, 0, n);
    struct tensor w = tensor_rows(&s->weights, 0, n), ws = s->moe_ws;
    struct moe_block mb = {
        .norm = norm, .eps = c->rms_eps, .router = &L->router,
        .rt = {.k = c->n_expert_used, .sigmoid = c->router_sigmoid, .norm = c->norm_topk_prob,
               .bias = L->router_bias.data ? &L->router_bias : NULL, .n_group = c->n_group ? c->n_group : 1,
               .topk_group = c->topk_group ? c->topk_group : 1, .scale = c->routed_scale,
               .spread = c->route_spread},
        .ex = L->experts, .h = &h, .logits = &r, .ids = &ids, .weights = &w, .ws = &ws,
    };
    /* x + (routed + shared), the reference's order */
    struct tensor g = tensor_rows(&s->g, 0, n), u = tensor_rows(&s->u, 0, n);
    struct tensor y = tensor_rows(&s->ffn2, 0, n), mix = tensor_rows(&s->sh_mix, 0, n);
    const struct moe_shared sh = {
        .mlp = {.gate = c->relu2 ? NULL : &L->sh_gate, .up = &L->sh_up, .down = &L->sh_down, .g = &g, .u = &u},
        .mix = c->shared_gate ? &L->sh_mix : NULL, .mix_out = &mix, .y = &y,
    };
    mb.shared = c->shared_intermediate_size ? &sh : NULL;
    be->ops->moe(be, x, x, &mb, true);
}

void layers_ffn(const struct model *m, struct model_scratch *s, int32_t l, const struct tensor *norm, struct tensor *x,
                int32_t n)
{
    if (m->cfg.layer_ffn[l] == FFN_MOE)
        layers_moe(m, s, &m->layers[l], norm, x, n);
    else
        layers_mlp(m, s, &m->layers[l], norm, x, n);
}

void layers_logits(const struct model *m, struct model_scratch *s, const struct tensor *x, int32_t n, int32_t n_out,
                   const struct model_trace *trace)
{
    struct backend *be = m->be;
    struct tensor h = tensor_rows(&s->h, 0, n);
    be->ops->rmsnorm(be, &h, x, &m->out_norm, m->cfg.rms_eps);
    layers_trace(m, trace, m->cfg.n_layer, &h, n);
    struct tensor oh = tensor_rows(&s->out_h, 0, n_out);
    struct tensor logits = tensor_rows(&s->logits, 0, n_out);
    be->ops->get_out_rows(be, &oh, &h);
    be->ops->matmul(be, &logits, &oh, &m->lm_head);
}

struct tensor layers_logits_row(const struct model *m, struct model_scratch *s, int32_t row)
{
    struct backend *be = m->be;
    struct tensor h = tensor_rows(&s->h, row, 1), lg = tensor_rows(&s->logits, 0, 1);
    be->ops->matmul(be, &lg, &h, &m->lm_head);
    return lg;
}
