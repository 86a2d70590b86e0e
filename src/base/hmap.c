/* hmap: linear-probing hash maps (see hmap.h). FNV-1a for strings, a 64-bit
 * mixer (splitmix64's finaliser) for integers. */
#include "hmap.h"

#include <stdlib.h>
#include <string.h>

#define HMAP_EMPTY UINT64_MAX

static uint64_t hash_str(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int hmap_init(struct hmap *h, size_t expected, int string_keys)
{
    memset(h, 0, sizeof *h);
    size_t cap = 16;
    while (cap < expected * 2)
        cap *= 2;
    h->cap = cap;
    h->strings = string_keys;
    h->keys = malloc(cap * sizeof *h->keys);
    h->vals = malloc(cap * sizeof *h->vals);
    h->lens = string_keys ? calloc(cap, sizeof *h->lens) : NULL;
    if (!h->keys || !h->vals || (string_keys && !h->lens)) {
        hmap_free(h);
        return -1;
    }
    for (size_t i = 0; i < cap; i++)
        h->keys[i] = HMAP_EMPTY;
    return 0;
}

void hmap_free(struct hmap *h)
{
    free(h->keys);
    free(h->vals);
    free(h->lens);
    free(h->str);
    memset(h, 0, sizeof *h);
}

static int hmap_grow(struct hmap *h)
{
    struct hmap g = *h;
    size_t cap = h->cap * 2;
    g.keys = malloc(cap * sizeof *g.keys);
    g.vals = malloc(cap * sizeof *g.vals);
    g.lens = h->strings ? calloc(cap, sizeof *g.lens) : NULL;
    if (!g.keys || !g.vals || (h->strings && !g.lens)) {
        free(g.keys);
        free(g.vals);
        free(g.lens);
        return -1;
    }
    g.cap = cap;
    for (size_t i = 0; i < cap; i++)
        g.keys[i] = HMAP_EMPTY;
    for (size_t i = 0; i < h->cap; i++) {
        if (h->keys[i] == HMAP_EMPTY)
            continue;
        uint64_t hv = h->strings ? hash_str(h->str + h->keys[i], h->lens[i]) : hash_u64(h->keys[i]);
        size_t j = hv & (cap - 1);
        while (g.keys[j] != HMAP_EMPTY)
            j = (j + 1) & (cap - 1);
        g.keys[j] = h->keys[i];
        g.vals[j] = h->vals[i];
        if (h->strings)
            g.lens[j] = h->lens[i];
    }
    free(h->keys);
    free(h->vals);
    free(h->lens);
    h->keys = g.keys;
    h->vals = g.vals;
    h->lens = g.lens;
    h->cap = cap;
    return 0;
}

static size_t find_str(const struct hmap *h, const char *key, size_t len)
{
    size_t j = hash_str(key, len) & (h->cap - 1);
    while (h->keys[j] != HMAP_EMPTY &&
           !(h->lens[j] == len && memcmp(h->str + h->keys[j], key, len) == 0))
        j = (j + 1) & (h->cap - 1);
    return j;
}

int hmap_put_str(struct hmap *h, const char *key, size_t len, uint64_t val)
{
    if ((h->n + 1) * 2 > h->cap && hmap_grow(h) != 0)
        return -1;
    size_t j = find_str(h, key, len);
    if (h->keys[j] == HMAP_EMPTY) {
        if (h->str_len + len > h->str_cap) {
            size_t nc = h->str_cap ? h->str_cap * 2 : 4096;
            while (nc < h->str_len + len)
                nc *= 2;
            char *ns = realloc(h->str, nc);
            if (!ns)
                return -1;
            h->str = ns;
            h->str_cap = nc;
        }
        memcpy(h->str + h->str_len, key, len);
        h->keys[j] = h->str_len;
        h->lens[j] = (uint32_t)len;
        h->str_len += len;
        h->n++;
    }
    h->vals[j] = val;
    return 0;
}

int hmap_get_str(const struct hmap *h, const char *key, size_t len, uint64_t *val)
{
    size_t j = find_str(h, key, len);
    if (h->keys[j] == HMAP_EMPTY)
        return 0;
    *val = h->vals[j];
    return 1;
}

int hmap_put_u64(struct hmap *h, uint64_t key, uint64_t val)
{
    if ((h->n + 1) * 2 > h->cap && hmap_grow(h) != 0)
        return -1;
    size_t j = hash_u64(key) & (h->cap - 1);
    while (h->keys[j] != HMAP_EMPTY && h->keys[j] != key)
        j = (j + 1) & (h->cap - 1);
    if (h->keys[j] == HMAP_EMPTY)
        h->n++;
    h->keys[j] = key;
    h->vals[j] = val;
    return 0;
}

int hmap_get_u64(const struct hmap *h, uint64_t key, uint64_t *val)
{
    size_t j = hash_u64(key) & (h->cap - 1);
    while (h->keys[j] != HMAP_EMPTY) {
        if (h->keys[j] == key) {
            *val = h->vals[j];
            return 1;
        }
        j = (j + 1) & (h->cap - 1);
    }
    return 0;
}
