/* kapitsa bench: prefill and decode speed of a checkpoint on this machine,
 * beside the memory-bandwidth roofline of decode (weight bytes read per token
 * over the read bandwidth measured here, with the same threads). */
#define _GNU_SOURCE
#include "../backend/profile.h"
#include "../base/clock.h"
#include "../base/err.h"
#include "../engine/engine.h"
#include "../engine/sampler.h"
#include "../engine/spec.h"
#include "../runtime/runtime.h"
#include "cli.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The share of a MoE layer's experts a decode step of S tokens reads: the
 * distinct experts of MOE_SPREAD_ID's picks for rows 0..S-1 on a synthetic
 * checkpoint, else as many as picks spread at random would reach (a trained
 * router's, roughly): E (1 - (1 - k/E)^S). */
static double expert_share(const struct model_config *c, int32_t S)
{
    const int32_t E = c->n_expert, k = c->n_expert_used;
    if (!c->route_spread)
        return 1.0 - pow(1.0 - (double)k / E, S);
    int32_t n = 0;
    for (int32_t e = 0; e < E; e++) {
        bool hit = false;
        for (int32_t r = 0; r < S && !hit; r++)
            for (int32_t j = 0; j < k && !hit; j++)
                hit = MOE_SPREAD_ID(r, j, E, k) == e;
        n += hit;
    }
    return (double)n / E;
}

/* The block scales of an FP8 checkpoint's weights: used at load, never read by a step. */
static bool fp8_scale(const struct model_config *c, const struct st_tensor *t)
{
    const size_t n = strlen(t->name);
    return c->fp8_block[0] && n > 10 && strcmp(t->name + n - 10, "_scale_inv") == 0;
}

/* Bytes of weights a decode step of S tokens reads: the decoder's tensors and
 * the LM head (not the input embedding table: one row of it; not vision or
 * MTP tensors a checkpoint may carry), routed experts at their share. FP8
 * weights count as the BF16 copies the backends run (fp8.h). */
static double decode_bytes(const struct model *m, int32_t S)
{
    const struct model_config *c = &m->cfg;
    double total = 0;
    for (int32_t i = 0; i < m->st.n_tensors; i++) {
        const struct st_tensor *t = &m->st.tensors[i];
        double b = (double)t->n_bytes * (t->type == DT_F8_E4M3 ? 2 : 1);
        if (fp8_scale(c, t))
            continue;
        const bool head = strcmp(t->name, "lm_head.weight") == 0;
        if (!head && strncmp(t->name, c->prefix, strlen(c->prefix)) != 0)
            continue;
        if (t == m->embed_stored && !c->tie_embeddings) /* one row a step, unless it is also the LM head */
            continue;
        if (strstr(t->name, ".experts."))
            b *= expert_share(c, S);
        total += b;
    }
    return total;
}

/* What one sequence's decode step reads of its caches at context ctx: every
 * attention layer's keys and values of ctx positions, and every recurrent
 * layer's conv and scan state (read, then written). */
static double cache_bytes(const struct engine *e, double ctx)
{
    double b = 0;
    for (int32_t l = 0; l < e->kv.n_layer; l++)
        b += ctx * (double)(e->kv.k[l].n_cols * dtype_size(e->kv.k[l].type) +
                            e->kv.v[l].n_cols * dtype_size(e->kv.v[l].type));
    for (int32_t l = 0; l < e->st.n_rec_layer; l++)
        b += 2.0 * (double)(e->st.conv[l].n_cols * dtype_size(e->st.conv[l].type) +
                            e->st.ssm[l].n_cols * dtype_size(e->st.ssm[l].type));
    return b;
}

/* FLOPs of a prefill of n tokens that keeps one row's logits: two per weight
 * element of the decoder (experts at their active share) per token, and the
 * causal attention products (q.k and p.v over n(n+1)/2 pairs per head). The
 * embedding table is a lookup, and the LM head runs for one row: neither
 * counts. The embedding is found as the checkpoint's tensor, not by the
 * bound tensor's data, which a GPU backend holds as its own copy. */
static double prefill_flops(const struct model *m, int64_t n)
{
    const struct model_config *c = &m->cfg;
    double w = 0;
    for (int32_t i = 0; i < m->st.n_tensors; i++) {
        const struct st_tensor *t = &m->st.tensors[i];
        if (t->n_dim != 2 || strncmp(t->name, c->prefix, strlen(c->prefix)) != 0 || t == m->embed_stored ||
            fp8_scale(c, t))
            continue;
        double e = (double)t->shape[0] * (double)t->shape[1];
        if (strstr(t->name, ".experts."))
            e *= (double)c->n_expert_used / c->n_expert;
        w += e;
    }
    const double att = 4.0 * (double)c->n_head * c->head_dim * c->n_attn_layer * (double)n * (double)(n + 1) / 2;
    return 2.0 * w * (double)n + att;
}

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa bench -m|--model M [-t|--threads N] [--device D] [-p|--prompt N[,N...]] [-n|--gen M]\n"
               "                     [--batch B] [--seqs S] [--sample T,K] [--peak-gbs G] [--peak-tflops T]\n"
               "                     [--kv-type bf16|f32] [--mix] [-r|--repetitions R] [--json]\n"
               "  prefill N random tokens (default 512; several lengths: a row each, with the time to the\n"
               "  first token) in batches of B (default 512; on a GPU 4096, the server's chunk there), then\n"
               "  decode M tokens (default 64) greedily, or with --sample seeded draws at temperature T from\n"
               "  the K best (K <= %d, read as such, as the server does; K = 0: whole rows); S sequences at\n"
               "  once (default 1, at most 64; each its own copy of the prompt, one forward per step).\n"
               "  Prints tok/s and the rooflines: decode, weight bytes per token over the read bandwidth\n"
               "  (measured on the cpu; a GPU's peak from the clocks its driver reports, or G GB/s); prefill\n"
               "  on a GPU, its FLOPs over its bf16 tensor-core peak (or T TFLOP/s).\n"
               "  --mix: then the prompt again as a server feeds it beside the S decoding sequences (their\n"
               "  S tokens and B - S of the prompt a step, B > S): its time to the first token, their speed\n"
               "  meanwhile\n"
               "  -r R: each length measured R times (default 1), the mean ± the standard deviation of\n"
               "  the runs' tok/s, as llama-bench gives them. --json: one object, the run's settings and a\n"
               "  row per prompt length (its means, the deviations as *_sd)\n"
               "       kapitsa bench --model DIR --draft DIR --prompt-file FILE [--gen M] [--threads N]\n"
               "                     [--chain K] [--spec-tree N,D] [--json]\n"
               "  KFlash side by side: greedy generation after the file's text, plain, with a draft chain of\n"
               "  K (default 4), the KFlash tree of N nodes / depth D (default 24,8), and the tree with prompt\n"
               "  lookup; prints target passes per token and the speedup, and checks all four agree\n"
               "       kapitsa bench compare --against URL [--against URL ...]   (see bench compare --help)\n"
               "       kapitsa bench --tokenizer DIR --corpus FILE.jsonl\n"
               "  encodes every {\"text\", \"ids\"} line on one thread (best of 3 passes), checks the ids\n"
               "  and prints the encoding speed in MB/s\n",
            TOP_K_MAX);
}

/* Tokenizer throughput over a golden corpus; every document must match. */
static int bench_tokenizer(const char *dir, const char *corpus)
{
    struct tokenizer *t = runtime_tokenizer(dir);
    FILE *f = fopen(corpus, "r");
    json_t **docs = NULL;
    size_t n_docs = 0, cap = 0, bytes = 0, bad = 0;
    int rc = 1;
    char *line = NULL;
    size_t line_cap = 0;
    if (!t || !f) {
        fprintf(stderr, "kapitsa: %s\n", t ? "cannot open the corpus" : err_msg());
        goto done;
    }
    while (getline(&line, &line_cap, f) > 0) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        if (!json_is_string(json_object_get(j, "text")) || !json_is_array(json_object_get(j, "ids"))) {
            fprintf(stderr, "kapitsa: %s: line %zu is not {\"text\", \"ids\"}\n", corpus, n_docs + 1);
            json_decref(j);
            goto done;
        }
        if (n_docs == cap) {
            cap = cap ? cap * 2 : 256;
            json_t **nd = realloc(docs, cap * sizeof *nd);
            if (!nd)
                goto done;
            docs = nd;
        }
        docs[n_docs++] = j;
        bytes += json_string_length(json_object_get(j, "text"));
    }
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        double t_sum = 0;
        for (size_t d = 0; d < n_docs; d++) {
            json_t *text = json_object_get(docs[d], "text"), *want = json_object_get(docs[d], "ids");
            struct tok_ids ids = {0};
            double t0 = clock_now_s();
            int e = tok_encode(t, json_string_value(text), json_string_length(text), &ids);
            t_sum += clock_now_s() - t0;
            int same = e == 0 && (size_t)ids.n == json_array_size(want);
            for (int32_t i = 0; same && i < ids.n; i++)
                same = ids.ids[i] == json_integer_value(json_array_get(want, (size_t)i));
            if (pass == 0 && !same && bad++ < 5)
                fprintf(stderr, "mismatch in document %zu\n", d + 1);
            tok_ids_free(&ids);
        }
        best = pass == 0 || t_sum < best ? t_sum : best;
    }
    printf("{\"docs\":%zu,\"bytes\":%zu,\"mismatched_docs\":%zu,\"encode_s\":%.4f,\"MB_s\":%.3f}\n", n_docs, bytes,
           bad, best, (double)bytes / best / 1e6);
    rc = bad ? 1 : 0;
done:
    for (size_t d = 0; d < n_docs; d++)
        json_decref(docs[d]);
    free(docs);
    free(line);
    if (f)
        fclose(f);
    tok_free(t);
    return rc;
}

#define BENCH_MAX_SEQS 64

/* A new sequence holding tok[0..n) (prefilled in batches of n_batch); the
 * last token's logits in logits. The sequence id, or -1. */
static int32_t bench_prefill(struct engine *e, const int32_t *tok, int64_t n, int32_t n_batch, int32_t *pos,
                             int32_t *seqv, int32_t *par, uint8_t *want, float *logits)
{
    const int32_t seq = engine_seq_new(e);
    if (seq < 0)
        return -1;
    for (int64_t done = 0; done < n;) {
        const int32_t k = (int32_t)(n - done < n_batch ? n - done : n_batch);
        for (int32_t i = 0; i < k; i++) {
            pos[i] = (int32_t)(done + i);
            seqv[i] = seq;
            par[i] = i - 1;
            want[i] = done + i == n - 1;
        }
        struct batch b = {k, tok + done, pos, seqv, par, want};
        if (engine_forward(e, &b, logits, NULL) < 0 || engine_commit_all(e) != 0)
            return -1;
        done += k;
    }
    return seq;
}

/* One step as a server takes it beside a prompt: the S decoding sequences'
 * next tokens (rows 0..S, at npos) and rows [done, done + k) of the prompt
 * in sequence q. The decoders' next tokens come back in next (npos moves
 * on); 1 when the step held the prompt's last row, 0 if not, -1 on failure.
 * Buffers: tok, pos, seqv, par, want [S + k], ids [S + 1]. */
static int bench_mix_step(struct engine *e, const int32_t *prompt, int64_t n_prompt, int64_t done, int32_t k, int32_t q,
                          int32_t S, const int32_t *seqs, int32_t *next, int32_t *npos, int32_t *tok, int32_t *pos,
                          int32_t *seqv, int32_t *par, uint8_t *want, int32_t *ids)
{
    for (int32_t i = 0; i < S; i++) {
        tok[i] = next[i];
        pos[i] = npos[i];
        seqv[i] = seqs[i];
        par[i] = -1;
        want[i] = 1;
    }
    for (int32_t i = 0; i < k; i++) {
        tok[S + i] = prompt[done + i];
        pos[S + i] = (int32_t)(done + i);
        seqv[S + i] = q;
        par[S + i] = i ? S + i - 1 : -1;
        want[S + i] = done + i == n_prompt - 1;
    }
    struct batch b = {S + k, tok, pos, seqv, par, want};
    if (engine_forward(e, &b, NULL, NULL) < 0 || engine_out_top(e, 1, ids, NULL) != 0 || engine_commit_all(e) != 0)
        return -1;
    for (int32_t i = 0; i < S; i++) {
        next[i] = ids[i];
        npos[i]++;
    }
    return done + k == n_prompt;
}

/* Running sums of one measure over the repetitions (-r): its mean and its
 * sample standard deviation, as llama-bench reports tok/s. */
struct bench_stat {
    double sum, sumsq;
    int64_t n;
};

static void stat_add(struct bench_stat *st, double x)
{
    st->sum += x;
    st->sumsq += x * x;
    st->n++;
}

static double stat_mean(const struct bench_stat *st)
{
    return st->n ? st->sum / (double)st->n : 0.0;
}

static double stat_sd(const struct bench_stat *st)
{
    if (st->n < 2)
        return 0.0;
    const double m = stat_mean(st), v = (st->sumsq - (double)st->n * m * m) / (double)(st->n - 1);
    return v > 0 ? sqrt(v) : 0.0;
}

/* " ± SD" after a mean of several runs, nothing after one. */
static void stat_print_sd(const struct bench_stat *st, int64_t reps)
{
    if (reps > 1)
        printf(" ± %.2f", stat_sd(st));
}

/* One prompt length's measures over the repetitions. */
struct bench_row {
    int64_t prompt;
    struct bench_stat pf, ttft, dc; /* prefill tok/s, first token ms, decode tok/s per sequence */
    struct bench_stat mix_ttft, mix_dc; /* --mix */
    int32_t mix_steps;
};

/* What bench's command line asks for (bench_parse). */
struct bench_opts {
    const char *dir, *tok_dir, *corpus, *draft, *prompt_file, *device;
    /* n_batch 0: the larger of 512 and the backend's prefill chunk (a GPU's 4096, as the server feeds a prompt) */
    int64_t threads, n_prompt, n_gen, n_batch, chain_k, n_seqs, reps;
    int64_t lens[8]; /* prompt lengths, a row each */
    int32_t n_lens;
    int tree_n, tree_d;
    int json, mix;
    float sample_t;
    int sample_k;
    double peak_gbs, peak_tflops; /* 0: the device's (backend_ops.info) */
    enum dtype kv_type;
};

/* The options into o: -1 to go on, else the exit status (a usage error). */
static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
    const char *v;
    *o = (struct bench_opts){.n_prompt = 512, .n_gen = 64, .chain_k = 4, .n_seqs = 1, .reps = 1, .lens = {512},
                             .n_lens = 1, .tree_n = 24, .tree_d = 8, .kv_type = CLI_KV_DEFAULT};
    for (int i = 0; i < argc; i++) {
        int f;
        int64_t *dst = NULL;
        if ((f = cli_kv_flag(argc, argv, &i, &o->kv_type)) != 0) {
            if (f < 0)
                return bench_usage(stderr), 2;
            continue;
        }
        if (cli_switch(argv[i], "--json")) {
            o->json = 1;
            continue;
        }
        if (cli_switch(argv[i], "--mix")) {
            o->mix = 1;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "-m|--model", &o->dir)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--tokenizer", &o->tok_dir)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--corpus", &o->corpus)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--draft", &o->draft)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--prompt-file", &o->prompt_file)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--device", &o->device)) != 0) {
            if (f < 0)
                return 2;
            continue;
        }
        double *peak = NULL;
        if ((f = cli_flag(argc, argv, &i, "--peak-gbs", &v)) != 0)
            peak = &o->peak_gbs;
        else if ((f = cli_flag(argc, argv, &i, "--peak-tflops", &v)) != 0)
            peak = &o->peak_tflops;
        if (peak) {
            if (f < 0 || sscanf(v, "%lf", peak) != 1 || !(*peak > 0)) {
                bench_usage(stderr);
                return 2;
            }
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--sample", &v)) != 0) {
            if (f < 0 || sscanf(v, "%f,%d", &o->sample_t, &o->sample_k) != 2 || !(o->sample_t > 0) || o->sample_k < 0)
                return bench_usage(stderr), 2;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--spec-tree", &v)) != 0) {
            if (f < 0 || sscanf(v, "%d,%d", &o->tree_n, &o->tree_d) != 2 || o->tree_n < 1 || o->tree_d < 1 ||
                o->tree_n > SPEC_MAX_NODES || o->tree_d > SPEC_MAX_DEPTH) {
                fprintf(stderr, "kapitsa bench: --spec-tree needs N,D with N <= %d, D <= %d\n", SPEC_MAX_NODES,
                        SPEC_MAX_DEPTH);
                return 2;
            }
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "-p|--prompt", &v)) != 0) {
            o->n_lens = 0;
            for (const char *p = v; f > 0 && *p;) {
                char *end;
                long x = strtol(p, &end, 10);
                if (end == p || x < 1 || x > 1000000 || o->n_lens == 8 || (*end && *end != ','))
                    return bench_usage(stderr), 2;
                o->lens[o->n_lens++] = x;
                p = *end ? end + 1 : end;
            }
            if (f < 0 || o->n_lens == 0)
                return bench_usage(stderr), 2;
            o->n_prompt = o->lens[o->n_lens - 1];
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "-t|--threads", &v)) != 0)
            dst = &o->threads;
        else if ((f = cli_flag(argc, argv, &i, "-n|--gen", &v)) != 0)
            dst = &o->n_gen;
        else if ((f = cli_flag(argc, argv, &i, "--batch", &v)) != 0)
            dst = &o->n_batch;
        else if ((f = cli_flag(argc, argv, &i, "--chain", &v)) != 0)
            dst = &o->chain_k;
        else if ((f = cli_flag(argc, argv, &i, "--seqs", &v)) != 0)
            dst = &o->n_seqs;
        else if ((f = cli_flag(argc, argv, &i, "-r|--repetitions", &v)) != 0)
            dst = &o->reps;
        else
            return cli_arg_reject(argv[i], bench_usage);
        if (f < 0 || (*dst = cli_int(v)) < 1 || *dst > 1000000) {
            bench_usage(stderr);
            return 2;
        }
    }
    return -1;
}

/* The rows bench measured, as a table, text or one JSON object; S sequences
 * at once, the mix's chunk, and n_smp samplers reading k_read top logits
 * (n_smp 0: greedy). */
static void bench_report(const struct bench_opts *o, const struct model *m, const struct engine *e,
                         const struct backend *be, const struct bench_row *rows, int32_t S, bool gpu, int64_t chunk,
                         int32_t n_smp, int32_t k_read)
{
    int32_t nth = o->threads > 0 ? (int32_t)o->threads : 0;
    if (nth == 0)
        nth = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    /* a step reads the weights once for all sequences (each row: and each one's
     * caches at its context, the middle of the generated run on average) */
    const double wbytes = decode_bytes(m, S);
    const double bw = o->peak_gbs * 1e9;
    if (o->json)
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"threads\":%d,\"gen\":%lld,\"seqs\":%d,\"reps\":%lld,"
               "\"kv_type\":\"%s\",\"route_spread\":%s,\"decode_bytes_per_token\":%.0f,\"read_bandwidth_gb_s\":%.2f,"
               "\"rows\":[",
               o->dir, be->ops->name, nth, (long long)o->n_gen, S, (long long)o->reps, dtype_name(o->kv_type),
               m->cfg.route_spread ? "true" : "false", wbytes, bw / 1e9);
    else if (o->n_lens > 1)
        printf("model    %s (%s, %s%s)\n%8s %22s %14s %16s %22s\n", o->dir, m->cfg.model_type, be->ops->name,
               m->cfg.route_spread ? ", spread routing" : "", "prompt", "prefill tok/s", "TFLOP/s", "first token ms",
               "decode tok/s");
    for (int32_t l = 0; l < o->n_lens; l++) {
        const struct bench_row *row = &rows[l];
        const int64_t n_prompt = row->prompt;
        /* dc: tokens per second of each sequence */
        const double pf = stat_mean(&row->pf), dc = stat_mean(&row->dc), ttft = stat_mean(&row->ttft);
        const double cbytes = cache_bytes(e, (double)n_prompt + (double)o->n_gen / 2), roof = bw / (wbytes + S * cbytes);
        const double flops = prefill_flops(m, n_prompt), pflops = flops * pf / (double)n_prompt / 1e12;
        if (o->json) {
            printf("%s{\"prompt\":%lld,\"prefill_tok_s\":%.2f,\"prefill_tok_s_sd\":%.2f,\"prefill_tflops\":%.2f,"
                   "\"prefill_flops\":%.0f,\"prefill_of_peak\":%.3f,\"ttft_ms\":%.2f,\"ttft_ms_sd\":%.2f,"
                   "\"decode_tok_s\":%.2f,\"decode_tok_s_sd\":%.2f,\"decode_tok_s_total\":%.2f,"
                   "\"cache_bytes_per_token\":%.0f,\"decode_roofline_tok_s\":%.2f,\"decode_of_roofline\":%.3f",
                   l ? "," : "", (long long)n_prompt, pf, stat_sd(&row->pf), pflops, flops,
                   o->peak_tflops > 0 ? pflops / o->peak_tflops : 0.0, ttft, stat_sd(&row->ttft), dc, stat_sd(&row->dc), S * dc, cbytes,
                   roof, dc / roof);
            if (o->mix)
                printf(",\"mix_chunk\":%lld,\"mix_steps\":%d,\"mix_ttft_ms\":%.2f,\"mix_decode_tok_s\":%.2f",
                       (long long)chunk, row->mix_steps, stat_mean(&row->mix_ttft), stat_mean(&row->mix_dc));
            printf("}");
            continue;
        }
        if (o->n_lens > 1) {
            printf("%8lld %13.2f ± %6.2f %14.2f %16.2f %13.2f ± %6.2f\n", (long long)n_prompt, pf, stat_sd(&row->pf),
                   pflops, ttft, dc, stat_sd(&row->dc));
            continue;
        }
        printf("model    %s (%s, %s", o->dir, m->cfg.model_type, be->ops->name);
        if (m->cfg.route_spread)
            printf(", spread routing");
        if (!gpu)
            printf(", %d threads", nth);
        if (o->reps > 1)
            printf("; mean ± standard deviation of %lld runs", (long long)o->reps);
        printf(")\nprefill  %6lld tokens  %9.2f", (long long)n_prompt, pf);
        stat_print_sd(&row->pf, o->reps);
        printf(" tok/s  %.1f TFLOP/s", pflops);
        if (o->peak_tflops > 0)
            printf(" = %.0f%% of %.0f TFLOP/s", 100 * pflops / o->peak_tflops, o->peak_tflops);
        printf("\ndecode   %6lld tokens  %9.2f", (long long)o->n_gen, dc);
        stat_print_sd(&row->dc, o->reps);
        if (S > 1)
            printf(" tok/s per sequence, %d sequences at once: %.2f tok/s in all", S, S * dc);
        else
            printf(" tok/s");
        if (n_smp > 0)
            printf(" (sampled: temperature %g, top_k %d, %s)", (double)o->sample_t, o->sample_k,
                   k_read ? "the top logits read" : "whole rows read");
        printf("\nroofline %.1f MB of weights", wbytes / 1e6);
        if (cbytes > 0)
            printf(" + %.1f MB of caches (%s KV)%s", S * cbytes / 1e6, dtype_name(o->kv_type), S > 1 ? " (all sequences)" : "");
        printf(" per step at %.2f GB/s %s = %.2f tok/s; decode reaches %.0f%%\n", bw / 1e9, gpu ? "peak" : "read",
               roof, 100 * dc / roof);
        if (o->mix)
            printf("mixed    the prompt again in %d steps of %lld tokens beside the %d decoding: first token in %.1f ms "
                   "(alone %.1f ms), decode %.2f tok/s per sequence meanwhile (alone %.2f)\n",
                   row->mix_steps, (long long)chunk, S, stat_mean(&row->mix_ttft), ttft, stat_mean(&row->mix_dc), dc);
    }
    if (o->json)
        printf("]}\n");
}

int cli_bench(int argc, char **argv)
{
    if (argc > 0 && strcmp(argv[0], "compare") == 0)
        return bench_compare(argc - 1, argv + 1);
    struct bench_opts opts, *o = &opts;
    const int st = bench_parse(argc, argv, o);
    if (st >= 0)
        return st;
    if (o->tok_dir && o->corpus)
        return bench_tokenizer(o->tok_dir, o->corpus);
    if (o->dir && o->draft) {
        if (!(o->dir = cli_model_dir(o->dir)) || !(o->draft = cli_model_dir(o->draft))) {
            fprintf(stderr, "kapitsa: %s\n", err_msg());
            return 1;
        }
        if (!o->prompt_file || o->chain_k > SPEC_MAX_NODES) {
            bench_usage(stderr);
            return 2;
        }
        return bench_spec(o->dir, o->draft, o->prompt_file, (int32_t)o->n_gen, (int32_t)o->threads, o->device, (int32_t)o->chain_k, o->tree_n, o->tree_d,
                          o->json);
    }
    if (!o->dir || o->n_seqs > BENCH_MAX_SEQS || (o->n_seqs > 1 && o->n_lens > 1) || (o->mix && (o->n_lens > 1 || (o->n_batch && o->n_batch <= o->n_seqs)))) {
        bench_usage(stderr);
        return 2;
    }
    if (!(o->dir = cli_model_dir(o->dir))) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    struct runtime rt = {0};
    struct engine e;
    float *logits = NULL;
    int32_t *tok = NULL, *pos = NULL, *seqv = NULL, *par = NULL, *mtok = NULL;
    uint8_t *want = NULL;
    int rc = 1, up = 0;
    /* --sample: a seeded sampler per sequence; k_read (below) the top logits a step reads, 0: whole rows */
    struct sampler smp[BENCH_MAX_SEQS];
    int32_t n_smp = 0;
    if (runtime_open(&rt, &(struct runtime_opts){.device = o->device, .threads = (int32_t)o->threads, .model = o->dir}) != 0)
        goto done;
    struct model *const m = &rt.m;
    struct backend *const be = rt.be;
    if (o->n_batch == 0)
        o->n_batch = be->ops->prefill_chunk > 512 ? be->ops->prefill_chunk : 512;
    for (int32_t l = 0; l < o->n_lens; l++)
        o->n_prompt = o->lens[l] > o->n_prompt ? o->lens[l] : o->n_prompt;
    const int32_t S = (int32_t)o->n_seqs;
    int32_t seqs[BENCH_MAX_SEQS], next[BENCH_MAX_SEQS], npos[BENCH_MAX_SEQS], npar[BENCH_MAX_SEQS];
    uint8_t nwant[BENCH_MAX_SEQS];
    int32_t k_read = 0, top_ids[BENCH_MAX_SEQS * TOP_K_MAX];
    float top_vals[BENCH_MAX_SEQS * TOP_K_MAX];
    if (o->sample_t > 0) {
        struct sampler_params sp = sampler_defaults();
        sp.temperature = o->sample_t;
        sp.top_k = o->sample_k;
        for (; n_smp < S; n_smp++) {
            sp.seed = 1000 + (uint64_t)n_smp;
            if (sampler_init(&smp[n_smp], &sp, m->cfg.vocab_size) != 0)
                goto done;
        }
        const int32_t need = sampler_top_need(&smp[0]);
        k_read = need <= TOP_K_MAX ? need : 0;
    }
    /* --mix: the prompt again in chunks of the batch's rest beside the S
     * decoders (a first step of each chunk size untimed, in a sequence of its own) */
    const int64_t chunk = o->n_batch - S, mix_steps = o->mix ? (o->n_prompt + chunk - 1) / chunk + 2 : 0;
    /* each sequence rounded up to whole cache blocks (16 tokens) */
    const int64_t n_ctx = S * (o->n_prompt + o->n_gen + mix_steps + 16) + (o->mix ? o->n_prompt + 2 * chunk + 32 : 0);
    if (engine_init(&e, m, (int32_t)n_ctx, S + o->mix, (int32_t)(o->n_batch > S ? o->n_batch : S), S + o->mix, 0, o->kv_type) != 0)
        goto done;
    up = 1;
    const int32_t V = m->cfg.vocab_size;
    logits = malloc((size_t)S * V * sizeof(float));
    tok = malloc((size_t)o->n_prompt * sizeof(int32_t));
    pos = malloc((size_t)o->n_batch * sizeof(int32_t));
    seqv = malloc((size_t)o->n_batch * sizeof(int32_t));
    par = malloc((size_t)o->n_batch * sizeof(int32_t));
    want = malloc((size_t)o->n_batch);
    mtok = malloc((size_t)o->n_batch * sizeof(int32_t));
    if (!logits || !tok || !pos || !seqv || !par || !want || !mtok) {
        err_set("bench: out of memory");
        goto done;
    }
    uint64_t s = 12345;
    for (int64_t i = 0; i < o->n_prompt; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    double t_prefill = 0, t_decode = 0, t_mix = 0;
    int32_t mix_n = 0, mix_ids[BENCH_MAX_SEQS + 1]; /* --mix: its timed steps, each step's next tokens */
    struct device_info di;
    be->ops->info(be, &di, o->json || o->n_lens == 1); /* a cpu's bandwidth measured where a roofline is shown */
    const bool gpu = di.gpu;
    if (o->peak_gbs == 0)
        o->peak_gbs = di.read_gbs;
    if (o->peak_tflops == 0)
        o->peak_tflops = di.bf16_tflops;
    struct bench_row rows[8];
    /* One untimed pass first: a kernel's first launch loads it, cuBLAS picks
     * its algorithms and the decode graph is captured on the first steps,
     * costs a serving engine pays once, not per request. Every batch size the
     * timed prefills run (a prompt's first chunk and its last) is run once
     * here, so that no length after the first pays them. */
    for (int32_t l = 0; l < o->n_lens; l++) {
        const int64_t first = o->lens[l] < o->n_batch ? o->lens[l] : o->n_batch, last = o->lens[l] % o->n_batch;
        const int64_t sizes[2] = {first, o->lens[l] > o->n_batch && last ? last : 0};
        for (int32_t j = 0; j < 2 && sizes[j] > 0; j++) {
            const int32_t sq = bench_prefill(&e, tok, sizes[j], (int32_t)o->n_batch, pos, seqv, par, want, logits);
            if (sq < 0)
                goto done;
            engine_seq_free(&e, sq);
        }
    }
    for (int32_t k = 0; k < S; k++) {
        const int64_t n_warm = o->lens[0] < o->n_batch ? o->lens[0] : o->n_batch;
        if ((seqs[k] = bench_prefill(&e, tok, n_warm, (int32_t)o->n_batch, pos, seqv, par, want, logits)) < 0)
            goto done;
        npos[k] = (int32_t)n_warm;
        npar[k] = -1;
        nwant[k] = 1;
        next[k] = tok[n_warm - 1];
    }
    for (int32_t g = 0; g < 2; g++) {
        struct batch b = {S, next, npos, seqs, npar, nwant};
        if (engine_forward(&e, &b, NULL, NULL) < 0 || engine_out_top(&e, 1, next, NULL) != 0 ||
            engine_commit_all(&e) != 0)
            goto done;
        for (int32_t k = 0; k < S; k++)
            npos[k]++;
    }
    for (int32_t k = 0; k < S; k++)
        engine_seq_free(&e, seqs[k]);
    profile_reset(be);
    for (int32_t l = 0; l < o->n_lens; l++)
        for (int64_t rep = 0; rep < o->reps; rep++) {
            o->n_prompt = o->lens[l];
            struct bench_row *row = &rows[l];
            if (rep == 0)
                *row = (struct bench_row){.prompt = o->n_prompt};
            double t0 = clock_now_s();
            if ((seqs[0] = bench_prefill(&e, tok, o->n_prompt, (int32_t)o->n_batch, pos, seqv, par, want, logits)) < 0)
                goto done;
            t_prefill = clock_now_s() - t0; /* the first token's logits are ready: time to first token */
            /* more sequences decoding together: each its own copy of the prompt */
            for (int32_t k = 1; k < S; k++)
                if ((seqs[k] = bench_prefill(&e, tok, o->n_prompt, (int32_t)o->n_batch, pos, seqv, par, want,
                                             logits + (size_t)k * V)) < 0)
                    goto done;
            t0 = clock_now_s();
            for (int32_t k = 0; k < S; k++)
                next[k] = sampler_argmax(logits + (size_t)k * V, V);
            /* greedy steps: the next tokens are the argmax ranked on the backend */
            for (int64_t g = 0; g < o->n_gen; g++) {
                for (int32_t k = 0; k < S; k++) {
                    npos[k] = (int32_t)(o->n_prompt + g);
                    npar[k] = -1;
                    nwant[k] = 1;
                }
                struct batch b = {S, next, npos, seqs, npar, nwant};
                if (n_smp == 0) {
                    if (engine_forward(&e, &b, NULL, NULL) < 0 || engine_out_top(&e, 1, next, NULL) != 0)
                        goto done;
                } else if (k_read > 0) {
                    if (engine_forward(&e, &b, NULL, NULL) < 0 || engine_out_top(&e, k_read, top_ids, top_vals) != 0)
                        goto done;
                    for (int32_t k = 0; k < S; k++)
                        next[k] = sampler_sample_top(&smp[k], top_ids + k * k_read, top_vals + k * k_read, k_read);
                } else {
                    if (engine_forward(&e, &b, logits, NULL) < 0)
                        goto done;
                    for (int32_t k = 0; k < S; k++)
                        next[k] = sampler_sample(&smp[k], logits + (size_t)k * V, NULL, 0);
                }
                if (engine_commit_all(&e) != 0)
                    goto done;
            }
            t_decode = clock_now_s() - t0;
            if (o->mix) {
                /* untimed first: a step of each size the timed pass takes (its
                 * first chunk, and its last where that differs), in a sequence of its own */
                for (int32_t k = 0; k < S; k++)
                    npos[k] = (int32_t)(o->n_prompt + o->n_gen);
                const int32_t first = (int32_t)(o->n_prompt < chunk ? o->n_prompt : chunk),
                              last = (int32_t)(o->n_prompt > chunk ? o->n_prompt % chunk : 0);
                int32_t q = engine_seq_new(&e);
                if (q < 0 ||
                    bench_mix_step(&e, tok, o->n_prompt, 0, first, q, S, seqs, next, npos, mtok, pos, seqv, par, want,
                                   mix_ids) < 0 ||
                    (last && bench_mix_step(&e, tok, o->n_prompt, first, last, q, S, seqs, next, npos, mtok, pos, seqv,
                                            par, want, mix_ids) < 0))
                    goto done;
                engine_seq_free(&e, q);
                if ((q = engine_seq_new(&e)) < 0)
                    goto done;
                t0 = clock_now_s();
                mix_n = 0;
                for (int64_t done = 0, r = 0; r == 0; done += chunk, mix_n++) {
                    const int32_t k = (int32_t)(o->n_prompt - done < chunk ? o->n_prompt - done : chunk);
                    if ((r = bench_mix_step(&e, tok, o->n_prompt, done, k, q, S, seqs, next, npos, mtok, pos, seqv, par,
                                            want, mix_ids)) < 0)
                        goto done;
                }
                t_mix = clock_now_s() - t0;
                engine_seq_free(&e, q);
                row->mix_steps = mix_n;
                stat_add(&row->mix_ttft, 1e3 * t_mix);
                stat_add(&row->mix_dc, mix_n / t_mix);
            }
            for (int32_t k = 0; k < S; k++)
                engine_seq_free(&e, seqs[k]);
            stat_add(&row->pf, (double)o->n_prompt / t_prefill);
            stat_add(&row->ttft, 1e3 * t_prefill);
            stat_add(&row->dc, (double)o->n_gen / t_decode);
        }
    bench_report(o, m, &e, be, rows, S, gpu, chunk, n_smp, k_read);
    rc = 0;
done:
    if (rc != 0)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    free(logits);
    free(tok);
    free(pos);
    free(seqv);
    free(par);
    free(want);
    free(mtok);
    for (int32_t k = 0; k < n_smp; k++)
        sampler_free(&smp[k]);
    if (up)
        engine_free(&e);
    runtime_close(&rt);
    return rc;
}
