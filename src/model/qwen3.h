/* qwen3: the Qwen3 dense and Qwen3-MoE architectures (model_type qwen3,
 * qwen3_moe), matching transformers' modeling_qwen3 / modeling_qwen3_moe. */
#ifndef KP_QWEN3_H
#define KP_QWEN3_H

#include "model.h"

int qwen3_bind(struct model *m);
/* Pieces qwen3_next reuses: embeddings, final norm and LM head; the MoE block
 * of layer l (routed experts in either stored layout, shared expert if any). */
int qwen3_bind_embed(struct model *m);
int qwen3_bind_moe(struct model *m, struct layer_weights *L, int32_t l);
void qwen3_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                   int32_t n_out, const struct model_trace *trace);

#endif
