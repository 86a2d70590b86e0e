/* hmap: open-addressing hash maps for the two key kinds the project needs:
 * byte strings (vocabularies) and 64-bit integers (BPE merge pairs), both to a
 * 64-bit value. Keys of a string map are copied into the map's own storage.
 * Sized by the caller's expected count, grown by doubling; not thread-safe for
 * writers, any number of concurrent readers. */
#ifndef KP_HMAP_H
#define KP_HMAP_H

#include <stddef.h>
#include <stdint.h>

struct hmap {
    uint64_t *keys;   /* [cap] integer keys, or offsets into str; UINT64_MAX = empty */
    uint64_t *vals;   /* [cap] */
    uint32_t *lens;   /* [cap] string key lengths (string maps only) */
    char *str;        /* string key storage */
    size_t str_len, str_cap;
    size_t cap, n;
    int strings;
};

int hmap_init(struct hmap *h, size_t expected, int string_keys);
void hmap_free(struct hmap *h);
/* Inserts or replaces. -1 on allocation failure. */
int hmap_put_str(struct hmap *h, const char *key, size_t len, uint64_t val);
/* 1 and *val when found. */
int hmap_get_str(const struct hmap *h, const char *key, size_t len, uint64_t *val);
int hmap_put_u64(struct hmap *h, uint64_t key, uint64_t val); /* key must not be UINT64_MAX */
int hmap_get_u64(const struct hmap *h, uint64_t key, uint64_t *val);

#endif
