/* kapitsa: command-line entry point; dispatches to the subcommands in src/cli. */
#include "cli.h"

#include "../base/path.h"
#include "../hub/cache.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: kapitsa COMMAND [options]\n\n"
               "commands:\n"
               "  serve         the OpenAI/Anthropic-compatible HTTP API (default model: models/kapitsa-tiny)\n"
               "  launch AGENT  run a coding agent (claude) against the local server\n"
               "  run PROMPT    generate text (default model: models/kapitsa-tiny)\n"
               "  pull MODEL    download a model (catalog name or ORG/NAME) into the Hugging Face cache\n"
               "  list          the model catalog and what is downloaded; rm MODEL removes one\n"
               "  doctor        this machine: CPU, memory, GPUs, disk, which models fit, agent CLIs\n"
               "  check DIR     compare a checkpoint with its reference logits (DIR/golden.safetensors)\n"
               "  synth         write a random-weight checkpoint with the shapes of a real model\n"
               "  quantize      write a checkpoint or GGUF as a GGUF file by a recipe (Q4_K_M, Q8_0, Q2_MOE, ...)\n"
               "  imatrix       a model's importance matrix over a text, for quantize --imatrix (llama.cpp's format)\n"
               "  bench         measure prefill and decode speed of a checkpoint\n"
               "  chat          a conversation on the terminal (one user message per line)\n"
               "  eval          held-out loss of a model, and a draft's agreement with it, over token ids\n"
               "  tokenize      text to token ids (--model DIR with tokenizer.json)\n"
               "  detokenize    token ids to text\n"
               "  render        an OpenAI chat request (stdin) to the exact prompt of the model's template\n"
               "  help          this text\n\n"
               "'kapitsa COMMAND --help' describes a command's options.\n");
}

int cli_flag(int argc, char **argv, int *i, const char *name, const char **val)
{
    if (strcmp(argv[*i], name) != 0)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kapitsa: %s needs a value\n", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int cli_kv_flag(int argc, char **argv, int *i, enum dtype *type)
{
    const char *v;
    const int f = cli_flag(argc, argv, i, "--kv-type", &v);
    if (f <= 0)
        return f;
    if (strcmp(v, "f32") == 0 || strcmp(v, "bf16") == 0) {
        *type = v[0] == 'f' ? DT_F32 : DT_BF16;
        return 1;
    }
    fprintf(stderr, "kapitsa: --kv-type is f32 or bf16, not '%s'\n", v);
    return -1;
}

/* The embedded default model folder: KAPITSA_MODEL, ./models/kapitsa-tiny, or beside the binary. */
static const char *default_model(void)
{
    static char path[PATH_MAX + 32];
    const char *env = getenv("KAPITSA_MODEL");
    if (env && *env)
        return env;
    if (access("models/kapitsa-tiny/config.json", R_OK) == 0)
        return "models/kapitsa-tiny";
    path_beside_exe("models/kapitsa-tiny", path, sizeof path);
    return path;
}

const char *cli_model_dir(const char *ref)
{
    static char dirs[4][4608];
    static int next;
    char *out = dirs[next++ % 4];
    return hub_model_dir(ref ? ref : default_model(), out, sizeof dirs[0]) == 0 ? out : NULL;
}

int64_t cli_int(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < 0)
        return -1;
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "check") == 0)
        return cli_check(argc - 2, argv + 2);
    if (strcmp(cmd, "synth") == 0)
        return cli_synth(argc - 2, argv + 2);
    if (strcmp(cmd, "bench") == 0)
        return cli_bench(argc - 2, argv + 2);
    if (strcmp(cmd, "eval") == 0)
        return cli_eval(argc - 2, argv + 2);
    if (strcmp(cmd, "chat") == 0)
        return cli_chat(argc - 2, argv + 2);
    if (strcmp(cmd, "tokenize") == 0)
        return cli_tokenize(argc - 2, argv + 2);
    if (strcmp(cmd, "detokenize") == 0)
        return cli_detokenize(argc - 2, argv + 2);
    if (strcmp(cmd, "launch") == 0)
        return cli_launch(argc - 2, argv + 2);
    if (strcmp(cmd, "serve") == 0)
        return cli_serve(argc - 2, argv + 2);
    if (strcmp(cmd, "run") == 0)
        return cli_run(argc - 2, argv + 2);
    if (strcmp(cmd, "pull") == 0)
        return cli_pull(argc - 2, argv + 2);
    if (strcmp(cmd, "list") == 0)
        return cli_list(argc - 2, argv + 2);
    if (strcmp(cmd, "quantize") == 0)
        return cli_quantize(argc - 2, argv + 2);
    if (strcmp(cmd, "imatrix") == 0)
        return cli_imatrix(argc - 2, argv + 2);
    if (strcmp(cmd, "rm") == 0)
        return cli_rm(argc - 2, argv + 2);
    if (strcmp(cmd, "doctor") == 0)
        return cli_doctor(argc - 2, argv + 2);
    if (strcmp(cmd, "render") == 0)
        return cli_render(argc - 2, argv + 2);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kapitsa: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
