/* Tests of moe_sort, the host-side plan of a large MoE batch's list the
 * cuda backend's expert products run over: slices padded to a few sizes
 * within the cap, buckets of equal sizes, and the padding unit its cost
 * picks (runs without a GPU; the list itself is filled on the GPU and
 * tested there, test_cuda_moe). */
#include "../../src/backend/cuda/moe_sort.h"
#include "test.h"

#include <stdlib.h>

/* a small LCG: the same routings on every libc */
static uint32_t next_rand(uint32_t *seed)
{
    *seed = *seed * 1664525u + 1013904223u;
    return *seed >> 8;
}

/* a routing of n tokens, k distinct experts each out of E, skewed toward
 * low ids when skew (some experts get many rows, some none) */
static void route(int32_t *ids, int64_t n, int32_t k, int32_t E, bool skew, uint32_t *seed)
{
    for (int64_t t = 0; t < n; t++)
        for (int32_t j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                const int32_t r = (int32_t)(next_rand(seed) % (uint32_t)E);
                e = skew ? (int32_t)((int64_t)r * r / E) : r;
                dup = false;
                for (int32_t m = 0; m < j; m++)
                    dup |= ids[t * k + m] == e;
            } while (dup);
            ids[t * k + j] = e;
        }
}

/* s checked against the counts it was planned from; the number of failed
 * properties */
static int verify(const struct moe_sort *s, const int32_t *cnt, int32_t E, bool pad)
{
    int bad = 0;
    int64_t nk = 0;
    int32_t n_act = 0;
    for (int32_t e = 0; e < E; e++) {
        const int32_t size = s->start[e + 1] - s->start[e];
        nk += cnt[e];
        n_act += cnt[e] > 0;
        bad += pad ? size != (cnt[e] ? moe_sort_pad_rows(cnt[e], s->unit) : 0) : size != cnt[e];
    }
    bad += s->start[0] != 0 || s->start[E] != s->n_pad || s->n_pad > moe_sort_cap_rows(nk, E) || s->n_act != n_act;
    /* buckets: every active expert once, sizes equal within one and increasing across */
    int32_t *in = calloc((size_t)E, sizeof *in);
    bad += s->beg[0] != 0 || s->beg[s->n_bucket] != s->n_act;
    for (int32_t b = 0; b < s->n_bucket; b++) {
        bad += b > 0 && s->n_rows[b] <= s->n_rows[b - 1];
        for (int32_t i = s->beg[b]; i < s->beg[b + 1]; i++) {
            const int32_t e = s->order[i];
            bad += e < 0 || e >= E || cnt[e] == 0 || s->start[e + 1] - s->start[e] != s->n_rows[b] || in[e]++;
        }
    }
    free(in);
    return bad;
}

struct planned {
    struct moe_sort s;
    int32_t *arr;
    int64_t *key;
};

static void plan(struct planned *p, const int32_t *cnt, int32_t E, bool pad, double row_flops)
{
    p->arr = malloc((size_t)(4 * E + 2) * sizeof(int32_t));
    p->key = malloc((size_t)E * sizeof(int64_t));
    p->s = (struct moe_sort){0};
    p->s.start = p->arr;
    p->s.order = p->arr + E + 1;
    p->s.beg = p->s.order + E;
    p->s.n_rows = p->s.beg + E + 1;
    moe_sort_plan(&p->s, cnt, E, pad, row_flops, 2, p->key);
}

static void planned_free(struct planned *p)
{
    free(p->arr);
    free(p->key);
}

void test_moe_sort(void)
{
    uint32_t seed = 7;
    CHECK(moe_sort_pad_rows(1, 16) == 16 && moe_sort_pad_rows(16, 16) == 16 && moe_sort_pad_rows(17, 16) == 32 &&
              moe_sort_pad_rows(256, 16) == 256 && moe_sort_pad_rows(257, 16) == 288 &&
              moe_sort_pad_rows(33, 64) == 64 && moe_sort_pad_rows(1025, 64) == 1152,
          "pad_rows: a multiple of the unit, the unit doubled past 16 of them");
    /* qwen3-30b-a3b's experts (hidden 2048, intermediate 768, gate, up and
     * down), and shapes of the fixtures and of nemotron's 6-of-128 */
    const struct {
        int64_t n;
        int32_t k, E;
        bool skew, pad;
        double row_flops;
    } cases[] = {
        {512, 8, 128, false, true, 2.0 * 2048 * 768 * 3},   {4096, 8, 128, false, true, 2.0 * 2048 * 768 * 3},
        {512, 6, 128, true, true, 2.0 * 2688 * 1856 * 2},   {300, 2, 4, false, true, 2.0 * 64 * 32 * 3},
        {70, 8, 1024, true, true, 2.0 * 2048 * 512 * 3},    {65, 1, 3, true, false, 1.0},
        {1000, 10, 512, true, true, 2.0 * 2048 * 512 * 3},  {1, 32, 32, false, true, 1.0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = cases[c].n, nk = n * cases[c].k;
        int32_t *ids = malloc((size_t)nk * sizeof *ids);
        route(ids, n, cases[c].k, cases[c].E, cases[c].skew, &seed);
        int32_t *cnt = calloc((size_t)cases[c].E, sizeof *cnt);
        for (int64_t i = 0; i < nk; i++)
            cnt[ids[i]]++;
        struct planned p;
        plan(&p, cnt, cases[c].E, cases[c].pad, cases[c].row_flops);
        CHECK(verify(&p.s, cnt, cases[c].E, cases[c].pad) == 0, "case %zu: the plan", c);
        CHECK(cases[c].pad ? p.s.unit >= 16 && p.s.unit <= MOE_SORT_UNIT_MAX : p.s.unit == 0, "case %zu: unit %d", c,
              p.s.unit);
        if (c == 4)
            CHECK(p.s.unit == 16, "a few rows an expert keep unit 16, got %d", p.s.unit);
        planned_free(&p);
        free(cnt);
        free(ids);
    }
    /* expert e routed e + 1 rows: counts 1..128, spread wide. For
     * qwen3-30b-a3b's rows, unit 16 makes 8 buckets (cost 320 + 23 us), 32
     * makes 4 (160 + 47), 64 makes 2 (80 + 95), 128 one (40 + 192): 64. Rows
     * nearly free take one bucket (128, whose padding 8128 stays under the
     * cap, 8256 + 16 * 128); rows dear keep 16. */
    const int32_t E = 128;
    int32_t cnt[128];
    for (int32_t e = 0; e < E; e++)
        cnt[(e * 37) % E] = e + 1; /* the counts away from the ids' order */
    const struct {
        double row_flops;
        int32_t unit, n_bucket;
    } want[] = {{2.0 * 2048 * 768 * 3, 64, 2}, {1.0, 128, 1}, {1e12, 16, 8}};
    for (size_t c = 0; c < sizeof want / sizeof want[0]; c++) {
        struct planned p;
        plan(&p, cnt, E, true, want[c].row_flops);
        CHECK(p.s.unit == want[c].unit && p.s.n_bucket == want[c].n_bucket, "row cost %g: unit %d in %d buckets",
              want[c].row_flops, p.s.unit, p.s.n_bucket);
        CHECK(verify(&p.s, cnt, E, true) == 0, "row cost %g: the plan", want[c].row_flops);
        planned_free(&p);
    }
}
