/* recurrent: the short causal conv, the gated delta rule (Gated DeltaNet) and
 * the Mamba2 selective scan on the GPU.
 *
 * The conv is parallel over (token, channel): each thread walks its token's
 * parent chain for the K-1 earlier inputs. The scans are sequential over each
 * sequence's rows: one block per (sequence, head) keeps the head's state in
 * shared memory and applies the recurrent step of the reference (transformers'
 * torch_recurrent_gated_delta_rule, the Mamba2 decode step) token after token,
 * following parents as the cpu backend does (a row whose parent is not the row
 * before reloads its parent's kept state). Per-token inputs that need no state
 * (normalised q/k, decay, beta, dt) are computed first, in parallel.
 * The cpu backend's chunked prefill form equals this step to ~1e-5 relative
 * (tests/unit/test_recurrent.c). */
#include "cuda_impl.h"

#include <math.h>

static __device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- causal depthwise conv ---- */

struct conv_args {
    float *out;
    int64_t os;
    const float *x;
    int64_t xs;
    const void *w, *bias;
    enum dtype wt, bt;
    float *state;
    int64_t ss;
    int32_t K, n;
    int64_t C;
    struct dev_batch b;
};

__global__ void k_conv1d(struct conv_args a)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t i = blockIdx.y;
    if (c >= a.C)
        return;
    const float *src[16];
    int32_t r = i, d = 0;
    src[d++] = a.x + (int64_t)i * a.xs;
    while (d < a.K && a.b.parent[r] >= 0) {
        r = a.b.parent[r];
        src[d++] = a.x + (int64_t)r * a.xs;
    }
    const float *st = a.state + (int64_t)a.b.state_in[i] * a.ss;
    for (int32_t e = a.K - 2; d < a.K; d++, e--)
        src[d] = st + (int64_t)e * a.C;
    float acc = a.bias ? dev_weight(a.bias, a.bt, c) : 0.0f;
    for (int32_t t = 0; t < a.K; t++)
        acc += dev_weight(a.w, a.wt, c * a.K + (a.K - 1 - t)) * src[t][c];
    a.out[(int64_t)i * a.os + c] = acc / (1.0f + expf(-acc));
    const int32_t so = a.b.state_out[i];
    if (so >= 0)
        for (int32_t t = 0; t < a.K - 1; t++)
            a.state[(int64_t)so * a.ss + (int64_t)(a.K - 2 - t) * a.C + c] = src[t][c];
}

void cuda_conv1d(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w,
                 const struct tensor *bias, struct tensor *state)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t K = (int32_t)w->n_cols, n = c->b.n_tokens;
    assert(K >= 2 && K <= 16 && w->n_rows == x->n_cols && state->n_cols == (K - 1) * x->n_cols);
    assert(out->data != x->data);
    if (cuda_op_skip(c) || n == 0)
        return;
    const bool hb = bias && bias->data;
    struct conv_args a = {(float *)out->data, out->row_stride, (const float *)x->data, x->row_stride, w->data,
                          hb ? bias->data : NULL, w->type, hb ? bias->type : DT_F32, (float *)state->data,
                          state->row_stride, K, n, x->n_cols, c->d};
    k_conv1d<<<dim3(cdiv(x->n_cols, 256), (unsigned)n), 256, 0, c->stream>>>(a);
    CUDA_LAUNCHED(c);
}

/* ---- gated delta rule ---- */

struct delta_args {
    float *out;
    int64_t os;
    const float *q, *k, *v, *a, *b;
    int64_t qs, ks, vs, as, bs;
    const void *A_log, *dt_bias;
    enum dtype At, dtt;
    float *state;
    int64_t ss;
    int32_t Hk, Hv, dk, dv, n;
    float *qn, *kn, *gb; /* scratch: [n][Hk*dk] x2, [n][Hv][2] (decay log g, beta) */
    struct dev_batch bt;
};

/* one warp per (token, key head): normalised q (scaled) and k; and per (token, value head) g, beta */
__global__ void k_delta_prep(struct delta_args a)
{
    const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (item < (int64_t)a.n * a.Hk) {
        const int32_t i = (int32_t)(item / a.Hk), kh = (int32_t)(item % a.Hk), dk = a.dk;
        const float *qr = a.q + (int64_t)i * a.qs + (int64_t)kh * dk, *kr = a.k + (int64_t)i * a.ks + (int64_t)kh * dk;
        float sq = 0.0f, sk = 0.0f;
        for (int d = lane; d < dk; d += 32) {
            sq += qr[d] * qr[d];
            sk += kr[d] * kr[d];
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f), scale = 1.0f / sqrtf((float)dk);
        float *qo = a.qn + item * dk, *ko = a.kn + item * dk;
        for (int d = lane; d < dk; d += 32) {
            qo[d] = qr[d] * iq * scale;
            ko[d] = kr[d] * ik;
        }
    }
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < (int64_t)a.n * a.Hv) {
        const int32_t i = (int32_t)(t / a.Hv), h = (int32_t)(t % a.Hv);
        const float bb = a.b[(int64_t)i * a.bs + h], aa = a.a[(int64_t)i * a.as + h];
        a.gb[2 * t] = -expf(dev_weight(a.A_log, a.At, h)) * softplus(aa + dev_weight(a.dt_bias, a.dtt, h));
        a.gb[2 * t + 1] = 1.0f / (1.0f + expf(-bb));
    }
}

/* block per (sequence group, value head); thread e owns column e of S [dk][dv] */
__global__ void k_delta_scan(struct delta_args a)
{
    extern __shared__ float sm[];
    const int32_t dk = a.dk, dv = a.dv, Hv = a.Hv;
    float *S = sm, *q = S + dk * dv, *k = q + dk;
    const int32_t g = blockIdx.x / Hv, h = blockIdx.x % Hv, kh = h / (Hv / a.Hk), e = threadIdx.x;
    const int32_t *rows = a.bt.grp_rows + a.bt.grp_start[g], n = a.bt.grp_start[g + 1] - a.bt.grp_start[g];
    const int64_t off = (int64_t)h * dk * dv;
    int32_t prev = -1;
    for (int32_t r = 0; r < n; r++) {
        const int32_t i = rows[r], p = a.bt.parent[i];
        __syncthreads();
        if (p < 0 || p != prev) {
            const float *src = a.state + (int64_t)(p < 0 ? a.bt.state_in[i] : a.bt.state_out[p]) * a.ss + off;
            for (int32_t d = 0; d < dk; d++)
                S[d * dv + e] = src[d * dv + e];
        }
        for (int32_t d = e; d < dk; d += dv) {
            q[d] = a.qn[((int64_t)i * a.Hk + kh) * dk + d];
            k[d] = a.kn[((int64_t)i * a.Hk + kh) * dk + d];
        }
        __syncthreads();
        const float decay = expf(a.gb[2 * ((int64_t)i * Hv + h)]), beta = a.gb[2 * ((int64_t)i * Hv + h) + 1];
        float kv = 0.0f;
        for (int32_t d = 0; d < dk; d++) {
            S[d * dv + e] *= decay;
            kv += k[d] * S[d * dv + e];
        }
        const float delta = (a.v[(int64_t)i * a.vs + (int64_t)h * dv + e] - kv) * beta;
        float o = 0.0f;
        for (int32_t d = 0; d < dk; d++) {
            S[d * dv + e] += k[d] * delta;
            o += q[d] * S[d * dv + e];
        }
        a.out[(int64_t)i * a.os + (int64_t)h * dv + e] = o;
        const int32_t so = a.bt.state_out[i];
        if (so >= 0) {
            float *dst = a.state + (int64_t)so * a.ss + off;
            for (int32_t d = 0; d < dk; d++)
                dst[d * dv + e] = S[d * dv + e];
        }
        prev = i;
    }
}

void cuda_delta_rule(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *k,
                     const struct tensor *v, const struct tensor *a, const struct tensor *b,
                     const struct tensor *A_log, const struct tensor *dt_bias, struct tensor *state,
                     int32_t n_k_head, int32_t n_v_head, int32_t k_dim, int32_t v_dim)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = c->b.n_tokens;
    const size_t smem = ((size_t)k_dim * v_dim + 2 * (size_t)k_dim) * sizeof(float);
    assert(n_v_head % n_k_head == 0 && v_dim <= 1024 && smem <= 200 * 1024);
    assert(state->n_cols == (int64_t)n_v_head * k_dim * v_dim);
    if (cuda_op_skip(c) || n == 0)
        return;
    float *scr = (float *)cuda_scratch(c, SCR_REC, ((size_t)2 * n * n_k_head * k_dim + (size_t)2 * n * n_v_head) *
                                                       sizeof(float));
    if (!scr)
        return;
    struct delta_args d = {(float *)out->data, out->row_stride, (const float *)q->data, (const float *)k->data,
                           (const float *)v->data, (const float *)a->data, (const float *)b->data, q->row_stride,
                           k->row_stride, v->row_stride, a->row_stride, b->row_stride, A_log->data,
                           dt_bias->data, A_log->type, dt_bias->type, (float *)state->data, state->row_stride,
                           n_k_head, n_v_head, k_dim, v_dim, n, scr, scr + (size_t)n * n_k_head * k_dim,
                           scr + (size_t)2 * n * n_k_head * k_dim, c->d};
    const int64_t items = (int64_t)n * (n_k_head > n_v_head ? n_k_head : n_v_head);
    k_delta_prep<<<cdiv(items * 32, 256), 256, 0, c->stream>>>(d);
    if (CUDA_LAUNCHED(c) != 0)
        return;
    if (smem > 48 * 1024 &&
        CUDA_CHECK(c, cudaFuncSetAttribute(k_delta_scan, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != 0)
        return;
    k_delta_scan<<<(unsigned)(c->d.n_grp * n_v_head), (unsigned)v_dim, smem, c->stream>>>(d);
    CUDA_LAUNCHED(c);
}

/* ---- Mamba2 selective scan ---- */

struct ssd_args {
    float *y;
    int64_t ys;
    const float *x, *B, *C, *dt;
    int64_t xs, Bs, Cs, dts;
    const void *A_log, *D, *dt_bias;
    enum dtype At, Dt, dtt;
    float *state;
    int64_t ss;
    struct ssd_params p;
    int32_t n;
    float *dts_out; /* scratch [n][H]: clamped softplus dt */
    struct dev_batch bt;
};

__global__ void k_ssd_prep(struct ssd_args a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t H = a.p.n_head;
    if (t >= (int64_t)a.n * H)
        return;
    const int32_t i = (int32_t)(t / H), h = (int32_t)(t % H);
    const float d = softplus(a.dt[(int64_t)i * a.dts + h] + dev_weight(a.dt_bias, a.dtt, h));
    const float lo = a.p.dt_min > a.p.dt_lo ? a.p.dt_min : a.p.dt_lo;
    a.dts_out[t] = d < lo ? lo : d > a.p.dt_hi ? a.p.dt_hi : d;
}

/* block per (sequence group, head), 256 threads: warp w owns rows a = w, w+8, ... of S [P][N] */
__global__ void k_ssd_scan(struct ssd_args a)
{
    extern __shared__ float sm[];
    const int32_t P = a.p.head_dim, N = a.p.d_state, H = a.p.n_head;
    float *S = sm, *xb = S + P * N, *Bb = xb + P, *Cb = Bb + N;
    const int32_t g = blockIdx.x / H, h = blockIdx.x % H, grp = h / (H / a.p.n_group);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int32_t *rows = a.bt.grp_rows + a.bt.grp_start[g], n = a.bt.grp_start[g + 1] - a.bt.grp_start[g];
    const int64_t off = (int64_t)h * P * N;
    const float A = -expf(dev_weight(a.A_log, a.At, h)), Dh = dev_weight(a.D, a.Dt, h);
    int32_t prev = -1;
    for (int32_t r = 0; r < n; r++) {
        const int32_t i = rows[r], p = a.bt.parent[i];
        __syncthreads();
        if (p < 0 || p != prev) {
            const float *src = a.state + (int64_t)(p < 0 ? a.bt.state_in[i] : a.bt.state_out[p]) * a.ss + off;
            for (int32_t e = threadIdx.x; e < P * N; e += blockDim.x)
                S[e] = src[e];
        }
        for (int32_t e = threadIdx.x; e < P; e += blockDim.x)
            xb[e] = a.x[(int64_t)i * a.xs + (int64_t)h * P + e];
        for (int32_t e = threadIdx.x; e < N; e += blockDim.x) {
            Bb[e] = a.B[(int64_t)i * a.Bs + (int64_t)grp * N + e];
            Cb[e] = a.C[(int64_t)i * a.Cs + (int64_t)grp * N + e];
        }
        __syncthreads();
        const float dt = a.dts_out[(int64_t)i * H + h], dA = expf(dt * A);
        for (int32_t row = warp; row < P; row += nw) {
            float *Sa = S + row * N;
            const float dx = dt * xb[row];
            float yv = 0.0f;
            for (int32_t e = lane; e < N; e += 32) {
                Sa[e] = Sa[e] * dA + dx * Bb[e];
                yv += Sa[e] * Cb[e];
            }
            yv = warp_sum(yv);
            if (lane == 0)
                a.y[(int64_t)i * a.ys + (int64_t)h * P + row] = yv + Dh * xb[row];
        }
        const int32_t so = a.bt.state_out[i];
        if (so >= 0) {
            __syncthreads();
            float *dst = a.state + (int64_t)so * a.ss + off;
            for (int32_t e = threadIdx.x; e < P * N; e += blockDim.x)
                dst[e] = S[e];
        }
        prev = i;
    }
}

void cuda_ssd(struct backend *be, struct tensor *y, const struct tensor *x, const struct tensor *B,
              const struct tensor *C, const struct tensor *dt, const struct tensor *A_log, const struct tensor *D,
              const struct tensor *dt_bias, struct tensor *state, const struct ssd_params *p)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = c->b.n_tokens;
    const size_t smem = ((size_t)p->head_dim * p->d_state + p->head_dim + 2 * (size_t)p->d_state) * sizeof(float);
    assert(p->n_head % p->n_group == 0 && smem <= 200 * 1024);
    assert(state->n_cols == (int64_t)p->n_head * p->head_dim * p->d_state);
    if (cuda_op_skip(c) || n == 0)
        return;
    float *scr = (float *)cuda_scratch(c, SCR_REC, (size_t)n * p->n_head * sizeof(float));
    if (!scr)
        return;
    struct ssd_args a = {(float *)y->data, y->row_stride, (const float *)x->data, (const float *)B->data,
                         (const float *)C->data, (const float *)dt->data, x->row_stride, B->row_stride,
                         C->row_stride, dt->row_stride, A_log->data, D->data, dt_bias->data, A_log->type,
                         D->type, dt_bias->type, (float *)state->data, state->row_stride, *p, n, scr, c->d};
    k_ssd_prep<<<cdiv((int64_t)n * p->n_head, 256), 256, 0, c->stream>>>(a);
    if (CUDA_LAUNCHED(c) != 0)
        return;
    if (smem > 48 * 1024 &&
        CUDA_CHECK(c, cudaFuncSetAttribute(k_ssd_scan, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != 0)
        return;
    k_ssd_scan<<<(unsigned)(c->d.n_grp * p->n_head), 256, smem, c->stream>>>(a);
    CUDA_LAUNCHED(c);
}
