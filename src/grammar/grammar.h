/* grammar: constrained decoding. A request's output must follow a small
 * grammar, a chain of segments: literal text (with places where whitespace
 * may come), one of a list of names, one JSON object (json_guard), free text
 * up to a terminator, and a choice between literals that jumps. That covers
 * response_format json_object and a tool call that tool_choice forces, in
 * each model's own format (chat/tool_grammar.h builds those), and free text
 * in which the output may end, where a tool call may open (a strict tool's
 * schema followed when the model calls it on its own). A guard walks
 * the grammar a byte at a time; sampling (sampler_sample_guarded, in the
 * engine above this layer) is restricted to the tokens whose
 * bytes keep the output valid (rejection: an invalid draw is removed and the
 * draw repeated, which samples exactly the renormalised restricted
 * distribution).
 *
 * Ownership: a grammar owns its strings (grammar_free). A guard is a small
 * value that points at its grammar (copy it to try bytes); the grammar must
 * outlive it. The vocabulary table is built once by its owner (the server,
 * from the tokenizer) and must outlive every guard that uses it. */
#ifndef KP_GRAMMAR_H
#define KP_GRAMMAR_H

#include "json_guard.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_SEG 4096
#define GRAMMAR_MAX_ALT 2
#define GRAMMAR_MAX_NAMES 4096
#define GRAMMAR_MAX_TEXT 65535 /* bytes of a literal or name */
/* In a literal: whitespace may come here, up to the grammar's max_ws bytes
 * (GRAMMAR_MAX_WS unless set: the tool-call formats put a newline or two
 * there; a model that would rather stop must not stall in it). */
#define GRAMMAR_WS "\x01"
#define GRAMMAR_MAX_WS 4

enum grammar_kind {
    GRAM_LIT,   /* the literal text */
    GRAM_ALT,   /* a place for whitespace, then one of n_alt literals (none a prefix of another), each
                   with its next; or, where alt_else is set, a first byte none begins goes there */
    GRAM_NAME,  /* one of n_names names (after whitespace where ws); it ends where the next byte cannot
                   continue a name, and goes on at the name's next if it has one */
    GRAM_JSON,  /* one JSON object, in which the text at deny (if any) never appears */
    GRAM_FREE,  /* any bytes (none in deny) up to and including the first of n_alt terminators: the
                   first goes on at next, the second at its alt_next */
    GRAM_VALUE, /* one JSON value of the kinds in n (enum grammar_value_kind), in which the text at deny
                   (if any) never appears */
};

enum grammar_value_kind {
    GRAM_V_STRING = 1,
    GRAM_V_NUMBER = 2,
    GRAM_V_INTEGER = 4, /* a number without fraction or exponent */
    GRAM_V_BOOL = 8,
    GRAM_V_NULL = 16,
    GRAM_V_OBJECT = 32,
    GRAM_V_ARRAY = 64,
};

/* A string format a VALUE segment's string follows, in a strict form that
 * RFC 3339 / 4122 / 5321 / 3986 and zod's patterns for these formats accept:
 * a date YYYY-MM-DD (a day its month has); a time HH:MM:SS, a fraction of 1
 * to 9 digits, then Z (UTC); a date-time as the two joined by T; a UUID in
 * lower-case hex with a version 1-8 and the RFC variant; an e-mail address
 * as dot-separated atoms of [A-Za-z0-9_+-], @, and a domain of two labels
 * or more, the last of letters; a URI as a scheme, ':', and at least one
 * byte of RFC 3986's characters. No escapes, ASCII only. */
enum grammar_format {
    GRAM_F_NONE,
    GRAM_F_DATE,
    GRAM_F_TIME,
    GRAM_F_DATE_TIME,
    GRAM_F_UUID,
    GRAM_F_EMAIL,
    GRAM_F_URI,
};

struct grammar_seg {
    enum grammar_kind kind;
    int32_t next;                   /* the segment that follows; n_seg or past it: the end */
    uint32_t text;                  /* LIT: the literal (an offset into strs); NAME: its first name in names */
    uint32_t deny;                  /* FREE: bytes it may not contain; JSON, VALUE: a text it may not
                                       contain (an offset into strs), 0 for none */
    int32_t n;                      /* NAME: names; ALT: literals; FREE: terminators; VALUE: kinds */
    bool ws;                        /* NAME: whitespace may come first */
    uint32_t alt[GRAMMAR_MAX_ALT];  /* ALT: the literals; FREE: the terminators (offsets into strs) */
    int32_t alt_next[GRAMMAR_MAX_ALT];
    int32_t alt_else;               /* ALT: where a first byte no literal begins goes, or -1 */
    bool may_end;                   /* FREE: the output may end in it (grammar_may_end) */
    /* VALUE: a number's range (either end excluded where open; -HUGE_VAL, HUGE_VAL: none), and a
       string's length in UTF-16 units (json_guard's chars) and format */
    double lo, hi;
    bool lo_open, hi_open;
    uint32_t min_len, max_len;
    enum grammar_format format;
};

struct grammar_name {
    uint32_t text; /* an offset into strs */
    int32_t next;  /* where the segment goes on after this name; -1: the segment's next */
};

struct grammar {
    int32_t n_seg, cap_seg;
    struct grammar_seg *seg; /* owned: [n_seg] */
    struct grammar_name *names; /* owned: the NAME segments' names */
    int32_t n_names, cap_names;
    char *strs; /* owned: every text the segments name, NUL-terminated; offset 0 is "" */
    size_t n_strs, cap_strs;
    int32_t max_ws; /* whitespace bytes at a place, 0: GRAMMAR_MAX_WS */
    int32_t max_nl; /* newlines among them, 0: no bound but max_ws */
};

void grammar_init(struct grammar *g);
void grammar_free(struct grammar *g);
/* Appends a segment (its next: the one appended after it) and returns its
 * index, or -1 with err_set() when the grammar is full or memory is short.
 * The last segment must not end on a place for whitespace, and a name list
 * must be followed by a segment (its end is seen on the byte after it). */
int32_t grammar_lit(struct grammar *g, const char *text);
/* b: NULL for a choice of one literal (with an else, grammar_else) */
int32_t grammar_alt(struct grammar *g, const char *a, const char *b);
/* ws: whitespace may come before the name */
int32_t grammar_names(struct grammar *g, const char *const *names, int32_t n_names, bool ws);
/* One JSON value of the kinds given (enum grammar_value_kind), whitespace
 * first; forbid as grammar_json's. */
int32_t grammar_value(struct grammar *g, unsigned kinds, const char *forbid);
/* VALUE segment seg's numbers within lo..hi (an end excluded where open;
 * -HUGE_VAL, HUGE_VAL for none) and written without exponent, where a
 * bounded number is checked as it grows: a byte comes only while some
 * number it begins is in range. -1 with err_set() when no number the
 * segment may write is in range. */
int grammar_value_range(struct grammar *g, int32_t seg, double lo, bool lo_open, double hi, bool hi_open);
/* VALUE segment seg's strings: min_len to max_len UTF-16 units, in format f.
 * -1 with err_set() when no string fits (a fixed-length format with length
 * bounds is refused). */
int grammar_value_string(struct grammar *g, int32_t seg, uint32_t min_len, uint32_t max_len, enum grammar_format f);
/* Where NAME segment seg goes on after its name j (0-based, in the order given). */
void grammar_name_jump(struct grammar *g, int32_t seg, int32_t j, int32_t target);
/* Where ALT segment seg sends a first byte that none of its literals begins. */
void grammar_else(struct grammar *g, int32_t seg, int32_t target);
/* forbid: NULL, or a text that may not appear in the object (a format's
 * closing tag, where a parser would end it); its first byte must not come
 * again in it. */
int32_t grammar_json(struct grammar *g, const char *forbid);
/* Free text up to terminator, or (other: NULL for none) up to other, which
 * continues at the segment grammar_jump gives its alternative 1. */
int32_t grammar_until(struct grammar *g, const char *terminator, const char *other, const char *deny);
/* The output may end inside FREE segment seg, where no terminator is partly
 * matched: the vocabulary's end tokens are allowed there (vocab_bytes.end). */
void grammar_may_end(struct grammar *g, int32_t seg);
/* Where segment seg (alternative or terminator alt of an ALT or FREE; -1 for
 * the segment's own next) goes on; target n_seg or past it: the end;
 * GRAMMAR_REFUSE for a FREE's terminator 1: the text may not appear. */
#define GRAMMAR_REFUSE (-1)
void grammar_jump(struct grammar *g, int32_t seg, int32_t alt, int32_t target);
/* Moves src into dst (src is left empty). */
void grammar_move(struct grammar *dst, struct grammar *src);

struct guard {
    const struct grammar *gm;
    int32_t seg;          /* the current segment; n_seg or past it: complete */
    uint16_t pos;         /* bytes of the segment's text (or name) matched */
    uint8_t tpos[GRAMMAR_MAX_ALT]; /* FREE: bytes of each terminator matched; JSON: of the forbidden text */
    uint8_t ws;           /* whitespace bytes in a row at the current place */
    uint8_t nl;           /* newlines among them */
    uint8_t alive;        /* ALT: the literals still matching, a bit each */
    int32_t name;         /* NAME: the first name the bytes so far begin; VALUE: 1 once a byte of it came */
    struct json_guard json;
    /* VALUE: a bounded number's text, or a fixed-length format's string, so far; an e-mail address's or
       URI's state (its part, the bytes of its current atom or label, labels done, the last byte, whether
       the label is letters only); the bytes a format's string needs at least before it may close */
    char text[40];
    uint8_t n_text, f_part, f_run, f_labels, f_need;
    char f_last;
    bool f_alpha, number;
};

void guard_init(struct guard *gd, const struct grammar *gm);
/* Advances over n bytes: 0, or -1 when they cannot continue the grammar (the
 * guard is then unusable: feed a copy to try). */
int guard_feed(struct guard *gd, const char *bytes, size_t n);
/* Whether the output is complete (nothing may follow). */
bool guard_done(const struct guard *gd);
/* Whether the output may end here (grammar_may_end), or go on. */
bool guard_may_end(const struct guard *gd);

/* Each token's bytes (byte-level BPE undone), which tokens are special
 * (never part of constrained text), and which end the output. */
struct vocab_bytes {
    int32_t n_vocab;
    char *data;       /* all tokens' bytes, concatenated */
    uint32_t *off;    /* [n_vocab + 1] token id's bytes are data[off[id] .. off[id+1]) */
    uint8_t *special; /* [n_vocab] */
    uint8_t *end;     /* [n_vocab] the model's end tokens (vocab_bytes_set_end), or NULL */
};
/* Marks ids[0..n) (those in the vocabulary) as the tokens that end the output. */
int vocab_bytes_set_end(struct vocab_bytes *vb, const int32_t *ids, int32_t n);
void vocab_bytes_free(struct vocab_bytes *vb);

/* Whether token id can come next: an end token where the output may end,
 * never another special token. */
bool guard_allows(const struct guard *gd, const struct vocab_bytes *vb, int32_t id);


#endif
