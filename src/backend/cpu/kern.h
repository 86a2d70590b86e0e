/* kern: the inner loops of the cpu backend, one table per instruction set.
 *
 * kern_ref.c is the scalar reference every other table is tested against
 * (tests/unit/test_kern.c). kern_simd.h holds the vector versions once, written
 * over a few macros; kern_avx2.c and kern_avx512.c instantiate it for their ISA
 * and are compiled with that ISA's flags only, so the binary runs anywhere and
 * kern_best() picks the widest table the CPU supports at run time. */
#ifndef KP_KERN_H
#define KP_KERN_H

#include "../../base/dtype.h"

#include <stdint.h>

/* out[t*out_stride + j] = sum_c x[t*x_stride + c] * w[j*w_stride + c]
 * for t in [0, n_x) with n_x <= KERN_MAX_NX and j in [j0, j1). w is BF16, F16 or F32. */
#define KERN_MAX_NX 4
typedef void (*kern_matmul_fn)(const float *x, int64_t x_stride, int32_t n_x, const void *w, int64_t w_stride,
                               int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1);

struct kern {
    const char *name;
    kern_matmul_fn matmul_bf16;
    kern_matmul_fn matmul_f16;
    kern_matmul_fn matmul_f32;
    /* dst[0..n) = n elements of type t at src widened to fp32, bitwise what
     * quant_dequant gives (the same float operations in the same order), so
     * that a product over dequantised rows has the same bits in every table's
     * tiling (n a multiple of the block) */
    void (*dequant)(enum dtype t, const void *src, int64_t n, float *dst);
    /* matmul over weights of block type t (w_stride in elements, k a whole
     * number of blocks), bitwise dequant of each row then matmul_f32, the
     * dequantised values made in registers as they are used; returns 0,
     * doing nothing, for a type the table has no such kernel for */
    int (*matmul_q)(enum dtype t, const float *x, int64_t x_stride, int32_t n_x, const void *w, int64_t w_stride,
                    int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1);
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a*x */
    void (*scale)(float *y, float a, int64_t n);                /* y *= a */
    float (*sumsq)(const float *x, int64_t n);
    /* attention over a chunk of keys for nq queries at once, each (query,
     * key) pair's arithmetic the same whatever else is in the call:
     * out[j*ld + t] = q[j] . rows[t] * scale; x[t] = e^(x[t] - mx) (x[t] <=
     * mx; to ~2 ulp of expf, see kern_exp) and their sum; y[j] += a[j*ld + t]
     * * rows[t] for t in order (as n axpy calls) */
    void (*scores)(const float *const *q, int32_t nq, const float *const *rows, int32_t n, int64_t hd, float scale,
                   float *out, int32_t ld);
    float (*exp_sum)(float *x, int32_t n, float mx);
    void (*axpy_rows)(float *const *y, int32_t nq, const float *a, int32_t ld, const float *const *rows, int32_t n,
                      int64_t hd);
    /* the same over a bf16 KV cache, a row's values widened to fp32 exactly */
    void (*scores_bf16)(const float *const *q, int32_t nq, const uint16_t *const *rows, int32_t n, int64_t hd,
                        float scale, float *out, int32_t ld);
    void (*axpy_rows_bf16)(float *const *y, int32_t nq, const float *a, int32_t ld, const uint16_t *const *rows,
                           int32_t n, int64_t hd);
};

/* e^x for x <= 0, the one formula every table uses (vector lanes and scalar
 * tails alike, so that a value does not depend on where it stands): round
 * x log2 e to k, r = x - k ln2 in two steps (Cody-Waite), a degree-7 Taylor
 * polynomial in r (|r| <= ln2/2), times 2^k; x under -87.3 is taken as -87.3
 * (a result near 1e-38 instead of 0). */
#define KERN_EXP_LO (-87.3f)
#define KERN_LOG2E 1.44269504088896341f
#define KERN_LN2_HI 0.693145751953125f
#define KERN_LN2_LO 1.428606765330187e-06f
float kern_exp(float x);

extern const struct kern kern_ref;
extern const struct kern kern_avx2;
extern const struct kern kern_avx512;

/* Whether this CPU can run the table. */
int kern_supported(const struct kern *k);
/* The widest supported table; KAPITSA_KERN=ref|avx2|avx512 overrides. */
const struct kern *kern_best(void);

#endif
