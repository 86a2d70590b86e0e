/* kapitsa doctor: what this machine has (CPU, memory, GPUs, disk), which
 * catalog models fit it, in bf16 and quantised, at what context (the rule in
 * src/hub/catalog.h) and at what estimated decode rate, which one to run, and
 * which agent CLIs are installed. */
#define _GNU_SOURCE
#include "../backend/cpu/cpu.h"
#include "../backend/device.h"
#include "../base/err.h"
#include "../base/path.h"
#include "../base/sysmem.h"
#include "../hub/cache.h"
#include "../hub/catalog.h"
#include "cli.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

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

/* The host's read bandwidth in bytes/s on every core, as the cpu backend
 * measures it (0 when no backend can be had). */
static double read_bandwidth(void)
{
    struct backend *be = device_open("cpu", 0, false);
    if (!be)
        return 0;
    struct device_info di;
    be->ops->info(be, &di, true);
    be->ops->free(be);
    return di.read_gbs * 1e9;
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
    struct cpu_host h;
    cpu_host_query(&h);
    const int64_t mem_total = sysmem_meminfo("MemTotal"), mem_avail = sysmem_available();
    fprintf(out, "cpu      %s, %d cores\n", h.model, (int)h.n_cores);
    fprintf(out, "simd     kernels: %s (avx2 %s, avx512 %s)%s%s\n", h.kernels, h.avx2 ? "yes" : "no",
            h.avx512 ? "yes" : "no", h.avx512_bf16 ? ", avx512_bf16" : "", h.amx_bf16 ? ", amx_bf16" : "");
    fprintf(out, "memory   %.1f GiB total, %.1f GiB available\n", (double)mem_total / (1 << 30),
            (double)mem_avail / (1 << 30));
    json_t *gpus = j ? json_array() : NULL;
    if (j) {
        json_object_set_new(j, "cpu", json_pack("{s:s,s:I,s:s,s:b,s:b,s:b,s:b}", "model", h.model, "cores",
                                                (json_int_t)h.n_cores, "kernels", h.kernels, "avx2", h.avx2,
                                                "avx512", h.avx512, "avx512_bf16", h.avx512_bf16, "amx_bf16",
                                                h.amx_bf16));
        json_object_set_new(j, "memory", json_pack("{s:I,s:I}", "total_bytes", (json_int_t)mem_total,
                                                   "available_bytes", (json_int_t)mem_avail));
        json_object_set_new(j, "gpus", gpus);
        json_object_set_new(j, "cuda", json_boolean(device_has_cuda()));
    }
    int64_t gpu_free = 0;
    char gpu_name[300] = "";
    const int32_t n_gpu = device_n_gpus();
    for (int32_t d = 0; d < n_gpu; d++) {
        struct device_info gi;
        if (device_gpu_query(d, &gi) != 0)
            continue;
        if (j)
            json_array_append_new(gpus, json_pack("{s:i,s:s,s:I,s:I,s:s,s:i,s:s,s:f,s:f}", "index", d, "name",
                                                  gi.name, "total_bytes", (json_int_t)gi.mem_total, "free_bytes",
                                                  (json_int_t)gi.mem_free, "compute", gi.arch, "sms", gi.n_units,
                                                  "software", gi.software, "read_gb_s", gi.read_gbs,
                                                  "bf16_tflop_s", gi.bf16_tflops));
        fprintf(out, "gpu %d    %s, %.1f GiB (%.1f free), compute %s, %d SMs, %.0f GB/s, %s\n", d, gi.name,
                (double)gi.mem_total / (1 << 30), (double)gi.mem_free / (1 << 30), gi.arch, (int)gi.n_units,
                gi.read_gbs, gi.software);
        if (d == 0) {
            gpu_free = gi.mem_free;
            snprintf(gpu_name, sizeof gpu_name, "gpu 0 (%s)", gi.name);
        }
    }
    if (n_gpu == 0)
        fprintf(out, "gpu      %s\n", device_has_cuda() ? "none found (this build has the cuda backend)"
                                                          : "not checked: this kapitsa was built without CUDA");
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
    const char *agents[] = {"claude", "codex", "opencode", "pi", "qwen"};
    const int n_agents = (int)(sizeof agents / sizeof *agents);
    json_t *ag = j ? json_object() : NULL;
    for (int i = 0; i < n_agents; i++) {
        fprintf(out, "%s %s%s", agents[i], cli_on_path(agents[i]) ? "installed" : "not installed",
                i < n_agents - 1 ? ", " : "\n");
        if (ag)
            json_object_set_new(ag, agents[i], json_boolean(cli_on_path(agents[i])));
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
