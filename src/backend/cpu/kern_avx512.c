/* kern_avx512: the kern_simd.h kernels for AVX-512F/BW (16 fp32 lanes).
 * Compiled with -mavx512f -mavx512bw -mfma -mf16c; only called when
 * kern_supported() says so. */
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
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_ROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2(k) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23))
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_LOAD_BF16(p)                                                                                       \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VI __m512i
#define VI_I8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VI_U8(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define VI_AND(a, m) _mm512_and_si512(a, _mm512_set1_epi32(m))
#define VI_OR(a, b) _mm512_or_si512(a, b)
#define VI_SUB(a, n) _mm512_sub_epi32(a, _mm512_set1_epi32(n))
#define VI_SRL(a, n) _mm512_srli_epi32(a, n)
#define VI_BIT(u, b) _mm512_maskz_mov_epi32((__mmask16)(u), _mm512_set1_epi32(1 << (b)))
#define V_CVT(a) _mm512_cvtepi32_ps(a)
#define V_LUT16(a, tab) _mm512_permutexvar_ps(a, tab)
#define KERN_JR 4
#define KERN_Q8_QUANT kern_vnni_q8_quant
#define KERN_MATMUL_Q8 kern_vnni_matmul_q8
#define KERN_BF16_ROUND kern_avx512_bf16_round
#define KERN_MATMUL_BF16_BF16 kern_avx512_matmul_bf16_bf16
#define KERN_NAME "avx512"
#define KERN_TABLE kern_avx512
#define KFN(x) avx512_##x

#include "kern_simd.h"
