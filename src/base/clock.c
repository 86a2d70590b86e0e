/* clock: the monotonic clock in seconds (see clock.h). */
#define _GNU_SOURCE
#include "clock.h"

#include <time.h>

double clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
