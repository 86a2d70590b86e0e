#define _GNU_SOURCE
/* Tests of gguf_vocab: the real Qwen3 tokenizer written into a GGUF as
 * llama.cpp's convert_hf_to_gguf.py writes it, read back as tokenizer.json and
 * tokenizer_config.json objects, must tokenize the tokenizer goldens and
 * corpus to the reference ids and render the chat goldens byte-identically;
 * small hand-made files with broken metadata must end in errors naming the key. */
#include "../../src/base/err.h"
#include "../../src/chat/template.h"
#include "../../src/model/gguf.h"
#include "../../src/model/gguf_vocab.h"
#include "../../src/tokenizer/tokenizer.h"
#include "test.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* config.json's vocab_size of the Qwen3 models: the converter pads the token
 * list to it with unused [PADn] tokens. */
#define QWEN3_VOCAB_SIZE 151936

static const char *qwen3_dir(void)
{
    const char *d = getenv("KAPITSA_TOKENIZER");
    return d && *d ? d : "models/qwen3-tokenizer";
}

static json_t *load(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j)
        fprintf(stderr, "  %s: %s\n", path, je.text);
    return j;
}

/* convert_hf_to_gguf.py's does_token_look_special, for the Qwen3 tokens. */
static bool looks_special(const char *s)
{
    size_t n = strlen(s);
    return n >= 4 && strncmp(s, "<|", 2) == 0 && strcmp(s + n - 2, "|>") == 0;
}

/* Writes PATH as convert_hf_to_gguf.py's _set_vocab_gpt2 would for the Qwen3
 * tokenizer folder: tokens in id order (added ones CONTROL if special or
 * looking special, else USER_DEFINED; [PADn] UNUSED up to the vocab size),
 * merges as "a b", pre "qwen2", special ids (bos from config.json's
 * bos_token_id) and the chat template. */
static int write_qwen3_gguf(const char *path, json_t *tj, json_t *cfg)
{
    char **tok = calloc(QWEN3_VOCAB_SIZE, sizeof *tok);
    int32_t *type = calloc(QWEN3_VOCAB_SIZE, sizeof *type);
    json_t *merges = json_object_get(json_object_get(tj, "model"), "merges");
    size_t n_merges = json_array_size(merges);
    char **mrg = calloc(n_merges + 1, sizeof *mrg);
    int rc = -1;
    if (!tok || !type || !mrg)
        goto done;
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(tj, "model"), "vocab"), key, v) {
        tok[json_integer_value(v)] = strdup(key);
        type[json_integer_value(v)] = 1;
    }
    size_t i;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, v) {
        const char *c = json_string_value(json_object_get(v, "content"));
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        tok[id] = strdup(c);
        type[id] = json_is_true(json_object_get(v, "special")) || looks_special(c) ? 3 : 4;
    }
    for (int32_t id = 0; id < QWEN3_VOCAB_SIZE; id++)
        if (!tok[id]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%d]", id);
            tok[id] = strdup(pad);
            type[id] = 5;
        }
    json_array_foreach(merges, i, v) {
        const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
        if (asprintf(&mrg[i], "%s %s", a, b) < 0)
            goto done;
    }
    struct gguf_writer *w;
    if (gguf_writer_init(&w, path) != 0)
        goto done;
    gguf_writer_kv_str(w, "general.architecture", "qwen3");
    gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_kv_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, QWEN3_VOCAB_SIZE);
    gguf_writer_kv_arr_i32(w, "tokenizer.ggml.token_type", type, QWEN3_VOCAB_SIZE);
    gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mrg, n_merges);
    gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 151645);
    gguf_writer_kv_u32(w, "tokenizer.ggml.padding_token_id", 151643);
    gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 151643);
    gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_kv_str(w, "tokenizer.chat_template", json_string_value(json_object_get(cfg, "chat_template")));
    rc = gguf_writer_finish(w, NULL, NULL);
done:
    for (int32_t id = 0; tok && id < QWEN3_VOCAB_SIZE; id++)
        free(tok[id]);
    for (size_t m = 0; mrg && m < n_merges; m++)
        free(mrg[m]);
    free(tok);
    free(type);
    free(mrg);
    return rc;
}

/* Encodes text, compares with want_ids, decodes back and compares with want_text. */
static void check_text(const struct tokenizer *t, json_t *text, json_t *want_ids, json_t *want_text, size_t idx)
{
    struct tok_ids ids = {0};
    CHECK(tok_encode(t, json_string_value(text), json_string_length(text), &ids) == 0, "case %zu: %s", idx, err_msg());
    bool same = ids.n == (int32_t)json_array_size(want_ids);
    for (int32_t i = 0; same && i < ids.n; i++)
        same = ids.ids[i] == json_integer_value(json_array_get(want_ids, (size_t)i));
    CHECK(same, "case %zu: ids differ (%d vs %zu ids) for '%.60s'", idx, ids.n, json_array_size(want_ids),
          json_string_value(text));
    if (want_text) {
        size_t n;
        char *d = tok_decode(t, ids.ids, ids.n, false, &n);
        CHECK(d && n == json_string_length(want_text) && memcmp(d, json_string_value(want_text), n) == 0,
              "case %zu: decoded '%.60s'", idx, d ? d : "(null)");
        free(d);
    }
    tok_ids_free(&ids);
}

static void check_corpus(const struct tokenizer *t)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s/tokenizer/corpus.jsonl.gz'", test_fixtures());
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "`%s`", cmd);
    char *line = NULL;
    size_t cap = 0, n = 0;
    while (f && getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        CHECK(json_is_string(json_object_get(j, "text")), "corpus line %zu", n + 1);
        if (json_is_string(json_object_get(j, "text")))
            check_text(t, json_object_get(j, "text"), json_object_get(j, "ids"), json_object_get(j, "decoded"),
                       2000 + n);
        json_decref(j);
        n++;
    }
    CHECK(n >= 700, "only %zu corpus documents", n);
    free(line);
    if (f)
        CHECK(pclose(f) == 0, "%s failed", cmd);
}

/* Renders a chat golden with both templates: identical, and as the reference did. */
static void check_render(const struct chat_template *ours, const struct chat_template *ref, json_t *c, size_t i)
{
    json_t *in = json_object_get(c, "input"), *kw = json_object();
    if (json_object_get(in, "enable_thinking"))
        json_object_set(kw, "enable_thinking", json_object_get(in, "enable_thinking"));
    bool gen = json_is_true(json_object_get(c, "add_generation_prompt"));
    size_t n1 = 0, n2 = 0;
    char *a = chat_template_render(ours, json_object_get(in, "messages"), json_object_get(in, "tools"), gen, kw, &n1);
    char *b = chat_template_render(ref, json_object_get(in, "messages"), json_object_get(in, "tools"), gen, kw, &n2);
    CHECK((!a && !b) || (a && b && n1 == n2 && memcmp(a, b, n1) == 0), "chat case %zu renders differently", i);
    json_t *want = json_object_get(c, "rendered");
    if (want)
        CHECK(a && n1 == json_string_length(want) && memcmp(a, json_string_value(want), n1) == 0,
              "chat case %zu differs from the reference", i);
    free(a);
    free(b);
    json_decref(kw);
}

void test_gguf_vocab_qwen3(void)
{
    const char *dir = qwen3_dir();
    json_t *tj = load(dir, "tokenizer.json"), *cfg = load(dir, "tokenizer_config.json");
    char path[512];
    snprintf(path, sizeof path, "%s/qwen3-vocab.gguf", test_tmpdir());
    CHECK(tj && cfg, "the Qwen3 tokenizer files");
    if (!tj || !cfg || write_qwen3_gguf(path, tj, cfg) != 0) {
        CHECK(0, "writing %s: %s", path, err_msg());
        json_decref(tj);
        json_decref(cfg);
        return;
    }
    struct gguf g;
    int opened = gguf_open(&g, path);
    CHECK(opened == 0, "%s", err_msg());
    json_t *gt = opened == 0 ? gguf_vocab_tokenizer_json(&g) : NULL;
    json_t *gc = opened == 0 ? gguf_vocab_tokenizer_config(&g) : NULL;
    CHECK(gt && gc, "%s", err_msg());
    /* the pipeline rebuilt from "qwen2" is Qwen3's own */
    static const char *const parts[] = {"normalizer", "pre_tokenizer", "decoder"};
    for (size_t k = 0; gt && k < 3; k++)
        CHECK(json_equal(json_object_get(gt, parts[k]), json_object_get(tj, parts[k])), "%s differs", parts[k]);

    struct tokenizer *ours = gt ? tok_load_json(gt, path) : NULL, *ref = tok_load(dir);
    CHECK(ours && ref, "%s", err_msg());
    if (ours && ref) {
        CHECK(tok_n_vocab(ours) == tok_n_vocab(ref), "%d vs %d tokens", tok_n_vocab(ours), tok_n_vocab(ref));
        /* the same strings; special as HF has it, but for the added tokens the
         * converter types as control because they look special */
        int32_t n_diff = 0, n_looks = 0;
        for (int32_t id = 0; id < tok_n_vocab(ref); id++) {
            const char *a = tok_piece(ours, id), *b = tok_piece(ref, id);
            n_diff += !a || !b || strcmp(a, b) != 0;
            bool want = tok_is_special(ref, id) || (b && looks_special(b));
            n_looks += want != tok_is_special(ref, id);
            CHECK(tok_is_special(ours, id) == want, "token %d (%s): special %d", id, b ? b : "?",
                  tok_is_special(ours, id));
        }
        CHECK(n_diff == 0, "%d tokens differ", n_diff);
        CHECK(n_looks == 6, "%d <|fim_*|>-like tokens", n_looks);
        CHECK(!tok_is_special(ours, tok_find(ours, "<think>")) && tok_is_special(ours, tok_find(ours, "<|im_end|>")),
              "<think> normal, <|im_end|> special");

        size_t i;
        json_t *c, *goldens = load(test_fixtures(), "tokenizer/tokenizer_goldens.json");
        CHECK(json_array_size(goldens) > 0, "tokenizer goldens");
        json_array_foreach(goldens, i, c) check_text(ours, json_object_get(c, "text"), json_object_get(c, "ids"),
                                                     json_object_get(c, "decoded"), i);
        json_decref(goldens);
        check_corpus(ours);

        goldens = load(test_fixtures(), "tokenizer/chat_template_goldens.json");
        struct chat_template *ct = gc ? chat_template_from_config(gc, path) : NULL;
        struct chat_template *ct_ref = chat_template_load(dir, NULL);
        CHECK(ct && ct_ref && json_array_size(goldens) > 0, "%s", err_msg());
        json_array_foreach(goldens, i, c) {
            json_t *r = json_object_get(c, "rendered");
            if (r) /* the prompt the template made, tokenized */
                check_text(ours, r, json_object_get(c, "ids"), r, 1000 + i);
            if (ct && ct_ref)
                check_render(ct, ct_ref, c, 1000 + i);
        }
        CHECK(json_equal(json_object_get(gc, "eos_token"), json_object_get(cfg, "eos_token")) &&
                  json_equal(json_object_get(gc, "pad_token"), json_object_get(cfg, "pad_token")),
              "eos/pad tokens");
        chat_template_free(ct);
        chat_template_free(ct_ref);
        json_decref(goldens);
    }
    tok_free(ours);
    tok_free(ref);
    json_decref(gt);
    json_decref(gc);
    if (opened == 0)
        gguf_close(&g);
    json_decref(tj);
    json_decref(cfg);
}

/* A small byte-level vocab: the 256 byte symbols (ids 0..255), "ab" (256),
 * "abc" (257), the control token <|end|> (258), the user-defined <think> (259)
 * and an unused [PAD260] (260); merges "a b", "ab c". Each field, when set,
 * breaks the file in one way. */
struct tiny {
    const char *model, *pre;  /* NULL: "gpt2", "qwen2"; "" leaves the key out */
    bool no_tokens;
    int32_t types_less;       /* token_type this many entries short */
    int32_t type0;            /* token 0's type, when nonzero */
    const char *token1;       /* token 1's string, when set */
    const char *merge1;       /* the second merge, when set */
    int64_t eos;              /* eos id, when nonzero */
};

#define TINY_N 261

static int write_tiny(const char *path, const struct tiny *o)
{
    const char *tok[TINY_N];
    char sym[256][4];
    int32_t type[TINY_N];
    int k = 0;
    for (int b = 0; b < 256; b++) { /* GPT-2's bytes_to_unicode, as tokenizer.c builds it */
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)k++;
        if (cp < 0x80) {
            sym[b][0] = (char)cp, sym[b][1] = 0;
        } else {
            sym[b][0] = (char)(0xc0 | cp >> 6), sym[b][1] = (char)(0x80 | (cp & 0x3f)), sym[b][2] = 0;
        }
        tok[b] = sym[b];
        type[b] = 1;
    }
    tok[256] = "ab", tok[257] = "abc", tok[258] = "<|end|>", tok[259] = "<think>", tok[260] = "[PAD260]";
    type[256] = type[257] = 1, type[258] = 3, type[259] = 4, type[260] = 5;
    if (o->type0)
        type[0] = o->type0;
    if (o->token1)
        tok[1] = o->token1;
    const char *merges[2] = {"a b", o->merge1 ? o->merge1 : "ab c"};
    struct gguf_writer *w;
    if (gguf_writer_init(&w, path) != 0)
        return -1;
    const char *model = o->model ? o->model : "gpt2", *pre = o->pre ? o->pre : "qwen2";
    if (*model)
        gguf_writer_kv_str(w, "tokenizer.ggml.model", model);
    if (*pre)
        gguf_writer_kv_str(w, "tokenizer.ggml.pre", pre);
    if (!o->no_tokens)
        gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, TINY_N);
    gguf_writer_kv_arr_i32(w, "tokenizer.ggml.token_type", type, (uint64_t)(TINY_N - o->types_less));
    gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", merges, 2);
    gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(o->eos ? o->eos : 258));
    gguf_writer_kv_str(w, "tokenizer.chat_template", "{{ eos_token }}");
    return gguf_writer_finish(w, NULL, NULL);
}

/* Reads the tiny file: 0 when both objects came back (tokenizer loaded into
 * *t when t is given), -1 with the message otherwise. */
static int read_tiny(const struct tiny *o, const char *name, struct tokenizer **t)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), name);
    if (write_tiny(path, o) != 0)
        return -1;
    struct gguf g;
    if (gguf_open(&g, path) != 0)
        return -1;
    json_t *tj = gguf_vocab_tokenizer_json(&g), *cfg = tj ? gguf_vocab_tokenizer_config(&g) : NULL;
    int rc = cfg ? 0 : -1;
    if (cfg && t && !(*t = tok_load_json(tj, path)))
        rc = -1;
    json_decref(tj);
    json_decref(cfg);
    gguf_close(&g);
    return rc;
}

void test_gguf_vocab_tiny(void)
{
    /* the good file, under each supported pre-tokenizer */
    static const char *const pres[] = {"qwen2", "qwen35", "pixtral", "tekken"};
    for (int p = 0; p < 4; p++) {
        struct tiny o = {.pre = pres[p]};
        struct tokenizer *t = NULL;
        CHECK(read_tiny(&o, pres[p], &t) == 0, "%s: %s", pres[p], err_msg());
        if (!t)
            continue;
        struct tok_ids ids = {0};
        const char *text = "abc<think>x<|end|>";
        CHECK(tok_encode(t, text, strlen(text), &ids) == 0, "%s", err_msg());
        CHECK(ids.n == 4 && ids.ids[0] == 257 && ids.ids[1] == 259 && ids.ids[2] == 'x' && ids.ids[3] == 258,
              "%s: %d ids", pres[p], ids.n);
        char *d = tok_decode(t, ids.ids, ids.n, true, NULL);
        CHECK(d && strcmp(d, "abc<think>x") == 0, "%s: decoded '%s'", pres[p], d ? d : "(null)");
        CHECK(tok_n_vocab(t) == 260 && !tok_piece(t, 260), "the unused token is a gap");
        free(d);
        tok_ids_free(&ids);
        tok_free(t);
    }
    struct tiny ok = {0};
    struct gguf g;
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-cfg.gguf", test_tmpdir());
    CHECK(write_tiny(path, &ok) == 0 && gguf_open(&g, path) == 0, "%s", err_msg());
    json_t *cfg = gguf_vocab_tokenizer_config(&g);
    struct chat_template *ct = cfg ? chat_template_from_config(cfg, path) : NULL;
    size_t n = 0;
    json_t *msgs = json_array();
    char *out = ct ? chat_template_render(ct, msgs, NULL, false, NULL, &n) : NULL;
    CHECK(out && strcmp(out, "<|end|>") == 0, "eos_token from the id: '%s' (%s)", out ? out : "", err_msg());
    free(out);
    json_decref(msgs);
    chat_template_free(ct);
    json_decref(cfg);
    gguf_close(&g);

    /* broken metadata: each an error naming the key */
    static const struct {
        struct tiny o;
        const char *want;
    } bad[] = {
        {{.no_tokens = true}, "tokenizer.ggml.tokens is missing"},
        {{.merge1 = "ab q\xc3\xa9"}, "tokenizer.ggml.merges[1] 'ab q\xc3\xa9' uses a token missing"},
        {{.merge1 = "abc"}, "tokenizer.ggml.merges[1] 'abc' is not two tokens"},
        {{.types_less = 1}, "tokenizer.ggml.token_type has 260 entries for 261 tokens"},
        {{.pre = "llama-bpe"}, "tokenizer.ggml.pre 'llama-bpe' is not supported"},
        {{.pre = ""}, "tokenizer.ggml.pre is missing"},
        {{.model = "llama"}, "tokenizer.ggml.model 'llama' is not supported"},
        {{.type0 = 9}, "tokenizer.ggml.token_type[0] is 9"},
        {{.token1 = "\xff"}, "tokenizer.ggml.tokens[1] is not UTF-8"},
        {{.eos = 261}, "tokenizer.ggml.eos_token_id = 261 is not the id of a token"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "tiny-bad-%zu", i);
        int rc = read_tiny(&bad[i].o, name, NULL);
        CHECK(rc != 0 && strstr(err_msg(), bad[i].want) && strstr(err_msg(), name), "case %zu: '%s'", i, err_msg());
    }
}
