/* libFuzzer target: a tokenizer.json as a download could bring it (its
 * vocabulary, merges, added tokens, normaliser, pre-tokeniser regexes and
 * decoder). It must be refused with a message, or load into a tokenizer that
 * encodes a few texts (code, digits, an added token's text, non-ASCII) into
 * ids it has, decodes them, and builds the constrained decoder's byte table;
 * never crash, leak or hang. */
#define _GNU_SOURCE
#include "../../src/base/err.h"
#include "../../src/tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static const char *const texts[] = {
    "def add(a, b):\n    return a + b  # sum\n",
    "x = 12345678 + 0.5e-3;\t\r\n",
    "<|im_start|>user\nHello, world!<|im_end|>",
    "Grüße, 世界! 🙂 naïve café",
    "   leading and trailing spaces   ",
    "",
};

static char path[64];

static void remove_file(void)
{
    unlink(path);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!path[0]) {
        snprintf(path, sizeof path, "%s/kapitsa-fuzz-tok-%d.json", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
                 (int)getpid());
        atexit(remove_file);
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    err_clear();
    struct tokenizer *t = tok_load_file(path);
    if (!t) {
        if (!err_msg()[0])
            abort(); /* a refusal must say why */
        return 0;
    }
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        struct tok_ids ids = {0};
        if (tok_encode(t, texts[i], strlen(texts[i]), &ids) == 0) {
            for (int32_t k = 0; k < ids.n; k++)
                if (ids.ids[k] < 0 || ids.ids[k] >= tok_n_vocab(t))
                    abort(); /* every id the encoder gives must exist */
            size_t n;
            char *s = tok_decode(t, ids.ids, ids.n, false, &n);
            if (!s)
                abort();
            free(s);
        }
        tok_ids_free(&ids);
    }
    struct vocab_bytes vb;
    if (tok_vocab_bytes(t, tok_n_vocab(t) + 3, &vb) == 0)
        vocab_bytes_free(&vb);
    tok_free(t);
    return 0;
}
