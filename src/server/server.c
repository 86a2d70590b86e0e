/* server: libmicrohttpd glue, limits, authentication and routing (see server.h).
 * Every endpoint but /health and the web page's files needs the API key when
 * one is set (Authorization: Bearer, or x-api-key), compared in constant time
 * as soon as the headers are in, before any of the body is kept. Bodies are
 * collected up to SERVER_MAX_BODY and parsed only if they hold at most
 * SERVER_MAX_JSON values. */
#define _GNU_SOURCE
#include "server.h"

#include "../backend/device.h"
#include "../base/err.h"
#include "../base/path.h"
#include "../base/sysmem.h"
#include "app.h"
#include "resp_store.h"

#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define SERVER_MAX_BODY (32u << 20)
/* A parsed JSON value costs jansson some 50 bytes however short its text, so
 * the body's size alone lets 32 MiB of "[1,1,...]" take over 600 MB: bodies
 * are refused past this many values (counted on the text before parsing),
 * which is far above what long conversations with many tools take. */
#define SERVER_MAX_JSON (1u << 19)
/* Bodies past this size give their memory back to the system when done. */
#define SERVER_TRIM_BYTES (1u << 20)
/* Slow or idle clients: a connection holds a thread, so one address may hold
 * only so many (the rest of the limit stays for everyone else), and one that
 * goes quiet while sending its request, or between requests, is closed soon.
 * Once a request is complete its answer may take minutes (a long generation;
 * streams send keep-alives), so its connection gets the longer timeout. */
#define SERVER_MAX_CONN 512u
#define SERVER_MAX_PER_IP 64u
#define SERVER_REQUEST_TIMEOUT_S 10u
#define SERVER_ANSWER_TIMEOUT_S 600u

/* The Responses API's store: an agent's conversation is its latest response
 * (which holds the whole conversation again), so a few thousand responses and
 * 256 MiB of their JSON keep many conversations continuable. */
#define SERVER_STORED_RESPONSES 4096
#define SERVER_STORED_BYTES ((size_t)256 << 20)

/* What a browser may send from --cors's origin: the APIs' own headers and
 * whatever else a preflight asks for (the SDKs add their own, x-stainless-*). */
#define SERVER_CORS_METHODS "GET, POST, HEAD, OPTIONS"
#define SERVER_CORS_HEADERS "authorization, x-api-key, anthropic-version, anthropic-beta, content-type"

struct conn_state {
    char *body;
    size_t n, cap;
    bool too_big;
};

/* --cors's origin, or NULL: a process serves once (as it has one stop pipe),
 * and every response, those of the API modules' too, reads it. */
static const char *cors_origin;

enum MHD_Result http_queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r)
{
    if (cors_origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", cors_origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result http_json(struct MHD_Connection *c, unsigned status, json_t *body)
{
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    return http_queue(c, status, r);
}

/* A CORS preflight (OPTIONS, before the key: browsers send none with it): the
 * methods and headers the API takes, for a day. */
static enum MHD_Result cors_preflight(struct MHD_Connection *c)
{
    const char *asked = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    char allow[1024];
    snprintf(allow, sizeof allow, "%s%s%.900s", SERVER_CORS_HEADERS, asked && *asked ? ", " : "", asked ? asked : "");
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", SERVER_CORS_METHODS);
    MHD_add_response_header(r, "Access-Control-Allow-Headers", allow);
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    return http_queue(c, MHD_HTTP_NO_CONTENT, r);
}

/* The web page's files (web/): fixed names, so no request names any other file. */
static const struct {
    const char *url, *file, *type;
} web_files[] = {
    {"/", "index.html", "text/html; charset=utf-8"},
    {"/app.js", "app.js", "text/javascript; charset=utf-8"},
    {"/style.css", "style.css", "text/css; charset=utf-8"},
    {"/favicon.svg", "favicon.svg", "image/svg+xml"},
};

/* GET or HEAD of a web page file (no key needed: the files hold nothing of
 * the server's; what the page shows comes from the API, with the key). The
 * page's scripts run only from the server itself (Content-Security-Policy):
 * model text the page shows cannot bring its own. Without the files (a
 * binary copied without its data) / answers that the server is up. */
static enum MHD_Result web_file(struct app *a, struct MHD_Connection *c, size_t i)
{
    char path[4096];
    struct stat sb;
    int fd = path_web(web_files[i].file, path, sizeof path) == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        if (fd >= 0)
            close(fd);
        if (i == 0) /* clients probe the base URL (Claude Code: HEAD /) */
            return http_json(c, MHD_HTTP_OK, json_pack("{s:s,s:s}", "status", "ok", "model", a->model_name));
        return http_openai_error(c, MHD_HTTP_NOT_FOUND, "invalid_request_error", "the web page's %s is missing (%s)",
                                 web_files[i].file, path);
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)sb.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", web_files[i].type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'");
    return http_queue(c, MHD_HTTP_OK, r);
}

void http_error_message(char *msg, size_t cap, unsigned status, const char *type, const char *fmt, va_list ap)
{
    vsnprintf(msg, cap, fmt, ap);
    fprintf(stderr, "kapitsa: error %u %s: %s\n", status, type, msg);
}

enum MHD_Result http_openai_error(struct MHD_Connection *c, unsigned status, const char *type, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    http_error_message(msg, sizeof msg, status, type, fmt, ap);
    va_end(ap);
    return http_json(c, status, json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", msg, "type", type, "param",
                                          "code"));
}

static bool key_ok(const struct app *a, struct MHD_Connection *c)
{
    if (!a->api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    /* the scheme is case-insensitive (RFC 9110): "bearer KEY" is the same */
    const char *given = x ? x : (h && strncasecmp(h, "Bearer ", 7) == 0 ? h + 7 : NULL);
    if (!given)
        return false;
    size_t n = strlen(a->api_key), m = strlen(given);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) /* constant time in the key's length */
        diff |= (unsigned char)(a->api_key[i] ^ (i < m ? given[i] : 0));
    return diff == 0;
}

/* An upper bound on the number of JSON values in text: every value but the
 * first follows a comma or opens a container, outside strings. */
static size_t json_count_values(const char *text, size_t n)
{
    size_t count = 1;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        const char ch = text[i];
        if (in_str) {
            in_str = esc || ch != '"';
            esc = !esc && ch == '\\';
        } else {
            in_str = ch == '"';
            count += ch == ',' || ch == '[' || ch == '{';
        }
    }
    return count;
}

/* The KV cache's bytes for n_ctx tokens of model m (the recurrent states
 * beside it are a few slots, left out). */
static double server_kv_bytes(const struct model *m, int32_t n_ctx, enum dtype kv_type)
{
    const struct model_config *c = &m->cfg;
    return 2.0 * c->n_attn_layer * c->n_kv_head * c->head_dim * (double)dtype_size(kv_type) * n_ctx;
}

/* The bytes of the weights and of the KV cache, the draft's included. */
static void server_loaded_bytes(const struct app *a, int64_t *weights, double *kv)
{
    *weights = 0;
    *kv = server_kv_bytes(&a->rt.m, sched_n_ctx(a->sched), a->kv_type);
    for (int k = 0; k < (a->rt.d_loaded ? 2 : 1); k++) {
        const struct safetensors *st = k ? &a->rt.dm.st : &a->rt.m.st;
        for (int32_t i = 0; i < st->n_tensors; i++)
            *weights += (int64_t)st->tensors[i].n_bytes;
        if (k)
            *kv += server_kv_bytes(&a->rt.dm, sched_n_ctx(a->sched), a->kv_type);
    }
}

/* What the server holds, as /metrics gauges (kapitsa ps reads them): the
 * model, device and KV cache type as an info metric's labels, the KV cache,
 * the weights and the process's resident memory. NULL when out of memory. */
static char *metrics_loaded(const struct app *a)
{
    int64_t weights;
    double kv;
    server_loaded_bytes(a, &weights, &kv);
    char name[512]; /* a label value escapes \\, " and newlines */
    size_t k = 0;
    for (const char *p = a->model_name; *p && k + 3 < sizeof name; p++) {
        if (*p == '\\' || *p == '"' || *p == '\n')
            name[k++] = '\\';
        name[k++] = *p == '\n' ? 'n' : *p;
    }
    name[k] = 0;
    char *text = NULL;
    return asprintf(&text,
                    "# HELP kapitsa_model_info The model served, the device it runs on, the KV cache's type.\n"
                    "# TYPE kapitsa_model_info gauge\nkapitsa_model_info{model=\"%s\",device=\"%s\",kv_type=\"%s\"} 1\n"
                    "# HELP kapitsa_kv_cache_tokens KV cache capacity in tokens, all sequences together.\n"
                    "# TYPE kapitsa_kv_cache_tokens gauge\nkapitsa_kv_cache_tokens %d\n"
                    "# HELP kapitsa_kv_cache_bytes Bytes of the KV cache (the draft's too).\n"
                    "# TYPE kapitsa_kv_cache_bytes gauge\nkapitsa_kv_cache_bytes %.0f\n"
                    "# HELP kapitsa_sequences_max Requests generated together (--parallel).\n"
                    "# TYPE kapitsa_sequences_max gauge\nkapitsa_sequences_max %d\n"
                    "# HELP kapitsa_weights_bytes Bytes of the model's weights (the draft's too).\n"
                    "# TYPE kapitsa_weights_bytes gauge\nkapitsa_weights_bytes %lld\n"
                    "# HELP process_resident_memory_bytes Resident memory of the server's process.\n"
                    "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %lld\n",
                    name, a->rt.be->ops->name, a->kv_type == DT_BF16 ? "bf16" : "f32", (int)sched_n_ctx(a->sched), kv,
                    (int)a->n_seq, (long long)weights, (long long)sysmem_resident()) < 0
               ? NULL
               : text;
}

/* Prometheus text exposition of the scheduler's counters and what is loaded. */
static enum MHD_Result metrics(struct app *a, struct MHD_Connection *c)
{
    struct sched_stats st;
    sched_get_stats(a->sched, &st);
    char *text = NULL, *loaded = metrics_loaded(a);
    int n = !loaded ? -1 : asprintf(&text,
                     "# HELP kapitsa_requests_total Generation requests accepted.\n# TYPE kapitsa_requests_total counter\n"
                     "kapitsa_requests_total %lld\n"
                     "# HELP kapitsa_requests_cancelled_total Requests whose client went away.\n"
                     "# TYPE kapitsa_requests_cancelled_total counter\nkapitsa_requests_cancelled_total %lld\n"
                     "# HELP kapitsa_requests_failed_total Requests ended by an engine error.\n"
                     "# TYPE kapitsa_requests_failed_total counter\nkapitsa_requests_failed_total %lld\n"
                     "# HELP kapitsa_prompt_tokens_total Prompt tokens of finished requests.\n"
                     "# TYPE kapitsa_prompt_tokens_total counter\nkapitsa_prompt_tokens_total %lld\n"
                     "# HELP kapitsa_cached_prompt_tokens_total Prompt tokens reused from resident conversations.\n"
                     "# TYPE kapitsa_cached_prompt_tokens_total counter\nkapitsa_cached_prompt_tokens_total %lld\n"
                     "# HELP kapitsa_generated_tokens_total Tokens generated.\n"
                     "# TYPE kapitsa_generated_tokens_total counter\nkapitsa_generated_tokens_total %lld\n"
                     "# HELP kapitsa_prefill_seconds_total Time from submission to first token, summed.\n"
                     "# TYPE kapitsa_prefill_seconds_total counter\nkapitsa_prefill_seconds_total %.6f\n"
                     "# HELP kapitsa_decode_seconds_total Time from first to last token, summed.\n"
                     "# TYPE kapitsa_decode_seconds_total counter\nkapitsa_decode_seconds_total %.6f\n"
                     "# HELP kapitsa_spec_passes_total KFlash verify passes, one per request per step.\n"
                     "# TYPE kapitsa_spec_passes_total counter\nkapitsa_spec_passes_total %lld\n"
                     "# HELP kapitsa_spec_tokens_total Tokens those passes produced.\n"
                     "# TYPE kapitsa_spec_tokens_total counter\nkapitsa_spec_tokens_total %lld\n"
                     "# HELP kapitsa_spec_forwards_total Target forwards running them (requests verified together).\n"
                     "# TYPE kapitsa_spec_forwards_total counter\nkapitsa_spec_forwards_total %lld\n"
                     "# HELP kapitsa_requests_active Requests being generated.\n# TYPE kapitsa_requests_active gauge\n"
                     "kapitsa_requests_active %d\n"
                     "# HELP kapitsa_requests_queued Requests waiting for a sequence slot.\n"
                     "# TYPE kapitsa_requests_queued gauge\nkapitsa_requests_queued %d\n"
                     "# HELP kapitsa_resident_sequences Conversations (and checkpoints) kept for prefix reuse.\n"
                     "# TYPE kapitsa_resident_sequences gauge\nkapitsa_resident_sequences %d\n"
                     "# HELP kapitsa_resident_tokens Tokens those hold in the KV cache.\n"
                     "# TYPE kapitsa_resident_tokens gauge\nkapitsa_resident_tokens %lld\n%s",
                     (long long)st.requests, (long long)st.cancelled, (long long)st.failed, (long long)st.prompt_tokens,
                     (long long)st.cached_tokens, (long long)st.generated_tokens, st.prefill_seconds, st.decode_seconds,
                     (long long)st.spec_passes, (long long)st.spec_tokens, (long long)st.spec_forwards, st.active, st.queued,
                     st.resident, (long long)st.resident_tokens, loaded);
    free(loaded);
    if (n < 0)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer((size_t)n, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    return http_queue(c, MHD_HTTP_OK, r);
}

/* GET /status: what the web page's panel shows, as JSON: the model, memory,
 * requests, the conversations the KV cache keeps, the rates since start
 * (prefill: prompt tokens not cached over the time to first token; decode:
 * each request's tokens after its first over the time after it) and KFlash's
 * tokens per verify pass (null when speculation is off). */
static enum MHD_Result status(struct app *a, struct MHD_Connection *c)
{
    struct sched_stats st;
    sched_get_stats(a->sched, &st);
    int64_t weights;
    double kv;
    server_loaded_bytes(a, &weights, &kv);
    const int64_t finished = st.requests - st.active - st.queued, decoded = st.generated_tokens - finished;
    const int64_t prefilled = st.prompt_tokens - st.cached_tokens;
    const double prefill = st.prefill_seconds > 0 ? (double)prefilled / st.prefill_seconds : 0,
                 decode = st.decode_seconds > 0 && decoded > 0 ? (double)decoded / st.decode_seconds : 0;
    json_t *memory = json_pack("{s:I,s:I,s:I,s:i}", "resident_bytes", (json_int_t)sysmem_resident(), "weights_bytes",
                               (json_int_t)weights, "kv_cache_bytes", (json_int_t)kv, "kv_cache_tokens",
                               (int)sched_n_ctx(a->sched));
    json_t *requests = json_pack("{s:I,s:i,s:i,s:I,s:I}", "total", (json_int_t)st.requests, "active", (int)st.active,
                                 "queued", (int)st.queued, "cancelled", (json_int_t)st.cancelled, "failed",
                                 (json_int_t)st.failed);
    json_t *tokens = json_pack("{s:I,s:I,s:I}", "prompt", (json_int_t)st.prompt_tokens, "cached",
                               (json_int_t)st.cached_tokens, "generated", (json_int_t)st.generated_tokens);
    json_t *kflash = !a->kflash ? json_null()
                                : json_pack("{s:I,s:I,s:I,s:f}", "passes", (json_int_t)st.spec_passes, "tokens",
                                            (json_int_t)st.spec_tokens, "forwards", (json_int_t)st.spec_forwards,
                                            "tokens_per_pass",
                                            st.spec_passes ? (double)st.spec_tokens / (double)st.spec_passes : 0.0);
    return http_json(c, MHD_HTTP_OK,
                     json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:{s:i,s:I},s:o,s:{s:f,s:f},s:o}", "model", a->model_name,
                               "device", a->rt.be->ops->name, "kv_type", a->kv_type == DT_BF16 ? "bf16" : "f32",
                               "parallel", (int)a->n_seq, "memory", memory, "requests", requests, "resident",
                               "conversations", (int)st.resident, "tokens", (json_int_t)st.resident_tokens, "tokens",
                               tokens, "tok_s", "prefill", prefill, "decode", decode, "kflash", kflash));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct app *a = cls;
    struct conn_state *st = *con_cls;
    bool ant = strncmp(url, "/v1/messages", 12) == 0;
    enum MHD_Result (*fail)(struct MHD_Connection *, unsigned, const char *, const char *, ...) =
        ant ? http_anthropic_error : http_openai_error;
    const bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    size_t web = sizeof web_files / sizeof web_files[0];
    while (web > 0 && strcmp(url, web_files[web - 1].url) != 0)
        web--;
    if (!get && strcmp(method, "HEAD") != 0)
        web = 0;
    if (!st) { /* the headers are in: refuse a request without the key before its body comes */
        if (cors_origin && strcmp(method, "OPTIONS") == 0)
            return cors_preflight(c);
        if (strcmp(url, "/health") != 0 && !web && !key_ok(a, c))
            return fail(c, MHD_HTTP_UNAUTHORIZED, "authentication_error", "invalid or missing API key");
        st = calloc(1, sizeof *st);
        if (!st)
            return MHD_NO;
        *con_cls = st;
        return MHD_YES;
    }
    if (*upload_size) { /* body bytes arrive in pieces */
        if (st->n + *upload_size > SERVER_MAX_BODY) {
            st->too_big = true;
        } else {
            if (st->n + *upload_size + 1 > st->cap) {
                size_t nc = st->cap ? st->cap * 2 : 65536;
                while (nc < st->n + *upload_size + 1)
                    nc *= 2;
                char *nb = realloc(st->body, nc);
                if (!nb)
                    return MHD_NO;
                st->body = nb;
                st->cap = nc;
            }
            memcpy(st->body + st->n, upload, *upload_size);
            st->n += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, SERVER_ANSWER_TIMEOUT_S);
    if (strcmp(url, "/health") == 0)
        return http_json(c, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
    if (st->too_big)
        return fail(c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request body larger than %u bytes",
                    SERVER_MAX_BODY);
    if (web)
        return web_file(a, c, web - 1);
    const bool models = strcmp(url, "/v1/models") == 0, metrics_url = strcmp(url, "/metrics") == 0,
               status_url = strcmp(url, "/status") == 0;
    if ((models || metrics_url || status_url) && !get)
        return fail(c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "use GET");
    if (status_url)
        return status(a, c);
    if (models)
        return openai_models(a, c, NULL);
    if (get && strncmp(url, "/v1/models/", 11) == 0)
        return openai_models(a, c, url + 11);
    if (get && strncmp(url, "/v1/responses/", 14) == 0)
        return openai_response_get(a, c, url + 14);
    if (metrics_url)
        return metrics(a, c);
    enum MHD_Result (*handler)(struct app *, struct MHD_Connection *, json_t *) =
        strcmp(url, "/v1/chat/completions") == 0 ? openai_chat
        : strcmp(url, "/v1/responses") == 0      ? openai_responses
        : strcmp(url, "/v1/completions") == 0    ? openai_completions
        : strcmp(url, "/v1/messages") == 0       ? anthropic_messages
        : strcmp(url, "/v1/messages/count_tokens") == 0 ? anthropic_count_tokens
                                                        : NULL;
    if (!handler)
        return fail(c, MHD_HTTP_NOT_FOUND, ant ? "not_found_error" : "invalid_request_error", "no route %s %s", method,
                    url);
    if (!post)
        return fail(c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "use POST");
    if (json_count_values(st->body, st->n) > SERVER_MAX_JSON)
        return fail(c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request body has more than %u JSON values",
                    SERVER_MAX_JSON);
    json_error_t je;
    json_t *body = json_loadb(st->body ? st->body : "", st->n, 0, &je);
    if (!json_is_object(body)) {
        json_decref(body);
        return fail(c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "the body is not a JSON object (%s)",
                    st->n ? je.text : "empty body");
    }
    enum MHD_Result r = handler(a, c, body);
    json_decref(body);
    return r;
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)toe;
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, SERVER_REQUEST_TIMEOUT_S); /* until the next request */
    struct conn_state *st = *con_cls;
    if (st) {
        free(st->body);
        if (st->cap >= SERVER_TRIM_BYTES)
            malloc_trim(0); /* the body's and its parse's memory: free() keeps most of it in the heap */
        free(st);
    }
    *con_cls = NULL;
}

/* The signal may land on any thread (engine, pool, connections): its handler
 * only writes a byte to this pipe, which wakes the main thread at once. */
static int stop_pipe[2] = {-1, -1};
static void on_signal(int sig)
{
    (void)sig;
    const int e = errno;
    const char b = 1;
    (void)!write(stop_pipe[1], &b, 1);
    errno = e;
}

/* The address --host names (a name, an IPv4 address, an IPv6 one bare or in
 * brackets) into addr; an IPv4 one where a name has both, as the loopback's
 * clients (launch among them) reach 127.0.0.1. url_host: the host as a URL
 * writes it. */
static int server_addr(const char *host, uint16_t port, struct sockaddr_storage *addr, char *url_host, size_t n)
{
    char h[256], p[8];
    const size_t len = strlen(host);
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']')
        snprintf(h, sizeof h, "%.*s", (int)(len - 2), host + 1);
    else
        snprintf(h, sizeof h, "%s", host);
    snprintf(p, sizeof p, "%u", (unsigned)port);
    struct addrinfo hints = {.ai_flags = AI_NUMERICSERV, .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    const int e = getaddrinfo(h, p, &hints, &res);
    if (e != 0)
        return err_set("server: --host '%s': %s", host, e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *r = res; r; r = r->ai_next)
        if ((r->ai_family == AF_INET || r->ai_family == AF_INET6) && (!pick || (pick->ai_family == AF_INET6 &&
                                                                               r->ai_family == AF_INET)))
            pick = r;
    if (pick)
        memcpy(addr, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    if (!pick)
        return err_set("server: --host '%s' has no IPv4 or IPv6 address", host);
    snprintf(url_host, n, addr->ss_family == AF_INET6 && !strchr(host, '[') ? "[%s]" : "%s", host);
    return 0;
}

/* The KV cache of n_ctx tokens must fit the memory left on the cpu (a GPU's
 * allocations fail by themselves, with their own message; the host's are
 * granted and then killed for), else the message says what to lower. */
static int server_check_memory(const struct app *a, int32_t n_ctx, enum dtype kv_type)
{
    struct device_info di;
    a->rt.be->ops->info(a->rt.be, &di, false);
    if (di.gpu)
        return 0;
    const int64_t avail = sysmem_available();
    double per_token = server_kv_bytes(&a->rt.m, 1, kv_type);
    if (a->rt.d_loaded)
        per_token += server_kv_bytes(&a->rt.dm, 1, kv_type);
    if (avail < 0 || per_token * n_ctx <= (double)avail)
        return 0;
    return err_set("server: the KV cache of %d tokens (%s) needs %.2f GB, and %.2f GB of memory is available: "
                   "lower --ctx (%lld tokens fit)%s",
                   (int)n_ctx, kv_type == DT_BF16 ? "bf16" : "f32", per_token * n_ctx / 1e9, (double)avail / 1e9,
                   (long long)((double)avail / per_token), kv_type == DT_BF16 ? "" : " or take --kv-type bf16 (half)");
}

int server_run(const struct server_opts *o)
{
    struct app a = {0};
    struct MHD_Daemon *d = NULL;
    int rc = -1;
    if (o->api_key && !*o->api_key) {
        err_set("server: the API key is empty (leave --api-key out to serve without one)");
        goto done;
    }
    a.api_key = o->api_key;
    cors_origin = o->cors;
    a.kflash = o->spec.mode != SPEC_OFF;
    a.model_name = o->model_name;
    a.keepalive_s = o->keepalive_s > 0 ? o->keepalive_s : 10.0;
    if (!(a.responses = resp_store_new(SERVER_STORED_RESPONSES, SERVER_STORED_BYTES))) {
        err_set("server: out of memory");
        goto done;
    }
    a.n_seq = o->n_seq;
    a.kv_type = o->kv_type;
    struct sockaddr_storage addr = {0};
    char host[300];
    if (server_addr(o->host, o->port, &addr, host, sizeof host) != 0) /* before the minutes a model may take */
        goto done;
    const struct runtime_opts ro = {.device = o->device, .threads = o->threads, .model = o->model_dir,
                                    .draft = o->draft_dir, .tokenizer = true, .chat_template = true,
                                    .progress = o->load_progress, .progress_ctx = o->load_progress_ctx};
    if (runtime_open(&a.rt, &ro) != 0)
        goto done;
    struct backend *be = a.rt.be;
    if (a.rt.m.st.n_copied)
        fprintf(stderr, "kapitsa: %d tensors are not aligned in the checkpoint's files: read into memory (%.1f MB)\n",
                (int)a.rt.m.st.n_copied, (double)a.rt.m.st.copied_bytes / 1e6);
    if (tok_vocab_bytes(a.rt.tok, a.rt.m.cfg.vocab_size, &a.vb) != 0 ||
        vocab_bytes_set_end(&a.vb, a.rt.m.cfg.eos_id, a.rt.m.cfg.n_eos) != 0)
        goto done;
    /* one conversation can use the whole cache, and clients are told it as max_model_len: no more than
     * the model's positions */
    int32_t n_ctx = o->n_ctx;
    const int32_t max_pos = a.rt.m.cfg.max_position;
    if (max_pos > 0 && n_ctx > max_pos) {
        fprintf(stderr, "kapitsa: warning: --ctx %d is past the model's context (max_position_embeddings %d): "
                        "%d tokens of KV cache\n", (int)n_ctx, (int)max_pos, (int)max_pos);
        n_ctx = max_pos;
    }
    if (server_check_memory(&a, n_ctx, o->kv_type) != 0)
        goto done;
    const int32_t chunk = o->prefill_chunk > 0 ? o->prefill_chunk : be->ops->prefill_chunk;
    if (!(a.sched = sched_new(&a.rt.m, n_ctx, o->n_seq, chunk > SERVER_MIN_BATCH ? chunk : SERVER_MIN_BATCH, chunk,
                              o->kv_type, a.rt.d_loaded ? &a.rt.dm : NULL, &o->spec)))
        goto done;
    const int32_t n_tuned = o->tune_path ? sched_spec_persist(a.sched, o->tune_path, o->tune_key) : 0;
    const bool loopback = addr.ss_family == AF_INET6
                              ? IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&addr)->sin6_addr)
                              : (ntohl(((struct sockaddr_in *)&addr)->sin_addr.s_addr) >> 24) == 127;
    if (!a.api_key && !loopback)
        fprintf(stderr, "kapitsa: warning: listening on %s without --api-key: anyone who can reach this address can "
                        "use the model\n", host);
    /* an IPv6 address needs its flag; the unspecified one (::) takes IPv4 clients too */
    const struct in6_addr any6 = IN6ADDR_ANY_INIT;
    const unsigned family = addr.ss_family != AF_INET6 ? 0
                            : memcmp(&((struct sockaddr_in6 *)&addr)->sin6_addr, &any6, sizeof any6) == 0
                                ? MHD_USE_DUAL_STACK
                                : MHD_USE_IPv6;
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG | family, o->port,
                         NULL, NULL, on_request, &a, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_CONNECTION_LIMIT, SERVER_MAX_CONN,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, SERVER_MAX_PER_IP,
                         MHD_OPTION_CONNECTION_TIMEOUT, SERVER_REQUEST_TIMEOUT_S, /* idle seconds */
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 << 10), /* headers and read buffer */
                         MHD_OPTION_END);
    if (!d) {
        err_set("server: cannot listen on %s:%u", host, (unsigned)o->port);
        goto done;
    }
    /* port 0: the system picked a free one, which the banner reports */
    const union MHD_DaemonInfo *bound = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    const unsigned port = bound && bound->port ? bound->port : o->port;
    /* on stderr with the log, and on stdout, where a user or a script reads a
     * command's answer, unless both are the same file (a terminal): once there */
    struct stat so, se;
    const bool same = fstat(1, &so) == 0 && fstat(2, &se) == 0 && so.st_dev == se.st_dev && so.st_ino == se.st_ino;
    for (int k = 0; k < (same ? 1 : 2); k++)
        fprintf(k ? stdout : stderr,
                "kapitsa: serving %s on http://%s:%u\n"
                "  OpenAI API:    base URL http://%s:%u/v1 (chat completions, responses, completions)\n"
                "  Anthropic API: base URL http://%s:%u (messages)\n"
                "  Claude Code:   ANTHROPIC_BASE_URL=http://%s:%u ANTHROPIC_AUTH_TOKEN=%s ANTHROPIC_MODEL=%s claude\n"
                "  Codex:         codex -c model_provider=kapitsa -c 'model_providers.kapitsa={name=\"kapitsa\","
                "base_url=\"http://%s:%u/v1\",wire_api=\"responses\"}' -m %s\n"
                "  opencode, pi:  an OpenAI-compatible provider at http://%s:%u/v1, model %s\n"
                "  or configured for you: kapitsa launch claude|codex|opencode|pi|qwen --port %u\n"
                "  in a browser:  http://%s:%u/ (a chat with the model, the server's status)\n",
                a.model_name, host, port, host, port, host, port, host, port,
                a.api_key ? "<the --api-key value>" : "local", a.model_name, host, port, a.model_name, host, port,
                a.model_name, port, host, port);
    fflush(stdout);
    const struct model_config *mc = &a.rt.m.cfg;
    fprintf(stderr,
            "  sampling defaults (generation_config.json; a request's own fields win): temperature %g, top_p %g, "
            "top_k %d, min_p %g, repetition_penalty %g\n",
            (double)mc->gen_temperature, (double)mc->gen_top_p, (int)mc->gen_top_k, (double)mc->gen_min_p,
            (double)mc->gen_repeat_penalty);
    fprintf(stderr, "  KV cache:      %d tokens over %d sequences, %s (--kv-type f32|bf16)\n", (int)n_ctx, (int)o->n_seq,
            o->kv_type == DT_BF16 ? "bf16" : "f32");
    fprintf(stderr, "  prompts:       fed %d tokens a step on %s, beside the decoding requests (--prefill-chunk)\n",
            (int)chunk, be->ops->name);
    if (o->tune_path && o->spec.tune)
        fprintf(stderr, "  KFlash tuner:  %s, kept in %s\n",
                n_tuned ? "goes on from what it learnt before on this machine, model pair and device"
                        : "learns the tree shapes that pay here from nothing",
                o->tune_path);
    if (pipe(stop_pipe) != 0) {
        err_set("server: pipe: %s", strerror(errno));
        goto done;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    char b;
    while (read(stop_pipe[0], &b, 1) != 1)
        ;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    rc = 0;
done:
    /* in-flight requests end first (as cancelled), so that the connections'
     * threads return and the daemon stops without generating them out */
    sched_stop(a.sched);
    if (d)
        MHD_stop_daemon(d);
    sched_free(a.sched);
    resp_store_free(a.responses);
    vocab_bytes_free(&a.vb);
    runtime_close(&a.rt);
    for (int i = 0; i < 2; i++)
        if (stop_pipe[i] >= 0) {
            close(stop_pipe[i]);
            stop_pipe[i] = -1;
        }
    return rc;
}
