/* path: files that ship beside the binary (models/, the catalog), found
 * relative to /proc/self/exe so an installed kapitsa finds them wherever it
 * is started from. */
#ifndef KP_PATH_H
#define KP_PATH_H

#include <stddef.h>

/* out = DIR/../rel where DIR holds the running binary; out = rel if that
 * cannot be read. */
void path_beside_exe(const char *rel, char *out, size_t n);

#endif
