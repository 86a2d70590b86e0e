/* kapitsa chat: a conversation on the terminal. Each line typed is a user turn;
 * the model's chat template renders the whole conversation and the reply
 * streams back. The sequence stays in the cache between turns, so a turn feeds
 * only what the template added (the previous reply and the new message).
 * Lines starting with '/' are commands (/help). Ctrl-C stops a reply and
 * keeps what came of it; a conversation past the context loses its oldest
 * turns. Without --model it talks to the embedded default. */
#define _GNU_SOURCE
#include "../base/err.h"
#include "../chat/template.h"
#include "cli.h"
#include "generate.h"

#include <editline/readline.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
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
               "  /help lists the commands (/reset, /stats, /think, /bye); Ctrl-C stops a reply, Ctrl-D quits.\n"
               "  --think lets the model reason first (shown dimmed on a terminal). Sampling: the model's\n"
               "  generation_config.json where it names any (Qwen3: temperature 0.6, top_p 0.95, top_k 20),\n"
               "  else greedy; --temperature overrides (0: greedy). KAPITSA_CTX sets --ctx's default (8192).\n");
}

static const char chat_help[] = "  /help           this list\n"
                                "  /reset          start the conversation over (the system message stays)\n"
                                "  /stats          the last reply's tokens and rates\n"
                                "  /think [on|off] let the model reason before it answers (toggles without a word)\n"
                                "  /bye, /exit     quit (so does Ctrl-D)\n"
                                "  Ctrl-C stops a reply and keeps what it said; \"\"\" starts and ends a message of\n"
                                "  several lines, as does a line ending in \\.\n";

/* Set by SIGINT (Ctrl-C): stops the reply being generated; at the prompt it
 * only interrupts the read, which says how to quit. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
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
    for (;;) {
        errno = 0;
        if (in->tty) {
            free(in->line);
            in->line = readline(prompt);
            if (in->line || !interrupted)
                return in->line;
        } else {
            fputs(prompt, stderr);
            ssize_t n = getline(&in->line, &in->cap, stdin);
            if (n >= 0) {
                while (n > 0 && (in->line[n - 1] == '\n' || in->line[n - 1] == '\r'))
                    in->line[--n] = 0;
                return in->line;
            }
            if (errno != EINTR)
                return NULL;
            clearerr(stdin);
        }
        interrupted = 0;
        fputs("\n(Ctrl-D or /bye quits)\n", stderr);
    }
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

/* The prompt of the conversation so far into *ids, leaving room for max_tokens
 * in a context of ctx tokens: while it does not fit, the oldest turn (a user
 * message and the replies after it; the system message stays) is dropped, and
 * a note says so. A message that does not fit alone is cli_gen_turn's to
 * refuse. -1 with err_set(). */
static int chat_prompt(const struct runtime *cm, json_t *msgs, size_t n_fixed, json_t *kw, int32_t ctx,
                       int64_t max_tokens, struct tok_ids *ids)
{
    int dropped = 0;
    for (;;) {
        size_t tlen = 0;
        char *text = chat_template_render(cm->ct, msgs, NULL, true, kw, &tlen);
        if (!text)
            return -1;
        const int rc = tok_encode(cm->tok, text, tlen, ids);
        free(text);
        if (rc != 0)
            return -1;
        if ((int64_t)ids->n + max_tokens + 1 <= ctx || json_array_size(msgs) <= n_fixed + 1)
            break;
        tok_ids_free(ids);
        do
            json_array_remove(msgs, n_fixed);
        while (json_array_size(msgs) > n_fixed + 1 &&
               strcmp(json_string_value(json_object_get(json_array_get(msgs, n_fixed), "role")), "user") != 0);
        dropped++;
    }
    if (dropped)
        fprintf(stderr, "kapitsa: the conversation is past the context of %d tokens (-c): its %d oldest turn%s dropped\n",
                ctx, dropped, dropped > 1 ? "s were" : " was");
    return 0;
}

/* A line starting with '/': 1 when it asks to quit, else 0 once done. */
static int chat_command(const char *line, struct cli_gen *g, json_t *msgs, size_t n_fixed, json_t *kw)
{
    char word[16] = "", arg[16] = "";
    sscanf(line, "%15s %15s", word, arg);
    if (strcmp(word, "/bye") == 0 || strcmp(word, "/exit") == 0)
        return 1;
    if (strcmp(word, "/help") == 0 || strcmp(word, "/?") == 0) {
        fputs(chat_help, stderr);
    } else if (strcmp(word, "/reset") == 0) {
        while (json_array_size(msgs) > n_fixed)
            json_array_remove(msgs, json_array_size(msgs) - 1);
        fputs("(a new conversation)\n", stderr);
    } else if (strcmp(word, "/stats") == 0) {
        if (g->last.n_prompt > 0)
            cli_gen_stats_print(g, -1, stderr);
        else
            fputs("no reply yet\n", stderr);
    } else if (strcmp(word, "/think") == 0) {
        bool on = !json_is_true(json_object_get(kw, "enable_thinking"));
        if (strcmp(arg, "on") == 0 || strcmp(arg, "off") == 0)
            on = strcmp(arg, "on") == 0;
        else if (arg[0])
            return fprintf(stderr, "/think takes on or off, not '%s'\n", arg), 0;
        json_object_set_new(kw, "enable_thinking", json_boolean(on));
        fprintf(stderr, "thinking %s\n", on ? "on" : "off");
    } else {
        fprintf(stderr, "unknown command '%s' (/help lists them)\n", word);
    }
    return 0;
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
    /* SIGINT is the chat's own once it is loaded: the engine's threads, made
     * while it is blocked, never take it, so it interrupts the reading thread */
    sigset_t sigint, old_mask;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigint, &old_mask);
    struct sigaction old_act, act = {.sa_handler = on_sigint};
    sigemptyset(&act.sa_mask);
    const struct runtime_opts ro = {.device = device, .threads = (int32_t)threads, .model = dir, .draft = draft_dir,
                                    .tokenizer = true, .chat_template = true};
    if (runtime_open(&cm, &ro) != 0)
        goto done;
    if (!temp_set && cm.m.cfg.gen_given)
        sampler_params_from_config(&sp, &cm.m.cfg);
    if (cli_gen_init(&g, &cm.m, cm.d_loaded ? &cm.dm : NULL, cm.tok, &sp, &kp, (int32_t)n_ctx, kv_type) != 0)
        goto done;
    up = 1;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL); /* a Ctrl-C while loading ended it, as it should */
    sigaction(SIGINT, &act, &old_act);
    g.dim_reasoning = isatty(1) != 0;
    char tkey[9000], tpath[4096];
    cli_spec_key(tkey, sizeof tkey, dir, draft_dir, (int32_t)threads);
    if (cli_spec_tune_path(tpath, sizeof tpath) == 0)
        sched_spec_persist(g.s, tpath, tkey);
    if (system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    const size_t n_fixed = json_array_size(msgs);
    const char *name = strrchr(dir, '/');
    fprintf(stderr, "kapitsa chat with %s, %lld tokens of context. /help lists the commands; /bye or Ctrl-D quits, "
                    "Ctrl-C stops a reply.\n",
            name && name[1] ? name + 1 : dir, (long long)n_ctx);
    for (;;) {
        free(line);
        if (!(line = read_message(&in)))
            break;
        if (line[0] == '/') {
            if (chat_command(line, &g, msgs, n_fixed, kw))
                break;
            continue;
        }
        if (!line[0])
            continue;
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", line));
        struct tok_ids ids = {0};
        char *reply = NULL;
        interrupted = 0;
        int got = chat_prompt(&cm, msgs, n_fixed, kw, g.ctx, max_tokens, &ids);
        if (got == 0)
            got = cli_gen_turn(&g, ids.ids, ids.n, max_tokens, stdout, &reply, &interrupted);
        tok_ids_free(&ids);
        if (got < 0) {
            /* the turn is dropped, the conversation goes on */
            fprintf(stderr, "\nkapitsa: %s\n", err_msg());
            json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        putchar('\n');
        fflush(stdout);
        if (got == 1)
            fprintf(stderr, "(stopped after %d tokens)\n", g.last.n_gen);
        if (got == 1 && !reply[0]) /* nothing was said: the message goes too */
            json_array_remove(msgs, json_array_size(msgs) - 1);
        else
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", reply));
        free(reply);
    }
    if (in.tty && in.hist[0])
        write_history(in.hist);
    rc = 0;
done:
    if (up)
        sigaction(SIGINT, &old_act, NULL);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
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
