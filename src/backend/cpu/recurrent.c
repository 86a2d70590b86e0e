/* recurrent: the cpu backend's recurrent-layer ops: the short causal conv of
 * Gated DeltaNet and Mamba2, the gated delta rule and the Mamba2 selective scan.
 *
 * References: transformers modeling_qwen3_next.py / modeling_qwen3_5.py
 * (torch_causal_conv1d_update, torch_recurrent_gated_delta_rule,
 * torch_chunk_gated_delta_rule) and modeling_nemotron_h.py
 * (NemotronHMamba2Mixer.torch_forward, its decode step and its chunked SSD).
 *
 * Every scan runs per (sequence, head) task, following each token's parent
 * (struct attn_batch). A sequence whose rows are one chain from its committed
 * state with no state kept midway takes the chunked form, the one the
 * reference uses for prefill; otherwise (decode steps, trees, chains a partial
 * commit may cut) each token is one recurrent step, as the reference decodes.
 * The recurrent step is the scalar reference the chunked form is tested
 * against (tests/unit/test_recurrent.c). */
#include "cpu_impl.h"

#include "../../base/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DELTA_CHUNK 64 /* the chunk of torch_chunk_gated_delta_rule */
#define REC_MAX_DIM 256
#define SSD_MAX_CHUNK 256

float *cpu_scratch(struct cpu_backend *c, int64_t floats)
{
    if (floats > c->scratch_per_worker) {
        float *p = malloc((size_t)(floats * pool_n_threads(c->pool)) * sizeof(float));
        if (!p) {
            err_set("cpu: cannot allocate %lld floats of scratch", (long long)floats);
            return NULL;
        }
        free(c->scratch);
        c->scratch = p;
        c->scratch_per_worker = floats;
    }
    return c->scratch;
}

int cpu_group_rows(struct cpu_backend *c)
{
    const struct attn_batch *b = &c->b;
    const int32_t n = b->n_tokens;
    c->n_grp = 0;
    if (!b->seq_row) /* a batch for ops that need no sequences */
        return 0;
    if (n > c->cap_rows) {
        int32_t *s = realloc(c->grp_start, (size_t)(n + 1) * sizeof(int32_t));
        if (s)
            c->grp_start = s;
        int32_t *r = realloc(c->grp_rows, (size_t)n * sizeof(int32_t));
        if (r)
            c->grp_rows = r;
        if (!s || !r)
            return err_set("cpu: out of memory");
        c->cap_rows = n;
    }
    c->n_grp = backend_group_rows(b, c->grp_start, c->grp_rows);
    return 0;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- causal depthwise conv ---- */

struct conv_job {
    const struct attn_batch *b;
    struct tensor *out;
    const struct tensor *x, *w, *bias;
    struct tensor *state;
    int32_t K;
};

/* src[d] for d in [0, K): the input d steps back on token i's path, either a
 * batch row or an entry of its committed conv state. */
static void conv_taps(const struct conv_job *j, int32_t i, const float **src)
{
    const struct attn_batch *b = j->b;
    const int64_t C = j->x->n_cols;
    const float *st = f32_row(j->state, b->state_in[i]);
    int32_t r = i, d = 0;
    src[d++] = f32_row(j->x, i);
    while (d < j->K && b->parent[r] >= 0) {
        r = b->parent[r];
        src[d++] = f32_row(j->x, r);
    }
    for (int32_t e = j->K - 2; d < j->K; d++, e--)
        src[d] = st + (int64_t)e * C; /* entry K-2 is the newest committed input */
}

static void conv_task(void *ctx, int32_t i, int32_t worker)
{
    (void)worker;
    const struct conv_job *j = ctx;
    const int32_t K = j->K;
    const int64_t C = j->x->n_cols;
    const float *src[16];
    conv_taps(j, i, src);
    float *o = f32_row(j->out, i);
    for (int64_t c = 0; c < C; c++) {
        float acc = j->bias ? weight_at(j->bias, c) : 0.0f;
        for (int32_t d = 0; d < K; d++)
            acc += weight_at(j->w, c * K + (K - 1 - d)) * src[d][c];
        o[c] = acc / (1.0f + expf(-acc));
    }
    int32_t so = j->b->state_out[i];
    if (so >= 0) {
        float *st = f32_row(j->state, so);
        for (int32_t d = 0; d < K - 1; d++)
            memcpy(st + (int64_t)(K - 2 - d) * C, src[d], (size_t)C * sizeof(float));
    }
}

void cpu_conv1d(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w,
                const struct tensor *bias, struct tensor *state)
{
    struct cpu_backend *c = cpu_of(be);
    const int32_t K = (int32_t)w->n_cols;
    assert(K >= 2 && K <= 16 && w->n_rows == x->n_cols && state->n_cols == (K - 1) * x->n_cols);
    assert(out->data != x->data);
    struct conv_job j = {&c->b, out, x, w, bias && bias->data ? bias : NULL, state, K};
    pool_run(c->pool, conv_task, &j, c->b.n_tokens);
}

/* ---- a recurrence's rows ---- */

/* An op's two forms over one head's state S: chunked over a chain of n rows
 * from the committed state, and one row's step. */
struct rec_forms {
    void (*chunked)(const void *job, const int32_t *rows, int32_t n, int32_t h, float *S);
    void (*step)(const void *job, float *S, int32_t i, int32_t h);
};

/* Head h of a group's rows (states of sz floats at column h * sz of each
 * state row): a chain from the committed state in one chunked pass, else row
 * by row from each row's parent's state (or the committed one); the states
 * the batch asks for are kept. */
static void rec_rows(const struct attn_batch *b, struct tensor *state, const int32_t *rows, int32_t n, int32_t h,
                     int64_t sz, float *S, const struct rec_forms *f, const void *job)
{
    const int64_t off = (int64_t)h * sz;
    if (backend_rows_chain(b, rows, n) && n > 1) {
        memcpy(S, f32_row(state, b->state_in[rows[0]]) + off, (size_t)sz * sizeof(float));
        f->chunked(job, rows, n, h, S);
        if (b->state_out[rows[n - 1]] >= 0)
            memcpy(f32_row(state, b->state_out[rows[n - 1]]) + off, S, (size_t)sz * sizeof(float));
        return;
    }
    int32_t prev = -1;
    for (int32_t r = 0; r < n; r++) {
        const int32_t i = rows[r], p = b->parent[i];
        if (p < 0 || p != prev) {
            int32_t slot = p < 0 ? b->state_in[i] : b->state_out[p];
            assert(slot >= 0);
            memcpy(S, f32_row(state, slot) + off, (size_t)sz * sizeof(float));
        }
        f->step(job, S, i, h);
        if (b->state_out[i] >= 0)
            memcpy(f32_row(state, b->state_out[i]) + off, S, (size_t)sz * sizeof(float));
        prev = i;
    }
}

/* ---- gated delta rule ---- */

struct delta_job {
    struct cpu_backend *c;
    struct tensor *out;
    const struct tensor *q, *k, *v, *a, *b, *A_log, *dt_bias;
    struct tensor *state;
    int32_t Hk, Hv, dk, dv;
    float *scratch;
};

/* The per-token inputs of head h: normalised q (scaled) and k, v, decay g, beta. */
static void delta_inputs(const struct delta_job *j, int32_t i, int32_t h, float *q, float *k, const float **v,
                         float *g, float *beta)
{
    const int32_t kh = h / (j->Hv / j->Hk), dk = j->dk;
    const float *qr = f32_row(j->q, i) + (int64_t)kh * dk, *kr = f32_row(j->k, i) + (int64_t)kh * dk;
    float sq = 0, sk = 0;
    for (int32_t d = 0; d < dk; d++) {
        sq += qr[d] * qr[d];
        sk += kr[d] * kr[d];
    }
    const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f), scale = 1.0f / sqrtf((float)dk);
    for (int32_t d = 0; d < dk; d++) {
        q[d] = qr[d] * iq * scale;
        k[d] = kr[d] * ik;
    }
    *v = f32_row(j->v, i) + (int64_t)h * j->dv;
    float bb = f32_row(j->b, i)[h], aa = f32_row(j->a, i)[h];
    *beta = 1.0f / (1.0f + expf(-bb));
    *g = -expf(weight_at(j->A_log, h)) * softplus(aa + weight_at(j->dt_bias, h));
}

/* One recurrent step on S [dk][dv]; out [dv]. */
static void delta_step(const struct kern *kn, float *S, const float *q, const float *k, const float *v, float g,
                       float beta, int32_t dk, int32_t dv, float *out, float *tmp)
{
    const float decay = expf(g);
    memset(tmp, 0, (size_t)dv * sizeof(float));
    for (int32_t d = 0; d < dk; d++) {
        kn->scale(S + (int64_t)d * dv, decay, dv);
        kn->axpy(tmp, k[d], S + (int64_t)d * dv, dv);
    }
    for (int32_t e = 0; e < dv; e++)
        tmp[e] = (v[e] - tmp[e]) * beta;
    memset(out, 0, (size_t)dv * sizeof(float));
    for (int32_t d = 0; d < dk; d++) {
        kn->axpy(S + (int64_t)d * dv, k[d], tmp, dv);
        kn->axpy(out, q[d], S + (int64_t)d * dv, dv);
    }
}

/* out [n][os] = x [n][xs] . w [m][ws]^T over k inputs, in the kern's tiles */
static void rec_mm(const struct kern *kn, const float *x, int64_t xs, int32_t n, const float *w, int64_t ws, int64_t k,
                   float *out, int64_t os, int64_t m)
{
    for (int32_t t = 0; t < n; t += KERN_MAX_NX)
        kn->matmul_f32(x + (int64_t)t * xs, xs, n - t < KERN_MAX_NX ? n - t : KERN_MAX_NX, w, ws, k,
                       out + (int64_t)t * os, os, 0, m);
}

/* dst[c][r] = src[r][c] for r < rows, c < cols */
static void rec_transpose(float *dst, int64_t ds, const float *src, int64_t ss, int32_t rows, int32_t cols)
{
    for (int32_t r = 0; r < rows; r++)
        for (int32_t c = 0; c < cols; c++)
            dst[(int64_t)c * ds + r] = src[(int64_t)r * ss + c];
}

/* The chunked form over one chain of n rows, as torch_chunk_gated_delta_rule:
 * per chunk of L tokens, with gc the cumulative log decay inside the chunk,
 * T = (I + strictly_lower(beta_t k_t.k_s e^{gc_t-gc_s}))^-1,
 * u = T (beta v), w = T (beta k e^{gc}), v' = u - w S,
 * out_t = e^{gc_t} q_t S + sum_{s<=t} (q_t.k_s) e^{gc_t-gc_s} v'_s,
 * S = e^{gc_L} S + sum_s e^{gc_L-gc_s} k_s v'_s^T.
 * Each product runs in the kern's register tiles, over the state transposed
 * (st [dv][dk]) and the chunk's keys and values transposed where they are
 * a product's inner dimension; ws: delta_chunk_floats(dk, dv). */
static void delta_chunked(const struct delta_job *j, const int32_t *rows, int32_t n, int32_t h, float *S, float *ws)
{
    const struct kern *kn = j->c->k;
    const int32_t dk = j->dk, dv = j->dv, C = DELTA_CHUNK;
    float *st = ws, *tmp = st + (int64_t)dk * dv;                          /* [dv][dk] */
    float *q = tmp + (int64_t)dk * dv, *k = q + C * dk, *w = k + C * dk;  /* [C][dk] */
    float *kt = w + C * dk, *kdt = kt + dk * C;                           /* [dk][C] */
    float *vt = kdt + dk * C, *vpt = vt + dv * C;                         /* [dv][C] */
    float *u = vpt + dv * C, *o = u + C * dv, *o2 = o + C * dv;           /* [C][dv] */
    float *T = o2 + C * dv, *M = T + C * C, *P = M + C * C;               /* [C][C] */
    float gc[DELTA_CHUNK], beta[DELTA_CHUNK], eg[DELTA_CHUNK];
    rec_transpose(st, dk, S, dv, dk, dv);
    for (int32_t c0 = 0; c0 < n; c0 += C) {
        const int32_t L = n - c0 < C ? n - c0 : C;
        for (int32_t t = 0; t < L; t++) {
            const float *vr;
            float g;
            delta_inputs(j, rows[c0 + t], h, q + t * dk, k + t * dk, &vr, &g, &beta[t]);
            gc[t] = t ? gc[t - 1] + g : g;
            for (int32_t e = 0; e < dv; e++)
                vt[(int64_t)e * C + t] = vr[e];
        }
        /* T by forward substitution on A = -(beta_t k_t.k_s e^{gc_t-gc_s}), s < t */
        rec_mm(kn, k, dk, L, k, dk, dk, T, C, L);
        for (int32_t t = 0; t < L; t++) {
            float *Tt = T + t * C;
            for (int32_t s = 0; s < t; s++)
                Tt[s] = -beta[t] * Tt[s] * expf(gc[t] - gc[s]);
            float row[DELTA_CHUNK];
            memcpy(row, Tt, (size_t)t * sizeof(float));
            for (int32_t s = 0; s < t; s++) {
                float acc = row[s];
                for (int32_t m = s + 1; m < t; m++)
                    acc += row[m] * T[m * C + s];
                Tt[s] = acc;
            }
            Tt[t] = 1.0f;
        }
        /* u = (T beta) v and w = (T beta e^{gc}) k, then v' = u - w S (into u) */
        for (int32_t s = 0; s < L; s++)
            eg[s] = expf(gc[s]);
        for (int32_t t = 0; t < L; t++)
            for (int32_t s = 0; s < L; s++) {
                M[t * C + s] = s <= t ? T[t * C + s] * beta[s] : 0.0f;
                P[t * C + s] = M[t * C + s] * eg[s];
            }
        rec_transpose(kt, C, k, dk, L, dk);
        rec_mm(kn, M, C, L, vt, C, L, u, dv, dv);
        rec_mm(kn, P, C, L, kt, C, L, w, dk, dk);
        rec_mm(kn, w, dk, L, st, dk, dk, o, dv, dv);
        for (int32_t t = 0; t < L; t++)
            for (int32_t e = 0; e < dv; e++)
                u[t * dv + e] -= o[t * dv + e];
        rec_transpose(vpt, C, u, dv, L, dv);
        /* out_t = e^{gc_t} q_t S + sum_{s<=t} (q_t.k_s) e^{gc_t-gc_s} v'_s */
        rec_mm(kn, q, dk, L, st, dk, dk, o, dv, dv);
        rec_mm(kn, q, dk, L, k, dk, dk, P, C, L);
        for (int32_t t = 0; t < L; t++)
            for (int32_t s = 0; s < L; s++)
                P[t * C + s] = s <= t ? P[t * C + s] * expf(gc[t] - gc[s]) : 0.0f;
        rec_mm(kn, P, C, L, vpt, C, L, o2, dv, dv);
        for (int32_t t = 0; t < L; t++) {
            float *out = f32_row(j->out, rows[c0 + t]) + (int64_t)h * dv;
            for (int32_t e = 0; e < dv; e++)
                out[e] = o[t * dv + e] * eg[t] + o2[t * dv + e];
        }
        /* S = e^{gc_L} S + sum_s e^{gc_L-gc_s} k_s v'_s^T, transposed */
        const float gl = gc[L - 1], egl = expf(gl);
        for (int32_t s = 0; s < L; s++)
            eg[s] = expf(gl - gc[s]);
        for (int32_t d = 0; d < dk; d++)
            for (int32_t s = 0; s < L; s++)
                kdt[(int64_t)d * C + s] = kt[(int64_t)d * C + s] * eg[s];
        rec_mm(kn, vpt, C, dv, kdt, C, L, tmp, dk, dk);
        for (int64_t i = 0; i < (int64_t)dk * dv; i++)
            st[i] = st[i] * egl + tmp[i];
    }
    rec_transpose(S, dv, st, dk, dv, dk);
}

/* delta_chunked's scratch */
static int64_t delta_chunk_floats(int64_t dk, int64_t dv)
{
    const int64_t C = DELTA_CHUNK;
    return 2 * dk * dv + 3 * C * dk + 2 * dk * C + 2 * dv * C + 3 * C * dv + 3 * C * C;
}

/* rec_forms for the delta rule: the scratch past S (a state's dk * dv floats) holds q, k and tmp */
static void delta_chunked_form(const void *job, const int32_t *rows, int32_t n, int32_t h, float *S)
{
    const struct delta_job *j = job;
    delta_chunked(j, rows, n, h, S, S + (int64_t)j->dk * j->dv);
}

static void delta_step_form(const void *job, float *S, int32_t i, int32_t h)
{
    const struct delta_job *j = job;
    const int32_t dk = j->dk, dv = j->dv;
    float *q = S + (int64_t)dk * dv, *k = q + dk, *tmp = k + dk;
    const float *v;
    float gg, beta;
    delta_inputs(j, i, h, q, k, &v, &gg, &beta);
    delta_step(j->c->k, S, q, k, v, gg, beta, dk, dv, f32_row(j->out, i) + (int64_t)h * dv, tmp);
}

static void delta_task(void *ctx, int32_t task, int32_t worker)
{
    static const struct rec_forms forms = {delta_chunked_form, delta_step_form};
    const struct delta_job *j = ctx;
    const struct cpu_backend *c = j->c;
    const int32_t g = task / j->Hv, h = task % j->Hv;
    rec_rows(&c->b, j->state, c->grp_rows + c->grp_start[g], c->grp_start[g + 1] - c->grp_start[g], h,
             (int64_t)j->dk * j->dv, j->scratch + worker * c->scratch_per_worker, &forms, j);
}

void cpu_delta_rule(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *k,
                    const struct tensor *v, const struct tensor *a, const struct tensor *b, const struct tensor *A_log,
                    const struct tensor *dt_bias, struct tensor *state, int32_t n_k_head, int32_t n_v_head,
                    int32_t k_dim, int32_t v_dim)
{
    struct cpu_backend *c = cpu_of(be);
    assert(k_dim <= REC_MAX_DIM && v_dim <= REC_MAX_DIM && n_v_head % n_k_head == 0);
    assert(state->n_cols == (int64_t)n_v_head * k_dim * v_dim);
    /* a worker's state, then delta_chunked's scratch (which holds the step's q, k and tmp too) */
    float *scr = cpu_scratch(c, (int64_t)k_dim * v_dim + delta_chunk_floats(k_dim, v_dim));
    assert(scr); /* the first forward of a context sizes it; see model_scratch_init */
    struct delta_job j = {c, out, q, k, v, a, b, A_log, dt_bias, state, n_k_head, n_v_head, k_dim, v_dim, scr};
    pool_run(c->pool, delta_task, &j, c->n_grp * n_v_head);
}

/* ---- Mamba2 selective scan ---- */

struct ssd_job {
    struct cpu_backend *c;
    struct tensor *y;
    const struct tensor *x, *B, *C, *dt, *A_log, *D, *dt_bias;
    struct tensor *state;
    const struct ssd_params *p;
    float *scratch;
};

static float ssd_dt(const struct ssd_job *j, int32_t i, int32_t h)
{
    const struct ssd_params *p = j->p;
    float d = softplus(f32_row(j->dt, i)[h] + weight_at(j->dt_bias, h));
    float lo = p->dt_min > p->dt_lo ? p->dt_min : p->dt_lo;
    return d < lo ? lo : d > p->dt_hi ? p->dt_hi : d;
}

/* One recurrent step on S [P][N]. */
static void ssd_step(const struct ssd_job *j, float *S, int32_t i, int32_t h)
{
    const struct kern *kn = j->c->k;
    const struct ssd_params *p = j->p;
    const int32_t P = p->head_dim, N = p->d_state, g = h / (p->n_head / p->n_group);
    const float dt = ssd_dt(j, i, h), dA = expf(dt * -expf(weight_at(j->A_log, h))), Dh = weight_at(j->D, h);
    const float *x = f32_row(j->x, i) + (int64_t)h * P, *B = f32_row(j->B, i) + (int64_t)g * N,
                *C = f32_row(j->C, i) + (int64_t)g * N;
    float *y = f32_row(j->y, i) + (int64_t)h * P;
    for (int32_t a = 0; a < P; a++) {
        float *Sa = S + (int64_t)a * N;
        kn->scale(Sa, dA, N);
        kn->axpy(Sa, dt * x[a], B, N);
        y[a] = kn->dot(Sa, C, N) + Dh * x[a];
    }
}

/* The chunked form (SSD) over one chain, as the reference's prefill: with
 * Acum the cumulative dt*A inside a chunk,
 * y_t = sum_{s<=t} (C_t.B_s) e^{Acum_t-Acum_s} dt_s x_s + e^{Acum_t} S C_t + D x_t,
 * S = e^{Acum_L} S + sum_s e^{Acum_L-Acum_s} dt_s x_s B_s^T.
 * Each product runs in the kern's register tiles over the chunk's rows
 * gathered (x, B and C, and x and B transposed where they are a product's
 * inner dimension); ws: ssd_chunk_floats(p). */
static void ssd_chunked(const struct ssd_job *j, const int32_t *rows, int32_t n, int32_t h, float *S, float *ws)
{
    const struct kern *kn = j->c->k;
    const struct ssd_params *p = j->p;
    const int32_t P = p->head_dim, N = p->d_state, g = h / (p->n_head / p->n_group), CH = p->chunk;
    const float A = -expf(weight_at(j->A_log, h)), Dh = weight_at(j->D, h);
    float *b = ws, *c = b + (int64_t)CH * N, *bt = c + (int64_t)CH * N; /* [CH][N], [CH][N], [N][CH] */
    float *xt = bt + (int64_t)N * CH, *xdt = xt + (int64_t)P * CH;      /* [P][CH] */
    float *G = xdt + (int64_t)P * CH;                                    /* [CH][CH] */
    float *y1 = G + (int64_t)CH * CH, *y2 = y1 + (int64_t)CH * P;        /* [CH][P] */
    float *tmp = y2 + (int64_t)CH * P;                                   /* [P][N] */
    float acum[SSD_MAX_CHUNK], dts[SSD_MAX_CHUNK], dec[SSD_MAX_CHUNK];
    for (int32_t c0 = 0; c0 < n; c0 += CH) {
        const int32_t L = n - c0 < CH ? n - c0 : CH;
        for (int32_t t = 0; t < L; t++) {
            const int32_t i = rows[c0 + t];
            dts[t] = ssd_dt(j, i, h);
            acum[t] = (t ? acum[t - 1] : 0.0f) + dts[t] * A;
            memcpy(b + (int64_t)t * N, f32_row(j->B, i) + (int64_t)g * N, (size_t)N * sizeof(float));
            memcpy(c + (int64_t)t * N, f32_row(j->C, i) + (int64_t)g * N, (size_t)N * sizeof(float));
            const float *x = f32_row(j->x, i) + (int64_t)h * P;
            for (int32_t a = 0; a < P; a++)
                xt[(int64_t)a * CH + t] = x[a];
        }
        /* y = (C B^T, masked and decayed) x + e^{Acum} C S^T + D x */
        rec_mm(kn, c, N, L, b, N, N, G, CH, L);
        for (int32_t t = 0; t < L; t++)
            for (int32_t s = 0; s < L; s++)
                G[(int64_t)t * CH + s] = s <= t ? G[(int64_t)t * CH + s] * expf(acum[t] - acum[s]) * dts[s] : 0.0f;
        rec_mm(kn, G, CH, L, xt, CH, L, y2, P, P);
        rec_mm(kn, c, N, L, S, N, N, y1, P, P);
        for (int32_t t = 0; t < L; t++) {
            float *y = f32_row(j->y, rows[c0 + t]) + (int64_t)h * P;
            const float e = expf(acum[t]);
            for (int32_t a = 0; a < P; a++)
                y[a] = e * y1[(int64_t)t * P + a] + y2[(int64_t)t * P + a] + Dh * xt[(int64_t)a * CH + t];
        }
        /* S = e^{Acum_L} S + (x dt e^{Acum_L-Acum})^T B */
        const float al = acum[L - 1], el = expf(al);
        for (int32_t s = 0; s < L; s++)
            dec[s] = expf(al - acum[s]) * dts[s];
        for (int32_t a = 0; a < P; a++)
            for (int32_t s = 0; s < L; s++)
                xdt[(int64_t)a * CH + s] = xt[(int64_t)a * CH + s] * dec[s];
        rec_transpose(bt, CH, b, N, L, N);
        rec_mm(kn, xdt, CH, P, bt, CH, L, tmp, N, N);
        for (int64_t e = 0; e < (int64_t)P * N; e++)
            S[e] = S[e] * el + tmp[e];
    }
}

/* ssd_chunked's scratch */
static int64_t ssd_chunk_floats(const struct ssd_params *p)
{
    const int64_t CH = p->chunk, N = p->d_state, P = p->head_dim;
    return 3 * CH * N + 2 * P * CH + CH * CH + 2 * CH * P + P * N;
}

/* rec_forms for the scan: the scratch past S (a state's P * N floats) is ssd_chunked's */
static void ssd_chunked_form(const void *job, const int32_t *rows, int32_t n, int32_t h, float *S)
{
    const struct ssd_job *j = job;
    ssd_chunked(j, rows, n, h, S, S + (int64_t)j->p->head_dim * j->p->d_state);
}

static void ssd_step_form(const void *job, float *S, int32_t i, int32_t h) { ssd_step(job, S, i, h); }

static void ssd_task(void *ctx, int32_t task, int32_t worker)
{
    static const struct rec_forms forms = {ssd_chunked_form, ssd_step_form};
    const struct ssd_job *j = ctx;
    const struct cpu_backend *c = j->c;
    const int32_t H = j->p->n_head, g = task / H, h = task % H;
    rec_rows(&c->b, j->state, c->grp_rows + c->grp_start[g], c->grp_start[g + 1] - c->grp_start[g], h,
             (int64_t)j->p->head_dim * j->p->d_state, j->scratch + worker * c->scratch_per_worker, &forms, j);
}

void cpu_ssd(struct backend *be, struct tensor *y, const struct tensor *x, const struct tensor *B, const struct tensor *C,
             const struct tensor *dt, const struct tensor *A_log, const struct tensor *D, const struct tensor *dt_bias,
             struct tensor *state, const struct ssd_params *p)
{
    struct cpu_backend *c = cpu_of(be);
    assert(p->chunk >= 1 && p->chunk <= SSD_MAX_CHUNK && p->n_head % p->n_group == 0);
    assert(state->n_cols == (int64_t)p->n_head * p->head_dim * p->d_state);
    float *scr = cpu_scratch(c, (int64_t)p->head_dim * p->d_state + ssd_chunk_floats(p));
    assert(scr);
    struct ssd_job j = {c, y, x, B, C, dt, A_log, D, dt_bias, state, p, scr};
    pool_run(c->pool, ssd_task, &j, c->n_grp * p->n_head);
}
