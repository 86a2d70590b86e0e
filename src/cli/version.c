/* kapitsa version: what this binary is: its version and commit (both set by
 * the Makefile), the backends built in, and the cpu kernel tables with the one
 * this CPU runs. */
#include "../backend/cpu/kern.h"
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
    static const struct kern *const tables[] = {&kern_ref, &kern_avx2, &kern_avx512};
    printf("kapitsa %s (commit %s)\n", KAPITSA_VERSION, KAPITSA_COMMIT);
#ifdef KAPITSA_CUDA
    printf("backends     cpu, cuda\n");
#else
    printf("backends     cpu\n");
#endif
    printf("cpu kernels ");
    for (size_t i = 0; i < sizeof tables / sizeof *tables; i++)
        printf(" %s%s", tables[i]->name, kern_supported(tables[i]) ? "" : " (not on this cpu)");
    printf("; running %s\n", kern_best()->name);
    return 0;
}
