/* bench_gemv: the decode products of a dense model on the cuda backend, in
 * isolation from the rest of a step: qwen3-8b's shapes by default (36 layers
 * of q/k/v, o, gate/up, down, then the LM head), each layer its own weights
 * so that nothing is served from L2 as it would not be in a real step. Each
 * kind of product runs over every layer in turn, `reps` times; the figure is
 * the wall time per product (launches queued back to back, as a decode step
 * queues them) and the weight bytes it read per second. "step" runs the four
 * kinds layer by layer in a step's order, plus the LM head: a decode step
 * without its attention, norms and sampling.
 *
 *   make CUDA=1 build/bench_gemv && build/bench_gemv [n_tokens] [reps]
 *
 * tools/device/read_bw.cu measures the read bandwidth the same GPU reaches
 * streaming one buffer, the ceiling these figures are compared against. */
#define _POSIX_C_SOURCE 199309L
#include "../src/backend/cuda/cuda.h"
#include "../src/base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { N_LAYER = 36, HIDDEN = 4096, Q_DIM = 4096, KV_DIM = 1024, INTER = 12288, VOCAB = 151936 };

struct layer {
    struct tensor q, k, v, o, gate, up, down;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int weight(struct backend *be, struct tensor *t, int64_t rows, int64_t cols, const uint16_t *host)
{
    if (be->ops->alloc(be, t, DT_BF16, rows, cols) != 0)
        return -1;
    be->ops->write(be, t, 0, rows, host);
    return 0;
}

/* an activation [n][cols], from host when not NULL */
static int act(struct backend *be, struct tensor *t, int64_t n, int64_t cols, const float *host)
{
    if (be->ops->alloc(be, t, DT_F32, n, cols) != 0)
        return -1;
    if (host)
        be->ops->write(be, t, 0, n, host);
    return 0;
}

struct bufs {
    struct tensor x, norm, qo, ko, vo, g, u, lm_out;
};

enum kind { QKV, O, GATE_UP, DOWN, LM_HEAD, N_KIND };
static const char *kind_name[N_KIND] = {"q/k/v", "o", "gate/up", "down", "lm head"};

static void product(struct backend *be, enum kind k, struct layer *l, struct tensor *lm, struct bufs *b)
{
    const struct mm_fused norm = {.pre = MM_PRE_RMSNORM, .norm = &b->norm, .eps = 1e-6f};
    const struct mm_fused resid = {.pre = MM_PRE_NONE, .accumulate = true};
    const struct mm_fused swiglu = {.pre = MM_PRE_SWIGLU, .up = &b->u, .accumulate = true};
    switch (k) {
    case QKV: {
        struct tensor *out[3] = {&b->qo, &b->ko, &b->vo};
        const struct tensor *w[3] = {&l->q, &l->k, &l->v};
        be->ops->matmul_fused(be, 3, out, w, &b->x, &norm);
        break;
    }
    case O: {
        struct tensor *out[1] = {&b->x};
        const struct tensor *w[1] = {&l->o};
        be->ops->matmul_fused(be, 1, out, w, &b->qo, &resid);
        break;
    }
    case GATE_UP: {
        struct tensor *out[2] = {&b->g, &b->u};
        const struct tensor *w[2] = {&l->gate, &l->up};
        be->ops->matmul_fused(be, 2, out, w, &b->x, &norm);
        break;
    }
    case DOWN: {
        struct tensor *out[1] = {&b->x};
        const struct tensor *w[1] = {&l->down};
        be->ops->matmul_fused(be, 1, out, w, &b->g, &swiglu);
        break;
    }
    case LM_HEAD: {
        struct tensor *out[1] = {&b->lm_out};
        const struct tensor *w[1] = {lm};
        be->ops->matmul_fused(be, 1, out, w, &b->x, &norm);
        break;
    }
    default: break;
    }
}

static double kind_bytes(enum kind k)
{
    const double e = 2.0; /* bf16 */
    switch (k) {
    case QKV: return e * (Q_DIM + 2.0 * KV_DIM) * HIDDEN;
    case O: return e * HIDDEN * Q_DIM;
    case GATE_UP: return e * 2.0 * INTER * HIDDEN;
    case DOWN: return e * HIDDEN * INTER;
    case LM_HEAD: return e * (double)VOCAB * HIDDEN;
    default: return 0.0;
    }
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 20;
    if (n < 1 || n > 64 || reps < 1) {
        fprintf(stderr, "usage: bench_gemv [n_tokens 1..64] [reps]\n");
        return 2;
    }
    struct backend *be = cuda_backend_init(0, false);
    if (!be) {
        fprintf(stderr, "bench_gemv: %s\n", err_msg());
        return 1;
    }
    /* weights: small random values (their size, not their values, sets the time) */
    const size_t big = (size_t)INTER * HIDDEN;
    uint16_t *hw = malloc(big * sizeof(uint16_t));
    float *hx = malloc((size_t)n * INTER * sizeof(float));
    if (!hw || !hx)
        return 1;
    uint64_t r = 1;
    for (size_t i = 0; i < big; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        hw[i] = f32_to_bf16(((float)(r >> 40) / (float)(1 << 24) - 0.5f) * 0.04f);
    }
    for (size_t i = 0; i < (size_t)n * INTER; i++)
        hx[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    static struct layer L[N_LAYER];
    struct tensor lm;
    struct bufs b;
    int rc = 0;
    for (int i = 0; i < N_LAYER && rc == 0; i++)
        rc = weight(be, &L[i].q, Q_DIM, HIDDEN, hw) | weight(be, &L[i].k, KV_DIM, HIDDEN, hw) |
             weight(be, &L[i].v, KV_DIM, HIDDEN, hw) | weight(be, &L[i].o, HIDDEN, Q_DIM, hw) |
             weight(be, &L[i].gate, INTER, HIDDEN, hw) | weight(be, &L[i].up, INTER, HIDDEN, hw) |
             weight(be, &L[i].down, HIDDEN, INTER, hw);
    if (rc == 0 && be->ops->alloc(be, &lm, DT_BF16, VOCAB, HIDDEN) == 0)
        for (int64_t r0 = 0; r0 < VOCAB; r0 += INTER) /* in pieces of the host buffer's rows */
            be->ops->write(be, &lm, r0, VOCAB - r0 < INTER ? VOCAB - r0 : INTER, hw);
    else
        rc = -1;
    rc = rc | act(be, &b.x, n, HIDDEN, hx) | act(be, &b.norm, 1, HIDDEN, hx) | act(be, &b.qo, n, Q_DIM, hx) |
         act(be, &b.ko, n, KV_DIM, hx) | act(be, &b.vo, n, KV_DIM, hx) | act(be, &b.g, n, INTER, hx) |
         act(be, &b.u, n, INTER, hx) | act(be, &b.lm_out, n, VOCAB, NULL);
    if (rc != 0) {
        fprintf(stderr, "bench_gemv: %s\n", err_msg());
        return 1;
    }
    printf("bench_gemv: qwen3-8b decode products, %d token%s, %d layers, %d reps\n", n, n == 1 ? "" : "s", N_LAYER,
           reps);
    double step_bytes = 0.0;
    for (int k = 0; k < N_KIND; k++) {
        const int per = k == LM_HEAD ? 1 : N_LAYER;
        step_bytes += per * kind_bytes(k);
        for (int i = 0; i < per; i++) /* warm: launch set-up, scratch */
            product(be, k, &L[i], &lm, &b);
        be->ops->sync(be);
        const double t0 = now_s();
        for (int rep = 0; rep < reps; rep++)
            for (int i = 0; i < per; i++)
                product(be, k, &L[i], &lm, &b);
        be->ops->sync(be);
        const double us = (now_s() - t0) * 1e6 / (reps * per);
        printf("%-8s %8.1f us  %6.1f MB  %5.2f TB/s\n", kind_name[k], us, kind_bytes(k) / 1e6,
               kind_bytes(k) / us / 1e6);
    }
    for (int i = 0; i < N_LAYER; i++)
        for (int k = 0; k < LM_HEAD; k++)
            product(be, k, &L[i], &lm, &b);
    be->ops->sync(be);
    const double t0 = now_s();
    for (int rep = 0; rep < reps; rep++) {
        for (int i = 0; i < N_LAYER; i++)
            for (int k = 0; k < LM_HEAD; k++)
                product(be, k, &L[i], &lm, &b);
        product(be, LM_HEAD, NULL, &lm, &b);
    }
    be->ops->sync(be);
    const double ms = (now_s() - t0) * 1e3 / reps;
    printf("step     %8.3f ms  %6.1f GB  %5.2f TB/s  (%.1f steps/s; %.1f at 4.8 TB/s)\n", ms, step_bytes / 1e9,
           step_bytes / ms / 1e9, 1e3 / ms, 4.8e12 / step_bytes);
    const int failed = be->ops->read(be, &b.x, 0, 1, hx) != 0;
    if (failed)
        fprintf(stderr, "bench_gemv: %s\n", err_msg());
    be->ops->free(be);
    free(hw);
    free(hx);
    return failed;
}
