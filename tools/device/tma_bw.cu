/* tma_bw: how fast a decode product's weights reach the tensor cores, by
 * the way they are fetched, with the products of qwen3-8b's shapes (q/k/v,
 * o, gate/up, down; 36 layers each with its own weights, so nothing is an L2
 * hit) and the mma work of one token per weight (two products of m16n8k16
 * per 16 bytes of a row, as k_mmv does). Every launch is a programmatic
 * dependent of the one before, so its weights may be requested before that
 * one ends.
 *   reg:    k_mmv's loads: a lane 16 bytes of rows g and g+8 per 32 k, two
 *           groups of 4 such loads in flight in registers, 2 blocks per SM;
 *   bulk:   a producer warp copies each row's next 2*CK bytes into a ring of
 *           NS shared-memory stages with 1-D bulk copies (cp.async.bulk),
 *           8 warps multiply from shared memory; P blocks per SM;
 *   tensor: the same with 2-D tensor-map copies of 128 rows x 64 k boxes
 *           (128-byte swizzle: no bank conflicts).
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/tma_bw.cu -o /tmp/tma_bw && /tmp/tma_bw */
#include <cstdio>
#include <cstdint>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#define TOOL "tma_bw"
#include "tool.cuh"

enum { ROWS = 128, N_LAYER = 36 };

struct job {
    const uint16_t *w; /* [M][K] */
    int M, K, kslice;
    float *sink;
};

/* a k32 block of rows g, g+8 (a, b) times a token's hi and lo halves */
static __device__ __forceinline__ void mma4(float *acc, uint4 a, uint4 b, uint4 h)
{
    mma(acc, a.x, b.x, a.y, b.y, h.x, h.y);
    mma(acc, a.z, b.z, a.w, b.w, h.z, h.w);
    mma(acc, a.x, b.x, a.y, b.y, h.y, h.x);
    mma(acc, a.z, b.z, a.w, b.w, h.w, h.z);
}
static __device__ __forceinline__ void sink(const job &j, const float *acc)
{
    if (acc[0] + acc[1] + acc[2] + acc[3] == 12345.0f)
        *j.sink = acc[0];
}
static __device__ __forceinline__ void dep_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
static __device__ __forceinline__ void dep_launch(void) { asm volatile("griddepcontrol.launch_dependents;\n" ::); }
static __device__ __forceinline__ unsigned s32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* ---- reg ---- */
__global__ void __launch_bounds__(256, 2) k_reg(const __grid_constant__ job j)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    const int r0 = blockIdx.x * ROWS + warp * 16;
    const uint16_t *w0 = j.w + (size_t)(r0 + g) * j.K + cq * 8, *w1 = w0 + (size_t)8 * j.K;
    const int kb = blockIdx.y * j.kslice, ke = min(j.K, kb + j.kslice), nblk = (ke - kb) / 32;
    uint4 wa[4][2], wb[4][2];
    const uint4 h = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
    float acc[4] = {0, 0, 0, 0};
    dep_launch();
    auto load = [&](uint4(*v)[2], int b0) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const bool in = b0 + u < nblk;
            v[u][0] = in ? ld_stream(w0 + kb + (b0 + u) * 32) : make_uint4(0, 0, 0, 0);
            v[u][1] = in ? ld_stream(w1 + kb + (b0 + u) * 32) : make_uint4(0, 0, 0, 0);
        }
    };
    load(wa, 0);
    load(wb, 4);
    dep_wait();
    for (int b0 = 0; b0 < nblk; b0 += 8) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            mma4(acc, wa[u][0], wa[u][1], h);
        load(wa, b0 + 8);
#pragma unroll
        for (int u = 0; u < 4; u++)
            mma4(acc, wb[u][0], wb[u][1], h);
        load(wb, b0 + 12);
    }
    sink(j, acc);
}

/* ---- the ring ---- */
static __device__ __forceinline__ void mbar_init(uint64_t *b, unsigned n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(s32(b)), "r"(n));
}
static __device__ __forceinline__ void mbar_expect(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(s32(b)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(s32(b)) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    asm volatile("{\n .reg .pred p;\n W_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W_%=;\n}\n" ::"r"(
                     s32(b)),
                 "r"(parity)
                 : "memory");
}
static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar,
                                                 uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
                 "%4;" ::"r"(s32(dst)),
                 "l"(src), "r"(bytes), "r"(s32(bar)), "l"(pol)
                 : "memory");
}
static __device__ __forceinline__ void tensor_copy(void *dst, const CUtensorMap *m, int k, int row, uint64_t *bar,
                                                   uint64_t pol)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
                 "[%1, {%2, %3}], [%4], %5;" ::"r"(s32(dst)),
                 "l"((uint64_t)m), "r"(k), "r"(row), "r"(s32(bar)), "l"(pol)
                 : "memory");
}

/* MODE 0: bulk rows, stage pitch 2*CK+16 bytes; MODE 1: tensor boxes of 64 k,
 * [CK/64][128 rows][128 bytes] swizzled */
template <int MODE, int CK, int NS>
__global__ void __launch_bounds__(288, 1) k_ring(const __grid_constant__ job j, const __grid_constant__ CUtensorMap tm)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    constexpr int STAGE = MODE == 0 ? ROWS * (2 * CK + 16) : ROWS * 2 * CK;
    __shared__ uint64_t full[NS], empty[NS];
    unsigned char *ring = (unsigned char *)(((uintptr_t)smem + 1023) & ~(uintptr_t)1023);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rb = blockIdx.x * ROWS;
    const int kb = blockIdx.y * j.kslice, ke = min(j.K, kb + j.kslice), n_st = (ke - kb + CK - 1) / CK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    dep_launch();
    if (warp == 8) { /* producer */
        uint64_t pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        for (int it = 0; it < n_st; it++) {
            const int s = it % NS, kc = kb + it * CK, len = min(CK, ke - kc);
            if (it >= NS)
                mbar_wait(&empty[s], ((it / NS) & 1) ^ 1);
            unsigned char *st = ring + (size_t)s * STAGE;
            if (MODE == 0) {
                if (lane == 0)
                    mbar_expect(&full[s], ROWS * len * 2);
                __syncwarp();
                for (int r = lane; r < ROWS; r += 32)
                    bulk_copy(st + r * (2 * CK + 16), j.w + (size_t)(rb + r) * j.K + kc, len * 2, &full[s], pol);
            } else if (lane == 0) {
                mbar_expect(&full[s], STAGE);
                for (int b = 0; b < CK / 64; b++)
                    tensor_copy(st + b * ROWS * 128, &tm, kc + b * 64, rb, &full[s], pol);
            }
        }
        return;
    }
    const int g = lane >> 2, cq = lane & 3, r0 = warp * 16;
    const uint4 h = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
    float acc[4] = {0, 0, 0, 0};
    dep_wait();
    for (int it = 0; it < n_st; it++) {
        const int s = it % NS;
        mbar_wait(&full[s], (it / NS) & 1);
        const unsigned char *st = ring + (size_t)s * STAGE;
#pragma unroll
        for (int b = 0; b < CK / 32; b++) {
            uint4 a, c;
            if (MODE == 0) {
                a = *(const uint4 *)(st + (r0 + g) * (2 * CK + 16) + b * 64 + cq * 16);
                c = *(const uint4 *)(st + (r0 + g + 8) * (2 * CK + 16) + b * 64 + cq * 16);
            } else {
                const unsigned char *bx = st + (b / 2) * ROWS * 128;
                const int ch = ((b & 1) * 4 + cq);
                a = *(const uint4 *)(bx + (r0 + g) * 128 + ((ch ^ ((r0 + g) & 7)) << 4));
                c = *(const uint4 *)(bx + (r0 + g + 8) * 128 + ((ch ^ ((r0 + g + 8) & 7)) << 4));
            }
            mma4(acc, a, c, h);
        }
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&empty[s]);
    }
    sink(j, acc);
}

/* the split of mmv_run: blocks close to whole waves of `resident` */
static int split(int M, int K, int resident, int *kslice)
{
    const int bx = (M + ROWS - 1) / ROWS;
    double best = 0;
    int ns = 1;
    *kslice = K;
    for (int want = 1; want <= 32 && want * 128 <= K && best < 0.9; want++) {
        const int sl = ((K + want - 1) / want + 127) / 128 * 128, n = (K + sl - 1) / sl;
        const long blocks = (long)bx * n;
        const double fill = (double)blocks / (double)(((blocks + resident - 1) / resident) * resident);
        if (fill > best + 0.02) {
            best = fill;
            ns = n;
            *kslice = sl;
        }
    }
    return ns;
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;

struct shape {
    const char *name;
    int M, K;
    uint16_t *w[N_LAYER];
    CUtensorMap tm[N_LAYER];
};

typedef void (*kfn)(job, CUtensorMap);

static void launch(const void *fn, int per_sm_grid, size_t smem, int threads, shape &s, int l, float *sk, int n_sm,
                   bool reg)
{
    job j;
    j.w = s.w[l];
    j.M = s.M;
    j.K = s.K;
    j.sink = sk;
    const int ns = split(s.M, s.K, per_sm_grid * n_sm, &j.kslice);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((s.M + ROWS - 1) / ROWS, ns);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    if (reg)
        CHECK(cudaLaunchKernelEx(&cfg, (void (*)(job))fn, j));
    else
        CHECK(cudaLaunchKernelEx(&cfg, (kfn)fn, j, s.tm[l]));
}

struct variant {
    const void *fn;
    int per_sm_grid;
    size_t smem;
    int threads;
    bool reg;
};

int main()
{
    int n_sm = 0;
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &q));
    shape sh[4] = {{"q/k/v", 6144, 4096, {}, {}},
                   {"o", 4096, 4096, {}, {}},
                   {"gate/up", 24576, 4096, {}, {}},
                   {"down", 4096, 12288, {}, {}}};
    for (auto &s : sh)
        for (int l = 0; l < N_LAYER; l++) {
            const size_t bytes = (size_t)s.M * s.K * 2;
            CHECK(cudaMalloc(&s.w[l], bytes));
            CHECK(cudaMemset(s.w[l], 0x3c, bytes));
            cuuint64_t dims[2] = {(cuuint64_t)s.K, (cuuint64_t)s.M}, strides[1] = {(cuuint64_t)s.K * 2};
            cuuint32_t box[2] = {64, 128}, es[2] = {1, 1};
            if (encode(&s.tm[l], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, s.w[l], dims, strides, box, es,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
                fprintf(stderr, "tma_bw: cuTensorMapEncodeTiled failed\n");
                return 1;
            }
        }
    float *sk;
    CHECK(cudaMalloc(&sk, 4));
    struct {
        const char *name;
        variant v;
    } vs[] = {
        {"reg (k_mmv's loads), 2/SM", {(const void *)k_reg, 2, 0, 256, true}},
        {"bulk CK128 NS3 1/SM", {(const void *)k_ring<0, 128, 3>, 1, 3 * ROWS * (256 + 16) + 1024, 288, false}},
        {"bulk CK128 NS6 1/SM", {(const void *)k_ring<0, 128, 6>, 1, 6 * ROWS * (256 + 16) + 1024, 288, false}},
        {"bulk CK256 NS3 1/SM", {(const void *)k_ring<0, 256, 3>, 1, 3 * ROWS * (512 + 16) + 1024, 288, false}},
        {"bulk CK128 NS3 2/SM", {(const void *)k_ring<0, 128, 3>, 2, 3 * ROWS * (256 + 16) + 1024, 288, false}},
        {"tensor CK128 NS3 1/SM", {(const void *)k_ring<1, 128, 3>, 1, 3 * ROWS * 256 + 1024, 288, false}},
        {"tensor CK128 NS6 1/SM", {(const void *)k_ring<1, 128, 6>, 1, 6 * ROWS * 256 + 1024, 288, false}},
        {"tensor CK128 NS3 2/SM", {(const void *)k_ring<1, 128, 3>, 2, 3 * ROWS * 256 + 1024, 288, false}},
        {"tensor CK64 NS6 1/SM", {(const void *)k_ring<1, 64, 6>, 1, 6 * ROWS * 128 + 1024, 288, false}},
    };
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (auto &x : vs) {
        if (!x.v.reg)
            CHECK(cudaFuncSetAttribute(x.v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)x.v.smem));
        printf("%-26s", x.name);
        for (int k = 0; k <= 4; k++) { /* each kind alone, then a step's order */
            for (int rep = 0; rep < 2; rep++) {
                CHECK(cudaEventRecord(e0));
                double bytes = 0;
                for (int l = 0; l < N_LAYER; l++)
                    for (int i = 0; i < 4; i++) {
                        if (k < 4 && i != k)
                            continue;
                        launch(x.v.fn, x.v.per_sm_grid, x.v.smem, x.v.threads, sh[i], l, sk, n_sm, x.v.reg);
                        bytes += 2.0 * sh[i].M * sh[i].K;
                    }
                CHECK(cudaEventRecord(e1));
                CHECK(cudaEventSynchronize(e1));
                float ms;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (rep == 1) {
                    if (k < 4)
                        printf("  %s %5.1f us %4.2f", sh[k].name, ms * 1e3 / N_LAYER, bytes / (ms * 1e-3) / 1e12);
                    else
                        printf("  step %6.3f ms %4.2f TB/s\n", ms, bytes / (ms * 1e-3) / 1e12);
                }
            }
        }
    }
    CHECK(cudaGetLastError());
    return 0;
}
