/* path: see path.h. */
#define _GNU_SOURCE
#include "path.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void path_beside_exe(const char *rel, char *out, size_t n)
{
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = len > 0 ? (exe[len] = 0, strrchr(exe, '/')) : NULL;
    if (!slash) {
        snprintf(out, n, "%s", rel);
        return;
    }
    *slash = 0;
    snprintf(out, n, "%s/../%s", exe, rel);
}
