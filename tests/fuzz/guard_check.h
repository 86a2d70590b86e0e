/* What the grammar fuzzers share: a text fed to a guard whole and one byte at
 * a time must get the same verdict (abort() otherwise), and the texts whose
 * JSON jansson cannot hold are told apart from the others. */
#ifndef KP_FUZZ_GUARD_CHECK_H
#define KP_FUZZ_GUARD_CHECK_H

#define _GNU_SOURCE
#include "../../src/grammar/grammar.h"

#include <stdlib.h>
#include <string.h>

/* Whether text[0..n) is taken under gm: complete, or, lazy, where the output
 * may end; the same fed whole and byte by byte. */
static bool guard_takes(const struct grammar *gm, const char *text, size_t n, bool lazy)
{
    struct guard g, whole;
    guard_init(&g, gm);
    size_t i = 0;
    while (i < n && !guard_done(&g) && guard_feed(&g, text + i, 1) == 0)
        i++;
    guard_init(&whole, gm);
    const bool all = guard_feed(&whole, text, n) == 0;
    const bool end = lazy ? guard_may_end(&g) : guard_done(&g);
    if (all != (i == n) || (all && end != (lazy ? guard_may_end(&whole) : guard_done(&whole))))
        abort();
    return all && end;
}

/* Whether jansson may refuse the JSON in text although the guard took it:
 * \u escapes (the guard does not pair surrogates, nor refuse \u0000), an
 * integer past int64, a real past double. */
static bool json_beyond_jansson(const char *t, size_t n)
{
    if (memmem(t, n, "\\u", 2))
        return true;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        run = t[i] >= '0' && t[i] <= '9' ? run + 1 : 0;
        if (run >= 16)
            return true;
        if ((t[i] == 'e' || t[i] == 'E') && i + 1 < n) {
            const size_t j = i + 1 + (t[i + 1] == '+' || t[i + 1] == '-');
            size_t d = 0;
            while (j + d < n && t[j + d] >= '0' && t[j + d] <= '9')
                d++;
            if (d >= 3)
                return true;
        }
    }
    return false;
}

#endif
