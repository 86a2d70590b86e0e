/* gen: chat messages -> prompt -> scheduler -> output events (see gen.h). */
#include "gen.h"

#include "../base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gen {
    struct app *app;
    struct sched_req *req;
    struct chat_parser *parser;
    struct tok_stream ts;
    int32_t seen, n_prompt;
    bool finished;
};

/* Renders and tokenizes; *in_reasoning tells whether the prompt opened <think>. */
static int build_prompt(struct app *a, json_t *messages, json_t *tools, json_t *kwargs, struct tok_ids *ids,
                        bool *in_reasoning, char *err, size_t n_err)
{
    json_t *norm = chat_messages_from_openai(messages);
    size_t plen;
    char *prompt = chat_template_render(a->tpl, norm, tools, true, kwargs, &plen);
    json_decref(norm);
    if (!prompt) {
        snprintf(err, n_err, "the chat template rejected the messages: %s", err_msg());
        return -1;
    }
    int rc = tok_encode(a->tok, prompt, plen, ids);
    if (in_reasoning) /* templates that open the reasoning block end the prompt with it */
        *in_reasoning = plen >= 8 && strstr(prompt + (plen > 12 ? plen - 12 : 0), "<think>\n") != NULL;
    free(prompt);
    if (rc != 0)
        snprintf(err, n_err, "%s", err_msg());
    return rc;
}

int32_t gen_count_tokens(struct app *a, json_t *messages, json_t *tools, json_t *kwargs, char *err, size_t n_err)
{
    struct tok_ids ids = {0};
    int rc = build_prompt(a, messages, tools, kwargs, &ids, NULL, err, n_err);
    int32_t n = rc == 0 ? ids.n : -1;
    tok_ids_free(&ids);
    return n;
}

struct gen *gen_start(struct app *a, const struct gen_opts *o, char *err, size_t n_err)
{
    struct tok_ids ids = {0};
    bool in_reasoning = false;
    if (build_prompt(a, o->messages, o->tools, o->kwargs, &ids, &in_reasoning, err, n_err) != 0) {
        tok_ids_free(&ids);
        return NULL;
    }
    int32_t n_ctx = sched_n_ctx(a->sched), max_tokens = o->max_tokens;
    if (max_tokens == 0)
        max_tokens = n_ctx - ids.n > 4096 ? 4096 : n_ctx - ids.n;
    if (ids.n + max_tokens > n_ctx || max_tokens < 1) {
        snprintf(err, n_err, "this model's context is %d tokens; the messages take %d and %d were asked to generate",
                 n_ctx, ids.n, max_tokens);
        tok_ids_free(&ids);
        return NULL;
    }
    struct gen *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, n_err, "out of memory");
        tok_ids_free(&ids);
        return NULL;
    }
    g->app = a;
    g->n_prompt = ids.n;
    g->req = sched_req_new(ids.ids, ids.n, &o->sp, max_tokens, a->model.cfg.vocab_size);
    tok_ids_free(&ids);
    if (!g->req || !(g->parser = chat_parser_new(chat_template_tool_format(a->tpl), in_reasoning, o->tools, o->fn, o->ctx)) ||
        sched_submit(a->sched, g->req) != 0) {
        snprintf(err, n_err, "%s", err_msg());
        gen_free(g);
        return NULL;
    }
    return g;
}

void gen_pump(struct gen *g)
{
    if (g->finished)
        return;
    int32_t n = sched_req_wait(g->req, g->seen);
    char buf[4096];
    for (; g->seen < n; g->seen++) {
        int32_t k = tok_stream_push(g->app->tok, &g->ts, g->req->out[g->seen], true, buf, sizeof buf);
        if (k > 0)
            chat_parser_feed(g->parser, buf, (size_t)k);
    }
    pthread_mutex_lock(&g->req->mu);
    bool over = g->req->finish != SCHED_RUNNING && g->seen == g->req->n_out;
    pthread_mutex_unlock(&g->req->mu);
    if (!over)
        return;
    int32_t k = tok_stream_flush(&g->ts, buf, sizeof buf);
    if (k > 0)
        chat_parser_feed(g->parser, buf, (size_t)k);
    chat_parser_finish(g->parser);
    g->finished = true;
}

bool gen_finished(const struct gen *g) { return g->finished; }
enum sched_finish gen_finish(const struct gen *g) { return g->req->finish; }
const char *gen_error(const struct gen *g) { return g->req->error; }
int32_t gen_n_prompt(const struct gen *g) { return g->n_prompt; }
int32_t gen_n_output(const struct gen *g) { return g->req->n_out; }
int32_t gen_n_tool_calls(const struct gen *g) { return chat_parser_n_tool_calls(g->parser); }

void gen_free(struct gen *g)
{
    if (!g)
        return;
    if (g->req) {
        sched_req_cancel(g->req); /* a no-op when it already finished */
        sched_req_release(g->req);
    }
    chat_parser_free(g->parser);
    free(g);
}
