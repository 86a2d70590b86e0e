/* pool: parallel-for over a fixed set of pthreads (see pool.h).
 *
 * A job is published by bumping `gen`; each worker that sees a new generation
 * pulls task indices from `next` and reports completion through `n_done`.
 * Waiting is spin-then-sleep on both sides. */
#define _GNU_SOURCE
#include "pool.h"

#include "err.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define POOL_SPIN 20000

struct pool {
    int32_t n_threads;
    pthread_t *threads;   /* [n_threads-1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;      /* job generation; odd/even does not matter */
    atomic_int next;      /* next task index to take */
    atomic_int n_done;    /* workers (excluding caller) finished with this job */
    atomic_int stop;
    pool_fn fn;
    void *ctx;
    int32_t n_tasks;
};

struct worker_arg {
    struct pool *p;
    int32_t id;
};

static void pool_drain(struct pool *p, int32_t worker)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks)
            break;
        p->fn(p->ctx, t, worker);
    }
}

static void *pool_worker(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    struct pool *p = wa.p;
    free(arg);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (atomic_load(&p->stop))
                return NULL;
            if (++spins < POOL_SPIN) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop))
            return NULL;
        pool_drain(p, wa.id);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
}

struct pool *pool_init(int32_t n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    struct pool *p = calloc(1, sizeof *p);
    if (!p)
        goto fail;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads)
        goto fail;
    for (int32_t i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa)
            goto fail;
        wa->p = p;
        wa->id = i;
        if (pthread_create(&p->threads[i - 1], NULL, pool_worker, wa) != 0) {
            free(wa);
            p->n_threads = i;
            goto fail;
        }
    }
    return p;
fail:
    err_set("pool: cannot start %d threads", (int)n_threads);
    pool_free(p);
    return NULL;
}

void pool_free(struct pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->threads)
        for (int32_t i = 1; i < p->n_threads; i++)
            pthread_join(p->threads[i - 1], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int32_t pool_n_threads(const struct pool *p) { return p->n_threads; }

void pool_run(struct pool *p, pool_fn fn, void *ctx, int32_t n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pool_drain(p, 0);
    while (atomic_load_explicit(&p->n_done, memory_order_acquire) < p->n_threads - 1)
        ;
}
