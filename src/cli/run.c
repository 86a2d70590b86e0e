/* kapitsa run: generate from a prompt (raw, or as one chat turn with --chat) and
 * stream the text to stdout. Without --model it runs the embedded default,
 * models/kapitsa-tiny (KAPITSA_MODEL overrides). */
#define _GNU_SOURCE
#include "../backend/cpu/cpu.h"
#include "../base/err.h"
#include "../chat/template.h"
#include "../engine/engine.h"
#include "../engine/sampler.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cli_default_model(void)
{
    static char path[PATH_MAX + 32];
    const char *env = getenv("KAPITSA_MODEL");
    if (env && *env)
        return env;
    if (access("models/kapitsa-tiny/config.json", R_OK) == 0)
        return "models/kapitsa-tiny";
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
        snprintf(path, sizeof path, "%s/../models/kapitsa-tiny", exe);
        return path;
    }
    return "models/kapitsa-tiny";
}

static void run_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa run [--model DIR] [--chat] [--max-tokens N] [--temp T] [--top-p P] [--top-k K]\n"
               "                   [--seed S] [--threads N] PROMPT\n"
               "  PROMPT '-' reads stdin; --chat wraps it as a user turn in the model's chat template\n");
}

static int is_eos(const struct model_config *c, int32_t t)
{
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_id[i] == t)
            return 1;
    return 0;
}

int cli_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *v;
    int chat = 0;
    int64_t max_tokens = 128, threads = 0;
    struct sampler_params sp = sampler_defaults();
    for (int i = 0; i < argc; i++) {
        int f;
        double d;
        if (strcmp(argv[i], "--chat") == 0) {
            chat = 1;
        } else if (strcmp(argv[i], "--help") == 0) {
            run_usage(stdout);
            return 0;
        } else if ((f = cli_flag(argc, argv, &i, "--model", &dir)) != 0) {
            if (f < 0)
                return 2;
        } else if ((f = cli_flag(argc, argv, &i, "--max-tokens", &v)) != 0) {
            if (f < 0 || (max_tokens = cli_int(v)) < 1)
                return run_usage(stderr), 2;
        } else if ((f = cli_flag(argc, argv, &i, "--threads", &v)) != 0) {
            if (f < 0 || (threads = cli_int(v)) < 1)
                return run_usage(stderr), 2;
        } else if ((f = cli_flag(argc, argv, &i, "--seed", &v)) != 0) {
            if (f < 0 || cli_int(v) < 0)
                return run_usage(stderr), 2;
            sp.seed = (uint64_t)cli_int(v);
        } else if ((f = cli_flag(argc, argv, &i, "--top-k", &v)) != 0) {
            if (f < 0 || cli_int(v) < 0)
                return run_usage(stderr), 2;
            sp.top_k = (int32_t)cli_int(v);
        } else if ((f = cli_flag(argc, argv, &i, "--temp", &v)) != 0 || (f = cli_flag(argc, argv, &i, "--top-p", &v)) != 0) {
            if (f < 0 || sscanf(v, "%lf", &d) != 1)
                return run_usage(stderr), 2;
            if (strcmp(argv[i - 1], "--temp") == 0)
                sp.temperature = (float)d;
            else
                sp.top_p = (float)d;
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
    if (!dir)
        dir = cli_default_model();
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
    struct backend *be = cpu_backend_init((int32_t)threads, NULL);
    struct tokenizer *tok = tok_load(dir);
    struct chat_template *ct = chat && tok ? chat_template_load(dir, NULL) : NULL;
    struct model m;
    struct engine e;
    struct sampler s = {0};
    struct tok_ids ids = {0};
    char *text = NULL;
    float *logits = NULL;
    int rc = 1, loaded = 0, up = 0;
    if (!be || !tok || (chat && !ct) || model_load(&m, dir, be, NULL) != 0)
        goto done;
    loaded = 1;
    size_t tlen = strlen(prompt);
    if (chat) {
        json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", prompt);
        json_t *kw = json_pack("{s:b}", "enable_thinking", 0);
        text = chat_template_render(ct, msgs, NULL, true, kw, &tlen);
        json_decref(msgs);
        json_decref(kw);
        if (!text)
            goto done;
    }
    if (tok_encode(tok, text ? text : prompt, tlen, &ids) != 0)
        goto done;
    if (ids.n == 0) {
        err_set("run: the prompt is empty");
        goto done;
    }
    if (engine_init(&e, &m, ids.n + (int32_t)max_tokens + 1, 1, 256, 0) != 0)
        goto done;
    up = 1;
    if (sampler_init(&s, &sp, m.cfg.vocab_size) != 0)
        goto done;
    int32_t cap = ids.n + (int32_t)max_tokens + 1;
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)cap), pos[256], sq[256], par[256];
    uint8_t want[256];
    logits = malloc(sizeof(float) * (size_t)m.cfg.vocab_size);
    if (!hist || !logits) {
        free(hist);
        err_set("run: out of memory");
        goto done;
    }
    memcpy(hist, ids.ids, sizeof(int32_t) * (size_t)ids.n);
    int32_t seq = engine_seq_new(&e), n_hist = ids.n;
    for (int32_t done = 0; done < ids.n;) {
        int32_t n = ids.n - done < 256 ? ids.n - done : 256;
        for (int32_t i = 0; i < n; i++) {
            pos[i] = done + i;
            sq[i] = seq;
            par[i] = i - 1;
            want[i] = done + i == ids.n - 1;
        }
        struct batch b = {n, ids.ids + done, pos, sq, par, want};
        if (engine_forward(&e, &b, logits, NULL) < 0 || engine_commit_all(&e) != 0) {
            free(hist);
            goto done;
        }
        done += n;
    }
    struct tok_stream ts = {0};
    char out[4096];
    for (int64_t g = 0; g < max_tokens; g++) {
        int32_t t = sampler_sample(&s, logits, hist, n_hist);
        if (is_eos(&m.cfg, t))
            break;
        hist[n_hist++] = t;
        int32_t k = tok_stream_push(tok, &ts, t, true, out, sizeof out);
        if (k > 0) {
            fwrite(out, 1, (size_t)k, stdout);
            fflush(stdout);
        }
        int32_t p = n_hist - 1, par1 = -1;
        uint8_t one = 1;
        struct batch b = {1, &t, &p, &seq, &par1, &one};
        if (engine_forward(&e, &b, logits, NULL) < 0 || engine_commit_all(&e) != 0) {
            free(hist);
            goto done;
        }
    }
    int32_t k = tok_stream_flush(&ts, out, sizeof out);
    fwrite(out, 1, (size_t)k, stdout);
    putchar('\n');
    free(hist);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    sampler_free(&s);
    free(logits);
    free(text);
    free(owned);
    tok_ids_free(&ids);
    if (up)
        engine_free(&e);
    if (loaded)
        model_free(&m);
    chat_template_free(ct);
    tok_free(tok);
    if (be)
        be->ops->free(be);
    return rc;
}
