/* matmul: out[n][M] = x[n][K] . W[M][K]^T with fp32 activations and weights
 * in their stored dtype (see cuda.h for the numerics).
 *
 * Up to CUDA_SMALL_N tokens, bf16 weights: k_mmv, a weight-streaming kernel on
 * the tensor cores (mma m16n8k16, 16 weight rows per warp as the row operand,
 * tokens in tiles of 8 as the column operand). On a precise backend (kapitsa
 * check) each activation x is split into hi = bf16(x), lo = bf16(x - hi); the
 * weight times both halves, accumulated in fp32, is x*w to ~2^-17. Otherwise
 * hi alone: bf16 activations, as the prefill GEMMs take them, half the
 * tensor-core work and staging (qwen3-8b's products on an H200: 5% faster
 * for one token, 14% for 24 and 64). A lane loads 8 consecutive weights of two rows
 * (16 bytes each) and the activations at the same k; which of the mma's k
 * slots they occupy does not matter to a dot product as long as both operands
 * agree. Activations are staged per k-chunk in shared memory for the block's
 * 8 warps. K is split across blocks so that the grid comes close to whole
 * waves; the last block to finish adds the partial sums in split order, so
 * the result never depends on timing, and the split depends on M and K only,
 * so never on the batch either. The kernel is compiled per number of token
 * tiles (1, 2, 4, 8): a decode step's single tile keeps few accumulators, and
 * each token's arithmetic is the same in every variant. A batch of two or
 * more tiles whose product spans more than a wave (a KFlash tree's gate/up)
 * runs as one wave of blocks, each taking its K slice's units of 128 rows in
 * turn: the slice is staged once, and the next unit's first weights are
 * requested before the last one's sums are stored and added. A lone token's
 * product with K in up to 8 slices of at most 1024 goes to k_mmv_slices when
 * its blocks fit one wave by that kernel's own occupancy (a decode step's
 * q/k/v and o) or grouped (a decoded token's experts, whatever the waves: a
 * 12-layer qwen3-30b-a3b decoded 4-5% faster than k_mmv's split-K
 * launches), and so does a grouped product of up to 8
 * tokens (a few sequences' experts, a slot's tokens in the mma's columns: 4
 * sequences 6-7% faster): a block per 16 rows, a warp per slice, the slices
 * added in shared memory in the same order as k_mmv's last block adds them.
 * A grouped product's K split is chosen for these blocks, by their
 * occupancy (mmv_split_slices), and kept for every batch size.
 *
 * matmul_fused folds a product's neighbours into the same launch: up to three
 * weights sharing the input (q/k/v, gate/up) are one grid, the input's
 * RMSNorm, SwiGLU or relu^2 is applied while it is staged, and the product
 * may be added to the output (the residual). RMSNorm's 1/rms multiplies the
 * product, not the input: the input is staged as norm * x and its squares
 * summed as it is staged, over the block's slice of K only (per segment of
 * 128 inputs, then the segments in order); with K split, the block that adds
 * the partial products adds the slices' sums too, in split order. So a
 * token's bits never depend on the batch, and the input is read once. The
 * kernel is launched as a programmatic dependent of the one before it: its
 * first weight loads are issued before it waits for that kernel's outputs.
 *
 * Larger bf16 products go to cuBLAS: the input's pre applied and rounded to
 * bf16 by one kernel (split into two products when precise), one GEMM per
 * weight adding into the output when accumulating; other dtypes to a plain
 * fp32 kernel. */
#include "cuda_impl.h"

#include <string.h>

#define MMV_WARPS 8
#define MMV_ROWS (MMV_WARPS * 16)
#define MMV_KC 128      /* K is split across blocks in multiples of this */
#define MMV_STAGE_BYTES (64 * 1024) /* shared memory for staged activations */
#define MMV_UNROLL 4    /* k32 blocks of weights loaded together per lane */
#define MMV_PAD 32      /* bf16 past each staged row: token rows 64 bytes apart mod 128, no bank conflicts */
#define MMV_RMS_K_MAX 32768 /* the widest input an RMSNorm is fused for */
#define MMV_SL_K_MAX 1024 /* k_mmv_slices: the longest slice a warp stages alone (longer: slower than k_mmv) */
#define MMV_SL_SEGS (MMV_SL_K_MAX / 128) /* k_mmv_slices: a lane's loads of its slice, all in flight at once */
/* the staged activations at most, then with RMSNorm's sums per segment of a
 * K of MMV_RMS_K_MAX: the kernels' shared memory */
#define MMV_STAGE_ACT (MMV_STAGE_BYTES + 8 * 8 * MMV_PAD * 2 * 2)
#define MMV_SMEM_MAX (MMV_STAGE_ACT + CUDA_SMALL_N * (MMV_RMS_K_MAX / 128) * 4)

/* 16 bytes of weights, read once: not kept in L1. A load of the mma
 * fragments' shape reads 64 bytes of each of eight rows; asked to fetch the
 * 256 bytes around a miss, the L2 turns a row's next three loads into hits
 * and the memory sees whole runs of rows (tools/device/read_bw.cu: 2.9 TB/s
 * for that shape alone, 4.0 with the hint, on an H200). */
static __device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* the lane's 16 bytes of rows g and g+8 for k32 blocks j0.. */
static __device__ __forceinline__ void mmv_load(uint4 (*wv)[2], const uint16_t *w0, const uint16_t *w1, int kc,
                                                int j0, int n_blk, bool ok0, bool ok1, int cq, int k_end)
{
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < MMV_UNROLL; u++) {
        const int k = kc + (j0 + u) * 32;
        const bool in = j0 + u < n_blk && k + cq * 8 < k_end;
        wv[u][0] = in && ok0 ? ld_stream(w0 + k) : z;
        wv[u][1] = in && ok1 ? ld_stream(w1 + k) : z;
    }
}

/* the k32 blocks j0.. of the loaded weights times the staged activations,
 * token tile b holding tokens 8b..8b+7; tokens past the batch (n) are zeros,
 * never staged. Per k32 block and tile: the mma's k slots {2cq, 2cq+1,
 * 2cq+8, 2cq+9} hold k = 8cq+0..3 in the first product and 8cq+4..7 in the
 * second, for weights and activations alike; LO: the lo halves' products
 * after the hi halves'. */
template <int NB, bool LO>
static __device__ __forceinline__ void mmv_mma(float (*acc)[4], const uint4 (*wv)[2], const __nv_bfloat16 *sh,
                                               const __nv_bfloat16 *sl, int pitch, int koff, int j0, int n_blk,
                                               int nb, int g, int cq, int n)
{
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < MMV_UNROLL; u++) {
        if (j0 + u >= n_blk)
            break;
        const uint4 a = wv[u][0], b = wv[u][1];
#pragma unroll
        for (int tb = 0; tb < NB; tb++) {
            if (tb >= nb)
                break;
            const int t = tb * 8 + g, o = t * pitch + koff + (j0 + u) * 32 + cq * 8;
            const uint4 h = t < n ? *(const uint4 *)(sh + o) : z;
            mma_bf16(acc[tb], a.x, b.x, a.y, b.y, h.x, h.y);
            mma_bf16(acc[tb], a.z, b.z, a.w, b.w, h.z, h.w);
            if (LO) {
                const uint4 l = t < n ? *(const uint4 *)(sl + o) : z;
                mma_bf16(acc[tb], a.x, b.x, a.y, b.y, l.x, l.y);
                mma_bf16(acc[tb], a.z, b.z, a.w, b.w, l.z, l.w);
            }
        }
    }
}

/* One k_mmv launch: up to MM_MAX_W weights sharing the input (blocks
 * [bx_end[i-1], bx_end[i]) compute weight i), what is applied to the input
 * while it is staged, and whether the product is added to out. */
struct mmv_args {
    const float *x;
    int64_t xs;
    int32_t n, nb, K;
    int32_t n_w;
    const uint16_t *w[MM_MAX_W];
    int64_t ws[MM_MAX_W];
    int32_t M[MM_MAX_W];
    int32_t bx_end[MM_MAX_W];
    float *out[MM_MAX_W];
    int64_t os[MM_MAX_W];
    float *part[MM_MAX_W]; /* [n_split][n][M[i]] split-K partial sums */
    unsigned *count;
    int32_t kslice, n_split, ks;
    int32_t per_split; /* k_mmv<.., true>: blocks a K slice, each taking every per_split-th of its units */
    enum mm_pre pre;
    const void *norm; /* MM_PRE_RMSNORM: [K] */
    enum dtype norm_t;
    float eps;
    const float *up; /* MM_PRE_SWIGLU: [n][K] */
    int64_t us;
    bool accumulate;
    /* grouped (struct mm_group): the plan, NULL for a plain product; slot z
     * = blockIdx.z multiplies its expert's weights (ew) by its compact rows */
    const int32_t *plan;
    int32_t max_act, n_pos;
    const uint16_t *const *ew[MM_MAX_W];
    bool gather;
    float *sq; /* RMSNorm with K split: [gridDim.x][n_split][n_pos] the slices' sums of squares */
    int32_t n_seg; /* RMSNorm: segments of 128 inputs in a slice */
    /* k_mmv_slices<.., true>: a lone token's k_pick slots in one block, their
     * rows added to out[0] as k_moe_combine adds them (pick j: compact row
     * tpos[j], weight tw[j]), and add's [M] (a shared expert's) to their sum */
    const int32_t *tpos;
    const float *tw;
    int32_t k_pick;
    const float *add;
};

/* pre(x) of 4 consecutive inputs k..k+3 (row ur of up), as the plain ops
 * compute it, except RMSNorm's 1/rms (applied to the product) */
static __device__ __forceinline__ float4 mmv_pre(const mmv_args &a, float4 v, int64_t ur, int k)
{
    switch (a.pre) {
    case MM_PRE_RMSNORM:
        v.x = dev_weight(a.norm, a.norm_t, k) * v.x;
        v.y = dev_weight(a.norm, a.norm_t, k + 1) * v.y;
        v.z = dev_weight(a.norm, a.norm_t, k + 2) * v.z;
        v.w = dev_weight(a.norm, a.norm_t, k + 3) * v.w;
        break;
    case MM_PRE_SWIGLU: {
        const float4 u = *(const float4 *)(a.up + ur * a.us + k);
        v.x = v.x / (1.0f + expf(-v.x)) * u.x;
        v.y = v.y / (1.0f + expf(-v.y)) * u.y;
        v.z = v.z / (1.0f + expf(-v.z)) * u.z;
        v.w = v.w / (1.0f + expf(-v.w)) * u.w;
        break;
    }
    case MM_PRE_RELU2:
        v.x = v.x > 0.0f ? v.x * v.x : 0.0f;
        v.y = v.y > 0.0f ? v.y * v.y : 0.0f;
        v.z = v.z > 0.0f ? v.z * v.z : 0.0f;
        v.w = v.w > 0.0f ? v.w * v.w : 0.0f;
        break;
    default: break;
    }
    return v;
}

/* 4 staged inputs as bf16 hi (at h) and, LO, the rounding left over, lo (at l) */
template <bool LO> static __device__ __forceinline__ void mmv_stage4(__nv_bfloat16 *h, __nv_bfloat16 *l, float4 v)
{
    const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
    __nv_bfloat162 *ph = (__nv_bfloat162 *)h;
    ph[0] = h01;
    ph[1] = h23;
    if (LO) {
        const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
        __nv_bfloat162 *pl = (__nv_bfloat162 *)l;
        pl[0] = __floats2bfloat162_rn(v.x - f01.x, v.y - f01.y);
        pl[1] = __floats2bfloat162_rn(v.z - f23.x, v.w - f23.y);
    }
}

/* Weights are the mma's 16-row operand (16 rows per warp, a lane reading 16
 * bytes of two rows per k32 block), tokens the 8-column one, so a token
 * costs a quarter of the tensor-core work and activation reads it would as
 * the row operand. ks: k staged at a time (the whole slice when it fits,
 * else a multiple of 128). Launched as a dependent of the previous kernel: the first
 * weights are requested (and the next kernel allowed to start doing the
 * same) before waiting for the inputs. */
template <int NB, bool LO, bool PER>
__global__ void __launch_bounds__(MMV_WARPS * 32, 2) k_mmv(const __grid_constant__ mmv_args a)
{
    extern __shared__ uint4 smem_raw[];
    const int K = a.K;
    const int pitch = a.ks + MMV_PAD;
    __nv_bfloat16 *sh = (__nv_bfloat16 *)smem_raw; /* [8*a.nb][pitch] */
    __nv_bfloat16 *sl = sh + (LO ? 8 * a.nb * pitch : 0); /* LO: [8*a.nb][pitch] */
    __shared__ int is_last;
    float *seg_ss = (float *)(sl + 8 * a.nb * pitch); /* RMSNorm: [a.n][a.n_seg] sums of squares per 128 inputs */
    __shared__ float rsq[CUDA_SMALL_N]; /* the slice's (or the row's) sum of squares, then 1/rms */
    /* the block's units of 128 rows (rb counts them over every weight) of
     * one K slice: one unit, or (PER) every a.per_split-th unit of the
     * slice, the slice staged once */
    const int n_rb = a.bx_end[a.n_w - 1];
    const int split = PER ? (int)blockIdx.x / a.per_split : (int)blockIdx.y;
    int rb = PER ? (int)blockIdx.x % a.per_split : (int)blockIdx.x;
    /* the block's tokens: rows base.. of the output (compact rows of a slot) */
    int n = a.n, nb = a.nb, base = 0;
    int32_t expert = 0;
    const int32_t *rows = NULL;
    if (a.plan) {
        grid_dep_wait(); /* the plan is an earlier kernel's output */
        if ((int32_t)blockIdx.z >= a.plan[0])
            return;
        const int32_t *beg = a.plan + MOE_PLAN_BEG(a.max_act);
        base = beg[blockIdx.z];
        n = beg[blockIdx.z + 1] - base;
        nb = (n + 7) / 8;
        expert = a.plan[MOE_PLAN_EXPERT + blockIdx.z];
        rows = a.gather ? a.plan + MOE_PLAN_ROWS(a.max_act) : NULL;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    /* unit rb's weight, its rows and the warp's two rows in it */
    int wi, blk, M;
    bool ok0, ok1;
    const uint16_t *w0, *w1;
    const auto unit = [&](int r) {
        wi = 0;
        while (wi + 1 < a.n_w && r >= a.bx_end[wi])
            wi++;
        blk = r - (wi ? a.bx_end[wi - 1] : 0);
        M = a.M[wi];
        const uint16_t *wm = a.w[wi];
        if (a.plan)
            wm = a.ew[wi][expert];
        const int r0 = blk * MMV_ROWS + warp * 16;
        ok0 = r0 + g < M;
        ok1 = r0 + g + 8 < M;
        w0 = wm + (int64_t)(ok0 ? r0 + g : 0) * a.ws[wi] + cq * 8;
        w1 = wm + (int64_t)(ok1 ? r0 + g + 8 : 0) * a.ws[wi] + cq * 8;
    };
    unit(rb);
    const int k_beg = split * a.kslice, k_end = min(K, k_beg + a.kslice);
    float acc[NB][4];
    uint4 wa[MMV_UNROLL][2], wb[MMV_UNROLL][2];
    grid_dep_launch();
    const int n_blk0 = (min(a.ks, k_end - k_beg) + 31) / 32;
    /* with 8 tiles the accumulators leave room for one group only while the input is staged */
    constexpr bool wb_early = NB < 8;
    mmv_load(wa, w0, w1, k_beg, 0, n_blk0, ok0, ok1, cq, k_end);
    if (wb_early)
        mmv_load(wb, w0, w1, k_beg, MMV_UNROLL, n_blk0, ok0, ok1, cq, k_end);
    grid_dep_wait();
    const bool rms = a.pre == MM_PRE_RMSNORM, direct = a.n_split == 1;
    for (bool staged = false;; staged = true) {
#pragma unroll
        for (int i = 0; i < NB; i++)
            acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
        for (int kc = k_beg; kc < k_end; kc += a.ks) {
            const int len = min(a.ks, k_end - kc), n_blk = (len + 31) / 32, len4 = len / 4;
            if (kc > k_beg) {
                mmv_load(wa, w0, w1, kc, 0, n_blk, ok0, ok1, cq, k_end);
                if (wb_early)
                    mmv_load(wb, w0, w1, kc, MMV_UNROLL, n_blk, ok0, ok1, cq, k_end);
            }
            if (!staged) {
                __syncthreads();
                /* the chunk in segments of 128 inputs of a token, a warp each (two at a
                 * time); with RMSNorm, a segment's sum of squares is its warp's tree,
                 * kept per segment of the slice, so its bits never depend on the batch
                 * or the chunking */
                const int segs = (len + 127) / 128, seg0 = (kc - k_beg) / 128, n_unit = n * segs;
                for (int u0 = 2 * warp; u0 < n_unit; u0 += 2 * MMV_WARPS) {
                    float4 xv[2];
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int u = min(u0 + j, n_unit - 1), t = u / segs, c4 = (u % segs) * 32 + lane;
                        xv[j] = u0 + j < n_unit && c4 < len4
                                    ? *(const float4 *)(a.x + (rows ? rows[base + t] : base + t) * a.xs + kc + 4 * c4)
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int u = u0 + j, t = u / segs, sg = u % segs, c = 4 * (sg * 32 + lane);
                        if (u >= n_unit)
                            break;
                        const float4 x = xv[j];
                        if (c < len)
                            mmv_stage4<LO>(sh + t * pitch + c, sl + t * pitch + c, mmv_pre(a, x, base + t, kc + c));
                        if (rms) {
                            const float ss = warp_sum(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w);
                            if (lane == 0)
                                seg_ss[t * a.n_seg + seg0 + sg] = ss;
                        }
                    }
                }
                /* a partial last block of 32 reads zeros past the slice */
                const int n_pad = n_blk * 32 - len;
                for (int e = threadIdx.x; e < n * n_pad; e += blockDim.x) {
                    const int t = e / n_pad, k = len + e % n_pad;
                    sh[t * pitch + k] = __float2bfloat16_rn(0.0f);
                    if (LO)
                        sl[t * pitch + k] = __float2bfloat16_rn(0.0f);
                }
                __syncthreads();
            }
            /* two groups of weight loads in flight: a group is requested again
             * as soon as it has been multiplied (wb's first, with 8 tiles, only
             * once the input is staged) */
            for (int j0 = 0; j0 < n_blk; j0 += 2 * MMV_UNROLL) {
                if (j0 > 0 || !wb_early)
                    mmv_load(wb, w0, w1, kc, j0 + MMV_UNROLL, n_blk, ok0, ok1, cq, k_end);
                mmv_mma<NB, LO>(acc, wa, sh, sl, pitch, 0, j0, n_blk, nb, g, cq, n);
                if (j0 + 2 * MMV_UNROLL < n_blk)
                    mmv_load(wa, w0, w1, kc, j0 + 2 * MMV_UNROLL, n_blk, ok0, ok1, cq, k_end);
                mmv_mma<NB, LO>(acc, wb, sh, sl, pitch, 0, j0 + MMV_UNROLL, n_blk, nb, g, cq, n);
            }
        }
        /* this unit's rows, then (PER) the next unit's first weights
         * requested before this one's sums are stored and added */
        const int u_wi = wi, u_blk = blk, u_M = M, u_rb = rb;
        const bool u_ok0 = ok0, u_ok1 = ok1;
        if (PER)
            rb += a.per_split;
        const bool more = PER && rb < n_rb;
        if (more) {
            unit(rb);
            mmv_load(wa, w0, w1, k_beg, 0, n_blk0, ok0, ok1, cq, k_end);
            if (wb_early)
                mmv_load(wb, w0, w1, k_beg, MMV_UNROLL, n_blk0, ok0, ok1, cq, k_end);
        }
        if (rms) { /* the slice's sums of squares, segments in order; the whole row's when K is not split */
            const int n_seg = (k_end - k_beg + 127) / 128;
            for (int t = threadIdx.x; t < n; t += blockDim.x) {
                float ss = 0.0f;
                for (int sg = 0; sg < n_seg; sg++)
                    ss += seg_ss[t * a.n_seg + sg];
                rsq[t] = direct ? 1.0f / sqrtf(ss / (float)K + a.eps) : ss;
            }
            __syncthreads();
            if (direct) {
#pragma unroll
                for (int tb = 0; tb < NB; tb++) {
                    const int t0 = tb * 8 + 2 * cq;
                    const float r0 = t0 < n ? rsq[t0] : 0.0f, r1 = t0 + 1 < n ? rsq[t0 + 1] : 0.0f;
                    acc[tb][0] *= r0;
                    acc[tb][1] *= r1;
                    acc[tb][2] *= r0;
                    acc[tb][3] *= r1;
                }
            } else if ((int)threadIdx.x < n) {
                a.sq[((int64_t)u_rb * a.n_split + split) * a.n_pos + base + threadIdx.x] = rsq[threadIdx.x];
            }
        }
        /* acc[tb]: rows ra (0,1) and rb (2,3); tokens 8tb+2cq (0,2) and +1 (1,3) */
        float *out = a.out[u_wi] + (int64_t)base * a.os[u_wi];
        const int64_t os = a.os[u_wi];
        float *dst = direct ? out : a.part[u_wi] + ((int64_t)split * a.n_pos + base) * u_M;
        const int64_t ds = direct ? os : u_M;
        const bool add = direct && a.accumulate;
        const int ra = u_blk * MMV_ROWS + warp * 16 + g, rc = ra + 8;
#pragma unroll
        for (int tb = 0; tb < NB; tb++) {
            if (tb >= nb)
                break;
            const int t0 = tb * 8 + 2 * cq, t1 = t0 + 1;
            if (t0 < n && u_ok0)
                dst[(int64_t)t0 * ds + ra] = acc[tb][0] + (add ? dst[(int64_t)t0 * ds + ra] : 0.0f);
            if (t1 < n && u_ok0)
                dst[(int64_t)t1 * ds + ra] = acc[tb][1] + (add ? dst[(int64_t)t1 * ds + ra] : 0.0f);
            if (t0 < n && u_ok1)
                dst[(int64_t)t0 * ds + rc] = acc[tb][2] + (add ? dst[(int64_t)t0 * ds + rc] : 0.0f);
            if (t1 < n && u_ok1)
                dst[(int64_t)t1 * ds + rc] = acc[tb][3] + (add ? dst[(int64_t)t1 * ds + rc] : 0.0f);
        }
        if (!direct) {
            /* the block's partial sums, then one release-acquire arrival: the last
             * block to arrive sees every other block's (no fence per thread) */
            __syncthreads();
            unsigned *count = a.count + blockIdx.z * n_rb + u_rb;
            if (threadIdx.x == 0) {
                unsigned old;
                asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
                is_last = old == (unsigned)a.n_split - 1;
            }
            __syncthreads();
            if (is_last) {
                if (rms) { /* the row's sum of squares: the slices' in split order */
                    for (int t = threadIdx.x; t < n; t += blockDim.x) {
                        float ss = 0.0f;
                        for (int sp = 0; sp < a.n_split; sp++)
                            ss += __ldcg(a.sq + ((int64_t)u_rb * a.n_split + sp) * a.n_pos + base + t);
                        rsq[t] = 1.0f / sqrtf(ss / (float)K + a.eps);
                    }
                    __syncthreads();
                }
                const int rb0 = u_blk * MMV_ROWS;
                for (int e = threadIdx.x; e < n * MMV_ROWS; e += blockDim.x) {
                    const int t = e / MMV_ROWS, r = rb0 + e % MMV_ROWS;
                    if (r >= u_M)
                        continue;
                    float s = 0.0f;
                    for (int sp = 0; sp < a.n_split; sp++)
                        s += __ldcg(a.part[u_wi] + ((int64_t)sp * a.n_pos + base + t) * u_M + r);
                    if (rms)
                        s *= rsq[t];
                    float *o = out + (int64_t)t * os + r;
                    *o = a.accumulate ? *o + s : s;
                }
                if (threadIdx.x == 0)
                    *count = 0;
            }
        }
        if (!more)
            return;
        __syncthreads(); /* rsq and is_last are the next unit's */
    }
}

/* One token with K split in at most MMV_WARPS slices, a grid of one wave
 * (decoding's q/k/v and o), or in up to MMV_SL_WARPS, slot z of a grouped
 * product of up to 8 tokens (its rows times its expert's weights, the
 * tokens the mma's 8 columns: nemotron-3-nano's 2688 inputs in 7 slices
 * of 384): a block per 16 rows, a warp per slice, each warp staging its own
 * slice of the input; the block adds the slices' partial products (and
 * RMSNorm's sums of squares) in split order in shared memory: the same sums
 * k_mmv's last block makes, without the trip through memory, the fence and
 * the arrival counter that end each of its launches, and in blocks small
 * enough to make room for the next kernel's as they finish. bx_end counts
 * 16-row groups. COMB (a lone token's experts' down products and their
 * combine): the block holds every slot, warp w taking slot w / n_split, and
 * adds the slots' rows weighted, in the token's pick order, to the output,
 * the bits of the grouped product followed by k_moe_combine. */
constexpr int MMV_SL_WARPS = CUDA_SL_WARPS; /* a block's warps at most: a grouped product's slices, COMB's k_pick * n_split */
template <bool LO, bool COMB>
__global__ void __launch_bounds__(MMV_SL_WARPS * 32, 1)
    k_mmv_slices(const __grid_constant__ mmv_args a)
{
    extern __shared__ uint4 smem_raw[];
    /* nt: the tokens a slot may hold (a.n: the batch's, 1 for a plain product) */
    const int K = a.K, pitch = a.kslice + MMV_PAD, n_split = a.n_split, n_warp = blockDim.x >> 5, nt = a.n;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    __nv_bfloat16 *sh = (__nv_bfloat16 *)smem_raw + (int64_t)warp * 2 * nt * pitch; /* [nt][pitch] */
    __nv_bfloat16 *sl = sh + nt * pitch;                                              /* [nt][pitch] */
    float *part = (float *)((__nv_bfloat16 *)smem_raw + (int64_t)n_warp * 2 * nt * pitch); /* [n_warp][16][nt] */
    float *sq = part + n_warp * 16 * nt;                                                    /* [n_warp] */
    int wi = 0;
    while (wi + 1 < a.n_w && (int32_t)blockIdx.x >= a.bx_end[wi])
        wi++;
    const int M = a.M[wi], r0 = (blockIdx.x - (wi ? a.bx_end[wi - 1] : 0)) * 16;
    const int64_t ws = a.ws[wi];
    const int z = COMB ? warp / n_split : (int)blockIdx.z, split = COMB ? warp % n_split : warp;
    /* grouped: slot z's n rows through its expert's weights */
    const uint16_t *wm = a.w[wi];
    const int32_t *rows = NULL;
    float *ob = a.out[wi];
    int64_t ur = 0, xrow = 0;
    int n = 1;
    bool live = true;
    if (a.plan) {
        grid_dep_wait(); /* the plan is an earlier kernel's output */
        live = z < a.plan[0];
        if (!COMB && !live)
            return;
        const int32_t *beg = a.plan + MOE_PLAN_BEG(a.max_act), base = beg[live ? z : 0];
        n = live ? beg[z + 1] - base : 1;
        wm = a.ew[wi][a.plan[MOE_PLAN_EXPERT + (live ? z : 0)]];
        if (a.gather)
            rows = a.plan + MOE_PLAN_ROWS(a.max_act) + base;
        else
            xrow = base;
        if (!COMB)
            ob = a.out[wi] + (int64_t)base * a.os[wi];
        ur = base;
    }
    const bool ok0 = live && r0 + g < M, ok1 = live && r0 + g + 8 < M;
    const uint16_t *w0 = wm + (int64_t)(ok0 ? r0 + g : 0) * ws + cq * 8;
    const uint16_t *w1 = wm + (int64_t)(ok1 ? r0 + g + 8 : 0) * ws + cq * 8;
    const int k_beg = split * a.kslice, k_end = min(K, k_beg + a.kslice), len = k_end - k_beg;
    const int n_blk = (len + 31) / 32, segs = (len + 127) / 128;
    float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    uint4 wa[MMV_UNROLL][2], wb[MMV_UNROLL][2];
    grid_dep_launch();
    mmv_load(wa, w0, w1, k_beg, 0, n_blk, ok0, ok1, cq, k_end);
    grid_dep_wait();
    const bool rms = a.pre == MM_PRE_RMSNORM;
    float ss = 0.0f; /* the slice's sum of squares (a lone token): segments of 128 in order, each its warp's tree */
    for (int t = 0; t < n; t++) {
        const float *xr = a.x + (rows ? rows[t] : xrow + t) * a.xs;
        /* every load of the token's slice in flight at once (one trip to the L2) */
        float4 xv[MMV_SL_SEGS];
#pragma unroll
        for (int j = 0; j < MMV_SL_SEGS; j++) {
            const int c = 4 * (j * 32 + lane);
            xv[j] = j < segs && c < len ? *(const float4 *)(xr + k_beg + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < MMV_SL_SEGS; j++) {
            const int c = 4 * (j * 32 + lane);
            if (j >= segs)
                break;
            const float4 x = xv[j];
            if (c < len)
                mmv_stage4<LO>(sh + t * pitch + c, sl + t * pitch + c, mmv_pre(a, x, ur + t, k_beg + c));
            if (rms)
                ss += warp_sum(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w);
        }
        for (int e = len + lane; e < n_blk * 32; e += 32) {
            sh[t * pitch + e] = __float2bfloat16_rn(0.0f);
            if (LO)
                sl[t * pitch + e] = __float2bfloat16_rn(0.0f);
        }
    }
    /* the second group of weights only once the input's loads are issued:
     * requested with the first, before them, qwen3-30b-a3b decoded 4-6%
     * slower (qwen3-8b the same) */
    mmv_load(wb, w0, w1, k_beg, MMV_UNROLL, n_blk, ok0, ok1, cq, k_end);
    __syncwarp();
    for (int j0 = 0; j0 < n_blk; j0 += 2 * MMV_UNROLL) {
        if (j0 > 0)
            mmv_load(wb, w0, w1, k_beg, j0 + MMV_UNROLL, n_blk, ok0, ok1, cq, k_end);
        mmv_mma<1, LO>(acc, wa, sh, sl, pitch, 0, j0, n_blk, 1, g, cq, n);
        if (j0 + 2 * MMV_UNROLL < n_blk)
            mmv_load(wa, w0, w1, k_beg, j0 + 2 * MMV_UNROLL, n_blk, ok0, ok1, cq, k_end);
        mmv_mma<1, LO>(acc, wb, sh, sl, pitch, 0, j0 + MMV_UNROLL, n_blk, 1, g, cq, n);
    }
    /* acc: rows g (0, 1) and g+8 (2, 3), tokens 2cq (0, 2) and 2cq+1 (1, 3) */
    float *pw = part + warp * 16 * nt;
    if (2 * cq < n) {
        pw[g * nt + 2 * cq] = acc[0][0];
        pw[(g + 8) * nt + 2 * cq] = acc[0][2];
    }
    if (2 * cq + 1 < n) {
        pw[g * nt + 2 * cq + 1] = acc[0][1];
        pw[(g + 8) * nt + 2 * cq + 1] = acc[0][3];
    }
    if (rms && lane == 0)
        sq[warp] = ss;
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * n; e += blockDim.x) {
        const int r = e % 16, t = e / 16;
        if (r0 + r >= M)
            continue;
        /* a slot's row: its slices in split order (as k_mmv's last block adds them) */
        const auto slot_row = [&](int zs) {
            float s = 0.0f;
            for (int sp = 0; sp < n_split; sp++)
                s += part[((zs * n_split + sp) * 16 + r) * nt + t];
            return s;
        };
        float s;
        if (COMB) {
            /* a lone token's compact rows are its slots, each one row */
            s = 0.0f;
            for (int32_t j = 0; j < a.k_pick; j++)
                s += a.tw[j] * slot_row(a.tpos[j]);
            if (a.add)
                s += a.add[r0 + r];
        } else {
            s = slot_row(0);
            if (rms) {
                float q = 0.0f;
                for (int sp = 0; sp < n_split; sp++)
                    q += sq[sp];
                s *= 1.0f / sqrtf(q / (float)K + a.eps);
            }
        }
        float *o = ob + (int64_t)t * a.os[wi] + r0 + r;
        *o = a.accumulate ? *o + s : s;
    }
}

/* Plain fp32 product for f16/f32 weights (and shapes k_mmv cannot take):
 * one output per thread over 16x16 tiles, k in steps of 32 through shared memory. */
__global__ void k_mm_simt(const float *__restrict__ x, int64_t xs, int32_t n, const void *__restrict__ w,
                          enum dtype wt, int64_t ws, int32_t K, int32_t M, float *__restrict__ out, int64_t os)
{
    __shared__ float xt[16][33], wt_[16][33];
    const int tr = threadIdx.x % 16, tt = threadIdx.x / 16;
    const int r = blockIdx.x * 16 + tr, t = blockIdx.y * 16 + tt;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 32) {
        for (int e = threadIdx.x; e < 16 * 32; e += blockDim.x) {
            const int i = e / 32, k = k0 + e % 32;
            const int ti = blockIdx.y * 16 + i, ri = blockIdx.x * 16 + i;
            xt[i][e % 32] = ti < n && k < K ? x[(int64_t)ti * xs + k] : 0.0f;
            wt_[i][e % 32] = ri < M && k < K ? dev_weight(w, wt, (int64_t)ri * ws + k) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < 32; k++)
            acc += xt[tt][k] * wt_[tr][k];
        __syncthreads();
    }
    if (r < M && t < n)
        out[(int64_t)t * os + r] = acc;
}

/* the variant for nb token tiles, with the inputs' lo halves or not, a
 * block a unit or (per, batches of 9 tokens and more) several in turn */
template <bool LO, bool PER> static void (*mmv_kernel_lo(int32_t nb))(mmv_args)
{
    return nb <= 2 ? k_mmv<2, LO, PER> : nb <= 4 ? k_mmv<4, LO, PER> : k_mmv<8, LO, PER>;
}

static void (*mmv_kernel(int32_t nb, bool lo, bool per))(mmv_args)
{
    if (nb <= 1)
        return lo ? k_mmv<1, true, false> : k_mmv<1, false, false>;
    if (per)
        return lo ? mmv_kernel_lo<true, true>(nb) : mmv_kernel_lo<false, true>(nb);
    return lo ? mmv_kernel_lo<true, false>(nb) : mmv_kernel_lo<false, false>(nb);
}

/* a k_mmv_slices block's shared memory: each warp's staged slice (hi and lo
 * halves) and its sums */
static size_t mmv_slices_smem(const mmv_args *a, int32_t n_warp)
{
    return (size_t)n_warp *
           (2 * (size_t)a->n * (a->kslice + MMV_PAD) * sizeof(__nv_bfloat16) + (16 * (size_t)a->n + 1) * sizeof(float));
}

int cuda_matmul_init(struct cuda_backend *c)
{
    int per_sm = 0;
    const int act = MMV_STAGE_ACT, smem = MMV_SMEM_MAX;
    for (int32_t nb = 1; nb <= 8; nb *= 2)
        for (int v = 0; v < 4; v++)
            if (CUDA_CHECK(c, cudaFuncSetAttribute(mmv_kernel(nb, v & 1, v >> 1),
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != 0)
                return -1;
    if (CUDA_CHECK(c, cudaFuncSetAttribute(k_mmv_slices<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           smem)) != 0 ||
        CUDA_CHECK(c, cudaFuncSetAttribute(k_mmv_slices<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           smem)) != 0 ||
        CUDA_CHECK(c, cudaFuncSetAttribute(k_mmv_slices<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           smem)) != 0 ||
        CUDA_CHECK(c, cudaFuncSetAttribute(k_mmv_slices<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           smem)) != 0)
        return -1;
    /* of the largest variant's activations: the K split follows from it, and must not depend on the batch */
    if (CUDA_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mmv_kernel(8, true, false), MMV_WARPS * 32, act)) != 0)
        return -1;
    c->mmv_per_sm = per_sm > 0 ? per_sm : 1;
    for (int comb = 0; comb < 2; comb++)
        for (int32_t w = 1; w <= MMV_SL_WARPS; w++) {
            mmv_args one;
            memset(&one, 0, sizeof one);
            one.n = 1;
            one.kslice = MMV_SL_K_MAX;
            void (*kern)(mmv_args) = comb ? (c->precise ? k_mmv_slices<true, true> : k_mmv_slices<false, true>)
                                           : (c->precise ? k_mmv_slices<true, false> : k_mmv_slices<false, false>);
            int b = 0;
            if (CUDA_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kern, w * 32,
                                                                            mmv_slices_smem(&one, w))) != 0)
                return -1;
            c->sl_per_sm[comb][w] = b;
        }
    return 0;
}

/* the small-batch kernel reads weights and activations 16 bytes at a time */
static bool mmv_fits(const struct tensor *x, const struct tensor *w)
{
    return w->type == DT_BF16 && w->row_stride % 8 == 0 && ((uintptr_t)w->data & 15) == 0 &&
           cuda_rows_vec8((const float *)x->data, x->row_stride, x->n_cols);
}

/* k_mmv_slices' blocks for a slot: 16 rows each, over every weight */
static int64_t mmv_blocks16(const mmv_args *a)
{
    int64_t blocks = 0;
    for (int32_t i = 0; i < a->n_w; i++)
        blocks += cdiv(a->M[i], 16);
    return blocks;
}

/* k_mmv_slices' blocks of n_warp warps (COMB: the combining variant's) fit
 * one wave, by that kernel's own occupancy, not k_mmv's: qwen3-30b-a3b's
 * q/k/v (320 blocks of 6 warps, two an SM) would take 1.2 waves; through
 * k_mmv instead its 12-layer decode is 2% faster (H100) */
static bool mmv_slices_one_wave(const struct cuda_backend *c, bool comb, int64_t blocks, int32_t n_warp)
{
    return blocks <= (int64_t)c->sl_per_sm[comb][n_warp] * c->n_sm;
}

/* A grouped product's K split (a decoded token's experts, which take
 * k_mmv_slices; larger batches take k_mmv with the same split, so that a
 * token's bits never depend on the batch): of the splits into 2 to
 * MMV_SL_WARPS slices of up to MMV_SL_K_MAX whose blocks (16 rows, a warp a
 * slice) fit two an SM, the one whose blocks (for fill_z slots) best use
 * the SMs by the kernel's own occupancy: the slices' evenness (a block
 * takes its longest slice's time), times the warps resident an SM, times
 * the last wave's fill; ties to fewer slices (fewer partial sums for
 * k_mmv). A block alone on its SM leaves it idle from its end to the next
 * one's first weights: every such split measured lost (on an H100, 4-9%
 * where 15 and 16 slices of 128 scored as well). nemotron-3-nano's up
 * product (K = 2688, 696 blocks) takes 7 slices of 384 where k_mmv's tiles
 * gave 11 of 256, in blocks of 11 warps, one an SM (with the combine below,
 * its 12-layer decode 4.5% faster on an H100); the other presets' splits
 * stay. False where no split fits those blocks. */
static bool mmv_split_slices(const struct cuda_backend *c, mmv_args *a, int32_t fill_z)
{
    const int32_t K = a->K;
    const int64_t blocks = mmv_blocks16(a) * fill_z;
    double best = 0.0;
    for (int32_t want = 2; want <= MMV_SL_WARPS; want++) {
        const int32_t sl = (int32_t)cdiv(cdiv(K, want), MMV_KC) * MMV_KC, ns = (int32_t)cdiv(K, sl);
        const int32_t per_sm = c->sl_per_sm[0][ns];
        if (ns != want || sl > MMV_SL_K_MAX || per_sm < 2)
            continue;
        const int64_t slots = (int64_t)per_sm * c->n_sm;
        const double even = (double)K / ((double)ns * sl),
                     fill = (double)blocks / (double)(cdiv(blocks, slots) * slots),
                     score = even * (double)(per_sm * ns) * fill;
        if (score > best * (1.0 + 1e-6)) {
            best = score;
            a->n_split = ns;
            a->kslice = sl;
        }
    }
    return best > 0.0;
}

/* What every launch of a product takes from its shape: bx (blocks of
 * MMV_ROWS rows per slot, weight after weight, and a->bx_end), the K split
 * and the input's op; n_z slots, fill_z of them counted when splitting K (a
 * constant of the model, never of the batch). *m_sum: the weights' rows. */
static int32_t mmv_setup(struct cuda_backend *c, mmv_args *a, int32_t n_z, int32_t fill_z, const struct mm_fused *f,
                         int64_t *m_sum)
{
    const int32_t K = a->K;
    int32_t bx = 0;
    *m_sum = 0;
    for (int32_t i = 0; i < a->n_w; i++) {
        bx += (int32_t)cdiv(a->M[i], MMV_ROWS);
        a->bx_end[i] = bx;
        *m_sum += a->M[i];
    }
    /* split K so that the blocks come close to whole waves (a partial last
     * wave of these long blocks costs as much as a full one); the resident
     * count is the kernel's, so the split never depends on the batch (a
     * grouped product's: by k_mmv_slices' blocks, where a split fits them) */
    a->n_split = 1;
    a->kslice = K;
    const int32_t resident = c->mmv_per_sm * c->n_sm;
    if ((int64_t)bx * n_z <= CUDA_MOE_COUNTER && !(a->plan && mmv_split_slices(c, a, fill_z))) {
        double best = 0.0;
        for (int32_t want = 1; want <= 32 && (int64_t)want * MMV_KC <= K && best < 0.9; want++) {
            const int32_t sl = (int32_t)cdiv(cdiv(K, want), MMV_KC) * MMV_KC, ns = (int32_t)cdiv(K, sl);
            const int64_t blocks = (int64_t)bx * fill_z * ns;
            const double fill = (double)blocks / (double)((int64_t)cdiv(blocks, resident) * resident);
            if (fill > best + 0.02) {
                best = fill;
                a->n_split = ns;
                a->kslice = sl;
            }
        }
    }
    a->pre = f->pre;
    if (f->pre == MM_PRE_RMSNORM) {
        a->norm = f->norm->data;
        a->norm_t = f->norm->type;
        a->eps = f->eps;
    } else if (f->pre == MM_PRE_SWIGLU) {
        a->up = (const float *)f->up->data;
        a->us = f->up->row_stride;
    }
    a->accumulate = f->accumulate;
    return bx;
}

/* a product fits k_mmv_slices: a lone token's, or a grouped one's of up to 8
 * tokens (a slot's in one column tile), with K in 2 to MMV_WARPS slices (a
 * grouped product's: MMV_SL_WARPS) a warp can stage, the block's staged
 * inputs within its shared memory */
static bool mmv_sliceable(const mmv_args *a)
{
    return (a->plan ? a->n <= 8 : a->n == 1) && a->n_split > 1 &&
           a->n_split <= (a->plan ? MMV_SL_WARPS : MMV_WARPS) && a->kslice <= MMV_SL_K_MAX &&
           mmv_slices_smem(a, a->n_split) <= MMV_SMEM_MAX;
}

/* k_mmv_slices' blocks: 16 rows each, weight after weight (a->bx_end) */
static int32_t mmv_rows16(mmv_args *a)
{
    int32_t bx = 0;
    for (int32_t i = 0; i < a->n_w; i++) {
        bx += (int32_t)cdiv(a->M[i], 16);
        a->bx_end[i] = bx;
    }
    return bx;
}

/* The launch shared by plain and grouped products: a holds the weights,
 * input and outputs; n_z slots, fill_z as mmv_setup takes them. */
static void mmv_run(struct cuda_backend *c, mmv_args *a, int32_t n_z, int32_t fill_z, const struct mm_fused *f)
{
    int64_t m_sum;
    int32_t bx = mmv_setup(c, a, n_z, fill_z, f, &m_sum);
    const int32_t resident = c->mmv_per_sm * c->n_sm;
    if (mmv_sliceable(a) && (a->plan || mmv_slices_one_wave(c, false, mmv_blocks16(a), a->n_split))) {
        /* as many warps as k_mmv's blocks would have, in blocks of 16 rows */
        bx = mmv_rows16(a);
        cuda_launch_dep(c, c->precise ? k_mmv_slices<true, false> : k_mmv_slices<false, false>, dim3(bx, 1, n_z),
                        dim3(a->n_split * 32), mmv_slices_smem(a, a->n_split), *a);
        return;
    }
    if (a->n_split > 1) {
        const int64_t n_sq = f->pre == MM_PRE_RMSNORM ? (int64_t)bx * n_z : 0;
        float *part = (float *)cuda_scratch(c, SCR_MATMUL,
                                            (size_t)a->n_split * a->n_pos * (m_sum + n_sq) * sizeof(float));
        if (!part)
            return;
        for (int32_t i = 0; i < a->n_w; i++) {
            a->part[i] = part;
            part += (int64_t)a->n_split * a->n_pos * a->M[i];
        }
        a->sq = part;
    }
    a->count = c->counters;
    /* stage as much of the slice as fits: fewer block-wide waits, same
     * arithmetic (bf16 halves: two when precise, else one) */
    const int32_t halves = c->precise ? 2 : 1;
    int32_t ks = MMV_STAGE_BYTES / (8 * a->nb * 2 * halves) - MMV_PAD;
    ks = ks / 128 * 128; /* whole segments; staged rows 64 bytes apart mod 128 */
    if (ks > a->kslice)
        ks = (int32_t)cdiv(a->kslice, 64) * 64;
    a->ks = ks;
    a->n_seg = f->pre == MM_PRE_RMSNORM ? (int32_t)cdiv(a->kslice, 128) : 0;
    const size_t smem = (size_t)halves * 8 * a->nb * (ks + MMV_PAD) * sizeof(__nv_bfloat16) +
                        (size_t)a->n * a->n_seg * sizeof(float);
    /* a batch over more units than a wave, each slice staged whole: a wave
     * of blocks, each staging its slice once and requesting its next unit's
     * weights before ending the one before (qwen3-8b's products of 24 tokens
     * on an H200: 5% faster; a lone token's: 1% slower, so not for one tile) */
    if (a->nb > 1 && !a->plan && ks >= a->kslice && (int64_t)bx * a->n_split > resident && resident >= a->n_split) {
        a->per_split = resident / a->n_split < bx ? resident / a->n_split : bx;
        cuda_launch_dep(c, mmv_kernel(a->nb, c->precise, true), dim3(a->per_split * a->n_split),
                        dim3(MMV_WARPS * 32), smem, *a);
        return;
    }
    cuda_launch_dep(c, mmv_kernel(a->nb, c->precise, false), dim3(bx, a->n_split, n_z), dim3(MMV_WARPS * 32), smem,
                    *a);
}

static void mmv_launch(struct cuda_backend *c, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                       const struct tensor *x, const struct mm_fused *f)
{
    const int32_t n = (int32_t)x->n_rows;
    mmv_args a = {};
    a.x = (const float *)x->data;
    a.xs = x->row_stride;
    a.n = a.n_pos = n;
    a.nb = (n + 7) / 8;
    a.K = (int32_t)x->n_cols;
    a.n_w = n_w;
    for (int32_t i = 0; i < n_w; i++) {
        a.w[i] = (const uint16_t *)w[i]->data;
        a.ws[i] = w[i]->row_stride;
        a.M[i] = (int32_t)w[i]->n_rows;
        a.out[i] = (float *)out[i]->data;
        a.os[i] = out[i]->row_stride;
    }
    mmv_run(c, &a, 1, 1, f);
}

/* a grouped product's arguments (struct mm_group) */
static mmv_args mmv_grouped_args(const struct mm_group *g, int32_t n_w, float *const *out, int64_t os, const float *x,
                                 int64_t xs, int32_t K)
{
    mmv_args a = {};
    a.x = x;
    a.xs = xs;
    a.n = g->n_max;
    a.n_pos = g->n_pos;
    a.nb = (g->n_max + 7) / 8;
    a.K = K;
    a.n_w = n_w;
    a.plan = g->plan;
    a.max_act = g->max_act;
    a.gather = g->gather;
    for (int32_t i = 0; i < n_w; i++) {
        a.ew[i] = g->w[i];
        a.ws[i] = g->ws;
        a.M[i] = g->M[i];
        a.out[i] = out[i];
        a.os[i] = os;
    }
    return a;
}

void cuda_matmul_grouped(struct cuda_backend *c, const struct mm_group *g, int32_t n_w, float *const *out, int64_t os,
                         const float *x, int64_t xs, int32_t K, const struct mm_fused *f)
{
    assert(n_w >= 1 && n_w <= MM_MAX_W && g->n_max <= CUDA_SMALL_N && f->pre != MM_PRE_RMSNORM);
    if (cuda_op_skip(c) || g->n_pos == 0)
        return;
    mmv_args a = mmv_grouped_args(g, n_w, out, os, x, xs, K);
    mmv_run(c, &a, g->max_act, g->fill_slots, f);
}

int cuda_matmul_grouped_combine(struct cuda_backend *c, const struct mm_group *g, float *out, const float *x,
                                int64_t xs, int32_t K, const struct mm_fused *f, const int32_t *tpos, const float *tw,
                                int32_t k, const float *add)
{
    assert(f->pre != MM_PRE_RMSNORM);
    float *const outs[1] = {out};
    mmv_args a = mmv_grouped_args(g, 1, outs, 0, x, xs, K);
    int64_t m_sum;
    mmv_setup(c, &a, g->max_act, g->fill_slots, f, &m_sum);
    if (!mmv_sliceable(&a) || g->max_act != k || k * a.n_split > MMV_SL_WARPS)
        return -1;
    /* in one wave only: nemotron-3-nano's 168 blocks of 12 warps, one an
     * SM, took 1.27 waves, slower than the grouped product's many short
     * blocks and the combine's launch */
    const int32_t bx = mmv_rows16(&a);
    if (!mmv_slices_one_wave(c, true, bx, k * a.n_split))
        return -1;
    if (cuda_op_skip(c))
        return 0;
    a.tpos = tpos;
    a.tw = tw;
    a.k_pick = k;
    a.add = add;
    cuda_launch_dep(c, c->precise ? k_mmv_slices<true, true> : k_mmv_slices<false, true>, dim3(bx),
                    dim3(k * a.n_split * 32), mmv_slices_smem(&a, k * a.n_split), a);
    return 0;
}

/* out = x . w^T, one weight, whatever its dtype and the batch size */
static void mm_one(struct cuda_backend *c, struct tensor *out, const struct tensor *x, const struct tensor *w)
{
    const int32_t n = (int32_t)x->n_rows, K = (int32_t)x->n_cols, M = (int32_t)w->n_rows;
    const struct mm_fused plain = {MM_PRE_NONE, NULL, 0.0f, NULL, false, NULL, NULL};
    if (dtype_is_block(w->type)) {
        cuda_matmul_q(&c->base, 1, &out, &w, x, &plain);
    } else if (mmv_fits(x, w) && n <= CUDA_SMALL_N) {
        mmv_launch(c, 1, &out, &w, x, &plain);
    } else if (mmv_fits(x, w)) {
        cuda_mm_prefill(c, 1, &out, &w, x, &plain);
    } else {
        k_mm_simt<<<dim3(cdiv(M, 16), cdiv(n, 16)), 256, 0, c->stream>>>((const float *)x->data, x->row_stride, n,
                                                                          w->data, w->type, w->row_stride, K, M,
                                                                          (float *)out->data, out->row_stride);
        CUDA_LAUNCHED(c);
    }
}

void cuda_matmul_fused(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                       const struct tensor *x, const struct mm_fused *f)
{
    struct cuda_backend *c = cuda_of(be);
    const int64_t n = x->n_rows;
    assert(n_w >= 1 && n_w <= MM_MAX_W);
    for (int32_t i = 0; i < n_w; i++)
        assert(x->n_cols == w[i]->n_cols && out[i]->n_rows == n && out[i]->n_cols == w[i]->n_rows);
    if (cuda_op_skip(c) || n == 0)
        return;
    bool quant = true;
    for (int32_t i = 0; i < n_w; i++)
        quant = quant && dtype_is_block(w[i]->type);
    if (quant) {
        cuda_matmul_q(be, n_w, out, w, x, f);
        return;
    }
    /* both paths read SwiGLU's up as they read x, 16 bytes at a time */
    bool fits = f->pre != MM_PRE_SWIGLU || cuda_rows_vec8((const float *)f->up->data, f->up->row_stride, x->n_cols);
    for (int32_t i = 0; i < n_w; i++)
        fits = fits && mmv_fits(x, w[i]);
    if (fits && n > CUDA_SMALL_N) {
        cuda_mm_prefill(c, n_w, out, w, x, f);
        return;
    }
    if (fits && (f->pre != MM_PRE_RMSNORM || x->n_cols <= MMV_RMS_K_MAX)) {
        mmv_launch(c, n_w, out, w, x, f);
        return;
    }
    backend_matmul_pieces(be, n_w, out, w, x, f); /* odd shapes and dtypes */
}

void cuda_matmul(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w)
{
    struct cuda_backend *c = cuda_of(be);
    assert(x->n_cols == w->n_cols && out->n_rows == x->n_rows && out->n_cols == w->n_rows);
    if (!cuda_op_skip(c) && x->n_rows > 0)
        mm_one(c, out, x, w);
}
