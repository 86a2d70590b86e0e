/* kv_cache: the paged key/value cache of one context.
 *
 * Storage is one pool of fixed-size blocks per layer (block_size token rows of
 * n_kv_head*head_dim each, F32 or BF16, in backend memory), allocated once. A sequence
 * is a block table plus a committed length. Sequences that share a prefix
 * share its blocks (reference counts): fork copies only the table; the first
 * write into a shared, partly filled block copies that block (copy on write);
 * truncate drops the tail. Nothing here allocates after kv_cache_init.
 *
 * Ownership: the cache owns the storage tensors and all tables. */
#ifndef KP_KV_CACHE_H
#define KP_KV_CACHE_H

#include "../backend/backend.h"

#include <stdint.h>

struct kv_cache {
    struct backend *be;
    int32_t n_layer;
    int32_t row_dim;      /* n_kv_head * head_dim */
    int32_t block_size;
    int32_t n_blocks;
    int32_t n_seq_max;
    int32_t max_blocks;   /* table width: blocks one sequence can hold */
    struct tensor *k, *v; /* [n_layer] each [n_blocks*block_size][row_dim] */
    int32_t *ref;         /* [n_blocks] sequences holding each block */
    int32_t *free_ids;    /* [n_blocks] stack of free block ids */
    int32_t n_free;
    int32_t *table;       /* [n_seq_max][max_blocks] */
    int32_t *n_held;      /* [n_seq_max] blocks in each table */
    int32_t *len;         /* [n_seq_max] committed tokens; -1: sequence slot unused */
    uint8_t *mark;        /* [n_blocks] scratch of kv_cache_n_held */
};

/* n_tokens: total cache capacity in tokens over all sequences; type DT_F32
 * or DT_BF16 (a backend without ops->kv_bf16 is refused with err_set()). */
int kv_cache_init(struct kv_cache *kv, struct backend *be, int32_t n_layer, int32_t row_dim, enum dtype type,
                  int32_t n_tokens, int32_t n_seq_max, int32_t block_size);
void kv_cache_free(struct kv_cache *kv);

/* A new empty sequence id, or -1 with err_set() when all slots are used. */
int32_t kv_seq_new(struct kv_cache *kv);
/* A new sequence sharing all of src's committed tokens, or -1. */
int32_t kv_seq_fork(struct kv_cache *kv, int32_t src);
void kv_seq_free(struct kv_cache *kv, int32_t seq);
/* Keeps the first len tokens (len <= current length). */
void kv_seq_truncate(struct kv_cache *kv, int32_t seq, int32_t len);
/* Makes room for positions [len, len+n) and makes their blocks private to seq.
 * -1 with err_set() when the cache is full (nothing changed for seq's tokens). */
int kv_seq_reserve(struct kv_cache *kv, int32_t seq, int32_t n);
/* Cache row of position pos (< reserved capacity) of seq. */
int32_t kv_seq_row(const struct kv_cache *kv, int32_t seq, int32_t pos);
int kv_seq_valid(const struct kv_cache *kv, int32_t seq);
/* Blocks kv_seq_reserve(kv, seq, n) would take from the free list: those past
 * the ones seq holds, plus a copy of a shared, partly filled block. */
int32_t kv_seq_need(const struct kv_cache *kv, int32_t seq, int32_t n);
/* Distinct blocks the sequences seqs[0..n) hold together (a shared one once). */
int32_t kv_cache_n_held(struct kv_cache *kv, const int32_t *seqs, int32_t n);
/* Free blocks left. */
int32_t kv_cache_n_free(const struct kv_cache *kv);

#endif
