/* tool_grammar: a forced tool call in each format, with and without a
 * reasoning block first. The calls the chat templates write are accepted to
 * their last byte (nothing may follow), their prefixes stay open, and the
 * parser reads each back as one call of the named tool with its arguments;
 * other names, text around the call and malformed arguments are refused.
 * With the real Qwen3 tokenizer, the tokens of a call as it tokenizes (its
 * tags are single added tokens) are each allowed in turn. */
#include "../../src/base/err.h"
#include "../../src/chat/parser.h"
#include "../../src/chat/tool_grammar.h"
#include "../../src/engine/sampler.h"
#include "../../src/tokenizer/tokenizer.h"
#include "test.h"

#include <string.h>

static const char *const names[] = {"get_weather", "get_time", "read"};

struct calls {
    int n;
    char name[64];
    char args[256];
};

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct calls *c = ctx;
    if (ev->kind == CHAT_EV_TOOL_START) {
        c->n++;
        snprintf(c->name, sizeof c->name, "%s", ev->name);
    } else if (ev->kind == CHAT_EV_TOOL_ARGS && strlen(c->args) + ev->len < sizeof c->args) {
        strncat(c->args, ev->text, ev->len);
    }
}

/* The parser's reading of text: one call of want_name with arguments equal to want_args. */
static void parses_as(enum chat_format fmt, bool in_reasoning, const char *text, const char *want_name,
                      const char *want_args)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                               "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}}]",
                               0, NULL);
    struct calls c = {0};
    struct chat_parser *p = chat_parser_new(fmt, in_reasoning, tools, on_event, &c);
    chat_parser_feed(p, text, strlen(text));
    chat_parser_finish(p);
    chat_parser_free(p);
    json_t *got = json_loads(c.args, 0, NULL), *want = json_loads(want_args, 0, NULL);
    CHECK(c.n == 1 && strcmp(c.name, want_name) == 0 && json_equal(got, want), "'%s' parsed as %d calls, %s(%s)",
          text, c.n, c.name, c.args);
    json_decref(got);
    json_decref(want);
    json_decref(tools);
}

void test_tool_grammar_formats(void)
{
    static const struct {
        enum chat_format fmt;
        const char *call, *other, *bad[4];
    } fmts[] = {
        {CHAT_FMT_JSON, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
         "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
         {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
          "<tool_call>\n{\"arguments\": {}, \"name\": \"get_weather\"}\n</tool_call>",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>\n<tool_call>",
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}}\n</tool_call>"}},
        {CHAT_FMT_TOOLCALL, "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]</TOOLCALL>",
         "<TOOLCALL> [ {\"name\": \"get_time\", \"arguments\": {}} ] </TOOLCALL>",
         {"<TOOLCALL>{\"name\": \"get_weather\", \"arguments\": {}}</TOOLCALL>",
          "<tool_call>[{\"name\": \"get_weather\", \"arguments\": {}}]</tool_call>",
          "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {}}, {\"name\": \"read\", \"arguments\": {}}]</TOOLCALL>",
          "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {}}]</TOOLCALL> "}},
        {CHAT_FMT_XML,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
         "</function>\n</tool_call>",
         "<tool_call><function=get_time></function></tool_call>",
         {"<tool_call>\n<function=get_weather>\n<parameter=ci\nty>\nParis\n</parameter>\n</function>\n</tool_call>",
          "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call>",
          "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>\n</tool_call>",
          "<tool_call>\n<function=get_weather >\n</function>\n</tool_call>"}},
    };
    /* an unclosed parameter ends where the call does for the parser, split at
     * any "<parameter=" in it: the grammar closes every parameter */
    const char *xml_unclosed = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</tool_call>";
    const char *args = "{\"city\": \"Paris\", \"days\": 3}";
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
        struct grammar any, named, open, may;
        grammar_init(&any);
        grammar_init(&named);
        grammar_init(&open);
        grammar_init(&may);
        CHECK(chat_tool_grammar(&any, fmts[f].fmt, names, NULL, 3, CHAT_THINK_NONE, false) == 0 &&
                  chat_tool_grammar(&named, fmts[f].fmt, names, NULL, 1, CHAT_THINK_NONE, false) == 0 &&
                  chat_tool_grammar(&open, fmts[f].fmt, names, NULL, 3, CHAT_THINK_OPEN, false) == 0 &&
                  chat_tool_grammar(&may, fmts[f].fmt, names, NULL, 3, CHAT_THINK_MAY, false) == 0,
              "format %zu", f);
        const char *call = fmts[f].call;
        CHECK(test_verdict(&any, call) == 1 && test_verdict(&named, call) == 1, "format %zu: '%s' refused", f,
              call);
        parses_as(fmts[f].fmt, false, call, "get_weather", args);
        char buf[512];
        for (size_t k = 0; k < strlen(call); k++) {
            memcpy(buf, call, k);
            buf[k] = 0;
            CHECK(test_verdict(&any, buf) == 0, "format %zu: prefix '%s': %d", f, buf,
                  test_verdict(&any, buf));
        }
        CHECK(test_verdict(&any, fmts[f].other) == 1 && test_verdict(&named, fmts[f].other) == -1,
              "format %zu: another tool, '%s': %d with all, %d with one named", f, fmts[f].other,
              test_verdict(&any, fmts[f].other), test_verdict(&named, fmts[f].other));
        parses_as(fmts[f].fmt, false, fmts[f].other, "get_time", "{}");
        for (int b = 0; b < 4; b++)
            CHECK(test_verdict(&any, fmts[f].bad[b]) == -1, "format %zu: '%s' accepted", f, fmts[f].bad[b]);
        if (fmts[f].fmt != CHAT_FMT_XML) { /* the closing tag in the arguments: where the parser ends the call */
            snprintf(buf, sizeof buf, "%.*s\"s\": \"%s", (int)(strstr(call, "\"city\"") - call), call,
                     fmts[f].fmt == CHAT_FMT_JSON ? "</tool_call>" : "</TOOLCALL>");
            CHECK(test_verdict(&any, buf) == -1, "format %zu: '%s' accepted", f, buf);
        }
        snprintf(buf, sizeof buf, "Sure. %s", call);
        CHECK(test_verdict(&any, buf) == -1, "format %zu: text before the call accepted", f);
        /* a reasoning block the prompt opened, or one the model may open;
         * the call's tag ends an unclosed one, as the parser reads it */
        snprintf(buf, sizeof buf, "I need the weather <tool first.\n</think>\n\n%s", call);
        CHECK(test_verdict(&open, buf) == 1 && test_verdict(&may, buf) == -1 &&
                  test_verdict(&any, buf) == -1,
              "format %zu: after a reasoning block the prompt opened: %d, %d, %d", f, test_verdict(&open, buf),
              test_verdict(&may, buf), test_verdict(&any, buf));
        parses_as(fmts[f].fmt, true, buf, "get_weather", args);
        snprintf(buf, sizeof buf, "I need the weather.\n%s", call);
        CHECK(test_verdict(&open, buf) == 1, "format %zu: the call's tag in an unclosed reasoning block refused", f);
        parses_as(fmts[f].fmt, true, buf, "get_weather", args);
        snprintf(buf, sizeof buf, "<think>\nweather: call it\n</think>\n\n%s", call);
        CHECK(test_verdict(&may, buf) == 1 && test_verdict(&may, call) == 1 &&
                  test_verdict(&any, buf) == -1,
              "format %zu: a reasoning block the model may open: %d, %d, %d", f, test_verdict(&may, buf), test_verdict(&may, call),
              test_verdict(&any, buf));
        parses_as(fmts[f].fmt, false, buf, "get_weather", args);
        grammar_free(&any);
        grammar_free(&named);
        grammar_free(&open);
        grammar_free(&may);
    }
    struct grammar g;
    grammar_init(&g);
    CHECK(chat_tool_grammar(&g, CHAT_FMT_XML, names, NULL, 1, CHAT_THINK_NONE, false) == 0 &&
              test_verdict(&g, xml_unclosed) == -1,
          "an unclosed parameter at the call's end accepted");
    parses_as(CHAT_FMT_XML, false, xml_unclosed, "get_weather", "{\"city\": \"Paris\"}");
    grammar_free(&g);
    grammar_init(&g);
    CHECK(chat_tool_grammar(&g, CHAT_FMT_JSON, (const char *const[]){"bad name"}, NULL, 1, CHAT_THINK_NONE, false) == -1,
          "a name with a space accepted");
    CHECK(chat_tool_grammar(&g, CHAT_FMT_XML, (const char *const[]){"a\"b"}, NULL, 1, CHAT_THINK_NONE, false) == -1,
          "a name with a quote accepted");
    grammar_free(&g);
}

/* Strict tools in the JSON formats: a name with a schema takes arguments
 * its schema describes, a name without one any object; names that are
 * prefixes of others keep their own schemas; the closing tag stays out of
 * the strings; a schema json_schema refuses fails the grammar, naming why. */
void test_tool_grammar_schema(void)
{
    static const char *const nm[] = {"get", "get_weather", "read"};
    json_t *sch[] = {
        json_loads("{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}}", 0, NULL),
        json_loads("{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": "
                   "{\"enum\": [\"c\", \"f\", \"a/b\"]}}, \"required\": [\"city\", \"unit\"], \"additionalProperties\": false}",
                   0, NULL),
        NULL,
    };
    static const struct {
        enum chat_format fmt;
        const char *pre, *post;
    } fmts[] = {{CHAT_FMT_JSON, "<tool_call>\n{\"name\": \"", "}\n</tool_call>"},
                {CHAT_FMT_TOOLCALL, "<TOOLCALL>[{\"name\": \"", "}]</TOOLCALL>"}};
    static const struct {
        const char *call; /* name and arguments, between pre and post */
        int verdict;
    } calls[] = {
        {"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}", 1},
        {"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"a\\/b\"}", 1},
        {"get\", \"arguments\": {\"n\": 12}", 1},
        {"read\", \"arguments\": {\"path\": [1, {}]}", 1},
        {"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"k\"}", -1},
        {"get_weather\", \"arguments\": {\"city\": \"Paris\"}", -1},
        {"get_weather\", \"arguments\": {\"unit\": \"c\", \"city\": \"Paris\"}", -1},
        {"get_weather\", \"arguments\": {\"city\": 3, \"unit\": \"c\"}", -1},
        {"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\", \"x\": 1}", -1},
        {"get\", \"arguments\": {\"n\": 1.5}", -1},
        {"get\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}", -1},
    };
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
        struct grammar g;
        grammar_init(&g);
        CHECK(chat_tool_grammar(&g, fmts[f].fmt, nm, sch, 3, CHAT_THINK_NONE, false) == 0, "format %zu: %s", f,
              err_msg());
        char buf[512];
        for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
            snprintf(buf, sizeof buf, "%s%s%s", fmts[f].pre, calls[i].call, fmts[f].post);
            CHECK(test_verdict(&g, buf) == calls[i].verdict, "format %zu: '%s': %d", f, buf, test_verdict(&g, buf));
        }
        snprintf(buf, sizeof buf, "%s%s%s", fmts[f].pre, calls[0].call, fmts[f].post);
        parses_as(fmts[f].fmt, false, buf, "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}");
        snprintf(buf, sizeof buf, "%sget_weather\", \"arguments\": {\"city\": \"x%s", fmts[f].pre,
                 fmts[f].fmt == CHAT_FMT_JSON ? "</tool_call>" : "</TOOLCALL>");
        CHECK(test_verdict(&g, buf) == -1, "format %zu: the closing tag in a string: '%s' accepted", f, buf);
        grammar_free(&g);
    }
    /* the XML format: a "string" parameter, or one without a type, raw; another type JSON */
    static const struct {
        const char *call;
        int verdict;
    } xml[] = {
        {"get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n</parameter>\n", 1},
        {"get_weather>\n<parameter=city>\n<b>x</b> y\n</parameter>\n<parameter=unit>\na/b\n</parameter>\n", 1},
        {"get>\n<parameter=n>\n12\n</parameter>\n", 1},
        {"read>\n<parameter=path>\n[1]\n</parameter>\n", 1},
        {"get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nk\n</parameter>\n", -1},
        {"get_weather>\n<parameter=city>\nParis\n</parameter>\n", -1},
        {"get_weather>\n<parameter=unit>\nc\n</parameter>\n<parameter=city>\nParis\n</parameter>\n", -1},
        {"get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\n c\n</parameter>\n", -1},
        {"get_weather>\n<parameter=city>\nParis</tool_call>\n</parameter>\n<parameter=unit>\nc\n</parameter>\n", -1},
        {"get>\n<parameter=n>\n1.5\n</parameter>\n", -1},
        {"get>\n<parameter=n>\n12\n</parameter>\n<parameter=m>\n1\n</parameter>\n", -1},
    };
    struct grammar gx;
    grammar_init(&gx);
    CHECK(chat_tool_grammar(&gx, CHAT_FMT_XML, nm, sch, 3, CHAT_THINK_NONE, false) == 0, "xml: %s", err_msg());
    for (size_t i = 0; i < sizeof xml / sizeof *xml; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "<tool_call>\n<function=%s</function>\n</tool_call>", xml[i].call);
        CHECK(test_verdict(&gx, buf) == xml[i].verdict, "xml: '%s': %d", buf, test_verdict(&gx, buf));
        if (i == 0)
            parses_as(CHAT_FMT_XML, false, buf, "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}");
    }
    grammar_free(&gx);
    json_t *untyped = json_loads("{\"type\": \"object\", \"properties\": {\"d\": {\"enum\": [1, 2]}}}", 0, NULL);
    grammar_init(&gx);
    CHECK(chat_tool_grammar(&gx, CHAT_FMT_XML, nm, (json_t *const[]){untyped, NULL, NULL}, 3, CHAT_THINK_NONE,
                            false) == -1 &&
              strstr(err_msg(), "type"),
          "xml: an untyped enum of numbers: '%s'", err_msg());
    grammar_free(&gx);
    json_decref(untyped);
    json_t *bad = json_loads("{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"format\": \"ipv6\"}}}", 0, NULL);
    struct grammar g;
    grammar_init(&g);
    CHECK(chat_tool_grammar(&g, CHAT_FMT_JSON, nm, (json_t *const[]){NULL, bad, NULL}, 3, CHAT_THINK_NONE,
                            false) == -1 &&
              strstr(err_msg(), "format"),
          "a schema with format: '%s'", err_msg());
    grammar_free(&g);
    json_decref(bad);
    json_decref(sch[0]);
    json_decref(sch[1]);
}

/* text fed to a lazy grammar: -1 refused, 1 where the output may end, 0 where it must go on */
static int lazy_verdict(const struct grammar *gm, const char *text)
{
    struct guard g;
    guard_init(&g, gm);
    if (guard_feed(&g, text, strlen(text)) != 0)
        return -1;
    CHECK(!guard_done(&g), "'%s': a lazy grammar ended", text);
    return guard_may_end(&g) ? 1 : 0;
}

/* Lazy (tool_choice auto with a strict tool): text alone, calls between
 * texts, several calls; the output may end in the text, never inside a call
 * or a tag begun; a call names a tool given and a strict tool's arguments
 * follow its schema; the parser reads the calls back. In a reasoning block
 * the prompt opened, the output may end too, and a call's tag ends it. */
void test_tool_grammar_lazy(void)
{
    static const char *const nm[] = {"get", "get_weather", "read"};
    json_t *sch[] = {NULL,
                     json_loads("{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
                                "\"required\": [\"city\"], \"additionalProperties\": false}",
                                0, NULL),
                     NULL};
    static const struct {
        enum chat_format fmt;
        const char *good, *bad, *unknown;
    } fmts[] = {
        {CHAT_FMT_JSON, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>",
         "<tool_call>\n{\"name\": \"fly\", \"arguments\": {}}\n</tool_call>"},
        {CHAT_FMT_TOOLCALL, "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]</TOOLCALL>",
         "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}]</TOOLCALL>",
         "<TOOLCALL>[{\"name\": \"fly\", \"arguments\": {}}]</TOOLCALL>"},
        {CHAT_FMT_XML,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
         "<tool_call>\n<function=get_weather>\n<parameter=town>\nParis\n</parameter>\n</function>\n</tool_call>",
         "<tool_call>\n<function=fly>\n</function>\n</tool_call>"},
    };
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++) {
        struct grammar g, open;
        grammar_init(&g);
        grammar_init(&open);
        CHECK(chat_tool_grammar(&g, fmts[f].fmt, nm, sch, 3, CHAT_THINK_MAY, true) == 0 &&
                  chat_tool_grammar(&open, fmts[f].fmt, nm, sch, 3, CHAT_THINK_OPEN, true) == 0,
              "format %zu: %s", f, err_msg());
        const char *good = fmts[f].good, *tag = fmts[f].fmt == CHAT_FMT_TOOLCALL ? "<TOOLCALL>" : "<tool_call>";
        char buf[1024];
        CHECK(lazy_verdict(&g, "") == 1 && lazy_verdict(&g, "<think>\nhm\n</think>\n\nIt is sunny.") == 1,
              "format %zu: text alone", f);
        snprintf(buf, sizeof buf, "Let me look. %.6s", tag);
        CHECK(lazy_verdict(&g, buf) == 0, "format %zu: the output may end in a tag begun: '%s'", f, buf);
        for (size_t k = strlen("Let me look. ") + strlen(tag); k < strlen("Let me look. ") + strlen(good); k++) {
            snprintf(buf, sizeof buf, "Let me look. %.*s", (int)(k - strlen("Let me look. ")), good);
            CHECK(lazy_verdict(&g, buf) == 0, "format %zu: '%s': %d", f, buf, lazy_verdict(&g, buf));
        }
        snprintf(buf, sizeof buf, "Let me look. %s", good);
        CHECK(lazy_verdict(&g, buf) == 1, "format %zu: '%s' refused or open", f, buf);
        parses_as(fmts[f].fmt, false, buf, "get_weather", "{\"city\": \"Paris\"}");
        snprintf(buf, sizeof buf, "%s\n%s\nDone.", good, good);
        CHECK(lazy_verdict(&g, buf) == 1, "format %zu: two calls and text: '%s'", f, buf);
        snprintf(buf, sizeof buf, "Let me look. %s", fmts[f].bad);
        CHECK(lazy_verdict(&g, buf) == -1, "format %zu: arguments against the schema: '%s'", f, buf);
        snprintf(buf, sizeof buf, "Let me look. %s", fmts[f].unknown);
        CHECK(lazy_verdict(&g, buf) == -1, "format %zu: a tool not given: '%s'", f, buf);
        snprintf(buf, sizeof buf, "the weather, then\n%s", good);
        CHECK(lazy_verdict(&open, "still thinking") == 1 && lazy_verdict(&open, buf) == 1,
              "format %zu: in a reasoning block the prompt opened", f);
        parses_as(fmts[f].fmt, true, buf, "get_weather", "{\"city\": \"Paris\"}");
        snprintf(buf, sizeof buf, "the weather\n</think>\n\n%s", fmts[f].bad);
        CHECK(lazy_verdict(&open, buf) == -1, "format %zu: after a reasoning block: '%s' accepted", f, buf);
        grammar_free(&g);
        grammar_free(&open);
    }
    json_decref(sch[1]);
}

/* The end token under a lazy grammar (vocab_bytes.end): allowed in the
 * text, not inside a call; sampled, it leaves the guard where it was. */
void test_tool_grammar_end(void)
{
    static char data[] = "Hi<tool_call>{\"name\": \"read\", \"arguments\": {}}</tool_call><|im_end|>";
    uint32_t off[] = {0, 2, 13, 46, 58, 68};
    uint8_t special[5] = {0, 0, 0, 0, 1};
    struct vocab_bytes vb = {5, data, off, special, NULL};
    /* tokens: "Hi", "<tool_call>", the call's JSON, "</tool_call>", the end of turn */
    CHECK(vocab_bytes_set_end(&vb, (const int32_t[]){4, 99}, 2) == 0, "end tokens");
    static const char *const nm[] = {"read"};
    struct grammar gm;
    grammar_init(&gm);
    CHECK(chat_tool_grammar(&gm, CHAT_FMT_JSON, nm, NULL, 1, CHAT_THINK_NONE, true) == 0, "grammar");
    struct guard g;
    guard_init(&g, &gm);
    CHECK(guard_allows(&g, &vb, 4) && guard_allows(&g, &vb, 0), "the end or text, at the start");
    struct sampler s;
    const struct sampler_params sp = sampler_defaults();
    CHECK(sampler_init(&s, &sp, 5) == 0, "sampler");
    const float prefer_end[5] = {0, 1, 0, 0, 5}, prefer_call[5] = {0, 5, 4, 3, 1};
    const int32_t hist[1] = {0};
    CHECK(sampler_sample_guarded(&s, &g, &vb, prefer_end, hist, 0) == 4 && g.seg == 0 && guard_may_end(&g),
          "the end token, sampled, leaves the guard in the text");
    for (int32_t t = 1; t <= 3; t++) {
        CHECK(!guard_allows(&g, &vb, 4) || t == 1, "the end token inside a call (before token %d)", t);
        CHECK(sampler_sample_guarded(&s, &g, &vb, prefer_call, hist, 0) == t, "the call's token %d", t);
    }
    CHECK(guard_allows(&g, &vb, 4) && guard_may_end(&g), "the end token after the call");
    sampler_free(&s);
    grammar_free(&gm);
    vb.data = NULL, vb.off = NULL, vb.special = NULL; /* static: only end is the table's own */
    vocab_bytes_free(&vb);
}

void test_tool_grammar_tokens(void)
{
    struct tokenizer *t = tok_load("models/qwen3-tokenizer");
    CHECK(t != NULL, "tokenizer");
    if (!t)
        return;
    struct vocab_bytes vb = {0};
    CHECK(tok_vocab_bytes(t, tok_n_vocab(t), &vb) == 0, "vocabulary bytes");
    struct grammar gm;
    grammar_init(&gm);
    CHECK(chat_tool_grammar(&gm, CHAT_FMT_JSON, names, NULL, 3, CHAT_THINK_MAY, false) == 0, "grammar");
    const char *text = "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
                       "\"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
    struct tok_ids ids = {0};
    CHECK(tok_encode(t, text, strlen(text), &ids) == 0, "encode");
    struct guard g;
    guard_init(&g, &gm);
    int32_t tags = 0;
    for (int32_t i = 0; i < ids.n; i++) {
        const char *piece = tok_piece(t, ids.ids[i]);
        tags += strcmp(piece, "<tool_call>") == 0 || strcmp(piece, "</tool_call>") == 0 ||
                strcmp(piece, "<think>") == 0 || strcmp(piece, "</think>") == 0;
        CHECK(guard_allows(&g, &vb, ids.ids[i]), "token %d ('%s') refused", i, piece);
        guard_feed(&g, vb.data + vb.off[ids.ids[i]], vb.off[ids.ids[i] + 1] - vb.off[ids.ids[i]]);
    }
    CHECK(tags == 4, "%d of the four tags came as added tokens", tags);
    CHECK(guard_done(&g), "the call's tokens leave the grammar open");
    const int32_t eos = tok_find(t, "<|im_end|>");
    guard_init(&g, &gm);
    CHECK(eos >= 0 && !guard_allows(&g, &vb, eos), "the end of turn is allowed before the call");
    tok_ids_free(&ids);
    grammar_free(&gm);
    vocab_bytes_free(&vb);
    tok_free(t);
}
