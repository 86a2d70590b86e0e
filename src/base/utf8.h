/* utf8: validation and repair of UTF-8 byte strings.
 *
 * Invalid input is replaced the way Rust's String::from_utf8_lossy (and the
 * WHATWG decoder) does it: each maximal subpart of an ill-formed sequence
 * becomes one U+FFFD. That is what Hugging Face tokenizers' decode returns, so
 * decoded text is byte-identical to the reference. */
#ifndef KP_UTF8_H
#define KP_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the well-formed sequence at s (1..4), or 0 if s starts an ill-formed
 * one; *bad receives the length of its maximal subpart (>= 1) in that case. A
 * sequence cut short by the end of the buffer counts as ill-formed. */
size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad, uint32_t *cp);
/* Offset of the first ill-formed byte, or n if s[0..n) is valid UTF-8. */
size_t utf8_valid_prefix(const char *s, size_t n);
/* Bytes at the end of s[0..n) that begin a sequence still incomplete but that
 * more bytes could complete (0..3): a stream must hold them back. */
size_t utf8_incomplete_tail(const char *s, size_t n);
/* Appends s[0..n) to dst with ill-formed subparts replaced by U+FFFD. dst must
 * hold 3*n bytes; returns the bytes written. */
size_t utf8_lossy(const char *s, size_t n, char *dst);
/* Encodes cp; returns its length (1..4). */
size_t utf8_put(uint32_t cp, char *dst);

#endif
