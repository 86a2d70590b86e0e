/* engine: batch validation, cache slots and visibility for one forward, and
 * committing accepted rows (see engine.h). */
#include "engine.h"

#include "../base/err.h"
#include "../model/layers.h"

#include <stdlib.h>
#include <string.h>

int engine_init(struct engine *e, struct model *m, int32_t n_ctx, int32_t n_seq_max, int32_t max_tokens,
                int32_t max_out, int32_t n_keep, enum dtype kv_type)
{
    const struct model_config *c = &m->cfg;
    memset(e, 0, sizeof *e);
    e->m = m;
    e->be = m->be;
    e->max_tokens = max_tokens;
    e->n_keep = n_keep;
    e->last_n_out = -1;
    if (max_tokens < 1 || max_tokens > 65536 || max_out < 1 || max_out > max_tokens || n_keep < 0 ||
        n_keep > max_tokens)
        return err_set("engine: batch size %d, output rows %d or kept rows %d out of range", max_tokens, max_out,
                       n_keep);
    if (kv_cache_init(&e->kv, m->be, c->n_attn_layer, c->n_kv_head * c->head_dim, kv_type, n_ctx, n_seq_max, 16) != 0)
        return -1;
    /* slots: the zero slot, one committed per sequence, one per sequence for
     * its last row in a forward, and the kept rows */
    if (state_cache_init(&e->st, m->be, c, n_seq_max, 1 + 2 * n_seq_max + n_keep) != 0)
        goto fail;
    e->kvt = (struct kv_tensors){e->kv.k, e->kv.v, e->st.conv, e->st.ssm};
    if (model_scratch_init(&e->s, m, max_tokens, max_out) != 0)
        goto fail;
    size_t n = (size_t)max_tokens;
    int32_t **bufs[] = {&e->slot,     &e->seq_row,  &e->n_kv,        &e->mask_from,  &e->out_rows,
                        &e->state_in, &e->state_out, &e->last_seq, &e->last_parent, &e->last_index};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = calloc(n, sizeof(int32_t)))) {
            err_set("engine: out of memory");
            goto fail;
        }
    e->mask = calloc(n * n, 1);
    e->seq_rows = calloc((size_t)e->kv.n_seq_max, sizeof(int32_t));
    e->seq_last = calloc((size_t)e->kv.n_seq_max, sizeof(int32_t));
    if (!e->mask || !e->seq_rows || !e->seq_last) {
        err_set("engine: out of memory");
        goto fail;
    }
    return 0;
fail:
    engine_free(e);
    return -1;
}

void engine_free(struct engine *e)
{
    if (e->s.max_tokens)
        model_scratch_free(&e->s, e->m);
    if (e->kv.k)
        kv_cache_free(&e->kv);
    if (e->st.seq_slot)
        state_cache_free(&e->st);
    free(e->slot);
    free(e->seq_row);
    free(e->n_kv);
    free(e->mask_from);
    free(e->out_rows);
    free(e->state_in);
    free(e->state_out);
    free(e->last_seq);
    free(e->last_parent);
    free(e->last_index);
    free(e->mask);
    free(e->seq_rows);
    free(e->seq_last);
    memset(e, 0, sizeof *e);
}

bool engine_is_recurrent(const struct engine *e) { return e->st.n_rec_layer > 0; }

/* Gives back the state slots of the last forward that no commit took. */
static void engine_drop_pending(struct engine *e)
{
    for (int32_t i = 0; i < e->last_n; i++)
        if (e->state_out[i] > 0) {
            state_slot_give(&e->st, e->state_out[i]);
            e->state_out[i] = -1;
        }
    e->last_n = 0;
}

int32_t engine_seq_new(struct engine *e)
{
    int32_t seq = kv_seq_new(&e->kv);
    if (seq >= 0 && state_seq_init(&e->st, seq, -1) != 0) {
        kv_seq_free(&e->kv, seq);
        return -1;
    }
    return seq;
}

int32_t engine_seq_fork(struct engine *e, int32_t src)
{
    if (!kv_seq_valid(&e->kv, src)) {
        err_set("engine: fork: sequence %d does not exist", src);
        return -1;
    }
    int32_t seq = kv_seq_fork(&e->kv, src);
    if (seq >= 0 && state_seq_init(&e->st, seq, src) != 0) {
        kv_seq_free(&e->kv, seq);
        return -1;
    }
    return seq;
}

void engine_seq_free(struct engine *e, int32_t seq)
{
    if (!kv_seq_valid(&e->kv, seq))
        return;
    for (int32_t i = 0; i < e->last_n; i++) /* its uncommitted rows can no longer be committed */
        if (e->last_seq[i] == seq)
            e->last_seq[i] = -1;
    state_seq_release(&e->st, seq);
    kv_seq_free(&e->kv, seq);
}

int32_t engine_seq_len(const struct engine *e, int32_t seq) { return e->kv.len[seq]; }

int engine_seq_truncate(struct engine *e, int32_t seq, int32_t len)
{
    if (!kv_seq_valid(&e->kv, seq) || len < 0 || len > e->kv.len[seq])
        return err_set("engine: truncate: sequence %d has no %d tokens", seq, len);
    if (engine_is_recurrent(e) && len != e->kv.len[seq])
        return err_set("engine: sequence %d: a model with recurrent layers cannot go back from %d to %d tokens "
                       "(fork a snapshot at the earlier token instead)", seq, e->kv.len[seq], len);
    kv_seq_truncate(&e->kv, seq, len);
    return 0;
}

/* Recurrent state slots for the batch (see engine.h): every row reads its
 * sequence's committed slot; the last row of each sequence, every row of a
 * tree and every row of a chain short enough for the kept rows left get a
 * fresh slot for the state after them. */
static int engine_state_slots(struct engine *e, const struct batch *b)
{
    const int32_t n = b->n_tokens;
    struct state_cache *st = &e->st;
    for (int32_t i = 0; i < n; i++) {
        e->state_in[i] = st->n_rec_layer ? st->seq_slot[b->seq[i]] : 0;
        e->state_out[i] = -1;
    }
    if (!st->n_rec_layer)
        return 0;
    int32_t keep = e->n_keep;
    for (int32_t i = 0; i < n; i++) {
        int first = 1, rows = 0, chain = 1, prev = -1;
        for (int32_t r = 0; r < i && first; r++)
            first = b->seq[r] != b->seq[i];
        if (!first)
            continue;
        for (int32_t r = i; r < n; r++)
            if (b->seq[r] == b->seq[i]) {
                chain &= b->parent[r] == prev;
                prev = r;
                rows++;
            }
        const int all = rows > 1 && rows - 1 <= keep;
        if (!chain && !all)
            return err_set("engine: a tree of %d rows needs %d kept recurrent states, %d are left (engine_init n_keep)",
                           rows, rows - 1, keep);
        for (int32_t r = i; r < n; r++)
            if (b->seq[r] == b->seq[i] && (r == prev || all)) {
                if ((e->state_out[r] = state_slot_take(st)) < 0)
                    return err_set("engine: out of recurrent state slots");
                keep -= r != prev;
            }
    }
    return 0;
}

static int engine_check(const struct engine *e, const struct batch *b)
{
    if (b->n_tokens < 1 || b->n_tokens > e->max_tokens)
        return err_set("engine: batch of %d tokens (1..%d allowed)", b->n_tokens, e->max_tokens);
    int32_t n_out = 0;
    for (int32_t i = 0; i < b->n_tokens; i++)
        n_out += b->logits[i] != 0;
    if (n_out > e->s.max_out)
        return err_set("engine: %d rows want logits, at most %d a forward (engine_init max_out)", n_out,
                       e->s.max_out);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t p = b->parent[i];
        if (!kv_seq_valid(&e->kv, b->seq[i]))
            return err_set("engine: token %d: sequence %d does not exist", i, b->seq[i]);
        if (b->token[i] < 0 || b->token[i] >= e->m->cfg.vocab_size)
            return err_set("engine: token %d: id %d outside the vocabulary (%d)", i, b->token[i],
                           e->m->cfg.vocab_size);
        if (b->pos[i] < 0)
            return err_set("engine: token %d: negative position", i);
        if (p < -1 || p >= i || (p >= 0 && b->seq[p] != b->seq[i]))
            return err_set("engine: token %d: parent %d must be -1 or an earlier token of the same sequence", i, p);
    }
    return 0;
}

/* One pass over rows [0, n) of sequences seq (-1: a row to skip) with
 * parents parent: e->seq_rows[s] ends as sequence s's row count and
 * e->seq_last[s] as its last row; index (may be NULL) gets each row's place
 * among its sequence's rows. Returns the first row whose parent is not the
 * row before it in its sequence (a tree, or a chain out of order), or -1. */
static int32_t engine_walk(struct engine *e, const int32_t *seq, const int32_t *parent, int32_t n, int32_t *index)
{
    for (int32_t i = 0; i < n; i++)
        if (seq[i] >= 0) {
            e->seq_rows[seq[i]] = 0;
            e->seq_last[seq[i]] = -1;
        }
    int32_t broken = -1;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = seq[i];
        if (s < 0)
            continue;
        if (index)
            index[i] = e->seq_rows[s];
        e->seq_rows[s]++;
        if (parent[i] != e->seq_last[s] && broken < 0)
            broken = i;
        e->seq_last[s] = i;
    }
    return broken;
}

int32_t engine_forward(struct engine *e, const struct batch *b, float *logits, const struct model_trace *trace)
{
    e->last_n_out = -1;
    if (engine_check(e, b) != 0)
        return -1;
    engine_drop_pending(e);
    struct kv_cache *kv = &e->kv;
    const int32_t n = b->n_tokens;
    /* index of each row among its sequence's rows; chain test (one pass: a
     * quadratic scan cost 8.6 ms of host time per 4096-row chunk) */
    const int need_mask = engine_walk(e, b->seq, b->parent, n, e->last_index) >= 0;
    for (int32_t i = 0; i < n; i++)
        if (e->seq_last[b->seq[i]] == i && kv_seq_reserve(kv, b->seq[i], e->last_index[i] + 1) != 0)
            return -1;
    e->last_n = n; /* the slots taken below are given back if anything fails */
    for (int32_t i = 0; i < n; i++)
        e->last_seq[i] = -1;
    if (engine_state_slots(e, b) != 0)
        return -1;
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = b->seq[i], len = kv->len[s];
        e->seq_row[i] = s;
        e->slot[i] = kv_seq_row(kv, s, len + e->last_index[i]);
        e->n_kv[i] = len + e->last_index[i] + 1;
        e->mask_from[i] = len;
        if (need_mask) {
            uint8_t *row = e->mask + (size_t)i * e->max_tokens;
            memset(row, 0, (size_t)e->last_index[i] + 1);
            for (int32_t a = i; a >= 0; a = b->parent[a])
                row[e->last_index[a]] = 1;
        }
        if (b->logits[i])
            e->out_rows[n_out++] = i;
        e->last_seq[i] = s;
        e->last_parent[i] = b->parent[i];
    }
    e->last_n = n;
    struct attn_batch ab = {
        .n_tokens = n, .token = b->token, .pos = b->pos, .slot = e->slot, .seq_row = e->seq_row,
        .n_kv = e->n_kv, .mask_from = e->mask_from, .mask = need_mask ? e->mask : NULL,
        .mask_stride = e->max_tokens, .block_table = kv->table, .n_seq_rows = kv->n_seq_max,
        .max_blocks = kv->max_blocks, .block_size = kv->block_size, .n_out = n_out, .out_rows = e->out_rows,
        .parent = b->parent, .state_in = e->state_in, .state_out = e->state_out, .owner = e,
    };
    if (e->be->ops->set_batch(e->be, &ab) != 0)
        return -1;
    model_forward(e->m, &e->s, &e->kvt, n, n_out, trace);
    e->be->ops->forward_end(e->be);
    e->last_n_out = n_out;
    /* a backend failure in the forward shows here (or at engine_out_top): nothing is committed */
    if (logits && n_out > 0 && e->be->ops->read(e->be, &e->s.logits, 0, n_out, logits) != 0)
        return -1;
    return n_out;
}

static int top_k_check(const struct engine *e, int32_t k)
{
    if (k < 1 || k > TOP_K_MAX || k > e->m->cfg.vocab_size)
        return err_set("engine: top %d of the logits: out of range (1..%d)", k, TOP_K_MAX);
    return 0;
}

int engine_out_top(struct engine *e, int32_t k, int32_t *ids, float *vals)
{
    if (top_k_check(e, k) != 0)
        return -1;
    if (e->last_n_out < 0)
        return err_set("engine: no output rows of a forward to rank (none ran, or a row was computed since)");
    if (e->last_n_out == 0)
        return 0;
    struct tensor lg = tensor_rows(&e->s.logits, 0, e->last_n_out);
    return e->be->ops->top_k(e->be, &lg, k, ids, vals);
}

int engine_row_logits(struct engine *e, int32_t row, float *out)
{
    if (row < 0 || row >= e->last_n)
        return err_set("engine: the last forward has no row %d", row);
    struct tensor lg = layers_logits_row(e->m, &e->s, row);
    e->last_n_out = -1; /* the scratch's first row is this one's now */
    return e->be->ops->read(e->be, &lg, 0, 1, out);
}

int engine_row_top(struct engine *e, int32_t row, int32_t k, int32_t *ids, float *vals)
{
    if (row < 0 || row >= e->last_n)
        return err_set("engine: the last forward has no row %d", row);
    if (top_k_check(e, k) != 0)
        return -1;
    struct tensor lg = layers_logits_row(e->m, &e->s, row);
    e->last_n_out = -1;
    return e->be->ops->top_k(e->be, &lg, k, ids, vals);
}

int engine_commit(struct engine *e, int32_t seq, const int32_t *rows, int32_t n)
{
    struct kv_cache *kv = &e->kv;
    if (!kv_seq_valid(kv, seq))
        return err_set("engine: commit: sequence %d does not exist", seq);
    const int32_t len = kv->len[seq];
    for (int32_t k = 0; k < n; k++) {
        int32_t r = rows[k];
        if (r < 0 || r >= e->last_n || e->last_seq[r] != seq ||
            e->last_parent[r] != (k == 0 ? -1 : rows[k - 1]))
            return err_set("engine: commit: row %d is not the next step of a path in sequence %d", r, seq);
    }
    int32_t slot = n > 0 && e->st.n_rec_layer ? e->state_out[rows[n - 1]] : -1;
    if (n > 0 && e->st.n_rec_layer && slot < 0)
        return err_set("engine: commit: the recurrent state after row %d was not kept (engine_init n_keep)",
                       rows[n - 1]);
    /* rows move down to consecutive positions; a path's k-th row sits at index >= k,
     * so copying in order never overwrites a row still to be read */
    for (int32_t k = 0; k < n; k++) {
        int32_t from = e->last_index[rows[k]];
        if (from == k)
            continue;
        int32_t src = kv_seq_row(kv, seq, len + from), dst = kv_seq_row(kv, seq, len + k);
        for (int32_t l = 0; l < kv->n_layer; l++) {
            e->be->ops->copy_rows(e->be, &kv->k[l], &src, &dst, 1);
            e->be->ops->copy_rows(e->be, &kv->v[l], &src, &dst, 1);
        }
    }
    kv->len[seq] = len + n;
    if (slot > 0) {
        state_seq_set(&e->st, seq, slot);
        e->state_out[rows[n - 1]] = -1;
    }
    for (int32_t i = 0; i < e->last_n; i++) /* committed once */
        if (e->last_seq[i] == seq)
            e->last_seq[i] = -1;
    return 0;
}

int engine_commit_all(struct engine *e)
{
    /* every sequence validated before any changes: its rows one chain */
    const int32_t broken = engine_walk(e, e->last_seq, e->last_parent, e->last_n, NULL);
    if (broken >= 0)
        return err_set("engine: commit: the rows of sequence %d are not one chain", e->last_seq[broken]);
    for (int32_t i = 0; i < e->last_n; i++) {
        const int32_t s = e->last_seq[i];
        if (s < 0 || e->seq_last[s] != i)
            continue;
        e->kv.len[s] += e->seq_rows[s];
        if (e->st.n_rec_layer) {
            state_seq_set(&e->st, s, e->state_out[i]);
            e->state_out[i] = -1;
        }
    }
    for (int32_t i = 0; i < e->last_n; i++)
        e->last_seq[i] = -1;
    return 0;
}
