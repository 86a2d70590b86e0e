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
 * Decoding (up to CUDA_SMALL_N tokens: steps, several sequences, trees),
 * k_att_decode: a block takes one token, one kv head and a group of up to 8
 * of its query heads (a warp each); the 32 keys' K and V rows of a tile come
 * into shared memory by cp.async, as stored, two tiles ahead of the one being
 * scored (a long range's reads stay in flight), each lane scores one key
 * (four partial sums over the head dim), and the warp keeps a running max
 * (flash-attention style). The keys are split into fixed-length ranges
 * across blocks (parallel over long contexts), merged in order by
 * k_att_merge when a token's keys span several; a token within one range is
 * written directly, as the merge of one range would write it. The split
 * length depends on the token's own number of keys only, so a token's
 * arithmetic never depends on the batch.
 *
 * Larger batches without a mask (prefill chunks, beside other sequences'
 * decoded tokens or not), head dims 32/64/128 (and 256 with bf16 operands),
 * go to the tensor cores a row tile at a time (d.fa_tile: a sequence's run of
 * rows cut into pieces of up to 64): on a Hopper GPU outside precise mode,
 * head dims 64, 128 and 256 to flash_sm90.cu's wgmma kernel, otherwise k_flash;
 * a sequence's lone token there (a request decoding beside a prompt's chunk)
 * to k_att_decode, which gives it the bits it gets decoded alone;
 * other batches of runs of 8 rows of one sequence to k_attention (a block
 * takes the 8 tokens, a warp each, all keys, sharing each staged tile);
 * anything else to k_att_decode with one range per token. */
#include "attention_impl.h"

#include <math.h>

#define ATT_TILE 32
#define ATT_MAX_HD 256
#define ATT_MAX_G 8  /* query heads per block */
#define ATT_MAX_ND 8 /* head_dim / 32 */
#define ATT_PREFILL_T 8
#define ATT_STAGES 3 /* k_att_decode's ring of tiles */
static_assert(ATT_STAGES == 3, "k_att_decode waits with cp_async_wait_one: ATT_STAGES - 2 groups left in flight");
#define ATT_MERGE_WARPS 8
#define ATT_RANGE_BLOCKS 512 /* decode blocks a token's ranges aim at (cuda_attention) */
#define ATT_MIN_RANGES 16    /* ... within these bounds on its ranges */
#define ATT_MAX_RANGES 128
#define ATT_PRE_N 8          /* k_att_decode_tc: the largest batch whose stored rows it sets apart before its wait */


/* token i's view of the cache: its keys past mask_from come from vis (NULL: all in order) */
struct att_seq {
    int32_t mask_from, block_size;
    const int32_t *vis, *table;
};

static __device__ __forceinline__ struct att_seq att_seq_of(const struct att_args *a, int32_t i)
{
    struct att_seq s;
    s.mask_from = a->b.mask_from[i];
    s.block_size = a->block_size;
    s.vis = a->b.vis_stride ? a->b.vis + (int64_t)i * a->b.vis_stride : NULL;
    s.table = a->b.block_table + (int64_t)a->b.seq_row[i] * a->max_blocks;
    return s;
}

/* the cache row of visible key v */
static __device__ __forceinline__ int32_t att_seq_row(const struct att_seq &s, int32_t v)
{
    const int32_t p = v < s.mask_from || !s.vis ? v : s.vis[v - s.mask_from];
    return s.table[p / s.block_size] * s.block_size + p % s.block_size;
}

/* The length of the ranges a token's n_vis visible keys are split into:
 * whole tiles, at most a.max_ranges of them. It depends on the token's own
 * keys only, never on the batch or the cache size, so that a token's
 * arithmetic is the same in any batch (a tree node's as decoded alone) and
 * a short context on a large cache still spreads over many blocks. */
static __device__ __forceinline__ int32_t att_split_len(const struct att_args &a, int32_t n_vis)
{
    if (a.max_ranges == 0)
        return INT32_MAX;
    const int32_t tiles = (n_vis + ATT_TILE - 1) / ATT_TILE;
    return ATT_TILE * max(1, (tiles + a.max_ranges - 1) / a.max_ranges);
}

static __device__ __forceinline__ int32_t att_row(const struct att_args *a, int32_t i, int32_t v)
{
    return att_seq_row(att_seq_of(a, i), v);
}

/* Stages a tile's K and V rows (rows[key] < 0: zeros) in shared memory, 16
 * bytes at a time: all of a thread's loads first, then the stores, so that
 * the loads are in flight together. K rows kp floats apart (stored 16 bytes
 * at a time when kp is a multiple of 4), V rows hd apart. Needs a.vec4. */
static __device__ __forceinline__ void att_stage(const struct att_args &a, const int32_t *rows, int64_t koff, float *Ks,
                                                 int32_t kp, float *Vs)
{
    const int32_t hd = a.hd, h4 = hd / 4, n4 = ATT_TILE * h4;
    for (int e0 = threadIdx.x; e0 < n4; e0 += 4 * blockDim.x) {
        float4 kv[4], vv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int e = e0 + u * blockDim.x, key = e / h4, d = (e % h4) * 4;
            const int r = e < n4 ? rows[key] : -1;
            kv[u] = vv[u] = make_float4(0, 0, 0, 0);
            if (r >= 0) {
                kv[u] = kv_at4(a.kc, a.kv16, (int64_t)r * a.ks + koff + d);
                vv[u] = kv_at4(a.vc, a.kv16, (int64_t)r * a.ks + koff + d);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int e = e0 + u * blockDim.x, key = e / h4, d = (e % h4) * 4;
            if (e >= n4)
                break;
            float *kd = Ks + key * kp + d;
            if (kp % 4 == 0) {
                *(float4 *)kd = kv[u];
            } else {
                kd[0] = kv[u].x, kd[1] = kv[u].y, kd[2] = kv[u].z, kd[3] = kv[u].w;
            }
            *(float4 *)(Vs + key * hd + d) = vv[u];
        }
    }
}

/* grid: x = token tile * n_kv_head + kv head, z = group of gc query heads; block: T warps */
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
    /* the block's key range: everything its tokens see */
    int32_t v_end = 0;
    for (int32_t t = 0; t < T && i0 + t < a.n; t++)
        v_end = max(v_end, a.b.n_vis[i0 + t]);
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
    for (int32_t tile = 0; tile < v_end; tile += ATT_TILE) {
        __syncthreads();
        if (threadIdx.x < ATT_TILE)
            rows[threadIdx.x] = tile + threadIdx.x < v_end ? att_row(&a, i0, tile + threadIdx.x) : -1;
        __syncthreads();
        if (a.vec4) {
            att_stage(a, rows, koff, Ks, pitch, Vs);
        } else {
            for (int e = threadIdx.x; e < ATT_TILE * hd; e += blockDim.x) {
                const int key = e / hd, d = e % hd, r = rows[key];
                Ks[key * pitch + d] = r >= 0 ? kv_at(a.kc, a.kv16, (int64_t)r * a.ks + koff + d) : 0.0f;
                Vs[key * hd + d] = r >= 0 ? kv_at(a.vc, a.kv16, (int64_t)r * a.ks + koff + d) : 0.0f;
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
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
#pragma unroll
        for (int dd = 0; dd < ATT_MAX_ND; dd++)
            if (dd < nd && lane + 32 * dd < hd)
                a.out[(int64_t)i * a.os + (int64_t)(h0 + h) * hd + lane + 32 * dd] = acc[h][dd] * inv;
    }
}

/* Requests a tile's K and V rows (rows[key] < 0: left as they are) as they
 * are stored, B bytes per copy, into K rows kpb bytes apart and V rows vpb
 * apart; rb bytes per row. */
template <int B>
static __device__ __forceinline__ void att_fetch_n(const struct att_args &a, const int32_t *rows, int64_t koff, int32_t rb,
                                                   char *Kd, char *Vd)
{
    const int32_t per_row = rb / B, n = ATT_TILE * per_row;
    const int64_t ksb = a.ks * (a.kv16 ? 2 : 4);
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) {
        const int32_t key = e / per_row, o = (e - key * per_row) * B, r = rows[key];
        if (r < 0)
            continue;
        const int64_t src = r * ksb + koff + o;
        if (B == 16) {
            cp_async16(Kd + key * a.kpb + o, (const char *)a.kc + src, 16);
            cp_async16(Vd + key * a.vpb + o, (const char *)a.vc + src, 16);
        } else {
            cp_async8(Kd + key * a.kpb + o, (const char *)a.kc + src);
            cp_async8(Vd + key * a.vpb + o, (const char *)a.vc + src);
        }
    }
}

static __device__ __forceinline__ void att_fetch(const struct att_args &a, const int32_t *rows, int64_t koff, int32_t rb,
                                                 char *Kd, char *Vd)
{
    if (a.cb == 16)
        att_fetch_n<16>(a, rows, koff, rb, Kd, Vd);
    else
        att_fetch_n<8>(a, rows, koff, rb, Kd, Vd);
}

/* the four partial sums of a key's score, elements d..d+3 of q and k */
static __device__ __forceinline__ void att_dot4(float4 q, float4 k, float *s)
{
    s[0] = fmaf(q.x, k.x, s[0]);
    s[1] = fmaf(q.y, k.y, s[1]);
    s[2] = fmaf(q.z, k.z, s[2]);
    s[3] = fmaf(q.w, k.w, s[3]);
}

/* Decoding's head-dim columns per lane: CPL adjacent columns from lane * CPL
 * when the head dim is 32 * CPL (a value row read as one vector), else
 * (CPL = 0) columns lane, lane + 32, ... of any head dim (a multiple of 4). */
template <int CPL> struct att_cols {
    static constexpr int N = CPL ? CPL : ATT_MAX_ND; /* accumulators per lane */
    static __device__ __forceinline__ int32_t col(int lane, int c) { return CPL ? lane * CPL + c : lane + 32 * c; }
    static __device__ __forceinline__ bool ok(int32_t hd, int lane, int c)
    {
        return CPL ? true : c < (hd + 31) / 32 && lane + 32 * c < hd;
    }
};

/* v[0..CPL) = columns lane*CPL.. of value row vr (f32, or bf16 when BF16) */
template <bool BF16, int CPL>
static __device__ __forceinline__ void att_vrow(const char *vr, int lane, float *v)
{
    if (BF16) {
        const uint16_t *p = (const uint16_t *)vr + lane * CPL;
        if (CPL == 1) {
            v[0] = __uint_as_float((uint32_t)p[0] << 16);
        } else if (CPL == 2) {
            const uint32_t u = *(const uint32_t *)p;
            v[0] = __uint_as_float(u << 16), v[1] = __uint_as_float(u & 0xffff0000u);
        } else {
#pragma unroll
            for (int c = 0; c < CPL; c += 4) {
                const uint2 u = *(const uint2 *)(p + c);
                const float4 f = bf16x4(u.x, u.y);
                v[c] = f.x, v[c + 1] = f.y, v[c + 2] = f.z, v[c + 3] = f.w;
            }
        }
    } else {
        const float *p = (const float *)vr + lane * CPL;
        if (CPL == 1) {
            v[0] = p[0];
        } else if (CPL == 2) {
            const float2 f = *(const float2 *)p;
            v[0] = f.x, v[1] = f.y;
        } else {
#pragma unroll
            for (int c = 0; c < CPL; c += 4) {
                const float4 f = *(const float4 *)(p + c);
                v[c] = f.x, v[c + 1] = f.y, v[c + 2] = f.z, v[c + 3] = f.w;
            }
        }
    }
}

/* One warp's head over one staged tile of n_keys keys (K rows a.kpb bytes
 * apart, then V rows a.vpb apart): lane = key, four partial sums over the
 * head dim added pairwise; the running max *m, sum *l and output acc
 * (columns by att_cols<CPL>). A column's sum over the keys is the same
 * sequence of multiply-adds whatever CPL. */
template <bool BF16, int CPL>
static __device__ __forceinline__ void att_decode_tile(const struct att_args &a, const char *Kt, const float4 *qw,
                                                       int n_keys, float *m, float *l, float *acc)
{
    typedef att_cols<CPL> C;
    const int32_t hd = CPL ? 32 * CPL : a.hd, h4 = hd / 4;
    const int lane = threadIdx.x & 31;
    const char *Vt = Kt + ATT_TILE * a.kpb, *kr = Kt + lane * a.kpb;
    const bool ok = lane < n_keys;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (BF16) {
        int32_t d4 = 0;
#pragma unroll 8
        for (; d4 + 2 <= h4; d4 += 2) {
            const uint4 u = *(const uint4 *)(kr + 8 * d4);
            att_dot4(qw[d4], bf16x4(u.x, u.y), s);
            att_dot4(qw[d4 + 1], bf16x4(u.z, u.w), s);
        }
        if (d4 < h4) {
            const uint2 u = *(const uint2 *)(kr + 8 * d4);
            att_dot4(qw[d4], bf16x4(u.x, u.y), s);
        }
    } else {
#pragma unroll 8
        for (int32_t d4 = 0; d4 < h4; d4++)
            att_dot4(qw[d4], ((const float4 *)kr)[d4], s);
    }
    const float sc = ok ? ((s[0] + s[1]) + (s[2] + s[3])) * a.scale : -INFINITY;
    const float mx = fmaxf(*m, warp_max(sc));
    const float corr = expf(*m - mx);
    const float p = ok ? expf(sc - mx) : 0.0f;
    *l = *l * corr + warp_sum(p);
    *m = mx;
#pragma unroll
    for (int c = 0; c < C::N; c++)
        acc[c] *= corr;
#pragma unroll 4
    for (int j = 0; j < n_keys; j++) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const char *vr = Vt + j * a.vpb;
        if (CPL) {
            float v[C::N];
            att_vrow<BF16, CPL>(vr, lane, v);
#pragma unroll
            for (int c = 0; c < C::N; c++)
                acc[c] = fmaf(pj, v[c], acc[c]);
        } else {
#pragma unroll
            for (int c = 0; c < C::N; c++)
                if (C::ok(hd, lane, c)) {
                    const int32_t col = C::col(lane, c);
                    const float v = BF16 ? __bfloat162float(((const __nv_bfloat16 *)vr)[col]) : ((const float *)vr)[col];
                    acc[c] = fmaf(pj, v, acc[c]);
                }
        }
    }
}

/* grid: x = token * n_kv_head + kv head, y = split, z = group of gc query
 * heads; block: max(gc, 4) warps, warp w computing head w of the group (all
 * of them requesting the tiles). Tiles of 32 keys come into a ring of
 * ATT_STAGES buffers by cp.async, as the cache stores them (f32, or bf16
 * when BF16), ATT_STAGES - 1 tiles ahead of the one being scored, so the
 * reads of a long range stay in flight while the warps compute. Head dims
 * that are multiples of 4 up to 256; columns per lane by att_cols<CPL>. */
template <bool BF16, int CPL>
__global__ void k_att_decode(struct att_args a)
{
    extern __shared__ __align__(16) char sm_raw[];
    __shared__ int32_t rows[ATT_STAGES][ATT_TILE];
    typedef att_cols<CPL> C;
    const int32_t hd = a.hd, h4 = hd / 4, rb = hd * (BF16 ? 2 : 4);
    const int32_t stage = ATT_TILE * (a.kpb + a.vpb);
    float *qs = (float *)(sm_raw + ATT_STAGES * stage); /* [gc][hd] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t j = blockIdx.x / a.n_kv_head, kvh = blockIdx.x % a.n_kv_head, i = a.sel ? a.sel[j] : j;
    const int32_t G = a.n_head / a.n_kv_head, h0 = kvh * G + blockIdx.z * a.gc;
    const int32_t gc = min(a.gc, G - (int32_t)blockIdx.z * a.gc);
    grid_dep_wait(); /* q and the new keys: attn_prep's */
    const int32_t n_vis = a.b.n_vis[i], split_len = att_split_len(a, n_vis);
    if ((int64_t)blockIdx.y * split_len >= n_vis)
        return;
    const int32_t v_beg = blockIdx.y * split_len, v_end = min(n_vis, v_beg + split_len);
    const int32_t n_tiles = (v_end - v_beg + ATT_TILE - 1) / ATT_TILE;
    const int64_t koff = (int64_t)kvh * rb;
    const struct att_seq sq = att_seq_of(&a, i);
    for (int e = threadIdx.x; e < ATT_STAGES * ATT_TILE; e += blockDim.x)
        rows[e / ATT_TILE][e % ATT_TILE] = v_beg + e < v_end ? att_seq_row(sq, v_beg + e) : -1;
    for (int e = threadIdx.x; e < gc * h4; e += blockDim.x)
        ((float4 *)qs)[e] = *(const float4 *)(a.q + (int64_t)i * a.qs + (int64_t)h0 * hd + 4 * e);
    __syncthreads();
    for (int32_t t = 0; t < ATT_STAGES - 1; t++) {
        if (t < n_tiles)
            att_fetch(a, rows[t], koff, rb, sm_raw + t * stage, sm_raw + t * stage + ATT_TILE * a.kpb);
        cp_async_commit();
    }
    const bool active = warp < gc;
    float m = -INFINITY, l = 0.0f, acc[C::N];
#pragma unroll
    for (int c = 0; c < C::N; c++)
        acc[c] = 0.0f;
    const float4 *qw = (const float4 *)(qs + (active ? warp : 0) * hd);
    for (int32_t t = 0; t < n_tiles; t++) {
        cp_async_wait_one(); /* tile t is in (ATT_STAGES - 2 groups may still fly) */
        __syncthreads();     /* ... for every thread, and tile t - 1's buffer is free */
        const int32_t tn = t + ATT_STAGES - 1, sn = tn % ATT_STAGES;
        if (tn < n_tiles)
            att_fetch(a, rows[sn], koff, rb, sm_raw + sn * stage, sm_raw + sn * stage + ATT_TILE * a.kpb);
        cp_async_commit();
        /* tile t + ATT_STAGES's rows: looked up now, stored (in tile t's
         * slot, whose fetch is done) after the scoring, so that the lookup's
         * latency hides behind it */
        const int32_t v_next = v_beg + (t + ATT_STAGES) * ATT_TILE + lane;
        const int32_t row_next = warp == 0 && v_next < v_end ? att_seq_row(sq, v_next) : -1;
        if (active)
            att_decode_tile<BF16, CPL>(a, sm_raw + (t % ATT_STAGES) * stage, qw, min(ATT_TILE, v_end - (v_beg + t * ATT_TILE)),
                                  &m, &l, acc);
        if (warp == 0)
            rows[t % ATT_STAGES][lane] = row_next;
    }
    cp_async_wait_all();
    grid_dep_launch();
    if (!active)
        return;
    const int32_t h = h0 + warp;
    if (a.part) {
        float *pp = a.part + (((int64_t)j * a.n_head + h) * a.n_split + blockIdx.y) * (hd + 2);
#pragma unroll
        for (int c = 0; c < C::N; c++)
            if (C::ok(hd, lane, c))
                pp[C::col(lane, c)] = acc[c];
        if (lane == 0)
            pp[hd] = m, pp[hd + 1] = l;
    } else {
        /* as k_att_merge writes a single range */
#pragma unroll
        for (int c = 0; c < C::N; c++)
            if (C::ok(hd, lane, c))
                a.out[(int64_t)i * a.os + (int64_t)h * hd + C::col(lane, c)] = l > 0.0f ? acc[c] / l : 0.0f;
    }
}

/* Decoding on the tensor cores (a bf16 cache outside precise mode, head
 * dims 64 and 128, up to 16 query heads a kv head; att_decode_run picks it
 * from those alone, so a token's bits never depend on its batch). The grid
 * is k_att_decode's with every query head of a kv head in one block, and a
 * block is one warp: the heads are the 16 rows of mma_bf16's row operand (q
 * rounded to bf16 once, rows past the group zeros), S = q K^T over a tile's
 * 32 keys (K rows read by ldmatrix as they are staged), a running max and
 * sum per head in the accumulators' rows, then O += P V with P rounded to
 * bf16 (the scores' accumulator layout is the row operand; V rows through
 * ldmatrix's transpose). Tiles come by cp.async into k_att_decode's ring of
 * three, keys past the range zeros (P is 0 there, V must not be NaN). The
 * outputs, or the partial sums of several ranges, are k_att_decode's, so
 * k_att_merge merges them. The warp's instructions per tile are a few
 * hundred where k_att_decode's warps spend thousands a head: long contexts'
 * decoding becomes a stream of the cache. */
template <int HD>
__global__ void __launch_bounds__(32) k_att_decode_tc(struct att_args a)
{
    constexpr int NK = HD / 16, ND = HD / 8, CH = HD / 8; /* k steps of S; dim tiles of O; 16-byte chunks a row */
    extern __shared__ __align__(16) char sm_raw[];
    __shared__ int32_t rows[ATT_STAGES][ATT_TILE];
    const int lane = threadIdx.x, g = lane >> 2, cq = lane & 3;
    const int32_t j = blockIdx.x / a.n_kv_head, kvh = blockIdx.x % a.n_kv_head, i = a.sel ? a.sel[j] : j;
    const int32_t G = a.n_head / a.n_kv_head, h0 = kvh * G;
    const int32_t stage = ATT_TILE * (a.kpb + a.vpb);
    /* Before the wait, what no kernel of this forward writes: the batch's
     * rows and block table, and for a batch of up to ATT_PRE_N tokens the
     * first tiles' keys and values but for the rows it stores (its slots),
     * which come after the wait. */
    const int32_t n_vis = a.b.n_vis[i], split_len = att_split_len(a, n_vis);
    if ((int64_t)blockIdx.y * split_len >= n_vis)
        return;
    const int32_t v_beg = blockIdx.y * split_len, v_end = min(n_vis, v_beg + split_len);
    const int32_t n_tiles = (v_end - v_beg + ATT_TILE - 1) / ATT_TILE;
    const int64_t koff = (int64_t)kvh * HD * 2, ksb = a.ks * 2;
    const struct att_seq sq = att_seq_of(&a, i);
    const bool pre = a.n <= ATT_PRE_N;
    unsigned fresh[ATT_STAGES - 1] = {}; /* a bit a key of the first tiles: its row is one of the batch's slots */
#pragma unroll
    for (int st = 0; st < ATT_STAGES; st++) {
        const int32_t v = v_beg + st * ATT_TILE + lane, r = v < v_end ? att_seq_row(sq, v) : -1;
        rows[st][lane] = r;
        if (st < ATT_STAGES - 1 && pre) {
            bool f = false;
            for (int32_t t = 0; t < a.n; t++)
                f |= r == a.b.slot[t];
            fresh[st] = __ballot_sync(0xffffffffu, f);
        }
    }
    __syncwarp();
    /* tile st's rows whose bit in fm is `in` (fm 0, in false: every row) */
    const auto fetch = [&](int st, unsigned fm, bool in) {
        char *Kd = sm_raw + st * stage, *Vd = Kd + ATT_TILE * a.kpb;
        for (int e = lane; e < ATT_TILE * CH; e += 32) {
            const int key = e / CH, o = (e % CH) * 16;
            if ((fm >> key & 1u) != (unsigned)in)
                continue;
            const int32_t r = rows[st][key];
            const int64_t src = (int64_t)(r < 0 ? 0 : r) * ksb + koff + o;
            cp_async16(Kd + key * a.kpb + o, (const char *)a.kc + src, r < 0 ? 0 : 16);
            cp_async16(Vd + key * a.vpb + o, (const char *)a.vc + src, r < 0 ? 0 : 16);
        }
    };
    const auto fetch_first = [&](bool in) {
#pragma unroll
        for (int32_t t = 0; t < ATT_STAGES - 1; t++) {
            if (t < n_tiles)
                fetch(t, fresh[t], in);
            cp_async_commit();
        }
    };
    if (pre)
        fetch_first(false);
    grid_dep_wait(); /* q and the new keys: attn_prep's */
    if (!pre) {
        fetch_first(false);
    } else if ((n_tiles > 0 && fresh[0]) || (n_tiles > 1 && fresh[1])) {
        fetch_first(true);
        cp_async_wait_all(); /* the loop waits for all groups but the last */
    }
    /* the row operand: heads g and g + 8, head dims kt*16 + 2cq (+8) */
    uint32_t qf[NK][4];
    {
        const bool ha = g < G, hb = g + 8 < G;
        const float *qa = a.q + (int64_t)i * a.qs + (int64_t)(h0 + (ha ? g : 0)) * HD + 2 * cq;
        const float *qb = a.q + (int64_t)i * a.qs + (int64_t)(h0 + (hb ? g + 8 : 0)) * HD + 2 * cq;
        const float2 z = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int kt = 0; kt < NK; kt++) {
            const float2 x0 = ha ? *(const float2 *)(qa + kt * 16) : z, x1 = hb ? *(const float2 *)(qb + kt * 16) : z;
            const float2 x2 = ha ? *(const float2 *)(qa + kt * 16 + 8) : z;
            const float2 x3 = hb ? *(const float2 *)(qb + kt * 16 + 8) : z;
            qf[kt][0] = bf16x2_rn(x0.x, x0.y);
            qf[kt][1] = bf16x2_rn(x1.x, x1.y);
            qf[kt][2] = bf16x2_rn(x2.x, x2.y);
            qf[kt][3] = bf16x2_rn(x3.x, x3.y);
        }
    }
    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f; /* heads g and g + 8: max, this lane's keys' sum */
    for (int32_t t = 0; t < n_tiles; t++) {
        cp_async_wait_one(); /* tile t is in (one group may still fly) */
        __syncwarp();        /* ... for every lane, and tile t - 1's buffer is free */
        const int32_t tn = t + ATT_STAGES - 1;
        if (tn < n_tiles)
            fetch(tn % ATT_STAGES, 0u, false); /* after the wait: every row */
        cp_async_commit();
        const int32_t v_next = v_beg + (t + ATT_STAGES) * ATT_TILE + lane;
        const int32_t row_next = v_next < v_end ? att_seq_row(sq, v_next) : -1;
        const char *Kt = sm_raw + (t % ATT_STAGES) * stage, *Vt = Kt + ATT_TILE * a.kpb;
        const int32_t n_keys = min(ATT_TILE, v_end - (v_beg + t * ATT_TILE));
        float s[4][4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            s[k][0] = s[k][1] = s[k][2] = s[k][3] = 0.0f;
#pragma unroll
        for (int kt = 0; kt < NK; kt++)
#pragma unroll
            for (int kk = 0; kk < 4; kk += 2) {
                /* keys 8kk..8kk+15, head dims kt*16..kt*16+15: b[0..1] key tile kk, b[2..3] kk+1 */
                uint32_t b[4];
                ldsm_x4(b, Kt + (8 * kk + (lane >> 4) * 8 + (lane & 7)) * a.kpb + (kt * 16 + (lane >> 3 & 1) * 8) * 2);
                mma_bf16(s[kk], qf[kt][0], qf[kt][1], qf[kt][2], qf[kt][3], b[0], b[1]);
                mma_bf16(s[kk + 1], qf[kt][0], qf[kt][1], qf[kt][2], qf[kt][3], b[2], b[3]);
            }
        /* s[kk]: heads g (0, 1) and g + 8 (2, 3), keys 8kk + 2cq (+1) */
        float xa = ma, xb = mb;
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const bool in = 8 * kk + 2 * cq + c < n_keys;
                s[kk][c] = in ? s[kk][c] * a.scale : -INFINITY;
                s[kk][2 + c] = in ? s[kk][2 + c] * a.scale : -INFINITY;
                xa = fmaxf(xa, s[kk][c]);
                xb = fmaxf(xb, s[kk][2 + c]);
            }
        xa = quad_max(xa); /* finite: a tile has a key */
        xb = quad_max(xb);
        const float ca = expf(ma - xa), cb = expf(mb - xb);
        ma = xa;
        mb = xb;
        la *= ca;
        lb *= cb;
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                s[kk][c] = expf(s[kk][c] - xa);
                s[kk][2 + c] = expf(s[kk][2 + c] - xb);
                la += s[kk][c];
                lb += s[kk][2 + c];
            }
#pragma unroll
        for (int d = 0; d < ND; d++) {
            o[d][0] *= ca;
            o[d][1] *= ca;
            o[d][2] *= cb;
            o[d][3] *= cb;
        }
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            /* keys 16ks..16ks+15: key tiles 2ks and 2ks+1 of the scores */
            const uint32_t p[4] = {bf16x2_rn(s[2 * ks][0], s[2 * ks][1]), bf16x2_rn(s[2 * ks][2], s[2 * ks][3]),
                                   bf16x2_rn(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                   bf16x2_rn(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
            for (int d = 0; d < ND; d += 2) {
                /* tiles: keys 16ks (+8 for m odd), head dims 8d (+8 for m >= 2) */
                const int m = lane >> 3;
                uint32_t b[4];
                ldsm_x4_t(b, Vt + (16 * ks + (m & 1) * 8 + (lane & 7)) * a.vpb + (8 * d + (m >> 1) * 8) * 2);
                mma_bf16(o[d], p[0], p[1], p[2], p[3], b[0], b[1]);
                mma_bf16(o[d + 1], p[0], p[1], p[2], p[3], b[2], b[3]);
            }
        }
        rows[t % ATT_STAGES][lane] = row_next; /* tile t + ATT_STAGES's, in tile t's slot */
    }
    cp_async_wait_all();
    grid_dep_launch();
    la = quad_sum(la);
    lb = quad_sum(lb);
    /* o[d]: heads g (0, 1) and g + 8 (2, 3), head dims 8d + 2cq (+1) */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int32_t hg = g + 8 * hr;
        if (hg >= G)
            continue;
        const int32_t h = h0 + hg;
        const float m = hr ? mb : ma, l = hr ? lb : la;
        if (a.part) {
            float *pp = a.part + (((int64_t)j * a.n_head + h) * a.n_split + blockIdx.y) * (HD + 2);
#pragma unroll
            for (int d = 0; d < ND; d++)
                *(float2 *)(pp + 8 * d + 2 * cq) = make_float2(o[d][2 * hr], o[d][2 * hr + 1]);
            if (cq == 0)
                pp[HD] = m, pp[HD + 1] = l;
        } else {
            /* as k_att_merge writes a single range */
            float *op = a.out + (int64_t)i * a.os + (int64_t)h * HD;
#pragma unroll
            for (int d = 0; d < ND; d++)
                *(float2 *)(op + 8 * d + 2 * cq) =
                    make_float2(l > 0.0f ? o[d][2 * hr] / l : 0.0f, l > 0.0f ? o[d][2 * hr + 1] / l : 0.0f);
        }
    }
}

/* grid: token * n_head + head; block: ATT_MERGE_WARPS warps. A token's
 * ranges are merged in a fixed order whatever the batch: warp w takes ranges
 * w, w + ATT_MERGE_WARPS, ... (lanes across the head dim), then the warps'
 * sums are added in warp order; a single range comes out as acc / l, as
 * k_att_decode writes it directly. (One thread per head dim walking hundreds
 * of ranges at long contexts was a latency-bound loop.) */
__global__ void __launch_bounds__(ATT_MERGE_WARPS * 32) k_att_merge(struct att_args a)
{
    __shared__ float red[ATT_MERGE_WARPS][ATT_MAX_HD + 1];
    const int32_t j = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, hd = a.hd, i = a.sel ? a.sel[j] : j;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t n_vis = a.b.n_vis[i], split_len = att_split_len(a, n_vis);
    const int32_t n_used = (n_vis + split_len - 1) / split_len;
    grid_dep_wait(); /* the ranges' sums (the batch's n_vis is no kernel's output) */
    const float *p = a.part + ((int64_t)j * a.n_head + h) * a.n_split * (hd + 2);
    float mx = -INFINITY;
    for (int32_t s = threadIdx.x; s < n_used; s += blockDim.x)
        mx = fmaxf(mx, p[s * (hd + 2) + hd]);
    mx = warp_max(mx);
    if (lane == 0)
        red[warp][0] = mx;
    __syncthreads();
    mx = red[0][0];
    for (int w = 1; w < ATT_MERGE_WARPS; w++)
        mx = fmaxf(mx, red[w][0]);
    __syncthreads(); /* red is reused below */
    float sum = 0.0f, o[ATT_MAX_ND];
#pragma unroll
    for (int dd = 0; dd < ATT_MAX_ND; dd++)
        o[dd] = 0.0f;
    for (int32_t s = warp; s < n_used; s += ATT_MERGE_WARPS) {
        const float *ps = p + s * (hd + 2);
        const float f = ps[hd] == -INFINITY ? 0.0f : expf(ps[hd] - mx);
        sum += ps[hd + 1] * f;
#pragma unroll
        for (int dd = 0; dd < ATT_MAX_ND; dd++)
            if (lane + 32 * dd < hd)
                o[dd] += ps[lane + 32 * dd] * f;
    }
#pragma unroll
    for (int dd = 0; dd < ATT_MAX_ND; dd++)
        if (lane + 32 * dd < hd)
            red[warp][lane + 32 * dd] = o[dd];
    if (lane == 0)
        red[warp][ATT_MAX_HD] = sum;
    __syncthreads();
    grid_dep_launch();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float od = red[0][d], sd = red[0][ATT_MAX_HD];
        for (int w = 1; w < ATT_MERGE_WARPS; w++) {
            od += red[w][d];
            sd += red[w][ATT_MAX_HD];
        }
        a.out[(int64_t)i * a.os + (int64_t)h * hd + d] = sd > 0.0f ? od / sd : 0.0f;
    }
}

template <bool BF16> static void (*att_decode_pick(int32_t hd))(struct att_args)
{
    switch (hd) {
    case 32: return k_att_decode<BF16, 1>;
    case 64: return k_att_decode<BF16, 2>;
    case 128: return k_att_decode<BF16, 4>;
    case 256: return k_att_decode<BF16, 8>;
    default: return k_att_decode<BF16, 0>;
    }
}

/* k_att_decode for the cache's type and the head dim */
static void (*att_decode_kernel(bool bf16, int32_t hd))(struct att_args)
{
    return bf16 ? att_decode_pick<true>(hd) : att_decode_pick<false>(hd);
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

/* k_att_decode, and k_att_merge over its ranges, for n_tok tokens: the
 * batch's rows sel (NULL: rows 0..n_tok-1), the longest seeing max_vis keys;
 * n_gz groups of a.gc query heads a kv head */
static void att_decode_run(struct cuda_backend *c, struct att_args a, int32_t n_tok, const int32_t *sel,
                           int32_t max_vis, int32_t n_gz)
{
    const int32_t n_kv_head = a.n_kv_head, n_head = a.n_head, head_dim = a.hd;
    a.sel = sel;
    const int32_t rb = head_dim * (a.kv16 ? 2 : 4);
    const uint64_t al = (uint64_t)a.ks * (a.kv16 ? 2 : 4) | (uint64_t)rb | (uintptr_t)a.kc |
                        (uintptr_t)a.vc;
    assert(al % 8 == 0); /* a.vec4 */
    a.cb = al % 16 == 0 ? 16 : 8;
    /* the tensor cores where the model and the mode allow (k_att_decode_tc),
     * never the batch: a token's bits are the same in any batch */
    const bool tc = !c->precise && a.kv16 && (head_dim == 64 || head_dim == 128) && n_head / n_kv_head <= 16 &&
                    a.cb == 16 && a.os % 2 == 0;
    if (tc)
        n_gz = 1;
    /* a token's keys in ranges of whole tiles, up to max_ranges of them
     * (att_split_len): about ATT_RANGE_BLOCKS blocks a token whatever the model, so
     * that a long range keeps the ring busy for many tiles (ranges a quarter
     * as long decoded a 25k-token context 8% slower with a bf16 cache: every
     * block filling its ring was the cost); many tokens one range each
     * (their partial sums would not fit) */
    a.max_ranges = ATT_RANGE_BLOCKS / (n_kv_head * n_gz);
    a.max_ranges = a.max_ranges < ATT_MIN_RANGES ? ATT_MIN_RANGES
                   : a.max_ranges > ATT_MAX_RANGES ? ATT_MAX_RANGES
                                                   : a.max_ranges;
    if (n_tok > CUDA_SMALL_N)
        a.max_ranges = 0;
    const int32_t vis_tiles = (max_vis + ATT_TILE - 1) / ATT_TILE;
    a.n_split = a.max_ranges == 0 ? 1 : vis_tiles < a.max_ranges ? vis_tiles : a.max_ranges;
    a.n_split = a.n_split < 1 ? 1 : a.n_split;
    a.part = NULL;
    if (a.n_split > 1) {
        a.part = (float *)cuda_scratch(c, SCR_ATTN, (size_t)n_tok * n_head * a.n_split * (head_dim + 2) * sizeof(float));
        if (!a.part)
            return;
    }
    /* staged K rows an odd number of 16-byte units apart: the lanes' row
     * reads hit distinct banks (and the tensor cores' V rows, read by
     * ldmatrix 8 rows at a time, likewise) */
    a.kpb = (rb + 31) / 32 * 32 + 16;
    a.vpb = tc ? a.kpb : (rb + 15) / 16 * 16;
    const size_t smem =
        (size_t)ATT_STAGES * ATT_TILE * (a.kpb + a.vpb) + (tc ? 0 : (size_t)a.gc * head_dim * sizeof(float));
    void (*dec)(struct att_args) = !tc                ? att_decode_kernel(a.kv16, head_dim)
                                   : head_dim == 64 ? k_att_decode_tc<64>
                                                    : k_att_decode_tc<128>;
    if (smem > 48 * 1024 &&
        CUDA_CHECK(c, cudaFuncSetAttribute(dec, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != 0)
        return;
    if (cuda_launch_dep(c, dec, dim3((unsigned)(n_tok * n_kv_head), (unsigned)a.n_split, (unsigned)n_gz),
                        dim3(tc ? 32 : 32 * (unsigned)(a.gc < 4 ? 4 : a.gc)), smem, a) != 0 ||
        !a.part)
        return;
    cuda_launch_dep(c, k_att_merge, dim3((unsigned)(n_tok * n_head)), dim3(ATT_MERGE_WARPS * 32), 0, a);
}

void cuda_attention(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *kc,
                    const struct tensor *vc, int32_t n_head, int32_t n_kv_head, int32_t head_dim, float scale)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = c->b.n_tokens, G = n_head / n_kv_head;
    assert(head_dim <= ATT_MAX_HD && kc->row_stride == vc->row_stride && kc->type == vc->type &&
           (kc->type == DT_F32 || kc->type == DT_BF16));
    if (cuda_op_skip(c) || n == 0)
        return;
    struct att_args a = {};
    a.q = (const float *)q->data;
    a.qs = q->row_stride;
    a.kc = kc->data;
    a.vc = vc->data;
    a.kv16 = kc->type == DT_BF16;
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
    const bool dec_ok = a.vec4 && q->row_stride % 4 == 0 && ((uintptr_t)q->data & 15) == 0;
    if (n > CUDA_SMALL_N) {
        /* the flash kernel reads q and writes out in pairs, K and V 16 bytes at a time */
        const bool pairs = q->row_stride % 2 == 0 && out->row_stride % 2 == 0 && ((uintptr_t)q->data & 7) == 0 &&
                           ((uintptr_t)out->data & 7) == 0;
        /* heads per block: the largest divisor of the group up to 8; then row
         * groups up to 4 while the block stays within 8 warps */
        a.fa_hb = 1;
        for (int32_t d = 1; d <= FA_MAX_WARPS; d++)
            if (G % d == 0)
                a.fa_hb = d;
        a.fa_rb = FA_MAX_WARPS / a.fa_hb < 4 ? FA_MAX_WARPS / a.fa_hb : 4;
        a.sm90 = cuda_flash_sm90_fits(c, head_dim);
        /* head dim 256 (qwen3.5): bf16 operands only, precise mode takes the CUDA cores */
        if (a.vec4 && pairs && !c->b.mask && (dec_ok || c->n_dec == 0) &&
            (head_dim == 32 || head_dim == 64 || head_dim == 128 || (head_dim == 256 && !c->precise))) {
            if (c->n_fa_tiles > 0)
                attention_flash(c, &a, head_dim);
            if (c->n_dec > 0 && !c->failed)
                att_decode_run(c, a, c->n_dec, c->d.dec_rows, c->dec_max_vis, n_gz);
            return;
        }
        if (att_tileable(&c->b, ATT_PREFILL_T)) {
            a.T = ATT_PREFILL_T;
            const size_t smem = ((size_t)ATT_TILE * (head_dim + 1) + (size_t)ATT_TILE * head_dim +
                                 (size_t)a.T * a.gc * head_dim) * sizeof(float);
            if (smem > 48 * 1024 && CUDA_CHECK(c, cudaFuncSetAttribute(k_attention,
                                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                       (int)smem)) != 0)
                return;
            k_attention<<<dim3(cdiv(n, a.T) * (unsigned)n_kv_head, 1, (unsigned)n_gz), 32 * (unsigned)a.T, smem,
                          c->stream>>>(a);
            CUDA_LAUNCHED(c);
            return;
        }
    }
    if (!dec_ok) {
        c->failed = true;
        err_set("cuda: attention takes head dims that are multiples of 4 (this model's: %d)", (int)head_dim);
        return;
    }
    att_decode_run(c, a, n, NULL, c->max_vis, n_gz);
}
