/* kapitsa serve: the HTTP API (src/server) over a model folder, the embedded
 * default when none is given. */
#include "../base/err.h"
#include "../server/server.h"
#include "cli.h"
#include "progress.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void serve_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa serve [-m|--model M] [--host ADDR] [--port N] [--api-key KEY] [--name NAME]\n"
               "                     [-c|--ctx TOKENS] [--parallel N] [-t|--threads N] [--device D] [--cors ORIGIN]\n"
               "                     [--prefill-chunk TOKENS] [--keepalive SECONDS] " CLI_KV_USAGE "\n"
               "                     " CLI_SPEC_USAGE "\n"
               "  defaults: models/kapitsa-tiny, 127.0.0.1:11435, 8192 tokens of KV cache (bf16), 4 sequences,\n"
               "  a prompt fed 4096 tokens a step on a GPU, 128 on the CPU (the other requests decode between);\n"
               "  --port 0 takes any free port and prints it; --cors lets pages from ORIGIN (https://host:port,\n"
               "  or *) call the API from a browser (off by default).\n"
               "  KAPITSA_HOST, KAPITSA_PORT and KAPITSA_CTX set --host's, --port's and --ctx's defaults.\n");
}

int cli_serve(int argc, char **argv)
{
    struct server_opts o = {.host = "127.0.0.1", .port = 11435, .n_ctx = 8192, .n_seq = 4, .kv_type = CLI_KV_DEFAULT};
    struct cli_spec so = {0};
    const char *v;
    int64_t env_port = o.port, env_ctx = o.n_ctx;
    if (cli_env_int("KAPITSA_PORT", 0, 65535, &env_port) < 0 || cli_env_int("KAPITSA_CTX", 1, 1 << 24, &env_ctx) < 0)
        return 2;
    o.port = (uint16_t)env_port;
    o.n_ctx = (int32_t)env_ctx;
    if ((v = getenv("KAPITSA_HOST")) && *v)
        o.host = v;
    for (int i = 0; i < argc; i++) {
        int f;
        int64_t n;
        if ((f = cli_spec_flag(argc, argv, &i, &so)) != 0 || (f = cli_kv_flag(argc, argv, &i, &o.kv_type)) != 0) {
            if (f < 0)
                return 2;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "--keepalive", &v)) != 0) {
            if (f < 0 || sscanf(v, "%lf", &o.keepalive_s) != 1 || !(o.keepalive_s > 0) || o.keepalive_s > 3600) {
                fprintf(stderr, "kapitsa serve: --keepalive needs seconds (> 0, at most 3600)\n");
                return 2;
            }
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "-m|--model", &o.model_dir)) ||
            (f = cli_flag(argc, argv, &i, "--host", &o.host)) ||
            (f = cli_flag(argc, argv, &i, "--api-key", &o.api_key)) ||
            (f = cli_flag(argc, argv, &i, "--name", &o.model_name)) ||
            (f = cli_flag(argc, argv, &i, "--device", &o.device)) ||
            (f = cli_flag(argc, argv, &i, "--cors", &o.cors))) {
            if (f < 0)
                return 2;
            continue;
        }
        int32_t *dst = NULL;
        int64_t lo = 1, hi = 1 << 24;
        if ((f = cli_flag(argc, argv, &i, "--port", &v)))
            lo = 0, hi = 65535; /* 0: any free port */
        else if ((f = cli_flag(argc, argv, &i, "-c|--ctx|--ctx-size", &v)))
            dst = &o.n_ctx;
        else if ((f = cli_flag(argc, argv, &i, "--parallel", &v)))
            dst = &o.n_seq, hi = 256;
        else if ((f = cli_flag(argc, argv, &i, "-t|--threads", &v)))
            dst = &o.threads, hi = 1024;
        else if ((f = cli_flag(argc, argv, &i, "--prefill-chunk", &v)))
            dst = &o.prefill_chunk, hi = 16384;
        else
            return cli_arg_reject(argv[i], serve_usage);
        if (f < 0 || (n = cli_int(v)) < lo || n > hi) {
            serve_usage(stderr);
            return 2;
        }
        if (dst)
            *dst = (int32_t)n;
        else
            o.port = (uint16_t)n;
    }
    bool bad_cors = o.cors && !*o.cors; /* one origin, as the header carries it: no list, nothing to split the header */
    for (const char *p = o.cors; p && *p; p++)
        bad_cors = bad_cors || (unsigned char)*p < 0x20 || *p == 0x7f || *p == ',' || *p == ' ';
    if (bad_cors) {
        fprintf(stderr, "kapitsa serve: --cors takes one origin (scheme://host[:port], or *)\n");
        return 2;
    }
    if (cli_spec_params(&so, &o.spec, &o.draft_dir) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 2;
    }
    if (!(o.model_dir = cli_model_dir(o.model_dir))) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    if (!o.model_name) {
        const char *s = strrchr(o.model_dir, '/');
        o.model_name = s && s[1] ? s + 1 : o.model_dir;
    }
    char tkey[9000], tpath[4096];
    cli_spec_key(tkey, sizeof tkey, o.model_dir, o.draft_dir, o.threads);
    if (cli_spec_tune_path(tpath, sizeof tpath) == 0) {
        o.tune_path = tpath;
        o.tune_key = tkey;
    }
    struct progress load = {.f = stderr};
    o.load_progress = progress_load;
    o.load_progress_ctx = &load;
    if (server_run(&o) != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    return 0;
}
