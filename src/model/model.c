/* model: loading a checkpoint folder and dispatching to its architecture
 * (see model.h). */
#include "model.h"

#include "../base/err.h"
#include "qwen3.h"

#include <stdlib.h>
#include <string.h>

static int model_init_rope(struct model *m, bool round)
{
    const int32_t half = m->cfg.rope_dim / 2;
    float *inv = malloc((size_t)half * sizeof(float));
    if (!inv)
        return err_set("model: out of memory");
    config_rope_inv_freq(&m->cfg, inv);
    const struct st_tensor *emb = st_find(&m->st, "model.embed_tokens.weight");
    for (int32_t i = 0; round && emb && i < half; i++)
        inv[i] = emb->type == DT_BF16 ? bf16_to_f32(f32_to_bf16(inv[i]))
                 : emb->type == DT_F16 ? f16_to_f32(f32_to_f16(inv[i]))
                                       : inv[i];
    int rc = m->be->ops->alloc(m->be, &m->inv_freq, DT_F32, 1, half);
    if (rc == 0)
        m->be->ops->write(m->be, &m->inv_freq, 0, 1, inv);
    free(inv);
    return rc;
}

int model_load(struct model *m, const char *dir, struct backend *be, const struct model_opts *opts)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    if (config_load(&m->cfg, dir) != 0 || st_open_dir(&m->st, dir) != 0)
        goto fail;
    m->layers = calloc((size_t)m->cfg.n_layer, sizeof *m->layers);
    if (!m->layers) {
        err_set("model: out of memory");
        goto fail;
    }
    if (model_init_rope(m, opts && opts->rope_freq_stored_dtype) != 0)
        goto fail;
    switch (m->cfg.arch) {
    case ARCH_QWEN3:
    case ARCH_QWEN3_MOE:
        if (qwen3_bind(m) != 0)
            goto fail;
        break;
    }
    return 0;
fail:
    model_free(m);
    return -1;
}

static void release(struct backend *be, struct tensor *t)
{
    if (t->data)
        be->ops->release(be, t);
}

void model_free(struct model *m)
{
    struct backend *be = m->be;
    if (m->layers) {
        for (int32_t l = 0; l < m->cfg.n_layer; l++) {
            struct layer_weights *L = &m->layers[l];
            struct tensor *all[] = {&L->attn_norm, &L->q, &L->k, &L->v, &L->o, &L->q_norm, &L->k_norm,
                                    &L->ffn_norm, &L->gate, &L->up, &L->down, &L->router};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                release(be, all[i]);
            for (int32_t e = 0; e < L->experts.n_expert; e++) {
                release(be, &L->ex_gate[e]);
                release(be, &L->ex_up[e]);
                release(be, &L->ex_down[e]);
            }
            free(L->ex_gate);
            free(L->ex_up);
            free(L->ex_down);
        }
        free(m->layers);
    }
    if (be) {
        if (!m->cfg.tie_embeddings)
            release(be, &m->lm_head);
        release(be, &m->embed);
        release(be, &m->out_norm);
        release(be, &m->inv_freq);
    }
    st_close(&m->st);
    memset(m, 0, sizeof *m);
}

int model_scratch_init(struct model_scratch *s, const struct model *m, int32_t max_tokens)
{
    const struct model_config *c = &m->cfg;
    struct backend *be = m->be;
    const int64_t n = max_tokens, qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_kv_head * c->head_dim;
    int64_t inter = c->intermediate_size;
    memset(s, 0, sizeof *s);
    s->max_tokens = max_tokens;
    int rc = be->ops->alloc(be, &s->x, DT_F32, n, c->hidden_size) || be->ops->alloc(be, &s->h, DT_F32, n, c->hidden_size) ||
             be->ops->alloc(be, &s->q, DT_F32, n, qd) || be->ops->alloc(be, &s->k, DT_F32, n, kd) ||
             be->ops->alloc(be, &s->v, DT_F32, n, kd) || be->ops->alloc(be, &s->att, DT_F32, n, qd) ||
             be->ops->alloc(be, &s->g, DT_F32, n, inter) || be->ops->alloc(be, &s->u, DT_F32, n, inter) ||
             be->ops->alloc(be, &s->ffn, DT_F32, n, c->hidden_size) ||
             be->ops->alloc(be, &s->out_h, DT_F32, n, c->hidden_size) ||
             be->ops->alloc(be, &s->logits, DT_F32, n, c->vocab_size);
    if (rc == 0 && c->n_expert > 0)
        rc = be->ops->alloc(be, &s->router, DT_F32, n, c->n_expert) ||
             be->ops->alloc(be, &s->ids, DT_I32, n, c->n_expert_used) ||
             be->ops->alloc(be, &s->weights, DT_F32, n, c->n_expert_used) ||
             be->ops->alloc(be, &s->moe_ws, DT_F32, n, c->hidden_size + 2 * (int64_t)c->moe_intermediate_size);
    if (rc != 0) {
        model_scratch_free(s, m);
        return -1;
    }
    return 0;
}

void model_scratch_free(struct model_scratch *s, const struct model *m)
{
    struct tensor *all[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->att, &s->g, &s->u, &s->ffn,
                            &s->router, &s->ids, &s->weights, &s->moe_ws, &s->out_h, &s->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        release(m->be, all[i]);
    memset(s, 0, sizeof *s);
}

void model_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                   int32_t n_out, const struct model_trace *trace)
{
    switch (m->cfg.arch) {
    case ARCH_QWEN3:
    case ARCH_QWEN3_MOE:
        qwen3_forward(m, s, kv, n_tokens, n_out, trace);
        break;
    }
}
