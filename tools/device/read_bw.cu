/* read_bw: the read bandwidth one GPU reaches streaming a buffer several
 * times its L2, 16 bytes per thread per load, several loads in flight: the
 * ceiling tools/bench_gemv's products are compared against (the H200's
 * datasheet says 4.8 TB/s; a kernel reads less than that). Then the same
 * bytes read as a matrix of 8 KB rows (qwen3-8b's K = 4096 in bf16), a warp
 * owning 16 rows and each load instruction reading 512 bytes of them in one
 * of three shapes: 8 rows x 64 bytes (the mma fragments' own; also with the
 * L2 asked to fetch 256 bytes around each miss), 4 rows x 128 bytes (what
 * k_mmv's cp.async copies), or 1 row x 512 bytes.
 *
 *   nvcc -O3 -arch=sm_90 tools/device/read_bw.cu -o /tmp/read_bw && /tmp/read_bw */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (x);                                                                             \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "read_bw: %s: %s\n", #x, cudaGetErrorString(e_));                             \
            return 1;                                                                                     \
        }                                                                                                 \
    } while (0)

/* each thread reads UNROLL 16-byte words per round, grid-strided; the xor
 * keeps the loads from being dropped */
template <int UNROLL>
__global__ void k_read(const uint4 *p, size_t n, unsigned *sink)
{
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const size_t j = i + u * stride;
            if (j < n)
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                             : "l"(p + j));
            else
                v[u] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

/* One warp per 16 rows of 8 KB, 16 loads of 16 bytes in flight per lane,
 * instruction s of a batch of 16 reading, by shape: rows g and g+8 at
 * 64-byte column blocks (shape 0), rows lane/8 + 4i at 128-byte blocks
 * (shape 1), or one row's 512 bytes (shape 2). */
template <int SHAPE>
__global__ void k_rows(const char *p, unsigned *sink)
{
    const int lane = threadIdx.x & 31;
    const char *w = p + ((size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 16 * 8192;
    unsigned acc = 0;
    for (int b = 0; b < 8192 / 512; b++) {
        uint4 v[16];
#pragma unroll
        for (int s = 0; s < 16; s++) {
            int row, off;
            if (SHAPE == 0 || SHAPE == 3) {
                row = lane / 4 + 8 * (s % 2);
                off = b * 512 + (s / 2) * 64 + (lane % 4) * 16;
            } else if (SHAPE == 1) {
                row = lane / 8 + 4 * (s % 4);
                off = b * 512 + (s / 4) * 128 + (lane % 8) * 16;
            } else {
                row = s;
                off = b * 512 + lane * 16;
            }
            if (SHAPE == 3) /* shape 0, the L2 asked to fetch 256 bytes around each miss */
                asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[s].x), "=r"(v[s].y), "=r"(v[s].z), "=r"(v[s].w)
                             : "l"(w + (size_t)row * 8192 + off));
            else
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[s].x), "=r"(v[s].y), "=r"(v[s].z), "=r"(v[s].w)
                             : "l"(w + (size_t)row * 8192 + off));
        }
#pragma unroll
        for (int s = 0; s < 16; s++)
            acc ^= v[s].x ^ v[s].y ^ v[s].z ^ v[s].w;
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

template <int SHAPE>
static float time_rows(const char *p, size_t bytes, unsigned *sink, cudaEvent_t a, cudaEvent_t b)
{
    const unsigned blocks = (unsigned)(bytes / (8 * 16 * 8192));
    k_rows<SHAPE><<<blocks, 256>>>(p, sink);
    cudaEventRecord(a);
    for (int r = 0; r < 5; r++)
        k_rows<SHAPE><<<blocks, 256>>>(p, sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    return (float)(5.0 * bytes / (ms * 1e-3) / 1e12);
}

int main()
{
    const size_t bytes = (size_t)4 << 30; /* 4 GiB: many times the 50-60 MB L2 */
    uint4 *p;
    unsigned *sink;
    int n_sm = 0;
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMalloc(&sink, sizeof(unsigned)));
    CHECK(cudaMemset(p, 1, bytes));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    const size_t n = bytes / 16;
    for (int per_sm = 1; per_sm <= 8; per_sm *= 2)
        for (int threads = 256; threads <= 1024; threads *= 2) {
            const int blocks = n_sm * per_sm;
            k_read<8><<<blocks, threads>>>(p, n, sink);
            CHECK(cudaEventRecord(a));
            for (int r = 0; r < 5; r++)
                k_read<8><<<blocks, threads>>>(p, n, sink);
            CHECK(cudaEventRecord(b));
            CHECK(cudaEventSynchronize(b));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, a, b));
            printf("read_bw: %4d blocks x %4d threads: %.2f TB/s\n", blocks, threads, 5.0 * bytes / (ms * 1e-3) / 1e12);
        }
    printf("read_bw: 8 KB rows, a load of 8 rows x 64 B: %.2f TB/s (%.2f with .L2::256B), 4 x 128 B: %.2f TB/s, "
           "1 x 512 B: %.2f TB/s\n",
           time_rows<0>((const char *)p, bytes, sink, a, b), time_rows<3>((const char *)p, bytes, sink, a, b),
           time_rows<1>((const char *)p, bytes, sink, a, b), time_rows<2>((const char *)p, bytes, sink, a, b));
    CHECK(cudaGetLastError());
    return 0;
}
