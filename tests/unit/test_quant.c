/* Tests of the block types: dequantisation against llama.cpp's own code
 * (tests/data/quant, known-answer vectors), ggml's reference quantiser bit
 * for bit where one exists, the error of every quantiser, every kern table's
 * dequantisation bitwise against the reference, the cpu backend's precise
 * products on block weights against the same product over their fp32
 * values, and the int8 path (matmul_q8) bitwise against its reference and
 * within its stated error of the exact product. */
#include "../../src/backend/cpu/cpu.h"
#include "../../src/backend/cpu/kern.h"
#include "../../src/base/dtype.h"
#include "../../src/quant/blocks.h"
#include "../../src/quant/quant.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float rndf(void) { return (float)((double)(rnd() >> 11) * 0x1.0p-53 * 2 - 1); }
/* roughly normal: the sum of four uniforms */
static float rndn(void) { return (rndf() + rndf() + rndf() + rndf()) * 0.866f; }

static const enum dtype block_types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0,   DT_Q2_K,    DT_Q3_K,
                                         DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_IQ4_NL, DT_IQ4_XS, DT_IQ2_XXS};
#define N_BLOCK_TYPES (int)(sizeof block_types / sizeof block_types[0])

/* Random bytes with every f16 field of the layout a moderate finite value. */
static void random_blocks(enum dtype t, uint8_t *p, int64_t n_blocks)
{
    const size_t bb = dtype_block_bytes(t);
    for (size_t i = 0; i < bb * (size_t)n_blocks; i++)
        p[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < n_blocks; b++, p += bb) {
        size_t off[2] = {0, (size_t)-1};
        switch (t) {
        case DT_Q4_1:
        case DT_Q5_1:
        case DT_Q4_K:
        case DT_Q5_K: off[1] = 2; break;
        case DT_Q2_K: off[0] = offsetof(struct block_q2_k, d), off[1] = offsetof(struct block_q2_k, dmin); break;
        case DT_Q3_K: off[0] = offsetof(struct block_q3_k, d); break;
        case DT_Q6_K: off[0] = offsetof(struct block_q6_k, d); break;
        default: break;
        }
        for (int k = 0; k < 2; k++)
            if (off[k] != (size_t)-1) {
                const uint16_t h = f32_to_f16(rndf() * 0.05f);
                memcpy(p + off[k], &h, 2);
            }
    }
}

static const char *quant_data_dir(void)
{
    const char *d = getenv("KAPITSA_QUANT_DATA");
    return d && *d ? d : "tests/data/quant";
}

static void *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)sz);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return p;
}

/* Every type's vector: our dequantisation (the reference and each kern
 * table) equals gguf-py's bit for bit; where gguf-py quantises, ours gives
 * its bytes. */
void test_quant_known_answers(void)
{
    const struct kern *tables[] = {&kern_ref, &kern_avx2, &kern_avx512};
    for (int i = 0; i < N_BLOCK_TYPES; i++) {
        const enum dtype t = block_types[i];
        char path[512];
        snprintf(path, sizeof path, "%s/%s.bin", quant_data_dir(), dtype_name(t));
        size_t n_file;
        uint8_t *f = read_all(path, &n_file);
        CHECK(f != NULL, "%s missing", path);
        if (!f)
            continue;
        uint32_t hdr[4];
        memcpy(hdr, f, sizeof hdr);
        const int64_t n = hdr[2];
        const size_t qb = dtype_bytes(t, n), want = 16 + qb + (size_t)n * 4 + (hdr[3] ? (size_t)n * 4 + qb : 0);
        CHECK(hdr[0] == 0x3156514bu && hdr[1] == (uint32_t)dtype_traits[t].ggml && n % dtype_block(t) == 0 &&
                  n_file == want,
              "%s: header or size wrong", path);
        if (n_file != want) {
            free(f);
            continue;
        }
        const uint8_t *q = f + 16;
        float *ref = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        memcpy(ref, q + qb, (size_t)n * 4);
        for (size_t k = 0; k < sizeof tables / sizeof tables[0]; k++) {
            if (!kern_supported(tables[k]))
                continue;
            memset(y, 0, (size_t)n * 4);
            tables[k]->dequant(t, q, n, y);
            int64_t bad = 0;
            for (int64_t e = 0; e < n; e++)
                bad += memcmp(&y[e], &ref[e], 4) != 0;
            CHECK(bad == 0, "%s dequant (%s): %lld of %lld values differ", dtype_name(t), tables[k]->name,
                  (long long)bad, (long long)n);
        }
        if (hdr[3]) {
            const float *x = (const float *)(q + qb + (size_t)n * 4);
            const uint8_t *want_q = q + qb + (size_t)n * 8;
            uint8_t *got = malloc(qb);
            CHECK(quant_quantize(t, x, n, NULL, got) == 0, "%s quantize", dtype_name(t));
            CHECK(memcmp(got, want_q, qb) == 0, "%s: quantised bytes differ from ggml's reference", dtype_name(t));
            free(got);
        }
        free(ref);
        free(y);
        free(f);
    }
}

/* Each kern table's dequantisation is the reference's, bit for bit, on
 * random blocks. */
void test_quant_dequant_tables(void)
{
    const struct kern *tables[] = {&kern_avx2, &kern_avx512};
    for (int i = 0; i < N_BLOCK_TYPES; i++) {
        const enum dtype t = block_types[i];
        const int64_t n = 4 * QK_K;
        uint8_t *q = malloc(dtype_bytes(t, n));
        float *ref = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        random_blocks(t, q, n / dtype_block(t));
        quant_dequant(t, q, n, ref);
        for (size_t k = 0; k < sizeof tables / sizeof tables[0]; k++) {
            if (!kern_supported(tables[k]))
                continue;
            tables[k]->dequant(t, q, n, y);
            CHECK(memcmp(y, ref, (size_t)n * 4) == 0, "%s: %s dequant differs from the reference", dtype_name(t),
                  tables[k]->name);
        }
        free(q);
        free(ref);
        free(y);
    }
}

/* Quantising normal-ish rows with outliers and back: the relative RMS error
 * of each type stays under its bound (what its bits allow, with margin), the
 * importance-weighted error drops where importance is given, and
 * quantising the dequantised values again changes nothing much. */
void test_quant_roundtrip_error(void)
{
    static const struct {
        enum dtype t;
        double bound;
    } cases[] = {{DT_Q8_0, 0.008}, {DT_Q6_K, 0.025}, {DT_Q5_K, 0.045}, {DT_Q5_0, 0.06},   {DT_Q5_1, 0.05},
                 {DT_Q4_K, 0.08},  {DT_Q4_0, 0.12}, {DT_Q4_1, 0.1},  {DT_IQ4_NL, 0.1}, {DT_IQ4_XS, 0.1},
                 {DT_Q3_K, 0.18},  {DT_Q2_K, 0.38}, {DT_IQ2_XXS, 0.45}};
    const int64_t n = 64 * QK_K;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *imp = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        x[i] = rndn() * (1 + (float)(i / 256 % 7)) * ((rnd() & 255) == 0 ? 6.0f : 1.0f);
        imp[i] = (i % 16) == 3 ? 100.0f : 1.0f;
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const enum dtype t = cases[c].t;
        uint8_t *q = malloc(dtype_bytes(t, n));
        CHECK(quant_quantize(t, x, n, NULL, q) == 0, "%s", dtype_name(t));
        quant_dequant(t, q, n, y);
        double e2 = 0, x2 = 0;
        for (int64_t i = 0; i < n; i++) {
            e2 += (double)(y[i] - x[i]) * (y[i] - x[i]);
            x2 += (double)x[i] * x[i];
        }
        const double rel = sqrt(e2 / x2);
        CHECK(rel < cases[c].bound, "%s: relative RMS error %.4f, bound %.4f", dtype_name(t), rel, cases[c].bound);
        if (t != DT_Q8_0 && t != DT_Q4_0 && t != DT_Q4_1 && t != DT_Q5_0 && t != DT_Q5_1) {
            /* the important columns' error with and without the importance */
            double ew[2] = {0, 0};
            for (int pass = 0; pass < 2; pass++) {
                quant_quantize(t, x, n, pass ? imp : NULL, q);
                quant_dequant(t, q, n, y);
                for (int64_t i = 3; i < n; i += 16)
                    ew[pass] += (double)(y[i] - x[i]) * (y[i] - x[i]);
            }
            CHECK(ew[1] < ew[0], "%s: importance did not lower the important columns' error (%g vs %g)",
                  dtype_name(t), ew[1], ew[0]);
        }
        free(q);
    }
    /* all zeros and a lone value stay finite */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const enum dtype t = cases[c].t;
        float z[QK_K] = {0}, out[QK_K];
        uint8_t q[QK_K * 2];
        z[17] = 3.0f;
        /* IQ2_XXS has no zero: its smallest magnitude is 8/43 of its largest */
        const float small = t == DT_IQ2_XXS ? 3.0f * 8 / 43 + 0.01f : 0.5f;
        for (int pass = 0; pass < 2; pass++) {
            quant_quantize(t, z, QK_K, NULL, q);
            quant_dequant(t, q, QK_K, out);
            int finite = 1;
            for (int i = 0; i < QK_K; i++)
                finite &= isfinite(out[i]) && (pass || i == 17 || fabsf(out[i]) < small);
            CHECK(finite, "%s: degenerate block", dtype_name(t));
            z[17] = 0;
        }
    }
    free(x);
    free(y);
    free(imp);
}

/* Every table's matmul_q on random blocks of each type, k from one
 * super-block to 2048, row ranges cut anywhere (tiles and the rows after
 * them), 1 to 4 tokens: the same bits as the table's own dequant then
 * matmul_f32, each token alone the same bits as in its tile, and within
 * fp32 reordering error of the reference. Then the cpu backend with each
 * table, rows not a multiple of any tile, 1 to 11 tokens: every batch's rows
 * the bits of the 11-token batch (fused and dequantised paths agree) and of
 * the product over the fp32 weights. */
void test_quant_cpu_matmul(void)
{
    const struct kern *tables[] = {&kern_ref, &kern_avx2, &kern_avx512};
    const int64_t ks[] = {256, 512, 1024, 2048};
    const int64_t m = 13, os = 16, nx_max = 11;
    float *x = malloc((size_t)(KERN_MAX_NX * 2048) * 4), *wf = malloc((size_t)(m * 2048) * 4);
    for (int64_t i = 0; i < KERN_MAX_NX * 2048; i++)
        x[i] = rndn();
    for (int i = 0; i < N_BLOCK_TYPES; i++) {
        const enum dtype t = block_types[i];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t k = ks[ki];
            uint8_t *w = malloc(dtype_bytes(t, m * k));
            random_blocks(t, w, m * k / dtype_block(t));
            for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
                const struct kern *kt = tables[ti];
                if (!kern_supported(kt))
                    continue;
                kt->dequant(t, w, m * k, wf);
                for (int32_t nx = 1; nx <= KERN_MAX_NX; nx++) {
                    const int64_t j0 = (int64_t)(rnd() % 4), j1 = m - (int64_t)(rnd() % 3);
                    float want[KERN_MAX_NX * 16] = {0}, got[KERN_MAX_NX * 16] = {0}, ref[KERN_MAX_NX * 16] = {0};
                    if (!kt->matmul_q(t, x, k, nx, w, k, k, got, os, j0, j1)) {
                        CHECK(kt != &kern_ref && t == DT_IQ2_XXS, "%s: %s has no block product", kt->name,
                              dtype_name(t));
                        continue;
                    }
                    kt->matmul_f32(x, k, nx, wf, k, k, want, os, j0, j1);
                    kern_ref.matmul_q(t, x, k, nx, w, k, k, ref, os, j0, j1);
                    CHECK(memcmp(got, want, sizeof got) == 0, "%s %s k=%lld nx=%d: differs from dequant + matmul_f32",
                          kt->name, dtype_name(t), (long long)k, nx);
                    for (int32_t a = 0; a < nx; a++) {
                        float alone[16] = {0};
                        kt->matmul_q(t, x + a * k, k, 1, w, k, k, alone, os, j0, j1);
                        CHECK(memcmp(alone, got + a * os, sizeof alone) == 0, "%s %s k=%lld: token %d of %d alone differs",
                              kt->name, dtype_name(t), (long long)k, a, nx);
                        for (int64_t j = j0; j < j1; j++) {
                            double mag = 0;
                            for (int64_t c = 0; c < k; c++)
                                mag += fabs((double)x[a * k + c] * wf[j * k + c]);
                            CHECK(fabs(got[a * os + j] - ref[a * os + j]) <= 2.0 * (double)k * 6e-8 * mag + 1e-30,
                                  "%s %s k=%lld: %g, reference %g", kt->name, dtype_name(t), (long long)k,
                                  got[a * os + j], ref[a * os + j]);
                        }
                    }
                }
            }
            free(w);
        }
    }
    free(x);
    free(wf);

    for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
        if (!kern_supported(tables[ti]))
            continue;
        for (int i = 0; i < N_BLOCK_TYPES; i++) {
            const enum dtype t = block_types[i];
            const int64_t rows = 37, k = i % 2 ? 512 : 1024;
            struct backend *be = cpu_backend_init(2, tables[ti]);
            cpu_backend_set_precise(be, true);
            float *f = malloc((size_t)(rows * k) * 4), *xs = malloc((size_t)(nx_max * k) * 4);
            uint8_t *wq = malloc(dtype_bytes(t, rows * k));
            random_blocks(t, wq, rows * k / dtype_block(t));
            quant_dequant(t, wq, rows * k, f);
            for (int64_t e = 0; e < nx_max * k; e++)
                xs[e] = rndn();
            struct tensor hq = {t, rows, k, k, wq, false}, hf = {DT_F32, rows, k, k, f, false}, wqt, wft, xt, o1, o2, o3;
            CHECK(be->ops->weight(be, &wqt, &hq) == 0 && be->ops->weight(be, &wft, &hf) == 0, "weights");
            be->ops->alloc(be, &xt, DT_F32, nx_max, k);
            be->ops->alloc(be, &o1, DT_F32, nx_max, rows);
            be->ops->alloc(be, &o2, DT_F32, nx_max, rows);
            be->ops->alloc(be, &o3, DT_F32, nx_max, rows);
            be->ops->write(be, &xt, 0, nx_max, xs);
            be->ops->matmul(be, &o1, &xt, &wqt);
            be->ops->matmul(be, &o2, &xt, &wft);
            CHECK(memcmp(o1.data, o2.data, (size_t)(nx_max * rows) * 4) == 0, "%s %s: batch product differs from fp32's",
                  tables[ti]->name, dtype_name(t));
            for (int64_t n = 1; n < nx_max; n++)
                for (int64_t r0 = 0; r0 + n <= nx_max; r0 += n) {
                    struct tensor xr = tensor_rows(&xt, r0, n), or = tensor_rows(&o3, 0, n);
                    be->ops->matmul(be, &or, &xr, &wqt);
                    CHECK(memcmp(o3.data, (float *)o1.data + r0 * rows, (size_t)(n * rows) * 4) == 0,
                          "%s %s: tokens %lld..%lld differ from their rows in the batch", tables[ti]->name,
                          dtype_name(t), (long long)r0, (long long)(r0 + n - 1));
                }
            be->ops->release(be, &xt);
            be->ops->release(be, &o1);
            be->ops->release(be, &o2);
            be->ops->release(be, &o3);
            be->ops->release(be, &wqt);
            be->ops->release(be, &wft);
            be->ops->free(be);
            free(f);
            free(xs);
            free(wq);
        }
    }
}

/* The int8 path: each table's rounding of the activations and products are
 * kern_ref's bit for bit; the cpu backend's fast products (a batch, its
 * tokens alone) are those bits; and the error against the exact product of
 * the dequantised weights stays within what rounding each activation to
 * its block's d / 2 allows, sum |w| d / 2. The relative error (rms over all
 * products; normal activations, one in 97 twenty times larger) measured
 * 1.1-1.2% for the types with blocks of 32 (Q8_0, Q4_0, Q5_0, IQ4_NL),
 * 2.3-2.8% for the K-quants and IQ4_XS (one d per 256 activations):
 * bounded at 1.4% and 3.5%. */
void test_quant_q8(void)
{
    static const enum dtype types[] = {DT_Q8_0, DT_Q4_K, DT_Q6_K, DT_Q5_K,   DT_Q3_K,
                                       DT_Q2_K, DT_Q4_0, DT_Q5_0, DT_IQ4_NL, DT_IQ4_XS};
    const int64_t ks[] = {256, 1024, 3072};
    const int64_t m = 13, nx = 11;
    const struct kern *best = kern_best();
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum dtype t = types[ti];
        double e2 = 0, y2 = 0;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t k = ks[ki], rb = kern_q8_row_bytes(t, k);
            CHECK(rb > 0, "%s k=%lld: no int8 layout", dtype_name(t), (long long)k);
            uint8_t *w = malloc(dtype_bytes(t, m * k)), *xq = malloc((size_t)(nx * rb)), *xq2 = malloc((size_t)(nx * rb));
            float *x = malloc((size_t)(nx * k) * 4), *wf = malloc((size_t)(m * k) * 4);
            float *ref = malloc((size_t)(nx * m) * 4), *got = malloc((size_t)(nx * m) * 4);
            random_blocks(t, w, m * k / dtype_block(t));
            quant_dequant(t, w, m * k, wf);
            for (int64_t i = 0; i < nx * k; i++)
                x[i] = rndn() * (rnd() % 97 == 0 ? 20.0f : 1.0f);
            for (int64_t r = 0; r < nx; r++)
                kern_ref.q8_quant(t, x + r * k, k, xq + r * rb);
            CHECK(kern_ref.matmul_q8(t, xq, rb, 4, w, k, k, ref, m, 0, m), "ref %s", dtype_name(t));
            for (int64_t r = 4; r < nx; r += 4)
                kern_ref.matmul_q8(t, xq + r * rb, rb, (int32_t)(nx - r < 4 ? nx - r : 4), w, k, k, ref + r * m, m, 0, m);
            /* within the bound of the activations' rounding, and the measured error */
            for (int64_t r = 0; r < nx; r++)
                for (int64_t j = 0; j < m; j++) {
                    const int64_t blk = kern_q8_paired(t) ? 32 : 256;
                    double exact = 0, bound = 0, mag = 0;
                    for (int64_t c0 = 0; c0 < k; c0 += blk) {
                        float amax = 0;
                        for (int64_t c = c0; c < c0 + blk; c++)
                            amax = fabsf(x[r * k + c]) > amax ? fabsf(x[r * k + c]) : amax;
                        for (int64_t c = c0; c < c0 + blk; c++) {
                            exact += (double)x[r * k + c] * wf[j * k + c];
                            mag += fabs((double)x[r * k + c] * wf[j * k + c]);
                            bound += fabs((double)wf[j * k + c]) * amax / 127 / 2;
                        }
                    }
                    const double err = fabs(ref[r * m + j] - exact);
                    CHECK(err <= 1.001 * bound + 1e-6 * mag, "%s k=%lld: %g off the exact %g (bound %g)", dtype_name(t),
                          (long long)k, ref[r * m + j], exact, bound);
                    e2 += err * err;
                    y2 += exact * exact;
                }
            const struct kern *tables[] = {&kern_avx512};
            for (size_t tb = 0; tb < sizeof tables / sizeof tables[0]; tb++) {
                if (!kern_q8_supported(tables[tb]))
                    continue;
                for (int64_t r = 0; r < nx; r++)
                    tables[tb]->q8_quant(t, x + r * k, k, xq2 + r * rb);
                CHECK(memcmp(xq, xq2, (size_t)(nx * rb)) == 0, "%s %s: activations rounded differently",
                      tables[tb]->name, dtype_name(t));
                for (int32_t n = 1; n <= KERN_Q8_MAX_NX; n++) {
                    const int64_t j0 = (int64_t)(rnd() % 4), j1 = m - (int64_t)(rnd() % 3);
                    memset(got, 0, (size_t)(nx * m) * 4);
                    CHECK(tables[tb]->matmul_q8(t, xq2, rb, n, w, k, k, got, m, j0, j1), "%s", dtype_name(t));
                    for (int32_t a = 0; a < n; a++)
                        CHECK(memcmp(got + a * m + j0, ref + a * m + j0, (size_t)(j1 - j0) * 4) == 0,
                              "%s %s k=%lld: token %d of %d differs from the reference", tables[tb]->name,
                              dtype_name(t), (long long)k, a, n);
                }
            }
            /* the backend's default path: a batch and its tokens alone, the reference's bits */
            if (kern_q8_supported(best)) {
                struct backend *be = cpu_backend_init(2, best);
                struct tensor hq = {t, m, k, k, w, false}, wt, xt, ot;
                CHECK(be->ops->weight(be, &wt, &hq) == 0, "weights");
                be->ops->alloc(be, &xt, DT_F32, nx, k);
                be->ops->alloc(be, &ot, DT_F32, nx, m);
                be->ops->write(be, &xt, 0, nx, x);
                be->ops->matmul(be, &ot, &xt, &wt);
                CHECK(memcmp(ot.data, ref, (size_t)(nx * m) * 4) == 0, "%s %s: the backend's batch differs",
                      best->name, dtype_name(t));
                for (int64_t r = 0; r < nx; r++) {
                    struct tensor xr = tensor_rows(&xt, r, 1), or = tensor_rows(&ot, 0, 1);
                    be->ops->matmul(be, &or, &xr, &wt);
                    CHECK(memcmp(or.data, ref + r * m, (size_t)m * 4) == 0, "%s %s: token %lld alone differs",
                          best->name, dtype_name(t), (long long)r);
                }
                be->ops->release(be, &xt);
                be->ops->release(be, &ot);
                be->ops->release(be, &wt);
                be->ops->free(be);
            }
            free(w);
            free(xq);
            free(xq2);
            free(x);
            free(wf);
            free(ref);
            free(got);
        }
        const double rel = sqrt(e2 / y2);
        printf("  q8 %s: relative error %.4f\n", dtype_name(t), rel);
        CHECK(rel < (kern_q8_paired(t) ? 0.014 : 0.035), "%s: relative error %g", dtype_name(t), rel);
    }
}
