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
/* matmul_q8's token tile: unpacking a K-quant block's codes costs about as
 * much as its dot products with four tokens, so a prefill amortises it over
 * more of them (the accumulators still fit the 32 vector registers) */
#define KERN_Q8_MAX_NX 8
typedef void (*kern_matmul_fn)(const float *x, int64_t x_stride, int32_t n_x, const void *w, int64_t w_stride,
                               int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1);

typedef void (*kern_matmul_bf16_bf16_fn)(const uint16_t *x, int64_t x_stride, int32_t n_x, const void *w,
                                         int64_t w_stride, int64_t k, float *out, int64_t out_stride, int64_t j0,
                                         int64_t j1);

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
    /* The fast products over block-type weights (NULL where the table has
     * none): q8_quant rounds one activation row of k fp32 values to int8
     * blocks for weights of type t (the layout below, kern_q8_row_bytes(t, k)
     * bytes); matmul_q8 multiplies n_x <= KERN_Q8_MAX_NX such rows
     * (xq_stride bytes apart) by the weights' integer codes exactly in int32
     * and applies the weights' and activations' scales in fp32, per lane as
     * below, so that every table gives the same bits; out and the other
     * arguments as matmul_q. Returns 0, doing nothing, for a type the table
     * has no such kernel for. */
    void (*q8_quant)(enum dtype t, const float *x, int64_t k, void *xq);
    int (*matmul_q8)(enum dtype t, const void *xq, int64_t xq_stride, int32_t n_x, const void *w, int64_t w_stride,
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
    /* The fast products over BF16 weights (NULL where the table has none):
     * bf16_round rounds k fp32 activations to bf16 (kern_bf16_round each);
     * matmul_bf16_bf16 multiplies n_x such rows (x_stride elements apart) by
     * the weights as kern_bf16_dot sums them; the other arguments as
     * matmul_bf16's. */
    void (*bf16_round)(const float *x, int64_t k, uint16_t *xb);
    kern_matmul_bf16_bf16_fn matmul_bf16_bf16;
};

/* Activation rows for matmul_q8. A block's values x become q = round(x *
 * 127 / amax) (ties to even; all zero when amax is 0) with d = amax / 127,
 * amax the block's largest |x|. Weights in blocks of 32 (Q8_0, Q4_0, Q5_0,
 * IQ4_NL): activation blocks of 32, in pairs (one 64-byte vector of codes):
 * corr[l] = -128 * (q[4l] + .. + q[4l + 3]) (Q8_0's and IQ4_NL's codes are
 * offset by 128 into unsigned bytes; Q4_0's by 8 and Q5_0's by 16 take
 * corr / 16 and corr / 8) and each lane's block scale. K-quants and IQ4_XS:
 * blocks of 256 with the sums of each 16 values (natural order); the codes
 * in the order the weights' 64-byte vectors hold their elements
 * (kern_q8_elem). The kernels accumulate 16 fp32 lanes, lane
 * l of a 64-code vector taking codes 4l..4l+3, and sum them as kern_q8_hsum. */
struct kern_q8_pair {
    int8_t q[64];
    int32_t corr[16];
    float d[16]; /* lanes 0-7 the first block's d, 8-15 the second's */
};
struct kern_q8_super {
    int8_t q[256];
    float d;
    int16_t sum[16];
    uint8_t pad[28];
};
_Static_assert(sizeof(struct kern_q8_pair) == 192 && sizeof(struct kern_q8_super) == 320, "q8 layouts");

/* Whether weights of type t take activations in kern_q8_pair blocks (the
 * types with blocks of 32) rather than kern_q8_super ones. */
static inline int kern_q8_paired(enum dtype t)
{
    return t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q5_0 || t == DT_IQ4_NL;
}
/* Bytes of one row of k activations for weights of type t, or 0 where no
 * matmul_q8 kernel takes that type and width. */
int64_t kern_q8_row_bytes(enum dtype t, int64_t k);
/* The element of a 256-block that code p stands for: Q4_K and Q5_K hold
 * each 64 elements' low nibbles (elements 64c..64c+31) and high nibbles in
 * one 32-byte run, so a 64-byte vector is runs of 32 elements in the order
 * 0, 2, 1, 3 (then 4, 6, 5, 7); the other types' are in order. */
static inline int kern_q8_elem(enum dtype t, int p)
{
    static const int8_t run[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    return t == DT_Q4_K || t == DT_Q5_K ? 32 * run[p / 32] + p % 32 : p;
}
/* The sum of 16 lanes in the kernels' order: halves, quarters, pairs. */
static inline float kern_q8_hsum(const float *a)
{
    float b[8], c[4], e[2];
    for (int i = 0; i < 8; i++)
        b[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++)
        c[i] = b[i] + b[i + 4];
    for (int i = 0; i < 2; i++)
        e[i] = c[i] + c[i + 2];
    return e[0] + e[1];
}
/* kern_vnni.c: the avx512 table's q8_quant and matmul_q8, with AVX512-VNNI's
 * dot products of unsigned by signed bytes. */
void kern_vnni_q8_quant(enum dtype t, const float *x, int64_t k, void *xq);
int kern_vnni_matmul_q8(enum dtype t, const void *xq, int64_t xq_stride, int32_t n_x, const void *w, int64_t w_stride,
                        int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1);
/* Whether the table's matmul_q8 runs on this CPU (the avx512 one needs VNNI). */
int kern_q8_supported(const struct kern *k);

/* The bf16 path's arithmetic, what VCVTNEPS2BF16 and VDPBF16PS do (Intel's
 * SDM), which every table's bf16_round and matmul_bf16_bf16 give bit for
 * bit. An activation is rounded to bf16 to nearest even (a NaN stays a
 * quiet NaN; an fp32 denormal becomes a zero of its sign). A row's product
 * x . w over k elements is 16 fp32 lanes from zero, each 32-element chunk c
 * adding to lane l the pair c + 2l + 1, then c + 2l (elements past k are
 * zeros), each as one fused multiply-add rounded to nearest even, with a
 * denormal operand read as zero and a denormal result flushed to zero; the
 * lanes then summed as kern_q8_hsum. Against the exact product this errs
 * by at most 2^-8 of sum |x w| from the activations' rounding (the weights
 * are bf16 already), plus fp32's sums. kern_ref.c has it step by step. */
uint16_t kern_bf16_round(float f);
float kern_bf16_dot(const uint16_t *x, const uint16_t *w, int64_t k);
/* Bytes of one activation row of k rounded for matmul_bf16_bf16: k bf16
 * values, the rows padded to 64 bytes apart. */
static inline int64_t kern_bf16_row_bytes(int64_t k) { return (k + 31) / 32 * 64; }
/* kern_bf16.c: the avx512 table's bf16 path, with AVX512-BF16. */
void kern_avx512_bf16_round(const float *x, int64_t k, uint16_t *xb);
void kern_avx512_matmul_bf16_bf16(const uint16_t *x, int64_t x_stride, int32_t n_x, const void *w, int64_t w_stride,
                                  int64_t k, float *out, int64_t out_stride, int64_t j0, int64_t j1);
/* Whether the table's bf16 path runs on this CPU (the avx512 one needs AVX512-BF16). */
int kern_bf16_supported(const struct kern *k);

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
