/* kern_avx512bf16: the avx512 table with a bf16 matmul for prefill tiles built on
 * VDPBF16PS (AVX512-BF16), which multiplies bf16 pairs and accumulates in fp32.
 *
 * The weights are bf16 already; the fp32 activations are split exactly enough into
 * three bf16 terms (x = hi + mid + lo, residual below 2^-24 |x|), so each product
 * w*x is formed from three exact bf16 products: the result matches fp32 arithmetic
 * to within summation-order error, as every kernel here must. A one-token GEMV
 * (decode) is bound by memory, not arithmetic, and keeps the avx512 path.
 * Compiled with -mavx512f -mavx512bw -mavx512bf16 -mfma -mf16c. */
#include "../../base/dtype.h"

#include <immintrin.h>

#define VF __m512
#define VW 16
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(a) _mm512_set1_ps(a)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_LOAD_BF16(p)                                                                                       \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define KERN_JR 4
#define KERN_NAME "avx512bf16"
#define KERN_TABLE kern_avx512bf16
#define KFN(x) avx512bf16_##x
#define KERN_MATMUL_BF16 avx512bf16_matmul_dp

static void avx512bf16_matmul_dp(const float *x, int64_t xs, int32_t n_x, const void *wv, int64_t ws, int64_t k,
                                 float *out, int64_t os, int64_t j0, int64_t j1);

#include "kern_simd.h"

#define DP_MAX_K 32768
#define DP_JR 4

/* x split into three bf16 terms, per token, padded with zeros to a multiple of 32 */
static _Thread_local __m512bh dp_x[KERN_MAX_NX][3][DP_MAX_K / 32];

static void dp_split(const float *x, int64_t k, __m512bh *hi, __m512bh *mid, __m512bh *lo)
{
    for (int64_t c = 0, i = 0; c < k; c += 32, i++) {
        __m512 a = c + 16 <= k ? _mm512_loadu_ps(x + c) : _mm512_maskz_loadu_ps((__mmask16)((1u << (k - c)) - 1), x + c);
        __m512 b = c + 32 <= k ? _mm512_loadu_ps(x + c + 16)
                   : c + 16 < k ? _mm512_maskz_loadu_ps((__mmask16)((1u << (k - c - 16)) - 1), x + c + 16)
                                : _mm512_setzero_ps();
        __m512bh h = _mm512_cvtne2ps_pbh(b, a);
        a = _mm512_sub_ps(a, _mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256((__m512i)h)));
        b = _mm512_sub_ps(b, _mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64((__m512i)h, 1)));
        __m512bh m = _mm512_cvtne2ps_pbh(b, a);
        a = _mm512_sub_ps(a, _mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256((__m512i)m)));
        b = _mm512_sub_ps(b, _mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64((__m512i)m, 1)));
        hi[i] = h;
        mid[i] = m;
        lo[i] = _mm512_cvtne2ps_pbh(b, a);
    }
}

static void avx512bf16_matmul_dp(const float *x, int64_t xs, int32_t n_x, const void *wv, int64_t ws, int64_t k,
                                 float *out, int64_t os, int64_t j0, int64_t j1)
{
    if (n_x == 1 || k > DP_MAX_K) {
        avx512bf16_matmul_bf16(x, xs, n_x, wv, ws, k, out, os, j0, j1);
        return;
    }
    const uint16_t *w = wv;
    const int64_t nc = (k + 31) / 32, kfull = k / 32 * 32;
    for (int32_t t = 0; t < n_x; t++)
        dp_split(x + t * xs, k, dp_x[t][0], dp_x[t][1], dp_x[t][2]);
    for (int64_t j = j0; j < j1; j += DP_JR) {
        const int jr = j1 - j < DP_JR ? (int)(j1 - j) : DP_JR;
        __m512 acc[KERN_MAX_NX][DP_JR];
        for (int t = 0; t < KERN_MAX_NX; t++)
            for (int r = 0; r < DP_JR; r++)
                acc[t][r] = _mm512_setzero_ps();
        for (int64_t i = 0; i < nc; i++) {
            const int64_t c = i * 32;
            __m512bh wb[DP_JR];
            for (int r = 0; r < jr; r++) {
                const uint16_t *p = w + (j + r) * ws + c;
                wb[r] = (__m512bh)(c < kfull ? _mm512_loadu_si512(p)
                                             : _mm512_maskz_loadu_epi16((__mmask32)((1ull << (k - c)) - 1), p));
            }
            for (int t = 0; t < n_x; t++)
                for (int r = 0; r < jr; r++) {
                    acc[t][r] = _mm512_dpbf16_ps(acc[t][r], dp_x[t][2][i], wb[r]);
                    acc[t][r] = _mm512_dpbf16_ps(acc[t][r], dp_x[t][1][i], wb[r]);
                    acc[t][r] = _mm512_dpbf16_ps(acc[t][r], dp_x[t][0][i], wb[r]);
                }
        }
        for (int t = 0; t < n_x; t++)
            for (int r = 0; r < jr; r++)
                out[t * os + j + r] = _mm512_reduce_add_ps(acc[t][r]);
    }
}
