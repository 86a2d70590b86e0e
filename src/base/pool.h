/* pool: a fixed set of worker threads that run one parallel-for at a time.
 *
 * The engine thread calls pool_run(); workers (and the caller, as worker 0)
 * each take task indices from a shared counter, and the call returns when all
 * n_tasks ran, without waiting for a worker that has not woken yet (on a busy
 * machine it may be off its core for a time slice). Workers spin briefly
 * before sleeping so that the many small parallel-fors of a decode step do not
 * pay a futex round trip each.
 * A pool is used by one thread at a time. */
#ifndef KP_POOL_H
#define KP_POOL_H

#include <stdint.h>

struct pool;

/* fn(ctx, task, worker): worker is in [0, n_threads) and identifies per-thread scratch. */
typedef void (*pool_fn)(void *ctx, int32_t task, int32_t worker);

/* n_threads >= 1 (the caller counts as one). NULL with err_set() on failure. */
struct pool *pool_init(int32_t n_threads);
void pool_free(struct pool *p);
int32_t pool_n_threads(const struct pool *p);
void pool_run(struct pool *p, pool_fn fn, void *ctx, int32_t n_tasks);

#endif
