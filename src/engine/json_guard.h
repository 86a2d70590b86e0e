/* json_guard: constrained decoding to JSON (OpenAI's response_format
 * json_object). A byte-level recogniser of RFC 8259 JSON (a pushdown automaton
 * with a bit stack of open containers) says whether a token's bytes can
 * continue the output; the sampler's own distribution is then restricted to
 * the tokens that can (rejection: an invalid draw is removed and the draw
 * repeated, which samples exactly the renormalised restricted distribution).
 *
 * Ownership: a guard is a small value (copy it to try bytes); the vocabulary
 * table is built once by its owner (the server, from the tokenizer) and must
 * outlive every guard that uses it. */
#ifndef KP_JSON_GUARD_H
#define KP_JSON_GUARD_H

#include "sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_GUARD_MAX_DEPTH 128
#define JSON_GUARD_MAX_WS 32 /* whitespace bytes in a row outside strings: a model cannot stall in them */

struct json_guard {
    uint8_t state, lit, lit_pos, hex_left;
    uint8_t utf8_need, utf8_lo, utf8_hi; /* continuation bytes due, the range of the next one */
    bool in_key;
    uint16_t ws_run;
    int16_t depth;
    uint8_t stack[JSON_GUARD_MAX_DEPTH / 8]; /* bit per open container: 1 object, 0 array */
};

/* Each token's bytes (byte-level BPE undone), and which tokens are special
 * (never part of constrained text). */
struct vocab_bytes {
    int32_t n_vocab;
    char *data;       /* all tokens' bytes, concatenated */
    uint32_t *off;    /* [n_vocab + 1] token id's bytes are data[off[id] .. off[id+1]) */
    uint8_t *special; /* [n_vocab] */
};
void vocab_bytes_free(struct vocab_bytes *vb);

/* A guard expecting one JSON object (the top level of json_object mode). */
void json_guard_init(struct json_guard *g);
/* Advances over n bytes: 0, or -1 when they cannot continue valid JSON (the
 * guard is then unusable: feed a copy to try). */
int json_guard_feed(struct json_guard *g, const char *bytes, size_t n);
/* Whether the object is complete (nothing may follow). */
bool json_guard_done(const struct json_guard *g);
/* Whether token id can come next (special tokens never can). */
bool json_guard_allows(const struct json_guard *g, const struct vocab_bytes *vb, int32_t id);

/* The next token under the guard: a draw from the sampler's distribution
 * (sampler_dist) restricted to allowed tokens; if none of its candidates is
 * allowed, the allowed token with the largest adjusted logit. Advances the
 * guard over it. -1 if no token at all can continue. */
int32_t json_guard_sample(struct json_guard *g, const struct vocab_bytes *vb, struct sampler *s, const float *logits,
                          const int32_t *history, int32_t n_history);

#endif
