/* libFuzzer target: the grammar of a forced tool call against the parser
 * that reads it. Input: a format byte, a reasoning byte, then the output
 * text. Fed whole and one byte at a time the guard must reach the same
 * verdict, and a text it takes as complete must be, for the parser, exactly
 * one call of one of the names with a JSON object of arguments (texts with
 * \u escapes or numbers jansson cannot hold are left out of that check, as
 * in fuzz_json_guard). */
#include "guard_check.h"

#include "../../src/chat/parser.h"
#include "../../src/chat/tool_grammar.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

struct seen {
    int calls;
    bool known;
    char args[4096];
    size_t n_args;
    bool args_cut;
};

static const char *const names[] = {"a", "ab", "read_file"};

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct seen *s = ctx;
    if (ev->kind == CHAT_EV_TOOL_START) {
        s->calls++;
        s->known = false;
        for (int i = 0; i < 3; i++)
            s->known |= strcmp(ev->name, names[i]) == 0;
    } else if (ev->kind == CHAT_EV_TOOL_ARGS) {
        if (s->n_args + ev->len >= sizeof s->args)
            s->args_cut = true;
        else {
            memcpy(s->args + s->n_args, ev->text, ev->len);
            s->n_args += ev->len;
        }
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size < 2)
        return 0;
    const enum chat_format fmt = (enum chat_format)(data[0] % 3);
    const enum chat_think think = (enum chat_think)(data[1] % 3);
    const char *text = (const char *)data + 2;
    const size_t n = size - 2;
    struct grammar gm;
    grammar_init(&gm);
    if (chat_tool_grammar(&gm, fmt, names, 3, think) != 0)
        abort();
    if (guard_complete(&gm, text, n) && !json_beyond_jansson(text, n)) {
        struct seen s = {0};
        struct chat_parser *p = chat_parser_new(fmt, think == CHAT_THINK_OPEN, NULL, on_event, &s);
        if (!p)
            abort();
        chat_parser_feed(p, text, n);
        chat_parser_finish(p);
        chat_parser_free(p);
        if (s.calls != 1 || !s.known)
            abort();
        if (!s.args_cut) {
            json_t *j = json_loadb(s.args, s.n_args, 0, NULL);
            if (!json_is_object(j))
                abort();
            json_decref(j);
        }
    }
    grammar_free(&gm);
    return 0;
}
