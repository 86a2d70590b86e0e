/* qwen3_next: the Qwen hybrids, Qwen3-Next and Qwen3.5 (model_type qwen3_next,
 * qwen3_5_text, qwen3_5_moe_text and the text part of the qwen3_5 /
 * qwen3_5_moe multimodal wrappers), matching transformers'
 * modeling_qwen3_next.py and modeling_qwen3_5.py / modeling_qwen3_5_moe.py. */
#ifndef KP_QWEN3_NEXT_H
#define KP_QWEN3_NEXT_H

#include "model.h"

int qwen3_next_bind(struct model *m);
void qwen3_next_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                        int32_t n_out, const struct model_trace *trace);

#endif
