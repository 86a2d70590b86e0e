/* jinja: the Jinja2 subset that Hugging Face chat templates use, rendered with
 * transformers' settings (ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, loopcontrols; tojson as Python's json.dumps with
 * ensure_ascii=False; str() of values as Python prints them), so that a
 * rendered prompt is byte-identical to apply_chat_template's.
 *
 * Supported: {{ }}, {% if/elif/else %}, {% for %} (tuple targets, inline
 * `if` filter, else, loop.*, break/continue), {% set %} (names, namespace
 * attributes, tuples), {% macro %} and calls, {# #}, whitespace control;
 * expressions with Python operators, literals, slicing, filters, tests, string
 * and dict methods; globals namespace(), range(), dict(), raise_exception().
 *
 * Ownership: a struct jinja_tpl owns its AST (an arena). A render allocates in
 * its own arena and returns a malloc'd string. Renders are bounded in steps,
 * output size and recursion, so a hostile template ends with an error. */
#ifndef KP_JINJA_H
#define KP_JINJA_H

#include <jansson.h>
#include <stddef.h>

struct jinja_tpl;

/* NULL with err_set("jinja: line N: ...") on a syntax error. */
struct jinja_tpl *jinja_parse(const char *src, size_t len);
void jinja_free(struct jinja_tpl *t);

/* Renders with the variables of ctx (a JSON object: messages, tools,
 * add_generation_prompt, bos_token, ...). Returns a malloc'd NUL-terminated
 * string and its length, or NULL with err_set() ("jinja: line N: ..."), also
 * when the template calls raise_exception(). */
char *jinja_render(const struct jinja_tpl *t, json_t *ctx, size_t *len);

#endif
