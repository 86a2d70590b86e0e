/* cpu_impl: what the cpu backend's source files share (cpu.c: memory, dense
 * and attention ops; recurrent.c: conv, DeltaNet and Mamba2 scans).
 *
 * Per-forward facts about the batch that several recurrent layers need (which
 * rows belong to which sequence) are worked out once in set_batch. Buffers
 * here grow on demand and are kept: after the first forward of the largest
 * batch nothing is allocated. */
#ifndef KP_CPU_IMPL_H
#define KP_CPU_IMPL_H

#include "../../base/pool.h"
#include "cpu.h"

#include <assert.h>

struct cpu_backend {
    struct backend base;
    struct pool *pool;
    const struct kern *k;
    double read_gbs; /* measured by the first cpu_info (0 before) */
    struct attn_batch b;
    /* the batch's rows grouped by sequence, batch order kept within a group */
    int32_t n_grp;
    int32_t *grp_start; /* [n_grp+1] */
    int32_t *grp_rows;  /* [n_tokens] */
    int32_t cap_rows;
    /* per-worker scratch of the recurrent ops */
    float *scratch;
    int64_t scratch_per_worker;
    /* attention's tasks: runs of consecutive rows of one sequence */
    int32_t *att_tile; /* [n_tokens+1] first row of each run, then n_tokens */
    int32_t cap_tile;
    float *att_acc;    /* [workers][att_scratch floats]: running outputs, scores, maxima, sums */
    int64_t att_acc_per_worker;
    const float **att_qp; /* [workers][ATT_RUN][heads per kv head]: a run's queries */
    float **att_yp;       /* and their outputs */
    int32_t att_n_runs;   /* the last attention's runs (cpu_backend_att_runs) */
    /* products with block-type weights: each worker's rows dequantised to
     * fp32, [workers][DQ_ROWS][widest such weight's columns], sized as the
     * weights are bound so that no op allocates */
    float *dq;
    int64_t dq_per_worker;
    /* the int8 path (kern.h's matmul_q8): taken for block-type weights unless
     * the backend is precise; a product's activation rows rounded once into
     * xq (grown to the largest batch), or, where that cannot grow and in the
     * MoE tasks, a token tile at a time into each worker's xq_own
     * ([workers][KERN_Q8_MAX_NX][widest such row], sized as the weights are bound) */
    bool q8;
    /* the bf16 path (kern.h's matmul_bf16_bf16): taken for BF16 weights
     * unless precise, its activation rows rounded into the same buffers */
    bool bf16;
    uint8_t *xq;
    int64_t xq_cap;
    uint8_t *xq_own;
    int64_t xq_per_worker;
};

#define DQ_ROWS 4 /* weight rows dequantised at once: every token tile passes over them */

static inline struct cpu_backend *cpu_of(struct backend *be) { return (struct cpu_backend *)be; }

static inline float *f32_row(const struct tensor *t, int64_t r)
{
    assert(t->type == DT_F32);
    return (float *)t->data + r * t->row_stride;
}

static inline uint16_t *bf16_row(const struct tensor *t, int64_t r)
{
    assert(t->type == DT_BF16);
    return (uint16_t *)t->data + r * t->row_stride;
}

/* Element i of a weight vector in its stored dtype. */
static inline float weight_at(const struct tensor *w, int64_t i)
{
    switch (w->type) {
    case DT_BF16: return bf16_to_f32(((const uint16_t *)w->data)[i]);
    case DT_F16: return f16_to_f32(((const uint16_t *)w->data)[i]);
    default: return ((const float *)w->data)[i];
    }
}

/* At least `floats` of scratch for each worker; NULL with err_set() if out of memory. */
float *cpu_scratch(struct cpu_backend *c, int64_t floats);
/* Records the sequence grouping of the batch (set_batch). */
int cpu_group_rows(struct cpu_backend *c);

void cpu_conv1d(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w,
                const struct tensor *bias, struct tensor *state);
void cpu_delta_rule(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *k,
                    const struct tensor *v, const struct tensor *a, const struct tensor *b, const struct tensor *A_log,
                    const struct tensor *dt_bias, struct tensor *state, int32_t n_k_head, int32_t n_v_head,
                    int32_t k_dim, int32_t v_dim);
void cpu_ssd(struct backend *be, struct tensor *y, const struct tensor *x, const struct tensor *B, const struct tensor *C,
             const struct tensor *dt, const struct tensor *A_log, const struct tensor *D, const struct tensor *dt_bias,
             struct tensor *state, const struct ssd_params *p);

#endif
