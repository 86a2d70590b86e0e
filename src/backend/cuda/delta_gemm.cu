/* delta_gemm: a prompt's chunked gated delta rule as batched cuBLAS products
 * (fp32 operands on TF32 tensor cores) and a chain kernel, outside precise
 * mode; the cpu's delta_rule_chunk and torch_chunk_gated_delta_rule are the
 * reference. Per
 * chunk c and value head h, with g the cumulative log decay and beta the
 * rows' step sizes:
 *   A_ts = -beta_t (k_t.k_s) e^{g_t-g_s} (s < t), T = (I - A)^-1,
 *   U = T diag(beta) V,  W = T diag(beta e^{g}) K,
 *   P_ts = (q_t.k_s) e^{g_t-g_s} (s <= t),
 * and with K~ the rows e^{g_L-g_s} k_s and S the state entering the chunk:
 *   S' = e^{g_L} S + N S + K~^T U with N = -K~^T W,
 *   out = Z S + P U   with Z = e^{g} q - P W.
 * Everything but T and the chain S' = e^{g_L} S + N S + R runs for all
 * chunks at once as products; T is a 64 x 64 unit lower triangular solve, a
 * thread per column; the chain is one launch, each block carrying a head's
 * slice of state columns from chunk to chunk. Segments of DG_ROWS rows bound
 * the scratch (~0.45 GB at qwen3.5-9b's 32 heads of 128 x 128). */
#include "cuda_impl.h"

#include <math.h>

#define DC CUDA_DELTA_CHUNK
#define DG_ROWS 2048
#define DG_U 4 /* elements a thread loads before it stores any */
#define DG_CK 128 /* the widest k head dim the chain kernel takes */
#define DG_CN 32  /* state columns a chain block carries: four mma column tiles */
#define DG_SP (DG_CN + 8) /* the state slice's row pitch: a warp's B fragments on distinct banks */
#define DG_WN 2 /* warps sharing a chain block's 16 rows, each its share of the columns */
#define DG_NT (DG_CN / 8 / DG_WN) /* a warp's mma column tiles */

struct dg_args {
    float *out;
    int64_t os;
    const float *qn, *kn, *v, *gb;
    int64_t vs;
    int32_t Hk, Hv, dk, dv, n, c0; /* c0: the segment's first chunk */
    /* per (chunk, head) of the segment, [c][h] then: */
    float *Kp, *Qp, *Kt, *Z, *W; /* [DC][dk]: k, q (zero past the prompt), K~, Z */
    float *Vp, *U, *O;           /* [DC][dv]: v (zero past the prompt), U, the outputs */
    float *Gk, *Gq, *Te;         /* [DC][DC]: K K^T then T diag(beta); K Q^T then P^T; T diag(beta e^g) */
    float *gc, *beta;            /* [DC]: cumulative log decay, beta (0 past the prompt) */
    float *N;                    /* [dk][dk]: -K~^T W, M less its e^{g_L} I */
    float *S;                    /* [c+1][h][dk][dv]: the states entering each chunk, then the last */
};

/* block per (chunk, head): the chunk's rows packed and zero past the prompt,
 * g's prefix sums (g 0 past the prompt, so g_L is the last entry), K~ and
 * Z's first term e^{g_t} q_t */
__global__ void k_dg_pack(struct dg_args a)
{
    __shared__ float gc[DC];
    const int32_t c = blockIdx.x, h = blockIdx.y, kh = h / (a.Hv / a.Hk), t0 = (a.c0 + c) * DC;
    const int32_t L = min(DC, a.n - t0), dk = a.dk, dv = a.dv;
    const int64_t blk = (int64_t)c * a.Hv + h, ck = blk * DC * dk, cv = blk * DC * dv;
    if (threadIdx.x < DC) {
        const int32_t t = threadIdx.x;
        const int64_t gi = 2 * ((int64_t)(t0 + t) * a.Hv + h);
        gc[t] = t < L ? a.gb[gi] : 0.0f;
        a.beta[blk * DC + t] = t < L ? a.gb[gi + 1] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < 32)
        warp_prefix_sum(gc, DC);
    __syncthreads();
    const float gl = gc[DC - 1];
    if (threadIdx.x < DC)
        a.gc[blk * DC + threadIdx.x] = gc[threadIdx.x];
    for (int32_t e0 = threadIdx.x; e0 < DC * dk; e0 += DG_U * blockDim.x) {
        float k[DG_U], q[DG_U];
#pragma unroll
        for (int u = 0; u < DG_U; u++) {
            const int32_t e = e0 + u * blockDim.x, t = e / dk, d = e % dk;
            const int64_t src = ((int64_t)(t0 + t) * a.Hk + kh) * dk + d;
            k[u] = e < DC * dk && t < L ? a.kn[src] : 0.0f;
            q[u] = e < DC * dk && t < L ? a.qn[src] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < DG_U; u++) {
            const int32_t e = e0 + u * blockDim.x, t = e / dk;
            if (e < DC * dk) {
                a.Kp[ck + e] = k[u];
                a.Qp[ck + e] = q[u];
                a.Kt[ck + e] = k[u] * expf(gl - gc[t]);
                a.Z[ck + e] = q[u] * expf(gc[t]);
            }
        }
    }
    for (int32_t e0 = threadIdx.x; e0 < DC * dv; e0 += DG_U * blockDim.x) {
        float v[DG_U];
#pragma unroll
        for (int u = 0; u < DG_U; u++) {
            const int32_t e = e0 + u * blockDim.x, t = e / dv, d = e % dv;
            v[u] = e < DC * dv && t < L ? a.v[(int64_t)(t0 + t) * a.vs + (int64_t)h * dv + d] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < DG_U; u++)
            if (e0 + u * (int32_t)blockDim.x < DC * dv)
                a.Vp[cv + e0 + u * blockDim.x] = v[u];
    }
}

/* block per (chunk, head), thread s per column of T = (I - A)^-1: T_ts =
 * [t == s] + sum_{m<t} A_tm T_ms, the column in registers (T_ms = 0 for m <
 * s, and for m >= t before row t is reached), A broadcast from shared
 * memory. Rows past the prompt have beta 0: A's rows there are zero, so
 * T diag(beta) and T diag(beta e^g) are zero there and U, W with them. */
__global__ void __launch_bounds__(DC) k_dg_solve(struct dg_args a)
{
    __shared__ float4 A[DC][DC / 4];
    __shared__ float gc[DC], beta[DC];
    const int32_t s = threadIdx.x;
    const int64_t blk = (int64_t)blockIdx.x * a.Hv + blockIdx.y;
    float *gk = a.Gk + blk * DC * DC, *gq = a.Gq + blk * DC * DC, *te = a.Te + blk * DC * DC;
    gc[s] = a.gc[blk * DC + s];
    beta[s] = a.beta[blk * DC + s];
    __syncthreads();
    float *af = &A[0][0].x;
    for (int32_t e = s; e < DC * DC; e += DC) {
        const int32_t r = e / DC, col = e % DC;
        af[e] = col < r ? -beta[r] * gk[e] * expf(gc[r] - gc[col]) : 0.0f;
        gq[e] = r <= col ? gq[e] * expf(gc[col] - gc[r]) : 0.0f; /* P^T: [s][t] = k_s.q_t e^{g_t-g_s} */
    }
    __syncthreads();
    float x[DC];
#pragma unroll
    for (int32_t t = 0; t < DC; t++)
        x[t] = 0.0f;
#pragma unroll
    for (int32_t t = 0; t < DC; t++) {
        float acc = t == s ? 1.0f : 0.0f;
#pragma unroll
        for (int32_t m4 = 0; m4 < (t + 3) / 4; m4++) {
            const float4 w = A[t][m4];
            acc += w.x * x[4 * m4];
            acc += w.y * x[4 * m4 + 1];
            acc += w.z * x[4 * m4 + 2];
            acc += w.w * x[4 * m4 + 3];
        }
        x[t] = acc;
    }
    const float b = beta[s], be = b * expf(gc[s]);
#pragma unroll
    for (int32_t t = 0; t < DC; t++) {
        gk[t * DC + s] = x[t] * b;
        te[t * DC + s] = x[t] * be;
    }
}

/* block per prompt row of the segment: the outputs to their rows */
__global__ void k_dg_out(struct dg_args a)
{
    const int32_t r = blockIdx.x, c = r / DC, t = r % DC, i = a.c0 * DC + r, HV = a.Hv * a.dv;
    for (int32_t e0 = threadIdx.x; e0 < HV; e0 += DG_U * blockDim.x) {
        float o[DG_U];
#pragma unroll
        for (int u = 0; u < DG_U; u++) {
            const int32_t e = e0 + u * blockDim.x, h = e / a.dv, j = e % a.dv;
            o[u] = e < HV ? a.O[(((int64_t)c * a.Hv + h) * DC + t) * a.dv + j] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < DG_U; u++)
            if (e0 + u * (int32_t)blockDim.x < HV)
                a.out[(int64_t)i * a.os + e0 + u * blockDim.x] = o[u];
    }
}

/* x as a tf32 pair, hi + lo: hi x's top 19 bits, lo the exact rest (the
 * tensor cores read its top 19 bits in turn), by a mask and a subtraction */
static __device__ __forceinline__ void tf32_split(float x, uint32_t *hi, uint32_t *lo)
{
    *hi = __float_as_uint(x) & 0xffffe000u;
    *lo = __float_as_uint(x - __uint_as_float(*hi));
}

/* c += a.b on the tensor cores: m16n8k8, tf32 inputs, fp32 accumulation */
static __device__ __forceinline__ void mma_tf32(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* N's row pitch in shared memory (4 past a multiple of 32: a warp's A
 * fragments on distinct banks), the rows the warps cover, and the bytes:
 * N_j and N_{j+1}, the state slice's hi and lo halves */
static __host__ __device__ int32_t dg_chain_mp(int32_t dk) { return (dk + 31) / 32 * 32 + 4; }
static __host__ __device__ int32_t dg_chain_rows(int32_t dk) { return (dk + 15) / 16 * 16; }
static size_t dg_chain_smem(int32_t dk)
{
    return ((size_t)2 * dg_chain_rows(dk) * dg_chain_mp(dk) + (size_t)2 * dg_chain_rows(dk) * DG_SP) * sizeof(float);
}

/* block per (value head, DG_CN state columns), DG_WN warps per 16 rows: the
 * chain S_{j+1} = e^{g_L} S_j + N_j S_j + R_j over the segment's nc chunks
 * in one launch (R_j waits in S_{j+1}'s place). N_{j+1} is fetched into
 * shared memory and R_{j+1} into registers while chunk j's product runs.
 * On an H200 a chunk's step takes ~6 us for qwen3.5-9b's 32 heads (cuBLAS's
 * batched product per chunk ~9); without the products it still took ~4 us,
 * fetching N_j (64 KB a block), and N two chunks ahead did not shorten it.
 * The products in 3xTF32 (hi.hi + hi.lo + lo.hi, each its own accumulator),
 * about fp32's accuracy: the chain carries each chunk's rounding on to the
 * next; the state slice is kept split. Shared memory past dk (N's rows and
 * columns, the state's rows) and columns past dv stay zero. */
__global__ void __launch_bounds__(DG_CK / 16 * DG_WN * 32) k_dg_chain(struct dg_args a, int32_t nc)
{
    extern __shared__ float sm[];
    const int32_t dk = a.dk, dv = a.dv, h = blockIdx.x, c0 = blockIdx.y * DG_CN, mp = dg_chain_mp(dk);
    const int32_t rows = dg_chain_rows(dk), q4 = dk / 4, warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int32_t t = threadIdx.x % 4, ra = warp % (rows / 16) * 16 + g, rb = ra + 8;
    const int32_t cw = warp / (rows / 16) * DG_NT * 8; /* the warp's first column in the slice */
    const int64_t kk = (int64_t)dk * dk, sv = (int64_t)dk * dv, hkv = (int64_t)a.Hv * sv;
    float *ms = sm;
    uint32_t *sh = (uint32_t *)(sm + 2 * rows * mp), *sl = sh + rows * DG_SP;
    for (int32_t e = threadIdx.x; e < 2 * rows * mp; e += blockDim.x)
        ms[e] = 0.0f;
    for (int32_t e = threadIdx.x; e < rows * DG_CN; e += blockDim.x) {
        const int32_t r = e / DG_CN, col = e % DG_CN;
        tf32_split(r < dk && c0 + col < dv ? a.S[h * sv + (int64_t)r * dv + c0 + col] : 0.0f, &sh[r * DG_SP + col],
                   &sl[r * DG_SP + col]);
    }
    float rn[DG_NT][4]; /* R of the chunk whose product runs next */
    const auto r_load = [&](int32_t j) {
        const float *sn = a.S + (int64_t)(j + 1) * hkv + h * sv;
#pragma unroll
        for (int nt = 0; nt < DG_NT; nt++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int32_t r = u < 2 ? ra : rb, col = c0 + cw + nt * 8 + 2 * t + (u & 1);
                rn[nt][u] = r < dk && col < dv ? sn[(int64_t)r * dv + col] : 0.0f;
            }
    };
    const auto n_load = [&](int32_t j) { /* into buffer j & 1, last read by chunk j - 2 (before a barrier since) */
        const float *src = a.N + ((int64_t)j * a.Hv + h) * kk;
        float *dst = ms + (j & 1) * rows * mp;
        for (int32_t e = threadIdx.x; e < dk * q4; e += blockDim.x)
            cp_async16(dst + (e / q4) * mp + (e % q4) * 4, src + (int64_t)(e / q4) * dk + (e % q4) * 4, 16);
        cp_async_commit();
    };
    __syncthreads();
    n_load(0);
    r_load(0);
    for (int32_t i = 0; i < nc; i++) {
        if (i + 1 < nc) {
            n_load(i + 1);
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
        const float egl = expf(a.gc[((int64_t)i * a.Hv + h) * DC + DC - 1]);
        float acc[3][DG_NT][4];
#pragma unroll
        for (int nt = 0; nt < DG_NT; nt++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int32_t o = (u < 2 ? ra : rb) * DG_SP + cw + nt * 8 + 2 * t + (u & 1);
                acc[0][nt][u] = rn[nt][u] + egl * (__uint_as_float(sh[o]) + __uint_as_float(sl[o]));
                acc[1][nt][u] = acc[2][nt][u] = 0.0f;
            }
        if (i + 1 < nc)
            r_load(i + 1);
        const float *mb = ms + (i & 1) * rows * mp;
#pragma unroll 2
        for (int32_t k0 = 0; k0 < dk; k0 += 8) {
            uint32_t ah[4], al[4];
            tf32_split(mb[ra * mp + k0 + t], &ah[0], &al[0]);
            tf32_split(mb[rb * mp + k0 + t], &ah[1], &al[1]);
            tf32_split(mb[ra * mp + k0 + t + 4], &ah[2], &al[2]);
            tf32_split(mb[rb * mp + k0 + t + 4], &ah[3], &al[3]);
#pragma unroll
            for (int nt = 0; nt < DG_NT; nt++) {
                const int32_t o0 = (k0 + t) * DG_SP + cw + nt * 8 + g, o1 = o0 + 4 * DG_SP;
                mma_tf32(acc[0][nt], ah, sh[o0], sh[o1]);
                mma_tf32(acc[1][nt], ah, sl[o0], sl[o1]);
                mma_tf32(acc[2][nt], al, sh[o0], sh[o1]);
            }
        }
        __syncthreads(); /* every read of S_i and of N_i done */
        float *sn = a.S + (int64_t)(i + 1) * hkv + h * sv;
#pragma unroll
        for (int nt = 0; nt < DG_NT; nt++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int32_t r = u < 2 ? ra : rb, col = cw + nt * 8 + 2 * t + (u & 1);
                const float v = acc[0][nt][u] + (acc[1][nt][u] + acc[2][nt][u]);
                if (r < dk && c0 + col < dv) {
                    tf32_split(v, &sh[r * DG_SP + col], &sl[r * DG_SP + col]);
                    sn[(int64_t)r * dv + c0 + col] = v;
                }
            }
    }
}

bool cuda_delta_gemm_takes(const struct cuda_backend *c, int32_t dk)
{
    return !c->precise && c->one_chain && c->b.n_tokens >= 256 && dk % 4 == 0 && dk <= DG_CK;
}

int cuda_delta_gemm(struct cuda_backend *c, float *out, int64_t os, const float *qn, const float *kn, const float *v,
                    int64_t vs, const float *gb, int32_t Hk, int32_t Hv, int32_t dk, int32_t dv, float *state,
                    int64_t ss)
{
    const int32_t n = c->b.n_tokens, seg_c = DG_ROWS / DC, si = c->b.state_in[0], so = c->b.state_out[n - 1];
    assert(si >= 0);
    const int64_t hkv = (int64_t)Hv * dk * dv, ck = (int64_t)DC * dk, cv = (int64_t)DC * dv, kk = (int64_t)dk * dk;
    const int64_t cc = (int64_t)DC * DC, sv = (int64_t)dk * dv;
    const size_t f = sizeof(float), nb = (size_t)seg_c * Hv;
    enum { KP, QP, KT, ZZ, WW, VP, UU, OO, GK, GQ, TE, GC, BETA, NN, SS, N_PIECE };
    size_t sz[N_PIECE];
    for (int i = KP; i <= WW; i++)
        sz[i] = nb * ck * f;
    for (int i = VP; i <= OO; i++)
        sz[i] = nb * cv * f;
    for (int i = GK; i <= TE; i++)
        sz[i] = nb * cc * f;
    sz[GC] = sz[BETA] = nb * DC * f;
    sz[NN] = nb * kk * f;
    sz[SS] = (size_t)(seg_c + 1) * hkv * f;
    void *pc[N_PIECE];
    if (cuda_scratch_pieces(c, SCR_SCAN, N_PIECE, sz, pc) != 0)
        return -1;
    float *bf[N_PIECE];
    for (int i = 0; i < N_PIECE; i++)
        bf[i] = (float *)pc[i];
    struct dg_args a = {out,    os,     qn,     kn,     v,      gb,       vs,     Hk,     Hv,     dk,
                        dv,     n,      0,      bf[KP], bf[QP], bf[KT],   bf[ZZ], bf[WW], bf[VP], bf[UU],
                        bf[OO], bf[GK], bf[GQ], bf[TE], bf[GC], bf[BETA], bf[NN], bf[SS]};
    const size_t csm = dg_chain_smem(dk);
    if (CUDA_CHECK(c, cudaFuncSetAttribute(k_dg_chain, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csm)) != 0 ||
        CUDA_CHECK(c, cudaMemcpyAsync(a.S, state + (int64_t)si * ss, hkv * f, cudaMemcpyDeviceToDevice, c->stream)) !=
            0)
        return -1;
    const int32_t n_c = (int32_t)cdiv(n, DC);
    for (int32_t c0 = 0; c0 < n_c; c0 += seg_c) {
        const int32_t nc = n_c - c0 < seg_c ? n_c - c0 : seg_c, cnt = nc * Hv;
        a.c0 = c0;
        /* the state entering the segment: the last one's leaving state */
        if (c0 > 0 && CUDA_CHECK(c, cudaMemcpyAsync(a.S, a.S + (int64_t)seg_c * hkv, hkv * f,
                                                    cudaMemcpyDeviceToDevice, c->stream)) != 0)
            return -1;
        k_dg_pack<<<dim3((unsigned)nc, (unsigned)Hv), 256, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0 ||
            cuda_gemm_packed(c, DC, DC, dk, 1.0f, a.Kp, false, ck, a.Kp, true, ck, 0.0f, a.Gk, cc, cnt, false,
                             "delta rule K K^T") != 0 ||
            cuda_gemm_packed(c, DC, DC, dk, 1.0f, a.Kp, false, ck, a.Qp, true, ck, 0.0f, a.Gq, cc, cnt, false,
                             "delta rule K Q^T") != 0)
            return -1;
        k_dg_solve<<<dim3((unsigned)nc, (unsigned)Hv), DC, 0, c->stream>>>(a);
        /* U = T diag(beta) V; W = T diag(beta e^g) K; N = -K~^T W;
         * R = K~^T U into the next state's place; Z = e^{g} q - P W; O = P U */
        if (CUDA_LAUNCHED(c) != 0 ||
            cuda_gemm_packed(c, DC, dv, DC, 1.0f, a.Gk, false, cc, a.Vp, false, cv, 0.0f, a.U, cv, cnt, false,
                             "delta rule U") != 0 ||
            cuda_gemm_packed(c, DC, dk, DC, 1.0f, a.Te, false, cc, a.Kp, false, ck, 0.0f, a.W, ck, cnt, false,
                             "delta rule W") != 0 ||
            cuda_gemm_packed(c, dk, dk, DC, -1.0f, a.Kt, true, ck, a.W, false, ck, 0.0f, a.N, kk, cnt, false,
                             "delta rule K~^T W") != 0 ||
            cuda_gemm_packed(c, dk, dv, DC, 1.0f, a.Kt, true, ck, a.U, false, cv, 0.0f, a.S + hkv, sv, cnt, false,
                             "delta rule K~^T U") != 0 ||
            cuda_gemm_packed(c, DC, dk, DC, -1.0f, a.Gq, true, cc, a.W, false, ck, 1.0f, a.Z, ck, cnt, false,
                             "delta rule P W") != 0 ||
            cuda_gemm_packed(c, DC, dv, DC, 1.0f, a.Gq, true, cc, a.U, false, cv, 0.0f, a.O, cv, cnt, false,
                             "delta rule P U") != 0)
            return -1;
        /* the chain: S_{c+1} = e^{g_L} S_c + N_c S_c + R_c */
        k_dg_chain<<<dim3((unsigned)Hv, (unsigned)cdiv(dv, DG_CN)), (unsigned)(dg_chain_rows(dk) / 16 * DG_WN * 32), csm,
                     c->stream>>>(a, nc);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
        /* O += Z S_c */
        if (cuda_gemm_packed(c, DC, dv, dk, 1.0f, a.Z, false, ck, a.S, false, sv, 1.0f, a.O, cv, cnt, false,
                             "delta rule Z S") != 0)
            return -1;
        const int32_t rows = n - c0 * DC < nc * DC ? n - c0 * DC : nc * DC;
        k_dg_out<<<(unsigned)rows, 256, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
        if (c0 + nc == n_c && so >= 0 &&
            CUDA_CHECK(c, cudaMemcpyAsync(state + (int64_t)so * ss, a.S + (int64_t)nc * hkv, hkv * f,
                                          cudaMemcpyDeviceToDevice, c->stream)) != 0)
            return -1;
    }
    return 0;
}
