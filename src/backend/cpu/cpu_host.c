/* cpu_host: what the host is, for the cpu backend's device_info and for the
 * commands that report it (doctor, version): the processor's name and
 * flags, its kernel tables, and its read bandwidth measured with a pool of
 * threads. */
#define _GNU_SOURCE
#include "../../base/clock.h"
#include "../../base/pool.h"
#include "../../base/sysmem.h"
#include "cpu.h"
#include "cpu_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cpu_host_query(struct cpu_host *h)
{
    memset(h, 0, sizeof *h);
    snprintf(h->model, sizeof h->model, "unknown");
    h->n_cores = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    bool flags = false;
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!v)
            continue;
        v += 1 + (v[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        if (strncmp(line, "model name", 10) == 0)
            snprintf(h->model, sizeof h->model, "%s", v);
        else if (strncmp(line, "flags", 5) == 0 && !flags) {
            char padded[8200];
            snprintf(padded, sizeof padded, " %s ", v);
            h->avx512_bf16 = strstr(padded, " avx512_bf16 ") != NULL;
            h->amx_bf16 = strstr(padded, " amx_bf16 ") != NULL;
            flags = true;
        }
    }
    if (f)
        fclose(f);
    h->avx2 = kern_supported(&kern_avx2);
    h->avx512 = kern_supported(&kern_avx512);
    h->kernels = kern_best()->name;
}

void cpu_kernels_describe(char *buf, size_t n)
{
    static const struct kern *const tables[] = {&kern_ref, &kern_avx2, &kern_avx512};
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof tables / sizeof *tables && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s%s", i ? " " : "", tables[i]->name,
                               kern_supported(tables[i]) ? "" : " (not on this cpu)");
    if (at < n)
        snprintf(buf + at, n - at, "; running %s", kern_best()->name);
}

/* Bytes of last-level cache on the machine: each distinct L3 once. */
static int64_t host_l3_bytes(void)
{
    int64_t total = 0;
    char seen[1024] = {0};
    const long n_cpu = sysconf(_SC_NPROCESSORS_CONF);
    for (long c = 0; c < n_cpu; c++) {
        char path[128];
        long id = -1, kb = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index3/id", c);
        FILE *f = fopen(path, "r");
        if (f && fscanf(f, "%ld", &id) != 1)
            id = -1;
        if (f)
            fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/cache/index3/size", c);
        f = fopen(path, "r");
        if (f && fscanf(f, "%ldK", &kb) != 1)
            kb = 0;
        if (f)
            fclose(f);
        if (id >= 0 && id < (long)sizeof seen && !seen[id]) {
            seen[id] = 1;
            total += (int64_t)kb << 10;
        }
    }
    return total;
}

struct bw_job {
    float *buf;
    int64_t n_per_task;
    const struct kern *k;
    bool fill; /* the first run writes the buffer, the others read it */
};

static void bw_task(void *ctx, int32_t task, int32_t worker)
{
    (void)worker;
    struct bw_job *j = ctx;
    float *x = j->buf + (int64_t)task * j->n_per_task;
    if (j->fill)
        memset(x, 0, (size_t)j->n_per_task * sizeof *x);
    else
        j->k->sumsq(x, j->n_per_task); /* a call through the kernel table: not optimised away */
}

/* The best of three sums over a buffer of 128 MiB, or four times the L3
 * where that is more, so that a pass reads memory, not the cache the last one
 * filled; the pages are first touched by the workers that read them. */
static double host_read_bandwidth(struct pool *p, const struct kern *k)
{
    const int64_t l3 = host_l3_bytes(), bytes = 4 * l3 > ((int64_t)128 << 20) ? 4 * l3 : (int64_t)128 << 20;
    const int32_t n_task = 256;
    struct bw_job j = {malloc((size_t)bytes), bytes / (int64_t)sizeof(float) / n_task, k, true};
    double best = 0;
    if (j.buf) {
        pool_run(p, bw_task, &j, n_task);
        j.fill = false;
        for (int rep = 0; rep < 3; rep++) {
            const double t0 = clock_now_s();
            pool_run(p, bw_task, &j, n_task);
            const double bw = (double)(j.n_per_task * n_task) * sizeof(float) / (clock_now_s() - t0);
            best = bw > best ? bw : best;
        }
    }
    free(j.buf);
    return best;
}

void cpu_info(struct backend *be, struct device_info *out, bool measure)
{
    struct cpu_backend *c = (struct cpu_backend *)be;
    struct cpu_host h;
    cpu_host_query(&h);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", h.model);
    out->mem_total = sysmem_meminfo("MemTotal");
    out->mem_free = sysmem_available();
    out->n_units = pool_n_threads(c->pool);
    snprintf(out->arch, sizeof out->arch, "%s", c->k->name);
    if (measure && c->read_gbs == 0)
        c->read_gbs = host_read_bandwidth(c->pool, c->k) / 1e9;
    out->read_gbs = measure ? c->read_gbs : 0;
}
