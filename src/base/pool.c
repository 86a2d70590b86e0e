/* pool: parallel-for over a fixed set of pthreads (see pool.h).
 *
 * A job is published by bumping `gen`; workers that see it take task indices
 * from `next`, and the caller returns when every task has finished
 * (`n_finished`), never waiting for a worker that has not woken: on a
 * machine busy with other work (an agent's build beside the server) a worker
 * may be off its core for a whole time slice, and a job that waited for every
 * worker to check in took that long each (decode 400x slower with two busy
 * processes on two cores). A late worker must not read a job's fields while
 * the caller rewrites them for the next one: it announces itself (`inside`)
 * before it looks at `gen`, takes tasks only from the job still `open`, and
 * the caller publishes only when no worker is inside. Waiting is
 * spin-then-sleep for workers, spin-then-yield for the caller. */
#define _GNU_SOURCE
#include "pool.h"

#include "err.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define POOL_SPIN 20000
#define POOL_CALLER_SPIN 256 /* caller's pure spins before it yields its core */

struct pool {
    int32_t n_threads;
    pthread_t *threads;     /* [n_threads-1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t gen;   /* the last job published (0: none yet) */
    _Atomic uint64_t open;  /* the job whose tasks may be taken, 0 once done */
    atomic_int inside;      /* workers between announcing themselves and leaving */
    atomic_int next;        /* next task index to take */
    atomic_int n_finished;  /* tasks of the open job that have run */
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
        atomic_fetch_add_explicit(&p->n_finished, 1, memory_order_release);
    }
}

static void *pool_worker(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    struct pool *p = wa.p;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
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
        /* announced before reading gen: from here on the caller leaves the
         * fields alone, and the job read below is either the open one or done */
        atomic_fetch_add(&p->inside, 1);
        seen = atomic_load(&p->gen);
        if (!atomic_load(&p->stop) && atomic_load(&p->open) == seen)
            pool_drain(p, wa.id);
        atomic_fetch_sub(&p->inside, 1);
        if (atomic_load(&p->stop))
            return NULL;
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

/* Spins while *v != want, then yields its core to whoever it waits for. */
static void caller_wait(atomic_int *v, int want)
{
    for (int spins = 0; atomic_load_explicit(v, memory_order_acquire) != want; spins++)
        if (spins >= POOL_CALLER_SPIN)
            sched_yield();
}

void pool_run(struct pool *p, pool_fn fn, void *ctx, int32_t n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    /* a worker still inside the last job (past its tasks) leaves before its fields change */
    caller_wait(&p->inside, 0);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->n_finished, 0);
    const uint64_t g = atomic_load(&p->gen) + 1; /* only the caller writes gen */
    atomic_store(&p->open, g);
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->gen, g);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pool_drain(p, 0);
    caller_wait(&p->n_finished, n_tasks);
    atomic_store(&p->open, 0);
}
