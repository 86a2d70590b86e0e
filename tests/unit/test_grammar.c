/* grammar: the segments of constrained decoding (literals with places for
 * whitespace, names sharing prefixes, choices that loop, free text up to a
 * terminator, a JSON object between literals), each text accepted exactly to
 * its end and every prefix left open, whole or a byte at a time; and sampling
 * under a guard: greedy takes the best allowed token, a draw follows the
 * model's distribution restricted to allowed tokens, a literal is built from
 * several tokens and a name grows while the model prefers it. */
#include "test.h"

#include "../../src/engine/sampler.h"
#include "../../src/grammar/grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int test_verdict(const struct grammar *gm, const char *text)
{
    struct guard g, whole;
    guard_init(&g, gm);
    guard_init(&whole, gm);
    const size_t n = strlen(text);
    int v = 0;
    for (size_t i = 0; i < n && v == 0; i++)
        if (guard_feed(&g, text + i, 1) != 0)
            v = -1;
    const int w = guard_feed(&whole, text, n) != 0 ? -1 : 0;
    CHECK(v == w, "'%s': %d byte by byte, %d whole", text, v, w);
    return v < 0 ? -1 : guard_done(&g) ? 1 : 0;
}

/* every text in ok complete (and its proper prefixes open), every text in bad rejected */
static void expect(const struct grammar *gm, const char *what, const char *const *ok, const char *const *bad)
{
    for (; ok && *ok; ok++) {
        CHECK(test_verdict(gm, *ok) == 1, "%s: '%s' not accepted whole", what, *ok);
        char buf[256];
        for (size_t k = 0; k < strlen(*ok) && k < sizeof buf; k++) {
            memcpy(buf, *ok, k);
            buf[k] = 0;
            CHECK(test_verdict(gm, buf) == 0, "%s: prefix '%s' of '%s': %d", what, buf, *ok,
                  test_verdict(gm, buf));
        }
    }
    for (; bad && *bad; bad++)
        CHECK(test_verdict(gm, *bad) == -1, "%s: '%s' accepted", what, *bad);
}

void test_grammar_segments(void)
{
    struct grammar gm;
    /* places for whitespace, bounded */
    grammar_init(&gm);
    grammar_lit(&gm, "a" GRAMMAR_WS "b" GRAMMAR_WS GRAMMAR_WS "c");
    expect(&gm, "literal", (const char *const[]){"abc", "a \n\tb c", "ab  \r\nc", NULL},
           (const char *const[]){"ac", " abc", "abcc", "a b d", "abc ", NULL});
    char ws[64] = "a";
    memset(ws + 1, ' ', GRAMMAR_MAX_WS);
    CHECK(test_verdict(&gm, ws) == 0, "%d spaces refused", GRAMMAR_MAX_WS);
    ws[GRAMMAR_MAX_WS + 1] = ' ';
    CHECK(test_verdict(&gm, ws) == -1, "a longer run of spaces accepted");
    /* max_nl: at most that many newlines at a place, each place apart */
    gm.max_nl = 1;
    CHECK(test_verdict(&gm, "a\n b\n  c") == 1, "a newline at each place refused");
    CHECK(test_verdict(&gm, "a\n\nb") == -1, "two newlines at one place accepted");
    grammar_free(&gm);

    /* names that begin alike: each ends where the next byte cannot continue one */
    grammar_init(&gm);
    grammar_lit(&gm, "\"");
    grammar_names(&gm, (const char *const[]){"read_file", "read", "write", "re"}, 4, false);
    grammar_lit(&gm, "\"");
    expect(&gm, "names", (const char *const[]){"\"read\"", "\"read_file\"", "\"write\"", "\"re\"", NULL},
           (const char *const[]){"\"rea\"", "\"read_\"", "\"readx\"", "\"\"", "\"writes\"", "\"w\"", "\"r\"",
                                 "\"read_file_\"", NULL});
    grammar_free(&gm);

    /* a choice that loops: ( then x, again and again, or ) */
    grammar_init(&gm);
    grammar_lit(&gm, "(");
    const int32_t more = grammar_alt(&gm, "x=", ")");
    grammar_until(&gm, ";", NULL, "\n");
    grammar_jump(&gm, gm.n_seg - 1, -1, more);
    grammar_jump(&gm, more, 1, gm.n_seg);
    CHECK(gm.n_seg == 3, "%d segments", gm.n_seg);
    expect(&gm, "loop", (const char *const[]){"()", "(x=1;)", "( x=ab; x=;\t)", "(x=a(b)x=c;)", NULL},
           (const char *const[]){"(x)", "(x=1;;)", "(x=1\n;)", "(y=1;)", "()x", "(x=1;))", NULL});
    grammar_free(&gm);

    /* free text up to a terminator whose start comes again in the text */
    grammar_init(&gm);
    grammar_until(&gm, "</p>", NULL, NULL);
    expect(&gm, "until", (const char *const[]){"</p>", "a</b></</p>", "<<</p>", "x</ p></p>", NULL},
           (const char *const[]){"</p>x", NULL});
    grammar_free(&gm);

    /* a JSON object between literals: it ends at its closing brace */
    grammar_init(&gm);
    grammar_lit(&gm, "<" GRAMMAR_WS);
    grammar_json(&gm, NULL);
    grammar_lit(&gm, GRAMMAR_WS ">");
    expect(&gm, "json", (const char *const[]){"<{}>", "< {\"a\": [1, {\"b\": null}]} \n>", "<{\"n\":-1.5e3}>", NULL},
           (const char *const[]){"<[]>", "<{}}>", "<{\"a\":1>", "<{\"a\":1}>>", "<{} {}>", NULL});
    grammar_free(&gm);
    /* ... and one in which a text may not appear */
    grammar_init(&gm);
    grammar_json(&gm, "</b>");
    expect(&gm, "json without a text", (const char *const[]){"{\"a\": \"<b></ b><</c>\"}", NULL},
           (const char *const[]){"{\"a\": \"</b>\"}", "{\"a\": \"<</b>\"}", NULL});
    grammar_free(&gm);
}

/* a small vocabulary: tokens' bytes; special: the index of an end-of-text token */
static void vocab_make(struct vocab_bytes *vb, const char *const *tok, size_t n, size_t special)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += strlen(tok[i]);
    *vb = (struct vocab_bytes){0};
    vb->n_vocab = (int32_t)n;
    vb->data = malloc(total);
    vb->off = malloc(sizeof(uint32_t) * (n + 1));
    vb->special = calloc(n, 1);
    uint32_t o = 0;
    for (size_t i = 0; i < n; i++) {
        vb->off[i] = o;
        memcpy(vb->data + o, tok[i], strlen(tok[i]));
        o += (uint32_t)strlen(tok[i]);
    }
    vb->off[n] = o;
    vb->special[special] = 1;
}

/* Greedy decoding under gm over the small vocabulary tok (n of them, the
 * special one at index special) with fixed logits lg: the text, into out. */
static void greedy(const struct grammar *gm, const char *const *tok, int n, int special, const float *lg, char *out,
                   size_t cap)
{
    struct vocab_bytes vb;
    vocab_make(&vb, tok, n, special);
    struct sampler s;
    struct sampler_params sp = sampler_defaults();
    sampler_init(&s, &sp, n);
    struct guard g;
    guard_init(&g, gm);
    out[0] = 0;
    for (int step = 0; step < 16 && !guard_done(&g); step++) {
        const int32_t t = sampler_sample_guarded(&s, &g, &vb, lg, NULL, 0);
        CHECK(t >= 0 && t < n && t != special, "greedy step %d: %d", step, t);
        if (t < 0 || t >= n || strlen(out) + strlen(tok[t]) >= cap)
            break;
        strcat(out, tok[t]);
    }
    CHECK(guard_done(&g), "greedy output '%s' left the grammar open", out);
    sampler_free(&s);
    vocab_bytes_free(&vb);
}

static const char *const vocab[] = {"{", "}", "\"k\"", ":", "1", "x", ",", " ", "<eos>", "\"v\""};
enum { V = sizeof vocab / sizeof *vocab };

void test_grammar_sample(void)
{
    struct grammar gm;
    grammar_init(&gm);
    grammar_json(&gm, NULL);
    /* the model prefers what cannot come: x, then the end of text */
    const float lg[V] = {1.0f, 3.0f, 2.5f, 2.0f, 1.5f, 5.0f, 0.5f, 0.0f, 4.0f, -1.0f};
    char out[64];
    greedy(&gm, vocab, V, 8, lg, out, sizeof out);
    CHECK(strcmp(out, "{}") == 0, "greedy under the guard: '%s'", out);

    /* a draw after "{": the allowed tokens are }, "k", "v" and a space, in
     * proportion to exp(logit) among themselves */
    struct vocab_bytes vb;
    vocab_make(&vb, vocab, V, 8);
    struct sampler s;
    struct guard g;
    struct sampler_params sp = sampler_defaults();
    sp.temperature = 1.0f;
    sp.seed = 11;
    sampler_init(&s, &sp, V);
    enum { N = 20000 };
    static const int allowed[] = {1, 2, 9, 7};
    int counts[V] = {0};
    struct guard open;
    guard_init(&open, &gm);
    guard_feed(&open, "{", 1);
    for (int n = 0; n < N; n++) {
        g = open;
        int32_t t = sampler_sample_guarded(&s, &g, &vb, lg, NULL, 0);
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
    int32_t t = sampler_sample_guarded(&s, &g, &vb, lg, NULL, 0);
    CHECK(t == 1, "no allowed candidate: took %d, not '}'", t);
    sampler_free(&s);
    vocab_bytes_free(&vb);
    grammar_free(&gm);
}

/* A tag built from two tokens, a name that grows while the model prefers
 * it, the end of text never taken while the grammar is open. */
void test_grammar_sample_call(void)
{
    static const char *const tv[] = {"<a>", "x", "y", "</a>", "<eos>", "<", "a>", "z"};
    enum { TV = sizeof tv / sizeof *tv };
    struct grammar gm;
    grammar_init(&gm);
    grammar_lit(&gm, "<a>");
    grammar_names(&gm, (const char *const[]){"x", "xy"}, 2, false);
    grammar_lit(&gm, "</a>");
    const float lg[TV] = {1.0f, 2.0f, 4.0f, 3.0f, 5.0f, 1.5f, 0.5f, 4.5f};
    char out[64];
    greedy(&gm, tv, TV, 4, lg, out, sizeof out);
    CHECK(strcmp(out, "<a>xy</a>") == 0, "greedy under the grammar: '%s'", out);
    grammar_free(&gm);
}
