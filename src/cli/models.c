/* kapitsa pull / list / rm: models by catalog name or hub id, in the Hugging
 * Face cache (src/hub). */
#define _GNU_SOURCE
#include "../base/err.h"
#include "../base/path.h"
#include "../hub/cache.h"
#include "../hub/local.h"
#include "../hub/catalog.h"
#include "../hub/pull.h"
#include "../model/config.h"
#include "cli.h"

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void pull_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa pull MODEL [--revision R] [--parallel N] [--endpoint URL] [--with-draft]\n"
               "  MODEL: a catalog name (kapitsa list) or a hub id ORG/NAME. Downloads the safetensors,\n"
               "  configs and tokenizer into the Hugging Face cache ($HF_HOME/hub), checked by sha256;\n"
               "  ORG/NAME:QUANT (e.g. Qwen/Qwen3-8B-GGUF:Q4_K_M) downloads that quantisation's .gguf\n"
               "  files of a GGUF repo, which --model then takes under the same name;\n"
               "  an interrupted pull resumes. HF_ENDPOINT and HF_TOKEN are honoured. --with-draft also\n"
               "  pulls the catalog's recommended draft model. config.json comes first: a model of an\n"
               "  architecture Kapitsa does not run is refused before its weights are downloaded.\n");
}

/* A safetensors model's config.json, fetched first: its architecture and
 * fields as loading the model would read them (hub_pull_opts.check). */
static int pull_check(const char *snapshot)
{
    struct model_config c;
    return config_load(&c, snapshot);
}

/* ref (a catalog name, ORG/NAME or ORG/NAME:QUANT) into the cache; its folder
 * printed on dir_out (NULL: not printed) */
static int pull_one(const char *ref, const char *revision, const struct hub_pull_opts *o, const struct catalog *c,
                    FILE *dir_out)
{
    const struct catalog_model *m = catalog_find(c, ref);
    const char *repo = m ? m->repo : ref, *rev = revision ? revision : m ? m->revision : "main";
    char dir[4608], rbuf[256];
    const char *colon = m ? NULL : strchr(ref, ':');
    struct hub_pull_opts qo = *o;
    if (colon) { /* ORG/NAME:QUANT: one quantisation of a GGUF repo */
        snprintf(rbuf, sizeof rbuf, "%.*s", (int)(colon - ref), ref);
        repo = rbuf;
        qo.quant = colon + 1;
        o = &qo;
    }
    if (o->progress)
        fprintf(o->progress, "pull: %s (%s) from %s\n", repo, rev,
                o->endpoint ? o->endpoint : getenv("HF_ENDPOINT") ? getenv("HF_ENDPOINT") : "https://huggingface.co");
    if (hub_pull(repo, rev, o, dir, sizeof dir) != 0)
        return -1;
    if (dir_out)
        fprintf(dir_out, "%s\n", dir);
    return 0;
}

int cli_pull_model(const char *ref)
{
    const struct hub_pull_opts o = {.progress = stderr, .bar = isatty(2) != 0, .check = pull_check};
    struct catalog c = {0};
    if (catalog_load(&c, NULL) != 0)
        fprintf(stderr, "kapitsa: %s (catalog names unavailable)\n", err_msg());
    const int rc = pull_one(ref, NULL, &o, &c, NULL);
    catalog_free(&c);
    return rc;
}

int cli_pull(int argc, char **argv)
{
    const char *ref = NULL, *revision = NULL, *v;
    struct hub_pull_opts o = {.progress = stderr, .bar = isatty(2) != 0, .check = pull_check};
    int with_draft = 0;
    for (int i = 0; i < argc; i++) {
        int f;
        enum cli_arg a;
        if (cli_switch(argv[i], "--with-draft")) {
            with_draft = 1;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--revision", &revision)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--endpoint", &o.endpoint)) != 0) {
            if (f < 0)
                return 2;
        } else if ((f = cli_flag(argc, argv, &i, "--parallel", &v)) != 0) {
            if (f < 0 || cli_int(v) < 1 || cli_int(v) > 16)
                return pull_usage(stderr), 2;
            o.n_parallel = (int32_t)cli_int(v);
        } else if ((a = cli_arg(argv[i])) != CLI_ARG_POSITIONAL) {
            return cli_arg_exit(a, pull_usage);
        } else if (ref) {
            return pull_usage(stderr), 2;
        } else {
            ref = argv[i];
        }
    }
    if (!ref)
        return pull_usage(stderr), 2;
    struct catalog c = {0};
    if (catalog_load(&c, NULL) != 0)
        fprintf(stderr, "kapitsa: %s (catalog names unavailable)\n", err_msg());
    int rc = pull_one(ref, revision, &o, &c, stdout);
    const struct catalog_model *m = catalog_find(&c, ref);
    if (rc == 0 && with_draft && m && m->draft)
        rc = pull_one(m->draft, NULL, &o, &c, stdout);
    else if (rc == 0 && m && m->draft)
        fprintf(stderr, "pull: the recommended draft for KFlash is %s (kapitsa pull %s)\n", m->draft, m->draft);
    if (rc != 0)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    else
        fprintf(stderr, "pull: done; next: kapitsa chat --model %s (or kapitsa serve --model %s)\n", ref, ref);
    catalog_free(&c);
    return rc ? 1 : 0;
}

/* Cached repos (models--ORG--NAME) that the catalog does not list; into
 * the JSON array out, or printed when out is NULL. */
static void list_others(const struct catalog *c, json_t *out)
{
    char cache[4096];
    hub_cache_dir(cache, sizeof cache);
    DIR *d = opendir(cache);
    struct dirent *e;
    int header = 0;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "models--", 8) != 0)
            continue;
        char repo[300];
        const char *rest = e->d_name + 8, *sep = strstr(rest, "--");
        if (!sep)
            continue;
        snprintf(repo, sizeof repo, "%.*s/%s", (int)(sep - rest), rest, sep + 2);
        if (catalog_find(c, repo))
            continue;
        if (out) {
            json_array_append_new(out, json_pack("{s:s,s:I}", "repo", repo, "bytes", (json_int_t)hub_repo_bytes(repo)));
            continue;
        }
        if (!header)
            printf("\nother models in %s:\n", cache);
        header = 1;
        printf("  %-40s %8.1f GB on disk\n", repo, (double)hub_repo_bytes(repo) / 1e9);
    }
    if (d)
        closedir(d);
}

/* GGUF models here and in other tools' stores, by the name --model takes;
 * into out, or printed when out is NULL. */
static void list_ggufs(json_t *out)
{
    struct local_gguf *g;
    int32_t n;
    if (local_gguf_list(&g, &n) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return;
    }
    if (n > 0 && !out)
        printf("\nGGUF models (--model NAME):\n");
    for (int32_t i = 0; i < n; i++)
        if (out)
            json_array_append_new(out, json_pack("{s:s,s:s,s:s,s:I}", "name", g[i].name, "where", g[i].where, "path",
                                                 g[i].path, "bytes", (json_int_t)g[i].bytes));
        else
            printf("  %-60s %-9s %8.1f GB\n", g[i].name, g[i].where, (double)g[i].bytes / 1e9);
    free(g);
}

static void list_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa list [--json]   (the embedded models, the catalog, what is in the Hugging Face\n"
               "                              cache, and GGUF models there, in llama.cpp's cache and in Ollama's store)\n");
}

int64_t cli_dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int64_t total = 0;
    while (d && (e = readdir(d))) {
        char path[PATH_MAX + 256];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
            total += (int64_t)st.st_size;
    }
    if (d)
        closedir(d);
    return total;
}

/* The models that ship with kapitsa (the data folder's, base/path.h): the
 * default model and its KFlash draft, which run with no download; into out,
 * or printed when out is NULL. */
static void list_embedded(json_t *out)
{
    static const char *const names[][2] = {{"kapitsa-tiny", "the default --model"},
                                           {"kapitsa-tiny-draft", "its KFlash draft"}};
    if (!out)
        printf("embedded (no download):\n");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[PATH_MAX + 64], real[PATH_MAX];
        if (path_data(names[i][0], path, sizeof path) != 0 || !realpath(path, real))
            continue;
        const int64_t bytes = cli_dir_bytes(real);
        if (out)
            json_array_append_new(out, json_pack("{s:s,s:s,s:I}", "name", names[i][0], "path", real, "bytes",
                                                 (json_int_t)bytes));
        else
            printf("  %-26s %-20s %7.1f MB  %s\n", names[i][0], names[i][1], (double)bytes / 1e6, real);
    }
    err_clear();
    if (!out)
        printf("\n");
}

static void rm_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa rm MODEL   (a catalog name or hub id; removes it from the cache)\n");
}

/* kapitsa list --json: {embedded, catalog, other, gguf}, sizes in bytes; frees c. */
static int list_json(struct catalog *c)
{
    json_t *cat = json_array(), *root = json_pack("{s:[],s:o,s:[],s:[]}", "embedded", "catalog", cat, "other", "gguf");
    list_embedded(json_object_get(root, "embedded"));
    for (int32_t i = 0; i < c->n; i++) {
        const struct catalog_model *m = &c->m[i];
        char dir[4608];
        const int installed = hub_snapshot_dir(m->repo, m->revision, dir, sizeof dir) == 0;
        const struct catalog_quant *q4 = catalog_quant(m, "Q4_K_M");
        json_array_append_new(cat, json_pack("{s:s,s:s,s:I,s:I,s:o,s:I,s:o,s:b,s:o}", "name", m->name, "repo", m->repo,
                                             "params", (json_int_t)m->params, "bytes", (json_int_t)m->bytes,
                                             "q4_k_m_bytes", q4 ? json_integer(q4->bytes) : json_null(), "context",
                                             (json_int_t)m->context, "draft",
                                             m->draft ? json_string(m->draft) : json_null(), "installed", installed,
                                             "installed_bytes",
                                             installed ? json_integer(hub_repo_bytes(m->repo)) : json_null()));
    }
    err_clear();
    list_others(c, json_object_get(root, "other"));
    catalog_free(c);
    list_ggufs(json_object_get(root, "gguf"));
    json_dumpf(root, stdout, JSON_INDENT(2));
    putchar('\n');
    json_decref(root);
    return 0;
}

int cli_list(int argc, char **argv)
{
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!cli_switch(argv[i], "--json"))
            return cli_arg_reject(argv[i], list_usage);
        json = 1;
    }
    struct catalog c;
    if (catalog_load(&c, NULL) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    if (json)
        return list_json(&c);
    list_embedded(NULL);
    printf("%-26s %-44s %8s %9s %9s %8s  %-13s %s\n", "name", "hub id", "params", "bf16", "Q4_K_M", "context",
           "draft", "installed");
    for (int32_t i = 0; i < c.n; i++) {
        const struct catalog_model *m = &c.m[i];
        char dir[4608], inst[64] = "-";
        if (hub_snapshot_dir(m->repo, m->revision, dir, sizeof dir) == 0)
            snprintf(inst, sizeof inst, "yes, %.1f GB", (double)hub_repo_bytes(m->repo) / 1e9);
        /* the size of kapitsa quantize --recipe Q4_K_M; "-" where quantize does not write the architecture */
        const struct catalog_quant *q4 = catalog_quant(m, "Q4_K_M");
        char q4s[32] = "-";
        if (q4)
            snprintf(q4s, sizeof q4s, "%.1f GB", (double)q4->bytes / 1e9);
        printf("%-26s %-44s %7.2fB %7.1f GB %9s %8lld  %-13s %s\n", m->name, m->repo, (double)m->params / 1e9,
               (double)m->bytes / 1e9, q4s, (long long)m->context, m->draft ? m->draft : "-", inst);
    }
    err_clear();
    list_others(&c, NULL);
    catalog_free(&c);
    list_ggufs(NULL);
    return 0;
}

int cli_rm(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const enum cli_arg a = cli_arg(argv[i]);
        if (a != CLI_ARG_POSITIONAL)
            return cli_arg_exit(a, rm_usage);
    }
    if (argc != 1)
        return rm_usage(stderr), 2;
    struct catalog c = {0};
    const char *repo = argv[0];
    char buf[256];
    if (catalog_load(&c, NULL) == 0) {
        const struct catalog_model *m = catalog_find(&c, argv[0]);
        if (m) {
            snprintf(buf, sizeof buf, "%s", m->repo);
            repo = buf;
        }
        catalog_free(&c);
    }
    int64_t bytes = hub_repo_bytes(repo);
    if (hub_repo_remove(repo) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    printf("removed %s (%.1f GB)\n", repo, (double)bytes / 1e9);
    return 0;
}
