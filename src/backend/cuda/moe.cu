/* moe: expert routing and the routed experts on the GPU.
 *
 * Routing: a warp per token, the cpu's choices (ties to the lower index);
 * without group limits from registers with the softmax summed as a tree (the
 * weights may differ from the cpu's in the last bits), with them from shared
 * memory with the cpu's sums in its order. The experts run as the reference
 * sums them: each token adds its experts' outputs in increasing expert
 * order, as on the cpu.
 *
 * Up to CUDA_SMALL_N tokens (decoding, trees) everything stays on the
 * device, so these forwards can be recorded as graphs: the last routing
 * block to finish turns the routed ids into per-expert lists of compact rows
 * (MOE_PLAN_*), one grouped product computes gate and up of every active
 * expert, one the down projections (with SwiGLU or relu^2 applied while
 * staging), and a combine kernel sums each token's rows (into the residual
 * when the block adds to it). The expert weight pointers live in a table
 * on the device per layer, built the first time the layer runs. Larger
 * batches build the same lists on the host (the ids copied back, a counting
 * sort), gather every expert's rows at once, run each expert's products over
 * its slice (bf16 experts: cuBLAS on inputs rounded to bf16 once, the slices
 * padded to a few sizes and the experts of one size in one batched call;
 * on Hopper in fast mode moe_gemm.cu's grouped products over unpadded
 * slices) and the activation and combine over the whole list. */
#include "cuda_impl.h"

#include <cuda.h>

extern "C" {
#include "moe_sort.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MOE_MAX_EXPERT 1024
#define MOE_MAX_K 32 /* picks per token */

/* A layer's expert weight pointers on the device: [3][n_expert] (gate, up,
 * down; gate NULL for relu^2 experts), and the host copy they are checked
 * against, so that a model loaded where another was never finds its table;
 * the weights' tensor maps for moe_gemm.cu, made at their first need. */
struct moe_table {
    const struct tensor *up;
    int32_t n_expert;
    const void **host;
    const uint16_t **dev;
    void *maps; /* cuda_moe_gemm_maps' [3][n_expert], or NULL */
};

static __device__ int64_t route_best(const float *p, int64_t E, const int32_t *taken, int32_t n_taken,
                                     const uint8_t *allowed)
{
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++) {
        int t = 0;
        for (int32_t q = 0; q < n_taken; q++)
            t |= taken[q] == e;
        if (!t && (!allowed || allowed[e]) && (best < 0 || p[e] > p[best]))
            best = e;
    }
    return best;
}

struct route_args {
    int32_t *ids;
    int64_t is;
    float *w;
    int64_t wst;
    float *logits; /* written by k_moe_gate, read by the routing */
    int64_t ls;
    int64_t n, E;
    int32_t k, n_group, topk_group;
    bool sigmoid, norm, spread;
    const void *bias;
    enum dtype bias_t;
    float scale;
    /* the small path: the plan (MOE_PLAN_*) built by the last block to
     * finish, found by its arrival count; plan NULL on the large path */
    int32_t *plan;
    unsigned *count;
    int32_t max_act;
};

/* The routing plan (MOE_PLAN_*) of n <= 64 tokens, k experts each, by one
 * block, from the routed ids and weights sid, sw [n][k] in shared memory
 * (staged here from the routing's outputs when `staged` is false: other
 * blocks' writes, read from L2 all at once): counts and token masks per
 * expert, scans by one warp, then each (token, pick) finds its compact row
 * from the mask (tokens in increasing order) and its place among the
 * token's picks (experts in increasing order). */
static __device__ void moe_plan_build(const route_args &a, int32_t *sid, float *sw, bool staged)
{
    __shared__ int32_t cnt[MOE_MAX_EXPERT], start[MOE_MAX_EXPERT];
    __shared__ unsigned long long mask[MOE_MAX_EXPERT];
    const int tid = threadIdx.x, k = a.k, E = (int)a.E, nk = (int)a.n * k, max_act = a.max_act;
    int32_t *plan = a.plan, *rows = plan + MOE_PLAN_ROWS(max_act), *tpos = rows + nk;
    float *tw = (float *)(tpos + nk);
    for (int e = tid; e < E; e += blockDim.x) {
        cnt[e] = 0;
        mask[e] = 0;
    }
    for (int i = tid; i < nk && !staged; i += blockDim.x) {
        sid[i] = __ldcg(a.ids + (i / k) * a.is + i % k);
        sw[i] = __ldcg(a.w + (i / k) * a.wst + i % k);
    }
    __syncthreads();
    for (int i = tid; i < nk; i += blockDim.x) {
        const int r = i / k, e = sid[i];
        atomicAdd(&cnt[e], 1);
        atomicOr(&mask[e], 1ull << r);
    }
    __syncthreads();
    if (tid < 32) {
        const int per = (E + 31) / 32, e0 = tid * per, e1 = min(E, e0 + per);
        int rs = 0, as = 0;
        for (int e = e0; e < e1; e++) {
            rs += cnt[e];
            as += cnt[e] > 0;
        }
        int ri = rs, ai = as;
        for (int o = 1; o < 32; o <<= 1) {
            const int rv = __shfl_up_sync(0xffffffffu, ri, o), av = __shfl_up_sync(0xffffffffu, ai, o);
            if (tid >= o) {
                ri += rv;
                ai += av;
            }
        }
        int pos = ri - rs, slot = ai - as;
        for (int e = e0; e < e1; e++) {
            start[e] = pos;
            if (cnt[e] > 0) {
                plan[MOE_PLAN_EXPERT + slot] = e;
                plan[MOE_PLAN_BEG(max_act) + slot] = pos;
                slot++;
            }
            pos += cnt[e];
        }
        if (tid == 31) {
            plan[0] = ai;
            plan[MOE_PLAN_BEG(max_act) + ai] = nk;
        }
    }
    __syncthreads();
    for (int i = tid; i < nk; i += blockDim.x) {
        const int r = i / k;
        const int32_t *id = sid + r * k;
        const int e = sid[i];
        const int p = start[e] + __popcll(mask[e] & ((1ull << r) - 1));
        int order = 0;
        for (int j = 0; j < k; j++)
            order += id[j] < e;
        rows[p] = r;
        tpos[r * k + order] = p;
        tw[r * k + order] = sw[i];
    }
}

/* The plan of one token (a decode step), by its routing warp alone: the
 * plan moe_plan_build makes of it, without the block's scans and waits.
 * sid, sw [k]: the token's routed ids and weights; each expert has one
 * row, its place among the ids in increasing order. */
static __device__ void moe_plan_one(const route_args &a, const int32_t *sid, const float *sw)
{
    const int lane = threadIdx.x & 31, k = a.k;
    const int32_t id = lane < k ? sid[lane] : 0;
    int rank = 0;
    for (int j = 0; j < k; j++)
        rank += __shfl_sync(0xffffffffu, id, j) < id;
    int32_t *plan = a.plan, *rows = plan + MOE_PLAN_ROWS(a.max_act), *tpos = rows + k;
    float *tw = (float *)(tpos + k);
    if (lane < k) {
        plan[MOE_PLAN_EXPERT + rank] = id;
        plan[MOE_PLAN_BEG(a.max_act) + rank] = rank;
        rows[rank] = 0;
        tpos[rank] = rank;
        tw[rank] = sw[lane];
    }
    if (lane == 0) {
        plan[0] = k;
        plan[MOE_PLAN_BEG(a.max_act) + k] = k;
    }
}

/* A float's order as an unsigned key (-0 taken as +0), above 0: the key
 * of no candidate. */
static __device__ __forceinline__ unsigned route_key(float v)
{
    const unsigned b = __float_as_uint(v + 0.0f);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

/* The warp's best candidate: each lane offers expert idx (-1: none) of
 * value v; the largest value wins, ties to the lower index. */
static __device__ __forceinline__ int route_warp_best(int idx, float v)
{
    const unsigned key = idx < 0 ? 0u : route_key(v), top = __reduce_max_sync(0xffffffffu, key);
    return (int)__reduce_min_sync(0xffffffffu, idx >= 0 && key == top ? (unsigned)idx : 0xffffffffu);
}

/* A pick's routing weight from its probability w and the picks' sum. */
static __device__ __forceinline__ float route_weight(const route_args &a, float w, float wsum)
{
    return (a.norm ? w / (wsum + (a.sigmoid ? 1e-20f : 0.0f)) : w) * a.scale;
}

/* Lane's best allowed expert (lane, lane+32, ...; ties: the lower index), -1 if none. */
static __device__ __forceinline__ int route_lane_best(const float *choice, const uint8_t *allowed, int E, int lane,
                                                      float *bv)
{
    int best = -1;
    for (int e = lane; e < E; e += 32)
        if (allowed[e] && (best < 0 || choice[e] > *bv))
            best = e, *bv = choice[e];
    return best;
}

/* The routing of token r by one warp, into its ids and weights (lanes < k
 * store them). The scores are computed element by element as on the cpu,
 * the softmax sum by one lane in index order (the cpu's rounding); each pick
 * is the largest of the lanes' best allowed, not yet taken experts (ties:
 * lower index), which is what the cpu's scan for the strictly largest finds:
 * two warp reductions a pick, then only the picked lane looks again. Lane j
 * keeps pick j. p, choice, gs: [E] floats, gsel [E], allowed [E], the warp's
 * own; the logits may be this grid's writes (read from L2). */
static __device__ void route_one(const route_args &a, int64_t r, float *p, float *choice, float *gs, int32_t *gsel,
                                 uint8_t *allowed)
{
    const int lane = threadIdx.x & 31, E = (int)a.E;
    const float *x = a.logits + r * a.ls;
    if (a.sigmoid) {
        for (int e = lane; e < E; e += 32) {
            p[e] = 1.0f / (1.0f + expf(-__ldcg(x + e)));
            choice[e] = p[e] + (a.bias ? dev_weight(a.bias, a.bias_t, e) : 0.0f);
        }
    } else {
        float mx = -INFINITY;
#pragma unroll 4
        for (int e = lane; e < E; e += 32) {
            const float v = __ldcg(x + e);
            p[e] = v;
            mx = v > mx ? v : mx;
        }
        mx = warp_max(mx);
        for (int e = lane; e < E; e += 32)
            p[e] = expf(p[e] - mx);
        __syncwarp();
        float sum = 0.0f;
        if (lane == 0) {
#pragma unroll 8
            for (int e = 0; e < E; e++)
                sum += p[e];
        }
        sum = __shfl_sync(0xffffffffu, sum, 0);
        for (int e = lane; e < E; e += 32)
            choice[e] = p[e] /= sum;
    }
    for (int e = lane; e < E; e += 32)
        allowed[e] = 1;
    __syncwarp();
    if (a.sigmoid && a.topk_group < a.n_group) {
        const int per = E / a.n_group;
        for (int32_t g = lane; g < a.n_group; g += 32) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++)
                if (choice[e] > b1)
                    b2 = b1, b1 = choice[e];
                else if (choice[e] > b2)
                    b2 = choice[e];
            gs[g] = b1 + (per > 1 ? b2 : 0.0f);
        }
        __syncwarp();
        if (lane == 0) {
            for (int e = 0; e < E; e++)
                allowed[e] = 0;
            for (int32_t j = 0; j < a.topk_group; j++) {
                gsel[j] = (int32_t)route_best(gs, a.n_group, gsel, j, NULL);
                for (int e = gsel[j] * per; e < (gsel[j] + 1) * per; e++)
                    allowed[e] = 1;
            }
        }
        __syncwarp();
    }
    float lv = 0.0f, wsum = 0.0f, my_w = 0.0f;
    int lb = route_lane_best(choice, allowed, E, lane, &lv), my_id = 0;
    for (int32_t j = 0; j < a.k; j++) {
        const int best = route_warp_best(lb, lv);
        const float pv = p[best];
        wsum += pv;
        if (lane == j) {
            my_id = best;
            my_w = pv;
        }
        if ((best & 31) == lane) {
            allowed[best] = 0;
            lb = route_lane_best(choice, allowed, E, lane, &lv);
        }
    }
    if (lane < a.k) {
        a.ids[r * a.is + lane] = a.spread ? MOE_SPREAD_ID(r, lane, E, a.k) : my_id;
        a.w[r * a.wst + lane] = route_weight(a, my_w, wsum);
    }
    __syncwarp();
}

/* The routing of token r without group limits by one warp, as route_one
 * picks, from registers: lane l holds experts l + 32 i, i < R (E <= 32 R).
 * The softmax's sum is a tree of the lanes' sums (the cpu sums in index
 * order: the weights may differ in the last bits, the picks not). Each pick
 * takes the largest of the lanes' best live experts (ties: the lower
 * index), two warp reductions; the winning lane clears its bit. The ids and
 * weights go to the routing's outputs and, given sid and sw, to those [k]
 * entries in shared memory too. */
template <int R>
static __device__ void route_regs(const route_args &a, int64_t r, int32_t *sid, float *sw)
{
    const int lane = threadIdx.x & 31, E = (int)a.E;
    const float *x = a.logits + r * a.ls;
    float p[R], ch[R];
    unsigned live = 0;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int e = lane + 32 * i;
        p[i] = e < E ? __ldcg(x + e) : -INFINITY;
        live |= e < E ? 1u << i : 0u;
    }
    if (a.sigmoid) {
#pragma unroll
        for (int i = 0; i < R; i++) {
            p[i] = 1.0f / (1.0f + expf(-p[i]));
            ch[i] = p[i] + (a.bias && lane + 32 * i < E ? dev_weight(a.bias, a.bias_t, lane + 32 * i) : 0.0f);
        }
    } else {
        float mx = p[0], sum = 0.0f;
#pragma unroll
        for (int i = 1; i < R; i++)
            mx = fmaxf(mx, p[i]);
        mx = warp_max(mx);
#pragma unroll
        for (int i = 0; i < R; i++) {
            p[i] = expf(p[i] - mx);
            sum += p[i];
        }
        sum = warp_sum(sum);
#pragma unroll
        for (int i = 0; i < R; i++)
            ch[i] = p[i] /= sum;
    }
    float wsum = 0.0f, my_w = 0.0f;
    int my_id = 0;
    for (int32_t j = 0; j < a.k; j++) {
        float bv = 0.0f, bp = 0.0f;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < R; i++)
            if ((live >> i & 1u) && (bi < 0 || ch[i] > bv)) {
                bv = ch[i];
                bp = p[i];
                bi = i;
            }
        const int best = route_warp_best(bi < 0 ? -1 : lane + 32 * bi, bv);
        if ((best & 31) == lane)
            live &= ~(1u << bi);
        const float pv = __shfl_sync(0xffffffffu, bp, best & 31);
        wsum += pv;
        if (lane == j) {
            my_id = best;
            my_w = pv;
        }
    }
    if (lane < a.k) {
        const float w = route_weight(a, my_w, wsum);
        if (a.spread)
            my_id = MOE_SPREAD_ID(r, lane, E, a.k);
        a.ids[r * a.is + lane] = my_id;
        a.w[r * a.wst + lane] = w;
        if (sid) {
            sid[lane] = my_id;
            sw[lane] = w;
        }
    }
    __syncwarp();
}

/* Whether route_regs takes the routing: no group limit. */
static __device__ __forceinline__ bool route_in_regs(const route_args &a)
{
    return !(a.sigmoid && a.topk_group < a.n_group);
}

/* route_regs with R fitted to the experts (E <= MOE_MAX_EXPERT). */
static __device__ void route_regs_any(const route_args &a, int64_t r, int32_t *sid, float *sw)
{
    if (a.E <= 128)
        route_regs<4>(a, r, sid, sw);
    else if (a.E <= 256)
        route_regs<8>(a, r, sid, sw);
    else if (a.E <= 512)
        route_regs<16>(a, r, sid, sw);
    else
        route_regs<32>(a, r, sid, sw);
}
static_assert(MOE_MAX_EXPERT <= 32 * 32, "route_regs holds at most 32 experts a lane");

/* One warp per token (route_one). With a plan to make, the last block to
 * finish makes it: one release-acquire arrival per block. */
__global__ void k_moe_route(const __grid_constant__ route_args a)
{
    /* route_one's p, choice, gs and gsel, then the plan's ids and weights [n][k] */
    __shared__ float scr[4 * MOE_MAX_EXPERT];
    __shared__ uint8_t allowed[MOE_MAX_EXPERT];
    __shared__ int is_last;
    static_assert(2 * CUDA_SMALL_N * MOE_MAX_K <= 4 * MOE_MAX_EXPERT, "the plan's ids and weights fit the scratch");
    grid_dep_wait(); /* the logits: the router product's */
    grid_dep_launch();
    if (route_in_regs(a))
        route_regs_any(a, blockIdx.x, NULL, NULL);
    else
        route_one(a, blockIdx.x, scr, scr + MOE_MAX_EXPERT, scr + 2 * MOE_MAX_EXPERT,
                  (int32_t *)(scr + 3 * MOE_MAX_EXPERT), allowed);
    if (!a.plan)
        return;
    if (threadIdx.x == 0) {
        unsigned old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(a.count) : "memory");
        is_last = old == gridDim.x - 1;
    }
    __syncwarp();
    if (!is_last)
        return;
    moe_plan_build(a, (int32_t *)scr, scr + CUDA_SMALL_N * MOE_MAX_K, false);
    if (threadIdx.x == 0)
        *a.count = 0;
}

/* The fused gate of up to MOE_GATE_N tokens: x's RMSNorm, the router's
 * product, the routing and the plan, in one launch (a decode step's gate was
 * four kernels, mostly latency). A warp per expert holds its router row in
 * registers and the block the norm in shared memory, both loaded before
 * waiting for x. Each block stages every token's x, sums its squares (a
 * warp a token), scales it in place to h as the cpu does, writes its slice
 * of h and its experts' logits (fp32 products of h as written); the last
 * block to arrive routes the tokens, a warp each, and builds the plan (a
 * lone token's warp alone: moe_plan_one).
 * Larger batches (up to CUDA_SMALL_N) come in chunks of MOE_GATE_N tokens,
 * blockIdx.y a chunk, without the routing: k_moe_route routes them with the
 * same function, so a token's h, logits and picks have the same bits in
 * any batch (a tree's token as decoded alone). */
#define MOE_GATE_N 8
#define MOE_GATE_KC 16 /* a lane's chunks of 8 router weights: K <= 4096 */
struct gate_args {
    route_args r;
    const float *x;
    int64_t xs;
    float *h;
    int64_t hs;
    const void *norm;
    enum dtype norm_t;
    float eps;
    const uint16_t *router; /* bf16 [E][K] */
    int64_t rs;
    int32_t K;
    bool route; /* one chunk: the last block routes and plans */
};

/* dynamic shared memory: the norm [K] floats, then the tokens' h [n][K]
 * floats, which the routing scratch of n warps (E * 17 bytes each) reuses */
static size_t moe_gate_smem(int64_t n, int64_t K, int64_t E)
{
    const int64_t hb = n * K * 4, rb = n * E * (4 * 4 + 1);
    return (size_t)(K * 4 + (hb > rb ? hb : rb));
}

__global__ void __launch_bounds__(MOE_GATE_N * 32) k_moe_gate(const __grid_constant__ gate_args a)
{
    extern __shared__ float4 gate_smem[];
    __shared__ float inv[MOE_GATE_N];
    __shared__ int32_t sid[MOE_GATE_N * MOE_MAX_K]; /* the plan's [n][k] */
    __shared__ float sw[MOE_GATE_N * MOE_MAX_K];
    __shared__ int is_last;
    const int t0 = blockIdx.y * MOE_GATE_N; /* the chunk's first token */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = a.K, K4 = K / 4, nc = K / 8,
              n = min(MOE_GATE_N, (int)a.r.n - t0);
    const int E = (int)a.r.E, e = blockIdx.x * MOE_GATE_N + warp;
    float *nw = (float *)gate_smem, *hv = nw + K;
    float4 *hv4 = (float4 *)hv;
    uint4 wr[MOE_GATE_KC];
#pragma unroll
    for (int i = 0; i < MOE_GATE_KC; i++) {
        const int c = lane + 32 * i;
        wr[i] = e < E && c < nc ? *(const uint4 *)(a.router + (int64_t)e * a.rs + 8 * c) : make_uint4(0, 0, 0, 0);
    }
    for (int c = threadIdx.x; c < K; c += blockDim.x)
        nw[c] = dev_weight(a.norm, a.norm_t, c);
    grid_dep_wait(); /* x: the residual the previous kernels wrote */
    grid_dep_launch();
    for (int i = threadIdx.x; i < n * K4; i += blockDim.x)
        hv4[i] = *(const float4 *)(a.x + (t0 + i / K4) * a.xs + 4 * (i % K4));
    __syncthreads();
    if (warp < n) {
        float ss = 0.0f;
        for (int c = lane; c < K4; c += 32) {
            const float4 v = hv4[warp * K4 + c];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = warp_sum(ss);
        if (lane == 0)
            inv[warp] = 1.0f / sqrtf(ss / (float)K + a.eps);
    }
    __syncthreads();
    const int cw = (K4 + (int)gridDim.x - 1) / (int)gridDim.x, c0 = blockIdx.x * cw, c1 = min(K4, c0 + cw);
    for (int i = threadIdx.x; i < n * K4; i += blockDim.x) {
        const int t = i / K4, c = i % K4;
        const float it = inv[t];
        float4 v = hv4[i];
        v.x = nw[4 * c] * (v.x * it);
        v.y = nw[4 * c + 1] * (v.y * it);
        v.z = nw[4 * c + 2] * (v.z * it);
        v.w = nw[4 * c + 3] * (v.w * it);
        hv4[i] = v;
        if (c >= c0 && c < c1)
            *(float4 *)(a.h + (t0 + t) * a.hs + 4 * c) = v;
    }
    __syncthreads();
    for (int t = 0; t < n; t++) {
        const float *ht = hv + t * K;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MOE_GATE_KC; i++) {
            const int c = lane + 32 * i;
            if (c < nc) {
                const float4 x0 = *(const float4 *)(ht + 8 * c), x1 = *(const float4 *)(ht + 8 * c + 4);
                const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                const __nv_bfloat16 *wb = (const __nv_bfloat16 *)&wr[i];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    s += __bfloat162float(wb[j]) * xv[j];
            }
        }
        s = warp_sum(s);
        if (lane == 0 && e < E)
            a.r.logits[(t0 + t) * a.r.ls + e] = s;
    }
    if (!a.route)
        return;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(a.r.count) : "memory");
        is_last = old == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last)
        return;
    const bool regs = route_in_regs(a.r);
    if (n == 1 && regs) { /* a decode step: one warp routes and plans */
        if (warp == 0) {
            route_regs_any(a.r, 0, sid, sw);
            moe_plan_one(a.r, sid, sw);
            if (lane == 0)
                *a.r.count = 0;
        }
        return;
    }
    if (warp < n && regs)
        route_regs_any(a.r, warp, sid + warp * a.r.k, sw + warp * a.r.k);
    else if (warp < n) {
        float *p = hv + (size_t)warp * E * 4;
        route_one(a.r, warp, p, p + E, p + 2 * E, (int32_t *)(p + 3 * E),
                  (uint8_t *)(hv + (size_t)n * E * 4) + (size_t)warp * E);
    }
    __syncthreads();
    moe_plan_build(a.r, sid, sw, regs);
    if (threadIdx.x == 0)
        *a.r.count = 0;
}

int cuda_moe_init(struct cuda_backend *c)
{
    /* the gate's largest case: MOE_GATE_N tokens of the widest input, or their routing over the most experts */
    const size_t smem = moe_gate_smem(MOE_GATE_N, 32 * 8 * MOE_GATE_KC, MOE_MAX_EXPERT);
    return CUDA_CHECK(c, cudaFuncSetAttribute(k_moe_gate, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

/* The routing's arguments for mb's logits (and, plan given, the plan of
 * the small path: c's last counter counts the blocks' arrivals). */
static route_args moe_route_args(struct cuda_backend *c, const struct moe_block *mb, int32_t *plan, int32_t max_act)
{
    const struct tensor *lg = mb->logits;
    const struct moe_routing *rt = &mb->rt;
    assert(lg->n_cols <= MOE_MAX_EXPERT && lg->n_cols % rt->n_group == 0 && rt->k <= MOE_MAX_K &&
           rt->k <= rt->topk_group * (lg->n_cols / rt->n_group));
    const route_args a = {
        (int32_t *)mb->ids->data, mb->ids->row_stride, (float *)mb->weights->data, mb->weights->row_stride,
        (float *)lg->data, lg->row_stride, lg->n_rows, lg->n_cols, rt->k, rt->n_group, rt->topk_group,
        rt->sigmoid, rt->norm, rt->spread, rt->bias ? rt->bias->data : NULL, rt->bias ? rt->bias->type : DT_F32,
        rt->scale, plan, c->counters + CUDA_MOE_COUNTER, max_act,
    };
    return a;
}

/* The routing of the logits into ids and weights (and the plan, given one). */
static void moe_route(struct cuda_backend *c, const struct moe_block *mb, int32_t *plan, int32_t max_act)
{
    cuda_launch_dep(c, k_moe_route, dim3((unsigned)mb->logits->n_rows), dim3(32), 0,
                    moe_route_args(c, mb, plan, max_act));
}

/* out[r] (+)= the sum over r's picks, in increasing expert order, of
 * weight * y[row], plus add[r] (a shared expert's rows) when given, added to
 * out once whole, as the cpu adds it; y fp32 or
 * (the grouped products') bf16; V columns a thread (4 where every row
 * starts 16-byte aligned: the combine reads k rows of y for each row it
 * writes, the most bytes of a large MoE batch's memory-bound kernels). */
template <typename T, int V>
__global__ void k_moe_combine(float *out, int64_t os, const T *y, int64_t ys, const int32_t *tpos, const float *tw,
                              int32_t k, int64_t cols, const float *add, int64_t as, bool accumulate)
{
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V, r = blockIdx.y;
    if (c >= cols)
        return;
    float o[V] = {};
    for (int32_t j = 0; j < k; j++) {
        const float wj = tw[r * k + j];
        const T *yr = y + (int64_t)tpos[r * k + j] * ys + c;
        float v[V];
        if (V == 4 && sizeof(T) == 4) {
            const float4 f = *(const float4 *)yr;
            v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else if (V == 4) {
            const uint2 u = *(const uint2 *)yr;
            const float4 f = bf16x4(u.x, u.y);
            v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
            v[0] = (float)yr[0];
        }
        for (int q = 0; q < V; q++)
            o[q] += wj * v[q];
    }
    for (int32_t q = 0; q < V; q++) {
        if (add)
            o[q] += add[r * as + c + q];
        out[r * os + c + q] = accumulate ? out[r * os + c + q] + o[q] : o[q];
    }
}

template <typename T>
static void moe_combine(struct cuda_backend *c, struct tensor *out, const T *y, const int32_t *tpos, const float *tw,
                        int32_t k, const struct tensor *add, bool accumulate)
{
    const int64_t cols = out->n_cols;
    const float *ad = add ? (const float *)add->data : NULL;
    const int64_t as = add ? add->row_stride : 0;
    if (cols % 4 == 0 && out->row_stride % 4 == 0 && ((uintptr_t)out->data & 15) == 0 &&
        ((uintptr_t)y & (4 * sizeof(T) - 1)) == 0)
        k_moe_combine<T, 4><<<dim3(cdiv(cols / 4, 256), (unsigned)out->n_rows), 256, 0, c->stream>>>(
            (float *)out->data, out->row_stride, y, cols, tpos, tw, k, cols, ad, as, accumulate);
    else
        k_moe_combine<T, 1><<<dim3(cdiv(cols, 256), (unsigned)out->n_rows), 256, 0, c->stream>>>(
            (float *)out->data, out->row_stride, y, cols, tpos, tw, k, cols, ad, as, accumulate);
    CUDA_LAUNCHED(c);
}

/* Whether every expert matrix is bf16, 16-byte aligned, with one row
 * stride per projection: what the grouped products take. */
static bool moe_bf16(const struct moe_experts *ex)
{
    const struct tensor *mats[3] = {ex->gate, ex->up, ex->down};
    for (int m = 0; m < 3; m++)
        for (int32_t e = 0; mats[m] && e < ex->n_expert; e++) {
            const struct tensor *t = &mats[m][e];
            if (t->type != DT_BF16 || t->row_stride != mats[m][0].row_stride || t->row_stride % 8 != 0 ||
                ((uintptr_t)t->data & 15) != 0)
                return false;
        }
    return !ex->gate || ex->gate[0].row_stride == ex->up[0].row_stride;
}

/* A large batch's experts in bf16 as batched cuBLAS products over the
 * list moe_sort_build makes: experts whose slices have one padded size (a
 * bucket) share one cublasGemmBatchedEx call a product (a few calls where
 * one GEMM an expert made 384 a layer for qwen3-30b-a3b at 4096 tokens,
 * each too small to fill the GPU and quicker to run than to enqueue). A
 * product runs `width` weights of each expert in one call a bucket (gate
 * and up, which share the input: width 2; down: width 1): d_ptr, on the
 * device, holds its weight, input and output pointers [3][width * n_act],
 * bucket b's entries from width * beg[b], each weight's experts in the
 * bucket's order. moe_gemms runs the product whose pointers start at ptr:
 * out = beta * out + x . w^T for every entry, one batched call a bucket. */
static int moe_gemms(struct cuda_backend *c, const struct moe_sort *s, void *const *ptr, int32_t width, int64_t K,
                     int64_t ws, int64_t M, float beta)
{
    const int64_t n_e = (int64_t)width * s->n_act;
    for (int32_t b = 0; b < s->n_bucket; b++) {
        const int64_t i = (int64_t)width * s->beg[b];
        if (cuda_gemm_bf16_batched(c, (float *const *)(ptr + 2 * n_e + i), M,
                                   (const __nv_bfloat16 *const *)(ptr + n_e + i), s->n_rows[b], K,
                                   (const void *const *)(ptr + i), ws, M, beta,
                                   width * (s->beg[b + 1] - s->beg[b])) != 0)
            return -1;
    }
    return 0;
}

/* The experts of a large batch in bf16: the padded compact rows gathered
 * and rounded to bf16 once (hi, and lo when precise: a second product adds
 * it), gate and up, the activation rounded the same way, down. Products,
 * in d_ptr's order (moe_ptrs_fill): gate (if any) and up together, hi then
 * lo when precise, then down's passes.
 * xb: room for [n_pad][max(hidden, inter)] floats, used as bf16 pairs. */
static void moe_ffn_bf16(struct cuda_backend *c, const struct moe_experts *ex, const struct moe_sort *s,
                         void *const *d_ptr, const int32_t *d_rows, const struct tensor *x, float *xb, float *g,
                         float *u)
{
    const int64_t hidden = x->n_cols, inter = ex->up[0].n_rows, n_pad = s->n_pad;
    __nv_bfloat16 *hi = (__nv_bfloat16 *)xb, *lo = c->precise ? hi + n_pad * hidden : NULL;
    const int32_t passes = lo ? 2 : 1, n_in = ex->gate ? 2 : 1;
    void *const *ptr = d_ptr;
    cuda_gather_bf16(c, (const float *)x->data, x->row_stride, d_rows, n_pad, hidden, hi, lo);
    for (int32_t pass = 0; pass < passes; pass++, ptr += 3 * n_in * s->n_act)
        if (moe_gemms(c, s, ptr, n_in, hidden, ex->up[0].row_stride, inter, pass ? 1.0f : 0.0f) != 0)
            return;
    const struct tensor ut = {DT_F32, n_pad, inter, inter, u, false};
    const struct mm_fused act = {ex->gate ? MM_PRE_SWIGLU : MM_PRE_RELU2, NULL, 0.0f, &ut, false, NULL, NULL};
    lo = c->precise ? hi + n_pad * inter : NULL;
    cuda_pre_split(c, ex->gate ? g : u, inter, n_pad, (int32_t)inter, &act, hi, lo);
    for (int32_t pass = 0; pass < passes; pass++, ptr += 3 * s->n_act)
        if (moe_gemms(c, s, ptr, 1, inter, ex->down[0].row_stride, hidden, pass ? 1.0f : 0.0f) != 0)
            return;
}

static struct moe_table *moe_table_get(struct cuda_backend *c, const struct moe_experts *ex);

/* Whether every expert matrix of a projection has one block type and one
 * row stride: what cuda_matmul_q_grouped takes. */
static bool moe_quant(const struct moe_experts *ex)
{
    const struct tensor *mats[3] = {ex->gate, ex->up, ex->down};
    for (int m = 0; m < 3; m++)
        for (int32_t e = 0; mats[m] && e < ex->n_expert; e++) {
            const struct tensor *t = &mats[m][e];
            if (!dtype_is_block(t->type) || t->type != mats[m][0].type || t->row_stride != mats[m][0].row_stride)
                return false;
        }
    return true;
}

/* The experts of a large batch in bf16 on moe_gemm.cu's grouped products,
 * fast mode: the unpadded compact rows rounded to bf16 (each token's row
 * scattered to its k places in the list, tpos [n_tokens][k]), gate
 * and up in one launch that stores their activation in bf16 (in g's place,
 * or u's without a gate), down into y [n][hidden] as bf16. tiles:
 * [n_tiles][2] on the device (moe_tiles_fill); maps: the layer's
 * cuda_moe_gemm_maps. xb: room for [n][hidden] floats, used as bf16 pairs. */
static void moe_ffn_grouped(struct cuda_backend *c, const struct moe_experts *ex, const struct moe_sort *s,
                            const CUtensorMap *maps, const int32_t *d_tiles, int32_t n_tiles, const int32_t *d_start,
                            const int32_t *d_tpos, int32_t k, const struct tensor *x, float *xb, float *g, float *u,
                            __nv_bfloat16 *y)
{
    const int64_t hidden = x->n_cols, inter = ex->up[0].n_rows, n = s->n_pad, E = ex->n_expert;
    __nv_bfloat16 *hi = (__nv_bfloat16 *)xb, *act = (__nv_bfloat16 *)(ex->gate ? g : u);
    assert(n == x->n_rows * k); /* unpadded: every row of the list is a token's pick */
    cuda_scatter_bf16(c, (const float *)x->data, x->row_stride, d_tpos, x->n_rows, k, hidden, hi);
    if (cuda_moe_gemm(c, ex->gate ? maps : maps + E, ex->gate ? maps + E : NULL, hi, n, hidden, inter, d_tiles,
                      n_tiles, d_start, ex->gate ? MM_PRE_SWIGLU : MM_PRE_RELU2, act) != 0)
        return;
    cuda_moe_gemm(c, maps + 2 * E, NULL, act, n, inter, hidden, d_tiles, n_tiles, d_start, MM_PRE_NONE, y);
}

/* moe_ffn_grouped's tiles [n_tiles][2] into t: an expert, the first row of
 * MOE_GEMM_ROWS of its slice; the largest experts first, so that the last
 * wave is short. The count. */
static int32_t moe_tiles_fill(int32_t *t, const struct moe_sort *s)
{
    int32_t n = 0;
    for (int32_t i = s->n_act - 1; i >= 0; i--) {
        const int32_t e = s->order[i];
        for (int32_t r = s->start[e]; r < s->start[e + 1]; r += MOE_GEMM_ROWS) {
            t[2 * n] = e;
            t[2 * n + 1] = r;
            n++;
        }
    }
    return n;
}

/* The experts of a large batch in any dtype: the compact rows gathered as
 * fp32 (xc: [nk][hidden]), each expert's products over its slice (cuBLAS for
 * long bf16 slices), the activation over all rows. */
static void moe_ffn_any(struct backend *be, const struct moe_experts *ex, const int32_t *start, const int32_t *d_rows,
                        const struct tensor *x, int64_t nk, float *xc, float *g, float *u, float *y)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t E = ex->n_expert;
    const int64_t hidden = x->n_cols, inter = ex->up[0].n_rows;
    struct tensor X = {DT_F32, nk, hidden, hidden, xc, false}, G = {DT_F32, nk, inter, inter, g, false};
    struct tensor U = {DT_F32, nk, inter, inter, u, false}, Y = {DT_F32, nk, hidden, hidden, y, false};
    cuda_gather_rows(c, &X, x, d_rows, (int32_t)nk);
    for (int32_t e = 0; e < E; e++) {
        const int64_t me = start[e + 1] - start[e];
        if (me == 0)
            continue;
        struct tensor xe = tensor_rows(&X, start[e], me), ue = tensor_rows(&U, start[e], me);
        cuda_matmul(be, &ue, &xe, &ex->up[e]);
        if (ex->gate) {
            struct tensor ge = tensor_rows(&G, start[e], me);
            cuda_matmul(be, &ge, &xe, &ex->gate[e]);
        }
    }
    if (ex->gate)
        cuda_swiglu(be, &U, &G, &U);
    else
        cuda_relu2(be, &U);
    for (int32_t e = 0; e < E; e++) {
        const int64_t me = start[e + 1] - start[e];
        if (me == 0)
            continue;
        struct tensor ue = tensor_rows(&U, start[e], me), ye = tensor_rows(&Y, start[e], me);
        cuda_matmul(be, &ye, &ue, &ex->down[e]);
    }
}

/* moe_ffn_bf16's products, in the order it runs them: for each, the
 * weight, input (hi, then lo n_pad rows later) and output pointers of its
 * entries into ptr. xc, g, u, y: the device buffers moe_ffn_bf16 takes. */
static void moe_ptrs_fill(void **ptr, const struct moe_sort *s, const struct moe_experts *ex, int64_t hidden,
                          int32_t passes, float *xc, float *g, float *u, float *y)
{
    const int32_t n_act = s->n_act;
    const int64_t inter = ex->up[0].n_rows, n_pad = s->n_pad;
    const struct tensor *in_w[2] = {ex->gate ? ex->gate : ex->up, ex->up};
    float *in_dst[2] = {ex->gate ? g : u, u};
    const int32_t n_in = ex->gate ? 2 : 1;
    const __nv_bfloat16 *hi = (const __nv_bfloat16 *)xc;
    for (int32_t q = 0; q < 2 * passes; q++) {
        const bool down = q >= passes;
        const int32_t width = down ? 1 : n_in, pass = q % passes;
        const int64_t K = down ? inter : hidden, M = down ? hidden : inter, n_e = (int64_t)width * n_act;
        for (int32_t b = 0; b < s->n_bucket; b++) {
            const int32_t cnt = s->beg[b + 1] - s->beg[b];
            for (int32_t m = 0; m < width; m++)
                for (int32_t k = 0; k < cnt; k++) {
                    const int32_t e = s->order[s->beg[b] + k];
                    const int64_t j = (int64_t)width * s->beg[b] + (int64_t)m * cnt + k;
                    ptr[j] = down ? ex->down[e].data : in_w[m][e].data;
                    ptr[n_e + j] = (void *)(hi + (pass ? n_pad * K : 0) + (int64_t)s->start[e] * K);
                    ptr[2 * n_e + j] = (down ? y : in_dst[m]) + (int64_t)s->start[e] * M;
                }
        }
        ptr += 3 * n_e;
    }
}

/* c->moe_pin, at least bytes; NULL (c failed) if it cannot be had */
static char *moe_pinned(struct cuda_backend *c, size_t bytes)
{
    if (bytes <= c->moe_pin_cap)
        return (char *)c->moe_pin;
    /* the stream may still be uploading from the old buffer */
    if (CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) != 0)
        return NULL;
    cudaFreeHost(c->moe_pin);
    c->moe_pin = NULL;
    c->moe_pin_cap = 0;
    if (CUDA_CHECK(c, cudaMallocHost(&c->moe_pin, bytes)) != 0)
        return NULL;
    c->moe_pin_cap = bytes;
    return (char *)c->moe_pin;
}

/* A large batch's routing list in chunks of MOE_CHUNK picks (pick i: token
 * i / k's i % k-th id), each chunk's rows an expert in hist [n_chunk][E]:
 * its own count here, before k_moe_total turns the counts into offsets. */
#define MOE_CHUNK 256
__global__ void __launch_bounds__(MOE_CHUNK) k_moe_hist(const int32_t *ids, int64_t is, int32_t n, int32_t k,
                                                        int32_t E, int32_t *hist)
{
    __shared__ int32_t h[MOE_MAX_EXPERT];
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
        h[e] = 0;
    __syncthreads();
    const int64_t i = (int64_t)blockIdx.x * MOE_CHUNK + threadIdx.x;
    if (i < (int64_t)n * k)
        atomicAdd(&h[ids[(i / k) * is + i % k]], 1);
    __syncthreads();
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
        hist[(int64_t)blockIdx.x * E + e] = h[e];
}

/* A warp an expert: hist's counts become each chunk's first row within the
 * expert's slice (the rows of the chunks before it), 32 chunks a step as a
 * warp's scan; cnt[e] the expert's rows in all. */
__global__ void k_moe_total(int32_t *hist, int32_t n_chunk, int32_t E, int32_t *cnt)
{
    const int32_t e = (int32_t)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (e >= E)
        return;
    int32_t base = 0;
    for (int32_t q0 = 0; q0 < n_chunk; q0 += 32) {
        const int32_t q = q0 + lane, v = q < n_chunk ? hist[(int64_t)q * E + e] : 0;
        int32_t incl = v;
        for (int32_t d = 1; d < 32; d <<= 1) {
            const int32_t o = __shfl_up_sync(0xffffffffu, incl, d);
            incl += lane >= d ? o : 0;
        }
        if (q < n_chunk)
            hist[(int64_t)q * E + e] = base + incl - v;
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0)
        cnt[e] = base;
}

/* The list of a plan (moe_sort_plan, start [E + 1] uploaded), a block a
 * chunk: each pick's row in its expert's slice (the slice's start, the
 * chunk's offset, the picks of the expert before it in the chunk, so that
 * a slice's tokens come in increasing order), and for each of its tokens
 * the row in tpos and the weight in tw at the token's place for the
 * expert, the rank of its id among the token's picks (top-k picks are
 * distinct): each token's rows in increasing expert order, the order the
 * combine adds them in, as the cpu does. The blocks also fill the slices'
 * padding rows, an expert at a time. */
__global__ void __launch_bounds__(MOE_CHUNK) k_moe_scatter(const int32_t *ids, int64_t is, const float *w, int64_t ws,
                                                           int32_t n, int32_t k, int32_t E, const int32_t *start,
                                                           const int32_t *hist, const int32_t *cnt, int32_t *rows,
                                                           int32_t *tpos, float *tw)
{
    __shared__ int32_t id[MOE_CHUNK];
    const int64_t i = (int64_t)blockIdx.x * MOE_CHUNK + threadIdx.x, t = i / k;
    const bool real = i < (int64_t)n * k;
    const int32_t e = real ? ids[t * is + i % k] : -1;
    id[threadIdx.x] = e;
    __syncthreads();
    if (real) {
        int32_t before = 0;
        for (int32_t j = 0; j < (int32_t)threadIdx.x; j++)
            before += id[j] == e;
        const int32_t p = start[e] + hist[(int64_t)blockIdx.x * E + e] + before;
        int32_t r = 0;
        for (int32_t j = 0; j < k; j++)
            r += ids[t * is + j] < e;
        rows[p] = (int32_t)t;
        tpos[t * k + r] = p;
        tw[t * k + r] = w[t * ws + i % k];
    }
    for (int32_t x = blockIdx.x; x < E; x += gridDim.x)
        for (int32_t p = start[x] + cnt[x] + threadIdx.x; p < start[x + 1]; p += blockDim.x)
            rows[p] = 0; /* padding rows gather token 0: finite, computed, never combined */
}

/* Larger batches: each expert's rows counted on the GPU (a chunk of picks
 * a block: k_moe_hist, k_moe_total) and copied back,
 * the plan made on the host (moe_sort_plan; bf16 experts' slices padded),
 * its slices and products' pointers uploaded, the list filled on the GPU
 * (k_moe_scatter), the experts over it (moe_ffn_bf16 or moe_ffn_any), the
 * combine over the whole list. */
static void moe_ffn_host(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *ids,
                         const struct tensor *weights, const struct moe_experts *ex, const struct tensor *add,
                         bool accumulate)
{
    struct cuda_backend *c = cuda_of(be);
    const int64_t n = x->n_rows, hidden = x->n_cols, inter = ex->up[0].n_rows;
    const int32_t k = (int32_t)ids->n_cols, E = ex->n_expert;
    const int64_t nk = n * k, n_cap = moe_sort_cap_rows(nk, E);
    const int32_t n_chunk = (int32_t)((nk + MOE_CHUNK - 1) / MOE_CHUNK);
    const int32_t passes = c->precise ? 2 : 1, n_q = ((ex->gate ? 2 : 1) + 1) * passes;
    /* the bf16 products' inputs are staged 8 floats at a time */
    const bool bf16 = moe_bf16(ex) && inter % 8 == 0 && cuda_rows_vec8((const float *)x->data, x->row_stride, hidden);
    /* fast mode on Hopper: moe_gemm.cu's grouped products, no padding */
    struct moe_table *tab = bf16 && cuda_moe_gemm_fits(c) ? moe_table_get(c, ex) : NULL;
    if (tab && !tab->maps && !(tab->maps = cuda_moe_gemm_maps(c, ex)))
        return;
    const bool grouped = tab != NULL, pad = bf16 && !grouped;
    cuda_host_wait(c);
    /* The scratch: the counts [E]; the slices' starts [E + 1] and the
     * products' pointers (3 for each of the n_q weight passes of each
     * expert) or the grouped products' tiles, uploaded together; the list
     * (rows [n_pad], token rows [nk], weights [nk]); the chunks' counts
     * (hist [n_chunk][E]); the experts' inputs and outputs. Pinned
     * (c->moe_pin): the counts back, then the starts and pointers as they
     * go up, then the plan's other arrays and sort keys. The pointers are
     * 16-byte aligned: cuBLAS's batched products take every pointer in the
     * arrays as 16-byte aligned (an odd count of active experts with gate,
     * up and down in one pass left them 8 bytes off: NaN outputs). */
    const size_t cnt_bytes = ((size_t)E * 4 + 15) & ~(size_t)15, start_bytes = ((size_t)(E + 1) * 4 + 15) & ~(size_t)15,
                 ptr_cap = ((grouped ? (size_t)(nk / MOE_GEMM_ROWS + E) * 2 * 4 : (size_t)n_q * 3 * E * sizeof(void *)) +
                            15) &
                           ~(size_t)15,
                 list_cap = ((size_t)(n_cap + 2 * nk) * 4 + 15) & ~(size_t)15,
                 hist_bytes = ((size_t)n_chunk * E * 4 + 15) & ~(size_t)15,
                 plan_bytes = ((size_t)(3 * E + 1) * 4 + 7) & ~(size_t)7;
    const size_t up_off = cnt_bytes, key_off = cnt_bytes + start_bytes + ptr_cap + plan_bytes;
    char *pin = moe_pinned(c, key_off + (size_t)E * sizeof(int64_t));
    const int64_t xw = hidden > inter ? hidden : inter; /* the gathered input, then the activation as bf16 */
    const int64_t rows_cap = pad ? n_cap : nk;
    /* sized for the most padding any routing gets, so that it never grows
     * from one layer to the next */
    char *buf = pin ? (char *)cuda_scratch(c, SCR_MOE, cnt_bytes + start_bytes + ptr_cap + list_cap + hist_bytes +
                                                          (size_t)rows_cap * (2 * inter + hidden + xw) * sizeof(float))
                    : NULL;
    if (!buf)
        return;
    int32_t *d_cnt = (int32_t *)buf, *d_start = (int32_t *)(buf + up_off);
    void **d_ptr = (void **)(buf + up_off + start_bytes);
    int32_t *d_rows = (int32_t *)(buf + up_off + start_bytes + ptr_cap);
    int32_t *d_hist = (int32_t *)(buf + up_off + start_bytes + ptr_cap + list_cap);
    int32_t *cnt = (int32_t *)pin, *arr = (int32_t *)(pin + key_off - plan_bytes);
    struct moe_sort s = {};
    s.start = (int32_t *)(pin + up_off);
    s.order = arr;
    s.beg = arr + E;
    s.n_rows = s.beg + E + 1;
    k_moe_hist<<<n_chunk, MOE_CHUNK, 0, c->stream>>>((const int32_t *)ids->data, ids->row_stride, (int32_t)n, k, E,
                                                     d_hist);
    if (CUDA_LAUNCHED(c) != 0)
        return;
    k_moe_total<<<(E + 7) / 8, 256, 0, c->stream>>>(d_hist, n_chunk, E, d_cnt);
    if (CUDA_LAUNCHED(c) != 0 ||
        CUDA_CHECK(c, cudaMemcpyAsync(cnt, d_cnt, (size_t)E * 4, cudaMemcpyDeviceToHost, c->stream)) != 0 ||
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) != 0)
        return;
    /* a bucket's calls: gate and up together (or up), then down, each
     * pass; a row's FLOPs: its weights', each pass */
    const double row_flops = 2.0 * (double)hidden * (double)inter * (ex->gate ? 3 : 2) * passes;
    moe_sort_plan(&s, cnt, E, pad, row_flops, 2 * passes, (int64_t *)(pin + key_off));
    const int32_t n_tiles = grouped ? moe_tiles_fill((int32_t *)(pin + up_off + start_bytes), &s) : 0;
    const size_t ptr_bytes = grouped ? (size_t)n_tiles * 2 * 4 : pad ? (size_t)n_q * 3 * s.n_act * sizeof(void *) : 0;
    int32_t *d_tpos = d_rows + s.n_pad;
    float *d_tw = (float *)(d_tpos + nk);
    float *xc = (float *)(buf + up_off + start_bytes + ptr_cap + list_cap + hist_bytes), *g = xc + s.n_pad * xw,
          *u = g + s.n_pad * inter, *y = u + s.n_pad * inter;
    if (pad)
        moe_ptrs_fill((void **)(pin + up_off + start_bytes), &s, ex, hidden, passes, xc, g, u, y);
    /* not waited for: the host goes on to enqueue the next layer while the
     * GPU runs this one's experts (c->moe_pin says why the pinned buffer
     * outlives the copy) */
    if (CUDA_CHECK(c, cudaMemcpyAsync(d_start, pin + up_off, start_bytes + ptr_bytes, cudaMemcpyHostToDevice,
                                      c->stream)) != 0)
        return;
    k_moe_scatter<<<n_chunk, MOE_CHUNK, 0, c->stream>>>((const int32_t *)ids->data, ids->row_stride,
                                                        (const float *)weights->data, weights->row_stride, (int32_t)n,
                                                        k, E, d_start, d_hist, d_cnt, d_rows, d_tpos, d_tw);
    if (CUDA_LAUNCHED(c) != 0)
        return;
    if (grouped) {
        moe_ffn_grouped(c, ex, &s, (const CUtensorMap *)tab->maps, (const int32_t *)d_ptr, n_tiles, d_start, d_tpos, k,
                        x, xc, g, u, (__nv_bfloat16 *)y);
        moe_combine(c, out, (const __nv_bfloat16 *)y, d_tpos, d_tw, k, add, accumulate);
        return;
    }
    if (pad)
        moe_ffn_bf16(c, ex, &s, d_ptr, d_rows, x, xc, g, u);
    else
        moe_ffn_any(be, ex, s.start, d_rows, x, nk, xc, g, u, y);
    moe_combine(c, out, y, d_tpos, d_tw, k, add, accumulate);
}

/* The layer's table of expert weights on the device (built or rebuilt
 * while the forward waits on the host); NULL on failure. */
static struct moe_table *moe_table_get(struct cuda_backend *c, const struct moe_experts *ex)
{
    const int32_t E = ex->n_expert;
    const struct tensor *mats[3] = {ex->gate, ex->up, ex->down};
    struct moe_table *tab = NULL;
    for (int32_t i = 0; i < c->n_moe_tabs && !tab; i++)
        if (c->moe_tabs[i].up == ex->up && c->moe_tabs[i].n_expert == E)
            tab = &c->moe_tabs[i];
    bool same = tab != NULL;
    for (int m = 0; m < 3 && same; m++)
        for (int32_t e = 0; e < E && same; e++)
            same = tab->host[m * E + e] == (mats[m] ? mats[m][e].data : NULL);
    if (same)
        return tab;
    cuda_host_wait(c);
    if (!tab) {
        struct moe_table *grown =
            (struct moe_table *)realloc(c->moe_tabs, (size_t)(c->n_moe_tabs + 1) * sizeof *grown);
        if (!grown) {
            c->failed = true;
            err_set("cuda: out of memory");
            return NULL;
        }
        c->moe_tabs = grown;
        tab = &grown[c->n_moe_tabs++];
        tab->up = ex->up;
        tab->n_expert = E;
        tab->host = (const void **)calloc((size_t)3 * E, sizeof(void *));
        tab->dev = NULL;
        tab->maps = NULL;
        if (!tab->host || CUDA_CHECK(c, cudaMalloc((void **)&tab->dev, (size_t)3 * E * sizeof(void *))) != 0) {
            c->failed = true;
            err_set("cuda: out of memory for the expert table");
            return NULL;
        }
    }
    for (int m = 0; m < 3; m++)
        for (int32_t e = 0; e < E; e++)
            tab->host[m * E + e] = mats[m] ? mats[m][e].data : NULL;
    cudaFree(tab->maps); /* another model's weights: made again at their first need */
    tab->maps = NULL;
    if (CUDA_CHECK(c, cudaMemcpyAsync(tab->dev, tab->host, (size_t)3 * E * sizeof(void *), cudaMemcpyHostToDevice,
                                      c->stream)) != 0 ||
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) != 0)
        return NULL;
    return tab;
}

void cuda_moe_free(struct cuda_backend *c)
{
    cudaFreeHost(c->moe_pin);
    c->moe_pin = NULL;
    c->moe_pin_cap = 0;
    for (int32_t i = 0; i < c->n_moe_tabs; i++) {
        free(c->moe_tabs[i].host);
        cudaFree(c->moe_tabs[i].dev);
        cudaFree(c->moe_tabs[i].maps);
    }
    free(c->moe_tabs);
    c->moe_tabs = NULL;
    c->n_moe_tabs = 0;
}

void cuda_moe(struct backend *be, struct tensor *out, const struct tensor *x, const struct moe_block *mb,
              bool accumulate)
{
    struct cuda_backend *c = cuda_of(be);
    const struct moe_experts *ex = &mb->ex;
    const struct tensor *h = mb->h;
    const int64_t n = x->n_rows, hidden = x->n_cols, inter = ex->up[0].n_rows;
    const int32_t k = mb->rt.k, E = ex->n_expert;
    assert(mb->ws->n_rows >= n && mb->ws->n_cols >= 2 * (hidden + inter) && E <= MOE_MAX_EXPERT);
    if (cuda_op_skip(c) || n == 0)
        return;
    const bool small =
        n <= CUDA_SMALL_N && inter % 8 == 0 && cuda_rows_vec8((const float *)h->data, h->row_stride, hidden);
    const bool quant = small && moe_quant(ex);
    const struct moe_table *mt = small && (quant || moe_bf16(ex)) ? moe_table_get(c, ex) : NULL;
    const uint16_t **tab = mt ? mt->dev : NULL;
    const struct tensor *sh_y = mb->shared ? mb->shared->y : NULL;
    if (c->failed)
        return;
    if (!tab) {
        cuda_rmsnorm(be, mb->h, x, mb->norm, mb->eps);
        cuda_matmul(be, mb->logits, h, mb->router);
        moe_route(c, mb, NULL, 0);
        if (mb->shared)
            backend_moe_shared(be, mb);
        moe_ffn_host(be, out, h, mb->ids, mb->weights, ex, sh_y, accumulate);
        return;
    }
    const int32_t nk = (int32_t)n * k, max_act = nk < E ? nk : E;
    const size_t plan_bytes = ((size_t)MOE_PLAN_ROWS(max_act) + 3 * (size_t)nk) * 4, plan_pad = (plan_bytes + 15) & ~(size_t)15;
    char *buf = (char *)cuda_scratch(c, SCR_MOE, plan_pad + (size_t)nk * (2 * inter + hidden) * sizeof(float));
    if (!buf)
        return;
    int32_t *plan = (int32_t *)buf;
    float *g = (float *)(buf + plan_pad), *u = g + (int64_t)nk * inter, *y = u + (int64_t)nk * inter;
    const struct tensor *rw = mb->router;
    if (rw->type == DT_BF16 && rw->row_stride % 8 == 0 && ((uintptr_t)rw->data & 15) == 0 &&
        hidden <= 32 * 8 * MOE_GATE_KC && cuda_rows_vec8((const float *)x->data, x->row_stride, hidden)) {
        const int32_t chunks = (int32_t)cdiv(n, MOE_GATE_N);
        const gate_args ga = {
            moe_route_args(c, mb, plan, max_act), (const float *)x->data, x->row_stride, (float *)h->data,
            h->row_stride, mb->norm->data, mb->norm->type, mb->eps, (const uint16_t *)rw->data, rw->row_stride,
            (int32_t)hidden, chunks == 1,
        };
        cuda_launch_dep(c, k_moe_gate, dim3((unsigned)cdiv(E, MOE_GATE_N), (unsigned)chunks), dim3(MOE_GATE_N * 32),
                        moe_gate_smem(n < MOE_GATE_N ? n : MOE_GATE_N, hidden, E), ga);
        if (chunks > 1)
            moe_route(c, mb, plan, max_act);
    } else {
        cuda_rmsnorm(be, mb->h, x, mb->norm, mb->eps);
        cuda_matmul(be, mb->logits, h, mb->router);
        moe_route(c, mb, plan, max_act);
    }
    /* the shared expert beside the routed ones: it waits for h alone, and
     * its launches fill what the routed products leave of the GPU. Not for a
     * lone token: a branch's launches and the join's wait are no programmatic
     * dependents, and the chain lost more than the overlap gained */
    if (mb->shared) {
        const bool side = n > 1;
        if (side)
            cuda_branch_begin(c);
        backend_moe_shared(be, mb);
        if (side)
            cuda_branch_end(c);
    }
    struct mm_group grp = {};
    grp.plan = plan;
    grp.max_act = max_act;
    grp.n_pos = nk;
    grp.n_max = (int32_t)n;
    grp.fill_slots = k;
    grp.gather = true;
    grp.ws = ex->up[0].row_stride;
    const int32_t *tpos = plan + MOE_PLAN_ROWS(max_act) + nk;
    const float *tw = (const float *)(tpos + nk);
    if (quant) {
        /* block-type experts: gate, up, the activation over the compact rows, down */
        const void *const *ew = (const void *const *)tab;
        const float *hd = (const float *)h->data;
        if (ex->gate)
            cuda_matmul_q_grouped(c, &grp, ew, &ex->gate[0], g, inter, hd, h->row_stride, (int32_t)hidden);
        cuda_matmul_q_grouped(c, &grp, ew + E, &ex->up[0], u, inter, hd, h->row_stride, (int32_t)hidden);
        struct tensor G = {DT_F32, nk, inter, inter, g, false}, U = {DT_F32, nk, inter, inter, u, false};
        if (ex->gate)
            cuda_swiglu(be, &U, &G, &U);
        else
            cuda_relu2(be, &U);
        grp.gather = false;
        cuda_matmul_q_grouped(c, &grp, ew + 2 * E, &ex->down[0], y, hidden, u, inter, (int32_t)inter);
        cuda_branch_join(c);
        moe_combine(c, out, y, tpos, tw, k, sh_y, accumulate);
        return;
    }
    const struct mm_fused none = {MM_PRE_NONE, NULL, 0.0f, NULL, false, NULL, NULL};
    const int64_t gate_stride = ex->gate ? ex->gate[0].row_stride : grp.ws;
    assert(gate_stride == grp.ws && ex->down[0].n_rows == hidden);
    if (ex->gate) {
        float *const gu[2] = {g, u};
        grp.w[0] = tab;
        grp.w[1] = tab + E;
        grp.M[0] = grp.M[1] = (int32_t)inter;
        cuda_matmul_grouped(c, &grp, 2, gu, inter, (const float *)h->data, h->row_stride, (int32_t)hidden, &none);
    } else {
        grp.w[0] = tab + E;
        grp.M[0] = (int32_t)inter;
        cuda_matmul_grouped(c, &grp, 1, &u, inter, (const float *)h->data, h->row_stride, (int32_t)hidden, &none);
    }
    const struct tensor ut = {DT_F32, nk, inter, inter, u, false};
    struct mm_fused act = none;
    act.pre = ex->gate ? MM_PRE_SWIGLU : MM_PRE_RELU2;
    act.up = &ut;
    grp.gather = false;
    grp.w[0] = tab + 2 * E;
    grp.ws = ex->down[0].row_stride;
    grp.M[0] = (int32_t)hidden;
    cuda_branch_join(c);
    if (n == 1) { /* the down products and the combine in one launch, where they fit one */
        struct mm_fused comb = act;
        comb.accumulate = accumulate;
        if (cuda_matmul_grouped_combine(c, &grp, (float *)out->data, ex->gate ? g : u, inter, (int32_t)inter, &comb,
                                        tpos, tw, k, sh_y ? (const float *)sh_y->data : NULL) == 0)
            return;
    }
    cuda_matmul_grouped(c, &grp, 1, &y, hidden, ex->gate ? g : u, inter, (int32_t)inter, &act);
    moe_combine(c, out, y, tpos, tw, k, sh_y, accumulate);
}
