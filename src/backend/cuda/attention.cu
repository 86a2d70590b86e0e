/* attention: softmax(q k^T * scale) v over each token's visible cache rows
 * (paged: row of position p = block_table[p / bs] * bs + p % bs).
 *
 * Keys are walked in the order of their visible index v (0..n_vis): the
 * committed positions, then the positions the mask leaves visible, in order.
 * A tree node's visible keys are thus in the same order, in the same tiles, as
 * the keys of the same token decoded alone, so its output is bitwise the same:
 * speculative verification reproduces plain decoding.
 *
 * One block per (token, kv head, split of ATT_SPLIT visible keys, group of query
 * heads): each of its 4 warps takes 64 keys in two tiles of 32, one key per lane,
 * with a running max per query head (flash-attention style); the block merges
 * its warps in order and writes the split's (max, sum, acc); k_att_merge then
 * merges the splits in order. Up to CUDA_SMALL_N tokens the splits make long
 * contexts parallel; a larger batch (prefill) runs one split per block over all
 * of its keys and normalises in place. */
#include "cuda_impl.h"

#include <math.h>

#define ATT_WARPS 4
#define ATT_SPLIT (ATT_WARPS * 64)
#define ATT_MAX_HD 256
#define ATT_MAX_ACC 64 /* floats of accumulator per lane: heads per block x head_dim/32 */

struct att_args {
    const float *q;
    int64_t qs;
    const float *kc, *vc;
    int64_t ks;
    float *out;
    int64_t os;
    float *part; /* [n][n_head][n_split][hd+2]: acc, max, sum */
    int32_t n_head, n_kv_head, hd, gc, n_split, split_len;
    bool vec4; /* rows and heads 16-byte aligned */
    float scale;
    struct dev_batch b;
    int32_t block_size, max_blocks;
};

static __device__ __forceinline__ int32_t att_row(const struct att_args *a, int32_t i, int32_t v)
{
    const int32_t mf = a->b.mask_from[i];
    const int32_t p = v < mf || !a->b.vis_stride ? v : a->b.vis[(int64_t)i * a->b.vis_stride + v - mf];
    const int32_t *table = a->b.block_table + (int64_t)a->b.seq_row[i] * a->max_blocks;
    return table[p / a->block_size] * a->block_size + p % a->block_size;
}

/* grid: x = token * n_kv_head + kv head, y = split, z = group of gc query heads */
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(struct att_args a)
{
    __shared__ float qs[8][ATT_MAX_HD];
    __shared__ float wm[ATT_WARPS][8], wl[ATT_WARPS][8];
    __shared__ float wacc[ATT_WARPS][8][ATT_MAX_HD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t i = blockIdx.x / a.n_kv_head, kvh = blockIdx.x % a.n_kv_head;
    const int32_t G = a.n_head / a.n_kv_head, h0 = kvh * G + blockIdx.z * a.gc;
    const int32_t gc = min(a.gc, G - (int32_t)blockIdx.z * a.gc), hd = a.hd, nd = (hd + 31) / 32;
    const int32_t n_vis = a.b.n_vis[i];
    const bool direct = a.part == NULL;
    const int32_t v_beg = direct ? 0 : blockIdx.y * a.split_len;
    const int32_t v_end = direct ? n_vis : min(n_vis, v_beg + a.split_len);
    if (v_beg >= v_end)
        return;
    for (int e = threadIdx.x; e < gc * hd; e += blockDim.x)
        qs[e / hd][e % hd] = a.q[(int64_t)i * a.qs + (int64_t)(h0 + e / hd) * hd + e % hd];
    __syncthreads();
    float m[8], l[8], acc[ATT_MAX_ACC];
#pragma unroll
    for (int h = 0; h < 8; h++)
        m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < ATT_MAX_ACC; e++)
        acc[e] = 0.0f;
    const int64_t koff = (int64_t)kvh * hd;
    /* warp w: tiles of 32 keys at v_beg + 32*(2w), 32*(2w+1), then every 32*2*ATT_WARPS */
    for (int32_t t0 = v_beg + warp * 64; t0 < v_end; t0 += ATT_SPLIT) {
        for (int32_t tile = t0; tile < t0 + 64 && tile < v_end; tile += 32) {
            const int32_t v = tile + lane;
            const bool ok = v < v_end;
            const int32_t row = ok ? att_row(&a, i, v) : 0;
            float s[8];
#pragma unroll
            for (int h = 0; h < 8; h++)
                s[h] = 0.0f;
            if (ok && a.vec4) {
                const float4 *kr = (const float4 *)(a.kc + (int64_t)row * a.ks + koff);
                for (int d4 = 0; d4 < hd / 4; d4++) {
                    const float4 kv = kr[d4];
#pragma unroll
                    for (int h = 0; h < 8; h++)
                        if (h < gc)
                            s[h] += qs[h][4 * d4] * kv.x + qs[h][4 * d4 + 1] * kv.y + qs[h][4 * d4 + 2] * kv.z +
                                    qs[h][4 * d4 + 3] * kv.w;
                }
            } else if (ok) {
                const float *kr = a.kc + (int64_t)row * a.ks + koff;
                for (int d = 0; d < hd; d++) {
                    const float kv = kr[d];
#pragma unroll
                    for (int h = 0; h < 8; h++)
                        if (h < gc)
                            s[h] += qs[h][d] * kv;
                }
            }
#pragma unroll
            for (int h = 0; h < 8; h++) {
                if (h >= gc)
                    break;
                const float sc = ok ? s[h] * a.scale : -INFINITY;
                const float mx = fmaxf(m[h], warp_max(sc));
                const float corr = expf(m[h] - mx);
                const float p = ok ? expf(sc - mx) : 0.0f;
                l[h] = l[h] * corr + warp_sum(p);
                m[h] = mx;
                for (int dd = 0; dd < nd; dd++)
                    acc[h * nd + dd] *= corr;
                const int n_keys = min(32, v_end - tile);
                for (int j = 0; j < n_keys; j++) {
                    const float pj = __shfl_sync(0xffffffffu, p, j);
                    const int32_t rj = __shfl_sync(0xffffffffu, row, j);
                    const float *vr = a.vc + (int64_t)rj * a.ks + koff;
                    for (int dd = 0; dd < nd; dd++)
                        if (lane + 32 * dd < hd)
                            acc[h * nd + dd] += pj * vr[lane + 32 * dd];
                }
            }
        }
    }
    /* merge the warps in order */
    if (lane == 0)
        for (int h = 0; h < gc; h++)
            wm[warp][h] = m[h], wl[warp][h] = l[h];
    for (int h = 0; h < gc; h++)
        for (int dd = 0; dd < nd; dd++)
            if (lane + 32 * dd < hd)
                wacc[warp][h][lane + 32 * dd] = acc[h * nd + dd];
    __syncthreads();
    for (int e = threadIdx.x; e < gc * hd; e += blockDim.x) {
        const int h = e / hd, d = e % hd;
        float mx = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++)
            mx = fmaxf(mx, wm[w][h]);
        float sum = 0.0f, o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            const float f = wm[w][h] == -INFINITY ? 0.0f : expf(wm[w][h] - mx);
            sum += wl[w][h] * f;
            o += wacc[w][h][d] * f;
        }
        if (direct) {
            a.out[(int64_t)i * a.os + (int64_t)(h0 + h) * hd + d] = sum > 0.0f ? o / sum : 0.0f;
        } else {
            float *p = a.part + (((int64_t)i * a.n_head + h0 + h) * a.n_split + blockIdx.y) * (hd + 2);
            p[d] = o;
            if (d == 0)
                p[hd] = mx, p[hd + 1] = sum;
        }
    }
}

/* grid: token * n_head + head; block: head_dim threads */
__global__ void k_att_merge(struct att_args a)
{
    const int32_t i = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, hd = a.hd, d = threadIdx.x;
    const int32_t n_used = (a.b.n_vis[i] + a.split_len - 1) / a.split_len;
    const float *p = a.part + ((int64_t)i * a.n_head + h) * a.n_split * (hd + 2);
    float mx = -INFINITY;
    for (int32_t s = 0; s < n_used; s++)
        mx = fmaxf(mx, p[s * (hd + 2) + hd]);
    float sum = 0.0f, o = 0.0f;
    for (int32_t s = 0; s < n_used; s++) {
        const float *ps = p + s * (hd + 2);
        const float f = ps[hd] == -INFINITY ? 0.0f : expf(ps[hd] - mx);
        sum += ps[hd + 1] * f;
        o += ps[d] * f;
    }
    a.out[(int64_t)i * a.os + (int64_t)h * hd + d] = sum > 0.0f ? o / sum : 0.0f;
}

void cuda_attention(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *kc,
                    const struct tensor *vc, int32_t n_head, int32_t n_kv_head, int32_t head_dim, float scale)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = c->b.n_tokens, G = n_head / n_kv_head;
    assert(head_dim <= ATT_MAX_HD && kc->row_stride == vc->row_stride);
    if (c->failed || n == 0)
        return;
    struct att_args a;
    a.q = (const float *)q->data;
    a.qs = q->row_stride;
    a.kc = (const float *)kc->data;
    a.vc = (const float *)vc->data;
    a.ks = kc->row_stride;
    a.out = (float *)out->data;
    a.os = out->row_stride;
    a.n_head = n_head;
    a.n_kv_head = n_kv_head;
    a.hd = head_dim;
    a.scale = scale;
    a.vec4 = head_dim % 4 == 0 && kc->row_stride % 4 == 0 && ((uintptr_t)kc->data & 15) == 0;
    a.b = c->d;
    a.block_size = c->b.block_size;
    a.max_blocks = c->b.max_blocks;
    int32_t gc = ATT_MAX_ACC / ((head_dim + 31) / 32);
    gc = gc > 8 ? 8 : gc;
    const int32_t n_gz = (G + gc - 1) / gc;
    gc = (G + n_gz - 1) / n_gz; /* even groups */
    a.gc = gc;
    /* splits of a length set by the cache's size, never by the batch */
    a.split_len = ATT_SPLIT;
    while ((int64_t)a.split_len * 128 < kc->n_rows)
        a.split_len *= 2;
    a.n_split = 1;
    a.part = NULL;
    if (n <= CUDA_SMALL_N) {
        a.n_split = (c->max_vis + a.split_len - 1) / a.split_len;
        if (a.n_split < 1)
            a.n_split = 1;
        a.part = (float *)cuda_scratch(c, SCR_ATTN,
                                       (size_t)n * n_head * a.n_split * (head_dim + 2) * sizeof(float));
        if (!a.part)
            return;
    }
    k_attention<<<dim3((unsigned)(n * n_kv_head), (unsigned)a.n_split, (unsigned)n_gz), ATT_WARPS * 32, 0,
                  c->stream>>>(a);
    if (CUDA_LAUNCHED(c) != 0 || !a.part)
        return;
    k_att_merge<<<(unsigned)(n * n_head), (unsigned)head_dim, 0, c->stream>>>(a);
    CUDA_LAUNCHED(c);
}
