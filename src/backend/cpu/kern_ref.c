/* kern_ref: scalar reference kernels, plain fp32 loops in index order.
 * The meaning of each entry is in kern.h; every SIMD table must agree with
 * these within fp32 reordering error. */
#include "kern.h"

#include "../../base/dtype.h"
#include "../../quant/blocks.h"
#include "../../quant/iq_tables.h"
#include "../../quant/quant.h"

#include <cpuid.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REF_MATMUL(fn, T, CVT)                                                                             \
    static void fn(const float *x, int64_t x_stride, int32_t n_x, const void *wv, int64_t w_stride,        \
                   int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1)                      \
    {                                                                                                      \
        const T *w = wv;                                                                                   \
        for (int32_t t = 0; t < n_x; t++)                                                                  \
            for (int64_t j = j0; j < j1; j++) {                                                            \
                float s = 0;                                                                               \
                for (int64_t c = 0; c < k; c++)                                                            \
                    s += x[t * x_stride + c] * CVT(w[j * w_stride + c]);                                   \
                out[t * out_stride + j] = s;                                                               \
            }                                                                                              \
    }

#define CVT_NONE(v) (v)
REF_MATMUL(ref_matmul_bf16, uint16_t, bf16_to_f32)
REF_MATMUL(ref_matmul_f16, uint16_t, f16_to_f32)
REF_MATMUL(ref_matmul_f32, float, CVT_NONE)

/* Each row's blocks dequantised in turn, the sum carried on in element
 * order: ref_matmul_f32 over the dequantised rows. */
static int ref_matmul_q(enum dtype t, const float *x, int64_t x_stride, int32_t n_x, const void *w, int64_t w_stride,
                        int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1)
{
    const int64_t blk = dtype_block(t);
    float y[QK_K];
    for (int32_t i = 0; i < n_x; i++)
        for (int64_t j = j0; j < j1; j++) {
            const char *row = (const char *)w + dtype_bytes(t, j * w_stride);
            float s = 0;
            for (int64_t c = 0; c < k; c += blk) {
                quant_dequant(t, row + dtype_bytes(t, c), blk, y);
                for (int64_t e = 0; e < blk; e++)
                    s += x[i * x_stride + c + e] * y[e];
            }
            out[i * out_stride + j] = s;
        }
    return 1;
}

/* ---- the int8 path (kern.h): the arithmetic every matmul_q8 table has ---- */

int64_t kern_q8_row_bytes(enum dtype t, int64_t k)
{
    switch (t) {
    case DT_Q8_0:
    case DT_Q4_0:
    case DT_Q5_0:
    case DT_IQ4_NL: return k % 64 ? 0 : k / 64 * (int64_t)sizeof(struct kern_q8_pair);
    case DT_IQ4_XS:
    case DT_Q2_K:
    case DT_Q3_K:
    case DT_Q4_K:
    case DT_Q5_K:
    case DT_Q6_K: return k % QK_K ? 0 : k / QK_K * (int64_t)sizeof(struct kern_q8_super);
    default: return 0;
    }
}

/* n values rounded to q with the block's d (kern.h) */
static float ref_q8_block(const float *x, int n, int8_t *q)
{
    float amax = 0;
    for (int i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < n; i++)
        q[i] = (int8_t)nearbyintf(x[i] * id);
    return amax / 127.0f;
}

static void ref_q8_quant(enum dtype t, const float *x, int64_t k, void *xq)
{
    if (kern_q8_paired(t)) {
        struct kern_q8_pair *p = xq;
        for (int64_t i = 0; i < k / 64; i++, p++) {
            const float d0 = ref_q8_block(x + 64 * i, 32, p->q), d1 = ref_q8_block(x + 64 * i + 32, 32, p->q + 32);
            for (int l = 0; l < 16; l++) {
                p->corr[l] = -128 * (p->q[4 * l] + p->q[4 * l + 1] + p->q[4 * l + 2] + p->q[4 * l + 3]);
                p->d[l] = l < 8 ? d0 : d1;
            }
        }
        return;
    }
    struct kern_q8_super *s = xq;
    for (int64_t i = 0; i < k / QK_K; i++, s++) {
        int8_t q[QK_K];
        s->d = ref_q8_block(x + QK_K * i, QK_K, q);
        for (int p = 0; p < QK_K; p++)
            s->q[p] = q[kern_q8_elem(t, p)];
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int e = 0; e < 16; e++)
                sum += q[16 * g + e];
            s->sum[g] = (int16_t)sum;
        }
        memset(s->pad, 0, sizeof s->pad);
    }
}

/* A block of 32's code of element e as an unsigned byte: Q8_0's and
 * IQ4_NL's stand for code - 128, Q4_0's for code - 8, Q5_0's for code - 16 */
static int ref_q8_code32(enum dtype t, const void *blk, int e)
{
    switch (t) {
    case DT_Q8_0: return ((const struct block_q8_0 *)blk)->qs[e] + 128;
    case DT_Q4_0: return ((const struct block_q4_0 *)blk)->qs[e % 16] >> (4 * (e / 16)) & 15;
    case DT_Q5_0: {
        const struct block_q5_0 *b = blk;
        return (b->qs[e % 16] >> (4 * (e / 16)) & 15) | (b->qh[e / 8] >> (e % 8) & 1) << 4;
    }
    default: {
        const struct block_iq4_nl *b = blk;
        return kvalues_iq4nl[b->qs[e % 16] >> (4 * (e / 16)) & 15] + 128;
    }
    }
}

/* A super-block's code of element e as an unsigned byte and its group's
 * integer scale (the group of 32 for Q4_K, Q5_K and IQ4_XS, of 16 for the
 * others); Q3_K's, Q6_K's and IQ4_XS's codes stand for code - 4, code - 32
 * and code - 128. */
static int ref_q8_code(enum dtype t, const void *blk, int e, int *scale)
{
    const int h = e / 128, r = e % 128, l = r % 32, part = r / 32;
    switch (t) {
    case DT_IQ4_XS: {
        const struct block_iq4_xs *b = blk;
        const int g = e / 32, j = e % 32;
        *scale = ((b->scales_l[g / 2] >> (4 * (g % 2)) & 15) | (b->scales_h >> (2 * g) & 3) << 4) - 32;
        return kvalues_iq4nl[b->qs[16 * g + j % 16] >> (4 * (j / 16)) & 15] + 128;
    }
    case DT_Q2_K: {
        const struct block_q2_k *b = blk;
        *scale = b->scales[e / 16] & 15;
        return b->qs[32 * h + l] >> (2 * part) & 3;
    }
    case DT_Q3_K: {
        const struct block_q3_k *b = blk;
        *scale = block_q3_k_scale(b->scales, e / 16);
        return (b->qs[32 * h + l] >> (2 * part) & 3) | (b->hmask[l] >> (4 * h + part) & 1) << 2;
    }
    case DT_Q4_K: {
        const struct block_q4_k *b = blk;
        int m;
        block_k4_scale_min(b->scales, e / 32, scale, &m);
        return b->qs[32 * (e / 64) + e % 32] >> (4 * (e % 64 / 32)) & 15;
    }
    case DT_Q5_K: {
        const struct block_q5_k *b = blk;
        int m;
        block_k4_scale_min(b->scales, e / 32, scale, &m);
        return (b->qs[32 * (e / 64) + e % 32] >> (4 * (e % 64 / 32)) & 15) | (b->qh[e % 32] >> (e / 32) & 1) << 4;
    }
    default: {
        const struct block_q6_k *b = blk;
        *scale = b->scales[e / 16];
        const int lo = b->ql[64 * h + l + 32 * (part % 2)] >> (4 * (part / 2)) & 15;
        return lo | (b->qh[32 * h + l] >> (2 * part) & 3) << 4;
    }
    }
}

/* One row of weights by one activation row. Blocks of 32: lane l's sum of
 * its four codes' products and corr (scaled to the type's offset), in fp32
 * acc = fma(dp, d * dx, acc). Super-blocks: per block the integer lanes
 * I[16] (less the codes' offset: Q3_K's 4, Q6_K's 32 and IQ4_XS's 128
 * times each pair of groups' scaled sums, in lanes 0-7), then in fp32
 * acc = fma(I, d * dx, acc) and, for the types with mins, the mins' lanes M (Q4_K and Q5_K: a
 * group of 32 a lane in 0-7; Q2_K: a group of 16 a lane) in acc = fma(M,
 * -(dmin * dx), acc); the sum of the lanes at the end. */
static float ref_q8_row(enum dtype t, const void *xq, const uint8_t *w, int64_t k)
{
    float acc[16] = {0};
    const size_t bb = dtype_block_bytes(t);
    if (kern_q8_paired(t)) {
        const struct kern_q8_pair *p = xq;
        const int div = t == DT_Q4_0 ? 16 : t == DT_Q5_0 ? 8 : 1;
        for (int64_t i = 0; i < k / 64; i++, p++)
            for (int l = 0; l < 16; l++) {
                const uint8_t *bl = w + (size_t)(2 * i + l / 8) * bb;
                uint16_t d;
                memcpy(&d, bl, 2); /* every block of 32 starts with its f16 d */
                int32_t dp = p->corr[l] / div;
                for (int e = 0; e < 4; e++)
                    dp += ref_q8_code32(t, bl, 4 * (l % 8) + e) * p->q[4 * l + e];
                acc[l] = fmaf((float)dp, f16_to_f32(d) * p->d[l], acc[l]);
            }
        return kern_q8_hsum(acc);
    }
    const struct kern_q8_super *s = xq;
    for (int64_t i = 0; i < k / QK_K; i++, s++) {
        const void *blk = w + (size_t)i * bb;
        int32_t I[16] = {0}, M[16] = {0};
        for (int p = 0; p < QK_K; p++) {
            int sc;
            const int q = ref_q8_code(t, blk, kern_q8_elem(t, p), &sc);
            I[p % 64 / 4] += sc * q * s->q[p];
        }
        float d, dm = 0;
        if (t == DT_Q4_K || t == DT_Q5_K) {
            const struct block_q4_k *b4 = blk;
            const struct block_q5_k *b5 = blk;
            d = f16_to_f32(t == DT_Q4_K ? b4->d : b5->d);
            dm = f16_to_f32(t == DT_Q4_K ? b4->dmin : b5->dmin);
            for (int j = 0; j < 8; j++) {
                int sc, m;
                block_k4_scale_min(t == DT_Q4_K ? b4->scales : b5->scales, j, &sc, &m);
                M[j] = m * (s->sum[2 * j] + s->sum[2 * j + 1]);
            }
        } else if (t == DT_Q2_K) {
            const struct block_q2_k *b = blk;
            d = f16_to_f32(b->d);
            dm = f16_to_f32(b->dmin);
            for (int g = 0; g < 16; g++)
                M[g] = (b->scales[g] >> 4) * s->sum[g];
        } else if (t == DT_IQ4_XS) {
            const struct block_iq4_xs *b = blk;
            d = f16_to_f32(b->d);
            for (int j = 0; j < 8; j++) {
                int sc;
                ref_q8_code(t, blk, 32 * j, &sc);
                I[j] -= 128 * sc * (s->sum[2 * j] + s->sum[2 * j + 1]);
            }
        } else if (t == DT_Q3_K) {
            const struct block_q3_k *b = blk;
            d = f16_to_f32(b->d);
            for (int j = 0; j < 8; j++)
                I[j] -= 4 * (block_q3_k_scale(b->scales, 2 * j) * s->sum[2 * j] +
                             block_q3_k_scale(b->scales, 2 * j + 1) * s->sum[2 * j + 1]);
        } else {
            const struct block_q6_k *b = blk;
            d = f16_to_f32(b->d);
            for (int j = 0; j < 8; j++)
                I[j] -= 32 * (b->scales[2 * j] * s->sum[2 * j] + b->scales[2 * j + 1] * s->sum[2 * j + 1]);
        }
        for (int l = 0; l < 16; l++)
            acc[l] = fmaf((float)I[l], d * s->d, acc[l]);
        if (t == DT_Q4_K || t == DT_Q5_K || t == DT_Q2_K)
            for (int l = 0; l < 16; l++)
                acc[l] = fmaf((float)M[l], -(dm * s->d), acc[l]);
    }
    return kern_q8_hsum(acc);
}

static int ref_matmul_q8(enum dtype t, const void *xq, int64_t xq_stride, int32_t n_x, const void *w,
                         int64_t w_stride, int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1)
{
    if (!kern_q8_row_bytes(t, k))
        return 0;
    for (int32_t i = 0; i < n_x; i++)
        for (int64_t j = j0; j < j1; j++)
            out[i * out_stride + j] = ref_q8_row(t, (const uint8_t *)xq + i * xq_stride,
                                                 (const uint8_t *)w + dtype_bytes(t, j * w_stride), k);
    return 1;
}

/* ---- the bf16 path (kern.h): the arithmetic every bf16_round and matmul_bf16_bf16 has ---- */

uint16_t kern_bf16_round(float f)
{
    return fpclassify(f) == FP_SUBNORMAL ? (uint16_t)(signbit(f) ? 0x8000 : 0) : f32_to_bf16(f);
}

/* a denormal as a zero of its sign: VDPBF16PS's inputs and results */
static float ref_ftz(float v) { return fpclassify(v) == FP_SUBNORMAL ? copysignf(0.0f, v) : v; }

float kern_bf16_dot(const uint16_t *x, const uint16_t *w, int64_t k)
{
    float acc[16] = {0};
    for (int64_t c = 0; c < k; c += 32)
        for (int l = 0; l < 16; l++)
            for (int e = 1; e >= 0; e--) {
                const int64_t i = c + 2 * l + e;
                const float a = i < k ? bf16_to_f32(x[i]) : 0.0f, b = i < k ? bf16_to_f32(w[i]) : 0.0f;
                acc[l] = ref_ftz(fmaf(ref_ftz(a), ref_ftz(b), acc[l]));
            }
    return kern_q8_hsum(acc);
}

static void ref_bf16_round(const float *x, int64_t k, uint16_t *xb)
{
    for (int64_t i = 0; i < k; i++)
        xb[i] = kern_bf16_round(x[i]);
}

static void ref_matmul_bf16_bf16(const uint16_t *x, int64_t x_stride, int32_t n_x, const void *w, int64_t w_stride,
                                 int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1)
{
    for (int32_t t = 0; t < n_x; t++)
        for (int64_t j = j0; j < j1; j++)
            out[t * out_stride + j] = kern_bf16_dot(x + t * x_stride, (const uint16_t *)w + j * w_stride, k);
}

static float ref_dot(const float *a, const float *b, int64_t n)
{
    float s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void ref_axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void ref_scale(float *y, float a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] *= a;
}

static float ref_sumsq(const float *x, int64_t n)
{
    float s = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i] * x[i];
    return s;
}

float kern_exp(float x)
{
    x = x < KERN_EXP_LO ? KERN_EXP_LO : x;
    const float k = nearbyintf(x * KERN_LOG2E);
    float r = fmaf(k, -KERN_LN2_HI, x);
    r = fmaf(k, -KERN_LN2_LO, r);
    float p = 1.0f / 5040;
    p = fmaf(p, r, 1.0f / 720);
    p = fmaf(p, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24);
    p = fmaf(p, r, 1.0f / 6);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return p * ldexpf(1.0f, (int)k);
}

static void ref_scores(const float *const *q, int32_t nq, const float *const *rows, int32_t n, int64_t hd, float scale,
                       float *out, int32_t ld)
{
    for (int32_t a = 0; a < nq; a++)
        for (int32_t t = 0; t < n; t++)
            out[(int64_t)a * ld + t] = ref_dot(q[a], rows[t], hd) * scale;
}

static float ref_exp_sum(float *x, int32_t n, float mx)
{
    float s = 0;
    for (int32_t t = 0; t < n; t++)
        s += x[t] = kern_exp(x[t] - mx);
    return s;
}

static void ref_axpy_rows(float *const *y, int32_t nq, const float *a, int32_t ld, const float *const *rows, int32_t n,
                          int64_t hd)
{
    for (int32_t x = 0; x < nq; x++)
        for (int32_t t = 0; t < n; t++)
            ref_axpy(y[x], a[(int64_t)x * ld + t], rows[t], hd);
}

static void ref_scores_bf16(const float *const *q, int32_t nq, const uint16_t *const *rows, int32_t n, int64_t hd,
                            float scale, float *out, int32_t ld)
{
    for (int32_t a = 0; a < nq; a++)
        for (int32_t t = 0; t < n; t++) {
            float s = 0;
            for (int64_t c = 0; c < hd; c++)
                s += q[a][c] * bf16_to_f32(rows[t][c]);
            out[(int64_t)a * ld + t] = s * scale;
        }
}

static void ref_axpy_rows_bf16(float *const *y, int32_t nq, const float *a, int32_t ld, const uint16_t *const *rows,
                               int32_t n, int64_t hd)
{
    for (int32_t x = 0; x < nq; x++)
        for (int32_t t = 0; t < n; t++)
            for (int64_t c = 0; c < hd; c++)
                y[x][c] += a[(int64_t)x * ld + t] * bf16_to_f32(rows[t][c]);
}

const struct kern kern_ref = {
    "ref",           ref_matmul_bf16, ref_matmul_f16, ref_matmul_f32, quant_dequant, ref_matmul_q,
    ref_q8_quant,    ref_matmul_q8,   ref_dot,        ref_axpy,       ref_scale,     ref_sumsq,
    ref_scores,      ref_exp_sum,     ref_axpy_rows,  ref_scores_bf16, ref_axpy_rows_bf16, ref_bf16_round,
    ref_matmul_bf16_bf16,
};

/* F16C from cpuid itself: clang before 16 does not know it in __builtin_cpu_supports. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

int kern_supported(const struct kern *k)
{
    __builtin_cpu_init();
    if (k == &kern_avx512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && cpu_has_f16c() &&
               __builtin_cpu_supports("fma");
    if (k == &kern_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    return 1;
}

int kern_q8_supported(const struct kern *k)
{
    __builtin_cpu_init();
    return k->matmul_q8 && kern_supported(k) && (k != &kern_avx512 || __builtin_cpu_supports("avx512vnni"));
}

/* AVX512-BF16 from cpuid itself (leaf 7, sub-leaf 1, EAX bit 5): older
 * compilers do not know it in __builtin_cpu_supports. */
static int cpu_has_avx512_bf16(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

int kern_bf16_supported(const struct kern *k)
{
    return k->matmul_bf16_bf16 && kern_supported(k) && (k != &kern_avx512 || cpu_has_avx512_bf16());
}

const struct kern *kern_best(void)
{
    static const struct kern *const all[] = {&kern_avx512, &kern_avx2, &kern_ref};
    const char *want = getenv("KAPITSA_KERN");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (want && *want && strcmp(want, all[i]->name) != 0)
            continue;
        if (kern_supported(all[i]))
            return all[i];
    }
    return &kern_ref;
}
