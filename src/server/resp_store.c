/* resp_store: an LRU table of stored responses (see resp_store.h). Lookups
 * scan the table: it is bounded to a few thousand entries, each looked at with
 * a string comparison or two, far below a generation's cost. */
#define _GNU_SOURCE
#include "resp_store.h"

#include "../base/err.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    char *id;
    char *response, *input; /* JSON text */
    char **item_ids;        /* its output items' ids, for item_reference */
    size_t n_items, bytes;
    uint64_t used;          /* the clock when last put or read: the smallest goes first */
};

struct resp_store {
    pthread_mutex_t mu;
    struct entry *e;
    int32_t n, max_count;
    size_t bytes, max_bytes;
    uint64_t clock;
};

struct resp_store *resp_store_new(int32_t max_count, size_t max_bytes)
{
    assert(max_count > 0);
    struct resp_store *s = calloc(1, sizeof *s);
    if (!s || !(s->e = calloc((size_t)max_count, sizeof *s->e))) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->max_count = max_count;
    s->max_bytes = max_bytes;
    return s;
}

static void entry_clear(struct entry *e)
{
    free(e->id);
    free(e->response);
    free(e->input);
    for (size_t i = 0; i < e->n_items; i++)
        free(e->item_ids[i]);
    free(e->item_ids);
    memset(e, 0, sizeof *e);
}

void resp_store_free(struct resp_store *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->n; i++)
        entry_clear(&s->e[i]);
    free(s->e);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Drops entry i, moving the last one into its place. */
static void drop(struct resp_store *s, int32_t i)
{
    s->bytes -= s->e[i].bytes;
    entry_clear(&s->e[i]);
    s->e[i] = s->e[--s->n];
    memset(&s->e[s->n], 0, sizeof s->e[s->n]);
}

static void evict_lru(struct resp_store *s)
{
    int32_t lru = 0;
    for (int32_t i = 1; i < s->n; i++)
        if (s->e[i].used < s->e[lru].used)
            lru = i;
    drop(s, lru);
}

static int32_t find(struct resp_store *s, const char *id)
{
    for (int32_t i = 0; i < s->n; i++)
        if (strcmp(s->e[i].id, id) == 0)
            return i;
    return -1;
}

int resp_store_put(struct resp_store *s, json_t *response, json_t *input)
{
    const char *id = json_string_value(json_object_get(response, "id"));
    json_t *output = json_object_get(response, "output");
    struct entry e = {0};
    if (!id)
        return err_set("resp_store: a response without an id");
    e.id = strdup(id);
    e.response = json_dumps(response, JSON_COMPACT);
    e.input = json_dumps(input, JSON_COMPACT);
    e.n_items = json_array_size(output);
    e.item_ids = calloc(e.n_items ? e.n_items : 1, sizeof *e.item_ids);
    if (!e.id || !e.response || !e.input || !e.item_ids)
        goto oom;
    e.bytes = strlen(e.response) + strlen(e.input);
    for (size_t i = 0; i < e.n_items; i++) {
        const char *iid = json_string_value(json_object_get(json_array_get(output, i), "id"));
        if (!(e.item_ids[i] = strdup(iid ? iid : "")))
            goto oom;
        e.bytes += strlen(e.item_ids[i]);
    }
    if (e.bytes > s->max_bytes) {
        const size_t bytes = e.bytes;
        entry_clear(&e);
        return err_set("resp_store: the response takes %zu bytes, past the store's %zu", bytes, s->max_bytes);
    }
    pthread_mutex_lock(&s->mu);
    int32_t old = find(s, id);
    if (old >= 0)
        drop(s, old);
    while (s->n > 0 && (s->n == s->max_count || s->bytes + e.bytes > s->max_bytes))
        evict_lru(s);
    e.used = ++s->clock;
    s->bytes += e.bytes;
    s->e[s->n++] = e;
    pthread_mutex_unlock(&s->mu);
    return 0;
oom:
    entry_clear(&e);
    return err_set("resp_store: out of memory");
}

json_t *resp_store_get(struct resp_store *s, const char *id, json_t **input)
{
    json_t *r = NULL;
    pthread_mutex_lock(&s->mu);
    int32_t i = find(s, id);
    if (i >= 0) {
        s->e[i].used = ++s->clock;
        r = json_loads(s->e[i].response, 0, NULL);
        if (input && r && !(*input = json_loads(s->e[i].input, 0, NULL))) {
            json_decref(r);
            r = NULL;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

json_t *resp_store_find_item(struct resp_store *s, const char *item_id)
{
    json_t *r = NULL, *item = NULL;
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < s->n && !r; i++)
        for (size_t k = 0; k < s->e[i].n_items && !r; k++)
            if (strcmp(s->e[i].item_ids[k], item_id) == 0) {
                s->e[i].used = ++s->clock;
                r = json_loads(s->e[i].response, 0, NULL);
                item = json_incref(json_array_get(json_object_get(r, "output"), k));
            }
    pthread_mutex_unlock(&s->mu);
    json_decref(r);
    return item;
}

size_t resp_store_bytes(struct resp_store *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->bytes;
    pthread_mutex_unlock(&s->mu);
    return n;
}
