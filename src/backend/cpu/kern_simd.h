/* kern_simd: vector kernels written once over an ISA's macros. Included by
 * kern_avx2.c and kern_avx512.c after they define:
 *   VF, VW            vector of fp32 and its width in lanes
 *   V_ZERO() V_SET1(a) V_LOAD(p) V_STORE(p,v) V_ADD(a,b) V_SUB(a,b) V_MUL(a,b) V_FMA(a,b,c)=a*b+c
 *   V_MAX(a,b) V_ROUND(v) (to nearest, ties even) V_POW2(k) (2^k of integral k in [-126, 127])
 *   V_HSUM(v)         sum of lanes
 *   V_LOAD_BF16(p) V_LOAD_F16(p)   VW stored weights widened to fp32
 *   V_LOAD_I8(p) V_LOAD_U8(p)      VW int8 / uint8 widened to fp32
 *   KERN_JR           weight rows per matmul micro-tile
 *   KERN_NAME         the table's name, KERN_TABLE its symbol, KFN(x) a name prefix
 * Sums are reordered relative to kern_ref (lane-wise partial sums), which the
 * tests bound by fp32 rounding error. */
#include "kern.h"

#include "../../quant/blocks.h"
#include "../../quant/iq_tables.h"
#include "../../quant/quant.h"

#include <stdbool.h>
#include <stdint.h>

#define KERN_INLINE static inline __attribute__((always_inline))
/* the tile loops must unroll fully so that the accumulators live in registers */
#define KERN_UNROLL _Pragma("GCC unroll 16")

static float KFN(to_f32_bf16)(const void *w, int64_t i) { return bf16_to_f32(((const uint16_t *)w)[i]); }
static float KFN(to_f32_f16)(const void *w, int64_t i) { return f16_to_f32(((const uint16_t *)w)[i]); }
static float KFN(to_f32_f32)(const void *w, int64_t i) { return ((const float *)w)[i]; }

/* One micro-tile: NT token rows x JR weight rows starting at row j. */
#define KERN_TILE(SUFFIX, WT, LOADW)                                                                     \
    KERN_INLINE void KFN(tile_##SUFFIX)(const float *x, int64_t xs, const int NT, const WT *w, int64_t ws, \
                                         int64_t k, float *out, int64_t os, int64_t j, const int JR)        \
    {                                                                                                    \
        VF acc[KERN_MAX_NX][KERN_JR];                                                                    \
        KERN_UNROLL for (int t = 0; t < NT; t++)                                                         \
            KERN_UNROLL for (int r = 0; r < JR; r++)                                                     \
                acc[t][r] = V_ZERO();                                                                    \
        const int64_t kv = k - k % VW;                                                                   \
        for (int64_t c = 0; c < kv; c += VW) {                                                           \
            VF wv[KERN_JR];                                                                              \
            KERN_UNROLL for (int r = 0; r < JR; r++)                                                     \
                wv[r] = LOADW(w + (j + r) * ws + c);                                                     \
            KERN_UNROLL for (int t = 0; t < NT; t++) {                                                   \
                VF xv = V_LOAD(x + t * xs + c);                                                          \
                KERN_UNROLL for (int r = 0; r < JR; r++)                                                 \
                    acc[t][r] = V_FMA(xv, wv[r], acc[t][r]);                                             \
            }                                                                                            \
        }                                                                                                \
        KERN_UNROLL for (int t = 0; t < NT; t++)                                                         \
            KERN_UNROLL for (int r = 0; r < JR; r++) {                                                   \
                float s = V_HSUM(acc[t][r]);                                                             \
                for (int64_t c = kv; c < k; c++)                                                         \
                    s += x[t * xs + c] * KFN(to_f32_##SUFFIX)(w, (j + r) * ws + c);                      \
                out[t * os + j + r] = s;                                                                 \
            }                                                                                            \
    }                                                                                                    \
    KERN_INLINE void KFN(rows_##SUFFIX)(const float *x, int64_t xs, const int NT, const WT *w, int64_t ws, \
                                         int64_t k, float *out, int64_t os, int64_t j0, int64_t j1)         \
    {                                                                                                    \
        int64_t j = j0;                                                                                  \
        for (; j + KERN_JR <= j1; j += KERN_JR)                                                          \
            KFN(tile_##SUFFIX)(x, xs, NT, w, ws, k, out, os, j, KERN_JR);                                \
        for (; j < j1; j++)                                                                              \
            KFN(tile_##SUFFIX)(x, xs, NT, w, ws, k, out, os, j, 1);                                      \
    }                                                                                                    \
    static void KFN(matmul_##SUFFIX)(const float *x, int64_t xs, int32_t n_x, const void *wv, int64_t ws, \
                                     int64_t k, float *out, int64_t os, int64_t j0, int64_t j1)             \
    {                                                                                                    \
        const WT *w = wv;                                                                                \
        switch (n_x) {                                                                                   \
        case 1: /* a weight row at a time: one sequential stream, which the hardware prefetches \
                 * best; each row summed as a batch's tile sums it, so a token alone has   \
                 * the bits it has in any batch */                                         \
            for (int64_t j = j0; j < j1; j++)                                                            \
                KFN(tile_##SUFFIX)(x, xs, 1, w, ws, k, out, os, j, 1);                                   \
            break;                                                                                       \
        case 2: KFN(rows_##SUFFIX)(x, xs, 2, w, ws, k, out, os, j0, j1); break;                          \
        case 3: KFN(rows_##SUFFIX)(x, xs, 3, w, ws, k, out, os, j0, j1); break;                          \
        default: KFN(rows_##SUFFIX)(x, xs, 4, w, ws, k, out, os, j0, j1); break;                         \
        }                                                                                                \
    }

#define V_LOAD_W_F32(p) V_LOAD(p)
KERN_TILE(bf16, uint16_t, V_LOAD_BF16)
KERN_TILE(f16, uint16_t, V_LOAD_F16)
KERN_TILE(f32, float, V_LOAD_W_F32)

/* ---- block types to fp32: quant_dequant's arithmetic, the codes unpacked
 * to bytes first (loops the compiler vectorises), then scaled VW at a time ---- */

/* y[0..n) = (dl * q[i]) - ml, n a multiple of VW: each element as the reference computes it */
KERN_INLINE void KFN(dq_u8)(float *y, const uint8_t *q, int n, float dl, float ml)
{
    const VF d = V_SET1(dl), m = V_SET1(ml);
    for (int c = 0; c < n; c += VW)
        V_STORE(y + c, V_SUB(V_MUL(d, V_LOAD_U8(q + c)), m));
}

/* y[0..n) = dl * q[i], q signed */
KERN_INLINE void KFN(dq_i8)(float *y, const int8_t *q, int n, float dl)
{
    const VF d = V_SET1(dl);
    for (int c = 0; c < n; c += VW)
        V_STORE(y + c, V_MUL(d, V_LOAD_I8(q + c)));
}

static void KFN(dq_q8_0)(const void *v, float *y)
{
    const struct block_q8_0 *b = v;
    KFN(dq_i8)(y, b->qs, QK, f16_to_f32(b->d));
}

static void KFN(dq_q4_0)(const void *v, float *y)
{
    const struct block_q4_0 *b = v;
    int8_t q[QK];
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int8_t)((b->qs[j] & 15) - 8);
        q[j + QK / 2] = (int8_t)((b->qs[j] >> 4) - 8);
    }
    KFN(dq_i8)(y, q, QK, f16_to_f32(b->d));
}

static void KFN(dq_q4_k)(const void *v, float *y)
{
    const struct block_q4_k *b = v;
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int g = 0; g < 8; g += 2) {
        uint8_t lo[32], hi[32];
        const uint8_t *q = b->qs + 16 * g;
        for (int l = 0; l < 32; l++) {
            lo[l] = q[l] & 15;
            hi[l] = q[l] >> 4;
        }
        int sc, m;
        block_k4_scale_min(b->scales, g, &sc, &m);
        KFN(dq_u8)(y + 32 * g, lo, 32, d * (float)sc, dmin * (float)m);
        block_k4_scale_min(b->scales, g + 1, &sc, &m);
        KFN(dq_u8)(y + 32 * g + 32, hi, 32, d * (float)sc, dmin * (float)m);
    }
}

static void KFN(dq_q5_k)(const void *v, float *y)
{
    const struct block_q5_k *b = v;
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int g = 0; g < 8; g += 2) {
        uint8_t lo[32], hi[32];
        const uint8_t *q = b->qs + 16 * g;
        for (int l = 0; l < 32; l++) {
            lo[l] = (uint8_t)((q[l] & 15) | ((b->qh[l] >> g) & 1) << 4);
            hi[l] = (uint8_t)((q[l] >> 4) | ((b->qh[l] >> (g + 1)) & 1) << 4);
        }
        int sc, m;
        block_k4_scale_min(b->scales, g, &sc, &m);
        KFN(dq_u8)(y + 32 * g, lo, 32, d * (float)sc, dmin * (float)m);
        block_k4_scale_min(b->scales, g + 1, &sc, &m);
        KFN(dq_u8)(y + 32 * g + 32, hi, 32, d * (float)sc, dmin * (float)m);
    }
}

static void KFN(dq_q6_k)(const void *v, float *y)
{
    const struct block_q6_k *b = v;
    const float d = f16_to_f32(b->d);
    for (int c = 0; c < 2; c++) {
        int8_t q[128];
        const uint8_t *ql = b->ql + 64 * c, *qh = b->qh + 32 * c;
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
        for (int g = 0; g < 8; g++)
            KFN(dq_i8)(y + 128 * c + 16 * g, q + 16 * g, 16, d * (float)b->scales[8 * c + g]);
    }
}

static void KFN(dq_iq4_xs)(const void *v, float *y)
{
    const struct block_iq4_xs *b = v;
    const float d = f16_to_f32(b->d);
    for (int g = 0; g < 8; g++) {
        int8_t q[32];
        const uint8_t *p = b->qs + 16 * g;
        for (int j = 0; j < 16; j++) {
            q[j] = kvalues_iq4nl[p[j] & 15];
            q[j + 16] = kvalues_iq4nl[p[j] >> 4];
        }
        const int ls = ((b->scales_l[g / 2] >> (4 * (g % 2))) & 15) | ((b->scales_h >> (2 * g)) & 3) << 4;
        KFN(dq_i8)(y + 32 * g, q, 32, d * (float)(ls - 32));
    }
}

static void KFN(dequant)(enum dtype t, const void *src, int64_t n, float *dst)
{
    const uint8_t *p = src;
    const int64_t blk = dtype_block(t);
    const size_t bb = dtype_block_bytes(t);
    void (*fn)(const void *, float *) = t == DT_Q8_0    ? KFN(dq_q8_0)
                                        : t == DT_Q4_0   ? KFN(dq_q4_0)
                                        : t == DT_Q4_K   ? KFN(dq_q4_k)
                                        : t == DT_Q5_K   ? KFN(dq_q5_k)
                                        : t == DT_Q6_K   ? KFN(dq_q6_k)
                                        : t == DT_IQ4_XS ? KFN(dq_iq4_xs)
                                                         : NULL;
    if (!fn) {
        quant_dequant(t, src, n, dst);
        return;
    }
    for (int64_t i = 0; i < n / blk; i++)
        fn(p + (size_t)i * bb, dst + i * blk);
}

static void KFN(scale)(float *y, float a, int64_t n)
{
    VF av = V_SET1(a);
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        V_STORE(y + i, V_MUL(av, V_LOAD(y + i)));
    for (; i < n; i++)
        y[i] *= a;
}

static float KFN(sumsq)(const float *x, int64_t n)
{
    VF s = V_ZERO();
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        VF v = V_LOAD(x + i);
        s = V_FMA(v, v, s);
    }
    float r = V_HSUM(s);
    for (; i < n; i++)
        r += x[i] * x[i];
    return r;
}

/* kern_exp, lane by lane: the same operations in the same order */
KERN_INLINE VF KFN(vexp)(VF x)
{
    x = V_MAX(x, V_SET1(KERN_EXP_LO));
    const VF k = V_ROUND(V_MUL(x, V_SET1(KERN_LOG2E)));
    VF r = V_FMA(k, V_SET1(-KERN_LN2_HI), x);
    r = V_FMA(k, V_SET1(-KERN_LN2_LO), r);
    VF p = V_SET1(1.0f / 5040);
    p = V_FMA(p, r, V_SET1(1.0f / 720));
    p = V_FMA(p, r, V_SET1(1.0f / 120));
    p = V_FMA(p, r, V_SET1(1.0f / 24));
    p = V_FMA(p, r, V_SET1(1.0f / 6));
    p = V_FMA(p, r, V_SET1(0.5f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_FMA(p, r, V_SET1(1.0f));
    return V_MUL(p, V_POW2(k));
}

static float KFN(exp_sum)(float *x, int32_t n, float mx)
{
    const VF m = V_SET1(mx);
    VF s = V_ZERO();
    int32_t t = 0;
    for (; t + VW <= n; t += VW) {
        const VF e = KFN(vexp)(V_SUB(V_LOAD(x + t), m));
        V_STORE(x + t, e);
        s = V_ADD(s, e);
    }
    float r = V_HSUM(s);
    for (; t < n; t++)
        r += x[t] = kern_exp(x[t] - mx);
    return r;
}

static float KFN(dot)(const float *a, const float *b, int64_t n)
{
    VF s0 = V_ZERO(), s1 = V_ZERO();
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        s0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), s0);
        s1 = V_FMA(V_LOAD(a + i + VW), V_LOAD(b + i + VW), s1);
    }
    for (; i + VW <= n; i += VW)
        s0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), s0);
    float s = V_HSUM(V_ADD(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Attention over rows of the KV cache's type RT (f32, or bf16 widened on
 * load), several queries at a time so that each row loaded serves them all.
 * scores: a tile of NQ queries x NK keys, each pair's dot one vector
 * accumulator over hd in VW steps, then its lanes, then the scalar tail: a
 * pair's sum is the same whatever tile it falls in. axpy_rows: NQ outputs x
 * NV vectors in registers across the rows, each element's multiply-adds in
 * row order. */
#define KERN_ATT(SUFFIX, RT, LOADR)                                                                      \
    KERN_INLINE void KFN(qk_tile_##SUFFIX)(const float *const *q, const RT *const *rows, int64_t hd, float scale, \
                                           float *out, int32_t ld, const int NQ, const int NK)           \
    {                                                                                                    \
        VF acc[4][4];                                                                                    \
        KERN_UNROLL for (int a = 0; a < NQ; a++) KERN_UNROLL for (int b = 0; b < NK; b++) acc[a][b] = V_ZERO(); \
        const int64_t hv = hd - hd % VW;                                                                 \
        for (int64_t c = 0; c < hv; c += VW) {                                                           \
            VF kv[4];                                                                                    \
            KERN_UNROLL for (int b = 0; b < NK; b++) kv[b] = LOADR(rows[b] + c);                         \
            KERN_UNROLL for (int a = 0; a < NQ; a++) {                                                   \
                const VF qv = V_LOAD(q[a] + c);                                                          \
                KERN_UNROLL for (int b = 0; b < NK; b++) acc[a][b] = V_FMA(qv, kv[b], acc[a][b]);        \
            }                                                                                            \
        }                                                                                                \
        KERN_UNROLL for (int a = 0; a < NQ; a++) KERN_UNROLL for (int b = 0; b < NK; b++) {              \
            float s = V_HSUM(acc[a][b]);                                                                 \
            for (int64_t c = hv; c < hd; c++)                                                            \
                s += q[a][c] * KFN(to_f32_##SUFFIX)(rows[b], c);                                         \
            out[a * ld + b] = s * scale;                                                                 \
        }                                                                                                \
    }                                                                                                    \
    /* NK keys against na (4, 2 or 1) queries, each count its own unrolled tile */                    \
    KERN_INLINE void KFN(qk_keys_##SUFFIX)(const float *const *q, int32_t na, const RT *const *rows, int64_t hd,  \
                                           float scale, float *out, int32_t ld, const int NK)            \
    {                                                                                                    \
        if (na == 4)                                                                                     \
            KFN(qk_tile_##SUFFIX)(q, rows, hd, scale, out, ld, 4, NK);                                   \
        else if (na == 2)                                                                                \
            KFN(qk_tile_##SUFFIX)(q, rows, hd, scale, out, ld, 2, NK);                                   \
        else                                                                                             \
            KFN(qk_tile_##SUFFIX)(q, rows, hd, scale, out, ld, 1, NK);                                   \
    }                                                                                                    \
    static void KFN(scores_##SUFFIX)(const float *const *q, int32_t nq, const RT *const *rows, int32_t n, int64_t hd, \
                                     float scale, float *out, int32_t ld)                                \
    {                                                                                                    \
        /* tiles of 4 queries, then 2, then 1: eight or more accumulators where it can */             \
        for (int32_t a = 0; a < nq;) {                                                                   \
            const int32_t na = nq - a >= 4 ? 4 : nq - a >= 2 ? 2 : 1;                                    \
            float *o = out + (int64_t)a * ld;                                                            \
            int32_t t = 0;                                                                               \
            for (; t + 4 <= n; t += 4)                                                                   \
                KFN(qk_keys_##SUFFIX)(q + a, na, rows + t, hd, scale, o + t, ld, 4);                     \
            for (; t < n; t++)                                                                           \
                KFN(qk_keys_##SUFFIX)(q + a, na, rows + t, hd, scale, o + t, ld, 1);                     \
            a += na;                                                                                     \
        }                                                                                                \
    }                                                                                                    \
    KERN_INLINE void KFN(pv_tile_##SUFFIX)(float *const *y, const float *a, int32_t ld, const RT *const *rows, \
                                           int32_t n, int64_t i, const int NQ, const int NV)             \
    {                                                                                                    \
        VF acc[4][4];                                                                                    \
        KERN_UNROLL for (int x = 0; x < NQ; x++) KERN_UNROLL for (int v = 0; v < NV; v++) acc[x][v] = V_LOAD(y[x] + i + v * VW); \
        for (int32_t t = 0; t < n; t++) {                                                                \
            VF rv[4];                                                                                    \
            KERN_UNROLL for (int v = 0; v < NV; v++) rv[v] = LOADR(rows[t] + i + v * VW);                \
            KERN_UNROLL for (int x = 0; x < NQ; x++) {                                                   \
                const VF av = V_SET1(a[(int64_t)x * ld + t]);                                            \
                KERN_UNROLL for (int v = 0; v < NV; v++) acc[x][v] = V_FMA(av, rv[v], acc[x][v]);        \
            }                                                                                            \
        }                                                                                                \
        KERN_UNROLL for (int x = 0; x < NQ; x++) KERN_UNROLL for (int v = 0; v < NV; v++) V_STORE(y[x] + i + v * VW, acc[x][v]); \
    }                                                                                                    \
    static void KFN(axpy_rows_##SUFFIX)(float *const *y, int32_t nq, const float *a, int32_t ld, const RT *const *rows, \
                                        int32_t n, int64_t hd)                                           \
    {                                                                                                    \
        for (int32_t x0 = 0; x0 < nq;) {                                                                 \
            const int32_t nx = nq - x0 >= 4 ? 4 : nq - x0 >= 2 ? 2 : 1;                                  \
            const float *ax = a + (int64_t)x0 * ld;                                                      \
            int64_t i = 0;                                                                               \
            for (; i + 4 * VW <= hd; i += 4 * VW)                                                        \
                if (nx == 4)                                                                             \
                    KFN(pv_tile_##SUFFIX)(y + x0, ax, ld, rows, n, i, 4, 4);                             \
                else if (nx == 2)                                                                        \
                    KFN(pv_tile_##SUFFIX)(y + x0, ax, ld, rows, n, i, 2, 4);                             \
                else                                                                                     \
                    KFN(pv_tile_##SUFFIX)(y + x0, ax, ld, rows, n, i, 1, 4);                             \
            for (; i + VW <= hd; i += VW)                                                                \
                for (int32_t x = 0; x < nx; x++)                                                         \
                    KFN(pv_tile_##SUFFIX)(y + x0 + x, ax + (int64_t)x * ld, ld, rows, n, i, 1, 1);       \
            for (; i < hd; i++)                                                                          \
                for (int32_t x = 0; x < nx; x++) {                                                       \
                    float v = y[x0 + x][i];                                                              \
                    for (int32_t t = 0; t < n; t++)                                                      \
                        v += ax[(int64_t)x * ld + t] * KFN(to_f32_##SUFFIX)(rows[t], i);                 \
                    y[x0 + x][i] = v;                                                                    \
                }                                                                                        \
            x0 += nx;                                                                                    \
        }                                                                                                \
    }

KERN_ATT(f32, float, V_LOAD)
KERN_ATT(bf16, uint16_t, V_LOAD_BF16)

/* y += a * x: one output, one row of axpy_rows */
static void KFN(axpy)(float *y, float a, const float *x, int64_t n) { KFN(axpy_rows_f32)(&y, 1, &a, 1, &x, 1, n); }

const struct kern KERN_TABLE = {
    KERN_NAME,       KFN(matmul_bf16),    KFN(matmul_f16), KFN(matmul_f32), KFN(dequant), KFN(dot),
    KFN(axpy),       KFN(scale),          KFN(sumsq),      KFN(scores_f32), KFN(exp_sum),
    KFN(axpy_rows_f32), KFN(scores_bf16), KFN(axpy_rows_bf16),
};
