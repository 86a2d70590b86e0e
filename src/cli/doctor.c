/* kapitsa doctor: what this machine has (CPU, memory, GPUs, disk), which
 * catalog models fit it, in bf16 and quantised, at what context (the rule in
 * src/hub/catalog.h) and at what estimated decode rate, which one to run, and
 * which agent CLIs are installed. */
#define _GNU_SOURCE
#include "../backend/cpu/kern.h"
#include "../backend/device.h"
#include "../base/clock.h"
#include "../base/err.h"
#include "../base/path.h"
#include "../base/pool.h"
#include "../base/sysmem.h"
#include "../hub/cache.h"
#include "../hub/catalog.h"
#include "cli.h"
#ifdef KAPITSA_CUDA
#include "../backend/cuda/cuda.h"
#endif

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

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

/* Bytes of last-level cache on the machine: each distinct L3 once. */
static int64_t l3_bytes(void)
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

/* The host's read bandwidth in bytes/s on every core: the best of three sums
 * over a buffer of 128 MiB, or four times the L3 where that is more, so that
 * a pass reads memory, not the cache the last one filled (bench measures the
 * same way over 1 GiB; doctor's buffer is smaller because filling it, page by
 * page, is most of the time taken). 0 when the buffer cannot be had. */
static double read_bandwidth(void)
{
    const int64_t l3 = l3_bytes(), bytes = 4 * l3 > ((int64_t)128 << 20) ? 4 * l3 : (int64_t)128 << 20;
    const int32_t n_task = 256;
    struct bw_job j = {malloc((size_t)bytes), bytes / (int64_t)sizeof(float) / n_task, kern_best(), true};
    struct pool *p = j.buf ? pool_init((int32_t)sysconf(_SC_NPROCESSORS_ONLN)) : NULL;
    double best = 0;
    if (p) {
        pool_run(p, bw_task, &j, n_task); /* the pages, touched by the workers that read them */
        j.fill = false;
        for (int rep = 0; rep < 3; rep++) {
            const double t0 = clock_now_s();
            pool_run(p, bw_task, &j, n_task);
            const double bw = (double)(j.n_per_task * n_task) * sizeof(float) / (clock_now_s() - t0);
            best = bw > best ? bw : best;
        }
    }
    pool_free(p);
    free(j.buf);
    return best;
}

/* One row of what fits: appended to the JSON array out, or printed when out is NULL. */
static void print_run(const struct catalog_run *r, const char *name, const char *gpu_name, int64_t disk, json_t *out)
{
    if (out) {
        json_array_append_new(
            out, json_pack("{s:s,s:s,s:I,s:s?,s:I,s:I,s:o,s:b}", "name", r->m->name, "weights",
                           r->q ? r->q->recipe : "bf16", "bytes", (json_int_t)(r->q ? r->q->bytes : r->m->bytes),
                           "where", r->gpu ? "gpu" : r->ctx16 ? "cpu" : NULL, "context_bf16_kv", (json_int_t)r->ctx16,
                           "context_f32_kv", (json_int_t)r->ctx, "decode_tok_s",
                           r->toks > 0 ? json_real(r->toks) : json_null(), "disk_ok", r->disk <= disk));
        return;
    }
    char ctxs[32] = "-", ctxs16[32] = "-", toks[32] = "-";
    if (r->ctx)
        snprintf(ctxs, sizeof ctxs, "%lld", (long long)r->ctx);
    if (r->ctx16)
        snprintf(ctxs16, sizeof ctxs16, "%lld", (long long)r->ctx16);
    if (r->toks > 0)
        snprintf(toks, sizeof toks, "%.1f tok/s", r->toks);
    printf("  %-26s %-7s %6.1f GB  %-28s %17s %8s %12s  %s\n", name, r->q ? r->q->recipe : "bf16",
           (double)(r->q ? r->q->bytes : r->m->bytes) / 1e9,
           r->gpu ? gpu_name : r->ctx16 ? "cpu (memory)" : "does not fit", ctxs16, ctxs, toks,
           r->disk <= disk ? "ok" : "too little free disk");
}

static void doctor_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa doctor [--json]   (this machine: CPU, memory, GPUs, disk, which models fit, agent CLIs)\n"
               "  --json: the same as one JSON object, sizes in bytes\n");
}

/* What runs here with nothing to download, the embedded model, and a server
 * already on serve's default address (KAPITSA_HOST:KAPITSA_PORT, else
 * 127.0.0.1:11435), which the commands talk to and a second serve would
 * collide with. */
static void doctor_local(FILE *out, json_t *j)
{
    char path[PATH_MAX + 64], real[PATH_MAX];
    if (path_data("kapitsa-tiny", path, sizeof path) == 0 && realpath(path, real)) {
        const int64_t bytes = cli_dir_bytes(real);
        fprintf(out, "embedded kapitsa-tiny (%.1f MB at %s), the default --model: runs with no download, a small\n"
                     "         model for trying kapitsa out and for tests (its draft: kapitsa-tiny-draft)\n",
                (double)bytes / 1e6, real);
        if (j)
            json_object_set_new(j, "embedded", json_pack("{s:s,s:s,s:I,s:s}", "name", "kapitsa-tiny", "path", real,
                                                         "bytes", (json_int_t)bytes, "draft", "kapitsa-tiny-draft"));
    } else {
        fprintf(out, "embedded none: %s\n", err_msg());
        if (j)
            json_object_set_new(j, "embedded", json_null());
    }
    const char *host = getenv("KAPITSA_HOST");
    int64_t port = 11435;
    if (cli_env_int("KAPITSA_PORT", 1, 65535, &port) < 0)
        port = 11435;
    char base[512], *body = NULL;
    cli_server_url(base, sizeof base, host && *host ? host : "127.0.0.1", (int)port);
    const int status = cli_server_get(base, "/v1/models", NULL, &body);
    json_t *models = status == 200 ? json_loads(body, 0, NULL) : NULL;
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(models, "data"), 0), "id"));
    if (id)
        fprintf(out, "server   %s is served at %s (kapitsa ps: what it holds; another serve there needs --port)\n", id,
                base);
    else if (status == 0)
        fprintf(out, "server   none at %s (kapitsa serve starts one)\n", base);
    else
        fprintf(out, "server   something answers at %s, not as an open kapitsa server would (%s)\n", base,
                status == 200 ? "GET /v1/models names no model" : err_msg());
    if (j)
        json_object_set_new(j, "server", json_pack("{s:s,s:b,s:s?}", "url", base, "answers", status != 0, "model", id));
    json_decref(models);
    free(body);
    err_clear();
}

int cli_doctor(int argc, char **argv)
{
    json_t *j = NULL;
    for (int i = 0; i < argc; i++) {
        if (!cli_switch(argv[i], "--json")) {
            json_decref(j);
            return cli_arg_reject(argv[i], doctor_usage);
        }
        if (!j)
            j = json_object();
    }
    /* the text goes to stdout, or with --json nowhere: the JSON is built beside it */
    FILE *out = j ? fopen("/dev/null", "w") : stdout;
    if (!out) {
        perror("kapitsa doctor: /dev/null");
        json_decref(j);
        return 1;
    }
    char model[256], flags[8192];
    cpu_line(model, sizeof model, flags, sizeof flags);
    const int64_t mem_total = sysmem_meminfo("MemTotal"), mem_avail = sysmem_available();
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(out, "cpu      %s, %ld cores\n", model, cores);
    fprintf(out, "simd     kernels: %s (avx2 %s, avx512 %s)%s%s\n", kern_best()->name,
            kern_supported(&kern_avx2) ? "yes" : "no", kern_supported(&kern_avx512) ? "yes" : "no",
            strstr(flags, " avx512_bf16 ") ? ", avx512_bf16" : "", strstr(flags, " amx_bf16 ") ? ", amx_bf16" : "");
    fprintf(out, "memory   %.1f GiB total, %.1f GiB available\n", (double)mem_total / (1 << 30),
            (double)mem_avail / (1 << 30));
    json_t *gpus = j ? json_array() : NULL;
    if (j) {
        json_object_set_new(j, "cpu", json_pack("{s:s,s:I,s:s,s:b,s:b,s:b,s:b}", "model", model, "cores",
                                                (json_int_t)cores, "kernels", kern_best()->name, "avx2",
                                                kern_supported(&kern_avx2), "avx512", kern_supported(&kern_avx512),
                                                "avx512_bf16", strstr(flags, " avx512_bf16 ") != NULL, "amx_bf16",
                                                strstr(flags, " amx_bf16 ") != NULL));
        json_object_set_new(j, "memory", json_pack("{s:I,s:I}", "total_bytes", (json_int_t)mem_total,
                                                   "available_bytes", (json_int_t)mem_avail));
        json_object_set_new(j, "gpus", gpus);
    }
    int64_t gpu_free = 0;
    char gpu_name[300] = "";
#ifdef KAPITSA_CUDA
    if (j)
        json_object_set_new(j, "cuda", json_true());
    const int32_t n_gpu = cuda_device_count();
    for (int32_t d = 0; d < n_gpu; d++) {
        struct cuda_device_info gi;
        if (cuda_device_query(d, &gi) != 0)
            continue;
        char cc[32];
        snprintf(cc, sizeof cc, "%d.%d", gi.major, gi.minor);
        if (j)
            json_array_append_new(gpus, json_pack("{s:i,s:s,s:I,s:I,s:s,s:i,s:i,s:i}", "index", d, "name", gi.name,
                                                  "total_bytes", (json_int_t)gi.total, "free_bytes",
                                                  (json_int_t)gi.free, "compute", cc, "sms", gi.n_sm, "driver",
                                                  gi.driver, "runtime", gi.runtime));
        fprintf(out, "gpu %d    %s, %.1f GiB (%.1f free), compute %d.%d, %d SMs, driver %d.%d, runtime %d.%d\n", d, gi.name,
               (double)gi.total / (1 << 30), (double)gi.free / (1 << 30), gi.major, gi.minor, gi.n_sm,
               gi.driver / 1000, gi.driver % 1000 / 10, gi.runtime / 1000, gi.runtime % 1000 / 10);
        if (d == 0) {
            gpu_free = (int64_t)gi.free;
            snprintf(gpu_name, sizeof gpu_name, "gpu 0 (%s)", gi.name);
        }
    }
    if (n_gpu == 0)
        fprintf(out, "gpu      none found (this build has the cuda backend)\n");
#else
    if (j)
        json_object_set_new(j, "cuda", json_false());
    fprintf(out, "gpu      not checked: this kapitsa was built without CUDA\n");
#endif
    char cache[4096];
    hub_cache_dir(cache, sizeof cache);
    char probe[4096];
    snprintf(probe, sizeof probe, "%s", cache);
    const int64_t disk = disk_free(probe);
    fprintf(out, "disk     %.1f GB free at %s (models: %s)\n", (double)disk / 1e9, probe, cache);
    if (j)
        json_object_set_new(j, "disk", json_pack("{s:I,s:s,s:s}", "free_bytes", (json_int_t)disk, "at", probe,
                                                 "models", cache));

    doctor_local(out, j);

    struct catalog c;
    if (catalog_load(&c, NULL) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        if (j)
            fclose(out);
        json_decref(j);
        return 1;
    }
    const struct catalog_host host = {mem_avail, gpu_free, disk, read_bandwidth()};
    json_t *runs = j ? json_array() : NULL;
    if (j) {
        json_object_set_new(j, "read_bandwidth_gb_s", json_real(host.read_bw / 1e9));
        json_object_set_new(j, "models", runs);
    }
    fprintf(out, "\nwhat fits (weights + KV for the context + state + runtime; one sequence), in bf16 and as the\n"
           "kapitsa quantize recipe with the most bits that keeps %dk of context (else the smallest that fits);\n"
           "GGUF weights run on the cpu. decode: estimated on the cpu as its read bandwidth (%.1f GB/s, measured)\n"
           "over the weight bytes a token reads, a bound: a long context's cache reads, and on few cores the\n"
           "arithmetic of quantised blocks, hold it lower\n",
           CATALOG_REC_CTX / 1024, host.read_bw / 1e9);
    fprintf(out, "  %-26s %-7s %9s  %-28s %17s %8s %12s  %s\n", "model", "weights", "size", "where",
            "context, bf16 KV", "f32 KV", "decode", "disk");
    for (int32_t i = 0; i < c.n; i++) {
        const struct catalog_model *m = &c.m[i];
        const struct catalog_run r16 = catalog_run_on(m, NULL, &host), rq = catalog_best_quant(m, &host);
        print_run(&r16, m->name, gpu_name, disk, runs);
        if (rq.m)
            print_run(&rq, "", gpu_name, disk, runs);
        else if (m->n_quant)
            fprintf(out, "  %-26s %-7s %9s  does not fit\n", "", "GGUF", "");
    }
    /* the rule is catalog_recommend's (src/hub/catalog.h); doctor prints it with the result */
    struct catalog_run rec;
    const int found = catalog_recommend(&c, &host, &rec);
    fprintf(out, "\nthe rule: the most parameters that keep %dk of context, in the form with the most bits whose\n"
           "estimated decode on the cpu is %.0f tok/s or more\n",
           CATALOG_REC_CTX / 1024, CATALOG_REC_TOKS);
    if (found < 0) {
        fprintf(out, "recommended: models/kapitsa-tiny (embedded); no catalog model fits with %dk of context\n",
                CATALOG_REC_CTX / 1024);
        if (j)
            json_object_set_new(j, "recommended", json_pack("{s:s,s:s}", "name", "kapitsa-tiny", "weights", "bf16"));
    } else {
        char toks[48] = "", cmd[1024];
        if (rec.toks > 0)
            snprintf(toks, sizeof toks, ", ~%.1f tok/s", rec.toks);
        if (found == 0)
            fprintf(out, "(none reaches %.0f tok/s here: the fastest)\n", CATALOG_REC_TOKS);
        fprintf(out, "recommended: %s %s on the %s, %lld tokens of context%s\n", rec.m->name,
                rec.q ? rec.q->recipe : "bf16", rec.gpu ? "gpu" : "cpu", (long long)rec.ctx16, toks);
        if (!rec.q)
            snprintf(cmd, sizeof cmd, "kapitsa pull %s%s%s%s", rec.m->name,
                     rec.m->draft ? " --with-draft   (its draft: " : "", rec.m->draft ? rec.m->draft : "",
                     rec.m->draft ? ")" : "");
        else if (rec.q->published)
            snprintf(cmd, sizeof cmd, "kapitsa pull %s:%s   (the publisher's GGUF; --model takes the same name)",
                     rec.m->gguf_repo, rec.q->recipe);
        else
            snprintf(cmd, sizeof cmd, "kapitsa pull %s, then kapitsa quantize %s %s-%s.gguf --recipe %s", rec.m->name,
                     rec.m->name, rec.m->name, rec.q->recipe, rec.q->recipe);
        fprintf(out, "  %s\n", cmd);
        if (j)
            json_object_set_new(j, "recommended",
                                json_pack("{s:s,s:s,s:s,s:I,s:o,s:b,s:s}", "name", rec.m->name, "weights",
                                          rec.q ? rec.q->recipe : "bf16", "device", rec.gpu ? "gpu" : "cpu", "context",
                                          (json_int_t)rec.ctx16, "decode_tok_s",
                                          rec.toks > 0 ? json_real(rec.toks) : json_null(), "fast_enough", found > 0,
                                          "next", cmd));
    }
    catalog_free(&c);

    fprintf(out, "\nagents   ");
    const char *agents[] = {"claude", "codex", "opencode", "pi"};
    json_t *ag = j ? json_object() : NULL;
    for (int i = 0; i < 4; i++) {
        fprintf(out, "%s %s%s", agents[i], on_path(agents[i]) ? "installed" : "not installed", i < 3 ? ", " : "\n");
        if (ag)
            json_object_set_new(ag, agents[i], json_boolean(on_path(agents[i])));
    }
    if (j) {
        fclose(out);
        json_object_set_new(j, "agents", ag);
        json_dumpf(j, stdout, JSON_INDENT(2));
        putchar('\n');
        json_decref(j);
    }
    return 0;
}
