/* attention_impl: what attention.cu (decoding, and the dispatch) and
 * attention_flash.cu (prefill on the tensor cores) share: the arguments every
 * attention kernel takes, and the prefill's entry. Internal to src/backend/cuda. */
#ifndef KP_ATTENTION_IMPL_H
#define KP_ATTENTION_IMPL_H

#include "cuda_impl.h"

#define FA_MAX_WARPS 8 /* k_flash: warps a block at most (query heads x row groups) */

struct att_args {
    const float *q;
    int64_t qs;
    const void *kc, *vc; /* the cache: bf16 when kv16, else f32 */
    bool kv16;
    int64_t ks;
    float *out;
    int64_t os;
    float *part; /* [n][n_head][n_split][hd+2]: acc, max, sum; NULL: write normalised output */
    int32_t n, n_head, n_kv_head, hd, gc, n_split, T;
    int32_t max_ranges; /* k_att_decode: a token's keys in at most this many ranges (att_split_len); 0: one */
    const int32_t *sel; /* k_att_decode, k_att_merge: the batch row of each token of the grid (NULL: the same) */
    int32_t fa_hb, fa_rb; /* k_flash: query heads of one kv head, and 16-row groups, per block */
    bool sm90;            /* prefill by flash_sm90.cu's wgmma kernel instead of k_flash */
    /* k_flash: bf16 copies of the keys [n_kv_head][kv_total][hd] and values
     * [n_kv_head][hd][kv_total] (precise: the lo halves follow each), a
     * sequence row's positions from b.kv_off[row], b.kv_len[row] of them */
    __nv_bfloat16 *kb, *vt;
    int64_t kv_total;
    float scale;
    bool vec4; /* rows and heads 16-byte aligned */
    int32_t kpb, vpb, cb; /* k_att_decode: bytes per staged K row and V row; bytes per copy (8 or 16) */
    struct dev_batch b;
    int32_t block_size, max_blocks;
};

/* The keys and values the batch's sequences see as bf16 copies, then
 * prefill attention on the tensor cores for a's row tiles (flash_sm90.cu's
 * kernel where a->sm90, else k_flash): head dims 32, 64, 128, and 256 with
 * bf16 operands only. */
void attention_flash(struct cuda_backend *c, struct att_args *a, int32_t head_dim);

#endif
