/* kern_bf16: the avx512 table's bf16 path (kern.h's bf16_round and
 * matmul_bf16_bf16) with AVX512-BF16: VCVTNEPS2BF16 rounds the activations,
 * VDPBF16PS multiplies 32 bf16 pairs into 16 fp32 lanes per instruction.
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16; only called
 * when kern_bf16_supported() says so. kern_ref.c holds the same arithmetic
 * step by step, and the two agree bitwise. */
#include "kern.h"

#include <immintrin.h>

#define B16_INLINE static inline __attribute__((always_inline))
#define B16_UNROLL _Pragma("GCC unroll 16")

void kern_avx512_bf16_round(const float *x, int64_t k, uint16_t *xb)
{
    int64_t i = 0;
    for (; i + 16 <= k; i += 16)
        _mm256_storeu_si256((__m256i *)(xb + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    if (i < k) {
        const __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        _mm256_mask_storeu_epi16(xb + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* kern_q8_hsum's order: halves, quarters, pairs */
B16_INLINE float b16_hsum(__m512 v)
{
    const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    const __m128 e = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

/* A 4 x 4 tile's sums at once, each in b16_hsum's order: halves of pairs of
 * accumulators side by side, then quarters, pairs and the last add within
 * 128-bit blocks, leaving lane 4r + t the sum of acc[t][r]; out[t][j + r]
 * from lane 4r + t. */
B16_INLINE void b16_hsum4x4(__m512 acc[KERN_MAX_NX][4], float *out, int64_t os, int64_t j)
{
    __m512 h[8], q[4];
    B16_UNROLL for (int p = 0; p < 8; p++)
    {
        const __m512 a = acc[p / 2][2 * (p % 2)], b = acc[p / 2][2 * (p % 2) + 1];
        h[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    }
    B16_UNROLL for (int t = 0; t < 4; t++) q[t] =
        _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * t], h[2 * t + 1], 0x88),
                      _mm512_shuffle_f32x4(h[2 * t], h[2 * t + 1], 0xdd));
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], 0x44), _mm512_shuffle_ps(q[0], q[1], 0xee));
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_ps(q[2], q[3], 0x44), _mm512_shuffle_ps(q[2], q[3], 0xee));
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(e0, e1, 0x88), _mm512_shuffle_ps(e0, e1, 0xdd));
    const __m512 o = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f);
    /* the lane index an immediate: clang takes no loop variable there, unrolled or not */
    _mm_storeu_ps(out + j, _mm512_extractf32x4_ps(o, 0));
    _mm_storeu_ps(out + os + j, _mm512_extractf32x4_ps(o, 1));
    _mm_storeu_ps(out + 2 * os + j, _mm512_extractf32x4_ps(o, 2));
    _mm_storeu_ps(out + 3 * os + j, _mm512_extractf32x4_ps(o, 3));
}

/* NT activation rows x JR weight rows from row j: a 32-element chunk a step,
 * the last one loaded with zeros past k */
B16_INLINE void b16_tile(const uint16_t *x, int64_t xs, const int NT, const uint16_t *w, int64_t ws, int64_t k,
                         float *out, int64_t os, int64_t j, const int JR)
{
    __m512 acc[KERN_MAX_NX][4];
    B16_UNROLL for (int t = 0; t < NT; t++) B16_UNROLL for (int r = 0; r < JR; r++) acc[t][r] = _mm512_setzero_ps();
    const int64_t kv = k - k % 32;
    for (int64_t c = 0; c < kv; c += 32) {
        __m512bh wv[4];
        B16_UNROLL for (int r = 0; r < JR; r++) wv[r] = (__m512bh)_mm512_loadu_si512(w + (j + r) * ws + c);
        B16_UNROLL for (int t = 0; t < NT; t++)
        {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + t * xs + c);
            B16_UNROLL for (int r = 0; r < JR; r++) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv, wv[r]);
        }
    }
    if (kv < k) {
        const __mmask32 m = (__mmask32)((1u << (k - kv)) - 1);
        __m512bh wv[4];
        B16_UNROLL for (int r = 0; r < JR; r++) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + (j + r) * ws + kv);
        B16_UNROLL for (int t = 0; t < NT; t++)
        {
            const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x + t * xs + kv);
            B16_UNROLL for (int r = 0; r < JR; r++) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv, wv[r]);
        }
    }
    if (NT == 4 && JR == 4) {
        b16_hsum4x4(acc, out, os, j);
        return;
    }
    B16_UNROLL for (int t = 0; t < NT; t++) B16_UNROLL for (int r = 0; r < JR; r++) out[t * os + j + r] =
        b16_hsum(acc[t][r]);
}

B16_INLINE void b16_rows(const uint16_t *x, int64_t xs, const int NT, const uint16_t *w, int64_t ws, int64_t k,
                         float *out, int64_t os, int64_t j0, int64_t j1)
{
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4)
        b16_tile(x, xs, NT, w, ws, k, out, os, j, 4);
    for (; j < j1; j++)
        b16_tile(x, xs, NT, w, ws, k, out, os, j, 1);
}

void kern_avx512_matmul_bf16_bf16(const uint16_t *x, int64_t xs, int32_t n_x, const void *wv, int64_t ws, int64_t k,
                                  float *out, int64_t os, int64_t j0, int64_t j1)
{
    const uint16_t *w = wv;
    switch (n_x) {
    case 1: /* a weight row at a time: one stream, which the hardware prefetches best */
        for (int64_t j = j0; j < j1; j++)
            b16_tile(x, xs, 1, w, ws, k, out, os, j, 1);
        break;
    case 2: b16_rows(x, xs, 2, w, ws, k, out, os, j0, j1); break;
    case 3: b16_rows(x, xs, 3, w, ws, k, out, os, j0, j1); break;
    default: b16_rows(x, xs, 4, w, ws, k, out, os, j0, j1); break;
    }
}
