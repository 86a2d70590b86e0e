/* libFuzzer target: arbitrary bytes through the Qwen3 tokenizer (encode,
 * decode, stream decode). Valid UTF-8 must round-trip through NFC-stable text;
 * invalid UTF-8 must be refused, never crash. */
#include "../../src/base/utf8.h"
#include "../../src/tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static struct tokenizer *tok;

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!tok) {
        const char *d = getenv("KAPITSA_TOKENIZER");
        tok = tok_load(d && *d ? d : "models/qwen3-tokenizer");
        if (!tok)
            abort();
    }
    struct tok_ids ids = {0};
    int rc = tok_encode(tok, (const char *)data, size, &ids);
    if ((rc == 0) != (utf8_valid_prefix((const char *)data, size) == size))
        abort(); /* valid input must encode, invalid must be refused */
    if (rc == 0) {
        size_t n;
        char *s = tok_decode(tok, ids.ids, ids.n, false, &n);
        if (!s)
            abort();
        struct tok_stream st = {0};
        char buf[4096];
        size_t total = 0;
        for (int32_t i = 0; i < ids.n; i++) {
            int32_t k = tok_stream_push(tok, &st, ids.ids[i], false, buf, sizeof buf);
            if (k < 0 || total + (size_t)k > n || memcmp(s + total, buf, (size_t)k) != 0)
                abort(); /* the stream must equal the whole decode */
            total += (size_t)k;
        }
        total += (size_t)tok_stream_flush(&st, buf, sizeof buf);
        if (total != n)
            abort();
        free(s);
    }
    tok_ids_free(&ids);
    return 0;
}
