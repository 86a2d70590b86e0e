/* kapitsa chat: a conversation on the terminal. Each line typed is a user turn;
 * the model's chat template renders the whole conversation and the reply
 * streams back. The sequence stays in the cache between turns, so a turn feeds
 * only what the template added (the previous reply and the new message).
 * Without --model it talks to the embedded default. */
#define _GNU_SOURCE
#include "../backend/device.h"
#include "../base/err.h"
#include "../chat/template.h"
#include "cli.h"
#include "generate.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void chat_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa chat [--model DIR] [--system TEXT] [--max-tokens N] [--temp T] [--seed S]\n"
               "                    [--ctx TOKENS] [--threads N] [--device D] " CLI_SPEC_USAGE "\n"
               "  reads one user message per line from stdin (/reset starts over, /exit or end of input ends)\n");
}

int cli_chat(int argc, char **argv)
{
    const char *dir = NULL, *system = NULL, *device = NULL, *v;
    int64_t max_tokens = 256, threads = 0, n_ctx = 8192;
    struct sampler_params sp = sampler_defaults();
    struct cli_spec so = {0};
    for (int i = 0; i < argc; i++) {
        int f;
        double d;
        if ((f = cli_spec_flag(argc, argv, &i, &so)) != 0 || (f = cli_flag(argc, argv, &i, "--model", &dir)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--system", &system)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--device", &device)) != 0) {
            if (f < 0)
                return chat_usage(stderr), 2;
        } else if (strcmp(argv[i], "--help") == 0) {
            chat_usage(stdout);
            return 0;
        } else if ((f = cli_flag(argc, argv, &i, "--temp", &v)) != 0) {
            if (f < 0 || sscanf(v, "%lf", &d) != 1 || d < 0)
                return chat_usage(stderr), 2;
            sp.temperature = (float)d;
        } else {
            int64_t *dst = NULL;
            if ((f = cli_flag(argc, argv, &i, "--max-tokens", &v)) != 0)
                dst = &max_tokens;
            else if ((f = cli_flag(argc, argv, &i, "--threads", &v)) != 0)
                dst = &threads;
            else if ((f = cli_flag(argc, argv, &i, "--ctx", &v)) != 0)
                dst = &n_ctx;
            else if ((f = cli_flag(argc, argv, &i, "--seed", &v)) != 0) {
                if (f < 0 || cli_int(v) < 0)
                    return chat_usage(stderr), 2;
                sp.seed = (uint64_t)cli_int(v);
                continue;
            }
            if (f <= 0 || (*dst = cli_int(v)) < 1 || *dst > (1 << 24))
                return chat_usage(stderr), 2;
        }
    }
    struct spec_params kp;
    const char *draft_dir = NULL;
    if (cli_spec_params(&so, &kp, &draft_dir) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 2;
    }
    if (!dir)
        dir = cli_default_model();
    if (!(dir = cli_model_dir(dir))) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    struct backend *be = device_open(device, (int32_t)threads, false);
    struct tokenizer *tok = tok_load(dir);
    struct chat_template *ct = tok ? chat_template_load(dir, NULL) : NULL;
    struct model m, dm;
    struct cli_gen g = {0};
    json_t *msgs = json_array(), *kw = json_pack("{s:b}", "enable_thinking", 0);
    char *line = NULL;
    size_t cap = 0;
    int rc = 1, loaded = 0, d_loaded = 0, up = 0;
    if (!be || !tok || !ct || model_load(&m, dir, be, NULL) != 0)
        goto done;
    loaded = 1;
    if (draft_dir && model_load(&dm, draft_dir, be, NULL) != 0)
        goto done;
    d_loaded = draft_dir != NULL;
    if (cli_gen_init(&g, &m, d_loaded ? &dm : NULL, tok, &sp, &kp, (int32_t)n_ctx) != 0)
        goto done;
    up = 1;
    char tkey[9000];
    cli_spec_key(tkey, sizeof tkey, dir, draft_dir, (int32_t)threads);
    cli_spec_tune_load(&g.k, tkey);
    if (system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    const size_t n_fixed = json_array_size(msgs);
    for (;;) {
        fputs("> ", stderr);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0)
            break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (strcmp(line, "/exit") == 0)
            break;
        if (strcmp(line, "/reset") == 0) {
            while (json_array_size(msgs) > n_fixed)
                json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        if (n == 0)
            continue;
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", line));
        size_t tlen = 0;
        char *text = chat_template_render(ct, msgs, NULL, true, kw, &tlen), *reply = NULL;
        struct tok_ids ids = {0};
        int ok = text && tok_encode(tok, text, tlen, &ids) == 0 &&
                 cli_gen_turn(&g, ids.ids, ids.n, max_tokens, stdout, &reply) == 0;
        free(text);
        tok_ids_free(&ids);
        if (!ok) {
            /* the turn is dropped, the conversation goes on */
            fprintf(stderr, "\nkapitsa: %s\n", err_msg());
            json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        putchar('\n');
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", reply));
        free(reply);
    }
    cli_spec_tune_save(&g.k, tkey);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    free(line);
    json_decref(msgs);
    json_decref(kw);
    if (up)
        cli_gen_free(&g);
    if (d_loaded)
        model_free(&dm);
    if (loaded)
        model_free(&m);
    chat_template_free(ct);
    tok_free(tok);
    if (be)
        be->ops->free(be);
    return rc;
}
