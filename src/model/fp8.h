/* fp8: weights stored as FP8 E4M3 with a scale per block, as Hugging Face's
 * FP8 checkpoints publish them (Qwen/Qwen3-*-FP8; transformers'
 * FineGrainedFP8, vLLM's block-quantised fp8).
 *
 * config.json's quantization_config {"quant_method": "fp8", "fmt": "e4m3",
 * "weight_block_size": [br, bc]} (config.h: fp8_block) says each quantised
 * `X.weight` (F8_E4M3, [rows][cols], or [n][rows][cols] for fused experts)
 * has `X.weight_scale_inv` beside it (F32, also BF16 or F16, shape
 * [ceil(rows/br)][ceil(cols/bc)] after the same leading dims; the blocks at
 * the right and bottom edges may be smaller). Its value is
 *     w[r][c] = bf16(fp32(e4m3 w[r][c]) * scale_inv[r/br][c/bc])
 * with the product rounded to fp32 and then to bf16 (nearest even), as
 * transformers' Fp8Dequantize computes the bf16 weight. The modules left
 * unquantised (modules_to_not_convert: embeddings, norms, routers, the LM
 * head) are stored in BF16 and read as they are; the dtype of each tensor
 * says which it is. Activations are not quantised here: the products take
 * the weight above with fp32 inputs ("activation_scheme" is not read). */
#ifndef KP_FP8_H
#define KP_FP8_H

#include "config.h"
#include "safetensors.h"

#include <stdint.h>

/* An F8_E4M3 weight and its scales, seen as [n_slice * rows][cols]. */
struct fp8_weight {
    const struct st_tensor *w, *scale;
    int64_t rows, cols;     /* of one slice */
    int32_t block_rows, block_cols;
};

/* f <- the F8_E4M3 tensor w of st and its scale, checked against the config:
 * -1 with err_set() naming the tensor when the config has no fp8
 * quantization_config, w is not 2-D or 3-D, or its scale is missing or of
 * another dtype or shape than its blocks give. */
int fp8_find(const struct safetensors *st, const struct model_config *c, const struct st_tensor *w,
             struct fp8_weight *f);
/* fp8_find for every F8_E4M3 tensor of st: a checkpoint's errors before any loading. */
int fp8_check(const struct safetensors *st, const struct model_config *c);
/* Rows [row0, row0+n) of f (over its slices) as BF16 into out [n][cols]. */
void fp8_rows_bf16(const struct fp8_weight *f, int64_t row0, int64_t n, uint16_t *out);

#endif
