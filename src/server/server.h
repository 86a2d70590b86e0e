/* server: `kapitsa serve`, the OpenAI-compatible HTTP API on libmicrohttpd,
 * and the web page (web/: a chat and the server's status) at GET /.
 *
 * One engine thread (src/engine/sched.h) runs the model; HTTP connections are
 * served by libmicrohttpd threads that render the chat template, tokenize,
 * submit a request and turn the generated tokens into the API's response
 * (JSON, or server-sent events when streaming). Bound to 127.0.0.1 unless told.
 *
 * Ownership: struct app (server.c) owns the model, tokenizer, template and
 * scheduler for the server's lifetime; a request's state is freed when its
 * response is done or its client goes away. */
#ifndef KP_SERVER_H
#define KP_SERVER_H

#include "../engine/spec.h"

#include <stdint.h>

struct server_opts {
    const char *host;     /* default 127.0.0.1 */
    uint16_t port;        /* default 11435; 0: any free port */
    const char *api_key;  /* NULL: no authentication; "" is refused (it would look set and guard nothing) */
    const char *cors;     /* the origin browsers may call from (Access-Control-Allow-Origin), or NULL */
    const char *model_dir;
    const char *model_name; /* reported in /v1/models; default: the folder's name */
    int32_t n_ctx;        /* KV cache tokens over all sequences */
    enum dtype kv_type;   /* the KV cache's dtype: DT_F32 (zero) or DT_BF16 (serve's default) */
    int32_t n_seq;        /* concurrent sequences */
    int32_t prefill_chunk; /* prompt tokens a request feeds a step; 0: the backend's (backend_ops) */
    int32_t threads;
    const char *device;   /* cpu, cuda[:N], auto (NULL: auto) */
    double keepalive_s;   /* a streaming response idle this long sends a keep-alive; <= 0: 10 */
    const char *draft_dir;  /* KFlash draft model, or NULL */
    struct spec_params spec; /* mode SPEC_OFF: plain decoding */
    /* where the KFlash tuner's choices are kept between runs, and the key of
     * this machine and model pair (sched_spec_persist); NULL: not kept */
    const char *tune_path, *tune_key;
    /* the models' loads as they go (runtime_opts.progress); NULL: none */
    void (*load_progress)(void *ctx, const char *source, int64_t done, int64_t total);
    void *load_progress_ctx;
};

/* A forward takes the larger of the prefill chunk and this many tokens (the
 * room the decoding requests' KFlash trees share). */
#define SERVER_MIN_BATCH 512

/* Serves until SIGINT/SIGTERM. 0 on a clean stop, -1 with err_set() on failure to start. */
int server_run(const struct server_opts *o);

#endif
