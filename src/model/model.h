/* model: a loaded checkpoint (config + weights bound to a backend) and its
 * forward pass over one batch.
 *
 * Ownership: struct model owns the safetensors mappings and the backend weight
 * tensors made from them; it borrows the backend, which must outlive it.
 * struct model_scratch holds the activations of one context, sized once for
 * its largest batch, so the forward itself never allocates.
 * The KV cache storage (struct kv_tensors) belongs to the engine's cache;
 * the forward writes the batch's K/V rows into it and reads them back. */
#ifndef KP_MODEL_H
#define KP_MODEL_H

#include "../backend/backend.h"
#include "config.h"
#include "safetensors.h"

struct layer_weights {
    struct tensor attn_norm, q, k, v, o, q_norm, k_norm; /* q [n_head*hd][hidden], k/v [n_kv*hd][hidden], o [hidden][n_head*hd] */
    struct tensor ffn_norm;                              /* [hidden] */
    struct tensor gate, up, down;                        /* dense: [inter][hidden] x2, [hidden][inter] */
    struct tensor router;                                /* moe: [n_expert][hidden] */
    struct tensor *ex_gate, *ex_up, *ex_down;            /* moe: [n_expert] */
    struct moe_experts experts;
};

struct model {
    struct model_config cfg;
    struct safetensors st;
    struct backend *be;
    struct tensor embed;    /* [vocab][hidden] */
    struct tensor out_norm; /* [hidden] */
    struct tensor lm_head;  /* [vocab][hidden] (the embedding when tied) */
    struct tensor inv_freq; /* [rope_dim/2] F32 */
    struct layer_weights *layers; /* [n_layer] */
};

/* The cache rows the forward reads and writes (owned by the engine's kv cache). */
struct kv_tensors {
    struct tensor *k; /* [n_layer] each [n_rows][n_kv_head*head_dim] F32 */
    struct tensor *v; /* [n_layer] */
};

struct model_scratch {
    int32_t max_tokens;
    struct tensor x, h, q, k, v, att;  /* [max_tokens][...] */
    struct tensor g, u, ffn;           /* gate/up [max_tokens][inter], ffn out [max_tokens][hidden] */
    struct tensor router, ids, weights, moe_ws;
    struct tensor out_h, logits;       /* [max_tokens][hidden], [max_tokens][vocab] */
};

/* Optional capture of the residual stream for validation (kapitsa check):
 * hidden[l] receives [n_tokens][hidden] after layer l-1 (hidden[0]: embeddings,
 * hidden[n_layer]: after the final norm). Host memory, owned by the caller. */
struct model_trace {
    float **hidden; /* [n_layer+1] */
};

struct model_opts {
    /* Round the rotary inverse frequencies to the dtype the weights are stored
     * in (bf16 or f16), as transformers does after model.to(dtype) casts the
     * inv_freq buffer: how the reference fixtures were made. Off: fp32, as
     * from_pretrained computes them. */
    bool rope_freq_stored_dtype;
};

/* Loads DIR (config.json, generation_config.json, safetensors); opts NULL =
 * defaults. -1 with err_set() naming the file and the tensor or field on failure. */
int model_load(struct model *m, const char *dir, struct backend *be, const struct model_opts *opts);
void model_free(struct model *m);

int model_scratch_init(struct model_scratch *s, const struct model *m, int32_t max_tokens);
void model_scratch_free(struct model_scratch *s, const struct model *m);

/* One forward over the batch already given to the backend with set_batch.
 * Logits of the batch's out_rows end in s->logits [n_out][vocab]. */
void model_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                   int32_t n_out, const struct model_trace *trace);

#endif
