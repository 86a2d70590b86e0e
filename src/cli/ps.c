/* kapitsa ps: what a running server has loaded, asked of the server itself:
 * GET /v1/models (the model and its max_model_len) and GET /metrics (the
 * device, KV cache, memory and requests, Prometheus' text), through
 * cli_server_get (cli.h). */
#include "../base/err.h"
#include "cli.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ps_body {
    char *p;
    size_t n;
};

static size_t ps_collect(char *data, size_t size, size_t n, void *ctx)
{
    struct ps_body *b = ctx;
    char *q = realloc(b->p, b->n + size * n + 1);
    if (!q)
        return 0;
    memcpy(q + b->n, data, size * n);
    b->n += size * n;
    q[b->n] = 0;
    b->p = q;
    return size * n;
}

int cli_server_get(const char *base, const char *path, const char *key, char **body)
{
    char url[1024], auth[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    struct ps_body b = {calloc(1, 1), 0};
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    if (key && *key) {
        snprintf(auth, sizeof auth, "x-api-key: %s", key);
        h = curl_slist_append(NULL, auth);
    }
    CURLcode cc = CURLE_OUT_OF_MEMORY;
    long status = 0;
    if (c && b.p) {
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 2L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
        curl_easy_setopt(c, CURLOPT_NOPROXY, "*"); /* a local server, whatever the proxy settings say */
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, ps_collect);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        cc = curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    }
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (cc != CURLE_OK || status != 200) {
        free(b.p);
        if (cc != CURLE_OK)
            err_set("no server answers at %s (%s)", base, curl_easy_strerror(cc));
        else
            err_set("GET %s: status %ld%s", url, status,
                    status == 401 ? " (the server wants its --api-key: --api-key or KAPITSA_API_KEY)" : "");
        return cc != CURLE_OK ? 0 : (int)status;
    }
    *body = b.p;
    return 200;
}

void cli_server_url(char *out, size_t n, const char *host, int port)
{
    const int v6 = strchr(host, ':') && host[0] != '[';
    snprintf(out, n, "http://%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

/* The value of the sample name{...} (or name alone) in Prometheus text, a JSON
 * integer; null when absent (a server older than the metric). */
static json_t *ps_metric(const char *text, const char *name)
{
    const size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) != 0 || (l[n] != ' ' && l[n] != '{'))
            continue;
        const char *v = l[n] == '{' ? strchr(l + n, '}') : l + n;
        if (v)
            return json_integer((json_int_t)strtod(v + (*v == '}'), NULL));
    }
    return json_null();
}

/* The label key of kapitsa_model_info into out ("" when absent). */
static void ps_label(const char *text, const char *key, char *out, size_t n)
{
    char pat[64];
    snprintf(pat, sizeof pat, "%s=\"", key);
    const char *l = strstr(text, "\nkapitsa_model_info{"), *p = l ? strstr(l, pat) : NULL, *end = strchr(l ? l + 1 : "", '\n');
    out[0] = 0;
    if (!p || (end && p > end))
        return;
    p += strlen(pat);
    size_t k = 0;
    for (; *p && *p != '"' && k + 1 < n; p++)
        out[k++] = *p == '\\' && p[1] ? *++p : *p;
    out[k] = 0;
}

static void ps_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa ps [--host ADDR] [--port N] [--api-key KEY] [--json]\n"
               "  asks the server at ADDR:N (default 127.0.0.1:11435, or KAPITSA_HOST and KAPITSA_PORT; the key from\n"
               "  KAPITSA_API_KEY) what it has loaded: the model, its memory, the KV cache, the requests and\n"
               "  the conversations it keeps for prefix reuse\n");
}

/* The report of the server at base as a JSON object; NULL with err_set(). */
static json_t *ps_report(const char *base, const char *key)
{
    char *models = NULL, *metrics = NULL;
    json_t *m = NULL, *r = NULL;
    if (cli_server_get(base, "/v1/models", key, &models) != 200 ||
        cli_server_get(base, "/metrics", key, &metrics) != 200)
        goto fail;
    m = json_loads(models, 0, NULL);
    json_t *first = json_array_get(json_object_get(m, "data"), 0);
    if (!json_is_string(json_object_get(first, "id"))) {
        err_set("%s/v1/models names no model: is it a kapitsa server?", base);
        goto fail;
    }
    char device[64], kv_type[16];
    ps_label(metrics, "device", device, sizeof device);
    ps_label(metrics, "kv_type", kv_type, sizeof kv_type);
#define I(name) ps_metric(metrics, name)
    r = json_pack("{s:s,s:O,s:s,s:I,s:{s:o,s:o,s:s},s:o,s:{s:o,s:o},s:{s:o,s:o,s:o,s:o,s:o,s:o},s:{s:o,s:o}}",
                  "url", base,
                  "model", json_object_get(first, "id"), "device", device, "max_model_len",
                  json_integer_value(json_object_get(first, "max_model_len")), "kv_cache", "tokens",
                  I("kapitsa_kv_cache_tokens"),
                  "bytes", I("kapitsa_kv_cache_bytes"), "type", kv_type, "sequences", I("kapitsa_sequences_max"),
                  "memory", "resident_bytes", I("process_resident_memory_bytes"), "weights_bytes",
                  I("kapitsa_weights_bytes"), "requests", "active", I("kapitsa_requests_active"), "queued",
                  I("kapitsa_requests_queued"), "total", I("kapitsa_requests_total"), "prompt_tokens",
                  I("kapitsa_prompt_tokens_total"), "cached_prompt_tokens", I("kapitsa_cached_prompt_tokens_total"),
                  "generated_tokens", I("kapitsa_generated_tokens_total"), "resident", "sequences",
                  I("kapitsa_resident_sequences"), "tokens", I("kapitsa_resident_tokens"));
#undef I
    if (!r)
        err_set("out of memory");
fail:
    json_decref(m);
    free(models);
    free(metrics);
    return r;
}

#define GET(o, k) json_integer_value(json_object_get(o, k))

static void ps_print(const json_t *r)
{
    const json_t *kv = json_object_get(r, "kv_cache"), *mem = json_object_get(r, "memory"),
                 *rq = json_object_get(r, "requests"), *res = json_object_get(r, "resident");
    printf("server     %s\n", json_string_value(json_object_get(r, "url")));
    printf("model      %s on %s, %lld tokens of context (max_model_len)\n",
           json_string_value(json_object_get(r, "model")), json_string_value(json_object_get(r, "device")),
           (long long)GET(r, "max_model_len"));
    printf("KV cache   %lld tokens, %s, %.2f GB; %lld requests generated together\n", (long long)GET(kv, "tokens"),
           json_string_value(json_object_get(kv, "type")), (double)GET(kv, "bytes") / 1e9,
           (long long)GET(r, "sequences"));
    printf("memory     %.2f GB resident in the server's process, %.2f GB of weights\n",
           (double)GET(mem, "resident_bytes") / 1e9, (double)GET(mem, "weights_bytes") / 1e9);
    printf("requests   %lld active, %lld queued; %lld since it started (%lld prompt tokens, %lld of them cached, "
           "%lld generated)\n",
           (long long)GET(rq, "active"), (long long)GET(rq, "queued"), (long long)GET(rq, "total"),
           (long long)GET(rq, "prompt_tokens"), (long long)GET(rq, "cached_prompt_tokens"),
           (long long)GET(rq, "generated_tokens"));
    if (json_is_integer(json_object_get(res, "sequences"))) /* a server older than the metric has none */
        printf("resident   %lld conversation%s kept for prefix reuse, %lld tokens cached\n",
               (long long)GET(res, "sequences"), GET(res, "sequences") == 1 ? "" : "s", (long long)GET(res, "tokens"));
}

int cli_ps(int argc, char **argv)
{
    const char *host = getenv("KAPITSA_HOST"), *key = getenv("KAPITSA_API_KEY"), *v = NULL;
    int64_t port = 11435;
    int json = 0;
    if (cli_env_int("KAPITSA_PORT", 1, 65535, &port) < 0)
        return 2;
    for (int i = 0; i < argc; i++) {
        int f;
        if (cli_switch(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--host", &host)) != 0 || (f = cli_flag(argc, argv, &i, "--api-key", &key))) {
            if (f < 0)
                return 2;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--port", &v)) != 0) {
            if (f < 0 || (port = cli_int(v)) < 1 || port > 65535) {
                ps_usage(stderr);
                return 2;
            }
            continue;
        }
        return cli_arg_reject(argv[i], ps_usage);
    }
    char base[512];
    cli_server_url(base, sizeof base, host && *host ? host : "127.0.0.1", (int)port);
    json_t *r = ps_report(base, key);
    if (!r) {
        fprintf(stderr, "kapitsa ps: %s\n", err_msg());
        return 1;
    }
    if (json) {
        json_dumpf(r, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        putchar('\n');
    } else {
        ps_print(r);
    }
    json_decref(r);
    return 0;
}
