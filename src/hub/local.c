/* local: GGUF models in the Hugging Face cache, llama.cpp's cache and
 * Ollama's store (see local.h). */
#define _GNU_SOURCE
#include "local.h"

#include "../base/err.h"
#include "cache.h"
#include "pull.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct found {
    struct local_gguf *v;
    int32_t n, cap;
};

static int found_add(struct found *f, const char *name, const char *path, int64_t bytes, const char *where)
{
    if (f->n == f->cap) {
        const int32_t cap = f->cap ? 2 * f->cap : 16;
        struct local_gguf *v = realloc(f->v, (size_t)cap * sizeof *v);
        if (!v)
            return err_set("hub: out of memory");
        f->v = v;
        f->cap = cap;
    }
    struct local_gguf *g = &f->v[f->n++];
    snprintf(g->name, sizeof g->name, "%s", name);
    snprintf(g->path, sizeof g->path, "%s", path);
    g->bytes = bytes;
    g->where = where;
    return 0;
}

static int64_t file_bytes(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : 0;
}

static int ends_with(const char *s, const char *tail)
{
    const size_t l = strlen(s), t = strlen(tail);
    return l >= t && strcmp(s + l - t, tail) == 0;
}

/* A split set's parts after the first are counted with it, not listed. */
static int later_part(const char *name)
{
    const char *p = strstr(name, "-of-");
    return p && p - name >= 6 && strncmp(p - 6, "-00001", 6) != 0;
}

/* .gguf files under dir (depth levels of folders), prefix + their path below dir as the name */
static int scan_ggufs(struct found *f, const char *dir, const char *rel, int depth, const char *prefix,
                      const char *where)
{
    char path[4096], sub[1024];
    snprintf(path, sizeof path, "%s%s%s", dir, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        char full[5200];
        snprintf(full, sizeof full, "%s/%s", dir, sub);
        struct stat st;
        if (stat(full, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode) && depth > 0)
            rc = scan_ggufs(f, dir, sub, depth - 1, prefix, where);
        else if (S_ISREG(st.st_mode) && ends_with(e->d_name, ".gguf") && !later_part(e->d_name)) {
            char name[1200];
            snprintf(name, sizeof name, "%s%s", prefix, sub);
            rc = found_add(f, name, full, (int64_t)st.st_size, where);
        }
    }
    if (d)
        closedir(d);
    return rc;
}

/* models--ORG--NAME/snapshots/COMMIT/... .gguf: one entry a file, named ORG/NAME:FILE */
static int scan_hf(struct found *f)
{
    char cache[4096];
    hub_cache_dir(cache, sizeof cache);
    DIR *d = opendir(cache);
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && d && (e = readdir(d))) {
        const char *rest = e->d_name + 8, *sep = strncmp(e->d_name, "models--", 8) == 0 ? strstr(rest, "--") : NULL;
        if (!sep)
            continue;
        char repo[300], snap[4600];
        snprintf(repo, sizeof repo, "%.*s/%s", (int)(sep - rest), rest, sep + 2);
        if (hub_snapshot_dir(repo, "main", snap, sizeof snap) != 0)
            continue;
        char prefix[320];
        snprintf(prefix, sizeof prefix, "%s:", repo);
        rc = scan_ggufs(f, snap, "", 2, prefix, "hf");
    }
    if (d)
        closedir(d);
    return rc;
}

static void ollama_dir(char *out, size_t n)
{
    const char *env = getenv("OLLAMA_MODELS"), *home = getenv("HOME");
    struct stat st;
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return;
    }
    snprintf(out, n, "%s/.ollama/models", home ? home : "");
    if (stat(out, &st) != 0)
        snprintf(out, n, "/usr/share/ollama/.ollama/models");
}

/* The model layer's blob of a manifest file; -1 with err_set(). */
static int ollama_blob(const char *models, const char *manifest, char *out, size_t n)
{
    json_error_t je;
    json_t *m = json_load_file(manifest, 0, &je), *layers = json_object_get(m, "layers"), *l;
    size_t i;
    int rc = err_set("hub: %s: no model layer in the Ollama manifest", manifest);
    json_array_foreach(layers, i, l)
    {
        const char *type = json_string_value(json_object_get(l, "mediaType"));
        const char *dig = json_string_value(json_object_get(l, "digest"));
        if (type && dig && strcmp(type, "application/vnd.ollama.image.model") == 0 && strncmp(dig, "sha256:", 7) == 0 &&
            strspn(dig + 7, "0123456789abcdef") == strlen(dig + 7)) {
            snprintf(out, n, "%s/blobs/sha256-%s", models, dig + 7);
            rc = 0;
            break;
        }
    }
    json_decref(m);
    return rc;
}

/* manifests/HOST/NS/NAME/TAG: ollama:NAME:TAG (NS/NAME outside the library namespace) */
static int scan_ollama(struct found *f)
{
    char models[4096], base[4200];
    ollama_dir(models, sizeof models);
    snprintf(base, sizeof base, "%s/manifests/registry.ollama.ai", models);
    DIR *ns = opendir(base);
    struct dirent *a, *b, *c;
    int rc = 0;
    while (rc == 0 && ns && (a = readdir(ns))) {
        char p1[4500];
        snprintf(p1, sizeof p1, "%s/%s", base, a->d_name);
        DIR *names = a->d_name[0] == '.' ? NULL : opendir(p1);
        while (rc == 0 && names && (b = readdir(names))) {
            char p2[4800];
            snprintf(p2, sizeof p2, "%s/%s", p1, b->d_name);
            DIR *tags = b->d_name[0] == '.' ? NULL : opendir(p2);
            while (rc == 0 && tags && (c = readdir(tags))) {
                char man[5100], blob[4400], name[800];
                snprintf(man, sizeof man, "%s/%s", p2, c->d_name);
                if (c->d_name[0] == '.' || ollama_blob(models, man, blob, sizeof blob) != 0)
                    continue;
                if (strcmp(a->d_name, "library") == 0)
                    snprintf(name, sizeof name, "ollama:%s:%s", b->d_name, c->d_name);
                else
                    snprintf(name, sizeof name, "ollama:%s/%s:%s", a->d_name, b->d_name, c->d_name);
                rc = found_add(f, name, blob, file_bytes(blob), "ollama");
            }
            if (tags)
                closedir(tags);
        }
        if (names)
            closedir(names);
    }
    if (ns)
        closedir(ns);
    return rc;
}

int local_gguf_list(struct local_gguf **out, int32_t *n)
{
    struct found f = {0};
    char llama[4096];
    const char *env = getenv("LLAMA_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env)
        snprintf(llama, sizeof llama, "%s", env);
    else if (xdg && *xdg)
        snprintf(llama, sizeof llama, "%s/llama.cpp", xdg);
    else
        snprintf(llama, sizeof llama, "%s/.cache/llama.cpp", home ? home : "");
    if (scan_hf(&f) != 0 || scan_ggufs(&f, llama, "", 1, llama, "llama.cpp") != 0 || scan_ollama(&f) != 0) {
        free(f.v);
        return -1;
    }
    for (int32_t i = 0; i < f.n; i++)
        if (strcmp(f.v[i].where, "llama.cpp") == 0) /* named by the path, which --model takes */
            snprintf(f.v[i].name, sizeof f.v[i].name, "%s", f.v[i].path);
    *out = f.v;
    *n = f.n;
    return 0;
}

int local_ollama_path(const char *ref, char *out, size_t n)
{
    char models[4096], man[5000], name[512];
    const char *colon = strrchr(ref, ':'), *slash = strchr(ref, '/');
    const size_t nl = colon && (!slash || colon > slash) ? (size_t)(colon - ref) : strlen(ref);
    const char *tag = nl < strlen(ref) ? ref + nl + 1 : "latest";
    snprintf(name, sizeof name, "%.*s", (int)nl, ref);
    if (!*name || strstr(name, "..") || strstr(tag, "..") || strchr(tag, '/'))
        return err_set("hub: 'ollama:%s' is not an Ollama model name (ollama:NAME[:TAG])", ref);
    ollama_dir(models, sizeof models);
    snprintf(man, sizeof man, "%s/manifests/registry.ollama.ai/%s%s/%s", models, slash ? "" : "library/", name, tag);
    if (file_bytes(man) <= 0)
        return err_set("hub: no Ollama model %s:%s in %s (ollama pull %s:%s)", name, tag, models, name, tag);
    return ollama_blob(models, man, out, n);
}

int local_snapshot_gguf(const char *snapshot, const char *quant, char *out, size_t n)
{
    struct found f = {0};
    int rc = scan_ggufs(&f, snapshot, "", 2, "", "hf");
    int32_t best = -1;
    for (int32_t i = 0; rc == 0 && i < f.n; i++)
        if (hub_gguf_has_quant(f.v[i].name, quant) && (best < 0 || strcmp(f.v[i].name, f.v[best].name) < 0))
            best = i;
    if (rc == 0 && best < 0)
        rc = err_set("hub: %s holds no .gguf of quantisation %s", snapshot, quant);
    if (rc == 0)
        snprintf(out, n, "%s", f.v[best].path);
    free(f.v);
    return rc;
}
