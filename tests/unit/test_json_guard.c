/* json_guard: the recogniser against valid and invalid JSON texts (every
 * prefix of a valid object continues, an invalid text stops where it breaks),
 * and sampling under the guard: greedy takes the best allowed token, a draw
 * follows the model's distribution restricted to allowed tokens. */
#include "test.h"

#include "../../src/engine/json_guard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* -1: rejected at some byte; 0: accepted, not complete; 1: complete */
static int run(const char *text)
{
    struct json_guard g;
    json_guard_init(&g);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i++) {
        if (json_guard_done(&g) || json_guard_feed(&g, text + i, 1) != 0)
            return -1;
    }
    return json_guard_done(&g) ? 1 : 0;
}

void test_json_guard_grammar(void)
{
    static const char *const valid[] = {
        "{}",
        "{\"a\":1}",
        " \n{ \"a\" : [ 1 , -2.5e+3 , 0 , 0.25 , 1E9 , -0 , true , false , null ] }",
        "{\"s\":\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9\\uD83D\"}",
        "{\"\xc3\xa9\":\"\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"}",
        "{\"a\":{\"b\":{\"c\":[[],[{}],{}]}},\"d\":\"\"}",
        "{\"n\":[1,2,3],\"m\":{\"x\":-1.5E-7}}",
    };
    for (size_t i = 0; i < sizeof valid / sizeof *valid; i++) {
        CHECK(run(valid[i]) == 1, "valid JSON refused or left open: %s", valid[i]);
        /* every proper prefix is open, not complete */
        char buf[256];
        size_t n = strlen(valid[i]);
        for (size_t k = 0; k < n; k++) {
            memcpy(buf, valid[i], k);
            buf[k] = 0;
            CHECK(run(buf) == 0, "prefix %zu of %s: %d", k, valid[i], run(buf));
        }
    }
    static const char *const invalid[] = {
        "[]", "\"x\"", "1", "{\"a\"}", "{\"a\":01}", "{\"a\":1,}", "{,}", "{\"a\":tru}", "{\"a\":\"\x01\"}",
        "{\"a\":\"\\q\"}", "{\"a\":1}}", "{\"a\":1} ", "{\"a\":\"\xff\"}", "{\"a\":\"\xc3(\"}", "{\"a\":-}",
        "{\"a\":1.}", "{\"a\":1e}", "{\"a\":.5}", "{\"a\":+1}", "{a:1}", "{\"a\":\"\\u12g4\"}", "{\"a\" 1}",
        "{\"a\":[1 2]}", "{\"a\":nul}", "{\"a\":[}", "{\"a\":{]}",
    };
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++)
        CHECK(run(invalid[i]) == -1, "invalid JSON accepted: %s", invalid[i]);
    /* whitespace runs are bounded, nesting too */
    char ws[64] = "{";
    memset(ws + 1, ' ', JSON_GUARD_MAX_WS);
    CHECK(run(ws) == 0, "%d spaces refused", JSON_GUARD_MAX_WS);
    ws[JSON_GUARD_MAX_WS + 1] = ' ';
    CHECK(run(ws) == -1, "an endless run of spaces accepted");
    char deep[JSON_GUARD_MAX_DEPTH * 6 + 16];
    size_t o = 0;
    deep[o++] = '{';
    for (int d = 1; d <= JSON_GUARD_MAX_DEPTH; d++)
        o += (size_t)sprintf(deep + o, "\"a\":{");
    deep[o] = 0;
    CHECK(run(deep) == -1, "nesting past %d accepted", JSON_GUARD_MAX_DEPTH);
}

/* a small vocabulary: tokens' bytes, token 8 special (an end of text) */
static const char *const vocab[] = {"{", "}", "\"k\"", ":", "1", "x", ",", " ", "<eos>", "\"v\""};
enum { V = sizeof vocab / sizeof *vocab };

static void vocab_make(struct vocab_bytes *vb)
{
    size_t total = 0;
    for (int i = 0; i < V; i++)
        total += strlen(vocab[i]);
    vb->n_vocab = V;
    vb->data = malloc(total);
    vb->off = malloc(sizeof(uint32_t) * (V + 1));
    vb->special = calloc(V, 1);
    uint32_t o = 0;
    for (int i = 0; i < V; i++) {
        vb->off[i] = o;
        memcpy(vb->data + o, vocab[i], strlen(vocab[i]));
        o += (uint32_t)strlen(vocab[i]);
    }
    vb->off[V] = o;
    vb->special[8] = 1;
}

void test_json_guard_sample(void)
{
    struct vocab_bytes vb;
    vocab_make(&vb);
    /* the model prefers what cannot come: x, then the end of text */
    const float lg[V] = {1.0f, 3.0f, 2.5f, 2.0f, 1.5f, 5.0f, 0.5f, 0.0f, 4.0f, -1.0f};
    struct sampler s;
    struct sampler_params sp = sampler_defaults();
    sampler_init(&s, &sp, V);
    struct json_guard g;
    json_guard_init(&g);
    char out[64] = "";
    for (int step = 0; step < 8 && !json_guard_done(&g); step++) {
        int32_t t = json_guard_sample(&g, &vb, &s, lg, NULL, 0);
        CHECK(t >= 0 && t < V, "greedy step %d: %d", step, t);
        if (t < 0)
            break;
        strcat(out, vocab[t]);
    }
    CHECK(strcmp(out, "{}") == 0 && json_guard_done(&g), "greedy under the guard: '%s'", out);
    sampler_free(&s);

    /* a draw after "{": the allowed tokens are }, "k", "v" and a space, in
     * proportion to exp(logit) among themselves */
    sp.temperature = 1.0f;
    sp.seed = 11;
    sampler_init(&s, &sp, V);
    enum { N = 20000 };
    static const int allowed[] = {1, 2, 9, 7};
    int counts[V] = {0};
    struct json_guard open;
    json_guard_init(&open);
    json_guard_feed(&open, "{", 1);
    for (int n = 0; n < N; n++) {
        g = open;
        int32_t t = json_guard_sample(&g, &vb, &s, lg, NULL, 0);
        if (t >= 0)
            counts[t]++;
    }
    double z = 0;
    for (int i = 0; i < 4; i++)
        z += exp(lg[allowed[i]]);
    int total = 0;
    for (int i = 0; i < 4; i++) {
        const double q = exp(lg[allowed[i]]) / z, sd = sqrt(N * q * (1 - q));
        CHECK(fabs(counts[allowed[i]] - N * q) < 5 * sd, "token '%s': %d draws, expected %.0f", vocab[allowed[i]],
              counts[allowed[i]], N * q);
        total += counts[allowed[i]];
    }
    CHECK(total == N, "%d of %d draws were tokens the guard forbids", N - total, N);
    sampler_free(&s);

    /* top-k 1 leaves only x: the best allowed token is taken instead */
    sp.top_k = 1;
    sampler_init(&s, &sp, V);
    g = open;
    int32_t t = json_guard_sample(&g, &vb, &s, lg, NULL, 0);
    CHECK(t == 1, "no allowed candidate: took %d, not '}'", t);
    sampler_free(&s);
    vocab_bytes_free(&vb);
}
