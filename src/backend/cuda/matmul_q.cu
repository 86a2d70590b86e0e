/* matmul_q: products and embedding lookups with weights in GGUF's block
 * types (src/quant/blocks.h), on the GPU.
 *
 * The weights stay in their blocks in device memory, read once per product.
 * Every block type is read in units of 32 consecutive elements of a row (a
 * Q8_0 block, or an eighth of a K-quant super-block): dq32 turns one unit
 * into 32 floats in registers with the reference's arithmetic (quant.c's, no
 * contraction), so the GPU multiplies bitwise the values the cpu does.
 *
 * Up to CUDA_SMALL_N tokens (decoding, KFlash trees), and every batch on a
 * precise backend, k_mmq: a warp per weight row, a lane per unit in turn,
 * the activations staged in shared memory a chunk at a time, each token's
 * sum an fp32 fma chain in unit order and the lanes' sums added by a fixed
 * butterfly, so a token's bits never depend on the batch (a tree reproduces
 * plain decoding). Tokens come in tiles of up to 8 per pass over the weights
 * (grid y over the tiles).
 *
 * Larger batches (prefill) dequantise the weight, a slice of rows at a time,
 * to bf16 in scratch and run cuBLAS on activations rounded to bf16 once, as
 * the bf16 weights' prefill does; the extra read and write of the slice is a
 * few percent of the GEMM's time for prompts of hundreds of tokens. */
#include "cuda_impl.h"

extern "C" {
#include "../../quant/blocks.h"
#include "../../quant/iq_tables.h"
}

#include <stddef.h>
#include <stdlib.h>
#include <type_traits>

/* dq32 reads the blocks at these sizes and offsets: blocks.h's layouts */
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
                  sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34 && sizeof(block_iq4_nl) == 18,
              "32-element blocks");
static_assert(sizeof(block_q2_k) == 84 && offsetof(block_q2_k, qs) == 16 && offsetof(block_q2_k, d) == 80, "q2_k");
static_assert(sizeof(block_q3_k) == 110 && offsetof(block_q3_k, qs) == 32 && offsetof(block_q3_k, scales) == 96 &&
                  offsetof(block_q3_k, d) == 108,
              "q3_k");
static_assert(sizeof(block_q4_k) == 144 && offsetof(block_q4_k, qs) == 16, "q4_k");
static_assert(sizeof(block_q5_k) == 176 && offsetof(block_q5_k, qh) == 16 && offsetof(block_q5_k, qs) == 48, "q5_k");
static_assert(sizeof(block_q6_k) == 210 && offsetof(block_q6_k, qh) == 128 && offsetof(block_q6_k, scales) == 192 &&
                  offsetof(block_q6_k, d) == 208,
              "q6_k");
static_assert(sizeof(block_iq4_xs) == 136 && offsetof(block_iq4_xs, qs) == 8, "iq4_xs");
static_assert(sizeof(block_iq2_xxs) == 66, "iq2_xxs");

#define MMQ_WARPS 16                  /* rows a block of k_mmq (the staged activations shared by as many) */
#define MMQ_NT 8                      /* tokens a pass at most */
#define MMQ_DQ_BYTES ((size_t)64 << 20) /* bf16 scratch of the prefill's dequantised slice */

/* IQ2_XXS's grid (its sign table is the 7-bit index with its parity bit) */
__device__ uint64_t d_iq2xxs_grid[256];

static __device__ __forceinline__ float h2f(uint32_t bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }

static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }

/* n 32-bit words from p, which is only `align`-byte aligned (2, 4, 8 or 16) */
template <int align, int n> static __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t *w)
{
    if (align >= 16 && n % 4 == 0) {
#pragma unroll
        for (int i = 0; i < n / 4; i++) {
            const uint4 v = __ldg((const uint4 *)p + i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if (align >= 8 && n % 2 == 0) {
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const uint2 v = __ldg((const uint2 *)p + i);
            w[2 * i] = v.x, w[2 * i + 1] = v.y;
        }
    } else if (align >= 4) {
#pragma unroll
        for (int i = 0; i < n; i++)
            w[i] = __ldg((const uint32_t *)p + i);
    } else {
#pragma unroll
        for (int i = 0; i < n; i++)
            w[i] = (uint32_t)__ldg((const uint16_t *)p + 2 * i) | (uint32_t)__ldg((const uint16_t *)p + 2 * i + 1) << 16;
    }
}

static __device__ __forceinline__ uint32_t u16_at(const uint8_t *p) { return __ldg((const uint16_t *)p); }

/* byte j of the 32 bytes in w[8] */
static __device__ __forceinline__ uint32_t byte_of(const uint32_t *w, int j) { return (w[j / 4] >> (8 * (j % 4))) & 255; }

/* byte i < 12 of the three words a, b, c (a block's 12 scale bytes), without
 * an indexed array (which would live in local memory) */
static __device__ __forceinline__ int byte12(uint32_t a, uint32_t b, uint32_t c, int i)
{
    return (int)(((i < 4 ? a : i < 8 ? b : c) >> (8 * (i & 3))) & 255);
}

/* kvalues_iq4nl[q] for a 4-bit q, from the table packed in four registers */
static __device__ __forceinline__ float iq4nl(uint32_t q)
{
    constexpr uint32_t t0 = 0xbfad9881u, t1 = 0xf6eaddcfu, t2 = 0x26190d01u, t3 = 0x71594535u;
    const uint32_t v = __byte_perm(q & 8 ? t2 : t0, q & 8 ? t3 : t1, q & 7);
    return (float)(int8_t)(v & 255);
}

/* Unit u (32 elements from 32u) of a row of blocks of type T into v. */
template <int T> static __device__ __forceinline__ void dq32(const uint8_t *__restrict__ row, int64_t u, float *v)
{
    if constexpr (T == DT_Q4_0 || T == DT_IQ4_NL) {
        const uint8_t *b = row + u * 18;
        const float d = h2f(u16_at(b));
        uint32_t w[4];
        ld_words<2, 4>(b + 2, w);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t q = (w[j / 4] >> (8 * (j % 4))) & 255;
            if constexpr (T == DT_Q4_0) {
                v[j] = mul((float)((int)(q & 15) - 8), d);
                v[j + 16] = mul((float)((int)(q >> 4) - 8), d);
            } else {
                v[j] = mul(d, iq4nl(q & 15));
                v[j + 16] = mul(d, iq4nl(q >> 4));
            }
        }
    } else if constexpr (T == DT_Q4_1) {
        const uint8_t *b = row + u * 20;
        uint32_t w[5];
        ld_words<4, 5>(b, w);
        const float d = h2f(w[0] & 0xffff), m = h2f(w[0] >> 16);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t q = (w[1 + j / 4] >> (8 * (j % 4))) & 255;
            v[j] = __fadd_rn(mul((float)(q & 15), d), m);
            v[j + 16] = __fadd_rn(mul((float)(q >> 4), d), m);
        }
    } else if constexpr (T == DT_Q5_0 || T == DT_Q5_1) {
        constexpr int bb = T == DT_Q5_0 ? 22 : 24, off = T == DT_Q5_0 ? 2 : 4;
        const uint8_t *b = row + u * bb;
        uint32_t w[5];
        ld_words<off, 5>(b + off, w); /* qh, then qs */
        const float d = h2f(u16_at(b)), m = T == DT_Q5_1 ? h2f(u16_at(b + 2)) : 0.0f;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t q = (w[1 + j / 4] >> (8 * (j % 4))) & 255;
            const uint32_t q0 = (q & 15) | ((w[0] >> j) & 1) << 4, q1 = (q >> 4) | ((w[0] >> (j + 16)) & 1) << 4;
            if constexpr (T == DT_Q5_0) {
                v[j] = mul((float)((int)q0 - 16), d);
                v[j + 16] = mul((float)((int)q1 - 16), d);
            } else {
                v[j] = __fadd_rn(mul((float)q0, d), m);
                v[j + 16] = __fadd_rn(mul((float)q1, d), m);
            }
        }
    } else if constexpr (T == DT_Q8_0) {
        const uint8_t *b = row + u * 34;
        const float d = h2f(u16_at(b));
        uint32_t w[8];
        ld_words<2, 8>(b + 2, w);
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = mul((float)(int8_t)byte_of(w, j), d);
    } else if constexpr (T == DT_Q2_K) {
        const uint8_t *b = row + (u >> 3) * 84;
        const int g = (int)(u & 7), c = g >> 2, sh = 2 * (g & 3);
        uint32_t w[8];
        ld_words<4, 8>(b + 16 + 32 * c, w);
        const uint32_t dd = __ldg((const uint32_t *)(b + 80)), s2 = u16_at(b + 2 * g);
        const float d = h2f(dd & 0xffff), dmin = h2f(dd >> 16);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t sc = (s2 >> (8 * h)) & 255;
            const float dl = mul(d, (float)(sc & 15)), ml = mul(dmin, (float)(sc >> 4));
#pragma unroll
            for (int l = 0; l < 16; l++)
                v[16 * h + l] = __fsub_rn(mul(dl, (float)((byte_of(w, 16 * h + l) >> sh) & 3)), ml);
        }
    } else if constexpr (T == DT_Q3_K) {
        const uint8_t *b = row + (u >> 3) * 110;
        const int g = (int)(u & 7), c = g >> 2, j = g & 3;
        uint32_t q[8], hm[8], s[3];
        ld_words<2, 8>(b + 32 + 32 * c, q);
        ld_words<2, 8>(b, hm);
        ld_words<2, 3>(b + 96, s);
        const float d = h2f(u16_at(b + 108));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            /* blocks.h's block_q3_k_scale */
            const int sj = 2 * g + h, lo = sj < 8 ? byte12(s[0], s[1], s[2], sj) & 15 : byte12(s[0], s[1], s[2], sj - 8) >> 4;
            const int hi = (byte12(s[0], s[1], s[2], 8 + sj % 4) >> (2 * (sj / 4))) & 3;
            const float dl = mul(d, (float)((lo | hi << 4) - 32));
#pragma unroll
            for (int l = 0; l < 16; l++) {
                const int e = 16 * h + l;
                const int qv = (int)((byte_of(q, e) >> (2 * j)) & 3) - ((byte_of(hm, e) >> (4 * c + j)) & 1 ? 0 : 4);
                v[e] = mul(dl, (float)qv);
            }
        }
    } else if constexpr (T == DT_Q4_K || T == DT_Q5_K) {
        constexpr int bb = T == DT_Q4_K ? 144 : 176, qs = T == DT_Q4_K ? 16 : 48;
        const uint8_t *b = row + (u >> 3) * bb;
        const int g = (int)(u & 7);
        uint32_t hd[4], q[8], qh[8];
        ld_words<16, 4>(b, hd); /* d, dmin, then the 12 scale bytes */
        ld_words<16, 8>(b + qs + 32 * (g >> 1), q);
        if constexpr (T == DT_Q5_K)
            ld_words<16, 8>(b + 16, qh);
        /* blocks.h's block_k4_scale_min */
        int sc, m;
        if (g < 4) {
            sc = byte12(hd[1], hd[2], hd[3], g) & 63;
            m = byte12(hd[1], hd[2], hd[3], g + 4) & 63;
        } else {
            sc = (byte12(hd[1], hd[2], hd[3], g + 4) & 15) | (byte12(hd[1], hd[2], hd[3], g - 4) >> 6) << 4;
            m = (byte12(hd[1], hd[2], hd[3], g + 4) >> 4) | (byte12(hd[1], hd[2], hd[3], g) >> 6) << 4;
        }
        const float dl = mul(h2f(hd[0] & 0xffff), (float)sc), ml = mul(h2f(hd[0] >> 16), (float)m);
        const int sh = 4 * (g & 1);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            uint32_t qv = (byte_of(q, l) >> sh) & 15;
            if constexpr (T == DT_Q5_K)
                qv |= ((byte_of(qh, l) >> g) & 1) << 4;
            v[l] = __fsub_rn(mul(dl, (float)qv), ml);
        }
    } else if constexpr (T == DT_Q6_K) {
        const uint8_t *b = row + (u >> 3) * 210;
        const int g = (int)(u & 7), c = g >> 2, k = g & 3;
        uint32_t ql[8], qh[8];
        ld_words<2, 8>(b + 64 * c + 32 * (k & 1), ql);
        ld_words<2, 8>(b + 128 + 32 * c, qh);
        const uint32_t s2 = u16_at(b + 192 + 8 * c + 2 * k);
        const float d = h2f(u16_at(b + 208));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float dl = mul(d, (float)(int8_t)((s2 >> (8 * h)) & 255));
#pragma unroll
            for (int l = 0; l < 16; l++) {
                const int e = 16 * h + l;
                const uint32_t lo = (byte_of(ql, e) >> (k < 2 ? 0 : 4)) & 15, hi = (byte_of(qh, e) >> (2 * k)) & 3;
                v[e] = mul(dl, (float)((int)(lo | hi << 4) - 32));
            }
        }
    } else if constexpr (T == DT_IQ4_XS) {
        const uint8_t *b = row + (u >> 3) * 136;
        const int g = (int)(u & 7);
        uint32_t hd[2], q[4];
        ld_words<8, 2>(b, hd); /* d, scales_h, then scales_l */
        ld_words<8, 4>(b + 8 + 16 * g, q);
        const int ls = (int)(((hd[1] >> (8 * (g / 2) + 4 * (g % 2))) & 15) | ((hd[0] >> (16 + 2 * g)) & 3) << 4);
        const float dl = mul(h2f(hd[0] & 0xffff), (float)(ls - 32));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t qv = (q[j / 4] >> (8 * (j % 4))) & 255;
            v[j] = mul(dl, iq4nl(qv & 15));
            v[j + 16] = mul(dl, iq4nl(qv >> 4));
        }
    } else if constexpr (T == DT_IQ2_XXS) {
        const uint8_t *b = row + (u >> 3) * 66;
        const int g = (int)(u & 7);
        uint32_t w[2];
        ld_words<2, 2>(b + 2 + 8 * g, w);
        const float d = h2f(u16_at(b));
        const float db = mul(mul(d, __fadd_rn(0.5f, (float)(w[1] >> 28))), 0.25f);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint64_t grid = d_iq2xxs_grid[(w[0] >> (8 * l)) & 255];
            const uint32_t s7 = (w[1] >> (7 * l)) & 127, signs = s7 | (__popc(s7) & 1) << 7;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float x = mul(db, (float)((grid >> (8 * j)) & 255));
                v[8 * l + j] = signs >> j & 1 ? -x : x;
            }
        }
    }
}

struct mmq_args {
    const float *x; /* [n][K], rows xs apart (vec: 16-byte aligned) */
    int64_t xs;
    bool vec;
    int32_t n, K, M;
    const uint8_t *w; /* [M] rows of K / block elements' blocks, wrow bytes apart */
    int64_t wrow;
    float *out; /* [n][M], rows os apart */
    int64_t os;
    bool accumulate;
};

/* The block's token rows x[t], t < nt, a chunk of MMQ_CHUNK units at a
 * time, staged in shared memory by all its threads (coalesced), each unit's
 * 32 floats padded to 36 so that the lanes' float4 reads of their own units
 * (a unit a lane) fall in distinct banks; read straight from global memory
 * they would be 32 scattered lines per load. */
#define MMQ_CHUNK 32
#define MMQ_UPAD 36

template <int NT>
static __device__ __forceinline__ void mmq_stage(float (*sx)[MMQ_CHUNK * MMQ_UPAD], const float *const *x, int nt,
                                                 int32_t u0, int32_t nu, bool vec)
{
#pragma unroll
    for (int t = 0; t < NT; t++) /* t unrolled: x[t] stays in registers */
        for (int p = threadIdx.x; t < nt && p < MMQ_CHUNK * 8; p += blockDim.x) {
            const int u = p / 8, q = p % 8;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (u0 + u < nu) {
                const float *src = x[t] + (int64_t)(u0 + u) * 32 + 4 * q;
                v = vec ? *(const float4 *)src : make_float4(src[0], src[1], src[2], src[3]);
            }
            *(float4 *)&sx[t][u * MMQ_UPAD + 4 * q] = v;
        }
}

/* A warp's R rows w[i] (K elements each, live[i]: a row of the weight) times
 * the block's nt <= NT token rows x[t] into lane 0's out[i][t] (+)= the sums:
 * each token's an fma chain in unit order, the lanes' sums added by a fixed
 * butterfly. R rows share each staged activation a lane reads (R = 2 halves
 * the shared-memory reads, the bound of a batch's products); a row's sums
 * are the same for every R. Every warp of the block calls it (the staging's
 * barriers). */
template <int T, int NT, int R>
static __device__ __forceinline__ void mmq_rows(float (*sx)[MMQ_CHUNK * MMQ_UPAD], const uint8_t *const *w,
                                                const bool *live, const float *const *x, int nt, int32_t K, bool vec,
                                                float *const (*out)[NT], bool accumulate)
{
    const int lane = threadIdx.x & 31;
    const int32_t nu = K / 32;
    float acc[R][NT];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[i][t] = 0.0f;
    bool any = false;
#pragma unroll
    for (int i = 0; i < R; i++)
        any |= live[i];
    for (int32_t u0 = 0; u0 < nu; u0 += MMQ_CHUNK) {
        __syncthreads(); /* the previous chunk is read */
        mmq_stage<NT>(sx, x, nt, u0, nu, vec);
        __syncthreads();
        const int32_t u = u0 + lane;
        if (!any || u >= nu)
            continue;
        float v[R][32];
#pragma unroll
        for (int i = 0; i < R; i++)
            dq32<T>(w[i], u, v[i]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt)
                break;
            const float *xs = &sx[t][lane * MMQ_UPAD];
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const float4 xv = *(const float4 *)&xs[4 * q];
#pragma unroll
                for (int i = 0; i < R; i++) {
                    acc[i][t] = fmaf(v[i][4 * q], xv.x, acc[i][t]);
                    acc[i][t] = fmaf(v[i][4 * q + 1], xv.y, acc[i][t]);
                    acc[i][t] = fmaf(v[i][4 * q + 2], xv.z, acc[i][t]);
                    acc[i][t] = fmaf(v[i][4 * q + 3], xv.w, acc[i][t]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            for (int o = 16; o > 0; o >>= 1)
                acc[i][t] += __shfl_xor_sync(0xffffffffu, acc[i][t], o);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (live[i] && t < nt)
                    *out[i][t] = accumulate ? *out[i][t] + acc[i][t] : acc[i][t];
}

/* out (+)= x . w^T for the tokens of tile blockIdx.y (NT a tile), R rows a warp */
template <int T, int NT, int R>
__global__ void __launch_bounds__(MMQ_WARPS * 32) k_mmq(const __grid_constant__ mmq_args a)
{
    __shared__ __align__(16) float sx[NT][MMQ_CHUNK * MMQ_UPAD];
    grid_dep_wait();
    const int64_t r0 = ((int64_t)blockIdx.x * MMQ_WARPS + threadIdx.x / 32) * R;
    const int32_t t0 = blockIdx.y * NT, nt = min(NT, a.n - t0);
    const float *x[NT];
    float *o[R][NT];
    const uint8_t *w[R];
    bool live[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        live[i] = r0 + i < a.M;
        w[i] = a.w + (live[i] ? r0 + i : 0) * a.wrow;
#pragma unroll
        for (int t = 0; t < NT; t++)
            o[i][t] = a.out + (int64_t)(t0 + t) * a.os + r0 + i;
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
        x[t] = a.x + (int64_t)(t0 + t) * a.xs;
    mmq_rows<T, NT, R>(sx, w, live, x, nt, a.K, a.vec, o, a.accumulate);
    grid_dep_launch();
}

struct mmq_grp_args {
    const float *x; /* input rows, xs apart (vec: 16-byte aligned) */
    int64_t xs;
    bool vec;
    int32_t K, M;
    const int32_t *plan; /* MOE_PLAN_* on the device */
    int32_t max_act;
    bool gather;               /* input row of compact row p: the plan's token of p (else p) */
    const uint8_t *const *ew;  /* [n_expert] the experts' matrices on the device */
    int64_t wrow;
    float *out; /* compact rows, os apart */
    int64_t os;
};

/* slot blockIdx.z's compact rows (tile blockIdx.y) through its expert, a warp a row */
template <int T, int NT> __global__ void __launch_bounds__(MMQ_WARPS * 32) k_mmq_grp(const __grid_constant__ mmq_grp_args a)
{
    __shared__ __align__(16) float sx[NT][MMQ_CHUNK * MMQ_UPAD];
    grid_dep_wait(); /* the plan is an earlier kernel's output */
    const int32_t z = blockIdx.z, *beg = a.plan + MOE_PLAN_BEG(a.max_act);
    if (z >= a.plan[0])
        return; /* the whole block: an inactive slot */
    const int32_t base = beg[z] + blockIdx.y * NT, nt = min(NT, beg[z + 1] - base);
    if (nt <= 0)
        return;
    const int64_t r = (int64_t)blockIdx.x * MMQ_WARPS + threadIdx.x / 32;
    const bool live[1] = {r < a.M};
    const uint8_t *w[1] = {a.ew[a.plan[MOE_PLAN_EXPERT + z]] + (live[0] ? r : 0) * a.wrow};
    const float *x[NT];
    float *o[1][NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int32_t p = base + min(t, nt - 1);
        x[t] = a.x + (int64_t)(a.gather ? a.plan[MOE_PLAN_ROWS(a.max_act) + p] : p) * a.xs;
        o[0][t] = a.out + (int64_t)p * a.os + r;
    }
    mmq_rows<T, NT, 1>(sx, w, live, x, nt, a.K, a.vec, o, false);
    grid_dep_launch();
}

/* rows [row0, row0 + n_rows) of w, unit by unit, to bf16 out [n_rows][K] */
template <int T>
__global__ void k_dq_bf16(const uint8_t *__restrict__ w, int64_t wrow, int32_t K, int64_t row0, int64_t n_rows,
                          __nv_bfloat16 *__restrict__ out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, units = K / 32;
    if (i >= n_rows * units)
        return;
    const int64_t r = i / units, u = i % units;
    float v[32];
    dq32<T>(w + (row0 + r) * wrow, u, v);
    uint4 *o = (uint4 *)(out + r * K + u * 32);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t p[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const __nv_bfloat162 h = __floats2bfloat162_rn(v[8 * q + 2 * j], v[8 * q + 2 * j + 1]);
            p[j] = *(const uint32_t *)&h;
        }
        o[q] = make_uint4(p[0], p[1], p[2], p[3]);
    }
}

/* the embedding rows of the batch's tokens, a thread a unit */
template <int T>
__global__ void k_embed_q(float *out, int64_t os, const uint8_t *__restrict__ table, int64_t trow,
                          const int32_t *token, int32_t cols)
{
    const int32_t u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= cols / 32)
        return;
    float v[32];
    dq32<T>(table + (int64_t)token[blockIdx.y] * trow, u, v);
    float *o = out + (int64_t)blockIdx.y * os + (int64_t)u * 32;
#pragma unroll
    for (int j = 0; j < 32; j++)
        o[j] = v[j];
}

/* f(std::integral_constant<int, t>) for a block type t */
template <typename F> static void mmq_type(enum dtype t, F f)
{
    switch (t) {
#define MMQ_CASE(X) \
    case X: f(std::integral_constant<int, X>()); break;
        MMQ_CASE(DT_Q4_0)
        MMQ_CASE(DT_Q4_1)
        MMQ_CASE(DT_Q5_0)
        MMQ_CASE(DT_Q5_1)
        MMQ_CASE(DT_Q8_0)
        MMQ_CASE(DT_Q2_K)
        MMQ_CASE(DT_Q3_K)
        MMQ_CASE(DT_Q4_K)
        MMQ_CASE(DT_Q5_K)
        MMQ_CASE(DT_Q6_K)
        MMQ_CASE(DT_IQ4_NL)
        MMQ_CASE(DT_IQ4_XS)
        MMQ_CASE(DT_IQ2_XXS)
#undef MMQ_CASE
    default: assert(!"not a block type");
    }
}

int cuda_matmul_q_init(struct cuda_backend *c)
{
    return CUDA_CHECK(c, cudaMemcpyToSymbol(d_iq2xxs_grid, iq2xxs_grid, sizeof iq2xxs_grid));
}

static int64_t row_bytes(const struct tensor *w) { return (int64_t)dtype_bytes(w->type, w->row_stride); }

/* the token tile a launch takes for n tokens: the smallest compiled one that
 * holds them, up to MMQ_NT */
static int mmq_tile(int32_t n) { return n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : MMQ_NT; }

/* rows a warp of k_mmq takes for n tokens (KAPITSA_MMQ_R=1|2 overrides,
 * for measuring) */
static int mmq_rows_per_warp(int32_t n)
{
    static int forced = -1;
    if (forced < 0) {
        const char *e = getenv("KAPITSA_MMQ_R");
        forced = e && (*e == '1' || *e == '2') ? *e - '0' : 0;
    }
    return forced ? forced : n == 1 ? 1 : 2;
}

/* k_mmq over every token of x, tiles of up to MMQ_NT */
static void mmq_run(struct cuda_backend *c, struct tensor *out, const struct tensor *x, const float *xd, int64_t xs,
                    const struct tensor *w, bool accumulate)
{
    const int32_t n = (int32_t)x->n_rows;
    const mmq_args a = {xd, xs, cuda_rows_vec8(xd, xs, w->n_cols), n, (int32_t)w->n_cols, (int32_t)w->n_rows, (const uint8_t *)w->data, row_bytes(w),
                        (float *)out->data, out->row_stride, accumulate};
    const int nt = mmq_tile(n), R = mmq_rows_per_warp(n);
    const dim3 grid(cdiv(w->n_rows, MMQ_WARPS * R), cdiv(n, nt));
    mmq_type(w->type, [&](auto T) {
        constexpr int t = decltype(T)::value;
        auto k = nt == 1 ? (R == 1 ? k_mmq<t, 1, 1> : k_mmq<t, 1, 2>)
                 : nt == 2 ? (R == 1 ? k_mmq<t, 2, 1> : k_mmq<t, 2, 2>)
                 : nt == 4 ? (R == 1 ? k_mmq<t, 4, 1> : k_mmq<t, 4, 2>)
                           : (R == 1 ? k_mmq<t, MMQ_NT, 1> : k_mmq<t, MMQ_NT, 2>);
        cuda_launch_dep(c, k, grid, dim3(MMQ_WARPS * 32), 0, a);
    });
}

void cuda_matmul_q_grouped(struct cuda_backend *c, const struct mm_group *g, const void *const *ew,
                           const struct tensor *w0, float *out, int64_t os, const float *x, int64_t xs, int32_t K)
{
    const int32_t M = (int32_t)w0->n_rows;
    const mmq_grp_args a = {x, xs, cuda_rows_vec8(x, xs, K), K, M, g->plan, g->max_act, g->gather,
                            (const uint8_t *const *)ew, row_bytes(w0), out, os};
    const int nt = mmq_tile(g->n_max);
    const dim3 grid(cdiv(M, MMQ_WARPS), cdiv(g->n_max, nt), (unsigned)g->max_act);
    mmq_type(w0->type, [&](auto T) {
        constexpr int t = decltype(T)::value;
        auto k = nt == 1 ? k_mmq_grp<t, 1> : nt == 2 ? k_mmq_grp<t, 2> : nt == 4 ? k_mmq_grp<t, 4> : k_mmq_grp<t, MMQ_NT>;
        cuda_launch_dep(c, k, grid, dim3(MMQ_WARPS * 32), 0, a);
    });
}

/* rows [row0, row0 + n) of w as dense bf16 into out */
static void dq_bf16(struct cuda_backend *c, const struct tensor *w, int64_t row0, int64_t n, __nv_bfloat16 *out)
{
    const int64_t units = n * (w->n_cols / 32);
    mmq_type(w->type, [&](auto T) {
        k_dq_bf16<decltype(T)::value><<<cdiv(units, 256), 256, 0, c->stream>>>(
            (const uint8_t *)w->data, row_bytes(w), (int32_t)w->n_cols, row0, n, out);
    });
    CUDA_LAUNCHED(c);
}

/* whether cuda_pre_split reads x (and SwiGLU's up) */
static bool mmq_split_fits(const struct tensor *x, const struct mm_fused *f)
{
    return cuda_rows_vec8((const float *)x->data, x->row_stride, x->n_cols) &&
           (f->pre != MM_PRE_SWIGLU || cuda_rows_vec8((const float *)f->up->data, f->up->row_stride, x->n_cols));
}

void cuda_matmul_q(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                   const struct tensor *x, const struct mm_fused *f)
{
    struct cuda_backend *c = cuda_of(be);
    const int64_t n = x->n_rows, K = x->n_cols;
    if (n > CUDA_SMALL_N && !c->precise && mmq_split_fits(x, f)) {
        /* prefill: pre(x) rounded to bf16 once, each weight dequantised a slice of rows at a time */
        __nv_bfloat16 *hi = (__nv_bfloat16 *)cuda_scratch(c, SCR_BLAS, (size_t)(n * K) * 2);
        if (!hi)
            return;
        cuda_pre_split(c, (const float *)x->data, x->row_stride, n, (int32_t)K, f, hi, NULL);
        int64_t slice = (int64_t)(MMQ_DQ_BYTES / ((size_t)K * 2));
        slice = slice < 256 ? 256 : slice - slice % 256;
        for (int32_t i = 0; i < n_w; i++) {
            const int64_t M = w[i]->n_rows, rows = M < slice ? M : slice;
            __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(c, SCR_DQ, (size_t)(rows * K) * 2);
            if (!wb)
                return;
            for (int64_t r0 = 0; r0 < M; r0 += rows) {
                const int64_t m = M - r0 < rows ? M - r0 : rows;
                dq_bf16(c, w[i], r0, m, wb);
                if (cuda_gemm_bf16(c, (float *)out[i]->data + r0, out[i]->row_stride, hi, n, K, wb, K, m,
                                   f->accumulate ? 1.0f : 0.0f) != 0)
                    return;
            }
        }
        return;
    }
    /* the input op by the backend's own kernels, then one pass a weight */
    const struct tensor *in = x;
    switch (f->pre) {
    case MM_PRE_RMSNORM: cuda_rmsnorm(be, f->pre_buf, x, f->norm, f->eps); in = f->pre_buf; break;
    case MM_PRE_SWIGLU: cuda_swiglu(be, f->pre_buf, x, f->up); in = f->pre_buf; break;
    case MM_PRE_RELU2: cuda_relu2(be, f->pre_buf); in = f->pre_buf; break;
    default: break;
    }
    for (int32_t i = 0; i < n_w; i++)
        mmq_run(c, out[i], x, (const float *)in->data, in->row_stride, w[i], f->accumulate);
}

void cuda_embed_q(struct cuda_backend *c, struct tensor *out, const struct tensor *table)
{
    const int32_t cols = (int32_t)table->n_cols;
    mmq_type(table->type, [&](auto T) {
        k_embed_q<decltype(T)::value><<<dim3(cdiv(cols / 32, 128), (unsigned)c->b.n_tokens), 128, 0, c->stream>>>(
            (float *)out->data, out->row_stride, (const uint8_t *)table->data, row_bytes(table), c->d.token, cols);
    });
    CUDA_LAUNCHED(c);
}

int cuda_weight_q(struct cuda_backend *c, struct tensor *dst, const struct tensor *host)
{
    const size_t rb = dtype_bytes(host->type, host->n_cols), bytes = rb * (size_t)host->n_rows;
    void *p = NULL;
    memset(dst, 0, sizeof *dst);
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError();
        return err_set("cuda: cannot allocate %.1f MiB of device memory for %s weights: the model does not fit "
                       "this GPU; `kapitsa doctor` lists what fits, or use --device cpu",
                       (double)bytes / (1 << 20), dtype_name(host->type));
    }
    *dst = (struct tensor){host->type, host->n_rows, host->n_cols, host->n_cols, p, true};
    if (CUDA_CHECK(c, cudaMemcpy2DAsync(p, rb, host->data, dtype_bytes(host->type, host->row_stride), rb,
                                        (size_t)host->n_rows, cudaMemcpyHostToDevice, c->stream)) != 0 ||
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) != 0) {
        cudaFree(p);
        memset(dst, 0, sizeof *dst);
        return -1;
    }
    return 0;
}
