/* Models from GGUF files written by `kapitsa quantize` (src/model/convert.c):
 * a fixture written as BF16 GGUF matches transformers' logits as its folder
 * does; a quantised one gives, on the cpu backend, bitwise the logits of the
 * same model with its dequantised weights stored as F32; recipes give the
 * types they name; broken files get errors. */
#include "../../src/backend/cpu/cpu.h"
#include "../../src/base/err.h"
#include "../../src/engine/check.h"
#include "../../src/engine/engine.h"
#include "../../src/model/convert.h"
#include "../../src/model/gguf.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const gguf_archs[] = {"qwen3", "qwen3_moe", "qwen3_moe_mixed", "qwen3_yarn_sharded"};

/* A precise cpu backend: the exact products of block-type and BF16 weights. */
static struct backend *exact_cpu(void)
{
    struct backend *be = cpu_backend_init(2, NULL);
    if (be)
        cpu_backend_set_precise(be, true);
    return be;
}

static const char *fx(const char *arch)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_fixtures(), arch);
    return path;
}

static const char *tmp_gguf(const char *arch, const char *recipe)
{
    static char path[4][512];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s-%s.gguf", test_tmpdir(), arch, recipe);
    return p;
}

static int write_gguf(const char *src, const char *out, const char *recipe)
{
    struct convert_opts o = {.recipe = recipe};
    return convert_write(src, out, &o);
}

/* BF16 GGUF of every qwen fixture: the transformers check passes as from the folder. */
void test_gguf_model_golden(void)
{
    for (size_t a = 0; a < sizeof gguf_archs / sizeof gguf_archs[0]; a++) {
        const char *path = tmp_gguf(gguf_archs[a], "BF16");
        char golden[600];
        snprintf(golden, sizeof golden, "%s/golden.safetensors", fx(gguf_archs[a]));
        CHECK(write_gguf(fx(gguf_archs[a]), path, "BF16") == 0, "%s: %s", gguf_archs[a], err_msg());
        struct backend *be = exact_cpu();
        struct check_opts o = {.golden = golden};
        struct check_result r;
        CHECK(check_run(path, be, &o, &r) == 0, "%s: %s", gguf_archs[a], err_msg());
        CHECK(r.max_logit_err <= 2e-4f, "%s: max |dlogit| %g", gguf_archs[a], r.max_logit_err);
        CHECK(r.greedy_match == r.n_greedy && r.n_greedy >= 32, "%s: greedy %d/%d", gguf_archs[a], r.greedy_match,
              r.n_greedy);
        be->ops->free(be);
    }
}

/* The logits of a fixed 40-token prompt's last n_out tokens on backend be (freed here). */
static int logits_last(const char *path, struct backend *be, int32_t n_out, float **out, int32_t *V)
{
    struct model m;
    struct engine e;
    int rc = -1;
    if (model_load(&m, path, be, NULL) != 0)
        goto done;
    if (engine_init(&e, &m, 256, 1, 64, n_out, 0, DT_F32) != 0) {
        model_free(&m);
        goto done;
    }
    int32_t toks[40], pos[40], seq[40], parent[40];
    uint8_t want[40];
    const int32_t s = engine_seq_new(&e);
    for (int32_t i = 0; i < 40; i++) {
        toks[i] = (i * 37 + 11) % m.cfg.vocab_size;
        pos[i] = i;
        seq[i] = s;
        parent[i] = i - 1;
        want[i] = i >= 40 - n_out;
    }
    struct batch b = {40, toks, pos, seq, parent, want};
    *V = m.cfg.vocab_size;
    *out = malloc((size_t)(n_out * *V) * sizeof(float));
    rc = engine_forward(&e, &b, *out, NULL) == n_out ? 0 : -1;
    engine_free(&e);
    model_free(&m);
done:
    be->ops->free(be);
    return rc;
}

static int logits_on(const char *path, struct backend *be, float **out, int32_t *V)
{
    return logits_last(path, be, 1, out, V);
}

/* ... on a precise cpu backend */
static int logits_of(const char *path, float **out, int32_t *V) { return logits_on(path, exact_cpu(), out, V); }

/* A quantised GGUF's forward is its dequantised weights' forward: the same
 * logits, bit for bit, as the F32 GGUF written from it. */
void test_gguf_model_dequant_equal(void)
{
    static const char *const recipes[] = {"Q8_0", "Q4_K_M", "Q2_K", "IQ4_NL"};
    for (size_t a = 0; a < 2; a++)
        for (size_t r = 0; r < sizeof recipes / sizeof recipes[0]; r++) {
            const char *q = tmp_gguf(gguf_archs[a], recipes[r]), *f = tmp_gguf(gguf_archs[a], "F32");
            CHECK(write_gguf(fx(gguf_archs[a]), q, recipes[r]) == 0 && write_gguf(q, f, "F32") == 0, "%s %s: %s",
                  gguf_archs[a], recipes[r], err_msg());
            float *lq = NULL, *lf = NULL;
            int32_t V = 0;
            CHECK(logits_of(q, &lq, &V) == 0 && logits_of(f, &lf, &V) == 0, "%s %s: %s", gguf_archs[a], recipes[r],
                  err_msg());
            CHECK(lq && lf && memcmp(lq, lf, (size_t)V * sizeof(float)) == 0,
                  "%s %s: logits differ from the dequantised model's", gguf_archs[a], recipes[r]);
            free(lq);
            free(lf);
        }
}

/* A quantised GGUF on the test device (KAPITSA_TEST_DEVICE: the cuda
 * backend's block-type kernels) gives the cpu's logits to float rounding. */
void test_gguf_model_device(void)
{
    static const char *const recipes[] = {"Q8_0", "Q4_K_M", "Q2_K", "IQ4_NL"};
    for (size_t a = 0; a < 2; a++)
        for (size_t r = 0; r < sizeof recipes / sizeof recipes[0]; r++) {
            const char *q = tmp_gguf(gguf_archs[a], recipes[r]);
            CHECK(write_gguf(fx(gguf_archs[a]), q, recipes[r]) == 0, "%s %s: %s", gguf_archs[a], recipes[r], err_msg());
            float *lc = NULL, *ld = NULL;
            int32_t V = 0;
            struct backend *dev = test_backend();
            CHECK(dev && logits_of(q, &lc, &V) == 0 && logits_on(q, dev, &ld, &V) == 0, "%s %s: %s", gguf_archs[a],
                  recipes[r], err_msg());
            if (!lc || !ld) {
                free(lc);
                free(ld);
                continue;
            }
            float mx = 0, d = 0;
            int32_t ac = 0, ad = 0;
            for (int32_t i = 0; i < V; i++) {
                mx = fmaxf(mx, fabsf(lc[i]));
                d = fmaxf(d, fabsf(lc[i] - ld[i]));
                ac = lc[i] > lc[ac] ? i : ac;
                ad = ld[i] > ld[ad] ? i : ad;
            }
            CHECK(d <= 1e-4f * mx && ac == ad, "%s %s: max |dlogit| %g of %g, argmax %d vs %d", gguf_archs[a],
                  recipes[r], d, mx, ad, ac);
            free(lc);
            free(ld);
        }
}

/* What the recipes write: types per tensor, llama.cpp's fallbacks for rows
 * that do not split into 256-element blocks, vectors in F32. */
void test_gguf_model_recipes(void)
{
    const char *path = tmp_gguf("qwen3_moe", "Q4_K_M");
    CHECK(write_gguf(fx("qwen3_moe"), path, "Q4_K_M") == 0, "%s", err_msg());
    struct gguf g;
    CHECK(gguf_open(&g, path) == 0, "%s", err_msg());
    const struct gguf_tensor *t = gguf_find(&g, "blk.0.attn_norm.weight");
    CHECK(t && t->type == DT_F32, "norms are F32");
    t = gguf_find(&g, "blk.0.ffn_gate_exps.weight");
    CHECK(t && t->n_dim == 3, "experts stacked");
    gguf_close(&g);
    enum dtype d;
    CHECK(convert_recipe_type("Q4_K_M", ROLE_ATTN_QK, 5, 28, 1024, &d) == 0 && d == DT_Q4_K, "Q4_K_M q");
    CHECK(convert_recipe_type("Q4_K_M", ROLE_ATTN_V, 0, 28, 1024, &d) == 0 && d == DT_Q6_K, "Q4_K_M v, first layers");
    CHECK(convert_recipe_type("Q4_K_M", ROLE_FFN_DOWN, 6, 28, 3072, &d) == 0 && d == DT_Q4_K, "Q4_K_M down");
    CHECK(convert_recipe_type("Q4_K_M", ROLE_OUTPUT, 0, 28, 1024, &d) == 0 && d == DT_Q6_K, "Q4_K_M head");
    CHECK(convert_recipe_type("Q4_K_M", ROLE_ATTN_QK, 5, 28, 64, &d) == 0 && d == DT_Q5_0, "Q4_K fallback");
    CHECK(convert_recipe_type("Q6_K", ROLE_ATTN_QK, 5, 28, 96, &d) == 0 && d == DT_Q8_0, "Q6_K fallback");
    CHECK(convert_recipe_type("Q4_K", ROLE_ATTN_QK, 5, 28, 80, &d) == 0 && d == DT_F16, "no block fits");
    CHECK(convert_recipe_type("Q2_MOE", ROLE_EXP_UP, 5, 28, 2048, &d) == 0 && d == DT_Q2_K, "moe experts");
    CHECK(convert_recipe_type("Q2_MOE", ROLE_VECTOR, 5, 28, 2048, &d) == 0 && d == DT_F32, "moe vectors");
    CHECK(convert_recipe_type("Q9_X", ROLE_ATTN_QK, 5, 28, 2048, &d) != 0 && strstr(err_msg(), "Q9_X"),
          "unknown recipe named");
}

/* Files that are not what the model needs: errors that say what is wrong. */
void test_gguf_model_errors(void)
{
    struct backend *be = cpu_backend_init(2, NULL);
    struct model m;
    const char *bad = tmp_gguf("bad", "arch");
    struct gguf_writer *w;
    CHECK(gguf_writer_init(&w, bad) == 0, "writer");
    gguf_writer_kv_str(w, "general.architecture", "llama");
    CHECK(gguf_writer_finish(w, NULL, NULL) == 0, "%s", err_msg());
    CHECK(model_load(&m, bad, be, NULL) != 0 && strstr(err_msg(), "'llama' is not supported"), "%s", err_msg());
    /* a qwen3 file missing a tensor */
    const char *q = tmp_gguf("qwen3", "F16"), *cut = tmp_gguf("qwen3", "cut");
    CHECK(write_gguf(fx("qwen3"), q, "F16") == 0, "%s", err_msg());
    struct gguf g;
    CHECK(gguf_open(&g, q) == 0, "%s", err_msg());
    CHECK(gguf_writer_init(&w, cut) == 0, "writer");
    for (int64_t i = 0; i < g.n_kv; i++)
        if (g.kv[i].type == GGUF_U32)
            gguf_writer_kv_u32(w, g.kv[i].key, (uint32_t)g.kv[i].v.u);
        else if (g.kv[i].type == GGUF_F32)
            gguf_writer_kv_f32(w, g.kv[i].key, (float)g.kv[i].v.f);
        else if (g.kv[i].type == GGUF_STRING && strcmp(g.kv[i].key, "general.architecture") == 0)
            gguf_writer_kv_str(w, g.kv[i].key, "qwen3");
    gguf_close(&g);
    gguf_writer_kv_u32(w, "qwen3.vocab_size", 512);
    CHECK(gguf_writer_finish(w, NULL, NULL) == 0, "%s", err_msg());
    CHECK(model_load(&m, cut, be, NULL) != 0 && strstr(err_msg(), "missing tensor"), "%s", err_msg());
    be->ops->free(be);
}

static const char *gguf_data(const char *file)
{
    static char path[512];
    const char *d = getenv("KAPITSA_GGUF_DATA");
    snprintf(path, sizeof path, "%s/%s", d && *d ? d : "build/testdata/gguf", file);
    return path;
}

/* Files quantised by llama.cpp's llama-quantize (tools/reference/llama_ggufs.sh):
 * each holds the block types its mix names and runs as its dequantised weights
 * do, bit for bit. */
void test_gguf_model_llama_files(void)
{
    static const struct {
        const char *file;
        enum dtype has[3];
    } files[] = {{"dense-Q4_K_M.gguf", {DT_Q4_K, DT_Q6_K}},
                 {"dense-Q3_K_M.gguf", {DT_Q3_K, DT_Q4_K, DT_Q5_K}},
                 {"dense-Q2_K.gguf", {DT_Q2_K, DT_Q3_K}},
                 {"dense-IQ4_XS.gguf", {DT_IQ4_XS}},
                 {"moe-Q4_K_M.gguf", {DT_Q4_K, DT_Q6_K}}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char q[512];
        snprintf(q, sizeof q, "%s", gguf_data(files[i].file));
        struct gguf g;
        CHECK(gguf_open(&g, q) == 0, "%s", err_msg());
        for (int k = 0; k < 3 && files[i].has[k]; k++) {
            bool found = false;
            for (int64_t t = 0; t < g.n_tensors; t++)
                found |= g.tensors[t].type == files[i].has[k];
            CHECK(found, "%s: no %s tensor", files[i].file, dtype_name(files[i].has[k]));
        }
        gguf_close(&g);
        const char *f = tmp_gguf("llama", "F32");
        CHECK(write_gguf(q, f, "F32") == 0, "%s: %s", files[i].file, err_msg());
        float *lq = NULL, *lf = NULL;
        int32_t V = 0;
        CHECK(logits_of(q, &lq, &V) == 0 && logits_of(f, &lf, &V) == 0, "%s: %s", files[i].file, err_msg());
        CHECK(lq && lf && memcmp(lq, lf, (size_t)V * sizeof(float)) == 0, "%s: logits differ from the dequantised "
              "model's", files[i].file);
        free(lq);
        free(lf);
    }
}

/* Fixtures converted by llama.cpp's own convert_hf_to_gguf.py (BF16,
 * tools/reference/convert_fixtures.py): each loads under the architecture
 * llama.cpp gave it, its transforms undone, and matches transformers' logits
 * as its folder does; the Qwen ones give bitwise the folder's logits on the
 * cpu backend. Nemotron-H's scan chunk (chunk_size, 32 in the fixtures) is not
 * in the file: it runs with transformers' default 128, within the bound but
 * not bit for bit. Three architectures are kept, those whose conversion
 * changes bytes (the repository's size is kept small: README there). */
void test_gguf_model_llama_archs(void)
{
    static const struct {
        const char *fixture, *arch;
        bool bitwise;
    } files[] = {{"qwen3_next", "qwen3next", true}, {"qwen3_5", "qwen35", true}, {"nemotron_h_moe", "nemotron_h_moe", false}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512], golden[600], name[64];
        snprintf(name, sizeof name, "fixtures/%s.gguf", files[i].fixture);
        snprintf(path, sizeof path, "%s", gguf_data(name));
        snprintf(golden, sizeof golden, "%s/golden.safetensors", fx(files[i].fixture));
        struct gguf g;
        const char *arch = NULL;
        size_t n = 0;
        CHECK(gguf_open(&g, path) == 0, "%s", err_msg());
        CHECK(gguf_get_str(&g, "general.architecture", &arch, &n) == 0 && n == strlen(files[i].arch) &&
                  memcmp(arch, files[i].arch, n) == 0,
              "%s: architecture '%.*s', expected %s", files[i].fixture, (int)n, arch ? arch : "", files[i].arch);
        gguf_close(&g);
        struct backend *be = exact_cpu();
        struct check_opts o = {.golden = golden};
        struct check_result r;
        CHECK(check_run(path, be, &o, &r) == 0, "%s: %s", files[i].fixture, err_msg());
        CHECK(r.max_logit_err <= 2e-4f, "%s: max |dlogit| %g", files[i].fixture, r.max_logit_err);
        CHECK(r.greedy_match == r.n_greedy && r.n_greedy >= 32, "%s: greedy %d/%d", files[i].fixture,
              r.greedy_match, r.n_greedy);
        be->ops->free(be);
        if (!files[i].bitwise)
            continue;
        float *lg = NULL, *lf = NULL;
        int32_t V = 0;
        CHECK(logits_of(path, &lg, &V) == 0 && logits_of(fx(files[i].fixture), &lf, &V) == 0, "%s: %s",
              files[i].fixture, err_msg());
        CHECK(lg && lf && memcmp(lg, lf, (size_t)V * sizeof(float)) == 0, "%s: logits differ from the folder's",
              files[i].fixture);
        free(lg);
        free(lf);
    }
}

/* The int8 path (the cpu's default for block-type weights but IQ2_XXS and
 * the _1 types) against the exact one on the same file, every position of
 * the prompt: the logits within 4% of the largest |logit| (measured: 1.7% on
 * the fixtures at Q8_0, rows of 64, 2.0% at IQ4_NL; 3.3% and 2.4% on
 * llama-quantize's dense and MoE Q4_K_M mixes, 2.4%, 3.1% and 2.4% on its
 * dense Q3_K_M (Q3_K to Q6_K), Q2_K and IQ4_XS),
 * and the greedy token the exact one wherever the exact logits have no
 * rival within that bound (these random models have near ties: 4 of 160
 * positions pick a rival, measured). */
void test_gguf_model_q8(void)
{
    if (!kern_q8_supported(kern_best()))
        return;
    static const char *const llama_files[] = {"dense-Q4_K_M.gguf", "moe-Q4_K_M.gguf", "dense-Q3_K_M.gguf",
                                              "dense-Q2_K.gguf", "dense-IQ4_XS.gguf"};
    char paths[8][512];
    for (size_t a = 0; a < 2; a++) {
        snprintf(paths[a], sizeof paths[a], "%s", tmp_gguf(gguf_archs[a], "Q8_0-fast"));
        CHECK(write_gguf(fx(gguf_archs[a]), paths[a], "Q8_0") == 0, "%s: %s", gguf_archs[a], err_msg());
    }
    snprintf(paths[2], sizeof paths[2], "%s", tmp_gguf("qwen3", "IQ4_NL-fast"));
    CHECK(write_gguf(fx("qwen3"), paths[2], "IQ4_NL") == 0, "qwen3: %s", err_msg());
    for (int f = 0; f < 5; f++)
        snprintf(paths[3 + f], sizeof paths[3 + f], "%s", gguf_data(llama_files[f]));
    for (int f = 0; f < 8; f++) {
        float *lq = NULL, *le = NULL;
        int32_t V = 0;
        struct backend *exact = cpu_backend_init(2, NULL);
        cpu_backend_set_precise(exact, true);
        CHECK(logits_last(paths[f], cpu_backend_init(2, NULL), 40, &lq, &V) == 0 &&
                  logits_last(paths[f], exact, 40, &le, &V) == 0,
              "%s: %s", paths[f], err_msg());
        float worst = 0;
        int same = 0;
        for (int32_t p = 0; lq && le && p < 40; p++) {
            const float *a = lq + (int64_t)p * V, *b = le + (int64_t)p * V;
            int32_t ia = 0, ib = 0;
            float mx = 0, d = 0;
            for (int32_t i = 0; i < V; i++) {
                ia = a[i] > a[ia] ? i : ia;
                ib = b[i] > b[ib] ? i : ib;
                mx = fabsf(b[i]) > mx ? fabsf(b[i]) : mx;
                d = fabsf(a[i] - b[i]) > d ? fabsf(a[i] - b[i]) : d;
            }
            CHECK(b[ia] >= b[ib] - 0.04f * mx, "%s position %d: greedy %d, exact %d", paths[f], p, ia, ib);
            same += ia == ib;
            worst = d / mx > worst ? d / mx : worst;
        }
        printf("  %s: int8 logits within %.4f of the largest, greedy %d/40 the exact one\n", paths[f], worst, same);
        CHECK(worst <= 0.04f, "%s: logits %g off", paths[f], worst);
        free(lq);
        free(le);
    }
}
