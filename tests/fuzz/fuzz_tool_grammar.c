/* libFuzzer target: the grammar of a forced tool call against the parser
 * that reads it. Input: a format byte, a reasoning byte, then the output
 * text. Fed whole and one byte at a time the guard must reach the same
 * verdict, and a text it takes as complete must be, for the parser, exactly
 * one call of one of the names with a JSON object of arguments (texts with
 * \u escapes or numbers jansson cannot hold are left out of that check, as
 * in fuzz_json_guard). With strict tools (the reasoning byte's next choice),
 * the arguments of "ab" and "read_file" must be what their schemas describe
 * (the parser told the tools, for the XML format's types); in the JSON
 * formats "ab"'s enum holds the closing tags, which must stay escaped. The
 * server's parser reads text the tokenizer's decoder has made valid UTF-8:
 * other texts are left out of the schema check. Lazy (tool_choice auto, the
 * reasoning byte's third choice): a text the guard takes, where the output
 * may end, is text and any number of calls, each of one of the names with
 * arguments as above. */
#include "guard_check.h"

#include "../../src/base/utf8.h"
#include "../../src/chat/parser.h"
#include "../../src/chat/tool_grammar.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

struct seen {
    int calls, ends;
    int name;
    char args[4096];
    size_t n_args;
    bool args_cut;
    bool strict, valid; /* check each call's arguments against the schema (valid: the text is valid UTF-8) */
};

static const char *const names[] = {"a", "ab", "read_file"};

static bool fits(int name, json_t *args);

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct seen *s = ctx;
    if (ev->kind == CHAT_EV_TOOL_START) {
        s->calls++;
        s->name = -1;
        s->n_args = 0;
        s->args_cut = false;
        for (int i = 0; i < 3; i++)
            if (strcmp(ev->name, names[i]) == 0)
                s->name = i;
        if (s->name < 0)
            abort();
    } else if (ev->kind == CHAT_EV_TOOL_END) {
        s->ends++;
        if (!s->args_cut) {
            json_t *j = json_loadb(s->args, s->n_args, JSON_PRESERVE_ORDER, NULL);
            if (!json_is_object(j) || (s->strict && s->name > 0 && s->valid && !fits(s->name, j)))
                abort();
            json_decref(j);
        }
    } else if (ev->kind == CHAT_EV_TOOL_ARGS) {
        if (s->n_args + ev->len >= sizeof s->args)
            s->args_cut = true;
        else {
            memcpy(s->args + s->n_args, ev->text, ev->len);
            s->n_args += ev->len;
        }
    }
}

static json_t *schema_ab, *schema_ab_xml, *schema_read, *tools, *tools_xml;

/* Whether args is what the strict schema of names[name] describes. */
static bool fits(int name, json_t *args)
{
    if (name == 1) {
        const char *k = json_string_value(json_object_get(args, "k"));
        json_t *n = json_object_get(args, "n");
        return json_object_size(args) == 2 && k &&
               (!strcmp(k, "x") || !strcmp(k, "</tool_call>") || !strcmp(k, "</TOOLCALL>") || !strcmp(k, "y z")) &&
               (json_is_integer(n) || json_is_null(n)) && !strcmp(json_object_iter_key(json_object_iter(args)), "k");
    }
    json_t *o = json_object_get(args, "opts"), *v;
    size_t i;
    bool ok = json_object_size(args) == 2 && json_is_string(json_object_get(args, "path")) && json_is_array(o);
    json_array_foreach(o, i, v) ok &= json_is_boolean(v);
    return ok;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!schema_ab) {
        schema_ab = json_loads("{\"type\": \"object\", \"properties\": {\"k\": {\"enum\": [\"x\", \"</tool_call>\", "
                               "\"</TOOLCALL>\"]}, \"n\": {\"type\": [\"integer\", \"null\"]}}}",
                               0, NULL);
        schema_ab_xml = json_loads("{\"type\": \"object\", \"properties\": {\"k\": {\"enum\": [\"x\", \"y z\"]}, "
                                   "\"n\": {\"type\": [\"integer\", \"null\"]}}}",
                                   0, NULL);
        schema_read = json_loads("{\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}, \"opts\": "
                                 "{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}}}}",
                                 0, NULL);
        tools = json_pack("[{s:{s:s,s:O}},{s:{s:s,s:O}}]", "function", "name", "ab", "parameters", schema_ab, "function",
                          "name", "read_file", "parameters", schema_read);
        tools_xml = json_pack("[{s:{s:s,s:O}},{s:{s:s,s:O}}]", "function", "name", "ab", "parameters", schema_ab_xml,
                              "function", "name", "read_file", "parameters", schema_read);
    }
    if (size < 2)
        return 0;
    const enum chat_format fmt = (enum chat_format)(data[0] % 3);
    const enum chat_think think = (enum chat_think)(data[1] % 3);
    json_t *const schemas[3] = {NULL, fmt == CHAT_FMT_XML ? schema_ab_xml : schema_ab, schema_read};
    const bool lazy = data[1] / 6 % 2, strict = lazy || data[1] / 3 % 2;
    const char *text = (const char *)data + 2;
    const size_t n = size - 2;
    struct grammar gm;
    grammar_init(&gm);
    if (chat_tool_grammar(&gm, fmt, names, strict ? schemas : NULL, 3, think, lazy) != 0)
        abort();
    const bool taken = guard_takes(&gm, text, n, lazy);
    if (taken && !json_beyond_jansson(text, n)) {
        struct seen s = {.strict = strict, .valid = utf8_valid_prefix(text, n) == n};
        struct chat_parser *p = chat_parser_new(fmt, think == CHAT_THINK_OPEN,
                                                strict ? (fmt == CHAT_FMT_XML ? tools_xml : tools) : NULL, on_event, &s);
        if (!p)
            abort();
        chat_parser_feed(p, text, n);
        chat_parser_finish(p);
        chat_parser_free(p);
        if ((!lazy && s.calls != 1) || s.ends != s.calls)
            abort();
    }
    grammar_free(&gm);
    return 0;
}
