/* tokenizer: tokenizer.json loading, encode and decode (see tokenizer.h).
 * Reference: huggingface/tokenizers (AddedVocabulary, normalizers, pre_tokenizers
 * Split/ByteLevel/Digits/Sequence, models::bpe, decoders::ByteLevel). */
#define _GNU_SOURCE
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include "../base/err.h"
#include "../base/hmap.h"
#include "../base/utf8.h"

#include <assert.h>
#include <ctype.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TOK_MAX_PRE 8

enum split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum pre_kind { PRE_SPLIT, PRE_BYTELEVEL, PRE_DIGITS };

struct pre_tok {
    enum pre_kind kind;
    pcre2_code *re;                /* Split, or ByteLevel with use_regex */
    enum split_behavior behavior;
    bool invert;
    bool add_prefix_space;         /* ByteLevel */
    bool individual_digits;        /* Digits */
};

struct added_tok {
    char *content;
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word;
    bool normalized; /* matched in the normalised text, not the raw input */
};

struct tokenizer {
    int32_t n_vocab;               /* ids are [0, n_vocab) */
    char **piece;                  /* [n_vocab] vocabulary strings (NULL for gaps) */
    uint32_t *piece_len;           /* [n_vocab] */
    bool *special;                 /* [n_vocab] */
    bool *added;                   /* [n_vocab] an added token: decoded from its content */
    struct hmap vocab;             /* piece -> id */
    struct hmap merges;            /* (left << 32 | right) -> (rank << 32 | merged id) */
    int32_t byte_id[256];          /* id of each single byte's byte-level symbol */
    struct added_tok *adds;        /* [n_adds] by first byte, longest first */
    int32_t n_adds;
    int32_t add_first[257];        /* adds[add_first[c], add_first[c + 1]) start with byte c */
    bool nfc;
    bool byte_level;               /* ByteLevel pre-tokenizer present: BPE over byte symbols */
    struct pre_tok pre[TOK_MAX_PRE];
    int32_t n_pre;
    int16_t char_byte[324];        /* byte-level decoder: code point -> byte, -1 if none */
    char byte_char[256][3];        /* byte -> its code point in UTF-8 */
    uint8_t byte_char_len[256];
};

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256+k. */
static void byte_level_tables(struct tokenizer *t)
{
    int k = 0;
    for (int i = 0; i < 324; i++)
        t->char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + k++);
        t->byte_char_len[b] = (uint8_t)utf8_put(cp, t->byte_char[b]);
        t->char_byte[cp] = (int16_t)b;
    }
}

static pcre2_code *compile_re(const char *pat, const char *path)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        err_set("tokenizer: %s: regex /%s/ at offset %zu: %s", path, pat, (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return re;
}

/* Quotes a literal string for PCRE2: every ASCII character that is not a letter
 * or digit escaped (\Q...\E would end early at a "\E" inside the literal). */
static char *quote_re(const char *s)
{
    size_t n = strlen(s), k = 0;
    char *q = malloc(2 * n + 1);
    if (!q)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80 && !isalnum(c))
            q[k++] = '\\';
        q[k++] = (char)c;
    }
    q[k] = 0;
    return q;
}

static const char *GPT2_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pre(struct tokenizer *t, json_t *p, const char *path)
{
    if (!p || json_is_null(p))
        return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type)
        return err_set("tokenizer: %s: pre_tokenizer without a type", path);
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) if (load_pre(t, e, path) != 0) return -1;
        return 0;
    }
    if (t->n_pre == TOK_MAX_PRE)
        return err_set("tokenizer: %s: too many pre-tokenizers", path);
    struct pre_tok *pt = &t->pre[t->n_pre];
    memset(pt, 0, sizeof *pt);
    if (strcmp(type, "Split") == 0) {
        json_t *pat = json_object_get(p, "pattern");
        const char *rx = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1;
        for (int i = 0; beh && i < 5; i++)
            if (strcmp(beh, names[i]) == 0)
                b = i;
        if ((!rx && !lit) || b < 0)
            return err_set("tokenizer: %s: Split pre-tokenizer needs a pattern and a known behavior", path);
        char *q = lit ? quote_re(lit) : NULL;
        pt->re = compile_re(rx ? rx : q, path);
        free(q);
        if (!pt->re)
            return -1;
        pt->kind = PRE_SPLIT;
        pt->behavior = (enum split_behavior)b;
        pt->invert = json_is_true(json_object_get(p, "invert"));
    } else if (strcmp(type, "ByteLevel") == 0) {
        pt->kind = PRE_BYTELEVEL;
        pt->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *ur = json_object_get(p, "use_regex");
        if ((!ur || json_is_true(ur)) && !(pt->re = compile_re(GPT2_RE, path)))
            return -1;
        t->byte_level = true;
    } else if (strcmp(type, "Digits") == 0) {
        pt->kind = PRE_DIGITS;
        pt->individual_digits = json_is_true(json_object_get(p, "individual_digits"));
    } else {
        return err_set("tokenizer: %s: pre_tokenizer type '%s' is not supported", path, type);
    }
    t->n_pre++;
    return 0;
}

static int load_normalizer(struct tokenizer *t, json_t *n, const char *path)
{
    if (!n || json_is_null(n))
        return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(n, "normalizers"), i, e) if (load_normalizer(t, e, path) != 0) return -1;
        return 0;
    }
    if (type && strcmp(type, "NFC") == 0) {
        t->nfc = true;
        return 0;
    }
    return err_set("tokenizer: %s: normalizer '%s' is not supported", path, type ? type : "?");
}

static int cmp_added(const void *a, const void *b)
{
    const struct added_tok *x = a, *y = b;
    unsigned char cx = (unsigned char)x->content[0], cy = (unsigned char)y->content[0];
    if (cx != cy)
        return cx < cy ? -1 : 1;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

static int set_piece(struct tokenizer *t, int32_t id, const char *s, size_t len)
{
    if (t->piece[id])
        free(t->piece[id]);
    t->piece[id] = malloc(len + 1);
    if (!t->piece[id])
        return -1;
    memcpy(t->piece[id], s, len);
    t->piece[id][len] = 0;
    t->piece_len[id] = (uint32_t)len;
    return hmap_put_str(&t->vocab, s, len, (uint64_t)id);
}

static int load_model(struct tokenizer *t, json_t *root, const char *path)
{
    json_t *model = json_object_get(root, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") != 0)
        return err_set("tokenizer: %s: model type '%s' is not supported (BPE)", path, type ? type : "?");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *adds = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return err_set("tokenizer: %s: model needs a vocab object and a merges list", path);
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
            return err_set("tokenizer: %s: vocab entry '%s' has a bad id", path, key);
        if (json_integer_value(v) > max_id)
            max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(adds, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (!json_is_string(json_object_get(v, "content")) || id < 0 || id >= (1 << 24))
            return err_set("tokenizer: %s: added_tokens[%zu] needs a content and an id", path, i);
        if (id > max_id)
            max_id = id;
    }
    t->n_vocab = (int32_t)(max_id + 1);
    t->piece = calloc((size_t)t->n_vocab, sizeof *t->piece);
    t->piece_len = calloc((size_t)t->n_vocab, sizeof *t->piece_len);
    t->special = calloc((size_t)t->n_vocab, sizeof *t->special);
    t->added = calloc((size_t)t->n_vocab, sizeof *t->added);
    if (!t->piece || !t->piece_len || !t->special || !t->added ||
        hmap_init(&t->vocab, (size_t)t->n_vocab, 1) != 0 || hmap_init(&t->merges, json_array_size(merges), 0) != 0)
        return err_set("tokenizer: out of memory");
    json_object_foreach(vocab, key, v) if (set_piece(t, (int32_t)json_integer_value(v), key, strlen(key)) != 0) return err_set("tokenizer: out of memory");

    if (t->byte_level)
        for (int b = 0; b < 256; b++) {
            uint64_t id;
            if (!hmap_get_str(&t->vocab, t->byte_char[b], t->byte_char_len[b], &id))
                return err_set("tokenizer: %s: byte-level vocab lacks the symbol of byte 0x%02x", path, b);
            t->byte_id[b] = (int32_t)id;
        }

    json_array_foreach(merges, i, v) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        char *sp = NULL;
        if (json_is_string(v)) { /* "a b" */
            const char *s = json_string_value(v);
            sp = strchr(s, ' ');
            if (sp) {
                a = s;
                la = (size_t)(sp - s);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (json_is_array(v) && json_array_size(v) == 2) { /* ["a", "b"] */
            a = json_string_value(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            la = a ? strlen(a) : 0;
            lb = b ? strlen(b) : 0;
        }
        uint64_t ia, ib, im;
        char buf[1024];
        if (!a || !b || la + lb >= sizeof buf)
            return err_set("tokenizer: %s: merges[%zu] is malformed", path, i);
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        if (!hmap_get_str(&t->vocab, a, la, &ia) || !hmap_get_str(&t->vocab, b, lb, &ib) ||
            !hmap_get_str(&t->vocab, buf, la + lb, &im))
            return err_set("tokenizer: %s: merges[%zu] uses a token missing from the vocab", path, i);
        uint64_t k = ia << 32 | ib, old;
        if (!hmap_get_u64(&t->merges, k, &old) && hmap_put_u64(&t->merges, k, (uint64_t)i << 32 | im) != 0)
            return err_set("tokenizer: out of memory");
    }

    t->n_adds = (int32_t)json_array_size(adds);
    t->adds = calloc((size_t)t->n_adds + 1, sizeof *t->adds);
    if (!t->adds)
        return err_set("tokenizer: out of memory");
    json_array_foreach(adds, i, v) {
        struct added_tok *a = &t->adds[i];
        const char *c = json_string_value(json_object_get(v, "content"));
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->len = strlen(c);
        a->content = strdup(c);
        a->special = json_is_true(json_object_get(v, "special"));
        a->lstrip = json_is_true(json_object_get(v, "lstrip"));
        a->rstrip = json_is_true(json_object_get(v, "rstrip"));
        a->single_word = json_is_true(json_object_get(v, "single_word"));
        json_t *nz = json_object_get(v, "normalized");
        a->normalized = nz ? json_is_true(nz) : !a->special; /* the library's default */
        if (!a->content || a->len == 0 || set_piece(t, a->id, c, a->len) != 0)
            return err_set("tokenizer: %s: added_tokens[%zu] is empty or out of memory", path, i);
        t->special[a->id] = a->special;
        t->added[a->id] = true;
    }
    /* a text position is compared only with the tokens that start with its byte */
    qsort(t->adds, (size_t)t->n_adds, sizeof *t->adds, cmp_added);
    for (int c = 0, a = 0; c <= 256; c++) {
        while (a < t->n_adds && (unsigned char)t->adds[a].content[0] < c)
            a++;
        t->add_first[c] = a;
    }
    return 0;
}

struct tokenizer *tok_load_json(json_t *root, const char *what)
{
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        err_set("tokenizer: out of memory");
        return NULL;
    }
    byte_level_tables(t);
    if (load_normalizer(t, json_object_get(root, "normalizer"), what) != 0 ||
        load_pre(t, json_object_get(root, "pre_tokenizer"), what) != 0)
        goto fail;
    json_t *dec = json_object_get(root, "decoder");
    const char *dt = json_string_value(json_object_get(dec, "type"));
    if (!dt || strcmp(dt, "ByteLevel") != 0) {
        err_set("tokenizer: %s: decoder '%s' is not supported (ByteLevel)", what, dt ? dt : "none");
        goto fail;
    }
    if (!t->byte_level) {
        err_set("tokenizer: %s: only byte-level BPE is supported (no ByteLevel pre-tokenizer)", what);
        goto fail;
    }
    if (load_model(t, root, what) != 0)
        goto fail;
    return t;
fail:
    tok_free(t);
    return NULL;
}

struct tokenizer *tok_load_file(const char *path)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        err_set("tokenizer: %s: %s (line %d)", path, je.text, je.line);
        return NULL;
    }
    struct tokenizer *t = tok_load_json(root, path);
    json_decref(root);
    return t;
}

struct tokenizer *tok_load(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return tok_load_file(path);
}

void tok_free(struct tokenizer *t)
{
    if (!t)
        return;
    for (int32_t i = 0; t->piece && i < t->n_vocab; i++)
        free(t->piece[i]);
    for (int32_t i = 0; t->adds && i < t->n_adds; i++)
        free(t->adds[i].content);
    for (int32_t i = 0; i < t->n_pre; i++)
        pcre2_code_free(t->pre[i].re);
    free(t->piece);
    free(t->piece_len);
    free(t->special);
    free(t->added);
    free(t->adds);
    hmap_free(&t->vocab);
    hmap_free(&t->merges);
    free(t);
}

int32_t tok_n_vocab(const struct tokenizer *t) { return t->n_vocab; }

const char *tok_piece(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->piece[id] : NULL;
}

int32_t tok_find(const struct tokenizer *t, const char *piece)
{
    uint64_t id;
    return hmap_get_str(&t->vocab, piece, strlen(piece), &id) ? (int32_t)id : -1;
}

bool tok_is_special(const struct tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->special[id]; }

int tok_vocab_bytes(const struct tokenizer *t, int32_t n_vocab, struct vocab_bytes *vb)
{
    assert(n_vocab > 0);
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        const char *p = tok_piece(t, i);
        total += p ? strlen(p) : 0;
    }
    *vb = (struct vocab_bytes){0};
    vb->n_vocab = n_vocab;
    vb->data = malloc(total + 1);
    vb->off = malloc(sizeof(uint32_t) * ((size_t)n_vocab + 1));
    vb->special = calloc((size_t)n_vocab, 1);
    if (!vb->data || !vb->off || !vb->special)
        return err_set("tokenizer: out of memory");
    uint32_t o = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        vb->off[i] = o;
        const char *p = tok_piece(t, i);
        const int32_t n = p ? tok_bytes(t, i, vb->data + o, total + 1 - o) : 0;
        vb->special[i] = !p || tok_is_special(t, i);
        o += n > 0 ? (uint32_t)n : 0;
    }
    vb->off[n_vocab] = o;
    return 0;
}

/* ---- encode ---- */

static int ids_push(struct tok_ids *o, int32_t id)
{
    if (o->n == o->cap) {
        int32_t nc = o->cap ? o->cap * 2 : 256;
        int32_t *n = realloc(o->ids, (size_t)nc * sizeof *n);
        if (!n)
            return err_set("tokenizer: out of memory");
        o->ids = n;
        o->cap = nc;
    }
    o->ids[o->n++] = id;
    return 0;
}

void tok_ids_free(struct tok_ids *ids)
{
    free(ids->ids);
    memset(ids, 0, sizeof *ids);
}

/* One symbol of a piece being merged: its token and its neighbours in the
 * list of symbols still standing (-1 at either end; id -1 once merged away). */
struct bpe_sym {
    int32_t id, prev, next;
};

/* The merge queue: a 4-ary min-heap (half the depth of a binary one, a node's
 * children side by side: fewer cache misses on a long piece) of candidate
 * pairs keyed rank << 32 | the left symbol's position, so the lowest rank
 * comes first and the leftmost on ties, the order in which the reference merges. */
static void heap_sift_down(uint64_t *h, size_t n, size_t i)
{
    uint64_t x = h[i];
    for (;;) {
        size_t c = 4 * i + 1, m = c;
        if (c >= n)
            break;
        for (size_t k = c + 1; k < c + 4 && k < n; k++)
            if (h[k] < h[m])
                m = k;
        if (h[m] >= x)
            break;
        h[i] = h[m];
        i = m;
    }
    h[i] = x;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t key)
{
    size_t i = (*n)++;
    while (i > 0 && key < h[(i - 1) / 4]) {
        h[i] = h[(i - 1) / 4];
        i = (i - 1) / 4;
    }
    h[i] = key;
}

/* The rank of merging a and b, with the merged id in *id; UINT32_MAX if none. */
static uint32_t merge_rank(const struct tokenizer *t, int32_t a, int32_t b, int32_t *id)
{
    uint64_t v;
    if (!hmap_get_u64(&t->merges, (uint64_t)a << 32 | (uint32_t)b, &v))
        return UINT32_MAX;
    *id = (int32_t)(v & 0xffffffffu);
    return (uint32_t)(v >> 32);
}

/* BPE over one pre-token: byte symbols, merged lowest rank first (leftmost on
 * ties). A candidate is checked when it leaves the queue (its left symbol still
 * stands and the pair there still has its rank: a rank names one pair), so a
 * merge costs O(log n) and a piece O(n log n). */
static int bpe_piece(const struct tokenizer *t, const char *s, size_t n, struct tok_ids *out)
{
    uint64_t whole;
    /* fast path: the piece is one vocabulary entry in byte-level form */
    char small[256];
    size_t m = 0;
    for (size_t i = 0; i < n && m + 2 < sizeof small; i++) {
        memcpy(small + m, t->byte_char[(unsigned char)s[i]], t->byte_char_len[(unsigned char)s[i]]);
        m += t->byte_char_len[(unsigned char)s[i]];
        if (i + 1 == n && hmap_get_str(&t->vocab, small, m, &whole))
            return ids_push(out, (int32_t)whole);
    }
    if (n > INT32_MAX)
        return err_set("tokenizer: a pre-tokenized piece of %zu bytes is too long", n);
    /* the queue starts with at most n - 1 pairs, and each merge takes one out
     * and puts at most two in: never more than 2n entries */
    struct bpe_sym stack_sym[64];
    uint64_t stack_heap[128];
    struct bpe_sym *sym = n <= 64 ? stack_sym : malloc(n * sizeof *sym);
    uint64_t *heap = n <= 64 ? stack_heap : malloc(2 * n * sizeof *heap);
    int rc = -1;
    if (!sym || !heap) {
        err_set("tokenizer: out of memory");
        goto done;
    }
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = (struct bpe_sym){t->byte_id[(unsigned char)s[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
        int32_t id;
        uint32_t r = i > 0 ? merge_rank(t, sym[i - 1].id, sym[i].id, &id) : UINT32_MAX;
        if (r != UINT32_MAX)
            heap[nh++] = (uint64_t)r << 32 | (i - 1);
    }
    for (size_t i = nh / 4 + 1; i-- > 0;)
        heap_sift_down(heap, nh, i);
    out->work += nh;
    while (nh > 0) {
        uint64_t key = heap[0];
        heap[0] = heap[--nh];
        heap_sift_down(heap, nh, 0);
        out->work++;
        uint32_t rank = (uint32_t)(key >> 32), pos = (uint32_t)key;
        int32_t nx = sym[pos].next, id = 0;
        if (sym[pos].id < 0 || nx < 0 || merge_rank(t, sym[pos].id, sym[nx].id, &id) != rank)
            continue; /* stale: a neighbour merged since it was queued */
        sym[pos].id = id;
        sym[nx].id = -1;
        sym[pos].next = sym[nx].next;
        if (sym[nx].next >= 0)
            sym[sym[nx].next].prev = (int32_t)pos;
        int32_t pv = sym[pos].prev, mid;
        uint32_t r;
        if (pv >= 0 && (r = merge_rank(t, sym[pv].id, id, &mid)) != UINT32_MAX) {
            heap_push(heap, &nh, (uint64_t)r << 32 | (uint32_t)pv);
            out->work++;
        }
        if (sym[pos].next >= 0 && (r = merge_rank(t, id, sym[sym[pos].next].id, &mid)) != UINT32_MAX) {
            heap_push(heap, &nh, (uint64_t)r << 32 | pos);
            out->work++;
        }
    }
    rc = 0;
    for (int32_t i = 0; i >= 0 && rc == 0; i = sym[i].next)
        rc = ids_push(out, sym[i].id);
done:
    if (sym != stack_sym)
        free(sym);
    if (heap != stack_heap)
        free(heap);
    return rc;
}

struct span {
    size_t b, e;
};

struct spans {
    struct span *v;
    size_t n, cap;
};

static int spans_push(struct spans *s, size_t b, size_t e)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        struct span *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv)
            return err_set("tokenizer: out of memory");
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = (struct span){b, e};
    return 0;
}

/* Splits [b, e) of text by one pre-tokenizer into out. */
static int pre_split(const struct pre_tok *p, const char *text, size_t b, size_t e, pcre2_match_data *md,
                     pcre2_match_context *mc, struct spans *out)
{
    if (p->kind == PRE_DIGITS) {
        size_t i = b;
        while (i < e) {
            size_t j = i + 1;
            int dig = text[i] >= '0' && text[i] <= '9';
            if (!(dig && p->individual_digits))
                while (j < e && ((text[j] >= '0' && text[j] <= '9') == dig))
                    j++;
            if (spans_push(out, i, j) != 0)
                return -1;
            i = j;
        }
        return 0;
    }
    if (!p->re)
        return spans_push(out, b, e);
    /* matches and the gaps between them, each tagged */
    enum split_behavior beh = p->kind == PRE_BYTELEVEL ? SPLIT_ISOLATED : p->behavior;
    size_t pos = b, first = out->n;
    size_t pend_b = 0, pend_e = 0;
    int have_pend = 0, pend_match = 0;
#define EMIT(bb, ee, is_match)                                                                                  \
    do {                                                                                                        \
        int m_ = (is_match) != p->invert;                                                                        \
        if ((ee) > (bb)) {                                                                                       \
            if (beh == SPLIT_REMOVED) {                                                                          \
                if (!m_ && spans_push(out, bb, ee) != 0)                                                         \
                    return -1;                                                                                   \
            } else if (beh == SPLIT_ISOLATED) {                                                                  \
                if (spans_push(out, bb, ee) != 0)                                                                \
                    return -1;                                                                                   \
            } else if (beh == SPLIT_MERGED_PREV) {                                                               \
                if (m_ && out->n > first)                                                                        \
                    out->v[out->n - 1].e = (ee);                                                                 \
                else if (spans_push(out, bb, ee) != 0)                                                           \
                    return -1;                                                                                   \
            } else if (beh == SPLIT_MERGED_NEXT) {                                                               \
                if (have_pend) {                                                                                 \
                    if (spans_push(out, pend_b, pend_match ? (ee) : pend_e) != 0)                                 \
                        return -1;                                                                               \
                    if (!pend_match) {                                                                           \
                        pend_b = (bb), pend_e = (ee), pend_match = m_;                                           \
                    } else                                                                                       \
                        have_pend = 0;                                                                           \
                } else {                                                                                         \
                    pend_b = (bb), pend_e = (ee), pend_match = m_, have_pend = 1;                                \
                }                                                                                                \
            } else { /* contiguous */                                                                            \
                if (m_ && pend_match && out->n > first && out->v[out->n - 1].e == (bb))                          \
                    out->v[out->n - 1].e = (ee);                                                                 \
                else if (spans_push(out, bb, ee) != 0)                                                           \
                    return -1;                                                                                   \
                pend_match = m_;                                                                                 \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)
    /* a whitespace run is scanned to its end by \s*[\r\n]+ before \s+(?!\S)
     * takes it, so a match may cost steps in proportion to the span: PCRE2's
     * default limit (10 million) would fail a long run, which is not "no match" */
    pcre2_set_match_limit(mc, (uint32_t)(e - b < 500000000 ? 10000000 + 8 * (e - b) : UINT32_MAX));
    while (pos < e) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)text, e, pos, PCRE2_NO_UTF_CHECK, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set("tokenizer: pre-tokenizer regex failed at byte %zu: %s", pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t mb = ov[0], me = ov[1];
        if (me == mb) { /* empty match: step one character */
            size_t step = 1;
            while (mb + step < e && ((unsigned char)text[mb + step] & 0xc0) == 0x80)
                step++;
            EMIT(pos, mb + step, 0);
            pos = mb + step;
            continue;
        }
        EMIT(pos, mb, 0);
        EMIT(mb, me, 1);
        pos = me;
    }
    EMIT(pos, e, 0);
    if (beh == SPLIT_MERGED_NEXT && have_pend && spans_push(out, pend_b, pend_e) != 0)
        return -1;
#undef EMIT
    return 0;
}

/* ByteLevel's add_prefix_space: every piece that does not start with a space
 * gets one. Rebuilds the text into *spaced (which replaces *s) and moves the spans. */
static int prefix_spaces(const char **s, size_t *len, struct spans *cur, char **spaced)
{
    char *o = malloc(*len + cur->n + 1);
    if (!o)
        return err_set("tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < cur->n; i++) {
        size_t b = cur->v[i].b, e = cur->v[i].e, nb = k;
        if (e > b && (*s)[b] != ' ')
            o[k++] = ' ';
        memcpy(o + k, *s + b, e - b);
        k += e - b;
        cur->v[i] = (struct span){nb, k};
    }
    free(*spaced);
    *spaced = o;
    *s = o;
    *len = k;
    return 0;
}

/* Pre-tokenises and BPE-encodes normalised text that holds no added token. */
static int encode_pieces(const struct tokenizer *t, const char *text, size_t len, struct tok_ids *out)
{
    if (len == 0)
        return 0;
    char *spaced = NULL;
    const char *s = text;
    int rc = -1;
    struct spans cur = {0}, next = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    if (!md || !mc) {
        err_set("tokenizer: out of memory");
        goto done;
    }
    if (spans_push(&cur, 0, len) != 0)
        goto done;
    for (int32_t p = 0; p < t->n_pre; p++) {
        if (t->pre[p].kind == PRE_BYTELEVEL && t->pre[p].add_prefix_space && prefix_spaces(&s, &len, &cur, &spaced) != 0)
            goto done;
        if (t->pre[p].kind == PRE_BYTELEVEL && !t->pre[p].re)
            continue;
        next.n = 0;
        for (size_t i = 0; i < cur.n; i++)
            if (pre_split(&t->pre[p], s, cur.v[i].b, cur.v[i].e, md, mc, &next) != 0)
                goto done;
        struct spans tmp = cur;
        cur = next;
        next = tmp;
    }
    for (size_t i = 0; i < cur.n; i++)
        if (cur.v[i].e > cur.v[i].b && bpe_piece(t, s + cur.v[i].b, cur.v[i].e - cur.v[i].b, out) != 0)
            goto done;
    rc = 0;
done:
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    free(cur.v);
    free(next.v);
    free(spaced);
    return rc;
}

static bool is_word_char(const char *s, size_t n, size_t at, int before)
{
    /* the character just before (or at) `at` is alphanumeric or '_' */
    size_t i = at;
    if (before) {
        if (at == 0)
            return false;
        i = at - 1;
        while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
            i--;
    } else if (at >= n) {
        return false;
    }
    size_t bad;
    uint32_t cp;
    if (!utf8_seq((const unsigned char *)s + i, n - i, &bad, &cp))
        return false;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static bool is_space_at(const char *s, size_t n, size_t i, size_t *len)
{
    size_t bad;
    uint32_t cp;
    size_t l = i < n ? utf8_seq((const unsigned char *)s + i, n - i, &bad, &cp) : 0;
    if (!l)
        return false;
    *len = l;
    return cp == ' ' || (cp >= 9 && cp <= 13) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

typedef int (*segment_fn)(const struct tokenizer *t, const char *s, size_t n, struct tok_ids *out);

/* Finds the added tokens whose `normalized` flag is `pass` in text (leftmost-longest,
 * with lstrip/rstrip/single_word), emits their ids, and hands the text between them
 * to fn. */
static int split_added(const struct tokenizer *t, const char *text, size_t len, bool pass, segment_fn fn,
                       struct tok_ids *out)
{
    size_t start = 0, i = 0;
    while (i < len) {
        /* the tokens that start with this byte, longest first */
        const struct added_tok *hit = NULL;
        unsigned char c0 = (unsigned char)text[i];
        for (int32_t a = t->add_first[c0]; a < t->add_first[c0 + 1] && !hit; a++) {
            const struct added_tok *c = &t->adds[a];
            if (c->normalized == pass && c->len <= len - i && memcmp(text + i, c->content, c->len) == 0 &&
                (!c->single_word || (!is_word_char(text, len, i, 1) && !is_word_char(text, len, i + c->len, 0))))
                hit = c;
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t mb = i, me = i + hit->len, sl;
        if (hit->lstrip) /* the token swallows the whitespace before it */
            while (mb > start) {
                size_t k = mb - 1;
                while (k > start && ((unsigned char)text[k] & 0xc0) == 0x80)
                    k--;
                if (!is_space_at(text, len, k, &sl))
                    break;
                mb = k;
            }
        if (hit->rstrip)
            while (is_space_at(text, len, me, &sl))
                me += sl;
        if (fn(t, text + start, mb - start, out) != 0 || ids_push(out, hit->id) != 0)
            return -1;
        start = i = me;
    }
    return fn(t, text + start, len - start, out);
}

/* Text between raw-matched added tokens: normalised, then split by the
 * normalised-matched ones, then pre-tokenised and merged. */
static int encode_segment(const struct tokenizer *t, const char *text, size_t len, struct tok_ids *out)
{
    if (len == 0)
        return 0;
    /* ASCII text is its own NFC form (no character there decomposes or combines) */
    size_t ascii = 0;
    while (ascii < len && (unsigned char)text[ascii] < 0x80)
        ascii++;
    if (!t->nfc || ascii == len)
        return split_added(t, text, len, true, encode_pieces, out);
    /* with an explicit length utf8proc keeps NUL characters (NFC() would stop at one) */
    utf8proc_uint8_t *z = NULL;
    utf8proc_ssize_t zn = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &z,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (zn < 0)
        return err_set("tokenizer: NFC normalisation failed: %s", utf8proc_errmsg(zn));
    int rc = split_added(t, (const char *)z, (size_t)zn, true, encode_pieces, out);
    free(z);
    return rc;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, struct tok_ids *out)
{
    size_t bad_at = utf8_valid_prefix(text, len);
    if (bad_at < len)
        return err_set("tokenizer: input is not valid UTF-8 (byte %zu)", bad_at);
    return split_added(t, text, len, false, encode_segment, out);
}

/* ---- decode ---- */

/* Appends the bytes of one token: ByteLevel-decoded when every character maps
 * to a byte, else its raw string (as the reference decoder does). */
static size_t token_bytes(const struct tokenizer *t, int32_t id, char *dst)
{
    const char *p = t->piece[id];
    size_t n = t->piece_len[id], o = 0, i = 0, bad;
    uint32_t cp;
    while (i < n) {
        size_t l = utf8_seq((const unsigned char *)p + i, n - i, &bad, &cp);
        if (!l || cp >= 324 || t->char_byte[cp] < 0) {
            memcpy(dst, p, n);
            return n;
        }
        dst[o++] = (char)t->char_byte[cp];
        i += l;
    }
    return o;
}

int32_t tok_bytes(const struct tokenizer *t, int32_t id, char *dst, size_t cap)
{
    if (id < 0 || id >= t->n_vocab || !t->piece[id] || t->piece_len[id] > cap)
        return -1;
    return (int32_t)token_bytes(t, id, dst);
}

char *tok_decode(const struct tokenizer *t, const int32_t *ids, int32_t n, bool skip_special, size_t *len)
{
    size_t raw_n = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab || !t->piece[ids[i]]) {
            err_set("tokenizer: id %d is not in the vocabulary", ids[i]);
            return NULL;
        }
        raw_n += t->piece_len[ids[i]];
    }
    char *raw = malloc(raw_n + 1), *out = malloc(raw_n * 3 + 1);
    if (!raw || !out) {
        free(raw);
        free(out);
        err_set("tokenizer: out of memory");
        return NULL;
    }
    size_t r = 0;
    for (int32_t i = 0; i < n; i++)
        if (!(skip_special && t->special[ids[i]]))
            r += token_bytes(t, ids[i], raw + r);
    size_t o = utf8_lossy(raw, r, out);
    out[o] = 0;
    free(raw);
    if (len)
        *len = o;
    return out;
}

int32_t tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int32_t id, bool skip_special, char *out,
                        size_t cap)
{
    if (id < 0 || id >= t->n_vocab || !t->piece[id])
        return err_set("tokenizer: id %d is not in the vocabulary", id);
    if (skip_special && t->special[id])
        return 0;
    size_t n = t->piece_len[id] + (size_t)s->n_pending;
    char stackbuf[1024];
    char *raw = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!raw)
        return err_set("tokenizer: out of memory");
    memcpy(raw, s->pending, (size_t)s->n_pending);
    size_t r = (size_t)s->n_pending + token_bytes(t, id, raw + s->n_pending);
    size_t hold = utf8_incomplete_tail(raw, r);
    int32_t rc;
    if ((r - hold) * 3 > cap) {
        rc = err_set("tokenizer: stream output buffer too small");
    } else {
        rc = (int32_t)utf8_lossy(raw, r - hold, out);
        memcpy(s->pending, raw + r - hold, hold);
        s->n_pending = (int32_t)hold;
    }
    if (raw != stackbuf)
        free(raw);
    return rc;
}

int32_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap)
{
    if ((size_t)s->n_pending * 3 > cap)
        return err_set("tokenizer: stream output buffer too small");
    int32_t n = (int32_t)utf8_lossy(s->pending, (size_t)s->n_pending, out);
    s->n_pending = 0;
    return n;
}
