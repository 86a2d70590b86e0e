/* json_guard: a byte-level recogniser of one RFC 8259 JSON object (a
 * pushdown automaton with a bit stack of open containers): whether bytes can
 * continue it, and whether it is complete. Constrained decoding (grammar.h)
 * uses it for response_format json_object and a forced tool call's
 * arguments.
 *
 * Ownership: a guard is a small value (copy it to try bytes). */
#ifndef KP_JSON_GUARD_H
#define KP_JSON_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_GUARD_MAX_DEPTH 128
/* A whitespace run outside strings holds at most one newline and this many
 * spaces, tabs and CRs: a line break and an indent, where a model that would
 * rather stop could otherwise stall. */
#define JSON_GUARD_MAX_INDENT 16
/* A number's parts are bounded so that every number the guard accepts is a
 * finite double and an integer is exact: at most 15 integer digits (an
 * integer without fraction or exponent is then below 2^53), 16 fraction
 * digits and 2 exponent digits, so |x| < 10^15 * 10^99 = 10^114, far below
 * DBL_MAX; every client can read what constrained decoding writes. */
#define JSON_GUARD_MAX_INT_DIGITS 15
#define JSON_GUARD_MAX_FRAC_DIGITS 16
#define JSON_GUARD_MAX_EXP_DIGITS 2

struct json_guard {
    uint8_t state, lit, lit_pos, hex_left;
    uint8_t utf8_need, utf8_lo, utf8_hi; /* continuation bytes due, the range of the next one */
    uint8_t digits;                      /* digits of the number's current part (integer, fraction, exponent) */
    uint32_t chars; /* the string being read (or the last one): its length as JavaScript counts it, in UTF-16
                       units (an escape one, a character past U+FFFF two), as a schema's clients check it */
    bool in_key;
    uint8_t ws_nl, ws_indent; /* the current whitespace run's newlines and other bytes */
    int16_t depth;
    uint8_t stack[JSON_GUARD_MAX_DEPTH / 8]; /* bit per open container: 1 object, 0 array */
};

/* A guard expecting one JSON object (the top level of json_object mode). */
void json_guard_init(struct json_guard *g);
/* A guard expecting one JSON value of any kind. A number at the top ends
 * only on the byte after it, which the guard then refuses:
 * json_guard_number_ends says whether such a byte would end it there. */
void json_guard_init_value(struct json_guard *g);
bool json_guard_number_ends(const struct json_guard *g);
/* Advances over n bytes: 0, or -1 when they cannot continue valid JSON (the
 * guard is then unusable: feed a copy to try). */
int json_guard_feed(struct json_guard *g, const char *bytes, size_t n);
/* Whether the object is complete (nothing may follow). */
bool json_guard_done(const struct json_guard *g);

#endif
