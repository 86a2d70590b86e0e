/* gen: chat messages -> prompt -> scheduler -> output events (see gen.h). */
#define _GNU_SOURCE
#include "gen.h"

#include "../base/err.h"
#include "../chat/json_schema.h"
#include "../chat/tool_grammar.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define GEN_POLL_S 0.1 /* the longest a blocked handler goes without looking at its client */

struct gen {
    struct app *app;
    struct sched_req *req;
    struct sched_progress prog; /* the request's, as last polled */
    struct chat_parser *parser;
    struct tok_stream ts;
    int32_t seen, n_prompt;
    bool finished;
    chat_event_fn raw_fn;   /* raw completion: text goes straight here, no parser */
    void *raw_ctx;
    /* stop strings: text that could still begin one is held back */
    char *stop[GEN_MAX_STOP];
    int32_t n_stop, hit;   /* hit: index of the stop string that matched, or -1 */
    char *held;
    size_t n_held;
    /* one call at most (parallel_tool_calls false): the output ends with the
     * first call, as at a stop string; events past it are dropped */
    bool one_call, call_done;
    chat_event_fn fn;
    void *ctx;
};

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct gen *g = ctx;
    if (g->call_done)
        return;
    g->fn(g->ctx, ev);
    g->call_done = g->one_call && ev->kind == CHAT_EV_TOOL_END;
}

static void deliver(struct gen *g, const char *text, size_t n)
{
    if (g->raw_fn) {
        struct chat_event ev = {CHAT_EV_TEXT, text, n, 0, NULL};
        if (n)
            g->raw_fn(g->raw_ctx, &ev);
    } else {
        chat_parser_feed(g->parser, text, n);
    }
}

/* Delivers text unless a stop string appears in it: then the output ends just
 * before it and the request is cancelled. */
static void feed(struct gen *g, const char *text, size_t n, bool last)
{
    if (g->n_stop == 0) {
        deliver(g, text, n);
        return;
    }
    char *buf = realloc(g->held, g->n_held + n + 1);
    if (!buf)
        return;
    memcpy(buf + g->n_held, text, n);
    g->held = buf;
    size_t len = g->n_held + n, cut = len, keep = 0;
    for (int32_t i = 0; i < g->n_stop; i++) {
        size_t sl = strlen(g->stop[i]);
        const char *hit = memmem(buf, len, g->stop[i], sl);
        if (hit && (size_t)(hit - buf) < cut) {
            cut = (size_t)(hit - buf);
            g->hit = i;
        }
        for (size_t k = sl - 1; !last && k > keep; k--) /* a suffix that may grow into this stop string */
            if (k <= len && memcmp(buf + len - k, g->stop[i], k) == 0) {
                keep = k;
                break;
            }
    }
    if (g->hit >= 0) {
        deliver(g, buf, cut);
        g->n_held = 0;
        sched_req_cancel(g->req);
        return;
    }
    deliver(g, buf, len - keep);
    memmove(buf, buf + len - keep, keep);
    g->n_held = keep;
}

/* The prompt's tokens before the reasoning block its generation prompt ends
 * with (Qwen3's empty block with thinking off, or the opening the model
 * continues), 0 when it ends otherwise. The template renders an earlier reply
 * without that block, so a next turn shares the prompt up to there only;
 * the reply's own tokens cannot be reused either, as their keys and values
 * were computed after the block. */
static int32_t reply_start(const struct tokenizer *tok, const char *prompt, size_t plen, const struct tok_ids *ids)
{
    static const char *const tails[] = {"<think>\n", "<think>\n\n</think>\n\n"};
    bool ends = false;
    for (size_t i = 0; i < sizeof tails / sizeof *tails; i++)
        ends |= plen >= strlen(tails[i]) && strcmp(prompt + plen - strlen(tails[i]), tails[i]) == 0;
    const int32_t think = ends ? tok_find(tok, "<think>") : -1;
    for (int32_t i = ids->n - 1; think >= 0 && i >= 1 && i >= ids->n - 8; i--)
        if (ids->ids[i] == think)
            return i;
    return 0;
}

/* Renders and tokenizes; *in_reasoning tells whether the prompt opened
 * <think>, *reply_at where the reply starts as a next turn renders it
 * (reply_start; may be NULL). */
static int build_prompt(struct app *a, json_t *messages, json_t *tools, json_t *kwargs, struct tok_ids *ids,
                        bool *in_reasoning, int32_t *reply_at, char *err, size_t n_err)
{
    json_t *norm = chat_messages_from_openai(messages);
    size_t plen;
    char *prompt = chat_template_render(a->rt.ct, norm, tools, true, kwargs, &plen);
    json_decref(norm);
    if (!prompt) {
        snprintf(err, n_err, "the chat template rejected the messages: %s", err_msg());
        return -1;
    }
    int rc = tok_encode(a->rt.tok, prompt, plen, ids);
    if (in_reasoning) /* templates that open the reasoning block end the prompt with it */
        *in_reasoning = plen >= 8 && strstr(prompt + (plen > 12 ? plen - 12 : 0), "<think>\n") != NULL;
    if (reply_at)
        *reply_at = rc == 0 ? reply_start(a->rt.tok, prompt, plen, ids) : 0;
    free(prompt);
    if (rc != 0)
        snprintf(err, n_err, "%s", err_msg());
    return rc;
}

int gen_sampling(json_t *b, const struct model_config *mc, float max_temperature, struct sampler_params *sp,
                 char *err, size_t n_err)
{
    json_t *v;
    *sp = sampler_defaults();
    sampler_params_from_config(sp, mc);
    sp->penalty_last_n = -1;
    if ((v = json_object_get(b, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > max_temperature)
            return snprintf(err, n_err, "temperature must be a number between 0 and %g", max_temperature), -1;
        sp->temperature = (float)json_number_value(v);
    }
    if ((v = json_object_get(b, "top_p")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 1)
            return snprintf(err, n_err, "top_p must be a number in (0, 1]"), -1;
        sp->top_p = (float)json_number_value(v);
    }
    if ((v = json_object_get(b, "top_k")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return snprintf(err, n_err, "top_k must be a non-negative integer"), -1;
        sp->top_k = (int32_t)json_integer_value(v);
    }
    if ((v = json_object_get(b, "min_p")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1)
            return snprintf(err, n_err, "min_p must be a number in [0, 1]"), -1;
        sp->min_p = (float)json_number_value(v);
    }
    if ((v = json_object_get(b, "repetition_penalty")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 10)
            return snprintf(err, n_err, "repetition_penalty must be a number in (0, 10]"), -1;
        sp->repeat_penalty = (float)json_number_value(v);
    }
    if ((v = json_object_get(b, "presence_penalty")) && json_is_number(v))
        sp->presence_penalty = (float)json_number_value(v);
    if ((v = json_object_get(b, "frequency_penalty")) && json_is_number(v))
        sp->frequency_penalty = (float)json_number_value(v);
    if ((v = json_object_get(b, "logit_bias")) && !json_is_null(v)) {
        /* OpenAI: {"token id": bias in [-100, 100]}; -100 bans a token */
        if (!json_is_object(v) || json_object_size(v) > SAMPLER_MAX_BIAS)
            return snprintf(err, n_err, "logit_bias must be an object of at most %d token ids", SAMPLER_MAX_BIAS), -1;
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) {
            char *end;
            long id = strtol(key, &end, 10);
            if (!*key || *end || id < 0 || id > INT32_MAX || !json_is_number(x) || json_number_value(x) < -100 ||
                json_number_value(x) > 100)
                return snprintf(err, n_err, "logit_bias: '%s' must be a token id mapped to a number in [-100, 100]",
                                key), -1;
            sp->bias_id[sp->n_bias] = (int32_t)id;
            sp->bias[sp->n_bias++] = json_number_value(x) <= -100 ? -INFINITY : (float)json_number_value(x);
        }
    }
    if ((v = json_object_get(b, "seed")) && json_is_integer(v))
        sp->seed = (uint64_t)json_integer_value(v);
    else
        sp->seed = gen_random();
    return 0;
}

uint64_t gen_random(void)
{
    uint64_t r = 0;
    ssize_t k;
    while ((k = getrandom(&r, sizeof r, 0)) < 0 && errno == EINTR)
        ;
    if (k != (ssize_t)sizeof r) { /* no entropy source (kernels before 3.17): the clock, still not a constant */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    return r;
}

int gen_max_tokens(json_t *v, int32_t *n)
{
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 24))
        return -1;
    *n = (int32_t)json_integer_value(v);
    return 0;
}

int gen_tool_choice(json_t *tc, bool anthropic, enum gen_tools *mode, const char **name, char *err, size_t n_err)
{
    *mode = GEN_TOOLS_AUTO;
    *name = NULL;
    if (!tc || json_is_null(tc))
        return 0;
    const char *kind = json_string_value(anthropic || json_is_object(tc) ? json_object_get(tc, "type") : tc);
    if (!kind)
        return snprintf(err, n_err, "tool_choice must be %s",
                        anthropic ? "an object with a type" : "a string or an object with a type"),
               -1;
    if (strcmp(kind, "auto") == 0 && (anthropic || json_is_string(tc)))
        return 0;
    if (strcmp(kind, "none") == 0 && (anthropic || json_is_string(tc))) {
        *mode = GEN_TOOLS_NONE;
        return 0;
    }
    if (strcmp(kind, anthropic ? "any" : "required") == 0 && (anthropic || json_is_string(tc))) {
        *mode = GEN_TOOLS_ANY;
        return 0;
    }
    if (strcmp(kind, anthropic ? "tool" : "function") == 0 && json_is_object(tc)) {
        json_t *f = json_object_get(tc, "function");
        *name = json_string_value(json_object_get(json_is_object(f) ? f : tc, "name"));
        if (!*name)
            return snprintf(err, n_err, "tool_choice of type %s needs the tool's name", kind), -1;
        *mode = GEN_TOOLS_NAMED;
        return 0;
    }
    return snprintf(err, n_err, "tool_choice %s is not one of %s", kind,
                    anthropic ? "auto, none, any, tool" : "\"auto\", \"none\", \"required\", a function"),
           -1;
}

/* Whether a tool's parameters can be followed in fmt: a forced call of a
 * tool that is not strict follows them where they can, since the clients
 * that force a call for an object (the AI SDK's Anthropic provider,
 * LangChain's withStructuredOutput) read its arguments with the schema. */
static bool schema_fits(enum chat_format fmt, const char *name, json_t *params)
{
    struct grammar tmp;
    grammar_init(&tmp);
    const bool fits = json_is_object(params) && chat_tool_grammar(&tmp, fmt, &name, &params, 1, CHAT_THINK_NONE, false) == 0;
    grammar_free(&tmp);
    return fits;
}

/* The tools' names, or the one tool_choice names after checking it is among
 * them: a grammar for the forced call (chat_tool_grammar), a strict tool's
 * arguments following its parameters' schema, another's where the grammar
 * can. Lazy (tool_choice auto): the grammar of text and calls, built only
 * where a tool is strict (without one, the output is not constrained: gm
 * stays empty). -1 with err. */
static int call_grammar(struct app *a, const struct gen_opts *o, enum chat_think think, bool lazy, struct grammar *gm,
                        char *err, size_t n_err)
{
    enum { MAX_TOOLS = 128 }; /* OpenAI's limit on a request's tools */
    const char *names[MAX_TOOLS];
    json_t *schemas[MAX_TOOLS], *params[MAX_TOOLS];
    int32_t n = 0, named = -1;
    bool any_strict = false, over = false;
    size_t i;
    json_t *t;
    json_array_foreach(o->tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm)
            continue;
        const bool strict = json_is_true(json_object_get(fn, "strict"));
        any_strict |= strict;
        if (n == MAX_TOOLS) { /* too many for a grammar: an error only where one is needed */
            over = true;
            continue;
        }
        if (o->tool_name && named < 0 && strcmp(nm, o->tool_name) == 0)
            named = n;
        params[n] = json_object_get(fn, "parameters");
        schemas[n] = strict ? params[n] : NULL;
        names[n++] = nm;
    }
    if (lazy && !any_strict)
        return 0;
    if (over)
        return snprintf(err, n_err, "%s among at most %d tools",
                        lazy ? "strict tools are followed" : "tool_choice forces a call", MAX_TOOLS),
               -1;
    if (n == 0)
        return snprintf(err, n_err, "tool_choice forces a tool call, but the request has no tools"), -1;
    if (o->tool_name && named < 0)
        return snprintf(err, n_err, "tool_choice names '%.64s', which is not among the request's tools", o->tool_name), -1;
    if (o->tool_name) {
        names[0] = names[named];
        schemas[0] = schemas[named];
        params[0] = params[named];
        n = 1;
    }
    const enum chat_format fmt = chat_template_tool_format(a->rt.ct);
    for (int32_t j = 0; j < n && !lazy; j++)
        if (!schemas[j] && schema_fits(fmt, names[j], params[j]))
            schemas[j] = params[j];
    if (chat_tool_grammar(gm, fmt, names, schemas, n, think, lazy) != 0)
        return snprintf(err, n_err, "%s", err_msg()), -1;
    return 0;
}

int gen_response_format(json_t *rf, const char *what, bool *json, json_t **schema, bool *strict, char *err,
                        size_t n_err)
{
    *json = false;
    *schema = NULL;
    *strict = false;
    if (!rf || json_is_null(rf))
        return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type)
        return snprintf(err, n_err, "%s must be an object with a string 'type'", what), -1;
    if (strcmp(type, "text") == 0)
        return 0;
    if (strcmp(type, "json_object") == 0) {
        *json = true;
        return 0;
    }
    if (strcmp(type, "json_schema") == 0) {
        json_t *js = json_object_get(rf, "json_schema"); /* chat completions nest it; Responses does not */
        *schema = json_object_get(json_is_object(js) ? js : rf, "schema");
        *strict = json_is_true(json_object_get(json_is_object(js) ? js : rf, "strict"));
        if (!json_is_object(*schema))
            return snprintf(err, n_err, "%s json_schema needs its 'schema' object", what), -1;
        *json = true;
        return 0;
    }
    return snprintf(err, n_err, "%s type '%s' is not one of text, json_object, json_schema", what, type), -1;
}

int32_t gen_count_tokens(struct app *a, json_t *messages, json_t *tools, json_t *kwargs, char *err, size_t n_err)
{
    struct tok_ids ids = {0};
    int rc = build_prompt(a, messages, tools, kwargs, &ids, NULL, NULL, err, n_err);
    int32_t n = rc == 0 ? ids.n : -1;
    tok_ids_free(&ids);
    return n;
}

/* The request's limits that need no prompt: checked before it is rendered and
 * tokenized, which for a large one costs far more. -1 with err. */
static int check_limits(struct app *a, const struct gen_opts *o, char *err, size_t n_err)
{
    json_t *stops = json_is_string(o->stop) ? json_pack("[O]", o->stop) : json_incref(o->stop);
    size_t i;
    json_t *v;
    int rc = 0;
    if (stops && !json_is_array(stops))
        rc = -1;
    json_array_foreach(stops, i, v) if (!json_is_string(v) || json_string_length(v) == 0 ||
                                        json_string_length(v) > GEN_MAX_STOP_LEN || i == GEN_MAX_STOP) rc = -1;
    json_decref(stops);
    if (rc != 0)
        return snprintf(err, n_err, "stop sequences must be at most %d non-empty strings of at most %d bytes",
                        GEN_MAX_STOP, GEN_MAX_STOP_LEN), -1;
    json_array_foreach(o->tools, i, v) {
        json_t *name = json_object_get(json_object_get(v, "function"), "name");
        if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > GEN_MAX_TOOL_NAME)
            return snprintf(err, n_err, "tools[%zu]: a function needs a name of 1 to %d bytes", i, GEN_MAX_TOOL_NAME),
                   -1;
    }
    if (o->ignore_eos && o->sp.n_bias + a->rt.m.cfg.n_eos > SAMPLER_MAX_BIAS)
        return snprintf(err, n_err, "ignore_eos bans the model's %d end tokens through logit_bias, which then takes "
                        "at most %d entries", (int)a->rt.m.cfg.n_eos, SAMPLER_MAX_BIAS - (int)a->rt.m.cfg.n_eos), -1;
    const int32_t n_ctx = sched_n_ctx(a->sched);
    if (!o->clamp && o->max_tokens >= n_ctx)
        return snprintf(err, n_err, "this model's context is %d tokens and %d were asked to generate", n_ctx,
                        o->max_tokens), -1;
    return 0;
}

struct gen *gen_start(struct app *a, const struct gen_opts *o, char *err, size_t n_err, enum gen_refusal *why)
{
    *why = GEN_INVALID;
    if (check_limits(a, o, err, n_err) != 0)
        return NULL;
    struct tok_ids ids = {0};
    struct gen *g = NULL;
    bool in_reasoning = false;
    int32_t reply_at = 0; /* where the reply starts as a next turn renders it, 0: one short of the end */
    const bool forced = o->tool_choice == GEN_TOOLS_ANY || o->tool_choice == GEN_TOOLS_NAMED;
    struct grammar gm; /* constrained output: a JSON object, or a forced call */
    grammar_init(&gm);
    if (forced && o->json) {
        snprintf(err, n_err, "%s output and a tool_choice that forces a call cannot be combined",
                 o->schema ? "json_schema" : "json_object");
        goto fail;
    }
    if (o->schema && json_schema_grammar(&gm, o->schema, err, n_err) != 0) {
        if (o->schema_strict)
            goto fail;
        grammar_free(&gm); /* not strict: a schema the grammar cannot enforce asks for a JSON object */
        grammar_init(&gm);
    }
    if (o->json && gm.n_seg == 0 && grammar_json(&gm, NULL) < 0)
        goto fail_msg;
    if (o->raw_prompt) {
        if (tok_encode(a->rt.tok, json_string_value(o->raw_prompt), json_string_length(o->raw_prompt), &ids) != 0)
            goto fail_msg;
    } else {
        /* JSON output: the model answers at once, without a reasoning block
         * first, unless the request asks for one. A forced call may come
         * after one, as the template and the request have it: inside the one
         * the prompt opened, or after one the model opens unless the request
         * turned reasoning off. */
        json_t *kw = o->kwargs ? json_incref(o->kwargs) : NULL;
        const bool no_think = json_is_false(json_object_get(kw, "enable_thinking"));
        if (o->json && !json_object_get(kw, "enable_thinking")) {
            json_t *k2 = kw ? json_copy(kw) : json_object();
            json_object_set_new(k2, "enable_thinking", json_false());
            json_decref(kw);
            kw = k2;
        }
        int brc = build_prompt(a, o->messages, o->tools, kw, &ids, &in_reasoning, &reply_at, err, n_err);
        json_decref(kw);
        /* a forced call; or, the model choosing (without JSON output), a
         * strict tool's schema followed in the calls it makes */
        const bool lazy = o->tool_choice == GEN_TOOLS_AUTO && o->tools && !o->json;
        if (brc == 0 && (forced || lazy))
            brc = call_grammar(a, o, in_reasoning ? CHAT_THINK_OPEN : no_think ? CHAT_THINK_NONE : CHAT_THINK_MAY,
                               lazy, &gm, err, n_err);
        if (brc != 0)
            goto fail;
    }
    int32_t n_ctx = sched_n_ctx(a->sched), max_tokens = o->max_tokens;
    if (max_tokens == 0)
        max_tokens = n_ctx - ids.n > 4096 ? 4096 : n_ctx - ids.n;
    if (o->clamp && ids.n < n_ctx && ids.n + max_tokens > n_ctx)
        max_tokens = n_ctx - ids.n; /* the prompt fits: generate as much as the rest allows */
    if (ids.n + max_tokens > n_ctx || max_tokens < 1) {
        snprintf(err, n_err, "this model's context is %d tokens; the messages take %d and %d were asked to generate",
                 n_ctx, ids.n, max_tokens);
        goto fail;
    }
    if (!(g = calloc(1, sizeof *g))) {
        snprintf(err, n_err, "out of memory");
        goto fail;
    }
    g->app = a;
    g->n_prompt = ids.n;
    g->hit = -1;
    json_t *stops = json_is_string(o->stop) ? json_pack("[O]", o->stop) : json_incref(o->stop);
    size_t si;
    json_t *sv;
    json_array_foreach(stops, si, sv) { /* check_limits took their measure */
        if (!(g->stop[g->n_stop++] = strdup(json_string_value(sv)))) {
            snprintf(err, n_err, "out of memory");
            json_decref(stops);
            goto fail;
        }
    }
    json_decref(stops);
    struct sampler_params sp = o->sp;
    for (int32_t i = 0; o->ignore_eos && i < a->rt.m.cfg.n_eos; i++) { /* check_limits left room */
        sp.bias_id[sp.n_bias] = a->rt.m.cfg.eos_id[i];
        sp.bias[sp.n_bias++] = -INFINITY; /* never sampled, so never an end */
    }
    g->req = sched_req_new(ids.ids, ids.n, &sp, max_tokens, a->rt.m.cfg.vocab_size);
    if (!g->req || (o->logprobs >= 0 && sched_req_logprobs(g->req, o->logprobs) != 0))
        goto fail_msg;
    if (reply_at > 0)
        sched_req_reply_at(g->req, reply_at);
    if (gm.n_seg)
        sched_req_guard(g->req, &a->vb, &gm);
    if (o->raw_prompt) {
        g->raw_fn = o->fn;
        g->raw_ctx = o->ctx;
    } else {
        g->fn = o->fn;
        g->ctx = o->ctx;
        g->one_call = o->one_call;
        if (!(g->parser = chat_parser_new(chat_template_tool_format(a->rt.ct), in_reasoning, o->tools, on_event, g)))
            goto fail_msg;
    }
    int rc = sched_submit(a->sched, g->req);
    if (rc != 0) {
        *why = rc == -2 ? GEN_OVERLOADED : rc == -3 ? GEN_STOPPING : GEN_INVALID;
        goto fail_msg;
    }
    tok_ids_free(&ids);
    return g;
fail_msg:
    snprintf(err, n_err, "%s", err_msg());
fail:
    tok_ids_free(&ids);
    grammar_free(&gm);
    gen_free(g);
    return NULL;
}

/* Delivers the tokens the last poll reported; after the last, flushes. */
static void pump(struct gen *g)
{
    char buf[4096];
    const int32_t *out = sched_req_out(g->req);
    for (; g->seen < g->prog.n_out && g->hit < 0 && !g->call_done; g->seen++) {
        int32_t k = tok_stream_push(g->app->rt.tok, &g->ts, out[g->seen], true, buf, sizeof buf);
        if (k > 0)
            feed(g, buf, (size_t)k, false);
    }
    if (!(g->hit >= 0 || g->call_done || (g->prog.finish != SCHED_RUNNING && g->seen == g->prog.n_out)))
        return;
    if (g->call_done) {
        sched_req_cancel(g->req);
    } else if (g->hit < 0) {
        int32_t k = tok_stream_flush(&g->ts, buf, sizeof buf);
        feed(g, buf, (size_t)(k > 0 ? k : 0), true);
    }
    if (g->parser)
        chat_parser_finish(g->parser);
    g->finished = true;
}

void gen_pump(struct gen *g)
{
    if (g->finished)
        return;
    sched_req_poll(g->req, g->seen, -1, &g->prog);
    pump(g);
}

bool gen_pump_for(struct gen *g, double seconds)
{
    if (g->finished)
        return true;
    if (sched_req_poll(g->req, g->seen, seconds, &g->prog) == g->seen && g->prog.finish == SCHED_RUNNING)
        return false;
    pump(g);
    return true;
}

bool gen_admitted_for(struct gen *g, double seconds)
{
    struct sched_progress p;
    sched_req_poll(g->req, -1, seconds, &p);
    return p.admitted || p.finish != SCHED_RUNNING;
}

/* Whether the client closed its connection (or it failed). A handler that
 * waits for the whole answer holds its connection's thread, so libmicrohttpd
 * cannot notice the close itself, as it does for a stream. */
static bool client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

void gen_wait(struct gen *g, struct MHD_Connection *c)
{
    while (!g->finished) {
        gen_pump_for(g, GEN_POLL_S);
        if (!g->finished && client_gone(c))
            sched_req_cancel(g->req);
    }
}

bool gen_finished(const struct gen *g) { return g->finished; }
enum sched_finish gen_finish(const struct gen *g)
{
    if (g->hit >= 0 || g->call_done)
        return SCHED_STOP;
    struct sched_progress p;
    sched_req_poll(g->req, g->seen, 0, &p);
    return p.finish;
}
const char *gen_stop_string(const struct gen *g) { return g->hit >= 0 ? g->stop[g->hit] : NULL; }
const char *gen_error(const struct gen *g) { return sched_req_error(g->req); }

unsigned gen_error_status(const struct gen *g)
{
    const enum sched_finish f = gen_finish(g);
    return f == SCHED_ERROR ? 500 : f == SCHED_CANCELLED ? 503 : 0;
}
int32_t gen_n_prompt(const struct gen *g) { return g->n_prompt; }

int32_t gen_n_cached(const struct gen *g)
{
    struct sched_progress p;
    sched_req_poll(g->req, g->seen, 0, &p);
    return p.n_cached;
}
int32_t gen_n_output(const struct gen *g)
{
    struct sched_progress p;
    sched_req_poll(g->req, g->seen, 0, &p);
    return g->hit >= 0 || g->call_done ? g->seen : p.n_out; /* cut short: what the client got */
}
int32_t gen_n_seen(const struct gen *g) { return g->seen; }

/* The token's text (lossy UTF-8 for a piece of a character) and its bytes. */
static json_t *token_json(const struct tokenizer *t, int32_t id, json_t **bytes)
{
    size_t len = 0;
    char *s = tok_decode(t, &id, 1, false, &len);
    json_t *str = json_stringn(s ? s : "", s ? len : 0);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; s && i < len; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)s[i]));
    }
    free(s);
    return str;
}

int32_t gen_logprobs(struct gen *g, int32_t from, int32_t to, bool legacy, json_t *arr, int64_t *offset)
{
    const struct tokenizer *tk = g->app->rt.tok;
    const int32_t *out = sched_req_out(g->req);
    struct sched_progress p;
    if (to > sched_req_poll(g->req, g->seen, 0, &p))
        to = p.n_out;
    const int32_t *tid;
    const float *tlp;
    float lp;
    int32_t n_top;
    for (int32_t i = from; i < to && (n_top = sched_req_logprob(g->req, i, &lp, &tid, &tlp)) >= 0; i++) {
        if (legacy) {
            json_t *tok = token_json(tk, out[i], NULL), *top = json_object();
            *offset += (int64_t)json_string_length(tok);
            json_array_append_new(json_object_get(arr, "text_offset"), json_integer(*offset - (int64_t)json_string_length(tok)));
            json_array_append_new(json_object_get(arr, "tokens"), tok);
            json_array_append_new(json_object_get(arr, "token_logprobs"), json_real(lp));
            for (int32_t j = 0; j < n_top; j++) {
                json_t *alt = token_json(tk, tid[j], NULL);
                json_object_set_new(top, json_string_value(alt), json_real(tlp[j]));
                json_decref(alt);
            }
            json_array_append_new(json_object_get(arr, "top_logprobs"), top);
            continue;
        }
        json_t *bytes, *top = json_array();
        json_t *tok = token_json(tk, out[i], &bytes);
        for (int32_t j = 0; j < n_top; j++) {
            json_t *ab, *alt = token_json(tk, tid[j], &ab);
            json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", alt, "logprob", (double)tlp[j], "bytes", ab));
        }
        json_array_append_new(arr, json_pack("{s:o,s:f,s:o,s:o}", "token", tok, "logprob", (double)lp, "bytes",
                                             bytes, "top_logprobs", top));
    }
    return to > from ? to : from;
}

int32_t gen_n_tool_calls(const struct gen *g) { return g->parser ? chat_parser_n_tool_calls(g->parser) : 0; }

void gen_free(struct gen *g)
{
    if (!g)
        return;
    if (g->req) {
        sched_req_cancel(g->req); /* a no-op when it already finished */
        sched_req_release(g->req);
    }
    chat_parser_free(g->parser);
    for (int32_t i = 0; i < g->n_stop; i++)
        free(g->stop[i]);
    free(g->held);
    free(g);
}
