/* anthropic: POST /v1/messages and /v1/messages/count_tokens in Anthropic's
 * Messages API shapes: content blocks (text, thinking, tool_use, tool_result),
 * and the streaming event sequence message_start, ping, content_block_start /
 * _delta / _stop per block (text_delta, thinking_delta + signature_delta,
 * input_json_delta), message_delta with stop_reason and usage, message_stop. */
#define _GNU_SOURCE
#include "../base/err.h"
#include "convert.h"
#include "gen.h"
#include "sse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum MHD_Result http_anthropic_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    http_error_message(msg, sizeof msg, status, type, fmt, ap);
    va_end(ap);
    return http_json(c, status, json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", type, "message", msg));
}

/* Anthropic messages (+ system) as the OpenAI-shaped list the templates take. */
/* ---- one response ---- */

enum blk { B_NONE, B_TEXT, B_THINKING, B_TOOL };

struct ant {
    struct app *app;
    struct gen *gen;
    bool stream, started, done; /* started: message_start sent */
    char id[40];
    /* blocks */
    json_t *content;  /* non-streaming: the blocks */
    enum blk open;    /* the block being written */
    int32_t index;    /* its index */
    json_t *cur;      /* non-streaming: the open block */
    char *args;       /* tool input JSON so far */
    size_t n_args;
    struct sse out;
};

static void put(struct ant *s, const char *event, json_t *data) { sse_event(&s->out, event, data); }

static void close_block(struct ant *s)
{
    if (s->open == B_NONE)
        return;
    if (s->stream) {
        if (s->open == B_THINKING) /* local reasoning carries no signature; the field is there */
            put(s, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index",
                                                    s->index, "delta", "type", "signature_delta", "signature", ""));
        put(s, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", s->index));
    } else {
        if (s->open == B_TOOL) {
            json_t *input = json_loadb(s->args ? s->args : "{}", s->n_args ? s->n_args : 2, 0, NULL);
            json_object_set_new(s->cur, "input", json_is_object(input) ? input : json_object());
            if (!json_is_object(input))
                json_decref(input);
        }
        json_array_append_new(s->content, s->cur);
        s->cur = NULL;
    }
    free(s->args);
    s->args = NULL;
    s->n_args = 0;
    s->open = B_NONE;
    s->index++;
}

static void open_block(struct ant *s, enum blk b, json_t *start)
{
    close_block(s);
    s->open = b;
    if (s->stream)
        put(s, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", s->index,
                                                "content_block", start));
    else
        s->cur = start;
}

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct ant *s = ctx;
    switch (ev->kind) {
    case CHAT_EV_TEXT:
    case CHAT_EV_REASONING: {
        bool r = ev->kind == CHAT_EV_REASONING;
        enum blk want = r ? B_THINKING : B_TEXT;
        const char *field = r ? "thinking" : "text";
        if (s->open != want)
            open_block(s, want, r ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                                  : json_pack("{s:s,s:s}", "type", "text", "text", ""));
        if (s->stream) {
            put(s, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s%}}", "type", "content_block_delta", "index",
                                                    s->index, "delta", "type", r ? "thinking_delta" : "text_delta",
                                                    field, ev->text, ev->len));
        } else {
            json_t *old = json_object_get(s->cur, field);
            char *cat = malloc(json_string_length(old) + ev->len + 1);
            if (cat) {
                memcpy(cat, json_string_value(old), json_string_length(old));
                memcpy(cat + json_string_length(old), ev->text, ev->len);
                json_object_set_new(s->cur, field, json_stringn(cat, json_string_length(old) + ev->len));
                free(cat);
            }
        }
        break;
    }
    case CHAT_EV_TOOL_START: {
        char id[64];
        snprintf(id, sizeof id, "toolu_%s_%d", s->id + 4, ev->tool_index);
        open_block(s, B_TOOL, json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", id, "name", ev->name, "input"));
        break;
    }
    case CHAT_EV_TOOL_ARGS:
        if (s->stream) {
            put(s, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s%}}", "type", "content_block_delta", "index",
                                                    s->index, "delta", "type", "input_json_delta", "partial_json",
                                                    ev->text, ev->len));
        } else {
            char *na = realloc(s->args, s->n_args + ev->len + 1);
            if (na) {
                memcpy(na + s->n_args, ev->text, ev->len);
                s->args = na;
                s->n_args += ev->len;
            }
        }
        break;
    case CHAT_EV_TOOL_END: close_block(s); break;
    }
}

static const char *stop_reason(struct ant *s)
{
    if (gen_n_tool_calls(s->gen) > 0)
        return "tool_use";
    if (gen_stop_string(s->gen))
        return "stop_sequence";
    return gen_finish(s->gen) == SCHED_LENGTH ? "max_tokens" : "end_turn";
}

static json_t *stop_sequence(struct ant *s)
{
    const char *ss = gen_stop_string(s->gen);
    return ss ? json_string(ss) : json_null();
}

/* Anthropic's input_tokens leave out the cached ones: the prompt is input +
 * cache_creation + cache_read. */
static json_t *usage(struct ant *s, int32_t n_out)
{
    const int32_t cached = gen_n_cached(s->gen);
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", gen_n_prompt(s->gen) - cached, "output_tokens", n_out,
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens", cached);
}

static void message_start(struct ant *s)
{
    put(s, "message_start", json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}}", "type", "message_start", "message",
                                      "id", s->id, "type", "message", "role", "assistant", "model",
                                      s->app->model_name, "content", "stop_reason", "stop_sequence", "usage",
                                      usage(s, 0)));
    put(s, "ping", json_pack("{s:s}", "type", "ping"));
    s->started = true;
}

static void ant_free(struct ant *s)
{
    if (!s)
        return;
    gen_free(s->gen);
    json_decref(s->content);
    json_decref(s->cur);
    free(s->args);
    sse_free(&s->out);
    free(s);
}

static ssize_t ant_reader(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    struct ant *s = cls;
    size_t k;
    while ((k = sse_take(&s->out, out, max)) == 0) {
        if (s->done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (!s->started) { /* message_start names the cached tokens, known once the request is admitted */
            if (gen_admitted_for(s->gen, s->app->keepalive_s))
                message_start(s);
            else
                put(s, "ping", json_pack("{s:s}", "type", "ping"));
            continue;
        }
        if (gen_finished(s->gen)) {
            close_block(s);
            if (gen_error_status(s->gen)) {
                put(s, "error", json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", "api_error", "message",
                                          gen_error(s->gen)));
            } else {
                put(s, "message_delta", json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta",
                                                  "stop_reason", stop_reason(s), "stop_sequence", stop_sequence(s),
                                                  "usage", usage(s, gen_n_output(s->gen))));
                put(s, "message_stop", json_pack("{s:s}", "type", "message_stop"));
            }
            s->done = true;
            continue;
        }
        if (!gen_pump_for(s->gen, s->app->keepalive_s))
            put(s, "ping", json_pack("{s:s}", "type", "ping")); /* Anthropic's keep-alive event */
    }
    return (ssize_t)k;
}

static void ant_reader_free(void *cls) { ant_free(cls); }

/* The template's enable_thinking as the request's thinking asks (NULL: the
 * template's default). A call that tool_choice forces comes at once, without
 * reasoning first, as Anthropic's API has it (which refuses thinking there). */
static json_t *thinking_kwargs(json_t *body, enum gen_tools choice)
{
    const char *t = json_string_value(json_object_get(json_object_get(body, "thinking"), "type"));
    if (choice == GEN_TOOLS_ANY || choice == GEN_TOOLS_NAMED)
        return json_pack("{s:b}", "enable_thinking", 0);
    return t ? json_pack("{s:b}", "enable_thinking", strcmp(t, "enabled") == 0) : NULL;
}

/* Whether thinking is on together with a tool_choice that forces a call. */
static bool thinking_forced_call(json_t *body, enum gen_tools choice)
{
    const char *t = json_string_value(json_object_get(json_object_get(body, "thinking"), "type"));
    return t && strcmp(t, "enabled") == 0 && (choice == GEN_TOOLS_ANY || choice == GEN_TOOLS_NAMED);
}

/* Structured outputs: output_config.format, or the beta's output_format,
 * {"type": "json_schema", "schema": {...}}, the only type either takes. */
static int output_format(json_t *body, struct gen_opts *go, char *err, size_t n_err)
{
    json_t *ga = json_object_get(json_object_get(body, "output_config"), "format"),
           *beta = json_object_get(body, "output_format");
    ga = json_is_null(ga) ? NULL : ga;
    beta = json_is_null(beta) ? NULL : beta;
    if (ga && beta)
        return snprintf(err, n_err, "output_format and output_config.format: give one of them"), -1;
    if (!ga && !beta)
        return 0;
    const char *what = ga ? "output_config.format" : "output_format",
               *type = json_string_value(json_object_get(ga ? ga : beta, "type"));
    if (!type || strcmp(type, "json_schema") != 0)
        return snprintf(err, n_err, "%s: 'type' must be json_schema", what), -1;
    if (gen_response_format(ga ? ga : beta, what, &go->json, &go->schema, &go->schema_strict, err, n_err) != 0)
        return -1;
    go->schema_strict = true; /* Anthropic's structured outputs always follow the schema */
    return 0;
}

enum MHD_Result anthropic_count_tokens(struct app *a, struct MHD_Connection *c, json_t *body)
{
    char err[512];
    if (!json_is_array(json_object_get(body, "messages")))
        return http_anthropic_error(c, 400, "invalid_request_error", "messages: a list is required");
    enum gen_tools choice;
    const char *tool_name;
    if (gen_tool_choice(json_object_get(body, "tool_choice"), true, &choice, &tool_name, err, sizeof err) != 0)
        return http_anthropic_error(c, 400, "invalid_request_error", "%s", err);
    json_t *msgs = convert_anthropic_messages(body, err, sizeof err),
           *tools = choice != GEN_TOOLS_NONE ? convert_anthropic_tools(json_object_get(body, "tools")) : NULL;
    json_t *kw = thinking_kwargs(body, choice);
    int32_t n = msgs ? gen_count_tokens(a, msgs, tools, kw, err, sizeof err) : -1;
    json_decref(msgs);
    json_decref(tools);
    json_decref(kw);
    if (n < 0)
        return http_anthropic_error(c, 400, "invalid_request_error", "%s", err);
    return http_json(c, MHD_HTTP_OK, json_pack("{s:i}", "input_tokens", n));
}

/* Message threads (beta message-threads-*: a conversation the server keeps
 * between turns, each request sending only what is new) are not kept here.
 * error_code thread_unsupported_request is what @anthropic-ai/sdk's toolRunner
 * answers by sending the whole conversation again, without a thread. */
static enum MHD_Result thread_unsupported(struct MHD_Connection *c)
{
    const char *msg = "thread: message threads are not supported by this server; send the whole conversation "
                      "without 'thread'";
    fprintf(stderr, "kapitsa: error 400 invalid_request_error: %s\n", msg);
    return http_json(c, 400, json_pack("{s:s,s:{s:s,s:s,s:{s:s}}}", "type", "error", "error", "type",
                                       "invalid_request_error", "message", msg, "details", "error_code",
                                       "thread_unsupported_request"));
}

enum MHD_Result anthropic_messages(struct app *a, struct MHD_Connection *c, json_t *body)
{
    char err[512];
    json_t *thread = json_object_get(body, "thread");
    if (thread && !json_is_null(thread))
        return thread_unsupported(c);
    int32_t max_tokens;
    if (!json_is_array(json_object_get(body, "messages")) || json_array_size(json_object_get(body, "messages")) == 0)
        return http_anthropic_error(c, 400, "invalid_request_error", "messages: a non-empty list is required");
    if (gen_max_tokens(json_object_get(body, "max_tokens"), &max_tokens) != 0)
        return http_anthropic_error(c, 400, "invalid_request_error", "max_tokens: a positive integer is required");
    json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        return http_anthropic_error(c, 400, "invalid_request_error", "stream: a boolean is required");
    struct gen_opts go = {0};
    if (gen_sampling(body, &a->rt.m.cfg, 1.0f, &go.sp, err, sizeof err) != 0 ||
        gen_tool_choice(json_object_get(body, "tool_choice"), true, &go.tool_choice, &go.tool_name, err, sizeof err) != 0 ||
        output_format(body, &go, err, sizeof err) != 0)
        return http_anthropic_error(c, 400, "invalid_request_error", "%s", err);
    if (thinking_forced_call(body, go.tool_choice))
        return http_anthropic_error(c, 400, "invalid_request_error",
                                    "Thinking may not be enabled when tool_choice forces tool use.");
    go.max_tokens = max_tokens;
    go.ignore_eos = json_is_true(json_object_get(body, "ignore_eos")); /* the OpenAI endpoints' extension too */
    go.one_call = json_is_true(json_object_get(json_object_get(body, "tool_choice"), "disable_parallel_tool_use"));
    go.clamp = true; /* agents ask for more than a local context holds (Claude Code: 32000) */
    json_t *stops = json_object_get(body, "stop_sequences");
    go.stop = json_is_array(stops) ? stops : NULL;
    struct ant *s = calloc(1, sizeof *s);
    if (!s)
        return MHD_NO;
    s->app = a;
    s->stream = json_is_true(stream);
    s->content = json_array();
    snprintf(s->id, sizeof s->id, "msg_%016llx", (unsigned long long)gen_random());
    json_t *msgs = convert_anthropic_messages(body, err, sizeof err),
           *tools = go.tool_choice != GEN_TOOLS_NONE ? convert_anthropic_tools(json_object_get(body, "tools")) : NULL;
    json_t *kw = thinking_kwargs(body, go.tool_choice);
    go.messages = msgs;
    go.tools = tools;
    go.kwargs = kw;
    go.fn = on_event;
    go.ctx = s;
    enum gen_refusal why = GEN_INVALID;
    s->gen = msgs ? gen_start(a, &go, err, sizeof err, &why) : NULL;
    json_decref(msgs);
    json_decref(tools);
    json_decref(kw);
    if (!s->gen) {
        ant_free(s);
        return why == GEN_OVERLOADED ? http_anthropic_error(c, 529, "overloaded_error", "%s", err)
               : why == GEN_STOPPING ? http_anthropic_error(c, 503, "api_error", "%s", err)
                                     : http_anthropic_error(c, 400, "invalid_request_error", "%s", err);
    }
    if (s->stream) /* message_start waits in the reader for the request's admission */
        return sse_respond(c, ant_reader, s, ant_reader_free);
    gen_wait(s->gen, c);
    close_block(s);
    if (gen_error_status(s->gen)) {
        enum MHD_Result r = http_anthropic_error(c, gen_error_status(s->gen), "api_error", "%s", gen_error(s->gen));
        ant_free(s);
        return r;
    }
    json_t *resp = json_pack("{s:s,s:s,s:s,s:s,s:O,s:s,s:o,s:o}", "id", s->id, "type", "message", "role", "assistant",
                             "model", a->model_name, "content", s->content, "stop_reason", stop_reason(s),
                             "stop_sequence", stop_sequence(s), "usage", usage(s, gen_n_output(s->gen)));
    ant_free(s);
    return http_json(c, MHD_HTTP_OK, resp);
}
