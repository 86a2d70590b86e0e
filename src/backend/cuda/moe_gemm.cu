/* moe_gemm: a large MoE batch's expert products in fast mode on Hopper, as
 * one grouped launch a product where cuBLAS takes a batched call per bucket
 * of equally padded slices (moe.cu's moe_gemms).
 *
 * out[r] = x[r] . w[e]^T for every row r of expert e's slice of the sorted
 * list, bf16 operands, fp32 accumulation, the output rounded to bf16: what
 * cuBLAS's products compute, up to the order of the sums, and then a bf16
 * store (the down product's fp32 outputs, written here and read back by the
 * combine, were the largest traffic of a prefill's MoE layer: 268 MB each
 * way a layer of qwen3-30b-a3b at 4096 tokens). A block takes 128 rows of
 * one expert's slice (a tile, listed by the host) and 256 output columns:
 * a producer warpgroup fetches the rows' inputs and the expert's weights by
 * TMA, 64 inputs a stage in four stages, and two consumer warpgroups of 64
 * rows run m64n256k16 wgmma on them (sm90.h). The experts' first products
 * end in their activation: SwiGLU's block takes 128 columns of gate and the
 * same 128 of up, relu^2's 256 of up, and each stores the activation as
 * bf16, rounded as k_split_bf16 rounds it, the down product's input (the
 * fp32 products and their pass through k_split_bf16 moved ~400 MB a layer
 * of qwen3-30b-a3b's 4096-token prefill). A tile reaching past its
 * slice reads the next slice's rows (finite) or, past the list, zeros, and
 * stores only its own; inputs past K and weight rows past N are zeros. The
 * slices need no padding: the host plans them unpadded.
 *
 * Built for sm_90a (the Makefile's rule for the sm_90a files); launched
 * only where c->tma_encode is set, a device of compute capability 9.0. */
#include "cuda_impl.h"
#include "sm90.h"

#define MG_BN 256 /* output columns a block */
#define MG_BK 64  /* inputs a stage: one 128-byte swizzled row */
#define MG_NS 4   /* stages */

struct moe_gemm_args {
    const int32_t *tiles;    /* [n_tiles][2]: the expert, the tile's first row */
    const int32_t *start;    /* [E + 1] the experts' slices */
    const CUtensorMap *w[2]; /* the experts' weight maps [E]: the product's, or SwiGLU's gate and up */
    __nv_bfloat16 *out;      /* [rows][N]: the product, or its activation */
    enum mm_pre pre;         /* MM_PRE_NONE, MM_PRE_SWIGLU or MM_PRE_RELU2 */
    int32_t N, K;
};

#if FW_WGMMA
/* a pair of outputs rounded to bf16 as k_split_bf16 rounds them: SwiGLU of
 * x and u, relu^2 of x, or x */
template <enum mm_pre P> static __device__ __forceinline__ uint32_t mg_out(float x0, float x1, float u0, float u1)
{
    if (P == MM_PRE_SWIGLU) {
        x0 = x0 / (1.0f + expf(-x0)) * u0;
        x1 = x1 / (1.0f + expf(-x1)) * u1;
    } else if (P == MM_PRE_RELU2) {
        x0 = x0 > 0.0f ? x0 * x0 : 0.0f;
        x1 = x1 > 0.0f ? x1 * x1 : 0.0f;
    }
    uint32_t h, l;
    split_bf16x2(x0, x1, &h, &l);
    return h;
}

/* one operand's 256 output columns from n0 (past N: none) of rows a and b,
 * where they are inside the tile */
template <enum mm_pre P>
static __device__ __forceinline__ void mg_store(__nv_bfloat16 *out, const float (*d)[4], int32_t N, int32_t n0,
                                                int64_t oa, int64_t ob, bool in_a, bool in_b)
{
#pragma unroll
    for (int j = 0; j < 32 && n0 + 8 * j < N; j++) {
        if (in_a)
            *(uint32_t *)(out + oa + 8 * j) = mg_out<P>(d[j][0], d[j][1], 0.0f, 0.0f);
        if (in_b)
            *(uint32_t *)(out + ob + 8 * j) = mg_out<P>(d[j][2], d[j][3], 0.0f, 0.0f);
    }
}
#endif

__global__ void __launch_bounds__(384, 1) k_moe_gemm(const __grid_constant__ moe_gemm_args a,
                                                     const __grid_constant__ CUtensorMap x)
{
#if FW_WGMMA
    constexpr uint32_t A_BYTES = MOE_GEMM_ROWS * 128, STAGE = A_BYTES + MG_BN * 128;
    extern __shared__ uint8_t mg_raw[];
    __shared__ uint64_t full_bar[MG_NS], empty_bar[MG_NS]; /* a stage's copies in; its consumers done */
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(mg_raw), sm_s = raw_s + ((1024 - (raw_s & 1023)) & 1023);
    const int tid = threadIdx.x, wg = tid >> 7, warp = tid >> 5 & 3, lane = tid & 31, g = lane >> 2, cq = lane & 3;
    /* x: the output columns, y: the tile; a tile's blocks run together and
     * share its rows through the L2, and an expert's tiles follow each
     * other and share its weights, where the tiles fastest read every row
     * from memory once a column block */
    const bool glu = a.pre == MM_PRE_SWIGLU;
    const int32_t n0 = (int32_t)blockIdx.x * (glu ? MG_BN / 2 : MG_BN), n_k = (a.K + MG_BK - 1) / MG_BK;
    const int32_t e = a.tiles[2 * blockIdx.y], row0 = a.tiles[2 * blockIdx.y + 1];
    if (tid == 0)
        mbar_ring_init(full_bar, empty_bar, MG_NS, 8);
    __syncthreads();
    if (wg == 2) { /* the producer: its registers go to the consumers (168 at launch: 40 here, 232 there) */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 0 && lane == 0)
            for (int32_t kt = 0; kt < n_k; kt++) {
                const int st = kt % MG_NS;
                if (kt >= MG_NS)
                    mbar_wait(&empty_bar[st], (kt / MG_NS & 1) ^ 1);
                mbar_expect(&full_bar[st], STAGE);
                tma2(sm_s + st * STAGE, &x, kt * MG_BK, row0, &full_bar[st]);
                tma2(sm_s + st * STAGE + A_BYTES, a.w[0] + e, kt * MG_BK, n0, &full_bar[st]);
                if (glu) /* up's rows after gate's: accumulators j and j + 16 hold the same output */
                    tma2(sm_s + st * STAGE + A_BYTES + MG_BN / 2 * 128, a.w[1] + e, kt * MG_BK, n0, &full_bar[st]);
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    float d[32][4];
#pragma unroll
    for (int j = 0; j < 32; j++)
        d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    for (int32_t kt = 0; kt < n_k; kt++) {
        const int st = kt % MG_NS;
        mbar_wait(&full_bar[st], kt / MG_NS & 1);
        const uint32_t a_s = sm_s + st * STAGE + wg * 64 * 128, b_s = sm_s + st * STAGE + A_BYTES;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < MG_BK / 16; kk++)
            wg_ss_n256(d, wg_desc(a_s + kk * 32), wg_desc(b_s + kk * 32), 1);
        wg_commit();
        /* the stage before is done with: its products were the group before */
        wg_wait_one();
        if (kt > 0 && lane == 0)
            mbar_arrive(&empty_bar[(kt - 1) % MG_NS]);
    }
    wg_wait_all();
    wg_pin<32>(d);
    const int32_t end = min(row0 + MOE_GEMM_ROWS, a.start[e + 1]), ra = row0 + wg * 64 + warp * 16 + g, rb = ra + 8;
    const int64_t oa = (int64_t)ra * a.N + n0 + 2 * cq, ob = (int64_t)rb * a.N + n0 + 2 * cq;
    if (glu) {
#pragma unroll
        for (int j = 0; j < 16 && n0 + 8 * j < a.N; j++) {
            if (ra < end)
                *(uint32_t *)(a.out + oa + 8 * j) = mg_out<MM_PRE_SWIGLU>(d[j][0], d[j][1], d[j + 16][0], d[j + 16][1]);
            if (rb < end)
                *(uint32_t *)(a.out + ob + 8 * j) = mg_out<MM_PRE_SWIGLU>(d[j][2], d[j][3], d[j + 16][2], d[j + 16][3]);
        }
    } else if (a.pre == MM_PRE_RELU2) {
        mg_store<MM_PRE_RELU2>(a.out, d, a.N, n0, oa, ob, ra < end, rb < end);
    } else {
        mg_store<MM_PRE_NONE>(a.out, d, a.N, n0, oa, ob, ra < end, rb < end);
    }
#else
    (void)a;
    (void)x;
    __trap(); /* launched only where the sm_90a build runs (c->tma_encode) */
#endif
}

bool cuda_moe_gemm_fits(const struct cuda_backend *c) { return c->tma_encode && !c->precise; }

void *cuda_moe_gemm_maps(struct cuda_backend *c, const struct moe_experts *ex)
{
    const int32_t E = ex->n_expert;
    const struct tensor *mats[3] = {ex->gate, ex->up, ex->down};
    CUtensorMap *host = (CUtensorMap *)calloc((size_t)3 * E, sizeof *host), *dev = NULL;
    if (!host)
        goto fail;
    for (int m = 0; m < 3; m++)
        for (int32_t e = 0; mats[m] && e < E; e++) {
            const struct tensor *t = &mats[m][e];
            const uint64_t dims[2] = {(uint64_t)t->n_cols, (uint64_t)t->n_rows}, stride[1] = {(uint64_t)t->row_stride * 2};
            const uint32_t box[2] = {MG_BK, (uint32_t)(m < 2 && ex->gate ? MG_BN / 2 : MG_BN)};
            if (cuda_tma_map(c, &host[m * E + e], t->data, 2, dims, stride, box) != 0)
                goto fail;
        }
    if (CUDA_CHECK(c, cudaMalloc((void **)&dev, (size_t)3 * E * sizeof *host)) != 0 ||
        CUDA_CHECK(c, cudaMemcpy(dev, host, (size_t)3 * E * sizeof *host, cudaMemcpyHostToDevice)) != 0)
        goto fail;
    free(host);
    return dev;
fail:
    free(host);
    cudaFree(dev);
    c->failed = true;
    err_set("cuda: the expert weights' tensor maps could not be made");
    return NULL;
}

int cuda_moe_gemm(struct cuda_backend *c, const void *w0, const void *w1, const __nv_bfloat16 *x, int64_t n_rows,
                  int64_t K, int64_t N, const int32_t *tiles, int32_t n_tiles, const int32_t *start, enum mm_pre pre,
                  __nv_bfloat16 *out)
{
    assert((pre == MM_PRE_SWIGLU) == (w1 != NULL) && N % 2 == 0);
    if (cuda_op_skip(c) || n_tiles == 0)
        return c->failed ? -1 : 0;
    CUtensorMap xm;
    const uint64_t dims[2] = {(uint64_t)K, (uint64_t)n_rows}, stride[1] = {(uint64_t)K * 2};
    const uint32_t box[2] = {MG_BK, MOE_GEMM_ROWS};
    if (cuda_tma_map(c, &xm, x, 2, dims, stride, box) != 0) {
        c->failed = true;
        err_set("cuda: the experts' input tensor map could not be made");
        return -1;
    }
    const int smem = MG_NS * (MOE_GEMM_ROWS + MG_BN) * 128 + 1024;
    if (CUDA_CHECK(c, cudaFuncSetAttribute(k_moe_gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != 0)
        return -1;
    const moe_gemm_args a = {
        tiles, start, {(const CUtensorMap *)w0, (const CUtensorMap *)w1}, out, pre, (int32_t)N, (int32_t)K,
    };
    assert(n_tiles <= 65535); /* a grid's y */
    k_moe_gemm<<<dim3(cdiv(N, w1 ? MG_BN / 2 : MG_BN), (unsigned)n_tiles), 384, smem, c->stream>>>(a, xm);
    return CUDA_LAUNCHED(c);
}
