/* path: see path.h. */
#define _GNU_SOURCE
#include "path.h"

#include "err.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int path_data(const char *rel, char *out, size_t n)
{
    char exe[PATH_MAX], tried[3][PATH_MAX + 64], env[PATH_MAX + 8] = "";
    const char *data = getenv("KAPITSA_DATA");
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = len > 0 ? (exe[len] = 0, strrchr(exe, '/')) : NULL;
    if (slash)
        *slash = 0;
    else
        snprintf(exe, sizeof exe, ".");
    snprintf(tried[0], sizeof tried[0], "%s/../models", exe);
    snprintf(tried[1], sizeof tried[1], "%s/../share/kapitsa/models", exe);
    snprintf(tried[2], sizeof tried[2], "models");
    if (data && *data) {
        snprintf(env, sizeof env, "%s, ", data);
        snprintf(out, n, "%s/%s", data, rel);
        if (access(out, F_OK) == 0)
            return 0;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(out, n, "%s/%s", tried[i], rel);
        if (access(out, F_OK) == 0)
            return 0;
    }
    snprintf(out, n, "%s/%s", tried[0], rel);
    return err_set("%s is in none of %s%s, %s or ./models (make install puts kapitsa's data in "
                   "PREFIX/share/kapitsa/models; KAPITSA_DATA names another folder)",
                   rel, env, tried[0], tried[1]);
}

int path_web(const char *name, char *out, size_t n)
{
    char rel[256];
    snprintf(rel, sizeof rel, "../web/%s", name);
    return path_data(rel, out, n);
}
