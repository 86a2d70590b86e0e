/* cli: the kapitsa subcommands. Each takes argc/argv after the subcommand name,
 * prints its own usage on bad arguments, and returns the process exit status. */
#ifndef KP_CLI_H
#define KP_CLI_H

#include "../engine/spec.h"
#include "opt.h"

#include <stddef.h>
#include <stdint.h>

int cli_check(int argc, char **argv);
int cli_synth(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_render(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_eval(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_pull(int argc, char **argv);
/* ref into the hub cache as `kapitsa pull REF` fetches it (its checks, its
 * progress on stderr), printing nothing on stdout; -1 with err_set(). */
int cli_pull_model(const char *ref);
/* 1 when PATH holds an executable file named exe, as execvp searches it
 * (launch.c): launch names a missing agent before it starts a server, doctor
 * lists the agents installed. */
int cli_on_path(const char *exe);
int cli_list(int argc, char **argv);
int cli_rm(int argc, char **argv);
int cli_doctor(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_imatrix(int argc, char **argv);
int cli_version(int argc, char **argv);
int cli_show(int argc, char **argv);
int cli_ps(int argc, char **argv);
/* Bytes of the files in dir (links followed: the embedded models link their tokenizer; models.c). */
int64_t cli_dir_bytes(const char *dir);
/* The base URL of a server at host (a name, IPv4 or IPv6 address) and port into out. */
void cli_server_url(char *out, size_t n, const char *host, int port);
/* GET base+path of a kapitsa server (key: its API key, or NULL): the HTTP
 * status, with the body in *body (free() it) when it is 200; 0 when nothing
 * answered. Anything but 200 comes with err_set() saying what (ps.c). */
int cli_server_get(const char *base, const char *path, const char *key, char **body);
/* kapitsa bench --draft (bench_spec.c): plain, chain of chain_k, tree of tree_n
 * nodes / depth tree_d, tree + prompt lookup, side by side. */
int bench_spec(const char *target, const char *draft, const char *prompt_file, int32_t n_gen, int32_t threads,
               const char *device,
               int32_t chain_k, int32_t tree_n, int32_t tree_d, int json);
/* kapitsa bench compare (compare.c): the same OpenAI workload against several servers. */
int bench_compare(int argc, char **argv);

/* The generating commands' cache type (serve, run, chat, bench): bf16, the
 * type the checkpoints' own reference (transformers in bf16) keeps its cache
 * in. check compares against f32 logits and keeps f32, which its 1e-3 bound assumes. */
#define CLI_KV_DEFAULT DT_BF16
/* Speculative decoding flags (spec_opts.c): --draft DIR, --spec off|chain|tree|lookup,
 * --spec-tree N,D. Default: tree when a draft is given, else off; lookup = prompt
 * lookup without a draft. */
struct cli_spec {
    const char *draft;
    int mode, mode_given; /* 0 off, 1 chain, 2 tree, 3 lookup */
    int n_nodes, depth;   /* 0: defaults */
};
#define CLI_SPEC_USAGE "[--draft DIR] [--spec off|chain|tree|lookup] [--spec-tree N,D]"
/* 1 when argv[*i] was one of these flags (consumed), 0 when not, -1 on a bad value. */
int cli_spec_flag(int argc, char **argv, int *i, struct cli_spec *o);
/* The spec parameters and the draft folder to load (NULL: none). -1 with err_set(). */
int cli_spec_params(const struct cli_spec *o, struct spec_params *p, const char **draft);
/* The file the tuner's choices are kept in between runs (sched_spec_persist):
 * $KAPITSA_CACHE/kflash.tsv, else $XDG_CACHE_HOME/kapitsa/kflash.tsv, else
 * ~/.cache/kapitsa/kflash.tsv; -1 when none of those is set. */
int cli_spec_tune_path(char *path, size_t n);
/* The key: host name, the two folders' real paths, the thread count. */
void cli_spec_key(char *key, size_t n, const char *model, const char *draft, int32_t threads);
/* A model reference (a folder, a catalog name, or a hub id in the Hugging Face
 * cache; NULL: the embedded default model) to its folder; the string lives
 * until exit. NULL with err_set() when it cannot be found (the message says
 * how to pull it). */
const char *cli_model_dir(const char *ref);
#endif
