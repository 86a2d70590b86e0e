/* FP8 checkpoints (src/model/fp8.h): the E4M3 decoding of every code, an FP8
 * checkpoint running as its dequantised weights do (bit for bit, on the cpu
 * backend), the same for `kapitsa quantize` from it, and errors naming the
 * tensor. The checkpoints are tools/reference/fp8_fixture.py's (tests/data/fp8). */
#include "../../src/backend/cpu/cpu.h"
#include "../../src/base/err.h"
#include "../../src/engine/engine.h"
#include "../../src/model/convert.h"
#include "../../src/model/model.h"
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* fp8_fixture.py --c-table: codes 0x00 .. 0xff by the format's definition */
static const float e4m3_table[256] = {
    0x0p+0, 0x1p-9, 0x1p-8, 0x1.8p-8, 0x1p-7, 0x1.4p-7, 0x1.8p-7, 0x1.cp-7,
    0x1p-6, 0x1.2p-6, 0x1.4p-6, 0x1.6p-6, 0x1.8p-6, 0x1.ap-6, 0x1.cp-6, 0x1.ep-6,
    0x1p-5, 0x1.2p-5, 0x1.4p-5, 0x1.6p-5, 0x1.8p-5, 0x1.ap-5, 0x1.cp-5, 0x1.ep-5,
    0x1p-4, 0x1.2p-4, 0x1.4p-4, 0x1.6p-4, 0x1.8p-4, 0x1.ap-4, 0x1.cp-4, 0x1.ep-4,
    0x1p-3, 0x1.2p-3, 0x1.4p-3, 0x1.6p-3, 0x1.8p-3, 0x1.ap-3, 0x1.cp-3, 0x1.ep-3,
    0x1p-2, 0x1.2p-2, 0x1.4p-2, 0x1.6p-2, 0x1.8p-2, 0x1.ap-2, 0x1.cp-2, 0x1.ep-2,
    0x1p-1, 0x1.2p-1, 0x1.4p-1, 0x1.6p-1, 0x1.8p-1, 0x1.ap-1, 0x1.cp-1, 0x1.ep-1,
    0x1p+0, 0x1.2p+0, 0x1.4p+0, 0x1.6p+0, 0x1.8p+0, 0x1.ap+0, 0x1.cp+0, 0x1.ep+0,
    0x1p+1, 0x1.2p+1, 0x1.4p+1, 0x1.6p+1, 0x1.8p+1, 0x1.ap+1, 0x1.cp+1, 0x1.ep+1,
    0x1p+2, 0x1.2p+2, 0x1.4p+2, 0x1.6p+2, 0x1.8p+2, 0x1.ap+2, 0x1.cp+2, 0x1.ep+2,
    0x1p+3, 0x1.2p+3, 0x1.4p+3, 0x1.6p+3, 0x1.8p+3, 0x1.ap+3, 0x1.cp+3, 0x1.ep+3,
    0x1p+4, 0x1.2p+4, 0x1.4p+4, 0x1.6p+4, 0x1.8p+4, 0x1.ap+4, 0x1.cp+4, 0x1.ep+4,
    0x1p+5, 0x1.2p+5, 0x1.4p+5, 0x1.6p+5, 0x1.8p+5, 0x1.ap+5, 0x1.cp+5, 0x1.ep+5,
    0x1p+6, 0x1.2p+6, 0x1.4p+6, 0x1.6p+6, 0x1.8p+6, 0x1.ap+6, 0x1.cp+6, 0x1.ep+6,
    0x1p+7, 0x1.2p+7, 0x1.4p+7, 0x1.6p+7, 0x1.8p+7, 0x1.ap+7, 0x1.cp+7, 0x1.ep+7,
    0x1p+8, 0x1.2p+8, 0x1.4p+8, 0x1.6p+8, 0x1.8p+8, 0x1.ap+8, 0x1.cp+8, NAN,
    -0x0p+0, -0x1p-9, -0x1p-8, -0x1.8p-8, -0x1p-7, -0x1.4p-7, -0x1.8p-7, -0x1.cp-7,
    -0x1p-6, -0x1.2p-6, -0x1.4p-6, -0x1.6p-6, -0x1.8p-6, -0x1.ap-6, -0x1.cp-6, -0x1.ep-6,
    -0x1p-5, -0x1.2p-5, -0x1.4p-5, -0x1.6p-5, -0x1.8p-5, -0x1.ap-5, -0x1.cp-5, -0x1.ep-5,
    -0x1p-4, -0x1.2p-4, -0x1.4p-4, -0x1.6p-4, -0x1.8p-4, -0x1.ap-4, -0x1.cp-4, -0x1.ep-4,
    -0x1p-3, -0x1.2p-3, -0x1.4p-3, -0x1.6p-3, -0x1.8p-3, -0x1.ap-3, -0x1.cp-3, -0x1.ep-3,
    -0x1p-2, -0x1.2p-2, -0x1.4p-2, -0x1.6p-2, -0x1.8p-2, -0x1.ap-2, -0x1.cp-2, -0x1.ep-2,
    -0x1p-1, -0x1.2p-1, -0x1.4p-1, -0x1.6p-1, -0x1.8p-1, -0x1.ap-1, -0x1.cp-1, -0x1.ep-1,
    -0x1p+0, -0x1.2p+0, -0x1.4p+0, -0x1.6p+0, -0x1.8p+0, -0x1.ap+0, -0x1.cp+0, -0x1.ep+0,
    -0x1p+1, -0x1.2p+1, -0x1.4p+1, -0x1.6p+1, -0x1.8p+1, -0x1.ap+1, -0x1.cp+1, -0x1.ep+1,
    -0x1p+2, -0x1.2p+2, -0x1.4p+2, -0x1.6p+2, -0x1.8p+2, -0x1.ap+2, -0x1.cp+2, -0x1.ep+2,
    -0x1p+3, -0x1.2p+3, -0x1.4p+3, -0x1.6p+3, -0x1.8p+3, -0x1.ap+3, -0x1.cp+3, -0x1.ep+3,
    -0x1p+4, -0x1.2p+4, -0x1.4p+4, -0x1.6p+4, -0x1.8p+4, -0x1.ap+4, -0x1.cp+4, -0x1.ep+4,
    -0x1p+5, -0x1.2p+5, -0x1.4p+5, -0x1.6p+5, -0x1.8p+5, -0x1.ap+5, -0x1.cp+5, -0x1.ep+5,
    -0x1p+6, -0x1.2p+6, -0x1.4p+6, -0x1.6p+6, -0x1.8p+6, -0x1.ap+6, -0x1.cp+6, -0x1.ep+6,
    -0x1p+7, -0x1.2p+7, -0x1.4p+7, -0x1.6p+7, -0x1.8p+7, -0x1.ap+7, -0x1.cp+7, -0x1.ep+7,
    -0x1p+8, -0x1.2p+8, -0x1.4p+8, -0x1.6p+8, -0x1.8p+8, -0x1.ap+8, -0x1.cp+8, NAN,
};

void test_fp8_e4m3_codes(void)
{
    for (int b = 0; b < 256; b++) {
        const float got = f8e4m3_to_f32((uint8_t)b), want = e4m3_table[b];
        if (isnan(want))
            CHECK(isnan(got), "0x%02x: %g, want NaN", b, got);
        else
            CHECK(memcmp(&got, &want, sizeof got) == 0, "0x%02x: %a, want %a", b, got, want);
    }
    /* the spec's landmarks: 1.0, the largest normal, the smallest normal and subnormal, -0 */
    CHECK(f8e4m3_to_f32(0x38) == 1.0f && f8e4m3_to_f32(0x7e) == 448.0f && f8e4m3_to_f32(0xfe) == -448.0f, "1, 448");
    CHECK(f8e4m3_to_f32(0x08) == 0x1p-6f && f8e4m3_to_f32(0x01) == 0x1p-9f, "2^-6, 2^-9");
    CHECK(f8e4m3_to_f32(0x80) == 0.0f && signbit(f8e4m3_to_f32(0x80)), "-0");
}

static const char *fp8_data(const char *name)
{
    static char path[4][512];
    static int next;
    char *p = path[next++ % 4];
    const char *d = getenv("KAPITSA_FP8_DATA");
    snprintf(p, sizeof path[0], "%s/%s", d && *d ? d : "build/testdata/fp8", name);
    return p;
}

/* The logits of all 40 positions of a fixed prompt on backend be (freed here),
 * and the dequantised copies the model keeps. */
static int logits_on(const char *path, struct backend *be, float **out, int32_t *V, int32_t *n_dequant)
{
    struct model m;
    struct engine e;
    int rc = -1;
    *out = NULL;
    if (!be || model_load(&m, path, be, NULL) != 0)
        goto done;
    *n_dequant = m.n_dequant;
    if (engine_init(&e, &m, 256, 1, 64, 64, 0, DT_F32) != 0) {
        model_free(&m);
        goto done;
    }
    enum { N = 40 };
    int32_t toks[N], pos[N], seq[N], parent[N];
    uint8_t want[N];
    const int32_t s = engine_seq_new(&e);
    for (int32_t i = 0; i < N; i++) {
        toks[i] = (i * 37 + 11) % m.cfg.vocab_size;
        pos[i] = i;
        seq[i] = s;
        parent[i] = i - 1;
        want[i] = 1;
    }
    struct batch b = {N, toks, pos, seq, parent, want};
    *V = m.cfg.vocab_size * N;
    *out = malloc((size_t)*V * sizeof(float));
    rc = *out && engine_forward(&e, &b, *out, NULL) == N ? 0 : -1;
    engine_free(&e);
    model_free(&m);
done:
    if (be)
        be->ops->free(be);
    return rc;
}

static int logits_of(const char *path, float **out, int32_t *V, int32_t *n_dequant)
{
    return logits_on(path, cpu_backend_init(2, NULL), out, V, n_dequant);
}

static const char *const fp8_archs[] = {"qwen3", "qwen3_moe"};

/* An FP8 checkpoint loads as the BF16 checkpoint of its dequantised weights
 * (written by numpy): the same logits, bit for bit. qwen3: 128x128 blocks, one
 * a tensor, cut at the edges; qwen3_moe: 32x48 blocks, several a tensor,
 * experts per expert in layer 0 and fused 3-D in layer 1. */
void test_fp8_logits(void)
{
    for (size_t a = 0; a < sizeof fp8_archs / sizeof fp8_archs[0]; a++) {
        char q[128], d[128];
        snprintf(q, sizeof q, "%s_fp8", fp8_archs[a]);
        snprintf(d, sizeof d, "%s_fp8_dequant", fp8_archs[a]);
        float *lq = NULL, *ld = NULL;
        int32_t n = 0, nq = 0, nd = 0;
        CHECK(logits_of(fp8_data(q), &lq, &n, &nq) == 0 && logits_of(fp8_data(d), &ld, &n, &nd) == 0, "%s: %s",
              fp8_archs[a], err_msg());
        CHECK(lq && ld && memcmp(lq, ld, (size_t)n * sizeof(float)) == 0, "%s: logits differ from the dequantised "
              "checkpoint's", fp8_archs[a]);
        /* the cpu uses the BF16 copies in place: the model keeps them; nothing to copy from a BF16 checkpoint */
        CHECK(nq >= 14 && nd == 0, "%s: %d and %d dequantised copies kept", fp8_archs[a], (int)nq, (int)nd);
        free(lq);
        free(ld);
    }
}

/* The same on the test device (KAPITSA_TEST_DEVICE): a backend that keeps its
 * own copy of the weights (a GPU's) leaves the model none of the BF16 ones. */
void test_fp8_device(void)
{
    for (size_t a = 0; a < sizeof fp8_archs / sizeof fp8_archs[0]; a++) {
        char q[128], d[128];
        snprintf(q, sizeof q, "%s_fp8", fp8_archs[a]);
        snprintf(d, sizeof d, "%s_fp8_dequant", fp8_archs[a]);
        float *lq = NULL, *ld = NULL;
        int32_t n = 0, nq = 0, nd = 0;
        struct backend *be = test_backend();
        const bool cpu = be && strcmp(be->ops->name, "cpu") == 0;
        CHECK(logits_on(fp8_data(q), be, &lq, &n, &nq) == 0 &&
                  logits_on(fp8_data(d), test_backend(), &ld, &n, &nd) == 0,
              "%s: %s", fp8_archs[a], err_msg());
        CHECK(lq && ld && memcmp(lq, ld, (size_t)n * sizeof(float)) == 0, "%s: logits differ from the dequantised "
              "checkpoint's", fp8_archs[a]);
        CHECK(cpu ? nq > 0 : nq == 0, "%s: %d dequantised copies kept", fp8_archs[a], (int)nq);
        free(lq);
        free(ld);
    }
}

/* `kapitsa quantize` from an FP8 checkpoint reads the weights a model loads:
 * its Q4_K_M GGUF runs as the one written from the dequantised checkpoint. */
void test_fp8_quantize(void)
{
    for (size_t a = 0; a < sizeof fp8_archs / sizeof fp8_archs[0]; a++) {
        char src[128], deq[128], gq[512], gd[512];
        snprintf(src, sizeof src, "%s_fp8", fp8_archs[a]);
        snprintf(deq, sizeof deq, "%s_fp8_dequant", fp8_archs[a]);
        snprintf(gq, sizeof gq, "%s/%s-Q4_K_M.gguf", test_tmpdir(), src);
        snprintf(gd, sizeof gd, "%s/%s-Q4_K_M.gguf", test_tmpdir(), deq);
        struct convert_opts o = {.recipe = "Q4_K_M"};
        CHECK(convert_write(fp8_data(src), gq, &o) == 0 && convert_write(fp8_data(deq), gd, &o) == 0, "%s: %s",
              fp8_archs[a], err_msg());
        float *lq = NULL, *ld = NULL;
        int32_t n = 0, nq = 0, nd = 0;
        CHECK(logits_of(gq, &lq, &n, &nq) == 0 && logits_of(gd, &ld, &n, &nd) == 0, "%s: %s", fp8_archs[a],
              err_msg());
        CHECK(lq && ld && memcmp(lq, ld, (size_t)n * sizeof(float)) == 0, "%s: the GGUFs' logits differ",
              fp8_archs[a]);
        free(lq);
        free(ld);
    }
}

/* ---- broken checkpoints: the fixture's tensors with one changed, or its config ---- */

struct variant {
    const struct safetensors *st;
    struct st_wtensor *t;
    int32_t n;
};

static void fill_variant(void *ctx, int32_t i, void *buf, size_t n_bytes)
{
    const struct variant *v = ctx;
    const struct st_tensor *s = st_find(v->st, v->t[i].name);
    memset(buf, 0, n_bytes);
    memcpy(buf, s->data, s->n_bytes < n_bytes ? s->n_bytes : n_bytes);
}

/* DIR <- the qwen3_fp8 fixture with tensor `name` dropped (rows 0) or
 * reshaped to [rows][cols], and quantization_config's `key` set to `value`
 * (a JSON text; NULL: the field removed; key NULL: kept as it is). */
static int write_variant(const char *dir, const char *name, int64_t rows, int64_t cols, const char *key,
                         const char *value)
{
    char path[600];
    struct safetensors st = {0};
    struct variant v = {&st, NULL, 0};
    json_t *cfg = NULL;
    int rc = -1;
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    if (system(path) != 0 || st_open_dir(&st, fp8_data("qwen3_fp8")) != 0)
        goto done;
    v.t = calloc((size_t)st.n_tensors, sizeof *v.t);
    for (int32_t i = 0; v.t && i < st.n_tensors; i++) {
        const struct st_tensor *s = &st.tensors[i];
        if (name && strcmp(s->name, name) == 0 && rows == 0)
            continue;
        struct st_wtensor *w = &v.t[v.n++];
        w->name = s->name;
        w->type = s->type;
        w->n_dim = s->n_dim;
        memcpy(w->shape, s->shape, sizeof w->shape);
        if (name && strcmp(s->name, name) == 0) {
            w->n_dim = 2;
            w->shape[0] = rows;
            w->shape[1] = cols;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!v.t || st_write(path, v.n, v.t, fill_variant, &v) != 0)
        goto done;
    snprintf(path, sizeof path, "%s/config.json", fp8_data("qwen3_fp8"));
    cfg = json_load_file(path, 0, NULL);
    json_t *q = json_object_get(cfg, "quantization_config");
    if (!q)
        goto done;
    if (key && value)
        json_object_set_new(q, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else if (key && strcmp(key, "quantization_config") == 0)
        json_object_del(cfg, key);
    else if (key)
        json_object_del(q, key);
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = json_dump_file(cfg, path, 0);
done:
    json_decref(cfg);
    free(v.t);
    st_close(&st);
    return rc;
}

void test_fp8_errors(void)
{
    static const struct {
        const char *name; /* tensor changed */
        int64_t rows, cols;
        const char *key, *value;
        const char *want[2]; /* in the error */
    } cases[] = {
        {"model.layers.1.mlp.up_proj.weight_scale_inv", 0, 0, NULL, NULL,
         {"'model.layers.1.mlp.up_proj.weight'", "no scale tensor 'model.layers.1.mlp.up_proj.weight_scale_inv'"}},
        {"model.layers.0.self_attn.k_proj.weight_scale_inv", 2, 1, NULL, NULL,
         {"'model.layers.0.self_attn.k_proj.weight_scale_inv' has shape [2, 1], expected [1, 1]", "128x128"}},
        {NULL, 0, 0, "weight_block_size", "[64, 128]",
         {"'model.layers.0.mlp.gate_proj.weight_scale_inv' has shape [1, 1], expected [2, 1]", "64x128"}},
        {NULL, 0, 0, "weight_block_size", "[0, 128]", {"weight_block_size must be two integers", ""}},
        {NULL, 0, 0, "weight_block_size", NULL, {"weight_block_size must be [rows, cols]", "not supported"}},
        {NULL, 0, 0, "quant_method", "\"awq\"", {"quant_method 'awq' is not supported", ""}},
        {NULL, 0, 0, "fmt", "\"e5m2\"", {"fmt must be \"e4m3\"", ""}},
        {NULL, 0, 0, "quantization_config", NULL,
         {"' is F8_E4M3 but config.json has no quantization_config", "model.layers.0.mlp.down_proj.weight"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[512], out[600];
        snprintf(dir, sizeof dir, "%s/fp8_bad_%zu", test_tmpdir(), i);
        snprintf(out, sizeof out, "%s.gguf", dir);
        CHECK(write_variant(dir, cases[i].name, cases[i].rows, cases[i].cols, cases[i].key, cases[i].value) == 0,
              "case %zu: %s", i, err_msg());
        struct backend *be = cpu_backend_init(2, NULL);
        struct model m;
        CHECK(model_load(&m, dir, be, NULL) != 0 && strstr(err_msg(), cases[i].want[0]) &&
                  strstr(err_msg(), cases[i].want[1]),
              "case %zu: %s", i, err_msg());
        be->ops->free(be);
        /* quantize opens its source the same way */
        struct convert_opts o = {.recipe = "Q8_0"};
        CHECK(convert_write(dir, out, &o) != 0 && strstr(err_msg(), cases[i].want[0]), "case %zu quantize: %s", i,
              err_msg());
    }
}
