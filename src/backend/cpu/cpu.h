/* cpu: the host backend. Ops run on a thread pool with the widest kernel
 * table the CPU supports (kern.h); tensor memory is host memory and weights are
 * used in place from the checkpoint's mmap. */
#ifndef KP_CPU_H
#define KP_CPU_H

#include "../backend.h"
#include "kern.h"

/* n_threads <= 0: one per online core. kern NULL: kern_best(). NULL with err_set() on failure. */
struct backend *cpu_backend_init(int32_t n_threads, const struct kern *kern);
/* A backend starts fast: block-type weights multiply activations rounded to
 * int8 (kern.h's matmul_q8), and BF16 weights activations rounded to bf16
 * (matmul_bf16_bf16), where its table has such kernels for the CPU. Precise
 * keeps them exact instead (kapitsa check, bitwise comparisons): the
 * products of the (dequantised) weights by the fp32 activations in fp32. */
void cpu_backend_set_precise(struct backend *be, bool precise);

#endif
