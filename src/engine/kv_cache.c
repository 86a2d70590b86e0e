/* kv_cache: paged KV storage with shared, reference-counted blocks (see kv_cache.h). */
#include "kv_cache.h"

#include "../base/err.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_cache_init(struct kv_cache *kv, struct backend *be, int32_t n_layer, int32_t row_dim, enum dtype type,
                  int32_t n_tokens, int32_t n_seq_max, int32_t block_size)
{
    memset(kv, 0, sizeof *kv);
    if (n_tokens < 1 || n_seq_max < 1 || block_size < 1)
        return err_set("kv_cache: bad size (tokens %d, sequences %d, block %d)", n_tokens, n_seq_max, block_size);
    if (type != DT_F32 && (type != DT_BF16 || !be->ops->kv_bf16))
        return err_set("kv_cache: the %s backend keeps its KV cache in f32%s, not %s (--kv-type f32%s)", be->ops->name,
                       be->ops->kv_bf16 ? " or bf16" : "", dtype_name(type), be->ops->kv_bf16 ? "|bf16" : "");
    kv->be = be;
    kv->n_layer = n_layer;
    kv->row_dim = row_dim;
    kv->block_size = block_size;
    kv->n_blocks = (n_tokens + block_size - 1) / block_size;
    kv->n_seq_max = n_seq_max;
    kv->max_blocks = kv->n_blocks;
    kv->k = calloc((size_t)n_layer + 1, sizeof *kv->k); /* + 1: a model may have no attention layer */
    kv->v = calloc((size_t)n_layer + 1, sizeof *kv->v);
    kv->ref = calloc((size_t)kv->n_blocks, sizeof *kv->ref);
    kv->free_ids = calloc((size_t)kv->n_blocks, sizeof *kv->free_ids);
    kv->table = calloc((size_t)n_seq_max * (size_t)kv->max_blocks, sizeof *kv->table);
    kv->n_held = calloc((size_t)n_seq_max, sizeof *kv->n_held);
    kv->len = calloc((size_t)n_seq_max, sizeof *kv->len);
    kv->mark = calloc((size_t)kv->n_blocks, 1);
    if (!kv->k || !kv->v || !kv->ref || !kv->free_ids || !kv->table || !kv->n_held || !kv->len || !kv->mark) {
        err_set("kv_cache: out of memory");
        goto fail;
    }
    const int64_t rows = (int64_t)kv->n_blocks * block_size;
    for (int32_t l = 0; l < n_layer; l++)
        if (be->ops->alloc(be, &kv->k[l], type, rows, row_dim) != 0 ||
            be->ops->alloc(be, &kv->v[l], type, rows, row_dim) != 0) {
            char why[512]; /* the backend's message, kept before err_set writes over it */
            snprintf(why, sizeof why, "%s", err_msg());
            err_set("kv_cache: %s, for the KV cache of %lld tokens (%.2f GB; a smaller context needs less)", why,
                    (long long)rows, 2.0 * (double)dtype_bytes(type, rows * row_dim) * n_layer / 1e9);
            goto fail;
        }
    for (int32_t b = 0; b < kv->n_blocks; b++)
        kv->free_ids[b] = kv->n_blocks - 1 - b;
    kv->n_free = kv->n_blocks;
    for (int32_t s = 0; s < n_seq_max; s++)
        kv->len[s] = -1;
    return 0;
fail:
    kv_cache_free(kv);
    return -1;
}

void kv_cache_free(struct kv_cache *kv)
{
    for (int32_t l = 0; kv->k && kv->v && l < kv->n_layer; l++) {
        if (kv->k[l].data)
            kv->be->ops->release(kv->be, &kv->k[l]);
        if (kv->v[l].data)
            kv->be->ops->release(kv->be, &kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->ref);
    free(kv->free_ids);
    free(kv->table);
    free(kv->n_held);
    free(kv->len);
    free(kv->mark);
    memset(kv, 0, sizeof *kv);
}

int kv_seq_valid(const struct kv_cache *kv, int32_t seq)
{
    return seq >= 0 && seq < kv->n_seq_max && kv->len[seq] >= 0;
}

int32_t kv_cache_n_free(const struct kv_cache *kv) { return kv->n_free; }

int32_t kv_seq_new(struct kv_cache *kv)
{
    for (int32_t s = 0; s < kv->n_seq_max; s++)
        if (kv->len[s] < 0) {
            kv->len[s] = 0;
            kv->n_held[s] = 0;
            return s;
        }
    return err_set("kv_cache: all %d sequence slots are in use", kv->n_seq_max);
}

int32_t kv_seq_fork(struct kv_cache *kv, int32_t src)
{
    assert(kv_seq_valid(kv, src));
    int32_t s = kv_seq_new(kv);
    if (s < 0)
        return -1;
    /* share only the blocks that hold committed tokens */
    int32_t n = (kv->len[src] + kv->block_size - 1) / kv->block_size;
    int32_t *dst = kv->table + (int64_t)s * kv->max_blocks, *from = kv->table + (int64_t)src * kv->max_blocks;
    for (int32_t b = 0; b < n; b++) {
        dst[b] = from[b];
        kv->ref[from[b]]++;
    }
    kv->n_held[s] = n;
    kv->len[s] = kv->len[src];
    return s;
}

static void kv_block_put(struct kv_cache *kv, int32_t b)
{
    assert(kv->ref[b] > 0);
    if (--kv->ref[b] == 0)
        kv->free_ids[kv->n_free++] = b;
}

static int32_t kv_block_get(struct kv_cache *kv)
{
    if (kv->n_free == 0)
        return -1;
    int32_t b = kv->free_ids[--kv->n_free];
    kv->ref[b] = 1;
    return b;
}

void kv_seq_truncate(struct kv_cache *kv, int32_t seq, int32_t len)
{
    assert(kv_seq_valid(kv, seq) && len >= 0 && len <= kv->len[seq]);
    int32_t keep = (len + kv->block_size - 1) / kv->block_size;
    int32_t *t = kv->table + (int64_t)seq * kv->max_blocks;
    for (int32_t b = keep; b < kv->n_held[seq]; b++)
        kv_block_put(kv, t[b]);
    kv->n_held[seq] = keep;
    kv->len[seq] = len;
}

void kv_seq_free(struct kv_cache *kv, int32_t seq)
{
    kv_seq_truncate(kv, seq, 0);
    kv->len[seq] = -1;
}

int32_t kv_seq_need(const struct kv_cache *kv, int32_t seq, int32_t n)
{
    assert(kv_seq_valid(kv, seq) && n >= 0);
    const int32_t bs = kv->block_size, len = kv->len[seq], held = kv->n_held[seq];
    const int32_t need = (len + n + bs - 1) / bs, first = len / bs;
    const int cow = n > 0 && first < held && kv->ref[kv->table[(int64_t)seq * kv->max_blocks + first]] > 1;
    return (need > held ? need - held : 0) + cow;
}

int32_t kv_cache_n_held(struct kv_cache *kv, const int32_t *seqs, int32_t n)
{
    int32_t count = 0;
    for (int pass = 0; pass < 2; pass++) /* mark and count, then clear the marks */
        for (int32_t i = 0; i < n; i++) {
            assert(kv_seq_valid(kv, seqs[i]));
            const int32_t *t = kv->table + (int64_t)seqs[i] * kv->max_blocks;
            for (int32_t b = 0; b < kv->n_held[seqs[i]]; b++) {
                count += pass == 0 && !kv->mark[t[b]];
                kv->mark[t[b]] = pass == 0;
            }
        }
    return count;
}

int kv_seq_reserve(struct kv_cache *kv, int32_t seq, int32_t n)
{
    assert(kv_seq_valid(kv, seq) && n >= 0);
    const int32_t bs = kv->block_size, len = kv->len[seq];
    int32_t *t = kv->table + (int64_t)seq * kv->max_blocks;
    int32_t need = (len + n + bs - 1) / bs;
    if (need > kv->max_blocks)
        return err_set("kv_cache: sequence of %d tokens exceeds the cache (%d)", len + n, kv->max_blocks * bs);
    /* copy on write: a shared block that the new tokens land in (only the one
     * holding position len can be shared: later ones are never shared) */
    int32_t first = len / bs;
    int32_t n_new = need > kv->n_held[seq] ? need - kv->n_held[seq] : 0;
    int cow = n > 0 && first < kv->n_held[seq] && kv->ref[t[first]] > 1;
    if (n_new + cow > kv->n_free)
        return err_set("kv_cache: out of blocks (%d needed, %d free)", n_new + cow, kv->n_free);
    if (cow) {
        int32_t nb = kv_block_get(kv);
        int32_t src[1024], dst[1024];
        assert(bs <= 1024);
        for (int32_t r = 0; r < bs; r++) {
            src[r] = t[first] * bs + r;
            dst[r] = nb * bs + r;
        }
        for (int32_t l = 0; l < kv->n_layer; l++) {
            kv->be->ops->copy_rows(kv->be, &kv->k[l], src, dst, bs);
            kv->be->ops->copy_rows(kv->be, &kv->v[l], src, dst, bs);
        }
        kv_block_put(kv, t[first]);
        t[first] = nb;
    }
    for (int32_t b = kv->n_held[seq]; b < need; b++)
        t[b] = kv_block_get(kv);
    if (need > kv->n_held[seq])
        kv->n_held[seq] = need;
    return 0;
}

int32_t kv_seq_row(const struct kv_cache *kv, int32_t seq, int32_t pos)
{
    assert(pos / kv->block_size < kv->n_held[seq]);
    return kv->table[(int64_t)seq * kv->max_blocks + pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}
