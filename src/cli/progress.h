/* progress: feedback on long work (a model's load, synth, quantize, eval,
 * bench compare). On a terminal, one line redrawn in place with the rate and
 * the time left; otherwise (a log, a pipe) a line each time the work passes
 * another tenth of its total, so that every step of a short job shows and a
 * long one writes about ten lines, none with a carriage return.
 *
 * Ownership: struct progress is the caller's, borrows f and copies what. */
#ifndef KP_CLI_PROGRESS_H
#define KP_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct progress {
    FILE *f;
    bool tty;
    char what[64];
    const char *unit; /* what done and total count; "B": bytes, shown as MB and GB */
    int64_t total, done;
    double t0, t_drawn;
    int32_t tenth; /* not a terminal: the last tenth of the total written */
    bool open;     /* begun and not ended */
};

/* Work of total units (unit: "tensors", "requests", or "B" for bytes) named what. */
void progress_begin(struct progress *p, FILE *f, const char *what, int64_t total, const char *unit);
/* done units of the total so far; item (may be NULL) names what is under way. */
void progress_update(struct progress *p, int64_t done, const char *item);
/* The work is over: the time it took and its rate. A no-op when not begun. */
void progress_end(struct progress *p);
/* A model's load as model_opts.progress reports it (ctx: a struct progress):
 * a progress per source, ended when its weights are all bound. */
void progress_load(void *ctx, const char *source, int64_t done, int64_t total);

#endif
