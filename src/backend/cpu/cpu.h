/* cpu: the host backend. Ops run on a thread pool with the widest kernel
 * table the CPU supports (kern.h); tensor memory is host memory and weights are
 * used in place from the checkpoint's mmap. */
#ifndef KP_CPU_H
#define KP_CPU_H

#include "../backend.h"
#include "kern.h"

#include <stddef.h>

/* n_threads <= 0: one per online core. kern NULL: kern_best(). NULL with err_set() on failure. */
struct backend *cpu_backend_init(int32_t n_threads, const struct kern *kern);
/* A backend starts fast: block-type weights multiply activations rounded to
 * int8 (kern.h's matmul_q8), and BF16 weights activations rounded to bf16
 * (matmul_bf16_bf16), where its table has such kernels for the CPU. Precise
 * keeps them exact instead (kapitsa check, bitwise comparisons): the
 * products of the (dequantised) weights by the fp32 activations in fp32. */
void cpu_backend_set_precise(struct backend *be, bool precise);
/* How many runs of rows the last attention split its batch into (each run's
 * keys read once for all its rows), for the tests. */
int32_t cpu_backend_att_runs(const struct backend *be);

/* The processor as /proc/cpuinfo and the kernel tables see it. */
struct cpu_host {
    char model[256];
    int32_t n_cores;    /* online */
    bool avx2, avx512;  /* the kernel tables of those names run here */
    bool avx512_bf16, amx_bf16;
    const char *kernels; /* the widest table that runs here (static) */
};
void cpu_host_query(struct cpu_host *h);
/* The kernel tables built in and the one this CPU runs, as one line. */
void cpu_kernels_describe(char *buf, size_t n);
/* backend_ops.info of the cpu backend (cpu_host.c): the read bandwidth
 * measured once with the backend's threads. */
void cpu_info(struct backend *be, struct device_info *out, bool measure);

#endif
