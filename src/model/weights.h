/* weights: binding checkpoint tensors by name to backend tensors, with the
 * shape the architecture expects checked first. Used by the per-architecture
 * files at load; every failure names the tensor, its file and both shapes. */
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

#endif
