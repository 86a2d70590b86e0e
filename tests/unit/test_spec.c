/* KFlash (src/engine/spec.c): greedy output token-for-token identical to plain
 * decoding for fixture model pairs (hybrids too) and the embedded tiny pair,
 * and the sampled distribution equal to plain sampling (a chi-square test that
 * is shown to fail when the acceptance rule is biased). */
#include "../../src/backend/cpu/cpu.h"
#include "../../src/base/err.h"
#include "../../src/engine/engine.h"
#include "../../src/engine/sampler.h"
#include "../../src/engine/spec.h"
#include "../../src/tokenizer/tokenizer.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CTX 1200

struct pair {
    struct backend *be;
    struct model tm, dm;
    struct engine te, de;
};

static int pair_open(struct pair *p, const char *target, const char *draft)
{
    memset(p, 0, sizeof *p);
    p->be = test_backend();
    return model_load(&p->tm, target, p->be, NULL) || model_load(&p->dm, draft, p->be, NULL) ||
                   engine_init(&p->te, &p->tm, CTX, 2, 64, 64, 64, DT_F32) || engine_init(&p->de, &p->dm, CTX, 2, 64, 64, 64, DT_F32)
               ? -1
               : 0;
}

static void pair_close(struct pair *p)
{
    engine_free(&p->te);
    engine_free(&p->de);
    model_free(&p->tm);
    model_free(&p->dm);
    p->be->ops->free(p->be);
}

/* Plain decoding: n_gen tokens after prompt, one target token per forward. */
static void plain(struct pair *p, struct sampler *sm, const int32_t *prompt, int32_t n, int32_t n_gen, int32_t *out)
{
    const int32_t V = p->tm.cfg.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(n + n_gen)), s = engine_seq_new(&p->te), pos[64], sq[64],
            par[64];
    uint8_t want[64];
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n);
    for (int32_t done = 0; done < n;) {
        int32_t k = n - done < 64 ? n - done : 64;
        for (int32_t i = 0; i < k; i++)
            pos[i] = done + i, sq[i] = s, par[i] = i - 1, want[i] = done + i == n - 1;
        struct batch b = {k, prompt + done, pos, sq, par, want};
        CHECK(engine_forward(&p->te, &b, lg, NULL) >= 0 && engine_commit_all(&p->te) == 0, "%s", err_msg());
        done += k;
    }
    for (int32_t g = 0; g < n_gen; g++) {
        out[g] = hist[n + g] = sampler_sample(sm, lg, hist, n + g);
        int32_t ps = n + g, pa = -1;
        uint8_t one = 1;
        struct batch b = {1, &out[g], &ps, &s, &pa, &one};
        CHECK(engine_forward(&p->te, &b, lg, NULL) == 1 && engine_commit_all(&p->te) == 0, "%s", err_msg());
    }
    engine_seq_free(&p->te, s);
    free(lg);
    free(hist);
}

/* The same with KFlash; returns target forwards (verify passes) used. */
static int64_t speculative(struct pair *p, struct sampler *sm, const struct spec_params *sp, const int32_t *prompt,
                           int32_t n, int32_t n_gen, int32_t *out)
{
    const int32_t V = p->tm.cfg.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(n + n_gen + 1));
    int32_t ts = engine_seq_new(&p->te), ds = engine_seq_new(&p->de);
    struct spec s;
    CHECK(spec_init(&s, &p->te, ts, &p->de, ds, sp, CTX) == 0, "%s", err_msg());
    CHECK(spec_prefill(&s, prompt, n, lg) == 0, "%s", err_msg());
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n);
    int32_t len = n;
    hist[len++] = out[0] = sampler_sample(sm, lg, hist, n);
    int32_t made = 1;
    while (made < n_gen) {
        int32_t k = spec_step(&s, sm, hist, len, hist + len, n_gen - made);
        CHECK(k >= 1, "%s", err_msg());
        if (k < 1)
            break;
        memcpy(out + made, hist + len, sizeof(int32_t) * (size_t)k);
        len += k;
        made += k;
    }
    int64_t steps = s.st.steps;
    spec_free(&s);
    engine_seq_free(&p->te, ts);
    engine_seq_free(&p->de, ds);
    free(lg);
    free(hist);
    return steps;
}

static const char *fx(const char *arch)
{
    static char path[4][512];
    static int i;
    i = (i + 1) % 4;
    snprintf(path[i], sizeof path[i], "%s/%s", test_fixtures(), arch);
    return path[i];
}

void test_spec_greedy_fixtures(void)
{
    const char *pairs[][2] = {{"qwen3", "qwen3_moe"}, {"qwen3_5", "qwen3"}, {"nemotron_h", "qwen3_next"},
                              {"qwen3_next", "nemotron_h_moe"}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        struct pair p;
        CHECK(pair_open(&p, fx(pairs[k][0]), fx(pairs[k][1])) == 0, "%s", err_msg());
        /* a prompt that repeats itself, so that prompt lookup has something to find */
        int32_t prompt[60], want[300], got[300];
        for (int i = 0; i < 60; i++)
            prompt[i] = 2 + (i % 37) * 13 % 500;
        struct sampler sm;
        struct sampler_params gp = sampler_defaults();
        sampler_init(&sm, &gp, p.tm.cfg.vocab_size);
        plain(&p, &sm, prompt, 60, 300, want);
        const struct {
            enum spec_mode mode;
            int32_t nodes, depth;
            bool ngram;
        } modes[] = {{SPEC_TREE, 24, 8, true}, {SPEC_TREE, 16, 4, false}, {SPEC_CHAIN, 6, 6, false},
                     {SPEC_OFF, 0, 0, true}};
        for (size_t m = 0; m < 4; m++) {
            struct spec_params sp = spec_defaults();
            sp.mode = modes[m].mode;
            sp.n_nodes = modes[m].nodes;
            sp.depth = modes[m].depth;
            sp.ngram = modes[m].ngram;
            int64_t steps = speculative(&p, &sm, &sp, prompt, 60, 300, got);
            int32_t first = -1;
            for (int i = 0; i < 300 && first < 0; i++)
                if (got[i] != want[i])
                    first = i;
            CHECK(first < 0, "%s <- %s mode %zu: differs from plain decoding at token %d", pairs[k][0], pairs[k][1], m,
                  first);
            /* random fixture models rarely agree: only correctness is asserted here */
            CHECK(sp.mode != SPEC_OFF || steps == 299, "%s: %lld verify passes without speculation", pairs[k][0],
                  (long long)steps);
        }
        sampler_free(&sm);
        pair_close(&p);
    }
}

static int32_t encode(struct tokenizer *t, const char *text, int32_t *ids, int32_t cap)
{
    struct tok_ids v = {0};
    CHECK(tok_encode(t, text, strlen(text), &v) == 0, "%s", err_msg());
    int32_t n = v.n < cap ? v.n : cap;
    memcpy(ids, v.ids, sizeof(int32_t) * (size_t)n);
    tok_ids_free(&v);
    return n;
}

/* The embedded pair on code: 500 tokens identical, fewer target passes than tokens. */
void test_spec_greedy_tiny(void)
{
    struct pair p;
    CHECK(pair_open(&p, "models/kapitsa-tiny", "models/kapitsa-tiny-draft") == 0, "%s", err_msg());
    struct tokenizer *t = tok_load("models/qwen3-tokenizer");
    CHECK(t != NULL, "%s", err_msg());
    const char *code = "def parse_args(argv):\n    opts = {}\n    for a in argv:\n        if a.startswith('--'):\n"
                       "            k, _, v = a[2:].partition('=')\n            opts[k] = v\n    return opts\n\n"
                       "def parse_args_strict(argv):\n    opts = {}\n    for a in argv:\n";
    int32_t prompt[256], want[500], got[500];
    int32_t n = encode(t, code, prompt, 256);
    struct sampler sm;
    struct sampler_params gp = sampler_defaults();
    sampler_init(&sm, &gp, p.tm.cfg.vocab_size);
    plain(&p, &sm, prompt, n, 500, want);
    struct spec_params sp = spec_defaults();
    int64_t steps = speculative(&p, &sm, &sp, prompt, n, 500, got);
    int32_t first = -1;
    for (int i = 0; i < 500 && first < 0; i++)
        if (got[i] != want[i])
            first = i;
    CHECK(first < 0, "kapitsa-tiny: differs from plain decoding at token %d", first);
    CHECK(steps < 400, "kapitsa-tiny: %lld verify passes for 500 tokens", (long long)steps);
    printf("  kapitsa-tiny + draft: 500 tokens in %lld verify passes\n", (long long)steps);
    sampler_free(&sm);
    tok_free(t);
    pair_close(&p);
}

/* Sampled KFlash reading each node's top k from the engine (top_k, no bias)
 * against the same with whole logit rows (a bias of 0 on one token: the same
 * distribution, but logits the filters cannot rank alone): the same seed gives
 * the same 300 tokens, so the top-list walk is the whole-row walk. */
void test_spec_top(void)
{
    struct pair p;
    CHECK(pair_open(&p, "models/kapitsa-tiny", "models/kapitsa-tiny-draft") == 0, "%s", err_msg());
    int32_t prompt[64], a[300], b[300];
    for (int i = 0; i < 64; i++)
        prompt[i] = 100 + (i * 37) % 900;
    const float temps[2] = {0.6f, 1.0f};
    const int32_t top_ks[2] = {20, 5};
    for (int c = 0; c < 2; c++) {
        struct sampler_params gp = sampler_defaults();
        gp.temperature = temps[c];
        gp.top_k = top_ks[c];
        gp.top_p = c ? 1.0f : 0.95f;
        gp.seed = 77 + (uint64_t)c;
        struct sampler sa, sb;
        CHECK(sampler_init(&sa, &gp, p.tm.cfg.vocab_size) == 0 && sampler_top_need(&sa) == top_ks[c], "%s",
              err_msg());
        gp.n_bias = 1;
        gp.bias_id[0] = 3;
        gp.bias[0] = 0.0f;
        CHECK(sampler_init(&sb, &gp, p.tm.cfg.vocab_size) == 0 && sampler_top_need(&sb) == 0, "%s", err_msg());
        struct spec_params sp = spec_defaults();
        const int64_t steps = speculative(&p, &sa, &sp, prompt, 64, 300, a);
        speculative(&p, &sb, &sp, prompt, 64, 300, b);
        int32_t first = -1;
        for (int i = 0; i < 300 && first < 0; i++)
            if (a[i] != b[i])
                first = i;
        CHECK(first < 0, "T %.1f top_k %d: top lists and whole rows differ at token %d", temps[c], top_ks[c], first);
        CHECK(steps < 300, "T %.1f top_k %d: no token accepted from the tree (%lld passes)", temps[c], top_ks[c],
              (long long)steps);
        printf("  T %.1f top_k %d: 300 tokens in %lld verify passes, each node's top %d read\n", temps[c], top_ks[c],
               (long long)steps, top_ks[c]);
        sampler_free(&sa);
        sampler_free(&sb);
        /* two of those tokens banned (as ignore_eos bans the end): the top
         * lists, two longer, against whole rows (the bias of 0 kept) */
        gp.n_bias = 3;
        gp.bias_id[1] = a[0], gp.bias[1] = -INFINITY;
        gp.bias_id[2] = a[1] != a[0] ? a[1] : a[2], gp.bias[2] = -INFINITY;
        CHECK(sampler_init(&sb, &gp, p.tm.cfg.vocab_size) == 0 && sampler_top_need(&sb) == 0, "%s", err_msg());
        speculative(&p, &sb, &sp, prompt, 64, 300, b);
        gp.bias_id[0] = gp.bias_id[2], gp.bias[0] = -INFINITY;
        gp.n_bias = 2;
        CHECK(sampler_init(&sa, &gp, p.tm.cfg.vocab_size) == 0 && sampler_top_need(&sa) == top_ks[c] + 2, "%s",
              err_msg());
        speculative(&p, &sa, &sp, prompt, 64, 300, a);
        int32_t n_banned = 0;
        first = -1;
        for (int i = 0; i < 300; i++) {
            first = first < 0 && a[i] != b[i] ? i : first;
            n_banned += a[i] == gp.bias_id[0] || a[i] == gp.bias_id[1];
        }
        CHECK(first < 0 && n_banned == 0, "T %.1f top_k %d, two banned: top lists and whole rows differ at %d, %d banned",
              temps[c], top_ks[c], first, n_banned);
        sampler_free(&sa);
        sampler_free(&sb);
    }
    pair_close(&p);
}

/* Two-sample chi-square over the joint of the first three generated tokens:
 * plain sampling vs KFlash, n samples each. Returns the statistic and, in *crit,
 * the critical value at alpha = 0.001 (Wilson-Hilferty) for its degrees of freedom. */
static double chi2_first3(struct pair *p, const struct sampler_params *gp, const struct spec_params *sp, int32_t n,
                          double *crit)
{
    const int32_t V = p->tm.cfg.vocab_size, NP = 20;
    int32_t prompt[20];
    for (int i = 0; i < NP; i++)
        prompt[i] = 2 + (i * 31 + 7) % 500;
    float *lg0 = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V);
    int32_t ts = engine_seq_new(&p->te), ds = engine_seq_new(&p->de);
    struct spec s;
    CHECK(spec_init(&s, &p->te, ts, &p->de, ds, sp, CTX) == 0, "%s", err_msg());
    CHECK(spec_prefill(&s, prompt, NP, lg0) == 0, "%s", err_msg());
    struct sampler sm;
    CHECK(sampler_init(&sm, gp, V) == 0, "%s", err_msg());
    /* cells: (t1, t2, t3) -> counts for plain [0] and spec [1] */
    enum { MAXC = 4096 };
    static int32_t key[MAXC][3], cnt[MAXC][2];
    int32_t n_cell = 0;
    for (int g = 0; g < 2; g++)
        for (int32_t it = 0; it < n; it++) {
            int32_t hist[NP + 4], t[3];
            memcpy(hist, prompt, sizeof prompt);
            int32_t tq = engine_seq_fork(&p->te, ts), dq = engine_seq_fork(&p->de, ds);
            hist[NP] = t[0] = sampler_sample(&sm, lg0, hist, NP);
            if (g == 0) {
                memcpy(lg, lg0, sizeof(float) * (size_t)V);
                for (int32_t j = 1; j < 3; j++) {
                    int32_t ps = NP + j - 1, pa = -1;
                    uint8_t one = 1;
                    struct batch b = {1, &t[j - 1], &ps, &tq, &pa, &one};
                    CHECK(engine_forward(&p->te, &b, lg, NULL) == 1 && engine_commit_all(&p->te) == 0, "%s", err_msg());
                    hist[NP + j] = t[j] = sampler_sample(&sm, lg, hist, NP + j);
                }
            } else {
                spec_reset(&s, tq, dq);
                int32_t len = NP + 1;
                while (len < NP + 3) {
                    int32_t k = spec_step(&s, &sm, hist, len, hist + len, NP + 3 - len);
                    CHECK(k >= 1, "%s", err_msg());
                    if (k < 1)
                        break;
                    len += k;
                }
                t[1] = hist[NP + 1];
                t[2] = hist[NP + 2];
            }
            engine_seq_free(&p->te, tq);
            engine_seq_free(&p->de, dq);
            int32_t c = 0;
            while (c < n_cell && memcmp(key[c], t, sizeof t) != 0)
                c++;
            if (c == n_cell && n_cell < MAXC) {
                memcpy(key[n_cell], t, sizeof t);
                cnt[n_cell][0] = cnt[n_cell][1] = 0;
                n_cell++;
            }
            if (c < MAXC)
                cnt[c][g]++;
        }
    /* cells with fewer than 10 expected in a group pooled into one */
    double x2 = 0, pool[2] = {0, 0};
    int32_t df = 0;
    for (int32_t c = 0; c < n_cell; c++) {
        double tot = cnt[c][0] + cnt[c][1];
        if (tot / 2 < 10) {
            pool[0] += cnt[c][0];
            pool[1] += cnt[c][1];
            continue;
        }
        for (int g = 0; g < 2; g++)
            x2 += (cnt[c][g] - tot / 2) * (cnt[c][g] - tot / 2) / (tot / 2);
        df++;
    }
    if (pool[0] + pool[1] > 0) {
        double tot = pool[0] + pool[1];
        for (int g = 0; g < 2; g++)
            x2 += (pool[g] - tot / 2) * (pool[g] - tot / 2) / (tot / 2);
        df++;
    }
    df -= 1;
    const double z = 3.09, h = 2.0 / (9.0 * df);
    *crit = df * pow(1 - h + z * sqrt(h), 3);
    printf("  chi-square %.1f on %d degrees of freedom (critical %.1f at 0.001), accepted %lld of %lld tokens\n", x2,
           df, *crit, (long long)(s.st.tokens - s.st.steps), (long long)s.st.tokens);
    sampler_free(&sm);
    spec_free(&s);
    engine_seq_free(&p->te, ts);
    engine_seq_free(&p->de, ds);
    free(lg0);
    free(lg);
    return x2;
}

void test_spec_sampling(void)
{
    struct pair p;
    /* the draft is the target itself, so that most steps go through the acceptance rule */
    CHECK(pair_open(&p, fx("qwen3"), fx("qwen3")) == 0, "%s", err_msg());
    struct sampler_params gp = sampler_defaults();
    gp.temperature = 1.0f;
    gp.top_k = 6;
    gp.seed = 12345;
    struct spec_params sp = spec_defaults();
    sp.ngram = false;
    double crit, x2 = chi2_first3(&p, &gp, &sp, 20000, &crit);
    CHECK(x2 < crit, "KFlash sampling differs from plain sampling: chi-square %.1f >= %.1f", x2, crit);
    /* the same test with a biased acceptance rule must fail */
    sp.accept_bias = 0.6;
    x2 = chi2_first3(&p, &gp, &sp, 20000, &crit);
    CHECK(x2 > crit, "the chi-square test did not catch a biased acceptance rule: %.1f <= %.1f", x2, crit);
    pair_close(&p);
}
