/* kern_avx2: the kern_simd.h kernels for AVX2 + FMA + F16C (8 fp32 lanes).
 * Compiled with -mavx2 -mfma -mf16c; only called when kern_supported() says so. */
#include "../../base/dtype.h"

#include <immintrin.h>

#define VF __m256
#define VW 8
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(a) _mm256_set1_ps(a)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define V_ROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2(k) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23))
#define V_LOAD_BF16(p)                                                                                       \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VI __m256i
#define VI_I8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VI_U8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define VI_AND(a, m) _mm256_and_si256(a, _mm256_set1_epi32(m))
#define VI_OR(a, b) _mm256_or_si256(a, b)
#define VI_SUB(a, n) _mm256_sub_epi32(a, _mm256_set1_epi32(n))
#define VI_SRL(a, n) _mm256_srli_epi32(a, n)
#define VI_BIT(u, b)                                                                                         \
    _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)(u)),                        \
                                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),         \
                                       _mm256_set1_epi32(1)),                                                \
                      b)
#define V_CVT(a) _mm256_cvtepi32_ps(a)
#define KERN_JR 2
#define KERN_Q8_QUANT NULL
#define KERN_MATMUL_Q8 NULL
#define KERN_BF16_ROUND NULL
#define KERN_MATMUL_BF16_BF16 NULL
#define KERN_NAME "avx2"
#define KERN_TABLE kern_avx2
#define KFN(x) avx2_##x

static inline float avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define V_HSUM(v) avx2_hsum(v)

#include "kern_simd.h"
