/* kapitsa bench compare: the same streaming workload through the OpenAI API
 * to several servers (Kapitsa, llama-server, Ollama, vLLM, ...), timed on
 * the client from the streamed bytes: time to first token and decode speed
 * per prompt length, min / median / max over repetitions, as a table and an
 * SVG chart.
 *
 * Each request is POST URL/completions with a raw prompt (no chat template,
 * so every server sees the same text), temperature 0, max_tokens, stream,
 * stream_options.include_usage and ignore_eos (honoured by llama-server and
 * vLLM). Prompt lengths are in words of a fixed code-like text, so each
 * server's tokenizer sees identical input; the token counts it reports in
 * usage are shown beside. TTFT is from sending the request to the first
 * streamed text; decode tok/s is (completion tokens - 1) over the time from
 * the first to the last streamed text. */
#define _GNU_SOURCE
#include "../base/clock.h"
#include "../base/err.h"
#include "../backend/cpu/cpu.h"
#include "cli.h"
#include "progress.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CMP_MAX_TARGETS 8
#define CMP_MAX_LENS 8
#define CMP_MAX_REPS 32

struct stream {
    char *line;
    size_t n, cap;
    double t0, t_first, t_last;
    int32_t n_text, usage_out, usage_in;
    char err[256];
};

static void on_event(struct stream *s, const char *data)
{
    if (strcmp(data, "[DONE]") == 0)
        return;
    json_t *j = json_loads(data, 0, NULL);
    if (!j)
        return;
    json_t *err = json_object_get(j, "error");
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        snprintf(s->err, sizeof s->err, "%s", m ? m : "error event");
    }
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = ch ? json_string_value(json_object_get(ch, "text")) : NULL;
    if (text && *text) {
        double t = clock_now_s();
        if (!s->n_text)
            s->t_first = t;
        s->t_last = t;
        s->n_text++;
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        s->usage_out = (int32_t)json_integer_value(json_object_get(u, "completion_tokens"));
        s->usage_in = (int32_t)json_integer_value(json_object_get(u, "prompt_tokens"));
    }
    json_decref(j);
}

static size_t on_bytes(char *data, size_t sz, size_t nm, void *ctx)
{
    struct stream *s = ctx;
    size_t len = sz * nm;
    for (size_t i = 0; i < len; i++) {
        if (s->n + 1 >= s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 4096;
            char *p = realloc(s->line, cap);
            if (!p)
                return 0;
            s->line = p;
            s->cap = cap;
        }
        if (data[i] != '\n') {
            s->line[s->n++] = data[i];
            continue;
        }
        s->line[s->n] = 0;
        if (s->n && s->line[s->n - 1] == '\r')
            s->line[--s->n] = 0;
        if (strncmp(s->line, "data:", 5) == 0)
            on_event(s, s->line + 5 + (s->line[5] == ' '));
        else if (s->line[0] == '{') /* a plain JSON error body */
            on_event(s, s->line);
        s->n = 0;
    }
    return len;
}

static size_t whole(char *data, size_t sz, size_t nm, void *ctx)
{
    struct stream *s = ctx;
    size_t len = sz * nm;
    if (s->n + len + 1 > s->cap) {
        size_t cap = (s->n + len + 1) * 2;
        char *p = cap < (16u << 20) ? realloc(s->line, cap) : NULL;
        if (!p)
            return 0;
        s->line = p;
        s->cap = cap;
    }
    memcpy(s->line + s->n, data, len);
    s->n += len;
    s->line[s->n] = 0;
    return len;
}

/* The request's headers: JSON, and the key as a bearer token when one is given. */
static struct curl_slist *headers(const char *api_key)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (api_key && *api_key) {
        char auth[1100];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, auth);
    }
    return h;
}

/* The first model the server lists (GET URL/models), for servers that need a name. */
static int first_model(const char *url, const char *api_key, char *out, size_t n)
{
    char u[1024];
    snprintf(u, sizeof u, "%s/models", url);
    struct stream s = {0};
    struct curl_slist *h = headers(api_key);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, whole);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    CURLcode cc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    int rc = -1;
    json_t *j = cc == CURLE_OK && s.line ? json_loads(s.line, 0, NULL) : NULL;
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    if (cc != CURLE_OK) {
        err_set("compare: %s: %s", u, curl_easy_strerror(cc));
    } else if (code == 401 || code == 403) {
        err_set("compare: %s: HTTP %ld: the server wants a key (--api-key)", u, code);
    } else if (id) {
        snprintf(out, n, "%s", id);
        rc = 0;
    } else {
        err_set("compare: %s lists no model (is it an OpenAI-compatible /v1 base URL?)", u);
    }
    json_decref(j);
    free(s.line);
    return rc;
}

/* A prompt of `words` words of code-like text, the same for every server. */
static char *make_prompt(int32_t words)
{
    static const char *const w[] = {"def", "parse", "(", "line", ")", ":", "return", "int", "value", "+", "1",
                                    "for", "item", "in", "items", "if", "not", "None", "else", "result", "=",
                                    "self", ".", "count", "#", "update", "the", "cache", "when", "it", "grows"};
    const int nw = (int)(sizeof w / sizeof w[0]);
    size_t cap = (size_t)words * 9 + 16, n = 0;
    char *p = malloc(cap);
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int32_t i = 0; p && i < words; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        n += (size_t)snprintf(p + n, cap - n, "%s%s", w[(r >> 33) % (uint64_t)nw], i % 12 == 11 ? "\n" : " ");
    }
    return p;
}

struct sample {
    double ttft, tps;
    int32_t n_in, n_out;
};

static int one_request(const char *url, const char *api_key, const char *model, const char *prompt,
                       int32_t max_tokens, struct sample *out)
{
    char u[1024];
    snprintf(u, sizeof u, "%s/completions", url);
    json_t *body = json_pack("{s:s,s:s,s:i,s:f,s:b,s:{s:b},s:b,s:i}", "model", model, "prompt", prompt,
                             "max_tokens", max_tokens, "temperature", 0.0, "stream", 1, "stream_options",
                             "include_usage", 1, "ignore_eos", 1, "seed", 1);
    char *txt = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct curl_slist *h = headers(api_key);
    struct stream s = {0};
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, txt);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_bytes);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 1800L);
    s.t0 = clock_now_s();
    CURLcode cc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    free(txt);
    if (s.n) { /* an error body without a final newline */
        s.line[s.n] = 0;
        if (s.line[0] == '{')
            on_event(&s, s.line);
    }
    free(s.line);
    if (cc != CURLE_OK)
        return err_set("compare: %s: %s", u, curl_easy_strerror(cc));
    if (code != 200 || s.err[0])
        return err_set("compare: %s: HTTP %ld%s%s", u, code, s.err[0] ? ": " : "", s.err);
    if (s.n_text == 0)
        return err_set("compare: %s streamed no text", u);
    int32_t n_out = s.usage_out > 0 ? s.usage_out : s.n_text;
    out->ttft = s.t_first - s.t0;
    out->tps = n_out > 1 && s.t_last > s.t_first ? (double)(n_out - 1) / (s.t_last - s.t_first) : 0.0;
    out->n_in = s.usage_in;
    out->n_out = n_out;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* min, median, max */
static void stats(const double *v, int32_t n, double *o)
{
    double s[CMP_MAX_REPS];
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    o[0] = s[0];
    o[1] = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    o[2] = s[n - 1];
}

struct result {
    double ttft[3], tps[3];
    int32_t n_in, n_out;
};

/* The decades (powers of ten) a log axis spans to hold [lo, hi]. */
static void log_span(double lo, double hi, double *d0, double *d1)
{
    lo = lo > 0 ? lo : 1e-3;
    hi = hi > lo ? hi : lo * 10;
    *d0 = floor(log10(lo));
    *d1 = ceil(log10(hi));
    if (*d1 <= *d0)
        *d1 = *d0 + 1;
}

/* Two panels of grouped bars on log axes (median, with a min-max whisker):
 * decode tok/s and TTFT, so a slow server's short bars stay readable; a
 * title naming the models, the machine and the date; ticks at 1, 2 and 5
 * of each decade. */
static int write_svg(const char *path, char **urls, char **models, int32_t n_t, const int32_t *lens, int32_t n_l,
                     struct result r[][CMP_MAX_LENS], int32_t reps, int32_t gen)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set("compare: cannot write %s", path);
    static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                         "#e377c2", "#7f7f7f"};
    const int W = 440, H = 300, top = 70, left = 64, ph = 180;
    char host[256] = "", when[64] = "";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "this machine");
    host[sizeof host - 1] = 0;
    const time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
    struct cpu_host ch;
    cpu_host_query(&ch);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            2 * W, H + 20 * n_t);
    fprintf(f, "<text x=\"%d\" y=\"18\" font-size=\"14\">kapitsa bench compare: ", left);
    for (int32_t t = 0; t < n_t; t++)
        fprintf(f, "%s%s", t ? " vs " : "", models[t]);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"34\">client on %s (%s), %s; %d tokens greedily, median of %d, "
               "whiskers min-max</text>\n",
            left, host, ch.model, when, gen, reps);
    for (int panel = 0; panel < 2; panel++) {
        double lo = INFINITY, hi = 0, d0, d1;
        for (int32_t t = 0; t < n_t; t++)
            for (int32_t l = 0; l < n_l; l++) {
                const double *v = panel ? r[t][l].ttft : r[t][l].tps, k = panel ? 1e3 : 1;
                lo = fmin(lo, v[0] * k);
                hi = fmax(hi, v[2] * k);
            }
        log_span(lo, hi, &d0, &d1);
        const int x0 = panel * W + left, x1 = x0 + W - left - 20;
        /* y of value v on the panel's log axis */
#define Y_OF(v) (top + ph - (log10(fmax((v), pow(10, d0))) - d0) / (d1 - d0) * ph)
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"13\">%s</text>\n", x0, top - 12,
                panel ? "time to first token, ms (lower is better)" : "decode tok/s (higher is better)");
        for (double d = d0; d <= d1; d++)
            for (int m = 1; m <= 5; m += m == 1 ? 1 : 3) {
                const double v = m * pow(10, d);
                if (log10(v) > d1 + 1e-9)
                    break;
                const double y = Y_OF(v);
                fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                           "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                        x0, y, x1, y, x0 - 4, y + 4, v);
            }
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", x0, top + ph, x1,
                top + ph);
        const double gw = (double)(x1 - x0) / n_l, bw = gw * 0.8 / n_t;
        for (int32_t l = 0; l < n_l; l++) {
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d words</text>\n", x0 + gw * (l + 0.5),
                    top + ph + 14, lens[l]);
            for (int32_t t = 0; t < n_t; t++) {
                const double *v = panel ? r[t][l].ttft : r[t][l].tps, k = panel ? 1e3 : 1;
                const double x = x0 + gw * l + gw * 0.1 + bw * t, y = Y_OF(v[1] * k);
                fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", x, y,
                        bw * 0.9, top + ph - y, colors[t % 8]);
                fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                        x + bw * 0.45, Y_OF(v[0] * k), x + bw * 0.45, Y_OF(v[2] * k));
            }
        }
#undef Y_OF
    }
    for (int32_t t = 0; t < n_t; t++)
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s "
                   "(%s)</text>\n",
                left, H + 20 * t - 10, colors[t % 8], left + 16, H + 20 * t, models[t], urls[t]);
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : err_set("compare: cannot write %s", path);
}

/* A warning for each server and length whose own runs spread by more than a
 * quarter of their median: its figures are not to be compared as they are. */
static void warn_spread(char **urls, int32_t n_t, const int32_t *lens, int32_t n_l, struct result r[][CMP_MAX_LENS])
{
    for (int32_t t = 0; t < n_t; t++)
        for (int32_t l = 0; l < n_l; l++) {
            const double *v[2] = {r[t][l].tps, r[t][l].ttft};
            for (int k = 0; k < 2; k++)
                if (v[k][1] > 0 && (v[k][2] - v[k][0]) / v[k][1] > 0.25)
                    fprintf(stderr,
                            "kapitsa: warning: %s at %d words: its %s runs spread %.0f%% around the median (%.4g to "
                            "%.4g): another load on the machine? more --reps?\n",
                            urls[t], (int)lens[l], k ? "time to first token" : "decode", 100 * (v[k][2] - v[k][0]) / v[k][1],
                            v[k][0], v[k][2]);
        }
}

static void compare_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa bench compare --against URL [--against URL ...] [--prompts W1,W2,...] [--gen N]\n"
               "                             [--reps R] [--model NAME ...] [--api-key KEY] [--svg FILE] [--json]\n"
               "  URL: an OpenAI-compatible base (http://127.0.0.1:11435/v1, llama-server's, Ollama's, vLLM's).\n"
               "  Streams the same raw prompts (default 128,512,2048 words) greedily to each server, N tokens\n"
               "  each (default 128), R times (default 3); prints time to first token and decode tok/s\n"
               "  (min / median / max) side by side, and with --svg a chart (log axes, the models, machine\n"
               "  and date named). --model: the i-th names the i-th server's model (one: every server's;\n"
               "  default the first it lists); --api-key: sent as a bearer token to every server.\n");
}

int bench_compare(int argc, char **argv)
{
    cli_opt_command("bench compare");
    char *urls[CMP_MAX_TARGETS], *models[CMP_MAX_TARGETS] = {0};
    const char *api_key = NULL, *model_arg[CMP_MAX_TARGETS];
    int32_t n_m = 0, n_t = 0, lens[CMP_MAX_LENS] = {128, 512, 2048}, n_l = 3, gen = 128, reps = 3;
    const char *svg = NULL, *v;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        int f;
        if (cli_switch(argv[i], "--json")) {
            json = 1;
        } else if ((f = cli_flag(argc, argv, &i, "--against", &v)) != 0) {
            if (f < 0 || n_t == CMP_MAX_TARGETS)
                return compare_usage(stderr), 2;
            urls[n_t] = strdup(v);
            size_t l = strlen(urls[n_t]);
            while (l && urls[n_t][l - 1] == '/')
                urls[n_t][--l] = 0;
            n_t++;
        } else if ((f = cli_flag(argc, argv, &i, "--prompts", &v)) != 0) {
            n_l = 0;
            for (const char *p = v; f > 0 && *p && n_l < CMP_MAX_LENS;) {
                char *end;
                long x = strtol(p, &end, 10);
                if (end == p || x < 1 || x > 200000)
                    return compare_usage(stderr), 2;
                lens[n_l++] = (int32_t)x;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',')
                    return compare_usage(stderr), 2;
            }
            if (f < 0 || n_l == 0)
                return compare_usage(stderr), 2;
        } else if ((f = cli_flag(argc, argv, &i, "-n|--gen", &v)) != 0) {
            int64_t x = f < 0 ? -1 : cli_int(v);
            if (x < 1 || x > 100000)
                return compare_usage(stderr), 2;
            gen = (int32_t)x;
        } else if ((f = cli_flag(argc, argv, &i, "-r|--reps", &v)) != 0) {
            int64_t x = f < 0 ? -1 : cli_int(v);
            if (x < 1 || x > CMP_MAX_REPS)
                return compare_usage(stderr), 2;
            reps = (int32_t)x;
        } else if ((f = cli_flag(argc, argv, &i, "--model", &v)) != 0) {
            if (f < 0 || n_m == CMP_MAX_TARGETS)
                return compare_usage(stderr), 2;
            model_arg[n_m++] = v;
        } else if ((f = cli_flag(argc, argv, &i, "--api-key", &api_key)) != 0) {
            if (f < 0)
                return 2;
        } else if ((f = cli_flag(argc, argv, &i, "--svg", &svg)) != 0) {
            if (f < 0)
                return 2;
        } else {
            return cli_arg_reject(argv[i], compare_usage);
        }
    }
    if (n_t == 0 || (n_m > 1 && n_m != n_t)) {
        if (n_m > 1 && n_m != n_t)
            fprintf(stderr, "kapitsa bench compare: %d --model for %d --against: give one, or one a server\n",
                    (int)n_m, (int)n_t);
        for (int32_t t = 0; t < n_t; t++)
            free(urls[t]);
        return compare_usage(stderr), 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    static struct result r[CMP_MAX_TARGETS][CMP_MAX_LENS];
    int rc = 0;
    struct progress pr;
    int64_t n_done = 0;
    progress_begin(&pr, stderr, "bench compare", (int64_t)n_t * n_l * (reps + 1), "requests");
    for (int32_t t = 0; t < n_t && rc == 0; t++) {
        char model[256];
        if (n_m > 0)
            snprintf(model, sizeof model, "%s", model_arg[n_m == 1 ? 0 : t]);
        else if (first_model(urls[t], api_key, model, sizeof model) != 0) {
            rc = -1;
            break;
        }
        models[t] = strdup(model);
        for (int32_t l = 0; l < n_l && rc == 0; l++) {
            char *prompt = make_prompt(lens[l]);
            double ttft[CMP_MAX_REPS], tps[CMP_MAX_REPS];
            struct sample s = {0};
            /* one unmeasured request warms the server (and a prefix cache, if it keeps one,
             * is defeated below by a different first word per repetition) */
            for (int32_t k = -1; k < reps && rc == 0; k++) {
                char item[600];
                snprintf(item, sizeof item, "%s, %d-word prompt", urls[t], (int)lens[l]);
                progress_update(&pr, n_done++, item);
                prompt[0] = (char)('a' + (k + 1) % 26);
                rc = one_request(urls[t], api_key, model, prompt, gen, &s);
                if (k >= 0) {
                    ttft[k] = s.ttft;
                    tps[k] = s.tps;
                }
            }
            if (rc == 0) {
                stats(ttft, reps, r[t][l].ttft);
                stats(tps, reps, r[t][l].tps);
                r[t][l].n_in = s.n_in;
                r[t][l].n_out = s.n_out;
            }
            free(prompt);
        }
    }
    if (rc == 0) {
        progress_update(&pr, n_done, NULL);
        progress_end(&pr);
    } else if (pr.tty) {
        fputc('\n', stderr); /* the failure's message below the progress line */
    }
    if (rc != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    } else if (json) {
        json_t *arr = json_array();
        for (int32_t t = 0; t < n_t; t++)
            for (int32_t l = 0; l < n_l; l++)
                json_array_append_new(
                    arr, json_pack("{s:s,s:s,s:i,s:i,s:i,s:[f,f,f],s:[f,f,f]}", "url", urls[t], "model", models[t], "prompt_words", lens[l],
                                   "prompt_tokens", r[t][l].n_in, "completion_tokens", r[t][l].n_out, "ttft_s",
                                   r[t][l].ttft[0], r[t][l].ttft[1], r[t][l].ttft[2], "decode_tok_s", r[t][l].tps[0],
                                   r[t][l].tps[1], r[t][l].tps[2]));
        char *s = json_dumps(arr, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(arr);
    } else {
        printf("%d repetitions each, %d tokens generated greedily, streamed; min / median / max\n", reps, gen);
        printf("%-36s %7s %7s %26s %26s\n", "server", "words", "tokens", "time to first token (ms)",
               "decode tok/s");
        for (int32_t l = 0; l < n_l; l++)
            for (int32_t t = 0; t < n_t; t++)
                printf("%-36s %7d %7d %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", urls[t], lens[l], r[t][l].n_in,
                       1e3 * r[t][l].ttft[0], 1e3 * r[t][l].ttft[1], 1e3 * r[t][l].ttft[2], r[t][l].tps[0],
                       r[t][l].tps[1], r[t][l].tps[2]);
    }
    if (rc == 0)
        warn_spread(urls, n_t, lens, n_l, r);
    if (rc == 0 && svg && write_svg(svg, urls, models, n_t, lens, n_l, r, reps, gen) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        rc = -1;
    }
    for (int32_t t = 0; t < n_t; t++) {
        free(urls[t]);
        free(models[t]);
    }
    curl_global_cleanup();
    return rc ? 1 : 0;
}
