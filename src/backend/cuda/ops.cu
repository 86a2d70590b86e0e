/* ops: the row-wise and elementwise ops of the cuda backend (embed, norms,
 * rope, cache stores, the three fused as attn_prep, activations, gathers),
 * each the cpu backend's loop with one thread per element or one warp per
 * normalised group. Transcendentals
 * are the accurate expf/cosf/sinf, not the fast intrinsics, so that results
 * stay within float rounding of the cpu backend's. */
#include "cuda_impl.h"

#include <math.h>

#define EW_THREADS 256
#define ATT_PREP_MAX_HD 256 /* head dims attn_prep takes (attention's limit too) */

/* rows x cols elements of a 2-D grid: blockIdx.y = row, x over columns */
static inline dim3 ew_grid(int64_t rows, int64_t cols) { return dim3(cdiv(cols, EW_THREADS), (unsigned)rows); }

__global__ void k_embed(float *out, int64_t os, const void *table, enum dtype tt, int64_t ts, const int32_t *token,
                        int64_t cols)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c < cols)
        out[r * os + c] = dev_weight(table, tt, (int64_t)token[r] * ts + c);
}

void cuda_embed(struct backend *be, struct tensor *out, const struct tensor *table)
{
    struct cuda_backend *c = cuda_of(be);
    if (cuda_op_skip(c) || c->b.n_tokens == 0)
        return;
    if (dtype_is_block(table->type))
        return cuda_embed_q(c, out, table);
    /* a plain launch, never a programmatic dependent: it starts only once the
     * previous forward and copy_rows have finished, and every kernel of this
     * forward after it, so those that load the cache before their wait
     * (decode attention's) see those writes */
    k_embed<<<ew_grid(c->b.n_tokens, table->n_cols), EW_THREADS, 0, c->stream>>>(
        (float *)out->data, out->row_stride, table->data, table->type, table->row_stride, c->d.token, table->n_cols);
    CUDA_LAUNCHED(c);
}

/* one warp per (row, group of d columns) */
__global__ void k_rmsnorm(float *out, int64_t os, const float *x, int64_t xs, const void *w, enum dtype wt, int64_t d,
                          int64_t groups, int64_t n_items, float eps)
{
    const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (item >= n_items)
        return;
    const int64_t r = item / groups, g0 = (item % groups) * d;
    const float *xr = x + r * xs + g0;
    float ss = 0.0f;
    for (int64_t c = lane; c < d; c += 32)
        ss += xr[c] * xr[c];
    const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)d + eps);
    float *o = out + r * os + g0;
    for (int64_t c = lane; c < d; c += 32)
        o[c] = dev_weight(w, wt, c) * (xr[c] * inv);
}

/* one block per (row, group) for wide groups (a whole hidden state) */
__global__ void k_rmsnorm_wide(float *out, int64_t os, const float *x, int64_t xs, const void *w, enum dtype wt,
                               int64_t d, int64_t groups, float eps)
{
    __shared__ float part[32];
    const int64_t r = blockIdx.x / groups, g0 = (blockIdx.x % groups) * d;
    const float *xr = x + r * xs + g0;
    const float inv = block_rms_inv(xr, d, eps, part);
    float *o = out + r * os + g0;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
        o[c] = dev_weight(w, wt, c) * (xr[c] * inv);
}

void cuda_rmsnorm(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w, float eps)
{
    struct cuda_backend *c = cuda_of(be);
    const int64_t d = w->n_cols, groups = x->n_cols / d, items = x->n_rows * groups;
    assert(x->n_cols % d == 0 && out->n_cols == x->n_cols);
    if (cuda_op_skip(c) || items == 0)
        return;
    if (d >= 1024) {
        k_rmsnorm_wide<<<(unsigned)items, 512, 0, c->stream>>>((float *)out->data, out->row_stride,
                                                             (const float *)x->data, x->row_stride, w->data,
                                                             w->type, d, groups, eps);
        CUDA_LAUNCHED(c);
        return;
    }
    k_rmsnorm<<<cdiv(items * 32, EW_THREADS), EW_THREADS, 0, c->stream>>>(
        (float *)out->data, out->row_stride, (const float *)x->data, x->row_stride, w->data, w->type, d, groups,
        items, eps);
    CUDA_LAUNCHED(c);
}

/* grid: y = token, x over (head, d < half) */
__global__ void k_rope(float *x, int64_t xs, int32_t n_head, int32_t hd, int32_t half, const float *inv_freq,
                       float scale, const int32_t *pos)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (e >= n_head * half)
        return;
    const int h = e / half, d = e % half;
    const float a = (float)pos[i] * inv_freq[d];
    const float cs = cosf(a) * scale, sn = sinf(a) * scale;
    float *v = x + (int64_t)i * xs + (int64_t)h * hd;
    const float x1 = v[d], x2 = v[d + half];
    v[d] = x1 * cs - x2 * sn;
    v[d + half] = x2 * cs + x1 * sn;
}

void cuda_rope(struct backend *be, struct tensor *x, int32_t n_head, int32_t head_dim, int32_t rope_dim,
               const struct tensor *inv_freq, float scale)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t half = rope_dim / 2;
    if (cuda_op_skip(c) || c->b.n_tokens == 0)
        return;
    k_rope<<<dim3(cdiv((int64_t)n_head * half, EW_THREADS), (unsigned)c->b.n_tokens), EW_THREADS, 0, c->stream>>>(
        (float *)x->data, x->row_stride, n_head, head_dim, half, (const float *)inv_freq->data, scale, c->d.pos);
    CUDA_LAUNCHED(c);
}

/* kc, vc: a bf16 cache when kv16, else f32 */
__global__ void k_kv_store(void *kc, void *vc, bool kv16, int64_t cs, const float *k, int64_t ks, const float *v,
                           int64_t vs, const int32_t *slot, int64_t cols)
{
    const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (col >= cols)
        return;
    kv_put(kc, kv16, (int64_t)slot[i] * cs + col, k[i * ks + col]);
    kv_put(vc, kv16, (int64_t)slot[i] * cs + col, v[i * vs + col]);
}

void cuda_kv_store(struct backend *be, struct tensor *kc, struct tensor *vc, const struct tensor *k,
                   const struct tensor *v)
{
    struct cuda_backend *c = cuda_of(be);
    assert(kc->row_stride == vc->row_stride && kc->type == vc->type && (kc->type == DT_F32 || kc->type == DT_BF16));
    if (cuda_op_skip(c) || c->b.n_tokens == 0)
        return;
    k_kv_store<<<ew_grid(c->b.n_tokens, k->n_cols), EW_THREADS, 0, c->stream>>>(
        kc->data, vc->data, kc->type == DT_BF16, kc->row_stride, (const float *)k->data, k->row_stride,
        (const float *)v->data, v->row_stride, c->d.slot, k->n_cols);
    CUDA_LAUNCHED(c);
}

/* attn_prep in one launch: a warp per (token, head) of q, k and v; q and k
 * heads normalised and rotated in place as k_rmsnorm and k_rope compute them
 * (the same arithmetic in the same order), k and v heads copied to the cache.
 * grid: y = token, x over groups of 4 heads (q heads, then k, then v). */
#define PREP_WARPS 4
struct prep_args {
    float *q, *k;
    const float *v;
    int64_t qs, ks, vs;
    void *kc, *vc; /* the cache: bf16 when kv16, else f32 */
    bool kv16;
    int64_t cs;
    const void *qn, *kn;
    enum dtype qn_t, kn_t;
    float eps, scale;
    int32_t n_head, n_kv_head, hd, half, n_tokens;
    const float *inv_freq;
    const int32_t *pos, *slot;
};

/* A warp takes one head of PREP_T tokens, a lane the values c = lane + 32 j
 * of each, every load of them in flight at once (loops over c issued them
 * one after another: 5% slower at 4096 tokens; 4 tokens a warp: 15%
 * slower). */
#define PREP_V (ATT_PREP_MAX_HD / 32)
#define PREP_T 2

__global__ void __launch_bounds__(PREP_WARPS * 32) k_attn_prep(const __grid_constant__ prep_args a)
{
    __shared__ float buf[PREP_WARPS][PREP_T][ATT_PREP_MAX_HD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, i0 = blockIdx.y * PREP_T;
    const int32_t item = blockIdx.x * PREP_WARPS + warp, hd = a.hd;
    /* attention's blocks are small and load their old keys before they wait:
     * let them start at once */
    grid_dep_launch();
    if (item >= a.n_head + 2 * a.n_kv_head)
        return;
    /* the batch's slots and positions, the norms and frequencies: nothing a
     * kernel of this forward writes, loaded while the product finishes */
    const int n_t = min(PREP_T, a.n_tokens - i0);
    int64_t slot[PREP_T];
#pragma unroll
    for (int t = 0; t < PREP_T; t++)
        slot[t] = t < n_t ? (int64_t)a.slot[i0 + t] * a.cs : 0;
    float xv[PREP_T][PREP_V];
    if (item >= a.n_head + a.n_kv_head) { /* a v head */
        const int64_t off = (int64_t)(item - a.n_head - a.n_kv_head) * hd;
        grid_dep_wait(); /* v: the product's */
#pragma unroll
        for (int t = 0; t < PREP_T; t++)
#pragma unroll
            for (int j = 0; j < PREP_V; j++)
                if (t < n_t && lane + 32 * j < hd)
                    xv[t][j] = a.v[(i0 + t) * a.vs + off + lane + 32 * j];
#pragma unroll
        for (int t = 0; t < PREP_T; t++)
#pragma unroll
            for (int j = 0; j < PREP_V; j++)
                if (t < n_t && lane + 32 * j < hd)
                    kv_put(a.vc, a.kv16, slot[t] + off + lane + 32 * j, xv[t][j]);
        return;
    }
    const bool is_q = item < a.n_head;
    float *x = is_q ? a.q + i0 * a.qs + (int64_t)item * hd : a.k + i0 * a.ks + (int64_t)(item - a.n_head) * hd;
    const int64_t xs = is_q ? a.qs : a.ks;
    const void *w = is_q ? a.qn : a.kn;
    const enum dtype wt = is_q ? a.qn_t : a.kn_t;
    /* bf16 (every checkpoint's norms) apart: dev_weight's switch inside the
     * unrolled loop puts each load behind its own branch, where this loop
     * issues them together */
    float wv[PREP_V];
    if (wt == DT_BF16) {
#pragma unroll
        for (int j = 0; j < PREP_V; j++)
            if (lane + 32 * j < hd)
                wv[j] = __bfloat162float(((const __nv_bfloat16 *)w)[lane + 32 * j]);
    } else {
#pragma unroll
        for (int j = 0; j < PREP_V; j++)
            if (lane + 32 * j < hd)
                wv[j] = dev_weight(w, wt, lane + 32 * j);
    }
    float fr[PREP_V / 2], p[PREP_T];
    if (a.half > 0) {
#pragma unroll
        for (int j = 0; j < PREP_V / 2; j++)
            if (lane + 32 * j < a.half)
                fr[j] = a.inv_freq[lane + 32 * j];
#pragma unroll
        for (int t = 0; t < PREP_T; t++)
            p[t] = t < n_t ? (float)a.pos[i0 + t] : 0.0f;
    }
    grid_dep_wait(); /* q and k: the product's */
#pragma unroll
    for (int t = 0; t < PREP_T; t++)
#pragma unroll
        for (int j = 0; j < PREP_V; j++)
            if (t < n_t && lane + 32 * j < hd)
                xv[t][j] = x[t * xs + lane + 32 * j];
#pragma unroll
    for (int t = 0; t < PREP_T; t++) {
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < PREP_V; j++)
            if (lane + 32 * j < hd)
                ss += xv[t][j] * xv[t][j];
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)hd + a.eps);
#pragma unroll
        for (int j = 0; j < PREP_V; j++)
            if (lane + 32 * j < hd)
                buf[warp][t][lane + 32 * j] = wv[j] * (xv[t][j] * inv);
    }
    __syncwarp();
    if (a.half > 0) {
#pragma unroll
        for (int t = 0; t < PREP_T; t++) {
            float *b = buf[warp][t];
#pragma unroll
            for (int j = 0; j < PREP_V / 2; j++) {
                const int d = lane + 32 * j;
                if (d < a.half) {
                    float sn, cs;
                    sincosf(p[t] * fr[j], &sn, &cs);
                    sn *= a.scale;
                    cs *= a.scale;
                    const float x1 = b[d], x2 = b[d + a.half];
                    b[d] = x1 * cs - x2 * sn;
                    b[d + a.half] = x2 * cs + x1 * sn;
                }
            }
        }
        __syncwarp();
    }
    const int64_t koff = (int64_t)(item - a.n_head) * hd;
#pragma unroll
    for (int t = 0; t < PREP_T; t++)
#pragma unroll
        for (int j = 0; j < PREP_V; j++) {
            const int c = lane + 32 * j;
            if (t < n_t && c < hd) {
                x[t * xs + c] = buf[warp][t][c];
                if (!is_q)
                    kv_put(a.kc, a.kv16, slot[t] + koff + c, buf[warp][t][c]);
            }
        }
}

void cuda_attn_prep(struct backend *be, struct tensor *q, struct tensor *k, const struct tensor *v,
                    struct tensor *kc, struct tensor *vc, const struct attn_prep *p)
{
    struct cuda_backend *c = cuda_of(be);
    assert(kc->row_stride == vc->row_stride && kc->type == vc->type && (kc->type == DT_F32 || kc->type == DT_BF16) &&
           p->q_norm->n_cols == p->head_dim &&
           p->k_norm->n_cols == p->head_dim && p->head_dim <= ATT_PREP_MAX_HD);
    if (cuda_op_skip(c) || c->b.n_tokens == 0)
        return;
    prep_args a = {};
    a.q = (float *)q->data;
    a.k = (float *)k->data;
    a.v = (const float *)v->data;
    a.qs = q->row_stride;
    a.ks = k->row_stride;
    a.vs = v->row_stride;
    a.kc = kc->data;
    a.vc = vc->data;
    a.kv16 = kc->type == DT_BF16;
    a.cs = kc->row_stride;
    a.qn = p->q_norm->data;
    a.kn = p->k_norm->data;
    a.qn_t = p->q_norm->type;
    a.kn_t = p->k_norm->type;
    a.eps = p->eps;
    a.scale = p->rope_scale;
    a.n_head = p->n_head;
    a.n_kv_head = p->n_kv_head;
    a.hd = p->head_dim;
    a.half = p->rope_dim / 2;
    a.n_tokens = c->b.n_tokens;
    a.inv_freq = (const float *)p->inv_freq->data;
    a.pos = c->d.pos;
    a.slot = c->d.slot;
    const int32_t items = p->n_head + 2 * p->n_kv_head;
    cuda_launch_dep(c, k_attn_prep, dim3(cdiv(items, PREP_WARPS), cdiv(c->b.n_tokens, PREP_T)), dim3(PREP_WARPS * 32), 0,
                    a);
}

enum ew_op { EW_SWIGLU, EW_ADD, EW_RELU2, EW_SIGMUL, EW_SIGMUL_COL };

/* out = op(a, b) elementwise over rows x cols */
__global__ void k_ew(enum ew_op op, float *out, int64_t os, const float *a, int64_t as, const float *b, int64_t bs,
                     int64_t cols)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= cols)
        return;
    const float x = a[r * as + c];
    float y;
    switch (op) {
    case EW_SWIGLU: y = x / (1.0f + expf(-x)) * b[r * bs + c]; break;
    case EW_ADD: y = x + b[r * bs + c]; break;
    case EW_RELU2: y = x > 0.0f ? x * x : 0.0f; break;
    case EW_SIGMUL: y = x * (1.0f / (1.0f + expf(-b[r * bs + c]))); break;
    default: y = x * (1.0f / (1.0f + expf(-b[r * bs]))); break;
    }
    out[r * os + c] = y;
}

static void ew(struct cuda_backend *c, enum ew_op op, struct tensor *out, const struct tensor *a,
               const struct tensor *b)
{
    if (cuda_op_skip(c) || out->n_rows == 0)
        return;
    k_ew<<<ew_grid(out->n_rows, out->n_cols), EW_THREADS, 0, c->stream>>>(
        op, (float *)out->data, out->row_stride, (const float *)a->data, a->row_stride,
        b ? (const float *)b->data : NULL, b ? b->row_stride : 0, out->n_cols);
    CUDA_LAUNCHED(c);
}

void cuda_swiglu(struct backend *be, struct tensor *out, const struct tensor *gate, const struct tensor *up)
{
    ew(cuda_of(be), EW_SWIGLU, out, gate, up);
}

void cuda_add(struct backend *be, struct tensor *x, const struct tensor *y) { ew(cuda_of(be), EW_ADD, x, x, y); }

void cuda_relu2(struct backend *be, struct tensor *x) { ew(cuda_of(be), EW_RELU2, x, x, NULL); }

void cuda_sigmoid_mul(struct backend *be, struct tensor *x, const struct tensor *g)
{
    assert(g->n_rows == x->n_rows && (g->n_cols == x->n_cols || g->n_cols == 1));
    ew(cuda_of(be), g->n_cols == 1 ? EW_SIGMUL_COL : EW_SIGMUL, x, x, g);
}

/* out[j] = x[rows[j]] */
__global__ void k_gather(float *out, int64_t os, const float *x, int64_t xs, const int32_t *rows, int64_t cols)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, j = blockIdx.y;
    if (c < cols)
        out[j * os + c] = x[(int64_t)rows[j] * xs + c];
}

void cuda_get_out_rows(struct backend *be, struct tensor *out, const struct tensor *x)
{
    struct cuda_backend *c = cuda_of(be);
    if (cuda_op_skip(c) || c->b.n_out == 0)
        return;
    k_gather<<<ew_grid(c->b.n_out, x->n_cols), EW_THREADS, 0, c->stream>>>(
        (float *)out->data, out->row_stride, (const float *)x->data, x->row_stride, c->d.out_rows, x->n_cols);
    CUDA_LAUNCHED(c);
}

void cuda_gather_rows(struct cuda_backend *c, struct tensor *out, const struct tensor *x, const int32_t *rows,
                      int32_t n)
{
    if (cuda_op_skip(c) || n == 0)
        return;
    k_gather<<<ew_grid(n, x->n_cols), EW_THREADS, 0, c->stream>>>((float *)out->data, out->row_stride,
                                                                    (const float *)x->data, x->row_stride, rows,
                                                                    x->n_cols);
    CUDA_LAUNCHED(c);
}

__global__ void k_permute(float *out, int64_t os, const float *x, int64_t xs, const int32_t *map, int64_t cols)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c < cols)
        out[r * os + c] = x[r * xs + map[c]];
}

void cuda_permute_cols(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *map)
{
    struct cuda_backend *c = cuda_of(be);
    assert(map->type == DT_I32 && map->n_cols == out->n_cols && out->data != x->data);
    if (cuda_op_skip(c) || x->n_rows == 0)
        return;
    k_permute<<<ew_grid(x->n_rows, out->n_cols), EW_THREADS, 0, c->stream>>>(
        (float *)out->data, out->row_stride, (const float *)x->data, x->row_stride, (const int32_t *)map->data,
        out->n_cols);
    CUDA_LAUNCHED(c);
}

static __device__ __forceinline__ float silu(float z) { return z / (1.0f + expf(-z)); }

/* VEC consecutive floats at p (VEC 4: 16-byte aligned), and VEC weights at i */
template <int VEC> static __device__ __forceinline__ void ld_vec(float *d, const float *p)
{
    if (VEC == 4) {
        const float4 v = *(const float4 *)p;
        d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
    } else {
        d[0] = *p;
    }
}
template <int VEC> static __device__ __forceinline__ void st_vec(float *p, const float *d)
{
    if (VEC == 4)
        *(float4 *)p = make_float4(d[0], d[1], d[2], d[3]);
    else
        *p = d[0];
}
template <int VEC> static __device__ __forceinline__ void w_vec(float *d, const void *w, enum dtype t, int64_t i)
{
    if (VEC == 4 && (t == DT_BF16 || t == DT_F32)) {
        const float4 v = kv_at4(w, t == DT_BF16, i);
        d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
    } else {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            d[e] = dev_weight(w, t, i + e);
    }
}

/* A team of `team` threads (32 to 256, a block's worth of teams) per (row,
 * group), each taking units of VEC consecutive columns (VEC 4: 16-byte
 * loads and stores, where the group, strides and pointers allow them). Each
 * thread loads its first V units (of the nv the group gives it) of x, z and
 * the weight at once, at clamped units and before any is used, so that no
 * load waits behind another, and keeps them for the output; a group wider
 * than V * VEC * team computes the rest twice. */
template <int V, int VEC>
__global__ void __launch_bounds__(256) k_rmsnorm_gated(float *out, int64_t os, const float *x, int64_t xs,
                                                       const float *z, int64_t zs, const void *w, enum dtype wt,
                                                       bool w_full, int32_t group, int64_t groups, int64_t n_items,
                                                       float eps, bool gate_first, int32_t team)
{
    __shared__ float part[8];
    const int32_t lane = threadIdx.x % team, tw = team / 32, n_u = group / VEC, nv = (n_u + team - 1) / team;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x / team) + threadIdx.x / team;
    const bool ok = item < n_items;
    const int64_t r = ok ? item / groups : 0, g0 = ok ? (item % groups) * group : 0, w0 = w_full ? g0 : 0;
    const float *a = x + r * xs + g0, *zr = z + r * zs + g0;
    float t[V][VEC], zv[V][VEC], wv[V][VEC], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++)
        if (j < nv)
            w_vec<VEC>(wv[j], w, wt, w0 + min(lane + j * team, n_u - 1) * VEC);
    grid_dep_wait(); /* x and z: the layer's scan and product */
#pragma unroll
    for (int j = 0; j < V; j++)
        if (j < nv) {
            const int32_t c = min(lane + j * team, n_u - 1) * VEC;
            ld_vec<VEC>(t[j], a + c);
            ld_vec<VEC>(zv[j], zr + c);
        }
    grid_dep_launch();
#pragma unroll
    for (int j = 0; j < V; j++)
        if (j < nv) {
            const bool in = ok && lane + j * team < n_u;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                t[j][e] = in ? (gate_first ? t[j][e] * silu(zv[j][e]) : t[j][e]) : 0.0f;
                ss += t[j][e] * t[j][e];
            }
        }
    for (int32_t u = lane + V * team; ok && u < n_u; u += team) {
        float av[VEC], zz[VEC];
        ld_vec<VEC>(av, a + u * VEC);
        ld_vec<VEC>(zz, zr + u * VEC);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const float v = gate_first ? av[e] * silu(zz[e]) : av[e];
            ss += v * v;
        }
    }
    ss = warp_sum(ss);
    if (tw > 1) { /* the team's warps: consecutive warps of the block */
        if ((threadIdx.x & 31) == 0)
            part[threadIdx.x >> 5] = ss;
        __syncthreads();
        ss = 0.0f;
        for (int k = 0; k < tw; k++)
            ss += part[(threadIdx.x / team) * tw + k];
    }
    if (!ok)
        return;
    const float inv = 1.0f / sqrtf(ss / (float)group + eps);
    float *o = out + r * os + g0;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int32_t u = lane + j * team;
        if (j < nv && u < n_u) {
            float ov[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const float v = wv[j][e] * (t[j][e] * inv);
                ov[e] = gate_first ? v : v * silu(zv[j][e]);
            }
            st_vec<VEC>(o + u * VEC, ov);
        }
    }
    for (int32_t u = lane + V * team; u < n_u; u += team) {
        float av[VEC], zz[VEC], ww[VEC], ov[VEC];
        ld_vec<VEC>(av, a + u * VEC);
        ld_vec<VEC>(zz, zr + u * VEC);
        w_vec<VEC>(ww, w, wt, w0 + u * VEC);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const float v = ww[e] * ((gate_first ? av[e] * silu(zz[e]) : av[e]) * inv);
            ov[e] = gate_first ? v : v * silu(zz[e]);
        }
        st_vec<VEC>(o + u * VEC, ov);
    }
}

void cuda_rmsnorm_gated(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *z,
                        const struct tensor *w, float eps, int64_t group, bool gate_first)
{
    struct cuda_backend *c = cuda_of(be);
    assert(x->n_cols % group == 0 && (w->n_cols == group || w->n_cols == x->n_cols) && group <= INT32_MAX);
    const int64_t groups = x->n_cols / group, items = x->n_rows * groups;
    if (cuda_op_skip(c) || items == 0)
        return;
    const bool vec = group % 4 == 0 && out->row_stride % 4 == 0 && x->row_stride % 4 == 0 &&
                     z->row_stride % 4 == 0 &&
                     ((uintptr_t)out->data | (uintptr_t)x->data | (uintptr_t)z->data | (uintptr_t)w->data) % 16 == 0;
    const int64_t n_u = vec ? group / 4 : group;
    const int32_t v_max = vec ? 2 : 16;
    int32_t team = 32;
    while (team < 256 && (int64_t)team * v_max < n_u)
        team *= 2;
    const int64_t nv = (n_u + team - 1) / team;
    void (*k)(float *, int64_t, const float *, int64_t, const float *, int64_t, const void *, enum dtype, bool,
              int32_t, int64_t, int64_t, float, bool, int32_t) =
        vec      ? (nv <= 2 ? k_rmsnorm_gated<2, 4> : k_rmsnorm_gated<4, 4>)
        : nv <= 4 ? k_rmsnorm_gated<4, 1>
        : nv <= 8 ? k_rmsnorm_gated<8, 1>
                  : k_rmsnorm_gated<16, 1>;
    cuda_launch_dep(c, k, dim3((unsigned)cdiv(items * team, 256)), dim3(256), 0, (float *)out->data, out->row_stride,
                    (const float *)x->data, x->row_stride, (const float *)z->data, z->row_stride, w->data, w->type,
                    w->n_cols != group, (int32_t)group, groups, items, eps, gate_first, team);
}
