/* nemotron_h: NVIDIA Nemotron-H hybrids and Nemotron 3 MoE (model_type
 * nemotron_h), matching transformers' modeling_nemotron_h.py. */
#ifndef KP_NEMOTRON_H_H
#define KP_NEMOTRON_H_H

#include "model.h"

int nemotron_h_bind(struct model *m);
void nemotron_h_forward(const struct model *m, struct model_scratch *s, struct kv_tensors *kv, int32_t n_tokens,
                        int32_t n_out, const struct model_trace *trace);

#endif
