/* convert: the Anthropic Messages and OpenAI Responses request bodies as
 * OpenAI-shaped chat messages and tools (see convert.h). */
#define _GNU_SOURCE
#include "convert.h"

#include "../chat/template.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* *acc (a string) followed by t's text (nothing when t is not a string) */
static void str_append(json_t **acc, json_t *t)
{
    size_t n0 = json_string_length(*acc), n1 = json_string_length(t);
    char *cat = malloc(n0 + n1 + 1);
    if (!cat)
        return;
    memcpy(cat, json_string_value(*acc), n0);
    memcpy(cat + n0, json_is_string(t) ? json_string_value(t) : "", n1);
    json_decref(*acc);
    *acc = json_stringn(cat, n0 + n1);
    free(cat);
}

json_t *convert_anthropic_messages(json_t *body, char *err, size_t n_err)
{
    json_t *out = json_array(), *sys = json_object_get(body, "system"), *msgs = json_object_get(body, "messages");
    if (sys && !json_is_null(sys))
        json_array_append_new(out, json_pack("{s:s,s:o}", "role", "system", "content", chat_content_text(sys)));
    size_t i, j;
    json_t *m, *b;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        /* Claude Code also sends system turns among the messages */
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")) ||
            !(json_is_string(content) || json_is_array(content))) {
            snprintf(err, n_err, "messages.%zu: role must be user, assistant or system and content a string or a list of blocks", i);
            json_decref(out);
            return NULL;
        }
        if (json_is_string(content) || !strcmp(role, "system")) {
            json_array_append_new(out, json_pack("{s:s,s:o}", "role", role, "content", chat_content_text(content)));
            continue;
        }
        bool user = role[0] == 'u';
        /* text and thinking blocks join in order (a turn with tool calls may think several times) */
        json_t *text = json_string(""), *thinking = json_string(""), *calls = json_array();
        bool thought = false; /* some thinking block had its text: reasoning_content is set, even empty */
        json_array_foreach(content, j, b) {
            const char *type = json_string_value(json_object_get(b, "type"));
            if (!type)
                type = "";
            if (!strcmp(type, "text")) {
                str_append(&text, json_object_get(b, "text"));
            } else if (!strcmp(type, "tool_result") && user) {
                json_array_append_new(out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id",
                                                     json_object_get(b, "tool_use_id"), "content",
                                                     chat_content_text(json_object_get(b, "content"))));
            } else if (!strcmp(type, "tool_use") && !user) {
                json_t *input = json_object_get(b, "input");
                json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", json_object_get(b, "id"), "type",
                                                       "function", "function", "name", json_object_get(b, "name"),
                                                       "arguments", input ? json_incref(input) : json_object()));
            } else if (!strcmp(type, "thinking") && !user) {
                thought |= json_is_string(json_object_get(b, "thinking"));
                str_append(&thinking, json_object_get(b, "thinking"));
            } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
                snprintf(err, n_err, "messages.%zu: %s blocks are not supported by this model", i, type);
                json_decref(text);
                json_decref(thinking);
                json_decref(calls);
                json_decref(out);
                return NULL;
            }
        }
        if (user && json_string_length(text) == 0) { /* only tool results */
            json_decref(text);
            json_decref(thinking);
            json_decref(calls);
            continue;
        }
        json_t *msg = json_pack("{s:s,s:o}", "role", role, "content", text);
        if (thought)
            json_object_set(msg, "reasoning_content", thinking);
        if (json_array_size(calls))
            json_object_set(msg, "tool_calls", calls);
        json_decref(thinking);
        json_decref(calls);
        json_array_append_new(out, msg);
    }
    return out;
}

json_t *convert_anthropic_tools(json_t *tools)
{
    if (!json_is_array(tools) || json_array_size(tools) == 0)
        return NULL;
    json_t *out = json_array(), *t;
    size_t i;
    json_array_foreach(tools, i, t) {
        if (!json_is_string(json_object_get(t, "name")))
            continue; /* server tools (web search, ...) have no schema for the model */
        json_t *fn = json_pack("{s:O}", "name", json_object_get(t, "name"));
        if (json_object_get(t, "description"))
            json_object_set(fn, "description", json_object_get(t, "description"));
        json_t *schema = json_object_get(t, "input_schema");
        json_object_set_new(fn, "parameters", schema ? json_incref(schema) : json_pack("{s:s}", "type", "object"));
        if (json_is_true(json_object_get(t, "strict"))) /* its input follows the schema when a call is forced */
            json_object_set(fn, "strict", json_true());
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    return out;
}

/* input items -> OpenAI chat messages; consecutive function calls join one assistant turn */
json_t *convert_responses_input(json_t *body, char *err, size_t n_err)
{
    json_t *out = json_array(), *input = json_object_get(body, "input"), *ins = json_object_get(body, "instructions");
    if (json_is_string(ins))
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    if (json_is_string(input)) {
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", input));
        return out;
    }
    if (!json_is_array(input)) {
        snprintf(err, n_err, "input must be a string or a list of items");
        json_decref(out);
        return NULL;
    }
    json_t *assistant = NULL; /* the assistant turn being assembled */
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!type || !strcmp(type, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                          strcmp(role, "developer"))) {
                snprintf(err, n_err, "input[%zu]: a message's role must be user, assistant, system or developer", i);
                json_decref(out);
                return NULL;
            }
            json_t *text = chat_content_text(json_object_get(it, "content"));
            if (!strcmp(role, "assistant")) {
                if (!assistant) {
                    assistant = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
                    json_array_append_new(out, assistant);
                }
                json_object_set_new(assistant, "content", text);
            } else {
                assistant = NULL;
                json_array_append_new(out, json_pack("{s:s,s:o}", "role", strcmp(role, "developer") ? role : "system",
                                                     "content", text));
            }
        } else if (!strcmp(type, "function_call")) {
            if (!assistant) {
                assistant = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
                json_array_append_new(out, assistant);
            }
            json_t *calls = json_object_get(assistant, "tool_calls");
            if (!calls) {
                calls = json_array();
                json_object_set_new(assistant, "tool_calls", calls);
            }
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(it, "call_id"), "type",
                                                   "function", "function", "name", json_object_get(it, "name"),
                                                   "arguments", json_object_get(it, "arguments")));
        } else if (!strcmp(type, "function_call_output")) {
            assistant = NULL;
            json_array_append_new(out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id",
                                                 json_object_get(it, "call_id"), "content",
                                                 chat_content_text(json_object_get(it, "output"))));
        } else if (!strcmp(type, "reasoning")) {
            if (!assistant) {
                assistant = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
                json_array_append_new(out, assistant);
            }
            json_t *c = json_object_get(it, "content");
            json_object_set_new(assistant, "reasoning_content",
                                chat_content_text(json_array_size(c) ? c : json_object_get(it, "summary")));
        } /* other item types (web search calls, ...) carry nothing for this model */
    }
    return out;
}

json_t *convert_responses_tools(json_t *tools)
{
    if (!json_is_array(tools))
        return NULL;
    json_t *out = json_array(), *t;
    size_t i;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") || !json_is_string(json_object_get(t, "name")))
            continue; /* built-in tool types are ignored, not rejected */
        json_t *fn = json_pack("{s:O}", "name", json_object_get(t, "name"));
        if (json_object_get(t, "description"))
            json_object_set(fn, "description", json_object_get(t, "description"));
        json_t *p = json_object_get(t, "parameters");
        json_object_set_new(fn, "parameters", p ? json_incref(p) : json_pack("{s:s}", "type", "object"));
        if (json_is_true(json_object_get(t, "strict"))) /* its arguments follow the schema when a call is forced */
            json_object_set(fn, "strict", json_true());
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    if (json_array_size(out) == 0) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* ---- one response ---- */
