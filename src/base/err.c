/* err: thread-local last error message (see err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char err_buf[1024];

int err_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return -1;
}

const char *err_msg(void) { return err_buf; }

void err_clear(void) { err_buf[0] = 0; }
