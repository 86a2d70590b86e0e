/* template: a model's chat template and the special tokens it is rendered with,
 * as transformers' apply_chat_template does it.
 *
 * The template comes from tokenizer_config.json ("chat_template": a string, or
 * a list of {name, template} of which "default" is used) or from
 * chat_template.jinja beside it, or from an explicit file, or from an object
 * shaped like tokenizer_config.json (a GGUF file's metadata: see
 * model/gguf_vocab.h). Rendering passes messages, tools (None when absent),
 * documents (None), add_generation_prompt, the special tokens of
 * tokenizer_config.json (bos_token, eos_token, ... when set) and any extra
 * keyword arguments (enable_thinking, ...), which win.
 *
 * Ownership: struct chat_template owns its parsed template and token strings. */
#ifndef KP_TEMPLATE_H
#define KP_TEMPLATE_H

#include "parser.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct chat_template;

/* dir: the model folder; file (may be NULL) overrides the folder's template.
 * NULL with err_set() naming the file on failure. */
struct chat_template *chat_template_load(const char *dir, const char *file);
/* From a tokenizer_config.json-shaped object (borrowed): its chat_template and
 * special token names. what names it in errors. NULL with err_set() when it
 * has no chat_template or the template does not parse. */
struct chat_template *chat_template_from_config(json_t *cfg, const char *what);
void chat_template_free(struct chat_template *ct);

/* Renders; messages as transformers takes them (tool-call arguments as objects:
 * see chat_messages_from_openai). kwargs may be NULL. Returns a malloc'd string. */
char *chat_template_render(const struct chat_template *ct, json_t *messages, json_t *tools, bool add_generation_prompt,
                           json_t *kwargs, size_t *len);

/* The tool-call format the template teaches the model (XML if it shows
 * <function=...>, <TOOLCALL> for Nemotron v2, else Qwen3's JSON). */
enum chat_format chat_template_tool_format(const struct chat_template *ct);

/* The text of a message content: a string as it is, or the "text" fields of a
 * list of parts or blocks joined (other parts skipped). A new reference. */
json_t *chat_content_text(json_t *content);

/* A copy of OpenAI-style messages made ready for a template, as an API server
 * does before rendering: each tool call's "arguments" JSON string parsed into an
 * object (a string that is not a JSON object is kept), null content (an
 * assistant turn with only tool calls) made "", and a list of content parts
 * joined into its text. */
json_t *chat_messages_from_openai(json_t *messages);

#endif
