/* persist_chain: can one persistent kernel stream a decode step's products
 * closer to the read ceiling than a kernel per product? Session 18 measured
 * qwen3-8b's step without attention at 4.475 ms, its products alone at 4.43
 * in bench_gemv, where #8's 85% of the roofline needs 3.73 ms for the whole
 * step. This is the products' chain of qwen3-8b (36 layers of q/k/v, o,
 * gate/up, down, then the LM head; bf16 weights, fp32 activations, the
 * norms, SwiGLU and residual adds as the engine applies them; attention left
 * out, o reading q's rows in its place) in two forms with the same blocks,
 * the same row split and the same arithmetic, so their outputs must match
 * bit for bit:
 *   - per product: one launch each, the 145 launches replayed as a CUDA graph;
 *   - persistent: one cooperative launch, a grid-wide barrier between
 *     products; before each barrier a block may ask the L2 for the first
 *     `pf` bytes of its rows of the next weight, which do not depend on the
 *     barrier (the prefetch that would hide it).
 * A block owns a contiguous range of rows (the products' rows split evenly
 * over the grid) and stages the product's input in shared memory (applying
 * the op before it: RMSNorm, SwiGLU); its 8 warps split K, each summing
 * its slice for RB rows at a time, and the block adds the slices in warp
 * order. Each step's time is the mean of 20; a persistent step's includes
 * its launch (the graph's do not wait on the host between steps).
 *
 *   nvcc -O3 -arch=sm_90 tools/device/persist_chain.cu -o /tmp/persist_chain && /tmp/persist_chain */
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (x);                                                                             \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "persist_chain: %s: %s\n", #x, cudaGetErrorString(e_));                       \
            return 1;                                                                                     \
        }                                                                                                 \
    } while (0)

enum { HID = 4096, QKV = 6144, INTER = 12288, LAYERS = 36, VOCAB = 151936, WARPS = 8, MAX_ROWS = 256 };
enum { P_QKV, P_O, P_GU, P_DOWN, P_HEAD }; /* a product's kind */

struct chain {
    const __nv_bfloat16 *w[LAYERS][4]; /* [M][K] each: qkv, o, gate/up (gate rows then up), down */
    const __nv_bfloat16 *head;         /* [VOCAB][HID] */
    const float *norm;                 /* [HID], every norm's weight */
    float *h;                          /* [HID] the residual */
    float *qkv, *gu;                   /* [QKV], [2 * INTER] */
    float *logits;                     /* [VOCAB] */
    unsigned *bar;                     /* the grid barrier's arrivals, counting up */
    int pf;                            /* bytes of the next weight's rows asked of the L2 before a barrier */
};

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* product number i of the chain: its kind, weight and shape */
__device__ void prod_get(const chain &c, int i, int &kind, const __nv_bfloat16 *&w, int &M, int &K)
{
    if (i == LAYERS * 4) {
        kind = P_HEAD, w = c.head, M = VOCAB, K = HID;
        return;
    }
    kind = i % 4;
    w = c.w[i / 4][kind];
    const int Ms[4] = {QKV, HID, 2 * INTER, HID}, Ks[4] = {HID, HID, HID, INTER};
    M = Ms[kind], K = Ks[kind];
}

__device__ __forceinline__ void block_rows(int M, int &r0, int &r1)
{
    r0 = (int)((long long)M * blockIdx.x / gridDim.x);
    r1 = (int)((long long)M * (blockIdx.x + 1) / gridDim.x);
}

/* the input of a product, with the op before it, into xs [K] */
__device__ void stage(const chain &c, int kind, int K, float *xs, float *red)
{
    const float *src = kind == P_O ? c.qkv : kind == P_DOWN ? c.gu : c.h;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float v = src[i];
        if (kind == P_DOWN) {
            const float g = v, u = c.gu[INTER + i];
            v = g / (1.0f + expf(-g)) * u;
        }
        xs[i] = v;
        ss += v * v;
    }
    if (kind == P_O || kind == P_DOWN) {
        __syncthreads();
        return;
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < WARPS; w++)
        t += red[w];
    const float inv = rsqrtf(t / (float)K + 1e-6f);
    for (int i = threadIdx.x; i < K; i += blockDim.x)
        xs[i] = c.norm[i] * (xs[i] * inv);
    __syncthreads();
}

/* rows r0..r1 of w [M][K] times xs: warp w sums columns [w*K/8, (w+1)*K/8)
 * for RB rows at a time, 16 bytes a lane a load */
template <int K, int RB>
__device__ void gemv(const __nv_bfloat16 *w, int r0, int r1, const float *xs, float *part)
{
    constexpr int SL = K / WARPS, CH = SL / 256; /* a warp's slice; its 256-column chunks */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, k0 = warp * SL;
    for (int r = r0; r < r1; r += RB) {
        uint4 v[RB][CH];
#pragma unroll
        for (int j = 0; j < RB; j++)
#pragma unroll
            for (int ch = 0; ch < CH; ch++) {
                const int row = min(r + j, r1 - 1);
                v[j][ch] = __ldg((const uint4 *)(w + (long long)row * K + k0 + ch * 256 + lane * 8));
            }
        float acc[RB];
#pragma unroll
        for (int j = 0; j < RB; j++) {
            acc[j] = 0.0f;
#pragma unroll
            for (int ch = 0; ch < CH; ch++) {
                const float *x = xs + k0 + ch * 256 + lane * 8;
                const __nv_bfloat162 *p = (const __nv_bfloat162 *)&v[j][ch];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __bfloat1622float2(p[e]);
                    acc[j] = fmaf(f.x, x[2 * e], acc[j]);
                    acc[j] = fmaf(f.y, x[2 * e + 1], acc[j]);
                }
            }
            acc[j] = warp_sum(acc[j]);
        }
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < RB; j++)
                if (r + j < r1)
                    part[warp * MAX_ROWS + (r + j - r0)] = acc[j];
    }
}

/* product i for this block's rows: stage, multiply, add the warps' slices
 * in order, write (residual products add to h) */
__device__ void prod_run(const chain &c, int i, float *xs, float *part, float *red)
{
    int kind, M, K, r0, r1;
    const __nv_bfloat16 *w;
    prod_get(c, i, kind, w, M, K);
    block_rows(M, r0, r1);
    stage(c, kind, K, xs, red);
    float *out = kind == P_QKV ? c.qkv : kind == P_GU ? c.gu : kind == P_HEAD ? c.logits : c.h;
    for (int q0 = r0; q0 < r1; q0 += MAX_ROWS) { /* MAX_ROWS rows at a time (the LM head's ~1,150 a block) */
        const int q1 = min(r1, q0 + MAX_ROWS);
        if (K == INTER)
            gemv<INTER, 2>(w, q0, q1, xs, part);
        else
            gemv<HID, 4>(w, q0, q1, xs, part);
        __syncthreads();
        for (int r = q0 + threadIdx.x; r < q1; r += blockDim.x) {
            float s = 0.0f;
            for (int wi = 0; wi < WARPS; wi++)
                s += part[wi * MAX_ROWS + (r - q0)];
            out[r] = (kind == P_O || kind == P_DOWN) ? out[r] + s : s;
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(WARPS * 32) k_one(chain c, int i)
{
    extern __shared__ float sm[];
    prod_run(c, i, sm, sm + INTER, sm + INTER + WARPS * MAX_ROWS);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void __launch_bounds__(WARPS * 32) k_persist(chain c)
{
    extern __shared__ float sm[];
    float *xs = sm, *part = sm + INTER, *red = part + WARPS * MAX_ROWS;
    const int n = LAYERS * 4 + 1;
    for (int i = 0; i < n; i++) {
        prod_run(c, i, xs, part, red);
        if (i + 1 == n)
            break;
        if (c.pf > 0) { /* the next weight's first rows of this block, into the L2 */
            int kind, M, K, r0, r1;
            const __nv_bfloat16 *w;
            prod_get(c, i + 1, kind, w, M, K);
            block_rows(M, r0, r1);
            const char *b = (const char *)(w + (long long)r0 * K);
            const long long bytes = min((long long)c.pf, (long long)(r1 - r0) * K * 2);
            for (long long o = (long long)threadIdx.x * 128; o < bytes; o += (long long)blockDim.x * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(b + o));
        }
        /* grid barrier: the arrivals count up, barrier i + 1 waits for (i + 1) * grid */
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(c.bar, 1u);
            const unsigned want = (unsigned)(i + 1) * gridDim.x;
            while (ld_acquire(c.bar) < want)
                ;
        }
        __syncthreads();
    }
}

__global__ void k_fill(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
        p[i] = __float2bfloat16(((float)(x & 0xffff) / 65536.0f - 0.5f) * 0.05f);
    }
}

__global__ void k_init(float *h, float *norm)
{
    for (int i = threadIdx.x; i < HID; i += blockDim.x) {
        h[i] = 0.01f * (float)((i * 37) % 101 - 50);
        norm[i] = 1.0f + 0.001f * (float)(i % 7);
    }
}

int main(void)
{
    int dev = 0, n_sm, coop;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    const size_t per_layer = (size_t)HID * (QKV + HID + 2 * INTER) + (size_t)INTER * HID;
    const size_t n_w = per_layer * LAYERS + (size_t)VOCAB * HID;
    __nv_bfloat16 *wbuf;
    CHECK(cudaMalloc(&wbuf, n_w * 2));
    k_fill<<<4096, 256>>>(wbuf, n_w, 12345u);
    chain c = {};
    size_t off = 0;
    for (int l = 0; l < LAYERS; l++) {
        const size_t sz[4] = {(size_t)QKV * HID, (size_t)HID * HID, (size_t)2 * INTER * HID, (size_t)HID * INTER};
        for (int p = 0; p < 4; p++) {
            c.w[l][p] = wbuf + off;
            off += sz[p];
        }
    }
    c.head = wbuf + off;
    float *fbuf;
    const size_t n_f = 2 * HID + QKV + 2 * INTER + VOCAB;
    CHECK(cudaMalloc(&fbuf, n_f * sizeof(float)));
    CHECK(cudaMemset(fbuf, 0, n_f * sizeof(float)));
    float *norm = fbuf;
    c.norm = norm;
    c.h = fbuf + HID;
    c.qkv = c.h + HID;
    c.gu = c.qkv + QKV;
    c.logits = c.gu + 2 * INTER;
    CHECK(cudaMalloc(&c.bar, sizeof(unsigned)));
    CHECK(cudaDeviceSynchronize()); /* the fills ran on the default stream; the steps run on a non-blocking one */
    const size_t smem = (INTER + WARPS * MAX_ROWS + WARPS) * sizeof(float);
    CHECK(cudaFuncSetAttribute(k_one, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CHECK(cudaFuncSetAttribute(k_persist, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int occ_p, occ_o;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_p, k_persist, WARPS * 32, smem));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_o, k_one, WARPS * 32, smem));
    const double bytes = (double)n_w * 2;
    printf("%d SMs, cooperative %d, resident blocks an SM: persistent %d, per product %d; %.2f GB of weights a step\n",
           n_sm, coop, occ_p, occ_o, bytes / 1e9);
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float *ref = (float *)malloc(VOCAB * sizeof(float)), *got = (float *)malloc(VOCAB * sizeof(float));
    const int steps = 20, n_prod = LAYERS * 4 + 1;
    for (int bps = 1; bps <= occ_p && bps <= occ_o; bps++) {
        const int grid = n_sm * bps;
        /* per product, as a graph */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < n_prod; i++)
            k_one<<<grid, WARPS * 32, smem, st>>>(c, i);
        CHECK(cudaStreamEndCapture(st, &g));
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        k_init<<<1, 256, 0, st>>>(c.h, norm);
        CHECK(cudaGraphLaunch(ge, st));
        CHECK(cudaMemcpyAsync(ref, c.logits, VOCAB * sizeof(float), cudaMemcpyDeviceToHost, st));
        CHECK(cudaStreamSynchronize(st));
        CHECK(cudaEventRecord(e0, st));
        for (int s = 0; s < steps; s++)
            CHECK(cudaGraphLaunch(ge, st));
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= steps;
        printf("blocks %4d  per product (graph)   %.3f ms a step  %.2f TB/s  %.1f%% of 4.8\n", grid, ms,
               bytes / ms / 1e9, 100.0 * bytes / ms / 1e9 / 4.8);
        CHECK(cudaGraphExecDestroy(ge));
        CHECK(cudaGraphDestroy(g));
        if (!coop)
            continue;
        const int pfs[4] = {0, 8192, 32768, 65536};
        for (int pi = 0; pi < 4; pi++) {
            c.pf = pfs[pi];
            float sum = 0.0f;
            bool same = true;
            for (int s = 0; s < steps; s++) {
                k_init<<<1, 256, 0, st>>>(c.h, norm);
                CHECK(cudaMemsetAsync(c.bar, 0, sizeof(unsigned), st));
                void *args[] = {&c};
                CHECK(cudaEventRecord(e0, st));
                CHECK(cudaLaunchCooperativeKernel((void *)k_persist, grid, WARPS * 32, args, smem, st));
                CHECK(cudaEventRecord(e1, st));
                CHECK(cudaEventSynchronize(e1));
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                sum += ms;
                if (s == 0) {
                    CHECK(cudaMemcpy(got, c.logits, VOCAB * sizeof(float), cudaMemcpyDeviceToHost));
                    same = memcmp(got, ref, VOCAB * sizeof(float)) == 0;
                }
            }
            ms = sum / steps;
            printf("blocks %4d  persistent, pf %5d  %.3f ms a step  %.2f TB/s  %.1f%% of 4.8  (logits %s)\n", grid,
                   c.pf, ms, bytes / ms / 1e9, 100.0 * bytes / ms / 1e9 / 4.8,
                   same ? "bitwise the per-product ones" : "DIFFER");
        }
    }
    return 0;
}
