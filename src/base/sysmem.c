/* sysmem: see sysmem.h. */
#include "sysmem.h"

#include <stdio.h>
#include <string.h>

/* A "Key: N kB" line's N in bytes from file; -1 when absent. */
static int64_t kb_field(const char *file, const char *key)
{
    FILE *f = fopen(file, "r");
    char line[256];
    long long kb = -1;
    const size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':')
            sscanf(line + n + 1, "%lld", &kb);
    if (f)
        fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

int64_t sysmem_meminfo(const char *key) { return kb_field("/proc/meminfo", key); }

int64_t sysmem_resident(void) { return kb_field("/proc/self/status", "VmRSS"); }

/* The number in the file dir/name of the cgroup filesystem; -1 when absent
 * or not a number ("max": no limit). */
static int64_t cgroup_value(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

int64_t sysmem_available(void)
{
    int64_t avail = sysmem_meminfo("MemAvailable");
    /* cgroup v2: the line "0::PATH" of /proc/self/cgroup names the process's group */
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "0::", 3) != 0)
            continue;
        line[strcspn(line, "\n")] = 0;
        const int64_t max = cgroup_value(line + 3, "memory.max"), cur = cgroup_value(line + 3, "memory.current");
        if (max >= 0 && cur >= 0 && (avail < 0 || max - cur < avail))
            avail = max > cur ? max - cur : 0;
    }
    if (f)
        fclose(f);
    return avail;
}
