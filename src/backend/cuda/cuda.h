/* cuda: the NVIDIA GPU backend (backend.h's ops in CUDA C, cuBLAS for the
 * large matrix products). Built when nvcc is found (or `make CUDA=1`); a
 * binary built with it still runs on machines without a GPU, on the cpu backend.
 *
 * Tensors live in device memory: weights are uploaded once at load in their
 * stored dtype, activations and the KV/state caches are fp32 device tensors.
 * The ops are queued on one stream; read() waits for them.
 *
 * Numerics. Products of up to CUDA_SMALL_N tokens (decoding, speculative
 * trees, small batches) use one tensor-core kernel that gives every token the
 * same bits whatever else is in the batch: a tree verified in one pass
 * reproduces plain decoding exactly. Its activations are rounded to bf16 (as
 * a bf16 model runs in transformers), or, when precise is set, as `kapitsa
 * check` asks, split into two bf16 halves so that products match fp32
 * arithmetic to ~1e-5. Larger products (prefill) run on cuBLAS with bf16
 * activations, or with the same split (twice the work) when precise. */
#ifndef KP_CUDA_H
#define KP_CUDA_H

#include "../backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_SMALL_N 64

/* Number of usable CUDA devices (0 when there is no driver or no GPU). */
int32_t cuda_device_count(void);
/* Facts about device `dev` (backend.h's struct device_info); -1 with
 * err_set() if it cannot be queried. */
int cuda_device_query(int32_t dev, struct device_info *info);
/* A backend on device `dev`; precise: every product with split-bf16
 * activations (see above). NULL with err_set() on failure. */
struct backend *cuda_backend_init(int32_t dev, bool precise);

#ifdef __cplusplus
}
#endif

#endif
