/* check: validation of an architecture against reference logits.
 *
 * DIR/golden.safetensors (made by transformers, see tests/fixtures/README.md)
 * holds prefill_ids [L], prefill_logits [L][vocab], hidden.0..hidden.N
 * [L][hidden], prompt_ids and greedy_ids. check_run prefills prefill_ids (in
 * one batch, or in the given chunk sizes), compares every logit and the
 * residual stream after each layer, then decodes greedily from prompt_ids one
 * token at a time and compares the ids. */
#ifndef KP_CHECK_H
#define KP_CHECK_H

#include "../backend/backend.h"

#include <stdint.h>

#define CHECK_MAX_CHUNKS 64
#define CHECK_MAX_LAYER 257

struct check_opts {
    const char *golden;  /* NULL: DIR/golden.safetensors */
    int32_t n_chunks;    /* 0: the whole prefill in one batch */
    int32_t chunk[CHECK_MAX_CHUNKS]; /* sizes, repeated cyclically */
    bool rope_freq_f32;  /* default: inv_freq rounded to the stored dtype, as the reference had (model_opts) */
    enum dtype kv_type;  /* the KV cache's dtype: DT_F32 (zero, the default; the 1e-3 bound assumes it) or DT_BF16 */
};

struct check_result {
    int32_t n_prefill;
    int32_t n_layer;
    float max_logit_err;
    bool has_hidden;                   /* the golden holds hidden.* and the prefill was one batch */
    float hidden_err[CHECK_MAX_LAYER]; /* [n_layer+1] when has_hidden */
    int32_t n_greedy;
    int32_t greedy_match;  /* leading ids that matched */
    int32_t greedy_first_bad;
    int32_t greedy_got, greedy_want;
};

/* 0 when the run completed (the result says whether it matched); -1 with err_set(). */
int check_run(const char *dir, struct backend *be, const struct check_opts *o, struct check_result *r);

#endif
