/* device: which backend a command runs on. "cpu", "cuda" (device 0),
 * "cuda:N", or "auto": the first CUDA device when this build has the cuda
 * backend and the machine a GPU, else the cpu. The CLI's --device and the
 * KAPITSA_DEVICE environment variable name one; auto is the default.
 * KAPITSA_PROFILE=1 times every op (profile.h); KAPITSA_PRECISION=exact makes
 * every backend precise (the CLI's --precision exact). */
#ifndef KP_DEVICE_H
#define KP_DEVICE_H

#include "backend.h"

#include <stdbool.h>
#include <stdint.h>

/* Whether this binary was built with the cuda backend. */
bool device_has_cuda(void);
/* The GPUs this binary can use (0 without the cuda backend or a GPU). */
int32_t device_n_gpus(void);
/* Facts about GPU i without opening a backend on it; -1 with err_set(). */
int device_gpu_query(int32_t i, struct device_info *info);
/* The backend for `name` (NULL: KAPITSA_DEVICE, else auto). n_threads: cpu
 * worker threads (<= 0: one per core). precise: see cuda.h and cpu.h. NULL with
 * err_set() when the name is unknown or the device unusable. */
struct backend *device_open(const char *name, int32_t n_threads, bool precise);

#endif
