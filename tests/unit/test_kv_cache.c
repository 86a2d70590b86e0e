/* Tests of the paged KV cache bookkeeping: block sharing on fork, copy on
 * write into a shared partial block, truncation, running out, and the counts
 * admission reserves by. */
#include "../../src/backend/cpu/cpu.h"
#include "../../src/base/err.h"
#include "../../src/base/dtype.h"
#include "../../src/engine/kv_cache.h"
#include "test.h"

#include <string.h>

static float row_val(struct kv_cache *kv, int32_t seq, int32_t pos)
{
    return ((float *)kv->k[0].data)[(int64_t)kv_seq_row(kv, seq, pos) * kv->row_dim];
}

static void put(struct kv_cache *kv, int32_t seq, int32_t pos, float v)
{
    ((float *)kv->k[0].data)[(int64_t)kv_seq_row(kv, seq, pos) * kv->row_dim] = v;
}

void test_kv_cache_blocks(void)
{
    struct backend *be = cpu_backend_init(1, NULL);
    struct kv_cache kv;
    CHECK(kv_cache_init(&kv, be, 2, 8, DT_F32, 64, 3, 16) == 0, "%s", err_msg()); /* 4 blocks of 16 */
    int32_t a = kv_seq_new(&kv);
    CHECK(a == 0 && kv_cache_n_free(&kv) == 4, "new");
    CHECK(kv_seq_reserve(&kv, a, 20) == 0 && kv_cache_n_free(&kv) == 2, "reserve 20 = 2 blocks");
    for (int32_t p = 0; p < 20; p++)
        put(&kv, a, p, (float)p);
    kv.len[a] = 20;

    int32_t b = kv_seq_fork(&kv, a);
    CHECK(b == 1 && kv.len[b] == 20 && kv_cache_n_free(&kv) == 2, "fork shares blocks");
    /* what a reservation would take: past the held blocks, plus the shared partial block's copy */
    int32_t ab[2] = {a, b};
    CHECK(kv_seq_need(&kv, b, 0) == 0 && kv_seq_need(&kv, b, 1) == 1 && kv_seq_need(&kv, b, 13) == 2 &&
              kv_seq_need(&kv, a, 12) == 1,
          "need counts the copy on write and new blocks");
    CHECK(kv_cache_n_held(&kv, ab, 2) == 2 && kv_cache_n_held(&kv, ab, 1) == 2, "shared blocks held once");
    CHECK(kv_seq_row(&kv, a, 5) == kv_seq_row(&kv, b, 5) && kv_seq_row(&kv, a, 17) == kv_seq_row(&kv, b, 17),
          "same rows");
    /* b writes position 20: block 1 is shared and partly filled -> copied */
    CHECK(kv_seq_reserve(&kv, b, 1) == 0 && kv_cache_n_free(&kv) == 1, "cow takes a block");
    CHECK(kv_seq_row(&kv, a, 17) != kv_seq_row(&kv, b, 17) && kv_seq_row(&kv, a, 3) == kv_seq_row(&kv, b, 3),
          "only the partial block is copied");
    CHECK(row_val(&kv, b, 17) == 17.0f && row_val(&kv, b, 19) == 19.0f, "copied rows keep their data");
    put(&kv, b, 20, 100.0f);
    put(&kv, b, 18, -1.0f);
    CHECK(row_val(&kv, a, 18) == 18.0f, "writes to the copy do not reach the original");

    /* truncate a to 10: its second block goes back only if unshared (it is a's own now) */
    kv_seq_truncate(&kv, a, 10);
    CHECK(kv.len[a] == 10 && kv_cache_n_free(&kv) == 2, "truncate frees a's second block, free=%d",
          kv_cache_n_free(&kv));
    CHECK(row_val(&kv, a, 9) == 9.0f, "kept rows intact");
    /* a grows again into the shared block 0? no: position 10 lies in block 0, shared with b */
    CHECK(kv_seq_reserve(&kv, a, 1) == 0 && kv_seq_row(&kv, a, 10) != kv_seq_row(&kv, b, 10), "cow of block 0");
    CHECK(row_val(&kv, a, 3) == 3.0f, "cow copied block 0");
    /* out of blocks: a cannot take 3 more blocks */
    CHECK(kv_seq_reserve(&kv, a, 60) != 0 && strstr(err_msg(), "kv_cache"), "%s", err_msg());
    int32_t c = kv_seq_new(&kv);
    CHECK(c == 2 && kv_seq_new(&kv) < 0 && strstr(err_msg(), "sequence slots"), "slots exhausted");
    kv_seq_free(&kv, a);
    kv_seq_free(&kv, b);
    kv_seq_free(&kv, c);
    CHECK(kv_cache_n_free(&kv) == 4, "all blocks back: %d", kv_cache_n_free(&kv));
    kv_cache_free(&kv);
    be->ops->free(be);
}

/* A bf16 cache: half-width rows that copy on write whole; a backend whose
 * kernels read f32 caches only is refused, naming the flag that works. */
void test_kv_cache_bf16(void)
{
    struct backend *be = cpu_backend_init(1, NULL);
    struct kv_cache kv;
    CHECK(kv_cache_init(&kv, be, 2, 8, DT_BF16, 64, 2, 16) == 0, "%s", err_msg());
    CHECK(kv.k[1].type == DT_BF16 && kv.v[0].type == DT_BF16, "bf16 storage");
    int32_t a = kv_seq_new(&kv);
    CHECK(kv_seq_reserve(&kv, a, 20) == 0, "%s", err_msg());
    for (int32_t p = 0; p < 20; p++)
        for (int32_t c = 0; c < 8; c++)
            ((uint16_t *)kv.v[1].data)[(int64_t)kv_seq_row(&kv, a, p) * kv.row_dim + c] = f32_to_bf16((float)p + c / 8.0f);
    kv.len[a] = 20;
    int32_t b = kv_seq_fork(&kv, a);
    CHECK(kv_seq_reserve(&kv, b, 1) == 0 && kv_seq_row(&kv, a, 17) != kv_seq_row(&kv, b, 17), "copy on write");
    for (int32_t p = 16; p < 20; p++)
        for (int32_t c = 0; c < 8; c++)
            CHECK(bf16_to_f32(((uint16_t *)kv.v[1].data)[(int64_t)kv_seq_row(&kv, b, p) * kv.row_dim + c]) ==
                      (float)p + c / 8.0f,
                  "copied row %d col %d", p, c);
    uint16_t got[8];
    const int32_t r17 = kv_seq_row(&kv, b, 17);
    CHECK(be->ops->read(be, &kv.v[1], r17, 1, got) == 0 && memcmp(got, (uint16_t *)kv.v[1].data + (int64_t)r17 * kv.row_dim,
                                                                   sizeof got) == 0,
          "read returns bf16 rows as stored");
    kv_cache_free(&kv);
    struct backend_ops ops = *be->ops;
    ops.kv_bf16 = false;
    struct backend f32_only = {&ops};
    CHECK(kv_cache_init(&kv, &f32_only, 2, 8, DT_BF16, 32, 2, 16) != 0 && strstr(err_msg(), "--kv-type f32"), "%s",
          err_msg());
    CHECK(kv_cache_init(&kv, be, 2, 8, DT_F16, 32, 2, 16) != 0 && strstr(err_msg(), "f32 or bf16, not F16"), "%s",
          err_msg());
    be->ops->free(be);
}
