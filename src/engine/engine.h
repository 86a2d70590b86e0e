/* engine: one context of a model: its KV cache, its scratch, and the one
 * forward that every use goes through (batched and chunked prefill, several
 * sequences decoded together, speculative tree verification).
 *
 * A batch holds tokens of any number of sequences. Token i of sequence s sees
 * the committed tokens of s plus the batch tokens on its parent chain
 * (parent = index in this batch of the token it follows, -1 = it follows the
 * committed tokens directly). A prefill chunk is a chain, a decode step one
 * token with parent -1, a draft tree a tree. A forward writes the batch's K/V
 * into the cache beyond each sequence's committed length; engine_commit then
 * keeps the rows the caller accepts (all of a chain; one path of a tree).
 *
 * Recurrent layers (hybrid models) keep their state beside the KV cache
 * (state_cache.h): a forward computes each row's state from its parent's, and
 * keeps it for the last row of each sequence and, within n_keep rows per
 * forward, for every row of a tree and every row of a short chain, so that a
 * commit can end on any of them. A sequence of a recurrent model cannot be cut
 * back (engine_seq_truncate fails); to return to an earlier token, fork the
 * sequence there first (a snapshot) and continue from the fork.
 *
 * Ownership: the engine borrows the model (which must outlive it) and owns the
 * caches, the scratch and the per-forward index buffers, all sized at init. */
#ifndef KP_ENGINE_H
#define KP_ENGINE_H

#include "../model/model.h"
#include "kv_cache.h"
#include "state_cache.h"

#include <stdint.h>

struct batch {
    int32_t n_tokens;
    const int32_t *token;  /* [n_tokens] */
    const int32_t *pos;    /* [n_tokens] position in its sequence (rope) */
    const int32_t *seq;    /* [n_tokens] sequence id (engine_seq_new / engine_seq_fork) */
    const int32_t *parent; /* [n_tokens] earlier index in this batch, or -1 */
    const uint8_t *logits; /* [n_tokens] 1 = return this row's logits */
};

struct engine {
    struct model *m;
    struct backend *be;
    struct kv_cache kv;
    struct state_cache st;
    struct kv_tensors kvt;
    int32_t n_keep;
    struct model_scratch s;
    int32_t max_tokens;
    /* per-forward, [max_tokens] unless noted */
    int32_t *slot, *seq_row, *n_kv, *mask_from, *out_rows;
    int32_t *state_in, *state_out; /* recurrent state slots of each row */
    uint8_t *mask; /* [max_tokens][max_tokens] */
    int32_t *seq_rows, *seq_last; /* [n_seq_max]: a forward's rows of each sequence so far, and its last */
    /* the last forward, for engine_commit */
    int32_t last_n, last_n_out;
    int32_t *last_seq, *last_parent, *last_index; /* index: position of the row among its sequence's rows */
};

/* n_ctx: cache capacity in tokens (all sequences together); n_seq_max: live
 * sequences; max_tokens: largest batch; max_out: the most rows of a batch
 * that want logits (a prefill chunk one, a decode step one per sequence, a
 * verified tree all its nodes; 1..max_tokens); n_keep: rows per forward, beyond the
 * last of each sequence, whose recurrent state is kept for a commit to end on
 * (speculative trees and chains; 0 is enough for prefill and decoding; no
 * effect on models without recurrent layers); kv_type: the KV cache's
 * dtype, DT_F32 or DT_BF16 (see kv_cache_init). */
int engine_init(struct engine *e, struct model *m, int32_t n_ctx, int32_t n_seq_max, int32_t max_tokens,
                int32_t max_out, int32_t n_keep, enum dtype kv_type);
void engine_free(struct engine *e);

/* Sequences: a new empty one, or a fork sharing all of src's committed tokens
 * (KV blocks shared, recurrent state copied): -1 with err_set() when no
 * sequence or state slot is free. */
int32_t engine_seq_new(struct engine *e);
int32_t engine_seq_fork(struct engine *e, int32_t src);
void engine_seq_free(struct engine *e, int32_t seq);
/* Keeps the first len committed tokens; -1 with err_set() on a recurrent model
 * unless len is the current length. */
int engine_seq_truncate(struct engine *e, int32_t seq, int32_t len);
/* The number of committed tokens of seq. */
int32_t engine_seq_len(const struct engine *e, int32_t seq);
/* Whether the model has recurrent layers (its sequences cannot be truncated). */
bool engine_is_recurrent(const struct engine *e);

/* Runs the batch. logits (host, may be NULL) receives [n_out][vocab] for the
 * rows flagged in b->logits, in batch order. Returns n_out, or -1 with
 * err_set() for a malformed batch, a full cache or a backend failure (a GPU
 * error; nothing is committed). Without logits a failure in the forward shows
 * at engine_out_top, or at the next forward. */
int32_t engine_forward(struct engine *e, const struct batch *b, float *logits, const struct model_trace *trace);

/* The k largest logits (backend top_k order: larger first, then the lower
 * id) of each output row of the last forward, for a forward run with no host
 * logits: greedy decoding and draft trees read k ids (and values, when vals
 * is not NULL) per row instead of the vocabulary. ids/vals: host [n_out][k],
 * k <= TOP_K_MAX. -1 with err_set() for a k out of range or a backend failure. */
int engine_out_top(struct engine *e, int32_t k, int32_t *ids, float *vals);

/* Logits of row `row` of the last forward (host out [vocab]), computed on
 * demand: a tree verification asks only for the nodes its acceptance visits.
 * Valid until the next forward; -1 with err_set() for a row it did not have.
 * Both this and engine_row_top overwrite the forward's first output row. */
int engine_row_logits(struct engine *e, int32_t row, float *out);
/* The same row's top k, as engine_out_top gives them. */
int engine_row_top(struct engine *e, int32_t row, int32_t k, int32_t *ids, float *vals);

/* Makes rows[0..n) of the last forward (all of sequence seq, each the child of
 * the one before, the first with parent -1) the next n committed tokens of seq. */
int engine_commit(struct engine *e, int32_t seq, const int32_t *rows, int32_t n);
/* Commits every row of the last forward, for batches where each sequence's
 * rows form one chain (prefill chunks, decode steps). */
int engine_commit_all(struct engine *e);

#endif
