/* opt: the shared option parsing of the kapitsa commands. */
#include "opt.h"

#include <stdlib.h>
#include <string.h>

static const char *command = "";

void cli_opt_command(const char *name)
{
    command = name;
}

/* The length of arg's flag part when it is one of names, -1 when not; with
 * eq, a long flag may be followed by "=value" (the length stops before '='). */
static int match(const char *arg, const char *names, int eq)
{
    for (const char *n = names; *n;) {
        const char *end = strchr(n, '|');
        const size_t len = end ? (size_t)(end - n) : strlen(n);
        if (strncmp(arg, n, len) == 0 && (arg[len] == 0 || (eq && arg[len] == '=' && n[1] == '-')))
            return (int)len;
        n += len + (end != NULL);
    }
    return -1;
}

static void print_prefix(void)
{
    fprintf(stderr, "kapitsa%s%s: ", *command ? " " : "", command);
}

int cli_flag(int argc, char **argv, int *i, const char *names, const char **val)
{
    const int len = match(argv[*i], names, 1);
    if (len < 0)
        return 0;
    if (argv[*i][len] == '=') {
        *val = argv[*i] + len + 1;
        return 1;
    }
    if (*i + 1 >= argc) {
        print_prefix();
        fprintf(stderr, "%s needs a value\n", argv[*i]);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int cli_switch(const char *arg, const char *names)
{
    return match(arg, names, 0) >= 0;
}

enum cli_arg cli_arg(const char *arg)
{
    if (cli_switch(arg, "-h|--help"))
        return CLI_ARG_HELP;
    if (arg[0] != '-' || arg[1] == 0)
        return CLI_ARG_POSITIONAL;
    print_prefix();
    fprintf(stderr, "unknown option '%s' (--help lists them)\n", arg);
    return CLI_ARG_UNKNOWN;
}

int cli_arg_exit(enum cli_arg a, void (*usage)(FILE *f))
{
    if (a != CLI_ARG_HELP)
        return 2;
    usage(stdout);
    return 0;
}

int cli_arg_reject(const char *arg, void (*usage)(FILE *f))
{
    const enum cli_arg a = cli_arg(arg);
    if (a == CLI_ARG_POSITIONAL) {
        print_prefix();
        fprintf(stderr, "unexpected argument '%s' (--help lists the options)\n", arg);
    }
    return cli_arg_exit(a, usage);
}

int cli_env_int(const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    const int64_t n = cli_int(v);
    if (n < lo || n > hi) {
        print_prefix();
        fprintf(stderr, "%s is '%s', not a number from %lld to %lld\n", name, v, (long long)lo, (long long)hi);
        return -1;
    }
    *out = n;
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
    print_prefix();
    fprintf(stderr, "--kv-type is f32 or bf16, not '%s'\n", v);
    return -1;
}

int64_t cli_int(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < 0)
        return -1;
    return v;
}
