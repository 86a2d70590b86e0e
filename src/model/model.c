/* model: loading a checkpoint folder and dispatching to its architecture
 * (see model.h). */
#include "model.h"

#include "../base/err.h"
#include "fp8.h"
#include "gguf_hf.h"
#include "nemotron_h.h"
#include "qwen3.h"
#include "qwen3_next.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int model_init_rope(struct model *m, bool round)
{
    const int32_t half = m->cfg.rope_dim / 2;
    float *inv = malloc((size_t)half * sizeof(float));
    if (!inv)
        return err_set("model: out of memory");
    config_rope_inv_freq(&m->cfg, inv);
    char name[96];
    snprintf(name, sizeof name, "%sembed_tokens.weight", m->cfg.prefix);
    const struct st_tensor *emb = st_find(&m->st, name);
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

int model_source_open(const char *path, struct model_config *c, struct safetensors *st, struct gguf *g)
{
    memset(g, 0, sizeof *g);
    if (!gguf_hf_is_gguf(path))
        return config_load(c, path) != 0 || st_open_dir(st, path) != 0 || fp8_check(st, c) != 0 ? -1 : 0;
    if (gguf_open(g, path) != 0)
        return -1;
    json_t *cfg = gguf_hf_config(g), *gen = cfg ? gguf_hf_generation(g) : NULL;
    int rc = gen ? config_parse(c, cfg, path, gen, path) : -1;
    json_decref(cfg);
    json_decref(gen);
    return rc == 0 ? gguf_hf_tensors(g, c, st) : -1;
}

int model_load(struct model *m, const char *path, struct backend *be, const struct model_opts *opts)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    if (model_source_open(path, &m->cfg, &m->st, &m->gguf) != 0)
        goto fail;
    m->layers = calloc((size_t)m->cfg.n_layer, sizeof *m->layers);
    if (!m->layers) {
        err_set("model: out of memory");
        goto fail;
    }
    for (int32_t l = 0, na = 0, nr = 0; l < m->cfg.n_layer; l++) {
        const uint8_t mix = m->cfg.layer_mixer[l];
        m->kv_layer[l] = (int16_t)(mix == MIX_ATTN ? na++ : -1);
        m->rec_layer[l] = (int16_t)(mix == MIX_DELTA || mix == MIX_MAMBA ? nr++ : -1);
    }
    if (m->cfg.rope_dim > 0 && model_init_rope(m, opts && opts->rope_freq_stored_dtype) != 0)
        goto fail;
    if (opts && opts->progress) {
        m->load_opts = opts;
        m->load_source = path;
        for (int32_t i = 0; i < m->st.n_tensors; i++)
            m->load_total += (int64_t)m->st.tensors[i].n_bytes;
    }
    int rc = 0;
    switch (m->cfg.arch) {
    case ARCH_QWEN3:
    case ARCH_QWEN3_MOE: rc = qwen3_bind(m); break;
    case ARCH_QWEN3_NEXT: rc = qwen3_next_bind(m); break;
    case ARCH_NEMOTRON_H: rc = nemotron_h_bind(m); break;
    }
    if (rc != 0)
        goto fail;
    if (m->load_opts) /* tensors no layer reads (a checkpoint's extras) leave the count short of the total */
        m->load_opts->progress(m->load_opts->progress_ctx, path, m->load_total, m->load_total);
    m->load_opts = NULL;
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
            struct tensor *all[] = {&L->attn_norm, &L->q,       &L->k,       &L->v,      &L->o,       &L->q_norm,
                                    &L->k_norm,    &L->ffn_norm, &L->gate,   &L->up,     &L->down,    &L->router,
                                    &L->router_bias, &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_mix, &L->in_proj,
                                    &L->in_z,      &L->in_b,     &L->in_a,   &L->conv_w, &L->conv_b,  &L->A_log,
                                    &L->dt_bias,   &L->D,        &L->mix_norm, &L->out_proj};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                release(be, all[i]);
            for (int32_t e = 0; e < L->experts.n_expert; e++) {
                if (L->ex_gate)
                    release(be, &L->ex_gate[e]);
                if (L->ex_up)
                    release(be, &L->ex_up[e]);
                if (L->ex_down)
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
        release(be, &m->perm_qg);
        release(be, &m->perm_qkvz);
        release(be, &m->perm_ba);
    }
    for (int32_t i = 0; i < m->n_dequant; i++)
        free(m->dequant[i]);
    free(m->dequant);
    st_close(&m->st);
    gguf_close(&m->gguf);
    memset(m, 0, sizeof *m);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int model_scratch_init(struct model_scratch *s, const struct model *m, int32_t max_tokens, int32_t max_out)
{
    const struct model_config *c = &m->cfg;
    struct backend *be = m->be;
    const int64_t n = max_tokens, n_out = max_out, qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_kv_head * c->head_dim;
    const int64_t inter = max64(c->intermediate_size, max64(c->moe_intermediate_size, c->shared_intermediate_size));
    /* fused projections: gated q, DeltaNet qkvz+ba, Mamba2 in_proj, and their outputs */
    int64_t wide = c->attn_out_gate ? 2 * qd : 1;
    if (c->n_rec_layer) {
        const int64_t vd = (int64_t)c->lin_n_v_head * c->lin_v_dim, inner = (int64_t)c->ssm_n_head * c->ssm_head_dim;
        wide = max64(wide, c->rec_conv_dim + max64(vd, inner) + 2 * (int64_t)c->lin_n_v_head + c->ssm_n_head);
    }
    memset(s, 0, sizeof *s);
    s->max_tokens = max_tokens;
    s->max_out = max_out;
    const struct {
        struct tensor *t;
        enum dtype type;
        int64_t rows, cols;
        bool need;
    } bufs[] = {
        {&s->x, DT_F32, n, c->hidden_size, true},
        {&s->h, DT_F32, n, c->hidden_size, true},
        {&s->q, DT_F32, n, qd, true},
        {&s->k, DT_F32, n, kd, true},
        {&s->v, DT_F32, n, kd, true},
        {&s->att, DT_F32, n, qd, true},
        {&s->g, DT_F32, n, inter, true},
        {&s->u, DT_F32, n, inter, true},
        {&s->ffn, DT_F32, n, c->hidden_size, true},
        {&s->ffn2, DT_F32, n, c->hidden_size, c->shared_intermediate_size > 0},
        {&s->sh_mix, DT_F32, n, 1, c->shared_gate},
        {&s->p1, DT_F32, n, wide, true},
        {&s->p2, DT_F32, n, wide, true},
        {&s->out_h, DT_F32, n_out, c->hidden_size, true},
        {&s->logits, DT_F32, n_out, c->vocab_size, true},
        {&s->router, DT_F32, n, c->n_expert, c->n_expert > 0},
        {&s->ids, DT_I32, n, c->n_expert_used, c->n_expert > 0},
        {&s->weights, DT_F32, n, c->n_expert_used, c->n_expert > 0},
        {&s->moe_ws, DT_F32, n, 2 * ((int64_t)c->hidden_size + c->moe_intermediate_size), c->n_expert > 0},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i].need && be->ops->alloc(be, bufs[i].t, bufs[i].type, bufs[i].rows, bufs[i].cols) != 0) {
            model_scratch_free(s, m);
            return -1;
        }
    return 0;
}

void model_scratch_free(struct model_scratch *s, const struct model *m)
{
    struct tensor *all[] = {&s->x,      &s->h,   &s->q,   &s->k,      &s->v,       &s->att,     &s->g,
                            &s->u,      &s->ffn, &s->ffn2, &s->sh_mix, &s->p1,     &s->p2,      &s->router,
                            &s->ids,    &s->weights, &s->moe_ws, &s->out_h, &s->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        release(m->be, all[i]);
    memset(s, 0, sizeof *s);
}

void model_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                   int32_t n_out, const struct model_trace *trace)
{
    switch (m->cfg.arch) {
    case ARCH_QWEN3:
    case ARCH_QWEN3_MOE: qwen3_forward(m, s, kv, n_tokens, n_out, trace); break;
    case ARCH_QWEN3_NEXT: qwen3_next_forward(m, s, kv, n_tokens, n_out, trace); break;
    case ARCH_NEMOTRON_H: nemotron_h_forward(m, s, kv, n_tokens, n_out, trace); break;
    }
}
