/* moe_sort: a large MoE batch's routed rows sorted by expert on the host
 * (see moe_sort.h). The list's order is the one the cpu backend's MoE sums
 * in: each token's experts in increasing id. */
#include "moe_sort.h"

#include <assert.h>
#include <stdlib.h>

int32_t moe_sort_pad_rows(int32_t n, int32_t u)
{
    while (u * 16 < n)
        u *= 2;
    return (n + u - 1) / u * u;
}

int64_t moe_sort_cap_rows(int64_t nk, int32_t E)
{
    return 2 * nk + 16 * (int64_t)E;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* key [n_act]: count << 32 | expert, ascending. The padded size grows with
 * the count at any unit, so in this order each unit's buckets are runs. On
 * the H200 the 12-layer qwen3-30b-a3b's 512-token prefill ran about 15%
 * faster at unit 64 than at 16, nemotron-3-nano's best at 32; a few tokens
 * an expert keep 16. */
static int32_t pick_unit(const int64_t *key, int32_t n_act, int64_t nk, int32_t E, double row_flops, int32_t calls)
{
    int32_t best = 16;
    double best_cost = 0.0;
    for (int32_t u = 16; u <= MOE_SORT_UNIT_MAX; u *= 2) {
        int32_t n_bucket = 0, prev = -1;
        int64_t padding = 0;
        for (int32_t i = 0; i < n_act; i++) {
            const int32_t c = (int32_t)(key[i] >> 32), r = moe_sort_pad_rows(c, u);
            n_bucket += r != prev;
            prev = r;
            padding += r - c;
        }
        const double cost = 20.0 * calls * n_bucket + (double)padding * row_flops / 4e8;
        if (u == 16 || (cost < best_cost && nk + padding <= moe_sort_cap_rows(nk, E))) {
            best = u;
            best_cost = cost;
        }
    }
    return best;
}

void moe_sort_build(struct moe_sort *s, int32_t *list, const int32_t *ids, const float *weights, int64_t n, int32_t k,
                    int32_t E, bool pad, double row_flops, int32_t calls, int32_t *cur, int64_t *key)
{
    assert(k >= 1 && k <= MOE_SORT_MAX_K && E >= 1);
    const int64_t nk = n * k;
    for (int32_t e = 0; e < E; e++)
        cur[e] = 0;
    for (int64_t i = 0; i < nk; i++) {
        assert(ids[i] >= 0 && ids[i] < E);
        cur[ids[i]]++;
    }
    s->n_act = 0;
    for (int32_t e = 0; e < E; e++)
        if (cur[e])
            key[s->n_act++] = (int64_t)cur[e] << 32 | e;
    qsort(key, (size_t)s->n_act, sizeof *key, cmp_i64);
    s->unit = pad ? pick_unit(key, s->n_act, nk, E, row_flops, calls) : 0;
    s->start[0] = 0;
    for (int32_t e = 0; e < E; e++) {
        const int32_t r = pad && cur[e] ? moe_sort_pad_rows(cur[e], s->unit) : cur[e];
        s->start[e + 1] = s->start[e] + r;
        cur[e] = s->start[e];
    }
    s->n_pad = s->start[E];
    assert(s->n_pad <= moe_sort_cap_rows(nk, E));
    s->n_bucket = 0;
    for (int32_t i = 0; i < s->n_act; i++) {
        const int32_t e = (int32_t)(key[i] & 0xffffffff), r = s->start[e + 1] - s->start[e];
        s->order[i] = e;
        if (i == 0 || r != s->n_rows[s->n_bucket - 1]) {
            s->beg[s->n_bucket] = i;
            s->n_rows[s->n_bucket++] = r;
        }
    }
    s->beg[s->n_bucket] = s->n_act;
    s->rows = list;
    s->tpos = list + s->n_pad;
    s->tw = (float *)(s->tpos + nk);
    for (int64_t p = 0; p < s->n_pad; p++)
        s->rows[p] = 0; /* padding rows gather token 0 */
    /* tokens in increasing order, each one's picks by increasing expert id:
     * every slice gets its tokens in order, every token its rows in the
     * order of the list */
    for (int64_t t = 0; t < n; t++) {
        int32_t id[MOE_SORT_MAX_K];
        float w[MOE_SORT_MAX_K];
        for (int32_t j = 0; j < k; j++) {
            int32_t m = j;
            for (; m > 0 && id[m - 1] > ids[t * k + j]; m--) {
                id[m] = id[m - 1];
                w[m] = w[m - 1];
            }
            id[m] = ids[t * k + j];
            w[m] = weights[t * k + j];
        }
        for (int32_t j = 0; j < k; j++) {
            const int32_t p = cur[id[j]]++;
            s->rows[p] = (int32_t)t;
            s->tpos[t * k + j] = p;
            s->tw[t * k + j] = w[j];
        }
    }
}
