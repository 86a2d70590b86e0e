/* topk: the k largest logits of each row, on the device, so that greedy
 * decoding and draft trees copy k numbers per row to the host instead of the
 * vocabulary (151,936 floats for Qwen). Same order as backend_top_k_row:
 * larger value first, the lower column first among equal values.
 *
 * A block takes a chunk of a row (up to TK_SPLIT chunks, so that a long row
 * is read by many multiprocessors): each thread keeps a sorted list of the K
 * best of the columns it scans (in increasing order, so an equal value never
 * displaces an earlier one), each warp merges its lanes' lists in K rounds
 * of a shuffle reduction, and the first warp merges the warps' lists; a
 * second kernel merges the chunks' lists the same way. */
#include "cuda_impl.h"

#include <limits.h>

#define TK_THREADS 512
#define TK_SPLIT 32   /* chunks of a row at most (a lane each in the merge) */
#define TK_CHUNK 4096 /* columns a chunk takes at least */

/* (a, ai) comes before (b, bi): a strict total order on (value, column) */
static __device__ __forceinline__ bool tk_before(float a, int32_t ai, float b, int32_t bi)
{
    return a > b || (a == b && ai < bi);
}

/* the list v/id (sorted, K long) with (y, c) inserted, the last dropped */
template <int K> static __device__ __forceinline__ void tk_insert(float *v, int32_t *id, float y, int32_t c)
{
#pragma unroll
    for (int j = 0; j < K; j++)
        if (tk_before(y, c, v[j], id[j])) {
            const float tv = v[j];
            const int32_t ti = id[j];
            v[j] = y;
            id[j] = c;
            y = tv;
            c = ti;
        }
}

/* K rounds: the warp's best head, popped from the lane that holds it; lane 0
 * gets the merged list in ov/oi */
template <int K> static __device__ __forceinline__ void tk_warp_merge(float *v, int32_t *id, float *ov, int32_t *oi)
{
    const int lane = threadIdx.x & 31;
#pragma unroll 1
    for (int r = 0; r < K; r++) {
        float bv = v[0];
        int32_t bi = id[0];
        for (int o = 16; o > 0; o >>= 1) {
            const float xv = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t xi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (tk_before(xv, xi, bv, bi)) {
                bv = xv;
                bi = xi;
            }
        }
        if (lane == 0) {
            ov[r] = bv;
            oi[r] = bi;
        }
        if (id[0] == bi) {
#pragma unroll
            for (int j = 0; j + 1 < K; j++) {
                v[j] = v[j + 1];
                id[j] = id[j + 1];
            }
            v[K - 1] = -INFINITY;
            id[K - 1] = INT_MAX;
        }
    }
}

/* One warp: the n_lists sorted lists lv/li (each K long, K apart) merged,
 * the best k written by lane 0 to ids/vals. */
template <int K>
static __device__ __forceinline__ void tk_merge_lists(const float *lv, const int32_t *li, int n_lists, int32_t k,
                                                      int32_t *ids, float *vals)
{
    const int lane = threadIdx.x & 31;
    float v[K];
    int32_t id[K];
#pragma unroll
    for (int j = 0; j < K; j++) {
        v[j] = lane < n_lists ? lv[lane * K + j] : -INFINITY;
        id[j] = lane < n_lists ? li[lane * K + j] : INT_MAX;
    }
    float ov[K];
    int32_t oi[K];
    tk_warp_merge<K>(v, id, ov, oi);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < K; j++)
            if (j < k) {
                ids[j] = oi[j];
                vals[j] = ov[j];
            }
}

/* grid: x = row, y = chunk of `chunk` columns; the block's best k (of K) to
 * ids/vals [row][chunk][k] */
template <int K>
__global__ void __launch_bounds__(TK_THREADS) k_top_k(const float *x, int64_t xs, int64_t n_cols, int64_t chunk,
                                                      int32_t k, int32_t *ids, float *vals)
{
    __shared__ float wv[TK_THREADS / 32][K];
    __shared__ int32_t wi[TK_THREADS / 32][K];
    const int warp = threadIdx.x >> 5;
    const float *row = x + (int64_t)blockIdx.x * xs;
    const int64_t c_end = min(n_cols, ((int64_t)blockIdx.y + 1) * chunk);
    float v[K];
    int32_t id[K];
#pragma unroll
    for (int j = 0; j < K; j++) {
        v[j] = -INFINITY;
        id[j] = INT_MAX;
    }
    for (int64_t c = (int64_t)blockIdx.y * chunk + threadIdx.x; c < c_end; c += TK_THREADS) {
        const float y = row[c];
        if (tk_before(y, (int32_t)c, v[K - 1], id[K - 1]))
            tk_insert<K>(v, id, y, (int32_t)c);
    }
    tk_warp_merge<K>(v, id, wv[warp], wi[warp]);
    __syncthreads();
    if (warp != 0)
        return;
    const int64_t o = ((int64_t)blockIdx.x * gridDim.y + blockIdx.y) * k;
    tk_merge_lists<K>(&wv[0][0], &wi[0][0], TK_THREADS / 32, k, ids + o, vals + o);
}

/* grid: row; one warp: the n_chunk lists [row][n_chunk][K] merged, the best k out */
template <int K>
__global__ void k_top_k_merge(const int32_t *pids, const float *pvals, int32_t n_chunk, int32_t k, int32_t *ids,
                              float *vals)
{
    const int64_t p = (int64_t)blockIdx.x * n_chunk * K;
    tk_merge_lists<K>(pvals + p, pids + p, n_chunk, k, ids + (int64_t)blockIdx.x * k, vals + (int64_t)blockIdx.x * k);
}

template <int K>
static void top_k_launch(struct cuda_backend *c, const struct tensor *t, int32_t k, int32_t *d_ids, float *d_vals,
                         int32_t *d_pids, float *d_pvals, int32_t n_chunk, int64_t chunk)
{
    const unsigned n = (unsigned)t->n_rows;
    if (n_chunk == 1) {
        k_top_k<K><<<dim3(n, 1), TK_THREADS, 0, c->stream>>>((const float *)t->data, t->row_stride, t->n_cols, chunk,
                                                            k, d_ids, d_vals);
        CUDA_LAUNCHED(c);
        return;
    }
    k_top_k<K><<<dim3(n, (unsigned)n_chunk), TK_THREADS, 0, c->stream>>>((const float *)t->data, t->row_stride,
                                                                        t->n_cols, chunk, K, d_pids, d_pvals);
    if (CUDA_LAUNCHED(c) != 0)
        return;
    k_top_k_merge<K><<<n, 32, 0, c->stream>>>(d_pids, d_pvals, n_chunk, k, d_ids, d_vals);
    CUDA_LAUNCHED(c);
}

int cuda_top_k(struct backend *be, const struct tensor *t, int32_t k, int32_t *ids, float *vals)
{
    struct cuda_backend *c = cuda_of(be);
    if (c->in_forward)
        cuda_host_wait(c);
    assert(t->type == DT_F32 && k >= 1 && k <= TOP_K_MAX && t->n_cols >= k);
    const int64_t n = t->n_rows, nk = n * k;
    if (n == 0)
        return c->failed ? -1 : 0;
    int32_t n_chunk = (int32_t)cdiv(t->n_cols, TK_CHUNK);
    n_chunk = n_chunk > TK_SPLIT ? TK_SPLIT : n_chunk;
    const int64_t chunk = cdiv(t->n_cols, n_chunk);
    const int64_t np = n_chunk > 1 ? n * n_chunk * TOP_K_MAX : 0; /* the chunks' lists */
    int32_t *d_ids = (int32_t *)cuda_scratch(c, SCR_TOPK, (size_t)(nk + np) * (sizeof(int32_t) + sizeof(float)));
    float *d_vals = (float *)(d_ids + nk);
    int32_t *d_pids = (int32_t *)(d_vals + nk);
    float *d_pvals = (float *)(d_pids + np);
    if (d_ids && !c->failed) {
        if (k == 1)
            top_k_launch<1>(c, t, k, d_ids, d_vals, d_pids, d_pvals, n_chunk, chunk);
        else if (k <= 16) /* draft trees: the shorter lists cost half the registers */
            top_k_launch<16>(c, t, k, d_ids, d_vals, d_pids, d_pvals, n_chunk, chunk);
        else
            top_k_launch<TOP_K_MAX>(c, t, k, d_ids, d_vals, d_pids, d_pvals, n_chunk, chunk);
        if (!c->failed &&
            CUDA_CHECK(c, cudaMemcpyAsync(ids, d_ids, (size_t)nk * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                          c->stream)) == 0 &&
            (!vals || CUDA_CHECK(c, cudaMemcpyAsync(vals, d_vals, (size_t)nk * sizeof(float),
                                                    cudaMemcpyDeviceToHost, c->stream)) == 0))
            CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    }
    if (c->failed) {
        memset(ids, 0, (size_t)nk * sizeof(int32_t));
        if (vals)
            memset(vals, 0, (size_t)nk * sizeof(float));
    }
    return c->failed ? -1 : 0;
}
