/* openai: /v1/models and /v1/chat/completions in the OpenAI API's shapes
 * (non-streaming JSON and server-sent events with chat.completion.chunk). */
#define _GNU_SOURCE
#include "../base/err.h"
#include "gen.h"
#include "sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum MHD_Result openai_models(struct app *a, struct MHD_Connection *c, const char *id)
{
    if (id && strcmp(id, a->model_name) != 0)
        return http_openai_error(c, MHD_HTTP_NOT_FOUND, "invalid_request_error", "the model '%.200s' does not exist",
                                 id);
    /* fields of both APIs' model objects, so either SDK can list or
     * retrieve it, and the context length as vLLM names it, for agents
     * configured from it */
    json_t *m = json_pack("{s:s,s:s,s:i,s:s,s:s,s:s,s:s,s:I}", "id", a->model_name, "object", "model", "created", 0,
                          "owned_by", "kapitsa", "type", "model", "display_name", a->model_name, "created_at",
                          "1970-01-01T00:00:00Z", "max_model_len", (json_int_t)sched_n_ctx(a->sched));
    if (id)
        return http_json(c, MHD_HTTP_OK, m);
    return http_json(c, MHD_HTTP_OK,
                     json_pack("{s:s,s:[o],s:b,s:s,s:s}", "object", "list", "data", m, "has_more", 0, "first_id",
                               a->model_name, "last_id", a->model_name));
}

/* One response's state, shared by the non-streaming and streaming paths. */
struct oai {
    struct app *app;
    struct gen *gen;
    bool stream, include_usage, sent_done;
    bool completion; /* /v1/completions: text_completion objects */
    char id[48];
    long long created;
    /* accumulated (non-streaming) */
    json_t *tool_calls;
    char *content, *reasoning;
    size_t n_content, n_reasoning;
    struct sse out;
    /* log-probabilities asked for: entries go out with the chunk that follows their token */
    bool logprobs;
    int32_t lp_sent;
    int64_t lp_offset;
};

static void append(char **p, size_t *n, const char *s, size_t k)
{
    char *np = realloc(*p, *n + k + 1);
    if (!np)
        return;
    memcpy(np + *n, s, k);
    *n += k;
    np[*n] = 0;
    *p = np;
}

static void sse(struct oai *g, json_t *obj) { sse_event(&g->out, NULL, obj); }

/* The logprobs field for output tokens [lp_sent, to): null when not asked for. */
static json_t *lp_json(struct oai *g, int32_t to)
{
    if (!g->logprobs)
        return json_null();
    json_t *o;
    if (g->completion) {
        o = json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
        to = gen_logprobs(g->gen, g->lp_sent, to, true, o, &g->lp_offset);
    } else {
        json_t *content = json_array();
        to = gen_logprobs(g->gen, g->lp_sent, to, false, content, NULL);
        o = json_pack("{s:o,s:n}", "content", content, "refusal");
    }
    g->lp_sent = to;
    return o;
}

static json_t *chunk(struct oai *g, json_t *delta, const char *finish)
{
    /* while events flow, the token being fed is gen_n_seen(); at the end all are out */
    const int32_t to = finish ? gen_n_output(g->gen) : gen_n_seen(g->gen) + 1;
    if (g->completion) { /* a text_completion chunk: the delta's text is the choice's text */
        json_t *t = json_object_get(delta, "content");
        json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o,s:o}]}", "id", g->id, "object", "text_completion",
                              "created", (json_int_t)g->created, "model", g->app->model_name, "choices", "index", 0,
                              "text", t ? json_incref(t) : json_string(""), "logprobs", lp_json(g, to), "finish_reason",
                              finish ? json_string(finish) : json_null());
        json_decref(delta);
        return c;
    }
    return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o,s:o}]}", "id", g->id, "object", "chat.completion.chunk",
                     "created", (json_int_t)g->created, "model", g->app->model_name, "choices", "index", 0, "delta",
                     delta, "logprobs", lp_json(g, to), "finish_reason", finish ? json_string(finish) : json_null());
}

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct oai *g = ctx;
    json_t *call;
    switch (ev->kind) {
    case CHAT_EV_TEXT:
    case CHAT_EV_REASONING: {
        bool r = ev->kind == CHAT_EV_REASONING;
        if (g->stream)
            sse(g, chunk(g, json_pack("{s:s%}", r ? "reasoning_content" : "content", ev->text, ev->len), NULL));
        else if (r)
            append(&g->reasoning, &g->n_reasoning, ev->text, ev->len);
        else
            append(&g->content, &g->n_content, ev->text, ev->len);
        break;
    }
    case CHAT_EV_TOOL_START: {
        char id[48];
        snprintf(id, sizeof id, "call_%s_%d", g->id + 9, ev->tool_index);
        call = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name", ev->name,
                         "arguments", "");
        if (g->stream) {
            json_object_set_new(call, "index", json_integer(ev->tool_index));
            sse(g, chunk(g, json_pack("{s:[o]}", "tool_calls", call), NULL));
        } else {
            json_array_append_new(g->tool_calls, call);
        }
        break;
    }
    case CHAT_EV_TOOL_ARGS:
        if (g->stream) {
            sse(g, chunk(g, json_pack("{s:[{s:i,s:{s:s%}}]}", "tool_calls", "index", ev->tool_index, "function",
                                      "arguments", ev->text, ev->len), NULL));
        } else {
            json_t *fn = json_object_get(json_array_get(g->tool_calls, (size_t)ev->tool_index), "function");
            const char *old = json_string_value(json_object_get(fn, "arguments"));
            size_t on = json_string_length(json_object_get(fn, "arguments"));
            char *joined = malloc(on + ev->len + 1);
            if (joined) {
                memcpy(joined, old, on);
                memcpy(joined + on, ev->text, ev->len);
                json_object_set_new(fn, "arguments", json_stringn(joined, on + ev->len));
                free(joined);
            }
        }
        break;
    case CHAT_EV_TOOL_END: break;
    }
}

static void oai_free(struct oai *g)
{
    if (!g)
        return;
    gen_free(g->gen);
    json_decref(g->tool_calls);
    free(g->content);
    free(g->reasoning);
    sse_free(&g->out);
    free(g);
}

static const char *finish_reason(struct oai *g)
{
    if (gen_n_tool_calls(g->gen) > 0)
        return "tool_calls";
    return gen_finish(g->gen) == SCHED_LENGTH ? "length" : "stop";
}

static json_t *usage(struct oai *g)
{
    int32_t p = gen_n_prompt(g->gen), o = gen_n_output(g->gen);
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", p, "completion_tokens", o, "total_tokens", p + o,
                     "prompt_tokens_details", "cached_tokens", gen_n_cached(g->gen));
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    struct oai *g = cls;
    size_t k;
    while ((k = sse_take(&g->out, out, max)) == 0) {
        if (g->sent_done)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (gen_finished(g->gen)) {
            if (gen_error_status(g->gen)) {
                sse(g, json_pack("{s:{s:s,s:s}}", "error", "message", gen_error(g->gen), "type", "server_error"));
            } else {
                sse(g, chunk(g, json_object(), finish_reason(g)));
                if (g->include_usage) {
                    json_t *u = chunk(g, json_object(), NULL);
                    json_object_set_new(u, "choices", json_array());
                    json_object_set_new(u, "usage", usage(g));
                    sse(g, u);
                }
            }
            sse_raw(&g->out, "data: [DONE]\n\n");
            g->sent_done = true;
            continue;
        }
        if (!gen_pump_for(g->gen, g->app->keepalive_s))
            sse_raw(&g->out, ": keep-alive\n\n"); /* an SSE comment: clients skip it */
    }
    return (ssize_t)k;
}

static void oai_reader_free(void *cls) { oai_free(cls); }

/* Reads the OpenAI sampling fields; -1 with a message in err on a bad value. */
static int read_params(const struct app *a, json_t *b, struct sampler_params *sp, int32_t *max_tokens, char *err,
                       size_t n_err)
{
    json_t *v;
    if (gen_sampling(b, &a->rt.m.cfg, 2.0f, sp, err, n_err) != 0)
        return -1;
    v = json_object_get(b, "max_completion_tokens");
    if (!v || json_is_null(v))
        v = json_object_get(b, "max_tokens");
    if (v && !json_is_null(v)) {
        if (gen_max_tokens(v, max_tokens) != 0)
            return snprintf(err, n_err, "max_tokens must be a positive integer"), -1;
    }
    if ((v = json_object_get(b, "n")) && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != 1))
        return snprintf(err, n_err, "only n=1 is supported"), -1;
    return 0;
}

/* Runs a prepared request: streams it, or answers with one JSON object. */
static enum MHD_Result oai_run(struct app *a, struct MHD_Connection *c, struct oai *g, struct gen_opts *go, json_t *body)
{
    char perr[512];
    g->app = a;
    json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream)) {
        oai_free(g);
        return http_openai_error(c, 400, "invalid_request_error", "'stream' must be a boolean");
    }
    g->stream = json_is_true(stream);
    g->include_usage = json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage"));
    g->created = (long long)time(NULL);
    snprintf(g->id, sizeof g->id, "%s-%016llx", g->completion ? "cmpl" : "chatcmpl", (unsigned long long)gen_random());
    g->tool_calls = json_array();
    go->fn = on_event;
    go->ctx = g;
    json_t *stop = json_object_get(body, "stop");
    go->stop = json_is_null(stop) ? NULL : stop;
    enum gen_refusal why = GEN_INVALID;
    go->ignore_eos = json_is_true(json_object_get(body, "ignore_eos"));
    go->logprobs = -1;
    json_t *lp = json_object_get(body, "logprobs"), *top = json_object_get(body, "top_logprobs");
    if (g->completion && lp && !json_is_null(lp)) { /* completions: logprobs is the number of alternatives */
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > 5) {
            oai_free(g);
            return http_openai_error(c, 400, "invalid_request_error", "logprobs must be an integer from 0 to 5");
        }
        go->logprobs = (int32_t)json_integer_value(lp);
    } else if (!g->completion && (json_is_true(lp) || (top && !json_is_null(top)))) {
        if (!json_is_true(lp) || (top && !json_is_null(top) && (!json_is_integer(top) || json_integer_value(top) < 0 ||
                                                                json_integer_value(top) > 20))) {
            oai_free(g);
            return http_openai_error(c, 400, "invalid_request_error",
                                     "top_logprobs must be an integer from 0 to 20, with logprobs: true");
        }
        go->logprobs = top && !json_is_null(top) ? (int32_t)json_integer_value(top) : 0;
    }
    g->logprobs = go->logprobs >= 0;
    if (read_params(a, body, &go->sp, &go->max_tokens, perr, sizeof perr) != 0 ||
        !(g->gen = gen_start(a, go, perr, sizeof perr, &why))) {
        oai_free(g);
        return why == GEN_OVERLOADED ? http_openai_error(c, 429, "rate_limit_error", "%s", perr)
               : why == GEN_STOPPING ? http_openai_error(c, 503, "server_error", "%s", perr)
                                     : http_openai_error(c, 400, "invalid_request_error", "%s", perr);
    }
    if (g->stream) {
        if (!g->completion)
            sse(g, chunk(g, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL));
        return sse_respond(c, sse_reader, g, oai_reader_free);
    }
    gen_wait(g->gen, c);
    if (gen_error_status(g->gen)) {
        enum MHD_Result r = http_openai_error(c, gen_error_status(g->gen), "server_error", "%s", gen_error(g->gen));
        oai_free(g);
        return r;
    }
    json_t *resp;
    if (g->completion) {
        resp = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:s%,s:o,s:s}],s:o}", "id", g->id, "object", "text_completion",
                         "created", (json_int_t)g->created, "model", a->model_name, "choices", "index", 0, "text",
                         g->content ? g->content : "", g->n_content, "logprobs", lp_json(g, gen_n_output(g->gen)),
                         "finish_reason", finish_reason(g), "usage", usage(g));
    } else {
        json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", g->content ? g->content : "", g->n_content);
        if (g->n_reasoning)
            json_object_set_new(msg, "reasoning_content", json_stringn(g->reasoning, g->n_reasoning));
        if (json_array_size(g->tool_calls))
            json_object_set(msg, "tool_calls", g->tool_calls);
        resp = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:s,s:o}],s:o}", "id", g->id, "object", "chat.completion",
                         "created", (json_int_t)g->created, "model", a->model_name, "choices", "index", 0, "message",
                         msg, "finish_reason", finish_reason(g), "logprobs", lp_json(g, gen_n_output(g->gen)), "usage",
                         usage(g));
    }
    oai_free(g);
    return http_json(c, MHD_HTTP_OK, resp);
}

enum MHD_Result openai_chat(struct app *a, struct MHD_Connection *c, json_t *body)
{
    json_t *msgs = json_object_get(body, "messages"), *tools = json_object_get(body, "tools");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return http_openai_error(c, 400, "invalid_request_error", "'messages' must be a non-empty array");
    size_t i;
    json_t *m;
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    json_array_foreach(msgs, i, m) {
        const char *role = json_is_object(m) ? json_string_value(json_object_get(m, "role")) : NULL;
        size_t r = 0;
        while (role && r < sizeof roles / sizeof *roles && strcmp(role, roles[r]) != 0)
            r++;
        if (!role || r == sizeof roles / sizeof *roles)
            return http_openai_error(c, 400, "invalid_request_error",
                                     "messages[%zu].role must be one of system, developer, user, assistant, tool, "
                                     "function",
                                     i);
    }
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return http_openai_error(c, 400, "invalid_request_error", "'tools' must be an array");
    enum gen_tools choice;
    const char *tool_name;
    char terr[256];
    bool json, strict;
    json_t *schema;
    if (gen_tool_choice(json_object_get(body, "tool_choice"), false, &choice, &tool_name, terr, sizeof terr) != 0 ||
        gen_response_format(json_object_get(body, "response_format"), "response_format", &json, &schema, &strict,
                            terr, sizeof terr) != 0)
        return http_openai_error(c, 400, "invalid_request_error", "%s", terr);
    if (choice == GEN_TOOLS_NONE || json_is_null(tools) || (json_is_array(tools) && json_array_size(tools) == 0))
        tools = NULL;
    struct oai *g = calloc(1, sizeof *g);
    if (!g)
        return MHD_NO;
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    struct gen_opts go = {.messages = msgs, .tools = tools, .kwargs = json_is_object(kw) ? kw : NULL, .json = json,
                          .schema = schema, .schema_strict = strict, .tool_choice = choice, .tool_name = tool_name,
                          .one_call = json_is_false(json_object_get(body, "parallel_tool_calls"))};
    return oai_run(a, c, g, &go, body);
}

enum MHD_Result openai_completions(struct app *a, struct MHD_Connection *c, json_t *body)
{
    json_t *prompt = json_object_get(body, "prompt");
    if (json_is_array(prompt) && json_array_size(prompt) == 1)
        prompt = json_array_get(prompt, 0);
    if (!json_is_string(prompt) || json_string_length(prompt) == 0)
        return http_openai_error(c, 400, "invalid_request_error", "'prompt' must be a non-empty string");
    struct oai *g = calloc(1, sizeof *g);
    if (!g)
        return MHD_NO;
    g->completion = true;
    struct gen_opts go = {.raw_prompt = prompt};
    return oai_run(a, c, g, &go, body);
}
