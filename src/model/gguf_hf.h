/* gguf_hf: a GGUF file seen as the Hugging Face checkpoint it was converted
 * from, so that the rest of the model layer reads one kind of source.
 *
 * llama.cpp's converter renames the tensors (blk.N.attn_q.weight for
 * model.layers.N.self_attn.q_proj.weight), stores shapes innermost first,
 * stacks a MoE layer's experts into one 3-D tensor, and moves config.json's
 * fields into `ARCH.*` keys. Here those steps are undone: the config and
 * generation_config objects the config parser takes, and a table of tensors
 * under transformers' names and shapes pointing into the GGUF's mapping (an
 * expert a view of its slice). Architectures: qwen3, qwen3moe, qwen3next,
 * qwen35, qwen35moe (read as Qwen3.5 text models: llama.cpp splits
 * Qwen3-Next's in_proj_qkvz into Qwen3.5's qkv and z), nemotron_h and
 * nemotron_h_moe (both nemotron_h, each layer's kind from its tensors).
 *
 * Where the converter moved or changed bytes, the table holds an owned copy
 * (freed by st_close) with transformers' own: RMSNorm weights stored as 1 + w
 * (Qwen hybrids) as a w whose 1 + w is the stored value bit for bit; A_log
 * stored as -exp(A_log) as log(-A) (the bf16 value it came from where that
 * is the one); Qwen3.5's DeltaNet value heads, stored in llama.cpp's tiled
 * order, back in their grouped one; Qwen3-Next's in_proj_ba split into
 * in_proj_b and in_proj_a; Nemotron-H's q/k rows out of llama.cpp's rotary
 * pair order. Reshapes (squeezed conv weights, Mamba2's D and norm) are views.
 * The MTP blocks counted in block_count are skipped, as transformers drops
 * them; any other tensor the architecture lacks is an error. */
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
 * (valid while g is open) or into a copy st owns. A tensor the architecture
 * does not have is an error naming it. */
int gguf_hf_tensors(const struct gguf *g, const struct model_config *c, struct safetensors *st);

#endif
