/* progress: feedback on long work (see progress.h). */
#include "progress.h"

#include "../base/clock.h"

#include <string.h>
#include <unistd.h>

void progress_begin(struct progress *p, FILE *f, const char *what, int64_t total, const char *unit)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    p->tty = isatty(fileno(f)) != 0;
    snprintf(p->what, sizeof p->what, "%s", what);
    p->unit = unit;
    p->total = total > 0 ? total : 1;
    p->t0 = clock_now_s();
    p->tenth = -1;
    p->open = true;
}

/* An amount of the unit: bytes as GB (or MB below one GB), else a count. */
static void amount(const struct progress *p, char *buf, size_t n, double x)
{
    if (strcmp(p->unit, "B") != 0)
        snprintf(buf, n, "%.0f", x);
    else if (x >= 1e9)
        snprintf(buf, n, "%.2f GB", x / 1e9);
    else
        snprintf(buf, n, "%.1f MB", x / 1e6);
}

static void rate(const struct progress *p, char *buf, size_t n, double per_s)
{
    if (strcmp(p->unit, "B") == 0)
        snprintf(buf, n, "%.1f MB/s", per_s / 1e6);
    else
        snprintf(buf, n, "%.2f %s/s", per_s, p->unit);
}

static void line(struct progress *p, const char *item)
{
    /* a rate only after half a second: before, it says nothing (a mapped file "loads" at TB/s) */
    const double el = clock_now_s() - p->t0, per_s = el >= 0.5 ? (double)p->done / el : 0;
    char d[32], t[32], r[48] = "", eta[32] = "";
    amount(p, d, sizeof d, (double)p->done);
    amount(p, t, sizeof t, (double)p->total);
    if (per_s > 0) {
        r[0] = ',', r[1] = ' ';
        rate(p, r + 2, sizeof r - 2, per_s);
    }
    if (per_s > 0 && p->done < p->total) {
        const int s = (int)((double)(p->total - p->done) / per_s + 0.5);
        snprintf(eta, sizeof eta, ", %d:%02d left", s / 60, s % 60);
    }
    fprintf(p->f, "%s%s: %s / %s%s%s (%.0f%%)%s%s%s%s%s", p->tty ? "\r\033[K" : "", p->what, d, t,
            strcmp(p->unit, "B") ? " " : "", strcmp(p->unit, "B") ? p->unit : "", 100.0 * p->done / p->total, r, eta,
            item ? "  " : "", item ? item : "", p->tty ? "" : "\n");
    fflush(p->f);
    p->t_drawn = clock_now_s();
}

void progress_update(struct progress *p, int64_t done, const char *item)
{
    if (!p->open)
        return;
    p->done = done < p->total ? done : p->total;
    if (p->tty) {
        if (clock_now_s() - p->t_drawn >= 0.1) /* a redraw ten times a second is smooth enough */
            line(p, item);
        return;
    }
    const int32_t tenth = (int32_t)(10 * p->done / p->total);
    if (tenth > p->tenth && p->done < p->total) { /* the end has progress_end's line */
        p->tenth = tenth;
        line(p, item);
    }
}

void progress_end(struct progress *p)
{
    if (!p->open)
        return;
    const double el = clock_now_s() - p->t0;
    char d[32], r[48] = "";
    amount(p, d, sizeof d, (double)p->done);
    if (el >= 0.05) {
        r[0] = ' ', r[1] = '(';
        rate(p, r + 2, sizeof r - 3, (double)p->done / el);
        strcat(r, ")");
    }
    fprintf(p->f, "%s%s: %s%s%s in %.1f s%s\n", p->tty ? "\r\033[K" : "", p->what, d,
            strcmp(p->unit, "B") ? " " : "", strcmp(p->unit, "B") ? p->unit : "", el, r);
    fflush(p->f);
    p->open = false;
}

void progress_load(void *ctx, const char *source, int64_t done, int64_t total)
{
    struct progress *p = ctx;
    if (!p->open) {
        const char *name = strrchr(source, '/');
        char what[64];
        snprintf(what, sizeof what, "loading %s", name && name[1] ? name + 1 : source);
        progress_begin(p, p->f ? p->f : stderr, what, total, "B");
    }
    progress_update(p, done, NULL);
    if (done >= total)
        progress_end(p);
}
