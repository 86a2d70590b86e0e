/* libFuzzer target: the JSON guard of constrained output. Fed whole and one
 * byte at a time it must reach the same verdict, and a text it takes as a
 * complete object must be one for jansson too (texts with \u escapes, which
 * the guard does not pair up as surrogates, and numbers jansson cannot hold
 * are left out of that comparison). */
#define _GNU_SOURCE
#include "../../src/grammar/json_guard.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    struct json_guard g, whole;
    json_guard_init(&g);
    size_t i = 0;
    while (i < size && !json_guard_done(&g) && json_guard_feed(&g, (const char *)data + i, 1) == 0)
        i++;
    json_guard_init(&whole);
    const bool all = json_guard_feed(&whole, (const char *)data, size) == 0;
    if (all != (i == size))
        abort();
    if (all && json_guard_done(&g) && !memmem(data, size, "\\u", 2)) {
        json_error_t e;
        json_t *j = json_loadb((const char *)data, size, 0, &e);
        if (!j && !strstr(e.text, "overflow") && !strstr(e.text, "too big"))
            abort();
        if (j && !json_is_object(j))
            abort();
        json_decref(j);
    }
    return 0;
}
