/* utf8: well-formedness per Unicode Table 3-7, lossy repair as Rust's
 * from_utf8_lossy (see utf8.h). */
#include "utf8.h"

#include <string.h>

size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0;
        if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        if (c == 0xf4)
            hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    uint32_t v = c & (len == 2 ? 0x1f : len == 3 ? 0x0f : 0x07);
    for (size_t i = 1; i < len; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        v = (v << 6) | (s[i] & 0x3f);
        lo = 0x80;
        hi = 0xbf;
    }
    *cp = v;
    return len;
}

size_t utf8_valid_prefix(const char *s, size_t n)
{
    size_t i = 0, bad;
    uint32_t cp;
    while (i < n) {
        size_t l = utf8_seq((const unsigned char *)s + i, n - i, &bad, &cp);
        if (!l)
            return i;
        i += l;
    }
    return n;
}

size_t utf8_incomplete_tail(const char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const unsigned char *p = (const unsigned char *)s + n - k;
        if ((*p & 0xc0) == 0x80)
            continue; /* a continuation byte: look further back */
        size_t bad;
        uint32_t cp;
        /* a lead byte whose sequence runs past the end, valid so far */
        if (*p >= 0xc2 && utf8_seq(p, k, &bad, &cp) == 0 && bad == k)
            return k;
        return 0;
    }
    return 0;
}

size_t utf8_put(uint32_t cp, char *d)
{
    unsigned char *o = (unsigned char *)d;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t utf8_lossy(const char *s, size_t n, char *dst)
{
    size_t i = 0, o = 0, bad;
    uint32_t cp;
    while (i < n) {
        size_t l = utf8_seq((const unsigned char *)s + i, n - i, &bad, &cp);
        if (l) {
            memcpy(dst + o, s + i, l);
            o += l;
            i += l;
        } else {
            o += utf8_put(0xfffd, dst + o);
            i += bad;
        }
    }
    return o;
}
