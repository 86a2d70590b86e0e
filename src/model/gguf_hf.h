/* gguf_hf: a GGUF file seen as the Hugging Face checkpoint it was converted
 * from, so that the rest of the model layer reads one kind of source.
 *
 * llama.cpp's converter renames the tensors (blk.N.attn_q.weight for
 * model.layers.N.self_attn.q_proj.weight), stores shapes innermost first,
 * stacks a MoE layer's experts into one 3-D tensor, and moves config.json's
 * fields into `ARCH.*` keys. Here those steps are undone as views: the config
 * and generation_config objects the config parser takes, and a table of
 * tensors under transformers' names and shapes (an expert a view of its slice)
 * pointing into the GGUF's mapping. Architectures: qwen3, qwen3moe. */
#ifndef KP_GGUF_HF_H
#define KP_GGUF_HF_H

#include "config.h"
#include "gguf.h"
#include "safetensors.h"

#include <jansson.h>
#include <stdbool.h>

/* Whether path is a regular file that starts with GGUF's magic. */
bool gguf_hf_is_gguf(const char *path);
/* config.json's object for g (new reference); NULL with err_set() naming the
 * file and the key, or the architecture when it is not one we read. */
json_t *gguf_hf_config(const struct gguf *g);
/* generation_config.json's object: eos/bos from tokenizer.ggml.*, sampling
 * from general.sampling.* where the file has them. NULL with err_set(). */
json_t *gguf_hf_generation(const struct gguf *g);
/* st's tensor table (st zeroed first, owning no mapping): every tensor of g
 * under its transformers name and shape, data pointing into g's mapping
 * (valid while g is open). A tensor the architecture does not have is an
 * error naming it. */
int gguf_hf_tensors(const struct gguf *g, const struct model_config *c, struct safetensors *st);

#endif
