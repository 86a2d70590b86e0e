/* kern_simd: vector kernels written once over an ISA's macros. Included by
 * kern_avx2.c and kern_avx512.c after they define:
 *   VF, VW            vector of fp32 and its width in lanes
 *   V_ZERO() V_SET1(a) V_LOAD(p) V_STORE(p,v) V_ADD(a,b) V_SUB(a,b) V_MUL(a,b) V_FMA(a,b,c)=a*b+c
 *   V_MAX(a,b) V_ROUND(v) (to nearest, ties even) V_POW2(k) (2^k of integral k in [-126, 127])
 *   V_HSUM(v)         sum of lanes
 *   V_LOAD_BF16(p) V_LOAD_F16(p)   VW stored weights widened to fp32
 *   VI                vector of VW int32 lanes
 *   VI_I8(p) VI_U8(p) VW int8 / uint8 at p widened to int32
 *   VI_AND(a,m) VI_SUB(a,n) (m, n int constants) VI_OR(a,b) VI_SRL(a,n) (logical shift)
 *   VI_BIT(u,b)       lane i: bit i of u moved to bit b
 *   V_CVT(a)          int32 lanes to fp32
 *   V_LUT16(a,t)      optional: lane i of t (16 fp32) chosen by the low 4 bits of a's lane
 *   KERN_JR           weight rows per matmul micro-tile
 *   KERN_Q8_QUANT KERN_MATMUL_Q8   the table's int8 path (kern.h), or NULL
 *   KERN_BF16_ROUND KERN_MATMUL_BF16_BF16   its bf16 path (kern.h), or NULL
 *   KERN_NAME         the table's name, KERN_TABLE its symbol, KFN(x) a name prefix
 * The block-type code also uses AVX2 intrinsics itself on 32-byte runs of
 * codes, which both tables have. Sums are reordered relative to kern_ref
 * (lane-wise partial sums), which the tests bound by fp32 rounding error. */
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

/* ---- block types: quant_dequant's arithmetic a VW-wide chunk at a time ----
 *
 * Each type has a prep, run once per block (its d and group scales to fp32:
 * p[]), and a slice, the block's 32 elements [32s, 32s + 32) as 32/VW
 * vectors: the codes (unpacked as bytes with AVX2, which both tables have,
 * or as int32 lanes), converted, then the reference's float operations
 * (q * d, dl * q - ml, ...), exact in the conversions and rounded once per
 * multiply or subtract as quant.c's are. Where V_LUT16 exists, a 4-bit
 * code's value comes from a table of the group's 16 values, each made by
 * those same operations. dequant stores the slices; the fused products below
 * multiply them into the accumulators at once, so both see the same bits. */

static const uint8_t KFN(iota)[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* The low (elements 0-15) or high (16-31) nibbles of the 16 bytes at q, elements [e, e + VW). */
KERN_INLINE VI KFN(nib)(const uint8_t *q, int e)
{
    return e < 16 ? VI_AND(VI_U8(q + e), 15) : VI_SRL(VI_U8(q + e - 16), 4);
}

#ifdef V_LUT16
/* tab[q] of the nibbles of the 16 bytes at q, ordered as nib's; the
 * permute reads only an index's low four bits, so a low nibble needs no mask */
KERN_INLINE void KFN(lut_nib)(const uint8_t *q, VF tab, VF *y)
{
    for (int e = 0; e < 32; e += VW) {
        const VI u = VI_U8(q + e % 16);
        y[e / VW] = V_LUT16(e < 16 ? u : VI_SRL(u, 4), tab);
    }
}
#endif

/* dl * kvalues_iq4nl[q] of the nibbles of the 16 bytes at q, ordered as nib's */
KERN_INLINE void KFN(iq4)(const uint8_t *q, float dl, VF *y)
{
#ifdef V_LUT16
    KFN(lut_nib)(q, V_MUL(V_SET1(dl), V_CVT(VI_I8(kvalues_iq4nl))), y);
#else
    const __m128i b = _mm_loadu_si128((const __m128i *)q), m = _mm_set1_epi8(15);
    const __m128i kv = _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
    int8_t c[32];
    _mm_storeu_si128((__m128i *)c, _mm_shuffle_epi8(kv, _mm_and_si128(b, m)));
    _mm_storeu_si128((__m128i *)(c + 16), _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(b, 4), m)));
    for (int e = 0; e < 32; e += VW)
        y[e / VW] = V_MUL(V_SET1(dl), V_CVT(VI_I8(c + e)));
#endif
}

/* bytes a << n for n >= 0, a >> -n otherwise, through 16-bit lanes: only the
 * bits that stay within their byte are meant to be kept by the caller's mask */
KERN_INLINE __m256i KFN(bshift)(__m256i a, int n)
{
    return n >= 0 ? _mm256_slli_epi16(a, n) : _mm256_srli_epi16(a, -n);
}

static uint32_t KFN(u32)(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

#define QSLICE for (int e = 0; e < 32; e += VW)

static void KFN(qp_q8_0)(const void *v, float *p) { p[0] = f16_to_f32(((const struct block_q8_0 *)v)->d); }
KERN_INLINE void KFN(qs_q8_0)(const void *v, const float *p, int s, VF *y)
{
    (void)s;
    const struct block_q8_0 *b = v;
    QSLICE y[e / VW] = V_MUL(V_SET1(p[0]), V_CVT(VI_I8(b->qs + e)));
}

static void KFN(qp_q4_0)(const void *v, float *p) { p[0] = f16_to_f32(((const struct block_q4_0 *)v)->d); }
KERN_INLINE void KFN(qs_q4_0)(const void *v, const float *p, int s, VF *y)
{
    (void)s;
    const struct block_q4_0 *b = v;
#ifdef V_LUT16
    KFN(lut_nib)(b->qs, V_MUL(V_CVT(VI_SUB(VI_U8(KFN(iota)), 8)), V_SET1(p[0])), y);
#else
    QSLICE y[e / VW] = V_MUL(V_CVT(VI_SUB(KFN(nib)(b->qs, e), 8)), V_SET1(p[0]));
#endif
}

static void KFN(qp_q4_1)(const void *v, float *p)
{
    const struct block_q4_1 *b = v;
    p[0] = f16_to_f32(b->d);
    p[1] = f16_to_f32(b->m);
}
KERN_INLINE void KFN(qs_q4_1)(const void *v, const float *p, int s, VF *y)
{
    (void)s;
    const struct block_q4_1 *b = v;
#ifdef V_LUT16
    KFN(lut_nib)(b->qs, V_ADD(V_MUL(V_CVT(VI_U8(KFN(iota))), V_SET1(p[0])), V_SET1(p[1])), y);
#else
    QSLICE y[e / VW] = V_ADD(V_MUL(V_CVT(KFN(nib)(b->qs, e)), V_SET1(p[0])), V_SET1(p[1]));
#endif
}

/* Q5_0 / Q5_1: element e's fifth bit is bit e of qh */
static void KFN(qp_q5_0)(const void *v, float *p) { p[0] = f16_to_f32(((const struct block_q5_0 *)v)->d); }
KERN_INLINE void KFN(qs_q5_0)(const void *v, const float *p, int s, VF *y)
{
    (void)s;
    const struct block_q5_0 *b = v;
    const uint32_t qh = KFN(u32)(b->qh);
    QSLICE y[e / VW] = V_MUL(V_CVT(VI_SUB(VI_OR(KFN(nib)(b->qs, e), VI_BIT(qh >> e, 4)), 16)), V_SET1(p[0]));
}

static void KFN(qp_q5_1)(const void *v, float *p)
{
    const struct block_q5_1 *b = v;
    p[0] = f16_to_f32(b->d);
    p[1] = f16_to_f32(b->m);
}
KERN_INLINE void KFN(qs_q5_1)(const void *v, const float *p, int s, VF *y)
{
    (void)s;
    const struct block_q5_1 *b = v;
    const uint32_t qh = KFN(u32)(b->qh);
    QSLICE y[e / VW] = V_ADD(V_MUL(V_CVT(VI_OR(KFN(nib)(b->qs, e), VI_BIT(qh >> e, 4))), V_SET1(p[0])), V_SET1(p[1]));
}

static void KFN(qp_iq4_nl)(const void *v, float *p) { p[0] = f16_to_f32(((const struct block_iq4_nl *)v)->d); }
KERN_INLINE void KFN(qs_iq4_nl)(const void *v, const float *p, int s, VF *y)
{
    (void)s;
    KFN(iq4)(((const struct block_iq4_nl *)v)->qs, p[0], y);
}

/* K-quants with 16 groups of 16: slice s = 4c + j is groups 2s and 2s + 1,
 * its 2-bit codes at bit 2j of the 32 bytes of half c */
static void KFN(qp_q2_k)(const void *v, float *p)
{
    const struct block_q2_k *b = v;
    const VF d = V_SET1(f16_to_f32(b->d)), dmin = V_SET1(f16_to_f32(b->dmin));
    for (int g = 0; g < 16; g += VW) {
        const VI sc = VI_U8(b->scales + g);
        V_STORE(p + g, V_MUL(d, V_CVT(VI_AND(sc, 15))));
        V_STORE(p + 16 + g, V_MUL(dmin, V_CVT(VI_SRL(sc, 4))));
    }
}
KERN_INLINE void KFN(qs_q2_k)(const void *v, const float *p, int s, VF *y)
{
    const struct block_q2_k *b = v;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (s / 4)));
    uint8_t c[32];
    _mm256_storeu_si256((__m256i *)c, _mm256_and_si256(_mm256_srli_epi16(q, 2 * (s % 4)), _mm256_set1_epi8(3)));
    QSLICE y[e / VW] = V_SUB(V_MUL(V_SET1(p[2 * s + e / 16]), V_CVT(VI_U8(c + e))), V_SET1(p[16 + 2 * s + e / 16]));
}

static void KFN(qp_q3_k)(const void *v, float *p)
{
    const struct block_q3_k *b = v;
    /* block_q3_k_scale for the 16 groups, four a word */
    uint32_t a[3], u[4];
    memcpy(a, b->scales, 12);
    u[0] = (a[0] & 0x0f0f0f0f) | (a[2] & 0x03030303) << 4;
    u[1] = (a[1] & 0x0f0f0f0f) | (a[2] >> 2 & 0x03030303) << 4;
    u[2] = (a[0] >> 4 & 0x0f0f0f0f) | (a[2] >> 4 & 0x03030303) << 4;
    u[3] = (a[1] >> 4 & 0x0f0f0f0f) | (a[2] >> 6 & 0x03030303) << 4;
    uint8_t sc[16];
    memcpy(sc, u, 16);
    const VF d = V_SET1(f16_to_f32(b->d));
    for (int g = 0; g < 16; g += VW)
        V_STORE(p + g, V_MUL(d, V_CVT(VI_SUB(VI_U8(sc + g), 32))));
}
KERN_INLINE void KFN(qs_q3_k)(const void *v, const float *p, int s, VF *y)
{
    const struct block_q3_k *b = v;
    const int c = s / 4, j = s % 4;
    /* q - (h ? 0 : 4) as (q | h << 2) - 4 */
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
    const __m256i h = _mm256_loadu_si256((const __m256i *)b->hmask);
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), _mm256_set1_epi8(3));
    const __m256i hi = _mm256_and_si256(KFN(bshift)(h, 2 - (4 * c + j)), _mm256_set1_epi8(4));
    int8_t cb[32];
    _mm256_storeu_si256((__m256i *)cb, _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(4)));
    QSLICE y[e / VW] = V_MUL(V_SET1(p[2 * s + e / 16]), V_CVT(VI_I8(cb + e)));
}

/* Q4_K / Q5_K: 8 groups of 32, group g the low (g even) or high nibbles of
 * bytes 32(g/2) .. +32. dl = d * sc and ml = dmin * m of the 8 groups,
 * block_k4_scale_min's unpacking done four groups a word. */
KERN_INLINE void KFN(qp_k4)(const uint8_t *sc12, uint16_t d, uint16_t dmin, float *p)
{
    uint32_t u[3], s[2], m[2];
    memcpy(u, sc12, 12);
    s[0] = u[0] & 0x3f3f3f3f;
    s[1] = (u[2] & 0x0f0f0f0f) | (u[0] >> 6 & 0x03030303) << 4;
    m[0] = u[1] & 0x3f3f3f3f;
    m[1] = (u[2] >> 4 & 0x0f0f0f0f) | (u[1] >> 6 & 0x03030303) << 4;
    const __m256 sv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s)));
    const __m256 mv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)m)));
    _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(d)), sv));
    _mm256_storeu_ps(p + 8, _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(dmin)), mv));
}

static void KFN(qp_q4_k)(const void *v, float *p)
{
    const struct block_q4_k *b = v;
    KFN(qp_k4)(b->scales, b->d, b->dmin, p);
}
KERN_INLINE void KFN(qs_q4_k)(const void *v, const float *p, int s, VF *y)
{
    const uint8_t *q = ((const struct block_q4_k *)v)->qs + 32 * (s / 2);
#ifdef V_LUT16
    const VF tab = V_SUB(V_MUL(V_SET1(p[s]), V_CVT(VI_U8(KFN(iota)))), V_SET1(p[8 + s]));
    QSLICE
    {
        const VI u = VI_U8(q + e);
        y[e / VW] = V_LUT16(s % 2 ? VI_SRL(u, 4) : u, tab);
    }
#else
    QSLICE
    {
        const VI u = VI_U8(q + e);
        y[e / VW] = V_SUB(V_MUL(V_SET1(p[s]), V_CVT(s % 2 ? VI_SRL(u, 4) : VI_AND(u, 15))), V_SET1(p[8 + s]));
    }
#endif
}

static void KFN(qp_q5_k)(const void *v, float *p)
{
    const struct block_q5_k *b = v;
    KFN(qp_k4)(b->scales, b->d, b->dmin, p);
}
KERN_INLINE void KFN(qs_q5_k)(const void *v, const float *p, int s, VF *y)
{
    const struct block_q5_k *b = v;
    /* the fifth bit, bit s of qh, moved to bit 4 */
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (s / 2)));
    const __m256i h = _mm256_loadu_si256((const __m256i *)b->qh);
    const __m256i lo = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(15));
    uint8_t c[32];
    const __m256i hi = _mm256_and_si256(KFN(bshift)(h, 4 - s), _mm256_set1_epi8(16));
    _mm256_storeu_si256((__m256i *)c, _mm256_or_si256(lo, hi));
    QSLICE y[e / VW] = V_SUB(V_MUL(V_SET1(p[s]), V_CVT(VI_U8(c + e))), V_SET1(p[8 + s]));
}

static void KFN(qp_q6_k)(const void *v, float *p)
{
    const struct block_q6_k *b = v;
    const VF d = V_SET1(f16_to_f32(b->d));
    for (int g = 0; g < 16; g += VW)
        V_STORE(p + g, V_MUL(d, V_CVT(VI_I8(b->scales + g))));
}
/* slice s = 4c + k: the low (k < 2) or high nibbles of ql's 32 bytes at
 * 64c + 32(k & 1), bits 2k, 2k + 1 of qh's 32 bytes at 32c as bits 4, 5 */
KERN_INLINE void KFN(qs_q6_k)(const void *v, const float *p, int s, VF *y)
{
    const struct block_q6_k *b = v;
    const int c = s / 4, k = s % 4;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * c + 32 * (k & 1)));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * c));
    const __m256i lo = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(15));
    const __m256i hi = _mm256_and_si256(KFN(bshift)(h, 4 - 2 * k), _mm256_set1_epi8(0x30));
    int8_t cb[32];
    _mm256_storeu_si256((__m256i *)cb, _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32)));
    QSLICE y[e / VW] = V_MUL(V_SET1(p[2 * s + e / 16]), V_CVT(VI_I8(cb + e)));
}

static void KFN(qp_iq4_xs)(const void *v, float *p)
{
    const struct block_iq4_xs *b = v;
    const float d = f16_to_f32(b->d);
    for (int g = 0; g < 8; g++) {
        const int ls = ((b->scales_l[g / 2] >> (4 * (g % 2))) & 15) | ((b->scales_h >> (2 * g)) & 3) << 4;
        p[g] = d * (float)(ls - 32);
    }
}
KERN_INLINE void KFN(qs_iq4_xs)(const void *v, const float *p, int s, VF *y)
{
    KFN(iq4)(((const struct block_iq4_xs *)v)->qs + 16 * s, p[s], y);
}

/* A type's dequant of one block, and its fused product: per weight row and
 * block the prep, then each slice's vectors multiplied into every token's
 * accumulator in element order, as matmul_f32's tile does over the
 * dequantised row (the same chunks, one accumulator per (token, row), then
 * V_HSUM; a row is a whole number of blocks, a multiple of VW, so there is
 * no scalar tail). The slices of KERN_JR rows are interleaved so that their
 * multiply-add chains overlap; JR rows read side by side are JR streams,
 * which the hardware prefetchers follow poorly, so the tile asks the L2 for
 * the blocks two tiles ahead as it reads its own (by address arithmetic on
 * integers: past the last tiles they lie outside the weights). */
#define KERN_QTYPE(T, BLK, NEL)                                                                          \
    static void KFN(dq_##T)(const void *b, float *y)                                                     \
    {                                                                                                    \
        float p[32];                                                                                     \
        KFN(qp_##T)(b, p);                                                                               \
        KERN_UNROLL for (int s = 0; s < (NEL) / 32; s++)                                                 \
        {                                                                                                \
            VF v[32 / VW];                                                                               \
            KFN(qs_##T)(b, p, s, v);                                                                     \
            KERN_UNROLL for (int i = 0; i < 32 / VW; i++) V_STORE(y + 32 * s + i * VW, v[i]);            \
        }                                                                                                \
    }                                                                                                    \
    KERN_INLINE void KFN(qtile_##T)(const float *x, int64_t xs, const int NT, const uint8_t *w, int64_t wsb, \
                                    int64_t k, float *out, int64_t os, const int JR)                     \
    {                                                                                                    \
        VF acc[KERN_MAX_NX][KERN_JR];                                                                    \
        KERN_UNROLL for (int t = 0; t < NT; t++) KERN_UNROLL for (int r = 0; r < JR; r++) acc[t][r] = V_ZERO(); \
        for (int64_t c = 0; c < k; c += (NEL)) {                                                         \
            const uint8_t *wb = w + c / (NEL) * (int64_t)sizeof(BLK);                                    \
            float p[KERN_JR][32];                                                                        \
            KERN_UNROLL for (int r = 0; r < JR; r++) {                                                   \
                KFN(qp_##T)(wb + r * wsb, p[r]);                                                         \
                KERN_UNROLL for (int o = 0; o < (int)sizeof(BLK); o += 64)                               \
                    __builtin_prefetch((const void *)((uintptr_t)wb + (uintptr_t)((2 * JR + r) * wsb + o)),  \
                                       0, 2);                                                            \
            }                                                                                            \
            KERN_UNROLL for (int s = 0; s < (NEL) / 32; s++)                                             \
                KERN_UNROLL for (int r = 0; r < JR; r++)                                                 \
                {                                                                                        \
                    VF v[32 / VW];                                                                       \
                    KFN(qs_##T)(wb + r * wsb, p[r], s, v);                                               \
                    KERN_UNROLL for (int i = 0; i < 32 / VW; i++)                                        \
                        KERN_UNROLL for (int t = 0; t < NT; t++)                                         \
                            acc[t][r] = V_FMA(V_LOAD(x + t * xs + c + 32 * s + i * VW), v[i], acc[t][r]); \
                }                                                                                        \
        }                                                                                                \
        KERN_UNROLL for (int t = 0; t < NT; t++) KERN_UNROLL for (int r = 0; r < JR; r++)                \
            out[t * os + r] = V_HSUM(acc[t][r]);                                                         \
    }                                                                                                    \
    KERN_INLINE void KFN(qrows_##T)(const float *x, int64_t xs, const int NT, const uint8_t *w, int64_t wsb, \
                                    int64_t k, float *out, int64_t os, int64_t j0, int64_t j1)           \
    {                                                                                                    \
        int64_t j = j0;                                                                                  \
        /* the first two tiles, which no tile before them asked for */                                  \
        for (int64_t o = 0; o < 2 * KERN_JR * wsb && o < (j1 - j0) * wsb; o += 64)                        \
            __builtin_prefetch(w + j0 * wsb + o, 0, 2);                                                  \
        for (; j + KERN_JR <= j1; j += KERN_JR)                                                          \
            KFN(qtile_##T)(x, xs, NT, w + j * wsb, wsb, k, out + j, os, KERN_JR);                        \
        for (; j < j1; j++)                                                                              \
            KFN(qtile_##T)(x, xs, NT, w + j * wsb, wsb, k, out + j, os, 1);                              \
    }                                                                                                    \
    static void KFN(qmm_##T)(const float *x, int64_t xs, int32_t n_x, const uint8_t *w, int64_t wsb,     \
                             int64_t k, float *out, int64_t os, int64_t j0, int64_t j1)                  \
    {                                                                                                    \
        switch (n_x) {                                                                                   \
        case 1: KFN(qrows_##T)(x, xs, 1, w, wsb, k, out, os, j0, j1); break;                            \
        case 2: KFN(qrows_##T)(x, xs, 2, w, wsb, k, out, os, j0, j1); break;                            \
        case 3: KFN(qrows_##T)(x, xs, 3, w, wsb, k, out, os, j0, j1); break;                            \
        default: KFN(qrows_##T)(x, xs, 4, w, wsb, k, out, os, j0, j1); break;                           \
        }                                                                                                \
    }

KERN_QTYPE(q8_0, struct block_q8_0, QK)
KERN_QTYPE(q4_0, struct block_q4_0, QK)
KERN_QTYPE(q4_1, struct block_q4_1, QK)
KERN_QTYPE(q5_0, struct block_q5_0, QK)
KERN_QTYPE(q5_1, struct block_q5_1, QK)
KERN_QTYPE(iq4_nl, struct block_iq4_nl, QK)
KERN_QTYPE(q2_k, struct block_q2_k, QK_K)
KERN_QTYPE(q3_k, struct block_q3_k, QK_K)
KERN_QTYPE(q4_k, struct block_q4_k, QK_K)
KERN_QTYPE(q5_k, struct block_q5_k, QK_K)
KERN_QTYPE(q6_k, struct block_q6_k, QK_K)
KERN_QTYPE(iq4_xs, struct block_iq4_xs, QK_K)

#define KERN_QTYPES(X)                                                                                   \
    X(DT_Q8_0, q8_0) X(DT_Q4_0, q4_0) X(DT_Q4_1, q4_1) X(DT_Q5_0, q5_0) X(DT_Q5_1, q5_1)                   \
    X(DT_IQ4_NL, iq4_nl) X(DT_Q2_K, q2_k) X(DT_Q3_K, q3_k) X(DT_Q4_K, q4_k) X(DT_Q5_K, q5_k)               \
    X(DT_Q6_K, q6_k) X(DT_IQ4_XS, iq4_xs)

static void KFN(dequant)(enum dtype t, const void *src, int64_t n, float *dst)
{
    const uint8_t *p = src;
    const int64_t blk = dtype_block(t);
    const size_t bb = dtype_block_bytes(t);
    void (*fn)(const void *, float *) = NULL;
#define KERN_QDQ(DT, T)                                                                                  \
    case DT: fn = KFN(dq_##T); break;
    switch (t) {
        KERN_QTYPES(KERN_QDQ)
    default: quant_dequant(t, src, n, dst); return;
    }
#undef KERN_QDQ
    for (int64_t i = 0; i < n / blk; i++)
        fn(p + (size_t)i * bb, dst + i * blk);
}

static int KFN(matmul_q)(enum dtype t, const float *x, int64_t xs, int32_t n_x, const void *w, int64_t ws, int64_t k,
                         float *out, int64_t os, int64_t j0, int64_t j1)
{
#define KERN_QMM(DT, T)                                                                                  \
    case DT: KFN(qmm_##T)(x, xs, n_x, w, (int64_t)dtype_bytes(t, ws), k, out, os, j0, j1); return 1;
    switch (t) {
        KERN_QTYPES(KERN_QMM)
    default: return 0;
    }
#undef KERN_QMM
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
    KERN_NAME,       KFN(matmul_bf16),    KFN(matmul_f16), KFN(matmul_f32), KFN(dequant), KFN(matmul_q),
    KERN_Q8_QUANT,   KERN_MATMUL_Q8,      KFN(dot),
    KFN(axpy),       KFN(scale),          KFN(sumsq),      KFN(scores_f32), KFN(exp_sum),
    KFN(axpy_rows_f32), KFN(scores_bf16), KFN(axpy_rows_bf16), KERN_BF16_ROUND, KERN_MATMUL_BF16_BF16,
};
