/* kapitsa check DIR: validates a checkpoint against its reference (src/engine/check.h). */
#include "../base/err.h"
#include "../engine/check.h"
#include "../runtime/runtime.h"
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void check_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa check DIR [--golden FILE] [--threads N] [--chunks A,B,...] [--tol X] [--rope-f32]\n"
               "                    [--kv-type f32|bf16]\n"
               "  compares DIR's prefill logits, per-layer hidden states and greedy ids with\n"
               "  DIR/golden.safetensors; exits 1 on a mismatch (max |dlogit| > tol, default 2e-4).\n"
               "  The reference fixtures were made by transformers after model.to(dtype), which\n"
               "  rounds the rotary inv_freq buffer to the weights' dtype; check does the same\n"
               "  unless --rope-f32. --kv-type bf16 shows what a bf16 KV cache moves (the default\n"
               "  tolerance assumes f32).\n");
}

static int parse_chunks(const char *s, struct check_opts *o)
{
    o->n_chunks = 0;
    while (*s) {
        char buf[32];
        size_t n = strcspn(s, ",");
        if (n == 0 || n >= sizeof buf || o->n_chunks == CHECK_MAX_CHUNKS)
            return -1;
        memcpy(buf, s, n);
        buf[n] = 0;
        int64_t v = cli_int(buf);
        if (v < 1 || v > 65536)
            return -1;
        o->chunk[o->n_chunks++] = (int32_t)v;
        s += n + (s[n] == ',');
    }
    return o->n_chunks ? 0 : -1;
}

int cli_check(int argc, char **argv)
{
    struct check_opts o = {0};
    const char *dir = NULL, *v;
    int64_t threads = 0;
    const char *device = NULL;
    bool fast = false;
    double tol = 2e-4;
    for (int i = 0; i < argc; i++) {
        int f;
        enum cli_arg a;
        if (cli_switch(argv[i], "--rope-f32")) {
            o.rope_freq_f32 = true;
            continue;
        }
        if (cli_switch(argv[i], "--fast")) {
            fast = true;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--device", &device)) != 0 || (f = cli_kv_flag(argc, argv, &i, &o.kv_type)) != 0) {
            if (f < 0)
                return 2;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--golden", &v)) != 0) {
            if (f < 0)
                return 2;
            o.golden = v;
        } else if ((f = cli_flag(argc, argv, &i, "-t|--threads", &v)) != 0) {
            if (f < 0 || (threads = cli_int(v)) < 1) {
                fprintf(stderr, "kapitsa check: --threads needs a positive integer\n");
                return 2;
            }
        } else if ((f = cli_flag(argc, argv, &i, "--chunks", &v)) != 0) {
            if (f < 0 || parse_chunks(v, &o) != 0) {
                fprintf(stderr, "kapitsa check: --chunks needs sizes like 37,1,100\n");
                return 2;
            }
        } else if ((f = cli_flag(argc, argv, &i, "--tol", &v)) != 0) {
            if (f < 0 || sscanf(v, "%lf", &tol) != 1 || !(tol > 0)) {
                fprintf(stderr, "kapitsa check: --tol needs a positive number\n");
                return 2;
            }
        } else if ((a = cli_arg(argv[i])) != CLI_ARG_POSITIONAL) {
            return cli_arg_exit(a, check_usage);
        } else if (dir) {
            check_usage(stderr);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir) {
        check_usage(stderr);
        return 2;
    }
    if (!(dir = cli_model_dir(dir))) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    struct runtime rt;
    if (runtime_open(&rt, &(struct runtime_opts){.device = device, .threads = (int32_t)threads, .precise = !fast}) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        runtime_close(&rt);
        return 1;
    }
    struct check_result r;
    int rc = check_run(dir, rt.be, &o, &r);
    runtime_close(&rt);
    if (rc != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    int ok_logits = r.max_logit_err <= tol, ok_greedy = r.greedy_match == r.n_greedy;
    printf("prefill: %d tokens%s, max |dlogit| = %.3g (tolerance %.3g) %s\n", r.n_prefill,
           o.n_chunks ? " in chunks" : "", r.max_logit_err, tol, ok_logits ? "ok" : "MISMATCH");
    for (int32_t l = 0; r.has_hidden && l <= r.n_layer; l++)
        printf("  hidden.%-3d max |d| = %.3g%s\n", l, r.hidden_err[l],
               l == 0 ? " (embeddings)" : l == r.n_layer ? " (after final norm)" : "");
    if (ok_greedy)
        printf("greedy: %d/%d ids identical ok\n", r.greedy_match, r.n_greedy);
    else
        printf("greedy: MISMATCH at step %d: got %d, reference %d (%d/%d matched before)\n", r.greedy_first_bad,
               r.greedy_got, r.greedy_want, r.greedy_match, r.n_greedy);
    return ok_logits && ok_greedy ? 0 : 1;
}
