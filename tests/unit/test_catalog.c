/* The model catalog (models/catalog.json) and the rule doctor uses for what
 * fits: weights + KV for the context + recurrent state + runtime overhead. */
#include "../../src/hub/catalog.h"
#include "../../src/base/err.h"
#include "test.h"

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
        CHECK((c.m[i].state_bytes > 0) == (strcmp(c.m[i].arch, "qwen3") && strcmp(c.m[i].arch, "qwen3_moe")),
              "%s: recurrent state only on hybrids", c.m[i].name);
    }
    catalog_free(&c);
    struct catalog bad;
    CHECK(catalog_load(&bad, "tests/fixtures/qwen3/config.json") != 0 && strstr(err_msg(), "catalog"),
          "a file without a models list is refused");
}

void test_catalog_fit(void)
{
    struct catalog_model m = {.name = "x", .bytes = 10LL << 30, .context = 32768, .kv_bytes_per_token = 1 << 17,
                              .state_bytes = 100 << 20};
    const int64_t over = (10LL << 30) / 25 + (512LL << 20);
    CHECK(catalog_need_bytes(&m, 0, 0, DT_F32) == (10LL << 30) + over, "weights and overhead");
    CHECK(catalog_need_bytes(&m, 8192, 2, DT_F32) == (10LL << 30) + 8192LL * (1 << 17) + 2 * (100LL << 20) + over,
          "kv and state add up");
    const int64_t at8k = catalog_need_bytes(&m, 8192, 1, DT_F32);
    CHECK(catalog_fit_context(&m, at8k, 1, DT_F32) == 8192, "exactly enough for 8k");
    CHECK(catalog_fit_context(&m, at8k - 1, 1, DT_F32) == 4096, "one byte less: 4k");
    CHECK(catalog_fit_context(&m, catalog_need_bytes(&m, 4096, 1, DT_F32) - 1, 1, DT_F32) == 0, "not even 4k");
    CHECK(catalog_fit_context(&m, 1LL << 50, 1, DT_F32) == 32768, "never past the trained context");
    m.context = 40960 + 1000;
    CHECK(catalog_fit_context(&m, 1LL << 50, 1, DT_F32) == 41960, "a context that is not a multiple of 4096");
    CHECK(catalog_fit_context(&m, catalog_need_bytes(&m, 12288, 4, DT_F32), 4, DT_F32) == 12288, "four sequences' state");
    /* a bf16 cache: half the KV bytes, so the memory of 8k f32 tokens holds 16k */
    m.context = 32768;
    CHECK(catalog_need_bytes(&m, 16384, 1, DT_BF16) == at8k, "bf16 KV: half the bytes per token");
    CHECK(catalog_fit_context(&m, at8k, 1, DT_BF16) == 16384, "bf16 KV: twice the context");
}
