/* attention: softmax(q k^T * scale) v over each token's visible cache rows
 * (paged: row of position p = block_table[p / bs] * bs + p % bs).
 *
 * Keys are walked in the order of their visible index v (0..n_vis): the
 * committed positions, then the positions the mask leaves visible, in order,
 * in tiles of 32 starting at fixed multiples. A tree node's visible keys are
 * thus in the same tiles, in the same order, as the keys of the same token
 * decoded alone, so its output is bitwise the same: speculative verification
 * reproduces plain decoding.
 *
 * A block takes T tokens of one kv head (one warp each, at least 4 warps) and a group of gc of
 * its query heads; per tile it stages the 32 keys' K and V rows in shared
 * memory with coalesced loads, each lane scores one key for the warp's token
 * and heads, and the warp keeps a running max per head (flash-attention
 * style). Up to CUDA_SMALL_N tokens T is 1 and the keys are split into
 * fixed-length ranges across blocks (parallel over long contexts), merged in
 * order by k_att_merge; a prefill batch takes T = 8 consecutive rows of one
 * sequence per block, all keys, sharing each staged tile. */
#include "cuda_impl.h"

#include <math.h>

#define ATT_TILE 32
#define ATT_MAX_HD 256
#define ATT_MAX_G 8  /* query heads per block */
#define ATT_MAX_ND 8 /* head_dim / 32 */
#define ATT_PREFILL_T 8

struct att_args {
    const float *q;
    int64_t qs;
    const float *kc, *vc;
    int64_t ks;
    float *out;
    int64_t os;
    float *part; /* [n][n_head][n_split][hd+2]: acc, max, sum; NULL: write normalised output */
    int32_t n, n_head, n_kv_head, hd, gc, n_split, split_len, T;
    float scale;
    bool vec4; /* rows and heads 16-byte aligned */
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

/* grid: x = token tile * n_kv_head + kv head, y = split, z = group of gc query heads; block: T warps */
__global__ void k_attention(struct att_args a)
{
    extern __shared__ float sm[];
    const int32_t hd = a.hd, pitch = hd + 1, nd = (hd + 31) / 32, T = a.T;
    float *Ks = sm, *Vs = Ks + ATT_TILE * pitch, *qs = Vs + ATT_TILE * hd; /* qs [T][gc][hd] */
    __shared__ int32_t rows[ATT_TILE];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t i0 = (blockIdx.x / a.n_kv_head) * T, kvh = blockIdx.x % a.n_kv_head;
    const int32_t G = a.n_head / a.n_kv_head, h0 = kvh * G + blockIdx.z * a.gc;
    const int32_t gc = min(a.gc, G - (int32_t)blockIdx.z * a.gc);
    const int32_t i = i0 + warp;
    const bool tok_ok = warp < T && i < a.n;
    const int32_t n_vis = tok_ok ? a.b.n_vis[i] : 0;
    /* the block's key range: a split, or everything its tokens see */
    int32_t v_beg = 0, v_end;
    if (a.part) { /* T = 1 */
        v_beg = blockIdx.y * a.split_len;
        v_end = min(a.b.n_vis[i0], v_beg + a.split_len);
    } else {
        v_end = 0;
        for (int32_t t = 0; t < T && i0 + t < a.n; t++)
            v_end = max(v_end, a.b.n_vis[i0 + t]);
    }
    if (v_beg >= v_end)
        return;
    for (int e = threadIdx.x; e < T * gc * hd; e += blockDim.x) {
        const int t = e / (gc * hd), h = e / hd % gc, d = e % hd;
        qs[e] = i0 + t < a.n ? a.q[(int64_t)(i0 + t) * a.qs + (int64_t)(h0 + h) * hd + d] : 0.0f;
    }
    float m[ATT_MAX_G], l[ATT_MAX_G], acc[ATT_MAX_G][ATT_MAX_ND];
#pragma unroll
    for (int h = 0; h < ATT_MAX_G; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < ATT_MAX_ND; dd++)
            acc[h][dd] = 0.0f;
    }
    const int64_t koff = (int64_t)kvh * hd;
    const float *qw = qs + (tok_ok ? warp : 0) * gc * hd;
    for (int32_t tile = v_beg; tile < v_end; tile += ATT_TILE) {
        __syncthreads();
        if (threadIdx.x < ATT_TILE)
            rows[threadIdx.x] = tile + threadIdx.x < v_end ? att_row(&a, i0, tile + threadIdx.x) : -1;
        __syncthreads();
        /* all of a thread's loads first, then the stores: the loads are in flight together */
        if (a.vec4) {
            const int h4 = hd / 4, n4 = ATT_TILE * h4;
            for (int e0 = threadIdx.x; e0 < n4; e0 += 4 * blockDim.x) {
                float4 kv[4], vv[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int e = e0 + u * blockDim.x, key = e / h4, d = (e % h4) * 4;
                    const int r = e < n4 ? rows[key] : -1;
                    kv[u] = vv[u] = make_float4(0, 0, 0, 0);
                    if (r >= 0) {
                        kv[u] = *(const float4 *)(a.kc + (int64_t)r * a.ks + koff + d);
                        vv[u] = *(const float4 *)(a.vc + (int64_t)r * a.ks + koff + d);
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int e = e0 + u * blockDim.x, key = e / h4, d = (e % h4) * 4;
                    if (e >= n4)
                        break;
                    float *kd = Ks + key * pitch + d;
                    kd[0] = kv[u].x, kd[1] = kv[u].y, kd[2] = kv[u].z, kd[3] = kv[u].w;
                    *(float4 *)(Vs + key * hd + d) = vv[u];
                }
            }
        } else {
            for (int e = threadIdx.x; e < ATT_TILE * hd; e += blockDim.x) {
                const int key = e / hd, d = e % hd, r = rows[key];
                Ks[key * pitch + d] = r >= 0 ? a.kc[(int64_t)r * a.ks + koff + d] : 0.0f;
                Vs[key * hd + d] = r >= 0 ? a.vc[(int64_t)r * a.ks + koff + d] : 0.0f;
            }
        }
        __syncthreads();
        if (!tok_ok || tile >= n_vis)
            continue;
        const int n_keys = min(ATT_TILE, n_vis - tile);
        const bool ok = lane < n_keys;
        float s[ATT_MAX_G];
#pragma unroll
        for (int h = 0; h < ATT_MAX_G; h++)
            s[h] = 0.0f;
        const float *kr = Ks + lane * pitch;
        for (int d = 0; d < hd; d++) {
            const float kv = kr[d];
#pragma unroll
            for (int h = 0; h < ATT_MAX_G; h++)
                if (h < gc)
                    s[h] += qw[h * hd + d] * kv;
        }
#pragma unroll
        for (int h = 0; h < ATT_MAX_G; h++) {
            if (h >= gc)
                break;
            const float sc = ok ? s[h] * a.scale : -INFINITY;
            const float mx = fmaxf(m[h], warp_max(sc));
            const float corr = expf(m[h] - mx);
            const float p = ok ? expf(sc - mx) : 0.0f;
            l[h] = l[h] * corr + warp_sum(p);
            m[h] = mx;
#pragma unroll
            for (int dd = 0; dd < ATT_MAX_ND; dd++)
                acc[h][dd] *= corr;
            for (int j = 0; j < n_keys; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int dd = 0; dd < ATT_MAX_ND; dd++)
                    if (dd < nd && lane + 32 * dd < hd)
                        acc[h][dd] += pj * Vs[j * hd + lane + 32 * dd];
            }
        }
    }
    if (!tok_ok)
        return;
#pragma unroll
    for (int h = 0; h < ATT_MAX_G; h++) {
        if (h >= gc)
            break;
        if (a.part) {
            float *p = a.part + (((int64_t)i * a.n_head + h0 + h) * a.n_split + blockIdx.y) * (hd + 2);
#pragma unroll
            for (int dd = 0; dd < ATT_MAX_ND; dd++)
                if (dd < nd && lane + 32 * dd < hd)
                    p[lane + 32 * dd] = acc[h][dd];
            if (lane == 0)
                p[hd] = m[h], p[hd + 1] = l[h];
        } else {
            const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
#pragma unroll
            for (int dd = 0; dd < ATT_MAX_ND; dd++)
                if (dd < nd && lane + 32 * dd < hd)
                    a.out[(int64_t)i * a.os + (int64_t)(h0 + h) * hd + lane + 32 * dd] = acc[h][dd] * inv;
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

/* Whether the batch's rows come in runs of T consecutive rows of one
 * sequence without a mask (prefill chunks), so a block may share key tiles. */
static bool att_tileable(const struct attn_batch *b, int32_t T)
{
    if (b->mask)
        return false;
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (i % T && b->seq_row[i] != b->seq_row[i - i % T])
            return false;
    return true;
}

void cuda_attention(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *kc,
                    const struct tensor *vc, int32_t n_head, int32_t n_kv_head, int32_t head_dim, float scale)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = c->b.n_tokens, G = n_head / n_kv_head;
    assert(head_dim <= ATT_MAX_HD && kc->row_stride == vc->row_stride);
    if (cuda_op_skip(c) || n == 0)
        return;
    struct att_args a;
    a.q = (const float *)q->data;
    a.qs = q->row_stride;
    a.kc = (const float *)kc->data;
    a.vc = (const float *)vc->data;
    a.ks = kc->row_stride;
    a.out = (float *)out->data;
    a.os = out->row_stride;
    a.n = n;
    a.n_head = n_head;
    a.n_kv_head = n_kv_head;
    a.hd = head_dim;
    a.scale = scale;
    a.vec4 = head_dim % 4 == 0 && kc->row_stride % 4 == 0 && ((uintptr_t)kc->data & 15) == 0 &&
             ((uintptr_t)vc->data & 15) == 0;
    a.b = c->d;
    a.block_size = c->b.block_size;
    a.max_blocks = c->b.max_blocks;
    const int32_t nd = (head_dim + 31) / 32;
    int32_t gc = ATT_MAX_G * ATT_MAX_ND / nd;
    gc = gc > ATT_MAX_G ? ATT_MAX_G : gc;
    const int32_t n_gz = (G + gc - 1) / gc;
    a.gc = (G + n_gz - 1) / n_gz; /* even groups */
    /* splits of a length set by the cache's size, never by the batch */
    a.split_len = ATT_TILE;
    while ((int64_t)a.split_len * 256 < kc->n_rows)
        a.split_len *= 2;
    a.n_split = 1;
    a.part = NULL;
    a.T = 1;
    if (n <= CUDA_SMALL_N) {
        a.n_split = (c->max_vis + a.split_len - 1) / a.split_len;
        if (a.n_split < 1)
            a.n_split = 1;
        a.part = (float *)cuda_scratch(c, SCR_ATTN,
                                       (size_t)n * n_head * a.n_split * (head_dim + 2) * sizeof(float));
        if (!a.part)
            return;
    } else if (att_tileable(&c->b, ATT_PREFILL_T)) {
        a.T = ATT_PREFILL_T;
    }
    const size_t smem = ((size_t)ATT_TILE * (head_dim + 1) + (size_t)ATT_TILE * head_dim +
                         (size_t)a.T * a.gc * head_dim) * sizeof(float);
    if (smem > 48 * 1024 &&
        CUDA_CHECK(c, cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != 0)
        return;
    const unsigned n_tiles = cdiv(n, a.T);
    /* at least 4 warps: those without a token help stage the tiles */
    k_attention<<<dim3(n_tiles * (unsigned)n_kv_head, (unsigned)a.n_split, (unsigned)n_gz),
                  32 * (unsigned)(a.T < 4 ? 4 : a.T), smem, c->stream>>>(a);
    if (CUDA_LAUNCHED(c) != 0 || !a.part)
        return;
    k_att_merge<<<(unsigned)(n * n_head), (unsigned)head_dim, 0, c->stream>>>(a);
    CUDA_LAUNCHED(c);
}
