/* Tests of the sampler: greedy, seeds, filters, penalties, bias, and the
 * empirical distribution of temperature sampling. */
#include "../../src/base/err.h"
#include "../../src/backend/backend.h"
#include "../../src/engine/sampler.h"
#include "test.h"

#include <math.h>
#include <string.h>

void test_sampler_basic(void)
{
    float lg[6] = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};
    struct sampler s;
    struct sampler_params p = sampler_defaults();
    CHECK(sampler_init(&s, &p, 6) == 0, "init");
    CHECK(sampler_sample(&s, lg, NULL, 0) == 1, "greedy takes the first of tied maxima");
    sampler_free(&s);

    /* logit bias can force a token; a repetition penalty can push one down */
    p.n_bias = 1;
    p.bias_id[0] = 3;
    p.bias[0] = 10.0f;
    sampler_init(&s, &p, 6);
    CHECK(sampler_sample(&s, lg, NULL, 0) == 3, "bias");
    sampler_free(&s);
    p = sampler_defaults();
    p.repeat_penalty = 2.0f;
    sampler_init(&s, &p, 6);
    int32_t hist[2] = {1, 4};
    CHECK(sampler_sample(&s, lg, hist, 2) == 2, "repetition penalty halves 3.0 below 2.5");
    sampler_free(&s);
    p = sampler_defaults();
    p.presence_penalty = 0.2f;
    p.frequency_penalty = 0.2f;
    int32_t hist2[3] = {1, 1, 4};
    sampler_init(&s, &p, 6);
    CHECK(sampler_sample(&s, lg, hist2, 3) == 4, "token 1 seen twice loses 0.6, token 4 once loses 0.4");
    sampler_free(&s);

    /* top_k 1 is greedy whatever the temperature; same seed, same draws */
    p = sampler_defaults();
    p.temperature = 5.0f;
    p.top_k = 1;
    sampler_init(&s, &p, 6);
    for (int i = 0; i < 20; i++)
        CHECK(sampler_sample(&s, lg, NULL, 0) == 1, "top_k=1");
    sampler_free(&s);
    p.top_k = 0;
    p.seed = 42;
    int32_t seq1[50], seq2[50];
    sampler_init(&s, &p, 6);
    for (int i = 0; i < 50; i++)
        seq1[i] = sampler_sample(&s, lg, NULL, 0);
    sampler_free(&s);
    sampler_init(&s, &p, 6);
    for (int i = 0; i < 50; i++)
        seq2[i] = sampler_sample(&s, lg, NULL, 0);
    sampler_free(&s);
    CHECK(memcmp(seq1, seq2, sizeof seq1) == 0, "same seed, same output");
    p.seed = 43;
    sampler_init(&s, &p, 6);
    int differ = 0;
    for (int i = 0; i < 50; i++)
        differ |= sampler_sample(&s, lg, NULL, 0) != seq1[i];
    sampler_free(&s);
    CHECK(differ, "another seed, other output");

    /* bad parameters */
    p = sampler_defaults();
    p.top_p = 0;
    CHECK(sampler_init(&s, &p, 6) != 0 && strstr(err_msg(), "sampler"), "top_p 0");
    p = sampler_defaults();
    p.n_bias = 1;
    p.bias_id[0] = 6;
    CHECK(sampler_init(&s, &p, 6) != 0 && strstr(err_msg(), "logit_bias"), "bias outside vocab");
}

void test_sampler_distribution(void)
{
    enum { V = 1000, N = 40000 };
    static float lg[V];
    static int counts[V];
    for (int i = 0; i < V; i++)
        lg[i] = -0.01f * (float)i; /* a long tail: exercises the partial sorts */
    double p[V], z = 0;
    for (int i = 0; i < V; i++)
        z += p[i] = exp(lg[i] / 0.7);
    struct sampler s;
    struct sampler_params sp = sampler_defaults();
    sp.temperature = 0.7f;
    sp.seed = 7;
    sampler_init(&s, &sp, V);
    memset(counts, 0, sizeof counts);
    for (int n = 0; n < N; n++)
        counts[sampler_sample(&s, lg, NULL, 0)]++;
    sampler_free(&s);
    /* the first 20 tokens' frequencies within 5 standard deviations */
    for (int i = 0; i < 20; i++) {
        double q = p[i] / z, sd = sqrt(N * q * (1 - q));
        CHECK(fabs(counts[i] - N * q) < 5 * sd, "token %d: %d draws, expected %.0f", i, counts[i], N * q);
    }

    /* top_p: only the smallest head whose mass reaches 0.5 is drawn from */
    double cum = 0;
    int head = 0;
    while (cum < 0.5 * z)
        cum += p[head++];
    sp.top_p = 0.5f;
    sampler_init(&s, &sp, V);
    int max_tok = 0;
    for (int n = 0; n < 5000; n++) {
        int t = sampler_sample(&s, lg, NULL, 0);
        max_tok = t > max_tok ? t : max_tok;
    }
    sampler_free(&s);
    CHECK(max_tok < head && max_tok > head - 30, "top_p head %d, drew up to %d", head, max_tok);

    /* min_p 0.5: tokens below half the top probability never appear */
    sp.top_p = 1;
    sp.min_p = 0.5f;
    sampler_init(&s, &sp, V);
    int limit = 0;
    while (exp((lg[limit] - lg[0]) / 0.7) >= 0.5)
        limit++;
    for (int n = 0; n < 5000; n++)
        CHECK(sampler_sample(&s, lg, NULL, 0) < limit, "min_p");
    sampler_free(&s);
}

/* The candidate lists against brute force: sampler_argmax (first of tied
 * maxima, NaN never chosen after index 0, every length mod 4), top_k (the k
 * best by logit then lower id, in that order, ties across the heap's
 * boundary), the top_p head (the same order), and the floor: a token e^-50
 * below the best is never a candidate, one e^-40 below is. */
static int32_t argmax_ref(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

void test_sampler_candidates(void)
{
    enum { V = 600 };
    float lg[V];
    uint64_t r = 42;
    for (int32_t n = 1; n <= 13; n++)
        for (int rep = 0; rep < 50; rep++) {
            for (int32_t i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                lg[i] = (float)(int)(r >> 61); /* 0..7: many ties */
            }
            if (rep == 7)
                lg[n - 1] = NAN;
            if (rep == 8)
                lg[0] = NAN;
            CHECK(sampler_argmax(lg, n) == argmax_ref(lg, n), "argmax n %d rep %d: %d, want %d", n, rep,
                  sampler_argmax(lg, n), argmax_ref(lg, n));
        }
    for (int32_t i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)(int)(r >> 58) * 0.25f; /* 64 levels: ties at every k */
    }
    struct sampler_params sp = sampler_defaults();
    sp.temperature = 1.0f;
    for (int32_t k = 1; k < V; k += 37) {
        sp.top_k = k;
        struct sampler s;
        CHECK(sampler_init(&s, &sp, V) == 0, "%s", err_msg());
        const int32_t n = sampler_dist(&s, lg, NULL, 0);
        CHECK(n == k, "top_k %d gave %d candidates", k, n);
        /* the brute-force rank of each id: how many tokens rank before it */
        for (int32_t c = 0; c < n; c++) {
            const int32_t id = s.idx[c];
            int32_t before = 0;
            for (int32_t j = 0; j < V; j++)
                before += lg[j] > lg[id] || (lg[j] == lg[id] && j < id);
            CHECK(before == c, "top_k %d: candidate %d is id %d of rank %d", k, c, id, before);
        }
        sampler_free(&s);
    }
    sp.top_k = 0;
    sp.top_p = 0.3f;
    struct sampler s;
    CHECK(sampler_init(&s, &sp, V) == 0, "%s", err_msg());
    const int32_t n = sampler_dist(&s, lg, NULL, 0);
    for (int32_t c = 1; c < n; c++) {
        const int32_t a = s.idx[c - 1], b = s.idx[c];
        CHECK(lg[a] > lg[b] || (lg[a] == lg[b] && a < b), "top_p head out of order at %d", c);
    }
    sampler_free(&s);
    sp.top_p = 1.0f;
    float tail[4] = {10.0f, 10.0f - 40.0f, 10.0f - 50.5f, 9.0f};
    CHECK(sampler_init(&s, &sp, 4) == 0, "%s", err_msg());
    const int32_t nt = sampler_dist(&s, tail, NULL, 0);
    CHECK(nt == 3 && s.idx[0] == 0 && s.idx[1] == 1 && s.idx[2] == 3, "floor: %d candidates", nt);
    sampler_free(&s);
}

/* sampler_sample_top from a row's top_k (the backend's order) draws the token
 * sampler_sample draws from the whole row, for the same seed, draw after draw,
 * with and without banned tokens (three of the row's largest logits at
 * -inf, as ignore_eos bans the end), and sampler_top_need says when the top
 * is enough. */
void test_sampler_top(void)
{
    enum { V = 5000 };
    static float lg[V];
    uint64_t r = 7;
    for (int32_t i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((int)(r >> 40) % 4000) / 400.0f; /* ties too */
    }
    const struct {
        float t, top_p, min_p;
        int32_t top_k;
    } cases[] = {{0.0f, 1, 0, 0}, {1.0f, 1, 0, 1}, {0.7f, 0.95f, 0, 20}, {1.3f, 1, 0.1f, 32}, {0.5f, 0.5f, 0.05f, 7}};
    for (size_t c = 0; c < 2 * (sizeof cases / sizeof cases[0]); c++) {
        const size_t q = c / 2;
        const int32_t n_ban = c % 2 ? 3 : 0;
        struct sampler_params sp = sampler_defaults();
        sp.temperature = cases[q].t;
        sp.top_p = cases[q].top_p;
        sp.min_p = cases[q].min_p;
        /* the bans come in the top too */
        sp.top_k = cases[q].top_k + n_ban > TOP_K_MAX ? TOP_K_MAX - n_ban : cases[q].top_k;
        sp.seed = 1234 + c;
        int32_t ids[TOP_K_MAX];
        float vals[TOP_K_MAX];
        backend_top_k_row(lg, V, TOP_K_MAX, ids, vals);
        for (int32_t i = 0; i < n_ban; i++) {
            sp.bias_id[i] = ids[2 * i];
            sp.bias[i] = -INFINITY;
        }
        sp.n_bias = n_ban;
        struct sampler a, b;
        CHECK(sampler_init(&a, &sp, V) == 0 && sampler_init(&b, &sp, V) == 0, "%s", err_msg());
        const int32_t need = sampler_top_need(&a);
        CHECK(need == (cases[q].t == 0 ? 1 : sp.top_k) + n_ban, "case %zu: top_need %d", c, need);
        int32_t banned_drawn = 0;
        for (int d = 0; d < 300; d++) {
            lg[(d * 97) % V] += 0.5f; /* a row that changes a little every draw */
            backend_top_k_row(lg, V, TOP_K_MAX, ids, vals);
            const int32_t want = sampler_sample(&a, lg, NULL, 0), got = sampler_sample_top(&b, ids, vals, TOP_K_MAX);
            CHECK(got == want, "case %zu draw %d: %d from the top, %d from the row", c, d, got, want);
            for (int32_t i = 0; i < n_ban; i++)
                banned_drawn += got == sp.bias_id[i];
        }
        CHECK(banned_drawn == 0, "case %zu: a banned token drawn %d times", c, banned_drawn);
        sampler_free(&a);
        sampler_free(&b);
    }
    struct sampler_params sp = sampler_defaults();
    sp.temperature = 1.0f;
    struct sampler s;
    CHECK(sampler_init(&s, &sp, V) == 0, "%s", err_msg());
    CHECK(sampler_top_need(&s) == 0, "no top_k: the whole row");
    sampler_free(&s);
    sp.top_k = 10;
    sp.repeat_penalty = 1.1f;
    CHECK(sampler_init(&s, &sp, V) == 0, "%s", err_msg());
    CHECK(sampler_top_need(&s) == 0, "a penalty changes logits the top was taken from: the whole row");
    sampler_free(&s);
    sp.repeat_penalty = 1.0f;
    sp.n_bias = 2;
    sp.bias_id[0] = 3, sp.bias[0] = -INFINITY;
    sp.bias_id[1] = 4, sp.bias[1] = -100.0f;
    CHECK(sampler_init(&s, &sp, V) == 0, "%s", err_msg());
    CHECK(sampler_top_need(&s) == 0, "a finite bias may lift a token into the top: the whole row");
    sampler_free(&s);
}
