/* kapitsa run: generate from a prompt (raw, or as one chat turn with --chat) and
 * stream the text to stdout. Without --model it runs the embedded default,
 * models/kapitsa-tiny (KAPITSA_MODEL overrides). */
#define _GNU_SOURCE
#include "../base/clock.h"
#include "../base/err.h"
#include "../chat/template.h"
#include "../engine/engine.h"
#include "../engine/sampler.h"
#include "../engine/spec.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa run [-m|--model M] [--chat] [-n|--max-tokens N] [--temp|--temperature T] [--top-p P]\n"
               "                   [--top-k K] [-s|--seed S] [-t|--threads N] [--device D] " CLI_KV_USAGE "\n"
               "                   " CLI_SPEC_USAGE " [--verbose] PROMPT | -p|--prompt PROMPT\n"
               "  M: a folder, catalog name, hub id or GGUF (default: the embedded models/kapitsa-tiny).\n"
               "  PROMPT '-' reads stdin; --chat wraps it as a user turn in the model's chat template.\n"
               "  With --draft, KFlash speculative decoding (same output as without); --spec lookup\n"
               "  drafts from the prompt itself, without a draft model.\n"
               "  --verbose: the load time, the prompt's and the reply's tokens and rates on stderr.\n");
}

int cli_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *device = NULL, *v;
    int chat = 0, verbose = 0;
    int64_t max_tokens = 128, threads = 0;
    enum dtype kv_type = CLI_KV_DEFAULT;
    struct sampler_params sp = sampler_defaults();
    struct cli_spec so = {0};
    for (int i = 0; i < argc; i++) {
        int f;
        double d;
        enum cli_arg a;
        if ((f = cli_spec_flag(argc, argv, &i, &so)) != 0 || (f = cli_kv_flag(argc, argv, &i, &kv_type)) != 0) {
            if (f < 0)
                return run_usage(stderr), 2;
        } else if (cli_switch(argv[i], "--chat")) {
            chat = 1;
        } else if (cli_switch(argv[i], "--verbose")) {
            verbose = 1;
        } else if ((f = cli_flag(argc, argv, &i, "-m|--model", &dir)) != 0 ||
                   (f = cli_flag(argc, argv, &i, "--device", &device)) != 0) {
            if (f < 0)
                return 2;
        } else if ((f = cli_flag(argc, argv, &i, "-p|--prompt", &v)) != 0) {
            if (f < 0 || prompt)
                return run_usage(stderr), 2;
            prompt = v;
        } else if ((f = cli_flag(argc, argv, &i, "-n|--max-tokens", &v)) != 0) {
            if (f < 0 || (max_tokens = cli_int(v)) < 1)
                return run_usage(stderr), 2;
        } else if ((f = cli_flag(argc, argv, &i, "-t|--threads", &v)) != 0) {
            if (f < 0 || (threads = cli_int(v)) < 1)
                return run_usage(stderr), 2;
        } else if ((f = cli_flag(argc, argv, &i, "-s|--seed", &v)) != 0) {
            if (f < 0 || cli_int(v) < 0)
                return run_usage(stderr), 2;
            sp.seed = (uint64_t)cli_int(v);
        } else if ((f = cli_flag(argc, argv, &i, "--top-k", &v)) != 0) {
            if (f < 0 || cli_int(v) < 0)
                return run_usage(stderr), 2;
            sp.top_k = (int32_t)cli_int(v);
        } else if ((f = cli_flag(argc, argv, &i, "--temp|--temperature", &v)) != 0) {
            if (f < 0 || sscanf(v, "%lf", &d) != 1)
                return run_usage(stderr), 2;
            sp.temperature = (float)d;
        } else if ((f = cli_flag(argc, argv, &i, "--top-p", &v)) != 0) {
            if (f < 0 || sscanf(v, "%lf", &d) != 1)
                return run_usage(stderr), 2;
            sp.top_p = (float)d;
        } else if ((a = cli_arg(argv[i])) != CLI_ARG_POSITIONAL) {
            return cli_arg_exit(a, run_usage);
        } else if (!prompt) {
            prompt = argv[i];
        } else {
            run_usage(stderr);
            return 2;
        }
    }
    if (!prompt) {
        run_usage(stderr);
        return 2;
    }
    if (!(dir = cli_model_dir(dir))) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    char *owned = NULL;
    if (strcmp(prompt, "-") == 0) {
        size_t cap = 1 << 16, n = 0;
        owned = malloc(cap);
        while (owned && (n += fread(owned + n, 1, cap - n - 1, stdin)) == cap - 1)
            owned = realloc(owned, cap *= 2);
        if (!owned)
            return 1;
        owned[n] = 0;
        prompt = owned;
    }
    struct spec_params kp;
    const char *draft_dir = NULL;
    if (cli_spec_params(&so, &kp, &draft_dir) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        free(owned);
        return 2;
    }
    struct runtime cm;
    struct cli_gen g = {0};
    struct tok_ids ids = {0};
    char *text = NULL;
    int rc = 1, up = 0;
    const struct runtime_opts ro = {.device = device, .threads = (int32_t)threads, .model = dir, .draft = draft_dir,
                                    .tokenizer = true, .chat_template = chat};
    const double t_load = clock_now_s();
    if (runtime_open(&cm, &ro) != 0)
        goto done;
    const double load_s = clock_now_s() - t_load;
    size_t tlen = strlen(prompt);
    if (chat) {
        json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", prompt);
        json_t *kw = json_pack("{s:b}", "enable_thinking", 0);
        text = chat_template_render(cm.ct, msgs, NULL, true, kw, &tlen);
        json_decref(msgs);
        json_decref(kw);
        if (!text)
            goto done;
    }
    if (tok_encode(cm.tok, text ? text : prompt, tlen, &ids) != 0)
        goto done;
    if (ids.n == 0) {
        err_set("run: the prompt is empty");
        goto done;
    }
    if (cli_gen_init(&g, &cm.m, cm.d_loaded ? &cm.dm : NULL, cm.tok, &sp, &kp, ids.n + (int32_t)max_tokens + 1,
                     kv_type) != 0)
        goto done;
    up = 1;
    char tkey[9000], tpath[4096];
    cli_spec_key(tkey, sizeof tkey, dir, draft_dir, (int32_t)threads);
    if (cli_spec_tune_path(tpath, sizeof tpath) == 0 && sched_spec_persist(g.s, tpath, tkey) > 0)
        fprintf(stderr, "kapitsa: KFlash: the tuner goes on from what it learnt before on this machine, model pair "
                        "and device (%s)\n", tpath);
    if (cli_gen_turn(&g, ids.ids, ids.n, max_tokens, stdout, NULL, NULL) != 0)
        goto done;
    putchar('\n');
    if (verbose) {
        fflush(stdout);
        cli_gen_stats_print(&g, load_s, stderr);
    }
    if (kp.mode != SPEC_OFF && g.spec_steps > 0)
        fprintf(stderr, "kapitsa: KFlash: %lld tokens in %lld target passes (%.2f per pass)\n",
                (long long)g.spec_tokens, (long long)g.spec_steps, (double)g.spec_tokens / (double)g.spec_steps);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    if (up)
        cli_gen_free(&g);
    free(text);
    free(owned);
    tok_ids_free(&ids);
    runtime_close(&cm);
    return rc;
}
