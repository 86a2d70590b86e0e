/* kapitsa eval: held-out metrics of a model (and of a draft beside it) over a
 * token stream, defined as tools/train/eval_pair.py defines them for PyTorch so
 * that the two can be compared:
 *   loss: mean next-token cross-entropy over windows of 512 tokens, each on its
 *         own (ids[s..s+513) for s = 0, 512, ... while s + 513 <= n);
 *   top-1 match: the share of those positions where draft and target argmax agree;
 *   accepted of 5: at 200 evenly spread positions p, both models continue
 *         ids[p-64..p) greedily for 5 tokens; the length of the common prefix. */
#define _POSIX_C_SOURCE 200809L
#include "../base/err.h"
#include "../engine/engine.h"
#include "../engine/sampler.h"
#include "../runtime/runtime.h"
#include "cli.h"
#include "progress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_SEQ 512
#define EVAL_CHUNK 64

/* Feeds toks[0..n) as a new sequence; logits of every row in lg [n][V] (NULL: none). */
static int feed_all(struct engine *e, const int32_t *toks, int32_t n, float *lg, int32_t *seq_out)
{
    int32_t seq = engine_seq_new(e), pos[EVAL_CHUNK], sq[EVAL_CHUNK], par[EVAL_CHUNK];
    uint8_t want[EVAL_CHUNK];
    if (seq < 0)
        return -1;
    const size_t V = (size_t)e->m->cfg.vocab_size;
    for (int32_t done = 0; done < n;) {
        int32_t k = n - done < EVAL_CHUNK ? n - done : EVAL_CHUNK;
        for (int32_t i = 0; i < k; i++)
            pos[i] = done + i, sq[i] = seq, par[i] = i - 1, want[i] = lg != NULL || done + i == n - 1;
        struct batch b = {k, toks + done, pos, sq, par, want};
        if (engine_forward(e, &b, lg ? lg + (size_t)done * V : NULL, NULL) < 0 || engine_commit_all(e) != 0) {
            engine_seq_free(e, seq);
            return -1;
        }
        done += k;
    }
    *seq_out = seq;
    return 0;
}

/* Greedy continuation of ctx by n tokens. */
static int greedy(struct engine *e, const int32_t *ctx, int32_t n_ctx, int32_t n, int32_t *out, float *lg)
{
    int32_t seq, V = e->m->cfg.vocab_size;
    /* the context but its last token, which each step below then feeds on its own */
    if (feed_all(e, ctx, n_ctx - 1, NULL, &seq) != 0)
        return -1;
    int32_t t = ctx[n_ctx - 1];
    for (int32_t i = 0; i < n; i++) {
        int32_t p = n_ctx - 1 + i, pa = -1;
        uint8_t one = 1;
        struct batch b = {1, &t, &p, &seq, &pa, &one};
        if (engine_forward(e, &b, lg, NULL) != 1 || engine_commit_all(e) != 0) {
            engine_seq_free(e, seq);
            return -1;
        }
        out[i] = t = sampler_argmax(lg, V);
    }
    engine_seq_free(e, seq);
    return 0;
}

static void eval_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa eval -m|--model M [--draft DIR] --ids FILE [--tokens N] [-t|--threads N]\n"
               "       [--device cpu|cuda|auto]\n"
               "  FILE: little-endian int32 token ids (tools/train/eval_pair.py writes the held-out\n"
               "  split); prints the loss over the first N tokens (default 16384) in windows of 512,\n"
               "  and with a draft its top-1 agreement and mean accepted length of 5-token chains\n");
}

int cli_eval(int argc, char **argv)
{
    const char *dir = NULL, *draft = NULL, *ids_path = NULL, *v;
    int64_t n_tok = 16384, threads = 0;
    const char *device = NULL;
    for (int i = 0; i < argc; i++) {
        int f;
        if ((f = cli_flag(argc, argv, &i, "-m|--model", &dir)) || (f = cli_flag(argc, argv, &i, "--draft", &draft)) ||
            (f = cli_flag(argc, argv, &i, "--ids", &ids_path)) ||
            (f = cli_flag(argc, argv, &i, "--device", &device))) {
            if (f < 0)
                return 2;
            continue;
        }
        int64_t *dst = NULL;
        if ((f = cli_flag(argc, argv, &i, "--tokens", &v)))
            dst = &n_tok;
        else if ((f = cli_flag(argc, argv, &i, "-t|--threads", &v)))
            dst = &threads;
        else
            return cli_arg_reject(argv[i], eval_usage);
        if (f < 0 || (*dst = cli_int(v)) < 1) {
            eval_usage(stderr);
            return 2;
        }
    }
    if (!dir || !ids_path) {
        fprintf(stderr, "kapitsa eval: --model and --ids are required (--help)\n");
        return 2;
    }
    if (!(dir = cli_model_dir(dir)) || (draft && !(draft = cli_model_dir(draft)))) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    FILE *f = fopen(ids_path, "rb");
    if (!f) {
        fprintf(stderr, "kapitsa: cannot open %s\n", ids_path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    const int64_t n_all = ftell(f) / 4;
    fseek(f, 0, SEEK_SET);
    int32_t *ids = malloc((size_t)(n_all > 0 ? n_all : 1) * sizeof(int32_t));
    const size_t got = ids ? fread(ids, sizeof(int32_t), (size_t)n_all, f) : 0;
    fclose(f);
    struct runtime rt = {0};
    struct engine e, de;
    float *lg = NULL, *dlg = NULL;
    int rc = 1, n_up = 0;
    if (!ids || got != (size_t)n_all || n_all < EVAL_SEQ + 665) {
        err_set("eval: %s: need at least %d token ids", ids_path, EVAL_SEQ + 665);
        goto done;
    }
    if (runtime_open(&rt, &(struct runtime_opts){.device = device, .threads = (int32_t)threads, .model = dir, .draft = draft}) != 0)
        goto done;
    const int32_t V = rt.m.cfg.vocab_size;
    for (int64_t i = 0; i < n_all; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            err_set("eval: id %d at %lld outside the vocabulary", ids[i], (long long)i);
            goto done;
        }
    if (engine_init(&e, &rt.m, EVAL_SEQ + 16, 1, EVAL_CHUNK, EVAL_CHUNK, 0, DT_F32) != 0)
        goto done;
    n_up = 1;
    if (draft && engine_init(&de, &rt.dm, EVAL_SEQ + 16, 1, EVAL_CHUNK, EVAL_CHUNK, 0, DT_F32) != 0)
        goto done;
    n_up += draft != NULL;
    lg = malloc((size_t)EVAL_SEQ * (size_t)V * sizeof(float));
    dlg = draft ? malloc((size_t)EVAL_SEQ * (size_t)V * sizeof(float)) : NULL;
    if (!lg || (draft && !dlg)) {
        err_set("eval: out of memory");
        goto done;
    }
    const int64_t n_use = n_tok + 1 < n_all ? n_tok + 1 : n_all;
    double nll = 0;
    int64_t count = 0, match = 0;
    struct progress pr;
    progress_begin(&pr, stderr, "eval: held-out loss", (n_use - 1) / EVAL_SEQ * EVAL_SEQ, "tokens");
    for (int64_t s = 0; s + EVAL_SEQ + 1 <= n_use; s += EVAL_SEQ) {
        progress_update(&pr, count, NULL);
        int32_t seq;
        if (feed_all(&e, ids + s, EVAL_SEQ, lg, &seq) != 0)
            goto done;
        engine_seq_free(&e, seq);
        if (draft) {
            if (feed_all(&de, ids + s, EVAL_SEQ, dlg, &seq) != 0)
                goto done;
            engine_seq_free(&de, seq);
        }
        for (int32_t t = 0; t < EVAL_SEQ; t++) {
            const float *l = lg + (size_t)t * (size_t)V;
            int32_t a = sampler_argmax(l, V);
            double z = 0;
            for (int32_t x = 0; x < V; x++)
                z += exp((double)(l[x] - l[a]));
            nll += (double)l[a] + log(z) - (double)l[ids[s + t + 1]];
            if (draft)
                match += sampler_argmax(dlg + (size_t)t * (size_t)V, V) == a;
        }
        count += EVAL_SEQ;
    }
    progress_update(&pr, count, NULL);
    progress_end(&pr);
    double acc = 0;
    if (draft) {
        const int64_t step = (n_all - 64 - 600) / 200;
        progress_begin(&pr, stderr, "eval: draft agreement", 200, "positions");
        for (int32_t i = 0; i < 200; i++) {
            progress_update(&pr, i, NULL);
            const int64_t p = 64 + i * step;
            int32_t tg[5], dg[5], k = 0;
            if (greedy(&e, ids + p - 64, 64, 5, tg, lg) != 0 || greedy(&de, ids + p - 64, 64, 5, dg, dlg) != 0)
                goto done;
            while (k < 5 && tg[k] == dg[k])
                k++;
            acc += k;
        }
        progress_update(&pr, 200, NULL);
        progress_end(&pr);
    }
    printf("{\"model\":\"%s\",\"tokens\":%lld,\"heldout_loss\":%.4f,\"heldout_ppl\":%.2f", dir, (long long)count,
           nll / (double)count, exp(nll / (double)count));
    if (draft)
        printf(",\"draft\":\"%s\",\"draft_top1_match\":%.4f,\"draft_mean_accepted_of_5\":%.3f", draft,
               (double)match / (double)count, acc / 200);
    printf("}\n");
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    free(lg);
    free(dlg);
    if (n_up > 1)
        engine_free(&de);
    if (n_up > 0)
        engine_free(&e);
    free(ids);
    runtime_close(&rt);
    return rc;
}
