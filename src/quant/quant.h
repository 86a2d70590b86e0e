/* quant: the reference arithmetic of GGUF's block types: rows of blocks to
 * fp32 and fp32 rows to blocks (src/quant/blocks.h has the layouts).
 *
 * Dequantisation is the format's definition, exact against llama.cpp's own
 * code (tests/data/quant, made by tools/reference/quant_vectors.py). The
 * simple types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) quantise as ggml's reference
 * quantiser does, bit for bit, when no importance is given. The K-quants and
 * IQ4 pick each group's scale (and min) by a search that minimises the
 * importance-weighted squared error, then quantise the group scales
 * themselves and re-fit every element to the stored scales; IQ2_XXS picks each
 * 8 values' grid point and a 32-value group's scale the same way. Importance `imp`
 * ([n], one weight per column, an importance matrix's row; NULL: x^2, the
 * error of the product with a typical activation) steers that search.
 * Everything here is allocation-free and may run on any number of threads at
 * once (IQ2_XXS builds a lookup table once, the first time); callers split
 * work by rows. */
#ifndef KP_QUANT_H
#define KP_QUANT_H

#include "../base/dtype.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[0..n) = the values of n elements of type t at src (n a multiple of the
 * block; plain types are widened). */
void quant_dequant(enum dtype t, const void *src, int64_t n, float *dst);
/* n elements of x into dtype_bytes(t, n) bytes at dst (n a multiple of the
 * block). -1 with err_set() for a type that cannot be quantised to here. */
int quant_quantize(enum dtype t, const float *x, int64_t n, const float *imp, void *dst);
/* Whether quant_quantize writes type t. */
bool quant_can_quantize(enum dtype t);

#ifdef __cplusplus
}
#endif

#endif
