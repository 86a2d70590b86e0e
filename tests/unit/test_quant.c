/* Tests of the block types: dequantisation against llama.cpp's own code
 * (tests/data/quant, known-answer vectors), ggml's reference quantiser bit
 * for bit where one exists, the error of every quantiser, every kern table's
 * dequantisation bitwise against the reference, and the cpu backend's
 * products on block weights against the same product over their fp32
 * values. */
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
                 {DT_Q3_K, 0.18},  {DT_Q2_K, 0.38}};
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
        for (int pass = 0; pass < 2; pass++) {
            quant_quantize(t, z, QK_K, NULL, q);
            quant_dequant(t, q, QK_K, out);
            int finite = 1;
            for (int i = 0; i < QK_K; i++)
                finite &= isfinite(out[i]) && (pass || i == 17 || fabsf(out[i]) < 0.5f);
            CHECK(finite, "%s: degenerate block", dtype_name(t));
            z[17] = 0;
        }
    }
    CHECK(quant_quantize(DT_IQ2_XXS, x, QK_K, NULL, y) != 0, "IQ2_XXS quantisation is not written");
    free(x);
    free(y);
    free(imp);
}

/* The cpu backend's products on block weights: the same bits as the
 * product over the dequantised fp32 weights, for one token and in a batch,
 * with a token's row identical in both (the tree == plain invariant). */
void test_quant_cpu_matmul(void)
{
    const enum dtype types[] = {DT_Q8_0, DT_Q4_K, DT_Q6_K, DT_Q2_K, DT_IQ4_XS, DT_Q5_0};
    const int64_t m = 37, k = 512, nt = 11;
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        const enum dtype t = types[c];
        struct backend *be = cpu_backend_init(2, NULL);
        float *wf = malloc((size_t)(m * k) * 4), *xs = malloc((size_t)(nt * k) * 4);
        uint8_t *wq = malloc(dtype_bytes(t, m * k));
        for (int64_t i = 0; i < m * k; i++)
            wf[i] = rndn() * 0.1f;
        for (int64_t i = 0; i < nt * k; i++)
            xs[i] = rndn();
        quant_quantize(t, wf, m * k, NULL, wq);
        quant_dequant(t, wq, m * k, wf);
        struct tensor hq = {t, m, k, k, wq, false}, hf = {DT_F32, m, k, k, wf, false}, wqt, wft, x, o1, o2, o3;
        CHECK(be->ops->weight(be, &wqt, &hq) == 0 && be->ops->weight(be, &wft, &hf) == 0, "weights");
        be->ops->alloc(be, &x, DT_F32, nt, k);
        be->ops->alloc(be, &o1, DT_F32, nt, m);
        be->ops->alloc(be, &o2, DT_F32, nt, m);
        be->ops->alloc(be, &o3, DT_F32, 1, m);
        be->ops->write(be, &x, 0, nt, xs);
        be->ops->matmul(be, &o1, &x, &wqt);
        be->ops->matmul(be, &o2, &x, &wft);
        CHECK(memcmp(o1.data, o2.data, (size_t)(nt * m) * 4) == 0, "%s: batch product differs from fp32's",
              dtype_name(t));
        for (int64_t r = 0; r < nt; r++) {
            struct tensor xr = tensor_rows(&x, r, 1);
            be->ops->matmul(be, &o3, &xr, &wqt);
            CHECK(memcmp(o3.data, (float *)o1.data + r * m, (size_t)m * 4) == 0,
                  "%s: token %lld alone differs from its row in the batch", dtype_name(t), (long long)r);
        }
        be->ops->release(be, &x);
        be->ops->release(be, &o1);
        be->ops->release(be, &o2);
        be->ops->release(be, &o3);
        be->ops->release(be, &wqt);
        be->ops->release(be, &wft);
        be->ops->free(be);
        free(wf);
        free(xs);
        free(wq);
    }
}
