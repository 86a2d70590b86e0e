/* arena: bump allocation for data that dies all at once (a parsed template, one
 * render, one request). Blocks are malloc'd as needed and freed together by
 * arena_free; arena_alloc returns 16-byte aligned, zeroed memory, or NULL when
 * malloc fails or the arena's byte limit (0 = none) would be passed. */
#ifndef KP_ARENA_H
#define KP_ARENA_H

#include <stddef.h>

struct arena_block;

struct arena {
    struct arena_block *head;
    size_t used;  /* bytes handed out */
    size_t limit; /* 0 = unlimited */
};

void *arena_alloc(struct arena *a, size_t n);
/* Copies n bytes and a NUL. */
char *arena_strndup(struct arena *a, const char *s, size_t n);
void arena_free(struct arena *a);

#endif
