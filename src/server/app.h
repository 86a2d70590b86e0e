/* app: what the HTTP handlers share (internal to src/server). */
#ifndef KP_APP_H
#define KP_APP_H

#include "../engine/sched.h"
#include "../runtime/runtime.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdarg.h>

struct resp_store;

struct app {
    struct runtime rt; /* the model, its tokenizer and chat template, the draft */
    struct sched *sched;
    struct vocab_bytes vb; /* each token's bytes, for constrained (JSON) output */
    const char *model_name;
    const char *api_key;
    double keepalive_s; /* idle seconds before a stream sends a keep-alive */
    struct resp_store *responses; /* the Responses API's stored responses */
    int32_t n_seq;      /* requests generated together (--parallel), for /metrics */
    enum dtype kv_type; /* the KV cache's type, for /metrics */
    bool kflash;        /* speculative decoding on, for /status */
};

/* Queues r (with --cors's headers) and lets go of it: every response goes out through here. */
enum MHD_Result http_queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r);
/* Queues a JSON response; takes the reference to body. */
enum MHD_Result http_json(struct MHD_Connection *c, unsigned status, json_t *body);
/* An error's message from fmt and ap into msg [cap], logged as the request's
 * line (status and type beside it): what each API's error shape carries. */
void http_error_message(char *msg, size_t cap, unsigned status, const char *type, const char *fmt, va_list ap);
/* An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}. */
enum MHD_Result http_openai_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...);

/* An Anthropic-shaped error: {"type": "error", "error": {"type", "message"}}. */
enum MHD_Result http_anthropic_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...);

/* id NULL: the list; else that model (404 unless it is the one served) */
enum MHD_Result openai_models(struct app *a, struct MHD_Connection *c, const char *id);
enum MHD_Result openai_chat(struct app *a, struct MHD_Connection *c, json_t *body);
enum MHD_Result openai_responses(struct app *a, struct MHD_Connection *c, json_t *body);
/* GET /v1/responses/{id}: a stored response (404 unless the store holds it) */
enum MHD_Result openai_response_get(struct app *a, struct MHD_Connection *c, const char *id);
enum MHD_Result openai_completions(struct app *a, struct MHD_Connection *c, json_t *body);
enum MHD_Result anthropic_messages(struct app *a, struct MHD_Connection *c, json_t *body);
enum MHD_Result anthropic_count_tokens(struct app *a, struct MHD_Connection *c, json_t *body);

#endif
