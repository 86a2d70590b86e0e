/* kapitsa chat: a conversation on the terminal. Each line typed is a user turn;
 * the model's chat template renders the whole conversation and the reply
 * streams back. The sequence stays in the cache between turns, so a turn feeds
 * only what the template added (the previous reply and the new message).
 * Without --model it talks to the embedded default. */
#define _GNU_SOURCE
#include "../base/err.h"
#include "../chat/template.h"
#include "cli.h"
#include "generate.h"

#include <editline/readline.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void chat_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa chat [-m|--model M] [--system TEXT] [-n|--max-tokens N] [--temp|--temperature T]\n"
               "                    [-s|--seed S] [-c|--ctx TOKENS] [-t|--threads N] [--device D] " CLI_SPEC_USAGE "\n"
               "                    [--think] " CLI_KV_USAGE "\n"
               "  one user message per line (a line ending in \\ continues it; so do lines between two\n"
               "  lines of \"\"\"); on a terminal with line editing and history (~/.cache/kapitsa/chat_history).\n"
               "  /reset starts over, /stats shows the last turn's numbers, /exit or end of input ends.\n"
               "  --think lets the model reason first (shown dimmed on a terminal). Sampling: the model's\n"
               "  generation_config.json where it names any (Qwen3: temperature 0.6, top_p 0.95, top_k 20),\n"
               "  else greedy; --temperature overrides (0: greedy). KAPITSA_CTX sets --ctx's default (8192).\n");
}

/* Input lines: readline (libedit) on a terminal, with history; getline otherwise. */
struct input {
    bool tty;
    char hist[4096];
    char *line;
    size_t cap;
};

static char *input_line(struct input *in, const char *prompt)
{
    if (in->tty) {
        free(in->line);
        in->line = readline(prompt);
        return in->line;
    }
    fputs(prompt, stderr);
    ssize_t n = getline(&in->line, &in->cap, stdin);
    if (n < 0)
        return NULL;
    while (n > 0 && (in->line[n - 1] == '\n' || in->line[n - 1] == '\r'))
        in->line[--n] = 0;
    return in->line;
}

/* One message: a line, lines joined while they end in a backslash, or the
 * lines between two lines of three double quotes. NULL at the end of input. */
static char *read_message(struct input *in)
{
    char *l = input_line(in, "> ");
    if (!l)
        return NULL;
    const bool block = strcmp(l, "\"\"\"") == 0;
    char *msg = strdup(block ? "" : l);
    size_t len = strlen(msg);
    while (msg && (block || (len && msg[len - 1] == '\\'))) {
        if (!block)
            msg[len - 1] = '\n'; /* the backslash becomes the line break */
        if (!(l = input_line(in, ". ")) || (block && strcmp(l, "\"\"\"") == 0))
            break;
        char *m2 = realloc(msg, len + strlen(l) + 2);
        if (!m2)
            break;
        msg = m2;
        len += (size_t)sprintf(msg + len, block && len ? "\n%s" : "%s", l);
    }
    if (in->tty && msg && *msg)
        add_history(msg);
    return msg;
}

int cli_chat(int argc, char **argv)
{
    const char *dir = NULL, *system = NULL, *device = NULL, *v;
    int think = 0;
    bool temp_set = false;
    int64_t max_tokens = 256, threads = 0, n_ctx = 8192;
    enum dtype kv_type = CLI_KV_DEFAULT;
    struct sampler_params sp = sampler_defaults();
    struct cli_spec so = {0};
    if (cli_env_int("KAPITSA_CTX", 1, 1 << 24, &n_ctx) < 0)
        return 2;
    for (int i = 0; i < argc; i++) {
        int f;
        double d;
        if ((f = cli_spec_flag(argc, argv, &i, &so)) != 0 || (f = cli_kv_flag(argc, argv, &i, &kv_type)) != 0 ||
            (f = cli_flag(argc, argv, &i, "-m|--model", &dir)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--system", &system)) != 0 ||
            (f = cli_flag(argc, argv, &i, "--device", &device)) != 0) {
            if (f < 0)
                return chat_usage(stderr), 2;
        } else if (cli_switch(argv[i], "--think")) {
            think = 1;
        } else if ((f = cli_flag(argc, argv, &i, "--temp|--temperature", &v)) != 0) {
            if (f < 0 || sscanf(v, "%lf", &d) != 1 || d < 0)
                return chat_usage(stderr), 2;
            sp.temperature = (float)d;
            temp_set = true;
        } else {
            int64_t *dst = NULL;
            if ((f = cli_flag(argc, argv, &i, "-n|--max-tokens", &v)) != 0)
                dst = &max_tokens;
            else if ((f = cli_flag(argc, argv, &i, "-t|--threads", &v)) != 0)
                dst = &threads;
            else if ((f = cli_flag(argc, argv, &i, "-c|--ctx|--ctx-size", &v)) != 0)
                dst = &n_ctx;
            else if ((f = cli_flag(argc, argv, &i, "-s|--seed", &v)) != 0) {
                if (f < 0 || cli_int(v) < 0)
                    return chat_usage(stderr), 2;
                sp.seed = (uint64_t)cli_int(v);
                continue;
            } else {
                return cli_arg_reject(argv[i], chat_usage);
            }
            if (f < 0 || (*dst = cli_int(v)) < 1 || *dst > (1 << 24))
                return chat_usage(stderr), 2;
        }
    }
    struct spec_params kp;
    const char *draft_dir = NULL;
    if (cli_spec_params(&so, &kp, &draft_dir) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 2;
    }
    if (!(dir = cli_model_dir(dir))) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    struct runtime cm;
    struct cli_gen g = {0};
    json_t *msgs = json_array(), *kw = json_pack("{s:b}", "enable_thinking", think);
    char *line = NULL;
    struct input in = {.tty = isatty(0) && isatty(2)};
    if (in.tty) {
        const char *c = getenv("KAPITSA_CACHE"), *home = getenv("HOME");
        if (c && *c)
            snprintf(in.hist, sizeof in.hist, "%s/chat_history", c);
        else if (home && *home)
            snprintf(in.hist, sizeof in.hist, "%s/.cache/kapitsa/chat_history", home);
        if (in.hist[0]) {
            char d[4096];
            snprintf(d, sizeof d, "%s", in.hist);
            *strrchr(d, '/') = 0;
            mkdir(d, 0755);
            read_history(in.hist);
        }
    }
    int rc = 1, up = 0;
    const struct runtime_opts ro = {.device = device, .threads = (int32_t)threads, .model = dir, .draft = draft_dir,
                                    .tokenizer = true, .chat_template = true};
    if (runtime_open(&cm, &ro) != 0)
        goto done;
    if (!temp_set && cm.m.cfg.gen_given)
        sampler_params_from_config(&sp, &cm.m.cfg);
    if (cli_gen_init(&g, &cm.m, cm.d_loaded ? &cm.dm : NULL, cm.tok, &sp, &kp, (int32_t)n_ctx, kv_type) != 0)
        goto done;
    up = 1;
    g.dim_reasoning = isatty(1) != 0;
    char tkey[9000], tpath[4096];
    cli_spec_key(tkey, sizeof tkey, dir, draft_dir, (int32_t)threads);
    if (cli_spec_tune_path(tpath, sizeof tpath) == 0)
        sched_spec_persist(g.s, tpath, tkey);
    if (system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    const size_t n_fixed = json_array_size(msgs);
    for (;;) {
        free(line);
        if (!(line = read_message(&in)))
            break;
        const size_t n = strlen(line);
        if (strcmp(line, "/exit") == 0)
            break;
        if (strcmp(line, "/stats") == 0) {
            const struct cli_gen_stats *st = &g.last;
            fprintf(stderr, "last turn: %d prompt tokens (%d reused from the cache), %d generated; prefill %.3f s, "
                            "decode %.3f s (%.1f tok/s)",
                    st->n_prompt, st->n_cached, st->n_gen, st->t_prefill, st->t_decode,
                    st->t_decode > 0 ? st->n_gen / st->t_decode : 0.0);
            if (st->spec_steps > 0 && g.spec_on)
                fprintf(stderr, "; KFlash %.2f tokens per target pass", (double)st->spec_tokens / st->spec_steps);
            fputc('\n', stderr);
            continue;
        }
        if (strcmp(line, "/reset") == 0) {
            while (json_array_size(msgs) > n_fixed)
                json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        if (n == 0)
            continue;
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", line));
        size_t tlen = 0;
        char *text = chat_template_render(cm.ct, msgs, NULL, true, kw, &tlen), *reply = NULL;
        struct tok_ids ids = {0};
        int ok = text && tok_encode(cm.tok, text, tlen, &ids) == 0 &&
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
    if (in.tty && in.hist[0])
        write_history(in.hist);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    free(line);
    if (!in.tty)
        free(in.line);
    json_decref(msgs);
    json_decref(kw);
    if (up)
        cli_gen_free(&g);
    runtime_close(&cm);
    return rc;
}
