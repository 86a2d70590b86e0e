/* model: a loaded checkpoint (config + weights bound to a backend) and its
 * forward pass over one batch.
 *
 * Ownership: struct model owns the safetensors mappings, the backend weight
 * tensors made from them and the host copies of weights dequantised at load; it borrows the backend, which must outlive it.
 * struct model_scratch holds the activations of one context, sized once for
 * its largest batch, so the forward itself never allocates.
 * The KV cache storage (struct kv_tensors) belongs to the engine's cache;
 * the forward writes the batch's K/V rows into it and reads them back. */
#ifndef KP_MODEL_H
#define KP_MODEL_H

#include "../backend/backend.h"
#include "config.h"
#include "gguf.h"
#include "safetensors.h"

struct layer_weights {
    struct tensor attn_norm, q, k, v, o, q_norm, k_norm; /* q [n_head*hd (x2 with an output gate)][hidden], k/v [n_kv*hd][hidden], o [hidden][n_head*hd] */
    struct tensor ffn_norm;                              /* [hidden] */
    struct tensor gate, up, down;                        /* dense: [inter][hidden] x2, [hidden][inter] */
    struct tensor router, router_bias;                   /* moe: [n_expert][hidden], [n_expert] (nemotron) */
    struct tensor *ex_gate, *ex_up, *ex_down;            /* moe: [n_expert] */
    struct moe_experts experts;
    struct tensor sh_gate, sh_up, sh_down, sh_mix;       /* shared expert [shared][hidden] x2, [hidden][shared]; its gate [1][hidden] */
    /* recurrent mixers. DeltaNet: in_proj = qkv (or qkvz), in_z, in_b, in_a (or ba);
     * Mamba2: in_proj [inner + conv_dim + n_head][hidden] */
    struct tensor in_proj, in_z, in_b, in_a;
    struct tensor conv_w, conv_b;                        /* [conv_dim][K], [conv_dim] */
    struct tensor A_log, dt_bias, D;                     /* [n_head] each */
    struct tensor mix_norm;                              /* [v_dim] (DeltaNet) or [inner] (Mamba2) */
    struct tensor out_proj;                              /* [hidden][n_v_head*v_dim or inner] */
};

struct model {
    struct model_config cfg;
    struct safetensors st; /* the checkpoint's tensors by transformers' names (from a GGUF: views into gguf) */
    struct gguf gguf;      /* a GGUF file's mapping, when the model came from one (n_files 0 otherwise) */
    struct backend *be;
    struct tensor embed;    /* [vocab][hidden] */
    const struct st_tensor *embed_stored; /* the checkpoint's embedding, of which a step reads one row */
    struct tensor out_norm; /* [hidden] */
    struct tensor lm_head;  /* [vocab][hidden] (the embedding when tied) */
    struct tensor inv_freq; /* [rope_dim/2] F32 */
    struct layer_weights *layers; /* [n_layer] */
    int16_t kv_layer[CFG_MAX_LAYER];  /* [n_layer] index into kv_tensors.k/v, -1 for layers without attention */
    int16_t rec_layer[CFG_MAX_LAYER]; /* [n_layer] index into kv_tensors.conv/ssm, -1 for non-recurrent layers */
    /* column permutations (I32 [1][cols]) from the stored fused layouts to the
     * grouped ones the ops take: q/gate of gated attention, qkvz and ba of qwen3_next */
    struct tensor perm_qg, perm_qkvz, perm_ba;
    /* BF16 host copies of FP8 weights (weights.c) that the backend uses in place */
    void **dequant;
    int32_t n_dequant, cap_dequant;
    /* while model_load runs: its progress report (model_opts) and the bytes bound so far */
    const struct model_opts *load_opts;
    const char *load_source;
    int64_t load_done, load_total;
};

/* The cache the forward reads and writes, owned by the engine: KV rows of the
 * attention layers and the state slots of the recurrent layers. */
struct kv_tensors {
    struct tensor *k;    /* [n_attn_layer] each [n_rows][n_kv_head*head_dim] F32 */
    struct tensor *v;    /* [n_attn_layer] */
    struct tensor *conv; /* [n_rec_layer] each [n_slots][(conv_kernel-1)*rec_conv_dim] F32 */
    struct tensor *ssm;  /* [n_rec_layer] each [n_slots][rec_state_dim] F32 */
};

struct model_scratch {
    int32_t max_tokens, max_out;
    struct tensor x, h, q, k, v, att;  /* [max_tokens][...] */
    struct tensor g, u, ffn, ffn2;     /* gate/up [max_tokens][max inter], ffn outs [max_tokens][hidden] */
    struct tensor router, ids, weights, moe_ws, sh_mix;
    struct tensor p1, p2;              /* [max_tokens][widest fused projection] */
    struct tensor out_h, logits;       /* [max_out][hidden], [max_out][vocab] */
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
    /* Called as the weights are handed to the backend (a large model's load
     * takes seconds to minutes): the bytes bound so far of the checkpoint's
     * total (source: the path loaded), last with done == total. NULL: none. */
    void (*progress)(void *ctx, const char *source, int64_t done, int64_t total);
    void *progress_ctx;
};

/* Loads PATH: a folder (config.json, generation_config.json, safetensors) or a
 * GGUF file (one, or any part of a split set; see gguf_hf.h); opts NULL =
 * defaults. -1 with err_set() naming the file and the tensor or field on failure. */
int model_load(struct model *m, const char *path, struct backend *be, const struct model_opts *opts);
/* A source's config and tensor table alone, with no backend (kapitsa quantize):
 * a folder into c and st, or a GGUF into g, c and st (views into g). The
 * caller closes st and g (both safe when zeroed) on either result. */
int model_source_open(const char *path, struct model_config *c, struct safetensors *st, struct gguf *g);
void model_free(struct model *m);

/* max_tokens: the largest batch; max_out: the most rows of it a forward
 * computes logits for (a prefill chunk needs one, a verified tree all its
 * nodes): the logits, a vocabulary wide, are the largest buffer per row. */
int model_scratch_init(struct model_scratch *s, const struct model *m, int32_t max_tokens, int32_t max_out);
void model_scratch_free(struct model_scratch *s, const struct model *m);

/* One forward over the batch already given to the backend with set_batch.
 * Logits of the batch's out_rows end in s->logits [n_out][vocab]. */
void model_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                   int32_t n_out, const struct model_trace *trace);

#endif
