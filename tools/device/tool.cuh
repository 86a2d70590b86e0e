/* tool.cuh: what the standalone device tools (tma_bw.cu, mmv_bounds.cu)
 * share. A tool defines TOOL, its name, before including this. */
#ifndef KP_TOOL_CUH
#define KP_TOOL_CUH

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

/* a failed CUDA call ends the tool, saying which and where */
#define CHECK(x)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (x);                                                                             \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "%s: %s: %s (line %d)\n", TOOL, #x, cudaGetErrorString(e_), __LINE__);        \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

/* c += a b on the tensor cores: mma.sync m16n8k16, bf16 operands, fp32 sums
 * (the engine's mma_bf16, cuda_impl.h) */
static __device__ __forceinline__ void mma(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#endif
