/* matmul_blas: the products of more than CUDA_SMALL_N tokens (prefill) on
 * cuBLAS, and the bf16 roundings of activations they and the grouped MoE
 * products take (see matmul.cu's opening comment for the numerics); matmul.cu
 * holds the small-batch kernels and picks between them. */
#include "cuda_impl.h"

#include <stdio.h>

/* v[0..8) -> hi[0..8) as bf16 (one 16-byte store) and, lo given, the
 * rounding left over, element by element as the cpu rounds */
static __device__ __forceinline__ void split8(const float *v, __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    uint4 h, l;
    split_bf16x2(v[0], v[1], &h.x, &l.x);
    split_bf16x2(v[2], v[3], &h.y, &l.y);
    split_bf16x2(v[4], v[5], &h.z, &l.z);
    split_bf16x2(v[6], v[7], &h.w, &l.w);
    *(uint4 *)hi = h;
    if (lo)
        *(uint4 *)lo = l;
}

/* p[0..8) into v (p 16-byte aligned) */
static __device__ __forceinline__ void load8(float *v, const float *p)
{
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* Row rows[i] of x (rows NULL: row i) with SwiGLU (up's row i), relu^2 or
 * nothing applied -> hi [n][K] as bf16 and, lo given, the rounding left
 * over; 8 elements a thread (cuda_rows_vec8, up's rows too). */
__global__ void k_split_bf16(const float *__restrict__ x, int64_t xs, const int32_t *rows, enum mm_pre pre,
                             const float *__restrict__ up, int64_t us, int32_t n, int32_t K, __nv_bfloat16 *hi,
                             __nv_bfloat16 *lo)
{
    const int64_t e = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (e >= (int64_t)n * K)
        return;
    const int64_t r = e / K, c = e % K;
    float v[8];
    load8(v, x + (rows ? rows[r] : r) * xs + c);
    if (pre == MM_PRE_SWIGLU) {
        float u[8];
        load8(u, up + r * us + c);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = v[k] / (1.0f + expf(-v[k])) * u[k];
    } else if (pre == MM_PRE_RELU2) {
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = v[k] > 0.0f ? v[k] * v[k] : 0.0f;
    }
    split8(v, hi + e, lo ? lo + e : NULL);
}

static void split_launch(struct cuda_backend *c, const float *x, int64_t xs, const int32_t *rows, enum mm_pre pre,
                         const float *up, int64_t us, int64_t n, int32_t K, __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    k_split_bf16<<<cdiv(n * K / 8, 256), 256, 0, c->stream>>>(x, xs, rows, pre, up, us, (int32_t)n, K, hi, lo);
    CUDA_LAUNCHED(c);
}

/* Row t of x as bf16 into rows tpos[t k + j], j < k, of out [][K]: a block
 * a token, 8 elements a thread, the row read once for its k copies */
__global__ void k_scatter_bf16(const float *__restrict__ x, int64_t xs, const int32_t *__restrict__ tpos, int32_t k,
                               int32_t K, __nv_bfloat16 *out)
{
    const int64_t t = blockIdx.x;
    for (int32_t c = threadIdx.x * 8; c < K; c += blockDim.x * 8) {
        float v[8];
        load8(v, x + t * xs + c);
        uint4 h;
        split8(v, (__nv_bfloat16 *)&h, NULL);
        for (int32_t j = 0; j < k; j++)
            *(uint4 *)(out + (int64_t)tpos[t * k + j] * K + c) = h;
    }
}

void cuda_scatter_bf16(struct cuda_backend *c, const float *x, int64_t xs, const int32_t *tpos, int64_t n, int32_t k,
                       int64_t K, __nv_bfloat16 *out)
{
    assert(cuda_rows_vec8(x, xs, K));
    if (cuda_op_skip(c) || n == 0)
        return;
    k_scatter_bf16<<<(unsigned)n, 256, 0, c->stream>>>(x, xs, tpos, k, (int32_t)K, out);
    CUDA_LAUNCHED(c);
}

void cuda_gather_bf16(struct cuda_backend *c, const float *x, int64_t xs, const int32_t *rows, int64_t n, int64_t K,
                      __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    assert(cuda_rows_vec8(x, xs, K));
    if (!cuda_op_skip(c) && n > 0)
        split_launch(c, x, xs, rows, MM_PRE_NONE, NULL, 0, n, (int32_t)K, hi, lo);
}

/* a cuBLAS product's status: 0, or -1 with the failure recorded (the
 * first one's message kept) */
int cuda_blas_status(struct cuda_backend *c, cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    if (!c->failed) {
        c->failed = true;
        err_set("cuda: %s failed (status %d)", what, (int)st);
    }
    return -1;
}

static int gemm_status(struct cuda_backend *c, cublasStatus_t st, const char *fn, int32_t count, int64_t n, int64_t K,
                       int64_t M)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    char what[160], times[24] = "";
    if (count > 1)
        snprintf(times, sizeof times, "%d x ", (int)count);
    snprintf(what, sizeof what, "%s %s[%lld x %lld] x [%lld x %lld]^T", fn, times, (long long)n, (long long)K,
             (long long)M, (long long)K);
    return cuda_blas_status(c, st, what);
}

int cuda_gemm_packed(struct cuda_backend *c, int32_t m, int32_t n, int32_t k, float alpha, const void *l, bool l_t,
                     int64_t sl, const void *r, bool r_t, int64_t sr, float beta, float *out, int64_t so,
                     int32_t count, bool bf16, const char *what)
{
    if (cuda_op_skip(c) || count == 0)
        return c->failed ? -1 : 0;
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    /* fp32 operands outside precise mode on TF32 tensor cores (the delta
     * rule's prompt products: 9e-4 of the largest output at 4500 rows,
     * against 2e-6 on the CUDA cores; qwen3.5-9b's prefill 8-10% faster on
     * an H200), as the bf16 operands of fast mode's other products */
    const cublasComputeType_t ct = !bf16 && !c->precise ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    /* cuBLAS is column-major: out^T = r^T . l^T */
    return cuda_blas_status(c,
                            cublasGemmStridedBatchedEx(c->blas, r_t ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                       l_t ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, r, t,
                                                       r_t ? k : n, sr, l, t, l_t ? m : k, sl, &beta, out, CUDA_R_32F,
                                                       n, so, count, ct, CUBLAS_GEMM_DEFAULT),
                            what);
}

int cuda_gemm_bf16(struct cuda_backend *c, float *out, int64_t os, const __nv_bfloat16 *x, int64_t n, int64_t K,
                   const void *w, int64_t ws, int64_t M, float beta)
{
    if (cuda_op_skip(c) || n == 0)
        return c->failed ? -1 : 0;
    const float one = 1.0f;
    const cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)n, (int)K, &one, w,
                                           CUDA_R_16BF, (int)ws, x, CUDA_R_16BF, (int)K, &beta, out, CUDA_R_32F,
                                           (int)os, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return gemm_status(c, st, "cublasGemmEx", 1, n, K, M);
}

int cuda_gemm_bf16_batched(struct cuda_backend *c, float *const *out, int64_t os, const __nv_bfloat16 *const *x,
                           int64_t n, int64_t K, const void *const *w, int64_t ws, int64_t M, float beta,
                           int32_t count)
{
    if (cuda_op_skip(c) || n == 0 || count == 0)
        return c->failed ? -1 : 0;
    const float one = 1.0f;
    const cublasStatus_t st = cublasGemmBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)n, (int)K, &one, w,
                                                  CUDA_R_16BF, (int)ws, (const void *const *)x, CUDA_R_16BF, (int)K,
                                                  &beta, (void *const *)out, CUDA_R_32F, (int)os, (int)count,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return gemm_status(c, st, "cublasGemmBatchedEx", count, n, K, M);
}

/* One row per block, 8 elements a thread (cuda_rows_vec8): x's RMSNorm as the
 * plain op computes it, rounded as k_split_bf16 rounds. */
__global__ void k_norm_split(const float *__restrict__ x, int64_t xs, const void *norm, enum dtype norm_t, float eps,
                             int32_t K, __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    __shared__ float part[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * xs;
    float ss = 0.0f, v[8];
    for (int32_t c = 8 * threadIdx.x; c < K; c += 8 * blockDim.x) {
        load8(v, xr + c);
#pragma unroll
        for (int k = 0; k < 8; k++)
            ss += v[k] * v[k];
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, part) / (float)K + eps);
    for (int32_t c = 8 * threadIdx.x; c < K; c += 8 * blockDim.x) {
        load8(v, xr + c);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = dev_weight(norm, norm_t, c + k) * (v[k] * inv);
        split8(v, hi + r * K + c, lo ? lo + r * K + c : NULL);
    }
}

void cuda_pre_split(struct cuda_backend *c, const float *x, int64_t xs, int64_t n, int32_t K, const struct mm_fused *f,
                    __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    const bool swiglu = f->pre == MM_PRE_SWIGLU;
    assert(cuda_rows_vec8(x, xs, K) && (!swiglu || cuda_rows_vec8((const float *)f->up->data, f->up->row_stride, K)));
    if (cuda_op_skip(c) || n == 0)
        return;
    if (f->pre != MM_PRE_RMSNORM) {
        split_launch(c, x, xs, NULL, f->pre, swiglu ? (const float *)f->up->data : NULL,
                     swiglu ? f->up->row_stride : 0, n, K, hi, lo);
        return;
    }
    const int32_t threads = (int32_t)(cdiv(K / 8, 32) * 32);
    k_norm_split<<<(unsigned)n, threads < 512 ? threads : 512, 0, c->stream>>>(x, xs, f->norm->data, f->norm->type,
                                                                                f->eps, K, hi, lo);
    CUDA_LAUNCHED(c);
}

/* Prefill products on cuBLAS: the input's pre applied and rounded to bf16
 * once (hi, and lo when precise: a second product adds it), then one GEMM
 * per weight, adding into out when accumulating. */
void cuda_mm_prefill(struct cuda_backend *c, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                       const struct tensor *x, const struct mm_fused *f)
{
    const int64_t n = x->n_rows, K = x->n_cols;
    const size_t half = (size_t)(n * K);
    __nv_bfloat16 *hi = (__nv_bfloat16 *)cuda_scratch(c, SCR_BLAS, half * 2 * (c->precise ? 2 : 1));
    if (!hi)
        return;
    __nv_bfloat16 *lo = c->precise ? hi + half : NULL;
    cuda_pre_split(c, (const float *)x->data, x->row_stride, n, (int32_t)K, f, hi, lo);
    for (int32_t i = 0; i < n_w; i++) {
        float *o = (float *)out[i]->data;
        const int64_t os = out[i]->row_stride, M = w[i]->n_rows;
        if (cuda_gemm_bf16(c, o, os, hi, n, K, w[i]->data, w[i]->row_stride, M, f->accumulate ? 1.0f : 0.0f) != 0)
            return;
        if (lo && cuda_gemm_bf16(c, o, os, lo, n, K, w[i]->data, w[i]->row_stride, M, 1.0f) != 0)
            return;
    }
}
