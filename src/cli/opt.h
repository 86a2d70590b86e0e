/* opt: the command line's option parsing, shared by every kapitsa command so
 * that all take the same forms: "--name value" and "--name=value", short
 * aliases ("-m"), --help/-h to stdout, and unknown options named. */
#ifndef KP_OPT_H
#define KP_OPT_H

#include "../base/dtype.h"

#include <stdint.h>
#include <stdio.h>

/* The command the messages name ("run" gives "kapitsa run: ..."); main sets it. */
void cli_opt_command(const char *name);
/* A flag with a value. names: the spellings, '|'-separated ("-m|--model").
 * Returns 1 and sets *val when argv[*i] is one of them, as "--name value"
 * (advancing *i) or "--name=value"; 0 when it is another argument; -1 with a
 * message when the value is missing. */
int cli_flag(int argc, char **argv, int *i, const char *names, const char **val);
/* 1 when arg is one of names ('|'-separated), a flag without a value. */
int cli_switch(const char *arg, const char *names);
/* What an argument no flag took is: CLI_ARG_POSITIONAL (not an option, or
 * "-" for stdin), CLI_ARG_HELP (--help or -h), or CLI_ARG_UNKNOWN (an
 * option the command lacks; the message naming it is printed). */
enum cli_arg { CLI_ARG_POSITIONAL, CLI_ARG_HELP, CLI_ARG_UNKNOWN };
enum cli_arg cli_arg(const char *arg);
/* The exit status for a help or unknown-option argument: 0 after printing the
 * usage to stdout, 2 otherwise (the unknown option was already named). */
int cli_arg_exit(enum cli_arg a, void (*usage)(FILE *f));
/* The exit status for an argument no flag took, in a command without
 * positional arguments: 0 after the usage on stdout for --help, 2 after
 * naming the unknown option or the unexpected argument. */
int cli_arg_reject(const char *arg, void (*usage)(FILE *f));
/* The integer environment variable name in [lo, hi]: 1 and *out set, 0 when
 * unset or empty, -1 with a message when it is not such a number. */
int cli_env_int(const char *name, int64_t lo, int64_t hi, int64_t *out);
/* --kv-type f32|bf16: the KV cache's dtype (bf16: half the memory and the
 * bytes a long context's decode reads). 1 when consumed, 0 when not, -1 on a bad value. */
#define CLI_KV_USAGE "[--kv-type bf16|f32]"
int cli_kv_flag(int argc, char **argv, int *i, enum dtype *type);
/* Parses a non-negative integer; -1 on error. */
int64_t cli_int(const char *s);

#endif
