/* profile: op timing around another backend (see profile.h). */
#define _GNU_SOURCE
#include "profile.h"

#include "../base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum {
    P_MATMUL, P_MATMUL_FUSED, P_ATTENTION, P_RMSNORM, P_ROPE, P_KV_STORE, P_ATTN_PREP, P_EMBED, P_SWIGLU, P_ADD,
    P_OUT_ROWS, P_MOE, P_SIGMUL, P_RELU2, P_PERMUTE, P_NORM_GATED, P_CONV1D, P_DELTA, P_SSD, P_SET_BATCH, P_READ,
    P_COPY_ROWS, P_TOP_K, P_N
};
static const char *const names[P_N] = {
    "matmul", "matmul_fused", "attention", "rmsnorm", "rope", "kv_store", "attn_prep", "embed", "swiglu", "add",
    "get_out_rows", "moe", "sigmoid_mul", "relu2", "permute_cols", "rmsnorm_gated", "conv1d", "delta_rule", "ssd", "set_batch",
    "read", "copy_rows", "top_k",
};

struct prof {
    struct backend base;
    struct backend *in;
    struct backend_ops ops;
    double t[P_N];
    int64_t n[P_N];
};

static struct prof *prof_of(struct backend *be) { return (struct prof *)be; }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double begin(struct prof *p)
{
    p->in->ops->sync(p->in);
    return now();
}

static void end(struct prof *p, int op, double t0)
{
    p->in->ops->sync(p->in);
    p->t[op] += now() - t0;
    p->n[op]++;
}

#define TIMED(op, call)                                                                                        \
    do {                                                                                                       \
        struct prof *p = prof_of(be);                                                                          \
        struct backend *in = p->in;                                                                            \
        double t0 = begin(p);                                                                                  \
        in->ops->call;                                                                                         \
        end(p, op, t0);                                                                                        \
    } while (0)

static void p_free(struct backend *be)
{
    struct prof *p = prof_of(be);
    double total = 0;
    for (int i = 0; i < P_N; i++)
        total += p->t[i];
    fprintf(stderr, "profile (%s): op, calls, total ms, us per call, share\n", p->in->ops->name);
    for (int i = 0; i < P_N; i++)
        if (p->n[i])
            fprintf(stderr, "  %-14s %8lld %10.2f %10.2f %5.1f%%\n", names[i], (long long)p->n[i], 1e3 * p->t[i],
                    1e6 * p->t[i] / (double)p->n[i], total > 0 ? 100 * p->t[i] / total : 0.0);
    p->in->ops->free(p->in);
    free(p);
}

static void p_info(struct backend *be, struct device_info *out, bool measure)
{
    struct prof *p = prof_of(be);
    p->in->ops->info(p->in, out, measure);
}

void profile_reset(struct backend *be)
{
    if (be->ops->free != p_free)
        return;
    struct prof *p = prof_of(be);
    for (int i = 0; i < P_N; i++) {
        p->t[i] = 0;
        p->n[i] = 0;
    }
}

static int p_alloc(struct backend *be, struct tensor *t, enum dtype type, int64_t r, int64_t c)
{
    struct backend *in = prof_of(be)->in;
    return in->ops->alloc(in, t, type, r, c);
}
static void p_release(struct backend *be, struct tensor *t)
{
    struct backend *in = prof_of(be)->in;
    in->ops->release(in, t);
}
static int p_weight(struct backend *be, struct tensor *dst, const struct tensor *host)
{
    struct backend *in = prof_of(be)->in;
    return in->ops->weight(in, dst, host);
}
static int p_read(struct backend *be, const struct tensor *t, int64_t r0, int64_t n, void *dst)
{
    struct prof *p = prof_of(be);
    const double t0 = begin(p);
    const int rc = p->in->ops->read(p->in, t, r0, n, dst);
    end(p, P_READ, t0);
    return rc;
}
static int p_top_k(struct backend *be, const struct tensor *t, int32_t k, int32_t *ids, float *vals)
{
    struct prof *p = prof_of(be);
    const double t0 = begin(p);
    const int rc = p->in->ops->top_k(p->in, t, k, ids, vals);
    end(p, P_TOP_K, t0);
    return rc;
}
static void p_write(struct backend *be, struct tensor *t, int64_t r0, int64_t n, const void *src)
{
    struct backend *in = prof_of(be)->in;
    in->ops->write(in, t, r0, n, src);
}
static void p_copy_rows(struct backend *be, struct tensor *t, const int32_t *s, const int32_t *d, int32_t n)
{
    TIMED(P_COPY_ROWS, copy_rows(in, t, s, d, n));
}
static void p_sync(struct backend *be)
{
    struct backend *in = prof_of(be)->in;
    in->ops->sync(in);
}
static void p_forward_end(struct backend *be)
{
    struct backend *in = prof_of(be)->in;
    in->ops->forward_end(in);
}
static int p_set_batch(struct backend *be, const struct attn_batch *b)
{
    struct prof *p = prof_of(be);
    double t0 = begin(p);
    int rc = p->in->ops->set_batch(p->in, b);
    end(p, P_SET_BATCH, t0);
    return rc;
}
static void p_embed(struct backend *be, struct tensor *out, const struct tensor *table)
{
    TIMED(P_EMBED, embed(in, out, table));
}
static void p_matmul(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w)
{
    TIMED(P_MATMUL, matmul(in, out, x, w));
}
static void p_matmul_fused(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                           const struct tensor *x, const struct mm_fused *f)
{
    TIMED(P_MATMUL_FUSED, matmul_fused(in, n_w, out, w, x, f));
}
static void p_rmsnorm(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w, float eps)
{
    TIMED(P_RMSNORM, rmsnorm(in, out, x, w, eps));
}
static void p_rope(struct backend *be, struct tensor *x, int32_t nh, int32_t hd, int32_t rd, const struct tensor *f,
                   float scale)
{
    TIMED(P_ROPE, rope(in, x, nh, hd, rd, f, scale));
}
static void p_attn_prep(struct backend *be, struct tensor *q, struct tensor *k, const struct tensor *v,
                        struct tensor *kc, struct tensor *vc, const struct attn_prep *ap)
{
    TIMED(P_ATTN_PREP, attn_prep(in, q, k, v, kc, vc, ap));
}
static void p_kv_store(struct backend *be, struct tensor *kc, struct tensor *vc, const struct tensor *k,
                       const struct tensor *v)
{
    TIMED(P_KV_STORE, kv_store(in, kc, vc, k, v));
}
static void p_attention(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *kc,
                        const struct tensor *vc, int32_t nh, int32_t nkv, int32_t hd, float scale)
{
    TIMED(P_ATTENTION, attention(in, out, q, kc, vc, nh, nkv, hd, scale));
}
static void p_swiglu(struct backend *be, struct tensor *out, const struct tensor *g, const struct tensor *u)
{
    TIMED(P_SWIGLU, swiglu(in, out, g, u));
}
static void p_add(struct backend *be, struct tensor *x, const struct tensor *y) { TIMED(P_ADD, add(in, x, y)); }
static void p_out_rows(struct backend *be, struct tensor *out, const struct tensor *x)
{
    TIMED(P_OUT_ROWS, get_out_rows(in, out, x));
}
static void p_moe(struct backend *be, struct tensor *out, const struct tensor *x, const struct moe_block *mb,
                  bool accumulate)
{
    TIMED(P_MOE, moe(in, out, x, mb, accumulate));
}
static void p_sigmoid_mul(struct backend *be, struct tensor *x, const struct tensor *g)
{
    TIMED(P_SIGMUL, sigmoid_mul(in, x, g));
}
static void p_relu2(struct backend *be, struct tensor *x) { TIMED(P_RELU2, relu2(in, x)); }
static void p_permute(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *map)
{
    TIMED(P_PERMUTE, permute_cols(in, out, x, map));
}
static void p_norm_gated(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *z,
                         const struct tensor *w, float eps, int64_t group, bool gate_first)
{
    TIMED(P_NORM_GATED, rmsnorm_gated(in, out, x, z, w, eps, group, gate_first));
}
static void p_conv1d(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w,
                     const struct tensor *bias, struct tensor *state)
{
    TIMED(P_CONV1D, conv1d(in, out, x, w, bias, state));
}
static void p_delta(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *k,
                    const struct tensor *v, const struct tensor *a, const struct tensor *b, const struct tensor *A_log,
                    const struct tensor *dt_bias, struct tensor *state, int32_t hk, int32_t hv, int32_t dk, int32_t dv)
{
    TIMED(P_DELTA, delta_rule(in, out, q, k, v, a, b, A_log, dt_bias, state, hk, hv, dk, dv));
}
static void p_ssd(struct backend *be, struct tensor *y, const struct tensor *x, const struct tensor *B,
                  const struct tensor *C, const struct tensor *dt, const struct tensor *A_log, const struct tensor *D,
                  const struct tensor *dt_bias, struct tensor *state, const struct ssd_params *sp)
{
    TIMED(P_SSD, ssd(in, y, x, B, C, dt, A_log, D, dt_bias, state, sp));
}

struct backend *profile_wrap(struct backend *inner)
{
    struct prof *p = calloc(1, sizeof *p);
    if (!p) {
        inner->ops->free(inner);
        err_set("profile: out of memory");
        return NULL;
    }
    p->in = inner;
    p->ops = (struct backend_ops){
        .name = inner->ops->name, .kv_bf16 = inner->ops->kv_bf16, .free = p_free, .info = p_info, .alloc = p_alloc, .release = p_release, .weight = p_weight,
        .read = p_read, .top_k = p_top_k, .write = p_write, .copy_rows = p_copy_rows, .sync = p_sync,
        .forward_end = p_forward_end, .set_batch = p_set_batch, .embed = p_embed, .matmul = p_matmul,
        .matmul_fused = p_matmul_fused, .rmsnorm = p_rmsnorm, .rope = p_rope, .kv_store = p_kv_store,
        .attn_prep = p_attn_prep,
        .attention = p_attention, .swiglu = p_swiglu, .add = p_add, .get_out_rows = p_out_rows,
        .moe = p_moe, .sigmoid_mul = p_sigmoid_mul, .relu2 = p_relu2,
        .permute_cols = p_permute, .rmsnorm_gated = p_norm_gated, .conv1d = p_conv1d, .delta_rule = p_delta,
        .ssd = p_ssd,
    };
    p->base.ops = &p->ops;
    return &p->base;
}
