#define _POSIX_C_SOURCE 200809L /* setenv */
/* Tests of the cuda backend against the cpu backend, op by op on random
 * shapes (normalised error: max |cuda - cpu| / max |cpu|), and at the model
 * level: a token verified inside a tree gets bitwise the logits it gets when
 * decoded alone. Without the cuda backend or a GPU each test says so and
 * passes; tests/cli.sh runs `kapitsa check --device cuda` on every fixture
 * when a GPU is present. */
#include "test.h"

#ifdef KAPITSA_CUDA
#include "../../src/backend/cpu/cpu.h"
#include "../../src/backend/cuda/cuda.h"
#include "../../src/base/err.h"
#include "../../src/engine/engine.h"
#include "../../src/quant/quant.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rndf(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1.0p-53 * 2 - 1);
}

struct both {
    struct backend *cpu, *gpu;
};

static int both_open(struct both *b, bool precise)
{
    b->cpu = b->gpu = NULL;
    if (cuda_device_count() == 0) {
        test_skip("no CUDA device");
        return -1;
    }
    b->cpu = cpu_backend_init(2, NULL);
    if (b->cpu) /* the exact products of block-type weights, the reference */
        cpu_backend_set_precise(b->cpu, true);
    b->gpu = cuda_backend_init(0, precise);
    CHECK(b->gpu != NULL, "%s", err_msg());
    return b->gpu ? 0 : -1;
}

static void both_close(struct both *b)
{
    if (b->cpu)
        b->cpu->ops->free(b->cpu);
    if (b->gpu)
        b->gpu->ops->free(b->gpu);
}

/* a tensor on each backend holding the same host data */
struct pair {
    struct tensor c, g;
    void *host;
};

static void pair_make(struct both *b, struct pair *p, enum dtype t, int64_t rows, int64_t cols, float scale)
{
    size_t n = (size_t)(rows * cols), es = dtype_size(t);
    p->host = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        float v = rndf() * scale;
        if (t == DT_F32)
            ((float *)p->host)[i] = v;
        else if (t == DT_BF16)
            ((uint16_t *)p->host)[i] = f32_to_bf16(v);
        else if (t == DT_F16)
            ((uint16_t *)p->host)[i] = f32_to_f16(v);
        else
            ((int32_t *)p->host)[i] = 0;
    }
    b->cpu->ops->alloc(b->cpu, &p->c, t, rows, cols);
    b->cpu->ops->write(b->cpu, &p->c, 0, rows, p->host);
    CHECK(b->gpu->ops->alloc(b->gpu, &p->g, t, rows, cols) == 0, "%s", err_msg());
    b->gpu->ops->write(b->gpu, &p->g, 0, rows, p->host);
}

/* the same host rows (in the pair's dtype) into rows [row0, row0+n) of both sides */
static void pair_write(struct both *b, struct pair *p, int64_t row0, int64_t n, const void *src)
{
    b->cpu->ops->write(b->cpu, &p->c, row0, n, src);
    b->gpu->ops->write(b->gpu, &p->g, row0, n, src);
}

static void pair_free(struct both *b, struct pair *p)
{
    b->cpu->ops->release(b->cpu, &p->c);
    b->gpu->ops->release(b->gpu, &p->g);
    free(p->host);
}

static double host_val(const void *h, enum dtype t, int64_t i)
{
    return t == DT_BF16 ? bf16_to_f32(((const uint16_t *)h)[i]) : ((const float *)h)[i];
}

/* max |gpu - cpu| / max |cpu| over an F32 or BF16 pair, over the rows keep
 * marks (NULL: every row) */
static double pair_err_rows(struct both *b, const struct pair *p, const bool *keep)
{
    const int64_t n = p->c.n_rows * p->c.n_cols;
    const enum dtype t = p->c.type;
    assert(t == DT_F32 || t == DT_BF16);
    void *x = malloc((size_t)n * dtype_size(t)), *y = malloc((size_t)n * dtype_size(t));
    b->cpu->ops->read(b->cpu, &p->c, 0, p->c.n_rows, x);
    b->gpu->ops->read(b->gpu, &p->g, 0, p->g.n_rows, y);
    double mx = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        if (keep && !keep[i / p->c.n_cols])
            continue;
        const double xv = host_val(x, t, i), yv = host_val(y, t, i);
        mx = fmax(mx, fabs(xv));
        d = fmax(d, fabs(xv - yv));
        if (isnan(yv) != isnan(xv))
            d = INFINITY;
    }
    free(x);
    free(y);
    return mx > 0 ? d / mx : d;
}

static double pair_err(struct both *b, const struct pair *p)
{
    return pair_err_rows(b, p, NULL);
}

static void set_batch_both(struct both *b, const struct attn_batch *ab)
{
    CHECK(b->cpu->ops->set_batch(b->cpu, ab) == 0, "cpu set_batch");
    CHECK(b->gpu->ops->set_batch(b->gpu, ab) == 0, "%s", err_msg());
}

/* whether two gpu tensors of the same shape hold the same bits */
static bool gpu_bits_equal(struct both *b, const struct tensor *x, const struct tensor *y)
{
    const size_t bytes = (size_t)(x->n_rows * x->n_cols) * dtype_size(x->type);
    void *y1 = malloc(bytes), *y2 = malloc(bytes);
    b->gpu->ops->read(b->gpu, x, 0, x->n_rows, y1);
    b->gpu->ops->read(b->gpu, y, 0, y->n_rows, y2);
    const bool same = memcmp(y1, y2, bytes) == 0;
    free(y1);
    free(y2);
    return same;
}

void test_cuda_matmul(void)
{
    struct both b;
    if (both_open(&b, true) != 0)
        return both_close(&b);
    const struct {
        int32_t n, K, M;
        enum dtype t;
    } cases[] = {
        {1, 64, 40, DT_BF16},    {3, 256, 300, DT_BF16},  {17, 1024, 777, DT_BF16}, {64, 512, 4096, DT_BF16},
        {1, 4096, 4096, DT_BF16}, {65, 512, 1000, DT_BF16}, {200, 96, 64, DT_BF16},  {7, 100, 50, DT_BF16},
        {5, 64, 96, DT_F16},     {70, 64, 33, DT_F16},    {9, 48, 20, DT_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct pair x, w, o;
        pair_make(&b, &x, DT_F32, cases[i].n, cases[i].K, 1.0f);
        pair_make(&b, &w, cases[i].t, cases[i].M, cases[i].K, 0.5f);
        pair_make(&b, &o, DT_F32, cases[i].n, cases[i].M, 0.0f);
        b.cpu->ops->matmul(b.cpu, &o.c, &x.c, &w.c);
        b.gpu->ops->matmul(b.gpu, &o.g, &x.g, &w.g);
        double e = pair_err(&b, &o);
        CHECK(e < 2e-5, "matmul n=%d K=%d M=%d %s: err %.3g", cases[i].n, cases[i].K, cases[i].M,
              dtype_name(cases[i].t), e);
        pair_free(&b, &x);
        pair_free(&b, &w);
        pair_free(&b, &o);
    }
    /* batch invariance: a row's result does not depend on the other rows (split-K engaged: few rows of blocks) */
    struct pair x, w, o1, o2;
    const int32_t K = 2048, M = 1536, n = 37, r = 20;
    pair_make(&b, &x, DT_F32, n, K, 1.0f);
    pair_make(&b, &w, DT_BF16, M, K, 0.5f);
    pair_make(&b, &o1, DT_F32, 1, M, 0.0f);
    pair_make(&b, &o2, DT_F32, n, M, 0.0f);
    struct tensor xr = tensor_rows(&x.g, r, 1);
    b.gpu->ops->matmul(b.gpu, &o1.g, &xr, &w.g);
    b.gpu->ops->matmul(b.gpu, &o2.g, &x.g, &w.g);
    float *y1 = malloc((size_t)M * 4), *y2 = malloc((size_t)M * 4);
    b.gpu->ops->read(b.gpu, &o1.g, 0, 1, y1);
    b.gpu->ops->read(b.gpu, &o2.g, r, 1, y2);
    CHECK(memcmp(y1, y2, (size_t)M * 4) == 0, "matmul: row %d alone differs from the same row in a batch of %d", r, n);
    free(y1);
    free(y2);
    pair_free(&b, &x);
    pair_free(&b, &w);
    pair_free(&b, &o1);
    pair_free(&b, &o2);
    both_close(&b);
    /* fast mode: bf16 activations in large products, within bf16 rounding */
    if (both_open(&b, false) != 0)
        return both_close(&b);
    pair_make(&b, &x, DT_F32, 300, 512, 1.0f);
    pair_make(&b, &w, DT_BF16, 256, 512, 0.5f);
    pair_make(&b, &o1, DT_F32, 300, 256, 0.0f);
    b.cpu->ops->matmul(b.cpu, &o1.c, &x.c, &w.c);
    b.gpu->ops->matmul(b.gpu, &o1.g, &x.g, &w.g);
    double e = pair_err(&b, &o1);
    CHECK(e < 1e-2 && e > 0, "fast matmul: err %.3g", e);
    pair_free(&b, &x);
    pair_free(&b, &w);
    pair_free(&b, &o1);
    both_close(&b);
}

/* a weight of block type t [M][K] on both backends: random values quantised */
static void pair_quant(struct both *b, struct pair *p, enum dtype t, int64_t M, int64_t K)
{
    float *f = malloc((size_t)(M * K) * 4);
    for (int64_t i = 0; i < M * K; i++)
        f[i] = rndf() * 0.5f;
    p->host = malloc(dtype_bytes(t, M * K));
    CHECK(quant_quantize(t, f, M * K, NULL, p->host) == 0, "%s", err_msg());
    free(f);
    const struct tensor h = {t, M, K, K, p->host, false};
    CHECK(b->cpu->ops->weight(b->cpu, &p->c, &h) == 0, "%s", err_msg());
    CHECK(b->gpu->ops->weight(b->gpu, &p->g, &h) == 0, "%s", err_msg());
}

/* Weights of GGUF's block types: for every type, decode-sized batches and
 * (precise) every batch multiply the same dequantised values in fp32 as the
 * cpu, to float rounding; fast prefill (more than CUDA_SMALL_N tokens) within
 * bf16 rounding. matmul_fused with an input op and the residual, the
 * embedding lookup (exact), and a row alone equal to it in a batch. */
void test_cuda_matmul_q(void)
{
    static const enum dtype types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0, DT_Q2_K, DT_Q3_K,
                                       DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_IQ4_NL, DT_IQ4_XS, DT_IQ2_XXS};
    const int32_t ns[] = {1, 2, 3, 8, 13, 64, 100};
    struct both b;
    for (int precise = 1; precise >= 0; precise--) {
        if (both_open(&b, precise) != 0)
            return both_close(&b);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const enum dtype t = types[ti];
            const int32_t K = ti % 2 ? 512 : 768, M = 77;
            struct pair w;
            pair_quant(&b, &w, t, M, K);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int32_t n = ns[ni];
                struct pair x, o;
                pair_make(&b, &x, DT_F32, n, K, 1.0f);
                pair_make(&b, &o, DT_F32, n, M, 0.0f);
                b.cpu->ops->matmul(b.cpu, &o.c, &x.c, &w.c);
                b.gpu->ops->matmul(b.gpu, &o.g, &x.g, &w.g);
                const double e = pair_err(&b, &o), tol = precise || n <= CUDA_SMALL_N ? 2e-5 : 1e-2;
                CHECK(e < tol, "matmul %s n=%d K=%d M=%d %s: err %.3g", dtype_name(t), n, K, M,
                      precise ? "precise" : "fast", e);
                pair_free(&b, &x);
                pair_free(&b, &o);
            }
            /* the embedding rows of a table of this type, exactly */
            int32_t tok[3] = {5, 0, 76};
            struct attn_batch ab = {.n_tokens = 3, .token = tok};
            set_batch_both(&b, &ab);
            struct pair o;
            pair_make(&b, &o, DT_F32, 3, K, 0.0f);
            b.cpu->ops->embed(b.cpu, &o.c, &w.c);
            b.gpu->ops->embed(b.gpu, &o.g, &w.g);
            CHECK(pair_err(&b, &o) == 0, "embed %s: err %.3g", dtype_name(t), pair_err(&b, &o));
            pair_free(&b, &o);
            pair_free(&b, &w);
        }
        /* fused: RMSNorm then q/k/v-like weights of mixed types; SwiGLU into a
         * down weight added to the residual */
        const int32_t K = 1024, n_f[] = {1, 7, 64, 100};
        for (size_t ni = 0; ni < sizeof n_f / sizeof n_f[0]; ni++) {
            const int32_t n = n_f[ni];
            struct pair x, up, norm, pb, ab, w[3], o[3];
            const enum dtype wt[3] = {DT_Q4_K, DT_Q6_K, DT_Q8_0};
            const int32_t Ms[3] = {256, 96, 96};
            pair_make(&b, &x, DT_F32, n, K, 2.0f);
            pair_make(&b, &up, DT_F32, n, K, 1.0f);
            pair_make(&b, &norm, DT_BF16, 1, K, 1.0f);
            pair_make(&b, &pb, DT_F32, n, K, 0.0f);
            pair_make(&b, &ab, DT_F32, n, 256, 0.0f);
            struct tensor *oc[3], *og[3];
            const struct tensor *wc[3], *wg[3];
            for (int i = 0; i < 3; i++) {
                pair_quant(&b, &w[i], wt[i], Ms[i], K);
                pair_make(&b, &o[i], DT_F32, n, Ms[i], 1.0f);
                oc[i] = &o[i].c, og[i] = &o[i].g, wc[i] = &w[i].c, wg[i] = &w[i].g;
            }
            for (int pass = 0; pass < 2; pass++) {
                const enum mm_pre pre = pass ? MM_PRE_SWIGLU : MM_PRE_RMSNORM;
                const int32_t n_w = pass ? 1 : 3;
                struct mm_fused fc = {pre, &norm.c, 1e-6f, &up.c, pass == 1, &pb.c, &ab.c};
                struct mm_fused fg = {pre, &norm.g, 1e-6f, &up.g, pass == 1, &pb.g, &ab.g};
                b.cpu->ops->matmul_fused(b.cpu, n_w, oc, wc, &x.c, &fc);
                b.gpu->ops->matmul_fused(b.gpu, n_w, og, wg, &x.g, &fg);
                for (int32_t i = 0; i < n_w; i++) {
                    const double e = pair_err(&b, &o[i]), tol = precise || n <= CUDA_SMALL_N ? 2e-5 : 1e-2;
                    CHECK(e < tol, "matmul_fused %s n=%d pre=%d weight %d: err %.3g", precise ? "precise" : "fast", n,
                          pre, i, e);
                }
            }
            for (int i = 0; i < 3; i++) {
                pair_free(&b, &w[i]);
                pair_free(&b, &o[i]);
            }
            pair_free(&b, &x);
            pair_free(&b, &up);
            pair_free(&b, &norm);
            pair_free(&b, &pb);
            pair_free(&b, &ab);
        }
        /* a token's bits alone and inside batches of every tile width */
        struct pair x, w, o1, o2;
        const int32_t M = 300, r = 1;
        pair_make(&b, &x, DT_F32, CUDA_SMALL_N, K, 1.0f);
        pair_quant(&b, &w, DT_Q4_K, M, K);
        pair_make(&b, &o1, DT_F32, 1, M, 0.0f);
        pair_make(&b, &o2, DT_F32, CUDA_SMALL_N, M, 0.0f);
        struct tensor xr = tensor_rows(&x.g, r, 1);
        b.gpu->ops->matmul(b.gpu, &o1.g, &xr, &w.g);
        float *y1 = malloc((size_t)M * 4), *y2 = malloc((size_t)M * 4);
        b.gpu->ops->read(b.gpu, &o1.g, 0, 1, y1);
        const int32_t nb[] = {2, 4, 8, 13, CUDA_SMALL_N};
        for (size_t i = 0; i < sizeof nb / sizeof nb[0]; i++) {
            struct tensor xn = tensor_rows(&x.g, 0, nb[i]), on = tensor_rows(&o2.g, 0, nb[i]);
            b.gpu->ops->matmul(b.gpu, &on, &xn, &w.g);
            b.gpu->ops->read(b.gpu, &o2.g, r, 1, y2);
            CHECK(memcmp(y1, y2, (size_t)M * 4) == 0, "matmul Q4_K: row %d alone differs from it in a batch of %d", r,
                  nb[i]);
        }
        free(y1);
        free(y2);
        pair_free(&b, &x);
        pair_free(&b, &w);
        pair_free(&b, &o1);
        pair_free(&b, &o2);
        both_close(&b);
    }
}

/* matmul_fused: every input op, with and without the residual add, one to
 * three weights, in one launch (n <= 64) and as one pre kernel and a GEMM
 * per weight (n > 64); then a row's fused result alone equals it inside a
 * batch, bitwise, for each kernel variant (1, 2, 4 and 8 token tiles). */
void test_cuda_matmul_fused(void)
{
    struct both b;
    if (both_open(&b, true) != 0)
        return both_close(&b);
    const int32_t ns[] = {1, 5, 13, 64, 100}, Ms[MM_MAX_W] = {512, 128, 300, 32};
    const int32_t K = 1024;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int pre = MM_PRE_NONE; pre <= MM_PRE_RELU2; pre++)
            for (int accumulate = 0; accumulate < 2; accumulate++) {
                const int32_t n = ns[ni], n_w = 1 + (pre + accumulate) % MM_MAX_W;
                struct pair x, up, norm, pb, ab, w[MM_MAX_W], o[MM_MAX_W];
                pair_make(&b, &x, DT_F32, n, K, 2.0f);
                pair_make(&b, &up, DT_F32, n, K, 1.0f);
                pair_make(&b, &norm, DT_BF16, 1, K, 1.0f);
                pair_make(&b, &pb, DT_F32, n, K, 0.0f);
                pair_make(&b, &ab, DT_F32, n, Ms[0], 0.0f);
                struct tensor *oc[MM_MAX_W], *og[MM_MAX_W];
                const struct tensor *wc[MM_MAX_W], *wg[MM_MAX_W];
                for (int32_t i = 0; i < n_w; i++) {
                    pair_make(&b, &w[i], DT_BF16, Ms[i], K, 0.5f);
                    pair_make(&b, &o[i], DT_F32, n, Ms[i], 1.0f);
                    oc[i] = &o[i].c, og[i] = &o[i].g, wc[i] = &w[i].c, wg[i] = &w[i].g;
                }
                const bool in_place = pre == MM_PRE_RELU2; /* relu^2 runs on x itself */
                struct mm_fused fc = {(enum mm_pre)pre, &norm.c, 1e-6f, &up.c, accumulate, in_place ? &x.c : &pb.c, &ab.c};
                struct mm_fused fg = {(enum mm_pre)pre, &norm.g, 1e-6f, &up.g, accumulate, in_place ? &x.g : &pb.g, &ab.g};
                b.cpu->ops->matmul_fused(b.cpu, n_w, oc, wc, &x.c, &fc);
                b.gpu->ops->matmul_fused(b.gpu, n_w, og, wg, &x.g, &fg);
                for (int32_t i = 0; i < n_w; i++) {
                    double e = pair_err(&b, &o[i]);
                    CHECK(e < 2e-5, "matmul_fused n=%d pre=%d accumulate=%d weight %d of %d: err %.3g", n, pre,
                          accumulate, i, n_w, e);
                    pair_free(&b, &w[i]);
                    pair_free(&b, &o[i]);
                }
                pair_free(&b, &x);
                pair_free(&b, &up);
                pair_free(&b, &norm);
                pair_free(&b, &pb);
                pair_free(&b, &ab);
            }
    /* a K split across blocks (their sums of squares added by the last; a
     * lone token's by the warps of one block), rows enough for whole waves
     * with K whole (each block's own sums), and more units than a wave (a
     * block taking several in turn, its slice staged once); precise, then
     * fast (bf16 activations, within their rounding of the cpu) */
    const int32_t inv_M[] = {Ms[0], 32768, 40960}, inv_K[] = {K, 256, 1024};
    const int n_inv = (int)(sizeof inv_M / sizeof inv_M[0]);
    for (int sh = 0; sh < 2 * n_inv; sh++) {
        if (sh == n_inv) {
            both_close(&b);
            if (both_open(&b, false) != 0)
                return both_close(&b);
        }
        const int32_t M = inv_M[sh % n_inv], Ki = inv_K[sh % n_inv], n_max = 64, r = 3;
        struct pair x, norm, w, o1, o2;
        pair_make(&b, &x, DT_F32, n_max, Ki, 1.0f);
        pair_make(&b, &norm, DT_BF16, 1, Ki, 1.0f);
        pair_make(&b, &w, DT_BF16, M, Ki, 0.5f);
        pair_make(&b, &o1, DT_F32, 1, M, 0.0f);
        pair_make(&b, &o2, DT_F32, n_max, M, 0.0f);
        const struct mm_fused f = {MM_PRE_RMSNORM, &norm.g, 1e-6f, NULL, false, NULL, NULL};
        struct tensor xr = tensor_rows(&x.g, r, 1), *o1g = &o1.g;
        const struct tensor *wg = &w.g;
        float *y1 = malloc((size_t)M * 4), *y2 = malloc((size_t)M * 4);
        b.gpu->ops->matmul_fused(b.gpu, 1, &o1g, &wg, &xr, &f);
        b.gpu->ops->read(b.gpu, &o1.g, 0, 1, y1);
        const int32_t nb[] = {4, 8, 13, 21, 64};
        for (size_t i = 0; i < sizeof nb / sizeof nb[0]; i++) {
            struct tensor xn = tensor_rows(&x.g, 0, nb[i]), on = tensor_rows(&o2.g, 0, nb[i]), *ong = &on;
            b.gpu->ops->matmul_fused(b.gpu, 1, &ong, &wg, &xn, &f);
            b.gpu->ops->read(b.gpu, &o2.g, r, 1, y2);
            CHECK(memcmp(y1, y2, (size_t)M * 4) == 0, "matmul_fused [%d x %d]: row %d alone differs from it in a batch of %d",
                  M, Ki, r, nb[i]);
        }
        if (sh >= n_inv) {
            /* the cpu normalises into x's own copy, not read again */
            const struct mm_fused fc = {MM_PRE_RMSNORM, &norm.c, 1e-6f, NULL, false, &x.c, NULL};
            struct tensor *o2c = &o2.c;
            const struct tensor *wc = &w.c;
            b.cpu->ops->matmul_fused(b.cpu, 1, &o2c, &wc, &x.c, &fc);
            const double e = pair_err(&b, &o2);
            CHECK(e < 1e-2 && e > 1e-6, "fast matmul_fused [%d x %d]: err %.3g", M, Ki, e);
        }
        free(y1);
        free(y2);
        pair_free(&b, &x);
        pair_free(&b, &norm);
        pair_free(&b, &w);
        pair_free(&b, &o1);
        pair_free(&b, &o2);
    }
    both_close(&b);
}

/* kv_store and attention on both backends over the batch ab, with random q,
 * k, v and caches of cache_rows + spare rows (of type att_kv): the output's
 * normalised difference, and the caches' in *cache_err. With spare rows,
 * *resized: whether the gpu's output differs (bitwise) when the same caches
 * are cut to their first cache_rows rows. */
static enum dtype att_kv = DT_F32;

/* an attention case's caches (rows random), queries, new keys and values of
 * the batch, and output, on both backends */
struct att_pairs {
    struct pair kc, vc, q, k, v, out;
};

/* makes the pairs, stores the batch's keys and values and runs attention on both backends */
static void att_pairs_run(struct both *b, struct att_pairs *p, const struct attn_batch *ab, int64_t cache_rows,
                          int32_t n_head, int32_t n_kv, int32_t hd, float scale)
{
    const int32_t n = ab->n_tokens;
    pair_make(b, &p->kc, att_kv, cache_rows, n_kv * hd, 1.0f);
    pair_make(b, &p->vc, att_kv, cache_rows, n_kv * hd, 1.0f);
    pair_make(b, &p->q, DT_F32, n, n_head * hd, 2.0f);
    pair_make(b, &p->k, DT_F32, n, n_kv * hd, 2.0f);
    pair_make(b, &p->v, DT_F32, n, n_kv * hd, 1.0f);
    pair_make(b, &p->out, DT_F32, n, n_head * hd, 0.0f);
    set_batch_both(b, ab);
    b->cpu->ops->kv_store(b->cpu, &p->kc.c, &p->vc.c, &p->k.c, &p->v.c);
    b->gpu->ops->kv_store(b->gpu, &p->kc.g, &p->vc.g, &p->k.g, &p->v.g);
    b->cpu->ops->attention(b->cpu, &p->out.c, &p->q.c, &p->kc.c, &p->vc.c, n_head, n_kv, hd, scale);
    b->gpu->ops->attention(b->gpu, &p->out.g, &p->q.g, &p->kc.g, &p->vc.g, n_head, n_kv, hd, scale);
}

static void att_pairs_free(struct both *b, struct att_pairs *p)
{
    struct pair *all[] = {&p->kc, &p->vc, &p->q, &p->k, &p->v, &p->out};
    for (int i = 0; i < 6; i++)
        pair_free(b, all[i]);
}

static double att_compare(struct both *b, const struct attn_batch *ab, int64_t cache_rows, int64_t spare,
                          int32_t n_head, int32_t n_kv, int32_t hd, float scale, double *cache_err, bool *resized)
{
    const int32_t n = ab->n_tokens;
    struct att_pairs p;
    att_pairs_run(b, &p, ab, cache_rows + spare, n_head, n_kv, hd, scale);
    const double e = pair_err(b, &p.out);
    *cache_err = pair_err(b, &p.kc);
    if (spare > 0) {
        struct tensor out2;
        const struct tensor kcut = tensor_rows(&p.kc.g, 0, cache_rows), vcut = tensor_rows(&p.vc.g, 0, cache_rows);
        CHECK(b->gpu->ops->alloc(b->gpu, &out2, DT_F32, n, n_head * hd) == 0, "%s", err_msg());
        b->gpu->ops->attention(b->gpu, &out2, &p.q.g, &kcut, &vcut, n_head, n_kv, hd, scale);
        *resized = !gpu_bits_equal(b, &p.out.g, &out2);
        b->gpu->ops->release(b->gpu, &out2);
    }
    att_pairs_free(b, &p);
    return e;
}

/* Two sequences in scattered cache blocks: seq 0 has len0 cached tokens and a
 * tree of 5 batch tokens, seq 1 has 3 cached and a chain of 2; the caches
 * spare rows larger than they need to be (see att_compare). */
static void attention_case(struct both *b, int32_t len0, int32_t n_head, int32_t n_kv, int32_t hd, int64_t spare,
                           double tol)
{
    const int32_t bs = 16, n = 7, max_blocks = (len0 + 8) / bs + 1, n_blocks = max_blocks + 2;
    int32_t *table = calloc((size_t)2 * max_blocks, sizeof(int32_t));
    for (int32_t i = 0; i < max_blocks; i++)
        table[i] = max_blocks - 1 - i; /* reversed */
    table[max_blocks] = max_blocks;
    int32_t len[2] = {len0, 3}, seq[7] = {0, 0, 0, 1, 0, 0, 1}, idx[7] = {0, 1, 2, 0, 3, 4, 1};
    int32_t parent[7] = {-1, 0, 0, -1, 1, 2, 3};
    int32_t slot[7], n_kvv[7], mfrom[7], pos[7];
    uint8_t mask[7][7] = {{0}};
    for (int32_t i = 0; i < n; i++) {
        int32_t p = len[seq[i]] + idx[i];
        slot[i] = table[seq[i] * max_blocks + p / bs] * bs + p % bs;
        n_kvv[i] = p + 1;
        mfrom[i] = len[seq[i]];
        pos[i] = p;
        for (int32_t a = i; a >= 0; a = parent[a])
            mask[i][idx[a]] = 1;
    }
    struct attn_batch ab = {.n_tokens = n, .pos = pos, .slot = slot, .seq_row = seq, .n_kv = n_kvv,
                            .mask_from = mfrom, .mask = &mask[0][0], .mask_stride = 7, .block_table = table,
                            .n_seq_rows = 2, .max_blocks = max_blocks, .block_size = bs, .parent = parent};
    double ek;
    bool resized = false;
    const double e = att_compare(b, &ab, (int64_t)n_blocks * bs, spare, n_head, n_kv, hd, 0.25f, &ek, &resized);
    CHECK(e < tol && ek == 0, "attention len %d heads %d/%d hd %d: err %.3g (bound %.3g), cache %.3g", len0, n_head,
          n_kv, hd, e, tol, ek);
    CHECK(!resized, "attention len %d: the output changes with the cache's size", len0);
    free(table);
}

/* The new keys' product, attn_prep, then attention, as a decoding step runs
 * them: n_seq sequences of len0 cached tokens (bf16 cache) decode a token
 * each. The rows the step stores hold a sentinel before it (values 30 times
 * the others'), so a kernel that took them before attn_prep's stores gave
 * out the sentinel's values: k_att_decode_tc loads a small batch's old rows
 * before its wait, and attn_prep lets it start at once. The product (128
 * MB of weights, tens of µs) lets attn_prep start early and wait, as the
 * q/k/v product does in a forward, so attention's blocks start long before
 * the stores. */
static void prep_attention_case(struct both *b, int32_t n_seq, int32_t len0, double tol)
{
    const int32_t n_head = 32, n_kv = 8, hd = 128, bs = 16, max_blocks = len0 / bs + 1;
    const int64_t rows = (int64_t)n_seq * max_blocks * bs;
    int32_t *table = malloc((size_t)n_seq * max_blocks * sizeof(int32_t));
    int32_t slot[8], n_kvv[8], mfrom[8], pos[8], seq[8];
    assert(n_seq <= 8);
    for (int32_t i = 0; i < n_seq * max_blocks; i++)
        table[i] = n_seq * max_blocks - 1 - i; /* reversed */
    for (int32_t i = 0; i < n_seq; i++) {
        seq[i] = i;
        pos[i] = len0;
        n_kvv[i] = mfrom[i] = len0 + 1;
        slot[i] = table[i * max_blocks + len0 / bs] * bs + len0 % bs;
    }
    struct attn_batch ab = {.n_tokens = n_seq, .pos = pos, .slot = slot, .seq_row = seq, .n_kv = n_kvv,
                            .mask_from = mfrom, .block_table = table, .n_seq_rows = n_seq,
                            .max_blocks = max_blocks, .block_size = bs};
    set_batch_both(b, &ab);
    struct pair kc, vc, q, x, w, k, v, qn, kn, f, out;
    pair_make(b, &kc, DT_BF16, rows, n_kv * hd, 1.0f);
    pair_make(b, &vc, DT_BF16, rows, n_kv * hd, 1.0f);
    uint16_t *sent = malloc((size_t)n_kv * hd * sizeof(uint16_t));
    for (int32_t c = 0; c < n_kv * hd; c++)
        sent[c] = f32_to_bf16(30.0f);
    for (int32_t i = 0; i < n_seq; i++) {
        pair_write(b, &kc, slot[i], 1, sent);
        pair_write(b, &vc, slot[i], 1, sent);
    }
    pair_make(b, &q, DT_F32, n_seq, n_head * hd, 2.0f);
    const int32_t K = 65536;
    pair_make(b, &x, DT_F32, n_seq, K, 1.0f);
    pair_make(b, &w, DT_BF16, n_kv * hd, K, 0.01f);
    pair_make(b, &k, DT_F32, n_seq, n_kv * hd, 0.0f);
    pair_make(b, &v, DT_F32, n_seq, n_kv * hd, 1.0f);
    pair_make(b, &qn, DT_BF16, 1, hd, 1.0f);
    pair_make(b, &kn, DT_BF16, 1, hd, 1.0f);
    pair_make(b, &out, DT_F32, n_seq, n_head * hd, 0.0f);
    float inv[64];
    for (int i = 0; i < 64; i++)
        inv[i] = powf(10000.0f, -(float)i / 64);
    pair_make(b, &f, DT_F32, 1, 64, 0.0f);
    pair_write(b, &f, 0, 1, inv);
    const struct attn_prep pc = {&qn.c, &kn.c, 1e-6f, n_head, n_kv, hd, hd, &f.c, 1.0f};
    const struct attn_prep pg = {&qn.g, &kn.g, 1e-6f, n_head, n_kv, hd, hd, &f.g, 1.0f};
    /* the device's three back to back, queued while its product runs */
    b->gpu->ops->matmul(b->gpu, &k.g, &x.g, &w.g);
    b->gpu->ops->attn_prep(b->gpu, &q.g, &k.g, &v.g, &kc.g, &vc.g, &pg);
    b->gpu->ops->attention(b->gpu, &out.g, &q.g, &kc.g, &vc.g, n_head, n_kv, hd, 0.0884f);
    b->cpu->ops->matmul(b->cpu, &k.c, &x.c, &w.c);
    b->cpu->ops->attn_prep(b->cpu, &q.c, &k.c, &v.c, &kc.c, &vc.c, &pc);
    b->cpu->ops->attention(b->cpu, &out.c, &q.c, &kc.c, &vc.c, n_head, n_kv, hd, 0.0884f);
    const double e = pair_err(b, &out);
    CHECK(e < tol, "attn_prep then attention, %d sequences of %d: err %.3g (bound %.3g)", n_seq, len0, e, tol);
    struct pair *all[] = {&kc, &vc, &q, &x, &w, &k, &v, &qn, &kn, &f, &out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(b, all[i]);
    free(sent);
    free(table);
}

/* A prefill batch: seq 0 has len0 cached tokens and n0 new rows, seq 1 none
 * cached and n1 new rows, no mask: the tensor-core kernels a row tile (up to
 * 64 rows of one sequence) at a time, except head dim 256 in precise mode
 * (the CUDA-core kernel). */
static void prefill_case(struct both *b, int32_t len0, int32_t n0, int32_t n1, int32_t n_head, int32_t n_kv,
                         int32_t hd, double tol)
{
    const int32_t bs = 16, n = n0 + n1, max_blocks = (len0 + n0) / bs + 1, n_blocks = 2 * max_blocks;
    int32_t *table = calloc((size_t)2 * max_blocks, sizeof(int32_t));
    int32_t *pos = calloc((size_t)n, sizeof(int32_t)), *slot = calloc((size_t)n, sizeof(int32_t));
    int32_t *seq = calloc((size_t)n, sizeof(int32_t)), *n_kvv = calloc((size_t)n, sizeof(int32_t));
    for (int32_t i = 0; i < 2 * max_blocks; i++)
        table[i] = (i * 7 + 3) % n_blocks; /* scattered: 7 is prime to n_blocks unless it divides it */
    if (n_blocks % 7 == 0)
        for (int32_t i = 0; i < 2 * max_blocks; i++)
            table[i] = 2 * max_blocks - 1 - i;
    for (int32_t i = 0; i < n; i++) {
        seq[i] = i >= n0;
        pos[i] = seq[i] ? i - n0 : len0 + i;
        slot[i] = table[seq[i] * max_blocks + pos[i] / bs] * bs + pos[i] % bs;
        n_kvv[i] = pos[i] + 1;
    }
    struct attn_batch ab = {.n_tokens = n, .pos = pos, .slot = slot, .seq_row = seq, .n_kv = n_kvv,
                            .mask_from = n_kvv, .block_table = table, .n_seq_rows = 2, .max_blocks = max_blocks,
                            .block_size = bs};
    double ek;
    const double e = att_compare(b, &ab, (int64_t)n_blocks * bs, 0, n_head, n_kv, hd, 0.125f, &ek, NULL);
    CHECK(e < tol && ek == 0, "prefill attention cached %d rows %d+%d heads %d/%d hd %d: err %.3g (bound %.3g), cache %.3g",
          len0, n0, n1, n_head, n_kv, hd, e, tol, ek);
    free(table);
    free(pos);
    free(slot);
    free(seq);
    free(n_kvv);
}

/* A large batch as the server makes it: n_dec requests decoding (a token
 * each, contexts of len_dec + 37 r keys) first, then n1 rows of a prompt
 * with len0 cached. Against the cpu within tol; and each decoding row's
 * output bitwise what the gpu gives it in a batch of the decoding rows
 * alone (decode attention either way, not a prompt's row tiles). */
static void mixed_case(struct both *b, int32_t n_dec, int32_t len_dec, int32_t len0, int32_t n1, int32_t n_head,
                       int32_t n_kv, int32_t hd, double tol)
{
    const int32_t bs = 16, n = n_dec + n1, n_rows = n_dec + 1;
    const int32_t max_blocks = ((len_dec + 37 * n_dec > len0 + n1 ? len_dec + 37 * n_dec : len0 + n1) + 1) / bs + 1;
    const int32_t n_blocks = n_rows * max_blocks;
    int32_t *table = calloc((size_t)n_blocks, sizeof(int32_t)), *pos = calloc((size_t)n, sizeof(int32_t));
    int32_t *slot = calloc((size_t)n, sizeof(int32_t)), *seq = calloc((size_t)n, sizeof(int32_t));
    int32_t *n_kvv = calloc((size_t)n, sizeof(int32_t));
    for (int32_t i = 0; i < n_blocks; i++)
        table[i] = n_blocks - 1 - i;
    for (int32_t i = 0; i < n; i++) {
        seq[i] = i < n_dec ? i : n_dec;
        pos[i] = i < n_dec ? len_dec + 37 * i : len0 + i - n_dec;
        slot[i] = table[seq[i] * max_blocks + pos[i] / bs] * bs + pos[i] % bs;
        n_kvv[i] = pos[i] + 1;
    }
    struct attn_batch ab = {.n_tokens = n, .pos = pos, .slot = slot, .seq_row = seq, .n_kv = n_kvv,
                            .mask_from = n_kvv, .block_table = table, .n_seq_rows = n_rows,
                            .max_blocks = max_blocks, .block_size = bs};
    struct att_pairs p;
    att_pairs_run(b, &p, &ab, (int64_t)n_blocks * bs, n_head, n_kv, hd, 0.125f);
    const double e = pair_err(b, &p.out);
    CHECK(e < tol, "mixed batch, %d decoding beside %d prompt rows, heads %d/%d hd %d: err %.3g (bound %.3g)", n_dec,
          n1, n_head, n_kv, hd, e, tol);
    /* the decoding rows alone: the same cache, their queries */
    struct attn_batch da = ab;
    da.n_tokens = n_dec;
    set_batch_both(b, &da);
    struct tensor o2, qd = tensor_rows(&p.q.g, 0, n_dec);
    CHECK(b->gpu->ops->alloc(b->gpu, &o2, DT_F32, n_dec, n_head * hd) == 0, "%s", err_msg());
    b->gpu->ops->attention(b->gpu, &o2, &qd, &p.kc.g, &p.vc.g, n_head, n_kv, hd, 0.125f);
    const struct tensor od = tensor_rows(&p.out.g, 0, n_dec);
    CHECK(gpu_bits_equal(b, &od, &o2), "mixed batch hd %d: a decoding row's output depends on the prompt beside it", hd);
    b->gpu->ops->release(b->gpu, &o2);
    att_pairs_free(b, &p);
    free(table);
    free(pos);
    free(slot);
    free(seq);
    free(n_kvv);
}

void test_cuda_attention(void)
{
    struct both b;
    if (both_open(&b, true) != 0)
        return both_close(&b);
    attention_case(&b, 9, 6, 2, 20, 0, 1e-5);
    attention_case(&b, 300, 8, 2, 32, 0, 1e-5);
    attention_case(&b, 5000, 32, 8, 128, 0, 1e-5); /* several splits */
    attention_case(&b, 700, 16, 1, 256, 0, 1e-5);
    attention_case(&b, 100, 40, 8, 16, 0, 1e-5);
    attention_case(&b, 2000, 16, 4, 64, 0, 1e-5);
    attention_case(&b, 2000, 16, 4, 64, 60000, 1e-5); /* a cache 30 times larger than the context */
    prefill_case(&b, 300, 128, 101, 32, 8, 128, 2e-5); /* tensor cores, split operands */
    prefill_case(&b, 0, 192, 64, 8, 2, 64, 2e-5);
    prefill_case(&b, 40, 64, 70, 4, 2, 32, 2e-5);
    prefill_case(&b, 5, 96, 37, 6, 2, 64, 2e-5);       /* groups of 3 heads */
    prefill_case(&b, 0, 128, 20, 4, 4, 32, 2e-5);      /* no grouping: 64 rows a block */
    prefill_case(&b, 64, 96, 33, 16, 2, 128, 2e-5);    /* groups of 8: 16 rows a block */
    prefill_case(&b, 17, 100, 80, 8, 2, 128, 2e-5);    /* a sequence's rows in tiles of 64 and 36 */
    prefill_case(&b, 500, 1, 200, 32, 8, 128, 2e-5);   /* one decoded row before a prompt's (a tile of 1) */
    prefill_case(&b, 40, 64, 70, 8, 2, 256, 2e-5);     /* head dim 256, precise: CUDA cores */
    mixed_case(&b, 4, 3000, 100, 200, 32, 8, 128, 2e-5);
    mixed_case(&b, 70, 40, 0, 30, 16, 4, 64, 2e-5);    /* more decoding rows than a decode batch: one range each */
    /* a bf16 cache: both backends store the same rounded rows and read them exactly */
    att_kv = DT_BF16;
    attention_case(&b, 9, 6, 2, 20, 0, 1e-5);
    attention_case(&b, 300, 8, 2, 32, 0, 1e-5);
    attention_case(&b, 2000, 16, 4, 64, 0, 1e-5);
    attention_case(&b, 5000, 32, 8, 128, 0, 1e-5);
    attention_case(&b, 700, 16, 1, 256, 0, 1e-5);
    prefill_case(&b, 300, 128, 101, 32, 8, 128, 2e-5);
    prefill_case(&b, 17, 100, 80, 8, 2, 128, 2e-5);
    prefill_case(&b, 40, 64, 70, 8, 2, 256, 2e-5);
    mixed_case(&b, 4, 3000, 100, 200, 32, 8, 128, 2e-5);
    att_kv = DT_F32;
    both_close(&b);
    /* fast mode: bf16 operands on the tensor cores, within bf16 rounding. On
     * a device of compute capability 9.0, head dims 64, 128 and 256 take
     * flash_sm90's wgmma kernel (at head dim 128 with two heads a block, its
     * tiles fetched by TMA); the second pass fetches them by cp.async
     * (KAPITSA_CUDA_TMA=0), the third turns wgmma off
     * (KAPITSA_CUDA_WGMMA=0) for k_flash's. */
    const bool wgmma_set = getenv("KAPITSA_CUDA_WGMMA") != NULL || getenv("KAPITSA_CUDA_TMA") != NULL;
    for (int pass = 0; pass < (wgmma_set ? 1 : 3); pass++) {
        if (pass == 1)
            setenv("KAPITSA_CUDA_TMA", "0", 1);
        if (pass == 2)
            setenv("KAPITSA_CUDA_WGMMA", "0", 1);
        if (both_open(&b, false) != 0) {
            both_close(&b);
            break;
        }
        prefill_case(&b, 300, 128, 101, 32, 8, 128, 2e-2);
        prefill_case(&b, 2000, 704, 130, 40, 8, 128, 2e-2); /* groups of 5: one head a block; a long cache */
        prefill_case(&b, 0, 256, 64, 16, 2, 128, 2e-2);     /* groups of 8 */
        prefill_case(&b, 77, 192, 100, 8, 2, 64, 2e-2);
        prefill_case(&b, 500, 1, 200, 32, 8, 128, 2e-2);
        prefill_case(&b, 17, 100, 80, 40, 8, 128, 2e-2);
        prefill_case(&b, 40, 64, 70, 4, 2, 32, 2e-2);
        prefill_case(&b, 300, 128, 101, 16, 4, 256, 2e-2); /* head dim 256: queries staged in shared memory */
        prefill_case(&b, 70, 192, 64, 16, 8, 256, 2e-2);   /* groups of 2: 64 rows a block */
        prefill_case(&b, 33, 150, 60, 12, 4, 256, 2e-2);   /* groups of 3: one head a block */
        mixed_case(&b, 4, 3000, 100, 200, 32, 8, 128, 2e-2);
        mixed_case(&b, 3, 700, 0, 130, 16, 4, 256, 2e-2);
        if (pass == 0) {
            /* decoding from a bf16 cache on the tensor cores (head dims 64
             * and 128, up to 16 query heads a kv head): a tree beside a
             * chain, one tile to several ranges, groups of 4, 5, 8 and 16;
             * head dim 256 stays on k_att_decode */
            att_kv = DT_BF16;
            attention_case(&b, 9, 8, 2, 64, 0, 2e-2);
            attention_case(&b, 300, 32, 8, 128, 0, 2e-2);
            attention_case(&b, 5000, 32, 8, 128, 0, 2e-2);
            attention_case(&b, 3000, 32, 4, 128, 0, 2e-2);
            attention_case(&b, 700, 10, 2, 128, 0, 2e-2);
            attention_case(&b, 2000, 32, 2, 64, 60000, 2e-2); /* a cache 30 times larger than the context */
            prep_attention_case(&b, 1, 40, 2e-2);
            prep_attention_case(&b, 1, 512, 2e-2); /* one tile a range, the last the new key alone */
            prep_attention_case(&b, 4, 300, 2e-2);
            prep_attention_case(&b, 1, 3000, 2e-2); /* ranges of several tiles */
            attention_case(&b, 700, 16, 1, 256, 0, 2e-2);
            mixed_case(&b, 4, 3000, 100, 200, 32, 8, 128, 2e-2);
            mixed_case(&b, 70, 40, 0, 30, 16, 4, 64, 2e-2);
            att_kv = DT_F32;
        }
        both_close(&b);
    }
    if (!wgmma_set) {
        unsetenv("KAPITSA_CUDA_TMA");
        unsetenv("KAPITSA_CUDA_WGMMA");
    }
}

void test_cuda_rowwise(void)
{
    struct both b;
    if (both_open(&b, true) != 0)
        return both_close(&b);
    const int32_t n = 6, heads = 4, hd = 48, H = heads * hd;
    struct pair x, y, o, w, wh, f, tab, mp, z, g1;
    pair_make(&b, &x, DT_F32, n, H, 3.0f);
    pair_make(&b, &y, DT_F32, n, H, 3.0f);
    pair_make(&b, &o, DT_F32, n, H, 0.0f);
    pair_make(&b, &w, DT_BF16, 1, H, 1.0f);
    pair_make(&b, &wh, DT_F32, 1, hd, 1.0f);
    pair_make(&b, &z, DT_F32, n, H, 3.0f);
    pair_make(&b, &g1, DT_F32, n, 1, 3.0f);
    pair_make(&b, &tab, DT_BF16, 50, H, 1.0f);
    float inv[16];
    for (int i = 0; i < 16; i++)
        inv[i] = powf(10000.0f, -(float)i / 16);
    pair_make(&b, &f, DT_F32, 1, 16, 0.0f);
    pair_write(&b, &f, 0, 1, inv);
    int32_t map[192];
    for (int i = 0; i < H; i++)
        map[i] = (i * 7 + 3) % H;
    pair_make(&b, &mp, DT_I32, 1, H, 0.0f);
    pair_write(&b, &mp, 0, 1, map);
    int32_t tok[6] = {3, 49, 0, 7, 7, 21}, pos[6] = {0, 1, 5, 999, 40000, 12}, out_rows[3] = {5, 0, 3};
    int32_t slot[6] = {4, 0, 9, 2, 7, 11};
    struct attn_batch ab = {.n_tokens = n, .token = tok, .pos = pos, .slot = slot, .n_out = 3, .out_rows = out_rows};
    set_batch_both(&b, &ab);
#define BOTH(call_c, call_g, what)                                                                             \
    do {                                                                                                       \
        call_c;                                                                                                \
        call_g;                                                                                                \
        double e_ = pair_err(&b, &o);                                                                          \
        CHECK(e_ < 2e-6, "%s: err %.3g", what, e_);                                                          \
    } while (0)
    BOTH(b.cpu->ops->embed(b.cpu, &o.c, &tab.c), b.gpu->ops->embed(b.gpu, &o.g, &tab.g), "embed");
    BOTH(b.cpu->ops->rmsnorm(b.cpu, &o.c, &x.c, &w.c, 1e-6f), b.gpu->ops->rmsnorm(b.gpu, &o.g, &x.g, &w.g, 1e-6f),
         "rmsnorm");
    BOTH(b.cpu->ops->rmsnorm(b.cpu, &o.c, &x.c, &wh.c, 1e-6f), b.gpu->ops->rmsnorm(b.gpu, &o.g, &x.g, &wh.g, 1e-6f),
         "rmsnorm per head");
    BOTH(b.cpu->ops->rope(b.cpu, &o.c, heads, hd, 32, &f.c, 1.0f),
         b.gpu->ops->rope(b.gpu, &o.g, heads, hd, 32, &f.g, 1.0f), "rope");
    BOTH(b.cpu->ops->swiglu(b.cpu, &o.c, &x.c, &y.c), b.gpu->ops->swiglu(b.gpu, &o.g, &x.g, &y.g), "swiglu");
    BOTH(b.cpu->ops->add(b.cpu, &o.c, &y.c), b.gpu->ops->add(b.gpu, &o.g, &y.g), "add");
    BOTH(b.cpu->ops->relu2(b.cpu, &o.c), b.gpu->ops->relu2(b.gpu, &o.g), "relu2");
    BOTH(b.cpu->ops->sigmoid_mul(b.cpu, &o.c, &z.c), b.gpu->ops->sigmoid_mul(b.gpu, &o.g, &z.g), "sigmoid_mul");
    BOTH(b.cpu->ops->sigmoid_mul(b.cpu, &o.c, &g1.c), b.gpu->ops->sigmoid_mul(b.gpu, &o.g, &g1.g),
         "sigmoid_mul by column");
    BOTH(b.cpu->ops->permute_cols(b.cpu, &o.c, &x.c, &mp.c), b.gpu->ops->permute_cols(b.gpu, &o.g, &x.g, &mp.g),
         "permute_cols");
    BOTH(b.cpu->ops->rmsnorm_gated(b.cpu, &o.c, &x.c, &z.c, &wh.c, 1e-6f, hd, false),
         b.gpu->ops->rmsnorm_gated(b.gpu, &o.g, &x.g, &z.g, &wh.g, 1e-6f, hd, false), "rmsnorm_gated");
    BOTH(b.cpu->ops->rmsnorm_gated(b.cpu, &o.c, &x.c, &z.c, &w.c, 1e-6f, 64, true),
         b.gpu->ops->rmsnorm_gated(b.gpu, &o.g, &x.g, &z.g, &w.g, 1e-6f, 64, true), "rmsnorm_gated, gate first");
    struct tensor oc = tensor_rows(&o.c, 0, 3), og = tensor_rows(&o.g, 0, 3);
    BOTH(b.cpu->ops->get_out_rows(b.cpu, &oc, &x.c), b.gpu->ops->get_out_rows(b.gpu, &og, &x.g), "get_out_rows");
    int32_t src[3] = {0, 4, 2}, dst[3] = {1, 0, 4};
    BOTH(b.cpu->ops->copy_rows(b.cpu, &o.c, src, dst, 3), b.gpu->ops->copy_rows(b.gpu, &o.g, src, dst, 3),
         "copy_rows");
#undef BOTH
    { /* wide rows: copy_rows in parts (pairs 0-2 in one launch, the last
       * reading a row the third wrote); rmsnorm_gated by single columns
       * with teams of 128 threads (groups of 1250, not a multiple of 4), and
       * by 4 columns with teams of 256 past their kept units (5000), of 32
       * keeping 2 units (200) and of 128 (1000) */
        struct pair wx, wz, wo, ww;
        pair_make(&b, &wx, DT_F32, 6, 5000, 3.0f);
        pair_make(&b, &wz, DT_F32, 6, 5000, 3.0f);
        pair_make(&b, &wo, DT_F32, 6, 5000, 0.0f);
        pair_make(&b, &ww, DT_BF16, 1, 5000, 1.0f);
        int32_t s2[4] = {0, 1, 2, 5}, d2[4] = {3, 4, 5, 0};
        b.cpu->ops->copy_rows(b.cpu, &wx.c, s2, d2, 4);
        b.gpu->ops->copy_rows(b.gpu, &wx.g, s2, d2, 4);
        double e = pair_err(&b, &wx);
        CHECK(e == 0.0, "copy_rows of wide rows: err %.3g", e);
        /* the last in place, as the models call it; in groups of 200, 1000 and 1250 the last unit of some
         * threads lies past the group's end (clamped loads) */
        const struct {
            int64_t group;
            bool gf, in_place;
        } rg[4] = {{5000, false, false}, {1250, true, false}, {200, false, false}, {1000, true, true}};
        for (int i = 0; i < 4; i++) {
            struct pair *out = rg[i].in_place ? &wx : &wo;
            b.cpu->ops->rmsnorm_gated(b.cpu, &out->c, &wx.c, &wz.c, &ww.c, 1e-6f, rg[i].group, rg[i].gf);
            b.gpu->ops->rmsnorm_gated(b.gpu, &out->g, &wx.g, &wz.g, &ww.g, 1e-6f, rg[i].group, rg[i].gf);
            e = pair_err(&b, out);
            CHECK(e < 2e-6, "rmsnorm_gated, groups of %lld%s: err %.3g", (long long)rg[i].group,
                  rg[i].in_place ? " in place" : "", e);
        }
        struct pair *wl[] = {&wx, &wz, &wo, &ww};
        for (size_t i = 0; i < sizeof wl / sizeof wl[0]; i++)
            pair_free(&b, wl[i]);
    }
    for (int ct = 0; ct < 2; ct++) { /* attn_prep (partial rope: 32 of 48 dims), f32 and bf16 caches: as the
                                      * cpu's pieces (a bf16 row within a rounding), bitwise the gpu's own pieces */
        const enum dtype kt = ct ? DT_BF16 : DT_F32;
        const int32_t nkv = 2;
        struct pair q, k, v, kc, vc, qn, kn, q2, k2, kc2, vc2;
        pair_make(&b, &q, DT_F32, n, H, 3.0f);
        pair_make(&b, &k, DT_F32, n, nkv * hd, 3.0f);
        pair_make(&b, &v, DT_F32, n, nkv * hd, 3.0f);
        pair_make(&b, &kc, kt, 16, nkv * hd, 0.0f);
        pair_make(&b, &vc, kt, 16, nkv * hd, 0.0f);
        pair_make(&b, &qn, DT_BF16, 1, hd, 1.0f);
        pair_make(&b, &kn, DT_BF16, 1, hd, 1.0f);
        pair_make(&b, &q2, DT_F32, n, H, 0.0f);
        pair_make(&b, &k2, DT_F32, n, nkv * hd, 0.0f);
        pair_make(&b, &kc2, kt, 16, nkv * hd, 0.0f);
        pair_make(&b, &vc2, kt, 16, nkv * hd, 0.0f);
        b.gpu->ops->write(b.gpu, &q2.g, 0, n, q.host);
        b.gpu->ops->write(b.gpu, &k2.g, 0, n, k.host);
        b.gpu->ops->write(b.gpu, &kc2.g, 0, 16, kc.host); /* the same signed zeros where nothing is stored */
        b.gpu->ops->write(b.gpu, &vc2.g, 0, 16, vc.host);
        const struct attn_prep pc = {&qn.c, &kn.c, 1e-6f, heads, nkv, hd, 32, &f.c, 0.9f};
        const struct attn_prep pg = {&qn.g, &kn.g, 1e-6f, heads, nkv, hd, 32, &f.g, 0.9f};
        b.cpu->ops->attn_prep(b.cpu, &q.c, &k.c, &v.c, &kc.c, &vc.c, &pc);
        b.gpu->ops->attn_prep(b.gpu, &q.g, &k.g, &v.g, &kc.g, &vc.g, &pg);
        backend_attn_prep_pieces(b.gpu, &q2.g, &k2.g, &v.g, &kc2.g, &vc2.g, &pg);
        const struct pair *fused[4] = {&q, &k, &kc, &vc}, *pieces[4] = {&q2, &k2, &kc2, &vc2};
        for (int t = 0; t < 4; t++) {
            const double e = pair_err(&b, fused[t]);
            CHECK(e < (t >= 2 && ct ? 1.0 / 128 : 2e-6), "attn_prep (%s cache) output %d: err %.3g", dtype_name(kt), t,
                  e);
            CHECK(gpu_bits_equal(&b, &fused[t]->g, &pieces[t]->g), "attn_prep (%s cache) output %d: not its pieces' bits",
                  dtype_name(kt), t);
        }
        struct pair *ps[] = {&q, &k, &v, &kc, &vc, &qn, &kn, &q2, &k2, &kc2, &vc2};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
            pair_free(&b, ps[i]);
    }
    struct pair wx, wo, ww; /* a whole hidden state per row: the block-per-row form */
    pair_make(&b, &wx, DT_F32, 3, 4096, 3.0f);
    pair_make(&b, &wo, DT_F32, 3, 4096, 0.0f);
    pair_make(&b, &ww, DT_BF16, 1, 4096, 1.0f);
    b.cpu->ops->rmsnorm(b.cpu, &wo.c, &wx.c, &ww.c, 1e-6f);
    b.gpu->ops->rmsnorm(b.gpu, &wo.g, &wx.g, &ww.g, 1e-6f);
    double ew = pair_err(&b, &wo);
    CHECK(ew < 2e-6, "rmsnorm 4096: err %.3g", ew);
    pair_free(&b, &wx);
    pair_free(&b, &wo);
    pair_free(&b, &ww);
    struct pair *all[] = {&x, &y, &o, &w, &wh, &f, &tab, &mp, &z, &g1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(&b, all[i]);
    both_close(&b);
}

/* The moe op against the cpu for n in ns (each <= n_max): experts in n_t
 * dtypes (bf16, then f16), every routing mode (softmax and the grouped
 * sigmoid also with spread routing), the result written, then added to a
 * residual; tol: the outputs' error bound (2e-5 precise). sh > 0:
 * with a bf16 shared expert of sh rows (SwiGLU and a sigmoid mix where the
 * routed experts have a gate, relu^2 where not), which the gpu backend runs
 * beside the routed experts for up to CUDA_SMALL_N tokens. fast:
 * the gpu backend is not precise; past CUDA_SMALL_N tokens its router reads
 * h rounded to bf16, so a row whose experts' logits are close may pick
 * others than the cpu: up to an eighth of the rows may, and the errors are
 * taken over the rows whose picks agree. */
static void moe_case(struct both *b, int32_t E, int32_t k, int32_t hid, int32_t inter, const int32_t *ns, int n_ns,
                     int n_t, double tol, bool fast, int32_t sh)
{
    int32_t n_max = 0;
    for (int i = 0; i < n_ns; i++)
        n_max = ns[i] > n_max ? ns[i] : n_max;
    struct pair lg, bias, x, h, out, res, ws, ids, wts, nw, router;
    struct pair *gate = calloc((size_t)(3 * E), sizeof *gate), *up = calloc((size_t)(3 * E), sizeof *up),
                *down = calloc((size_t)(3 * E), sizeof *down);
    struct tensor *tc = calloc((size_t)(18 * E), sizeof *tc);
    int32_t *ic = calloc((size_t)(2 * n_max * k), sizeof *ic), *ig = ic + n_max * k;
    bool *same = calloc((size_t)n_max, sizeof *same), *picked = calloc((size_t)(3 * n_max), sizeof *picked);
    assert(gate && up && down && tc && ic && same && picked);
    pair_make(b, &lg, DT_F32, n_max, E, 0.0f);
    pair_make(b, &bias, DT_F32, 1, E, 0.5f);
    pair_make(b, &x, DT_F32, n_max, hid, 1.0f);
    pair_make(b, &h, DT_F32, n_max, hid, 0.0f);
    pair_make(b, &out, DT_F32, n_max, hid, 0.0f);
    pair_make(b, &res, DT_F32, n_max, hid, 1.0f);
    pair_make(b, &ws, DT_F32, n_max, 2 * (hid + inter), 0.0f);
    pair_make(b, &ids, DT_I32, n_max, k, 0.0f);
    pair_make(b, &wts, DT_F32, n_max, k, 0.0f);
    pair_make(b, &nw, DT_BF16, 1, hid, 1.0f);
    pair_make(b, &router, DT_BF16, E, hid, 0.5f);
    struct pair sg_w, su_w, sd_w, smix, sgs, sus, sy, smo;
    const int32_t shr = sh ? sh : 8; /* made (and freed) either way; used when sh > 0 */
    pair_make(b, &sg_w, DT_BF16, shr, hid, 0.3f);
    pair_make(b, &su_w, DT_BF16, shr, hid, 0.3f);
    pair_make(b, &sd_w, DT_BF16, hid, shr, 0.3f);
    pair_make(b, &smix, DT_BF16, 1, hid, 0.5f);
    pair_make(b, &sgs, DT_F32, n_max, shr, 0.0f);
    pair_make(b, &sus, DT_F32, n_max, shr, 0.0f);
    pair_make(b, &sy, DT_F32, n_max, hid, 0.0f);
    pair_make(b, &smo, DT_F32, n_max, 1, 0.0f);
    /* tc: [type][gate, up, down][cpu, gpu][E] */
    for (int t = 0; t < n_t; t++)
        for (int e = 0; e < E; e++) {
            const enum dtype dt = t ? DT_F16 : DT_BF16;
            struct pair *pe[3] = {&gate[t * E + e], &up[t * E + e], &down[t * E + e]};
            if (t == 2) { /* block-type experts: Q4_K where the widths allow, else Q8_0 */
                const enum dtype qt = hid % 256 == 0 && inter % 256 == 0 ? DT_Q4_K : DT_Q8_0;
                assert(hid % 32 == 0 && inter % 32 == 0);
                pair_quant(b, pe[0], qt, inter, hid);
                pair_quant(b, pe[1], qt, inter, hid);
                pair_quant(b, pe[2], qt, hid, inter);
            } else {
                pair_make(b, pe[0], dt, inter, hid, 0.3f);
                pair_make(b, pe[1], dt, inter, hid, 0.3f);
                pair_make(b, pe[2], dt, hid, inter, 0.3f);
            }
            for (int m = 0; m < 3; m++) {
                tc[((t * 3 + m) * 2) * E + e] = pe[m]->c;
                tc[((t * 3 + m) * 2 + 1) * E + e] = pe[m]->g;
            }
        }
    /* row 0's output from the first batch of each (type, mode): in every
     * later batch up to CUDA_SMALL_N rows it must keep its bits (a tree's
     * token as decoded alone; larger batches take cuBLAS) */
    float *row0 = calloc((size_t)(n_t * 5) * hid, sizeof(float)), *rowb = calloc((size_t)hid, sizeof(float));
    assert(row0 && rowb);
    for (int t = 0; t < n_t; t++)
        for (int ni = 0; ni < n_ns; ni++)
            for (int mode = 0; mode < 5; mode++) {
                /* modes 3 and 4: 0 and 2 with spread routing */
                const int md = mode < 3 ? mode : mode == 3 ? 0 : 2;
                const int32_t n = ns[ni];
                struct tensor rc[6], rg[6];
                struct pair *per_row[] = {&lg, &x, &h, &ids, &wts, &ws};
                for (int i = 0; i < 6; i++) {
                    rc[i] = tensor_rows(&per_row[i]->c, 0, n);
                    rg[i] = tensor_rows(&per_row[i]->g, 0, n);
                }
                struct tensor oc = tensor_rows(&out.c, 0, n), og = tensor_rows(&out.g, 0, n);
                struct tensor sc = tensor_rows(&res.c, 0, n), sg = tensor_rows(&res.g, 0, n);
                struct tensor *ex = tc + t * 6 * E; /* [gate, up, down][cpu, gpu][E] */
                struct moe_block mc = {
                    .norm = &nw.c, .eps = 1e-6f, .router = &router.c,
                    .rt = {.k = k, .sigmoid = md > 0, .norm = md != 1, .bias = md == 2 ? &bias.c : NULL,
                           .n_group = md == 2 ? 4 : 1, .topk_group = md == 2 ? 2 : 1,
                           .scale = md == 2 ? 2.5f : 1.0f, .spread = mode >= 3},
                    .ex = {E, md == 1 ? NULL : ex, ex + 2 * E, ex + 4 * E},
                    .h = &rc[2], .logits = &rc[0], .ids = &rc[3], .weights = &rc[4], .ws = &rc[5],
                };
                struct moe_block mg = mc;
                mg.norm = &nw.g;
                mg.router = &router.g;
                mg.rt.bias = md == 2 ? &bias.g : NULL;
                mg.ex = (struct moe_experts){E, md == 1 ? NULL : ex + E, ex + 3 * E, ex + 5 * E};
                mg.h = &rg[2], mg.logits = &rg[0], mg.ids = &rg[3], mg.weights = &rg[4], mg.ws = &rg[5];
                struct tensor shc[4] = {tensor_rows(&sgs.c, 0, n), tensor_rows(&sus.c, 0, n),
                                        tensor_rows(&sy.c, 0, n), tensor_rows(&smo.c, 0, n)};
                struct tensor shg[4] = {tensor_rows(&sgs.g, 0, n), tensor_rows(&sus.g, 0, n),
                                        tensor_rows(&sy.g, 0, n), tensor_rows(&smo.g, 0, n)};
                const struct moe_shared shared_c = {
                    .mlp = {.gate = md == 1 ? NULL : &sg_w.c, .up = &su_w.c, .down = &sd_w.c, .g = &shc[0],
                            .u = &shc[1]},
                    .mix = md == 1 ? NULL : &smix.c, .mix_out = &shc[3], .y = &shc[2]};
                const struct moe_shared shared_g = {
                    .mlp = {.gate = md == 1 ? NULL : &sg_w.g, .up = &su_w.g, .down = &sd_w.g, .g = &shg[0],
                            .u = &shg[1]},
                    .mix = md == 1 ? NULL : &smix.g, .mix_out = &shg[3], .y = &shg[2]};
                mc.shared = sh ? &shared_c : NULL;
                mg.shared = sh ? &shared_g : NULL;
                b->cpu->ops->moe(b->cpu, &oc, &rc[1], &mc, false);
                b->gpu->ops->moe(b->gpu, &og, &rg[1], &mg, false);
                b->cpu->ops->read(b->cpu, &rc[3], 0, n, (float *)ic);
                b->gpu->ops->read(b->gpu, &rg[3], 0, n, (float *)ig);
                /* spread routing's ids never differ, and the rows whose own picks swapped
                 * are those that swapped in the mode without it (just before) */
                int32_t n_swapped = 0;
                for (int32_t r = 0; r < n_max; r++) {
                    same[r] = r < n && memcmp(ic + r * k, ig + r * k, (size_t)k * sizeof(int32_t)) == 0;
                    n_swapped += r < n && !same[r];
                    if (mode < 3)
                        picked[md * n_max + r] = same[r];
                    else
                        same[r] = same[r] && picked[md * n_max + r];
                }
                const int32_t may_swap = fast && n > CUDA_SMALL_N && mode < 3 ? n / 8 : 0;
                CHECK(n_swapped <= may_swap, "moe E %d n %d mode %d: %d rows' ids differ (%d may)", E, n, mode,
                      n_swapped, may_swap);
                /* the weights follow the logits, which follow two products' rounding (2-3e-6 seen) */
                double e = fmax(fmax(pair_err_rows(b, &h, same), pair_err_rows(b, &lg, same)),
                                pair_err_rows(b, &wts, same));
                CHECK(e < fmax(tol, 1e-5), "moe E %d n %d mode %d: h, logits or weights err %.3g", E, n, mode, e);
                e = pair_err_rows(b, &out, same);
                if (fast && n > CUDA_SMALL_N)
                    printf("  moe, fast, E %d n %d mode %d: err %.3g\n", E, n, mode, e);
                CHECK(e < tol, "moe E %d %s n %d mode %d sh %d: err %.3g", E, t == 2 ? "block" : t ? "f16" : "bf16", n, mode, sh, e);
                float *r0 = row0 + (size_t)(t * 5 + mode) * hid;
                b->gpu->ops->read(b->gpu, &og, 0, 1, ni == 0 ? r0 : rowb);
                CHECK(ni == 0 || n > CUDA_SMALL_N || memcmp(r0, rowb, (size_t)hid * sizeof(float)) == 0,
                      "moe E %d hid %d n %d mode %d: row 0 differs from its output in a batch of %d", E, hid, n, mode,
                      ns[0]);
                /* the residual afresh: rows whose picks swapped in an earlier case would carry their difference */
                pair_write(b, &res, 0, n_max, res.host);
                b->cpu->ops->moe(b->cpu, &sc, &rc[1], &mc, true);
                b->gpu->ops->moe(b->gpu, &sg, &rg[1], &mg, true);
                e = pair_err_rows(b, &res, same);
                CHECK(e < tol, "moe added E %d %s n %d mode %d sh %d: err %.3g", E, t == 2 ? "block" : t ? "f16" : "bf16", n, mode, sh,
                      e);
            }
    free(row0);
    free(rowb);
    free(same);
    free(picked);
    for (int t = 0; t < n_t; t++)
        for (int e = 0; e < E; e++) {
            pair_free(b, &gate[t * E + e]);
            pair_free(b, &up[t * E + e]);
            pair_free(b, &down[t * E + e]);
        }
    struct pair *all[] = {&lg, &bias, &x, &h, &out, &res, &ws, &ids, &wts, &nw, &router,
                          &sg_w, &su_w, &sd_w, &smix, &sgs, &sus, &sy, &smo};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(b, all[i]);
    free(gate);
    free(up);
    free(down);
    free(tc);
    free(ic);
}

/* The moe op against the cpu: with bf16 experts, 1 and 8 tokens take the
 * fused gate (RMSNorm, router, routing and plan in one launch), 9 and 64 the
 * grouped products over the plan the routing's last block builds (64: an
 * expert may get every token), 70 the bf16 cuBLAS products over host-built
 * lists; f16 experts the plain products per expert. Then the gate at its
 * widest (hidden 4096, 4 and 8 tokens: over 48 KiB of shared memory); 300
 * tokens over 4 experts (the cuBLAS products over long slices, K off
 * multiples of 16); 256 and 1024 experts: the routing's 8 and 32 registers a
 * lane, in the gate and in its own kernel. Large batches' bf16 experts
 * run as batched products over slices padded to a few sizes: 70 tokens
 * (slices of ~17 rows, padded to 32) and 300 (150, padded to 160). */
void test_cuda_moe(void)
{
    struct both b;
    if (both_open(&b, true) != 0)
        return both_close(&b);
    const int32_t small[] = {1, 8, 9, 64, 70}, wide[] = {4, 8}, large[] = {300}, many[] = {1, 9};
    moe_case(&b, 16, 4, 64, 40, small, 5, 2, 2e-5, false, 0);
    moe_case(&b, 128, 8, 4096, 16, wide, 2, 1, 2e-5, false, 0);
    moe_case(&b, 4, 2, 200, 72, large, 1, 1, 2e-5, false, 0);
    moe_case(&b, 256, 8, 64, 16, many, 2, 1, 2e-5, false, 0);
    moe_case(&b, 1024, 10, 64, 16, many, 2, 1, 2e-5, false, 0);
    /* a shared expert: beside the routed ones in a branch (1 to 64 tokens:
     * its rows added by the lone token's down-and-combine launch, or by the
     * combine), after them past CUDA_SMALL_N (70) */
    moe_case(&b, 16, 4, 64, 40, small, 5, 1, 2e-5, false, 56);
    /* K split in slices for a lone token (gate/up 4 of 128, down 2 of 128),
     * then the same rows in batches: of 9 (k_mmv's split-K launches), of 3
     * and 8 (k_mmv_slices with a slot's tokens in the mma's columns) */
    const int32_t alone[] = {1, 9, 3, 8};
    moe_case(&b, 16, 4, 512, 256, alone, 4, 3, 2e-5, false, 0);
    /* gate/up of 1536 inputs in 12 slices of 128 on an H200 (more than
     * MMV_WARPS: a lone token's block of 12 warps, as nemotron-3-nano's 11) */
    moe_case(&b, 8, 4, 1536, 256, alone, 4, 1, 2e-5, false, 0);
    moe_case(&b, 8, 4, 1536, 256, alone, 4, 3, 2e-5, false, 512);
    /* nemotron-3-nano's widths and picks (on an H100 or H200: its up
     * product in 7 slices of 384; a lone token's down products in 2
     * slices, whose combined launch, 168 blocks of 12 warps, would not fit
     * one wave of 132 SMs, so the grouped product and the combine take them) */
    moe_case(&b, 16, 6, 2688, 1856, alone, 4, 1, 2e-5, false, 0);
    both_close(&b);
    /* fast mode (bf16 activations, one product where precise makes two):
     * the small forms again, within bf16 rounding (70 tokens: the router
     * past CUDA_SMALL_N, where picks may swap); 600 tokens over 8 experts
     * (slices of ~150 rows: two of moe_gemm.cu's 128-row tiles, inputs
     * of 256 and 192 in stages of 64, 192 outputs in a tile of 256). On
     * Hopper large batches take moe_gemm.cu's grouped products; the second
     * pass (KAPITSA_CUDA_TMA=0) cuBLAS's batched ones. */
    const int32_t big[] = {600};
    const bool tma_set = getenv("KAPITSA_CUDA_TMA") != NULL;
    for (int pass = 0; pass < (tma_set ? 1 : 2); pass++) {
        if (pass == 1)
            setenv("KAPITSA_CUDA_TMA", "0", 1);
        if (both_open(&b, false) != 0) {
            both_close(&b);
            break;
        }
        moe_case(&b, 16, 4, 64, 40, small, 5, 1, 1e-2, true, 0);
        moe_case(&b, 8, 4, 1536, 256, alone, 4, 1, 1e-2, true, 0);
        moe_case(&b, 8, 4, 1536, 256, alone, 4, 1, 1e-2, true, 512);
        moe_case(&b, 8, 2, 256, 192, big, 1, 3, 1e-2, true, 128);
        both_close(&b);
    }
    if (!tma_set)
        unsetenv("KAPITSA_CUDA_TMA");
}

/* the gated delta rule of the batch set (n rows, states in n_slots slots),
 * gpu against cpu within tol */
static void delta_case(struct both *b, int32_t dk, int32_t dv, int32_t n, int32_t n_slots, double tol,
                       const char *what)
{
    const int32_t Hk = 2, Hv = 4;
    struct pair q, kk, v, a, bb, Al, dtb, o, st;
    pair_make(b, &q, DT_F32, n, Hk * dk, 1.0f);
    pair_make(b, &kk, DT_F32, n, Hk * dk, 1.0f);
    pair_make(b, &v, DT_F32, n, Hv * dv, 1.0f);
    pair_make(b, &a, DT_F32, n, Hv, 1.0f);
    pair_make(b, &bb, DT_F32, n, Hv, 2.0f);
    pair_make(b, &Al, DT_F32, 1, Hv, 1.0f);
    pair_make(b, &dtb, DT_F32, 1, Hv, 1.0f);
    pair_make(b, &o, DT_F32, n, Hv * dv, 0.0f);
    pair_make(b, &st, DT_F32, n_slots, Hv * dk * dv, 0.3f);
    /* A = e^{A_log} ~ 0.02, a row's decay near 0.99 as in trained models: a
     * state lasts across a prompt's chunks (at A ~ 1 a chunk of 64 rows
     * forgets all before it, and a wrong chain would go unseen) */
    for (int32_t h = 0; h < Hv; h++)
        ((float *)Al.host)[h] = -4.0f + 0.5f * ((float *)Al.host)[h];
    pair_write(b, &Al, 0, 1, Al.host);
    b->cpu->ops->delta_rule(b->cpu, &o.c, &q.c, &kk.c, &v.c, &a.c, &bb.c, &Al.c, &dtb.c, &st.c, Hk, Hv, dk, dv);
    b->gpu->ops->delta_rule(b->gpu, &o.g, &q.g, &kk.g, &v.g, &a.g, &bb.g, &Al.g, &dtb.g, &st.g, Hk, Hv, dk, dv);
    const double e = pair_err(b, &o), es = pair_err(b, &st);
    printf("  delta rule, %s, %d rows, dk %d dv %d: err %.3g, states %.3g\n", what, n, dk, dv, e, es);
    CHECK(e < tol && es < tol, "delta_rule %s n %d dk %d dv %d: err %.3g, states %.3g", what, n, dk, dv, e, es);
    struct pair *dl[] = {&q, &kk, &v, &a, &bb, &Al, &dtb, &o, &st};
    for (size_t i = 0; i < sizeof dl / sizeof dl[0]; i++)
        pair_free(b, dl[i]);
}

/* the Mamba2 scan of the batch set (n rows, states in n_slots slots), gpu
 * against cpu within tol */
static void ssd_case(struct both *b, const struct ssd_params *sp, int32_t n, int32_t n_slots, double tol,
                     const char *what)
{
    const int32_t H = sp->n_head, P = sp->head_dim, G = sp->n_group, Ns = sp->d_state;
    struct pair y, xs, B, Cc, dt, Al, D, dtb, st;
    pair_make(b, &xs, DT_F32, n, H * P, 1.0f);
    pair_make(b, &B, DT_F32, n, G * Ns, 1.0f);
    pair_make(b, &Cc, DT_F32, n, G * Ns, 1.0f);
    pair_make(b, &dt, DT_F32, n, H, 1.0f);
    pair_make(b, &Al, DT_F32, 1, H, 1.0f);
    pair_make(b, &D, DT_F32, 1, H, 1.0f);
    pair_make(b, &dtb, DT_F32, 1, H, 1.0f);
    pair_make(b, &y, DT_F32, n, H * P, 0.0f);
    pair_make(b, &st, DT_F32, n_slots, H * P * Ns, 0.3f);
    b->cpu->ops->ssd(b->cpu, &y.c, &xs.c, &B.c, &Cc.c, &dt.c, &Al.c, &D.c, &dtb.c, &st.c, sp);
    b->gpu->ops->ssd(b->gpu, &y.g, &xs.g, &B.g, &Cc.g, &dt.g, &Al.g, &D.g, &dtb.g, &st.g, sp);
    const double e = pair_err(b, &y), es = pair_err(b, &st);
    printf("  ssd, %s, %d rows, chunk %d: err %.3g, states %.3g\n", what, n, sp->chunk, e, es);
    CHECK(e < tol && es < tol, "ssd %s n %d P %d N %d chunk %d: err %.3g, states %.3g", what, n, P, Ns, sp->chunk, e,
          es);
    struct pair *sl[] = {&y, &xs, &B, &Cc, &dt, &Al, &D, &dtb, &st};
    for (size_t i = 0; i < sizeof sl / sizeof sl[0]; i++)
        pair_free(b, sl[i]);
}

/* A batch of two sequences: seq 0 a tree of 6 rows from slot 1, seq 1 a chain
 * of 150 rows from slot 2 (both backends take their chunked forms there: the
 * delta rule's chunks of 64, the last partial). Kept states: every tree row,
 * and the chain's last. Then a decode step of four sequences. */
void test_cuda_recurrent(void)
{
    struct both b;
    if (both_open(&b, true) != 0)
        return both_close(&b);
    enum { N = 156 };
    int32_t seq[N], parent[N], sin_[N], sout[N];
    const int32_t tree_parent[6] = {-1, 0, 0, 1, 3, 2};
    for (int32_t i = 0; i < N; i++) {
        seq[i] = i < 6 ? 0 : 1;
        parent[i] = i < 6 ? tree_parent[i] : (i == 6 ? -1 : i - 1);
        sin_[i] = i < 6 ? 1 : 2;
        sout[i] = i < 6 ? 3 + i : (i == N - 1 ? 9 : -1);
    }
    struct attn_batch ab = {.n_tokens = N, .seq_row = seq, .parent = parent, .state_in = sin_, .state_out = sout};
    set_batch_both(&b, &ab);
    /* conv1d: width 4 (every model's, unrolled at compile time) and 3 */
    const int32_t C = 300;
    struct pair x, o, w, bias, st;
    pair_make(&b, &x, DT_F32, N, C, 1.0f);
    pair_make(&b, &bias, DT_BF16, 1, C, 0.5f);
    double e = 0.0, es = 0.0;
    for (int32_t K = 4; K >= 3; K--) {
        pair_make(&b, &o, DT_F32, N, C, 0.0f);
        pair_make(&b, &w, DT_BF16, C, K, 0.5f);
        pair_make(&b, &st, DT_F32, 10, (K - 1) * C, 1.0f);
        b.cpu->ops->conv1d(b.cpu, &o.c, &x.c, &w.c, &bias.c, &st.c);
        b.gpu->ops->conv1d(b.gpu, &o.g, &x.g, &w.g, &bias.g, &st.g);
        e = pair_err(&b, &o);
        es = pair_err(&b, &st);
        CHECK(e < 1e-6 && es < 1e-6, "conv1d K %d: err %.3g, states %.3g", K, e, es);
        pair_free(&b, &o);
        pair_free(&b, &w);
        pair_free(&b, &st);
    }
    const char *what = "tree and chain";
    /* a decode step: four sequences of one row each (the cpu backend reads
     * the batch's arrays while ops run, so they live as long as the loop) */
    const int32_t dseq[4] = {0, 1, 2, 3}, dpar[4] = {-1, -1, -1, -1}, din[4] = {1, 2, 3, 4}, dout[4] = {5, 6, 7, 8};
    const struct attn_batch db = {.n_tokens = 4, .seq_row = dseq, .parent = dpar, .state_in = din, .state_out = dout};
    for (int batch = 0; batch < 2; batch++) {
        if (batch == 1) {
            set_batch_both(&b, &db);
            what = "decode";
        }
        const int32_t n = batch == 0 ? N : 4;
        /* gated delta rule: 2 key heads, 4 value heads; dk 64, dv 24 (a
         * partial slice of state columns), qwen3.5's dk = dv = 128, and dk
         * 256 (32 state rows a lane) */
        const int32_t dims[3][2] = {{64, 24}, {128, 128}, {256, 40}};
        for (int cfg = 0; cfg < 3; cfg++)
            delta_case(&b, dims[cfg][0], dims[cfg][1], n, 10, 1e-5, what);
        /* Mamba2: 8 heads of 16 in 2 groups, state 32, chunk 16 (ten chunks);
         * then 4 heads of 24 (a partial block of state rows), state 128, chunk 64 */
        const struct ssd_params sps[2] = {{.n_head = 8, .head_dim = 16, .n_group = 2, .d_state = 32, .chunk = 16,
                                           .dt_min = 0.0f, .dt_lo = 0.001f, .dt_hi = 100.0f},
                                          {.n_head = 4, .head_dim = 24, .n_group = 2, .d_state = 128, .chunk = 64,
                                           .dt_min = 0.0f, .dt_lo = 0.001f, .dt_hi = 100.0f}};
        for (int cfg = 0; cfg < 2; cfg++)
            ssd_case(&b, &sps[cfg], n, 10, 1e-5, what);
    }
    struct pair *cl[] = {&x, &bias};
    for (size_t i = 0; i < sizeof cl / sizeof cl[0]; i++)
        pair_free(&b, cl[i]);
    both_close(&b);
}

/* A prompt's scans outside precise mode: one chain of n rows from slot 1,
 * its state kept in slot 2, against the cpu. Mamba2 (ssd_gemm.cu, bf16
 * products, within bf16's rounding): 300 rows in chunks of 16 (heads of 16,
 * 4 a group); 4500 rows in chunks of 64, past one segment of 2048 rows
 * twice, the last chunk partial (heads of 24, state 128). The delta rule's
 * pass (delta_gemm.cu, fp32 operands on TF32 tensor cores, within their
 * rounding: errors of 6e-4 and 9e-4 measured on an H200): 300 rows (dk 64,
 * dv 24) and 4500 (qwen3.5's 128 x 128), 2 key heads, 4 value heads. */
static int32_t *prompt_batch(struct both *b, int32_t n)
{
    int32_t *seq = malloc(sizeof(int32_t) * 4 * (size_t)n), *parent = seq + n, *sin_ = parent + n, *sout = sin_ + n;
    for (int32_t i = 0; i < n; i++) {
        seq[i] = 0;
        parent[i] = i - 1;
        sin_[i] = 1;
        sout[i] = i == n - 1 ? 2 : -1;
    }
    struct attn_batch ab = {.n_tokens = n, .seq_row = seq, .parent = parent, .state_in = sin_, .state_out = sout};
    set_batch_both(b, &ab);
    return seq;
}

/* conv1d over one chain (width 4: the prompt kernel; 3: the tree kernel) */
static void conv_prompt_case(struct both *b, int32_t K, int32_t n)
{
    int32_t *seq = prompt_batch(b, n);
    const int32_t C = 300;
    struct pair x, o, w, bias, st;
    pair_make(b, &x, DT_F32, n, C, 1.0f);
    pair_make(b, &o, DT_F32, n, C, 0.0f);
    pair_make(b, &w, DT_BF16, C, K, 0.5f);
    pair_make(b, &bias, DT_BF16, 1, C, 0.5f);
    pair_make(b, &st, DT_F32, 3, (K - 1) * C, 1.0f);
    b->cpu->ops->conv1d(b->cpu, &o.c, &x.c, &w.c, &bias.c, &st.c);
    b->gpu->ops->conv1d(b->gpu, &o.g, &x.g, &w.g, &bias.g, &st.g);
    const double e = pair_err(b, &o), es = pair_err(b, &st);
    CHECK(e < 1e-6 && es < 1e-6, "conv1d prompt K %d n %d: err %.3g, states %.3g", K, n, e, es);
    struct pair *cl[] = {&x, &o, &w, &bias, &st};
    for (size_t i = 0; i < sizeof cl / sizeof cl[0]; i++)
        pair_free(b, cl[i]);
    free(seq);
}

/* a prompt's delta rule in fast mode (TF32 products) */
static void delta_prompt_case(struct both *b, int32_t dk, int32_t dv, int32_t n)
{
    int32_t *seq = prompt_batch(b, n);
    delta_case(b, dk, dv, n, 3, 5e-3, "prompt, fast");
    free(seq);
}

/* a prompt's Mamba2 scan in fast mode (bf16 products) */
static void ssd_prompt_case(struct both *b, const struct ssd_params *sp, int32_t n)
{
    int32_t *seq = prompt_batch(b, n);
    ssd_case(b, sp, n, 3, 2e-2, "prompt, fast");
    free(seq);
}

void test_cuda_prompt_scans(void)
{
    struct both b;
    if (both_open(&b, false) != 0)
        return both_close(&b);
    const struct ssd_params sps[2] = {{.n_head = 8, .head_dim = 16, .n_group = 2, .d_state = 32, .chunk = 16,
                                       .dt_min = 0.0f, .dt_lo = 0.001f, .dt_hi = 100.0f},
                                      {.n_head = 4, .head_dim = 24, .n_group = 2, .d_state = 128, .chunk = 64,
                                       .dt_min = 0.0f, .dt_lo = 0.001f, .dt_hi = 100.0f}};
    ssd_prompt_case(&b, &sps[0], 300);
    ssd_prompt_case(&b, &sps[1], 4500);
    delta_prompt_case(&b, 64, 24, 300);
    delta_prompt_case(&b, 128, 128, 4500);
    const int32_t conv_n[3] = {2, 17, 300};
    for (int i = 0; i < 3; i++) {
        conv_prompt_case(&b, 4, conv_n[i]);
        conv_prompt_case(&b, 3, conv_n[i]);
    }
    both_close(&b);
}

/* top_k on the device: the same ids and values as the cpu backend's, ties
 * (the lower column first) and -inf included, for every k */
void test_cuda_top_k(void)
{
    struct both b;
    if (both_open(&b, true) != 0)
        return both_close(&b);
    const int32_t cols[] = {16, 17, 1000, 151936};
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        const int32_t n = 5, V = cols[c];
        struct pair p;
        pair_make(&b, &p, DT_F32, n, V, 4.0f);
        float *x = p.host;
        for (int32_t r = 0; r < n; r++) {
            float *row = x + (int64_t)r * V;
            row[V - 1] = row[V / 2] = row[2] = 5.0f;
            row[V / 3] = row[V / 5] = row[V / 7] = 4.5f;
            row[0] = -INFINITY;
        }
        x[(int64_t)(n - 1) * V + V / 2] = INFINITY;
        pair_write(&b, &p, 0, n, x);
        int32_t ic[5 * TOP_K_MAX], ig[5 * TOP_K_MAX];
        float vc[5 * TOP_K_MAX], vg[5 * TOP_K_MAX];
        for (int32_t k = 1; k <= TOP_K_MAX && k <= V; k += 3) { /* k <= 16 and over: two list lengths */
            b.cpu->ops->top_k(b.cpu, &p.c, k, ic, vc);
            b.gpu->ops->top_k(b.gpu, &p.g, k, ig, vg);
            for (int32_t i = 0; i < n * k; i++)
                CHECK(ic[i] == ig[i] && memcmp(&vc[i], &vg[i], sizeof(float)) == 0,
                      "cols %d k %d entry %d: cuda %d (%g), cpu %d (%g)", V, k, i, ig[i], vg[i], ic[i], vc[i]);
        }
        /* a view of the middle rows, ids only */
        struct tensor vcpu = tensor_rows(&p.c, 1, 3), vgpu = tensor_rows(&p.g, 1, 3);
        b.cpu->ops->top_k(b.cpu, &vcpu, 2, ic, NULL);
        b.gpu->ops->top_k(b.gpu, &vgpu, 2, ig, NULL);
        CHECK(memcmp(ic, ig, 6 * sizeof(int32_t)) == 0, "cols %d: row views differ", V);
        pair_free(&b, &p);
    }
    both_close(&b);
}

/* A token verified inside a tree gets bitwise the logits it gets decoded alone. */
void test_cuda_tree_invariance(void)
{
    if (cuda_device_count() == 0) {
        test_skip("no CUDA device");
        return;
    }
    const char *archs[] = {"qwen3", "qwen3_moe", "qwen3_5", "nemotron_h"};
    for (int a = 0; a < 8; a++) { /* precise, then fast (bf16 activations) */
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures(), archs[a % 4]);
        struct backend *be = cuda_backend_init(0, a < 4);
        struct model m;
        struct engine e;
        CHECK(be && model_load(&m, dir, be, NULL) == 0 && engine_init(&e, &m, 512, 4, 64, 64, 64, DT_F32) == 0, "%s: %s",
              archs[a % 4], err_msg());
        const int32_t V = m.cfg.vocab_size, L = 30;
        int32_t prompt[30], pos[30], sq[30], par[30];
        uint8_t want[30];
        int32_t s0 = engine_seq_new(&e);
        for (int32_t i = 0; i < L; i++) {
            prompt[i] = (i * 31 + 7) % V;
            pos[i] = i;
            sq[i] = s0;
            par[i] = i - 1;
            want[i] = i == L - 1;
        }
        float *lg = malloc((size_t)V * 13 * sizeof(float)), *alone = malloc((size_t)V * 3 * sizeof(float));
        struct batch pb = {L, prompt, pos, sq, par, want};
        CHECK(engine_forward(&e, &pb, lg, NULL) == 1 && engine_commit_all(&e) == 0, "prefill");
        int32_t s1 = engine_seq_fork(&e, s0);
        /* alone: three tokens decoded one by one on the fork */
        const int32_t t[3] = {5, 9, 2};
        for (int32_t j = 0; j < 3; j++) {
            int32_t p = L + j, pa = -1, sj = s1;
            uint8_t one = 1;
            struct batch db = {1, &t[j], &p, &sj, &pa, &one};
            CHECK(engine_forward(&e, &db, alone + (size_t)j * V, NULL) == 1 && engine_commit_all(&e) == 0, "decode");
        }
        /* tree on s0: 5 -> {9 -> {2, 4}, 3 -> 8}, 7, and six more roots: 13
         * rows, past the 8 of the fused MoE gate */
        enum { NT = 13 };
        const int32_t tt[NT] = {5, 3, 9, 8, 2, 4, 7, 11, 13, 17, 19, 23, 29};
        const int32_t tp[NT] = {-1, 0, 0, 1, 2, 2, -1, -1, -1, -1, -1, -1, -1};
        int32_t tpos[NT], tsq[NT];
        uint8_t tw[NT];
        for (int i = 0; i < NT; i++) {
            tpos[i] = tp[i] < 0 ? L : tp[i] == 0 ? L + 1 : L + 2;
            tsq[i] = s0;
            tw[i] = 1;
        }
        struct batch tb = {NT, tt, tpos, tsq, tp, tw};
        CHECK(engine_forward(&e, &tb, lg, NULL) == NT, "tree: %s", err_msg());
        const char *mode = a < 4 ? "precise" : "fast";
        CHECK(memcmp(lg, alone, (size_t)V * 4) == 0, "%s %s: root differs from decoding alone", archs[a % 4], mode);
        CHECK(memcmp(lg + (size_t)2 * V, alone + V, (size_t)V * 4) == 0, "%s %s: depth 1 differs", archs[a % 4], mode);
        CHECK(memcmp(lg + (size_t)4 * V, alone + (size_t)2 * V, (size_t)V * 4) == 0, "%s %s: depth 2 differs",
              archs[a % 4], mode);
        free(lg);
        free(alone);
        engine_free(&e);
        model_free(&m);
        be->ops->free(be);
    }
}

#else

static void no_cuda(void) { test_skip("built without CUDA"); }
void test_cuda_matmul(void) { no_cuda(); }
void test_cuda_matmul_fused(void) { no_cuda(); }
void test_cuda_matmul_q(void) { no_cuda(); }
void test_cuda_attention(void) { no_cuda(); }
void test_cuda_rowwise(void) { no_cuda(); }
void test_cuda_moe(void) { no_cuda(); }
void test_cuda_recurrent(void) { no_cuda(); }
void test_cuda_prompt_scans(void) { no_cuda(); }
void test_cuda_tree_invariance(void) { no_cuda(); }
void test_cuda_top_k(void) { no_cuda(); }

#endif
