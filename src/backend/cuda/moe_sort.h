/* moe_sort: the plan of a large MoE batch's list sorted by expert, made
 * on the host from the experts' row counts, for the cuda backend's batched
 * expert products (moe.cu). Plain C, so that machines without a GPU build
 * and test it.
 *
 * The routing's n tokens with k picks each (nk rows in all) become one
 * compact list, which the GPU fills (k_moe_scatter): expert e's rows at
 * start[e]..start[e+1], its tokens in increasing order, then padding rows
 * up to moe_sort_pad_rows of its count. Experts of one padded size form a
 * bucket: cuBLAS runs a bucket's experts in one batched call, so fewer
 * buckets mean fewer calls, more padding more FLOPs; the padding unit is
 * picked by that cost. */
#ifndef KAPITSA_MOE_SORT_H
#define KAPITSA_MOE_SORT_H

#include <stdbool.h>
#include <stdint.h>

#define MOE_SORT_UNIT_MAX 128

/* Rows a slice of n takes at unit u: rounded up to u, or to the power of
 * two that cuts it in at most 16 parts (past 16 u rows the padding stays
 * under 1/8 of the count, 1/16 on average), so that similar counts fall in
 * one bucket. */
int32_t moe_sort_pad_rows(int32_t n, int32_t u);

/* The most rows the padded list of nk routed rows over E experts has: unit
 * 16 pads under max(16, count / 8) an expert, and a larger unit is taken
 * only while its padding stays under nk + 16 E. */
int64_t moe_sort_cap_rows(int64_t nk, int32_t E);

/* The plan. Its arrays belong to the caller; moe_sort_plan fills them. */
struct moe_sort {
    int32_t n_act;    /* experts with rows */
    int32_t n_bucket; /* distinct slice sizes */
    int32_t unit;     /* the padding unit picked (0: not padded) */
    int64_t n_pad;    /* rows of the list, padding included */
    int32_t *start;   /* [E + 1] expert e's slice: start[e]..start[e+1] */
    int32_t *order;   /* [E] the active experts by slice size, bucket by bucket */
    int32_t *beg;     /* [E + 1] bucket b: order[beg[b]..beg[b+1]] */
    int32_t *n_rows;  /* [E] bucket b's rows an expert */
};

/* The plan for experts of cnt [E] rows. With pad, slices are padded at the
 * unit of least cost: each bucket costs `calls` batched calls of about 20 us
 * (the host enqueueing them, the GPU's ramp and tail), each padded row
 * row_flops at 400 TFLOP/s. Without pad, slices are the counts. Scratch:
 * key [E]. */
void moe_sort_plan(struct moe_sort *s, const int32_t *cnt, int32_t E, bool pad, double row_flops, int32_t calls,
                   int64_t *key);

#endif
