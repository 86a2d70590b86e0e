/* gen: one generation from chat messages to parsed output events, shared by the
 * API adapters (openai.c, anthropic.c). It renders the model's chat template,
 * tokenizes, submits to the scheduler, and feeds the generated tokens through
 * the streaming detokenizer into the output parser, whose events go to the
 * adapter's callback. Internal to src/server.
 *
 * Ownership: gen_free cancels the request if it still runs and frees everything. */
#ifndef KP_GEN_H
#define KP_GEN_H

#include "app.h"

#include <stdbool.h>

/* What tool_choice asks for. */
enum gen_tools {
    GEN_TOOLS_AUTO,  /* the model decides (OpenAI "auto", Anthropic {"type": "auto"}, absent) */
    GEN_TOOLS_NONE,  /* no tools: they are left out of the prompt */
    GEN_TOOLS_ANY,   /* a call of one of the tools (OpenAI "required", Anthropic "any") */
    GEN_TOOLS_NAMED, /* a call of the tool named (OpenAI {"type": "function", ...}, Anthropic "tool") */
};

struct gen_opts {
    json_t *messages;        /* OpenAI shape, as chat_messages_from_openai takes them */
    json_t *raw_prompt;      /* instead of messages: a string used as it is (no template, no
                                output parsing: every event is CHAT_EV_TEXT) */
    json_t *tools;           /* OpenAI shape, or NULL */
    json_t *kwargs;          /* chat_template_kwargs, or NULL */
    struct sampler_params sp;
    int32_t max_tokens;      /* 0: up to the context, at most 4096 */
    bool clamp;              /* max_tokens past the context shrinks to fit (else it is an error) */
    json_t *stop;            /* stop strings: a string or a list (OpenAI stop, Anthropic stop_sequences), or NULL */
    int32_t logprobs;        /* top alternatives per token with log-probabilities, or -1: none */
    bool ignore_eos;         /* generate max_tokens even past end-of-sequence tokens (vLLM's and
                                llama-server's extension; benchmarks use it) */
    bool json;               /* response_format json_object: the output is one JSON object
                                (constrained decoding; thinking off unless kwargs say otherwise) */
    json_t *schema;          /* response_format json_schema (with json): the object follows it */
    bool schema_strict;      /* a schema the grammar cannot enforce is refused; else the output is
                                any JSON object (OpenAI's strict false, its default) */
    enum gen_tools tool_choice; /* GEN_TOOLS_ANY / NAMED: the output is one call of one of the
                                tools / of tool_name (constrained decoding, as with json; a
                                reasoning block may come first, as without it); AUTO with a
                                strict tool: any call the model makes names a tool given, and a
                                strict one's arguments follow its schema (no KFlash then) */
    const char *tool_name;
    bool one_call;           /* at most one tool call: the output ends after it (OpenAI's
                                parallel_tool_calls false, Anthropic's disable_parallel_tool_use) */
    chat_event_fn fn;
    void *ctx;
};

struct gen;

/* The sampling fields the APIs share (temperature up to max_temperature, top_p,
 * top_k, min_p, repetition_penalty, seed, presence/frequency penalties); what
 * the body leaves out is what the model's generation_config.json asks for
 * (struct model_config's gen_*), and a random seed. -1 with a message in err
 * on a bad value. */
int gen_sampling(json_t *body, const struct model_config *mc, float max_temperature, struct sampler_params *sp,
                 char *err, size_t n_err);

/* A limit on the tokens to generate (chat completions' max_tokens and
 * max_completion_tokens, the Responses API's max_output_tokens, Anthropic's
 * max_tokens): 0 with it in *n when v is an integer from 1 to 2^24, else -1
 * (the caller words the error as its API does). */
int gen_max_tokens(json_t *v, int32_t *n);

/* tool_choice: OpenAI's "auto" / "none" / "required" or {"type":
 * "function", "function": {"name": N}} (chat completions; the Responses API's
 * {"type": "function", "name": N} too), null or absent: auto; or Anthropic's
 * {"type": "auto" | "none" | "any" | "tool", "name": N}. *name points into
 * tc. -1 with a message in err for anything else. */
int gen_tool_choice(json_t *tc, bool anthropic, enum gen_tools *mode, const char **name, char *err, size_t n_err);

/* response_format (chat completions), text.format (Responses) or Anthropic's
 * output format, named what in messages: {"type": "text"} or absent;
 * "json_object" (*json true); or "json_schema" (*json true, *schema its
 * schema: chat completions' json_schema.schema, the others' schema; pointing
 * into rf; *strict its "strict"). -1 with a message in err. */
int gen_response_format(json_t *rf, const char *what, bool *json, json_t **schema, bool *strict, char *err,
                        size_t n_err);

#define GEN_MAX_STOP 8
#define GEN_MAX_STOP_LEN 1024 /* bytes of one stop string: each is searched for at every token */
#define GEN_MAX_TOOL_NAME 128 /* bytes of a tool's name (OpenAI allows 64) */

/* 64 random bits from the operating system (getrandom), for response ids and
 * the seed of a request that names none: they differ from one start to the next. */
uint64_t gen_random(void);

/* Why gen_start refused a request: the client's fault (bad messages, too long,
 * bad stop list...), the queue was full, or the server is stopping. */
enum gen_refusal { GEN_INVALID, GEN_OVERLOADED, GEN_STOPPING };
/* NULL with a message in err and the reason in *why. What can be checked
 * without the prompt (stop strings, tool names, logit_bias room for
 * ignore_eos, max_tokens against the context) is, before it is rendered and
 * tokenized. */
struct gen *gen_start(struct app *a, const struct gen_opts *o, char *err, size_t n_err, enum gen_refusal *why);
/* Blocks for the next tokens and delivers their events; after the last, flushes. */
void gen_pump(struct gen *g);
/* gen_pump waiting at most `seconds`: false when nothing came (a stream then
 * sends a keep-alive, so that proxies and clients see it is alive during a long
 * prefill). */
bool gen_pump_for(struct gen *g, double seconds);
/* Waits at most `seconds` for the scheduler to admit the request (from then
 * on gen_n_cached is final) or end it: false when neither happened. A stream
 * whose usage names the cached tokens (Anthropic's message_start) waits so. */
bool gen_admitted_for(struct gen *g, double seconds);
/* Pumps until the output is complete, for an answer sent whole: a client that
 * closes its connection meanwhile cancels the request, as a stream's does. */
void gen_wait(struct gen *g, struct MHD_Connection *c);
bool gen_finished(const struct gen *g);
/* SCHED_STOP also when a stop string ended the output (gen_stop_string tells which). */
enum sched_finish gen_finish(const struct gen *g);
const char *gen_stop_string(const struct gen *g); /* NULL if none matched */
const char *gen_error(const struct gen *g);
/* The answer is an error: the engine failed the request (HTTP 500), or the
 * server is stopping (cancelled with a reader still there, 503; a client that
 * went away has no reader). 0 when the output is complete. */
unsigned gen_error_status(const struct gen *g);
int32_t gen_n_prompt(const struct gen *g);
/* Prompt tokens whose K/V came from an earlier conversation (prefix reuse). */
int32_t gen_n_cached(const struct gen *g);
int32_t gen_n_output(const struct gen *g);
/* Output tokens taken so far (those the events delivered came from). */
int32_t gen_n_seen(const struct gen *g);
/* Log-probabilities of output tokens [from, to) (logprobs >= 0 in the options):
 * chat: OpenAI entries {token, logprob, bytes, top_logprobs} appended to arr;
 * legacy (completions): arr is an object whose tokens / token_logprobs /
 * top_logprobs / text_offset lists grow, text_offset counting from *offset. */
/* Returns the end actually reached (to, or fewer if not yet generated). */
int32_t gen_logprobs(struct gen *g, int32_t from, int32_t to, bool legacy, json_t *arr, int64_t *offset);
int32_t gen_n_tool_calls(const struct gen *g);
void gen_free(struct gen *g);

/* Prompt tokens the messages and tools take (for count_tokens); -1 with err. */
int32_t gen_count_tokens(struct app *a, json_t *messages, json_t *tools, json_t *kwargs, char *err, size_t n_err);

#endif
