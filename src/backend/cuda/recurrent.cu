/* recurrent: the short causal conv, the gated delta rule (Gated DeltaNet) and
 * the Mamba2 selective scan on the GPU.
 *
 * The conv is parallel over (token, channel): each thread walks its token's
 * parent chain for the K-1 earlier inputs. The step scans are sequential over
 * each sequence's rows: a block per (sequence, head, slice of the state)
 * keeps its slice in registers and applies the recurrent step of the
 * reference (transformers' torch_recurrent_gated_delta_rule, the Mamba2
 * decode step) token after token, following parents as the cpu backend does
 * (a row whose parent is not the row before reloads its parent's kept
 * state), preparing each row's inputs (normalised q/k, decay, beta, dt)
 * itself: a decode step is one launch per scan.
 *
 * A sequence whose rows are one chain from its committed state (a prefill)
 * takes the chunked forms instead, as the cpu backend does (delta_chunked,
 * ssd_chunked: the same operations in the same order per output): what needs
 * no state (the delta rule's T, u, w and masked q.k; Mamba2's C.B products)
 * for every chunk at once, then one pass per (sequence, head, slice of the
 * state) over the chunks in order. The cpu's chunked forms equal the step to
 * ~1e-5 relative (tests/unit/test_recurrent.c). Outside precise mode a
 * prompt's Mamba2 scan runs as batched tensor-core products instead
 * (ssd_gemm.cu), and its delta rule as batched fp32 products
 * (delta_gemm.cu). */
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

#define CV_ROWS 16 /* rows per block */
#define CV_U 4     /* rows whose taps are loaded together */

/* block per (256 channels, CV_ROWS rows). Tap t of row i reads the row t
 * steps up its parent chain or, past the chain's first row, the state's
 * saved inputs; the first threads walk the rows' chains into tap (an x row,
 * or -1 - e for the state's entry e). KT: the kernel width when known at
 * compile time (0: a.K, the tap loops unrolled to 16 and masked past it). */
template <int KT> __global__ void __launch_bounds__(256) k_conv1d(struct conv_args a)
{
    __shared__ int32_t tap[CV_ROWS][16];
    const int32_t K = KT ? KT : a.K, i0 = blockIdx.y * CV_ROWS, KM = KT ? KT : 16;
    if (threadIdx.x < CV_ROWS && i0 + (int32_t)threadIdx.x < a.n) {
        int32_t r = i0 + threadIdx.x, e = K - 2;
        tap[threadIdx.x][0] = r;
        for (int32_t t = 1; t < K; t++) {
            r = r >= 0 ? a.b.parent[r] : -1;
            tap[threadIdx.x][t] = r >= 0 ? r : -1 - e--;
        }
    }
    __syncthreads();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, cw = c < a.C ? c : 0;
    const float bias = a.bias ? dev_weight(a.bias, a.bt, cw) : 0.0f;
    float w[KM];
#pragma unroll
    for (int32_t t = 0; t < KM; t++)
        w[t] = t < K ? dev_weight(a.w, a.wt, cw * K + (K - 1 - t)) : 0.0f;
    grid_dep_wait(); /* x: the input product's */
    if (c >= a.C)
        return;
    for (int32_t r0 = 0; r0 < CV_ROWS && i0 + r0 < a.n; r0 += CV_U) {
        float val[CV_U][KM];
#pragma unroll
        for (int32_t u = 0; u < CV_U; u++)
#pragma unroll
            for (int32_t t = 0; t < KM; t++) {
                const int32_t i = i0 + r0 + u, q = t < K && i < a.n ? tap[r0 + u][t] : 0;
                val[u][t] = q >= 0 ? a.x[(int64_t)q * a.xs + c]
                                   : a.state[(int64_t)a.b.state_in[i] * a.ss + (int64_t)(-1 - q) * a.C + c];
            }
        grid_dep_launch();
#pragma unroll
        for (int32_t u = 0; u < CV_U; u++) {
            const int32_t i = i0 + r0 + u;
            if (i >= a.n)
                break;
            float acc = bias;
#pragma unroll
            for (int32_t t = 0; t < KM; t++)
                acc += t < K ? w[t] * val[u][t] : 0.0f;
            a.out[(int64_t)i * a.os + c] = acc / (1.0f + expf(-acc));
            const int32_t so = a.b.state_out[i];
            if (so >= 0)
#pragma unroll
                for (int32_t t = 0; t < KM - 1; t++)
                    if (t < K - 1)
                        a.state[(int64_t)so * a.ss + (int64_t)(K - 2 - t) * a.C + c] = val[u][t];
        }
    }
}

/* The same for a batch that is one chain in order (a prompt) and a width of
 * 4 (every model's): row i's taps are rows i, i-1, ... and, before row 0,
 * the state's saved inputs from the latest. A thread loads its channel of
 * the CV_ROWS rows and the 3 before them at once, each x element once. */
__global__ void __launch_bounds__(256) k_conv1d_chain4(struct conv_args a)
{
    enum { K = 4 };
    const int32_t i0 = blockIdx.y * CV_ROWS;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    grid_dep_wait(); /* x: the input product's */
    if (c >= a.C)
        return;
    const float *st = a.state + (int64_t)a.b.state_in[0] * a.ss;
    float v[CV_ROWS + K - 1], w[K]; /* v[m]: row i0 - (K-1) + m */
#pragma unroll
    for (int32_t m = 0; m < CV_ROWS + K - 1; m++) {
        const int32_t j = i0 - (K - 1) + m;
        v[m] = j >= a.n ? 0.0f : j >= 0 ? a.x[(int64_t)j * a.xs + c] : st[(int64_t)(K - 1 + j) * a.C + c];
    }
#pragma unroll
    for (int32_t t = 0; t < K; t++)
        w[t] = dev_weight(a.w, a.wt, c * K + (K - 1 - t));
    const float bias = a.bias ? dev_weight(a.bias, a.bt, c) : 0.0f;
#pragma unroll
    for (int32_t r = 0; r < CV_ROWS; r++) {
        const int32_t i = i0 + r;
        if (i >= a.n)
            break;
        float acc = bias;
#pragma unroll
        for (int32_t t = 0; t < K; t++)
            acc += w[t] * v[r + K - 1 - t];
        a.out[(int64_t)i * a.os + c] = acc / (1.0f + expf(-acc));
        const int32_t so = a.b.state_out[i];
        if (so >= 0)
#pragma unroll
            for (int32_t t = 0; t < K - 1; t++)
                a.state[(int64_t)so * a.ss + (int64_t)(K - 2 - t) * a.C + c] = v[r + K - 1 - t];
    }
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
    const dim3 grid(cdiv(x->n_cols, 256), cdiv(n, CV_ROWS));
    if (c->one_chain && K == 4)
        cuda_launch_dep(c, k_conv1d_chain4, grid, dim3(256), 0, a);
    else
        cuda_launch_dep(c, K == 4 ? k_conv1d<4> : k_conv1d<0>, grid, dim3(256), 0, a);
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
    /* the chunked form: a record per (chain, chunk, value head), rec floats:
     * w [DC][dk], u [DC][dv], the masked q.k products transposed [DC (s)][DC (t)],
     * the cumulative log decay [DC]; NULL when every group takes the step */
    float *chunk;
    int64_t rec;
    int32_t n_ci; /* chunks of the longest chain */
    struct dev_batch bt;
};

#define DC CUDA_DELTA_CHUNK
#define DC_SLICE 32 /* state columns per k_delta_pass block */
#define DC_TR (DC / 8) /* chunk rows per warp of k_delta_pass (8 warps) */
#define DS_COLS 32 /* state columns per k_delta_step block, a lane each */
#define DS_WARPS 8
#define DS_RMAX 32 /* state rows a lane keeps at most: dk <= DS_WARPS * DS_RMAX */

/* a warp: row i's q (normalised, scaled) and k (normalised) of key head kh
 * into qo and ko; the same function wherever a row is prepared */
static __device__ __forceinline__ void delta_qk_norm(const struct delta_args &a, int32_t i, int32_t kh, float *qo,
                                                     float *ko)
{
    const int lane = threadIdx.x & 31, dk = a.dk;
    const float *qr = a.q + (int64_t)i * a.qs + (int64_t)kh * dk, *kr = a.k + (int64_t)i * a.ks + (int64_t)kh * dk;
    float sq = 0.0f, sk = 0.0f;
    for (int d = lane; d < dk; d += 32) {
        sq += qr[d] * qr[d];
        sk += kr[d] * kr[d];
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f), scale = 1.0f / sqrtf((float)dk);
    for (int d = lane; d < dk; d += 32) {
        qo[d] = qr[d] * iq * scale;
        ko[d] = kr[d] * ik;
    }
}

/* row i's decay log g and beta for value head h */
static __device__ __forceinline__ float2 delta_gate(const struct delta_args &a, int32_t i, int32_t h)
{
    const float bb = a.b[(int64_t)i * a.bs + h], aa = a.a[(int64_t)i * a.as + h];
    return make_float2(-expf(dev_weight(a.A_log, a.At, h)) * softplus(aa + dev_weight(a.dt_bias, a.dtt, h)),
                       1.0f / (1.0f + expf(-bb)));
}

/* for the chunked and product forms: one warp per (token, key head): the
 * normalised q and k; and per (token, value head) g, beta */
__global__ void k_delta_prep(struct delta_args a)
{
    const int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (item < (int64_t)a.n * a.Hk)
        delta_qk_norm(a, (int32_t)(item / a.Hk), (int32_t)(item % a.Hk), a.qn + item * a.dk, a.kn + item * a.dk);
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < (int64_t)a.n * a.Hv) {
        const float2 gb = delta_gate(a, (int32_t)(t / a.Hv), (int32_t)(t % a.Hv));
        a.gb[2 * t] = gb.x;
        a.gb[2 * t + 1] = gb.y;
    }
}

/* block per (sequence group, value head, DS_COLS columns of S [dk][dv]), 8
 * warps: lane = column, warp w keeps rows w, w + 8, ... in registers (loaded
 * all at once: a decode step is one read and one write of the state); warp
 * 0 prepares the row's q and k as k_delta_prep does. The
 * sums over the rows (k.S, q.S) add each warp's rows in order, then the
 * warps in order through shared memory: a row's bits do not depend on its
 * batch. */
template <int RM> __global__ void __launch_bounds__(DS_WARPS * 32, RM <= 16 ? 2 : 1) k_delta_step(struct delta_args a)
{
    __shared__ float qs[DS_WARPS * RM], ks[DS_WARPS * RM], red[2][DS_WARPS][32];
    const int32_t dk = a.dk, dv = a.dv, Hv = a.Hv, nc = (dv + DS_COLS - 1) / DS_COLS;
    const int32_t g = blockIdx.x / (Hv * nc), h = blockIdx.x / nc % Hv, kh = h / (Hv / a.Hk);
    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, e = blockIdx.x % nc * DS_COLS + lane;
    const bool col = e < dv;
    const int32_t *rows = a.bt.grp_rows + a.bt.grp_start[g], n = a.bt.grp_start[g + 1] - a.bt.grp_start[g];
    const int64_t off = (int64_t)h * dk * dv + (col ? e : 0);
    grid_dep_wait(); /* q, k, v, a, b: the layer's products and conv */
    if (a.chunk && a.bt.grp_chain[g] >= 0) /* k_delta_pass's */
        return;
    float S[RM];
    int32_t prev = -1;
    for (int32_t r = 0; r < n; r++) {
        const int32_t i = rows[r], p = a.bt.parent[i];
        if (p < 0 || p != prev) {
            const float *src = a.state + (int64_t)(p < 0 ? a.bt.state_in[i] : a.bt.state_out[p]) * a.ss + off;
#pragma unroll
            for (int32_t j = 0; j < RM; j++) {
                const int32_t d = warp + DS_WARPS * j;
                S[j] = d < dk ? src[(int64_t)d * dv] : 0.0f;
            }
        }
        grid_dep_launch();
        __syncthreads(); /* the last row is done with qs, ks */
        if (warp == 0)
            delta_qk_norm(a, i, kh, qs, ks);
        const float2 gb = delta_gate(a, i, h);
        const float decay = expf(gb.x), beta = gb.y;
        const float ve = col ? a.v[(int64_t)i * a.vs + (int64_t)h * dv + e] : 0.0f;
        __syncthreads();
        float kv = 0.0f;
#pragma unroll
        for (int32_t j = 0; j < RM; j++) {
            const int32_t d = warp + DS_WARPS * j;
            S[j] *= decay;
            kv += d < dk ? ks[d] * S[j] : 0.0f;
        }
        red[0][warp][lane] = kv;
        __syncthreads();
        kv = 0.0f;
#pragma unroll
        for (int32_t w = 0; w < DS_WARPS; w++)
            kv += red[0][w][lane];
        const float delta = (ve - kv) * beta;
        float o = 0.0f;
#pragma unroll
        for (int32_t j = 0; j < RM; j++) {
            const int32_t d = warp + DS_WARPS * j;
            S[j] += d < dk ? ks[d] * delta : 0.0f;
            o += d < dk ? qs[d] * S[j] : 0.0f;
        }
        red[1][warp][lane] = o;
        const int32_t so = a.bt.state_out[i];
        if (so >= 0 && col) {
            float *dst = a.state + (int64_t)so * a.ss + off;
#pragma unroll
            for (int32_t j = 0; j < RM; j++) {
                const int32_t d = warp + DS_WARPS * j;
                if (d < dk)
                    dst[(int64_t)d * dv] = S[j];
            }
        }
        __syncthreads();
        if (warp == 0 && col) {
            o = 0.0f;
#pragma unroll
            for (int32_t w = 0; w < DS_WARPS; w++)
                o += red[1][w][lane];
            a.out[(int64_t)i * a.os + (int64_t)h * dv + e] = o;
        }
        prev = i;
    }
}

/* block per (group, chunk, value head), 256 threads: a chunk's record. With
 * gc the cumulative log decay, A_ts = -beta_t k_t.k_s e^{gc_t-gc_s} (s < t),
 * T = the forward substitution of the cpu's delta_chunked on A (row after
 * row), u_t = sum_s T_ts beta_s v_s, w_t = sum_s T_ts beta_s e^{gc_s} k_s,
 * p_ts = q_t.k_s e^{gc_t-gc_s} (s <= t). */
__global__ void __launch_bounds__(256) k_delta_chunk(struct delta_args a)
{
    extern __shared__ float sm[];
    const int32_t g = blockIdx.x, ci = blockIdx.y, h = blockIdx.z, chain = a.bt.grp_chain[g];
    const int32_t n = a.bt.grp_start[g + 1] - a.bt.grp_start[g], t0 = ci * DC;
    if (chain < 0 || t0 >= n)
        return;
    const int32_t L = min(DC, n - t0), dk = a.dk, dv = a.dv, kp = dk + 1, ap = DC + 1, kh = h / (a.Hv / a.Hk);
    const int32_t *rows = a.bt.grp_rows + a.bt.grp_start[g] + t0;
    float *Ks = sm, *Qs = Ks + DC * kp, *Vs = Qs + DC * kp, *A = Vs + DC * dv, *T = A + DC * ap, *gc = T + DC * ap;
    float *beta = gc + DC, *egc = beta + DC;
    float *rec = a.chunk + (((int64_t)chain * a.n_ci + ci) * a.Hv + h) * a.rec;
    float *rw = rec, *ru = rw + DC * dk, *rp = ru + DC * dv, *rg = rp + DC * DC;
    for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
        const int t = e / dk, d = e % dk;
        const int64_t src = ((int64_t)rows[t] * a.Hk + kh) * dk + d;
        Ks[t * kp + d] = a.kn[src];
        Qs[t * kp + d] = a.qn[src];
    }
    for (int e = threadIdx.x; e < L * dv; e += blockDim.x) {
        const int t = e / dv, d = e % dv;
        Vs[t * dv + d] = a.v[(int64_t)rows[t] * a.vs + (int64_t)h * dv + d];
    }
    for (int t = threadIdx.x; t < L; t += blockDim.x) {
        const int64_t gi = 2 * ((int64_t)rows[t] * a.Hv + h);
        gc[t] = a.gb[gi];
        beta[t] = a.gb[gi + 1];
    }
    __syncthreads();
    if (threadIdx.x < 32) /* the cumulative log decay */
        warp_prefix_sum(gc, L);
    __syncthreads();
    for (int t = threadIdx.x; t < L; t += blockDim.x) {
        rg[t] = gc[t];
        egc[t] = expf(gc[t]);
    }
    __syncthreads();
    /* lanes take consecutive t (padded rows: no bank conflicts), s is the warp's */
    for (int p = threadIdx.x; p < DC * DC; p += blockDim.x) {
        const int t = p % DC, s = p / DC;
        const bool in = t < L && s <= t;
        float kk = 0.0f, qk = 0.0f;
        if (in)
            for (int d = 0; d < dk; d++) {
                kk += Ks[t * kp + d] * Ks[s * kp + d];
                qk += Qs[t * kp + d] * Ks[s * kp + d];
            }
        const float dec = in ? expf(gc[t] - gc[s]) : 0.0f;
        A[t * ap + s] = in && s < t ? -beta[t] * kk * dec : 0.0f;
        T[t * ap + s] = s == t ? 1.0f : A[t * ap + s];
        rp[p] = in ? qk * dec : 0.0f; /* [s][t] */
    }
    __syncthreads();
    /* row t of T from the rows before it; T_t,t-1 = A_t,t-1 needs no sum */
    for (int t = 2; t < L; t++) {
        const int s = threadIdx.x;
        if (s < t - 1) {
            float acc = A[t * ap + s];
            for (int m = s + 1; m < t; m++)
                acc += A[t * ap + m] * T[m * ap + s];
            T[t * ap + s] = acc;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < L * dv; e += blockDim.x) {
        const int t = e / dv, d = e % dv;
        float acc = 0.0f;
        for (int s = 0; s <= t; s++)
            acc += T[t * ap + s] * beta[s] * Vs[s * dv + d];
        ru[e] = acc;
    }
    for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
        const int t = e / dk, d = e % dk;
        float acc = 0.0f;
        for (int s = 0; s <= t; s++)
            acc += T[t * ap + s] * beta[s] * egc[s] * Ks[s * kp + d];
        rw[e] = acc;
    }
}

/* block per (group, value head, DC_SLICE state columns), 256 threads: the
 * chain's chunks in order, S [dk][DC_SLICE] carried in shared memory. Per
 * chunk: v' = u - w S; out_t = e^{gc_t} q_t S + sum_{s<=t} p_ts v'_s;
 * S = e^{gc_L} S + sum_s e^{gc_L-gc_s} k_s v'_s^T. Warp w takes chunk rows
 * w, w+8, ... and state rows [w dk/8, (w+1) dk/8); the lane is the column. */
__global__ void __launch_bounds__(256) k_delta_pass(struct delta_args a)
{
    extern __shared__ float sm[];
    const int32_t g = blockIdx.x, h = blockIdx.y, chain = a.bt.grp_chain[g];
    if (chain < 0)
        return;
    const int32_t dk = a.dk, dv = a.dv, kh = h / (a.Hv / a.Hk), pp = DC + 1;
    const int32_t *rows = a.bt.grp_rows + a.bt.grp_start[g], n = a.bt.grp_start[g + 1] - a.bt.grp_start[g];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int32_t c0 = blockIdx.z * DC_SLICE, col = c0 + lane;
    const bool ok = col < dv;
    float *S = sm, *Ws = S + dk * DC_SLICE, *Qs = Ws + DC * dk, *Ks = Qs + DC * dk, *Ps = Ks + DC * dk;
    float *Vp = Ps + DC * pp, *eq = Vp + DC * DC_SLICE, *ek = eq + DC;
    const int64_t off = (int64_t)h * dk * dv;
    const float *src = a.state + (int64_t)a.bt.state_in[rows[0]] * a.ss + off;
    for (int d = warp; d < dk; d += nw)
        S[d * DC_SLICE + lane] = ok ? src[(int64_t)d * dv + col] : 0.0f;
    for (int32_t t0 = 0, ci = 0; t0 < n; t0 += DC, ci++) {
        const int32_t L = min(DC, n - t0);
        const float *rec = a.chunk + (((int64_t)chain * a.n_ci + ci) * a.Hv + h) * a.rec;
        const float *rw = rec, *ru = rw + DC * dk, *rp = ru + DC * dv, *rg = rp + DC * DC;
        __syncthreads(); /* the last chunk's reads are done */
        if (threadIdx.x < L) { /* e^{gc_t}, e^{gc_L-gc_t} */
            eq[threadIdx.x] = expf(rg[threadIdx.x]);
            ek[threadIdx.x] = expf(rg[L - 1] - rg[threadIdx.x]);
        }
        for (int e = threadIdx.x; e < L * dk; e += blockDim.x)
            Ws[e] = rw[e];
        for (int e = threadIdx.x; e < L * DC_SLICE; e += blockDim.x) {
            const int t = e / DC_SLICE, j = e % DC_SLICE;
            Vp[e] = c0 + j < dv ? ru[(int64_t)t * dv + c0 + j] : 0.0f;
        }
        for (int e = threadIdx.x; e < L * DC; e += blockDim.x) {
            const int s = e / DC, t = e % DC;
            Ps[t * pp + s] = rp[e];
        }
        __syncthreads();
        const float el = expf(rg[L - 1]);
        for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
            const int t = e / dk, d = e % dk;
            const int64_t src_qk = ((int64_t)rows[t0 + t] * a.Hk + kh) * dk + d;
            Qs[e] = a.qn[src_qk] * eq[t];
            Ks[e] = a.kn[src_qk] * ek[t];
        }
        /* The products below keep a thread's entries in registers, each
         * summed in the same order as one at a time: a state entry read once
         * serves the warp's DC_TR rows (rows t = warp + 8i, i < DC_TR), a
         * row's w, q (four head dims a load) and k entries are broadcasts. */
        {
            float acc[DC_TR]; /* v' = u - w S: a thread's own entries */
#pragma unroll
            for (int i = 0; i < DC_TR; i++)
                acc[i] = warp + 8 * i < L ? Vp[(warp + 8 * i) * DC_SLICE + lane] : 0.0f;
            for (int d = 0; d < dk; d += 4) {
                const float s0 = S[d * DC_SLICE + lane], s1 = S[(d + 1) * DC_SLICE + lane];
                const float s2 = S[(d + 2) * DC_SLICE + lane], s3 = S[(d + 3) * DC_SLICE + lane];
#pragma unroll
                for (int i = 0; i < DC_TR; i++) {
                    const float4 w = *(const float4 *)(Ws + (warp + 8 * i) * dk + d);
                    acc[i] -= w.x * s0;
                    acc[i] -= w.y * s1;
                    acc[i] -= w.z * s2;
                    acc[i] -= w.w * s3;
                }
            }
#pragma unroll
            for (int i = 0; i < DC_TR; i++)
                if (warp + 8 * i < L)
                    Vp[(warp + 8 * i) * DC_SLICE + lane] = acc[i];
        }
        __syncthreads();
        {
            float o[DC_TR];
#pragma unroll
            for (int i = 0; i < DC_TR; i++)
                o[i] = 0.0f;
            for (int d = 0; d < dk; d += 4) {
                const float s0 = S[d * DC_SLICE + lane], s1 = S[(d + 1) * DC_SLICE + lane];
                const float s2 = S[(d + 2) * DC_SLICE + lane], s3 = S[(d + 3) * DC_SLICE + lane];
#pragma unroll
                for (int i = 0; i < DC_TR; i++) {
                    const float4 q = *(const float4 *)(Qs + (warp + 8 * i) * dk + d);
                    o[i] += q.x * s0;
                    o[i] += q.y * s1;
                    o[i] += q.z * s2;
                    o[i] += q.w * s3;
                }
            }
            for (int s = 0; s < L; s++) {
                const float v = Vp[s * DC_SLICE + lane];
#pragma unroll
                for (int i = 0; i < DC_TR; i++)
                    if (s <= warp + 8 * i)
                        o[i] += Ps[(warp + 8 * i) * pp + s] * v;
            }
#pragma unroll
            for (int i = 0; i < DC_TR; i++)
                if (ok && warp + 8 * i < L)
                    a.out[(int64_t)rows[t0 + warp + 8 * i] * a.os + (int64_t)h * dv + col] = o[i];
        }
        __syncthreads(); /* S read above before it changes */
        /* the state: warp w owns rows [w dk/8, (w+1) dk/8), eight at a time */
        for (int d0 = warp * (dk / 8); d0 < (warp + 1) * (dk / 8); d0 += 8) {
            float acc[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[i] = S[(d0 + i) * DC_SLICE + lane] * el;
            for (int s = 0; s < L; s++)
                fma8(acc, Ks + s * dk + d0, Vp[s * DC_SLICE + lane]);
#pragma unroll
            for (int i = 0; i < 8; i++)
                S[(d0 + i) * DC_SLICE + lane] = acc[i];
        }
    }
    const int32_t so = a.bt.state_out[rows[n - 1]];
    if (so >= 0 && ok) { /* the state rows this thread wrote last */
        float *dst = a.state + (int64_t)so * a.ss + off;
        for (int d = warp * (dk / 8); d < (warp + 1) * (dk / 8); d++)
            dst[(int64_t)d * dv + col] = S[d * DC_SLICE + lane];
    }
}

void cuda_delta_rule(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *k,
                     const struct tensor *v, const struct tensor *a, const struct tensor *b,
                     const struct tensor *A_log, const struct tensor *dt_bias, struct tensor *state,
                     int32_t n_k_head, int32_t n_v_head, int32_t k_dim, int32_t v_dim)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = c->b.n_tokens;
    assert(n_v_head % n_k_head == 0 && k_dim <= DS_WARPS * DS_RMAX);
    assert(state->n_cols == (int64_t)n_v_head * k_dim * v_dim);
    if (cuda_op_skip(c) || n == 0)
        return;
    /* the chunked form where a group is a chain and its tiles fit shared memory */
    const size_t sm_chunk = ((size_t)2 * DC * (k_dim + 1) + (size_t)DC * v_dim + 2 * DC * (DC + 1) + 3 * DC) * sizeof(float);
    const size_t sm_pass = ((size_t)k_dim * DC_SLICE + 3 * (size_t)DC * k_dim + DC * (DC + 1) + DC * DC_SLICE + 2 * DC) *
                           sizeof(float);
    /* k_delta_pass reads rows four head dims at a time and gives each warp
     * whole groups of eight state rows */
    const bool gemm = cuda_delta_gemm_takes(c, k_dim);
    const bool chunked = !gemm && c->n_chain > 0 && k_dim % 64 == 0 && sm_chunk <= 200 * 1024 && sm_pass <= 200 * 1024;
    const int32_t n_ci = (int32_t)cdiv(c->chain_rows, DC);
    const int64_t rec = (int64_t)DC * (k_dim + v_dim + DC + 1);
    const size_t n_in = (size_t)2 * n * n_k_head * k_dim + (size_t)2 * n * n_v_head;
    const size_t n_rec = chunked ? (size_t)c->n_chain * n_ci * n_v_head * rec : 0;
    float *scr = (float *)cuda_scratch(c, SCR_REC, (n_in + n_rec) * sizeof(float));
    if (!scr)
        return;
    struct delta_args d = {(float *)out->data, out->row_stride, (const float *)q->data, (const float *)k->data,
                           (const float *)v->data, (const float *)a->data, (const float *)b->data, q->row_stride,
                           k->row_stride, v->row_stride, a->row_stride, b->row_stride, A_log->data,
                           dt_bias->data, A_log->type, dt_bias->type, (float *)state->data, state->row_stride,
                           n_k_head, n_v_head, k_dim, v_dim, n, scr, scr + (size_t)n * n_k_head * k_dim,
                           scr + (size_t)2 * n * n_k_head * k_dim, chunked ? scr + n_in : NULL, rec, n_ci, c->d};
    const int64_t items = (int64_t)n * (n_k_head > n_v_head ? n_k_head : n_v_head);
    if (gemm || chunked) {
        k_delta_prep<<<cdiv(items * 32, 256), 256, 0, c->stream>>>(d);
        if (CUDA_LAUNCHED(c) != 0)
            return;
    }
    if (gemm) {
        cuda_delta_gemm(c, d.out, d.os, d.qn, d.kn, d.v, d.vs, d.gb, n_k_head, n_v_head, k_dim, v_dim, d.state, d.ss);
        return;
    }
    if (chunked) {
        if (CUDA_CHECK(c, cudaFuncSetAttribute(k_delta_chunk, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)sm_chunk)) != 0 ||
            CUDA_CHECK(c, cudaFuncSetAttribute(k_delta_pass, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)sm_pass)) != 0)
            return;
        k_delta_chunk<<<dim3((unsigned)c->d.n_grp, (unsigned)n_ci, (unsigned)n_v_head), 256, sm_chunk, c->stream>>>(d);
        if (CUDA_LAUNCHED(c) != 0)
            return;
        k_delta_pass<<<dim3((unsigned)c->d.n_grp, (unsigned)n_v_head, cdiv(v_dim, DC_SLICE)), 256, sm_pass,
                       c->stream>>>(d);
        if (CUDA_LAUNCHED(c) != 0 || c->n_chain == c->d.n_grp)
            return;
    }
    cuda_launch_dep(c, k_dim <= DS_WARPS * 16 ? k_delta_step<16> : k_delta_step<DS_RMAX>,
                    dim3((unsigned)(c->d.n_grp * n_v_head * cdiv(v_dim, DS_COLS))), dim3(DS_WARPS * 32), 0, d);
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
    /* the chunked form: C_t.B_s (s <= t) per (chain, chunk, group), [chunk][chunk]
     * each; NULL when every group takes the step */
    float *gram;
    int32_t n_ci; /* chunks of the longest chain */
    struct dev_batch bt;
};

#define SC_SLICE 16 /* rows of a head's state per k_ssd_pass block */
#define SC_SUB 32   /* chunk rows staged at a time by k_ssd_pass */
#define SS_ROWS 16  /* state rows per k_ssd_step block, two a warp */
#define SS_NMAX 8   /* state columns a lane keeps: d_state <= 32 * SS_NMAX */

/* row i's time step for head h: clamp(softplus(dt + dt_bias)) */
static __device__ __forceinline__ float ssd_dt(const struct ssd_args &a, int32_t i, int32_t h)
{
    const float d = softplus(a.dt[(int64_t)i * a.dts + h] + dev_weight(a.dt_bias, a.dtt, h));
    const float lo = a.p.dt_min > a.p.dt_lo ? a.p.dt_min : a.p.dt_lo;
    return d < lo ? lo : d > a.p.dt_hi ? a.p.dt_hi : d;
}

/* for the chunked and product forms: every row's time steps */
__global__ void k_ssd_prep(struct ssd_args a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t H = a.p.n_head;
    if (t < (int64_t)a.n * H)
        a.dts_out[t] = ssd_dt(a, (int32_t)(t / H), (int32_t)(t % H));
}

/* block per (sequence group, head, SS_ROWS rows of S [P][N]), 8 warps: warp
 * w keeps rows w and w + 8 of the block's, lane l their columns l, l + 32,
 * ... in registers (loaded all at once), and loads B and C itself: the warps
 * never wait for each other. y's sum adds a lane's columns in order, then
 * the lanes by warp_sum, as every row of every batch does. */
__global__ void __launch_bounds__(256) k_ssd_step(struct ssd_args a)
{
    const int32_t P = a.p.head_dim, N = a.p.d_state, H = a.p.n_head, nr = (P + SS_ROWS - 1) / SS_ROWS;
    const int32_t g = blockIdx.x / (H * nr), h = blockIdx.x / nr % H, grp = h / (H / a.p.n_group);
    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, a0 = blockIdx.x % nr * SS_ROWS + warp;
    const int32_t *rows = a.bt.grp_rows + a.bt.grp_start[g], n = a.bt.grp_start[g + 1] - a.bt.grp_start[g];
    const int64_t off = (int64_t)h * P * N;
    const float A = -expf(dev_weight(a.A_log, a.At, h)), Dh = dev_weight(a.D, a.Dt, h);
    grid_dep_wait(); /* x, B, C, dt: the layer's product and conv */
    if (a.gram && a.bt.grp_chain[g] >= 0) /* k_ssd_pass's */
        return;
    float S[2][SS_NMAX];
    int32_t prev = -1;
    for (int32_t r = 0; r < n; r++) {
        const int32_t i = rows[r], p = a.bt.parent[i];
        if (p < 0 || p != prev) {
            const float *src = a.state + (int64_t)(p < 0 ? a.bt.state_in[i] : a.bt.state_out[p]) * a.ss + off;
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int m = 0; m < SS_NMAX; m++) {
                    const int32_t row = a0 + 8 * u, e = lane + 32 * m;
                    S[u][m] = row < P && e < N ? src[(int64_t)row * N + e] : 0.0f;
                }
        }
        float Bv[SS_NMAX], Cv[SS_NMAX], xv[2];
#pragma unroll
        for (int m = 0; m < SS_NMAX; m++) {
            const int32_t e = lane + 32 * m;
            Bv[m] = e < N ? a.B[(int64_t)i * a.Bs + (int64_t)grp * N + e] : 0.0f;
            Cv[m] = e < N ? a.C[(int64_t)i * a.Cs + (int64_t)grp * N + e] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 2; u++)
            xv[u] = a0 + 8 * u < P ? a.x[(int64_t)i * a.xs + (int64_t)h * P + a0 + 8 * u] : 0.0f;
        const float dt = ssd_dt(a, i, h), dA = expf(dt * A);
        grid_dep_launch();
        const int32_t so = a.bt.state_out[i];
        float *dst = a.state + (int64_t)(so >= 0 ? so : 0) * a.ss + off;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int32_t row = a0 + 8 * u;
            const float dx = dt * xv[u];
            float yv = 0.0f;
#pragma unroll
            for (int m = 0; m < SS_NMAX; m++) {
                S[u][m] = S[u][m] * dA + dx * Bv[m];
                yv += S[u][m] * Cv[m];
            }
            yv = warp_sum(yv);
            if (row >= P)
                continue;
            if (lane == 0)
                a.y[(int64_t)i * a.ys + (int64_t)h * P + row] = yv + Dh * xv[u];
            if (so >= 0)
#pragma unroll
                for (int m = 0; m < SS_NMAX; m++)
                    if (lane + 32 * m < N)
                        dst[(int64_t)row * N + lane + 32 * m] = S[u][m];
        }
        prev = i;
    }
}

/* block per (group of rows, chunk, ssm group), 256 threads: G_ts = C_t.B_s
 * for s <= t < L (0 elsewhere); lanes take consecutive s (padded B rows) */
__global__ void __launch_bounds__(256) k_ssd_gram(struct ssd_args a)
{
    extern __shared__ float sm[];
    const int32_t g = blockIdx.x, ci = blockIdx.y, gr = blockIdx.z, chain = a.bt.grp_chain[g];
    const int32_t CH = a.p.chunk, N = a.p.d_state, np = N + 1, t0 = ci * CH;
    const int32_t n = a.bt.grp_start[g + 1] - a.bt.grp_start[g];
    if (chain < 0 || t0 >= n)
        return;
    const int32_t L = min(CH, n - t0), *rows = a.bt.grp_rows + a.bt.grp_start[g] + t0;
    float *Bs = sm, *Cs = Bs + CH * np;
    float *G = a.gram + (((int64_t)chain * a.n_ci + ci) * a.p.n_group + gr) * CH * CH;
    for (int e = threadIdx.x; e < L * N; e += blockDim.x) {
        const int t = e / N, d = e % N;
        Bs[t * np + d] = a.B[(int64_t)rows[t] * a.Bs + (int64_t)gr * N + d];
        Cs[t * np + d] = a.C[(int64_t)rows[t] * a.Cs + (int64_t)gr * N + d];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < CH * CH; e += blockDim.x) {
        const int t = e / CH, s = e % CH;
        float acc = 0.0f;
        if (t < L && s <= t)
            for (int d = 0; d < N; d++)
                acc += Cs[t * np + d] * Bs[s * np + d];
        G[e] = acc;
    }
}

/* block per (group of rows, head, SC_SLICE rows of its state S [P][N]), 256
 * threads: the chain's chunks in order. Per chunk, with acum the cumulative
 * dt*A: y_t = e^{acum_t} S C_t + D x_t + sum_{s<=t} G_ts e^{acum_t-acum_s} dt_s x_s,
 * then S = e^{acum_L} S + sum_s (e^{acum_L-acum_s} dt_s x_s) B_s^T; C and B
 * rows are staged SC_SUB at a time. */
__global__ void __launch_bounds__(256) k_ssd_pass(struct ssd_args a)
{
    static_assert(SC_SLICE == 16 && SC_SUB == 32, "k_ssd_pass: 256 threads are 32 rows x 8 pairs of state rows");
    extern __shared__ float sm[];
    const int32_t g = blockIdx.x, h = blockIdx.y, chain = a.bt.grp_chain[g];
    if (chain < 0)
        return;
    const int32_t P = a.p.head_dim, N = a.p.d_state, H = a.p.n_head, CH = a.p.chunk, np = N + 1;
    const int32_t grp = h / (H / a.p.n_group), a0 = blockIdx.z * SC_SLICE, na = min(SC_SLICE, P - a0);
    const int32_t *rows = a.bt.grp_rows + a.bt.grp_start[g], n = a.bt.grp_start[g + 1] - a.bt.grp_start[g];
    const float A = -expf(dev_weight(a.A_log, a.At, h)), Dh = dev_weight(a.D, a.Dt, h);
    float *S = sm, *xs = S + SC_SLICE * np, *cw = xs + CH * SC_SLICE, *acum = cw + CH * SC_SLICE, *dts = acum + CH;
    float *stage = dts + CH, *Wt = stage + SC_SUB * np; /* [SC_SUB][wp]: rows padded against bank conflicts */
    const int32_t wp = CH + 1;
    const int64_t off = (int64_t)h * P * N;
    const float *src = a.state + (int64_t)a.bt.state_in[rows[0]] * a.ss + off;
    for (int e = threadIdx.x; e < na * N; e += blockDim.x)
        S[(e / N) * np + e % N] = src[(int64_t)(a0 + e / N) * N + e % N];
    for (int32_t t0 = 0, ci = 0; t0 < n; t0 += CH, ci++) {
        const int32_t L = min(CH, n - t0);
        const float *G = a.gram + (((int64_t)chain * a.n_ci + ci) * a.p.n_group + grp) * CH * CH;
        __syncthreads(); /* the last chunk is done with the buffers */
        for (int e = threadIdx.x; e < L * SC_SLICE; e += blockDim.x) {
            const int t = e / SC_SLICE, j = e % SC_SLICE;
            xs[e] = j < na ? a.x[(int64_t)rows[t0 + t] * a.xs + (int64_t)h * P + a0 + j] : 0.0f;
        }
        for (int t = threadIdx.x; t < L; t += blockDim.x) {
            dts[t] = a.dts_out[(int64_t)rows[t0 + t] * H + h];
            acum[t] = dts[t] * A;
        }
        __syncthreads();
        if (threadIdx.x < 32)
            warp_prefix_sum(acum, L);
        __syncthreads();
        const float al = acum[L - 1];
        for (int e = threadIdx.x; e < L * SC_SLICE; e += blockDim.x) {
            const int t = e / SC_SLICE;
            cw[e] = expf(al - acum[t]) * dts[t] * xs[e];
        }
        /* the outputs, SC_SUB rows at a time */
        for (int32_t t1 = 0; t1 < L; t1 += SC_SUB) {
            const int32_t nt = min(SC_SUB, L - t1);
            __syncthreads();
            for (int e = threadIdx.x; e < nt * N; e += blockDim.x) {
                const int t = e / N, d = e % N;
                stage[t * np + d] = a.C[(int64_t)rows[t0 + t1 + t] * a.Cs + (int64_t)grp * N + d];
            }
            for (int e = threadIdx.x; e < nt * CH; e += blockDim.x) {
                const int t = t1 + e / CH, s = e % CH;
                Wt[e / CH * wp + s] = s <= t ? G[(int64_t)t1 * CH + e] * expf(acum[t] - acum[s]) * dts[s] : 0.0f;
            }
            __syncthreads();
            /* a thread's two outputs share their C row (and Wt row): row tl,
             * state rows j0 and j0 + 8, each summed in the order of one alone */
            const int tl = threadIdx.x >> 3, j0 = threadIdx.x & 7, t = t1 + tl;
            if (tl < nt) {
                float d0 = 0.0f, d1 = 0.0f;
                for (int d = 0; d < N; d++) {
                    const float cv = stage[tl * np + d];
                    d0 += S[j0 * np + d] * cv;
                    d1 += S[(j0 + 8) * np + d] * cv;
                }
                const float ea = expf(acum[t]);
                float y0 = ea * d0 + Dh * xs[t * SC_SLICE + j0], y1 = ea * d1 + Dh * xs[t * SC_SLICE + j0 + 8];
                for (int s = 0; s <= t; s++) {
                    const float w = Wt[tl * wp + s];
                    y0 += w * xs[s * SC_SLICE + j0];
                    y1 += w * xs[s * SC_SLICE + j0 + 8];
                }
                float *yr = a.y + (int64_t)rows[t0 + t] * a.ys + (int64_t)h * P + a0;
                if (j0 < na)
                    yr[j0] = y0;
                if (j0 + 8 < na)
                    yr[j0 + 8] = y1;
            }
        }
        __syncthreads(); /* S read above before it changes */
        const float el = expf(al);
        for (int e = threadIdx.x; e < na * N; e += blockDim.x)
            S[(e / N) * np + e % N] *= el;
        /* the state, SC_SUB rows of B at a time, in row order: a thread takes
         * state rows jh*8 .. jh*8+7 (jh = tid / 128) of its columns d, the
         * weights of its rows read as two float4 broadcasts per B row */
        const int jh = threadIdx.x >> 7;
        for (int32_t s1 = 0; s1 < L; s1 += SC_SUB) {
            const int32_t ns = min(SC_SUB, L - s1);
            __syncthreads();
            for (int e = threadIdx.x; e < ns * N; e += blockDim.x) {
                const int t = e / N, d = e % N;
                stage[t * np + d] = a.B[(int64_t)rows[t0 + s1 + t] * a.Bs + (int64_t)grp * N + d];
            }
            __syncthreads();
            for (int d = threadIdx.x & 127; d < N; d += 128) {
                float acc[8];
#pragma unroll
                for (int m = 0; m < 8; m++)
                    acc[m] = S[(jh * 8 + m) * np + d];
                for (int s = 0; s < ns; s++)
                    fma8(acc, cw + (s1 + s) * SC_SLICE + jh * 8, stage[s * np + d]);
#pragma unroll
                for (int m = 0; m < 8; m++)
                    S[(jh * 8 + m) * np + d] = acc[m];
            }
        }
    }
    const int32_t so = a.bt.state_out[rows[n - 1]];
    __syncthreads(); /* the state update's threads own other entries than these */
    if (so >= 0) {
        float *dst = a.state + (int64_t)so * a.ss + off;
        for (int e = threadIdx.x; e < na * N; e += blockDim.x)
            dst[(int64_t)(a0 + e / N) * N + e % N] = S[(e / N) * np + e % N];
    }
}

void cuda_ssd(struct backend *be, struct tensor *y, const struct tensor *x, const struct tensor *B,
              const struct tensor *C, const struct tensor *dt, const struct tensor *A_log, const struct tensor *D,
              const struct tensor *dt_bias, struct tensor *state, const struct ssd_params *p)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = c->b.n_tokens;
    assert(p->n_head % p->n_group == 0 && p->d_state <= 32 * SS_NMAX);
    assert(state->n_cols == (int64_t)p->n_head * p->head_dim * p->d_state);
    if (cuda_op_skip(c) || n == 0)
        return;
    /* the chunked form where a group is a chain and its tiles fit shared memory */
    const size_t CH = (size_t)p->chunk, np = (size_t)p->d_state + 1;
    const size_t sm_gram = 2 * CH * np * sizeof(float);
    const size_t sm_pass = (SC_SLICE * np + 2 * CH * SC_SLICE + 2 * CH + SC_SUB * np + SC_SUB * (CH + 1)) * sizeof(float);
    const bool gemm = cuda_ssd_gemm_takes(c, p);
    const bool chunked = !gemm && c->n_chain > 0 && sm_gram <= 200 * 1024 && sm_pass <= 200 * 1024;
    const int32_t n_ci = (int32_t)cdiv(c->chain_rows, p->chunk);
    const size_t n_dt = (size_t)n * p->n_head;
    const size_t n_gram = chunked ? (size_t)c->n_chain * n_ci * p->n_group * CH * CH : 0;
    float *scr = (float *)cuda_scratch(c, SCR_REC, (n_dt + n_gram) * sizeof(float));
    if (!scr)
        return;
    struct ssd_args a = {(float *)y->data, y->row_stride, (const float *)x->data, (const float *)B->data,
                         (const float *)C->data, (const float *)dt->data, x->row_stride, B->row_stride,
                         C->row_stride, dt->row_stride, A_log->data, D->data, dt_bias->data, A_log->type,
                         D->type, dt_bias->type, (float *)state->data, state->row_stride, *p, n, scr,
                         chunked ? scr + n_dt : NULL, n_ci, c->d};
    if (gemm || chunked) {
        k_ssd_prep<<<cdiv((int64_t)n * p->n_head, 256), 256, 0, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return;
    }
    if (gemm) {
        cuda_ssd_gemm(c, y, x, B, C, scr, A_log, D, state, p);
        return;
    }
    if (chunked) {
        if (CUDA_CHECK(c, cudaFuncSetAttribute(k_ssd_gram, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)sm_gram)) != 0 ||
            CUDA_CHECK(c, cudaFuncSetAttribute(k_ssd_pass, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)sm_pass)) != 0)
            return;
        k_ssd_gram<<<dim3((unsigned)c->d.n_grp, (unsigned)n_ci, (unsigned)p->n_group), 256, sm_gram, c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0)
            return;
        k_ssd_pass<<<dim3((unsigned)c->d.n_grp, (unsigned)p->n_head, cdiv(p->head_dim, SC_SLICE)), 256, sm_pass,
                     c->stream>>>(a);
        if (CUDA_LAUNCHED(c) != 0 || c->n_chain == c->d.n_grp)
            return;
    }
    cuda_launch_dep(c, k_ssd_step, dim3((unsigned)(c->d.n_grp * p->n_head * cdiv(p->head_dim, SS_ROWS))), dim3(256), 0,
                    a);
}
