/* kern_vnni: the avx512 table's int8 path (kern.h's q8_quant and
 * matmul_q8) with AVX512-VNNI's vpdpbusd: 64 products of unsigned weight
 * codes by signed activation codes summed into 16 int32 lanes per
 * instruction. Compiled with -mavx512f -mavx512bw -mavx512vnni; only called
 * when kern_q8_supported() says so. Every float operation is kern_ref.c's,
 * lane for lane, so the two give the same bits. */
#include "kern.h"

#include "../../quant/blocks.h"
#include "../../quant/iq_tables.h"

#include <immintrin.h>
#include <string.h>

#define Q8_INLINE static inline __attribute__((always_inline))
#define Q8_UNROLL _Pragma("GCC unroll 16")

static float q8_f16(uint16_t h) { return _cvtsh_ss(h); }

/* kern_q8_hsum's order */
Q8_INLINE float q8_hsum(__m512 v)
{
    const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    const __m128 e = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

/* ---- activations ---- */

/* n (a multiple of 16) values rounded to int8 codes at q (as int32 lanes in
 * qi when asked), returning d (ref_q8_block's arithmetic) */
static float q8_block(const float *x, int n, int8_t *q, __m512i *qi)
{
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    const float amax = _mm512_reduce_max_ps(m);
    const __m512 id = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    for (int i = 0; i < n; i += 16) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), id));
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(v));
        if (qi)
            qi[i / 16] = v;
    }
    return amax / 127.0f;
}

void kern_vnni_q8_quant(enum dtype t, const float *x, int64_t k, void *xq)
{
    if (kern_q8_paired(t)) {
        struct kern_q8_pair *p = xq;
        for (int64_t i = 0; i < k / 64; i++, p++) {
            const float d0 = q8_block(x + 64 * i, 32, p->q, NULL), d1 = q8_block(x + 64 * i + 32, 32, p->q + 32, NULL);
            const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80),
                                                  _mm512_loadu_si512(p->q));
            _mm512_storeu_si512(p->corr, _mm512_sub_epi32(_mm512_setzero_si512(), s));
            _mm512_storeu_ps(p->d, _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1)));
        }
        return;
    }
    struct kern_q8_super *s = xq;
    for (int64_t i = 0; i < k / QK_K; i++, s++) {
        int8_t q[QK_K];
        __m512i qi[16];
        s->d = q8_block(x + QK_K * i, QK_K, q, qi);
        for (int g = 0; g < 16; g++)
            s->sum[g] = (int16_t)_mm512_reduce_add_epi32(qi[g]);
        for (int p = 0; p < QK_K; p += 32)
            memcpy(s->q + p, q + kern_q8_elem(t, p), 32);
        memset(s->pad, 0, sizeof s->pad);
    }
}

/* ---- products: one weight row by NT activation rows ---- */

/* 32 4-bit codes in element order from two 16-byte runs (Q4_0's, IQ4_NL's
 * and IQ4_XS's: low nibbles elements 0-15, high nibbles 16-31) as a 64-byte
 * vector: the runs a and b each twice, the second copy shifted down 4 */
Q8_INLINE __m512i q8_nibbles(const uint8_t *a, const uint8_t *b)
{
    const __m128i x = _mm_loadu_si128((const __m128i *)a), y = _mm_loadu_si128((const __m128i *)b);
    const int s = 0x00040004;
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(x, x)), _mm256_set_m128i(y, y), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(v, _mm512_set_epi32(s, s, s, s, 0, 0, 0, 0, s, s, s, s, 0, 0, 0, 0)),
                            _mm512_set1_epi8(15));
}

/* IQ4_NL's values offset by 128 into unsigned bytes, in each 128-bit lane for vpshufb */
Q8_INLINE __m512i q8_iq4_lut(void)
{
    const __m128i kv = _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
    return _mm512_broadcast_i32x4(_mm_xor_si128(kv, _mm_set1_epi8((char)0x80)));
}

/* Blocks of 32 (T: Q8_0, Q4_0, Q5_0 or IQ4_NL), two at a time: every block
 * starts with its f16 d; the codes as unsigned bytes (Q8_0's and IQ4_NL's
 * offset by 128, Q4_0's nibbles, Q5_0's with the fifth bit of qh's bit e
 * for element e), the activations' corr scaled to the offset. */
Q8_INLINE void pair_row(const uint8_t *xq, int64_t xs, const int NT, const uint8_t *w, const enum dtype T, int64_t np,
                        float *out, int64_t os)
{
    __m512 acc[KERN_Q8_MAX_NX];
    Q8_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi8((char)0x80), b4 = _mm512_set1_epi8(16), lut = q8_iq4_lut();
    const size_t bb = dtype_block_bytes(T);
    for (int64_t i = 0; i < np; i++) {
        const uint8_t *b0 = w + 2 * i * bb, *b1 = b0 + bb;
        uint16_t h0, h1;
        memcpy(&h0, b0, 2);
        memcpy(&h1, b1, 2);
        __m512i wv;
        if (T == DT_Q8_0) {
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(b0 + 2));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(b1 + 2));
            wv = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1), off);
        } else if (T == DT_Q5_0) {
            uint32_t q0, q1;
            memcpy(&q0, b0 + 2, 4);
            memcpy(&q1, b1 + 2, 4);
            wv = q8_nibbles(b0 + 6, b1 + 6);
            wv = _mm512_mask_add_epi8(wv, (__mmask64)q0 | (__mmask64)q1 << 32, wv, b4);
        } else {
            wv = q8_nibbles(b0 + 2, b1 + 2);
            if (T == DT_IQ4_NL)
                wv = _mm512_shuffle_epi8(lut, wv);
        }
        const __m512 dw = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(q8_f16(h0)), _mm512_set1_ps(q8_f16(h1)));
        Q8_UNROLL for (int t = 0; t < NT; t++)
        {
            const struct kern_q8_pair *p = (const struct kern_q8_pair *)(xq + t * xs) + i;
            __m512i corr = _mm512_loadu_si512(p->corr);
            if (T == DT_Q4_0)
                corr = _mm512_srai_epi32(corr, 4);
            else if (T == DT_Q5_0)
                corr = _mm512_srai_epi32(corr, 3);
            const __m512i dp = _mm512_dpbusd_epi32(corr, wv, _mm512_loadu_si512(p->q));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(dw, _mm512_loadu_ps(p->d)), acc[t]);
        }
    }
    Q8_UNROLL for (int t = 0; t < NT; t++) out[t * os] = q8_hsum(acc[t]);
}

#define Q8_PAIR_ROW(T, DT)                                                                                   \
    Q8_INLINE void T##_row(const uint8_t *xq, int64_t xs, const int NT, const uint8_t *w, int64_t np, float *out, \
                           int64_t os)                                                                       \
    {                                                                                                        \
        pair_row(xq, xs, NT, w, DT, np, out, os);                                                            \
    }
Q8_PAIR_ROW(q8_0, DT_Q8_0)
Q8_PAIR_ROW(q4_0, DT_Q4_0)
Q8_PAIR_ROW(q5_0, DT_Q5_0)
Q8_PAIR_ROW(iq4_nl, DT_IQ4_NL)

/* A K-quant super-block's four vectors of codes wv times a token's int8
 * activations, each group's sum (dpbusd's four-byte lanes) times its scale sv. */
Q8_INLINE __m512i q8_dot_super(const __m512i *wv, const __m512i *sv, const struct kern_q8_super *x)
{
    __m512i I = _mm512_setzero_si512();
    Q8_UNROLL for (int v = 0; v < 4; v++) I = _mm512_add_epi32(
        I, _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[v], _mm512_loadu_si512(x->q + 64 * v)),
                              sv[v]));
    return I;
}

/* Q4_K and Q5_K (HI): the 64-byte vectors of codes are the low and high
 * nibbles of qs[0..63] and qs[64..127], Q5_K's fifth bit (bit g of
 * qh[l] for group g) added; lanes 0-7 of vector v belong to group
 * 4(v/2) + v%2, lanes 8-15 to the group two after it. */
Q8_INLINE void k4_row(const uint8_t *xq, int64_t xs, const int NT, const uint8_t *w, const int HI, int64_t nb,
                      float *out, int64_t os)
{
    __m512 acc[KERN_Q8_MAX_NX];
    Q8_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15), b4 = _mm512_set1_epi8(16);
    const __m512i gi[4] = {
        _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4),
        _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5, 5),
    };
    __m512i hb[4];
    Q8_UNROLL for (int v = 0; v < 4; v++) hb[v] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << (4 * (v / 2) + v % 2)))),
        _mm256_set1_epi8((char)(1 << (4 * (v / 2) + v % 2 + 2))), 1);
    const size_t bb = HI ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    for (int64_t i = 0; i < nb; i++) {
        const struct block_q4_k *b4k = (const void *)(w + i * bb);
        const struct block_q5_k *b5k = (const void *)(w + i * bb);
        const uint8_t *scales = HI ? b5k->scales : b4k->scales, *qs = HI ? b5k->qs : b4k->qs;
        uint32_t a, m, c;
        memcpy(&a, scales, 4);
        memcpy(&m, scales + 4, 4);
        memcpy(&c, scales + 8, 4);
        /* block_k4_scale_min for the 8 groups at once, a byte each */
        const uint64_t sc = (a & 0x3f3f3f3fu) | (uint64_t)((c & 0x0f0f0f0fu) | (a >> 2 & 0x30303030u)) << 32;
        const uint64_t mn = (m & 0x3f3f3f3fu) | (uint64_t)((c >> 4 & 0x0f0f0f0fu) | (m >> 2 & 0x30303030u)) << 32;
        const __m512i s32 = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc));
        const __m128i mb = _mm_cvtsi64_si128((long long)mn);
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));
        __m512i sv[4], wv[4];
        Q8_UNROLL for (int v = 0; v < 4; v++) sv[v] = _mm512_permutexvar_epi32(gi[v], s32);
        const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
        wv[0] = _mm512_and_si512(q0, m4);
        wv[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
        wv[2] = _mm512_and_si512(q1, m4);
        wv[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
        if (HI) {
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b5k->qh));
            Q8_UNROLL for (int v = 0; v < 4; v++) wv[v] =
                _mm512_mask_add_epi8(wv[v], _mm512_test_epi8_mask(qh, hb[v]), wv[v], b4);
        }
        const float d = q8_f16(HI ? b5k->d : b4k->d), dm = q8_f16(HI ? b5k->dmin : b4k->dmin);
        Q8_UNROLL for (int t = 0; t < NT; t++)
        {
            const struct kern_q8_super *x = (const struct kern_q8_super *)(xq + t * xs) + i;
            __m512i I = q8_dot_super(wv, sv, x);
            const __m256i M = _mm256_madd_epi16(m16, _mm256_loadu_si256((const __m256i *)x->sum));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(d * x->d), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(M)), _mm512_set1_ps(-(dm * x->d)),
                                     acc[t]);
        }
    }
    Q8_UNROLL for (int t = 0; t < NT; t++) out[t * os] = q8_hsum(acc[t]);
}

Q8_INLINE void q4_k_row(const uint8_t *xq, int64_t xs, const int NT, const struct block_q4_k *w, int64_t nb, float *out,
                        int64_t os)
{
    k4_row(xq, xs, NT, (const uint8_t *)w, 0, nb, out, os);
}

Q8_INLINE void q5_k_row(const uint8_t *xq, int64_t xs, const int NT, const struct block_q5_k *w, int64_t nb, float *out,
                        int64_t os)
{
    k4_row(xq, xs, NT, (const uint8_t *)w, 1, nb, out, os);
}

/* The 2-bit codes of Q2_K's and Q3_K's qs in element order: vector 2h + n
 * holds elements 128h + 64n .. +63, bits 4n and 4n + 2 of qs[32h..32h+31]
 * in its two halves. */
Q8_INLINE void q8_crumbs(const uint8_t *qs, __m512i *wv)
{
    const __m512i m2 = _mm512_set1_epi8(3);
    const __m512i sh = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(0)), _mm256_set1_epi16(2), 1);
    Q8_UNROLL for (int h = 0; h < 2; h++)
    {
        const __m256i r = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        const __m512i q = _mm512_srlv_epi16(_mm512_broadcast_i64x4(r), sh);
        wv[2 * h] = _mm512_and_si512(q, m2);
        wv[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m2);
    }
}

/* Q2_K: 16 groups of 16, lane l of vector v in group 4v + l / 4; the
 * scales' low nibbles multiply the codes, their high nibbles the group's
 * activation sums (the mins, a group a lane). */
Q8_INLINE void q2_k_row(const uint8_t *xq, int64_t xs, const int NT, const struct block_q2_k *w, int64_t nb, float *out,
                        int64_t os)
{
    __m512 acc[KERN_Q8_MAX_NX];
    Q8_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    __m512i gi[4];
    Q8_UNROLL for (int v = 0; v < 4; v++) gi[v] = _mm512_add_epi32(
        _mm512_set1_epi32(4 * v), _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
    for (int64_t i = 0; i < nb; i++) {
        const struct block_q2_k *b = w + i;
        const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        const __m512i s32 = _mm512_cvtepu8_epi32(_mm_and_si128(sc, m4));
        const __m512i m32 = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
        __m512i sv[4], wv[4];
        Q8_UNROLL for (int v = 0; v < 4; v++) sv[v] = _mm512_permutexvar_epi32(gi[v], s32);
        q8_crumbs(b->qs, wv);
        const float d = q8_f16(b->d), dm = q8_f16(b->dmin);
        Q8_UNROLL for (int t = 0; t < NT; t++)
        {
            const struct kern_q8_super *x = (const struct kern_q8_super *)(xq + t * xs) + i;
            const __m512i I = q8_dot_super(wv, sv, x);
            const __m512i M =
                _mm512_mullo_epi32(m32, _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)x->sum)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(d * x->d), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), _mm512_set1_ps(-(dm * x->d)), acc[t]);
        }
    }
    Q8_UNROLL for (int t = 0; t < NT; t++) out[t * os] = q8_hsum(acc[t]);
}

/* Q3_K: Q2_K's codes with the high bit (bit 4h + 2n (+1 for the second
 * half) of hmask[l]) adding 4, the code standing for code - 4; signed
 * 6-bit scales (block_q3_k_scale) for 16 groups, taken out of their 12
 * bytes at once. */
Q8_INLINE void q3_k_row(const uint8_t *xq, int64_t xs, const int NT, const struct block_q3_k *w, int64_t nb, float *out,
                        int64_t os)
{
    __m512 acc[KERN_Q8_MAX_NX];
    Q8_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const __m512i b2 = _mm512_set1_epi8(4);
    __m512i gi[4], hb[4];
    Q8_UNROLL for (int v = 0; v < 4; v++)
    {
        gi[v] = _mm512_add_epi32(_mm512_set1_epi32(4 * v),
                                 _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
        hb[v] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << (2 * v)))),
                                   _mm256_set1_epi8((char)(1 << (2 * v + 1))), 1);
    }
    for (int64_t i = 0; i < nb; i++) {
        const struct block_q3_k *b = w + i;
        uint64_t lo;
        uint32_t hi;
        memcpy(&lo, b->scales, 8);
        memcpy(&hi, b->scales + 8, 4);
        const uint64_t s0 = (lo & 0x0f0f0f0f0f0f0f0full) |
                            ((uint64_t)(hi & 0x03030303u) | (uint64_t)(hi >> 2 & 0x03030303u) << 32) << 4;
        const uint64_t s1 = (lo >> 4 & 0x0f0f0f0f0f0f0f0full) |
                            ((uint64_t)(hi >> 4 & 0x03030303u) | (uint64_t)(hi >> 6 & 0x03030303u) << 32) << 4;
        const __m128i s8 = _mm_sub_epi8(_mm_set_epi64x((long long)s1, (long long)s0), _mm_set1_epi8(32));
        const __m512i s32 = _mm512_cvtepi8_epi32(s8);
        const __m256i s16 = _mm256_cvtepi8_epi16(s8);
        __m512i sv[4], wv[4];
        Q8_UNROLL for (int v = 0; v < 4; v++) sv[v] = _mm512_permutexvar_epi32(gi[v], s32);
        q8_crumbs(b->qs, wv);
        const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->hmask));
        Q8_UNROLL for (int v = 0; v < 4; v++) wv[v] =
            _mm512_mask_add_epi8(wv[v], _mm512_test_epi8_mask(hm, hb[v]), wv[v], b2);
        const float d = q8_f16(b->d);
        Q8_UNROLL for (int t = 0; t < NT; t++)
        {
            const struct kern_q8_super *x = (const struct kern_q8_super *)(xq + t * xs) + i;
            __m512i I = q8_dot_super(wv, sv, x);
            const __m256i O = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)x->sum));
            I = _mm512_sub_epi32(I, _mm512_slli_epi32(_mm512_zextsi256_si512(O), 2));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(d * x->d), acc[t]);
        }
    }
    Q8_UNROLL for (int t = 0; t < NT; t++) out[t * os] = q8_hsum(acc[t]);
}

/* Q6_K: vector 2h + n holds elements 128h + 64n .. +63, its codes ql's
 * nibbles of ql[64h..64h+63] (low for n = 0, high for n = 1) with two bits
 * of qh[32h + l % 32] above them; lane l belongs to group 4v + l / 4. */
Q8_INLINE void q6_k_row(const uint8_t *xq, int64_t xs, const int NT, const struct block_q6_k *w, int64_t nb, float *out,
                        int64_t os)
{
    __m512 acc[KERN_Q8_MAX_NX];
    Q8_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    /* the bytes 0-31 of a vector take qh's bits 2n..2n+1 of part 0, bytes 32-63 of part 1 */
    const __m512i shl = _mm512_set_epi16(2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
                                         4, 4, 4, 4, 4, 4);
    const __m512i shr = _mm512_set_epi16(2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0);
    __m512i gi[4];
    Q8_UNROLL for (int v = 0; v < 4; v++) gi[v] = _mm512_add_epi32(
        _mm512_set1_epi32(4 * v), _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
    for (int64_t i = 0; i < nb; i++) {
        const struct block_q6_k *b = w + i;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)b->scales);
        const __m512i s32 = _mm512_cvtepi8_epi32(s8);
        const __m256i s16 = _mm256_cvtepi8_epi16(s8);
        __m512i sv[4], wv[4];
        Q8_UNROLL for (int v = 0; v < 4; v++) sv[v] = _mm512_permutexvar_epi32(gi[v], s32);
        Q8_UNROLL for (int h = 0; h < 2; h++)
        {
            const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
            wv[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
            wv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                            _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
        }
        const float d = q8_f16(b->d);
        Q8_UNROLL for (int t = 0; t < NT; t++)
        {
            const struct kern_q8_super *x = (const struct kern_q8_super *)(xq + t * xs) + i;
            __m512i I = q8_dot_super(wv, sv, x);
            const __m256i O = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)x->sum));
            I = _mm512_sub_epi32(I, _mm512_slli_epi32(_mm512_zextsi256_si512(O), 5));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(d * x->d), acc[t]);
        }
    }
    Q8_UNROLL for (int t = 0; t < NT; t++) out[t * os] = q8_hsum(acc[t]);
}

/* IQ4_XS: vector v holds groups 2v (lanes 0-7) and 2v + 1 (lanes 8-15),
 * IQ4_NL's values offset by 128 for its nibbles, each group's scale ls - 32
 * (ls's low four bits in scales_l's nibbles, the top two in scales_h). */
Q8_INLINE void iq4_xs_row(const uint8_t *xq, int64_t xs, const int NT, const struct block_iq4_xs *w, int64_t nb,
                          float *out, int64_t os)
{
    __m512 acc[KERN_Q8_MAX_NX];
    Q8_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    const __m512i lut = q8_iq4_lut();
    const __m128i m4 = _mm_set1_epi8(15);
    const __m512i hs = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    __m512i gi[4];
    Q8_UNROLL for (int v = 0; v < 4; v++) gi[v] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set1_epi32(2 * v)), _mm256_set1_epi32(2 * v + 1), 1);
    for (int64_t i = 0; i < nb; i++) {
        const struct block_iq4_xs *b = w + i;
        uint32_t sl;
        memcpy(&sl, b->scales_l, 4);
        const __m128i lo = _mm_cvtsi32_si128((int)sl);
        const __m512i l32 =
            _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(lo, m4), _mm_and_si128(_mm_srli_epi16(lo, 4), m4)));
        const __m512i h32 =
            _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(b->scales_h), hs), _mm512_set1_epi32(3));
        const __m512i s32 = _mm512_sub_epi32(_mm512_or_si512(l32, _mm512_slli_epi32(h32, 4)), _mm512_set1_epi32(32));
        const __m128i s8 = _mm512_cvtepi32_epi8(s32);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s8, s8));
        __m512i sv[4], wv[4];
        Q8_UNROLL for (int v = 0; v < 4; v++)
        {
            sv[v] = _mm512_permutexvar_epi32(gi[v], s32);
            wv[v] = _mm512_shuffle_epi8(lut, q8_nibbles(b->qs + 32 * v, b->qs + 32 * v + 16));
        }
        const float d = q8_f16(b->d);
        Q8_UNROLL for (int t = 0; t < NT; t++)
        {
            const struct kern_q8_super *x = (const struct kern_q8_super *)(xq + t * xs) + i;
            __m512i I = q8_dot_super(wv, sv, x);
            const __m256i O = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)x->sum));
            I = _mm512_sub_epi32(I, _mm512_slli_epi32(_mm512_zextsi256_si512(O), 7));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(d * x->d), acc[t]);
        }
    }
    Q8_UNROLL for (int t = 0; t < NT; t++) out[t * os] = q8_hsum(acc[t]);
}

#define Q8_ROWS(T, BLK, PER)                                                                                 \
    static void q8_rows_##T(const uint8_t *xq, int64_t xs, int32_t n_x, const uint8_t *w, int64_t wsb, int64_t k, \
                            float *out, int64_t os, int64_t j0, int64_t j1)                                  \
    {                                                                                                        \
        for (int64_t j = j0; j < j1; j++) {                                                                  \
            const BLK *r = (const BLK *)(w + j * wsb);                                                       \
            switch (n_x) {                                                                                   \
            case 1: T##_row(xq, xs, 1, r, k / (PER), out + j, os); break;                                    \
            case 2: T##_row(xq, xs, 2, r, k / (PER), out + j, os); break;                                    \
            case 3: T##_row(xq, xs, 3, r, k / (PER), out + j, os); break;                                    \
            case 4: T##_row(xq, xs, 4, r, k / (PER), out + j, os); break;                                    \
            case 5: T##_row(xq, xs, 5, r, k / (PER), out + j, os); break;                                    \
            case 6: T##_row(xq, xs, 6, r, k / (PER), out + j, os); break;                                    \
            case 7: T##_row(xq, xs, 7, r, k / (PER), out + j, os); break;                                    \
            default: T##_row(xq, xs, 8, r, k / (PER), out + j, os); break;                                   \
            }                                                                                                \
        }                                                                                                    \
    }
Q8_ROWS(q8_0, uint8_t, 64)
Q8_ROWS(q4_0, uint8_t, 64)
Q8_ROWS(q5_0, uint8_t, 64)
Q8_ROWS(iq4_nl, uint8_t, 64)
Q8_ROWS(iq4_xs, struct block_iq4_xs, QK_K)
Q8_ROWS(q4_k, struct block_q4_k, QK_K)
Q8_ROWS(q6_k, struct block_q6_k, QK_K)
Q8_ROWS(q5_k, struct block_q5_k, QK_K)
Q8_ROWS(q3_k, struct block_q3_k, QK_K)
Q8_ROWS(q2_k, struct block_q2_k, QK_K)

int kern_vnni_matmul_q8(enum dtype t, const void *xq, int64_t xq_stride, int32_t n_x, const void *w, int64_t w_stride,
                        int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1)
{
    if (!kern_q8_row_bytes(t, k))
        return 0;
    const int64_t wsb = (int64_t)dtype_bytes(t, w_stride);
    switch (t) {
    case DT_Q8_0: q8_rows_q8_0(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_Q4_K: q8_rows_q4_k(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_Q6_K: q8_rows_q6_k(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_Q5_K: q8_rows_q5_k(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_Q3_K: q8_rows_q3_k(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_Q2_K: q8_rows_q2_k(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_Q4_0: q8_rows_q4_0(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_Q5_0: q8_rows_q5_0(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_IQ4_NL: q8_rows_iq4_nl(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    case DT_IQ4_XS: q8_rows_iq4_xs(xq, xq_stride, n_x, w, wsb, k, out, out_stride, j0, j1); return 1;
    default: return 0;
    }
}
