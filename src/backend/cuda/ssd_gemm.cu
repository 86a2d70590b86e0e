/* ssd_gemm: a prompt's Mamba2 chunked scan as batched tensor-core products
 * (fast mode). The form is the reference's chunked SSD (transformers'
 * NemotronH torch_forward, the cpu's ssd_chunked): per chunk c of CH rows
 * and head h, with a_t the cumulative dt*A inside the chunk and S_c [P][N]
 * the state entering it,
 *   y_t     = e^{a_t} C_t S_c^T + sum_{s<=t} (C_t.B_s) e^{a_t-a_s} dt_s x_s + D x_t
 *   S_{c+1} = e^{a_L} S_c + sum_s e^{a_L-a_s} dt_s x_s B_s^T.
 * Every product runs for all chunks at once, one
 * cublasGemmStridedBatchedEx each over (chunk, group) or (chunk, head),
 * bf16 operands and fp32 sums: C.B per group, the state increments per
 * group (its heads' x side by side), the states' part of y per group, and
 * the masked intra-chunk product per head. Only the chain of states, an
 * elementwise recurrence in fp32, walks the chunks in order. k_ssd_pass (the
 * precise form, recurrent.cu) keeps each state in shared memory and runs
 * these products itself, chunk after chunk, on the CUDA cores; this form
 * trades that serial walk for scratch (~0.5 GB per segment of 2048 rows at
 * nemotron-nano-9b-v2's shapes). */
#include "cuda_impl.h"

#include <math.h>

#define SG_ROWS 2048 /* rows per segment: the scratch's bound */
#define SG_HMAX 1024 /* heads: k_sg_pack's and k_sg_out's tables */

struct sg_args {
    float *y;
    int64_t ys;
    const float *x, *B, *C, *dts;
    int64_t xs, Bs, Cs;
    const void *A_log, *D;
    enum dtype At, Dt;
    int32_t H, P, G, N, CH, n, row0; /* row0: the segment's first row */
    /* the segment's buffers, nc chunks (see cuda_ssd_gemm) */
    float *acum, *Gm, *dS, *Yo, *Yd, *Sc;
    __nv_bfloat16 *Bb, *Cb, *Xd, *Xw, *W, *Sb;
};

/* block per (chunk, head), one warp: a_t, the cumulative dt*A (the padding
 * past the last row adds nothing) */
__global__ void k_sg_cum(struct sg_args a)
{
    __shared__ float s[1024];
    const int32_t c = blockIdx.x, h = blockIdx.y, t0 = a.row0 + c * a.CH;
    const float A = -expf(dev_weight(a.A_log, a.At, h));
    for (int32_t t = threadIdx.x; t < a.CH; t += 32)
        s[t] = t0 + t < a.n ? a.dts[(int64_t)(t0 + t) * a.H + h] * A : 0.0f;
    __syncwarp();
    warp_prefix_sum(s, a.CH);
    __syncwarp();
    float *out = a.acum + ((int64_t)c * a.H + h) * a.CH;
    for (int32_t t = threadIdx.x; t < a.CH; t += 32)
        out[t] = s[t];
}

#define SG_U 4 /* elements a thread loads before it stores any */

/* (q, r) = (e / d, e % d) for e = e0, e0 + step, ...: one division at the
 * start, not one an element (the kernels below are bound by instructions) */
struct divwalk {
    int32_t q, r, dq, dr, d;
};

static __device__ __forceinline__ divwalk divwalk_init(int32_t e0, int32_t step, int32_t d)
{
    return {e0 / d, e0 % d, step / d, step % d, d};
}

static __device__ __forceinline__ void divwalk_next(divwalk &w)
{
    w.q += w.dq;
    w.r += w.dr;
    if (w.r >= w.d) {
        w.r -= w.d;
        w.q++;
    }
}

/* block per segment row (the rows past n zero): B and C by group, x by head
 * (Xd) and, by group with its heads side by side, e^{a_L-a_t} dt_t x_t (Xw) */
__global__ void __launch_bounds__(256) k_sg_pack(struct sg_args a)
{
    __shared__ float fac[SG_HMAX];   /* per head: e^{a_L-a_t} dt_t */
    __shared__ int32_t xwo[SG_HMAX]; /* per head: its place in a chunk's Xw, g CH Q + (h % HG) P */
    const int32_t r = blockIdx.x, c = r / a.CH, t = r % a.CH, i = a.row0 + r;
    const bool ok = i < a.n;
    const int32_t HG = a.H / a.G, Q = HG * a.P, GN = a.G * a.N, HP = a.H * a.P;
    for (int32_t h = threadIdx.x; h < a.H; h += blockDim.x) {
        const float *ac = a.acum + ((int64_t)c * a.H + h) * a.CH;
        fac[h] = ok ? expf(ac[a.CH - 1] - ac[t]) * a.dts[(int64_t)i * a.H + h] : 0.0f;
        xwo[h] = h / HG * a.CH * Q + h % HG * a.P;
    }
    const int64_t bc0 = (int64_t)c * a.G * a.CH * a.N + (int64_t)t * a.N, gs = (int64_t)a.CH * a.N;
    divwalk gd = divwalk_init(threadIdx.x, blockDim.x, a.N);
    for (int32_t e0 = threadIdx.x; e0 < GN; e0 += SG_U * blockDim.x) {
        float bv[SG_U], cv[SG_U];
#pragma unroll
        for (int u = 0; u < SG_U; u++) {
            const int32_t e = e0 + u * blockDim.x;
            bv[u] = ok && e < GN ? a.B[(int64_t)i * a.Bs + e] : 0.0f;
            cv[u] = ok && e < GN ? a.C[(int64_t)i * a.Cs + e] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < SG_U; u++) {
            const int64_t o = bc0 + gd.q * gs + gd.r;
            if (e0 + u * (int32_t)blockDim.x < GN) {
                a.Bb[o] = __float2bfloat16_rn(bv[u]);
                a.Cb[o] = __float2bfloat16_rn(cv[u]);
            }
            divwalk_next(gd);
        }
    }
    __syncthreads();
    const int64_t xd0 = (int64_t)c * a.H * a.CH * a.P + (int64_t)t * a.P, hs = (int64_t)a.CH * a.P;
    const int64_t xw0 = (int64_t)c * a.G * a.CH * Q + (int64_t)t * Q;
    divwalk hp = divwalk_init(threadIdx.x, blockDim.x, a.P);
    for (int32_t e0 = threadIdx.x; e0 < HP; e0 += SG_U * blockDim.x) {
        float xv[SG_U];
#pragma unroll
        for (int u = 0; u < SG_U; u++) {
            const int32_t e = e0 + u * blockDim.x;
            xv[u] = ok && e < HP ? a.x[(int64_t)i * a.xs + e] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < SG_U; u++) {
            if (e0 + u * (int32_t)blockDim.x < HP) {
                a.Xd[xd0 + hp.q * hs + hp.r] = __float2bfloat16_rn(xv[u]);
                a.Xw[xw0 + xwo[hp.q] + hp.r] = __float2bfloat16_rn(fac[hp.q] * xv[u]);
            }
            divwalk_next(hp);
        }
    }
}

/* block per (chunk, head): W_ts = (C_t.B_s) e^{a_t-a_s} dt_s for s <= t < L, else 0 */
__global__ void __launch_bounds__(256) k_sg_mask(struct sg_args a)
{
    __shared__ float ac[1024], dt[1024];
    const int32_t ch = blockIdx.x, c = ch / a.H, h = ch % a.H, g = h / (a.H / a.G), CH = a.CH, CC = CH * CH;
    const int32_t t0 = a.row0 + c * CH, L = min(CH, a.n - t0);
    for (int32_t t = threadIdx.x; t < CH; t += blockDim.x) {
        ac[t] = a.acum[(int64_t)ch * CH + t];
        dt[t] = t < L ? a.dts[(int64_t)(t0 + t) * a.H + h] : 0.0f;
    }
    __syncthreads();
    const float *gm = a.Gm + ((int64_t)c * a.G + g) * CC;
    __nv_bfloat16 *w = a.W + (int64_t)ch * CC;
    for (int32_t e0 = threadIdx.x; e0 < CC; e0 += 2 * SG_U * blockDim.x) {
        float v[2 * SG_U];
#pragma unroll
        for (int u = 0; u < 2 * SG_U; u++) {
            const int32_t e = e0 + u * blockDim.x;
            v[u] = e < CC ? gm[e] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 2 * SG_U; u++) {
            const int32_t e = e0 + u * blockDim.x, t = e / CH, s = e - t * CH;
            if (e < CC)
                w[e] = __float2bfloat16_rn(t < L && s <= t ? v[u] * expf(ac[t] - ac[s]) * dt[s] : 0.0f);
        }
    }
}

/* thread per state entry of every head: the states entering each chunk (bf16
 * for the products), the fp32 state carried from segment to segment */
__global__ void k_sg_chain(struct sg_args a, int32_t nc)
{
    const int64_t hpn = (int64_t)a.H * a.P * a.N, e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= hpn)
        return;
    const int32_t h = (int32_t)(e / ((int64_t)a.P * a.N));
    float s = a.Sc[e];
    for (int32_t c = 0; c < nc; c++) {
        a.Sb[c * hpn + e] = __float2bfloat16_rn(s);
        s = expf(a.acum[((int64_t)c * a.H + h) * a.CH + a.CH - 1]) * s + a.dS[c * hpn + e];
    }
    a.Sc[e] = s;
}

/* block per row below n: y = e^{a_t} (the states' part) + the chunk's part + D x */
__global__ void __launch_bounds__(256) k_sg_out(struct sg_args a)
{
    __shared__ float ea[SG_HMAX], dh[SG_HMAX];
    __shared__ int32_t yoo[SG_HMAX]; /* per head: its place in a chunk's Yo, g CH Q + (h % HG) P */
    const int32_t r = blockIdx.x, c = r / a.CH, t = r % a.CH, i = a.row0 + r;
    const int32_t HG = a.H / a.G, Q = HG * a.P, HP = a.H * a.P;
    for (int32_t h = threadIdx.x; h < a.H; h += blockDim.x) {
        ea[h] = expf(a.acum[((int64_t)c * a.H + h) * a.CH + t]);
        dh[h] = dev_weight(a.D, a.Dt, h);
        yoo[h] = h / HG * a.CH * Q + h % HG * a.P;
    }
    __syncthreads();
    const int64_t yo0 = (int64_t)c * a.G * a.CH * Q + (int64_t)t * Q;
    const int64_t yd0 = (int64_t)c * a.H * a.CH * a.P + (int64_t)t * a.P, hs = (int64_t)a.CH * a.P;
    divwalk hp = divwalk_init(threadIdx.x, blockDim.x, a.P);
    for (int32_t e0 = threadIdx.x; e0 < HP; e0 += SG_U * blockDim.x) {
        float yo[SG_U], yd[SG_U], xv[SG_U];
        int32_t hv[SG_U];
#pragma unroll
        for (int u = 0; u < SG_U; u++) {
            const int32_t e = e0 + u * blockDim.x;
            const bool in = e < HP;
            const int32_t h = in ? hp.q : 0;
            hv[u] = h;
            yo[u] = in ? a.Yo[yo0 + yoo[h] + hp.r] : 0.0f;
            yd[u] = in ? a.Yd[yd0 + h * hs + hp.r] : 0.0f;
            xv[u] = in ? a.x[(int64_t)i * a.xs + e] : 0.0f;
            divwalk_next(hp);
        }
#pragma unroll
        for (int u = 0; u < SG_U; u++) {
            const int32_t e = e0 + u * blockDim.x;
            if (e < HP)
                a.y[(int64_t)i * a.ys + e] = ea[hv[u]] * yo[u] + yd[u] + dh[hv[u]] * xv[u];
        }
    }
}

bool cuda_ssd_gemm_takes(const struct cuda_backend *c, const struct ssd_params *p)
{
    return !c->precise && c->one_chain && c->b.n_tokens >= 2 * p->chunk && c->b.n_tokens >= 256 &&
           p->chunk <= 1024 && p->n_head <= SG_HMAX && p->chunk % 8 == 0 && p->head_dim % 8 == 0 && p->d_state % 8 == 0;
}

int cuda_ssd_gemm(struct cuda_backend *c, struct tensor *y, const struct tensor *x, const struct tensor *B,
                  const struct tensor *C, const float *dts, const struct tensor *A_log, const struct tensor *D,
                  struct tensor *state, const struct ssd_params *p)
{
    const int32_t n = c->b.n_tokens, H = p->n_head, P = p->head_dim, G = p->n_group, N = p->d_state, CH = p->chunk;
    const int32_t Q = H / G * P, seg_c = SG_ROWS / CH > 0 ? SG_ROWS / CH : 1, si = c->b.state_in[0];
    const int32_t so = c->b.state_out[n - 1];
    assert(si >= 0);
    const size_t rows = (size_t)seg_c * CH, f = sizeof(float), hb = sizeof(__nv_bfloat16);
    const size_t hpn = (size_t)H * P * N;
    const size_t sz[12] = {(size_t)seg_c * H * CH * f,      (size_t)seg_c * G * CH * CH * f,
                           (size_t)seg_c * hpn * f,          rows * H * P * f,
                           rows * H * P * f,                 hpn * f,
                           rows * G * N * hb,                rows * G * N * hb,
                           rows * H * P * hb,                rows * H * P * hb,
                           (size_t)seg_c * H * CH * CH * hb, (size_t)seg_c * hpn * hb};
    void *pc[12];
    if (cuda_scratch_pieces(c, SCR_SCAN, 12, sz, pc) != 0)
        return -1;
    struct sg_args a = {(float *)y->data, y->row_stride, (const float *)x->data, (const float *)B->data,
                        (const float *)C->data, dts, x->row_stride, B->row_stride, C->row_stride, A_log->data,
                        D->data, A_log->type, D->type, H, P, G, N, CH, n, 0,
                        (float *)pc[0], (float *)pc[1], (float *)pc[2], (float *)pc[3], (float *)pc[4],
                        (float *)pc[5], (__nv_bfloat16 *)pc[6], (__nv_bfloat16 *)pc[7], (__nv_bfloat16 *)pc[8],
                        (__nv_bfloat16 *)pc[9], (__nv_bfloat16 *)pc[10], (__nv_bfloat16 *)pc[11]};
    if (CUDA_CHECK(c, cudaMemcpyAsync(a.Sc, (const float *)state->data + (int64_t)si * state->row_stride,
                                      hpn * f, cudaMemcpyDeviceToDevice, c->stream)) != 0)
        return -1;
    for (int32_t row0 = 0; row0 < n; row0 += seg_c * CH) {
        const int32_t nc = (int32_t)cdiv(n - row0 < seg_c * CH ? n - row0 : seg_c * CH, CH);
        a.row0 = row0;
        k_sg_cum<<<dim3((unsigned)nc, (unsigned)H), 32, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
        k_sg_pack<<<(unsigned)(nc * CH), 256, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
        /* Gm[c][g][t][s] = C_t.B_s: [CH][N] . [CH][N]^T */
        if (cuda_gemm_packed(c, CH, CH, N, 1.0f, a.Cb, false, (int64_t)CH * N, a.Bb, true, (int64_t)CH * N, 0.0f,
                             a.Gm, (int64_t)CH * CH, nc * G, true, "ssd C.B") != 0)
            return -1;
        k_sg_mask<<<(unsigned)(nc * H), 256, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
        /* dS[c][g][q][d] = sum_t Xw[c][g][t][q] B[c][g][t][d]: [CH][Q]^T . [CH][N] */
        if (cuda_gemm_packed(c, Q, N, CH, 1.0f, a.Xw, true, (int64_t)CH * Q, a.Bb, false, (int64_t)CH * N, 0.0f,
                             a.dS, (int64_t)Q * N, nc * G, true, "ssd state increments") != 0)
            return -1;
        k_sg_chain<<<cdiv((int64_t)hpn, 256), 256, 0, c->stream>>>(a, nc);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
        /* Yo[c][g][t][q] = sum_d C[c][g][t][d] Sb[c][g][q][d]: [CH][N] . [Q][N]^T */
        if (cuda_gemm_packed(c, CH, Q, N, 1.0f, a.Cb, false, (int64_t)CH * N, a.Sb, true, (int64_t)Q * N, 0.0f,
                             a.Yo, (int64_t)CH * Q, nc * G, true, "ssd states' outputs") != 0)
            return -1;
        /* Yd[c][h][t][p] = sum_s W[c][h][t][s] Xd[c][h][s][p]: [CH][CH] . [CH][P] */
        if (cuda_gemm_packed(c, CH, P, CH, 1.0f, a.W, false, (int64_t)CH * CH, a.Xd, false, (int64_t)CH * P, 0.0f,
                             a.Yd, (int64_t)CH * P, nc * H, true, "ssd chunks' outputs") != 0)
            return -1;
        const int32_t nr = n - row0 < nc * CH ? n - row0 : nc * CH;
        k_sg_out<<<(unsigned)nr, 256, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
    }
    if (so >= 0 && CUDA_CHECK(c, cudaMemcpyAsync((float *)state->data + (int64_t)so * state->row_stride, a.Sc,
                                                 hpn * f, cudaMemcpyDeviceToDevice, c->stream)) != 0)
        return -1;
    return 0;
}
