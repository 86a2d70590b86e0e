/* kapitsa version: what this binary is: its version and commit (both set by
 * the Makefile), the backends built in, and the cpu kernel tables with the one
 * this CPU runs. */
#include "../backend/cpu/cpu.h"
#include "cli.h"

#include <stdio.h>

#ifndef KAPITSA_VERSION
#define KAPITSA_VERSION "unknown"
#endif
#ifndef KAPITSA_COMMIT
#define KAPITSA_COMMIT "unknown"
#endif

static void version_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa version   (also kapitsa --version): version, commit, backends, cpu kernels\n");
}

int cli_version(int argc, char **argv)
{
    if (argc > 0)
        return cli_arg_reject(argv[0], version_usage);
    printf("kapitsa %s (commit %s)\n", KAPITSA_VERSION, KAPITSA_COMMIT);
#ifdef KAPITSA_CUDA
    printf("backends     cpu, cuda\n");
#else
    printf("backends     cpu\n");
#endif
    char k[256];
    cpu_kernels_describe(k, sizeof k);
    printf("cpu kernels  %s\n", k);
    return 0;
}
