/* arena: chained malloc blocks, bump-pointer allocation (see arena.h). */
#include "arena.h"

#include <stdlib.h>
#include <string.h>

struct arena_block {
    struct arena_block *next;
    size_t size, off;
    _Alignas(16) unsigned char data[];
};

#define ARENA_BLOCK (64 * 1024)

void *arena_alloc(struct arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (a->limit && a->used + n > a->limit)
        return NULL;
    struct arena_block *b = a->head;
    if (!b || b->off + n > b->size) {
        size_t size = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        b = malloc(sizeof *b + size);
        if (!b)
            return NULL;
        b->size = size;
        b->off = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->off;
    b->off += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *arena_strndup(struct arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

void arena_free(struct arena *a)
{
    struct arena_block *b = a->head;
    while (b) {
        struct arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->used = 0;
}
