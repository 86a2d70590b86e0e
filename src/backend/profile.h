/* profile: a backend that runs another one and times each op (waiting for
 * the op to finish, so GPU ops are timed too), for finding where a forward
 * spends its time. Turned on with KAPITSA_PROFILE=1 (device_open wraps the
 * backend it opens); the table goes to stderr when the backend is freed.
 * Times include each op's launch and wait, so small GPU ops read high. */
#ifndef KP_PROFILE_H
#define KP_PROFILE_H

#include "backend.h"

/* Takes ownership of inner. NULL with err_set() if out of memory (inner freed). */
struct backend *profile_wrap(struct backend *inner);

/* Zeroes the counts when be is a profile wrapper (nothing otherwise): a
 * caller's untimed warm-up (cuBLAS's algorithm choices, first launches,
 * scratch growth) stays out of the table. */
void profile_reset(struct backend *be);

#endif
