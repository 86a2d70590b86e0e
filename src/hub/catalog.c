/* catalog: models/catalog.json and the fit rule (see catalog.h). */
#define _GNU_SOURCE
#include "catalog.h"

#include "../base/err.h"
#include "../base/path.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static char *dup_str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? strdup(s) : NULL;
}

static const char *default_path(char *buf, size_t n)
{
    const char *env = getenv("KAPITSA_CATALOG");
    if (env && *env)
        return env;
    if (access("models/catalog.json", R_OK) == 0)
        return "models/catalog.json";
    path_beside_exe("models/catalog.json", buf, n);
    return buf;
}

int catalog_load(struct catalog *c, const char *path)
{
    char buf[PATH_MAX + 32];
    memset(c, 0, sizeof *c);
    if (!path)
        path = default_path(buf, sizeof buf);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *arr = root ? json_object_get(root, "models") : NULL;
    if (!json_is_array(arr)) {
        json_decref(root);
        return err_set("catalog: %s: %s", path, root ? "no \"models\" list" : je.text);
    }
    c->m = calloc(json_array_size(arr) + 1, sizeof *c->m);
    if (!c->m) {
        json_decref(root);
        return err_set("catalog: out of memory");
    }
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o) {
        struct catalog_model *m = &c->m[c->n];
        m->name = dup_str(o, "name");
        m->repo = dup_str(o, "repo");
        m->revision = dup_str(o, "revision");
        m->arch = dup_str(o, "arch");
        m->draft = dup_str(o, "draft");
        m->params = json_integer_value(json_object_get(o, "params"));
        m->bytes = json_integer_value(json_object_get(o, "bytes"));
        m->active_bytes = json_integer_value(json_object_get(o, "active_bytes"));
        m->context = json_integer_value(json_object_get(o, "context"));
        m->kv_bytes_per_token = json_integer_value(json_object_get(o, "kv_bytes_per_token"));
        m->state_bytes = json_integer_value(json_object_get(o, "state_bytes"));
        c->n++;
        if (!m->name || !m->repo || !m->revision || !m->arch || m->bytes <= 0 || m->context <= 0) {
            json_decref(root);
            catalog_free(c);
            return err_set("catalog: %s: entry %zu lacks name, repo, revision, arch, bytes or context", path, i);
        }
    }
    json_decref(root);
    return 0;
}

void catalog_free(struct catalog *c)
{
    for (int32_t i = 0; i < c->n; i++) {
        free(c->m[i].name);
        free(c->m[i].repo);
        free(c->m[i].revision);
        free(c->m[i].arch);
        free(c->m[i].draft);
    }
    free(c->m);
    memset(c, 0, sizeof *c);
}

const struct catalog_model *catalog_find(const struct catalog *c, const char *ref)
{
    for (int32_t i = 0; i < c->n; i++)
        if (strcasecmp(c->m[i].name, ref) == 0 || strcasecmp(c->m[i].repo, ref) == 0)
            return &c->m[i];
    return NULL;
}

int64_t catalog_need_bytes(const struct catalog_model *m, int64_t n_ctx, int32_t n_seq, enum dtype kv_type)
{
    const int64_t kv = m->kv_bytes_per_token / 4 * (int64_t)dtype_size(kv_type); /* the catalog counts fp32 */
    return m->bytes + kv * n_ctx + m->state_bytes * n_seq + m->bytes / 25 + ((int64_t)512 << 20);
}

int64_t catalog_fit_context(const struct catalog_model *m, int64_t avail, int32_t n_seq, enum dtype kv_type)
{
    int64_t best = 0;
    for (int64_t ctx = 4096; ctx <= m->context; ctx += 4096)
        if (catalog_need_bytes(m, ctx, n_seq, kv_type) <= avail)
            best = ctx;
    if (best < m->context && m->context % 4096 && catalog_need_bytes(m, m->context, n_seq, kv_type) <= avail)
        best = m->context;
    return best;
}
