/* kern_ref: scalar reference kernels, plain fp32 loops in index order.
 * The meaning of each entry is in kern.h; every SIMD table must agree with
 * these within fp32 reordering error. */
#include "kern.h"

#include "../../base/dtype.h"
#include "../../quant/blocks.h"
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
    "ref",     ref_matmul_bf16, ref_matmul_f16, ref_matmul_f32, quant_dequant,   ref_matmul_q,    ref_dot,  ref_axpy,
    ref_scale, ref_sumsq,       ref_scores,     ref_exp_sum,    ref_axpy_rows,   ref_scores_bf16,
    ref_axpy_rows_bf16,
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
