/* The model catalog (models/catalog.json) and the rules doctor uses: what
 * fits (weights + KV for the context + recurrent state + runtime overhead),
 * in bf16 or quantised, and which model to recommend. */
#include "../../src/hub/catalog.h"
#include "../../src/base/err.h"
#include "test.h"

#include <stdbool.h>
#include <string.h>

void test_catalog_entries(void)
{
    struct catalog c;
    CHECK(catalog_load(&c, "models/catalog.json") == 0, "%s", err_msg());
    CHECK(c.n >= 14, "%d models", c.n);
    const char *need[] = {"qwen3-0.6b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-next-80b-a3b",
                          "qwen3.5-0.8b", "qwen3.5-35b-a3b", "nemotron-nano-9b-v2", "nemotron-3-nano-30b-a3b"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        CHECK(catalog_find(&c, need[i]) != NULL, "%s missing", need[i]);
    const struct catalog_model *m = catalog_find(&c, "qwen/qwen3-8b");
    CHECK(m && strcmp(m->name, "qwen3-8b") == 0, "find by hub id, any case");
    /* Qwen3-8B: 8.19B parameters, fp32 KV of 36 layers x 8 heads x 128 x 2 */
    CHECK(m && m->params > 8100000000LL && m->params < 8300000000LL, "qwen3-8b params");
    CHECK(m && m->kv_bytes_per_token == 36 * 8 * 128 * 2 * 4, "qwen3-8b kv bytes");
    for (int32_t i = 0; i < c.n; i++) {
        const struct catalog_model *d = c.m[i].draft ? catalog_find(&c, c.m[i].draft) : NULL;
        CHECK(!c.m[i].draft || d, "%s: draft %s not in the catalog", c.m[i].name, c.m[i].draft);
        CHECK(!d || d->bytes < c.m[i].bytes / 2, "%s: draft not much smaller", c.m[i].name);
        CHECK(c.m[i].active_bytes <= c.m[i].bytes, "%s: active bytes", c.m[i].name);
        const bool qwen3 = strcmp(c.m[i].arch, "qwen3") == 0 || strcmp(c.m[i].arch, "qwen3_moe") == 0;
        CHECK((c.m[i].state_bytes > 0) == !qwen3, "%s: recurrent state only on hybrids", c.m[i].name);
        /* the recipes quantize writes: every one on those architectures (Q2_MOE on MoE models only), each
         * smaller than bf16 and than the one before it (catalog_recipes runs from the most bits down) */
        const bool moe = strcmp(c.m[i].arch, "qwen3_moe") == 0;
        CHECK(c.m[i].n_quant == (qwen3 ? CATALOG_N_RECIPES - !moe : 0), "%s: %d recipes", c.m[i].name,
              c.m[i].n_quant);
        CHECK(!catalog_quant(&c.m[i], "Q2_MOE") == !moe, "%s: Q2_MOE on MoE models only", c.m[i].name);
        for (int32_t k = 0; k < c.m[i].n_quant; k++) {
            const struct catalog_quant *q = &c.m[i].quant[k], *prev = k ? q - 1 : NULL;
            CHECK(q->bytes < (prev ? prev->bytes : c.m[i].bytes), "%s %s: not below the recipe before",
                  c.m[i].name, q->recipe);
            CHECK(q->active_bytes <= q->bytes && q->active_bytes < c.m[i].active_bytes, "%s %s: active bytes",
                  c.m[i].name, q->recipe);
            CHECK(!q->published || c.m[i].gguf_repo, "%s %s: published without a repo", c.m[i].name, q->recipe);
        }
    }
    /* qwen3-0.6b's Q4_K_M: the tensor bytes of `kapitsa quantize --recipe Q4_K_M` on its shapes, to the byte
     * (Q6_K for the tied embedding / LM head, 0.6B's 28 layers' attn_v and ffn_down in the "more bits" ones) */
    const struct catalog_model *small = catalog_find(&c, "qwen3-0.6b");
    const struct catalog_quant *q4 = small ? catalog_quant(small, "q4_k_m") : NULL;
    CHECK(q4 && q4->bytes == 390753280, "qwen3-0.6b Q4_K_M: %lld bytes", q4 ? (long long)q4->bytes : -1LL);
    /* Q8_0 is 8.5 bits a weight throughout but for the F32 norms */
    const struct catalog_quant *q8 = m ? catalog_quant(m, "Q8_0") : NULL;
    CHECK(q8 && q8->bytes > m->params / 32 * 34 && q8->bytes < m->params / 32 * 34 + m->params / 1000, "Q8_0 bytes");
    CHECK(m && m->gguf_repo && strcmp(m->gguf_repo, "Qwen/Qwen3-8B-GGUF") == 0 && q8->published, "Qwen's GGUF");
    catalog_free(&c);
    struct catalog bad;
    CHECK(catalog_load(&bad, "tests/fixtures/qwen3/config.json") != 0 && strstr(err_msg(), "catalog"),
          "a file without a models list is refused");
}

static void quant_fit(void)
{
    struct catalog_model m = {.name = "x", .params = 5LL << 30, .bytes = 10LL << 30, .active_bytes = 10LL << 30,
                              .context = 32768, .kv_bytes_per_token = 1 << 17, .n_quant = 1};
    m.quant[0] = (struct catalog_quant){"Q4_K_M", 3LL << 30, 3LL << 30, false};
    const struct catalog_quant *q = catalog_quant(&m, "Q4_K_M");
    CHECK(q == &m.quant[0] && !catalog_quant(&m, "Q8_0"), "lookup by recipe");
    /* the same rule over the recipe's weights */
    CHECK(catalog_need_bytes(&m, q, 8192, 1, DT_F32) ==
              (3LL << 30) + 8192LL * (1 << 17) + (3LL << 30) / 25 + (512LL << 20),
          "a recipe's weights and overhead");
    const int64_t avail = catalog_need_bytes(&m, NULL, 4096, 1, DT_BF16);
    CHECK(catalog_fit_context(&m, NULL, avail, 1, DT_BF16) == 4096, "bf16: 4k");
    CHECK(catalog_fit_context(&m, q, avail, 1, DT_BF16) == 32768, "the same memory, Q4_K_M: the whole context");
    /* a host of 8 GiB: bf16 does not fit, the recipe does, on the cpu; decode = bandwidth / active bytes */
    struct catalog_host h = {8LL << 30, 0, 1LL << 50, 30e9};
    struct catalog_run r16 = catalog_run_on(&m, NULL, &h), rq = catalog_run_on(&m, q, &h);
    CHECK(r16.ctx16 == 0 && rq.ctx16 == 32768 && !rq.gpu, "fits only quantised");
    CHECK(rq.toks > 9.3 && rq.toks < 9.32, "decode estimate %.3f", rq.toks);
    CHECK(rq.disk == (13LL << 30), "an unpublished recipe needs the bf16 download too");
    /* a GPU holds bf16 weights only: a recipe stays on the cpu */
    h.gpu_mem = 16LL << 30;
    r16 = catalog_run_on(&m, NULL, &h);
    rq = catalog_run_on(&m, q, &h);
    CHECK(r16.gpu && r16.toks == 0 && !rq.gpu, "bf16 on the GPU, unestimated; GGUF on the cpu");
    struct catalog_run b = catalog_best_quant(&m, &h);
    CHECK(b.q == q, "the one recipe that fits is shown");
}

static void recommend(void)
{
    struct catalog c;
    CHECK(catalog_load(&c, "models/catalog.json") == 0, "%s", err_msg());
    /* a 16 GiB machine without a GPU: nothing of 30B fits in bf16, a MoE of about 30B does quantised, and
     * decodes fast enough (3B active) where a dense model as large would not */
    struct catalog_host h = {16LL << 30, 0, 1LL << 40, 40e9};
    struct catalog_run r;
    CHECK(catalog_recommend(&c, &h, &r) == 1, "a recommendation");
    CHECK(r.m && r.q && r.m->params > 28000000000LL && strstr(r.m->arch, "moe") && !r.gpu,
          "16 GiB: %s %s", r.m ? r.m->name : "-", r.q ? r.q->recipe : "bf16");
    CHECK(r.ctx16 >= CATALOG_REC_CTX && r.toks >= CATALOG_REC_TOKS, "its context and rate");
    const struct catalog_quant *chosen = r.q;
    /* half the bandwidth: the same model at fewer bits, never a recipe below the rate */
    h.read_bw = 12e9;
    CHECK(catalog_recommend(&c, &h, &r) == 1 && r.q && r.toks >= CATALOG_REC_TOKS, "slower memory");
    CHECK(r.q && chosen && r.q->bytes <= chosen->bytes, "slower memory: %s", r.q ? r.q->recipe : "bf16");
    /* a big GPU: bf16 there, the largest model that keeps 32k, no decode estimate */
    h.gpu_mem = 140LL << 30;
    CHECK(catalog_recommend(&c, &h, &r) == 1 && r.gpu && !r.q && r.toks == 0, "on a 140 GiB GPU: bf16 on it");
    /* 1 GiB of slow memory: nothing keeps 32k */
    struct catalog_host tiny = {1LL << 30, 0, 1LL << 40, 1e9};
    CHECK(catalog_recommend(&c, &tiny, &r) == -1, "1 GiB: nothing");
    /* 4 GiB at 2 GB/s: something fits, nothing reaches the rate: the fastest */
    struct catalog_host slow = {4LL << 30, 0, 1LL << 40, 2e9};
    CHECK(catalog_recommend(&c, &slow, &r) == 0 && r.m && r.toks < CATALOG_REC_TOKS, "slow: the fastest");
    catalog_free(&c);
}

void test_catalog_fit(void)
{
    struct catalog_model m = {.name = "x", .bytes = 10LL << 30, .context = 32768, .kv_bytes_per_token = 1 << 17,
                              .state_bytes = 100 << 20};
    const int64_t over = (10LL << 30) / 25 + (512LL << 20);
    CHECK(catalog_need_bytes(&m, NULL, 0, 0, DT_F32) == (10LL << 30) + over, "weights and overhead");
    CHECK(catalog_need_bytes(&m, NULL, 8192, 2, DT_F32) == (10LL << 30) + 8192LL * (1 << 17) + 2 * (100LL << 20) + over,
          "kv and state add up");
    const int64_t at8k = catalog_need_bytes(&m, NULL, 8192, 1, DT_F32);
    CHECK(catalog_fit_context(&m, NULL, at8k, 1, DT_F32) == 8192, "exactly enough for 8k");
    CHECK(catalog_fit_context(&m, NULL, at8k - 1, 1, DT_F32) == 4096, "one byte less: 4k");
    CHECK(catalog_fit_context(&m, NULL, catalog_need_bytes(&m, NULL, 4096, 1, DT_F32) - 1, 1, DT_F32) == 0,
          "not even 4k");
    CHECK(catalog_fit_context(&m, NULL, 1LL << 50, 1, DT_F32) == 32768, "never past the trained context");
    m.context = 40960 + 1000;
    CHECK(catalog_fit_context(&m, NULL, 1LL << 50, 1, DT_F32) == 41960, "a context that is not a multiple of 4096");
    CHECK(catalog_fit_context(&m, NULL, catalog_need_bytes(&m, NULL, 12288, 4, DT_F32), 4, DT_F32) == 12288,
          "four sequences' state");
    /* a bf16 cache: half the KV bytes, so the memory of 8k f32 tokens holds 16k */
    m.context = 32768;
    CHECK(catalog_need_bytes(&m, NULL, 16384, 1, DT_BF16) == at8k, "bf16 KV: half the bytes per token");
    CHECK(catalog_fit_context(&m, NULL, at8k, 1, DT_BF16) == 16384, "bf16 KV: twice the context");
    quant_fit();
    recommend();
}
