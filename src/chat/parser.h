/* parser: the model's output text, streamed, split into what an API returns:
 * answer text, reasoning (<think>...</think>) and tool calls, for each model
 * family's tool-call format:
 *   CHAT_FMT_JSON      Qwen3:  <tool_call>{"name": N, "arguments": {...}}</tool_call>
 *   CHAT_FMT_XML       Qwen3-Coder, Qwen3.5, Nemotron 3:
 *                      <tool_call><function=N><parameter=P>value</parameter></function></tool_call>
 *                      (values converted with the tool's JSON-schema types)
 *   CHAT_FMT_TOOLCALL  Nemotron Nano v2: <TOOLCALL>[{"name": N, "arguments": {...}}, ...]</TOOLCALL>
 *
 * Feed text as it is generated, in pieces of any size; events come out as soon
 * as they are certain (a piece that may be the start of a tag is held back).
 * Feeding one byte at a time gives the same events, merged, as feeding all at
 * once. Tolerated: a missing closing tag at the end, a tool call opened inside
 * an unclosed <think>, whitespace around tags. Text that does not parse as a
 * tool call is returned as text, never dropped; the opening tag of one the
 * output ended in (cut by max_tokens) is left out, so that no markup shows.
 *
 * Ownership: the parser copies what it holds; event pointers are valid only
 * during the callback. */
#ifndef KP_PARSER_H
#define KP_PARSER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum chat_format { CHAT_FMT_JSON, CHAT_FMT_XML, CHAT_FMT_TOOLCALL };

enum chat_event_kind {
    CHAT_EV_TEXT,       /* text: answer text delta */
    CHAT_EV_REASONING,  /* text: reasoning delta */
    CHAT_EV_TOOL_START, /* tool_index, name */
    CHAT_EV_TOOL_ARGS,  /* tool_index, text: a fragment of the arguments JSON */
    CHAT_EV_TOOL_END,   /* tool_index */
};

struct chat_event {
    enum chat_event_kind kind;
    const char *text;
    size_t len;
    int32_t tool_index;
    const char *name;
};

typedef void (*chat_event_fn)(void *ctx, const struct chat_event *ev);

struct chat_parser;

/* in_reasoning: the prompt already opened <think> (generation starts inside it).
 * tools: the request's tool list (OpenAI shape), for XML value types; may be NULL. */
struct chat_parser *chat_parser_new(enum chat_format fmt, bool in_reasoning, json_t *tools, chat_event_fn fn,
                                    void *ctx);
void chat_parser_free(struct chat_parser *p);
/* -1 with err_set() only on allocation failure. */
int chat_parser_feed(struct chat_parser *p, const char *text, size_t len);
/* End of output: flushes what is held (an unclosed tool call that parses is
 * still a tool call). */
int chat_parser_finish(struct chat_parser *p);
int32_t chat_parser_n_tool_calls(const struct chat_parser *p);

#endif
