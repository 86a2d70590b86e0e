/* kapitsa: command-line entry point; dispatches to the subcommands in src/cli. */
#define _GNU_SOURCE
#include "cli.h"

#include "../base/err.h"
#include "../base/path.h"
#include "../hub/cache.h"
#include "../hub/catalog.h"

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
               "  launch AGENT  run a coding agent (claude, codex, opencode, pi or qwen) against the local server\n"
               "  run PROMPT    generate text (default model: models/kapitsa-tiny)\n"
               "  pull MODEL    download a model (catalog name or ORG/NAME) into the Hugging Face cache\n"
               "  list          the model catalog and what is downloaded; rm MODEL removes one\n"
               "  show MODEL    what a model is: architecture, parameters, weight types, context, template, files\n"
               "  ps            what a running server has loaded: model, memory, KV cache, requests\n"
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
               "  version       version, commit, backends and cpu kernels (also --version)\n"
               "  help          this text\n"
               "A model not yet downloaded is pulled when you agree (asked on a terminal), or with --pull\n"
               "given to any command. --precision exact (any command; KAPITSA_PRECISION): products in\n"
               "fp32 as the reference computes them, instead of the default fast paths (bf16 or int8\n"
               "activations; check uses exact unless --fast).\n\n"
               "'kapitsa COMMAND --help' describes a command's options.\n");
}

/* The embedded default model folder: KAPITSA_MODEL, else kapitsa-tiny in the
 * data folder (path.h); NULL with err_set() when there is none. */
static const char *default_model(void)
{
    static char path[PATH_MAX + 32];
    const char *env = getenv("KAPITSA_MODEL");
    if (env && *env)
        return env;
    return path_data("kapitsa-tiny", path, sizeof path) == 0 ? path : NULL;
}

/* --pull anywhere on the command line: a model not downloaded is pulled
 * without asking (main takes the flag out before the command parses). */
static bool pull_allowed;

/* Whether to pull ref, which names a catalog model or a hub id not yet
 * downloaded: --pull, else the user's answer on a terminal. */
static bool pull_agreed(const char *ref)
{
    if (pull_allowed)
        return true;
    if (!isatty(0) || !isatty(2))
        return false;
    struct catalog c;
    double gb = 0;
    if (catalog_load(&c, NULL) == 0) {
        const struct catalog_model *m = catalog_find(&c, ref);
        gb = m ? (double)m->bytes / 1e9 : 0;
        catalog_free(&c);
    }
    fprintf(stderr, "kapitsa: %s is not downloaded. Pull it now", ref);
    if (gb > 0)
        fprintf(stderr, " (%.1f GB)", gb);
    fprintf(stderr, "? [y/N] ");
    char line[16];
    return fgets(line, sizeof line, stdin) && (line[0] == 'y' || line[0] == 'Y');
}

const char *cli_model_dir(const char *ref)
{
    /* every answer kept (reachable) until exit, as cli.h promises: a command
     * asks for a few at most */
    static char **kept;
    static size_t n_kept;
    char out[4608];
    if (!ref && !(ref = default_model()))
        return NULL;
    if (hub_model_dir(ref, out, sizeof out) != 0) {
        /* a name, not a path, that a pull could bring */
        const bool pullable = ref[0] != '/' && ref[0] != '.' && ref[0] != '~' && strncmp(ref, "ollama:", 7) != 0;
        if (!pullable || !pull_agreed(ref) || cli_pull_model(ref) != 0 || hub_model_dir(ref, out, sizeof out) != 0)
            return NULL;
    }
    char **k = realloc(kept, (n_kept + 1) * sizeof *k);
    if (!k || !(k[n_kept] = strdup(out))) {
        kept = k ? k : kept;
        err_set("kapitsa: out of memory");
        return NULL;
    }
    kept = k;
    return kept[n_kept++];
}

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
} commands[] = {
    {"check", cli_check},         {"synth", cli_synth},   {"bench", cli_bench},       {"eval", cli_eval},
    {"chat", cli_chat},           {"tokenize", cli_tokenize}, {"detokenize", cli_detokenize}, {"launch", cli_launch},
    {"serve", cli_serve},         {"run", cli_run},       {"pull", cli_pull},         {"list", cli_list},
    {"quantize", cli_quantize},   {"imatrix", cli_imatrix}, {"rm", cli_rm},           {"doctor", cli_doctor},
    {"render", cli_render},       {"version", cli_version}, {"show", cli_show},         {"ps", cli_ps},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    for (size_t k = 0; k < sizeof commands / sizeof *commands; k++)
        if (strcmp(cmd, commands[k].name) == 0) {
            cli_opt_command(cmd);
            int n = 0;
            for (int i = 2; i < argc; i++) {
                const char *v = NULL;
                int f;
                if (strcmp(cmd, "pull") != 0 && strcmp(argv[i], "--pull") == 0) {
                    pull_allowed = true; /* cli_model_dir's, for every command */
                } else if ((f = cli_flag(argc, argv, &i, "--precision", &v)) != 0) {
                    /* every backend a command opens (device.h reads it) */
                    if (f < 0 || (strcmp(v, "exact") != 0 && strcmp(v, "fast") != 0)) {
                        fprintf(stderr, "kapitsa %s: --precision takes exact or fast\n", cmd);
                        return 2;
                    }
                    setenv("KAPITSA_PRECISION", v, 1);
                } else {
                    argv[2 + n++] = argv[i];
                }
            }
            return commands[k].fn(n, argv + 2);
        }
    if (cli_switch(cmd, "-V|--version")) {
        cli_opt_command("version");
        return cli_version(argc - 2, argv + 2);
    }
    if (cli_switch(cmd, "help|-h|--help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kapitsa: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
