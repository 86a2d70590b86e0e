#define _GNU_SOURCE
/* Tests of the tokenizer against Hugging Face tokenizers' output for the real
 * Qwen3 tokenizer (the JSON files in tests/fixtures/tokenizer): ids, decoded
 * text, and the streaming decoder fed one id at a time. */
#include "../../src/base/err.h"
#include "../../src/base/utf8.h"
#include "../../src/tokenizer/tokenizer.h"
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static struct tokenizer *qwen3_tok(void)
{
    const char *d = getenv("KAPITSA_TOKENIZER");
    return tok_load(d && *d ? d : "models/qwen3-tokenizer");
}

static json_t *load_json(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/%s", test_fixtures(), name);
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j)
        fprintf(stderr, "  %s: %s\n", path, je.text);
    return j;
}

/* Encodes text and compares with the expected ids; decodes them back (whole
 * and streamed) and compares with want_text when given. */
static void check_case(struct tokenizer *t, const char *text, size_t len, json_t *want_ids, json_t *want_decoded,
                       size_t idx)
{
    struct tok_ids ids = {0};
    CHECK(tok_encode(t, text, len, &ids) == 0, "case %zu: %s", idx, err_msg());
    int same = ids.n == (int32_t)json_array_size(want_ids);
    for (int32_t i = 0; same && i < ids.n; i++)
        same = ids.ids[i] == json_integer_value(json_array_get(want_ids, (size_t)i));
    CHECK(same, "case %zu: ids differ (%d vs %zu ids) for '%.60s'", idx, ids.n, json_array_size(want_ids), text);
    if (want_decoded) {
        const char *want_text = json_string_value(want_decoded);
        size_t want_len = json_string_length(want_decoded), n;
        char *d = tok_decode(t, ids.ids, ids.n, false, &n);
        CHECK(d && n == want_len && memcmp(d, want_text, n) == 0, "case %zu: decoded '%.60s'", idx, d ? d : "(null)");
        free(d);
        struct tok_stream s = {0};
        char *acc = calloc(ids.n * 64 + 64, 1), buf[4096];
        size_t o = 0;
        for (int32_t i = 0; i < ids.n; i++) {
            int32_t k = tok_stream_push(t, &s, ids.ids[i], false, buf, sizeof buf);
            CHECK(k >= 0, "stream push");
            /* every chunk the stream emits is valid UTF-8 on its own */
            CHECK(k < 0 || utf8_valid_prefix(buf, (size_t)k) == (size_t)k, "case %zu: chunk %d splits a character",
                  idx, i);
            memcpy(acc + o, buf, (size_t)k);
            o += (size_t)k;
        }
        o += (size_t)tok_stream_flush(&s, acc + o, 64);
        CHECK(o == want_len && memcmp(acc, want_text, o) == 0, "case %zu: streamed '%.60s'", idx, acc);
        free(acc);
    }
    tok_ids_free(&ids);
}

void test_tokenizer_goldens(void)
{
    struct tokenizer *t = qwen3_tok();
    CHECK(t != NULL, "%s", err_msg());
    json_t *g = load_json("tokenizer_goldens.json");
    CHECK(g && json_array_size(g) > 0, "goldens");
    if (!t || !g) {
        tok_free(t);
        json_decref(g);
        return;
    }
    size_t i;
    json_t *c;
    json_array_foreach(g, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        check_case(t, text, json_string_length(json_object_get(c, "text")), json_object_get(c, "ids"),
                   json_object_get(c, "decoded"), i);
    }
    json_decref(g);
    g = load_json("chat_template_goldens.json");
    json_array_foreach(g, i, c) {
        json_t *r = json_object_get(c, "rendered");
        if (r)
            check_case(t, json_string_value(r), json_string_length(r), json_object_get(c, "ids"), r, 1000 + i);
    }
    json_decref(g);
    tok_free(t);
}

/* The large golden set (tools/reference/tokenizer_corpus.py): 3.2 MB of code,
 * prose in many scripts, emoji, control characters and whitespace runs. */
void test_tokenizer_corpus(void)
{
    struct tokenizer *t = qwen3_tok();
    char cmd[600];
    /* kept compressed in the repository (12 MB as text) */
    snprintf(cmd, sizeof cmd, "gzip -dc '%s/tokenizer/corpus.jsonl.gz'", test_fixtures());
    FILE *f = popen(cmd, "r");
    CHECK(t && f, "tokenizer or `%s` missing", cmd);
    char *line = NULL;
    size_t cap = 0, n = 0;
    while (t && f && getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        json_t *text = json_object_get(j, "text");
        CHECK(json_is_string(text), "line %zu", n + 1);
        if (json_is_string(text))
            check_case(t, json_string_value(text), json_string_length(text), json_object_get(j, "ids"),
                       json_object_get(j, "decoded"), 2000 + n);
        json_decref(j);
        n++;
    }
    CHECK(n >= 700, "only %zu documents", n);
    free(line);
    if (f)
        CHECK(pclose(f) == 0, "%s failed", cmd);
    tok_free(t);
}

/* Small tokenizers made by tools/reference/tokenizer_features.py: Split
 * behaviors and invert, Digits, ByteLevel with its regex and a prefix space,
 * "a b" merges, added tokens with lstrip/rstrip/single_word. */
void test_tokenizer_features(void)
{
    json_t *g = load_json("features/features.json");
    CHECK(json_array_size(g) >= 100, "feature goldens");
    size_t i;
    json_t *c;
    json_array_foreach(g, i, c) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/tokenizer/features/%s", test_fixtures(),
                 json_string_value(json_object_get(c, "tokenizer")));
        struct tokenizer *t = tok_load(dir);
        CHECK(t != NULL, "%s", err_msg());
        json_t *text = json_object_get(c, "text");
        if (t)
            check_case(t, json_string_value(text), json_string_length(text), json_object_get(c, "ids"),
                       json_object_get(c, "decoded"), 3000 + i);
        tok_free(t);
    }
    json_decref(g);
}

/* Added tokens with normalized=true are found in the NFC text, the others in the raw
 * input: a decomposed "e + U+0301" reaches the precomposed token only after NFC, and a
 * decomposed raw token matches before NFC would recompose it. */
void test_tokenizer_added_normalized(void)
{
    char src[512], dir[512], path[600];
    snprintf(src, sizeof src, "%s/tokenizer/features/split_removed/tokenizer.json", test_fixtures());
    snprintf(dir, sizeof dir, "%s/added_norm", test_tmpdir());
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    mkdir(dir, 0755);
    json_t *j = json_load_file(src, 0, NULL);
    json_t *adds = json_object_get(j, "added_tokens");
    CHECK(json_is_array(adds), "added_tokens");
    json_array_append_new(adds, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 5000, "content", "\xc3\xa9", "single_word",
                                          0, "lstrip", 0, "rstrip", 0, "normalized", 1, "special", 0));
    json_array_append_new(adds, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 5001, "content", "n\xcc\x83", "single_word",
                                          0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
    json_array_append_new(adds, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 5002, "content", "o\xcc\x88", "single_word",
                                          0, "lstrip", 0, "rstrip", 0, "normalized", 1, "special", 0));
    json_dump_file(j, path, 0);
    json_decref(j);
    struct tokenizer *t = tok_load(dir);
    CHECK(t != NULL, "%s", err_msg());
    struct tok_ids ids = {0};
    if (t) {
        CHECK(tok_encode(t, "e\xcc\x81", 3, &ids) == 0 && ids.n == 1 && ids.ids[0] == 5000, "NFC then match: %d ids", ids.n);
        ids.n = 0;
        CHECK(tok_encode(t, "n\xcc\x83", 3, &ids) == 0 && ids.n == 1 && ids.ids[0] == 5001, "raw match before NFC");
        ids.n = 0;
        CHECK(tok_encode(t, "o\xcc\x88", 3, &ids) == 0 && (ids.n != 1 || ids.ids[0] != 5002),
              "a normalized token spelled decomposed never matches NFC text");
    }
    tok_ids_free(&ids);
    tok_free(t);
}

/* A Split on a literal String is the literal, whatever its characters: "\\E|"
 * (which once ended a \\Q...\\E quote early, leaving an empty alternation)
 * and regex syntax like ".*" are removed as text, and only there. */
void test_tokenizer_split_literal(void)
{
    const char *lits[] = {"\\E|", ".*", "(?"};
    const char *texts[] = {"a\\E|b\\E|", "x.*y.z", "p(?q(r"};
    const char *want[] = {"ab", "xy.z", "pq(r"};
    for (int i = 0; i < 3; i++) {
        char src[512], dir[512], path[600];
        snprintf(src, sizeof src, "%s/tokenizer/features/split_string/tokenizer.json", test_fixtures());
        snprintf(dir, sizeof dir, "%s/split_literal%d", test_tmpdir(), i);
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        mkdir(dir, 0755);
        json_t *j = json_load_file(src, 0, NULL);
        json_t *split = json_array_get(json_object_get(json_object_get(j, "pre_tokenizer"), "pretokenizers"), 0);
        CHECK(split && json_object_set_new(json_object_get(split, "pattern"), "String", json_string(lits[i])) == 0 &&
                  json_object_set_new(split, "behavior", json_string("Removed")) == 0,
              "edit");
        json_dump_file(j, path, 0);
        json_decref(j);
        struct tokenizer *t = tok_load(dir);
        CHECK(t != NULL, "%s", err_msg());
        struct tok_ids ids = {0};
        size_t n = 0;
        char *s = NULL;
        if (t && tok_encode(t, texts[i], strlen(texts[i]), &ids) == 0)
            s = tok_decode(t, ids.ids, ids.n, false, &n);
        CHECK(s && strcmp(s, want[i]) == 0, "split on '%s': '%s' became '%s', not '%s'", lits[i], texts[i], s ? s : "?",
              want[i]);
        free(s);
        tok_ids_free(&ids);
        tok_free(t);
    }
}

void test_tokenizer_edges(void)
{
    struct tokenizer *t = qwen3_tok();
    if (!t)
        return;
    struct tok_ids ids = {0};
    /* invalid UTF-8 is refused with the offset */
    CHECK(tok_encode(t, "ab\xff", 3, &ids) != 0 && strstr(err_msg(), "byte 2"), "%s", err_msg());
    CHECK(tok_encode(t, "\xe2\x82", 2, &ids) != 0, "truncated sequence");
    /* special tokens inside text are matched, the vocabulary lookup works */
    ids.n = 0;
    CHECK(tok_encode(t, "x<|im_end|>y", 12, &ids) == 0 && ids.n == 3 && ids.ids[1] == tok_find(t, "<|im_end|>"),
          "special inside text");
    CHECK(tok_is_special(t, tok_find(t, "<|im_end|>")) && !tok_is_special(t, tok_find(t, "<think>")), "flags");
    /* decode: skip_special, bad ids, bytes that are not UTF-8 become U+FFFD */
    size_t n;
    char *s = tok_decode(t, ids.ids, ids.n, true, &n);
    CHECK(s && strcmp(s, "xy") == 0, "skip special: '%s'", s ? s : "");
    free(s);
    int32_t bad = tok_n_vocab(t) + 5;
    CHECK(tok_decode(t, &bad, 1, false, &n) == NULL && strstr(err_msg(), "not in the vocabulary"), "bad id");
    int32_t half = t ? tok_find(t, "\xc3\xa2") : -1; /* byte 0xe2 alone: a cut 3-byte sequence */
    s = half >= 0 ? tok_decode(t, &half, 1, false, &n) : NULL;
    CHECK(s && strcmp(s, "\xef\xbf\xbd") == 0, "lone lead byte decodes to U+FFFD");
    free(s);
    /* the stream holds the lead byte until the sequence completes */
    struct tok_stream st = {0};
    char buf[256];
    CHECK(half < 0 || tok_stream_push(t, &st, half, false, buf, sizeof buf) == 0, "held back");
    CHECK(tok_stream_flush(&st, buf, sizeof buf) == 3 && memcmp(buf, "\xef\xbf\xbd", 3) == 0, "flush repairs");
    tok_ids_free(&ids);
    tok_free(t);
}

/* A long run that pre-tokenizes to one piece (letters, CJK, spaces,
 * punctuation) is merged with O(log n) queue operations per merge: the work
 * counted stays a small multiple of the bytes (it grew as n^2 when every merge
 * rescanned the piece), and the ids decode back to the text. */
void test_tokenizer_long_runs(void)
{
    struct tokenizer *t = qwen3_tok();
    if (!t)
        return;
    const char *units[] = {"a", "\xe4\xb8\xad\xe6\x96\x87", " ", "!", "ab"};
    const size_t n = 200000;
    char *text = malloc(n + 8);
    for (int u = 0; u < 5; u++) {
        size_t ul = strlen(units[u]), len = 0;
        while (len + ul <= n) {
            memcpy(text + len, units[u], ul);
            len += ul;
        }
        struct tok_ids ids = {0};
        CHECK(tok_encode(t, text, len, &ids) == 0, "%s", err_msg());
        /* pairs queued: n - 1 at first and at most two per merge; each taken out once */
        CHECK(ids.work >= len / 2 && ids.work <= 6 * (uint64_t)len, "run of '%s': %llu queue operations for %zu bytes",
              units[u], (unsigned long long)ids.work, len);
        CHECK(ids.n > 0 && ids.n <= (int32_t)len / 2, "run of '%s': %d ids", units[u], ids.n);
        size_t dn;
        char *d = tok_decode(t, ids.ids, ids.n, false, &dn);
        CHECK(d && dn == len && memcmp(d, text, len) == 0, "run of '%s' round-trips", units[u]);
        free(d);
        tok_ids_free(&ids);
    }
    free(text);
    /* 12 MB of spaces then a word: the regex's match over the run needs more
     * than PCRE2's default 10 million steps, and a failed match must not be
     * taken for "no match" (the whole text merged as one piece) */
    const size_t big = 12000000;
    text = malloc(big + 1);
    memset(text, ' ', big);
    text[big] = 'x';
    struct tok_ids ids = {0};
    CHECK(tok_encode(t, text, big + 1, &ids) == 0, "%s", err_msg());
    CHECK(ids.n > 0 && ids.ids[ids.n - 1] == tok_find(t, "\xc4\xa0x"), "the run ends as ' x', not 'x'");
    tok_ids_free(&ids);
    free(text);
    tok_free(t);
}
