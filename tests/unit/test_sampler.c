/* Tests of the sampler: greedy, seeds, filters, penalties, bias, and the
 * empirical distribution of temperature sampling. */
#include "../../src/base/err.h"
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
