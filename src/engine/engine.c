/* engine: batch validation, cache slots and visibility for one forward, and
 * committing accepted rows (see engine.h). */
#include "engine.h"

#include "../base/err.h"

#include <stdlib.h>
#include <string.h>

int engine_init(struct engine *e, struct model *m, int32_t n_ctx, int32_t n_seq_max, int32_t max_tokens)
{
    const struct model_config *c = &m->cfg;
    memset(e, 0, sizeof *e);
    e->m = m;
    e->be = m->be;
    e->max_tokens = max_tokens;
    if (max_tokens < 1 || max_tokens > 65536)
        return err_set("engine: batch size %d out of range", max_tokens);
    if (kv_cache_init(&e->kv, m->be, c->n_layer, c->n_kv_head * c->head_dim, n_ctx, n_seq_max, 16) != 0)
        return -1;
    e->kvt = (struct kv_tensors){e->kv.k, e->kv.v};
    if (model_scratch_init(&e->s, m, max_tokens) != 0)
        goto fail;
    size_t n = (size_t)max_tokens;
    int32_t **bufs[] = {&e->slot, &e->seq_row, &e->n_kv, &e->mask_from, &e->out_rows,
                        &e->last_seq, &e->last_parent, &e->last_index};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = calloc(n, sizeof(int32_t)))) {
            err_set("engine: out of memory");
            goto fail;
        }
    e->mask = calloc(n * n, 1);
    if (!e->mask) {
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
    free(e->slot);
    free(e->seq_row);
    free(e->n_kv);
    free(e->mask_from);
    free(e->out_rows);
    free(e->last_seq);
    free(e->last_parent);
    free(e->last_index);
    free(e->mask);
    memset(e, 0, sizeof *e);
}

static int engine_check(const struct engine *e, const struct batch *b)
{
    if (b->n_tokens < 1 || b->n_tokens > e->max_tokens)
        return err_set("engine: batch of %d tokens (1..%d allowed)", b->n_tokens, e->max_tokens);
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

int32_t engine_forward(struct engine *e, const struct batch *b, float *logits, const struct model_trace *trace)
{
    if (engine_check(e, b) != 0)
        return -1;
    struct kv_cache *kv = &e->kv;
    const int32_t n = b->n_tokens;
    int need_mask = 0;
    /* index of each row among its sequence's rows; chain test */
    for (int32_t i = 0; i < n; i++) {
        int32_t prev = -1, idx = 0;
        for (int32_t r = i - 1; r >= 0; r--)
            if (b->seq[r] == b->seq[i]) {
                if (prev < 0)
                    prev = r;
                idx++;
            }
        e->last_index[i] = idx;
        if (b->parent[i] != prev)
            need_mask = 1;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t s = b->seq[i], last = 1;
        for (int32_t r = i + 1; r < n && last; r++)
            last = b->seq[r] != s;
        if (last && kv_seq_reserve(kv, s, e->last_index[i] + 1) != 0)
            return -1;
    }
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
    };
    if (e->be->ops->set_batch(e->be, &ab) != 0)
        return -1;
    model_forward(e->m, &e->s, &e->kvt, n, n_out, trace);
    if (logits && n_out > 0)
        e->be->ops->read(e->be, &e->s.logits, 0, n_out, logits);
    return n_out;
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
    return 0;
}

int engine_commit_all(struct engine *e)
{
    for (int pass = 0; pass < 2; pass++) /* validate every sequence before changing any */
        for (int32_t s = 0; s < e->kv.n_seq_max; s++) {
            int32_t n = 0, prev = -1;
            for (int32_t i = 0; i < e->last_n; i++)
                if (e->last_seq[i] == s) {
                    if (e->last_parent[i] != prev)
                        return err_set("engine: commit: the rows of sequence %d are not one chain", s);
                    prev = i;
                    n++;
                }
            if (pass == 1)
                e->kv.len[s] += n;
        }
    return 0;
}
