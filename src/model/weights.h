/* weights: binding checkpoint tensors by name to backend tensors, with the
 * shape the architecture expects checked first. Used by the per-architecture
 * files at load; every failure names the tensor, its file and both shapes.
 * An F8_E4M3 matrix (fp8.h) is bound as its BF16 dequantisation, which the
 * model keeps (struct model's dequant) while the backend uses it in place. */
#ifndef KP_WEIGHTS_H
#define KP_WEIGHTS_H

#include "model.h"

#include <stdbool.h>

/* dst <- tensor `name` of shape [rows][cols], or [cols] when rows == 0. */
int weights_bind(struct model *m, struct tensor *dst, const char *name, int64_t rows, int64_t cols);
/* dst[e] <- slice e of a [n][rows][cols] tensor, rows [row0, row0+rows) of
 * each slice of total height `height` (for fused gate_up tensors). */
int weights_bind_slices(struct model *m, struct tensor *dst, const char *name, int64_t n, int64_t height,
                        int64_t row0, int64_t rows, int64_t cols);
bool weights_has(const struct model *m, const char *name);
/* An RMSNorm weight [cols]; plus_one: stored as w, used as 1 + w (Qwen3-Next,
 * Qwen3.5), kept as an F32 tensor owned by dst computed exactly as the
 * reference does in fp32. */
int weights_bind_norm(struct model *m, struct tensor *dst, const char *name, int64_t cols, bool plus_one);
/* A depthwise conv1d weight stored [channels][1][width], bound as [channels][width]. */
int weights_bind_conv(struct model *m, struct tensor *dst, const char *name, int64_t channels, int64_t width);
/* An I32 [1][n] column map (backend op permute_cols) owned by dst. */
int weights_make_map(struct model *m, struct tensor *dst, const int32_t *map, int64_t n);

#endif
