/* kapitsa bench --draft: KFlash side by side with plain decoding on one prompt.
 * Greedy generation of the same tokens five ways (plain; a draft chain of k;
 * the KFlash tree; the tree with prompt lookup; the same tuned to the machine),
 * each checked identical to plain; reports target passes per token and
 * wall-clock speed, and the target's verify cost curve T(n) beside the tree
 * shape the tuner settled on. */
#define _POSIX_C_SOURCE 200809L
#include "../base/clock.h"
#include "../base/err.h"
#include "../engine/spec.h"
#include "../runtime/runtime.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        err_set("bench: cannot open %s", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    *n = b ? fread(b, 1, (size_t)sz, f) : 0;
    fclose(f);
    if (!b)
        err_set("bench: cannot read %s", path);
    return b;
}

struct run_result {
    const char *name;
    double seconds, t_draft, t_verify;
    int64_t passes, ngram;
    int identical;
    int32_t tuned_n, tuned_d;
    bool tuned_lookup;
};

/* Generates n_gen tokens after prompt with the given speculation (mode OFF:
 * plain one-token steps through the same code). tu (tuned runs, may be NULL):
 * the tuner's statistics to start from when it has any (as a server's later
 * requests start from its cached tuning), and where to leave them after. */
static int run_one(struct engine *te, struct engine *de, const struct spec_params *sp, const int32_t *prompt,
                   int32_t n, int32_t n_gen, int32_t *out, struct run_result *r, int32_t ctx, struct spec_tuner *tu)
{
    const int32_t V = te->m->cfg.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(n + n_gen + 1));
    int32_t ts = engine_seq_new(te), ds = engine_seq_new(de);
    struct sampler sm;
    struct sampler_params gp = sampler_defaults();
    struct spec s;
    int rc = -1;
    if (!lg || !hist || ts < 0 || ds < 0 || sampler_init(&sm, &gp, V) != 0)
        goto done;
    if (spec_init(&s, te, ts, de, ds, sp, ctx) != 0)
        goto done_sm;
    if (tu && tu->step > 0)
        s.tu = *tu;
    if (spec_prefill(&s, prompt, n, lg) != 0)
        goto done_spec;
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)n);
    int32_t len = n;
    double t0 = clock_now_s();
    hist[len++] = sampler_sample(&sm, lg, hist, n);
    while (len - n < n_gen) {
        int32_t k = spec_step(&s, &sm, hist, len, hist + len, n_gen - (len - n));
        if (k < 1)
            goto done_spec;
        len += k;
    }
    r->seconds = clock_now_s() - t0;
    r->passes = s.st.steps;
    r->t_draft = s.st.t_draft;
    r->t_verify = s.st.t_verify;
    r->ngram = s.st.ngram_accepted;
    spec_tuned_shape(&s, &r->tuned_n, &r->tuned_d, &r->tuned_lookup);
    if (tu)
        *tu = s.tu;
    memcpy(out, hist + n, sizeof(int32_t) * (size_t)n_gen);
    rc = 0;
done_spec:
    spec_free(&s);
done_sm:
    sampler_free(&sm);
done:
    engine_seq_free(te, ts);
    engine_seq_free(de, ds);
    free(lg);
    free(hist);
    return rc;
}

#define CURVE_N 7       /* n = 1, 2, 4, .., 64 */
#define CURVE_ROUNDS 25 /* each a forward of every n */

/* The target's verify cost for n tree tokens after the prompt, n = 1, 2, 4,
 * .., 64, in seconds: the fastest of CURVE_ROUNDS rounds, each timing every n
 * in turn after a round to warm up, so that other load on the machine slows
 * every n alike and the least disturbed forward of each is kept. The tree is
 * binary in heap order (node i below node (i-1)/2) and, as a greedy verify
 * pass asks, the top logit of its leftmost path (the path spec_fill
 * predicts) comes back; nothing is committed, so each forward sees the same
 * prefix. */
static int verify_curve(struct engine *te, const int32_t *prompt, int32_t n_prompt, double *t)
{
    int32_t tok[64], pos[64], seq[64], par[64], ids[64];
    uint8_t want[64];
    const int32_t ts = engine_seq_new(te);
    int rc = -1;
    if (ts < 0)
        return -1;
    struct spec_params sp = spec_defaults();
    sp.mode = SPEC_OFF;
    struct spec s;
    if (spec_init(&s, te, ts, NULL, -1, &sp, n_prompt + 65) != 0)
        goto done;
    if (spec_prefill(&s, prompt, n_prompt - 1, NULL) != 0)
        goto done_spec;
    for (int32_t i = 0; i < 64; i++) {
        par[i] = i ? (i - 1) / 2 : -1;
        tok[i] = prompt[(n_prompt - 1 + i) % n_prompt];
        pos[i] = i ? pos[par[i]] + 1 : n_prompt - 1;
        seq[i] = ts;
        want[i] = i == 0 || (i & (i + 1)) == 0; /* 0, 1, 3, 7, ..: the leftmost path */
    }
    for (int32_t r = -1; r < CURVE_ROUNDS; r++)
        for (int32_t c = 0; c < CURVE_N; c++) {
            const struct batch b = {1 << c, tok, pos, seq, par, want};
            const double t0 = clock_now_s();
            if (engine_forward(te, &b, NULL, NULL) < 0 || engine_out_top(te, 1, ids, NULL) != 0)
                goto done_spec;
            const double dt = clock_now_s() - t0;
            t[c] = r < 0 || dt < t[c] ? dt : t[c];
        }
    rc = 0;
done_spec:
    spec_free(&s);
done:
    engine_seq_free(te, ts);
    return rc;
}

int bench_spec(const char *target, const char *draft, const char *prompt_file, int32_t n_gen, int32_t threads,
               const char *device,
               int32_t chain_k, int32_t tree_n, int32_t tree_d, int json)
{
    struct runtime rt = {0};
    struct engine te, de;
    struct tok_ids ids = {0};
    char *text = NULL;
    int32_t *want = NULL, *got = NULL;
    int rc = 1, n_up = 0;
    size_t n_text = 0;
    if (!(text = read_file(prompt_file, &n_text)) ||
        runtime_open(&rt, &(struct runtime_opts){.device = device, .threads = threads, .model = target, .draft = draft, .tokenizer = true}) != 0 ||
        tok_encode(rt.tok, text, n_text, &ids) != 0)
        goto done;
    const int32_t batch = (tree_n > chain_k ? tree_n : chain_k) + 1 < 64 ? 64 : (tree_n > chain_k ? tree_n : chain_k) + 1;
    int32_t ctx = ids.n + n_gen + (tree_n > chain_k ? tree_n : chain_k) + 2;
    if (ctx < ids.n + 65) /* the verify curve's largest tree */
        ctx = ids.n + 65;
    if (engine_init(&te, &rt.m, ctx, 1, batch, batch, batch, DT_F32) != 0)
        goto done;
    n_up = 1;
    if (engine_init(&de, &rt.dm, ctx, 1, batch, batch, batch, DT_F32) != 0)
        goto done;
    n_up = 2;
    want = malloc(sizeof(int32_t) * (size_t)n_gen);
    got = malloc(sizeof(int32_t) * (size_t)n_gen);
    if (!want || !got) {
        err_set("bench: out of memory");
        goto done;
    }
    enum { N_RUNS = 6 };
    struct spec_params sp[N_RUNS];
    for (int i = 0; i < N_RUNS; i++)
        sp[i] = spec_defaults();
    sp[0].mode = SPEC_OFF;
    sp[1].mode = SPEC_CHAIN, sp[1].n_nodes = chain_k, sp[1].ngram = false;
    sp[2].n_nodes = tree_n, sp[2].depth = tree_d, sp[2].ngram = false;
    sp[3].n_nodes = tree_n, sp[3].depth = tree_d;
    sp[4].n_nodes = tree_n, sp[4].depth = tree_d, sp[4].tune = true;
    sp[5] = sp[4];
    /* tuned: from nothing (every shape is tried first); warm: again, starting
     * from what the first tuned run learnt */
    struct run_result r[N_RUNS] = {{.name = "plain"},      {.name = "chain"}, {.name = "tree"},
                                   {.name = "tree+ngram"}, {.name = "tuned"}, {.name = "tuned-warm"}};
    struct spec_tuner tu = {0};
    for (int i = 0; i < N_RUNS; i++) {
        if (run_one(&te, &de, &sp[i], ids.ids, ids.n, n_gen, i ? got : want, &r[i], ctx, i >= 4 ? &tu : NULL) != 0)
            goto done;
        r[i].identical = i == 0 || memcmp(got, want, sizeof(int32_t) * (size_t)n_gen) == 0;
    }
    double curve[CURVE_N];
    if (verify_curve(&te, ids.ids, ids.n, curve) != 0)
        goto done;
    if (json) {
        printf("{\"target\":\"%s\",\"draft\":\"%s\",\"prompt_tokens\":%d,\"gen\":%d,\"runs\":[", target, draft, ids.n,
               n_gen);
        for (int i = 0; i < N_RUNS; i++)
            printf("%s{\"spec\":\"%s\",\"passes\":%lld,\"tokens_per_pass\":%.3f,\"seconds\":%.4f,\"speedup\":%.3f,"
                   "\"draft_s\":%.4f,\"verify_s\":%.4f,\"ngram_accepted\":%lld,\"identical\":%s}",
                   i ? "," : "", r[i].name, (long long)r[i].passes, (double)n_gen / (double)r[i].passes, r[i].seconds,
                   r[0].seconds / r[i].seconds, r[i].t_draft, r[i].t_verify, (long long)r[i].ngram,
                   r[i].identical ? "true" : "false");
        printf("],\"tuned\":{\"nodes\":%d,\"depth\":%d,\"lookup_first\":%s},\"verify_curve\":[", r[5].tuned_n,
               r[5].tuned_d, r[5].tuned_lookup ? "true" : "false");
        for (int32_t c = 0; c < CURVE_N; c++)
            printf("%s{\"n\":%d,\"seconds\":%.6f,\"ratio\":%.3f}", c ? "," : "", 1 << c, curve[c],
                   curve[c] / curve[0]);
        printf("]}\n");
    } else {
        printf("target %s, draft %s; prompt %d tokens, %d generated greedily\n", target, draft, ids.n, n_gen);
        printf("%-11s %8s %12s %9s %9s %9s %8s %s\n", "spec", "passes", "tokens/pass", "seconds", "draft s",
               "verify s", "speedup", "output");
        for (int i = 0; i < N_RUNS; i++)
            printf("%-11s %8lld %12.2f %9.3f %9.3f %9.3f %7.2fx %s\n", r[i].name, (long long)r[i].passes,
                   (double)n_gen / (double)r[i].passes, r[i].seconds, r[i].t_draft, r[i].t_verify,
                   r[0].seconds / r[i].seconds, r[i].identical ? "identical" : "DIFFERS");
    }
    if (!json) {
        printf("tuned: the tree shape it settled on: %d nodes, depth %d%s\n", r[5].tuned_n, r[5].tuned_d,
               r[5].tuned_lookup ? ", the draft skipped when prompt lookup proposes 4+ tokens" : "");
        printf("verify cost T(n)/T(1) after the prompt (T(1) = %.3f ms):", curve[0] * 1e3);
        for (int32_t c = 0; c < CURVE_N; c++)
            printf(" n=%d %.2f", 1 << c, curve[c] / curve[0]);
        printf("\n");
    }
    rc = r[1].identical && r[2].identical && r[3].identical && r[4].identical && r[5].identical ? 0 : 1;
    if (rc)
        err_set("bench: speculative output differs from plain decoding");
done:
    if (rc)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    free(want);
    free(got);
    if (n_up > 1)
        engine_free(&de);
    if (n_up > 0)
        engine_free(&te);
    tok_ids_free(&ids);
    free(text);
    runtime_close(&rt);
    return rc;
}
