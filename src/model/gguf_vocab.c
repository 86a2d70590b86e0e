/* gguf_vocab: tokenizer.json and tokenizer_config.json rebuilt from a GGUF
 * file's metadata (see gguf_vocab.h).
 * References: llama.cpp's convert_hf_to_gguf.py (get_vocab_base: token types;
 * get_vocab_base_pre: the pre-tokenizer names), gguf-py's SpecialVocab (merges,
 * special token ids) and src/llama-vocab.cpp (the names each model family
 * gets, and the regexes it quotes from the models' tokenizer.json). */
#include "gguf_vocab.h"

#include "../base/err.h"
#include "../base/utf8.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* llama.cpp's token types, numbered as in the file. */
enum { TT_NORMAL = 1, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE };

/* The tokenizer takes ids below 2^24. */
#define VOCAB_MAX_TOKENS (1 << 24)

/* The Split regexes as the models' tokenizer.json files have them. */
static const char QWEN2_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                               " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_RE[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}|"
                                " ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char TEKKEN_RE[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* tokenizer.ggml.pre names (convert_hf_to_gguf.py gives them by the hash of a
 * test encoding) and the Hugging Face pipeline each stands for. Nemotron-H's
 * tokenizer is Mistral's tekken one and hashes as pixtral's. */
static const struct {
    const char *name;
    const char *regex;
    bool nfc;
} PRE[] = {
    {"qwen2", QWEN2_RE, true},
    {"qwen35", QWEN35_RE, true},
    {"pixtral", TEKKEN_RE, false},
    {"tekken", TEKKEN_RE, false},
};

/* Quoting a file's string in a message: at most 64 bytes of it. */
#define QUOTE_LEN(n) ((int)((n) < 64 ? (n) : 64))

/* 0 when s is UTF-8 without NUL bytes (what JSON strings and the tokenizer's C
 * strings hold); -1 with a message naming key[i] otherwise. */
static int text_check(const char *path, const char *key, uint64_t i, struct gguf_str s)
{
    if ((s.n && memchr(s.p, 0, s.n)) || utf8_valid_prefix(s.p, s.n) < s.n)
        return err_set("gguf: %s: %s[%llu] is not UTF-8 text without NUL bytes", path, key, (unsigned long long)i);
    return 0;
}

/* key's array of elem; NULL with a message when it is absent or not that. */
static const struct gguf_kv *need_arr(const struct gguf *g, const char *key, enum gguf_type elem)
{
    const struct gguf_kv *kv = NULL;
    int rc = gguf_get_arr(g, key, elem, &kv);
    if (rc > 0)
        err_set("gguf: %s: %s is missing", g->files[0].path, key);
    return rc == 0 ? kv : NULL;
}

/* key's string; NULL with a message when it is absent or not a string. */
static const char *need_str(const struct gguf *g, const char *key, size_t *n)
{
    const char *s = NULL;
    int rc = gguf_get_str(g, key, &s, n);
    if (rc > 0)
        err_set("gguf: %s: %s is missing", g->files[0].path, key);
    return rc == 0 ? s : NULL;
}

static json_t *byte_level(void)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                     "use_regex", 0);
}

static json_t *pre_tokenizer(const char *regex)
{
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Split",
                     "pattern", "Regex", regex, "behavior", "Isolated", "invert", 0, byte_level());
}

/* Normal and byte tokens into vocab, control, unknown and user-defined ones
 * into added; unused ones skipped. */
static int add_tokens(const char *path, const struct gguf_kv *tokens, const struct gguf_kv *types, json_t *vocab,
                      json_t *added)
{
    for (uint64_t i = 0; i < tokens->n; i++) {
        struct gguf_str t = tokens->strs[i];
        int32_t type;
        memcpy(&type, (const char *)types->arr + 4 * i, sizeof type);
        if (type < TT_NORMAL || type > TT_BYTE)
            return err_set("gguf: %s: tokenizer.ggml.token_type[%llu] is %d, not a token type (1..6)", path,
                           (unsigned long long)i, type);
        if (type == TT_UNUSED)
            continue;
        if (text_check(path, "tokenizer.ggml.tokens", i, t) != 0)
            return -1;
        if (type == TT_NORMAL || type == TT_BYTE) {
            /* a string twice: the later id wins, as in llama.cpp's token_to_id */
            if (json_object_setn_new_nocheck(vocab, t.p, t.n, json_integer((json_int_t)i)) != 0)
                return err_set("gguf: out of memory");
            continue;
        }
        if (t.n == 0)
            return err_set("gguf: %s: tokenizer.ggml.tokens[%llu] is empty but typed %d (an added token)", path,
                           (unsigned long long)i, type);
        /* matched in the raw text (normalized false), as llama.cpp matches
         * them and as Qwen's tokenizer.json has them */
        json_t *a = json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content", t.p,
                              (size_t)t.n, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                              type != TT_USER_DEFINED);
        if (json_array_append_new(added, a) != 0)
            return err_set("gguf: out of memory");
    }
    return 0;
}

/* Each "a b" merge as the pair ["a", "b"], both halves and their join
 * checked against the vocab. */
static int add_merges(const char *path, const struct gguf_kv *merges, json_t *vocab, json_t *list)
{
    char *join = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < merges->n; i++) {
        struct gguf_str m = merges->strs[i];
        if (text_check(path, "tokenizer.ggml.merges", i, m) != 0)
            goto fail;
        /* split at the first space after the first byte, as llama.cpp does */
        const char *sp = m.n > 1 ? memchr(m.p + 1, ' ', m.n - 1) : NULL;
        if (!sp) {
            err_set("gguf: %s: tokenizer.ggml.merges[%llu] '%.*s' is not two tokens 'a b'", path,
                    (unsigned long long)i, QUOTE_LEN(m.n), m.p);
            goto fail;
        }
        size_t la = (size_t)(sp - m.p), lb = m.n - la - 1;
        if (la + lb > cap) {
            char *nj = realloc(join, la + lb);
            if (!nj) {
                err_set("gguf: out of memory");
                goto fail;
            }
            join = nj;
            cap = la + lb;
        }
        memcpy(join, m.p, la);
        memcpy(join + la, sp + 1, lb);
        if (!json_object_getn(vocab, m.p, la) || !json_object_getn(vocab, sp + 1, lb) ||
            !json_object_getn(vocab, join, la + lb)) {
            err_set("gguf: %s: tokenizer.ggml.merges[%llu] '%.*s' uses a token missing from tokenizer.ggml.tokens",
                    path, (unsigned long long)i, QUOTE_LEN(m.n), m.p);
            goto fail;
        }
        if (json_array_append_new(list, json_pack("[s%, s%]", m.p, la, sp + 1, lb)) != 0) {
            err_set("gguf: out of memory");
            goto fail;
        }
    }
    free(join);
    return 0;
fail:
    free(join);
    return -1;
}

json_t *gguf_vocab_tokenizer_json(const struct gguf *g)
{
    const char *path = g->files[0].path;
    size_t n;
    const char *s = need_str(g, "tokenizer.ggml.model", &n);
    if (!s)
        return NULL;
    if (n != 4 || memcmp(s, "gpt2", 4) != 0) {
        err_set("gguf: %s: tokenizer.ggml.model '%.*s' is not supported (gpt2: byte-level BPE)", path, QUOTE_LEN(n), s);
        return NULL;
    }
    if (!(s = need_str(g, "tokenizer.ggml.pre", &n)))
        return NULL;
    int pre = -1;
    for (int k = 0; k < (int)(sizeof PRE / sizeof PRE[0]); k++)
        if (strlen(PRE[k].name) == n && memcmp(PRE[k].name, s, n) == 0)
            pre = k;
    if (pre < 0) {
        err_set("gguf: %s: tokenizer.ggml.pre '%.*s' is not supported", path, QUOTE_LEN(n), s);
        return NULL;
    }
    const struct gguf_kv *tokens = need_arr(g, "tokenizer.ggml.tokens", GGUF_STRING);
    const struct gguf_kv *types = tokens ? need_arr(g, "tokenizer.ggml.token_type", GGUF_I32) : NULL;
    const struct gguf_kv *merges = types ? need_arr(g, "tokenizer.ggml.merges", GGUF_STRING) : NULL;
    if (!merges)
        return NULL;
    if (tokens->n == 0 || tokens->n > VOCAB_MAX_TOKENS) {
        err_set("gguf: %s: tokenizer.ggml.tokens has %llu tokens (1..%d)", path, (unsigned long long)tokens->n,
                VOCAB_MAX_TOKENS);
        return NULL;
    }
    if (types->n != tokens->n) {
        err_set("gguf: %s: tokenizer.ggml.token_type has %llu entries for %llu tokens", path,
                (unsigned long long)types->n, (unsigned long long)tokens->n);
        return NULL;
    }

    json_t *root = json_object(), *model = json_object();
    json_t *vocab = json_object(), *list = json_array(), *added = json_array();
    /* set_new takes its value whether it fails or not: one check after all */
    int bad = json_object_set_new(model, "type", json_string("BPE"));
    bad |= json_object_set_new(model, "vocab", vocab);
    bad |= json_object_set_new(model, "merges", list);
    bad |= json_object_set_new(root, "model", model);
    bad |= json_object_set_new(root, "added_tokens", added);
    bad |= json_object_set_new(root, "normalizer", PRE[pre].nfc ? json_pack("{s:s}", "type", "NFC") : json_null());
    bad |= json_object_set_new(root, "pre_tokenizer", pre_tokenizer(PRE[pre].regex));
    bad |= json_object_set_new(root, "decoder", byte_level());
    if (bad) {
        err_set("gguf: out of memory");
        goto fail;
    }
    if (add_tokens(path, tokens, types, vocab, added) != 0 || add_merges(path, merges, vocab, list) != 0)
        goto fail;
    return root;
fail:
    json_decref(root);
    return NULL;
}

json_t *gguf_vocab_tokenizer_config(const struct gguf *g)
{
    /* the names tokenizer_config.json gives them; the keys as gguf-py writes them */
    static const struct {
        const char *name, *key;
    } IDS[] = {
        {"bos_token", "tokenizer.ggml.bos_token_id"},     {"eos_token", "tokenizer.ggml.eos_token_id"},
        {"unk_token", "tokenizer.ggml.unknown_token_id"}, {"pad_token", "tokenizer.ggml.padding_token_id"},
        {"sep_token", "tokenizer.ggml.seperator_token_id"}, /* sic */
        {"cls_token", "tokenizer.ggml.cls_token_id"},     {"mask_token", "tokenizer.ggml.mask_token_id"},
    };
    const char *path = g->files[0].path;
    json_t *cfg = json_object();
    if (!cfg) {
        err_set("gguf: out of memory");
        return NULL;
    }
    const char *s;
    size_t n;
    int rc = gguf_get_str(g, "tokenizer.chat_template", &s, &n);
    if (rc < 0)
        goto fail;
    if (rc == 0) {
        struct gguf_str t = {s, n};
        if (text_check(path, "tokenizer.chat_template", 0, t) != 0)
            goto fail;
        if (json_object_set_new(cfg, "chat_template", json_stringn_nocheck(s, n)) != 0) {
            err_set("gguf: out of memory");
            goto fail;
        }
    }
    const struct gguf_kv *tokens = NULL;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &tokens) < 0)
        goto fail;
    for (size_t k = 0; k < sizeof IDS / sizeof IDS[0]; k++) {
        uint32_t id;
        rc = gguf_get_u32(g, IDS[k].key, &id);
        if (rc < 0)
            goto fail;
        if (rc > 0)
            continue;
        if (!tokens || id >= tokens->n) {
            err_set("gguf: %s: %s = %u is not the id of a token in tokenizer.ggml.tokens (%llu)", path, IDS[k].key, id,
                    (unsigned long long)(tokens ? tokens->n : 0));
            goto fail;
        }
        if (text_check(path, "tokenizer.ggml.tokens", id, tokens->strs[id]) != 0)
            goto fail;
        if (json_object_set_new(cfg, IDS[k].name, json_stringn_nocheck(tokens->strs[id].p, tokens->strs[id].n)) != 0) {
            err_set("gguf: out of memory");
            goto fail;
        }
    }
    return cfg;
fail:
    json_decref(cfg);
    return NULL;
}
