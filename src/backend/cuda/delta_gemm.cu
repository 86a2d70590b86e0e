/* delta_gemm: a prompt's pass of the chunked gated delta rule as batched
 * cuBLAS products (fp32), outside precise mode. k_delta_chunk's records
 * hold per chunk c and value head h (recurrent.cu) W [DC][dk], U [DC][dv],
 * the masked decayed q.k products P (stored transposed) and the cumulative
 * log decay g. k_delta_pass walks the chunks with three products each on
 * the CUDA cores:
 *   V' = U - W S;  out = e^{g} q S + P V';  S' = e^{g_L} S + K~^T V'
 * (K~ the rows e^{g_L-g_s} k_s, S the state entering the chunk [dk][dv]).
 * The same algebra regrouped,
 *   S' = M S + K~^T U with M = e^{g_L} I - K~^T W,
 *   out = Z S + P U   with Z = e^{g} q - P W,
 * leaves one product per chunk in chunk order (S' = M S + R, every head in
 * one batched call); M, R, Z, P U and the outputs run for all chunks at once.
 * Segments of DG_ROWS rows bound the scratch (~0.2 GB per 2048 rows at
 * qwen3.5-9b's 32 heads of 128 x 128). */
#include "cuda_impl.h"

#include <math.h>

#define DC CUDA_DELTA_CHUNK
#define DG_ROWS 2048

struct dg_args {
    float *out;
    int64_t os;
    const float *qn, *kn, *rec; /* rec: the chain's first record */
    int64_t rs;                 /* floats a record */
    int32_t Hk, Hv, dk, dv, n, c0; /* c0: the segment's first chunk */
    float *Kt, *Z, *M, *O, *S;  /* see cuda_delta_gemm */
};

static __device__ __forceinline__ const float *dg_rec(const struct dg_args &a, int32_t c, int32_t h)
{
    return a.rec + ((int64_t)(a.c0 + c) * a.Hv + h) * a.rs;
}

/* block per (chunk, head): K~ and Z's first term e^{g_t} q_t (rows past the
 * prompt zero), and e^{g_L} on M's diagonal (M then takes -K~^T W) */
__global__ void k_dg_prep(struct dg_args a)
{
    const int32_t c = blockIdx.x, h = blockIdx.y, kh = h / (a.Hv / a.Hk), t0 = (a.c0 + c) * DC;
    const int32_t L = min(DC, a.n - t0);
    const float *g = dg_rec(a, c, h) + (int64_t)DC * (a.dk + a.dv + DC);
    const float gl = g[L - 1];
    const int64_t blk = (int64_t)c * a.Hv + h;
    float *kt = a.Kt + blk * DC * a.dk, *z = a.Z + blk * DC * a.dk, *m = a.M + blk * a.dk * a.dk;
    for (int32_t e = threadIdx.x; e < DC * a.dk; e += blockDim.x) {
        const int32_t t = e / a.dk, d = e % a.dk;
        const bool ok = t < L;
        const int64_t src = ((int64_t)(t0 + t) * a.Hk + kh) * a.dk + d;
        kt[e] = ok ? a.kn[src] * expf(gl - g[t]) : 0.0f;
        z[e] = ok ? a.qn[src] * expf(g[t]) : 0.0f;
    }
    for (int32_t d = threadIdx.x; d < a.dk; d += blockDim.x)
        m[(int64_t)d * a.dk + d] = expf(gl);
}

/* block per prompt row of the segment: the outputs to their rows */
__global__ void k_dg_out(struct dg_args a)
{
    const int32_t r = blockIdx.x, c = r / DC, t = r % DC, i = a.c0 * DC + r;
    for (int32_t e = threadIdx.x; e < a.Hv * a.dv; e += blockDim.x) {
        const int32_t h = e / a.dv, j = e % a.dv;
        a.out[(int64_t)i * a.os + e] = a.O[(((int64_t)c * a.Hv + h) * DC + t) * a.dv + j];
    }
}

static void *dg_take(char **p, size_t bytes)
{
    void *r = *p;
    *p += (bytes + 255) & ~(size_t)255;
    return r;
}

bool cuda_delta_gemm_takes(const struct cuda_backend *c) { return !c->precise && c->one_chain && c->b.n_tokens >= 256; }

int cuda_delta_gemm(struct cuda_backend *c, float *out, int64_t os, const float *qn, const float *kn, const float *rec,
                    int64_t rs, int32_t Hk, int32_t Hv, int32_t dk, int32_t dv, float *state, int64_t ss)
{
    const int32_t n = c->b.n_tokens, seg_c = DG_ROWS / DC, si = c->b.state_in[0], so = c->b.state_out[n - 1];
    assert(si >= 0);
    const int64_t hkv = (int64_t)Hv * dk * dv, ck = (int64_t)DC * dk, cv = (int64_t)DC * dv, kk = (int64_t)dk * dk;
    const size_t f = sizeof(float), nb = (size_t)seg_c * Hv;
    /* Kt, Z [c][h][DC][dk]; M [c][h][dk][dk]; O [c][h][DC][dv]; S [c+1][h][dk][dv]: the states entering each chunk, then the last */
    const size_t sz[5] = {nb * ck * f, nb * ck * f, nb * kk * f, nb * cv * f, (size_t)(seg_c + 1) * hkv * f};
    size_t total = 0;
    for (int i = 0; i < 5; i++)
        total += (sz[i] + 255) & ~(size_t)255;
    char *scr = (char *)cuda_scratch(c, SCR_SSD, total);
    if (!scr)
        return -1;
    struct dg_args a = {out, os, qn, kn, rec, rs, Hk, Hv, dk, dv, n, 0, NULL, NULL, NULL, NULL, NULL};
    float **bufs[5] = {&a.Kt, &a.Z, &a.M, &a.O, &a.S};
    for (int i = 0; i < 5; i++)
        *bufs[i] = (float *)dg_take(&scr, sz[i]);
    if (CUDA_CHECK(c, cudaMemcpyAsync(a.S, state + (int64_t)si * ss, hkv * f, cudaMemcpyDeviceToDevice, c->stream)) !=
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
        if (CUDA_CHECK(c, cudaMemsetAsync(a.M, 0, (size_t)cnt * kk * f, c->stream)) != 0)
            return -1;
        k_dg_prep<<<dim3((unsigned)nc, (unsigned)Hv), 256, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return -1;
        const float *W = rec + (int64_t)c0 * Hv * rs, *U = W + ck, *P = U + cv;
        /* M = e^{g_L} I - K~^T W; R = K~^T U into the next state's place;
         * Z = e^{g} q - P W; O = P U (P stored transposed) */
        if (cuda_gemm_packed(c, dk, dk, DC, -1.0f, a.Kt, true, ck, W, false, rs, 1.0f, a.M, kk, cnt, false,
                             "delta rule K~^T W") != 0 ||
            cuda_gemm_packed(c, dk, dv, DC, 1.0f, a.Kt, true, ck, U, false, rs, 0.0f, a.S + hkv,
                             (int64_t)dk * dv, cnt, false, "delta rule K~^T U") != 0 ||
            cuda_gemm_packed(c, DC, dk, DC, -1.0f, P, true, rs, W, false, rs, 1.0f, a.Z, ck, cnt, false,
                             "delta rule P W") != 0 ||
            cuda_gemm_packed(c, DC, dv, DC, 1.0f, P, true, rs, U, false, rs, 0.0f, a.O, cv, cnt, false,
                             "delta rule P U") != 0)
            return -1;
        /* the chain: S_{c+1} = M_c S_c + R_c, every head at once */
        for (int32_t j = 0; j < nc; j++)
            if (cuda_gemm_packed(c, dk, dv, dk, 1.0f, a.M + (int64_t)j * Hv * kk, false, kk, a.S + j * hkv, false,
                                 (int64_t)dk * dv, 1.0f, a.S + (j + 1) * hkv, (int64_t)dk * dv, Hv, false,
                                 "delta rule chain") != 0)
                return -1;
        /* O += Z S_c */
        if (cuda_gemm_packed(c, DC, dv, dk, 1.0f, a.Z, false, ck, a.S, false, (int64_t)dk * dv, 1.0f, a.O, cv, cnt,
                             false, "delta rule Z S") != 0)
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
