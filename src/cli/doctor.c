/* kapitsa doctor: what this machine has (CPU, memory, GPUs, disk) and which
 * catalog models fit it, at what context (the rule in src/hub/catalog.h),
 * and which agent CLIs are installed. */
#define _GNU_SOURCE
#include "../backend/cpu/kern.h"
#include "../backend/device.h"
#include "../base/err.h"
#include "../hub/cache.h"
#include "../hub/catalog.h"
#include "cli.h"
#ifdef KAPITSA_CUDA
#include "../backend/cuda/cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int64_t meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0 && line[strlen(key)] == ':')
            sscanf(line + strlen(key) + 1, "%lld", &kb);
    if (f)
        fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

static void cpu_line(char *model, size_t n, char *flags, size_t fn)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    snprintf(model, n, "unknown");
    flags[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v)
            continue;
        v += 1 + (v[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        if (strncmp(line, "model name", 10) == 0)
            snprintf(model, n, "%s", v);
        else if (strncmp(line, "flags", 5) == 0 && !flags[0])
            snprintf(flags, fn, " %s ", v);
    }
    if (f)
        fclose(f);
}

static int on_path(const char *exe)
{
    const char *path = getenv("PATH");
    char buf[4096];
    while (path && *path) {
        size_t l = strcspn(path, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)l, path, exe);
        if (l && access(buf, X_OK) == 0)
            return 1;
        path += l + (path[l] == ':');
    }
    return 0;
}

/* Free bytes where models are stored: the cache folder or its nearest existing parent. */
static int64_t disk_free(char *dir)
{
    struct statvfs sv;
    while (statvfs(dir, &sv) != 0) {
        char *s = strrchr(dir, '/');
        if (!s || s == dir)
            return statvfs("/", &sv) == 0 ? (int64_t)sv.f_bavail * (int64_t)sv.f_frsize : -1;
        *s = 0;
    }
    return (int64_t)sv.f_bavail * (int64_t)sv.f_frsize;
}

int cli_doctor(int argc, char **argv)
{
    (void)argv;
    if (argc > 0) {
        fprintf(stderr, "usage: kapitsa doctor\n");
        return 2;
    }
    char model[256], flags[8192];
    cpu_line(model, sizeof model, flags, sizeof flags);
    const int64_t mem_total = meminfo("MemTotal"), mem_avail = meminfo("MemAvailable");
    printf("cpu      %s, %ld cores\n", model, sysconf(_SC_NPROCESSORS_ONLN));
    printf("simd     kernels: %s (avx2 %s, avx512 %s)%s%s\n", kern_best()->name,
           kern_supported(&kern_avx2) ? "yes" : "no", kern_supported(&kern_avx512) ? "yes" : "no",
           strstr(flags, " avx512_bf16 ") ? ", avx512_bf16" : "", strstr(flags, " amx_bf16 ") ? ", amx_bf16" : "");
    printf("memory   %.1f GiB total, %.1f GiB available\n", (double)mem_total / (1 << 30),
           (double)mem_avail / (1 << 30));
    int64_t gpu_free = 0;
    char gpu_name[300] = "";
#ifdef KAPITSA_CUDA
    const int32_t n_gpu = cuda_device_count();
    for (int32_t d = 0; d < n_gpu; d++) {
        struct cuda_device_info gi;
        if (cuda_device_query(d, &gi) != 0)
            continue;
        printf("gpu %d    %s, %.1f GiB (%.1f free), compute %d.%d, %d SMs, driver %d.%d, runtime %d.%d\n", d, gi.name,
               (double)gi.total / (1 << 30), (double)gi.free / (1 << 30), gi.major, gi.minor, gi.n_sm,
               gi.driver / 1000, gi.driver % 1000 / 10, gi.runtime / 1000, gi.runtime % 1000 / 10);
        if (d == 0) {
            gpu_free = (int64_t)gi.free;
            snprintf(gpu_name, sizeof gpu_name, "gpu 0 (%s)", gi.name);
        }
    }
    if (n_gpu == 0)
        printf("gpu      none found (this build has the cuda backend)\n");
#else
    printf("gpu      not checked: this kapitsa was built without CUDA\n");
#endif
    char cache[4096];
    hub_cache_dir(cache, sizeof cache);
    char probe[4096];
    snprintf(probe, sizeof probe, "%s", cache);
    const int64_t disk = disk_free(probe);
    printf("disk     %.1f GB free at %s (models: %s)\n", (double)disk / 1e9, probe, cache);

    struct catalog c;
    if (catalog_load(&c, NULL) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    const int64_t cpu_budget = mem_avail;
    printf("\nwhat fits (weights + KV for the context + state + runtime; one sequence):\n");
    printf("  %-26s %9s  %-28s %17s %16s  %s\n", "model", "bf16", "where", "context, bf16 KV", "f32 KV", "disk");
    const struct catalog_model *best = NULL;
    const char *best_where = NULL;
    for (int32_t i = 0; i < c.n; i++) {
        const struct catalog_model *m = &c.m[i];
        const bool gpu = gpu_free > 0 && catalog_fit_context(m, gpu_free, 1, DT_BF16) > 0;
        const int64_t avail = gpu ? gpu_free : cpu_budget;
        const int64_t ctx = catalog_fit_context(m, avail, 1, DT_F32), ctx16 = catalog_fit_context(m, avail, 1, DT_BF16);
        const char *where = gpu ? gpu_name : ctx16 ? "cpu (memory)" : "does not fit";
        char ctxs[32] = "-", ctxs16[32] = "-";
        if (ctx)
            snprintf(ctxs, sizeof ctxs, "%lld", (long long)ctx);
        if (ctx16)
            snprintf(ctxs16, sizeof ctxs16, "%lld", (long long)ctx16);
        printf("  %-26s %6.1f GB  %-28s %17s %16s  %s\n", m->name, (double)m->bytes / 1e9, where, ctxs16, ctxs,
               m->bytes <= disk ? "ok" : "too little free disk");
        /* the recommendation: the most parameters that keep 32k of context (the default bf16 cache) */
        if (ctx16 >= 32768 && m->bytes <= disk && (!best || m->params > best->params)) {
            best = m;
            best_where = gpu ? "gpu" : "cpu";
        }
    }
    if (best)
        printf("\nrecommended: %s on the %s%s%s (kapitsa pull %s%s)\n", best->name, best_where,
               best->draft ? ", draft " : "", best->draft ? best->draft : "", best->name,
               best->draft ? " --with-draft" : "");
    else
        printf("\nrecommended: models/kapitsa-tiny (embedded); no catalog model fits with 32k of context\n");
    catalog_free(&c);

    printf("\nagents   ");
    const char *agents[] = {"claude", "codex", "opencode", "pi"};
    for (int i = 0; i < 4; i++)
        printf("%s %s%s", agents[i], on_path(agents[i]) ? "installed" : "not installed", i < 3 ? ", " : "\n");
    return 0;
}
