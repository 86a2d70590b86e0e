/* tokenizer: Hugging Face tokenizer.json, byte-level BPE, encoded and decoded
 * exactly as the `tokenizers` library does.
 *
 * Encode: added tokens are found first in the raw text (leftmost-longest, with
 * their lstrip/rstrip/single_word flags); the text between them is normalised
 * (NFC via utf8proc, or none), pre-tokenised (Split by the model's regex with
 * PCRE2 in UTF+UCP mode, JIT-compiled; ByteLevel; Digits; in a Sequence) and
 * each piece is BPE-merged by rank. Decode: the ByteLevel decoder, then the
 * bytes repaired as from_utf8_lossy does.
 *
 * Ownership: struct tokenizer owns everything it loads; it is immutable after
 * tok_load and may be used from any number of threads at once. */
#ifndef KP_TOKENIZER_H
#define KP_TOKENIZER_H

#include "../grammar/grammar.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* A growable id array owned by the caller (tok_ids_free). work counts the
 * merge-queue operations tok_encode spent on it (pairs queued and taken out),
 * a measure of encoding time that grows as n log n of the input at worst. */
struct tok_ids {
    int32_t *ids;
    int32_t n, cap;
    uint64_t work;
};

/* Loads DIR/tokenizer.json. NULL with err_set() naming the file and field. */
struct tokenizer *tok_load(const char *dir);
/* Loads from a tokenizer.json path. */
struct tokenizer *tok_load_file(const char *path);
/* Loads from an already parsed tokenizer.json object (borrowed: the caller
 * still owns root); what names it in errors. */
struct tokenizer *tok_load_json(json_t *root, const char *what);
void tok_free(struct tokenizer *t);

/* Appends the ids of text[0..len) to out. -1 with err_set() for text that is not
 * valid UTF-8 (the offset is named) or on allocation failure. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, struct tok_ids *out);
void tok_ids_free(struct tok_ids *ids);

/* Decodes ids into a new NUL-terminated string (caller frees); *len gets its
 * length. skip_special drops special added tokens. NULL on a bad id. */
char *tok_decode(const struct tokenizer *t, const int32_t *ids, int32_t n, bool skip_special, size_t *len);

int32_t tok_n_vocab(const struct tokenizer *t);
/* The token's string as the vocabulary spells it (byte-level form). NULL if out of range. */
const char *tok_piece(const struct tokenizer *t, int32_t id);
/* The token's raw bytes (the byte-level form undone, no UTF-8 repair: a token
 * may hold part of a character) into dst; their count, or -1 for a bad id or
 * when cap is too small (cap >= strlen(tok_piece) is always enough). */
int32_t tok_bytes(const struct tokenizer *t, int32_t id, char *dst, size_t cap);
/* Id of a token given by its vocabulary string (e.g. "<|im_end|>"), or -1. */
int32_t tok_find(const struct tokenizer *t, const char *piece);
bool tok_is_special(const struct tokenizer *t, int32_t id);
/* Every model token's bytes and whether it is special, for constrained
 * decoding (ids past the tokenizer's vocabulary: no bytes, special); the
 * caller frees vb (vocab_bytes_free). -1 with err_set() when memory is short. */
int tok_vocab_bytes(const struct tokenizer *t, int32_t n_vocab, struct vocab_bytes *vb);

/* Streaming decode: feed ids one at a time, get text that never ends inside a
 * UTF-8 sequence (bytes of an unfinished character are held until the next id
 * completes them; ill-formed bytes become U+FFFD as in tok_decode). */
struct tok_stream {
    char pending[8];
    int32_t n_pending;
};
/* Writes at most cap bytes to out (cap >= 64 + longest token * 3 is always
 * enough); returns the bytes written, or -1 for a bad id. */
int32_t tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int32_t id, bool skip_special, char *out,
                        size_t cap);
/* What is still held, repaired (an unfinished sequence becomes U+FFFD). */
int32_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

#endif
