/* mmv_bounds: what bounds a decode step's products, in two parts.
 *
 * shapes: one token's product out = W x on the tensor cores (bf16 W [M][K],
 * bf16 x, fp32 sums), the weights loaded in four shapes of a warp's load
 * instruction: 8 rows x 64 bytes (the mma fragments' own, k_mmv's; with and
 * without the L2 asked for 256 bytes around a miss), 4 rows x 128 bytes,
 * 2 x 256, 1 x 512. read_bw.cu found the shape decides the bandwidth of
 * loads alone; this asks whether a product keeps that once it multiplies.
 * A shape other than the fragments' feeds the mma so: its 16 A rows are
 * (weight row, piece of 32 consecutive k) pairs, rows loaded RPL at a time,
 * 8/RPL pieces each; its 8 B columns hold x at the same pieces, column c the
 * piece of A row c, so that A row g times column g is the piece's partial
 * dot product (the diagonal; the mma's other outputs are dropped). A lane's
 * 8 weights and its 8 inputs have the same k. A row's pieces are added by
 * shuffles at the end. One more variant loads 4 rows x 128 bytes and moves
 * the bytes into the fragments' registers by shuffles (shuf_rows), so its
 * arithmetic, and a token's bits, are k_mmv's: what the H200's 6-10% for
 * that shape keeps once it pays for the shuffles. Outputs are
 * checked against a double-precision sum.
 *
 * chain: qwen3-8b's four products of a layer (q/k/v 6144 x 4096, o 4096 x
 * 4096, gate/up 24576 x 4096, down 4096 x 12288; one token), 36 layers of
 * distinct weights chained (each product's input the first K outputs of the
 * one before), in blocks of k_mmv's form (8 warps of 16 rows, a K slice
 * each, K split as k_mmv splits it):
 *   launches:   a kernel a product, one after another, the slices added by atomics;
 *   dependents: the same launched as programmatic dependents (a block's
 *               first two groups of weights requested before it waits);
 *   persistent: one kernel of two blocks an SM for the whole chain, a grid
 *               barrier between products, a block requesting its first
 *               tile's weights of the next product before it arrives;
 *   then dependents with k_mmv's own pieces: its split-K ending (partial
 *   sums through memory, the last block of a row unit adding them in
 *   order), its input ops (RMSNorm's sums of squares, SwiGLU), gate/up
 *   unsplit in blocks of 6 or 12 warps (no ending), and gate/up's slices
 *   left in memory for down to add as it stages them (gate/up without its
 *   ending; down reading 4 sums an input where it read 1); last, the
 *   persistent kernel with its weights copied ahead into a ring in shared
 *   memory (k_ring), so that the memory keeps streaming through the
 *   barriers; and the split-K ending in a thread-block cluster (a unit's
 *   slices one cluster, each block adding its share of the rows from the
 *   others' shared memory, in split order), also with k_mmv's dynamic
 *   shared-memory attribute (its largest batch's room allowed, a decode
 *   step's used). Attention is left out: this times the products against
 *   read_bw.cu's streaming ceiling.
 * (persist_chain.cu compared graphs with a persistent kernel
 * in blocks of its own.)
 *
 * "graph" runs the chain's per-product forms captured in a CUDA graph, as a
 * decode step runs them.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/mmv_bounds.cu -o /tmp/mmv_bounds && /tmp/mmv_bounds [shapes|chain|graph] */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <vector>

namespace cg = cooperative_groups;

#define TOOL "mmv_bounds"
#include "tool.cuh"

#define U 4 /* k32 blocks a group of weight loads covers (shapes: steps) */

/* 16 bytes of weights, not kept in L1; HINT: the L2 fetches the 256 around a miss */
template <bool HINT> static __device__ __forceinline__ uint4 ld_w(const uint16_t *p)
{
    uint4 v;
    if (HINT)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    return v;
}

/* n bf16 values, uniform in [-scale/2, scale/2) by a hash of their index */
__global__ void k_fill(uint16_t *p, size_t n, uint32_t seed, float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(((h & 0xffff) / 65536.0f - 0.5f) * scale));
    }
}

/* ---- shapes ---- */

#define SLICE 1024 /* K per block */

/* SHUF: the fragments' registers (RPL 8) loaded as 4 rows x 128 bytes and
 * moved into place by shuffles when they are multiplied (so the next group's
 * loads are in flight meanwhile), the arithmetic k_mmv's own. A
 * warp's 16 rows and 64 k take four loads: rows 0-3, 4-7, 8-11, 12-15 (L0..L3),
 * lanes 8r..8r+7 reading row r's 128 bytes; in L1 and L3 lane c of a row
 * reads its piece (c + 4) % 8. Lane (g, cq) needs row g's pieces cq (k32
 * block 0) and 4 + cq (block 1), and row g + 8's: for block 0 rows g < 4
 * find theirs in L0 at lane 8g + cq, rows g >= 4 in L1 at lane 8(g - 4) + 4
 * + cq, so a source lane gives L0 where its piece c < 4 and L1 where not,
 * and one shuffle serves every lane; block 1 the other way round. Four
 * shuffles of 4 bytes a 16-byte load. */
static __device__ __forceinline__ void shuf_rows(uint4 &o0, uint4 &o1, const uint4 lo, const uint4 hi)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    const bool first = (lane & 7) < 4;
    const int s0 = 8 * (g & 3) + (g < 4 ? 0 : 4) + cq, s1 = 8 * (g & 3) + (g < 4 ? 4 : 0) + cq;
    const uint32_t l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z, hi.w};
    uint32_t r0[4], r1[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        r0[i] = __shfl_sync(0xffffffffu, first ? l[i] : h[i], s0);
        r1[i] = __shfl_sync(0xffffffffu, first ? h[i] : l[i], s1);
    }
    o0 = make_uint4(r0[0], r0[1], r0[2], r0[3]);
    o1 = make_uint4(r1[0], r1[1], r1[2], r1[3]);
}

/* a block: 8 warps of 16 rows, K slice blockIdx.y; sums added to out */
template <int RPL, bool HINT, bool SHUF = false>
__global__ void __launch_bounds__(256, 2) k_gemv(const uint16_t *W, const __nv_bfloat16 *x, int K, float *out)
{
    static_assert(U % 2 == 0 && (!SHUF || RPL == 8), "SHUF: the fragments' layout; whole 64-k chunks");
    constexpr int LPR = 32 / RPL, SEG = 256 / RPL, NG = 8 / RPL, SPG = SLICE / SEG, NU = NG * SPG / U;
    __shared__ __align__(16) __nv_bfloat16 sx[SLICE];
    const int k_beg = blockIdx.y * SLICE;
    for (int i = threadIdx.x * 8; i < SLICE; i += 256 * 8)
        *(uint4 *)(sx + i) = *(const uint4 *)(x + k_beg + i);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    const int r0 = blockIdx.x * 128 + warp * 16, ri = lane / LPR, loff = (lane % LPR) * 8;
    uint4 wa[U][2], wb[U][2];
    const auto load = [&](uint4 (*w)[2], int u) {
        const int s0 = u * U, grp = s0 / SPG, kk = (s0 % SPG) * SEG;
        if (SHUF) {
            const int pc = lane & 7, rr = lane >> 3;
#pragma unroll
            for (int q = 0; q < U / 2; q++) {
                const uint16_t *p = W + (int64_t)(r0 + rr) * K + k_beg + kk + q * 64;
#pragma unroll
                for (int i = 0; i < 4; i++) /* moved into place when multiplied: the loads stay in flight */
                    w[2 * q + (i & 1)][i >> 1] = ld_w<HINT>(p + (int64_t)(4 * i) * K + 8 * ((i & 1) ? (pc + 4) & 7 : pc));
            }
            return;
        }
        const uint16_t *pa = W + (int64_t)(r0 + grp * 2 * RPL + ri) * K + k_beg + kk + loff;
        const uint16_t *pb = pa + (int64_t)RPL * K;
#pragma unroll
        for (int s = 0; s < U; s++) {
            w[s][0] = ld_w<HINT>(pa + s * SEG);
            w[s][1] = ld_w<HINT>(pb + s * SEG);
        }
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const auto mul = [&](const uint4 (*wl)[2], int u) {
        const int s0 = u * U, grp = s0 / SPG, kk = (s0 % SPG) * SEG;
        uint4 sw[U][2];
        if (SHUF)
#pragma unroll
            for (int q = 0; q < U / 2; q++) {
                shuf_rows(sw[2 * q][0], sw[2 * q + 1][0], wl[2 * q][0], wl[2 * q + 1][0]);
                shuf_rows(sw[2 * q][1], sw[2 * q + 1][1], wl[2 * q][1], wl[2 * q + 1][1]);
            }
        const uint4(*w)[2] = SHUF ? sw : wl;
#pragma unroll
        for (int s = 0; s < U; s++) {
            const uint4 a = w[s][0], b = w[s][1], h = *(const uint4 *)(sx + kk + s * SEG + loff);
            mma(acc, a.x, b.x, a.y, b.y, h.x, h.y);
            mma(acc, a.z, b.z, a.w, b.w, h.z, h.w);
        }
        if ((s0 + U) % SPG == 0) { /* the group's rows are done: the diagonal, a row's pieces added */
            const bool mine = cq == (g >> 1);
            float v0 = mine ? ((g & 1) ? acc[1] : acc[0]) : 0.0f, v1 = mine ? ((g & 1) ? acc[3] : acc[2]) : 0.0f;
#pragma unroll
            for (int o = LPR / 2; o > 0; o >>= 1) {
                v0 += __shfl_xor_sync(0xffffffffu, v0, o);
                v1 += __shfl_xor_sync(0xffffffffu, v1, o);
            }
            if (lane % LPR == 0) {
                const int ra = r0 + grp * 2 * RPL + ri;
                atomicAdd(out + ra, v0);
                atomicAdd(out + ra + RPL, v1);
            }
            acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
        }
    };
    load(wa, 0);
    __syncthreads();
    for (int u = 0; u < NU; u += 2) {
        if (u + 1 < NU)
            load(wb, u + 1);
        mul(wa, u);
        if (u + 2 < NU)
            load(wa, u + 2);
        if (u + 1 < NU)
            mul(wb, u + 1);
    }
}

static float bf(uint16_t u)
{
    uint32_t v = (uint32_t)u << 16;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

typedef void (*kern)(const uint16_t *, const __nv_bfloat16 *, int, float *);

static void shapes()
{
    struct {
        const char *name;
        int M, K;
    } shp[] = {{"q/k/v", 6144, 4096}, {"o", 4096, 4096}, {"gate/up", 24576, 4096}, {"down", 4096, 12288}};
    struct {
        const char *name;
        kern k;
    } vars[] = {{"8x64+L2::256B", k_gemv<8, true>}, {"8x64", k_gemv<8, false>},  {"4x128", k_gemv<4, false>},
                {"4x128+256B", k_gemv<4, true>},    {"2x256", k_gemv<2, false>}, {"1x512", k_gemv<1, false>},
                {"1x512+256B", k_gemv<1, true>},    {"4x128 shuffled to 8x64", k_gemv<8, false, true>}};
    const size_t pool = (size_t)3 << 30;
    uint16_t *W;
    __nv_bfloat16 *x;
    float *out;
    CHECK(cudaMalloc(&W, pool));
    CHECK(cudaMalloc(&x, 12288 * 2));
    CHECK(cudaMalloc(&out, 24576 * 4 * 64));
    k_fill<<<1024, 256>>>(W, pool / 2, 1, 0.125f);
    k_fill<<<16, 256>>>((uint16_t *)x, 12288, 7, 0.125f);
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<uint16_t> hx(12288);
    CHECK(cudaMemcpy(hx.data(), x, 12288 * 2, cudaMemcpyDeviceToHost));
    for (auto &s : shp) {
        const size_t bytes = (size_t)s.M * s.K * 2;
        const int n_buf = (int)(pool / bytes) > 64 ? 64 : (int)(pool / bytes);
        std::vector<uint16_t> hw((size_t)s.M * s.K);
        CHECK(cudaMemcpy(hw.data(), W, bytes, cudaMemcpyDeviceToHost));
        std::vector<double> ref(s.M);
        for (int r = 0; r < s.M; r++) {
            double acc = 0.0;
            for (int k = 0; k < s.K; k++)
                acc += (double)bf(hw[(size_t)r * s.K + k]) * bf(hx[k]);
            ref[r] = acc;
        }
        const dim3 grid(s.M / 128, s.K / SLICE);
        printf("%-8s %5d x %5d (%d blocks, %d buffers):", s.name, s.M, s.K, grid.x * grid.y, n_buf);
        for (auto &v : vars) {
            CHECK(cudaMemset(out, 0, s.M * 4));
            v.k<<<grid, 256>>>(W, x, s.K, out);
            std::vector<float> ho(s.M);
            CHECK(cudaMemcpy(ho.data(), out, s.M * 4, cudaMemcpyDeviceToHost));
            double err = 0.0, top = 0.0;
            for (int r = 0; r < s.M; r++) {
                err = fmax(err, fabs(ho[r] - ref[r]));
                top = fmax(top, fabs(ref[r]));
            }
            const int reps = 20;
            CHECK(cudaEventRecord(e0));
            for (int rep = 0; rep < reps; rep++)
                for (int b = 0; b < n_buf; b++)
                    v.k<<<grid, 256>>>(W + (size_t)b * s.M * s.K, x, s.K, out + (size_t)(b % 64) * s.M);
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = ms * 1e3 / (reps * n_buf);
            printf("  %s %.1f us %.2f TB/s (err %.1e)", v.name, us, bytes / (us * 1e-6) / 1e12, err / top);
            if (err / top > 1e-3)
                printf(" WRONG");
        }
        printf("\n");
    }
    CHECK(cudaGetLastError());
    CHECK(cudaFree(W));
    CHECK(cudaFree(x));
    CHECK(cudaFree(out));
}

/* ---- chain ---- */

#define N_LAYER 36
#define N_PROD (4 * N_LAYER)
#define KS_MAX 4096

struct prod {
    const uint16_t *w; /* [M][K] */
    const float *x;    /* [K] */
    float *out;        /* [M], zeroed */
    int M, K, kslice, n_split, n_tiles;
    int nw;            /* warps a block, 16 rows each */
    float *part;       /* ENDING: [n_split][M] the slices' sums */
    unsigned *count;   /* ENDING: [M / (nw * 16)] arrivals, zeroed */
    int swiglu;        /* PRE: the input is silu(x[k]) * x[k + K] (down's), else x[k] * norm (a RMSNorm's, its squares summed) */
    float *keep;       /* ENDING: the slices' sums left here ([n_split][M]) for the next product, no ending */
    const float *x_part; /* the input as the previous product's slices' sums ([x_split][2K] with swiglu), added in order */
    int x_split;
};
struct chain {
    prod p[N_PROD];
    unsigned *bar;
};

/* a tile: a unit of nw * 16 rows and a K slice; the lane's two rows */
struct tile {
    const uint16_t *w0, *w1;
    const uint16_t *wr; /* the warp's first row at the slice */
    int k_beg, len, row; /* row: the lane's first */
};

/* the tile of rows [unit * rows, + rows) and k [k_beg, + len): the lane's pieces */
static __device__ __forceinline__ tile tile_at(const prod &p, int rows, int unit, int k_beg, int len)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    const int r = unit * rows + warp * 16 + g;
    tile tl;
    tl.k_beg = k_beg;
    tl.len = len;
    tl.w0 = p.w + (int64_t)r * p.K + k_beg + cq * 8;
    tl.w1 = tl.w0 + (int64_t)8 * p.K;
    tl.wr = tl.w0 - (int64_t)g * p.K - cq * 8;
    tl.row = r;
    return tl;
}

static __device__ __forceinline__ tile tile_of(const prod &p, int t)
{
    const int rows = p.nw * 16, unit = t % (p.M / rows), k_beg = t / (p.M / rows) * p.kslice;
    return tile_at(p, rows, unit, k_beg, min(p.kslice, p.K - k_beg));
}

/* FLAT (the ring): a product's (128-row unit, 128-k group) items split evenly
 * among the blocks, unit by unit; block b takes items [b N / G, (b + 1) N / G).
 * The tile at item i: the run of the block's items in i's unit; *next: the
 * item after it */
static __device__ __forceinline__ void flat_span(const prod &p, int b, int G, int *i, int *end)
{
    const int64_t n = (int64_t)(p.M / 128) * (p.K / 128);
    *i = (int)(n * b / G);
    *end = (int)(n * (b + 1) / G);
}

static __device__ __forceinline__ tile tile_flat(const prod &p, int i, int end, int *next)
{
    const int kg = p.K / 128, unit = i / kg, e = min(end, (unit + 1) * kg);
    *next = e;
    return tile_at(p, 128, unit, (i - unit * kg) * 128, (e - i) * 128);
}

static __device__ __forceinline__ void load(uint4 (*w)[2], const tile &tl, int j0)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const bool in = (j0 + u) * 32 < tl.len;
        w[u][0] = in ? ld_w<true>(tl.w0 + (j0 + u) * 32) : make_uint4(0, 0, 0, 0);
        w[u][1] = in ? ld_w<true>(tl.w1 + (j0 + u) * 32) : make_uint4(0, 0, 0, 0);
    }
}

/* 4 staged inputs, rounded to bf16 */
static __device__ __forceinline__ void stage4(__nv_bfloat16 *d, float4 v)
{
    __nv_bfloat162 *d2 = (__nv_bfloat162 *)d;
    d2[0] = __floats2bfloat162_rn(v.x, v.y);
    d2[1] = __floats2bfloat162_rn(v.z, v.w);
}

/* the tile's product, its first two groups of weights already in wa, wb;
 * ENDING: k_mmv's (the slices' sums through memory, the last block of a
 * unit adding them in order), else atomics; PRE: k_mmv's input ops */
template <bool ENDING, bool PRE, bool CL = false>
static __device__ void tile_run(const prod &p, const tile &tl, uint4 (*wa)[2], uint4 (*wb)[2], __nv_bfloat16 *sx)
{
    __shared__ float seg_ss[KS_MAX / 128];
    __shared__ int is_last;
    const int lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    __syncthreads(); /* sx's last readers */
    for (int i = threadIdx.x * 4; i < tl.len; i += blockDim.x * 4) {
        float4 v, u;
        if (p.x_part) {
            v = u = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int sp = 0; sp < p.x_split; sp++) {
                const float *q = p.x_part + (int64_t)sp * 2 * p.K + tl.k_beg + i;
                const float4 a = __ldcg((const float4 *)q), b = __ldcg((const float4 *)(q + p.K));
                v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
                u.x += b.x, u.y += b.y, u.z += b.z, u.w += b.w;
            }
        } else {
            v = __ldcg((const float4 *)(p.x + tl.k_beg + i));
            if (PRE && p.swiglu)
                u = __ldcg((const float4 *)(p.x + p.K + tl.k_beg + i));
        }
        if (PRE && p.swiglu) {
            v.x = v.x / (1.0f + expf(-v.x)) * u.x;
            v.y = v.y / (1.0f + expf(-v.y)) * u.y;
            v.z = v.z / (1.0f + expf(-v.z)) * u.z;
            v.w = v.w / (1.0f + expf(-v.w)) * u.w;
        } else if (PRE) {
            float ss = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            for (int o = 16; o > 0; o >>= 1)
                ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0)
                seg_ss[i / 128] = ss;
            v.x *= 1.01f;
            v.y *= 0.99f;
            v.z *= 1.02f;
            v.w *= 0.98f;
        }
        stage4(sx + i, v);
    }
    __syncthreads();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int n_blk = tl.len / 32;
    const auto mul = [&](const uint4 (*w)[2], int j0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (j0 + u >= n_blk)
                break;
            const uint4 a = w[u][0], b = w[u][1];
            const uint4 h = g == 0 ? *(const uint4 *)(sx + (j0 + u) * 32 + cq * 8) : make_uint4(0, 0, 0, 0);
            mma(acc, a.x, b.x, a.y, b.y, h.x, h.y);
            mma(acc, a.z, b.z, a.w, b.w, h.z, h.w);
        }
    };
    for (int j0 = 0; j0 < n_blk; j0 += 2 * U) {
        if (j0 > 0)
            load(wb, tl, j0 + U);
        mul(wa, j0);
        if (j0 + 2 * U < n_blk)
            load(wa, tl, j0 + 2 * U);
        mul(wb, j0 + U);
    }
    /* acc[0]: row g, token 0 on lanes cq == 0; acc[2]: row g+8 */
    float r_scale = 1.0f;
    if (PRE && !p.swiglu) {
        float ss = 0.0f;
        for (int sg = 0; sg < tl.len / 128; sg++)
            ss += seg_ss[sg];
        r_scale = ss > 0.0f ? 1.0f : 0.5f; /* keeps the sum live */
    }
    if (ENDING && p.n_split == 1) {
        if (cq == 0) {
            p.out[tl.row] = acc[0] * r_scale;
            p.out[tl.row + 8] = acc[2] * r_scale;
        }
        return;
    }
    if (!ENDING) {
        if (cq == 0) {
            atomicAdd(p.out + tl.row, acc[0] * r_scale);
            atomicAdd(p.out + tl.row + 8, acc[2] * r_scale);
        }
        return;
    }
    if (CL) { /* the unit's slices are the blocks of one cluster: added through their shared memory */
        __shared__ float part_s[16 * 16];
        const int warp = threadIdx.x >> 5, rows = p.nw * 16, unit = tl.row / rows;
        if (cq == 0) {
            part_s[warp * 16 + g] = acc[0] * r_scale;
            part_s[warp * 16 + g + 8] = acc[2] * r_scale;
        }
        cg::cluster_group cl = cg::this_cluster();
        cl.sync();
        const int rank = (int)cl.block_rank(), beg = rank * rows / p.n_split, end = (rank + 1) * rows / p.n_split;
        if ((int)threadIdx.x < end - beg) {
            const int r = beg + threadIdx.x;
            float s = 0.0f;
            for (int sp = 0; sp < p.n_split; sp++)
                s += *cl.map_shared_rank(part_s + r, sp);
            p.out[unit * rows + r] = s;
        }
        cl.sync(); /* no block leaves while another reads its sums */
        return;
    }
    const int split = tl.k_beg / p.kslice, unit = tl.row / (p.nw * 16);
    float *dst = p.keep ? p.keep : p.part;
    if (cq == 0) {
        dst[(int64_t)split * p.M + tl.row] = acc[0] * r_scale;
        dst[(int64_t)split * p.M + tl.row + 8] = acc[2] * r_scale;
    }
    if (p.keep)
        return;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p.count + unit) : "memory");
        is_last = old == (unsigned)p.n_split - 1;
    }
    __syncthreads();
    if (is_last && (int)threadIdx.x < p.nw * 16) {
        const int r = unit * p.nw * 16 + threadIdx.x;
        float s = 0.0f;
        for (int sp = 0; sp < p.n_split; sp++)
            s += __ldcg(p.part + (int64_t)sp * p.M + r);
        p.out[r] = s;
        if (threadIdx.x == 0)
            p.count[unit] = 0;
    }
}

/* NT threads; blocks of up to 8 warps held to 128 registers, so that two fit
 * an SM as k_mmv's do (without the bound, the input loop of x_part took
 * them to 133-164 and one block an SM, which slowed every k_prod row).
 * TAG: a kernel of its own, so that the
 * shared-memory attribute one variant sets stays off the others. */
template <bool DEP, bool ENDING, bool PRE, int NT, bool CL = false, int TAG = 0>
__global__ void __launch_bounds__(NT, NT > 256 ? 1 : 2) k_prod(const prod p)
{
    __shared__ __align__(16) __nv_bfloat16 sx[KS_MAX];
    /* CL: a cluster is one unit's slices, its rank the slice */
    const int units = p.M / (p.nw * 16);
    const tile tl = tile_of(p, CL ? (int)(blockIdx.x % p.n_split) * units + (int)(blockIdx.x / p.n_split)
                                  : (int)blockIdx.x);
    uint4 wa[U][2], wb[U][2];
    load(wa, tl, 0);
    load(wb, tl, U);
    if (DEP) {
        asm volatile("griddepcontrol.launch_dependents;" ::);
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    tile_run<ENDING, PRE, CL>(p, tl, wa, wb, sx);
}

/* the persistent kernels' barrier between products: every block arrives,
 * then waits for the count of all blocks of every barrier so far (target) */
static __device__ __forceinline__ void grid_barrier(unsigned *bar, unsigned target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        unsigned v;
        do
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        while (v < target);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(256, 2) k_persist(const __grid_constant__ chain c)
{
    __shared__ __align__(16) __nv_bfloat16 sx[KS_MAX];
    uint4 wa[U][2], wb[U][2];
    if ((int)blockIdx.x < c.p[0].n_tiles) {
        const tile tl = tile_of(c.p[0], blockIdx.x);
        load(wa, tl, 0);
        load(wb, tl, U);
    }
    for (int s = 0; s < N_PROD; s++) {
        const prod &p = c.p[s];
        for (int t = blockIdx.x; t < p.n_tiles; t += gridDim.x) {
            const tile tl = tile_of(p, t);
            if (t != (int)blockIdx.x) {
                load(wa, tl, 0);
                load(wb, tl, U);
            }
            tile_run<false, false>(p, tl, wa, wb, sx);
        }
        if (s + 1 == N_PROD)
            break;
        if ((int)blockIdx.x < c.p[s + 1].n_tiles) { /* the next product's first weights, before the barrier */
            const tile tl = tile_of(c.p[s + 1], blockIdx.x);
            load(wa, tl, 0);
            load(wb, tl, U);
        }
        grid_barrier(c.bar, (unsigned)(s + 1) * gridDim.x);
    }
}

/* RING: the persistent kernel with the weights through shared memory. The
 * threads copy by cp.async a ring of NS groups (U 32-k blocks of a warp's 16
 * rows a group) and keep NS - 1 groups in flight ahead of the one they
 * multiply, across tiles, products and the grid barrier between them:
 * weights do not wait for inputs, so the memory keeps streaming while a
 * block waits for the product before. ROWS = false: a thread copies the
 * very 16-byte pieces it will multiply (the fragments' shape, 8 rows x 64
 * bytes an instruction), [NS][2U][256] uint4, consecutive threads' side by
 * side. ROWS: a warp copies 2 rows x 256 bytes an instruction (the load
 * shape the H200 prefers), [NS][8 warps][16 rows][16 pieces],
 * odd rows' pieces swapped by halves of 64 bytes (a quarter warp reading
 * rows g and g + 1 of the fragments hits 8 distinct banks), and the warp
 * syncs before reading its lanes' copies. */
template <int NS, bool ROWS, bool FLAT> __global__ void __launch_bounds__(256, 1) k_ring(const __grid_constant__ chain c)
{
    extern __shared__ __align__(16) uint4 ring[];
    __shared__ __align__(16) __nv_bfloat16 sx[KS_MAX];
    const int tid = threadIdx.x, g = (tid & 31) >> 2, cq = tid & 3;
    /* the load cursor: product ls, tile lt (FLAT: items from lt to lend, the
     * tile's end lnext; its pieces in ltl), group lj */
    int ls = 0, lt = blockIdx.x, lj = 0, lend = 0, lnext = 0;
    const auto first = [&]() { /* the cursor's product's first tile, skipping products without one */
        for (; ls < N_PROD; ls++) {
            if (FLAT)
                flat_span(c.p[ls], blockIdx.x, gridDim.x, &lt, &lend);
            else
                lt = blockIdx.x;
            if (FLAT ? lt < lend : lt < c.p[ls].n_tiles)
                break;
        }
    };
    first();
    tile ltl = {};
    if (ls < N_PROD)
        ltl = FLAT ? tile_flat(c.p[ls], lt, lend, &lnext) : tile_of(c.p[ls], lt);
    unsigned issued = 0;
    const auto issue = [&]() {
        if (ls < N_PROD) {
            uint4 *slot = ring + (size_t)(issued % NS) * 2 * U * 256;
            if (ROWS) {
                const int warp = tid >> 5, lane = tid & 31;
#pragma unroll
                for (int i = 0; i < 2 * U; i++) {
                    const int row = i * 2 + (lane >> 4), pc = lane & 15;
                    if ((lj + pc / 4) * 32 >= ltl.len)
                        continue;
                    const unsigned d = (unsigned)__cvta_generic_to_shared(slot + warp * 256 + row * 16 + (pc ^ (row & 1) << 2));
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d),
                                 "l"(ltl.wr + (int64_t)row * c.p[ls].K + lj * 32 + pc * 8));
                }
            } else {
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if ((lj + u) * 32 >= ltl.len)
                        break;
                    const unsigned d0 = (unsigned)__cvta_generic_to_shared(slot + (2 * u) * 256 + tid);
                    const unsigned d1 = (unsigned)__cvta_generic_to_shared(slot + (2 * u + 1) * 256 + tid);
                    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d0), "l"(ltl.w0 + (lj + u) * 32));
                    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d1), "l"(ltl.w1 + (lj + u) * 32));
                }
            }
            lj += U;
            if (lj * 32 >= ltl.len) {
                lj = 0;
                lt = FLAT ? lnext : lt + gridDim.x;
                if (FLAT ? lt >= lend : lt >= c.p[ls].n_tiles) {
                    ls++;
                    first();
                }
                if (ls < N_PROD)
                    ltl = FLAT ? tile_flat(c.p[ls], lt, lend, &lnext) : tile_of(c.p[ls], lt);
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        issued++;
    };
    for (int i = 0; i < NS - 1; i++)
        issue();
    unsigned used = 0;
    for (int s = 0; s < N_PROD; s++) {
        const prod &p = c.p[s];
        int t = blockIdx.x, t_end = p.n_tiles, t_next = 0;
        if (FLAT)
            flat_span(p, blockIdx.x, gridDim.x, &t, &t_end);
        for (; t < t_end; t = FLAT ? t_next : t + gridDim.x) {
            const tile tl = FLAT ? tile_flat(p, t, t_end, &t_next) : tile_of(p, t);
            __syncthreads(); /* sx's last readers */
            for (int i = tid * 4; i < tl.len; i += 256 * 4) {
                stage4(sx + i, __ldcg((const float4 *)(p.x + tl.k_beg + i)));
            }
            __syncthreads();
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const int n_blk = tl.len / 32;
            for (int j0 = 0; j0 < n_blk; j0 += U) {
                if (ROWS)
                    __syncwarp(); /* the slot refilled next: every lane done reading it */
                issue();
                asm volatile("cp.async.wait_group %0;" ::"n"(NS - 1) : "memory");
                if (ROWS)
                    __syncwarp();
                const uint4 *slot = ring + (size_t)(used % NS) * 2 * U * 256;
                used++;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (j0 + u >= n_blk)
                        break;
                    uint4 a, b;
                    if (ROWS) {
                        const uint4 *wp = slot + (tid >> 5) * 256;
                        const int pc = u * 4 + cq;
                        a = wp[g * 16 + (pc ^ (g & 1) << 2)];
                        b = wp[(g + 8) * 16 + (pc ^ (g & 1) << 2)];
                    } else {
                        a = slot[(2 * u) * 256 + tid];
                        b = slot[(2 * u + 1) * 256 + tid];
                    }
                    const uint4 h = g == 0 ? *(const uint4 *)(sx + (j0 + u) * 32 + cq * 8) : make_uint4(0, 0, 0, 0);
                    mma(acc, a.x, b.x, a.y, b.y, h.x, h.y);
                    mma(acc, a.z, b.z, a.w, b.w, h.z, h.w);
                }
            }
            if (cq == 0) {
                atomicAdd(p.out + tl.row, acc[0]);
                atomicAdd(p.out + tl.row + 8, acc[2]);
            }
        }
        if (s + 1 == N_PROD)
            break;
        grid_barrier(c.bar, (unsigned)(s + 1) * gridDim.x);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

static void chain_run(bool graph)
{
    int n_sm = 0;
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const int resident = 2 * n_sm;
    const int shape[4][2] = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}};
    size_t w_elems = 0, o_elems = 0;
    for (int i = 0; i < 4; i++) {
        w_elems += (size_t)shape[i][0] * shape[i][1];
        o_elems += shape[i][0];
    }
    uint16_t *W;
    float *O, *x0;
    CHECK(cudaMalloc(&W, w_elems * N_LAYER * 2));
    CHECK(cudaMalloc(&O, o_elems * N_LAYER * 4));
    CHECK(cudaMalloc(&x0, 12288 * 4));
    static float hx[12288];
    for (int i = 0; i < 12288; i++)
        hx[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    CHECK(cudaMemcpy(x0, hx, sizeof hx, cudaMemcpyHostToDevice));
    k_fill<<<4096, 256>>>(W, w_elems * N_LAYER, 1, 0.03f);
    chain c = {};
    CHECK(cudaMalloc(&c.bar, 4));
    float *part, *keep;
    unsigned *count;
    CHECK(cudaMalloc(&part, (size_t)8 * 24576 * 4));
    CHECK(cudaMalloc(&keep, (size_t)4 * 24576 * 4));
    CHECK(cudaMalloc(&count, 192 * 4 * 2));
    CHECK(cudaMemset(count, 0, 192 * 4 * 2));
    size_t wo = 0, oo = 0;
    double bytes = 0.0;
    for (int s = 0; s < N_PROD; s++) {
        prod &p = c.p[s];
        p.M = shape[s % 4][0];
        p.K = shape[s % 4][1];
        p.w = W + wo;
        p.out = O + oo;
        p.x = s ? c.p[s - 1].out : x0;
        p.part = part;
        p.count = count + (s % 2) * 192; /* a product's counters are back at zero before the one after next */
        p.swiglu = s % 4 == 3;
        wo += (size_t)p.M * p.K;
        oo += p.M;
        bytes += 2.0 * p.M * p.K;
        p.nw = 8;
        /* k_mmv's split: the fewest slices whose blocks fill 90% of whole waves */
        const int bx = p.M / 128;
        double best = 0.0;
        for (int want = 1; want <= 32 && want * 128 <= p.K && best < 0.9; want++) {
            const int sl = (p.K / want + 127) / 128 * 128, ns = (p.K + sl - 1) / sl;
            const double fill = (double)(bx * ns) / ((double)((bx * ns + resident - 1) / resident) * resident);
            if (fill > best + 0.02 && sl <= KS_MAX) {
                best = fill;
                p.kslice = sl;
                p.n_split = ns;
            }
        }
        p.n_tiles = bx * p.n_split;
        if (s < 4)
            printf("chain: %5d x %5d: %d slices of %d, %d blocks\n", p.M, p.K, p.n_split, p.kslice, p.n_tiles);
    }
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float ref[8];
    for (int round = 0; round < 3; round++)
        for (int v = 0; v < 20; v++) {
            if (graph && v != 0 && v != 1 && v != 3 && v != 5 && v < 16)
                continue;
            for (int s = 2; s < N_PROD; s += 4) { /* gate/up: 8 warps in 4 slices; 6 or 12 warps unsplit */
                prod &p = c.p[s];
                p.nw = v == 6 ? 6 : v == 7 ? 12 : 8;
                p.n_split = p.nw == 8 ? 4 : 1;
                p.kslice = p.K / p.n_split;
                p.n_tiles = p.M / (p.nw * 16) * p.n_split;
                /* v 8: gate/up's slices added by down as it stages them (no ending) */
                p.keep = v == 8 ? keep : NULL;
                c.p[s + 1].x_part = v == 8 ? keep : NULL;
                c.p[s + 1].x_split = p.n_split;
            }
            const int reps = 10;
            float ms_all = 0.0f;
            for (int r = 0; r < reps; r++) {
                CHECK(cudaMemsetAsync(O, 0, o_elems * N_LAYER * 4, st));
                CHECK(cudaMemsetAsync(c.bar, 0, 4, st));
                cudaGraph_t g = NULL;
                if (graph)
                    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                else
                    CHECK(cudaEventRecord(e0, st));
                if (v == 2) {
                    k_persist<<<resident, 256, 0, st>>>(c);
                } else if (v >= 9) { /* the ring: 4 or 6 groups, one block an SM; 3 groups, two; by rows; flat */
                    const int ns = v == 9 || v == 12 ? 4 : v == 10 || v == 14 ? 6 : 3, smem = ns * 2 * U * 256 * 16;
                    void (*k)(chain) = v == 9    ? k_ring<4, false, false>
                                       : v == 10 ? k_ring<6, false, false>
                                       : v == 11 ? k_ring<3, false, false>
                                       : v == 12 ? k_ring<4, true, false>
                                       : v == 13 ? k_ring<3, true, false>
                                       : v == 14 ? k_ring<6, true, true>
                                                 : k_ring<3, true, true>;
                    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                    k<<<v == 11 || v == 13 || v == 15 ? resident : n_sm, 256, smem, st>>>(c);
                } else {
                    for (int s = 0; s < N_PROD; s++) {
                        cudaLaunchConfig_t cfg = {};
                        cfg.gridDim = dim3(c.p[s].n_tiles);
                        cfg.blockDim = dim3(c.p[s].nw * 32);
                        cfg.dynamicSmemBytes = c.p[s].nw == 8 ? 0 : c.p[s].nw == 6 ? 90 * 1024 : 160 * 1024;
                        cfg.stream = st;
                        cudaLaunchAttribute at[2];
                        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                        at[0].val.programmaticStreamSerializationAllowed = 1;
                        at[1].id = cudaLaunchAttributeClusterDimension;
                        at[1].val.clusterDim.x = c.p[s].n_split;
                        at[1].val.clusterDim.y = 1;
                        at[1].val.clusterDim.z = 1;
                        cfg.attrs = at;
                        cfg.numAttrs = v == 0 ? 0 : v == 16 || v == 17 || v == 18 ? 2 : 1;
                        void (*k)(prod) = v == 0               ? k_prod<false, false, false, 256>
                                          : v == 18            ? k_prod<true, true, false, 256, true, 1>
                                          : v == 19            ? k_prod<true, true, false, 256, false, 1>
                                          : v == 16            ? k_prod<true, true, false, 256, true>
                                          : v == 17            ? k_prod<true, true, true, 256, true>
                                          : v == 1             ? k_prod<true, false, false, 256>
                                          : v == 3             ? k_prod<true, true, false, 256>
                                          : v == 4             ? k_prod<true, false, true, 256>
                                          : c.p[s].nw == 6     ? k_prod<true, true, true, 192>
                                          : c.p[s].nw == 12    ? k_prod<true, true, true, 384>
                                                               : k_prod<true, true, true, 256>;
                        if (v >= 18) /* k_mmv's: its largest batch's room allowed, a decode step's used */
                            cfg.dynamicSmemBytes = 17 * 1024;
                        if (cfg.dynamicSmemBytes)
                            CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       v >= 18 ? 136 * 1024 : (int)cfg.dynamicSmemBytes));
                        CHECK(cudaLaunchKernelEx(&cfg, k, c.p[s]));
                    }
                }
                if (graph) { /* the launches captured as a decode step's are, then replayed */
                    cudaGraphExec_t ge;
                    CHECK(cudaStreamEndCapture(st, &g));
                    CHECK(cudaGraphInstantiate(&ge, g, 0));
                    CHECK(cudaGraphLaunch(ge, st));
                    CHECK(cudaMemsetAsync(O, 0, o_elems * N_LAYER * 4, st));
                    CHECK(cudaMemsetAsync(c.bar, 0, 4, st));
                    CHECK(cudaEventRecord(e0, st));
                    CHECK(cudaGraphLaunch(ge, st));
                    CHECK(cudaEventRecord(e1, st));
                    CHECK(cudaEventSynchronize(e1));
                    CHECK(cudaGraphExecDestroy(ge));
                    CHECK(cudaGraphDestroy(g));
                } else
                    CHECK(cudaEventRecord(e1, st));
                CHECK(cudaEventSynchronize(e1));
                float ms = 0.0f;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (r > 0)
                    ms_all += ms;
            }
            const double ms = ms_all / (reps - 1);
            float last[8];
            CHECK(cudaMemcpy(last, c.p[N_PROD - 1].out, sizeof last, cudaMemcpyDeviceToHost));
            if (v == 0)
                memcpy(ref, last, sizeof ref);
            double dev = 0.0, top = 0.0;
            for (int i = 0; i < 8; i++) {
                dev = fmax(dev, fabs(last[i] - ref[i]));
                top = fmax(top, fabs(ref[i]));
            }
            const char *name[20] = {"launches", "dependents", "persistent", "+ending", "+pre", "+ending+pre",
                                    "+e+p, gate/up 6 warps whole", "+e+p, gate/up 12 warps whole",
                                    "+e+p, gate/up's slices added by down", "ring of 4, a block an SM",
                                    "ring of 6, a block an SM", "ring of 3, two blocks an SM",
                                    "ring by rows, 4, a block an SM", "ring by rows, 3, two blocks an SM",
                                    "ring by rows, flat, 6, a block an SM", "ring by rows, flat, 3, two blocks an SM",
                                    "+ending in a cluster", "+ending in a cluster+pre",
                                    "+ending in a cluster, 136 KB allowed, 17 used", "+ending, 136 KB allowed, 17 used"};
            printf("chain: %-10s %.3f ms a step's products (%.1f us a layer), %.2f TB/s; last outputs %.3g off (of %.3g)\n",
                   name[v], ms, ms * 1e3 / N_LAYER, bytes / (ms * 1e-3) / 1e12, dev, top);
        }
    CHECK(cudaGetLastError());
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "all";
    if (strcmp(what, "chain") != 0 && strcmp(what, "graph") != 0)
        shapes();
    if (strcmp(what, "shapes") != 0)
        chain_run(strcmp(what, "graph") == 0);
    return 0;
}
