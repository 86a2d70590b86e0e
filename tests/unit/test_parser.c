/* Table-driven tests of the streaming output parser, per tool-call format:
 * every case is fed whole, one byte at a time, and split in two at every
 * point; all must give the same (merged) events. */
#include "../../src/chat/parser.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

struct rec {
    char s[8192];
    size_t n;
    int last; /* kind of the last text-like event, to merge deltas */
};

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct rec *r = ctx;
    static const char kinds[] = {'T', 'R', 'S', 'A', 'E'};
    int k = (int)ev->kind;
    if (!((k == CHAT_EV_TEXT || k == CHAT_EV_REASONING || k == CHAT_EV_TOOL_ARGS) && r->last == k))
        r->n += (size_t)snprintf(r->s + r->n, sizeof r->s - r->n, "%s%c%s%s", r->n ? "|" : "", kinds[k],
                                 k == CHAT_EV_TOOL_START ? ev->name : "", k == CHAT_EV_TOOL_START || k == CHAT_EV_TOOL_END ? "" : ":");
    if (ev->text && r->n + ev->len < sizeof r->s) {
        memcpy(r->s + r->n, ev->text, ev->len);
        r->n += ev->len;
        r->s[r->n] = 0;
    }
    r->last = k;
}

static void run(enum chat_format fmt, bool in_reasoning, json_t *tools, const char *text, size_t split,
                size_t step, struct rec *r)
{
    memset(r, 0, sizeof *r);
    r->last = -1;
    struct chat_parser *p = chat_parser_new(fmt, in_reasoning, tools, on_event, r);
    size_t n = strlen(text);
    if (step) {
        for (size_t i = 0; i < n; i += step)
            chat_parser_feed(p, text + i, i + step <= n ? step : n - i);
    } else {
        chat_parser_feed(p, text, split);
        chat_parser_feed(p, text + split, n - split);
    }
    chat_parser_finish(p);
    chat_parser_free(p);
}

void test_parser_table(void)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"edit\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"path\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},"
                               "\"force\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"code\":{\"type\":\"string\"}}}}}]",
                               0, NULL);
    struct {
        enum chat_format fmt;
        bool in_reasoning;
        const char *in, *want;
    } cases[] = {
        /* text and reasoning */
        {CHAT_FMT_JSON, false, "Hello, world!", "T:Hello, world!"},
        {CHAT_FMT_JSON, false, "<think>\nplan it\n</think>\n\nThe answer is 4.", "R:plan it|T:The answer is 4."},
        {CHAT_FMT_XML, true, "plan\nmore\n</think>\n\nDone.\n", "R:plan\nmore|T:Done."},
        {CHAT_FMT_JSON, false, "use <think> tags? no: a < b <thin", "T:use <think> tags? no: a < b <thin"},
        {CHAT_FMT_JSON, true, "unfinished thought", "R:unfinished thought"},
        {CHAT_FMT_JSON, false, "x <tool_cal", "T:x <tool_cal"},
        /* Qwen3 JSON tool calls */
        {CHAT_FMT_JSON, false, "Let me look.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.c\"}}\n</tool_call>",
         "T:Let me look.|Sread|A:{\"path\": \"a.c\"}|E"},
        {CHAT_FMT_JSON, false,
         "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, \"é\"]}}\n</tool_call>\n",
         "Sa|A:{}|E|Sb|A:{\"x\": [1, \"é\"]}|E"},
        {CHAT_FMT_JSON, false, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": 1}}", "Sa|A:{\"q\": 1}|E"},
        {CHAT_FMT_JSON, true, "thinking\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>", "R:thinking|Sa|A:{}|E"},
        {CHAT_FMT_JSON, false, "<tool_call>not json</tool_call> after", "T:<tool_call>not json</tool_call>after"},
        {CHAT_FMT_JSON, false, "<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 2}\"}\n</tool_call>", "Sa|A:{\"k\": 2}|E"},
        {CHAT_FMT_JSON, false, "<tool_call>{\"name\": \"a\"", "T:{\"name\": \"a\""},
        {CHAT_FMT_JSON, false, "Sure.\n<tool_call>\n  {\"name\": \"a\", \"argu", "T:Sure.{\"name\": \"a\", \"argu"},
        {CHAT_FMT_JSON, false, "<tool_call>\n ", ""},
        /* XML (Qwen3-Coder, Qwen3.5, Nemotron 3) */
        {CHAT_FMT_XML, false,
         "I'll edit it.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a b.c\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
         "<parameter=force>\ntrue\n</parameter>\n<parameter=opts>\n{\"x\": 1}\n</parameter>\n<parameter=code>\nint x = 1;\n  return;\n</parameter>\n"
         "</function>\n</tool_call>",
         "T:I'll edit it.|Sedit|A:{\"path\": \"src/a b.c\", \"n\": 3, \"force\": true, \"opts\": {\"x\": 1}, \"code\": \"int x = 1;\\n  return;\"}|E"},
        {CHAT_FMT_XML, false, "<tool_call>\n<function=edit>\n<parameter=n>\nthree\n</parameter>\n</function>\n</tool_call>",
         "Sedit|A:{\"n\": \"three\"}|E"},
        {CHAT_FMT_XML, false, "<tool_call>\n<function=other>\n<parameter=n>\n3\n</parameter>\n", "Sother|A:{\"n\": \"3\"}|E"},
        {CHAT_FMT_XML, true, "hmm\n<tool_call>\n<function=edit>\n<parameter=path>\nx\n</parameter>\n</function>\n</tool_call>\n",
         "R:hmm|Sedit|A:{\"path\": \"x\"}|E"},
        {CHAT_FMT_XML, false, "<tool_call>oops</tool_call>", "T:<tool_call>oops</tool_call>"},
        /* Nemotron Nano v2 */
        {CHAT_FMT_TOOLCALL, false, "<TOOLCALL>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]</TOOLCALL>",
         "Sa|A:{\"x\": 1}|E|Sb|A:{}|E"},
        {CHAT_FMT_TOOLCALL, false, "<think>\nhm\n</think>\nok <TOOLCALL>[{\"name\": \"a\", \"arguments\": {}}]", "R:hm|T:ok|Sa|A:{}|E"},
        {CHAT_FMT_TOOLCALL, false, "<tool_call>{}</tool_call>", "T:<tool_call>{}</tool_call>"},
        {CHAT_FMT_TOOLCALL, false, "<TOOLCALL>[{\"name\": \"a\", \"argum", "T:[{\"name\": \"a\", \"argum"},
        {CHAT_FMT_XML, false, "<tool_call>\n<functi", "T:<functi"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct rec whole, part;
        run(cases[i].fmt, cases[i].in_reasoning, tools, cases[i].in, strlen(cases[i].in), 0, &whole);
        CHECK(strcmp(whole.s, cases[i].want) == 0, "case %zu:\n    got  %s\n    want %s", i, whole.s, cases[i].want);
        run(cases[i].fmt, cases[i].in_reasoning, tools, cases[i].in, 0, 1, &part);
        CHECK(strcmp(part.s, whole.s) == 0, "case %zu byte by byte: %s", i, part.s);
        for (size_t k = 0; k <= strlen(cases[i].in); k++) {
            run(cases[i].fmt, cases[i].in_reasoning, tools, cases[i].in, k, 0, &part);
            CHECK(strcmp(part.s, whole.s) == 0, "case %zu split at %zu: %s", i, k, part.s);
        }
    }
    json_decref(tools);
}
