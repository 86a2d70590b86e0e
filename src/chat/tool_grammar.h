/* tool_grammar: a tool call in each chat format (parser.h's), as the grammar
 * that constrained decoding follows when a request forces a call (OpenAI's
 * tool_choice "required" or a named function, Anthropic's "any" or "tool"):
 * the opening tag, the function's name (one of the names given), its
 * arguments (a JSON object; for CHAT_FMT_XML, <parameter=P> blocks), the
 * closing tag; then the output ends. Whitespace may come where the formats
 * put newlines. The parser reads each such text back as one tool call.
 * A strict tool's parameter schema is enforced too.
 *
 * A reasoning block may come first: the output may start inside one the
 * prompt opened (CHAT_THINK_OPEN: free text up to </think>), or may open one
 * (CHAT_THINK_MAY).
 *
 * Lazy (tool_choice auto with a strict tool): text in which the output may
 * end, and wherever the text opens a call's tag, one call as above, then
 * text again; so the model chooses whether to call, and a call it makes
 * names a tool given and, for a strict tool, follows its schema. */
#ifndef KP_TOOL_GRAMMAR_H
#define KP_TOOL_GRAMMAR_H

#include "../grammar/grammar.h"
#include "parser.h"

#include <jansson.h>

enum chat_think { CHAT_THINK_NONE, CHAT_THINK_OPEN, CHAT_THINK_MAY };

/* Builds the grammar into g (grammar_init'ed, empty). A name must be 1 to 128
 * bytes of [A-Za-z0-9_.:-] (it is written into JSON and XML unescaped).
 * schemas: NULL, or for each name its parameters' JSON schema (json_schema.h's
 * subset; NULL: any object), which its arguments then follow (a strict
 * tool's; CHAT_FMT_XML: json_schema_xml_params's parameters). -1 with
 * err_set() on a bad name, a schema json_schema refuses, or when memory is
 * short. */
int chat_tool_grammar(struct grammar *g, enum chat_format fmt, const char *const *names, json_t *const *schemas,
                      int32_t n_names, enum chat_think think, bool lazy);

#endif
