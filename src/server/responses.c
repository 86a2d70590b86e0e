/* responses: POST /v1/responses, the OpenAI Responses API that Codex uses.
 * Input items (messages with input_text/output_text parts, function_call,
 * function_call_output, reasoning) become the template's message list;
 * output items are reasoning, message (output_text) and function_call, as one
 * response object or as the streaming events response.created, in_progress,
 * output_item.added, content_part.added, output_text.delta, ...done,
 * function_call_arguments.delta/.done, output_item.done, response.completed.
 * Responses are stored (resp_store.h) unless the request says store: false, so
 * that previous_response_id, item_reference items and GET /v1/responses/{id}
 * find them; an id the store does not hold gets a 400. */
#define _GNU_SOURCE
#include "../base/err.h"
#include "convert.h"
#include "gen.h"
#include "resp_store.h"
#include "sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum item { I_NONE, I_MESSAGE, I_REASONING, I_CALL };

struct resp {
    struct app *app;
    struct gen *gen;
    bool stream, done;
    bool store;        /* kept in the app's store once complete */
    json_t *input;     /* the input items answered: previous_response_id's and item_reference's expanded */
    json_t *prev_id;   /* previous_response_id, or NULL */
    char id[40];
    long long created;
    int32_t seq;       /* sequence_number of the next event */
    json_t *output;    /* finished items */
    enum item open;
    json_t *cur;       /* the open item */
    char *text;        /* its text or arguments so far */
    size_t n_text;
    struct sse out;
};

static void put(struct resp *r, const char *event, json_t *data)
{
    json_object_set_new(data, "type", json_string(event));
    json_object_set_new(data, "sequence_number", json_integer(r->seq++));
    sse_event(&r->out, event, data);
}

static json_t *usage(struct resp *r)
{
    int32_t p = gen_n_prompt(r->gen), o = gen_n_output(r->gen);
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", p, "input_tokens_details", "cached_tokens",
                     gen_n_cached(r->gen),
                     "output_tokens", o, "output_tokens_details", "reasoning_tokens", 0, "total_tokens", p + o);
}

static json_t *response_obj(struct resp *r, const char *status)
{
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:O,s:n,s:n,s:b,s:b,s:O}", "id", r->id, "object", "response",
                          "created_at", (json_int_t)r->created, "status", status, "model", r->app->model_name, "output",
                          r->output, "error", "incomplete_details", "parallel_tool_calls", 1, "store", r->store,
                          "previous_response_id", r->prev_id ? r->prev_id : json_null());
    if (!strcmp(status, "completed") || !strcmp(status, "incomplete"))
        json_object_set_new(o, "usage", usage(r));
    if (!strcmp(status, "incomplete"))
        json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    return o;
}

static int32_t out_index(struct resp *r) { return (int32_t)json_array_size(r->output); }

static void close_item(struct resp *r)
{
    if (r->open == I_NONE)
        return;
    const char *id = json_string_value(json_object_get(r->cur, "id"));
    /* the item open when max_output_tokens ended the output is incomplete, as its response is */
    const char *status = gen_finished(r->gen) && gen_finish(r->gen) == SCHED_LENGTH ? "incomplete" : "completed";
    json_t *txt = json_stringn(r->text ? r->text : "", r->n_text);
    if (r->open == I_MESSAGE) {
        json_t *part = json_pack("{s:s,s:O,s:[]}", "type", "output_text", "text", txt, "annotations");
        if (r->stream) {
            put(r, "response.output_text.done", json_pack("{s:s,s:i,s:i,s:O}", "item_id", id, "output_index",
                                                         out_index(r), "content_index", 0, "text", txt));
            put(r, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:O}", "item_id", id, "output_index",
                                                           out_index(r), "content_index", 0, "part", part));
        }
        json_object_set_new(r->cur, "content", json_pack("[o]", part));
        json_object_set_new(r->cur, "status", json_string(status));
    } else if (r->open == I_REASONING) {
        if (r->stream)
            put(r, "response.reasoning_text.done", json_pack("{s:s,s:i,s:i,s:O}", "item_id", id, "output_index",
                                                            out_index(r), "content_index", 0, "text", txt));
        json_object_set_new(r->cur, "content", json_pack("[{s:s,s:O}]", "type", "reasoning_text", "text", txt));
    } else {
        if (r->stream)
            put(r, "response.function_call_arguments.done", json_pack("{s:s,s:i,s:O}", "item_id", id, "output_index",
                                                                      out_index(r), "arguments", txt));
        json_object_set(r->cur, "arguments", txt);
        json_object_set_new(r->cur, "status", json_string(status));
    }
    json_decref(txt);
    if (r->stream)
        put(r, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", out_index(r), "item", r->cur));
    json_array_append_new(r->output, r->cur);
    r->cur = NULL;
    free(r->text);
    r->text = NULL;
    r->n_text = 0;
    r->open = I_NONE;
}

static void open_item(struct resp *r, enum item kind, json_t *item)
{
    close_item(r);
    r->open = kind;
    r->cur = item;
    if (!r->stream)
        return;
    put(r, "response.output_item.added", json_pack("{s:i,s:O}", "output_index", out_index(r), "item", item));
    if (kind == I_MESSAGE)
        put(r, "response.content_part.added",
            json_pack("{s:O,s:i,s:i,s:{s:s,s:s,s:[]}}", "item_id", json_object_get(item, "id"), "output_index",
                      out_index(r), "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

static void add_text(struct resp *r, const char *s, size_t n)
{
    char *nt = realloc(r->text, r->n_text + n + 1);
    if (!nt)
        return;
    memcpy(nt + r->n_text, s, n);
    r->text = nt;
    r->n_text += n;
}

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct resp *r = ctx;
    char id[64];
    snprintf(id, sizeof id, "%s_%s_%d", ev->kind == CHAT_EV_REASONING ? "rs" : ev->kind == CHAT_EV_TEXT ? "msg" : "fc",
             r->id + 5, out_index(r));
    switch (ev->kind) {
    case CHAT_EV_TEXT:
        if (r->open != I_MESSAGE)
            open_item(r, I_MESSAGE, json_pack("{s:s,s:s,s:s,s:s,s:[]}", "type", "message", "id", id, "status",
                                              "in_progress", "role", "assistant", "content"));
        add_text(r, ev->text, ev->len);
        if (r->stream)
            put(r, "response.output_text.delta", json_pack("{s:O,s:i,s:i,s:s%}", "item_id", json_object_get(r->cur, "id"),
                                                          "output_index", out_index(r), "content_index", 0, "delta",
                                                          ev->text, ev->len));
        break;
    case CHAT_EV_REASONING:
        if (r->open != I_REASONING)
            open_item(r, I_REASONING, json_pack("{s:s,s:s,s:[]}", "type", "reasoning", "id", id, "summary"));
        add_text(r, ev->text, ev->len);
        if (r->stream)
            put(r, "response.reasoning_text.delta", json_pack("{s:O,s:i,s:i,s:s%}", "item_id", json_object_get(r->cur, "id"),
                                                             "output_index", out_index(r), "content_index", 0, "delta",
                                                             ev->text, ev->len));
        break;
    case CHAT_EV_TOOL_START: {
        char call[64];
        snprintf(call, sizeof call, "call_%s_%d", r->id + 5, ev->tool_index);
        open_item(r, I_CALL, json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", id, "call_id", call,
                                       "name", ev->name, "arguments", "", "status", "in_progress"));
        break;
    }
    case CHAT_EV_TOOL_ARGS:
        add_text(r, ev->text, ev->len);
        if (r->stream)
            put(r, "response.function_call_arguments.delta",
                json_pack("{s:O,s:i,s:s%}", "item_id", json_object_get(r->cur, "id"), "output_index", out_index(r),
                          "delta", ev->text, ev->len));
        break;
    case CHAT_EV_TOOL_END: close_item(r); break;
    }
}

static const char *final_status(struct resp *r) { return gen_finish(r->gen) == SCHED_LENGTH ? "incomplete" : "completed"; }

/* The finished response object, kept in the store when the request asked. */
static json_t *final_obj(struct resp *r)
{
    json_t *o = response_obj(r, final_status(r));
    if (r->store && resp_store_put(r->app->responses, o, r->input) != 0)
        fprintf(stderr, "kapitsa: response %s not stored: %s\n", r->id, err_msg());
    return o;
}

static void resp_free(struct resp *r)
{
    if (!r)
        return;
    gen_free(r->gen);
    json_decref(r->output);
    json_decref(r->input);
    json_decref(r->prev_id);
    json_decref(r->cur);
    free(r->text);
    sse_free(&r->out);
    free(r);
}

static ssize_t resp_reader(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    struct resp *r = cls;
    size_t k;
    while ((k = sse_take(&r->out, out, max)) == 0) {
        if (r->done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (gen_finished(r->gen)) {
            close_item(r);
            if (gen_error_status(r->gen)) {
                json_t *o = response_obj(r, "failed");
                json_object_set_new(o, "error", json_pack("{s:s,s:s}", "code", "server_error", "message", gen_error(r->gen)));
                put(r, "response.failed", json_pack("{s:o}", "response", o));
            } else {
                const bool complete = !strcmp(final_status(r), "completed");
                put(r, complete ? "response.completed" : "response.incomplete", json_pack("{s:o}", "response", final_obj(r)));
            }
            r->done = true;
            continue;
        }
        if (!gen_pump_for(r->gen, r->app->keepalive_s))
            sse_raw(&r->out, ": keep-alive\n\n"); /* an SSE comment: clients skip it */
    }
    return (ssize_t)k;
}

static void resp_reader_free(void *cls) { resp_free(cls); }

/* The request's input items with the conversation they continue made
 * explicit: previous_response_id's input and output first, then the input
 * (a string as one user message), each item_reference replaced by the stored
 * item it names. NULL with a message in err, *param the field at fault and
 * *code OpenAI's error code for it. */
static json_t *expand_input(struct app *a, json_t *body, const char **param, const char **code, char *err,
                            size_t n_err)
{
    json_t *prev = json_object_get(body, "previous_response_id"), *input = json_object_get(body, "input");
    json_t *items = json_array(), *it;
    size_t i;
    *code = NULL;
    if (prev && !json_is_null(prev)) {
        json_t *pin = NULL, *pr = json_is_string(prev) ? resp_store_get(a->responses, json_string_value(prev), &pin) : NULL;
        if (!pr) {
            *param = "previous_response_id";
            *code = json_is_string(prev) ? "previous_response_not_found" : NULL;
            if (json_is_string(prev))
                snprintf(err, n_err, "previous_response_id: no response with id '%.100s' is stored here (unknown, "
                         "stored with store: false, or evicted to make room); send the whole conversation in input",
                         json_string_value(prev));
            else
                snprintf(err, n_err, "previous_response_id must be a string");
            json_decref(items);
            return NULL;
        }
        json_array_extend(items, pin);
        json_array_extend(items, json_object_get(pr, "output"));
        json_decref(pin);
        json_decref(pr);
    }
    if (json_is_string(input)) {
        json_array_append_new(items, json_pack("{s:s,s:s,s:O}", "type", "message", "role", "user", "content", input));
        return items;
    }
    json_array_foreach(input, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type || strcmp(type, "item_reference") != 0) {
            json_array_append(items, it);
            continue;
        }
        json_t *ref = json_object_get(it, "id");
        json_t *item = json_is_string(ref) ? resp_store_find_item(a->responses, json_string_value(ref)) : NULL;
        if (!item) {
            *param = "input";
            snprintf(err, n_err, "input[%zu]: item_reference '%.100s' names no stored item (unknown, stored with "
                     "store: false, or evicted to make room); send the item itself", i,
                     json_is_string(ref) ? json_string_value(ref) : "");
            json_decref(items);
            return NULL;
        }
        json_array_append_new(items, item);
    }
    return items;
}

enum MHD_Result openai_responses(struct app *a, struct MHD_Connection *c, json_t *body)
{
    char err[512];
    json_t *v, *store = json_object_get(body, "store");
    if (store && !json_is_boolean(store) && !json_is_null(store))
        return http_openai_error(c, 400, "invalid_request_error", "store must be a boolean");
    json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        return http_openai_error(c, 400, "invalid_request_error", "'stream' must be a boolean");
    struct gen_opts go = {0};
    if (gen_sampling(body, &a->rt.m.cfg, 2.0f, &go.sp, err, sizeof err) != 0 ||
        gen_tool_choice(json_object_get(body, "tool_choice"), false, &go.tool_choice, &go.tool_name, err, sizeof err) != 0 ||
        gen_response_format(json_object_get(json_object_get(body, "text"), "format"), "text.format", &go.json,
                            &go.schema, &go.schema_strict, err, sizeof err) != 0)
        return http_openai_error(c, 400, "invalid_request_error", "%s", err);
    if ((v = json_object_get(body, "max_output_tokens")) && !json_is_null(v)) {
        if (gen_max_tokens(v, &go.max_tokens) != 0)
            return http_openai_error(c, 400, "invalid_request_error", "max_output_tokens must be a positive integer");
    }
    go.one_call = json_is_false(json_object_get(body, "parallel_tool_calls"));
    const char *param = "input", *code = NULL;
    json_t *items = NULL, *in = json_object_get(body, "input");
    if ((json_is_string(in) || json_is_array(in)) && !(items = expand_input(a, body, &param, &code, err, sizeof err)))
        return http_json(c, 400, json_pack("{s:{s:s,s:s,s:s,s:s?}}", "error", "message", err, "type",
                                           "invalid_request_error", "param", param, "code", code));
    json_t *expanded = json_copy(body);
    if (items)
        json_object_set(expanded, "input", items);
    json_t *msgs = expanded ? convert_responses_input(expanded, err, sizeof err) : NULL;
    json_decref(expanded);
    if (!msgs) {
        json_decref(items);
        return http_openai_error(c, 400, "invalid_request_error", "%s", err);
    }
    json_t *tools = go.tool_choice != GEN_TOOLS_NONE ? convert_responses_tools(json_object_get(body, "tools")) : NULL;
    json_t *effort = json_object_get(json_object_get(body, "reasoning"), "effort");
    json_t *kw = json_is_string(effort) ? json_pack("{s:b}", "enable_thinking", strcmp(json_string_value(effort), "minimal") != 0) : NULL;
    struct resp *r = calloc(1, sizeof *r);
    if (!r) {
        json_decref(msgs);
        json_decref(tools);
        json_decref(kw);
        json_decref(items);
        return MHD_NO;
    }
    r->app = a;
    r->stream = json_is_true(stream);
    r->store = !json_is_false(store) && items;
    r->input = items;
    r->prev_id = json_is_string(json_object_get(body, "previous_response_id"))
                     ? json_incref(json_object_get(body, "previous_response_id")) : NULL;
    r->created = (long long)time(NULL);
    r->output = json_array();
    snprintf(r->id, sizeof r->id, "resp_%016llx", (unsigned long long)gen_random());
    go.messages = msgs;
    go.tools = tools;
    go.kwargs = kw;
    go.fn = on_event;
    go.ctx = r;
    enum gen_refusal why;
    r->gen = gen_start(a, &go, err, sizeof err, &why);
    json_decref(msgs);
    json_decref(tools);
    json_decref(kw);
    if (!r->gen) {
        resp_free(r);
        if (why == GEN_OVERLOADED)
            return http_openai_error(c, 429, "rate_limit_error", "%s", err);
        if (why == GEN_STOPPING)
            return http_openai_error(c, 503, "server_error", "%s", err);
        if (strstr(err, "context"))
            return http_json(c, 400, json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", err, "type",
                                               "invalid_request_error", "param", "code", "context_length_exceeded"));
        return http_openai_error(c, 400, "invalid_request_error", "%s", err);
    }
    if (r->stream) {
        put(r, "response.created", json_pack("{s:o}", "response", response_obj(r, "in_progress")));
        put(r, "response.in_progress", json_pack("{s:o}", "response", response_obj(r, "in_progress")));
        return sse_respond(c, resp_reader, r, resp_reader_free);
    }
    gen_wait(r->gen, c);
    close_item(r);
    if (gen_error_status(r->gen)) {
        enum MHD_Result e = http_openai_error(c, gen_error_status(r->gen), "server_error", "%s", gen_error(r->gen));
        resp_free(r);
        return e;
    }
    json_t *o = final_obj(r);
    resp_free(r);
    return http_json(c, MHD_HTTP_OK, o);
}

enum MHD_Result openai_response_get(struct app *a, struct MHD_Connection *c, const char *id)
{
    json_t *o = resp_store_get(a->responses, id, NULL);
    if (!o)
        return http_openai_error(c, MHD_HTTP_NOT_FOUND, "invalid_request_error",
                                 "no response with id '%.100s' is stored (unknown, stored with store: false, or "
                                 "evicted to make room)", id);
    return http_json(c, MHD_HTTP_OK, o);
}
