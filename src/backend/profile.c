/* profile: op timing around another backend (see profile.h). */
#define _GNU_SOURCE
#include "profile.h"

#include "../base/clock.h"
#include "../base/err.h"

#include <stdio.h>
#include <stdlib.h>

/* an op's index: the forward's ops (BACKEND_OPS), then the batch, reads and copies */
enum {
#define P_ENUM(name, params, args) P_##name,
    BACKEND_OPS(P_ENUM)
#undef P_ENUM
    P_set_batch, P_read, P_copy_rows, P_top_k, P_N
};
static const char *const names[P_N] = {
#define P_NAME(name, params, args) #name,
    BACKEND_OPS(P_NAME)
#undef P_NAME
    "set_batch", "read", "copy_rows", "top_k",
};

struct prof {
    struct backend base;
    struct backend *in;
    struct backend_ops ops;
    double t[P_N];
    int64_t n[P_N];
};

static struct prof *prof_of(struct backend *be) { return (struct prof *)be; }

static double begin(struct prof *p)
{
    p->in->ops->sync(p->in);
    return clock_now_s();
}

static void end(struct prof *p, int op, double t0)
{
    p->in->ops->sync(p->in);
    p->t[op] += clock_now_s() - t0;
    p->n[op]++;
}

/* a forward op, timed: the wrapper of each BACKEND_OPS line */
#define P_WRAP(name, params, args)                                                                                     \
    static void p_##name params                                                                                        \
    {                                                                                                                  \
        struct prof *pr = prof_of(be);                                                                                 \
        struct backend *in = pr->in;                                                                                   \
        const double t0 = begin(pr);                                                                                   \
        in->ops->name args;                                                                                            \
        end(pr, P_##name, t0);                                                                                         \
    }
BACKEND_OPS(P_WRAP)
#undef P_WRAP

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
    end(p, P_read, t0);
    return rc;
}
static int p_top_k(struct backend *be, const struct tensor *t, int32_t k, int32_t *ids, float *vals)
{
    struct prof *p = prof_of(be);
    const double t0 = begin(p);
    const int rc = p->in->ops->top_k(p->in, t, k, ids, vals);
    end(p, P_top_k, t0);
    return rc;
}
static void p_write(struct backend *be, struct tensor *t, int64_t r0, int64_t n, const void *src)
{
    struct backend *in = prof_of(be)->in;
    in->ops->write(in, t, r0, n, src);
}
static void p_copy_rows(struct backend *be, struct tensor *t, const int32_t *s, const int32_t *d, int32_t n)
{
    struct prof *p = prof_of(be);
    const double t0 = begin(p);
    p->in->ops->copy_rows(p->in, t, s, d, n);
    end(p, P_copy_rows, t0);
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
    end(p, P_set_batch, t0);
    return rc;
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
        .name = inner->ops->name, .kv_bf16 = inner->ops->kv_bf16, .prefill_chunk = inner->ops->prefill_chunk,
        .free = p_free, .info = p_info, .alloc = p_alloc, .release = p_release, .weight = p_weight, .read = p_read,
        .top_k = p_top_k, .write = p_write, .copy_rows = p_copy_rows, .sync = p_sync, .forward_end = p_forward_end,
        .set_batch = p_set_batch,
#define P_INIT(name, params, args) .name = p_##name,
        BACKEND_OPS(P_INIT)
#undef P_INIT
    };
    p->base.ops = &p->ops;
    return &p->base;
}
