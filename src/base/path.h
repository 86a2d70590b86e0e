/* path: the data that ships with the binary (the repository's models/: the
 * catalog, the embedded models, their tokenizer; web/: serve's page), found
 * relative to /proc/self/exe so that a built or installed kapitsa finds it
 * wherever it is started from. */
#ifndef KP_PATH_H
#define KP_PATH_H

#include <stddef.h>

/* out = rel inside the data folder: the first of $KAPITSA_DATA, DIR/../models
 * (a source tree's build/kapitsa), DIR/../share/kapitsa/models (make install's
 * layout), where DIR holds the running binary, and ./models, that has rel.
 * 0, or -1 with err_set() naming the places (out: the source tree's). */
int path_data(const char *rel, char *out, size_t n);

/* out = the web page's file name (serve's GET /), in web/ beside the data
 * folder: a source tree's web/, make install's share/kapitsa/web. 0, or -1
 * with err_set() as path_data. */
int path_web(const char *name, char *out, size_t n);

#endif
