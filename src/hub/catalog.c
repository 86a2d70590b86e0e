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

const char *const catalog_recipes[CATALOG_N_RECIPES] = {"Q8_0",   "Q6_K",   "Q5_K_M", "Q4_K_M",
                                                         "Q3_K_M", "Q2_MOE", "Q2_K"};

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
    return path_data("catalog.json", buf, n) == 0 ? buf : NULL;
}

int catalog_load(struct catalog *c, const char *path)
{
    char buf[PATH_MAX + 32];
    memset(c, 0, sizeof *c);
    if (!path && !(path = default_path(buf, sizeof buf)))
        return -1; /* path_data's message names the places looked in */
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
        bool bad_quant = false;
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
        json_t *gguf = json_object_get(o, "gguf"), *quant = json_object_get(o, "quant");
        m->gguf_repo = dup_str(gguf, "repo");
        for (int r = 0; r < CATALOG_N_RECIPES; r++) {
            json_t *q = json_object_get(quant, catalog_recipes[r]), *p;
            if (!q)
                continue;
            struct catalog_quant *cq = &m->quant[m->n_quant++];
            cq->recipe = catalog_recipes[r];
            cq->bytes = json_integer_value(json_object_get(q, "bytes"));
            cq->active_bytes = json_integer_value(json_object_get(q, "active_bytes"));
            size_t k;
            json_array_foreach(json_object_get(gguf, "quants"), k, p) {
                const char *s = json_string_value(p);
                cq->published |= s && strcmp(s, cq->recipe) == 0;
            }
            bad_quant |= cq->bytes <= 0;
        }
        c->n++;
        if (!m->name || !m->repo || !m->revision || !m->arch || m->bytes <= 0 || m->context <= 0 || bad_quant) {
            json_decref(root);
            catalog_free(c);
            return err_set("catalog: %s: entry %zu lacks name, repo, revision, arch, bytes, context or a quant's bytes",
                           path, i);
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
        free(c->m[i].gguf_repo);
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

const struct catalog_quant *catalog_quant(const struct catalog_model *m, const char *recipe)
{
    for (int32_t i = 0; i < m->n_quant; i++)
        if (strcasecmp(m->quant[i].recipe, recipe) == 0)
            return &m->quant[i];
    return NULL;
}

int64_t catalog_need_bytes(const struct catalog_model *m, const struct catalog_quant *q, int64_t n_ctx, int32_t n_seq,
                           enum dtype kv_type)
{
    const int64_t w = q ? q->bytes : m->bytes;
    const int64_t kv = m->kv_bytes_per_token / 4 * (int64_t)dtype_size(kv_type); /* the catalog counts fp32 */
    return w + kv * n_ctx + m->state_bytes * n_seq + w / 25 + ((int64_t)512 << 20);
}

int64_t catalog_fit_context(const struct catalog_model *m, const struct catalog_quant *q, int64_t avail, int32_t n_seq,
                            enum dtype kv_type)
{
    int64_t best = 0;
    for (int64_t ctx = 4096; ctx <= m->context; ctx += 4096)
        if (catalog_need_bytes(m, q, ctx, n_seq, kv_type) <= avail)
            best = ctx;
    if (best < m->context && m->context % 4096 && catalog_need_bytes(m, q, m->context, n_seq, kv_type) <= avail)
        best = m->context;
    return best;
}

struct catalog_run catalog_run_on(const struct catalog_model *m, const struct catalog_quant *q,
                                  const struct catalog_host *h)
{
    struct catalog_run r = {.m = m, .q = q, .disk = q ? q->bytes + (q->published ? 0 : m->bytes) : m->bytes};
    r.gpu = !q && h->gpu_mem > 0 && catalog_fit_context(m, NULL, h->gpu_mem, 1, DT_BF16) > 0;
    const int64_t avail = r.gpu ? h->gpu_mem : h->mem;
    r.ctx = catalog_fit_context(m, q, avail, 1, DT_F32);
    r.ctx16 = catalog_fit_context(m, q, avail, 1, DT_BF16);
    if (!r.gpu && r.ctx16 && h->read_bw > 0)
        r.toks = h->read_bw / (double)(q ? q->active_bytes : m->active_bytes);
    return r;
}

static bool keeps_rec_ctx(const struct catalog_run *r)
{
    return r->ctx16 >= (r->m->context < CATALOG_REC_CTX ? r->m->context : CATALOG_REC_CTX);
}

struct catalog_run catalog_best_quant(const struct catalog_model *m, const struct catalog_host *h)
{
    struct catalog_run best = {0};
    for (int32_t k = 0; k < m->n_quant; k++) {
        const struct catalog_run r = catalog_run_on(m, &m->quant[k], h);
        if (keeps_rec_ctx(&r))
            return r;
        if (r.ctx16)
            best = r;
    }
    return best;
}

int catalog_recommend(const struct catalog *c, const struct catalog_host *h, struct catalog_run *out)
{
    struct catalog_run best = {0}, fastest = {0};
    for (int32_t i = 0; i < c->n; i++) {
        const struct catalog_model *m = &c->m[i];
        for (int32_t k = -1; k < m->n_quant; k++) {
            const struct catalog_run r = catalog_run_on(m, k < 0 ? NULL : &m->quant[k], h);
            if (!keeps_rec_ctx(&r) || r.disk > h->disk)
                continue;
            if (r.gpu || h->read_bw <= 0 || r.toks >= CATALOG_REC_TOKS) {
                if (!best.m || m->params > best.m->params)
                    best = r;
            } else if (r.toks > fastest.toks) {
                fastest = r;
            }
        }
    }
    *out = best.m ? best : fastest;
    return best.m ? 1 : fastest.m ? 0 : -1;
}
