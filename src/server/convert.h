/* convert: request bodies of the Anthropic Messages and OpenAI Responses APIs
 * as the OpenAI-shaped chat messages and function tools the chat templates
 * take (chat_messages_from_openai). Pure JSON to JSON: no model, no I/O, so
 * the request parsers can be fuzzed alone (tests/fuzz/fuzz_request.c).
 *
 * Ownership: results are new references for the caller; the body is borrowed. */
#ifndef KP_CONVERT_H
#define KP_CONVERT_H

#include <jansson.h>
#include <stddef.h>

/* system + messages (text, tool_use, tool_result, thinking blocks) -> messages;
 * NULL with a message in err for a malformed or unsupported message. */
json_t *convert_anthropic_messages(json_t *body, char *err, size_t n_err);
/* Anthropic tools (name, description, input_schema) -> OpenAI function tools;
 * server tools without a schema are left out. NULL when there are none. */
json_t *convert_anthropic_tools(json_t *tools);
/* instructions + input items (messages, function_call, function_call_output,
 * reasoning) -> messages; NULL with a message in err. */
json_t *convert_responses_input(json_t *body, char *err, size_t n_err);
/* Responses tools of type function -> OpenAI function tools; other tool types
 * are left out. NULL when there are none. */
json_t *convert_responses_tools(json_t *tools);

#endif
