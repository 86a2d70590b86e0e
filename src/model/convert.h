/* convert: a checkpoint (a transformers folder or a GGUF file) written as a
 * GGUF file that llama.cpp and Kapitsa load, each tensor in the type a recipe
 * gives it (`kapitsa quantize`).
 *
 * Recipes name the usual llama.cpp mixes (Q8_0, Q6_K, Q5_K_M, Q4_K_M,
 * Q3_K_M, Q2_K, and the plain F16/BF16/F32) and the MoE mix (routed experts
 * at 2-3 bits, the rest at 4-6, embeddings and LM head at 6-8), see
 * convert_recipe_type. A tensor whose rows do not split into the type's
 * blocks takes llama.cpp's fallback (Q5_0, Q5_1, Q8_0, IQ4_NL) or F16;
 * vectors stay F32. A source tensor already stored in a block type is
 * copied as it is when the recipe asks for that type, and is never
 * re-quantised to a type of more bits (that would only add error). The
 * tokenizer and chat template are written as tokenizer.ggml.* and
 * tokenizer.chat_template (from tokenizer.json and tokenizer_config.json,
 * or copied from a GGUF source; a folder without tokenizer.json gets none).
 * With an importance matrix, each row quantised to a K-quant or IQ4 type
 * takes its tensor's (its expert's) importance, as llama-quantize --imatrix
 * does, and the file records it in quantize.imatrix.* as llama-quantize's do.
 * Architectures: qwen3, qwen3_moe. */
#ifndef KP_CONVERT_H
#define KP_CONVERT_H

#include "../base/dtype.h"
#include "config.h"

#include <stdbool.h>
#include <stdint.h>

/* What a tensor is, for a recipe. */
enum convert_role {
    ROLE_EMBED,
    ROLE_OUTPUT,   /* the LM head */
    ROLE_ATTN_QK,  /* q, k */
    ROLE_ATTN_V,
    ROLE_ATTN_O,
    ROLE_FFN_UP,   /* dense gate and up */
    ROLE_FFN_DOWN,
    ROLE_EXP_UP,   /* routed experts' gate and up */
    ROLE_EXP_DOWN,
    ROLE_ROUTER,
    ROLE_VECTOR,   /* norms */
};

struct imatrix;

struct convert_opts {
    const char *recipe;        /* a name convert_recipe_type knows */
    const struct imatrix *im;  /* importance per column of the tensors it has entries for (imatrix.h), or NULL */
    /* Called before each tensor (its GGUF name) with the bytes written so far
     * of the total, and once more at the end with done == total; NULL: none. */
    void (*progress)(void *ctx, int64_t done, int64_t total, const char *tensor);
    void *progress_ctx;
};

/* The type recipe gives a tensor of role in layer `layer` of n_layer with
 * `cols` columns (after the fallbacks); a recipe that is a type's name (Q4_K,
 * IQ4_XS, ...) writes every matrix in that type. -1 with err_set() for an
 * unknown recipe. */
int convert_recipe_type(const char *recipe, enum convert_role role, int32_t layer, int32_t n_layer, int64_t cols,
                        enum dtype *out);
/* The recipe names, for usage messages. */
extern const char *const convert_recipes[];

/* Writes src (folder or GGUF) to out as GGUF by o. -1 with err_set(). */
int convert_write(const char *src, const char *out, const struct convert_opts *o);

#endif
