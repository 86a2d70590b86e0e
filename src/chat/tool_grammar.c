/* tool_grammar: the grammar of one tool call in the three formats the
 * parser reads (Qwen3's JSON in <tool_call>, Nemotron Nano v2's <TOOLCALL>
 * list, the XML of Qwen3-Coder / Qwen3.5 / Nemotron 3), as the models' chat
 * templates write them. See tool_grammar.h. */
#include "tool_grammar.h"

#include "../base/err.h"
#include "json_schema.h"

#include <stdio.h>
#include <string.h>

#define WS GRAMMAR_WS
#define JSON_ARGS_KEY "\"" WS "," WS "\"arguments\"" WS ":"

static int name_check(const char *s)
{
    const size_t n = strlen(s);
    if (n == 0 || n > 128 || strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-") != n)
        return err_set("tool_grammar: a forced tool's name must be 1 to 128 letters, digits or _.:- ('%.40s')", s);
    return 0;
}

/* After the grammar so far: for each name with a schema, a branch of its
 * own that NAME segment nm jumps to: the arguments the schema describes,
 * then the call's end, which goes on at after. Whatever a schema's grammar
 * sends to what follows it reaches its own branch's end. */
static int strict_branches(struct grammar *g, enum chat_format fmt, int32_t nm, json_t *const *schemas,
                           int32_t n_names, int32_t after)
{
    const bool list = fmt == CHAT_FMT_TOOLCALL;
    const char *close = list ? "</TOOLCALL>" : "</tool_call>";
    for (int32_t j = 0; schemas && j < n_names; j++) {
        if (!schemas[j])
            continue;
        grammar_name_jump(g, nm, j, g->n_seg);
        char err[256];
        if (grammar_lit(g, fmt == CHAT_FMT_XML ? ">" : JSON_ARGS_KEY) < 0)
            return -1;
        if ((fmt == CHAT_FMT_XML ? json_schema_xml_params(g, schemas[j], err, sizeof err)
                                 : json_schema_append(g, schemas[j], close, err, sizeof err)) != 0)
            return err_set("tool_grammar: %s", err);
        if (grammar_lit(g, fmt == CHAT_FMT_XML ? WS "</function>" WS "</tool_call>"
                           : list              ? WS "}" WS "]" WS "</TOOLCALL>"
                                               : WS "}" WS "</tool_call>") < 0)
            return -1;
        grammar_jump(g, g->n_seg - 1, -1, after);
    }
    return 0;
}

int chat_tool_grammar(struct grammar *g, enum chat_format fmt, const char *const *names, json_t *const *schemas,
                      int32_t n_names, enum chat_think think, bool lazy)
{
    for (int32_t j = 0; j < n_names; j++)
        if (name_check(names[j]) != 0)
            return -1;
    const char *open = fmt == CHAT_FMT_TOOLCALL ? "<TOOLCALL>" : "<tool_call>";
    int32_t alt = -1, until = -1, text = -1, ok = 0;
    if (lazy) {
        /* text in which the output may end, up to a call's tag (inside the
         * reasoning block the prompt opened, if any, first) */
        if (think == CHAT_THINK_OPEN && (ok |= until = grammar_until(g, "</think>", open, NULL)) >= 0)
            grammar_may_end(g, until);
        if ((ok |= text = grammar_until(g, open, NULL, NULL)) >= 0)
            grammar_may_end(g, text);
    } else {
        /* the reasoning block, then the opening tag; a reasoning block that
         * may come or not is a choice between its tag and the call's. The
         * call's tag also ends a reasoning block, as the parser reads it. */
        if (think == CHAT_THINK_MAY)
            ok |= alt = grammar_alt(g, "<think>", open);
        if (think != CHAT_THINK_NONE)
            ok |= until = grammar_until(g, "</think>", open, NULL);
        char tag[16];
        snprintf(tag, sizeof tag, WS "%s", open);
        ok |= grammar_lit(g, tag);
        if (alt >= 0) /* the call's tag at once: what follows it */
            grammar_jump(g, alt, 1, g->n_seg);
    }
    if (until >= 0)
        grammar_jump(g, until, 1, g->n_seg);
    /* after a call: the end, or more text */
    const int32_t after = lazy ? text : GRAMMAR_MAX_SEG;
    if (fmt == CHAT_FMT_XML) {
        ok |= grammar_lit(g, WS "<function=");
        const int32_t nm = grammar_names(g, names, n_names, false);
        ok |= nm;
        ok |= grammar_lit(g, ">");
        const int32_t more = grammar_alt(g, "<parameter=", "</function>");
        ok |= more;
        ok |= grammar_until(g, ">", NULL, "<\n");
        /* a value ends at its closing tag; the call's would end the call
         * for the parser, the parameter unclosed and split at any
         * "<parameter=" in it: no value holds it */
        const int32_t value = grammar_until(g, "</parameter>", "</tool_call>", NULL);
        ok |= value;
        if (value >= 0) {
            grammar_jump(g, value, -1, more);
            grammar_jump(g, value, 1, GRAMMAR_REFUSE);
        }
        if (more >= 0)
            grammar_jump(g, more, 1, g->n_seg);
        ok |= grammar_lit(g, WS "</tool_call>");
        if (ok >= 0) {
            grammar_jump(g, g->n_seg - 1, -1, after);
            ok |= strict_branches(g, fmt, nm, schemas, n_names, after);
        }
    } else {
        const bool list = fmt == CHAT_FMT_TOOLCALL;
        ok |= grammar_lit(g, list ? WS "[" WS "{" WS "\"name\"" WS ":" WS "\"" : WS "{" WS "\"name\"" WS ":" WS "\"");
        const int32_t nm = grammar_names(g, names, n_names, false);
        ok |= nm;
        ok |= grammar_lit(g, JSON_ARGS_KEY);
        ok |= grammar_json(g, list ? "</TOOLCALL>" : "</tool_call>"); /* the parser ends a call at its tag */
        ok |= grammar_lit(g, list ? WS "}" WS "]" WS "</TOOLCALL>" : WS "}" WS "</tool_call>");
        if (ok >= 0) {
            grammar_jump(g, g->n_seg - 1, -1, after);
            ok |= strict_branches(g, fmt, nm, schemas, n_names, after);
        }
    }
    return ok < 0 ? -1 : 0;
}
