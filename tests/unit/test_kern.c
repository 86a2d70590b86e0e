/* Tests of the thread pool and of every SIMD kernel table against kern_ref,
 * on random shapes with odd sizes. */
#include "../../src/backend/cpu/cpu.h"
#include "../../src/backend/cpu/kern.h"
#include "../../src/base/dtype.h"
#include "../../src/base/pool.h"
#include "test.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float rndf(void) { return (float)((double)(rnd() >> 11) * 0x1.0p-53 * 2 - 1); }

static atomic_int hits[2][1000];
static void count_task(void *ctx, int32_t task, int32_t worker)
{
    (void)worker;
    atomic_fetch_add(&((atomic_int *)ctx)[task], 1);
}

static atomic_int busy_stop;
static void *busy(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&busy_stop, memory_order_relaxed))
        ;
    return NULL;
}

/* Every task of every job runs exactly once, with that job's context: jobs
 * of random sizes back to back, counting into one array and then the other
 * (the small ones finish before some workers wake, which then arrive while
 * the next job is being set up), first on an idle machine, then with a busy
 * thread per core competing for the cores. */
void test_pool(void)
{
    const long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    pthread_t hog[64];
    int32_t n_hog = 0;
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            atomic_store(&busy_stop, 0);
            for (; n_hog < n_cpu && n_hog < 64; n_hog++)
                if (pthread_create(&hog[n_hog], NULL, busy, NULL) != 0)
                    break;
        }
        for (int32_t nth = 1; nth <= 4; nth++) {
            struct pool *p = pool_init(nth);
            CHECK(p != NULL, "pool_init(%d)", nth);
            if (!p)
                continue;
            for (int rep = 0; rep < 400; rep++) {
                int32_t n = (int32_t)(rnd() % (rep % 2 ? 8 : 1000));
                for (int32_t i = 0; i < 1000; i++)
                    atomic_store(&hits[0][i], 0), atomic_store(&hits[1][i], 0);
                pool_run(p, count_task, hits[rep % 2], n);
                int bad = 0;
                for (int32_t i = 0; i < 1000; i++)
                    bad += (atomic_load(&hits[rep % 2][i]) != (i < n)) + (atomic_load(&hits[1 - rep % 2][i]) != 0);
                CHECK(bad == 0, "%d threads%s, job %d of %d tasks: %d tasks ran other than once", nth,
                      round ? " beside busy threads" : "", rep, n, bad);
            }
            pool_free(p);
        }
    }
    atomic_store(&busy_stop, 1);
    for (int32_t i = 0; i < n_hog; i++)
        pthread_join(hog[i], NULL);
}

static const struct kern *const tables[] = {&kern_avx2, &kern_avx512};

void test_kern_matmul(void)
{
    int tested = 0;
    for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
        const struct kern *k = tables[ti];
        if (!kern_supported(k)) {
            printf("  (%s not supported by this CPU: skipped)\n", k->name);
            continue;
        }
        tested++;
        for (int rep = 0; rep < 200; rep++) {
            int32_t nx = 1 + (int32_t)(rnd() % KERN_MAX_NX);
            int64_t kk = 1 + (int64_t)(rnd() % 300), m = 1 + (int64_t)(rnd() % 40);
            int64_t xs = kk + (int64_t)(rnd() % 3), ws = kk + (int64_t)(rnd() % 3), os = m + 1;
            int64_t j0 = (int64_t)(rnd() % (uint64_t)m), j1 = j0 + 1 + (int64_t)(rnd() % (uint64_t)(m - j0));
            enum dtype wt = (enum dtype)(rnd() % 3); /* F32, F16, BF16 */
            float *x = malloc(sizeof(float) * (size_t)(nx * xs));
            void *w = malloc(4 * (size_t)(m * ws));
            float *o1 = calloc((size_t)(nx * os), sizeof(float)), *o2 = calloc((size_t)(nx * os), sizeof(float));
            float *wf = malloc(sizeof(float) * (size_t)(m * ws));
            for (int64_t i = 0; i < nx * xs; i++)
                x[i] = rndf();
            for (int64_t i = 0; i < m * ws; i++) {
                float v = rndf();
                if (wt == DT_F32)
                    ((float *)w)[i] = wf[i] = v;
                else if (wt == DT_BF16)
                    wf[i] = bf16_to_f32(((uint16_t *)w)[i] = f32_to_bf16(v));
                else {
                    uint16_t h = (uint16_t)(rnd() & 0x7bff); /* finite f16, any exponent */
                    h = (uint16_t)((h & 0x3fff) | ((rnd() & 1) << 15));
                    ((uint16_t *)w)[i] = h;
                    wf[i] = f16_to_f32(h);
                }
            }
            kern_matmul_fn fa = wt == DT_F32 ? kern_ref.matmul_f32 : wt == DT_BF16 ? kern_ref.matmul_bf16 : kern_ref.matmul_f16;
            kern_matmul_fn fb = wt == DT_F32 ? k->matmul_f32 : wt == DT_BF16 ? k->matmul_bf16 : k->matmul_f16;
            fa(x, xs, nx, w, ws, kk, o1, os, j0, j1);
            fb(x, xs, nx, w, ws, kk, o2, os, j0, j1);
            /* a token alone (decode) has the bits it has in a batch (a
             * server's step, a KFlash tree), in either table */
            float *alone = calloc((size_t)os, sizeof(float));
            for (int32_t t = 0; t < nx; t++) {
                fb(x + t * xs, xs, 1, w, ws, kk, alone, os, j0, j1);
                CHECK(memcmp(alone + j0, o2 + t * os + j0, (size_t)(j1 - j0) * sizeof(float)) == 0,
                      "%s %s: row %d of %d differs alone, k=%lld", k->name, dtype_name(wt), t, nx, (long long)kk);
                fa(x + t * xs, xs, 1, w, ws, kk, alone, os, j0, j1);
                CHECK(memcmp(alone + j0, o1 + t * os + j0, (size_t)(j1 - j0) * sizeof(float)) == 0,
                      "ref %s: row %d of %d differs alone, k=%lld", dtype_name(wt), t, nx, (long long)kk);
            }
            free(alone);
            for (int32_t t = 0; t < nx; t++)
                for (int64_t j = 0; j < m; j++) {
                    double mag = 0;
                    for (int64_t c = 0; c < kk; c++)
                        mag += fabs((double)x[t * xs + c] * wf[j * ws + c]);
                    float a = o1[t * os + j], b = o2[t * os + j];
                    int inside = j >= j0 && j < j1;
                    /* worst-case bound of two fp32 sums of kk terms in different orders */
                    CHECK(inside ? fabs(a - b) <= 2.0 * (double)kk * 6e-8 * mag + 1e-30 : a == 0 && b == 0,
                          "%s %s nx=%d k=%lld j=%lld [%lld,%lld): ref %g simd %g", k->name, dtype_name(wt), nx,
                          (long long)kk, (long long)j, (long long)j0, (long long)j1, a, b);
                }
            free(x);
            free(w);
            free(o1);
            free(o2);
            free(wf);
        }
    }
    printf("  %d SIMD table(s) compared with the scalar reference\n", tested);
}

/* A value for the bf16 path's tests: mostly in [-1, 1), one in 16 around
 * 2^-66 (so that a product of two falls under fp32's normal range and is
 * flushed, and an activation is an fp32 denormal) */
static float bf16_case(void)
{
    const float v = rndf();
    return rnd() % 16 ? v : v * 0x1p-66f * (rnd() % 2 ? 0x1p-60f : 1.0f);
}

/* The bf16 path: kern_bf16_round's known answers; each table's rounding and
 * products the reference's bit for bit (tails of k past a 32-element chunk,
 * any row range, denormal inputs and results), a token alone the bits it
 * has in its tile; the error against the exact product of the unrounded
 * activations within their rounding, 2^-8 of sum |x w|, plus fp32's sums;
 * and the cpu backend's products (a batch, its tokens alone) those bits. */
void test_kern_bf16(void)
{
    CHECK(kern_bf16_round(1.0f + 0x1p-8f) == 0x3f80 && kern_bf16_round(1.0f + 3 * 0x1p-8f) == 0x3f82,
          "bf16 ties to even");
    CHECK(kern_bf16_round(0x1p-130f) == 0 && kern_bf16_round(-0x1p-130f) == 0x8000, "fp32 denormals to zero");
    CHECK(kern_bf16_round(0x1p-126f) == 0x0080 && kern_bf16_round(FLT_MAX) == 0x7f80, "smallest normal, overflow");
    CHECK(kern_bf16_round(NAN) == (f32_to_bf16(NAN) | 0x40), "NaN stays quiet");
    const struct kern *const all[] = {&kern_ref, &kern_avx2, &kern_avx512};
    int tested = 0;
    for (size_t ti = 0; ti < sizeof all / sizeof all[0]; ti++) {
        const struct kern *k = all[ti];
        if (!kern_bf16_supported(k)) {
            printf("  (%s: no bf16 path on this CPU: skipped)\n", k->name);
            continue;
        }
        tested++;
        /* a denormal weight is read as zero; a product under fp32's normal range is flushed */
        const uint16_t big = f32_to_bf16(0x1p100f), tiny = f32_to_bf16(0x1p-66f), den = 0x0001;
        float o = 1;
        k->matmul_bf16_bf16(&big, 1, 1, &den, 1, 1, &o, 1, 0, 1);
        CHECK(o == 0, "%s: 2^100 times a denormal %g, not 0", k->name, o);
        k->matmul_bf16_bf16(&tiny, 1, 1, &tiny, 1, 1, &o, 1, 0, 1);
        CHECK(o == 0, "%s: 2^-132 %g, not flushed", k->name, o);
        for (int rep = 0; rep < 300; rep++) {
            const int32_t nx = 1 + (int32_t)(rnd() % KERN_MAX_NX);
            const int64_t kk = 1 + (int64_t)(rnd() % 300), m = 1 + (int64_t)(rnd() % 40);
            const int64_t xs = kk + (int64_t)(rnd() % 40), ws = kk + (int64_t)(rnd() % 3), os = m + 1;
            const int64_t j0 = (int64_t)(rnd() % (uint64_t)m), j1 = j0 + 1 + (int64_t)(rnd() % (uint64_t)(m - j0));
            float *x = malloc(sizeof(float) * (size_t)(nx * xs));
            uint16_t *xb = malloc(2 * (size_t)(nx * xs)), *xr = malloc(2 * (size_t)(nx * xs));
            uint16_t *w = malloc(2 * (size_t)(m * ws));
            float *o1 = calloc((size_t)(nx * os), sizeof(float)), *o2 = calloc((size_t)(nx * os), sizeof(float));
            float *alone = calloc((size_t)os, sizeof(float));
            for (int64_t i = 0; i < nx * xs; i++)
                x[i] = bf16_case();
            for (int64_t i = 0; i < m * ws; i++)
                w[i] = rnd() % 64 ? f32_to_bf16(bf16_case()) : (uint16_t)(rnd() % 0x80); /* some bf16 denormals */
            for (int32_t t = 0; t < nx; t++) {
                kern_ref.bf16_round(x + t * xs, kk, xr + t * xs);
                k->bf16_round(x + t * xs, kk, xb + t * xs);
                CHECK(memcmp(xr + t * xs, xb + t * xs, (size_t)kk * 2) == 0, "%s: bf16_round k=%lld differs", k->name,
                      (long long)kk);
            }
            kern_ref.matmul_bf16_bf16(xr, xs, nx, w, ws, kk, o1, os, j0, j1);
            k->matmul_bf16_bf16(xb, xs, nx, w, ws, kk, o2, os, j0, j1);
            CHECK(memcmp(o1, o2, sizeof(float) * (size_t)(nx * os)) == 0, "%s: matmul_bf16_bf16 nx=%d k=%lld differs",
                  k->name, nx, (long long)kk);
            for (int32_t t = 0; t < nx; t++) {
                k->matmul_bf16_bf16(xb + t * xs, xs, 1, w, ws, kk, alone, os, j0, j1);
                CHECK(memcmp(alone + j0, o2 + t * os + j0, (size_t)(j1 - j0) * sizeof(float)) == 0,
                      "%s: row %d of %d differs alone, k=%lld", k->name, t, nx, (long long)kk);
                for (int64_t j = j0; j < j1; j++) {
                    double exact = 0, mag = 0;
                    for (int64_t c = 0; c < kk; c++) {
                        exact += (double)x[t * xs + c] * bf16_to_f32(w[j * ws + c]);
                        mag += fabs((double)x[t * xs + c] * bf16_to_f32(w[j * ws + c]));
                    }
                    CHECK(fabs(o2[t * os + j] - exact) <= (0x1p-8 + 2.0 * (double)kk * 6e-8) * mag + 1e-30,
                          "%s: %g off the exact %g (k=%lld)", k->name, o2[t * os + j], exact, (long long)kk);
                }
            }
            free(x);
            free(xb);
            free(xr);
            free(w);
            free(o1);
            free(o2);
            free(alone);
        }
    }
    printf("  %d table(s) with a bf16 path compared with the reference\n", tested);

    /* the cpu backend's default for BF16 weights: a batch (its activations
     * rounded once, the rows split over the workers) and each token alone,
     * the reference's bits */
    const struct kern *best = kern_bf16_supported(kern_best()) ? kern_best() : &kern_ref;
    const int64_t m = 37, kk = 1000, nx = 11;
    struct backend *be = cpu_backend_init(2, best);
    uint16_t *w = malloc(2 * (size_t)(m * kk)), *xr = malloc(2 * (size_t)(nx * kk));
    float *x = malloc(4 * (size_t)(nx * kk)), *ref = malloc(4 * (size_t)(nx * m));
    for (int64_t i = 0; i < m * kk; i++)
        w[i] = f32_to_bf16(rndf());
    for (int64_t i = 0; i < nx * kk; i++)
        x[i] = rndf();
    for (int64_t t = 0; t < nx; t++)
        kern_ref.bf16_round(x + t * kk, kk, xr + t * kk);
    kern_ref.matmul_bf16_bf16(xr, kk, (int32_t)nx, w, kk, kk, ref, m, 0, m);
    struct tensor hw = {DT_BF16, m, kk, kk, w, false}, wt, xt, ot;
    CHECK(be->ops->weight(be, &wt, &hw) == 0, "weights");
    be->ops->alloc(be, &xt, DT_F32, nx, kk);
    be->ops->alloc(be, &ot, DT_F32, nx, m);
    be->ops->write(be, &xt, 0, nx, x);
    be->ops->matmul(be, &ot, &xt, &wt);
    CHECK(memcmp(ot.data, ref, (size_t)(nx * m) * 4) == 0, "%s: the backend's batch differs", best->name);
    for (int64_t r = 0; r < nx; r++) {
        struct tensor xo = tensor_rows(&xt, r, 1), oo = tensor_rows(&ot, 0, 1);
        be->ops->matmul(be, &oo, &xo, &wt);
        CHECK(memcmp(oo.data, ref + r * m, (size_t)m * 4) == 0, "%s: token %lld alone differs", best->name,
              (long long)r);
    }
    be->ops->release(be, &xt);
    be->ops->release(be, &ot);
    be->ops->release(be, &wt);
    be->ops->free(be);
    free(w);
    free(xr);
    free(x);
    free(ref);
}

void test_kern_vector(void)
{
    for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
        const struct kern *k = tables[ti];
        if (!kern_supported(k))
            continue;
        for (int rep = 0; rep < 200; rep++) {
            int64_t n = (int64_t)(rnd() % 257);
            float a[260], b[260], y1[260], y2[260];
            double mag = 0, sq = 0;
            for (int64_t i = 0; i < n; i++) {
                a[i] = rndf();
                b[i] = rndf();
                y1[i] = y2[i] = rndf();
                mag += fabs((double)a[i] * b[i]);
                sq += (double)a[i] * a[i];
            }
            float d1 = kern_ref.dot(a, b, n), d2 = k->dot(a, b, n);
            CHECK(fabs(d1 - d2) <= 2.0 * (double)n * 6e-8 * mag + 1e-30, "%s dot n=%lld: %g vs %g", k->name, (long long)n, d1, d2);
            float s1 = kern_ref.sumsq(a, n), s2 = k->sumsq(a, n);
            CHECK(fabs(s1 - s2) <= 2.0 * (double)n * 6e-8 * sq + 1e-30, "%s sumsq n=%lld: %g vs %g", k->name, (long long)n, s1, s2);
            float al = rndf();
            kern_ref.axpy(y1, al, a, n);
            k->axpy(y2, al, a, n);
            for (int64_t i = 0; i < n; i++)
                CHECK(fabsf(y1[i] - y2[i]) <= 1e-6f, "%s axpy n=%lld i=%lld", k->name, (long long)n, (long long)i);
            kern_ref.scale(y1, al, n);
            k->scale(y2, al, n);
            for (int64_t i = 0; i < n; i++)
                CHECK(fabsf(y1[i] - y2[i]) <= 1e-6f, "%s scale n=%lld i=%lld", k->name, (long long)n, (long long)i);
        }
    }
}

/* The attention kernels: kern_exp against expf; in every table a key's score,
 * exponential and multiply-adds are bitwise what dot, kern_exp and axpy give
 * for it alone (wherever it stands in the chunk), and agree with kern_ref. */
void test_kern_attention(void)
{
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        const float x = -87.0f * (float)i / 200000;
        const double want = exp((double)x), got = kern_exp(x);
        worst = fmax(worst, fabs(got - want) / want);
    }
    CHECK(worst < 3e-7, "kern_exp: relative error %.3g", worst);
    CHECK(kern_exp(0.0f) == 1.0f && kern_exp(-200.0f) > 0 && kern_exp(-200.0f) < 2e-38f, "kern_exp ends");
    enum { HD = 200, N = 67, NQ = 7 };
    static float keys[N][HD], vals[N][HD], qs[NQ][HD];
    static uint16_t keys16[N][HD], vals16[N][HD]; /* a bf16 cache's rows */
    const float *kr[N], *vr[N], *q[NQ];
    const uint16_t *kr16[N], *vr16[N];
    for (int t = 0; t < N; t++) {
        for (int c = 0; c < HD; c++) {
            keys[t][c] = rndf(), vals[t][c] = rndf();
            keys16[t][c] = f32_to_bf16(keys[t][c]), vals16[t][c] = f32_to_bf16(vals[t][c]);
        }
        kr[t] = keys[t];
        vr[t] = vals[t];
        kr16[t] = keys16[t];
        vr16[t] = vals16[t];
    }
    for (int a = 0; a < NQ; a++) {
        for (int c = 0; c < HD; c++)
            qs[a][c] = rndf();
        q[a] = qs[a];
    }
    const struct kern *all[] = {&kern_ref, &kern_avx2, &kern_avx512};
    for (size_t ti = 0; ti < sizeof all / sizeof all[0]; ti++) {
        const struct kern *k = all[ti];
        if (!kern_supported(k))
            continue;
        for (int rep = 0; rep < 60; rep++) {
            const int32_t n = (int32_t)(rnd() % (N + 1)), off = n < N ? (int32_t)(rnd() % (uint64_t)(N - n + 1)) : 0;
            const int32_t nq = 1 + (int32_t)(rnd() % NQ);
            const int64_t hd = 1 + (int64_t)(rnd() % HD);
            static float s[NQ][N], sr[NQ][N], e[NQ][N], ys[3][NQ][HD];
            float *y[NQ], *y1[NQ], *yr[NQ];
            for (int bf = 0; bf < 2; bf++) { /* f32 rows, then a bf16 cache's */
                if (bf) {
                    k->scores_bf16(q, nq, kr16 + off, n, hd, 0.125f, s[0], N);
                    kern_ref.scores_bf16(q, nq, kr16 + off, n, hd, 0.125f, sr[0], N);
                } else {
                    k->scores(q, nq, kr + off, n, hd, 0.125f, s[0], N);
                    kern_ref.scores(q, nq, kr + off, n, hd, 0.125f, sr[0], N);
                }
                for (int32_t a = 0; a < nq; a++)
                    for (int32_t t = 0; t < n; t++) {
                        float one;
                        if (bf)
                            k->scores_bf16(q + a, 1, kr16 + off + t, 1, hd, 0.125f, &one, 1);
                        else
                            k->scores(q + a, 1, kr + off + t, 1, hd, 0.125f, &one, 1);
                        CHECK(s[a][t] == one, "%s scores (bf16 %d) nq %d n %d (%d, %d): not the pair's alone", k->name,
                              bf, nq, n, a, t);
                        CHECK(fabsf(s[a][t] - sr[a][t]) <= 2e-6f * (float)hd, "%s scores (bf16 %d): %g vs ref %g",
                              k->name, bf, s[a][t], sr[a][t]);
                    }
                for (int32_t a = 0; a < nq; a++) {
                    float mx = -INFINITY;
                    for (int32_t t = 0; t < n; t++) {
                        mx = s[a][t] > mx ? s[a][t] : mx;
                        e[a][t] = s[a][t];
                    }
                    const float sum = k->exp_sum(e[a], n, mx);
                    double ref_sum = 0;
                    for (int32_t t = 0; t < n; t++) {
                        CHECK(e[a][t] == kern_exp(s[a][t] - mx), "%s exp_sum n %d t %d: not kern_exp's", k->name, n, t);
                        ref_sum += e[a][t];
                    }
                    CHECK(fabs(sum - ref_sum) <= 1e-6 * (double)n * (ref_sum + 1), "%s exp_sum: %g vs %g", k->name, sum,
                          ref_sum);
                }
                for (int32_t a = 0; a < nq; a++) {
                    y[a] = ys[0][a], y1[a] = ys[1][a], yr[a] = ys[2][a];
                    for (int64_t c = 0; c < hd; c++)
                        y[a][c] = y1[a][c] = yr[a][c] = rndf();
                }
                if (bf) {
                    k->axpy_rows_bf16(y, nq, e[0], N, vr16 + off, n, hd);
                    kern_ref.axpy_rows_bf16(yr, nq, e[0], N, vr16 + off, n, hd);
                    for (int32_t a = 0; a < nq; a++)
                        for (int32_t t = 0; t < n; t++)
                            k->axpy_rows_bf16(y1 + a, 1, &e[a][t], 1, vr16 + off + t, 1, hd);
                } else {
                    k->axpy_rows(y, nq, e[0], N, vr + off, n, hd);
                    kern_ref.axpy_rows(yr, nq, e[0], N, vr + off, n, hd);
                    for (int32_t a = 0; a < nq; a++)
                        for (int32_t t = 0; t < n; t++)
                            k->axpy(y1[a], e[a][t], vr[off + t], hd);
                }
                for (int32_t a = 0; a < nq; a++)
                    for (int64_t c = 0; c < hd; c++) {
                        CHECK(y[a][c] == y1[a][c], "%s axpy_rows (bf16 %d) nq %d n %d hd %lld (%d, %lld): not row by row",
                              k->name, bf, nq, n, (long long)hd, a, (long long)c);
                        CHECK(fabsf(y[a][c] - yr[a][c]) <= 1e-5f * (float)(n + 1), "%s axpy_rows (bf16 %d): %g vs ref %g",
                              k->name, bf, y[a][c], yr[a][c]);
                    }
            }
        }
    }
}

void test_dtype_conversions(void)
{
    /* every finite f16 survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
            continue; /* NaN */
        uint16_t back = f32_to_f16(f16_to_f32((uint16_t)h));
        CHECK(back == h, "f16 %04x -> %g -> %04x", h, f16_to_f32((uint16_t)h), back);
    }
    /* ties to even, overflow, underflow */
    CHECK(f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "tie rounds to even (down)");
    CHECK(f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "tie rounds to even (up)");
    CHECK(f32_to_f16(70000.0f) == 0x7c00 && f32_to_f16(-1e-10f) == 0x8000, "overflow and underflow");
    CHECK(f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80 && f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "bf16 ties to even");
    CHECK(bf16_to_f32(f32_to_bf16(-2.5f)) == -2.5f, "bf16 exact value");
}
