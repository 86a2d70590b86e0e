/* clock: seconds on the monotonic clock, for timing. Its origin is
 * arbitrary: only differences between two readings mean anything. */
#ifndef KP_CLOCK_H
#define KP_CLOCK_H

double clock_now_s(void);

#endif
